//! The [`CheckpointStore`] implementation of [`SqliteStore`].
//!
//! Every write method is one `BEGIN IMMEDIATE` transaction ([`WriteTx`]) on the writer
//! connection; the statements themselves follow notes/SCHEMA.md. Reads that touch more
//! than one statement run in one deferred (snapshot) transaction on a reader connection.

use std::time::Duration;

use async_trait::async_trait;
use durable_core::store::{
    CallRecord, Checkpoint, CheckpointMeta, Durability, ErrorRecord, FORMAT_VERSION, Fence,
    FinishCall, IssueOutcome, Lease, MigrateSession, NewCall, NewCheckpoint, NewError, NewSession,
    PurgeOutcome, ResolutionRecord, ResolveCall, SessionFilter, SessionRecord, SessionStatus,
};
use durable_core::{CallId, CheckpointStore, SessionId, StoreError};
use sqlx::{AssertSqlSafe, Row};

use crate::error::{BACKEND, corrupt, db};
use crate::ops::{self, json};
use crate::rows::{self, session_cols};
use crate::tx::{WriteTx, millis};
use crate::{IN_MEMORY_SETTING, SqliteStore, checkpoint, journal, synchronous_name};

/// Sessions a recovery may claim: active, and with no live lease.
macro_rules! expired_where {
    () => {
        " WHERE status = 'active' AND (lease_owner IS NULL OR lease_expires_at IS NULL \
           OR lease_expires_at <= ?) "
    };
}

#[async_trait]
impl CheckpointStore for SqliteStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn keyring(&self) -> &durable_core::integrity::Keyring {
        SqliteStore::keyring(self)
    }

    async fn durability(&self) -> Result<Durability, StoreError> {
        let mut conn = self.writer().acquire().await.map_err(db)?;
        let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
            .fetch_one(&mut *conn)
            .await
            .map_err(db)?;
        let mode = mode.to_ascii_lowercase();
        let sync: i64 = sqlx::query_scalar("PRAGMA synchronous")
            .fetch_one(&mut *conn)
            .await
            .map_err(db)?;
        let unsafe_setting = if self.inner.in_memory {
            (!self.inner.accept_volatile).then(|| {
                if mode == "memory" {
                    IN_MEMORY_SETTING.to_owned()
                } else {
                    format!("journal_mode = {mode} (in-memory database)")
                }
            })
        } else if mode != "wal" {
            Some(format!("journal_mode = {mode}"))
        } else if sync < 2 {
            Some(format!("synchronous = {}", synchronous_name(sync)))
        } else {
            None
        };
        Ok(Durability { unsafe_setting })
    }

    async fn now(&self) -> Result<i64, StoreError> {
        let mut conn = self.reader().acquire().await.map_err(db)?;
        crate::tx::now(&mut conn).await
    }

    async fn create_session(&self, new: NewSession) -> Result<(SessionRecord, Lease), StoreError> {
        durable_core::ids::validate_new_session(&new.id, &new.owner, &new.app_version)?;
        let mut tx = WriteTx::begin(self.writer()).await?;
        let now = tx.now;
        let result = async {
            let conn = tx.conn();
            let expires_at = now.saturating_add(millis(new.lease_ttl));
            let inserted = sqlx::query(
                "INSERT INTO durable_sessions (id, status, app_version, metadata, lease_owner, \
                 lease_expires_at, fence, recovery_attempts, status_reason, latest_version, \
                 created_at, updated_at, format) \
                 VALUES (?, 'active', ?, ?, ?, ?, 1, 0, NULL, 0, ?, ?, ?) \
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
            .execute(&mut *conn)
            .await
            .map_err(db)?;
            if inserted.rows_affected() == 0 {
                return Err(StoreError::SessionExists(new.id.clone()));
            }
            let ring = self.keyring();
            let (_, checkpoint_seal) = ops::append_checkpoint(
                &mut *conn,
                ring,
                now,
                &new.id,
                &new.app_version,
                0,
                &new.initial,
            )
            .await?;
            crate::seal::HeadRow {
                session: new.id.clone(),
                journal_rows: 0,
                latest_version: 0,
                resolutions: 0,
                checkpoint_seal,
                head: None,
            }
            .store(&mut *conn, ring)
            .await?;
            let record = ops::load_session(conn, &new.id).await?;
            let lease = Lease {
                session: new.id.clone(),
                owner: new.owner.clone(),
                fence: record.fence,
                expires_at,
            };
            Ok((record, lease))
        }
        .await;
        tx.finish(result).await
    }

    async fn session(&self, id: &SessionId) -> Result<SessionRecord, StoreError> {
        let mut conn = self.reader().acquire().await.map_err(db)?;
        ops::load_session(&mut conn, id).await
    }

    async fn list_sessions(
        &self,
        filter: &SessionFilter,
    ) -> Result<Vec<SessionRecord>, StoreError> {
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
        sql.push_str(" ORDER BY updated_at DESC, rowid DESC LIMIT ?");
        // Dynamic only in the number of placeholders; every value is bound.
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for status in &filter.statuses {
            query = query.bind(status.as_str());
        }
        if let Some(before) = filter.updated_before {
            query = query.bind(before);
        }
        query = query.bind(filter.limit.map_or(-1, |l| l.max(0)));
        let found = query.fetch_all(self.reader()).await.map_err(db)?;
        found.iter().map(rows::session).collect()
    }

    async fn acquire_lease(
        &self,
        id: &SessionId,
        owner: &str,
        ttl: Duration,
        max_attempts: i32,
    ) -> Result<Lease, StoreError> {
        durable_core::ids::validate_owner(owner)?;
        let mut tx = WriteTx::begin(self.writer()).await?;
        let now = tx.now;
        let result = async {
            let conn = tx.conn();
            let session = ops::load_session(conn, id).await?;
            if session.status != SessionStatus::Active {
                return Err(StoreError::NotResumable {
                    session: id.clone(),
                    status: session.status.as_str().to_owned(),
                });
            }
            if let (Some(holder), Some(expires_at)) =
                (&session.lease_owner, session.lease_expires_at)
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
            let previous = ops::Previous {
                fence: session.fence,
                recovery_attempts: session.recovery_attempts,
                unreleased: session.lease_owner.is_some(),
            };
            ops::take_lease(conn, id, owner, &previous, now, ttl, max_attempts).await
        }
        .await;
        // A park is committed, then reported as the error.
        match tx.finish(result).await? {
            ops::Taken::Granted(lease) => Ok(lease),
            ops::Taken::Parked { attempts } => Err(StoreError::Parked {
                session: id.clone(),
                attempts,
            }),
        }
    }

    async fn renew_lease(&self, lease: &Lease, ttl: Duration) -> Result<Lease, StoreError> {
        let mut tx = WriteTx::begin(self.writer()).await?;
        let now = tx.now;
        let result = async {
            let conn = tx.conn();
            ops::fenced(&mut *conn, self.keyring(), lease.fence()).await?;
            let expires_at = now.saturating_add(millis(ttl));
            sqlx::query("UPDATE durable_sessions SET lease_expires_at = ? WHERE id = ?")
                .bind(expires_at)
                .bind(lease.session.as_str())
                .execute(conn)
                .await
                .map_err(db)?;
            Ok(Lease {
                expires_at,
                ..lease.clone()
            })
        }
        .await;
        tx.finish(result).await
    }

    async fn release_lease(&self, lease: &Lease) -> Result<(), StoreError> {
        let mut tx = WriteTx::begin(self.writer()).await?;
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

    async fn claim_expired(
        &self,
        owner: &str,
        ttl: Duration,
        max_attempts: i32,
    ) -> Result<Option<Lease>, StoreError> {
        durable_core::ids::validate_owner(owner)?;
        let mut tx = WriteTx::begin(self.writer()).await?;
        let now = tx.now;
        let result = async {
            let conn = tx.conn();
            loop {
                let Some(row) = sqlx::query(concat!(
                    "SELECT id, fence, recovery_attempts, lease_owner FROM durable_sessions",
                    expired_where!(),
                    "ORDER BY updated_at ASC, rowid ASC LIMIT 1"
                ))
                .bind(now)
                .fetch_optional(&mut *conn)
                .await
                .map_err(db)?
                else {
                    return Ok(None);
                };
                let id = SessionId::new(row.try_get::<String, _>("id").map_err(db)?);
                let previous = ops::Previous {
                    fence: rows::col(&row, "fence", &id, None)?,
                    recovery_attempts: rows::col(&row, "recovery_attempts", &id, None)?,
                    unreleased: rows::col::<Option<String>>(&row, "lease_owner", &id, None)?
                        .is_some(),
                };
                match ops::take_lease(conn, &id, owner, &previous, now, ttl, max_attempts).await? {
                    ops::Taken::Granted(lease) => return Ok(Some(lease)),
                    ops::Taken::Parked { .. } => continue,
                }
            }
        }
        .await;
        tx.finish(result).await
    }

    async fn list_expired(&self, limit: i64) -> Result<Vec<SessionRecord>, StoreError> {
        let found = sqlx::query(concat!(
            "SELECT ",
            session_cols!(),
            " FROM durable_sessions",
            expired_where!(),
            "ORDER BY updated_at ASC, rowid ASC LIMIT ?"
        ))
        .bind(self.now().await?)
        .bind(limit.max(0))
        .fetch_all(self.reader())
        .await
        .map_err(db)?;
        found.iter().map(rows::session).collect()
    }

    async fn unpark_session(&self, id: &SessionId) -> Result<SessionRecord, StoreError> {
        let mut tx = WriteTx::begin(self.writer()).await?;
        let now = tx.now;
        let result = async {
            let conn = tx.conn();
            let current = ops::load_session(&mut *conn, id).await?;
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
            ops::load_session(conn, id).await
        }
        .await;
        tx.finish(result).await
    }

    async fn set_status(
        &self,
        fence: Fence<'_>,
        status: SessionStatus,
        reason: Option<&str>,
    ) -> Result<(), StoreError> {
        if let Some(reason) = reason {
            durable_core::ids::validate_text("status reason", reason)?;
        }
        let mut tx = WriteTx::begin(self.writer()).await?;
        let now = tx.now;
        let result = async {
            let conn = tx.conn();
            ops::fenced(&mut *conn, self.keyring(), fence).await?;
            let release = status.is_terminal() || status == SessionStatus::Parked;
            sqlx::query(
                "UPDATE durable_sessions SET status = ?, status_reason = ?, updated_at = ?, \
                 lease_expires_at = CASE WHEN ? THEN ? ELSE lease_expires_at END, \
                 fence = fence + CASE WHEN ? THEN 1 ELSE 0 END WHERE id = ?",
            )
            .bind(status.as_str())
            .bind(reason)
            .bind(now)
            .bind(release)
            .bind(now)
            .bind(release)
            .bind(fence.session.as_str())
            .execute(conn)
            .await
            .map_err(db)?;
            Ok(())
        }
        .await;
        tx.finish(result).await
    }

    async fn save_checkpoint(
        &self,
        fence: Fence<'_>,
        expected: i64,
        checkpoint: NewCheckpoint,
    ) -> Result<CheckpointMeta, StoreError> {
        checkpoint::save_checkpoint(self, fence, expected, checkpoint).await
    }

    async fn load_checkpoint(
        &self,
        id: &SessionId,
        version: Option<i64>,
    ) -> Result<Checkpoint, StoreError> {
        checkpoint::load_checkpoint(self, id, version).await
    }

    async fn list_checkpoints(&self, id: &SessionId) -> Result<Vec<CheckpointMeta>, StoreError> {
        checkpoint::list_checkpoints(self, id).await
    }

    async fn fork_session(
        &self,
        id: &SessionId,
        version: i64,
        new_id: &SessionId,
        owner: &str,
        ttl: Duration,
    ) -> Result<(SessionRecord, Lease), StoreError> {
        new_id.validate()?;
        durable_core::ids::validate_owner(owner)?;
        checkpoint::fork_session(self, id, version, new_id, owner, ttl).await
    }

    async fn issue_call(
        &self,
        fence: Fence<'_>,
        call: NewCall,
    ) -> Result<IssueOutcome, StoreError> {
        journal::issue_call(self, fence, call).await
    }

    async fn record_call(
        &self,
        fence: Fence<'_>,
        call: NewCall,
        finish: FinishCall,
    ) -> Result<IssueOutcome, StoreError> {
        journal::record_call(self, fence, call, finish).await
    }

    async fn reissue_call(
        &self,
        fence: Fence<'_>,
        call: &CallId,
    ) -> Result<CallRecord, StoreError> {
        journal::reissue_call(self, fence, call).await
    }

    async fn finish_call(
        &self,
        fence: Fence<'_>,
        call: &CallId,
        finish: FinishCall,
        checkpoint: Option<(i64, NewCheckpoint)>,
    ) -> Result<Option<CheckpointMeta>, StoreError> {
        journal::finish_call(self, fence, call, finish, checkpoint).await
    }

    async fn call(&self, id: &CallId) -> Result<CallRecord, StoreError> {
        journal::call(self, id).await
    }

    async fn calls(
        &self,
        session: &SessionId,
        step: Option<i64>,
    ) -> Result<Vec<CallRecord>, StoreError> {
        journal::calls(self, session, step).await
    }

    async fn in_doubt(&self, session: Option<&SessionId>) -> Result<Vec<CallRecord>, StoreError> {
        journal::in_doubt(self, session).await
    }

    async fn resolve_call(&self, resolve: ResolveCall) -> Result<CallRecord, StoreError> {
        resolve.validate()?;
        journal::resolve_call(self, resolve).await
    }

    async fn resolutions(&self, session: &SessionId) -> Result<Vec<ResolutionRecord>, StoreError> {
        journal::resolutions(self, session).await
    }

    async fn record_error(&self, error: NewError) -> Result<(), StoreError> {
        error.validate()?;
        let mut tx = WriteTx::begin(self.writer()).await?;
        let now = tx.now;
        let result = async {
            let conn = tx.conn();
            let inserted = sqlx::query(
                "INSERT INTO durable_errors (session_id, step, context, attempt, message, \
                 created_at) SELECT id, ?, ?, ?, ?, ? FROM durable_sessions WHERE id = ?",
            )
            .bind(error.step)
            .bind(&error.context)
            .bind(error.attempt)
            .bind(&error.message)
            .bind(now)
            .bind(error.session.as_str())
            .execute(conn)
            .await
            .map_err(db)?;
            if inserted.rows_affected() == 0 {
                return Err(StoreError::SessionNotFound(error.session.clone()));
            }
            Ok(())
        }
        .await;
        tx.finish(result).await
    }

    async fn errors(&self, session: &SessionId) -> Result<Vec<ErrorRecord>, StoreError> {
        let found = sqlx::query(
            "SELECT session_id, step, context, attempt, message, created_at \
             FROM durable_errors WHERE session_id = ? ORDER BY id",
        )
        .bind(session.as_str())
        .fetch_all(self.reader())
        .await
        .map_err(db)?;
        found.iter().map(rows::error).collect()
    }

    async fn migrate_session(&self, migrate: MigrateSession) -> Result<SessionRecord, StoreError> {
        migrate.validate()?;
        let mut tx = WriteTx::begin(self.writer()).await?;
        let now = tx.now;
        let result = async {
            let conn = tx.conn();
            let id = &migrate.session;
            let session = ops::load_session(&mut *conn, id).await?;
            if session.app_version != migrate.from_version {
                return Err(StoreError::AppVersionMismatch {
                    session: id.clone(),
                    expected: migrate.from_version.clone(),
                    actual: session.app_version,
                });
            }
            sqlx::query("UPDATE durable_sessions SET app_version = ?, updated_at = ? WHERE id = ?")
                .bind(&migrate.to_version)
                .bind(now)
                .bind(id.as_str())
                .execute(&mut *conn)
                .await
                .map_err(db)?;
            // A mapping, not a chain: each row is renamed at most once, by the first pair
            // naming its tool (so `a→b, b→c` sends a to b and b to c, and swaps work).
            let journal =
                sqlx::query("SELECT id, tool_name FROM durable_tool_calls WHERE session_id = ?")
                    .bind(id.as_str())
                    .fetch_all(&mut *conn)
                    .await
                    .map_err(db)?;
            for row in &journal {
                let call: String = rows::col(row, "id", id, None)?;
                let tool: String = rows::col(row, "tool_name", id, None)?;
                if let Some((_, new)) = migrate.step_map.iter().find(|(old, _)| *old == tool) {
                    // Checked under its old name, re-sealed under the new one.
                    let ring = self.keyring();
                    let mut raw =
                        crate::seal::checked_call(&mut *conn, ring, &CallId::new(call.clone()))
                            .await?;
                    raw.tool = new.clone();
                    raw.seal(ring)?;
                    sqlx::query(
                        "UPDATE durable_tool_calls SET tool_name = ?, mac = ? WHERE id = ?",
                    )
                    .bind(new)
                    .bind(raw.mac.as_deref())
                    .bind(&call)
                    .execute(&mut *conn)
                    .await
                    .map_err(db)?;
                }
            }
            let step_map: Vec<[&str; 2]> = migrate
                .step_map
                .iter()
                .map(|(old, new)| [old.as_str(), new.as_str()])
                .collect();
            sqlx::query(
                "INSERT INTO durable_migrations (session_id, from_version, to_version, step_map, \
                 migrated_by, format, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(id.as_str())
            .bind(&migrate.from_version)
            .bind(&migrate.to_version)
            .bind(serde_json::to_string(&step_map).map_err(crate::error::encode)?)
            .bind(&migrate.by)
            .bind(FORMAT_VERSION)
            .bind(now)
            .execute(&mut *conn)
            .await
            .map_err(db)?;
            ops::load_session(conn, id).await
        }
        .await;
        tx.finish(result).await
    }

    async fn purge_session(
        &self,
        id: &SessionId,
        retention: Duration,
    ) -> Result<PurgeOutcome, StoreError> {
        let mut tx = WriteTx::begin(self.writer()).await?;
        let now = tx.now;
        let result = async {
            let conn = tx.conn();
            let row = sqlx::query("SELECT status, updated_at FROM durable_sessions WHERE id = ?")
                .bind(id.as_str())
                .fetch_optional(&mut *conn)
                .await
                .map_err(db)?
                .ok_or_else(|| StoreError::SessionNotFound(id.clone()))?;
            let status: String = rows::col(&row, "status", id, None)?;
            let status = SessionStatus::parse(&status)
                .ok_or_else(|| corrupt(id, None, format!("unknown session status `{status}`")))?;
            if !status.is_terminal() {
                return Ok(PurgeOutcome::NotTerminal);
            }
            let updated_at: i64 = rows::col(&row, "updated_at", id, None)?;
            if updated_at > now.saturating_sub(millis(retention)) {
                return Ok(PurgeOutcome::WithinRetention);
            }
            let in_doubt: bool = sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM durable_tool_calls \
                 WHERE session_id = ? AND status = 'issued')",
            )
            .bind(id.as_str())
            .fetch_one(&mut *conn)
            .await
            .map_err(db)?;
            if in_doubt {
                return Ok(PurgeOutcome::CallInDoubt);
            }
            for delete in [
                "DELETE FROM durable_resolutions WHERE session_id = ?",
                "DELETE FROM durable_migrations WHERE session_id = ?",
                "DELETE FROM durable_errors WHERE session_id = ?",
                "DELETE FROM durable_tool_calls WHERE session_id = ?",
                "DELETE FROM durable_checkpoints WHERE session_num = (SELECT num FROM durable_sessions WHERE id = ?)",
                "DELETE FROM durable_messages WHERE session_num = (SELECT num FROM durable_sessions WHERE id = ?)",
                "DELETE FROM durable_sessions WHERE id = ?",
            ] {
                sqlx::query(delete)
                    .bind(id.as_str())
                    .execute(&mut *conn)
                    .await
                    .map_err(db)?;
            }
            Ok(PurgeOutcome::Purged)
        }
        .await;
        tx.finish(result).await
    }
}
