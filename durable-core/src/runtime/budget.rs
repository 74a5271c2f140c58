//! The operator's side of a budget that binds: how a session stands against its
//! ceilings ([`session_budget`], [`Operator::budget`]) and raising one
//! ([`Operator::raise_limit`]), which puts a session parked at its ceiling back to work.

use serde::Serialize;

use super::Operator;
use crate::error::{DurableError, StoreError};
use crate::ids::SessionId;
use crate::snapshot::{Budget, Ceiling, Limit};
use crate::store::{CheckpointStore, LimitRaise, RaiseLimit, SessionStatus};

/// How a session's status reason starts when its harness parked it at a ceiling
/// ([`Session::park_for_budget`](crate::Session::park_for_budget)): an operator's raise
/// ([`Operator::raise_limit`]) returns such a session to `active`.
pub const PARKED_FOR_BUDGET: &str = "budget exceeded:";

/// A session's spend against its ceilings, as an operator sees it: `durable show`, the
/// console's session page.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct SessionBudget {
    /// The session.
    pub session: SessionId,
    /// The latest checkpoint version.
    pub version: i64,
    /// The latest checkpoint's budget, with what the calls of the turn under way
    /// recorded since (each row once, as a resume charges them) and the operator's
    /// raises applied.
    pub budget: Budget,
    /// Time since the session started (ms, the store's clock).
    pub elapsed_ms: u64,
    /// Every ceiling set, with what was spent against it.
    pub ceilings: Vec<Ceiling>,
    /// The operator's raises, oldest first.
    pub raises: Vec<LimitRaise>,
}

/// Reads how `session` stands against its ceilings (reads only: the latest checkpoint,
/// the journal rows of the turn under way, the raises, the store's clock).
pub async fn session_budget(
    store: &dyn CheckpointStore,
    session: &SessionId,
) -> Result<SessionBudget, DurableError> {
    let record = store.session(session).await?;
    let checkpoint = store.load_checkpoint_window(session, None, 0).await?;
    let version = checkpoint.meta.version;
    let mut budget: Budget =
        serde_json::from_value(checkpoint.budget).map_err(|e| DurableError::Decode {
            session: session.clone(),
            what: format!("the budget of version {version}"),
            detail: e.to_string(),
        })?;
    for row in store.calls(session, Some(version)).await? {
        crate::journal::charge_row(&row, &mut budget);
    }
    let raises = store.limit_raises(session).await?;
    for raise in &raises {
        budget.raise(&raise.limit, raise.ceiling);
    }
    let now = store.now().await?;
    let elapsed_ms = u64::try_from(now.saturating_sub(record.created_at)).unwrap_or(0);
    Ok(SessionBudget {
        session: session.clone(),
        version,
        ceilings: budget.ceilings(elapsed_ms),
        budget,
        elapsed_ms,
        raises,
    })
}

impl Operator {
    /// How `session` stands against its ceilings (see [`session_budget`]).
    pub async fn budget(&self, session: &SessionId) -> Result<SessionBudget, DurableError> {
        session_budget(self.durable.store.as_ref(), session).await
    }

    /// Raises `limit` of `session`'s budget to `ceiling` (in the limit's unit; see
    /// [`Limit::parse_amount`] for text), as `by`, audited with `note`
    /// ([`BudgetStore::raise_limit`](crate::store::BudgetStore::raise_limit)). A raise
    /// never lowers a ceiling, and a ceiling the session does not have stays unset.
    ///
    /// The session's next call that the ceiling would refuse reads the raise and runs
    /// (a running session goes on without a restart). A session its harness parked at
    /// the ceiling ([`Session::park_for_budget`](crate::Session::park_for_budget)) is
    /// returned to `active`, so the next resume or pool claim continues it.
    ///
    /// ```no_run
    /// # async fn demo(durable: durable_core::Durable, id: durable_core::SessionId) -> Result<(), durable_core::DurableError> {
    /// use durable_core::Limit;
    ///
    /// let five_dollars = Limit::Usd.parse_amount("5.00").expect("an amount");
    /// durable.operator().raise_limit(&id, Limit::Usd, five_dollars, "alice", Some("customer approved")).await?;
    /// # Ok(()) }
    /// ```
    pub async fn raise_limit(
        &self,
        session: &SessionId,
        limit: Limit,
        ceiling: u64,
        by: &str,
        note: Option<&str>,
    ) -> Result<LimitRaise, DurableError> {
        let mut raise = RaiseLimit::new(session.clone(), limit, ceiling, by);
        raise.note = note.map(str::to_owned);
        let row = self.durable.store.raise_limit(raise).await?;
        tracing::info!(%session, limit = %row.limit, ceiling = row.ceiling, by, "budget ceiling raised");
        let record = self.durable.store.session(session).await?;
        if record.status == SessionStatus::Parked
            && record
                .status_reason
                .as_deref()
                .is_some_and(|reason| reason.starts_with(PARKED_FOR_BUDGET))
        {
            match self.durable.store.unpark_session(session).await {
                Ok(_) | Err(StoreError::NotParked { .. }) => {}
                Err(e) => return Err(e.into()),
            }
            tracing::info!(%session, "session unparked: a budget ceiling was raised");
        }
        Ok(row)
    }
}
