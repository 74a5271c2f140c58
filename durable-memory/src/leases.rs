//! Leases and fencing tokens: taking a session (by id or by claiming a free one),
//! renewing and giving the lease up, and the poison-pill counter that parks a session
//! whose recoveries keep dying.
//!
//! A lease is live while it has an owner and `lease_expires_at` is after the store's
//! clock: one process, one clock, so no observation is needed (compare `durable_sqlite`,
//! whose processes may disagree about the wall clock).

use std::time::Duration;

use durable_core::store::{Claim, Fence, Lease, SessionRecord, SessionStatus};
use durable_core::validate::validate_owner;
use durable_core::{CallId, SessionId, StoreError};

use crate::state::{Session, State};
use crate::{MemoryStore, millis, sessions};

/// Whether the session's lease is held: an owner, and not expired on the store's clock.
pub(crate) fn live(record: &SessionRecord, now: i64) -> bool {
    record.lease_owner.is_some() && record.lease_expires_at.is_some_and(|at| at > now)
}

/// `acquire_lease`: refused while another owner's lease is live; the same owner takes it
/// back at once with a new token.
pub(crate) fn acquire_lease(
    store: &MemoryStore,
    id: &SessionId,
    owner: &str,
    ttl: Duration,
    max_attempts: i32,
) -> Result<Lease, StoreError> {
    validate_owner(owner)?;
    let now = store.clock();
    let mut state = store.lock();
    let session = state.session_mut(id)?;
    let r = &session.record;
    if r.status != SessionStatus::Active {
        return Err(StoreError::NotResumable {
            session: id.clone(),
            status: r.status.as_str().to_owned(),
        });
    }
    if let (Some(holder), Some(expires_at)) = (&r.lease_owner, r.lease_expires_at)
        && holder != owner
        && live(r, now)
    {
        return Err(StoreError::Leased {
            session: id.clone(),
            owner: holder.clone(),
            expires_at,
            remaining_ms: expires_at - now,
        });
    }
    match take(session, owner, now, ttl, max_attempts) {
        Some(lease) => Ok(lease),
        None => Err(StoreError::Parked {
            session: id.clone(),
            attempts: session.record.recovery_attempts,
        }),
    }
}

/// Takes the lease: a new token, this owner, `now + ttl`. Taking over a lease that was
/// never released from a holder that ran the session is a recovery: counted, or, with
/// the counter at `max_attempts`, the session is parked instead (`None`).
fn take(
    session: &mut Session,
    owner: &str,
    now: i64,
    ttl: Duration,
    max_attempts: i32,
) -> Option<Lease> {
    let r = &mut session.record;
    r.fence += 1;
    let recovery = r.lease_owner.is_some() && session.ran;
    if recovery
        && r.recovery_attempts >= max_attempts
        && !durable_core::guard_switch::guard_off("poison_pill")
    {
        r.status = SessionStatus::Parked;
        r.status_reason = Some(format!(
            "recovery attempts exhausted ({})",
            r.recovery_attempts
        ));
        r.lease_owner = None;
        r.lease_expires_at = None;
        r.updated_at = now;
        return None;
    }
    let expires_at = now.saturating_add(millis(ttl));
    r.lease_owner = Some(owner.to_owned());
    r.lease_expires_at = Some(expires_at);
    r.lease_renewed_at = Some(now);
    r.updated_at = now;
    r.recovery_attempts += i32::from(recovery);
    session.ran = false;
    Some(Lease {
        session: r.id.clone(),
        owner: owner.to_owned(),
        fence: r.fence,
        expires_at,
    })
}

/// `renew_lease`: fenced; a lapsed lease in a limited queue is lost (a claim may have
/// counted its place free meanwhile).
pub(crate) fn renew_lease(
    store: &MemoryStore,
    lease: &Lease,
    ttl: Duration,
) -> Result<Lease, StoreError> {
    let now = store.clock();
    let mut state = store.lock();
    let limited = state
        .sessions
        .get(&lease.session)
        .is_some_and(|s| state.queues.contains_key(&s.record.queue));
    let session = sessions::fenced(store, &mut state, lease.fence())?;
    let r = &mut session.record;
    if limited && !live(r, now) {
        return Err(StoreError::LeaseLost {
            session: lease.session.clone(),
            token: lease.fence,
        });
    }
    // The renewal time moves forward even if two renewals share a millisecond; the
    // expiry is `ttl` after now (a zero `ttl` gives the lease up unreleased).
    let renewed_at = r.lease_renewed_at.map_or(now, |last| now.max(last + 1));
    let expires_at = now.saturating_add(millis(ttl));
    r.lease_renewed_at = Some(renewed_at);
    r.lease_expires_at = Some(expires_at);
    Ok(Lease {
        expires_at,
        ..lease.clone()
    })
}

/// `release_lease`: no owner, expired now; a no-op for a stale token.
pub(crate) fn release_lease(store: &MemoryStore, lease: &Lease) -> Result<(), StoreError> {
    let now = store.clock();
    let mut state = store.lock();
    if let Some(session) = state.sessions.get_mut(&lease.session)
        && session.record.fence == lease.fence
    {
        session.record.lease_owner = None;
        session.record.lease_expires_at = Some(now);
    }
    Ok(())
}

/// The session of `fence`, its token current (no head check: these marks are
/// scheduling state, outside every seal).
fn current<'s>(state: &'s mut State, fence: Fence<'_>) -> Result<&'s mut Session, StoreError> {
    let session = state.session_mut(fence.session)?;
    if session.record.fence != fence.token {
        return Err(StoreError::LeaseLost {
            session: fence.session.clone(),
            token: fence.token,
        });
    }
    Ok(session)
}

/// `mark_running`: the holder runs the session under this lease.
pub(crate) fn mark_running(store: &MemoryStore, fence: Fence<'_>) -> Result<(), StoreError> {
    current(&mut store.lock(), fence)?.ran = true;
    Ok(())
}

/// `set_scheduling`: the session's claim rank and tenant.
pub(crate) fn set_scheduling(
    store: &MemoryStore,
    fence: Fence<'_>,
    scheduling: &durable_core::store::Scheduling,
) -> Result<(), StoreError> {
    scheduling.validate()?;
    let mut state = store.lock();
    let session = current(&mut state, fence)?;
    session.rank = Some(
        session
            .record
            .created_at
            .saturating_sub(scheduling.rank_offset()),
    );
    session.tenant.clone_from(&scheduling.tenant);
    Ok(())
}

/// `mark_operator_needed`: an issued row only an operator can settle; claims skip the
/// session until the row leaves `issued`.
pub(crate) fn mark_operator_needed(
    store: &MemoryStore,
    fence: Fence<'_>,
    call: &CallId,
) -> Result<(), StoreError> {
    let mut state = store.lock();
    let session = current(&mut state, fence)?;
    if let Some(row) = session.journal.iter_mut().find(|r| r.record.id == *call)
        && row.record.status == durable_core::store::CallStatus::Issued
    {
        row.operator_needed = true;
        crate::family::wake_parent(&mut state, fence.session);
    }
    Ok(())
}

/// Whether a claim may take the session: active, lease free, awake, not waiting for an
/// operator.
fn claimable(session: &Session, now: i64) -> bool {
    let r = &session.record;
    r.status == SessionStatus::Active
        && !live(r, now)
        && r.wake_at.is_none_or(|at| at <= now)
        && r.waiting_until.is_none_or(|at| at <= now)
        && !session.journal.iter().any(|c| {
            c.operator_needed && c.record.status == durable_core::store::CallStatus::Issued
        })
}

/// `claim_expired`: the oldest claimable session of the claim's version and queues, in a
/// queue below its limit; a recovery beyond the bound parks it and the next is tried.
pub(crate) fn claim_expired(
    store: &MemoryStore,
    claim: &Claim,
) -> Result<Option<Lease>, StoreError> {
    claim.validate()?;
    let now = store.clock();
    let mut state = store.lock();
    let full: Vec<String> = state
        .queues
        .iter()
        .filter(|(queue, max)| {
            let running = state
                .sessions
                .values()
                .filter(|s| s.record.queue == **queue)
                .filter(|s| s.record.status == SessionStatus::Active && live(&s.record, now))
                .count();
            running >= usize::try_from(**max).unwrap_or(usize::MAX)
        })
        .map(|(queue, _)| queue.clone())
        .collect();
    let full_tenants: Vec<String> = state
        .tenants
        .iter()
        .filter(|(tenant, max)| {
            let running = state
                .sessions
                .values()
                .filter(|s| s.tenant.as_ref() == Some(*tenant))
                .filter(|s| s.record.status == SessionStatus::Active && live(&s.record, now))
                .count();
            running >= usize::try_from(**max).unwrap_or(usize::MAX)
        })
        .map(|(tenant, _)| tenant.clone())
        .collect();
    let mut candidates: Vec<(i64, u64, SessionId)> = state
        .sessions
        .values()
        .filter(|s| claimable(s, now))
        .filter(|s| {
            claim
                .app_version
                .as_ref()
                .is_none_or(|v| *v == s.record.app_version)
        })
        .filter(|s| claim.queues.is_empty() || claim.queues.contains(&s.record.queue))
        .filter(|s| !full.contains(&s.record.queue))
        .filter(|s| s.tenant.as_ref().is_none_or(|t| !full_tenants.contains(t)))
        .map(|s| {
            let rank = s.rank.unwrap_or(s.record.created_at);
            (rank, s.order, s.record.id.clone())
        })
        .collect();
    candidates.sort();
    for (_, _, id) in candidates {
        let session = state.session_mut(&id)?;
        if let Some(lease) = take(session, &claim.owner, now, claim.ttl, claim.max_attempts) {
            return Ok(Some(lease));
        }
    }
    Ok(None)
}

/// `list_expired`: active, awake sessions whose lease is free, oldest update first.
pub(crate) fn list_expired(
    store: &MemoryStore,
    limit: i64,
) -> Result<Vec<SessionRecord>, StoreError> {
    let now = store.clock();
    let state = store.lock();
    let mut found: Vec<&Session> = state
        .sessions
        .values()
        .filter(|s| {
            let r = &s.record;
            r.status == SessionStatus::Active
                && !live(r, now)
                && r.wake_at.is_none_or(|at| at <= now)
                && r.waiting_until.is_none_or(|at| at <= now)
        })
        .collect();
    found.sort_by_key(|s| (s.record.updated_at, s.order));
    let limit = usize::try_from(limit.max(0)).unwrap_or(usize::MAX);
    Ok(found
        .into_iter()
        .take(limit)
        .map(|s| s.record.clone())
        .collect())
}

/// `unpark_session`: an operator returns a parked session to `active`, counter cleared,
/// lease released (the next take is not a recovery).
pub(crate) fn unpark_session(
    store: &MemoryStore,
    id: &SessionId,
) -> Result<SessionRecord, StoreError> {
    let now = store.clock();
    let mut state = store.lock();
    let r = &mut state.session_mut(id)?.record;
    if r.status != SessionStatus::Parked {
        return Err(StoreError::NotParked {
            session: id.clone(),
            status: r.status.as_str().to_owned(),
        });
    }
    r.status = SessionStatus::Active;
    r.status_reason = None;
    r.recovery_attempts = 0;
    r.lease_owner = None;
    r.lease_expires_at = None;
    r.updated_at = now;
    Ok(r.clone())
}
