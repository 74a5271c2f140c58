//! Shared by `tests/http.rs` and `tests/browser.rs`: a SQLite store file holding a
//! completed session and two sessions whose workers died inside an `unsafe_on_replay`
//! call (their leases released: the calls are in doubt), the console served on a free
//! loopback port, the small agent that resumes a session, and sessions parked on a call
//! awaiting approval.

#![allow(dead_code)] // each test file uses its own subset

pub mod http;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use durable::store::CallRecord;
use durable::{
    Block, Budget, CallError, CheckpointStore, Durable, DurableError, Message, Plan, ReplayClass,
    SessionId, Spend, StartOptions, StepStatus, ToolSpec,
};
use durable_console::ConsoleOptions;
use serde_json::{Value, json};
use tokio::sync::Notify;

/// Markup an attacker-influenced model or tool argument may carry.
pub const SCRIPT: &str = "<script>alert(1)</script>";
/// The console's token in the tests.
pub const TOKEN: &str = "test-token-5b1f0c7e";
/// The operator name the console proposes.
pub const OPERATOR: &str = "console-op";
/// The app version of the sessions.
pub const APP: &str = "shop/1";

fn object_schema(properties: Value) -> Value {
    json!({"type": "object", "properties": properties, "additionalProperties": true})
}

pub fn read_order() -> ToolSpec {
    ToolSpec::new(
        "read_order",
        "Read an order.",
        ReplayClass::Pure,
        object_schema(json!({"order_id": {"type": "string"}})),
    )
}

pub fn charge_card() -> ToolSpec {
    ToolSpec::new(
        "charge_card",
        "Charge the card.",
        ReplayClass::IdempotentWithKey,
        object_schema(json!({"order_id": {"type": "string"}, "cents": {"type": "integer"}})),
    )
}

/// An email that cannot be deduplicated; `body` is stored masked, and `auth` carries a
/// token the console must mask on its own.
pub fn send_email() -> ToolSpec {
    ToolSpec::new(
        "send_email",
        "Email the customer.",
        ReplayClass::UnsafeOnReplay,
        object_schema(
            json!({"to": {"type": "string"}, "subject": {"type": "string"},
            "body": {"type": "string"}, "auth": {"type": "object"}}),
        ),
    )
    .with_secret_args(["body"])
}

pub fn email_args() -> Value {
    json!({
        "to": "ann@example.com",
        "subject": format!("Order o-17 {SCRIPT}"),
        "body": "Your order o-17 is confirmed.",
        "auth": {"token": "tok-live-123"}
    })
}

pub fn refund() -> ToolSpec {
    ToolSpec::new(
        "refund_payment",
        "Refund a payment.",
        ReplayClass::UnsafeOnReplay,
        object_schema(json!({"payment": {"type": "string"}, "cents": {"type": "integer"}})),
    )
}

fn runtime(store: &Arc<dyn CheckpointStore>, owner: &str) -> Durable {
    Durable::builder(Arc::clone(store))
        .owner(owner)
        .app_version(APP)
        .renew_leases(false)
        .lease_ttl(Duration::from_secs(600))
        .build()
}

/// A store file and what it holds.
pub struct Scenario {
    pub dir: tempfile::TempDir,
    pub path: PathBuf,
    pub store: Arc<dyn CheckpointStore>,
    /// Completed: four checkpoints, a plan, a pure and a keyed call.
    pub done: SessionId,
    /// Its worker died inside `send_email` (arguments carry [`SCRIPT`] and secrets).
    pub doubt: SessionId,
    pub doubt_call: CallRecord,
    /// Its worker died inside `refund_payment`.
    pub refund: SessionId,
    pub refund_call: CallRecord,
    /// Emails that left.
    pub sent: AtomicUsize,
}

pub async fn scenario() -> Scenario {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("agent.db");
    let store: Arc<dyn CheckpointStore> = Arc::new(
        durable::sqlite::SqliteStore::open(&path)
            .await
            .expect("create the store"),
    );
    let done = completed(&store).await;
    let sent = AtomicUsize::new(0);
    let doubt = SessionId::new("s-doubt");
    assert!(matches!(
        run_agent(&store, &doubt, &sent, true).await,
        AgentEnd::Crashed
    ));
    let doubt_call = only_issued(store.calls(&doubt, None).await.expect("calls"));
    let refund = SessionId::new("s-refund");
    let refund_call = refund_in_doubt(&store, &refund).await;
    Scenario {
        dir,
        path,
        store,
        done,
        doubt,
        doubt_call,
        refund,
        refund_call,
        sent,
    }
}

async fn completed(store: &Arc<dyn CheckpointStore>) -> SessionId {
    let id = SessionId::new("s-done");
    let mut session = runtime(store, "worker-1")
        .start(
            StartOptions::new()
                .with_id(id.clone())
                .with_messages(vec![
                    Message::system("You confirm orders."),
                    Message::user("Confirm order o-17 for Ann."),
                ])
                .with_budget(
                    Budget::unlimited()
                        .with_limit_usd(1.0)
                        .expect("limit")
                        .with_limit_tokens(50_000),
                )
                .with_plan(
                    Plan::new(
                        "Confirm order o-17",
                        ["Read the order", "Charge the card"],
                        ["card charged once"],
                    )
                    .expect("plan"),
                ),
        )
        .await
        .expect("start s-done");
    let turn: Message = session
        .model(|| async {
            Ok::<_, String>(Message::assistant(vec![
                Block::text("Reading the order first."),
                Block::tool_call("c1", "read_order", json!({"order_id": "o-17"})),
            ]))
        })
        .await
        .expect("model");
    session.push(turn);
    let mut budget = session.budget();
    budget.charge(&Spend::new(0.0042, 1200, 180).expect("spend"));
    session.set_budget(budget);
    let order: Value = session
        .journal()
        .tool(&read_order(), json!({"order_id": "o-17"}))
        .run(|_ctx| async { Ok::<_, String>(json!({"order_id": "o-17", "cents": 1200})) })
        .await
        .expect("read_order");
    session.push(Message::tool_result("c1", order, false));
    session
        .plan_mut()
        .update_step(1, StepStatus::Done, Some("read_order: 1200 cents"))
        .expect("step 1");
    session.checkpoint().await.expect("checkpoint 1");
    let charge: Value = session
        .journal()
        .tool(&charge_card(), json!({"order_id": "o-17", "cents": 1200}))
        .key("charge:o-17")
        .run(|ctx| async move {
            Ok::<_, String>(
                json!({"charge": format!("ch_{}", ctx.idempotency_key().unwrap_or("?"))}),
            )
        })
        .await
        .expect("charge");
    session.push(Message::tool_result("c2", charge, false));
    session
        .plan_mut()
        .update_step(2, StepStatus::Done, Some("charge_card: ch_charge:o-17"))
        .expect("step 2");
    session.checkpoint().await.expect("checkpoint 2");
    session.push(Message::assistant(vec![Block::text(
        "Order o-17 is confirmed and the card was charged once.",
    )]));
    session.complete().await.expect("complete");
    id
}

async fn refund_in_doubt(store: &Arc<dyn CheckpointStore>, id: &SessionId) -> CallRecord {
    let session = runtime(store, "worker-2")
        .start::<Message>(
            StartOptions::new()
                .with_id(id.clone())
                .with_messages(vec![Message::user("Refund payment p-9 (12.00 EUR).")]),
        )
        .await
        .expect("start s-refund");
    let started = Notify::new();
    let spec = refund();
    let call = session
        .journal()
        .tool(&spec, json!({"payment": "p-9", "cents": 1200}))
        .run(|_ctx| async {
            started.notify_one();
            std::future::pending::<Result<Value, String>>().await
        });
    assert!(until_started(call, &started).await.is_none());
    session.release().await.expect("release");
    only_issued(store.calls(id, None).await.expect("calls"))
}

fn only_issued(rows: Vec<CallRecord>) -> CallRecord {
    let mut issued: Vec<_> = rows
        .into_iter()
        .filter(|r| r.status == durable::store::CallStatus::Issued)
        .collect();
    assert_eq!(issued.len(), 1, "{issued:?}");
    issued.remove(0)
}

/// Polls `call` until it completes (`Some`) or its tool body signals `started` (`None`,
/// and the call is dropped there, as a dying worker drops it).
async fn until_started<F: Future>(call: F, started: &Notify) -> Option<F::Output> {
    tokio::select! {
        done = call => Some(done),
        () = started.notified() => None,
        () = tokio::time::sleep(Duration::from_secs(60)) => {
            panic!("the call neither finished nor reached its tool body in 60 s")
        }
    }
}

/// How a run of [`run_agent`] ended.
#[derive(Debug)]
pub enum AgentEnd {
    /// The worker died inside `send_email` (after the effect, before its outcome).
    Crashed,
    /// Resume refused the in-doubt email; the worker released the session.
    Refused(DurableError),
    /// The session completed; the email's result as the agent saw it.
    Completed(Value),
}

/// One worker run of a tiny agent that emails a customer, resuming `id` if it exists.
pub async fn run_agent(
    store: &Arc<dyn CheckpointStore>,
    id: &SessionId,
    sent: &AtomicUsize,
    crash: bool,
) -> AgentEnd {
    let worker = runtime(store, "agent");
    let mut session =
        match worker.resume::<Message>(id).await {
            Ok(resumed) => resumed.session,
            Err(DurableError::Store(durable::StoreError::SessionNotFound(_))) => {
                worker
                    .start(StartOptions::new().with_id(id.clone()).with_messages(vec![
                        Message::user(format!("Tell Ann her order o-17 is confirmed. {SCRIPT}")),
                    ]))
                    .await
                    .expect("start")
            }
            Err(e) => panic!("resume: {e}"),
        };
    let turn: Message = session
        .model(|| async {
            Ok::<_, String>(Message::assistant(vec![
                Block::text(format!("Emailing Ann now. {SCRIPT}")),
                Block::tool_call("call_1", "send_email", email_args()),
            ]))
        })
        .await
        .expect("model turn 1");
    session.push(turn.clone());
    let args = turn
        .tool_calls()
        .next()
        .expect("a tool call")
        .arguments
        .clone();
    let started = Notify::new();
    let spec = send_email();
    let call = session.journal().tool(&spec, args).run(|_ctx| async {
        sent.fetch_add(1, Ordering::SeqCst);
        if crash {
            started.notify_one();
            std::future::pending::<()>().await;
        }
        Ok::<_, String>(json!({"id": "m-1"}))
    });
    let result = match until_started(call, &started).await {
        None => {
            session.release().await.expect("release after crash");
            return AgentEnd::Crashed;
        }
        Some(Ok(value)) => value,
        Some(Err(CallError::Durable(e))) => {
            session.release().await.expect("release after refusal");
            return AgentEnd::Refused(e);
        }
        Some(Err(e)) => panic!("send_email: {e}"),
    };
    session.push(Message::tool_result("call_1", result.clone(), false));
    session.push(Message::assistant(vec![Block::text(format!(
        "Ann was emailed (message {}).",
        result["id"].as_str().unwrap_or("?")
    ))]));
    session.complete().await.expect("complete");
    AgentEnd::Completed(result)
}

/// A refund a policy sends for approval: `amount` a required integer, `card` a secret
/// argument (journaled masked).
pub fn issue_refund() -> ToolSpec {
    ToolSpec::new(
        "issue_refund",
        "Refund the customer.",
        ReplayClass::UnsafeOnReplay,
        json!({"type": "object", "properties": {"amount": {"type": "integer"},
            "card": {"type": "string"}}, "required": ["amount"]}),
    )
    .with_secret_args(["card"])
}

/// Starts session `id`, whose one `issue_refund` call with `args` a policy sends for
/// approval (with `deadline`, and the model's `reasoning`), and parks it with
/// `await_approval`; the requested row.
pub async fn awaiting_approval(
    store: &Arc<dyn CheckpointStore>,
    id: &str,
    args: Value,
    reasoning: &str,
    deadline: Option<Duration>,
) -> CallRecord {
    use durable::approval::RequestExt as _;
    let durable = Durable::builder(Arc::clone(store))
        .owner("agent")
        .app_version(APP)
        .renew_leases(false)
        .lease_ttl(Duration::from_secs(600))
        .approval_policy(move |spec, _args| {
            let request = durable::approval::request("policy: refunds need a person");
            (spec.name == "issue_refund").then(|| match deadline {
                Some(d) => request.with_deadline(d),
                None => request,
            })
        })
        .build();
    let id = SessionId::new(id);
    let session = durable
        .start::<Message>(
            StartOptions::new()
                .with_id(id.clone())
                .with_messages(vec![Message::user("Refund my last order.")]),
        )
        .await
        .expect("start");
    let spec = issue_refund();
    let journal = session.journal().with_reasoning(reasoning);
    let outcome = journal
        .tool(&spec, args)
        .run(|_ctx| async { Ok::<_, String>(json!({"refund": "r-1"})) })
        .await;
    match outcome {
        Err(CallError::Durable(DurableError::AwaitingApproval { .. })) => {}
        Err(e) => panic!("expected AwaitingApproval, got {e}"),
        Ok(v) => panic!("expected AwaitingApproval, the call ran: {v}"),
    }
    session.await_approval().await.expect("park");
    let mut rows = store.calls(&id, None).await.expect("calls");
    rows.retain(|r| r.status == durable::store::CallStatus::Requested);
    assert_eq!(rows.len(), 1, "{rows:?}");
    rows.remove(0)
}

/// The console's options in the tests: a fixed token and operator.
pub fn options() -> ConsoleOptions {
    ConsoleOptions::from_env().token(TOKEN).operator(OPERATOR)
}

/// Serves the console over `store` on a free loopback port; the server task ends with
/// the test's runtime.
pub async fn serve(store: &Arc<dyn CheckpointStore>, options: ConsoleOptions) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let addr = listener.local_addr().expect("local address");
    let app = durable_console::router(Arc::clone(store), options);
    tokio::spawn(async move {
        axum::serve(listener, app).await.expect("serve");
    });
    addr
}

/// What [`pools`] added.
pub struct Pools {
    /// Queue `email`, asleep for half an hour, then for two hours.
    pub asleep: [SessionId; 2],
    /// Queue `support`, leased by `worker-7` for ten minutes.
    pub held: [SessionId; 2],
}

/// Worker pools at work: `worker-7` holds two sessions of queue `support`, two sessions
/// of queue `email` sleep (half an hour, two hours), and the queues have limits (`email`
/// 2, `support` 4).
pub async fn pools(store: &Arc<dyn CheckpointStore>) -> Pools {
    let held = [SessionId::new("ticket-4411"), SessionId::new("ticket-4412")];
    let worker = runtime(store, "worker-7");
    for id in &held {
        let session = worker
            .start::<Message>(
                StartOptions::new()
                    .with_id(id.clone())
                    .with_queue("support")
                    .with_messages(vec![Message::user("Answer the customer's ticket.")]),
            )
            .await
            .expect("start a held session");
        drop(session); // the lease stays live for ten minutes
    }
    let asleep = [
        SessionId::new("reminder-o-17"),
        SessionId::new("digest-ann"),
    ];
    for (id, minutes) in asleep.iter().zip([30, 120]) {
        let session = runtime(store, "worker-3")
            .start::<Message>(
                StartOptions::new()
                    .with_id(id.clone())
                    .with_queue("email")
                    .with_messages(vec![Message::user("Follow up later.")]),
            )
            .await
            .expect("start a sleeper");
        session
            .sleep(Duration::from_secs(60 * minutes))
            .await
            .expect("sleep");
    }
    store
        .set_queue_limit("email", Some(2))
        .await
        .expect("limit email");
    store
        .set_queue_limit("support", Some(4))
        .await
        .expect("limit support");
    Pools { asleep, held }
}

/// A session whose harness parked it at its model-call ceiling: one reply paid
/// ($0.0125, 1200 tokens), the second refused, then `park_for_budget`.
pub async fn parked_at_budget(store: &Arc<dyn CheckpointStore>) -> SessionId {
    let worker = runtime(store, "budget-worker");
    let session = worker
        .start::<Message>(
            StartOptions::new()
                .with_id(SessionId::new("research-ann"))
                .with_budget(
                    Budget::unlimited()
                        .with_limit_usd(0.05)
                        .expect("a limit")
                        .with_limit_model_calls(1)
                        .with_limit_tool("send_email", 3),
                ),
        )
        .await
        .expect("start");
    let ask = || async {
        session
            .journal()
            .model_with_spend(
                || async { Ok::<_, String>(json!({"text": "searching"})) },
                |_| Spend::new(0.0125, 1000, 200).ok(),
            )
            .await
    };
    ask().await.expect("first reply");
    let refusal = match ask().await {
        Err(CallError::Durable(DurableError::BudgetExceeded(r))) => r,
        other => panic!("a budget refusal expected: {other:?}"),
    };
    let id = session.id().clone();
    session.park_for_budget(&refusal).await.expect("park");
    id
}
