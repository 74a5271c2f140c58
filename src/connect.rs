//! [`connect`]: one call that opens whichever store a URL names, among the backends
//! compiled in.

use std::sync::Arc;

use durable_core::{CheckpointStore, StoreError};

/// Why [`connect`] could not open a store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The URL names a backend whose Cargo feature is off.
    #[error(
        "`{scheme}:` URLs need the `{feature}` feature of `durable`; enable it: durable = {{ features = [\"{feature}\"] }}"
    )]
    FeatureDisabled {
        /// The URL scheme.
        scheme: String,
        /// The feature that provides it.
        feature: &'static str,
    },
    /// The URL's scheme is not one `durable` knows.
    #[error(
        "unsupported database URL `{url}`: expected `sqlite:<path>`, `sqlite::memory:`, `postgres://…`, `postgresql://…`, or a file path"
    )]
    UnknownScheme {
        /// The URL (credentials removed).
        url: String,
    },
    /// The store refused to open (unreachable server, newer schema, durability settings…).
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Opens the store a URL names, among the backends compiled in:
///
/// | URL | store | feature |
/// |---|---|---|
/// | `sqlite:agent.db`, `sqlite://agent.db`, `agent.db`, `./dir/agent.db` | [`SqliteStore::open`](crate::sqlite::SqliteStore::open) | `sqlite` (default) |
/// | `sqlite::memory:` | [`SqliteStore::open_in_memory`](crate::sqlite::SqliteStore::open_in_memory) | `sqlite` |
/// | `postgres://…`, `postgresql://…` | `PostgresStore::connect` | `postgres` |
///
/// The same application code then runs on either store. A scheme whose feature is off is
/// a [`ConnectError::FeatureDisabled`] that names the feature.
///
/// ```no_run
/// # async fn demo() -> Result<(), durable::ConnectError> {
/// let url = std::env::var("DURABLE_DB").unwrap_or_else(|_| "sqlite:agent.db".into());
/// let store = durable::connect(&url).await?;
/// let runtime = durable::Durable::builder(store).owner("worker-1").build();
/// # let _ = runtime; Ok(()) }
/// ```
pub async fn connect(url: &str) -> Result<Arc<dyn CheckpointStore>, ConnectError> {
    match Backend::of(url)? {
        Backend::Sqlite(path) => open_sqlite(path).await,
        Backend::SqliteMemory => open_sqlite_memory().await,
        Backend::Postgres => open_postgres(url).await,
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Backend<'a> {
    Sqlite(&'a str),
    SqliteMemory,
    Postgres,
}

impl<'a> Backend<'a> {
    fn of(url: &'a str) -> Result<Self, ConnectError> {
        if url == "sqlite::memory:" || url == ":memory:" {
            return Ok(Backend::SqliteMemory);
        }
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            return Ok(Backend::Postgres);
        }
        if let Some(rest) = url.strip_prefix("sqlite:") {
            let path = rest.strip_prefix("//").unwrap_or(rest);
            return Ok(Backend::Sqlite(path));
        }
        match url.split_once("://") {
            Some(_) => Err(ConnectError::UnknownScheme { url: redact(url) }),
            None if !url.is_empty() => Ok(Backend::Sqlite(url)),
            None => Err(ConnectError::UnknownScheme { url: String::new() }),
        }
    }
}

/// Removes a password from a URL for error messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            format!("{}://***@{}", &url[..scheme_end], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

#[cfg(feature = "sqlite")]
async fn open_sqlite(path: &str) -> Result<Arc<dyn CheckpointStore>, ConnectError> {
    Ok(Arc::new(crate::sqlite::SqliteStore::open(path).await?))
}

#[cfg(not(feature = "sqlite"))]
async fn open_sqlite(_path: &str) -> Result<Arc<dyn CheckpointStore>, ConnectError> {
    Err(ConnectError::FeatureDisabled {
        scheme: "sqlite".into(),
        feature: "sqlite",
    })
}

#[cfg(feature = "sqlite")]
async fn open_sqlite_memory() -> Result<Arc<dyn CheckpointStore>, ConnectError> {
    Ok(Arc::new(
        crate::sqlite::SqliteStore::open_in_memory().await?,
    ))
}

#[cfg(not(feature = "sqlite"))]
async fn open_sqlite_memory() -> Result<Arc<dyn CheckpointStore>, ConnectError> {
    open_sqlite("").await
}

#[cfg(feature = "postgres")]
async fn open_postgres(url: &str) -> Result<Arc<dyn CheckpointStore>, ConnectError> {
    Ok(Arc::new(
        crate::postgres::PostgresStore::connect(url).await?,
    ))
}

#[cfg(not(feature = "postgres"))]
async fn open_postgres(_url: &str) -> Result<Arc<dyn CheckpointStore>, ConnectError> {
    Err(ConnectError::FeatureDisabled {
        scheme: "postgres".into(),
        feature: "postgres",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_pick_their_backend() {
        assert_eq!(
            Backend::of("sqlite:agent.db").ok(),
            Some(Backend::Sqlite("agent.db"))
        );
        assert_eq!(
            Backend::of("sqlite://data/agent.db").ok(),
            Some(Backend::Sqlite("data/agent.db"))
        );
        assert_eq!(
            Backend::of("/tmp/agent.db").ok(),
            Some(Backend::Sqlite("/tmp/agent.db"))
        );
        assert_eq!(
            Backend::of("sqlite::memory:").ok(),
            Some(Backend::SqliteMemory)
        );
        assert_eq!(
            Backend::of("postgres://u:p@127.0.0.1/db").ok(),
            Some(Backend::Postgres)
        );
        assert_eq!(
            Backend::of("postgresql://127.0.0.1/db").ok(),
            Some(Backend::Postgres)
        );
        let err = Backend::of("mysql://root:hunter2@db/x").expect_err("unknown scheme");
        let text = err.to_string();
        assert!(text.contains("mysql://***@db/x"), "{text}");
        assert!(!text.contains("hunter2"), "password leaked: {text}");
    }

    #[cfg(not(feature = "postgres"))]
    #[tokio::test]
    async fn a_postgres_url_without_the_feature_names_it() {
        let Err(err) = connect("postgres://127.0.0.1/db").await else {
            panic!("a postgres URL opened a store without the `postgres` feature");
        };
        assert!(err.to_string().contains("`postgres` feature"), "{err}");
    }
}
