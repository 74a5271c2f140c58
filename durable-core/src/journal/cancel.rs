//! Cancellation as the journal sees it: once the worker knows that the session was asked
//! to stop, no new call starts. The first call refused ends the session as `cancelled`
//! under the lease this worker holds (an effect that was already running has finished
//! and been recorded by then: the calls of one handle are awaited one at a time, and
//! parallel calls record their outcomes before their futures end).

use super::Journal;
use crate::error::{DurableError, StoreError};
use crate::store::{CancelRequest, SessionStatus, cancel_reason};

impl Journal {
    /// Records that the session was asked to stop (seen on its row at a resume or a
    /// lease renewal): the next call is refused.
    pub(crate) fn note_cancel(&self, request: CancelRequest) {
        let mut state = self.state();
        if state.cancelled.is_none() {
            state.cancelled = Some(request);
        }
    }

    /// The cancellation this worker knows of, if any.
    pub(crate) fn cancel_request(&self) -> Option<CancelRequest> {
        self.state().cancelled.clone()
    }

    /// Refuses a new call of a session asked to stop, after ending the session as
    /// `cancelled` (under this worker's lease; a lease already lost or given up leaves
    /// that to the next worker that takes it).
    pub(crate) async fn check_cancelled(&self) -> Result<(), DurableError> {
        match self.cancel_request() {
            Some(request) => Err(self.refuse(request).await),
            None => Ok(()),
        }
    }

    /// Refuses a call the store refused because the session was asked to stop
    /// ([`StoreError::CancelRequested`], noted with [`note_cancel`](Self::note_cancel)
    /// before): ends the session as `cancelled`, as [`check_cancelled`](Self::check_cancelled)
    /// does.
    pub(crate) async fn refuse_cancelled(&self) -> DurableError {
        let request = self.cancel_request().unwrap_or_else(|| CancelRequest {
            by: "an operator".to_owned(),
            reason: "cancelled".to_owned(),
            at: 0,
        });
        self.refuse(request).await
    }

    async fn refuse(&self, request: CancelRequest) -> DurableError {
        self.end_cancelled(&request).await;
        DurableError::Cancelled {
            session: self.inner.session.clone(),
            by: request.by,
            reason: request.reason,
        }
    }

    /// Sets the session's status to `cancelled` under this worker's lease.
    pub(crate) async fn end_cancelled(&self, request: &CancelRequest) {
        let lease = self.lease();
        let reason = cancel_reason(&request.by, &request.reason);
        match self
            .inner
            .store
            .set_status(lease.fence(), SessionStatus::Cancelled, Some(&reason))
            .await
        {
            Ok(()) => {
                tracing::info!(session = %lease.session, by = %request.by, "session cancelled at a safe point");
            }
            // Ended already (by an earlier refused call of this handle), or taken over.
            Err(StoreError::LeaseLost { .. }) => {}
            Err(e) => {
                tracing::warn!(session = %lease.session, error = %e, "ending a cancelled session failed; the next worker ends it");
            }
        }
    }
}
