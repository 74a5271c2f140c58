//! The two places a test runs: a SQLite file (with the ledger in a file beside it) or a
//! fresh PostgreSQL database (ledger tables in the same database).

use std::sync::Arc;
use std::time::Duration;

use durable::CheckpointStore;
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions, Connection};

use crate::ledger::Ledger;

/// A backend for one test case.
pub enum Backend {
    /// A SQLite file in a temporary directory.
    Sqlite(tempfile::TempDir),
    /// A fresh database on the throwaway cluster (or `DATABASE_URL`).
    #[cfg(feature = "_postgres-testing")]
    Postgres(durable::postgres::testing::TestDatabase),
}

impl Backend {
    /// A fresh SQLite store location.
    pub fn sqlite() -> Backend {
        Backend::Sqlite(tempfile::tempdir().expect("tempdir"))
    }

    /// A fresh PostgreSQL database.
    #[cfg(feature = "_postgres-testing")]
    pub async fn postgres() -> Backend {
        Backend::Postgres(durable::postgres::testing::test_database().await)
    }

    /// `sqlite` or `postgres`.
    pub fn name(&self) -> &'static str {
        match self {
            Backend::Sqlite(_) => "sqlite",
            #[cfg(feature = "_postgres-testing")]
            Backend::Postgres(_) => "postgres",
        }
    }

    /// The store's URL, for `durable::connect`.
    pub fn store_url(&self) -> String {
        match self {
            Backend::Sqlite(dir) => format!("sqlite:{}", dir.path().join("agent.db").display()),
            #[cfg(feature = "_postgres-testing")]
            Backend::Postgres(db) => db.url().to_owned(),
        }
    }

    /// The ledger's URL.
    pub fn ledger_url(&self) -> String {
        match self {
            Backend::Sqlite(dir) => format!("sqlite:{}", dir.path().join("ledger.db").display()),
            #[cfg(feature = "_postgres-testing")]
            Backend::Postgres(db) => db.url().to_owned(),
        }
    }

    /// A directory for worker logs.
    pub fn log_dir(&self) -> tempfile::TempDir {
        tempfile::tempdir().expect("log dir")
    }

    /// Opens the store (creating its schema).
    pub async fn store(&self) -> Arc<dyn CheckpointStore> {
        durable::connect(&self.store_url())
            .await
            .unwrap_or_else(|e| panic!("open the {} store: {e}", self.name()))
    }

    /// Opens the ledger and creates its tables.
    pub async fn ledger(&self) -> Ledger {
        let ledger = Ledger::open(&self.ledger_url()).await.expect("open ledger");
        ledger.create_tables().await.expect("ledger tables");
        ledger
    }

    /// Whether no other process is inside a store transaction right now (so a process
    /// stopped now holds no lock that would block everyone else).
    pub async fn others_idle(
        &self,
        #[cfg_attr(not(feature = "_postgres-testing"), expect(unused_variables))] ledger: &Ledger,
    ) -> bool {
        match self {
            Backend::Sqlite(dir) => {
                let options = SqliteConnectOptions::new()
                    .filename(dir.path().join("agent.db"))
                    .busy_timeout(Duration::ZERO);
                let Ok(mut conn) = options.connect().await else {
                    return false;
                };
                let idle = sqlx::query("BEGIN IMMEDIATE")
                    .execute(&mut conn)
                    .await
                    .is_ok();
                if idle {
                    let _ = sqlx::query("ROLLBACK").execute(&mut conn).await;
                }
                let _ = conn.close().await;
                idle
            }
            #[cfg(feature = "_postgres-testing")]
            Backend::Postgres(_) => ledger
                .scalar(
                    "SELECT count(*) FROM pg_stat_activity
                     WHERE datname = current_database() AND pid <> pg_backend_pid()
                       AND backend_type = 'client backend' AND state <> 'idle'",
                    &[],
                )
                .await
                .is_ok_and(|busy| busy == 0),
        }
    }

    /// Crashes and restarts the database server (`pg_ctl restart -m immediate`).
    #[cfg(feature = "_postgres-testing")]
    pub fn restart_server(&self) {
        match self {
            Backend::Postgres(db) => db.restart_server().expect("restart the server"),
            Backend::Sqlite(_) => panic!("an embedded SQLite file has no server to restart"),
        }
    }
}
