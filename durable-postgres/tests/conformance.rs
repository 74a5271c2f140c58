//! The shared backend conformance suite (`durable_conformance`) against PostgreSQL:
//! every case gets a fresh database of its own (`DATABASE_URL`'s server, or the throwaway
//! cluster of `durable_postgres::testing`), so cases can run in parallel.

use std::sync::Arc;

use durable_core::CheckpointStore;
use durable_postgres::testing::{TestDatabase, test_database};

/// A store on a fresh database; the database handle rides along as the guard.
async fn make_store() -> (Arc<dyn CheckpointStore>, TestDatabase) {
    let db = test_database().await;
    let store = db
        .store()
        .await
        .expect("connect a PostgresStore to the fresh test database");
    (Arc::new(store), db)
}

durable_conformance::conformance_suite!(make_store);
