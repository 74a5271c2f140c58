//! The call journal: insert-or-get of rows, outcomes, re-issues and the in-doubt
//! listing. Operator resolutions are in [`crate::resolution`].

use async_trait::async_trait;
use durable_core::integrity::Keyring;
use durable_core::store::{
    ApprovalEvent, CallOutcome, CallRecord, CallStatus, CheckpointMeta, EditedKey, FORMAT_VERSION,
    Fence, FinishCall, IssueOutcome, JournalStore, NewCall, NewCheckpoint, check_journal_page,
};
use durable_core::{CallId, SessionId, StoreError};
use sqlx::Arguments;
use sqlx::SqliteConnection;
use sqlx::sqlite::{SqliteArguments, SqliteRow};

use crate::SqliteStore;
use crate::approval;
use crate::checkpoints::{self, LatestCheckpoint, Statements};
use crate::error::db;
use crate::group::BatchConn;
use crate::rows;
use crate::rows::{call_cols, json, opt_json};
use crate::seal::{self, RawCall, StoreHead, checked_call_record, raw_call_cols};
use crate::tx::{WriteTx, fenced_select, now_sql};

pub(crate) async fn issue_call(
    store: &SqliteStore,
    fence: Fence<'_>,
    call: NewCall,
) -> Result<IssueOutcome, StoreError> {
    insert_call(store, fence, call, None).await
}

pub(crate) async fn record_call(
    store: &SqliteStore,
    fence: Fence<'_>,
    call: NewCall,
    finish: FinishCall,
) -> Result<IssueOutcome, StoreError> {
    insert_call(store, fence, call, Some(finish)).await
}

/// The columns of a cancellation asked while a worker holds the session, for a fenced
/// write that refuses to issue a call of a session asked to stop.
macro_rules! cancel_cols {
    () => {
        ", s.cancel_requested_at, s.cancel_by, s.cancel_reason"
    };
}

/// The extra columns and join of a fenced write that changes journal row `c` (bound
/// first): its sealed columns, `NULL` when there is no such row, and the session's
/// cancellation request.
macro_rules! fenced_call_select {
    () => {
        fenced_select!(
            concat!(cancel_cols!(), ", ", raw_call_cols!()),
            " LEFT JOIN durable_tool_calls c ON c.id = ?"
        )
    };
}

/// [`StoreError::CancelRequested`] when the row (read with [`cancel_cols!`]) says the
/// session was asked to stop: nothing is issued for it any more.
fn refuse_if_cancelled(row: &SqliteRow, session: &SessionId) -> Result<(), StoreError> {
    let at: Option<i64> = rows::col(row, "cancel_requested_at", session, None)?;
    let Some(at) = at else {
        return Ok(());
    };
    let text = |name: &str| rows::col::<Option<String>>(row, name, session, None);
    Err(StoreError::CancelRequested {
        session: session.clone(),
        by: text("cancel_by")?.unwrap_or_default(),
        reason: text("cancel_reason")?.unwrap_or_default(),
        at,
    })
}

/// The journal row selected with [`fenced_call_select!`], for a state change: checks its
/// seal and that it belongs to the fenced session.
fn fenced_call(
    row: &SqliteRow,
    ring: &Keyring,
    fence: Fence<'_>,
    call: &CallId,
) -> Result<RawCall, StoreError> {
    let found: Option<String> = rows::col(row, "id", fence.session, None)?;
    if found.is_none() {
        return Err(StoreError::CallNotFound(call.clone()));
    }
    let raw = seal::raw_call(row)?;
    raw.check(ring)?;
    if raw.session != fence.session.as_str() {
        return Err(StoreError::LeaseLost {
            session: SessionId::new(raw.session),
            token: fence.token,
        });
    }
    Ok(raw)
}

/// `approved_key`: `Some(key)` for `CheckpointStore::issue_approved` (only an approved row,
/// its key replaced when `key` is `Some`), `None` for `reissue_call`.
pub(crate) async fn reissue_call(
    store: &SqliteStore,
    fence: Fence<'_>,
    call: &CallId,
    approved_key: Option<Option<EditedKey>>,
) -> Result<CallRecord, StoreError> {
    let ring = store.keyring();
    let (mut tx, mut fenced, row) = WriteTx::begin_fenced(
        store.writer(),
        ring,
        fence,
        concat!("BEGIN IMMEDIATE; ", fenced_call_select!()),
        |q| q.bind(call.as_str()),
    )
    .await?;
    let tx_now = tx.now;
    let result = async {
        let mut raw = fenced_call(&row, ring, fence, call)?;
        let approved = raw.status == CallStatus::Approved.as_str();
        if approved_key.is_some() && !approved {
            return Err(StoreError::CallNotInDoubt {
                call: call.clone(),
                status: raw.status,
            });
        }
        // A session asked to stop starts nothing: not a re-run, not an approved call.
        if matches!(
            CallStatus::parse(&raw.status),
            Some(CallStatus::Issued | CallStatus::NotHappened | CallStatus::Approved)
        ) {
            refuse_if_cancelled(&row, fence.session)?;
        }
        if let Some(Some(edited)) = &approved_key {
            // Another call of the tool holding the key with other arguments: as
            // `issue_call` refuses it, so is this (the row stays approved).
            let holder: Option<String> = sqlx::query_scalar(
                "SELECT id FROM durable_tool_calls WHERE tool_name = ? AND idempotency_key = ? \
                 AND input_hash <> ? AND id <> ? ORDER BY issued_at, id LIMIT 1",
            )
            .bind(&raw.tool)
            .bind(&edited.key)
            .bind(&edited.input_hash)
            .bind(call.as_str())
            .fetch_optional(&mut *tx.conn())
            .await
            .map_err(db)?;
            if let Some(existing) = holder {
                return Err(StoreError::IdempotencyConflict {
                    tool: raw.tool.clone(),
                    key: edited.key.clone(),
                    existing: CallId::new(existing),
                });
            }
            raw.key = Some(edited.key.clone());
        }
        let was_issued = match CallStatus::parse(&raw.status) {
            Some(CallStatus::Issued) => true,
            // Not issued: did not happen, or approved and never run (its approval, with
            // any edited arguments, stays on the row).
            Some(CallStatus::NotHappened | CallStatus::Approved) => false,
            _ => {
                return Err(StoreError::CallNotInDoubt {
                    call: call.clone(),
                    status: raw.status,
                });
            }
        };
        raw.attempt += 1;
        raw.status = CallStatus::Issued.as_str().to_owned();
        raw.result = None;
        raw.error = None;
        raw.spend = None;
        raw.seal(ring)?;
        let conn = tx.conn();
        sqlx::query(
            "UPDATE durable_tool_calls SET attempt = ?, status = 'issued', \
             fence = ?, finished_at = NULL, result = NULL, error = NULL, spend = NULL, \
             mac = ?, idempotency_key = ?, operator_needed_at = NULL WHERE id = ?",
        )
        .bind(raw.attempt)
        .bind(fence.token)
        .bind(raw.mac.as_deref())
        .bind(raw.key.as_deref())
        .bind(call.as_str())
        .execute(&mut *conn)
        .await
        .map_err(db)?;
        if approved {
            // The log says the approved call was issued: restoring the row's approved
            // version afterwards is refused (`ApprovalEvent::check_row`).
            let last = approval::last_event(&mut *conn, call).await?;
            ApprovalEvent::check_row(fence.session, call, CallStatus::Approved, last)?;
            let entry = approval::LogEntry {
                call,
                event: ApprovalEvent::Issued,
                actor: "worker",
                note: None,
                args_before: None,
                args_after: None,
            };
            approval::append(&mut *conn, ring, &mut fenced.head, entry, tx_now).await?;
        }
        if !was_issued {
            fenced.head.count_issued(1)?;
            fenced.head.store(&mut *conn, ring).await?;
        }
        load_call(conn, ring, call).await
    }
    .await;
    tx.finish(result).await
}

/// Records an issued call's outcome (and, atomically, a checkpoint). A write of the
/// process's group commit ([`crate::group`]), two round trips inside the batch's
/// transaction: one `SELECT` (clock, fence, head, the row's sealed columns and, with a
/// checkpoint, the latest checkpoint's tail), then, in a savepoint, the `UPDATE` and the
/// checkpoint's statements.
pub(crate) async fn finish_call(
    store: &SqliteStore,
    fence: Fence<'_>,
    call: &CallId,
    finish: FinishCall,
    checkpoint: Option<(i64, NewCheckpoint)>,
) -> Result<Option<CheckpointMeta>, StoreError> {
    let (status, result, error) = outcome_columns(&finish.outcome)?;
    let outcome = Outcome {
        status,
        result,
        error,
        spend: opt_json(finish.spend.as_ref())?,
    };
    let job_store = store.clone();
    let (session, token, call) = (fence.session.clone(), fence.token, call.clone());
    store
        .group()
        .submit(move |conn, deliver| {
            Box::pin(async move {
                let fence = Fence {
                    session: &session,
                    token,
                };
                let result =
                    write_finish(conn, job_store.keyring(), fence, &call, outcome, checkpoint)
                        .await;
                deliver.done(result)
            })
        })
        .await
}

/// A recorded outcome's columns.
struct Outcome {
    status: CallStatus,
    result: Option<String>,
    error: Option<String>,
    spend: Option<String>,
}

/// The statements of [`finish_call`], inside a batch.
async fn write_finish(
    conn: &mut BatchConn,
    ring: &Keyring,
    fence: Fence<'_>,
    call: &CallId,
    outcome: Outcome,
    checkpoint: Option<(i64, NewCheckpoint)>,
) -> Result<Option<CheckpointMeta>, StoreError> {
    let sql = match checkpoint {
        None => fenced_call_select!(),
        Some(_) => checkpoints::latest_checkpoint_select!(
            concat!(", ", raw_call_cols!()),
            " LEFT JOIN durable_tool_calls c ON c.id = ?"
        ),
    };
    let mut args = SqliteArguments::default();
    args.add(call.as_str().to_owned())
        .map_err(|e| db(sqlx::Error::Encode(e)))?;
    let (now, mut fenced, row) = conn.fenced(ring, fence, sql, args).await?;
    let mut raw = fenced_call(&row, ring, fence, call)?;
    if raw.status != CallStatus::Issued.as_str() {
        return Err(StoreError::CallNotInDoubt {
            call: call.clone(),
            status: raw.status,
        });
    }
    raw.status = outcome.status.as_str().to_owned();
    raw.result = outcome.result;
    raw.error = outcome.error;
    raw.spend = outcome.spend;
    raw.seal(ring)?;
    fenced.head.count_issued(-1)?;
    let mut out = Statements::new();
    out.push(
        "UPDATE durable_tool_calls SET status = ?, result = ?, error = ?, spend = ?, \
         mac = ?, finished_at = ? WHERE id = ?",
    )
    .bind(raw.status)?
    .bind(raw.result)?
    .bind(raw.error)?
    .bind(raw.spend)?
    .bind(raw.mac)?
    .bind(now)?
    .bind(call.as_str().to_owned())?;
    // The head counts one issued row fewer; a checkpoint written with the outcome
    // re-seals and writes it with its own changes.
    let meta = match &checkpoint {
        None => {
            fenced.head.seal(ring)?;
            out.push("UPDATE durable_sessions SET issued_rows = ?, head = ? WHERE id = ?")
                .bind(fenced.head.issued_rows)?
                .bind(fenced.head.head.clone())?
                .bind(fence.session.as_str().to_owned())?;
            None
        }
        Some((expected, cp)) => {
            let latest = LatestCheckpoint::from_row(&row, fence.session)?;
            Some(checkpoints::append_checkpoint(
                &mut out,
                ring,
                now,
                fence.session,
                &mut fenced,
                &latest,
                *expected,
                cp,
            )?)
        }
    };
    let (sql, args) = out.into_parts();
    conn.write(&sql, args).await?;
    Ok(meta)
}

pub(crate) async fn call(store: &SqliteStore, id: &CallId) -> Result<CallRecord, StoreError> {
    let mut conn = crate::error::acquire(store.reader(), crate::error::Pool::Reader).await?;
    load_call(&mut conn, store.keyring(), id).await
}

pub(crate) async fn calls(
    store: &SqliteStore,
    session: &SessionId,
    step: Option<i64>,
) -> Result<Vec<CallRecord>, StoreError> {
    match step {
        Some(step) => step_calls(store, session, step).await,
        None => all_calls(store, session).await,
    }
}

/// Every row of the session, with the whole journal's completeness checked, in one
/// statement (one snapshot, one round trip): the session row with its head and the
/// journal's count, joined to its rows (`NULL` columns when there are none).
async fn all_calls(
    store: &SqliteStore,
    session: &SessionId,
) -> Result<Vec<CallRecord>, StoreError> {
    let ring = store.keyring();
    let found = sqlx::query(concat!(
        "SELECT ",
        seal::head_cols!(),
        seal::journal_count_cols!(),
        ", ",
        call_cols!(),
        " FROM durable_sessions s LEFT JOIN durable_tool_calls c \
         ON c.session_id = s.id WHERE s.id = ?1 ORDER BY c.seq"
    ))
    .bind(session.as_str())
    .fetch_all(store.reader())
    .await
    .map_err(db)?;
    let (first, head) = head_row(&found, ring, session)?;
    seal::JournalCount::from_row(first, session)?.check(&head)?;
    let mut rows = Vec::with_capacity(found.len());
    for row in &found {
        let id: Option<String> = rows::col(row, "id", session, None)?;
        if id.is_some() {
            rows.push(checked_call_record(ring, row)?);
        }
    }
    head.check_issued(
        rows.iter()
            .filter(|row| row.status == CallStatus::Issued)
            .count(),
    )?;
    Ok(rows)
}

/// One page of the session's journal (positions `after + 1 ..= after + limit`), in one
/// statement: the session row with its head and the journal's extent (two look-ups in
/// the position index), joined to the page's rows by the position index; checked with
/// [`check_journal_page`], so a page costs the same at any depth.
pub(crate) async fn calls_page(
    store: &SqliteStore,
    session: &SessionId,
    after: i64,
    limit: i64,
) -> Result<Vec<CallRecord>, StoreError> {
    let ring = store.keyring();
    let after = after.max(0);
    let limit = limit.max(1);
    let found = sqlx::query(concat!(
        "SELECT ",
        seal::head_cols!(),
        ", (SELECT COALESCE(MAX(seq), 0) FROM durable_tool_calls WHERE session_id = ?1) \
         AS journal_top, \
         (SELECT COALESCE(MIN(seq), 1) FROM durable_tool_calls WHERE session_id = ?1) \
         AS journal_bottom, ",
        call_cols!(),
        " FROM durable_sessions s LEFT JOIN durable_tool_calls c \
         ON c.session_id = s.id AND c.seq > ?2 AND c.seq <= ?2 + ?3 \
         WHERE s.id = ?1 ORDER BY c.seq"
    ))
    .bind(session.as_str())
    .bind(after)
    .bind(limit)
    .fetch_all(store.reader())
    .await
    .map_err(db)?;
    let (first, head) = head_row(&found, ring, session)?;
    let extent = (
        rows::col(first, "journal_top", session, None)?,
        rows::col(first, "journal_bottom", session, None)?,
    );
    let mut calls = Vec::with_capacity(found.len());
    let mut seqs = Vec::with_capacity(found.len());
    for row in &found {
        let id: Option<String> = rows::col(row, "id", session, None)?;
        if id.is_some() {
            seqs.push(rows::col(row, "seq", session, None)?);
            calls.push(checked_call_record(ring, row)?);
        }
    }
    check_journal_page(session, head.journal_rows, extent, after, limit, &seqs)?;
    Ok(calls)
}

/// The first row of a read that joins the session row to its journal rows, and the
/// session head it carries, checked: [`StoreError::SessionNotFound`] without a row.
fn head_row<'r>(
    found: &'r [SqliteRow],
    ring: &Keyring,
    session: &SessionId,
) -> Result<(&'r SqliteRow, seal::HeadRow), StoreError> {
    let first = found
        .first()
        .ok_or_else(|| StoreError::SessionNotFound(session.clone()))?;
    let head = seal::head_from_row(first, session)?;
    head.check(ring)?;
    Ok((first, head))
}

/// One step's rows, in one statement (one snapshot, one round trip): the session row
/// with its head and [`seal::step_check_cols!`], joined to the step's rows and to its
/// neighbours by position (the rows just before and after the step's, and the nearest
/// rows of the nearest earlier and later steps; `NULL` columns when there are none). The
/// step's rows are found by the identity index, which leads with (session_id, step), and
/// the neighbours by the position index; ordering by the position index would walk the
/// whole session.
///
/// Every neighbour's seal is checked: a row moved out of the step to an earlier or a
/// later one, its seal untouched, sits next to the step's rows (or, for a step left
/// without rows, is the nearest row of another step), so its own seal tells.
async fn step_calls(
    store: &SqliteStore,
    session: &SessionId,
    step: i64,
) -> Result<Vec<CallRecord>, StoreError> {
    let ring = store.keyring();
    let found = sqlx::query(concat!(
        "SELECT ",
        seal::head_cols!(),
        seal::step_check_cols!(),
        ", ",
        call_cols!(),
        " FROM durable_sessions s LEFT JOIN ( \
           SELECT * FROM durable_tool_calls WHERE session_id = ?1 AND step = ?2 \
           UNION ALL \
           SELECT * FROM durable_tool_calls WHERE session_id = ?1 AND step <> ?2 AND seq IN ( \
             (SELECT MIN(+seq) FROM durable_tool_calls WHERE session_id = ?1 AND step = ?2) - 1, \
             (SELECT MAX(+seq) FROM durable_tool_calls WHERE session_id = ?1 AND step = ?2) + 1, \
             (SELECT MAX(+seq) FROM durable_tool_calls WHERE session_id = ?1 AND step = \
               (SELECT step FROM durable_tool_calls WHERE session_id = ?1 AND step < ?2 \
                ORDER BY step DESC LIMIT 1)), \
             (SELECT MIN(+seq) FROM durable_tool_calls WHERE session_id = ?1 AND step = \
               (SELECT step FROM durable_tool_calls WHERE session_id = ?1 AND step > ?2 \
                ORDER BY step LIMIT 1)))) c ON 1 \
         WHERE s.id = ?1 ORDER BY c.seq"
    ))
    .bind(session.as_str())
    .bind(step)
    .fetch_all(store.reader())
    .await
    .map_err(db)?;
    let (first, head) = head_row(&found, ring, session)?;
    let mut rows = Vec::with_capacity(found.len());
    let mut seqs = Vec::with_capacity(found.len());
    for row in &found {
        let seq: Option<i64> = rows::col(row, "seq", session, None)?;
        let Some(seq) = seq else { continue };
        let row_step: i64 = rows::col(row, "step", session, None)?;
        if row_step == step {
            seqs.push(seq);
            rows.push(row);
        } else {
            // A neighbour: only its seal matters here.
            checked_call_record(ring, row)?;
        }
    }
    if let Err(by_position) = seal::StepCheck::from_row(first, session)?.check(&head, step, &seqs) {
        // A journal written before schema 3 may hold steps out of order, which the check
        // by position cannot tell from deleted rows: the whole journal decides, every row
        // and seal checked. Tampering fails there too (with its own detail).
        tracing::debug!(%by_position, "step read: checking the whole journal");
        let all = all_calls(store, session).await?;
        return Ok(all
            .into_iter()
            .filter(|row| row.identity.step == step)
            .collect());
    }
    rows.into_iter()
        .map(|row| checked_call_record(ring, row))
        .collect()
}

/// The session's `issued` rows, from the partial index of issued rows, with the session
/// head in the same statement (one snapshot): every row's seal is checked and their
/// number must be the head's sealed count of issued rows, so a row set to or from
/// `issued` behind the store's back, or a deleted issued row, is [`StoreError::Tampered`].
/// Nothing here grows with the journal.
pub(crate) async fn issued_calls(
    store: &SqliteStore,
    session: &SessionId,
) -> Result<Vec<CallRecord>, StoreError> {
    let ring = store.keyring();
    let found = sqlx::query(concat!(
        "SELECT ",
        seal::head_cols!(),
        ", ",
        call_cols!(),
        " FROM durable_sessions s LEFT JOIN durable_tool_calls c \
         ON c.session_id = s.id AND c.status = 'issued' WHERE s.id = ?1 ORDER BY c.seq"
    ))
    .bind(session.as_str())
    .fetch_all(store.reader())
    .await
    .map_err(db)?;
    let (_, head) = head_row(&found, ring, session)?;
    let mut rows = Vec::with_capacity(found.len());
    for row in &found {
        let id: Option<String> = rows::col(row, "id", session, None)?;
        if id.is_some() {
            rows.push(checked_call_record(ring, row)?);
        }
    }
    head.check_issued(rows.len())?;
    Ok(rows)
}

pub(crate) async fn in_doubt(
    store: &SqliteStore,
    session: Option<&SessionId>,
) -> Result<Vec<CallRecord>, StoreError> {
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
    .fetch_all(store.reader())
    .await
    .map_err(db)?;
    let ring = store.keyring();
    found
        .iter()
        .map(|row| checked_call_record(ring, row))
        .collect()
}

/// The key-check column of a keyed call's first round trip: another call of the same
/// tool that used the key with other arguments.
macro_rules! key_holder_col {
    () => {
        ", (SELECT k.id FROM durable_tool_calls k WHERE k.tool_name = ? \
         AND k.idempotency_key = ? AND k.input_hash <> ? ORDER BY k.issued_at, k.id LIMIT 1) \
         AS key_holder"
    };
}

pub(crate) use key_holder_col;

/// The step of the session's latest journal row (by position, from the index), which a
/// new row's step may not be before.
macro_rules! latest_step_col {
    () => {
        ", (SELECT l.step FROM durable_tool_calls l WHERE l.session_id = s.id \
         AND l.seq = s.journal_rows) AS latest_step"
    };
}

pub(crate) use latest_step_col;

/// `issue_call` (`finish = None`: status `issued`) and `record_call` (the outcome is
/// written with the new row): fence check, step check, idempotency-key check, then
/// insert-or-get on the call identity. A new row is sealed at the next position of the
/// session's journal, and the session head counts it.
///
/// A write of the process's group commit ([`crate::group`]), two round trips inside the
/// batch's transaction: one `SELECT` (the clock, the fence, the head, the latest row's
/// step and, for a keyed call, the key check), then, in a savepoint, the `INSERT …
/// RETURNING` and the head's `UPDATE` (only if the row was inserted: `changes() = 1`).
/// The inserted row is returned as written, not read back; an existing one is read once
/// the batch has committed.
async fn insert_call(
    store: &SqliteStore,
    fence: Fence<'_>,
    call: NewCall,
    finish: Option<FinishCall>,
) -> Result<IssueOutcome, StoreError> {
    if call.identity.session != *fence.session {
        return Err(StoreError::LeaseLost {
            session: call.identity.session.clone(),
            token: fence.token,
        });
    }
    // Serialized before the batch: nothing there can fail on the values.
    let args = json(&call.args)?;
    let (status, result, error, spend) = match &finish {
        None => (CallStatus::Issued, None, None, None),
        Some(finish) => {
            let (status, result, error) = outcome_columns(&finish.outcome)?;
            (status, result, error, opt_json(finish.spend.as_ref())?)
        }
    };
    let raw = RawCall {
        result,
        error,
        spend,
        ..new_row(&call, status, args, 1)
    };
    let job_store = store.clone();
    let (session, token) = (fence.session.clone(), fence.token);
    let finished = finish.is_some();
    let written = store
        .group()
        .submit(move |conn, deliver| {
            Box::pin(async move {
                let fence = Fence {
                    session: &session,
                    token,
                };
                let result = write_call(conn, job_store.keyring(), fence, raw, finished).await;
                deliver.done(result)
            })
        })
        .await?;
    let Some((seq, mac, now)) = written else {
        // The identity was there already: the existing row, as committed.
        let identity = &call.identity;
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
        .fetch_one(store.reader())
        .await
        .map_err(db)?;
        return Ok(IssueOutcome::Existing(checked_call_record(
            store.keyring(),
            &row,
        )?));
    };
    debug_assert!(seq > 0);
    let (result, error, spend) = match finish {
        None => (None, None, None),
        Some(FinishCall {
            outcome: CallOutcome::Completed(value),
            spend,
        }) => (Some(value), None, spend),
        Some(FinishCall {
            outcome: CallOutcome::Failed(value),
            spend,
        }) => (None, Some(value), spend),
    };
    Ok(IssueOutcome::Inserted(CallRecord {
        id: call.id,
        kind: call.kind,
        class: call.class,
        status,
        args: call.args,
        idempotency_key: call.idempotency_key,
        schema_hash: call.schema_hash,
        result,
        error,
        spend,
        mac: Some(mac),
        attempt: 1,
        fence: fence.token,
        issued_at: now,
        finished_at: finished.then_some(now),
        identity: call.identity,
        approval: None,
    }))
}

/// The sealed columns of a new journal row for `call` (its `args` already serialized),
/// with no outcome, approval or position yet.
pub(crate) fn new_row(call: &NewCall, status: CallStatus, args: String, attempt: i64) -> RawCall {
    RawCall {
        id: call.id.as_str().to_owned(),
        session: call.identity.session.as_str().to_owned(),
        kind: call.kind.as_str().to_owned(),
        step: call.identity.step,
        tool: call.identity.tool.clone(),
        input_hash: call.identity.input_hash.clone(),
        ordinal: call.identity.ordinal,
        class: call.class.as_str().to_owned(),
        status: status.as_str().to_owned(),
        args,
        key: call.idempotency_key.clone(),
        schema_hash: call.schema_hash.clone(),
        result: None,
        error: None,
        spend: None,
        attempt,
        seq: 0,
        mac: None,
        approval: None,
    }
}

/// The statements of [`insert_call`], inside a batch: `Some((seq, seal, now))` if the
/// row was inserted, `None` if its identity existed.
async fn write_call(
    conn: &mut BatchConn,
    ring: &Keyring,
    fence: Fence<'_>,
    mut raw: RawCall,
    finished: bool,
) -> Result<Option<(i64, String, i64)>, StoreError> {
    let (now, mut fenced, row) = match &raw.key {
        None => {
            conn.fenced(
                ring,
                fence,
                fenced_select!(concat!(latest_step_col!(), cancel_cols!()), ""),
                SqliteArguments::default(),
            )
            .await?
        }
        Some(key) => {
            let mut args = SqliteArguments::default();
            for value in [&raw.tool, key, &raw.input_hash] {
                args.add(value.clone())
                    .map_err(|e| db(sqlx::Error::Encode(e)))?;
            }
            conn.fenced(
                ring,
                fence,
                fenced_select!(
                    concat!(latest_step_col!(), cancel_cols!(), key_holder_col!()),
                    ""
                ),
                args,
            )
            .await?
        }
    };
    // A session asked to stop issues nothing (what `record_call` records already ran).
    if !finished {
        refuse_if_cancelled(&row, fence.session)?;
    }
    let latest: Option<i64> = rows::col(&row, "latest_step", fence.session, None)?;
    if let Some(latest) = latest.filter(|&latest| raw.step < latest) {
        return Err(StoreError::StepClosed {
            session: fence.session.clone(),
            step: raw.step,
            latest,
        });
    }
    if let Some(key) = &raw.key {
        let holder: Option<String> = rows::col(&row, "key_holder", fence.session, None)?;
        if let Some(existing) = holder {
            return Err(StoreError::IdempotencyConflict {
                tool: raw.tool.clone(),
                key: key.clone(),
                existing: CallId::new(existing),
            });
        }
    }
    raw.seq = fenced.head.journal_rows + 1;
    raw.seal(ring)?;
    fenced.head.journal_rows = raw.seq;
    if !finished {
        fenced.head.count_issued(1)?;
    }
    fenced.head.seal(ring)?;
    let mut out = Statements::new();
    out.push(
        "INSERT INTO durable_tool_calls (id, session_id, kind, step, tool_name, input_hash, \
             ordinal, replay_class, status, args, idempotency_key, schema_hash, result, error, \
             spend, mac, attempt, fence, format, issued_at, finished_at, seq) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 1, ?, ?, ?, ?, ?) \
             ON CONFLICT (session_id, step, tool_name, input_hash, ordinal) DO NOTHING \
             RETURNING seq",
    )
    .bind(raw.id.clone())?
    .bind(raw.session.clone())?
    .bind(raw.kind.clone())?
    .bind(raw.step)?
    .bind(raw.tool.clone())?
    .bind(raw.input_hash.clone())?
    .bind(raw.ordinal)?
    .bind(raw.class.clone())?
    .bind(raw.status.clone())?
    .bind(std::mem::take(&mut raw.args))?
    .bind(raw.key.clone())?
    .bind(raw.schema_hash.clone())?
    .bind(raw.result.take())?
    .bind(raw.error.take())?
    .bind(raw.spend.take())?
    .bind(raw.mac.clone())?
    .bind(fence.token)?
    .bind(FORMAT_VERSION)?
    .bind(now)?
    .bind(finished.then_some(now))?
    .bind(raw.seq)?;
    out.push(
        "UPDATE durable_sessions SET journal_rows = ?, issued_rows = ?, head = ? \
             WHERE id = ? AND changes() = 1",
    )
    .bind(fenced.head.journal_rows)?
    .bind(fenced.head.issued_rows)?
    .bind(fenced.head.head.clone())?
    .bind(fence.session.as_str().to_owned())?;
    let (sql, args) = out.into_parts();
    let rows = conn.write(&sql, args).await?;
    Ok((!rows.is_empty()).then(|| (raw.seq, raw.mac.clone().unwrap_or_default(), now)))
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

/// Reads a full journal row, or [`StoreError::CallNotFound`].
pub(crate) async fn load_call(
    conn: &mut SqliteConnection,
    ring: &Keyring,
    id: &CallId,
) -> Result<CallRecord, StoreError> {
    let row = sqlx::query(concat!(
        "SELECT ",
        call_cols!(),
        " FROM durable_tool_calls c WHERE c.id = ?"
    ))
    .bind(id.as_str())
    .fetch_optional(conn)
    .await
    .map_err(db)?
    .ok_or_else(|| StoreError::CallNotFound(id.clone()))?;
    checked_call_record(ring, &row)
}

#[async_trait]
impl JournalStore for SqliteStore {
    async fn issue_call(
        &self,
        fence: Fence<'_>,
        call: NewCall,
    ) -> Result<IssueOutcome, StoreError> {
        let outcome = issue_call(self, fence, call).await?;
        if let IssueOutcome::Inserted(record) = &outcome {
            // Committed and synced; the witness learns of it before the effect may run.
            self.witness_call(record)?;
        }
        Ok(outcome)
    }

    async fn record_call(
        &self,
        fence: Fence<'_>,
        call: NewCall,
        finish: FinishCall,
    ) -> Result<IssueOutcome, StoreError> {
        record_call(self, fence, call, finish).await
    }

    async fn reissue_call(
        &self,
        fence: Fence<'_>,
        call: &CallId,
    ) -> Result<CallRecord, StoreError> {
        let record = reissue_call(self, fence, call, None).await?;
        self.witness_call(&record)?;
        Ok(record)
    }

    async fn issue_approved(
        &self,
        fence: Fence<'_>,
        call: &CallId,
        key: Option<EditedKey>,
    ) -> Result<CallRecord, StoreError> {
        let record = reissue_call(self, fence, call, Some(key)).await?;
        self.witness_call(&record)?;
        Ok(record)
    }

    async fn finish_call(
        &self,
        fence: Fence<'_>,
        call: &CallId,
        finish: FinishCall,
        checkpoint: Option<(i64, NewCheckpoint)>,
    ) -> Result<Option<CheckpointMeta>, StoreError> {
        finish_call(self, fence, call, finish, checkpoint).await
    }

    async fn call(&self, id: &CallId) -> Result<CallRecord, StoreError> {
        call(self, id).await
    }

    async fn calls(
        &self,
        session: &SessionId,
        step: Option<i64>,
    ) -> Result<Vec<CallRecord>, StoreError> {
        calls(self, session, step).await
    }

    async fn calls_page(
        &self,
        session: &SessionId,
        after: i64,
        limit: i64,
    ) -> Result<Vec<CallRecord>, StoreError> {
        calls_page(self, session, after, limit).await
    }

    async fn issued_calls(&self, session: &SessionId) -> Result<Vec<CallRecord>, StoreError> {
        issued_calls(self, session).await
    }

    async fn in_doubt(&self, session: Option<&SessionId>) -> Result<Vec<CallRecord>, StoreError> {
        in_doubt(self, session).await
    }
}
