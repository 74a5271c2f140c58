//! What is at the path decides, before SQLite touches it, whether a store file is created,
//! opened or refused.
//!
//! - A missing file is created by a writer with mode `0600` (on Unix): SQLite gives the
//!   `-wal` and `-shm` files the mode of the database file, so all three are private.
//!   An existing file's mode is never changed.
//! - An existing file must be a regular file that starts with the SQLite header. An empty
//!   file (`touch agent.db`, `/dev/null`) is refused rather than silently turned into a
//!   store: an empty file where a store was expected means the store was lost (the
//!   `.db` file deleted or truncated), and starting afresh would run every effect again.
//! - A read-only open also refuses a file that does not exist, and (after connecting) a
//!   database without the durable schema or with a schema of another version
//!   ([`check_schema`]).
//! - Every connection reads back the settings the store depends on (WAL,
//!   `synchronous = FULL`, foreign keys, the busy timeout) before it is used ([`verify`]).

use std::io::{ErrorKind, Read};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use durable_core::StoreError;
use sqlx::SqliteConnection;

use crate::error::{BACKEND, db};
use crate::{MIGRATIONS_TABLE, schema_version};

/// The first 16 bytes of every SQLite database file.
const SQLITE_HEADER: &[u8; 16] = b"SQLite format 3\0";

/// How long a writer that finds an empty file waits for a concurrent creator (another
/// process opening the same new path at the same moment) to write its schema.
const CREATOR_WAIT: Duration = Duration::from_secs(2);

/// What a writer found at its path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Found {
    /// Nothing: this opener created the (empty, private) file.
    Created,
    /// An SQLite database (a store, or a host application's database).
    Database,
}

fn not_a_store(path: &Path, detail: impl Into<String>) -> StoreError {
    StoreError::NotAStore {
        location: path.display().to_string(),
        detail: detail.into(),
    }
}

/// Prepares the path for a writer: creates a missing file with mode `0600` (when
/// `create` allows it), or checks that an existing one is an SQLite database.
pub(crate) async fn prepare_writer(path: &Path, create: bool) -> Result<Found, StoreError> {
    match std::fs::metadata(path) {
        Err(e) if e.kind() == ErrorKind::NotFound => {
            if !create {
                return Err(not_a_store(
                    path,
                    "the file does not exist (and `create_if_missing` is off)",
                ));
            }
            match create_private(path) {
                Ok(()) => return Ok(Found::Created),
                // Another opener created it a moment ago: check it like any existing file.
                Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
                Err(e) => return Err(StoreError::database(BACKEND, e)),
            }
        }
        Err(e) => return Err(StoreError::database(BACKEND, e)),
        Ok(_) => {}
    }
    let deadline = Instant::now() + CREATOR_WAIT;
    loop {
        match check_existing(path)? {
            Existing::Database => return Ok(Found::Database),
            // A store being created right now by another opener: its schema is in the
            // `-wal` until its first checkpoint, and SQLite reads it from there.
            Existing::Empty if has_content(&wal_path(path)) => return Ok(Found::Database),
            Existing::Empty if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Existing::Empty => return Err(empty(path)),
        }
    }
}

/// Checks the path for a read-only open: it must exist and be an SQLite database.
pub(crate) fn prepare_reader(path: &Path) -> Result<(), StoreError> {
    match std::fs::metadata(path) {
        Err(e) if e.kind() == ErrorKind::NotFound => {
            Err(not_a_store(path, "the file does not exist"))
        }
        Err(e) => Err(StoreError::database(BACKEND, e)),
        Ok(_) => match check_existing(path)? {
            Existing::Database => Ok(()),
            Existing::Empty => Err(empty(path)),
        },
    }
}

fn empty(path: &Path) -> StoreError {
    not_a_store(
        path,
        "the file is empty; durable does not turn an existing file into a store (if the store was lost, restore it from a backup; to start afresh, delete the file and its `-witness`)",
    )
}

/// What an existing path holds, if it may be opened at all.
enum Existing {
    Empty,
    Database,
}

fn check_existing(path: &Path) -> Result<Existing, StoreError> {
    let meta = std::fs::metadata(path).map_err(|e| StoreError::database(BACKEND, e))?;
    if !meta.is_file() {
        return Err(not_a_store(
            path,
            "it is not a regular file (a directory, device or socket)",
        ));
    }
    if meta.len() == 0 {
        return Ok(Existing::Empty);
    }
    let mut header = [0_u8; 16];
    let read = std::fs::File::open(path)
        .and_then(|mut file| file.read_exact(&mut header))
        .map_err(|e| match e.kind() {
            ErrorKind::UnexpectedEof => None,
            _ => Some(e),
        });
    match read {
        Ok(()) if &header == SQLITE_HEADER => Ok(Existing::Database),
        Ok(()) | Err(None) => Err(not_a_store(
            path,
            "it is not an SQLite database (its first bytes are not the SQLite header)",
        )),
        Err(Some(e)) => Err(StoreError::database(BACKEND, e)),
    }
}

fn wal_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push("-wal");
    PathBuf::from(name)
}

fn has_content(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.len() > 0)
}

/// Creates an empty file only its owner may read and write; fails if it exists.
fn create_private(path: &Path) -> std::io::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path).map(drop)
}

/// Moves everything in the `-wal` into the database file and empties the `-wal`: run
/// once a new store's schema (and its key) are written, so the file alone is a store.
///
/// A `-wal` deleted later then loses the writes made since the last checkpoint (SQLite
/// checkpoints about every 1000 pages), but never the schema: the store opens, with its
/// latest rows missing, instead of opening as a new empty store.
pub(crate) async fn checkpoint_truncate(conn: &mut SqliteConnection) -> Result<(), StoreError> {
    sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
        .execute(&mut *conn)
        .await
        .map_err(db)?;
    Ok(())
}

/// For a read-only open: the database must hold the durable schema at exactly the
/// version this release knows (an older one is upgraded by a writer, never here).
pub(crate) async fn check_schema(
    conn: &mut SqliteConnection,
    location: &str,
) -> Result<(), StoreError> {
    let tracked: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?)",
    )
    .bind(MIGRATIONS_TABLE)
    .fetch_one(&mut *conn)
    .await
    .map_err(|e| match &e {
        // "file is not a database": a header that lies, or an encrypted file.
        sqlx::Error::Database(d) if d.code().as_deref() == Some("26") => StoreError::NotAStore {
            location: location.to_owned(),
            detail: format!("it is not a readable SQLite database ({d})"),
        },
        _ => db(e),
    })?;
    if !tracked {
        return Err(StoreError::NotAStore {
            location: location.to_owned(),
            detail: format!(
                "an SQLite database without the durable schema (no `{MIGRATIONS_TABLE}` table); a read-only open never creates it"
            ),
        });
    }
    let found: Option<i64> =
        sqlx::query_scalar("SELECT MAX(version) FROM durable_schema_migrations WHERE success")
            .fetch_one(&mut *conn)
            .await
            .map_err(db)?;
    let supported = schema_version();
    match found {
        Some(found) if found > supported => Err(StoreError::SchemaTooNew {
            backend: BACKEND,
            found,
            supported,
        }),
        Some(found) if found < supported => Err(StoreError::SchemaTooOld {
            backend: BACKEND,
            found,
            supported,
        }),
        Some(_) => Ok(()),
        None => Err(StoreError::NotAStore {
            location: location.to_owned(),
            detail: format!(
                "its `{MIGRATIONS_TABLE}` table records no migration; open it once with a writer to set it up"
            ),
        }),
    }
}

/// For a read-only open: binds the store's own key (written by the writer that set the
/// store up) into `ring`, without writing anything. A store no writer has sealed yet has
/// no key; its rows are then checked by the ring as given.
pub(crate) async fn read_only_keys(
    conn: &mut SqliteConnection,
    ring: durable_core::integrity::Keyring,
) -> Result<durable_core::integrity::Keyring, StoreError> {
    let hex: Option<String> =
        sqlx::query_scalar("SELECT value FROM durable_meta WHERE name = 'store_key'")
            .fetch_optional(&mut *conn)
            .await
            .map_err(db)?;
    let signing: Option<String> =
        sqlx::query_scalar("SELECT value FROM durable_meta WHERE name = 'signing_key'")
            .fetch_optional(&mut *conn)
            .await
            .map_err(db)?;
    let Some(hex) = hex else {
        // No store key: a store no writer has sealed yet, or one whose key row is gone.
        // Rows sealed with the store's own key cannot be checked without it: one clear
        // line, not a `Tampered` on every read.
        if ring.is_unverified() || !signing.as_deref().is_some_and(|s| s.starts_with("store-")) {
            return Ok(ring);
        }
        let sessions: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM durable_sessions")
            .fetch_one(&mut *conn)
            .await
            .map_err(db)?;
        return Err(
            durable_core::integrity::OpenFacts::signed(signing.as_deref())
                .holding(sessions, None)
                .store_key_missing(),
        );
    };
    let ring = ring.bind_store_key(durable_core::integrity::Keyring::store_key_from_hex(&hex)?);
    ring.readable(signing.as_deref())?;
    Ok(ring)
}

/// What every connection must read back after connecting.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Expect {
    pub(crate) wal: bool,
    /// The lowest `synchronous` level accepted: `FULL` (2), unless a test lowered it.
    pub(crate) synchronous: i64,
    pub(crate) busy_timeout_ms: i64,
}

/// A setting SQLite did not apply (for settings that are not about durability).
#[derive(Debug, thiserror::Error)]
#[error(
    "sqlite setting `{pragma}` reads back as {found}, expected {expected}; the SQLite build or file system does not honour it"
)]
struct SettingNotApplied {
    pragma: &'static str,
    expected: String,
    found: String,
}

/// Reads back the pragmas the store depends on.
pub(crate) async fn verify(conn: &mut SqliteConnection, expect: Expect) -> Result<(), StoreError> {
    let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(&mut *conn)
        .await
        .map_err(db)?;
    if expect.wal && !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::NotDurable {
            backend: BACKEND,
            setting: format!("journal_mode = {}", mode.to_ascii_lowercase()),
        });
    }
    let sync: i64 = sqlx::query_scalar("PRAGMA synchronous")
        .fetch_one(&mut *conn)
        .await
        .map_err(db)?;
    if sync < expect.synchronous.min(2) {
        return Err(StoreError::NotDurable {
            backend: BACKEND,
            setting: format!("synchronous = {}", synchronous_name(sync)),
        });
    }
    let fk: i64 = sqlx::query_scalar("PRAGMA foreign_keys")
        .fetch_one(&mut *conn)
        .await
        .map_err(db)?;
    if fk != 1 {
        return Err(StoreError::database(
            BACKEND,
            SettingNotApplied {
                pragma: "foreign_keys",
                expected: "1".into(),
                found: fk.to_string(),
            },
        ));
    }
    let busy: i64 = sqlx::query_scalar("PRAGMA busy_timeout")
        .fetch_one(&mut *conn)
        .await
        .map_err(db)?;
    if busy != expect.busy_timeout_ms {
        return Err(StoreError::database(
            BACKEND,
            SettingNotApplied {
                pragma: "busy_timeout",
                expected: format!("{} ms", expect.busy_timeout_ms),
                found: format!("{busy} ms"),
            },
        ));
    }
    Ok(())
}

/// The name of a `PRAGMA synchronous` value.
pub(crate) fn synchronous_name(value: i64) -> String {
    match value {
        0 => "off".into(),
        1 => "normal".into(),
        2 => "full".into(),
        3 => "extra".into(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use sqlx::ConnectOptions;
    use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};

    use super::*;

    async fn connect(options: SqliteConnectOptions) -> SqliteConnection {
        options.connect().await.expect("connect")
    }

    fn file(dir: &tempfile::TempDir) -> SqliteConnectOptions {
        SqliteConnectOptions::new()
            .filename(dir.path().join("t.db"))
            .create_if_missing(true)
    }

    const EXPECT: Expect = Expect {
        wal: true,
        synchronous: 2,
        busy_timeout_ms: 5_000,
    };

    #[tokio::test]
    async fn verify_refuses_rollback_journal_mode() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut conn = connect(file(&dir).journal_mode(SqliteJournalMode::Delete)).await;
        match verify(&mut conn, EXPECT).await {
            Err(StoreError::NotDurable { backend, setting }) => {
                assert_eq!(
                    (backend, setting.as_str()),
                    ("sqlite", "journal_mode = delete")
                );
            }
            other => panic!("expected NotDurable, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn verify_refuses_synchronous_normal() {
        let dir = tempfile::tempdir().expect("tempdir");
        let options = file(&dir)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal);
        let mut conn = connect(options).await;
        match verify(&mut conn, EXPECT).await {
            Err(StoreError::NotDurable { setting, .. }) => {
                assert_eq!(setting, "synchronous = normal");
            }
            other => panic!("expected NotDurable, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn verify_refuses_a_busy_timeout_that_did_not_take() {
        let dir = tempfile::tempdir().expect("tempdir");
        let options = file(&dir)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_millis(10));
        let mut conn = connect(options).await;
        let error = verify(&mut conn, EXPECT)
            .await
            .expect_err("busy timeout differs");
        assert!(error.to_string().contains("busy_timeout"), "{error}");
    }

    #[tokio::test]
    async fn verify_accepts_wal_and_full() {
        let dir = tempfile::tempdir().expect("tempdir");
        let options = file(&dir)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full);
        verify(&mut connect(options).await, EXPECT)
            .await
            .expect("WAL + FULL + foreign keys + 5 s busy timeout pass");
    }

    #[tokio::test]
    async fn after_connect_refusal_surfaces_as_not_durable() {
        let error = db(sqlx::Error::Configuration(Box::new(
            StoreError::NotDurable {
                backend: BACKEND,
                setting: "synchronous = off".into(),
            },
        )));
        assert!(matches!(error, StoreError::NotDurable { .. }), "{error:?}");
    }
}
