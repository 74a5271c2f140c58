//! The call journal: tool/model call rows (sealed, see [`crate::seal`]): insert-or-get
//! of rows, outcomes and re-issues here, the reads in [`reads`]. Operator resolutions are
//! in [`crate::resolution`].

pub(crate) mod reads;
pub(crate) mod single_statement;

pub(crate) use reads::{call, calls, calls_page, in_doubt, issued_calls};

use async_trait::async_trait;
use durable_core::StoreError;
use durable_core::ids::{CallId, SessionId};
use durable_core::integrity::Keyring;
use durable_core::store::{
    Approval, ApprovalEvent, ApprovalRequest, CallOutcome, CallRecord, CallStatus, CheckpointMeta,
    EditedKey, FORMAT_VERSION, Fence, FinishCall, IssueOutcome, JournalStore, NewCall,
    NewCheckpoint,
};
use sqlx::Row;
use sqlx::postgres::PgConnection;

use crate::PostgresStore;
use crate::approval;
use crate::checkpoints;
use crate::error::{db, invariant};
use crate::rows::{call_cols, get};
use crate::seal::{self, RawApproval, RawCall, checked_call_record, raw_call_cols};
use crate::tx::{self, Lock, Want};

pub(crate) async fn issue_call(
    store: &PostgresStore,
    fence: Fence<'_>,
    call: NewCall,
) -> Result<IssueOutcome, StoreError> {
    insert_call(store, fence, call, None).await
}

pub(crate) async fn record_call(
    store: &PostgresStore,
    fence: Fence<'_>,
    call: NewCall,
    finish: FinishCall,
) -> Result<IssueOutcome, StoreError> {
    insert_call(store, fence, call, Some(finish)).await
}

async fn insert_call(
    store: &PostgresStore,
    fence: Fence<'_>,
    call: NewCall,
    finish: Option<FinishCall>,
) -> Result<IssueOutcome, StoreError> {
    match single_statement::insert(store, fence, call, finish).await? {
        single_statement::Insert::Written {
            call,
            finish,
            mac,
            now,
        } => Ok(IssueOutcome::Inserted(written(
            call,
            finish,
            mac,
            fence.token,
            now,
        ))),
        single_statement::Insert::Declined(call, finish) => {
            let entry = finish.map_or(Entry::Issue, Entry::Record);
            insert_locked(store, fence, call, entry).await
        }
    }
}

/// What a new journal row is written as, besides its call.
pub(crate) enum Entry {
    /// `issued`: about to run, counted by the head as in doubt until its outcome.
    Issue,
    /// With its outcome, already known ([`record_call`]).
    Record(FinishCall),
    /// `requested`: nothing runs until a person decides (`request_call`). The row
    /// carries its [`Approval`], and its request is the next row of the session's
    /// approval log, counted by the head.
    Request(ApprovalRequest),
}

impl Entry {
    /// The outcome a recorded row is written with.
    fn finish(&self) -> Option<&FinishCall> {
        match self {
            Entry::Record(finish) => Some(finish),
            Entry::Issue | Entry::Request(_) => None,
        }
    }
}

/// [`insert_call`] in a transaction that locks the session row first: for keyed calls,
/// whenever the one-statement write declined (it decides what to report), and for
/// requested rows, whose approval log row is written in the same transaction.
pub(crate) async fn insert_locked(
    store: &PostgresStore,
    fence: Fence<'_>,
    call: NewCall,
    entry: Entry,
) -> Result<IssueOutcome, StoreError> {
    // The holder of the idempotency key under other arguments, the row and its head in
    // one statement: it inserts the row only without such a holder, and counts it in the
    // head only when it was inserted (not an identity already journaled).
    const INSERT: &str = "WITH holder AS ( \
           SELECT id FROM durable_tool_calls \
           WHERE $11::text IS NOT NULL AND tool_name = $5 AND idempotency_key = $11 \
             AND input_hash <> $6 \
           ORDER BY issued_at, id LIMIT 1), \
         ins AS ( \
           INSERT INTO durable_tool_calls (id, session_id, kind, step, tool_name, input_hash, \
             ordinal, replay_class, status, args, idempotency_key, schema_hash, attempt, \
             fence, format, issued_at, result, error, spend, mac, finished_at, seq, approval) \
           SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $24, $13, $14, $15, \
                  $16, $17, $18, $19, $20, $21, $25 \
           WHERE NOT EXISTS (SELECT 1 FROM holder) \
           ON CONFLICT (session_id, step, tool_name, input_hash, ordinal) DO NOTHING \
           RETURNING seq), \
         head AS ( \
           UPDATE durable_sessions SET journal_rows = $21, head = $22, issued_rows = $23, \
             approvals = $26 \
           WHERE id = $2 AND EXISTS (SELECT 1 FROM ins)) \
         SELECT (SELECT id FROM holder) AS holder, EXISTS (SELECT 1 FROM ins) AS inserted";
    // The lock of `tx::lock_fenced`, with the step of the session's latest row (by
    // position, from the unique index), which a new row's step may not be before.
    const LOCK: &str = concat!(
        "SELECT ",
        tx::locked_cols!(),
        ", s.cancel_requested_at, s.cancel_by, s.cancel_reason, \
           (SELECT l.step FROM durable_tool_calls l WHERE l.session_id = s.id \
            AND l.seq = s.journal_rows) AS latest_step \
         FROM durable_sessions s WHERE s.id = $1 FOR NO KEY UPDATE"
    );
    let ring = store.keyring();
    let mut tx = tx::begin(&store.pool).await?;
    let row = sqlx::query(LOCK)
        .bind(fence.session.as_str())
        .fetch_optional(&mut *tx)
        .await
        .map_err(db)?
        .ok_or_else(|| StoreError::SessionNotFound(fence.session.clone()))?;
    let locked = tx::locked_from_row(&mut tx, ring, fence, &row, Want::default()).await?;
    // A lease on one session cannot write into another's journal.
    if &call.identity.session != fence.session {
        return Err(StoreError::LeaseLost {
            session: call.identity.session.clone(),
            token: fence.token,
        });
    }
    // A session asked to stop issues nothing (what `record_call` records already ran).
    if matches!(entry, Entry::Issue)
        && let Some(at) = get::<Option<i64>>(&row, "cancel_requested_at")?
    {
        return Err(StoreError::CancelRequested {
            session: fence.session.clone(),
            by: get::<Option<String>>(&row, "cancel_by")?.unwrap_or_default(),
            reason: get::<Option<String>>(&row, "cancel_reason")?.unwrap_or_default(),
            at,
        });
    }
    let latest = match get::<Option<i64>>(&row, "latest_step")? {
        Some(step) => Some(step),
        None if locked.head.journal_rows == 0 => None,
        // A statement that waited for the lock sees the latest row's position but not
        // the row (see `tx::locked_from_row`): read it by a statement of its own.
        None => Some(latest_step(&mut tx, &locked.head).await?),
    };
    if let Some(latest) = latest.filter(|&latest| call.identity.step < latest) {
        return Err(StoreError::StepClosed {
            session: call.identity.session.clone(),
            step: call.identity.step,
            latest,
        });
    }
    let now = locked.now;
    let tool = &call.identity.tool;
    if let Some(key) = &call.idempotency_key {
        // Serialize every use of this (tool, key) until commit, so two concurrent uses
        // with different arguments cannot both pass the holder check. A statement of its
        // own: the check's snapshot must be taken after the lock is granted.
        sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1 || chr(31) || $2, 0))")
            .bind(tool)
            .bind(key)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
    }
    let seq = locked.head.journal_rows + 1;
    let mut raw = new_row(&call, entry.finish(), seq);
    let mut head = locked.head.clone();
    head.journal_rows = seq;
    let (finish, request) = match entry {
        Entry::Issue => {
            // An issued row: the head counts it (a recorded outcome is not in doubt).
            head.count_issued(1)?;
            (None, None)
        }
        Entry::Record(finish) => (Some(finish), None),
        Entry::Request(asked) => {
            // A requested row is not in doubt (nothing runs); its request is counted
            // in the approval log.
            let (approval, log) = requested(&mut raw, &asked, now, head.approvals + 1)?;
            head.approvals = log.position;
            (None, Some((approval, log)))
        }
    };
    raw.seal(ring)?;
    head.seal(ring)?;
    let finished_at = finish.is_some().then_some(now);
    let row = sqlx::query(INSERT)
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
        .bind(&raw.key)
        .bind(&raw.schema_hash)
        .bind(fence.token)
        .bind(FORMAT_VERSION)
        .bind(now)
        .bind(&raw.result)
        .bind(&raw.error)
        .bind(&raw.spend)
        .bind(&raw.mac)
        .bind(finished_at)
        .bind(seq)
        .bind(head.head.as_deref())
        .bind(head.issued_rows)
        .bind(i32::try_from(raw.attempt).unwrap_or(i32::MAX))
        .bind(&raw.approval)
        .bind(head.approvals)
        .fetch_one(&mut *tx)
        .await
        .map_err(db)?;
    if let Some(existing) = get::<Option<String>>(&row, "holder")? {
        return Err(StoreError::IdempotencyConflict {
            tool: tool.clone(),
            key: call.idempotency_key.clone().unwrap_or_default(),
            existing: CallId::new(existing),
        });
    }
    let outcome = if get::<bool>(&row, "inserted")? {
        // The row as written: nothing is read back.
        let record = written(call, finish, raw.mac, fence.token, now);
        IssueOutcome::Inserted(match request {
            Some((approval, mut log)) => {
                // The request's row of the approval log: only with the row it asks
                // about (an identity already journaled asks nothing again).
                seal::insert_approval(&mut log, &mut tx, ring, fence.session, now).await?;
                CallRecord {
                    status: CallStatus::Requested,
                    attempt: 0,
                    approval: Some(approval),
                    ..record
                }
            }
            None => record,
        })
    } else {
        let row = sqlx::query(concat!(
            "SELECT ",
            call_cols!(),
            " FROM durable_tool_calls WHERE session_id = $1 AND step = $2 \
             AND tool_name = $3 AND input_hash = $4 AND ordinal = $5"
        ))
        .bind(call.identity.session.as_str())
        .bind(call.identity.step)
        .bind(tool)
        .bind(&call.identity.input_hash)
        .bind(call.identity.ordinal)
        .fetch_one(&mut *tx)
        .await
        .map_err(db)?;
        IssueOutcome::Existing(checked_call_record(ring, &row)?)
    };
    tx.commit().await.map_err(db)?;
    Ok(outcome)
}

/// Makes the new row `raw` a requested one (status `requested`, attempt 0: nothing ran,
/// its approval as asked at `now`, the store's clock), and returns its [`Approval`] and
/// the request's row of the approval log, at `position`, not yet sealed.
fn requested(
    raw: &mut RawCall,
    asked: &ApprovalRequest,
    now: i64,
    position: i64,
) -> Result<(Approval, RawApproval), StoreError> {
    let approval = Approval {
        asked_by: asked.asked_by.clone(),
        reasoning: asked.reasoning.clone(),
        requested_at: now,
        deadline: asked.expires_in.map(|d| now.saturating_add(tx::ttl_ms(d))),
        schema: asked.schema.clone(),
        decision: None,
    };
    let text = serde_json::to_string(&approval)
        .map_err(|e| invariant(format!("an approval that does not serialize: {e}")))?;
    raw.status = CallStatus::Requested.as_str().to_owned();
    raw.attempt = 0;
    raw.approval = Some(text);
    let log = RawApproval {
        call: raw.id.clone(),
        position,
        event: ApprovalEvent::Requested.as_str().to_owned(),
        actor: asked.asked_by.clone(),
        note: asked.reasoning.clone(),
        args_before: None,
        args_after: None,
        seal: None,
    };
    Ok((approval, log))
}

/// The sealed columns of a new row at position `seq` (status `issued` without `finish`),
/// not yet sealed.
fn new_row(call: &NewCall, finish: Option<&FinishCall>, seq: i64) -> RawCall {
    let stored = Stored::from(finish);
    RawCall {
        id: call.id.as_str().to_owned(),
        session: call.identity.session.as_str().to_owned(),
        kind: call.kind.as_str().to_owned(),
        step: call.identity.step,
        tool: call.identity.tool.clone(),
        input_hash: call.identity.input_hash.clone(),
        ordinal: call.identity.ordinal,
        class: call.class.as_str().to_owned(),
        status: stored.status.as_str().to_owned(),
        args: call.args.to_string(),
        key: call.idempotency_key.clone(),
        schema_hash: call.schema_hash.clone(),
        result: stored.result,
        error: stored.error,
        spend: stored.spend,
        attempt: 1,
        seq,
        approval: None,
        mac: None,
    }
}

/// The record of a row inserted from `call` (and `finish`) with seal `mac` at `now`, as
/// written: nothing is read back.
fn written(
    call: NewCall,
    finish: Option<FinishCall>,
    mac: Option<String>,
    fence: i64,
    now: i64,
) -> CallRecord {
    let finished_at = finish.is_some().then_some(now);
    let (status, result, error, spend) = match finish {
        Some(FinishCall { outcome, spend }) => match outcome {
            CallOutcome::Completed(v) => (CallStatus::Completed, Some(v), None, spend),
            CallOutcome::Failed(v) => (CallStatus::Failed, None, Some(v), spend),
        },
        None => (CallStatus::Issued, None, None, None),
    };
    CallRecord {
        id: call.id,
        kind: call.kind,
        identity: call.identity,
        class: call.class,
        status,
        args: call.args,
        idempotency_key: call.idempotency_key,
        schema_hash: call.schema_hash,
        result,
        error,
        spend,
        mac,
        attempt: 1,
        fence,
        issued_at: now,
        finished_at,
        approval: None,
    }
}

/// The step of the session's latest journal row (at the head's last position).
async fn latest_step(conn: &mut PgConnection, head: &seal::HeadRow) -> Result<i64, StoreError> {
    sqlx::query_scalar("SELECT step FROM durable_tool_calls WHERE session_id = $1 AND seq = $2")
        .bind(head.session.as_str())
        .bind(head.journal_rows)
        .fetch_optional(&mut *conn)
        .await
        .map_err(db)?
        .ok_or_else(|| StoreError::Tampered {
            session: head.session.clone(),
            what: "the journal".to_owned(),
            detail: format!(
                "the row at seq {} (the latest the session head records) is missing",
                head.journal_rows
            ),
        })
}

/// `approved_key`: `Some(key)` for `CheckpointStore::issue_approved` (only an approved
/// row, its key replaced when `key` is `Some`), `None` for `reissue_call`.
pub(crate) async fn reissue_call(
    store: &PostgresStore,
    fence: Fence<'_>,
    call: &CallId,
    approved_key: Option<Option<EditedKey>>,
) -> Result<CallRecord, StoreError> {
    let ring = store.keyring();
    let mut tx = tx::begin(&store.pool).await?;
    // The session row is locked for update: a row that did not happen is issued again,
    // and the head counts it.
    let (mut locked, mut raw, _) =
        lock_session_and_call(&mut tx, ring, fence, call, Lock::Update, Want::default()).await?;
    if approved_key.is_some() && raw.status != CallStatus::Approved.as_str() {
        return Err(StoreError::CallNotInDoubt {
            call: call.clone(),
            status: raw.status,
        });
    }
    // A session asked to stop starts nothing: not a re-run, not an approved call (its
    // row is locked: a cancellation commits before this or waits for it).
    if matches!(
        CallStatus::parse(&raw.status),
        Some(CallStatus::Issued | CallStatus::NotHappened | CallStatus::Approved)
    ) {
        let asked = sqlx::query(
            "SELECT cancel_requested_at, cancel_by, cancel_reason FROM durable_sessions \
             WHERE id = $1",
        )
        .bind(fence.session.as_str())
        .fetch_one(&mut *tx)
        .await
        .map_err(db)?;
        let at: Option<i64> = asked.try_get(0).map_err(db)?;
        if let Some(at) = at {
            return Err(StoreError::CancelRequested {
                session: fence.session.clone(),
                by: asked
                    .try_get::<Option<String>, _>(1)
                    .map_err(db)?
                    .unwrap_or_default(),
                reason: asked
                    .try_get::<Option<String>, _>(2)
                    .map_err(db)?
                    .unwrap_or_default(),
                at,
            });
        }
    }
    if let Some(Some(edited)) = &approved_key {
        // Another call of the tool holding the key with other arguments: as `issue_call`
        // refuses it, so is this (the row stays approved).
        let holder: Option<String> = sqlx::query_scalar(
            "SELECT id FROM durable_tool_calls WHERE tool_name = $1 AND idempotency_key = $2 \
             AND input_hash <> $3 AND id <> $4 ORDER BY issued_at, id LIMIT 1",
        )
        .bind(&raw.tool)
        .bind(&edited.key)
        .bind(&edited.input_hash)
        .bind(call.as_str())
        .fetch_optional(&mut *tx)
        .await
        .map_err(db)?;
        if let Some(existing) = holder {
            return Err(StoreError::IdempotencyConflict {
                tool: raw.tool.clone(),
                key: edited.key.clone(),
                existing: CallId::new(existing),
            });
        }
        raw.key = Some(edited.key.clone());
    }
    match CallStatus::parse(&raw.status) {
        Some(CallStatus::Issued) => {}
        Some(CallStatus::NotHappened) => locked.head.count_issued(1)?,
        // Approved: nothing ran yet; its approval (any edited arguments) stays on the row.
        // The log says it was issued, so the row's approved version put back afterwards
        // is refused (`ApprovalEvent::check_row`).
        Some(CallStatus::Approved) => {
            let last = approval::last_event(&mut tx, call).await?;
            ApprovalEvent::check_row(fence.session, call, CallStatus::Approved, last)?;
            let now = tx::now(&mut tx).await?;
            let mut log = RawApproval {
                call: call.as_str().to_owned(),
                position: locked.head.approvals + 1,
                event: ApprovalEvent::Issued.as_str().to_owned(),
                actor: "worker".to_owned(),
                note: None,
                args_before: None,
                args_after: None,
                seal: None,
            };
            seal::insert_approval(&mut log, &mut tx, ring, fence.session, now).await?;
            locked.head.approvals = log.position;
            locked.head.count_issued(1)?;
        }
        _ => {
            return Err(StoreError::CallNotInDoubt {
                call: call.clone(),
                status: raw.status,
            });
        }
    }
    locked.head.seal(ring)?;
    raw.attempt += 1;
    raw.status = CallStatus::Issued.as_str().to_owned();
    raw.result = None;
    raw.error = None;
    raw.spend = None;
    raw.seal(ring)?;
    let row = sqlx::query(concat!(
        "WITH head AS ( \
           UPDATE durable_sessions SET issued_rows = $6, head = $7, approvals = $8 \
           WHERE id = $5) \
         UPDATE durable_tool_calls SET attempt = $3, status = 'issued', fence = $2, \
         finished_at = NULL, result = NULL, error = NULL, spend = NULL, mac = $4, \
         idempotency_key = $9, operator_needed_at = NULL WHERE id = $1 RETURNING ",
        call_cols!()
    ))
    .bind(call.as_str())
    .bind(fence.token)
    .bind(i32::try_from(raw.attempt).unwrap_or(i32::MAX))
    .bind(&raw.mac)
    .bind(fence.session.as_str())
    .bind(locked.head.issued_rows)
    .bind(locked.head.head.as_deref())
    .bind(locked.head.approvals)
    .bind(raw.key.as_deref())
    .fetch_one(&mut *tx)
    .await
    .map_err(db)?;
    let record = checked_call_record(ring, &row)?;
    tx.commit().await.map_err(db)?;
    Ok(record)
}

pub(crate) async fn finish_call(
    store: &PostgresStore,
    fence: Fence<'_>,
    call: &CallId,
    finish: FinishCall,
    checkpoint: Option<(i64, NewCheckpoint)>,
) -> Result<Option<CheckpointMeta>, StoreError> {
    if checkpoint.is_none() && single_statement::finish(store, fence, call, &finish).await? {
        return Ok(None);
    }
    let ring = store.keyring();
    let mut tx = tx::begin(&store.pool).await?;
    // The session row is locked for update: the head counts one issued row fewer.
    let want = Want {
        tail: checkpoint.is_some(),
    };
    let (mut locked, mut raw, _) =
        lock_session_and_call(&mut tx, ring, fence, call, Lock::Update, want).await?;
    if raw.status != CallStatus::Issued.as_str() {
        return Err(StoreError::CallNotInDoubt {
            call: call.clone(),
            status: raw.status,
        });
    }
    let now = locked.now;
    let stored = Stored::from(Some(&finish));
    raw.status = stored.status.as_str().to_owned();
    raw.result = stored.result;
    raw.error = stored.error;
    raw.spend = stored.spend;
    raw.seal(ring)?;
    locked.head.count_issued(-1)?;
    // The count is written by this statement; the head's seal too, or (with a
    // checkpoint) by the checkpoint's write, sealed once over both changes.
    locked.head.seal(ring)?;
    sqlx::query(
        "WITH head AS ( \
           UPDATE durable_sessions SET issued_rows = $10, \
             head = CASE WHEN $12 THEN $11 ELSE head END \
           WHERE id = $9) \
         UPDATE durable_tool_calls \
         SET status = $2, result = $3, error = $4, spend = $5, mac = $6, finished_at = $7, \
             format = $8 \
         WHERE id = $1",
    )
    .bind(call.as_str())
    .bind(&raw.status)
    .bind(&raw.result)
    .bind(&raw.error)
    .bind(&raw.spend)
    .bind(&raw.mac)
    .bind(now)
    .bind(FORMAT_VERSION)
    .bind(fence.session.as_str())
    .bind(locked.head.issued_rows)
    .bind(locked.head.head.as_deref())
    .bind(checkpoint.is_none())
    .execute(&mut *tx)
    .await
    .map_err(db)?;
    let meta = match checkpoint {
        Some((expected, cp)) => Some(
            checkpoints::append_checkpoint(
                &mut tx,
                ring,
                fence.session,
                &mut locked,
                expected,
                cp,
                now,
            )
            .await?,
        ),
        None => None,
    };
    tx.commit().await.map_err(db)?;
    Ok(meta)
}

/// The stored columns of a call's outcome (all `NULL` and status `issued` without one).
struct Stored {
    status: CallStatus,
    result: Option<String>,
    error: Option<String>,
    spend: Option<String>,
}

impl From<Option<&FinishCall>> for Stored {
    fn from(finish: Option<&FinishCall>) -> Self {
        let Some(finish) = finish else {
            return Stored {
                status: CallStatus::Issued,
                result: None,
                error: None,
                spend: None,
            };
        };
        let (status, result, error) = match &finish.outcome {
            CallOutcome::Completed(v) => (CallStatus::Completed, Some(v.to_string()), None),
            CallOutcome::Failed(v) => (CallStatus::Failed, None, Some(v.to_string())),
        };
        Stored {
            status,
            result,
            error,
            spend: finish.spend.as_ref().map(ToString::to_string),
        }
    }
}

/// Locks the session row (as `lock`, checking the fence and the head as
/// [`tx::lock_fenced`] does) and then the call row (as [`lock_call`]) in one statement,
/// the same lock order as every fenced write. Returns what both learn. When the statement
/// finds no pair (no such session or call), the two are locked by statements of their own,
/// which say which is missing.
async fn lock_session_and_call(
    conn: &mut PgConnection,
    ring: &Keyring,
    fence: Fence<'_>,
    call: &CallId,
    lock: Lock,
    want: Want,
) -> Result<(tx::Locked, RawCall, i64), StoreError> {
    macro_rules! pair {
        ({ $($tail:tt)* }, $lock:literal) => {
            concat!(
                "SELECT ",
                tx::locked_cols!(),
                $($tail)*,
                ", c.id, c.session_id, c.kind, c.step, c.tool_name, c.input_hash, c.ordinal, \
                 c.replay_class, c.status, c.args, c.idempotency_key, c.schema_hash, c.result, \
                 c.error, c.spend, c.attempt, c.seq, c.approval, c.mac, c.fence AS call_fence \
                 FROM durable_sessions s JOIN durable_tool_calls c ON c.id = $2 \
                 WHERE s.id = $1 FOR ",
                $lock,
                " OF s FOR NO KEY UPDATE OF c"
            )
        };
    }
    let sql = match (lock, want.tail) {
        (Lock::Update, false) => pair!({ "" }, "NO KEY UPDATE"),
        (Lock::Update, true) => pair!({ tx::tail_cols!() }, "NO KEY UPDATE"),
    };
    let found = sqlx::query(sql)
        .bind(fence.session.as_str())
        .bind(call.as_str())
        .fetch_optional(&mut *conn)
        .await
        .map_err(db)?;
    let Some(row) = found else {
        let locked = tx::lock_fenced(&mut *conn, ring, fence, lock, want).await?;
        let (raw, row_fence) = lock_call(&mut *conn, ring, call, Some(fence)).await?;
        return Ok((locked, raw, row_fence));
    };
    let locked = tx::locked_from_row(&mut *conn, ring, fence, &row, want).await?;
    let raw = seal::raw_call(&row)?;
    raw.check(ring)?;
    if raw.session != fence.session.as_str() {
        return Err(StoreError::LeaseLost {
            session: SessionId::new(raw.session),
            token: fence.token,
        });
    }
    Ok((locked, raw, get(&row, "call_fence")?))
}

/// Locks a call row `FOR NO KEY UPDATE`, checks its seal, and returns its sealed columns and
/// fence. With `fence`, a call of another session is [`StoreError::LeaseLost`]: a lease
/// on one session cannot touch another's journal.
pub(crate) async fn lock_call(
    conn: &mut PgConnection,
    ring: &Keyring,
    call: &CallId,
    fence: Option<Fence<'_>>,
) -> Result<(RawCall, i64), StoreError> {
    let row = sqlx::query(concat!(
        "SELECT ",
        raw_call_cols!(),
        ", fence FROM durable_tool_calls WHERE id = $1 FOR NO KEY UPDATE"
    ))
    .bind(call.as_str())
    .fetch_optional(&mut *conn)
    .await
    .map_err(db)?
    .ok_or_else(|| StoreError::CallNotFound(call.clone()))?;
    let raw = seal::raw_call(&row)?;
    raw.check(ring)?;
    if let Some(fence) = fence
        && raw.session != fence.session.as_str()
    {
        return Err(StoreError::LeaseLost {
            session: SessionId::new(raw.session),
            token: fence.token,
        });
    }
    Ok((raw, get(&row, "fence")?))
}

#[async_trait]
impl JournalStore for PostgresStore {
    async fn issue_call(
        &self,
        fence: Fence<'_>,
        call: NewCall,
    ) -> Result<IssueOutcome, StoreError> {
        issue_call(self, fence, call).await
    }

    async fn record_call(
        &self,
        fence: Fence<'_>,
        call: NewCall,
        finish: FinishCall,
    ) -> Result<IssueOutcome, StoreError> {
        record_call(self, fence, call, finish).await
    }

    async fn reissue_call(
        &self,
        fence: Fence<'_>,
        call: &CallId,
    ) -> Result<CallRecord, StoreError> {
        reissue_call(self, fence, call, None).await
    }

    async fn issue_approved(
        &self,
        fence: Fence<'_>,
        call: &CallId,
        key: Option<EditedKey>,
    ) -> Result<CallRecord, StoreError> {
        reissue_call(self, fence, call, Some(key)).await
    }

    async fn finish_call(
        &self,
        fence: Fence<'_>,
        call: &CallId,
        finish: FinishCall,
        checkpoint: Option<(i64, NewCheckpoint)>,
    ) -> Result<Option<CheckpointMeta>, StoreError> {
        finish_call(self, fence, call, finish, checkpoint).await
    }

    async fn call(&self, id: &CallId) -> Result<CallRecord, StoreError> {
        call(self, id).await
    }

    async fn calls(
        &self,
        session: &SessionId,
        step: Option<i64>,
    ) -> Result<Vec<CallRecord>, StoreError> {
        calls(self, session, step).await
    }

    async fn calls_page(
        &self,
        session: &SessionId,
        after: i64,
        limit: i64,
    ) -> Result<Vec<CallRecord>, StoreError> {
        calls_page(self, session, after, limit).await
    }

    async fn issued_calls(&self, session: &SessionId) -> Result<Vec<CallRecord>, StoreError> {
        issued_calls(self, session).await
    }

    async fn in_doubt(&self, session: Option<&SessionId>) -> Result<Vec<CallRecord>, StoreError> {
        in_doubt(self, session).await
    }
}
