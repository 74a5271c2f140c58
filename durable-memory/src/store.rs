//! `impl CheckpointStore for MemoryStore`: a forwarding list in the trait's order. Each
//! method's logic is in the module of its concept; methods left to the trait's defaults
//! (`list_session_rows`, `calls_page`, `issued_calls`, `fork_session`) are correct here
//! as they are: every read checks the whole journal, and no row is unreadable.

use std::time::Duration;

use async_trait::async_trait;
use durable_core::integrity::Keyring;
use durable_core::store::{
    ApprovalRecord, ApprovalRequest, ApprovalStore, BudgetStore, CallRecord, CancelSession,
    CancelledSession, Checkpoint, CheckpointLog, CheckpointMeta, ChildRecord, Claim,
    DecideApproval, Durability, EditedKey, ErrorRecord, Fence, FinishCall, ForkSession,
    IssueOutcome, JournalStore, Lease, LeaseStore, LimitRaise, MaintenanceStore, NewCall,
    NewCheckpoint, NewError, NewSession, PendingApproval, PurgeOutcome, QueueInfo, QueueStore,
    RaiseLimit, ResolutionRecord, ResolutionStore, ResolveCall, RetargetSession, SessionFilter,
    SessionRecord, SessionStatus, SessionStore, StoreBase, StoredMessage, TenantInfo, Wait,
    WorkEvents,
};
use durable_core::{CallId, SessionId, StoreError};

use crate::{
    BACKEND, MemoryStore, approvals, budget, checkpoints, family, journal, leases, maintenance,
    queues, sessions, signals,
};

#[async_trait]
impl StoreBase for MemoryStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn keyring(&self) -> &Keyring {
        self.ring()
    }

    async fn durability(&self) -> Result<Durability, StoreError> {
        Ok(maintenance::durability(self))
    }

    async fn now(&self) -> Result<i64, StoreError> {
        Ok(self.clock())
    }
}

#[async_trait]
impl SessionStore for MemoryStore {
    async fn create_session(&self, new: NewSession) -> Result<(SessionRecord, Lease), StoreError> {
        let created = sessions::create_session(self, new, None)?;
        self.work_available();
        Ok(created)
    }

    async fn session(&self, id: &SessionId) -> Result<SessionRecord, StoreError> {
        sessions::session(self, id)
    }

    async fn list_sessions(
        &self,
        filter: &SessionFilter,
    ) -> Result<Vec<SessionRecord>, StoreError> {
        sessions::list_sessions(self, filter)
    }

    async fn set_status(
        &self,
        fence: Fence<'_>,
        status: SessionStatus,
        reason: Option<&str>,
    ) -> Result<(), StoreError> {
        sessions::set_status(self, fence, status, reason)?;
        self.work_available();
        Ok(())
    }

    async fn create_child(
        &self,
        parent: &SessionId,
        new: NewSession,
    ) -> Result<(SessionRecord, Lease), StoreError> {
        let created = family::create_child(self, parent, new)?;
        self.work_available();
        Ok(created)
    }

    async fn children(&self, parent: &SessionId) -> Result<Vec<ChildRecord>, StoreError> {
        Ok(family::children(self, parent))
    }

    async fn cancel_session(
        &self,
        cancel: &CancelSession,
    ) -> Result<Vec<CancelledSession>, StoreError> {
        let cancelled = family::cancel_session(self, cancel)?;
        self.work_available();
        Ok(cancelled)
    }
}

#[async_trait]
impl LeaseStore for MemoryStore {
    async fn acquire_lease(
        &self,
        id: &SessionId,
        owner: &str,
        ttl: Duration,
        max_attempts: i32,
    ) -> Result<Lease, StoreError> {
        leases::acquire_lease(self, id, owner, ttl, max_attempts)
    }

    async fn renew_lease(&self, lease: &Lease, ttl: Duration) -> Result<Lease, StoreError> {
        leases::renew_lease(self, lease, ttl)
    }

    async fn release_lease(&self, lease: &Lease) -> Result<(), StoreError> {
        leases::release_lease(self, lease)?;
        self.work_available();
        Ok(())
    }

    async fn mark_running(&self, fence: Fence<'_>) -> Result<(), StoreError> {
        leases::mark_running(self, fence)
    }

    async fn mark_operator_needed(
        &self,
        fence: Fence<'_>,
        call: &CallId,
    ) -> Result<(), StoreError> {
        leases::mark_operator_needed(self, fence, call)?;
        // A parent waiting for this session may have been woken.
        self.work_available();
        Ok(())
    }

    async fn claim_expired(&self, claim: &Claim) -> Result<Option<Lease>, StoreError> {
        leases::claim_expired(self, claim)
    }

    async fn unpark_session(&self, id: &SessionId) -> Result<SessionRecord, StoreError> {
        let unparked = leases::unpark_session(self, id)?;
        self.work_available();
        Ok(unparked)
    }

    async fn list_expired(&self, limit: i64) -> Result<Vec<SessionRecord>, StoreError> {
        leases::list_expired(self, limit)
    }

    async fn wait(&self, fence: Fence<'_>, wait: &Wait) -> Result<bool, StoreError> {
        let waiting = family::wait(self, fence, wait)?;
        self.work_available();
        Ok(waiting)
    }
}

#[async_trait]
impl QueueStore for MemoryStore {
    async fn set_scheduling(
        &self,
        fence: Fence<'_>,
        scheduling: &durable_core::store::Scheduling,
    ) -> Result<(), StoreError> {
        leases::set_scheduling(self, fence, scheduling)
    }

    async fn set_tenant_limit(
        &self,
        tenant: &str,
        max_running: Option<u32>,
    ) -> Result<(), StoreError> {
        queues::set_tenant_limit(self, tenant, max_running)?;
        self.work_available();
        Ok(())
    }

    async fn set_queue_limit(
        &self,
        queue: &str,
        max_running: Option<u32>,
    ) -> Result<(), StoreError> {
        queues::set_queue_limit(self, queue, max_running)?;
        self.work_available();
        Ok(())
    }

    async fn queues(&self) -> Result<Vec<QueueInfo>, StoreError> {
        queues::queues(self)
    }

    async fn tenants(&self) -> Result<Vec<TenantInfo>, StoreError> {
        queues::tenants(self)
    }

    async fn next_wake_at(&self) -> Result<Option<i64>, StoreError> {
        queues::next_wake_at(self)
    }

    fn work_events(&self) -> Option<WorkEvents> {
        Some(self.inner.work.subscribe())
    }

    async fn wake_session(&self, id: &SessionId) -> Result<SessionRecord, StoreError> {
        let woken = queues::wake_session(self, id)?;
        self.work_available();
        Ok(woken)
    }
}

#[async_trait]
impl CheckpointLog for MemoryStore {
    async fn save_checkpoint(
        &self,
        fence: Fence<'_>,
        expected: i64,
        checkpoint: NewCheckpoint,
    ) -> Result<CheckpointMeta, StoreError> {
        checkpoints::save_checkpoint(self, fence, expected, checkpoint)
    }

    async fn complete_with_checkpoint(
        &self,
        fence: Fence<'_>,
        expected: i64,
        checkpoint: NewCheckpoint,
    ) -> Result<CheckpointMeta, StoreError> {
        let meta = checkpoints::complete_with_checkpoint(self, fence, expected, checkpoint)?;
        self.work_available();
        Ok(meta)
    }

    async fn load_checkpoint(
        &self,
        id: &SessionId,
        version: Option<i64>,
    ) -> Result<Checkpoint, StoreError> {
        checkpoints::load_checkpoint(self, id, version, None)
    }

    async fn load_checkpoint_window(
        &self,
        id: &SessionId,
        version: Option<i64>,
        window: usize,
    ) -> Result<Checkpoint, StoreError> {
        checkpoints::load_checkpoint(self, id, version, Some(window))
    }

    async fn messages(
        &self,
        id: &SessionId,
        from: i64,
        to: i64,
    ) -> Result<Vec<StoredMessage>, StoreError> {
        checkpoints::messages(self, id, from, to)
    }

    async fn list_checkpoints(&self, id: &SessionId) -> Result<Vec<CheckpointMeta>, StoreError> {
        checkpoints::list_checkpoints(self, id)
    }

    async fn fork_session_with(
        &self,
        fork: &ForkSession,
    ) -> Result<(SessionRecord, Lease), StoreError> {
        checkpoints::fork_session(self, fork)
    }
}

#[async_trait]
impl JournalStore for MemoryStore {
    async fn issue_call(
        &self,
        fence: Fence<'_>,
        call: NewCall,
    ) -> Result<IssueOutcome, StoreError> {
        journal::insert(self, fence, call, None, None)
    }

    async fn record_call(
        &self,
        fence: Fence<'_>,
        call: NewCall,
        finish: FinishCall,
    ) -> Result<IssueOutcome, StoreError> {
        journal::insert(self, fence, call, Some(finish), None)
    }

    async fn reissue_call(
        &self,
        fence: Fence<'_>,
        call: &CallId,
    ) -> Result<CallRecord, StoreError> {
        journal::reissue(self, fence, call, None)
    }

    async fn issue_approved(
        &self,
        fence: Fence<'_>,
        call: &CallId,
        key: Option<EditedKey>,
    ) -> Result<CallRecord, StoreError> {
        journal::reissue(self, fence, call, Some(key))
    }

    async fn finish_call(
        &self,
        fence: Fence<'_>,
        call: &CallId,
        finish: FinishCall,
        checkpoint: Option<(i64, NewCheckpoint)>,
    ) -> Result<Option<CheckpointMeta>, StoreError> {
        journal::finish_call(self, fence, call, finish, checkpoint)
    }

    async fn call(&self, id: &CallId) -> Result<CallRecord, StoreError> {
        journal::call(self, id)
    }

    async fn calls(
        &self,
        session: &SessionId,
        step: Option<i64>,
    ) -> Result<Vec<CallRecord>, StoreError> {
        journal::calls(self, session, step)
    }

    async fn in_doubt(&self, session: Option<&SessionId>) -> Result<Vec<CallRecord>, StoreError> {
        journal::in_doubt(self, session)
    }
}

#[async_trait]
impl ResolutionStore for MemoryStore {
    async fn resolve_call(&self, resolve: ResolveCall) -> Result<CallRecord, StoreError> {
        let resolved = journal::resolve_call(self, resolve)?;
        self.work_available();
        Ok(resolved)
    }

    async fn resolutions(&self, session: &SessionId) -> Result<Vec<ResolutionRecord>, StoreError> {
        journal::resolutions(self, session)
    }
}

#[async_trait]
impl ApprovalStore for MemoryStore {
    async fn request_call(
        &self,
        fence: Fence<'_>,
        call: NewCall,
        request: ApprovalRequest,
    ) -> Result<IssueOutcome, StoreError> {
        approvals::request_call(self, fence, call, request)
    }

    async fn decide_approval(&self, decide: DecideApproval) -> Result<CallRecord, StoreError> {
        let decided = approvals::decide_approval(self, decide)?;
        self.work_available();
        Ok(decided)
    }

    async fn pending_approvals(
        &self,
        session: Option<&SessionId>,
    ) -> Result<Vec<PendingApproval>, StoreError> {
        approvals::pending_approvals(self, session)
    }

    async fn approvals(&self, session: &SessionId) -> Result<Vec<ApprovalRecord>, StoreError> {
        approvals::approvals(self, session)
    }
}

#[async_trait]
impl MaintenanceStore for MemoryStore {
    async fn record_error(&self, error: NewError) -> Result<(), StoreError> {
        maintenance::record_error(self, error)
    }

    async fn errors(&self, session: &SessionId) -> Result<Vec<ErrorRecord>, StoreError> {
        Ok(maintenance::errors(self, session))
    }

    async fn retarget_session(
        &self,
        migrate: RetargetSession,
    ) -> Result<SessionRecord, StoreError> {
        maintenance::retarget_session(self, migrate)
    }

    async fn purge_session(
        &self,
        id: &SessionId,
        retention: Duration,
    ) -> Result<PurgeOutcome, StoreError> {
        maintenance::purge_session(self, id, retention)
    }
}

#[async_trait]
impl durable_core::store::LimiterStore for MemoryStore {
    async fn define_limit(
        &self,
        name: &str,
        limit: &durable_core::limiter::RateLimit,
    ) -> Result<durable_core::limiter::Defined, StoreError> {
        crate::limiter::define_limit(self, name, limit)
    }

    async fn acquire_limit(
        &self,
        acquire: &durable_core::limiter::Acquire,
    ) -> Result<durable_core::limiter::Admission, StoreError> {
        crate::limiter::acquire_limit(self, acquire)
    }

    async fn charge_limit(&self, name: &str, tokens: u64) -> Result<(), StoreError> {
        crate::limiter::charge_limit(self, name, tokens)
    }

    async fn throttle_limit(&self, name: &str, retry_after: Duration) -> Result<i64, StoreError> {
        crate::limiter::throttle_limit(self, name, retry_after)
    }

    async fn limiters(&self) -> Result<Vec<durable_core::limiter::LimiterInfo>, StoreError> {
        crate::limiter::limiters(self)
    }
}

#[async_trait]
impl BudgetStore for MemoryStore {
    async fn raise_limit(&self, raise: RaiseLimit) -> Result<LimitRaise, StoreError> {
        budget::raise_limit(self, raise)
    }

    async fn limit_raises(&self, session: &SessionId) -> Result<Vec<LimitRaise>, StoreError> {
        Ok(budget::limit_raises(self, session))
    }
}

#[async_trait]
impl durable_core::store::SignalStore for MemoryStore {
    async fn send_signal(
        &self,
        signal: &durable_core::store::NewSignal,
    ) -> Result<durable_core::store::SignalRecord, StoreError> {
        let sent = signals::send_signal(self, signal)?;
        self.work_available();
        Ok(sent)
    }

    async fn consume_signal(
        &self,
        fence: Fence<'_>,
        name: &str,
        consumer: &str,
    ) -> Result<Option<durable_core::store::SignalRecord>, StoreError> {
        signals::consume_signal(self, fence, name, consumer)
    }

    async fn signals(
        &self,
        session: &SessionId,
    ) -> Result<Vec<durable_core::store::SignalRecord>, StoreError> {
        signals::signals(self, session)
    }
}
