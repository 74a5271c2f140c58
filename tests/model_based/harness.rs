//! An ordinary harness and its scripted model.
//!
//! The harness knows nothing of the replay protocol: each turn it asks the model (through
//! the journal, so a re-run turn gets the journaled reply), dispatches every call the
//! reply proposes, one after the other, turns any refusal into a tool-result message the
//! model will read, and checkpoints. A reply of a format it does not read is ignored and
//! the model asked again. It does not avoid any of the bugs the properties look for.
//!
//! The model proposes one call per class it is asked for, each with a fresh intent; asked
//! again about a reply the harness ignored, it proposes the same intents in its current
//! argument shape (which differs: the draft number is part of the text, and the schema
//! names the fields).

use std::collections::HashMap;

use durable::ModelToolCall;
use durable::{Block, Message, Session, Spend, Toolbox};
use serde_json::{Value, json};

use crate::program::{Class, Schema};
use crate::tools::renamed_field;
use crate::world::{Scene, intent_of, tool_name};

/// How often a turn asks the model before it gives up on replies it cannot read.
const MAX_ASKS: usize = 4;

/// The model of one session: where its fresh intents come from.
pub struct Model {
    /// Intents of this session start with this (a fork's model has its own).
    pub namespace: String,
    pub next: u32,
}

impl Model {
    fn fresh_intent(&mut self) -> String {
        self.next += 1;
        format!("{}.{}", self.namespace, self.next)
    }
}

/// What the harness of this release is.
#[derive(Debug, Clone, Copy)]
pub struct Release {
    /// The reply format it reads (and the model writes).
    pub format: u32,
    /// The tool registration.
    pub schema: Schema,
}

/// How a turn ended (when it was not dropped mid-way by a crash).
pub enum TurnEnd {
    /// Checkpointed; the spend of every row the turn used, once per row.
    Checkpointed {
        version: i64,
        used: HashMap<String, Spend>,
    },
    /// The harness stopped (an error it cannot turn into a message, e.g. a lost lease).
    Stopped(String),
    /// Calls of the turn await a person's approval: the checkpoint was refused, and the
    /// harness parks the session.
    Awaiting,
}

fn class_of(tool: &str) -> Option<Class> {
    Class::ALL.into_iter().find(|c| tool_name(*c) == tool)
}

fn arguments(class: Class, release: Release, intent: &str) -> Value {
    let memo = format!("intent={intent} draft={}", release.format);
    let field = renamed_field(class, release.schema);
    let value = match class {
        Class::Pure => json!(format!("about {intent}")),
        Class::Keyed => json!(format!("order-{intent}")),
        Class::Email => json!("ann@example.com"),
        Class::Webhook => json!("https://hooks.example/orders"),
    };
    let mut args = json!({ "memo": memo });
    args[field] = value;
    if class == Class::Keyed {
        args["cents"] = json!(1200);
    }
    args
}

/// The model's answer: fresh intents for `classes`, or the intents of a reply the harness
/// ignored, in the current shape.
fn reply(
    model: &mut Model,
    scene: &Scene,
    release: Release,
    classes: &[Class],
    ignored: Option<&Value>,
) -> Value {
    let wanted: Vec<(Class, String)> = match ignored {
        Some(old) => old["calls"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|call| {
                let class = class_of(call["name"].as_str()?)?;
                let memo = call["arguments"]["memo"].as_str()?;
                Some((class, intent_of(memo)))
            })
            .collect(),
        None => classes.iter().map(|c| (*c, model.fresh_intent())).collect(),
    };
    let calls: Vec<Value> = wanted
        .iter()
        .enumerate()
        .map(|(i, (class, intent))| {
            json!({
                "id": format!("call_{i}"),
                "name": tool_name(*class),
                "arguments": arguments(*class, release, intent),
            })
        })
        .collect();
    let n = scene.world.next();
    let cost = Spend::from_nano_usd(10_000 * (1 + n % 5), 1000 + n % 97, 100 + n % 31);
    json!({
        "format": release.format,
        "reply_id": format!("{}-reply-{n}", scene.world.tag),
        "cost": cost,
        "calls": calls,
    })
}

fn cost_of(value: &Value) -> Option<Spend> {
    serde_json::from_value(value.get("cost")?.clone()).ok()
}

/// One turn of the ordinary harness.
pub async fn turn(
    session: &mut Session<Message>,
    toolbox: &Toolbox,
    model: &mut Model,
    release: Release,
    classes: &[Class],
) -> TurnEnd {
    let scene = Scene::current();
    let journal = session.journal().clone();
    let mut used: HashMap<String, Spend> = HashMap::new();

    // Ask the model; a reply of another format is ignored and the model asked again.
    let mut ignored: Option<Value> = None;
    let mut asks = 0;
    let reply = loop {
        asks += 1;
        let proposal = reply(model, &scene, release, classes, ignored.as_ref());
        let answer = journal
            .model_with_spend(|| async move { Ok::<_, std::io::Error>(proposal) }, cost_of)
            .await;
        let answer = match answer {
            Ok(answer) => answer,
            Err(e) => {
                scene
                    .world
                    .tally(format!("model call refused {}", error_kind(&e)));
                return TurnEnd::Stopped(format!("asking the model: {e}"));
            }
        };
        if let (Some(id), Some(cost)) = (answer["reply_id"].as_str(), cost_of(&answer)) {
            used.insert(format!("reply {id}"), cost);
        }
        if ignored.is_some() {
            scene.world.tally("model re-asked");
        }
        if answer["format"] == json!(release.format) {
            break answer;
        }
        if asks >= MAX_ASKS {
            return TurnEnd::Stopped("the model's replies cannot be read".into());
        }
        ignored = Some(answer);
    };
    scene.after_model().await;

    let calls: Vec<ModelToolCall> = reply["calls"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            ModelToolCall::new(
                c["id"].as_str().unwrap_or_default(),
                c["name"].as_str().unwrap_or_default(),
                c["arguments"].clone(),
            )
        })
        .collect();
    let blocks = reply["calls"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            Block::tool_call(
                c["id"].as_str().unwrap_or_default(),
                c["name"].as_str().unwrap_or_default(),
                c["arguments"].clone(),
            )
        })
        .collect();
    session.push(Message::assistant(blocks));

    for call in &calls {
        let message = match toolbox.dispatch(&journal, call).await {
            Ok(result) => {
                let content = result.output.content.clone();
                if !result.output.is_error {
                    scene.world.saw_result(&content);
                    if let (Some(id), Some(cost)) = (content["call_id"].as_str(), cost_of(&content))
                    {
                        used.insert(format!("call {id}"), cost);
                    }
                }
                Message::tool_result(call.id.clone(), content, result.output.is_error)
            }
            // Every refusal goes back to the model as the call's result.
            Err(e) => {
                scene.world.tally(format!("refused {}", error_kind(&e)));
                Message::tool_result(call.id.clone(), json!({ "error": e.to_string() }), true)
            }
        };
        session.push(message);
    }

    scene.before_checkpoint().await;
    match session.checkpoint().await {
        Ok(meta) => {
            scene.world.tally("turn checkpointed");
            TurnEnd::Checkpointed {
                version: meta.version,
                used,
            }
        }
        Err(e) => {
            scene
                .world
                .tally(format!("checkpoint refused {}", error_kind(&e)));
            if e.is_awaiting_approval() {
                return TurnEnd::Awaiting;
            }
            TurnEnd::Stopped(format!("checkpoint: {e}"))
        }
    }
}

/// The error's variant, e.g. `ReplayUnsafe` or `Store(LeaseLost)`.
fn error_kind(e: &impl std::fmt::Debug) -> String {
    let text = format!("{e:?}");
    let name = |t: &str| -> String {
        t.split(|c: char| !c.is_alphanumeric() && c != '_')
            .next()
            .unwrap_or_default()
            .to_owned()
    };
    match text.strip_prefix("Store(") {
        Some(inner) => format!("Store({})", name(inner)),
        None => name(&text),
    }
}
