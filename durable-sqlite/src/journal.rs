//! The call journal: insert-or-get of rows, outcomes, re-issues and the in-doubt
//! listing. Operator resolutions are in [`crate::resolution`].

use durable_core::integrity::Keyring;
use durable_core::store::{
    CallOutcome, CallRecord, CallStatus, CheckpointMeta, FORMAT_VERSION, Fence, FinishCall,
    IssueOutcome, NewCall, NewCheckpoint,
};
use durable_core::{CallId, SessionId, StoreError};
use sqlx::SqliteConnection;

use crate::SqliteStore;
use crate::checkpoints;
use crate::error::db;
use crate::rows::{call_cols, json, opt_json};
use crate::seal::{self, RawCall, checked_call_record};
use crate::tx::{self, WriteTx, now_sql};

pub(crate) async fn issue_call(
    store: &SqliteStore,
    fence: Fence<'_>,
    call: NewCall,
) -> Result<IssueOutcome, StoreError> {
    let mut tx = WriteTx::begin(store.writer()).await?;
    let now = tx.now;
    let result = insert_call(tx.conn(), store.keyring(), now, fence, &call, None).await;
    tx.finish(result).await
}

pub(crate) async fn record_call(
    store: &SqliteStore,
    fence: Fence<'_>,
    call: NewCall,
    finish: FinishCall,
) -> Result<IssueOutcome, StoreError> {
    let mut tx = WriteTx::begin(store.writer()).await?;
    let now = tx.now;
    let result = insert_call(tx.conn(), store.keyring(), now, fence, &call, Some(&finish)).await;
    tx.finish(result).await
}

/// Reads a journal row for a state change: checks its seal and that it belongs to the
/// fenced session.
async fn fenced_call(
    conn: &mut SqliteConnection,
    ring: &Keyring,
    fence: Fence<'_>,
    call: &CallId,
) -> Result<RawCall, StoreError> {
    let raw = seal::checked_call(conn, ring, call).await?;
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
    let mut tx = WriteTx::begin(store.writer()).await?;
    let result = async {
        let conn = tx.conn();
        tx::fenced(&mut *conn, ring, fence).await?;
        let mut raw = fenced_call(&mut *conn, ring, fence, call).await?;
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

pub(crate) async fn finish_call(
    store: &SqliteStore,
    fence: Fence<'_>,
    call: &CallId,
    finish: FinishCall,
    checkpoint: Option<(i64, NewCheckpoint)>,
) -> Result<Option<CheckpointMeta>, StoreError> {
    let ring = store.keyring();
    let mut tx = WriteTx::begin(store.writer()).await?;
    let now = tx.now;
    let result = async {
        let conn = tx.conn();
        let mut fenced = tx::fenced(&mut *conn, ring, fence).await?;
        let mut raw = fenced_call(&mut *conn, ring, fence, call).await?;
        if raw.status != CallStatus::Issued.as_str() {
            return Err(StoreError::CallNotInDoubt {
                call: call.clone(),
                status: raw.status,
            });
        }
        let (status, result, error) = outcome_columns(&finish.outcome)?;
        raw.status = status.as_str().to_owned();
        raw.result = result;
        raw.error = error;
        raw.spend = opt_json(finish.spend.as_ref())?;
        raw.seal(ring)?;
        sqlx::query(
            "UPDATE durable_tool_calls SET status = ?, result = ?, error = ?, spend = ?, \
             mac = ?, finished_at = ? WHERE id = ?",
        )
        .bind(&raw.status)
        .bind(raw.result.as_deref())
        .bind(raw.error.as_deref())
        .bind(raw.spend.as_deref())
        .bind(raw.mac.as_deref())
        .bind(now)
        .bind(call.as_str())
        .execute(&mut *conn)
        .await
        .map_err(db)?;
        match &checkpoint {
            Some((expected, cp)) => Ok(Some(
                checkpoints::append_checkpoint(
                    conn,
                    ring,
                    now,
                    fence.session,
                    &mut fenced,
                    *expected,
                    cp,
                )
                .await?,
            )),
            None => Ok(None),
        }
    }
    .await;
    tx.finish(result).await
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
    let ring = store.keyring();
    // One snapshot: the head, the completeness count and the rows agree.
    let mut rtx = store.reader().begin().await.map_err(db)?;
    let head = seal::checked_head(&mut rtx, ring, session).await?;
    seal::check_journal_complete(&mut rtx, &head).await?;
    let found = match step {
        Some(step) => sqlx::query(concat!(
            "SELECT ",
            call_cols!(),
            " FROM durable_tool_calls c WHERE c.session_id = ? AND c.step = ? ORDER BY c.seq"
        ))
        .bind(session.as_str())
        .bind(step),
        None => sqlx::query(concat!(
            "SELECT ",
            call_cols!(),
            " FROM durable_tool_calls c WHERE c.session_id = ? ORDER BY c.seq"
        ))
        .bind(session.as_str()),
    }
    .fetch_all(&mut *rtx)
    .await
    .map_err(db)?;
    rtx.commit().await.map_err(db)?;
    found
        .iter()
        .map(|row| checked_call_record(ring, row))
        .collect()
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

/// `issue_call` (`finish = None`: status `issued`) and `record_call` (the outcome is
/// written with the new row): fence check, idempotency-key check, then insert-or-get on
/// the call identity. A new row is sealed at the next position of the session's journal,
/// and the session head counts it.
async fn insert_call(
    conn: &mut SqliteConnection,
    ring: &Keyring,
    now: i64,
    fence: Fence<'_>,
    call: &NewCall,
    finish: Option<&FinishCall>,
) -> Result<IssueOutcome, StoreError> {
    let mut fenced = tx::fenced(&mut *conn, ring, fence).await?;
    let identity = &call.identity;
    if identity.session != *fence.session {
        return Err(StoreError::LeaseLost {
            session: identity.session.clone(),
            token: fence.token,
        });
    }
    if let Some(key) = &call.idempotency_key {
        let holder: Option<String> = sqlx::query_scalar(
            "SELECT id FROM durable_tool_calls WHERE tool_name = ? \
             AND idempotency_key = ? AND input_hash <> ? ORDER BY issued_at, id LIMIT 1",
        )
        .bind(&identity.tool)
        .bind(key)
        .bind(&identity.input_hash)
        .fetch_optional(&mut *conn)
        .await
        .map_err(db)?;
        if let Some(existing) = holder {
            return Err(StoreError::IdempotencyConflict {
                tool: identity.tool.clone(),
                key: key.clone(),
                existing: CallId::new(existing),
            });
        }
    }
    let (status, result, error, spend, finished_at) = match finish {
        None => (CallStatus::Issued, None, None, None, None),
        Some(finish) => {
            let (status, result, error) = outcome_columns(&finish.outcome)?;
            (
                status,
                result,
                error,
                opt_json(finish.spend.as_ref())?,
                Some(now),
            )
        }
    };
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
        args: json(&call.args)?,
        key: call.idempotency_key.clone(),
        schema_hash: call.schema_hash.clone(),
        result,
        error,
        spend,
        attempt: 1,
        seq,
        mac: None,
    };
    raw.seal(ring)?;
    let inserted = sqlx::query(
        "INSERT INTO durable_tool_calls (id, session_id, kind, step, tool_name, input_hash, \
         ordinal, replay_class, status, args, idempotency_key, schema_hash, result, error, \
         spend, mac, attempt, fence, format, issued_at, finished_at, seq) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 1, ?, ?, ?, ?, ?) \
         ON CONFLICT (session_id, step, tool_name, input_hash, ordinal) DO NOTHING",
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
    .bind(raw.result.as_deref())
    .bind(raw.error.as_deref())
    .bind(raw.spend.as_deref())
    .bind(raw.mac.as_deref())
    .bind(fence.token)
    .bind(FORMAT_VERSION)
    .bind(now)
    .bind(finished_at)
    .bind(seq)
    .execute(&mut *conn)
    .await
    .map_err(db)?;
    if inserted.rows_affected() == 1 {
        fenced.head.journal_rows = seq;
        fenced.head.store(&mut *conn, ring).await?;
        return Ok(IssueOutcome::Inserted(
            load_call(conn, ring, &call.id).await?,
        ));
    }
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
    .fetch_one(conn)
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
