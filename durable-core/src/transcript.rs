//! The default message model of a transcript: [`Message`]s made of typed [`Block`]s.
//!
//! The runtime is generic over its message type: checkpoints accept any
//! `M: Serialize + DeserializeOwned`, stored as one JSON value per message in the
//! session's append-only log. Bring your provider's own type if you have one; this model
//! is the default, small enough to map onto the OpenAI, Anthropic and MCP shapes.
//!
//! Blocks are internally tagged by `kind`, so each message is self-describing JSON:
//!
//! ```json
//! {"role":"assistant","content":[
//!   {"kind":"text","text":"Checking."},
//!   {"kind":"tool_call","id":"call_1","name":"stat","arguments":{"path":"/etc/hostname"}}]}
//! {"role":"tool","content":[
//!   {"kind":"tool_result","call_id":"call_1","content":{"bytes":8},"is_error":false}]}
//! ```

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Who produced a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Instructions from the harness.
    System,
    /// The user, or a synthetic message the harness sends in the user's place (e.g. a
    /// refused finalization).
    User,
    /// The model.
    Assistant,
    /// Tool results.
    Tool,
}

/// A tool call requested by the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCallBlock {
    /// The provider's call id; tool results refer to it.
    pub id: String,
    /// The tool's name.
    pub name: String,
    /// The arguments, as the model sent them.
    pub arguments: Value,
}

/// The result of a tool call, sent back to the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolResultBlock {
    /// The [`ToolCallBlock::id`] this answers.
    pub call_id: String,
    /// The result (or the error, when `is_error`).
    pub content: Value,
    /// Whether the call failed; the model reasons about the error. Defaults to `false`
    /// when absent.
    #[serde(default)]
    pub is_error: bool,
}

/// One typed piece of a message, tagged by `kind`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Block {
    /// Visible text.
    Text {
        /// The text.
        text: String,
    },
    /// The model's reasoning, kept so a resumed turn sees what the model saw.
    Reasoning {
        /// The reasoning text.
        text: String,
    },
    /// A tool call (`{"kind":"tool_call","id":…,"name":…,"arguments":…}`).
    ToolCall(ToolCallBlock),
    /// A tool result (`{"kind":"tool_result","call_id":…,"content":…,"is_error":…}`).
    ToolResult(ToolResultBlock),
}

impl Block {
    /// A text block.
    pub fn text(text: impl Into<String>) -> Self {
        Block::Text { text: text.into() }
    }

    /// A tool-call block.
    pub fn tool_call(id: impl Into<String>, name: impl Into<String>, arguments: Value) -> Self {
        Block::ToolCall(ToolCallBlock {
            id: id.into(),
            name: name.into(),
            arguments,
        })
    }
}

/// A message of the transcript.
///
/// ```
/// use durable_core::transcript::{Block, Message, Role};
/// use serde_json::json;
///
/// let reply = Message::assistant(vec![
///     Block::text("Checking the file."),
///     Block::tool_call("call_1", "stat", json!({"path": "/etc/hostname"})),
/// ]);
/// let calls: Vec<_> = reply.tool_calls().map(|c| c.name.as_str()).collect();
/// assert_eq!(calls, ["stat"]);
///
/// let result = Message::tool_result("call_1", json!({"bytes": 8}), false);
/// assert_eq!(result.role, Role::Tool);
/// assert_eq!(
///     serde_json::to_value(&result)?,
///     json!({"role": "tool", "content": [
///         {"kind": "tool_result", "call_id": "call_1", "content": {"bytes": 8}, "is_error": false}
///     ]})
/// );
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// Who produced it.
    pub role: Role,
    /// Its blocks, in order.
    pub content: Vec<Block>,
}

impl Message {
    /// A system message with one text block.
    pub fn system(text: impl Into<String>) -> Self {
        Message {
            role: Role::System,
            content: vec![Block::text(text)],
        }
    }

    /// A user message with one text block.
    pub fn user(text: impl Into<String>) -> Self {
        Message {
            role: Role::User,
            content: vec![Block::text(text)],
        }
    }

    /// An assistant message made of `blocks`.
    pub fn assistant(blocks: Vec<Block>) -> Self {
        Message {
            role: Role::Assistant,
            content: blocks,
        }
    }

    /// A tool message carrying the result of call `call_id`.
    pub fn tool_result(call_id: impl Into<String>, content: Value, is_error: bool) -> Self {
        Message {
            role: Role::Tool,
            content: vec![Block::ToolResult(ToolResultBlock {
                call_id: call_id.into(),
                content,
                is_error,
            })],
        }
    }

    /// A tool result message from a call's outcome, as
    /// [`Session::checkpoint_after`](crate::Session::checkpoint_after) hands it over: the
    /// result, or `{"error": message}` marked as an error.
    pub fn tool_outcome(call_id: impl Into<String>, outcome: Result<&Value, &str>) -> Self {
        match outcome {
            Ok(result) => Message::tool_result(call_id, result.clone(), false),
            Err(message) => {
                Message::tool_result(call_id, serde_json::json!({ "error": message }), true)
            }
        }
    }

    /// The tool calls of this message, in order.
    pub fn tool_calls(&self) -> impl Iterator<Item = &ToolCallBlock> {
        self.content.iter().filter_map(|b| match b {
            Block::ToolCall(call) => Some(call),
            _ => None,
        })
    }

    /// The tool results of this message, in order.
    pub fn tool_results(&self) -> impl Iterator<Item = &ToolResultBlock> {
        self.content.iter().filter_map(|b| match b {
            Block::ToolResult(result) => Some(result),
            _ => None,
        })
    }

    /// Whether the message asks for tool calls (an assistant message without any is a
    /// final answer).
    pub fn has_tool_calls(&self) -> bool {
        self.tool_calls().next().is_some()
    }

    /// The visible text: the `text` blocks concatenated without separator (providers
    /// split one answer into several blocks). Reasoning is not included.
    pub fn text(&self) -> String {
        self.content
            .iter()
            .filter_map(|b| match b {
                Block::Text { text } => Some(text.as_str()),
                _ => None,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn round_trip(m: &Message) {
        let s = serde_json::to_string(m).expect("serialize");
        let back: Message = serde_json::from_str(&s).expect("deserialize");
        assert_eq!(&back, m);
        assert_eq!(serde_json::to_string(&back).expect("serialize"), s);
    }

    #[test]
    fn json_shape_is_pinned() {
        let m = Message::assistant(vec![
            Block::Reasoning {
                text: "need the size".into(),
            },
            Block::text("Checking."),
            Block::tool_call("call_1", "stat", json!({"path": "/etc/hostname"})),
        ]);
        assert_eq!(
            serde_json::to_string(&m).expect("serialize"),
            r#"{"role":"assistant","content":[{"kind":"reasoning","text":"need the size"},{"kind":"text","text":"Checking."},{"kind":"tool_call","id":"call_1","name":"stat","arguments":{"path":"/etc/hostname"}}]}"#
        );
        assert_eq!(
            serde_json::to_string(&Message::tool_result("call_1", json!("denied"), true))
                .expect("serialize"),
            r#"{"role":"tool","content":[{"kind":"tool_result","call_id":"call_1","content":"denied","is_error":true}]}"#
        );
        assert_eq!(
            serde_json::to_string(&Message::system("be brief")).expect("serialize"),
            r#"{"role":"system","content":[{"kind":"text","text":"be brief"}]}"#
        );
        assert_eq!(
            serde_json::to_string(&Message::user("hi")).expect("serialize"),
            r#"{"role":"user","content":[{"kind":"text","text":"hi"}]}"#
        );
    }

    #[test]
    fn round_trips() {
        round_trip(&Message::system("s"));
        round_trip(&Message::user("u"));
        round_trip(&Message::assistant(vec![]));
        round_trip(&Message::assistant(vec![
            Block::text("a"),
            Block::tool_call("1", "t", json!({"n": [1, 2.5, null, {"deep": true}]})),
            Block::tool_call("2", "t", Value::Null),
        ]));
        round_trip(&Message::tool_result("1", json!({"ok": 1}), false));
    }

    #[test]
    fn deserialization_is_strict_about_kinds_and_lenient_about_is_error() {
        let m: Message = serde_json::from_value(json!({"role": "tool", "content": [
            {"kind": "tool_result", "call_id": "c", "content": 1}
        ]}))
        .expect("is_error defaults to false");
        assert_eq!(m, Message::tool_result("c", json!(1), false));

        for bad in [
            json!({"role": "tool", "content": [{"kind": "image", "url": "x"}]}),
            json!({"role": "tool", "content": [{"text": "no kind"}]}),
            json!({"role": "robot", "content": []}),
            json!({"role": "assistant", "content": [{"kind": "tool_call", "id": "1"}]}),
        ] {
            assert!(
                serde_json::from_value::<Message>(bad.clone()).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn helpers_select_blocks_in_order() {
        let m = Message::assistant(vec![
            Block::text("Hello, "),
            Block::Reasoning {
                text: "hidden".into(),
            },
            Block::tool_call("a", "first", json!({})),
            Block::text("world"),
            Block::tool_call("b", "second", json!({})),
        ]);
        assert_eq!(m.text(), "Hello, world");
        let ids: Vec<_> = m.tool_calls().map(|c| c.id.as_str()).collect();
        assert_eq!(ids, ["a", "b"]);
        assert!(m.has_tool_calls());
        assert!(!Message::assistant(vec![Block::text("done")]).has_tool_calls());
        assert_eq!(m.tool_results().count(), 0);
        let r = Message::tool_result("a", json!(1), false);
        assert_eq!(
            r.tool_results()
                .map(|t| t.call_id.as_str())
                .collect::<Vec<_>>(),
            ["a"]
        );
        assert_eq!(r.text(), "");
    }
}
