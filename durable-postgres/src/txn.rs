//! Building blocks that run inside one transaction: the clock, the fence check, and the
//! checkpoint append shared by `save_checkpoint`, `finish_call` and session creation.

use std::time::Duration;

use durable_core::StoreError;
use durable_core::ids::SessionId;
use durable_core::integrity::Keyring;
use durable_core::store::{
    CheckpointMeta, FORMAT_VERSION, Fence, Lease, NewCheckpoint, SessionRecord,
};
use serde_json::Value;
use sqlx::postgres::{PgConnection, PgPool};

use crate::error::{db, unique_violation};
use crate::rows::{self, checkpoint_meta_cols, get, session_cols};
use crate::seal::{self, HeadRow, RawCheckpoint};

/// The database clock in ms since the epoch. `clock_timestamp()` (not `now()`) so the
/// value is the real time of the statement, not the start of the transaction.
macro_rules! now_ms {
    () => {
        "(extract(epoch from clock_timestamp()) * 1000)::bigint"
    };
}
pub(crate) use now_ms;

/// Reads the database clock.
pub(crate) async fn now(conn: &mut PgConnection) -> Result<i64, StoreError> {
    let row = sqlx::query(concat!("SELECT ", now_ms!(), " AS now"))
        .fetch_one(&mut *conn)
        .await
        .map_err(db)?;
    get(&row, "now")
}

/// Begins a read-only `REPEATABLE READ` transaction: every statement in it sees one
/// snapshot, so a session's head and the rows it counts agree.
pub(crate) async fn begin_snapshot(
    pool: &PgPool,
) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, StoreError> {
    let mut tx = pool.begin().await.map_err(db)?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        .execute(&mut *tx)
        .await
        .map_err(db)?;
    Ok(tx)
}

/// A lease's length in ms (saturating).
pub(crate) fn ttl_ms(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX)
}

/// How a fenced write locks the session row until it commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lock {
    /// `FOR SHARE`: concurrent changes of existing journal rows of one session proceed;
    /// lease and head changes wait.
    Share,
    /// `FOR UPDATE`: the write changes the session row itself (its lease, status, or its
    /// head: a new journal row, checkpoint or resolution).
    Update,
}

/// What a fenced write learns about the session it locked.
#[derive(Debug, Clone)]
pub(crate) struct Locked {
    /// The database clock when the row was locked (read in the same round trip).
    pub(crate) now: i64,
    /// The latest checkpoint version.
    pub(crate) latest_version: i64,
    /// The session's app version.
    pub(crate) app_version: String,
    /// The session's head, checked.
    pub(crate) head: HeadRow,
}

/// Locks the session row and checks the fencing token. While the lock is held no lease
/// can change hands, so a write that passed the check commits before any new holder's.
///
/// Also reads the session's head and checks its seal: a writer that cannot check it
/// (another key signs the store, or the row was changed) writes nothing. A write that
/// changes the head (a new journal row, checkpoint or resolution) needs [`Lock::Update`].
pub(crate) async fn lock_fenced(
    conn: &mut PgConnection,
    ring: &Keyring,
    fence: Fence<'_>,
    lock: Lock,
) -> Result<Locked, StoreError> {
    // The clock is read in the same statement: one round trip less per journal write.
    let sql = match lock {
        Lock::Share => concat!(
            "SELECT fence, app_version, ",
            now_ms!(),
            " AS now FROM durable_sessions WHERE id = $1 FOR SHARE"
        ),
        Lock::Update => concat!(
            "SELECT fence, app_version, ",
            now_ms!(),
            " AS now FROM durable_sessions WHERE id = $1 FOR UPDATE"
        ),
    };
    let row = sqlx::query(sql)
        .bind(fence.session.as_str())
        .fetch_optional(&mut *conn)
        .await
        .map_err(db)?
        .ok_or_else(|| StoreError::SessionNotFound(fence.session.clone()))?;
    let current: i64 = get(&row, "fence")?;
    if current != fence.token {
        return Err(StoreError::LeaseLost {
            session: fence.session.clone(),
            token: fence.token,
        });
    }
    // The head is read by a statement of its own, after the lock is held: a statement
    // that waited for the lock sees the session row as committed by the writer it waited
    // for, but the rest of its snapshot (that writer's new checkpoint) from before.
    let head = seal::checked_head(&mut *conn, ring, fence.session).await?;
    Ok(Locked {
        now: get(&row, "now")?,
        latest_version: head.latest_version,
        app_version: get(&row, "app_version")?,
        head,
    })
}

/// Reads a session row (optionally locking it).
pub(crate) async fn session(
    conn: &mut PgConnection,
    id: &SessionId,
    lock: Option<Lock>,
) -> Result<SessionRecord, StoreError> {
    let sql = match lock {
        None => concat!(
            "SELECT ",
            session_cols!(),
            " FROM durable_sessions WHERE id = $1"
        ),
        Some(Lock::Share) => concat!(
            "SELECT ",
            session_cols!(),
            " FROM durable_sessions WHERE id = $1 FOR SHARE"
        ),
        Some(Lock::Update) => concat!(
            "SELECT ",
            session_cols!(),
            " FROM durable_sessions WHERE id = $1 FOR UPDATE"
        ),
    };
    let row = sqlx::query(sql)
        .bind(id.as_str())
        .fetch_optional(&mut *conn)
        .await
        .map_err(db)?
        .ok_or_else(|| StoreError::SessionNotFound(id.clone()))?;
    rows::session(&row)
}

/// Where a session's transcript and checkpoint chain end: what the next checkpoint
/// continues from.
#[derive(Debug, Clone, Default)]
pub(crate) struct Tail {
    /// The latest checkpoint's version (`None`: before version 0).
    pub(crate) version: Option<i64>,
    /// The last message's position (0: none).
    pub(crate) last_seq: i64,
    /// Messages in the transcript.
    pub(crate) message_count: i64,
    /// The last message's seal (`""`: none).
    pub(crate) message_seal: String,
    /// The latest checkpoint's seal (`""`: none, before version 0).
    pub(crate) checkpoint_seal: String,
}

/// The tail of checkpoint `version` of a session: its transcript's end and its seal.
pub(crate) async fn tail(
    conn: &mut PgConnection,
    session: &SessionId,
    version: i64,
) -> Result<Tail, StoreError> {
    let row = sqlx::query(
        "SELECT k.last_seq, k.message_count, k.seal, m.seal AS message_seal, \
                m.seq IS NOT NULL AS message_found \
         FROM durable_checkpoints k \
         LEFT JOIN durable_messages m ON m.session_id = k.session_id AND m.seq = k.last_seq \
         WHERE k.session_id = $1 AND k.version = $2",
    )
    .bind(session.as_str())
    .bind(version)
    .fetch_optional(&mut *conn)
    .await
    .map_err(db)?
    .ok_or_else(|| StoreError::Tampered {
        session: session.clone(),
        what: format!("checkpoint {version}"),
        detail: "it is missing".to_owned(),
    })?;
    let last_seq: i64 = get(&row, "last_seq")?;
    if last_seq > 0 && !get::<bool>(&row, "message_found")? {
        return Err(StoreError::Tampered {
            session: session.clone(),
            what: format!("message {last_seq}"),
            detail: "it is missing from the transcript".to_owned(),
        });
    }
    Ok(Tail {
        version: Some(version),
        last_seq,
        message_count: get(&row, "message_count")?,
        message_seal: get::<Option<String>>(&row, "message_seal")?.unwrap_or_default(),
        checkpoint_seal: get::<Option<String>>(&row, "seal")?.unwrap_or_default(),
    })
}

/// Appends `messages` to a session's log after `tail`, each sealed and chained to the
/// one before; moves `tail` to the new end.
async fn append_messages(
    conn: &mut PgConnection,
    ring: &Keyring,
    session: &SessionId,
    tail: &mut Tail,
    messages: &[Value],
    now: i64,
) -> Result<(), StoreError> {
    if messages.is_empty() {
        return Ok(());
    }
    let texts: Vec<String> = messages.iter().map(Value::to_string).collect();
    let mut seals = Vec::with_capacity(texts.len());
    for (i, text) in texts.iter().enumerate() {
        let seq = tail.last_seq + 1 + i as i64;
        tail.message_seal = seal::seal_message(ring, session, seq, text, &tail.message_seal)?;
        seals.push(tail.message_seal.clone());
    }
    sqlx::query(
        "INSERT INTO durable_messages (session_id, seq, message, format, created_at, seal)
         SELECT $1, $2 + t.ord, t.message, $3, $4, t.seal
         FROM unnest($5::text[], $6::text[]) WITH ORDINALITY AS t(message, seal, ord)",
    )
    .bind(session.as_str())
    .bind(tail.last_seq)
    .bind(FORMAT_VERSION)
    .bind(now)
    .bind(&texts)
    .bind(&seals)
    .execute(&mut *conn)
    .await
    .map_err(db)?;
    tail.last_seq += texts.len() as i64;
    tail.message_count += texts.len() as i64;
    Ok(())
}

/// The stored form of a checkpoint row.
pub(crate) struct CheckpointRow<'a> {
    pub(crate) session: &'a SessionId,
    pub(crate) version: i64,
    pub(crate) last_seq: i64,
    pub(crate) message_count: i64,
    pub(crate) plan: String,
    pub(crate) budget: String,
    pub(crate) state: String,
    pub(crate) app_version: &'a str,
    pub(crate) format: i32,
    /// Its seal (`None` for a copy that is re-sealed afterwards, as a fork's).
    pub(crate) seal: Option<String>,
}

/// Inserts a checkpoint row. A primary-key collision means another writer got the
/// version first: [`StoreError::VersionConflict`].
pub(crate) async fn insert_checkpoint(
    conn: &mut PgConnection,
    row: CheckpointRow<'_>,
    now: i64,
) -> Result<CheckpointMeta, StoreError> {
    let result = sqlx::query(concat!(
        "INSERT INTO durable_checkpoints (session_id, version, last_seq, message_count, plan, \
         budget, state, app_version, format, created_at, seal) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) RETURNING ",
        checkpoint_meta_cols!()
    ))
    .bind(row.session.as_str())
    .bind(row.version)
    .bind(row.last_seq)
    .bind(row.message_count)
    .bind(&row.plan)
    .bind(&row.budget)
    .bind(&row.state)
    .bind(row.app_version)
    .bind(row.format)
    .bind(now)
    .bind(&row.seal)
    .fetch_one(&mut *conn)
    .await;
    match result {
        Ok(r) => rows::checkpoint_meta(&r),
        Err(e) if unique_violation(&e).is_some() => Err(StoreError::VersionConflict {
            session: row.session.clone(),
            expected: row.version - 1,
            actual: row.version,
        }),
        Err(e) => Err(db(e)),
    }
}

/// Appends `checkpoint`'s messages after `tail` and inserts the checkpoint after
/// `tail`'s, whose transcript ends with them, all sealed (messages chained to the log's
/// last message, the checkpoint to the previous version's seal in `tail`). Moves `tail`
/// to the new checkpoint.
pub(crate) async fn insert_sealed_checkpoint(
    conn: &mut PgConnection,
    ring: &Keyring,
    session: &SessionId,
    app_version: &str,
    tail: &mut Tail,
    checkpoint: &NewCheckpoint,
    now: i64,
) -> Result<CheckpointMeta, StoreError> {
    let version = tail.version.map_or(0, |v| v + 1);
    append_messages(conn, ring, session, tail, &checkpoint.messages, now).await?;
    let (plan, budget, state) = (
        checkpoint.plan.to_string(),
        checkpoint.budget.to_string(),
        checkpoint.state.to_string(),
    );
    let sealed = RawCheckpoint {
        session,
        version,
        last_seq: tail.last_seq,
        message_count: tail.message_count,
        last_message_seal: &tail.message_seal,
        plan: &plan,
        budget: &budget,
        state: &state,
        app_version,
        previous: &tail.checkpoint_seal,
    }
    .seal(ring)?;
    let meta = insert_checkpoint(
        conn,
        CheckpointRow {
            session,
            version,
            last_seq: tail.last_seq,
            message_count: tail.message_count,
            plan,
            budget,
            state,
            app_version,
            format: FORMAT_VERSION,
            seal: Some(sealed.clone()),
        },
        now,
    )
    .await?;
    tail.checkpoint_seal = sealed;
    tail.version = Some(version);
    Ok(meta)
}

/// Compare-and-set append of checkpoint `expected + 1` to a session locked `FOR UPDATE`
/// by [`lock_fenced`]: messages, checkpoint row, session row with its re-sealed head.
pub(crate) async fn append_checkpoint(
    conn: &mut PgConnection,
    ring: &Keyring,
    session: &SessionId,
    locked: &mut Locked,
    expected: i64,
    checkpoint: NewCheckpoint,
    now: i64,
) -> Result<CheckpointMeta, StoreError> {
    if locked.latest_version != expected {
        return Err(StoreError::VersionConflict {
            session: session.clone(),
            expected,
            actual: locked.latest_version,
        });
    }
    let version = expected + 1;
    let mut tail = tail(conn, session, expected).await?;
    let meta = insert_sealed_checkpoint(
        conn,
        ring,
        session,
        &locked.app_version,
        &mut tail,
        &checkpoint,
        now,
    )
    .await?;
    locked.latest_version = version;
    locked.head.latest_version = version;
    locked.head.checkpoint_seal = tail.checkpoint_seal;
    locked.head.seal(ring)?;
    sqlx::query(
        "UPDATE durable_sessions
         SET latest_version = $2, recovery_attempts = 0, updated_at = $3, head = $4
         WHERE id = $1",
    )
    .bind(session.as_str())
    .bind(version)
    .bind(now)
    .bind(locked.head.head.as_deref())
    .execute(&mut *conn)
    .await
    .map_err(db)?;
    Ok(meta)
}

/// What a locked session row says about the lease that is being taken over.
pub(crate) struct Previous {
    /// Recoveries counted since the last checkpoint.
    pub(crate) recovery_attempts: i32,
    /// Whether the previous lease was never given up (`lease_owner` is still set: it
    /// expired, or its owner is taking it back after a restart). Taking it over is a
    /// recovery.
    pub(crate) unreleased: bool,
}

/// What [`take_lease`] did.
pub(crate) enum Taken {
    /// The lease is `owner`'s.
    Granted(Lease),
    /// The take-over was a recovery beyond the bound: the session is parked instead.
    Parked {
        /// The recoveries counted before this one.
        attempts: i32,
    },
}

/// Gives the lease on a locked session row to `owner` until `now + ttl`, bumping the
/// fencing token: the one place a lease is taken over, for `acquire_lease` and
/// `claim_expired` alike, so both count recoveries by one rule. Taking over an unreleased
/// lease is a recovery and counts an attempt; when `max_attempts` are already counted the
/// session is parked instead (reason recorded, lease cleared, token bumped so a
/// straggler loses it).
pub(crate) async fn take_lease(
    conn: &mut PgConnection,
    id: &SessionId,
    owner: &str,
    previous: &Previous,
    now: i64,
    ttl: Duration,
    max_attempts: i32,
) -> Result<Taken, StoreError> {
    let attempts = previous.recovery_attempts;
    if previous.unreleased && attempts >= max_attempts {
        sqlx::query(
            "UPDATE durable_sessions
             SET status = 'parked', status_reason = $2, lease_owner = NULL,
                 lease_expires_at = NULL, fence = fence + 1, updated_at = $3
             WHERE id = $1",
        )
        .bind(id.as_str())
        .bind(format!("recovery attempts exhausted ({attempts})"))
        .bind(now)
        .execute(&mut *conn)
        .await
        .map_err(db)?;
        tracing::warn!(session = %id, attempts, "parked session: recovery attempts exhausted");
        return Ok(Taken::Parked { attempts });
    }
    let expires = now.saturating_add(ttl_ms(ttl));
    let row = sqlx::query(
        "UPDATE durable_sessions
         SET fence = fence + 1, lease_owner = $2, lease_expires_at = $3, updated_at = $4,
             recovery_attempts = recovery_attempts + CASE WHEN $5 THEN 1 ELSE 0 END
         WHERE id = $1 RETURNING fence",
    )
    .bind(id.as_str())
    .bind(owner)
    .bind(expires)
    .bind(now)
    .bind(previous.unreleased)
    .fetch_one(&mut *conn)
    .await
    .map_err(db)?;
    Ok(Taken::Granted(Lease {
        session: id.clone(),
        owner: owner.to_owned(),
        fence: get(&row, "fence")?,
        expires_at: expires,
    }))
}
