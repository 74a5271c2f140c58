//! Seals: computing them in write transactions, checking them on reads, and the session
//! head. The store's key setup and re-sealing are in [`crate::keys`].
//!
//! What is sealed and why is in [`durable_core::integrity`]; this module maps it onto
//! the SQLite tables.

use durable_core::integrity::{
    CallFields, CheckpointFields, Fields, Head, IssuedCount, Keyring, ResolutionFields,
    message_fields,
};
use durable_core::store::CallRecord;
use durable_core::{CallId, SessionId, StoreError};
use sqlx::sqlite::SqliteRow;
use sqlx::{Row, SqliteConnection};

use crate::error::db;
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
    /// The call's approval, as stored (JSON text), for a call that needed one.
    pub(crate) approval: Option<String>,
}

/// Columns [`RawCall::from_row`] reads (alias `c`).
macro_rules! raw_call_cols {
    () => {
        "c.id, c.session_id, c.kind, c.step, c.tool_name, c.input_hash, c.ordinal, \
         c.replay_class, c.status, c.args, c.idempotency_key, c.schema_hash, c.result, \
         c.error, c.spend, c.attempt, c.seq, c.mac, c.approval"
    };
}
pub(crate) use raw_call_cols;

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
            approval: opt("approval")?,
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
            approval: self.approval.as_deref(),
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

/// Decodes a `durable_tool_calls` row selected with [`rows::call_cols!`] after checking
/// its seal.
pub(crate) fn checked_call_record(
    ring: &Keyring,
    row: &SqliteRow,
) -> Result<CallRecord, StoreError> {
    RawCall::from_row(row)?.check(ring)?;
    rows::call(row)
}

/// A session's head: its counts and its latest checkpoint's seal.
#[derive(Debug, Clone)]
pub(crate) struct HeadRow {
    pub(crate) session: SessionId,
    pub(crate) journal_rows: i64,
    pub(crate) latest_version: i64,
    pub(crate) resolutions: i64,
    /// Journal rows whose status is `issued`; `None` on a head written before schema 4
    /// (sealed without the count: [`Head::legacy_fields`]), which the store upgrades when
    /// it opens the database ([`crate::keys`]).
    pub(crate) issued_rows: Option<i64>,
    /// Rows of the session's approval log (requests and decisions).
    pub(crate) approvals: i64,
    pub(crate) checkpoint_seal: String,
    pub(crate) head: Option<String>,
}

impl HeadRow {
    fn fields(&self) -> Fields {
        IssuedCount(self.issued_rows).fields(Head {
            session: self.session.as_str(),
            journal_rows: self.journal_rows,
            latest_version: self.latest_version,
            checkpoint_seal: &self.checkpoint_seal,
            resolutions: self.resolutions,
            issued_rows: 0,
            approvals: self.approvals,
        })
    }

    /// Adds `delta` to the count of issued rows (a row issued: +1; finished or resolved:
    /// −1); a head without its count cannot be written ([`IssuedCount::add`]).
    pub(crate) fn count_issued(&mut self, delta: i64) -> Result<(), StoreError> {
        self.issued_rows = IssuedCount(self.issued_rows).add(&self.session, delta)?.0;
        Ok(())
    }

    /// A head still without its count of issued rows ([`IssuedCount::uncounted`]).
    fn not_counted(&self) -> StoreError {
        IssuedCount::uncounted(&self.session)
    }

    /// Checks that a read of the session's issued rows found as many as the head counts
    /// ([`IssuedCount::check`]).
    pub(crate) fn check_issued(&self, found: usize) -> Result<(), StoreError> {
        IssuedCount(self.issued_rows).check(&self.session, found)
    }

    /// Checks the head's seal. A head without its count of issued rows is refused: the
    /// store counted every head when it opened the database, so one left uncounted failed
    /// its checks then ([`crate::keys`]).
    pub(crate) fn check(&self, ring: &Keyring) -> Result<(), StoreError> {
        if self.issued_rows.is_none() {
            return Err(self.not_counted());
        }
        self.check_any_format(ring)
    }

    /// Checks the head's seal in whichever format it was written: with its count of
    /// issued rows, or (`issued_rows` is `None`) the format before schema 4. Only for the
    /// upgrade and the re-sealing that count such heads.
    pub(crate) fn check_any_format(&self, ring: &Keyring) -> Result<(), StoreError> {
        if self.issued_rows.is_none() && self.approvals != 0 {
            // A head of the old format was written before approvals existed: its seal
            // does not cover the count, so a count there was set behind the store's back.
            return Err(StoreError::Tampered {
                session: self.session.clone(),
                what: "the session head".to_owned(),
                detail: format!(
                    "it predates approvals but counts {} approval events",
                    self.approvals
                ),
            });
        }
        ring.verify(
            &self.session,
            || "the session head (its row counts and latest checkpoint)".to_owned(),
            &self.fields(),
            self.head.as_deref(),
        )
    }

    /// Seals the head as it now stands (write it with [`store`](Self::store), or as
    /// part of a larger statement: `head`, `journal_rows`, `resolutions`).
    pub(crate) fn reseal(&mut self, ring: &Keyring) -> Result<(), StoreError> {
        self.head = Some(ring.seal(&self.fields())?);
        Ok(())
    }

    /// Seals the head as it now stands and writes it, with its counts.
    pub(crate) async fn store(
        &mut self,
        conn: &mut SqliteConnection,
        ring: &Keyring,
    ) -> Result<(), StoreError> {
        self.reseal(ring)?;
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
        let JournalCount { count, top, bottom } = *self;
        if count != head.journal_rows || top != head.journal_rows || bottom != 1 {
            return Err(StoreError::Tampered {
                session: head.session.clone(),
                what: "the journal".to_owned(),
                detail: format!(
                    "the session head records {} rows, the table holds {count} (seq {bottom}..={top}): rows were deleted or inserted",
                    head.journal_rows
                ),
            });
        }
        Ok(())
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
