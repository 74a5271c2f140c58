//! Seals: computing them in write transactions, checking them on reads, and the session
//! head. The store's key setup and re-sealing are in [`crate::keys`].
//!
//! What is sealed and why is in [`durable_core::integrity`]; this module maps it onto
//! the SQLite tables.

use durable_core::integrity::Keyring;
use durable_core::integrity::rows::RawResolution;
use durable_core::integrity::rows::check_journal_extent;
pub(crate) use durable_core::integrity::rows::{
    HeadRow, RawCall, RawCheckpoint, check_message, resolution_fields, seal_message,
};
use durable_core::store::CallRecord;
use durable_core::{CallId, SessionId, StoreError};
use sqlx::sqlite::SqliteRow;
use sqlx::{Row, SqliteConnection};

use crate::error::db;
use crate::rows;

/// Columns [`raw_call`] reads (alias `c`).
macro_rules! raw_call_cols {
    () => {
        "c.id, c.session_id, c.kind, c.step, c.tool_name, c.input_hash, c.ordinal, \
         c.replay_class, c.status, c.args, c.idempotency_key, c.schema_hash, c.result, \
         c.error, c.spend, c.attempt, c.seq, c.mac, c.approval"
    };
}
pub(crate) use raw_call_cols;

/// Reads the sealed columns of a row selected with `raw_call_cols!` (or a superset).
pub(crate) fn raw_call(row: &SqliteRow) -> Result<RawCall, StoreError> {
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
        approval: opt("approval")?,
        session,
    })
}

/// Writes a journal row's `mac` (after [`RawCall::seal`]) to the stored row.
pub(crate) async fn store_mac(
    raw: &RawCall,
    conn: &mut SqliteConnection,
) -> Result<(), StoreError> {
    sqlx::query("UPDATE durable_tool_calls SET mac = ? WHERE id = ?")
        .bind(raw.mac.as_deref())
        .bind(&raw.id)
        .execute(conn)
        .await
        .map_err(db)?;
    Ok(())
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
    let raw = raw_call(&row)?;
    raw.check(ring)?;
    Ok(raw)
}

/// Decodes a `durable_tool_calls` row selected with [`rows::call_cols!`] after checking
/// its seal.
pub(crate) fn checked_call_record(
    ring: &Keyring,
    row: &SqliteRow,
) -> Result<CallRecord, StoreError> {
    raw_call(row)?.check(ring)?;
    rows::call(row)
}

/// Writes a session head, sealed, with its counts.
pub(crate) trait StoreHead {
    /// Seals the head as it now stands and writes it, with its counts.
    async fn store(
        &mut self,
        conn: &mut SqliteConnection,
        ring: &Keyring,
    ) -> Result<(), StoreError>;
}

impl StoreHead for HeadRow {
    async fn store(
        &mut self,
        conn: &mut SqliteConnection,
        ring: &Keyring,
    ) -> Result<(), StoreError> {
        self.seal(ring)?;
        sqlx::query(
            "UPDATE durable_sessions SET journal_rows = ?, resolutions = ?, issued_rows = ?, \
             approvals = ?, head = ? WHERE id = ?",
        )
        .bind(self.journal_rows)
        .bind(self.resolutions)
        .bind(self.issued_rows)
        .bind(self.approvals)
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
        "s.journal_rows, s.latest_version, s.resolutions, s.issued_rows, s.approvals, s.head, \
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
        issued_rows: rows::col(row, "issued_rows", session, None)?,
        approvals: rows::col(row, "approvals", session, None)?,
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

/// Columns counting a session's journal (`?1`: the session id), read from the position
/// index alone: for [`JournalCount`].
macro_rules! journal_count_cols {
    () => {
        ", (SELECT COUNT(*) FROM durable_tool_calls WHERE session_id = ?1) AS journal_count, \
         (SELECT COALESCE(MAX(seq), 0) FROM durable_tool_calls WHERE session_id = ?1) \
         AS journal_top, \
         (SELECT COALESCE(MIN(seq), 1) FROM durable_tool_calls WHERE session_id = ?1) \
         AS journal_bottom"
    };
}
pub(crate) use journal_count_cols;

/// A session's journal as counted by [`journal_count_cols!`].
pub(crate) struct JournalCount {
    count: i64,
    top: i64,
    bottom: i64,
}

impl JournalCount {
    pub(crate) fn from_row(row: &SqliteRow, session: &SessionId) -> Result<Self, StoreError> {
        Ok(JournalCount {
            count: rows::col(row, "journal_count", session, None)?,
            top: rows::col(row, "journal_top", session, None)?,
            bottom: rows::col(row, "journal_bottom", session, None)?,
        })
    }

    /// Checks that the session's journal holds exactly rows `1..=head.journal_rows`: a
    /// deleted row leaves a gap or a short count, an inserted one a long count.
    pub(crate) fn check(&self, head: &HeadRow) -> Result<(), StoreError> {
        check_journal_extent(head, self.count, self.top, self.bottom)
    }
}

/// Checks that the session's journal holds exactly rows `1..=head.journal_rows`.
pub(crate) async fn check_journal_complete(
    conn: &mut SqliteConnection,
    head: &HeadRow,
) -> Result<(), StoreError> {
    let row = sqlx::query(concat!("SELECT 1", journal_count_cols!()))
        .bind(head.session.as_str())
        .fetch_one(conn)
        .await
        .map_err(db)?;
    JournalCount::from_row(&row, &head.session)?.check(head)
}

/// Columns for [`StepCheck`] (`?1`: the session id, `?2`: the step): how many of the
/// positions next to the step's rows hold rows, and for a step
/// without rows, the last position before it and the first after it. Each is a lookup
/// in the identity or position index, whatever the journal's length (`+seq`: by the
/// identity index and the step's few rows, not by walking the position index).
macro_rules! step_check_cols {
    () => {
        ", (SELECT COUNT(*) FROM durable_tool_calls WHERE session_id = ?1 AND seq IN ( \
           (SELECT MIN(+seq) FROM durable_tool_calls WHERE session_id = ?1 AND step = ?2) - 1, \
           (SELECT MAX(+seq) FROM durable_tool_calls WHERE session_id = ?1 AND step = ?2) + 1)) \
         AS step_neighbours, \
         (SELECT MAX(+seq) FROM durable_tool_calls WHERE session_id = ?1 AND step = \
           (SELECT step FROM durable_tool_calls WHERE session_id = ?1 AND step < ?2 \
            ORDER BY step DESC LIMIT 1)) AS step_before, \
         (SELECT MIN(+seq) FROM durable_tool_calls WHERE session_id = ?1 AND step = \
           (SELECT step FROM durable_tool_calls WHERE session_id = ?1 AND step > ?2 \
            ORDER BY step LIMIT 1)) AS step_after"
    };
}
pub(crate) use step_check_cols;

/// What [`step_check_cols!`] found around one step.
pub(crate) struct StepCheck {
    neighbours: i64,
    before: Option<i64>,
    after: Option<i64>,
}

impl StepCheck {
    pub(crate) fn from_row(row: &SqliteRow, session: &SessionId) -> Result<Self, StoreError> {
        Ok(StepCheck {
            neighbours: rows::col(row, "step_neighbours", session, None)?,
            before: rows::col(row, "step_before", session, None)?,
            after: rows::col(row, "step_after", session, None)?,
        })
    }

    /// Checks that a step's rows, at positions `seqs` (ascending, read in the same
    /// statement), are all of that step's rows, without reading the rest of the journal.
    ///
    /// A step's rows are contiguous in the journal (steps only move forward: the store
    /// refuses a row of an earlier step than its latest row's, `StoreError::StepClosed`),
    /// so it suffices that they have no gap and that the positions just before and after
    /// them hold the last row of the nearest earlier step and the first row of the
    /// nearest later one, unless they are the journal's ends; for a step
    /// without rows, that the last row before it and the first after it are neighbours.
    /// A deleted row of the step, at its edge or inside it, or all of them, or a row moved
    /// out of the step, is [`StoreError::Tampered`].
    pub(crate) fn check(&self, head: &HeadRow, step: i64, seqs: &[i64]) -> Result<(), StoreError> {
        let n = head.journal_rows;
        let tampered = |detail: String| StoreError::Tampered {
            session: head.session.clone(),
            what: format!("the journal (step {step})"),
            detail,
        };
        let (Some(&first), Some(&last)) = (seqs.first(), seqs.last()) else {
            let (before, after) = (self.before.unwrap_or(0), self.after.unwrap_or(n + 1));
            if after != before + 1 || after > n + 1 {
                return Err(tampered(format!(
                    "the step has no rows, but the journal jumps from position {before} to \
                     {after} around it (the session head records {n} rows): rows were deleted"
                )));
            }
            return Ok(());
        };
        let count = i64::try_from(seqs.len()).unwrap_or(i64::MAX);
        if first < 1 || last > n || last - first + 1 != count {
            return Err(tampered(format!(
                "the step's {count} rows sit at positions {first}..={last} of a journal of {n} \
                 rows: rows were deleted or inserted"
            )));
        }
        // The neighbours by position; 0 and n + 1 never hold a row.
        let expected = i64::from(first > 1) + i64::from(last < n);
        if self.neighbours != expected {
            return Err(tampered(format!(
                "the rows next to the step's (positions {} and {}) are missing or extra: rows \
                 were deleted or inserted",
                first - 1,
                last + 1
            )));
        }
        // Those neighbours are of an earlier and a later step: the last row of the
        // nearest earlier step and the first of the nearest later one. A row moved out of
        // the step to an earlier one (its seal untouched) would sit right after the
        // step's rows, with a smaller step.
        if first > 1 && self.before != Some(first - 1) {
            return Err(tampered(format!(
                "the row before the step's first (position {}) is not the last row of an \
                 earlier step: a row was moved between steps",
                first - 1
            )));
        }
        if last < n && self.after != Some(last + 1) {
            return Err(tampered(format!(
                "the row after the step's last (position {}) is not the first row of a later \
                 step: a row was moved between steps",
                last + 1
            )));
        }
        Ok(())
    }
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

/// Reads the sealed columns of a `durable_resolutions` row of `session`.
pub(crate) fn raw_resolution(
    row: &SqliteRow,
    session: &SessionId,
) -> Result<RawResolution, StoreError> {
    let col = |name: &str| rows::col::<String>(row, name, session, None);
    let opt = |name: &str| rows::col::<Option<String>>(row, name, session, None);
    Ok(RawResolution {
        call: col("call_id")?,
        position: rows::col(row, "position", session, None)?,
        decision: col("decision")?,
        result: opt("result")?,
        by: col("resolved_by")?,
        note: opt("note")?,
        seal: opt("seal")?,
    })
}
