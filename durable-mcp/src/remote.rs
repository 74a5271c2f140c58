//! [`RemoteTools`]: a connected MCP server's tools as durable [`Tool`]s.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use durable_core::ToolSpec;
use durable_core::{
    DurableError, Journal, ReplayClass, Tool, ToolContext, ToolOutput, Toolbox, canonical,
};
use rmcp::RoleClient;
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ErrorCode, RequestMetaObject, Tool as McpTool,
};
use rmcp::service::{Peer, ServiceError};
use serde_json::{Value, json};
use tokio::sync::oneshot;

use crate::call_id::CALL_ID_META;
use crate::error::{RemoteToolsError, codes};

/// A boxed, sendable future (what [`Tool::invoke`] returns).
type BoxFuture<'a, T> = std::pin::Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Builds durable [`Tool`]s for the tools of a connected MCP server.
///
/// Each remote tool gets a replay class, which decides what a resumed session does with
/// a call the crash left in doubt:
///
/// - the class given with [`class`](Self::class), whatever the server says;
/// - else, only after [`trust_annotations`](Self::trust_annotations), the server's
///   annotations (the MCP specification calls them untrusted hints): `readOnlyHint` →
///   `pure`; `idempotentHint` → `idempotent_with_key` (re-executed after a crash, with
///   the same arguments and the same call id); anything else → `unsafe_on_replay`;
/// - else `unsafe_on_replay`: never re-run blindly, refused while in doubt until an
///   operator resolves it.
///
/// Every call sends its durable call id in `_meta` under [`CALL_ID_META`]: a durable MCP
/// server on the other side runs it once however often it is re-sent (a re-executed
/// `idempotent_with_key` call keeps its call id).
///
/// ```no_run
/// # async fn demo(peer: rmcp::service::Peer<rmcp::RoleClient>) -> Result<(), Box<dyn std::error::Error>> {
/// use durable_core::ReplayClass;
/// use durable_mcp::RemoteTools;
///
/// let toolbox = RemoteTools::new(peer)
///     .class("lookup", ReplayClass::Pure)
///     .class("send_email", ReplayClass::UnsafeOnReplay)
///     .toolbox()
///     .await?;
/// # let _ = toolbox; Ok(()) }
/// ```
#[derive(Debug)]
pub struct RemoteTools {
    peer: Peer<RoleClient>,
    classes: BTreeMap<String, ReplayClass>,
    trust: bool,
    timeout: Duration,
}

/// How long a remote call may take by default before its outcome counts as unknown.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(300);

impl RemoteTools {
    /// The tools of the server `peer` is connected to (e.g.
    /// `().serve(transport).await?.peer().clone()`).
    pub fn new(peer: Peer<RoleClient>) -> Self {
        RemoteTools {
            peer,
            classes: BTreeMap::new(),
            trust: false,
            timeout: DEFAULT_CALL_TIMEOUT,
        }
    }

    /// How long one remote call may take (default [`DEFAULT_CALL_TIMEOUT`]). A call
    /// that takes longer is abandoned and its outcome is unknown: a `pure` call is not
    /// recorded (the next attempt runs it again), any other is left in doubt. This is
    /// also how a server that died mid-call is noticed: rmcp's streamable HTTP client may keep waiting for a
    /// response that never comes.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The replay class of the tool `name`: what you know about its effect.
    pub fn class(mut self, name: impl Into<String>, class: ReplayClass) -> Self {
        self.classes.insert(name.into(), class);
        self
    }

    /// Takes the class of tools without a [`class`](Self::class) from the server's
    /// annotations. Only for a server you trust: a wrong `readOnlyHint` or
    /// `idempotentHint` makes a crashed call run twice.
    pub fn trust_annotations(mut self) -> Self {
        self.trust = true;
        self
    }

    /// The server's tools (every page of `tools/list`), each with its class.
    ///
    /// # Errors
    /// [`RemoteToolsError::List`] when listing fails, [`RemoteToolsError::UnknownTool`]
    /// for a class given to a tool the server does not list.
    pub async fn tools(self) -> Result<Vec<RemoteTool>, RemoteToolsError> {
        let listed = self
            .peer
            .list_all_tools()
            .await
            .map_err(|e| RemoteToolsError::List(e.to_string()))?;
        for name in self.classes.keys() {
            if !listed.iter().any(|t| t.name == name.as_str()) {
                return Err(RemoteToolsError::UnknownTool {
                    name: name.clone(),
                    available: listed
                        .iter()
                        .map(|t| t.name.as_ref())
                        .collect::<Vec<_>>()
                        .join(", "),
                });
            }
        }
        Ok(listed
            .into_iter()
            .map(|tool| {
                let class = self
                    .classes
                    .get(tool.name.as_ref())
                    .copied()
                    .unwrap_or_else(|| class_from_annotations(&tool, self.trust));
                RemoteTool::new(self.peer.clone(), &tool, class, self.timeout)
            })
            .collect())
    }

    /// The server's tools in a new [`Toolbox`]. A tool whose name a toolbox refuses
    /// (MCP allows `.` and `/` in names, durable does not) is skipped, with a warning;
    /// [`toolbox_with_report`](Self::toolbox_with_report) says which.
    ///
    /// # Errors
    /// As [`tools`](Self::tools).
    pub async fn toolbox(self) -> Result<Toolbox, RemoteToolsError> {
        Ok(self.toolbox_with_report().await?.0)
    }

    /// The server's tools in a new [`Toolbox`], and the tools skipped (each with why).
    ///
    /// # Errors
    /// As [`tools`](Self::tools).
    pub async fn toolbox_with_report(
        self,
    ) -> Result<(Toolbox, Vec<SkippedTool>), RemoteToolsError> {
        let mut toolbox = Toolbox::new();
        let mut skipped = Vec::new();
        for tool in self.tools().await? {
            let name = tool.spec.name.clone();
            if let Err(e) = toolbox.register(tool) {
                tracing::warn!(tool = %name, error = %e, "a remote MCP tool was skipped: durable cannot register it");
                skipped.push(SkippedTool {
                    name,
                    reason: e.to_string(),
                });
            }
        }
        Ok((toolbox, skipped))
    }
}

/// A remote tool [`RemoteTools::toolbox_with_report`] left out.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SkippedTool {
    /// The tool's name on the server.
    pub name: String,
    /// Why the toolbox refused it (e.g. a `.` or `/` in its name).
    pub reason: String,
}

/// The class a tool's annotations imply when they are trusted; `unsafe_on_replay`
/// otherwise.
fn class_from_annotations(tool: &McpTool, trust: bool) -> ReplayClass {
    let hints = tool.annotations.as_ref().filter(|_| trust);
    match hints {
        Some(a) if a.read_only_hint == Some(true) => ReplayClass::Pure,
        Some(a) if a.idempotent_hint == Some(true) => ReplayClass::IdempotentWithKey,
        _ => ReplayClass::UnsafeOnReplay,
    }
}

/// One tool of a remote MCP server, journaled like any durable tool.
///
/// Its result is the call's `structuredContent` when the server sends one, else the text
/// of a single text block, else the content blocks as JSON; a result with `isError` is a
/// tool failure (recorded, returned on replay). A refusal the server answers as an
/// invalid-params error is a recorded failure too (nothing ran there). A lost connection,
/// no answer within the [timeout](RemoteTools::timeout), or a durable server answering
/// that the call is in doubt (or busy), leaves an
/// `idempotent_with_key` or `unsafe_on_replay` call in doubt (its outcome is unknown) and
/// returns [`DurableError::ReplayUnsafe`]. A `pure` call whose outcome is unknown is not
/// recorded at all: it returns a transient [`StoreError::Database`](durable_core::StoreError::Database)
/// error (backend `remote MCP server`), and the next attempt runs it again.
#[derive(Debug, Clone)]
pub struct RemoteTool {
    peer: Peer<RoleClient>,
    spec: ToolSpec,
    timeout: Duration,
}

impl RemoteTool {
    fn new(peer: Peer<RoleClient>, tool: &McpTool, class: ReplayClass, timeout: Duration) -> Self {
        let schema = Value::Object((*tool.input_schema).clone());
        let description = tool.description.as_deref().unwrap_or_default();
        RemoteTool {
            peer,
            spec: ToolSpec::new(tool.name.to_string(), description, class, schema),
            timeout,
        }
    }

    async fn call_remote(&self, ctx: ToolContext, args: Value) -> Result<Value, Remote> {
        let Value::Object(arguments) = args else {
            return Err(Remote::Failed("arguments must be a JSON object".into()));
        };
        let mut meta = RequestMetaObject::new();
        meta.insert(CALL_ID_META.into(), json!(ctx.call_id().as_str()));
        let mut params =
            CallToolRequestParams::new(self.spec.name.clone()).with_arguments(arguments);
        params.meta = Some(meta);
        let Ok(answer) = tokio::time::timeout(self.timeout, self.peer.call_tool(params)).await
        else {
            return Err(Remote::Unknown(format!(
                "no answer within {} ms",
                self.timeout.as_millis()
            )));
        };
        match answer {
            Ok(result) if result.is_error == Some(true) => Err(Remote::Failed(text_of(&result))),
            Ok(result) => Ok(value_of(result)),
            Err(ServiceError::McpError(e)) if definite(e.code) => Err(Remote::Failed(format!(
                "refused by the MCP server: {}",
                e.message
            ))),
            Err(e) => Err(Remote::Unknown(e.to_string())),
        }
    }
}

/// How a remote call ended without a result.
enum Remote {
    /// The tool failed, or the server refused the call: nothing more will happen.
    Failed(String),
    /// The outcome is unknown (connection lost, the server's call is in doubt).
    Unknown(String),
}

/// A `pure` remote call whose outcome is unknown (not recorded; the next attempt re-runs it).
#[derive(Debug)]
struct UnknownOutcome(String);

impl std::fmt::Display for UnknownOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UnknownOutcome {}

/// A failure recorded in the journal.
#[derive(Debug)]
struct RemoteFailure(String);

impl std::fmt::Display for RemoteFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Error codes after which the server certainly did not run the call.
fn definite(code: ErrorCode) -> bool {
    code == codes::INVALID_PARAMS
        || code == ErrorCode::METHOD_NOT_FOUND
        || code == codes::CALL_ID_REUSED
}

fn text_of(result: &CallToolResult) -> String {
    let texts: Vec<&str> = result
        .content
        .iter()
        .filter_map(|block| block.as_text().map(|t| t.text.as_str()))
        .collect();
    if texts.is_empty() {
        "the MCP tool failed (no message)".into()
    } else {
        texts.join("\n")
    }
}

fn value_of(result: CallToolResult) -> Value {
    if let Some(structured) = result.structured_content {
        return structured;
    }
    match result.content.as_slice() {
        [block] if block.as_text().is_some() => {
            Value::String(block.as_text().map(|t| t.text.clone()).unwrap_or_default())
        }
        blocks => serde_json::to_value(blocks).unwrap_or(Value::Null),
    }
}

/// The idempotency key of an `idempotent_with_key` remote call: the tool and the
/// canonical hash of its arguments (the server said that repeating the same arguments
/// has no additional effect, so the same arguments may share a key).
fn argument_key(tool: &str, args: &Value) -> Result<String, DurableError> {
    let hash = canonical::input_hash(args).map_err(|source| DurableError::InvalidArguments {
        tool: tool.to_owned(),
        source,
    })?;
    Ok(format!("mcp:{tool}:{hash}"))
}

impl Tool for RemoteTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn invoke<'a>(
        &'a self,
        journal: &'a Journal,
        args: Value,
    ) -> BoxFuture<'a, Result<ToolOutput, DurableError>> {
        Box::pin(async move {
            let spec = &self.spec;
            let mut call = journal.tool(spec, args.clone());
            if spec.class == ReplayClass::IdempotentWithKey {
                call = call.key(argument_key(&spec.name, &args)?);
            }
            // An unknown outcome must not be recorded as a failure: the body reports it
            // here and never finishes, and dropping the journaled call leaves its row
            // issued, in doubt, as after a crash.
            let (unknown_tx, unknown_rx) = oneshot::channel::<(String, durable_core::CallId)>();
            let unknown_tx = Arc::new(Mutex::new(Some(unknown_tx)));
            let pure = spec.class == ReplayClass::Pure;
            let run = call.run(|ctx: ToolContext| {
                let args = args.clone();
                let unknown_tx = Arc::clone(&unknown_tx);
                async move {
                    let row = ctx.call_id().clone();
                    match self.call_remote(ctx, args).await {
                        Ok(value) => Ok(value),
                        Err(Remote::Failed(message)) => Err(RemoteFailure(message)),
                        Err(Remote::Unknown(message)) => {
                            let sender = unknown_tx.lock().ok().and_then(|mut s| s.take());
                            if let Some(sender) = sender {
                                let _ = sender.send((message, row));
                            }
                            std::future::pending().await
                        }
                    }
                }
            });
            tokio::pin!(run);
            tokio::select! {
                biased;
                Ok((message, row)) = unknown_rx => Err(if pure {
                    // A `pure` call is recorded only once it has an outcome: nothing was
                    // written, so the next attempt runs it again.
                    DurableError::Store(durable_core::StoreError::database(
                        "remote MCP server",
                        UnknownOutcome(format!(
                            "`{}`: the outcome is unknown ({message}); nothing was recorded, \
                             so the next attempt runs this pure call again",
                            spec.name
                        )),
                    ))
                } else {
                    DurableError::ReplayUnsafe {
                        call: row,
                        tool: spec.name.clone(),
                        class: spec.class,
                        refused_tool: spec.name.clone(),
                        reason: format!(
                            "the MCP call's outcome is unknown ({message}), so it is in doubt; \
                             resuming the session re-executes an `idempotent_with_key` call with the \
                             same call id, and an `unsafe_on_replay` one waits for an operator"
                        ),
                    }
                }),
                outcome = &mut run => ToolOutput::from_call::<Value, RemoteFailure>(spec, outcome),
            }
        })
    }
}
