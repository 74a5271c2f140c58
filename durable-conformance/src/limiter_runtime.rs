//! Cases: calls under fleet-wide rate limits, through the runtime. Model calls named
//! under a limit wait their turn and a replayed reply does not; a tool registered under
//! a limit in a toolbox waits its turn; a call whose turn is further away than the
//! worker holds is refused before anything is journaled or run, keeps its place, and
//! takes it when asked again once due.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use serde_json::{Value, json};

use super::runtime::{body, spec, start, take_over};
use durable_core::ToolSpec;
use durable_core::error::DurableError;
use durable_core::journal::{CallError, Journal};
use durable_core::limiter::{Quota, RateLimit};
use durable_core::replay::ReplayClass;
use durable_core::runtime::Durable;
use durable_core::store::CheckpointStore;
use durable_core::toolbox::{ModelToolCall, Tool, ToolOutput, Toolbox};

/// A fresh limit name.
fn limit_name(tag: &str) -> String {
    format!("conformance-rt:{tag}:{}", uuid::Uuid::new_v4())
}

/// A runtime whose builder defines `name` as `limit`, holding waits up to `hold`.
fn limited(
    store: &Arc<dyn CheckpointStore>,
    name: &str,
    limit: RateLimit,
    hold: Duration,
) -> Durable {
    Durable::builder(Arc::clone(store))
        .owner(super::owner("limited"))
        .app_version("v1")
        .rate_limit(name, limit)
        .limiter_hold(hold)
        .build()
}

async fn admitted(store: &dyn CheckpointStore, name: &str) -> i64 {
    store
        .limiters()
        .await
        .expect("limiters")
        .into_iter()
        .find(|l| l.name == name)
        .map_or(0, |l| l.admitted)
}

/// Model calls under a limit wait their turn (one per 100 ms here); the same turn
/// replayed after a crash returns the recorded replies without taking a turn.
pub async fn limiter_model_calls_wait_their_turn_and_replays_do_not(
    store: Arc<dyn CheckpointStore>,
) {
    let name = limit_name("model");
    let durable = limited(
        &store,
        &name,
        RateLimit::requests(Quota::per_second(10).with_burst(1)),
        Duration::from_secs(10),
    );
    let session = start(&durable).await;
    let asked = Arc::new(AtomicUsize::new(0));
    let ask = |journal: Journal, n: usize| {
        let asked = Arc::clone(&asked);
        let name = name.clone();
        async move {
            journal
                .with_rate_limit(name.as_str())
                .model(move || async move {
                    asked.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, String>(json!({"reply": n}))
                })
                .await
                .expect("model call")
        }
    };
    let began = Instant::now();
    let mut replies = Vec::new();
    for n in 0..4 {
        replies.push(ask(session.journal().clone(), n).await);
    }
    let took = began.elapsed();
    assert!(
        took >= Duration::from_millis(280),
        "four calls at 10/s with no burst take at least 300 ms; they took {took:?}"
    );
    assert_eq!(asked.load(Ordering::SeqCst), 4);
    assert_eq!(admitted(&*store, &name).await, 4, "four turns taken");
    let id = session.id().clone();
    drop(session);

    let (resumed, _) = take_over(&store, &id, "second").await;
    let began = Instant::now();
    for (n, recorded) in replies.iter().enumerate() {
        let replayed = ask(resumed.session.journal().clone(), 100 + n).await;
        assert_eq!(&replayed, recorded, "the recorded reply is returned");
    }
    assert_eq!(
        asked.load(Ordering::SeqCst),
        4,
        "the model was not asked again"
    );
    assert_eq!(
        admitted(&*store, &name).await,
        4,
        "a replayed reply takes no turn under the limit"
    );
    assert!(
        began.elapsed() < Duration::from_millis(250),
        "replays do not wait: {:?}",
        began.elapsed()
    );
}

/// A tool that runs its call through the journal, counting runs.
struct Counted {
    spec: ToolSpec,
    runs: Arc<AtomicUsize>,
}

impl Tool for Counted {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn invoke<'a>(
        &'a self,
        journal: &'a Journal,
        args: Value,
    ) -> BoxFuture<'a, Result<ToolOutput, DurableError>> {
        Box::pin(async move {
            let n = args.get("n").and_then(Value::as_i64).unwrap_or(0);
            let runs = Arc::clone(&self.runs);
            let result = journal
                .tool(&self.spec, args)
                .run(move |ctx| body(ctx, Arc::clone(&runs), n))
                .await;
            ToolOutput::from_call(&self.spec, result)
        })
    }
}

/// A toolbox names a tool's limit in one line: its calls wait their turn (one per
/// 100 ms), and so does a limit named on the tool's spec.
pub async fn limiter_toolbox_calls_wait_their_turn(store: Arc<dyn CheckpointStore>) {
    let name = limit_name("toolbox");
    let durable = limited(
        &store,
        &name,
        RateLimit::requests(Quota::per_second(10).with_burst(1)),
        Duration::from_secs(10),
    );
    let session = start(&durable).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let tools = Toolbox::new()
        .with(Counted {
            spec: spec("lookup", ReplayClass::Pure),
            runs: Arc::clone(&runs),
        })
        .expect("register")
        .rate_limit("lookup", name.as_str());
    let calls: Vec<ModelToolCall> = (0..4)
        .map(|n| ModelToolCall::new(format!("call-{n}"), "lookup", json!({ "n": n })))
        .collect();
    let began = Instant::now();
    let results = tools.dispatch_all(session.journal(), &calls).await;
    let took = began.elapsed();
    for result in &results {
        assert!(result.is_ok(), "every call ran: {results:?}");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 4);
    assert!(
        took >= Duration::from_millis(280),
        "four calls at 10/s with no burst take at least 300 ms, dispatched at once or not; they took {took:?}"
    );
    assert_eq!(admitted(&*store, &name).await, 4);
}

/// A call whose turn is further away than the worker holds is refused with
/// `RateLimited` before anything is journaled or run; it keeps its place, and the same
/// call asked again once due runs without queueing again.
pub async fn limiter_a_far_turn_is_refused_and_keeps_its_place(store: Arc<dyn CheckpointStore>) {
    let name = limit_name("far");
    // One call per 1.5 s; the worker holds a session at most 200 ms.
    let durable = limited(
        &store,
        &name,
        RateLimit::requests(Quota::new(1, Duration::from_millis(1500))),
        Duration::from_millis(200),
    );
    let session = start(&durable).await;
    let limited_spec = spec("send", ReplayClass::IdempotentWithKey).with_rate_limit(name.as_str());
    let runs = Arc::new(AtomicUsize::new(0));
    let call = |n: i64| {
        let runs = Arc::clone(&runs);
        let journal = session.journal().clone();
        let spec = limited_spec.clone();
        async move {
            journal
                .tool(&spec, json!({ "n": n }))
                .key(format!("send-{n}"))
                .run(move |ctx| body(ctx, Arc::clone(&runs), n))
                .await
        }
    };
    call(1).await.expect("the first call runs at once");
    let refused = call(2).await;
    let start_at = match refused {
        Err(CallError::Durable(DurableError::RateLimited {
            ref limit,
            start_at,
            ..
        })) => {
            assert_eq!(limit, &name);
            start_at
        }
        other => panic!("expected `RateLimited`, got {other:?}"),
    };
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the refused call did not run"
    );
    let rows = store.calls(session.id(), None).await.expect("calls");
    assert_eq!(
        rows.len(),
        1,
        "the refused call journaled nothing: {rows:?}"
    );
    assert!(
        DurableError::RateLimited {
            session: session.id().clone(),
            limit: name.clone(),
            start_at,
            ahead: 0
        }
        .kind()
            == durable_core::error::ErrorKind::RateLimited
    );

    super::wait_past(&*store, start_at).await;
    call(2).await.expect("asked again once due, the call runs");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert_eq!(
        admitted(&*store, &name).await,
        2,
        "the call asked again took the place it kept, not a second one"
    );
}

/// A call whose turn is far away: the handler releases the session until then
/// (`Session::release_until`), so no worker holds it; no claim takes it before its turn,
/// a claim takes it after, and the replayed turn returns the first call as recorded and
/// runs the limited one at once, in the place it kept.
pub async fn limiter_a_far_turn_releases_the_session_until_then(store: Arc<dyn CheckpointStore>) {
    use durable_core::store::Claim;
    use durable_core::transcript::Message;

    let name = limit_name("release");
    let queue = format!("release-{}", uuid::Uuid::new_v4().simple());
    let durable = limited(
        &store,
        &name,
        RateLimit::requests(Quota::new(1, Duration::from_millis(1500))),
        Duration::from_millis(100),
    );
    let session = durable
        .start::<Message>(durable_core::StartOptions::new().with_queue(queue.as_str()))
        .await
        .expect("start");
    let id = session.id().clone();
    let limited_spec = spec("send", ReplayClass::IdempotentWithKey).with_rate_limit(name.as_str());
    let runs = Arc::new(AtomicUsize::new(0));
    let call = |journal: Journal, n: i64| {
        let runs = Arc::clone(&runs);
        let spec = limited_spec.clone();
        async move {
            journal
                .tool(&spec, json!({ "n": n }))
                .key(format!("send-{n}"))
                .run(move |ctx| body(ctx, Arc::clone(&runs), n))
                .await
        }
    };
    call(session.journal().clone(), 1)
        .await
        .expect("the first call runs at once");
    let start_at = match call(session.journal().clone(), 2).await {
        Err(CallError::Durable(DurableError::RateLimited { start_at, .. })) => start_at,
        other => panic!("expected `RateLimited`, got {other:?}"),
    };
    session
        .release_until(start_at)
        .await
        .expect("release until the turn");
    let record = store.session(&id).await.expect("session");
    assert_eq!(record.lease_owner, None, "no worker holds it");
    assert_eq!(record.waiting_until, Some(start_at));
    let claim = || {
        Claim::new(super::owner("pool"), super::LONG_TTL, super::MAX_ATTEMPTS)
            .with_queues([queue.as_str()])
    };
    if super::now(&*store).await < start_at {
        assert_eq!(
            store.claim_expired(&claim()).await.expect("claim"),
            None,
            "no claim takes it before its turn"
        );
    }
    super::wait_past(&*store, start_at).await;
    let lease = store
        .claim_expired(&claim())
        .await
        .expect("claim")
        .expect("a claim takes it at its turn");
    assert_eq!(lease.session, id);
    store.release_lease(&lease).await.expect("hand it over");
    let resumed = durable
        .resume::<Message>(&id)
        .await
        .expect("resume")
        .session;
    call(resumed.journal().clone(), 1)
        .await
        .expect("the first call, recorded");
    call(resumed.journal().clone(), 2)
        .await
        .expect("the limited call runs at its turn");
    assert_eq!(runs.load(Ordering::SeqCst), 2, "each call ran once");
    assert_eq!(
        admitted(&*store, &name).await,
        2,
        "the call took the place it kept"
    );
}
