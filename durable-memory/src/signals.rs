//! Signals: sent into a session, consumed once under the consumer's key.

use durable_core::store::{Fence, NewSignal, SignalRecord, waiting_for_signal};
use durable_core::{SessionId, StoreError};

use crate::{MemoryStore, sessions};

/// `send_signal`: the row, the key's dedup and the wake-up, under the one lock.
pub(crate) fn send_signal(
    store: &MemoryStore,
    signal: &NewSignal,
) -> Result<SignalRecord, StoreError> {
    signal.validate()?;
    let now = store.clock();
    let mut state = store.lock();
    let session = state.session(&signal.session)?;
    if session.record.status.is_terminal() {
        return Err(StoreError::SessionEnded {
            session: signal.session.clone(),
            status: session.record.status.as_str().to_owned(),
        });
    }
    if let Some(key) = &signal.key
        && let Some(sent) = state
            .signals
            .iter()
            .find(|s| s.session == signal.session && s.key.as_ref() == Some(key))
    {
        return if sent.same_send(signal) {
            Ok(sent.clone())
        } else {
            Err(sent.key_conflict())
        };
    }
    state.signal_seq += 1;
    let record = SignalRecord::new(
        state.signal_seq,
        signal.session.clone(),
        signal.name.clone(),
        signal.payload.clone(),
        signal.sent_by.clone(),
        signal.key.clone(),
        now,
        None,
    );
    state.signals.push(record.clone());
    let session = state.session_mut(&signal.session)?;
    if session.record.waiting_for.as_deref() == Some(waiting_for_signal(&signal.name).as_str()) {
        session.record.waiting_for = None;
        session.record.waiting_until = None;
    }
    Ok(record)
}

/// `consume_signal`: this consumer's signal, else the oldest pending one of the name.
pub(crate) fn consume_signal(
    store: &MemoryStore,
    fence: Fence<'_>,
    name: &str,
    consumer: &str,
) -> Result<Option<SignalRecord>, StoreError> {
    let now = store.clock();
    let mut state = store.lock();
    sessions::fenced(store, &mut state, fence)?;
    let mine = |s: &SignalRecord| s.session == *fence.session && s.name == name;
    // The guard a re-run read relies on: the signal its consumer key took before.
    if !durable_core::guard_switch::guard_off("signal_key")
        && let Some(taken) = state
            .signals
            .iter()
            .find(|s| mine(s) && s.consumed_by.as_deref() == Some(consumer))
    {
        return Ok(Some(taken.clone()));
    }
    let Some(next) = state.signals.iter_mut().find(|s| mine(s) && s.is_pending()) else {
        return Ok(None);
    };
    next.consumed_by = Some(consumer.to_owned());
    next.consumed_at = Some(now);
    Ok(Some(next.clone()))
}

/// `signals`: the session's, oldest first.
pub(crate) fn signals(
    store: &MemoryStore,
    session: &SessionId,
) -> Result<Vec<SignalRecord>, StoreError> {
    let state = store.lock();
    state.session(session)?;
    Ok(state
        .signals
        .iter()
        .filter(|s| s.session == *session)
        .cloned()
        .collect())
}

/// Whether a signal named `name` is pending for `session` (a wait's check).
pub(crate) fn pending(state: &crate::state::State, session: &SessionId, name: &str) -> bool {
    state
        .signals
        .iter()
        .any(|s| s.session == *session && s.name == name && s.is_pending())
}
