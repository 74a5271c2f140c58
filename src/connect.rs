//! [`connect`]: one call that opens whichever store a URL names, among the backends
//! compiled in; [`connect_read_only`] opens it for inspection.

use std::sync::Arc;

use durable_core::error::ConnectError;
use durable_core::{CheckpointStore, StoreError};

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
/// # async fn demo() -> Result<(), durable::error::ConnectError> {
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

/// Opens the store a URL names (the URLs of [`connect`]) for inspection only: it is never
/// created, migrated or written to.
///
/// - SQLite: [`SqliteStoreOptions::read_only`](crate::sqlite::SqliteStoreOptions::read_only)
///   (`SQLITE_OPEN_READONLY`; the journal mode is not changed). `sqlite::memory:` is
///   refused: a new in-memory database is always empty.
/// - PostgreSQL: `PostgresStoreOptions::read_only` (no migration;
///   `default_transaction_read_only = on`).
///
/// A location that holds no durable store (a missing, empty or foreign file, a database
/// without the durable schema) fails with [`StoreError::NotAStore`], a schema of another
/// release with [`StoreError::SchemaTooOld`] or [`StoreError::SchemaTooNew`]; each is one
/// line. Every write through the store fails with [`StoreError::ReadOnly`].
///
/// ```no_run
/// # async fn demo() -> Result<(), durable::error::ConnectError> {
/// let store = durable::connect_read_only("sqlite:agent.db").await?;
/// let sessions = store.list_sessions(&Default::default()).await?;
/// # let _ = sessions; Ok(()) }
/// ```
pub async fn connect_read_only(url: &str) -> Result<Arc<dyn CheckpointStore>, ConnectError> {
    match Backend::of(url)? {
        Backend::Sqlite(path) => open_sqlite_read_only(path).await,
        Backend::SqliteMemory => Err(ConnectError::Store(StoreError::NotAStore {
            location: url.to_owned(),
            detail: "an in-memory database cannot be opened read-only: it would be empty".into(),
        })),
        Backend::Postgres => open_postgres_read_only(url).await,
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
            Some(_) => Err(ConnectError::UnknownScheme {
                url: durable_core::redact::redact_url(url),
            }),
            None if !url.is_empty() => Ok(Backend::Sqlite(url)),
            None => Err(ConnectError::UnknownScheme { url: String::new() }),
        }
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
async fn open_sqlite_read_only(path: &str) -> Result<Arc<dyn CheckpointStore>, ConnectError> {
    Ok(Arc::new(
        crate::sqlite::SqliteStore::open_read_only(path).await?,
    ))
}

#[cfg(not(feature = "sqlite"))]
async fn open_sqlite_read_only(path: &str) -> Result<Arc<dyn CheckpointStore>, ConnectError> {
    open_sqlite(path).await
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

#[cfg(feature = "postgres")]
async fn open_postgres_read_only(url: &str) -> Result<Arc<dyn CheckpointStore>, ConnectError> {
    let options = crate::postgres::PostgresStoreOptions::new(url).read_only(true);
    Ok(Arc::new(
        crate::postgres::PostgresStore::connect_with(options).await?,
    ))
}

#[cfg(not(feature = "postgres"))]
async fn open_postgres_read_only(url: &str) -> Result<Arc<dyn CheckpointStore>, ConnectError> {
    open_postgres(url).await
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
        assert!(text.contains("mysql://root:***@db/x"), "{text}");
        assert!(!text.contains("hunter2"), "password leaked: {text}");
    }

    #[cfg(feature = "sqlite")]
    fn assert_send<T: Send>(_: &T) {}

    #[cfg(feature = "sqlite")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn connect_futures_are_send_and_can_be_spawned() {
        let dir = tempfile::tempdir().expect("tempdir");
        let url = format!("sqlite:{}", dir.path().join("agent.db").display());
        let open = connect(&url);
        assert_send(&open);
        let url2 = url.clone();
        tokio::spawn(async move { connect(&url2).await })
            .await
            .expect("join")
            .expect("spawned connect");
        drop(open);
        let read_only = connect_read_only(&url);
        assert_send(&read_only);
        let store = read_only.await.expect("read-only connect");
        match store.create_session(new_session()).await {
            Err(StoreError::ReadOnly { .. }) => {}
            other => panic!("a write through connect_read_only: {other:?}"),
        }
        assert_send(&connect("sqlite::memory:"));
    }

    #[cfg(feature = "sqlite")]
    fn new_session() -> durable_core::store::NewSession {
        durable_core::store::NewSession {
            id: durable_core::SessionId::new("s1"),
            app_version: "v1".into(),
            metadata: serde_json::json!({}),
            owner: "w1".into(),
            lease_ttl: std::time::Duration::from_secs(60),
            initial: durable_core::store::NewCheckpoint {
                messages: Vec::new(),
                plan: serde_json::Value::Null,
                budget: serde_json::Value::Null,
                state: serde_json::Value::Null,
                wake_at: None,
            },
            queue: None,
        }
    }

    #[cfg(feature = "sqlite")]
    #[tokio::test]
    async fn connect_read_only_refuses_what_is_not_a_store() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = dir.path().join("missing.db");
        for url in [
            format!("sqlite:{}", missing.display()),
            "sqlite::memory:".to_owned(),
        ] {
            match connect_read_only(&url).await {
                Err(ConnectError::Store(StoreError::NotAStore { .. })) => {}
                other => panic!("{url}: expected NotAStore, got {:?}", other.map(|_| ())),
            }
        }
        assert!(!missing.exists(), "a read-only connect created the file");
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
