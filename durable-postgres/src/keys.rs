//! The store's keys: loading (or creating) its own key at connect, sealing a database
//! that was never sealed, re-sealing one under a new key, and re-sealing a session whose
//! rows were copied (a fork). Every re-sealing is audited in `durable_integrity_log`,
//! which is sealed as a whole (its seal in `durable_meta`).

use std::collections::HashMap;

use durable_core::integrity::{
    self, INTEGRITY_LOG_SEAL, IntegrityEvent, IntegrityLog, KeyAction, Keyring, OpenFacts,
};
use durable_core::{SessionId, StoreError};
use sqlx::postgres::PgConnection;

use crate::error::db;
use crate::rows::{self, get};
use crate::seal::{
    self, RawApproval, RawCall, RawCheckpoint, approval_cols, check_journal_complete, head_cols,
    head_from_row, raw_call_cols, resolution_fields,
};
use crate::tx;

/// Re-seals every row of one session under `to`, after checking it under `from` (`None`:
/// the rows were never sealed; they are sealed as they are). Returns the rows sealed.
/// The caller holds the session row (or created it in this transaction).
pub(crate) async fn reseal_session(
    conn: &mut PgConnection,
    from: Option<&Keyring>,
    to: &Keyring,
    session: &SessionId,
) -> Result<i64, StoreError> {
    let mut count = 0i64;
    // The head first, while it still names the old seal of the latest checkpoint.
    let row = sqlx::query(concat!(
        "SELECT ",
        head_cols!(),
        " FROM durable_sessions s WHERE s.id = $1"
    ))
    .bind(session.as_str())
    .fetch_one(&mut *conn)
    .await
    .map_err(db)?;
    let mut head = head_from_row(&row, session)?;
    if let Some(from) = from {
        // A head written before schema 4 is checked as it was sealed, and counted below.
        head.check_sealed(from)?;
        check_journal_complete(&mut *conn, &head).await?;
    }
    // Journal rows.
    let found = sqlx::query(concat!(
        "SELECT ",
        raw_call_cols!(),
        " FROM durable_tool_calls WHERE session_id = $1 ORDER BY seq"
    ))
    .bind(session.as_str())
    .fetch_all(&mut *conn)
    .await
    .map_err(db)?;
    let mut ids = Vec::with_capacity(found.len());
    let mut seals = Vec::with_capacity(found.len());
    let mut issued = 0usize;
    for row in &found {
        let mut raw = RawCall::from_row(row)?;
        if let Some(from) = from {
            raw.check(from)?;
        }
        issued += usize::from(raw.status == "issued");
        raw.seal(to)?;
        seals.push(raw.mac.unwrap_or_default());
        ids.push(raw.id);
    }
    // The head's count of issued rows, as the (checked) rows have it; a head that counted
    // them already must agree. A head written before schema 4 gets its count here.
    if from.is_some() && head.issued_rows.is_some() {
        head.check_issued(issued)?;
    }
    head.issued_rows = Some(i64::try_from(issued).unwrap_or(i64::MAX));
    if !ids.is_empty() {
        sqlx::query(
            "UPDATE durable_tool_calls c SET mac = u.seal \
             FROM unnest($1::text[], $2::text[]) AS u(id, seal) WHERE c.id = u.id",
        )
        .bind(&ids)
        .bind(&seals)
        .execute(&mut *conn)
        .await
        .map_err(db)?;
        count += ids.len() as i64;
    }
    // Messages, in order (chained).
    let found = sqlx::query(
        "SELECT seq, message, seal FROM durable_transcript \
         WHERE session_num = (SELECT num FROM durable_sessions WHERE id = $1) ORDER BY seq",
    )
    .bind(session.as_str())
    .fetch_all(&mut *conn)
    .await
    .map_err(db)?;
    let mut old_previous = String::new();
    let mut new_previous = String::new();
    let mut old_seals = HashMap::from([(0i64, String::new())]);
    let mut new_seals = HashMap::from([(0i64, String::new())]);
    let mut seqs = Vec::with_capacity(found.len());
    let mut seals = Vec::with_capacity(found.len());
    for row in &found {
        let seq: i64 = get(row, "seq")?;
        let text: String = get(row, "message")?;
        let stored: Option<String> = get(row, "seal")?;
        if let Some(from) = from {
            seal::check_message(from, session, seq, &text, &old_previous, stored.as_deref())?;
        }
        old_previous = stored.unwrap_or_default();
        old_seals.insert(seq, old_previous.clone());
        let new = seal::seal_message(to, session, seq, &text, &new_previous)?;
        new_previous.clone_from(&new);
        new_seals.insert(seq, new.clone());
        seqs.push(seq);
        seals.push(new);
    }
    if !seqs.is_empty() {
        sqlx::query(
            "UPDATE durable_messages m SET seal = u.seal \
             FROM unnest($2::bigint[], $3::text[]) AS u(seq, seal) \
             WHERE m.session_num = (SELECT num FROM durable_sessions WHERE id = $1) \
               AND m.seq = u.seq",
        )
        .bind(session.as_str())
        .bind(&seqs)
        .bind(&seals)
        .execute(&mut *conn)
        .await
        .map_err(db)?;
        count += seqs.len() as i64;
    }
    // Checkpoints, in order (chained).
    // Snapshots stored as references to an earlier version are sealed as the text they
    // name (and stay references).
    let found = sqlx::query(concat!(
        "SELECT k.version, k.last_seq, k.message_count, ",
        rows::snapshot!("k", "plan"),
        " AS plan, ",
        rows::snapshot!("k", "budget"),
        " AS budget, ",
        rows::snapshot!("k", "state"),
        " AS state, k.app_version, k.seal \
         FROM durable_checkpoints k \
         WHERE k.session_num = (SELECT num FROM durable_sessions WHERE id = $1) \
         ORDER BY k.version"
    ))
    .bind(session.as_str())
    .fetch_all(&mut *conn)
    .await
    .map_err(db)?;
    let mut old_previous = String::new();
    let mut new_previous = String::new();
    let mut versions = Vec::with_capacity(found.len());
    let mut seals = Vec::with_capacity(found.len());
    for row in &found {
        let version: i64 = get(row, "version")?;
        let last_seq: i64 = get(row, "last_seq")?;
        let plan = rows::snapshot_text(session, version, "the plan", get(row, "plan")?)?;
        let budget = rows::snapshot_text(session, version, "the budget", get(row, "budget")?)?;
        let state = rows::snapshot_text(session, version, "the state", get(row, "state")?)?;
        let app_version: String = get(row, "app_version")?;
        let message_count: i64 = get(row, "message_count")?;
        let stored: Option<String> = get(row, "seal")?;
        let missing = || StoreError::Tampered {
            session: session.clone(),
            what: format!("checkpoint {version}"),
            detail: format!("its transcript ends at message {last_seq}, which is missing"),
        };
        if let Some(from) = from {
            let old_last = old_seals.get(&last_seq).ok_or_else(missing)?;
            RawCheckpoint {
                session,
                version,
                last_seq,
                message_count,
                last_message_seal: old_last,
                plan: &plan,
                budget: &budget,
                state: &state,
                app_version: &app_version,
                previous: &old_previous,
            }
            .check(from, stored.as_deref())?;
        }
        old_previous = stored.unwrap_or_default();
        let last_message_seal = new_seals.get(&last_seq).ok_or_else(missing)?;
        let new = RawCheckpoint {
            session,
            version,
            last_seq,
            message_count,
            last_message_seal,
            plan: &plan,
            budget: &budget,
            state: &state,
            app_version: &app_version,
            previous: &new_previous,
        }
        .seal(to)?;
        new_previous.clone_from(&new);
        if version == head.latest_version {
            head.checkpoint_seal.clone_from(&new);
        }
        versions.push(version);
        seals.push(new);
    }
    if !versions.is_empty() {
        sqlx::query(
            "UPDATE durable_checkpoints k SET seal = u.seal \
             FROM unnest($2::bigint[], $3::text[]) AS u(version, seal) \
             WHERE k.session_num = (SELECT num FROM durable_sessions WHERE id = $1) \
               AND k.version = u.version",
        )
        .bind(session.as_str())
        .bind(&versions)
        .bind(&seals)
        .execute(&mut *conn)
        .await
        .map_err(db)?;
        count += versions.len() as i64;
    }
    // Resolutions.
    let found = sqlx::query(
        "SELECT id, call_id, position, decision, result, resolved_by, note, seal \
         FROM durable_resolutions WHERE session_id = $1 ORDER BY id",
    )
    .bind(session.as_str())
    .fetch_all(&mut *conn)
    .await
    .map_err(db)?;
    let mut rowids = Vec::with_capacity(found.len());
    let mut seals = Vec::with_capacity(found.len());
    for row in &found {
        let call: String = get(row, "call_id")?;
        let position: i64 = get(row, "position")?;
        let decision: String = get(row, "decision")?;
        let result: Option<String> = get(row, "result")?;
        let by: String = get(row, "resolved_by")?;
        let note: Option<String> = get(row, "note")?;
        let stored: Option<String> = get(row, "seal")?;
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
                stored.as_deref(),
            )?;
        }
        rowids.push(get::<i64>(row, "id")?);
        seals.push(to.seal(&fields)?);
    }
    if !rowids.is_empty() {
        sqlx::query(
            "UPDATE durable_resolutions r SET seal = u.seal \
             FROM unnest($1::bigint[], $2::text[]) AS u(id, seal) WHERE r.id = u.id",
        )
        .bind(&rowids)
        .bind(&seals)
        .execute(&mut *conn)
        .await
        .map_err(db)?;
        count += rowids.len() as i64;
    }
    // The approval log, in position order: checked whole under the old key (every seal
    // at its position, their number against the head), each row sealed again at its
    // position.
    let found = sqlx::query(concat!(
        "SELECT ",
        approval_cols!(),
        " FROM durable_approvals WHERE session_id = $1 ORDER BY position"
    ))
    .bind(session.as_str())
    .fetch_all(&mut *conn)
    .await
    .map_err(db)?;
    if let Some(from) = from {
        seal::check_approvals(from, &head, &found)?;
    }
    let mut rowids = Vec::with_capacity(found.len());
    let mut seals = Vec::with_capacity(found.len());
    for row in &found {
        let mut raw = RawApproval::from_row(row)?;
        raw.seal(to, session)?;
        rowids.push(get::<i64>(row, "id")?);
        seals.push(raw.seal.unwrap_or_default());
    }
    if !rowids.is_empty() {
        sqlx::query(
            "UPDATE durable_approvals a SET seal = u.seal \
             FROM unnest($1::bigint[], $2::text[]) AS u(id, seal) WHERE a.id = u.id",
        )
        .bind(&rowids)
        .bind(&seals)
        .execute(&mut *conn)
        .await
        .map_err(db)?;
        count += rowids.len() as i64;
    }
    // The head, naming the latest checkpoint's new seal.
    head.store(conn, to).await?;
    Ok(count + 1)
}

/// Reads a `durable_meta` value.
async fn meta(conn: &mut PgConnection, name: &str) -> Result<Option<String>, StoreError> {
    sqlx::query_scalar("SELECT value FROM durable_meta WHERE name = $1")
        .bind(name)
        .fetch_optional(conn)
        .await
        .map_err(db)
}

async fn set_meta(conn: &mut PgConnection, name: &str, value: &str) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO durable_meta (name, value) VALUES ($1, $2) \
         ON CONFLICT (name) DO UPDATE SET value = excluded.value",
    )
    .bind(name)
    .bind(value)
    .execute(conn)
    .await
    .map_err(db)?;
    Ok(())
}

/// The advisory lock every connector takes, in the transaction that migrates the schema
/// and sets the keys up, so concurrent connectors do this once and each sees the other's
/// result.
pub(crate) const SETUP_LOCK: &str =
    "SELECT pg_advisory_xact_lock(hashtextextended('durable setup_keys', 0))";

/// Loads (or creates) the store's own key, binds it into `ring`, and makes sure every
/// row is sealed with `ring`'s signing key: seals a database whose rows predate seals,
/// re-seals one sealed with a key `ring` can check (an application key turned on, or
/// rotated), restores a missing `signing_key` row after checking every row, and refuses
/// the rest ([`Keyring::on_open`]). Runs in the connector's setup transaction (the one
/// that migrated the schema, holding [`SETUP_LOCK`]), so `seals_migrated_now` (the
/// sealing migration ran in this transaction) is the witness that the rows genuinely
/// predate seals, and no crash can come between the migration and the sealing.
pub(crate) async fn setup_keys_in(
    conn: &mut PgConnection,
    ring: Keyring,
    seals_migrated_now: bool,
) -> Result<Keyring, StoreError> {
    let current = meta(conn, "signing_key").await?;
    let sessions: i64 = sqlx::query_scalar("SELECT count(*) FROM durable_sessions")
        .fetch_one(&mut *conn)
        .await
        .map_err(db)?;
    let head: Option<String> = sqlx::query_scalar(
        "SELECT head FROM durable_sessions WHERE head IS NOT NULL ORDER BY created_at, id LIMIT 1",
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
/// transaction, under its lock. Each such session is checked first: its head as it was
/// sealed ([`Head::legacy_fields`](durable_core::integrity::Head::legacy_fields)), its
/// journal's completeness and every journal row's seal, so a status changed behind the
/// store's back before the upgrade is never counted. A session that fails its checks
/// keeps its old head, and every read or write of it fails with
/// [`StoreError::Tampered`] (the head has no count); the other sessions are upgraded.
/// Runs once per database (the old heads are listed in `durable_uncounted_heads`, schema
/// 10): every head the store writes afterwards carries its count. (A store whose key changes at this open is
/// counted by [`reseal_session`] instead.)
async fn upgrade_heads(conn: &mut PgConnection, ring: &Keyring) -> Result<(), StoreError> {
    // Heads counted since they were listed (by a re-sealing at an open that changed the
    // key) leave the list here.
    let sessions: Vec<String> = sqlx::query_scalar(
        "WITH counted AS (DELETE FROM durable_uncounted_heads u USING durable_sessions s \
           WHERE s.id = u.session_id AND s.issued_rows IS NOT NULL) \
         SELECT s.id FROM durable_uncounted_heads u \
         JOIN durable_sessions s ON s.id = u.session_id WHERE s.issued_rows IS NULL \
         ORDER BY s.created_at, s.id FOR UPDATE OF s",
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
        // A savepoint per session: a refused one leaves nothing half-written.
        sqlx::query("SAVEPOINT upgrade_head")
            .execute(&mut *conn)
            .await
            .map_err(db)?;
        match upgrade_head(&mut *conn, ring, &session).await {
            Ok(()) => {
                sqlx::query("DELETE FROM durable_uncounted_heads WHERE session_id = $1")
                    .bind(id)
                    .execute(&mut *conn)
                    .await
                    .map_err(db)?;
                upgraded += 1;
            }
            Err(e @ (StoreError::Tampered { .. } | StoreError::Corrupt { .. })) => {
                sqlx::query("ROLLBACK TO SAVEPOINT upgrade_head")
                    .execute(&mut *conn)
                    .await
                    .map_err(db)?;
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
    conn: &mut PgConnection,
    ring: &Keyring,
    session: &SessionId,
) -> Result<(), StoreError> {
    let row = sqlx::query(concat!(
        "SELECT ",
        head_cols!(),
        " FROM durable_sessions s WHERE s.id = $1"
    ))
    .bind(session.as_str())
    .fetch_one(&mut *conn)
    .await
    .map_err(db)?;
    let mut head = head_from_row(&row, session)?;
    head.check_sealed(ring)?;
    check_journal_complete(&mut *conn, &head).await?;
    let found = sqlx::query(concat!(
        "SELECT ",
        raw_call_cols!(),
        " FROM durable_tool_calls WHERE session_id = $1 ORDER BY seq"
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
    conn: &mut PgConnection,
    from: Option<&Keyring>,
    to: &Keyring,
) -> Result<i64, StoreError> {
    // Every session row is locked: no writer changes a session while it is re-sealed.
    let sessions: Vec<String> =
        sqlx::query_scalar("SELECT id FROM durable_sessions ORDER BY created_at, id FOR UPDATE")
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
    conn: &mut PgConnection,
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
        conn: &mut PgConnection,
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

    async fn insert(&self, conn: &mut PgConnection, now: i64) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO durable_integrity_log (event, from_key, to_key, rows, detail, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6)",
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
    conn: &mut PgConnection,
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

async fn reseal_log(conn: &mut PgConnection, to: &Keyring) -> Result<(), StoreError> {
    let events = log_events(conn).await?;
    let seal = to.seal(&integrity::integrity_log_fields(&events))?;
    set_meta(conn, INTEGRITY_LOG_SEAL, &seal).await
}

/// A row of `durable_integrity_log`: id, event, from key, to key, rows, detail, time.
type LogRow = (i64, String, Option<String>, String, i64, String, i64);

/// Every event of the integrity log, oldest first.
async fn log_events(conn: &mut PgConnection) -> Result<Vec<IntegrityEvent>, StoreError> {
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
    conn: &mut PgConnection,
    ring: &Keyring,
) -> Result<IntegrityLog, StoreError> {
    let events = log_events(conn).await?;
    let seal = meta(conn, INTEGRITY_LOG_SEAL).await?;
    Ok(IntegrityLog::check(ring, events, seal.as_deref()))
}
