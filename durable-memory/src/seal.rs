//! Integrity: the memory store's rows mapped onto the sealed rows of
//! `durable_core::integrity::rows`, which seal and check them as they do every
//! backend's. The schemes, the head's counts and the texts of a `Tampered` error are
//! core's; this module only says which field of a memory row is which column.

use durable_core::integrity::Keyring;
use durable_core::integrity::rows::{
    self, HeadRow, RawApproval, RawCall, RawCheckpoint, RawResolution, check_journal_extent,
};
use durable_core::{SessionId, StoreError};

use crate::state::{AuditRow, CallRow, CheckpointRow, Session};

/// The JSON text a value is sealed (and, in a SQL backend, stored) as.
pub(crate) fn text(value: &serde_json::Value) -> String {
    value.to_string()
}

/// A journal row as its sealed columns.
fn raw_call(row: &CallRow) -> Result<RawCall, StoreError> {
    let r = &row.record;
    let approval = r
        .approval
        .as_ref()
        .map(serde_json::to_string)
        .transpose()
        .map_err(|e| StoreError::Corrupt {
            session: r.identity.session.clone(),
            version: None,
            detail: format!("journal row `{}`: its approval does not encode: {e}", r.id),
        })?;
    Ok(RawCall {
        id: r.id.as_str().to_owned(),
        session: r.identity.session.as_str().to_owned(),
        kind: r.kind.as_str().to_owned(),
        step: r.identity.step,
        tool: r.identity.tool.clone(),
        input_hash: r.identity.input_hash.clone(),
        ordinal: r.identity.ordinal,
        class: r.class.as_str().to_owned(),
        status: r.status.as_str().to_owned(),
        args: text(&r.args),
        key: r.idempotency_key.clone(),
        schema_hash: r.schema_hash.clone(),
        result: r.result.as_ref().map(text),
        error: r.error.as_ref().map(text),
        spend: r.spend.as_ref().map(text),
        attempt: i64::from(r.attempt),
        seq: row.seq,
        mac: r.mac.clone(),
        approval,
    })
}

/// Seals a journal row as it now stands.
pub(crate) fn seal_call(ring: &Keyring, row: &mut CallRow) -> Result<(), StoreError> {
    let mut raw = raw_call(row)?;
    raw.seal(ring)?;
    row.record.mac = raw.mac;
    Ok(())
}

/// Checks a journal row's seal.
pub(crate) fn check_call(ring: &Keyring, row: &CallRow) -> Result<(), StoreError> {
    raw_call(row)?.check(ring)
}

/// The session head as its sealed columns: its counts, its latest version and that
/// checkpoint's seal.
fn head_row(session: &Session) -> HeadRow {
    let latest = session.record.latest_version;
    HeadRow {
        session: session.record.id.clone(),
        journal_rows: session.head.journal_rows,
        latest_version: latest,
        resolutions: session.head.resolutions,
        issued_rows: Some(session.head.issued_rows),
        approvals: session.head.approvals,
        checkpoint_seal: session
            .checkpoint(latest)
            .and_then(|c| c.seal.clone())
            .unwrap_or_default(),
        head: session.head.seal.clone(),
    }
}

/// Re-seals the head after a write changed a count or the latest checkpoint.
pub(crate) fn seal_head(ring: &Keyring, session: &mut Session) -> Result<(), StoreError> {
    let mut head = head_row(session);
    head.seal(ring)?;
    session.head.seal = head.head;
    Ok(())
}

/// Checks the head's seal: every read and fenced write starts here.
pub(crate) fn check_head(ring: &Keyring, session: &Session) -> Result<(), StoreError> {
    head_row(session).check(ring)
}

/// The whole journal in position order, checked: the head, the journal's extent
/// (positions `1..=journal_rows`, each once), every row's seal, and the head's count of
/// issued rows. In memory the whole journal is at hand, so every read checks all of it
/// (a SQL backend reads one step and its neighbours instead).
pub(crate) fn checked_journal<'s>(
    ring: &Keyring,
    session: &'s Session,
) -> Result<Vec<&'s CallRow>, StoreError> {
    let head = head_row(session);
    head.check(ring)?;
    let mut journal: Vec<&CallRow> = session.journal.iter().collect();
    journal.sort_by_key(|r| r.seq);
    // A SQL table's unique index keeps one row per position; here a copied row would
    // not be caught by the extent, which counts rows and their ends.
    if let Some(w) = journal.windows(2).find(|w| w[0].seq == w[1].seq) {
        return Err(StoreError::Tampered {
            session: head.session.clone(),
            what: "the journal".to_owned(),
            detail: format!("two rows are at position {}", w[0].seq),
        });
    }
    let count = i64::try_from(journal.len()).unwrap_or(i64::MAX);
    let top = journal.last().map_or(0, |r| r.seq);
    let bottom = journal.first().map_or(1, |r| r.seq);
    check_journal_extent(&head, count, top, bottom)?;
    for row in &journal {
        check_call(ring, row)?;
    }
    let issued = journal
        .iter()
        .filter(|r| r.record.status == durable_core::store::CallStatus::Issued)
        .count();
    head.check_issued(issued)?;
    Ok(journal)
}

/// The seal of message `seq` with `text`, chained to the previous message's seal.
pub(crate) fn seal_message(
    ring: &Keyring,
    session: &SessionId,
    seq: i64,
    text: &str,
    previous: &str,
) -> Result<String, StoreError> {
    rows::seal_message(ring, session, seq, text, previous)
}

/// Checks messages `from..=to` of the log, chained from the stored seal of the message
/// before `from`; returns their texts and the last seal of the chain.
pub(crate) fn checked_messages(
    ring: &Keyring,
    session: &Session,
    from: i64,
    to: i64,
) -> Result<(Vec<String>, String), StoreError> {
    let id = &session.record.id;
    let missing = |seq: i64| StoreError::Tampered {
        session: id.clone(),
        what: format!("message {seq}"),
        detail: "it is missing from the transcript".to_owned(),
    };
    let mut chain = if from <= 1 {
        String::new()
    } else {
        let anchor = session.message(from - 1).ok_or_else(|| missing(from - 1))?;
        anchor.seal.clone().unwrap_or_default()
    };
    let mut texts = Vec::new();
    for seq in from..=to {
        let message = session.message(seq).ok_or_else(|| missing(seq))?;
        rows::check_message(
            ring,
            id,
            seq,
            &message.text,
            &chain,
            message.seal.as_deref(),
        )?;
        chain = message.seal.clone().unwrap_or_default();
        texts.push(message.text.clone());
    }
    Ok((texts, chain))
}

/// A checkpoint as its sealed columns, given its transcript's last message seal and the
/// previous checkpoint's seal.
pub(crate) fn raw_checkpoint<'a>(
    session: &'a SessionId,
    row: &'a CheckpointRow,
    last_message_seal: &'a str,
    previous: &'a str,
) -> RawCheckpoint<'a> {
    RawCheckpoint {
        session,
        version: row.version,
        last_seq: row.last_seq,
        message_count: row.message_count,
        last_message_seal,
        plan: &row.plan,
        budget: &row.budget,
        state: &row.state,
        app_version: &row.app_version,
        previous,
    }
}

/// Seals a resolution audit row at its position.
pub(crate) fn seal_resolution(
    ring: &Keyring,
    session: &SessionId,
    row: &mut AuditRow,
) -> Result<(), StoreError> {
    row.seal = Some(ring.seal(&rows::resolution_fields(
        row.call.as_str(),
        session,
        row.position,
        &row.event,
        row.result.as_deref(),
        &row.by,
        row.note.as_deref(),
    ))?);
    Ok(())
}

/// Checks the resolutions: each at its position under its seal, counted by the head.
pub(crate) fn check_resolutions(ring: &Keyring, session: &Session) -> Result<(), StoreError> {
    let head = head_row(session);
    head.check(ring)?;
    let raws: Vec<RawResolution> = session
        .resolutions
        .iter()
        .map(|row| RawResolution {
            call: row.call.as_str().to_owned(),
            position: row.position,
            decision: row.event.clone(),
            result: row.result.clone(),
            by: row.by.clone(),
            note: row.note.clone(),
            seal: row.seal.clone(),
        })
        .collect();
    rows::check_resolutions(ring, &head, &raws)
}

/// An approval audit row as its sealed columns (`result` holds the edited arguments).
fn raw_approval(row: &AuditRow) -> RawApproval {
    RawApproval {
        call: row.call.as_str().to_owned(),
        position: row.position,
        event: row.event.clone(),
        actor: row.by.clone(),
        note: row.note.clone(),
        args_before: row.args_before.clone(),
        args_after: row.result.clone(),
        seal: row.seal.clone(),
    }
}

/// Seals an approval audit row at its position.
pub(crate) fn seal_approval(
    ring: &Keyring,
    session: &SessionId,
    row: &mut AuditRow,
) -> Result<(), StoreError> {
    let mut raw = raw_approval(row);
    raw.seal(ring, session)?;
    row.seal = raw.seal;
    Ok(())
}

/// Checks the approval log: each row at its position under its seal, counted by the
/// head.
pub(crate) fn check_approvals(ring: &Keyring, session: &Session) -> Result<(), StoreError> {
    let head = head_row(session);
    head.check(ring)?;
    let raws: Vec<RawApproval> = session.approvals.iter().map(raw_approval).collect();
    rows::check_approvals(ring, &head, &raws)
}
