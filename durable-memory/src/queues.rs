//! Queues and sleepers: fleet-wide queue limits, the figures operators watch, the next
//! wake-up time and an operator's early wake-up.

use std::collections::BTreeMap;

use durable_core::store::{QueueInfo, SessionRecord, SessionStatus, TenantInfo};
use durable_core::validate::validate_id;
use durable_core::{SessionId, StoreError};

use crate::MemoryStore;
use crate::leases::live;

/// `set_queue_limit`: sets or removes a queue's limit.
pub(crate) fn set_queue_limit(
    store: &MemoryStore,
    queue: &str,
    max_running: Option<u32>,
) -> Result<(), StoreError> {
    validate_id("queue", queue)?;
    let mut state = store.lock();
    match max_running {
        Some(max) => state.queues.insert(queue.to_owned(), max),
        None => state.queues.remove(queue),
    };
    Ok(())
}

/// `set_tenant_limit`: sets or removes a tenant's limit.
pub(crate) fn set_tenant_limit(
    store: &MemoryStore,
    tenant: &str,
    max_running: Option<u32>,
) -> Result<(), StoreError> {
    validate_id("tenant", tenant)?;
    let mut state = store.lock();
    match max_running {
        Some(max) => state.tenants.insert(tenant.to_owned(), max),
        None => state.tenants.remove(tenant),
    };
    Ok(())
}

/// `queues`: every queue with a session that is not terminal, or with a limit.
/// `tenants`: every tenant with a limit or an active session, with its figures.
pub(crate) fn tenants(store: &MemoryStore) -> Result<Vec<TenantInfo>, StoreError> {
    let now = store.clock();
    let state = store.lock();
    let mut out: BTreeMap<String, TenantInfo> = state
        .tenants
        .iter()
        .map(|(name, max)| {
            (
                name.clone(),
                TenantInfo::new(name.clone(), Some(*max), 0, 0),
            )
        })
        .collect();
    for s in state.sessions.values() {
        let Some(tenant) = &s.tenant else { continue };
        if s.record.status != SessionStatus::Active {
            continue;
        }
        let info = out
            .entry(tenant.clone())
            .or_insert_with(|| TenantInfo::new(tenant.clone(), None, 0, 0));
        if live(&s.record, now) {
            info.running += 1;
        } else {
            info.queued += 1;
        }
    }
    Ok(out.into_values().collect())
}

pub(crate) fn queues(store: &MemoryStore) -> Result<Vec<QueueInfo>, StoreError> {
    let now = store.clock();
    let state = store.lock();
    let mut out: BTreeMap<String, QueueInfo> = state
        .queues
        .iter()
        .map(|(name, max)| {
            let mut info = QueueInfo::new(name.clone());
            info.max_running = Some(*max);
            (name.clone(), info)
        })
        .collect();
    for s in state.sessions.values().map(|s| &s.record) {
        if s.status.is_terminal() {
            continue;
        }
        let info = out
            .entry(s.queue.clone())
            .or_insert_with(|| QueueInfo::new(s.queue.clone()));
        match s.status {
            SessionStatus::Active if live(s, now) => info.running += 1,
            SessionStatus::Active if s.waiting_until.is_some_and(|until| until > now) => {
                info.waiting += 1;
            }
            SessionStatus::Active => match s.wake_at.filter(|&at| at > now) {
                Some(at) => {
                    info.sleeping += 1;
                    info.next_wake_at = Some(info.next_wake_at.map_or(at, |n| n.min(at)));
                }
                None => info.ready += 1,
            },
            SessionStatus::AwaitingApproval => info.awaiting_approval += 1,
            SessionStatus::Parked => info.parked += 1,
            _ => {}
        }
    }
    Ok(out.into_values().collect())
}

/// `next_wake_at`: the earliest wake-up still to come of a session with a free lease.
pub(crate) fn next_wake_at(store: &MemoryStore) -> Result<Option<i64>, StoreError> {
    let now = store.clock();
    let state = store.lock();
    Ok(state
        .sessions
        .values()
        .map(|s| &s.record)
        .filter(|r| r.status == SessionStatus::Active && !live(r, now))
        .filter_map(|r| r.wake_at.filter(|&at| at > now))
        .min())
}

/// `wake_session`: an active session's sleep ends now.
pub(crate) fn wake_session(
    store: &MemoryStore,
    id: &SessionId,
) -> Result<SessionRecord, StoreError> {
    let now = store.clock();
    let mut state = store.lock();
    let r = &mut state.session_mut(id)?.record;
    if r.status != SessionStatus::Active {
        return Err(StoreError::NotResumable {
            session: id.clone(),
            status: r.status.as_str().to_owned(),
        });
    }
    if r.wake_at.is_some_and(|at| at > now) {
        r.wake_at = Some(now);
    }
    Ok(r.clone())
}
