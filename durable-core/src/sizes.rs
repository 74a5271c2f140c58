//! Size caps on what the journal and the transcript record: model replies, tool results
//! and transcript messages ([`SizeLimits`]), beside the caps on tool arguments
//! ([`ArgLimits`](crate::ArgLimits), 1 MiB by default).
//!
//! Every cap is checked in the runtime, on the value's compact JSON text (counted while
//! it is serialized, nothing is allocated for it), **before anything is written**, so
//! every backend refuses alike. A value above its cap is [`DurableError::TooLarge`],
//! which says what was too big ([`Oversized`]: which reply, which tool's result, which
//! message), its size, the limit and the setting that raises it.
//!
//! | value | default | setting | when it is too big |
//! |---|---|---|---|
//! | a model reply ([`Journal::model`](crate::Journal::model)) | 4 MiB | [`max_reply_bytes`](SizeLimits::max_reply_bytes) | refused, nothing written: the model may be asked again |
//! | a tool's result | 4 MiB | [`max_result_bytes`](SizeLimits::max_result_bytes) | the effect ran: the call is recorded **failed** ("result too large"), never run again |
//! | a transcript message ([`Session::checkpoint`](crate::Session::checkpoint), the initial messages of [`Durable::start`](crate::Durable::start)) | 8 MiB | [`max_message_bytes`](SizeLimits::max_message_bytes) | the checkpoint is refused, nothing written |
//!
//! A tool's result that cannot be stored is not left *issued*: that would make the call
//! in doubt, and a resume would re-run a `pure` or keyed call, or stop an
//! `unsafe_on_replay` one for an operator, although the effect is known to have run. The
//! journal records the call as failed with the size and the limit, and every replay of it
//! returns the same [`DurableError::TooLarge`] without running anything.
//!
//! ```
//! use durable_core::sizes::SizeLimits;
//!
//! let limits = SizeLimits::default().with_max_reply_bytes(16 * 1024 * 1024);
//! assert_eq!(limits.max_reply_bytes, 16_777_216);
//! assert_eq!(limits.max_result_bytes, 4 * 1024 * 1024);
//! ```

use std::fmt;

use serde::Serialize;
use serde_json::{Value, json};

use crate::error::DurableError;
use crate::ids::{CallId, SessionId};

/// The caps on model replies, tool results and transcript messages, in bytes of compact
/// JSON text (see the [module docs](self)). Set with
/// [`DurableBuilder::size_limits`](crate::DurableBuilder::size_limits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct SizeLimits {
    /// The largest model reply recorded (default 4 MiB).
    pub max_reply_bytes: usize,
    /// The largest tool result recorded (default 4 MiB).
    pub max_result_bytes: usize,
    /// The largest transcript message checkpointed (default 8 MiB: a message may carry a
    /// whole tool result).
    pub max_message_bytes: usize,
}

/// One mebibyte.
const MIB: usize = 1024 * 1024;

impl Default for SizeLimits {
    fn default() -> Self {
        SizeLimits {
            max_reply_bytes: 4 * MIB,
            max_result_bytes: 4 * MIB,
            max_message_bytes: 8 * MIB,
        }
    }
}

impl SizeLimits {
    /// The largest model reply recorded, in bytes of JSON text.
    pub fn with_max_reply_bytes(mut self, bytes: usize) -> Self {
        self.max_reply_bytes = bytes;
        self
    }

    /// The largest tool result recorded, in bytes of JSON text.
    pub fn with_max_result_bytes(mut self, bytes: usize) -> Self {
        self.max_result_bytes = bytes;
        self
    }

    /// The largest transcript message checkpointed, in bytes of JSON text.
    pub fn with_max_message_bytes(mut self, bytes: usize) -> Self {
        self.max_message_bytes = bytes;
        self
    }
}

/// What was too big, in a [`DurableError::TooLarge`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Oversized {
    /// A model reply; nothing was written.
    ModelReply {
        /// The session.
        session: SessionId,
        /// The step (the checkpoint version the turn started from).
        step: i64,
        /// The reply's position among the step's model replies (counting from 0).
        position: i64,
    },
    /// A tool's result. The effect ran: the call is recorded as failed and is never run
    /// again.
    ToolResult {
        /// The session.
        session: SessionId,
        /// The step.
        step: i64,
        /// The tool.
        tool: String,
        /// The journal row, recorded as failed.
        call: CallId,
    },
    /// A transcript message; the checkpoint was not written.
    Message {
        /// The session.
        session: SessionId,
        /// The message's position in the transcript (counting from 1).
        position: i64,
    },
}

impl Oversized {
    /// The [`SizeLimits`] field that raises this limit.
    pub const fn setting(&self) -> &'static str {
        match self {
            Oversized::ModelReply { .. } => "max_reply_bytes",
            Oversized::ToolResult { .. } => "max_result_bytes",
            Oversized::Message { .. } => "max_message_bytes",
        }
    }

    /// What happened to it, for the error's message.
    pub(crate) const fn consequence(&self) -> &'static str {
        match self {
            Oversized::ModelReply { .. } => "nothing was written; ask the model for less",
            Oversized::ToolResult { .. } => {
                "the tool ran, and the call is recorded as failed (result too large): it is \
                 never run again; return less (a reference to the data instead of the data)"
            }
            Oversized::Message { .. } => "the checkpoint was not written; push a smaller message",
        }
    }
}

impl fmt::Display for Oversized {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Oversized::ModelReply {
                session,
                step,
                position,
            } => write!(
                f,
                "model reply {position} (counting from 0) of step {step} of session `{session}`"
            ),
            Oversized::ToolResult {
                session,
                step,
                tool,
                call,
            } => write!(
                f,
                "the result of `{tool}` (call `{call}`, step {step} of session `{session}`)"
            ),
            Oversized::Message { session, position } => {
                write!(
                    f,
                    "message {position} of the transcript of session `{session}`"
                )
            }
        }
    }
}

/// Counts the bytes written to it.
struct Counter(usize);

impl std::io::Write for Counter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 = self.0.saturating_add(buf.len());
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The length of `value`'s compact JSON text, counted without keeping it. A value
/// `serde_json` cannot write counts as 0 here: encoding it for the journal reports it.
pub(crate) fn json_len<T: Serialize + ?Sized>(value: &T) -> usize {
    let mut counter = Counter(0);
    match serde_json::to_writer(&mut counter, value) {
        Ok(()) => counter.0,
        Err(_) => 0,
    }
}

/// `Err(TooLarge)` when `value` is above `limit`.
pub(crate) fn check<T: Serialize + ?Sized>(
    value: &T,
    limit: usize,
    what: impl FnOnce() -> Oversized,
) -> Result<(), DurableError> {
    let size = json_len(value);
    if size > limit {
        return Err(DurableError::TooLarge {
            what: what(),
            size,
            limit,
        });
    }
    Ok(())
}

/// The key of the recorded failure of a result too large to store.
const RECORDED_KEY: &str = "result_too_large";

/// The error recorded on the row of a call whose result was too large to store: a
/// message the model can read, and the size and limit, so a replay returns the same
/// typed error.
pub(crate) fn recorded_failure(error: &DurableError) -> Value {
    match error {
        DurableError::TooLarge { size, limit, .. } => json!({
            "message": error.to_string(),
            RECORDED_KEY: { "size": size, "limit": limit },
        }),
        other => json!({ "message": other.to_string() }),
    }
}

/// The [`DurableError::TooLarge`] a failed row recorded by [`recorded_failure`] stands
/// for, if it is one.
pub(crate) fn from_recorded(
    error: Option<&Value>,
    what: impl FnOnce() -> Oversized,
) -> Option<DurableError> {
    let recorded = error?.get(RECORDED_KEY)?;
    let number = |key: &str| {
        recorded
            .get(key)
            .and_then(Value::as_u64)
            .and_then(|n| usize::try_from(n).ok())
    };
    Some(DurableError::TooLarge {
        what: what(),
        size: number("size")?,
        limit: number("limit")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_compact_json_text() {
        assert_eq!(json_len(&json!({"a": [1, 2]})), r#"{"a":[1,2]}"#.len());
        assert_eq!(json_len("é"), "\"é\"".len());
    }

    #[test]
    fn a_recorded_failure_comes_back_as_the_same_error() {
        let what = || Oversized::ToolResult {
            session: SessionId::new("s"),
            step: 2,
            tool: "fetch".into(),
            call: CallId::new("c"),
        };
        let error = check(&"x".repeat(100), 10, what).expect_err("above the cap");
        let recorded = recorded_failure(&error);
        let again = from_recorded(Some(&recorded), what).expect("recognised");
        assert_eq!(again.to_string(), error.to_string());
        assert!(error.to_string().contains("max_result_bytes"), "{error}");
        assert!(from_recorded(Some(&json!({"message": "boom"})), what).is_none());
    }
}
