//! The `durable` binary against real PostgreSQL databases (the throwaway cluster of
//! `durable_postgres::testing`, or `DATABASE_URL`): the same scenarios as `tests/cli.rs`,
//! plus the Postgres bad-input cases (unreachable server, newer schema).

mod cli_support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use cli_support::{run, scenarios};
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
    migrate,
    unknown_things,
);

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
