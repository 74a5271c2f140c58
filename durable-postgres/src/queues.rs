//! Queues and sleepers: fleet-wide queue limits, the figures operators watch, the next
//! wake-up time and an operator's early wake-up.

use async_trait::async_trait;
use durable_core::StoreError;
use durable_core::ids::SessionId;
use durable_core::store::QueueStore;
use durable_core::store::WorkEvents;
use durable_core::store::{Fence, QueueInfo, Scheduling, SessionRecord, SessionStatus, TenantInfo};

use crate::PostgresStore;
use crate::error::db;
use crate::notify;
use crate::rows::{self, get, session_cols};
use crate::tx;

pub(crate) async fn set_queue_limit(
    store: &PostgresStore,
    queue: &str,
    max_running: Option<u32>,
) -> Result<(), StoreError> {
    durable_core::validate::validate_id("queue", queue)?;
    // One statement each, which notifies idle pools when it commits (a limit raised or
    // lifted may let them claim).
    let query = match max_running {
        Some(max) => sqlx::query(concat!(
            "WITH limited AS (INSERT INTO durable_queues (name, max_running, updated_at) VALUES ($1, $2, ",
            tx::now_ms!(),
            ") ON CONFLICT (name) DO UPDATE SET max_running = excluded.max_running, \
             updated_at = excluded.updated_at RETURNING 1) SELECT ",
            notify::pg_notify!(),
            " FROM limited"
        ))
        .bind(queue)
        .bind(i64::from(max)),
        None => sqlx::query(concat!(
            "WITH lifted AS (DELETE FROM durable_queues WHERE name = $1 RETURNING 1) SELECT ",
            notify::pg_notify!(),
            " FROM lifted"
        ))
        .bind(queue),
    };
    query.execute(&mut *store.conn().await?).await.map_err(db)?;
    Ok(())
}

pub(crate) async fn set_scheduling(
    store: &PostgresStore,
    fence: Fence<'_>,
    scheduling: &Scheduling,
) -> Result<(), StoreError> {
    scheduling.validate()?;
    // One autocommitted statement, fenced.
    let set = sqlx::query(
        "UPDATE durable_sessions SET priority = $3, claim_rank = created_at - $4, tenant = $5 \
         WHERE id = $1 AND fence = $2",
    )
    .bind(fence.session.as_str())
    .bind(fence.token)
    .bind(scheduling.priority)
    .bind(scheduling.rank_offset())
    .bind(scheduling.tenant.as_deref())
    .execute(store.pool())
    .await
    .map_err(db)?;
    if set.rows_affected() == 0 {
        let mut conn = store.pool().acquire().await.map_err(db)?;
        tx::session(&mut conn, fence.session, None).await?;
        return Err(StoreError::LeaseLost {
            session: fence.session.clone(),
            token: fence.token,
        });
    }
    Ok(())
}

pub(crate) async fn set_tenant_limit(
    store: &PostgresStore,
    tenant: &str,
    max_running: Option<u32>,
) -> Result<(), StoreError> {
    durable_core::validate::validate_id("tenant", tenant)?;
    // One statement each, which notifies idle pools when it commits.
    let query = match max_running {
        Some(max) => sqlx::query(concat!(
            "WITH limited AS (INSERT INTO durable_tenants (name, max_running, updated_at) VALUES ($1, $2, ",
            tx::now_ms!(),
            ") ON CONFLICT (name) DO UPDATE SET max_running = excluded.max_running, \
             updated_at = excluded.updated_at RETURNING 1) SELECT ",
            notify::pg_notify!(),
            " FROM limited"
        ))
        .bind(tenant)
        .bind(i64::from(max)),
        None => sqlx::query(concat!(
            "WITH lifted AS (DELETE FROM durable_tenants WHERE name = $1 RETURNING 1) SELECT ",
            notify::pg_notify!(),
            " FROM lifted"
        ))
        .bind(tenant),
    };
    query.execute(&mut *store.conn().await?).await.map_err(db)?;
    Ok(())
}

pub(crate) async fn tenants(store: &PostgresStore) -> Result<Vec<TenantInfo>, StoreError> {
    // One statement, one snapshot; the partial index of active sessions with a tenant.
    let rows = sqlx::query(concat!(
        "WITH clock AS (SELECT ",
        tx::now_ms!(),
        " AS now), \
         counts AS (SELECT tenant, \
           count(*) FILTER (WHERE lease_owner IS NOT NULL \
             AND lease_expires_at > clock.now) AS running, \
           count(*) FILTER (WHERE NOT (lease_owner IS NOT NULL \
             AND lease_expires_at > clock.now)) AS queued \
           FROM durable_sessions, clock WHERE status = 'active' AND tenant IS NOT NULL \
           GROUP BY tenant), \
         names AS (SELECT tenant AS name FROM counts UNION SELECT name FROM durable_tenants) \
         SELECT n.name, t.max_running, coalesce(c.running, 0) AS running, \
           coalesce(c.queued, 0) AS queued \
         FROM names n LEFT JOIN counts c ON c.tenant = n.name \
         LEFT JOIN durable_tenants t ON t.name = n.name ORDER BY n.name"
    ))
    .fetch_all(&mut *store.conn().await?)
    .await
    .map_err(db)?;
    rows.iter()
        .map(|row| {
            let max =
                get::<Option<i64>>(row, "max_running")?.and_then(|max| u32::try_from(max).ok());
            Ok(TenantInfo::new(
                get::<String>(row, "name")?,
                max,
                get(row, "running")?,
                get(row, "queued")?,
            ))
        })
        .collect()
}

pub(crate) async fn queues(store: &PostgresStore) -> Result<Vec<QueueInfo>, StoreError> {
    // One statement, one snapshot: the limits and the counts agree with each other.
    let rows = sqlx::query(concat!(
        "WITH clock AS (SELECT ",
        tx::now_ms!(),
        " AS now), \
         counts AS (SELECT queue, \
           count(*) FILTER (WHERE status = 'active' AND lease_owner IS NOT NULL \
             AND lease_expires_at > clock.now) AS running, \
           count(*) FILTER (WHERE status = 'active' AND (lease_owner IS NULL \
             OR lease_expires_at IS NULL OR lease_expires_at <= clock.now) \
             AND (wake_at IS NULL OR wake_at <= clock.now) \
             AND (waiting_until IS NULL OR waiting_until <= clock.now)) AS ready, \
           count(*) FILTER (WHERE status = 'active' AND (lease_owner IS NULL \
             OR lease_expires_at IS NULL OR lease_expires_at <= clock.now) \
             AND wake_at > clock.now \
             AND (waiting_until IS NULL OR waiting_until <= clock.now)) AS sleeping, \
           count(*) FILTER (WHERE status = 'active' AND (lease_owner IS NULL \
             OR lease_expires_at IS NULL OR lease_expires_at <= clock.now) \
             AND waiting_until > clock.now) AS waiting, \
           count(*) FILTER (WHERE status = 'awaiting_approval') AS awaiting, \
           count(*) FILTER (WHERE status = 'parked') AS parked, \
           min(wake_at) FILTER (WHERE status = 'active' AND wake_at > clock.now) AS next_wake \
           FROM durable_sessions, clock \
           WHERE status IN ('active', 'awaiting_approval', 'parked') GROUP BY queue), \
         names AS (SELECT queue AS name FROM counts UNION SELECT name FROM durable_queues) \
         SELECT n.name, q.max_running, coalesce(c.running, 0) AS running, \
           coalesce(c.ready, 0) AS ready, coalesce(c.sleeping, 0) AS sleeping, \
           coalesce(c.awaiting, 0) AS awaiting, coalesce(c.parked, 0) AS parked, \
           c.next_wake, coalesce(c.waiting, 0) AS waiting \
         FROM names n LEFT JOIN counts c ON c.queue = n.name \
         LEFT JOIN durable_queues q ON q.name = n.name ORDER BY n.name"
    ))
    .fetch_all(&mut *store.conn().await?)
    .await
    .map_err(db)?;
    rows.iter()
        .map(|row| {
            let mut info = QueueInfo::new(get::<String>(row, "name")?);
            info.max_running =
                get::<Option<i64>>(row, "max_running")?.and_then(|max| u32::try_from(max).ok());
            info.running = get(row, "running")?;
            info.ready = get(row, "ready")?;
            info.sleeping = get(row, "sleeping")?;
            info.awaiting_approval = get(row, "awaiting")?;
            info.parked = get(row, "parked")?;
            info.next_wake_at = get(row, "next_wake")?;
            info.waiting = get(row, "waiting")?;
            Ok(info)
        })
        .collect()
}

pub(crate) async fn next_wake_at(store: &PostgresStore) -> Result<Option<i64>, StoreError> {
    sqlx::query_scalar(concat!(
        "WITH clock AS (SELECT ",
        tx::now_ms!(),
        " AS now) SELECT min(wake_at) FROM durable_sessions, clock \
         WHERE status = 'active' AND wake_at IS NOT NULL AND wake_at > clock.now \
           AND (lease_owner IS NULL OR lease_expires_at IS NULL \
             OR lease_expires_at <= clock.now)"
    ))
    .fetch_one(&mut *store.conn().await?)
    .await
    .map_err(db)
}

pub(crate) async fn wake_session(
    store: &PostgresStore,
    id: &SessionId,
) -> Result<SessionRecord, StoreError> {
    let mut tx = tx::begin(&store.pool).await?;
    let row = sqlx::query(concat!(
        "SELECT ",
        session_cols!(),
        " FROM durable_sessions WHERE id = $1 FOR NO KEY UPDATE"
    ))
    .bind(id.as_str())
    .fetch_optional(&mut *tx)
    .await
    .map_err(db)?
    .ok_or_else(|| StoreError::SessionNotFound(id.clone()))?;
    let current = rows::session(&row)?;
    if current.status != SessionStatus::Active {
        return Err(StoreError::NotResumable {
            session: id.clone(),
            status: current.status.as_str().to_owned(),
        });
    }
    // The clock's statement notifies idle pools too (at commit).
    let row = sqlx::query(concat!(
        "WITH clock AS (SELECT ",
        tx::now_ms!(),
        " AS now, ",
        notify::pg_notify!(),
        ") UPDATE durable_sessions SET wake_at = CASE WHEN wake_at > clock.now \
         THEN clock.now ELSE wake_at END FROM clock WHERE id = $1 RETURNING ",
        session_cols!()
    ))
    .bind(id.as_str())
    .fetch_one(&mut *tx)
    .await
    .map_err(db)?;
    tx.commit().await.map_err(db)?;
    rows::session(&row)
}

#[async_trait]
impl QueueStore for PostgresStore {
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
        set_tenant_limit(self, tenant, max_running).await
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
