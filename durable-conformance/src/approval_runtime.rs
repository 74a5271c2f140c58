//! Runtime cases: approvals through [`Durable`], [`Session`] and the journal. A call that
//! needs approval runs nothing and parks the session; once a person decides, the next
//! worker replays the turn: an approved call runs exactly once (with the edited arguments
//! and the key derived from them), a denied or expired one returns its denial, and an
//! approved call left in doubt by a crash is settled like any call, with its edits.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

use super::runtime::{GIVE_UP, release_dead_lease, spec};
use super::{owner, read};
use durable_core::ToolSpec;
use durable_core::approval::{self, RequestExt};
use durable_core::error::{DurableError, StoreError};
use durable_core::ids::{CallId, SessionId};
use durable_core::journal::CallError;
use durable_core::replay::ReplayClass;
use durable_core::runtime::{Durable, StartOptions};
use durable_core::session::Session;
use durable_core::store::{
    ApprovalEvent, ApprovalRequest, CallRecord, CallStatus, CheckpointStore, SessionStatus,
};
use durable_core::transcript::Message;

/// A runtime whose `on_approval_requested` hook collects the requested rows.
fn runtime(store: &Arc<dyn CheckpointStore>, tag: &str) -> (Durable, Arc<Mutex<Vec<CallRecord>>>) {
    let hooked: Arc<Mutex<Vec<CallRecord>>> = Arc::default();
    let sink = Arc::clone(&hooked);
    let durable = Durable::builder(Arc::clone(store))
        .owner(owner(tag))
        .app_version("v1")
        .on_approval_requested(move |row| sink.lock().expect("hook lock").push(row.clone()))
        .build();
    (durable, hooked)
}

/// The harness's call: `n` as the argument, approval asked with `request` when given,
/// edits accepted (a keyed tool derives `key-<n>`); the body counts its runs and echoes
/// the argument it ran with and its key.
async fn ask(
    session: &Session<Message>,
    spec: &ToolSpec,
    n: i64,
    request: Option<ApprovalRequest>,
    runs: &Arc<AtomicUsize>,
) -> Result<Value, CallError<String>> {
    let journal = session
        .journal()
        .with_reasoning("the customer asked for it <script>alert(1)</script>");
    let keyed = spec.class == ReplayClass::IdempotentWithKey;
    let mut call = journal.tool(spec, json!({ "n": n }));
    if keyed {
        call = call.key(format!("key-{n}"));
    }
    if let Some(request) = request {
        call = call.require_approval(request);
    }
    call = call.accept_edits(move |edited| {
        let n = edited["n"].as_i64().ok_or_else(|| DurableError::Encode {
            what: "edited n".into(),
            detail: "not an integer".into(),
        })?;
        Ok(keyed.then(|| format!("key-{n}")))
    });
    let runs = Arc::clone(runs);
    call.run(move |ctx| {
        let runs = Arc::clone(&runs);
        let ran_with = ctx
            .edited_args()
            .and_then(|args| args["n"].as_i64())
            .unwrap_or(n);
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, String>(json!({ "n": ran_with, "key": ctx.idempotency_key() }))
        }
    })
    .await
}

/// The call id of an `AwaitingApproval` refusal; panics on anything else.
fn awaiting(result: Result<Value, CallError<String>>) -> CallId {
    match result {
        Err(CallError::Durable(DurableError::AwaitingApproval { call, status, .. })) => {
            assert_eq!(status, "requested");
            call
        }
        other => panic!("expected AwaitingApproval, got {other:?}"),
    }
}

async fn start(durable: &Durable) -> Session<Message> {
    durable
        .start::<Message>(StartOptions::default())
        .await
        .expect("start a session")
}

/// The next worker takes the session once it is `active` again (its lease released by
/// the last decision).
async fn resume(store: &Arc<dyn CheckpointStore>, id: &SessionId, tag: &str) -> Session<Message> {
    let (durable, _) = runtime(store, tag);
    durable
        .resume::<Message>(id)
        .await
        .unwrap_or_else(|e| panic!("resume after the decision: {e}"))
        .session
}

/// Approved: nothing runs while the request waits (asked again, the same row; the hook
/// called once, after the row is durable); the session parks without a lease and cannot
/// be resumed; once approved it is `active`, and the next worker runs the call exactly
/// once; a later replay returns the recorded result. Audited: requested, approved, issued.
pub async fn runtime_approved_call_runs_once_on_the_next_worker(store: Arc<dyn CheckpointStore>) {
    let (durable, hooked) = runtime(&store, "first");
    let session = start(&durable).await;
    let refund = spec("refund", ReplayClass::UnsafeOnReplay);
    let runs = Arc::new(AtomicUsize::new(0));
    let call = awaiting(
        ask(
            &session,
            &refund,
            120,
            Some(approval::tool_rule(&refund)),
            &runs,
        )
        .await,
    );
    let again = awaiting(
        ask(
            &session,
            &refund,
            120,
            Some(approval::tool_rule(&refund)),
            &runs,
        )
        .await,
    );
    assert_eq!(again, call, "asked again in the same attempt: the same row");
    assert_eq!(runs.load(Ordering::SeqCst), 0, "nothing ran");
    {
        let hooked = hooked.lock().expect("hook lock");
        assert_eq!(hooked.len(), 1, "the hook is called once per request");
        assert_eq!(hooked[0].id, call);
        assert_eq!(hooked[0].status, CallStatus::Requested);
    }
    let id = session.id().clone();
    session.await_approval().await.expect("park");
    let parked = read(store.as_ref(), &id).await;
    assert_eq!(parked.status, SessionStatus::AwaitingApproval);
    assert_eq!(parked.lease_owner, None, "no worker is held");
    let refused = runtime(&store, "eager").0.resume::<Message>(&id).await;
    assert!(refused.is_err(), "an awaiting session is not resumed");

    let pending = durable
        .operator()
        .approvals(Some(&id))
        .await
        .expect("approvals");
    assert_eq!(pending.len(), 1);
    let approval = pending[0].call.approval.as_ref().expect("approval");
    assert_eq!(approval.asked_by, "tool refund");
    assert_eq!(approval.schema.as_ref(), Some(&refund.input_schema));
    assert!(
        approval
            .reasoning
            .as_deref()
            .unwrap_or("")
            .contains("<script>"),
        "the reasoning is journaled as given (escaped where shown)"
    );
    let approved = durable
        .operator()
        .approve(&call, None, "alice", Some("checked"))
        .await
        .expect("approve");
    assert_eq!(approved.status, CallStatus::Approved);
    assert_eq!(
        read(store.as_ref(), &id).await.status,
        SessionStatus::Active
    );
    let again = durable.operator().approve(&call, None, "bob", None).await;
    assert!(
        matches!(
            again,
            Err(DurableError::Store(StoreError::NotAwaitingApproval { .. }))
        ),
        "a second decision is refused: {again:?}"
    );

    let session = resume(&store, &id, "second").await;
    let result = ask(
        &session,
        &refund,
        120,
        Some(approval::tool_rule(&refund)),
        &runs,
    )
    .await
    .expect("the approved call runs");
    assert_eq!(result["n"], 120);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(
        store.call(&call).await.expect("row").status,
        CallStatus::Completed
    );
    drop(session);
    release_dead_lease(&store, &id).await;
    let session = resume(&store, &id, "third").await;
    let replayed = ask(
        &session,
        &refund,
        120,
        Some(approval::tool_rule(&refund)),
        &runs,
    )
    .await
    .expect("replayed");
    assert_eq!(replayed, result);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "exactly once");
    let log: Vec<ApprovalEvent> = store
        .approvals(&id)
        .await
        .expect("log")
        .into_iter()
        .map(|r| r.event)
        .collect();
    assert_eq!(
        log,
        [
            ApprovalEvent::Requested,
            ApprovalEvent::Approved,
            ApprovalEvent::Issued
        ]
    );
}

/// Edited: an invalid edit is refused with its path and decides nothing; a valid one
/// runs the keyed call with the edited arguments and the key derived from them, recorded
/// before it runs; a crash while it runs leaves it in doubt, and the re-execution uses
/// the edited arguments and the recorded (edited) key again.
pub async fn runtime_edited_approval_runs_with_the_edit_and_its_key(
    store: Arc<dyn CheckpointStore>,
) {
    let (durable, _) = runtime(&store, "first");
    let session = start(&durable).await;
    let refund = spec("refund", ReplayClass::IdempotentWithKey);
    let runs = Arc::new(AtomicUsize::new(0));
    let call = awaiting(
        ask(
            &session,
            &refund,
            500,
            Some(approval::tool_rule(&refund)),
            &runs,
        )
        .await,
    );
    assert_eq!(
        store
            .call(&call)
            .await
            .expect("row")
            .idempotency_key
            .as_deref(),
        Some("key-500")
    );
    let id = session.id().clone();
    session.await_approval().await.expect("park");

    let bad = durable
        .operator()
        .approve(&call, Some(json!({ "n": "fifty" })), "alice", None)
        .await;
    match bad {
        Err(DurableError::InvalidEdit { path, .. }) => assert_eq!(path, "$.n"),
        other => panic!("expected InvalidEdit at $.n, got {other:?}"),
    }
    assert_eq!(
        store.call(&call).await.expect("row").status,
        CallStatus::Requested,
        "an invalid edit decides nothing"
    );
    durable
        .operator()
        .approve(&call, Some(json!({ "n": 50 })), "alice", Some("half of it"))
        .await
        .expect("approve with an edit");

    // The worker runs it and dies inside the body, after the effect.
    let session = resume(&store, &id, "second").await;
    let dying = ask_and_die(&session, &refund, 500, &runs).await;
    assert!(dying, "the body started and was cut off");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let row = store.call(&call).await.expect("row");
    assert_eq!(row.status, CallStatus::Issued, "in doubt after the crash");
    assert_eq!(
        row.idempotency_key.as_deref(),
        Some("key-50"),
        "the edited key"
    );
    assert_eq!(
        row.args,
        json!({ "n": 500 }),
        "the identity keeps the request"
    );
    drop(session);
    release_dead_lease(&store, &id).await;

    let session = resume(&store, &id, "third").await;
    let result = ask(
        &session,
        &refund,
        500,
        Some(approval::tool_rule(&refund)),
        &runs,
    )
    .await
    .expect("re-executed with the recorded key");
    assert_eq!(result["n"], 50, "with the edited arguments");
    assert_eq!(result["key"], "key-50");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    let edited = store
        .approvals(&id)
        .await
        .expect("log")
        .into_iter()
        .find(|r| r.event == ApprovalEvent::Approved)
        .expect("approved entry");
    assert_eq!(edited.args_after, Some(json!({ "n": 50 })));
}

/// Runs the approved call with a body that performs its effect (counted) and hangs, and
/// cuts it off: returns whether the body started.
async fn ask_and_die(
    session: &Session<Message>,
    spec: &ToolSpec,
    n: i64,
    runs: &Arc<AtomicUsize>,
) -> bool {
    let started = Arc::new(tokio::sync::Notify::new());
    let signal = Arc::clone(&started);
    let runs = Arc::clone(runs);
    let call = session
        .journal()
        .tool(spec, json!({ "n": n }))
        .key(format!("key-{n}"))
        .accept_edits(|edited| Ok(Some(format!("key-{}", edited["n"]))));
    let fut = call.run(move |_ctx| {
        let runs = Arc::clone(&runs);
        let signal = Arc::clone(&signal);
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            signal.notify_one();
            std::future::pending::<Result<Value, String>>().await
        }
    });
    tokio::select! {
        _ = fut => false,
        () = started.notified() => true,
        () = tokio::time::sleep(GIVE_UP) => false,
    }
}

/// Denied: the call never runs; the reason is the tool result the model reads, on every
/// replay. An empty reason is refused.
pub async fn runtime_denied_call_returns_the_reason(store: Arc<dyn CheckpointStore>) {
    let (durable, _) = runtime(&store, "first");
    let session = start(&durable).await;
    let email = spec("send_email", ReplayClass::UnsafeOnReplay);
    let runs = Arc::new(AtomicUsize::new(0));
    let call = awaiting(
        ask(
            &session,
            &email,
            1,
            Some(approval::tool_rule(&email)),
            &runs,
        )
        .await,
    );
    let id = session.id().clone();
    session.await_approval().await.expect("park");
    let empty = durable.operator().deny(&call, "  ", "alice", None).await;
    assert!(
        matches!(
            empty,
            Err(DurableError::Store(StoreError::EmptyDenialReason { .. }))
        ),
        "{empty:?}"
    );
    durable
        .operator()
        .deny(&call, "the customer withdrew the request", "alice", None)
        .await
        .expect("deny");
    assert_eq!(
        read(store.as_ref(), &id).await.status,
        SessionStatus::Active
    );
    let session = resume(&store, &id, "second").await;
    match ask(
        &session,
        &email,
        1,
        Some(approval::tool_rule(&email)),
        &runs,
    )
    .await
    {
        Err(CallError::Recorded(failure)) => {
            assert!(
                failure
                    .message
                    .contains("the customer withdrew the request"),
                "{}",
                failure.message
            );
            assert!(failure.message.contains("alice"), "{}", failure.message);
        }
        other => panic!("expected the recorded denial, got {other:?}"),
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0, "a denied call never runs");
}

/// Expired: a request past its deadline (on the store's clock) is denied by the sweep,
/// after which a person can no longer approve it, and the model reads the expiry.
pub async fn runtime_expired_request_is_denied_by_its_deadline(store: Arc<dyn CheckpointStore>) {
    let (durable, _) = runtime(&store, "first");
    let session = start(&durable).await;
    let email = spec("send_email", ReplayClass::UnsafeOnReplay);
    let runs = Arc::new(AtomicUsize::new(0));
    let request = approval::request("policy: night shift").with_deadline(Duration::from_secs(3));
    let call = awaiting(ask(&session, &email, 1, Some(request.clone()), &runs).await);
    let id = session.id().clone();
    session.await_approval().await.expect("park");
    let deadline = store
        .call(&call)
        .await
        .expect("row")
        .approval
        .and_then(|a| a.deadline)
        .expect("a deadline");
    assert!(
        durable
            .operator()
            .expire_approvals(Some(&id))
            .await
            .expect("sweep")
            .is_empty(),
        "nothing expires before its deadline"
    );
    super::wait_past(store.as_ref(), deadline).await;
    let expired = durable
        .operator()
        .expire_approvals(None)
        .await
        .expect("sweep");
    assert!(expired.iter().any(|row| row.id == call), "{expired:?}");
    let late = durable.operator().approve(&call, None, "alice", None).await;
    assert!(
        matches!(
            late,
            Err(DurableError::Store(StoreError::NotAwaitingApproval { .. }))
        ),
        "{late:?}"
    );
    let session = resume(&store, &id, "second").await;
    match ask(&session, &email, 1, Some(request), &runs).await {
        Err(CallError::Recorded(failure)) => {
            assert!(failure.message.contains("expired"), "{}", failure.message);
        }
        other => panic!("expected the recorded expiry, got {other:?}"),
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// Several calls of one turn await together (asked by the runtime's policy, which leaves
/// other calls alone): the session stays parked until the last one is decided; then one
/// replay runs the approved call once, returns the denial, and the call that ran before
/// returns its recorded result.
pub async fn runtime_calls_of_one_turn_await_together(store: Arc<dyn CheckpointStore>) {
    let policy = |tool: &ToolSpec, args: &Value| {
        (tool.name == "refund" && args["n"].as_i64() > Some(100))
            .then(|| approval::request("policy: refunds above 100"))
    };
    let worker = |tag: &str| {
        Durable::builder(Arc::clone(&store))
            .owner(owner(tag))
            .app_version("v1")
            .approval_policy(policy)
            .build()
    };
    let durable = worker("first");
    let session = start(&durable).await;
    let refund = spec("refund", ReplayClass::UnsafeOnReplay);
    let runs = Arc::new(AtomicUsize::new(0));
    let small = ask(&session, &refund, 20, None, &runs)
        .await
        .expect("not asked");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "below the threshold it runs"
    );
    let first = awaiting(ask(&session, &refund, 150, None, &runs).await);
    let second = awaiting(ask(&session, &refund, 300, None, &runs).await);
    assert_ne!(first, second);
    let id = session.id().clone();
    session.await_approval().await.expect("park");
    assert_eq!(
        durable
            .operator()
            .approvals(Some(&id))
            .await
            .expect("pending")
            .len(),
        2
    );
    durable
        .operator()
        .approve(&first, None, "alice", None)
        .await
        .expect("approve");
    assert_eq!(
        read(store.as_ref(), &id).await.status,
        SessionStatus::AwaitingApproval,
        "one request is still open"
    );
    durable
        .operator()
        .deny(&second, "too much", "alice", None)
        .await
        .expect("deny");
    assert_eq!(
        read(store.as_ref(), &id).await.status,
        SessionStatus::Active
    );

    let next = worker("second");
    let session = next.resume::<Message>(&id).await.expect("resume").session;
    assert_eq!(
        ask(&session, &refund, 20, None, &runs)
            .await
            .expect("recorded"),
        small
    );
    let ran = ask(&session, &refund, 150, None, &runs)
        .await
        .expect("approved");
    assert_eq!(ran["n"], 150);
    assert!(matches!(
        ask(&session, &refund, 300, None, &runs).await,
        Err(CallError::Recorded(_))
    ));
    assert_eq!(runs.load(Ordering::SeqCst), 2, "each effect once");
}

/// A call approved with edits is not run by a call site that takes no edits: running the
/// requested arguments would not be what was approved. The row stays approved, and a
/// call site that takes them runs it.
pub async fn runtime_edits_need_a_call_site_that_takes_them(store: Arc<dyn CheckpointStore>) {
    let (durable, _) = runtime(&store, "first");
    let session = start(&durable).await;
    let refund = spec("refund", ReplayClass::UnsafeOnReplay);
    let runs = Arc::new(AtomicUsize::new(0));
    let call = awaiting(
        ask(
            &session,
            &refund,
            9,
            Some(approval::tool_rule(&refund)),
            &runs,
        )
        .await,
    );
    let id = session.id().clone();
    session.await_approval().await.expect("park");
    durable
        .operator()
        .approve(&call, Some(json!({ "n": 8 })), "alice", None)
        .await
        .expect("approve");
    let session = resume(&store, &id, "second").await;
    let plain = session
        .journal()
        .tool(&refund, json!({ "n": 9 }))
        .run(|_ctx| async { Ok::<_, String>(json!("ran")) })
        .await;
    assert!(
        matches!(
            plain,
            Err(CallError::Durable(DurableError::ApprovedCallRefused { .. }))
        ),
        "{plain:?}"
    );
    assert_eq!(
        store.call(&call).await.expect("row").status,
        CallStatus::Approved
    );
    let ran = ask(
        &session,
        &refund,
        9,
        Some(approval::tool_rule(&refund)),
        &runs,
    )
    .await
    .expect("runs with the edit");
    assert_eq!(ran["n"], 8);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// An approved call that cannot run as approved (here its edit no longer decodes into
/// the tool's type) is refused, nothing runs, and the step cannot end; a person denies
/// it (an approved call not yet run may still be denied), and the session goes on with
/// the denial as the call's result.
pub async fn runtime_approved_call_that_cannot_run_is_denied(store: Arc<dyn CheckpointStore>) {
    let (durable, _) = runtime(&store, "first");
    let session = start(&durable).await;
    let refund = spec("refund", ReplayClass::UnsafeOnReplay);
    let runs = Arc::new(AtomicUsize::new(0));
    let call = awaiting(
        ask(
            &session,
            &refund,
            9,
            Some(approval::tool_rule(&refund)),
            &runs,
        )
        .await,
    );
    let id = session.id().clone();
    session.await_approval().await.expect("park");
    // Valid against the schema (an integer), but this call site's type takes at most 2^31.
    durable
        .operator()
        .approve(&call, Some(json!({ "n": 1_u64 << 40 })), "alice", None)
        .await
        .expect("approve");
    let mut session = resume(&store, &id, "second").await;
    let narrow = session
        .journal()
        .tool(&refund, json!({ "n": 9 }))
        .accept_edits(|edited| {
            i32::try_from(edited["n"].as_i64().unwrap_or(i64::MAX))
                .map(|_| None)
                .map_err(|e| DurableError::Encode {
                    what: "edited n".into(),
                    detail: e.to_string(),
                })
        })
        .run(|_ctx| async { Ok::<_, String>(json!("ran")) })
        .await;
    match narrow {
        Err(CallError::Durable(DurableError::ApprovedCallRefused {
            call: refused,
            reason,
            ..
        })) => {
            assert_eq!(refused, call);
            assert!(reason.contains("edited n"), "{reason}");
        }
        other => panic!("expected ApprovedCallRefused, got {other:?}"),
    }
    let ended = session.checkpoint().await;
    assert!(
        matches!(ended, Err(DurableError::AwaitingApproval { ref status, .. }) if status == "approved"),
        "the step cannot end past an approved call: {ended:?}"
    );
    durable
        .operator()
        .deny(&call, "the edit does not fit the tool", "alice", None)
        .await
        .expect_err("deny is for requests: an approved call is revoked");
    durable
        .operator()
        .revoke(&call, "the edit does not fit the tool", "alice", None)
        .await
        .expect("an approved call that has not run can be revoked");
    drop(session);
    release_dead_lease(&store, &id).await;
    let mut session = resume(&store, &id, "third").await;
    match ask(
        &session,
        &refund,
        9,
        Some(approval::tool_rule(&refund)),
        &runs,
    )
    .await
    {
        Err(CallError::Recorded(failure)) => {
            assert!(
                failure.message.contains("does not fit"),
                "{}",
                failure.message
            );
        }
        other => panic!("expected the recorded denial, got {other:?}"),
    }
    session.checkpoint().await.expect("the step ends");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// `checkpoint_after` does not end a step that holds a call awaiting approval: its own
/// call's outcome is recorded on its own and the scope returns `AwaitingApproval`, so the
/// approved call still runs when the turn replays.
pub async fn runtime_checkpoint_after_keeps_the_step_open_for_a_request(
    store: Arc<dyn CheckpointStore>,
) {
    let (durable, _) = runtime(&store, "first");
    let mut session = start(&durable).await;
    let refund = spec("refund", ReplayClass::UnsafeOnReplay);
    let email = spec("email", ReplayClass::UnsafeOnReplay);
    let runs = Arc::new(AtomicUsize::new(0));
    let call = awaiting(
        ask(
            &session,
            &refund,
            5,
            Some(approval::tool_rule(&refund)),
            &runs,
        )
        .await,
    );
    let sent = Arc::clone(&runs);
    let scoped = session
        .checkpoint_after(
            async |journal| {
                journal
                    .tool(&email, json!({ "n": 1 }))
                    .run(move |_ctx| {
                        let sent = Arc::clone(&sent);
                        async move {
                            sent.fetch_add(1, Ordering::SeqCst);
                            Ok::<_, String>(json!({ "sent": true }))
                        }
                    })
                    .await
            },
            |outcome| Message::tool_outcome("call_2", outcome),
        )
        .await;
    assert!(
        matches!(
            scoped,
            Err(CallError::Durable(DurableError::AwaitingApproval { .. }))
        ),
        "{scoped:?}"
    );
    assert_eq!(session.version(), 0, "no checkpoint ended the step");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the email ran once");
    let id = session.id().clone();
    session.await_approval().await.expect("park");
    durable
        .operator()
        .approve(&call, None, "alice", None)
        .await
        .expect("approve");
    let session = resume(&store, &id, "second").await;
    ask(
        &session,
        &refund,
        5,
        Some(approval::tool_rule(&refund)),
        &runs,
    )
    .await
    .expect("the approved refund runs in the step it was asked in");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// An edit whose derived key another call of the tool holds with other arguments is
/// refused when the approved call would run (as a fresh call with those arguments would
/// be): nothing runs, the row stays approved, and a person denies it.
pub async fn runtime_edited_key_held_by_another_call_is_refused(store: Arc<dyn CheckpointStore>) {
    let (durable, _) = runtime(&store, "first");
    let charge = spec("charge", ReplayClass::IdempotentWithKey);
    let runs = Arc::new(AtomicUsize::new(0));
    // Another session charged under `key-2`, with other arguments.
    let other = start(&durable).await;
    let counted = Arc::clone(&runs);
    other
        .journal()
        .tool(&charge, json!({ "n": 2, "memo": "phone order" }))
        .key("key-2")
        .run(move |_ctx| {
            let counted = Arc::clone(&counted);
            async move {
                counted.fetch_add(1, Ordering::SeqCst);
                Ok::<_, String>(json!("charged"))
            }
        })
        .await
        .expect("the other charge");
    let session = start(&durable).await;
    let call = awaiting(
        ask(
            &session,
            &charge,
            5,
            Some(approval::tool_rule(&charge)),
            &runs,
        )
        .await,
    );
    let id = session.id().clone();
    session.await_approval().await.expect("park");
    durable
        .operator()
        .approve(&call, Some(json!({ "n": 2 })), "alice", None)
        .await
        .expect("approve");
    let session = resume(&store, &id, "second").await;
    match ask(
        &session,
        &charge,
        5,
        Some(approval::tool_rule(&charge)),
        &runs,
    )
    .await
    {
        Err(CallError::Durable(DurableError::ApprovedCallRefused { reason, .. })) => {
            assert!(reason.contains("key-2"), "{reason}");
        }
        other => panic!("expected ApprovedCallRefused, got {other:?}"),
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "only the other charge ran");
    let row = store.call(&call).await.expect("row");
    assert_eq!(row.status, CallStatus::Approved);
    assert_eq!(
        row.idempotency_key.as_deref(),
        Some("key-5"),
        "the key is unchanged"
    );
    durable
        .operator()
        .revoke(&call, "the order was charged by phone", "alice", None)
        .await
        .expect("revoke");
}

/// Revoked while the worker resumes: the session's worker read the row `approved`, and a
/// person revoked the approval before the worker issued it. Nothing runs, and the worker
/// gets the recorded denial (`CallError::Recorded`, the revocation's reason), as for any
/// denied call: not the resolve vocabulary ("not in doubt").
pub async fn runtime_revoke_racing_the_resume_is_the_recorded_denial(
    store: Arc<dyn CheckpointStore>,
) {
    let (durable, _) = runtime(&store, "first");
    let session = start(&durable).await;
    let email = spec("send_email", ReplayClass::UnsafeOnReplay);
    let runs = Arc::new(AtomicUsize::new(0));
    let call = awaiting(
        ask(
            &session,
            &email,
            1,
            Some(approval::tool_rule(&email)),
            &runs,
        )
        .await,
    );
    let id = session.id().clone();
    session.await_approval().await.expect("park");
    durable
        .operator()
        .approve(&call, None, "alice", None)
        .await
        .expect("approve");
    // The next worker reads the row approved; the revocation lands before it issues it.
    let probe = super::stall::Probe::new(Arc::clone(&store));
    let (revoker, revoked) = (durable.clone(), call.clone());
    probe.before_next_issue_approved(Box::new(move || {
        Box::pin(async move {
            revoker
                .operator()
                .revoke(&revoked, "the customer withdrew the request", "bob", None)
                .await
                .expect("revoke lands first");
        })
    }));
    let probed: Arc<dyn CheckpointStore> = probe;
    let session = resume(&probed, &id, "second").await;
    match ask(
        &session,
        &email,
        1,
        Some(approval::tool_rule(&email)),
        &runs,
    )
    .await
    {
        Err(CallError::Recorded(failure)) => {
            assert!(
                failure
                    .message
                    .contains("the customer withdrew the request"),
                "{}",
                failure.message
            );
        }
        other => panic!("expected the recorded denial, got {other:?}"),
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0, "a revoked call never runs");
    assert_eq!(
        store.call(&call).await.expect("row").status,
        CallStatus::Denied
    );
}
