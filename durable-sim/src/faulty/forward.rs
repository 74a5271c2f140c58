//! [`Faulty`]'s forwarding: every method of [`CheckpointStore`], in the trait's order,
//! through [`Faulty::faulted`] with the fenced write it makes and the lease it grants.

use std::time::Duration;

use async_trait::async_trait;
use durable_core::store::{
    ApprovalRecord, ApprovalRequest, ApprovalStore, CallRecord, Checkpoint, CheckpointLog,
    CheckpointMeta, Claim, DecideApproval, Durability, EditedKey, ErrorRecord, Fence, FinishCall,
    ForkSession, IssueOutcome, JournalStore, Lease, LeaseStore, ListedSession, MaintenanceStore,
    NewCall, NewCheckpoint, NewError, NewSession, PendingApproval, PurgeOutcome, QueueInfo,
    QueueStore, ResolutionRecord, ResolutionStore, ResolveCall, RetargetSession, SessionFilter,
    SessionRecord, SessionStatus, SessionStore, StoreBase, StoredMessage, TenantInfo, WorkEvents,
};
use durable_core::{CallId, SessionId, StoreError};

use super::{Faulty, fence_of, none};

fn lease_granted(lease: &Lease) -> Option<(SessionId, i64)> {
    Some((lease.session.clone(), lease.fence))
}

fn created(created: &(SessionRecord, Lease)) -> Option<(SessionId, i64)> {
    lease_granted(&created.1)
}

fn claimed(claimed: &Option<Lease>) -> Option<(SessionId, i64)> {
    claimed.as_ref().and_then(lease_granted)
}

#[async_trait]
impl StoreBase for Faulty {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    fn keyring(&self) -> &durable_core::integrity::Keyring {
        self.inner.keyring()
    }

    async fn durability(&self) -> Result<Durability, StoreError> {
        self.faulted("durability", None, none, self.inner.durability())
            .await
    }

    async fn now(&self) -> Result<i64, StoreError> {
        self.faulted("now", None, none, self.inner.now()).await
    }
}

#[async_trait]
impl SessionStore for Faulty {
    async fn create_session(&self, new: NewSession) -> Result<(SessionRecord, Lease), StoreError> {
        self.faulted(
            "create_session",
            None,
            created,
            self.inner.create_session(new),
        )
        .await
    }

    async fn session(&self, id: &SessionId) -> Result<SessionRecord, StoreError> {
        self.faulted("session", None, none, self.inner.session(id))
            .await
    }

    async fn list_sessions(
        &self,
        filter: &SessionFilter,
    ) -> Result<Vec<SessionRecord>, StoreError> {
        self.faulted(
            "list_sessions",
            None,
            none,
            self.inner.list_sessions(filter),
        )
        .await
    }

    async fn list_session_rows(
        &self,
        filter: &SessionFilter,
    ) -> Result<Vec<ListedSession>, StoreError> {
        self.faulted(
            "list_session_rows",
            None,
            none,
            self.inner.list_session_rows(filter),
        )
        .await
    }

    async fn set_status(
        &self,
        fence: Fence<'_>,
        status: SessionStatus,
        reason: Option<&str>,
    ) -> Result<(), StoreError> {
        self.faulted(
            "set_status",
            fence_of(fence),
            none,
            self.inner.set_status(fence, status, reason),
        )
        .await
    }

    async fn create_child(
        &self,
        parent: &SessionId,
        new: NewSession,
    ) -> Result<(SessionRecord, Lease), StoreError> {
        self.faulted(
            "create_child",
            None,
            created,
            self.inner.create_child(parent, new),
        )
        .await
    }

    async fn children(
        &self,
        parent: &SessionId,
    ) -> Result<Vec<durable_core::store::ChildRecord>, StoreError> {
        self.faulted("children", None, none, self.inner.children(parent))
            .await
    }

    async fn cancel_session(
        &self,
        cancel: &durable_core::store::CancelSession,
    ) -> Result<Vec<durable_core::store::CancelledSession>, StoreError> {
        self.faulted(
            "cancel_session",
            None,
            none,
            self.inner.cancel_session(cancel),
        )
        .await
    }
}

#[async_trait]
impl LeaseStore for Faulty {
    async fn acquire_lease(
        &self,
        id: &SessionId,
        owner: &str,
        ttl: Duration,
        max_attempts: i32,
    ) -> Result<Lease, StoreError> {
        self.faulted(
            "acquire_lease",
            None,
            lease_granted,
            self.inner.acquire_lease(id, owner, ttl, max_attempts),
        )
        .await
    }

    async fn renew_lease(&self, lease: &Lease, ttl: Duration) -> Result<Lease, StoreError> {
        self.faulted(
            "renew_lease",
            Some((&lease.session, lease.fence)),
            none,
            self.inner.renew_lease(lease, ttl),
        )
        .await
    }

    async fn release_lease(&self, lease: &Lease) -> Result<(), StoreError> {
        // A no-op for a stale token by contract: not a fenced write.
        self.faulted("release_lease", None, none, self.inner.release_lease(lease))
            .await
    }

    async fn mark_running(&self, fence: Fence<'_>) -> Result<(), StoreError> {
        self.faulted(
            "mark_running",
            fence_of(fence),
            none,
            self.inner.mark_running(fence),
        )
        .await
    }

    async fn mark_operator_needed(
        &self,
        fence: Fence<'_>,
        call: &CallId,
    ) -> Result<(), StoreError> {
        self.faulted(
            "mark_operator_needed",
            fence_of(fence),
            none,
            self.inner.mark_operator_needed(fence, call),
        )
        .await
    }

    async fn claim_expired(&self, claim: &Claim) -> Result<Option<Lease>, StoreError> {
        self.faulted(
            "claim_expired",
            None,
            claimed,
            self.inner.claim_expired(claim),
        )
        .await
    }

    async fn unpark_session(&self, id: &SessionId) -> Result<SessionRecord, StoreError> {
        self.faulted("unpark_session", None, none, self.inner.unpark_session(id))
            .await
    }

    async fn list_expired(&self, limit: i64) -> Result<Vec<SessionRecord>, StoreError> {
        self.faulted("list_expired", None, none, self.inner.list_expired(limit))
            .await
    }

    async fn wait(
        &self,
        fence: Fence<'_>,
        wait: &durable_core::store::Wait,
    ) -> Result<bool, StoreError> {
        self.faulted("wait", fence_of(fence), none, self.inner.wait(fence, wait))
            .await
    }
}

#[async_trait]
impl QueueStore for Faulty {
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
        self.faulted(
            "set_queue_limit",
            None,
            none,
            self.inner.set_queue_limit(queue, max_running),
        )
        .await
    }

    async fn tenants(&self) -> Result<Vec<TenantInfo>, StoreError> {
        self.faulted("tenants", None, none, self.inner.tenants())
            .await
    }

    async fn queues(&self) -> Result<Vec<QueueInfo>, StoreError> {
        self.faulted("queues", None, none, self.inner.queues())
            .await
    }

    async fn next_wake_at(&self) -> Result<Option<i64>, StoreError> {
        self.faulted("next_wake_at", None, none, self.inner.next_wake_at())
            .await
    }

    fn work_events(&self) -> Option<WorkEvents> {
        // Off in deterministic runs: tokio's watch channel, under the notifications, wakes
        // its waiters in an order drawn from the runtime's own random generator. Pools
        // poll instead (the store's contract: notifications are a speed-up only).
        if self.notifications {
            self.inner.work_events()
        } else {
            None
        }
    }

    async fn wake_session(&self, id: &SessionId) -> Result<SessionRecord, StoreError> {
        self.faulted("wake_session", None, none, self.inner.wake_session(id))
            .await
    }
}

#[async_trait]
impl CheckpointLog for Faulty {
    async fn save_checkpoint(
        &self,
        fence: Fence<'_>,
        expected: i64,
        checkpoint: NewCheckpoint,
    ) -> Result<CheckpointMeta, StoreError> {
        self.faulted(
            "save_checkpoint",
            fence_of(fence),
            none,
            self.inner.save_checkpoint(fence, expected, checkpoint),
        )
        .await
    }

    async fn complete_with_checkpoint(
        &self,
        fence: Fence<'_>,
        expected: i64,
        checkpoint: NewCheckpoint,
    ) -> Result<CheckpointMeta, StoreError> {
        self.faulted(
            "complete_with_checkpoint",
            fence_of(fence),
            none,
            self.inner
                .complete_with_checkpoint(fence, expected, checkpoint),
        )
        .await
    }

    async fn load_checkpoint(
        &self,
        id: &SessionId,
        version: Option<i64>,
    ) -> Result<Checkpoint, StoreError> {
        self.faulted(
            "load_checkpoint",
            None,
            none,
            self.inner.load_checkpoint(id, version),
        )
        .await
    }

    async fn load_checkpoint_window(
        &self,
        id: &SessionId,
        version: Option<i64>,
        window: usize,
    ) -> Result<Checkpoint, StoreError> {
        self.faulted(
            "load_checkpoint_window",
            None,
            none,
            self.inner.load_checkpoint_window(id, version, window),
        )
        .await
    }

    async fn messages(
        &self,
        id: &SessionId,
        from: i64,
        to: i64,
    ) -> Result<Vec<StoredMessage>, StoreError> {
        self.faulted("messages", None, none, self.inner.messages(id, from, to))
            .await
    }

    async fn list_checkpoints(&self, id: &SessionId) -> Result<Vec<CheckpointMeta>, StoreError> {
        self.faulted(
            "list_checkpoints",
            None,
            none,
            self.inner.list_checkpoints(id),
        )
        .await
    }

    async fn fork_session_with(
        &self,
        fork: &ForkSession,
    ) -> Result<(SessionRecord, Lease), StoreError> {
        self.faulted(
            "fork_session_with",
            None,
            created,
            self.inner.fork_session_with(fork),
        )
        .await
    }
}

#[async_trait]
impl JournalStore for Faulty {
    async fn issue_call(
        &self,
        fence: Fence<'_>,
        call: NewCall,
    ) -> Result<IssueOutcome, StoreError> {
        self.faulted(
            "issue_call",
            fence_of(fence),
            none,
            self.inner.issue_call(fence, call),
        )
        .await
    }

    async fn record_call(
        &self,
        fence: Fence<'_>,
        call: NewCall,
        finish: FinishCall,
    ) -> Result<IssueOutcome, StoreError> {
        self.faulted(
            "record_call",
            fence_of(fence),
            none,
            self.inner.record_call(fence, call, finish),
        )
        .await
    }

    async fn reissue_call(
        &self,
        fence: Fence<'_>,
        call: &CallId,
    ) -> Result<CallRecord, StoreError> {
        self.faulted(
            "reissue_call",
            fence_of(fence),
            none,
            self.inner.reissue_call(fence, call),
        )
        .await
    }

    async fn issue_approved(
        &self,
        fence: Fence<'_>,
        call: &CallId,
        key: Option<EditedKey>,
    ) -> Result<CallRecord, StoreError> {
        self.faulted(
            "issue_approved",
            fence_of(fence),
            none,
            self.inner.issue_approved(fence, call, key),
        )
        .await
    }

    async fn finish_call(
        &self,
        fence: Fence<'_>,
        call: &CallId,
        finish: FinishCall,
        checkpoint: Option<(i64, NewCheckpoint)>,
    ) -> Result<Option<CheckpointMeta>, StoreError> {
        self.faulted(
            "finish_call",
            fence_of(fence),
            none,
            self.inner.finish_call(fence, call, finish, checkpoint),
        )
        .await
    }

    async fn call(&self, id: &CallId) -> Result<CallRecord, StoreError> {
        self.faulted("call", None, none, self.inner.call(id)).await
    }

    async fn calls(
        &self,
        session: &SessionId,
        step: Option<i64>,
    ) -> Result<Vec<CallRecord>, StoreError> {
        self.faulted("calls", None, none, self.inner.calls(session, step))
            .await
    }

    async fn calls_page(
        &self,
        session: &SessionId,
        after: i64,
        limit: i64,
    ) -> Result<Vec<CallRecord>, StoreError> {
        self.faulted(
            "calls_page",
            None,
            none,
            self.inner.calls_page(session, after, limit),
        )
        .await
    }

    async fn issued_calls(&self, session: &SessionId) -> Result<Vec<CallRecord>, StoreError> {
        self.faulted("issued_calls", None, none, self.inner.issued_calls(session))
            .await
    }

    async fn in_doubt(&self, session: Option<&SessionId>) -> Result<Vec<CallRecord>, StoreError> {
        self.faulted("in_doubt", None, none, self.inner.in_doubt(session))
            .await
    }
}

#[async_trait]
impl ResolutionStore for Faulty {
    async fn resolve_call(&self, resolve: ResolveCall) -> Result<CallRecord, StoreError> {
        self.faulted("resolve_call", None, none, self.inner.resolve_call(resolve))
            .await
    }

    async fn resolutions(&self, session: &SessionId) -> Result<Vec<ResolutionRecord>, StoreError> {
        self.faulted("resolutions", None, none, self.inner.resolutions(session))
            .await
    }
}

#[async_trait]
impl ApprovalStore for Faulty {
    async fn request_call(
        &self,
        fence: Fence<'_>,
        call: NewCall,
        request: ApprovalRequest,
    ) -> Result<IssueOutcome, StoreError> {
        self.faulted(
            "request_call",
            fence_of(fence),
            none,
            self.inner.request_call(fence, call, request),
        )
        .await
    }

    async fn decide_approval(&self, decide: DecideApproval) -> Result<CallRecord, StoreError> {
        self.faulted(
            "decide_approval",
            None,
            none,
            self.inner.decide_approval(decide),
        )
        .await
    }

    async fn pending_approvals(
        &self,
        session: Option<&SessionId>,
    ) -> Result<Vec<PendingApproval>, StoreError> {
        self.faulted(
            "pending_approvals",
            None,
            none,
            self.inner.pending_approvals(session),
        )
        .await
    }

    async fn approvals(&self, session: &SessionId) -> Result<Vec<ApprovalRecord>, StoreError> {
        self.faulted("approvals", None, none, self.inner.approvals(session))
            .await
    }
}

#[async_trait]
impl MaintenanceStore for Faulty {
    async fn record_error(&self, error: NewError) -> Result<(), StoreError> {
        self.faulted("record_error", None, none, self.inner.record_error(error))
            .await
    }

    async fn errors(&self, session: &SessionId) -> Result<Vec<ErrorRecord>, StoreError> {
        self.faulted("errors", None, none, self.inner.errors(session))
            .await
    }

    async fn retarget_session(
        &self,
        migrate: RetargetSession,
    ) -> Result<SessionRecord, StoreError> {
        self.faulted(
            "retarget_session",
            None,
            none,
            self.inner.retarget_session(migrate),
        )
        .await
    }

    async fn purge_session(
        &self,
        id: &SessionId,
        retention: Duration,
    ) -> Result<PurgeOutcome, StoreError> {
        self.faulted(
            "purge_session",
            None,
            none,
            self.inner.purge_session(id, retention),
        )
        .await
    }
}

#[async_trait]
impl durable_core::store::LimiterStore for Faulty {
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
impl durable_core::store::BudgetStore for Faulty {
    async fn raise_limit(
        &self,
        raise: durable_core::store::RaiseLimit,
    ) -> Result<durable_core::store::LimitRaise, StoreError> {
        self.faulted("raise_limit", None, none, self.inner.raise_limit(raise))
            .await
    }

    async fn limit_raises(
        &self,
        session: &SessionId,
    ) -> Result<Vec<durable_core::store::LimitRaise>, StoreError> {
        self.faulted("limit_raises", None, none, self.inner.limit_raises(session))
            .await
    }
}

#[async_trait]
impl durable_core::store::SignalStore for Faulty {
    async fn send_signal(
        &self,
        signal: &durable_core::store::NewSignal,
    ) -> Result<durable_core::store::SignalRecord, StoreError> {
        self.faulted("send_signal", None, none, self.inner.send_signal(signal))
            .await
    }

    async fn consume_signal(
        &self,
        fence: Fence<'_>,
        name: &str,
        consumer: &str,
    ) -> Result<Option<durable_core::store::SignalRecord>, StoreError> {
        self.faulted(
            "consume_signal",
            fence_of(fence),
            none,
            self.inner.consume_signal(fence, name, consumer),
        )
        .await
    }

    async fn signals(
        &self,
        session: &SessionId,
    ) -> Result<Vec<durable_core::store::SignalRecord>, StoreError> {
        self.inner.signals(session).await
    }
}
