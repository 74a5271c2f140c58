//! An async-openai agent made durable without rewriting it: its turn loop, transcript,
//! tool definitions and dispatch are plain async-openai; the lines marked `// durable:`
//! in `wrapped_agent/agent.rs` are all that changed (a store and a session, the client
//! wrapped in `DurableClient`, the tools declared `#[durable_tool]` and called with the
//! session's journal).
//!
//! ```sh
//! cargo run -p durable-openai --features client --example wrapped_agent            # against an in-process stub
//! cargo run -p durable-openai --features client --example wrapped_agent -- --stream
//! ```
//!
//! `--store`, `--ledger` and `--session` name a session to resume: run it again with the
//! same flags after killing it, and nothing is sent twice (`tests/wrapped.rs` does that).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use durable_openai_stub::{Reply, Script, Stub};

#[path = "wrapped_agent/agent.rs"]
mod agent;

/// Run the agent once (or resume its session).
#[derive(Debug, Parser)]
struct Args {
    /// The OpenAI-compatible API base (default: a stub started in this process).
    #[arg(long, env = "OPENAI_BASE_URL")]
    base_url: Option<String>,
    /// The store, a SQLite file (default: in a temporary directory).
    #[arg(long)]
    store: Option<PathBuf>,
    /// The ledger of effects, a SQLite file (default: in a temporary directory).
    #[arg(long)]
    ledger: Option<PathBuf>,
    /// The session id; the same id resumes the session.
    #[arg(long, default_value = "wrapped-1")]
    session: String,
    /// Stream each reply (`create_stream`).
    #[arg(long)]
    stream: bool,
}

/// The in-process stub's conversation: a lookup, an email, then the answer.
fn demo_script() -> Script {
    Script::new([
        Reply::tool_calls([("call_1", "lookup", r#"{"sku":"A-1"}"#)]),
        Reply::tool_calls([(
            "call_2",
            "send_email",
            r#"{"to":"ann@example.com","body":"A-1 is in stock."}"#,
        )]),
        Reply::text("A-1 is in stock; ann@example.com has been told."),
    ])
}

#[tokio::main]
async fn main() -> ExitCode {
    match run(Args::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), agent::Error> {
    let dir = tempfile::tempdir()?;
    let (base_url, stub) = match args.base_url {
        Some(url) => (url, None),
        None => {
            let stub = Stub::start(demo_script()).await?;
            (stub.base_url(), Some(stub))
        }
    };
    let ledger = args.ledger.unwrap_or_else(|| dir.path().join("ledger.db"));
    let answer = agent::run(agent::Options {
        store: args.store.unwrap_or_else(|| dir.path().join("agent.db")),
        ledger: ledger.clone(),
        session: args.session,
        base_url,
        stream: args.stream,
        pause_at: None,
    })
    .await?;
    println!("answer: {answer}");
    let pool = agent::open_ledger(&ledger).await?;
    let effects: Vec<(String, String)> =
        sqlx::query_as("SELECT kind, detail FROM effects ORDER BY id")
            .fetch_all(&pool)
            .await?;
    for (kind, detail) in effects {
        println!("ledger: {kind} {detail}");
    }
    if let Some(stub) = stub {
        println!("the model was asked {} time(s)", stub.requests().len());
    }
    Ok(())
}
