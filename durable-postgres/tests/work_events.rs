//! Idle worker pools woken by other processes' writes (`LISTEN`/`NOTIFY`): a
//! pool on one store, the writes on a second store of the same database (another
//! connection pool, another notifier: as another process would be), the pool's poll
//! interval 30 s. Each case asserts that the handler starts within a second of the write,
//! which only a notification can do. Also: the listener's connection goes away with the
//! last clone of its store, and comes back after the server restarts.

use durable_core::store::{ApprovalStore, QueueStore, SessionStore};
use std::sync::Arc;
use std::time::{Duration, Instant};

use durable_core::store::{
    ApprovalDecision, ApprovalRequest, CallIdentity, CallKind, DecideApproval, IssueOutcome,
    NewCall, NewCheckpoint, NewSession, SessionStatus,
};
use durable_core::{
    Budget, CallId, Durable, Plan, PoolReport, ReplayClass, Resumed, SessionId, ShutdownSignal,
    StartOptions,
};
use durable_postgres::testing::{TestDatabase, test_database};
use durable_postgres::{PostgresStore, PostgresStoreOptions};
use serde_json::{Value, json};
use sqlx::postgres::PgPool;
use tokio::sync::{mpsc, oneshot};

/// What the pool would wait without a notification.
const POLL: Duration = Duration::from_secs(30);
/// How soon the handler must start after the write.
const WITHIN: Duration = Duration::from_secs(1);

async fn store(db: &TestDatabase) -> PostgresStore {
    PostgresStore::connect_with(PostgresStoreOptions::new(db.url()))
        .await
        .expect("store")
}

/// The pool's handler reports each session it starts and the instant it entered.
type Starts = mpsc::UnboundedReceiver<(SessionId, Instant)>;

/// Runs `test` beside a pool on `store` whose handler reports the session and the instant
/// it was entered, then completes the session. `test` is given the reports once the store
/// listens (the listener's first bump) and the pool has gone idle; the pool stops when
/// `test` returns. (The pool runs in the test's task: `run_until`'s future is not `Send`,
/// so it cannot be spawned.)
async fn with_idle_pool<F, Fut>(store: &PostgresStore, test: F) -> PoolReport
where
    F: FnOnce(Starts) -> Fut,
    Fut: Future<Output = ()>,
{
    // The listener starts with the first subscription and bumps once it listens.
    let mut ready = store.work_events().expect("PostgreSQL has work events");
    // Without a listener this never resolves: the latency assertions then fail.
    let _ = tokio::time::timeout(Duration::from_secs(5), ready.changed()).await;
    let durable = Durable::builder(Arc::new(store.clone()))
        .owner("pool-a")
        .build();
    let (started, starts) = mpsc::unbounded_channel();
    let (stop, stopped) = oneshot::channel::<()>();
    let pool = durable
        .worker(move |resumed: Resumed<Value>, _: ShutdownSignal| {
            let at = Instant::now();
            let started = started.clone();
            async move {
                let _ = started.send((resumed.session.id().clone(), at));
                let done = resumed.session.complete().await.map(|_| ());
                if let Err(e) = &done {
                    eprintln!("handler: {e}");
                }
                done
            }
        })
        .poll_interval(POLL)
        .shutdown_deadline(Duration::from_secs(5))
        .run_until(async move {
            let _ = stopped.await;
        });
    let test = async move {
        // Its first claim found nothing: it waits.
        tokio::time::sleep(Duration::from_millis(500)).await;
        test(starts).await;
        let _ = stop.send(());
    };
    tokio::join!(pool, test).0
}

fn clean(report: &PoolReport) {
    assert_eq!(
        (
            report.handled,
            report.succeeded,
            report.failed,
            report.panicked
        ),
        (1, 1, 0, 0),
        "{report:?}"
    );
}

/// The session the pool started next, and how long after `since` it was entered.
async fn next_start(starts: &mut Starts, since: Instant) -> (SessionId, Duration) {
    let (id, at) = tokio::time::timeout(POLL + Duration::from_secs(5), starts.recv())
        .await
        .expect("the pool started the session within its poll interval")
        .expect("the pool is running");
    (id, at.saturating_duration_since(since))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_submitted_on_another_store_starts_at_once() {
    let db = test_database().await;
    let (a, b) = (store(&db).await, store(&db).await);
    let submitter = Durable::builder(Arc::new(b.clone())).owner("web").build();
    let report = with_idle_pool(&a, |mut starts| async move {
        let id = submitter
            .submit(StartOptions::<Value>::new().with_messages(vec![json!({"task": "refund"})]))
            .await
            .expect("submit");
        let submitted = Instant::now();
        let (started, after) = next_start(&mut starts, submitted).await;
        assert_eq!(started, id);
        assert!(
            after < WITHIN,
            "the idle pool started the session {after:?} after it was submitted on another \
             store (it polls every {POLL:?}): it was not notified"
        );
    })
    .await;
    clean(&report);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_released_on_another_store_is_taken_at_once() {
    let db = test_database().await;
    let (a, b) = (store(&db).await, store(&db).await);
    // Started on B: leased there, so the pool can only take it once B lets go.
    let holder = Durable::builder(Arc::new(b.clone()))
        .owner("holder")
        .build();
    let report = with_idle_pool(&a, |mut starts| async move {
        let session = holder
            .start(StartOptions::<Value>::new().with_messages(vec![json!({"task": "refund"})]))
            .await
            .expect("start");
        let id = session.id().clone();
        // The creation's notification woke the pool for nothing: let it go idle again.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(starts.try_recv().is_err(), "a leased session was taken");
        session.release().await.expect("release");
        let released = Instant::now();
        let (started, after) = next_start(&mut starts, released).await;
        assert_eq!(started, id);
        assert!(
            after < WITHIN,
            "the idle pool took the session {after:?} after its lease was released on \
             another store (it polls every {POLL:?}): it was not notified"
        );
    })
    .await;
    clean(&report);
}

fn checkpoint() -> NewCheckpoint {
    NewCheckpoint {
        messages: vec![json!({"task": "pay the invoice"})],
        plan: serde_json::to_value(Plan::default()).expect("plan"),
        budget: serde_json::to_value(Budget::default()).expect("budget"),
        state: Value::Null,
        wake_at: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_decided_on_another_store_resumes_the_session_at_once() {
    let db = test_database().await;
    let (a, b) = (store(&db).await, store(&db).await);
    let report = with_idle_pool(&a, |mut starts| async move {
        // A session waiting for a person, written through B (app version "0": the pool's).
        let id = SessionId::new("waits-for-alice");
        let (_, lease) = b
            .create_session(NewSession {
                id: id.clone(),
                app_version: "0".into(),
                metadata: json!({}),
                owner: "holder".into(),
                lease_ttl: Duration::from_secs(600),
                initial: checkpoint(),
                queue: None,
            })
            .await
            .expect("create");
        let call = NewCall {
            id: CallId::random(),
            kind: CallKind::Tool,
            identity: CallIdentity {
                session: id.clone(),
                step: 0,
                tool: "pay".into(),
                input_hash: "h-pay".into(),
                ordinal: 0,
            },
            class: ReplayClass::UnsafeOnReplay,
            args: json!({"amount": 10}),
            idempotency_key: None,
            schema_hash: "schema:1".into(),
        };
        let requested = match b
            .request_call(
                lease.fence(),
                call,
                ApprovalRequest {
                    asked_by: "pay: approval required".into(),
                    reasoning: None,
                    expires_in: None,
                    schema: None,
                },
            )
            .await
            .expect("request")
        {
            IssueOutcome::Inserted(row) => row.id,
            IssueOutcome::Existing(row) => panic!("a new row, got {row:?}"),
        };
        b.set_status(lease.fence(), SessionStatus::AwaitingApproval, Some("pay"))
            .await
            .expect("await approval");
        // Those writes woke the pool for nothing: let it go idle again.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(
            starts.try_recv().is_err(),
            "a session awaiting approval was taken"
        );

        b.decide_approval(DecideApproval {
            call: requested,
            decision: ApprovalDecision::Approve { args: None },
            by: "alice".into(),
            note: None,
        })
        .await
        .expect("approve");
        let decided = Instant::now();
        let (started, after) = next_start(&mut starts, decided).await;
        assert_eq!(started, id);
        assert!(
            after < WITHIN,
            "the idle pool resumed the session {after:?} after its approval was decided on \
         another store (it polls every {POLL:?}): it was not notified"
        );
    })
    .await;
    // Started is what counts here: the handler's checkpoint without re-running the
    // approved call is refused (`ReplayDiverged`), which the pool counts as failed.
    assert_eq!((report.handled, report.panicked), (1, 0), "{report:?}");
}

/// The backends with `LISTEN "durable_work"` as their last statement on `db`.
/// Connections whose last statement was the store's `LISTEN`. sqlx sends it as
/// `LISTEN "durable_work"` on the first connection and as `LISTEN "durable_work";` when
/// `PgListener` reconnects by itself (which of the two happens after a server restart
/// depends on whether the server is back by the time the lost connection is noticed).
async fn listeners(admin: &PgPool, db: &TestDatabase) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity \
         WHERE datname = $1 AND rtrim(query, ';') = 'LISTEN \"durable_work\"'",
    )
    .bind(db.name())
    .fetch_one(admin)
    .await
    .expect("pg_stat_activity")
}

async fn until_listeners(admin: &PgPool, db: &TestDatabase, want: i64) {
    // Generous: after a server restart on a loaded machine, the listener's next attempt
    // comes up to a backoff (1 s) after the server is back.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let found = listeners(admin, db).await;
        if found == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{found} listening connections, expected {want}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One listening connection per store however many clones subscribe, none for a
/// read-only store or one opened with `listen(false)`, and gone with the last clone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_listener_per_store_gone_with_its_last_clone() {
    let db = test_database().await;
    let admin = PgPool::connect(db.url()).await.expect("admin pool");
    let store = store(&db).await;
    let clone = store.clone();
    let mut first = store.work_events().expect("events");
    let _second = clone.work_events().expect("events");
    tokio::time::timeout(Duration::from_secs(5), first.changed())
        .await
        .expect("the listener bumps once it listens");
    until_listeners(&admin, &db, 1).await;

    let quiet = PostgresStore::connect_with(PostgresStoreOptions::new(db.url()).listen(false))
        .await
        .expect("store without LISTEN");
    let reader = PostgresStore::connect_with(PostgresStoreOptions::new(db.url()).read_only(true))
        .await
        .expect("read-only store");
    let _ = (quiet.work_events(), reader.work_events());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(listeners(&admin, &db).await, 1);

    drop(store);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(listeners(&admin, &db).await, 1, "a clone is left");
    drop(clone);
    until_listeners(&admin, &db, 0).await;
}

/// The listener survives a server restart: it connects again, and a session submitted
/// afterwards on another store still starts at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listener_comes_back_after_a_server_restart() {
    let db = test_database().await;
    let (a, b) = (store(&db).await, store(&db).await);
    let listening = a.clone();
    let report = with_idle_pool(&a, |mut starts| async move {
        let mut events = listening.work_events().expect("events");

        let restart = db.clone();
        tokio::task::spawn_blocking(move || restart.restart_server())
            .await
            .expect("restart task")
            .expect("restart the server");
        // Back and listening: it bumps once it listens again.
        tokio::time::timeout(Duration::from_secs(15), events.changed())
            .await
            .expect("the listener bumps once it listens again");
        let admin = PgPool::connect(db.url()).await.expect("admin pool");
        until_listeners(&admin, &db, 1).await;
        // The pool's claim after that bump found nothing.
        tokio::time::sleep(Duration::from_millis(500)).await;

        let submitter = Durable::builder(Arc::new(b.clone())).owner("web").build();
        let id = submitter
            .submit(StartOptions::<Value>::new().with_messages(vec![json!({"task": "refund"})]))
            .await
            .expect("submit after the restart");
        let submitted = Instant::now();
        let (started, after) = next_start(&mut starts, submitted).await;
        assert_eq!(started, id);
        assert!(
            after < WITHIN,
            "after a server restart the idle pool started the session {after:?} after it was \
         submitted: the listener did not come back"
        );
    })
    .await;
    // Claims may have failed while the server was down; the session was handled.
    assert_eq!((report.handled, report.succeeded), (1, 1), "{report:?}");
}
