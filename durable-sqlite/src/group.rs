//! Group commit: the journal writes and checkpoints of every session of the process share
//! one transaction and one sync.
//!
//! SQLite has one writer at a time and syncs once per commit, so one commit per journal
//! write caps a process at one sync per write, however many sessions it runs. Here a
//! writer task takes every write queued while the previous batch was committing, runs
//! them one after the other in one `BEGIN IMMEDIATE` transaction, commits once, and only
//! then releases their callers: an *issued* row is still acknowledged only once it is
//! synced. A lone write is a batch of one (no timer, no added latency).
//!
//! Each write is a job: it reads what it needs (the fence, the head) inside the batch's
//! transaction, so it sees the batch's earlier writes, and checks its own fencing token.
//! A write that is refused (a lost lease, a version conflict) has written nothing and
//! fails alone; the statements that write run inside a savepoint, so a write whose
//! statements fail is rolled back alone too. Only a batch that cannot begin or commit (or
//! a savepoint that cannot be rolled back) fails every write in it, and then none of
//! them was written.
//!
//! A write that finds nothing being written runs at once, in its caller's task, as a
//! batch of one; writes that arrive while a batch runs queue for the task's next one.
//!
//! Round trips: a lone write costs what it did before batching, two (its `SELECT`
//! carries the batch's `BEGIN IMMEDIATE`, its writes the `COMMIT`); in a batch of n,
//! each write costs two and the batch one more for its `COMMIT` (none when the last
//! write carries it).
//!
//! The task runs on the runtime that opened the store. If that runtime is gone, each
//! write runs inline as a batch of its own.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use durable_core::StoreError;
use durable_core::integrity::Keyring;
use durable_core::store::Fence;
use sqlx::pool::PoolConnection;
use sqlx::sqlite::{SqliteArguments, SqliteRow};
use sqlx::{Arguments, AssertSqlSafe, Sqlite, SqlitePool};
use tokio::sync::{mpsc, oneshot};

use crate::error::{BACKEND, db};
use crate::rows;
use crate::tx::{self, Fenced};

/// Most writes in one batch (one transaction); more wait for the next.
const MAX_BATCH: usize = 512;

/// A job's statements, borrowing the batch's connection.
pub(crate) type JobFuture<'c> = Pin<Box<dyn Future<Output = Done> + Send + 'c>>;

type Run = Box<dyn for<'c> FnOnce(&'c mut BatchConn) -> JobFuture<'c> + Send>;

/// One queued write.
struct Job {
    /// Runs the write's statements inside the batch's open transaction.
    run: Run,
    /// Tells the caller the batch failed before the write ran.
    fail: Box<dyn FnOnce(StoreError) + Send>,
    /// Whether the caller still waits: a write whose caller was cancelled before its
    /// statements ran does not run them (as a cancelled write on its own connection
    /// would not).
    wanted: Wanted,
}

/// Whether a write's caller still waits for it.
type Wanted = Box<dyn Fn() -> bool + Send + Sync>;

/// How a job ended (the state of the batch's transaction is in its [`BatchConn`]).
pub(crate) struct Done {
    /// Releases the caller once the batch has ended: `None` if it committed, else why
    /// not.
    deliver: Box<dyn FnOnce(Option<StoreError>) + Send>,
}

/// The handle the store keeps: where writes are queued.
#[derive(Debug)]
pub(crate) struct GroupWriter {
    queue: mpsc::UnboundedSender<Job>,
    pool: SqlitePool,
    /// Held by whoever runs a batch: the task, or a caller that found it idle.
    busy: Arc<tokio::sync::Mutex<()>>,
}

impl fmt::Debug for Job {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Job")
    }
}

impl GroupWriter {
    /// Spawns the writer task on the current runtime. It ends when the handle is
    /// dropped.
    pub(crate) fn spawn(pool: SqlitePool) -> Self {
        let (queue, jobs) = mpsc::unbounded_channel();
        let busy = Arc::new(tokio::sync::Mutex::new(()));
        tokio::spawn(run(pool.clone(), jobs, Arc::clone(&busy)));
        GroupWriter { queue, pool, busy }
    }

    /// Queues a write and waits until its batch has ended. `job` runs the write's
    /// statements on the batch's connection and ends with [`Deliver::done`].
    pub(crate) async fn submit<T: Send + 'static>(
        &self,
        job: impl for<'c> FnOnce(&'c mut BatchConn, Deliver<T>) -> JobFuture<'c> + Send + 'static,
    ) -> Result<T, StoreError> {
        let (tx, rx) = oneshot::channel();
        let slot: Slot<T> = Arc::new(Mutex::new(Some(tx)));
        let deliver = Deliver(Arc::clone(&slot));
        let watched = Arc::clone(&slot);
        let job = Job {
            wanted: Box::new(move || {
                watched
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .as_ref()
                    .is_some_and(|tx| !tx.is_closed())
            }),
            run: Box::new(move |conn| job(conn, deliver)),
            fail: Box::new(move |error| {
                if let Some(tx) = take(&slot) {
                    let _ = tx.send(Err(error));
                }
            }),
        };
        if let Ok(_idle) = self.busy.try_lock() {
            // Nothing is being written: this write is a batch of its own, run here rather
            // than handed to the task (on a multi-threaded runtime, another thread).
            batch(&self.pool, vec![job]).await;
        } else if let Err(mpsc::error::SendError(job)) = self.queue.send(job) {
            // The writer task is gone (its runtime shut down): a batch of its own, here.
            let _busy = self.busy.lock().await;
            batch(&self.pool, vec![job]).await;
        }
        rx.await.unwrap_or_else(|_| {
            // The task stopped with this write in its batch: whether it committed is
            // unknown.
            Err(StoreError::database(BACKEND, sqlx::Error::WorkerCrashed))
        })
    }
}

fn take<T>(slot: &Mutex<Option<T>>) -> Option<T> {
    slot.lock().unwrap_or_else(|p| p.into_inner()).take()
}

/// Where a job's result goes.
pub(crate) struct Deliver<T>(Slot<T>);

/// Where a write's result is sent, once (by its job or by a batch that could not run it).
type Slot<T> = Arc<Mutex<Option<oneshot::Sender<Result<T, StoreError>>>>>;

impl<T: Send + 'static> Deliver<T> {
    /// The job ended with `result`. A refused write (`Err`) has written nothing, and
    /// neither has one whose statements were rolled back to its savepoint; an `Ok`
    /// write's statements stand. The caller gets `result` once the batch has committed,
    /// or the batch's error.
    pub(crate) fn done(self, result: Result<T, StoreError>) -> Done {
        Done {
            deliver: Box::new(move |batch_error| {
                let result = match (result, batch_error) {
                    (Err(e), _) => Err(e),
                    (Ok(_), Some(e)) => Err(e),
                    (Ok(value), None) => Ok(value),
                };
                if let Some(tx) = take(&self.0) {
                    // The caller may have stopped waiting; nothing to do then.
                    let _ = tx.send(result);
                }
            }),
        }
    }
}

/// The writer task: a batch of whatever is queued, until every handle is dropped.
async fn run(
    pool: SqlitePool,
    mut jobs: mpsc::UnboundedReceiver<Job>,
    busy: Arc<tokio::sync::Mutex<()>>,
) {
    while let Some(first) = jobs.recv().await {
        let _busy = busy.lock().await;
        let mut next = vec![first];
        while next.len() < MAX_BATCH {
            match jobs.try_recv() {
                Ok(job) => next.push(job),
                Err(_) => break,
            }
        }
        batch(&pool, next).await;
    }
}

/// Runs `jobs` in one transaction and releases each caller after it ends.
async fn batch(pool: &SqlitePool, jobs: Vec<Job>) {
    let mut pending = jobs;
    while !pending.is_empty() {
        pending = batch_once(pool, pending).await;
    }
}

/// One transaction: returns the jobs left for another (after one whose transaction state
/// became unknown).
async fn batch_once(pool: &SqlitePool, jobs: Vec<Job>) -> Vec<Job> {
    let conn = match pool.acquire().await {
        Ok(conn) => conn,
        Err(error) => {
            let shared = Shared::new(crate::error::pool_error(
                pool,
                crate::error::Pool::Writer,
                error,
            ));
            jobs.into_iter().for_each(|job| (job.fail)(shared.error()));
            return Vec::new();
        }
    };
    let mut batch = BatchConn {
        conn,
        state: TxState::Idle,
        last: false,
        wanted: Box::new(|| true),
    };
    let count = jobs.len();
    let mut delivers = Vec::with_capacity(count);
    let mut jobs = jobs.into_iter().enumerate();
    for (i, job) in jobs.by_ref() {
        batch.last = i + 1 == count;
        batch.wanted = job.wanted;
        let done = (job.run)(&mut batch).await;
        delivers.push(done.deliver);
        if batch.state == TxState::Unknown {
            break;
        }
    }
    let ended = match batch.state {
        // Nothing began (every write was refused before its statements): nothing to end.
        TxState::Idle | TxState::Committed => Ok(()),
        TxState::Open => batch.commit().await,
        TxState::Unknown => {
            let began = batch.rollback().await;
            let error = Shared::new(StoreError::database(
                BACKEND,
                sqlx::Error::Protocol(
                    "a write of the batch failed where its transaction could not be kept; \
                     the batch was rolled back"
                        .into(),
                ),
            ));
            delivers
                .into_iter()
                .for_each(|deliver| deliver(Some(error.error())));
            let rest: Vec<Job> = jobs.map(|(_, job)| job).collect();
            if !began {
                // `BEGIN IMMEDIATE` itself failed (the database stayed locked past the
                // busy timeout): the rest would wait as long, so they fail too.
                rest.into_iter().for_each(|job| (job.fail)(error.error()));
                return Vec::new();
            }
            return rest;
        }
    };
    match ended {
        Ok(()) => delivers.into_iter().for_each(|deliver| deliver(None)),
        Err(error) => {
            let shared = Shared::new(error);
            delivers
                .into_iter()
                .for_each(|deliver| deliver(Some(shared.error())));
        }
    }
    Vec::new()
}

/// The error of a write whose caller stopped waiting before its statements ran (nobody
/// reads it).
fn cancelled() -> StoreError {
    StoreError::database(
        BACKEND,
        sqlx::Error::Protocol("the write was cancelled before it ran".into()),
    )
}

/// Where a batch's transaction stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TxState {
    /// Not begun: the next statement carries `BEGIN IMMEDIATE`.
    Idle,
    /// Begun; the batch commits it.
    Open,
    /// Committed by the last write's statements.
    Committed,
    /// A statement failed where it cannot be known whether the transaction is still
    /// open, or what of it would commit: the batch is rolled back.
    Unknown,
}

/// The batch's connection, as each write sees it: its `SELECT` begins the transaction
/// if none is open, and the last write's statements commit it.
pub(crate) struct BatchConn {
    conn: PoolConnection<Sqlite>,
    state: TxState,
    last: bool,
    /// Whether the current write's caller still waits.
    wanted: Wanted,
}

impl BatchConn {
    /// Reads the fenced session: `sql` is [`fenced_select!`]'s, `args` its extra
    /// parameters (the session id is bound last, here). Returns the database clock, the
    /// checked credential and the row.
    ///
    /// [`fenced_select!`]: crate::tx::fenced_select
    pub(crate) async fn fenced(
        &mut self,
        ring: &Keyring,
        fence: Fence<'_>,
        sql: &'static str,
        mut args: SqliteArguments,
    ) -> Result<(i64, Fenced, SqliteRow), StoreError> {
        if !(self.wanted)() {
            return Err(cancelled());
        }
        args.add(fence.session.as_str().to_owned())
            .map_err(|e| db(sqlx::Error::Encode(e)))?;
        let begin = self.state == TxState::Idle;
        if begin {
            // Until BEGIN's answer is in, a drop (a cancelled caller) must close the
            // connection: BEGIN may have run.
            self.state = TxState::Unknown;
        }
        let found = if begin {
            sqlx::query_with(AssertSqlSafe(format!("BEGIN IMMEDIATE; {sql}")), args)
                .fetch_optional(&mut *self.conn)
                .await
        } else {
            sqlx::query_with(sql, args)
                .fetch_optional(&mut *self.conn)
                .await
        };
        let row = match found {
            Ok(row) => {
                if begin {
                    self.state = TxState::Open;
                }
                row
            }
            Err(e) => {
                // Whether BEGIN ran is not known; and a failed read in the middle of a
                // batch may have rolled the batch back (SQLite does on I/O errors, a full
                // disk, no memory): the batch is rolled back and the rest re-run.
                self.state = TxState::Unknown;
                return Err(db(e));
            }
        };
        let row = row.ok_or_else(|| StoreError::SessionNotFound(fence.session.clone()))?;
        let fenced = tx::fenced_row(&row, ring, fence)?;
        let now = rows::col(&row, "now", fence.session, None)?;
        Ok((now, fenced, row))
    }

    /// Runs a write's statements inside a savepoint, in one round trip (`SAVEPOINT …;
    /// <sql>; RELEASE …`, and `COMMIT` if this is the batch's last write), returning their
    /// rows. If they fail, they are rolled back to the savepoint and the error returned.
    pub(crate) async fn write(
        &mut self,
        sql: &str,
        args: SqliteArguments,
    ) -> Result<Vec<SqliteRow>, StoreError> {
        debug_assert_eq!(self.state, TxState::Open, "a write after its SELECT");
        if !(self.wanted)() {
            return Err(cancelled());
        }
        let commit = if self.last { "; COMMIT" } else { "" };
        let wrapped = format!("SAVEPOINT durable_write; {sql}; RELEASE durable_write{commit}");
        // Until the answer is in, a drop must close the connection.
        self.state = TxState::Unknown;
        match sqlx::query_with(AssertSqlSafe(wrapped), args)
            .fetch_all(&mut *self.conn)
            .await
        {
            Ok(rows) => {
                self.state = if self.last {
                    TxState::Committed
                } else {
                    TxState::Open
                };
                Ok(rows)
            }
            Err(e) => {
                // Before RELEASE, the savepoint undoes this write alone; after it (the
                // COMMIT failed) there is no savepoint, and the batch is rolled back.
                match sqlx::query("ROLLBACK TO durable_write; RELEASE durable_write")
                    .execute(&mut *self.conn)
                    .await
                {
                    Ok(_) => self.state = TxState::Open,
                    Err(error) => {
                        tracing::debug!(%error, "no write savepoint to roll back to");
                    }
                }
                Err(db(e))
            }
        }
    }

    async fn commit(&mut self) -> Result<(), StoreError> {
        self.state = TxState::Unknown;
        match sqlx::query("COMMIT").execute(&mut *self.conn).await {
            Ok(_) => {
                self.state = TxState::Committed;
                Ok(())
            }
            Err(e) => {
                self.rollback().await;
                Err(db(e))
            }
        }
    }

    /// Rolls back whatever is open; whether a transaction was open.
    async fn rollback(&mut self) -> bool {
        self.state = TxState::Unknown;
        let ended = tx::roll_back(&mut self.conn).await;
        if ended != tx::RolledBack::Failed {
            self.state = TxState::Idle;
        }
        ended == tx::RolledBack::Done
    }
}

impl Drop for BatchConn {
    fn drop(&mut self) {
        // A batch dropped mid-way (its runtime shut down) or whose rollback failed must
        // not hand an open transaction to the pool's next user.
        if !matches!(self.state, TxState::Idle | TxState::Committed) {
            self.conn.close_on_drop();
        }
    }
}

/// A batch's error, given to each of its writes.
#[derive(Clone)]
struct Shared(Arc<StoreError>);

impl Shared {
    fn new(error: StoreError) -> Self {
        Shared(Arc::new(error))
    }

    /// The error for one write: a read-only store says so; anything else wraps the
    /// batch's error.
    fn error(&self) -> StoreError {
        match &*self.0 {
            StoreError::ReadOnly { backend } => StoreError::ReadOnly { backend },
            // Nothing of the batch began: every write in it is refused as overloaded.
            &StoreError::Overloaded {
                backend,
                pool,
                pool_size,
                waited,
                retry_after,
                advice,
            } => StoreError::Overloaded {
                backend,
                pool,
                pool_size,
                waited,
                retry_after,
                advice,
            },
            _ => StoreError::database(BACKEND, self.clone()),
        }
    }
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the write's batch did not commit: {}", self.0)
    }
}

impl std::error::Error for Shared {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}
