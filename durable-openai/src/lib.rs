//! Typed adapters between `durable` and [async-openai]'s Chat Completions types, for an
//! agent that talks to an OpenAI-compatible provider without a framework.
//!
//! One function per conversion; nothing here talks to the network (the crate
//! depends on async-openai's types only, so it adds no HTTP client and no TLS):
//!
//! | from | to | with |
//! |---|---|---|
//! | a [`Toolbox`] (strict dialect) | [`ChatCompletionTool`]s, plus the tools strict mode cannot express | [`chat_tools`] → [`ChatTools`] |
//! | a [`CreateChatCompletionResponse`] | its first choice's message | [`reply_message`] |
//! | an assistant [`ChatCompletionResponseMessage`] | [`ModelToolCall`]s, from the **raw argument text** | [`tool_calls`] |
//! | a [`ToolResult`] | a [`ChatCompletionRequestToolMessage`] | [`tool_message`] |
//! | an assistant [`ChatCompletionResponseMessage`] | a [`ChatCompletionRequestMessage`] for the transcript | [`assistant_message`] |
//! | a response's [`CompletionUsage`] | a [`Spend`] for `model_with_spend` | [`spend`], [`Pricing::spend`] |
//!
//! # A turn
//!
//! The session's message type is async-openai's own [`ChatCompletionRequestMessage`]
//! (any `Serialize + DeserializeOwned` type can be), so the transcript is the request.
//! The whole [`CreateChatCompletionResponse`] is journaled by `model_with_spend`: a
//! re-run turn gets it back from the journal and the provider is not asked again.
//!
//! ```no_run
//! use async_openai::config::OpenAIConfig;
//! use async_openai::types::chat::{ChatCompletionRequestMessage, CreateChatCompletionRequest};
//! use durable_core::{Session, Toolbox, ToolResult};
//!
//! # async fn turn(
//! #     session: &mut Session<ChatCompletionRequestMessage>,
//! #     toolbox: &Toolbox,
//! #     chat: impl AsyncFn(CreateChatCompletionRequest)
//! #         -> Result<async_openai::types::chat::CreateChatCompletionResponse, async_openai::error::OpenAIError>,
//! # ) -> Result<(), Box<dyn std::error::Error>> {
//! let tools = durable_openai::chat_tools(toolbox); // strict mode; `tools.skipped()` says what is left out
//! let request = CreateChatCompletionRequest {
//!     model: "gpt-4o-mini".into(),
//!     messages: session.messages().to_vec(),
//!     tools: Some(tools.request_tools()),
//!     ..Default::default()
//! };
//! // `chat` is `|r| client.chat().create(r)` with async-openai's client.
//! let response = session
//!     .journal()
//!     .with_model_name("gpt-4o-mini")
//!     .model_with_spend(|| chat(request), durable_openai::spend)
//!     .await?;
//! let reply = durable_openai::reply_message(&response)?;
//! let calls = durable_openai::tool_calls(reply); // raw argument text: duplicate keys caught
//! session.push(durable_openai::assistant_message(reply));
//! for (call, outcome) in calls.iter().zip(toolbox.dispatch_all(session.journal(), &calls).await) {
//!     // Unknown tool or bad arguments: an error result the model reads. Anything else
//!     // (a call in doubt, a store failure) stops the harness.
//!     let result = outcome.or_else(|e| ToolResult::refused(call, &e).ok_or(e))?;
//!     session.push(durable_openai::tool_message(&result).into());
//! }
//! session.checkpoint().await?;
//! # Ok(()) }
//! ```
//!
//! `examples/openai_agent.rs` runs a whole agent this way against a local
//! OpenAI-compatible server, and `tests/crash.rs` kills it mid-turn.
//!
//! # Why the raw argument text
//!
//! OpenAI sends a call's arguments as a JSON *string*. [`tool_calls`] hands that text to
//! the toolbox as [`ToolArguments::Text`], which is checked by
//! [`parse_arguments`](durable_core::args::parse_arguments) before anything is
//! journaled. Parsing it into a `serde_json::Value` first (as
//! `serde_json::from_str(&call.function.arguments)` would) silently drops what that
//! check exists to refuse: `{"to": "ann", "to": "mallory"}` becomes `{"to": "mallory"}`,
//! and the journal and the tool could disagree about what was asked.
//!
//! # Anthropic `tool_use`: the input arrives parsed
//!
//! Anthropic's Messages API sends a tool call's `input` as a JSON object, and client
//! libraries hand it over already parsed (a `serde_json::Value`). Dispatched as
//! [`ToolArguments::Json`] it goes through
//! [`check_value`](durable_core::args::check_value), which still refuses nesting deeper
//! than the limit, documents above the size limit and integers beyond ±(2^53−1) *as
//! parsed*, but cannot see what parsing already erased:
//!
//! | raw-text check ([`parse_arguments`](durable_core::args::parse_arguments)) | on a parsed `Value` |
//! |---|---|
//! | a key twice (`{"to": "a", "to": "b"}`, compared decoded) | **lost**: the parser kept one (serde_json the last); the call runs with it |
//! | `NaN`, `Infinity`, a literal such as `1e400` | **lost** or refused earlier: `serde_json` refuses them while parsing, so the client's parse fails first, with the client's error, not an [`ArgumentError`](durable_core::ArgumentError) naming the path |
//! | an integer literal beyond ±(2^53−1) | **partly**: one that fits `u64`/`i64` is still refused; a larger one (`18446744073709551616`) became a float while parsing, its exact value is gone, and it passes as that float |
//! | the number's exact text (`1.0` vs `1`, `1e2` vs `100`) | **lost**, and harmless for the hash (canonical JSON writes both alike) |
//! | a lone surrogate (`"\uD800"`) | **lost**: refused by `serde_json` while parsing (the client's error), or replaced by the client's own parser |
//! | size (bytes of text) and depth | kept: measured on the value's compact form |
//!
//! Where the client gives you the text, use it:
//!
//! - **The raw HTTP body.** If you call the Messages API yourself, read each `tool_use`
//!   block's `input` as text (a `Box<serde_json::value::RawValue>` field, with
//!   serde_json's `raw_value` feature, keeps it verbatim)
//!   and dispatch `ModelToolCall::new(id, name, ToolArguments::Text(raw.get().into()))`.
//! - **Streaming.** With `stream: true`, a `tool_use` block's input arrives as
//!   `input_json_delta` events whose `partial_json` strings, concatenated in order, are
//!   the raw text of the input: dispatch that string as [`ToolArguments::Text`].
//!
//! Otherwise [`ModelToolCall::from_anthropic`] takes the parsed block, and the checks in
//! the table's "kept" rows still apply. Journal the reply with `model` either way: a
//! re-run turn replays it, with the same arguments.
//!
//! [async-openai]: https://docs.rs/async-openai

use async_openai::types::chat::{
    ChatCompletionMessageToolCalls, ChatCompletionRequestAssistantMessage,
    ChatCompletionRequestAssistantMessageAudio, ChatCompletionRequestAssistantMessageContent,
    ChatCompletionRequestMessage, ChatCompletionRequestToolMessage,
    ChatCompletionRequestToolMessageContent, ChatCompletionResponseMessage, ChatCompletionTool,
    ChatCompletionTools, CompletionUsage, CreateChatCompletionResponse, FunctionObject,
};
use durable_core::schema::{self, SchemaError};
use durable_core::toolbox::IncompleteExport;
use durable_core::{ModelToolCall, Spend, ToolArguments, ToolResult, Toolbox};
use serde_json::Value;

/// async-openai, as this crate sees it (its Chat Completions types). Add `async-openai`
/// with the `chat-completion` feature to your own manifest for its client.
pub use async_openai;

/// A toolbox's tools as typed Chat Completions definitions (strict mode), and the tools
/// strict mode cannot express.
///
/// One tool strict mode cannot express (a free `serde_json::Value` argument, a map)
/// does not cost the others: it is left out of [`tools`](Self::tools) and listed in
/// [`skipped`](Self::skipped) with a [`SchemaError`] naming the tool, the schema node and
/// what to change. The model never hears of it. Check `skipped` once at startup, or
/// refuse a partial export with [`all`](Self::all).
///
/// ```no_run
/// # fn demo(toolbox: &durable_core::Toolbox) -> Result<(), durable_core::toolbox::IncompleteExport> {
/// let tools = durable_openai::chat_tools(toolbox);
/// for skipped in tools.skipped() {
///     eprintln!("not offered to the model: {skipped}");
/// }
/// // `CreateChatCompletionRequest::tools`:
/// let request_tools = tools.request_tools();
/// // Or every tool, or an error listing each one left out:
/// let every_tool = durable_openai::chat_tools(toolbox).all()?;
/// # let _ = (request_tools, every_tool); Ok(()) }
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
#[must_use = "a tool strict mode cannot express is only reported in `skipped()`"]
pub struct ChatTools {
    tools: Vec<ChatCompletionTool>,
    skipped: Vec<SchemaError>,
}

impl ChatTools {
    /// The exported definitions, in name order.
    pub fn tools(&self) -> &[ChatCompletionTool] {
        &self.tools
    }

    /// The tools left out, each with why (in name order).
    pub fn skipped(&self) -> &[SchemaError] {
        &self.skipped
    }

    /// The exported definitions as `CreateChatCompletionRequest::tools` takes them.
    pub fn request_tools(&self) -> Vec<ChatCompletionTools> {
        self.tools
            .iter()
            .cloned()
            .map(ChatCompletionTools::Function)
            .collect()
    }

    /// The exported definitions, leaving out the skipped tools.
    pub fn into_tools(self) -> Vec<ChatCompletionTool> {
        self.tools
    }

    /// Every tool's definition.
    ///
    /// # Errors
    /// [`IncompleteExport`], listing every tool strict mode cannot express.
    pub fn all(self) -> Result<Vec<ChatCompletionTool>, IncompleteExport> {
        if self.skipped.is_empty() {
            Ok(self.tools)
        } else {
            Err(IncompleteExport {
                skipped: self.skipped,
            })
        }
    }
}

/// The toolbox's tools as Chat Completions function tools, strict mode
/// ([`schema::openai_function`]: every property required, optional ones nullable,
/// `additionalProperties: false`), in name order; see [`ChatTools`] for the tools left
/// out.
pub fn chat_tools(toolbox: &Toolbox) -> ChatTools {
    let mut out = ChatTools::default();
    for spec in toolbox.specs() {
        match schema::openai_function(spec) {
            Ok(definition) => {
                // `{"type": "function", "function": {name, description, parameters, strict}}`,
                // read field by field: the name is the spec's, the rest as exported.
                let function = definition.get("function");
                let field = |name: &str| function.and_then(|f| f.get(name));
                out.tools.push(ChatCompletionTool {
                    function: FunctionObject {
                        name: spec.name.clone(),
                        description: field("description")
                            .and_then(Value::as_str)
                            .map(str::to_owned),
                        parameters: field("parameters").cloned(),
                        strict: field("strict").and_then(Value::as_bool),
                    },
                });
            }
            Err(error) => out.skipped.push(error),
        }
    }
    out
}

/// A response that holds no choice: the provider answered, but with no message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the chat completion `{id}` holds no choice; ask the model again (the empty response is journaled at its position in the turn, and the next model call takes the next position, so it is asked anew)"
)]
pub struct EmptyResponse {
    /// The response's id.
    pub id: String,
}

/// The message of the response's first choice (an agent asks for one choice, `n = 1`).
///
/// # Errors
/// [`EmptyResponse`] when `choices` is empty.
pub fn reply_message(
    response: &CreateChatCompletionResponse,
) -> Result<&ChatCompletionResponseMessage, EmptyResponse> {
    response
        .choices
        .first()
        .map(|choice| &choice.message)
        .ok_or_else(|| EmptyResponse {
            id: response.id.clone(),
        })
}

/// The tool calls an assistant message asks for, in order, each with its arguments as
/// the **raw text** the model sent ([`ToolArguments::Text`]), so the toolbox checks
/// them before anything is journaled (duplicate keys, NaN, integers beyond ±(2^53−1)):
/// see the [crate docs](crate#why-the-raw-argument-text).
///
/// The deprecated single `function_call` field (it has no call id) is not read. See
/// [`tool_call`] for custom tools.
///
/// ```
/// use async_openai::types::chat::ChatCompletionResponseMessage;
/// use durable_core::ToolArguments;
///
/// let message: ChatCompletionResponseMessage = serde_json::from_str(r#"{
///     "role": "assistant",
///     "tool_calls": [{"id": "call_1", "type": "function",
///                     "function": {"name": "send_email", "arguments": "{\"to\":\"ann\",\"to\":\"bob\"}"}}]
/// }"#)?;
/// let calls = durable_openai::tool_calls(&message);
/// assert_eq!(calls[0].name, "send_email");
/// // The text as sent, duplicate key and all: dispatch refuses it.
/// assert_eq!(calls[0].arguments, ToolArguments::Text(r#"{"to":"ann","to":"bob"}"#.into()));
/// # Ok::<(), serde_json::Error>(())
/// ```
pub fn tool_calls(message: &ChatCompletionResponseMessage) -> Vec<ModelToolCall> {
    message.tool_calls.iter().flatten().map(tool_call).collect()
}

/// One tool call of an assistant message (response or request), arguments as raw text.
///
/// A custom tool call (free-text input, not JSON) becomes a call with its input as the
/// argument text: a toolbox of `#[durable_tool]`s exports function tools only, so it is
/// refused at dispatch ([`UnknownTool`](durable_core::DurableError::UnknownTool) or
/// [`InvalidArguments`](durable_core::DurableError::InvalidArguments)), an error result
/// the model can read.
pub fn tool_call(call: &ChatCompletionMessageToolCalls) -> ModelToolCall {
    match call {
        ChatCompletionMessageToolCalls::Function(call) => ModelToolCall::new(
            call.id.clone(),
            call.function.name.clone(),
            ToolArguments::Text(call.function.arguments.clone()),
        ),
        ChatCompletionMessageToolCalls::Custom(call) => ModelToolCall::new(
            call.id.clone(),
            call.custom_tool.name.clone(),
            ToolArguments::Text(call.custom_tool.input.clone()),
        ),
    }
}

/// The tool message answering one call: `{"role": "tool", "tool_call_id", "content"}`,
/// the content as text (a JSON string as is, anything else as compact JSON; a refused
/// call's `{"error": "…"}`). Push it with `.into()` (a [`ChatCompletionRequestMessage`]).
///
/// Chat Completions has no error flag on a tool message: a failed tool's content says
/// so itself (the toolbox writes it as the tool's error, or `{"error": …}`).
pub fn tool_message(result: &ToolResult) -> ChatCompletionRequestToolMessage {
    ChatCompletionRequestToolMessage {
        content: ChatCompletionRequestToolMessageContent::Text(result.content_text()),
        tool_call_id: result.call_id.clone(),
    }
}

/// The assistant's reply as the request message that carries it in the transcript:
/// its text, refusal, tool calls (their argument text unchanged) and audio id.
pub fn assistant_message(message: &ChatCompletionResponseMessage) -> ChatCompletionRequestMessage {
    ChatCompletionRequestMessage::Assistant(ChatCompletionRequestAssistantMessage {
        content: message
            .content
            .clone()
            .map(ChatCompletionRequestAssistantMessageContent::Text),
        refusal: message.refusal.clone(),
        audio: message
            .audio
            .as_ref()
            .map(|audio| ChatCompletionRequestAssistantMessageAudio {
                id: audio.id.clone(),
            }),
        tool_calls: message.tool_calls.clone(),
        ..Default::default()
    })
}

/// The response's token usage as a [`Spend`] with no cost (tokens only), for
/// `model_with_spend(.., durable_openai::spend)`; `None` when the provider reported no
/// usage. Use [`Pricing::spend`] to charge a budget in dollars.
pub fn spend(response: &CreateChatCompletionResponse) -> Option<Spend> {
    Pricing::default().spend(response)
}

/// What a model's tokens cost, in nano-dollars per token (exact integers: $2.50 per
/// million tokens is 2 500 nano-dollars per token).
///
/// ```
/// use async_openai::types::chat::CompletionUsage;
/// use durable_openai::Pricing;
///
/// // $0.15 / 1M input tokens, $0.60 / 1M output tokens.
/// let pricing = Pricing::nano_usd_per_token(150, 600);
/// let usage = CompletionUsage { prompt_tokens: 1_000, completion_tokens: 100, total_tokens: 1_100,
///                               ..Default::default() };
/// let spend = pricing.spend_of(&usage);
/// assert_eq!(spend.nano_usd(), 1_000 * 150 + 100 * 600);
/// assert_eq!((spend.input_tokens(), spend.output_tokens()), (1_000, 100));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pricing {
    input: u64,
    output: u64,
}

impl Pricing {
    /// A price per input (prompt) token and per output (completion) token, in
    /// nano-dollars (USD per million tokens × 1000).
    pub const fn nano_usd_per_token(input: u64, output: u64) -> Self {
        Pricing { input, output }
    }

    /// The spend of one usage report (saturating at `u64::MAX` nano-dollars).
    pub fn spend_of(&self, usage: &CompletionUsage) -> Spend {
        let input = u64::from(usage.prompt_tokens);
        let output = u64::from(usage.completion_tokens);
        let cost = input
            .saturating_mul(self.input)
            .saturating_add(output.saturating_mul(self.output));
        Spend::from_nano_usd(cost, input, output)
    }

    /// The spend of a response, for `model_with_spend(.., |r| pricing.spend(r))`; `None`
    /// when it reports no usage.
    pub fn spend(&self, response: &CreateChatCompletionResponse) -> Option<Spend> {
        response.usage.as_ref().map(|usage| self.spend_of(usage))
    }
}

#[cfg(test)]
mod tests;
