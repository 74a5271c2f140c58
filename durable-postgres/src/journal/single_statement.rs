//! Journal writes in one statement each, without a transaction of their own: two round
//! trips (a read, then the write) where the locking transaction takes four (`BEGIN`, the
//! locking read, the write, `COMMIT`).
//!
//! The read (the fence, the head, the row's neighbourhood) takes no lock. The write is
//! one statement, so one transaction, which locks the session row itself and writes only
//! if the session is still as read: the same fencing token, and for a new row the same
//! head (so the same journal length: the position and both seals computed from the read
//! still hold). The fence check, the position, the head and the seals are decided in that
//! statement, atomically, as in the locking transaction. A write that finds the session
//! changed (another write of the session got in between, the lease moved on, the row is
//! already journaled) writes nothing, and the caller runs the locking transaction, which
//! decides what to report.
//!
//! Calls with an idempotency key always take the locking transaction: their key check
//! needs the key's advisory lock before its snapshot.

use durable_core::StoreError;
use durable_core::ids::CallId;
use durable_core::store::{CallStatus, FORMAT_VERSION, Fence, FinishCall, NewCall};

use super::{Stored, new_row};
use crate::PostgresStore;
use crate::error::db;
use crate::rows::get;
use crate::seal;
use crate::tx;

/// What [`insert`] did.
pub(super) enum Insert {
    /// The row was inserted at `now` (the database clock) with seal `mac`: its record is
    /// what was asked for, as written ([`written`](super::written)), nothing read back.
    /// The parts, not the record: a record, with room for an approval, is twice their
    /// size.
    Written {
        call: NewCall,
        finish: Option<FinishCall>,
        mac: Option<String>,
        now: i64,
    },
    /// Nothing was written: take the locking transaction with these.
    Declined(NewCall, Option<FinishCall>),
}

/// The read of [`insert`]: `$1` the session. Whether the identity is journaled already is
/// left to the write (its `NOT EXISTS`), which then writes nothing: as a read, its
/// generic plan, made while the tables were small, found the identity by the session
/// alone (`query_plans.rs`).
pub(crate) const INSERT_READ: &str = concat!(
    "SELECT s.fence AS session_fence, s.cancel_requested_at, ",
    seal::head_cols!(),
    ", (SELECT l.step FROM durable_tool_calls l \
        WHERE l.session_id = s.id AND l.seq = s.journal_rows) AS latest_step \
     FROM durable_sessions s WHERE s.id = $1"
);

/// Inserts a new row for `call` (with its outcome, if `finish`) in one statement.
pub(super) async fn insert(
    store: &PostgresStore,
    fence: Fence<'_>,
    call: NewCall,
    finish: Option<FinishCall>,
) -> Result<Insert, StoreError> {
    // The head's `UPDATE` locks the session row and finds it as read (or changes
    // nothing); the row is inserted only with it.
    const WRITE: &str = concat!(
        "WITH head AS ( \
           UPDATE durable_sessions SET journal_rows = $20, head = $21, issued_rows = $24 \
           WHERE id = $2 AND fence = $13 AND journal_rows = $22 AND head = $23 \
             AND ($19 OR cancel_requested_at IS NULL) \
             AND NOT EXISTS (SELECT 1 FROM durable_tool_calls WHERE session_id = $2 \
               AND step = $4 AND tool_name = $5 AND input_hash = $6 AND ordinal = $7) \
           RETURNING id), \
         clock AS (SELECT ",
        tx::now_ms!(),
        " AS now) \
         INSERT INTO durable_tool_calls (id, session_id, kind, step, tool_name, input_hash, \
           ordinal, replay_class, status, args, idempotency_key, schema_hash, attempt, fence, \
           format, issued_at, result, error, spend, mac, finished_at, seq) \
         SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, 1, $13, $14, clock.now, \
                $15, $16, $17, $18, CASE WHEN $19 THEN clock.now END, $20 \
         FROM head, clock RETURNING issued_at"
    );
    if call.idempotency_key.is_some() || &call.identity.session != fence.session {
        return Ok(Insert::Declined(call, finish));
    }
    let ring = store.keyring();
    let identity = &call.identity;
    let row = tx::read(&store.pool, || {
        sqlx::query(INSERT_READ)
            .bind(fence.session.as_str())
            .fetch_optional(&store.pool)
    })
    .await?;
    let Some(row) = row else {
        return Ok(Insert::Declined(call, finish));
    };
    let head = seal::head_from_row(&row, fence.session)?;
    let latest: Option<i64> = get(&row, "latest_step")?;
    let open = match latest {
        Some(latest) => identity.step >= latest,
        None => head.journal_rows == 0,
    };
    // A session asked to stop issues nothing: the locking path says so.
    let stopping = finish.is_none() && get::<Option<i64>>(&row, "cancel_requested_at")?.is_some();
    if get::<i64>(&row, "session_fence")? != fence.token
        || !open
        || stopping
        || head.check(ring).is_err()
    {
        return Ok(Insert::Declined(call, finish));
    }
    let seq = head.journal_rows + 1;
    let mut raw = new_row(&call, finish.as_ref(), seq);
    raw.seal(ring)?;
    let mut next = head.clone();
    next.journal_rows = seq;
    if finish.is_none() {
        next.count_issued(1)?;
    }
    next.seal(ring)?;
    let issued_at: Option<i64> = sqlx::query_scalar(WRITE)
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
        .bind(&raw.result)
        .bind(&raw.error)
        .bind(&raw.spend)
        .bind(&raw.mac)
        .bind(finish.is_some())
        .bind(seq)
        .bind(next.head.as_deref())
        .bind(head.journal_rows)
        .bind(head.head.as_deref())
        .bind(next.issued_rows)
        .fetch_optional(&mut *store.conn().await?)
        .await
        .map_err(db)?;
    Ok(match issued_at {
        Some(now) => Insert::Written {
            call,
            finish,
            mac: raw.mac,
            now,
        },
        None => Insert::Declined(call, finish),
    })
}

/// Records the outcome of issued row `call` in one statement. `Ok(false)`: not written,
/// take the locking transaction.
pub(super) async fn finish(
    store: &PostgresStore,
    fence: Fence<'_>,
    call: &CallId,
    finish: &FinishCall,
) -> Result<bool, StoreError> {
    const READ: &str = concat!(
        "SELECT s.fence AS session_fence, ",
        seal::head_cols!(),
        ", c.id, c.session_id, c.kind, c.step, c.tool_name, c.input_hash, c.ordinal, \
           c.replay_class, c.status, c.args, c.idempotency_key, c.schema_hash, c.result, \
           c.error, c.spend, c.attempt, c.seq, c.approval, c.mac \
         FROM durable_sessions s JOIN durable_tool_calls c ON c.id = $2 WHERE s.id = $1"
    );
    // The session row is locked (as the locking transaction does) before the call row is
    // changed, and only as read: the same fence and head (so the same count of issued
    // rows). The call row changes only as read (still issued, under the seal that was
    // checked), and the head, one issued row fewer, only with it. The status `issued` is
    // bound (`$14`), not written out: a literal lets the generic plan, made while the
    // tables are small, find the row in the partial index of issued rows, every session's,
    // instead of by its id.
    const WRITE: &str = concat!(
        "WITH lease AS ( \
           SELECT id FROM durable_sessions WHERE id = $7 AND fence = $8 AND head = $11 \
           FOR NO KEY UPDATE), \
         call AS ( \
           UPDATE durable_tool_calls SET status = $2, result = $3, error = $4, spend = $5, \
             mac = $6, finished_at = ",
        tx::now_ms!(),
        ", format = $9 \
           WHERE id = $1 AND status = $14 AND mac = $10 \
             AND EXISTS (SELECT 1 FROM lease) RETURNING id) \
         UPDATE durable_sessions SET issued_rows = $12, head = $13 \
         WHERE id = $7 AND EXISTS (SELECT 1 FROM call)"
    );
    let ring = store.keyring();
    let row = tx::read(&store.pool, || {
        sqlx::query(READ)
            .bind(fence.session.as_str())
            .bind(call.as_str())
            .fetch_optional(&store.pool)
    })
    .await?;
    let Some(row) = row else {
        return Ok(false);
    };
    let head = seal::head_from_row(&row, fence.session)?;
    let mut raw = seal::raw_call(&row)?;
    if get::<i64>(&row, "session_fence")? != fence.token
        || raw.session != fence.session.as_str()
        || raw.status != CallStatus::Issued.as_str()
        || head.check(ring).is_err()
        || raw.check(ring).is_err()
    {
        return Ok(false);
    }
    let (Some(sealed), Some(read_head)) = (raw.mac.clone(), head.head.clone()) else {
        return Ok(false);
    };
    let mut next = head.clone();
    next.count_issued(-1)?;
    next.seal(ring)?;
    let stored = Stored::from(Some(finish));
    raw.status = stored.status.as_str().to_owned();
    raw.result = stored.result;
    raw.error = stored.error;
    raw.spend = stored.spend;
    raw.seal(ring)?;
    let done = sqlx::query(WRITE)
        .bind(call.as_str())
        .bind(&raw.status)
        .bind(&raw.result)
        .bind(&raw.error)
        .bind(&raw.spend)
        .bind(&raw.mac)
        .bind(fence.session.as_str())
        .bind(fence.token)
        .bind(FORMAT_VERSION)
        .bind(&sealed)
        .bind(&read_head)
        .bind(next.issued_rows)
        .bind(next.head.as_deref())
        .bind(CallStatus::Issued.as_str())
        .execute(&mut *store.conn().await?)
        .await
        .map_err(db)?;
    Ok(done.rows_affected() == 1)
}
