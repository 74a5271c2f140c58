//! The outside world the fleet's tools act on: tables written by the tool bodies, each
//! statement in a transaction of its own (never the journal's).
//!
//! - `ledger_emails`: one row per email sent by the `unsafe_on_replay` tool, keyed by a
//!   random receipt. Nothing stops a second email for the same `effect_key`: a duplicate
//!   would show.
//! - `ledger_charge_attempts` and `ledger_charges`: the receiver of the
//!   `idempotent_with_key` tool logs every attempt, then applies the charge at most once
//!   per key (`UNIQUE` key, `ON CONFLICT DO NOTHING`) and answers with the charge id of
//!   the first application.
//! - `ledger_queue`: ids of sessions not yet started.
//!
//! On PostgreSQL the tables live in the store's own database; on SQLite in a file of
//! their own next to the store (one writer lock per file).

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{AssertSqlSafe, Row, SqlitePool};
use std::time::Duration;

/// A bound value.
#[derive(Debug, Clone, Copy)]
pub enum Arg<'a> {
    /// Text.
    S(&'a str),
    /// Integer.
    I(i64),
}

/// A connection pool to the ledger's database.
#[derive(Debug, Clone)]
pub enum Ledger {
    /// A SQLite file.
    Sqlite(SqlitePool),
    /// A PostgreSQL database.
    #[cfg(feature = "_postgres-testing")]
    Postgres(sqlx::PgPool),
}

const TABLES: [&str; 4] = [
    "CREATE TABLE IF NOT EXISTS ledger_emails (
        receipt TEXT PRIMARY KEY, effect_key TEXT NOT NULL, call_id TEXT NOT NULL,
        attempt BIGINT NOT NULL, owner TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS ledger_charge_attempts (
        id TEXT PRIMARY KEY, charge_key TEXT NOT NULL, attempt BIGINT NOT NULL,
        owner TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS ledger_charges (
        charge_key TEXT PRIMARY KEY, charge_id TEXT NOT NULL, owner TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS ledger_queue (id TEXT PRIMARY KEY)",
];

impl Ledger {
    /// Asserts that `effects` emails and `effects` charges were made, no email twice;
    /// returns the two counts (what the pool cases check after their run).
    pub async fn assert_effects_once(&self, effects: i64) -> (i64, i64) {
        let duplicates = self
            .scalar(
                "SELECT count(*) FROM (SELECT effect_key FROM ledger_emails GROUP BY effect_key \
                 HAVING count(*) > 1) AS d",
                &[],
            )
            .await
            .expect("duplicates");
        let emails = self
            .scalar("SELECT count(*) FROM ledger_emails", &[])
            .await
            .expect("emails");
        let charges = self
            .scalar("SELECT count(*) FROM ledger_charges", &[])
            .await
            .expect("charges");
        assert_eq!(duplicates, 0, "an email was sent twice");
        assert_eq!((emails, charges), (effects, effects));
        (emails, charges)
    }

    /// Connects to `sqlite:<path>` or `postgres://…`.
    pub async fn open(url: &str) -> Result<Self, sqlx::Error> {
        if let Some(path) = url.strip_prefix("sqlite:") {
            let options = SqliteConnectOptions::new()
                .filename(path)
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                .synchronous(SqliteSynchronous::Full)
                .busy_timeout(Duration::from_secs(20));
            let pool = SqlitePoolOptions::new()
                .max_connections(2)
                .connect_with(options)
                .await?;
            return Ok(Ledger::Sqlite(pool));
        }
        #[cfg(feature = "_postgres-testing")]
        if url.starts_with("postgres") {
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(4)
                .acquire_timeout(Duration::from_secs(5))
                .connect(url)
                .await?;
            return Ok(Ledger::Postgres(pool));
        }
        Err(sqlx::Error::Configuration(
            format!("ledger URL `{url}`: expected sqlite:<path> or postgres://…").into(),
        ))
    }

    /// Creates the tables (idempotent).
    pub async fn create_tables(&self) -> Result<(), sqlx::Error> {
        for ddl in TABLES {
            self.execute(ddl, &[]).await?;
        }
        Ok(())
    }

    /// Runs a statement written with `$n` placeholders; returns the rows affected.
    pub async fn execute(&self, sql: &str, args: &[Arg<'_>]) -> Result<u64, sqlx::Error> {
        match self {
            Ledger::Sqlite(pool) => {
                let sql = sqlite_placeholders(sql);
                let mut q = sqlx::query(AssertSqlSafe(sql));
                for a in args {
                    q = match *a {
                        Arg::S(s) => q.bind(s.to_owned()),
                        Arg::I(i) => q.bind(i),
                    };
                }
                Ok(q.execute(pool).await?.rows_affected())
            }
            #[cfg(feature = "_postgres-testing")]
            Ledger::Postgres(pool) => {
                let mut q = sqlx::query(AssertSqlSafe(sql.to_owned()));
                for a in args {
                    q = match *a {
                        Arg::S(s) => q.bind(s.to_owned()),
                        Arg::I(i) => q.bind(i),
                    };
                }
                Ok(q.execute(pool).await?.rows_affected())
            }
        }
    }

    /// Rows of text columns (`NULL` read as empty).
    pub async fn rows(&self, sql: &str, args: &[Arg<'_>]) -> Result<Vec<Vec<String>>, sqlx::Error> {
        macro_rules! fetch {
            ($pool:expr, $sql:expr) => {{
                let mut q = sqlx::query(AssertSqlSafe($sql));
                for a in args {
                    q = match *a {
                        Arg::S(s) => q.bind(s.to_owned()),
                        Arg::I(i) => q.bind(i),
                    };
                }
                q.fetch_all($pool)
                    .await?
                    .iter()
                    .map(|row| {
                        (0..row.len())
                            .map(|i| {
                                row.try_get::<Option<String>, _>(i)
                                    .map(Option::unwrap_or_default)
                            })
                            .collect::<Result<Vec<_>, _>>()
                    })
                    .collect()
            }};
        }
        match self {
            Ledger::Sqlite(pool) => fetch!(pool, sqlite_placeholders(sql)),
            #[cfg(feature = "_postgres-testing")]
            Ledger::Postgres(pool) => fetch!(pool, sql.to_owned()),
        }
    }

    /// One integer (e.g. a count; cast it to `BIGINT` in the SQL).
    pub async fn scalar(&self, sql: &str, args: &[Arg<'_>]) -> Result<i64, sqlx::Error> {
        let text = self
            .rows(&format!("SELECT CAST(({sql}) AS TEXT)"), args)
            .await?;
        let value = text
            .first()
            .and_then(|r| r.first())
            .ok_or_else(|| sqlx::Error::RowNotFound)?;
        value
            .parse()
            .map_err(|e| sqlx::Error::Decode(format!("`{value}` is not an integer: {e}").into()))
    }

    /// The receiver of the keyed tool: logs the attempt, applies the charge once per key,
    /// and answers with the charge id of the first application.
    pub async fn charge(
        &self,
        key: &str,
        attempt: i64,
        owner: &str,
    ) -> Result<String, sqlx::Error> {
        let id = uuid();
        self.execute(
            "INSERT INTO ledger_charge_attempts (id, charge_key, attempt, owner) VALUES ($1, $2, $3, $4)",
            &[Arg::S(&id), Arg::S(key), Arg::I(attempt), Arg::S(owner)],
        )
        .await?;
        self.execute(
            "INSERT INTO ledger_charges (charge_key, charge_id, owner) VALUES ($1, $2, $3)
             ON CONFLICT (charge_key) DO NOTHING",
            &[Arg::S(key), Arg::S(&format!("ch_{id}")), Arg::S(owner)],
        )
        .await?;
        let rows = self
            .rows(
                "SELECT charge_id FROM ledger_charges WHERE charge_key = $1",
                &[Arg::S(key)],
            )
            .await?;
        rows.into_iter()
            .next()
            .and_then(|r| r.into_iter().next())
            .ok_or(sqlx::Error::RowNotFound)
    }

    /// The unsafe effect: one more email row, whatever was sent before.
    pub async fn send_email(
        &self,
        effect_key: &str,
        call_id: &str,
        attempt: i64,
        owner: &str,
    ) -> Result<String, sqlx::Error> {
        let receipt = format!("msg_{}", uuid());
        self.execute(
            "INSERT INTO ledger_emails (receipt, effect_key, call_id, attempt, owner)
             VALUES ($1, $2, $3, $4, $5)",
            &[
                Arg::S(&receipt),
                Arg::S(effect_key),
                Arg::S(call_id),
                Arg::I(attempt),
                Arg::S(owner),
            ],
        )
        .await?;
        Ok(receipt)
    }

    /// The verify hook's question: did the email of this call go out? (its receipt)
    pub async fn email_of_call(&self, call_id: &str) -> Result<Option<String>, sqlx::Error> {
        let rows = self
            .rows(
                "SELECT receipt FROM ledger_emails WHERE call_id = $1",
                &[Arg::S(call_id)],
            )
            .await?;
        Ok(rows.into_iter().next().and_then(|r| r.into_iter().next()))
    }

    /// A session id not yet started, if any (random among those left, so that workers
    /// rarely pick the same one).
    pub async fn queued(&self) -> Result<Option<String>, sqlx::Error> {
        let rows = self
            .rows("SELECT id FROM ledger_queue ORDER BY random() LIMIT 1", &[])
            .await?;
        Ok(rows.into_iter().next().and_then(|r| r.into_iter().next()))
    }

    /// Removes a session id from the queue (it was started, by us or someone else).
    pub async fn dequeue(&self, id: &str) -> Result<(), sqlx::Error> {
        self.execute("DELETE FROM ledger_queue WHERE id = $1", &[Arg::S(id)])
            .await
            .map(drop)
    }
}

/// `$n` → `?n` (SQLite binds `?NNN` by index).
fn sqlite_placeholders(sql: &str) -> String {
    sql.replace('$', "?")
}

/// A random id (a UUID v4).
pub fn uuid() -> String {
    durable::CallId::random().to_string()
}

/// A random number in `0..n` (from a UUID v4's random bits: the tests need no `rand`).
pub fn random_below(n: u64) -> u64 {
    let hex: String = uuid()
        .chars()
        .filter(char::is_ascii_hexdigit)
        .take(12)
        .collect();
    u64::from_str_radix(&hex, 16).unwrap_or(0) % n.max(1)
}
