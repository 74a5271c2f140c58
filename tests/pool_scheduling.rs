//! What the worker pool takes, and when, on a SQLite file: a session asleep is resumed
//! once it is due and never before (the pool looks again at its wake-up time, not at its
//! next poll), also by another pool after a restart; a pool leaves sessions of another
//! app version alone; it takes from its queues only; a queue's fleet-wide limit holds
//! across two pools; a second signal stops the pool hard.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use durable::{
    CheckpointStore, Durable, DurableError, Message, Resumed, SessionId, ShutdownSignal,
    StartOptions,
};
use tokio::sync::Notify;

async fn store(dir: &tempfile::TempDir) -> Arc<dyn CheckpointStore> {
    let url = format!("sqlite:{}", dir.path().join("pool.db").display());
    durable::connect(&url).await.expect("open the store")
}

fn task(text: &str) -> StartOptions<Message> {
    StartOptions::new().with_messages(vec![Message::user(text)])
}

/// Resolves once `count` reaches `target`, checking whenever `changed` is notified.
async fn until(count: &AtomicUsize, target: usize, changed: &Notify) {
    loop {
        let notified = changed.notified();
        if count.load(Ordering::SeqCst) >= target {
            return;
        }
        notified.await;
    }
}

const SLEEP: Duration = Duration::from_millis(800);

/// The handler of the sleep cases: the first visit sleeps [`SLEEP`]; the visit after the
/// wake-up records when it came and completes.
#[derive(Clone, Default)]
struct Sleeper {
    visits: Arc<AtomicUsize>,
    woken: Arc<Mutex<Vec<(i64, i64)>>>,
    completed: Arc<AtomicUsize>,
    changed: Arc<Notify>,
}

impl Sleeper {
    async fn handle(self, resumed: Resumed<Message>) -> Result<(), DurableError> {
        let mut session = resumed.session;
        self.visits.fetch_add(1, Ordering::SeqCst);
        match session.woke_from() {
            None => {
                session.push(Message::user("Look again in a moment."));
                session.sleep(SLEEP).await?;
            }
            Some(due) => {
                let now = session.record().lease_renewed_at.expect("taken");
                self.woken.lock().expect("woken").push((due, now));
                session.push(Message::user("Looked again."));
                session.complete().await?;
                self.completed.fetch_add(1, Ordering::SeqCst);
            }
        }
        self.changed.notify_waiters();
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sleeping_session_is_resumed_once_due_and_not_before() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = store(&dir).await;
    let durable = Durable::builder(Arc::clone(&store)).owner("pool").build();
    let id = durable
        .submit(task("check the refund"))
        .await
        .expect("submit");

    let sleeper = Sleeper::default();
    let handler = {
        let sleeper = sleeper.clone();
        move |resumed: Resumed<Message>, _: ShutdownSignal| sleeper.clone().handle(resumed)
    };
    let started = Instant::now();
    let report = durable
        .worker(handler)
        // Far longer than the sleep: only the pool's look at the wake-up time is in time.
        .poll_interval(Duration::from_secs(30))
        .run_until(until(&sleeper.completed, 1, &sleeper.changed))
        .await;
    let elapsed = started.elapsed();
    assert_eq!(report.handled, 2, "once to sleep, once awake: {report:?}");
    assert_eq!(sleeper.visits.load(Ordering::SeqCst), 2);
    let woken = sleeper.woken.lock().expect("woken").clone();
    let [(due, taken)] = woken[..] else {
        panic!("one wake-up expected: {woken:?}")
    };
    assert!(
        taken >= due,
        "resumed at {taken}, before its wake-up time {due}"
    );
    assert!(
        elapsed >= SLEEP && elapsed < SLEEP + Duration::from_secs(2),
        "the wake-up came {elapsed:?} after the start, for a sleep of {SLEEP:?}"
    );
    let record = store.session(&id).await.expect("session");
    assert_eq!(record.recovery_attempts, 0, "a wake-up is not a recovery");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sleep_outlives_the_pool_that_began_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = store(&dir).await;
    let first = Durable::builder(Arc::clone(&store)).owner("pool-a").build();
    let ids: Vec<SessionId> = {
        let mut ids = Vec::new();
        for i in 0..3 {
            ids.push(
                first
                    .submit(task(&format!("task {i}")))
                    .await
                    .expect("submit"),
            );
        }
        ids
    };
    // Pool A puts every session to sleep, then stops before any is due.
    let sleeper = Sleeper::default();
    let handler = {
        let sleeper = sleeper.clone();
        move |resumed: Resumed<Message>, _: ShutdownSignal| sleeper.clone().handle(resumed)
    };
    let report = first
        .worker(handler)
        .concurrency(3)
        .poll_interval(Duration::from_millis(50))
        .run_until(until(&sleeper.visits, 3, &sleeper.changed))
        .await;
    assert_eq!(report.handled, 3, "{report:?}");
    let queues = store.queues().await.expect("queues");
    assert_eq!(queues.len(), 1, "{queues:?}");
    assert_eq!(
        (queues[0].sleeping, queues[0].running),
        (3, 0),
        "{queues:?}"
    );

    // Pool B, a new process's worth of runtime, wakes each of them once.
    let second = Durable::builder(Arc::clone(&store)).owner("pool-b").build();
    let after = Sleeper::default();
    let handler = {
        let after = after.clone();
        move |resumed: Resumed<Message>, _: ShutdownSignal| after.clone().handle(resumed)
    };
    let report = second
        .worker(handler)
        .concurrency(3)
        .poll_interval(Duration::from_secs(30))
        .run_until(until(&after.completed, 3, &after.changed))
        .await;
    assert_eq!(report.handled, 3, "each sleeper woken once: {report:?}");
    assert_eq!(after.visits.load(Ordering::SeqCst), 3);
    for id in &ids {
        let record = store.session(id).await.expect("session");
        assert_eq!(record.status, durable::store::SessionStatus::Completed);
        assert_eq!(record.wake_at, None, "the last checkpoint cleared it");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pool_leaves_sessions_of_another_app_version_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = store(&dir).await;
    let v2 = Durable::builder(Arc::clone(&store))
        .owner("submitter")
        .app_version("v2")
        .build();
    let id = v2.submit(task("for v2")).await.expect("submit");
    let fence = store.session(&id).await.expect("session").fence;

    let v1 = Durable::builder(Arc::clone(&store))
        .owner("pool-v1")
        .app_version("v1")
        .build();
    let handled = Arc::new(AtomicUsize::new(0));
    let report = v1
        .worker({
            let handled = Arc::clone(&handled);
            move |_resumed: Resumed<Message>, _: ShutdownSignal| {
                handled.fetch_add(1, Ordering::SeqCst);
                async { Ok(()) }
            }
        })
        .poll_interval(Duration::from_millis(10))
        .run_until(tokio::time::sleep(Duration::from_millis(400)))
        .await;
    // Claimed, found to be v2's, handed back, claimed again …: what the pool did before
    // claims kept to their app version.
    assert_eq!(report.handled + report.failed, 0, "{report:?}");
    assert_eq!(handled.load(Ordering::SeqCst), 0);
    let record = store.session(&id).await.expect("session");
    assert_eq!(record.fence, fence, "the v2 session was never taken");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_takes_from_its_queues_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = store(&dir).await;
    let durable = Durable::builder(Arc::clone(&store)).owner("pool").build();
    let mut email = Vec::new();
    for i in 0..2 {
        email.push(
            durable
                .submit(task(&format!("mail {i}")).with_queue("email"))
                .await
                .expect("submit"),
        );
        durable
            .submit(task(&format!("other {i}")))
            .await
            .expect("submit");
    }
    let seen = Arc::new(Mutex::new(Vec::new()));
    let done = Arc::new(AtomicUsize::new(0));
    let changed = Arc::new(Notify::new());
    let handler = {
        let (seen, done, changed) = (Arc::clone(&seen), Arc::clone(&done), Arc::clone(&changed));
        move |resumed: Resumed<Message>, _: ShutdownSignal| {
            let (seen, done, changed) =
                (Arc::clone(&seen), Arc::clone(&done), Arc::clone(&changed));
            async move {
                seen.lock()
                    .expect("seen")
                    .push(resumed.session.id().clone());
                resumed.session.complete().await?;
                done.fetch_add(1, Ordering::SeqCst);
                changed.notify_waiters();
                Ok(())
            }
        }
    };
    let report = durable
        .worker(handler)
        .queues(["email"])
        .poll_interval(Duration::from_millis(20))
        .run_until(async {
            until(&done, 2, &changed).await;
            // Time to take a third, if it would.
            tokio::time::sleep(Duration::from_millis(200)).await;
        })
        .await;
    assert_eq!(report.handled, 2, "{report:?}");
    let mut seen = seen.lock().expect("seen").clone();
    seen.sort();
    email.sort();
    assert_eq!(seen, email);
    let queues = store.queues().await.expect("queues");
    let default = queues
        .iter()
        .find(|q| q.name == "default")
        .expect("default");
    assert_eq!(
        default.ready, 2,
        "the other queue's sessions wait: {queues:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_limit_holds_across_two_pools() {
    const SESSIONS: usize = 8;
    const LIMIT: usize = 2;
    let dir = tempfile::tempdir().expect("tempdir");
    let store = store(&dir).await;
    let admin = Durable::builder(Arc::clone(&store)).owner("admin").build();
    admin
        .operator()
        .set_queue_limit("scarce", Some(LIMIT as u32))
        .await
        .expect("limit");
    for i in 0..SESSIONS {
        admin
            .submit(task(&format!("t{i}")).with_queue("scarce"))
            .await
            .expect("submit");
    }
    let in_flight = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let changed = Arc::new(Notify::new());
    let pool = |owner: &str| {
        let durable = Durable::builder(Arc::clone(&store)).owner(owner).build();
        let handler_state = (
            Arc::clone(&in_flight),
            Arc::clone(&most),
            Arc::clone(&done),
            Arc::clone(&changed),
        );
        let handler = move |resumed: Resumed<Message>, _: ShutdownSignal| {
            let (in_flight, most, done, changed) = (
                Arc::clone(&handler_state.0),
                Arc::clone(&handler_state.1),
                Arc::clone(&handler_state.2),
                Arc::clone(&handler_state.3),
            );
            async move {
                let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(120)).await;
                in_flight.fetch_sub(1, Ordering::SeqCst);
                resumed.session.complete().await?;
                done.fetch_add(1, Ordering::SeqCst);
                changed.notify_waiters();
                Ok(())
            }
        };
        let (done, changed) = (Arc::clone(&done), Arc::clone(&changed));
        async move {
            durable
                .worker(handler)
                .concurrency(4)
                .poll_interval(Duration::from_millis(20))
                .run_until(async move { until(&done, SESSIONS, &changed).await })
                .await
        }
    };
    // Sample the store while both pools run: never more than the limit leased.
    let sampling = {
        let store = Arc::clone(&store);
        let done = Arc::clone(&done);
        tokio::spawn(async move {
            let mut most = 0;
            while done.load(Ordering::SeqCst) < SESSIONS {
                let queues = store.queues().await.expect("queues");
                if let Some(q) = queues.iter().find(|q| q.name == "scarce") {
                    most = most.max(q.running);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            most
        })
    };
    let (a, b) = tokio::join!(pool("pool-a"), pool("pool-b"));
    assert_eq!(a.handled + b.handled, SESSIONS, "{a:?} {b:?}");
    assert_eq!(
        most.load(Ordering::SeqCst),
        LIMIT,
        "handlers running at once, across both pools"
    );
    let sampled = sampling.await.expect("sampler");
    assert!(
        sampled <= LIMIT as i64,
        "the store counted {sampled} running"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_stops_the_pool_hard() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = store(&dir).await;
    let durable = Durable::builder(Arc::clone(&store)).owner("pool").build();
    let id = durable.submit(task("stuck")).await.expect("submit");
    let entered = Arc::new(Notify::new());
    let first = Arc::new(Notify::new());
    let second = Arc::new(Notify::new());
    let handler = {
        let entered = Arc::clone(&entered);
        move |_resumed: Resumed<Message>, _: ShutdownSignal| {
            let entered = Arc::clone(&entered);
            async move {
                entered.notify_one();
                // Ignores the shutdown signal.
                tokio::time::sleep(Duration::from_secs(3600)).await;
                Ok(())
            }
        }
    };
    let signals = {
        let (entered, first, second) = (
            Arc::clone(&entered),
            Arc::clone(&first),
            Arc::clone(&second),
        );
        tokio::spawn(async move {
            entered.notified().await;
            first.notify_one();
            tokio::time::sleep(Duration::from_millis(100)).await;
            second.notify_one();
        })
    };
    let started = Instant::now();
    // Spawned: the pool's future is `Send`.
    let report = tokio::spawn(
        durable
            .worker(handler)
            .poll_interval(Duration::from_millis(20))
            .shutdown_deadline(Duration::from_secs(600))
            .hard_stop({
                let second = Arc::clone(&second);
                async move { second.notified().await }
            })
            .run_until(async move { first.notified().await }),
    )
    .await
    .expect("the pool task");
    signals.await.expect("signals");
    assert_eq!(report.aborted_sessions, vec![id], "{report:?}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the second signal did not cut the 600 s deadline short: {:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_that_cannot_be_resumed_does_not_hold_the_pool_up() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = store(&dir).await;
    let ttl = Duration::from_secs(30);
    // Submitted with messages of another type: a string is not a `Message`.
    let other = Durable::builder(Arc::clone(&store))
        .owner("submitter")
        .lease_ttl(ttl)
        .build();
    let bad = other
        .submit(
            StartOptions::<serde_json::Value>::new()
                .with_messages(vec![serde_json::json!("not a message")]),
        )
        .await
        .expect("submit");
    let good = other.submit(task("fine")).await.expect("submit");

    let durable = Durable::builder(Arc::clone(&store))
        .owner("pool")
        .lease_ttl(ttl)
        .build();
    let handled = Arc::new(Mutex::new(Vec::new()));
    let report = durable
        .worker({
            let handled = Arc::clone(&handled);
            move |resumed: Resumed<Message>, _: ShutdownSignal| {
                let handled = Arc::clone(&handled);
                async move {
                    handled
                        .lock()
                        .expect("handled")
                        .push(resumed.session.id().clone());
                    resumed.session.complete().await?;
                    Ok(())
                }
            }
        })
        .concurrency(2)
        .poll_interval(Duration::from_millis(50))
        .run_until(tokio::time::sleep(Duration::from_millis(800)))
        .await;
    // The bad session was claimed once, failed to resume, and kept its lease (to expire
    // and count a recovery), so the pool went on to the good one, once.
    assert_eq!(*handled.lock().expect("handled"), vec![good]);
    assert_eq!(
        report.failed, 1,
        "one failed claim, not a loop of them: {report:?}"
    );
    let record = store.session(&bad).await.expect("session");
    assert_eq!(record.lease_owner.as_deref(), Some("pool"), "{record:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn woke_from_tells_a_sleep_from_a_delayed_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = store(&dir).await;
    let durable = Durable::builder(Arc::clone(&store)).owner("w").build();
    // A delayed start (already due) is not a sleep.
    let past = store.now().await.expect("now") - 1_000;
    let id = durable
        .submit(task("later").with_not_before(past))
        .await
        .expect("submit");
    let resumed = durable
        .recover_next::<Message>()
        .await
        .expect("claim")
        .expect("the delayed session is due");
    assert_eq!(resumed.session.id(), &id);
    assert_eq!(
        resumed.session.woke_from(),
        None,
        "a start is not a wake-up"
    );
    // Asleep for an hour, resumed by id at once: the sleep is over all the same.
    resumed
        .session
        .sleep(Duration::from_secs(3600))
        .await
        .expect("sleep");
    let due = store.session(&id).await.expect("session").wake_at;
    assert!(
        durable
            .recover_next::<Message>()
            .await
            .expect("claim")
            .is_none(),
        "a pool does not take it before its time"
    );
    let early = durable.resume::<Message>(&id).await.expect("resume by id");
    assert_eq!(
        early.session.woke_from(),
        due,
        "resumed early, out of its sleep"
    );
    let mut session = early.session;
    session.checkpoint().await.expect("checkpoint");
    assert_eq!(session.woke_from(), None, "the next checkpoint moves on");
}
