//! A power cut for SQLite, as a test tool: a VFS shim over the default `unix` VFS that
//! keeps track of every write not yet synced and, at a cut, drops or tears them.
//!
//! Killing a process (`SIGKILL`) loses nothing the process handed to the operating
//! system; a power cut loses every write not yet synced, and may tear the last ones
//! between sectors. That is what `synchronous = FULL` exists for. [`PowerCut`] lets a
//! test run the real `SqliteStore` on a simulated disk:
//!
//! 1. [`PowerCut::register`] a VFS under a name, and open the store with it
//!    (`SqliteStoreOptions::vfs`, behind durable-sqlite's `testing` feature);
//! 2. [`arm`](PowerCut::arm) it: the power goes before the n-th write operation (write,
//!    truncation, sync or deletion) from now; from then on every write operation fails
//!    with an `SQLITE_IOERR_*` and changes nothing, as on a dead machine;
//! 3. when the workload has stopped, close every connection and
//!    [`restart`](PowerCut::restart): the disk applies the cut ([`Policy`]) to the files
//!    and the machine is back on, with the files as the cut left them.
//!
//! The model, as in SQLite's own crash tests (`src/test6.c`): what was synced survives;
//! of what was written since, each 512-byte sector independently survives or not; a
//! file that grew may keep or lose its growth, with zeros or garbage where a lost write
//! would have been. Directory entries are not modelled: a file's creation and deletion
//! are durable at once (SQLite deletes a WAL only after syncing what it makes redundant,
//! and a file whose creation is lost reads as an empty one). The real `fsync` is never
//! called: the host does not lose power, the model decides.
//!
//! The shim is the only `unsafe` code in the workspace, in `src/vfs.rs`; this crate is
//! not published.

mod disk;
mod rng;
mod vfs;

use std::sync::Arc;

pub use disk::{CutReport, Policy, SECTOR};
pub use rng::Rng;

use disk::Disk;

/// Why a VFS could not be registered or a cut applied.
#[derive(Debug, thiserror::Error)]
pub enum PowerCutError {
    /// SQLite refused the VFS.
    #[error("cannot register the power-cut VFS `{name}`: {detail}")]
    Register {
        /// The VFS name.
        name: String,
        /// What SQLite or the name said.
        detail: String,
    },
    /// A connection still holds a file open: close the store (every pool) first, or the
    /// cut would be applied under a live connection's cache.
    #[error(
        "{open} file handle(s) still open on the simulated disk; close every connection before `restart`"
    )]
    StillOpen {
        /// How many.
        open: usize,
    },
    /// Reading or writing the real files failed.
    #[error("applying the power cut to the files failed: {0}")]
    Io(#[from] std::io::Error),
}

/// A simulated disk with a power switch, registered with SQLite as a VFS.
///
/// Clones share the disk. Registrations live for the rest of the process (SQLite keeps
/// the VFS); register one per test and give each a distinct name.
#[derive(Debug, Clone)]
pub struct PowerCut {
    name: String,
    disk: Arc<Disk>,
}

impl PowerCut {
    /// Registers a VFS named `name` over the default `unix` VFS (not as the default).
    pub fn register(name: &str) -> Result<Self, PowerCutError> {
        let disk = Arc::new(Disk::new());
        vfs::register(name, Arc::clone(&disk)).map_err(|detail| PowerCutError::Register {
            name: name.to_owned(),
            detail,
        })?;
        Ok(PowerCut {
            name: name.to_owned(),
            disk,
        })
    }

    /// The name to open connections with (`vfs=` / `SqliteConnectOptions::vfs`).
    pub fn vfs_name(&self) -> &str {
        &self.name
    }

    /// The power goes just before the `op`-th write operation (write, truncation, sync or
    /// deletion of a tracked file) from now; `op` counts from 1.
    pub fn arm(&self, op: u64) {
        self.disk.arm(op);
    }

    /// No cut is pending any more (one that happened stays).
    pub fn disarm(&self) {
        self.disk.disarm();
    }

    /// Cuts the power now.
    pub fn cut_now(&self) {
        self.disk.cut_now();
    }

    /// Whether the power is off.
    pub fn is_cut(&self) -> bool {
        self.disk.is_dead()
    }

    /// Write operations counted since the last [`arm`](Self::arm) or restart.
    pub fn ops(&self) -> u64 {
        self.disk.ops()
    }

    /// Handles open on tracked files.
    pub fn open_handles(&self) -> usize {
        self.disk.open_handles()
    }

    /// Cuts the power (if it is still on), applies the cut to every file under `policy`
    /// with `rng` deciding what survives, and turns the machine back on. Every connection
    /// must be closed first ([`PowerCutError::StillOpen`]).
    pub fn restart(&self, policy: Policy, rng: &mut Rng) -> Result<CutReport, PowerCutError> {
        self.disk.cut_now();
        let open = self.disk.open_handles();
        if open > 0 {
            return Err(PowerCutError::StillOpen { open });
        }
        Ok(self.disk.restart(policy, rng)?)
    }
}
