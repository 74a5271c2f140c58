//! Reads of checkpoints: a checkpoint with its whole transcript or only its last
//! messages (a bounded resume), and a checked range of the transcript on demand. One
//! statement each, so one snapshot: the head, the checkpoint with the previous version's
//! seal (which its own chains to), the stored seal of the message before the first one
//! read (which starts the chain) and the messages, as arrays in the one row, read by
//! primary key from their first position: nothing read grows with the transcript.
//! Message text is read through the view `durable_transcript` (schema 6), which reads a
//! model reply stored once from its journal row.

use durable_core::StoreError;
use durable_core::ids::SessionId;
use durable_core::store::{Checkpoint, StoredMessage, check_message_range};
use sqlx::postgres::PgRow;

use crate::PostgresStore;
use crate::error::corrupt;
use crate::rows::{self, get};
use crate::seal::{self, RawCheckpoint};
use crate::tx;

/// The read of [`load_checkpoint_window`]: `$1` the session, `$2` the version (`NULL`:
/// the latest), `$3` the window (`NULL`: the whole transcript). Sent unprepared: a
/// generic plan made while the tables were small read a long session's transcript by its
/// session alone, so it is planned for its parameters every time.
///
/// The checkpoint, the previous one and the anchor are each a `LATERAL … LIMIT 1`, so
/// they are looked up by their whole primary key. As plain joins, a session newer than
/// the tables' statistics (estimated at one row) got a plan that found them by
/// the session alone and matched the version in a join filter: every checkpoint of the
/// session against every other, 270 ms at 1,000 turns (seen with `auto_explain`).
pub(crate) const WINDOW_READ: &str = concat!(
    "WITH h AS (SELECT s.num, ",
    seal::head_cols!(),
    " FROM durable_sessions s WHERE s.id = $1) \
     SELECT h.*, c.version IS NOT NULL AS found, \
            c.version, c.last_seq, c.message_count, c.app_version, \
            c.created_at, ",
    rows::snapshot!("c", "plan"),
    " AS plan, ",
    rows::snapshot!("c", "budget"),
    " AS budget, ",
    rows::snapshot!("c", "state"),
    " AS state, c.format AS cp_format, c.seal, \
            p.seal AS previous_seal, p.version IS NOT NULL AS previous_found, \
            w.from_seq, a.seal AS anchor, a.seq IS NOT NULL AS anchor_found, \
            m.seqs, m.messages, m.formats, m.seals \
     FROM h \
     LEFT JOIN LATERAL (SELECT * FROM durable_checkpoints \
       WHERE session_num = h.num AND version = COALESCE($2, h.latest_version) LIMIT 1) c \
       ON true \
     LEFT JOIN LATERAL (SELECT seal, version FROM durable_checkpoints \
       WHERE session_num = h.num AND version = c.version - 1 LIMIT 1) p ON true \
     LEFT JOIN LATERAL ( \
       SELECT GREATEST(c.last_seq - COALESCE($3::bigint, c.last_seq), 0) + 1 AS from_seq) w \
       ON true \
     LEFT JOIN LATERAL (SELECT seal, seq FROM durable_messages \
       WHERE session_num = h.num AND seq = w.from_seq - 1 LIMIT 1) a ON true \
     LEFT JOIN LATERAL ( \
       SELECT array_agg(seq ORDER BY seq) AS seqs, \
              array_agg(message ORDER BY seq) AS messages, \
              array_agg(format ORDER BY seq) AS formats, \
              array_agg(seal ORDER BY seq) AS seals \
       FROM durable_transcript \
       WHERE session_num = h.num AND seq >= w.from_seq AND seq <= c.last_seq) m ON true"
);

/// The read of [`messages`]: `$1` the session, `$2..=$3` the range, read only when it is
/// inside the latest checkpoint's transcript. Sent unprepared, as [`WINDOW_READ`].
pub(crate) const RANGE_READ: &str = concat!(
    "WITH h AS (SELECT s.num, ",
    seal::head_cols!(),
    " FROM durable_sessions s WHERE s.id = $1) \
     SELECT h.*, c.last_seq, a.seal AS anchor, a.seq IS NOT NULL AS anchor_found, \
            m.seqs, m.messages, m.formats, m.seals \
     FROM h \
     LEFT JOIN LATERAL (SELECT last_seq FROM durable_checkpoints \
       WHERE session_num = h.num AND version = h.latest_version LIMIT 1) c ON true \
     LEFT JOIN LATERAL (SELECT seal, seq FROM durable_messages \
       WHERE session_num = h.num AND seq = $2::bigint - 1 LIMIT 1) a ON true \
     LEFT JOIN LATERAL ( \
       SELECT array_agg(seq ORDER BY seq) AS seqs, \
              array_agg(message ORDER BY seq) AS messages, \
              array_agg(format ORDER BY seq) AS formats, \
              array_agg(seal ORDER BY seq) AS seals \
       FROM durable_transcript \
       WHERE session_num = h.num AND seq >= $2::bigint AND seq <= $3::bigint \
         AND $2::bigint >= 1 AND $3::bigint <= c.last_seq) m ON true"
);

/// Loads checkpoint `version` (`None`: the latest) with its whole transcript.
pub(crate) async fn load_checkpoint(
    store: &PostgresStore,
    id: &SessionId,
    version: Option<i64>,
) -> Result<Checkpoint, StoreError> {
    load_checkpoint_window(store, id, version, None).await
}

/// [`load_checkpoint`] with only the transcript's last `window` messages (`None`: all),
/// read by their primary key from the window's first position, the chain started from
/// the stored seal of the message before it: one statement, whatever the transcript's
/// length.
pub(crate) async fn load_checkpoint_window(
    store: &PostgresStore,
    id: &SessionId,
    version: Option<i64>,
    window: Option<usize>,
) -> Result<Checkpoint, StoreError> {
    let ring = store.keyring();
    let window = window.map(|w| i64::try_from(w).unwrap_or(i64::MAX));
    let row = tx::read(&store.pool, || {
        sqlx::query(WINDOW_READ)
            // Its best plan depends on the session's size: unprepared, planned for its
            // parameters on every execution (see the crate's docs, `# Plans`).
            .persistent(false)
            .bind(id.as_str())
            .bind(version)
            .bind(window)
            .fetch_optional(&store.pool)
    })
    .await?
    .ok_or_else(|| StoreError::SessionNotFound(id.clone()))?;
    let head = seal::head_from_row(&row, id)?;
    head.check(ring)?;
    let v = version.unwrap_or(head.latest_version);
    if !get::<bool>(&row, "found")? {
        return Err(StoreError::VersionNotFound {
            session: id.clone(),
            version: v,
        });
    }
    let meta = rows::checkpoint_meta(id, &row)?;
    let format: i32 = get(&row, "cp_format")?;
    rows::check_format(id, Some(v), "the checkpoint", format)?;
    let previous = if v > 0 {
        if !get::<bool>(&row, "previous_found")? {
            return Err(StoreError::Tampered {
                session: id.clone(),
                what: format!("checkpoint {}", v - 1),
                detail: "it is missing".to_owned(),
            });
        }
        get::<Option<String>>(&row, "previous_seal")?.unwrap_or_default()
    } else {
        String::new()
    };
    let checkpoint_seal: Option<String> = get(&row, "seal")?;
    let texts: [String; 3] = [
        rows::snapshot_text(id, v, "the plan", get(&row, "plan")?)?,
        rows::snapshot_text(id, v, "the budget", get(&row, "budget")?)?,
        rows::snapshot_text(id, v, "the state", get(&row, "state")?)?,
    ];
    let plan = rows::json(id, Some(v), "the plan", &texts[0])?;
    let budget = rows::json(id, Some(v), "the budget", &texts[1])?;
    let state = rows::json(id, Some(v), "the state", &texts[2])?;
    let from: i64 = get(&row, "from_seq")?;
    let (messages, chain) = checked_messages(store, &row, id, Some(v), from)?;
    let logged_len = messages.len();
    if i64::try_from(logged_len).ok() != Some(meta.last_seq - from + 1) {
        return Err(StoreError::Tampered {
            session: id.clone(),
            what: format!("the transcript of checkpoint {v}"),
            detail: format!(
                "it ends at message {} but the log holds {logged_len} from message {from}",
                meta.last_seq
            ),
        });
    }
    RawCheckpoint {
        session: id,
        version: v,
        last_seq: meta.last_seq,
        message_count: meta.message_count,
        last_message_seal: &chain,
        plan: &texts[0],
        budget: &texts[1],
        state: &texts[2],
        app_version: &meta.app_version,
        previous: &previous,
    }
    .check(ring, checkpoint_seal.as_deref())?;
    if i64::try_from(logged_len).ok() != Some(meta.message_count - (from - 1)) {
        return Err(corrupt(
            id,
            Some(v),
            format!(
                "the log holds {logged_len} messages from seq {from} to seq {} but the \
                 checkpoint records {} in all; messages were deleted behind durable's back",
                meta.last_seq, meta.message_count
            ),
        ));
    }
    Ok(Checkpoint {
        meta,
        messages,
        plan,
        budget,
        state,
    })
}

/// Messages `from..=to` of the latest checkpoint's transcript, in one statement: the
/// head, the latest checkpoint's end, the seal of the message before the range and the
/// range by primary key, checked by the chain from that seal.
pub(crate) async fn messages(
    store: &PostgresStore,
    id: &SessionId,
    from: i64,
    to: i64,
) -> Result<Vec<StoredMessage>, StoreError> {
    let ring = store.keyring();
    let row = tx::read(&store.pool, || {
        sqlx::query(RANGE_READ)
            // Its best plan depends on the session's size: unprepared, planned for its
            // parameters on every execution (see the crate's docs, `# Plans`).
            .persistent(false)
            .bind(id.as_str())
            .bind(from)
            .bind(to)
            .fetch_optional(&store.pool)
    })
    .await?
    .ok_or_else(|| StoreError::SessionNotFound(id.clone()))?;
    let head = seal::head_from_row(&row, id)?;
    head.check(ring)?;
    let last_seq: Option<i64> = get(&row, "last_seq")?;
    let last_seq = last_seq.ok_or_else(|| StoreError::Tampered {
        session: id.clone(),
        what: format!("checkpoint {}", head.latest_version),
        detail: "it is missing".to_owned(),
    })?;
    check_message_range(id, from, to, last_seq)?;
    if from > to {
        return Ok(Vec::new());
    }
    let (out, _) = checked_messages(store, &row, id, None, from)?;
    if i64::try_from(out.len()).ok() != Some(to - from + 1) {
        return Err(StoreError::Tampered {
            session: id.clone(),
            what: format!("message {}", from + i64::try_from(out.len()).unwrap_or(0)),
            detail: format!("it is missing from the transcript (messages {from}..={to} asked)"),
        });
    }
    Ok(out)
}

/// The messages of `row` (the arrays `seqs`, `messages`, `formats` and `seals`, from
/// position `from` on), each checked: contiguous from `from`, of a known format, and
/// sealed in a chain that starts from the stored seal of message `from - 1` (the `anchor`
/// column: none for the first message; it must exist otherwise, and is taken as stored,
/// so a changed one breaks the seal of message `from`). Returns them with the last one's
/// seal (the anchor when there are none).
fn checked_messages(
    store: &PostgresStore,
    row: &PgRow,
    id: &SessionId,
    v: Option<i64>,
    from: i64,
) -> Result<(Vec<StoredMessage>, String), StoreError> {
    let mut chain = if from <= 1 {
        String::new()
    } else if get::<bool>(row, "anchor_found")? {
        get::<Option<String>>(row, "anchor")?.unwrap_or_default()
    } else {
        return Err(StoreError::Tampered {
            session: id.clone(),
            what: format!("message {}", from - 1),
            detail: "it is missing from the transcript".to_owned(),
        });
    };
    let seqs: Vec<i64> = get::<Option<Vec<i64>>>(row, "seqs")?.unwrap_or_default();
    let logged: Vec<String> = get::<Option<Vec<String>>>(row, "messages")?.unwrap_or_default();
    let formats: Vec<i32> = get::<Option<Vec<i32>>>(row, "formats")?.unwrap_or_default();
    let seals: Vec<Option<String>> =
        get::<Option<Vec<Option<String>>>>(row, "seals")?.unwrap_or_default();
    let mut messages = Vec::with_capacity(logged.len());
    for (i, (((seq, text), format), stored)) in
        seqs.iter().zip(logged).zip(&formats).zip(seals).enumerate()
    {
        let seq = *seq;
        let expected = from + i64::try_from(i).unwrap_or(i64::MAX);
        if seq != expected {
            return Err(StoreError::Tampered {
                session: id.clone(),
                what: format!("message {expected}"),
                detail: format!("it is missing from the transcript (next is {seq})"),
            });
        }
        rows::check_format(id, v, &format!("message {seq}"), *format)?;
        seal::check_message(store.keyring(), id, seq, &text, &chain, stored.as_deref())?;
        chain = stored.unwrap_or_default();
        // The text as sealed, not parsed: the reader parses it once, into its own type.
        messages.push(StoredMessage::from(text));
    }
    Ok((messages, chain))
}
