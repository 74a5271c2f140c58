//! Operators' raises of budget ceilings: one audit row per raise, and reading a
//! session's raises back.

use async_trait::async_trait;
use durable_core::store::{BudgetStore, LimitRaise, RaiseLimit};
use durable_core::{SessionId, StoreError};
use sqlx::Row;

use crate::SqliteStore;
use crate::error::db;
use crate::tx::{self, WriteTx};

pub(crate) async fn raise_limit(
    store: &SqliteStore,
    raise: RaiseLimit,
) -> Result<LimitRaise, StoreError> {
    raise.validate()?;
    let ceiling = i64::try_from(raise.ceiling).unwrap_or(i64::MAX);
    let limit = raise.limit.to_string();
    let mut tx = WriteTx::begin(store.writer()).await?;
    let now = tx.now;
    let result = async {
        let conn = tx.conn();
        // The session must exist (and its row be readable).
        tx::session(&mut *conn, &raise.session).await?;
        sqlx::query(
            "INSERT INTO durable_limit_raises (session_id, limit_name, ceiling, raised_by, note, \
             created_at) VALUES (?, ?, ?, ?, ?, ?)",
        )
        .bind(raise.session.as_str())
        .bind(&limit)
        .bind(ceiling)
        .bind(&raise.by)
        .bind(raise.note.as_deref())
        .bind(now)
        .execute(&mut *conn)
        .await
        .map_err(db)?;
        Ok(())
    }
    .await;
    tx.finish(result).await?;
    LimitRaise::from_row(raise.session, &limit, ceiling, raise.by, raise.note, now)
}

pub(crate) async fn limit_raises(
    store: &SqliteStore,
    session: &SessionId,
) -> Result<Vec<LimitRaise>, StoreError> {
    let rows = sqlx::query(
        "SELECT limit_name, ceiling, raised_by, note, created_at FROM durable_limit_raises \
         WHERE session_id = ? ORDER BY id",
    )
    .bind(session.as_str())
    .fetch_all(store.reader())
    .await
    .map_err(db)?;
    rows.iter()
        .map(|row| {
            LimitRaise::from_row(
                session.clone(),
                &row.try_get::<String, _>(0).map_err(db)?,
                row.try_get(1).map_err(db)?,
                row.try_get(2).map_err(db)?,
                row.try_get(3).map_err(db)?,
                row.try_get(4).map_err(db)?,
            )
        })
        .collect()
}

#[async_trait]
impl BudgetStore for SqliteStore {
    async fn raise_limit(&self, raise: RaiseLimit) -> Result<LimitRaise, StoreError> {
        raise_limit(self, raise).await
    }

    async fn limit_raises(&self, session: &SessionId) -> Result<Vec<LimitRaise>, StoreError> {
        limit_raises(self, session).await
    }
}
