//! The call journal: insert-or-get of rows, outcomes, re-issues, the in-doubt listing
//! and operator resolutions (the journal half of the [`CheckpointStore`] impl).
//!
//! [`CheckpointStore`]: durable_core::CheckpointStore

use durable_core::store::{
    CallOutcome, CallRecord, CallStatus, CheckpointMeta, FORMAT_VERSION, Fence, FinishCall,
    IssueOutcome, NewCall, NewCheckpoint, Resolution, ResolutionRecord, ResolveCall,
};
use durable_core::{CallId, SessionId, StoreError};
use sqlx::SqliteConnection;

use crate::SqliteStore;
use crate::error::db;
use crate::ops::{self, json, opt_json};
use crate::rows::{self, call_cols};
use crate::tx::{WriteTx, now_sql};

pub(crate) async fn issue_call(
    store: &SqliteStore,
    fence: Fence<'_>,
    call: NewCall,
) -> Result<IssueOutcome, StoreError> {
    let mut tx = WriteTx::begin(store.writer()).await?;
    let now = tx.now;
    let result = insert_call(tx.conn(), now, fence, &call, None).await;
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
    let result = insert_call(tx.conn(), now, fence, &call, Some(&finish)).await;
    tx.finish(result).await
}

pub(crate) async fn reissue_call(
    store: &SqliteStore,
    fence: Fence<'_>,
    call: &CallId,
) -> Result<CallRecord, StoreError> {
    let mut tx = WriteTx::begin(store.writer()).await?;
    let result = async {
        let conn = tx.conn();
        ops::fenced(&mut *conn, fence).await?;
        let state = ops::call_state(&mut *conn, call).await?;
        if state.session != *fence.session {
            return Err(StoreError::LeaseLost {
                session: state.session,
                token: fence.token,
            });
        }
        if !matches!(state.status, CallStatus::Issued | CallStatus::NotHappened) {
            return Err(StoreError::CallNotInDoubt {
                call: call.clone(),
                status: state.status.as_str().to_owned(),
            });
        }
        sqlx::query(
            "UPDATE durable_tool_calls SET attempt = attempt + 1, status = 'issued', \
             fence = ?, finished_at = NULL, result = NULL, error = NULL, spend = NULL, \
             mac = NULL WHERE id = ?",
        )
        .bind(fence.token)
        .bind(call.as_str())
        .execute(&mut *conn)
        .await
        .map_err(db)?;
        ops::load_call(conn, call).await
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
    let mut tx = WriteTx::begin(store.writer()).await?;
    let now = tx.now;
    let result = async {
        let conn = tx.conn();
        let fenced = ops::fenced(&mut *conn, fence).await?;
        let state = ops::call_state(&mut *conn, call).await?;
        if state.session != *fence.session {
            return Err(StoreError::LeaseLost {
                session: state.session,
                token: fence.token,
            });
        }
        if state.status != CallStatus::Issued {
            return Err(StoreError::CallNotInDoubt {
                call: call.clone(),
                status: state.status.as_str().to_owned(),
            });
        }
        let (status, result, error) = outcome_columns(&finish.outcome)?;
        sqlx::query(
            "UPDATE durable_tool_calls SET status = ?, result = ?, error = ?, spend = ?, \
             mac = ?, finished_at = ? WHERE id = ?",
        )
        .bind(status.as_str())
        .bind(result)
        .bind(error)
        .bind(opt_json(finish.spend.as_ref())?)
        .bind(finish.mac.as_deref())
        .bind(now)
        .bind(call.as_str())
        .execute(&mut *conn)
        .await
        .map_err(db)?;
        match &checkpoint {
            Some((expected, cp)) => Ok(Some(
                ops::save_checkpoint(conn, now, fence.session, &fenced, *expected, cp).await?,
            )),
            None => Ok(None),
        }
    }
    .await;
    tx.finish(result).await
}

pub(crate) async fn call(store: &SqliteStore, id: &CallId) -> Result<CallRecord, StoreError> {
    let mut conn = store.reader().acquire().await.map_err(db)?;
    ops::load_call(&mut conn, id).await
}

pub(crate) async fn calls(
    store: &SqliteStore,
    session: &SessionId,
    step: Option<i64>,
) -> Result<Vec<CallRecord>, StoreError> {
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
    .fetch_all(store.reader())
    .await
    .map_err(db)?;
    found.iter().map(rows::call).collect()
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
    found.iter().map(rows::call).collect()
}

pub(crate) async fn resolve_call(
    store: &SqliteStore,
    resolve: ResolveCall,
) -> Result<CallRecord, StoreError> {
    let mut tx = WriteTx::begin(store.writer()).await?;
    let now = tx.now;
    let result = async {
        let conn = tx.conn();
        let id = &resolve.call;
        let state = ops::call_state(&mut *conn, id).await?;
        if state.status != CallStatus::Issued {
            return Err(StoreError::CallNotInDoubt {
                call: id.clone(),
                status: state.status.as_str().to_owned(),
            });
        }
        let session = ops::load_session(&mut *conn, &state.session).await?;
        let live =
            session.lease_owner.is_some() && session.lease_expires_at.is_some_and(|at| at > now);
        if live && session.fence == state.fence {
            return Err(StoreError::CallNotInDoubt {
                call: id.clone(),
                status: "running".to_owned(),
            });
        }
        let (status, decision, result) = match &resolve.resolution {
            Resolution::Happened { result } => {
                (CallStatus::Resolved, "happened", Some(json(result)?))
            }
            Resolution::DidNotHappen => (CallStatus::NotHappened, "did_not_happen", None),
        };
        sqlx::query(
            "UPDATE durable_tool_calls SET status = ?, result = ?, mac = ?, finished_at = ? \
             WHERE id = ?",
        )
        .bind(status.as_str())
        .bind(result.as_deref())
        .bind(resolve.mac.as_deref())
        .bind(now)
        .bind(id.as_str())
        .execute(&mut *conn)
        .await
        .map_err(db)?;
        sqlx::query(
            "INSERT INTO durable_resolutions (call_id, session_id, decision, result, \
             resolved_by, note, format, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(id.as_str())
        .bind(state.session.as_str())
        .bind(decision)
        .bind(result.as_deref())
        .bind(&resolve.by)
        .bind(resolve.note.as_deref())
        .bind(FORMAT_VERSION)
        .bind(now)
        .execute(&mut *conn)
        .await
        .map_err(db)?;
        ops::load_call(conn, id).await
    }
    .await;
    tx.finish(result).await
}

pub(crate) async fn resolutions(
    store: &SqliteStore,
    session: &SessionId,
) -> Result<Vec<ResolutionRecord>, StoreError> {
    let found = sqlx::query(
        "SELECT call_id, session_id, decision, result, resolved_by, note, format, created_at \
         FROM durable_resolutions WHERE session_id = ? ORDER BY id",
    )
    .bind(session.as_str())
    .fetch_all(store.reader())
    .await
    .map_err(db)?;
    found.iter().map(rows::resolution).collect()
}

/// `issue_call` (`finish = None`: status `issued`) and `record_call` (the outcome is
/// written with the new row): fence check, idempotency-key check, then insert-or-get on
/// the call identity.
async fn insert_call(
    conn: &mut SqliteConnection,
    now: i64,
    fence: Fence<'_>,
    call: &NewCall,
    finish: Option<&FinishCall>,
) -> Result<IssueOutcome, StoreError> {
    ops::fenced(&mut *conn, fence).await?;
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
    let (status, result, error, spend, mac, finished_at) = match finish {
        None => (CallStatus::Issued, None, None, None, None, None),
        Some(finish) => {
            let (status, result, error) = outcome_columns(&finish.outcome)?;
            (
                status,
                result,
                error,
                opt_json(finish.spend.as_ref())?,
                finish.mac.as_deref(),
                Some(now),
            )
        }
    };
    let inserted = sqlx::query(
        "INSERT INTO durable_tool_calls (id, session_id, kind, step, tool_name, input_hash, \
         ordinal, replay_class, status, args, idempotency_key, schema_hash, result, error, \
         spend, mac, attempt, fence, format, issued_at, finished_at, seq) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 1, ?, ?, ?, ?, \
         (SELECT COALESCE(MAX(seq), 0) + 1 FROM durable_tool_calls WHERE session_id = ?)) \
         ON CONFLICT (session_id, step, tool_name, input_hash, ordinal) DO NOTHING",
    )
    .bind(call.id.as_str())
    .bind(identity.session.as_str())
    .bind(call.kind.as_str())
    .bind(identity.step)
    .bind(&identity.tool)
    .bind(&identity.input_hash)
    .bind(identity.ordinal)
    .bind(call.class.as_str())
    .bind(status.as_str())
    .bind(json(&call.args)?)
    .bind(call.idempotency_key.as_deref())
    .bind(&call.schema_hash)
    .bind(result)
    .bind(error)
    .bind(spend)
    .bind(mac)
    .bind(fence.token)
    .bind(FORMAT_VERSION)
    .bind(now)
    .bind(finished_at)
    .bind(identity.session.as_str())
    .execute(&mut *conn)
    .await
    .map_err(db)?;
    if inserted.rows_affected() == 1 {
        return Ok(IssueOutcome::Inserted(
            ops::load_call(conn, &call.id).await?,
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
    Ok(IssueOutcome::Existing(rows::call(&row)?))
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
