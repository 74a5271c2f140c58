//! `#[durable_tool]`s as rig tools: one rig tool handler per tool of a [`Toolbox`], bound
//! to a session's [`Journal`].

use std::sync::Arc;

use durable_core::schema::{self, SchemaError};
use durable_core::toolbox::{ModelToolCall, ToolArguments, ToolResult};
use durable_core::{DurableError, Journal, Toolbox};
use rig_core::effect::{EffectKind, FamilyDescriptor, HandlerDescriptor, Outcome, family};
use rig_core::error::{ErrorKind, ErrorReport};
use rig_core::serve::{Dispatch, Reply, Serve};
use rig_core::tool::{
    ToolExecutionError, ToolOutput as RigToolOutput, ToolResult as RigToolResult,
};
use serde_json::Value;

use crate::shared::Shared;

/// One tool of a durable [`Toolbox`] served to rig: a tool-family handler (rig's
/// [`Serve`]) registered under the tool's name.
///
/// Built by [`DurableRig::tools`](crate::DurableRig::tools); register it with
/// `rig_agent::tool::RegisteredTool::from_handler`, or let
/// [`DurableRig::agent`](crate::DurableRig::agent) do it.
pub struct DurableTool {
    name: String,
    description: String,
    parameters: Value,
    toolbox: Arc<Toolbox>,
    journal: Journal,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for DurableTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DurableTool")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl DurableTool {
    pub(crate) fn all(
        toolbox: &Arc<Toolbox>,
        journal: &Journal,
        shared: &Arc<Shared>,
    ) -> Result<Vec<DurableTool>, SchemaError> {
        toolbox
            .specs()
            .map(|spec| {
                Ok(DurableTool {
                    name: spec.name.clone(),
                    description: spec.description.clone(),
                    // rig's Chat Completions wire sends `parameters` as given and no
                    // `strict` flag (unless the user opts in with `with_strict_tools`,
                    // which rewrites the schema itself): the plain input schema.
                    parameters: schema::input_schema(spec)?,
                    toolbox: Arc::clone(toolbox),
                    journal: journal.clone(),
                    shared: Arc::clone(shared),
                })
            })
            .collect()
    }

    /// The tool's name, as the model calls it.
    pub fn name(&self) -> &str {
        &self.name
    }

    async fn call(&self, name: String, rig_args: String, dispatch: &Dispatch) -> Reply {
        // The model's call id, noted by `CallIds` when rig announced the dispatch; the
        // raw argument text, from the journaled reply that asked for the call, when rig
        // dispatches what it read from it (rig hands tools a re-serialization, which
        // would hide duplicate keys); rig's arguments when a hook rewrote them.
        let call_id = self.shared.take_call_id(dispatch.id());
        let arguments = match &call_id {
            Some(id) => self.shared.arguments(id, &name, rig_args),
            None => ToolArguments::Text(rig_args),
        };
        let call = ModelToolCall {
            id: call_id.unwrap_or_else(|| format!("rig-{}", dispatch.id().as_u64())),
            name,
            arguments,
        };
        match self.toolbox.dispatch(&self.journal, &call).await {
            Ok(result) => Reply::Outcome(Ok(Outcome::ToolResult {
                result: rig_result(&result),
            })),
            Err(error) => match ToolResult::refused(&call, &error) {
                // The model got the call wrong: it reads why and can correct itself.
                Some(refused) => Reply::Outcome(Ok(Outcome::ToolResult {
                    result: RigToolResult::failed(
                        ToolExecutionError::invalid_args(error.to_string())
                            .with_model_output(RigToolOutput::json(refused.output.content)),
                    ),
                })),
                None => Reply::Outcome(Err(self.stop(error))),
            },
        }
    }

    /// A runtime error (store failure, `ReplayUnsafe`, lease lost, ...) stops the run:
    /// rig fails the prompt with this report, and the typed error waits in
    /// [`DurableRig::take_error`](crate::DurableRig::take_error).
    fn stop(&self, error: DurableError) -> ErrorReport {
        let report = ErrorReport::new(
            ErrorKind::HandlerUnavailable,
            format!(
                "durable stopped the run at tool `{}`: {error} \
                 (`DurableRig::take_error` gives the typed error)",
                self.name
            ),
        )
        .with_retryable(false);
        self.shared.stopped(error);
        report
    }
}

/// What rig tells the model: the content as JSON (a string as text); a tool failure
/// (now or recorded) as a failed result whose model output is `{"error": ...}`.
fn rig_result(result: &ToolResult) -> RigToolResult {
    let output = match &result.output.content {
        Value::String(text) => RigToolOutput::text(text.clone()),
        other => RigToolOutput::json(other.clone()),
    };
    if result.is_error() {
        RigToolResult::failed(
            ToolExecutionError::other(result.content_text()).with_model_output(output),
        )
    } else {
        RigToolResult::success(output)
    }
}

impl Serve for DurableTool {
    type Family = family::Tool;

    fn descriptor(&self) -> HandlerDescriptor {
        HandlerDescriptor {
            key: rig_core::effect::tool_key(&self.name),
            family: FamilyDescriptor::Tool {
                name: self.name.clone(),
                description: self.description.clone(),
                parameters: self.parameters.clone(),
                embedding: None,
            },
            layers: Vec::new(),
        }
    }

    async fn serve(&self, kind: EffectKind, dispatch: Dispatch) -> Reply {
        match kind {
            EffectKind::ToolCall { name, args } => self.call(name, args, &dispatch).await,
            other => Reply::Outcome(Err(ErrorReport::new(
                ErrorKind::HandlerUnavailable,
                format!(
                    "durable tool `{}` cannot serve a `{}` effect",
                    self.name,
                    other.name()
                ),
            ))),
        }
    }
}
