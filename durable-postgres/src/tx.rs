//! Building blocks of every transaction: the database clock, snapshot reads, reading a
//! session row and locking it to check a write's fencing token.

use std::time::Duration;

use durable_core::StoreError;
use durable_core::ids::SessionId;
use durable_core::integrity::Keyring;
use durable_core::store::{Fence, SessionRecord};
use sqlx::postgres::{PgConnection, PgPool};

use crate::error::db;
use crate::rows::{self, get, session_cols};
use crate::seal::{self, HeadRow};

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
