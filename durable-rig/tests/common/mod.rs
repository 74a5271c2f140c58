//! The tools, ledger and stub scripts shared by the rig tests: a pure lookup, an
//! `unsafe_on_replay` email and a keyed charge, each writing one row per execution to a
//! ledger outside the store (a SQLite file of its own).

#![allow(dead_code, missing_docs)]

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use durable::{IdempotencyKey, ToolContext, Toolbox, durable_tool};
use durable_openai_stub::{Reply, Script};
use serde_json::{Value, json};
use sqlx::{Connection, Row, SqliteConnection};

/// Where the ledger lives: `DURABLE_RIG_LEDGER` (set by the crash test for its
/// children), else one file per test process.
pub fn ledger_path() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| match std::env::var_os("DURABLE_RIG_LEDGER") {
        Some(path) => PathBuf::from(path),
        None => {
            let dir = tempfile::tempdir().expect("temp dir").keep();
            dir.join("ledger.db")
        }
    })
    .clone()
}

async fn connect(path: &Path) -> Result<SqliteConnection, sqlx::Error> {
    let url = format!("sqlite:{}?mode=rwc", path.display());
    let mut conn = SqliteConnection::connect(&url).await?;
    sqlx::query("PRAGMA synchronous = FULL")
        .execute(&mut conn)
        .await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS effects \
         (n INTEGER PRIMARY KEY, session TEXT NOT NULL, tool TEXT NOT NULL, detail TEXT NOT NULL)",
    )
    .execute(&mut conn)
    .await?;
    Ok(conn)
}

/// Writes one effect row (committed and synced before the tool goes on).
pub async fn record(session: &str, tool: &str, detail: &str) -> Result<(), sqlx::Error> {
    let mut conn = connect(&ledger_path()).await?;
    sqlx::query("INSERT INTO effects (session, tool, detail) VALUES (?, ?, ?)")
        .bind(session)
        .bind(tool)
        .bind(detail)
        .execute(&mut conn)
        .await?;
    conn.close().await
}

/// The tools that ran for `session`, in order.
pub async fn effects(path: &Path, session: &str) -> Vec<String> {
    let mut conn = connect(path).await.expect("ledger");
    sqlx::query("SELECT tool FROM effects WHERE session = ? ORDER BY n")
        .bind(session)
        .fetch_all(&mut conn)
        .await
        .expect("ledger rows")
        .iter()
        .map(|row| row.get::<String, _>(0))
        .collect()
}

/// The details of the effects of `session` (an email's recipient, ...), in order.
pub async fn details(path: &Path, session: &str) -> Vec<String> {
    let mut conn = connect(path).await.expect("ledger");
    sqlx::query("SELECT detail FROM effects WHERE session = ? ORDER BY n")
        .bind(session)
        .fetch_all(&mut conn)
        .await
        .expect("ledger rows")
        .iter()
        .map(|row| row.get::<String, _>(0))
        .collect()
}

/// A crash point: with `DURABLE_RIG_CRASH_AT=<point>`, print `CRASH_POINT <point>` and
/// wait to be killed.
pub async fn crash_point(point: &str) {
    if std::env::var("DURABLE_RIG_CRASH_AT").as_deref() == Ok(point) {
        use std::io::Write;
        println!("CRASH_POINT {point}");
        let _ = std::io::stdout().flush();
        tokio::time::sleep(Duration::from_secs(600)).await;
    }
}

fn io(e: sqlx::Error) -> std::io::Error {
    std::io::Error::other(e.to_string())
}

/// Look up an item's price and stock by SKU.
#[durable_tool(replay = "pure")]
pub async fn lookup(
    ctx: &ToolContext,
    /// The SKU, e.g. `MUG-1`.
    sku: String,
) -> Result<Value, std::io::Error> {
    crash_point("in_lookup").await;
    record(ctx.session_id().as_str(), "lookup", &sku)
        .await
        .map_err(io)?;
    if sku == "GONE-1" {
        return Err(std::io::Error::other("no such SKU: GONE-1"));
    }
    Ok(json!({"sku": sku, "price_cents": 1200, "in_stock": true}))
}

/// Send an email to a customer.
#[durable_tool(replay = "unsafe_on_replay")]
pub async fn send_email(
    ctx: &ToolContext,
    /// Recipient address.
    to: String,
    /// Subject line.
    subject: String,
) -> Result<Value, std::io::Error> {
    record(ctx.session_id().as_str(), "send_email", &to)
        .await
        .map_err(io)?;
    crash_point("after_email").await;
    Ok(json!({"message_id": format!("msg-{subject}")}))
}

/// Charge an order; the payment provider deduplicates on the idempotency key.
#[durable_tool(
    replay = "idempotent_with_key",
    idempotency_key = |a| format!("charge:{}", a.order),
)]
pub async fn charge(
    ctx: &ToolContext,
    key: IdempotencyKey,
    /// The order id.
    order: String,
    /// Amount in cents.
    cents: u64,
) -> Result<Value, std::io::Error> {
    record(ctx.session_id().as_str(), "charge", key.as_str())
        .await
        .map_err(io)?;
    Ok(json!({"charge_id": format!("ch_{order}_{cents}")}))
}

pub fn toolbox() -> Arc<Toolbox> {
    Arc::new(
        Toolbox::new()
            .with(lookup)
            .and_then(|t| t.with(send_email))
            .and_then(|t| t.with(charge))
            .expect("toolbox"),
    )
}

pub const PROMPT: &str = "Order one MUG-1 for ada@example.com as order o-1 and confirm by email.";
pub const FINAL: &str = "Done: MUG-1 charged (ch_o-1_1200) and ada@example.com notified.";

/// Two model turns: the lookup, the email and the charge in one reply, then the answer.
pub fn script() -> Script {
    script_ending(Reply::text(FINAL))
}

/// The same turns, `last` in place of the answer.
pub fn script_ending(last: Reply) -> Script {
    Script::new([
        Reply::tool_calls([
            ("call_lookup", "lookup", r#"{"sku":"MUG-1"}"#),
            (
                "call_email",
                "send_email",
                r#"{"to":"ada@example.com","subject":"o-1"}"#,
            ),
            ("call_charge", "charge", r#"{"order":"o-1","cents":1200}"#),
        ]),
        last,
    ])
}
