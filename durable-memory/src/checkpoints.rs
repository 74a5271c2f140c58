//! Checkpoints and the message log: compare-and-set writes that append messages, checked
//! loads (whole or a window of the transcript), listings, and forks.

use durable_core::integrity::Keyring;
use durable_core::store::{
    CallStatus, Checkpoint, CheckpointMeta, Fence, ForkSession, Lease, NewCheckpoint,
    SessionRecord, SessionStatus, StoredMessage, fork_audit_map, fork_copies,
};
use durable_core::validate::validate_owner;
use durable_core::{CallId, SessionId, StoreError};
use serde_json::Value;

use crate::state::{CallRow, CheckpointRow, MessageRow, Session, State};
use crate::{MemoryStore, millis, seal, sessions};

fn missing(session: &SessionId, what: String) -> StoreError {
    StoreError::Tampered {
        session: session.clone(),
        what,
        detail: "it is missing".to_owned(),
    }
}

/// Appends `checkpoint.messages` to the log and writes version `expected + 1`, sealed and
/// chained to the previous version; the head is re-sealed. Compare-and-set: nothing is
/// written unless the latest version is `expected` (`-1`: the session's first).
pub(crate) fn append(
    ring: &Keyring,
    now: i64,
    session: &mut Session,
    expected: i64,
    checkpoint: &NewCheckpoint,
) -> Result<CheckpointMeta, StoreError> {
    let id = session.record.id.clone();
    let latest = session.record.latest_version;
    if latest != expected {
        return Err(StoreError::VersionConflict {
            session: id,
            expected,
            actual: latest,
        });
    }
    // Where the log and the chain of checkpoints stand.
    let (mut last_seq, mut count, mut chain, previous) = if expected < 0 {
        (0, 0, String::new(), String::new())
    } else {
        let cp = session
            .checkpoint(latest)
            .ok_or_else(|| missing(&id, format!("checkpoint {latest}")))?;
        let chain = match cp.last_seq {
            0 => String::new(),
            seq => session
                .message(seq)
                .ok_or_else(|| missing(&id, format!("message {seq}")))?
                .seal
                .clone()
                .unwrap_or_default(),
        };
        (
            cp.last_seq,
            cp.message_count,
            chain,
            cp.seal.clone().unwrap_or_default(),
        )
    };
    // Everything is computed (and sealed) before anything is written.
    let mut logged = Vec::with_capacity(checkpoint.messages.len());
    for message in &checkpoint.messages {
        last_seq += 1;
        count += 1;
        let text = seal::text(message);
        chain = seal::seal_message(ring, &id, last_seq, &text, &chain)?;
        logged.push(MessageRow {
            seq: last_seq,
            text,
            seal: Some(chain.clone()),
        });
    }
    let mut row = CheckpointRow {
        version: expected + 1,
        last_seq,
        message_count: count,
        plan: seal::text(&checkpoint.plan),
        budget: seal::text(&checkpoint.budget),
        state: seal::text(&checkpoint.state),
        app_version: session.record.app_version.clone(),
        created_at: now,
        seal: None,
    };
    row.seal = Some(seal::raw_checkpoint(&id, &row, &chain, &previous).seal(ring)?);
    let meta = meta(&id, &row);
    session.messages.extend(logged);
    session.checkpoints.push(row);
    let r = &mut session.record;
    r.latest_version = meta.version;
    r.recovery_attempts = 0;
    r.updated_at = now;
    r.wake_at = checkpoint.wake_at;
    seal::seal_head(ring, session)?;
    Ok(meta)
}

fn meta(session: &SessionId, row: &CheckpointRow) -> CheckpointMeta {
    CheckpointMeta {
        session: session.clone(),
        version: row.version,
        last_seq: row.last_seq,
        message_count: row.message_count,
        app_version: row.app_version.clone(),
        created_at: row.created_at,
    }
}

fn parse(session: &SessionId, version: i64, what: &str, text: &str) -> Result<Value, StoreError> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt {
        session: session.clone(),
        version: Some(version),
        detail: format!("{what} is not JSON: {e}"),
    })
}

/// `save_checkpoint`: fenced, compare-and-set.
pub(crate) fn save_checkpoint(
    store: &MemoryStore,
    fence: Fence<'_>,
    expected: i64,
    checkpoint: NewCheckpoint,
) -> Result<CheckpointMeta, StoreError> {
    write(store, fence, expected, checkpoint, false)
}

/// The final checkpoint and the session's completion, under one lock.
pub(crate) fn complete_with_checkpoint(
    store: &MemoryStore,
    fence: Fence<'_>,
    expected: i64,
    checkpoint: NewCheckpoint,
) -> Result<CheckpointMeta, StoreError> {
    write(store, fence, expected, checkpoint, true)
}

/// A checkpoint appended under one lock; `completes` marks the session `completed`
/// under it.
fn write(
    store: &MemoryStore,
    fence: Fence<'_>,
    expected: i64,
    checkpoint: NewCheckpoint,
    completes: bool,
) -> Result<CheckpointMeta, StoreError> {
    let now = store.clock();
    let mut state = store.lock();
    let session = sessions::fenced(store, &mut state, fence)?;
    let meta = append(store.ring(), now, session, expected, &checkpoint)?;
    if completes {
        sessions::end(session, SessionStatus::Completed, None, now, true);
        crate::family::wake_parent(&mut state, fence.session);
    }
    Ok(meta)
}

/// A checked checkpoint with the last `window` messages of its transcript (all when
/// `None`): the head, the checkpoint's seal over its snapshots and transcript end, and
/// each message's seal in the chain.
pub(crate) fn load(
    ring: &Keyring,
    state: &State,
    id: &SessionId,
    version: Option<i64>,
    window: Option<usize>,
) -> Result<Checkpoint, StoreError> {
    let session = state.session(id)?;
    seal::check_head(ring, session)?;
    let version = version.unwrap_or(session.record.latest_version);
    let row = session
        .checkpoint(version)
        .ok_or_else(|| StoreError::VersionNotFound {
            session: id.clone(),
            version,
        })?;
    let previous = match version {
        0 => String::new(),
        v => session
            .checkpoint(v - 1)
            .ok_or_else(|| missing(id, format!("checkpoint {}", v - 1)))?
            .seal
            .clone()
            .unwrap_or_default(),
    };
    let from = match window {
        Some(window) => (row.last_seq - i64::try_from(window).unwrap_or(i64::MAX)).max(0) + 1,
        None => 1,
    };
    let (texts, chain) = seal::checked_messages(ring, session, from, row.last_seq)?;
    seal::raw_checkpoint(id, row, &chain, &previous).check(ring, row.seal.as_deref())?;
    Ok(Checkpoint {
        meta: meta(id, row),
        messages: texts.into_iter().map(StoredMessage::new).collect(),
        plan: parse(id, version, "the plan", &row.plan)?,
        budget: parse(id, version, "the budget", &row.budget)?,
        state: parse(id, version, "the state", &row.state)?,
    })
}

/// `load_checkpoint` and `load_checkpoint_window`.
pub(crate) fn load_checkpoint(
    store: &MemoryStore,
    id: &SessionId,
    version: Option<i64>,
    window: Option<usize>,
) -> Result<Checkpoint, StoreError> {
    load(store.ring(), &store.lock(), id, version, window)
}

/// `messages`: a checked range of the latest checkpoint's transcript.
pub(crate) fn messages(
    store: &MemoryStore,
    id: &SessionId,
    from: i64,
    to: i64,
) -> Result<Vec<StoredMessage>, StoreError> {
    let state = store.lock();
    let session = state.session(id)?;
    seal::check_head(store.ring(), session)?;
    let latest = session.record.latest_version;
    let last_seq = session
        .checkpoint(latest)
        .ok_or_else(|| missing(id, format!("checkpoint {latest}")))?
        .last_seq;
    durable_core::store::check_message_range(id, from, to, last_seq)?;
    if from > to {
        return Ok(Vec::new());
    }
    let (texts, _) = seal::checked_messages(store.ring(), session, from, to)?;
    Ok(texts.into_iter().map(StoredMessage::new).collect())
}

/// Checkpoint metadata, oldest first (no seal checked).
pub(crate) fn list_checkpoints(
    store: &MemoryStore,
    id: &SessionId,
) -> Result<Vec<CheckpointMeta>, StoreError> {
    let state = store.lock();
    let session = state.session(id)?;
    let mut listed: Vec<CheckpointMeta> = session.checkpoints.iter().map(|c| meta(id, c)).collect();
    listed.sort_by_key(|m| m.version);
    Ok(listed)
}

/// A fork: the source's checkpoint and journal checked, then the new session (its
/// transcript copied byte for byte and re-sealed under its own id, version 0, the
/// parent's effects it must not repeat, an audit row) written at once.
pub(crate) fn fork_session(
    store: &MemoryStore,
    fork: &ForkSession,
) -> Result<(SessionRecord, Lease), StoreError> {
    fork.new_id.validate()?;
    validate_owner(&fork.owner)?;
    let ring = store.ring();
    let now = store.clock();
    let mut state = store.lock();
    // The source is checked before it is copied: a fork must not launder a forged
    // transcript or journal under fresh seals.
    let checkpoint = load(ring, &state, &fork.source, Some(fork.version), None)?;
    let source = state.session(&fork.source)?;
    let rows: Vec<CallRow> = seal::checked_journal(ring, source)?
        .into_iter()
        .cloned()
        .collect();
    let records: Vec<_> = rows.iter().map(|r| r.record.clone()).collect();
    let copies = fork_copies(fork, &records)?;
    if state.sessions.contains_key(&fork.new_id) {
        return Err(StoreError::SessionExists(fork.new_id.clone()));
    }
    let source = state.session(&fork.source)?;
    let expires_at = now.saturating_add(millis(fork.ttl));
    let record = SessionRecord {
        id: fork.new_id.clone(),
        status: SessionStatus::Active,
        app_version: source.record.app_version.clone(),
        metadata: source.record.metadata.clone(),
        lease_owner: Some(fork.owner.clone()),
        lease_expires_at: Some(expires_at),
        fence: 1,
        recovery_attempts: 0,
        status_reason: None,
        latest_version: 0,
        created_at: now,
        updated_at: now,
        queue: source.record.queue.clone(),
        wake_at: None,
        lease_renewed_at: Some(now),
        parent: None,
        waiting_until: None,
        waiting_for: None,
        cancel_requested: None,
    };
    let mut new = sessions::empty(record, state.created);
    let id = &fork.new_id;
    // The transcript, its text unchanged, chained under the new session's id.
    let mut chain = String::new();
    for (seq, text) in (1..).zip(checkpoint.messages) {
        let text = text.into_string();
        chain = seal::seal_message(ring, id, seq, &text, &chain)?;
        new.messages.push(MessageRow {
            seq,
            text,
            seal: Some(chain.clone()),
        });
    }
    let source_row =
        source
            .checkpoint(fork.version)
            .ok_or_else(|| StoreError::VersionNotFound {
                session: fork.source.clone(),
                version: fork.version,
            })?;
    let mut row = CheckpointRow {
        version: 0,
        app_version: source.record.app_version.clone(),
        created_at: now,
        seal: None,
        ..source_row.clone()
    };
    row.seal = Some(seal::raw_checkpoint(id, &row, &chain, "").seal(ring)?);
    new.checkpoints.push(row);
    // The parent's effects: each copy with a new id, its step and position in the fork.
    let mut pairs: Vec<(CallId, CallId)> = Vec::with_capacity(copies.len());
    for copy in &copies {
        let from = rows
            .iter()
            .find(|r| r.record.id == copy.from && r.record.mac == copy.mac)
            .ok_or_else(|| StoreError::ForkSourceChanged(fork.source.clone()))?;
        let mut copied = from.clone();
        copied.record.id = copy.to.clone();
        copied.record.identity.session = id.clone();
        copied.record.identity.step = copy.step;
        if let Some(ordinal) = copy.ordinal {
            copied.record.identity.ordinal = ordinal;
        }
        copied.record.fence = 1;
        copied.seq = copy.seq;
        copied.operator_needed = false;
        seal::seal_call(ring, &mut copied)?;
        if copied.record.status == CallStatus::Issued {
            new.head.issued_rows += 1;
        }
        new.journal.push(copied);
        pairs.push((copy.from.clone(), copy.to.clone()));
    }
    new.head.journal_rows = i64::try_from(new.journal.len()).unwrap_or(i64::MAX);
    new.migrations.push((
        fork.by.clone(),
        fork_audit_map(&fork.source, fork.version, &pairs, &fork.rerun),
    ));
    seal::seal_head(ring, &mut new)?;
    let lease = Lease {
        session: id.clone(),
        owner: fork.owner.clone(),
        fence: 1,
        expires_at,
    };
    let record = new.record.clone();
    state.created += 1;
    for row in &new.journal {
        state.calls.insert(row.record.id.clone(), id.clone());
    }
    state.sessions.insert(id.clone(), new);
    Ok((record, lease))
}
