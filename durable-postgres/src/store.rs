//! [`CheckpointStore`] for [`PostgresStore`]: sessions, leases and checkpoints. The
//! journal half lives in [`crate::journal`].

use std::time::Duration;

use async_trait::async_trait;
use durable_core::StoreError;
use durable_core::ids::{CallId, SessionId};
use durable_core::integrity::Keyring;
use durable_core::store::{
    CallRecord, Checkpoint, CheckpointMeta, CheckpointStore, Durability, ErrorRecord,
    FORMAT_VERSION, Fence, FinishCall, IssueOutcome, Lease, MigrateSession, NewCall, NewCheckpoint,
    NewError, NewSession, PurgeOutcome, ResolutionRecord, ResolveCall, SessionFilter,
    SessionRecord, SessionStatus,
};

use crate::PostgresStore;
use crate::error::{BACKEND, db};
use crate::keys;
use crate::rows::{self, checkpoint_meta_cols, get, session_cols};
use crate::seal::HeadRow;
use crate::txn::{self, CheckpointRow, Lock, ttl_ms};

#[async_trait]
impl CheckpointStore for PostgresStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn keyring(&self) -> &Keyring {
        PostgresStore::keyring(self)
    }

    async fn durability(&self) -> Result<Durability, StoreError> {
        let row = sqlx::query(
            "SELECT current_setting('synchronous_commit') AS synchronous_commit,
                    current_setting('fsync') AS fsync",
        )
        .fetch_one(&self.pool)
        .await
        .map_err(db)?;
        let synchronous_commit: String = get(&row, "synchronous_commit")?;
        let fsync: String = get(&row, "fsync")?;
        let unsafe_setting = if synchronous_commit.eq_ignore_ascii_case("off") {
            Some(format!("synchronous_commit = {synchronous_commit}"))
        } else if fsync.eq_ignore_ascii_case("off") {
            Some(format!("fsync = {fsync}"))
        } else {
            None
        };
        Ok(Durability { unsafe_setting })
    }

    async fn now(&self) -> Result<i64, StoreError> {
        let mut conn = self.pool.acquire().await.map_err(db)?;
        txn::now(&mut conn).await
    }

    async fn create_session(&self, new: NewSession) -> Result<(SessionRecord, Lease), StoreError> {
        durable_core::ids::validate_new_session(&new.id, &new.owner, &new.app_version)?;
        let mut tx = self.pool.begin().await.map_err(db)?;
        let now = txn::now(&mut tx).await?;
        let expires = now.saturating_add(ttl_ms(new.lease_ttl));
        let row = sqlx::query(concat!(
            "INSERT INTO durable_sessions (id, status, app_version, metadata, lease_owner, \
             lease_expires_at, fence, recovery_attempts, status_reason, latest_version, \
             created_at, updated_at, format) \
             VALUES ($1, 'active', $2, $3, $4, $5, 1, 0, NULL, 0, $6, $6, $7) \
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
        .fetch_optional(&mut *tx)
        .await
        .map_err(db)?
        .ok_or_else(|| StoreError::SessionExists(new.id.clone()))?;
        let record = rows::session(&row)?;
        let ring = self.keyring();
        let mut tail = txn::Tail::default();
        txn::insert_sealed_checkpoint(
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

    async fn session(&self, id: &SessionId) -> Result<SessionRecord, StoreError> {
        let mut conn = self.pool.acquire().await.map_err(db)?;
        txn::session(&mut conn, id, None).await
    }

    async fn list_sessions(
        &self,
        filter: &SessionFilter,
    ) -> Result<Vec<SessionRecord>, StoreError> {
        let statuses: Vec<&str> = filter.statuses.iter().map(|s| s.as_str()).collect();
        sqlx::query(concat!(
            "SELECT ",
            session_cols!(),
            " FROM durable_sessions \
             WHERE (cardinality($1::text[]) = 0 OR status = ANY($1::text[])) \
               AND ($2::bigint IS NULL OR updated_at < $2) \
             ORDER BY updated_at DESC, created_at DESC, id DESC \
             LIMIT $3"
        ))
        .bind(&statuses)
        .bind(filter.updated_before)
        .bind(filter.limit.map(|l| l.max(0)))
        .fetch_all(&self.pool)
        .await
        .map_err(db)?
        .iter()
        .map(rows::session)
        .collect()
    }

    async fn acquire_lease(
        &self,
        id: &SessionId,
        owner: &str,
        ttl: Duration,
        max_attempts: i32,
    ) -> Result<Lease, StoreError> {
        durable_core::ids::validate_owner(owner)?;
        let mut tx = self.pool.begin().await.map_err(db)?;
        let now = txn::now(&mut tx).await?;
        let row = sqlx::query(
            "SELECT status, lease_owner, lease_expires_at, recovery_attempts
             FROM durable_sessions WHERE id = $1 FOR UPDATE",
        )
        .bind(id.as_str())
        .fetch_optional(&mut *tx)
        .await
        .map_err(db)?
        .ok_or_else(|| StoreError::SessionNotFound(id.clone()))?;
        let status: String = get(&row, "status")?;
        let holder: Option<String> = get(&row, "lease_owner")?;
        let held_until: Option<i64> = get(&row, "lease_expires_at")?;
        let previous = txn::Previous {
            recovery_attempts: get(&row, "recovery_attempts")?,
            unreleased: holder.is_some(),
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
        let taken = txn::take_lease(&mut tx, id, owner, &previous, now, ttl, max_attempts).await?;
        // A park is committed, then reported as the error.
        tx.commit().await.map_err(db)?;
        match taken {
            txn::Taken::Granted(lease) => Ok(lease),
            txn::Taken::Parked { attempts } => Err(StoreError::Parked {
                session: id.clone(),
                attempts,
            }),
        }
    }

    async fn renew_lease(&self, lease: &Lease, ttl: Duration) -> Result<Lease, StoreError> {
        let mut tx = self.pool.begin().await.map_err(db)?;
        let now = txn::lock_fenced(&mut tx, self.keyring(), lease.fence(), Lock::Update)
            .await?
            .now;
        let expires = now.saturating_add(ttl_ms(ttl));
        // Lease bookkeeping is not a session update: `updated_at` stays (as in SQLite).
        sqlx::query("UPDATE durable_sessions SET lease_expires_at = $2 WHERE id = $1")
            .bind(lease.session.as_str())
            .bind(expires)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        tx.commit().await.map_err(db)?;
        Ok(Lease {
            expires_at: expires,
            ..lease.clone()
        })
    }

    async fn release_lease(&self, lease: &Lease) -> Result<(), StoreError> {
        sqlx::query(concat!(
            "UPDATE durable_sessions SET lease_owner = NULL, lease_expires_at = ",
            txn::now_ms!(),
            " WHERE id = $1 AND fence = $2"
        ))
        .bind(lease.session.as_str())
        .bind(lease.fence)
        .execute(&self.pool)
        .await
        .map_err(db)?;
        Ok(())
    }

    async fn claim_expired(
        &self,
        owner: &str,
        ttl: Duration,
        max_attempts: i32,
    ) -> Result<Option<Lease>, StoreError> {
        durable_core::ids::validate_owner(owner)?;
        loop {
            let mut tx = self.pool.begin().await.map_err(db)?;
            let now = txn::now(&mut tx).await?;
            // SKIP LOCKED: a row another claimer is looking at is not a candidate for us,
            // so concurrent workers on many machines never claim the same session.
            let Some(row) = sqlx::query(
                "SELECT id, recovery_attempts, lease_owner FROM durable_sessions
                 WHERE status = 'active'
                   AND (lease_owner IS NULL OR lease_expires_at IS NULL OR lease_expires_at <= $1)
                 ORDER BY updated_at, id
                 LIMIT 1
                 FOR UPDATE SKIP LOCKED",
            )
            .bind(now)
            .fetch_optional(&mut *tx)
            .await
            .map_err(db)?
            else {
                tx.commit().await.map_err(db)?;
                return Ok(None);
            };
            let id = SessionId::new(get::<String>(&row, "id")?);
            let previous = txn::Previous {
                recovery_attempts: get(&row, "recovery_attempts")?,
                unreleased: get::<Option<String>>(&row, "lease_owner")?.is_some(),
            };
            let taken =
                txn::take_lease(&mut tx, &id, owner, &previous, now, ttl, max_attempts).await?;
            tx.commit().await.map_err(db)?;
            match taken {
                txn::Taken::Granted(lease) => return Ok(Some(lease)),
                txn::Taken::Parked { .. } => continue,
            }
        }
    }

    async fn list_expired(&self, limit: i64) -> Result<Vec<SessionRecord>, StoreError> {
        sqlx::query(concat!(
            "SELECT ",
            session_cols!(),
            " FROM durable_sessions \
             WHERE status = 'active' AND (lease_owner IS NULL OR lease_expires_at IS NULL \
                   OR lease_expires_at <= ",
            txn::now_ms!(),
            ") ORDER BY updated_at, id LIMIT $1"
        ))
        .bind(limit.max(0))
        .fetch_all(&self.pool)
        .await
        .map_err(db)?
        .iter()
        .map(rows::session)
        .collect()
    }

    async fn unpark_session(&self, id: &SessionId) -> Result<SessionRecord, StoreError> {
        let mut tx = self.pool.begin().await.map_err(db)?;
        let now = txn::now(&mut tx).await?;
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
                let current = txn::session(&mut tx, id, None).await?;
                return Err(StoreError::NotParked {
                    session: id.clone(),
                    status: current.status.as_str().to_owned(),
                });
            }
        };
        tx.commit().await.map_err(db)?;
        Ok(record)
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
        let mut tx = self.pool.begin().await.map_err(db)?;
        let now = txn::lock_fenced(&mut tx, self.keyring(), fence, Lock::Update)
            .await?
            .now;
        let releases = status.is_terminal() || status == SessionStatus::Parked;
        sqlx::query(
            "UPDATE durable_sessions
             SET status = $2, status_reason = $3, updated_at = $4,
                 lease_expires_at = CASE WHEN $5 THEN $4 ELSE lease_expires_at END,
                 fence = fence + CASE WHEN $5 THEN 1 ELSE 0 END
             WHERE id = $1",
        )
        .bind(fence.session.as_str())
        .bind(status.as_str())
        .bind(reason)
        .bind(now)
        .bind(releases)
        .execute(&mut *tx)
        .await
        .map_err(db)?;
        tx.commit().await.map_err(db)
    }

    async fn save_checkpoint(
        &self,
        fence: Fence<'_>,
        expected: i64,
        checkpoint: NewCheckpoint,
    ) -> Result<CheckpointMeta, StoreError> {
        let mut tx = self.pool.begin().await.map_err(db)?;
        let ring = self.keyring();
        let mut locked = txn::lock_fenced(&mut tx, ring, fence, Lock::Update).await?;
        let now = locked.now;
        let meta = txn::append_checkpoint(
            &mut tx,
            ring,
            fence.session,
            &mut locked,
            expected,
            checkpoint,
            now,
        )
        .await?;
        tx.commit().await.map_err(db)?;
        Ok(meta)
    }

    async fn load_checkpoint(
        &self,
        id: &SessionId,
        version: Option<i64>,
    ) -> Result<Checkpoint, StoreError> {
        self.checkpoint(id, version).await
    }

    async fn list_checkpoints(&self, id: &SessionId) -> Result<Vec<CheckpointMeta>, StoreError> {
        let mut conn = self.pool.acquire().await.map_err(db)?;
        // Distinguish "no such session" from "no checkpoints".
        txn::session(&mut conn, id, None).await?;
        sqlx::query(concat!(
            "SELECT ",
            checkpoint_meta_cols!(),
            " FROM durable_checkpoints WHERE session_id = $1 ORDER BY version"
        ))
        .bind(id.as_str())
        .fetch_all(&mut *conn)
        .await
        .map_err(db)?
        .iter()
        .map(rows::checkpoint_meta)
        .collect()
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
        let mut tx = self.pool.begin().await.map_err(db)?;
        let now = txn::now(&mut tx).await?;
        let source =
            sqlx::query("SELECT app_version, metadata, format FROM durable_sessions WHERE id = $1")
                .bind(id.as_str())
                .fetch_optional(&mut *tx)
                .await
                .map_err(db)?
                .ok_or_else(|| StoreError::SessionNotFound(id.clone()))?;
        let cp = sqlx::query(
            "SELECT last_seq, message_count, plan, budget, state, format FROM durable_checkpoints
             WHERE session_id = $1 AND version = $2",
        )
        .bind(id.as_str())
        .bind(version)
        .fetch_optional(&mut *tx)
        .await
        .map_err(db)?
        .ok_or_else(|| StoreError::VersionNotFound {
            session: id.clone(),
            version,
        })?;
        let cp_format: i32 = get(&cp, "format")?;
        rows::check_format(id, Some(version), "the checkpoint", cp_format)?;
        let app_version: String = get(&source, "app_version")?;
        let expires = now.saturating_add(ttl_ms(ttl));
        let row = sqlx::query(concat!(
            "INSERT INTO durable_sessions (id, status, app_version, metadata, lease_owner, \
             lease_expires_at, fence, recovery_attempts, status_reason, latest_version, \
             created_at, updated_at, format) \
             VALUES ($1, 'active', $2, $3, $4, $5, 1, 0, NULL, 0, $6, $6, $7) \
             ON CONFLICT (id) DO NOTHING RETURNING ",
            session_cols!()
        ))
        .bind(new_id.as_str())
        .bind(&app_version)
        .bind(get::<String>(&source, "metadata")?)
        .bind(owner)
        .bind(expires)
        .bind(now)
        .bind(get::<i32>(&source, "format")?)
        .fetch_optional(&mut *tx)
        .await
        .map_err(db)?
        .ok_or_else(|| StoreError::SessionExists(new_id.clone()))?;
        let record = rows::session(&row)?;
        let last_seq: i64 = get(&cp, "last_seq")?;
        sqlx::query(
            "INSERT INTO durable_messages (session_id, seq, message, format, created_at)
             SELECT $1, seq, message, format, created_at FROM durable_messages
             WHERE session_id = $2 AND seq <= $3",
        )
        .bind(new_id.as_str())
        .bind(id.as_str())
        .bind(last_seq)
        .execute(&mut *tx)
        .await
        .map_err(db)?;
        txn::insert_checkpoint(
            &mut tx,
            CheckpointRow {
                session: new_id,
                version: 0,
                last_seq,
                message_count: get(&cp, "message_count")?,
                plan: get(&cp, "plan")?,
                budget: get(&cp, "budget")?,
                state: get(&cp, "state")?,
                app_version: &app_version,
                format: cp_format,
                seal: None,
            },
            now,
        )
        .await?;
        keys::reseal_session(&mut tx, None, self.keyring(), new_id).await?;
        tx.commit().await.map_err(db)?;
        let lease = Lease {
            session: new_id.clone(),
            owner: owner.to_owned(),
            fence: record.fence,
            expires_at: expires,
        };
        Ok((record, lease))
    }

    async fn issue_call(
        &self,
        fence: Fence<'_>,
        call: NewCall,
    ) -> Result<IssueOutcome, StoreError> {
        self.issue(fence, call, None).await
    }

    async fn record_call(
        &self,
        fence: Fence<'_>,
        call: NewCall,
        finish: FinishCall,
    ) -> Result<IssueOutcome, StoreError> {
        self.issue(fence, call, Some(finish)).await
    }

    async fn reissue_call(
        &self,
        fence: Fence<'_>,
        call: &CallId,
    ) -> Result<CallRecord, StoreError> {
        self.reissue(fence, call).await
    }

    async fn finish_call(
        &self,
        fence: Fence<'_>,
        call: &CallId,
        finish: FinishCall,
        checkpoint: Option<(i64, NewCheckpoint)>,
    ) -> Result<Option<CheckpointMeta>, StoreError> {
        self.finish(fence, call, finish, checkpoint).await
    }

    async fn call(&self, id: &CallId) -> Result<CallRecord, StoreError> {
        self.call_record(id).await
    }

    async fn calls(
        &self,
        session: &SessionId,
        step: Option<i64>,
    ) -> Result<Vec<CallRecord>, StoreError> {
        self.call_records(session, step).await
    }

    async fn in_doubt(&self, session: Option<&SessionId>) -> Result<Vec<CallRecord>, StoreError> {
        self.in_doubt_calls(session).await
    }

    async fn resolve_call(&self, resolve: ResolveCall) -> Result<CallRecord, StoreError> {
        resolve.validate()?;
        self.resolve(resolve).await
    }

    async fn resolutions(&self, session: &SessionId) -> Result<Vec<ResolutionRecord>, StoreError> {
        self.resolution_records(session).await
    }

    async fn record_error(&self, error: NewError) -> Result<(), StoreError> {
        error.validate()?;
        self.insert_error(error).await
    }

    async fn errors(&self, session: &SessionId) -> Result<Vec<ErrorRecord>, StoreError> {
        self.error_records(session).await
    }

    async fn migrate_session(&self, migrate: MigrateSession) -> Result<SessionRecord, StoreError> {
        migrate.validate()?;
        self.migrate(migrate).await
    }

    async fn purge_session(
        &self,
        id: &SessionId,
        retention: Duration,
    ) -> Result<PurgeOutcome, StoreError> {
        self.purge(id, retention).await
    }
}
