//! Runtime cases: the replay protocol (ARCHITECTURE.md's decision table) driven through [`Durable`],
//! [`Session`](durable_core::Session) and [`Journal`] over a real store.
//!
//! A crash is simulated in-process by dropping a session (its lease stays live, as a
//! killed worker's would) or by cancelling a call while its tool body is parked after its
//! effect; the next worker takes over with a lease of its own, so everything the first one
//! issued is in doubt, exactly as after a `SIGKILL`. Real-process crash tests live in the
//! facade's `tests/crash.rs`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::Notify;

use durable_core::error::{DurableError, StoreError};
use durable_core::journal::{CallError, CallEvent, Outcome};
use durable_core::replay::ReplayClass;
use durable_core::runtime::{Durable, StartOptions};
use durable_core::session::{InDoubtAction, Session};
use durable_core::snapshot::{Budget, Spend};
use durable_core::store::{CallStatus, CheckpointStore, Resolution};
use durable_core::transcript::Message;
use durable_core::{ToolSpec, Verification};

use super::stall::Probe;

/// How long a case waits for something that happens at once on a healthy machine.
pub(super) const GIVE_UP: Duration = Duration::from_secs(60);

pub(super) type Events = Arc<Mutex<Vec<CallEvent>>>;

pub(super) fn runtime(store: &Arc<dyn CheckpointStore>, owner: &str) -> (Durable, Events) {
    let events: Events = Arc::default();
    let sink = Arc::clone(&events);
    let durable = Durable::builder(Arc::clone(store))
        .owner(super::owner(owner))
        .app_version("v1")
        .on_call(move |e| sink.lock().expect("events lock").push(e.clone()))
        .build();
    (durable, events)
}

pub(super) fn outcomes(events: &Events) -> Vec<(String, Outcome)> {
    events
        .lock()
        .expect("events lock")
        .iter()
        .map(|e| (e.tool.clone(), e.outcome))
        .collect()
}

pub(super) fn spec(name: &str, class: ReplayClass) -> ToolSpec {
    ToolSpec::new(
        name,
        format!("test tool {name}"),
        class,
        json!({"type": "object", "properties": {"n": {"type": "integer"}}}),
    )
}

/// A tool body that counts its executions and echoes its key.
pub(super) async fn body(
    ctx: durable_core::ToolContext,
    runs: Arc<AtomicUsize>,
    n: i64,
) -> Result<Value, String> {
    let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
    Ok(json!({"n": n, "run": run, "key": ctx.idempotency_key(), "attempt": ctx.attempt()}))
}

pub(super) async fn start(durable: &Durable) -> Session<Message> {
    durable
        .start::<Message>(StartOptions::default())
        .await
        .expect("start a session")
}

/// Releases the lease a "dead" worker left live, as its expiry would.
pub(super) async fn release_dead_lease(
    store: &Arc<dyn CheckpointStore>,
    session: &durable_core::SessionId,
) {
    let record = store.session(session).await.expect("read session");
    let lease = durable_core::store::Lease {
        session: session.clone(),
        owner: record.lease_owner.clone().unwrap_or_default(),
        fence: record.fence,
        expires_at: 0,
    };
    store
        .release_lease(&lease)
        .await
        .expect("release the dead worker's lease");
}

/// An operator looks up the session's in-doubt calls, finds exactly one, and resolves it.
pub(super) async fn resolve_only_doubt(
    operator: &Durable,
    session: &durable_core::SessionId,
    resolution: Resolution,
    by: &str,
    note: Option<&str>,
) {
    let doubt = operator
        .operator()
        .in_doubt(Some(session))
        .await
        .expect("in doubt");
    assert_eq!(doubt.len(), 1, "one call in doubt: {doubt:?}");
    operator
        .operator()
        .resolve(&doubt[0].id, resolution, by, note)
        .await
        .expect("resolve");
}

/// Takes a session over from a "dead" worker (its lease still live): same path as a
/// recovery after the lease expired, without waiting for it.
pub(super) async fn take_over(
    store: &Arc<dyn CheckpointStore>,
    session: &durable_core::SessionId,
    owner: &str,
) -> (durable_core::Resumed<Message>, Events) {
    release_dead_lease(store, session).await;
    let (durable, events) = runtime(store, owner);
    let resumed = durable.resume::<Message>(session).await.expect("resume");
    (resumed, events)
}

/// A worker starts a session, runs `spec` (an email), and dies after the effect and before
/// its outcome is recorded: returns the session, the tool and the effect counter (at 1).
pub(super) async fn email_in_doubt(
    store: &Arc<dyn CheckpointStore>,
    spec: ToolSpec,
) -> (durable_core::SessionId, ToolSpec, Arc<AtomicUsize>) {
    let (durable, _) = runtime(store, "first");
    let session = start(&durable).await;
    let effects = Arc::new(AtomicUsize::new(0));
    call_and_die(&session, &spec, 1, None, &effects).await;
    (session.id().clone(), spec, effects)
}

/// Runs one call of `spec` with argument `n` (and key `key`), counting executions.
pub(super) async fn call(
    session: &Session<Message>,
    spec: &ToolSpec,
    n: i64,
    key: Option<&str>,
    runs: &Arc<AtomicUsize>,
) -> Result<Value, CallError<String>> {
    let mut call = session.journal().tool(spec, json!({ "n": n }));
    if let Some(key) = key {
        call = call.key(key);
    }
    let runs = Arc::clone(runs);
    call.run(move |ctx| body(ctx, Arc::clone(&runs), n)).await
}

/// Starts an unsafe/keyed call whose body performs its effect (counted) and then hangs,
/// and cancels it: the row stays `issued` with the effect done — the crash window.
pub(super) async fn call_and_die(
    session: &Session<Message>,
    spec: &ToolSpec,
    n: i64,
    key: Option<&str>,
    effects: &Arc<AtomicUsize>,
) {
    call_with_args_and_die(session, spec, json!({ "n": n }), key, effects).await;
}

/// [`call_and_die`] with arguments of the caller's choosing.
pub(super) async fn call_with_args_and_die(
    session: &Session<Message>,
    spec: &ToolSpec,
    args: Value,
    key: Option<&str>,
    effects: &Arc<AtomicUsize>,
) {
    let mut call = session.journal().tool(spec, args);
    if let Some(key) = key {
        call = call.key(key);
    }
    let counter = Arc::clone(effects);
    let started = Arc::new(Notify::new());
    let signal = Arc::clone(&started);
    let fut = call.run(move |_ctx| {
        let effects = Arc::clone(&counter);
        let signal = Arc::clone(&signal);
        async move {
            effects.fetch_add(1, Ordering::SeqCst);
            signal.notify_one();
            std::future::pending::<Result<Value, String>>().await
        }
    });
    // Drop the call once its body has performed the effect: no timer races the store's
    // write of the issued row, however slow the machine.
    tokio::select! {
        done = fut => panic!("the hanging tool body must not complete: {done:?}"),
        () = started.notified() => {}
        () = tokio::time::sleep(GIVE_UP) => panic!("the tool body never started"),
    }
    assert_eq!(
        effects.load(Ordering::SeqCst),
        1,
        "the effect ran once before the crash"
    );
}

/// Recorded results are returned on resume without running any class of tool again.
pub async fn runtime_recorded_results_are_returned_for_every_class(
    store: Arc<dyn CheckpointStore>,
) {
    let (durable, _) = runtime(&store, "first");
    let session = start(&durable).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let specs = [
        spec("read", ReplayClass::Pure),
        spec("charge", ReplayClass::IdempotentWithKey),
        spec("email", ReplayClass::UnsafeOnReplay),
    ];
    let mut first = Vec::new();
    for (i, s) in specs.iter().enumerate() {
        first.push(
            call(&session, s, i as i64, Some("k-1"), &runs)
                .await
                .expect("first run"),
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    let id = session.id().clone();
    drop(session); // crash before the checkpoint: the turn is re-run

    let (resumed, events) = take_over(&store, &id, "second").await;
    assert!(
        resumed.report.in_doubt.is_empty(),
        "nothing is in doubt: {:?}",
        resumed.report
    );
    for (i, s) in specs.iter().enumerate() {
        let again = call(&resumed.session, s, i as i64, Some("k-1"), &runs)
            .await
            .expect("replay");
        assert_eq!(
            again, first[i],
            "replay of `{}` returns the recorded bytes",
            s.name
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 3, "no tool ran again");
    assert!(
        outcomes(&events)
            .iter()
            .all(|(_, o)| *o == Outcome::CacheHit),
        "{:?}",
        outcomes(&events)
    );
}

/// A recorded failure is replayed as a failure, not re-run.
pub async fn runtime_recorded_failures_are_replayed(store: Arc<dyn CheckpointStore>) {
    let (durable, _) = runtime(&store, "first");
    let session = start(&durable).await;
    let s = spec("flaky", ReplayClass::Pure);
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&runs);
    let first = session
        .journal()
        .tool(&s, json!({"n": 1}))
        .run(move |_| {
            counter.fetch_add(1, Ordering::SeqCst);
            async { Err::<Value, _>("upstream said no".to_owned()) }
        })
        .await;
    assert!(
        matches!(first, Err(CallError::Tool(ref m)) if m == "upstream said no"),
        "{first:?}"
    );
    let id = session.id().clone();
    drop(session);
    let (resumed, _) = take_over(&store, &id, "second").await;
    let counter = Arc::clone(&runs);
    let again = resumed
        .session
        .journal()
        .tool(&s, json!({"n": 1}))
        .run(move |_| {
            counter.fetch_add(1, Ordering::SeqCst);
            async { Ok::<Value, String>(json!("should not run")) }
        })
        .await;
    assert!(
        matches!(again, Err(CallError::Recorded(ref f)) if f.message == "upstream said no"),
        "{again:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// In doubt `idempotent_with_key`: re-executed once, with the key recorded the first time.
pub async fn runtime_in_doubt_keyed_reruns_with_recorded_key(store: Arc<dyn CheckpointStore>) {
    let (durable, _) = runtime(&store, "first");
    let session = start(&durable).await;
    let s = spec("charge", ReplayClass::IdempotentWithKey);
    let effects = Arc::new(AtomicUsize::new(0));
    call_and_die(&session, &s, 7, Some("charge:order-7"), &effects).await;
    let id = session.id().clone();
    drop(session);

    let (resumed, events) = take_over(&store, &id, "second").await;
    let in_doubt = &resumed.report.in_doubt;
    assert_eq!(in_doubt.len(), 1, "{in_doubt:?}");
    assert_eq!(
        in_doubt[0].action,
        InDoubtAction::ReExecuteWithKey(Some("charge:order-7".into()))
    );
    // Even if today's key derivation produced another key, the recorded one is used.
    let result = call(&resumed.session, &s, 7, Some("charge:DIFFERENT"), &effects)
        .await
        .expect("re-run");
    assert_eq!(result["key"], json!("charge:order-7"));
    assert_eq!(result["attempt"], json!(2));
    assert_eq!(
        effects.load(Ordering::SeqCst),
        2,
        "re-executed exactly once"
    );
    assert_eq!(
        outcomes(&events),
        vec![("charge".to_owned(), Outcome::ReExecutedWithKey)]
    );
}

/// In doubt `unsafe_on_replay` without a verify hook: `ReplayUnsafe`, never re-run; the
/// refusal repeats on every resume until an operator resolves the call.
pub async fn runtime_in_doubt_unsafe_is_refused(store: Arc<dyn CheckpointStore>) {
    let (id, s, effects) = email_in_doubt(&store, spec("email", ReplayClass::UnsafeOnReplay)).await;

    for attempt in 0..3 {
        let (resumed, events) = take_over(&store, &id, "next").await;
        assert!(resumed.report.needs_attention());
        let err = call(&resumed.session, &s, 1, None, &effects)
            .await
            .expect_err("must refuse");
        assert!(
            matches!(err, CallError::Durable(DurableError::ReplayUnsafe { ref tool, .. }) if tool == "email"),
            "resume {attempt}: {err:?}"
        );
        assert_eq!(
            outcomes(&events),
            vec![("email".to_owned(), Outcome::Refused)]
        );
        assert!(!err.to_string().is_empty());
    }
    assert_eq!(
        effects.load(Ordering::SeqCst),
        1,
        "the unsafe tool never ran again"
    );
}

/// The verify hook decides: happened (recorded, not run), did not happen (run once),
/// unknown (refused).
pub async fn runtime_verify_hook_decides_in_doubt_unsafe(store: Arc<dyn CheckpointStore>) {
    for (verdict, expect_runs, expect_outcome) in [
        (
            Verification::Happened(json!({"receipt": "r-1"})),
            1,
            Some(Outcome::VerifiedHappened),
        ),
        (
            Verification::DidNotHappen,
            2,
            Some(Outcome::VerifiedNotHappened),
        ),
        (Verification::Unknown, 1, Some(Outcome::Refused)),
    ] {
        let (id, s, effects) = email_in_doubt(
            &store,
            spec("email", ReplayClass::UnsafeOnReplay).with_verify(),
        )
        .await;

        let (resumed, events) = take_over(&store, &id, "second").await;
        let counter = Arc::clone(&effects);
        let verdict_for_hook = verdict.clone();
        let result = resumed
            .session
            .journal()
            .tool(&s, json!({"n": 1}))
            .run_verified(
                move |_| {
                    counter.fetch_add(1, Ordering::SeqCst);
                    async { Ok::<Value, String>(json!({"receipt": "fresh"})) }
                },
                move |ctx| async move {
                    assert_eq!(ctx.attempt(), 1, "verify sees the in-doubt attempt");
                    verdict_for_hook
                },
            )
            .await;
        assert_eq!(
            effects.load(Ordering::SeqCst),
            expect_runs,
            "verdict {verdict:?}"
        );
        assert_eq!(outcomes(&events).last().map(|e| e.1), expect_outcome);
        match verdict {
            Verification::Happened(v) => {
                assert_eq!(result.expect("happened"), v);
                // and it is now recorded: a later resume returns it as a cache hit
                let rows = store.calls(&id, None).await.expect("calls");
                assert_eq!(rows[0].status, CallStatus::Completed);
            }
            Verification::DidNotHappen => {
                assert_eq!(result.expect("ran"), json!({"receipt": "fresh"}))
            }
            Verification::Unknown => assert!(matches!(
                result,
                Err(CallError::Durable(DurableError::ReplayUnsafe { .. }))
            )),
        }
    }
}

/// An operator's resolution: *happened* becomes the call's result (nothing runs);
/// *did not happen* lets the call execute once.
pub async fn runtime_operator_resolution_is_honoured(store: Arc<dyn CheckpointStore>) {
    for happened in [true, false] {
        let (id, s, effects) =
            email_in_doubt(&store, spec("email", ReplayClass::UnsafeOnReplay)).await;
        release_dead_lease(&store, &id).await;

        let (operator, _) = runtime(&store, "operator");
        let resolution = if happened {
            Resolution::Happened {
                result: json!({"receipt": "from-operator"}),
            }
        } else {
            Resolution::DidNotHappen
        };
        resolve_only_doubt(
            &operator,
            &id,
            resolution,
            "alice",
            Some("checked the outbox"),
        )
        .await;
        let audit = store.resolutions(&id).await.expect("audit");
        assert_eq!(audit.len(), 1);
        assert_eq!(audit[0].by, "alice");

        let (resumed, events) = take_over(&store, &id, "second").await;
        let result = call(&resumed.session, &s, 1, None, &effects)
            .await
            .expect("continue");
        if happened {
            assert_eq!(result, json!({"receipt": "from-operator"}));
            assert_eq!(effects.load(Ordering::SeqCst), 1);
            assert_eq!(
                outcomes(&events),
                vec![("email".to_owned(), Outcome::Resolved)]
            );
        } else {
            assert_eq!(result["run"], json!(2), "ran once more after the crash");
            assert_eq!(effects.load(Ordering::SeqCst), 2);
            assert_eq!(
                outcomes(&events),
                vec![("email".to_owned(), Outcome::ReExecuted)]
            );
        }
    }
}

/// A re-run step that asks for other arguments while an unsafe call of the step is
/// unresolved is refused, naming the unresolved call; pure calls still run.
pub async fn runtime_no_effect_runs_beside_an_orphan(store: Arc<dyn CheckpointStore>) {
    let (durable, _) = runtime(&store, "first");
    let session = start(&durable).await;
    let email = spec("email", ReplayClass::UnsafeOnReplay);
    let effects = Arc::new(AtomicUsize::new(0));
    call_and_die(&session, &email, 1, None, &effects).await;
    let orphan = store.calls(session.id(), None).await.expect("calls")[0]
        .id
        .clone();
    let id = session.id().clone();
    drop(session);

    let (resumed, _) = take_over(&store, &id, "second").await;
    let runs = Arc::new(AtomicUsize::new(0));
    // the model changed its mind: same tool, other arguments
    let err = call(&resumed.session, &email, 2, None, &runs)
        .await
        .expect_err("refused");
    assert!(
        matches!(err, CallError::Durable(DurableError::ReplayUnsafe { ref call, .. }) if *call == orphan),
        "{err:?}"
    );
    // another side-effecting tool is refused too
    let charge = spec("charge", ReplayClass::IdempotentWithKey);
    let err = call(&resumed.session, &charge, 2, Some("k"), &runs)
        .await
        .expect_err("refused");
    assert!(
        matches!(err, CallError::Durable(DurableError::ReplayUnsafe { .. })),
        "{err:?}"
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "no effect ran beside the orphan"
    );
    // a pure read has no effect and may run
    let read = spec("read", ReplayClass::Pure);
    call(&resumed.session, &read, 2, None, &runs)
        .await
        .expect("pure runs");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// Two deliberate identical calls in one turn are two calls (ordinals 0 and 1), both
/// replayed; the same call in the next turn is a new call.
pub async fn runtime_ordinals_and_steps_scope_identity(store: Arc<dyn CheckpointStore>) {
    let (durable, _) = runtime(&store, "first");
    let mut session = start(&durable).await;
    let s = spec("email", ReplayClass::UnsafeOnReplay);
    let runs = Arc::new(AtomicUsize::new(0));
    let a = call(&session, &s, 1, None, &runs).await.expect("first");
    let b = call(&session, &s, 1, None, &runs).await.expect("second");
    assert_ne!(a, b, "two deliberate calls ran twice");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    let rows = store.calls(session.id(), Some(0)).await.expect("calls");
    let ordinals: Vec<i64> = rows.iter().map(|r| r.identity.ordinal).collect();
    assert_eq!(ordinals, vec![0, 1]);

    session.checkpoint().await.expect("checkpoint");
    call(&session, &s, 1, None, &runs).await.expect("next turn");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        3,
        "a later turn's identical call is a new call"
    );
    let rows = store.calls(session.id(), Some(1)).await.expect("calls");
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].identity.step, 1);
}

/// Model responses are journaled by position: a re-run turn gets the recorded responses
/// and does not call the model again; spend is charged once per row.
pub async fn runtime_model_responses_replay_and_spend_once(store: Arc<dyn CheckpointStore>) {
    let (durable, _) = runtime(&store, "first");
    let session = start(&durable).await;
    let asked = Arc::new(AtomicUsize::new(0));
    let ask = |session: &Session<Message>, text: &'static str| {
        let asked = Arc::clone(&asked);
        let journal = session.journal().clone();
        async move {
            journal
                .model_with_spend(
                    move || async move {
                        asked.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, String>(json!({"text": text}))
                    },
                    |_| Some(Spend::new(0.25, 100, 20).expect("valid spend")),
                )
                .await
                .expect("model")
        }
    };
    let r1 = ask(&session, "first answer").await;
    let r2 = ask(&session, "second answer").await;
    assert_eq!(asked.load(Ordering::SeqCst), 2);
    assert_eq!(session.budget().total_tokens(), 240);
    let id = session.id().clone();
    drop(session);

    let (resumed, _) = take_over(&store, &id, "second").await;
    let mut session = resumed.session;
    assert_eq!(
        session.budget().total_tokens(),
        0,
        "the crashed turn was never checkpointed"
    );
    assert_eq!(
        ask(&session, "CHANGED").await,
        r1,
        "position 0 replays the recorded response"
    );
    assert_eq!(ask(&session, "CHANGED").await, r2);
    assert_eq!(
        asked.load(Ordering::SeqCst),
        2,
        "the model was not asked again"
    );
    // replaying the same rows twice in one turn does not double-charge
    assert_eq!(session.budget().total_tokens(), 240);
    session.checkpoint().await.expect("checkpoint");
    let cp = store.load_checkpoint(&id, None).await.expect("load");
    let budget: Budget = serde_json::from_value(cp.budget).expect("budget");
    assert_eq!(
        budget.total_tokens(),
        240,
        "checkpointed budget charged once"
    );
    assert!((budget.spent_usd() - 0.5).abs() < 1e-9);
}

/// A key reused with other arguments is an `IdempotencyConflict`; nothing runs.
pub async fn runtime_idempotency_key_conflict_runs_nothing(store: Arc<dyn CheckpointStore>) {
    let (durable, _) = runtime(&store, "first");
    let session = start(&durable).await;
    let s = spec("charge", ReplayClass::IdempotentWithKey);
    let runs = Arc::new(AtomicUsize::new(0));
    call(&session, &s, 1, Some("same-key"), &runs)
        .await
        .expect("first");
    let err = call(&session, &s, 2, Some("same-key"), &runs)
        .await
        .expect_err("conflict");
    assert!(
        matches!(
            err,
            CallError::Durable(DurableError::Store(StoreError::IdempotencyConflict { .. }))
        ),
        "{err:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// Arguments that break the validation rules are refused before anything is journaled.
pub async fn runtime_invalid_arguments_journal_nothing(store: Arc<dyn CheckpointStore>) {
    let (durable, _) = runtime(&store, "first");
    let session = start(&durable).await;
    let s = spec("email", ReplayClass::UnsafeOnReplay);
    let mut deep = json!(1);
    for _ in 0..100 {
        deep = json!([deep]);
    }
    let runs = Arc::new(AtomicUsize::new(0));
    for bad in [json!({"n": deep}), json!({"n": 9_007_199_254_740_993_u64})] {
        let counter = Arc::clone(&runs);
        let err = session
            .journal()
            .tool(&s, bad)
            .run(move |_| {
                counter.fetch_add(1, Ordering::SeqCst);
                async { Ok::<Value, String>(Value::Null) }
            })
            .await
            .expect_err("refused");
        assert!(
            matches!(
                err,
                CallError::Durable(DurableError::InvalidArguments { .. })
            ),
            "{err:?}"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert!(
        store
            .calls(session.id(), None)
            .await
            .expect("calls")
            .is_empty(),
        "nothing journaled"
    );
}

/// A worker that lost its lease cannot journal anything: its unsafe call never runs.
pub async fn runtime_lost_lease_stops_the_zombie(store: Arc<dyn CheckpointStore>) {
    let (durable, _) = runtime(&store, "zombie");
    let zombie = start(&durable).await;
    let id = zombie.id().clone();
    let (resumed, _) = take_over(&store, &id, "successor").await;
    let s = spec("email", ReplayClass::UnsafeOnReplay);
    let runs = Arc::new(AtomicUsize::new(0));
    let err = call(&zombie, &s, 1, None, &runs)
        .await
        .expect_err("zombie refused");
    assert!(
        matches!(
            err,
            CallError::Durable(DurableError::Store(StoreError::LeaseLost { .. }))
        ),
        "{err:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    // the successor works
    call(&resumed.session, &s, 1, None, &runs)
        .await
        .expect("successor runs");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // a second live worker is refused outright
    let (other, _) = runtime(&store, "other");
    let refused = other.resume::<Message>(&id).await.expect_err("leased");
    assert!(
        matches!(refused, DurableError::Store(StoreError::Leased { .. })),
        "{refused:?}"
    );
}

/// Checkpoints: messages pushed after the last checkpoint are not restored; plan, budget
/// and state are; any version loads; a fork starts from a version.
pub async fn runtime_checkpoints_restore_transcript_plan_budget(store: Arc<dyn CheckpointStore>) {
    let (durable, _) = runtime(&store, "first");
    let mut session = start(&durable).await;
    session.push(Message::user("turn 1"));
    session.plan_mut().objective = "ship it".into();
    session.set_state(json!({"cursor": 1}));
    session.checkpoint().await.expect("v1");
    session.push(Message::user("turn 2"));
    session.checkpoint().await.expect("v2");
    session.push(Message::user("lost turn"));
    let id = session.id().clone();
    drop(session);

    let (resumed, _) = take_over(&store, &id, "second").await;
    let session = resumed.session;
    assert_eq!(session.version(), 2);
    assert_eq!(
        session.messages(),
        &[Message::user("turn 1"), Message::user("turn 2")]
    );
    assert_eq!(session.plan().objective, "ship it");
    assert_eq!(session.state(), &json!({"cursor": 1}));

    let (forker, _) = runtime(&store, "forker");
    let fork = forker
        .operator()
        .fork::<Message>(&id, 1, None)
        .await
        .expect("fork");
    assert_eq!(fork.messages(), &[Message::user("turn 1")]);
    assert_ne!(fork.id(), &id);
}

/// A stored message that does not decode into the session's message type (the type
/// changed, or the row is not JSON at all: a buggy older release) fails the resume with
/// `DurableError::Decode` naming the session, the version and the message, never a
/// panic; the lease is released, so a resume with the right type then succeeds.
pub async fn runtime_undecodable_message_fails_the_resume(store: Arc<dyn CheckpointStore>) {
    /// A message type the stored messages do not fit.
    #[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
    struct Numbered {
        n: u32,
    }

    let probe = Probe::new(Arc::clone(&store));
    let probed: Arc<dyn CheckpointStore> = probe.clone();
    let (durable, _) = runtime(&probed, "first");
    let mut session = start(&durable).await;
    session.push(Message::user("turn 1"));
    session.push(Message::user("turn 2"));
    session.checkpoint().await.expect("v1");
    let id = session.id().clone();
    session.release().await.expect("release");

    let (other, _) = runtime(&probed, "second");
    let expect_decode = |err: DurableError, message: &str| match err {
        DurableError::Decode {
            session,
            what,
            detail,
        } => {
            assert_eq!(session, id, "{what}: {detail}");
            assert_eq!(
                what,
                format!("{message} at checkpoint version 1"),
                "{detail}"
            );
        }
        other => panic!("expected Decode for {message}, got {other:?}"),
    };
    let err = other
        .resume::<Numbered>(&id)
        .await
        .expect_err("a message that does not fit the type");
    expect_decode(err, "message 1");
    probe.garble_next_load();
    let err = other
        .resume::<Message>(&id)
        .await
        .expect_err("a message that is not JSON");
    expect_decode(err, "message 2");
    let resumed = other
        .resume::<Message>(&id)
        .await
        .expect("both failed resumes released the lease");
    assert_eq!(
        resumed.session.messages(),
        &[Message::user("turn 1"), Message::user("turn 2")]
    );
}

/// A session started on another app version is refused until retargeted (audited).
pub async fn runtime_app_version_requires_migration(store: Arc<dyn CheckpointStore>) {
    let (durable, _) = runtime(&store, "v1-worker");
    let session = start(&durable).await;
    let id = session.id().clone();
    session.release().await.expect("release");
    let v2 = Durable::builder(Arc::clone(&store))
        .owner(super::owner("v2"))
        .app_version("v2")
        .build();
    let err = v2.resume::<Message>(&id).await.expect_err("mismatch");
    assert!(
        matches!(err, DurableError::AppVersionMismatch { .. }),
        "{err:?}"
    );
    v2.operator()
        .retarget(&id, vec![("old_tool".into(), "new_tool".into())], "ops")
        .await
        .expect("migrate");
    let resumed = v2
        .resume::<Message>(&id)
        .await
        .expect("resumes after migration");
    assert_eq!(resumed.session.record().app_version, "v2");
}

/// Secret arguments are stored as a hash, never in clear; the call still replays.
pub async fn runtime_secret_arguments_are_masked(store: Arc<dyn CheckpointStore>) {
    let (durable, _) = runtime(&store, "first");
    let session = start(&durable).await;
    let s = spec("login", ReplayClass::Pure).with_secret_args(["password"]);
    session
        .journal()
        .tool(&s, json!({"user": "ann", "password": "hunter2"}))
        .run(|_| async { Ok::<_, String>(json!("ok")) })
        .await
        .expect("run");
    let rows = store.calls(session.id(), None).await.expect("calls");
    let stored = rows[0].args.to_string();
    assert!(
        !stored.contains("hunter2"),
        "secret stored in clear: {stored}"
    );
    assert_eq!(rows[0].args["user"], json!("ann"), "other arguments stay");
    let digest = rows[0].args["password"]["$secret"]
        .as_str()
        .unwrap_or_else(|| panic!("the secret is a {{\"$secret\": …}} placeholder: {stored}"));
    let hex = digest
        .strip_prefix("k1:")
        .unwrap_or_else(|| panic!("a keyed digest: {digest}"));
    assert!(
        hex.len() >= 32 && hex.bytes().all(|b| b.is_ascii_hexdigit()),
        "a keyed digest: {digest}"
    );
    // Neither the digest nor the call's identity is the unkeyed SHA-256 a dictionary
    // would reverse.
    let plain = durable_core::canonical::input_hash(&json!({"user": "ann", "password": "hunter2"}))
        .expect("hash");
    assert_ne!(
        rows[0].identity.input_hash, plain,
        "the input hash is keyed"
    );
    let plain_secret = durable_core::canonical::input_hash(&json!("hunter2")).expect("hash");
    assert!(!digest.contains(&plain_secret), "the digest is keyed");
    // The same secret gives the same identity in this store (a replay matches), another
    // secret another one.
    for (password, same) in [("hunter2", true), ("hunter3", false)] {
        session
            .journal()
            .tool(&s, json!({"user": "ann", "password": password}))
            .run(|_| async { Ok::<_, String>(json!("ok")) })
            .await
            .expect("run");
        let rows = store.calls(session.id(), None).await.expect("calls");
        let last = rows.last().expect("a row");
        assert_eq!(
            last.identity.input_hash == rows[0].identity.input_hash,
            same,
            "input hash of {password} against hunter2"
        );
        assert!(
            !last.args.to_string().contains(password),
            "{password} stored in clear"
        );
    }
}

/// The retry helper records every failed attempt, and counts continue across workers.
pub async fn runtime_retry_records_attempts(store: Arc<dyn CheckpointStore>) {
    let (durable, _) = runtime(&store, "first");
    let session = start(&durable).await;
    let policy = durable_core::retry::RetryPolicy::new()
        .with_max_attempts(3)
        .with_base_delay(Duration::from_millis(1))
        .with_jitter(false);
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&calls);
    let result = durable_core::retry::retry(
        store.as_ref(),
        session.id(),
        0,
        "model",
        &policy,
        |_e: &String| true,
        move |_attempt| {
            let n = counter.fetch_add(1, Ordering::SeqCst);
            async move {
                if n < 2 {
                    Err(format!("503 #{n}"))
                } else {
                    Ok("fine")
                }
            }
        },
    )
    .await;
    assert_eq!(result.expect("third attempt succeeds"), "fine");
    let errors = store.errors(session.id()).await.expect("errors");
    let attempts: Vec<i32> = errors.iter().map(|e| e.attempt).collect();
    assert_eq!(attempts, vec![0, 1]);
    assert_eq!(errors[0].message, "503 #0");
}

/// A tool's retry policy re-runs a failing `pure`/keyed body within one execution and
/// records each failed attempt in the retry history; one row, one result.
pub async fn runtime_tool_retry_policy_records_attempts(store: Arc<dyn CheckpointStore>) {
    let (durable, _) = runtime(&store, "first");
    let session = start(&durable).await;
    let policy = durable_core::retry::RetryPolicy::new()
        .with_max_attempts(3)
        .with_base_delay(Duration::from_millis(1))
        .with_jitter(false);
    let s = spec("flaky_read", ReplayClass::Pure).with_retry(policy);
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&runs);
    let value = session
        .journal()
        .tool(&s, json!({"n": 1}))
        .run(move |ctx| {
            let n = counter.fetch_add(1, Ordering::SeqCst);
            async move {
                if n < 2 {
                    Err(format!("timeout #{n} (attempt {})", ctx.attempt()))
                } else {
                    Ok(json!({"ok": ctx.attempt()}))
                }
            }
        })
        .await
        .expect("third attempt succeeds");
    assert_eq!(value, json!({"ok": 3}));
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    let errors = store.errors(session.id()).await.expect("errors");
    let seen: Vec<(String, i32)> = errors
        .iter()
        .map(|e| (e.context.clone(), e.attempt))
        .collect();
    assert_eq!(
        seen,
        vec![
            ("tool:flaky_read#0".to_owned(), 1),
            ("tool:flaky_read#0".to_owned(), 2)
        ]
    );
    assert_eq!(
        store.calls(session.id(), None).await.expect("calls").len(),
        1
    );
}

/// A session parked on `ReplayUnsafe` cannot be resumed; resolving its in-doubt call
/// returns it to `active`, and the next resume continues with the operator's result.
/// Unparking anything but a parked session is refused.
pub async fn runtime_resolution_unparks_a_parked_session(store: Arc<dyn CheckpointStore>) {
    let (id, s, effects) = email_in_doubt(&store, spec("email", ReplayClass::UnsafeOnReplay)).await;

    let (resumed, _) = take_over(&store, &id, "second").await;
    let err = call(&resumed.session, &s, 1, None, &effects)
        .await
        .expect_err("refused");
    assert!(matches!(
        err,
        CallError::Durable(DurableError::ReplayUnsafe { .. })
    ));
    resumed
        .session
        .park("send_email in doubt: needs an operator")
        .await
        .expect("park");
    let (other, _) = runtime(&store, "third");
    let refused = other.resume::<Message>(&id).await.expect_err("parked");
    assert!(
        matches!(
            refused,
            DurableError::Store(StoreError::NotResumable { .. })
        ),
        "{refused:?}"
    );
    let unpark_active = other
        .operator()
        .unpark(&durable_core::SessionId::random())
        .await;
    assert!(matches!(
        unpark_active,
        Err(DurableError::Store(StoreError::SessionNotFound(_)))
    ));

    resolve_only_doubt(
        &other,
        &id,
        Resolution::Happened {
            result: json!({"receipt": "r-9"}),
        },
        "bob",
        None,
    )
    .await;
    let record = store.session(&id).await.expect("session");
    assert_eq!(
        record.status,
        durable_core::store::SessionStatus::Active,
        "unparked"
    );
    assert_eq!(record.recovery_attempts, 0);
    let resumed = other.resume::<Message>(&id).await.expect("resumes");
    let result = call(&resumed.session, &s, 1, None, &effects)
        .await
        .expect("continues");
    assert_eq!(result, json!({"receipt": "r-9"}));
    assert_eq!(effects.load(Ordering::SeqCst), 1, "nothing re-sent");
    let again = other.operator().unpark(&id).await.expect_err("not parked");
    assert!(
        matches!(again, DurableError::Store(StoreError::NotParked { .. })),
        "{again:?}"
    );
}

/// A model call that fails writes nothing and uses up no position: after a crash, the
/// re-run turn's replies line up with the calls that got them.
pub async fn runtime_failed_model_calls_do_not_shift_positions(store: Arc<dyn CheckpointStore>) {
    let (durable, _) = runtime(&store, "first");
    let session = start(&durable).await;
    let journal = session.journal().clone();
    let failed = journal
        .model(|| async { Err::<Value, _>("429 too many requests".to_owned()) })
        .await;
    assert!(matches!(failed, Err(CallError::Tool(_))), "{failed:?}");
    let r1 = journal
        .model(|| async { Ok::<_, String>(json!({"reply": 1})) })
        .await
        .expect("r1");
    let r2 = journal
        .model(|| async { Ok::<_, String>(json!({"reply": 2})) })
        .await
        .expect("r2");
    let id = session.id().clone();
    drop(session);

    let (resumed, _) = take_over(&store, &id, "second").await;
    let journal = resumed.session.journal().clone();
    let again1 = journal
        .model(|| async { Ok::<_, String>(json!({"reply": "asked again"})) })
        .await
        .expect("replayed r1");
    let again2 = journal
        .model(|| async { Ok::<_, String>(json!({"reply": "asked again"})) })
        .await
        .expect("replayed r2");
    assert_eq!(
        (again1, again2),
        (r1, r2),
        "replies replay in the order they were given"
    );
}

/// An unsafe call whose outcome could not be recorded (its future was dropped after the
/// effect) is in doubt for the live session too: a retry, or another unsafe call, is
/// refused, and the effect never runs twice.
pub async fn runtime_interrupted_unsafe_call_blocks_the_live_session(
    store: Arc<dyn CheckpointStore>,
) {
    let (durable, _) = runtime(&store, "first");
    let session = start(&durable).await;
    let s = spec("email", ReplayClass::UnsafeOnReplay);
    let effects = Arc::new(AtomicUsize::new(0));
    call_and_die(&session, &s, 1, None, &effects).await;
    let err = call(&session, &s, 1, None, &effects)
        .await
        .expect_err("the retry is refused");
    assert!(
        matches!(err, CallError::Durable(DurableError::ReplayUnsafe { .. })),
        "{err:?}"
    );
    let other = spec("post", ReplayClass::UnsafeOnReplay);
    let err = call(&session, &other, 1, None, &effects)
        .await
        .expect_err("another unsafe call is refused");
    assert!(
        matches!(err, CallError::Durable(DurableError::ReplayUnsafe { .. })),
        "{err:?}"
    );
    assert_eq!(effects.load(Ordering::SeqCst), 1, "the effect ran once");
}

/// A resumed session refused on an orphan picks up the operator's resolution without
/// being resumed again: the same call then returns the operator's result.
pub async fn runtime_live_session_sees_a_resolution(store: Arc<dyn CheckpointStore>) {
    let (id, s, effects) = email_in_doubt(&store, spec("email", ReplayClass::UnsafeOnReplay)).await;

    let (resumed, events) = take_over(&store, &id, "second").await;
    let err = call(&resumed.session, &s, 1, None, &effects)
        .await
        .expect_err("in doubt");
    assert!(matches!(
        err,
        CallError::Durable(DurableError::ReplayUnsafe { .. })
    ));
    let (operator, _) = runtime(&store, "operator");
    resolve_only_doubt(
        &operator,
        &id,
        Resolution::Happened {
            result: json!({"receipt": "seen"}),
        },
        "dana",
        None,
    )
    .await;
    let result = call(&resumed.session, &s, 1, None, &effects)
        .await
        .expect("the resolution is the result");
    assert_eq!(result, json!({"receipt": "seen"}));
    assert_eq!(effects.load(Ordering::SeqCst), 1);
    assert_eq!(
        outcomes(&events).last().map(|e| e.1),
        Some(Outcome::Resolved)
    );
}

/// A checkpoint whose write was interrupted leaves the handle unable to tell its step:
/// it refuses further calls and checkpoints until the session is resumed, and the resumed
/// session finds the checkpoint that did commit.
pub async fn runtime_interrupted_checkpoint_stops_the_handle(store: Arc<dyn CheckpointStore>) {
    let stall = Probe::new(Arc::clone(&store));
    let stalling: Arc<dyn CheckpointStore> = Arc::clone(&stall) as _;
    let (durable, _) = runtime(&stalling, "first");
    let mut session = start(&durable).await;
    session.push(Message::user("turn 1"));
    stall.arm();
    // The write commits, its reply never arrives, and the worker gives up on it.
    tokio::select! {
        saved = session.checkpoint() => panic!("an armed checkpoint must stall: {saved:?}"),
        () = stall.stalled() => {}
        () = tokio::time::sleep(GIVE_UP) => panic!("the checkpoint never reached the store"),
    }
    stopped_then_resumed(&store, session, &[Message::user("turn 1")]).await;
}

/// After a write of checkpoint 1 was interrupted (committed, its reply lost): the handle
/// refuses calls and checkpoints, nothing runs, and the session resumed by another worker
/// starts from version 1 holding `messages`.
pub(super) async fn stopped_then_resumed(
    store: &Arc<dyn CheckpointStore>,
    mut session: Session<Message>,
    messages: &[Message],
) -> durable_core::Resumed<Message> {
    let s = spec("email", ReplayClass::UnsafeOnReplay);
    let effects = Arc::new(AtomicUsize::new(0));
    let err = call(&session, &s, 1, None, &effects)
        .await
        .expect_err("refused");
    assert!(
        matches!(
            err,
            CallError::Durable(DurableError::CheckpointInDoubt { version: 1, .. })
        ),
        "{err:?}"
    );
    let err = session.checkpoint().await.expect_err("refused");
    assert!(
        matches!(err, DurableError::CheckpointInDoubt { version: 1, .. }),
        "{err:?}"
    );
    assert_eq!(effects.load(Ordering::SeqCst), 0, "no call ran");

    let id = session.id().clone();
    drop(session);
    let (resumed, _) = take_over(store, &id, "second").await;
    assert_eq!(
        resumed.session.version(),
        1,
        "the interrupted write committed"
    );
    assert_eq!(
        resumed.session.messages(),
        messages,
        "the committed checkpoint's transcript"
    );
    resumed
}

/// `start_or_resume`: a new id starts a session (version 0, nothing in doubt) with the
/// options' messages; the same id after its worker died resumes it, reporting the call
/// left in doubt and ignoring the options; a finished session is `NotResumable`; an id
/// `validate_id` refuses is `InvalidId` before anything is written.
pub async fn runtime_start_or_resume_starts_new_ids_and_resumes_known_ones(
    store: Arc<dyn CheckpointStore>,
) {
    let (durable, _) = runtime(&store, "first");
    let id = super::session_id();
    let options = || {
        StartOptions::new()
            .with_id(id.clone())
            .with_messages(vec![Message::user("send the welcome email")])
    };
    let started = durable
        .start_or_resume::<Message>(options())
        .await
        .expect("start a new id");
    assert_eq!(started.report.version, 0, "a new session is at version 0");
    assert!(
        started.report.in_doubt.is_empty(),
        "nothing in doubt in a new session"
    );
    assert_eq!(started.session.messages().len(), 1, "the options' messages");
    let s = spec("email", ReplayClass::UnsafeOnReplay);
    let effects = Arc::new(AtomicUsize::new(0));
    call_and_die(&started.session, &s, 1, None, &effects).await;
    drop(started);

    // The worker died holding the lease; another takes the same id over.
    release_dead_lease(&store, &id).await;
    let (next, _) = runtime(&store, "next");
    let resumed = next
        .start_or_resume::<Message>(
            StartOptions::new()
                .with_id(id.clone())
                .with_messages(vec![Message::user("ignored: the session exists")]),
        )
        .await
        .expect("resume the known id");
    assert_eq!(resumed.session.id(), &id);
    assert_eq!(
        resumed.session.messages().len(),
        1,
        "the stored transcript, not the options'"
    );
    assert_eq!(
        resumed
            .report
            .in_doubt
            .iter()
            .map(|d| d.call.identity.tool.as_str())
            .collect::<Vec<_>>(),
        ["email"],
        "the call the dead worker left in doubt is reported"
    );
    // (Completing it would be refused: the recorded email was not replayed.) An operator
    // cancels it instead.
    resumed
        .session
        .cancel(Some("operator"))
        .await
        .expect("cancel");
    assert_eq!(effects.load(Ordering::SeqCst), 1, "nothing ran again");

    match next.start_or_resume::<Message>(options()).await {
        Err(DurableError::Store(StoreError::NotResumable { .. })) => {}
        other => panic!(
            "a completed session must not be started or resumed: {:?}",
            other.err()
        ),
    }
    // Two workers racing to start one new id: one starts it, the other finds it leased
    // (never a second session, never a raw database error).
    let raced = super::session_id();
    let (w1, _) = runtime(&store, "racer-1");
    let (w2, _) = runtime(&store, "racer-2");
    let options = |id: &durable_core::SessionId| StartOptions::<Message>::new().with_id(id.clone());
    let (a, b) = tokio::join!(
        w1.start_or_resume::<Message>(options(&raced)),
        w2.start_or_resume::<Message>(options(&raced))
    );
    let won = [&a, &b].iter().filter(|r| r.is_ok()).count();
    assert_eq!(
        won,
        1,
        "exactly one racer holds the session: {:?} / {:?}",
        a.as_ref().err(),
        b.as_ref().err()
    );
    for lost in [a.as_ref().err(), b.as_ref().err()].into_iter().flatten() {
        assert!(
            matches!(lost, DurableError::Store(StoreError::Leased { .. })),
            "the loser is told the session is leased: {lost:?}"
        );
    }
    let bad = StartOptions::<Message>::new().with_id(durable_core::SessionId::new("bad\0id"));
    match next.start_or_resume::<Message>(bad).await {
        Err(DurableError::Store(StoreError::InvalidId { .. })) => {}
        other => panic!("an invalid id must be refused: {:?}", other.err()),
    }
}
