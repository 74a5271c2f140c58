//! A checkpoint that rides on one tool call's result: see
//! [`Session::checkpoint_after`](crate::Session::checkpoint_after).
//!
//! The session opens a scope: it arms the journal with a [`PendingCommit`] (the
//! snapshot of everything but the call's own result message) and hands the caller's
//! code a journal handle tagged with the scope's number. The first tool call made on
//! that handle claims the commit; a later one on it is refused before anything is
//! journaled, and calls on other handles (clones of the session's journal) are not
//! part of the scope. When the claimed call records its outcome through `finish_call`,
//! the message made of that outcome is appended to the snapshot and written in the same
//! transaction. Paths that record nothing there (a recorded result returned, a `pure`
//! call's single insert) only build the message; the session then writes an ordinary
//! checkpoint.

use serde_json::Value;

use super::{Journal, lock};
use crate::error::DurableError;
use crate::runtime::encode;
use crate::snapshot::{Budget, Spend};
use crate::store::{CheckpointMeta, NewCheckpoint};

/// Makes the encoded result message from the call's outcome (`Ok(result)` or
/// `Err(failure message)`), keeping the typed message for the session.
pub(crate) type MakeMessage =
    Box<dyn FnOnce(Result<&Value, &str>) -> Result<Value, DurableError> + Send>;

/// The checkpoint a scope's one call commits with its result.
pub(crate) struct PendingCommit {
    /// The version the checkpoint is compare-and-set against.
    expected: i64,
    /// Pending messages (without the result message), plan, budget and state.
    base: NewCheckpoint,
    /// The budget in `base`, before spend recorded during the scope.
    budget: Budget,
    make: Option<MakeMessage>,
    /// Whether the message was made for an outcome and is still to be written (by
    /// `finish_call`, or by the session's own checkpoint when the call wrote nothing).
    message_made: bool,
    /// Set once the checkpoint committed with the result.
    pub(crate) committed: Option<CheckpointMeta>,
    /// Set if the message could not be built; the result was recorded without it.
    pub(crate) error: Option<DurableError>,
}

/// Where the journal's scope stands; each state carries the scope's number.
#[derive(Default)]
pub(crate) enum CommitSlot {
    /// No scope.
    #[default]
    Idle,
    /// A scope waits for its call.
    Armed(u64, Box<PendingCommit>),
    /// A call took the commit and runs.
    Claimed(u64),
    /// The call ended; the session picks this up.
    Done(u64, Box<PendingCommit>),
}

impl PendingCommit {
    pub(crate) fn new(
        expected: i64,
        base: NewCheckpoint,
        budget: Budget,
        make: MakeMessage,
    ) -> Self {
        PendingCommit {
            expected,
            base,
            budget,
            make: Some(make),
            message_made: false,
            committed: None,
            error: None,
        }
    }

    /// Whether a message was made for an outcome and is still to be written.
    pub(crate) fn has_message(&self) -> bool {
        self.message_made
    }

    /// The write carrying the message failed: nothing of it is in the store.
    pub(crate) fn withdraw(&mut self) {
        self.message_made = false;
    }

    /// Makes the result message of this outcome (once); `None`, with `error` set, when it
    /// cannot be made, so that the result is still recorded on its own.
    pub(crate) fn message(&mut self, outcome: Result<&Value, &str>) -> Option<Value> {
        let make = self.make.take()?;
        match make(outcome) {
            Ok(message) => {
                self.message_made = true;
                Some(message)
            }
            Err(e) => {
                self.error = Some(e);
                None
            }
        }
    }

    /// The checkpoint to write with the result: the snapshot, `message` appended, and
    /// `spend` (everything recorded since the scope opened, the call's own included)
    /// charged to the budget. `None`, with `error` set, if the budget cannot be encoded.
    pub(crate) fn checkpoint(
        &mut self,
        message: Value,
        spend: &[Spend],
    ) -> Option<(i64, NewCheckpoint)> {
        let mut checkpoint = self.base.clone();
        checkpoint.messages.push(message);
        if !spend.is_empty() {
            let mut budget = self.budget.clone();
            for s in spend {
                budget.charge(s);
            }
            match encode(&budget, "budget") {
                Ok(encoded) => checkpoint.budget = encoded,
                Err(e) => {
                    self.error = Some(e);
                    return None;
                }
            }
        }
        Some((self.expected, checkpoint))
    }
}

impl Journal {
    /// Opens a scope: the first tool call on the returned handle commits `commit` with
    /// its result.
    pub(crate) fn open_scope(&self, commit: PendingCommit) -> Journal {
        let scope = self
            .inner
            .scopes
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
            + 1;
        *lock(&self.inner.commit) = CommitSlot::Armed(scope, Box::new(commit));
        Journal {
            inner: std::sync::Arc::clone(&self.inner),
            scope: Some(scope),
        }
    }

    /// Takes the armed commit for the call of `tool` made on this handle: `Ok(None)` on
    /// a handle outside any open scope, an error for a second call inside one.
    pub(crate) fn claim_commit(
        &self,
        tool: &str,
    ) -> Result<Option<Box<PendingCommit>>, DurableError> {
        let Some(scope) = self.scope else {
            return Ok(None);
        };
        let mut slot = lock(&self.inner.commit);
        match std::mem::take(&mut *slot) {
            CommitSlot::Armed(open, commit) if open == scope => {
                *slot = CommitSlot::Claimed(scope);
                Ok(Some(commit))
            }
            other @ (CommitSlot::Claimed(open) | CommitSlot::Done(open, _)) if open == scope => {
                *slot = other;
                Err(DurableError::OneCallPerCheckpoint {
                    session: self.inner.session.clone(),
                    tool: tool.to_owned(),
                })
            }
            other => {
                // The scope was closed: this handle outlived it; an ordinary call.
                *slot = other;
                Ok(None)
            }
        }
    }

    /// Whether this handle's scope is still open with its commit claimed.
    pub(crate) fn scope_claimed(&self) -> bool {
        matches!(*lock(&self.inner.commit), CommitSlot::Claimed(open) if Some(open) == self.scope)
    }

    /// Hands the claimed commit back once its call ended (dropped if the scope closed
    /// meanwhile).
    pub(crate) fn return_commit(&self, commit: Box<PendingCommit>) {
        let mut slot = lock(&self.inner.commit);
        if let CommitSlot::Claimed(open) = *slot
            && Some(open) == self.scope
        {
            *slot = CommitSlot::Done(open, commit);
        }
    }

    /// Closes this handle's scope: what its call left (`None` if no call ran to an end).
    pub(crate) fn close_scope(&self) -> Option<Box<PendingCommit>> {
        let mut slot = lock(&self.inner.commit);
        let open = match &*slot {
            CommitSlot::Armed(open, _) | CommitSlot::Claimed(open) | CommitSlot::Done(open, _) => {
                Some(*open)
            }
            CommitSlot::Idle => None,
        };
        if open != self.scope {
            return None;
        }
        match std::mem::take(&mut *slot) {
            CommitSlot::Done(_, commit) => Some(commit),
            _ => None,
        }
    }
}
