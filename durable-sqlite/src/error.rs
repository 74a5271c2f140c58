//! Mapping of sqlx and serde errors into [`StoreError`].

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
        sqlx::Error::Database(e) if is_read_only(e.code().as_deref()) => {
            StoreError::ReadOnly { backend: BACKEND }
        }
        other => StoreError::database(BACKEND, other),
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
