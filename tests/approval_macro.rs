//! `#[durable_tool(approval = ...)]` end to end on the `SQLite` store: a call that needs
//! approval is journaled as requested and its body does not run; the session parks; an
//! approved call runs once on resume, with the arguments a person edited (and a keyed
//! tool under the key derived from them); a denied call returns its reason to the model.
//!
//! Each test has its own tools, so their counters do not interfere when tests run in
//! parallel.

#![warn(clippy::pedantic)]

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use durable::sqlite::SqliteStore;
use durable::store::CallStatus;
use durable::{
    CallError, CallId, CheckpointStore, Durable, DurableError, IdempotencyKey, Message, Session,
    SessionId, StartOptions, Tool, ToolContext, Verification, durable_tool,
};
use serde::{Deserialize, Serialize};
use serde_json::json;

#[derive(Debug)]
struct Failure(String);

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

async fn store() -> Arc<dyn CheckpointStore> {
    Arc::new(
        SqliteStore::open_in_memory()
            .await
            .expect("in-memory store"),
    )
}

fn runtime(store: &Arc<dyn CheckpointStore>, owner: &str) -> Durable {
    Durable::builder(Arc::clone(store))
        .owner(owner)
        .renew_leases(false)
        .build()
}

async fn start(store: &Arc<dyn CheckpointStore>) -> Session {
    runtime(store, "worker-1")
        .start::<Message>(StartOptions::default())
        .await
        .expect("start")
}

/// A new worker resumes the session once every request was decided: the turn re-runs.
async fn resume(store: &Arc<dyn CheckpointStore>, id: &SessionId) -> Session {
    runtime(store, "worker-2")
        .resume::<Message>(id)
        .await
        .expect("resume")
        .session
}

/// The one pending request of the session.
async fn pending(durable: &Durable, id: &SessionId) -> CallId {
    let pending = durable
        .operator()
        .approvals(Some(id))
        .await
        .expect("approvals");
    assert_eq!(pending.len(), 1, "{pending:?}");
    pending[0].call.id.clone()
}

fn awaiting<T: std::fmt::Debug, E: std::fmt::Debug>(result: &Result<T, CallError<E>>) -> bool {
    matches!(result, Err(CallError::Durable(e)) if e.is_awaiting_approval())
}

// ---------------------------------------------------------------------------------------

static WIRED: Mutex<Vec<(String, u64)>> = Mutex::new(Vec::new());

/// Wire money to an account.
#[durable_tool(replay = "unsafe_on_replay", approval = "required")]
async fn wire_funds(to: String, cents: u64) -> Result<String, Failure> {
    WIRED.lock().expect("lock").push((to.clone(), cents));
    Ok(format!("wired {cents} to {to}"))
}

#[tokio::test]
async fn a_required_approval_parks_the_call_and_runs_it_once_with_the_edit() {
    let store = store().await;
    let session = start(&store).await;
    let id = session.id().clone();

    let first = wire_funds
        .call(session.journal(), "acct-1".into(), 5_000)
        .await;
    assert!(awaiting(&first), "{first:?}");
    assert!(
        WIRED.lock().expect("lock").is_empty(),
        "the body must not run"
    );
    session.await_approval().await.expect("park");

    let operator = runtime(&store, "operator");
    let call = pending(&operator, &id).await;
    let requested = store.call(&call).await.expect("row");
    assert_eq!(requested.status, CallStatus::Requested);
    assert_eq!(
        requested.approval.as_ref().map(|a| a.asked_by.as_str()),
        Some("tool wire_funds")
    );
    operator
        .operator()
        .approve(
            &call,
            Some(json!({"to": "acct-1", "cents": 500})),
            "alice",
            None,
        )
        .await
        .expect("approve");

    // The replayed turn asks with the model's arguments; the body gets the edited ones.
    let session = resume(&store, &id).await;
    let wired = wire_funds
        .call(session.journal(), "acct-1".into(), 5_000)
        .await
        .expect("approved call runs");
    assert_eq!(wired, "wired 500 to acct-1");
    // Another replay of the turn returns the recorded result: the body ran once.
    session.release().await.expect("release");
    let session = resume(&store, &id).await;
    let again = wire_funds
        .call(session.journal(), "acct-1".into(), 5_000)
        .await
        .expect("recorded");
    assert_eq!(again, wired);
    assert_eq!(*WIRED.lock().expect("lock"), [("acct-1".to_owned(), 500)]);
    assert_eq!(
        store.call(&call).await.expect("row").status,
        CallStatus::Completed
    );
}

// ---------------------------------------------------------------------------------------

static REFUNDED: Mutex<Vec<(String, u64, String)>> = Mutex::new(Vec::new());

/// Refund part of an order.
#[durable_tool(
    replay = "idempotent_with_key",
    idempotency_key = |a| format!("refund:{}:{}", a.order, a.cents),
    approval = large_refund,
)]
async fn refund(key: IdempotencyKey, order: String, cents: u64) -> Result<u64, Failure> {
    REFUNDED
        .lock()
        .expect("lock")
        .push((order, cents, key.as_str().to_owned()));
    Ok(cents)
}

fn large_refund(args: &RefundArgs) -> bool {
    args.cents > 100
}

#[tokio::test]
async fn an_approval_rule_decides_per_call_and_an_edit_re_derives_the_key() {
    let store = store().await;
    let session = start(&store).await;
    let id = session.id().clone();

    let small = refund.call(session.journal(), "o-1".into(), 50).await;
    assert_eq!(small.expect("no approval needed"), 50);
    let large = refund.call(session.journal(), "o-1".into(), 500).await;
    assert!(awaiting(&large), "{large:?}");
    assert_eq!(
        *REFUNDED.lock().expect("lock"),
        [("o-1".to_owned(), 50, "refund:o-1:50".to_owned())]
    );
    session.await_approval().await.expect("park");

    let operator = runtime(&store, "operator");
    let call = pending(&operator, &id).await;
    operator
        .operator()
        .approve(
            &call,
            Some(json!({"order": "o-1", "cents": 90})),
            "alice",
            Some("partial refund"),
        )
        .await
        .expect("approve");

    let session = resume(&store, &id).await;
    let replayed = refund.call(session.journal(), "o-1".into(), 50).await;
    assert_eq!(replayed.expect("recorded"), 50);
    // Through the model's path: `Tool::invoke` with the JSON it sent.
    let output = refund
        .invoke(session.journal(), json!({"order": "o-1", "cents": 500}))
        .await
        .expect("approved call runs");
    assert!(!output.is_error, "{output:?}");
    assert_eq!(output.content, json!(90));
    assert_eq!(
        *REFUNDED.lock().expect("lock"),
        [
            ("o-1".to_owned(), 50, "refund:o-1:50".to_owned()),
            ("o-1".to_owned(), 90, "refund:o-1:90".to_owned()),
        ]
    );
    let row = store.call(&call).await.expect("row");
    assert_eq!(row.idempotency_key.as_deref(), Some("refund:o-1:90"));
    assert_eq!(row.args, json!({"order": "o-1", "cents": 500}));
}

// ---------------------------------------------------------------------------------------

static DELETED: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Delete a customer's account.
#[durable_tool(replay = "pure", approval = "required")]
async fn delete_account(customer: String) -> Result<(), Failure> {
    DELETED.lock().expect("lock").push(customer);
    Ok(())
}

#[tokio::test]
async fn a_denied_call_returns_the_reason_to_the_model() {
    let store = store().await;
    let session = start(&store).await;
    let id = session.id().clone();

    let asked = delete_account
        .invoke(session.journal(), json!({"customer": "c-9"}))
        .await;
    assert!(
        matches!(&asked, Err(e @ DurableError::AwaitingApproval { .. }) if e.is_awaiting_approval()),
        "{asked:?}"
    );
    session.await_approval().await.expect("park");

    let operator = runtime(&store, "operator");
    let call = pending(&operator, &id).await;
    operator
        .operator()
        .deny(&call, "customer asked to keep the account", "bob", None)
        .await
        .expect("deny");

    let session = resume(&store, &id).await;
    let output = delete_account
        .invoke(session.journal(), json!({"customer": "c-9"}))
        .await
        .expect("the denial is the tool's result");
    assert!(output.is_error, "{output:?}");
    let message = output.content["error"].as_str().expect("error text");
    assert!(
        message.contains("customer asked to keep the account"),
        "{message}"
    );
    assert!(
        DELETED.lock().expect("lock").is_empty(),
        "a denied call never runs"
    );
}

// ---------------------------------------------------------------------------------------

/// A notice to post (the struct-argument form).
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
struct Notice {
    /// The board.
    board: String,
    /// Hang after posting, like a crash before the result is recorded.
    hang: bool,
}

static POSTED: Mutex<Vec<String>> = Mutex::new(Vec::new());
static VERIFIED: Mutex<Vec<String>> = Mutex::new(Vec::new());
static POSTING: AtomicBool = AtomicBool::new(false);

/// Post a notice on a board.
#[durable_tool(replay = "unsafe_on_replay", verify = notice_was_posted, approval = needs_review)]
async fn post_notice(#[args] notice: Notice) -> Result<String, Failure> {
    POSTED.lock().expect("lock").push(notice.board.clone());
    if notice.hang {
        POSTING.store(true, Ordering::SeqCst);
        std::future::pending::<()>().await;
    }
    Ok(format!("posted on {}", notice.board))
}

fn needs_review(notice: &Notice) -> bool {
    notice.board != "scratch"
}

#[allow(clippy::unused_async)] // verify hooks are async; this one needs no I/O
async fn notice_was_posted(_ctx: &ToolContext, notice: &Notice) -> Verification<String> {
    VERIFIED.lock().expect("lock").push(notice.board.clone());
    if POSTED.lock().expect("lock").contains(&notice.board) {
        Verification::Happened(format!("found on {}", notice.board))
    } else {
        Verification::DidNotHappen
    }
}

#[tokio::test]
async fn the_verify_hook_of_an_approved_call_sees_the_edited_arguments() {
    let store = store().await;
    let session = start(&store).await;
    let id = session.id().clone();

    let asked = post_notice
        .call(
            session.journal(),
            Notice {
                board: "general".into(),
                hang: true,
            },
        )
        .await;
    assert!(awaiting(&asked), "{asked:?}");
    session.await_approval().await.expect("park");
    let operator = runtime(&store, "operator");
    let call = pending(&operator, &id).await;
    operator
        .operator()
        .approve(
            &call,
            Some(json!({"board": "ops", "hang": true})),
            "alice",
            None,
        )
        .await
        .expect("approve");

    // The approved call posts with the edit, then its worker is lost before the result
    // is recorded.
    let session = resume(&store, &id).await;
    let journal = session.journal().clone();
    let task = tokio::spawn(async move {
        post_notice
            .call(
                &journal,
                Notice {
                    board: "general".into(),
                    hang: true,
                },
            )
            .await
    });
    while !POSTING.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    task.abort();
    assert!(task.await.is_err(), "the call was cut off");
    assert_eq!(
        store.call(&call).await.expect("row").status,
        CallStatus::Issued
    );

    // In doubt on resume: the verify hook is asked about the edited arguments.
    session.release().await.expect("release");
    let session = resume(&store, &id).await;
    let verified = post_notice
        .call(
            session.journal(),
            Notice {
                board: "general".into(),
                hang: true,
            },
        )
        .await
        .expect("verified");
    assert_eq!(verified, "found on ops");
    assert_eq!(*POSTED.lock().expect("lock"), ["ops"]);
    assert_eq!(*VERIFIED.lock().expect("lock"), ["ops"]);
}
