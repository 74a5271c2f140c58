//! Maintenance: the error history, app-version migration, purging, the durability and
//! clock reads, and the file's own health: `PRAGMA integrity_check` and online backups.
//!
//! Copying the `.db` file is not a backup: acknowledged writes may still be in the `-wal`
//! file, and a copy of the database without its WAL (or of both at different moments) is
//! an older or torn store on which every effect since runs again.
//! [`SqliteStore::backup_to`] uses `VACUUM INTO`, which reads the whole database in one
//! read transaction (WAL included) and writes it compacted into a new single-file
//! database, while writers carry on.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use durable_core::integrity::Keyring;
use durable_core::store::{
    Durability, ErrorRecord, FORMAT_VERSION, MaintenanceStore, NewError, PurgeOutcome,
    RetargetSession, SessionRecord, SessionStatus, StoreBase,
};
use durable_core::{CallId, SessionId, StoreError};
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions, Connection};

use crate::SqliteStore;
use crate::error::{BACKEND, corrupt, db, encode};
use crate::open::synchronous_name;
use crate::rows;
use crate::seal;
use crate::tx::{self, WriteTx, millis};

/// The `unsafe_setting` an in-memory store reports unless it accepts volatility.
const IN_MEMORY_SETTING: &str = "journal_mode = memory (in-memory database)";

pub(crate) async fn durability(store: &SqliteStore) -> Result<Durability, StoreError> {
    let mut conn = crate::error::acquire(store.writer(), crate::error::Pool::Writer).await?;
    let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(&mut *conn)
        .await
        .map_err(db)?;
    let mode = mode.to_ascii_lowercase();
    let sync: i64 = sqlx::query_scalar("PRAGMA synchronous")
        .fetch_one(&mut *conn)
        .await
        .map_err(db)?;
    let unsafe_setting = if store.inner.in_memory {
        (!store.inner.accept_volatile).then(|| {
            if mode == "memory" {
                IN_MEMORY_SETTING.to_owned()
            } else {
                format!("journal_mode = {mode} (in-memory database)")
            }
        })
    } else if mode != "wal" {
        Some(format!("journal_mode = {mode}"))
    } else if sync < 2 && !store.inner.report_durable {
        Some(format!("synchronous = {}", synchronous_name(sync)))
    } else {
        None
    };
    Ok(Durability { unsafe_setting })
}

pub(crate) async fn now(store: &SqliteStore) -> Result<i64, StoreError> {
    tx::clock(store.reader()).await
}

pub(crate) async fn record_error(store: &SqliteStore, error: NewError) -> Result<(), StoreError> {
    error.validate()?;
    let mut tx = WriteTx::begin(store.writer()).await?;
    let now = tx.now;
    let result = async {
        let conn = tx.conn();
        let inserted = sqlx::query(
            "INSERT INTO durable_errors (session_id, step, context, attempt, message, \
             created_at) SELECT id, ?, ?, ?, ?, ? FROM durable_sessions WHERE id = ?",
        )
        .bind(error.step)
        .bind(&error.context)
        .bind(error.attempt)
        .bind(&error.message)
        .bind(now)
        .bind(error.session.as_str())
        .execute(conn)
        .await
        .map_err(db)?;
        if inserted.rows_affected() == 0 {
            return Err(StoreError::SessionNotFound(error.session.clone()));
        }
        Ok(())
    }
    .await;
    tx.finish(result).await
}

pub(crate) async fn errors(
    store: &SqliteStore,
    session: &SessionId,
) -> Result<Vec<ErrorRecord>, StoreError> {
    let found = sqlx::query(
        "SELECT session_id, step, context, attempt, message, created_at \
         FROM durable_errors WHERE session_id = ? ORDER BY id",
    )
    .bind(session.as_str())
    .fetch_all(store.reader())
    .await
    .map_err(db)?;
    found.iter().map(rows::error).collect()
}

pub(crate) async fn retarget_session(
    store: &SqliteStore,
    migrate: RetargetSession,
) -> Result<SessionRecord, StoreError> {
    migrate.validate()?;
    let mut tx = WriteTx::begin(store.writer()).await?;
    let now = tx.now;
    let result = async {
        let conn = tx.conn();
        let id = &migrate.session;
        let session = tx::session(&mut *conn, id).await?;
        if session.app_version != migrate.from_version {
            return Err(StoreError::AppVersionMismatch {
                session: id.clone(),
                expected: migrate.from_version.clone(),
                actual: session.app_version,
            });
        }
        sqlx::query("UPDATE durable_sessions SET app_version = ?, updated_at = ? WHERE id = ?")
            .bind(&migrate.to_version)
            .bind(now)
            .bind(id.as_str())
            .execute(&mut *conn)
            .await
            .map_err(db)?;
        // A mapping, not a chain: each row is renamed at most once, by the first pair
        // naming its tool (so `a→b, b→c` sends a to b and b to c, and swaps work).
        let journal =
            sqlx::query("SELECT id, tool_name FROM durable_tool_calls WHERE session_id = ?")
                .bind(id.as_str())
                .fetch_all(&mut *conn)
                .await
                .map_err(db)?;
        for row in &journal {
            let call: String = rows::col(row, "id", id, None)?;
            let tool: String = rows::col(row, "tool_name", id, None)?;
            if let Some((_, new)) = migrate.step_map.iter().find(|(old, _)| *old == tool) {
                // Checked under its old name, re-sealed under the new one.
                let ring = store.keyring();
                let mut raw =
                    seal::checked_call(&mut *conn, ring, &CallId::new(call.clone())).await?;
                raw.tool = new.clone();
                raw.seal(ring)?;
                sqlx::query("UPDATE durable_tool_calls SET tool_name = ?, mac = ? WHERE id = ?")
                    .bind(new)
                    .bind(raw.mac.as_deref())
                    .bind(&call)
                    .execute(&mut *conn)
                    .await
                    .map_err(db)?;
            }
        }
        let step_map: Vec<[&str; 2]> = migrate
            .step_map
            .iter()
            .map(|(old, new)| [old.as_str(), new.as_str()])
            .collect();
        sqlx::query(
            "INSERT INTO durable_migrations (session_id, from_version, to_version, step_map, \
             migrated_by, format, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(id.as_str())
        .bind(&migrate.from_version)
        .bind(&migrate.to_version)
        .bind(serde_json::to_string(&step_map).map_err(encode)?)
        .bind(&migrate.by)
        .bind(FORMAT_VERSION)
        .bind(now)
        .execute(&mut *conn)
        .await
        .map_err(db)?;
        tx::session(conn, id).await
    }
    .await;
    tx.finish(result).await
}

pub(crate) async fn purge_session(
    store: &SqliteStore,
    id: &SessionId,
    retention: Duration,
) -> Result<PurgeOutcome, StoreError> {
    let mut tx = WriteTx::begin(store.writer()).await?;
    let now = tx.now;
    let result = async {
        let conn = tx.conn();
        let row = sqlx::query("SELECT status, updated_at FROM durable_sessions WHERE id = ?")
            .bind(id.as_str())
            .fetch_optional(&mut *conn)
            .await
            .map_err(db)?
            .ok_or_else(|| StoreError::SessionNotFound(id.clone()))?;
        let status: String = rows::col(&row, "status", id, None)?;
        let status = SessionStatus::parse(&status)
            .ok_or_else(|| corrupt(id, None, format!("unknown session status `{status}`")))?;
        if !status.is_terminal() {
            return Ok(PurgeOutcome::NotTerminal);
        }
        let updated_at: i64 = rows::col(&row, "updated_at", id, None)?;
        if updated_at > now.saturating_sub(millis(retention)) {
            return Ok(PurgeOutcome::WithinRetention);
        }
        let in_doubt: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM durable_tool_calls \
             WHERE session_id = ? AND status = 'issued')",
        )
        .bind(id.as_str())
        .fetch_one(&mut *conn)
        .await
        .map_err(db)?;
        if in_doubt {
            return Ok(PurgeOutcome::CallInDoubt);
        }
        for delete in [
            "DELETE FROM durable_approvals WHERE session_id = ?",
            "DELETE FROM durable_resolutions WHERE session_id = ?",
            "DELETE FROM durable_migrations WHERE session_id = ?",
            "DELETE FROM durable_limit_raises WHERE session_id = ?",
            "DELETE FROM durable_signals WHERE session_id = ?",
            "DELETE FROM durable_errors WHERE session_id = ?",
            "DELETE FROM durable_tool_calls WHERE session_id = ?",
            "DELETE FROM durable_checkpoints WHERE session_num = (SELECT num FROM durable_sessions WHERE id = ?)",
            "DELETE FROM durable_messages WHERE session_num = (SELECT num FROM durable_sessions WHERE id = ?)",
            "DELETE FROM durable_sessions WHERE id = ?",
        ] {
            sqlx::query(delete)
                .bind(id.as_str())
                .execute(&mut *conn)
                .await
                .map_err(db)?;
        }
        Ok(PurgeOutcome::Purged)
    }
    .await;
    tx.finish(result).await
}

impl SqliteStore {
    /// Runs SQLite's `PRAGMA integrity_check` on the store's database (one read
    /// transaction; writers carry on) and returns what it reports: `["ok"]` when the file
    /// is sound, otherwise one line per problem (a corrupt page, an index that misses a
    /// row). It checks the file's structure, not the seals: see
    /// [`durable_core::verify::verify_sessions`] for those.
    pub async fn integrity_check(&self) -> Result<Vec<String>, StoreError> {
        sqlx::query_scalar("PRAGMA integrity_check")
            .fetch_all(self.reader())
            .await
            .map_err(db)
    }

    /// The store's integrity log (`durable_integrity_log`: every adoption, re-keying and
    /// restored key row), with the check of the seal that covers the whole log under
    /// this store's keys. Read in one read transaction; changes nothing.
    pub async fn integrity_log(&self) -> Result<durable_core::integrity::IntegrityLog, StoreError> {
        let mut conn = crate::error::acquire(self.reader(), crate::error::Pool::Reader).await?;
        crate::keys::read_log(&mut conn, &self.inner.keyring).await
    }
}

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

/// The status reason of a session parked by an acknowledged rollback.
fn rollback_reason(calls: &[&crate::LostCall]) -> String {
    if calls.is_empty() {
        return "rolled back: the store was restored or moved without its witness, so its \
                effects since are unknown; check them, then `durable unpark`"
            .to_owned();
    }
    let mut named: Vec<String> = calls
        .iter()
        .take(5)
        .map(|l| format!("`{}` (attempt {})", l.call, l.attempt))
        .collect();
    if calls.len() > 5 {
        named.push(format!("and {} more", calls.len() - 5));
    }
    format!(
        "rolled back: the store lost call(s) {} whose effects may have run; check them, then `durable unpark`",
        named.join(", ")
    )
}

/// [`SqliteStore::acknowledge_rollback`]: parks what the rollback may have made unknown,
/// recreates (parked) the sessions lost entirely, and audits the decision.
pub(crate) async fn acknowledge_rollback(
    store: &SqliteStore,
    report: &crate::RollbackReport,
    by: &str,
    intact: bool,
) -> Result<(), StoreError> {
    use durable_core::store::{LeaseStore, SessionStore};
    use durable_core::store::{NewCheckpoint, NewSession};

    let mut missing: Vec<&str> = report
        .lost
        .iter()
        .filter(|l| l.session_missing)
        .map(|l| l.session.as_str())
        .collect();
    missing.dedup();
    for session in missing {
        let new = NewSession {
            id: SessionId::new(session),
            app_version: "rolled-back".to_owned(),
            metadata: serde_json::json!({"durable": {"rolled_back": true}}),
            owner: by.to_owned(),
            lease_ttl: Duration::from_secs(1),
            initial: NewCheckpoint::default(),
            queue: None,
        };
        match store.create_session(new).await {
            Ok((_, lease)) => store.release_lease(&lease).await?,
            Err(StoreError::SessionExists(_)) => {}
            Err(e) => return Err(e),
        }
    }
    let unknown = report.witness_missing || report.foreign_witness;
    let mut tx = WriteTx::begin(store.writer()).await?;
    let now = tx.now;
    let result = async {
        let conn = tx.conn();
        let park = "UPDATE durable_sessions SET status = 'parked', status_reason = ?, \
                    lease_owner = NULL, lease_expires_at = NULL, fence = fence + 1, updated_at = ? \
                    WHERE id = ? AND status NOT IN ('completed', 'failed', 'cancelled')";
        let mut parked = 0u64;
        for session in report.sessions() {
            let calls: Vec<&crate::LostCall> =
                report.lost.iter().filter(|l| l.session == session).collect();
            parked += sqlx::query(park)
                .bind(rollback_reason(&calls))
                .bind(now)
                .bind(&session)
                .execute(&mut *conn)
                .await
                .map_err(db)?
                .rows_affected();
        }
        if unknown && !intact {
            parked += sqlx::query(
                "UPDATE durable_sessions SET status = 'parked', status_reason = ?, \
                 lease_owner = NULL, lease_expires_at = NULL, fence = fence + 1, updated_at = ? \
                 WHERE status NOT IN ('completed', 'failed', 'cancelled', 'parked')",
            )
            .bind(rollback_reason(&[]))
            .bind(now)
            .execute(&mut *conn)
            .await
            .map_err(db)?
            .rows_affected();
        }
        let detail = if unknown {
            format!(
                "rollback acknowledged by `{by}`: no usable witness ({}); {}; {parked} session(s) parked",
                if report.foreign_witness {
                    "it belonged to another store"
                } else {
                    "it was missing"
                },
                if intact {
                    "the operator stated the copy is complete"
                } else {
                    "every unfinished session parked"
                }
            )
        } else {
            format!(
                "rollback acknowledged by `{by}`: {} call(s) in {} session(s) lost ({}); {parked} session(s) parked",
                report.lost.len(),
                report.sessions().len(),
                report
                    .lost
                    .iter()
                    .take(20)
                    .map(|l| format!("{}/{}#{}", l.session, l.call, l.attempt))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        crate::keys::append_log(
            &mut *conn,
            store.keyring(),
            "rollback",
            "witness",
            i64::try_from(parked).unwrap_or(i64::MAX),
            &detail,
            now,
        )
        .await?;
        tracing::warn!(by, parked, lost = report.lost.len(), "rollback acknowledged");
        Ok(())
    }
    .await;
    tx.finish(result).await
}

#[async_trait]
impl StoreBase for SqliteStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn keyring(&self) -> &Keyring {
        SqliteStore::keyring(self)
    }

    async fn durability(&self) -> Result<Durability, StoreError> {
        durability(self).await
    }

    async fn now(&self) -> Result<i64, StoreError> {
        now(self).await
    }
}

#[async_trait]
impl MaintenanceStore for SqliteStore {
    async fn record_error(&self, error: NewError) -> Result<(), StoreError> {
        record_error(self, error).await
    }

    async fn errors(&self, session: &SessionId) -> Result<Vec<ErrorRecord>, StoreError> {
        errors(self, session).await
    }

    async fn retarget_session(
        &self,
        migrate: RetargetSession,
    ) -> Result<SessionRecord, StoreError> {
        retarget_session(self, migrate).await
    }

    async fn purge_session(
        &self,
        id: &SessionId,
        retention: Duration,
    ) -> Result<PurgeOutcome, StoreError> {
        let outcome = purge_session(self, id, retention).await?;
        if outcome == PurgeOutcome::Purged {
            self.witness_purge(id)?;
        }
        Ok(outcome)
    }
}
