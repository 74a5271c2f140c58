//! Sessions: creating one with its initial checkpoint and first lease, reading and
//! listing them, and setting their status.

use async_trait::async_trait;
use durable_core::StoreError;
use durable_core::ids::SessionId;
use durable_core::store::ListedSession;
use durable_core::store::SessionStore;
use durable_core::store::{
    CancelSession, CancelledSession, ChildRecord, DEFAULT_QUEUE, FORMAT_VERSION, Fence, Lease,
    NewSession, SessionFilter, SessionRecord, SessionStatus,
};

use sqlx::PgConnection;

use crate::PostgresStore;
use crate::checkpoints;
use crate::error::db;
use crate::rows::{self, session_cols};
use crate::seal::{HeadRow, StoreHead};
use crate::tx::{self, Lock, Want, ttl_ms};

pub(crate) async fn create_session(
    store: &PostgresStore,
    new: NewSession,
    parent: Option<&SessionId>,
) -> Result<(SessionRecord, Lease), StoreError> {
    durable_core::validate::validate_new_session(&new.id, &new.owner, &new.app_version)?;
    let queue = new.queue.as_deref().unwrap_or(DEFAULT_QUEUE);
    durable_core::validate::validate_id("queue", queue)?;
    let mut tx = tx::begin(&store.pool).await?;
    // Notifies at commit (a rollback on any error below sends nothing).
    let now = tx::now_notifying(&mut tx).await?;
    if let Some(parent) = parent {
        tx::session(&mut tx, parent, None).await?;
    }
    let expires = now.saturating_add(ttl_ms(new.lease_ttl));
    let row = sqlx::query(concat!(
        "INSERT INTO durable_sessions (id, status, app_version, metadata, lease_owner, \
         lease_expires_at, fence, recovery_attempts, status_reason, latest_version, \
         created_at, updated_at, format, queue, wake_at, lease_renewed_at, parent_id) \
         VALUES ($1, 'active', $2, $3, $4, $5, 1, 0, NULL, 0, $6, $6, $7, $8, $9, $6, $10) \
         ON CONFLICT (id) DO NOTHING RETURNING ",
        session_cols!()
    ))
    .bind(new.id.as_str())
    .bind(&new.app_version)
    .bind(new.metadata.to_string())
    .bind(&new.owner)
    .bind(expires)
    .bind(now)
    .bind(FORMAT_VERSION)
    .bind(queue)
    .bind(new.initial.wake_at)
    .bind(parent.map(SessionId::as_str))
    .fetch_optional(&mut *tx)
    .await
    .map_err(db)?
    .ok_or_else(|| StoreError::SessionExists(new.id.clone()))?;
    let record = rows::session(&row)?;
    let ring = store.keyring();
    let mut tail = checkpoints::Tail::default();
    checkpoints::insert_sealed_checkpoint(
        &mut tx,
        ring,
        &new.id,
        &new.app_version,
        &mut tail,
        &new.initial,
        now,
    )
    .await?;
    HeadRow {
        session: new.id.clone(),
        journal_rows: 0,
        latest_version: 0,
        resolutions: 0,
        issued_rows: Some(0),
        approvals: 0,
        checkpoint_seal: tail.checkpoint_seal,
        head: None,
    }
    .store(&mut tx, ring)
    .await?;
    tx.commit().await.map_err(db)?;
    let lease = Lease {
        session: new.id,
        owner: new.owner,
        fence: record.fence,
        expires_at: expires,
    };
    Ok((record, lease))
}

pub(crate) async fn session(
    store: &PostgresStore,
    id: &SessionId,
) -> Result<SessionRecord, StoreError> {
    let mut conn = store.conn().await?;
    tx::session(&mut conn, id, None).await
}

pub(crate) async fn list_sessions(
    store: &PostgresStore,
    filter: &SessionFilter,
) -> Result<Vec<SessionRecord>, StoreError> {
    list_rows(store, filter)
        .await?
        .iter()
        .map(rows::session)
        .collect()
}

/// [`list_sessions`], a row that cannot be read listed as unreadable.
pub(crate) async fn list_session_rows(
    store: &PostgresStore,
    filter: &SessionFilter,
) -> Result<Vec<ListedSession>, StoreError> {
    list_rows(store, filter)
        .await?
        .iter()
        .map(rows::listed_session)
        .collect()
}

async fn list_rows(
    store: &PostgresStore,
    filter: &SessionFilter,
) -> Result<Vec<sqlx::postgres::PgRow>, StoreError> {
    let statuses: Vec<&str> = filter.statuses.iter().map(|s| s.as_str()).collect();
    sqlx::query(concat!(
        "SELECT ",
        session_cols!(),
        " FROM durable_sessions \
         WHERE (cardinality($1::text[]) = 0 OR status = ANY($1::text[])) \
           AND ($2::bigint IS NULL OR updated_at < $2) \
           AND ($4::bigint IS NULL OR updated_at < $4 \
                OR (updated_at = $4 AND id COLLATE \"C\" < $5::text COLLATE \"C\")) \
         ORDER BY updated_at DESC, id COLLATE \"C\" DESC \
         LIMIT $3"
    ))
    .bind(&statuses)
    .bind(filter.updated_before)
    .bind(filter.limit.map(|l| l.max(0)))
    .bind(filter.after.as_ref().map(|a| a.updated_at))
    .bind(filter.after.as_ref().map(|a| a.id.as_str()))
    .fetch_all(&mut *store.conn().await?)
    .await
    .map_err(db)
}

pub(crate) async fn set_status(
    store: &PostgresStore,
    fence: Fence<'_>,
    status: SessionStatus,
    reason: Option<&str>,
) -> Result<(), StoreError> {
    if let Some(reason) = reason {
        durable_core::validate::validate_text("status reason", reason)?;
    }
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
    update_status(&mut tx, fence.session, status, reason, now).await?;
    tx.commit().await.map_err(db)
}

/// Sets the status of a session whose fenced row `tx` holds locked; a terminal, parked
/// or awaiting one gives up its lease, and one that ends wakes a parent waiting for it.
pub(crate) async fn update_status(
    tx: &mut PgConnection,
    session: &SessionId,
    status: SessionStatus,
    reason: Option<&str>,
    now: i64,
) -> Result<(), StoreError> {
    // Terminal, parked or awaiting approval: the holder is done with the session, so the
    // lease ends and the token moves on (a straggler of the holder writes nothing more).
    let awaits = status == SessionStatus::AwaitingApproval;
    let releases = status.is_terminal() || status == SessionStatus::Parked || awaits;
    // Awaiting approval only while a requested row is left: every one decided already
    // (an operator was quicker than this call), the session stays `active` for the next
    // worker. Its lease is given up (no owner), not left to expire: a worker that takes
    // it next is not recovering from a crash. A release notifies idle pools at commit
    // (the session, or a place in its queue, is free), in the same statement.
    sqlx::query(concat!(
        "WITH decided AS (
           SELECT $6 AND NOT EXISTS (SELECT 1 FROM durable_tool_calls
                                     WHERE session_id = $1 AND status = 'requested') AS none_left),
         updated AS (
         UPDATE durable_sessions
         SET status = CASE WHEN (SELECT none_left FROM decided) THEN 'active' ELSE $2 END,
             status_reason = CASE WHEN (SELECT none_left FROM decided) THEN NULL ELSE $3 END,
             updated_at = $4,
             lease_owner = CASE WHEN $6 THEN NULL ELSE lease_owner END,
             lease_expires_at = CASE WHEN $5 THEN $4 ELSE lease_expires_at END,
             fence = fence + CASE WHEN $5 THEN 1 ELSE 0 END
         WHERE id = $1 RETURNING 1)
         SELECT ",
        crate::notify::pg_notify!(),
        " FROM updated WHERE $5"
    ))
    .bind(session.as_str())
    .bind(status.as_str())
    .bind(reason)
    .bind(now)
    .bind(releases)
    .bind(awaits)
    .execute(&mut *tx)
    .await
    .map_err(db)?;
    if status.is_terminal() || status == SessionStatus::Parked {
        crate::family::wake_parent(tx, session).await?;
    }
    Ok(())
}

#[async_trait]
impl SessionStore for PostgresStore {
    async fn create_session(&self, new: NewSession) -> Result<(SessionRecord, Lease), StoreError> {
        let created = create_session(self, new, None).await?;
        self.work_available();
        Ok(created)
    }

    async fn session(&self, id: &SessionId) -> Result<SessionRecord, StoreError> {
        session(self, id).await
    }

    async fn list_sessions(
        &self,
        filter: &SessionFilter,
    ) -> Result<Vec<SessionRecord>, StoreError> {
        list_sessions(self, filter).await
    }

    async fn list_session_rows(
        &self,
        filter: &SessionFilter,
    ) -> Result<Vec<ListedSession>, StoreError> {
        list_session_rows(self, filter).await
    }

    async fn set_status(
        &self,
        fence: Fence<'_>,
        status: SessionStatus,
        reason: Option<&str>,
    ) -> Result<(), StoreError> {
        set_status(self, fence, status, reason).await?;
        // The lease is given up: for a session still active, or a place in its queue.
        self.work_available();
        Ok(())
    }

    async fn create_child(
        &self,
        parent: &SessionId,
        new: NewSession,
    ) -> Result<(SessionRecord, Lease), StoreError> {
        let created = crate::family::create_child(self, parent, new).await?;
        self.work_available();
        Ok(created)
    }

    async fn children(&self, parent: &SessionId) -> Result<Vec<ChildRecord>, StoreError> {
        crate::family::children(self, parent).await
    }

    async fn cancel_session(
        &self,
        cancel: &CancelSession,
    ) -> Result<Vec<CancelledSession>, StoreError> {
        let done = crate::family::cancel_session(self, cancel).await?;
        // A session ended, a parent woken.
        self.work_available();
        Ok(done)
    }
}
