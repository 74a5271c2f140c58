//! The operator's handle, `durable.operator()`, on a real SQLite store: it shares the
//! runtime's store, and the operator's old methods on `Durable` still work (deprecated
//! forwarders, kept for one release).
#![cfg(feature = "sqlite")]

use std::sync::Arc;

use durable::sqlite::SqliteStore;
use durable::{
    CheckpointStore, Durable, DurableError, Operator, SessionId, StartOptions, StoreError,
};
use serde_json::Value;

async fn runtime(dir: &tempfile::TempDir) -> Durable {
    let store: Arc<dyn CheckpointStore> = Arc::new(
        SqliteStore::open(dir.path().join("agent.db"))
            .await
            .expect("open"),
    );
    Durable::builder(store).owner("worker-1").build()
}

fn limit_of(queues: &[durable::store::QueueInfo], name: &str) -> Option<u32> {
    queues
        .iter()
        .find(|q| q.name == name)
        .and_then(|q| q.max_running)
}

#[tokio::test]
async fn the_operator_handle_steers_the_runtimes_store() {
    fn shared<T: Clone + Send + Sync + 'static>() {}
    shared::<Operator>();

    let dir = tempfile::tempdir().expect("tempdir");
    let durable = runtime(&dir).await;
    let operator = durable.operator();
    operator
        .set_queue_limit("email", Some(2))
        .await
        .expect("set a limit");
    // A clone (as a console hands one to each request) sees the same store.
    let queues = operator.clone().queues().await.expect("queues");
    assert_eq!(limit_of(&queues, "email"), Some(2));
    let id = SessionId::new("active-one");
    let session = durable
        .start::<Value>(StartOptions::new().with_id(id.clone()))
        .await
        .expect("start");
    match operator.unpark(&id).await {
        Err(DurableError::Store(StoreError::NotParked { .. })) => {}
        other => panic!("an active session is not unparked, got {other:?}"),
    }
    assert!(operator.in_doubt(None).await.expect("in doubt").is_empty());
    assert!(
        operator
            .approvals(None)
            .await
            .expect("approvals")
            .is_empty()
    );
    session.release().await.expect("release");
}

#[tokio::test]
#[allow(deprecated)]
async fn the_deprecated_methods_on_durable_forward_to_the_operator() {
    let dir = tempfile::tempdir().expect("tempdir");
    let durable = runtime(&dir).await;
    durable
        .set_queue_limit("email", Some(3))
        .await
        .expect("set a limit the old way");
    let queues = durable.operator().queues().await.expect("queues");
    assert_eq!(limit_of(&queues, "email"), Some(3));
    assert_eq!(
        limit_of(&durable.queues().await.expect("queues"), "email"),
        Some(3)
    );
    let id = SessionId::new("active-two");
    let session = durable
        .start::<Value>(StartOptions::new().with_id(id.clone()))
        .await
        .expect("start");
    match durable.unpark(&id).await {
        Err(DurableError::Store(StoreError::NotParked { .. })) => {}
        other => panic!("an active session is not unparked, got {other:?}"),
    }
    assert!(
        durable
            .in_doubt(Some(&id))
            .await
            .expect("in doubt")
            .is_empty()
    );
    assert!(
        durable
            .approvals(Some(&id))
            .await
            .expect("approvals")
            .is_empty()
    );
    assert!(
        durable
            .expire_approvals(None)
            .await
            .expect("expire")
            .is_empty()
    );
    session.release().await.expect("release");
}
