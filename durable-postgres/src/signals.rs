//! Signals: sent into a session, consumed once under the consumer's key.
//!
//! Lock order: a send locks the session's row before it inserts and clears the wait; a
//! wait for a signal and a consumption lock the same row (fenced) first. So a send and a
//! wait never miss each other (whichever locks second sees what the other committed:
//! each statement of a READ COMMITTED transaction reads a fresh snapshot), and two
//! consumptions of one session run one after the other.

use async_trait::async_trait;
use durable_core::store::{Fence, NewSignal, SignalRecord, SignalStore, waiting_for_signal};
use durable_core::{SessionId, StoreError};
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Row};

use crate::PostgresStore;
use crate::error::db;
use crate::tx::{self, Lock, Want};

/// `SELECT` of the columns [`record`] reads, in its order, from the signals.
macro_rules! select_signals {
    () => {
        "SELECT id, session_id, name, payload, sent_by, send_key, sent_at, consumed_by, \
         consumed_at FROM durable_signals WHERE "
    };
}

/// A signal row back as a record ([`SignalRecord::stored`]).
fn record(row: &PgRow) -> Result<SignalRecord, StoreError> {
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
    conn: &mut PgConnection,
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
    store: &PostgresStore,
    signal: &NewSignal,
) -> Result<SignalRecord, StoreError> {
    let payload = signal.payload_text()?;
    let mut tx = tx::begin(&store.pool).await?;
    let session = tx::session(&mut tx, &signal.session, Some(Lock::Update)).await?;
    if session.status.is_terminal() {
        return Err(StoreError::SessionEnded {
            session: signal.session.clone(),
            status: session.status.as_str().to_owned(),
        });
    }
    if let Some(key) = &signal.key
        && let Some(sent) = one(
            &mut tx,
            concat!(select_signals!(), "session_id = $1 AND send_key = $2"),
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
    let row = sqlx::query(concat!(
        "INSERT INTO durable_signals (session_id, name, payload, sent_by, send_key, sent_at) \
         VALUES ($1, $2, $3, $4, $5, ",
        crate::tx::now_ms!(),
        ") RETURNING id, sent_at"
    ))
    .bind(signal.session.as_str())
    .bind(&signal.name)
    .bind(&payload)
    .bind(&signal.sent_by)
    .bind(signal.key.as_deref())
    .fetch_one(&mut *tx)
    .await
    .map_err(db)?;
    sqlx::query(concat!(
        "WITH woken AS (UPDATE durable_sessions SET waiting_for = NULL, waiting_until = NULL \
         WHERE id = $1 AND waiting_for = $2 RETURNING 1) SELECT ",
        crate::notify::pg_notify!(),
        " FROM woken"
    ))
    .bind(signal.session.as_str())
    .bind(waiting_for_signal(&signal.name))
    .execute(&mut *tx)
    .await
    .map_err(db)?;
    tx.commit().await.map_err(db)?;
    Ok(SignalRecord::new(
        row.try_get(0).map_err(db)?,
        signal.session.clone(),
        signal.name.clone(),
        signal.payload.clone(),
        signal.sent_by.clone(),
        signal.key.clone(),
        row.try_get(1).map_err(db)?,
        None,
    ))
}

pub(crate) async fn consume_signal(
    store: &PostgresStore,
    fence: Fence<'_>,
    name: &str,
    consumer: &str,
) -> Result<Option<SignalRecord>, StoreError> {
    let mut tx = tx::begin(&store.pool).await?;
    let now = tx::lock_fenced(
        &mut tx,
        store.keyring(),
        fence,
        Lock::Update,
        Want::default(),
    )
    .await?
    .now;
    let session = fence.session.as_str();
    if let Some(taken) = one(
        &mut tx,
        concat!(select_signals!(), "session_id = $1 AND consumed_by = $2"),
        &[session, consumer],
    )
    .await?
    {
        tx.rollback().await.map_err(db)?;
        return Ok(Some(taken));
    }
    let Some(mut next) = one(
        &mut tx,
        concat!(
            select_signals!(),
            "session_id = $1 AND name = $2 AND consumed_by IS NULL ORDER BY id LIMIT 1"
        ),
        &[session, name],
    )
    .await?
    else {
        tx.rollback().await.map_err(db)?;
        return Ok(None);
    };
    sqlx::query("UPDATE durable_signals SET consumed_by = $1, consumed_at = $2 WHERE id = $3")
        .bind(consumer)
        .bind(now)
        .bind(next.id)
        .execute(&mut *tx)
        .await
        .map_err(db)?;
    tx.commit().await.map_err(db)?;
    next.consumed_by = Some(consumer.to_owned());
    next.consumed_at = Some(now);
    Ok(Some(next))
}

/// Whether a signal named `name` is pending for `session` (a wait's check, inside its
/// transaction, the session's row locked).
pub(crate) async fn pending(
    conn: &mut PgConnection,
    session: &SessionId,
    name: &str,
) -> Result<bool, StoreError> {
    let found = sqlx::query(
        "SELECT 1 FROM durable_signals WHERE session_id = $1 AND name = $2 \
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
    store: &PostgresStore,
    session: &SessionId,
) -> Result<Vec<SignalRecord>, StoreError> {
    let mut conn = store.conn().await?;
    tx::session(&mut conn, session, None).await?;
    sqlx::query(concat!(select_signals!(), "session_id = $1 ORDER BY id"))
        .bind(session.as_str())
        .fetch_all(&mut *conn)
        .await
        .map_err(db)?
        .iter()
        .map(record)
        .collect()
}

#[async_trait]
impl SignalStore for PostgresStore {
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
