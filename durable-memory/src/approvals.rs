//! Approvals: a requested row and its approval, a person's decision re-sealing it, the
//! approval log (each row sealed at its position, counted by the head), and the inbox.

use durable_core::integrity::Keyring;
use durable_core::store::{
    ApprovalEvent, ApprovalRecord, ApprovalRequest, CallRecord, CallStatus, DecideApproval, Fence,
    IssueOutcome, NewCall, PendingApproval, SessionStatus,
};
use durable_core::{CallId, SessionId, StoreError};

use crate::state::{AuditRow, Session};
use crate::{MemoryStore, journal, seal};

/// An approval log row, before its position and seal.
pub(crate) fn entry(
    call: &CallId,
    event: ApprovalEvent,
    actor: &str,
    note: Option<String>,
    args_before: Option<String>,
    args_after: Option<String>,
    at: i64,
) -> AuditRow {
    AuditRow {
        position: 0,
        call: call.clone(),
        event: event.as_str().to_owned(),
        by: actor.to_owned(),
        note,
        result: args_after,
        args_before,
        at,
        seal: None,
    }
}

/// Appends `row` to the session's approval log, sealed at the next position; the head
/// counts it (the caller re-seals the head).
pub(crate) fn append(
    ring: &Keyring,
    session: &mut Session,
    mut row: AuditRow,
) -> Result<(), StoreError> {
    row.position = session.head.approvals + 1;
    seal::seal_approval(ring, &session.record.id, &mut row)?;
    session.approvals.push(row);
    session.head.approvals += 1;
    Ok(())
}

/// The last event of `call` in its session's approval log.
pub(crate) fn last_event(session: &Session, call: &CallId) -> Option<ApprovalEvent> {
    session
        .approvals
        .iter()
        .rev()
        .find(|r| r.call == *call)
        .and_then(|r| ApprovalEvent::parse(&r.event))
}

/// `request_call`: insert-or-get as `issue_call`, a new row `requested` with its approval.
pub(crate) fn request_call(
    store: &MemoryStore,
    fence: Fence<'_>,
    call: NewCall,
    request: ApprovalRequest,
) -> Result<IssueOutcome, StoreError> {
    request.validate()?;
    journal::insert(store, fence, call, None, Some(request))
}

/// `decide_approval`: a person's decision (or the deadline's), applied by core's one rule
/// ([`DecideApproval::apply`]), audited; the last decision a waiting session needed makes
/// it active again, released.
pub(crate) fn decide_approval(
    store: &MemoryStore,
    decide: DecideApproval,
) -> Result<CallRecord, StoreError> {
    decide.validate()?;
    let ring = store.ring();
    let now = store.clock();
    let mut state = store.lock();
    let id = &decide.call;
    let session_id = state.session_of(id)?;
    let session = state.session_mut(&session_id)?;
    let at = session.row_index(id)?;
    let mut row = session.journal[at].clone();
    seal::check_call(ring, &row)?;
    let status = row.record.status;
    let change = decide.apply(&session_id, status, row.record.approval.as_ref(), now)?;
    ApprovalEvent::check_row(&session_id, id, status, last_event(session, id))?;
    seal::check_head(ring, session)?;
    let r = &mut row.record;
    r.status = change.status;
    r.error = change.error;
    r.approval = Some(change.approval);
    if change.status == CallStatus::Denied {
        r.finished_at = Some(now);
    }
    seal::seal_call(ring, &mut row)?;
    let args_after = change.args_after.as_ref().map(seal::text);
    let args_before = args_after.is_some().then(|| seal::text(&row.record.args));
    let record = row.record.clone();
    session.journal[at] = row;
    append(
        ring,
        session,
        entry(
            id,
            change.event,
            &decide.by,
            change.note,
            args_before,
            args_after,
            now,
        ),
    )?;
    seal::seal_head(ring, session)?;
    if session.record.status == SessionStatus::AwaitingApproval && !session.has_requested() {
        let r = &mut session.record;
        r.status = SessionStatus::Active;
        r.status_reason = None;
        r.lease_owner = None;
        r.lease_expires_at = None;
        r.updated_at = now;
    }
    Ok(record)
}

/// `pending_approvals`: requested rows of sessions that have not ended, oldest first.
pub(crate) fn pending_approvals(
    store: &MemoryStore,
    session: Option<&SessionId>,
) -> Result<Vec<PendingApproval>, StoreError> {
    let now = store.clock();
    let state = store.lock();
    let mut rows: Vec<_> = state
        .sessions
        .values()
        .filter(|s| session.is_none_or(|id| s.record.id == *id))
        .filter(|s| !s.record.status.is_terminal())
        .flat_map(|s| &s.journal)
        .filter(|r| r.record.status == CallStatus::Requested)
        .collect();
    rows.sort_by(|a, b| {
        (a.record.issued_at, &a.record.identity.session, a.seq).cmp(&(
            b.record.issued_at,
            &b.record.identity.session,
            b.seq,
        ))
    });
    rows.into_iter()
        .map(|row| {
            seal::check_call(store.ring(), row)?;
            let deadline = row.record.approval.as_ref().and_then(|a| a.deadline);
            Ok(PendingApproval {
                call: row.record.clone(),
                expired: deadline.is_some_and(|d| now >= d),
            })
        })
        .collect()
}

/// `approvals`: the approval log, checked row by row and against the head.
pub(crate) fn approvals(
    store: &MemoryStore,
    session: &SessionId,
) -> Result<Vec<ApprovalRecord>, StoreError> {
    let state = store.lock();
    let s = state.session(session)?;
    seal::check_approvals(store.ring(), s)?;
    let json = |text: &Option<String>, position: i64| {
        text.as_deref()
            .map(serde_json::from_str)
            .transpose()
            .map_err(|e| StoreError::Corrupt {
                session: session.clone(),
                version: None,
                detail: format!("approval event {position}: its arguments are not JSON: {e}"),
            })
    };
    s.approvals
        .iter()
        .map(|row| {
            Ok(ApprovalRecord {
                call: row.call.clone(),
                session: session.clone(),
                position: row.position,
                event: ApprovalEvent::parse(&row.event).ok_or_else(|| StoreError::Corrupt {
                    session: session.clone(),
                    version: None,
                    detail: format!("approval event `{}`", row.event),
                })?,
                by: row.by.clone(),
                note: row.note.clone(),
                args_before: json(&row.args_before, row.position)?,
                args_after: json(&row.result, row.position)?,
                at: row.at,
            })
        })
        .collect()
}
