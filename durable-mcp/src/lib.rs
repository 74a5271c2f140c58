#![cfg_attr(docsrs, feature(doc_cfg))]
//! MCP for `durable`, both directions, on [rmcp](https://docs.rs/rmcp) (the official Rust
//! MCP SDK): serve a [`Toolbox`](durable_core::Toolbox) as an MCP server whose
//! `tools/call`s are journaled ([`DurableMcpServer`]), and call a remote MCP server's tools
//! as durable tools ([`RemoteTools`]). Reached as `durable::mcp` with the facade's `mcp`
//! feature.
//!
//! # Serving a toolbox
//!
//! ```no_run
//! # async fn demo(durable: durable_core::Durable, toolbox: durable_core::Toolbox) -> Result<(), Box<dyn std::error::Error>> {
//! use durable_mcp::DurableMcpServer;
//!
//! let server = DurableMcpServer::builder(durable, toolbox, "billing").start().await?;
//! server.serve_stdio().await?; // or mount `server.http_service(Default::default())`
//! # Ok(()) }
//! ```
//!
//! `tools/list` is [`Toolbox::mcp_tools`](durable_core::Toolbox::mcp_tools): each tool's
//! `inputSchema`, and annotations derived from its replay class
//! ([`McpAnnotations::for_class`](durable_core::McpAnnotations::for_class)).
//!
//! ## Exactly once: a call id per call
//!
//! A client that sends a call id in the request's `_meta`, under [`CALL_ID_META`]
//! (`{"_meta": {"durable/callId": "order-17-email"}}`), gets exactly-once across
//! dropped connections and server restarts. The call runs in a durable session of its
//! own, `<prefix><first 32 hex digits of the SHA-256 of the call id>` (prefix
//! `mcp-<server name>-call-` by default, [`call_session_prefix`](DurableMcpServerBuilder::call_session_prefix)),
//! created or resumed with [`start_or_resume`](durable_core::Durable::start_or_resume)
//! in the [`CALL_QUEUE`] queue (`mcp`); the call is the session's only call, in step 0.
//! Once the call has a definite outcome (a result or a recorded tool failure) the
//! session is completed: no pool or [`recover_next`](durable_core::Durable::recover_next)
//! claims it, it can be purged, and a retry reads the recorded outcome from the store.
//! Otherwise (in doubt, awaiting approval, refused) the session is released, so a retry
//! re-runs step 0 and the journal decides:
//!
//! - a recorded result (or recorded tool failure) is returned; nothing runs again;
//! - a `pure` call in doubt runs again; an `idempotent_with_key` one runs again with its
//!   recorded key;
//! - an `unsafe_on_replay` call in doubt (the server died while it ran) is refused with
//!   [`codes::IN_DOUBT`], whose message and `data.call` name the durable call an operator
//!   resolves (`durable resolve <call> --happened --result <json>` or
//!   `--did-not-happen`); a retry after that returns the operator's result, or runs the
//!   call if it did not happen;
//! - the same call id with another tool or other arguments is refused with
//!   [`codes::CALL_ID_REUSED`], and nothing runs (the session's metadata records the tool
//!   and a hash of the arguments, in which each secret argument's value is a keyed
//!   digest under the store's own key: a changed secret is another call, and the value
//!   is not recoverable from the metadata without the store).
//!
//! Two requests with the same call id at once are serialized in the server: the second
//! waits, then gets the first's recorded result. The same call id sent to another replica
//! while the first still runs it finds its session leased and answers [`codes::BUSY`]
//! (retry later).
//!
//! Call ids must be **globally unique** (UUIDs, say): they are not namespaced per client
//! or per MCP session, so two clients that pick the same call id get the same call (the
//! second gets the first's result, or [`codes::CALL_ID_REUSED`] for other arguments).
//!
//! ## Replicas and restarts
//!
//! The server's own session is held by one process at a time: a second replica cannot
//! [`start`](DurableMcpServerBuilder::start) under the same server session
//! ([`ServeError::Session`], `Leased`). Give each replica its own
//! [`session_id`](DurableMcpServerBuilder::session_id), but keep the server name (or
//! [`call_session_prefix`](DurableMcpServerBuilder::call_session_prefix)) shared, so that a
//! call id retried on another replica lands on the same call session. A server restarted
//! after a crash under the default `host-pid` owner cannot `start` either (the crashed
//! process's lease on its session is live: `Leased`) until that lease expires; give the
//! server's runtime a stable [`owner`](durable_core::DurableBuilder::owner), per replica,
//! so that a restart takes its sessions back at once.
//!
//! ## Calls without a call id: the server's session
//!
//! A call without a call id runs in the server's own long-lived session
//! ([`session_id`](DurableMcpServerBuilder::session_id), default `mcp-<server name>`,
//! stable across restarts), one step per call: a checkpoint follows every call that
//! reached an outcome. Such calls are **serialized** through the session, in arrival
//! order (one step, one call: the journal's identities stay simple and a crash leaves at
//! most one call in doubt); calls with a call id run concurrently beside them, each in
//! its own session.
//!
//! On start the server resumes its session and moves it to a fresh step
//! ([`Session::dangerous_checkpoint_unreplayed`](durable_core::Session::dangerous_checkpoint_unreplayed):
//! a step is one request, and a request a crash interrupted is never asked for again,
//! since its client is gone).
//!
//! ## The barrier is server-wide
//!
//! An `unsafe_on_replay` call in doubt anywhere on this server (in its own session, or in
//! any call session under its prefix) makes every later call with a side effect fail
//! with [`codes::IN_DOUBT`] (naming the in-doubt call and the `durable resolve` command)
//! until an operator resolves it, **with or without a call id**: a call id does not
//! bypass the barrier, and call id A in doubt bars call id B. `pure` calls still run.
//! Before each non-pure call the server asks the store for in-doubt calls
//! ([`Operator::in_doubt`](durable_core::Operator::in_doubt)), leaving out the calls that
//! run in this process right now. On start it takes back (and gives up) the call
//! sessions a crashed run under the same owner left leased with calls issued, so that
//! the store sees their calls as in doubt.
//!
//! Without a call id a retry is a new call: a client that needs retries sends call ids.
//!
//! A call that needs a person's approval must be sent with a call id: the call id's
//! session waits for the decision ([`codes::AWAITING_APPROVAL`], naming the durable call
//! to approve or deny), and the same call id sent again once decided runs it or returns
//! the denial. Without a call id it is refused with [`codes::CALL_ID_REQUIRED`]: before
//! anything is journaled when the runtime's
//! [`approval_policy`](durable_core::DurableBuilder::approval_policy) asks for it; when
//! the tool itself asks (`approval = "required"`), its request is denied at once (by
//! `durable-mcp`, audited), so that later calls without a call id are not held up.
//!
//! Every call runs to its end in a task of its own, whatever becomes of its request: a
//! client that disconnects or cancels does not leave the call half-run, and its retry with
//! the same call id gets the recorded result. The server counts these tasks:
//! [`serve_stdio`](DurableMcpServer::serve_stdio) waits for them before it returns, and
//! over HTTP the process calls [`drain`](DurableMcpServer::drain) after the HTTP server
//! stopped (graceful shutdown) and before it exits; a runtime dropped while calls run
//! leaves them in doubt, as a crash would.
//!
//! ## MCP sessions and clients
//!
//! Neither the client nor the MCP session (`Mcp-Session-Id` over HTTP, the connection
//! over stdio) keys anything durable: an MCP session does not survive a server restart,
//! and a client may reconnect under another one. Only the call id does, so every client
//! of one server shares its session and its barrier, and two clients sending the same
//! call id get the same call.
//!
//! ## Refusals
//!
//! A call the client got wrong (unknown tool, arguments that are not exact JSON or do not
//! fit the tool's type, a malformed call id) is a JSON-RPC error [`codes::INVALID_PARAMS`]
//! whose message names the JSON path (also in `data.path`); it is refused before any
//! session is touched, so nothing is journaled ([`Toolbox::check`](durable_core::Toolbox::check)).
//! A tool that ran and failed is a normal result with `isError: true`. The other codes are
//! in [`codes`].
//!
//! # Calling remote tools
//!
//! [`RemoteTools`] wraps the tools of a connected server (any rmcp client transport) as
//! durable [`Tool`](durable_core::Tool)s, journaled like any tool in the session that
//! dispatches them; see its docs for how each tool's replay class is chosen. Each call
//! carries its durable call id under [`CALL_ID_META`], so a durable server on the other
//! side deduplicates re-sent calls end to end.
//!
//! Remote tools have no secret arguments: MCP has no way to mark one, so every argument
//! of a remote call is journaled in clear (in the local store). Keep secrets out of
//! remote tools' arguments, or wrap such a tool in a local `#[durable_tool]` with a
//! `#[secret]` argument.

mod call_id;
mod error;
mod remote;
mod server;

pub use call_id::{CALL_ID_META, MAX_CALL_ID_BYTES};
pub use error::{RemoteToolsError, ServeError, codes};
pub use remote::{DEFAULT_CALL_TIMEOUT, RemoteTool, RemoteTools, SkippedTool};
pub use server::{CALL_QUEUE, DurableMcpServer, DurableMcpServerBuilder};

/// The rmcp crate this one is built on (the version whose types its API uses).
pub use rmcp;
