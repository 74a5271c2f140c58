//! The call of a `checkpoint_after` scope: see
//! [`Session::checkpoint_after`](crate::Session::checkpoint_after).
//!
//! Data flows one way: the journal never builds a checkpoint. The session opens a scope
//! and hands the caller's code a journal handle tagged with the scope's number. The first
//! tool call made on that handle claims the scope; a later one on it is refused before
//! anything is journaled, and calls on other handles (clones of the session's journal)
//! are not part of the scope. When the claimed call has executed, its outcome is **not
//! recorded by the journal**: the call leaves a [`ScopeOutcome::Executed`] in the slot and
//! the session records it together with the checkpoint it assembles, in one transaction
//! ([`Journal::record_with_checkpoint`]). Paths that have nothing left to record (a
//! recorded result returned, a `pure` call's single insert, a verified result) leave
//! [`ScopeOutcome::Recorded`], and the session writes an ordinary checkpoint after them.
//!
//! Until the session has recorded it, an executed outcome's row stays *issued* and
//! belongs to this journal (the barrier leaves it alone); if the scope ends without the
//! session recording it (its future dropped), the row is handed to the barrier as in
//! doubt, exactly as after a crash.

use serde_json::Value;

use super::{Journal, Outcome, failure_message};
use crate::error::DurableError;
use crate::snapshot::Spend;
use crate::store::{CallOutcome, CallRecord, CheckpointMeta, NewCheckpoint};

/// What the scope's call left for the session.
pub(crate) enum ScopeOutcome {
    /// The call executed; its outcome is not recorded yet.
    Executed(Box<Executed>),
    /// Nothing is left to record with a checkpoint; the message is made of this
    /// (`Ok(result)` or `Err(failure message)`).
    Recorded(Result<Value, String>),
}

/// An outcome the scope's call executed and the session records with its checkpoint.
pub(crate) struct Executed {
    pub(super) row: CallRecord,
    pub(super) outcome: CallOutcome,
    pub(super) spend: Option<Spend>,
    /// What the journal did, reported once the outcome is recorded.
    pub(super) event: Outcome,
}

impl Executed {
    /// The message input: `Ok(result)` or `Err(failure message)`.
    pub(crate) fn message_input(&self) -> Result<&Value, String> {
        match &self.outcome {
            CallOutcome::Completed(v) => Ok(v),
            CallOutcome::Failed(v) => Err(failure_message(Some(v))),
        }
    }

    /// Charges the call to the checkpoint's budget: its spend, and one call of its tool
    /// (it ran).
    pub(crate) fn charge_into(&self, budget: &mut crate::snapshot::Budget) {
        if let Some(spend) = &self.spend {
            budget.charge(spend);
        }
        budget.count_call(crate::snapshot::Ask::Tool(&self.row.identity.tool));
    }
}

/// Where the journal's scope stands; each state carries the scope's number.
#[derive(Default)]
pub(crate) enum CommitSlot {
    /// No scope.
    #[default]
    Idle,
    /// A scope waits for its call.
    Armed(u64),
    /// A call took the scope and runs.
    Claimed(u64),
    /// The call ended; the session picks this up.
    Done(u64, ScopeOutcome),
}

/// The claim a scope's call holds while it runs.
#[derive(Default)]
pub(crate) struct ScopeClaim {
    pub(super) outcome: Option<ScopeOutcome>,
}

impl Journal {
    /// Opens a scope: the first tool call on the returned handle is the scope's.
    pub(crate) fn open_scope(&self) -> Journal {
        let scope = {
            let mut state = self.state();
            state.scopes += 1;
            state.commit = CommitSlot::Armed(state.scopes);
            state.scopes
        };
        Journal {
            inner: std::sync::Arc::clone(&self.inner),
            scope: Some(scope),
            reasoning: self.reasoning.clone(),
            tool_call_id: self.tool_call_id.clone(),
            model_name: self.model_name.clone(),
            rate_limit: self.rate_limit.clone(),
            tool_limit: self.tool_limit.clone(),
        }
    }

    /// Claims the scope for the call of `tool` made on this handle: `Ok(None)` on a
    /// handle outside any open scope, an error for a second call inside one.
    pub(super) fn claim_scope(&self, tool: &str) -> Result<Option<ScopeClaim>, DurableError> {
        let Some(scope) = self.scope else {
            return Ok(None);
        };
        let mut state = self.state();
        let slot = &mut state.commit;
        match std::mem::take(slot) {
            CommitSlot::Armed(open) if open == scope => {
                *slot = CommitSlot::Claimed(scope);
                Ok(Some(ScopeClaim::default()))
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

    /// Whether this handle's scope is still open with its call claimed.
    pub(super) fn scope_claimed(&self) -> bool {
        matches!(self.state().commit, CommitSlot::Claimed(open) if Some(open) == self.scope)
    }

    /// Hands what the claimed call left back to the scope once the call ended. If the
    /// scope closed meanwhile, an executed outcome nobody will record is in doubt.
    pub(super) fn return_claim(&self, claim: ScopeClaim) {
        let Some(outcome) = claim.outcome else {
            return;
        };
        let mut state = self.state();
        if let CommitSlot::Claimed(open) = state.commit
            && Some(open) == self.scope
        {
            state.commit = CommitSlot::Done(open, outcome);
            return;
        }
        drop(state);
        if let ScopeOutcome::Executed(executed) = outcome {
            self.abandon(executed);
        }
    }

    /// Closes this handle's scope: what its call left (`None` if no call ran to an end).
    pub(crate) fn close_scope(&self) -> Option<ScopeOutcome> {
        let mut state = self.state();
        let slot = &mut state.commit;
        let open = match &*slot {
            CommitSlot::Armed(open) | CommitSlot::Claimed(open) | CommitSlot::Done(open, _) => {
                Some(*open)
            }
            CommitSlot::Idle => None,
        };
        if open != self.scope {
            return None;
        }
        match std::mem::take(slot) {
            CommitSlot::Done(_, outcome) => Some(outcome),
            _ => None,
        }
    }

    /// Records an executed outcome, with `checkpoint` (compare-and-set on the version it
    /// carries) in the same transaction: returns the checkpoint's metadata.
    ///
    /// If the write fails, the row stays *issued* and is in doubt. While the write is
    /// under way the handle counts the checkpoint as in doubt, so a future dropped
    /// mid-write leaves it refusing until the session is resumed.
    pub(crate) async fn record_with_checkpoint(
        &self,
        executed: Box<Executed>,
        checkpoint: Option<(i64, NewCheckpoint)>,
    ) -> Result<Option<CheckpointMeta>, DurableError> {
        let Executed {
            row,
            outcome,
            spend,
            event,
        } = *executed;
        let writing = checkpoint.as_ref().map(|(expected, _)| expected + 1);
        if writing.is_some() {
            self.set_checkpoint_in_doubt(writing);
        }
        let written = self.write_outcome(&row, outcome, spend, checkpoint).await;
        match written {
            Ok((finished, meta)) => {
                // The call's span closed when the call handed its outcome to the scope
                // (and recorded it there).
                self.notify(self.event(&finished, event));
                Ok(meta)
            }
            Err(e) => {
                if writing.is_some() {
                    self.set_checkpoint_in_doubt(None);
                }
                self.hand_to_barrier(&row);
                Err(e)
            }
        }
    }

    /// An executed outcome that will not be recorded by this handle: its row is in
    /// doubt.
    pub(crate) fn abandon(&self, executed: Box<Executed>) {
        self.hand_to_barrier(&executed.row);
    }
}

impl std::fmt::Debug for ScopeOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ScopeOutcome::Executed(e) => f.debug_tuple("Executed").field(&e.row.id).finish(),
            ScopeOutcome::Recorded(r) => f.debug_tuple("Recorded").field(r).finish(),
        }
    }
}
