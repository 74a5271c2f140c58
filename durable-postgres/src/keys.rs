//! The store's keys: loading (or creating) its own key at connect, sealing a database
//! that was never sealed, re-sealing one under a new key, and re-sealing a session whose
//! rows were copied (a fork). Every re-sealing is audited in `durable_integrity_log`,
//! which is sealed as a whole (its seal in `durable_meta`).

use async_trait::async_trait;
use durable_core::integrity::rows::count_issued;
use durable_core::integrity::rows::{CheckpointRow, RawMessage, Reseal};
use durable_core::integrity::setup::{self, KeyTables, LogEvent};
use durable_core::integrity::{IntegrityEvent, IntegrityLog, Keyring};
use durable_core::{SessionId, StoreError};
use sqlx::postgres::PgConnection;

use crate::error::db;
use crate::rows::{self, get};
use crate::seal::{
    self, StoreHead, approval_cols, check_journal_complete, head_cols, head_from_row, raw_call,
    raw_call_cols,
};
use crate::tx;

/// Re-seals every row of one session under `to`, after checking it under `from` (`None`:
/// the rows were never sealed; they are sealed as they are). Returns the rows sealed.
/// The caller holds the session row (or created it in this transaction).
pub(crate) async fn reseal_session(
    conn: &mut PgConnection,
    from: Option<&Keyring>,
    to: &Keyring,
    session: &SessionId,
) -> Result<i64, StoreError> {
    let mut count = 0i64;
    // The head first, while it still names the old seal of the latest checkpoint.
    let row = sqlx::query(concat!(
        "SELECT ",
        head_cols!(),
        " FROM durable_sessions s WHERE s.id = $1"
    ))
    .bind(session.as_str())
    .fetch_one(&mut *conn)
    .await
    .map_err(db)?;
    let mut head = head_from_row(&row, session)?;
    let mut walk = Reseal::new(from, to, session);
    // A head written before schema 4 is checked as it was sealed, and counted below.
    walk.check_head(&head)?;
    if walk.checks() {
        check_journal_complete(&mut *conn, &head).await?;
    }
    // Journal rows.
    let found = sqlx::query(concat!(
        "SELECT ",
        raw_call_cols!(),
        " FROM durable_tool_calls WHERE session_id = $1 ORDER BY seq"
    ))
    .bind(session.as_str())
    .fetch_all(&mut *conn)
    .await
    .map_err(db)?;
    let mut calls = found.iter().map(raw_call).collect::<Result<Vec<_>, _>>()?;
    // A head that counted the issued rows already must agree; a head written before
    // schema 4 gets its count here.
    walk.calls(&mut head, &mut calls)?;
    let (ids, seals): (Vec<String>, Vec<String>) = calls
        .into_iter()
        .map(|raw| (raw.id, raw.mac.unwrap_or_default()))
        .unzip();
    if !ids.is_empty() {
        sqlx::query(
            "UPDATE durable_tool_calls c SET mac = u.seal \
             FROM unnest($1::text[], $2::text[]) AS u(id, seal) WHERE c.id = u.id",
        )
        .bind(&ids)
        .bind(&seals)
        .execute(&mut *conn)
        .await
        .map_err(db)?;
        count += ids.len() as i64;
    }
    // Messages, in order (chained).
    let found = sqlx::query(
        "SELECT seq, message, seal FROM durable_transcript \
         WHERE session_num = (SELECT num FROM durable_sessions WHERE id = $1) ORDER BY seq",
    )
    .bind(session.as_str())
    .fetch_all(&mut *conn)
    .await
    .map_err(db)?;
    let mut seqs = Vec::with_capacity(found.len());
    let mut seals = Vec::with_capacity(found.len());
    for row in &found {
        let message = RawMessage {
            seq: get(row, "seq")?,
            text: get(row, "message")?,
            seal: get(row, "seal")?,
        };
        seals.push(walk.message(&message)?);
        seqs.push(message.seq);
    }
    if !seqs.is_empty() {
        sqlx::query(
            "UPDATE durable_messages m SET seal = u.seal \
             FROM unnest($2::bigint[], $3::text[]) AS u(seq, seal) \
             WHERE m.session_num = (SELECT num FROM durable_sessions WHERE id = $1) \
               AND m.seq = u.seq",
        )
        .bind(session.as_str())
        .bind(&seqs)
        .bind(&seals)
        .execute(&mut *conn)
        .await
        .map_err(db)?;
        count += seqs.len() as i64;
    }
    // Checkpoints, in order (chained).
    // Snapshots stored as references to an earlier version are sealed as the text they
    // name (and stay references).
    let found = sqlx::query(concat!(
        "SELECT k.version, k.last_seq, k.message_count, ",
        rows::snapshot!("k", "plan"),
        " AS plan, ",
        rows::snapshot!("k", "budget"),
        " AS budget, ",
        rows::snapshot!("k", "state"),
        " AS state, k.app_version, k.seal \
         FROM durable_checkpoints k \
         WHERE k.session_num = (SELECT num FROM durable_sessions WHERE id = $1) \
         ORDER BY k.version"
    ))
    .bind(session.as_str())
    .fetch_all(&mut *conn)
    .await
    .map_err(db)?;
    let mut versions = Vec::with_capacity(found.len());
    let mut seals = Vec::with_capacity(found.len());
    for row in &found {
        let version: i64 = get(row, "version")?;
        let checkpoint = CheckpointRow {
            version,
            last_seq: get(row, "last_seq")?,
            plan: rows::snapshot_text(session, version, "the plan", get(row, "plan")?)?,
            budget: rows::snapshot_text(session, version, "the budget", get(row, "budget")?)?,
            state: rows::snapshot_text(session, version, "the state", get(row, "state")?)?,
            app_version: get(row, "app_version")?,
            message_count: get(row, "message_count")?,
            seal: get(row, "seal")?,
        };
        let last_seq = checkpoint.last_seq;
        let new = walk.checkpoint(&checkpoint, || StoreError::Tampered {
            session: session.clone(),
            what: format!("checkpoint {version}"),
            detail: format!("its transcript ends at message {last_seq}, which is missing"),
        })?;
        versions.push(version);
        seals.push(new);
    }
    if !versions.is_empty() {
        sqlx::query(
            "UPDATE durable_checkpoints k SET seal = u.seal \
             FROM unnest($2::bigint[], $3::text[]) AS u(version, seal) \
             WHERE k.session_num = (SELECT num FROM durable_sessions WHERE id = $1) \
               AND k.version = u.version",
        )
        .bind(session.as_str())
        .bind(&versions)
        .bind(&seals)
        .execute(&mut *conn)
        .await
        .map_err(db)?;
        count += versions.len() as i64;
    }
    // Resolutions.
    let found = sqlx::query(
        "SELECT id, call_id, position, decision, result, resolved_by, note, seal \
         FROM durable_resolutions WHERE session_id = $1 ORDER BY id",
    )
    .bind(session.as_str())
    .fetch_all(&mut *conn)
    .await
    .map_err(db)?;
    let mut rowids = Vec::with_capacity(found.len());
    let mut seals = Vec::with_capacity(found.len());
    for row in &found {
        let resolution = seal::raw_resolution(row)?;
        seals.push(walk.resolution(&resolution)?);
        rowids.push(get::<i64>(row, "id")?);
    }
    if !rowids.is_empty() {
        sqlx::query(
            "UPDATE durable_resolutions r SET seal = u.seal \
             FROM unnest($1::bigint[], $2::text[]) AS u(id, seal) WHERE r.id = u.id",
        )
        .bind(&rowids)
        .bind(&seals)
        .execute(&mut *conn)
        .await
        .map_err(db)?;
        count += rowids.len() as i64;
    }
    // The approval log, in position order: checked whole under the old key (every seal
    // at its position, their number against the head), each row sealed again at its
    // position.
    let found = sqlx::query(concat!(
        "SELECT ",
        approval_cols!(),
        " FROM durable_approvals WHERE session_id = $1 ORDER BY position"
    ))
    .bind(session.as_str())
    .fetch_all(&mut *conn)
    .await
    .map_err(db)?;
    if let Some(from) = from {
        seal::check_approvals(from, &head, &found)?;
    }
    let mut rowids = Vec::with_capacity(found.len());
    let mut seals = Vec::with_capacity(found.len());
    for row in &found {
        let mut raw = seal::raw_approval(row)?;
        raw.seal(to, session)?;
        rowids.push(get::<i64>(row, "id")?);
        seals.push(raw.seal.unwrap_or_default());
    }
    if !rowids.is_empty() {
        sqlx::query(
            "UPDATE durable_approvals a SET seal = u.seal \
             FROM unnest($1::bigint[], $2::text[]) AS u(id, seal) WHERE a.id = u.id",
        )
        .bind(&rowids)
        .bind(&seals)
        .execute(&mut *conn)
        .await
        .map_err(db)?;
        count += rowids.len() as i64;
    }
    // The head, naming the latest checkpoint's new seal.
    walk.point_head(&mut head);
    head.store(conn, to).await?;
    Ok(count + 1)
}

/// The store's tables, as the key setup written in `durable_core` reads and writes them
/// ([`KeyTables`]), in the connector's setup transaction.
struct Tables<'c>(&'c mut PgConnection);

#[async_trait]
impl KeyTables for Tables<'_> {
    async fn meta(&mut self, name: &str) -> Result<Option<String>, StoreError> {
        sqlx::query_scalar("SELECT value FROM durable_meta WHERE name = $1")
            .bind(name)
            .fetch_optional(&mut *self.0)
            .await
            .map_err(db)
    }

    async fn set_meta(&mut self, name: &str, value: &str) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO durable_meta (name, value) VALUES ($1, $2) \
             ON CONFLICT (name) DO UPDATE SET value = excluded.value",
        )
        .bind(name)
        .bind(value)
        .execute(&mut *self.0)
        .await
        .map_err(db)?;
        Ok(())
    }

    async fn now(&mut self) -> Result<i64, StoreError> {
        tx::now(self.0).await
    }

    async fn sealed_with(&mut self) -> Result<(i64, Option<String>), StoreError> {
        let sessions: i64 = sqlx::query_scalar("SELECT count(*) FROM durable_sessions")
            .fetch_one(&mut *self.0)
            .await
            .map_err(db)?;
        let head: Option<String> = sqlx::query_scalar(
            "SELECT head FROM durable_sessions WHERE head IS NOT NULL ORDER BY created_at, id LIMIT 1",
        )
        .fetch_optional(&mut *self.0)
        .await
        .map_err(db)?;
        Ok((sessions, head))
    }

    async fn session_ids(&mut self) -> Result<Vec<SessionId>, StoreError> {
        // Every session row is locked: no writer changes a session while it is re-sealed.
        let ids: Vec<String> = sqlx::query_scalar(
            "SELECT id FROM durable_sessions ORDER BY created_at, id FOR UPDATE",
        )
        .fetch_all(&mut *self.0)
        .await
        .map_err(db)?;
        Ok(ids.into_iter().map(SessionId::new).collect())
    }

    async fn reseal_session(
        &mut self,
        from: Option<&Keyring>,
        to: &Keyring,
        session: &SessionId,
    ) -> Result<i64, StoreError> {
        reseal_session(self.0, from, to, session).await
    }

    async fn upgrade_heads(&mut self, ring: &Keyring) -> Result<(), StoreError> {
        upgrade_heads(self.0, ring).await
    }

    async fn log_events(&mut self) -> Result<Vec<IntegrityEvent>, StoreError> {
        let rows: Vec<LogRow> = sqlx::query_as(
            "SELECT id, event, from_key, to_key, rows, detail, created_at \
             FROM durable_integrity_log ORDER BY id",
        )
        .fetch_all(&mut *self.0)
        .await
        .map_err(db)?;
        Ok(rows
            .into_iter()
            .map(|(id, event, from, to, rows, detail, at)| {
                IntegrityEvent::new(id, event, from, to, rows, detail, at)
            })
            .collect())
    }

    async fn insert_log_event(&mut self, event: &LogEvent<'_>, now: i64) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO durable_integrity_log (event, from_key, to_key, rows, detail, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(event.event)
        .bind(event.from)
        .bind(event.to)
        .bind(event.rows)
        .bind(event.detail)
        .bind(now)
        .execute(&mut *self.0)
        .await
        .map_err(db)?;
        Ok(())
    }
}

/// A row of `durable_integrity_log`: id, event, from key, to key, rows, detail, time.
type LogRow = (i64, String, Option<String>, String, i64, String, i64);

/// The advisory lock every connector takes, in the transaction that migrates the schema
/// and sets the keys up, so concurrent connectors do this once and each sees the other's
/// result.
pub(crate) const SETUP_LOCK: &str =
    "SELECT pg_advisory_xact_lock(hashtextextended('durable setup_keys', 0))";

/// Loads (or creates) the store's own key and makes sure every row is sealed with the
/// signing key ([`setup::setup_keys`]). Runs in the connector's setup transaction (the
/// one that migrated the schema, holding [`SETUP_LOCK`]), so `seals_migrated_now` (the
/// sealing migration ran in this transaction) is the witness that the rows genuinely
/// predate seals, and no crash can come between the migration and the sealing.
pub(crate) async fn setup_keys_in(
    conn: &mut PgConnection,
    ring: Keyring,
    seals_migrated_now: bool,
) -> Result<Keyring, StoreError> {
    setup::setup_keys(&mut Tables(conn), ring, seals_migrated_now).await
}

/// Counts the issued rows of every session whose head was written before schema 4 (its
/// `issued_rows` is `NULL`) and re-seals that head with the count, in the open's
/// transaction, under its lock. Each such session is checked first: its head as it was
/// sealed ([`Head::legacy_fields`](durable_core::integrity::Head::legacy_fields)), its
/// journal's completeness and every journal row's seal, so a status changed behind the
/// store's back before the upgrade is never counted. A session that fails its checks
/// keeps its old head, and every read or write of it fails with
/// [`StoreError::Tampered`] (the head has no count); the other sessions are upgraded.
/// Runs once per database (the old heads are listed in `durable_uncounted_heads`, schema
/// 10): every head the store writes afterwards carries its count. (A store whose key changes at this open is
/// counted by [`reseal_session`] instead.)
async fn upgrade_heads(conn: &mut PgConnection, ring: &Keyring) -> Result<(), StoreError> {
    // Heads counted since they were listed (by a re-sealing at an open that changed the
    // key) leave the list here.
    let sessions: Vec<String> = sqlx::query_scalar(
        "WITH counted AS (DELETE FROM durable_uncounted_heads u USING durable_sessions s \
           WHERE s.id = u.session_id AND s.issued_rows IS NOT NULL) \
         SELECT s.id FROM durable_uncounted_heads u \
         JOIN durable_sessions s ON s.id = u.session_id WHERE s.issued_rows IS NULL \
         ORDER BY s.created_at, s.id FOR UPDATE OF s",
    )
    .fetch_all(&mut *conn)
    .await
    .map_err(db)?;
    if sessions.is_empty() {
        return Ok(());
    }
    let mut upgraded = 0usize;
    for id in &sessions {
        let session = SessionId::new(id.clone());
        // A savepoint per session: a refused one leaves nothing half-written.
        sqlx::query("SAVEPOINT upgrade_head")
            .execute(&mut *conn)
            .await
            .map_err(db)?;
        match upgrade_head(&mut *conn, ring, &session).await {
            Ok(()) => {
                sqlx::query("DELETE FROM durable_uncounted_heads WHERE session_id = $1")
                    .bind(id)
                    .execute(&mut *conn)
                    .await
                    .map_err(db)?;
                upgraded += 1;
            }
            Err(e @ (StoreError::Tampered { .. } | StoreError::Corrupt { .. })) => {
                sqlx::query("ROLLBACK TO SAVEPOINT upgrade_head")
                    .execute(&mut *conn)
                    .await
                    .map_err(db)?;
                tracing::error!(%session, error = %e, "session head not upgraded: it failed its checks; reads of it will fail as tampered");
            }
            Err(e) => return Err(e),
        }
    }
    tracing::info!(
        upgraded,
        refused = sessions.len() - upgraded,
        "counted the issued journal rows of the session heads written before schema 4"
    );
    Ok(())
}

/// [`upgrade_heads`] for one session.
async fn upgrade_head(
    conn: &mut PgConnection,
    ring: &Keyring,
    session: &SessionId,
) -> Result<(), StoreError> {
    let row = sqlx::query(concat!(
        "SELECT ",
        head_cols!(),
        " FROM durable_sessions s WHERE s.id = $1"
    ))
    .bind(session.as_str())
    .fetch_one(&mut *conn)
    .await
    .map_err(db)?;
    let mut head = head_from_row(&row, session)?;
    head.check_any_format(ring)?;
    check_journal_complete(&mut *conn, &head).await?;
    let found = sqlx::query(concat!(
        "SELECT ",
        raw_call_cols!(),
        " FROM durable_tool_calls WHERE session_id = $1 ORDER BY seq"
    ))
    .bind(session.as_str())
    .fetch_all(&mut *conn)
    .await
    .map_err(db)?;
    let calls = found.iter().map(raw_call).collect::<Result<Vec<_>, _>>()?;
    count_issued(ring, &mut head, &calls)?;
    head.store(&mut *conn, ring).await
}

/// Appends an operator's event (a rollback acknowledged) to the sealed integrity log,
/// checking the log as it stands and re-sealing it under `ring`.
pub(crate) async fn append_log(
    conn: &mut PgConnection,
    ring: &Keyring,
    event: &str,
    to: &str,
    rows: i64,
    detail: &str,
    now: i64,
) -> Result<(), StoreError> {
    let event = LogEvent {
        event,
        from: None,
        to,
        rows,
        detail,
    };
    setup::append_log(&mut Tables(conn), ring, &event, now).await
}

/// The integrity log with the check of its seal under `ring`.
pub(crate) async fn read_log(
    conn: &mut PgConnection,
    ring: &Keyring,
) -> Result<IntegrityLog, StoreError> {
    setup::read_log(&mut Tables(conn), ring).await
}
