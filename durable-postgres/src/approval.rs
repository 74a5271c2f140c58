//! Approvals: calls journaled as `requested` that wait for a person's decision, the
//! decision applied to the row (re-sealed) with its row of the session's approval log
//! (sealed at its position, counted by the head), the inbox of pending requests, and the
//! log read back, checked. The request itself is a journal insert
//! ([`journal::insert_locked`]); this module adds what only approvals do.

use async_trait::async_trait;
use durable_core::StoreError;
use durable_core::ids::CallId;
use durable_core::ids::SessionId;
use durable_core::store::ApprovalStore;
use durable_core::store::{
    ApprovalEvent, ApprovalRecord, ApprovalRequest, CallRecord, CallStatus, DecideApproval,
    FORMAT_VERSION, Fence, IssueOutcome, NewCall, PendingApproval, SessionStatus,
};
use sqlx::PgConnection;

use crate::PostgresStore;
use crate::error::{corrupt, db, invariant};
use crate::journal::{self, Entry, lock_call};
use crate::rows::{self, call_cols, get};
use crate::seal::{self, RawApproval, StoreHead, approval_cols, checked_call_record};
use crate::tx;

pub(crate) async fn request_call(
    store: &PostgresStore,
    fence: Fence<'_>,
    call: NewCall,
    request: ApprovalRequest,
) -> Result<IssueOutcome, StoreError> {
    request.validate()?;
    // Always the locking transaction: the approval's times are read from the clock of
    // the statement that locks the session, and the log row goes with the journal row.
    journal::insert_locked(store, fence, call, Entry::Request(request)).await
}

pub(crate) async fn decide_approval(
    store: &PostgresStore,
    decide: DecideApproval,
) -> Result<CallRecord, StoreError> {
    decide.validate()?;
    let ring = store.keyring();
    let mut tx = tx::begin(&store.pool).await?;
    let session: String =
        sqlx::query_scalar("SELECT session_id FROM durable_tool_calls WHERE id = $1")
            .bind(decide.call.as_str())
            .fetch_optional(&mut *tx)
            .await
            .map_err(db)?
            .ok_or_else(|| StoreError::CallNotFound(decide.call.clone()))?;
    let session = SessionId::new(session);
    // Session first, then the call: the lock order of every fenced write and of
    // `resolve_call`. Two decisions on one call queue on the session row; the second
    // reads the call row (a statement of its own, so a snapshot taken after the first
    // committed) as the first left it, no longer `requested`.
    let session_status: String =
        sqlx::query_scalar("SELECT status FROM durable_sessions WHERE id = $1 FOR UPDATE")
            .bind(session.as_str())
            .fetch_optional(&mut *tx)
            .await
            .map_err(db)?
            .ok_or_else(|| StoreError::SessionNotFound(session.clone()))?;
    let (mut raw, _) = lock_call(&mut tx, ring, &decide.call, None).await?;
    let status = CallStatus::parse(&raw.status).ok_or_else(|| {
        corrupt(
            &session,
            None,
            format!("journal row `{}` has status `{}`", decide.call, raw.status),
        )
    })?;
    // Read after the locks are held (see `tx::lock_fenced`), the clock too: the deadline
    // is decided at the moment the decision is applied.
    let mut head = seal::checked_head(&mut tx, ring, &session).await?;
    let now = tx::now(&mut tx).await?;
    let approval = raw
        .approval
        .as_deref()
        .map(|text| rows::approval(&session, &decide.call, text))
        .transpose()?;
    // The transition, decided as on every backend; then the row against its log.
    let change = decide.apply(&session, status, approval.as_ref(), now)?;
    let last = last_event(&mut tx, &decide.call).await?;
    ApprovalEvent::check_row(&session, &decide.call, status, last)?;
    let call = decide.call;
    let args_after = change.args_after.as_ref().map(ToString::to_string);
    let mut log = RawApproval {
        call: call.as_str().to_owned(),
        position: head.approvals + 1,
        event: change.event.as_str().to_owned(),
        actor: decide.by,
        note: change.note,
        args_before: args_after.is_some().then(|| raw.args.clone()),
        args_after,
        seal: None,
    };
    raw.status = change.status.as_str().to_owned();
    raw.error = change.error.as_ref().map(ToString::to_string);
    raw.approval = Some(
        serde_json::to_string(&change.approval)
            .map_err(|e| invariant(format!("an approval that does not serialize: {e}")))?,
    );
    raw.seal(ring)?;
    let finished_at = (change.status == CallStatus::Denied).then_some(now);
    let row = sqlx::query(concat!(
        "UPDATE durable_tool_calls SET status = $2, error = $3, approval = $4, mac = $5, \
         finished_at = $6, format = $7 WHERE id = $1 RETURNING ",
        call_cols!()
    ))
    .bind(call.as_str())
    .bind(&raw.status)
    .bind(&raw.error)
    .bind(&raw.approval)
    .bind(&raw.mac)
    .bind(finished_at)
    .bind(FORMAT_VERSION)
    .fetch_one(&mut *tx)
    .await
    .map_err(db)?;
    let updated = checked_call_record(ring, &row)?;
    seal::insert_approval(&mut log, &mut tx, ring, &session, now).await?;
    head.approvals = log.position;
    head.store(&mut tx, ring).await?;
    if session_status == SessionStatus::AwaitingApproval.as_str() {
        // The last decision the session waited for: it goes back to work, its lease
        // free for the next worker (released, not lost: taking it is no recovery). The
        // count sees this transaction's own update of the row. Idle pools are notified
        // (at commit, by the same statement) only if the session went back to work.
        sqlx::query(concat!(
            "WITH resumed AS (UPDATE durable_sessions SET status = 'active', \
               status_reason = NULL, lease_owner = NULL, lease_expires_at = $2, \
               updated_at = $2 \
             WHERE id = $1 AND NOT EXISTS (SELECT 1 FROM durable_tool_calls \
               WHERE session_id = $1 AND status = 'requested') RETURNING 1) \
             SELECT ",
            crate::notify::pg_notify!(),
            " FROM resumed"
        ))
        .bind(session.as_str())
        .bind(now)
        .execute(&mut *tx)
        .await
        .map_err(db)?;
    }
    tx.commit().await.map_err(db)?;
    Ok(updated)
}

/// The last event of call `id` in its session's approval log (in the caller's
/// transaction, by the log's index of calls): what [`ApprovalEvent::check_row`] checks a
/// row against before a decision or an issue acts on it.
pub(crate) async fn last_event(
    conn: &mut PgConnection,
    id: &CallId,
) -> Result<Option<ApprovalEvent>, StoreError> {
    let event: Option<String> = sqlx::query_scalar(
        "SELECT event FROM durable_approvals WHERE call_id = $1 ORDER BY position DESC LIMIT 1",
    )
    .bind(id.as_str())
    .fetch_optional(conn)
    .await
    .map_err(db)?;
    Ok(event.as_deref().and_then(ApprovalEvent::parse))
}

pub(crate) async fn pending_approvals(
    store: &PostgresStore,
    session: Option<&SessionId>,
) -> Result<Vec<PendingApproval>, StoreError> {
    // The requested rows from their partial index alone, and the clock in the same
    // statement, so `expired` is decided at the moment the rows are read. Oldest request
    // first: a requested row's `issued_at` is its approval's `requested_at`.
    const PENDING: &str = concat!(
        "SELECT ",
        call_cols!(),
        ", ",
        tx::now_ms!(),
        " AS now FROM durable_tool_calls \
         WHERE status = 'requested' AND ($1::text IS NULL OR session_id = $1) \
           AND EXISTS (SELECT 1 FROM durable_sessions s WHERE s.id = durable_tool_calls.session_id \
             AND s.status NOT IN ('completed', 'failed', 'cancelled')) \
         ORDER BY issued_at, session_id, seq"
    );
    let ring = store.keyring();
    let found = tx::read(&store.pool, || {
        sqlx::query(PENDING)
            .bind(session.map(SessionId::as_str))
            .fetch_all(&store.pool)
    })
    .await?;
    found
        .iter()
        .map(|row| {
            let call = checked_call_record(ring, row)?;
            let Some(approval) = &call.approval else {
                return Err(corrupt(
                    &call.identity.session,
                    None,
                    format!("journal row `{}` is requested without an approval", call.id),
                ));
            };
            let now: i64 = get(row, "now")?;
            let expired = approval.deadline.is_some_and(|at| now >= at);
            Ok(PendingApproval { call, expired })
        })
        .collect()
}

pub(crate) async fn approvals(
    store: &PostgresStore,
    session: &SessionId,
) -> Result<Vec<ApprovalRecord>, StoreError> {
    let ring = store.keyring();
    // One snapshot: the head and the rows it counts agree.
    let mut tx = tx::begin_snapshot(&store.pool).await?;
    let head = seal::checked_head(&mut tx, ring, session).await?;
    let found = sqlx::query(concat!(
        "SELECT ",
        approval_cols!(),
        " FROM durable_approvals WHERE session_id = $1 ORDER BY position"
    ))
    .bind(session.as_str())
    .fetch_all(&mut *tx)
    .await
    .map_err(db)?;
    tx.commit().await.map_err(db)?;
    seal::check_approvals(ring, &head, &found)?;
    found.iter().map(rows::approval_record).collect()
}

#[async_trait]
impl ApprovalStore for PostgresStore {
    async fn request_call(
        &self,
        fence: Fence<'_>,
        call: NewCall,
        request: ApprovalRequest,
    ) -> Result<IssueOutcome, StoreError> {
        request_call(self, fence, call, request).await
    }

    async fn decide_approval(&self, decide: DecideApproval) -> Result<CallRecord, StoreError> {
        let row = decide_approval(self, decide).await?;
        self.work_available();
        Ok(row)
    }

    async fn pending_approvals(
        &self,
        session: Option<&SessionId>,
    ) -> Result<Vec<PendingApproval>, StoreError> {
        pending_approvals(self, session).await
    }

    async fn approvals(&self, session: &SessionId) -> Result<Vec<ApprovalRecord>, StoreError> {
        approvals(self, session).await
    }
}
