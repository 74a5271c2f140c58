//! The call journal: insert-or-get of rows, outcomes, re-issues, checked reads, the
//! in-doubt listing, and operator resolutions with their audit log.

use durable_core::store::{
    ApprovalEvent, ApprovalRequest, CallOutcome, CallRecord, CallStatus, CheckpointMeta, EditedKey,
    Fence, FinishCall, IssueOutcome, NewCall, NewCheckpoint, Resolution, ResolutionRecord,
    ResolveCall,
};
use durable_core::{CallId, SessionId, StoreError};

use crate::state::{AuditRow, CallRow, State};
use crate::{MemoryStore, approvals, checkpoints, leases, seal, sessions};

/// The first row (by issue time) of `tool` holding `key` with other arguments than
/// `input_hash`, in any session: what makes a new holder an idempotency conflict.
fn key_holder(
    state: &State,
    tool: &str,
    key: &str,
    input_hash: &str,
    not: &CallId,
) -> Option<CallId> {
    // Issue order: time, then (within one millisecond) the session's age and position.
    state
        .sessions
        .values()
        .flat_map(|s| s.journal.iter().map(move |r| (s.order, r)))
        .filter(|(_, r)| {
            let r = &r.record;
            r.identity.tool == tool && r.idempotency_key.as_deref() == Some(key)
        })
        .filter(|(_, r)| r.record.identity.input_hash != input_hash && r.record.id != *not)
        .min_by_key(|(order, r)| (r.record.issued_at, *order, r.seq))
        .map(|(_, r)| r.record.id.clone())
}

/// Insert-or-get on the identity, for `issue_call` (no outcome), `record_call` (with
/// `finish`) and `request_call` (with `request`). Fenced; steps only move forward; a key
/// held with other arguments is a conflict; then the existing row, or the new one,
/// sealed and counted by the head.
pub(crate) fn insert(
    store: &MemoryStore,
    fence: Fence<'_>,
    call: NewCall,
    finish: Option<FinishCall>,
    request: Option<ApprovalRequest>,
) -> Result<IssueOutcome, StoreError> {
    if call.identity.session != *fence.session {
        return Err(StoreError::LeaseLost {
            session: call.identity.session.clone(),
            token: fence.token,
        });
    }
    let ring = store.ring();
    let now = store.clock();
    let mut state = store.lock();
    let holder = call.idempotency_key.as_deref().and_then(|key| {
        key_holder(
            &state,
            &call.identity.tool,
            key,
            &call.identity.input_hash,
            &call.id,
        )
    });
    let session = sessions::fenced(store, &mut state, fence)?;
    if finish.is_none()
        && request.is_none()
        && let Some(asked) = &session.record.cancel_requested
    {
        return Err(StoreError::CancelRequested {
            session: fence.session.clone(),
            by: asked.by.clone(),
            reason: asked.reason.clone(),
            at: asked.at,
        });
    }
    let n = session.head.journal_rows;
    if let Some(latest) = session
        .journal
        .iter()
        .find(|r| r.seq == n)
        .map(|r| r.record.identity.step)
        && call.identity.step < latest
    {
        return Err(StoreError::StepClosed {
            session: fence.session.clone(),
            step: call.identity.step,
            latest,
        });
    }
    if let (Some(key), Some(existing)) = (&call.idempotency_key, holder) {
        return Err(StoreError::IdempotencyConflict {
            tool: call.identity.tool.clone(),
            key: key.clone(),
            existing,
        });
    }
    if let Some(existing) = session
        .journal
        .iter()
        .find(|r| r.record.identity == call.identity)
    {
        seal::check_call(ring, existing)?;
        return Ok(IssueOutcome::Existing(existing.record.clone()));
    }
    let (status, result, error, spend) = match finish {
        None if request.is_some() => (CallStatus::Requested, None, None, None),
        None => (CallStatus::Issued, None, None, None),
        Some(FinishCall { outcome, spend }) => match outcome {
            CallOutcome::Completed(v) => (CallStatus::Completed, Some(v), None, spend),
            CallOutcome::Failed(v) => (CallStatus::Failed, None, Some(v), spend),
        },
    };
    let finished = status.has_outcome();
    let mut row = CallRow {
        record: CallRecord {
            id: call.id,
            kind: call.kind,
            identity: call.identity,
            class: call.class,
            status,
            args: call.args,
            idempotency_key: call.idempotency_key,
            schema_hash: call.schema_hash,
            result,
            error,
            spend,
            mac: None,
            attempt: if request.is_some() { 0 } else { 1 },
            fence: fence.token,
            issued_at: now,
            finished_at: finished.then_some(now),
            approval: request.as_ref().map(|r| r.journaled(now)),
        },
        seq: n + 1,
        operator_needed: false,
    };
    seal::seal_call(ring, &mut row)?;
    let record = row.record.clone();
    if let Some(request) = &request {
        let entry = approvals::entry(
            &record.id,
            ApprovalEvent::Requested,
            &request.asked_by,
            request.reasoning.clone(),
            None,
            None,
            now,
        );
        approvals::append(ring, session, entry)?;
    }
    session.head.journal_rows = row.seq;
    session.head.issued_rows += i64::from(status == CallStatus::Issued);
    session.journal.push(row);
    seal::seal_head(ring, session)?;
    state.calls.insert(record.id.clone(), fence.session.clone());
    Ok(IssueOutcome::Inserted(record))
}

/// `reissue_call` (`edited: None`) and `issue_approved` (`edited: Some(key)`): an
/// issued, not-happened or approved row issued again, attempt + 1, under this token.
pub(crate) fn reissue(
    store: &MemoryStore,
    fence: Fence<'_>,
    call: &CallId,
    edited: Option<Option<EditedKey>>,
) -> Result<CallRecord, StoreError> {
    let ring = store.ring();
    let now = store.clock();
    let mut state = store.lock();
    let holder = match &edited {
        Some(Some(key)) => {
            let session = state.session(fence.session)?;
            let tool = &session.journal[session.row_index(call)?]
                .record
                .identity
                .tool;
            key_holder(&state, tool, &key.key, &key.input_hash, call)
        }
        _ => None,
    };
    let session = sessions::fenced(store, &mut state, fence)?;
    let at = session.row_index(call)?;
    let mut row = session.journal[at].clone();
    seal::check_call(ring, &row)?;
    let status = row.record.status;
    let approved = status == CallStatus::Approved;
    if !matches!(
        status,
        CallStatus::Issued | CallStatus::NotHappened | CallStatus::Approved
    ) || (edited.is_some() && !approved)
    {
        return Err(StoreError::CallNotInDoubt {
            call: call.clone(),
            status: status.as_str().to_owned(),
        });
    }
    // A session asked to stop starts nothing: not a re-run, not an approved call.
    if let Some(asked) = &session.record.cancel_requested {
        return Err(StoreError::CancelRequested {
            session: fence.session.clone(),
            by: asked.by.clone(),
            reason: asked.reason.clone(),
            at: asked.at,
        });
    }
    if let Some(Some(key)) = &edited {
        if let Some(existing) = holder {
            return Err(StoreError::IdempotencyConflict {
                tool: row.record.identity.tool.clone(),
                key: key.key.clone(),
                existing,
            });
        }
        row.record.idempotency_key = Some(key.key.clone());
    }
    if approved {
        // The log must say the call was approved (an older version of the row put back
        // after it ran would not), and then says it was issued.
        let last = approvals::last_event(session, call);
        ApprovalEvent::check_row(fence.session, call, CallStatus::Approved, last)?;
    }
    let r = &mut row.record;
    r.attempt += 1;
    r.status = CallStatus::Issued;
    r.fence = fence.token;
    r.finished_at = None;
    r.result = None;
    r.error = None;
    r.spend = None;
    row.operator_needed = false;
    seal::seal_call(ring, &mut row)?;
    if approved {
        let entry = approvals::entry(call, ApprovalEvent::Issued, "worker", None, None, None, now);
        approvals::append(ring, session, entry)?;
    }
    if status != CallStatus::Issued {
        session.head.issued_rows += 1;
    }
    let record = row.record.clone();
    session.journal[at] = row;
    seal::seal_head(ring, session)?;
    Ok(record)
}

/// `finish_call`: the outcome of an issued row, with an optional checkpoint, all or
/// nothing.
pub(crate) fn finish_call(
    store: &MemoryStore,
    fence: Fence<'_>,
    call: &CallId,
    finish: FinishCall,
    checkpoint: Option<(i64, NewCheckpoint)>,
) -> Result<Option<CheckpointMeta>, StoreError> {
    let ring = store.ring();
    let now = store.clock();
    let mut state = store.lock();
    let session = sessions::fenced(store, &mut state, fence)?;
    let at = session.row_index(call)?;
    let mut row = session.journal[at].clone();
    seal::check_call(ring, &row)?;
    if row.record.status != CallStatus::Issued {
        return Err(StoreError::CallNotInDoubt {
            call: call.clone(),
            status: row.record.status.as_str().to_owned(),
        });
    }
    if let Some((expected, _)) = &checkpoint
        && session.record.latest_version != *expected
    {
        return Err(StoreError::VersionConflict {
            session: fence.session.clone(),
            expected: *expected,
            actual: session.record.latest_version,
        });
    }
    let r = &mut row.record;
    (r.status, r.result, r.error) = match finish.outcome {
        CallOutcome::Completed(v) => (CallStatus::Completed, Some(v), None),
        CallOutcome::Failed(v) => (CallStatus::Failed, None, Some(v)),
    };
    r.spend = finish.spend;
    r.finished_at = Some(now);
    seal::seal_call(ring, &mut row)?;
    // Written only now that nothing else can fail but the checkpoint's own sealing.
    let before = (session.journal[at].clone(), session.head.clone());
    session.journal[at] = row;
    session.head.issued_rows -= 1;
    let meta = match &checkpoint {
        Some((expected, cp)) => checkpoints::append(ring, now, session, *expected, cp).map(Some),
        None => seal::seal_head(ring, session).map(|()| None),
    };
    if meta.is_err() {
        (session.journal[at], session.head) = before;
    }
    meta
}

/// `call`: one row, its seal checked.
pub(crate) fn call(store: &MemoryStore, id: &CallId) -> Result<CallRecord, StoreError> {
    let state = store.lock();
    let session = state.session(&state.session_of(id)?)?;
    let row = &session.journal[session.row_index(id)?];
    seal::check_call(store.ring(), row)?;
    Ok(row.record.clone())
}

/// `calls`: the whole journal checked (head, completeness, every seal, the count of
/// issued rows), then one step of it or all.
pub(crate) fn calls(
    store: &MemoryStore,
    session: &SessionId,
    step: Option<i64>,
) -> Result<Vec<CallRecord>, StoreError> {
    let state = store.lock();
    let rows = seal::checked_journal(store.ring(), state.session(session)?)?;
    Ok(rows
        .into_iter()
        .filter(|r| step.is_none_or(|s| r.record.identity.step == s))
        .map(|r| r.record.clone())
        .collect())
}

/// `in_doubt`: issued rows whose issuing lease is gone (superseded, released, expired).
pub(crate) fn in_doubt(
    store: &MemoryStore,
    session: Option<&SessionId>,
) -> Result<Vec<CallRecord>, StoreError> {
    let now = store.clock();
    let state = store.lock();
    let mut sessions: Vec<_> = state
        .sessions
        .values()
        .filter(|s| session.is_none_or(|id| s.record.id == *id))
        .collect();
    sessions.sort_by_key(|s| s.order);
    let mut out = Vec::new();
    for s in sessions {
        let mut rows: Vec<&CallRow> = s
            .journal
            .iter()
            .filter(|r| r.record.status == CallStatus::Issued)
            .filter(|r| s.record.fence != r.record.fence || !leases::live(&s.record, now))
            .collect();
        rows.sort_by_key(|r| r.seq);
        for row in rows {
            seal::check_call(store.ring(), row)?;
            out.push(row.record.clone());
        }
    }
    Ok(out)
}

/// `resolve_call`: an operator's decision on an issued row whose lease is gone, and its
/// audit row, sealed at the next position and counted by the head.
pub(crate) fn resolve_call(
    store: &MemoryStore,
    resolve: ResolveCall,
) -> Result<CallRecord, StoreError> {
    resolve.validate()?;
    let ring = store.ring();
    let now = store.clock();
    let mut state = store.lock();
    let id = &resolve.call;
    let session_id = state.session_of(id)?;
    let session = state.session_mut(&session_id)?;
    let at = session.row_index(id)?;
    let mut row = session.journal[at].clone();
    seal::check_call(ring, &row)?;
    if row.record.status != CallStatus::Issued {
        return Err(StoreError::CallNotInDoubt {
            call: id.clone(),
            status: row.record.status.as_str().to_owned(),
        });
    }
    if leases::live(&session.record, now) && session.record.fence == row.record.fence {
        return Err(StoreError::CallNotInDoubt {
            call: id.clone(),
            status: "running".to_owned(),
        });
    }
    seal::check_head(ring, session)?;
    let (status, decision, result) = match resolve.resolution {
        Resolution::Happened { result } => (CallStatus::Resolved, "happened", Some(result)),
        Resolution::DidNotHappen => (CallStatus::NotHappened, "did_not_happen", None),
    };
    row.record.status = status;
    row.record.result = result;
    row.record.finished_at = Some(now);
    seal::seal_call(ring, &mut row)?;
    let mut audit = AuditRow {
        position: session.head.resolutions + 1,
        call: id.clone(),
        event: decision.to_owned(),
        by: resolve.by,
        note: resolve.note,
        result: row.record.result.as_ref().map(seal::text),
        args_before: None,
        at: now,
        seal: None,
    };
    seal::seal_resolution(ring, &session_id, &mut audit)?;
    let record = row.record.clone();
    session.journal[at] = row;
    session.resolutions.push(audit);
    session.head.resolutions += 1;
    session.head.issued_rows -= 1;
    seal::seal_head(ring, session)?;
    Ok(record)
}

/// `resolutions`: the audit log, checked row by row and against the head.
pub(crate) fn resolutions(
    store: &MemoryStore,
    session: &SessionId,
) -> Result<Vec<ResolutionRecord>, StoreError> {
    let state = store.lock();
    let s = state.session(session)?;
    let ring = store.ring();
    seal::check_resolutions(ring, s)?;
    s.resolutions
        .iter()
        .map(|row| {
            let result = row
                .result
                .as_deref()
                .map(serde_json::from_str)
                .transpose()
                .map_err(|e| StoreError::Corrupt {
                    session: session.clone(),
                    version: None,
                    detail: format!("resolution {}: its result is not JSON: {e}", row.position),
                })?;
            let resolution = match (row.event.as_str(), result) {
                ("happened", Some(result)) => Resolution::Happened { result },
                _ => Resolution::DidNotHappen,
            };
            Ok(ResolutionRecord {
                call: row.call.clone(),
                session: session.clone(),
                resolution,
                by: row.by.clone(),
                note: row.note.clone(),
                at: row.at,
            })
        })
        .collect()
}
