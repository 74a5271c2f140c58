//! Operator resolutions of in-doubt calls: the call row re-sealed with the decision, an
//! audit row sealed at the next position of the session's resolutions, the head counting
//! it; and reading them back, checked.

use async_trait::async_trait;
use durable_core::StoreError;
use durable_core::ids::SessionId;
use durable_core::store::ResolutionStore;
use durable_core::store::{
    CallRecord, CallStatus, FORMAT_VERSION, Resolution, ResolutionRecord, ResolveCall,
};

use crate::PostgresStore;
use crate::error::db;
use crate::journal::lock_call;
use crate::rows::{self, call_cols, get};
use crate::seal::{self, StoreHead, checked_call_record};
use crate::tx;

pub(crate) async fn resolve_call(
    store: &PostgresStore,
    resolve: ResolveCall,
) -> Result<CallRecord, StoreError> {
    resolve.validate()?;
    let ring = store.keyring();
    let mut tx = tx::begin(&store.pool).await?;
    let session = sqlx::query("SELECT session_id FROM durable_tool_calls WHERE id = $1")
        .bind(resolve.call.as_str())
        .fetch_optional(&mut *tx)
        .await
        .map_err(db)?
        .ok_or_else(|| StoreError::CallNotFound(resolve.call.clone()))?;
    let session = SessionId::new(get::<String>(&session, "session_id")?);
    // Session first, then the call: the same lock order as every fenced write. The
    // session row is locked `FOR UPDATE`: the resolution is counted in its head.
    let owner = sqlx::query(
        "SELECT fence, lease_owner, lease_expires_at FROM durable_sessions
         WHERE id = $1 FOR UPDATE",
    )
    .bind(session.as_str())
    .fetch_optional(&mut *tx)
    .await
    .map_err(db)?
    .ok_or_else(|| StoreError::SessionNotFound(session.clone()))?;
    let (mut raw, row_fence) = lock_call(&mut tx, ring, &resolve.call, None).await?;
    if raw.status != CallStatus::Issued.as_str() {
        return Err(StoreError::CallNotInDoubt {
            call: resolve.call,
            status: raw.status,
        });
    }
    // Read after the lock is held (see `tx::lock_fenced`).
    let mut head = seal::checked_head(&mut tx, ring, &session).await?;
    // Notifies at commit (a rollback on any error below sends nothing): the resolution
    // may let the session's next worker go on.
    let now = tx::now_notifying(&mut tx).await?;
    let fence: i64 = get(&owner, "fence")?;
    let holder: Option<String> = get(&owner, "lease_owner")?;
    let until: Option<i64> = get(&owner, "lease_expires_at")?;
    if fence == row_fence && holder.is_some() && until.is_some_and(|u| u > now) {
        return Err(StoreError::CallNotInDoubt {
            call: resolve.call,
            status: "running".to_owned(),
        });
    }
    let (status, decision, result) = match &resolve.resolution {
        Resolution::Happened { result } => {
            (CallStatus::Resolved, "happened", Some(result.to_string()))
        }
        Resolution::DidNotHappen => (CallStatus::NotHappened, "did_not_happen", None),
    };
    raw.status = status.as_str().to_owned();
    raw.result.clone_from(&result);
    raw.seal(ring)?;
    let row = sqlx::query(concat!(
        "UPDATE durable_tool_calls SET status = $2, result = $3, mac = $4, finished_at = $5, \
         format = $6 WHERE id = $1 RETURNING ",
        call_cols!()
    ))
    .bind(resolve.call.as_str())
    .bind(status.as_str())
    .bind(&result)
    .bind(&raw.mac)
    .bind(now)
    .bind(FORMAT_VERSION)
    .fetch_one(&mut *tx)
    .await
    .map_err(db)?;
    let updated = checked_call_record(ring, &row)?;
    let position = head.resolutions + 1;
    let resolution_seal = ring.seal(&seal::resolution_fields(
        resolve.call.as_str(),
        &session,
        position,
        decision,
        result.as_deref(),
        &resolve.by,
        resolve.note.as_deref(),
    ))?;
    sqlx::query(
        "INSERT INTO durable_resolutions (call_id, session_id, decision, result, resolved_by,
                                          note, format, created_at, position, seal)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
    )
    .bind(resolve.call.as_str())
    .bind(session.as_str())
    .bind(decision)
    .bind(&result)
    .bind(&resolve.by)
    .bind(&resolve.note)
    .bind(FORMAT_VERSION)
    .bind(now)
    .bind(position)
    .bind(&resolution_seal)
    .execute(&mut *tx)
    .await
    .map_err(db)?;
    head.resolutions = position;
    // Resolved or not happened: no longer issued.
    head.count_issued(-1)?;
    head.store(&mut tx, ring).await?;
    tx.commit().await.map_err(db)?;
    Ok(updated)
}

pub(crate) async fn resolutions(
    store: &PostgresStore,
    session: &SessionId,
) -> Result<Vec<ResolutionRecord>, StoreError> {
    let ring = store.keyring();
    // One snapshot: the head and the rows agree.
    let mut tx = tx::begin_snapshot(&store.pool).await?;
    let head = seal::checked_head(&mut tx, ring, session).await?;
    let found = sqlx::query(
        "SELECT call_id, session_id, decision, result, resolved_by, note, format, created_at,
                position, seal
         FROM durable_resolutions WHERE session_id = $1 ORDER BY id",
    )
    .bind(session.as_str())
    .fetch_all(&mut *tx)
    .await
    .map_err(db)?;
    tx.commit().await.map_err(db)?;
    seal::check_resolutions(ring, &head, &found)?;
    found.iter().map(rows::resolution).collect()
}

#[async_trait]
impl ResolutionStore for PostgresStore {
    async fn resolve_call(&self, resolve: ResolveCall) -> Result<CallRecord, StoreError> {
        let row = resolve_call(self, resolve).await?;
        self.work_available();
        Ok(row)
    }

    async fn resolutions(&self, session: &SessionId) -> Result<Vec<ResolutionRecord>, StoreError> {
        resolutions(self, session).await
    }
}
