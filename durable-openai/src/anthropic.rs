//! Anthropic's streamed Messages replies (`stream: true`), read from the raw server-sent
//! events: the serde types of the events, a decoder for the `text/event-stream` body,
//! and [`StreamedMessage`], the reply the events fold into, to journal with
//! `session.model_stream`. No Anthropic SDK: the events are small, stable JSON, and
//! reading them ourselves is what keeps a tool call's input as the **text the model
//! sent** (an SDK hands it over parsed, which erases duplicate keys and the exact
//! digits of big integers; see the [crate docs](crate#anthropic-tool_use-the-input-arrives-parsed)).
//!
//! ```no_run
//! use durable_openai::anthropic::{self, SseDecoder, StreamedMessage};
//! use durable_core::journal::ReplyEvent;
//! use futures_util::{StreamExt, stream};
//!
//! # async fn turn(session: &durable_core::Session<serde_json::Value>,
//! #     body: impl futures_util::Stream<Item = Result<String, std::io::Error>>)
//! # -> Result<(), Box<dyn std::error::Error>> {
//! // `body`: the HTTP response body of `POST /v1/messages` with `"stream": true`, as text.
//! let mut decoder = SseDecoder::default();
//! let events = body.flat_map(move |text| {
//!     let events: Vec<Result<anthropic::MessageStreamEvent, anthropic::StreamError>> = match text {
//!         Ok(text) => decoder.push(&text).into_iter().map(|data| anthropic::parse_event(&data)).collect(),
//!         Err(e) => vec![Err(anthropic::StreamError::Transport(e.to_string()))],
//!     };
//!     stream::iter(events)
//! });
//! let mut reply = session
//!     .model_stream_with_spend::<StreamedMessage, _, _, _, _>(|| events, anthropic::spend)
//!     .await?;
//! while let Some(event) = reply.next().await {
//!     match event? {
//!         ReplyEvent::Chunk(event) => {
//!             if let Some(text) = event.text_delta() {
//!                 print!("{text}");
//!             }
//!         }
//!         ReplyEvent::Reply(message) => {
//!             let calls = message.tool_calls(); // the input as the raw text streamed
//!             // push the message, dispatch `calls`, checkpoint
//!             # let _ = calls;
//!         }
//!     }
//! }
//! # Ok(()) }
//! ```
//!
//! What is kept, and how:
//! - a `tool_use` block's input is the concatenation of its `input_json_delta`
//!   `partial_json` strings, **exactly as sent**, kept as a JSON string under `input`
//!   (not parsed): [`StreamedMessage::tool_calls`] hands that text to the toolbox as
//!   [`ToolArguments::Text`], and the argument scanner refuses a duplicate key, an
//!   integer beyond ±(2^53−1) or a `NaN` in it, as it would in a whole reply's text. A
//!   tool call with no delta (no arguments) is `{}`;
//! - text blocks: their `text_delta`s joined; thinking blocks: their `thinking_delta`s and
//!   `signature_delta`; any other block (server tools, redacted thinking, a type added
//!   later) is kept as its `content_block_start` JSON;
//! - the usage: `message_start`'s input tokens and the last `message_delta`'s output
//!   tokens (Anthropic sends the running total there), cache tokens as reported.

use durable_core::journal::StreamedReply;
use durable_core::{ModelToolCall, Spend, ToolArguments};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One event of a streamed Messages reply: the JSON of an SSE event's `data:` line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum MessageStreamEvent {
    /// The message opens: its id, model, role and input usage (content empty).
    MessageStart {
        /// The message so far.
        message: MessageStart,
    },
    /// A content block opens at `index`.
    ContentBlockStart {
        /// The block's position in the message's content.
        index: usize,
        /// The block as it opens (`{"type": "text", "text": ""}`, `{"type": "tool_use",
        /// "id", "name", "input": {}}`, …).
        content_block: Value,
    },
    /// A piece of the block at `index`.
    ContentBlockDelta {
        /// The block's position.
        index: usize,
        /// The piece.
        delta: ContentDelta,
    },
    /// The block at `index` is complete.
    ContentBlockStop {
        /// The block's position.
        index: usize,
    },
    /// The message's top-level fields change (stop reason), with the usage so far.
    MessageDelta {
        /// The changed fields.
        delta: MessageDeltaFields,
        /// Cumulative usage (output tokens so far).
        #[serde(default)]
        usage: Option<Usage>,
    },
    /// The message is complete.
    MessageStop,
    /// Sent now and then to keep the connection open.
    Ping,
    /// The provider failed mid-stream (`overloaded_error`, …).
    Error {
        /// The error object.
        error: Value,
    },
}

impl MessageStreamEvent {
    /// The text this event adds to a text block, if it is a `text_delta`.
    pub fn text_delta(&self) -> Option<&str> {
        match self {
            MessageStreamEvent::ContentBlockDelta {
                delta: ContentDelta::TextDelta { text },
                ..
            } => Some(text),
            _ => None,
        }
    }
}

/// The message as `message_start` opens it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MessageStart {
    /// The message id (`msg_…`).
    #[serde(default)]
    pub id: String,
    /// The model that answers.
    #[serde(default)]
    pub model: String,
    /// `assistant`.
    #[serde(default)]
    pub role: String,
    /// The usage at the start (input tokens).
    #[serde(default)]
    pub usage: Usage,
}

/// A piece of a content block.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum ContentDelta {
    /// Text of a text block.
    TextDelta {
        /// The piece of text.
        text: String,
    },
    /// A piece of a `tool_use` block's input, as raw JSON text: the pieces joined are
    /// the input's text (not each valid JSON on its own).
    InputJsonDelta {
        /// The piece, exactly as sent.
        partial_json: String,
    },
    /// Text of a thinking block.
    ThinkingDelta {
        /// The piece of thinking.
        thinking: String,
    },
    /// A thinking block's signature.
    SignatureDelta {
        /// The signature.
        signature: String,
    },
    /// A kind of delta this crate does not read (`citations_delta`, …): passed on as a
    /// chunk, not folded into the reply.
    #[serde(other)]
    Other,
}

/// The top-level fields a `message_delta` changes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MessageDeltaFields {
    /// Why the model stopped (`end_turn`, `tool_use`, `max_tokens`, …).
    #[serde(default)]
    pub stop_reason: Option<String>,
    /// The stop sequence that ended the reply, if one did.
    #[serde(default)]
    pub stop_sequence: Option<String>,
}

/// Token usage as Anthropic reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Input tokens.
    #[serde(default)]
    pub input_tokens: u64,
    /// Output tokens (cumulative in a `message_delta`).
    #[serde(default)]
    pub output_tokens: u64,
    /// Input tokens written to the prompt cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_creation_input_tokens: Option<u64>,
    /// Input tokens read from the prompt cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_read_input_tokens: Option<u64>,
}

/// A block of the assembled message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Block {
    /// Text.
    Text {
        /// The text deltas, joined.
        text: String,
    },
    /// A tool call.
    ToolUse {
        /// The call id (`toolu_…`).
        id: String,
        /// The tool's name.
        name: String,
        /// The input's JSON **text**, the `partial_json` pieces joined exactly as sent
        /// (a JSON string here, not an object: parsing it would erase what the argument
        /// scanner checks).
        input: String,
    },
    /// Extended thinking.
    Thinking {
        /// The thinking deltas, joined.
        thinking: String,
        /// Its signature.
        #[serde(default)]
        signature: String,
    },
    /// Any other block, as its `content_block_start` opened it.
    Other {
        /// The block's JSON.
        block: Value,
    },
}

/// A streamed Messages reply, folded from its events: what a whole (non-streamed)
/// reply holds, tool inputs as their raw text. Journal it with
/// `session.model_stream_with_spend(.., anthropic::spend)`; a replayed turn yields it
/// back as events of the same type (one delta per block).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StreamedMessage {
    /// The message id.
    pub id: String,
    /// The model that answered.
    pub model: String,
    /// `assistant`.
    pub role: String,
    /// The content blocks, by index.
    pub content: Vec<Block>,
    /// Why the model stopped.
    pub stop_reason: Option<String>,
    /// The stop sequence that ended the reply, if one did.
    pub stop_sequence: Option<String>,
    /// The reply's usage.
    pub usage: Usage,
}

/// How far past the blocks seen so far an event's index may point (Anthropic numbers
/// blocks 0, 1, 2, …; an index far beyond would have the gap filled with empty blocks).
const MAX_INDEX_GAP: usize = 64;

impl StreamedMessage {
    /// The tool calls the message asks for, in order, each with its input as the raw
    /// text streamed ([`ToolArguments::Text`]; `{}` for a call with no input delta), for
    /// `Toolbox::dispatch_all`: the toolbox's scanner checks the text before anything is
    /// journaled.
    pub fn tool_calls(&self) -> Vec<ModelToolCall> {
        self.content
            .iter()
            .filter_map(|block| match block {
                Block::ToolUse { id, name, input } => {
                    let text = if input.trim().is_empty() {
                        "{}".to_owned()
                    } else {
                        input.clone()
                    };
                    Some(ModelToolCall::new(
                        id.clone(),
                        name.clone(),
                        ToolArguments::Text(text),
                    ))
                }
                _ => None,
            })
            .collect()
    }

    /// The text blocks, joined.
    pub fn text(&self) -> String {
        self.content
            .iter()
            .filter_map(|block| match block {
                Block::Text { text } => Some(text.as_str()),
                _ => None,
            })
            .collect()
    }

    fn block_at(&mut self, index: usize) -> Option<&mut Block> {
        if index > self.content.len() + MAX_INDEX_GAP {
            return None;
        }
        while self.content.len() <= index {
            self.content.push(Block::Other { block: Value::Null });
        }
        self.content.get_mut(index)
    }
}

impl StreamedReply for StreamedMessage {
    type Chunk = MessageStreamEvent;

    fn push(&mut self, event: &MessageStreamEvent) {
        match event {
            MessageStreamEvent::MessageStart { message } => {
                self.id.clone_from(&message.id);
                self.model.clone_from(&message.model);
                self.role.clone_from(&message.role);
                self.usage = message.usage.clone();
            }
            MessageStreamEvent::ContentBlockStart {
                index,
                content_block,
            } => {
                let opened = open_block(content_block);
                if let Some(block) = self.block_at(*index) {
                    *block = opened;
                }
            }
            MessageStreamEvent::ContentBlockDelta { index, delta } => {
                let Some(block) = self.block_at(*index) else {
                    return;
                };
                match (block, delta) {
                    (Block::Text { text }, ContentDelta::TextDelta { text: piece }) => {
                        text.push_str(piece);
                    }
                    (
                        Block::ToolUse { input, .. },
                        ContentDelta::InputJsonDelta { partial_json },
                    ) => {
                        input.push_str(partial_json);
                    }
                    (
                        Block::Thinking { thinking, .. },
                        ContentDelta::ThinkingDelta { thinking: piece },
                    ) => {
                        thinking.push_str(piece);
                    }
                    (
                        Block::Thinking { signature, .. },
                        ContentDelta::SignatureDelta { signature: s },
                    ) => {
                        signature.push_str(s);
                    }
                    // A delta that does not fit its block (or a kind not read here).
                    _ => {}
                }
            }
            MessageStreamEvent::MessageDelta { delta, usage } => {
                if delta.stop_reason.is_some() {
                    self.stop_reason.clone_from(&delta.stop_reason);
                }
                if delta.stop_sequence.is_some() {
                    self.stop_sequence.clone_from(&delta.stop_sequence);
                }
                if let Some(usage) = usage {
                    // Cumulative: the last one is the reply's. Input tokens are sent at
                    // the start (and again here by some models).
                    self.usage.output_tokens = usage.output_tokens;
                    if usage.input_tokens > 0 {
                        self.usage.input_tokens = usage.input_tokens;
                    }
                    if usage.cache_creation_input_tokens.is_some() {
                        self.usage.cache_creation_input_tokens = usage.cache_creation_input_tokens;
                    }
                    if usage.cache_read_input_tokens.is_some() {
                        self.usage.cache_read_input_tokens = usage.cache_read_input_tokens;
                    }
                }
            }
            MessageStreamEvent::ContentBlockStop { .. }
            | MessageStreamEvent::MessageStop
            | MessageStreamEvent::Ping
            | MessageStreamEvent::Error { .. } => {}
        }
    }

    fn replay(&self) -> Vec<MessageStreamEvent> {
        let mut events = vec![MessageStreamEvent::MessageStart {
            message: MessageStart {
                id: self.id.clone(),
                model: self.model.clone(),
                role: self.role.clone(),
                usage: Usage {
                    output_tokens: 0,
                    ..self.usage.clone()
                },
            },
        }];
        for (index, block) in self.content.iter().enumerate() {
            let (start, delta) = match block {
                Block::Text { text } => (
                    serde_json::json!({"type": "text", "text": ""}),
                    vec![ContentDelta::TextDelta { text: text.clone() }],
                ),
                Block::ToolUse { id, name, input } => (
                    serde_json::json!({"type": "tool_use", "id": id, "name": name, "input": {}}),
                    vec![ContentDelta::InputJsonDelta {
                        partial_json: input.clone(),
                    }],
                ),
                Block::Thinking {
                    thinking,
                    signature,
                } => (
                    serde_json::json!({"type": "thinking", "thinking": ""}),
                    vec![
                        ContentDelta::ThinkingDelta {
                            thinking: thinking.clone(),
                        },
                        ContentDelta::SignatureDelta {
                            signature: signature.clone(),
                        },
                    ],
                ),
                Block::Other { block } => (block.clone(), Vec::new()),
            };
            events.push(MessageStreamEvent::ContentBlockStart {
                index,
                content_block: start,
            });
            events.extend(
                delta
                    .into_iter()
                    .map(|delta| MessageStreamEvent::ContentBlockDelta { index, delta }),
            );
            events.push(MessageStreamEvent::ContentBlockStop { index });
        }
        events.push(MessageStreamEvent::MessageDelta {
            delta: MessageDeltaFields {
                stop_reason: self.stop_reason.clone(),
                stop_sequence: self.stop_sequence.clone(),
            },
            usage: Some(Usage {
                output_tokens: self.usage.output_tokens,
                ..Usage::default()
            }),
        });
        events.push(MessageStreamEvent::MessageStop);
        events
    }
}

/// A block as `content_block_start` opens it (text and input start empty; the deltas
/// fill them).
fn open_block(block: &Value) -> Block {
    let field = |name: &str| {
        block
            .get(name)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    match block.get("type").and_then(Value::as_str) {
        Some("text") => Block::Text {
            text: field("text"),
        },
        Some("tool_use") => Block::ToolUse {
            id: field("id"),
            name: field("name"),
            input: String::new(),
        },
        Some("thinking") => Block::Thinking {
            thinking: field("thinking"),
            signature: field("signature"),
        },
        _ => Block::Other {
            block: block.clone(),
        },
    }
}

/// What a streamed reply cost, from its usage (tokens only; input tokens include those
/// read from or written to the prompt cache). Pass it to `model_stream_with_spend`.
pub fn spend(message: &StreamedMessage) -> Option<Spend> {
    let usage = &message.usage;
    let input = usage
        .input_tokens
        .saturating_add(usage.cache_creation_input_tokens.unwrap_or(0))
        .saturating_add(usage.cache_read_input_tokens.unwrap_or(0));
    Some(Spend::from_nano_usd(0, input, usage.output_tokens))
}

/// Why an event of the stream cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum StreamError {
    /// The `data:` of an event is not an event this crate reads.
    #[error("an Anthropic stream event that does not decode ({reason}): {data}")]
    Decode {
        /// What serde said.
        reason: String,
        /// The event's data, cut at 200 bytes.
        data: String,
    },
    /// The provider sent an `error` event: the reply is cut; ask again.
    #[error("Anthropic ended the stream with an error: {0}")]
    Provider(Value),
    /// The connection failed (the caller's transport error, as text).
    #[error("the stream's connection failed: {0}")]
    Transport(String),
}

/// Reads one event from the JSON of its `data:` line; an `error` event is
/// [`StreamError::Provider`] (a stream that errs leaves nothing in the journal).
///
/// # Errors
/// [`StreamError::Decode`] for data that is not an event, [`StreamError::Provider`] for
/// an `error` event.
pub fn parse_event(data: &str) -> Result<MessageStreamEvent, StreamError> {
    match serde_json::from_str::<MessageStreamEvent>(data) {
        Ok(MessageStreamEvent::Error { error }) => Err(StreamError::Provider(error)),
        Ok(event) => Ok(event),
        Err(e) => {
            let mut cut = data.len().min(200);
            while !data.is_char_boundary(cut) {
                cut -= 1;
            }
            Err(StreamError::Decode {
                reason: e.to_string(),
                data: data[..cut].to_owned(),
            })
        }
    }
}

/// Splits a `text/event-stream` body, fed as it arrives, into its events' data: each
/// event's `data:` lines joined with `\n` (an event ends at a blank line; `event:`,
/// `id:` and comment lines are passed over, the JSON's own `type` says what it is).
#[derive(Debug, Clone, Default)]
pub struct SseDecoder {
    /// Text of a line not ended yet.
    line: String,
    /// The data lines of the event being read.
    data: Option<String>,
}

impl SseDecoder {
    /// Feeds a piece of the body; returns the data of each event it completes.
    pub fn push(&mut self, text: &str) -> Vec<String> {
        let mut events = Vec::new();
        for piece in text.split_inclusive('\n') {
            self.line.push_str(piece);
            if !self.line.ends_with('\n') {
                continue;
            }
            let line = std::mem::take(&mut self.line);
            let line = line.trim_end_matches('\n').trim_end_matches('\r');
            if line.is_empty() {
                if let Some(data) = self.data.take() {
                    events.push(data);
                }
            } else if let Some(value) = line.strip_prefix("data:") {
                let value = value.strip_prefix(' ').unwrap_or(value);
                match &mut self.data {
                    Some(data) => {
                        data.push('\n');
                        data.push_str(value);
                    }
                    None => self.data = Some(value.to_owned()),
                }
            }
        }
        events
    }
}

#[cfg(test)]
#[path = "anthropic_tests.rs"]
mod tests;
