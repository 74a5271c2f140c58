//! File hygiene of `SqliteStore`: private file modes, refusing files that are not stores,
//! the read-only open, and `Send` open futures.

use durable_core::store::{LeaseStore, SessionStore};
use std::path::{Path, PathBuf};
use std::time::Duration;

use durable_core::store::{NewCheckpoint, NewSession, SessionFilter};
use durable_core::{CheckpointStore, SessionId, StoreError};
use durable_sqlite::{SqliteStore, SqliteStoreOptions, schema_version};
use serde_json::json;
use sqlx::{ConnectOptions, Connection, SqliteConnection};

const TTL: Duration = Duration::from_secs(60);

fn new_session(id: &str) -> NewSession {
    NewSession {
        id: SessionId::new(id),
        app_version: "v1".into(),
        metadata: json!({}),
        owner: "w1".into(),
        lease_ttl: TTL,
        initial: NewCheckpoint {
            messages: vec![json!({"role": "user", "content": "hello"})],
            plan: json!(null),
            budget: json!(null),
            state: json!(null),
            wake_at: None,
        },
        queue: None,
    }
}

fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// A raw connection that creates nothing and changes no setting.
async fn raw(path: &Path) -> SqliteConnection {
    sqlx::sqlite::SqliteConnectOptions::new()
        .filename(path)
        .connect()
        .await
        .expect("raw connect")
}

/// Creates an SQLite database of a host application: one table of its own, rollback
/// journal, no durable tables.
async fn host_database(path: &Path) {
    let mut conn = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .connect()
        .await
        .expect("create host db");
    sqlx::query("CREATE TABLE host_things (id INTEGER PRIMARY KEY)")
        .execute(&mut conn)
        .await
        .expect("host table");
    conn.close().await.expect("close");
}

/// The ids of every session.
async fn ids(store: &dyn CheckpointStore) -> Vec<String> {
    let mut ids: Vec<String> = store
        .list_sessions(&SessionFilter::default())
        .await
        .expect("list_sessions")
        .into_iter()
        .map(|s| s.id.as_str().to_owned())
        .collect();
    ids.sort();
    ids
}

fn expect_not_a_store<T: std::fmt::Debug>(result: Result<T, StoreError>, what: &str) -> String {
    match result {
        Err(error @ StoreError::NotAStore { .. }) => {
            let text = error.to_string();
            assert!(!text.contains('\n'), "{what}: not one line: {text}");
            text
        }
        other => panic!("{what}: expected NotAStore, got {other:?}"),
    }
}

#[cfg(unix)]
fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("stat {}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

#[cfg(unix)]
#[tokio::test]
async fn a_new_store_and_its_wal_and_shm_are_private() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("agent.db");
    let store = SqliteStore::open(&path).await.expect("open");
    store
        .create_session(new_session("s1"))
        .await
        .expect("a write");
    for file in [path.clone(), sibling(&path, "-wal"), sibling(&path, "-shm")] {
        assert_eq!(mode(&file), 0o600, "mode of {}", file.display());
    }
}

#[cfg(unix)]
#[tokio::test]
async fn an_existing_database_keeps_its_mode() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("host.db");
    host_database(&path).await;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).expect("chmod");

    let store = SqliteStore::open(&path)
        .await
        .expect("a writer embeds its tables in a host database");
    store
        .create_session(new_session("s1"))
        .await
        .expect("write");
    assert_eq!(mode(&path), 0o640, "the user's file mode is left alone");
    let mut conn = raw(&path).await;
    let host: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM host_things")
        .fetch_one(&mut conn)
        .await
        .expect("the host's table is still there");
    assert_eq!(host, 0);
}

#[tokio::test]
async fn an_empty_file_is_not_turned_into_a_store() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("empty.db");
    std::fs::write(&path, b"").expect("touch");
    let text = expect_not_a_store(SqliteStore::open(&path).await, "writer on an empty file");
    assert!(text.contains("empty"), "{text}");
    expect_not_a_store(
        SqliteStore::open_read_only(&path).await,
        "reader on an empty file",
    );
    assert_eq!(
        std::fs::metadata(&path).expect("stat").len(),
        0,
        "untouched"
    );
    assert!(!sibling(&path, "-wal").exists(), "no -wal was created");
    assert!(
        !sibling(&path, "-journal").exists(),
        "no -journal was created"
    );
}

#[cfg(unix)]
#[tokio::test]
async fn dev_null_is_not_a_store() {
    let text = expect_not_a_store(SqliteStore::open("/dev/null").await, "writer on /dev/null");
    assert!(text.contains("/dev/null"), "{text}");
    expect_not_a_store(
        SqliteStore::open_read_only("/dev/null").await,
        "reader on /dev/null",
    );
}

#[tokio::test]
async fn a_file_that_is_not_sqlite_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("notes.txt");
    std::fs::write(&path, b"my notes, not a database\n").expect("write");
    let text = expect_not_a_store(SqliteStore::open(&path).await, "writer on a text file");
    assert!(text.contains("not an SQLite database"), "{text}");
    expect_not_a_store(
        SqliteStore::open_read_only(&path).await,
        "reader on a text file",
    );
    assert_eq!(
        std::fs::read(&path).expect("read"),
        b"my notes, not a database\n"
    );
}

#[tokio::test]
async fn a_new_store_is_whole_in_its_main_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("agent.db");
    let _store = SqliteStore::open(&path).await.expect("open");
    // The store stays open, its -wal live. The main file alone (as after a lost -wal) is
    // still a store, not an empty file that a writer would make a fresh store of.
    let copy = dir.path().join("copy.db");
    std::fs::copy(&path, &copy).expect("copy the main file only");
    let reader = SqliteStore::open_read_only(&copy)
        .await
        .expect("the main file alone holds the schema");
    assert!(ids(&reader).await.is_empty());
}

#[tokio::test]
async fn read_only_refuses_a_missing_file_and_creates_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("missing.db");
    let text = expect_not_a_store(
        SqliteStore::open_read_only(&path).await,
        "reader on a missing file",
    );
    assert!(text.contains("does not exist"), "{text}");
    assert!(
        std::fs::read_dir(dir.path()).expect("ls").next().is_none(),
        "nothing was created"
    );
}

#[tokio::test]
async fn read_only_refuses_a_foreign_database_and_changes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("host.db");
    host_database(&path).await;
    let before = std::fs::read(&path).expect("read");

    let text = expect_not_a_store(
        SqliteStore::open_read_only(&path).await,
        "reader on a foreign database",
    );
    assert!(text.contains("durable_schema_migrations"), "{text}");
    assert_eq!(
        std::fs::read(&path).expect("read"),
        before,
        "not one byte changed (no tables, no WAL mode)"
    );
    assert!(!sibling(&path, "-wal").exists(), "no -wal was created");
}

/// Runs one statement on a raw connection to `path`.
async fn execute(path: &Path, sql: &str) {
    let mut conn = raw(path).await;
    sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(&mut conn)
        .await
        .expect(sql);
    conn.close().await.expect("close");
}

#[tokio::test]
async fn read_only_refuses_an_older_or_newer_schema() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("agent.db");
    SqliteStore::open(&path)
        .await
        .expect("create")
        .close()
        .await;
    let supported = schema_version();

    execute(
        &path,
        &format!("DELETE FROM durable_schema_migrations WHERE version = {supported}"),
    )
    .await;
    match SqliteStore::open_read_only(&path).await {
        Err(error @ StoreError::SchemaTooOld { found, .. }) => {
            assert!(found < supported, "{error}");
            assert!(error.to_string().contains("with a writer"), "{error}");
        }
        other => panic!("expected SchemaTooOld, got {other:?}"),
    }

    execute(
        &path,
        "INSERT INTO durable_schema_migrations (version, description, success, checksum, execution_time) \
         VALUES (9999, 'from the future', 1, x'00', 0)",
    )
    .await;
    match SqliteStore::open_read_only(&path).await {
        Err(StoreError::SchemaTooNew { found: 9999, .. }) => {}
        other => panic!("expected SchemaTooNew, got {other:?}"),
    }
}

#[tokio::test]
async fn read_only_reads_a_live_store_and_refuses_writes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("agent.db");
    let writer = SqliteStore::open(&path).await.expect("writer");
    writer.create_session(new_session("s1")).await.expect("s1");
    assert!(sibling(&path, "-wal").exists(), "the writer's WAL is live");

    let reader = SqliteStore::open_read_only(&path).await.expect("reader");
    assert!(reader.is_read_only());
    assert_eq!(ids(&reader).await, ["s1"]);
    writer.create_session(new_session("s2")).await.expect("s2");
    assert_eq!(
        ids(&reader).await,
        ["s1", "s2"],
        "the reader sees the writer's new rows"
    );

    match reader.create_session(new_session("s3")).await {
        Err(StoreError::ReadOnly { backend: "sqlite" }) => {}
        other => panic!("create_session through a read-only store: {other:?}"),
    }
    match reader
        .acquire_lease(&SessionId::new("s1"), "w2", TTL, 5)
        .await
    {
        Err(StoreError::ReadOnly { .. }) => {}
        other => panic!("acquire_lease through a read-only store: {other:?}"),
    }
    assert_eq!(ids(&writer).await, ["s1", "s2"], "nothing was written");
}

#[cfg(unix)]
#[tokio::test]
async fn read_only_reads_a_file_of_mode_0400() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("agent.db");
    let writer = SqliteStore::open(&path).await.expect("writer");
    writer.create_session(new_session("s1")).await.expect("s1");
    writer.close().await;
    drop(writer);
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o400)).expect("chmod");
    let before = std::fs::read(&path).expect("read");

    let reader = SqliteStore::open_read_only(&path).await.expect("reader");
    assert_eq!(ids(&reader).await, ["s1"]);
    reader.close().await;
    assert_eq!(mode(&path), 0o400, "mode untouched");
    assert_eq!(
        std::fs::read(&path).expect("read"),
        before,
        "file untouched"
    );
}

#[tokio::test]
async fn read_only_in_memory_is_refused() {
    expect_not_a_store(
        SqliteStore::connect_with(SqliteStoreOptions::in_memory().read_only(true)).await,
        "read-only in-memory store",
    );
}

fn assert_send<T: Send>(_: &T) {}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_futures_are_send_and_can_be_spawned() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("agent.db");
    let open = SqliteStore::open(path.clone());
    assert_send(&open);
    let store = tokio::spawn(open)
        .await
        .expect("join")
        .expect("spawned open");
    store.close().await;

    let connect = SqliteStore::connect_with(SqliteStoreOptions::in_memory());
    assert_send(&connect);
    tokio::spawn(connect)
        .await
        .expect("join")
        .expect("spawned in-memory open");
    assert_send(&SqliteStore::open_in_memory());

    let read_only = SqliteStore::open_read_only(path);
    assert_send(&read_only);
    tokio::spawn(read_only)
        .await
        .expect("join")
        .expect("spawned read-only open");
}
