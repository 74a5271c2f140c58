//! Calls through `DurableMcpServer::call`, in process (no transport): call ids and secret
//! arguments, approvals without a call id, call sessions finished once their call is.

use std::sync::atomic::{AtomicUsize, Ordering};

use durable::{Durable, Toolbox, durable_tool};
use durable_mcp::rmcp::ErrorData;
use durable_mcp::rmcp::model::{CallToolRequestParams, CallToolResult, RequestMetaObject};
use durable_mcp::{CALL_ID_META, DurableMcpServer, codes};
use serde_json::{Value, json};

static LOGINS: AtomicUsize = AtomicUsize::new(0);
static SENT: AtomicUsize = AtomicUsize::new(0);
static SLOW: AtomicUsize = AtomicUsize::new(0);
static TRANSFERS: AtomicUsize = AtomicUsize::new(0);

/// Moves money; always needs a person's approval.
#[durable_tool(replay = "unsafe_on_replay", approval = "required")]
async fn transfer(cents: u64) -> Result<u64, std::io::Error> {
    TRANSFERS.fetch_add(1, Ordering::SeqCst);
    Ok(cents)
}

/// A pure lookup whose first call never answers in time.
#[durable_tool(replay = "pure")]
async fn slow(sku: String) -> Result<String, std::io::Error> {
    if SLOW.fetch_add(1, Ordering::SeqCst) == 0 {
        tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    }
    Ok(format!("price of {sku}"))
}

/// Logs in (counts the logins).
#[durable_tool(replay = "unsafe_on_replay")]
async fn login(user: String, #[secret] token: String) -> Result<String, std::io::Error> {
    let _ = token;
    LOGINS.fetch_add(1, Ordering::SeqCst);
    Ok(format!("welcome {user}"))
}

/// Sends a message (counts them).
#[durable_tool(replay = "unsafe_on_replay")]
async fn send(to: String) -> Result<usize, std::io::Error> {
    let _ = to;
    Ok(SENT.fetch_add(1, Ordering::SeqCst) + 1)
}

fn params(name: &str, args: Value) -> CallToolRequestParams {
    let Value::Object(map) = args else {
        panic!("object arguments")
    };
    CallToolRequestParams::new(name.to_owned()).with_arguments(map)
}

fn meta(id: Option<&str>) -> RequestMetaObject {
    let mut meta = RequestMetaObject::new();
    if let Some(id) = id {
        meta.insert(CALL_ID_META.into(), json!(id));
    }
    meta
}

struct Setup {
    _dir: tempfile::TempDir,
    durable: Durable,
    server: DurableMcpServer,
}

async fn setup(name: &str) -> Setup {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = durable::connect(&format!("sqlite:{}", dir.path().join("s.db").display()))
        .await
        .expect("store");
    let durable = Durable::builder(store)
        .owner("in-process")
        .approval_policy(|tool, args| {
            (tool.name == "send" && args["to"] == "boss")
                .then(|| durable::approval::request("needs a person"))
        })
        .build();
    let toolbox = Toolbox::new()
        .with(login)
        .expect("login")
        .with(send)
        .expect("send")
        .with(transfer)
        .expect("transfer");
    let server = DurableMcpServer::builder(durable.clone(), toolbox, name)
        .start()
        .await
        .expect("start");
    Setup {
        _dir: dir,
        durable,
        server,
    }
}

async fn call(
    server: &DurableMcpServer,
    tool: &str,
    args: Value,
    id: Option<&str>,
) -> Result<CallToolResult, ErrorData> {
    server.call(params(tool, args), &meta(id), "req").await
}

/// The same call id with only a secret argument changed is another call: refused with
/// `CALL_ID_REUSED`, and nothing runs again. The same secret again returns the result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_secret_is_another_call() {
    let setup = setup("secret").await;
    let first = call(
        &setup.server,
        "login",
        json!({"user": "u", "token": "t1"}),
        Some("login-1"),
    )
    .await
    .expect("first login");
    let before = LOGINS.load(Ordering::SeqCst);
    let again = call(
        &setup.server,
        "login",
        json!({"user": "u", "token": "t1"}),
        Some("login-1"),
    )
    .await
    .expect("the same call again");
    assert_eq!(again.content, first.content);
    let refused = call(
        &setup.server,
        "login",
        json!({"user": "u", "token": "t2"}),
        Some("login-1"),
    )
    .await
    .expect_err("another secret under the same call id");
    assert_eq!(refused.code, codes::CALL_ID_REUSED, "{refused:?}");
    assert_eq!(LOGINS.load(Ordering::SeqCst), before, "nothing ran again");
    // The metadata does not hold the secret in clear.
    let record = setup
        .durable
        .store()
        .session(&setup.server.call_session_id("login-1"))
        .await
        .expect("the call session");
    assert!(
        !record.metadata.to_string().contains("t1"),
        "{}",
        record.metadata
    );
}

/// A `pure` remote call that times out is not recorded (its outcome is unknown): the next
/// attempt in the same session runs it again and gets the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pure_remote_call_that_timed_out_runs_again() {
    use durable::{Message, ModelToolCall, ReplayClass, StartOptions};
    use durable_mcp::RemoteTools;
    use durable_mcp::rmcp::ServiceExt;

    let dir = tempfile::tempdir().expect("tempdir");
    let store = durable::connect(&format!("sqlite:{}", dir.path().join("r.db").display()))
        .await
        .expect("store");
    let remote_durable = Durable::builder(store).owner("remote").build();
    let toolbox = Toolbox::new().with(slow).expect("slow");
    let remote = DurableMcpServer::builder(remote_durable, toolbox, "remote")
        .start()
        .await
        .expect("remote server");
    let (server_io, client_io) = tokio::io::duplex(1 << 16);
    tokio::spawn(async move {
        if let Ok(running) = remote.serve(server_io).await {
            let _ = running.waiting().await;
        }
    });
    let client = ().serve(client_io).await.expect("MCP handshake");
    let tools = RemoteTools::new(client.peer().clone())
        .class("slow", ReplayClass::Pure)
        .timeout(std::time::Duration::from_millis(300))
        .toolbox()
        .await
        .expect("remote tools");

    let local = setup("local").await;
    let session = local
        .durable
        .start::<Message>(StartOptions::default())
        .await
        .expect("session");
    let call = ModelToolCall::new("c1", "slow", json!({"sku": "mug"}));
    let lost = tools.dispatch(session.journal(), &call).await;
    assert!(lost.is_err(), "an unknown outcome is an error: {lost:?}");
    let rows = local
        .durable
        .store()
        .calls(session.id(), None)
        .await
        .expect("rows");
    assert!(rows.is_empty(), "nothing recorded: {rows:?}");
    let again = tools
        .dispatch(session.journal(), &call)
        .await
        .expect("the second attempt runs");
    assert!(!again.is_error(), "{again:?}");
    assert!(again.content_text().contains("price of mug"), "{again:?}");
}

/// A call that needs approval sent without a call id is refused (the policy's: before
/// anything is journaled; the tool's own: its request denied at once), and later calls
/// without a call id still run. With a call id it waits for the decision, with a message
/// an MCP client can act on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approval_without_a_call_id_is_refused_and_does_not_wedge() {
    let setup = setup("approval").await;
    let refused = call(&setup.server, "send", json!({"to": "boss"}), None)
        .await
        .expect_err("needs approval");
    assert_eq!(refused.code, codes::CALL_ID_REQUIRED, "{refused:?}");
    // Named for a person: the JSON-RPC request id is labelled as what it is.
    assert!(
        refused
            .message
            .starts_with("a call of `send` without a call id (request req) was not run"),
        "{}",
        refused.message
    );
    let ran = call(&setup.server, "send", json!({"to": "a"}), None)
        .await
        .expect("a later call without call id runs");
    assert_ne!(ran.is_error, Some(true), "{ran:?}");

    let refused = call(&setup.server, "transfer", json!({"cents": 5}), None)
        .await
        .expect_err("the tool asks for approval");
    assert_eq!(refused.code, codes::CALL_ID_REQUIRED, "{refused:?}");
    assert_eq!(TRANSFERS.load(Ordering::SeqCst), 0);
    let ran = call(&setup.server, "send", json!({"to": "b"}), None)
        .await
        .expect("a later call without call id runs");
    assert_ne!(ran.is_error, Some(true), "{ran:?}");

    let waiting = call(&setup.server, "transfer", json!({"cents": 7}), Some("t-1"))
        .await
        .expect_err("awaits approval");
    assert_eq!(waiting.code, codes::AWAITING_APPROVAL, "{waiting:?}");
    assert!(
        !waiting.message.contains("Session::await_approval"),
        "{}",
        waiting.message
    );
    let row = waiting.data.as_ref().expect("data")["call"]
        .as_str()
        .expect("call")
        .to_owned();
    assert!(
        waiting.message.contains(&format!("durable approve {row}")),
        "{}",
        waiting.message
    );
    setup
        .durable
        .operator()
        .approve(&durable::CallId::new(row), None, "tester", None)
        .await
        .expect("approve");
    let ran = call(&setup.server, "transfer", json!({"cents": 7}), Some("t-1"))
        .await
        .expect("runs once approved");
    assert_ne!(ran.is_error, Some(true), "{ran:?}");
    assert_eq!(TRANSFERS.load(Ordering::SeqCst), 1);
}

/// A call with a call id and a definite outcome completes its session (in the `mcp`
/// queue): `recover_next` does not claim it, and a retry returns the recorded result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_call_completes_its_session() {
    let setup = setup("finish").await;
    let first = call(&setup.server, "send", json!({"to": "fin"}), Some("fin-1"))
        .await
        .expect("runs");
    let id = setup.server.call_session_id("fin-1");
    let record = setup.durable.store().session(&id).await.expect("session");
    assert_eq!(record.status, durable::store::SessionStatus::Completed);
    assert_eq!(record.queue, durable_mcp::CALL_QUEUE);
    let claimed = setup
        .durable
        .recover_next::<durable::Message>()
        .await
        .expect("recover_next");
    assert!(claimed.is_none(), "nothing to claim");
    let before = SENT.load(Ordering::SeqCst);
    let again = call(&setup.server, "send", json!({"to": "fin"}), Some("fin-1"))
        .await
        .expect("the recorded result");
    assert_eq!(again.content, first.content);
    assert_eq!(again.structured_content, first.structured_content);
    assert_eq!(SENT.load(Ordering::SeqCst), before, "nothing ran again");
    let reused = call(&setup.server, "send", json!({"to": "other"}), Some("fin-1"))
        .await
        .expect_err("another call under the same id");
    assert_eq!(reused.code, codes::CALL_ID_REUSED);
}

/// A remote server listing tools whose names durable refuses (`.`, `/`) beside one it
/// takes; `readOnlyHint` on all of them.
struct Dotted;

impl rmcp::ServerHandler for Dotted {
    fn get_info(&self) -> rmcp::model::ServerConfig {
        rmcp::model::ServerConfig::new(
            rmcp::model::ServerCapabilities::builder()
                .enable_tools()
                .build(),
        )
    }

    async fn list_tools(
        &self,
        _request: Option<rmcp::model::PaginatedRequestParams>,
        _context: rmcp::service::RequestContext<rmcp::RoleServer>,
    ) -> Result<rmcp::model::ListToolsResult, ErrorData> {
        let schema = json!({"type": "object", "properties": {}});
        let Value::Object(schema) = schema else {
            unreachable!()
        };
        let tools = ["ok_tool", "ns.get", "ns/put"]
            .into_iter()
            .map(|name| {
                let mut tool = rmcp::model::Tool::new(name, "a tool", schema.clone());
                tool.annotations = Some(rmcp::model::ToolAnnotations::new().read_only(true));
                tool
            })
            .collect();
        Ok(rmcp::model::ListToolsResult::with_all_items(tools))
    }
}

/// Remote tools durable cannot name are skipped with a report, the others kept; and
/// annotations are ignored by default (`readOnlyHint` without `trust_annotations` is
/// still `unsafe_on_replay`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_tools_with_foreign_names_are_skipped() {
    use durable::ReplayClass;
    use durable_mcp::RemoteTools;
    use durable_mcp::rmcp::ServiceExt;

    let (server_io, client_io) = tokio::io::duplex(1 << 16);
    tokio::spawn(async move {
        if let Ok(running) = Dotted.serve(server_io).await {
            let _ = running.waiting().await;
        }
    });
    let client = ().serve(client_io).await.expect("MCP handshake");
    let (toolbox, skipped) = RemoteTools::new(client.peer().clone())
        .toolbox_with_report()
        .await
        .expect("the usable tools");
    let names: Vec<&str> = skipped.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["ns.get", "ns/put"], "{skipped:?}");
    let kept = toolbox.get("ok_tool").expect("ok_tool kept");
    assert_eq!(
        kept.spec().class,
        ReplayClass::UnsafeOnReplay,
        "annotations are ignored by default"
    );
    let trusted = RemoteTools::new(client.peer().clone())
        .trust_annotations()
        .toolbox()
        .await
        .expect("toolbox");
    assert_eq!(
        trusted.get("ok_tool").expect("ok_tool").spec().class,
        ReplayClass::Pure
    );
}
