//! Maintenance: the error history, app-version migration, purging, the durability and
//! clock reads, and the database's own consistency check: `amcheck` over the store's
//! indexes.

use std::time::Duration;

use async_trait::async_trait;
use durable_core::StoreError;
use durable_core::ids::SessionId;
use durable_core::integrity::Keyring;
use durable_core::store::MaintenanceStore;
use durable_core::store::StoreBase;
use durable_core::store::{
    Durability, ErrorRecord, FORMAT_VERSION, NewError, PurgeOutcome, RetargetSession, SessionRecord,
};

use crate::PostgresStore;
use crate::error::BACKEND;
use crate::error::{db, unique_violation};
use crate::rows::{self, get};
use crate::seal::raw_call_cols;
use crate::tx::{self, Lock, ttl_ms};

pub(crate) async fn durability(store: &PostgresStore) -> Result<Durability, StoreError> {
    let row = sqlx::query(
        "SELECT current_setting('synchronous_commit') AS synchronous_commit,
                current_setting('fsync') AS fsync",
    )
    .fetch_one(&mut *store.conn().await?)
    .await
    .map_err(db)?;
    let synchronous_commit: String = get(&row, "synchronous_commit")?;
    let fsync: String = get(&row, "fsync")?;
    let unsafe_setting = if synchronous_commit.eq_ignore_ascii_case("off") {
        Some(format!("synchronous_commit = {synchronous_commit}"))
    } else if fsync.eq_ignore_ascii_case("off") {
        Some(format!("fsync = {fsync}"))
    } else {
        None
    };
    Ok(Durability { unsafe_setting })
}

pub(crate) async fn now(store: &PostgresStore) -> Result<i64, StoreError> {
    let mut conn = store.conn().await?;
    tx::now(&mut conn).await
}

pub(crate) async fn record_error(store: &PostgresStore, error: NewError) -> Result<(), StoreError> {
    error.validate()?;
    let inserted = sqlx::query(concat!(
        "INSERT INTO durable_errors (session_id, step, context, attempt, message, created_at) \
         SELECT id, $2, $3, $4, $5, ",
        tx::now_ms!(),
        " FROM durable_sessions WHERE id = $1"
    ))
    .bind(error.session.as_str())
    .bind(error.step)
    .bind(&error.context)
    .bind(error.attempt)
    .bind(&error.message)
    .execute(&mut *store.conn().await?)
    .await
    .map_err(db)?;
    if inserted.rows_affected() == 0 {
        return Err(StoreError::SessionNotFound(error.session));
    }
    Ok(())
}

pub(crate) async fn errors(
    store: &PostgresStore,
    session: &SessionId,
) -> Result<Vec<ErrorRecord>, StoreError> {
    sqlx::query(
        "SELECT session_id, step, context, attempt, message, created_at
         FROM durable_errors WHERE session_id = $1 ORDER BY id",
    )
    .bind(session.as_str())
    .fetch_all(&mut *store.conn().await?)
    .await
    .map_err(db)?
    .iter()
    .map(rows::error_record)
    .collect()
}

pub(crate) async fn retarget_session(
    store: &PostgresStore,
    migrate: RetargetSession,
) -> Result<SessionRecord, StoreError> {
    migrate.validate()?;
    let mut tx = tx::begin(&store.pool).await?;
    let current = tx::session(&mut tx, &migrate.session, Some(Lock::Update)).await?;
    if current.app_version != migrate.from_version {
        return Err(StoreError::AppVersionMismatch {
            session: migrate.session,
            expected: migrate.from_version,
            actual: current.app_version,
        });
    }
    let now = tx::now(&mut tx).await?;
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
    // Each renamed row is checked under its old name and re-sealed under the new one.
    let ring = store.keyring();
    let found = sqlx::query(concat!(
        "SELECT ",
        raw_call_cols!(),
        " FROM durable_tool_calls WHERE session_id = $1 AND tool_name = ANY($2::text[]) \
         ORDER BY seq FOR UPDATE"
    ))
    .bind(migrate.session.as_str())
    .bind(&old)
    .fetch_all(&mut *tx)
    .await
    .map_err(db)?;
    let mut ids = Vec::with_capacity(found.len());
    let mut tools = Vec::with_capacity(found.len());
    let mut seals = Vec::with_capacity(found.len());
    for row in &found {
        let mut raw = crate::seal::raw_call(row)?;
        raw.check(ring)?;
        let Some(i) = old.iter().position(|o| *o == raw.tool) else {
            continue;
        };
        raw.tool = new[i].to_owned();
        raw.seal(ring)?;
        tools.push(raw.tool);
        seals.push(raw.mac.unwrap_or_default());
        ids.push(raw.id);
    }
    let renamed = sqlx::query(
        "UPDATE durable_tool_calls c SET tool_name = m.tool, mac = m.seal
         FROM unnest($1::text[], $2::text[], $3::text[]) AS m(id, tool, seal)
         WHERE c.id = m.id",
    )
    .bind(&ids)
    .bind(&tools)
    .bind(&seals)
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

pub(crate) async fn purge_session(
    store: &PostgresStore,
    id: &SessionId,
    retention: Duration,
) -> Result<PurgeOutcome, StoreError> {
    let mut tx = tx::begin(&store.pool).await?;
    let session = tx::session(&mut tx, id, Some(Lock::Update)).await?;
    if !session.status.is_terminal() {
        return Ok(PurgeOutcome::NotTerminal);
    }
    let now = tx::now(&mut tx).await?;
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
        // The audit logs first: their rows name journal rows.
        "DELETE FROM durable_approvals WHERE session_id = $1",
        "DELETE FROM durable_resolutions WHERE session_id = $1",
        "DELETE FROM durable_migrations WHERE session_id = $1",
        "DELETE FROM durable_limit_raises WHERE session_id = $1",
        "DELETE FROM durable_signals WHERE session_id = $1",
        "DELETE FROM durable_errors WHERE session_id = $1",
        "DELETE FROM durable_tool_calls WHERE session_id = $1",
        "DELETE FROM durable_checkpoints \
         WHERE session_num = (SELECT num FROM durable_sessions WHERE id = $1)",
        "DELETE FROM durable_messages \
         WHERE session_num = (SELECT num FROM durable_sessions WHERE id = $1)",
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

/// What PostgreSQL's `amcheck` said about the store's B-tree indexes
/// ([`PostgresStore::index_check`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum IndexCheck {
    /// Every index of the `durable_*` tables was checked against its table
    /// (`bt_index_check(index, heapallindexed => true)`); `problems` holds one line per
    /// index that failed, empty when all are sound.
    Checked {
        /// How many indexes were checked.
        indexes: usize,
        /// `index: what amcheck reported`, for each index that failed.
        problems: Vec<String>,
    },
    /// The check could not run here; the text says why and what to do (install the
    /// extension, or run as a role allowed to execute it).
    Unavailable(String),
}

impl PostgresStore {
    /// The store's integrity log (`durable_integrity_log`: every adoption, re-keying and
    /// restored key row), with the check of the seal that covers the whole log under
    /// this store's keys. Changes nothing.
    pub async fn integrity_log(&self) -> Result<durable_core::integrity::IntegrityLog, StoreError> {
        let mut tx = self.pool().begin().await.map_err(db)?;
        sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        let log = crate::keys::read_log(&mut tx, self.keyring()).await?;
        tx.commit().await.map_err(db)?;
        Ok(log)
    }

    /// Runs `amcheck`'s `bt_index_check` with `heapallindexed` on every index of the
    /// store's tables: an index that misses a row, or a corrupt page, is reported.
    ///
    /// It needs the `amcheck` extension in the store's database (`CREATE EXTENSION
    /// amcheck`, shipped with PostgreSQL) and a role allowed to execute it (superusers,
    /// or a role granted `EXECUTE` on `bt_index_check`); without either the answer is
    /// [`IndexCheck::Unavailable`] saying which, not an error. It takes only
    /// `AccessShareLock`s: writers carry on. It checks the database's structure, not the
    /// seals: see [`durable_core::verify::verify_sessions`] for those.
    ///
    /// # Errors
    ///
    /// [`StoreError::Database`] when the server cannot be reached or the catalog query
    /// fails.
    pub async fn index_check(&self) -> Result<IndexCheck, StoreError> {
        let installed: Option<String> = sqlx::query_scalar(
            "SELECT n.nspname::text FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace \
             WHERE e.extname = 'amcheck'",
        )
        .fetch_optional(self.pool())
        .await
        .map_err(db)?;
        let Some(schema) = installed else {
            return Ok(IndexCheck::Unavailable(
                "the amcheck extension is not installed in this database; a superuser can add it with \
                 `CREATE EXTENSION amcheck`"
                    .into(),
            ));
        };
        let allowed: bool = sqlx::query_scalar(
            "SELECT has_function_privilege(format('%I.bt_index_check(regclass, boolean)', $1::text), 'EXECUTE')",
        )
        .bind(&schema)
        .fetch_one(self.pool())
        .await
        .map_err(db)?;
        if !allowed {
            return Ok(IndexCheck::Unavailable(format!(
                "this role may not execute {schema}.bt_index_check; run `durable verify` as a superuser, or \
                 `GRANT EXECUTE ON FUNCTION {schema}.bt_index_check(regclass, boolean) TO <role>`"
            )));
        }
        let indexes: Vec<(String, i64)> = sqlx::query_as(
            "SELECT c.relname::text, c.oid::bigint FROM pg_index i \
             JOIN pg_class c ON c.oid = i.indexrelid \
             JOIN pg_class t ON t.oid = i.indrelid \
             JOIN pg_am a ON a.oid = c.relam \
             WHERE t.relnamespace = current_schema()::text::regnamespace \
               AND t.relname LIKE 'durable\\_%' AND a.amname = 'btree' AND i.indisvalid \
             ORDER BY c.relname",
        )
        .fetch_all(self.pool())
        .await
        .map_err(db)?;
        let quoted = format!("\"{}\"", schema.replace('"', "\"\""));
        let call = format!("SELECT {quoted}.bt_index_check($1::bigint::oid::regclass, true)");
        let mut problems = Vec::new();
        for (name, oid) in &indexes {
            if let Err(e) = sqlx::query(sqlx::AssertSqlSafe(call.as_str()))
                .bind(oid)
                .execute(self.pool())
                .await
            {
                problems.push(format!("{name}: {e}"));
            }
        }
        Ok(IndexCheck::Checked {
            indexes: indexes.len(),
            problems,
        })
    }
}

#[async_trait]
impl StoreBase for PostgresStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn keyring(&self) -> &Keyring {
        PostgresStore::keyring(self)
    }

    async fn durability(&self) -> Result<Durability, StoreError> {
        durability(self).await
    }

    async fn now(&self) -> Result<i64, StoreError> {
        now(self).await
    }
}

#[async_trait]
impl MaintenanceStore for PostgresStore {
    async fn record_error(&self, error: NewError) -> Result<(), StoreError> {
        record_error(self, error).await
    }

    async fn errors(&self, session: &SessionId) -> Result<Vec<ErrorRecord>, StoreError> {
        errors(self, session).await
    }

    async fn retarget_session(
        &self,
        migrate: RetargetSession,
    ) -> Result<SessionRecord, StoreError> {
        retarget_session(self, migrate).await
    }

    async fn purge_session(
        &self,
        id: &SessionId,
        retention: Duration,
    ) -> Result<PurgeOutcome, StoreError> {
        purge_session(self, id, retention).await
    }
}
