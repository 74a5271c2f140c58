//! Reaching the server within the connect timeout, and the read-only open.

use std::fmt;
use std::time::Duration;

use durable_core::StoreError;
use durable_core::integrity::Keyring;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

use crate::error::{BACKEND, db};
use crate::{MIGRATIONS_TABLE, applied_version, migrations, newest_migration};

/// The server could not be reached within the connect timeout. Names where it looked
/// (host and port, or the socket directory), never the password.
#[derive(Debug)]
pub(crate) struct Unreachable {
    address: String,
    timeout: Duration,
    cause: String,
}

impl fmt::Display for Unreachable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cannot connect to PostgreSQL at {} within {}: {}; is the server running and accepting connections there? \
             (raise `PostgresStoreOptions::connect_timeout` for a slow network)",
            self.address,
            humantime_secs(self.timeout),
            self.cause
        )
    }
}

impl std::error::Error for Unreachable {}

fn humantime_secs(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{} ms", d.as_millis())
    }
}

/// Where `options` connects: `host:port`, or the Unix socket.
pub(crate) fn address(options: &PgConnectOptions) -> String {
    match options.get_socket() {
        Some(socket) => format!("socket {} (port {})", socket.display(), options.get_port()),
        None => format!("{}:{}", options.get_host(), options.get_port()),
    }
}

fn unreachable(options: &PgConnectOptions, timeout: Duration, cause: String) -> StoreError {
    StoreError::database(
        BACKEND,
        Unreachable {
            address: address(options),
            timeout,
            cause,
        },
    )
}

/// A one-connection pool of its own, connected within `timeout`: a server that is down
/// or unreachable fails with an error naming host and port, after at most `timeout`.
///
/// (A pool rather than a bare `PgConnection` keeps the caller's future `Send` for
/// `tokio::spawn`.)
pub(crate) async fn setup_pool(
    options: &PgConnectOptions,
    timeout: Duration,
) -> Result<PgPool, StoreError> {
    let connect = PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(timeout)
        .connect_with(options.clone());
    // The pool's own deadline covers connection attempts; this one is a backstop.
    match tokio::time::timeout(timeout + Duration::from_millis(250), connect).await {
        Ok(Ok(pool)) => Ok(pool),
        Ok(Err(e @ (sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut))) => {
            let cause = match e {
                sqlx::Error::PoolTimedOut => "no connection was established".to_owned(),
                other => other.to_string(),
            };
            Err(unreachable(options, timeout, cause))
        }
        Ok(Err(e)) => Err(db(e)),
        Err(_) => Err(unreachable(
            options,
            timeout,
            "no connection was established".to_owned(),
        )),
    }
}

/// For a read-only open: the database must hold the durable schema at exactly the
/// version this release knows. Nothing is created or migrated. Returns `keyring` with the
/// store's own key bound, read without writing.
pub(crate) async fn check_read_only(
    options: &PgConnectOptions,
    timeout: Duration,
    location: &str,
    keyring: Keyring,
) -> Result<Keyring, StoreError> {
    let pool = setup_pool(options, timeout).await?;
    let result = async {
        let supported = newest_migration(&migrations());
        let found = {
            let mut conn = pool.acquire().await.map_err(db)?;
            applied_version(&mut conn).await?
        };
        match found {
            None => Err(StoreError::NotAStore {
                location: location.to_owned(),
                detail: format!(
                    "the database has no durable schema (no `{MIGRATIONS_TABLE}` table); a read-only open never creates it"
                ),
            }),
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
            Some(_) => read_only_keys(&pool, keyring).await,
        }
    }
    .await;
    pool.close().await;
    result
}

/// Binds the store's own key (written by the writer that set the store up) into `ring`,
/// without writing anything.
async fn read_only_keys(pool: &PgPool, ring: Keyring) -> Result<Keyring, StoreError> {
    let has_meta: bool = sqlx::query_scalar("SELECT to_regclass('durable_meta') IS NOT NULL")
        .fetch_one(pool)
        .await
        .map_err(db)?;
    if !has_meta {
        return Ok(ring);
    }
    let hex: Option<String> =
        sqlx::query_scalar("SELECT value FROM durable_meta WHERE name = 'store_key'")
            .fetch_optional(pool)
            .await
            .map_err(db)?;
    let signing: Option<String> =
        sqlx::query_scalar("SELECT value FROM durable_meta WHERE name = 'signing_key'")
            .fetch_optional(pool)
            .await
            .map_err(db)?;
    let Some(hex) = hex else {
        // No store key: a store no writer has sealed yet, or one whose key row is gone.
        // Rows sealed with the store's own key cannot be checked without it: one clear
        // line, not a `Tampered` on every read.
        if ring.is_unverified() || !signing.as_deref().is_some_and(|s| s.starts_with("store-")) {
            return Ok(ring);
        }
        let sessions: i64 = sqlx::query_scalar("SELECT count(*) FROM durable_sessions")
            .fetch_one(pool)
            .await
            .map_err(db)?;
        return Err(
            durable_core::integrity::OpenFacts::signed(signing.as_deref())
                .holding(sessions, None)
                .store_key_missing(),
        );
    };
    let ring = ring.bind_store_key(Keyring::store_key_from_hex(&hex)?);
    // A reader re-seals nothing: a store sealed with another key is one clear line
    // (`KeyMissing`), never a `Tampered` on every read.
    ring.readable(signing.as_deref())?;
    Ok(ring)
}

/// A URL that does not parse: says so without quoting it (it may hold a password), and
/// points at the usual cause.
pub(crate) fn bad_url(url: &str, error: sqlx::Error) -> StoreError {
    StoreError::database(
        BACKEND,
        BadUrl {
            url: durable_core::redact::redact_url(url),
            error: error.to_string(),
        },
    )
}

/// See [`bad_url`].
#[derive(Debug, thiserror::Error)]
#[error(
    "invalid PostgreSQL URL `{url}`: {error}; characters such as `/ ? @ # :` in the user name or password must be percent-encoded (`/` is `%2F`, `?` is `%3F`, `@` is `%40`, `#` is `%23`, `:` is `%3A`)"
)]
pub(crate) struct BadUrl {
    url: String,
    error: String,
}
