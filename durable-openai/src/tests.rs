//! The conversions, on values shaped as async-openai parses a provider's response.

use async_openai::types::chat::{
    ChatCompletionMessageToolCalls, ChatCompletionRequestMessage, ChatCompletionResponseMessage,
    CreateChatCompletionResponse,
};
use std::sync::atomic::{AtomicUsize, Ordering};

use durable::{
    Durable, Session, SessionId, StartOptions, ToolArguments, ToolResult, Toolbox, durable_tool,
};
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
    assert_eq!(calls[1].name, "custom:grammar");
    // The text check refuses what a parsed value would have hidden.
    let err = durable::json::parse_arguments(raw, &Default::default()).expect_err("duplicate");
    assert_eq!(err.path, "$.sku");
}

#[test]
fn an_empty_response_is_an_error_naming_it() {
    let mut response = response(json!({"role": "assistant", "content": "hi"}));
    response.choices.clear();
    let err = reply_message(&response).expect_err("no choice");
    assert!(matches!(err, ReplyError::Empty(_)), "{err:?}");
    assert!(err.to_string().contains("chatcmpl-1"), "{err}");
    assert!(err.to_string().contains("within the same turn"), "{err}");
}

static RAN: AtomicUsize = AtomicUsize::new(0);

/// Email someone (counts its runs).
#[durable_tool(replay = "pure")]
async fn send_email(to: String) -> Result<String, std::io::Error> {
    RAN.fetch_add(1, Ordering::SeqCst);
    Ok(format!("sent to {to}"))
}

/// Track an event (counts its runs; strict mode cannot express it).
#[durable_tool(replay = "pure")]
async fn track_event(name: String, properties: Value) -> Result<bool, std::io::Error> {
    let _ = (name, properties);
    RAN.fetch_add(100, Ordering::SeqCst);
    Ok(true)
}

async fn session(dir: &tempfile::TempDir, id: &str) -> Session<ChatCompletionRequestMessage> {
    let url = format!("sqlite:{}", dir.path().join("s.db").display());
    let store = durable::connect(&url).await.expect("store");
    let durable = Durable::builder(store).owner("test").build();
    let start = StartOptions::<ChatCompletionRequestMessage>::new().with_id(SessionId::new(id));
    durable
        .start_or_resume(start)
        .await
        .expect("session")
        .session
}

#[tokio::test]
async fn a_custom_call_named_like_a_function_tool_never_runs_it_and_offered_dispatch_refuses_the_skipped()
 {
    let dir = tempfile::tempdir().expect("tempdir");
    let session = session(&dir, "s1").await;
    let toolbox = Toolbox::new()
        .with(send_email)
        .and_then(|t| t.with(track_event))
        .expect("toolbox");
    let tools = chat_tools(&toolbox);
    assert!(tools.offers("send_email"));
    assert!(
        !tools.offers("track_event"),
        "strict mode cannot express it"
    );

    let response = response(json!({
        "role": "assistant", "content": null,
        "tool_calls": [
            {"id": "call_c", "type": "custom",
             "custom_tool": {"name": "send_email", "input": "{\"to\":\"mallory@example.com\"}"}},
            {"id": "call_t", "type": "function",
             "function": {"name": "track_event", "arguments": "{\"name\":\"x\",\"properties\":{}}"}},
            {"id": "call_e", "type": "function",
             "function": {"name": "send_email", "arguments": "{\"to\":\"ann@example.com\"}"}}
        ]
    }));
    let calls = tool_calls(reply_message(&response).expect("a choice"));

    // The custom call reaches no registered tool, even through the toolbox itself.
    let direct = toolbox.dispatch_all(session.journal(), &calls[..1]).await;
    assert!(
        matches!(&direct[0], Err(DurableError::UnknownTool { name, .. }) if name == "custom:send_email"),
        "{direct:?}"
    );
    assert_eq!(
        RAN.load(Ordering::SeqCst),
        0,
        "the custom call ran the function tool"
    );

    // Only the offered tools run; the others are unknown, listing only what is offered.
    let outcomes = tools
        .dispatch_all(&toolbox, session.journal(), &calls)
        .await;
    assert_eq!(outcomes.len(), 3);
    for (outcome, name) in outcomes[..2]
        .iter()
        .zip(["custom:send_email", "track_event"])
    {
        let Err(
            error @ DurableError::UnknownTool {
                name: called,
                available,
            },
        ) = outcome
        else {
            panic!("refused as unknown: {outcome:?}");
        };
        assert_eq!((called.as_str(), available.as_str()), (name, "send_email"));
        let text = ToolResult::refused(&calls[0], error)
            .expect("a model error")
            .content_text();
        assert!(
            !text.contains("track_event") || name == "track_event",
            "{text}"
        );
    }
    let sent = outcomes[2].as_ref().expect("the offered tool runs");
    assert!(sent.content_text().contains("ann@example.com"));
    assert_eq!(RAN.load(Ordering::SeqCst), 1, "only the offered call ran");
}

#[test]
fn an_empty_tool_call_list_is_not_sent_back_and_no_tools_is_none() {
    let message: ChatCompletionResponseMessage = serde_json::from_value(json!({
        "role": "assistant", "content": "done", "tool_calls": []
    }))
    .expect("message");
    assert_eq!(
        serde_json::to_value(assistant_message(&message)).expect("json"),
        json!({"role": "assistant", "content": "done"})
    );

    let toolbox = Toolbox::new().with(track).expect("toolbox");
    let tools = chat_tools(&toolbox);
    assert_eq!(tools.skipped().len(), 1);
    assert_eq!(
        tools.request_tools(),
        None,
        "an empty `tools` list is refused"
    );
}

#[test]
fn a_reply_with_only_the_deprecated_function_call_is_an_error() {
    let response = response(json!({
        "role": "assistant", "content": null,
        "function_call": {"name": "lookup", "arguments": "{}"}
    }));
    let err = reply_message(&response).expect_err("deprecated function_call");
    assert!(
        matches!(&err, ReplyError::DeprecatedFunctionCall { name, .. } if name == "lookup"),
        "{err:?}"
    );
    assert!(err.to_string().contains("`tools`"), "{err}");
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
        &DurableError::UnknownTool {
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

    // Cached prompt tokens: full price by default (an upper bound), their own price
    // when given.
    let mut cached = response.clone();
    let usage: CompletionUsage = serde_json::from_value(json!({
        "prompt_tokens": 1_000, "completion_tokens": 10, "total_tokens": 1_010,
        "prompt_tokens_details": {"cached_tokens": 900}
    }))
    .expect("usage");
    cached.usage = Some(usage);
    let full = Pricing::nano_usd_per_token(2_500, 10_000);
    assert_eq!(
        full.spend(&cached).expect("usage").nano_usd(),
        1_000 * 2_500 + 10 * 10_000
    );
    let discounted = full.with_cached_input(1_250).spend(&cached).expect("usage");
    assert_eq!(
        discounted.nano_usd(),
        100 * 2_500 + 900 * 1_250 + 10 * 10_000
    );
    assert_eq!(discounted.input_tokens(), 1_000);

    let mut without = response.clone();
    without.usage = None;
    assert_eq!(spend(&without), None);
}
