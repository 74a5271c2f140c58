//! Shared by `tests/cli.rs` (SQLite), `tests/cli_postgres.rs` and `tests/bounded.rs`: a store populated
//! through the library, a small agent that can crash mid-call, and a runner for the
//! built `durable` binary.

#![allow(dead_code)] // each test file uses its own subset

pub mod approvals;
pub mod budget;
pub mod hardening;
pub mod scenarios;
pub mod workers;

use std::future::Future;
use std::process::{Command, Output};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use durable::store::CallRecord;
use durable::{
    Block, CallError, CheckpointStore, Durable, DurableError, Message, Plan, ReplayClass,
    SessionId, StartOptions, StepStatus, ToolSpec,
};
use serde_json::{Value, json};
use tokio::sync::Notify;

/// The app version the populated sessions start on.
pub const APP: &str = "shop/1";

/// Clears the environment variables the binary reads (`DATABASE_URL` too:
/// `scripts/test.sh` may set it for the PostgreSQL harness) and names the operator.
pub fn clean_env(cmd: &mut Command) -> &mut Command {
    cmd.env_remove("DURABLE_DB")
        .env_remove("DATABASE_URL")
        .env_remove("DURABLE_MAC_KEY")
        .env_remove("DURABLE_PREVIOUS_MAC_KEYS")
        .env("USER", "test-operator")
}

/// Runs `durable --db <db> <args…>` with a clean environment ([`clean_env`]).
pub fn durable(db: &str, args: &[&str]) -> Output {
    clean_env(
        Command::new(env!("CARGO_BIN_EXE_durable"))
            .arg("--db")
            .arg(db)
            .args(args),
    )
    .output()
    .expect("run the durable binary")
}

/// Runs the binary with the given arguments and environment, the variables it reads
/// otherwise unset.
pub fn durable_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_durable"));
    clean_env(cmd.args(args));
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run the durable binary")
}

/// What a run printed, for assertions.
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl From<Output> for Run {
    fn from(out: Output) -> Self {
        Run {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

impl Run {
    /// Asserts success and returns stdout.
    #[track_caller]
    pub fn ok(&self) -> &str {
        assert_eq!(
            self.code, 0,
            "expected success\nstdout:\n{}\nstderr:\n{}",
            self.stdout, self.stderr
        );
        &self.stdout
    }

    /// Asserts success and parses stdout as JSON.
    #[track_caller]
    pub fn json(&self) -> Value {
        serde_json::from_str(self.ok()).expect("stdout is JSON")
    }

    /// Asserts a failure with `code` and one `error: …` line containing `needle`.
    #[track_caller]
    pub fn fails(&self, code: i32, needle: &str) {
        assert_eq!(
            self.code, code,
            "expected exit {code}\nstdout:\n{}\nstderr:\n{}",
            self.stdout, self.stderr
        );
        assert!(
            self.stderr.starts_with("error: ") && self.stderr.contains(needle),
            "stderr should be an `error:` line containing {needle:?}:\n{}",
            self.stderr
        );
        if code != 2 {
            // clap's usage errors add a hint line; ours are exactly one line.
            assert_eq!(self.stderr.trim_end().lines().count(), 1, "{}", self.stderr);
        }
        assert!(!self.stderr.contains("panicked"), "{}", self.stderr);
    }
}

/// `durable …` as a [`Run`].
pub fn run(db: &str, args: &[&str]) -> Run {
    durable(db, args).into()
}

fn object_schema(properties: Value, required: &[&str]) -> Value {
    json!({"type": "object", "properties": properties, "required": required, "additionalProperties": false})
}

/// A pure lookup.
pub fn read_order() -> ToolSpec {
    ToolSpec::new(
        "read_order",
        "Read an order.",
        ReplayClass::Pure,
        object_schema(json!({"order_id": {"type": "string"}}), &["order_id"]),
    )
}

/// A keyed charge.
pub fn charge_card() -> ToolSpec {
    ToolSpec::new(
        "charge_card",
        "Charge the card.",
        ReplayClass::IdempotentWithKey,
        object_schema(
            json!({"order_id": {"type": "string"}, "cents": {"type": "integer"}}),
            &["order_id", "cents"],
        ),
    )
}

/// An email that cannot be deduplicated; `body` is stored masked, and `auth` carries a
/// token the CLI must mask on its own.
pub fn send_email() -> ToolSpec {
    ToolSpec::new(
        "send_email",
        "Email the customer.",
        ReplayClass::UnsafeOnReplay,
        object_schema(
            json!({"to": {"type": "string"}, "body": {"type": "string"}, "auth": {"type": "object"}}),
            &["to", "body"],
        ),
    )
    .with_secret_args(["body"])
}

pub fn email_args() -> Value {
    json!({
        "to": "ann@example.com",
        "body": "Your order o-17 is confirmed. Secret tracking code 8812.",
        "auth": {"token": "tok-live-123"}
    })
}

fn runtime(store: &Arc<dyn CheckpointStore>, owner: &str, app: &str) -> Durable {
    Durable::builder(Arc::clone(store))
        .owner(owner)
        .app_version(app)
        .renew_leases(false)
        .lease_ttl(Duration::from_secs(600))
        .build()
}

/// What the populated store holds.
pub struct Population {
    /// Completed, three checkpoints, a pure and a keyed call.
    pub done: SessionId,
    /// Active, lease released, one `send_email` in doubt.
    pub doubt: SessionId,
    /// The in-doubt call of `doubt`.
    pub doubt_call: CallRecord,
    /// Active, leased by a live worker, with a `send_email` issued under that lease.
    pub live: SessionId,
    /// The issued (not in doubt) call of `live`.
    pub live_call: CallRecord,
    /// Cancelled, with a call in doubt: prune must keep it.
    pub cancelled: SessionId,
}

async fn issue_and_hang(session: &durable::Session, sent: &AtomicUsize) {
    let spec = send_email();
    let started = Notify::new();
    let call = session
        .journal()
        .tool(&spec, email_args())
        .run(|_ctx| async {
            sent.fetch_add(1, Ordering::SeqCst);
            started.notify_one();
            // The worker dies here: the effect left, its outcome was never recorded.
            std::future::pending::<Result<Value, String>>().await
        });
    if let Some(done) = until_started(call, &started).await {
        panic!("the call must hang after its effect: {done:?}");
    }
}

/// Polls `call` until it completes (`Some`) or its tool body signals `started` (`None`,
/// and the call is dropped there, as a dying worker drops it). No timer races the store.
async fn until_started<F: Future>(call: F, started: &Notify) -> Option<F::Output> {
    tokio::select! {
        done = call => Some(done),
        () = started.notified() => None,
        () = tokio::time::sleep(Duration::from_secs(60)) => {
            panic!("the call neither finished nor reached its tool body in 60 s")
        }
    }
}

fn only_issued(rows: Vec<CallRecord>) -> CallRecord {
    let mut issued: Vec<_> = rows
        .into_iter()
        .filter(|r| r.status == durable::store::CallStatus::Issued)
        .collect();
    assert_eq!(issued.len(), 1, "{issued:?}");
    issued.remove(0)
}

/// Fills a store with sessions in every state the commands must handle.
pub async fn populate(store: &Arc<dyn CheckpointStore>) -> Population {
    let worker = runtime(store, "worker-1", APP);
    let sent = AtomicUsize::new(0);

    // A completed session.
    let done = SessionId::new("s-done");
    let mut session = worker
        .start(
            StartOptions::new()
                .with_id(done.clone())
                .with_messages(vec![
                    Message::system("You confirm orders."),
                    Message::user("Confirm order o-17 for Ann."),
                ])
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
                Block::text("Reading the order."),
                Block::tool_call("c1", "read_order", json!({"order_id": "o-17"})),
            ]))
        })
        .await
        .expect("model");
    session.push(turn);
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
    session.checkpoint().await.expect("checkpoint 2");
    session.complete().await.expect("complete");

    // An active session whose worker died during an email.
    let doubt = SessionId::new("s-doubt");
    let session = worker
        .start::<Message>(
            StartOptions::new()
                .with_id(doubt.clone())
                .with_messages(vec![Message::user("Email Ann about o-17.")]),
        )
        .await
        .expect("start s-doubt");
    issue_and_hang(&session, &sent).await;
    session.release().await.expect("release");
    let doubt_call = only_issued(store.calls(&doubt, None).await.expect("calls"));

    // An active session whose worker is alive and mid-call.
    let live = SessionId::new("s-live");
    let session = runtime(store, "worker-2", "shop/2")
        .start::<Message>(StartOptions::new().with_id(live.clone()))
        .await
        .expect("start s-live");
    issue_and_hang(&session, &sent).await;
    drop(session); // the lease stays live for ten minutes
    let live_call = only_issued(store.calls(&live, None).await.expect("calls"));

    // A cancelled session with a call in doubt.
    let cancelled = SessionId::new("s-cancelled");
    let session = worker
        .start::<Message>(StartOptions::new().with_id(cancelled.clone()))
        .await
        .expect("start s-cancelled");
    issue_and_hang(&session, &sent).await;
    session
        .cancel(Some("customer called"))
        .await
        .expect("cancel");

    Population {
        done,
        doubt,
        doubt_call,
        live,
        live_call,
        cancelled,
    }
}

// ---------------------------------------------------------------------------------------
// The end-to-end agent: one email, one closing answer.

/// How a run of [`run_agent`] ended.
#[derive(Debug)]
pub enum AgentEnd {
    /// The worker died inside `send_email` (after the effect, before its outcome).
    Crashed,
    /// Resume refused the in-doubt email; the worker released the session and stopped.
    Refused(DurableError),
    /// The session completed; the email's result as the agent saw it.
    Completed(Value),
}

/// One worker run of a tiny agent that emails a customer, resuming `id` if it exists.
/// `sent` counts emails that actually left.
pub async fn run_agent(
    store: &Arc<dyn CheckpointStore>,
    id: &SessionId,
    sent: &AtomicUsize,
    crash: bool,
) -> AgentEnd {
    let worker = runtime(store, "agent", APP);
    let mut session = match worker.resume::<Message>(id).await {
        Ok(resumed) => resumed.session,
        Err(DurableError::Store(durable::StoreError::SessionNotFound(_))) => worker
            .start(
                StartOptions::new()
                    .with_id(id.clone())
                    .with_messages(vec![Message::user("Tell Ann her order o-17 is confirmed.")]),
            )
            .await
            .expect("start"),
        Err(e) => panic!("resume: {e}"),
    };
    let turn: Message = session
        .model(|| async {
            Ok::<_, String>(Message::assistant(vec![Block::tool_call(
                "call_1",
                "send_email",
                email_args(),
            )]))
        })
        .await
        .expect("model turn 1");
    session.push(turn.clone());
    let spec = send_email();
    let args = turn
        .tool_calls()
        .next()
        .expect("a tool call")
        .arguments
        .clone();
    let started = Notify::new();
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
    let closing: Message = session
        .model(|| {
            let id = result["id"].as_str().unwrap_or("?").to_owned();
            async move {
                Ok::<_, String>(Message::assistant(vec![Block::text(format!(
                    "Ann was emailed (message {id})."
                ))]))
            }
        })
        .await
        .expect("model turn 2");
    session.push(closing);
    session.complete().await.expect("complete");
    AgentEnd::Completed(result)
}
