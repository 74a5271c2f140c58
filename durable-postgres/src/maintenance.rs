//! The database's own consistency check: `amcheck` over the store's indexes.

use durable_core::StoreError;

use crate::PostgresStore;
use crate::error::db;

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
    /// Runs `amcheck`'s `bt_index_check` with `heapallindexed` on every index of the
    /// store's tables: an index that misses a row, or a corrupt page, is reported.
    ///
    /// It needs the `amcheck` extension in the store's database (`CREATE EXTENSION
    /// amcheck`, shipped with PostgreSQL) and a role allowed to execute it (superusers,
    /// or a role granted `EXECUTE` on `bt_index_check`); without either the answer is
    /// [`IndexCheck::Unavailable`] saying which, not an error. It takes only
    /// `AccessShareLock`s: writers carry on. It checks the database's structure, not the
    /// seals: see [`durable_core::integrity::verify_sessions`] for those.
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
