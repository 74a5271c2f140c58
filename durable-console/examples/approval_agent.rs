//! An agent whose one refund waits for a person's approval, one process run at a time:
//!
//! ```text
//! cargo run -p durable-console --example approval_agent -- agent.db ledger.txt
//! durable --db agent.db serve          # approve the refund in the browser
//! cargo run -p durable-console --example approval_agent -- agent.db ledger.txt
//! ```
//!
//! The first run starts session `refund-o-17`; the runtime's approval policy sends its
//! `unsafe_on_replay` refund for approval, so nothing runs: the call is journaled as
//! requested, the session is parked (`await_approval`) and the process exits. Once a
//! person approved it, the next run resumes the session: the refund runs exactly once
//! (it appends a line to the ledger file) and the session completes. A run while the
//! request is undecided, or after the session completed, changes nothing.
//!
//! It prints one line saying how the run ended: `awaiting approval`, `completed: …`,
//! `denied: …` or `nothing to do: …`.

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Arc;

use durable::{
    Block, CallError, CheckpointStore, Durable, DurableError, Message, ReplayClass, SessionId,
    StartOptions, StoreError, ToolSpec,
};
use serde_json::{Value, json};

/// The session this agent works on.
const SESSION: &str = "refund-o-17";

fn refund() -> ToolSpec {
    ToolSpec::new(
        "issue_refund",
        "Refund the customer.",
        ReplayClass::UnsafeOnReplay,
        json!({"type": "object", "properties": {"order": {"type": "string"},
            "amount": {"type": "integer"}}, "required": ["order", "amount"]}),
    )
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args_os().skip(1);
    let (Some(db), Some(ledger)) = (args.next(), args.next()) else {
        return Err("usage: approval_agent <store.db> <ledger file>".into());
    };
    let ledger = PathBuf::from(ledger);
    let store: Arc<dyn CheckpointStore> =
        Arc::new(durable::sqlite::SqliteStore::open(PathBuf::from(db)).await?);
    let durable = Durable::builder(store)
        .owner("approval-agent")
        .app_version("refunds/1")
        .approval_policy(|tool, _args| {
            (tool.name == "issue_refund")
                .then(|| durable::approval::request("policy: every refund needs a person"))
        })
        .build();
    let id = SessionId::new(SESSION);
    let mut session =
        match durable.resume::<Message>(&id).await {
            Ok(resumed) => resumed.session,
            Err(DurableError::Store(StoreError::SessionNotFound(_))) => {
                durable
                    .start(StartOptions::new().with_id(id.clone()).with_messages(vec![
                        Message::user("Order o-17 arrived broken; please refund me."),
                    ]))
                    .await?
            }
            Err(e) => {
                println!("nothing to do: {e}");
                return Ok(());
            }
        };
    let journal = session
        .journal()
        .with_reasoning("The customer sent a photo of the broken item; a full refund is due.");
    let outcome = journal
        .tool(&refund(), json!({"order": "o-17", "amount": 1200}))
        .run(|ctx| {
            let ledger = ledger.clone();
            async move {
                let mut file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&ledger)
                    .map_err(|e| e.to_string())?;
                writeln!(file, "refund o-17 1200 call {}", ctx.call_id())
                    .map_err(|e| e.to_string())?;
                Ok::<_, String>(json!({"refund": "r-17"}))
            }
        })
        .await;
    let result: Value = match outcome {
        Ok(result) => result,
        Err(CallError::Durable(e)) if e.is_awaiting_approval() => {
            session.await_approval().await?;
            println!("awaiting approval");
            return Ok(());
        }
        // A denial is the call's recorded error: the model reads it.
        Err(CallError::Recorded(failure)) => {
            session.push(Message::assistant(vec![Block::text(format!(
                "The refund was not made: {failure}"
            ))]));
            session.complete().await?;
            println!("denied: {failure}");
            return Ok(());
        }
        Err(e) => return Err(e.to_string().into()),
    };
    session.push(Message::assistant(vec![Block::text(format!(
        "Refunded order o-17 ({result})."
    ))]));
    session.complete().await?;
    println!("completed: {result}");
    Ok(())
}
