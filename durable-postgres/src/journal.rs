//! The call journal: tool/model call rows (sealed, see [`crate::seal`]): insert-or-get
//! of rows, outcomes, re-issues and the in-doubt listing. Operator resolutions are in
//! [`crate::resolution`].

use durable_core::StoreError;
use durable_core::ids::{CallId, SessionId};
use durable_core::integrity::Keyring;
use durable_core::store::{
    CallOutcome, CallRecord, CallStatus, CheckpointMeta, FORMAT_VERSION, Fence, FinishCall,
    IssueOutcome, NewCall, NewCheckpoint,
};
use sqlx::postgres::PgConnection;

use crate::PostgresStore;
use crate::checkpoints;
use crate::error::db;
use crate::rows::{call_cols, get};
use crate::seal::{self, RawCall, checked_call_record, raw_call_cols};
use crate::tx::{self, Lock};

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
    let ring = store.keyring();
    let mut tx = store.pool.begin().await.map_err(db)?;
    let mut locked = tx::lock_fenced(&mut tx, ring, fence, Lock::Update).await?;
    // A lease on one session cannot write into another's journal.
    if &call.identity.session != fence.session {
        return Err(StoreError::LeaseLost {
            session: call.identity.session.clone(),
            token: fence.token,
        });
    }
    let now = locked.now;
    let tool = &call.identity.tool;
    let outcome = Stored::from(finish.as_ref());
    if let Some(key) = &call.idempotency_key {
        // Serialize every use of this (tool, key) until commit, so two concurrent
        // uses with different arguments cannot both pass the check below.
        sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1 || chr(31) || $2, 0))")
            .bind(tool)
            .bind(key)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        let holder = sqlx::query(
            "SELECT id FROM durable_tool_calls
             WHERE tool_name = $1 AND idempotency_key = $2 AND input_hash <> $3
             ORDER BY issued_at, id LIMIT 1",
        )
        .bind(tool)
        .bind(key)
        .bind(&call.identity.input_hash)
        .fetch_optional(&mut *tx)
        .await
        .map_err(db)?;
        if let Some(row) = holder {
            return Err(StoreError::IdempotencyConflict {
                tool: tool.clone(),
                key: key.clone(),
                existing: CallId::new(get::<String>(&row, "id")?),
            });
        }
    }
    let seq = locked.head.journal_rows + 1;
    let mut raw = RawCall {
        id: call.id.as_str().to_owned(),
        session: call.identity.session.as_str().to_owned(),
        kind: call.kind.as_str().to_owned(),
        step: call.identity.step,
        tool: tool.clone(),
        input_hash: call.identity.input_hash.clone(),
        ordinal: call.identity.ordinal,
        class: call.class.as_str().to_owned(),
        status: outcome.status.as_str().to_owned(),
        args: call.args.to_string(),
        key: call.idempotency_key.clone(),
        schema_hash: call.schema_hash.clone(),
        result: outcome.result,
        error: outcome.error,
        spend: outcome.spend,
        attempt: 1,
        seq,
        mac: None,
    };
    raw.seal(ring)?;
    let inserted = sqlx::query(concat!(
        "INSERT INTO durable_tool_calls (id, session_id, kind, step, tool_name, input_hash, \
         ordinal, replay_class, status, args, idempotency_key, schema_hash, attempt, fence, \
         format, issued_at, result, error, spend, mac, finished_at, seq) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, 1, $13, $14, $15, \
                 $16, $17, $18, $19, $20, $21) \
         ON CONFLICT (session_id, step, tool_name, input_hash, ordinal) DO NOTHING \
         RETURNING ",
        call_cols!()
    ))
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
    .bind(finish.is_some().then_some(now))
    .bind(seq)
    .fetch_optional(&mut *tx)
    .await
    .map_err(db)?;
    let outcome = match inserted {
        Some(row) => {
            locked.head.journal_rows = seq;
            locked.head.store(&mut tx, ring).await?;
            IssueOutcome::Inserted(checked_call_record(ring, &row)?)
        }
        None => {
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
        }
    };
    tx.commit().await.map_err(db)?;
    Ok(outcome)
}

pub(crate) async fn reissue_call(
    store: &PostgresStore,
    fence: Fence<'_>,
    call: &CallId,
) -> Result<CallRecord, StoreError> {
    let ring = store.keyring();
    let mut tx = store.pool.begin().await.map_err(db)?;
    tx::lock_fenced(&mut tx, ring, fence, Lock::Share).await?;
    let (mut raw, _) = lock_call(&mut tx, ring, call, Some(fence)).await?;
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
    let row = sqlx::query(concat!(
        "UPDATE durable_tool_calls SET attempt = $3, status = 'issued', fence = $2, \
         finished_at = NULL, result = NULL, error = NULL, spend = NULL, mac = $4 \
         WHERE id = $1 RETURNING ",
        call_cols!()
    ))
    .bind(call.as_str())
    .bind(fence.token)
    .bind(i32::try_from(raw.attempt).unwrap_or(i32::MAX))
    .bind(&raw.mac)
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
    let ring = store.keyring();
    let mut tx = store.pool.begin().await.map_err(db)?;
    let lock = if checkpoint.is_some() {
        Lock::Update
    } else {
        Lock::Share
    };
    let mut locked = tx::lock_fenced(&mut tx, ring, fence, lock).await?;
    let (mut raw, _) = lock_call(&mut tx, ring, call, Some(fence)).await?;
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
    sqlx::query(
        "UPDATE durable_tool_calls
         SET status = $2, result = $3, error = $4, spend = $5, mac = $6, finished_at = $7,
             format = $8
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

pub(crate) async fn call(store: &PostgresStore, id: &CallId) -> Result<CallRecord, StoreError> {
    let row = sqlx::query(concat!(
        "SELECT ",
        call_cols!(),
        " FROM durable_tool_calls WHERE id = $1"
    ))
    .bind(id.as_str())
    .fetch_optional(&store.pool)
    .await
    .map_err(db)?
    .ok_or_else(|| StoreError::CallNotFound(id.clone()))?;
    checked_call_record(store.keyring(), &row)
}

pub(crate) async fn calls(
    store: &PostgresStore,
    session: &SessionId,
    step: Option<i64>,
) -> Result<Vec<CallRecord>, StoreError> {
    let ring = store.keyring();
    // One snapshot: the head, the completeness count and the rows agree.
    let mut tx = tx::begin_snapshot(&store.pool).await?;
    let head = seal::checked_head(&mut tx, ring, session).await?;
    seal::check_journal_complete(&mut tx, &head).await?;
    let found = sqlx::query(concat!(
        "SELECT ",
        call_cols!(),
        " FROM durable_tool_calls WHERE session_id = $1 AND ($2::bigint IS NULL OR step = $2) \
         ORDER BY seq"
    ))
    .bind(session.as_str())
    .bind(step)
    .fetch_all(&mut *tx)
    .await
    .map_err(db)?;
    tx.commit().await.map_err(db)?;
    found
        .iter()
        .map(|row| checked_call_record(ring, row))
        .collect()
}

pub(crate) async fn in_doubt(
    store: &PostgresStore,
    session: Option<&SessionId>,
) -> Result<Vec<CallRecord>, StoreError> {
    let ring = store.keyring();
    // `c.*`: the columns of `call_cols!`, unambiguous beside the join.
    sqlx::query(concat!(
        "SELECT c.* FROM durable_tool_calls c JOIN durable_sessions s ON s.id = c.session_id \
         WHERE c.status = 'issued' AND ($1::text IS NULL OR c.session_id = $1) \
           AND (s.fence <> c.fence OR s.lease_owner IS NULL OR s.lease_expires_at IS NULL \
                OR s.lease_expires_at <= ",
        tx::now_ms!(),
        ") ORDER BY s.created_at, s.id, c.seq"
    ))
    .bind(session.map(SessionId::as_str))
    .fetch_all(&store.pool)
    .await
    .map_err(db)?
    .iter()
    .map(|row| checked_call_record(ring, row))
    .collect()
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

/// Locks a call row `FOR UPDATE`, checks its seal, and returns its sealed columns and
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
        ", fence FROM durable_tool_calls WHERE id = $1 FOR UPDATE"
    ))
    .bind(call.as_str())
    .fetch_optional(&mut *conn)
    .await
    .map_err(db)?
    .ok_or_else(|| StoreError::CallNotFound(call.clone()))?;
    let raw = RawCall::from_row(&row)?;
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
