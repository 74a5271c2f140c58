//! A given clock: the store's time, and so its leases, follow it and nothing else.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use durable_core::{CheckpointStore, Durable, DurableError, Message, StartOptions, StoreError};
use durable_memory::{MemoryStore, MemoryStoreOptions};

#[tokio::test(flavor = "current_thread")]
async fn leases_expire_when_the_given_clock_says_so_and_not_before() {
    let now = Arc::new(AtomicI64::new(1_000_000));
    let clock = Arc::clone(&now);
    let store: Arc<dyn CheckpointStore> = Arc::new(
        MemoryStore::open(MemoryStoreOptions::new().clock(move || clock.load(Ordering::SeqCst)))
            .expect("open"),
    );
    assert_eq!(store.now().await.expect("now"), 1_000_000);

    let worker = |owner: &str| {
        Durable::builder(Arc::clone(&store))
            .owner(owner)
            .lease_ttl(Duration::from_secs(60))
            .build()
    };
    let session = worker("a")
        .start::<Message>(StartOptions::default())
        .await
        .expect("start");
    let id = session.id().clone();
    drop(session);
    let lease_ends = store.session(&id).await.expect("row").lease_expires_at;
    assert_eq!(
        lease_ends,
        Some(1_060_000),
        "the lease is measured on the given clock"
    );

    // Real time passes, the given clock does not: the lease holds.
    tokio::time::sleep(Duration::from_millis(20)).await;
    match worker("b").resume::<Message>(&id).await {
        Err(DurableError::Store(StoreError::Leased { remaining_ms, .. })) => {
            assert_eq!(remaining_ms, 60_000)
        }
        Err(other) => panic!("expected the lease to hold, got {other}"),
        Ok(_) => panic!("expected the lease to hold, and another worker took the session"),
    }

    // The given clock moves past the lease: another worker takes the session.
    now.store(1_060_001, Ordering::SeqCst);
    let resumed = worker("b")
        .resume::<Message>(&id)
        .await
        .expect("resume after expiry");
    assert_eq!(resumed.session.id(), &id);
    assert_eq!(store.now().await.expect("now"), 1_060_001);
}
