//! The store's keys: loading (or creating) its own key at connect, sealing a database
//! that was never sealed, re-sealing one under a new key, and re-sealing a session whose
//! rows were copied (a fork). Every re-sealing is audited in `durable_integrity_log`,
//! which is sealed as a whole (its seal in `durable_meta`).

use async_trait::async_trait;
use durable_core::integrity::rows::{
    CheckpointRow, HeadRow, RawApproval, RawCall, RawMessage, RawResolution,
};
use durable_core::integrity::setup::{self, KeyTables, LogEvent};
use durable_core::integrity::walk::{self, SessionTables};
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
/// the rows were never sealed; they are sealed as they are), with the walk written in
/// `durable_core` ([`walk::reseal_session`]). Returns the rows sealed. The caller holds
/// the session row (or created it in this transaction).
pub(crate) async fn reseal_session(
    conn: &mut PgConnection,
    from: Option<&Keyring>,
    to: &Keyring,
    session: &SessionId,
) -> Result<i64, StoreError> {
    walk::reseal_session(&mut Rows(conn), from, to, session).await
}

/// One session's sealed rows as the walks written in `durable_core` read and write them
/// ([`SessionTables`]), on the caller's connection (in its transaction). Seals are
/// written back one statement per table (`unnest` of the new seals).
struct Rows<'c>(&'c mut PgConnection);

impl Rows<'_> {
    /// `UPDATE <table> SET seal = u.seal FROM unnest(ids, seals)` for rows keyed by a
    /// bigint id.
    async fn write_by_id(
        &mut self,
        sql: &'static str,
        seals: &[(i64, String)],
    ) -> Result<(), StoreError> {
        let (ids, seals): (Vec<i64>, Vec<String>) = seals.iter().cloned().unzip();
        sqlx::query(sql)
            .bind(&ids)
            .bind(&seals)
            .execute(&mut *self.0)
            .await
            .map_err(db)?;
        Ok(())
    }

    /// The same for rows of one session keyed by a bigint (`$1` the session).
    async fn write_by_key(
        &mut self,
        sql: &'static str,
        session: &SessionId,
        seals: &[(i64, String)],
    ) -> Result<(), StoreError> {
        let (keys, seals): (Vec<i64>, Vec<String>) = seals.iter().cloned().unzip();
        sqlx::query(sql)
            .bind(session.as_str())
            .bind(&keys)
            .bind(&seals)
            .execute(&mut *self.0)
            .await
            .map_err(db)?;
        Ok(())
    }
}

#[async_trait]
impl SessionTables for Rows<'_> {
    async fn head(&mut self, session: &SessionId) -> Result<HeadRow, StoreError> {
        let row = sqlx::query(concat!(
            "SELECT ",
            head_cols!(),
            " FROM durable_sessions s WHERE s.id = $1"
        ))
        .bind(session.as_str())
        .fetch_one(&mut *self.0)
        .await
        .map_err(db)?;
        head_from_row(&row, session)
    }

    async fn check_journal_complete(&mut self, head: &HeadRow) -> Result<(), StoreError> {
        check_journal_complete(&mut *self.0, head).await
    }

    async fn calls(&mut self, session: &SessionId) -> Result<Vec<RawCall>, StoreError> {
        let found = sqlx::query(concat!(
            "SELECT ",
            raw_call_cols!(),
            " FROM durable_tool_calls WHERE session_id = $1 ORDER BY seq"
        ))
        .bind(session.as_str())
        .fetch_all(&mut *self.0)
        .await
        .map_err(db)?;
        found.iter().map(raw_call).collect()
    }

    async fn messages(&mut self, session: &SessionId) -> Result<Vec<RawMessage>, StoreError> {
        let found = sqlx::query(
            "SELECT seq, message, seal FROM durable_transcript \
             WHERE session_num = (SELECT num FROM durable_sessions WHERE id = $1) ORDER BY seq",
        )
        .bind(session.as_str())
        .fetch_all(&mut *self.0)
        .await
        .map_err(db)?;
        found
            .iter()
            .map(|row| {
                Ok(RawMessage {
                    seq: get(row, "seq")?,
                    text: get(row, "message")?,
                    seal: get(row, "seal")?,
                })
            })
            .collect()
    }

    async fn checkpoints(&mut self, session: &SessionId) -> Result<Vec<CheckpointRow>, StoreError> {
        // Snapshots stored as references to an earlier version are sealed as the text
        // they name (and stay references).
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
        .fetch_all(&mut *self.0)
        .await
        .map_err(db)?;
        found
            .iter()
            .map(|row| {
                let version: i64 = get(row, "version")?;
                Ok(CheckpointRow {
                    version,
                    last_seq: get(row, "last_seq")?,
                    plan: rows::snapshot_text(session, version, "the plan", get(row, "plan")?)?,
                    budget: rows::snapshot_text(
                        session,
                        version,
                        "the budget",
                        get(row, "budget")?,
                    )?,
                    state: rows::snapshot_text(session, version, "the state", get(row, "state")?)?,
                    app_version: get(row, "app_version")?,
                    message_count: get(row, "message_count")?,
                    seal: get(row, "seal")?,
                })
            })
            .collect()
    }

    async fn resolutions(
        &mut self,
        session: &SessionId,
    ) -> Result<Vec<(i64, RawResolution)>, StoreError> {
        let found = sqlx::query(
            "SELECT id, call_id, position, decision, result, resolved_by, note, seal \
             FROM durable_resolutions WHERE session_id = $1 ORDER BY id",
        )
        .bind(session.as_str())
        .fetch_all(&mut *self.0)
        .await
        .map_err(db)?;
        found
            .iter()
            .map(|row| Ok((get::<i64>(row, "id")?, seal::raw_resolution(row)?)))
            .collect()
    }

    async fn approvals(
        &mut self,
        session: &SessionId,
    ) -> Result<Vec<(i64, RawApproval)>, StoreError> {
        let found = sqlx::query(concat!(
            "SELECT ",
            approval_cols!(),
            " FROM durable_approvals WHERE session_id = $1 ORDER BY position"
        ))
        .bind(session.as_str())
        .fetch_all(&mut *self.0)
        .await
        .map_err(db)?;
        found
            .iter()
            .map(|row| Ok((get::<i64>(row, "id")?, seal::raw_approval(row)?)))
            .collect()
    }

    async fn write_call_seals(&mut self, calls: &[RawCall]) -> Result<(), StoreError> {
        let (ids, seals): (Vec<&str>, Vec<&str>) = calls
            .iter()
            .map(|raw| (raw.id.as_str(), raw.mac.as_deref().unwrap_or_default()))
            .unzip();
        sqlx::query(
            "UPDATE durable_tool_calls c SET mac = u.seal \
             FROM unnest($1::text[], $2::text[]) AS u(id, seal) WHERE c.id = u.id",
        )
        .bind(&ids)
        .bind(&seals)
        .execute(&mut *self.0)
        .await
        .map_err(db)?;
        Ok(())
    }

    async fn write_message_seals(
        &mut self,
        session: &SessionId,
        seals: &[(i64, String)],
    ) -> Result<(), StoreError> {
        self.write_by_key(
            "UPDATE durable_messages m SET seal = u.seal \
             FROM unnest($2::bigint[], $3::text[]) AS u(seq, seal) \
             WHERE m.session_num = (SELECT num FROM durable_sessions WHERE id = $1) \
               AND m.seq = u.seq",
            session,
            seals,
        )
        .await
    }

    async fn write_checkpoint_seals(
        &mut self,
        session: &SessionId,
        seals: &[(i64, String)],
    ) -> Result<(), StoreError> {
        self.write_by_key(
            "UPDATE durable_checkpoints k SET seal = u.seal \
             FROM unnest($2::bigint[], $3::text[]) AS u(version, seal) \
             WHERE k.session_num = (SELECT num FROM durable_sessions WHERE id = $1) \
               AND k.version = u.version",
            session,
            seals,
        )
        .await
    }

    async fn write_resolution_seals(&mut self, seals: &[(i64, String)]) -> Result<(), StoreError> {
        self.write_by_id(
            "UPDATE durable_resolutions r SET seal = u.seal \
             FROM unnest($1::bigint[], $2::text[]) AS u(id, seal) WHERE r.id = u.id",
            seals,
        )
        .await
    }

    async fn write_approval_seals(&mut self, seals: &[(i64, String)]) -> Result<(), StoreError> {
        self.write_by_id(
            "UPDATE durable_approvals a SET seal = u.seal \
             FROM unnest($1::bigint[], $2::text[]) AS u(id, seal) WHERE a.id = u.id",
            seals,
        )
        .await
    }

    async fn store_head(&mut self, head: &mut HeadRow, ring: &Keyring) -> Result<(), StoreError> {
        head.store(&mut *self.0, ring).await
    }

    async fn uncounted_heads(&mut self) -> Result<Vec<SessionId>, StoreError> {
        // The old heads are listed in `durable_uncounted_heads` (schema 10); heads counted
        // since they were listed (by a re-sealing at an open that changed the key) leave
        // the list here.
        let ids: Vec<String> = sqlx::query_scalar(
            "WITH counted AS (DELETE FROM durable_uncounted_heads u USING durable_sessions s \
               WHERE s.id = u.session_id AND s.issued_rows IS NOT NULL) \
             SELECT s.id FROM durable_uncounted_heads u \
             JOIN durable_sessions s ON s.id = u.session_id WHERE s.issued_rows IS NULL \
             ORDER BY s.created_at, s.id FOR UPDATE OF s",
        )
        .fetch_all(&mut *self.0)
        .await
        .map_err(db)?;
        Ok(ids.into_iter().map(SessionId::new).collect())
    }

    async fn begin_upgrade(&mut self) -> Result<(), StoreError> {
        // A savepoint per session: a refused one leaves nothing half-written.
        sqlx::query("SAVEPOINT upgrade_head")
            .execute(&mut *self.0)
            .await
            .map_err(db)?;
        Ok(())
    }

    async fn abandon_upgrade(&mut self) -> Result<(), StoreError> {
        sqlx::query("ROLLBACK TO SAVEPOINT upgrade_head")
            .execute(&mut *self.0)
            .await
            .map_err(db)?;
        Ok(())
    }

    async fn upgraded(&mut self, session: &SessionId) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM durable_uncounted_heads WHERE session_id = $1")
            .bind(session.as_str())
            .execute(&mut *self.0)
            .await
            .map_err(db)?;
        Ok(())
    }
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
        // Once per database: every head the store writes afterwards carries its count.
        walk::upgrade_heads(&mut Rows(&mut *self.0), ring).await
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
