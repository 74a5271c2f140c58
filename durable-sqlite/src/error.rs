//! Mapping of sqlx and serde errors into [`StoreError`].

use std::time::Duration;

use durable_core::store::FORMAT_VERSION;
use durable_core::{SessionId, StoreError};

/// The backend name used in every error and log line.
pub(crate) const BACKEND: &str = "sqlite";

/// Converts a sqlx error into a [`StoreError`].
///
/// A [`StoreError`] smuggled through [`sqlx::Error::Configuration`] (the only way an
/// `after_connect` hook can fail with our own error) is unwrapped again, so a durability
/// refusal surfaces as [`StoreError::NotDurable`] rather than an opaque database error.
pub(crate) fn db(error: sqlx::Error) -> StoreError {
    match error {
        sqlx::Error::Configuration(source) if source.is::<StoreError>() => {
            match source.downcast::<StoreError>() {
                Ok(store) => *store,
                Err(source) => StoreError::database(BACKEND, sqlx::Error::Configuration(source)),
            }
        }
        // A pool without context (see `acquire`): still typed, still retryable.
        sqlx::Error::PoolTimedOut => {
            StoreError::overloaded(BACKEND, "connection", 0, Duration::ZERO, READER_ADVICE)
        }
        sqlx::Error::Database(e) if is_read_only(e.code().as_deref()) => {
            StoreError::ReadOnly { backend: BACKEND }
        }
        other => StoreError::database(BACKEND, other),
    }
}

/// Which pool of a store a connection is taken from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pool {
    /// The one writer connection.
    Writer,
    /// The reader pool.
    Reader,
}

/// What to raise when the reader pool stays full.
const READER_ADVICE: &str = "raise `SqliteStoreOptions::max_readers` (the reader pool's size, default 4) \
     or `SqliteStoreOptions::acquire_timeout` (how long an operation queues for a connection, default 30 s)";

/// What to raise when the writer queue is too long for the acquire timeout.
const WRITER_ADVICE: &str = "raise `SqliteStoreOptions::acquire_timeout` (how long a write queues for \
     the store's one writer connection, default 30 s), or spread the sessions over more stores";

/// Takes a connection of `pool`; a pool that stayed full for its whole acquire timeout is
/// [`StoreError::Overloaded`], naming the pool, its size and the setting to raise.
pub(crate) async fn acquire(
    pool: &sqlx::SqlitePool,
    which: Pool,
) -> Result<sqlx::pool::PoolConnection<sqlx::Sqlite>, StoreError> {
    pool.acquire().await.map_err(|e| pool_error(pool, which, e))
}

/// Maps an error of taking a connection of `pool` (see [`acquire`]).
pub(crate) fn pool_error(pool: &sqlx::SqlitePool, which: Pool, error: sqlx::Error) -> StoreError {
    match error {
        sqlx::Error::PoolTimedOut => {
            let options = pool.options();
            let (name, advice) = match which {
                Pool::Writer => ("writer", WRITER_ADVICE),
                Pool::Reader => ("reader", READER_ADVICE),
            };
            StoreError::overloaded(
                BACKEND,
                name,
                options.get_max_connections(),
                options.get_acquire_timeout(),
                advice,
            )
        }
        other => db(other),
    }
}

/// Whether an extended SQLite result code is `SQLITE_READONLY` (8) or one of its
/// extended codes (`SQLITE_READONLY_*` = 8 + 256·n): a write on a read-only connection.
fn is_read_only(code: Option<&str>) -> bool {
    code.and_then(|c| c.parse::<i32>().ok())
        .is_some_and(|c| c & 0xff == 8)
}

/// Converts a migration failure into a [`StoreError`].
pub(crate) fn migrate(error: sqlx::migrate::MigrateError) -> StoreError {
    match error {
        sqlx::migrate::MigrateError::Execute(inner) => db(inner),
        other => StoreError::database(BACKEND, other),
    }
}

/// A JSON value could not be serialized for storage.
pub(crate) fn encode(error: serde_json::Error) -> StoreError {
    StoreError::database(BACKEND, error)
}

/// A stored row could not be read: names the session and, if known, the checkpoint version.
pub(crate) fn corrupt(
    session: &SessionId,
    version: Option<i64>,
    detail: impl Into<String>,
) -> StoreError {
    StoreError::Corrupt {
        session: session.clone(),
        version,
        detail: detail.into(),
    }
}

/// Refuses a row written by a newer JSON format than this release reads.
pub(crate) fn check_format(
    format: i64,
    session: &SessionId,
    version: Option<i64>,
    what: &str,
) -> Result<(), StoreError> {
    if format > i64::from(FORMAT_VERSION) {
        return Err(corrupt(
            session,
            version,
            format!(
                "{what} was written by a newer format {format} (this release reads formats up to {FORMAT_VERSION}); upgrade `durable` to read it"
            ),
        ));
    }
    Ok(())
}

/// Parses a stored JSON column, reporting failure as [`StoreError::Corrupt`].
pub(crate) fn parse_json(
    text: &str,
    session: &SessionId,
    version: Option<i64>,
    what: &str,
) -> Result<serde_json::Value, StoreError> {
    serde_json::from_str(text)
        .map_err(|e| corrupt(session, version, format!("{what} is not valid JSON: {e}")))
}
