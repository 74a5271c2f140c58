//! The `durable` binary against real SQLite stores: every subcommand's output and exit
//! code, every bad-input case, and the end-to-end resolve of an in-doubt email.
//!
//! Stores are populated through the library (`tests/cli_support`); the binary is the one
//! Cargo built for this test (`CARGO_BIN_EXE_durable`).

mod cli_support;

use std::path::PathBuf;
use std::sync::Arc;

use cli_support::{Run, durable_env, run, scenarios};
use durable::CheckpointStore;
use durable::sqlite::SqliteStore;

/// A fresh SQLite file: its directory guard, its path as a `--db` value, and the store.
async fn sqlite() -> (tempfile::TempDir, String, Arc<dyn CheckpointStore>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("agent.db");
    let store: Arc<dyn CheckpointStore> =
        Arc::new(SqliteStore::open(&path).await.expect("open store"));
    let db = path.to_str().expect("utf-8 path").to_owned();
    (dir, db, store)
}

macro_rules! scenario {
    ($($name:ident),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let (_dir, db, store) = sqlite().await;
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
    unpark,
    unknown_things,
);

#[tokio::test]
async fn sqlite_urls_are_accepted_in_every_spelling() {
    let (_dir, db, store) = sqlite().await;
    cli_support::populate(&store).await;
    for url in [db.clone(), format!("sqlite:{db}"), format!("sqlite://{db}")] {
        let out = run(&url, &["sessions", "--json"]);
        assert_eq!(out.json().as_array().map(Vec::len), Some(4), "{url}");
    }
    // From the environment, when --db is absent.
    let out: Run = durable_env(&["sessions", "--json"], &[("DURABLE_DB", &db)]).into();
    assert_eq!(out.json().as_array().map(Vec::len), Some(4));
}

#[test]
fn no_database_is_a_usage_error() {
    let out: Run = durable_env(&["sessions"], &[]).into();
    out.fails(
        2,
        "no database given: pass --db <sqlite file or postgres URL>, or set DURABLE_DB",
    );
}

#[test]
fn a_missing_file_is_not_created() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("typo.db");
    let db = path.to_str().expect("utf-8");
    run(db, &["sessions"]).fails(6, "no SQLite database at");
    assert!(!path.exists(), "the CLI must never create a database");
    run(&format!("sqlite:{db}"), &["in-doubt"]).fails(6, "no SQLite database at");
}

#[test]
fn a_file_that_is_not_a_database_is_unavailable() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path: PathBuf = dir.path().join("notes.txt");
    std::fs::write(
        &path,
        "these are not the tables you are looking for\n".repeat(200),
    )
    .expect("write");
    run(path.to_str().expect("utf-8"), &["sessions"]).fails(6, "is not a durable store");
}

#[tokio::test]
async fn a_newer_schema_is_refused() {
    let (_dir, db, store) = sqlite().await;
    drop(store);
    let pool = sqlx::SqlitePool::connect(&format!("sqlite:{db}"))
        .await
        .expect("raw pool");
    sqlx::query(
        "INSERT INTO durable_schema_migrations (version, description, success, checksum, execution_time) \
         VALUES (9999, 'from the future', 1, x'00', 0)",
    )
    .execute(&pool)
    .await
    .expect("fake a newer migration");
    pool.close().await;
    run(&db, &["sessions"]).fails(
        6,
        "schema is at version 9999, newer than this release supports",
    );
}

#[test]
fn unknown_url_schemes_are_unavailable_and_keep_passwords_out() {
    run("mysql://root:hunter2@db/x", &["sessions"])
        .fails(6, "unsupported database URL `mysql://***@db/x`");
    let out = run("mysql://root:hunter2@db/x", &["sessions"]);
    assert!(!out.stderr.contains("hunter2"), "{}", out.stderr);
}

#[cfg(not(feature = "postgres"))]
#[test]
fn postgres_urls_name_the_missing_feature() {
    run("postgres://127.0.0.1:1/x", &["sessions"]).fails(
        6,
        "built without `postgres:` support; rebuild it with `--features cli,postgres`",
    );
}

#[test]
fn help_lists_commands_and_exit_codes() {
    let out: Run = durable_env(&["--help"], &[]).into();
    let text = out.ok();
    for needle in [
        "sessions",
        "show",
        "calls",
        "in-doubt",
        "resolve",
        "fork",
        "export",
        "prune",
        "migrate",
        "[env: DURABLE_DB]",
        "Exit codes:",
        "3  not found",
        "6  database unavailable",
    ] {
        assert!(
            text.contains(needle),
            "{needle:?} missing from --help:\n{text}"
        );
    }
    let resolve: Run = durable_env(&["resolve", "--help"], &[]).into();
    assert!(
        resolve.ok().contains("--did-not-happen"),
        "{}",
        resolve.stdout
    );
    let version: Run = durable_env(&["--version"], &[]).into();
    assert!(version.ok().starts_with("durable "), "{}", version.stdout);
}
