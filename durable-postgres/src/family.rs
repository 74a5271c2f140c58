//! Child sessions, waiting on them, and cancellation.
//!
//! Lock order: a parent's wait locks only its own row and reads its children; a child's
//! end locks the child (its fenced write), then its parent's row before the parent's
//! wait is cleared. So a wait and a child's end never miss each other: whichever locks
//! the parent second sees what the other committed (each statement of a READ COMMITTED
//! transaction reads a fresh snapshot).

use durable_core::store::{
    CancelEffect, CancelSession, CancelledSession, ChildRecord, FORMAT_VERSION, Fence, Lease,
    NewSession, SessionRecord, SessionStatus, WAITING_FOR_CHILDREN, WAITING_FOR_DEADLINE, Wait,
    WaitFor,
};
use durable_core::{SessionId, StoreError};
use sqlx::{PgConnection, Row};

use crate::PostgresStore;
use crate::error::db;
use crate::rows::{self, session_cols};
use crate::tx::{self, Lock, Want};

/// Whether an issued row of session `s` waits for an operator (SQL, `s` the session
/// table's alias).
macro_rules! operator_needed_sql {
    () => {
        "EXISTS (SELECT 1 FROM durable_tool_calls c WHERE c.session_id = s.id \
         AND c.status = 'issued' AND c.operator_needed_at IS NOT NULL)"
    };
}

pub(crate) async fn create_child(
    store: &PostgresStore,
    parent: &SessionId,
    new: NewSession,
) -> Result<(SessionRecord, Lease), StoreError> {
    crate::sessions::create_session(store, new, Some(parent)).await
}

pub(crate) async fn children(
    store: &PostgresStore,
    parent: &SessionId,
) -> Result<Vec<ChildRecord>, StoreError> {
    let found = sqlx::query(concat!(
        "SELECT ",
        session_cols!(),
        ", ",
        operator_needed_sql!(),
        " AS operator_needed FROM durable_sessions s WHERE s.parent_id = $1 \
         ORDER BY s.created_at, s.id"
    ))
    .bind(parent.as_str())
    .fetch_all(&mut *store.conn().await?)
    .await
    .map_err(db)?;
    found
        .iter()
        .map(|row| {
            let session = rows::session(row)?;
            let needed: bool = row.try_get("operator_needed").map_err(db)?;
            Ok(ChildRecord::new(session, needed))
        })
        .collect()
}

/// Ends the wait of `child`'s parent, if it waits for its children, inside the
/// transaction that ended the child: the parent's row is locked first (see the module
/// docs). Idle pools are told at commit.
pub(crate) async fn wake_parent(
    conn: &mut PgConnection,
    child: &SessionId,
) -> Result<(), StoreError> {
    let parent = sqlx::query(
        "SELECT 1 FROM durable_sessions \
         WHERE id = (SELECT parent_id FROM durable_sessions WHERE id = $1) FOR UPDATE",
    )
    .bind(child.as_str())
    .fetch_optional(&mut *conn)
    .await
    .map_err(db)?;
    if parent.is_none() {
        // Not a child: nobody to wake.
        return Ok(());
    }
    sqlx::query(concat!(
        "WITH woken AS (UPDATE durable_sessions SET waiting_for = NULL, waiting_until = NULL \
         WHERE id = (SELECT parent_id FROM durable_sessions WHERE id = $1) \
         AND waiting_for = $2 RETURNING 1) SELECT ",
        crate::notify::pg_notify!(),
        " FROM woken"
    ))
    .bind(child.as_str())
    .bind(WAITING_FOR_CHILDREN)
    .execute(&mut *conn)
    .await
    .map_err(db)?;
    Ok(())
}

/// Wakes the parent of `child` in a transaction of its own (after a mark written
/// outside one).
pub(crate) async fn wake_parent_now(
    store: &PostgresStore,
    child: &SessionId,
) -> Result<(), StoreError> {
    let mut tx = tx::begin(&store.pool).await?;
    wake_parent(&mut tx, child).await?;
    tx.commit().await.map_err(db)
}

pub(crate) async fn wait(
    store: &PostgresStore,
    fence: Fence<'_>,
    wait: &Wait,
) -> Result<bool, StoreError> {
    let (children, waiting_for, signal) = match &wait.wait_for {
        WaitFor::Children(children) => (children.as_slice(), WAITING_FOR_CHILDREN.to_owned(), None),
        WaitFor::Deadline => (&[][..], WAITING_FOR_DEADLINE.to_owned(), None),
        WaitFor::Signal(name) => (
            &[][..],
            durable_core::store::waiting_for_signal(name),
            Some(name.as_str()),
        ),
        _ => {
            return Err(StoreError::Unsupported {
                operation: "wait for this",
                backend: crate::error::BACKEND,
            });
        }
    };
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
    if let Some(name) = signal
        && crate::signals::pending(&mut tx, fence.session, name).await?
    {
        tx.rollback().await.map_err(db)?;
        return Ok(false);
    }
    let ids: Vec<&str> = children.iter().map(SessionId::as_str).collect();
    let ended = sqlx::query(concat!(
        "SELECT 1 FROM durable_sessions s WHERE s.id = ANY($1) AND s.parent_id = $2 \
         AND (s.status IN ('completed', 'failed', 'cancelled', 'parked') OR ",
        operator_needed_sql!(),
        ") LIMIT 1"
    ))
    .bind(&ids)
    .bind(fence.session.as_str())
    .fetch_optional(&mut *tx)
    .await
    .map_err(db)?;
    if ended.is_some() {
        tx.rollback().await.map_err(db)?;
        return Ok(false);
    }
    sqlx::query(
        "UPDATE durable_sessions SET waiting_for = $1, waiting_until = $2, \
         lease_owner = NULL, lease_expires_at = $3 WHERE id = $4 AND fence = $5",
    )
    .bind(&waiting_for)
    .bind(wait.until)
    .bind(now)
    .bind(fence.session.as_str())
    .bind(fence.token)
    .execute(&mut *tx)
    .await
    .map_err(db)?;
    tx.commit().await.map_err(db)?;
    Ok(true)
}

pub(crate) async fn cancel_session(
    store: &PostgresStore,
    cancel: &CancelSession,
) -> Result<Vec<CancelledSession>, StoreError> {
    cancel.validate()?;
    let mut tx = tx::begin(&store.pool).await?;
    // Notifies at commit: a session ended, a parent woken.
    let now = tx::now_notifying(&mut tx).await?;
    tx::session(&mut tx, &cancel.session, None).await?;
    let mut order = vec![cancel.session.clone()];
    let mut next = 0;
    while cancel.cascade && next < order.len() {
        let kids = sqlx::query(
            "SELECT id FROM durable_sessions WHERE parent_id = $1 ORDER BY created_at, id",
        )
        .bind(order[next].as_str())
        .fetch_all(&mut *tx)
        .await
        .map_err(db)?;
        for kid in kids {
            let id: String = kid.try_get(0).map_err(db)?;
            order.push(SessionId::new(id));
        }
        next += 1;
    }
    // Descendants locked before their ancestors: the order a child's end takes (its own
    // row, then its parent's to wake it), so that the two never wait on each other (a
    // cycle PostgreSQL breaks by aborting one of them).
    for id in order.iter().rev() {
        tx::session(&mut tx, id, Some(Lock::Update)).await?;
    }
    let reason = cancel.status_reason();
    let mut done = Vec::with_capacity(order.len());
    for id in order {
        let session = tx::session(&mut tx, &id, Some(Lock::Update)).await?;
        let effect = if session.status.is_terminal() {
            CancelEffect::AlreadyEnded
        } else {
            let held = session.status == SessionStatus::Active
                && session.lease_owner.is_some()
                && session.lease_expires_at.is_some_and(|at| at > now);
            sqlx::query(
                "UPDATE durable_sessions SET cancel_by = $1, cancel_reason = $2, \
                 cancel_requested_at = $3, \
                 status = CASE WHEN $4 THEN status ELSE 'cancelled' END, \
                 status_reason = CASE WHEN $4 THEN status_reason ELSE $5 END, \
                 lease_owner = CASE WHEN $4 THEN lease_owner ELSE NULL END, \
                 lease_expires_at = CASE WHEN $4 THEN lease_expires_at ELSE $3 END, \
                 fence = fence + CASE WHEN $4 THEN 0 ELSE 1 END, \
                 waiting_for = CASE WHEN $4 THEN waiting_for ELSE NULL END, \
                 waiting_until = CASE WHEN $4 THEN waiting_until ELSE NULL END, \
                 updated_at = $3 WHERE id = $6",
            )
            .bind(&cancel.by)
            .bind(&cancel.reason)
            .bind(now)
            .bind(held)
            .bind(&reason)
            .bind(id.as_str())
            .execute(&mut *tx)
            .await
            .map_err(db)?;
            let step_map = serde_json::json!([["@cancel", cancel.reason]]).to_string();
            sqlx::query(
                "INSERT INTO durable_migrations (session_id, from_version, to_version, \
                 step_map, migrated_by, format, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7)",
            )
            .bind(id.as_str())
            .bind(&session.app_version)
            .bind(&session.app_version)
            .bind(step_map)
            .bind(&cancel.by)
            .bind(FORMAT_VERSION)
            .bind(now)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
            if held {
                CancelEffect::Requested
            } else {
                wake_parent(&mut tx, &id).await?;
                CancelEffect::Cancelled
            }
        };
        done.push(CancelledSession {
            session: id,
            effect,
        });
    }
    tx.commit().await.map_err(db)?;
    Ok(done)
}
