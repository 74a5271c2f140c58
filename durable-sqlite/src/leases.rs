//! Leases and fencing tokens: taking a session (by id or by claiming an expired one),
//! renewing and giving the lease up, and the poison-pill counter that parks a session
//! whose recoveries keep dying (and `unpark_session`, an operator's way back).

use std::time::{Duration, Instant};

use async_trait::async_trait;
use durable_core::store::{Claim, Fence, Lease, LeaseStore, SessionRecord, SessionStatus, Wait};
use durable_core::{CallId, SessionId, StoreError};
use sqlx::{Row, SqliteConnection};

use crate::SqliteStore;
use crate::clock::{LeaseRow, Verdict};
use crate::error::db;
use crate::rows::{self, session_cols};
use crate::tx::{self, WriteTx, fenced_select, millis, now_sql};

/// Sessions a recovery may claim if their lease is free: active and awake (`now` bound
/// as `?1`). Whether a lease is free is judged by [`crate::clock`], not by comparing
/// wall clocks.
macro_rules! awake_where {
    () => {
        " WHERE status = 'active' AND (wake_at IS NULL OR wake_at <= ?1) \
          AND (waiting_until IS NULL OR waiting_until <= ?1) "
    };
}

/// Leaves out a session waiting for an operator: one of its in-doubt rows was refused
/// as replay-unsafe on a resume (`mark_operator_needed`). It is claimable again once the
/// row leaves `issued` (resolved) or is issued again. (The partial index of issued rows
/// serves the lookup.)
macro_rules! not_waiting_for_operator {
    () => {
        " AND NOT EXISTS (SELECT 1 FROM durable_tool_calls c \
           WHERE c.session_id = durable_sessions.id AND c.status = 'issued' \
           AND c.operator_needed_at IS NOT NULL) "
    };
}

/// The lease duration assumed for a row that does not carry its own (written before
/// `lease_renewed_at` existed): the runtime's default.
const FALLBACK_TTL: Duration = Duration::from_secs(30);

/// The lease of a session record, as [`crate::clock`] judges it.
fn lease_row(session: &SessionRecord) -> LeaseRow {
    LeaseRow {
        owner: session.lease_owner.clone(),
        fence: session.fence,
        renewed_at: session.lease_renewed_at,
        expires_at: session.lease_expires_at,
    }
}

/// The expiry and time left a `Leased` refusal reports for a lease judged held for
/// `remaining` more: the holder's own expiry while its clock agrees with ours (within a
/// second of what we observed), else our clock's `now + remaining`.
fn reported(session: &SessionRecord, now: i64, remaining: Duration) -> (i64, i64) {
    let observed = millis(remaining).max(1);
    match session.lease_expires_at {
        Some(at) if (at.saturating_sub(now) - observed).abs() <= 1_000 && at > now => {
            (at, at - now)
        }
        _ => (now.saturating_add(observed), observed),
    }
}

/// The lease row a take or renewal of `lease` at `renewed_at` wrote.
fn written(lease: &Lease, renewed_at: i64) -> LeaseRow {
    LeaseRow {
        owner: Some(lease.owner.clone()),
        fence: lease.fence,
        renewed_at: Some(renewed_at),
        expires_at: Some(lease.expires_at),
    }
}

pub(crate) async fn acquire_lease(
    store: &SqliteStore,
    id: &SessionId,
    owner: &str,
    ttl: Duration,
    max_attempts: i32,
) -> Result<Lease, StoreError> {
    durable_core::validate::validate_owner(owner)?;
    let began = Instant::now();
    let (mut tx, row) = WriteTx::begin_select(
        store.writer(),
        id,
        concat!(
            "BEGIN IMMEDIATE; SELECT ",
            now_sql!(),
            " AS now, lease_ran, ",
            session_cols!(),
            " FROM durable_sessions WHERE id = ?"
        ),
        |q| q.bind(id.as_str()),
    )
    .await?;
    let began = crate::clock::clock_read(began);
    let now = tx.now;
    let result = async {
        let row = row.ok_or_else(|| StoreError::SessionNotFound(id.clone()))?;
        let session = rows::session(&row)?;
        let conn = tx.conn();
        if session.status != SessionStatus::Active {
            return Err(StoreError::NotResumable {
                session: id.clone(),
                status: session.status.as_str().to_owned(),
            });
        }
        // Another owner's lease is judged by observation on this process's monotonic
        // clock (see `clock`); the same owner (a restarted worker) takes it back at once.
        if let Some(holder) = &session.lease_owner
            && holder != owner
            && let Verdict::Held { remaining } =
                store.leases().judge(id.as_str(), &lease_row(&session), ttl)
        {
            let (expires_at, remaining_ms) = reported(&session, now, remaining);
            return Err(StoreError::Leased {
                session: id.clone(),
                owner: holder.clone(),
                expires_at,
                remaining_ms,
            });
        }
        let previous = Previous {
            fence: session.fence,
            recovery_attempts: session.recovery_attempts,
            unreleased: session.lease_owner.is_some(),
            ran: rows::col(&row, "lease_ran", id, None)?,
        };
        take_lease(conn, id, owner, &previous, now, ttl, max_attempts).await
    }
    .await;
    // A park is committed, then reported as the error.
    match tx.finish(result).await? {
        Taken::Granted(lease) => {
            store
                .leases()
                .wrote(id.as_str(), written(&lease, now), began);
            Ok(lease)
        }
        Taken::Parked { attempts } => Err(StoreError::Parked {
            session: id.clone(),
            attempts,
        }),
    }
}

pub(crate) async fn renew_lease(
    store: &SqliteStore,
    lease: &Lease,
    ttl: Duration,
) -> Result<Lease, StoreError> {
    let began = Instant::now();
    let (tx, _, row) = WriteTx::begin_fenced(
        store.writer(),
        store.keyring(),
        lease.fence(),
        concat!(
            "BEGIN IMMEDIATE; ",
            fenced_select!(
                ", s.lease_expires_at, s.lease_renewed_at, s.lease_owner, \
                 EXISTS (SELECT 1 FROM durable_queues q WHERE q.name = s.queue) AS limited",
                ""
            )
        ),
        |q| q,
    )
    .await?;
    let began = crate::clock::clock_read(began);
    let now = tx.now;
    // A lapsed lease in a limited queue is not renewed: a claim may have counted its
    // place free meanwhile and taken another session of the queue. Lapsed: not renewed
    // for a full duration on this process's clock, the clock a claim judges it by.
    let current = LeaseRow {
        owner: rows::col(&row, "lease_owner", &lease.session, None)?,
        fence: lease.fence,
        renewed_at: rows::col(&row, "lease_renewed_at", &lease.session, None)?,
        expires_at: rows::col(&row, "lease_expires_at", &lease.session, None)?,
    };
    let limited: bool = rows::col(&row, "limited", &lease.session, None)?;
    if limited && store.leases().lapsed(lease.session.as_str(), &current, ttl) {
        return tx
            .finish(Err(StoreError::LeaseLost {
                session: lease.session.clone(),
                token: lease.fence,
            }))
            .await;
    }
    // Every renewal changes the row (its beat): `lease_renewed_at` moves forward even if
    // this process's wall clock went back, so that other processes see the holder alive.
    let renewed_at = current
        .renewed_at
        .map_or(now, |last| now.max(last.saturating_add(1)));
    let expires_at = renewed_at.saturating_add(millis(ttl));
    tx.commit_with(
        sqlx::query(
            "UPDATE durable_sessions SET lease_expires_at = ?, lease_renewed_at = ? \
             WHERE id = ?; COMMIT",
        )
        .bind(expires_at)
        .bind(renewed_at)
        .bind(lease.session.as_str()),
    )
    .await?;
    let renewed = Lease {
        expires_at,
        ..lease.clone()
    };
    store
        .leases()
        .wrote(lease.session.as_str(), written(&renewed, renewed_at), began);
    Ok(renewed)
}

pub(crate) async fn release_lease(store: &SqliteStore, lease: &Lease) -> Result<(), StoreError> {
    let mut tx = WriteTx::begin(store.writer()).await?;
    let now = tx.now;
    let result = sqlx::query(
        "UPDATE durable_sessions SET lease_owner = NULL, lease_expires_at = ? \
         WHERE id = ? AND fence = ?",
    )
    .bind(now)
    .bind(lease.session.as_str())
    .bind(lease.fence)
    .execute(tx.conn())
    .await
    .map(|_| ())
    .map_err(db);
    tx.finish(result).await
}

pub(crate) async fn claim_expired(
    store: &SqliteStore,
    claim: &Claim,
) -> Result<Option<Lease>, StoreError> {
    claim.validate()?;
    let (owner, ttl, max_attempts) = (claim.owner.as_str(), claim.ttl, claim.max_attempts);
    // The queues the claim may take from, as a JSON array for `json_each` (NULL: any).
    let queues = (!claim.queues.is_empty())
        .then(|| serde_json::Value::from(claim.queues.clone()).to_string());
    // One writer at a time (`BEGIN IMMEDIATE`): counting a queue's running sessions and
    // taking one are atomic, so two claims never both take a queue's last place.
    let began = Instant::now();
    let mut tx = WriteTx::begin(store.writer()).await?;
    let began = crate::clock::clock_read(began);
    let now = tx.now;
    let result = async {
        let conn = tx.conn();
        // The queues at their limit, counted once (per limited queue, not per candidate
        // row), as a JSON array for `json_each`.
        let full = full_groups(store, &mut *conn, ttl, Group::Queue).await?;
        // The tenants at their limit, the same way.
        let full_tenants = full_groups(store, &mut *conn, ttl, Group::Tenant).await?;
        loop {
            // The first candidate (by rank: `created_at`, less its priority's weight;
            // then `rowid`) whose lease is free:
            // a released one found by SQL, or a held one this process judges lapsed.
            // Every held candidate is judged, so that its sighting starts now.
            let released = sqlx::query(concat!(
                "SELECT id, fence, recovery_attempts, lease_owner, lease_renewed_at, \
                 lease_expires_at, lease_ran, coalesce(claim_rank, created_at) AS claim_order, rowid AS r \
                 FROM durable_sessions",
                awake_where!(),
                "AND lease_owner IS NULL AND (?2 IS NULL OR app_version = ?2) \
                 AND (?3 IS NULL OR queue IN (SELECT value FROM json_each(?3))) \
                 AND queue NOT IN (SELECT value FROM json_each(?4)) \
                 AND (tenant IS NULL OR tenant NOT IN (SELECT value FROM json_each(?5))) ",
                not_waiting_for_operator!(),
                "ORDER BY coalesce(claim_rank, created_at) ASC, rowid ASC LIMIT 1"
            ))
            .bind(now)
            .bind(claim.app_version.as_deref())
            .bind(queues.as_deref())
            .bind(full.as_str())
            .bind(full_tenants.as_str())
            .fetch_optional(&mut *conn)
            .await
            .map_err(db)?;
            let held = sqlx::query(concat!(
                "SELECT id, fence, recovery_attempts, lease_owner, lease_renewed_at, \
                 lease_expires_at, lease_ran, coalesce(claim_rank, created_at) AS claim_order, rowid AS r \
                 FROM durable_sessions",
                awake_where!(),
                "AND lease_owner IS NOT NULL AND (?2 IS NULL OR app_version = ?2) \
                 AND (?3 IS NULL OR queue IN (SELECT value FROM json_each(?3))) \
                 AND queue NOT IN (SELECT value FROM json_each(?4)) \
                 AND (tenant IS NULL OR tenant NOT IN (SELECT value FROM json_each(?5))) ",
                not_waiting_for_operator!(),
                "ORDER BY coalesce(claim_rank, created_at) ASC, rowid ASC"
            ))
            .bind(now)
            .bind(claim.app_version.as_deref())
            .bind(queues.as_deref())
            .bind(full.as_str())
            .bind(full_tenants.as_str())
            .fetch_all(&mut *conn)
            .await
            .map_err(db)?;
            let mut best: Option<Candidate> = released.as_ref().map(candidate).transpose()?;
            for row in &held {
                let found = candidate(row)?;
                let free =
                    store.leases().judge(found.id.as_str(), &found.lease, ttl) == Verdict::Free;
                if free && best.as_ref().is_none_or(|b| found.order < b.order) {
                    best = Some(found);
                }
            }
            let Some(found) = best else {
                return Ok(None);
            };
            let previous = Previous {
                fence: found.lease.fence,
                recovery_attempts: found.recovery_attempts,
                unreleased: found.lease.owner.is_some(),
                ran: found.ran,
            };
            match take_lease(conn, &found.id, owner, &previous, now, ttl, max_attempts).await? {
                Taken::Granted(lease) => return Ok(Some(lease)),
                Taken::Parked { .. } => continue,
            }
        }
    }
    .await;
    let lease = tx.finish(result).await?;
    if let Some(lease) = &lease {
        store
            .leases()
            .wrote(lease.session.as_str(), written(lease, now), began);
    }
    Ok(lease)
}

/// A session a claim may take, if its lease is free.
struct Candidate {
    id: SessionId,
    lease: LeaseRow,
    recovery_attempts: i32,
    /// Whether the lease's holder had started running the session.
    ran: bool,
    /// `(rank, rowid)`: claims take the lowest rank (the oldest, less its priority's
    /// weight) first.
    order: (i64, i64),
}

fn candidate(row: &sqlx::sqlite::SqliteRow) -> Result<Candidate, StoreError> {
    let id = SessionId::new(row.try_get::<String, _>("id").map_err(db)?);
    Ok(Candidate {
        lease: LeaseRow {
            owner: rows::col(row, "lease_owner", &id, None)?,
            fence: rows::col(row, "fence", &id, None)?,
            renewed_at: rows::col(row, "lease_renewed_at", &id, None)?,
            expires_at: rows::col(row, "lease_expires_at", &id, None)?,
        },
        recovery_attempts: rows::col(row, "recovery_attempts", &id, None)?,
        ran: rows::col(row, "lease_ran", &id, None)?,
        order: (
            rows::col(row, "claim_order", &id, None)?,
            rows::col(row, "r", &id, None)?,
        ),
        id,
    })
}

/// What a limit of running sessions is kept per: a queue or a tenant.
#[derive(Clone, Copy)]
enum Group {
    Queue,
    Tenant,
}

impl Group {
    /// The limits: each name with its `max_running`.
    fn limits_sql(self) -> &'static str {
        match self {
            Group::Queue => "SELECT name, max_running FROM durable_queues",
            Group::Tenant => "SELECT name, max_running FROM durable_tenants",
        }
    }

    /// The held leases of active sessions in a limited group, the group as column `grp`.
    fn held_sql(self) -> &'static str {
        match self {
            Group::Queue => {
                "SELECT id, queue AS grp, fence, lease_owner, lease_renewed_at, lease_expires_at \
                 FROM durable_sessions WHERE status = 'active' AND lease_owner IS NOT NULL \
                 AND queue IN (SELECT name FROM durable_queues)"
            }
            Group::Tenant => {
                "SELECT id, tenant AS grp, fence, lease_owner, lease_renewed_at, lease_expires_at \
                 FROM durable_sessions WHERE status = 'active' AND lease_owner IS NOT NULL \
                 AND tenant IN (SELECT name FROM durable_tenants)"
            }
        }
    }
}

/// The queues (or tenants) at their limit of running sessions, as a JSON array: running
/// means held under a lease this process does not judge lapsed.
async fn full_groups(
    store: &SqliteStore,
    conn: &mut SqliteConnection,
    fallback: Duration,
    group: Group,
) -> Result<String, StoreError> {
    let limits: Vec<(String, i64)> = sqlx::query_as(group.limits_sql())
        .fetch_all(&mut *conn)
        .await
        .map_err(db)?;
    if limits.is_empty() {
        return Ok("[]".to_owned());
    }
    let held = sqlx::query(group.held_sql())
        .fetch_all(&mut *conn)
        .await
        .map_err(db)?;
    let mut running: std::collections::HashMap<String, i64> = std::collections::HashMap::new();
    for row in &held {
        let id = SessionId::new(row.try_get::<String, _>("id").map_err(db)?);
        let lease = LeaseRow {
            owner: rows::col(row, "lease_owner", &id, None)?,
            fence: rows::col(row, "fence", &id, None)?,
            renewed_at: rows::col(row, "lease_renewed_at", &id, None)?,
            expires_at: rows::col(row, "lease_expires_at", &id, None)?,
        };
        if store.leases().judge(id.as_str(), &lease, fallback) != Verdict::Free {
            *running
                .entry(rows::col(row, "grp", &id, None)?)
                .or_default() += 1;
        }
    }
    let full: Vec<String> = limits
        .into_iter()
        .filter(|(name, max)| running.get(name).copied().unwrap_or(0) >= *max)
        .map(|(name, _)| name)
        .collect();
    Ok(serde_json::Value::from(full).to_string())
}

/// Active, awake sessions whose lease is free as this process judges it (released, or
/// seen unchanged for a full lease duration), least recently updated first. A lease
/// this process had not seen before is not free yet: its sighting starts now.
pub(crate) async fn list_expired(
    store: &SqliteStore,
    limit: i64,
) -> Result<Vec<SessionRecord>, StoreError> {
    let found = sqlx::query(concat!(
        "SELECT ",
        session_cols!(),
        " FROM durable_sessions",
        awake_where!(),
        "ORDER BY updated_at ASC, rowid ASC"
    ))
    .bind(tx::clock(store.reader()).await?)
    .fetch_all(store.reader())
    .await
    .map_err(db)?;
    let limit = usize::try_from(limit.max(0)).unwrap_or(usize::MAX);
    let mut expired = Vec::new();
    for row in &found {
        if expired.len() >= limit {
            break;
        }
        let session = rows::session(row)?;
        let free = store
            .leases()
            .judge(session.id.as_str(), &lease_row(&session), FALLBACK_TTL)
            == Verdict::Free;
        if free {
            expired.push(session);
        }
    }
    Ok(expired)
}

pub(crate) async fn mark_running(store: &SqliteStore, fence: Fence<'_>) -> Result<(), StoreError> {
    // One autocommitted statement on the writer: synced (`synchronous = FULL`) before
    // it returns, so a death after it counts.
    let marked =
        sqlx::query("UPDATE durable_sessions SET lease_ran = 1 WHERE id = ? AND fence = ?")
            .bind(fence.session.as_str())
            .bind(fence.token)
            .execute(store.writer())
            .await
            .map_err(db)?;
    if marked.rows_affected() == 0 {
        // Not found, or another token: the same errors as any fenced write.
        let mut conn = store.writer().acquire().await.map_err(db)?;
        tx::session(&mut conn, fence.session).await?;
        return Err(StoreError::LeaseLost {
            session: fence.session.clone(),
            token: fence.token,
        });
    }
    Ok(())
}

pub(crate) async fn mark_operator_needed(
    store: &SqliteStore,
    fence: Fence<'_>,
    call: &CallId,
) -> Result<(), StoreError> {
    // One autocommitted statement on the writer, synced before it returns. The first
    // refusal's time is kept.
    let marked = sqlx::query(concat!(
        "UPDATE durable_tool_calls SET operator_needed_at = ",
        now_sql!(),
        " WHERE id = ?1 AND session_id = ?2 AND status = 'issued' \
         AND operator_needed_at IS NULL \
         AND EXISTS (SELECT 1 FROM durable_sessions WHERE id = ?2 AND fence = ?3)"
    ))
    .bind(call.as_str())
    .bind(fence.session.as_str())
    .bind(fence.token)
    .execute(store.writer())
    .await
    .map_err(db)?;
    if marked.rows_affected() == 0 {
        // Settled or marked already (nothing to do), or not found, or another token.
        let mut conn = store.writer().acquire().await.map_err(db)?;
        let session = tx::session(&mut conn, fence.session).await?;
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
    store: &SqliteStore,
    id: &SessionId,
) -> Result<SessionRecord, StoreError> {
    let mut tx = WriteTx::begin(store.writer()).await?;
    let now = tx.now;
    let result = async {
        let conn = tx.conn();
        let current = tx::session(&mut *conn, id).await?;
        if current.status != SessionStatus::Parked {
            return Err(StoreError::NotParked {
                session: id.clone(),
                status: current.status.as_str().to_owned(),
            });
        }
        sqlx::query(
            "UPDATE durable_sessions SET status = 'active', status_reason = NULL, \
             recovery_attempts = 0, lease_owner = NULL, lease_expires_at = NULL, \
             updated_at = ? WHERE id = ?",
        )
        .bind(now)
        .bind(id.as_str())
        .execute(&mut *conn)
        .await
        .map_err(db)?;
        tx::session(conn, id).await
    }
    .await;
    tx.finish(result).await
}

/// What a session's row says about the lease that is being taken over.
pub(crate) struct Previous {
    /// The session's fencing token.
    pub(crate) fence: i64,
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

/// Gives the lease on a session to `owner` until `now + ttl` under a new fencing token:
/// the one place a lease is taken over, for `acquire_lease` and `claim_expired` alike, so
/// both count recoveries by one rule. Taking over an unreleased lease whose holder had
/// started running the session is a recovery and counts an attempt; when `max_attempts` are already counted the session is parked
/// instead (reason recorded, lease cleared, token bumped so a straggler loses it).
pub(crate) async fn take_lease(
    conn: &mut SqliteConnection,
    id: &SessionId,
    owner: &str,
    previous: &Previous,
    now: i64,
    ttl: Duration,
    max_attempts: i32,
) -> Result<Taken, StoreError> {
    let fence = previous.fence + 1;
    let attempts = previous.recovery_attempts;
    let recovery = previous.unreleased && previous.ran;
    if recovery && attempts >= max_attempts {
        sqlx::query(
            "UPDATE durable_sessions SET status = 'parked', status_reason = ?, \
             lease_owner = NULL, lease_expires_at = NULL, fence = ?, updated_at = ? \
             WHERE id = ?",
        )
        .bind(format!("recovery attempts exhausted ({attempts})"))
        .bind(fence)
        .bind(now)
        .bind(id.as_str())
        .execute(conn)
        .await
        .map_err(db)?;
        tracing::warn!(session = %id, attempts, "parked session: recovery attempts exhausted");
        return Ok(Taken::Parked { attempts });
    }
    let expires_at = now.saturating_add(millis(ttl));
    sqlx::query(
        "UPDATE durable_sessions SET fence = ?, lease_owner = ?, lease_expires_at = ?, \
         updated_at = ?, lease_renewed_at = ?, recovery_attempts = recovery_attempts + ?, \
         lease_ran = 0 WHERE id = ?",
    )
    .bind(fence)
    .bind(owner)
    .bind(expires_at)
    .bind(now)
    .bind(now)
    .bind(i32::from(recovery))
    .bind(id.as_str())
    .execute(conn)
    .await
    .map_err(db)?;
    Ok(Taken::Granted(Lease {
        session: id.clone(),
        owner: owner.to_owned(),
        fence,
        expires_at,
    }))
}

#[async_trait]
impl LeaseStore for SqliteStore {
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

    async fn claim_expired(&self, claim: &Claim) -> Result<Option<Lease>, StoreError> {
        claim_expired(self, claim).await
    }

    async fn wait(&self, fence: Fence<'_>, wait: &Wait) -> Result<bool, StoreError> {
        let waiting = crate::family::wait(self, fence, wait).await?;
        if waiting {
            // The lease is given up: a place in its queue.
            self.work_available();
        }
        Ok(waiting)
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
