//! Signals: sent into a session, consumed once under the consumer's key.
//!
//! Every write goes through the one writer connection, so a send and a wait for a signal
//! are serialised: the wait sees the signal committed before it, and a send committed
//! after the wait sees its `waiting_for` and clears it.

use async_trait::async_trait;
use durable_core::store::{Fence, NewSignal, SignalRecord, SignalStore, waiting_for_signal};
use durable_core::{SessionId, StoreError};
use sqlx::sqlite::SqliteRow;
use sqlx::{Row, SqliteConnection};

use crate::SqliteStore;
use crate::error::db;
use crate::tx::{self, WriteTx};

/// `SELECT` of the columns [`record`] reads, in its order, from the signals.
macro_rules! select_signals {
    () => {
        "SELECT id, session_id, name, payload, sent_by, send_key, sent_at, consumed_by, \
         consumed_at FROM durable_signals WHERE "
    };
}

/// A signal row back as a record ([`SignalRecord::stored`]).
fn record(row: &SqliteRow) -> Result<SignalRecord, StoreError> {
    let payload: String = row.try_get(3).map_err(db)?;
    SignalRecord::stored(
        row.try_get(0).map_err(db)?,
        SessionId::new(row.try_get::<String, _>(1).map_err(db)?),
        row.try_get(2).map_err(db)?,
        &payload,
        row.try_get(4).map_err(db)?,
        row.try_get(5).map_err(db)?,
        row.try_get(6).map_err(db)?,
        (row.try_get(7).map_err(db)?, row.try_get(8).map_err(db)?),
    )
}

/// The first signal (by id) a `SELECT` of [`select_signals`] finds.
async fn one(
    conn: &mut SqliteConnection,
    sql: &'static str,
    binds: &[&str],
) -> Result<Option<SignalRecord>, StoreError> {
    let mut query = sqlx::query(sql);
    for bind in binds {
        query = query.bind(*bind);
    }
    query
        .fetch_optional(conn)
        .await
        .map_err(db)?
        .as_ref()
        .map(record)
        .transpose()
}

pub(crate) async fn send_signal(
    store: &SqliteStore,
    signal: &NewSignal,
) -> Result<SignalRecord, StoreError> {
    let payload = signal.payload_text()?;
    let mut tx = WriteTx::begin(store.writer()).await?;
    let now = tx.now;
    let result = async {
        let conn = tx.conn();
        let session = tx::session(&mut *conn, &signal.session).await?;
        if session.status.is_terminal() {
            return Err(StoreError::SessionEnded {
                session: signal.session.clone(),
                status: session.status.as_str().to_owned(),
            });
        }
        if let Some(key) = &signal.key
            && let Some(sent) = one(
                &mut *conn,
                concat!(select_signals!(), "session_id = ? AND send_key = ? LIMIT 1"),
                &[signal.session.as_str(), key],
            )
            .await?
        {
            return if sent.same_send(signal) {
                Ok(sent)
            } else {
                Err(sent.key_conflict())
            };
        }
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO durable_signals (session_id, name, payload, sent_by, send_key, sent_at) \
             VALUES (?, ?, ?, ?, ?, ?) RETURNING id",
        )
        .bind(signal.session.as_str())
        .bind(&signal.name)
        .bind(&payload)
        .bind(&signal.sent_by)
        .bind(signal.key.as_deref())
        .bind(now)
        .fetch_one(&mut *conn)
        .await
        .map_err(db)?;
        sqlx::query(
            "UPDATE durable_sessions SET waiting_for = NULL, waiting_until = NULL \
             WHERE id = ? AND waiting_for = ?",
        )
        .bind(signal.session.as_str())
        .bind(waiting_for_signal(&signal.name))
        .execute(&mut *conn)
        .await
        .map_err(db)?;
        Ok(SignalRecord::new(
            id,
            signal.session.clone(),
            signal.name.clone(),
            signal.payload.clone(),
            signal.sent_by.clone(),
            signal.key.clone(),
            now,
            None,
        ))
    }
    .await;
    tx.finish(result).await
}

pub(crate) async fn consume_signal(
    store: &SqliteStore,
    fence: Fence<'_>,
    name: &str,
    consumer: &str,
) -> Result<Option<SignalRecord>, StoreError> {
    let mut tx = WriteTx::begin(store.writer()).await?;
    let now = tx.now;
    let result = async {
        let conn = tx.conn();
        tx::fenced(&mut *conn, store.keyring(), fence).await?;
        let session = fence.session.as_str();
        if let Some(taken) = one(
            &mut *conn,
            concat!(
                select_signals!(),
                "session_id = ? AND consumed_by = ? LIMIT 1"
            ),
            &[session, consumer],
        )
        .await?
        {
            return Ok(Some(taken));
        }
        let Some(mut next) = one(
            &mut *conn,
            concat!(
                select_signals!(),
                "session_id = ? AND name = ? AND consumed_by IS NULL ORDER BY id LIMIT 1"
            ),
            &[session, name],
        )
        .await?
        else {
            return Ok(None);
        };
        sqlx::query("UPDATE durable_signals SET consumed_by = ?, consumed_at = ? WHERE id = ?")
            .bind(consumer)
            .bind(now)
            .bind(next.id)
            .execute(&mut *conn)
            .await
            .map_err(db)?;
        next.consumed_by = Some(consumer.to_owned());
        next.consumed_at = Some(now);
        Ok(Some(next))
    }
    .await;
    tx.finish(result).await
}

/// Whether a signal named `name` is pending for `session` (a wait's check, inside its
/// transaction).
pub(crate) async fn pending(
    conn: &mut SqliteConnection,
    session: &SessionId,
    name: &str,
) -> Result<bool, StoreError> {
    let found = sqlx::query(
        "SELECT 1 FROM durable_signals WHERE session_id = ? AND name = ? \
         AND consumed_by IS NULL LIMIT 1",
    )
    .bind(session.as_str())
    .bind(name)
    .fetch_optional(conn)
    .await
    .map_err(db)?;
    Ok(found.is_some())
}

pub(crate) async fn signals(
    store: &SqliteStore,
    session: &SessionId,
) -> Result<Vec<SignalRecord>, StoreError> {
    let mut conn = store.reader().acquire().await.map_err(db)?;
    tx::session(&mut conn, session).await?;
    sqlx::query(concat!(select_signals!(), "session_id = ? ORDER BY id"))
        .bind(session.as_str())
        .fetch_all(&mut *conn)
        .await
        .map_err(db)?
        .iter()
        .map(record)
        .collect()
}

#[async_trait]
impl SignalStore for SqliteStore {
    async fn send_signal(&self, signal: &NewSignal) -> Result<SignalRecord, StoreError> {
        let sent = send_signal(self, signal).await?;
        self.work_available();
        Ok(sent)
    }

    async fn consume_signal(
        &self,
        fence: Fence<'_>,
        name: &str,
        consumer: &str,
    ) -> Result<Option<SignalRecord>, StoreError> {
        consume_signal(self, fence, name, consumer).await
    }

    async fn signals(&self, session: &SessionId) -> Result<Vec<SignalRecord>, StoreError> {
        signals(self, session).await
    }
}
