//! Maintenance: the error history, app-version migration, purging, the clock and the
//! durability report.

use std::time::Duration;

use durable_core::store::{
    CallStatus, Durability, ErrorRecord, NewError, PurgeOutcome, RetargetSession, SessionRecord,
};
use durable_core::{SessionId, StoreError};

use crate::{MemoryStore, NOT_DURABLE, millis, seal};

/// `durability`: an in-memory store loses everything with the process, and says so
/// unless its owner accepted that.
pub(crate) fn durability(store: &MemoryStore) -> Durability {
    Durability {
        unsafe_setting: (!store.inner.accept_volatile).then(|| NOT_DURABLE.to_owned()),
    }
}

/// `record_error`: appended to the session's retry history.
pub(crate) fn record_error(store: &MemoryStore, error: NewError) -> Result<(), StoreError> {
    error.validate()?;
    let now = store.clock();
    let mut state = store.lock();
    let session = state.session_mut(&error.session)?;
    session.errors.push(ErrorRecord {
        session: error.session,
        step: error.step,
        context: error.context,
        attempt: error.attempt,
        message: error.message,
        at: now,
    });
    Ok(())
}

/// `errors`: the retry history, oldest first; none for an unknown session.
pub(crate) fn errors(store: &MemoryStore, session: &SessionId) -> Vec<ErrorRecord> {
    let state = store.lock();
    state
        .sessions
        .get(session)
        .map(|s| s.errors.clone())
        .unwrap_or_default()
}

/// `retarget_session`: checked version, new version, tools renamed (each row checked
/// under its old name, re-sealed under the new), audited.
pub(crate) fn retarget_session(
    store: &MemoryStore,
    migrate: RetargetSession,
) -> Result<SessionRecord, StoreError> {
    migrate.validate()?;
    let ring = store.ring();
    let now = store.clock();
    let mut state = store.lock();
    let session = state.session_mut(&migrate.session)?;
    if session.record.app_version != migrate.from_version {
        return Err(StoreError::AppVersionMismatch {
            session: migrate.session.clone(),
            expected: migrate.from_version.clone(),
            actual: session.record.app_version.clone(),
        });
    }
    // A mapping, not a chain: each row is renamed at most once, by the first pair
    // naming its tool.
    let mut renamed = Vec::new();
    for (at, row) in session.journal.iter().enumerate() {
        if let Some((_, new)) = migrate
            .step_map
            .iter()
            .find(|(old, _)| *old == row.record.identity.tool)
        {
            seal::check_call(ring, row)?;
            let mut row = row.clone();
            row.record.identity.tool = new.clone();
            seal::seal_call(ring, &mut row)?;
            renamed.push((at, row));
        }
    }
    for (at, row) in renamed {
        session.journal[at] = row;
    }
    session.record.app_version = migrate.to_version.clone();
    session.record.updated_at = now;
    session.migrations.push((migrate.by, migrate.step_map));
    Ok(session.record.clone())
}

/// `purge_session`: a terminal session past its retention with nothing in doubt, and
/// every row of it.
pub(crate) fn purge_session(
    store: &MemoryStore,
    id: &SessionId,
    retention: Duration,
) -> Result<PurgeOutcome, StoreError> {
    let now = store.clock();
    let mut state = store.lock();
    let session = state.session(id)?;
    if !session.record.status.is_terminal() {
        return Ok(PurgeOutcome::NotTerminal);
    }
    if session.record.updated_at > now.saturating_sub(millis(retention)) {
        return Ok(PurgeOutcome::WithinRetention);
    }
    if session
        .journal
        .iter()
        .any(|r| r.record.status == CallStatus::Issued)
    {
        return Ok(PurgeOutcome::CallInDoubt);
    }
    if let Some(session) = state.sessions.remove(id) {
        for row in session.journal {
            state.calls.remove(&row.record.id);
        }
        state.signals.retain(|s| s.session != *id);
    }
    Ok(PurgeOutcome::Purged)
}
