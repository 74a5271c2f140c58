//! Building blocks that run inside one transaction: the clock, the fence check, and the
//! checkpoint append shared by `save_checkpoint`, `finish_call` and session creation.

use std::time::Duration;

use durable_core::StoreError;
use durable_core::ids::SessionId;
use durable_core::store::{
    CheckpointMeta, FORMAT_VERSION, Fence, Lease, NewCheckpoint, SessionRecord,
};
use serde_json::Value;
use sqlx::postgres::PgConnection;

use crate::error::{db, unique_violation};
use crate::rows::{self, checkpoint_meta_cols, get, session_cols};

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

/// A lease's length in ms (saturating).
pub(crate) fn ttl_ms(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX)
}

/// How a fenced write locks the session row until it commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lock {
    /// `FOR SHARE`: concurrent journal writes of one session proceed; lease changes wait.
    Share,
    /// `FOR UPDATE`: the write changes the session row itself.
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
}

/// Locks the session row and checks the fencing token. While the lock is held no lease
/// can change hands, so a write that passed the check commits before any new holder's.
pub(crate) async fn lock_fenced(
    conn: &mut PgConnection,
    fence: Fence<'_>,
    lock: Lock,
) -> Result<Locked, StoreError> {
    // The clock is read in the same statement: one round trip less per journal write.
    let sql = match lock {
        Lock::Share => concat!(
            "SELECT fence, latest_version, app_version, ",
            now_ms!(),
            " AS now FROM durable_sessions WHERE id = $1 FOR SHARE"
        ),
        Lock::Update => concat!(
            "SELECT fence, latest_version, app_version, ",
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
    Ok(Locked {
        now: get(&row, "now")?,
        latest_version: get(&row, "latest_version")?,
        app_version: get(&row, "app_version")?,
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

/// Appends messages to a session's log after `after_seq`; returns the new last seq.
pub(crate) async fn append_messages(
    conn: &mut PgConnection,
    session: &SessionId,
    after_seq: i64,
    messages: &[Value],
    now: i64,
) -> Result<i64, StoreError> {
    if messages.is_empty() {
        return Ok(after_seq);
    }
    let texts: Vec<String> = messages.iter().map(Value::to_string).collect();
    sqlx::query(
        "INSERT INTO durable_messages (session_id, seq, message, format, created_at)
         SELECT $1, $2 + t.ord, t.message, $3, $4
         FROM unnest($5::text[]) WITH ORDINALITY AS t(message, ord)",
    )
    .bind(session.as_str())
    .bind(after_seq)
    .bind(FORMAT_VERSION)
    .bind(now)
    .bind(&texts)
    .execute(&mut *conn)
    .await
    .map_err(db)?;
    Ok(after_seq + texts.len() as i64)
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
         budget, state, app_version, format, created_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) RETURNING ",
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

/// Compare-and-set append of checkpoint `expected + 1` to a session locked `FOR UPDATE`
/// by [`lock_fenced`]: messages, checkpoint row, session row.
pub(crate) async fn append_checkpoint(
    conn: &mut PgConnection,
    session: &SessionId,
    locked: &Locked,
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
    let max_seq: i64 = get(
        &sqlx::query(
            "SELECT COALESCE(max(seq), 0) AS max_seq FROM durable_messages WHERE session_id = $1",
        )
        .bind(session.as_str())
        .fetch_one(&mut *conn)
        .await
        .map_err(db)?,
        "max_seq",
    )?;
    let last_seq = append_messages(conn, session, max_seq, &checkpoint.messages, now).await?;
    let message_count: i64 = get(
        &sqlx::query(
            "SELECT count(*) AS n FROM durable_messages WHERE session_id = $1 AND seq <= $2",
        )
        .bind(session.as_str())
        .bind(last_seq)
        .fetch_one(&mut *conn)
        .await
        .map_err(db)?,
        "n",
    )?;
    let meta = insert_checkpoint(
        conn,
        CheckpointRow {
            session,
            version: expected + 1,
            last_seq,
            message_count,
            plan: checkpoint.plan.to_string(),
            budget: checkpoint.budget.to_string(),
            state: checkpoint.state.to_string(),
            app_version: &locked.app_version,
            format: FORMAT_VERSION,
        },
        now,
    )
    .await?;
    sqlx::query(
        "UPDATE durable_sessions
         SET latest_version = $2, recovery_attempts = 0, updated_at = $3
         WHERE id = $1",
    )
    .bind(session.as_str())
    .bind(expected + 1)
    .bind(now)
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
