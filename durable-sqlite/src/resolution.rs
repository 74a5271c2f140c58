//! Operator resolutions of in-doubt calls: the call row re-sealed with the decision, an
//! audit row sealed at the next position of the session's resolutions, the head counting
//! it; and reading them back, checked.

use async_trait::async_trait;
use durable_core::integrity::rows::check_resolution_count;
use durable_core::store::{
    CallRecord, CallStatus, FORMAT_VERSION, Resolution, ResolutionRecord, ResolutionStore,
    ResolveCall,
};
use durable_core::{CallId, SessionId, StoreError};
use sqlx::{Row, SqliteConnection};

use crate::SqliteStore;
use crate::error::{corrupt, db};
use crate::journal::load_call;
use crate::rows::{self, json};
use crate::seal::{self, StoreHead};
use crate::tx::{self, WriteTx};

pub(crate) async fn resolve_call(
    store: &SqliteStore,
    resolve: ResolveCall,
) -> Result<CallRecord, StoreError> {
    resolve.validate()?;
    let ring = store.keyring();
    let mut tx = WriteTx::begin(store.writer()).await?;
    let now = tx.now;
    let result = async {
        let conn = tx.conn();
        let id = &resolve.call;
        let mut raw = seal::checked_call(&mut *conn, ring, id).await?;
        let state = call_state(&mut *conn, id).await?;
        if state.status != CallStatus::Issued {
            return Err(StoreError::CallNotInDoubt {
                call: id.clone(),
                status: state.status.as_str().to_owned(),
            });
        }
        let session = tx::session(&mut *conn, &state.session).await?;
        let live =
            session.lease_owner.is_some() && session.lease_expires_at.is_some_and(|at| at > now);
        if live && session.fence == state.fence {
            return Err(StoreError::CallNotInDoubt {
                call: id.clone(),
                status: "running".to_owned(),
            });
        }
        let mut head = seal::checked_head(&mut *conn, ring, &state.session).await?;
        let (status, decision, result) = match &resolve.resolution {
            Resolution::Happened { result } => {
                (CallStatus::Resolved, "happened", Some(json(result)?))
            }
            Resolution::DidNotHappen => (CallStatus::NotHappened, "did_not_happen", None),
        };
        raw.status = status.as_str().to_owned();
        raw.result = result.clone();
        raw.seal(ring)?;
        sqlx::query(
            "UPDATE durable_tool_calls SET status = ?, result = ?, mac = ?, finished_at = ? \
             WHERE id = ?",
        )
        .bind(status.as_str())
        .bind(result.as_deref())
        .bind(raw.mac.as_deref())
        .bind(now)
        .bind(id.as_str())
        .execute(&mut *conn)
        .await
        .map_err(db)?;
        let position = head.resolutions + 1;
        let resolution_seal = ring.seal(&seal::resolution_fields(
            id.as_str(),
            &state.session,
            position,
            decision,
            result.as_deref(),
            &resolve.by,
            resolve.note.as_deref(),
        ))?;
        sqlx::query(
            "INSERT INTO durable_resolutions (call_id, session_id, decision, result, \
             resolved_by, note, format, created_at, position, seal) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(id.as_str())
        .bind(state.session.as_str())
        .bind(decision)
        .bind(result.as_deref())
        .bind(&resolve.by)
        .bind(resolve.note.as_deref())
        .bind(FORMAT_VERSION)
        .bind(now)
        .bind(position)
        .bind(&resolution_seal)
        .execute(&mut *conn)
        .await
        .map_err(db)?;
        head.resolutions = position;
        // Resolved or not happened: no longer issued.
        head.count_issued(-1)?;
        head.store(&mut *conn, ring).await?;
        load_call(conn, ring, id).await
    }
    .await;
    tx.finish(result).await
}

pub(crate) async fn resolutions(
    store: &SqliteStore,
    session: &SessionId,
) -> Result<Vec<ResolutionRecord>, StoreError> {
    let ring = store.keyring();
    let mut rtx = store
        .reader()
        .begin()
        .await
        .map_err(|e| crate::error::pool_error(store.reader(), crate::error::Pool::Reader, e))?;
    let head = seal::checked_head(&mut rtx, ring, session).await?;
    let found = sqlx::query(
        "SELECT call_id, session_id, decision, result, resolved_by, note, format, created_at, \
         position, seal FROM durable_resolutions WHERE session_id = ? ORDER BY id",
    )
    .bind(session.as_str())
    .fetch_all(&mut *rtx)
    .await
    .map_err(db)?;
    rtx.commit().await.map_err(db)?;
    let mut out = Vec::with_capacity(found.len());
    for (i, row) in found.iter().enumerate() {
        let raw = seal::raw_resolution(row, session)?;
        raw.check(ring, session, i64::try_from(i + 1).unwrap_or(i64::MAX))?;
        out.push(rows::resolution(row)?);
    }
    check_resolution_count(&head, out.len())?;
    Ok(out)
}

/// The few columns of a journal row that guard its state transitions.
pub(crate) struct CallState {
    pub(crate) session: SessionId,
    pub(crate) status: CallStatus,
    pub(crate) fence: i64,
}

/// Reads a journal row's session, status and fence, or [`StoreError::CallNotFound`].
pub(crate) async fn call_state(
    conn: &mut SqliteConnection,
    id: &CallId,
) -> Result<CallState, StoreError> {
    let row = sqlx::query("SELECT session_id, status, fence FROM durable_tool_calls WHERE id = ?")
        .bind(id.as_str())
        .fetch_optional(conn)
        .await
        .map_err(db)?
        .ok_or_else(|| StoreError::CallNotFound(id.clone()))?;
    let session = SessionId::new(row.try_get::<String, _>("session_id").map_err(db)?);
    let status: String = rows::col(&row, "status", &session, None)?;
    let status = CallStatus::parse(&status).ok_or_else(|| {
        corrupt(
            &session,
            None,
            format!("journal row `{id}`: unknown status `{status}`"),
        )
    })?;
    let fence = rows::col(&row, "fence", &session, None)?;
    Ok(CallState {
        session,
        status,
        fence,
    })
}

#[async_trait]
impl ResolutionStore for SqliteStore {
    async fn resolve_call(&self, resolve: ResolveCall) -> Result<CallRecord, StoreError> {
        let row = resolve_call(self, resolve).await?;
        self.work_available();
        Ok(row)
    }

    async fn resolutions(&self, session: &SessionId) -> Result<Vec<ResolutionRecord>, StoreError> {
        resolutions(self, session).await
    }
}
