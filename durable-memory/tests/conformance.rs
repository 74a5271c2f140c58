//! The backend conformance suite (`durable_conformance`) against the memory store:
//! every case on a fresh store.

use std::sync::Arc;

use durable_core::CheckpointStore;
use durable_memory::{MemoryStore, MemoryStoreOptions};

/// A fresh, empty store that accepts being volatile (the runtime cases run
/// `unsafe_on_replay` tools on it).
async fn make_store() -> Arc<dyn CheckpointStore> {
    Arc::new(
        MemoryStore::open(MemoryStoreOptions::new().accept_volatile(true))
            .expect("open a memory store"),
    )
}

durable_conformance::conformance_suite!(make_store);

/// The tampering cases: rows changed behind the store's back are detected
/// (`StoreError::Tampered`) and no effect runs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tampering_is_detected() {
    let store = MemoryStore::open(MemoryStoreOptions::new().accept_volatile(true))
        .expect("open a memory store");
    let tamperer = store.tamperer();
    durable_conformance::tamper::run_tamper_cases(Arc::new(store), &tamperer).await;
}

/// The same with an application key sealing the rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tampering_is_detected_with_an_application_key() {
    let ring = durable_core::integrity::Keyring::with_app_key(vec![7; 32]).expect("key");
    let store = MemoryStore::open(
        MemoryStoreOptions::new()
            .accept_volatile(true)
            .keyring(ring),
    )
    .expect("open a memory store");
    let tamperer = store.tamperer();
    durable_conformance::tamper::run_tamper_cases(Arc::new(store), &tamperer).await;
}
