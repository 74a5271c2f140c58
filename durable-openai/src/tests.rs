//! The conversions, on values shaped as async-openai parses a provider's response.

use async_openai::types::chat::{
    ChatCompletionMessageToolCalls, ChatCompletionRequestMessage, ChatCompletionResponseMessage,
    CreateChatCompletionResponse,
};
use durable::{ToolArguments, ToolResult, Toolbox, durable_tool};
use serde_json::json;

use super::*;

/// Look up an item.
#[durable_tool(replay = "pure")]
async fn lookup(
    /// The item's SKU.
    sku: String,
    /// Include the price (default: no).
    with_price: Option<bool>,
) -> Result<String, std::io::Error> {
    Ok(format!("{sku} {with_price:?}"))
}

/// Track an event with free-form properties.
#[durable_tool(replay = "pure")]
async fn track(
    /// The event name.
    name: String,
    /// Any JSON: strict mode cannot express it.
    properties: Value,
) -> Result<bool, std::io::Error> {
    let _ = (name, properties);
    Ok(true)
}

fn response(message: Value) -> CreateChatCompletionResponse {
    serde_json::from_value(json!({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls", "logprobs": null}],
        "usage": {"prompt_tokens": 120, "completion_tokens": 30, "total_tokens": 150}
    }))
    .expect("a chat completion")
}

#[test]
fn a_tool_strict_mode_cannot_express_is_left_out_with_its_error_and_the_others_exported() {
    let toolbox = Toolbox::new()
        .with(lookup)
        .and_then(|t| t.with(track))
        .expect("toolbox");
    let tools = chat_tools(&toolbox);
    let names: Vec<_> = tools.tools().iter().map(|t| &t.function.name).collect();
    assert_eq!(names, ["lookup"]);
    let function = &tools.tools()[0].function;
    assert_eq!(function.strict, Some(true));
    assert_eq!(function.description.as_deref(), Some("Look up an item."));
    let parameters = function.parameters.as_ref().expect("parameters");
    assert_eq!(parameters["additionalProperties"], false);
    assert_eq!(parameters["required"], json!(["sku", "with_price"]));

    assert_eq!(tools.skipped().len(), 1);
    let skipped = tools.skipped()[0].to_string();
    assert!(skipped.contains("track"), "{skipped}");
    assert!(skipped.contains("properties"), "{skipped}");

    // As the request sends them: `{"type": "function", "function": {...}}`, the same
    // JSON as the toolbox's own strict export.
    let request = serde_json::to_value(tools.request_tools()).expect("json");
    assert_eq!(request, json!(toolbox.openai_tools().tools()));

    let all = tools.all().expect_err("one tool left out");
    assert_eq!(all.skipped.len(), 1);
}

#[test]
fn tool_calls_keep_the_raw_argument_text_so_dispatch_sees_the_duplicate_key() {
    let raw = r#"{"sku": "A-1", "sku": "B-2"}"#;
    let response = response(json!({
        "role": "assistant", "content": null,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": raw}},
            {"id": "call_2", "type": "custom", "custom_tool": {"name": "grammar", "input": "free text"}}
        ]
    }));
    let message = reply_message(&response).expect("a choice");
    let calls = tool_calls(message);
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0].id, "call_1");
    assert_eq!(calls[0].arguments, ToolArguments::Text(raw.into()));
    assert_eq!(calls[1].arguments, ToolArguments::Text("free text".into()));
    // The text check refuses what a parsed value would have hidden.
    let err = durable::json::parse_arguments(raw, &Default::default()).expect_err("duplicate");
    assert_eq!(err.path, "$.sku");
}

#[test]
fn an_empty_response_is_an_error_naming_it() {
    let mut response = response(json!({"role": "assistant", "content": "hi"}));
    response.choices.clear();
    let err = reply_message(&response).expect_err("no choice");
    assert!(err.to_string().contains("chatcmpl-1"), "{err}");
}

#[test]
fn the_assistant_message_goes_into_the_transcript_with_its_tool_calls_unchanged() {
    let message: ChatCompletionResponseMessage = serde_json::from_value(json!({
        "role": "assistant", "content": "Looking it up.",
        "tool_calls": [{"id": "call_1", "type": "function",
                        "function": {"name": "lookup", "arguments": "{\"sku\":\"A-1\"}"}}]
    }))
    .expect("message");
    let request = assistant_message(&message);
    assert_eq!(
        serde_json::to_value(&request).expect("json"),
        json!({"role": "assistant", "content": "Looking it up.",
               "tool_calls": [{"id": "call_1", "type": "function",
                               "function": {"name": "lookup", "arguments": "{\"sku\":\"A-1\"}"}}]})
    );
    let ChatCompletionRequestMessage::Assistant(assistant) = &request else {
        panic!("an assistant message: {request:?}");
    };
    let calls: Vec<_> = assistant
        .tool_calls
        .iter()
        .flatten()
        .map(tool_call)
        .collect();
    assert_eq!(calls, tool_calls(&message));
    assert!(matches!(
        assistant.tool_calls.as_deref(),
        Some([ChatCompletionMessageToolCalls::Function(_)])
    ));
}

#[test]
fn results_become_typed_tool_messages() {
    let call = ModelToolCall::new("call_9", "lookup", "{}");
    let ok = ToolResult {
        call_id: "call_9".into(),
        name: "lookup".into(),
        output: durable::ToolOutput {
            content: json!({"stock": 3}),
            is_error: false,
        },
    };
    let message: ChatCompletionRequestMessage = tool_message(&ok).into();
    assert_eq!(
        serde_json::to_value(&message).expect("json"),
        json!({"role": "tool", "tool_call_id": "call_9", "content": "{\"stock\":3}"})
    );
    let refused = ToolResult::refused(
        &call,
        &durable::DurableError::UnknownTool {
            name: "lookup".into(),
            available: "(none)".into(),
        },
    )
    .expect("a model error");
    let text = serde_json::to_value(tool_message(&refused)).expect("json");
    assert!(
        text["content"]
            .as_str()
            .is_some_and(|c| c.starts_with("{\"error\":")),
        "{text}"
    );
}

#[test]
fn usage_becomes_spend() {
    let response = response(json!({"role": "assistant", "content": "hi"}));
    let tokens = spend(&response).expect("usage");
    assert_eq!(
        (
            tokens.nano_usd(),
            tokens.input_tokens(),
            tokens.output_tokens()
        ),
        (0, 120, 30)
    );
    let priced = Pricing::nano_usd_per_token(2_500, 10_000)
        .spend(&response)
        .expect("usage");
    assert_eq!(priced.nano_usd(), 120 * 2_500 + 30 * 10_000);

    let mut without = response.clone();
    without.usage = None;
    assert_eq!(spend(&without), None);
}
