//! The object-safe [`Tool`] trait: what a [`Toolbox`](crate::Toolbox) stores and
//! dispatches, and the [`ToolOutput`] a dispatched call returns to the model.

use std::fmt::Display;

use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::encode::encode;
use crate::error::DurableError;
use crate::ids::SessionId;
use crate::journal::{CallError, Journal};
use crate::tool_spec::ToolSpec;

/// What a dispatched tool call returns to the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolOutput {
    /// The result (on success) or `{"error": message}` (on a tool failure).
    pub content: Value,
    /// Whether the tool failed.
    pub is_error: bool,
}

impl ToolOutput {
    /// What the model reads for the outcome of a journaled call of `spec`'s tool: a
    /// success serialized as the content; a tool failure, now or recorded by an earlier
    /// run, as `{"error": "<message>"}` with `is_error: true`; the runtime's own errors
    /// passed through (the rules of generated tools, which call it through
    /// `__macro_support::tool_output`). Public for hand-written [`Tool`]s, which build their
    /// output from a [`Journal::tool`](crate::Journal::tool) call the same way.
    pub fn from_call<T: Serialize, E: Display>(
        spec: &ToolSpec,
        result: Result<T, CallError<E>>,
    ) -> Result<Self, DurableError> {
        match result {
            Ok(value) => {
                let content = encode(&value, format_args!("result of `{}`", spec.name))?;
                Ok(ToolOutput {
                    content,
                    is_error: false,
                })
            }
            Err(CallError::Tool(error)) => Ok(ToolOutput {
                content: json!({ "error": error.to_string() }),
                is_error: true,
            }),
            Err(CallError::Recorded(failure)) => Ok(ToolOutput {
                content: json!({ "error": failure.message }),
                is_error: true,
            }),
            Err(CallError::Durable(error)) => Err(error),
        }
    }
}

/// An object-safe tool: what a toolbox stores and dispatches.
///
/// `#[durable_tool]` implements it; implement it by hand for tools built at run time.
pub trait Tool: Send + Sync + 'static {
    /// The tool's description.
    fn spec(&self) -> &ToolSpec;

    /// Runs one call through the journal with arguments sent by a model.
    ///
    /// Implementations validate and deserialize `args` (typed error naming the JSON path,
    /// nothing journaled), derive the idempotency key if any, and call
    /// [`Journal::tool`](crate::Journal::tool). A tool failure is an `Ok` output with
    /// `is_error: true`; `Err` is reserved for the runtime (refusals, store errors).
    fn invoke<'a>(
        &'a self,
        journal: &'a Journal,
        args: Value,
    ) -> BoxFuture<'a, Result<ToolOutput, DurableError>>;

    /// Checks that recorded arguments still fit today's argument type, running nothing.
    ///
    /// Used by the [replay check](crate::replay_check) on every journaled call of the tool.
    /// `#[durable_tool]` implements it by deserializing `args` into the generated argument
    /// struct ([`DurableError::ArgumentsMismatch`] naming the JSON path). The default
    /// accepts everything; the replay check then still checks `args` against the
    /// `required` and `properties` of [`ToolSpec::input_schema`].
    fn check_args(&self, args: &Value) -> Result<(), DurableError> {
        let _ = args;
        Ok(())
    }

    /// The idempotency key today's code derives for `args` in `session`, or `None` when
    /// the tool derives no key (or cannot say).
    ///
    /// Used by the [replay check](crate::replay_check): a recorded key that no longer
    /// derives the same means a re-executed call would reach the upstream with a new key
    /// (a duplicate effect). `#[durable_tool]` implements it for `idempotent_with_key`
    /// tools by deserializing `args` and applying the `idempotency_key` expression. The
    /// default returns `None`.
    fn derive_key(
        &self,
        args: &Value,
        session: &SessionId,
    ) -> Option<Result<String, DurableError>> {
        let _ = (args, session);
        None
    }
}
