//! The store's keys: loading (or creating) its own key at open, sealing a database that
//! was never sealed, re-sealing one under a new key, and re-sealing a session whose rows
//! were copied (a fork). Every re-sealing is audited in `durable_integrity_log`,
//! which is sealed as a whole (its seal in `durable_meta`).

use std::collections::HashMap;

use durable_core::integrity::{
    self, ApprovalFields, INTEGRITY_LOG_SEAL, IntegrityEvent, IntegrityLog, KeyAction, Keyring,
    OpenFacts,
};
use durable_core::{SessionId, StoreError};
use sqlx::SqliteConnection;

use crate::error::db;
use crate::rows;
use crate::seal::{
    RawCall, RawCheckpoint, check_journal_complete, check_message, head_cols, head_from_row,
    raw_call_cols, resolution_fields, seal_message,
};
use crate::tx;

/// Re-seals every row of one session under `to`, after checking it under `from` (`None`:
/// the rows were never sealed; they are sealed as they are). Returns the rows sealed.
pub(crate) async fn reseal_session(
    conn: &mut SqliteConnection,
    from: Option<&Keyring>,
    to: &Keyring,
    session: &SessionId,
) -> Result<i64, StoreError> {
    let mut count = 0i64;
    // The head first: it covers the latest checkpoint's seal as it stands now.
    let row = sqlx::query(concat!(
        "SELECT ",
        head_cols!(),
        " FROM durable_sessions s WHERE s.id = ?"
    ))
    .bind(session.as_str())
    .fetch_one(&mut *conn)
    .await
    .map_err(db)?;
    let mut head = head_from_row(&row, session)?;
    if let Some(from) = from {
        head.check_any_format(from)?;
        check_journal_complete(&mut *conn, &head).await?;
    }
    // Journal rows.
    let found = sqlx::query(concat!(
        "SELECT ",
        raw_call_cols!(),
        " FROM durable_tool_calls c WHERE c.session_id = ? ORDER BY c.seq"
    ))
    .bind(session.as_str())
    .fetch_all(&mut *conn)
    .await
    .map_err(db)?;
    let mut calls = Vec::with_capacity(found.len());
    for row in &found {
        let mut raw = RawCall::from_row(row)?;
        if let Some(from) = from {
            raw.check(from)?;
        }
        raw.seal(to)?;
        calls.push(raw);
    }
    // The head's count of issued rows, as the (checked) rows have it; a head that counted
    // them already must agree.
    let issued = calls.iter().filter(|raw| raw.status == "issued").count();
    if from.is_some() && head.issued_rows.is_some() {
        head.check_issued(issued)?;
    }
    head.issued_rows = Some(i64::try_from(issued).unwrap_or(i64::MAX));
    for raw in &calls {
        raw.store_mac(&mut *conn).await?;
        count += 1;
    }
    // Messages, in order (chained).
    let found = sqlx::query(
        "SELECT seq, message, seal FROM durable_transcript WHERE session_num = \
         (SELECT num FROM durable_sessions WHERE id = ?) ORDER BY seq",
    )
    .bind(session.as_str())
    .fetch_all(&mut *conn)
    .await
    .map_err(db)?;
    let mut old_previous = String::new();
    let mut new_previous = String::new();
    let mut message_seals = HashMap::new();
    message_seals.insert(0i64, String::new());
    // The seals as they were before this re-sealing: a checkpoint's seal covers its
    // transcript's last message seal, and the table holds the new ones once they are
    // written below.
    let mut old_message_seals = HashMap::new();
    old_message_seals.insert(0i64, String::new());
    let mut sealed_messages = Vec::with_capacity(found.len());
    for row in &found {
        let seq: i64 = rows::col(row, "seq", session, None)?;
        let text: String = rows::col(row, "message", session, None)?;
        let seal: Option<String> = rows::col(row, "seal", session, None)?;
        if let Some(from) = from {
            check_message(from, session, seq, &text, &old_previous, seal.as_deref())?;
        }
        old_previous = seal.unwrap_or_default();
        old_message_seals.insert(seq, old_previous.clone());
        let new = seal_message(to, session, seq, &text, &new_previous)?;
        new_previous = new.clone();
        message_seals.insert(seq, new.clone());
        sealed_messages.push((seq, new));
    }
    for (seq, seal) in &sealed_messages {
        sqlx::query(
            "UPDATE durable_messages SET seal = ? WHERE session_num = \
             (SELECT num FROM durable_sessions WHERE id = ?) AND seq = ?",
        )
        .bind(seal)
        .bind(session.as_str())
        .bind(seq)
        .execute(&mut *conn)
        .await
        .map_err(db)?;
        count += 1;
    }
    // Checkpoints, in order (chained).
    let found = sqlx::query(
        "SELECT version, last_seq, message_count, plan, budget, state, app_version, seal \
         FROM durable_checkpoints WHERE session_num = \
         (SELECT num FROM durable_sessions WHERE id = ?) ORDER BY version",
    )
    .bind(session.as_str())
    .fetch_all(&mut *conn)
    .await
    .map_err(db)?;
    let mut old_previous = String::new();
    let mut new_previous = String::new();
    let mut sealed_checkpoints = Vec::with_capacity(found.len());
    for row in &found {
        let version: i64 = rows::col(row, "version", session, None)?;
        let v = Some(version);
        let last_seq: i64 = rows::col(row, "last_seq", session, v)?;
        let mut texts = Vec::with_capacity(3);
        for column in ["plan", "budget", "state"] {
            let stored = rows::col::<String>(row, column, session, v)?;
            texts.push(rows::resolve_snapshot(&mut *conn, session, stored, column).await?);
        }
        let app_version: String = rows::col(row, "app_version", session, v)?;
        let message_count: i64 = rows::col(row, "message_count", session, v)?;
        let seal: Option<String> = rows::col(row, "seal", session, v)?;
        if let Some(from) = from {
            let old_last =
                old_message_seals
                    .get(&last_seq)
                    .ok_or_else(|| StoreError::Tampered {
                        session: session.clone(),
                        what: format!("message {last_seq}"),
                        detail: "it is missing from the transcript".to_owned(),
                    })?;
            RawCheckpoint {
                session,
                version,
                last_seq,
                message_count,
                last_message_seal: old_last,
                plan: &texts[0],
                budget: &texts[1],
                state: &texts[2],
                app_version: &app_version,
                previous: &old_previous,
            }
            .check(from, seal.as_deref())?;
        }
        old_previous = seal.unwrap_or_default();
        let last_message_seal =
            message_seals
                .get(&last_seq)
                .cloned()
                .ok_or_else(|| StoreError::Tampered {
                    session: session.clone(),
                    what: format!("checkpoint {version}"),
                    detail: format!("its transcript ends at message {last_seq}, which is missing"),
                })?;
        let new = RawCheckpoint {
            session,
            version,
            last_seq,
            message_count,
            last_message_seal: &last_message_seal,
            plan: &texts[0],
            budget: &texts[1],
            state: &texts[2],
            app_version: &app_version,
            previous: &new_previous,
        }
        .seal(to)?;
        new_previous = new.clone();
        sealed_checkpoints.push((version, new));
    }
    for (version, seal) in &sealed_checkpoints {
        sqlx::query(
            "UPDATE durable_checkpoints SET seal = ? WHERE session_num = \
             (SELECT num FROM durable_sessions WHERE id = ?) AND version = ?",
        )
        .bind(seal)
        .bind(session.as_str())
        .bind(version)
        .execute(&mut *conn)
        .await
        .map_err(db)?;
        count += 1;
    }
    // Resolutions.
    let found = sqlx::query(
        "SELECT id, call_id, position, decision, result, resolved_by, note, seal \
         FROM durable_resolutions WHERE session_id = ? ORDER BY id",
    )
    .bind(session.as_str())
    .fetch_all(&mut *conn)
    .await
    .map_err(db)?;
    for row in &found {
        let rowid: i64 = rows::col(row, "id", session, None)?;
        let call: String = rows::col(row, "call_id", session, None)?;
        let position: i64 = rows::col(row, "position", session, None)?;
        let decision: String = rows::col(row, "decision", session, None)?;
        let result: Option<String> = rows::col(row, "result", session, None)?;
        let by: String = rows::col(row, "resolved_by", session, None)?;
        let note: Option<String> = rows::col(row, "note", session, None)?;
        let seal: Option<String> = rows::col(row, "seal", session, None)?;
        let fields = resolution_fields(
            &call,
            session,
            position,
            &decision,
            result.as_deref(),
            &by,
            note.as_deref(),
        );
        if let Some(from) = from {
            from.verify(
                session,
                || format!("resolution {position} (call `{call}`)"),
                &fields,
                seal.as_deref(),
            )?;
        }
        sqlx::query("UPDATE durable_resolutions SET seal = ? WHERE id = ?")
            .bind(to.seal(&fields)?)
            .bind(rowid)
            .execute(&mut *conn)
            .await
            .map_err(db)?;
        count += 1;
    }
    // The approval log.
    let found = sqlx::query(
        "SELECT id, call_id, position, event, actor, note, args_before, args_after, seal \
         FROM durable_approvals WHERE session_id = ? ORDER BY position",
    )
    .bind(session.as_str())
    .fetch_all(&mut *conn)
    .await
    .map_err(db)?;
    for row in &found {
        let text = |name: &str| rows::col::<Option<String>>(row, name, session, None);
        let rowid: i64 = rows::col(row, "id", session, None)?;
        let call: String = rows::col(row, "call_id", session, None)?;
        let position: i64 = rows::col(row, "position", session, None)?;
        let event: String = rows::col(row, "event", session, None)?;
        let actor: String = rows::col(row, "actor", session, None)?;
        let (note, before, after) = (text("note")?, text("args_before")?, text("args_after")?);
        let fields = ApprovalFields {
            call: &call,
            session: session.as_str(),
            position,
            event: &event,
            actor: &actor,
            note: note.as_deref(),
            args_before: before.as_deref(),
            args_after: after.as_deref(),
        }
        .fields();
        if let Some(from) = from {
            from.verify(
                session,
                || format!("approval event {position} (call `{call}`)"),
                &fields,
                text("seal")?.as_deref(),
            )?;
        }
        sqlx::query("UPDATE durable_approvals SET seal = ? WHERE id = ?")
            .bind(to.seal(&fields)?)
            .bind(rowid)
            .execute(&mut *conn)
            .await
            .map_err(db)?;
        count += 1;
    }
    // The head, over the latest checkpoint's new seal.
    if let Some((_, seal)) = sealed_checkpoints
        .iter()
        .find(|(v, _)| *v == head.latest_version)
    {
        head.checkpoint_seal = seal.clone();
    }
    head.store(conn, to).await?;
    Ok(count + 1)
}

/// Reads a `durable_meta` value.
async fn meta(conn: &mut SqliteConnection, name: &str) -> Result<Option<String>, StoreError> {
    sqlx::query_scalar("SELECT value FROM durable_meta WHERE name = ?")
        .bind(name)
        .fetch_optional(conn)
        .await
        .map_err(db)
}

async fn set_meta(conn: &mut SqliteConnection, name: &str, value: &str) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO durable_meta (name, value) VALUES (?, ?) \
         ON CONFLICT (name) DO UPDATE SET value = excluded.value",
    )
    .bind(name)
    .bind(value)
    .execute(conn)
    .await
    .map_err(db)?;
    Ok(())
}

/// Loads (or creates) the store's own key, binds it into `ring`, and makes sure every
/// row is sealed with `ring`'s signing key: seals a database whose rows predate seals,
/// re-seals one sealed with a key `ring` can check (an application key turned on, or
/// rotated), restores a missing `signing_key` row after checking every row, and refuses
/// the rest ([`Keyring::on_open`]). Runs inside the open's `BEGIN IMMEDIATE` transaction
/// (the one that migrated the schema), so concurrent openers do this once, and
/// `seals_migrated_now` (the sealing migration ran in this transaction) is the witness
/// that the rows genuinely predate seals.
pub(crate) async fn setup_keys_in(
    conn: &mut SqliteConnection,
    ring: Keyring,
    seals_migrated_now: bool,
) -> Result<Keyring, StoreError> {
    let current = meta(conn, "signing_key").await?;
    let sessions: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM durable_sessions")
        .fetch_one(&mut *conn)
        .await
        .map_err(db)?;
    let head: Option<String> = sqlx::query_scalar(
        "SELECT head FROM durable_sessions WHERE head IS NOT NULL ORDER BY num LIMIT 1",
    )
    .fetch_optional(&mut *conn)
    .await
    .map_err(db)?;
    let sealed_with = head
        .as_deref()
        .and_then(|seal| seal.split_once(':'))
        .map(|(id, _)| id);
    let facts = OpenFacts::signed(current.as_deref())
        .migrated_now(seals_migrated_now)
        .holding(sessions, sealed_with);
    let store_key = match meta(conn, "store_key").await? {
        Some(hex) => Keyring::store_key_from_hex(&hex)?,
        None if facts.may_create_store_key() => {
            let key = integrity::random_key()?;
            set_meta(conn, "store_key", &integrity::hex(&key)).await?;
            key
        }
        None => return Err(facts.store_key_missing()),
    };
    let ring = ring.bind_store_key(store_key);
    let now = tx::now(conn).await?;
    let signing = ring.signing_id().to_owned();
    match ring.on_open(&facts)? {
        KeyAction::Keep => {
            upgrade_heads(conn, &ring).await?;
            seal_legacy_log(conn, &ring, now).await?;
            return Ok(ring);
        }
        KeyAction::Rekey { from_id, from } => {
            let rows = reseal_all(conn, Some(&from), &ring).await?;
            let entry = Log {
                event: "rekey",
                from: Some(&from_id),
                to: &signing,
                rows,
                detail: "every row was checked under the old key, then re-sealed under the new one",
            };
            entry.append(conn, &from, &ring, now).await?;
            tracing::warn!(from = %from_id, to = %signing, rows, "re-sealed the store under a new key");
        }
        KeyAction::Restore { from_id, from } => {
            let rows = reseal_all(conn, Some(&from), &ring).await?;
            let entry = Log {
                event: "restore",
                from: Some(&from_id),
                to: &signing,
                rows,
                detail: "the `signing_key` row of `durable_meta` was missing: every row was checked under the key its seals name, re-sealed under the signing key, and the row written back",
            };
            entry.append(conn, &from, &ring, now).await?;
            tracing::warn!(from = %from_id, to = %signing, rows, "restored the missing signing_key row after checking every row");
        }
        KeyAction::Adopt => {
            let rows = reseal_all(conn, None, &ring).await?;
            if rows > 0 {
                let entry = Log {
                    event: "adopt",
                    from: None,
                    to: &signing,
                    rows,
                    detail: "rows written before tamper evidence (schema version 1) were sealed as found; their content before this point is not authenticated",
                };
                entry.append(conn, &ring, &ring, now).await?;
                tracing::warn!(to = %signing, rows, "sealed a store written without seals");
            }
        }
    }
    set_meta(conn, "signing_key", &signing).await?;
    Ok(ring)
}

/// Counts the issued rows of every session whose head was written before schema 4 (its
/// `issued_rows` is `NULL`) and re-seals that head with the count, in the open's
/// transaction. Each such session is checked first, under the key that sealed it: its
/// head under the old head format, its journal's completeness and every journal row's
/// seal, so a status changed behind the store's back before the upgrade is not counted.
/// A session that fails its checks keeps its old head, and every read or write of it
/// fails with [`StoreError::Tampered`] (the head has no count); the other sessions are
/// upgraded. Runs once per database (a partial index finds the old heads): every head the
/// store writes afterwards carries its count.
async fn upgrade_heads(conn: &mut SqliteConnection, ring: &Keyring) -> Result<(), StoreError> {
    let sessions: Vec<String> = sqlx::query_scalar(
        "SELECT id FROM durable_sessions WHERE issued_rows IS NULL ORDER BY num",
    )
    .fetch_all(&mut *conn)
    .await
    .map_err(db)?;
    if sessions.is_empty() {
        return Ok(());
    }
    let mut upgraded = 0usize;
    for id in &sessions {
        let session = SessionId::new(id.clone());
        match upgrade_head(&mut *conn, ring, &session).await {
            Ok(()) => upgraded += 1,
            Err(e @ (StoreError::Tampered { .. } | StoreError::Corrupt { .. })) => {
                tracing::error!(%session, error = %e, "session head not upgraded: it failed its checks; reads of it will fail as tampered");
            }
            Err(e) => return Err(e),
        }
    }
    tracing::info!(
        upgraded,
        refused = sessions.len() - upgraded,
        "counted the issued journal rows of the session heads written before schema 4"
    );
    Ok(())
}

/// [`upgrade_heads`] for one session.
async fn upgrade_head(
    conn: &mut SqliteConnection,
    ring: &Keyring,
    session: &SessionId,
) -> Result<(), StoreError> {
    let row = sqlx::query(concat!(
        "SELECT ",
        head_cols!(),
        " FROM durable_sessions s WHERE s.id = ?"
    ))
    .bind(session.as_str())
    .fetch_one(&mut *conn)
    .await
    .map_err(db)?;
    let mut head = head_from_row(&row, session)?;
    head.check_any_format(ring)?;
    check_journal_complete(&mut *conn, &head).await?;
    let found = sqlx::query(concat!(
        "SELECT ",
        raw_call_cols!(),
        " FROM durable_tool_calls c WHERE c.session_id = ? ORDER BY c.seq"
    ))
    .bind(session.as_str())
    .fetch_all(&mut *conn)
    .await
    .map_err(db)?;
    let mut issued = 0i64;
    for row in &found {
        let raw = RawCall::from_row(row)?;
        raw.check(ring)?;
        issued += i64::from(raw.status == "issued");
    }
    head.issued_rows = Some(issued);
    head.store(&mut *conn, ring).await
}

async fn reseal_all(
    conn: &mut SqliteConnection,
    from: Option<&Keyring>,
    to: &Keyring,
) -> Result<i64, StoreError> {
    let sessions: Vec<String> = sqlx::query_scalar("SELECT id FROM durable_sessions ORDER BY num")
        .fetch_all(&mut *conn)
        .await
        .map_err(db)?;
    let mut rows = 0;
    for id in sessions {
        rows += reseal_session(&mut *conn, from, to, &SessionId::new(id)).await?;
    }
    Ok(rows)
}

/// Appends an operator's event (a rollback acknowledged) to the sealed integrity log,
/// checking the log as it stands and re-sealing it under `ring`.
pub(crate) async fn append_log(
    conn: &mut SqliteConnection,
    ring: &Keyring,
    event: &str,
    to: &str,
    rows: i64,
    detail: &str,
    now: i64,
) -> Result<(), StoreError> {
    Log {
        event,
        from: None,
        to,
        rows,
        detail,
    }
    .append(conn, ring, ring, now)
    .await
}

/// An event of `durable_integrity_log`.
struct Log<'a> {
    event: &'a str,
    from: Option<&'a str>,
    to: &'a str,
    rows: i64,
    detail: &'a str,
}

impl Log<'_> {
    /// Appends the event and re-seals the whole log under `to`, after checking the log
    /// as it stands under `check` (the key that sealed it). A log that does not hold is
    /// refused; one written before the log was sealed is sealed as found first, audited
    /// as `seal_log`.
    async fn append(
        &self,
        conn: &mut SqliteConnection,
        check: &Keyring,
        to: &Keyring,
        now: i64,
    ) -> Result<(), StoreError> {
        let log = read_log(conn, check).await?;
        if let Some(refused) = log.refused() {
            if meta(conn, INTEGRITY_LOG_SEAL).await?.is_some() {
                return Err(refused);
            }
            seal_log_event(log.events.len()).insert(conn, now).await?;
        }
        self.insert(conn, now).await?;
        reseal_log(conn, to).await
    }

    async fn insert(&self, conn: &mut SqliteConnection, now: i64) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO durable_integrity_log (event, from_key, to_key, rows, detail, created_at) \
             VALUES (?, ?, ?, ?, ?, ?)",
        )
        .bind(self.event)
        .bind(self.from)
        .bind(self.to)
        .bind(self.rows)
        .bind(self.detail)
        .bind(now)
        .execute(conn)
        .await
        .map_err(db)?;
        Ok(())
    }
}

/// The event that records sealing a log written before logs were sealed.
fn seal_log_event(events: usize) -> Log<'static> {
    Log {
        event: "seal_log",
        from: None,
        to: "-",
        rows: i64::try_from(events).unwrap_or(i64::MAX),
        detail: "the events above were written before this log was sealed: they were sealed as found, and are not authenticated",
    }
}

/// Seals, as found and audited, a non-empty integrity log that has no seal (written
/// before logs were sealed). A log whose seal does not hold is left as found: it decides
/// nothing, and `durable verify` reports it.
async fn seal_legacy_log(
    conn: &mut SqliteConnection,
    ring: &Keyring,
    now: i64,
) -> Result<(), StoreError> {
    if meta(conn, INTEGRITY_LOG_SEAL).await?.is_some() {
        return Ok(());
    }
    let log = read_log(conn, ring).await?;
    if log.events.is_empty() {
        return Ok(());
    }
    seal_log_event(log.events.len()).insert(conn, now).await?;
    reseal_log(conn, ring).await
}

async fn reseal_log(conn: &mut SqliteConnection, to: &Keyring) -> Result<(), StoreError> {
    let events = log_events(conn).await?;
    let seal = to.seal(&integrity::integrity_log_fields(&events))?;
    set_meta(conn, INTEGRITY_LOG_SEAL, &seal).await
}

/// A row of `durable_integrity_log`: id, event, from key, to key, rows, detail, time.
type LogRow = (i64, String, Option<String>, String, i64, String, i64);

/// Every event of the integrity log, oldest first.
async fn log_events(conn: &mut SqliteConnection) -> Result<Vec<IntegrityEvent>, StoreError> {
    let rows: Vec<LogRow> = sqlx::query_as(
        "SELECT id, event, from_key, to_key, rows, detail, created_at \
         FROM durable_integrity_log ORDER BY id",
    )
    .fetch_all(&mut *conn)
    .await
    .map_err(db)?;
    Ok(rows
        .into_iter()
        .map(|(id, event, from, to, rows, detail, at)| {
            IntegrityEvent::new(id, event, from, to, rows, detail, at)
        })
        .collect())
}

/// The integrity log with the check of its seal under `ring`.
pub(crate) async fn read_log(
    conn: &mut SqliteConnection,
    ring: &Keyring,
) -> Result<IntegrityLog, StoreError> {
    let events = log_events(conn).await?;
    let seal = meta(conn, INTEGRITY_LOG_SEAL).await?;
    Ok(IntegrityLog::check(ring, events, seal.as_deref()))
}
