//! The store's keys: loading (or creating) its own key at open, sealing a database that
//! was never sealed, re-sealing one under a new key, and re-sealing a session whose rows
//! were copied (a fork). Every re-sealing is audited in `durable_integrity_log`,
//! which is sealed as a whole (its seal in `durable_meta`).

use async_trait::async_trait;
use durable_core::integrity::rows::{
    CheckpointRow, HeadRow, RawApproval, RawCall, RawMessage, RawResolution,
};
use durable_core::integrity::setup::{self, KeyTables, LogEvent};
use durable_core::integrity::walk::{self, SessionTables};
use durable_core::integrity::{IntegrityEvent, IntegrityLog, Keyring};
use durable_core::{SessionId, StoreError};
use sqlx::SqliteConnection;

use crate::error::db;
use crate::rows;
use crate::seal::{
    StoreHead, check_journal_complete, head_cols, head_from_row, raw_call, raw_call_cols,
    raw_resolution, store_mac,
};
use crate::tx;

/// Re-seals every row of one session under `to`, after checking it under `from` (`None`:
/// the rows were never sealed; they are sealed as they are), with the walk written in
/// `durable_core` ([`walk::reseal_session`]). Returns the rows sealed.
pub(crate) async fn reseal_session(
    conn: &mut SqliteConnection,
    from: Option<&Keyring>,
    to: &Keyring,
    session: &SessionId,
) -> Result<i64, StoreError> {
    walk::reseal_session(&mut Rows(conn), from, to, session).await
}

/// One session's sealed rows as the walks written in `durable_core` read and write them
/// ([`SessionTables`]), on the caller's connection (in its transaction).
struct Rows<'c>(&'c mut SqliteConnection);

impl Rows<'_> {
    /// `sql` (`SET seal = ? WHERE id = ?`) for each `(row id, seal)`.
    async fn write_by_id(
        &mut self,
        sql: &'static str,
        seals: &[(i64, String)],
    ) -> Result<(), StoreError> {
        for (rowid, seal) in seals {
            sqlx::query(sql)
                .bind(seal)
                .bind(rowid)
                .execute(&mut *self.0)
                .await
                .map_err(db)?;
        }
        Ok(())
    }

    /// `sql` (`SET seal = ? WHERE session = ? AND key = ?`) for each `(key, seal)` of
    /// `session`'s rows.
    async fn write_by_key(
        &mut self,
        sql: &'static str,
        session: &SessionId,
        seals: &[(i64, String)],
    ) -> Result<(), StoreError> {
        for (key, seal) in seals {
            sqlx::query(sql)
                .bind(seal)
                .bind(session.as_str())
                .bind(key)
                .execute(&mut *self.0)
                .await
                .map_err(db)?;
        }
        Ok(())
    }
}

#[async_trait]
impl SessionTables for Rows<'_> {
    async fn head(&mut self, session: &SessionId) -> Result<HeadRow, StoreError> {
        let row = sqlx::query(concat!(
            "SELECT ",
            head_cols!(),
            " FROM durable_sessions s WHERE s.id = ?"
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
            " FROM durable_tool_calls c WHERE c.session_id = ? ORDER BY c.seq"
        ))
        .bind(session.as_str())
        .fetch_all(&mut *self.0)
        .await
        .map_err(db)?;
        found.iter().map(raw_call).collect()
    }

    async fn messages(&mut self, session: &SessionId) -> Result<Vec<RawMessage>, StoreError> {
        let found = sqlx::query(
            "SELECT seq, message, seal FROM durable_transcript WHERE session_num = \
             (SELECT num FROM durable_sessions WHERE id = ?) ORDER BY seq",
        )
        .bind(session.as_str())
        .fetch_all(&mut *self.0)
        .await
        .map_err(db)?;
        found
            .iter()
            .map(|row| {
                Ok(RawMessage {
                    seq: rows::col(row, "seq", session, None)?,
                    text: rows::col(row, "message", session, None)?,
                    seal: rows::col(row, "seal", session, None)?,
                })
            })
            .collect()
    }

    async fn checkpoints(&mut self, session: &SessionId) -> Result<Vec<CheckpointRow>, StoreError> {
        let found = sqlx::query(
            "SELECT version, last_seq, message_count, plan, budget, state, app_version, seal \
             FROM durable_checkpoints WHERE session_num = \
             (SELECT num FROM durable_sessions WHERE id = ?) ORDER BY version",
        )
        .bind(session.as_str())
        .fetch_all(&mut *self.0)
        .await
        .map_err(db)?;
        let mut out = Vec::with_capacity(found.len());
        for row in &found {
            let version: i64 = rows::col(row, "version", session, None)?;
            let v = Some(version);
            // Snapshots stored as references to an earlier version are sealed as the
            // text they name (and stay references).
            let mut texts = [String::new(), String::new(), String::new()];
            for (text, column) in texts.iter_mut().zip(["plan", "budget", "state"]) {
                let stored = rows::col::<String>(row, column, session, v)?;
                *text = rows::resolve_snapshot(&mut *self.0, session, stored, column).await?;
            }
            let [plan, budget, state] = texts;
            out.push(CheckpointRow {
                version,
                last_seq: rows::col(row, "last_seq", session, v)?,
                message_count: rows::col(row, "message_count", session, v)?,
                plan,
                budget,
                state,
                app_version: rows::col(row, "app_version", session, v)?,
                seal: rows::col(row, "seal", session, v)?,
            });
        }
        Ok(out)
    }

    async fn resolutions(
        &mut self,
        session: &SessionId,
    ) -> Result<Vec<(i64, RawResolution)>, StoreError> {
        let found = sqlx::query(
            "SELECT id, call_id, position, decision, result, resolved_by, note, seal \
             FROM durable_resolutions WHERE session_id = ? ORDER BY id",
        )
        .bind(session.as_str())
        .fetch_all(&mut *self.0)
        .await
        .map_err(db)?;
        found
            .iter()
            .map(|row| {
                Ok((
                    rows::col(row, "id", session, None)?,
                    raw_resolution(row, session)?,
                ))
            })
            .collect()
    }

    async fn approvals(
        &mut self,
        session: &SessionId,
    ) -> Result<Vec<(i64, RawApproval)>, StoreError> {
        let found = sqlx::query(
            "SELECT id, call_id, position, event, actor, note, args_before, args_after, seal \
             FROM durable_approvals WHERE session_id = ? ORDER BY position",
        )
        .bind(session.as_str())
        .fetch_all(&mut *self.0)
        .await
        .map_err(db)?;
        found
            .iter()
            .map(|row| {
                Ok((
                    rows::col(row, "id", session, None)?,
                    crate::approval::raw_approval(row, session)?,
                ))
            })
            .collect()
    }

    async fn write_call_seals(&mut self, calls: &[RawCall]) -> Result<(), StoreError> {
        for raw in calls {
            store_mac(raw, &mut *self.0).await?;
        }
        Ok(())
    }

    async fn write_message_seals(
        &mut self,
        session: &SessionId,
        seals: &[(i64, String)],
    ) -> Result<(), StoreError> {
        self.write_by_key(
            "UPDATE durable_messages SET seal = ? WHERE session_num = \
             (SELECT num FROM durable_sessions WHERE id = ?) AND seq = ?",
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
            "UPDATE durable_checkpoints SET seal = ? WHERE session_num = \
             (SELECT num FROM durable_sessions WHERE id = ?) AND version = ?",
            session,
            seals,
        )
        .await
    }

    async fn write_resolution_seals(&mut self, seals: &[(i64, String)]) -> Result<(), StoreError> {
        self.write_by_id(
            "UPDATE durable_resolutions SET seal = ? WHERE id = ?",
            seals,
        )
        .await
    }

    async fn write_approval_seals(&mut self, seals: &[(i64, String)]) -> Result<(), StoreError> {
        self.write_by_id("UPDATE durable_approvals SET seal = ? WHERE id = ?", seals)
            .await
    }

    async fn store_head(&mut self, head: &mut HeadRow, ring: &Keyring) -> Result<(), StoreError> {
        head.store(&mut *self.0, ring).await
    }

    async fn uncounted_heads(&mut self) -> Result<Vec<SessionId>, StoreError> {
        // A partial index finds the old heads.
        let ids: Vec<String> = sqlx::query_scalar(
            "SELECT id FROM durable_sessions WHERE issued_rows IS NULL ORDER BY num",
        )
        .fetch_all(&mut *self.0)
        .await
        .map_err(db)?;
        Ok(ids.into_iter().map(SessionId::new).collect())
    }
}

/// The store's tables, as the key setup written in `durable_core` reads and writes them
/// ([`KeyTables`]), on the open's connection.
struct Tables<'c>(&'c mut SqliteConnection);

#[async_trait]
impl KeyTables for Tables<'_> {
    async fn meta(&mut self, name: &str) -> Result<Option<String>, StoreError> {
        sqlx::query_scalar("SELECT value FROM durable_meta WHERE name = ?")
            .bind(name)
            .fetch_optional(&mut *self.0)
            .await
            .map_err(db)
    }

    async fn set_meta(&mut self, name: &str, value: &str) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO durable_meta (name, value) VALUES (?, ?) \
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
        let sessions: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM durable_sessions")
            .fetch_one(&mut *self.0)
            .await
            .map_err(db)?;
        let head: Option<String> = sqlx::query_scalar(
            "SELECT head FROM durable_sessions WHERE head IS NOT NULL ORDER BY num LIMIT 1",
        )
        .fetch_optional(&mut *self.0)
        .await
        .map_err(db)?;
        Ok((sessions, head))
    }

    async fn session_ids(&mut self) -> Result<Vec<SessionId>, StoreError> {
        let ids: Vec<String> = sqlx::query_scalar("SELECT id FROM durable_sessions ORDER BY num")
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
             VALUES (?, ?, ?, ?, ?, ?)",
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

/// Loads (or creates) the store's own key and makes sure every row is sealed with the
/// signing key ([`setup::setup_keys`]). Runs inside the open's `BEGIN IMMEDIATE`
/// transaction (the one that migrated the schema), so concurrent openers do this once,
/// and `seals_migrated_now` (the sealing migration ran in this transaction) is the
/// witness that the rows genuinely predate seals.
pub(crate) async fn setup_keys_in(
    conn: &mut SqliteConnection,
    ring: Keyring,
    seals_migrated_now: bool,
) -> Result<Keyring, StoreError> {
    setup::setup_keys(&mut Tables(conn), ring, seals_migrated_now).await
}

/// Appends an operator's event (a rollback acknowledged) to the sealed integrity log,
/// checking the log as it stands and re-sealing it under `ring`.
pub(crate) async fn append_log(
    conn: &mut SqliteConnection,
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
    conn: &mut SqliteConnection,
    ring: &Keyring,
) -> Result<IntegrityLog, StoreError> {
    setup::read_log(&mut Tables(conn), ring).await
}
