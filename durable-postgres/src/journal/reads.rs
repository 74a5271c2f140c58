//! Reads of the journal: one row, a session's whole journal or one step of it (checked
//! complete, one statement each), its issued rows, and the store-wide in-doubt listing.

use durable_core::StoreError;
use durable_core::ids::{CallId, SessionId};
use durable_core::integrity::Keyring;
use durable_core::store::{CallRecord, check_journal_page};
use sqlx::postgres::PgRow;

use crate::PostgresStore;
use crate::error::{db, invariant};
use crate::rows::{call_cols, get};
use crate::seal::{self, checked_call_record, head_cols, journal_extent_cols};
use crate::tx;

pub(crate) async fn call(store: &PostgresStore, id: &CallId) -> Result<CallRecord, StoreError> {
    let row = sqlx::query(concat!(
        "SELECT ",
        call_cols!(),
        " FROM durable_tool_calls WHERE id = $1"
    ))
    .bind(id.as_str())
    .fetch_optional(&mut *store.conn().await?)
    .await
    .map_err(db)?
    .ok_or_else(|| StoreError::CallNotFound(id.clone()))?;
    checked_call_record(store.keyring(), &row)
}

pub(crate) async fn calls(
    store: &PostgresStore,
    session: &SessionId,
    step: Option<i64>,
) -> Result<Vec<CallRecord>, StoreError> {
    match step {
        Some(step) => step_calls(store, session, step).await,
        None => journal_calls(store, session).await,
    }
}

/// The session's `issued` rows, from the partial index of issued rows alone, with the
/// head in one statement (one snapshot): the head's seal, every row's seal, and their
/// number against the head's sealed count of issued rows. A row set to or from `issued`
/// behind the store's back, or a deleted issued row, is [`StoreError::Tampered`]. Nothing
/// else of the journal is read, so the cost follows the rows in doubt, not the journal's
/// length.
pub(crate) async fn issued_calls(
    store: &PostgresStore,
    session: &SessionId,
) -> Result<Vec<CallRecord>, StoreError> {
    const ISSUED: &str = concat!(
        "WITH h AS (SELECT ",
        head_cols!(),
        " FROM durable_sessions s WHERE s.id = $1) \
         SELECT h.*, c.* FROM h \
         LEFT JOIN durable_tool_calls c ON c.session_id = $1 AND c.status = 'issued' \
         ORDER BY c.seq"
    );
    let ring = store.keyring();
    let found = tx::read(&store.pool, || {
        sqlx::query(ISSUED)
            .bind(session.as_str())
            .fetch_all(&store.pool)
    })
    .await?;
    let first = found
        .first()
        .ok_or_else(|| StoreError::SessionNotFound(session.clone()))?;
    let head = seal::head_from_row(first, session)?;
    head.check(ring)?;
    let rows = checked_rows(ring, &found)?;
    head.check_issued(rows.len())?;
    Ok(rows)
}

/// The whole journal of a session, checked complete: the head, the count of the
/// session's rows (from the index of positions alone) and the rows in one statement, so
/// one snapshot; every row's seal checked.
async fn journal_calls(
    store: &PostgresStore,
    session: &SessionId,
) -> Result<Vec<CallRecord>, StoreError> {
    const ALL: &str = concat!(
        "WITH h AS (SELECT ",
        head_cols!(),
        " FROM durable_sessions s WHERE s.id = $1), \
         e AS (SELECT ",
        journal_extent_cols!(),
        " FROM durable_tool_calls WHERE session_id = $1) \
         SELECT h.*, e.*, c.* FROM h CROSS JOIN e \
         LEFT JOIN durable_tool_calls c ON c.session_id = $1 ORDER BY c.seq"
    );
    let ring = store.keyring();
    let found = tx::read(&store.pool, || {
        sqlx::query(ALL)
            .bind(session.as_str())
            .fetch_all(&store.pool)
    })
    .await?;
    let first = found
        .first()
        .ok_or_else(|| StoreError::SessionNotFound(session.clone()))?;
    let head = seal::head_from_row(first, session)?;
    head.check(ring)?;
    seal::journal_complete(&head, first)?;
    let rows = checked_rows(ring, &found)?;
    // The head's count of issued rows agrees with the rows (each under its own seal).
    if head.issued_rows.is_some() {
        head.check_issued(
            rows.iter()
                .filter(|r| r.status == durable_core::store::CallStatus::Issued)
                .count(),
        )?;
    }
    Ok(rows)
}

/// One page of the session's journal (positions `after + 1 ..= after + limit`), in one
/// statement (one snapshot): the head, the journal's extent (two look-ups in the
/// position index) and the page's rows by the position index; checked with
/// [`check_journal_page`], so a page costs the same at any depth.
pub(crate) async fn calls_page(
    store: &PostgresStore,
    session: &SessionId,
    after: i64,
    limit: i64,
) -> Result<Vec<CallRecord>, StoreError> {
    const PAGE: &str = concat!(
        "WITH h AS (SELECT ",
        head_cols!(),
        " FROM durable_sessions s WHERE s.id = $1), \
         e AS (SELECT \
           (SELECT COALESCE(max(seq), 0) FROM durable_tool_calls WHERE session_id = $1) AS top, \
           (SELECT COALESCE(min(seq), 1) FROM durable_tool_calls WHERE session_id = $1) AS bottom) \
         SELECT h.*, e.*, c.* FROM h CROSS JOIN e \
         LEFT JOIN durable_tool_calls c ON c.session_id = $1 AND c.seq > $2 AND c.seq <= $2 + $3 \
         ORDER BY c.seq"
    );
    let ring = store.keyring();
    let after = after.max(0);
    let limit = limit.max(1);
    let found = tx::read(&store.pool, || {
        sqlx::query(PAGE)
            .bind(session.as_str())
            .bind(after)
            .bind(limit)
            .fetch_all(&store.pool)
    })
    .await?;
    let first = found
        .first()
        .ok_or_else(|| StoreError::SessionNotFound(session.clone()))?;
    let head = seal::head_from_row(first, session)?;
    head.check(ring)?;
    let extent = (get(first, "top")?, get(first, "bottom")?);
    let rows = checked_rows(ring, &found)?;
    let mut seqs = Vec::with_capacity(rows.len());
    for row in &found {
        if get::<Option<String>>(row, "id")?.is_some() {
            seqs.push(get::<i64>(row, "seq")?);
        }
    }
    check_journal_page(session, head.journal_rows, extent, after, limit, &seqs)?;
    Ok(rows)
}

/// The statement of [`step_calls`]: `$1` the session, `$2` the step. Returns the step's
/// rows and its neighbours by position (the rows just before and after them, or for a
/// step without rows the last row of the step before and the first of the step after),
/// in position order, each row beside the head and the step's extent. Sent unprepared,
/// once per step.
pub(crate) const STEP_READ: &str = concat!(
    "WITH h AS (SELECT ",
    head_cols!(),
    " FROM durable_sessions s WHERE s.id = $1), \
     r AS (SELECT ",
    call_cols!(),
    " FROM durable_tool_calls WHERE session_id = $1 AND step = $2), \
     e AS (SELECT count(*) AS step_rows, min(seq) AS step_first, max(seq) AS step_last \
           FROM r), \
     x AS (SELECT e.*, \
       (SELECT step FROM durable_tool_calls \
        WHERE session_id = $1 AND seq = e.step_first - 1) AS before_step, \
       (SELECT step FROM durable_tool_calls \
        WHERE session_id = $1 AND seq = e.step_last + 1) AS after_step, \
       CASE WHEN e.step_rows = 0 THEN \
         (SELECT max(seq) FROM durable_tool_calls WHERE session_id = $1 AND step = \
           (SELECT max(step) FROM durable_tool_calls WHERE session_id = $1 AND step < $2)) \
       END AS previous_seq, \
       CASE WHEN e.step_rows = 0 THEN \
         (SELECT min(seq) FROM durable_tool_calls WHERE session_id = $1 AND step = \
           (SELECT min(step) FROM durable_tool_calls WHERE session_id = $1 AND step > $2)) \
       END AS next_seq \
       FROM e), \
     n AS (SELECT ",
    call_cols!(),
    " FROM durable_tool_calls \
         WHERE session_id = $1 AND seq = (SELECT step_first - 1 FROM x) \
       UNION ALL SELECT ",
    call_cols!(),
    " FROM durable_tool_calls \
         WHERE session_id = $1 AND seq = (SELECT step_last + 1 FROM x) \
       UNION ALL SELECT ",
    call_cols!(),
    " FROM durable_tool_calls \
         WHERE session_id = $1 AND seq = (SELECT previous_seq FROM x) \
       UNION ALL SELECT ",
    call_cols!(),
    " FROM durable_tool_calls \
         WHERE session_id = $1 AND seq = (SELECT next_seq FROM x)) \
     SELECT h.*, x.*, u.* FROM h CROSS JOIN x \
     LEFT JOIN (SELECT * FROM r UNION ALL SELECT * FROM n) u ON true ORDER BY u.seq"
);

/// One step's rows, checked complete without reading the rest of the journal (see
/// [`seal::StepExtent::check`]): the head, the step's rows and the rows at either end of
/// them (whose seals are checked too), in one statement, so one snapshot. Every position is looked up by the unique
/// index of `(session_id, seq)`, the step's rows by the identity index, which leads with
/// `(session_id, step)`.
async fn step_calls(
    store: &PostgresStore,
    session: &SessionId,
    step: i64,
) -> Result<Vec<CallRecord>, StoreError> {
    let ring = store.keyring();
    let found = tx::read(&store.pool, || {
        sqlx::query(STEP_READ)
            // Unprepared: planned for its arguments every time (see the crate's docs,
            // `# Plans`). A generic plan made before the tables were first analyzed found
            // the neighbours and the previous and next steps by the session alone.
            .persistent(false)
            .bind(session.as_str())
            .bind(step)
            .fetch_all(&store.pool)
    })
    .await?;
    let head = step_head(ring, session, &found)?;
    if let Err(by_position) = step_extent(step, &found)?.check(&head) {
        // Not the layout the runtime writes (a step's rows in one run, after an earlier
        // step's and before a later one's), or rows are missing or were moved to another
        // step: the whole journal decides, every row and seal checked. A journal written
        // before schema 3 with steps out of order (a store used directly) passes it; a row
        // deleted, or moved out of this step with its seal untouched, fails it. Counting
        // the whole journal is not enough: a moved row leaves the count as it was.
        tracing::debug!(%by_position, "step read: checking the whole journal");
        return match journal_calls(store, session).await {
            Ok(all) => Ok(all
                .into_iter()
                .filter(|row| row.identity.step == step)
                .collect()),
            // Rows missing from the whole journal too: the step's own check names where.
            Err(StoreError::Tampered { what, .. }) if what == "the journal" => Err(by_position),
            Err(e) => Err(e),
        };
    }
    // Every row's seal, the neighbours' too: a row moved out of this step to the next
    // one (or the one before), its seal untouched, sits right there, and leaves this
    // step looking whole by position.
    Ok(checked_rows(ring, &found)?
        .into_iter()
        .filter(|row| row.identity.step == step)
        .collect())
}

/// The checked head of a [`step_calls`] read.
fn step_head(
    ring: &Keyring,
    session: &SessionId,
    found: &[PgRow],
) -> Result<seal::HeadRow, StoreError> {
    let first = found
        .first()
        .ok_or_else(|| StoreError::SessionNotFound(session.clone()))?;
    let head = seal::head_from_row(first, session)?;
    head.check(ring)?;
    Ok(head)
}

/// Where the step of a [`step_calls`] read sits in the journal.
fn step_extent(step: i64, found: &[PgRow]) -> Result<seal::StepExtent, StoreError> {
    let Some(first) = found.first() else {
        return Err(invariant("a step read without its head row"));
    };
    Ok(seal::StepExtent {
        step,
        rows: get(first, "step_rows")?,
        first: get(first, "step_first")?,
        last: get(first, "step_last")?,
        before: get(first, "before_step")?,
        after: get(first, "after_step")?,
        previous: get(first, "previous_seq")?,
        next: get(first, "next_seq")?,
    })
}

/// Decodes the journal rows of a read that joined them to its head (a row without an
/// `id`: the session has none), each after checking its seal.
fn checked_rows(ring: &Keyring, found: &[PgRow]) -> Result<Vec<CallRecord>, StoreError> {
    let mut calls = Vec::with_capacity(found.len());
    for row in found {
        if get::<Option<String>>(row, "id")?.is_some() {
            calls.push(checked_call_record(ring, row)?);
        }
    }
    Ok(calls)
}

pub(crate) async fn in_doubt(
    store: &PostgresStore,
    session: Option<&SessionId>,
) -> Result<Vec<CallRecord>, StoreError> {
    let ring = store.keyring();
    // `c.*`: the columns of `call_cols!`, unambiguous beside the join.
    sqlx::query(concat!(
        "SELECT c.* FROM durable_tool_calls c JOIN durable_sessions s ON s.id = c.session_id \
         WHERE c.status = 'issued' AND ($1::text IS NULL OR c.session_id = $1) \
           AND (s.fence <> c.fence OR s.lease_owner IS NULL OR s.lease_expires_at IS NULL \
                OR s.lease_expires_at <= ",
        tx::now_ms!(),
        ") ORDER BY s.created_at, s.id, c.seq"
    ))
    .bind(session.map(SessionId::as_str))
    .fetch_all(&mut *store.conn().await?)
    .await
    .map_err(db)?
    .iter()
    .map(|row| checked_call_record(ring, row))
    .collect()
}
