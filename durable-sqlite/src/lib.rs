//! The embedded SQLite [`CheckpointStore`](durable_core::CheckpointStore) of `durable`.
//!
//! [`SqliteStore`] keeps sessions, checkpoints and the call journal in one SQLite file.
//! Durability is checked, not assumed: every connection runs in WAL mode with
//! `synchronous = FULL`, `foreign_keys = ON` and a busy timeout, and reads those settings
//! back when it connects; [`SqliteStore::open`] fails with [`StoreError::NotDurable`] when
//! one did not take. Writes run in `BEGIN IMMEDIATE` transactions, so a writer that has
//! to wait for another process waits up to the busy timeout instead of failing.
//!
//! **Leases on one clock.** SQLite has no server whose clock every worker reads, so a
//! lease held by another worker is never judged by comparing wall clocks: a worker may
//! take it only once it has seen the lease's row unchanged (not renewed) for the lease's
//! full duration on its own monotonic clock, and the holder stops starting calls 90% of a
//! duration after it sent its last renewal, on its own monotonic clock. Wall clocks that
//! disagree or jump (per process or per machine) change nothing; clocks must only run at
//! about the same rate. A lease this process did not see being written is taken one
//! duration after the process first looks at it; a released lease at once; the same owner
//! takes its own lease back at once.
//!
//! The schema is created and upgraded by embedded migrations ([`migrations`]) tracked in
//! the table `durable_schema_migrations`. A database written by a newer release of
//! `durable` is refused with [`StoreError::SchemaTooNew`] before anything is touched.
//!
//! # Files
//!
//! A new store file is created with mode `0600` on Unix, and SQLite gives its `-wal` and
//! `-shm` files the same mode; the mode of an existing file is never changed. An existing
//! file is opened only if it is an SQLite database: an empty file, or one that is not
//! SQLite, is refused with [`StoreError::NotAStore`] instead of becoming a fresh store.
//! (An SQLite database of the host application may hold the store's tables beside its own.)
//! A new store's schema is checkpointed into the main file at once, so the `.db` file
//! alone is always a store. Copying or keeping only the `.db` file still loses the writes
//! made since SQLite's last checkpoint, which are in the `-wal`: take an online copy
//! (SQLite's backup API or `VACUUM INTO`), or copy all three files of a closed store.
//!
//! # Read-only
//!
//! [`SqliteStore::open_read_only`] (or [`SqliteStoreOptions::read_only`]) opens the file
//! with `SQLITE_OPEN_READONLY` for inspection: it never creates the file, never migrates,
//! never changes the journal mode, and refuses a file that is missing, empty, not SQLite,
//! without the durable schema, or of another schema version, with one line. Every write
//! through it fails with [`StoreError::ReadOnly`]. A store in WAL mode needs its `-shm`
//! file (or a directory in which SQLite may create it) to be read while a writer runs.
//!
//! ```no_run
//! use std::sync::Arc;
//!
//! use durable_core::{CheckpointStore, StoreError};
//! use durable_sqlite::SqliteStore;
//!
//! # async fn demo() -> Result<(), StoreError> {
//! let store: Arc<dyn CheckpointStore> = Arc::new(SqliteStore::open("agent.db").await?);
//! // WAL + synchronous=FULL were read back: unsafe tools may run on this store.
//! assert_eq!(store.durability().await?.unsafe_setting, None);
//! # Ok(())
//! # }
//! ```
//!
//! # Connections
//!
//! A file store holds two pools: a **writer pool of exactly one connection**, through
//! which every write transaction goes, and a reader pool (4 connections by default) for
//! reads. In WAL mode readers never block the writer nor each other, while SQLite admits
//! one writer at a time anyway: a single writer connection queues this process's writers
//! in the pool (fair, no busy-waiting) and leaves the busy timeout for contention with
//! other processes sharing the file.
//!
//! An operation waits for a connection at most
//! [`acquire_timeout`](SqliteStoreOptions::acquire_timeout) (default 30 s); beyond that
//! it is refused with [`StoreError::Overloaded`] (nothing was done; retry after its
//! `retry_after` hint) instead of queueing without bound.
//!
//! An in-memory store ([`SqliteStore::open_in_memory`]) is a named shared-cache memory
//! database served by a single connection, plus one idle connection that keeps the
//! database alive for as long as the store exists.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use durable_core::StoreError;
use durable_core::integrity::Keyring;
use sqlx::migrate::Migrator;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx::{ConnectOptions, Connection, SqliteConnection, SqlitePool};

// `CheckpointStore` is implemented concept by concept, each trait in the module named
// after its part of the conformance suite: `StoreBase` and `MaintenanceStore` in
// `maintenance`, `SessionStore` in `sessions`, `LeaseStore` in `leases`, `QueueStore` in
// `queues`, `CheckpointLog` in `checkpoints`, `JournalStore` in `journal`,
// `ResolutionStore` in `resolution`, `ApprovalStore` in `approval`.
//
// Every write is one `BEGIN IMMEDIATE` transaction (`tx::WriteTx`) on the writer
// connection (the tables are described in ARCHITECTURE.md). Reads that touch more than
// one statement run in one deferred (snapshot) transaction on a reader connection.
mod approval;
mod budget;
mod checkpoints;
mod clock;
mod error;
mod family;
mod group;
mod journal;
mod keys;
mod leases;
mod limiter;
mod maintenance;
mod open;
mod queues;
mod resolution;
mod rows;
mod seal;
mod sessions;
mod signals;
mod testing;
mod tx;
mod witness;

pub use maintenance::Backup;
pub use witness::{LostCall, RollbackReport};

use error::{BACKEND, db, migrate};

/// The table that records applied schema migrations (never sqlx's `_sqlx_migrations`,
/// which may belong to the host application).
pub const MIGRATIONS_TABLE: &str = "durable_schema_migrations";

/// The embedded schema migrations, tracked in [`MIGRATIONS_TABLE`].
///
/// [`SqliteStore::connect_with`] runs them itself; this is for tooling that wants to
/// inspect them or migrate a database ahead of time.
pub fn migrations() -> Migrator {
    let mut migrator = sqlx::migrate!("./migrations");
    migrator.dangerous_set_table_name(MIGRATIONS_TABLE);
    migrator
}

/// The newest schema version this release knows.
pub fn schema_version() -> i64 {
    migrations().iter().map(|m| m.version).max().unwrap_or(0)
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    File(PathBuf),
    Memory,
}

/// How to open a [`SqliteStore`].
///
/// ```no_run
/// # async fn demo() -> Result<(), durable_core::StoreError> {
/// use std::time::Duration;
/// use durable_sqlite::{SqliteStore, SqliteStoreOptions};
///
/// let store = SqliteStore::connect_with(
///     SqliteStoreOptions::file("agent.db")
///         .busy_timeout(Duration::from_secs(10))
///         .max_readers(8),
/// )
/// .await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SqliteStoreOptions {
    target: Target,
    keyring: Option<Keyring>,
    busy_timeout: Duration,
    max_readers: u32,
    acquire_timeout: Duration,
    accept_volatile: bool,
    create_if_missing: bool,
    read_only: bool,
    witness: witness::OnOpen,
    /// Test-only settings (see the `testing` feature); the defaults otherwise.
    testing: testing::Testing,
}

impl SqliteStoreOptions {
    /// A database file (created if missing, unless [`create_if_missing(false)`](Self::create_if_missing)).
    pub fn file(path: impl AsRef<Path>) -> Self {
        Self::new(Target::File(path.as_ref().to_owned()))
    }

    /// A fresh private in-memory database. Its [`durability`](durable_core::store::StoreBase::durability)
    /// reports it unsafe (unsafe tools refuse to run) unless
    /// [`accept_volatile(true)`](Self::accept_volatile) is set.
    pub fn in_memory() -> Self {
        Self::new(Target::Memory)
    }

    fn new(target: Target) -> Self {
        SqliteStoreOptions {
            target,
            keyring: None,
            busy_timeout: Duration::from_secs(5),
            max_readers: 4,
            acquire_timeout: Duration::from_secs(30),
            accept_volatile: false,
            create_if_missing: true,
            read_only: false,
            witness: witness::OnOpen::Check,
            testing: testing::Testing::default(),
        }
    }

    /// How long a writer waits for another connection's write lock (default 5 s).
    pub fn busy_timeout(mut self, timeout: Duration) -> Self {
        self.busy_timeout = timeout;
        self
    }

    /// Size of the reader pool of a file store (default 4, at least 1). In-memory stores
    /// use one connection for everything.
    pub fn max_readers(mut self, max: u32) -> Self {
        self.max_readers = max.max(1);
        self
    }

    /// How long an operation waits for a connection of a pool (the one writer connection,
    /// or a reader) before it is refused with [`StoreError::Overloaded`] (default 30 s).
    /// Operations of this process queue for the pools fairly; beyond what the pools serve
    /// in this time, the store refuses instead of queueing without bound.
    pub fn acquire_timeout(mut self, timeout: Duration) -> Self {
        self.acquire_timeout = timeout;
        self
    }

    /// For an in-memory store: report it durable anyway. Meant for tests: nothing
    /// survives the process, so there is no crash to be durable against. Has no effect on
    /// file stores, whose WAL and `synchronous = FULL` settings are always verified.
    pub fn accept_volatile(mut self, accept: bool) -> Self {
        self.accept_volatile = accept;
        self
    }

    /// The keys rows are sealed with (see [`durable_core::integrity`]). Default:
    /// [`Keyring::from_env`], the application key in `DURABLE_MAC_KEY` if set, else the
    /// store's own random key.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use durable_core::integrity::Keyring;
    /// use durable_sqlite::{SqliteStore, SqliteStoreOptions};
    ///
    /// let key = std::fs::read("/run/secrets/durable-mac-key")?;
    /// let store = SqliteStore::connect_with(
    ///     SqliteStoreOptions::file("agent.db").keyring(Keyring::with_app_key(key)?),
    /// )
    /// .await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn keyring(mut self, keyring: Keyring) -> Self {
        self.keyring = Some(keyring);
        self
    }

    /// Whether a missing database file is created (default `true`).
    pub fn create_if_missing(mut self, create: bool) -> Self {
        self.create_if_missing = create;
        self
    }

    /// Opens the file read-only, for inspection (default `false`): with
    /// `SQLITE_OPEN_READONLY`, never creating it, never migrating it, never changing its
    /// journal mode. The open fails with [`StoreError::NotAStore`] for a file that does not
    /// exist, is empty, is not SQLite or has no durable schema, with
    /// [`StoreError::SchemaTooOld`] / [`StoreError::SchemaTooNew`] for a schema of another
    /// release; every write fails with [`StoreError::ReadOnly`]. An in-memory store cannot
    /// be opened read-only (it would always be empty).
    pub fn read_only(mut self, read_only: bool) -> Self {
        self.read_only = read_only;
        self
    }
}

/// The schema version whose migration introduced seals (`0002_seals.sql`).
const SEALS_VERSION: i64 = 2;

/// Refuses a newer schema, applies pending migrations, then sets the keys up
/// ([`keys::setup_keys_in`]), all under one `BEGIN IMMEDIATE` so that concurrent openers
/// of one file do it exactly once, and so that "the sealing migration ran in this
/// transaction" (the witness that the rows predate seals, which nothing outside the
/// process can forge) cannot be lost to a crash between the migration and the sealing.
async fn setup_schema(conn: &mut SqliteConnection, ring: Keyring) -> Result<Keyring, StoreError> {
    let migrator = migrations();
    let supported = schema_version();
    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.map_err(db)?;
    let tracked: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?)",
    )
    .bind(MIGRATIONS_TABLE)
    .fetch_one(&mut *tx)
    .await
    .map_err(db)?;
    let mut before = 0;
    if tracked {
        let found: Option<i64> =
            sqlx::query_scalar("SELECT MAX(version) FROM durable_schema_migrations")
                .fetch_one(&mut *tx)
                .await
                .map_err(db)?;
        before = found.unwrap_or(0);
        if let Some(found) = found.filter(|&found| found > supported) {
            // Nothing was written; end the transaction before refusing.
            tx.rollback().await.map_err(db)?;
            return Err(StoreError::SchemaTooNew {
                backend: BACKEND,
                found,
                supported,
            });
        }
    }
    // `run_direct`, not `run`: `run`'s `Acquire<'a>` bound on `&mut SqliteConnection` makes
    // the future of every caller up to `SqliteStore::open` lose `Send` (rust-lang/rust#64552).
    migrator
        .run_direct(None, &mut *tx, false)
        .await
        .map_err(migrate)?;
    let ring = keys::setup_keys_in(&mut tx, ring, before < SEALS_VERSION).await?;
    tx.commit().await.map_err(db)?;
    Ok(ring)
}

/// A [`CheckpointStore`](durable_core::CheckpointStore) on SQLite.
///
/// Cheap to clone: clones share the connection pools. Open it with
/// [`open`](Self::open), [`open_in_memory`](Self::open_in_memory) or
/// [`connect_with`](Self::connect_with).
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

struct Inner {
    /// One connection: every write transaction.
    writer: SqlitePool,
    /// Batches journal writes and checkpoints into shared transactions on `writer`.
    group: group::GroupWriter,
    /// Reads (the same pool as `writer` for in-memory stores).
    reader: SqlitePool,
    location: String,
    in_memory: bool,
    accept_volatile: bool,
    /// Test-only: report the store durable whatever its settings.
    report_durable: bool,
    read_only: bool,
    /// The keys rows are sealed and checked with, the store's own key bound.
    keyring: Keyring,
    /// The rollback witness a file store's writer appends to (`None`: in memory, or
    /// read-only).
    witness: Option<witness::Witness>,
    /// What the open found when it compared the database with its witness.
    rollback: RollbackReport,
    /// Tells this process's idle worker pools that work may be available.
    work: durable_core::store::WorkNotifier,
    /// What this process has seen of the database's leases (see `clock`).
    leases: Arc<clock::LeaseClock>,
    /// Keeps a shared-cache in-memory database alive while the store exists. Dropped
    /// last (fields drop in declaration order).
    _keeper: Option<Mutex<SqliteConnection>>,
}

impl fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteStore")
            .field("location", &self.inner.location)
            .field("in_memory", &self.inner.in_memory)
            .field("accept_volatile", &self.inner.accept_volatile)
            .field("read_only", &self.inner.read_only)
            .field(
                "readers",
                &self.inner.reader.options().get_max_connections(),
            )
            .finish_non_exhaustive()
    }
}

impl SqliteStore {
    /// Opens (creating if missing) the database file at `path` and applies pending
    /// migrations.
    ///
    /// Fails with [`StoreError::NotDurable`] if WAL mode or `synchronous = FULL` does not
    /// take, and with [`StoreError::SchemaTooNew`] if a newer release wrote the file.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::connect_with(SqliteStoreOptions::file(path)).await
    }

    /// Opens the store at `path` read-only, for inspection: see
    /// [`SqliteStoreOptions::read_only`].
    pub async fn open_read_only(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::connect_with(SqliteStoreOptions::file(path).read_only(true)).await
    }

    /// A fresh in-memory store, for tests: nothing survives the process, so there is no
    /// crash to be durable against, and it reports itself durable
    /// ([`accept_volatile`](SqliteStoreOptions::accept_volatile)).
    pub async fn open_in_memory() -> Result<Self, StoreError> {
        Self::connect_with(SqliteStoreOptions::in_memory().accept_volatile(true)).await
    }

    /// Opens a store with explicit options.
    pub async fn connect_with(options: SqliteStoreOptions) -> Result<Self, StoreError> {
        let mut base = SqliteConnectOptions::new()
            .foreign_keys(true)
            .synchronous(options.testing.synchronous)
            .busy_timeout(options.busy_timeout);
        if let Some(vfs) = &options.testing.vfs {
            base = base.vfs(vfs.clone());
        }
        let read_only = options.read_only;
        let mut created = false;
        let (connect, location, in_memory) = match &options.target {
            Target::File(path) if read_only => {
                open::prepare_reader(path)?;
                // No journal mode: a reader never changes it. `query_only` as well as
                // SQLITE_OPEN_READONLY: a read-only connection still accepts
                // `BEGIN IMMEDIATE`, so without it a write would fail only at its first
                // change, after checks that may report something else (`Leased`, …).
                (
                    base.filename(path)
                        .read_only(true)
                        .create_if_missing(false)
                        .pragma("query_only", "ON"),
                    path.display().to_string(),
                    false,
                )
            }
            Target::File(path) => {
                created = open::prepare_writer(path, options.create_if_missing).await?
                    == open::Found::Created;
                (
                    base.filename(path)
                        .create_if_missing(false)
                        .journal_mode(SqliteJournalMode::Wal),
                    path.display().to_string(),
                    false,
                )
            }
            Target::Memory if read_only => {
                return Err(StoreError::NotAStore {
                    location: ":memory:".to_owned(),
                    detail: "an in-memory database cannot be opened read-only: it would be empty"
                        .to_owned(),
                });
            }
            Target::Memory => {
                let name = format!(
                    "file:durable-{}?mode=memory&cache=shared",
                    uuid::Uuid::new_v4()
                );
                (
                    base.filename(&name)
                        .in_memory(true)
                        .shared_cache(true)
                        .create_if_missing(true),
                    name,
                    true,
                )
            }
        };
        let expect = open::Expect {
            // A reader checks what a writer set, but does not require WAL of it.
            wal: !in_memory && !read_only,
            synchronous: testing::synchronous_level(options.testing.synchronous),
            busy_timeout_ms: i64::try_from(options.busy_timeout.as_millis())
                .unwrap_or(i64::MAX)
                .min(i64::from(i32::MAX)),
        };

        // One connection first: verify, refuse a newer schema, migrate. Errors surface
        // here as themselves (a pool would retry a failing `after_connect` until its
        // acquire timeout).
        let mut setup = connect.connect().await.map_err(db)?;
        open::verify(&mut setup, expect).await?;
        let keyring = match options.keyring.clone() {
            Some(ring) => ring,
            None => Keyring::from_env().map_err(|e| StoreError::KeyMissing {
                key: durable_core::integrity::MAC_KEY_ENV.to_owned(),
                detail: e.to_string(),
            })?,
        };
        let keyring = if read_only {
            open::check_schema(&mut setup, &location).await?;
            open::read_only_keys(&mut setup, keyring).await?
        } else {
            setup_schema(&mut setup, keyring).await?
        };
        // The rollback witness (see `witness`): a writer refuses a database that lost
        // acknowledged effects; a reader reports it.
        let (witness, rollback) = match &options.target {
            Target::File(path) if read_only => (None, witness::inspect(&mut setup, path).await?),
            Target::File(path) => {
                let (witness, report) =
                    witness::open(&mut setup, path, created, options.witness).await?;
                (Some(witness), report)
            }
            Target::Memory => (None, RollbackReport::default()),
        };
        if rollback.rolled_back() && read_only {
            tracing::warn!(store = %location, "the store was rolled back (see `durable verify`); a writer refuses to open it until `durable acknowledge-rollback`");
        }
        if created {
            open::checkpoint_truncate(&mut setup).await?;
        }

        // No liveness ping per acquire (a round trip to the connection's worker thread):
        // an embedded connection does not drop like a network one, and a broken one
        // fails its first statement with a typed error all the same.
        let acquire_timeout = options.acquire_timeout;
        let pool_options = move || {
            SqlitePoolOptions::new()
                .test_before_acquire(false)
                .acquire_timeout(acquire_timeout)
                .after_connect(move |conn, _meta| {
                    Box::pin(async move {
                        open::verify(conn, expect)
                            .await
                            .map_err(|e| sqlx::Error::Configuration(Box::new(e)))
                    })
                })
        };
        let writer = pool_options()
            .max_connections(1)
            .connect_with(connect.clone())
            .await
            .map_err(db)?;
        let (reader, keeper) = if in_memory {
            (writer.clone(), Some(Mutex::new(setup)))
        } else {
            setup.close().await.map_err(db)?;
            let reader = pool_options()
                .max_connections(options.max_readers)
                .connect_with(connect)
                .await
                .map_err(db)?;
            (reader, None)
        };
        // Sightings are shared by every store of this process on the same file.
        let clock_key = match &options.target {
            Target::File(path) => std::fs::canonicalize(path)
                .map_or_else(|_| location.clone(), |p| p.display().to_string()),
            Target::Memory => location.clone(),
        };
        Ok(SqliteStore {
            inner: Arc::new(Inner {
                group: group::GroupWriter::spawn(writer.clone()),
                writer,
                reader,
                location,
                in_memory,
                accept_volatile: options.accept_volatile,
                report_durable: options.testing.report_durable,
                read_only,
                keyring,
                witness,
                rollback,
                work: durable_core::store::WorkNotifier::new(),
                leases: clock::LeaseClock::for_location(&clock_key),
                _keeper: keeper,
            }),
        })
    }

    /// The reader pool (for an in-memory store, its only pool). Every connection in it
    /// carries the store's settings, read back when it connected. Use it for
    /// read-only queries of your own; write only through the
    /// [`CheckpointStore`](durable_core::CheckpointStore) methods,
    /// which fence and serialize writes.
    pub fn pool(&self) -> &SqlitePool {
        &self.inner.reader
    }

    /// Whether the store was opened read-only ([`SqliteStoreOptions::read_only`]).
    pub fn is_read_only(&self) -> bool {
        self.inner.read_only
    }

    /// Whether this is an in-memory store.
    pub fn is_in_memory(&self) -> bool {
        self.inner.in_memory
    }

    /// Closes the pools, waiting for checked-out connections to come back. Later calls
    /// fail. Clones share the pools, so this closes them too.
    pub async fn close(&self) {
        self.inner.writer.close().await;
        self.inner.reader.close().await;
    }

    /// What opening the store found when it compared the database with its rollback
    /// witness (see [`acknowledge_rollback`](Self::acknowledge_rollback)). A writer's open
    /// refuses a rollback, so on a writer this is empty unless the store was opened to
    /// acknowledge one; a read-only open reports it here and opens anyway, for inspection.
    pub fn rollback_report(&self) -> &RollbackReport {
        &self.inner.rollback
    }

    /// Acknowledges that the store at `path` was rolled back (a lost `-wal`, a copy of the
    /// `.db` file alone, a restored backup; see [`StoreError::RolledBack`]), so that it can
    /// run again without running a lost effect a second time:
    ///
    /// - every session the witness shows lost calls for is **parked** (no worker resumes
    ///   it until `durable unpark`), with the lost calls named in its status reason; a
    ///   session lost entirely is recreated, empty and parked, so that starting it again
    ///   by id is refused instead of running its effects afresh;
    /// - with no usable witness (the database was moved or restored without it) the store
    ///   cannot know which sessions lost what: every session that is not finished is
    ///   parked, unless `intact` says the copy is complete (the operator's word, audited);
    /// - the decision is audited in `durable_integrity_log` (who, what was lost), and the
    ///   witness is rebuilt from the database as it now is.
    ///
    /// Stop every worker first. Returns what was found.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), durable_core::StoreError> {
    /// let report = durable_sqlite::SqliteStore::acknowledge_rollback("agent.db", "ops@example.com", false).await?;
    /// for lost in &report.lost {
    ///     println!("session {} lost call {} (attempt {})", lost.session, lost.call, lost.attempt);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn acknowledge_rollback(
        path: impl AsRef<Path>,
        by: &str,
        intact: bool,
    ) -> Result<RollbackReport, StoreError> {
        let path = path.as_ref();
        durable_core::validate::validate_owner(by)?;
        let mut options = SqliteStoreOptions::file(path).create_if_missing(false);
        options.witness = witness::OnOpen::Acknowledge;
        let store = Self::connect_with(options).await?;
        let report = store.inner.rollback.clone();
        let result = maintenance::acknowledge_rollback(&store, &report, by, intact).await;
        store.close().await;
        result.map(|()| report)
    }

    /// Appends an effect that may now run to the rollback witness.
    pub(crate) fn witness_call(
        &self,
        record: &durable_core::store::CallRecord,
    ) -> Result<(), StoreError> {
        match &self.inner.witness {
            Some(witness) if record.class != durable_core::ReplayClass::Pure => {
                witness.call(record)
            }
            _ => Ok(()),
        }
    }

    /// Appends a purged session's tombstone to the rollback witness.
    pub(crate) fn witness_purge(
        &self,
        session: &durable_core::SessionId,
    ) -> Result<(), StoreError> {
        match &self.inner.witness {
            Some(witness) => witness.purged(session.as_str()),
            None => Ok(()),
        }
    }

    pub(crate) fn keyring(&self) -> &Keyring {
        &self.inner.keyring
    }

    /// What this process has seen of the database's leases (see `clock`).
    pub(crate) fn leases(&self) -> &clock::LeaseClock {
        &self.inner.leases
    }

    /// Tells this process's idle pools that a write made work available.
    pub(crate) fn work_available(&self) {
        self.inner.work.notify();
    }

    /// A subscription to [`work_available`](Self::work_available).
    pub(crate) fn work_subscribe(&self) -> durable_core::store::WorkEvents {
        self.inner.work.subscribe()
    }

    fn writer(&self) -> &SqlitePool {
        &self.inner.writer
    }

    /// The group commit of the journal's writes and checkpoints.
    fn group(&self) -> &group::GroupWriter {
        &self.inner.group
    }

    fn reader(&self) -> &SqlitePool {
        &self.inner.reader
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_use_our_tracking_table() {
        assert_eq!(migrations().table_name, MIGRATIONS_TABLE);
        assert_eq!(
            schema_version(),
            13,
            "0001_init, 0002_seals, 0003_speed, 0004_issued_rows, 0005_replies_once, \
             0006_approvals, 0007_workers, 0008_lease_ran, 0009_operator_needed, \
             0010_limits, 0011_limit_raises, 0012_children and \
             0013_signals"
        );
    }
}
