//! The call journal: insert-or-get of rows, outcomes, re-issues and the in-doubt
//! listing. Operator resolutions are in [`crate::resolution`].

use durable_core::integrity::Keyring;
use durable_core::store::{
    CallOutcome, CallRecord, CallStatus, CheckpointMeta, FORMAT_VERSION, Fence, FinishCall,
    IssueOutcome, NewCall, NewCheckpoint,
};
use durable_core::{CallId, SessionId, StoreError};
use sqlx::SqliteConnection;
use sqlx::sqlite::SqliteRow;

use crate::SqliteStore;
use crate::checkpoints::{self, LatestCheckpoint, Statements};
use crate::error::db;
use crate::rows;
use crate::rows::{call_cols, json, opt_json};
use crate::seal::{self, RawCall, checked_call_record, raw_call_cols};
use crate::tx::{WriteTx, fenced_select, now_sql};

pub(crate) async fn issue_call(
    store: &SqliteStore,
    fence: Fence<'_>,
    call: NewCall,
) -> Result<IssueOutcome, StoreError> {
    insert_call(store, fence, call, None).await
}

pub(crate) async fn record_call(
    store: &SqliteStore,
    fence: Fence<'_>,
    call: NewCall,
    finish: FinishCall,
) -> Result<IssueOutcome, StoreError> {
    insert_call(store, fence, call, Some(finish)).await
}

/// The extra columns and join of a fenced write that changes journal row `c` (bound
/// first): its sealed columns, `NULL` when there is no such row.
macro_rules! fenced_call_select {
    () => {
        fenced_select!(
            concat!(", ", raw_call_cols!()),
            " LEFT JOIN durable_tool_calls c ON c.id = ?"
        )
    };
}

/// The journal row selected with [`fenced_call_select!`], for a state change: checks its
/// seal and that it belongs to the fenced session.
fn fenced_call(
    row: &SqliteRow,
    ring: &Keyring,
    fence: Fence<'_>,
    call: &CallId,
) -> Result<RawCall, StoreError> {
    let found: Option<String> = rows::col(row, "id", fence.session, None)?;
    if found.is_none() {
        return Err(StoreError::CallNotFound(call.clone()));
    }
    let raw = RawCall::from_row(row)?;
    raw.check(ring)?;
    if raw.session != fence.session.as_str() {
        return Err(StoreError::LeaseLost {
            session: SessionId::new(raw.session),
            token: fence.token,
        });
    }
    Ok(raw)
}

pub(crate) async fn reissue_call(
    store: &SqliteStore,
    fence: Fence<'_>,
    call: &CallId,
) -> Result<CallRecord, StoreError> {
    let ring = store.keyring();
    let (mut tx, _, row) =
        WriteTx::begin_fenced(store.writer(), ring, fence, fenced_call_select!(), |q| {
            q.bind(call.as_str())
        })
        .await?;
    let result = async {
        let mut raw = fenced_call(&row, ring, fence, call)?;
        if !matches!(
            CallStatus::parse(&raw.status),
            Some(CallStatus::Issued | CallStatus::NotHappened)
        ) {
            return Err(StoreError::CallNotInDoubt {
                call: call.clone(),
                status: raw.status,
            });
        }
        raw.attempt += 1;
        raw.status = CallStatus::Issued.as_str().to_owned();
        raw.result = None;
        raw.error = None;
        raw.spend = None;
        raw.seal(ring)?;
        let conn = tx.conn();
        sqlx::query(
            "UPDATE durable_tool_calls SET attempt = ?, status = 'issued', \
             fence = ?, finished_at = NULL, result = NULL, error = NULL, spend = NULL, \
             mac = ? WHERE id = ?",
        )
        .bind(raw.attempt)
        .bind(fence.token)
        .bind(raw.mac.as_deref())
        .bind(call.as_str())
        .execute(&mut *conn)
        .await
        .map_err(db)?;
        load_call(conn, ring, call).await
    }
    .await;
    tx.finish(result).await
}

/// Records an issued call's outcome (and, atomically, a checkpoint). Two round trips:
/// `BEGIN IMMEDIATE` with one `SELECT` (clock, fence, head, the row's sealed columns and,
/// with a checkpoint, the latest checkpoint's tail), then the `UPDATE`, the checkpoint's
/// statements and `COMMIT`.
pub(crate) async fn finish_call(
    store: &SqliteStore,
    fence: Fence<'_>,
    call: &CallId,
    finish: FinishCall,
    checkpoint: Option<(i64, NewCheckpoint)>,
) -> Result<Option<CheckpointMeta>, StoreError> {
    let ring = store.keyring();
    let (status, result, error) = outcome_columns(&finish.outcome)?;
    let spend = opt_json(finish.spend.as_ref())?;
    let sql = match checkpoint {
        None => fenced_call_select!(),
        Some(_) => checkpoints::latest_checkpoint_select!(
            concat!(", ", raw_call_cols!()),
            " LEFT JOIN durable_tool_calls c ON c.id = ?"
        ),
    };
    let (tx, mut fenced, row) =
        WriteTx::begin_fenced(store.writer(), ring, fence, sql, |q| q.bind(call.as_str())).await?;
    let now = tx.now;
    let mut out = Statements::new();
    let written = fenced_call(&row, ring, fence, call).and_then(|mut raw| {
        if raw.status != CallStatus::Issued.as_str() {
            return Err(StoreError::CallNotInDoubt {
                call: call.clone(),
                status: raw.status,
            });
        }
        raw.status = status.as_str().to_owned();
        raw.result = result;
        raw.error = error;
        raw.spend = spend;
        raw.seal(ring)?;
        out.push(
            "UPDATE durable_tool_calls SET status = ?, result = ?, error = ?, spend = ?, \
             mac = ?, finished_at = ? WHERE id = ?",
        )
        .bind(raw.status)?
        .bind(raw.result)?
        .bind(raw.error)?
        .bind(raw.spend)?
        .bind(raw.mac)?
        .bind(now)?
        .bind(call.as_str().to_owned())?;
        match &checkpoint {
            None => Ok(None),
            Some((expected, cp)) => {
                let latest = LatestCheckpoint::from_row(&row, fence.session)?;
                checkpoints::append_checkpoint(
                    &mut out,
                    ring,
                    now,
                    fence.session,
                    &mut fenced,
                    &latest,
                    *expected,
                    cp,
                )
                .map(Some)
            }
        }
    });
    match written {
        Ok(meta) => {
            out.push("COMMIT");
            tx.commit_with(out.query()).await?;
            Ok(meta)
        }
        Err(e) => tx.finish(Err(e)).await,
    }
}

pub(crate) async fn call(store: &SqliteStore, id: &CallId) -> Result<CallRecord, StoreError> {
    let mut conn = store.reader().acquire().await.map_err(db)?;
    load_call(&mut conn, store.keyring(), id).await
}

pub(crate) async fn calls(
    store: &SqliteStore,
    session: &SessionId,
    step: Option<i64>,
) -> Result<Vec<CallRecord>, StoreError> {
    match step {
        Some(step) => step_calls(store, session, step).await,
        None => all_calls(store, session).await,
    }
}

/// Every row of the session, with the whole journal's completeness checked.
async fn all_calls(
    store: &SqliteStore,
    session: &SessionId,
) -> Result<Vec<CallRecord>, StoreError> {
    let ring = store.keyring();
    // One snapshot: the head, the completeness count and the rows agree.
    let mut rtx = store.reader().begin().await.map_err(db)?;
    let head = seal::checked_head(&mut rtx, ring, session).await?;
    seal::check_journal_complete(&mut rtx, &head).await?;
    let found = sqlx::query(concat!(
        "SELECT ",
        call_cols!(),
        " FROM durable_tool_calls c WHERE c.session_id = ? ORDER BY c.seq"
    ))
    .bind(session.as_str())
    .fetch_all(&mut *rtx)
    .await
    .map_err(db)?;
    rtx.commit().await.map_err(db)?;
    found
        .iter()
        .map(|row| checked_call_record(ring, row))
        .collect()
}

/// One step's rows, in one statement (one snapshot, one round trip): the session row
/// with its head and [`seal::step_check_cols!`], joined to the step's rows (`NULL`
/// columns when it has none). `+c.seq`: the rows are found by the identity index, which
/// leads with (session_id, step), and sorted; ordering by the position index would walk
/// the whole session.
async fn step_calls(
    store: &SqliteStore,
    session: &SessionId,
    step: i64,
) -> Result<Vec<CallRecord>, StoreError> {
    let ring = store.keyring();
    let found = sqlx::query(concat!(
        "SELECT ",
        seal::head_cols!(),
        seal::step_check_cols!(),
        ", ",
        call_cols!(),
        " FROM durable_sessions s LEFT JOIN durable_tool_calls c \
         ON c.session_id = s.id AND c.step = ?2 WHERE s.id = ?1 ORDER BY +c.seq"
    ))
    .bind(session.as_str())
    .bind(step)
    .fetch_all(store.reader())
    .await
    .map_err(db)?;
    let first = found
        .first()
        .ok_or_else(|| StoreError::SessionNotFound(session.clone()))?;
    let head = seal::head_from_row(first, session)?;
    head.check(ring)?;
    let mut rows = Vec::with_capacity(found.len());
    let mut seqs = Vec::with_capacity(found.len());
    for row in &found {
        let seq: Option<i64> = rows::col(row, "seq", session, None)?;
        if let Some(seq) = seq {
            seqs.push(seq);
            rows.push(row);
        }
    }
    seal::StepCheck::from_row(first, session)?.check(&head, step, &seqs)?;
    rows.into_iter()
        .map(|row| checked_call_record(ring, row))
        .collect()
}

/// The session's `issued` rows, from the partial index of issued rows: the head and the
/// journal's completeness (counted from the position index alone) are checked in the
/// same snapshot, so a deleted issued row is [`StoreError::Tampered`].
pub(crate) async fn issued_calls(
    store: &SqliteStore,
    session: &SessionId,
) -> Result<Vec<CallRecord>, StoreError> {
    let ring = store.keyring();
    // One statement: the session row with its head and the journal's count, joined to
    // its issued rows by the partial index (`NULL` columns when there are none).
    let found = sqlx::query(concat!(
        "SELECT ",
        seal::head_cols!(),
        seal::journal_count_cols!(),
        ", ",
        call_cols!(),
        " FROM durable_sessions s LEFT JOIN durable_tool_calls c \
         ON c.session_id = s.id AND c.status = 'issued' WHERE s.id = ?1 ORDER BY c.seq"
    ))
    .bind(session.as_str())
    .fetch_all(store.reader())
    .await
    .map_err(db)?;
    let first = found
        .first()
        .ok_or_else(|| StoreError::SessionNotFound(session.clone()))?;
    let head = seal::head_from_row(first, session)?;
    head.check(ring)?;
    seal::JournalCount::from_row(first, session)?.check(&head)?;
    let mut rows = Vec::new();
    for row in &found {
        let id: Option<String> = rows::col(row, "id", session, None)?;
        if id.is_some() {
            rows.push(checked_call_record(ring, row)?);
        }
    }
    Ok(rows)
}

pub(crate) async fn in_doubt(
    store: &SqliteStore,
    session: Option<&SessionId>,
) -> Result<Vec<CallRecord>, StoreError> {
    macro_rules! in_doubt_sql {
        ($filter:literal) => {
            concat!(
                "SELECT ",
                call_cols!(),
                " FROM durable_tool_calls c JOIN durable_sessions s ON s.id = c.session_id \
                 WHERE c.status = 'issued' AND (s.fence <> c.fence OR s.lease_owner IS NULL \
                 OR s.lease_expires_at IS NULL OR s.lease_expires_at <= ",
                now_sql!(),
                ")",
                $filter,
                " ORDER BY s.rowid, c.seq"
            )
        };
    }
    let found = match session {
        Some(id) => sqlx::query(in_doubt_sql!(" AND c.session_id = ?")).bind(id.as_str()),
        None => sqlx::query(in_doubt_sql!("")),
    }
    .fetch_all(store.reader())
    .await
    .map_err(db)?;
    let ring = store.keyring();
    found
        .iter()
        .map(|row| checked_call_record(ring, row))
        .collect()
}

/// The key-check column of a keyed call's first round trip: another call of the same
/// tool that used the key with other arguments.
macro_rules! key_holder_col {
    () => {
        ", (SELECT k.id FROM durable_tool_calls k WHERE k.tool_name = ? \
         AND k.idempotency_key = ? AND k.input_hash <> ? ORDER BY k.issued_at, k.id LIMIT 1) \
         AS key_holder"
    };
}

/// The step of the session's latest journal row (by position, from the index), which a
/// new row's step may not be before.
macro_rules! latest_step_col {
    () => {
        ", (SELECT l.step FROM durable_tool_calls l WHERE l.session_id = s.id \
         AND l.seq = s.journal_rows) AS latest_step"
    };
}

/// `issue_call` (`finish = None`: status `issued`) and `record_call` (the outcome is
/// written with the new row): fence check, idempotency-key check, then insert-or-get on
/// the call identity. A new row is sealed at the next position of the session's journal,
/// and the session head counts it.
///
/// Two round trips to SQLite's worker thread: `BEGIN IMMEDIATE` with one `SELECT` (the
/// clock, the fence, the head and, for a keyed call, the key check), then the `INSERT`,
/// the head's `UPDATE` (only if the row was inserted: `changes() = 1`) and `COMMIT`. The
/// inserted row is returned as written, not read back.
async fn insert_call(
    store: &SqliteStore,
    fence: Fence<'_>,
    call: NewCall,
    finish: Option<FinishCall>,
) -> Result<IssueOutcome, StoreError> {
    let ring = store.keyring();
    let identity = &call.identity;
    if identity.session != *fence.session {
        return Err(StoreError::LeaseLost {
            session: identity.session.clone(),
            token: fence.token,
        });
    }
    // Serialized before the transaction: nothing below can fail on the values.
    let args = json(&call.args)?;
    let (status, result, error, spend) = match &finish {
        None => (CallStatus::Issued, None, None, None),
        Some(finish) => {
            let (status, result, error) = outcome_columns(&finish.outcome)?;
            (status, result, error, opt_json(finish.spend.as_ref())?)
        }
    };
    let (tx, mut fenced, row) = match &call.idempotency_key {
        None => {
            WriteTx::begin_fenced(
                store.writer(),
                ring,
                fence,
                fenced_select!(latest_step_col!(), ""),
                |q| q,
            )
            .await?
        }
        Some(key) => {
            WriteTx::begin_fenced(
                store.writer(),
                ring,
                fence,
                fenced_select!(concat!(latest_step_col!(), key_holder_col!()), ""),
                |q| q.bind(&identity.tool).bind(key).bind(&identity.input_hash),
            )
            .await?
        }
    };
    let latest: Option<i64> = rows::col(&row, "latest_step", fence.session, None)?;
    if let Some(latest) = latest.filter(|&latest| identity.step < latest) {
        return tx
            .finish(Err(StoreError::StepClosed {
                session: identity.session.clone(),
                step: identity.step,
                latest,
            }))
            .await;
    }
    if let Some(key) = &call.idempotency_key {
        let holder: Option<String> = rows::col(&row, "key_holder", fence.session, None)?;
        if let Some(existing) = holder {
            return tx
                .finish(Err(StoreError::IdempotencyConflict {
                    tool: identity.tool.clone(),
                    key: key.clone(),
                    existing: CallId::new(existing),
                }))
                .await;
        }
    }
    let now = tx.now;
    let seq = fenced.head.journal_rows + 1;
    let mut raw = RawCall {
        id: call.id.as_str().to_owned(),
        session: identity.session.as_str().to_owned(),
        kind: call.kind.as_str().to_owned(),
        step: identity.step,
        tool: identity.tool.clone(),
        input_hash: identity.input_hash.clone(),
        ordinal: identity.ordinal,
        class: call.class.as_str().to_owned(),
        status: status.as_str().to_owned(),
        args,
        key: call.idempotency_key.clone(),
        schema_hash: call.schema_hash.clone(),
        result,
        error,
        spend,
        attempt: 1,
        seq,
        mac: None,
    };
    let sealed = raw.seal(ring).and_then(|()| {
        fenced.head.journal_rows = seq;
        fenced.head.reseal(ring)
    });
    if let Err(e) = sealed {
        return tx.finish(Err(e)).await;
    }
    let finished_at = finish.is_some().then_some(now);
    let done = tx
        .commit_with(
            sqlx::query("INSERT INTO durable_tool_calls (id, session_id, kind, step, tool_name, input_hash, \
             ordinal, replay_class, status, args, idempotency_key, schema_hash, result, error, \
             spend, mac, attempt, fence, format, issued_at, finished_at, seq) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 1, ?, ?, ?, ?, ?) \
             ON CONFLICT (session_id, step, tool_name, input_hash, ordinal) DO NOTHING; \
             UPDATE durable_sessions SET journal_rows = ?, head = ? \
             WHERE id = ? AND changes() = 1; \
             COMMIT")
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
                    .bind(raw.result.as_deref())
                    .bind(raw.error.as_deref())
                    .bind(raw.spend.as_deref())
                    .bind(raw.mac.as_deref())
                    .bind(fence.token)
                    .bind(FORMAT_VERSION)
                    .bind(now)
                    .bind(finished_at)
                    .bind(seq)
                    .bind(fenced.head.journal_rows)
            .bind(fenced.head.head.as_deref())
            .bind(fence.session.as_str()),
        )
        .await?;
    // Nothing changed when the identity existed (`DO NOTHING`, then no head update):
    // any other count is the insert and its head update.
    if done.rows_affected() != 0 {
        let (result, error, spend) = match finish {
            None => (None, None, None),
            Some(FinishCall {
                outcome: CallOutcome::Completed(value),
                spend,
            }) => (Some(value), None, spend),
            Some(FinishCall {
                outcome: CallOutcome::Failed(value),
                spend,
            }) => (None, Some(value), spend),
        };
        return Ok(IssueOutcome::Inserted(CallRecord {
            id: call.id,
            kind: call.kind,
            class: call.class,
            status,
            args: call.args,
            idempotency_key: call.idempotency_key,
            schema_hash: call.schema_hash,
            result,
            error,
            spend,
            mac: raw.mac,
            attempt: 1,
            fence: fence.token,
            issued_at: now,
            finished_at,
            identity: call.identity,
        }));
    }
    // The identity was there already: the existing row, as committed.
    let row = sqlx::query(concat!(
        "SELECT ",
        call_cols!(),
        " FROM durable_tool_calls c WHERE c.session_id = ? AND c.step = ? \
         AND c.tool_name = ? AND c.input_hash = ? AND c.ordinal = ?"
    ))
    .bind(identity.session.as_str())
    .bind(identity.step)
    .bind(&identity.tool)
    .bind(&identity.input_hash)
    .bind(identity.ordinal)
    .fetch_one(store.writer())
    .await
    .map_err(db)?;
    Ok(IssueOutcome::Existing(checked_call_record(ring, &row)?))
}

/// Status, `result` and `error` columns of a recorded outcome.
fn outcome_columns(
    outcome: &CallOutcome,
) -> Result<(CallStatus, Option<String>, Option<String>), StoreError> {
    Ok(match outcome {
        CallOutcome::Completed(value) => (CallStatus::Completed, Some(json(value)?), None),
        CallOutcome::Failed(value) => (CallStatus::Failed, None, Some(json(value)?)),
    })
}

/// Reads a full journal row, or [`StoreError::CallNotFound`].
pub(crate) async fn load_call(
    conn: &mut SqliteConnection,
    ring: &Keyring,
    id: &CallId,
) -> Result<CallRecord, StoreError> {
    let row = sqlx::query(concat!(
        "SELECT ",
        call_cols!(),
        " FROM durable_tool_calls c WHERE c.id = ?"
    ))
    .bind(id.as_str())
    .fetch_optional(conn)
    .await
    .map_err(db)?
    .ok_or_else(|| StoreError::CallNotFound(id.clone()))?;
    checked_call_record(ring, &row)
}
