//! Sessions: creating one with its initial checkpoint and first lease, reading and
//! listing them, and setting their status.

use async_trait::async_trait;
use durable_core::store::{
    CancelSession, CancelledSession, ChildRecord, DEFAULT_QUEUE, FORMAT_VERSION, Fence, Lease,
    ListedSession, NewSession, SessionFilter, SessionRecord, SessionStatus, SessionStore,
};
use durable_core::{SessionId, StoreError};
use sqlx::AssertSqlSafe;

use crate::SqliteStore;
use crate::checkpoints;
use crate::error::db;
use crate::rows::{self, json, session_cols};
use crate::seal::{HeadRow, StoreHead};
use crate::tx::{self, WriteTx, millis};

pub(crate) async fn create_session(
    store: &SqliteStore,
    new: NewSession,
    parent: Option<&SessionId>,
) -> Result<(SessionRecord, Lease), StoreError> {
    durable_core::validate::validate_new_session(&new.id, &new.owner, &new.app_version)?;
    let queue = new.queue.as_deref().unwrap_or(DEFAULT_QUEUE);
    durable_core::validate::validate_id("queue", queue)?;
    let began = std::time::Instant::now();
    let mut tx = WriteTx::begin(store.writer()).await?;
    let began = crate::clock::clock_read(began);
    let now = tx.now;
    let result = async {
        let conn = tx.conn();
        if let Some(parent) = parent {
            tx::session(&mut *conn, parent).await?;
        }
        let expires_at = now.saturating_add(millis(new.lease_ttl));
        let inserted = sqlx::query(
            "INSERT INTO durable_sessions (id, status, app_version, metadata, lease_owner, \
             lease_expires_at, fence, recovery_attempts, status_reason, latest_version, \
             created_at, updated_at, format, queue, wake_at, lease_renewed_at, parent_id) \
             VALUES (?, 'active', ?, ?, ?, ?, 1, 0, NULL, 0, ?, ?, ?, ?, ?, ?, ?) \
             ON CONFLICT (id) DO NOTHING",
        )
        .bind(new.id.as_str())
        .bind(&new.app_version)
        .bind(json(&new.metadata)?)
        .bind(&new.owner)
        .bind(expires_at)
        .bind(now)
        .bind(now)
        .bind(FORMAT_VERSION)
        .bind(queue)
        .bind(new.initial.wake_at)
        .bind(now)
        .bind(parent.map(SessionId::as_str))
        .execute(&mut *conn)
        .await
        .map_err(db)?;
        if inserted.rows_affected() == 0 {
            return Err(StoreError::SessionExists(new.id.clone()));
        }
        let ring = store.keyring();
        let (_, checkpoint_seal) = checkpoints::insert_sealed_checkpoint(
            &mut *conn,
            ring,
            now,
            &new.id,
            &new.app_version,
            0,
            &new.initial,
        )
        .await?;
        HeadRow {
            session: new.id.clone(),
            journal_rows: 0,
            latest_version: 0,
            resolutions: 0,
            issued_rows: Some(0),
            approvals: 0,
            checkpoint_seal,
            head: None,
        }
        .store(&mut *conn, ring)
        .await?;
        let record = tx::session(conn, &new.id).await?;
        let lease = Lease {
            session: new.id.clone(),
            owner: new.owner.clone(),
            fence: record.fence,
            expires_at,
        };
        Ok((record, lease))
    }
    .await;
    let (record, lease) = tx.finish(result).await?;
    // This process saw the lease being written: another worker of this process judges
    // it from now (see `clock`).
    store.leases().wrote(
        lease.session.as_str(),
        crate::clock::LeaseRow {
            owner: record.lease_owner.clone(),
            fence: record.fence,
            renewed_at: record.lease_renewed_at,
            expires_at: record.lease_expires_at,
        },
        began,
    );
    Ok((record, lease))
}

pub(crate) async fn session(
    store: &SqliteStore,
    id: &SessionId,
) -> Result<SessionRecord, StoreError> {
    let mut conn = crate::error::acquire(store.reader(), crate::error::Pool::Reader).await?;
    tx::session(&mut conn, id).await
}

pub(crate) async fn list_sessions(
    store: &SqliteStore,
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
    store: &SqliteStore,
    filter: &SessionFilter,
) -> Result<Vec<ListedSession>, StoreError> {
    list_rows(store, filter)
        .await?
        .iter()
        .map(rows::listed_session)
        .collect()
}

async fn list_rows(
    store: &SqliteStore,
    filter: &SessionFilter,
) -> Result<Vec<sqlx::sqlite::SqliteRow>, StoreError> {
    let mut sql = String::from(concat!(
        "SELECT ",
        session_cols!(),
        " FROM durable_sessions WHERE 1 = 1"
    ));
    if !filter.statuses.is_empty() {
        let marks = vec!["?"; filter.statuses.len()].join(", ");
        sql.push_str(&format!(" AND status IN ({marks})"));
    }
    if filter.updated_before.is_some() {
        sql.push_str(" AND updated_at < ?");
    }
    if filter.after.is_some() {
        // Keyset pagination: the rows after the cursor in the listing's order.
        sql.push_str(" AND (updated_at < ? OR (updated_at = ? AND id < ?))");
    }
    sql.push_str(" ORDER BY updated_at DESC, id DESC LIMIT ?");
    // Dynamic only in the number of placeholders; every value is bound.
    let mut query = sqlx::query(AssertSqlSafe(sql));
    for status in &filter.statuses {
        query = query.bind(status.as_str());
    }
    if let Some(before) = filter.updated_before {
        query = query.bind(before);
    }
    if let Some(after) = &filter.after {
        query = query
            .bind(after.updated_at)
            .bind(after.updated_at)
            .bind(after.id.as_str().to_owned());
    }
    query = query.bind(filter.limit.map_or(-1, |l| l.max(0)));
    query.fetch_all(store.reader()).await.map_err(db)
}

pub(crate) async fn set_status(
    store: &SqliteStore,
    fence: Fence<'_>,
    status: SessionStatus,
    reason: Option<&str>,
) -> Result<(), StoreError> {
    if let Some(reason) = reason {
        durable_core::validate::validate_text("status reason", reason)?;
    }
    let mut tx = WriteTx::begin(store.writer()).await?;
    let now = tx.now;
    let result = async {
        let conn = tx.conn();
        tx::fenced(&mut *conn, store.keyring(), fence).await?;
        let awaiting = status == SessionStatus::AwaitingApproval;
        let release = status.is_terminal() || status == SessionStatus::Parked || awaiting;
        // Awaiting approval only while something is requested (an operator may have
        // decided everything already); released either way, with no owner, so that the
        // next worker's take is not a recovery.
        sqlx::query(
            "UPDATE durable_sessions SET \
             status = CASE WHEN ?1 AND NOT EXISTS (SELECT 1 FROM durable_tool_calls \
               WHERE session_id = ?6 AND status = 'requested') THEN 'active' ELSE ?2 END, \
             status_reason = CASE WHEN ?1 AND NOT EXISTS (SELECT 1 FROM durable_tool_calls \
               WHERE session_id = ?6 AND status = 'requested') THEN NULL ELSE ?3 END, \
             updated_at = ?4, \
             lease_expires_at = CASE WHEN ?5 THEN ?4 ELSE lease_expires_at END, \
             lease_owner = CASE WHEN ?1 THEN NULL ELSE lease_owner END, \
             fence = fence + CASE WHEN ?5 THEN 1 ELSE 0 END WHERE id = ?6",
        )
        .bind(awaiting)
        .bind(status.as_str())
        .bind(reason)
        .bind(now)
        .bind(release)
        .bind(fence.session.as_str())
        .execute(&mut *conn)
        .await
        .map_err(db)?;
        if status.is_terminal() || status == SessionStatus::Parked {
            crate::family::wake_parent(conn, fence.session).await?;
        }
        Ok(())
    }
    .await;
    tx.finish(result).await
}

#[async_trait]
impl SessionStore for SqliteStore {
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
