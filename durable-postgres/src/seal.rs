//! Seals: computing them in write transactions, checking them on reads, and the session
//! head. The store's key setup and re-sealing are in [`crate::keys`].
//!
//! What is sealed and why is in [`durable_core::integrity`]; this module maps it onto
//! the PostgreSQL tables. JSON columns are TEXT, so a seal covers the stored bytes
//! exactly as the SQLite backend's does: the same rows give the same sealed fields.

use durable_core::integrity::Keyring;
use durable_core::integrity::rows::{
    self, RawResolution, check_journal_extent, check_resolution_count,
};
pub(crate) use durable_core::integrity::rows::{
    HeadRow, RawApproval, RawCall, RawCheckpoint, check_message, resolution_fields, seal_message,
};
use durable_core::store::{CallRecord, FORMAT_VERSION};
use durable_core::{SessionId, StoreError};
use sqlx::postgres::{PgConnection, PgRow};

use crate::error::db;
use crate::rows::get;

/// Columns [`raw_call`] reads (a subset of `call_cols!`).
macro_rules! raw_call_cols {
    () => {
        "id, session_id, kind, step, tool_name, input_hash, ordinal, replay_class, status, \
         args, idempotency_key, schema_hash, result, error, spend, attempt, seq, approval, mac"
    };
}
pub(crate) use raw_call_cols;

/// Reads the sealed columns of a row selected with [`raw_call_cols!`] or `call_cols!`.
pub(crate) fn raw_call(row: &PgRow) -> Result<RawCall, StoreError> {
    Ok(RawCall {
        id: get(row, "id")?,
        session: get(row, "session_id")?,
        kind: get(row, "kind")?,
        step: get(row, "step")?,
        tool: get(row, "tool_name")?,
        input_hash: get(row, "input_hash")?,
        ordinal: get(row, "ordinal")?,
        class: get(row, "replay_class")?,
        status: get(row, "status")?,
        args: get(row, "args")?,
        key: get(row, "idempotency_key")?,
        schema_hash: get(row, "schema_hash")?,
        result: get(row, "result")?,
        error: get(row, "error")?,
        spend: get(row, "spend")?,
        attempt: i64::from(get::<i32>(row, "attempt")?),
        seq: get(row, "seq")?,
        approval: get(row, "approval")?,
        mac: get(row, "mac")?,
    })
}

/// Decodes a `durable_tool_calls` row selected with [`crate::rows::call_cols!`] after checking
/// its seal.
pub(crate) fn checked_call_record(ring: &Keyring, row: &PgRow) -> Result<CallRecord, StoreError> {
    raw_call(row)?.check(ring)?;
    crate::rows::call(row)
}

/// Writes a session head, sealed, with its counts.
pub(crate) trait StoreHead {
    /// Seals the head as it now stands and writes it, with its counts.
    async fn store(&mut self, conn: &mut PgConnection, ring: &Keyring) -> Result<(), StoreError>;
}

impl StoreHead for HeadRow {
    async fn store(&mut self, conn: &mut PgConnection, ring: &Keyring) -> Result<(), StoreError> {
        self.seal(ring)?;
        sqlx::query(
            "UPDATE durable_sessions SET journal_rows = $2, resolutions = $3, \
             issued_rows = $4, head = $5, approvals = $6 WHERE id = $1",
        )
        .bind(self.session.as_str())
        .bind(self.journal_rows)
        .bind(self.resolutions)
        .bind(self.issued_rows)
        .bind(self.head.as_deref())
        .bind(self.approvals)
        .execute(conn)
        .await
        .map_err(db)?;
        Ok(())
    }
}

/// The columns [`head_from_row`] reads, from `durable_sessions s`.
macro_rules! head_cols {
    () => {
        "s.journal_rows, s.latest_version, s.resolutions, s.issued_rows, s.head, s.approvals, \
         (SELECT k.seal FROM durable_checkpoints k WHERE k.session_num = s.num \
          AND k.version = s.latest_version) AS checkpoint_seal"
    };
}
pub(crate) use head_cols;

/// Decodes the head columns of a session row selected with [`head_cols!`].
pub(crate) fn head_from_row(row: &PgRow, session: &SessionId) -> Result<HeadRow, StoreError> {
    Ok(HeadRow {
        session: session.clone(),
        journal_rows: get(row, "journal_rows")?,
        latest_version: get(row, "latest_version")?,
        resolutions: get(row, "resolutions")?,
        issued_rows: get(row, "issued_rows")?,
        approvals: get(row, "approvals")?,
        head: get(row, "head")?,
        checkpoint_seal: get::<Option<String>>(row, "checkpoint_seal")?.unwrap_or_default(),
    })
}

/// Reads a session's head and checks it.
pub(crate) async fn checked_head(
    conn: &mut PgConnection,
    ring: &Keyring,
    session: &SessionId,
) -> Result<HeadRow, StoreError> {
    let row = sqlx::query(concat!(
        "SELECT ",
        head_cols!(),
        " FROM durable_sessions s WHERE s.id = $1"
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

/// The aggregates [`journal_complete`] reads, over one session's journal rows.
macro_rules! journal_extent_cols {
    () => {
        "count(*) AS n, COALESCE(max(seq), 0) AS top, COALESCE(min(seq), 1) AS bottom"
    };
}
pub(crate) use journal_extent_cols;

/// Checks that the session's journal holds exactly rows `1..=head.journal_rows`: a
/// deleted row leaves a gap or a short count, an inserted one a long count.
pub(crate) async fn check_journal_complete(
    conn: &mut PgConnection,
    head: &HeadRow,
) -> Result<(), StoreError> {
    let row = sqlx::query(concat!(
        "SELECT ",
        journal_extent_cols!(),
        " FROM durable_tool_calls WHERE session_id = $1"
    ))
    .bind(head.session.as_str())
    .fetch_one(conn)
    .await
    .map_err(db)?;
    journal_complete(head, &row)
}

/// Checks the [`journal_extent_cols!`] of a session against its head (see
/// [`check_journal_complete`]).
pub(crate) fn journal_complete(head: &HeadRow, row: &PgRow) -> Result<(), StoreError> {
    let n: i64 = get(row, "n")?;
    let top: i64 = get(row, "top")?;
    let bottom: i64 = get(row, "bottom")?;
    check_journal_extent(head, n, top, bottom)
}

/// Where one step's rows sit in its session's journal, read beside them (see
/// [`StepExtent::check`]). Positions are `seq`s.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StepExtent {
    /// The step.
    pub(crate) step: i64,
    /// How many rows the step has.
    pub(crate) rows: i64,
    /// Its first and last row's position (`None` without rows).
    pub(crate) first: Option<i64>,
    pub(crate) last: Option<i64>,
    /// The steps of the rows at `first - 1` and `last + 1` (`None`: no row there).
    pub(crate) before: Option<i64>,
    pub(crate) after: Option<i64>,
    /// Without rows: the last position of the nearest earlier step and the first of the
    /// nearest later one (`None`: there is none).
    pub(crate) previous: Option<i64>,
    pub(crate) next: Option<i64>,
}

impl StepExtent {
    /// Checks that one step's rows are complete without counting the whole journal.
    ///
    /// The runtime only moves steps forward, so a step's rows are one run of positions,
    /// after every earlier step's and before every later one's. With rows at `a..=b`:
    /// `b - a + 1` of them, `b` within the head's count, and rows of an earlier step at
    /// `a - 1` (unless `a` is 1) and of a later one at `b + 1` (unless `b` is the last). A
    /// deleted first or last row leaves a missing neighbour, a deleted middle row a short
    /// count. Without rows: the nearest earlier step's last row and the nearest later
    /// step's first are adjacent, so a whole step deleted leaves a gap between them.
    ///
    /// An error names what is missing; it is conclusive only for that layout (a store
    /// used directly may write steps out of order, and then the whole journal is counted).
    pub(crate) fn check(&self, head: &HeadRow) -> Result<(), StoreError> {
        let n = head.journal_rows;
        let k = self.step;
        let tampered = |detail: String| StoreError::Tampered {
            session: head.session.clone(),
            what: "the journal".to_owned(),
            detail,
        };
        let (Some(a), Some(b)) = (self.first, self.last) else {
            let p = self.previous.unwrap_or(0);
            let q = self.next.unwrap_or(n + 1);
            if q == p + 1 && p <= n {
                return Ok(());
            }
            return Err(tampered(format!(
                "step {k} has no rows, and the rows around it end at seq {p} and resume at seq {q} (the session head records {n} rows): the rows at seq {}..={} are missing",
                p + 1,
                q - 1
            )));
        };
        if a < 1 || b > n {
            return Err(tampered(format!(
                "step {k} holds rows at seq {a}..={b} but the session head records {n} rows: rows were inserted"
            )));
        }
        if self.rows != b - a + 1 {
            return Err(tampered(format!(
                "step {k} holds {} rows at seq {a}..={b}: a row between them is missing",
                self.rows
            )));
        }
        if a > 1 && self.before.is_none_or(|s| s >= k) {
            return Err(tampered(format!(
                "the row at seq {} (before step {k}'s first, seq {a}) is missing",
                a - 1
            )));
        }
        if b < n && self.after.is_none_or(|s| s <= k) {
            return Err(tampered(format!(
                "the row at seq {} (after step {k}'s last, seq {b}) is missing",
                b + 1
            )));
        }
        Ok(())
    }
}

/// Where a session's transcript and checkpoint chain end: what the next checkpoint
/// continues from.
#[derive(Debug, Clone, Default)]
pub(crate) struct Tail {
    /// The latest checkpoint's version (`None`: before version 0).
    pub(crate) version: Option<i64>,
    /// The last message's position (0: none).
    pub(crate) last_seq: i64,
    /// Messages in the transcript.
    pub(crate) message_count: i64,
    /// The last message's seal (`""`: none).
    pub(crate) message_seal: String,
    /// The latest checkpoint's seal (`""`: none, before version 0).
    pub(crate) checkpoint_seal: String,
}

/// Checks the resolutions of a session, read in order, against their seals (each at its
/// position 1, 2, …) and the head's count.
pub(crate) fn check_resolutions(
    ring: &Keyring,
    head: &HeadRow,
    found: &[PgRow],
) -> Result<(), StoreError> {
    for (i, row) in found.iter().enumerate() {
        let raw = raw_resolution(row)?;
        raw.check(
            ring,
            &head.session,
            i64::try_from(i + 1).unwrap_or(i64::MAX),
        )?;
    }
    check_resolution_count(head, found.len())
}

/// Columns [`raw_approval`] reads (and [`crate::rows::approval_record`] decodes).
macro_rules! approval_cols {
    () => {
        "id, call_id, session_id, position, event, actor, note, args_before, args_after, \
         format, created_at, seal"
    };
}
pub(crate) use approval_cols;

/// Reads the sealed columns of an approval log row selected with [`approval_cols!`].
pub(crate) fn raw_approval(row: &PgRow) -> Result<RawApproval, StoreError> {
    Ok(RawApproval {
        call: get(row, "call_id")?,
        position: get(row, "position")?,
        event: get(row, "event")?,
        actor: get(row, "actor")?,
        note: get(row, "note")?,
        args_before: get(row, "args_before")?,
        args_after: get(row, "args_after")?,
        seal: get(row, "seal")?,
    })
}

/// Seals `log` at its own position and writes it into `session`'s approval log (the
/// caller holds the session row and counts the row in the head, in the same
/// transaction).
pub(crate) async fn insert_approval(
    log: &mut RawApproval,
    conn: &mut PgConnection,
    ring: &Keyring,
    session: &SessionId,
    now: i64,
) -> Result<(), StoreError> {
    log.seal(ring, session)?;
    sqlx::query(
        "INSERT INTO durable_approvals (call_id, session_id, position, event, actor, note, \
           args_before, args_after, format, created_at, seal) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
    )
    .bind(&log.call)
    .bind(session.as_str())
    .bind(log.position)
    .bind(&log.event)
    .bind(&log.actor)
    .bind(&log.note)
    .bind(&log.args_before)
    .bind(&log.args_after)
    .bind(FORMAT_VERSION)
    .bind(now)
    .bind(&log.seal)
    .execute(conn)
    .await
    .map_err(db)?;
    Ok(())
}

/// Checks the approval log of a session, read in position order with
/// [`approval_cols!`] ([`rows::check_approvals`]).
pub(crate) fn check_approvals(
    ring: &Keyring,
    head: &HeadRow,
    found: &[PgRow],
) -> Result<(), StoreError> {
    let raws = found
        .iter()
        .map(raw_approval)
        .collect::<Result<Vec<_>, _>>()?;
    rows::check_approvals(ring, head, &raws)
}

/// Reads the sealed columns of a `durable_resolutions` row.
pub(crate) fn raw_resolution(row: &PgRow) -> Result<RawResolution, StoreError> {
    Ok(RawResolution {
        call: get(row, "call_id")?,
        position: get(row, "position")?,
        decision: get(row, "decision")?,
        result: get(row, "result")?,
        by: get(row, "resolved_by")?,
        note: get(row, "note")?,
        seal: get(row, "seal")?,
    })
}
