//! A durable agent on async-openai, without a framework: async-openai's typed request
//! messages are the session's transcript, its client talks to an OpenAI-compatible
//! server, every model reply is journaled (`model_with_spend`), the tools are
//! `#[durable_tool]`s exported in strict mode (the one strict mode cannot express is left
//! out, with why), tool calls are dispatched from the raw argument text, results go
//! back as typed tool messages, one checkpoint per turn.
//!
//! ```sh
//! cargo run -p durable-openai --example openai_agent                 # against an in-process stub
//! OPENAI_BASE_URL=http://127.0.0.1:8080/v1 cargo run -p durable-openai --example openai_agent
//! ```
//!
//! Without a base URL it starts `durable-openai-stub` in-process (canned replies, no
//! network). `--store`, `--ledger` and `--session` name a session to resume: run it
//! again with the same flags after killing it, and nothing is sent twice
//! (`tests/crash.rs` does exactly that).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use durable_openai_stub::{Reply, Script, Stub};

#[path = "openai_agent/agent.rs"]
mod agent;

/// Run the agent once (or resume its session).
#[derive(Debug, Parser)]
struct Args {
    /// The OpenAI-compatible API base (default: a stub started in this process).
    #[arg(long, env = "OPENAI_BASE_URL")]
    base_url: Option<String>,
    /// The model name sent with each request.
    #[arg(long, default_value = "stub-model")]
    model: String,
    /// The store, a SQLite file (default: in a temporary directory).
    #[arg(long)]
    store: Option<PathBuf>,
    /// The ledger of effects, a SQLite file (default: in a temporary directory).
    #[arg(long)]
    ledger: Option<PathBuf>,
    /// The session id; the same id resumes the session.
    #[arg(long, default_value = "order-o-17")]
    session: String,
    /// Pause at `after_model`, `mid_stream` (with `--stream`) or `after_email_effect` and
    /// wait to be killed.
    #[arg(long)]
    pause_at: Option<String>,
    /// Do not let the email's verify hook look in the ledger: an email in doubt is
    /// refused until an operator resolves it.
    #[arg(long)]
    no_verify: bool,
    /// Stream each reply (`create_stream`): text chunks are printed as they arrive, the
    /// whole reply journaled when the stream ends.
    #[arg(long)]
    stream: bool,
}

/// The in-process stub's conversation: a lookup, then a charge and an email in one turn,
/// then the answer.
fn demo_script() -> Script {
    Script::new([
        Reply::tool_calls([("call_1", "lookup", r#"{"sku":"A-1"}"#)]),
        Reply::tool_calls([
            ("call_2", "charge", r#"{"order_id":"o-17","cents":1200}"#),
            (
                "call_3",
                "send_email",
                r#"{"to":"ann@example.com","body":"Your A-1 is on its way."}"#,
            ),
        ]),
        Reply::text("Charged o-17 and emailed ann@example.com."),
    ])
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if agent::is_in_doubt(&*e) => {
            eprintln!("in doubt: {e}\n(resolve it with `durable resolve`, then run again)");
            ExitCode::from(3)
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let dir = tempfile::tempdir()?;
    let (base_url, stub) = match args.base_url {
        Some(url) => (url, None),
        None => {
            let stub = Stub::start(demo_script()).await?;
            (stub.base_url(), Some(stub))
        }
    };
    let options = agent::Options {
        store: args.store.unwrap_or_else(|| dir.path().join("agent.db")),
        ledger: args.ledger.unwrap_or_else(|| dir.path().join("ledger.db")),
        session: args.session,
        base_url,
        model: args.model,
        pause_at: args.pause_at,
        verify: !args.no_verify,
        stream: args.stream,
    };
    let ledger = options.ledger.clone();
    let turns = agent::run(options).await?;
    println!("session done after {turns} turn(s) in this process");
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
