//! The [`CheckpointStore`] implementation of [`PostgresStore`]: each method is one call
//! into the module named after its part of the conformance suite (`sessions`, `leases`,
//! `checkpoints`, `journal`, `resolution`, `approval`, `maintenance`).
//!
//! Every fenced write checks the fencing token while its session row is locked: the
//! journal writes and checkpoints first as one statement that writes only if the session
//! is as an unlocked read found it (`journal::fast`, `checkpoints::fast`), else in a
//! transaction that locks the row first ([`lock_fenced`](crate::tx::lock_fenced)). Reads
//! are one statement each where they can be (one snapshot); the others run in one
//! `REPEATABLE READ` snapshot ([`begin_snapshot`](crate::tx::begin_snapshot)).

use std::time::Duration;

use async_trait::async_trait;
use durable_core::integrity::Keyring;
use durable_core::store::{
    ApprovalRecord, ApprovalRequest, CallRecord, Checkpoint, CheckpointMeta, Claim, DecideApproval,
    Durability, EditedKey, ErrorRecord, Fence, FinishCall, ForkSession, IssueOutcome, Lease,
    NewCall, NewCheckpoint, NewError, NewSession, PendingApproval, PurgeOutcome, QueueInfo,
    ResolutionRecord, ResolveCall, RetargetSession, SessionFilter, SessionRecord, SessionStatus,
    StoredMessage, WorkEvents,
};
use durable_core::{CallId, CheckpointStore, SessionId, StoreError};

use crate::error::BACKEND;
use crate::{
    PostgresStore, approval, checkpoints, journal, leases, maintenance, queues, resolution,
    sessions,
};

#[async_trait]
impl CheckpointStore for PostgresStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn keyring(&self) -> &Keyring {
        PostgresStore::keyring(self)
    }

    async fn durability(&self) -> Result<Durability, StoreError> {
        maintenance::durability(self).await
    }

    async fn now(&self) -> Result<i64, StoreError> {
        maintenance::now(self).await
    }

    async fn create_session(&self, new: NewSession) -> Result<(SessionRecord, Lease), StoreError> {
        let created = sessions::create_session(self, new).await?;
        self.work_available();
        Ok(created)
    }

    async fn session(&self, id: &SessionId) -> Result<SessionRecord, StoreError> {
        sessions::session(self, id).await
    }

    async fn list_sessions(
        &self,
        filter: &SessionFilter,
    ) -> Result<Vec<SessionRecord>, StoreError> {
        sessions::list_sessions(self, filter).await
    }

    async fn list_session_rows(
        &self,
        filter: &SessionFilter,
    ) -> Result<Vec<durable_core::store::ListedSession>, StoreError> {
        sessions::list_session_rows(self, filter).await
    }

    async fn acquire_lease(
        &self,
        id: &SessionId,
        owner: &str,
        ttl: Duration,
        max_attempts: i32,
    ) -> Result<Lease, StoreError> {
        leases::acquire_lease(self, id, owner, ttl, max_attempts).await
    }

    async fn renew_lease(&self, lease: &Lease, ttl: Duration) -> Result<Lease, StoreError> {
        leases::renew_lease(self, lease, ttl).await
    }

    async fn release_lease(&self, lease: &Lease) -> Result<(), StoreError> {
        leases::release_lease(self, lease).await?;
        self.work_available();
        Ok(())
    }

    async fn mark_running(&self, fence: Fence<'_>) -> Result<(), StoreError> {
        leases::mark_running(self, fence).await
    }

    async fn mark_operator_needed(
        &self,
        fence: Fence<'_>,
        call: &CallId,
    ) -> Result<(), StoreError> {
        leases::mark_operator_needed(self, fence, call).await
    }

    async fn claim_expired(&self, claim: &Claim) -> Result<Option<Lease>, StoreError> {
        leases::claim_expired(self, claim).await
    }

    async fn set_queue_limit(
        &self,
        queue: &str,
        max_running: Option<u32>,
    ) -> Result<(), StoreError> {
        queues::set_queue_limit(self, queue, max_running).await?;
        self.work_available();
        Ok(())
    }

    async fn queues(&self) -> Result<Vec<QueueInfo>, StoreError> {
        queues::queues(self).await
    }

    async fn next_wake_at(&self) -> Result<Option<i64>, StoreError> {
        queues::next_wake_at(self).await
    }

    fn work_events(&self) -> Option<WorkEvents> {
        Some(self.work_subscribe())
    }

    async fn wake_session(&self, id: &SessionId) -> Result<SessionRecord, StoreError> {
        let record = queues::wake_session(self, id).await?;
        self.work_available();
        Ok(record)
    }

    async fn unpark_session(&self, id: &SessionId) -> Result<SessionRecord, StoreError> {
        let record = leases::unpark_session(self, id).await?;
        self.work_available();
        Ok(record)
    }

    async fn list_expired(&self, limit: i64) -> Result<Vec<SessionRecord>, StoreError> {
        leases::list_expired(self, limit).await
    }

    async fn set_status(
        &self,
        fence: Fence<'_>,
        status: SessionStatus,
        reason: Option<&str>,
    ) -> Result<(), StoreError> {
        sessions::set_status(self, fence, status, reason).await?;
        // The lease is given up: for a session still active, or a place in its queue.
        self.work_available();
        Ok(())
    }

    async fn save_checkpoint(
        &self,
        fence: Fence<'_>,
        expected: i64,
        checkpoint: NewCheckpoint,
    ) -> Result<CheckpointMeta, StoreError> {
        checkpoints::save_checkpoint(self, fence, expected, checkpoint).await
    }

    async fn load_checkpoint(
        &self,
        id: &SessionId,
        version: Option<i64>,
    ) -> Result<Checkpoint, StoreError> {
        checkpoints::load_checkpoint(self, id, version).await
    }

    async fn load_checkpoint_window(
        &self,
        id: &SessionId,
        version: Option<i64>,
        window: usize,
    ) -> Result<Checkpoint, StoreError> {
        checkpoints::load_checkpoint_window(self, id, version, Some(window)).await
    }

    async fn messages(
        &self,
        id: &SessionId,
        from: i64,
        to: i64,
    ) -> Result<Vec<StoredMessage>, StoreError> {
        checkpoints::messages(self, id, from, to).await
    }

    async fn list_checkpoints(&self, id: &SessionId) -> Result<Vec<CheckpointMeta>, StoreError> {
        checkpoints::list_checkpoints(self, id).await
    }

    async fn fork_session_with(
        &self,
        fork: &ForkSession,
    ) -> Result<(SessionRecord, Lease), StoreError> {
        checkpoints::fork_session(self, fork).await
    }

    async fn issue_call(
        &self,
        fence: Fence<'_>,
        call: NewCall,
    ) -> Result<IssueOutcome, StoreError> {
        journal::issue_call(self, fence, call).await
    }

    async fn record_call(
        &self,
        fence: Fence<'_>,
        call: NewCall,
        finish: FinishCall,
    ) -> Result<IssueOutcome, StoreError> {
        journal::record_call(self, fence, call, finish).await
    }

    async fn reissue_call(
        &self,
        fence: Fence<'_>,
        call: &CallId,
    ) -> Result<CallRecord, StoreError> {
        journal::reissue_call(self, fence, call, None).await
    }

    async fn issue_approved(
        &self,
        fence: Fence<'_>,
        call: &CallId,
        key: Option<EditedKey>,
    ) -> Result<CallRecord, StoreError> {
        journal::reissue_call(self, fence, call, Some(key)).await
    }

    async fn finish_call(
        &self,
        fence: Fence<'_>,
        call: &CallId,
        finish: FinishCall,
        checkpoint: Option<(i64, NewCheckpoint)>,
    ) -> Result<Option<CheckpointMeta>, StoreError> {
        journal::finish_call(self, fence, call, finish, checkpoint).await
    }

    async fn call(&self, id: &CallId) -> Result<CallRecord, StoreError> {
        journal::call(self, id).await
    }

    async fn calls(
        &self,
        session: &SessionId,
        step: Option<i64>,
    ) -> Result<Vec<CallRecord>, StoreError> {
        journal::calls(self, session, step).await
    }

    async fn calls_page(
        &self,
        session: &SessionId,
        after: i64,
        limit: i64,
    ) -> Result<Vec<CallRecord>, StoreError> {
        journal::calls_page(self, session, after, limit).await
    }

    async fn issued_calls(&self, session: &SessionId) -> Result<Vec<CallRecord>, StoreError> {
        journal::issued_calls(self, session).await
    }

    async fn in_doubt(&self, session: Option<&SessionId>) -> Result<Vec<CallRecord>, StoreError> {
        journal::in_doubt(self, session).await
    }

    async fn resolve_call(&self, resolve: ResolveCall) -> Result<CallRecord, StoreError> {
        let row = resolution::resolve_call(self, resolve).await?;
        self.work_available();
        Ok(row)
    }

    async fn resolutions(&self, session: &SessionId) -> Result<Vec<ResolutionRecord>, StoreError> {
        resolution::resolutions(self, session).await
    }

    async fn request_call(
        &self,
        fence: Fence<'_>,
        call: NewCall,
        request: ApprovalRequest,
    ) -> Result<IssueOutcome, StoreError> {
        approval::request_call(self, fence, call, request).await
    }

    async fn decide_approval(&self, decide: DecideApproval) -> Result<CallRecord, StoreError> {
        let row = approval::decide_approval(self, decide).await?;
        self.work_available();
        Ok(row)
    }

    async fn pending_approvals(
        &self,
        session: Option<&SessionId>,
    ) -> Result<Vec<PendingApproval>, StoreError> {
        approval::pending_approvals(self, session).await
    }

    async fn approvals(&self, session: &SessionId) -> Result<Vec<ApprovalRecord>, StoreError> {
        approval::approvals(self, session).await
    }

    async fn record_error(&self, error: NewError) -> Result<(), StoreError> {
        maintenance::record_error(self, error).await
    }

    async fn errors(&self, session: &SessionId) -> Result<Vec<ErrorRecord>, StoreError> {
        maintenance::errors(self, session).await
    }

    async fn retarget_session(
        &self,
        migrate: RetargetSession,
    ) -> Result<SessionRecord, StoreError> {
        maintenance::retarget_session(self, migrate).await
    }

    async fn purge_session(
        &self,
        id: &SessionId,
        retention: Duration,
    ) -> Result<PurgeOutcome, StoreError> {
        maintenance::purge_session(self, id, retention).await
    }
}
