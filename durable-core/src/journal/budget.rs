//! What the session's calls cost, charged once per journal row, and the ceilings checked
//! before a fresh call: the journal holds the budget of the last checkpoint and what the
//! rows used since cost ([`Charge`]); [`Journal::check_budget`] runs before a fresh model
//! or tool call (never before a replay) and refuses the call when a ceiling is reached,
//! after applying the operator's raises.

use super::{Journal, MODEL_SLOT, refused_span};
use crate::error::DurableError;
use crate::snapshot::{Ask, Budget, BudgetExceeded, Spend};
use crate::store::{CallRecord, CallStatus};

/// What one journal row charges the budget: its spend, and the call it counts (a model
/// reply, a tool call that ran; none for a denial).
#[derive(Debug, Clone)]
pub(super) struct Charge {
    spend: Option<Spend>,
    call: Option<Counted>,
}

#[derive(Debug, Clone)]
enum Counted {
    Model,
    Tool(String),
}

impl Charge {
    fn apply(&self, budget: &mut Budget) {
        if let Some(spend) = &self.spend {
            budget.charge(spend);
        }
        match &self.call {
            Some(Counted::Model) => budget.count_call(Ask::Model),
            Some(Counted::Tool(tool)) => budget.count_call(Ask::Tool(tool)),
            None => {}
        }
    }
}

impl Journal {
    /// The session's budget: the last checkpoint's, with what the rows used since cost
    /// (each row once).
    pub(crate) fn budget(&self) -> Budget {
        let state = self.state();
        let mut budget = state.budget.clone();
        for charge in &state.pending {
            charge.apply(&mut budget);
        }
        budget
    }

    /// Folds what the rows used since the last sync cost into the budget and returns it
    /// (what a checkpoint snapshots).
    pub(crate) fn sync_budget(&self) -> Budget {
        let mut state = self.state();
        let pending = std::mem::take(&mut state.pending);
        for charge in &pending {
            charge.apply(&mut state.budget);
        }
        state.budget.clone()
    }

    /// Replaces the budget: the new one is the whole truth (taken from
    /// [`budget`](Self::budget), it holds what the rows used so far cost; they stay
    /// charged and are not charged again).
    pub(crate) fn set_budget(&self, budget: Budget) {
        let mut state = self.state();
        state.pending.clear();
        state.budget = budget;
    }

    /// Time since the session started (ms; this worker's clock against the session's
    /// start on the store's), what the wall-time ceiling counts.
    pub(crate) fn elapsed_ms(&self) -> u64 {
        let started_at = self.state().started_at;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        u64::try_from(now.saturating_sub(started_at)).unwrap_or(0)
    }

    /// What `row` charges the budget: its spend, and the call it counts.
    fn charge_of(record: &CallRecord) -> Charge {
        let spend = record.spend.as_ref().and_then(|spend| {
            serde_json::from_value::<Spend>(spend.clone())
                .inspect_err(|e| {
                    tracing::warn!(call = %record.id, error = %e, "recorded spend does not decode; not charged")
                })
                .ok()
        });
        let call = if record.identity.tool == MODEL_SLOT {
            Some(Counted::Model)
        } else if matches!(
            record.status,
            CallStatus::Completed | CallStatus::Failed | CallStatus::Resolved
        ) {
            Some(Counted::Tool(record.identity.tool.clone()))
        } else {
            None
        };
        Charge { spend, call }
    }

    /// Charges a row used by this attempt (replayed or run now) to the budget, once per
    /// row: a replay of a recorded reply or result costs what it cost, once.
    pub(super) fn charge(&self, record: &CallRecord) {
        let charge = Self::charge_of(record);
        if charge.spend.is_none() && charge.call.is_none() {
            return;
        }
        let mut state = self.state();
        if state.charged.insert(record.id.clone()) {
            state.pending.push(charge);
        }
    }

    /// Whether the call `ask` may start now: the session's ceilings are checked before a
    /// fresh model or tool call (never before a replay, which costs nothing new). When
    /// one is reached, the operator's raises of the session are read from the store and
    /// applied, and the check is made again: a raise takes effect on the next call,
    /// running or parked session alike. Nothing is read while the budget has room.
    ///
    /// On refusal the current span (the call's) carries the ceiling and the spend.
    pub(crate) async fn check_budget(&self, ask: Ask<'_>) -> Result<(), DurableError> {
        let elapsed = || self.elapsed_ms();
        if self.budget().check_call(ask, elapsed()).is_ok() {
            return Ok(());
        }
        let raises = self
            .inner
            .store
            .limit_raises(&self.inner.session)
            .await
            .map_err(|e| self.note_store_error(e))?;
        {
            let mut state = self.state();
            for raise in &raises {
                state.budget.raise(&raise.limit, raise.ceiling);
            }
        }
        self.budget()
            .check_call(ask, elapsed())
            .map_err(|refused: BudgetExceeded| {
                let refused = BudgetExceeded {
                    session: Some(self.inner.session.clone()),
                    ..refused
                };
                crate::telemetry::record_budget_refusal(&refused);
                tracing::info!(
                    session = %self.inner.session,
                    limit = %refused.limit,
                    spent = refused.spent,
                    ceiling = refused.ceiling,
                    "call refused: a budget ceiling is reached"
                );
                refused_span(&DurableError::BudgetExceeded(refused.clone()));
                DurableError::BudgetExceeded(refused)
            })
    }
}

/// Charges what `row` cost to `budget` (its spend, and the call it counts), as the
/// journal does when a resumed turn uses it.
pub(crate) fn charge_row(row: &CallRecord, budget: &mut Budget) {
    Journal::charge_of(row).apply(budget);
}
