//! Fleet-wide rate limits: definitions, buckets and waiters, under the store's one lock
//! (which serialises every acquire, as a SQL backend's row lock does).

use std::time::Duration;

use durable_core::StoreError;
use durable_core::limiter::{
    Acquire, Admission, Defined, LimiterInfo, LimiterState, RateLimit, WaiterStep, abandoned_us,
    admission,
};

use crate::MemoryStore;

/// A limit as stored: its definition, its buckets and its waiters' reservations
/// (waiter id → start, µs).
#[derive(Debug, Clone)]
pub(crate) struct LimitRow {
    pub(crate) limit: RateLimit,
    pub(crate) state: LimiterState,
    pub(crate) waiters: std::collections::BTreeMap<String, i64>,
}

fn not_defined(name: &str) -> StoreError {
    StoreError::LimitNotDefined {
        name: name.to_owned(),
    }
}

/// `define_limit`: the last definition wins.
pub(crate) fn define_limit(
    store: &MemoryStore,
    name: &str,
    limit: &RateLimit,
) -> Result<Defined, StoreError> {
    limit.validate(name)?;
    let mut state = store.lock();
    match state.limits.get_mut(name) {
        Some(row) if row.limit == *limit => Ok(Defined::Unchanged),
        Some(row) => {
            let previous = std::mem::replace(&mut row.limit, *limit);
            Ok(Defined::Replaced { previous })
        }
        None => {
            state.limits.insert(
                name.to_owned(),
                LimitRow {
                    limit: *limit,
                    state: LimiterState::default(),
                    waiters: Default::default(),
                },
            );
            Ok(Defined::Created)
        }
    }
}

/// `acquire_limit`: a reservation in arrival order.
pub(crate) fn acquire_limit(
    store: &MemoryStore,
    acquire: &Acquire,
) -> Result<Admission, StoreError> {
    durable_core::limiter::validate_name(&acquire.limit)?;
    let now = store.clock();
    let mut state = store.lock();
    let row = state
        .limits
        .get_mut(&acquire.limit)
        .ok_or_else(|| not_defined(&acquire.limit))?;
    let horizon = now.saturating_mul(1000) - abandoned_us();
    row.waiters.retain(|_, start| *start >= horizon);
    let found = acquire
        .waiter
        .as_ref()
        .and_then(|w| row.waiters.get(w).copied());
    let start = match WaiterStep::decide(found, now, &row.state) {
        WaiterStep::Take { start } => {
            if let Some(w) = &acquire.waiter {
                row.waiters.remove(w);
            }
            start
        }
        WaiterStep::Keep { start } => start,
        WaiterStep::Reserve => {
            let start = row.state.reserve(&row.limit, acquire.tokens, now);
            if let Some(w) = acquire.waiter.as_ref().filter(|_| start > now * 1000) {
                row.waiters.insert(w.clone(), start);
            }
            start
        }
    };
    let ahead = row.waiters.values().filter(|&&s| s < start).count();
    Ok(admission(
        start,
        now,
        i64::try_from(ahead).unwrap_or(i64::MAX),
    ))
}

/// `charge_limit`: tokens used beyond the start's charge.
pub(crate) fn charge_limit(store: &MemoryStore, name: &str, tokens: u64) -> Result<(), StoreError> {
    let now = store.clock();
    let mut state = store.lock();
    let row = state
        .limits
        .get_mut(name)
        .ok_or_else(|| not_defined(name))?;
    row.state.charge(&row.limit, tokens, now);
    Ok(())
}

/// `throttle_limit`: a provider's `429` holds the fleet.
pub(crate) fn throttle_limit(
    store: &MemoryStore,
    name: &str,
    retry_after: Duration,
) -> Result<i64, StoreError> {
    let now = store.clock();
    let mut state = store.lock();
    let row = state
        .limits
        .get_mut(name)
        .ok_or_else(|| not_defined(name))?;
    Ok(row.state.throttle(&row.limit, retry_after, now))
}

/// `limiters`: every limit, by name.
pub(crate) fn limiters(store: &MemoryStore) -> Result<Vec<LimiterInfo>, StoreError> {
    let now = store.clock();
    let state = store.lock();
    Ok(state
        .limits
        .iter()
        .map(|(name, row)| {
            let waiting = row.waiters.values().filter(|&&s| s > now * 1000).count();
            row.state.info(
                name,
                &row.limit,
                i64::try_from(waiting).unwrap_or(i64::MAX),
                now,
            )
        })
        .collect())
}
