//! A checkpoint in one statement, without a transaction of its own: two round trips (a
//! read, then the write) where the locking transaction takes four. As the journal's
//! one-statement writes (`journal::single_statement`): the read takes no lock; the write locks the
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

/// The write of [`save`], for any number of messages: `$1` the session, `$2` the first
/// message's position, `$3` the format, `$4` and `$5` the messages' texts and seals (arrays),
/// `$6` the new version, and so on. The session's `UPDATE` locks its row and finds it as
/// read (or changes nothing); the messages and the checkpoint are inserted only with it.
///
/// PostgreSQL estimates `unnest` of a parameter at 100 rows in a generic plan and of the
/// value at its length in a custom one, so `plan_cache_mode = auto` judged this
/// statement's generic plan dearer and planned it afresh on every checkpoint. The store
/// sends [`save_write`]'s form instead, whose messages are a `VALUES` list of as many rows
/// as there are messages: its generic plan is the custom one, and is kept.
pub(crate) const SAVE_WRITE: &str = concat!(
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

/// Where [`SAVE_WRITE`] reads its messages.
const UNNEST_MESSAGES: &str =
    "unnest($4::text[], $5::text[]) WITH ORDINALITY AS t(message, seal, ord)";

/// Checkpoints of up to this many messages have a statement of their own (see
/// [`save_write`]); longer ones take [`SAVE_WRITE`], planned for its parameters.
const FIXED_MESSAGES: usize = 16;

/// [`SAVE_WRITE`] for a checkpoint of `messages` messages: the messages as a `VALUES` list
/// of that many rows (`($4[i], $5[i], i)`), so that the generic plan is estimated as the
/// custom one and PostgreSQL keeps it. One prepared statement per length used, up to
/// [`FIXED_MESSAGES`]; longer checkpoints (rare: a turn pushes a few messages) take
/// [`SAVE_WRITE`] itself.
pub(crate) fn save_write(messages: usize) -> &'static str {
    static WRITES: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    let writes = WRITES.get_or_init(|| {
        (0..=FIXED_MESSAGES)
            .map(|n| {
                let rows = if n == 0 {
                    "(SELECT ''::text, ''::text, 0::bigint WHERE false) AS t(message, seal, ord)"
                        .to_owned()
                } else {
                    let values: Vec<String> = (1..=n)
                        .map(|i| format!("(($4::text[])[{i}], ($5::text[])[{i}], {i}::bigint)"))
                        .collect();
                    format!("(VALUES {}) AS t(message, seal, ord)", values.join(", "))
                };
                SAVE_WRITE.replacen(UNNEST_MESSAGES, &rows, 1)
            })
            .collect()
    });
    writes.get(messages).map_or(SAVE_WRITE, String::as_str)
}

/// Writes checkpoint `expected + 1` in one statement. `Ok(None)`: not written, take the
/// locking transaction.
pub(super) async fn save(
    store: &PostgresStore,
    fence: Fence<'_>,
    expected: i64,
    checkpoint: &NewCheckpoint,
) -> Result<Option<CheckpointMeta>, StoreError> {
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
    let created: Option<i64> = sqlx::query_scalar(save_write(sealed.texts.len()))
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
        .fetch_optional(&mut *store.conn().await?)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_length_reads_its_messages_from_a_values_list() {
        assert!(SAVE_WRITE.contains(UNNEST_MESSAGES));
        for n in 0..=FIXED_MESSAGES {
            let sql = save_write(n);
            assert!(!sql.contains("unnest("), "{n}: {sql}");
            assert_eq!(sql.matches("($4::text[])[").count(), n, "{sql}");
        }
        assert_eq!(save_write(FIXED_MESSAGES + 1), SAVE_WRITE);
    }
}
