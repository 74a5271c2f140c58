//! Building blocks of every transaction: the write-transaction guard, the database
//! clock, reading a session row and checking a write's fencing token.
//!
//! Every write runs inside `BEGIN IMMEDIATE`: the write lock is taken up front, so a
//! writer that has to wait (another process holds the lock) waits in SQLite's busy
//! handler, up to the busy timeout, instead of failing with `SQLITE_BUSY` when a
//! deferred transaction tries to upgrade its read lock. The guard guarantees that a
//! connection never goes back to the pool with a transaction open.

use std::time::Duration;

use durable_core::integrity::Keyring;
use durable_core::store::{Fence, SessionRecord};
use durable_core::{SessionId, StoreError};
use sqlx::pool::PoolConnection;
use sqlx::query::Query;
use sqlx::sqlite::{SqliteArguments, SqliteQueryResult, SqliteRow};
use sqlx::{Sqlite, SqliteConnection, SqlitePool};

/// A query on SQLite with its parameters.
pub(crate) type SqliteQuery<'q> = Query<'q, Sqlite, SqliteArguments>;

use crate::error::{Pool, acquire, db};
use crate::rows::{self, session_cols};
use crate::seal::{self, HeadRow, head_cols};

/// The database clock in ms since the Unix epoch, as an SQL expression literal (every
/// time a store writes is the database's, so leases mean the same to every worker). `ROUND` keeps the float arithmetic of `julianday` from truncating a
/// whole millisecond away. A macro so that it can be `concat!`ed into `&'static str` SQL.
macro_rules! now_sql {
    () => {
        "CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)"
    };
}
pub(crate) use now_sql;

/// Reads the database clock.
pub(crate) async fn now(conn: &mut SqliteConnection) -> Result<i64, StoreError> {
    sqlx::query_scalar::<_, i64>(concat!("SELECT ", now_sql!()))
        .fetch_one(conn)
        .await
        .map_err(db)
}

/// Reads the database clock on a connection of `pool`, which goes back to the pool
/// before this returns.
pub(crate) async fn clock(pool: &SqlitePool) -> Result<i64, StoreError> {
    let mut conn = acquire(pool, Pool::Reader).await?;
    now(&mut conn).await
}

/// A duration in whole milliseconds, saturating at `i64::MAX`.
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// An open `BEGIN IMMEDIATE` transaction on a pooled connection.
///
/// End it with [`finish`](Self::finish): `Ok` commits, `Err` rolls back. If the guard is
/// dropped while the transaction may still be open (the future was cancelled, or
/// `ROLLBACK` itself failed), the connection is closed instead of returned to the pool;
/// closing a SQLite connection rolls its open transaction back.
pub(crate) struct WriteTx {
    conn: PoolConnection<Sqlite>,
    /// Whether a transaction may be open on `conn`.
    open: bool,
    /// The database clock, read once at the start of the transaction.
    pub(crate) now: i64,
}

impl WriteTx {
    /// Acquires a connection and begins an immediate transaction.
    pub(crate) async fn begin(pool: &SqlitePool) -> Result<Self, StoreError> {
        let conn = acquire(pool, Pool::Writer).await?;
        // `open` is set before BEGIN is sent: if this future is dropped mid-statement we
        // cannot know whether BEGIN ran, so the connection must not be reused.
        let mut tx = WriteTx {
            conn,
            open: true,
            now: 0,
        };
        if let Err(e) = sqlx::query("BEGIN IMMEDIATE").execute(&mut *tx.conn).await {
            // A failed BEGIN (e.g. busy timeout elapsed) leaves no transaction open.
            tx.open = false;
            return Err(db(e));
        }
        match now(&mut tx.conn).await {
            Ok(now) => {
                tx.now = now;
                Ok(tx)
            }
            Err(e) => {
                tx.rollback().await;
                Err(e)
            }
        }
    }

    /// Begins an immediate transaction and runs one `SELECT` in the same round trip to
    /// SQLite's worker thread: `sql` is `BEGIN IMMEDIATE; SELECT …` (selecting the
    /// database clock as `now`), its parameters bound by `bind`. Returns the transaction
    /// (its clock read from the row) and the row, if any.
    pub(crate) async fn begin_select<'q>(
        pool: &SqlitePool,
        session: &SessionId,
        sql: &'static str,
        bind: impl FnOnce(SqliteQuery<'q>) -> SqliteQuery<'q>,
    ) -> Result<(Self, Option<SqliteRow>), StoreError> {
        debug_assert!(sql.starts_with("BEGIN IMMEDIATE; SELECT "));
        let conn = acquire(pool, Pool::Writer).await?;
        // As in `begin`: from here on a transaction may be open.
        let mut tx = WriteTx {
            conn,
            open: true,
            now: 0,
        };
        let row = match bind(sqlx::query(sql)).fetch_optional(&mut *tx.conn).await {
            Ok(row) => row,
            Err(e) => {
                // BEGIN may have failed (nothing open) or the SELECT after it.
                tx.rollback_if_open().await;
                return Err(db(e));
            }
        };
        if let Some(row) = &row {
            match rows::col(row, "now", session, None) {
                Ok(now) => tx.now = now,
                Err(e) => {
                    tx.rollback().await;
                    return Err(e);
                }
            }
        }
        Ok((tx, row))
    }

    /// Begins an immediate transaction and reads the fenced session in the same round
    /// trip to SQLite's worker thread: `sql` is [`fenced_select!`]'s, `bind` binds the
    /// extra columns' parameters; the session id is bound last. The database clock is
    /// read by the same statement.
    ///
    /// Returns the transaction, the checked write credential and the row (for the extra
    /// columns). [`StoreError::SessionNotFound`] or [`StoreError::LeaseLost`] (or a head
    /// that does not check) rolls the transaction back.
    pub(crate) async fn begin_fenced<'q>(
        pool: &SqlitePool,
        ring: &Keyring,
        fence: Fence<'q>,
        sql: &'static str,
        bind: impl FnOnce(SqliteQuery<'q>) -> SqliteQuery<'q>,
    ) -> Result<(Self, Fenced, SqliteRow), StoreError> {
        let (tx, row) = Self::begin_select(pool, fence.session, sql, |q| {
            bind(q).bind(fence.session.as_str())
        })
        .await?;
        let checked = row
            .ok_or_else(|| StoreError::SessionNotFound(fence.session.clone()))
            .and_then(|row| Ok((fenced_row(&row, ring, fence)?, row)));
        match checked {
            Ok((fenced, row)) => Ok((tx, fenced, row)),
            Err(e) => tx.finish(Err(e)).await,
        }
    }

    /// Runs `query`, whose last statement is `COMMIT`, in one round trip: the
    /// transaction's last writes and its commit. On an error the transaction is rolled
    /// back (no statement after the failing one ran).
    pub(crate) async fn commit_with(
        mut self,
        query: SqliteQuery<'_>,
    ) -> Result<SqliteQueryResult, StoreError> {
        match query.execute(&mut *self.conn).await {
            Ok(done) => {
                self.open = false;
                Ok(done)
            }
            Err(e) => {
                self.rollback().await;
                Err(db(e))
            }
        }
    }

    /// The connection the transaction runs on.
    pub(crate) fn conn(&mut self) -> &mut SqliteConnection {
        &mut self.conn
    }

    /// Commits when `result` is `Ok`, rolls back when it is `Err`; returns `result`
    /// (or the commit error).
    pub(crate) async fn finish<T>(
        mut self,
        result: Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        match result {
            Ok(value) => match sqlx::query("COMMIT").execute(&mut *self.conn).await {
                Ok(_) => {
                    self.open = false;
                    Ok(value)
                }
                Err(e) => {
                    self.rollback().await;
                    Err(db(e))
                }
            },
            Err(e) => {
                self.rollback().await;
                Err(e)
            }
        }
    }

    /// Rolls back after a failed `BEGIN IMMEDIATE; …` round trip, where it is not known
    /// whether `BEGIN` ran: SQLite's "no transaction is active" means nothing is open.
    async fn rollback_if_open(&mut self) {
        if roll_back(&mut self.conn).await != RolledBack::Failed {
            self.open = false;
        }
    }

    async fn rollback(&mut self) {
        match sqlx::query("ROLLBACK").execute(&mut *self.conn).await {
            Ok(_) => self.open = false,
            Err(error) => {
                // Leave `open` set: Drop closes the connection, which rolls back.
                tracing::warn!(%error, "sqlite ROLLBACK failed; closing the connection");
            }
        }
    }
}

impl Drop for WriteTx {
    fn drop(&mut self) {
        if self.open {
            self.conn.close_on_drop();
        }
    }
}

/// How a `ROLLBACK` ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RolledBack {
    /// A transaction was open and is rolled back.
    Done,
    /// No transaction was open (a `BEGIN` that failed, or SQLite rolled back itself).
    NothingOpen,
    /// `ROLLBACK` failed: the connection must be closed, not pooled.
    Failed,
}

/// Rolls back whatever transaction `conn` has open, if any.
pub(crate) async fn roll_back(conn: &mut SqliteConnection) -> RolledBack {
    match sqlx::query("ROLLBACK").execute(conn).await {
        Ok(_) => RolledBack::Done,
        Err(sqlx::Error::Database(e)) if e.message().contains("no transaction is active") => {
            RolledBack::NothingOpen
        }
        Err(error) => {
            tracing::warn!(%error, "sqlite ROLLBACK failed; closing the connection");
            RolledBack::Failed
        }
    }
}

/// A read transaction (one snapshot across statements) on a pooled connection, begun
/// with its first `SELECT` in one round trip and ended with its last `SELECT` in another:
/// `BEGIN; SELECT …`, then `SELECT …; COMMIT`. Dropped while open (a cancelled future,
/// a failed statement), its connection is closed rather than returned to the pool.
pub(crate) struct ReadTx {
    conn: PoolConnection<Sqlite>,
    open: bool,
}

impl ReadTx {
    /// Runs `query` (`BEGIN; SELECT …`) and returns its rows.
    pub(crate) async fn begin_with(
        pool: &SqlitePool,
        query: SqliteQuery<'_>,
    ) -> Result<(Self, Vec<SqliteRow>), StoreError> {
        let conn = acquire(pool, Pool::Reader).await?;
        let mut tx = ReadTx { conn, open: true };
        match query.fetch_all(&mut *tx.conn).await {
            Ok(rows) => Ok((tx, rows)),
            Err(e) => {
                tx.rollback().await;
                Err(db(e))
            }
        }
    }

    /// Runs `query` (`SELECT …; COMMIT`) and returns its rows.
    pub(crate) async fn finish_with(
        mut self,
        query: SqliteQuery<'_>,
    ) -> Result<Vec<SqliteRow>, StoreError> {
        match query.fetch_all(&mut *self.conn).await {
            Ok(rows) => {
                self.open = false;
                Ok(rows)
            }
            Err(e) => {
                self.rollback().await;
                Err(db(e))
            }
        }
    }

    /// Ends the transaction early (an error found in the first rows).
    pub(crate) async fn rollback(&mut self) {
        if roll_back(&mut self.conn).await != RolledBack::Failed {
            self.open = false;
        }
    }
}

impl Drop for ReadTx {
    fn drop(&mut self) {
        if self.open {
            self.conn.close_on_drop();
        }
    }
}

/// Reads a session row, or [`StoreError::SessionNotFound`].
pub(crate) async fn session(
    conn: &mut SqliteConnection,
    id: &SessionId,
) -> Result<SessionRecord, StoreError> {
    let row = sqlx::query(concat!(
        "SELECT ",
        session_cols!(),
        " FROM durable_sessions WHERE id = ?"
    ))
    .bind(id.as_str())
    .fetch_optional(conn)
    .await
    .map_err(db)?
    .ok_or_else(|| StoreError::SessionNotFound(id.clone()))?;
    rows::session(&row)
}

/// What a fenced write needs to know about its session.
pub(crate) struct Fenced {
    pub(crate) latest_version: i64,
    pub(crate) app_version: String,
    /// The session's head, checked.
    pub(crate) head: HeadRow,
}

/// The `SELECT` a fenced write starts with ([`crate::group::BatchConn::fenced`], or after
/// `BEGIN IMMEDIATE; ` in [`WriteTx::begin_fenced`]): the database clock (`now`), the session's fencing
/// token, app version and head, plus `$cols` (each starting with `, `) from
/// `durable_sessions s $join`, for the session bound last.
macro_rules! fenced_select {
    () => {
        $crate::tx::fenced_select!("", "")
    };
    ($cols:expr, $join:expr) => {
        concat!(
            "SELECT ",
            $crate::tx::now_sql!(),
            " AS now, s.fence, s.app_version, ",
            $crate::seal::head_cols!(),
            $cols,
            " FROM durable_sessions s",
            $join,
            " WHERE s.id = ?"
        )
    };
}
pub(crate) use fenced_select;

/// Checks the write credential of a session row selected with [`fenced_select!`] (or
/// `fenced`'s own query).
pub(crate) fn fenced_row(
    row: &SqliteRow,
    ring: &Keyring,
    fence: Fence<'_>,
) -> Result<Fenced, StoreError> {
    let current: i64 = rows::col(row, "fence", fence.session, None)?;
    if current != fence.token {
        return Err(StoreError::LeaseLost {
            session: fence.session.clone(),
            token: fence.token,
        });
    }
    let head = seal::head_from_row(row, fence.session)?;
    head.check(ring)?;
    Ok(Fenced {
        latest_version: head.latest_version,
        app_version: rows::col(row, "app_version", fence.session, None)?,
        head,
    })
}

/// Checks a write credential: [`StoreError::SessionNotFound`] or
/// [`StoreError::LeaseLost`] unless `fence.token` is the session's current token.
///
/// Also reads the session's head and checks its seal: a writer that cannot check it
/// (another key signs the store) writes nothing.
pub(crate) async fn fenced(
    conn: &mut SqliteConnection,
    ring: &Keyring,
    fence: Fence<'_>,
) -> Result<Fenced, StoreError> {
    let row = sqlx::query(concat!(
        "SELECT s.fence, s.app_version, ",
        head_cols!(),
        " FROM durable_sessions s WHERE s.id = ?"
    ))
    .bind(fence.session.as_str())
    .fetch_optional(conn)
    .await
    .map_err(db)?
    .ok_or_else(|| StoreError::SessionNotFound(fence.session.clone()))?;
    fenced_row(&row, ring, fence)
}
