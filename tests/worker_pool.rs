//! The worker pool on a SQLite file: the concurrency bound holds, every submitted session
//! is handled exactly once to completion, a graceful shutdown releases its leases (a
//! second worker resumes them at once, counted as no recovery), and a handler that
//! ignores shutdown is aborted at the deadline mid tool call, leaving the call issued (in
//! doubt) and the session recoverable once its lease expires.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use durable::store::{CallStatus, SessionStatus};
use durable::{
    CheckpointStore, Durable, DurableError, Message, Resumed, SessionId, ShutdownSignal,
    StartOptions, StoreError, durable_tool,
};
use tokio::sync::Notify;

static ECHOES: AtomicUsize = AtomicUsize::new(0);
static SLOW_SENDS: AtomicUsize = AtomicUsize::new(0);
static SLOW_STARTED: Notify = Notify::const_new();

/// Echo a text back.
#[durable_tool(replay = "pure")]
async fn echo(
    /// The text.
    text: String,
) -> Result<String, std::io::Error> {
    ECHOES.fetch_add(1, Ordering::SeqCst);
    Ok(text)
}

/// Send something that takes forever (the handler is aborted in the middle of it).
#[durable_tool(replay = "unsafe_on_replay")]
async fn send_slowly(
    /// What to send.
    what: String,
) -> Result<String, std::io::Error> {
    SLOW_SENDS.fetch_add(1, Ordering::SeqCst);
    SLOW_STARTED.notify_one();
    tokio::time::sleep(Duration::from_secs(3600)).await;
    Ok(what)
}

async fn store(dir: &tempfile::TempDir) -> Arc<dyn CheckpointStore> {
    let url = format!("sqlite:{}", dir.path().join("pool.db").display());
    durable::connect(&url).await.expect("open the store")
}

async fn submit(durable: &Durable, n: usize) -> Vec<SessionId> {
    let mut ids = Vec::new();
    for i in 0..n {
        let options =
            StartOptions::<Message>::new().with_messages(vec![Message::user(format!("task {i}"))]);
        ids.push(durable.submit(options).await.expect("submit"));
    }
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_is_bounded_and_every_session_is_handled_once() {
    const SESSIONS: usize = 12;
    const CONCURRENCY: usize = 3;
    let dir = tempfile::tempdir().expect("tempdir");
    let store = store(&dir).await;
    let durable = Durable::builder(Arc::clone(&store)).owner("pool-a").build();
    let ids = submit(&durable, SESSIONS).await;

    let in_flight = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(Mutex::new(HashMap::<SessionId, usize>::new()));
    let done = Arc::new(AtomicUsize::new(0));
    let all_done = Arc::new(Notify::new());
    let handler = {
        let (in_flight, most, seen, done, all_done) = (
            Arc::clone(&in_flight),
            Arc::clone(&most),
            Arc::clone(&seen),
            Arc::clone(&done),
            Arc::clone(&all_done),
        );
        move |resumed: Resumed<Message>, _shutdown: ShutdownSignal| {
            let (in_flight, most, seen, done, all_done) = (
                Arc::clone(&in_flight),
                Arc::clone(&most),
                Arc::clone(&seen),
                Arc::clone(&done),
                Arc::clone(&all_done),
            );
            async move {
                let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                let mut session = resumed.session;
                *seen
                    .lock()
                    .expect("lock")
                    .entry(session.id().clone())
                    .or_default() += 1;
                tokio::time::sleep(Duration::from_millis(40)).await;
                let text = echo
                    .call(session.journal(), session.id().to_string())
                    .await
                    .expect("echo");
                session.push(Message::user(text));
                session.checkpoint().await?;
                in_flight.fetch_sub(1, Ordering::SeqCst);
                session.complete().await?;
                if done.fetch_add(1, Ordering::SeqCst) + 1 == SESSIONS {
                    all_done.notify_one();
                }
                Ok::<(), DurableError>(())
            }
        }
    };
    let report = durable
        .worker(handler)
        .concurrency(CONCURRENCY)
        .poll_interval(Duration::from_millis(20))
        .shutdown_deadline(Duration::from_secs(5))
        .run_until(async move { all_done.notified().await })
        .await;

    assert_eq!(
        most.load(Ordering::SeqCst),
        CONCURRENCY,
        "the bound is reached, never exceeded"
    );
    assert_eq!(report.handled, SESSIONS, "{report:?}");
    assert_eq!(report.succeeded, SESSIONS, "{report:?}");
    assert_eq!((report.failed, report.panicked, report.aborted), (0, 0, 0));
    let seen = seen.lock().expect("lock").clone();
    for id in &ids {
        assert_eq!(seen.get(id), Some(&1), "{id} handled exactly once");
        let record = store.session(id).await.expect("session");
        assert_eq!(record.status, SessionStatus::Completed, "{id}");
        assert_eq!(
            record.recovery_attempts, 0,
            "{id}: a submitted session is no recovery"
        );
    }
    assert_eq!(seen.len(), SESSIONS);
    assert!(ECHOES.load(Ordering::SeqCst) >= SESSIONS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_releases_leases_and_a_second_pool_continues_at_once() {
    const SESSIONS: usize = 4;
    let dir = tempfile::tempdir().expect("tempdir");
    let store = store(&dir).await;
    // A long lease: a session not released would keep the second pool waiting a minute.
    let first = Durable::builder(Arc::clone(&store))
        .owner("pool-a")
        .lease_ttl(Duration::from_secs(60))
        .build();
    let ids = submit(&first, SESSIONS).await;

    // Handlers that never finish on their own: a turn every 20 ms, releasing at the first
    // safe point after shutdown.
    let started = Arc::new(AtomicUsize::new(0));
    let two_started = Arc::new(Notify::new());
    let handler = {
        let (started, two_started) = (Arc::clone(&started), Arc::clone(&two_started));
        move |resumed: Resumed<Message>, shutdown: ShutdownSignal| {
            let (started, two_started) = (Arc::clone(&started), Arc::clone(&two_started));
            async move {
                if started.fetch_add(1, Ordering::SeqCst) + 1 == 2 {
                    two_started.notify_one();
                }
                let mut session = resumed.session;
                loop {
                    session.push(Message::user("one more turn"));
                    session.checkpoint().await?;
                    if shutdown.is_shutting_down() {
                        return session.release().await;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
    };
    let stopping = Arc::new(Mutex::new(None::<Instant>));
    let report = first
        .worker(handler)
        .concurrency(2)
        .poll_interval(Duration::from_millis(20))
        .shutdown_deadline(Duration::from_secs(10))
        .run_until({
            let stopping = Arc::clone(&stopping);
            async move {
                two_started.notified().await;
                tokio::time::sleep(Duration::from_millis(100)).await;
                *stopping.lock().expect("lock") = Some(Instant::now());
            }
        })
        .await;
    let released = Instant::now();
    let stop_took = released - stopping.lock().expect("lock").expect("shutdown resolved");
    assert_eq!(report.handled, 2, "{report:?}");
    assert_eq!(report.succeeded, 2, "{report:?}");
    assert_eq!(report.aborted, 0, "{report:?}");
    assert!(
        stop_took < Duration::from_secs(2),
        "graceful stop took {stop_took:?}"
    );

    for id in &ids {
        let record = store.session(id).await.expect("session");
        assert_eq!(record.status, SessionStatus::Active, "{id}");
        assert_eq!(record.lease_owner, None, "{id}: lease released");
    }
    // Another worker resumes each at once, and none of it is a recovery.
    let second = Durable::builder(Arc::clone(&store))
        .owner("pool-b")
        .lease_ttl(Duration::from_secs(60))
        .build();
    for id in &ids {
        let resumed = second.resume::<Message>(id).await.expect("resumed at once");
        assert!(resumed.report.in_doubt.is_empty());
        resumed.session.release().await.expect("release");
        assert_eq!(
            store.session(id).await.expect("session").recovery_attempts,
            0
        );
    }

    // A second pool finishes them all, claiming the first one right away.
    let first_claim = Arc::new(Mutex::new(None::<Instant>));
    let done = Arc::new(AtomicUsize::new(0));
    let all_done = Arc::new(Notify::new());
    let handoff_start = Instant::now();
    let report = second
        .worker({
            let (first_claim, done, all_done) = (
                Arc::clone(&first_claim),
                Arc::clone(&done),
                Arc::clone(&all_done),
            );
            move |resumed: Resumed<Message>, _shutdown: ShutdownSignal| {
                let (first_claim, done, all_done) = (
                    Arc::clone(&first_claim),
                    Arc::clone(&done),
                    Arc::clone(&all_done),
                );
                async move {
                    first_claim
                        .lock()
                        .expect("lock")
                        .get_or_insert_with(Instant::now);
                    resumed.session.complete().await?;
                    if done.fetch_add(1, Ordering::SeqCst) + 1 == SESSIONS {
                        all_done.notify_one();
                    }
                    Ok(())
                }
            }
        })
        .concurrency(2)
        .poll_interval(Duration::from_secs(5))
        .run_until(async move { all_done.notified().await })
        .await;
    let handoff = first_claim.lock().expect("lock").expect("claimed") - handoff_start;
    assert_eq!(report.succeeded, SESSIONS, "{report:?}");
    assert!(
        handoff < Duration::from_millis(500),
        "handoff took {handoff:?}"
    );
    for id in &ids {
        let record = store.session(id).await.expect("session");
        assert_eq!(record.status, SessionStatus::Completed, "{id}");
        assert_eq!(record.recovery_attempts, 0, "{id}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_ignoring_shutdown_is_aborted_at_the_deadline_mid_call() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = store(&dir).await;
    let ttl = Duration::from_millis(1500);
    let first = Durable::builder(Arc::clone(&store))
        .owner("pool-a")
        .lease_ttl(ttl)
        .build();
    let ids = submit(&first, 1).await;
    let id = ids[0].clone();

    let report = first
        .worker(
            |resumed: Resumed<Message>, _shutdown: ShutdownSignal| async move {
                let session = resumed.session;
                // Never looks at the signal.
                let sent = send_slowly
                    .call(session.journal(), "a letter".into())
                    .await
                    .expect("sent");
                unreachable!("the call never returns: {sent}")
            },
        )
        .poll_interval(Duration::from_millis(20))
        .shutdown_deadline(Duration::from_millis(200))
        .run_until(SLOW_STARTED.notified())
        .await;
    assert_eq!(report.handled, 1, "{report:?}");
    assert_eq!(report.aborted, 1, "{report:?}");
    assert_eq!(report.aborted_sessions, vec![id.clone()]);
    assert_eq!(SLOW_SENDS.load(Ordering::SeqCst), 1);

    // The lease was not released: another worker waits for it to expire.
    let record = store.session(&id).await.expect("session");
    assert_eq!(record.lease_owner.as_deref(), Some("pool-a"));
    let second = Durable::builder(Arc::clone(&store))
        .owner("pool-b")
        .lease_ttl(ttl)
        .build();
    match second.resume::<Message>(&id).await {
        Err(DurableError::Store(StoreError::Leased { .. })) => {}
        other => panic!("expected Leased, got {other:?}"),
    }
    // After the TTL it is recovered, the interrupted call issued: in doubt, not recorded.
    let started = Instant::now();
    let resumed = loop {
        if let Some(resumed) = second.recover_next::<Message>().await.expect("recover") {
            break resumed;
        }
        assert!(
            started.elapsed() < ttl * 4,
            "not recoverable after the lease TTL"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(resumed.session.id(), &id);
    assert_eq!(resumed.report.in_doubt.len(), 1);
    let call = &resumed.report.in_doubt[0].call;
    assert_eq!(call.identity.tool, "send_slowly");
    assert_eq!(call.status, CallStatus::Issued);
    assert_eq!(
        store.session(&id).await.expect("session").recovery_attempts,
        1
    );
    assert_eq!(SLOW_SENDS.load(Ordering::SeqCst), 1, "nothing ran twice");
}

/// Charge a card (the runtime's policy makes a person approve every charge first).
#[durable_tool(replay = "unsafe_on_replay")]
async fn charge(
    /// Cents.
    cents: u64,
) -> Result<String, std::io::Error> {
    CHARGES.fetch_add(1, Ordering::SeqCst);
    Ok(format!("charged {cents}"))
}

static CHARGES: AtomicUsize = AtomicUsize::new(0);

/// A session parked on an approval request with a deadline nobody meets: the pool,
/// having nothing to claim, expires the request once its deadline passes; the session is
/// active again, the pool claims it, and its handler reads the denial; the charge never
/// runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pool_expires_requests_past_their_deadline() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = store(&dir).await;
    let durable = Durable::builder(Arc::clone(&store))
        .owner("pool-approvals")
        .approval_policy(|tool, _| {
            (tool.name == "charge").then(|| {
                use durable::approval::RequestExt;
                durable::approval::request("policy").with_deadline(Duration::from_millis(300))
            })
        })
        .build();
    let session = durable
        .start::<Message>(StartOptions::new())
        .await
        .expect("start");
    let id = session.id().clone();
    let asked = charge.call(session.journal(), 500).await;
    assert!(
        matches!(&asked, Err(durable::CallError::Durable(e)) if e.is_awaiting_approval()),
        "{asked:?}"
    );
    session.await_approval().await.expect("park");

    let outcome: Arc<Mutex<Option<String>>> = Arc::default();
    let done = Arc::new(Notify::new());
    let handler = {
        let (outcome, done) = (Arc::clone(&outcome), Arc::clone(&done));
        move |resumed: Resumed<Message>, _signal: ShutdownSignal| {
            let (outcome, done) = (Arc::clone(&outcome), Arc::clone(&done));
            async move {
                let session = resumed.session;
                let result = charge.call(session.journal(), 500).await;
                *outcome.lock().expect("lock") = Some(match result {
                    Ok(v) => format!("ran: {v}"),
                    Err(e) => e.to_string(),
                });
                session.complete().await?;
                done.notify_one();
                Ok::<(), DurableError>(())
            }
        }
    };
    let report = durable
        .worker(handler)
        .poll_interval(Duration::from_millis(50))
        .run_until(async {
            tokio::time::timeout(Duration::from_secs(30), done.notified())
                .await
                .expect("the session was handled");
        })
        .await;
    assert_eq!(report.expired_approvals, 1, "{report:?}");
    assert_eq!(report.handled, 1, "{report:?}");
    let read = outcome.lock().expect("lock").clone().expect("handled");
    assert!(read.contains("expired"), "{read}");
    assert_eq!(CHARGES.load(Ordering::SeqCst), 0, "the charge never ran");
    assert_eq!(
        store.session(&id).await.expect("session").status,
        SessionStatus::Completed
    );
}

/// An idle pool polling every 30 s starts a session submitted in its own process at once:
/// the store tells its pools when a write makes work available.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_pool_starts_a_submitted_session_at_once() {
    const POLL: Duration = Duration::from_secs(30);
    let dir = tempfile::tempdir().expect("tempdir");
    let store = store(&dir).await;
    let durable = Durable::builder(Arc::clone(&store))
        .owner("pool-idle")
        .build();
    let (started, mut starts) = tokio::sync::mpsc::unbounded_channel();
    let handler = move |resumed: Resumed<Message>, _signal: ShutdownSignal| {
        let at = Instant::now();
        let started = started.clone();
        async move {
            let _ = started.send((resumed.session.id().clone(), at));
            resumed.session.complete().await.map(|_| ())
        }
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    // In this task beside the submits: `run_until`'s future is not `Send`.
    let pool = durable
        .worker(handler)
        .poll_interval(POLL)
        .run_until(async {
            let _ = stopped.await;
        });
    let submits = async {
        // Its first claim found nothing: it waits.
        tokio::time::sleep(Duration::from_millis(300)).await;
        for n in 0..3 {
            let id = durable
                .submit(
                    StartOptions::<Message>::new()
                        .with_messages(vec![Message::user(format!("task {n}"))]),
                )
                .await
                .expect("submit");
            let submitted = Instant::now();
            let (handled, at) = tokio::time::timeout(POLL + Duration::from_secs(5), starts.recv())
                .await
                .expect("started within the poll interval")
                .expect("the pool runs");
            assert_eq!(handled, id);
            let after = at.saturating_duration_since(submitted);
            assert!(
                after < Duration::from_secs(1),
                "submit {n}: the idle pool started the session {after:?} after it was submitted \
             (it polls every {POLL:?}): it was not notified"
            );
            // Idle again before the next submit.
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let _ = stop.send(());
    };
    let (report, ()) = tokio::join!(pool, submits);
    assert_eq!(report.handled, 3, "{report:?}");
    assert_eq!(report.succeeded, 3, "{report:?}");
}
