//! A checkpoint that rides on one tool call's result: see
//! [`Session::checkpoint_after`](crate::Session::checkpoint_after).
//!
//! The session arms the journal with a [`PendingCommit`] (the snapshot of everything but
//! the call's own result message) and runs the caller's code. The first tool call that
//! starts claims it; a later one in the same scope is refused before anything is
//! journaled. When the claimed call records its outcome through `finish_call`, the
//! message made of that outcome is appended to the snapshot and written in the same
//! transaction. Paths that record nothing (a recorded result returned, a `pure` call's
//! single insert) only build the message; the session then writes an ordinary checkpoint.

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
    /// The budget in `base`, before the call's own spend.
    budget: Budget,
    make: Option<MakeMessage>,
    /// Set once the message is built: the checkpoint to write.
    built: Option<NewCheckpoint>,
    /// Set once the checkpoint committed with the result.
    pub(crate) committed: Option<CheckpointMeta>,
    /// Set if the message could not be built; the result was recorded without it.
    pub(crate) error: Option<DurableError>,
}

/// Where the journal's scope stands.
#[derive(Default)]
pub(crate) enum CommitSlot {
    /// No scope.
    #[default]
    Idle,
    /// A scope waits for its call.
    Armed(Box<PendingCommit>),
    /// A call took the commit and runs.
    Claimed,
    /// The call ended; the session picks this up.
    Done(Box<PendingCommit>),
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
            built: None,
            committed: None,
            error: None,
        }
    }

    /// Whether the message was built (the call reached an outcome).
    pub(crate) fn has_message(&self) -> bool {
        self.built.is_some()
    }

    /// Builds the checkpoint for this outcome; `None` (with `error` set) when the
    /// message cannot be made, so that the result is still recorded on its own.
    pub(crate) fn build(
        &mut self,
        outcome: Result<&Value, &str>,
        spend: Option<&Spend>,
    ) -> Option<(i64, NewCheckpoint)> {
        let make = self.make.take()?;
        let built = make(outcome).and_then(|message| {
            let mut checkpoint = self.base.clone();
            checkpoint.messages.push(message);
            if let Some(spend) = spend {
                let mut budget = self.budget.clone();
                budget.charge(spend);
                checkpoint.budget = encode(&budget, "budget")?;
            }
            Ok(checkpoint)
        });
        match built {
            Ok(checkpoint) => {
                self.built = Some(checkpoint.clone());
                Some((self.expected, checkpoint))
            }
            Err(e) => {
                self.error = Some(e);
                None
            }
        }
    }
}

impl Journal {
    /// Arms the journal: the next tool call commits `commit` with its result.
    pub(crate) fn arm_commit(&self, commit: PendingCommit) {
        *lock(&self.inner.commit) = CommitSlot::Armed(Box::new(commit));
    }

    /// Takes the armed commit for the call of `tool`, if a scope is open: `Ok(None)`
    /// outside a scope, an error for a second call inside one.
    pub(crate) fn claim_commit(
        &self,
        tool: &str,
    ) -> Result<Option<Box<PendingCommit>>, DurableError> {
        let mut slot = lock(&self.inner.commit);
        match std::mem::take(&mut *slot) {
            CommitSlot::Idle => Ok(None),
            CommitSlot::Armed(commit) => {
                *slot = CommitSlot::Claimed;
                Ok(Some(commit))
            }
            other => {
                *slot = other;
                Err(DurableError::OneCallPerCheckpoint {
                    session: self.inner.session.clone(),
                    tool: tool.to_owned(),
                })
            }
        }
    }

    /// Hands the claimed commit back once its call ended.
    pub(crate) fn return_commit(&self, commit: Box<PendingCommit>) {
        *lock(&self.inner.commit) = CommitSlot::Done(commit);
    }

    /// Closes the scope: what its call left (`None` if no call ran to an end).
    pub(crate) fn close_commit(&self) -> Option<Box<PendingCommit>> {
        match std::mem::take(&mut *lock(&self.inner.commit)) {
            CommitSlot::Done(commit) => Some(commit),
            _ => None,
        }
    }
}
