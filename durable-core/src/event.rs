//! What the journal did with a call ([`Outcome`]), as reported to the observer set with
//! [`DurableBuilder::on_call`](crate::DurableBuilder::on_call) ([`CallEvent`]) and in
//! tracing spans.

use serde::Serialize;

use crate::ids::{CallId, SessionId};
use crate::replay::ReplayClass;

/// What the journal did with a call: reported to observers and in tracing spans.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// No record: the call ran and its result was recorded.
    Executed,
    /// A recorded result (or failure) was returned; nothing ran.
    CacheHit,
    /// An operator's *happened* resolution was returned as the result.
    Resolved,
    /// In doubt, re-executed (`pure`, or after *did not happen*).
    ReExecuted,
    /// In doubt `idempotent_with_key`, re-executed with the recorded key.
    ReExecutedWithKey,
    /// In doubt `unsafe_on_replay`; the verify hook found the effect and its result was recorded.
    VerifiedHappened,
    /// In doubt `unsafe_on_replay`; the verify hook found no effect, so the call ran.
    VerifiedNotHappened,
    /// Awaits a person's approval (journaled now, or found journaled and not decided yet);
    /// nothing ran (see [`approval`](crate::approval)).
    ApprovalRequested,
    /// Refused with [`DurableError::ReplayUnsafe`](crate::DurableError::ReplayUnsafe), [`DurableError::ReplayDiverged`](crate::DurableError::ReplayDiverged) or another refusal before anything ran.
    Refused,
}

impl Outcome {
    /// The snake_case name used in traces and logs.
    pub const fn as_str(self) -> &'static str {
        match self {
            Outcome::Executed => "executed",
            Outcome::CacheHit => "cache_hit",
            Outcome::Resolved => "resolved",
            Outcome::ReExecuted => "re_executed",
            Outcome::ReExecutedWithKey => "re_executed_with_key",
            Outcome::VerifiedHappened => "verified_happened",
            Outcome::VerifiedNotHappened => "verified_not_happened",
            Outcome::ApprovalRequested => "approval_requested",
            Outcome::Refused => "refused",
        }
    }
}

/// A journal decision, as passed to the observer set with
/// [`DurableBuilder::on_call`](crate::DurableBuilder::on_call).
#[derive(Debug, Clone, Serialize)]
pub struct CallEvent {
    /// The session.
    pub session: SessionId,
    /// The journal row (absent when refused before a row existed).
    pub call: Option<CallId>,
    /// Tool name ([`MODEL_SLOT`](crate::journal::MODEL_SLOT) for model calls).
    pub tool: String,
    /// Replay class.
    pub class: ReplayClass,
    /// What happened.
    pub outcome: Outcome,
    /// The idempotency key used, if any.
    pub idempotency_key: Option<String>,
    /// The step.
    pub step: i64,
}
