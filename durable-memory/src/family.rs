//! Child sessions, waiting on them, and cancellation.

use durable_core::store::{
    CancelEffect, CancelSession, CancelledSession, ChildRecord, Fence, Lease, NewSession,
    SessionRecord, SessionStatus, WAITING_FOR_CHILDREN, WAITING_FOR_DEADLINE, Wait, WaitFor,
    wakes_parent,
};
use durable_core::{SessionId, StoreError};

use crate::leases::live;
use crate::state::{Session, State};
use crate::{MemoryStore, sessions};

/// `create_child`: `create_session` with the parent link, the parent checked first.
pub(crate) fn create_child(
    store: &MemoryStore,
    parent: &SessionId,
    new: NewSession,
) -> Result<(SessionRecord, Lease), StoreError> {
    sessions::create_session(store, new, Some(parent))
}

/// Whether an issued row of the session waits for an operator.
fn operator_needed(session: &Session) -> bool {
    session
        .journal
        .iter()
        .any(|c| c.operator_needed && c.record.status == durable_core::store::CallStatus::Issued)
}

/// `children`: the sessions whose parent link names `parent`, oldest first.
pub(crate) fn children(store: &MemoryStore, parent: &SessionId) -> Vec<ChildRecord> {
    let state = store.lock();
    let mut found: Vec<&Session> = state
        .sessions
        .values()
        .filter(|s| s.record.parent.as_ref() == Some(parent))
        .collect();
    found.sort_by_key(|s| (s.record.created_at, s.order));
    found
        .into_iter()
        .map(|s| ChildRecord::new(s.record.clone(), operator_needed(s)))
        .collect()
}

/// Ends the wait of `child`'s parent, if it waits for its children.
pub(crate) fn wake_parent(state: &mut State, child: &SessionId) {
    let Some(parent) = state
        .sessions
        .get(child)
        .and_then(|s| s.record.parent.clone())
    else {
        return;
    };
    if let Some(parent) = state.sessions.get_mut(&parent)
        && parent.record.waiting_for.as_deref() == Some(WAITING_FOR_CHILDREN)
    {
        parent.record.waiting_for = None;
        parent.record.waiting_until = None;
    }
}

/// `wait`: gives the lease up until `wait.until`, unless a named child already ended.
pub(crate) fn wait(store: &MemoryStore, fence: Fence<'_>, wait: &Wait) -> Result<bool, StoreError> {
    let now = store.clock();
    let mut state = store.lock();
    let session = sessions::fenced(store, &mut state, fence)?;
    let _ = session;
    let signal;
    let (children, waiting_for) = match &wait.wait_for {
        WaitFor::Children(children) => (children.as_slice(), WAITING_FOR_CHILDREN),
        WaitFor::Deadline => (&[][..], WAITING_FOR_DEADLINE),
        WaitFor::Signal(name) => {
            if crate::signals::pending(&state, fence.session, name) {
                return Ok(false);
            }
            signal = durable_core::store::waiting_for_signal(name);
            (&[][..], signal.as_str())
        }
        _ => {
            return Err(StoreError::Unsupported {
                operation: "wait for this",
                backend: crate::BACKEND,
            });
        }
    };
    for child in children {
        if let Some(s) = state.sessions.get(child)
            && s.record.parent.as_ref() == Some(fence.session)
            && wakes_parent(&s.record, operator_needed(s))
        {
            return Ok(false);
        }
    }
    let session = state.session_mut(fence.session)?;
    session.record.waiting_for = Some(waiting_for.to_owned());
    session.record.waiting_until = Some(wait.until);
    session.record.lease_owner = None;
    session.record.lease_expires_at = Some(now);
    Ok(true)
}

/// `cancel_session`: the session and, with `cascade`, its descendants, parents first.
pub(crate) fn cancel_session(
    store: &MemoryStore,
    cancel: &CancelSession,
) -> Result<Vec<CancelledSession>, StoreError> {
    cancel.validate()?;
    let now = store.clock();
    let mut state = store.lock();
    state.session(&cancel.session)?;
    let mut order = vec![cancel.session.clone()];
    let mut next = 0;
    while cancel.cascade && next < order.len() {
        let parent = order[next].clone();
        let mut kids: Vec<(i64, u64, SessionId)> = state
            .sessions
            .values()
            .filter(|s| s.record.parent.as_ref() == Some(&parent))
            .map(|s| (s.record.created_at, s.order, s.record.id.clone()))
            .collect();
        kids.sort();
        order.extend(kids.into_iter().map(|(_, _, id)| id));
        next += 1;
    }
    let reason = cancel.status_reason();
    let mut done = Vec::with_capacity(order.len());
    for id in order {
        let session = state.session_mut(&id)?;
        let r = &mut session.record;
        let effect = if r.status.is_terminal() {
            CancelEffect::AlreadyEnded
        } else {
            r.cancel_requested = Some(durable_core::store::CancelRequest {
                by: cancel.by.clone(),
                reason: cancel.reason.clone(),
                at: now,
            });
            session.migrations.push((
                cancel.by.clone(),
                vec![("@cancel".to_owned(), cancel.reason.clone())],
            ));
            let r = &mut session.record;
            if r.status == SessionStatus::Active && live(r, now) {
                CancelEffect::Requested
            } else {
                r.status = SessionStatus::Cancelled;
                r.status_reason = Some(reason.clone());
                r.lease_owner = None;
                r.lease_expires_at = Some(now);
                r.fence += 1;
                r.updated_at = now;
                r.waiting_for = None;
                r.waiting_until = None;
                wake_parent(&mut state, &id);
                CancelEffect::Cancelled
            }
        };
        done.push(CancelledSession {
            session: id,
            effect,
        });
    }
    Ok(done)
}
