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
//! | a response's [`CompletionUsage`] | a [`Usage`] (model, input, output and cached tokens) for `model_with_usage`, priced by the runtime's price table | [`usage`], [`stream_usage`] |
//! | a response's [`CompletionUsage`] | a [`Spend`] for `model_with_spend` | [`spend`], [`Pricing::spend`] |
//! | a `429`'s headers or message | how long the fleet waits, for `Journal::report_throttle` | [`retry_after`], [`retry_after_in_message`] |
//! | `create_stream`'s chunks | the response a `create` returns, for `model_stream` | [`StreamedCompletion`] |
//! | Anthropic's streamed Messages events (raw SSE) | the reply, tool inputs as raw text | [`anthropic`] |
//!
//! With the `client` feature, `DurableClient` wraps async-openai's HTTP client so
//! that an agent written against it keeps its turn loop: its chat `create` and
//! `create_stream` go through the session's journal (see its docs; the README counts
//! the lines an agent changes).
//!
//! # A turn
//!
//! The session's message type is async-openai's own [`ChatCompletionRequestMessage`]
//! (any `Serialize + DeserializeOwned` type can be), so the transcript is the request.
//! The whole [`CreateChatCompletionResponse`] is journaled by `model_with_usage`: a
//! re-run turn gets it back from the journal and the provider is not asked again.
//!
//! An empty response (`choices: []`, which some compatible providers send with HTTP 200)
//! is journaled too, so the turn asks again in a bounded loop rather than failing: the
//! journal keys model replies by their position in the turn, so each new ask is a new
//! position, and a re-run turn replays the empty replies and the good one in order.
//! Failing on the first empty reply instead would replay that same empty reply on every
//! resume, and the session could never move on.
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
//!     tools: tools.request_tools(), // `None` when no tool is offered
//!     ..Default::default()
//! };
//! // `chat` is `|r| client.chat().create(r)` with async-openai's client.
//! // An empty response is journaled like any other: ask again, a bounded number of times.
//! let mut attempts = 0;
//! let response = loop {
//!     attempts += 1;
//!     let response = session
//!         .journal()
//!         .with_model_name("gpt-4o-mini")
//!         .with_rate_limit("openai:gpt-4o-mini") // waits its turn with the whole fleet
//!         .model_with_usage(|| chat(request.clone()), durable_openai::usage)
//!         .await?;
//!     match durable_openai::reply_message(&response) {
//!         Err(durable_openai::ReplyError::Empty(_)) if attempts < 3 => continue,
//!         Err(e) => return Err(e.into()),
//!         Ok(_) => break response,
//!     }
//! };
//! let reply = durable_openai::reply_message(&response)?;
//! let calls = durable_openai::tool_calls(reply); // raw argument text: duplicate keys caught
//! session.push(durable_openai::assistant_message(reply));
//! // Only the offered tools run: a call to a skipped tool is refused as unknown.
//! for (call, outcome) in calls.iter().zip(tools.dispatch_all(toolbox, session.journal(), &calls).await) {
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
//!   the raw text of the input: [`anthropic::StreamedMessage`] folds the raw SSE events
//!   into the reply that way (journal it with `model_stream`), and its
//!   [`tool_calls`](anthropic::StreamedMessage::tool_calls) dispatch that text as
//!   [`ToolArguments::Text`].
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
use durable_core::{
    DurableError, Journal, ModelToolCall, Spend, ToolArguments, ToolResult, Toolbox, Usage,
};
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
/// what to change. Check `skipped` once at startup, or refuse a partial export with
/// [`all`](Self::all).
///
/// A skipped tool is not in the request, but it is still registered in the toolbox:
/// `Toolbox::dispatch_all` would run a call to it (a model can name a tool it was not
/// offered), and its unknown-tool error lists every registered tool, skipped ones
/// included. Dispatch with [`ChatTools::dispatch_all`] instead: it runs only the
/// offered tools ([`offers`](Self::offers)) and refuses any other call as an unknown
/// tool, listing only the offered names.
///
/// ```no_run
/// # fn demo(toolbox: &durable_core::Toolbox) -> Result<(), durable_core::toolbox::IncompleteExport> {
/// let tools = durable_openai::chat_tools(toolbox);
/// for skipped in tools.skipped() {
///     eprintln!("not offered to the model: {skipped}");
/// }
/// // `CreateChatCompletionRequest::tools`:
/// let request_tools = tools.request_tools(); // `None` when every tool is skipped
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

    /// The exported definitions as `CreateChatCompletionRequest::tools` takes them;
    /// `None` when there is none (OpenAI refuses an empty `tools` list).
    pub fn request_tools(&self) -> Option<Vec<ChatCompletionTools>> {
        if self.tools.is_empty() {
            return None;
        }
        Some(
            self.tools
                .iter()
                .cloned()
                .map(ChatCompletionTools::Function)
                .collect(),
        )
    }

    /// Whether a tool of this name is offered to the model (exported, not skipped).
    pub fn offers(&self, name: &str) -> bool {
        self.tools.iter().any(|tool| tool.function.name == name)
    }

    /// Dispatches one turn's calls like `Toolbox::dispatch_all` (results in the order of
    /// `calls`, one per call), but only to the offered tools: a call naming any other
    /// tool (a skipped one, one not registered, a [custom tool call](tool_call)) runs
    /// nothing, journals nothing, and is
    /// [`UnknownTool`](DurableError::UnknownTool) listing only the offered names, an
    /// error result the model reads (`ToolResult::refused`).
    pub async fn dispatch_all(
        &self,
        toolbox: &Toolbox,
        journal: &Journal,
        calls: &[ModelToolCall],
    ) -> Vec<Result<ToolResult, DurableError>> {
        let offered: Vec<ModelToolCall> = calls
            .iter()
            .filter(|call| self.offers(&call.name))
            .cloned()
            .collect();
        let mut outcomes = toolbox.dispatch_all(journal, &offered).await.into_iter();
        calls
            .iter()
            .map(|call| {
                let unknown = || Err(self.unknown_tool(&call.name));
                if self.offers(&call.name) {
                    outcomes.next().unwrap_or_else(unknown)
                } else {
                    unknown()
                }
            })
            .collect()
    }

    fn unknown_tool(&self, name: &str) -> DurableError {
        let name = match name.char_indices().nth(64) {
            None => name.to_owned(),
            Some((cut, _)) => format!("{}…", &name[..cut]),
        };
        let available = if self.tools.is_empty() {
            "(none)".to_owned()
        } else {
            let names: Vec<&str> = self
                .tools
                .iter()
                .map(|t| t.function.name.as_str())
                .collect();
            names.join(", ")
        };
        DurableError::UnknownTool { name, available }
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
///
/// The empty response is journaled like any other, so a turn that stops on it replays
/// it on every resume: ask the model again within the turn instead, a bounded number of
/// times (see the [crate docs](crate#a-turn)).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the chat completion `{id}` holds no choice; ask the model again within the same turn, a bounded number of times (the empty response is journaled at its position, so the next model call is a new position and asks anew; stopping here would replay this empty response on every resume)"
)]
#[non_exhaustive]
pub struct EmptyResponse {
    /// The response's id.
    pub id: String,
}

/// Why a response's reply cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReplyError {
    /// The response holds no choice: ask again (see [`EmptyResponse`]).
    #[error(transparent)]
    Empty(#[from] EmptyResponse),
    /// The reply asks for a call through the deprecated `function_call` field only
    /// (no `tool_calls`): it has no call id and is not supported. Send the tools as
    /// `tools` (as [`ChatTools::request_tools`] does), not the deprecated `functions`.
    #[error(
        "the chat completion `{id}` asks for `{name}` through the deprecated `function_call` field, which is not supported: send the tools as `tools` (not `functions`) so the model answers with `tool_calls`"
    )]
    DeprecatedFunctionCall {
        /// The response's id.
        id: String,
        /// The function the reply names.
        name: String,
    },
}

/// The message of the response's first choice (an agent asks for one choice, `n = 1`).
///
/// # Errors
/// [`ReplyError::Empty`] when `choices` is empty (ask again); and
/// [`ReplyError::DeprecatedFunctionCall`] when the message carries the deprecated
/// `function_call` and no `tool_calls` (it would otherwise read as a final answer with
/// no call).
pub fn reply_message(
    response: &CreateChatCompletionResponse,
) -> Result<&ChatCompletionResponseMessage, ReplyError> {
    let message = response
        .choices
        .first()
        .map(|choice| &choice.message)
        .ok_or_else(|| EmptyResponse {
            id: response.id.clone(),
        })?;
    #[allow(deprecated)]
    if let Some(call) = &message.function_call
        && message.tool_calls.as_ref().is_none_or(Vec::is_empty)
    {
        return Err(ReplyError::DeprecatedFunctionCall {
            id: response.id.clone(),
            name: call.name.clone(),
        });
    }
    Ok(message)
}

/// The tool calls an assistant message asks for, in order, each with its arguments as
/// the **raw text** the model sent ([`ToolArguments::Text`]), so the toolbox checks
/// them before anything is journaled (duplicate keys, NaN, integers beyond ±(2^53−1)):
/// see the [crate docs](crate#why-the-raw-argument-text).
///
/// The deprecated single `function_call` field (it has no call id) is not read here;
/// [`reply_message`] refuses a reply that carries only that. See [`tool_call`] for
/// custom tools.
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
/// A custom tool call (free-text input, not JSON) never reaches a registered tool: a
/// toolbox of `#[durable_tool]`s exports function tools only, so the call is named
/// `custom:<name>` (a colon, which no registered tool name can hold) with its input as
/// the argument text, and dispatch refuses it as
/// [`UnknownTool`](durable_core::DurableError::UnknownTool), an error result the model
/// reads. A custom call named like a function tool does not run that tool.
pub fn tool_call(call: &ChatCompletionMessageToolCalls) -> ModelToolCall {
    match call {
        ChatCompletionMessageToolCalls::Function(call) => ModelToolCall::new(
            call.id.clone(),
            call.function.name.clone(),
            ToolArguments::Text(call.function.arguments.clone()),
        ),
        ChatCompletionMessageToolCalls::Custom(call) => ModelToolCall::new(
            call.id.clone(),
            format!("{CUSTOM_PREFIX}{}", call.custom_tool.name),
            ToolArguments::Text(call.custom_tool.input.clone()),
        ),
    }
}

/// The prefix of a custom tool call's name ([`tool_call`]): no registered tool name
/// holds a colon.
pub const CUSTOM_PREFIX: &str = "custom:";

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
/// its text, refusal, tool calls (their argument text unchanged) and audio id. An empty
/// `tool_calls` list is dropped (OpenAI refuses `"tool_calls": []` in a request, and the
/// message stays in the transcript of every later request).
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
        tool_calls: message.tool_calls.clone().filter(|calls| !calls.is_empty()),
        ..Default::default()
    })
}

/// The response's token usage, for `model_with_usage(.., durable_openai::usage)`: the
/// model that answered (`response.model`), `prompt_tokens` as input (cached tokens
/// included, as OpenAI counts them), `completion_tokens` as output and
/// `prompt_tokens_details.cached_tokens` as cached input, so the runtime's
/// [`PriceTable`](durable_core::PriceTable) charges cached tokens at their own price.
/// `None` when the provider reported no usage.
///
/// ```
/// use async_openai::types::chat::CreateChatCompletionResponse;
/// use durable_core::snapshot::{Price, PriceTable};
///
/// let response: CreateChatCompletionResponse = serde_json::from_value(serde_json::json!({
///     "id": "r-1", "object": "chat.completion", "created": 0, "model": "gpt-4o-mini-2024-07-18",
///     "choices": [],
///     "usage": {"prompt_tokens": 10000, "completion_tokens": 1000, "total_tokens": 11000,
///               "prompt_tokens_details": {"cached_tokens": 4000}}
/// }))?;
/// let usage = durable_openai::usage(&response).expect("usage");
/// assert_eq!((usage.input_tokens, usage.output_tokens, usage.cached_input_tokens), (10_000, 1_000, 4_000));
/// let prices = PriceTable::new().with("gpt-4o-mini", Price::usd_per_million(0.15, 0.60, 0.075)?);
/// assert_eq!(prices.spend(&usage, None).expect("priced").nano_usd(), 900_000 + 300_000 + 600_000);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn usage(response: &CreateChatCompletionResponse) -> Option<Usage> {
    let reported = response.usage.as_ref()?;
    let cached = reported
        .prompt_tokens_details
        .as_ref()
        .and_then(|details| details.cached_tokens)
        .map_or(0, u64::from);
    let mut usage = Usage::new(
        u64::from(reported.prompt_tokens),
        u64::from(reported.completion_tokens),
    )
    .with_cached_input(cached);
    if !response.model.is_empty() {
        usage = usage.with_model(response.model.clone());
    }
    Some(usage)
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
///
/// Cached prompt tokens (`prompt_tokens_details.cached_tokens`) are charged at the full
/// input price unless [`with_cached_input`](Pricing::with_cached_input) sets their own:
/// the default is an upper bound on what the provider bills.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pricing {
    input: u64,
    output: u64,
    cached_input: Option<u64>,
}

impl Pricing {
    /// A price per input (prompt) token and per output (completion) token, in
    /// nano-dollars (USD per million tokens × 1000).
    pub const fn nano_usd_per_token(input: u64, output: u64) -> Self {
        Pricing {
            input,
            output,
            cached_input: None,
        }
    }

    /// The price of a cached prompt token, in nano-dollars (e.g. half the input price);
    /// without it, cached tokens cost the full input price.
    #[must_use]
    pub const fn with_cached_input(mut self, nano_per_token: u64) -> Self {
        self.cached_input = Some(nano_per_token);
        self
    }

    /// The spend of one usage report (saturating at `u64::MAX` nano-dollars).
    pub fn spend_of(&self, usage: &CompletionUsage) -> Spend {
        let input = u64::from(usage.prompt_tokens);
        let output = u64::from(usage.completion_tokens);
        let input_cost = match self.cached_input {
            None => input.saturating_mul(self.input),
            Some(cached_price) => {
                let cached = usage
                    .prompt_tokens_details
                    .as_ref()
                    .and_then(|details| details.cached_tokens)
                    .map_or(0, u64::from)
                    .min(input);
                cached
                    .saturating_mul(cached_price)
                    .saturating_add(input.saturating_sub(cached).saturating_mul(self.input))
            }
        };
        let cost = input_cost.saturating_add(output.saturating_mul(self.output));
        Spend::from_nano_usd(cost, input, output)
    }

    /// The spend of a response, for `model_with_spend(.., |r| pricing.spend(r))`; `None`
    /// when it reports no usage.
    pub fn spend(&self, response: &CreateChatCompletionResponse) -> Option<Spend> {
        response.usage.as_ref().map(|usage| self.spend_of(usage))
    }
}

mod stream;
pub use stream::{StreamedCompletion, stream_spend, stream_usage};
mod throttle;
pub use throttle::{retry_after, retry_after_in_message};

pub mod anthropic;

#[cfg(feature = "client")]
mod client;
#[cfg(feature = "client")]
pub use client::{ChatError, DurableChat, DurableChatStream, DurableClient};

#[cfg(test)]
mod tests;
