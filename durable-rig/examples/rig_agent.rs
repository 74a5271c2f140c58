//! A durable rig agent: rig's own agent loop, its OpenAI Chat Completions client and two
//! `#[durable_tool]`s, in a durable session on SQLite. The model is a canned
//! OpenAI-compatible server on loopback (no key, no internet).
//!
//! The run is then re-run in the resumed session, as a worker that died before its
//! checkpoint would: the model is not asked again and the email is not sent twice.
//!
//! ```sh
//! cargo run -p durable-rig --example rig_agent
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use durable::{CheckpointStore, Durable, SessionId, StartOptions, Toolbox, durable_tool};
use durable_openai_stub::{Reply, Script, Stub};
use durable_rig::DurableRig;
use rig_core::providers::openai::OpenAIConfig;
use serde_json::{Value, json};

static EMAILS: AtomicUsize = AtomicUsize::new(0);

/// Look up an order's status.
#[durable_tool(replay = "pure")]
async fn order_status(
    /// The order id, e.g. `o-17`.
    order_id: String,
) -> Result<Value, std::io::Error> {
    Ok(json!({"order_id": order_id, "status": "shipped"}))
}

/// Email a customer.
#[durable_tool(replay = "unsafe_on_replay")]
async fn send_email(
    /// Recipient address.
    to: String,
    /// Plain-text body.
    body: String,
) -> Result<Value, std::io::Error> {
    let n = EMAILS.fetch_add(1, Ordering::SeqCst) + 1;
    println!("  (email #{n} to {to}: {body})");
    Ok(json!({"message_id": format!("msg-{n}")}))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let stub = Stub::start(Script::new([
        Reply::tool_calls([("call_1", "order_status", r#"{"order_id":"o-17"}"#)]),
        Reply::tool_calls([(
            "call_2",
            "send_email",
            r#"{"to":"ann@example.com","body":"Order o-17 has shipped."}"#,
        )]),
        Reply::text("Order o-17 has shipped; Ann has been told."),
    ]))
    .await?;
    let dir = tempfile::tempdir()?;
    let url = format!("sqlite:{}", dir.path().join("agent.db").display());
    let store: Arc<dyn CheckpointStore> = durable::connect(&url).await?;
    let durable = Durable::builder(store).owner("rig-example").build();
    let toolbox = Arc::new(Toolbox::new().with(order_status)?.with(send_email)?);
    let id = SessionId::new("ticket-17");

    // The agent, in a few lines.
    let mut session = durable
        .start::<Value>(StartOptions::new().with_id(id.clone()))
        .await?;
    let rig = DurableRig::new(session.journal().clone(), Arc::clone(&toolbox));
    let model = OpenAIConfig::new("not-a-key")
        .with_base_url(stub.base_url())
        .client()
        .chat("gpt-4o-mini");
    let agent = rig
        .agent(model.clone())?
        .preamble("You help customers.")
        .build();
    let prompt = "Has order o-17 shipped? Tell ann@example.com.";
    let reply = agent.prompt(prompt).max_turns(5).run().await?;
    println!("first run: {}", reply.output());
    assert_eq!(stub.requests().len(), 3);

    // The worker dies before its checkpoint; another resumes and re-runs the prompt.
    drop(session);
    session = durable.resume::<Value>(&id).await?.session;
    let rig = DurableRig::new(session.journal().clone(), toolbox);
    let agent = rig.agent(model)?.preamble("You help customers.").build();
    let again = agent.prompt(prompt).max_turns(5).run().await?;
    println!("re-run:    {} (from the journal)", again.output());
    assert_eq!(again.output(), reply.output());
    assert_eq!(stub.requests().len(), 3, "the model was not asked again");
    assert_eq!(EMAILS.load(Ordering::SeqCst), 1, "the email was sent once");

    session.push(json!({"role": "assistant", "content": again.output()}));
    session.checkpoint().await?;
    let budget = session.budget();
    println!("spent: {} tokens over 3 replies", budget.total_tokens());
    session.complete().await?;
    Ok(())
}
