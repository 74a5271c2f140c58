//! `Session::release` tells the truth: a handle whose lease another worker took over gets
//! `LeaseLost`, not `Ok(())` (the store's release of a stale token is a no-op).
#![cfg(feature = "sqlite")]

use std::sync::Arc;
use std::time::Duration;

use durable::sqlite::SqliteStore;
use durable::{CheckpointStore, Durable, DurableError, SessionId, StartOptions, StoreError};
use serde_json::Value;

#[test]
fn releasing_a_lease_taken_over_is_lease_lost() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("agent.db");
    // One thread: while it sleeps, the first handle's lease renewal cannot run.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let store: Arc<dyn CheckpointStore> = Arc::new(SqliteStore::open(&db).await.expect("open"));
        let first = Durable::builder(store.clone())
            .owner("worker-a")
            .lease_ttl(Duration::from_millis(200))
            .build();
        let id = SessionId::new("taken-over");
        let session = first
            .start::<Value>(StartOptions::new().with_id(id.clone()))
            .await
            .expect("start");
        std::thread::sleep(Duration::from_millis(500));
        let second = Durable::builder(store.clone()).owner("worker-b").build();
        let taken = second
            .resume::<Value>(&id)
            .await
            .expect("take over")
            .session;
        match session.release().await {
            Err(DurableError::Store(StoreError::LeaseLost { session, .. })) => {
                assert_eq!(session, id);
            }
            other => panic!("expected LeaseLost, got {other:?}"),
        }
        // The owner that holds it releases it normally.
        taken.release().await.expect("the current owner releases");
    });
}
