//! A durable agent calling a remote MCP server's tools: the example server
//! (`mcp_server`, built beside this binary) over stdio, its tools wrapped with
//! `RemoteTools` and dispatched through a durable session; then the same call sent twice
//! with one call id runs once. Exits 0 when the ledger holds exactly one row per effect.
//!
//! ```sh
//! cargo build -p durable-mcp --examples && cargo run -p durable-mcp --example mcp_client
//! ```
//!
//! `mcp_client agent --store <db> --url <http://…/mcp> --session <id> --tool <name>` is
//! one agent turn for the crash tests: resume (or start) the session, dispatch one call
//! of `charge` or `send_email` through the remote tools, print the result, checkpoint.
//! Exits 3, printing `in doubt: <call>`, when the call is refused as in doubt.

use std::path::Path;
use std::process::Stdio;

use durable::{
    Durable, DurableError, Message, ModelToolCall, ReplayClass, SessionId, StartOptions, Toolbox,
};
use durable_mcp::rmcp::model::{CallToolRequestParams, RequestMetaObject};
use durable_mcp::rmcp::service::{Peer, RunningService};
use durable_mcp::rmcp::transport::StreamableHttpClientTransport;
use durable_mcp::rmcp::{RoleClient, ServiceExt};
use durable_mcp::{CALL_ID_META, RemoteTools};
use serde_json::json;

mod ledger;
use ledger::Ledger;

type Client = RunningService<RoleClient, ()>;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("agent") {
        let code = agent(&args[1..]).await?;
        std::process::exit(code);
    }
    demo().await
}

/// The CI demo over stdio.
async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let server_bin = std::env::current_exe()?.with_file_name("mcp_server");
    let mut child = tokio::process::Command::new(&server_bin)
        .arg("--store")
        .arg(dir.path().join("server.db"))
        .arg("--ledger")
        .arg(dir.path().join("ledger.db"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| {
            format!(
                "cannot start {} (build the examples first): {e}",
                server_bin.display()
            )
        })?;
    let (Some(stdout), Some(stdin)) = (child.stdout.take(), child.stdin.take()) else {
        return Err("no pipes to the server".into());
    };
    let client: Client = ().serve((stdout, stdin)).await?;

    // The agent's side: its own store, one session, the remote tools in a toolbox.
    let store =
        durable::connect(&format!("sqlite:{}", dir.path().join("agent.db").display())).await?;
    let durable = Durable::builder(store).owner("mcp-example-agent").build();
    let toolbox = RemoteTools::new(client.peer().clone())
        .class("lookup", ReplayClass::Pure)
        .class("charge", ReplayClass::IdempotentWithKey)
        .class("send_email", ReplayClass::UnsafeOnReplay)
        .toolbox()
        .await?;
    let mut session = durable.start::<Message>(StartOptions::default()).await?;
    let calls = [
        ModelToolCall::new("c1", "lookup", json!({"sku": "mug"})),
        ModelToolCall::new("c2", "charge", json!({"order_id": "o-17", "cents": 1200})),
        ModelToolCall::new(
            "c3",
            "send_email",
            json!({"to": "ann@example.com", "body": "Paid."}),
        ),
    ];
    for result in toolbox.dispatch_all(session.journal(), &calls).await {
        let result = result?;
        println!("{} -> {}", result.name, result.content_text());
        if result.is_error() {
            return Err(format!("{} failed", result.name).into());
        }
    }
    session.checkpoint().await?;

    // A client's retry: the same call id twice, one email.
    let first = call_with_id(client.peer(), "retry-1").await?;
    let second = call_with_id(client.peer(), "retry-1").await?;
    println!("same call id twice -> {first} / {second}");
    client.cancel().await?;

    let ledger = Ledger::open(&dir.path().join("ledger.db")).await?;
    let (charges, emails) = (ledger.count("charge").await?, ledger.count("email").await?);
    println!("ledger: {charges} charge, {emails} emails");
    if charges != 1 || emails != 2 || first != second {
        return Err("expected one charge and two emails (the retried call once)".into());
    }
    Ok(())
}

async fn call_with_id(
    peer: &Peer<RoleClient>,
    id: &str,
) -> Result<String, Box<dyn std::error::Error>> {
    let mut meta = RequestMetaObject::new();
    meta.insert(CALL_ID_META.into(), json!(id));
    let arguments = json!({"to": "bob@example.com", "body": "Shipped."});
    let mut params = CallToolRequestParams::new("send_email")
        .with_arguments(arguments.as_object().cloned().unwrap_or_default());
    params.meta = Some(meta);
    let result = peer.call_tool(params).await?;
    Ok(json!(result.structured_content).to_string())
}

/// One agent turn against an HTTP server, for the client crash tests.
async fn agent(args: &[String]) -> Result<i32, Box<dyn std::error::Error>> {
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
            .ok_or_else(|| format!("{name} <value> is required"))
    };
    let (store, url, id, tool) = (
        flag("--store")?,
        flag("--url")?,
        flag("--session")?,
        flag("--tool")?,
    );
    let client: Client = ().serve(StreamableHttpClientTransport::from_uri(url)).await?;
    let store = durable::connect(&format!("sqlite:{}", Path::new(&store).display())).await?;
    let durable = Durable::builder(store).owner("mcp-example-agent").build();
    // The example server annotates its tools from their replay classes; this agent trusts it.
    let toolbox: Toolbox = RemoteTools::new(client.peer().clone())
        .trust_annotations()
        // A server that died mid-call is noticed by the timeout (the call is left in doubt).
        .timeout(std::time::Duration::from_secs(5))
        .toolbox()
        .await?;
    let mut session = durable
        .start_or_resume::<Message>(StartOptions::new().with_id(SessionId::new(id)))
        .await?
        .session;
    let arguments = match tool.as_str() {
        "charge" => json!({"order_id": "o-99", "cents": 700}),
        _ => json!({"to": "carol@example.com", "body": "Welcome."}),
    };
    let call = ModelToolCall::new("call-1", tool, arguments);
    match toolbox.dispatch(session.journal(), &call).await {
        Ok(result) => {
            println!("result: {}", result.content_text());
            session.checkpoint().await?;
            Ok(0)
        }
        Err(DurableError::ReplayUnsafe { call, .. }) => {
            println!("in doubt: {call}");
            Ok(3)
        }
        Err(e) => Err(e.into()),
    }
}
