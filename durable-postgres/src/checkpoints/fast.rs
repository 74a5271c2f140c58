//! A checkpoint in one statement, without a transaction of its own: two round trips (a
//! read, then the write) where the locking transaction takes four. As the journal's
//! one-statement writes (`journal::fast`): the read takes no lock; the write locks the
//! session row and writes only if the session is as read (the same fencing token and the
//! same head, so the same latest checkpoint: the version, the transcript's end and the
//! seals computed from the read still hold). Anything else writes nothing, and the
//! locking transaction runs and decides what to report.

use durable_core::StoreError;
use durable_core::store::{CheckpointMeta, FORMAT_VERSION, Fence, NewCheckpoint};

use super::{insert_messages, seal_checkpoint};
use crate::PostgresStore;
use crate::error::db;
use crate::rows::{self, get};
use crate::seal;
use crate::tx;

/// The read of [`save`]: `$1` the session.
pub(crate) const SAVE_READ: &str = concat!(
    "SELECT ",
    tx::locked_cols!(),
    tx::tail_cols!(),
    " FROM durable_sessions s WHERE s.id = $1"
);

/// Writes checkpoint `expected + 1` in one statement. `Ok(None)`: not written, take the
/// locking transaction.
pub(super) async fn save(
    store: &PostgresStore,
    fence: Fence<'_>,
    expected: i64,
    checkpoint: &NewCheckpoint,
) -> Result<Option<CheckpointMeta>, StoreError> {
    // The session's `UPDATE` locks its row and finds it as read (or changes nothing); the
    // messages and the checkpoint are inserted only with it.
    const WRITE: &str = concat!(
        "WITH clock AS (SELECT ",
        tx::now_ms!(),
        " AS now), \
         locked AS ( \
           UPDATE durable_sessions \
           SET latest_version = $6, recovery_attempts = 0, \
               updated_at = (SELECT now FROM clock), head = $14, wake_at = $18 \
           WHERE id = $1 AND fence = $15 AND latest_version = $16 AND head = $17 \
           RETURNING num), \
         messages AS (",
        insert_messages!(
            "$1",
            "locked.num",
            "$2",
            "$3",
            "clock.now",
            "$4",
            "$5",
            "$6",
            ", locked, clock"
        ),
        ") \
         INSERT INTO durable_checkpoints (session_num, version, last_seq, message_count, \
           plan, budget, state, app_version, format, created_at, seal) \
         SELECT locked.num, $6, $7, $8, ",
        rows::stored_snapshot!("plan", "$9", "locked.num", "$6"),
        ", ",
        rows::stored_snapshot!("budget", "$10", "locked.num", "$6"),
        ", ",
        rows::stored_snapshot!("state", "$11", "locked.num", "$6"),
        ", $12, $3, clock.now, $13 FROM locked, clock \
         RETURNING created_at"
    );
    let ring = store.keyring();
    let row = tx::read(&store.pool, || {
        sqlx::query(SAVE_READ)
            .bind(fence.session.as_str())
            .fetch_optional(&store.pool)
    })
    .await?;
    let Some(row) = row else {
        return Ok(None);
    };
    let head = seal::head_from_row(&row, fence.session)?;
    if get::<i64>(&row, "session_fence")? != fence.token
        || head.latest_version != expected
        || head.check(ring).is_err()
    {
        return Ok(None);
    }
    let Some(mut tail) = tx::read_tail(&row, &head)? else {
        return Ok(None);
    };
    let app_version: String = get(&row, "app_version")?;
    let sealed = seal_checkpoint(ring, fence.session, &app_version, &mut tail, checkpoint)?;
    let mut next = head.clone();
    next.latest_version = sealed.version;
    next.checkpoint_seal.clone_from(&tail.checkpoint_seal);
    next.seal(ring)?;
    let created: Option<i64> = sqlx::query_scalar(WRITE)
        .bind(fence.session.as_str())
        .bind(sealed.first_seq)
        .bind(FORMAT_VERSION)
        .bind(&sealed.texts)
        .bind(&sealed.seals)
        .bind(sealed.version)
        .bind(sealed.row.last_seq)
        .bind(sealed.row.message_count)
        .bind(&sealed.row.plan)
        .bind(&sealed.row.budget)
        .bind(&sealed.row.state)
        .bind(&app_version)
        .bind(&sealed.row.seal)
        .bind(next.head.as_deref())
        .bind(fence.token)
        .bind(expected)
        .bind(head.head.as_deref())
        .bind(checkpoint.wake_at)
        .fetch_optional(&store.pool)
        .await
        .map_err(db)?;
    Ok(created.map(|created_at| CheckpointMeta {
        session: fence.session.clone(),
        version: sealed.version,
        last_seq: sealed.row.last_seq,
        message_count: sealed.row.message_count,
        app_version,
        created_at,
    }))
}
