//! Leases and fencing tokens: taking a session (by id or by claiming an expired one),
//! renewing and giving the lease up, and the poison-pill counter that parks a session
//! whose recoveries keep dying (and `unpark_session`, an operator's way back).

use std::time::Duration;

use async_trait::async_trait;
use durable_core::StoreError;
use durable_core::ids::{CallId, SessionId};
use durable_core::store::LeaseStore;
use durable_core::store::{Claim, Fence, Lease, SessionRecord, SessionStatus, Wait};
use sqlx::postgres::PgConnection;

use crate::PostgresStore;
use crate::error::db;
use crate::notify;
use crate::rows::{self, get, session_cols};
use crate::tx::{self, Lock, Want, ttl_ms};

pub(crate) async fn acquire_lease(
    store: &PostgresStore,
    id: &SessionId,
    owner: &str,
    ttl: Duration,
    max_attempts: i32,
) -> Result<Lease, StoreError> {
    durable_core::validate::validate_owner(owner)?;
    let mut tx = tx::begin(&store.pool).await?;
    // The clock in the locking statement, one round trip less. A statement that waited
    // for the lock may have read it before the wait: an earlier clock only makes another
    // holder's lease look held a little longer and ours end a little sooner.
    let row = sqlx::query(concat!(
        "SELECT status, lease_owner, lease_expires_at, recovery_attempts, lease_ran, ",
        tx::now_ms!(),
        " AS now FROM durable_sessions WHERE id = $1 FOR NO KEY UPDATE"
    ))
    .bind(id.as_str())
    .fetch_optional(&mut *tx)
    .await
    .map_err(db)?
    .ok_or_else(|| StoreError::SessionNotFound(id.clone()))?;
    let now: i64 = get(&row, "now")?;
    let status: String = get(&row, "status")?;
    let holder: Option<String> = get(&row, "lease_owner")?;
    let held_until: Option<i64> = get(&row, "lease_expires_at")?;
    let previous = Previous {
        recovery_attempts: get(&row, "recovery_attempts")?,
        unreleased: holder.is_some(),
        ran: get(&row, "lease_ran")?,
    };
    let refusal = if status != SessionStatus::Active.as_str() {
        Some(StoreError::NotResumable {
            session: id.clone(),
            status,
        })
    } else if let (Some(holder), Some(until)) = (holder, held_until)
        && holder != owner
        && until > now
    {
        Some(StoreError::Leased {
            session: id.clone(),
            owner: holder,
            expires_at: until,
            remaining_ms: until - now,
        })
    } else {
        None
    };
    if let Some(refusal) = refusal {
        // Release the row lock now rather than when the pool gets round to rolling
        // back a dropped transaction: a refused worker must not delay the holder.
        tx.rollback().await.map_err(db)?;
        return Err(refusal);
    }
    let taken = take_lease(&mut tx, id, owner, &previous, now, ttl, max_attempts).await?;
    // A park is committed, then reported as the error.
    tx.commit().await.map_err(db)?;
    match taken {
        Taken::Granted(lease) => Ok(lease),
        Taken::Parked { attempts } => Err(StoreError::Parked {
            session: id.clone(),
            attempts,
        }),
    }
}

pub(crate) async fn renew_lease(
    store: &PostgresStore,
    lease: &Lease,
    ttl: Duration,
) -> Result<Lease, StoreError> {
    let mut tx = tx::begin(&store.pool).await?;
    let now = tx::lock_fenced(
        &mut tx,
        store.keyring(),
        lease.fence(),
        Lock::Update,
        Want::default(),
    )
    .await?
    .now;
    let expires = now.saturating_add(ttl_ms(ttl));
    // Lease bookkeeping is not a session update: `updated_at` stays (as in SQLite). An
    // expired lease in a limited queue is not renewed: a claim may have counted its
    // place free meanwhile and taken another session of the queue.
    let renewed = sqlx::query(
        "UPDATE durable_sessions SET lease_expires_at = $2, lease_renewed_at = $3 \
         WHERE id = $1 AND NOT (coalesce(lease_expires_at <= $3, false) \
           AND EXISTS (SELECT 1 FROM durable_queues q WHERE q.name = durable_sessions.queue))",
    )
    .bind(lease.session.as_str())
    .bind(expires)
    .bind(now)
    .execute(&mut *tx)
    .await
    .map_err(db)?;
    if renewed.rows_affected() == 0 {
        tx.rollback().await.map_err(db)?;
        return Err(StoreError::LeaseLost {
            session: lease.session.clone(),
            token: lease.fence,
        });
    }
    tx.commit().await.map_err(db)?;
    Ok(Lease {
        expires_at: expires,
        ..lease.clone()
    })
}

pub(crate) async fn release_lease(store: &PostgresStore, lease: &Lease) -> Result<(), StoreError> {
    // One statement still: the notification goes with the release, and only if the
    // lease was still this holder's.
    sqlx::query(concat!(
        "WITH released AS (UPDATE durable_sessions SET lease_owner = NULL, lease_expires_at = ",
        tx::now_ms!(),
        " WHERE id = $1 AND fence = $2 RETURNING 1) SELECT ",
        notify::pg_notify!(),
        " FROM released"
    ))
    .bind(lease.session.as_str())
    .bind(lease.fence)
    .execute(&mut *store.conn().await?)
    .await
    .map_err(db)?;
    Ok(())
}

pub(crate) async fn claim_expired(
    store: &PostgresStore,
    claim: &Claim,
) -> Result<Option<Lease>, StoreError> {
    claim.validate()?;
    let (owner, ttl, max_attempts) = (claim.owner.as_str(), claim.ttl, claim.max_attempts);
    // Queues at their limit: not candidates in this claim. Counted once here (per
    // limited queue, not per candidate row); a queue that fills meanwhile is caught by
    // the count under its lock below, and joins the list.
    let mut full: Vec<String> = sqlx::query_scalar(concat!(
        "SELECT q.name FROM durable_queues q WHERE q.max_running <= \
         (SELECT count(*) FROM durable_sessions r WHERE r.status = 'active' \
          AND r.queue = q.name AND r.lease_owner IS NOT NULL AND r.lease_expires_at > ",
        tx::now_ms!(),
        ")"
    ))
    .fetch_all(&mut *store.conn().await?)
    .await
    .map_err(db)?;
    // Tenants at their limit, the same way.
    let mut full_tenants: Vec<String> = sqlx::query_scalar(concat!(
        "SELECT t.name FROM durable_tenants t WHERE t.max_running <= \
         (SELECT count(*) FROM durable_sessions r WHERE r.status = 'active' \
          AND r.tenant = t.name AND r.lease_owner IS NOT NULL AND r.lease_expires_at > ",
        tx::now_ms!(),
        ")"
    ))
    .fetch_all(&mut *store.conn().await?)
    .await
    .map_err(db)?;
    loop {
        let mut tx = tx::begin(&store.pool).await?;
        // The count under the queue's lock must see every claim committed before the lock
        // was granted: a fresh snapshot per statement, whatever the server's default.
        sqlx::query("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        let now = tx::now(&mut tx).await?;
        // SKIP LOCKED: a row another claimer is looking at is not a candidate for us,
        // so concurrent workers on many machines never claim the same session. A queue
        // found full is passed over here; the count that decides is taken below, under
        // the queue's lock.
        let Some(row) = sqlx::query(
            "SELECT id, recovery_attempts, lease_owner, lease_ran, queue, tenant FROM durable_sessions
             WHERE status = 'active'
               AND (lease_owner IS NULL OR lease_expires_at IS NULL OR lease_expires_at <= $1)
               AND (wake_at IS NULL OR wake_at <= $1)
               AND (waiting_until IS NULL OR waiting_until <= $1)
               AND ($2::text IS NULL OR app_version = $2)
               AND (cardinality($3::text[]) = 0 OR queue = ANY($3))
               AND NOT (queue = ANY($4))
               AND (tenant IS NULL OR NOT (tenant = ANY($5)))
               -- Waiting for an operator: a resume refused one of its in-doubt rows as
               -- replay-unsafe (`mark_operator_needed`); claimable again once the row
               -- leaves `issued` or is issued again.
               AND NOT EXISTS (SELECT 1 FROM durable_tool_calls c
                   WHERE c.session_id = durable_sessions.id AND c.status = 'issued'
                     AND c.operator_needed_at IS NOT NULL)
             -- Lowest rank first: `created_at`, less the weight of its priority.
             ORDER BY coalesce(claim_rank, created_at), id
             LIMIT 1
             FOR UPDATE SKIP LOCKED",
        )
        .bind(now)
        .bind(claim.app_version.as_deref())
        .bind(&claim.queues)
        .bind(&full)
        .bind(&full_tenants)
        .fetch_optional(&mut *tx)
        .await
        .map_err(db)?
        else {
            tx.commit().await.map_err(db)?;
            return Ok(None);
        };
        let id = SessionId::new(get::<String>(&row, "id")?);
        let queue: String = get(&row, "queue")?;
        if queue_full(&mut tx, &queue, &id).await? {
            tx.commit().await.map_err(db)?;
            full.push(queue);
            continue;
        }
        let tenant: Option<String> = get(&row, "tenant")?;
        if let Some(tenant) = tenant
            && tenant_full(&mut tx, &tenant, &id).await?
        {
            tx.commit().await.map_err(db)?;
            full_tenants.push(tenant);
            continue;
        }
        let previous = Previous {
            recovery_attempts: get(&row, "recovery_attempts")?,
            unreleased: get::<Option<String>>(&row, "lease_owner")?.is_some(),
            ran: get(&row, "lease_ran")?,
        };
        let taken = take_lease(&mut tx, &id, owner, &previous, now, ttl, max_attempts).await?;
        tx.commit().await.map_err(db)?;
        match taken {
            Taken::Granted(lease) => return Ok(Some(lease)),
            Taken::Parked { .. } => continue,
        }
    }
}

/// Whether `queue` has no place left for `candidate`: its limit, if it has one, read
/// under the queue row's lock (`FOR UPDATE`: claimers of the queue take turns), then
/// its running sessions counted by a statement that sees every claim committed before
/// the lock was granted.
async fn queue_full(
    conn: &mut PgConnection,
    queue: &str,
    candidate: &SessionId,
) -> Result<bool, StoreError> {
    let limit: Option<i64> =
        sqlx::query_scalar("SELECT max_running FROM durable_queues WHERE name = $1 FOR UPDATE")
            .bind(queue)
            .fetch_optional(&mut *conn)
            .await
            .map_err(db)?;
    let Some(limit) = limit else {
        return Ok(false);
    };
    let running: i64 = sqlx::query_scalar(concat!(
        "SELECT count(*) FROM durable_sessions WHERE status = 'active' AND queue = $1 \
         AND id <> $2 AND lease_owner IS NOT NULL AND lease_expires_at > ",
        tx::now_ms!()
    ))
    .bind(queue)
    .bind(candidate.as_str())
    .fetch_one(&mut *conn)
    .await
    .map_err(db)?;
    Ok(running >= limit)
}

/// Whether `tenant` has no place left for `candidate`, as [`queue_full`] decides for a
/// queue: its limit read under the tenant row's lock, then its running sessions counted.
async fn tenant_full(
    conn: &mut PgConnection,
    tenant: &str,
    candidate: &SessionId,
) -> Result<bool, StoreError> {
    let limit: Option<i64> =
        sqlx::query_scalar("SELECT max_running FROM durable_tenants WHERE name = $1 FOR UPDATE")
            .bind(tenant)
            .fetch_optional(&mut *conn)
            .await
            .map_err(db)?;
    let Some(limit) = limit else {
        return Ok(false);
    };
    let running: i64 = sqlx::query_scalar(concat!(
        "SELECT count(*) FROM durable_sessions WHERE status = 'active' AND tenant = $1 \
         AND id <> $2 AND lease_owner IS NOT NULL AND lease_expires_at > ",
        tx::now_ms!()
    ))
    .bind(tenant)
    .bind(candidate.as_str())
    .fetch_one(&mut *conn)
    .await
    .map_err(db)?;
    Ok(running >= limit)
}

pub(crate) async fn list_expired(
    store: &PostgresStore,
    limit: i64,
) -> Result<Vec<SessionRecord>, StoreError> {
    sqlx::query(concat!(
        "WITH clock AS (SELECT ",
        tx::now_ms!(),
        " AS now) SELECT ",
        session_cols!(),
        " FROM durable_sessions, clock \
         WHERE status = 'active' AND (lease_owner IS NULL OR lease_expires_at IS NULL \
               OR lease_expires_at <= clock.now) \
           AND (wake_at IS NULL OR wake_at <= clock.now) \
           AND (waiting_until IS NULL OR waiting_until <= clock.now) \
         ORDER BY updated_at, id LIMIT $1"
    ))
    .bind(limit.max(0))
    .fetch_all(&mut *store.conn().await?)
    .await
    .map_err(db)?
    .iter()
    .map(rows::session)
    .collect()
}

pub(crate) async fn mark_running(
    store: &PostgresStore,
    fence: Fence<'_>,
) -> Result<(), StoreError> {
    // One autocommitted statement: durable at commit, like every write, so a death after
    // it counts.
    let marked =
        sqlx::query("UPDATE durable_sessions SET lease_ran = true WHERE id = $1 AND fence = $2")
            .bind(fence.session.as_str())
            .bind(fence.token)
            .execute(&store.pool)
            .await
            .map_err(db)?;
    if marked.rows_affected() == 0 {
        // Not found, or another token: the same errors as any fenced write.
        let mut conn = store.pool.acquire().await.map_err(db)?;
        tx::session(&mut conn, fence.session, None).await?;
        return Err(StoreError::LeaseLost {
            session: fence.session.clone(),
            token: fence.token,
        });
    }
    Ok(())
}

pub(crate) async fn mark_operator_needed(
    store: &PostgresStore,
    fence: Fence<'_>,
    call: &CallId,
) -> Result<(), StoreError> {
    // One autocommitted statement. The first refusal's time is kept.
    let marked = sqlx::query(concat!(
        "UPDATE durable_tool_calls SET operator_needed_at = ",
        tx::now_ms!(),
        " WHERE id = $1 AND session_id = $2 AND status = 'issued' \
         AND operator_needed_at IS NULL \
         AND EXISTS (SELECT 1 FROM durable_sessions WHERE id = $2 AND fence = $3)"
    ))
    .bind(call.as_str())
    .bind(fence.session.as_str())
    .bind(fence.token)
    .execute(&store.pool)
    .await
    .map_err(db)?;
    if marked.rows_affected() == 0 {
        // Settled or marked already (nothing to do), or not found, or another token.
        let mut conn = store.pool.acquire().await.map_err(db)?;
        let session = tx::session(&mut conn, fence.session, None).await?;
        if session.fence != fence.token {
            return Err(StoreError::LeaseLost {
                session: fence.session.clone(),
                token: fence.token,
            });
        }
    }
    Ok(())
}

pub(crate) async fn unpark_session(
    store: &PostgresStore,
    id: &SessionId,
) -> Result<SessionRecord, StoreError> {
    let mut tx = tx::begin(&store.pool).await?;
    // Notifies at commit (a rollback on any error below sends nothing).
    let now = tx::now_notifying(&mut tx).await?;
    let updated = sqlx::query(concat!(
        "UPDATE durable_sessions SET status = 'active', status_reason = NULL, \
         recovery_attempts = 0, lease_owner = NULL, lease_expires_at = NULL, \
         updated_at = $2 WHERE id = $1 AND status = 'parked' \
         RETURNING ",
        session_cols!()
    ))
    .bind(id.as_str())
    .bind(now)
    .fetch_optional(&mut *tx)
    .await
    .map_err(db)?;
    let record = match updated {
        Some(row) => rows::session(&row)?,
        None => {
            let current = tx::session(&mut tx, id, None).await?;
            return Err(StoreError::NotParked {
                session: id.clone(),
                status: current.status.as_str().to_owned(),
            });
        }
    };
    tx.commit().await.map_err(db)?;
    Ok(record)
}

/// What a locked session row says about the lease that is being taken over.
pub(crate) struct Previous {
    /// Recoveries counted since the last checkpoint.
    pub(crate) recovery_attempts: i32,
    /// Whether the previous lease was never given up (`lease_owner` is still set: it
    /// expired, or its owner is taking it back after a restart).
    pub(crate) unreleased: bool,
    /// Whether the previous lease's holder had started running the session under it
    /// (`mark_running`). Taking over an unreleased lease so marked is a recovery: its
    /// holder died while it ran the session.
    pub(crate) ran: bool,
}

/// What [`take_lease`] did.
pub(crate) enum Taken {
    /// The lease is `owner`'s.
    Granted(Lease),
    /// The take-over was a recovery beyond the bound: the session is parked instead.
    Parked {
        /// The recoveries counted before this one.
        attempts: i32,
    },
}

/// Gives the lease on a locked session row to `owner` until `now + ttl`, bumping the
/// fencing token: the one place a lease is taken over, for `acquire_lease` and
/// `claim_expired` alike, so both count recoveries by one rule. Taking over an unreleased
/// lease whose holder had started running the session is a recovery and counts an
/// attempt; when `max_attempts` are already counted the
/// session is parked instead (reason recorded, lease cleared, token bumped so a
/// straggler loses it).
pub(crate) async fn take_lease(
    conn: &mut PgConnection,
    id: &SessionId,
    owner: &str,
    previous: &Previous,
    now: i64,
    ttl: Duration,
    max_attempts: i32,
) -> Result<Taken, StoreError> {
    let attempts = previous.recovery_attempts;
    let recovery = previous.unreleased && previous.ran;
    if recovery && attempts >= max_attempts {
        sqlx::query(
            "UPDATE durable_sessions
             SET status = 'parked', status_reason = $2, lease_owner = NULL,
                 lease_expires_at = NULL, fence = fence + 1, updated_at = $3
             WHERE id = $1",
        )
        .bind(id.as_str())
        .bind(format!("recovery attempts exhausted ({attempts})"))
        .bind(now)
        .execute(&mut *conn)
        .await
        .map_err(db)?;
        tracing::warn!(session = %id, attempts, "parked session: recovery attempts exhausted");
        return Ok(Taken::Parked { attempts });
    }
    let expires = now.saturating_add(ttl_ms(ttl));
    let row = sqlx::query(
        "UPDATE durable_sessions
         SET fence = fence + 1, lease_owner = $2, lease_expires_at = $3, updated_at = $4,
             lease_renewed_at = $4, lease_ran = false,
             recovery_attempts = recovery_attempts + CASE WHEN $5 THEN 1 ELSE 0 END
         WHERE id = $1 RETURNING fence",
    )
    .bind(id.as_str())
    .bind(owner)
    .bind(expires)
    .bind(now)
    .bind(recovery)
    .fetch_one(&mut *conn)
    .await
    .map_err(db)?;
    Ok(Taken::Granted(Lease {
        session: id.clone(),
        owner: owner.to_owned(),
        fence: get(&row, "fence")?,
        expires_at: expires,
    }))
}

#[async_trait]
impl LeaseStore for PostgresStore {
    async fn acquire_lease(
        &self,
        id: &SessionId,
        owner: &str,
        ttl: Duration,
        max_attempts: i32,
    ) -> Result<Lease, StoreError> {
        acquire_lease(self, id, owner, ttl, max_attempts).await
    }

    async fn renew_lease(&self, lease: &Lease, ttl: Duration) -> Result<Lease, StoreError> {
        renew_lease(self, lease, ttl).await
    }

    async fn release_lease(&self, lease: &Lease) -> Result<(), StoreError> {
        release_lease(self, lease).await?;
        self.work_available();
        Ok(())
    }

    async fn mark_running(&self, fence: Fence<'_>) -> Result<(), StoreError> {
        mark_running(self, fence).await
    }

    async fn mark_operator_needed(
        &self,
        fence: Fence<'_>,
        call: &CallId,
    ) -> Result<(), StoreError> {
        mark_operator_needed(self, fence, call).await?;
        // A parent waiting for this session: it reads the child's need as an outcome.
        crate::family::wake_parent_now(self, fence.session).await?;
        self.work_available();
        Ok(())
    }

    async fn wait(&self, fence: Fence<'_>, wait: &Wait) -> Result<bool, StoreError> {
        let waiting = crate::family::wait(self, fence, wait).await?;
        if waiting {
            // The lease is given up: a place in its queue.
            self.work_available();
        }
        Ok(waiting)
    }

    async fn claim_expired(&self, claim: &Claim) -> Result<Option<Lease>, StoreError> {
        claim_expired(self, claim).await
    }

    async fn unpark_session(&self, id: &SessionId) -> Result<SessionRecord, StoreError> {
        let record = unpark_session(self, id).await?;
        self.work_available();
        Ok(record)
    }

    async fn list_expired(&self, limit: i64) -> Result<Vec<SessionRecord>, StoreError> {
        list_expired(self, limit).await
    }
}
