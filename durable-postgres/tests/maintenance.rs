//! `PostgresStore::index_check`: amcheck over the store's indexes, and what it says when
//! it cannot run.
#![cfg(feature = "testing")]

use durable_core::store::SessionStore;
use std::time::Duration;

use durable_core::SessionId;
use durable_core::store::{NewCheckpoint, NewSession};
use durable_postgres::testing::test_database;
use durable_postgres::{IndexCheck, PostgresStore, PostgresStoreOptions};
use serde_json::json;
use sqlx::postgres::PgConnectOptions;

fn new_session(id: &str) -> NewSession {
    NewSession {
        id: SessionId::new(id),
        app_version: "v1".into(),
        metadata: json!({}),
        owner: "w1".into(),
        lease_ttl: Duration::from_secs(60),
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

#[tokio::test]
async fn without_the_extension_the_check_says_how_to_install_it() {
    let db = test_database().await;
    let store = db.store().await.expect("store");
    match store.index_check().await.expect("index_check") {
        IndexCheck::Unavailable(why) => assert!(why.contains("CREATE EXTENSION amcheck"), "{why}"),
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

#[tokio::test]
async fn a_role_without_execute_is_told_what_to_grant() {
    let db = test_database().await;
    let store = db.store().await.expect("store");
    let pool = store.pool();
    sqlx::query("CREATE EXTENSION amcheck")
        .execute(pool)
        .await
        .expect("extension");
    // Roles are cluster-wide: one per test database.
    let role = format!("inspector_{}", db.name());
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE ROLE {role} LOGIN PASSWORD 'inspect-only'"
    )))
    .execute(pool)
    .await
    .expect("role");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}"
    )))
    .execute(pool)
    .await
    .expect("grant");
    let options: PgConnectOptions = db.url().parse().expect("url");
    let url = format!(
        "postgres://{role}:inspect-only@{}:{}/{}",
        options.get_host(),
        options.get_port(),
        options.get_database().expect("database")
    );
    let inspector = PostgresStore::connect_with(PostgresStoreOptions::new(&url).read_only(true))
        .await
        .expect("read-only open as the inspector");
    match inspector.index_check().await.expect("index_check") {
        IndexCheck::Unavailable(why) => {
            assert!(
                why.contains("GRANT EXECUTE ON FUNCTION public.bt_index_check"),
                "{why}"
            )
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    inspector.pool().close().await;
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP OWNED BY {role}")))
        .execute(pool)
        .await
        .expect("drop owned");
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP ROLE {role}")))
        .execute(pool)
        .await
        .expect("drop role");
}

#[tokio::test]
async fn a_sound_store_passes_and_an_index_missing_rows_is_reported() {
    let db = test_database().await;
    let store = db.store().await.expect("store");
    let pool = store.pool();
    sqlx::query("CREATE EXTENSION amcheck")
        .execute(pool)
        .await
        .expect("extension");
    store
        .create_session(new_session("s-1"))
        .await
        .expect("create");

    let IndexCheck::Checked { indexes, problems } = store.index_check().await.expect("check")
    else {
        panic!("amcheck is installed and we are superuser");
    };
    assert!(indexes >= 4, "the store's tables have indexes: {indexes}");
    assert!(problems.is_empty(), "{problems:?}");

    // Behind PostgreSQL's back: stop maintaining an index of the sessions, insert, then
    // mark it ready again. The index now misses a row of its table.
    let index = "durable_sessions_status_updated";
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE pg_index SET indisready = false WHERE indexrelid = '{index}'::regclass"
    )))
    .execute(pool)
    .await
    .expect("unready");
    store
        .create_session(new_session("s-2"))
        .await
        .expect("create");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE pg_index SET indisready = true WHERE indexrelid = '{index}'::regclass"
    )))
    .execute(pool)
    .await
    .expect("ready");

    let IndexCheck::Checked { problems, .. } = store.index_check().await.expect("check") else {
        panic!("amcheck ran before");
    };
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].starts_with(&format!("{index}: ")),
        "{problems:?}"
    );
}
