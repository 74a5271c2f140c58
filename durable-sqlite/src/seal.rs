//! Seals: computing them in write transactions, checking them on reads, the session
//! head, and the store's key setup (adoption of unsealed rows, key rotation).
//!
//! What is sealed and why is in [`durable_core::integrity`]; this module maps it onto
//! the SQLite tables.

use durable_core::integrity::{
    CallFields, CheckpointFields, Fields, Head, KeyPlan, Keyring, ResolutionFields, message_fields,
};
use durable_core::{CallId, SessionId, StoreError};
use sqlx::sqlite::SqliteRow;
use sqlx::{Row, SqliteConnection};

use crate::error::db;
use crate::ops;
use crate::rows;

/// A journal row's sealed columns, as stored.
#[derive(Debug, Clone)]
pub(crate) struct RawCall {
    pub(crate) id: String,
    pub(crate) session: String,
    pub(crate) kind: String,
    pub(crate) step: i64,
    pub(crate) tool: String,
    pub(crate) input_hash: String,
    pub(crate) ordinal: i64,
    pub(crate) class: String,
    pub(crate) status: String,
    pub(crate) args: String,
    pub(crate) key: Option<String>,
    pub(crate) schema_hash: String,
    pub(crate) result: Option<String>,
    pub(crate) error: Option<String>,
    pub(crate) spend: Option<String>,
    pub(crate) attempt: i64,
    pub(crate) seq: i64,
    pub(crate) mac: Option<String>,
}

/// Columns [`RawCall::from_row`] reads (alias `c`).
macro_rules! raw_call_cols {
    () => {
        "c.id, c.session_id, c.kind, c.step, c.tool_name, c.input_hash, c.ordinal, \
         c.replay_class, c.status, c.args, c.idempotency_key, c.schema_hash, c.result, \
         c.error, c.spend, c.attempt, c.seq, c.mac"
    };
}

impl RawCall {
    /// Reads the sealed columns of a row selected with `raw_call_cols!` (or a superset).
    pub(crate) fn from_row(row: &SqliteRow) -> Result<Self, StoreError> {
        let session: String = row.try_get("session_id").map_err(db)?;
        let s = SessionId::new(session.clone());
        let col = |name: &str| rows::col::<String>(row, name, &s, None);
        let opt = |name: &str| rows::col::<Option<String>>(row, name, &s, None);
        let int = |name: &str| rows::col::<i64>(row, name, &s, None);
        Ok(RawCall {
            id: col("id")?,
            kind: col("kind")?,
            step: int("step")?,
            tool: col("tool_name")?,
            input_hash: col("input_hash")?,
            ordinal: int("ordinal")?,
            class: col("replay_class")?,
            status: col("status")?,
            args: col("args")?,
            key: opt("idempotency_key")?,
            schema_hash: col("schema_hash")?,
            result: opt("result")?,
            error: opt("error")?,
            spend: opt("spend")?,
            attempt: int("attempt")?,
            seq: int("seq")?,
            mac: opt("mac")?,
            session,
        })
    }

    fn fields(&self) -> Fields {
        CallFields {
            id: &self.id,
            session: &self.session,
            kind: &self.kind,
            step: self.step,
            tool: &self.tool,
            input_hash: &self.input_hash,
            ordinal: self.ordinal,
            class: &self.class,
            status: &self.status,
            args: &self.args,
            key: self.key.as_deref(),
            schema_hash: &self.schema_hash,
            result: self.result.as_deref(),
            error: self.error.as_deref(),
            spend: self.spend.as_deref(),
            attempt: self.attempt,
            seq: self.seq,
        }
        .fields()
    }

    /// Checks the row's seal.
    pub(crate) fn check(&self, ring: &Keyring) -> Result<(), StoreError> {
        ring.verify(
            &SessionId::new(self.session.clone()),
            || format!("journal row `{}` (seq {})", self.id, self.seq),
            &self.fields(),
            self.mac.as_deref(),
        )
    }

    /// Seals the row as it now stands.
    pub(crate) fn seal(&mut self, ring: &Keyring) -> Result<(), StoreError> {
        self.mac = Some(ring.seal(&self.fields())?);
        Ok(())
    }

    /// Writes `mac` (after [`seal`](Self::seal)) to the stored row.
    pub(crate) async fn store_mac(&self, conn: &mut SqliteConnection) -> Result<(), StoreError> {
        sqlx::query("UPDATE durable_tool_calls SET mac = ? WHERE id = ?")
            .bind(self.mac.as_deref())
            .bind(&self.id)
            .execute(conn)
            .await
            .map_err(db)?;
        Ok(())
    }
}

/// Reads a journal row's sealed columns and checks them.
pub(crate) async fn checked_call(
    conn: &mut SqliteConnection,
    ring: &Keyring,
    id: &CallId,
) -> Result<RawCall, StoreError> {
    let row = sqlx::query(concat!(
        "SELECT ",
        raw_call_cols!(),
        " FROM durable_tool_calls c WHERE c.id = ?"
    ))
    .bind(id.as_str())
    .fetch_optional(conn)
    .await
    .map_err(db)?
    .ok_or_else(|| StoreError::CallNotFound(id.clone()))?;
    let raw = RawCall::from_row(&row)?;
    raw.check(ring)?;
    Ok(raw)
}

/// A session's head: its counts and its latest checkpoint's seal.
#[derive(Debug, Clone)]
pub(crate) struct HeadRow {
    pub(crate) session: SessionId,
    pub(crate) journal_rows: i64,
    pub(crate) latest_version: i64,
    pub(crate) resolutions: i64,
    pub(crate) checkpoint_seal: String,
    pub(crate) head: Option<String>,
}

impl HeadRow {
    fn fields(&self) -> Fields {
        Head {
            session: self.session.as_str(),
            journal_rows: self.journal_rows,
            latest_version: self.latest_version,
            checkpoint_seal: &self.checkpoint_seal,
            resolutions: self.resolutions,
        }
        .fields()
    }

    /// Checks the head's seal.
    pub(crate) fn check(&self, ring: &Keyring) -> Result<(), StoreError> {
        ring.verify(
            &self.session,
            || "the session head (its row counts and latest checkpoint)".to_owned(),
            &self.fields(),
            self.head.as_deref(),
        )
    }

    /// Seals the head as it now stands and writes it, with its counts.
    pub(crate) async fn store(
        &mut self,
        conn: &mut SqliteConnection,
        ring: &Keyring,
    ) -> Result<(), StoreError> {
        self.head = Some(ring.seal(&self.fields())?);
        sqlx::query(
            "UPDATE durable_sessions SET journal_rows = ?, resolutions = ?, head = ? WHERE id = ?",
        )
        .bind(self.journal_rows)
        .bind(self.resolutions)
        .bind(self.head.as_deref())
        .bind(self.session.as_str())
        .execute(conn)
        .await
        .map_err(db)?;
        Ok(())
    }
}

/// The columns [`head_from_row`] reads, from `durable_sessions s`.
macro_rules! head_cols {
    () => {
        "s.journal_rows, s.latest_version, s.resolutions, s.head, \
         (SELECT k.seal FROM durable_checkpoints k WHERE k.session_num = s.num \
          AND k.version = s.latest_version) AS checkpoint_seal"
    };
}
pub(crate) use head_cols;

/// Decodes the head columns of a session row selected with [`head_cols!`].
pub(crate) fn head_from_row(row: &SqliteRow, session: &SessionId) -> Result<HeadRow, StoreError> {
    Ok(HeadRow {
        session: session.clone(),
        journal_rows: rows::col(row, "journal_rows", session, None)?,
        latest_version: rows::col(row, "latest_version", session, None)?,
        resolutions: rows::col(row, "resolutions", session, None)?,
        head: rows::col(row, "head", session, None)?,
        checkpoint_seal: rows::col::<Option<String>>(row, "checkpoint_seal", session, None)?
            .unwrap_or_default(),
    })
}

/// Reads a session's head and checks it.
pub(crate) async fn checked_head(
    conn: &mut SqliteConnection,
    ring: &Keyring,
    session: &SessionId,
) -> Result<HeadRow, StoreError> {
    let row = sqlx::query(concat!(
        "SELECT ",
        head_cols!(),
        " FROM durable_sessions s WHERE s.id = ?"
    ))
    .bind(session.as_str())
    .fetch_optional(conn)
    .await
    .map_err(db)?
    .ok_or_else(|| StoreError::SessionNotFound(session.clone()))?;
    let head = head_from_row(&row, session)?;
    head.check(ring)?;
    Ok(head)
}

/// Checks that the session's journal holds exactly rows `1..=head.journal_rows`: a
/// deleted row leaves a gap or a short count, an inserted one a long count.
pub(crate) async fn check_journal_complete(
    conn: &mut SqliteConnection,
    head: &HeadRow,
) -> Result<(), StoreError> {
    let row = sqlx::query(
        "SELECT COUNT(*) AS n, COALESCE(MAX(seq), 0) AS top, COALESCE(MIN(seq), 1) AS bottom \
         FROM durable_tool_calls WHERE session_id = ?",
    )
    .bind(head.session.as_str())
    .fetch_one(conn)
    .await
    .map_err(db)?;
    let n: i64 = row.try_get("n").map_err(db)?;
    let top: i64 = row.try_get("top").map_err(db)?;
    let bottom: i64 = row.try_get("bottom").map_err(db)?;
    if n != head.journal_rows || top != head.journal_rows || bottom != 1 {
        return Err(StoreError::Tampered {
            session: head.session.clone(),
            what: "the journal".to_owned(),
            detail: format!(
                "the session head records {} rows, the table holds {n} (seq {bottom}..={top}): rows were deleted or inserted",
                head.journal_rows
            ),
        });
    }
    Ok(())
}

/// The seal of message `seq`, chained to `previous`.
pub(crate) fn seal_message(
    ring: &Keyring,
    session: &SessionId,
    seq: i64,
    message: &str,
    previous: &str,
) -> Result<String, StoreError> {
    ring.seal(&message_fields(session.as_str(), seq, message, previous))
}

/// Checks message `seq`'s seal, chained to `previous`.
pub(crate) fn check_message(
    ring: &Keyring,
    session: &SessionId,
    seq: i64,
    message: &str,
    previous: &str,
    seal: Option<&str>,
) -> Result<(), StoreError> {
    ring.verify(
        session,
        || format!("message {seq}"),
        &message_fields(session.as_str(), seq, message, previous),
        seal,
    )
}

/// A checkpoint's sealed columns (snapshots resolved to their text).
pub(crate) struct RawCheckpoint<'a> {
    pub(crate) session: &'a SessionId,
    pub(crate) version: i64,
    pub(crate) last_seq: i64,
    pub(crate) message_count: i64,
    pub(crate) last_message_seal: &'a str,
    pub(crate) plan: &'a str,
    pub(crate) budget: &'a str,
    pub(crate) state: &'a str,
    pub(crate) app_version: &'a str,
    pub(crate) previous: &'a str,
}

impl RawCheckpoint<'_> {
    fn fields(&self) -> Fields {
        CheckpointFields {
            session: self.session.as_str(),
            version: self.version,
            last_seq: self.last_seq,
            message_count: self.message_count,
            last_message_seal: self.last_message_seal,
            plan: self.plan,
            budget: self.budget,
            state: self.state,
            app_version: self.app_version,
            previous: self.previous,
        }
        .fields()
    }

    /// The checkpoint's seal.
    pub(crate) fn seal(&self, ring: &Keyring) -> Result<String, StoreError> {
        ring.seal(&self.fields())
    }

    /// Checks the checkpoint's seal.
    pub(crate) fn check(&self, ring: &Keyring, seal: Option<&str>) -> Result<(), StoreError> {
        ring.verify(
            self.session,
            || format!("checkpoint {}", self.version),
            &self.fields(),
            seal,
        )
    }
}

/// A resolution's sealed columns.
pub(crate) fn resolution_fields<'a>(
    call: &'a str,
    session: &'a SessionId,
    position: i64,
    decision: &'a str,
    result: Option<&'a str>,
    by: &'a str,
    note: Option<&'a str>,
) -> Fields {
    ResolutionFields {
        call,
        session: session.as_str(),
        position,
        decision,
        result,
        by,
        note,
    }
    .fields()
}

/// The seal of a message `seq` of a session as stored, or `""` for seq 0.
pub(crate) async fn message_seal_at(
    conn: &mut SqliteConnection,
    session: &SessionId,
    seq: i64,
) -> Result<String, StoreError> {
    if seq == 0 {
        return Ok(String::new());
    }
    let seal: Option<Option<String>> = sqlx::query_scalar(
        "SELECT seal FROM durable_messages WHERE session_num = \
         (SELECT num FROM durable_sessions WHERE id = ?) AND seq = ?",
    )
    .bind(session.as_str())
    .bind(seq)
    .fetch_optional(conn)
    .await
    .map_err(db)?;
    match seal {
        Some(seal) => Ok(seal.unwrap_or_default()),
        None => Err(StoreError::Tampered {
            session: session.clone(),
            what: format!("message {seq}"),
            detail: "it is missing from the transcript".to_owned(),
        }),
    }
}

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
        head.check(from)?;
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
    for raw in &calls {
        raw.store_mac(&mut *conn).await?;
        count += 1;
    }
    // Messages, in order (chained).
    let found = sqlx::query(
        "SELECT seq, message, seal FROM durable_messages WHERE session_num = \
         (SELECT num FROM durable_sessions WHERE id = ?) ORDER BY seq",
    )
    .bind(session.as_str())
    .fetch_all(&mut *conn)
    .await
    .map_err(db)?;
    let mut old_previous = String::new();
    let mut new_previous = String::new();
    let mut message_seals = std::collections::HashMap::new();
    message_seals.insert(0i64, String::new());
    let mut sealed_messages = Vec::with_capacity(found.len());
    for row in &found {
        let seq: i64 = rows::col(row, "seq", session, None)?;
        let text: String = rows::col(row, "message", session, None)?;
        let seal: Option<String> = rows::col(row, "seal", session, None)?;
        if let Some(from) = from {
            check_message(from, session, seq, &text, &old_previous, seal.as_deref())?;
        }
        old_previous = seal.unwrap_or_default();
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
            texts.push(ops::resolve_snapshot(&mut *conn, session, stored, column).await?);
        }
        let app_version: String = rows::col(row, "app_version", session, v)?;
        let message_count: i64 = rows::col(row, "message_count", session, v)?;
        let seal: Option<String> = rows::col(row, "seal", session, v)?;
        if let Some(from) = from {
            let old_last = message_seal_at(conn, session, last_seq).await?;
            RawCheckpoint {
                session,
                version,
                last_seq,
                message_count,
                last_message_seal: &old_last,
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
/// row is sealed with `ring`'s signing key: seals a database that was never sealed,
/// re-seals one sealed with a key `ring` can check (an application key turned on, or
/// rotated), and refuses one sealed with a key `ring` does not hold. Runs in one
/// `BEGIN IMMEDIATE` transaction, so concurrent openers do this once.
pub(crate) async fn setup_keys(
    conn: &mut SqliteConnection,
    ring: Keyring,
) -> Result<Keyring, StoreError> {
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut *conn)
        .await
        .map_err(db)?;
    let result = setup_keys_in(&mut *conn, ring).await;
    let end = if result.is_ok() { "COMMIT" } else { "ROLLBACK" };
    sqlx::query(end).execute(&mut *conn).await.map_err(db)?;
    result
}

async fn setup_keys_in(conn: &mut SqliteConnection, ring: Keyring) -> Result<Keyring, StoreError> {
    let store_key = match meta(conn, "store_key").await? {
        Some(hex) => Keyring::store_key_from_hex(&hex)?,
        None => {
            let key = durable_core::integrity::random_key()?;
            set_meta(conn, "store_key", &durable_core::integrity::hex(&key)).await?;
            key
        }
    };
    let ring = ring.bind_store_key(store_key);
    let now = crate::tx::now(conn).await?;
    let signing = ring.signing_id().to_owned();
    let current = meta(conn, "signing_key").await?;
    match ring.plan(current.as_deref())? {
        KeyPlan::Keep => return Ok(ring),
        KeyPlan::Rekey { from_id, from } => {
            let rows = reseal_all(conn, Some(&from), &ring).await?;
            log(
                conn,
                now,
                "rekey",
                Some(&from_id),
                &signing,
                rows,
                "every row was checked under the old key, then re-sealed under the new one",
            )
            .await?;
            tracing::warn!(from = %from_id, to = %signing, rows, "re-sealed the store under a new key");
        }
        KeyPlan::Adopt => {
            let rows = reseal_all(conn, None, &ring).await?;
            if rows > 0 {
                log(conn, now, "adopt", None, &signing, rows,
                    "rows written before tamper evidence (schema version 1) were sealed as found; their content before this point is not authenticated").await?;
                tracing::warn!(to = %signing, rows, "sealed a store written without seals");
            }
        }
    }
    set_meta(conn, "signing_key", &signing).await?;
    Ok(ring)
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

async fn log(
    conn: &mut SqliteConnection,
    now: i64,
    event: &str,
    from: Option<&str>,
    to: &str,
    rows: i64,
    detail: &str,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO durable_integrity_log (event, from_key, to_key, rows, detail, created_at) \
         VALUES (?, ?, ?, ?, ?, ?)",
    )
    .bind(event)
    .bind(from)
    .bind(to)
    .bind(rows)
    .bind(detail)
    .bind(now)
    .execute(conn)
    .await
    .map_err(db)?;
    Ok(())
}
