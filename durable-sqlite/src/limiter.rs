//! Fleet-wide rate limits: definitions, buckets and waiters, each acquire one write
//! transaction (the single writer serialises the fleet's reservations).

use std::time::Duration;

use async_trait::async_trait;
use durable_core::StoreError;
use durable_core::limiter::{
    Acquire, Admission, Defined, LimiterInfo, LimiterState, RateLimit, WaiterStep, abandoned_us,
    admission, stored,
};
use durable_core::store::LimiterStore;
use sqlx::{Row, SqliteConnection};

use crate::SqliteStore;
use crate::error::db;
use crate::tx::{self, WriteTx};

/// The limit's definition and buckets, or `LimitNotDefined`.
async fn load(
    conn: &mut SqliteConnection,
    name: &str,
) -> Result<(RateLimit, LimiterState), StoreError> {
    let row = sqlx::query("SELECT definition, state FROM durable_limits WHERE name = ?")
        .bind(name)
        .fetch_optional(conn)
        .await
        .map_err(db)?
        .ok_or_else(|| StoreError::LimitNotDefined {
            name: name.to_owned(),
        })?;
    stored::decode(
        name,
        &row.try_get::<String, _>(0).map_err(db)?,
        &row.try_get::<String, _>(1).map_err(db)?,
    )
}

async fn save(
    conn: &mut SqliteConnection,
    name: &str,
    state: &LimiterState,
    now: i64,
) -> Result<(), StoreError> {
    sqlx::query("UPDATE durable_limits SET state = ?, updated_at = ? WHERE name = ?")
        .bind(stored::state(state))
        .bind(now)
        .bind(name)
        .execute(conn)
        .await
        .map(|_| ())
        .map_err(db)
}

async fn define_limit(
    store: &SqliteStore,
    name: &str,
    limit: &RateLimit,
) -> Result<Defined, StoreError> {
    limit.validate(name)?;
    let mut tx = WriteTx::begin(store.writer()).await?;
    let now = tx.now;
    let result = async {
        let conn = tx.conn();
        let found: Option<(String, String)> =
            sqlx::query_as("SELECT definition, state FROM durable_limits WHERE name = ?")
                .bind(name)
                .fetch_optional(&mut *conn)
                .await
                .map_err(db)?;
        let (defined, state) = match found {
            None => (Defined::Created, LimiterState::default()),
            Some((definition, state)) => match stored::decode(name, &definition, &state) {
                Ok((previous, _)) if previous == *limit => return Ok(Defined::Unchanged),
                Ok((previous, state)) => (Defined::Replaced { previous }, state),
                // A row that does not decode is repaired: the buckets start empty.
                Err(_) => (Defined::Created, LimiterState::default()),
            },
        };
        sqlx::query(
            "INSERT INTO durable_limits (name, definition, state, updated_at) VALUES (?, ?, ?, ?) \
             ON CONFLICT (name) DO UPDATE SET definition = excluded.definition, \
             state = excluded.state, updated_at = excluded.updated_at",
        )
        .bind(name)
        .bind(stored::definition(limit))
        .bind(stored::state(&state))
        .bind(now)
        .execute(conn)
        .await
        .map_err(db)?;
        Ok(defined)
    }
    .await;
    tx.finish(result).await
}

async fn acquire_limit(store: &SqliteStore, acquire: &Acquire) -> Result<Admission, StoreError> {
    durable_core::limiter::validate_name(&acquire.limit)?;
    let mut tx = WriteTx::begin(store.writer()).await?;
    let now = tx.now;
    let result = async {
        let conn = tx.conn();
        let (limit, mut state) = load(&mut *conn, &acquire.limit).await?;
        let now_us = now.saturating_mul(1000);
        sqlx::query("DELETE FROM durable_limit_waiters WHERE limit_name = ? AND start_us < ?")
            .bind(&acquire.limit)
            .bind(now_us - abandoned_us())
            .execute(&mut *conn)
            .await
            .map_err(db)?;
        let found: Option<i64> = match &acquire.waiter {
            Some(waiter) => sqlx::query_scalar(
                "SELECT start_us FROM durable_limit_waiters WHERE limit_name = ? AND waiter = ?",
            )
            .bind(&acquire.limit)
            .bind(waiter)
            .fetch_optional(&mut *conn)
            .await
            .map_err(db)?,
            None => None,
        };
        let start = match WaiterStep::decide(found, now, &state) {
            WaiterStep::Take { start } => {
                sqlx::query(
                    "DELETE FROM durable_limit_waiters WHERE limit_name = ? AND waiter = ?",
                )
                .bind(&acquire.limit)
                .bind(acquire.waiter.as_deref())
                .execute(&mut *conn)
                .await
                .map_err(db)?;
                start
            }
            WaiterStep::Keep { start } => start,
            WaiterStep::Reserve => {
                let start = state.reserve(&limit, acquire.tokens, now);
                save(&mut *conn, &acquire.limit, &state, now).await?;
                if let Some(waiter) = acquire.waiter.as_ref().filter(|_| start > now_us) {
                    sqlx::query(
                        "INSERT INTO durable_limit_waiters (limit_name, waiter, start_us, created_at) \
                         VALUES (?, ?, ?, ?) ON CONFLICT (limit_name, waiter) DO UPDATE \
                         SET start_us = excluded.start_us, created_at = excluded.created_at",
                    )
                    .bind(&acquire.limit)
                    .bind(waiter)
                    .bind(start)
                    .bind(now)
                    .execute(&mut *conn)
                    .await
                    .map_err(db)?;
                }
                start
            }
        };
        let ahead: i64 = if start > now_us {
            sqlx::query_scalar(
                "SELECT count(*) FROM durable_limit_waiters WHERE limit_name = ? AND start_us < ?",
            )
            .bind(&acquire.limit)
            .bind(start)
            .fetch_one(&mut *conn)
            .await
            .map_err(db)?
        } else {
            0
        };
        Ok(admission(start, now, ahead))
    }
    .await;
    tx.finish(result).await
}

async fn update(
    store: &SqliteStore,
    name: &str,
    change: impl FnOnce(&RateLimit, &mut LimiterState, i64) -> i64 + Send,
) -> Result<i64, StoreError> {
    durable_core::limiter::validate_name(name)?;
    let mut tx = WriteTx::begin(store.writer()).await?;
    let now = tx.now;
    let result = async {
        let conn = tx.conn();
        let (limit, mut state) = load(&mut *conn, name).await?;
        let out = change(&limit, &mut state, now);
        save(conn, name, &state, now).await?;
        Ok(out)
    }
    .await;
    tx.finish(result).await
}

async fn limiters(store: &SqliteStore) -> Result<Vec<LimiterInfo>, StoreError> {
    let now = tx::clock(store.reader()).await?;
    // One statement, one snapshot: the buckets and the waiters agree.
    let rows = sqlx::query(
        "SELECT l.name, l.definition, l.state, \
           (SELECT count(*) FROM durable_limit_waiters w \
            WHERE w.limit_name = l.name AND w.start_us > ?) \
         FROM durable_limits l ORDER BY l.name",
    )
    .bind(now.saturating_mul(1000))
    .fetch_all(store.reader())
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
            Ok(state.info(&name, &limit, row.try_get(3).map_err(db)?, now))
        })
        .collect()
}

#[async_trait]
impl LimiterStore for SqliteStore {
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
