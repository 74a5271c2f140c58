//! Approvals (schema 6): a requested journal row with its approval, a person's decision
//! re-sealing it, and the approval log, each row sealed at its position and counted by
//! the session head; the inbox of requested rows, read from their partial index.
//!
//! Every write here is a plain `BEGIN IMMEDIATE` transaction on the writer connection,
//! outside the group commit: approvals are rare, and a decision must see the row as the
//! last commit left it (of two decisions, the second finds it decided).

use async_trait::async_trait;
use durable_core::integrity::Keyring;
use durable_core::integrity::rows::{RawApproval, check_approval_count};
use durable_core::store::{
    Approval, ApprovalEvent, ApprovalRecord, ApprovalRequest, ApprovalStore, CallRecord,
    CallStatus, DecideApproval, FORMAT_VERSION, Fence, IssueOutcome, NewCall, PendingApproval,
    SessionStatus,
};
use durable_core::{CallId, SessionId, StoreError};
use sqlx::SqliteConnection;
use sqlx::sqlite::SqliteRow;

use crate::SqliteStore;
use crate::error::{corrupt, db, encode};
use crate::journal::{key_holder_col, latest_step_col, load_call, new_row};
use crate::rows::{self, call_cols, json, opt_json};
use crate::seal::{self, HeadRow, StoreHead, checked_call_record};
use crate::tx::{WriteTx, fenced_select, now_sql};

/// Journals `call` as requested, with `request`'s approval and a `requested` audit row;
/// or returns the row that holds its identity. One transaction: the fenced read (clock,
/// fence, head, the latest step, the key's holder, the identity's row), then the row,
/// the audit row and the head.
pub(crate) async fn request_call(
    store: &SqliteStore,
    fence: Fence<'_>,
    call: NewCall,
    request: ApprovalRequest,
) -> Result<IssueOutcome, StoreError> {
    request.validate()?;
    if call.identity.session != *fence.session {
        return Err(StoreError::LeaseLost {
            session: call.identity.session.clone(),
            token: fence.token,
        });
    }
    let ring = store.keyring();
    let identity = &call.identity;
    let (mut tx, mut fenced, row) = WriteTx::begin_fenced(
        store.writer(),
        ring,
        fence,
        concat!(
            "BEGIN IMMEDIATE; ",
            fenced_select!(
                concat!(
                    latest_step_col!(),
                    key_holder_col!(),
                    ", (SELECT e.id FROM durable_tool_calls e WHERE e.session_id = s.id \
                     AND e.step = ? AND e.tool_name = ? AND e.input_hash = ? \
                     AND e.ordinal = ?) AS existing"
                ),
                ""
            )
        ),
        |q| {
            q.bind(&identity.tool)
                .bind(call.idempotency_key.as_deref())
                .bind(&identity.input_hash)
                .bind(identity.step)
                .bind(&identity.tool)
                .bind(&identity.input_hash)
                .bind(identity.ordinal)
        },
    )
    .await?;
    let now = tx.now;
    let result = async {
        let session = fence.session;
        let latest: Option<i64> = rows::col(&row, "latest_step", session, None)?;
        if let Some(latest) = latest.filter(|&latest| identity.step < latest) {
            return Err(StoreError::StepClosed {
                session: session.clone(),
                step: identity.step,
                latest,
            });
        }
        if let Some(key) = &call.idempotency_key {
            let holder: Option<String> = rows::col(&row, "key_holder", session, None)?;
            if let Some(existing) = holder {
                return Err(StoreError::IdempotencyConflict {
                    tool: identity.tool.clone(),
                    key: key.clone(),
                    existing: CallId::new(existing),
                });
            }
        }
        let conn = tx.conn();
        let existing: Option<String> = rows::col(&row, "existing", session, None)?;
        if let Some(existing) = existing {
            let found = load_call(&mut *conn, ring, &CallId::new(existing)).await?;
            return Ok(IssueOutcome::Existing(found));
        }
        let approval = request.journaled(now);
        let mut raw = new_row(&call, CallStatus::Requested, json(&call.args)?, 0);
        raw.approval = Some(serde_json::to_string(&approval).map_err(encode)?);
        raw.seq = fenced.head.journal_rows + 1;
        raw.seal(ring)?;
        sqlx::query(
            "INSERT INTO durable_tool_calls (id, session_id, kind, step, tool_name, input_hash, \
             ordinal, replay_class, status, args, idempotency_key, schema_hash, mac, attempt, \
             fence, format, issued_at, seq, approval) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, ?, ?, ?, ?, ?)",
        )
        .bind(&raw.id)
        .bind(&raw.session)
        .bind(&raw.kind)
        .bind(raw.step)
        .bind(&raw.tool)
        .bind(&raw.input_hash)
        .bind(raw.ordinal)
        .bind(&raw.class)
        .bind(&raw.status)
        .bind(&raw.args)
        .bind(raw.key.as_deref())
        .bind(&raw.schema_hash)
        .bind(raw.mac.as_deref())
        .bind(fence.token)
        .bind(FORMAT_VERSION)
        .bind(now)
        .bind(raw.seq)
        .bind(raw.approval.as_deref())
        .execute(&mut *conn)
        .await
        .map_err(db)?;
        fenced.head.journal_rows = raw.seq;
        let entry = LogEntry {
            call: &call.id,
            event: ApprovalEvent::Requested,
            actor: &request.asked_by,
            note: request.reasoning.as_deref(),
            args_before: None,
            args_after: None,
        };
        append(&mut *conn, ring, &mut fenced.head, entry, now).await?;
        fenced.head.store(&mut *conn, ring).await?;
        Ok(IssueOutcome::Inserted(
            load_call(conn, ring, &call.id).await?,
        ))
    }
    .await;
    tx.finish(result).await
}

/// Applies `decide` to its requested row: the row re-sealed with the decision, an audit
/// row, the head; and the session back to `active` when it was awaiting approval and
/// nothing else of it is requested. One transaction.
pub(crate) async fn decide_approval(
    store: &SqliteStore,
    decide: DecideApproval,
) -> Result<CallRecord, StoreError> {
    decide.validate()?;
    let ring = store.keyring();
    let mut tx = WriteTx::begin(store.writer()).await?;
    let now = tx.now;
    let result = async {
        let conn = tx.conn();
        let id = &decide.call;
        let mut raw = seal::checked_call(&mut *conn, ring, id).await?;
        let session = SessionId::new(raw.session.clone());
        let status = CallStatus::parse(&raw.status).ok_or_else(|| {
            corrupt(
                &session,
                None,
                format!("journal row `{id}` has status `{}`", raw.status),
            )
        })?;
        let approval = stored_approval(&session, id, raw.approval.as_deref())?;
        let change = decide.apply(&session, status, approval.as_ref(), now)?;
        ApprovalEvent::check_row(&session, id, status, last_event(&mut *conn, id).await?)?;
        let mut head = seal::checked_head(&mut *conn, ring, &session).await?;
        raw.status = change.status.as_str().to_owned();
        raw.error = opt_json(change.error.as_ref())?;
        raw.approval = Some(serde_json::to_string(&change.approval).map_err(encode)?);
        raw.seal(ring)?;
        let finished = (change.status == CallStatus::Denied).then_some(now);
        let updated = sqlx::query(
            "UPDATE durable_tool_calls SET status = ?, error = ?, approval = ?, mac = ?, \
             finished_at = ? WHERE id = ? AND status = ?",
        )
        .bind(&raw.status)
        .bind(raw.error.as_deref())
        .bind(raw.approval.as_deref())
        .bind(raw.mac.as_deref())
        .bind(finished)
        .bind(id.as_str())
        .bind(status.as_str())
        .execute(&mut *conn)
        .await
        .map_err(db)?;
        if updated.rows_affected() != 1 {
            // The write lock is held from BEGIN IMMEDIATE: only a change behind the
            // store's back between the read and this statement could get here.
            return Err(StoreError::NotAwaitingApproval {
                call: id.clone(),
                status: "changed during the decision".to_owned(),
            });
        }
        let args_after = opt_json(change.args_after.as_ref())?;
        let entry = LogEntry {
            call: id,
            event: change.event,
            actor: &decide.by,
            note: change.note.as_deref(),
            args_before: args_after.is_some().then_some(raw.args.as_str()),
            args_after: args_after.as_deref(),
        };
        append(&mut *conn, ring, &mut head, entry, now).await?;
        head.store(&mut *conn, ring).await?;
        // The last decision a parked session waited for makes it resumable, released:
        // the next worker takes it without counting a recovery.
        sqlx::query(
            "UPDATE durable_sessions SET status = 'active', status_reason = NULL, \
             lease_owner = NULL, lease_expires_at = NULL, updated_at = ? \
             WHERE id = ? AND status = ? AND NOT EXISTS (SELECT 1 FROM durable_tool_calls \
               WHERE session_id = ? AND status = 'requested')",
        )
        .bind(now)
        .bind(session.as_str())
        .bind(SessionStatus::AwaitingApproval.as_str())
        .bind(session.as_str())
        .execute(&mut *conn)
        .await
        .map_err(db)?;
        load_call(conn, ring, id).await
    }
    .await;
    tx.finish(result).await
}

/// Requested rows, across sessions or for one, oldest request first, each checked; the
/// clock read by the same statement decides which have expired.
pub(crate) async fn pending_approvals(
    store: &SqliteStore,
    session: Option<&SessionId>,
) -> Result<Vec<PendingApproval>, StoreError> {
    let found = sqlx::query(concat!(
        "SELECT ",
        now_sql!(),
        " AS now, ",
        call_cols!(),
        " FROM durable_tool_calls c WHERE c.status = 'requested' \
         AND (?1 IS NULL OR c.session_id = ?1) \
         AND EXISTS (SELECT 1 FROM durable_sessions s WHERE s.id = c.session_id \
           AND s.status NOT IN ('completed', 'failed', 'cancelled')) \
         ORDER BY c.issued_at, c.session_id, c.seq"
    ))
    .bind(session.map(SessionId::as_str))
    .fetch_all(store.reader())
    .await
    .map_err(db)?;
    found
        .iter()
        .map(|row| pending(store.keyring(), row))
        .collect()
}

/// One row of [`pending_approvals`].
fn pending(ring: &Keyring, row: &SqliteRow) -> Result<PendingApproval, StoreError> {
    let call = checked_call_record(ring, row)?;
    let now: i64 = rows::col(row, "now", &call.identity.session, None)?;
    let expired = call
        .approval
        .as_ref()
        .and_then(|a| a.deadline)
        .is_some_and(|deadline| now >= deadline);
    Ok(PendingApproval { call, expired })
}

/// The approval log of a session, checked against the head (positions, seals, count).
pub(crate) async fn approvals(
    store: &SqliteStore,
    session: &SessionId,
) -> Result<Vec<ApprovalRecord>, StoreError> {
    let ring = store.keyring();
    let mut rtx = store
        .reader()
        .begin()
        .await
        .map_err(|e| crate::error::pool_error(store.reader(), crate::error::Pool::Reader, e))?;
    let head = seal::checked_head(&mut rtx, ring, session).await?;
    let found = sqlx::query(
        "SELECT call_id, position, event, actor, note, args_before, args_after, format, \
         created_at, seal FROM durable_approvals WHERE session_id = ? ORDER BY position",
    )
    .bind(session.as_str())
    .fetch_all(&mut *rtx)
    .await
    .map_err(db)?;
    rtx.commit().await.map_err(db)?;
    let mut out = Vec::with_capacity(found.len());
    for (i, row) in found.iter().enumerate() {
        let expected = i64::try_from(i + 1).unwrap_or(i64::MAX);
        out.push(log_row(ring, session, row, expected)?);
    }
    check_approval_count(&head, out.len())?;
    Ok(out)
}

/// Reads the sealed columns of an approval log row (`call_id`, `position`, `event`,
/// `actor`, `note`, `args_before`, `args_after`, `seal`).
pub(crate) fn raw_approval(
    row: &SqliteRow,
    session: &SessionId,
) -> Result<RawApproval, StoreError> {
    let text = |name: &str| rows::col::<Option<String>>(row, name, session, None);
    Ok(RawApproval {
        call: rows::col(row, "call_id", session, None)?,
        position: rows::col(row, "position", session, None)?,
        event: rows::col(row, "event", session, None)?,
        actor: rows::col(row, "actor", session, None)?,
        note: text("note")?,
        args_before: text("args_before")?,
        args_after: text("args_after")?,
        seal: text("seal")?,
    })
}

/// An audit row of the approval log, its seal checked at position `expected`.
fn log_row(
    ring: &Keyring,
    session: &SessionId,
    row: &SqliteRow,
    expected: i64,
) -> Result<ApprovalRecord, StoreError> {
    let raw = raw_approval(row, session)?;
    raw.check(ring, session, expected)?;
    let RawApproval {
        call,
        position,
        event,
        actor,
        note,
        args_before: before,
        args_after: after,
        ..
    } = raw;
    let format: i64 = rows::col(row, "format", session, None)?;
    crate::error::check_format(format, session, None, &format!("approval event {position}"))?;
    let event = ApprovalEvent::parse(&event)
        .ok_or_else(|| corrupt(session, None, format!("approval event `{event}`")))?;
    let what = |name: &str| format!("`{name}` of approval event {position}");
    let parse = |text: Option<String>, name: &str| {
        text.map(|t| crate::error::parse_json(&t, session, None, &what(name)))
            .transpose()
    };
    Ok(ApprovalRecord {
        call: CallId::new(call),
        session: session.clone(),
        position,
        event,
        by: actor,
        note,
        args_before: parse(before, "args_before")?,
        args_after: parse(after, "args_after")?,
        at: rows::col(row, "created_at", session, None)?,
    })
}

/// The last event of call `id` in its session's approval log (read in the writer's
/// transaction, by the log's index of calls).
pub(crate) async fn last_event(
    conn: &mut SqliteConnection,
    id: &CallId,
) -> Result<Option<ApprovalEvent>, StoreError> {
    let event: Option<String> = sqlx::query_scalar(
        "SELECT event FROM durable_approvals WHERE call_id = ? ORDER BY position DESC LIMIT 1",
    )
    .bind(id.as_str())
    .fetch_optional(conn)
    .await
    .map_err(db)?;
    Ok(event.as_deref().and_then(ApprovalEvent::parse))
}

/// An audit row to append.
pub(crate) struct LogEntry<'a> {
    pub(crate) call: &'a CallId,
    pub(crate) event: ApprovalEvent,
    pub(crate) actor: &'a str,
    pub(crate) note: Option<&'a str>,
    pub(crate) args_before: Option<&'a str>,
    pub(crate) args_after: Option<&'a str>,
}

/// Appends `entry` at the next position of the session's approval log, sealed, and
/// counts it in `head` (which the caller stores).
pub(crate) async fn append(
    conn: &mut SqliteConnection,
    ring: &Keyring,
    head: &mut HeadRow,
    entry: LogEntry<'_>,
    now: i64,
) -> Result<(), StoreError> {
    let mut raw = RawApproval {
        call: entry.call.as_str().to_owned(),
        position: head.approvals + 1,
        event: entry.event.as_str().to_owned(),
        actor: entry.actor.to_owned(),
        note: entry.note.map(str::to_owned),
        args_before: entry.args_before.map(str::to_owned),
        args_after: entry.args_after.map(str::to_owned),
        seal: None,
    };
    raw.seal(ring, &head.session)?;
    let (position, seal) = (raw.position, raw.seal.unwrap_or_default());
    sqlx::query(
        "INSERT INTO durable_approvals (call_id, session_id, position, event, actor, note, \
         args_before, args_after, format, created_at, seal) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(entry.call.as_str())
    .bind(head.session.as_str())
    .bind(position)
    .bind(entry.event.as_str())
    .bind(entry.actor)
    .bind(entry.note)
    .bind(entry.args_before)
    .bind(entry.args_after)
    .bind(FORMAT_VERSION)
    .bind(now)
    .bind(&seal)
    .execute(conn)
    .await
    .map_err(db)?;
    head.approvals = position;
    Ok(())
}

/// The approval a row holds, decoded (its seal was checked).
fn stored_approval(
    session: &SessionId,
    id: &CallId,
    text: Option<&str>,
) -> Result<Option<Approval>, StoreError> {
    text.map(|t| {
        serde_json::from_str(t).map_err(|e| {
            corrupt(
                session,
                None,
                format!("journal row `{id}`: its `approval` is not an approval ({e})"),
            )
        })
    })
    .transpose()
}

#[async_trait]
impl ApprovalStore for SqliteStore {
    async fn request_call(
        &self,
        fence: Fence<'_>,
        call: NewCall,
        request: ApprovalRequest,
    ) -> Result<IssueOutcome, StoreError> {
        request_call(self, fence, call, request).await
    }

    async fn decide_approval(&self, decide: DecideApproval) -> Result<CallRecord, StoreError> {
        let row = decide_approval(self, decide).await?;
        self.work_available();
        Ok(row)
    }

    async fn pending_approvals(
        &self,
        session: Option<&SessionId>,
    ) -> Result<Vec<PendingApproval>, StoreError> {
        pending_approvals(self, session).await
    }

    async fn approvals(&self, session: &SessionId) -> Result<Vec<ApprovalRecord>, StoreError> {
        approvals(self, session).await
    }
}
