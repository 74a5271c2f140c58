//! Fleet-wide rate limits: definitions, buckets and waiters. Each acquire is one
//! transaction that locks the limit's row (`FOR UPDATE`), so the reservations of every
//! worker on every machine are taken one at a time, in the order they reach the row.

use std::time::Duration;

use async_trait::async_trait;
use durable_core::StoreError;
use durable_core::limiter::{
    Acquire, Admission, Defined, LimiterInfo, LimiterState, RateLimit, WaiterStep, abandoned_us,
    admission, stored,
};
use durable_core::store::LimiterStore;
use sqlx::Row;
use sqlx::postgres::PgConnection;

use crate::PostgresStore;
use crate::error::db;
use crate::tx;

/// Locks the limit's row and reads it with the database clock, or `LimitNotDefined`.
async fn lock(
    conn: &mut PgConnection,
    name: &str,
) -> Result<(RateLimit, LimiterState, i64), StoreError> {
    let row = sqlx::query(concat!(
        "SELECT definition, state, ",
        tx::now_ms!(),
        " AS now FROM durable_limits WHERE name = $1 FOR UPDATE"
    ))
    .bind(name)
    .fetch_optional(&mut *conn)
    .await
    .map_err(db)?
    .ok_or_else(|| StoreError::LimitNotDefined {
        name: name.to_owned(),
    })?;
    let (limit, state) = stored::decode(
        name,
        &row.try_get::<String, _>(0).map_err(db)?,
        &row.try_get::<String, _>(1).map_err(db)?,
    )?;
    Ok((limit, state, row.try_get(2).map_err(db)?))
}

async fn define_limit(
    store: &PostgresStore,
    name: &str,
    limit: &RateLimit,
) -> Result<Defined, StoreError> {
    limit.validate(name)?;
    let mut tx = tx::begin(store.pool()).await?;
    // Created if absent (buckets empty); otherwise locked and compared: two workers
    // that define one name at once are serialised by the row lock.
    let created = sqlx::query(concat!(
        "INSERT INTO durable_limits (name, definition, state, updated_at) VALUES ($1, $2, $3, ",
        tx::now_ms!(),
        ") ON CONFLICT (name) DO NOTHING RETURNING 1"
    ))
    .bind(name)
    .bind(stored::definition(limit))
    .bind(stored::state(&LimiterState::default()))
    .fetch_optional(&mut *tx)
    .await
    .map_err(db)?
    .is_some();
    let defined = if created {
        Defined::Created
    } else {
        let row =
            sqlx::query("SELECT definition, state FROM durable_limits WHERE name = $1 FOR UPDATE")
                .bind(name)
                .fetch_one(&mut *tx)
                .await
                .map_err(db)?;
        let definition: String = row.try_get(0).map_err(db)?;
        let state_text: String = row.try_get(1).map_err(db)?;
        match stored::decode(name, &definition, &state_text) {
            Ok((previous, _)) if previous == *limit => Defined::Unchanged,
            Ok((previous, state)) => {
                write_definition(&mut tx, name, limit, &state).await?;
                Defined::Replaced { previous }
            }
            Err(_) => {
                write_definition(&mut tx, name, limit, &LimiterState::default()).await?;
                Defined::Created
            }
        }
    };
    tx.commit().await.map_err(db)?;
    Ok(defined)
}

async fn write_definition(
    conn: &mut PgConnection,
    name: &str,
    limit: &RateLimit,
    state: &LimiterState,
) -> Result<(), StoreError> {
    sqlx::query(concat!(
        "UPDATE durable_limits SET definition = $2, state = $3, updated_at = ",
        tx::now_ms!(),
        " WHERE name = $1"
    ))
    .bind(name)
    .bind(stored::definition(limit))
    .bind(stored::state(state))
    .execute(conn)
    .await
    .map(|_| ())
    .map_err(db)
}

async fn acquire_limit(store: &PostgresStore, acquire: &Acquire) -> Result<Admission, StoreError> {
    durable_core::limiter::validate_name(&acquire.limit)?;
    let mut tx = tx::begin(store.pool()).await?;
    let (limit, mut state, now) = lock(&mut tx, &acquire.limit).await?;
    let now_us = now.saturating_mul(1000);
    // The waiter's reservation, and abandoned ones removed, in one statement.
    let found: Option<i64> = match &acquire.waiter {
        Some(waiter) => sqlx::query_scalar(
            "WITH purged AS (DELETE FROM durable_limit_waiters \
               WHERE limit_name = $1 AND start_us < $3) \
             SELECT start_us FROM durable_limit_waiters WHERE limit_name = $1 AND waiter = $2",
        )
        .bind(&acquire.limit)
        .bind(waiter)
        .bind(now_us - abandoned_us())
        .fetch_optional(&mut *tx)
        .await
        .map_err(db)?,
        None => None,
    };
    let (start, write) = match WaiterStep::decide(found, now, &state) {
        WaiterStep::Take { start } => (start, Write::Take),
        WaiterStep::Keep { start } => (start, Write::Nothing),
        WaiterStep::Reserve => (state.reserve(&limit, acquire.tokens, now), Write::Reserved),
    };
    let waiter = acquire.waiter.as_deref();
    // The change and the count of waiters ahead, in one statement (the count reads the
    // snapshot before the change: the rows ahead of this one).
    let ahead: i64 = match write {
        Write::Nothing => count_ahead(&mut tx, &acquire.limit, start).await?,
        Write::Take => {
            sqlx::query("DELETE FROM durable_limit_waiters WHERE limit_name = $1 AND waiter = $2")
                .bind(&acquire.limit)
                .bind(waiter)
                .execute(&mut *tx)
                .await
                .map_err(db)?;
            0
        }
        Write::Reserved => {
            let keep = waiter.filter(|_| start > now_us);
            sqlx::query_scalar(
                "WITH saved AS (UPDATE durable_limits SET state = $2, updated_at = $3 \
                   WHERE name = $1), \
                 queued AS (INSERT INTO durable_limit_waiters \
                   (limit_name, waiter, start_us, created_at) \
                   SELECT $1, $4, $5, $3 WHERE $4::text IS NOT NULL \
                   ON CONFLICT (limit_name, waiter) DO UPDATE \
                   SET start_us = excluded.start_us, created_at = excluded.created_at) \
                 SELECT count(*) FROM durable_limit_waiters \
                 WHERE limit_name = $1 AND start_us < $5 AND $5 > $6",
            )
            .bind(&acquire.limit)
            .bind(stored::state(&state))
            .bind(now)
            .bind(keep)
            .bind(start)
            .bind(now_us)
            .fetch_one(&mut *tx)
            .await
            .map_err(db)?
        }
    };
    tx.commit().await.map_err(db)?;
    Ok(admission(start, now, ahead))
}

/// What an acquire writes.
enum Write {
    Nothing,
    Take,
    Reserved,
}

async fn count_ahead(conn: &mut PgConnection, name: &str, start: i64) -> Result<i64, StoreError> {
    sqlx::query_scalar(
        "SELECT count(*) FROM durable_limit_waiters WHERE limit_name = $1 AND start_us < $2",
    )
    .bind(name)
    .bind(start)
    .fetch_one(conn)
    .await
    .map_err(db)
}

async fn update(
    store: &PostgresStore,
    name: &str,
    change: impl FnOnce(&RateLimit, &mut LimiterState, i64) -> i64 + Send,
) -> Result<i64, StoreError> {
    durable_core::limiter::validate_name(name)?;
    let mut tx = tx::begin(store.pool()).await?;
    let (limit, mut state, now) = lock(&mut tx, name).await?;
    let out = change(&limit, &mut state, now);
    sqlx::query("UPDATE durable_limits SET state = $2, updated_at = $3 WHERE name = $1")
        .bind(name)
        .bind(stored::state(&state))
        .bind(now)
        .execute(&mut *tx)
        .await
        .map_err(db)?;
    tx.commit().await.map_err(db)?;
    Ok(out)
}

async fn limiters(store: &PostgresStore) -> Result<Vec<LimiterInfo>, StoreError> {
    // One statement, one snapshot: the buckets and the waiters agree.
    let rows = sqlx::query(concat!(
        "WITH clock AS (SELECT ",
        tx::now_ms!(),
        " AS now) \
         SELECT l.name, l.definition, l.state, clock.now, \
           (SELECT count(*) FROM durable_limit_waiters w \
            WHERE w.limit_name = l.name AND w.start_us > clock.now * 1000) \
         FROM durable_limits l, clock ORDER BY l.name"
    ))
    .fetch_all(store.pool())
    .await
    .map_err(db)?;
    rows.iter()
        .map(|row| {
            let name: String = row.try_get(0).map_err(db)?;
            let (limit, state) = stored::decode(
                &name,
                &row.try_get::<String, _>(1).map_err(db)?,
                &row.try_get::<String, _>(2).map_err(db)?,
            )?;
            let now: i64 = row.try_get(3).map_err(db)?;
            Ok(state.info(&name, &limit, row.try_get(4).map_err(db)?, now))
        })
        .collect()
}

#[async_trait]
impl LimiterStore for PostgresStore {
    async fn define_limit(&self, name: &str, limit: &RateLimit) -> Result<Defined, StoreError> {
        define_limit(self, name, limit).await
    }

    async fn acquire_limit(&self, acquire: &Acquire) -> Result<Admission, StoreError> {
        acquire_limit(self, acquire).await
    }

    async fn charge_limit(&self, name: &str, tokens: u64) -> Result<(), StoreError> {
        update(self, name, |limit, state, now| {
            state.charge(limit, tokens, now);
            0
        })
        .await
        .map(|_| ())
    }

    async fn throttle_limit(&self, name: &str, retry_after: Duration) -> Result<i64, StoreError> {
        update(self, name, |limit, state, now| {
            state.throttle(limit, retry_after, now)
        })
        .await
    }

    async fn limiters(&self) -> Result<Vec<LimiterInfo>, StoreError> {
        limiters(self).await
    }
}
