//! Hygiene of `PostgresStore`: the read-only open, the connect timeout, passwords kept
//! out of `Debug`, errors and panics, and `Send` connect futures.
#![cfg(feature = "testing")]

use durable_core::store::{LeaseStore, SessionStore};
use std::time::{Duration, Instant};

use durable_core::redact::redact_url;
use durable_core::store::{NewCheckpoint, NewSession, SessionFilter};
use durable_core::{CheckpointStore, SessionId, StoreError};
use durable_postgres::testing::test_database;
use durable_postgres::{PostgresStore, PostgresStoreOptions};
use serde_json::json;
use sqlx::PgPool;

const TTL: Duration = Duration::from_secs(60);
const PASSWORD: &str = "Sup3r/S3cr?Tq9@Xk7#Yz5";

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

/// Asserts that no piece of [`PASSWORD`] appears in `text`.
fn assert_no_password(text: &str) {
    for piece in PASSWORD.split(['/', '?', '@', '#']) {
        assert!(
            !text.contains(piece),
            "password piece `{piece}` leaked: {text}"
        );
    }
}

fn read_only(url: &str) -> PostgresStoreOptions {
    PostgresStoreOptions::new(url).read_only(true)
}

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

#[tokio::test]
async fn read_only_refuses_a_database_without_the_schema_and_creates_nothing() {
    let db = test_database().await;
    let err = PostgresStore::connect_with(read_only(db.url()))
        .await
        .expect_err("no durable schema");
    match &err {
        StoreError::NotAStore { location, detail } => {
            assert!(detail.contains("durable_schema_migrations"), "{err}");
            assert!(location.contains(db.name()), "{err}");
        }
        other => panic!("expected NotAStore, got {other:?}"),
    }
    assert!(!err.to_string().contains('\n'), "one line: {err}");
    let raw = PgPool::connect(db.url()).await.expect("raw pool");
    let tables: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'",
    )
    .fetch_one(&raw)
    .await
    .expect("count tables");
    assert_eq!(tables, 0, "a read-only open created tables");
}

#[tokio::test]
async fn read_only_reads_and_refuses_every_write() {
    let db = test_database().await;
    let writer = db.store().await.expect("writer");
    writer.create_session(new_session("s1")).await.expect("s1");

    let reader = PostgresStore::connect_with(read_only(db.url()))
        .await
        .expect("reader");
    assert_eq!(ids(&reader).await, ["s1"]);
    match reader.create_session(new_session("s2")).await {
        Err(StoreError::ReadOnly {
            backend: "postgres",
        }) => {}
        other => panic!("create_session through a read-only store: {other:?}"),
    }
    match reader
        .acquire_lease(&SessionId::new("s1"), "w2", TTL, 5)
        .await
    {
        Err(StoreError::ReadOnly { .. }) => {}
        other => panic!("acquire_lease through a read-only store: {other:?}"),
    }
    let setting: String = sqlx::query_scalar("SHOW default_transaction_read_only")
        .fetch_one(reader.pool())
        .await
        .expect("show");
    assert_eq!(setting, "on");
    assert_eq!(ids(&writer).await, ["s1"], "nothing was written");
}

#[tokio::test]
async fn read_only_refuses_an_older_or_newer_schema() {
    let db = test_database().await;
    db.store().await.expect("writer");
    let raw = PgPool::connect(db.url()).await.expect("raw pool");
    sqlx::query(
        "DELETE FROM durable_schema_migrations WHERE version = (SELECT max(version) FROM durable_schema_migrations)",
    )
    .execute(&raw)
    .await
    .expect("forget the newest migration");
    match PostgresStore::connect_with(read_only(db.url())).await {
        Err(error @ StoreError::SchemaTooOld { .. }) => {
            assert!(error.to_string().contains("with a writer"), "{error}");
        }
        other => panic!("expected SchemaTooOld, got {other:?}"),
    }
    sqlx::query(
        "INSERT INTO durable_schema_migrations (version, description, success, checksum, execution_time) \
         VALUES (9999, 'from the future', true, '\\x00', 0)",
    )
    .execute(&raw)
    .await
    .expect("a migration from the future");
    match PostgresStore::connect_with(read_only(db.url())).await {
        Err(StoreError::SchemaTooNew { found: 9999, .. }) => {}
        other => panic!("expected SchemaTooNew, got {other:?}"),
    }
}

/// A loopback port nothing listens on.
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    drop(listener);
    port
}

fn url_with_password(port: u16) -> String {
    let encoded = PASSWORD
        .replace('/', "%2F")
        .replace('?', "%3F")
        .replace('@', "%40")
        .replace('#', "%23");
    format!("postgres://app:{encoded}@127.0.0.1:{port}/agent")
}

#[tokio::test]
async fn a_server_that_is_down_fails_within_the_connect_timeout_naming_host_and_port() {
    let port = closed_port();
    let started = Instant::now();
    let err = PostgresStore::connect_with(
        PostgresStoreOptions::new(url_with_password(port)).connect_timeout(Duration::from_secs(1)),
    )
    .await
    .expect_err("nothing listens there");
    let elapsed = started.elapsed();
    assert!(elapsed < Duration::from_secs(3), "took {elapsed:?}");
    let text = err.to_string();
    assert!(text.contains(&format!("127.0.0.1:{port}")), "{text}");
    assert!(text.contains("within 1 s"), "{text}");
    assert_no_password(&text);
    assert_no_password(&format!("{err:?}"));
}

#[tokio::test]
async fn the_default_connect_timeout_is_short() {
    let port = closed_port();
    let started = Instant::now();
    let err = PostgresStore::connect(&url_with_password(port))
        .await
        .expect_err("nothing listens there");
    let elapsed = started.elapsed();
    // The pool's acquire timeout (30 s) used to be the only bound.
    assert!(elapsed < Duration::from_secs(12), "took {elapsed:?}: {err}");
    assert!(
        err.to_string().contains(&format!("127.0.0.1:{port}")),
        "{err}"
    );
}

#[test]
fn debug_of_the_options_hides_the_password() {
    let options = PostgresStoreOptions::new(url_with_password(5432));
    let shown = format!("{options:?}");
    assert_no_password(&shown);
    assert!(
        shown.contains("postgres://app:***@127.0.0.1:5432/agent"),
        "{shown}"
    );
    // Even written raw, as users do by mistake.
    let raw = format!("postgres://app:{PASSWORD}@127.0.0.1:5432/agent");
    assert_no_password(&format!("{:?}", PostgresStoreOptions::new(raw.clone())));
    assert_no_password(&redact_url(&raw));
}

#[tokio::test]
async fn a_raw_password_with_reserved_characters_is_refused_without_echoing_it() {
    let raw = format!("postgres://app:{PASSWORD}@127.0.0.1:5432/agent");
    let err = PostgresStore::connect(&raw)
        .await
        .expect_err("the URL does not parse as meant");
    let text = err.to_string();
    assert_no_password(&text);
    assert_no_password(&format!("{err:?}"));
    assert!(text.contains("percent-encoded"), "{text}");
}

#[tokio::test]
async fn a_percent_encoded_password_with_reserved_characters_connects() {
    let db = test_database().await;
    // The throwaway cluster trusts loopback connections, so the password is not checked;
    // what matters is that the URL parses to the right host, port and database.
    let url = db.url().replacen(
        "postgres://postgres@",
        "postgres://postgres:Sup3r%2FS3cr%3FTq9%40Xk7%23Yz5@",
        1,
    );
    if url == db.url() {
        // DATABASE_URL names another server: its credentials are its own.
        return;
    }
    let store = PostgresStore::connect(&url).await.expect("connect");
    store
        .create_session(new_session("s1"))
        .await
        .expect("write");
}

fn assert_send<T: Send>(_: &T) {}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_futures_are_send_and_can_be_spawned() {
    let db = test_database().await;
    let connect = PostgresStore::connect_with(PostgresStoreOptions::new(db.url()));
    assert_send(&connect);
    tokio::spawn(connect)
        .await
        .expect("join")
        .expect("spawned connect");
    let reader = PostgresStore::connect_with(read_only(db.url()));
    assert_send(&reader);
    tokio::spawn(reader)
        .await
        .expect("join")
        .expect("spawned read-only connect");
}

/// The test harness's panic for an unreachable `DATABASE_URL` does not print its password
/// (run in a child process, which gets its own `DATABASE_URL`).
#[test]
fn the_harness_panic_hides_the_password() {
    const CHILD: &str = "DURABLE_POSTGRES_HYGIENE_CHILD";
    if std::env::var_os(CHILD).is_some() {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(test_database());
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().expect("current exe"))
        .args([
            "--exact",
            "the_harness_panic_hides_the_password",
            "--nocapture",
        ])
        .env(CHILD, "1")
        .env("DATABASE_URL", url_with_password(closed_port()))
        .output()
        .expect("run the child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "the child should panic: {stdout}{stderr}"
    );
    assert!(
        stderr.contains("cannot connect to the test server at postgres://app:***@127.0.0.1:"),
        "{stderr}"
    );
    assert_no_password(&stdout);
    assert_no_password(&stderr);
}
