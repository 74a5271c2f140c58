//! Operators' raises of budget ceilings: one audit row per raise, and reading a
//! session's raises back.

use async_trait::async_trait;
use durable_core::StoreError;
use durable_core::ids::SessionId;
use durable_core::store::{BudgetStore, LimitRaise, RaiseLimit};

use crate::PostgresStore;
use crate::error::db;
use crate::rows::get;
use crate::tx;

pub(crate) async fn raise_limit(
    store: &PostgresStore,
    raise: RaiseLimit,
) -> Result<LimitRaise, StoreError> {
    raise.validate()?;
    let ceiling = i64::try_from(raise.ceiling).unwrap_or(i64::MAX);
    let limit = raise.limit.to_string();
    // One statement: no row is written for a session that does not exist.
    let inserted = sqlx::query(concat!(
        "INSERT INTO durable_limit_raises (session_id, limit_name, ceiling, raised_by, note, \
         created_at) SELECT id, $2, $3, $4, $5, ",
        tx::now_ms!(),
        " FROM durable_sessions WHERE id = $1 RETURNING created_at"
    ))
    .bind(raise.session.as_str())
    .bind(&limit)
    .bind(ceiling)
    .bind(&raise.by)
    .bind(raise.note.as_deref())
    .fetch_optional(&store.pool)
    .await
    .map_err(db)?
    .ok_or_else(|| StoreError::SessionNotFound(raise.session.clone()))?;
    let at: i64 = get(&inserted, "created_at")?;
    LimitRaise::from_row(raise.session, &limit, ceiling, raise.by, raise.note, at)
}

pub(crate) async fn limit_raises(
    store: &PostgresStore,
    session: &SessionId,
) -> Result<Vec<LimitRaise>, StoreError> {
    let found = sqlx::query(
        "SELECT limit_name, ceiling, raised_by, note, created_at FROM durable_limit_raises \
         WHERE session_id = $1 ORDER BY id",
    )
    .bind(session.as_str())
    .fetch_all(&store.pool)
    .await
    .map_err(db)?;
    found
        .iter()
        .map(|row| {
            let limit: String = get(row, "limit_name")?;
            LimitRaise::from_row(
                session.clone(),
                &limit,
                get(row, "ceiling")?,
                get(row, "raised_by")?,
                get(row, "note")?,
                get(row, "created_at")?,
            )
        })
        .collect()
}

#[async_trait]
impl BudgetStore for PostgresStore {
    async fn raise_limit(&self, raise: RaiseLimit) -> Result<LimitRaise, StoreError> {
        raise_limit(self, raise).await
    }

    async fn limit_raises(&self, session: &SessionId) -> Result<Vec<LimitRaise>, StoreError> {
        limit_raises(self, session).await
    }
}
