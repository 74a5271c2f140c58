//! The scripted model: a deterministic stand-in for an LLM.
//!
//! It plays a fixed conversation, one reply per assistant turn, reading earlier tool
//! results out of the transcript to fill in its evidence, like a model at temperature 0
//! would. The harness calls it through `session.model_with_spend(...)`, the journaled
//! path a real provider call takes, so a turn re-run after a crash gets the recorded
//! reply back instead of asking again.

use std::fmt;

use durable::Spend;
use durable::{Block, Message, Role};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::tools::order;

/// Which conversation the model plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Script {
    /// The five-step workflow: read context, plan, send an email, charge a card, commit.
    Demo,
    /// The same workflow widened for the torture suite: three tools of each replay
    /// class, parallel calls in a turn, four checkpoints.
    Torture,
}

impl Script {
    /// The name used on the command line and in the environment.
    pub fn name(self) -> &'static str {
        match self {
            Script::Demo => "demo",
            Script::Torture => "torture",
        }
    }

    /// Parses [`name`](Self::name).
    pub fn parse(name: &str) -> Option<Self> {
        [Script::Demo, Script::Torture]
            .into_iter()
            .find(|s| s.name() == name)
    }

    /// Model calls in a run without crashes.
    pub fn model_calls(self) -> usize {
        match self {
            Script::Demo => 7,
            Script::Torture => 6,
        }
    }

    /// Checkpoints written in a run without crashes (the last by `complete`).
    pub fn checkpoints(self) -> usize {
        match self {
            Script::Demo => 5,
            Script::Torture => 4,
        }
    }

    /// The journaled tools it calls, in the order of the conversation.
    pub fn tools(self) -> &'static [&'static str] {
        match self {
            Script::Demo => &["read_context", "send_email", "charge_card", "commit_order"],
            Script::Torture => &[
                "read_context",
                "check_stock",
                "quote_shipping",
                "charge_card",
                "reserve_stock",
                "send_email",
                "post_slack",
                "commit_order",
                "notify_warehouse",
            ],
        }
    }

    /// The task the session starts with.
    pub fn task(self) -> Message {
        Message::user(match self {
            Script::Demo => {
                "Order o-1017 is ready. Read it, plan the work, email the customer a confirmation, \
                 charge the card and commit the order."
            }
            Script::Torture => {
                "Order o-1017 is ready. Check stock and shipping, charge the card, reserve the stock, \
                 tell the customer and the team, commit the order and notify the warehouse."
            }
        })
    }
}

/// The model's reply as the journal records it: the message and its token usage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelReply {
    /// The assistant message.
    pub message: Message,
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Completion tokens.
    pub output_tokens: u64,
}

/// Price per token, in nano-USD ($3 and $15 per million tokens).
const NANO_USD_PER_INPUT_TOKEN: u64 = 3_000;
const NANO_USD_PER_OUTPUT_TOKEN: u64 = 15_000;

impl ModelReply {
    /// What the reply cost, charged to the session's budget once.
    pub fn spend(&self) -> Spend {
        Spend::from_nano_usd(
            self.input_tokens * NANO_USD_PER_INPUT_TOKEN
                + self.output_tokens * NANO_USD_PER_OUTPUT_TOKEN,
            self.input_tokens,
            self.output_tokens,
        )
    }
}

/// The script has no reply for this point of the conversation.
#[derive(Debug)]
pub struct ModelError(String);

impl fmt::Display for ModelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The scripted model.
#[derive(Debug, Clone, Copy)]
pub struct ScriptedModel {
    script: Script,
}

fn tokens(value: &impl Serialize) -> u64 {
    serde_json::to_vec(value)
        .map_or(0, |bytes| bytes.len() as u64)
        .div_ceil(4)
}

/// The result of the first call to `tool` in the transcript, if it has one.
fn result_of(transcript: &[Message], tool: &str) -> Value {
    let call = transcript
        .iter()
        .filter(|m| m.role == Role::Assistant)
        .flat_map(Message::tool_calls)
        .find(|c| c.name == tool);
    let Some(call) = call else {
        return Value::Null;
    };
    transcript
        .iter()
        .flat_map(Message::tool_results)
        .find(|r| r.call_id == call.id)
        .map_or(Value::Null, |r| r.content.clone())
}

fn field(value: &Value, name: &str) -> String {
    match value.get(name) {
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
        None => "?".into(),
    }
}

impl ScriptedModel {
    /// A model playing `script`.
    pub fn new(script: Script) -> Self {
        ScriptedModel { script }
    }

    /// The next reply, given the transcript so far (and, as a real provider gets them,
    /// the tool definitions, which a script has no use for).
    pub fn respond(
        &self,
        transcript: &[Message],
        _tools: &[Value],
    ) -> Result<ModelReply, ModelError> {
        let turn = transcript
            .iter()
            .filter(|m| m.role == Role::Assistant)
            .count();
        let blocks = match self.script {
            Script::Demo => demo_turn(turn, transcript),
            Script::Torture => torture_turn(turn, transcript),
        }
        .ok_or_else(|| {
            ModelError(format!(
                "the {} script has no reply for turn {turn}",
                self.script.name()
            ))
        })?;
        let message = Message::assistant(
            blocks
                .into_iter()
                .enumerate()
                .map(|(i, b)| match b {
                    Reply::Text(text) => Block::text(text),
                    Reply::Call(name, args) => {
                        Block::tool_call(format!("call_{turn}_{i}"), name, args)
                    }
                })
                .collect(),
        );
        Ok(ModelReply {
            input_tokens: tokens(&transcript),
            output_tokens: tokens(&message),
            message,
        })
    }

    /// What a model re-asked after a crash might say instead: `tool` (an unsafe tool whose
    /// first call is in doubt) with other arguments and, with `other`, a second unsafe
    /// tool besides.
    pub fn rethink(&self, tool: &str, other: bool) -> Message {
        let o = order();
        let changed = |tool: &str| -> (String, Value) {
            match tool {
                "send_email" => (
                    "send_email".into(),
                    json!({"to": o.email, "subject": format!("Order {} (sent again)", o.order_id),
                           "body": "Sorry if you got this twice."}),
                ),
                "post_slack" => (
                    "post_slack".into(),
                    json!({"channel": "#orders", "text": format!("{} paid (retry)", o.order_id)}),
                ),
                _ => (
                    "notify_warehouse".into(),
                    json!({"order_id": o.order_id, "sku": o.sku, "quantity": o.quantity + 1}),
                ),
            }
        };
        let mut blocks = vec![Block::text("Let me try that differently.")];
        let (name, args) = changed(tool);
        blocks.push(Block::tool_call("call_rethink_0", name, args));
        if other {
            let next = match tool {
                "send_email" => "post_slack",
                "post_slack" => "notify_warehouse",
                _ => "send_email",
            };
            let (name, args) = changed(next);
            blocks.push(Block::tool_call("call_rethink_1", name, args));
        }
        Message::assistant(blocks)
    }
}

enum Reply {
    Text(String),
    Call(&'static str, Value),
}

fn step(n: usize, status: &str, evidence: String) -> Reply {
    Reply::Call(
        "step_update",
        json!({"step": n, "status": status, "evidence": evidence}),
    )
}

fn verify(n: usize, evidence: String) -> Reply {
    Reply::Call(
        "postcondition_verify",
        json!({"postcondition": n, "evidence": evidence}),
    )
}

fn demo_turn(turn: usize, t: &[Message]) -> Option<Vec<Reply>> {
    let o = order();
    Some(match turn {
        0 => vec![
            Reply::Text("I'll read the order, then plan.".into()),
            Reply::Call("read_context", json!({"order_id": o.order_id})),
            Reply::Call(
                "plan_create",
                json!({
                    "objective": format!("Confirm order {} and take payment", o.order_id),
                    "steps": ["Read the order", "Email the confirmation", "Charge the card", "Commit the order"],
                    "postconditions": ["Exactly one confirmation email sent", "Card charged exactly once", "Order committed"],
                }),
            ),
        ],
        1 => {
            let ctx = result_of(t, "read_context");
            vec![
                step(
                    1,
                    "done",
                    format!(
                        "read_context: {} <{}>, {} cents",
                        field(&ctx, "customer"),
                        field(&ctx, "email"),
                        field(&ctx, "amount_cents")
                    ),
                ),
                Reply::Call(
                    "send_email",
                    json!({
                        "to": field(&ctx, "email"),
                        "subject": format!("Your order {} is confirmed", o.order_id),
                        "body": format!("Hello {}, we are preparing your order.", field(&ctx, "customer")),
                    }),
                ),
            ]
        }
        2 => {
            let receipt = result_of(t, "send_email");
            let ctx = result_of(t, "read_context");
            vec![
                step(
                    2,
                    "done",
                    format!("send_email: message {}", field(&receipt, "message_id")),
                ),
                Reply::Call(
                    "charge_card",
                    json!({"order_id": o.order_id, "amount_cents": ctx.get("amount_cents")}),
                ),
            ]
        }
        // Finishes too early: the order is not committed. The plan gate refuses this.
        3 => vec![Reply::Text(
            "Done: the customer is emailed and the card is charged.".into(),
        )],
        4 => {
            let charge = result_of(t, "charge_card");
            vec![
                step(
                    3,
                    "done",
                    format!("charge_card: {}", field(&charge, "charge_id")),
                ),
                Reply::Call("commit_order", json!({"order_id": o.order_id})),
            ]
        }
        5 => {
            let receipt = result_of(t, "send_email");
            let charge = result_of(t, "charge_card");
            let commit = result_of(t, "commit_order");
            vec![
                step(
                    4,
                    "done",
                    format!("commit_order: {}", field(&commit, "status")),
                ),
                verify(
                    1,
                    format!("one message sent: {}", field(&receipt, "message_id")),
                ),
                verify(2, format!("one charge: {}", field(&charge, "charge_id"))),
                verify(3, format!("order status {}", field(&commit, "status"))),
            ]
        }
        6 => vec![Reply::Text(format!(
            "Order {} is confirmed: email {}, charge {}, order committed.",
            o.order_id,
            field(&result_of(t, "send_email"), "message_id"),
            field(&result_of(t, "charge_card"), "charge_id"),
        ))],
        _ => return None,
    })
}

fn torture_turn(turn: usize, t: &[Message]) -> Option<Vec<Reply>> {
    let o = order();
    Some(match turn {
        0 => vec![
            Reply::Call("read_context", json!({"order_id": o.order_id})),
            Reply::Call("check_stock", json!({"sku": o.sku})),
            Reply::Call("quote_shipping", json!({"postcode": o.postcode})),
            Reply::Call(
                "plan_create",
                json!({
                    "objective": format!("Fulfil order {}", o.order_id),
                    "steps": ["Gather order, stock and shipping", "Charge, reserve, tell customer and team", "Commit and notify the warehouse"],
                    "postconditions": ["Customer emailed exactly once", "Warehouse notified exactly once"],
                }),
            ),
        ],
        1 => {
            let ctx = result_of(t, "read_context");
            let stock = result_of(t, "check_stock");
            let quote = result_of(t, "quote_shipping");
            vec![
                step(
                    1,
                    "done",
                    format!(
                        "{} in stock at {}; shipping {} cents",
                        field(&stock, "available"),
                        field(&stock, "warehouse"),
                        field(&quote, "cents")
                    ),
                ),
                Reply::Call(
                    "charge_card",
                    json!({"order_id": o.order_id, "amount_cents": ctx.get("amount_cents")}),
                ),
                Reply::Call(
                    "reserve_stock",
                    json!({"order_id": o.order_id, "sku": o.sku, "quantity": o.quantity}),
                ),
                Reply::Call(
                    "send_email",
                    json!({"to": field(&ctx, "email"), "subject": format!("Order {} confirmed", o.order_id),
                           "body": format!("Hello {}, your order ships in {} days.", field(&ctx, "customer"), field(&quote, "days"))}),
                ),
                Reply::Call(
                    "post_slack",
                    json!({"channel": "#orders", "text": format!("{} paid", o.order_id)}),
                ),
            ]
        }
        2 => {
            let charge = result_of(t, "charge_card");
            let receipt = result_of(t, "send_email");
            vec![
                step(
                    2,
                    "done",
                    format!(
                        "charge {}, reservation {}",
                        field(&charge, "charge_id"),
                        field(&result_of(t, "reserve_stock"), "reservation_id")
                    ),
                ),
                verify(1, format!("message {}", field(&receipt, "message_id"))),
                Reply::Call("commit_order", json!({"order_id": o.order_id})),
                Reply::Call(
                    "notify_warehouse",
                    json!({"order_id": o.order_id, "sku": o.sku, "quantity": o.quantity}),
                ),
            ]
        }
        // Finishes too early: step 3 and the warehouse postcondition are still open.
        3 => vec![Reply::Text("All done.".into())],
        4 => {
            let ack = result_of(t, "notify_warehouse");
            vec![
                step(
                    3,
                    "done",
                    format!(
                        "order {}, webhook {}",
                        field(&result_of(t, "commit_order"), "status"),
                        field(&ack, "delivery")
                    ),
                ),
                verify(2, format!("webhook delivery {}", field(&ack, "delivery"))),
            ]
        }
        5 => vec![Reply::Text(format!("Order {} is fulfilled.", o.order_id))],
        _ => return None,
    })
}
