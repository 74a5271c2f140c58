//! The agent's tools: three of each replay class, declared with `#[durable_tool]`, and
//! the plan tools, which the harness applies to the session's plan itself.
//!
//! | class | tools | the world's side |
//! |---|---|---|
//! | `pure` | `read_context`, `check_stock`, `quote_shipping` | fixed tables |
//! | `idempotent_with_key` | `charge_card`, `reserve_stock`, `commit_order` | receivers that deduplicate by key |
//! | `unsafe_on_replay` | `send_email`, `post_slack`, `notify_warehouse` | channels that deliver every call |
//!
//! `send_email` comes in two builds under the same name: with a verify hook that looks
//! for the call in the outbox, and without one (then an in-doubt email needs an
//! operator).

use std::fmt;

use durable::ToolResult;
use durable::error::ToolboxError;
use durable::{
    IdempotencyKey, Plan, StepStatus, ToolContext, ToolOutput, Toolbox, Verification, durable_tool,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::world::{self, World};

/// A tool failure, shown to the model.
#[derive(Debug)]
pub struct ToolError(String);

impl fmt::Display for ToolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<std::io::Error> for ToolError {
    fn from(e: std::io::Error) -> Self {
        ToolError(format!("the outside world failed: {e}"))
    }
}

impl From<serde_json::Error> for ToolError {
    fn from(e: serde_json::Error) -> Self {
        ToolError(format!("unexpected answer: {e}"))
    }
}

/// Logs the run of a tool body and returns the world it acts on.
fn run(ctx: &ToolContext, tool: &str) -> Result<&'static World, ToolError> {
    let world = world::world()?;
    world.executed(tool, ctx.call_id().as_str(), ctx.attempt())?;
    Ok(world)
}

// --- pure --------------------------------------------------------------------------

/// An order and its customer's contact details.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OrderContext {
    /// The order.
    pub order_id: String,
    /// The customer's name.
    pub customer: String,
    /// Where to write to.
    pub email: String,
    /// What to charge.
    pub amount_cents: u64,
    /// The item ordered.
    pub sku: String,
    /// How many.
    pub quantity: u32,
    /// Where to ship.
    pub postcode: String,
}

/// The order the demo works on.
pub fn order() -> OrderContext {
    OrderContext {
        order_id: "o-1017".into(),
        customer: "Ann Lee".into(),
        email: "ann@example.com".into(),
        amount_cents: 4200,
        sku: "TEA-250".into(),
        quantity: 2,
        postcode: "75011".into(),
    }
}

/// Read an order and its customer's contact details.
#[durable_tool(replay = "pure")]
pub async fn read_context(ctx: &ToolContext, order_id: String) -> Result<OrderContext, ToolError> {
    run(ctx, "read_context")?;
    let order = order();
    if order_id != order.order_id {
        return Err(ToolError(format!("no order `{order_id}`")));
    }
    Ok(order)
}

/// Units of an item in stock.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stock {
    /// The item.
    pub sku: String,
    /// Units available.
    pub available: u32,
    /// Where they are.
    pub warehouse: String,
}

/// Check how many units of an item are in stock.
#[durable_tool(replay = "pure")]
pub async fn check_stock(ctx: &ToolContext, sku: String) -> Result<Stock, ToolError> {
    run(ctx, "check_stock")?;
    Ok(Stock {
        sku,
        available: 12,
        warehouse: "Lyon".into(),
    })
}

/// A shipping quote.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Quote {
    /// Destination.
    pub postcode: String,
    /// Carrier.
    pub carrier: String,
    /// Price.
    pub cents: u64,
    /// Delivery time.
    pub days: u32,
}

/// Quote shipping to a postcode.
#[durable_tool(replay = "pure")]
pub async fn quote_shipping(ctx: &ToolContext, postcode: String) -> Result<Quote, ToolError> {
    run(ctx, "quote_shipping")?;
    Ok(Quote {
        postcode,
        carrier: "Colissimo".into(),
        cents: 690,
        days: 2,
    })
}

// --- idempotent_with_key -----------------------------------------------------------

/// A card charge.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Charge {
    /// The provider's id.
    pub charge_id: String,
    /// Amount.
    pub amount_cents: u64,
}

/// Charge the customer's card for an order. The payment provider deduplicates on the
/// idempotency key, so a retried charge is applied once.
#[durable_tool(
    replay = "idempotent_with_key",
    idempotency_key = |a| format!("charge:{}", a.order_id)
)]
pub async fn charge_card(
    ctx: &ToolContext,
    key: IdempotencyKey,
    order_id: String,
    amount_cents: u64,
) -> Result<Charge, ToolError> {
    let world = run(ctx, "charge_card")?;
    let _ = order_id;
    let result = world.request(
        "payments",
        &key,
        ctx.attempt(),
        |n| json!({"charge_id": format!("ch_{n:04}"), "amount_cents": amount_cents}),
    )?;
    Ok(serde_json::from_value(result)?)
}

/// A stock reservation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reservation {
    /// The warehouse's id.
    pub reservation_id: String,
    /// Units reserved.
    pub quantity: u32,
}

/// Reserve units of an item for an order (deduplicated by key).
#[durable_tool(
    replay = "idempotent_with_key",
    idempotency_key = |a| format!("reserve:{}:{}", a.order_id, a.sku)
)]
pub async fn reserve_stock(
    ctx: &ToolContext,
    key: IdempotencyKey,
    order_id: String,
    sku: String,
    quantity: u32,
) -> Result<Reservation, ToolError> {
    let world = run(ctx, "reserve_stock")?;
    let _ = (order_id, sku);
    let result = world.request(
        "stock",
        &key,
        ctx.attempt(),
        |n| json!({"reservation_id": format!("rsv_{n:04}"), "quantity": quantity}),
    )?;
    Ok(serde_json::from_value(result)?)
}

/// A committed order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Commit {
    /// The order.
    pub order_id: String,
    /// Its new status.
    pub status: String,
}

/// Commit the order in the order system (an upsert keyed by order id).
#[durable_tool(
    replay = "idempotent_with_key",
    idempotency_key = |a| format!("commit:{}", a.order_id)
)]
pub async fn commit_order(
    ctx: &ToolContext,
    key: IdempotencyKey,
    order_id: String,
) -> Result<Commit, ToolError> {
    let world = run(ctx, "commit_order")?;
    let result = world.request(
        "orders",
        &key,
        ctx.attempt(),
        |_| json!({"order_id": order_id, "status": "committed"}),
    )?;
    Ok(serde_json::from_value(result)?)
}

// --- unsafe_on_replay --------------------------------------------------------------

/// What the mail server answered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EmailReceipt {
    /// The message id the server assigned.
    pub message_id: String,
    /// The recipient.
    pub to: String,
}

fn deliver_email(
    ctx: &ToolContext,
    to: String,
    subject: String,
    body: String,
) -> Result<EmailReceipt, ToolError> {
    let world = run(ctx, "send_email")?;
    let args = json!({"to": to, "subject": subject, "body": body});
    let result = world.deliver(
        "outbox",
        ctx.call_id().as_str(),
        args,
        |seq| json!({"message_id": format!("<{seq}@outbox.example>"), "to": to}),
    )?;
    Ok(serde_json::from_value(result)?)
}

/// Send an email. The mail server cannot deduplicate: every call sends a message.
#[durable_tool(replay = "unsafe_on_replay", verify = email_in_outbox)]
pub async fn send_email(
    ctx: &ToolContext,
    to: String,
    subject: String,
    body: String,
) -> Result<EmailReceipt, ToolError> {
    deliver_email(ctx, to, subject, body)
}

/// The verify hook of `send_email`: the outbox holds every message sent, tagged with the
/// journal call that sent it.
async fn email_in_outbox(ctx: &ToolContext, _args: &SendEmailArgs) -> Verification<EmailReceipt> {
    let found = world::world().and_then(|w| w.delivery_for("outbox", ctx.call_id().as_str()));
    match found {
        Ok(Some(delivery)) => match serde_json::from_value(delivery.result) {
            Ok(receipt) => Verification::Happened(receipt),
            Err(_) => Verification::Unknown,
        },
        Ok(None) => Verification::DidNotHappen,
        Err(_) => Verification::Unknown,
    }
}

/// Send an email. The mail server cannot deduplicate: every call sends a message.
#[durable_tool(replay = "unsafe_on_replay", name = "send_email")]
pub async fn send_email_unverified(
    ctx: &ToolContext,
    to: String,
    subject: String,
    body: String,
) -> Result<EmailReceipt, ToolError> {
    deliver_email(ctx, to, subject, body)
}

/// What the chat server answered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatPost {
    /// The channel.
    pub channel: String,
    /// The message's timestamp id.
    pub ts: String,
}

/// Post a message to a team chat channel (no thread, no deduplication).
#[durable_tool(replay = "unsafe_on_replay")]
pub async fn post_slack(
    ctx: &ToolContext,
    channel: String,
    text: String,
) -> Result<ChatPost, ToolError> {
    let world = run(ctx, "post_slack")?;
    let args = json!({"channel": channel, "text": text});
    let result = world.deliver(
        "slack",
        ctx.call_id().as_str(),
        args,
        |seq| json!({"channel": channel, "ts": format!("1700000000.{seq:06}")}),
    )?;
    Ok(serde_json::from_value(result)?)
}

/// What the warehouse's webhook answered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WebhookAck {
    /// The delivery id.
    pub delivery: String,
    /// HTTP status.
    pub status: u16,
}

/// Tell the warehouse to ship an order (a partner webhook that ignores idempotency keys).
#[durable_tool(replay = "unsafe_on_replay")]
pub async fn notify_warehouse(
    ctx: &ToolContext,
    order_id: String,
    sku: String,
    quantity: u32,
) -> Result<WebhookAck, ToolError> {
    let world = run(ctx, "notify_warehouse")?;
    let args = json!({"order_id": order_id, "sku": sku, "quantity": quantity});
    let result = world.deliver(
        "warehouse",
        ctx.call_id().as_str(),
        args,
        |seq| json!({"delivery": format!("wh-{seq:04}"), "status": 202}),
    )?;
    Ok(serde_json::from_value(result)?)
}

/// Which channel an unsafe tool delivers on (how an operator checks an in-doubt call).
pub fn channel_of(tool: &str) -> Option<&'static str> {
    match tool {
        "send_email" => Some("outbox"),
        "post_slack" => Some("slack"),
        "notify_warehouse" => Some("warehouse"),
        _ => None,
    }
}

/// The agent's toolbox; `verify` picks the `send_email` with the verify hook.
pub fn toolbox(verify: bool) -> Result<Toolbox, ToolboxError> {
    let tools = Toolbox::new()
        .with(read_context)?
        .with(check_stock)?
        .with(quote_shipping)?
        .with(charge_card)?
        .with(reserve_stock)?
        .with(commit_order)?
        .with(post_slack)?
        .with(notify_warehouse)?;
    if verify {
        tools.with(send_email)
    } else {
        tools.with(send_email_unverified)
    }
}

// --- plan tools ----------------------------------------------------------------------

/// The plan tools. They change the session's plan, which every checkpoint snapshots: a
/// turn re-run after a crash starts from the checkpoint's plan and re-applies the same
/// calls (the model's reply is journaled), so they need no journal row of their own.
pub const PLAN_TOOLS: [&str; 4] = [
    "plan_create",
    "plan_show",
    "step_update",
    "postcondition_verify",
];

/// Whether `name` is a plan tool.
pub fn is_plan_tool(name: &str) -> bool {
    PLAN_TOOLS.contains(&name)
}

/// Applies a plan tool call to `plan`; the result (or the refusal, as an error result
/// the model reads) and a one-line summary for the narration.
pub fn apply_plan_tool(
    plan: &mut Plan,
    call_id: &str,
    name: &str,
    args: &Value,
) -> (ToolResult, String) {
    let (content, is_error, summary) = match plan_tool(plan, name, args) {
        Ok((content, summary)) => (content, false, summary),
        Err(message) => (
            json!({"error": message}),
            true,
            format!("{name} refused: {message}"),
        ),
    };
    let result = ToolResult {
        call_id: call_id.to_owned(),
        name: name.to_owned(),
        output: ToolOutput { content, is_error },
    };
    (result, summary)
}

fn plan_tool(plan: &mut Plan, name: &str, args: &Value) -> Result<(Value, String), String> {
    let text = |field: &str| args.get(field).and_then(Value::as_str);
    let list = |field: &str| -> Vec<String> {
        args.get(field)
            .and_then(Value::as_array)
            .map(|items| {
                items
                    .iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default()
    };
    let number = |field: &str| -> Result<usize, String> {
        args.get(field)
            .and_then(Value::as_u64)
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| format!("`{field}` must be a positive integer"))
    };
    match name {
        "plan_create" => {
            let steps = list("steps");
            let postconditions = list("postconditions");
            *plan = Plan::new(text("objective").unwrap_or_default(), steps, postconditions)
                .map_err(|e| e.to_string())?;
            let summary = format!(
                "plan created: {} steps, {} postconditions",
                plan.steps.len(),
                plan.postconditions.len()
            );
            Ok((json!(summary), summary))
        }
        "plan_show" => Ok((json!(plan.to_markdown()), "plan shown".into())),
        "step_update" => {
            let step = number("step")?;
            let status: StepStatus = text("status")
                .unwrap_or_default()
                .parse()
                .map_err(|e: durable::error::PlanError| e.to_string())?;
            plan.update_step(step, status, text("evidence"))
                .map_err(|e| e.to_string())?;
            let summary = format!("step {step} → {status}");
            Ok((json!(summary), summary))
        }
        "postcondition_verify" => {
            let number = number("postcondition")?;
            plan.verify_postcondition(number, text("evidence").unwrap_or_default())
                .map_err(|e| e.to_string())?;
            let summary = format!("postcondition {number} verified");
            Ok((json!(summary), summary))
        }
        other => Err(format!("`{other}` is not a plan tool")),
    }
}

/// The message a harness sends back when the model tries to finish too early.
pub fn gate_message(plan: &Plan) -> String {
    let mut text = String::from(
        "The plan is not complete. Before declaring the task done, mark the remaining steps done \
         with evidence (or blocked with a reason) and verify the postconditions:",
    );
    for missing in plan.missing_for_finalization() {
        text.push_str("\n- ");
        text.push_str(&missing);
    }
    text
}
