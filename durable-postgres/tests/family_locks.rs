//! A cascading cancel of a parent while its children end: the cancel locks the family,
//! and a child's end locks its own row, then its parent's (to wake it). Taken in opposite
//! orders, PostgreSQL breaks the cycle by aborting one of them (`deadlock detected`), and
//! the operator's cancel, or the child's completion, fails for nothing. Every round here
//! must end with each write done or refused for what it is, never a deadlock.

use std::sync::Arc;
use std::time::Duration;

use durable_core::StoreError;
use durable_core::ids::SessionId;
use durable_core::store::{
    CancelSession, CheckpointLog, LeaseStore, NewCheckpoint, NewSession, SessionStatus,
    SessionStore, StoreBase, Wait,
};
use durable_postgres::testing::test_database;
use durable_postgres::{PostgresStore, PostgresStoreOptions};
use serde_json::{Value, json};

const TTL: Duration = Duration::from_secs(600);
const CHILDREN: usize = 6;
const ROUNDS: usize = 12;

fn new_session() -> NewSession {
    NewSession {
        id: SessionId::random(),
        app_version: "v1".into(),
        metadata: json!({}),
        owner: "w".into(),
        lease_ttl: TTL,
        initial: NewCheckpoint {
            messages: vec![],
            plan: json!({}),
            budget: json!({}),
            state: Value::Null,
            wake_at: None,
        },
        queue: None,
    }
}

fn last(state: usize) -> NewCheckpoint {
    NewCheckpoint {
        messages: vec![json!({"done": state})],
        plan: json!({}),
        budget: json!({}),
        state: json!(state),
        wake_at: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cascading_cancel_and_the_childrens_ends_never_deadlock() {
    let db = test_database().await;
    let store = Arc::new(
        PostgresStore::connect_with(PostgresStoreOptions::new(db.url()).max_connections(16))
            .await
            .expect("store"),
    );
    for round in 0..ROUNDS {
        let (parent, parent_lease) = store.create_session(new_session()).await.expect("parent");
        let mut kids = Vec::new();
        for _ in 0..CHILDREN {
            let (kid, lease) = store
                .create_child(&parent.id, new_session())
                .await
                .expect("child");
            kids.push((kid.id, lease));
        }
        let ids: Vec<SessionId> = kids.iter().map(|(id, _)| id.clone()).collect();
        let until = store.now().await.expect("now") + 60_000;
        assert!(
            store
                .wait(parent_lease.fence(), &Wait::children(ids, until))
                .await
                .expect("the parent waits"),
            "the parent waits for its children"
        );
        let mut ends = Vec::new();
        for (n, (_, lease)) in kids.into_iter().enumerate() {
            let store = Arc::clone(&store);
            ends.push(tokio::spawn(async move {
                store
                    .complete_with_checkpoint(lease.fence(), 0, last(n))
                    .await
                    .map(drop)
            }));
        }
        let cancel = {
            let store = Arc::clone(&store);
            let parent = parent.id.clone();
            tokio::spawn(async move {
                store
                    .cancel_session(&CancelSession::new(parent, "ops", "round over"))
                    .await
            })
        };
        for end in ends {
            match end.await.expect("join") {
                Ok(()) | Err(StoreError::LeaseLost { .. }) => {}
                Err(other) => panic!("round {round}: a child's end failed: {other:?}"),
            }
        }
        let cancelled = cancel.await.expect("join");
        if let Err(e) = &cancelled {
            panic!("round {round}: the cascading cancel failed: {e:?}");
        }
        let record = store.session(&parent.id).await.expect("parent");
        assert_eq!(record.status, SessionStatus::Cancelled, "round {round}");
    }
}
