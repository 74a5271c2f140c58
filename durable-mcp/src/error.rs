//! Errors: what a refused `tools/call` answers (JSON-RPC error codes and their `data`),
//! and the errors of building a server or a remote toolbox.

use durable_core::{DurableError, IncompleteExport, StoreError, ToolboxError};
use rmcp::ErrorData;
use serde_json::json;

/// The JSON-RPC error codes a [`DurableMcpServer`](crate::DurableMcpServer) answers a
/// refused `tools/call` with. Every such error's `data` holds `"durable"`, a short name of
/// the refusal (listed with each code), and the fields named below.
pub mod codes {
    use rmcp::model::ErrorCode;

    /// `-32602`, `"invalid_arguments"`: unknown tool, malformed arguments, a value that
    /// does not fit the tool's argument type, or a bad call id. `data.path` is the JSON
    /// path of the offending value, `data.tool` the tool. Nothing was journaled.
    pub const INVALID_PARAMS: ErrorCode = ErrorCode::INVALID_PARAMS;
    /// `-32010`, `"in_doubt"`: a call with a side effect was issued and its outcome is
    /// unknown (a crash mid-call), so the refused call did not run. `data.call` is the
    /// durable call to resolve (`durable resolve <call> --happened --result <json>` or
    /// `--did-not-happen`), `data.session` its session. Retry after the resolution.
    pub const IN_DOUBT: ErrorCode = ErrorCode(-32010);
    /// `-32011`, `"call_id_reused"`: this call id was first sent with another tool or
    /// other arguments; nothing ran. A call id names one call: send a new one.
    pub const CALL_ID_REUSED: ErrorCode = ErrorCode(-32011);
    /// `-32012`, `"busy"`: the call's session is held by another worker (another server
    /// replica, or a server that crashed holding it under another owner name); nothing
    /// ran. `data.retry_after_ms` says when its lease expires.
    pub const BUSY: ErrorCode = ErrorCode(-32012);
    /// `-32013`, `"awaiting_approval"`: the call awaits a person's decision; nothing ran.
    pub const AWAITING_APPROVAL: ErrorCode = ErrorCode(-32013);
    /// `-32014`, `"durable"`: any other refusal of the runtime (store unavailable, lease
    /// lost, budget exceeded, …). The message says what to do.
    pub const DURABLE: ErrorCode = ErrorCode(-32014);
    /// `-32015`, `"call_id_required"`: a call without a call id that needs a person's
    /// approval: nothing was run (nor
    /// journaled, when the runtime's policy asked for the approval). Send it with a call
    /// id (`_meta["durable/callId"]`): that call waits for the decision.
    pub const CALL_ID_REQUIRED: ErrorCode = ErrorCode(-32015);
}

/// How the server's errors name a call: by the client's call id, or, for a call sent
/// without one, by the JSON-RPC request id (which no person sees, so it is labelled).
#[derive(Debug, Clone, Copy)]
pub(crate) enum CallName<'a> {
    /// The client's call id (`_meta`).
    Id(&'a str),
    /// A call without a call id: its JSON-RPC request id.
    Request(&'a str),
}

impl std::fmt::Display for CallName<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallName::Id(id) => write!(f, "call `{id}`"),
            CallName::Request(request) => write!(f, "a call without a call id (request {request})"),
        }
    }
}

impl CallName<'_> {
    /// The call with the tool it is for: "call `c-1` (`send`)", or "a call of `send`
    /// without a call id (request 4)".
    pub(crate) fn of(self, tool: &str) -> String {
        match self {
            CallName::Id(id) => format!("call `{id}` (`{tool}`)"),
            CallName::Request(request) => {
                format!("a call of `{tool}` without a call id (request {request})")
            }
        }
    }
}

/// What the server answers for a runtime error of `call`.
pub(crate) fn to_mcp(error: &DurableError, call: CallName<'_>, session: &str) -> ErrorData {
    match error {
        DurableError::UnknownTool { name, .. } => ErrorData::new(
            codes::INVALID_PARAMS,
            error.to_string(),
            Some(json!({"durable": "invalid_arguments", "tool": name, "path": "$.name"})),
        ),
        DurableError::InvalidArguments { tool, source } => ErrorData::new(
            codes::INVALID_PARAMS,
            error.to_string(),
            Some(json!({"durable": "invalid_arguments", "tool": tool, "path": source.path})),
        ),
        DurableError::ArgumentsMismatch { tool, path, .. } => ErrorData::new(
            codes::INVALID_PARAMS,
            error.to_string(),
            Some(json!({"durable": "invalid_arguments", "tool": tool, "path": path})),
        ),
        DurableError::ReplayUnsafe {
            call: row,
            tool,
            refused_tool,
            ..
        } => ErrorData::new(
            codes::IN_DOUBT,
            format!(
                "{} was not run: {error}. Then send the call again",
                call.of(refused_tool)
            ),
            Some(json!({
                "durable": "in_doubt",
                "call": row.as_str(),
                "tool": tool,
                "refused_tool": refused_tool,
                "session": session,
            })),
        ),
        DurableError::Store(StoreError::Leased { remaining_ms, .. }) => ErrorData::new(
            codes::BUSY,
            format!(
                "{call} was not run: {error}. It is in flight on another worker, or a \
                 server that crashed holding it under another owner name (give the server a \
                 stable `DurableBuilder::owner`); retry later"
            ),
            Some(json!({"durable": "busy", "session": session, "retry_after_ms": remaining_ms})),
        ),
        DurableError::AwaitingApproval {
            call: row, tool, ..
        } => ErrorData::new(
            codes::AWAITING_APPROVAL,
            format!(
                "{} was not run: it awaits a person's decision (durable \
                 call `{row}`: `durable approve {row}` or `durable deny {row} --reason <text>`, or \
                 the console); nothing ran. Send the same call id again once decided: an \
                 approved call runs then, a denied one returns the denial",
                call.of(tool)
            ),
            Some(
                json!({"durable": "awaiting_approval", "call": row.as_str(), "tool": tool, "session": session}),
            ),
        ),
        other => ErrorData::new(
            codes::DURABLE,
            format!("{call} was not run or its outcome was not recorded: {other}"),
            Some(json!({"durable": "durable", "session": session})),
        ),
    }
}

/// Why a [`DurableMcpServer`](crate::DurableMcpServer) could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// A tool's schema cannot be published as an MCP tool (each such tool is listed).
    #[error("cannot publish the toolbox over MCP: {0}")]
    Schema(#[from] IncompleteExport),
    /// The server's session id or call-session prefix is not a valid id.
    #[error("invalid server configuration: {0}; choose another server name, session id or prefix")]
    InvalidId(StoreError),
    /// The server's own session could not be started or resumed.
    #[error(
        "cannot open the server's session `{session}`: {source}{}",
        leased_hint(source)
    )]
    Session {
        /// The session.
        session: String,
        /// Why.
        #[source]
        source: Box<DurableError>,
    },
    /// A tool definition does not read as an MCP tool (rmcp's `Tool`).
    #[error("cannot publish tool definitions over MCP: {0}")]
    ToolDefinition(String),
    /// The transport failed.
    #[error("MCP transport failed: {0}")]
    Transport(String),
}

fn leased_hint(error: &DurableError) -> &'static str {
    match error {
        DurableError::Store(StoreError::Leased { .. }) => {
            " (another server holds it. A second replica of this server: give each replica its \
             own `session_id(..)` but keep the server name (or `call_session_prefix`) shared, so \
             that a retried call id lands on the same call session. This server restarted after \
             a crash: with the default `host-pid` owner it is refused until the crashed \
             process's lease expires; give the runtime a stable `DurableBuilder::owner` so that \
             a restart takes its session back at once)"
        }
        _ => "",
    }
}

/// Why [`RemoteTools`](crate::RemoteTools) could not build its tools.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RemoteToolsError {
    /// Listing the server's tools failed.
    #[error("cannot list the MCP server's tools: {0}")]
    List(String),
    /// A class was given for a tool the server does not list.
    #[error(
        "a replay class was given for `{name}`, which the MCP server does not list (it lists: {available}); check the name"
    )]
    UnknownTool {
        /// The name given.
        name: String,
        /// The names listed, comma-separated.
        available: String,
    },
    /// A listed tool cannot be registered (its name, or a duplicate).
    #[error(transparent)]
    Toolbox(#[from] ToolboxError),
}
