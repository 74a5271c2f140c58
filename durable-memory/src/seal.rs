//! Integrity: which fields of each row are sealed, and the checks a read makes.
//!
//! The seal schemes are `durable_core::integrity`'s (the same `Fields` the SQL backends
//! seal); this module only maps the memory store's rows onto them. It is the one place
//! that does, so it is what moves when sealing moves into core.

use durable_core::integrity::{
    ApprovalFields, CallFields, CheckpointFields, Fields, Head as HeadFields, Keyring,
    ResolutionFields, message_fields,
};
use durable_core::store::CallStatus;
use durable_core::{SessionId, StoreError};

use crate::state::{AuditRow, CallRow, CheckpointRow, Session};

/// The JSON text a value is sealed (and, in a SQL backend, stored) as.
pub(crate) fn text(value: &serde_json::Value) -> String {
    value.to_string()
}

fn tampered(session: &SessionId, what: String, detail: impl Into<String>) -> StoreError {
    StoreError::Tampered {
        session: session.clone(),
        what,
        detail: detail.into(),
    }
}

/// A journal row's sealed fields: its identity, class, status, arguments, key, schema
/// fingerprint, outcome, spend, attempt, approval and position.
fn call_fields(row: &CallRow) -> Result<Fields, StoreError> {
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
    let (args, result, error, spend) = (
        text(&r.args),
        r.result.as_ref().map(text),
        r.error.as_ref().map(text),
        r.spend.as_ref().map(text),
    );
    Ok(CallFields {
        id: r.id.as_str(),
        session: r.identity.session.as_str(),
        kind: r.kind.as_str(),
        step: r.identity.step,
        tool: &r.identity.tool,
        input_hash: &r.identity.input_hash,
        ordinal: r.identity.ordinal,
        class: r.class.as_str(),
        status: r.status.as_str(),
        args: &args,
        key: r.idempotency_key.as_deref(),
        schema_hash: &r.schema_hash,
        result: result.as_deref(),
        error: error.as_deref(),
        spend: spend.as_deref(),
        attempt: i64::from(r.attempt),
        seq: row.seq,
        approval: approval.as_deref(),
    }
    .fields())
}

/// Seals a journal row as it now stands.
pub(crate) fn seal_call(ring: &Keyring, row: &mut CallRow) -> Result<(), StoreError> {
    row.record.mac = Some(ring.seal(&call_fields(row)?)?);
    Ok(())
}

/// Checks a journal row's seal.
pub(crate) fn check_call(ring: &Keyring, row: &CallRow) -> Result<(), StoreError> {
    let r = &row.record;
    ring.verify(
        &r.identity.session,
        || format!("journal row `{}` (seq {})", r.id, row.seq),
        &call_fields(row)?,
        r.mac.as_deref(),
    )
}

/// The session head's sealed fields: its counts, latest version and that checkpoint's
/// seal.
fn head_fields(session: &Session) -> Fields {
    let latest = session.record.latest_version;
    let checkpoint_seal = session
        .checkpoint(latest)
        .and_then(|c| c.seal.clone())
        .unwrap_or_default();
    HeadFields {
        session: session.record.id.as_str(),
        journal_rows: session.head.journal_rows,
        latest_version: latest,
        checkpoint_seal: &checkpoint_seal,
        resolutions: session.head.resolutions,
        issued_rows: session.head.issued_rows,
        approvals: session.head.approvals,
    }
    .fields()
}

/// Re-seals the head after a write changed a count or the latest checkpoint.
pub(crate) fn seal_head(ring: &Keyring, session: &mut Session) -> Result<(), StoreError> {
    session.head.seal = Some(ring.seal(&head_fields(session))?);
    Ok(())
}

/// Checks the head's seal: every read and fenced write starts here.
pub(crate) fn check_head(ring: &Keyring, session: &Session) -> Result<(), StoreError> {
    ring.verify(
        &session.record.id,
        || "the session head (its row counts and latest checkpoint)".to_owned(),
        &head_fields(session),
        session.head.seal.as_deref(),
    )
}

/// The whole journal in position order, checked: the head, the count and positions
/// `1..=journal_rows` without a gap, every row's seal, and the head's count of issued
/// rows. In memory the whole journal is at hand, so every read checks all of it (a SQL
/// backend reads one step and its neighbours instead: see `durable_sqlite`'s `StepCheck`).
pub(crate) fn checked_journal<'s>(
    ring: &Keyring,
    session: &'s Session,
) -> Result<Vec<&'s CallRow>, StoreError> {
    check_head(ring, session)?;
    let id = &session.record.id;
    let mut rows: Vec<&CallRow> = session.journal.iter().collect();
    rows.sort_by_key(|r| r.seq);
    let n = session.head.journal_rows;
    for (i, row) in rows.iter().enumerate() {
        let expected = i64::try_from(i).unwrap_or(i64::MAX) + 1;
        if row.seq != expected {
            return Err(tampered(
                id,
                "the journal".to_owned(),
                format!(
                    "position {expected} is missing (the next row is at {})",
                    row.seq
                ),
            ));
        }
        check_call(ring, row)?;
    }
    if i64::try_from(rows.len()).ok() != Some(n) {
        return Err(tampered(
            id,
            "the journal".to_owned(),
            format!(
                "the session head records {n} rows, the journal holds {}: rows were deleted or inserted",
                rows.len()
            ),
        ));
    }
    let issued = rows
        .iter()
        .filter(|r| r.record.status == CallStatus::Issued)
        .count();
    if i64::try_from(issued).ok() != Some(session.head.issued_rows) {
        return Err(tampered(
            id,
            "the journal's issued rows".to_owned(),
            format!(
                "the session head counts {} issued rows, the journal holds {issued}: a row's status was changed, or an issued row deleted",
                session.head.issued_rows
            ),
        ));
    }
    Ok(rows)
}

/// The seal of message `seq` with `text`, chained to the previous message's seal.
pub(crate) fn seal_message(
    ring: &Keyring,
    session: &SessionId,
    seq: i64,
    text: &str,
    previous: &str,
) -> Result<String, StoreError> {
    ring.seal(&message_fields(session.as_str(), seq, text, previous))
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
    let missing = |seq: i64| {
        tampered(
            id,
            format!("message {seq}"),
            "it is missing from the transcript",
        )
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
        ring.verify(
            id,
            || format!("message {seq}"),
            &message_fields(id.as_str(), seq, &message.text, &chain),
            message.seal.as_deref(),
        )?;
        chain = message.seal.clone().unwrap_or_default();
        texts.push(message.text.clone());
    }
    Ok((texts, chain))
}

/// A checkpoint's sealed fields, given its transcript's last message seal and the
/// previous checkpoint's seal.
pub(crate) fn checkpoint_fields(
    session: &SessionId,
    row: &CheckpointRow,
    last_message_seal: &str,
    previous: &str,
) -> Fields {
    CheckpointFields {
        session: session.as_str(),
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
    .fields()
}

/// A resolution audit row's sealed fields.
pub(crate) fn resolution_fields(session: &SessionId, row: &AuditRow) -> Fields {
    ResolutionFields {
        call: row.call.as_str(),
        session: session.as_str(),
        position: row.position,
        decision: &row.event,
        result: row.result.as_deref(),
        by: &row.by,
        note: row.note.as_deref(),
    }
    .fields()
}

/// An approval audit row's sealed fields (`result` holds the edited arguments).
pub(crate) fn approval_fields(session: &SessionId, row: &AuditRow) -> Fields {
    ApprovalFields {
        call: row.call.as_str(),
        session: session.as_str(),
        position: row.position,
        event: &row.event,
        actor: &row.by,
        note: row.note.as_deref(),
        args_before: row.args_before.as_deref(),
        args_after: row.result.as_deref(),
    }
    .fields()
}

/// Checks an audit log (resolutions or approvals): every row at its position under its
/// seal, and their number against the head's count.
pub(crate) fn check_log(
    ring: &Keyring,
    session: &Session,
    log: &[AuditRow],
    counted: i64,
    what: &str,
    fields: fn(&SessionId, &AuditRow) -> Fields,
) -> Result<(), StoreError> {
    check_head(ring, session)?;
    let id = &session.record.id;
    for (i, row) in log.iter().enumerate() {
        let expected = i64::try_from(i).unwrap_or(i64::MAX) + 1;
        if row.position != expected {
            return Err(tampered(
                id,
                format!("{what} {} (call `{}`)", row.position, row.call),
                format!("it is at position {expected} of the log"),
            ));
        }
        ring.verify(
            id,
            || format!("{what} {} (call `{}`)", row.position, row.call),
            &fields(id, row),
            row.seal.as_deref(),
        )?;
    }
    if i64::try_from(log.len()).ok() != Some(counted) {
        return Err(tampered(
            id,
            format!("the {what} log"),
            format!(
                "the session head records {counted} rows, the log holds {}",
                log.len()
            ),
        ));
    }
    Ok(())
}
