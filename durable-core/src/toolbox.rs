//! The [`Toolbox`]: a registry of tools that exports their definitions for a model and
//! dispatches the model's tool calls through the journal.
//!
//! An agent loop uses it in three places:
//!
//! 1. **Tell the model what it may call**: [`openai_tools`](Toolbox::openai_tools)
//!    (strict mode), [`anthropic_tools`](Toolbox::anthropic_tools) or
//!    [`mcp_tools_list`](Toolbox::mcp_tools_list) (see [`schema`] for
//!    the schema policy of each dialect).
//! 2. **Run what it asked for**: turn the model's tool calls into [`ModelToolCall`]s
//!    (from the transcript's [`Block::ToolCall`]s, or from provider JSON), then
//!    [`dispatch_all`](Toolbox::dispatch_all) them: the calls of one turn run
//!    concurrently, each through [`Tool::invoke`] and so through the journal.
//! 3. **Answer the model**: each [`ToolResult`] becomes a transcript block or a provider
//!    message; a call the model got wrong (unknown tool, invalid arguments) becomes an
//!    error result the model can read ([`ToolResult::refused`]).
//!
//! # What dispatch guarantees
//!
//! - An **unknown tool** is refused with [`DurableError::UnknownTool`], listing the
//!   registered names; nothing is journaled and nothing runs.
//! - **Arguments** are validated before anything is journaled: raw JSON text (OpenAI
//!   sends a string) goes through [`args::parse_arguments`] (malformed JSON, duplicate
//!   keys, NaN, integers beyond ±(2^53−1), nesting and size limits), a JSON value
//!   (Anthropic sends an object) through [`args::check_value`]; either way the error is
//!   [`DurableError::InvalidArguments`] naming the tool and the JSON path. Arguments
//!   that are valid JSON but do not fit the tool's type are refused by the tool itself
//!   with [`DurableError::ArgumentsMismatch`] (the path of the bad field), again with
//!   nothing journaled.
//! - **Secret arguments** (`#[secret]`) of a reply journaled by
//!   [`Journal::model`](crate::Journal::model) arrive masked (`{"$secret": "k1:…"}`):
//!   dispatch puts back the clear value the journal holds in memory, and the tool
//!   receives it. After a restart the journal no longer holds it: a call with a recorded
//!   outcome returns it, and any other is refused with
//!   [`SecretUnavailable`](crate::ArgumentErrorKind::SecretUnavailable) (an error result
//!   asking the model to send the call again), never run with the placeholder. Argument
//!   errors never quote a secret's value (see [`secret`]).
//! - **`null` for an optional argument** means "not given": it is removed
//!   ([`schema::drop_optional_nulls`]) before the call is hashed, so serde sees a missing
//!   field (`None`, or the `#[serde(default)]`), and OpenAI's `{"cc": null}` and
//!   Anthropic's `{}` are the same call.
//! - **Parallel calls of one turn** ([`dispatch_all`](Toolbox::dispatch_all)) run
//!   concurrently, and their identities do not depend on completion order: the futures
//!   are created and first polled in the model's order, and the journal hands out
//!   ordinals in first-poll order under a fair lock, so two identical calls in one turn
//!   get ordinals 0 and 1 in the order the model listed them, on the first run and on
//!   every replay. Results come back in the model's order.
//!
//! # Example
//!
//! ```no_run
//! use durable_core::toolbox::{ModelToolCall, Toolbox, ToolResult};
//! use durable_core::transcript::Message;
//! use durable_core::{Session, Tool};
//!
//! # async fn demo(session: &mut Session<Message>, read_file: impl Tool, send_email: impl Tool)
//! # -> Result<(), Box<dyn std::error::Error>> {
//! let tools = Toolbox::new().with(read_file)?.with(send_email)?;
//! let definitions = tools.openai_tools().all()?; // send with the request
//!
//! // The model answered with an assistant message holding tool calls:
//! let reply: Message = session.model(|| async { call_the_model(&definitions).await }).await?;
//! let calls = ModelToolCall::from_message(&reply);
//! session.push(reply);
//!
//! let mut answers = Vec::new();
//! for (call, outcome) in calls.iter().zip(tools.dispatch_all(session.journal(), &calls).await) {
//!     match outcome {
//!         Ok(result) => answers.push(result),
//!         // Unknown tool or bad arguments: tell the model. Anything else: stop.
//!         Err(e) => answers.push(ToolResult::refused(call, &e).ok_or(e)?),
//!     }
//! }
//! session.push(ToolResult::message(&answers));
//! session.checkpoint().await?;
//! # Ok(()) }
//! # async fn call_the_model(_: &[serde_json::Value]) -> Result<Message, std::io::Error> { unreachable!("the example never calls the model") }
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use serde_json::{Value, json};

use crate::args::{self, ArgLimits, ArgumentError, ArgumentErrorKind};
use crate::error::DurableError;
use crate::journal::Journal;
use crate::schema::{self, SchemaError};
use crate::secret;
use crate::tool_spec::ToolSpec;

mod dispatch;
use crate::transcript::{Block, Message, Role, ToolCallBlock, ToolResultBlock};
pub use dispatch::{Tool, ToolOutput};
/// The boxed, `Send` future returned by [`Tool::invoke`].
pub use futures_util::future::BoxFuture;

/// Longest tool name quoted back in an [`DurableError::UnknownTool`] (a model can send
/// anything).
const MAX_QUOTED_NAME: usize = 128;

/// An error while building a [`Toolbox`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ToolboxError {
    /// A tool with this name is already registered.
    #[error(
        "a tool named `{0}` is already registered; tool names must be unique in a toolbox (rename one with `name = \"...\"`)"
    )]
    Duplicate(String),
    /// The tool's name is not accepted by every provider.
    #[error(transparent)]
    InvalidName(SchemaError),
}

/// A registry of tools by name, in name order.
///
/// Cheap to clone (tools are held in [`Arc`]s). See the [module docs](self).
#[derive(Clone, Default)]
pub struct Toolbox {
    tools: BTreeMap<String, Arc<dyn Tool>>,
    limits: ArgLimits,
    /// Rate limits named at registration, by tool ([`rate_limit`](Self::rate_limit)).
    rate_limits: BTreeMap<String, Arc<str>>,
}

impl fmt::Debug for Toolbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Toolbox")
            .field("tools", &self.tools.keys().collect::<Vec<_>>())
            .field("limits", &self.limits)
            .field("rate_limits", &self.rate_limits)
            .finish()
    }
}

impl Toolbox {
    /// An empty toolbox with the default [`ArgLimits`].
    pub fn new() -> Self {
        Toolbox::default()
    }

    /// Adds a tool, builder style: `Toolbox::new().with(a)?.with(b)?`.
    ///
    /// # Errors
    /// [`ToolboxError::Duplicate`] if the name is taken (a second tool of the same name
    /// is a bug, never silently replaced), [`ToolboxError::InvalidName`] if the name is
    /// not 1–64 characters of `A–Z a–z 0–9 _ -`.
    pub fn with(mut self, tool: impl Tool) -> Result<Self, ToolboxError> {
        self.register(tool)?;
        Ok(self)
    }

    /// Adds a tool. Same rules as [`with`](Self::with).
    pub fn register(&mut self, tool: impl Tool) -> Result<&mut Self, ToolboxError> {
        self.register_arc(Arc::new(tool))
    }

    /// Adds a tool already behind an [`Arc`] (e.g. shared with another toolbox).
    pub fn register_arc(&mut self, tool: Arc<dyn Tool>) -> Result<&mut Self, ToolboxError> {
        let name = tool.spec().name.clone();
        schema::check_name(&name).map_err(ToolboxError::InvalidName)?;
        secret::register(&name, &tool.spec().secret_args);
        if self.tools.contains_key(&name) {
            return Err(ToolboxError::Duplicate(name));
        }
        self.tools.insert(name, tool);
        Ok(self)
    }

    /// Makes the calls of `tool` wait under the fleet-wide rate limit `limit` (see
    /// [`limiter`](crate::limiter); define it with
    /// [`DurableBuilder::rate_limit`](crate::DurableBuilder::rate_limit)), unless the
    /// tool's own spec names one ([`ToolSpec::with_rate_limit`](crate::ToolSpec::with_rate_limit)).
    /// Only calls dispatched through this toolbox wait; a recorded result returned on a
    /// replay does not.
    ///
    /// ```
    /// # use durable_core::Toolbox;
    /// let tools = Toolbox::new().rate_limit("crm_lookup", "crm");
    /// # let _ = tools;
    /// ```
    pub fn rate_limit(mut self, tool: impl Into<String>, limit: impl Into<Arc<str>>) -> Self {
        self.rate_limits.insert(tool.into(), limit.into());
        self
    }

    /// Sets the limits applied to the model's argument text before it is parsed
    /// (default [`ArgLimits::default`]). The journal applies its own configured limits
    /// to the parsed value again.
    pub fn limits(mut self, limits: ArgLimits) -> Self {
        self.limits = limits;
        self
    }

    /// The argument limits in force.
    pub fn arg_limits(&self) -> &ArgLimits {
        &self.limits
    }

    /// The tool registered under `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.tools.get(name)
    }

    /// The registered names, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tools.keys().map(String::as_str)
    }

    /// The registered specs, in name order.
    pub fn specs(&self) -> impl Iterator<Item = &ToolSpec> {
        self.tools.values().map(|t| t.spec())
    }

    /// How many tools are registered.
    pub fn len(&self) -> usize {
        self.tools.len()
    }

    /// Whether no tool is registered.
    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }

    /// OpenAI Chat Completions tool definitions, strict mode
    /// ([`schema::openai_function`]), in name order.
    ///
    /// A tool strict mode cannot express (a free `serde_json::Value` argument, a map) is
    /// left out and listed in [`Definitions::skipped`] with the reason; the others are
    /// exported. Use [`Definitions::all`] to refuse a partial export instead.
    pub fn openai_tools(&self) -> Definitions {
        self.export(schema::openai_function)
    }

    /// OpenAI Responses API tool definitions, strict mode
    /// ([`schema::openai_response_tool`]), in name order; what cannot be exported is in
    /// [`Definitions::skipped`].
    pub fn openai_response_tools(&self) -> Definitions {
        self.export(schema::openai_response_tool)
    }

    /// Anthropic tool definitions ([`schema::anthropic_tool`]), in name order; what
    /// cannot be exported is in [`Definitions::skipped`].
    pub fn anthropic_tools(&self) -> Definitions {
        self.export(schema::anthropic_tool)
    }

    /// MCP tools ([`schema::mcp_tool`]), in name order; what cannot be exported is in
    /// [`Definitions::skipped`].
    pub fn mcp_tools(&self) -> Definitions {
        self.export(schema::mcp_tool)
    }

    /// The result of an MCP `tools/list` request, `{"tools": [...]}`, with every tool.
    ///
    /// # Errors
    /// [`IncompleteExport`] when a tool cannot be exported (see [`mcp_tools`](Self::mcp_tools)
    /// for a partial list).
    pub fn mcp_tools_list(&self) -> Result<Value, IncompleteExport> {
        Ok(json!({ "tools": self.mcp_tools().all()? }))
    }

    fn export(&self, dialect: fn(&ToolSpec) -> Result<Value, SchemaError>) -> Definitions {
        let mut definitions = Definitions::default();
        for spec in self.specs() {
            match dialect(spec) {
                Ok(tool) => definitions.tools.push(tool),
                Err(error) => definitions.skipped.push(error),
            }
        }
        definitions
    }

    /// Validates a call's arguments and finds its tool, journaling nothing; puts back the
    /// clear value of each masked secret argument that `journal` holds, and returns the
    /// names of those it does not hold.
    fn prepare(
        &self,
        journal: &Journal,
        call: &ModelToolCall,
    ) -> Result<Prepared<'_>, DurableError> {
        let tool = self.find(&call.name)?;
        let spec = tool.spec();
        let secrets = secret::secret_args(&spec.name, &spec.secret_args);
        let vault = &journal.inner.vault;
        let mut args = self.parse(spec, &call.arguments)?;
        if !secrets.is_empty()
            && let Some(whole) = vault.whole(&spec.name, &args)
        {
            // Arguments masked as a whole (text that did not read as an object): read
            // the original now, refused as it would have been.
            let original = whole.ok_or_else(|| secret::unavailable(&spec.name, None))?;
            args = self.parse(spec, &ToolArguments::from(original))?;
        }
        schema::drop_optional_nulls(&spec.input_schema, &mut args);
        let missing = if secrets.is_empty() {
            Vec::new()
        } else {
            vault.reveal(&spec.name, &secrets, &mut args)
        };
        Ok(Prepared {
            tool,
            args,
            withheld: missing,
        })
    }

    /// The tool called `name`, or [`DurableError::UnknownTool`].
    fn find(&self, name: &str) -> Result<&Arc<dyn Tool>, DurableError> {
        self.tools
            .get(name)
            .ok_or_else(|| DurableError::UnknownTool {
                name: quoted_name(name),
                available: if self.tools.is_empty() {
                    "(none)".to_owned()
                } else {
                    self.names().collect::<Vec<_>>().join(", ")
                },
            })
    }

    /// Checks a call as [`dispatch`](Self::dispatch) does before anything is journaled,
    /// and as the tool does before it journals (its [`Tool::check_args`]), journaling
    /// nothing and needing no session: for a harness that creates a session per call
    /// (an MCP server), so that a call the client got wrong leaves nothing behind.
    /// Returns the arguments as dispatch hashes them (`null` for an optional argument
    /// removed).
    ///
    /// Masked secret arguments are not put back (no journal holds their values here).
    ///
    /// # Errors
    /// [`DurableError::UnknownTool`], [`DurableError::InvalidArguments`] and
    /// [`DurableError::ArgumentsMismatch`], each naming the JSON path.
    pub fn check(&self, call: &ModelToolCall) -> Result<Value, DurableError> {
        let tool = self.find(&call.name)?;
        let spec = tool.spec();
        let mut args = self.parse(spec, &call.arguments)?;
        schema::drop_optional_nulls(&spec.input_schema, &mut args);
        tool.check_args(&args)?;
        Ok(args)
    }

    /// Parses and checks arguments; an error quotes nothing of a secret argument.
    fn parse(&self, spec: &ToolSpec, arguments: &ToolArguments) -> Result<Value, DurableError> {
        let invalid = |args: Option<&Value>, source| DurableError::InvalidArguments {
            tool: spec.name.clone(),
            source: secret::redact_argument_error(&spec.name, &spec.secret_args, args, source),
        };
        match arguments {
            ToolArguments::Text(raw) => {
                args::parse_arguments(raw, &self.limits).map_err(|e| invalid(None, e))
            }
            ToolArguments::Json(value) => {
                args::check_value(value, &self.limits).map_err(|e| invalid(Some(value), e))?;
                if !value.is_object() {
                    return Err(invalid(
                        Some(value),
                        ArgumentError {
                            path: "$".into(),
                            kind: ArgumentErrorKind::NotAnObject(json_type(value)),
                        },
                    ));
                }
                Ok(value.clone())
            }
        }
    }

    /// Dispatches one tool call through the journal.
    ///
    /// # Errors
    /// [`DurableError::UnknownTool`] and [`DurableError::InvalidArguments`] before
    /// anything is journaled; whatever the tool's [`invoke`](Tool::invoke) returns
    /// (e.g. [`DurableError::ArgumentsMismatch`], [`DurableError::ReplayUnsafe`]). A tool
    /// that ran and failed is an `Ok` result with
    /// [`is_error`](ToolOutput::is_error) set.
    pub async fn dispatch(
        &self,
        journal: &Journal,
        call: &ModelToolCall,
    ) -> Result<ToolResult, DurableError> {
        let Prepared {
            tool,
            args,
            withheld,
        } = self.prepare(journal, call)?;
        // The model's call id, for the call's span (see `telemetry`); the rate limit
        // named for the tool at registration.
        let journal = &journal
            .with_tool_call_id(call.id.as_str())
            .with_tool_rate_limit(self.rate_limits.get(&call.name).cloned());
        let output = if withheld.is_empty() {
            tool.invoke(journal, args).await?
        } else {
            // A replayed reply whose secret this process does not hold: a recorded
            // outcome is returned; nothing runs with the placeholder.
            let spec = tool.spec();
            let replayed = journal.tool(spec, args).replay_only(withheld).await;
            ToolOutput::from_call(spec, replayed)?
        };
        Ok(ToolResult {
            call_id: call.id.clone(),
            name: call.name.clone(),
            output,
        })
    }

    /// Dispatches the tool calls of one model turn concurrently; results are in the
    /// order of `calls`, one per call.
    ///
    /// The futures are created and first polled in the order of `calls` (which is what
    /// gives identical calls their ordinals, see the [module docs](self)); one call's
    /// failure does not stop the others. They run as one batch
    /// ([`Journal::join_calls`]): on a resume, a call left in doubt that one of them
    /// replays does not get its siblings refused before it was taken up.
    pub async fn dispatch_all(
        &self,
        journal: &Journal,
        calls: &[ModelToolCall],
    ) -> Vec<Result<ToolResult, DurableError>> {
        journal
            .join_calls(calls.iter().map(|call| self.dispatch(journal, call)))
            .await
    }
}

/// Tool definitions exported in one dialect, and the tools that dialect cannot express.
///
/// One tool that a dialect cannot express does not cost the others: it is left out of
/// [`tools`](Self::tools) and listed in [`skipped`](Self::skipped) with a
/// [`SchemaError`] naming the tool, the schema node and what to change. A skipped tool
/// is not offered to the model, but it stays registered: a call to it (a model can name
/// any tool) still dispatches, and an unknown tool's error lists it among the registered
/// names. Check `skipped` once at startup and leave such a tool out of the toolbox if
/// the model must not reach it (`durable::openai::ChatTools::dispatch_all` dispatches
/// only what was offered), or refuse a partial export with [`all`](Self::all).
///
/// ```
/// # use durable_core::toolbox::Toolbox;
/// # fn demo(tools: &Toolbox) -> Result<(), Box<dyn std::error::Error>> {
/// let definitions = tools.openai_tools();
/// for skipped in definitions.skipped() {
///     eprintln!("not offered to the model: {skipped}");
/// }
/// let request_tools = definitions.into_tools();
///
/// // Or: every tool, or an error listing each one that cannot be exported.
/// let request_tools = tools.openai_tools().all()?;
/// # let _ = request_tools; Ok(()) }
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
#[must_use = "a tool the dialect cannot express is only reported in `skipped()`"]
pub struct Definitions {
    tools: Vec<Value>,
    skipped: Vec<SchemaError>,
}

impl Definitions {
    /// The exported definitions, in name order.
    pub fn tools(&self) -> &[Value] {
        &self.tools
    }

    /// The tools left out, each with why (in name order).
    pub fn skipped(&self) -> &[SchemaError] {
        &self.skipped
    }

    /// The exported definitions, leaving out the skipped tools.
    pub fn into_tools(self) -> Vec<Value> {
        self.tools
    }

    /// Every tool's definition.
    ///
    /// # Errors
    /// [`IncompleteExport`], listing every tool that could not be exported.
    pub fn all(self) -> Result<Vec<Value>, IncompleteExport> {
        if self.skipped.is_empty() {
            Ok(self.tools)
        } else {
            Err(IncompleteExport {
                skipped: self.skipped,
            })
        }
    }
}

/// Some tools of a toolbox cannot be exported in a dialect ([`Definitions::all`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct IncompleteExport {
    /// Each tool left out, with why.
    pub skipped: Vec<SchemaError>,
}

impl fmt::Display for IncompleteExport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.skipped.len();
        write!(
            f,
            "{n} tool{} cannot be exported in this dialect: ",
            if n == 1 { "" } else { "s" }
        )?;
        for (i, error) in self.skipped.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{error}")?;
        }
        Ok(())
    }
}

/// A call ready to dispatch: its tool, its arguments (secret values put back where the
/// journal holds them), and the secret arguments it does not hold.
struct Prepared<'t> {
    tool: &'t Arc<dyn Tool>,
    args: Value,
    withheld: Vec<String>,
}

fn quoted_name(name: &str) -> String {
    match name.char_indices().nth(MAX_QUOTED_NAME) {
        None => name.to_owned(),
        Some((cut, _)) => format!("{}…", &name[..cut]),
    }
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A tool call's arguments as the model sent them.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolArguments {
    /// Raw JSON text (OpenAI sends arguments as a string): validated by
    /// [`args::parse_arguments`], which catches what parsing would hide (duplicate keys,
    /// NaN, out-of-range integers).
    Text(String),
    /// An already-parsed value (Anthropic sends an object): validated by
    /// [`args::check_value`].
    Json(Value),
}

impl From<String> for ToolArguments {
    fn from(raw: String) -> Self {
        ToolArguments::Text(raw)
    }
}

impl From<&str> for ToolArguments {
    fn from(raw: &str) -> Self {
        ToolArguments::Text(raw.to_owned())
    }
}

impl From<Value> for ToolArguments {
    /// A JSON string is taken as raw argument text (arguments are an object, so a
    /// string can only be the text of one); any other value as parsed arguments.
    fn from(value: Value) -> Self {
        match value {
            Value::String(raw) => ToolArguments::Text(raw),
            other => ToolArguments::Json(other),
        }
    }
}

/// One tool call requested by a model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelToolCall {
    /// The provider's call id (the tool result refers to it).
    pub id: String,
    /// The tool's name.
    pub name: String,
    /// The arguments.
    pub arguments: ToolArguments,
}

impl ModelToolCall {
    /// A call. `arguments` may be raw JSON text or a [`Value`] (a JSON string value is
    /// taken as raw text).
    pub fn new(
        id: impl Into<String>,
        name: impl Into<String>,
        arguments: impl Into<ToolArguments>,
    ) -> Self {
        ModelToolCall {
            id: id.into(),
            name: name.into(),
            arguments: arguments.into(),
        }
    }

    /// The call of a transcript [`ToolCallBlock`]. Its `arguments` may hold the raw text
    /// as a JSON string (how OpenAI sends it) or an object (how Anthropic sends it).
    pub fn from_block(block: &ToolCallBlock) -> Self {
        ModelToolCall::new(
            block.id.clone(),
            block.name.clone(),
            block.arguments.clone(),
        )
    }

    /// The tool calls of a transcript message, in order.
    pub fn from_message(message: &Message) -> Vec<Self> {
        message
            .tool_calls()
            .map(ModelToolCall::from_block)
            .collect()
    }

    /// A call from OpenAI JSON: a Chat Completions `tool_calls[]` entry
    /// (`{"id", "type": "function", "function": {"name", "arguments"}}`) or a Responses
    /// API `function_call` item (`{"type": "function_call", "call_id", "name",
    /// "arguments"}`). `None` if the value has neither shape.
    pub fn from_openai(value: &Value) -> Option<Self> {
        if let Some(function) = value.get("function") {
            let id = value.get("id")?.as_str()?;
            let name = function.get("name")?.as_str()?;
            let arguments = function.get("arguments")?.clone();
            return Some(ModelToolCall::new(id, name, arguments));
        }
        let id = value.get("call_id")?.as_str()?;
        let name = value.get("name")?.as_str()?;
        Some(ModelToolCall::new(
            id,
            name,
            value.get("arguments")?.clone(),
        ))
    }

    /// A call from an Anthropic `tool_use` content block
    /// (`{"type": "tool_use", "id", "name", "input"}`). `None` for any other block.
    pub fn from_anthropic(value: &Value) -> Option<Self> {
        if value.get("type")?.as_str()? != "tool_use" {
            return None;
        }
        let id = value.get("id")?.as_str()?;
        let name = value.get("name")?.as_str()?;
        Some(ModelToolCall::new(id, name, value.get("input")?.clone()))
    }
}

/// The answer to one [`ModelToolCall`].
#[derive(Debug, Clone, PartialEq)]
pub struct ToolResult {
    /// The call id it answers.
    pub call_id: String,
    /// The tool's name.
    pub name: String,
    /// What the tool returned (or its error, with `is_error`).
    pub output: ToolOutput,
}

impl ToolResult {
    /// Whether the tool failed.
    pub fn is_error(&self) -> bool {
        self.output.is_error
    }

    /// The error result to send the model for a call it got wrong, so it can correct
    /// itself: `Some` for [`UnknownTool`](DurableError::UnknownTool),
    /// [`InvalidArguments`](DurableError::InvalidArguments) and
    /// [`ArgumentsMismatch`](DurableError::ArgumentsMismatch) (content
    /// `{"error": "<message>"}`), `None` for runtime errors (store failures,
    /// `ReplayUnsafe`, ...) that the harness must handle rather than the model.
    pub fn refused(call: &ModelToolCall, error: &DurableError) -> Option<Self> {
        let model_error = matches!(
            error,
            DurableError::UnknownTool { .. }
                | DurableError::InvalidArguments { .. }
                | DurableError::ArgumentsMismatch { .. }
        );
        model_error.then(|| ToolResult {
            call_id: call.id.clone(),
            name: call.name.clone(),
            output: ToolOutput {
                content: json!({ "error": error.to_string() }),
                is_error: true,
            },
        })
    }

    /// The error result that tells the model a ceiling of the session's budget refused
    /// its call (nothing ran): content `{"error": "<refusal>", "limit": "<limit>",
    /// "spent": …, "ceiling": …}`. For a harness whose choice at a ceiling is to let
    /// the model know (wrap up, answer with what it has) rather than stop or park:
    /// [`refused`](Self::refused) leaves budget refusals to the harness.
    ///
    /// ```
    /// use durable_core::{DurableError, ModelToolCall, ToolResult};
    /// # fn on_error(call: &ModelToolCall, error: DurableError) -> Option<ToolResult> {
    /// match error {
    ///     DurableError::BudgetExceeded(refusal) => Some(ToolResult::over_budget(call, &refusal)),
    ///     other => ToolResult::refused(call, &other),
    /// }
    /// # }
    /// ```
    pub fn over_budget(call: &ModelToolCall, refusal: &crate::snapshot::BudgetExceeded) -> Self {
        ToolResult {
            call_id: call.id.clone(),
            name: call.name.clone(),
            output: ToolOutput {
                content: json!({
                    "error": refusal.to_string(),
                    "limit": refusal.limit.to_string(),
                    "spent": refusal.spent,
                    "ceiling": refusal.ceiling,
                }),
                is_error: true,
            },
        }
    }

    /// The output as text for providers that take a string: a JSON string as is,
    /// anything else as compact JSON.
    pub fn content_text(&self) -> String {
        match &self.output.content {
            Value::String(text) => text.clone(),
            other => other.to_string(),
        }
    }

    /// The transcript block ([`Block::ToolResult`]).
    pub fn to_block(&self) -> Block {
        Block::ToolResult(ToolResultBlock {
            call_id: self.call_id.clone(),
            content: self.output.content.clone(),
            is_error: self.output.is_error,
        })
    }

    /// A transcript message carrying this result.
    pub fn into_message(self) -> Message {
        Message::tool_result(self.call_id, self.output.content, self.output.is_error)
    }

    /// One tool message carrying several results, in order (a turn's answers).
    pub fn message(results: &[ToolResult]) -> Message {
        Message {
            role: Role::Tool,
            content: results.iter().map(ToolResult::to_block).collect(),
        }
    }

    /// An OpenAI Chat Completions tool message:
    /// `{"role": "tool", "tool_call_id", "content"}`.
    pub fn openai_message(&self) -> Value {
        json!({"role": "tool", "tool_call_id": self.call_id, "content": self.content_text()})
    }

    /// An OpenAI Responses API input item:
    /// `{"type": "function_call_output", "call_id", "output"}`.
    pub fn openai_response_item(&self) -> Value {
        json!({"type": "function_call_output", "call_id": self.call_id, "output": self.content_text()})
    }

    /// An Anthropic `tool_result` content block:
    /// `{"type": "tool_result", "tool_use_id", "content", "is_error"}`.
    pub fn anthropic_block(&self) -> Value {
        json!({
            "type": "tool_result",
            "tool_use_id": self.call_id,
            "content": self.content_text(),
            "is_error": self.output.is_error,
        })
    }

    /// An MCP `tools/call` result: `{"content": [{"type": "text", "text"}], "isError"}`,
    /// plus `structuredContent` when the output is a JSON object.
    pub fn mcp_result(&self) -> Value {
        let mut result = json!({
            "content": [{"type": "text", "text": self.content_text()}],
            "isError": self.output.is_error,
        });
        if self.output.content.is_object()
            && let Value::Object(map) = &mut result
        {
            map.insert("structuredContent".into(), self.output.content.clone());
        }
        result
    }
}

#[cfg(test)]
mod tests;
