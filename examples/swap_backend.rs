//! The same application code on SQLite or PostgreSQL: the store is picked at run time
//! from a URL, among the backends compiled in.
//!
//! ```text
//! cargo run --example swap_backend                                  # SQLite, a temp file
//! cargo run --example swap_backend -- --db sqlite:agent.db
//! cargo run --example swap_backend --features postgres -- --db postgres://app@127.0.0.1/app
//! DURABLE_DB=postgres://app@127.0.0.1/app cargo run --example swap_backend --features postgres
//! ```
//!
//! `run_agent` below never names a backend: it gets an `Arc<dyn CheckpointStore>` from
//! `durable::connect`. Turning PostgreSQL on is a Cargo feature
//! (`durable = { features = ["postgres"] }`); without it a `postgres://` URL is refused
//! with an error that names the feature.

use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use durable::{CheckpointStore, Durable, IdempotencyKey, Message, StartOptions, durable_tool};
use serde::{Deserialize, Serialize};

/// Run one agent session on the store a URL names.
#[derive(Debug, Parser)]
#[command(name = "swap_backend")]
struct Args {
    /// `sqlite:<path>`, a file path, `sqlite::memory:`, or `postgres://…` (with the
    /// `postgres` feature). Default: a SQLite file in a new temporary directory.
    #[arg(long, env = "DURABLE_DB", value_name = "URL")]
    db: Option<String>,
}

/// Why a tool failed.
#[derive(Debug)]
struct ToolError(String);

impl std::fmt::Display for ToolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A charge, as the payment provider answers.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Charge {
    id: String,
    cents: u64,
}

/// Look up a customer's email address.
#[durable_tool(replay = "pure")]
async fn lookup_customer(
    /// The customer id.
    customer: String,
) -> Result<String, ToolError> {
    Ok(format!("{customer}@example.com"))
}

/// Charge an order; the provider deduplicates on the idempotency key.
#[durable_tool(
    replay = "idempotent_with_key",
    idempotency_key = |a, session| format!("{session}:charge:{}", a.order_id),
)]
async fn charge_order(
    key: IdempotencyKey,
    /// The order being paid.
    order_id: String,
    /// Amount in cents.
    cents: u64,
) -> Result<Charge, ToolError> {
    // A real provider gets the key with the request and answers a repeat with the
    // first charge.
    Ok(Charge {
        id: format!("ch_{}", key.rsplit(':').next().unwrap_or(&order_id)),
        cents,
    })
}

/// Email a receipt (cannot be deduplicated: never re-run blindly after a crash).
#[durable_tool(replay = "unsafe_on_replay")]
async fn send_receipt(
    /// Recipient.
    to: String,
    /// The charge being confirmed.
    charge_id: String,
) -> Result<String, ToolError> {
    Ok(format!("receipt for {charge_id} sent to {to}"))
}

/// The application: backend-agnostic, it only sees `dyn CheckpointStore`.
async fn run_agent(store: Arc<dyn CheckpointStore>) -> Result<(), Box<dyn std::error::Error>> {
    let durable = Durable::builder(store).owner("swap-example").build();
    let mut session = durable
        .start::<Message>(StartOptions::new().with_messages(vec![Message::user(
            "Charge order o-17 and send the receipt.",
        )]))
        .await?;
    let journal = session.journal().clone();
    let to = lookup_customer.call(&journal, "ann".into()).await?;
    let charge = charge_order.call(&journal, "o-17".into(), 1200).await?;
    let receipt = send_receipt
        .call(&journal, to.clone(), charge.id.clone())
        .await?;
    println!("  lookup_customer  (pure)                -> {to}");
    println!(
        "  charge_order     (idempotent_with_key) -> {} ({} cents)",
        charge.id, charge.cents
    );
    println!("  send_receipt     (unsafe_on_replay)    -> {receipt}");
    session.push(Message::user(receipt));
    let id = session.id().clone();
    let meta = session.complete().await?;
    let calls = durable.store().calls(&id, None).await?;
    println!(
        "session {id} completed at checkpoint version {}, {} journaled calls",
        meta.version,
        calls.len()
    );
    Ok(())
}

fn compiled_in() -> Vec<&'static str> {
    let mut backends = Vec::new();
    if cfg!(feature = "sqlite") {
        backends.push("sqlite");
    }
    if cfg!(feature = "postgres") {
        backends.push("postgres");
    }
    backends
}

fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(async {
        // The default needs no server: a SQLite file in a temporary directory.
        let tmp = tempfile::tempdir().expect("temporary directory");
        let url = args
            .db
            .unwrap_or_else(|| format!("sqlite:{}", tmp.path().join("agent.db").display()));
        println!("compiled-in backends: {}", compiled_in().join(", "));
        let store = match durable::connect(&url).await {
            Ok(store) => store,
            Err(e) => {
                eprintln!("cannot open the store: {e}");
                return ExitCode::FAILURE;
            }
        };
        println!("backend: {}", store.backend());
        match run_agent(store).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("the agent failed: {e}");
                ExitCode::FAILURE
            }
        }
    })
}
