#![cfg_attr(docsrs, feature(doc_cfg))]
//! The PostgreSQL [`CheckpointStore`](durable_core::CheckpointStore) of `durable`: many
//! workers on many machines share one database.
//!
//! ```no_run
//! # async fn demo() -> Result<(), durable_core::StoreError> {
//! use durable_postgres::{PostgresStore, PostgresStoreOptions};
//!
//! let store = PostgresStore::connect("postgres://app@127.0.0.1/app").await?;
//! // or, with pool settings:
//! let store = PostgresStore::connect_with(
//!     PostgresStoreOptions::new("postgres://app@127.0.0.1/app").max_connections(20),
//! )
//! .await?;
//! # Ok(()) }
//! ```
//!
//! # Schema
//! [`PostgresStore::connect`] applies the embedded migrations ([`migrations`]) and records
//! them in the table `durable_schema_migrations` (never the host application's
//! `_sqlx_migrations`). Many processes may connect at once: sqlx's migrator serializes them
//! with a database-wide advisory lock (`pg_advisory_lock`), taken on a dedicated
//! connection that is closed afterwards, so a failed migration never leaves one of the
//! store's connections holding it. A database whose tracking table holds a version newer than this
//! release knows is refused with [`StoreError::SchemaTooNew`] before anything is changed.
//! All tables are named `durable_*`, so the store can share a database with an
//! application.
//!
//! # Concurrency
//! Leases are decided on the database clock (`clock_timestamp()`), fencing tokens are
//! checked on every fenced write while the session row is locked (a journal write or a
//! checkpoint is one statement that writes only if the session is still as it was read,
//! else a transaction that locks the row first), recovery uses
//! `SELECT … FOR UPDATE SKIP LOCKED`, and checkpoints are compare-and-set under a row
//! lock with the primary key as backstop. The default isolation level (READ COMMITTED)
//! is enough.
//!
//! # Plans
//! The store's connections keep PostgreSQL's default `plan_cache_mode` (`auto`): every
//! write and every read of a call's path is a prepared statement that PostgreSQL plans
//! five times and then runs on its generic plan, planned once per connection. Those
//! statements look each row up by a whole unique key (a `LATERAL … LIMIT 1` or an
//! equality on every column of a unique index), so their generic plan is the right one
//! even when made on tables that were never analyzed. The reads whose best plan depends on
//! a session's size (a step's rows with their neighbours, read once per step; a bounded
//! resume's window and a range of the transcript, through the view `durable_transcript`)
//! are sent unprepared, as the unnamed statement, which is planned for its parameters on
//! every execution (one more round trip: sqlx describes it first). `src/query_plans.rs` checks each statement's plan with `EXPLAIN`, and
//! `tests/plan_guard.rs` that nothing is re-planned per call and that the session row's
//! updates stay HOT.
//!
//! # Durability
//! A journal row must survive a crash once [`issue_call`] returns, so
//! [`durability`](durable_core::store::StoreBase::durability) reads `synchronous_commit`
//! and `fsync` back from a pooled connection, which sees every server-, database-, role-
//! and URL-level setting (`ALTER ROLE app SET synchronous_commit = off` is caught).
//!
//! # TLS
//! This crate enables no TLS implementation: it is meant for a database on a trusted
//! network or loopback. `sslmode=prefer` (the default) then connects in plain text;
//! `sslmode=require` fails. To use TLS, enable one of sqlx's TLS features in your own
//! `Cargo.toml` (for example `sqlx = { version = "0.9", features = ["tls-rustls"] }`);
//! Cargo unifies the features and this store picks them up.
//!
//! [`issue_call`]: durable_core::store::JournalStore::issue_call

// `CheckpointStore` is implemented concept by concept, each trait in the module named
// after its part of the conformance suite: `StoreBase` and `MaintenanceStore` in
// `maintenance`, `SessionStore` in `sessions`, `LeaseStore` in `leases`, `QueueStore` in
// `queues`, `CheckpointLog` in `checkpoints`, `JournalStore` in `journal`,
// `ResolutionStore` in `resolution`, `ApprovalStore` in `approval`.
//
// Every fenced write checks the fencing token while its session row is locked: the
// journal writes and checkpoints first as one statement that writes only if the session
// is as an unlocked read found it (`journal::single_statement`, `checkpoints::single_statement`), else in a
// transaction that locks the row first (`tx::lock_fenced`). Reads are one statement each
// where they can be (one snapshot); the others run in one `REPEATABLE READ` snapshot
// (`tx::begin_snapshot`).
mod approval;
mod budget;
mod checkpoints;
mod error;
mod family;
mod journal;
mod keys;
mod leases;
mod limiter;
mod maintenance;
mod notify;
mod open;
#[cfg(all(test, feature = "testing"))]
mod query_plans;
mod queues;
mod resolution;
mod rows;
mod seal;
mod sessions;
mod signals;
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing;
mod tx;
mod witness;

use std::sync::Arc;
use std::time::Duration;

use durable_core::StoreError;
use durable_core::integrity::Keyring;
use sqlx::Row;
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

use crate::error::{BACKEND, db};

use durable_core::redact::redact_url;
pub use maintenance::IndexCheck;
pub use witness::PlacementReport;

/// The table that records applied migrations.
pub const MIGRATIONS_TABLE: &str = "durable_schema_migrations";

/// The embedded schema migrations, tracked in [`MIGRATIONS_TABLE`].
///
/// [`PostgresStore::connect`] runs them; call this to inspect them or to run them from
/// your own deployment tooling (`migrations().run(&pool)`).
pub fn migrations() -> Migrator {
    let mut migrator = sqlx::migrate!("./migrations");
    migrator.dangerous_set_table_name(MIGRATIONS_TABLE);
    migrator
}

/// The newest schema version this release knows.
fn newest_migration(migrator: &Migrator) -> i64 {
    migrator.iter().map(|m| m.version).max().unwrap_or(0)
}

/// How to connect a [`PostgresStore`].
///
/// Start from [`new`](Self::new) and set what differs with the builder methods (or by
/// assigning a field): the struct is `#[non_exhaustive]`, so a later release may add a
/// field without breaking a caller.
///
/// Its `Debug` output shows the URL without its password ([`redact_url`]).
#[derive(Clone)]
#[non_exhaustive]
pub struct PostgresStoreOptions {
    /// A `postgres://` URL (see sqlx's `PgConnectOptions` for the parameters). Reserved
    /// characters in the user name or password (`/ ? @ # :`) must be percent-encoded.
    pub url: String,
    /// Most connections the pool opens (default 10).
    pub max_connections: u32,
    /// Connections kept open when idle (default 0).
    pub min_connections: u32,
    /// How long to wait for a free connection before failing (default 30 s).
    pub acquire_timeout: Duration,
    /// The `application_name` shown in `pg_stat_activity` (default `durable`).
    pub application_name: String,
    /// The keys rows are sealed with (see [`durable_core::integrity`]). `None` (the
    /// default): [`Keyring::from_env`], the application key in `DURABLE_MAC_KEY` if set,
    /// else the store's own random key.
    pub keyring: Option<Keyring>,
    /// How long connecting may take before the open fails with an error naming the host
    /// and port (default 10 s): a server that is down fails fast instead of after the
    /// pool's retries.
    pub connect_timeout: Duration,
    /// Open for inspection only (default `false`): see [`read_only`](Self::read_only).
    pub read_only: bool,
    /// Hear other processes' work notifications (default `true`): see
    /// [`listen`](Self::listen).
    pub listen: bool,
}

impl std::fmt::Debug for PostgresStoreOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStoreOptions")
            .field("url", &redact_url(&self.url))
            .field("max_connections", &self.max_connections)
            .field("min_connections", &self.min_connections)
            .field("acquire_timeout", &self.acquire_timeout)
            .field("application_name", &self.application_name)
            .field("keyring", &self.keyring)
            .field("connect_timeout", &self.connect_timeout)
            .field("read_only", &self.read_only)
            .field("listen", &self.listen)
            .finish()
    }
}

impl PostgresStoreOptions {
    /// Default options for `url`.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            max_connections: 10,
            min_connections: 0,
            acquire_timeout: Duration::from_secs(30),
            application_name: "durable".to_owned(),
            keyring: None,
            connect_timeout: Duration::from_secs(10),
            read_only: false,
            listen: true,
        }
    }

    /// Most connections the pool opens (default 10).
    pub fn max_connections(mut self, max: u32) -> Self {
        self.max_connections = max;
        self
    }

    /// Connections kept open when idle (default 0).
    pub fn min_connections(mut self, min: u32) -> Self {
        self.min_connections = min;
        self
    }

    /// How long to wait for a free connection before failing (default 30 s).
    pub fn acquire_timeout(mut self, timeout: Duration) -> Self {
        self.acquire_timeout = timeout;
        self
    }

    /// The `application_name` shown in `pg_stat_activity` (default `durable`).
    pub fn application_name(mut self, name: impl Into<String>) -> Self {
        self.application_name = name.into();
        self
    }

    /// How long connecting may take (default 10 s); see
    /// [`connect_timeout`](Self#structfield.connect_timeout).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Opens the store for inspection only (default `false`): no migration runs, a
    /// database without the durable schema is refused with [`StoreError::NotAStore`] and
    /// one of another schema version with [`StoreError::SchemaTooOld`] /
    /// [`StoreError::SchemaTooNew`]; every connection runs with
    /// `default_transaction_read_only = on`, so every write fails with
    /// [`StoreError::ReadOnly`].
    pub fn read_only(mut self, read_only: bool) -> Self {
        self.read_only = read_only;
        self
    }

    /// Whether idle worker pools on this store hear the work that other processes make
    /// available (default `true`): with it, the first pool started on the store opens one
    /// more connection, outside the pool, that `LISTEN`s for the `NOTIFY` every store
    /// sends when a session becomes claimable (see [`PostgresStore`]). Turn it off where
    /// `LISTEN` cannot work, such as behind a connection pooler in transaction mode; the
    /// pools then wake on this process's own writes and on their poll interval only.
    /// A read-only store never listens.
    pub fn listen(mut self, listen: bool) -> Self {
        self.listen = listen;
        self
    }

    /// Seals rows with `keyring` (see [`durable_core::integrity`]).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use durable_core::integrity::Keyring;
    /// use durable_postgres::{PostgresStore, PostgresStoreOptions};
    ///
    /// let key = std::fs::read("/run/secrets/durable-mac-key")?;
    /// let store = PostgresStore::connect_with(
    ///     PostgresStoreOptions::new("postgres://app@127.0.0.1/app")
    ///         .keyring(Keyring::with_app_key(key)?),
    /// )
    /// .await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn keyring(mut self, keyring: Keyring) -> Self {
        self.keyring = Some(keyring);
        self
    }
}

/// A [`CheckpointStore`](durable_core::CheckpointStore) on PostgreSQL.
///
/// Cheap to clone: clones share one connection pool.
///
/// # Waking idle worker pools
/// A worker pool with nothing to claim waits for its poll interval or for the store's
/// [`work_events`](durable_core::store::QueueStore::work_events), whichever comes first.
/// Every write that can make a session claimable (a session created, a lease released, a
/// session completed, failed, parked or set awaiting approval, the last approval it
/// waited for decided, an in-doubt call resolved, a session unparked or woken, a queue
/// limit changed) sends `NOTIFY durable_work` in its own transaction, so the notification
/// is delivered when the write commits (never if it rolls back), and it costs no
/// round trip of its own. The journal and checkpoint writes never notify: `NOTIFY`
/// serializes the commits that send it.
///
/// The first [`work_events`](durable_core::store::QueueStore::work_events) call made inside
/// a tokio runtime (a pool's start) starts one task per store, shared by its clones: it
/// opens one connection of its own with the store's connect options (outside the pool,
/// which it never takes a connection from), runs `LISTEN durable_work`, and passes every
/// notification on to the store's pools, whichever process or machine sent it. When the
/// connection fails it connects again (100 ms, doubling up to 1 s between attempts) and
/// then wakes the pools once, since a notification sent meanwhile was lost. The task is
/// aborted, and its connection closed, when the last clone of the store is dropped.
/// Without a runtime at hand, and on a read-only store or one opened with
/// [`listen(false)`](PostgresStoreOptions::listen), pools hear this process's own writes
/// only. Notifications are a speed-up: pools poll as well, so a lost one costs at most a
/// poll interval.
#[derive(Debug, Clone)]
pub struct PostgresStore {
    pool: PgPool,
    /// The keys rows are sealed and checked with, the store's own key bound.
    keyring: Arc<Keyring>,
    /// Tells idle worker pools that work may be available: this process's writes, and
    /// (listening) every store's on the database.
    listener: Arc<notify::Listener>,
}

impl PostgresStore {
    /// Tells this process's idle pools that a write made work available (at once: the
    /// `NOTIFY` of the write reaches them a little later through the listener).
    pub(crate) fn work_available(&self) {
        self.listener.notify();
    }

    /// A subscription to the store's work events (see [`PostgresStore`]).
    pub(crate) fn work_subscribe(&self) -> durable_core::store::WorkEvents {
        self.listener.subscribe()
    }

    /// Connects to `url` with default pool settings and brings the schema up to date.
    ///
    /// For inspection, open it read-only instead:
    /// `connect_with(PostgresStoreOptions::new(url).read_only(true))`.
    ///
    /// # Errors
    /// [`StoreError::Database`] when the server cannot be reached or a migration fails;
    /// [`StoreError::SchemaTooNew`] when a newer release of `durable` migrated the
    /// database.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::connect_with(PostgresStoreOptions::new(url)).await
    }

    /// Connects with explicit options and brings the schema up to date (or, with
    /// [`read_only`](PostgresStoreOptions::read_only), checks it).
    ///
    /// # Errors
    /// As [`connect`](Self::connect); also when `options.url` does not parse, and when no
    /// connection is made within [`connect_timeout`](PostgresStoreOptions::connect_timeout)
    /// (the error names host and port).
    pub async fn connect_with(options: PostgresStoreOptions) -> Result<Self, StoreError> {
        let connect: PgConnectOptions = options
            .url
            .parse()
            .map_err(|e| open::bad_url(&options.url, e))?;
        let mut connect = connect.application_name(&options.application_name);
        if options.read_only {
            connect = connect.options([("default_transaction_read_only", "on")]);
        }
        // A read-only store never claims: nothing to listen for.
        let listen = (options.listen && !options.read_only).then(|| connect.clone());
        let keyring = resolve_keyring(options.keyring)?;
        let keyring = if options.read_only {
            let location = redact_url(&options.url);
            open::check_read_only(&connect, options.connect_timeout, &location, keyring).await?
        } else {
            setup(&connect, options.connect_timeout, keyring).await?
        };
        // No liveness ping before each acquire: it is a round trip of its own on every
        // journal write. A connection the server dropped while idle fails its first
        // statement instead, and nothing has happened yet: a `BEGIN` (`tx::begin`) and the
        // one-statement journal reads (`tx::read`) are retried on another connection; other
        // one-statement reads report a database error, which changed nothing. The pool
        // checks each connection when it is released, and closes a broken one.
        let pool = PgPoolOptions::new()
            .test_before_acquire(false)
            .max_connections(options.max_connections)
            .min_connections(options.min_connections)
            .acquire_timeout(options.acquire_timeout)
            .connect_with(connect)
            .await
            .map_err(db)?;
        Ok(Self {
            pool,
            keyring: Arc::new(keyring),
            listener: notify::Listener::new(listen),
        })
    }

    /// Uses an existing pool (for example your application's), bringing the schema up to
    /// date first. Rows are sealed with [`Keyring::from_env`].
    ///
    /// The pool's connections are used as they are, as [`connect`](Self::connect) uses its
    /// own: PostgreSQL's default `plan_cache_mode` (`auto`). The store's statements are
    /// written so that their generic plans look every row up by its whole key, and the
    /// reads whose best plan depends on a session's size are sent unprepared (see
    /// [`plans`](crate#plans)). A `plan_cache_mode = force_custom_plan` of yours re-plans
    /// every write (hundreds of µs of server CPU per call): leave it at `auto`.
    ///
    /// # Errors
    /// As [`connect`](Self::connect).
    pub async fn from_pool(pool: PgPool) -> Result<Self, StoreError> {
        let keyring = setup(
            &pool.connect_options(),
            pool.options().get_acquire_timeout(),
            resolve_keyring(None)?,
        )
        .await?;
        // The listener connects as the pool does, on a connection of its own.
        let listen = Some((*pool.connect_options()).clone());
        Ok(Self {
            pool,
            keyring: Arc::new(keyring),
            listener: notify::Listener::new(listen),
        })
    }

    /// Acknowledges that the store's database was restored or swapped (see
    /// [`StoreError::RolledBack`]: restored from a dump or into another server, recovered
    /// to a point in time, a replica promoted), so that workers can open it again without
    /// running a lost effect a second time. In one transaction: every session that is not
    /// finished is **parked** (no worker resumes it until `durable unpark`), unless
    /// `intact` states that nothing was lost (the operator's word, e.g. a planned
    /// switchover with synchronous replication); the decision is audited in
    /// `durable_integrity_log`; the new place is recorded. Stop every worker first.
    ///
    /// Returns what changed (empty when nothing did: then nothing is parked).
    pub async fn acknowledge_rollback(
        options: PostgresStoreOptions,
        by: &str,
        intact: bool,
    ) -> Result<PlacementReport, StoreError> {
        durable_core::validate::validate_owner(by)?;
        let connect: PgConnectOptions = options
            .url
            .parse()
            .map_err(|e| open::bad_url(&options.url, e))?;
        let location = redact_url(&options.url);
        let pool = open::setup_pool(&connect, options.connect_timeout).await?;
        let result = async {
            let mut tx = pool.begin().await.map_err(db)?;
            sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended('durable setup_keys', 0))")
                .execute(&mut *tx)
                .await
                .map_err(db)?;
            let report = witness::check(&mut tx, &location, true).await?;
            if report.rolled_back() {
                let now = tx::now(&mut tx).await?;
                let parked = if intact {
                    0
                } else {
                    sqlx::query(
                        "UPDATE durable_sessions SET status = 'parked', status_reason = $1,                          lease_owner = NULL, lease_expires_at = NULL, fence = fence + 1,                          updated_at = $2                          WHERE status NOT IN ('completed', 'failed', 'cancelled', 'parked')",
                    )
                    .bind(
                        "rolled back: the database was restored or swapped, so the effects of                          writes acknowledged before the switch are unknown; check them, then                          `durable unpark`",
                    )
                    .bind(now)
                    .execute(&mut *tx)
                    .await
                    .map_err(db)?
                    .rows_affected()
                };
                let detail = format!(
                    "rollback acknowledged by `{by}`: {}; {}",
                    report.changes.join("; "),
                    if intact {
                        "the operator stated nothing was lost".to_owned()
                    } else {
                        format!("{parked} unfinished session(s) parked")
                    }
                );
                // The store's keys, as a writer binds them, to seal the audit event.
                let ring = keys::setup_keys_in(&mut tx, resolve_keyring(options.keyring.clone())?, false)
                    .await?;
                keys::append_log(
                    &mut tx,
                    &ring,
                    "rollback",
                    "placement",
                    i64::try_from(parked).unwrap_or(i64::MAX),
                    &detail,
                    now,
                )
                .await?;
                tracing::warn!(by, parked, "rollback acknowledged");
            }
            tx.commit().await.map_err(db)?;
            Ok(report)
        }
        .await;
        pool.close().await;
        result
    }

    /// Whether the database is where the store last ran (see
    /// [`acknowledge_rollback`](Self::acknowledge_rollback)); reads only, so it works on a
    /// read-only store (`durable verify`).
    pub async fn placement_report(&self) -> Result<PlacementReport, StoreError> {
        let mut conn = self.conn().await?;
        witness::inspect(&mut conn).await
    }

    /// The connection pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Takes a connection of the pool; a pool that stayed full for its whole acquire
    /// timeout is [`StoreError::Overloaded`].
    pub(crate) async fn conn(
        &self,
    ) -> Result<sqlx::pool::PoolConnection<sqlx::Postgres>, StoreError> {
        self.pool
            .acquire()
            .await
            .map_err(|e| error::pool_error(&self.pool, e))
    }

    pub(crate) fn keyring(&self) -> &Keyring {
        &self.keyring
    }
}

/// The configured key ring, or the one from the environment.
fn resolve_keyring(keyring: Option<Keyring>) -> Result<Keyring, StoreError> {
    match keyring {
        Some(ring) => Ok(ring),
        None => Keyring::from_env().map_err(|e| StoreError::KeyMissing {
            key: durable_core::integrity::MAC_KEY_ENV.to_owned(),
            detail: e.to_string(),
        }),
    }
}

/// The schema version whose migration introduced seals (`0002_seals.sql`).
const SEALS_VERSION: i64 = 2;

/// Refuses a newer schema, applies pending migrations on a dedicated connection, then
/// binds the store's own key into `keyring` and makes sure every row is sealed with its
/// signing key ([`keys::setup_keys_in`]), all in one transaction holding
/// [`keys::SETUP_LOCK`]: "the sealing migration ran in this transaction" is then the
/// witness that the rows predate seals (nothing outside the process can forge it), and
/// no crash can come between the migration and the sealing.
async fn setup(
    options: &PgConnectOptions,
    connect_timeout: Duration,
    keyring: Keyring,
) -> Result<Keyring, StoreError> {
    let migrator = migrations();
    let supported = newest_migration(&migrator);
    // A one-connection pool of its own (not the store's): closing it releases the
    // migrator's session-level advisory lock even when a migration fails half-way, so no
    // pooled connection ever keeps it.
    let pool = open::setup_pool(options, connect_timeout).await?;
    let result = async {
        let mut tx = pool.begin().await.map_err(db)?;
        sqlx::query(keys::SETUP_LOCK)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        let before = applied_version(&mut tx).await?;
        if let Some(found) = before
            && found > supported
        {
            return Err(StoreError::SchemaTooNew {
                backend: BACKEND,
                found,
                supported,
            });
        }
        // Each migration runs in a savepoint of this transaction.
        migrator
            .run_direct(None, &mut *tx, false)
            .await
            .map_err(|e| error::migrate(e, supported))?;
        let migrated_now = before.unwrap_or(0) < SEALS_VERSION;
        let ring = keys::setup_keys_in(&mut tx, keyring, migrated_now).await?;
        // Where the store lives: a restored or swapped database is refused (`witness`).
        witness::check(&mut tx, &open::address(options), false).await?;
        tx.commit().await.map_err(db)?;
        Ok(ring)
    }
    .await;
    pool.close().await;
    result
}

/// The newest version recorded in the tracking table, if the table exists.
async fn applied_version(conn: &mut sqlx::PgConnection) -> Result<Option<i64>, StoreError> {
    let exists: bool = sqlx::query("SELECT to_regclass($1) IS NOT NULL")
        .bind(MIGRATIONS_TABLE)
        .fetch_one(&mut *conn)
        .await
        .map_err(db)?
        .try_get(0)
        .map_err(db)?;
    if !exists {
        return Ok(None);
    }
    sqlx::query("SELECT max(version) FROM durable_schema_migrations")
        .fetch_one(&mut *conn)
        .await
        .map_err(db)?
        .try_get(0)
        .map_err(db)
}
