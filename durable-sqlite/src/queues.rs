//! Queues and sleepers: fleet-wide queue limits, the figures operators watch, the next
//! wake-up time and an operator's early wake-up.

use async_trait::async_trait;
use durable_core::store::{
    Fence, QueueInfo, QueueStore, Scheduling, SessionRecord, SessionStatus, TenantInfo, WorkEvents,
};
use durable_core::{SessionId, StoreError};
use sqlx::Row;

use crate::SqliteStore;
use crate::error::db;
use crate::tx::{self, WriteTx};

pub(crate) async fn set_queue_limit(
    store: &SqliteStore,
    queue: &str,
    max_running: Option<u32>,
) -> Result<(), StoreError> {
    durable_core::validate::validate_id("queue", queue)?;
    let mut tx = WriteTx::begin(store.writer()).await?;
    let now = tx.now;
    let result = async {
        let query = match max_running {
            Some(max) => sqlx::query(
                "INSERT INTO durable_queues (name, max_running, updated_at) VALUES (?, ?, ?) \
                 ON CONFLICT (name) DO UPDATE SET max_running = excluded.max_running, \
                 updated_at = excluded.updated_at",
            )
            .bind(queue)
            .bind(i64::from(max))
            .bind(now),
            None => sqlx::query("DELETE FROM durable_queues WHERE name = ?").bind(queue),
        };
        query.execute(tx.conn()).await.map(|_| ()).map_err(db)
    }
    .await;
    tx.finish(result).await
}

pub(crate) async fn set_scheduling(
    store: &SqliteStore,
    fence: Fence<'_>,
    scheduling: &Scheduling,
) -> Result<(), StoreError> {
    scheduling.validate()?;
    // One autocommitted statement on the writer, fenced.
    let set = sqlx::query(
        "UPDATE durable_sessions SET priority = ?, claim_rank = created_at - ?, tenant = ? \
         WHERE id = ? AND fence = ?",
    )
    .bind(scheduling.priority)
    .bind(scheduling.rank_offset())
    .bind(scheduling.tenant.as_deref())
    .bind(fence.session.as_str())
    .bind(fence.token)
    .execute(store.writer())
    .await
    .map_err(db)?;
    if set.rows_affected() == 0 {
        let mut conn = store.writer().acquire().await.map_err(db)?;
        tx::session(&mut conn, fence.session).await?;
        return Err(StoreError::LeaseLost {
            session: fence.session.clone(),
            token: fence.token,
        });
    }
    Ok(())
}

pub(crate) async fn set_tenant_limit(
    store: &SqliteStore,
    tenant: &str,
    max_running: Option<u32>,
) -> Result<(), StoreError> {
    durable_core::validate::validate_id("tenant", tenant)?;
    let mut tx = WriteTx::begin(store.writer()).await?;
    let now = tx.now;
    let result = async {
        let query = match max_running {
            Some(max) => sqlx::query(
                "INSERT INTO durable_tenants (name, max_running, updated_at) VALUES (?, ?, ?) \
                 ON CONFLICT (name) DO UPDATE SET max_running = excluded.max_running, \
                 updated_at = excluded.updated_at",
            )
            .bind(tenant)
            .bind(i64::from(max))
            .bind(now),
            None => sqlx::query("DELETE FROM durable_tenants WHERE name = ?").bind(tenant),
        };
        query.execute(tx.conn()).await.map(|_| ()).map_err(db)
    }
    .await;
    tx.finish(result).await
}

pub(crate) async fn tenants(store: &SqliteStore) -> Result<Vec<TenantInfo>, StoreError> {
    let now = tx::clock(store.reader()).await?;
    // One statement, one snapshot; the partial index of active sessions with a tenant.
    let rows = sqlx::query(
        "WITH counts AS (SELECT tenant, \
           sum(lease_owner IS NOT NULL AND lease_expires_at > ?1) AS running, \
           sum(NOT (lease_owner IS NOT NULL AND lease_expires_at > ?1)) AS queued \
           FROM durable_sessions WHERE status = 'active' AND tenant IS NOT NULL \
           GROUP BY tenant), \
         names AS (SELECT tenant AS name FROM counts UNION SELECT name FROM durable_tenants) \
         SELECT n.name, t.max_running, coalesce(c.running, 0), coalesce(c.queued, 0) \
         FROM names n LEFT JOIN counts c ON c.tenant = n.name \
         LEFT JOIN durable_tenants t ON t.name = n.name ORDER BY n.name",
    )
    .bind(now)
    .fetch_all(store.reader())
    .await
    .map_err(db)?;
    rows.iter()
        .map(|row| {
            let max = row
                .try_get::<Option<i64>, _>(1)
                .map_err(db)?
                .and_then(|max| u32::try_from(max).ok());
            Ok(TenantInfo::new(
                row.try_get::<String, _>(0).map_err(db)?,
                max,
                row.try_get(2).map_err(db)?,
                row.try_get(3).map_err(db)?,
            ))
        })
        .collect()
}

pub(crate) async fn queues(store: &SqliteStore) -> Result<Vec<QueueInfo>, StoreError> {
    let now = tx::clock(store.reader()).await?;
    // One statement, one snapshot: the limits and the counts agree with each other.
    let rows = sqlx::query(
        "WITH counts AS (SELECT queue, \
           sum(status = 'active' AND lease_owner IS NOT NULL AND lease_expires_at > ?1) \
             AS running, \
           sum(status = 'active' AND (lease_owner IS NULL OR lease_expires_at IS NULL \
             OR lease_expires_at <= ?1) AND (wake_at IS NULL OR wake_at <= ?1) \
             AND (waiting_until IS NULL OR waiting_until <= ?1)) AS ready, \
           sum(status = 'active' AND (lease_owner IS NULL OR lease_expires_at IS NULL \
             OR lease_expires_at <= ?1) AND wake_at > ?1 \
             AND (waiting_until IS NULL OR waiting_until <= ?1)) AS sleeping, \
           sum(status = 'active' AND (lease_owner IS NULL OR lease_expires_at IS NULL \
             OR lease_expires_at <= ?1) AND waiting_until > ?1) AS waiting, \
           sum(status = 'awaiting_approval') AS awaiting, \
           sum(status = 'parked') AS parked, \
           min(CASE WHEN status = 'active' AND wake_at > ?1 THEN wake_at END) AS next_wake \
           FROM durable_sessions WHERE status IN ('active', 'awaiting_approval', 'parked') \
           GROUP BY queue), \
         names AS (SELECT queue AS name FROM counts UNION SELECT name FROM durable_queues) \
         SELECT n.name, q.max_running, coalesce(c.running, 0), coalesce(c.ready, 0), \
           coalesce(c.sleeping, 0), coalesce(c.awaiting, 0), coalesce(c.parked, 0), \
           c.next_wake, coalesce(c.waiting, 0) \
         FROM names n LEFT JOIN counts c ON c.queue = n.name \
         LEFT JOIN durable_queues q ON q.name = n.name ORDER BY n.name",
    )
    .bind(now)
    .fetch_all(store.reader())
    .await
    .map_err(db)?;
    rows.iter()
        .map(|row| {
            let mut info = QueueInfo::new(row.try_get::<String, _>(0).map_err(db)?);
            info.max_running = row
                .try_get::<Option<i64>, _>(1)
                .map_err(db)?
                .and_then(|max| u32::try_from(max).ok());
            info.running = row.try_get(2).map_err(db)?;
            info.ready = row.try_get(3).map_err(db)?;
            info.sleeping = row.try_get(4).map_err(db)?;
            info.awaiting_approval = row.try_get(5).map_err(db)?;
            info.parked = row.try_get(6).map_err(db)?;
            info.next_wake_at = row.try_get(7).map_err(db)?;
            info.waiting = row.try_get(8).map_err(db)?;
            Ok(info)
        })
        .collect()
}

pub(crate) async fn next_wake_at(store: &SqliteStore) -> Result<Option<i64>, StoreError> {
    let now = tx::clock(store.reader()).await?;
    sqlx::query_scalar(
        "SELECT min(wake_at) FROM durable_sessions WHERE status = 'active' \
         AND wake_at IS NOT NULL AND wake_at > ?1 \
         AND (lease_owner IS NULL OR lease_expires_at IS NULL OR lease_expires_at <= ?1)",
    )
    .bind(now)
    .fetch_one(store.reader())
    .await
    .map_err(db)
}

pub(crate) async fn wake_session(
    store: &SqliteStore,
    id: &SessionId,
) -> Result<SessionRecord, StoreError> {
    let mut tx = WriteTx::begin(store.writer()).await?;
    let now = tx.now;
    let result = async {
        let conn = tx.conn();
        let current = tx::session(&mut *conn, id).await?;
        if current.status != SessionStatus::Active {
            return Err(StoreError::NotResumable {
                session: id.clone(),
                status: current.status.as_str().to_owned(),
            });
        }
        sqlx::query("UPDATE durable_sessions SET wake_at = ? WHERE id = ? AND wake_at > ?")
            .bind(now)
            .bind(id.as_str())
            .bind(now)
            .execute(&mut *conn)
            .await
            .map_err(db)?;
        tx::session(conn, id).await
    }
    .await;
    tx.finish(result).await
}

#[async_trait]
impl QueueStore for SqliteStore {
    async fn set_scheduling(
        &self,
        fence: Fence<'_>,
        scheduling: &Scheduling,
    ) -> Result<(), StoreError> {
        set_scheduling(self, fence, scheduling).await
    }

    async fn set_tenant_limit(
        &self,
        tenant: &str,
        max_running: Option<u32>,
    ) -> Result<(), StoreError> {
        set_tenant_limit(self, tenant, max_running).await?;
        self.work_available();
        Ok(())
    }

    async fn set_queue_limit(
        &self,
        queue: &str,
        max_running: Option<u32>,
    ) -> Result<(), StoreError> {
        set_queue_limit(self, queue, max_running).await?;
        self.work_available();
        Ok(())
    }

    async fn queues(&self) -> Result<Vec<QueueInfo>, StoreError> {
        queues(self).await
    }

    async fn tenants(&self) -> Result<Vec<TenantInfo>, StoreError> {
        tenants(self).await
    }

    async fn next_wake_at(&self) -> Result<Option<i64>, StoreError> {
        next_wake_at(self).await
    }

    fn work_events(&self) -> Option<WorkEvents> {
        Some(self.work_subscribe())
    }

    async fn wake_session(&self, id: &SessionId) -> Result<SessionRecord, StoreError> {
        let record = wake_session(self, id).await?;
        self.work_available();
        Ok(record)
    }
}
