//! What the model wrapper, the tools and the call-id hook of one binding share.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use durable_core::DurableError;
use durable_core::toolbox::{ModelToolCall, ToolArguments};
use rig_core::effect::EffectId;
use serde_json::Value;

#[derive(Debug, Default)]
pub(crate) struct Shared {
    /// The model's call id of each tool dispatch rig announced, by effect id.
    call_ids: Mutex<HashMap<u64, String>>,
    /// The arguments of each tool call of the journaled replies, as the provider sent
    /// them, by call id.
    raw_arguments: Mutex<HashMap<String, ToolArguments>>,
    /// The runtime error that stopped the last run.
    error: Mutex<Option<DurableError>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    pub(crate) fn note_call_id(&self, effect: EffectId, call_id: String) {
        lock(&self.call_ids).insert(effect.as_u64(), call_id);
    }

    pub(crate) fn take_call_id(&self, effect: EffectId) -> Option<String> {
        lock(&self.call_ids).remove(&effect.as_u64())
    }

    pub(crate) fn raw_arguments(&self, call_id: &str) -> Option<ToolArguments> {
        lock(&self.raw_arguments).get(call_id).cloned()
    }

    /// Notes the tool calls of a provider document: Chat Completions
    /// (`choices[].message.tool_calls[]`), Responses (`output[]` `function_call` items)
    /// or Anthropic Messages (`content[]` `tool_use` blocks).
    pub(crate) fn note_reply(&self, raw: &Value) {
        let chat = raw
            .get("choices")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|choice| choice.pointer("/message/tool_calls")?.as_array())
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
        let mut map = lock(&self.raw_arguments);
        for call in chat.chain(responses).chain(anthropic) {
            map.insert(call.id, call.arguments);
        }
    }

    pub(crate) fn stopped(&self, error: DurableError) {
        *lock(&self.error) = Some(error);
    }

    pub(crate) fn take_error(&self) -> Option<DurableError> {
        lock(&self.error).take()
    }
}
