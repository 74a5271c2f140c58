//! Schema 4 on PostgreSQL: a database written by schema 3 (session heads sealed without
//! their count of issued rows) is upgraded when a writer opens it: each head is checked
//! under the old format, its issued rows counted, and re-sealed with the count; a head or
//! a row changed behind the store's back before the upgrade is refused, never counted.

use durable_core::store::{CheckpointLog, JournalStore, LeaseStore, SessionStore};
use std::sync::Arc;
use std::time::Duration;

use durable_core::integrity::{Head, Keyring};
use durable_core::snapshot::{Budget, Plan};
use durable_core::store::{
    CallIdentity, CallKind, CallOutcome, CallStatus, CheckpointStore, FinishCall, IssueOutcome,
    Lease, NewCall, NewCheckpoint, NewSession,
};
use durable_core::transcript::Message;
use durable_core::{CallId, Durable, DurableError, ReplayClass, SessionId, StoreError};
use durable_postgres::testing::{TestDatabase, test_database};
use durable_postgres::{PostgresStore, PostgresStoreOptions};
use serde_json::{Value, json};
use sqlx::postgres::PgPool;

mod schema_6;
mod schema_7;

async fn open(db: &TestDatabase, ring: Keyring) -> Result<PostgresStore, StoreError> {
    PostgresStore::connect_with(PostgresStoreOptions::new(db.url()).keyring(ring)).await
}

async fn raw(db: &TestDatabase) -> PgPool {
    PgPool::connect(db.url())
        .await
        .expect("raw pool on the test database")
}

fn call(session: &SessionId, step: i64, tool: &str) -> NewCall {
    NewCall {
        id: CallId::random(),
        kind: CallKind::Tool,
        identity: CallIdentity {
            session: session.clone(),
            step,
            tool: tool.into(),
            input_hash: format!("h-{tool}"),
            ordinal: 0,
        },
        class: ReplayClass::UnsafeOnReplay,
        args: json!({ "tool": tool }),
        idempotency_key: None,
        schema_hash: "schema:1".into(),
    }
}

/// A session with a completed call, an in-doubt one and a recorded one, its lease
/// released; returns the session and the in-doubt call.
async fn journal(store: &PostgresStore, name: &str) -> (SessionId, CallId) {
    let id = SessionId::new(name);
    let (_, lease) = store
        .create_session(NewSession {
            id: id.clone(),
            app_version: "v1".into(),
            metadata: json!({}),
            owner: "w".into(),
            lease_ttl: Duration::from_secs(600),
            initial: NewCheckpoint {
                messages: vec![serde_json::to_value(Message::user("hi")).expect("json")],
                plan: serde_json::to_value(Plan::default()).expect("json"),
                budget: serde_json::to_value(Budget::default()).expect("json"),
                state: Value::Null,
                wake_at: None,
            },
            queue: None,
        })
        .await
        .expect("create");
    let done = store
        .issue_call(lease.fence(), call(&id, 1, "pay"))
        .await
        .expect("issue");
    let IssueOutcome::Inserted(done) = done else {
        panic!("a new row");
    };
    let finish = FinishCall {
        outcome: CallOutcome::Completed(json!("paid")),
        spend: None,
    };
    store
        .finish_call(lease.fence(), &done.id, finish.clone(), None)
        .await
        .expect("finish");
    let doubt = store
        .issue_call(lease.fence(), call(&id, 2, "email"))
        .await
        .expect("issue");
    let IssueOutcome::Inserted(doubt) = doubt else {
        panic!("a new row");
    };
    store
        .record_call(lease.fence(), call(&id, 2, "model"), finish)
        .await
        .expect("record");
    release(store, &lease).await;
    (id, doubt.id)
}

async fn release(store: &PostgresStore, lease: &Lease) {
    store.release_lease(lease).await.expect("release");
}

/// Turns the database back into what schema 3 wrote: every head sealed without its count
/// (under the store's own key, as schema 3 sealed it), no `issued_rows` column (nor schema
/// 6's `call_seq` and view: these sessions store no model replies; nor schema 7's session
/// key), and the tracking table at version 3.
async fn back_to_schema_3(pool: &PgPool) {
    schema_6::back_to_schema_6(pool).await;
    let hex: String = sqlx::query_scalar("SELECT value FROM durable_meta WHERE name = 'store_key'")
        .fetch_one(pool)
        .await
        .expect("the store key");
    let ring = Keyring::none().bind_store_key(Keyring::store_key_from_hex(&hex).expect("hex"));
    let heads: Vec<(String, i64, i64, i64, Option<String>)> = sqlx::query_as(
        "SELECT s.id, s.journal_rows, s.latest_version, s.resolutions, \
           (SELECT k.seal FROM durable_checkpoints k WHERE k.session_id = s.id \
            AND k.version = s.latest_version) FROM durable_sessions s",
    )
    .fetch_all(pool)
    .await
    .expect("heads");
    for (id, journal_rows, latest_version, resolutions, checkpoint_seal) in heads {
        let old = Head {
            session: &id,
            journal_rows,
            latest_version,
            checkpoint_seal: checkpoint_seal.as_deref().unwrap_or(""),
            resolutions,
            issued_rows: 0,
            approvals: 0,
        };
        let seal = ring.seal(&old.legacy_fields()).expect("seal");
        sqlx::query("UPDATE durable_sessions SET head = $2 WHERE id = $1")
            .bind(&id)
            .bind(&seal)
            .execute(pool)
            .await
            .expect("an old head");
    }
    let references: i64 = sqlx::query_scalar("SELECT count(call_seq) FROM durable_messages")
        .fetch_one(pool)
        .await
        .expect("references");
    assert_eq!(
        references, 0,
        "schema 6's columns are dropped with nothing in them"
    );
    for sql in [
        "DROP VIEW durable_transcript",
        "ALTER TABLE durable_messages DROP COLUMN call_seq",
        "ALTER TABLE durable_sessions DROP COLUMN issued_rows",
        "DELETE FROM durable_schema_migrations WHERE version >= 4",
    ] {
        sqlx::query(sql).execute(pool).await.expect(sql);
    }
}

async fn issued_rows(pool: &PgPool, id: &SessionId) -> Option<i64> {
    sqlx::query_scalar("SELECT issued_rows FROM durable_sessions WHERE id = $1")
        .bind(id.as_str())
        .fetch_one(pool)
        .await
        .expect("issued_rows")
}

fn ids(rows: &[durable_core::store::CallRecord]) -> Vec<CallId> {
    rows.iter().map(|r| r.id.clone()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_3_database_is_counted_and_resumes() {
    let db = test_database().await;
    let pool = raw(&db).await;
    let store = open(&db, Keyring::none()).await.expect("open");
    let (a, doubt) = journal(&store, "a").await;
    let (b, _) = journal(&store, "b").await;
    store.pool().close().await;
    back_to_schema_3(&pool).await;

    let store = open(&db, Keyring::none()).await.expect("upgrade");
    assert_eq!(issued_rows(&pool, &a).await, Some(1));
    assert_eq!(issued_rows(&pool, &b).await, Some(1));
    assert_eq!(
        ids(&store.issued_calls(&a).await.expect("a")),
        std::slice::from_ref(&doubt)
    );
    let all = store.calls(&a, None).await.expect("a's journal");
    assert_eq!(all.len(), 3);
    assert_eq!(
        all.iter()
            .filter(|c| c.status == CallStatus::Issued)
            .count(),
        1
    );
    let shared: Arc<dyn CheckpointStore> = Arc::new(store.clone());
    let durable = Durable::builder(shared)
        .owner("w2")
        .app_version("v1")
        .build();
    let resumed = durable.resume::<Message>(&a).await.expect("resume");
    assert_eq!(
        resumed
            .report
            .in_doubt
            .iter()
            .map(|c| c.call.id.clone())
            .collect::<Vec<_>>(),
        [doubt]
    );
    drop(resumed);
    // Once: a second open finds nothing to upgrade, and the counts follow new writes.
    store.pool().close().await;
    let store = open(&db, Keyring::none()).await.expect("reopen");
    assert_eq!(store.issued_calls(&b).await.expect("b").len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_3_database_is_counted_when_its_key_changes() {
    let db = test_database().await;
    let pool = raw(&db).await;
    let store = open(&db, Keyring::none()).await.expect("open");
    let (a, doubt) = journal(&store, "a").await;
    store.pool().close().await;
    back_to_schema_3(&pool).await;
    // An application key turned on at the same open: the re-sealing counts the heads.
    let key = Keyring::with_app_key(vec![7; 32]).expect("key");
    let store = open(&db, key).await.expect("upgrade and rekey");
    assert_eq!(issued_rows(&pool, &a).await, Some(1));
    assert_eq!(ids(&store.issued_calls(&a).await.expect("a")), [doubt]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_3_database_tampered_before_the_upgrade_is_refused() {
    // What was changed behind the store's back, before the upgrade.
    let cases: [(&str, &str); 3] = [
        (
            "a head count",
            "UPDATE durable_sessions SET journal_rows = journal_rows - 1 WHERE id = 'a'",
        ),
        (
            "an in-doubt row shown as completed",
            "UPDATE durable_tool_calls SET status = 'completed' WHERE status = 'issued' \
             AND session_id = 'a'",
        ),
        (
            "a completed row shown as issued",
            "UPDATE durable_tool_calls SET status = 'issued' WHERE status = 'completed' \
             AND session_id = 'a' AND tool_name = 'pay'",
        ),
    ];
    for (case, sql) in cases {
        let db = test_database().await;
        let pool = raw(&db).await;
        let store = open(&db, Keyring::none()).await.expect("open");
        let (a, _) = journal(&store, "a").await;
        let (b, b_doubt) = journal(&store, "b").await;
        store.pool().close().await;
        back_to_schema_3(&pool).await;
        let changed = sqlx::query(sql).execute(&pool).await.expect(sql);
        assert_eq!(changed.rows_affected(), 1, "{case}");
        // The store opens; the tampered session alone is refused, and nothing of it was
        // counted or re-sealed.
        let store = open(&db, Keyring::none()).await.expect("open");
        assert_eq!(issued_rows(&pool, &a).await, None, "{case}");
        let refused = |what: &str, result: Result<usize, StoreError>| match result {
            Err(StoreError::Tampered { session, .. }) => assert_eq!(session, a, "{case}: {what}"),
            other => panic!("{case}: {what}: {other:?}"),
        };
        refused(
            "issued_calls",
            store.issued_calls(&a).await.map(|r| r.len()),
        );
        refused("calls", store.calls(&a, None).await.map(|r| r.len()));
        refused("step read", store.calls(&a, Some(2)).await.map(|r| r.len()));
        refused(
            "load_checkpoint",
            store
                .load_checkpoint(&a, None)
                .await
                .map(|c| c.messages.len()),
        );
        let shared: Arc<dyn CheckpointStore> = Arc::new(store.clone());
        let durable = Durable::builder(shared)
            .owner("w2")
            .app_version("v1")
            .build();
        match durable.resume::<Message>(&a).await {
            Err(e) => assert!(
                matches!(e, DurableError::Store(StoreError::Tampered { .. })),
                "{case}: resume: {e}"
            ),
            Ok(_) => panic!("{case}: a session that failed its checks resumed"),
        }
        // The other session was counted.
        assert_eq!(issued_rows(&pool, &b).await, Some(1), "{case}");
        assert_eq!(
            ids(&store.issued_calls(&b).await.expect("b")),
            [b_doubt],
            "{case}"
        );
    }
}
