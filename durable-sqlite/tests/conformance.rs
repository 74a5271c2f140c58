//! The backend conformance suite (`durable_conformance`) against SQLite: once on a
//! database file in a temporary directory, once in memory. Every case gets a fresh
//! database.

mod file {
    use std::sync::Arc;

    use durable_core::CheckpointStore;
    use durable_sqlite::SqliteStore;

    /// A fresh database file; the directory is removed after the case.
    async fn make_store() -> (Arc<dyn CheckpointStore>, tempfile::TempDir) {
        let dir = tempfile::tempdir().expect("create a temporary directory");
        let store = SqliteStore::open(dir.path().join("durable.db"))
            .await
            .expect("open a SQLite file store");
        (Arc::new(store), dir)
    }

    durable_conformance::conformance_suite!(make_store);
}

mod memory {
    use std::sync::Arc;

    use durable_core::CheckpointStore;
    use durable_sqlite::SqliteStore;

    /// A fresh in-memory database.
    async fn make_store() -> Arc<dyn CheckpointStore> {
        Arc::new(
            SqliteStore::open_in_memory()
                .await
                .expect("open an in-memory SQLite store"),
        )
    }

    durable_conformance::conformance_suite!(make_store);
}
