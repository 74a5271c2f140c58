//! Leases and fencing tokens: taking a session (by id or by claiming an expired one),
//! renewing and giving the lease up, and the poison-pill counter that parks a session
//! whose recoveries keep dying (and `unpark_session`, an operator's way back).

use std::time::Duration;

use durable_core::store::{Claim, Lease, SessionRecord, SessionStatus};
use durable_core::{SessionId, StoreError};
use sqlx::{Row, SqliteConnection};

use crate::SqliteStore;
use crate::error::db;
use crate::rows::{self, session_cols};
use crate::tx::{self, WriteTx, fenced_select, millis, now_sql};

/// Sessions a recovery may claim: active, with no live lease, and awake (both bound to
/// the same `now`, `?1`).
macro_rules! expired_where {
    () => {
        " WHERE status = 'active' AND (lease_owner IS NULL OR lease_expires_at IS NULL \
           OR lease_expires_at <= ?1) AND (wake_at IS NULL OR wake_at <= ?1) "
    };
}

/// Leaves out of a claim a session blocked on an operator: released (its handler gave it
/// up, `lease_owner` cleared) while an `unsafe_on_replay` call of it is in doubt. Only an
/// operator's resolution unblocks it (the row leaves `issued`), and then it is claimable
/// again. A session whose worker died (its lease expired, never released) is still
/// claimed: its resume may settle the call with the tool's verify hook. (The partial
/// index of issued rows serves the lookup.)
macro_rules! blocked_on_operator {
    () => {
        " AND NOT (lease_owner IS NULL AND EXISTS (SELECT 1 FROM durable_tool_calls c \
           WHERE c.session_id = durable_sessions.id AND c.status = 'issued' \
           AND c.replay_class = 'unsafe_on_replay')) "
    };
}

pub(crate) async fn acquire_lease(
    store: &SqliteStore,
    id: &SessionId,
    owner: &str,
    ttl: Duration,
    max_attempts: i32,
) -> Result<Lease, StoreError> {
    durable_core::validate::validate_owner(owner)?;
    let (mut tx, row) = WriteTx::begin_select(
        store.writer(),
        id,
        concat!(
            "BEGIN IMMEDIATE; SELECT ",
            now_sql!(),
            " AS now, ",
            session_cols!(),
            " FROM durable_sessions WHERE id = ?"
        ),
        |q| q.bind(id.as_str()),
    )
    .await?;
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
        if let (Some(holder), Some(expires_at)) = (&session.lease_owner, session.lease_expires_at)
            && holder != owner
            && expires_at > now
        {
            return Err(StoreError::Leased {
                session: id.clone(),
                owner: holder.clone(),
                expires_at,
                remaining_ms: expires_at - now,
            });
        }
        let previous = Previous {
            fence: session.fence,
            recovery_attempts: session.recovery_attempts,
            unreleased: session.lease_owner.is_some(),
        };
        take_lease(conn, id, owner, &previous, now, ttl, max_attempts).await
    }
    .await;
    // A park is committed, then reported as the error.
    match tx.finish(result).await? {
        Taken::Granted(lease) => Ok(lease),
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
    let (tx, _, row) = WriteTx::begin_fenced(
        store.writer(),
        store.keyring(),
        lease.fence(),
        concat!(
            "BEGIN IMMEDIATE; ",
            fenced_select!(
                ", s.lease_expires_at, EXISTS (SELECT 1 FROM durable_queues q \
                 WHERE q.name = s.queue) AS limited",
                ""
            )
        ),
        |q| q,
    )
    .await?;
    let now = tx.now;
    // An expired lease in a limited queue is not renewed: a claim may have counted its
    // place free meanwhile and taken another session of the queue.
    let expired: Option<i64> = rows::col(&row, "lease_expires_at", &lease.session, None)?;
    let limited: bool = rows::col(&row, "limited", &lease.session, None)?;
    if limited && expired.is_some_and(|at| at <= now) {
        return tx
            .finish(Err(StoreError::LeaseLost {
                session: lease.session.clone(),
                token: lease.fence,
            }))
            .await;
    }
    let expires_at = now.saturating_add(millis(ttl));
    tx.commit_with(
        sqlx::query(
            "UPDATE durable_sessions SET lease_expires_at = ?, lease_renewed_at = ? \
             WHERE id = ?; COMMIT",
        )
        .bind(expires_at)
        .bind(now)
        .bind(lease.session.as_str()),
    )
    .await?;
    Ok(Lease {
        expires_at,
        ..lease.clone()
    })
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
    let mut tx = WriteTx::begin(store.writer()).await?;
    let now = tx.now;
    let result = async {
        let conn = tx.conn();
        // The queues at their limit, counted once (per limited queue, not per candidate
        // row), as a JSON array for `json_each`.
        let full: String = sqlx::query_scalar(
            "SELECT json_group_array(q.name) FROM durable_queues q WHERE q.max_running <= \
             (SELECT count(*) FROM durable_sessions r WHERE r.status = 'active' \
              AND r.queue = q.name AND r.lease_owner IS NOT NULL AND r.lease_expires_at > ?1)",
        )
        .bind(now)
        .fetch_one(&mut *conn)
        .await
        .map_err(db)?;
        loop {
            let Some(row) = sqlx::query(concat!(
                "SELECT id, fence, recovery_attempts, lease_owner FROM durable_sessions",
                expired_where!(),
                "AND (?2 IS NULL OR app_version = ?2) \
                 AND (?3 IS NULL OR queue IN (SELECT value FROM json_each(?3))) \
                 AND queue NOT IN (SELECT value FROM json_each(?4)) ",
                blocked_on_operator!(),
                "ORDER BY created_at ASC, rowid ASC LIMIT 1"
            ))
            .bind(now)
            .bind(claim.app_version.as_deref())
            .bind(queues.as_deref())
            .bind(full.as_str())
            .fetch_optional(&mut *conn)
            .await
            .map_err(db)?
            else {
                return Ok(None);
            };
            let id = SessionId::new(row.try_get::<String, _>("id").map_err(db)?);
            let previous = Previous {
                fence: rows::col(&row, "fence", &id, None)?,
                recovery_attempts: rows::col(&row, "recovery_attempts", &id, None)?,
                unreleased: rows::col::<Option<String>>(&row, "lease_owner", &id, None)?.is_some(),
            };
            match take_lease(conn, &id, owner, &previous, now, ttl, max_attempts).await? {
                Taken::Granted(lease) => return Ok(Some(lease)),
                Taken::Parked { .. } => continue,
            }
        }
    }
    .await;
    tx.finish(result).await
}

pub(crate) async fn list_expired(
    store: &SqliteStore,
    limit: i64,
) -> Result<Vec<SessionRecord>, StoreError> {
    let found = sqlx::query(concat!(
        "SELECT ",
        session_cols!(),
        " FROM durable_sessions",
        expired_where!(),
        "ORDER BY updated_at ASC, rowid ASC LIMIT ?2"
    ))
    .bind(tx::clock(store.reader()).await?)
    .bind(limit.max(0))
    .fetch_all(store.reader())
    .await
    .map_err(db)?;
    found.iter().map(rows::session).collect()
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
    /// expired, or its owner is taking it back after a restart). Taking it over is a
    /// recovery.
    pub(crate) unreleased: bool,
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
/// both count recoveries by one rule. Taking over an unreleased lease is a recovery and
/// counts an attempt; when `max_attempts` are already counted the session is parked
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
    if previous.unreleased && attempts >= max_attempts {
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
         updated_at = ?, lease_renewed_at = ?, recovery_attempts = recovery_attempts + ? \
         WHERE id = ?",
    )
    .bind(fence)
    .bind(owner)
    .bind(expires_at)
    .bind(now)
    .bind(now)
    .bind(i32::from(previous.unreleased))
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
