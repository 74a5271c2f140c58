//! Checkpoints: compare-and-set writes, snapshot reads and forks, and the sealed
//! append of a checkpoint with its messages that session creation and `finish_call`
//! share.

use std::borrow::Cow;

use async_trait::async_trait;
use durable_core::integrity::Keyring;
use durable_core::store::{
    Checkpoint, CheckpointLog, CheckpointMeta, FORMAT_VERSION, Fence, ForkCopy, ForkSession, Lease,
    NewCheckpoint, SessionRecord, StoredMessage, fork_audit_map, fork_copies,
};
use durable_core::{CallId, SessionId, StoreError};
use sqlx::sqlite::{SqliteArguments, SqliteRow};
use sqlx::{Arguments, Row, SqliteConnection};

use crate::SqliteStore;
use crate::error::{check_format, corrupt, db, parse_json};
use crate::keys;
use crate::rows::{self, json, meta_cols, parse_snapshot_ref, snapshot_ref, snapshot_text};
use crate::seal::{self, RawCheckpoint};
use crate::tx::{self, Fenced, ReadTx, WriteTx, millis};

/// A write of the process's group commit ([`crate::group`]), two round trips inside the
/// batch's transaction: one `SELECT` (clock, fence, head, the latest checkpoint's tail:
/// see [`latest_checkpoint_select!`]), then, in a savepoint, the messages, the checkpoint
/// and the session row ([`append_checkpoint`]).
pub(crate) async fn save_checkpoint(
    store: &SqliteStore,
    fence: Fence<'_>,
    expected: i64,
    checkpoint: NewCheckpoint,
) -> Result<CheckpointMeta, StoreError> {
    write_checkpoint(store, fence, expected, checkpoint, false).await
}

/// The final checkpoint and the session's completion in the same statements of the
/// group commit (one transaction): the status set as `set_status` sets it, the lease
/// given up, a parent waiting for the session woken.
pub(crate) async fn complete_with_checkpoint(
    store: &SqliteStore,
    fence: Fence<'_>,
    expected: i64,
    checkpoint: NewCheckpoint,
) -> Result<CheckpointMeta, StoreError> {
    write_checkpoint(store, fence, expected, checkpoint, true).await
}

async fn write_checkpoint(
    store: &SqliteStore,
    fence: Fence<'_>,
    expected: i64,
    checkpoint: NewCheckpoint,
    completes: bool,
) -> Result<CheckpointMeta, StoreError> {
    let job_store = store.clone();
    let (session, token) = (fence.session.clone(), fence.token);
    store
        .group()
        .submit(move |conn, deliver| {
            Box::pin(async move {
                let fence = Fence {
                    session: &session,
                    token,
                };
                let ring = job_store.keyring();
                let result = async {
                    let (now, mut fenced, row) = conn
                        .fenced(
                            ring,
                            fence,
                            latest_checkpoint_select!("", ""),
                            SqliteArguments::default(),
                        )
                        .await?;
                    let latest = LatestCheckpoint::from_row(&row, fence.session)?;
                    let mut out = Statements::new();
                    let meta = append_checkpoint(
                        &mut out,
                        ring,
                        now,
                        fence.session,
                        &mut fenced,
                        &latest,
                        expected,
                        &checkpoint,
                    )?;
                    if completes {
                        out.push(
                            "UPDATE durable_sessions SET status = 'completed', \
                             status_reason = NULL, updated_at = ?, lease_expires_at = ?, \
                             fence = fence + 1 WHERE id = ?",
                        );
                        out.bind(now)?
                            .bind(now)?
                            .bind(fence.session.as_str().to_owned())?;
                        out.push(crate::family::WAKE_PARENT);
                        out.bind(fence.session.as_str().to_owned())?
                            .bind(durable_core::store::WAITING_FOR_CHILDREN)?;
                    }
                    let (sql, args) = out.into_parts();
                    conn.write(&sql, args).await?;
                    Ok(meta)
                }
                .await;
                deliver.done(result)
            })
        })
        .await
}

/// Two round trips, one snapshot: `BEGIN` with one `SELECT` of the head, the checkpoint
/// (snapshots resolved) and the previous version's seal; then the transcript and
/// `COMMIT`.
pub(crate) async fn load_checkpoint(
    store: &SqliteStore,
    id: &SessionId,
    version: Option<i64>,
) -> Result<Checkpoint, StoreError> {
    load_checkpoint_window(store, id, version, None).await
}

/// [`load_checkpoint`] with only the transcript's last `window` messages (`None`: all),
/// read by their primary key from the message before the window: the same two round
/// trips, whatever the transcript's length.
pub(crate) async fn load_checkpoint_window(
    store: &SqliteStore,
    id: &SessionId,
    version: Option<i64>,
    window: Option<usize>,
) -> Result<Checkpoint, StoreError> {
    match load_checkpoint_as(store, id, version, Transcript::Aggregated, window).await {
        // A transcript too long for one SQLite value (over SQLITE_MAX_LENGTH) is read
        // row by row instead, in a new snapshot.
        Err(StoreError::Database { .. }) => {
            load_checkpoint_as(store, id, version, Transcript::Rows, window).await
        }
        other => other,
    }
}

/// How [`load_checkpoint`] reads the transcript.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transcript {
    /// One row: every column aggregated in `seq` order (the messages concatenated,
    /// split by their byte lengths). Rows cross from SQLite's worker thread one at a
    /// time, so one row instead of thousands is most of the cost of a long read.
    Aggregated,
    /// A row per message.
    Rows,
}

/// One message of the transcript as stored.
struct Logged<'a> {
    seq: i64,
    format: i64,
    text: Cow<'a, str>,
    seal: Option<Cow<'a, str>>,
}

/// The transcript from its aggregated row (see [`Transcript::Aggregated`]).
fn split_transcript<'a>(
    row: &'a SqliteRow,
    id: &SessionId,
    v: Option<i64>,
) -> Result<Vec<Logged<'a>>, StoreError> {
    let n: i64 = rows::col(row, "n", id, v)?;
    if n == 0 {
        return Ok(Vec::new());
    }
    let text = |name: &str| -> Result<&'a str, StoreError> {
        row.try_get::<&'a str, _>(name)
            .map_err(|e| corrupt(id, v, format!("the transcript's `{name}`: {e}")))
    };
    let (seqs, formats, lengths, messages, seals) = (
        text("seqs")?,
        text("formats")?,
        text("lengths")?,
        text("messages")?,
        text("seals")?,
    );
    let ints = |list: &str, what: &str| -> Result<Vec<i64>, StoreError> {
        list.split(',')
            .map(|x| x.parse::<i64>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| corrupt(id, v, format!("the transcript's {what} do not parse")))
    };
    let (seqs, formats, lengths) = (
        ints(seqs, "positions")?,
        ints(formats, "formats")?,
        ints(lengths, "lengths")?,
    );
    let seals: Vec<&str> = seals.split(',').collect();
    let count = usize::try_from(n).unwrap_or(usize::MAX);
    if [seqs.len(), formats.len(), lengths.len(), seals.len()] != [count; 4] {
        return Err(StoreError::Tampered {
            session: id.clone(),
            what: "the transcript".to_owned(),
            detail: "its seals do not split into one per message".to_owned(),
        });
    }
    let mut out = Vec::with_capacity(count);
    let mut at = 0usize;
    for i in 0..count {
        let len = usize::try_from(lengths[i]).unwrap_or(usize::MAX);
        let end = at.saturating_add(len);
        let piece = messages
            .get(at..end)
            .ok_or_else(|| corrupt(id, v, "the transcript's lengths do not add up"))?;
        at = end;
        out.push(Logged {
            seq: seqs[i],
            format: formats[i],
            text: Cow::Borrowed(piece),
            // `!` stands for a missing seal (a seal never contains one).
            seal: (seals[i] != "!").then_some(Cow::Borrowed(seals[i])),
        });
    }
    Ok(out)
}

async fn load_checkpoint_as(
    store: &SqliteStore,
    id: &SessionId,
    version: Option<i64>,
    how: Transcript,
    window: Option<usize>,
) -> Result<Checkpoint, StoreError> {
    let ring = store.keyring();
    let (mut rtx, found) = ReadTx::begin_with(
        store.reader(),
        sqlx::query(concat!(
            "BEGIN; SELECT ",
            seal::head_cols!(),
            ", s.num, s.id AS session_id, p.version, p.last_seq, p.message_count, \
             p.app_version, p.created_at, p.format, p.seal AS p_seal, \
             (SELECT q.seal FROM durable_checkpoints q WHERE q.session_num = s.num \
              AND q.version = p.version - 1) AS previous_seal, \
             EXISTS (SELECT 1 FROM durable_checkpoints q WHERE q.session_num = s.num \
              AND q.version = p.version - 1) AS previous_found",
            snapshot_cols!("plan"),
            snapshot_cols!("budget"),
            snapshot_cols!("state"),
            " FROM durable_sessions s LEFT JOIN durable_checkpoints p \
             ON p.session_num = s.num AND p.version = COALESCE(?2, s.latest_version) \
             WHERE s.id = ?1"
        ))
        .bind(id.as_str())
        .bind(version),
    )
    .await?;
    let checked = (|| {
        let row = found
            .first()
            .ok_or_else(|| StoreError::SessionNotFound(id.clone()))?;
        let head = seal::head_from_row(row, id)?;
        head.check(ring)?;
        let version = version.unwrap_or(head.latest_version);
        let found_version: Option<i64> = rows::col(row, "version", id, None)?;
        if found_version.is_none() {
            return Err(StoreError::VersionNotFound {
                session: id.clone(),
                version,
            });
        }
        let v = Some(version);
        let format: i64 = rows::col(row, "format", id, v)?;
        check_format(format, id, v, "the checkpoint")?;
        let meta = rows::checkpoint_meta(row)?;
        let num: i64 = rows::col(row, "num", id, v)?;
        let previous_found: bool = rows::col(row, "previous_found", id, v)?;
        let previous = if version == 0 {
            String::new()
        } else if previous_found {
            rows::col::<Option<String>>(row, "previous_seal", id, v)?.unwrap_or_default()
        } else {
            return Err(StoreError::Tampered {
                session: id.clone(),
                what: format!("checkpoint {}", version - 1),
                detail: "it is missing".to_owned(),
            });
        };
        let mut texts = Vec::with_capacity(3);
        for column in ["plan", "budget", "state"] {
            let text: Option<String> = rows::col(row, &format!("p_{column}"), id, v)?;
            let holder: i64 = rows::col(row, &format!("p_{column}_holder"), id, v)?;
            texts.push(match text {
                Some(text) if parse_snapshot_ref(&text).is_none() => text,
                Some(_) => {
                    return Err(corrupt(
                        id,
                        Some(holder),
                        format!("the {column} snapshot refers to another reference"),
                    ));
                }
                None => {
                    return Err(corrupt(
                        id,
                        Some(holder),
                        format!("a {column} snapshot refers to missing version {holder}"),
                    ));
                }
            });
        }
        let checkpoint_seal: Option<String> = rows::col(row, "p_seal", id, v)?;
        Ok((version, meta, num, previous, texts, checkpoint_seal))
    })();
    let (version, meta, num, previous, texts, checkpoint_seal) = match checked {
        Ok(checked) => checked,
        Err(e) => {
            rtx.rollback().await;
            return Err(e);
        }
    };
    let v = Some(version);
    // The window's first position; the seal of the message before it starts the chain.
    let from = match window {
        Some(window) => (meta.last_seq - i64::try_from(window).unwrap_or(i64::MAX)).max(0) + 1,
        None => 1,
    };
    let sql = match how {
        Transcript::Aggregated => {
            "SELECT COUNT(*) AS n, group_concat(seq, ',' ORDER BY seq) AS seqs, \
             group_concat(format, ',' ORDER BY seq) AS formats, \
             group_concat(octet_length(message), ',' ORDER BY seq) AS lengths, \
             group_concat(message, '' ORDER BY seq) AS messages, \
             group_concat(COALESCE(seal, '!'), ',' ORDER BY seq) AS seals, \
             (SELECT COALESCE(a.seal, '!') FROM durable_messages a \
              WHERE a.session_num = ?1 AND a.seq = ?2 - 1) AS anchor \
             FROM durable_transcript WHERE session_num = ?1 AND seq >= ?2 AND seq <= ?3; COMMIT"
        }
        Transcript::Rows => {
            "SELECT seq, message, format, seal, \
             (SELECT COALESCE(a.seal, '!') FROM durable_messages a \
              WHERE a.session_num = ?1 AND a.seq = ?2 - 1) AS anchor FROM durable_transcript \
             WHERE session_num = ?1 AND seq >= ?2 AND seq <= ?3 ORDER BY seq; COMMIT"
        }
    };
    let found = rtx
        .finish_with(sqlx::query(sql).bind(num).bind(from).bind(meta.last_seq))
        .await?;
    let anchor = message_anchor(found.first(), from, id, v)?;
    let logged = match how {
        Transcript::Aggregated => match found.first() {
            Some(row) => split_transcript(row, id, v)?,
            None => Vec::new(),
        },
        Transcript::Rows => found
            .iter()
            .map(|row| {
                Ok(Logged {
                    seq: rows::col(row, "seq", id, v)?,
                    format: rows::col(row, "format", id, v)?,
                    text: Cow::Owned(rows::col::<String>(row, "message", id, v)?),
                    seal: rows::col::<Option<String>>(row, "seal", id, v)?.map(Cow::Owned),
                })
            })
            .collect::<Result<Vec<_>, StoreError>>()?,
    };
    let plan = parse_json(&texts[0], id, v, "the plan")?;
    let budget = parse_json(&texts[1], id, v, "the budget")?;
    let state = parse_json(&texts[2], id, v, "the state")?;
    let logged_len = logged.len();
    let mut messages = Vec::with_capacity(logged_len);
    // The chain: message n's seal covers message n-1's, from the window's first on.
    let mut chain: Cow<'_, str> = Cow::Owned(anchor);
    for (i, message) in logged.into_iter().enumerate() {
        let seq = message.seq;
        let expected = from + i64::try_from(i).unwrap_or(i64::MAX);
        if expected != seq {
            return Err(StoreError::Tampered {
                session: id.clone(),
                what: format!("message {expected}"),
                detail: format!("it is missing from the transcript (next is {seq})"),
            });
        }
        check_format(message.format, id, v, &format!("message {seq}"))?;
        let stored = message.seal.as_deref();
        seal::check_message(ring, id, seq, &message.text, &chain, stored)?;
        chain = message.seal.unwrap_or_default();
        // The text as sealed, not parsed: the reader parses it once, into its own type.
        messages.push(StoredMessage::new(message.text.into_owned()));
    }
    let chain = chain.into_owned();
    if i64::try_from(logged_len).ok() != Some(meta.last_seq - from + 1) {
        return Err(StoreError::Tampered {
            session: id.clone(),
            what: format!("the transcript of checkpoint {version}"),
            detail: format!(
                "it ends at message {} but the log holds {logged_len} from message {from}",
                meta.last_seq
            ),
        });
    }
    RawCheckpoint {
        session: id,
        version,
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
    if i64::try_from(messages.len()).ok() != Some(meta.message_count - (from - 1)) {
        return Err(corrupt(
            id,
            v,
            format!(
                "the checkpoint counts {} messages but the log holds {} up to seq {}",
                meta.message_count,
                messages.len(),
                meta.last_seq
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

/// The seal that starts the chain of a transcript read from position `from`: none for
/// the first message; otherwise the stored seal of message `from - 1` (the `anchor`
/// column of `row`), which must exist. Taken as stored: a changed one breaks the seal of
/// message `from`.
fn message_anchor(
    row: Option<&SqliteRow>,
    from: i64,
    id: &SessionId,
    version: Option<i64>,
) -> Result<String, StoreError> {
    if from <= 1 {
        return Ok(String::new());
    }
    let anchor: Option<String> = match row {
        Some(row) => rows::col(row, "anchor", id, version)?,
        None => None,
    };
    match anchor.as_deref() {
        Some("!") => Ok(String::new()),
        Some(seal) => Ok(seal.to_owned()),
        None => Err(StoreError::Tampered {
            session: id.clone(),
            what: format!("message {}", from - 1),
            detail: "it is missing from the transcript".to_owned(),
        }),
    }
}

/// Messages `from..=to` of the latest checkpoint's transcript, in two round trips of one
/// snapshot (the head and the latest checkpoint's end; then the range by primary key,
/// with the seal of the message before it), checked by the chain from that seal.
pub(crate) async fn messages(
    store: &SqliteStore,
    id: &SessionId,
    from: i64,
    to: i64,
) -> Result<Vec<StoredMessage>, StoreError> {
    let ring = store.keyring();
    let (mut rtx, found) = ReadTx::begin_with(
        store.reader(),
        sqlx::query(concat!(
            "BEGIN; SELECT ",
            seal::head_cols!(),
            ", s.num, (SELECT p.last_seq FROM durable_checkpoints p \
             WHERE p.session_num = s.num AND p.version = s.latest_version) AS last_seq \
             FROM durable_sessions s WHERE s.id = ?1"
        ))
        .bind(id.as_str()),
    )
    .await?;
    let checked = (|| {
        let row = found
            .first()
            .ok_or_else(|| StoreError::SessionNotFound(id.clone()))?;
        let head = seal::head_from_row(row, id)?;
        head.check(ring)?;
        let last_seq: Option<i64> = rows::col(row, "last_seq", id, None)?;
        let last_seq = last_seq.ok_or_else(|| StoreError::Tampered {
            session: id.clone(),
            what: format!("checkpoint {}", head.latest_version),
            detail: "it is missing".to_owned(),
        })?;
        durable_core::store::check_message_range(id, from, to, last_seq)?;
        rows::col::<i64>(row, "num", id, None)
    })();
    let num = match checked {
        Ok(_) if from > to => {
            rtx.rollback().await;
            return Ok(Vec::new());
        }
        Ok(num) => num,
        Err(e) => {
            rtx.rollback().await;
            return Err(e);
        }
    };
    let found = rtx
        .finish_with(
            sqlx::query(
                "SELECT seq, message, format, seal, \
                 (SELECT COALESCE(a.seal, '!') FROM durable_messages a \
                  WHERE a.session_num = ?1 AND a.seq = ?2 - 1) AS anchor FROM durable_transcript \
                 WHERE session_num = ?1 AND seq >= ?2 AND seq <= ?3 ORDER BY seq; COMMIT",
            )
            .bind(num)
            .bind(from)
            .bind(to),
        )
        .await?;
    let mut chain = message_anchor(found.first(), from, id, None)?;
    let mut out = Vec::with_capacity(found.len());
    for (i, row) in found.iter().enumerate() {
        let expected = from + i64::try_from(i).unwrap_or(i64::MAX);
        let seq: i64 = rows::col(row, "seq", id, None)?;
        if seq != expected {
            return Err(StoreError::Tampered {
                session: id.clone(),
                what: format!("message {expected}"),
                detail: format!("it is missing from the transcript (next is {seq})"),
            });
        }
        let format: i64 = rows::col(row, "format", id, None)?;
        check_format(format, id, None, &format!("message {seq}"))?;
        let text: String = rows::col(row, "message", id, None)?;
        let stored: Option<String> = rows::col(row, "seal", id, None)?;
        seal::check_message(ring, id, seq, &text, &chain, stored.as_deref())?;
        chain = stored.unwrap_or_default();
        out.push(StoredMessage::new(text));
    }
    if i64::try_from(out.len()).ok() != Some(to - from + 1) {
        return Err(StoreError::Tampered {
            session: id.clone(),
            what: format!("message {}", from + i64::try_from(out.len()).unwrap_or(0)),
            detail: format!("it is missing from the transcript (messages {from}..={to} asked)"),
        });
    }
    Ok(out)
}

pub(crate) async fn list_checkpoints(
    store: &SqliteStore,
    id: &SessionId,
) -> Result<Vec<CheckpointMeta>, StoreError> {
    let mut rtx = store
        .reader()
        .begin()
        .await
        .map_err(|e| crate::error::pool_error(store.reader(), crate::error::Pool::Reader, e))?;
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM durable_sessions WHERE id = ?)")
            .bind(id.as_str())
            .fetch_one(&mut *rtx)
            .await
            .map_err(db)?;
    if !exists {
        return Err(StoreError::SessionNotFound(id.clone()));
    }
    let found = sqlx::query(concat!(
        "SELECT ",
        meta_cols!(),
        " FROM durable_checkpoints WHERE session_num = (SELECT num FROM durable_sessions WHERE id = ?) ORDER BY version"
    ))
    .bind(id.as_str())
    .fetch_all(&mut *rtx)
    .await
    .map_err(db)?;
    rtx.commit().await.map_err(db)?;
    found.iter().map(rows::checkpoint_meta).collect()
}

pub(crate) async fn fork_session(
    store: &SqliteStore,
    fork: &ForkSession,
) -> Result<(SessionRecord, Lease), StoreError> {
    let (id, version, new_id) = (&fork.source, fork.version, &fork.new_id);
    let (owner, ttl) = (fork.owner.as_str(), fork.ttl);
    new_id.validate()?;
    durable_core::validate::validate_owner(owner)?;
    // The source is checked before it is copied: a fork must not launder a forged
    // transcript or journal under fresh seals.
    load_checkpoint(store, id, Some(version)).await?;
    let source_rows = crate::journal::calls(store, id, None).await?;
    let copies = fork_copies(fork, &source_rows)?;
    let ring = store.keyring();
    let mut tx = WriteTx::begin(store.writer()).await?;
    let now = tx.now;
    let result = async {
        let conn = tx.conn();
        let source = tx::session(&mut *conn, id).await?;
        let cp = sqlx::query(
            "SELECT last_seq, message_count, plan, budget, state, format \
             FROM durable_checkpoints WHERE session_num = (SELECT num FROM durable_sessions WHERE id = ?) AND version = ?",
        )
        .bind(id.as_str())
        .bind(version)
        .fetch_optional(&mut *conn)
        .await
        .map_err(db)?
        .ok_or_else(|| StoreError::VersionNotFound {
            session: id.clone(),
            version,
        })?;
        let v = Some(version);
        let format: i64 = rows::col(&cp, "format", id, v)?;
        check_format(format, id, v, "the checkpoint")?;
        let last_seq: i64 = rows::col(&cp, "last_seq", id, v)?;
        let expires_at = now.saturating_add(millis(ttl));
        // Metadata is copied as stored (bytes unchanged), like the transcript below.
        let inserted = sqlx::query(
            "INSERT INTO durable_sessions (id, status, app_version, metadata, lease_owner, \
             lease_expires_at, fence, recovery_attempts, status_reason, latest_version, \
             created_at, updated_at, format, queue, lease_renewed_at) \
             SELECT ?, 'active', app_version, metadata, ?, ?, 1, 0, NULL, 0, ?, ?, format, \
             queue, ? \
             FROM durable_sessions WHERE id = ? \
             ON CONFLICT (id) DO NOTHING",
        )
        .bind(new_id.as_str())
        .bind(owner)
        .bind(expires_at)
        .bind(now)
        .bind(now)
        .bind(now)
        .bind(id.as_str())
        .execute(&mut *conn)
        .await
        .map_err(db)?;
        if inserted.rows_affected() == 0 {
            return Err(StoreError::SessionExists(new_id.clone()));
        }
        // The transcript keeps its seqs and bytes; JSON is copied, not re-encoded. A
        // message stored as a reference to a model row is copied as its text: the fork
        // inherits no model row.
        sqlx::query(
            "INSERT INTO durable_messages (session_num, seq, message, format, created_at) \
             SELECT (SELECT num FROM durable_sessions WHERE id = ?), seq, message, format, \
             created_at FROM durable_transcript WHERE session_num = (SELECT num FROM durable_sessions WHERE id = ?) AND seq <= ?",
        )
        .bind(new_id.as_str())
        .bind(id.as_str())
        .bind(last_seq)
        .execute(&mut *conn)
        .await
        .map_err(db)?;
        // Snapshots stored as references to older versions are resolved: the fork's
        // version 0 holds their text.
        let mut texts = Vec::with_capacity(3);
        for column in ["plan", "budget", "state"] {
            let stored = rows::col::<String>(&cp, column, id, v)?;
            texts.push(rows::resolve_snapshot(&mut *conn, id, stored, column).await?);
        }
        sqlx::query(
            "INSERT INTO durable_checkpoints (session_num, version, last_seq, message_count, \
             plan, budget, state, app_version, format, created_at) \
             SELECT (SELECT num FROM durable_sessions WHERE id = ?), 0, last_seq, \
             message_count, ?, ?, ?, ?, format, ? \
             FROM durable_checkpoints WHERE session_num = (SELECT num FROM durable_sessions WHERE id = ?) AND version = ?",
        )
        .bind(new_id.as_str())
        .bind(&texts[0])
        .bind(&texts[1])
        .bind(&texts[2])
        .bind(&source.app_version)
        .bind(now)
        .bind(id.as_str())
        .bind(version)
        .execute(&mut *conn)
        .await
        .map_err(db)?;
        copy_journal(&mut *conn, fork, &copies, source_rows.len(), &source.app_version, now)
            .await?;
        keys::reseal_session(&mut *conn, None, ring, new_id).await?;
        let record = tx::session(conn, new_id).await?;
        let lease = Lease {
            session: new_id.clone(),
            owner: owner.to_owned(),
            fence: record.fence,
            expires_at,
        };
        Ok((record, lease))
    }
    .await;
    tx.finish(result).await
}

/// Copies the source's effects a fork must not repeat into its journal (rows `copies`,
/// from [`fork_copies`]), sets the new head's journal count (the caller re-seals the
/// session) and writes the fork's audit row. Each row is copied only if it still holds
/// the seal it was checked under, and only if the source's journal still has
/// `checked_rows` rows: otherwise [`StoreError::ForkSourceChanged`], nothing written.
async fn copy_journal(
    conn: &mut SqliteConnection,
    fork: &ForkSession,
    copies: &[ForkCopy],
    checked_rows: usize,
    app_version: &str,
    now: i64,
) -> Result<(), StoreError> {
    let (source, new_id) = (&fork.source, &fork.new_id);
    let rows_now: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM durable_tool_calls WHERE session_id = ?")
            .bind(source.as_str())
            .fetch_one(&mut *conn)
            .await
            .map_err(db)?;
    if usize::try_from(rows_now).ok() != Some(checked_rows) {
        return Err(StoreError::ForkSourceChanged(source.clone()));
    }
    for copy in copies {
        let done = sqlx::query(
            "INSERT INTO durable_tool_calls (id, session_id, kind, step, tool_name, input_hash, \
             ordinal, replay_class, status, args, idempotency_key, schema_hash, result, error, \
             spend, mac, attempt, fence, format, issued_at, finished_at, seq, approval) \
             SELECT ?, ?, kind, ?, tool_name, input_hash, COALESCE(?, ordinal), replay_class, status, args, \
             idempotency_key, schema_hash, result, error, spend, NULL, attempt, 1, format, \
             issued_at, finished_at, ?, approval \
             FROM durable_tool_calls WHERE id = ? AND session_id = ? AND mac IS ?",
        )
        .bind(copy.to.as_str())
        .bind(new_id.as_str())
        .bind(copy.step)
        .bind(copy.ordinal)
        .bind(copy.seq)
        .bind(copy.from.as_str())
        .bind(source.as_str())
        .bind(copy.mac.as_deref())
        .execute(&mut *conn)
        .await
        .map_err(db)?;
        if done.rows_affected() != 1 {
            return Err(StoreError::ForkSourceChanged(source.clone()));
        }
    }
    sqlx::query("UPDATE durable_sessions SET journal_rows = ? WHERE id = ?")
        .bind(i64::try_from(copies.len()).unwrap_or(i64::MAX))
        .bind(new_id.as_str())
        .execute(&mut *conn)
        .await
        .map_err(db)?;
    let pairs: Vec<(CallId, CallId)> = copies
        .iter()
        .map(|c| (c.from.clone(), c.to.clone()))
        .collect();
    let step_map: Vec<[String; 2]> = fork_audit_map(source, fork.version, &pairs, &fork.rerun)
        .into_iter()
        .map(|(a, b)| [a, b])
        .collect();
    sqlx::query(
        "INSERT INTO durable_migrations (session_id, from_version, to_version, step_map, \
         migrated_by, format, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(new_id.as_str())
    .bind(app_version)
    .bind(app_version)
    .bind(
        serde_json::to_string(&step_map).map_err(|e| StoreError::Corrupt {
            session: new_id.clone(),
            version: None,
            detail: format!("the fork's audit row could not be encoded: {e}"),
        })?,
    )
    .bind(&fork.by)
    .bind(FORMAT_VERSION)
    .bind(now)
    .execute(&mut *conn)
    .await
    .map_err(db)?;
    Ok(())
}

/// Compare-and-set checkpoint write for a session whose fence was checked: fails with
/// [`StoreError::VersionConflict`] unless the latest version is `expected`.
/// The SQL of a fenced write that may append a checkpoint: [`fenced_select!`] with the
/// session's number and the latest checkpoint's tail (joined as `p`): its position in
/// the log, its seal, the seal of its last message and its snapshots resolved to their
/// text (a stored `@k` is looked up in version `k`), with the version holding each
/// (`…_holder`). `$cols` and `$join` add more, as in [`fenced_select!`].
macro_rules! latest_checkpoint_select {
    ($cols:expr, $join:expr) => {
        $crate::tx::fenced_select!(
            concat!(
                ", s.num, p.version AS p_version, p.last_seq AS p_last_seq, \
                 p.message_count AS p_message_count, \
                 (SELECT m.seal FROM durable_messages m \
                  WHERE m.session_num = s.num AND m.seq = p.last_seq) AS p_message_seal, \
                 EXISTS (SELECT 1 FROM durable_messages m \
                  WHERE m.session_num = s.num AND m.seq = p.last_seq) AS p_message_found",
                $crate::checkpoints::replies_cols!(),
                $crate::checkpoints::snapshot_cols!("plan"),
                $crate::checkpoints::snapshot_cols!("budget"),
                $crate::checkpoints::snapshot_cols!("state"),
                $cols
            ),
            concat!(
                " LEFT JOIN durable_checkpoints p ON p.session_num = s.num \
                 AND p.version = s.latest_version",
                $join
            )
        )
    };
}
pub(crate) use latest_checkpoint_select;

/// The model replies of the step the next checkpoint ends (`step = latest_version`), by
/// the identity index: their positions, their texts' byte lengths and their texts
/// concatenated, in position order. A new message with the same text is stored as a
/// reference to the row ([`LatestCheckpoint::reply`]).
macro_rules! replies_cols {
    () => {
        ", (SELECT group_concat(r.seq, ',' ORDER BY r.seq) FROM durable_tool_calls r \
           WHERE r.session_id = s.id AND r.step = s.latest_version AND r.kind = 'model' \
           AND r.result IS NOT NULL) AS reply_seqs, \
         (SELECT group_concat(octet_length(r.result), ',' ORDER BY r.seq) \
           FROM durable_tool_calls r WHERE r.session_id = s.id AND r.step = s.latest_version \
           AND r.kind = 'model' AND r.result IS NOT NULL) AS reply_lengths, \
         (SELECT group_concat(r.result, '' ORDER BY r.seq) FROM durable_tool_calls r \
           WHERE r.session_id = s.id AND r.step = s.latest_version AND r.kind = 'model' \
           AND r.result IS NOT NULL) AS replies"
    };
}
pub(crate) use replies_cols;

/// The text of snapshot column `$c` of checkpoint `p` (a reference resolved) as
/// `p_$c`, and the version holding it as `p_$c_holder` (see `rows::snapshot_ref`).
macro_rules! snapshot_cols {
    ($c:literal) => {
        concat!(
            ", CASE WHEN p.",
            $c,
            " LIKE '@%' THEN (SELECT h.",
            $c,
            " FROM durable_checkpoints h WHERE h.session_num = s.num \
             AND h.version = CAST(substr(p.",
            $c,
            ", 2) AS INTEGER)) ELSE p.",
            $c,
            " END AS p_",
            $c,
            ", CASE WHEN p.",
            $c,
            " LIKE '@%' THEN CAST(substr(p.",
            $c,
            ", 2) AS INTEGER) ELSE p.version END AS p_",
            $c,
            "_holder"
        )
    };
}
pub(crate) use snapshot_cols;

/// The latest checkpoint's tail, read with [`latest_checkpoint_select!`].
pub(crate) struct LatestCheckpoint {
    session_num: i64,
    last_seq: i64,
    message_count: i64,
    /// The seal of the log's last message (`""` before the first).
    message_seal: String,
    /// Each snapshot's text and the version holding it, when it is text (a reference
    /// that does not resolve to text is stored in full by the next checkpoint).
    snapshots: [Option<(String, i64)>; 3],
    /// The step's model replies: each one's journal position and text.
    replies: Vec<(i64, String)>,
}

impl LatestCheckpoint {
    pub(crate) fn from_row(row: &SqliteRow, session: &SessionId) -> Result<Self, StoreError> {
        let version: Option<i64> = rows::col(row, "p_version", session, None)?;
        let Some(version) = version else {
            let latest: i64 = rows::col(row, "latest_version", session, None)?;
            return Err(StoreError::Tampered {
                session: session.clone(),
                what: format!("checkpoint {latest}"),
                detail: "it is missing".to_owned(),
            });
        };
        let v = Some(version);
        let last_seq: i64 = rows::col(row, "p_last_seq", session, v)?;
        let found: bool = rows::col(row, "p_message_found", session, v)?;
        if last_seq > 0 && !found {
            return Err(StoreError::Tampered {
                session: session.clone(),
                what: format!("message {last_seq}"),
                detail: "it is missing from the transcript".to_owned(),
            });
        }
        let snapshot = |column: &str| -> Result<Option<(String, i64)>, StoreError> {
            let text: Option<String> = rows::col(row, &format!("p_{column}"), session, v)?;
            let holder: i64 = rows::col(row, &format!("p_{column}_holder"), session, v)?;
            Ok(text
                .filter(|t| parse_snapshot_ref(t).is_none())
                .map(|t| (t, holder)))
        };
        Ok(LatestCheckpoint {
            session_num: rows::col(row, "num", session, v)?,
            last_seq,
            message_count: rows::col(row, "p_message_count", session, v)?,
            message_seal: rows::col::<Option<String>>(row, "p_message_seal", session, v)?
                .unwrap_or_default(),
            snapshots: [snapshot("plan")?, snapshot("budget")?, snapshot("state")?],
            replies: replies(row, session, v)?,
        })
    }

    /// The journal position of the step's model reply whose text is `text`, if any.
    fn reply(&self, text: &str) -> Option<i64> {
        self.replies
            .iter()
            .find(|(_, reply)| reply == text)
            .map(|(seq, _)| *seq)
    }
}

/// The step's model replies from [`replies_cols!`], split by their byte lengths.
fn replies(
    row: &SqliteRow,
    session: &SessionId,
    version: Option<i64>,
) -> Result<Vec<(i64, String)>, StoreError> {
    let seqs: Option<String> = rows::col(row, "reply_seqs", session, version)?;
    let lengths: Option<String> = rows::col(row, "reply_lengths", session, version)?;
    let texts: Option<String> = rows::col(row, "replies", session, version)?;
    let (Some(seqs), Some(lengths), Some(texts)) = (seqs, lengths, texts) else {
        return Ok(Vec::new());
    };
    let bad = || corrupt(session, version, "the step's model replies do not add up");
    let mut out = Vec::new();
    let mut at = 0usize;
    for (seq, length) in seqs.split(',').zip(lengths.split(',')) {
        let seq: i64 = seq.parse().map_err(|_| bad())?;
        let length: usize = length.parse().map_err(|_| bad())?;
        let text = texts.get(at..at + length).ok_or_else(bad)?;
        at += length;
        out.push((seq, text.to_owned()));
    }
    Ok(out)
}

/// Statements with their parameters, built up to be run in one round trip.
pub(crate) struct Statements {
    pub(crate) sql: String,
    args: SqliteArguments,
}

impl Statements {
    pub(crate) fn new() -> Self {
        Statements {
            sql: String::new(),
            args: SqliteArguments::default(),
        }
    }

    /// Appends `sql` (`; `-separated from what is there) and its parameters.
    pub(crate) fn push(&mut self, sql: &str) -> &mut Self {
        if !self.sql.is_empty() {
            self.sql.push_str("; ");
        }
        self.sql.push_str(sql);
        self
    }

    /// Binds the next parameter.
    pub(crate) fn bind<T>(&mut self, value: T) -> Result<&mut Self, StoreError>
    where
        T: for<'a> sqlx::Encode<'a, sqlx::Sqlite> + sqlx::Type<sqlx::Sqlite>,
    {
        self.args
            .add(value)
            .map_err(|e| db(sqlx::Error::Encode(e)))?;
        Ok(self)
    }

    /// The SQL and its parameters.
    pub(crate) fn into_parts(self) -> (String, SqliteArguments) {
        (self.sql, self.args)
    }
}

/// Compare-and-set append of checkpoint `expected + 1` after `latest` (checked against
/// the fenced session's latest version), with its messages: adds the statements that
/// write it (the messages, the checkpoint and the session row with its re-sealed head)
/// to `out`, for the caller to run in its transaction.
#[allow(clippy::too_many_arguments)]
pub(crate) fn append_checkpoint(
    out: &mut Statements,
    ring: &Keyring,
    now: i64,
    session: &SessionId,
    fenced: &mut Fenced,
    latest: &LatestCheckpoint,
    expected: i64,
    checkpoint: &NewCheckpoint,
) -> Result<CheckpointMeta, StoreError> {
    if fenced.latest_version != expected {
        return Err(StoreError::VersionConflict {
            session: session.clone(),
            expected,
            actual: fenced.latest_version,
        });
    }
    let version = expected + 1;
    // Unchanged snapshots are stored as a reference to the version holding their text.
    let mut stored = Vec::with_capacity(3);
    let mut texts = Vec::with_capacity(3);
    for (value, previous) in [&checkpoint.plan, &checkpoint.budget, &checkpoint.state]
        .into_iter()
        .zip(&latest.snapshots)
    {
        let text = json(value)?;
        stored.push(match previous {
            Some((previous, holder)) if *previous == text => snapshot_ref(*holder),
            _ => text.clone(),
        });
        texts.push(text);
    }
    let (mut last_seq, mut message_count) = (latest.last_seq, latest.message_count);
    let mut message_seal = latest.message_seal.clone();
    // At most MESSAGES_PER_INSERT rows per statement: SQLite takes at most 32,766
    // parameters per statement, seven per message here.
    const MESSAGES_PER_INSERT: usize = 1_000;
    if !checkpoint.messages.is_empty() {
        for (i, message) in checkpoint.messages.iter().enumerate() {
            let first = i % MESSAGES_PER_INSERT == 0;
            if first {
                out.push(
                    "INSERT INTO durable_messages \
                     (session_num, seq, message, format, created_at, seal, call_seq) VALUES ",
                );
            }
            last_seq += 1;
            message_count += 1;
            let text = json(message)?;
            message_seal = seal::seal_message(ring, session, last_seq, &text, &message_seal)?;
            out.sql.push_str(if first {
                "(?, ?, ?, ?, ?, ?, ?)"
            } else {
                ", (?, ?, ?, ?, ?, ?, ?)"
            });
            // The model's reply, recorded by the journal this step, is stored once: the
            // message refers to its row (schema 5).
            let reply = latest.reply(&text);
            out.bind(latest.session_num)?
                .bind(last_seq)?
                .bind(if reply.is_some() { String::new() } else { text })?
                .bind(FORMAT_VERSION)?
                .bind(now)?
                .bind(message_seal.clone())?
                .bind(reply)?;
        }
    }
    let checkpoint_seal = RawCheckpoint {
        session,
        version,
        last_seq,
        message_count,
        last_message_seal: &message_seal,
        plan: &texts[0],
        budget: &texts[1],
        state: &texts[2],
        app_version: &fenced.app_version,
        previous: &fenced.head.checkpoint_seal,
    }
    .seal(ring)?;
    let [plan, budget, state]: [String; 3] = stored
        .try_into()
        .map_err(|_| corrupt(session, Some(version), "snapshot columns"))?;
    out.push(
        "INSERT INTO durable_checkpoints (session_num, version, last_seq, message_count, plan, \
         budget, state, app_version, format, created_at, seal) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(latest.session_num)?
    .bind(version)?
    .bind(last_seq)?
    .bind(message_count)?
    .bind(plan)?
    .bind(budget)?
    .bind(state)?
    .bind(fenced.app_version.clone())?
    .bind(FORMAT_VERSION)?
    .bind(now)?
    .bind(checkpoint_seal.clone())?;
    fenced.latest_version = version;
    fenced.head.latest_version = version;
    fenced.head.checkpoint_seal = checkpoint_seal;
    fenced.head.seal(ring)?;
    out.push(
        "UPDATE durable_sessions SET latest_version = ?, recovery_attempts = 0, updated_at = ?, \
         wake_at = ?, issued_rows = ?, head = ? WHERE num = ?",
    )
    .bind(version)?
    .bind(now)?
    .bind(checkpoint.wake_at)?
    .bind(fenced.head.issued_rows)?
    .bind(fenced.head.head.clone())?
    .bind(latest.session_num)?;
    let meta = CheckpointMeta {
        session: session.clone(),
        version,
        last_seq,
        message_count,
        app_version: fenced.app_version.clone(),
        created_at: now,
    };
    Ok(meta)
}

/// Appends `messages` to the session's log and inserts checkpoint `version` whose
/// transcript ends with them, all sealed (messages chained to the log's last message,
/// the checkpoint to the previous version). Returns the checkpoint and its seal.
pub(crate) async fn insert_sealed_checkpoint(
    conn: &mut SqliteConnection,
    ring: &Keyring,
    now: i64,
    session: &SessionId,
    app_version: &str,
    version: i64,
    checkpoint: &NewCheckpoint,
) -> Result<(CheckpointMeta, String), StoreError> {
    // Unchanged snapshots are stored as a reference to the version holding their text
    // (see `snapshot_ref`), so a long session whose plan and state rarely change grows by
    // its messages, not by a copy of every snapshot per checkpoint.
    let previous = if version > 0 {
        sqlx::query(
            "SELECT last_seq, message_count, plan, budget, state, seal FROM durable_checkpoints \
             WHERE session_num = (SELECT num FROM durable_sessions WHERE id = ?) AND version = ?",
        )
        .bind(session.as_str())
        .bind(version - 1)
        .fetch_optional(&mut *conn)
        .await
        .map_err(db)?
    } else {
        None
    };
    let mut snapshots = Vec::with_capacity(3);
    let mut texts = Vec::with_capacity(3);
    for (column, value) in [
        ("plan", &checkpoint.plan),
        ("budget", &checkpoint.budget),
        ("state", &checkpoint.state),
    ] {
        let text = json(value)?;
        let stored = match &previous {
            Some(prev) => {
                let prev_text: String = rows::col(prev, column, session, Some(version - 1))?;
                let (holder, holder_text) = match parse_snapshot_ref(&prev_text) {
                    Some(holder) => (
                        holder,
                        snapshot_text(&mut *conn, session, holder, column).await?,
                    ),
                    None => (version - 1, prev_text),
                };
                if holder_text == text {
                    snapshot_ref(holder)
                } else {
                    text.clone()
                }
            }
            None => text.clone(),
        };
        snapshots.push(stored);
        texts.push(text);
    }
    let [plan, budget, state]: [String; 3] = snapshots
        .try_into()
        .map_err(|_| corrupt(session, Some(version), "snapshot columns"))?;
    let (mut last_seq, mut message_count) = match &previous {
        Some(prev) => (
            rows::col::<i64>(prev, "last_seq", session, Some(version - 1))?,
            rows::col::<i64>(prev, "message_count", session, Some(version - 1))?,
        ),
        None => (
            sqlx::query_scalar(
                "SELECT COALESCE(MAX(seq), 0) FROM durable_messages WHERE session_num = (SELECT num FROM durable_sessions WHERE id = ?)",
            )
            .bind(session.as_str())
            .fetch_one(&mut *conn)
            .await
            .map_err(db)?,
            0,
        ),
    };
    let previous_seal = match &previous {
        Some(prev) => rows::col::<Option<String>>(prev, "seal", session, Some(version - 1))?
            .unwrap_or_default(),
        None => String::new(),
    };
    let mut message_seal = seal::message_seal_at(&mut *conn, session, last_seq).await?;
    for message in &checkpoint.messages {
        last_seq += 1;
        message_count += 1;
        let text = json(message)?;
        message_seal = seal::seal_message(ring, session, last_seq, &text, &message_seal)?;
        sqlx::query(
            "INSERT INTO durable_messages (session_num, seq, message, format, created_at, seal) \
             VALUES ((SELECT num FROM durable_sessions WHERE id = ?), ?, ?, ?, ?, ?)",
        )
        .bind(session.as_str())
        .bind(last_seq)
        .bind(text)
        .bind(FORMAT_VERSION)
        .bind(now)
        .bind(&message_seal)
        .execute(&mut *conn)
        .await
        .map_err(db)?;
    }
    let checkpoint_seal = RawCheckpoint {
        session,
        version,
        last_seq,
        message_count,
        last_message_seal: &message_seal,
        plan: &texts[0],
        budget: &texts[1],
        state: &texts[2],
        app_version,
        previous: &previous_seal,
    }
    .seal(ring)?;
    sqlx::query(
        "INSERT INTO durable_checkpoints (session_num, version, last_seq, message_count, plan, \
         budget, state, app_version, format, created_at, seal) \
         VALUES ((SELECT num FROM durable_sessions WHERE id = ?), ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(session.as_str())
    .bind(version)
    .bind(last_seq)
    .bind(message_count)
    .bind(plan)
    .bind(budget)
    .bind(state)
    .bind(app_version)
    .bind(FORMAT_VERSION)
    .bind(now)
    .bind(&checkpoint_seal)
    .execute(&mut *conn)
    .await
    .map_err(db)?;
    let meta = CheckpointMeta {
        session: session.clone(),
        version,
        last_seq,
        message_count,
        app_version: app_version.to_owned(),
        created_at: now,
    };
    Ok((meta, checkpoint_seal))
}

#[async_trait]
impl CheckpointLog for SqliteStore {
    async fn save_checkpoint(
        &self,
        fence: Fence<'_>,
        expected: i64,
        checkpoint: NewCheckpoint,
    ) -> Result<CheckpointMeta, StoreError> {
        save_checkpoint(self, fence, expected, checkpoint).await
    }

    async fn complete_with_checkpoint(
        &self,
        fence: Fence<'_>,
        expected: i64,
        checkpoint: NewCheckpoint,
    ) -> Result<CheckpointMeta, StoreError> {
        let meta = complete_with_checkpoint(self, fence, expected, checkpoint).await?;
        self.work_available();
        Ok(meta)
    }

    async fn load_checkpoint(
        &self,
        id: &SessionId,
        version: Option<i64>,
    ) -> Result<Checkpoint, StoreError> {
        load_checkpoint(self, id, version).await
    }

    async fn load_checkpoint_window(
        &self,
        id: &SessionId,
        version: Option<i64>,
        window: usize,
    ) -> Result<Checkpoint, StoreError> {
        load_checkpoint_window(self, id, version, Some(window)).await
    }

    async fn messages(
        &self,
        id: &SessionId,
        from: i64,
        to: i64,
    ) -> Result<Vec<StoredMessage>, StoreError> {
        messages(self, id, from, to).await
    }

    async fn list_checkpoints(&self, id: &SessionId) -> Result<Vec<CheckpointMeta>, StoreError> {
        list_checkpoints(self, id).await
    }

    async fn fork_session_with(
        &self,
        fork: &ForkSession,
    ) -> Result<(SessionRecord, Lease), StoreError> {
        fork_session(self, fork).await
    }
}
