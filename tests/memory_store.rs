//! A turn on the in-process `MemoryStore` (`durable::memory`): a journaled
//! `unsafe_on_replay` call, a crash mid-call, a resume refused as `ReplayUnsafe`, an
//! operator's resolution, and a resume that returns the resolution without running the
//! tool again.
#![cfg(feature = "memory")]

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use durable::memory::{MemoryStore, MemoryStoreOptions};
use durable::store::{Lease, Resolution};
use durable::{
    CheckpointStore, Durable, DurableError, Message, ReplayClass, StartOptions, ToolSpec,
};
use serde_json::{Value, json};

fn worker(store: &Arc<dyn CheckpointStore>, owner: &str) -> Durable {
    Durable::builder(Arc::clone(store)).owner(owner).build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_unsafe_call_is_resolved_by_an_operator_and_never_runs_twice() {
    let store = memory_store();
    let pay = ToolSpec::new(
        "pay",
        "Pay an invoice.",
        ReplayClass::UnsafeOnReplay,
        json!({}),
    );
    // A worker starts the turn; the effect runs, and the worker dies before its outcome
    // is recorded.
    let (id, runs) = killed_mid_call(&store, &pay, json!({"invoice": 7})).await;
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the effect ran once");

    // A new worker resumes: the call is in doubt and has no verify hook, so it is refused.
    let second = worker(&store, "worker-2");
    let resumed = second.resume::<Message>(&id).await.expect("resume");
    let refused = resumed
        .session
        .journal()
        .tool(&pay, json!({"invoice": 7}))
        .run(|_| async { Ok::<_, String>(json!("paid twice")) })
        .await
        .expect_err("an in-doubt unsafe call is not run again");
    assert!(
        matches!(
            refused,
            durable::CallError::Durable(DurableError::ReplayUnsafe { .. })
        ),
        "refused as ReplayUnsafe: {refused:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "nothing ran on the refusal");
    drop(resumed);

    // An operator checks the provider and records that the payment happened.
    let operator = worker(&store, "operator");
    let doubt = operator
        .operator()
        .in_doubt(Some(&id))
        .await
        .expect("in doubt");
    assert_eq!(doubt.len(), 1, "one call in doubt");
    operator
        .operator()
        .resolve(
            &doubt[0].id,
            Resolution::Happened {
                result: json!({"paid": 7}),
            },
            "ops",
            Some("the provider shows the payment"),
        )
        .await
        .expect("resolve");

    // The next resume returns the resolution as the call's result; the tool does not run.
    let record = store.session(&id).await.expect("session");
    let held = Lease {
        session: id.clone(),
        owner: record.lease_owner.clone().unwrap_or_default(),
        fence: record.fence,
        expires_at: 0,
    };
    store.release_lease(&held).await.expect("release");
    let third = worker(&store, "worker-3");
    let resumed = third
        .resume::<Message>(&id)
        .await
        .expect("resume after resolution");
    let counter = Arc::clone(&runs);
    let result = resumed
        .session
        .journal()
        .tool(&pay, json!({"invoice": 7}))
        .run(move |_| {
            let counter = Arc::clone(&counter);
            async move {
                counter.fetch_add(1, Ordering::SeqCst);
                Ok::<_, String>(json!("paid again"))
            }
        })
        .await
        .expect("the resolved call returns its result");
    assert_eq!(result, json!({"paid": 7}), "the operator's result");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the payment ran exactly once"
    );
}

type CallFuture<'a> =
    std::pin::Pin<Box<dyn Future<Output = Result<Value, durable::CallError<String>>> + Send + 'a>>;

/// A worker starts a session and a call of `spec` with `args`; its effect runs (counted
/// in the returned counter), and the worker dies before the outcome is recorded (the
/// session dropped mid-call, its lease let go as if it expired). The call is in doubt.
async fn killed_mid_call(
    store: &Arc<dyn CheckpointStore>,
    spec: &ToolSpec,
    args: Value,
) -> (durable::SessionId, Arc<AtomicUsize>) {
    let runs = Arc::new(AtomicUsize::new(0));
    let session = worker(store, "worker-1")
        .start::<Message>(StartOptions::default())
        .await
        .expect("start");
    let id = session.id().clone();
    let started = Arc::new(tokio::sync::Notify::new());
    let (counter, signal) = (Arc::clone(&runs), Arc::clone(&started));
    let call = session.journal().tool(spec, args).run(move |_| {
        let (counter, signal) = (Arc::clone(&counter), Arc::clone(&signal));
        async move {
            counter.fetch_add(1, Ordering::SeqCst);
            signal.notify_one();
            std::future::pending::<Result<Value, String>>().await
        }
    });
    tokio::select! {
        done = call => panic!("the hanging tool returned: {done:?}"),
        () = started.notified() => {}
        () = tokio::time::sleep(Duration::from_secs(30)) => panic!("the tool never started"),
    }
    drop(session);
    let record = store.session(&id).await.expect("session");
    let dead = Lease {
        session: id.clone(),
        owner: record.lease_owner.clone().unwrap_or_default(),
        fence: record.fence,
        expires_at: 0,
    };
    store.release_lease(&dead).await.expect("release");
    (id, runs)
}

fn memory_store() -> Arc<dyn CheckpointStore> {
    Arc::new(MemoryStore::open(MemoryStoreOptions::new().accept_volatile(true)).expect("open"))
}

fn tools() -> (ToolSpec, ToolSpec) {
    let email = ToolSpec::new(
        "send_email",
        "Send an email.",
        ReplayClass::UnsafeOnReplay,
        json!({}),
    )
    .with_verify();
    let charge = ToolSpec::new(
        "charge",
        "Charge a card.",
        ReplayClass::UnsafeOnReplay,
        json!({}),
    );
    (email, charge)
}

/// The resumed batch, the charge first (polled first, it meets the barrier before the
/// email in doubt was taken up); `found` is the verify hook's answer.
async fn resume_the_batch(
    store: &Arc<dyn CheckpointStore>,
    id: &durable::SessionId,
    (email, charge): &(ToolSpec, ToolSpec),
    emails: &Arc<AtomicUsize>,
    charges: &Arc<AtomicUsize>,
    found: bool,
) -> Vec<Result<Value, durable::CallError<String>>> {
    let resumed = worker(store, "worker-2")
        .resume::<Message>(id)
        .await
        .expect("resume");
    let journal = resumed.session.journal();
    let (charged, sent) = (Arc::clone(charges), Arc::clone(emails));
    let charge: CallFuture<'_> =
        Box::pin(journal.tool(charge, json!({"cents": 1200})).run(move |_| {
            let charged = Arc::clone(&charged);
            async move {
                charged.fetch_add(1, Ordering::SeqCst);
                Ok::<_, String>(json!("charged"))
            }
        }));
    let email: CallFuture<'_> = Box::pin(
        journal
            .tool(email, json!({"to": "ann@example.com"}))
            .run_verified(
                move |_| {
                    let sent = Arc::clone(&sent);
                    async move {
                        sent.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, String>(json!("sent again"))
                    }
                },
                move |_| async move {
                    // Slower than the charge's first poll: the charge waits for it.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    if found {
                        durable::Verification::Happened(json!("found in the outbox"))
                    } else {
                        durable::Verification::Unknown
                    }
                },
            ),
    );
    journal.join_calls([charge, email]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sibling_waits_for_the_call_in_doubt_its_batch_replays() {
    let tools = tools();
    // A reply asked for an email and a charge at once; the worker died after the email
    // went out, before its outcome was recorded and before the charge was issued.
    let store = memory_store();
    let (id, emails) = killed_mid_call(&store, &tools.0, json!({"to": "ann@example.com"})).await;
    let charges = Arc::new(AtomicUsize::new(0));
    let outputs = resume_the_batch(&store, &id, &tools, &emails, &charges, true).await;
    let outputs: Vec<Value> = outputs
        .into_iter()
        .map(|o| o.expect("both calls of the batch succeed"))
        .collect();
    assert_eq!(outputs, [json!("charged"), json!("found in the outbox")]);
    assert_eq!(emails.load(Ordering::SeqCst), 1, "the email went out once");
    assert_eq!(charges.load(Ordering::SeqCst), 1, "the charge ran once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_in_doubt_its_batch_cannot_settle_still_refuses_its_siblings() {
    let tools = tools();
    // A reply asked for an email and a charge at once; the worker died after the email
    // went out, before its outcome was recorded and before the charge was issued.
    let store = memory_store();
    let (id, emails) = killed_mid_call(&store, &tools.0, json!({"to": "ann@example.com"})).await;
    let charges = Arc::new(AtomicUsize::new(0));
    let outputs = resume_the_batch(&store, &id, &tools, &emails, &charges, false).await;
    for output in outputs {
        assert!(
            matches!(
                output,
                Err(durable::CallError::Durable(
                    DurableError::ReplayUnsafe { .. }
                ))
            ),
            "refused as ReplayUnsafe: {output:?}"
        );
    }
    assert_eq!(
        emails.load(Ordering::SeqCst),
        1,
        "the email was not sent again"
    );
    assert_eq!(
        charges.load(Ordering::SeqCst),
        0,
        "nothing ran beside the email in doubt"
    );
}
