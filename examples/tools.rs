//! `#[durable_tool]` and the toolbox: the three schema dialects of a few real tools, then
//! JSON tool calls (as a model sends them) dispatched through the journal on SQLite,
//! including a replay that returns the recorded result without running the tool again.
//!
//! ```sh
//! cargo run --example tools
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use durable::Message;
use durable::{
    CheckpointStore, Durable, IdempotencyKey, ModelToolCall, StartOptions, ToolArguments,
    ToolContext, Toolbox, Verification, durable_tool,
};
use serde::{Deserialize, Serialize};
use serde_json::json;

static EMAILS_SENT: AtomicUsize = AtomicUsize::new(0);
static CHARGES_MADE: AtomicUsize = AtomicUsize::new(0);

/// A delivered email.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Receipt {
    /// The provider's message id.
    pub message_id: String,
}

/// A charge.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Charge {
    /// The provider's charge id.
    pub charge_id: String,
    /// The key the provider deduplicated on.
    pub idempotency_key: String,
}

/// Look up an order by id.
#[durable_tool(replay = "pure")]
async fn read_order(
    /// The order id, e.g. `o-17`.
    order_id: String,
    /// Include the line items (default: no).
    with_items: Option<bool>,
) -> Result<serde_json::Value, std::io::Error> {
    Ok(json!({
        "order_id": order_id,
        "customer": "ann@example.com",
        "total_cents": 1200,
        "items": with_items.unwrap_or(false).then(|| vec!["mug", "tea"]),
    }))
}

/// Charge the customer's card; the provider honours idempotency keys.
#[durable_tool(
    replay = "idempotent_with_key",
    idempotency_key = |a| format!("charge:{}", a.order_id),
)]
async fn charge_card(
    key: IdempotencyKey,
    /// The order to charge for.
    order_id: String,
    /// Amount in cents.
    cents: u64,
) -> Result<Charge, std::io::Error> {
    CHARGES_MADE.fetch_add(1, Ordering::SeqCst);
    Ok(Charge {
        charge_id: format!("ch_{order_id}_{cents}"),
        idempotency_key: key.into_string(),
    })
}

/// Send an email to a customer.
#[durable_tool(replay = "unsafe_on_replay", verify = email_was_sent)]
async fn send_email(
    /// Recipient address.
    to: String,
    /// Subject line.
    subject: String,
    /// Plain-text body.
    body: String,
) -> Result<Receipt, std::io::Error> {
    let n = EMAILS_SENT.fetch_add(1, Ordering::SeqCst) + 1;
    let _ = (to, subject, body);
    Ok(Receipt {
        message_id: format!("msg-{n}"),
    })
}

/// Record an analytics event with free-form properties.
#[durable_tool(replay = "pure")]
async fn track_event(
    /// The event name.
    name: String,
    /// Any JSON object: OpenAI strict mode cannot express it, the other dialects can.
    properties: serde_json::Value,
) -> Result<bool, std::io::Error> {
    let _ = (name, properties);
    Ok(true)
}

/// Asked on resume when a `send_email` call is in doubt: would look in the outbox.
async fn email_was_sent(_ctx: &ToolContext, _args: &SendEmailArgs) -> Verification<Receipt> {
    Verification::Unknown
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let toolbox = Toolbox::new()
        .with(read_order)?
        .with(charge_card)?
        .with(send_email)?
        .with(track_event)?;

    println!("== OpenAI (function calling, strict mode)");
    let openai = toolbox.openai_tools();
    // `track_event` takes a free JSON value, which strict mode cannot express: it is left
    // out, with why; the other tools are exported.
    for skipped in openai.skipped() {
        println!("-- left out: {skipped}");
    }
    println!("{}", serde_json::to_string_pretty(openai.tools())?);
    println!("== Anthropic (tool use)");
    println!(
        "{}",
        serde_json::to_string_pretty(&toolbox.anthropic_tools().all()?)?
    );
    println!("== MCP (tools/list)");
    println!(
        "{}",
        serde_json::to_string_pretty(&toolbox.mcp_tools_list()?)?
    );

    let dir = tempfile::tempdir()?;
    let store: Arc<dyn CheckpointStore> =
        durable::connect(&format!("sqlite:{}", dir.path().join("tools.db").display())).await?;
    let durable = Durable::builder(Arc::clone(&store))
        .owner("tools-example")
        .build();
    let session = durable.start::<Message>(StartOptions::default()).await?;
    let id = session.id().clone();

    // One model turn: three tool calls, the first with OpenAI's raw-text arguments
    // (and `null` for an optional field, as strict mode sends it).
    let calls = vec![
        ModelToolCall::new(
            "call_1",
            "read_order",
            ToolArguments::Text(r#"{"order_id": "o-17", "with_items": null}"#.into()),
        ),
        ModelToolCall::new(
            "call_2",
            "charge_card",
            ToolArguments::Json(json!({"order_id": "o-17", "cents": 1200})),
        ),
        ModelToolCall::new(
            "call_3",
            "send_email",
            ToolArguments::Json(json!({
                "to": "ann@example.com",
                "subject": "Order o-17",
                "body": "Confirmed."
            })),
        ),
    ];
    println!("\n== dispatch (first run)");
    for result in toolbox.dispatch_all(session.journal(), &calls).await {
        let result = result?;
        println!("{:<12} → {}", result.name, result.output.content);
    }

    // Bad input from a model: a typed error naming the problem; nothing runs or is journaled.
    for bad in [
        ModelToolCall::new(
            "call_4",
            "refund_everything",
            ToolArguments::Json(json!({})),
        ),
        ModelToolCall::new(
            "call_5",
            "charge_card",
            ToolArguments::Text(r#"{"order_id": "o-17", "cents": "a lot"}"#.into()),
        ),
        ModelToolCall::new(
            "call_6",
            "charge_card",
            ToolArguments::Text(r#"{"order_id": "o-1", "order_id": "o-2", "cents": 1}"#.into()),
        ),
    ] {
        let err = toolbox
            .dispatch(session.journal(), &bad)
            .await
            .expect_err("refused");
        println!("refused      → {err}");
    }

    // The worker dies before checkpointing the turn; another resumes and re-runs it.
    drop(session);
    let record = store.session(&id).await?;
    store
        .release_lease(&durable::store::Lease {
            session: id.clone(),
            owner: record.lease_owner.unwrap_or_default(),
            fence: record.fence,
            expires_at: 0,
        })
        .await?;
    let resumed = durable.resume::<Message>(&id).await?;
    println!("\n== dispatch (the same turn, replayed after a crash)");
    for result in toolbox
        .dispatch_all(resumed.session.journal(), &calls)
        .await
    {
        let result = result?;
        println!("{:<12} → {} (recorded)", result.name, result.output.content);
    }
    println!(
        "\nemails sent: {}, charges made: {} — the replay ran nothing again",
        EMAILS_SENT.load(Ordering::SeqCst),
        CHARGES_MADE.load(Ordering::SeqCst)
    );
    assert_eq!(EMAILS_SENT.load(Ordering::SeqCst), 1);
    assert_eq!(CHARGES_MADE.load(Ordering::SeqCst), 1);
    resumed.session.complete().await?;
    Ok(())
}
