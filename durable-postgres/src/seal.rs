//! Seals: computing them in write transactions, checking them on reads, and the session
//! head. The store's key setup and re-sealing are in [`crate::keys`].
//!
//! What is sealed and why is in [`durable_core::integrity`]; this module maps it onto
//! the PostgreSQL tables. JSON columns are TEXT, so a seal covers the stored bytes
//! exactly as the SQLite backend's does: the same rows give the same sealed fields.

use durable_core::integrity::{
    ApprovalFields, CallFields, CheckpointFields, Fields, Head, IssuedCount, Keyring,
    ResolutionFields, message_fields,
};
use durable_core::store::{CallRecord, FORMAT_VERSION};
use durable_core::{SessionId, StoreError};
use sqlx::postgres::{PgConnection, PgRow};

use crate::error::db;
use crate::rows::{self, get};

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
    /// The call's approval as stored (JSON text), for a call that needed one: sealed as
    /// stored, so the seal covers the bytes a reader decodes.
    pub(crate) approval: Option<String>,
    pub(crate) mac: Option<String>,
}

/// Columns [`RawCall::from_row`] reads (a subset of `call_cols!`).
macro_rules! raw_call_cols {
    () => {
        "id, session_id, kind, step, tool_name, input_hash, ordinal, replay_class, status, \
         args, idempotency_key, schema_hash, result, error, spend, attempt, seq, approval, mac"
    };
}
pub(crate) use raw_call_cols;

impl RawCall {
    /// Reads the sealed columns of a row selected with [`raw_call_cols!`] or `call_cols!`.
    pub(crate) fn from_row(row: &PgRow) -> Result<Self, StoreError> {
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
}

/// Decodes a `durable_tool_calls` row selected with [`rows::call_cols!`] after checking
/// its seal.
pub(crate) fn checked_call_record(ring: &Keyring, row: &PgRow) -> Result<CallRecord, StoreError> {
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
    /// a writer opens the database ([`crate::keys`]).
    pub(crate) issued_rows: Option<i64>,
    /// Rows of the session's approval log (schema 8; 0 before it, and for every session
    /// without approvals, whose heads are sealed as before: [`Head::approvals`]).
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

    /// Checks the head's seal. A head without its count of issued rows is refused: every
    /// head a writer did not count when it upgraded the database failed its checks then.
    pub(crate) fn check(&self, ring: &Keyring) -> Result<(), StoreError> {
        if self.issued_rows.is_none() {
            return Err(self.not_counted());
        }
        self.check_sealed(ring)
    }

    /// Checks the head's seal, under the format it was written in: a head without its
    /// count of issued rows (written before schema 4) under
    /// [`Head::legacy_fields`]. Only for the upgrade of such heads ([`crate::keys`]).
    pub(crate) fn check_sealed(&self, ring: &Keyring) -> Result<(), StoreError> {
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

    /// Seals the head as it now stands (after its counts changed).
    pub(crate) fn seal(&mut self, ring: &Keyring) -> Result<(), StoreError> {
        self.head = Some(ring.seal(&self.fields())?);
        Ok(())
    }

    /// Seals the head as it now stands and writes it, with its counts.
    pub(crate) async fn store(
        &mut self,
        conn: &mut PgConnection,
        ring: &Keyring,
    ) -> Result<(), StoreError> {
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

/// A checkpoint's sealed columns.
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

/// Checks the resolutions of a session, read in order, against their seals (each at its
/// position 1, 2, …) and the head's count.
pub(crate) fn check_resolutions(
    ring: &Keyring,
    head: &HeadRow,
    found: &[PgRow],
) -> Result<(), StoreError> {
    let session = &head.session;
    for (i, row) in found.iter().enumerate() {
        let call: String = get(row, "call_id")?;
        let position: i64 = get(row, "position")?;
        let decision: String = get(row, "decision")?;
        let result: Option<String> = get(row, "result")?;
        let by: String = get(row, "resolved_by")?;
        let note: Option<String> = get(row, "note")?;
        let stored: Option<String> = get(row, "seal")?;
        let expected = i64::try_from(i + 1).unwrap_or(i64::MAX);
        let fields = resolution_fields(
            &call,
            session,
            expected,
            &decision,
            result.as_deref(),
            &by,
            note.as_deref(),
        );
        ring.verify(
            session,
            || format!("resolution {position} (call `{call}`)"),
            &fields,
            stored.as_deref(),
        )?;
    }
    if i64::try_from(found.len()).ok() != Some(head.resolutions) {
        return Err(StoreError::Tampered {
            session: session.clone(),
            what: "the resolutions".to_owned(),
            detail: format!(
                "the session head records {} resolutions, the table holds {}",
                head.resolutions,
                found.len()
            ),
        });
    }
    Ok(())
}

/// An approval log row's sealed columns (see [`ApprovalFields`]).
#[derive(Debug, Clone)]
pub(crate) struct RawApproval {
    pub(crate) call: String,
    pub(crate) position: i64,
    pub(crate) event: String,
    pub(crate) actor: String,
    pub(crate) note: Option<String>,
    pub(crate) args_before: Option<String>,
    pub(crate) args_after: Option<String>,
    pub(crate) seal: Option<String>,
}

/// Columns [`RawApproval::from_row`] reads (and [`rows::approval_record`] decodes).
macro_rules! approval_cols {
    () => {
        "id, call_id, session_id, position, event, actor, note, args_before, args_after, \
         format, created_at, seal"
    };
}
pub(crate) use approval_cols;

impl RawApproval {
    /// Reads the sealed columns of a row selected with [`approval_cols!`].
    pub(crate) fn from_row(row: &PgRow) -> Result<Self, StoreError> {
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

    /// The sealed bytes, at `position` of `session`'s log (the position the reader
    /// expects, not the stored one: a row moved in the log fails its seal).
    fn fields(&self, session: &SessionId, position: i64) -> Fields {
        ApprovalFields {
            call: &self.call,
            session: session.as_str(),
            position,
            event: &self.event,
            actor: &self.actor,
            note: self.note.as_deref(),
            args_before: self.args_before.as_deref(),
            args_after: self.args_after.as_deref(),
        }
        .fields()
    }

    /// Seals the row at its own position.
    pub(crate) fn seal(&mut self, ring: &Keyring, session: &SessionId) -> Result<(), StoreError> {
        self.seal = Some(ring.seal(&self.fields(session, self.position))?);
        Ok(())
    }

    /// Seals the row at its own position and writes it into `session`'s log (the caller
    /// holds the session row and counts the row in the head, in the same transaction).
    pub(crate) async fn insert(
        &mut self,
        conn: &mut PgConnection,
        ring: &Keyring,
        session: &SessionId,
        now: i64,
    ) -> Result<(), StoreError> {
        self.seal(ring, session)?;
        sqlx::query(
            "INSERT INTO durable_approvals (call_id, session_id, position, event, actor, note, \
               args_before, args_after, format, created_at, seal) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
        )
        .bind(&self.call)
        .bind(session.as_str())
        .bind(self.position)
        .bind(&self.event)
        .bind(&self.actor)
        .bind(&self.note)
        .bind(&self.args_before)
        .bind(&self.args_after)
        .bind(FORMAT_VERSION)
        .bind(now)
        .bind(&self.seal)
        .execute(conn)
        .await
        .map_err(db)?;
        Ok(())
    }

    /// Checks the row's seal at position `expected` of `session`'s log.
    pub(crate) fn check(
        &self,
        ring: &Keyring,
        session: &SessionId,
        expected: i64,
    ) -> Result<(), StoreError> {
        ring.verify(
            session,
            || {
                format!(
                    "approval log row {} (call `{}`, {})",
                    self.position, self.call, self.event
                )
            },
            &self.fields(session, expected),
            self.seal.as_deref(),
        )
    }
}

/// Checks the approval log of a session, read in position order, against the seals
/// (each at its position 1, 2, …), the positions stored and the head's count: a row
/// deleted, inserted, moved or altered is [`StoreError::Tampered`].
pub(crate) fn check_approvals(
    ring: &Keyring,
    head: &HeadRow,
    found: &[PgRow],
) -> Result<(), StoreError> {
    let session = &head.session;
    for (i, row) in found.iter().enumerate() {
        let raw = RawApproval::from_row(row)?;
        let expected = i64::try_from(i + 1).unwrap_or(i64::MAX);
        raw.check(ring, session, expected)?;
        // The seal holds at the expected position; a stored position that says
        // otherwise was edited (the row reads back at the position it was sealed at).
        if raw.position != expected {
            return Err(StoreError::Tampered {
                session: session.clone(),
                what: "the approval log".to_owned(),
                detail: format!(
                    "the row sealed at position {expected} (call `{}`) is stored at position {}",
                    raw.call, raw.position
                ),
            });
        }
    }
    if i64::try_from(found.len()).ok() != Some(head.approvals) {
        return Err(StoreError::Tampered {
            session: session.clone(),
            what: "the approval log".to_owned(),
            detail: format!(
                "the session head records {} approval log rows, the table holds {}",
                head.approvals,
                found.len()
            ),
        });
    }
    Ok(())
}
