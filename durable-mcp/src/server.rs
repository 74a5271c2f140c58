//! [`DurableMcpServer`]: a [`Toolbox`] served over MCP, every `tools/call` journaled.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex as StdMutex};

use durable_core::store::{CallStatus, SessionFilter, SessionStatus};
use durable_core::{
    Durable, DurableError, Message, ModelToolCall, ReplayClass, Session, SessionId, StartOptions,
    ToolArguments, ToolOutput, ToolResult, Toolbox, canonical,
};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, Implementation, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool as McpTool,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::{Value, json};
use tokio::sync::Mutex;

use crate::call_id::{call_session_id, client_call_id};
use crate::error::{CallName, ServeError, codes, to_mcp};

/// The queue of call sessions (calls with a call id): pools taking from their own queues
/// leave them alone.
pub const CALL_QUEUE: &str = "mcp";

/// Configures a [`DurableMcpServer`]: `DurableMcpServer::builder(durable, toolbox, "name")`.
#[derive(Debug)]
pub struct DurableMcpServerBuilder {
    durable: Durable,
    toolbox: Toolbox,
    name: String,
    version: String,
    instructions: Option<String>,
    session: Option<String>,
    call_prefix: Option<String>,
}

impl DurableMcpServerBuilder {
    /// The server version announced to clients (default: this crate's version).
    pub fn version(mut self, version: impl Into<String>) -> Self {
        self.version = version.into();
        self
    }

    /// Instructions announced to clients in the `initialize` result.
    pub fn instructions(mut self, instructions: impl Into<String>) -> Self {
        self.instructions = Some(instructions.into());
        self
    }

    /// The id of the server's own session, where calls without a call id run (default
    /// `mcp-<name>`). Keep it stable across restarts: its journal holds the barrier. One
    /// process holds it at a time: give each replica its own (and keep the name or the
    /// [`call_session_prefix`](Self::call_session_prefix) shared).
    pub fn session_id(mut self, id: impl Into<String>) -> Self {
        self.session = Some(id.into());
        self
    }

    /// The prefix of the sessions of calls with a call id (default `mcp-<name>-call-`);
    /// each such session is this prefix and 32 hex digits of the call id's SHA-256.
    pub fn call_session_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.call_prefix = Some(prefix.into());
        self
    }

    /// Checks the configuration, builds the `tools/list` answer, and opens the server's
    /// own session: resumed if it exists (its in-doubt calls hold the barrier again),
    /// then moved to a fresh step.
    ///
    /// # Errors
    /// [`ServeError::Schema`] for a tool MCP cannot describe, [`ServeError::InvalidId`]
    /// for a session id or prefix the store would refuse, [`ServeError::Session`] when the
    /// session cannot be opened (e.g. another server holds it).
    pub async fn start(self) -> Result<DurableMcpServer, ServeError> {
        let session = self.session.unwrap_or_else(|| format!("mcp-{}", self.name));
        let call_prefix = self
            .call_prefix
            .unwrap_or_else(|| format!("mcp-{}-call-", self.name));
        durable_core::validate::validate_id("session id", &session)
            .map_err(ServeError::InvalidId)?;
        durable_core::validate::validate_id("call session id", &call_session_id(&call_prefix, "x"))
            .map_err(ServeError::InvalidId)?;
        let tools = self
            .toolbox
            .mcp_tools()
            .all()?
            .into_iter()
            .map(|tool| {
                serde_json::from_value::<McpTool>(tool)
                    .map_err(|e| ServeError::ToolDefinition(e.to_string()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut implementation = Implementation::new(self.name.clone(), self.version.clone());
        implementation.title = Some(self.name.clone());
        let mut info = ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(implementation);
        if let Some(instructions) = self.instructions {
            info = info.with_instructions(instructions);
        }
        let server = DurableMcpServer {
            inner: Arc::new(Inner {
                durable: self.durable,
                toolbox: self.toolbox,
                info,
                tools,
                session_id: SessionId::new(session),
                call_prefix,
                server_session: Mutex::new(None),
                call_locks: StdMutex::new(HashMap::new()),
                running: StdMutex::new(HashSet::new()),
                in_flight: InFlight::default(),
            }),
        };
        let opened = server.inner.open_server_session().await?;
        *server.inner.server_session.lock().await = Some(opened);
        server.inner.reclaim_call_sessions().await;
        Ok(server)
    }
}

/// A [`Toolbox`] served as an MCP server; every `tools/call` is journaled in a durable
/// session (see the [crate docs](crate) for the design).
///
/// Cheap to clone: clones share the sessions. Serve it over stdio with
/// [`serve_stdio`](Self::serve_stdio), over streamable HTTP with
/// [`http_service`](Self::http_service), or over any rmcp transport with
/// [`rmcp::ServiceExt::serve`] (it implements [`ServerHandler`]).
#[derive(Clone, Debug)]
pub struct DurableMcpServer {
    inner: Arc<Inner>,
}

struct Inner {
    durable: Durable,
    toolbox: Toolbox,
    info: ServerConfig,
    tools: Vec<McpTool>,
    session_id: SessionId,
    call_prefix: String,
    /// The server's own session; `None` after an error left the handle unusable (the
    /// next call resumes it).
    server_session: Mutex<Option<Session<Message>>>,
    /// One lock per call session in use, so that two requests with the same call id
    /// never hold its lease at once (the second waits, then replays the first's result).
    call_locks: StdMutex<HashMap<String, Arc<Mutex<()>>>>,
    /// The call sessions whose call runs in this process right now: their rows are not
    /// in doubt, whatever the store says of their lease.
    running: StdMutex<HashSet<String>>,
    /// The calls running in tasks of their own, for [`DurableMcpServer::drain`].
    in_flight: InFlight,
}

/// A count of the calls in flight and a signal when it drops to zero.
#[derive(Default)]
struct InFlight {
    count: std::sync::atomic::AtomicUsize,
    idle: tokio::sync::Notify,
}

/// One call in flight, counted for as long as it lives.
struct InFlightGuard(Arc<Inner>);

impl InFlightGuard {
    fn new(inner: Arc<Inner>) -> Self {
        inner
            .in_flight
            .count
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        InFlightGuard(inner)
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        let in_flight = &self.0.in_flight;
        if in_flight
            .count
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst)
            == 1
        {
            in_flight.idle.notify_waiters();
        }
    }
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DurableMcpServer")
            .field("session", &self.session_id)
            .field("call_prefix", &self.call_prefix)
            .field("toolbox", &self.toolbox)
            .finish_non_exhaustive()
    }
}

impl DurableMcpServer {
    /// Starts configuring a server named `name` (announced to clients, and the default
    /// of its session ids) for `toolbox`, journaling through `durable`.
    ///
    /// Give `durable` a stable [`owner`](durable_core::DurableBuilder::owner) (one per
    /// replica): a server restarted under the same owner takes its sessions back at once,
    /// where with the default `host-pid` owner [`start`](DurableMcpServerBuilder::start)
    /// fails ([`ServeError::Session`], `Leased`) until the crashed process's lease on the
    /// server's session expires. Replicas: each its own
    /// [`session_id`](DurableMcpServerBuilder::session_id), the same name (or
    /// [`call_session_prefix`](DurableMcpServerBuilder::call_session_prefix)); see the
    /// [crate docs](crate#replicas-and-restarts).
    pub fn builder(
        durable: Durable,
        toolbox: Toolbox,
        name: impl Into<String>,
    ) -> DurableMcpServerBuilder {
        DurableMcpServerBuilder {
            durable,
            toolbox,
            name: name.into(),
            version: env!("CARGO_PKG_VERSION").into(),
            instructions: None,
            session: None,
            call_prefix: None,
        }
    }

    /// The server's own session (where calls without a call id run).
    pub fn session_id(&self) -> &SessionId {
        &self.inner.session_id
    }

    /// The session a call with client call id `call_id` runs in.
    pub fn call_session_id(&self, call_id: &str) -> SessionId {
        SessionId::new(call_session_id(&self.inner.call_prefix, call_id))
    }

    /// Serves one client over this process's stdin and stdout until it disconnects, then
    /// waits for the calls still in flight to end ([`drain`](Self::drain)).
    ///
    /// # Errors
    /// [`ServeError::Transport`] if the MCP handshake or the transport fails.
    pub async fn serve_stdio(self) -> Result<(), ServeError> {
        let this = self.clone();
        let running = self
            .serve(rmcp::transport::stdio())
            .await
            .map_err(|e| ServeError::Transport(e.to_string()))?;
        let waited = running
            .waiting()
            .await
            .map_err(|e| ServeError::Transport(e.to_string()));
        // A call whose client went away still runs to its end, and records its outcome.
        this.drain().await;
        waited?;
        Ok(())
    }

    /// Waits until no call is in flight on this server (nor on its clones). Every call
    /// runs to its end in a task of its own, whatever becomes of its request, so that its
    /// outcome is recorded; a process that returns from `main` (dropping the runtime)
    /// while calls run leaves them in doubt. [`serve_stdio`](Self::serve_stdio) drains
    /// before it returns; over HTTP, stop accepting requests (e.g. axum's graceful
    /// shutdown), then call `drain` before the process exits.
    pub async fn drain(&self) {
        let in_flight = &self.inner.in_flight;
        loop {
            let idle = in_flight.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if in_flight.count.load(std::sync::atomic::Ordering::SeqCst) == 0 {
                return;
            }
            idle.await;
        }
    }

    /// The number of calls in flight on this server (and its clones).
    pub fn in_flight(&self) -> usize {
        self.inner
            .in_flight
            .count
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The streamable HTTP transport as a tower service: mount it in an HTTP server,
    /// e.g. `axum::Router::new().nest_service("/mcp", server.http_service(Default::default()))`.
    /// Every MCP session (`Mcp-Session-Id`) is served by a clone of this server.
    pub fn http_service(
        &self,
        config: StreamableHttpServerConfig,
    ) -> StreamableHttpService<DurableMcpServer, LocalSessionManager> {
        let server = self.clone();
        StreamableHttpService::new(move || Ok(server.clone()), Default::default(), config)
    }

    /// Runs one `tools/call`: the entry point of [`ServerHandler::call_tool`], usable
    /// directly. `request_id` names the call in traces and errors when it carries no
    /// call id.
    ///
    /// # Errors
    /// An MCP error for a call that was refused (see [`codes`]); a tool that ran and
    /// failed is an `Ok` result with `isError`.
    pub async fn call(
        &self,
        params: CallToolRequestParams,
        meta: &rmcp::model::RequestMetaObject,
        request_id: &str,
    ) -> Result<CallToolResult, ErrorData> {
        let call_id = client_call_id(meta)?;
        let arguments = Value::Object(params.arguments.unwrap_or_default());
        let tool = params.name.into_owned();
        let shown = call_id.as_deref().unwrap_or(request_id).to_owned();
        let name = match &call_id {
            Some(id) => CallName::Id(id),
            None => CallName::Request(request_id),
        };
        // Everything a client can get wrong is refused here, before any session exists.
        let mut call = ModelToolCall::new(shown.clone(), tool, arguments);
        let checked = self
            .inner
            .toolbox
            .check(&call)
            .map_err(|e| to_mcp(&e, name, ""))?;
        call.arguments = ToolArguments::Json(checked);
        let label = name.to_string();
        // The call runs to its end in a task of its own, whatever becomes of the request
        // (a client that disconnects or cancels): its outcome is recorded, so the
        // client's retry with the same call id gets the result instead of a refusal.
        let inner = Arc::clone(&self.inner);
        let guard = InFlightGuard::new(Arc::clone(&self.inner));
        let running = tokio::spawn(async move {
            let _guard = guard;
            match call_id {
                Some(id) => inner.call_with_id(&id, &call).await,
                None => inner.call_in_server_session(&call).await,
            }
        });
        let result = running.await.map_err(|e| {
            ErrorData::internal_error(format!("{label} failed in the server: {e}"), None)
        })??;
        mcp_result(&result)
    }
}

impl Inner {
    /// Opens the server's session and moves it to a fresh step. The steps of this session
    /// are independent requests: the calls of a step a crash interrupted are not asked for
    /// again (their clients are gone), so the step ends without replaying them; an
    /// in-doubt unsafe call among them holds the session-wide barrier until resolved.
    async fn open_server_session(&self) -> Result<Session<Message>, ServeError> {
        let failed = |source| ServeError::Session {
            session: self.session_id.to_string(),
            source: Box::new(source),
        };
        let options = StartOptions::new()
            .with_id(self.session_id.clone())
            .with_metadata(json!({"mcp": {"server": self.info.server_info.name}}));
        let resumed = self
            .durable
            .start_or_resume::<Message>(options)
            .await
            .map_err(failed)?;
        for doubt in &resumed.report.in_doubt {
            tracing::warn!(
                session = %self.session_id,
                call = %doubt.call.id,
                tool = %doubt.call.identity.tool,
                "an MCP call was in doubt when the server stopped; calls with a side effect are \
                 refused until it is resolved (`durable resolve`)"
            );
        }
        let mut session = resumed.session;
        session
            .dangerous_checkpoint_unreplayed()
            .await
            .map_err(failed)?;
        Ok(session)
    }

    /// Takes back, and gives up at once, the call sessions a crashed run of this server
    /// left leased under this same owner with calls issued: their lease would stay live
    /// (the same owner), so the store would not see their calls as in doubt and the
    /// server-wide barrier would miss them. Released, their in-doubt calls hold the
    /// barrier until resolved. Best effort: a failure is logged.
    async fn reclaim_call_sessions(&self) {
        let store = self.durable.store();
        let owner = match store.session(&self.session_id).await {
            Ok(record) => record.lease_owner,
            Err(e) => {
                tracing::warn!(session = %self.session_id, error = %e, "cannot read the server's session; call sessions left by a crash are not reclaimed");
                return;
            }
        };
        let Some(owner) = owner else { return };
        let filter = SessionFilter::new().with_statuses(vec![SessionStatus::Active]);
        let sessions = match store.list_sessions(&filter).await {
            Ok(sessions) => sessions,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list sessions; call sessions left by a crash are not reclaimed");
                return;
            }
        };
        for record in sessions {
            if !record.id.as_str().starts_with(&self.call_prefix)
                || record.lease_owner.as_deref() != Some(owner.as_str())
            {
                continue;
            }
            match store.issued_calls(&record.id).await {
                Ok(issued) if issued.is_empty() => continue,
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(session = %record.id, error = %e, "cannot read a call session's journal");
                    continue;
                }
            }
            match self.durable.resume::<Message>(&record.id).await {
                Ok(resumed) => release(resumed.session).await,
                Err(e) => {
                    tracing::warn!(session = %record.id, error = %e, "cannot reclaim a call session left by a crash");
                }
            }
        }
    }

    /// A call without a call id: one step of the server's session, calls serialized.
    async fn call_in_server_session(&self, call: &ModelToolCall) -> Result<ToolResult, ErrorData> {
        let session_name = self.session_id.as_str();
        let mut slot = self.server_session.lock().await;
        if slot.is_none() {
            let opened = self.open_server_session().await.map_err(|e| {
                ErrorData::new(
                    codes::DURABLE,
                    format!("{} was not run: {e}", CallName::Request(&call.id)),
                    Some(json!({"durable": "durable", "session": session_name})),
                )
            })?;
            *slot = Some(opened);
        }
        let Some(session) = slot.as_mut() else {
            return Err(ErrorData::internal_error("server session not open", None));
        };
        self.barrier(call, None).await?;
        // A call that needs a person's approval must wait for the decision in a session
        // of its own (a call id's): its `requested` row in the shared step would refuse
        // every later call's checkpoint. Refused before anything is journaled when the
        // runtime's policy says so.
        if self.policy_requires_approval(call) {
            return Err(call_id_required(call));
        }
        let dispatched = self.toolbox.dispatch(session.journal(), call).await;
        let result = match dispatched {
            Ok(result) => result,
            Err(DurableError::AwaitingApproval { call: row, .. }) => {
                // The tool itself asked for approval (seen only once journaled): deny the
                // request at once, so that the step can end, and tell the client to send
                // a call id.
                let reason = "durable-mcp: a call that needs approval must be sent with a call \
                              id; this request had none, so it was refused";
                if let Err(e) = self
                    .durable
                    .operator()
                    .deny(&row, reason, "durable-mcp", None)
                    .await
                {
                    tracing::warn!(session = session_name, call = %row, error = %e, "denying an approval request made without a call id failed; the server session is reopened");
                    *slot = None;
                    return Err(call_id_required(call));
                }
                if let Err(e) = session.dangerous_checkpoint_unreplayed().await {
                    tracing::warn!(session = session_name, error = %e, "checkpoint after an MCP call failed; the session is reopened for the next call");
                    *slot = None;
                }
                return Err(call_id_required(call));
            }
            Err(e) => {
                if is_fatal(&e) {
                    *slot = None;
                }
                return Err(to_mcp(&e, CallName::Request(&call.id), session_name));
            }
        };
        // One step per call: the next call starts from a checkpoint after this one.
        if let Err(e) = session.dangerous_checkpoint_unreplayed().await {
            tracing::warn!(session = session_name, error = %e, "checkpoint after an MCP call failed; the session is reopened for the next call");
            *slot = None;
        }
        Ok(result)
    }

    /// A call with a call id: its own session, step 0, created or resumed.
    async fn call_with_id(
        &self,
        call_id: &str,
        call: &ModelToolCall,
    ) -> Result<ToolResult, ErrorData> {
        let session_id = call_session_id(&self.call_prefix, call_id);
        let lock = self.lock_for(&session_id);
        let guard = lock.lock().await;
        self.running_set().insert(session_id.clone());
        let outcome = match self.barrier(call, Some(&session_id)).await {
            Ok(()) => self.run_call_session(call_id, &session_id, call).await,
            Err(e) => Err(e),
        };
        self.running_set().remove(&session_id);
        drop(guard);
        self.unlock(&session_id, lock);
        outcome
    }

    async fn run_call_session(
        &self,
        call_id: &str,
        session_id: &str,
        call: &ModelToolCall,
    ) -> Result<ToolResult, ErrorData> {
        let refused = |e: DurableError| to_mcp(&e, CallName::Id(call_id), session_id);
        let fingerprint = self.fingerprint(call).map_err(refused)?;
        let reused = |first: &str| {
            ErrorData::new(
                codes::CALL_ID_REUSED,
                format!(
                    "call `{call_id}` was not run: this call id was first sent for `{first}` with \
                     other arguments, and a call id names one call; send a new call id for a new call"
                ),
                Some(json!({"durable": "call_id_reused", "session": session_id, "tool": first})),
            )
        };
        let same_call = |metadata: &Value| {
            let recorded = &metadata["mcp"];
            if recorded["tool"] == json!(call.name) && recorded["arguments"] == json!(fingerprint) {
                Ok(())
            } else {
                Err(reused(recorded["tool"].as_str().unwrap_or("?")))
            }
        };
        let id = SessionId::new(session_id);
        // A call with a definite outcome completed its session: a retry reads the result.
        if let Ok(record) = self.durable.store().session(&id).await
            && record.status == SessionStatus::Completed
        {
            same_call(&record.metadata)?;
            return self.recorded_result(&id, call).await.map_err(refused);
        }
        let options = StartOptions::new()
            .with_id(id.clone())
            .with_queue(CALL_QUEUE)
            .with_metadata(json!({"mcp": {
                "server": self.info.server_info.name,
                "call_id": call_id,
                "tool": call.name,
                "arguments": fingerprint,
            }}));
        let session = self
            .durable
            .start_or_resume::<Message>(options)
            .await
            .map_err(refused)?
            .session;
        if let Err(e) = same_call(&session.record().metadata) {
            release(session).await;
            return Err(e);
        }
        let dispatched = self.toolbox.dispatch(session.journal(), call).await;
        match dispatched {
            Ok(result) => {
                // A definite outcome (a result, or a recorded tool failure): the session
                // is done, so no pool or `recover_next` claims it, and it can be purged.
                if let Err(e) = session.complete().await {
                    tracing::warn!(session = session_id, error = %e, "completing an MCP call's session failed; a retry replays its recorded result");
                }
                Ok(result)
            }
            Err(e) => {
                release(session).await;
                Err(refused(e))
            }
        }
    }

    /// The recorded outcome of a completed call session's call.
    async fn recorded_result(
        &self,
        session: &SessionId,
        call: &ModelToolCall,
    ) -> Result<ToolResult, DurableError> {
        let rows = self.durable.store().calls(session, Some(0)).await?;
        let row = rows
            .into_iter()
            .find(|row| row.identity.tool == call.name && row.status.has_outcome())
            .ok_or_else(|| {
                DurableError::Store(durable_core::StoreError::CallNotFound(
                    durable_core::CallId::new(format!("{session}: step 0, `{}`", call.name)),
                ))
            })?;
        let output = match row.status {
            CallStatus::Failed | CallStatus::Denied => ToolOutput {
                content: json!({"error": row
                    .error
                    .as_ref()
                    .and_then(|e| e.get("message"))
                    .and_then(Value::as_str)
                    .unwrap_or("the call failed")}),
                is_error: true,
            },
            _ => ToolOutput {
                content: row.result.unwrap_or(Value::Null),
                is_error: false,
            },
        };
        Ok(ToolResult {
            call_id: call.id.clone(),
            name: call.name.clone(),
            output,
        })
    }

    /// What a call id's session records of its call: `"v1:…"` over the tool name and the
    /// arguments, each secret argument's value replaced by a keyed digest of it (HMAC
    /// under the store's own key: the session metadata is not masked, and the value must
    /// not be recoverable from it, yet another secret value must be another call).
    fn fingerprint(&self, call: &ModelToolCall) -> Result<String, DurableError> {
        let mut arguments = match &call.arguments {
            ToolArguments::Json(value) => value.clone(),
            ToolArguments::Text(text) => Value::String(text.clone()),
        };
        if let (Some(tool), Value::Object(map)) = (self.toolbox.get(&call.name), &mut arguments) {
            let keyring = self.durable.store().keyring();
            for secret in &tool.spec().secret_args {
                if let Some(value) = map.get_mut(secret) {
                    // A keyed digest (the store's own key, which never rotates): another
                    // secret value is another call, and a dictionary over the metadata is
                    // useless without the store.
                    let hash = canonical::input_hash(value).map_err(|source| {
                        DurableError::InvalidArguments {
                            tool: call.name.clone(),
                            source,
                        }
                    })?;
                    let digest = keyring
                        .digest(
                            &format!("mcp-call-secret:{}.{secret}", call.name),
                            hash.as_bytes(),
                        )
                        .map_err(DurableError::Store)?;
                    *value = json!({ "(secret)": digest });
                }
            }
        }
        canonical::input_hash(&json!({"tool": call.name, "arguments": arguments})).map_err(
            |source| DurableError::InvalidArguments {
                tool: call.name.clone(),
                source,
            },
        )
    }

    /// Whether the runtime's approval policy asks for a person's decision on `call`.
    fn policy_requires_approval(&self, call: &ModelToolCall) -> bool {
        let (Some(policy), Some(tool)) = (
            self.durable.config().approval_policy.as_ref(),
            self.toolbox.get(&call.name),
        ) else {
            return false;
        };
        let arguments = match &call.arguments {
            ToolArguments::Json(value) => value.clone(),
            ToolArguments::Text(text) => Value::String(text.clone()),
        };
        policy(tool.spec(), &arguments).is_some()
    }

    fn running_set(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The server-wide barrier: a call with a side effect is refused while an
    /// `unsafe_on_replay` call of this server is in doubt, in the server's session or in
    /// any call session (with or without a call id: a call id does not bypass it). Calls
    /// running in this process right now are not in doubt, nor is `own` (the call's own
    /// session, whose replay decides for itself). `pure` calls are never refused.
    async fn barrier(&self, call: &ModelToolCall, own: Option<&str>) -> Result<(), ErrorData> {
        let class = self
            .toolbox
            .get(&call.name)
            .map_or(ReplayClass::UnsafeOnReplay, |tool| tool.spec().class);
        if class == ReplayClass::Pure {
            return Ok(());
        }
        // A call with its own session was sent with a call id.
        let name = match own {
            Some(_) => CallName::Id(&call.id),
            None => CallName::Request(&call.id),
        };
        let rows = self
            .durable
            .operator()
            .in_doubt(None)
            .await
            .map_err(|e| to_mcp(&e, name, own.unwrap_or(self.session_id.as_str())))?;
        let running = self.running_set().clone();
        let blocking = rows.into_iter().find(|row| {
            let session = row.identity.session.as_str();
            row.class == ReplayClass::UnsafeOnReplay
                && (session == self.session_id.as_str() || session.starts_with(&self.call_prefix))
                && Some(session) != own
                && !running.contains(session)
        });
        let Some(row) = blocking else {
            return Ok(());
        };
        let error = DurableError::ReplayUnsafe {
            call: row.id.clone(),
            tool: row.identity.tool.clone(),
            class: row.class,
            refused_tool: call.name.clone(),
            reason: format!(
                "the barrier is server-wide: nothing with a side effect runs on this server \
                 (with or without a call id) beside an unresolved unsafe call (in session `{}`)",
                row.identity.session
            ),
        };
        Err(to_mcp(&error, name, row.identity.session.as_str()))
    }

    fn lock_for(&self, session: &str) -> Arc<Mutex<()>> {
        let mut locks = self
            .call_locks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Arc::clone(locks.entry(session.to_owned()).or_default())
    }

    /// Forgets a call's lock once no request waits on it.
    fn unlock(&self, session: &str, lock: Arc<Mutex<()>>) {
        let mut locks = self
            .call_locks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Ours and the map's: nobody else holds or waits for it.
        if Arc::strong_count(&lock) == 2 {
            locks.remove(session);
        }
    }
}

/// Gives a call session's lease up, so that a retry (on this server or another) resumes it
/// at once. A failure only delays that retry until the lease expires.
async fn release(session: Session<Message>) {
    let id = session.id().clone();
    if let Err(e) = session.release().await {
        tracing::warn!(session = %id, error = %e, "releasing an MCP call's session failed; a retry waits for its lease to expire");
    }
}

/// The refusal of a call without a call id that needs a person's approval.
fn call_id_required(call: &ModelToolCall) -> ErrorData {
    ErrorData::new(
        codes::CALL_ID_REQUIRED,
        format!(
            "{} was not run: it needs a person's approval, and only a call sent \
             with a call id (`_meta[\"{}\"]`) can wait for one. Send it with a call id; it is \
             refused with AWAITING_APPROVAL until a person decides, then the same call id \
             runs it (or returns the denial)",
            CallName::Request(&call.id).of(&call.name),
            crate::CALL_ID_META
        ),
        Some(json!({"durable": "call_id_required", "tool": call.name})),
    )
}

/// Whether the session handle is unusable after `error` (it must be resumed).
fn is_fatal(error: &DurableError) -> bool {
    matches!(
        error,
        DurableError::Store(_) | DurableError::CheckpointInDoubt { .. }
    )
}

/// The MCP result of a call that reached an outcome.
fn mcp_result(result: &ToolResult) -> Result<CallToolResult, ErrorData> {
    serde_json::from_value(result.mcp_result()).map_err(|e| {
        ErrorData::internal_error(
            format!("cannot encode the result of `{}`: {e}", result.name),
            None,
        )
    })
}

impl ServerHandler for DurableMcpServer {
    fn get_info(&self) -> ServerConfig {
        self.inner.info.clone()
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.inner.tools.clone()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let request_id = context.id.to_string();
        self.call(request, &context.meta, &request_id)
            .await
            .map(Into::into)
    }
}
