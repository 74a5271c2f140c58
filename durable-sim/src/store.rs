//! The one place the simulation's store is chosen.

use std::sync::Arc;

use durable_core::{CheckpointStore, StoreError};
use durable_memory::tamper::MemoryTamperer;
use durable_memory::{MemoryStore, MemoryStoreOptions};

/// Which store a run shares between its actors.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Backend {
    /// `durable-memory`'s `MemoryStore`, reading its time from the runtime's (paused)
    /// clock: no IO, no other thread, so a seed gives one run, exactly.
    #[default]
    Memory,
    /// SQLite in memory, on the real clock (`--sqlite`): a real SQL store, whose answers
    /// arrive from sqlx's thread, so runs are not exactly reproducible.
    Sqlite,
}

impl Backend {
    /// Whether runs on this store are on virtual time (tokio's paused clock).
    pub fn virtual_time(self) -> bool {
        self == Backend::Memory
    }
}

/// Milliseconds since the Unix epoch at the start of every memory run (2026-01-01), so
/// that the store's timestamps are the same in every run of a seed.
pub const EPOCH_MS: i64 = 1_767_225_600_000;

/// The store every actor of a run shares (each through a [`Faulty`](crate::Faulty) of its
/// own), and on the memory store what changes its rows behind its back (a row lost, as a
/// lost `-wal` or a restored backup would lose it). Called inside the run's runtime: the
/// memory store's clock is the runtime's, counted from this moment.
pub async fn open(
    backend: Backend,
) -> Result<(Arc<dyn CheckpointStore>, Option<MemoryTamperer>), StoreError> {
    Ok(match backend {
        Backend::Memory => {
            let start = tokio::time::Instant::now();
            let clock = move || {
                EPOCH_MS
                    .saturating_add(i64::try_from(start.elapsed().as_millis()).unwrap_or(i64::MAX))
            };
            let store = MemoryStore::open(
                MemoryStoreOptions::new()
                    // Nothing outlives the process here, and unsafe tools must run.
                    .accept_volatile(true)
                    .clock(clock),
            )?;
            let tamperer = store.tamperer();
            (Arc::new(store), Some(tamperer))
        }
        Backend::Sqlite => (
            Arc::new(durable_sqlite::SqliteStore::open_in_memory().await?),
            None,
        ),
    })
}
