//! The `durable` binary against real PostgreSQL databases (the throwaway cluster of
//! `durable_postgres::testing`, or `DATABASE_URL`): the same scenarios as `tests/cli.rs`,
//! plus the Postgres bad-input cases (unreachable server, newer schema).

mod cli_support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use cli_support::{approvals, hardening, run, scenarios, workers};
use durable::CheckpointStore;
use durable_postgres::testing::test_database;

/// A fresh database: its URL for `--db`, and a store on it.
async fn postgres() -> (String, Arc<dyn CheckpointStore>) {
    let database = test_database().await;
    let store: Arc<dyn CheckpointStore> = Arc::new(database.store().await.expect("store"));
    (database.url().to_owned(), store)
}

macro_rules! scenario {
    ($($name:ident),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let (db, store) = postgres().await;
            scenarios::$name(&store, &db).await;
        }
    )*};
}

scenario!(
    sessions,
    show,
    calls,
    in_doubt,
    resolve_refusals,
    resolve_end_to_end,
    fork,
    export,
    prune,
    retarget,
    unknown_things,
);

macro_rules! approvals {
    ($($name:ident),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let (db, store) = postgres().await;
            approvals::$name(&store, &db).await;
        }
    )*};
}

approvals!(approvals_listing, approve, deny_and_refusals, expire);

macro_rules! workers {
    ($($name:ident),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let (db, store) = postgres().await;
            workers::$name(&store, &db).await;
        }
    )*};
}

workers!(
    workers,
    wake,
    queue_limit,
    tenant_limit,
    signal,
    show_queue_sleep_and_lease
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_text() {
    let (db, store) = postgres().await;
    hardening::hostile_text(&store, &db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_reports_every_session() {
    let (db, store) = postgres().await;
    cli_support::populate(&store).await;
    let out = run(&db, &["verify"]);
    let text = out.ok();
    assert!(text.contains("4 sessions verified, 0 failed"), "{text}");
    let report = run(&db, &["verify", "--json"]).json();
    assert_eq!(report["ok"], true, "{report}");
    assert_eq!(report["sessions"].as_array().map(Vec::len), Some(4));
    // Without amcheck the database check is not run, and says how to enable it.
    assert_eq!(
        report["database"]["ok"],
        serde_json::Value::Null,
        "{report}"
    );
    assert!(
        report["database"]["detail"][0]
            .as_str()
            .is_some_and(|d| d.contains("CREATE EXTENSION amcheck")),
        "{report}"
    );
    let pool = sqlx::postgres::PgPool::connect(&db).await.expect("pool");
    sqlx::query("CREATE EXTENSION amcheck")
        .execute(&pool)
        .await
        .expect("amcheck");
    pool.close().await;
    let report = run(&db, &["verify", "--json"]).json();
    assert_eq!(
        report["database"]["check"], "amcheck bt_index_check",
        "{report}"
    );
    assert_eq!(report["database"]["ok"], true, "{report}");
}

/// A password with every character that ends a URL's authority, and `@`.
const NASTY: &str = "s3cr3t/p4ss?w0rd#h45h@t4il";

/// No piece of [`NASTY`] in `text`.
#[track_caller]
fn no_password(text: &str) {
    for piece in [NASTY, "s3cr3t", "p4ss", "w0rd", "h45h", "t4il"] {
        assert!(!text.contains(piece), "{piece:?} printed:\n{text}");
    }
}

#[test]
fn the_host_check_never_prints_the_password() {
    for url in [
        format!("postgres://durable:{NASTY}@127.0.0.1:1/agents"),
        format!("postgresql://durable:{NASTY}@127.0.0.1:1/agents?sslmode=disable"),
        format!("postgres://durable:{NASTY}@127.0.0.1:1"),
    ] {
        let out = run(&url, &["sessions"]);
        assert_eq!(out.code, 6, "{}", out.stderr);
        assert!(out.stderr.starts_with("error: "), "{}", out.stderr);
        assert_eq!(out.stderr.trim_end().lines().count(), 1, "{}", out.stderr);
        no_password(&out.stderr);
        no_password(&out.stdout);
    }
}

#[tokio::test]
async fn backup_prints_pg_dump_guidance_without_the_password() {
    let database = test_database().await;
    let _store = database.store().await.expect("store");
    let url = database.url().to_owned();
    let out = run(&url, &["backup"]);
    let text = out.ok();
    assert!(
        text.contains("pg_dump --format=custom --file durable.dump --table 'durable_*'"),
        "{text}"
    );
    assert!(text.contains("writes nothing"), "{text}");
    if let Some(password) = url
        .split_once("://")
        .and_then(|(_, rest)| rest.rsplit_once('@'))
        .and_then(|(userinfo, _)| userinfo.split_once(':'))
        .map(|(_, password)| password)
    {
        assert!(!text.contains(password), "{text}");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("agents.dump");
    run(&url, &["backup", "--to", file.to_str().expect("utf-8")]).fails(4, "nothing was written");
    assert!(!file.exists());
}

#[test]
fn an_unreachable_server_is_unavailable() {
    // Port 1 on loopback: nothing listens there, the connection is refused at once.
    let started = Instant::now();
    let out = run(
        "postgres://durable:hunter2@127.0.0.1:1/agents",
        &["sessions"],
    );
    out.fails(
        6,
        "cannot reach PostgreSQL at 127.0.0.1:1: Connection refused",
    );
    assert!(!out.stderr.contains("hunter2"), "{}", out.stderr);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "gave up after {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_newer_schema_is_refused() {
    let database = test_database().await;
    let store = database.store().await.expect("store");
    sqlx::query(
        "INSERT INTO durable_schema_migrations (version, description, success, checksum, execution_time) \
         VALUES (9999, 'from the future', true, '\\x00', 0)",
    )
    .execute(store.pool())
    .await
    .expect("fake a newer migration");
    store.pool().close().await;
    run(database.url(), &["sessions"]).fails(
        6,
        "postgres database schema is at version 9999, newer than this release supports",
    );
}

/// Key rotation and a lost key on PostgreSQL: `durable rekey` turns an application key on over
/// the store's own key (rows with messages), `verify` shows the audited event; without
/// the key only `--unverified` lists the sessions, marked so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rekey_and_unverified() {
    use cli_support::{Run, durable_env};

    const KEY: &str = "0123456789abcdef-cli-pg-key";
    let database = test_database().await;
    let store: Arc<dyn CheckpointStore> = Arc::new(database.store().await.expect("store"));
    cli_support::populate(&store).await;
    drop(store);
    let db = database.url();
    let out: Run = durable_env(&["--db", db, "rekey"], &[("DURABLE_MAC_KEY", KEY)]).into();
    assert!(out.ok().contains("rekey from `store-"), "{}", out.stdout);
    let out: Run = durable_env(
        &["--db", db, "verify", "--json"],
        &[("DURABLE_MAC_KEY", KEY)],
    )
    .into();
    let report = out.json();
    assert_eq!(report["ok"], true, "{report}");
    assert_eq!(report["integrity_log"]["events"][0]["event"], "rekey");
    run(db, &["sessions"]).fails(6, "key `app-");
    let listed = run(db, &["--unverified", "sessions", "--json"]).json();
    assert_eq!(listed["unverified"], true, "{listed}");
    assert_eq!(
        listed["items"].as_array().map(Vec::len),
        Some(4),
        "{listed}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budget_show_and_raise() {
    let (db, store) = postgres().await;
    cli_support::budget::budget(&store, &db).await;
}
