//! Approvals: a person decides on a call before it runs.
//!
//! A call that needs approval is journaled as [`CallStatus::Requested`] with its
//! [`Approval`] (who asked, the model's reasoning, a deadline, the tool's argument
//! schema) and nothing executes. A person then approves it (optionally with edited
//! arguments), denies it with a reason, or lets its deadline pass
//! ([`CheckpointStore::decide_approval`](crate::store::ApprovalStore::decide_approval)). Every
//! request and decision is also an audit row ([`ApprovalRecord`]), sealed at its position
//! in the session's approval log and counted by the session head, like resolutions.
//!
//! An approved row runs once, under its replay class, when the session's turn is replayed:
//! [`reissue_call`](crate::store::JournalStore::reissue_call) takes it from `approved` to
//! `issued`, with the edited arguments if there are any. A denied row holds its denial as
//! its recorded error, which replay returns to the model.
//!
//! [`CallStatus::Requested`]: super::CallStatus::Requested

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{CallRecord, CallStatus};
use crate::StoreError;
use crate::ids::{CallId, SessionId};

/// Why and until when a call waits for a person: what
/// [`request_call`](crate::store::ApprovalStore::request_call) journals with the row.
#[derive(Debug, Clone, PartialEq)]
pub struct ApprovalRequest {
    /// Who or what asked for the approval: the tool's rule (`"tool: approval required"`),
    /// the harness, a policy. Shown to the person who decides.
    pub asked_by: String,
    /// The model's reasoning for the call, when the harness passes it (model text:
    /// attacker-influenced, shown escaped).
    pub reasoning: Option<String>,
    /// How long the request stays open, from the moment it is journaled (on the store's
    /// clock). Not decided by then, it may be expired: denied by its deadline.
    pub expires_in: Option<std::time::Duration>,
    /// The tool's argument schema (JSON Schema), which edited arguments must satisfy.
    pub schema: Option<Value>,
}

impl ApprovalRequest {
    /// Checks what the store is given: `asked_by` with
    /// [`validate_id`](crate::validate::validate_id) (`approval requester`), the reasoning
    /// with [`validate_text`](crate::validate::validate_text). Every backend calls this
    /// before touching the database.
    pub fn validate(&self) -> Result<(), StoreError> {
        crate::validate::validate_id("approval requester", &self.asked_by)?;
        self.reasoning.as_deref().map_or(Ok(()), |text| {
            crate::validate::validate_text("approval reasoning", text)
        })
    }
}

impl ApprovalRequest {
    /// The approval a new requested row holds: this request, journaled at `now` (ms, the
    /// store's clock), its deadline `expires_in` after that.
    pub fn journaled(&self, now: i64) -> Approval {
        Approval {
            asked_by: self.asked_by.clone(),
            reasoning: self.reasoning.clone(),
            requested_at: now,
            deadline: self
                .expires_in
                .map(|d| now.saturating_add(i64::try_from(d.as_millis()).unwrap_or(i64::MAX))),
            schema: self.schema.clone(),
            decision: None,
        }
    }
}

/// What a decision changes, decided once for every backend by [`DecideApproval::apply`]:
/// the row's new status, approval and recorded error, and the audit row.
#[derive(Debug, Clone, PartialEq)]
pub struct Transition {
    /// The row's new status: `approved` or `denied`.
    pub status: CallStatus,
    /// The row's approval, with the decision.
    pub approval: Approval,
    /// The row's recorded error (a denial), if any.
    pub error: Option<Value>,
    /// The audit row's event.
    pub event: ApprovalEvent,
    /// The audit row's note: a denial's reason, else the decision's note.
    pub note: Option<String>,
    /// The audit row's edited arguments, for an approval that edited them.
    pub args_after: Option<Value>,
}

/// A call's approval, as its journal row holds it (sealed with the row): the request and,
/// once taken, the decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Approval {
    /// Who or what asked ([`ApprovalRequest::asked_by`]).
    pub asked_by: String,
    /// The model's reasoning, if the harness passed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
    /// When the request was journaled (ms, the store's clock).
    pub requested_at: i64,
    /// The deadline (ms, the store's clock), if the request has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<i64>,
    /// The tool's argument schema, if the request carried it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<Value>,
    /// The decision, once taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<Decided>,
}

impl Approval {
    /// The arguments an approved call runs with: the edited ones, if the person edited
    /// them, else `None` (the row's own arguments).
    pub fn edited_args(&self) -> Option<&Value> {
        match &self.decision {
            Some(Decided {
                decision: ApprovalDecision::Approve { args },
                ..
            }) => args.as_ref(),
            _ => None,
        }
    }
}

/// A decision taken on a requested call, as its row holds it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decided {
    /// What was decided.
    #[serde(flatten)]
    pub decision: ApprovalDecision,
    /// Who decided (`"deadline"` for an expiry).
    pub by: String,
    /// When (ms, the store's clock).
    pub at: i64,
    /// A note.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl Decided {
    /// The recorded error of a call this decision denied (`None` for an approval): what
    /// replay returns to the model, `{"message": …, "denied": reason, "by": who}`.
    /// `deadline` is the request's, named by an expiry.
    pub fn denial(&self, deadline: Option<i64>) -> Option<Value> {
        let reason = match &self.decision {
            ApprovalDecision::Approve { .. } => return None,
            ApprovalDecision::Deny { reason } | ApprovalDecision::Revoke { reason } => {
                reason.clone()
            }
            ApprovalDecision::Expire => match deadline {
                Some(at) => format!("the approval request expired at {at} ms undecided"),
                None => "the approval request expired undecided".to_owned(),
            },
        };
        let message = match &self.decision {
            ApprovalDecision::Expire => format!("not run: {reason}"),
            _ => format!("not run: denied by {}: {reason}", self.by),
        };
        Some(serde_json::json!({ "message": message, "denied": reason, "by": self.by }))
    }
}

/// A person's decision on a requested call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "decision", rename_all = "snake_case")]
pub enum ApprovalDecision {
    /// Run the call, with these arguments instead of the requested ones when `Some`
    /// (validated by the caller against the tool's schema; stored masked like any
    /// arguments).
    Approve {
        /// The edited arguments, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        args: Option<Value>,
    },
    /// Do not run it; the reason becomes the tool result the model sees.
    Deny {
        /// Why.
        reason: String,
    },
    /// Its deadline passed undecided: denied by the deadline. Refused before the
    /// deadline.
    Expire,
    /// Take back an approval whose call has not run (it cannot run any more: its tool
    /// changed, its edit no longer decodes): denied, the reason is what the model sees.
    /// Only on an `approved` call; a `requested` one is denied with `Deny`, so two
    /// people deciding at once never both succeed.
    Revoke {
        /// Why.
        reason: String,
    },
}

impl ApprovalDecision {
    /// The audit log's name of the decision: `approved`, `denied`, `expired`.
    pub const fn event(&self) -> ApprovalEvent {
        match self {
            ApprovalDecision::Approve { .. } => ApprovalEvent::Approved,
            ApprovalDecision::Deny { .. } | ApprovalDecision::Revoke { .. } => {
                ApprovalEvent::Denied
            }
            ApprovalDecision::Expire => ApprovalEvent::Expired,
        }
    }
}

/// An audited decision request.
#[derive(Debug, Clone, PartialEq)]
pub struct DecideApproval {
    /// The requested call.
    pub call: CallId,
    /// The decision.
    pub decision: ApprovalDecision,
    /// Who decides (an operator name; [`DEADLINE`] for an expiry).
    pub by: String,
    /// Free-form note.
    pub note: Option<String>,
}

/// Who decides an expiry: the request's deadline.
pub const DEADLINE: &str = "deadline";

impl DecideApproval {
    /// Checks what the store is given: `by` with
    /// [`validate_id`](crate::validate::validate_id) (`approver`), the note and a denial's
    /// reason with [`validate_text`](crate::validate::validate_text), a denial's reason
    /// not empty. Every backend calls this before touching the database.
    pub fn validate(&self) -> Result<(), StoreError> {
        crate::validate::validate_id("approver", &self.by)?;
        if let Some(note) = self.note.as_deref() {
            crate::validate::validate_text("approval note", note)?;
        }
        if let ApprovalDecision::Deny { reason } | ApprovalDecision::Revoke { reason } =
            &self.decision
        {
            crate::validate::validate_text("denial reason", reason)?;
            if reason.trim().is_empty() {
                return Err(StoreError::EmptyDenialReason {
                    call: self.call.clone(),
                });
            }
        }
        Ok(())
    }
}

impl DecideApproval {
    /// Decides what this decision does to its row, whose stored status is `status` and
    /// approval `approval`, at `now` (ms, the store's clock): the checks every backend
    /// applies inside its transaction, after the row's seal was checked.
    ///
    /// [`StoreError::NotAwaitingApproval`] unless the row is `requested`;
    /// [`StoreError::ApprovalExpired`] for an approval or denial at or after the deadline;
    /// [`StoreError::ApprovalNotExpired`] for an expiry before it (or without one); a
    /// requested row without its approval is [`StoreError::Corrupt`].
    pub fn apply(
        &self,
        session: &SessionId,
        status: CallStatus,
        approval: Option<&Approval>,
        now: i64,
    ) -> Result<Transition, StoreError> {
        // An approved call that has not run may be revoked: when it cannot run (its tool
        // changed, its edit no longer decodes), that is how the session goes on. Every
        // other decision is on a requested call.
        let revoking = matches!(self.decision, ApprovalDecision::Revoke { .. });
        let expected = if revoking {
            CallStatus::Approved
        } else {
            CallStatus::Requested
        };
        if status != expected {
            return Err(StoreError::NotAwaitingApproval {
                call: self.call.clone(),
                status: status.as_str().to_owned(),
            });
        }
        let mut approval = approval.cloned().ok_or_else(|| StoreError::Corrupt {
            session: session.clone(),
            version: None,
            detail: format!(
                "journal row `{}` is requested but holds no approval request",
                self.call
            ),
        })?;
        let expired = !revoking && approval.deadline.is_some_and(|deadline| now >= deadline);
        match (&self.decision, approval.deadline) {
            (ApprovalDecision::Expire, None) => {
                return Err(StoreError::ApprovalNotExpired {
                    call: self.call.clone(),
                    detail: "the request has no deadline".to_owned(),
                });
            }
            (ApprovalDecision::Expire, Some(deadline)) if !expired => {
                return Err(StoreError::ApprovalNotExpired {
                    call: self.call.clone(),
                    detail: format!(
                        "its deadline is {deadline} ms, {} ms from now",
                        deadline - now
                    ),
                });
            }
            (ApprovalDecision::Approve { .. } | ApprovalDecision::Deny { .. }, Some(deadline))
                if expired =>
            {
                return Err(StoreError::ApprovalExpired {
                    call: self.call.clone(),
                    deadline,
                });
            }
            _ => {}
        }
        let decided = Decided {
            decision: self.decision.clone(),
            by: self.by.clone(),
            at: now,
            note: self.note.clone(),
        };
        let error = decided.denial(approval.deadline);
        approval.decision = Some(decided);
        let (status, note, args_after) = match &self.decision {
            ApprovalDecision::Approve { args } => {
                (CallStatus::Approved, self.note.clone(), args.clone())
            }
            ApprovalDecision::Deny { reason } | ApprovalDecision::Revoke { reason } => {
                (CallStatus::Denied, Some(reason.clone()), None)
            }
            ApprovalDecision::Expire => (CallStatus::Denied, self.note.clone(), None),
        };
        Ok(Transition {
            status,
            approval,
            error,
            event: self.decision.event(),
            note,
            args_after,
        })
    }
}

/// What an approval audit row records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalEvent {
    /// The call was journaled as requested.
    Requested,
    /// A person approved it.
    Approved,
    /// A person denied it.
    Denied,
    /// Its deadline passed undecided.
    Expired,
    /// The approved call was issued to run
    /// ([`reissue_call`](crate::store::JournalStore::reissue_call)).
    Issued,
}

impl ApprovalEvent {
    /// The storage name.
    pub const fn as_str(self) -> &'static str {
        match self {
            ApprovalEvent::Requested => "requested",
            ApprovalEvent::Approved => "approved",
            ApprovalEvent::Denied => "denied",
            ApprovalEvent::Expired => "expired",
            ApprovalEvent::Issued => "issued",
        }
    }

    /// Parses a storage name.
    pub fn parse(s: &str) -> Option<Self> {
        [
            ApprovalEvent::Requested,
            ApprovalEvent::Approved,
            ApprovalEvent::Denied,
            ApprovalEvent::Expired,
            ApprovalEvent::Issued,
        ]
        .into_iter()
        .find(|e| e.as_str() == s)
    }
}

impl ApprovalEvent {
    /// Checks a row that needed approval against its call's last event in the approval
    /// log, before a decision (`status` requested) or an issue (`status` approved) acts on
    /// it. The log is append-only and sealed row by row, so it says where the call
    /// stands; a row whose status contradicts it is an older sealed version of the row put
    /// back behind the store's back (an approved call's row restored after it ran, to run
    /// it again; a denied one restored as requested, to approve it):
    /// [`StoreError::Tampered`].
    pub fn check_row(
        session: &SessionId,
        call: &CallId,
        status: CallStatus,
        last: Option<ApprovalEvent>,
    ) -> Result<(), StoreError> {
        let expected = match status {
            CallStatus::Requested => ApprovalEvent::Requested,
            CallStatus::Approved => ApprovalEvent::Approved,
            _ => return Ok(()),
        };
        if last == Some(expected) {
            return Ok(());
        }
        Err(StoreError::Tampered {
            session: session.clone(),
            what: format!("journal row `{call}`"),
            detail: format!(
                "it is {} but its approval log's last event is {}: an older version of the \
                 row was put back",
                status.as_str(),
                last.map_or("missing", ApprovalEvent::as_str)
            ),
        })
    }
}

/// An audit row of the approval log: a request or a decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalRecord {
    /// The call.
    pub call: CallId,
    /// Its session.
    pub session: SessionId,
    /// Position in the session's approval log (1, 2, …).
    pub position: i64,
    /// What happened.
    pub event: ApprovalEvent,
    /// Who: the requester for [`ApprovalEvent::Requested`], else who decided.
    pub by: String,
    /// The request's reasoning, a denial's reason or a decision's note.
    pub note: Option<String>,
    /// The arguments before an edit (the requested ones), for an approval that edited
    /// them.
    pub args_before: Option<Value>,
    /// The arguments approved, for an approval that edited them.
    pub args_after: Option<Value>,
    /// When (ms, the store's clock).
    pub at: i64,
}

/// A call awaiting a decision, as [`pending_approvals`] lists it.
///
/// [`pending_approvals`]: crate::store::ApprovalStore::pending_approvals
#[derive(Debug, Clone, PartialEq)]
pub struct PendingApproval {
    /// The journal row (status `requested`, its [`approval`](CallRecord::approval) set),
    /// its seal checked.
    pub call: CallRecord,
    /// Whether its deadline has passed, on the store's clock: it may be expired.
    pub expired: bool,
}
