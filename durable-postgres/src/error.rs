//! Mapping of sqlx and migration errors onto [`StoreError`].

use durable_core::StoreError;
use durable_core::ids::SessionId;
use sqlx::migrate::MigrateError;

/// The backend name used in errors.
pub(crate) const BACKEND: &str = "postgres";

/// SQLSTATE of a unique-constraint violation.
const UNIQUE_VIOLATION: &str = "23505";

/// SQLSTATE of a write in a read-only transaction (`default_transaction_read_only`).
const READ_ONLY_SQL_TRANSACTION: &str = "25006";

/// Wraps a database error; a write refused because the store was opened read-only is
/// [`StoreError::ReadOnly`].
pub(crate) fn db(e: sqlx::Error) -> StoreError {
    match &e {
        // A pool without context (see `pool_error`): still typed, still retryable.
        sqlx::Error::PoolTimedOut => StoreError::overloaded(
            BACKEND,
            "connection",
            0,
            std::time::Duration::ZERO,
            POOL_ADVICE,
        ),
        sqlx::Error::Database(d) if d.code().as_deref() == Some(READ_ONLY_SQL_TRANSACTION) => {
            StoreError::ReadOnly { backend: BACKEND }
        }
        sqlx::Error::Database(d) => StoreError::database(BACKEND, ServerError::from(&**d)),
        _ => StoreError::database(BACKEND, e),
    }
}

/// An error the PostgreSQL server sent, shown as its message (with its detail and hint,
/// and its SQLSTATE), not as sqlx renders it: sqlx ends it with `at line N`, the line of
/// the server's own C source that raised it (`auth.c`, say), which tells the person
/// reading it nothing.
#[derive(Debug)]
pub(crate) struct ServerError {
    message: String,
    detail: Option<String>,
    hint: Option<String>,
    code: Option<String>,
}

impl From<&dyn sqlx::error::DatabaseError> for ServerError {
    fn from(e: &dyn sqlx::error::DatabaseError) -> Self {
        let pg = e.try_downcast_ref::<sqlx::postgres::PgDatabaseError>();
        ServerError {
            message: e.message().to_owned(),
            detail: pg.and_then(|p| p.detail()).map(str::to_owned),
            hint: pg.and_then(|p| p.hint()).map(str::to_owned),
            code: e.code().map(|c| c.into_owned()),
        }
    }
}

impl std::fmt::Display for ServerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)?;
        if let Some(detail) = &self.detail {
            write!(f, " ({detail})")?;
        }
        if let Some(hint) = &self.hint {
            write!(f, "; hint: {hint}")?;
        }
        if let Some(code) = &self.code {
            write!(f, " [SQLSTATE {code}]")?;
        }
        Ok(())
    }
}

impl std::error::Error for ServerError {}

/// What to raise when the pool stays full.
const POOL_ADVICE: &str = "raise `PostgresStoreOptions::max_connections` (the pool's size, default 10; \
     the server's own `max_connections` bounds the sum over every process) or \
     `PostgresStoreOptions::acquire_timeout` (how long an operation queues for a connection, default 30 s)";

/// Maps an error of taking a connection of `pool`: a pool that stayed full for its whole
/// acquire timeout is [`StoreError::Overloaded`], naming its size and the setting to raise.
pub(crate) fn pool_error(pool: &sqlx::PgPool, e: sqlx::Error) -> StoreError {
    match e {
        sqlx::Error::PoolTimedOut => {
            let options = pool.options();
            StoreError::overloaded(
                BACKEND,
                "connection",
                options.get_max_connections(),
                options.get_acquire_timeout(),
                POOL_ADVICE,
            )
        }
        other => db(other),
    }
}

/// The name of the unique constraint `e` violated, if it is a unique violation.
pub(crate) fn unique_violation(e: &sqlx::Error) -> Option<String> {
    match e {
        sqlx::Error::Database(d) if d.code().as_deref() == Some(UNIQUE_VIOLATION) => {
            Some(d.constraint().unwrap_or_default().to_owned())
        }
        _ => None,
    }
}

/// Maps a migration failure; a database that applied a migration we do not know was
/// written by a newer release.
pub(crate) fn migrate(e: MigrateError, supported: i64) -> StoreError {
    match e {
        MigrateError::VersionMissing(found) if found > supported => StoreError::SchemaTooNew {
            backend: BACKEND,
            found,
            supported,
        },
        MigrateError::Execute(e) => db(e),
        other => StoreError::database(BACKEND, other),
    }
}

/// A stored row that cannot be read.
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

/// A database failure that is not a sqlx error (a broken invariant of our own rows).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct Invariant(pub(crate) String);

/// Wraps a broken invariant as a database error.
pub(crate) fn invariant(detail: impl Into<String>) -> StoreError {
    StoreError::database(BACKEND, Invariant(detail.into()))
}
