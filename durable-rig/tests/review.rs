//! The adversarial review's cases: duplicate call ids, argument-rewriting hooks, call ids
//! reused across replies, blank argument text, a secret in malformed arguments, journaled
//! routes and the stopping error of a past run.

mod common;

use std::sync::Arc;

use durable::{CheckpointStore, Durable, SessionId, StartOptions};
use durable_openai_stub::{Reply, Script, Stub};
use durable_rig::DurableRig;
use rig_agent::agent::{
    AgentHook, DispatchAction, DispatchEvent, HookContext, RunStart, RunStartAction,
};
use rig_core::effect::EffectKind;
use rig_core::providers::openai::OpenAIConfig;
use rig_core::providers::openai::wire::Chat;
use serde_json::{Value, json};

use common::{details, ledger_path, toolbox};

fn chat(stub: &Stub) -> rig_core::Model<Chat> {
    OpenAIConfig::new("k")
        .with_base_url(stub.base_url())
        .client()
        .chat("stub-model")
}

async fn runtime(dir: &tempfile::TempDir) -> Durable {
    let url = format!("sqlite:{}", dir.path().join("store.db").display());
    let store: Arc<dyn CheckpointStore> = durable::connect(&url).await.expect("store");
    Durable::builder(store).owner("review").build()
}

/// The tool messages of the `n`th request, `(call id, content)`.
fn tool_messages(stub: &Stub, n: usize) -> Vec<(String, String)> {
    stub.requests()[n]["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["role"] == "tool")
        .map(|m| {
            let content = match &m["content"] {
                Value::String(text) => text.clone(),
                other => other.to_string(),
            };
            (m["tool_call_id"].as_str().unwrap_or("").to_owned(), content)
        })
        .collect()
}

#[tokio::test]
async fn two_calls_with_one_call_id_each_run_with_their_own_arguments() {
    let stub = Stub::start(Script::new([
        Reply::tool_calls([
            (
                "call_0",
                "send_email",
                r#"{"to":"a@example.com","subject":"x"}"#,
            ),
            (
                "call_0",
                "send_email",
                r#"{"to":"b@example.com","subject":"x"}"#,
            ),
        ]),
        Reply::text("sent"),
    ]))
    .await
    .expect("stub");
    let dir = tempfile::tempdir().expect("tempdir");
    let durable = runtime(&dir).await;
    let session = durable
        .start::<Value>(StartOptions::new().with_id(SessionId::new("review-dupid")))
        .await
        .expect("session");
    let rig = DurableRig::new(session.journal().clone(), toolbox());
    let agent = rig.agent(chat(&stub)).expect("tools").build();
    agent.prompt("x").max_turns(3).run().await.expect("run");
    let mut sent = details(&ledger_path(), "review-dupid").await;
    sent.sort();
    assert_eq!(sent, ["a@example.com", "b@example.com"]);
}

#[tokio::test]
async fn two_calls_with_one_call_id_to_two_tools_each_get_their_own_arguments() {
    let stub = Stub::start(Script::new([
        Reply::tool_calls([
            ("call_0", "lookup", r#"{"sku":"MUG-1"}"#),
            (
                "call_0",
                "send_email",
                r#"{"to":"a@example.com","subject":"x"}"#,
            ),
        ]),
        Reply::text("done"),
    ]))
    .await
    .expect("stub");
    let dir = tempfile::tempdir().expect("tempdir");
    let durable = runtime(&dir).await;
    let session = durable
        .start::<Value>(StartOptions::new().with_id(SessionId::new("review-dupid-tools")))
        .await
        .expect("session");
    let rig = DurableRig::new(session.journal().clone(), toolbox());
    let agent = rig.agent(chat(&stub)).expect("tools").build();
    agent.prompt("x").max_turns(3).run().await.expect("run");
    let results = tool_messages(&stub, 1);
    assert_eq!(results.len(), 2, "{results:?}");
    assert!(results[0].1.contains("MUG-1"), "{results:?}");
    assert_eq!(
        details(&ledger_path(), "review-dupid-tools").await,
        ["MUG-1", "a@example.com"]
    );
}

/// A hook that sends every email elsewhere.
#[derive(Clone)]
struct Redirect;

impl AgentHook for Redirect {
    async fn on_dispatch(&self, _ctx: &HookContext, event: DispatchEvent<'_>) -> DispatchAction {
        if let EffectKind::ToolCall { name, .. } = event.kind
            && name == "send_email"
        {
            return DispatchAction::rewrite_tool_args(
                event.kind,
                json!({"to": "safe@example.com", "subject": "patched"}),
            );
        }
        DispatchAction::Proceed
    }
}

#[tokio::test]
async fn a_hook_that_rewrites_the_arguments_wins() {
    let stub = Stub::start(Script::new([
        Reply::tool_calls([(
            "call_1",
            "send_email",
            r#"{"to":"victim@example.com","subject":"x"}"#,
        )]),
        Reply::text("sent"),
    ]))
    .await
    .expect("stub");
    let dir = tempfile::tempdir().expect("tempdir");
    let durable = runtime(&dir).await;
    let session = durable
        .start::<Value>(StartOptions::new().with_id(SessionId::new("review-patch")))
        .await
        .expect("session");
    let rig = DurableRig::new(session.journal().clone(), toolbox());
    let agent = rig
        .agent(chat(&stub))
        .expect("tools")
        .add_hook(Redirect)
        .build();
    agent.prompt("x").max_turns(3).run().await.expect("run");
    assert_eq!(
        details(&ledger_path(), "review-patch").await,
        ["safe@example.com"]
    );
}

#[tokio::test]
async fn a_call_id_reused_by_a_later_reply_gets_that_replys_arguments() {
    let stub = Stub::start(Script::new([
        Reply::tool_calls([("call_0", "lookup", r#"{"sku":"MUG-1"}"#)]),
        Reply::tool_calls([("call_0", "lookup", r#"{"sku":"MUG-2"}"#)]),
        Reply::text("done"),
    ]))
    .await
    .expect("stub");
    let dir = tempfile::tempdir().expect("tempdir");
    let durable = runtime(&dir).await;
    let session = durable
        .start::<Value>(StartOptions::new().with_id(SessionId::new("review-reuse")))
        .await
        .expect("session");
    let rig = DurableRig::new(session.journal().clone(), toolbox());
    let agent = rig.agent(chat(&stub)).expect("tools").build();
    agent.prompt("x").max_turns(4).run().await.expect("run");
    let results = tool_messages(&stub, 2);
    assert_eq!(results.len(), 2, "{results:?}");
    assert!(results[0].1.contains("MUG-1"), "{results:?}");
    assert!(results[1].1.contains("MUG-2"), "{results:?}");
}

/// Say whether the shop is open.
#[durable::durable_tool(replay = "pure")]
async fn is_open() -> Result<Value, std::io::Error> {
    Ok(json!({"open": true}))
}

#[tokio::test]
async fn blank_argument_text_is_no_arguments() {
    let stub = Stub::start(Script::new([
        Reply::tool_calls([("call_9", "is_open", "")]),
        Reply::text("done"),
    ]))
    .await
    .expect("stub");
    let dir = tempfile::tempdir().expect("tempdir");
    let durable = runtime(&dir).await;
    let session = durable
        .start::<Value>(StartOptions::new().with_id(SessionId::new("review-blank")))
        .await
        .expect("session");
    let tools = Arc::new(durable::Toolbox::new().with(is_open).expect("toolbox"));
    let rig = DurableRig::new(session.journal().clone(), tools);
    let agent = rig.agent(chat(&stub)).expect("tools").build();
    agent.prompt("x").max_turns(3).run().await.expect("run");
    let results = tool_messages(&stub, 1);
    assert_eq!(results.len(), 1, "{results:?}");
    assert!(results[0].1.contains("\"open\":true"), "{results:?}");
}

/// Log in somewhere.
#[durable::durable_tool(replay = "pure")]
async fn login(
    /// The user.
    user: String,
    /// The password.
    #[secret]
    password: String,
) -> Result<Value, std::io::Error> {
    let _ = password;
    Ok(json!({"user": user}))
}

#[tokio::test]
async fn a_secret_in_malformed_arguments_never_reaches_the_store() {
    let stub = Stub::start(Script::new([
        Reply::tool_calls([(
            "call_s",
            "login",
            r#"{"user":"ann","password":"hunter2-SECRET""#,
        )]),
        Reply::text("done"),
    ]))
    .await
    .expect("stub");
    let dir = tempfile::tempdir().expect("tempdir");
    let durable = runtime(&dir).await;
    let session = durable
        .start::<Value>(StartOptions::new().with_id(SessionId::new("review-secret")))
        .await
        .expect("session");
    let tools = Arc::new(durable::Toolbox::new().with(login).expect("toolbox"));
    let rig = DurableRig::new(session.journal().clone(), tools);
    let agent = rig.agent(chat(&stub)).expect("tools").build();
    agent.prompt("x").max_turns(3).run().await.expect("run");
    let results = tool_messages(&stub, 1);
    eprintln!("tool results: {results:?}");
    drop(session);
    drop(durable);
    let mut bytes = std::fs::read(dir.path().join("store.db")).expect("store file");
    if let Ok(wal) = std::fs::read(dir.path().join("store.db-wal")) {
        bytes.extend(wal);
    }
    let text = String::from_utf8_lossy(&bytes);
    assert!(text.contains("call_s"), "the reply is in the store");
    assert!(
        !text.contains("hunter2-SECRET"),
        "the secret is in the store"
    );
}

/// One run over the route `fast` (journaled with `DurableRig::route` when `journaled`,
/// else with rig's own `model_route`), in `journal`.
async fn run_fast(journal: &durable::Journal, stub: &Stub, journaled: bool) {
    let rig = DurableRig::new(journal.clone(), toolbox());
    let builder = rig.agent(chat(stub)).expect("tools");
    let builder = if journaled {
        rig.route(builder, "fast", chat(stub))
    } else {
        builder.model_route("fast", chat(stub))
    };
    let agent = builder.build();
    let reply = agent
        .prompt("x")
        .using_model("fast")
        .max_turns(3)
        .run()
        .await
        .expect("run");
    assert_eq!(reply.output(), "done");
}

#[tokio::test]
async fn a_route_added_with_durable_rig_route_is_journaled() {
    for journaled in [true, false] {
        let stub = Stub::start(Script::new([Reply::text("done"), Reply::text("done")]))
            .await
            .expect("stub");
        let dir = tempfile::tempdir().expect("tempdir");
        let durable = runtime(&dir).await;
        let id = SessionId::new(format!("review-route-{journaled}"));
        let session = durable
            .start::<Value>(StartOptions::new().with_id(id.clone()))
            .await
            .expect("session");
        run_fast(session.journal(), &stub, journaled).await;
        drop(session);
        let resumed = durable.resume::<Value>(&id).await.expect("resume").session;
        run_fast(resumed.journal(), &stub, journaled).await;
        // Journaled: the re-run's reply comes from the journal; rig's own route asks again.
        let asked = if journaled { 1 } else { 2 };
        assert_eq!(stub.requests().len(), asked, "journaled: {journaled}");
    }
}

/// A hook that stops every run but the first before it asks the model.
#[derive(Clone, Default)]
struct OnlyTheFirstRun(Arc<std::sync::atomic::AtomicUsize>);

impl AgentHook for OnlyTheFirstRun {
    async fn on_run_start(&self, _ctx: &HookContext, _event: RunStart<'_>) -> RunStartAction {
        if self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
            RunStartAction::Continue
        } else {
            RunStartAction::stop("one run only")
        }
    }
}

#[tokio::test]
async fn a_new_run_forgets_the_last_runs_error() {
    let stub = Stub::start(Script::new([Reply::text("done")]))
        .await
        .expect("stub");
    let dir = tempfile::tempdir().expect("tempdir");
    let durable = runtime(&dir).await;
    let id = SessionId::new("review-error");
    let session = durable
        .start::<Value>(StartOptions::new().with_id(id.clone()))
        .await
        .expect("session");
    let rig = DurableRig::new(session.journal().clone(), toolbox());
    let agent = rig
        .agent(chat(&stub))
        .expect("tools")
        .add_hook(OnlyTheFirstRun::default())
        .build();
    // Another worker takes the session over: the run stops at the first reply.
    let _other = durable.resume::<Value>(&id).await.expect("take over");
    let error = agent
        .prompt("x")
        .max_turns(3)
        .run()
        .await
        .expect_err("the lease is lost");
    assert!(
        error.to_string().contains("DurableRig::take_error"),
        "{error}"
    );
    // The error is not taken; the next run (stopped by the hook before any model call)
    // starts without it.
    let _ = agent.prompt("x").max_turns(3).run().await;
    assert!(rig.take_error().is_none());
}
