//! The journal half of the store: tool/model call rows, operator resolutions, error
//! history, app-version migrations and purging.

use std::time::Duration;

use durable_core::StoreError;
use durable_core::ids::{CallId, SessionId};
use durable_core::store::{
    CallOutcome, CallRecord, CallStatus, CheckpointMeta, FORMAT_VERSION, Fence, FinishCall,
    IssueOutcome, MigrateSession, NewCall, NewCheckpoint, NewError, PurgeOutcome, Resolution,
    ResolutionRecord, ResolveCall, SessionRecord,
};
use sqlx::postgres::PgConnection;

use crate::PostgresStore;
use crate::error::{db, unique_violation};
use crate::rows::{self, call_cols, get};
use crate::txn::{self, Lock, ttl_ms};

impl PostgresStore {
    /// `issue_call` (no `finish`) and `record_call` (a new row carries its outcome).
    pub(crate) async fn issue(
        &self,
        fence: Fence<'_>,
        call: NewCall,
        finish: Option<FinishCall>,
    ) -> Result<IssueOutcome, StoreError> {
        let mut tx = self.pool.begin().await.map_err(db)?;
        let locked = txn::lock_fenced(&mut tx, fence, Lock::Share).await?;
        // A lease on one session cannot write into another's journal.
        if &call.identity.session != fence.session {
            return Err(StoreError::LeaseLost {
                session: call.identity.session.clone(),
                token: fence.token,
            });
        }
        let now = locked.now;
        let tool = &call.identity.tool;
        let outcome = Stored::from(finish.as_ref());
        if let Some(key) = &call.idempotency_key {
            // Serialize every use of this (tool, key) until commit, so two concurrent
            // uses with different arguments cannot both pass the check below.
            sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1 || chr(31) || $2, 0))")
                .bind(tool)
                .bind(key)
                .execute(&mut *tx)
                .await
                .map_err(db)?;
            let holder = sqlx::query(
                "SELECT id FROM durable_tool_calls
                 WHERE tool_name = $1 AND idempotency_key = $2 AND input_hash <> $3
                 ORDER BY seq LIMIT 1",
            )
            .bind(tool)
            .bind(key)
            .bind(&call.identity.input_hash)
            .fetch_optional(&mut *tx)
            .await
            .map_err(db)?;
            if let Some(row) = holder {
                return Err(StoreError::IdempotencyConflict {
                    tool: tool.clone(),
                    key: key.clone(),
                    existing: CallId::new(get::<String>(&row, "id")?),
                });
            }
        }
        let inserted = sqlx::query(concat!(
            "INSERT INTO durable_tool_calls (id, session_id, kind, step, tool_name, input_hash, \
             ordinal, replay_class, status, args, idempotency_key, schema_hash, attempt, fence, \
             format, issued_at, result, error, spend, mac, finished_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, 1, $13, $14, $15, \
                     $16, $17, $18, $19, $20) \
             ON CONFLICT (session_id, step, tool_name, input_hash, ordinal) DO NOTHING \
             RETURNING ",
            call_cols!()
        ))
        .bind(call.id.as_str())
        .bind(call.identity.session.as_str())
        .bind(call.kind.as_str())
        .bind(call.identity.step)
        .bind(tool)
        .bind(&call.identity.input_hash)
        .bind(call.identity.ordinal)
        .bind(call.class.as_str())
        .bind(outcome.status.as_str())
        .bind(call.args.to_string())
        .bind(&call.idempotency_key)
        .bind(&call.schema_hash)
        .bind(fence.token)
        .bind(FORMAT_VERSION)
        .bind(now)
        .bind(outcome.result)
        .bind(outcome.error)
        .bind(outcome.spend)
        .bind(outcome.mac)
        .bind(finish.is_some().then_some(now))
        .fetch_optional(&mut *tx)
        .await
        .map_err(db)?;
        let outcome = match inserted {
            Some(row) => IssueOutcome::Inserted(rows::call(&row)?),
            None => {
                let row = sqlx::query(concat!(
                    "SELECT ",
                    call_cols!(),
                    " FROM durable_tool_calls WHERE session_id = $1 AND step = $2 \
                     AND tool_name = $3 AND input_hash = $4 AND ordinal = $5"
                ))
                .bind(call.identity.session.as_str())
                .bind(call.identity.step)
                .bind(tool)
                .bind(&call.identity.input_hash)
                .bind(call.identity.ordinal)
                .fetch_one(&mut *tx)
                .await
                .map_err(db)?;
                IssueOutcome::Existing(rows::call(&row)?)
            }
        };
        tx.commit().await.map_err(db)?;
        Ok(outcome)
    }

    pub(crate) async fn reissue(
        &self,
        fence: Fence<'_>,
        call: &CallId,
    ) -> Result<CallRecord, StoreError> {
        let mut tx = self.pool.begin().await.map_err(db)?;
        txn::lock_fenced(&mut tx, fence, Lock::Share).await?;
        let status = lock_call(&mut tx, call, Some(fence)).await?;
        if !matches!(status, CallStatus::Issued | CallStatus::NotHappened) {
            return Err(StoreError::CallNotInDoubt {
                call: call.clone(),
                status: status.as_str().to_owned(),
            });
        }
        let row = sqlx::query(concat!(
            "UPDATE durable_tool_calls SET attempt = attempt + 1, status = 'issued', fence = $2, \
             finished_at = NULL, result = NULL, error = NULL, spend = NULL, mac = NULL \
             WHERE id = $1 RETURNING ",
            call_cols!()
        ))
        .bind(call.as_str())
        .bind(fence.token)
        .fetch_one(&mut *tx)
        .await
        .map_err(db)?;
        let record = rows::call(&row)?;
        tx.commit().await.map_err(db)?;
        Ok(record)
    }

    pub(crate) async fn finish(
        &self,
        fence: Fence<'_>,
        call: &CallId,
        finish: FinishCall,
        checkpoint: Option<(i64, NewCheckpoint)>,
    ) -> Result<Option<CheckpointMeta>, StoreError> {
        let mut tx = self.pool.begin().await.map_err(db)?;
        let lock = if checkpoint.is_some() {
            Lock::Update
        } else {
            Lock::Share
        };
        let locked = txn::lock_fenced(&mut tx, fence, lock).await?;
        let status = lock_call(&mut tx, call, Some(fence)).await?;
        if status != CallStatus::Issued {
            return Err(StoreError::CallNotInDoubt {
                call: call.clone(),
                status: status.as_str().to_owned(),
            });
        }
        let now = locked.now;
        let stored = Stored::from(Some(&finish));
        sqlx::query(
            "UPDATE durable_tool_calls
             SET status = $2, result = $3, error = $4, spend = $5, mac = $6, finished_at = $7,
                 format = $8
             WHERE id = $1",
        )
        .bind(call.as_str())
        .bind(stored.status.as_str())
        .bind(stored.result)
        .bind(stored.error)
        .bind(stored.spend)
        .bind(stored.mac)
        .bind(now)
        .bind(FORMAT_VERSION)
        .execute(&mut *tx)
        .await
        .map_err(db)?;
        let meta = match checkpoint {
            Some((expected, cp)) => Some(
                txn::append_checkpoint(&mut tx, fence.session, &locked, expected, cp, now).await?,
            ),
            None => None,
        };
        tx.commit().await.map_err(db)?;
        Ok(meta)
    }

    pub(crate) async fn call_record(&self, id: &CallId) -> Result<CallRecord, StoreError> {
        let row = sqlx::query(concat!(
            "SELECT ",
            call_cols!(),
            " FROM durable_tool_calls WHERE id = $1"
        ))
        .bind(id.as_str())
        .fetch_optional(&self.pool)
        .await
        .map_err(db)?
        .ok_or_else(|| StoreError::CallNotFound(id.clone()))?;
        rows::call(&row)
    }

    pub(crate) async fn call_records(
        &self,
        session: &SessionId,
        step: Option<i64>,
    ) -> Result<Vec<CallRecord>, StoreError> {
        sqlx::query(concat!(
            "SELECT ",
            call_cols!(),
            " FROM durable_tool_calls WHERE session_id = $1 AND ($2::bigint IS NULL OR step = $2) \
             ORDER BY seq"
        ))
        .bind(session.as_str())
        .bind(step)
        .fetch_all(&self.pool)
        .await
        .map_err(db)?
        .iter()
        .map(rows::call)
        .collect()
    }

    pub(crate) async fn in_doubt_calls(
        &self,
        session: Option<&SessionId>,
    ) -> Result<Vec<CallRecord>, StoreError> {
        // `c.*`: the columns of `call_cols!` (plus `seq`), unambiguous beside the join.
        sqlx::query(concat!(
            "SELECT c.* FROM durable_tool_calls c JOIN durable_sessions s ON s.id = c.session_id \
             WHERE c.status = 'issued' AND ($1::text IS NULL OR c.session_id = $1) \
               AND (s.fence <> c.fence OR s.lease_owner IS NULL OR s.lease_expires_at IS NULL \
                    OR s.lease_expires_at <= ",
            txn::now_ms!(),
            ") ORDER BY s.created_at, s.id, c.seq"
        ))
        .bind(session.map(SessionId::as_str))
        .fetch_all(&self.pool)
        .await
        .map_err(db)?
        .iter()
        .map(rows::call)
        .collect()
    }

    pub(crate) async fn resolve(&self, resolve: ResolveCall) -> Result<CallRecord, StoreError> {
        let mut tx = self.pool.begin().await.map_err(db)?;
        let session = sqlx::query("SELECT session_id FROM durable_tool_calls WHERE id = $1")
            .bind(resolve.call.as_str())
            .fetch_optional(&mut *tx)
            .await
            .map_err(db)?
            .ok_or_else(|| StoreError::CallNotFound(resolve.call.clone()))?;
        let session = SessionId::new(get::<String>(&session, "session_id")?);
        // Session first, then the call: the same lock order as every fenced write.
        let owner = sqlx::query(
            "SELECT fence, lease_owner, lease_expires_at FROM durable_sessions
             WHERE id = $1 FOR SHARE",
        )
        .bind(session.as_str())
        .fetch_optional(&mut *tx)
        .await
        .map_err(db)?;
        let row = sqlx::query(concat!(
            "SELECT ",
            call_cols!(),
            " FROM durable_tool_calls WHERE id = $1 FOR UPDATE"
        ))
        .bind(resolve.call.as_str())
        .fetch_one(&mut *tx)
        .await
        .map_err(db)?;
        let record = rows::call(&row)?;
        if record.status != CallStatus::Issued {
            return Err(StoreError::CallNotInDoubt {
                call: resolve.call,
                status: record.status.as_str().to_owned(),
            });
        }
        let now = txn::now(&mut tx).await?;
        if let Some(owner) = owner {
            let fence: i64 = get(&owner, "fence")?;
            let holder: Option<String> = get(&owner, "lease_owner")?;
            let until: Option<i64> = get(&owner, "lease_expires_at")?;
            if fence == record.fence && holder.is_some() && until.is_some_and(|u| u > now) {
                return Err(StoreError::CallNotInDoubt {
                    call: resolve.call,
                    status: "running".to_owned(),
                });
            }
        }
        let (status, decision, result) = match &resolve.resolution {
            Resolution::Happened { result } => {
                (CallStatus::Resolved, "happened", Some(result.to_string()))
            }
            Resolution::DidNotHappen => (CallStatus::NotHappened, "did_not_happen", None),
        };
        let row = sqlx::query(concat!(
            "UPDATE durable_tool_calls SET status = $2, result = $3, mac = $4, finished_at = $5, \
             format = $6 WHERE id = $1 RETURNING ",
            call_cols!()
        ))
        .bind(resolve.call.as_str())
        .bind(status.as_str())
        .bind(&result)
        .bind(&resolve.mac)
        .bind(now)
        .bind(FORMAT_VERSION)
        .fetch_one(&mut *tx)
        .await
        .map_err(db)?;
        let updated = rows::call(&row)?;
        sqlx::query(
            "INSERT INTO durable_resolutions (call_id, session_id, decision, result, resolved_by,
                                              note, format, created_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(resolve.call.as_str())
        .bind(session.as_str())
        .bind(decision)
        .bind(&result)
        .bind(&resolve.by)
        .bind(&resolve.note)
        .bind(FORMAT_VERSION)
        .bind(now)
        .execute(&mut *tx)
        .await
        .map_err(db)?;
        tx.commit().await.map_err(db)?;
        Ok(updated)
    }

    pub(crate) async fn resolution_records(
        &self,
        session: &SessionId,
    ) -> Result<Vec<ResolutionRecord>, StoreError> {
        sqlx::query(
            "SELECT call_id, session_id, decision, result, resolved_by, note, format, created_at
             FROM durable_resolutions WHERE session_id = $1 ORDER BY id",
        )
        .bind(session.as_str())
        .fetch_all(&self.pool)
        .await
        .map_err(db)?
        .iter()
        .map(rows::resolution)
        .collect()
    }

    pub(crate) async fn insert_error(&self, error: NewError) -> Result<(), StoreError> {
        let inserted = sqlx::query(concat!(
            "INSERT INTO durable_errors (session_id, step, context, attempt, message, created_at) \
             SELECT id, $2, $3, $4, $5, ",
            txn::now_ms!(),
            " FROM durable_sessions WHERE id = $1"
        ))
        .bind(error.session.as_str())
        .bind(error.step)
        .bind(&error.context)
        .bind(error.attempt)
        .bind(&error.message)
        .execute(&self.pool)
        .await
        .map_err(db)?;
        if inserted.rows_affected() == 0 {
            return Err(StoreError::SessionNotFound(error.session));
        }
        Ok(())
    }

    pub(crate) async fn error_records(
        &self,
        session: &SessionId,
    ) -> Result<Vec<durable_core::store::ErrorRecord>, StoreError> {
        sqlx::query(
            "SELECT session_id, step, context, attempt, message, created_at
             FROM durable_errors WHERE session_id = $1 ORDER BY id",
        )
        .bind(session.as_str())
        .fetch_all(&self.pool)
        .await
        .map_err(db)?
        .iter()
        .map(rows::error_record)
        .collect()
    }

    pub(crate) async fn migrate(
        &self,
        migrate: MigrateSession,
    ) -> Result<SessionRecord, StoreError> {
        let mut tx = self.pool.begin().await.map_err(db)?;
        let current = txn::session(&mut tx, &migrate.session, Some(Lock::Update)).await?;
        if current.app_version != migrate.from_version {
            return Err(StoreError::AppVersionMismatch {
                session: migrate.session,
                expected: migrate.from_version,
                actual: current.app_version,
            });
        }
        let now = txn::now(&mut tx).await?;
        // A mapping, not a chain: one statement renames every row at most once, by the
        // first pair naming its tool (`a → b, b → c` sends a to b and b to c; swaps work).
        let mut old: Vec<&str> = Vec::new();
        let mut new: Vec<&str> = Vec::new();
        for (o, n) in &migrate.step_map {
            if !old.contains(&o.as_str()) {
                old.push(o);
                new.push(n);
            }
        }
        let renamed = sqlx::query(
            "UPDATE durable_tool_calls c SET tool_name = m.new
             FROM unnest($2::text[], $3::text[]) AS m(old, new)
             WHERE c.session_id = $1 AND c.tool_name = m.old",
        )
        .bind(migrate.session.as_str())
        .bind(&old)
        .bind(&new)
        .execute(&mut *tx)
        .await;
        if let Err(e) = renamed {
            return Err(match unique_violation(&e) {
                Some(constraint) => crate::error::invariant(format!(
                    "renaming journal rows of session `{}` collides with existing rows \
                     ({constraint}); a step map must not rename a tool onto one the session already \
                     used with the same arguments",
                    migrate.session
                )),
                None => db(e),
            });
        }
        let step_map = serde_json::Value::from(
            migrate
                .step_map
                .iter()
                .map(|(o, n)| serde_json::json!([o, n]))
                .collect::<Vec<_>>(),
        );
        sqlx::query(
            "INSERT INTO durable_migrations (session_id, from_version, to_version, step_map,
                                             migrated_by, format, created_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(migrate.session.as_str())
        .bind(&migrate.from_version)
        .bind(&migrate.to_version)
        .bind(step_map.to_string())
        .bind(&migrate.by)
        .bind(FORMAT_VERSION)
        .bind(now)
        .execute(&mut *tx)
        .await
        .map_err(db)?;
        let row = sqlx::query(concat!(
            "UPDATE durable_sessions SET app_version = $2, updated_at = $3 WHERE id = $1 \
             RETURNING ",
            rows::session_cols!()
        ))
        .bind(migrate.session.as_str())
        .bind(&migrate.to_version)
        .bind(now)
        .fetch_one(&mut *tx)
        .await
        .map_err(db)?;
        let record = rows::session(&row)?;
        tx.commit().await.map_err(db)?;
        Ok(record)
    }

    pub(crate) async fn purge(
        &self,
        id: &SessionId,
        retention: Duration,
    ) -> Result<PurgeOutcome, StoreError> {
        let mut tx = self.pool.begin().await.map_err(db)?;
        let session = txn::session(&mut tx, id, Some(Lock::Update)).await?;
        if !session.status.is_terminal() {
            return Ok(PurgeOutcome::NotTerminal);
        }
        let now = txn::now(&mut tx).await?;
        if session.updated_at > now.saturating_sub(ttl_ms(retention)) {
            return Ok(PurgeOutcome::WithinRetention);
        }
        let in_doubt = sqlx::query(
            "SELECT 1 AS one FROM durable_tool_calls WHERE session_id = $1 AND status = 'issued'
             LIMIT 1",
        )
        .bind(id.as_str())
        .fetch_optional(&mut *tx)
        .await
        .map_err(db)?;
        if in_doubt.is_some() {
            return Ok(PurgeOutcome::CallInDoubt);
        }
        for sql in [
            "DELETE FROM durable_resolutions WHERE session_id = $1",
            "DELETE FROM durable_migrations WHERE session_id = $1",
            "DELETE FROM durable_errors WHERE session_id = $1",
            "DELETE FROM durable_tool_calls WHERE session_id = $1",
            "DELETE FROM durable_checkpoints WHERE session_id = $1",
            "DELETE FROM durable_messages WHERE session_id = $1",
            "DELETE FROM durable_sessions WHERE id = $1",
        ] {
            sqlx::query(sql)
                .bind(id.as_str())
                .execute(&mut *tx)
                .await
                .map_err(db)?;
        }
        tx.commit().await.map_err(db)?;
        Ok(PurgeOutcome::Purged)
    }
}

/// The stored columns of a call's outcome (all `NULL` and status `issued` without one).
struct Stored {
    status: CallStatus,
    result: Option<String>,
    error: Option<String>,
    spend: Option<String>,
    mac: Option<String>,
}

impl From<Option<&FinishCall>> for Stored {
    fn from(finish: Option<&FinishCall>) -> Self {
        let Some(finish) = finish else {
            return Stored {
                status: CallStatus::Issued,
                result: None,
                error: None,
                spend: None,
                mac: None,
            };
        };
        let (status, result, error) = match &finish.outcome {
            CallOutcome::Completed(v) => (CallStatus::Completed, Some(v.to_string()), None),
            CallOutcome::Failed(v) => (CallStatus::Failed, None, Some(v.to_string())),
        };
        Stored {
            status,
            result,
            error,
            spend: finish.spend.as_ref().map(ToString::to_string),
            mac: finish.mac.clone(),
        }
    }
}

/// Locks a call row `FOR UPDATE` and returns its status. With `fence`, a call of another
/// session is [`StoreError::LeaseLost`]: a lease on one session cannot touch another's
/// journal.
async fn lock_call(
    conn: &mut PgConnection,
    call: &CallId,
    fence: Option<Fence<'_>>,
) -> Result<CallStatus, StoreError> {
    let row =
        sqlx::query("SELECT session_id, status FROM durable_tool_calls WHERE id = $1 FOR UPDATE")
            .bind(call.as_str())
            .fetch_optional(&mut *conn)
            .await
            .map_err(db)?
            .ok_or_else(|| StoreError::CallNotFound(call.clone()))?;
    let owner = SessionId::new(get::<String>(&row, "session_id")?);
    if let Some(fence) = fence
        && owner != *fence.session
    {
        return Err(StoreError::LeaseLost {
            session: owner,
            token: fence.token,
        });
    }
    let status: String = get(&row, "status")?;
    CallStatus::parse(&status).ok_or_else(|| {
        crate::error::corrupt(
            &owner,
            None,
            format!("journal row `{call}`: unknown status `{status}`"),
        )
    })
}
