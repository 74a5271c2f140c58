//! An MCP server whose tool calls are journaled: a pure `lookup`, a keyed `charge` and an
//! unsafe `send_email`, each effect a row in a ledger (a SQLite file of its own).
//!
//! ```sh
//! cargo run -p durable-mcp --example mcp_server -- --store state.db --ledger ledger.db          # stdio
//! cargo run -p durable-mcp --example mcp_server -- --store state.db --ledger ledger.db --http 127.0.0.1:8080
//! ```
//!
//! For crash tests: with `DURABLE_MCP_EXAMPLE_HOLD=<dir>`, `charge` and `send_email` write
//! their ledger row, then create `<dir>/reached-<tool>` and wait until `<dir>/release`
//! exists (forever, if the test kills the process first).

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use durable::{Durable, IdempotencyKey, ToolContext, Toolbox, durable_tool};
use durable_mcp::DurableMcpServer;
use serde::{Deserialize, Serialize};

mod ledger;
use ledger::Ledger;

static LEDGER: OnceLock<Ledger> = OnceLock::new();

fn ledger() -> Result<&'static Ledger, std::io::Error> {
    LEDGER
        .get()
        .ok_or_else(|| std::io::Error::other("the ledger is not open"))
}

fn io(e: sqlx::Error) -> std::io::Error {
    std::io::Error::other(e)
}

/// After an effect: wait at the test's gate, if there is one.
async fn gate(tool: &str) -> std::io::Result<()> {
    let Some(dir) = std::env::var_os("DURABLE_MCP_EXAMPLE_HOLD").map(PathBuf::from) else {
        return Ok(());
    };
    tokio::fs::write(dir.join(format!("reached-{tool}")), b"").await?;
    while !dir.join("release").exists() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// A product's price.
#[derive(Debug, Serialize, Deserialize)]
pub struct Price {
    /// The product.
    pub sku: String,
    /// Its price in cents.
    pub cents: u64,
}

/// Look up a product's price.
#[durable_tool(replay = "pure")]
async fn lookup(
    /// The product, e.g. `mug`.
    sku: String,
) -> Result<Price, std::io::Error> {
    let cents = sku.bytes().map(u64::from).sum::<u64>() % 5000;
    Ok(Price { sku, cents })
}

/// A charge.
#[derive(Debug, Serialize, Deserialize)]
pub struct Charge {
    /// The order charged.
    pub order_id: String,
    /// The key the provider deduplicated on.
    pub key: String,
    /// The journal's execution attempt of this call (2 when a crash interrupted the first).
    pub attempt: i32,
}

/// Charge an order; the provider (the ledger) charges each idempotency key once, and logs
/// every attempt.
#[durable_tool(replay = "idempotent_with_key", idempotency_key = |a| format!("charge:{}", a.order_id))]
async fn charge(
    ctx: &ToolContext,
    key: IdempotencyKey,
    /// The order to charge.
    order_id: String,
    /// Amount in cents.
    cents: u64,
) -> Result<Charge, std::io::Error> {
    let ledger = ledger()?;
    ledger
        .write("charge_attempt", &key, &cents.to_string())
        .await
        .map_err(io)?;
    if !ledger.exists("charge", &key).await.map_err(io)? {
        ledger
            .write("charge", &key, &cents.to_string())
            .await
            .map_err(io)?;
    }
    gate("charge").await?;
    Ok(Charge {
        order_id,
        key: key.into_string(),
        attempt: ctx.attempt(),
    })
}

/// A sent email.
#[derive(Debug, Serialize, Deserialize)]
pub struct Sent {
    /// The ledger row of the email.
    pub message_id: i64,
}

/// Send an email (not idempotent: every call sends one).
#[durable_tool(replay = "unsafe_on_replay")]
async fn send_email(
    /// The recipient.
    to: String,
    /// The text.
    body: String,
) -> Result<Sent, std::io::Error> {
    let message_id = ledger()?.write("email", &to, &body).await.map_err(io)?;
    gate("send_email").await?;
    Ok(Sent { message_id })
}

/// Command-line flags.
struct Flags {
    store: PathBuf,
    ledger: PathBuf,
    http: Option<String>,
}

fn flags() -> Result<Flags, String> {
    let mut args = std::env::args().skip(1);
    let (mut store, mut ledger, mut http) = (None, None, None);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--store" => store = Some(PathBuf::from(value)),
            "--ledger" => ledger = Some(PathBuf::from(value)),
            "--http" => http = Some(value),
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(Flags {
        store: store.ok_or("--store <path> is required")?,
        ledger: ledger.ok_or("--ledger <path> is required")?,
        http,
    })
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let flags = flags()?;
    let _ = LEDGER.set(Ledger::open(&flags.ledger).await?);
    let store = durable::connect(&format!("sqlite:{}", flags.store.display())).await?;
    // A stable owner: a restarted server takes its sessions back at once.
    let durable = Durable::builder(store).owner("mcp-example-server").build();
    let toolbox = Toolbox::new()
        .with(lookup)?
        .with(charge)?
        .with(send_email)?;
    let server = DurableMcpServer::builder(durable, toolbox, "example")
        .start()
        .await?;
    // Tests: the number of calls in flight, written next to the gate (so that a test
    // knows a second request reached the server before it releases the first).
    if let Some(dir) = std::env::var_os("DURABLE_MCP_EXAMPLE_HOLD").map(PathBuf::from) {
        let watched = server.clone();
        tokio::spawn(async move {
            loop {
                let count = watched.in_flight().to_string();
                let _ = tokio::fs::write(dir.join("in-flight.tmp"), count).await;
                let _ = tokio::fs::rename(dir.join("in-flight.tmp"), dir.join("in-flight")).await;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
    }
    match flags.http {
        None => server.serve_stdio().await?,
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(&addr).await?;
            // The test reads the bound address (the port may be 0).
            println!("listening on http://{}/mcp", listener.local_addr()?);
            let router =
                axum::Router::new().nest_service("/mcp", server.http_service(Default::default()));
            // On Ctrl-C (or SIGTERM): stop taking requests, then let the calls in flight
            // end and record their outcomes before the process exits.
            axum::serve(listener, router)
                .with_graceful_shutdown(shutdown())
                .await?;
            server.drain().await;
        }
    }
    Ok(())
}

/// Resolves on Ctrl-C or SIGTERM.
async fn shutdown() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                term.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}
