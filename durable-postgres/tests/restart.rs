//! The pool does not ping a connection before handing it out: after the server restarts,
//! every idle connection is dead, and the store's next writes and reads must still work
//! (a dead connection fails its `BEGIN` or its one-statement read, which is retried on
//! another). A test binary of its own: restarting the throwaway cluster cuts every
//! connection of this process.

use durable_core::store::{CheckpointLog, JournalStore, SessionStore};
use std::time::Duration;

use durable_core::ids::{CallId, SessionId};
use durable_core::replay::ReplayClass;
use durable_core::store::{
    CallIdentity, CallKind, CallOutcome, FinishCall, NewCall, NewCheckpoint, NewSession,
};
use durable_postgres::testing::test_database;
use durable_postgres::{PostgresStore, PostgresStoreOptions};
use serde_json::{Value, json};

fn call(session: &SessionId, step: i64) -> NewCall {
    NewCall {
        id: CallId::random(),
        kind: CallKind::Tool,
        identity: CallIdentity {
            session: session.clone(),
            step,
            tool: "t".into(),
            input_hash: "h".into(),
            ordinal: 0,
        },
        class: ReplayClass::Pure,
        args: json!({}),
        idempotency_key: None,
        schema_hash: "s".into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_works_on_after_a_server_restart() {
    let db = test_database().await;
    let store = PostgresStore::connect_with(PostgresStoreOptions::new(db.url()).max_connections(4))
        .await
        .expect("store");
    let id = SessionId::random();
    let (_, lease) = store
        .create_session(NewSession {
            id: id.clone(),
            app_version: "v1".into(),
            metadata: json!({}),
            owner: "w".into(),
            lease_ttl: Duration::from_secs(600),
            initial: NewCheckpoint {
                messages: vec![],
                plan: json!({}),
                budget: json!({}),
                state: Value::Null,
                wake_at: None,
            },
            queue: None,
        })
        .await
        .expect("create");
    let done = || FinishCall {
        outcome: CallOutcome::Completed(json!(1)),
        spend: None,
    };
    for step in 1..=4 {
        store
            .issue_call(lease.fence(), call(&id, step))
            .await
            .expect("issue");
    }
    // Several connections in the pool (concurrent reads), all idle afterwards.
    let reads = tokio::join!(
        store.load_checkpoint(&id, None),
        store.load_checkpoint(&id, None),
        store.load_checkpoint(&id, None),
        store.load_checkpoint(&id, None),
    );
    assert!(reads.0.is_ok() && reads.1.is_ok() && reads.2.is_ok() && reads.3.is_ok());
    assert!(store.pool().size() > 1, "{}", store.pool().size());
    if let Err(why) = db.restart_server() {
        // Only the throwaway cluster is restarted; on DATABASE_URL's server there is
        // nothing to test.
        eprintln!("skipped: {why}");
        return;
    }
    store
        .record_call(lease.fence(), call(&id, 5), done())
        .await
        .expect("a write after the restart");
    assert_eq!(
        store
            .calls(&id, Some(5))
            .await
            .expect("a read after the restart")
            .len(),
        1
    );
    assert_eq!(store.issued_calls(&id).await.expect("issued").len(), 4);
}
