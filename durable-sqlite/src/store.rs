//! The [`CheckpointStore`] implementation of [`SqliteStore`].
//!
//! Every write method is one `BEGIN IMMEDIATE` transaction ([`WriteTx`]) on the writer
//! connection; the statements themselves follow notes/SCHEMA.md. Reads that touch more
//! than one statement run in one deferred (snapshot) transaction on a reader connection.

use std::time::Duration;

use async_trait::async_trait;
use durable_core::store::{
    CallOutcome, CallRecord, CallStatus, Checkpoint, CheckpointMeta, Durability, ErrorRecord,
    FORMAT_VERSION, Fence, FinishCall, IssueOutcome, Lease, MigrateSession, NewCall, NewCheckpoint,
    NewError, NewSession, PurgeOutcome, Resolution, ResolutionRecord, ResolveCall, SessionFilter,
    SessionRecord, SessionStatus,
};
use durable_core::{CallId, CheckpointStore, SessionId, StoreError};
use sqlx::{AssertSqlSafe, Row, SqliteConnection};

use crate::error::{BACKEND, check_format, corrupt, db, parse_json};
use crate::ops::{self, json, opt_json};
use crate::rows::{self, call_cols, meta_cols, session_cols};
use crate::tx::{WriteTx, millis, now_sql};
use crate::{IN_MEMORY_SETTING, SqliteStore, synchronous_name};

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
            ops::append_checkpoint(conn, now, &new.id, &new.app_version, 0, &new.initial).await?;
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
    ) -> Result<Lease, StoreError> {
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
                });
            }
            let fence = session.fence + 1;
            let expires_at = now.saturating_add(millis(ttl));
            sqlx::query(
                "UPDATE durable_sessions SET fence = ?, lease_owner = ?, lease_expires_at = ?, \
                 updated_at = ? WHERE id = ?",
            )
            .bind(fence)
            .bind(owner)
            .bind(expires_at)
            .bind(now)
            .bind(id.as_str())
            .execute(conn)
            .await
            .map_err(db)?;
            Ok(Lease {
                session: id.clone(),
                owner: owner.to_owned(),
                fence,
                expires_at,
            })
        }
        .await;
        tx.finish(result).await
    }

    async fn renew_lease(&self, lease: &Lease, ttl: Duration) -> Result<Lease, StoreError> {
        let mut tx = WriteTx::begin(self.writer()).await?;
        let now = tx.now;
        let result = async {
            let conn = tx.conn();
            ops::fenced(&mut *conn, lease.fence()).await?;
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
            "UPDATE durable_sessions SET lease_expires_at = ? WHERE id = ? AND fence = ?",
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
        let mut tx = WriteTx::begin(self.writer()).await?;
        let now = tx.now;
        let result = async {
            let conn = tx.conn();
            loop {
                let Some(row) = sqlx::query(concat!(
                    "SELECT id, fence, recovery_attempts FROM durable_sessions",
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
                let fence = rows::col::<i64>(&row, "fence", &id, None)? + 1;
                let attempts: i32 = rows::col(&row, "recovery_attempts", &id, None)?;
                if attempts >= max_attempts {
                    // Parking bumps the fence too: a straggling holder loses its lease.
                    sqlx::query(
                        "UPDATE durable_sessions SET status = 'parked', status_reason = ?, \
                         lease_owner = NULL, lease_expires_at = NULL, fence = ?, updated_at = ? \
                         WHERE id = ?",
                    )
                    .bind(format!("recovery attempts exhausted ({attempts})"))
                    .bind(fence)
                    .bind(now)
                    .bind(id.as_str())
                    .execute(&mut *conn)
                    .await
                    .map_err(db)?;
                    continue;
                }
                let expires_at = now.saturating_add(millis(ttl));
                sqlx::query(
                    "UPDATE durable_sessions SET recovery_attempts = recovery_attempts + 1, \
                     fence = ?, lease_owner = ?, lease_expires_at = ?, updated_at = ? WHERE id = ?",
                )
                .bind(fence)
                .bind(owner)
                .bind(expires_at)
                .bind(now)
                .bind(id.as_str())
                .execute(&mut *conn)
                .await
                .map_err(db)?;
                return Ok(Some(Lease {
                    session: id,
                    owner: owner.to_owned(),
                    fence,
                    expires_at,
                }));
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

    async fn set_status(
        &self,
        fence: Fence<'_>,
        status: SessionStatus,
        reason: Option<&str>,
    ) -> Result<(), StoreError> {
        let mut tx = WriteTx::begin(self.writer()).await?;
        let now = tx.now;
        let result = async {
            let conn = tx.conn();
            ops::fenced(&mut *conn, fence).await?;
            let release = status.is_terminal() || status == SessionStatus::Parked;
            sqlx::query(
                "UPDATE durable_sessions SET status = ?, status_reason = ?, updated_at = ?, \
                 lease_expires_at = CASE WHEN ? THEN ? ELSE lease_expires_at END WHERE id = ?",
            )
            .bind(status.as_str())
            .bind(reason)
            .bind(now)
            .bind(release)
            .bind(now)
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
        let mut tx = WriteTx::begin(self.writer()).await?;
        let now = tx.now;
        let result = async {
            let conn = tx.conn();
            let fenced = ops::fenced(&mut *conn, fence).await?;
            ops::save_checkpoint(conn, now, fence.session, &fenced, expected, &checkpoint).await
        }
        .await;
        tx.finish(result).await
    }

    async fn load_checkpoint(
        &self,
        id: &SessionId,
        version: Option<i64>,
    ) -> Result<Checkpoint, StoreError> {
        // One snapshot for the three reads.
        let mut rtx = self.reader().begin().await.map_err(db)?;
        let latest: i64 =
            sqlx::query_scalar("SELECT latest_version FROM durable_sessions WHERE id = ?")
                .bind(id.as_str())
                .fetch_optional(&mut *rtx)
                .await
                .map_err(db)?
                .ok_or_else(|| StoreError::SessionNotFound(id.clone()))?;
        let version = version.unwrap_or(latest);
        let row = sqlx::query(concat!(
            "SELECT ",
            meta_cols!(),
            ", plan, budget, state, format FROM durable_checkpoints \
             WHERE session_id = ? AND version = ?"
        ))
        .bind(id.as_str())
        .bind(version)
        .fetch_optional(&mut *rtx)
        .await
        .map_err(db)?
        .ok_or_else(|| StoreError::VersionNotFound {
            session: id.clone(),
            version,
        })?;
        let v = Some(version);
        let format: i64 = rows::col(&row, "format", id, v)?;
        check_format(format, id, v, "the checkpoint")?;
        let meta = rows::checkpoint_meta(&row)?;
        let plan = parse_json(
            &rows::col::<String>(&row, "plan", id, v)?,
            id,
            v,
            "the plan",
        )?;
        let budget = parse_json(
            &rows::col::<String>(&row, "budget", id, v)?,
            id,
            v,
            "the budget",
        )?;
        let state = parse_json(
            &rows::col::<String>(&row, "state", id, v)?,
            id,
            v,
            "the state",
        )?;
        let logged = sqlx::query(
            "SELECT seq, message, format FROM durable_messages \
             WHERE session_id = ? AND seq <= ? ORDER BY seq",
        )
        .bind(id.as_str())
        .bind(meta.last_seq)
        .fetch_all(&mut *rtx)
        .await
        .map_err(db)?;
        rtx.commit().await.map_err(db)?;
        let mut messages = Vec::with_capacity(logged.len());
        for row in &logged {
            let seq: i64 = rows::col(row, "seq", id, v)?;
            let what = format!("message {seq}");
            check_format(rows::col(row, "format", id, v)?, id, v, &what)?;
            messages.push(parse_json(
                &rows::col::<String>(row, "message", id, v)?,
                id,
                v,
                &what,
            )?);
        }
        if i64::try_from(messages.len()).ok() != Some(meta.message_count) {
            return Err(corrupt(
                id,
                v,
                format!(
                    "the checkpoint counts {} messages but the log holds {} up to seq {}",
                    meta.message_count,
                    messages.len(),
                    meta.last_seq
                ),
            ));
        }
        Ok(Checkpoint {
            meta,
            messages,
            plan,
            budget,
            state,
        })
    }

    async fn list_checkpoints(&self, id: &SessionId) -> Result<Vec<CheckpointMeta>, StoreError> {
        let mut rtx = self.reader().begin().await.map_err(db)?;
        let exists: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM durable_sessions WHERE id = ?)")
                .bind(id.as_str())
                .fetch_one(&mut *rtx)
                .await
                .map_err(db)?;
        if !exists {
            return Err(StoreError::SessionNotFound(id.clone()));
        }
        let found = sqlx::query(concat!(
            "SELECT ",
            meta_cols!(),
            " FROM durable_checkpoints WHERE session_id = ? ORDER BY version"
        ))
        .bind(id.as_str())
        .fetch_all(&mut *rtx)
        .await
        .map_err(db)?;
        rtx.commit().await.map_err(db)?;
        found.iter().map(rows::checkpoint_meta).collect()
    }

    async fn fork_session(
        &self,
        id: &SessionId,
        version: i64,
        new_id: &SessionId,
        owner: &str,
        ttl: Duration,
    ) -> Result<(SessionRecord, Lease), StoreError> {
        let mut tx = WriteTx::begin(self.writer()).await?;
        let now = tx.now;
        let result = async {
            let conn = tx.conn();
            let source = ops::load_session(&mut *conn, id).await?;
            let cp = sqlx::query(
                "SELECT last_seq, message_count, plan, budget, state, format \
                 FROM durable_checkpoints WHERE session_id = ? AND version = ?",
            )
            .bind(id.as_str())
            .bind(version)
            .fetch_optional(&mut *conn)
            .await
            .map_err(db)?
            .ok_or_else(|| StoreError::VersionNotFound {
                session: id.clone(),
                version,
            })?;
            let v = Some(version);
            let format: i64 = rows::col(&cp, "format", id, v)?;
            check_format(format, id, v, "the checkpoint")?;
            let last_seq: i64 = rows::col(&cp, "last_seq", id, v)?;
            let expires_at = now.saturating_add(millis(ttl));
            // Metadata is copied as stored (bytes unchanged), like the transcript below.
            let inserted = sqlx::query(
                "INSERT INTO durable_sessions (id, status, app_version, metadata, lease_owner, \
                 lease_expires_at, fence, recovery_attempts, status_reason, latest_version, \
                 created_at, updated_at, format) \
                 SELECT ?, 'active', app_version, metadata, ?, ?, 1, 0, NULL, 0, ?, ?, format \
                 FROM durable_sessions WHERE id = ? \
                 ON CONFLICT (id) DO NOTHING",
            )
            .bind(new_id.as_str())
            .bind(owner)
            .bind(expires_at)
            .bind(now)
            .bind(now)
            .bind(id.as_str())
            .execute(&mut *conn)
            .await
            .map_err(db)?;
            if inserted.rows_affected() == 0 {
                return Err(StoreError::SessionExists(new_id.clone()));
            }
            // The transcript keeps its seqs and bytes; JSON is copied, not re-encoded.
            sqlx::query(
                "INSERT INTO durable_messages (session_id, seq, message, format, created_at) \
                 SELECT ?, seq, message, format, created_at FROM durable_messages \
                 WHERE session_id = ? AND seq <= ?",
            )
            .bind(new_id.as_str())
            .bind(id.as_str())
            .bind(last_seq)
            .execute(&mut *conn)
            .await
            .map_err(db)?;
            sqlx::query(
                "INSERT INTO durable_checkpoints (session_id, version, last_seq, message_count, \
                 plan, budget, state, app_version, format, created_at) \
                 SELECT ?, 0, last_seq, message_count, plan, budget, state, ?, format, ? \
                 FROM durable_checkpoints WHERE session_id = ? AND version = ?",
            )
            .bind(new_id.as_str())
            .bind(&source.app_version)
            .bind(now)
            .bind(id.as_str())
            .bind(version)
            .execute(&mut *conn)
            .await
            .map_err(db)?;
            let record = ops::load_session(conn, new_id).await?;
            let lease = Lease {
                session: new_id.clone(),
                owner: owner.to_owned(),
                fence: record.fence,
                expires_at,
            };
            Ok((record, lease))
        }
        .await;
        tx.finish(result).await
    }

    async fn issue_call(
        &self,
        fence: Fence<'_>,
        call: NewCall,
    ) -> Result<IssueOutcome, StoreError> {
        let mut tx = WriteTx::begin(self.writer()).await?;
        let now = tx.now;
        let result = insert_call(tx.conn(), now, fence, &call, None).await;
        tx.finish(result).await
    }

    async fn record_call(
        &self,
        fence: Fence<'_>,
        call: NewCall,
        finish: FinishCall,
    ) -> Result<IssueOutcome, StoreError> {
        let mut tx = WriteTx::begin(self.writer()).await?;
        let now = tx.now;
        let result = insert_call(tx.conn(), now, fence, &call, Some(&finish)).await;
        tx.finish(result).await
    }

    async fn reissue_call(
        &self,
        fence: Fence<'_>,
        call: &CallId,
    ) -> Result<CallRecord, StoreError> {
        let mut tx = WriteTx::begin(self.writer()).await?;
        let result = async {
            let conn = tx.conn();
            ops::fenced(&mut *conn, fence).await?;
            let state = ops::call_state(&mut *conn, call).await?;
            if state.session != *fence.session {
                return Err(StoreError::LeaseLost {
                    session: state.session,
                    token: fence.token,
                });
            }
            if !matches!(state.status, CallStatus::Issued | CallStatus::NotHappened) {
                return Err(StoreError::CallNotInDoubt {
                    call: call.clone(),
                    status: state.status.as_str().to_owned(),
                });
            }
            sqlx::query(
                "UPDATE durable_tool_calls SET attempt = attempt + 1, status = 'issued', \
                 fence = ?, finished_at = NULL, result = NULL, error = NULL, spend = NULL, \
                 mac = NULL WHERE id = ?",
            )
            .bind(fence.token)
            .bind(call.as_str())
            .execute(&mut *conn)
            .await
            .map_err(db)?;
            ops::load_call(conn, call).await
        }
        .await;
        tx.finish(result).await
    }

    async fn finish_call(
        &self,
        fence: Fence<'_>,
        call: &CallId,
        finish: FinishCall,
        checkpoint: Option<(i64, NewCheckpoint)>,
    ) -> Result<Option<CheckpointMeta>, StoreError> {
        let mut tx = WriteTx::begin(self.writer()).await?;
        let now = tx.now;
        let result = async {
            let conn = tx.conn();
            let fenced = ops::fenced(&mut *conn, fence).await?;
            let state = ops::call_state(&mut *conn, call).await?;
            if state.session != *fence.session {
                return Err(StoreError::LeaseLost {
                    session: state.session,
                    token: fence.token,
                });
            }
            if state.status != CallStatus::Issued {
                return Err(StoreError::CallNotInDoubt {
                    call: call.clone(),
                    status: state.status.as_str().to_owned(),
                });
            }
            let (status, result, error) = outcome_columns(&finish.outcome)?;
            sqlx::query(
                "UPDATE durable_tool_calls SET status = ?, result = ?, error = ?, spend = ?, \
                 mac = ?, finished_at = ? WHERE id = ?",
            )
            .bind(status.as_str())
            .bind(result)
            .bind(error)
            .bind(opt_json(finish.spend.as_ref())?)
            .bind(finish.mac.as_deref())
            .bind(now)
            .bind(call.as_str())
            .execute(&mut *conn)
            .await
            .map_err(db)?;
            match &checkpoint {
                Some((expected, cp)) => Ok(Some(
                    ops::save_checkpoint(conn, now, fence.session, &fenced, *expected, cp).await?,
                )),
                None => Ok(None),
            }
        }
        .await;
        tx.finish(result).await
    }

    async fn call(&self, id: &CallId) -> Result<CallRecord, StoreError> {
        let mut conn = self.reader().acquire().await.map_err(db)?;
        ops::load_call(&mut conn, id).await
    }

    async fn calls(
        &self,
        session: &SessionId,
        step: Option<i64>,
    ) -> Result<Vec<CallRecord>, StoreError> {
        let found = match step {
            Some(step) => sqlx::query(concat!(
                "SELECT ",
                call_cols!(),
                " FROM durable_tool_calls c WHERE c.session_id = ? AND c.step = ? ORDER BY c.seq"
            ))
            .bind(session.as_str())
            .bind(step),
            None => sqlx::query(concat!(
                "SELECT ",
                call_cols!(),
                " FROM durable_tool_calls c WHERE c.session_id = ? ORDER BY c.seq"
            ))
            .bind(session.as_str()),
        }
        .fetch_all(self.reader())
        .await
        .map_err(db)?;
        found.iter().map(rows::call).collect()
    }

    async fn in_doubt(&self, session: Option<&SessionId>) -> Result<Vec<CallRecord>, StoreError> {
        macro_rules! in_doubt_sql {
            ($filter:literal) => {
                concat!(
                    "SELECT ",
                    call_cols!(),
                    " FROM durable_tool_calls c JOIN durable_sessions s ON s.id = c.session_id \
                     WHERE c.status = 'issued' AND (s.fence <> c.fence OR s.lease_owner IS NULL \
                     OR s.lease_expires_at IS NULL OR s.lease_expires_at <= ",
                    now_sql!(),
                    ")",
                    $filter,
                    " ORDER BY s.rowid, c.seq"
                )
            };
        }
        let found = match session {
            Some(id) => sqlx::query(in_doubt_sql!(" AND c.session_id = ?")).bind(id.as_str()),
            None => sqlx::query(in_doubt_sql!("")),
        }
        .fetch_all(self.reader())
        .await
        .map_err(db)?;
        found.iter().map(rows::call).collect()
    }

    async fn resolve_call(&self, resolve: ResolveCall) -> Result<CallRecord, StoreError> {
        let mut tx = WriteTx::begin(self.writer()).await?;
        let now = tx.now;
        let result = async {
            let conn = tx.conn();
            let id = &resolve.call;
            let state = ops::call_state(&mut *conn, id).await?;
            if state.status != CallStatus::Issued {
                return Err(StoreError::CallNotInDoubt {
                    call: id.clone(),
                    status: state.status.as_str().to_owned(),
                });
            }
            let session = ops::load_session(&mut *conn, &state.session).await?;
            let live = session.lease_owner.is_some()
                && session.lease_expires_at.is_some_and(|at| at > now);
            if live && session.fence == state.fence {
                return Err(StoreError::CallNotInDoubt {
                    call: id.clone(),
                    status: "running".to_owned(),
                });
            }
            let (status, decision, result) = match &resolve.resolution {
                Resolution::Happened { result } => {
                    (CallStatus::Resolved, "happened", Some(json(result)?))
                }
                Resolution::DidNotHappen => (CallStatus::NotHappened, "did_not_happen", None),
            };
            sqlx::query(
                "UPDATE durable_tool_calls SET status = ?, result = ?, mac = ?, finished_at = ? \
                 WHERE id = ?",
            )
            .bind(status.as_str())
            .bind(result.as_deref())
            .bind(resolve.mac.as_deref())
            .bind(now)
            .bind(id.as_str())
            .execute(&mut *conn)
            .await
            .map_err(db)?;
            sqlx::query(
                "INSERT INTO durable_resolutions (call_id, session_id, decision, result, \
                 resolved_by, note, format, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(id.as_str())
            .bind(state.session.as_str())
            .bind(decision)
            .bind(result.as_deref())
            .bind(&resolve.by)
            .bind(resolve.note.as_deref())
            .bind(FORMAT_VERSION)
            .bind(now)
            .execute(&mut *conn)
            .await
            .map_err(db)?;
            ops::load_call(conn, id).await
        }
        .await;
        tx.finish(result).await
    }

    async fn resolutions(&self, session: &SessionId) -> Result<Vec<ResolutionRecord>, StoreError> {
        let found = sqlx::query(
            "SELECT call_id, session_id, decision, result, resolved_by, note, format, created_at \
             FROM durable_resolutions WHERE session_id = ? ORDER BY id",
        )
        .bind(session.as_str())
        .fetch_all(self.reader())
        .await
        .map_err(db)?;
        found.iter().map(rows::resolution).collect()
    }

    async fn record_error(&self, error: NewError) -> Result<(), StoreError> {
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
                    sqlx::query("UPDATE durable_tool_calls SET tool_name = ? WHERE id = ?")
                        .bind(new)
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
                "DELETE FROM durable_checkpoints WHERE session_id = ?",
                "DELETE FROM durable_messages WHERE session_id = ?",
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

/// `issue_call` (`finish = None`: status `issued`) and `record_call` (the outcome is
/// written with the new row): fence check, idempotency-key check, then insert-or-get on
/// the call identity.
async fn insert_call(
    conn: &mut SqliteConnection,
    now: i64,
    fence: Fence<'_>,
    call: &NewCall,
    finish: Option<&FinishCall>,
) -> Result<IssueOutcome, StoreError> {
    ops::fenced(&mut *conn, fence).await?;
    let identity = &call.identity;
    if identity.session != *fence.session {
        return Err(StoreError::LeaseLost {
            session: identity.session.clone(),
            token: fence.token,
        });
    }
    if let Some(key) = &call.idempotency_key {
        let holder: Option<String> = sqlx::query_scalar(
            "SELECT id FROM durable_tool_calls WHERE tool_name = ? \
             AND idempotency_key = ? AND input_hash <> ? ORDER BY issued_at, id LIMIT 1",
        )
        .bind(&identity.tool)
        .bind(key)
        .bind(&identity.input_hash)
        .fetch_optional(&mut *conn)
        .await
        .map_err(db)?;
        if let Some(existing) = holder {
            return Err(StoreError::IdempotencyConflict {
                tool: identity.tool.clone(),
                key: key.clone(),
                existing: CallId::new(existing),
            });
        }
    }
    let (status, result, error, spend, mac, finished_at) = match finish {
        None => (CallStatus::Issued, None, None, None, None, None),
        Some(finish) => {
            let (status, result, error) = outcome_columns(&finish.outcome)?;
            (
                status,
                result,
                error,
                opt_json(finish.spend.as_ref())?,
                finish.mac.as_deref(),
                Some(now),
            )
        }
    };
    let inserted = sqlx::query(
        "INSERT INTO durable_tool_calls (id, session_id, kind, step, tool_name, input_hash, \
         ordinal, replay_class, status, args, idempotency_key, schema_hash, result, error, \
         spend, mac, attempt, fence, format, issued_at, finished_at, seq) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 1, ?, ?, ?, ?, \
         (SELECT COALESCE(MAX(seq), 0) + 1 FROM durable_tool_calls WHERE session_id = ?)) \
         ON CONFLICT (session_id, step, tool_name, input_hash, ordinal) DO NOTHING",
    )
    .bind(call.id.as_str())
    .bind(identity.session.as_str())
    .bind(call.kind.as_str())
    .bind(identity.step)
    .bind(&identity.tool)
    .bind(&identity.input_hash)
    .bind(identity.ordinal)
    .bind(call.class.as_str())
    .bind(status.as_str())
    .bind(json(&call.args)?)
    .bind(call.idempotency_key.as_deref())
    .bind(&call.schema_hash)
    .bind(result)
    .bind(error)
    .bind(spend)
    .bind(mac)
    .bind(fence.token)
    .bind(FORMAT_VERSION)
    .bind(now)
    .bind(finished_at)
    .bind(identity.session.as_str())
    .execute(&mut *conn)
    .await
    .map_err(db)?;
    if inserted.rows_affected() == 1 {
        return Ok(IssueOutcome::Inserted(
            ops::load_call(conn, &call.id).await?,
        ));
    }
    let row = sqlx::query(concat!(
        "SELECT ",
        call_cols!(),
        " FROM durable_tool_calls c WHERE c.session_id = ? AND c.step = ? \
         AND c.tool_name = ? AND c.input_hash = ? AND c.ordinal = ?"
    ))
    .bind(identity.session.as_str())
    .bind(identity.step)
    .bind(&identity.tool)
    .bind(&identity.input_hash)
    .bind(identity.ordinal)
    .fetch_one(conn)
    .await
    .map_err(db)?;
    Ok(IssueOutcome::Existing(rows::call(&row)?))
}

/// Status, `result` and `error` columns of a recorded outcome.
fn outcome_columns(
    outcome: &CallOutcome,
) -> Result<(CallStatus, Option<String>, Option<String>), StoreError> {
    Ok(match outcome {
        CallOutcome::Completed(value) => (CallStatus::Completed, Some(json(value)?), None),
        CallOutcome::Failed(value) => (CallStatus::Failed, None, Some(json(value)?)),
    })
}
