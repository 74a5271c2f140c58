//! `MemoryStore`: a [`CheckpointStore`] held in this process's memory.
//!
//! **Not durable.** Everything it holds is lost when the process ends (or the last clone
//! of the store is dropped); it survives only the "crash" of a session inside the
//! process (a dropped session, a worker task that died). It is for tests, simulations
//! and examples, and the reference a backend author reads: one module per concept
//! (sessions, leases, queues, checkpoints, journal, approvals, maintenance, the same
//! names as the conformance suite's files), each contract point of
//! [`CheckpointStore`] honoured in plain Rust over maps and vectors behind one lock, and
//! sealed with [`durable_core::integrity`] like the SQL backends. It passes the whole
//! conformance suite (`durable_conformance::conformance_suite!`) and the tampering cases.
//!
//! It says what it is: [`durability`](durable_core::store::StoreBase::durability) reports it unsafe,
//! so `unsafe_on_replay` tools refuse to run on it, unless you accept that with
//! [`MemoryStoreOptions::accept_volatile`]. Nothing falls back to it: you construct it by
//! name.
//!
//! ```
//! use std::sync::Arc;
//! use durable_core::{Durable, StartOptions};
//! use durable_core::store::StoreBase;
//! use durable_core::transcript::Message;
//! use durable_memory::{MemoryStore, MemoryStoreOptions};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Honest by default: not durable, so unsafe tools would be refused.
//! let store = MemoryStore::new()?;
//! assert!(store.durability().await?.unsafe_setting.is_some());
//!
//! // For a test, accept that nothing survives the process.
//! let store = MemoryStore::open(MemoryStoreOptions::new().accept_volatile(true))?;
//! let durable = Durable::builder(Arc::new(store)).owner("worker-1").build();
//! let session = durable.start::<Message>(StartOptions::default()).await?;
//! assert_eq!(session.version(), 0);
//! # Ok(()) }
//! ```
//!
//! Leases, wake-up times and approval deadlines are all measured on the store's own
//! clock ([`now`](durable_core::store::StoreBase::now)): the wall clock read once when the store was opened,
//! advanced by this process's monotonic clock, so it never jumps or runs backwards. A
//! simulation that drives time itself gives the store its clock instead
//! ([`MemoryStoreOptions::clock`]): every lease, `updated_at`, wake-up time and approval
//! deadline is then read from it.
//!
//! [`CheckpointStore`]: durable_core::CheckpointStore

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use durable_core::StoreError;
use durable_core::integrity::Keyring;
use durable_core::store::WorkNotifier;

mod approvals;
mod budget;
mod checkpoints;
mod family;
mod journal;
mod leases;
mod limiter;
mod maintenance;
mod queues;
mod seal;
mod sessions;
mod signals;
mod state;
mod store;
#[cfg(feature = "testing")]
pub mod tamper;

use state::State;

/// The backend name in errors and logs.
pub const BACKEND: &str = "memory";

/// What [`durability`](durable_core::store::StoreBase::durability) reports unless
/// volatility is accepted.
pub const NOT_DURABLE: &str = "in-memory store (everything is lost when the process ends)";

/// Options of a [`MemoryStore`].
#[derive(Clone, Default)]
pub struct MemoryStoreOptions {
    keyring: Option<Keyring>,
    accept_volatile: bool,
    clock: Option<Clock>,
}

/// A clock the store reads its time from, in milliseconds since the Unix epoch
/// ([`MemoryStoreOptions::clock`]).
pub type Clock = Arc<dyn Fn() -> i64 + Send + Sync>;

impl fmt::Debug for MemoryStoreOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStoreOptions")
            .field("keyring", &self.keyring)
            .field("accept_volatile", &self.accept_volatile)
            .field("clock", &self.clock.as_ref().map(|_| "custom"))
            .finish()
    }
}

impl MemoryStoreOptions {
    /// The defaults: the store seals with a random key of its own, and reports itself
    /// not durable.
    pub fn new() -> Self {
        Self::default()
    }

    /// Report the store durable anyway, so that `unsafe_on_replay` tools run on it.
    /// Meant for tests and simulations: nothing survives the process, so there is no
    /// later process whose resume could repeat an effect, and the store does survive a
    /// session dropped mid-call inside the process.
    pub fn accept_volatile(mut self, accept: bool) -> Self {
        self.accept_volatile = accept;
        self
    }

    /// The keys rows are sealed with (an application key, say); the store binds a random
    /// key of its own to it for digests of secret arguments.
    pub fn keyring(mut self, keyring: Keyring) -> Self {
        self.keyring = Some(keyring);
        self
    }

    /// Read the store's time (ms since the Unix epoch) from `clock` instead of the wall
    /// clock: leases, `updated_at`, wake-up times and approval deadlines all follow it.
    /// Meant for simulations that drive time themselves (a paused tokio clock, say); the
    /// clock must never run backwards.
    pub fn clock(mut self, clock: impl Fn() -> i64 + Send + Sync + 'static) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }
}

/// Where the store's time comes from.
enum Time {
    /// The wall clock (ms) at open, and the instant it was read.
    Wall(i64, Instant),
    /// A clock given in the options.
    Given(Clock),
}

/// A [`CheckpointStore`](durable_core::CheckpointStore) in this process's memory: see the [crate docs](crate).
///
/// Cloning it is cheap and shares the data.
#[derive(Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

struct Inner {
    /// Everything the store holds, behind one lock: every method takes it once, checks,
    /// then writes, and never holds it across an `.await`.
    state: Mutex<State>,
    keyring: Keyring,
    /// Where the store's time comes from.
    time: Time,
    accept_volatile: bool,
    work: WorkNotifier,
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("keyring", &self.inner.keyring)
            .field("accept_volatile", &self.inner.accept_volatile)
            .finish_non_exhaustive()
    }
}

impl MemoryStore {
    /// An empty store with the default options: sealed with a random key of its own,
    /// reporting itself not durable.
    ///
    /// Fails only when the operating system gives no random bytes for the key.
    pub fn new() -> Result<Self, StoreError> {
        Self::open(MemoryStoreOptions::new())
    }

    /// An empty store with `options`.
    ///
    /// Fails only when the operating system gives no random bytes for the store's key.
    pub fn open(options: MemoryStoreOptions) -> Result<Self, StoreError> {
        let keyring = options
            .keyring
            .unwrap_or_default()
            .bind_store_key(durable_core::integrity::random_key()?);
        let time = match options.clock {
            Some(clock) => Time::Given(clock),
            None => Time::Wall(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
                Instant::now(),
            ),
        };
        Ok(MemoryStore {
            inner: Arc::new(Inner {
                state: Mutex::new(State::default()),
                keyring,
                time,
                accept_volatile: options.accept_volatile,
                work: WorkNotifier::new(),
            }),
        })
    }

    /// The store's clock (ms since the epoch): monotonic, anchored to the wall clock, or
    /// the clock the options gave.
    pub(crate) fn clock(&self) -> i64 {
        match &self.inner.time {
            Time::Wall(wall, at) => {
                let elapsed = i64::try_from(at.elapsed().as_millis()).unwrap_or(i64::MAX);
                wall.saturating_add(elapsed)
            }
            Time::Given(clock) => clock(),
        }
    }

    /// The state, locked. A panic while it was held (a bug) does not wedge the store:
    /// every method checks before it writes, so what it left is consistent.
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn ring(&self) -> &Keyring {
        &self.inner.keyring
    }

    /// Tells idle worker pools that work may be available.
    pub(crate) fn work_available(&self) {
        self.inner.work.notify();
    }
}

/// `ttl` in ms.
pub(crate) fn millis(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
