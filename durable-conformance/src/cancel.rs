//! Cases: cancellation. A running session stops at its next call (no new effect starts;
//! the one in flight finishes and is recorded); a session no worker holds is cancelled
//! at once, with its children; one held by a dead worker ends when the next worker
//! takes it, its in-doubt call left for an operator.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::Notify;

use super::children::worker;
use super::owner;
use super::runtime::{call_and_die, release_dead_lease, spec};
use durable_core::error::{DurableError, ErrorKind};
use durable_core::journal::CallError;
use durable_core::replay::ReplayClass;
use durable_core::runtime::{Durable, StartOptions};
use durable_core::session::ChildWait;
use durable_core::store::{
    CallStatus, CancelEffect, CancelSession, CheckpointStore, SessionStatus,
};
use durable_core::transcript::Message;

/// A cancellation asked while an effect runs: the effect finishes and is recorded; once
/// the worker learns of it (at its next lease renewal), no call starts, the session is
/// `cancelled` with who and why, and the refusal is typed.
pub async fn cancel_stops_a_running_session_at_its_next_call(store: Arc<dyn CheckpointStore>) {
    let ttl = Duration::from_millis(600);
    let durable = Durable::builder(Arc::clone(&store))
        .owner(owner("runner"))
        .app_version("v1")
        .lease_ttl(ttl)
        .build();
    let session = durable
        .start::<Message>(StartOptions::new())
        .await
        .expect("start");
    let id = session.id().clone();
    let email = spec("email", ReplayClass::UnsafeOnReplay);
    let runs = Arc::new(AtomicUsize::new(0));
    let (entered, gate) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let call = {
        let (runs, entered, gate) = (Arc::clone(&runs), Arc::clone(&entered), Arc::clone(&gate));
        session
            .journal()
            .tool(&email, json!({ "n": 1 }))
            .run(move |_| {
                runs.fetch_add(1, Ordering::SeqCst);
                entered.notify_one();
                let gate = Arc::clone(&gate);
                async move {
                    gate.notified().await;
                    Ok::<Value, String>(json!({ "sent": 1 }))
                }
            })
    };
    let operator = worker(&store, "ops").operator();
    let (sent, cancelled) = tokio::join!(call, async {
        entered.notified().await;
        let cancelled = operator.cancel(&id, "customer withdrew").await;
        gate.notify_one();
        cancelled
    });
    let cancelled = cancelled.expect("cancel");
    assert_eq!(
        cancelled[0].effect,
        CancelEffect::Requested,
        "a running session is asked to stop"
    );
    assert_eq!(
        sent.expect("the effect in flight finishes"),
        json!({ "sent": 1 })
    );
    let rows = store.calls(&id, None).await.expect("journal");
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].status, CallStatus::Completed, "and is recorded");

    // The worker learns of it at its next renewal (a third of the TTL).
    tokio::time::sleep(ttl).await;
    let runs_before = runs.load(Ordering::SeqCst);
    let next = session
        .journal()
        .tool(&email, json!({ "n": 2 }))
        .run(|_| async { Ok::<Value, String>(json!({ "sent": 2 })) })
        .await;
    match next {
        Err(CallError::Durable(e @ DurableError::Cancelled { .. })) => {
            assert_eq!(e.kind(), ErrorKind::Cancelled);
        }
        other => panic!("a call after the cancellation must be refused, got {other:?}"),
    }
    let model = session
        .model(|| async { Ok::<Value, String>(json!("hello")) })
        .await;
    assert!(
        matches!(
            model,
            Err(CallError::Durable(DurableError::Cancelled { .. }))
        ),
        "no model call starts either: {model:?}"
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        runs_before,
        "no new effect ran"
    );
    let record = store.session(&id).await.expect("session");
    assert_eq!(record.status, SessionStatus::Cancelled);
    let reason = record.status_reason.unwrap_or_default();
    assert!(
        reason.contains("customer withdrew") && reason.contains("ops-"),
        "who and why: {reason}"
    );
    assert_eq!(
        store.calls(&id, None).await.expect("journal").len(),
        1,
        "the refused calls journaled nothing"
    );
    let resumed = worker(&store, "other").resume::<Message>(&id).await;
    assert!(resumed.is_err(), "a cancelled session is not resumed");
}

/// The store refuses to issue a call of a session asked to stop, in the transaction of
/// the fence: a worker that has not yet heard of the cancellation (no renewal since; its
/// renewals are off here) starts no effect after it committed. The call is refused as
/// `Cancelled`, its body never runs, nothing is journaled, and the session ends as
/// `cancelled` with who and why. What ran before is kept.
pub async fn cancel_committed_starts_no_effect_before_the_worker_hears_of_it(
    store: Arc<dyn CheckpointStore>,
) {
    let durable = Durable::builder(Arc::clone(&store))
        .owner(owner("runner"))
        .app_version("v1")
        .renew_leases(false)
        .build();
    let session = durable
        .start::<Message>(StartOptions::new())
        .await
        .expect("start");
    let id = session.id().clone();
    let email = spec("email", ReplayClass::UnsafeOnReplay);
    let charge = spec("charge", ReplayClass::IdempotentWithKey);
    let runs = Arc::new(AtomicUsize::new(0));
    let run = |n: u64| {
        let runs = Arc::clone(&runs);
        move |_: durable_core::ToolContext| {
            runs.fetch_add(1, Ordering::SeqCst);
            async move { Ok::<Value, String>(json!({ "sent": n })) }
        }
    };
    session
        .journal()
        .tool(&email, json!({ "n": 1 }))
        .run(run(1))
        .await
        .expect("the first email, before the cancellation");
    let cancelled = worker(&store, "ops")
        .operator()
        .cancel(&id, "customer withdrew")
        .await
        .expect("cancel");
    assert_eq!(cancelled[0].effect, CancelEffect::Requested);

    // At once: no renewal has told this worker.
    let next = session
        .journal()
        .tool(&email, json!({ "n": 2 }))
        .run(run(2))
        .await;
    match next {
        Err(CallError::Durable(e @ DurableError::Cancelled { .. })) => {
            assert_eq!(e.kind(), ErrorKind::Cancelled);
        }
        other => panic!("the store must refuse to issue the call, got {other:?}"),
    }
    let keyed = session
        .journal()
        .tool(&charge, json!({ "cents": 500 }))
        .key("order-1")
        .run(run(3))
        .await;
    assert!(
        matches!(
            keyed,
            Err(CallError::Durable(DurableError::Cancelled { .. }))
        ),
        "a keyed call is refused too: {keyed:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "no new effect ran");
    let rows = store.calls(&id, None).await.expect("journal");
    assert_eq!(
        rows.len(),
        1,
        "the refused calls journaled nothing: {rows:?}"
    );
    let record = store.session(&id).await.expect("session");
    assert_eq!(record.status, SessionStatus::Cancelled);
    assert!(
        record
            .status_reason
            .unwrap_or_default()
            .contains("customer withdrew"),
        "who and why"
    );
}

/// A parent waiting for its children, its children and a grandchild: no worker holds
/// any of them, so one cancellation ends them all at once, parents first; without the
/// cascade only the named session ends.
pub async fn cancel_cascades_to_children_at_once(store: Arc<dyn CheckpointStore>) {
    let durable = worker(&store, "parent");
    let kids = worker(&store, "kid");
    let parent = durable
        .start::<Message>(StartOptions::new())
        .await
        .expect("start");
    let id = parent.id().clone();
    let first = parent
        .spawn_child(StartOptions::<Message>::new().with_state(json!(1)))
        .await
        .expect("spawn");
    let second = parent
        .spawn_child(StartOptions::<Message>::new().with_state(json!(2)))
        .await
        .expect("spawn");
    let middle = kids
        .resume::<Message>(&first)
        .await
        .expect("resume")
        .session;
    let grandchild = middle
        .spawn_child(StartOptions::<Message>::new().with_state(json!(3)))
        .await
        .expect("spawn a grandchild");
    middle.release().await.expect("release");
    let ChildWait::Released = parent
        .await_children(&[first.clone(), second.clone()])
        .await
        .expect("await")
    else {
        panic!("running children: the parent waits");
    };

    let done = kids
        .operator()
        .cancel(&id, "wrong ticket")
        .await
        .expect("cancel");
    let reached: Vec<_> = done.iter().map(|d| d.session.clone()).collect();
    assert_eq!(reached[0], id, "the named session first");
    assert_eq!(reached.len(), 4, "{reached:?}");
    for family in [&id, &first, &second, &grandchild] {
        let record = store.session(family).await.expect("session");
        assert_eq!(record.status, SessionStatus::Cancelled, "{family}");
        assert!(record.lease_owner.is_none());
        let request = record.cancel_requested.expect("who and why are kept");
        assert_eq!(request.reason, "wrong ticket");
        assert!(
            record
                .status_reason
                .unwrap_or_default()
                .contains("wrong ticket")
        );
    }
    assert!(done.iter().all(|d| d.effect == CancelEffect::Cancelled));
    // Again: everything ended already.
    let again = kids
        .operator()
        .cancel(&id, "twice")
        .await
        .expect("cancel again");
    assert!(again.iter().all(|d| d.effect == CancelEffect::AlreadyEnded));

    // Without the cascade, only the named session ends.
    let lone = durable
        .start::<Message>(StartOptions::new())
        .await
        .expect("start");
    let lone_id = lone.id().clone();
    let kept = lone
        .spawn_child(StartOptions::<Message>::new())
        .await
        .expect("spawn");
    lone.release().await.expect("release");
    let done = kids
        .operator()
        .cancel_with(CancelSession::new(lone_id.clone(), "ops", "parent only").without_children())
        .await
        .expect("cancel");
    assert_eq!(done.len(), 1);
    assert_eq!(
        store.session(&lone_id).await.expect("parent").status,
        SessionStatus::Cancelled
    );
    assert_eq!(
        store.session(&kept).await.expect("child").status,
        SessionStatus::Active
    );
}

/// A session whose worker died holding it (an email in doubt): the cancellation is
/// asked, and the next worker that takes it ends it without running anything; the
/// in-doubt call stays for an operator.
pub async fn cancel_of_a_dead_workers_session_ends_on_the_next_take(
    store: Arc<dyn CheckpointStore>,
) {
    let durable = worker(&store, "dying");
    let session = durable
        .start::<Message>(StartOptions::new())
        .await
        .expect("start");
    let id = session.id().clone();
    let email = spec("email", ReplayClass::UnsafeOnReplay);
    let effects = Arc::new(AtomicUsize::new(0));
    call_and_die(&session, &email, 1, None, &effects).await;
    drop(session);
    let done = worker(&store, "ops")
        .operator()
        .cancel(&id, "stop it")
        .await
        .expect("cancel");
    assert_eq!(
        done[0].effect,
        CancelEffect::Requested,
        "the lease had not run out"
    );
    release_dead_lease(&store, &id).await;
    let next = worker(&store, "next").resume::<Message>(&id).await;
    assert!(
        matches!(next, Err(DurableError::Cancelled { .. })),
        "the next worker ends it: {next:?}"
    );
    let record = store.session(&id).await.expect("session");
    assert_eq!(record.status, SessionStatus::Cancelled);
    assert_eq!(
        effects.load(Ordering::SeqCst),
        1,
        "the email was not sent again"
    );
    let doubt = store.in_doubt(Some(&id)).await.expect("in doubt");
    assert_eq!(doubt.len(), 1, "the in-doubt call stays for an operator");
}

/// A cancellation committed while a worker holds the session, before it hears of it:
/// the store refuses to issue a call in doubt again (a keyed re-run) and to issue an
/// approved call, so neither effect starts; the rows stay as they were (in doubt for an
/// operator, approved), and the session ends `cancelled`.
pub async fn cancel_committed_reruns_nothing_and_runs_no_approved_call(
    store: Arc<dyn CheckpointStore>,
) {
    let runner = |tag: &str| {
        Durable::builder(Arc::clone(&store))
            .owner(owner(tag))
            .app_version("v1")
            .renew_leases(false)
            .build()
    };
    let ops = worker(&store, "ops").operator();
    let effects = Arc::new(AtomicUsize::new(0));
    let body = |effects: &Arc<AtomicUsize>| {
        let effects = Arc::clone(effects);
        move |_: durable_core::ToolContext| {
            effects.fetch_add(1, Ordering::SeqCst);
            async move { Ok::<Value, String>(json!("done")) }
        }
    };

    // A keyed call in doubt, its worker dead; the next worker holds the session.
    let session = runner("first")
        .start::<Message>(StartOptions::new())
        .await
        .expect("start");
    let id = session.id().clone();
    let charge = spec("charge", ReplayClass::IdempotentWithKey);
    call_and_die(&session, &charge, 1, Some("order-1"), &effects).await;
    drop(session);
    release_dead_lease(&store, &id).await;
    let rerun = runner("second")
        .resume::<Message>(&id)
        .await
        .expect("resume")
        .session;
    let cancelled = ops.cancel(&id, "customer withdrew").await.expect("cancel");
    assert_eq!(cancelled[0].effect, CancelEffect::Requested);
    let again = rerun
        .journal()
        .tool(&charge, json!({ "n": 1 }))
        .key("order-1")
        .run(body(&effects))
        .await;
    assert!(
        matches!(
            again,
            Err(CallError::Durable(DurableError::Cancelled { .. }))
        ),
        "the re-run is refused: {again:?}"
    );
    assert_eq!(
        effects.load(Ordering::SeqCst),
        1,
        "the call did not run again"
    );
    let rows = store.calls(&id, None).await.expect("journal");
    assert_eq!(rows.len(), 1);
    assert_eq!(
        rows[0].status,
        CallStatus::Issued,
        "left in doubt for an operator"
    );
    assert_eq!(
        store.session(&id).await.expect("session").status,
        SessionStatus::Cancelled
    );

    // An approved call, the session taken again: cancelled before it runs.
    let approvals = runner("third");
    let session = approvals
        .start::<Message>(StartOptions::new())
        .await
        .expect("start");
    let id = session.id().clone();
    let wire = spec("wire", ReplayClass::UnsafeOnReplay);
    let request = || durable_core::store::ApprovalRequest {
        asked_by: "policy".into(),
        reasoning: None,
        expires_in: None,
        schema: None,
    };
    let runs = Arc::new(AtomicUsize::new(0));
    let asked = session
        .journal()
        .tool(&wire, json!({ "n": 2 }))
        .require_approval(request())
        .run(body(&runs))
        .await;
    let call = match asked {
        Err(CallError::Durable(DurableError::AwaitingApproval { call, .. })) => call,
        other => panic!("the wire waits for a person, got {other:?}"),
    };
    session.await_approval().await.expect("await the decision");
    ops.approve(&call, None, "ops", None)
        .await
        .expect("approve");
    let resumed = approvals
        .resume::<Message>(&id)
        .await
        .expect("resume")
        .session;
    let cancelled = ops.cancel(&id, "customer withdrew").await.expect("cancel");
    assert_eq!(cancelled[0].effect, CancelEffect::Requested);
    let ran = resumed
        .journal()
        .tool(&wire, json!({ "n": 2 }))
        .require_approval(request())
        .run(body(&runs))
        .await;
    assert!(
        matches!(ran, Err(CallError::Durable(DurableError::Cancelled { .. }))),
        "the approved call is refused: {ran:?}"
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "the approved wire never ran"
    );
    assert_eq!(
        store.call(&call).await.expect("row").status,
        CallStatus::Approved,
        "the approval stays on its row"
    );
    assert_eq!(
        store.session(&id).await.expect("session").status,
        SessionStatus::Cancelled
    );
}
