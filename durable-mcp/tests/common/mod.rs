//! The harness of the MCP tests: the example server (`examples/mcp_server.rs`) as a real
//! process over stdio or streamable HTTP, an rmcp client connected to it, the ledger it
//! writes, and the durable store it journals into (opened by the test as an operator).
#![allow(dead_code)] // each test file uses part of it

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use durable::store::Resolution;
use durable::{CallId, CheckpointStore, Durable, SessionId};
use durable_mcp::CALL_ID_META;
use durable_mcp::rmcp::model::{CallToolRequestParams, CallToolResult, RequestMetaObject};
use durable_mcp::rmcp::service::{Peer, RunningService, ServiceError};
use durable_mcp::rmcp::transport::StreamableHttpClientTransport;
use durable_mcp::rmcp::{ErrorData, RoleClient, ServiceExt};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

#[path = "../../examples/ledger/mod.rs"]
mod ledger;
pub use ledger::Ledger;

/// The transports under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Stdio,
    Http,
}

/// An example binary, up to date: `cargo test` builds the examples only when it runs every
/// target (`--test x` builds none), so the first call builds them (a no-op when they are
/// fresh), and a test never runs a stale server.
pub fn example(name: &str) -> PathBuf {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = std::process::Command::new(cargo)
            .args(["build", "--quiet", "-p", "durable-mcp", "--examples"])
            .status()
            .expect("cargo build --examples");
        assert!(status.success(), "building the examples failed");
    });
    let deps = std::env::current_exe().expect("test binary path");
    deps.parent()
        .and_then(Path::parent)
        .expect("target dir")
        .join("examples")
        .join(name)
}

/// A directory with the server's store, its ledger and the gate.
pub struct World {
    pub dir: tempfile::TempDir,
}

impl World {
    pub fn new() -> Self {
        World {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    pub fn store_path(&self) -> PathBuf {
        self.dir.path().join("server.db")
    }

    pub fn ledger_path(&self) -> PathBuf {
        self.dir.path().join("ledger.db")
    }

    pub fn gate(&self) -> PathBuf {
        let gate = self.dir.path().join("gate");
        std::fs::create_dir_all(&gate).expect("gate dir");
        gate
    }

    /// How many effects of `kind` the ledger holds.
    pub async fn effects(&self, kind: &str) -> i64 {
        let ledger = Ledger::open(&self.ledger_path()).await.expect("ledger");
        ledger.count(kind).await.expect("count")
    }

    /// The server's store, opened by the test (an operator's view).
    pub async fn operator(&self) -> Durable {
        let store = durable::connect(&format!("sqlite:{}", self.store_path().display()))
            .await
            .expect("store");
        Durable::builder(store).owner("operator").build()
    }

    /// Starts the example server; with `hold`, its effects wait at the gate.
    pub async fn server(&self, transport: Transport, hold: bool) -> Server {
        let mut command = Command::new(example("mcp_server"));
        command
            .arg("--store")
            .arg(self.store_path())
            .arg("--ledger")
            .arg(self.ledger_path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true);
        if hold {
            command.env("DURABLE_MCP_EXAMPLE_HOLD", self.gate());
        }
        if transport == Transport::Http {
            command.args(["--http", "127.0.0.1:0"]);
        }
        let mut child = command.spawn().expect("spawn mcp_server");
        let stdout = child.stdout.take().expect("stdout");
        let stdin = child.stdin.take().expect("stdin");
        let mut url = None;
        let client = match transport {
            Transport::Stdio => ().serve((stdout, stdin)).await.expect("MCP handshake"),
            Transport::Http => {
                let mut lines = BufReader::new(stdout).lines();
                let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
                    .await
                    .expect("the server prints its address")
                    .expect("read stdout")
                    .expect("a line");
                assert!(line.starts_with("listening on "), "{line}");
                let endpoint = url_text(&line);
                url = Some(endpoint.clone());
                ().serve(StreamableHttpClientTransport::from_uri(endpoint))
                    .await
                    .expect("MCP handshake over HTTP")
            }
        };
        Server { child, client, url }
    }

    /// Waits until a held effect of `tool` wrote its ledger row.
    pub async fn reached(&self, tool: &str) {
        let marker = self.gate().join(format!("reached-{tool}"));
        let start = Instant::now();
        while !marker.exists() {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "`{tool}` never reached its gate"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until at least `count` calls are in flight in a held server.
    pub async fn in_flight(&self, count: usize) {
        let file = self.gate().join("in-flight");
        let start = Instant::now();
        loop {
            let seen = std::fs::read_to_string(&file)
                .ok()
                .and_then(|text| text.trim().parse::<usize>().ok())
                .unwrap_or(0);
            if seen >= count {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "{count} calls never were in flight at once (last seen {seen})"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Lets held effects finish.
    pub fn release(&self) {
        std::fs::write(self.gate().join("release"), b"").expect("release");
    }

    pub async fn store(&self) -> Arc<dyn CheckpointStore> {
        self.operator().await.store().clone()
    }

    /// Resolves an in-doubt call as an operator.
    pub async fn resolve(&self, call: &str, resolution: Resolution) {
        self.operator()
            .await
            .operator()
            .resolve(&CallId::new(call), resolution, "test-operator", None)
            .await
            .expect("resolve");
    }

    /// The journal rows of a session (none if it does not exist).
    pub async fn rows(&self, session: &str) -> usize {
        match self
            .store()
            .await
            .calls(&SessionId::new(session), None)
            .await
        {
            Ok(rows) => rows.len(),
            Err(durable::StoreError::SessionNotFound(_)) => 0,
            Err(e) => panic!("reading the journal: {e}"),
        }
    }

    /// Whether a session exists.
    pub async fn session_exists(&self, session: &str) -> bool {
        match self.store().await.session(&SessionId::new(session)).await {
            Ok(_) => true,
            Err(durable::StoreError::SessionNotFound(_)) => false,
            Err(e) => panic!("reading the session: {e}"),
        }
    }
}

/// A running example server and a client connected to it.
pub struct Server {
    pub child: Child,
    pub client: RunningService<RoleClient, ()>,
    /// The MCP endpoint, over HTTP.
    pub url: Option<String>,
}

fn url_text(line: &str) -> String {
    line.trim_start_matches("listening on ").to_owned()
}

impl Server {
    pub fn peer(&self) -> Peer<RoleClient> {
        self.client.peer().clone()
    }

    /// SIGKILL, and wait for the process to be gone.
    pub async fn kill(mut self) {
        self.child.kill().await.expect("kill the server");
        drop(self.client);
    }
}

/// The session the example server runs a call with client call id `id` in: the prefix
/// and 32 hex digits of the id's SHA-256.
pub fn call_session(id: &str) -> String {
    use sha2::{Digest, Sha256};
    let hex: String = Sha256::digest(id.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("mcp-example-call-{}", &hex[..32])
}

/// A `tools/call`, with a call id in `_meta` if `id` is given.
pub async fn call(
    peer: &Peer<RoleClient>,
    tool: &str,
    arguments: Value,
    id: Option<&str>,
) -> Result<CallToolResult, ServiceError> {
    let mut params = CallToolRequestParams::new(tool.to_owned())
        .with_arguments(arguments.as_object().cloned().expect("object arguments"));
    if let Some(id) = id {
        let mut meta = RequestMetaObject::new();
        meta.insert(CALL_ID_META.into(), json!(id));
        params.meta = Some(meta);
    }
    peer.call_tool(params).await
}

/// The MCP error of a refused call.
pub fn mcp_error(result: Result<CallToolResult, ServiceError>) -> ErrorData {
    match result {
        Err(ServiceError::McpError(e)) => e,
        other => panic!("expected an MCP error, got {other:?}"),
    }
}

/// The structured result of a call that ran.
pub fn structured(result: Result<CallToolResult, ServiceError>) -> Value {
    match result {
        Ok(r) if r.is_error != Some(true) => r.structured_content.expect("structured content"),
        other => panic!("expected a result, got {other:?}"),
    }
}

/// Runs the test body over one transport and the other, each in a world of its own.
#[macro_export]
macro_rules! both_transports {
    ($($name:ident => $body:path;)*) => {
        mod stdio {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    $body($crate::common::Transport::Stdio).await
                }
            )*
        }
        mod http {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    $body($crate::common::Transport::Http).await
                }
            )*
        }
    };
}
