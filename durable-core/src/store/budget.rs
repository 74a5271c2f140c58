//! Operators' raises of a session's budget ceilings ([`RaiseLimit`], [`LimitRaise`]): the
//! store's side of a budget that binds.
//!
//! A raise is an audit row (who, when, which ceiling, to what, why). It is not written
//! into the session's checkpoint (an operator holds no lease): the journal reads the
//! session's raises when a ceiling would refuse a call, applies them
//! ([`Budget::raise`](crate::Budget::raise): a raise never lowers a ceiling, so applying
//! the same rows again, in any order, changes nothing), and the next checkpoint carries
//! the raised ceiling. Nothing is read while the budget has room.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::limit::Limit;
use crate::error::StoreError;
use crate::ids::SessionId;

/// An operator's raise of one ceiling of a session's budget, as
/// [`BudgetStore::raise_limit`] takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RaiseLimit {
    /// The session.
    pub session: SessionId,
    /// The ceiling.
    pub limit: Limit,
    /// Its new amount, in the limit's unit (at most `i64::MAX`).
    pub ceiling: u64,
    /// Who raises it (checked as an id: not blank, no control characters).
    pub by: String,
    /// Why.
    pub note: Option<String>,
}

impl RaiseLimit {
    /// A raise of `limit` to `ceiling` for `session`, by `by`.
    pub fn new(session: SessionId, limit: Limit, ceiling: u64, by: impl Into<String>) -> Self {
        RaiseLimit {
            session,
            limit,
            ceiling,
            by: by.into(),
            note: None,
        }
    }

    /// With a note saying why.
    #[must_use]
    pub fn note(mut self, note: impl Into<String>) -> Self {
        self.note = Some(note.into());
        self
    }

    /// Checks what the store is given: `by` with
    /// [`validate_id`](crate::validate::validate_id), the note with
    /// [`validate_text`](crate::validate::validate_text), a per-tool limit's name as an
    /// id, the amount within `i64`. Every backend calls this before touching the
    /// database.
    pub fn validate(&self) -> Result<(), StoreError> {
        crate::validate::validate_id("raiser", &self.by)?;
        if let Limit::Tool(name) = &self.limit {
            crate::validate::validate_text("tool name", name)?;
        }
        if i64::try_from(self.ceiling).is_err() {
            return Err(StoreError::InvalidRaise {
                detail: format!(
                    "a ceiling of {} is above the largest storable amount",
                    self.ceiling
                ),
            });
        }
        self.note.as_deref().map_or(Ok(()), |note| {
            crate::validate::validate_text("raise note", note)
        })
    }
}

/// An audit row of a raise: what [`BudgetStore::limit_raises`] returns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct LimitRaise {
    /// The session.
    pub session: SessionId,
    /// The ceiling.
    pub limit: Limit,
    /// Its new amount, in the limit's unit.
    pub ceiling: u64,
    /// Who raised it.
    pub by: String,
    /// Why.
    pub note: Option<String>,
    /// When (ms, the database's clock).
    pub at: i64,
}

impl LimitRaise {
    /// A row as a backend reads it back; `limit` is its stored text.
    pub fn from_row(
        session: SessionId,
        limit: &str,
        ceiling: i64,
        by: String,
        note: Option<String>,
        at: i64,
    ) -> Result<Self, StoreError> {
        let corrupt = |detail: String| StoreError::Corrupt {
            session: session.clone(),
            version: None,
            detail,
        };
        Ok(LimitRaise {
            limit: limit
                .parse()
                .map_err(|e| corrupt(format!("limit raise: {e}")))?,
            ceiling: u64::try_from(ceiling)
                .map_err(|_| corrupt(format!("limit raise: negative ceiling {ceiling}")))?,
            session,
            by,
            note,
            at,
        })
    }
}

/// Operators' raises of budget ceilings and their audit rows (the `budget` conformance
/// cases).
#[async_trait]
pub trait BudgetStore: Send + Sync + 'static {
    /// Writes the audit row of an operator's raise.
    ///
    /// # Contract
    /// One insert, atomic. [`RaiseLimit::validate`] runs first: a bad raiser, note or
    /// amount is refused before anything is written. [`StoreError::SessionNotFound`]
    /// when the session does not exist. The session's status is not changed (the
    /// runtime unparks a session parked for its budget, see
    /// [`Operator::raise_limit`](crate::Operator::raise_limit)). Returns the row as
    /// stored, `at` on the database's clock.
    async fn raise_limit(&self, raise: RaiseLimit) -> Result<LimitRaise, StoreError>;

    /// The raises of a session, in the order they were written.
    ///
    /// # Contract
    /// Read-only. A session that does not exist (or was purged) has none.
    async fn limit_raises(&self, session: &SessionId) -> Result<Vec<LimitRaise>, StoreError>;
}
