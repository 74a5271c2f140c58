//! A restored database must not be trusted: the store records where it lives (cluster,
//! timeline, database and table OIDs) and a writer refuses a database that moved, as a
//! restore moves it. Effects go to a ledger file; a restored copy must never make an email
//! go out twice.

use std::path::Path;
use std::sync::Arc;

use durable_core::{
    CheckpointStore, Durable, DurableError, ReplayClass, SessionId, StartOptions, StoreError,
    ToolSpec,
};
use durable_postgres::testing::test_database;
use durable_postgres::{PostgresStore, PostgresStoreOptions};
use serde_json::{Value, json};
use sqlx::{AssertSqlSafe, Connection, PgConnection};

fn email() -> ToolSpec {
    ToolSpec::new(
        "send_email",
        "Email the customer.",
        ReplayClass::UnsafeOnReplay,
        json!({"type": "object", "properties": {"body": {"type": "string"}}}),
    )
}

fn ledger(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The same server, another database.
fn on_database(url: &str, name: &str) -> String {
    let (base, query) = url.split_at(url.find('?').unwrap_or(url.len()));
    let start = base.find("://").map_or(0, |i| i + 3);
    let path = base[start..].find('/').map_or(base.len(), |i| start + i);
    format!("{}/{name}{query}", &base[..path])
}

enum Run {
    Sent,
    Parked,
}

/// One worker run: opens the store, sends the session's next email up to `upto`.
async fn worker(url: &str, ledger_path: &Path, upto: usize) -> Result<Run, StoreError> {
    let store = PostgresStore::connect(url).await?;
    let durable = Durable::builder(Arc::new(store.clone()) as Arc<dyn CheckpointStore>)
        .owner("worker")
        .app_version("rollback-test")
        .build();
    let options = StartOptions::new().with_id(SessionId::new("onboard-ann"));
    let mut session = match durable.start_or_resume::<Value>(options).await {
        Ok(started) => started.session,
        Err(DurableError::Store(StoreError::NotResumable { status, .. })) if status == "parked" => {
            store.pool().close().await;
            return Ok(Run::Parked);
        }
        Err(e) => panic!("start: {e}"),
    };
    for n in session.messages().len() + 1..=upto {
        let body = format!("email {n}");
        let path = ledger_path.to_owned();
        let sent = session
            .journal()
            .tool(&email(), json!({"body": body}))
            .run(move |_ctx| {
                let (path, body) = (path.clone(), body.clone());
                async move {
                    use std::io::Write;
                    let mut file = std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(&path)
                        .expect("ledger");
                    writeln!(file, "{body}").expect("ledger");
                    Ok::<_, String>(json!({"sent": body}))
                }
            })
            .await
            .expect("send");
        session.push(sent);
        session.checkpoint().await.expect("checkpoint");
    }
    session.release().await.expect("release");
    store.pool().close().await;
    Ok(Run::Sent)
}

async fn admin(url: &str, statements: &[String]) {
    let mut conn = PgConnection::connect(&on_database(url, "postgres"))
        .await
        .expect("admin connection");
    for statement in statements {
        sqlx::query(AssertSqlSafe(statement.clone()))
            .execute(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("{statement}: {e}"));
    }
    let _ = conn.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_database_is_refused_until_acknowledged() {
    let db = test_database().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("ledger");
    assert!(matches!(worker(db.url(), &path, 1).await, Ok(Run::Sent)));

    // The backup: a copy of the database as it is now.
    let backup = format!("{}_backup", db.name());
    admin(
        db.url(),
        &[format!("CREATE DATABASE {backup} TEMPLATE {}", db.name())],
    )
    .await;
    assert!(matches!(worker(db.url(), &path, 2).await, Ok(Run::Sent)));
    assert_eq!(ledger(&path), ["email 1", "email 2"]);

    // Restored in place: the database recreated from the backup.
    admin(
        db.url(),
        &[
            format!("DROP DATABASE {} WITH (FORCE)", db.name()),
            format!("CREATE DATABASE {} TEMPLATE {backup}", db.name()),
        ],
    )
    .await;
    match worker(db.url(), &path, 2).await {
        Err(StoreError::RolledBack { detail, .. }) => {
            assert!(detail.contains("recreated"), "{detail}");
            assert!(detail.contains("acknowledge-rollback"), "{detail}");
        }
        Err(e) => panic!("expected RolledBack, got {e}"),
        Ok(_) => panic!("a restored database was trusted: {:?}", ledger(&path)),
    }
    assert_eq!(ledger(&path), ["email 1", "email 2"]);

    // The backup itself, opened where it is: refused too.
    let elsewhere = on_database(db.url(), &backup);
    assert!(matches!(
        PostgresStore::connect(&elsewhere).await,
        Err(StoreError::RolledBack { .. })
    ));

    let report =
        PostgresStore::acknowledge_rollback(PostgresStoreOptions::new(db.url()), "ops", false)
            .await
            .expect("acknowledge");
    assert!(report.rolled_back());
    assert!(matches!(worker(db.url(), &path, 2).await, Ok(Run::Parked)));
    assert_eq!(ledger(&path), ["email 1", "email 2"]);
    // Acknowledged once: the next open finds nothing new.
    let again =
        PostgresStore::acknowledge_rollback(PostgresStoreOptions::new(db.url()), "ops", false)
            .await
            .expect("acknowledge again");
    assert!(!again.rolled_back());
    let store = PostgresStore::connect(db.url()).await.expect("open");
    let logged: Vec<String> =
        sqlx::query_scalar("SELECT detail FROM durable_integrity_log WHERE event = 'rollback'")
            .fetch_all(store.pool())
            .await
            .expect("log");
    assert_eq!(logged.len(), 1, "{logged:?}");
    assert!(
        logged[0].contains("`ops`") && logged[0].contains("parked"),
        "{logged:?}"
    );
    store.pool().close().await;
    admin(db.url(), &[format!("DROP DATABASE {backup} WITH (FORCE)")]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edited_placement_is_refused() {
    let db = test_database().await;
    let store = PostgresStore::connect(db.url()).await.expect("open");
    sqlx::query("UPDATE durable_meta SET value = 'garbage' WHERE name = 'placement'")
        .execute(store.pool())
        .await
        .expect("edit");
    store.pool().close().await;
    match PostgresStore::connect(db.url()).await {
        Err(StoreError::RolledBack { detail, .. }) => {
            assert!(detail.contains("edited"), "{detail}")
        }
        other => panic!("expected RolledBack, got {other:?}"),
    }
}
