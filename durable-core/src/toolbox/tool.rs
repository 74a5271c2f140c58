//! The object-safe [`Tool`] trait: what a [`Toolbox`](crate::Toolbox) stores and
//! dispatches, and the [`ToolOutput`] a dispatched call returns to the model.

use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::DurableError;
use crate::ids::SessionId;
use crate::journal::Journal;
use crate::tool::ToolSpec;

/// What a dispatched tool call returns to the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolOutput {
    /// The result (on success) or `{"error": message}` (on a tool failure).
    pub content: Value,
    /// Whether the tool failed.
    pub is_error: bool,
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
