//! Child sessions, waiting on them, and cancellation.

use durable_core::store::{
    CancelEffect, CancelSession, CancelledSession, ChildRecord, Fence, Lease, NewSession,
    SessionRecord, SessionStatus, WAITING_FOR_CHILDREN, WAITING_FOR_DEADLINE, Wait, WaitFor,
};
use durable_core::{SessionId, StoreError};
use sqlx::{Row, SqliteConnection};

use crate::SqliteStore;
use crate::error::db;
use crate::rows::{self, session_cols};
use crate::tx::{self, WriteTx};

/// Whether an issued row of session `s` waits for an operator (SQL, `s` the session
/// table's alias).
macro_rules! operator_needed_sql {
    () => {
        "EXISTS (SELECT 1 FROM durable_tool_calls c WHERE c.session_id = s.id \
         AND c.status = 'issued' AND c.operator_needed_at IS NOT NULL)"
    };
}

pub(crate) async fn create_child(
    store: &SqliteStore,
    parent: &SessionId,
    new: NewSession,
) -> Result<(SessionRecord, Lease), StoreError> {
    crate::sessions::create_session(store, new, Some(parent)).await
}

pub(crate) async fn children(
    store: &SqliteStore,
    parent: &SessionId,
) -> Result<Vec<ChildRecord>, StoreError> {
    let found = sqlx::query(concat!(
        "SELECT ",
        session_cols!(),
        ", ",
        operator_needed_sql!(),
        " AS operator_needed FROM durable_sessions s WHERE s.parent_id = ? \
         ORDER BY s.created_at, s.rowid"
    ))
    .bind(parent.as_str())
    .fetch_all(store.reader())
    .await
    .map_err(db)?;
    found
        .iter()
        .map(|row| {
            let session = rows::session(row)?;
            let needed: bool = rows::col(row, "operator_needed", &session.id, None)?;
            Ok(ChildRecord::new(session, needed))
        })
        .collect()
}

/// Ends the wait of `child`'s parent, if it waits for its children (inside the
/// transaction that ended the child).
/// Wakes the parent of a child that ended, if it waits for its children: the child's id,
/// then [`WAITING_FOR_CHILDREN`].
pub(crate) const WAKE_PARENT: &str = "UPDATE durable_sessions SET waiting_for = NULL, \
     waiting_until = NULL WHERE id = (SELECT parent_id FROM durable_sessions WHERE id = ?) \
     AND waiting_for = ?";

pub(crate) async fn wake_parent(
    conn: &mut SqliteConnection,
    child: &SessionId,
) -> Result<(), StoreError> {
    sqlx::query(WAKE_PARENT)
        .bind(child.as_str())
        .bind(WAITING_FOR_CHILDREN)
        .execute(conn)
        .await
        .map_err(db)?;
    Ok(())
}

/// Wakes the parent of `child` after a mark made outside a transaction: the writer is
/// one connection, so a wait committed before the mark is seen here, and one committed
/// after it saw the mark.
pub(crate) async fn wake_parent_now(
    store: &SqliteStore,
    child: &SessionId,
) -> Result<(), StoreError> {
    let mut tx = WriteTx::begin(store.writer()).await?;
    let result = wake_parent(tx.conn(), child).await;
    tx.finish(result).await
}

pub(crate) async fn wait(
    store: &SqliteStore,
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
    let mut tx = WriteTx::begin(store.writer()).await?;
    let now = tx.now;
    let result = async {
        let conn = tx.conn();
        tx::fenced(&mut *conn, store.keyring(), fence).await?;
        if let Some(name) = signal
            && crate::signals::pending(&mut *conn, fence.session, name).await?
        {
            return Ok(false);
        }
        for child in children {
            let ended = sqlx::query(concat!(
                "SELECT 1 FROM durable_sessions s WHERE s.id = ? AND s.parent_id = ? \
                 AND (s.status IN ('completed', 'failed', 'cancelled', 'parked') OR ",
                operator_needed_sql!(),
                ")"
            ))
            .bind(child.as_str())
            .bind(fence.session.as_str())
            .fetch_optional(&mut *conn)
            .await
            .map_err(db)?;
            if ended.is_some() {
                return Ok(false);
            }
        }
        sqlx::query(
            "UPDATE durable_sessions SET waiting_for = ?, waiting_until = ?, \
             lease_owner = NULL, lease_expires_at = ? WHERE id = ? AND fence = ?",
        )
        .bind(&waiting_for)
        .bind(wait.until)
        .bind(now)
        .bind(fence.session.as_str())
        .bind(fence.token)
        .execute(&mut *conn)
        .await
        .map_err(db)?;
        Ok(true)
    }
    .await;
    tx.finish(result).await
}

pub(crate) async fn cancel_session(
    store: &SqliteStore,
    cancel: &CancelSession,
) -> Result<Vec<CancelledSession>, StoreError> {
    cancel.validate()?;
    let mut tx = WriteTx::begin(store.writer()).await?;
    let now = tx.now;
    let result = async {
        let conn = tx.conn();
        tx::session(&mut *conn, &cancel.session).await?;
        let mut order = vec![cancel.session.clone()];
        let mut next = 0;
        while cancel.cascade && next < order.len() {
            let kids = sqlx::query(
                "SELECT id FROM durable_sessions WHERE parent_id = ? ORDER BY created_at, rowid",
            )
            .bind(order[next].as_str())
            .fetch_all(&mut *conn)
            .await
            .map_err(db)?;
            for kid in kids {
                let id: String = kid.try_get(0).map_err(db)?;
                order.push(SessionId::new(id));
            }
            next += 1;
        }
        let reason = cancel.status_reason();
        let mut done = Vec::with_capacity(order.len());
        for id in order {
            let session = tx::session(&mut *conn, &id).await?;
            let effect = if session.status.is_terminal() {
                CancelEffect::AlreadyEnded
            } else {
                let held = session.status == SessionStatus::Active
                    && session.lease_owner.is_some()
                    && session.lease_expires_at.is_some_and(|at| at > now);
                sqlx::query(
                    "UPDATE durable_sessions SET cancel_by = ?1, cancel_reason = ?2, \
                     cancel_requested_at = ?3, \
                     status = CASE WHEN ?4 THEN status ELSE 'cancelled' END, \
                     status_reason = CASE WHEN ?4 THEN status_reason ELSE ?5 END, \
                     lease_owner = CASE WHEN ?4 THEN lease_owner ELSE NULL END, \
                     lease_expires_at = CASE WHEN ?4 THEN lease_expires_at ELSE ?3 END, \
                     fence = fence + CASE WHEN ?4 THEN 0 ELSE 1 END, \
                     waiting_for = CASE WHEN ?4 THEN waiting_for ELSE NULL END, \
                     waiting_until = CASE WHEN ?4 THEN waiting_until ELSE NULL END, \
                     updated_at = ?3 WHERE id = ?6",
                )
                .bind(&cancel.by)
                .bind(&cancel.reason)
                .bind(now)
                .bind(held)
                .bind(&reason)
                .bind(id.as_str())
                .execute(&mut *conn)
                .await
                .map_err(db)?;
                let step_map = serde_json::json!([["@cancel", cancel.reason]]).to_string();
                sqlx::query(
                    "INSERT INTO durable_migrations (session_id, from_version, to_version, \
                     step_map, migrated_by, format, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                )
                .bind(id.as_str())
                .bind(&session.app_version)
                .bind(&session.app_version)
                .bind(step_map)
                .bind(&cancel.by)
                .bind(durable_core::store::FORMAT_VERSION)
                .bind(now)
                .execute(&mut *conn)
                .await
                .map_err(db)?;
                if held {
                    CancelEffect::Requested
                } else {
                    wake_parent(&mut *conn, &id).await?;
                    CancelEffect::Cancelled
                }
            };
            done.push(CancelledSession {
                session: id,
                effect,
            });
        }
        Ok(done)
    }
    .await;
    tx.finish(result).await
}
