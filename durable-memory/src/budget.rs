//! Operators' raises of budget ceilings: an audit row per raise, kept with the session
//! (and purged with it).

use durable_core::store::{LimitRaise, RaiseLimit};
use durable_core::{SessionId, StoreError};

use crate::MemoryStore;

/// `raise_limit`: validated, then appended to the session's raises.
pub(crate) fn raise_limit(
    store: &MemoryStore,
    raise: RaiseLimit,
) -> Result<LimitRaise, StoreError> {
    raise.validate()?;
    let at = store.clock();
    let mut state = store.lock();
    let session = state
        .sessions
        .get_mut(&raise.session)
        .ok_or_else(|| StoreError::SessionNotFound(raise.session.clone()))?;
    let ceiling = i64::try_from(raise.ceiling).unwrap_or(i64::MAX);
    let row = LimitRaise::from_row(
        raise.session,
        &raise.limit.to_string(),
        ceiling,
        raise.by,
        raise.note,
        at,
    )?;
    session.raises.push(row.clone());
    Ok(row)
}

/// `limit_raises`: the session's raises in the order they were written (none for a
/// session that does not exist).
pub(crate) fn limit_raises(store: &MemoryStore, session: &SessionId) -> Vec<LimitRaise> {
    store
        .lock()
        .sessions
        .get(session)
        .map(|s| s.raises.clone())
        .unwrap_or_default()
}
