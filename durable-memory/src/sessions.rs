//! Sessions: creating one with its initial checkpoint and first lease, reading and
//! listing them, and setting their status.

use durable_core::store::{
    DEFAULT_QUEUE, Fence, Lease, NewSession, SessionFilter, SessionRecord, SessionStatus,
};
use durable_core::validate::{validate_id, validate_new_session, validate_text};
use durable_core::{SessionId, StoreError};

use crate::state::{Head, Session, State};
use crate::{MemoryStore, checkpoints, millis, seal};

/// Creates the session row, checkpoint 0 (its messages appended to the log), the head
/// and the first lease, all or nothing.
pub(crate) fn create_session(
    store: &MemoryStore,
    new: NewSession,
    parent: Option<&SessionId>,
) -> Result<(SessionRecord, Lease), StoreError> {
    validate_new_session(&new.id, &new.owner, &new.app_version)?;
    let queue = new.queue.as_deref().unwrap_or(DEFAULT_QUEUE);
    validate_id("queue", queue)?;
    let now = store.clock();
    let mut state = store.lock();
    if let Some(parent) = parent {
        state.session(parent)?;
    }
    if state.sessions.contains_key(&new.id) {
        return Err(StoreError::SessionExists(new.id));
    }
    let expires_at = now.saturating_add(millis(new.lease_ttl));
    let record = SessionRecord {
        id: new.id.clone(),
        status: SessionStatus::Active,
        app_version: new.app_version.clone(),
        metadata: new.metadata.clone(),
        lease_owner: Some(new.owner.clone()),
        lease_expires_at: Some(expires_at),
        fence: 1,
        recovery_attempts: 0,
        status_reason: None,
        latest_version: -1,
        created_at: now,
        updated_at: now,
        queue: queue.to_owned(),
        wake_at: new.initial.wake_at,
        lease_renewed_at: Some(now),
        parent: parent.cloned(),
        waiting_until: None,
        waiting_for: None,
        cancel_requested: None,
    };
    let mut session = empty(record, state.created);
    // Version 0 is written like any checkpoint, on an empty log.
    checkpoints::append(store.ring(), now, &mut session, -1, &new.initial)?;
    state.created += 1;
    let lease = Lease {
        session: new.id.clone(),
        owner: new.owner,
        fence: 1,
        expires_at,
    };
    let record = session.record.clone();
    state.sessions.insert(new.id, session);
    Ok((record, lease))
}

/// A session with no checkpoint, message or journal row yet.
pub(crate) fn empty(record: SessionRecord, order: u64) -> Session {
    Session {
        record,
        order,
        rank: None,
        tenant: None,
        ran: false,
        head: Head::default(),
        checkpoints: Vec::new(),
        messages: Vec::new(),
        journal: Vec::new(),
        resolutions: Vec::new(),
        approvals: Vec::new(),
        errors: Vec::new(),
        migrations: Vec::new(),
        raises: Vec::new(),
    }
}

/// Reads a session row.
pub(crate) fn session(store: &MemoryStore, id: &SessionId) -> Result<SessionRecord, StoreError> {
    Ok(store.lock().session(id)?.record.clone())
}

/// Lists sessions: newest update first, then id descending; filtered, paged by cursor.
pub(crate) fn list_sessions(
    store: &MemoryStore,
    filter: &SessionFilter,
) -> Result<Vec<SessionRecord>, StoreError> {
    let state = store.lock();
    let mut found: Vec<&SessionRecord> = state
        .sessions
        .values()
        .map(|s| &s.record)
        .filter(|r| filter.statuses.is_empty() || filter.statuses.contains(&r.status))
        .filter(|r| {
            filter
                .updated_before
                .is_none_or(|before| r.updated_at < before)
        })
        .filter(|r| {
            filter.after.as_ref().is_none_or(|c| {
                r.updated_at < c.updated_at || (r.updated_at == c.updated_at && r.id < c.id)
            })
        })
        .collect();
    found.sort_by(|a, b| (b.updated_at, &b.id).cmp(&(a.updated_at, &a.id)));
    let limit = filter.limit.map_or(usize::MAX, |l| {
        usize::try_from(l.max(0)).unwrap_or(usize::MAX)
    });
    Ok(found.into_iter().take(limit).cloned().collect())
}

/// Sets a session's status under its lease; a terminal, parked or awaiting status
/// releases the lease and bumps the fencing token.
pub(crate) fn set_status(
    store: &MemoryStore,
    fence: Fence<'_>,
    status: SessionStatus,
    reason: Option<&str>,
) -> Result<(), StoreError> {
    if let Some(reason) = reason {
        validate_text("status reason", reason)?;
    }
    let now = store.clock();
    let mut state = store.lock();
    let session = fenced(store, &mut state, fence)?;
    let awaiting = status == SessionStatus::AwaitingApproval;
    let release = status.is_terminal() || status == SessionStatus::Parked || awaiting;
    let requested = session.has_requested();
    if awaiting && !requested {
        // Every request was decided already: active, released, for the next worker.
        end(session, SessionStatus::Active, None, now, release);
    } else {
        end(session, status, reason, now, release);
    }
    if awaiting {
        session.record.lease_owner = None;
    }
    let ends = status.is_terminal() || status == SessionStatus::Parked;
    if ends {
        crate::family::wake_parent(&mut state, fence.session);
    }
    Ok(())
}

/// Sets the status of a fenced session; `release` gives up its lease (the token moves
/// on, a straggler of the holder writes nothing more).
pub(crate) fn end(
    session: &mut Session,
    status: SessionStatus,
    reason: Option<&str>,
    now: i64,
    release: bool,
) {
    let r = &mut session.record;
    r.status = status;
    r.status_reason = reason.map(str::to_owned);
    r.updated_at = now;
    if release {
        r.lease_expires_at = Some(now);
        r.fence += 1;
    }
}

/// The session of a write under a lease: it exists, the token is current
/// ([`StoreError::LeaseLost`] otherwise) and its head holds its seal.
pub(crate) fn fenced<'s>(
    store: &MemoryStore,
    state: &'s mut State,
    fence: Fence<'_>,
) -> Result<&'s mut Session, StoreError> {
    let session = state.session_mut(fence.session)?;
    if session.record.fence != fence.token && !durable_core::guard_switch::guard_off("fencing") {
        return Err(StoreError::LeaseLost {
            session: fence.session.clone(),
            token: fence.token,
        });
    }
    seal::check_head(store.ring(), session)?;
    Ok(session)
}
