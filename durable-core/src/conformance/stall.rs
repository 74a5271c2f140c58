//! A store decorator that lets a runtime case interrupt a checkpoint deterministically.
//!
//! [`StallCheckpoints`] passes every call through to the real store it wraps. Its one
//! twist: once armed, `save_checkpoint` performs the real write and then parks forever
//! instead of returning, after waking whoever waits on [`StallCheckpoints::stalled`]. A
//! case can then drop the checkpoint future at a known point (the write committed, the
//! reply never arrived) instead of racing a timer against the store's I/O.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Notify;

use crate::error::StoreError;
use crate::ids::{CallId, SessionId};
use crate::store::{
    CallRecord, Checkpoint, CheckpointMeta, CheckpointStore, Durability, ErrorRecord, Fence,
    FinishCall, IssueOutcome, Lease, MigrateSession, NewCall, NewCheckpoint, NewError, NewSession,
    PurgeOutcome, ResolutionRecord, ResolveCall, SessionFilter, SessionRecord, SessionStatus,
};

/// Wraps a real store; see the module docs.
pub(super) struct StallCheckpoints {
    inner: Arc<dyn CheckpointStore>,
    armed: AtomicBool,
    stalled: Notify,
}

impl StallCheckpoints {
    pub(super) fn new(inner: Arc<dyn CheckpointStore>) -> Arc<Self> {
        Arc::new(Self {
            inner,
            armed: AtomicBool::new(false),
            stalled: Notify::new(),
        })
    }

    /// The next `save_checkpoint` writes, then parks instead of returning.
    pub(super) fn arm(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }

    /// Resolves once an armed `save_checkpoint` has written and parked.
    pub(super) async fn stalled(&self) {
        self.stalled.notified().await;
    }
}

#[async_trait]
impl CheckpointStore for StallCheckpoints {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    async fn durability(&self) -> Result<Durability, StoreError> {
        self.inner.durability().await
    }

    async fn now(&self) -> Result<i64, StoreError> {
        self.inner.now().await
    }

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

    async fn acquire_lease(
        &self,
        id: &SessionId,
        owner: &str,
        ttl: Duration,
    ) -> Result<Lease, StoreError> {
        self.inner.acquire_lease(id, owner, ttl).await
    }

    async fn renew_lease(&self, lease: &Lease, ttl: Duration) -> Result<Lease, StoreError> {
        self.inner.renew_lease(lease, ttl).await
    }

    async fn release_lease(&self, lease: &Lease) -> Result<(), StoreError> {
        self.inner.release_lease(lease).await
    }

    async fn claim_expired(
        &self,
        owner: &str,
        ttl: Duration,
        max_attempts: i32,
    ) -> Result<Option<Lease>, StoreError> {
        self.inner.claim_expired(owner, ttl, max_attempts).await
    }

    async fn unpark_session(&self, id: &SessionId) -> Result<SessionRecord, StoreError> {
        self.inner.unpark_session(id).await
    }

    async fn list_expired(&self, limit: i64) -> Result<Vec<SessionRecord>, StoreError> {
        self.inner.list_expired(limit).await
    }

    async fn set_status(
        &self,
        fence: Fence<'_>,
        status: SessionStatus,
        reason: Option<&str>,
    ) -> Result<(), StoreError> {
        self.inner.set_status(fence, status, reason).await
    }

    async fn save_checkpoint(
        &self,
        fence: Fence<'_>,
        expected: i64,
        checkpoint: NewCheckpoint,
    ) -> Result<CheckpointMeta, StoreError> {
        let saved = self
            .inner
            .save_checkpoint(fence, expected, checkpoint)
            .await;
        if self.armed.swap(false, Ordering::SeqCst) {
            self.stalled.notify_one();
            std::future::pending::<()>().await;
        }
        saved
    }

    async fn load_checkpoint(
        &self,
        id: &SessionId,
        version: Option<i64>,
    ) -> Result<Checkpoint, StoreError> {
        self.inner.load_checkpoint(id, version).await
    }

    async fn list_checkpoints(&self, id: &SessionId) -> Result<Vec<CheckpointMeta>, StoreError> {
        self.inner.list_checkpoints(id).await
    }

    async fn fork_session(
        &self,
        id: &SessionId,
        version: i64,
        new_id: &SessionId,
        owner: &str,
        ttl: Duration,
    ) -> Result<(SessionRecord, Lease), StoreError> {
        self.inner
            .fork_session(id, version, new_id, owner, ttl)
            .await
    }

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

    async fn finish_call(
        &self,
        fence: Fence<'_>,
        call: &CallId,
        finish: FinishCall,
        checkpoint: Option<(i64, NewCheckpoint)>,
    ) -> Result<Option<CheckpointMeta>, StoreError> {
        self.inner
            .finish_call(fence, call, finish, checkpoint)
            .await
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

    async fn in_doubt(&self, session: Option<&SessionId>) -> Result<Vec<CallRecord>, StoreError> {
        self.inner.in_doubt(session).await
    }

    async fn resolve_call(&self, resolve: ResolveCall) -> Result<CallRecord, StoreError> {
        self.inner.resolve_call(resolve).await
    }

    async fn resolutions(&self, session: &SessionId) -> Result<Vec<ResolutionRecord>, StoreError> {
        self.inner.resolutions(session).await
    }

    async fn record_error(&self, error: NewError) -> Result<(), StoreError> {
        self.inner.record_error(error).await
    }

    async fn errors(&self, session: &SessionId) -> Result<Vec<ErrorRecord>, StoreError> {
        self.inner.errors(session).await
    }

    async fn migrate_session(&self, migrate: MigrateSession) -> Result<SessionRecord, StoreError> {
        self.inner.migrate_session(migrate).await
    }

    async fn purge_session(
        &self,
        id: &SessionId,
        retention: Duration,
    ) -> Result<PurgeOutcome, StoreError> {
        self.inner.purge_session(id, retention).await
    }
}
