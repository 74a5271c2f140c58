//! What the model wrapper, the tools and the call-id hook of one binding share.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard, PoisonError};

use durable_core::DurableError;
use durable_core::toolbox::{ModelToolCall, ToolArguments};
use rig_core::completion::CompletionResponse;
use rig_core::effect::EffectId;
use rig_core::message::AssistantContent;
use serde_json::{Map, Value};

/// One tool call of the last journaled reply, as rig read it and as the provider sent it.
#[derive(Debug)]
struct PendingCall {
    /// The tool's name.
    name: String,
    /// The arguments rig read (and dispatches, unless a hook rewrites them).
    read: Map<String, Value>,
    /// The arguments as the provider sent them, when the reply's document holds them.
    sent: Option<ToolArguments>,
}

#[derive(Debug, Default)]
pub(crate) struct Shared {
    /// The model's call id of each tool dispatch rig announced, by effect id.
    call_ids: Mutex<HashMap<u64, String>>,
    /// The tool calls of the last journaled reply, by call id, in reply order (a
    /// provider may repeat an id within a reply).
    calls: Mutex<HashMap<String, VecDeque<PendingCall>>>,
    /// The runtime error that stopped the last run.
    error: Mutex<Option<DurableError>>,
    /// The tools of the binding's toolbox that have secret arguments.
    secret_tools: BTreeSet<String>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What a reply keeps of malformed arguments to a tool with secret arguments: the text
/// may hold a secret where no argument name says so, and is never journaled.
pub(crate) const WITHHELD: &str =
    "[durable: malformed arguments to a tool with secret arguments, withheld]";

impl Shared {
    pub(crate) fn new(secret_tools: BTreeSet<String>) -> Self {
        Shared {
            secret_tools,
            ..Shared::default()
        }
    }

    /// Replaces the malformed argument text rig keeps (`invalid_arguments`) of each call
    /// to a tool with secret arguments with [`WITHHELD`], before the reply is journaled.
    /// (The provider's document, `raw`, is masked by durable's vault.)
    pub(crate) fn withhold_invalid_arguments(&self, response: &mut CompletionResponse) {
        for content in &mut response.choice {
            if let AssistantContent::ToolCall(call) = content
                && self
                    .secret_tools
                    .contains(call.function.name.as_ref() as &str)
                && call.function.invalid_arguments.is_some()
            {
                call.function.invalid_arguments = Some(WITHHELD.to_owned());
            }
        }
    }

    pub(crate) fn note_call_id(&self, effect: EffectId, call_id: String) {
        lock(&self.call_ids).insert(effect.as_u64(), call_id);
    }

    pub(crate) fn take_call_id(&self, effect: EffectId) -> Option<String> {
        lock(&self.call_ids).remove(&effect.as_u64())
    }

    /// The arguments to dispatch for the call `call_id` to `name`, which rig dispatches
    /// with `rig_args`: the text the provider sent when rig dispatches what it read from
    /// that text (so durable's checks, duplicate keys and all, apply to the model's own
    /// text); rig's arguments when a hook rewrote them, or when the call is not one of
    /// the last reply's.
    pub(crate) fn arguments(&self, call_id: &str, name: &str, rig_args: String) -> ToolArguments {
        let pending = {
            let mut calls = lock(&self.calls);
            let pending = calls.get_mut(call_id).and_then(VecDeque::pop_front);
            if calls.get(call_id).is_some_and(VecDeque::is_empty) {
                calls.remove(call_id);
            }
            pending
        };
        let Ok(Value::Object(dispatched)) = serde_json::from_str::<Value>(&rig_args) else {
            return ToolArguments::Text(rig_args);
        };
        match pending {
            Some(call) if call.name == name && call.read == dispatched => match call.sent {
                // rig reads blank text as `{}`.
                Some(ToolArguments::Text(text)) if text.trim().is_empty() => {
                    ToolArguments::Text("{}".to_owned())
                }
                Some(sent) => sent,
                None => ToolArguments::Text(rig_args),
            },
            // Rewritten by a hook (or unknown): what rig dispatches.
            _ => ToolArguments::Json(Value::Object(dispatched)),
        }
    }

    /// Notes the tool calls of a journaled reply (forgetting the previous reply's): rig's
    /// reading of each, and the arguments the provider sent, from its document: Chat
    /// Completions (`choices[0].message.tool_calls[]`, the choice rig reads), Responses
    /// (`output[]` `function_call` items) or Anthropic Messages (`content[]` `tool_use`
    /// blocks).
    pub(crate) fn note_reply(&self, response: &CompletionResponse) {
        let raw = &response.raw;
        let chat = raw
            .pointer("/choices/0/message/tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(ModelToolCall::from_openai);
        let responses = raw
            .get("output")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|item| item.get("type").and_then(Value::as_str) == Some("function_call"))
            .filter_map(ModelToolCall::from_openai);
        let anthropic = raw
            .get("content")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(ModelToolCall::from_anthropic);
        let mut sent: Vec<Option<ModelToolCall>> =
            chat.chain(responses).chain(anthropic).map(Some).collect();
        let mut calls: HashMap<String, VecDeque<PendingCall>> = HashMap::new();
        for content in &response.choice {
            let AssistantContent::ToolCall(call) = content else {
                continue;
            };
            let id = call.id.to_string();
            let name = call.function.name.to_string();
            // The first of the document's calls with this id and name not yet taken.
            let sent = sent
                .iter_mut()
                .find(|c| c.as_ref().is_some_and(|c| c.id == id && c.name == name))
                .and_then(Option::take)
                .map(|c| c.arguments);
            calls.entry(id).or_default().push_back(PendingCall {
                name,
                read: call.function.arguments.clone(),
                sent,
            });
        }
        *lock(&self.calls) = calls;
    }

    pub(crate) fn stopped(&self, error: DurableError) {
        *lock(&self.error) = Some(error);
    }

    pub(crate) fn take_error(&self) -> Option<DurableError> {
        lock(&self.error).take()
    }
}
