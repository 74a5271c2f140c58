//! Building blocks of every transaction: the database clock, snapshot reads, reading a
//! session row and locking it to check a write's fencing token.

use std::time::Duration;

use durable_core::StoreError;
use durable_core::ids::SessionId;
use durable_core::integrity::Keyring;
use durable_core::store::{Fence, SessionRecord};
use sqlx::Transaction;
use sqlx::postgres::{PgConnection, PgPool, PgRow, Postgres};

use crate::error::db;
use crate::rows::{self, get, session_cols};
use crate::seal::{self, HeadRow, Tail};

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

/// Reads the database clock and, in the same statement, notifies idle worker pools
/// (`NOTIFY durable_work`, delivered when the caller's transaction commits; see
/// [`notify`](crate::notify)): for the writes that can make a session claimable and read
/// the clock anyway.
pub(crate) async fn now_notifying(conn: &mut PgConnection) -> Result<i64, StoreError> {
    let row = sqlx::query(concat!(
        "SELECT ",
        now_ms!(),
        " AS now, ",
        crate::notify::pg_notify!()
    ))
    .fetch_one(&mut *conn)
    .await
    .map_err(db)?;
    get(&row, "now")
}

/// Begins a transaction on a pooled connection.
///
/// The pool does not ping a connection before handing it out (one round trip less per
/// write; see `PostgresStore::connect_with`), so a connection the server dropped while it
/// sat idle (a restart, an idle timeout) is found dead by this `BEGIN`. Nothing was sent
/// but the `BEGIN`, so it is retried on another connection, at most once per connection
/// the pool holds (each dead one fails once: the pool closes it when it fails its
/// release check) and once more on a new one.
pub(crate) async fn begin(pool: &PgPool) -> Result<Transaction<'static, Postgres>, StoreError> {
    begin_retrying(pool, None).await
}

/// Begins a read-only `REPEATABLE READ` transaction: every statement in it sees one
/// snapshot, so a session's head and the rows it counts agree. (The isolation level is
/// set by the `BEGIN` itself: no round trip of its own.) Retried as [`begin`].
pub(crate) async fn begin_snapshot(
    pool: &PgPool,
) -> Result<Transaction<'static, Postgres>, StoreError> {
    begin_retrying(
        pool,
        Some("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY"),
    )
    .await
}

async fn begin_retrying(
    pool: &PgPool,
    statement: Option<&'static str>,
) -> Result<Transaction<'static, Postgres>, StoreError> {
    let mut tries = pool.size() + 1;
    loop {
        let begun = match statement {
            None => pool.begin().await,
            Some(begin) => pool.begin_with(begin).await,
        };
        match begun {
            Err(e) if tries > 1 && connection_lost(&e) => tries -= 1,
            other => return other.map_err(|e| crate::error::pool_error(pool, e)),
        }
    }
}

/// Runs a read of one statement on the pool, retried as [`begin`] when the connection it
/// got was dead (a read changes nothing, so running it again is safe).
pub(crate) async fn read<T, F, Fut>(pool: &PgPool, read: F) -> Result<T, StoreError>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<T, sqlx::Error>>,
{
    let mut tries = pool.size() + 1;
    loop {
        match read().await {
            Err(e) if tries > 1 && connection_lost(&e) => tries -= 1,
            other => return other.map_err(|e| crate::error::pool_error(pool, e)),
        }
    }
}

/// Whether `e` says the connection is gone (rather than that the statement failed):
/// an I/O or protocol error, or the server shutting the session down (SQLSTATE class 57P,
/// `admin_shutdown`, `crash_shutdown`, `cannot_connect_now`).
fn connection_lost(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) | sqlx::Error::Protocol(_) => true,
        sqlx::Error::Database(d) => d.code().is_some_and(|c| c.starts_with("57P")),
        _ => false,
    }
}

/// A lease's length in ms (saturating).
pub(crate) fn ttl_ms(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX)
}

/// How a fenced write locks the session row until it commits. (Since schema 4 every
/// fenced write changes the head, or the lease: a finished or re-issued row changes the
/// head's count of issued rows, so no write takes a shared lock any more.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lock {
    /// `FOR NO KEY UPDATE`: the write changes the session row itself (its lease, status,
    /// or its head: a new journal row, checkpoint or resolution), never its key, so
    /// foreign-key checks of other sessions' rows are not blocked.
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
    /// Where the latest checkpoint's transcript ends, when asked for ([`Want::tail`]) and
    /// read in the locking statement. `None`: read it with `checkpoints::tail`.
    pub(crate) tail: Option<Tail>,
}

/// What [`lock_fenced`] reads besides the fence and the head.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Want {
    /// The tail of the latest checkpoint (a checkpoint write continues from it).
    pub(crate) tail: bool,
}

/// The columns of the locking statement, from `durable_sessions s`: the fence, the app
/// version, the database clock and the head.
macro_rules! locked_cols {
    () => {
        concat!(
            "s.fence AS session_fence, s.app_version, ",
            $crate::tx::now_ms!(),
            " AS now, ",
            $crate::seal::head_cols!()
        )
    };
}
pub(crate) use locked_cols;

/// The latest checkpoint's tail, from `durable_sessions s` (see [`Want::tail`]).
macro_rules! tail_cols {
    () => {
        ", (SELECT k.last_seq FROM durable_checkpoints k \
            WHERE k.session_num = s.num AND k.version = s.latest_version) AS tail_last_seq, \
           (SELECT k.message_count FROM durable_checkpoints k \
            WHERE k.session_num = s.num AND k.version = s.latest_version) AS tail_message_count, \
           (SELECT m.seal FROM durable_messages m WHERE m.session_num = s.num \
              AND m.seq = (SELECT k.last_seq FROM durable_checkpoints k \
                WHERE k.session_num = s.num AND k.version = s.latest_version)) \
             AS tail_message_seal"
    };
}
pub(crate) use tail_cols;

/// Locks the session row and checks the fencing token. While the lock is held no lease
/// can change hands, so a write that passed the check commits before any new holder's.
///
/// Also reads the session's head and checks its seal: a writer that cannot check it
/// (another key signs the store, or the row was changed) writes nothing. A write that
/// changes the head (a new journal row, checkpoint or resolution) needs [`Lock::Update`].
///
/// One round trip: the fence, the clock, the head (and with [`Want::tail`] the latest
/// checkpoint's tail) are read by the locking statement.
pub(crate) async fn lock_fenced(
    conn: &mut PgConnection,
    ring: &Keyring,
    fence: Fence<'_>,
    lock: Lock,
    want: Want,
) -> Result<Locked, StoreError> {
    let sql = match (lock, want.tail) {
        (Lock::Update, false) => concat!(
            "SELECT ",
            locked_cols!(),
            " FROM durable_sessions s WHERE s.id = $1 FOR NO KEY UPDATE"
        ),
        (Lock::Update, true) => concat!(
            "SELECT ",
            locked_cols!(),
            tail_cols!(),
            " FROM durable_sessions s WHERE s.id = $1 FOR NO KEY UPDATE"
        ),
    };
    let row = sqlx::query(sql)
        .bind(fence.session.as_str())
        .fetch_optional(&mut *conn)
        .await
        .map_err(db)?
        .ok_or_else(|| StoreError::SessionNotFound(fence.session.clone()))?;
    locked_from_row(conn, ring, fence, &row, want).await
}

/// Checks the fence of a row selected with [`locked_cols!`] (and, with [`Want::tail`],
/// the tail columns) and its head.
///
/// A statement that waited for the lock sees the session row as committed by the writer
/// it waited for, but the rest of its snapshot (that writer's new checkpoint, read by the
/// head's subquery) from before: the head then fails its check, and is read again by a
/// statement of its own, which sees that writer's rows. A head that passes was read
/// whole from one state: its checkpoint seal is the sealed one, so the checkpoint (and
/// the transcript it ends) were visible to the statement too.
pub(crate) async fn locked_from_row(
    conn: &mut PgConnection,
    ring: &Keyring,
    fence: Fence<'_>,
    row: &PgRow,
    want: Want,
) -> Result<Locked, StoreError> {
    let current: i64 = get(row, "session_fence")?;
    if current != fence.token {
        return Err(StoreError::LeaseLost {
            session: fence.session.clone(),
            token: fence.token,
        });
    }
    let head = seal::head_from_row(row, fence.session)?;
    let (head, tail) = if head.check(ring).is_ok() {
        let tail = if want.tail {
            read_tail(row, &head)?
        } else {
            None
        };
        (head, tail)
    } else {
        (
            seal::checked_head(&mut *conn, ring, fence.session).await?,
            None,
        )
    };
    Ok(Locked {
        now: get(row, "now")?,
        latest_version: head.latest_version,
        app_version: get(row, "app_version")?,
        head,
        tail,
    })
}

/// The tail read beside a checked head; `None` when a part is missing (the caller reads
/// it again, and reports what is missing).
pub(crate) fn read_tail(row: &PgRow, head: &HeadRow) -> Result<Option<Tail>, StoreError> {
    let last_seq: Option<i64> = get(row, "tail_last_seq")?;
    let message_count: Option<i64> = get(row, "tail_message_count")?;
    let message_seal: Option<String> = get(row, "tail_message_seal")?;
    let (Some(last_seq), Some(message_count)) = (last_seq, message_count) else {
        return Ok(None);
    };
    let message_seal = match message_seal {
        Some(seal) => seal,
        None if last_seq == 0 => String::new(),
        None => return Ok(None),
    };
    Ok(Some(Tail {
        version: Some(head.latest_version),
        last_seq,
        message_count,
        message_seal,
        checkpoint_seal: head.checkpoint_seal.clone(),
    }))
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
