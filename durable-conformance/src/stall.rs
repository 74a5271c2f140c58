//! A store decorator that lets runtime cases see and interrupt checkpoint writes.
//!
//! [`Probe`] passes every call through to the real store it wraps. It counts the
//! checkpoint writes (`save_checkpoint`, and `finish_call` carrying a checkpoint), and
//! once armed, the next of them performs the real write and then parks forever instead
//! of returning, after waking whoever waits on [`Probe::stalled`]. A case can then drop
//! the writing future at a known point (the write committed, the reply never arrived)
//! instead of racing a timer against the store's I/O. It can also fail the next
//! `finish_call` carrying a checkpoint without writing anything, as a dropped
//! connection would, or garble the last message of the next checkpoint read, as a row
//! written by a buggy older release would be.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Notify;

use durable_core::error::StoreError;
use durable_core::ids::{CallId, SessionId};
use durable_core::store::{
    ApprovalRecord, ApprovalRequest, CallRecord, Checkpoint, CheckpointMeta, CheckpointStore,
    Claim, DecideApproval, Durability, EditedKey, ErrorRecord, Fence, FinishCall, IssueOutcome,
    Lease, NewCall, NewCheckpoint, NewError, NewSession, PendingApproval, PurgeOutcome, QueueInfo,
    ResolutionRecord, ResolveCall, RetargetSession, SessionFilter, SessionRecord, SessionStatus,
    StoredMessage, TenantInfo,
};
use durable_core::store::{
    ApprovalStore, CheckpointLog, JournalStore, LeaseStore, MaintenanceStore, QueueStore,
    ResolutionStore, SessionStore, StoreBase,
};

/// Wraps a real store; see the module docs.
pub(super) struct Probe {
    inner: Arc<dyn CheckpointStore>,
    armed: AtomicBool,
    fail_next: AtomicBool,
    garble_next: AtomicBool,
    stalled: Notify,
    saves: AtomicUsize,
    finishes_with_checkpoint: AtomicUsize,
    before_issue_approved: std::sync::Mutex<Option<Hook>>,
    /// Where the next child's start parks (see [`Probe::stall_child_start`]).
    child_stall: std::sync::Mutex<Option<ChildStall>>,
    /// Whether the next consumption of a signal parks once committed (see
    /// [`Probe::stall_signal_read`]).
    signal_stall: AtomicBool,
}

/// A point of a child's start where [`Probe::stall_child_start`] parks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ChildStall {
    /// `create_child` parks before writing anything (the start's row is issued).
    BeforeCreate,
    /// `create_child` creates the child, then parks (the child holds its first lease).
    AfterCreate,
    /// The child's first lease is given up, then `release_lease` parks.
    AfterRelease,
    /// The start's outcome is recorded, then `finish_call` parks (the reply is lost).
    AfterFinish,
}

/// Something a case runs on the real store at a chosen point (see
/// [`Probe::before_next_issue_approved`]).
pub(super) type Hook =
    Box<dyn FnOnce() -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

impl Probe {
    pub(super) fn new(inner: Arc<dyn CheckpointStore>) -> Arc<Self> {
        Arc::new(Self {
            inner,
            armed: AtomicBool::new(false),
            fail_next: AtomicBool::new(false),
            garble_next: AtomicBool::new(false),
            stalled: Notify::new(),
            saves: AtomicUsize::new(0),
            finishes_with_checkpoint: AtomicUsize::new(0),
            before_issue_approved: std::sync::Mutex::new(None),
            child_stall: std::sync::Mutex::new(None),
            signal_stall: AtomicBool::new(false),
        })
    }

    /// The next `consume_signal` that takes a signal commits, then parks (after waking
    /// [`stalled`](Self::stalled)): the session dies between the consumption and its
    /// journal row.
    pub(super) fn stall_signal_read(&self) {
        self.signal_stall.store(true, Ordering::SeqCst);
    }

    /// The next child's start parks at `point` (after waking whoever waits on
    /// [`stalled`](Self::stalled)), so that a case drops the parent there.
    pub(super) fn stall_child_start(&self, point: ChildStall) {
        *self
            .child_stall
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(point);
    }

    /// Parks (after waking [`stalled`](Self::stalled)) when armed at `point`.
    async fn stall_child_at(&self, point: ChildStall) {
        let armed = {
            let mut slot = self
                .child_stall
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if *slot == Some(point) {
                *slot = None;
                true
            } else {
                false
            }
        };
        if armed {
            self.stalled.notify_one();
            std::future::pending::<()>().await;
        }
    }

    /// The next checkpoint write commits, then parks instead of returning.
    pub(super) fn arm(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }

    /// The next `finish_call` carrying a checkpoint fails without writing anything.
    pub(super) fn fail_next_combined_write(&self) {
        self.fail_next.store(true, Ordering::SeqCst);
    }

    /// The next `load_checkpoint` returns its last message as text that is not JSON.
    pub(super) fn garble_next_load(&self) {
        self.garble_next.store(true, Ordering::SeqCst);
    }

    /// Resolves once an armed checkpoint write has committed and parked.
    pub(super) async fn stalled(&self) {
        self.stalled.notified().await;
    }

    /// The next `issue_approved` runs `hook` to its end first (a person's decision
    /// landing between the worker's read of the approved row and its issue, say).
    pub(super) fn before_next_issue_approved(&self, hook: Hook) {
        *self
            .before_issue_approved
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(hook);
    }

    /// `save_checkpoint` calls so far.
    pub(super) fn saves(&self) -> usize {
        self.saves.load(Ordering::SeqCst)
    }

    /// `finish_call` calls that carried a checkpoint so far.
    pub(super) fn finishes_with_checkpoint(&self) -> usize {
        self.finishes_with_checkpoint.load(Ordering::SeqCst)
    }

    async fn stall_if_armed(&self) {
        if self.armed.swap(false, Ordering::SeqCst) {
            self.stalled.notify_one();
            std::future::pending::<()>().await;
        }
    }
}

#[async_trait]
impl StoreBase for Probe {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    fn keyring(&self) -> &durable_core::integrity::Keyring {
        self.inner.keyring()
    }

    async fn durability(&self) -> Result<Durability, StoreError> {
        self.inner.durability().await
    }

    async fn now(&self) -> Result<i64, StoreError> {
        self.inner.now().await
    }
}

#[async_trait]
impl SessionStore for Probe {
    async fn create_session(&self, new: NewSession) -> Result<(SessionRecord, Lease), StoreError> {
        self.inner.create_session(new).await
    }

    async fn session(&self, id: &SessionId) -> Result<SessionRecord, StoreError> {
        self.inner.session(id).await
    }

    async fn list_sessions(
        &self,
        filter: &SessionFilter,
    ) -> Result<Vec<SessionRecord>, StoreError> {
        self.inner.list_sessions(filter).await
    }

    async fn set_status(
        &self,
        fence: Fence<'_>,
        status: SessionStatus,
        reason: Option<&str>,
    ) -> Result<(), StoreError> {
        self.inner.set_status(fence, status, reason).await
    }

    async fn create_child(
        &self,
        parent: &SessionId,
        new: NewSession,
    ) -> Result<(SessionRecord, Lease), StoreError> {
        self.stall_child_at(ChildStall::BeforeCreate).await;
        let created = self.inner.create_child(parent, new).await;
        self.stall_child_at(ChildStall::AfterCreate).await;
        created
    }

    async fn children(
        &self,
        parent: &SessionId,
    ) -> Result<Vec<durable_core::store::ChildRecord>, StoreError> {
        self.inner.children(parent).await
    }

    async fn cancel_session(
        &self,
        cancel: &durable_core::store::CancelSession,
    ) -> Result<Vec<durable_core::store::CancelledSession>, StoreError> {
        self.inner.cancel_session(cancel).await
    }
}

#[async_trait]
impl LeaseStore for Probe {
    async fn acquire_lease(
        &self,
        id: &SessionId,
        owner: &str,
        ttl: Duration,
        max_attempts: i32,
    ) -> Result<Lease, StoreError> {
        self.inner.acquire_lease(id, owner, ttl, max_attempts).await
    }

    async fn renew_lease(&self, lease: &Lease, ttl: Duration) -> Result<Lease, StoreError> {
        self.inner.renew_lease(lease, ttl).await
    }

    async fn release_lease(&self, lease: &Lease) -> Result<(), StoreError> {
        let released = self.inner.release_lease(lease).await;
        self.stall_child_at(ChildStall::AfterRelease).await;
        released
    }

    async fn mark_running(&self, fence: Fence<'_>) -> Result<(), StoreError> {
        self.inner.mark_running(fence).await
    }

    async fn mark_operator_needed(
        &self,
        fence: Fence<'_>,
        call: &CallId,
    ) -> Result<(), StoreError> {
        self.inner.mark_operator_needed(fence, call).await
    }

    async fn claim_expired(&self, claim: &Claim) -> Result<Option<Lease>, StoreError> {
        self.inner.claim_expired(claim).await
    }

    async fn unpark_session(&self, id: &SessionId) -> Result<SessionRecord, StoreError> {
        self.inner.unpark_session(id).await
    }

    async fn list_expired(&self, limit: i64) -> Result<Vec<SessionRecord>, StoreError> {
        self.inner.list_expired(limit).await
    }

    async fn wait(
        &self,
        fence: Fence<'_>,
        wait: &durable_core::store::Wait,
    ) -> Result<bool, StoreError> {
        self.inner.wait(fence, wait).await
    }
}

#[async_trait]
impl QueueStore for Probe {
    async fn set_scheduling(
        &self,
        fence: Fence<'_>,
        scheduling: &durable_core::store::Scheduling,
    ) -> Result<(), StoreError> {
        self.inner.set_scheduling(fence, scheduling).await
    }

    async fn set_tenant_limit(
        &self,
        tenant: &str,
        max_running: Option<u32>,
    ) -> Result<(), StoreError> {
        self.inner.set_tenant_limit(tenant, max_running).await
    }

    async fn set_queue_limit(
        &self,
        queue: &str,
        max_running: Option<u32>,
    ) -> Result<(), StoreError> {
        self.inner.set_queue_limit(queue, max_running).await
    }

    async fn queues(&self) -> Result<Vec<QueueInfo>, StoreError> {
        self.inner.queues().await
    }

    async fn tenants(&self) -> Result<Vec<TenantInfo>, StoreError> {
        self.inner.tenants().await
    }

    async fn next_wake_at(&self) -> Result<Option<i64>, StoreError> {
        self.inner.next_wake_at().await
    }

    async fn wake_session(&self, id: &SessionId) -> Result<SessionRecord, StoreError> {
        self.inner.wake_session(id).await
    }
}

#[async_trait]
impl CheckpointLog for Probe {
    async fn save_checkpoint(
        &self,
        fence: Fence<'_>,
        expected: i64,
        checkpoint: NewCheckpoint,
    ) -> Result<CheckpointMeta, StoreError> {
        self.saves.fetch_add(1, Ordering::SeqCst);
        let saved = self
            .inner
            .save_checkpoint(fence, expected, checkpoint)
            .await;
        self.stall_if_armed().await;
        saved
    }

    async fn complete_with_checkpoint(
        &self,
        fence: Fence<'_>,
        expected: i64,
        checkpoint: NewCheckpoint,
    ) -> Result<CheckpointMeta, StoreError> {
        self.saves.fetch_add(1, Ordering::SeqCst);
        let saved = self
            .inner
            .complete_with_checkpoint(fence, expected, checkpoint)
            .await;
        self.stall_if_armed().await;
        saved
    }

    async fn load_checkpoint(
        &self,
        id: &SessionId,
        version: Option<i64>,
    ) -> Result<Checkpoint, StoreError> {
        let mut checkpoint = self.inner.load_checkpoint(id, version).await?;
        if self.garble_next.swap(false, Ordering::SeqCst)
            && let Some(last) = checkpoint.messages.last_mut()
        {
            *last = StoredMessage::new(r#"{"role": "user", "content": "#);
        }
        Ok(checkpoint)
    }

    async fn list_checkpoints(&self, id: &SessionId) -> Result<Vec<CheckpointMeta>, StoreError> {
        self.inner.list_checkpoints(id).await
    }

    async fn fork_session_with(
        &self,
        fork: &durable_core::store::ForkSession,
    ) -> Result<(SessionRecord, Lease), StoreError> {
        self.inner.fork_session_with(fork).await
    }
}

#[async_trait]
impl JournalStore for Probe {
    async fn issue_call(
        &self,
        fence: Fence<'_>,
        call: NewCall,
    ) -> Result<IssueOutcome, StoreError> {
        self.inner.issue_call(fence, call).await
    }

    async fn record_call(
        &self,
        fence: Fence<'_>,
        call: NewCall,
        finish: FinishCall,
    ) -> Result<IssueOutcome, StoreError> {
        self.inner.record_call(fence, call, finish).await
    }

    async fn reissue_call(
        &self,
        fence: Fence<'_>,
        call: &CallId,
    ) -> Result<CallRecord, StoreError> {
        self.inner.reissue_call(fence, call).await
    }

    async fn issue_approved(
        &self,
        fence: Fence<'_>,
        call: &CallId,
        key: Option<EditedKey>,
    ) -> Result<CallRecord, StoreError> {
        let hook = self
            .before_issue_approved
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(hook) = hook {
            hook().await;
        }
        self.inner.issue_approved(fence, call, key).await
    }

    async fn finish_call(
        &self,
        fence: Fence<'_>,
        call: &CallId,
        finish: FinishCall,
        checkpoint: Option<(i64, NewCheckpoint)>,
    ) -> Result<Option<CheckpointMeta>, StoreError> {
        let with_checkpoint = checkpoint.is_some();
        if with_checkpoint {
            self.finishes_with_checkpoint.fetch_add(1, Ordering::SeqCst);
            if self.fail_next.swap(false, Ordering::SeqCst) {
                return Err(StoreError::Database {
                    backend: "probe",
                    source: "connection reset (injected by the conformance probe)".into(),
                });
            }
        }
        let finished = self
            .inner
            .finish_call(fence, call, finish, checkpoint)
            .await;
        if with_checkpoint {
            self.stall_if_armed().await;
        }
        self.stall_child_at(ChildStall::AfterFinish).await;
        finished
    }

    async fn call(&self, id: &CallId) -> Result<CallRecord, StoreError> {
        self.inner.call(id).await
    }

    async fn calls(
        &self,
        session: &SessionId,
        step: Option<i64>,
    ) -> Result<Vec<CallRecord>, StoreError> {
        self.inner.calls(session, step).await
    }

    async fn calls_page(
        &self,
        session: &SessionId,
        after: i64,
        limit: i64,
    ) -> Result<Vec<CallRecord>, StoreError> {
        self.inner.calls_page(session, after, limit).await
    }

    async fn in_doubt(&self, session: Option<&SessionId>) -> Result<Vec<CallRecord>, StoreError> {
        self.inner.in_doubt(session).await
    }
}

#[async_trait]
impl ResolutionStore for Probe {
    async fn resolve_call(&self, resolve: ResolveCall) -> Result<CallRecord, StoreError> {
        self.inner.resolve_call(resolve).await
    }

    async fn resolutions(&self, session: &SessionId) -> Result<Vec<ResolutionRecord>, StoreError> {
        self.inner.resolutions(session).await
    }
}

#[async_trait]
impl ApprovalStore for Probe {
    async fn request_call(
        &self,
        fence: Fence<'_>,
        call: NewCall,
        request: ApprovalRequest,
    ) -> Result<IssueOutcome, StoreError> {
        self.inner.request_call(fence, call, request).await
    }

    async fn decide_approval(&self, decide: DecideApproval) -> Result<CallRecord, StoreError> {
        self.inner.decide_approval(decide).await
    }

    async fn pending_approvals(
        &self,
        session: Option<&SessionId>,
    ) -> Result<Vec<PendingApproval>, StoreError> {
        self.inner.pending_approvals(session).await
    }

    async fn approvals(&self, session: &SessionId) -> Result<Vec<ApprovalRecord>, StoreError> {
        self.inner.approvals(session).await
    }
}

#[async_trait]
impl MaintenanceStore for Probe {
    async fn record_error(&self, error: NewError) -> Result<(), StoreError> {
        self.inner.record_error(error).await
    }

    async fn errors(&self, session: &SessionId) -> Result<Vec<ErrorRecord>, StoreError> {
        self.inner.errors(session).await
    }

    async fn retarget_session(
        &self,
        migrate: RetargetSession,
    ) -> Result<SessionRecord, StoreError> {
        self.inner.retarget_session(migrate).await
    }

    async fn purge_session(
        &self,
        id: &SessionId,
        retention: Duration,
    ) -> Result<PurgeOutcome, StoreError> {
        self.inner.purge_session(id, retention).await
    }
}

#[async_trait]
impl durable_core::store::LimiterStore for Probe {
    async fn define_limit(
        &self,
        name: &str,
        limit: &durable_core::limiter::RateLimit,
    ) -> Result<durable_core::limiter::Defined, StoreError> {
        self.inner.define_limit(name, limit).await
    }

    async fn acquire_limit(
        &self,
        acquire: &durable_core::limiter::Acquire,
    ) -> Result<durable_core::limiter::Admission, StoreError> {
        self.inner.acquire_limit(acquire).await
    }

    async fn charge_limit(&self, name: &str, tokens: u64) -> Result<(), StoreError> {
        self.inner.charge_limit(name, tokens).await
    }

    async fn throttle_limit(&self, name: &str, retry_after: Duration) -> Result<i64, StoreError> {
        self.inner.throttle_limit(name, retry_after).await
    }

    async fn limiters(&self) -> Result<Vec<durable_core::limiter::LimiterInfo>, StoreError> {
        self.inner.limiters().await
    }
}

#[async_trait]
impl durable_core::store::BudgetStore for Probe {
    async fn raise_limit(
        &self,
        raise: durable_core::store::RaiseLimit,
    ) -> Result<durable_core::store::LimitRaise, StoreError> {
        self.inner.raise_limit(raise).await
    }

    async fn limit_raises(
        &self,
        session: &SessionId,
    ) -> Result<Vec<durable_core::store::LimitRaise>, StoreError> {
        self.inner.limit_raises(session).await
    }
}

#[async_trait]
impl durable_core::store::SignalStore for Probe {
    async fn send_signal(
        &self,
        signal: &durable_core::store::NewSignal,
    ) -> Result<durable_core::store::SignalRecord, StoreError> {
        self.inner.send_signal(signal).await
    }

    async fn consume_signal(
        &self,
        fence: Fence<'_>,
        name: &str,
        consumer: &str,
    ) -> Result<Option<durable_core::store::SignalRecord>, StoreError> {
        let taken = self.inner.consume_signal(fence, name, consumer).await?;
        if taken.is_some() && self.signal_stall.swap(false, Ordering::SeqCst) {
            self.stalled.notify_one();
            std::future::pending::<()>().await;
        }
        Ok(taken)
    }

    async fn signals(
        &self,
        session: &SessionId,
    ) -> Result<Vec<durable_core::store::SignalRecord>, StoreError> {
        self.inner.signals(session).await
    }
}
