//! Online backups: [`SqliteStore::backup_to`] writes a consistent copy of a live store.
//!
//! Copying the `.db` file is not a backup: acknowledged writes may still be in the `-wal`
//! file, and a copy of the database without its WAL (or of both at different moments) is
//! an older or torn store on which every effect since runs again. `VACUUM INTO` reads the
//! whole database in one read transaction (WAL included) and writes it compacted into a
//! new single-file database, while writers carry on.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use durable_core::StoreError;
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions, Connection};

use crate::SqliteStore;
use crate::error::{BACKEND, db};

/// What [`SqliteStore::backup_to`] wrote, after checking it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Backup {
    /// The new file.
    pub path: PathBuf,
    /// Its size in bytes.
    pub bytes: u64,
    /// Sessions in the copy.
    pub sessions: i64,
    /// Checkpoints in the copy.
    pub checkpoints: i64,
    /// Journal rows (tool calls and model responses) in the copy.
    pub journal_rows: i64,
    /// The copy's schema version.
    pub schema_version: i64,
}

/// Why a backup was not written or did not check out.
#[derive(Debug)]
struct BackupFailed {
    path: PathBuf,
    detail: String,
}

impl fmt::Display for BackupFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "backup to `{}`: {}", self.path.display(), self.detail)
    }
}

impl std::error::Error for BackupFailed {}

fn failed(path: &Path, detail: impl Into<String>) -> StoreError {
    StoreError::database(
        BACKEND,
        BackupFailed {
            path: path.to_owned(),
            detail: detail.into(),
        },
    )
}

impl SqliteStore {
    /// Writes a consistent copy of the store to `path`, a new file, while the store
    /// stays in use, then checks the copy.
    ///
    /// The copy is made with `VACUUM INTO` in one read transaction (the WAL included):
    /// it holds every write acknowledged before the backup began and none after, as one
    /// self-contained file (rollback journal mode; opening it as a store turns WAL back
    /// on). The file is created exclusively, readable and writable by its owner only
    /// (0600 on Unix), so an existing file (even an empty one) is refused, never
    /// overwritten; it is synced to disk before the check. The check opens the copy
    /// read-only and requires `PRAGMA integrity_check` to answer `ok` and the durable
    /// schema to be present; if writing or checking fails, the new file is removed.
    ///
    /// ```no_run
    /// # async fn demo(store: durable_sqlite::SqliteStore) -> Result<(), durable_core::StoreError> {
    /// let backup = store.backup_to("backups/agent-2026-11-23.db").await?;
    /// println!("{} sessions, {} bytes", backup.sessions, backup.bytes);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`StoreError::Database`] when the file exists or cannot be created, the copy
    /// fails (disk full), or the copy does not check out.
    pub async fn backup_to(&self, path: impl AsRef<Path>) -> Result<Backup, StoreError> {
        let path = path.as_ref();
        let Some(target) = path.to_str() else {
            return Err(failed(path, "the path is not valid UTF-8"));
        };
        create_new(path)?;
        let result = async {
            self.vacuum_into(target).await?;
            sync(path)?;
            check(path).await
        }
        .await;
        if result.is_err() {
            // Ours: created above, exclusively.
            let _ = std::fs::remove_file(path);
        }
        result
    }

    async fn vacuum_into(&self, target: &str) -> Result<(), StoreError> {
        if self.inner.in_memory {
            sqlx::query("VACUUM INTO ?")
                .bind(target)
                .execute(self.reader())
                .await
                .map_err(db)?;
            return Ok(());
        }
        // A connection of its own, read-only: the store's readers may be `query_only` (a
        // store opened read-only), which refuses `VACUUM INTO` even though it writes
        // only the new file.
        let mut conn = SqliteConnectOptions::new()
            .filename(&self.inner.location)
            .read_only(true)
            .busy_timeout(Duration::from_secs(5))
            .connect()
            .await
            .map_err(db)?;
        let done = sqlx::query("VACUUM INTO ?")
            .bind(target)
            .execute(&mut conn)
            .await
            .map_err(db);
        let _ = conn.close().await;
        done.map(|_| ())
    }
}

impl SqliteStore {
    /// Runs SQLite's `PRAGMA integrity_check` on the store's database (one read
    /// transaction; writers carry on) and returns what it reports: `["ok"]` when the file
    /// is sound, otherwise one line per problem (a corrupt page, an index that misses a
    /// row). It checks the file's structure, not the seals: see
    /// [`durable_core::integrity::verify_sessions`] for those.
    pub async fn integrity_check(&self) -> Result<Vec<String>, StoreError> {
        sqlx::query_scalar("PRAGMA integrity_check")
            .fetch_all(self.reader())
            .await
            .map_err(db)
    }
}

/// Creates `path`, empty, failing if anything is there; 0600 on Unix. `VACUUM INTO`
/// accepts an empty file and keeps its permissions.
fn create_new(path: &Path) -> Result<(), StoreError> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    match options.open(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Err(failed(
            path,
            "the file exists; a backup never overwrites a file, choose a new name",
        )),
        Err(e) => Err(failed(path, format!("cannot create the file: {e}"))),
    }
}

/// Flushes the copy and its directory entry to disk.
fn sync(path: &Path) -> Result<(), StoreError> {
    let io = |e: std::io::Error| failed(path, format!("cannot sync the copy to disk: {e}"));
    std::fs::File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(io)?;
    #[cfg(unix)]
    if let Some(dir) = path.parent() {
        let dir = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io)?;
    }
    Ok(())
}

/// Opens the copy read-only and checks it is a sound durable store.
async fn check(path: &Path) -> Result<Backup, StoreError> {
    let mut conn = SqliteConnectOptions::new()
        .filename(path)
        .read_only(true)
        .connect()
        .await
        .map_err(db)?;
    let report: Vec<String> = sqlx::query_scalar("PRAGMA integrity_check")
        .fetch_all(&mut conn)
        .await
        .map_err(db)?;
    if report != ["ok"] {
        let _ = conn.close().await;
        return Err(failed(
            path,
            format!(
                "the copy fails `PRAGMA integrity_check`: {}",
                report.join("; ")
            ),
        ));
    }
    // MIGRATIONS_TABLE, spelled out: queries are static text.
    let schema_version: Option<i64> =
        sqlx::query_scalar("SELECT MAX(version) FROM durable_schema_migrations")
            .fetch_one(&mut conn)
            .await
            .map_err(|e| failed(path, format!("the copy has no durable schema: {e}")))?;
    let mut counts = [0_i64; 3];
    for (slot, query) in counts.iter_mut().zip([
        "SELECT COUNT(*) FROM durable_sessions",
        "SELECT COUNT(*) FROM durable_checkpoints",
        "SELECT COUNT(*) FROM durable_tool_calls",
    ]) {
        *slot = sqlx::query_scalar(query)
            .fetch_one(&mut conn)
            .await
            .map_err(db)?;
    }
    conn.close().await.map_err(db)?;
    let bytes = std::fs::metadata(path)
        .map_err(|e| failed(path, format!("cannot read the copy's size: {e}")))?
        .len();
    Ok(Backup {
        path: path.to_owned(),
        bytes,
        sessions: counts[0],
        checkpoints: counts[1],
        journal_rows: counts[2],
        schema_version: schema_version.unwrap_or(0),
    })
}
