//! The example's external world: a SQLite file of its own (separate from the durable
//! store), one row per effect, so that tests count effects outside both server and client.

use std::path::Path;
use std::str::FromStr;

use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};

/// A ledger of effects.
#[derive(Clone, Debug)]
pub struct Ledger {
    pool: SqlitePool,
}

#[allow(dead_code)] // each example binary uses part of it
impl Ledger {
    /// Opens (creating) the ledger at `path`.
    pub async fn open(path: &Path) -> Result<Self, sqlx::Error> {
        let options = SqliteConnectOptions::from_str(&format!("sqlite:{}", path.display()))?
            .create_if_missing(true)
            .busy_timeout(std::time::Duration::from_secs(10));
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(options)
            .await?;
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS effects (
                id INTEGER PRIMARY KEY AUTOINCREMENT,
                kind TEXT NOT NULL,
                key TEXT NOT NULL,
                detail TEXT NOT NULL
            )",
        )
        .execute(&pool)
        .await?;
        Ok(Ledger { pool })
    }

    /// Writes one effect row; returns its id.
    pub async fn write(&self, kind: &str, key: &str, detail: &str) -> Result<i64, sqlx::Error> {
        let row = sqlx::query("INSERT INTO effects (kind, key, detail) VALUES (?, ?, ?)")
            .bind(kind)
            .bind(key)
            .bind(detail)
            .execute(&self.pool)
            .await?;
        Ok(row.last_insert_rowid())
    }

    /// Whether a row of `kind` with `key` exists.
    pub async fn exists(&self, kind: &str, key: &str) -> Result<bool, sqlx::Error> {
        let (n,): (i64,) =
            sqlx::query_as("SELECT COUNT(*) FROM effects WHERE kind = ? AND key = ?")
                .bind(kind)
                .bind(key)
                .fetch_one(&self.pool)
                .await?;
        Ok(n > 0)
    }

    /// How many rows of `kind` there are.
    pub async fn count(&self, kind: &str) -> Result<i64, sqlx::Error> {
        let (n,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM effects WHERE kind = ?")
            .bind(kind)
            .fetch_one(&self.pool)
            .await?;
        Ok(n)
    }
}
