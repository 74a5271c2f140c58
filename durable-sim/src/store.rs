//! The one place the simulation's store is chosen.

use std::sync::Arc;

use durable_core::{CheckpointStore, StoreError};

/// The store every actor of a run shares (each through a [`Faulty`](crate::Faulty) of its
/// own): SQLite in memory today.
///
/// To run on the in-process memory store instead, return it here. With a store that does
/// no IO and reads its time from tokio's clock, a run becomes exactly reproducible and
/// can run on virtual time (`start_paused`); see the crate docs for what that needs.
pub async fn open() -> Result<Arc<dyn CheckpointStore>, StoreError> {
    Ok(Arc::new(
        durable_sqlite::SqliteStore::open_in_memory().await?,
    ))
}
