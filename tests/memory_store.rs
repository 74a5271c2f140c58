//! A turn on the in-process `MemoryStore` (`durable::memory`): a journaled
//! `unsafe_on_replay` call, a crash mid-call, a resume refused as `ReplayUnsafe`, an
//! operator's resolution, and a resume that returns the resolution without running the
//! tool again.
#![cfg(feature = "memory")]

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
    let store: Arc<dyn CheckpointStore> =
        Arc::new(MemoryStore::open(MemoryStoreOptions::new().accept_volatile(true)).expect("open"));
    let pay = ToolSpec::new(
        "pay",
        "Pay an invoice.",
        ReplayClass::UnsafeOnReplay,
        json!({}),
    );
    let runs = Arc::new(AtomicUsize::new(0));

    // A worker starts the turn; the effect runs, and the worker dies before its outcome
    // is recorded (the session is dropped mid-call).
    let session = worker(&store, "worker-1")
        .start::<Message>(StartOptions::default())
        .await
        .expect("start");
    let id = session.id().clone();
    let started = Arc::new(tokio::sync::Notify::new());
    let (counter, signal) = (Arc::clone(&runs), Arc::clone(&started));
    let call = session
        .journal()
        .tool(&pay, json!({"invoice": 7}))
        .run(move |_| {
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
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the effect ran once");

    // The dead worker's lease is let go (as if it expired).
    let record = store.session(&id).await.expect("session");
    let dead = Lease {
        session: id.clone(),
        owner: record.lease_owner.clone().unwrap_or_default(),
        fence: record.fence,
        expires_at: 0,
    };
    store.release_lease(&dead).await.expect("release");

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
