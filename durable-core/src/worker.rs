//! [`Worker`]: a pool that runs a handler for every session that needs a worker, with
//! bounded concurrency and a graceful shutdown.
//!
//! ```no_run
//! use std::time::Duration;
//! use durable_core::{Durable, DurableError, Message, StartOptions};
//!
//! # async fn demo(durable: Durable, ctrl_c: impl std::future::Future<Output = ()>) -> Result<(), DurableError> {
//! // Anyone (a web handler, a cron job) submits work: the session is created and released.
//! durable.submit(StartOptions::<Message>::new().with_messages(vec![Message::user("Refund o-17")])).await?;
//!
//! // The pool runs the agent loop for each session, at most 4 at once, until Ctrl-C.
//! let report = durable
//!     .worker(|resumed: durable_core::Resumed<Message>, shutdown: durable_core::ShutdownSignal| async move {
//!         let mut session = resumed.session;
//!         loop {
//!             // … one turn: model call, tool calls through `session.journal()` …
//!             session.checkpoint().await?;
//!             # let done = true;
//!             if done {
//!                 session.complete().await?;
//!                 return Ok(());
//!             }
//!             // A safe point: hand the session to another worker at once.
//!             if shutdown.is_shutting_down() {
//!                 return session.release().await;
//!             }
//!         }
//!     })
//!     .concurrency(4)
//!     .poll_interval(Duration::from_millis(500))
//!     .shutdown_deadline(Duration::from_secs(20))
//!     .run_until(ctrl_c) // e.g. `async { let _ = tokio::signal::ctrl_c().await; }`
//!     .await;
//! println!("{} sessions handled, {} aborted at the deadline", report.handled, report.aborted);
//! # Ok(()) }
//! ```
//!
//! # What the pool does
//!
//! It claims sessions with [`Durable::recover_next`]'s rule: active sessions that were
//! released ([`Durable::submit`], [`Session::release`](crate::Session::release), an
//! approval decided), whose worker died (lease expired), or whose sleep is over
//! ([`Session::sleep_until`](crate::Session::sleep_until)), of this runtime's app version
//! and of the pool's [`queues`](Worker::queues), oldest first (by creation: a session
//! handed over mid-run goes before work submitted after it). It runs the handler for
//! each one in its own task, at most [`concurrency`](Worker::concurrency) at once. A
//! queue with a fleet-wide limit ([`Operator::set_queue_limit`](crate::Operator::set_queue_limit)) gives no more sessions
//! than its limit to all pools of the store together; the store enforces it.
//!
//! When nothing is claimable it expires the approval requests past their deadline
//! ([`Operator::expire_approvals`](crate::Operator::expire_approvals): their sessions go on with the denial) and waits for
//! work: until the store says some may have come
//! ([`CheckpointStore::work_events`](crate::store::QueueStore::work_events): a
//! session submitted or released, a decision taken, in this process, and across
//! processes where the database can tell: PostgreSQL's `LISTEN`/`NOTIFY`), until the
//! earliest sleeping session is due, or until a handler returns, and at most one
//! [`poll_interval`](Worker::poll_interval): polling stays the safety net.
//!
//! # Graceful shutdown
//!
//! When the `shutdown` future given to [`run_until`](Worker::run_until) resolves, the
//! pool claims nothing more and sets the [`ShutdownSignal`] every handler was given. A
//! handler checks it at its safe points (between turns, after a checkpoint) and, once it
//! is set, returns after [`Session::release`](crate::Session::release): the session's
//! lease is given up at once and another worker resumes it immediately, not after the
//! lease's TTL. The pool waits for its handlers up to
//! [`shutdown_deadline`](Worker::shutdown_deadline), then aborts the rest: their tasks
//! are dropped wherever they are, exactly as if the process had been killed there. Their
//! leases expire after the TTL and the journal decides what a resume may do (a tool call
//! interrupted after it was issued is in doubt, decided by its replay class).
//!
//! A second signal cuts the wait short: [`hard_stop`](Worker::hard_stop) aborts the
//! handlers still running as soon as it resolves.
//!
//! A session **waiting for an operator** is not claimed: once a resume of one of its
//! in-doubt calls was refused with [`DurableError::ReplayUnsafe`] (the verify hook could
//! not tell, or there is none), the journal marks the call
//! ([`mark_operator_needed`](crate::store::LeaseStore::mark_operator_needed)), and
//! the pools leave the session alone until an operator resolves the call
//! (`durable resolve`, [`Operator::resolve`](crate::Operator::resolve)); then they claim it
//! again. A handler so refused releases the session and returns. A session whose worker
//! died with such a call, not yet refused, is still claimed, so that a verify hook can
//! settle it.
//!
//! A handler that returns without completing, parking, awaiting approval or releasing
//! its session (an error, or a dropped session) leaves the lease to expire, as after a
//! crash; the session is then recovered (and counted as a recovery, parked after
//! [`max_recovery_attempts`](crate::DurableBuilder::max_recovery_attempts)).

use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tracing::Instrument;

use crate::error::DurableError;
use crate::ids::SessionId;
use crate::runtime::{Durable, StartOptions};
use crate::session::Resumed;
use crate::store::WorkEvents;

/// Tells a pool's handlers that the pool is shutting down: check it at safe points and
/// return (after [`Session::release`](crate::Session::release)) when it is set.
#[derive(Debug, Clone)]
pub struct ShutdownSignal(watch::Receiver<bool>);

impl ShutdownSignal {
    /// A signal, not set, and the trigger that sets it: to run a handler outside a pool
    /// (in a test, say).
    pub fn channel() -> (ShutdownTrigger, ShutdownSignal) {
        let (tx, rx) = watch::channel(false);
        (ShutdownTrigger(tx), ShutdownSignal(rx))
    }

    /// Whether shutdown was requested.
    pub fn is_shutting_down(&self) -> bool {
        *self.0.borrow()
    }

    /// Resolves once shutdown is requested (at once if it already was), e.g. to race a
    /// long wait of the handler's own with `tokio::select!`.
    pub async fn requested(&self) {
        let mut rx = self.0.clone();
        // An error means the pool is gone: as good as shutting down.
        let _ = rx.wait_for(|set| *set).await;
    }
}

/// Sets a [`ShutdownSignal`] (see [`ShutdownSignal::channel`]).
#[derive(Debug)]
pub struct ShutdownTrigger(watch::Sender<bool>);

impl ShutdownTrigger {
    /// Sets the signal for every clone of it.
    pub fn trigger(&self) {
        self.0.send_replace(true);
    }
}

/// What a pool did, returned by [`Worker::run_until`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolReport {
    /// Sessions claimed and handed to the handler.
    pub handled: usize,
    /// Handlers that returned `Ok`.
    pub succeeded: usize,
    /// Handlers that returned an error (logged), and claims that failed (the store
    /// unreachable, a claimed session that could not be resumed).
    pub failed: usize,
    /// Handlers that panicked (logged).
    pub panicked: usize,
    /// Handlers still running at the shutdown deadline, aborted.
    pub aborted: usize,
    /// The sessions whose handler was aborted: their leases expire after the TTL.
    pub aborted_sessions: Vec<SessionId>,
    /// Approval requests past their deadline that this pool expired (denied by the
    /// deadline) while it had nothing to claim, so that their sessions go on.
    pub expired_approvals: usize,
}

/// A worker pool over a [`Durable`]: built by [`Durable::worker`], run by
/// [`run_until`](Self::run_until). See the [module docs](self).
#[must_use = "a worker does nothing until `run_until` is awaited"]
pub struct Worker<M, H> {
    durable: Durable,
    handler: Arc<H>,
    concurrency: usize,
    poll_interval: Duration,
    shutdown_deadline: Duration,
    queues: Vec<String>,
    /// In a mutex only to be `Sync`: `run_until` borrows the worker across awaits, and
    /// its future must be `Send` (to `tokio::spawn` it).
    hard_stop: std::sync::Mutex<Option<HardStop>>,
    _messages: PhantomData<fn() -> M>,
}

impl<M, H> std::fmt::Debug for Worker<M, H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("owner", &self.durable.config.owner)
            .field("concurrency", &self.concurrency)
            .field("poll_interval", &self.poll_interval)
            .field("shutdown_deadline", &self.shutdown_deadline)
            .field("queues", &self.queues)
            .finish_non_exhaustive()
    }
}

impl Durable {
    /// A worker pool that runs `handler` (the agent loop for one session) for every
    /// session that needs a worker. Defaults: concurrency 1, poll every second, a
    /// shutdown deadline of 30 s. See [`worker`](crate::worker).
    pub fn worker<M, H, Fut>(&self, handler: H) -> Worker<M, H>
    where
        M: Serialize + DeserializeOwned + Clone + Send + 'static,
        H: Fn(Resumed<M>, ShutdownSignal) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), DurableError>> + Send + 'static,
    {
        Worker {
            durable: self.clone(),
            handler: Arc::new(handler),
            concurrency: 1,
            poll_interval: Duration::from_secs(1),
            shutdown_deadline: Duration::from_secs(30),
            queues: Vec::new(),
            hard_stop: std::sync::Mutex::new(None),
            _messages: PhantomData,
        }
    }

    /// Starts a session and releases it at once, so that any worker's pool (or
    /// [`recover_next`](Self::recover_next)) picks it up, oldest first; taking a released
    /// session is not a recovery. Returns its id.
    pub async fn submit<M>(&self, options: StartOptions<M>) -> Result<SessionId, DurableError>
    where
        M: Serialize + DeserializeOwned + Clone,
    {
        let session = self.start(options).await?;
        let id = session.id().clone();
        session.release().await?;
        tracing::debug!(session = %id, "session submitted");
        Ok(id)
    }
}

impl<M, H, Fut> Worker<M, H>
where
    M: Serialize + DeserializeOwned + Clone + Send + 'static,
    H: Fn(Resumed<M>, ShutdownSignal) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), DurableError>> + Send + 'static,
{
    /// At most `n` sessions handled at once in this pool (default 1; 0 counts as 1).
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n.max(1);
        self
    }

    /// How long to wait before looking again when nothing was claimable (default 1 s).
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// How long in-flight handlers get to return after shutdown was requested before they
    /// are aborted (default 30 s). Keep it under the time your deployment waits between
    /// SIGTERM and SIGKILL.
    pub fn shutdown_deadline(mut self, deadline: Duration) -> Self {
        self.shutdown_deadline = deadline;
        self
    }

    /// Claims only sessions of these queues ([`StartOptions::with_queue`]); every queue
    /// by default.
    pub fn queues<Q: Into<String>>(mut self, queues: impl IntoIterator<Item = Q>) -> Self {
        self.queues = queues.into_iter().map(Into::into).collect();
        self
    }

    /// Stops hard when `stop` resolves during a graceful shutdown (a second SIGTERM or
    /// Ctrl-C, say): the handlers still running are aborted at once, as at the
    /// [`shutdown_deadline`](Self::shutdown_deadline). Polled only once the shutdown has
    /// begun. See the example `worker_pool` for one signal stream feeding both.
    pub fn hard_stop(mut self, stop: impl Future<Output = ()> + Send + 'static) -> Self {
        self.hard_stop = std::sync::Mutex::new(Some(Box::pin(stop)));
        self
    }

    /// Runs the pool until `shutdown` resolves, then shuts down gracefully (see the
    /// [module docs](self)) and reports what it did. Must run inside a tokio runtime;
    /// handlers run as tasks spawned on it.
    ///
    /// A failed claim is logged and counted in [`PoolReport::failed`], and the pool waits
    /// for work as when nothing was claimable. The store unreachable: it tries again. A
    /// claimed session that cannot be resumed (its messages no longer decode, a row fails
    /// its seal check): its lease is left to expire, so the next claim counts a recovery
    /// and the poison-pill bound parks it; meanwhile the pool goes on with other
    /// sessions. Dropping this future instead of resolving `shutdown` aborts the handlers
    /// at once, as the deadline does.
    pub async fn run_until(self, shutdown: impl Future<Output = ()>) -> PoolReport {
        let (trigger, signal) = ShutdownSignal::channel();
        let permits = Arc::new(Semaphore::new(self.concurrency));
        let mut tasks: JoinSet<(SessionId, Result<(), DurableError>)> = JoinSet::new();
        let mut running: std::collections::HashMap<tokio::task::Id, SessionId> =
            std::collections::HashMap::new();
        let mut report = PoolReport::default();
        let mut shutdown = std::pin::pin!(shutdown);
        let mut events = self.durable.store().work_events();
        let owner = self.durable.config.owner.clone();
        let span = tracing::info_span!("worker", %owner);
        tracing::info!(parent: &span, concurrency = self.concurrency, "worker pool started");
        'claim: loop {
            while let Some(joined) = tasks.try_join_next_with_id() {
                settle(joined, &mut running, &mut report);
            }
            // Wait for a free slot (reaping finished handlers meanwhile) or shutdown.
            let permit = loop {
                tokio::select! {
                    biased;
                    () = &mut shutdown => break 'claim,
                    permit = Arc::clone(&permits).acquire_owned() => {
                        break permit.expect("the pool's semaphore is never closed");
                    }
                    Some(joined) = tasks.join_next_with_id(), if !tasks.is_empty() => {
                        settle(joined, &mut running, &mut report);
                    }
                }
            };
            // The claim runs to its end (never dropped half-way, which could leave a
            // lease taken and nobody working on it).
            match self.durable.claim_next::<M>(&self.queues).await {
                Ok(Some(resumed)) => {
                    let id = resumed.session.id().clone();
                    tracing::info!(parent: &span, session = %id, "session claimed");
                    report.handled += 1;
                    let handler = Arc::clone(&self.handler);
                    let signal = signal.clone();
                    let task_id = id.clone();
                    let handler_span = tracing::info_span!(parent: &span, "handler", session = %id);
                    let handle = tasks.spawn(
                        async move {
                            let _permit = permit;
                            let result = (*handler)(resumed, signal).await;
                            (task_id, result)
                        }
                        .instrument(handler_span),
                    );
                    running.insert(handle.id(), id);
                }
                Ok(None) => {
                    drop(permit);
                    // Nothing to claim: deny the approval requests past their deadline,
                    // whose sessions then become claimable (the next poll takes them).
                    match self.durable.operator().expire_approvals(None).await {
                        Ok(expired) if !expired.is_empty() => {
                            tracing::info!(parent: &span, expired = expired.len(), "approval requests expired by their deadline");
                            report.expired_approvals += expired.len();
                            continue 'claim;
                        }
                        Ok(_) => {}
                        Err(e) => {
                            tracing::warn!(parent: &span, error = %e, "expiring approval requests failed");
                        }
                    }
                    if !self
                        .idle(
                            &mut shutdown,
                            &mut events,
                            &mut tasks,
                            &mut running,
                            &mut report,
                        )
                        .await
                    {
                        break 'claim;
                    }
                }
                Err(e) => {
                    drop(permit);
                    tracing::warn!(parent: &span, error = %e, "claiming a session failed");
                    report.failed += 1;
                    if !self
                        .idle(
                            &mut shutdown,
                            &mut events,
                            &mut tasks,
                            &mut running,
                            &mut report,
                        )
                        .await
                    {
                        break 'claim;
                    }
                }
            }
        }
        // Shutdown: no more claims; tell the handlers, wait for them up to the deadline.
        trigger.trigger();
        tracing::info!(parent: &span, in_flight = tasks.len(), "worker pool shutting down");
        let deadline = tokio::time::sleep(self.shutdown_deadline);
        tokio::pin!(deadline);
        let mut hard_stop = self
            .hard_stop
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
            .unwrap_or_else(|| Box::pin(std::future::pending()));
        while !tasks.is_empty() {
            let why = tokio::select! {
                biased;
                Some(joined) = tasks.join_next_with_id() => {
                    settle(joined, &mut running, &mut report);
                    continue;
                }
                () = &mut deadline => "shutdown deadline passed",
                () = &mut hard_stop => "hard stop requested",
            };
            tracing::warn!(parent: &span, left = tasks.len(), "{why}; aborting handlers");
            tasks.abort_all();
            while let Some(joined) = tasks.join_next_with_id().await {
                settle(joined, &mut running, &mut report);
            }
        }
        tracing::info!(parent: &span, ?report, "worker pool stopped");
        report
    }

    /// Waits until work may be available, reaping finished handlers meanwhile: one
    /// poll interval at most, less when a sleeping session is due sooner, and no longer
    /// than the store's next notification ([`CheckpointStore::work_events`]) or a
    /// handler's end (which frees a slot, and may free a place in a limited queue).
    /// `false` if shutdown came.
    ///
    /// [`CheckpointStore::work_events`]: crate::store::QueueStore::work_events
    async fn idle<S: Future<Output = ()>>(
        &self,
        shutdown: &mut std::pin::Pin<&mut S>,
        events: &mut Option<WorkEvents>,
        tasks: &mut JoinSet<(SessionId, Result<(), DurableError>)>,
        running: &mut std::collections::HashMap<tokio::task::Id, SessionId>,
        report: &mut PoolReport,
    ) -> bool {
        let wait = self.until_next_wake().await.min(self.poll_interval);
        let pause = tokio::time::sleep(wait);
        tokio::pin!(pause);
        let notified = async {
            match events {
                Some(events) => events.changed().await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(notified);
        tokio::select! {
            biased;
            () = shutdown.as_mut() => false,
            () = &mut pause => true,
            () = &mut notified => true,
            Some(joined) = tasks.join_next_with_id(), if !tasks.is_empty() => {
                settle(joined, running, report);
                true
            }
        }
    }

    /// How long until the earliest sleeping session is due (the poll interval when none
    /// sleeps, or the store cannot say).
    async fn until_next_wake(&self) -> Duration {
        let store = self.durable.store();
        let Ok(Some(at)) = store.next_wake_at().await else {
            return self.poll_interval;
        };
        match store.now().await {
            // A little past the due time: the claim compares on the store's clock.
            Ok(now) => Duration::from_millis(u64::try_from(at - now).unwrap_or(0) + 1),
            Err(_) => self.poll_interval,
        }
    }
}

/// A second signal's future ([`Worker::hard_stop`]).
type HardStop = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

type Joined =
    Result<(tokio::task::Id, (SessionId, Result<(), DurableError>)), tokio::task::JoinError>;

/// Counts one finished (or aborted, or panicked) handler.
fn settle(
    joined: Joined,
    running: &mut std::collections::HashMap<tokio::task::Id, SessionId>,
    report: &mut PoolReport,
) {
    match joined {
        Ok((task, (session, result))) => {
            running.remove(&task);
            match result {
                Ok(()) => report.succeeded += 1,
                Err(e) => {
                    tracing::warn!(%session, error = %e, "handler failed; the session's lease expires");
                    report.failed += 1;
                }
            }
        }
        Err(e) => {
            let session = running.remove(&e.id());
            if e.is_cancelled() {
                if let Some(session) = session {
                    tracing::warn!(%session, "handler aborted at the shutdown deadline");
                    report.aborted_sessions.push(session);
                }
                report.aborted += 1;
            } else {
                tracing::error!(session = ?session, "handler panicked; the session's lease expires");
                report.panicked += 1;
            }
        }
    }
}
