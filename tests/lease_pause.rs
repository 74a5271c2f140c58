//! A worker paused right after its *issued* row committed (a GC pause, `SIGSTOP`, a VM
//! migration: every thread of the process stopped, its lease renewals too) must not run
//! the effect when it wakes: meanwhile its lease ran out, another worker took the session
//! over, found the call in doubt, asked the verify hook and sent the email itself.
//!
//! Found by the fleet simulation (`durable-sim --pause-after-commit`). Worker A runs on a
//! current-thread runtime of its own thread, so that a failpoint sleeping at
//! `after_issued` stops all of it, renewals included.

#![cfg(feature = "sqlite")]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use durable::sqlite::SqliteStore;
use durable::{
    CallError, CheckpointStore, Durable, DurableError, Message, ReplayClass, SessionId,
    StartOptions, StoreError, ToolSpec, Verification,
};
use serde_json::{Value, json};

const TOOL: &str = "paused_email";
const TTL: Duration = Duration::from_millis(400);

type Outbox = Arc<Mutex<Vec<String>>>;

fn email() -> ToolSpec {
    ToolSpec::new(
        TOOL,
        "Send an email.",
        ReplayClass::UnsafeOnReplay,
        json!({"type": "object", "properties": {"to": {"type": "string"}}}),
    )
    .with_verify()
}

/// Sends the email (recorded in `outbox` by the worker that sent it), with a verify hook
/// that reads the outbox.
async fn send(
    session: &durable::Session<Message>,
    outbox: &Outbox,
    worker: &str,
) -> Result<Value, CallError<String>> {
    let (sent, seen) = (Arc::clone(outbox), Arc::clone(outbox));
    let worker = worker.to_owned();
    session
        .journal()
        .tool(&email(), json!({"to": "ann@example.com"}))
        .run_verified(
            move |_ctx| {
                let (sent, worker) = (Arc::clone(&sent), worker.clone());
                async move {
                    sent.lock().expect("outbox").push(worker.clone());
                    Ok::<_, String>(json!({"sent_by": worker}))
                }
            },
            move |_ctx| async move {
                match seen.lock().expect("outbox").first() {
                    Some(by) => Verification::Happened(json!({"sent_by": by})),
                    None => Verification::DidNotHappen,
                }
            },
        )
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_paused_after_issuing_a_call_does_not_run_it_once_its_lease_is_gone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("durable.db");
    let id = SessionId::new("paused-after-issue");
    let outbox: Outbox = Arc::default();
    // Worker A stops (all of it) for 1.5 s right after its issued row committed.
    fail::cfg(format!("durable::after_issued::{TOOL}"), "1*sleep(1500)").expect("failpoint");

    let a = {
        let (path, id, outbox) = (path.clone(), id.clone(), Arc::clone(&outbox));
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async move {
                let store: Arc<dyn CheckpointStore> =
                    Arc::new(SqliteStore::open(&path).await.expect("open"));
                let durable = Durable::builder(store)
                    .owner("worker-a")
                    .lease_ttl(TTL)
                    .build();
                let session = durable
                    .start::<Message>(StartOptions::new().with_id(id))
                    .await
                    .expect("start");
                send(&session, &outbox, "worker-a").await
            })
        })
    };

    // Worker B: once A's row is issued and its lease has run out, it takes the session
    // over and the call is settled there (the hook finds no email: it is sent by B).
    let store: Arc<dyn CheckpointStore> = Arc::new(SqliteStore::open(&path).await.expect("open"));
    let issued = Instant::now();
    loop {
        let rows = match store.issued_calls(&id).await {
            Ok(rows) => rows,
            Err(StoreError::SessionNotFound(_)) => Vec::new(),
            Err(e) => panic!("read: {e}"),
        };
        if !rows.is_empty() {
            break;
        }
        assert!(
            issued.elapsed() < Duration::from_secs(10),
            "A never issued its row"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let b = Durable::builder(Arc::clone(&store))
        .owner("worker-b")
        .lease_ttl(Duration::from_secs(30))
        .build();
    let taken = Instant::now();
    let resumed = loop {
        match b.resume::<Message>(&id).await {
            Ok(resumed) => break resumed,
            Err(DurableError::Store(StoreError::Leased { .. })) => {
                assert!(
                    taken.elapsed() < Duration::from_secs(10),
                    "A's lease never ran out"
                );
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            Err(e) => panic!("resume: {e}"),
        }
    };
    let settled = send(&resumed.session, &outbox, "worker-b")
        .await
        .expect("B settles the call");
    assert_eq!(settled, json!({"sent_by": "worker-b"}));

    // A wakes: its lease is gone, so it must not send.
    let woke = tokio::task::spawn_blocking(move || a.join().expect("worker A"))
        .await
        .expect("join");
    fail::remove(format!("durable::after_issued::{TOOL}"));
    assert_eq!(
        *outbox.lock().expect("outbox"),
        ["worker-b"],
        "the email was sent once, by the worker that held the lease"
    );
    assert!(
        matches!(
            woke,
            Err(CallError::Durable(DurableError::Store(
                StoreError::LeaseLost { .. }
            )))
        ),
        "A is told its lease is gone: {woke:?}"
    );
}
