//! Budget cases: ceilings checked by the journal before a fresh model or tool call (the
//! refusal is typed and nothing runs), spend and call counts charged exactly once per
//! journal row under replay, re-runs after a crash, forks and approvals, and an
//! operator's raise that puts a session parked at its ceiling back to work.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Value, json};

use durable_core::error::{DurableError, StoreError};
use durable_core::journal::CallError;
use durable_core::replay::ReplayClass;
use durable_core::runtime::{Durable, StartOptions};
use durable_core::session::Session;
use durable_core::snapshot::{Budget, BudgetExceeded, Limit, Spend};
use durable_core::store::{CheckpointStore, RaiseLimit, SessionStatus};
use durable_core::transcript::Message;

use super::runtime::{GIVE_UP, call, call_and_die, runtime, spec, take_over};

/// Starts a session with `budget`.
async fn start_with(durable: &Durable, budget: Budget) -> Session<Message> {
    durable
        .start::<Message>(StartOptions::new().with_budget(budget))
        .await
        .expect("start a session")
}

/// Asks the "model" (counted in `asked`), each reply costing `spend`.
async fn ask(
    session: &Session<Message>,
    asked: &Arc<AtomicUsize>,
    spend: Spend,
) -> Result<Value, CallError<String>> {
    let asked = Arc::clone(asked);
    session
        .journal()
        .model_with_spend(
            move || async move {
                let n = asked.fetch_add(1, Ordering::SeqCst);
                Ok::<_, String>(json!({ "reply": n }))
            },
            move |_| Some(spend),
        )
        .await
}

/// The refusal inside a call error, or a panic naming what came instead.
fn refusal<T: std::fmt::Debug>(result: Result<T, CallError<String>>) -> BudgetExceeded {
    match result {
        Err(CallError::Durable(DurableError::BudgetExceeded(refused))) => refused,
        other => panic!("expected a budget refusal, got {other:?}"),
    }
}

async fn rows(store: &Arc<dyn CheckpointStore>, session: &durable_core::SessionId) -> usize {
    store.calls(session, None).await.expect("calls").len()
}

async fn checkpointed(
    store: &Arc<dyn CheckpointStore>,
    session: &durable_core::SessionId,
) -> Budget {
    let checkpoint = store.load_checkpoint(session, None).await.expect("load");
    serde_json::from_value(checkpoint.budget).expect("budget decodes")
}

fn cents(n: u64) -> Spend {
    Spend::from_nano_usd(n * 10_000_000, 100, 10)
}

/// Every ceiling, reached mid-turn, refuses the next call before it runs: the model is
/// not asked, the tool body does not run, nothing is journaled, and the refusal names
/// the limit, what was spent and what was asked. Other calls still run.
pub async fn budget_ceiling_reached_mid_turn_refuses_the_next_call_and_runs_nothing(
    store: Arc<dyn CheckpointStore>,
) {
    let (durable, _) = runtime(&store, "first");
    let asked = Arc::new(AtomicUsize::new(0));
    let runs = Arc::new(AtomicUsize::new(0));

    // Model calls.
    let session = start_with(&durable, Budget::unlimited().with_limit_model_calls(2)).await;
    ask(&session, &asked, Spend::ZERO).await.expect("first");
    ask(&session, &asked, Spend::ZERO).await.expect("second");
    let refused = refusal(ask(&session, &asked, Spend::ZERO).await);
    assert_eq!(
        (
            &refused.limit,
            refused.ceiling,
            refused.spent,
            refused.asked
        ),
        (&Limit::ModelCalls, 2, 2, Some(1))
    );
    assert_eq!(refused.session.as_ref(), Some(session.id()));
    assert_eq!(asked.load(Ordering::SeqCst), 2, "the model was not asked");
    assert_eq!(rows(&store, session.id()).await, 2, "nothing journaled");
    assert!(
        refused.to_string().contains(&format!(
            "durable budget raise {} model_calls",
            session.id()
        )),
        "the refusal says how to raise it: {refused}"
    );
    // Tool calls still run: the ceiling is on model calls.
    call(&session, &spec("read", ReplayClass::Pure), 1, None, &runs)
        .await
        .expect("a tool call is not a model call");

    // Dollars: reached exactly (no float drift), the next paid call is refused.
    let session = start_with(
        &durable,
        Budget::unlimited().with_limit_nano_usd(cents(30).nano_usd()),
    )
    .await;
    ask(&session, &asked, cents(10)).await.expect("10 cents");
    ask(&session, &asked, cents(20)).await.expect("20 cents");
    let before = asked.load(Ordering::SeqCst);
    let refused = refusal(ask(&session, &asked, cents(1)).await);
    assert_eq!(
        (&refused.limit, refused.spent, refused.asked),
        (&Limit::Usd, cents(30).nano_usd(), None)
    );
    assert_eq!(asked.load(Ordering::SeqCst), before);
    let refused = refusal(call(&session, &spec("read", ReplayClass::Pure), 2, None, &runs).await);
    assert_eq!(refused.limit, Limit::Usd, "money binds tool calls too");

    // Tokens (input + output).
    let session = start_with(&durable, Budget::unlimited().with_limit_tokens(220)).await;
    ask(&session, &asked, cents(0)).await.expect("110 tokens");
    ask(&session, &asked, cents(0)).await.expect("220 tokens");
    let refused = refusal(ask(&session, &asked, cents(0)).await);
    assert_eq!((&refused.limit, refused.spent), (&Limit::Tokens, 220));

    // Tool calls, all tools and one tool; the body does not run, no row is written.
    let email = spec("email", ReplayClass::UnsafeOnReplay);
    let charge = spec("charge", ReplayClass::IdempotentWithKey);
    let read = spec("read", ReplayClass::Pure);
    let session = start_with(
        &durable,
        Budget::unlimited()
            .with_limit_tool_calls(3)
            .with_limit_tool("email", 1),
    )
    .await;
    let ran = runs.load(Ordering::SeqCst);
    call(&session, &email, 1, None, &runs).await.expect("email");
    let refused = refusal(call(&session, &email, 2, None, &runs).await);
    assert_eq!(
        (
            &refused.limit,
            refused.ceiling,
            refused.spent,
            refused.asked
        ),
        (&Limit::Tool("email".into()), 1, 1, Some(1))
    );
    call(&session, &charge, 3, Some("k-3"), &runs)
        .await
        .expect("charge");
    call(&session, &read, 4, None, &runs).await.expect("read");
    for (class_spec, key) in [(&read, None), (&charge, Some("k-5")), (&email, None)] {
        let refused = refusal(call(&session, class_spec, 5, key, &runs).await);
        assert!(
            matches!(refused.limit, Limit::ToolCalls | Limit::Tool(_)),
            "{refused}"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), ran + 3, "no refused body ran");
    assert_eq!(
        rows(&store, session.id()).await,
        3,
        "no refused call journaled"
    );
    let budget = session.budget();
    assert_eq!((budget.tool_calls, budget.tool_count("email")), (3, 1));

    // Wall time since the session started.
    let session = start_with(
        &durable,
        Budget::unlimited().with_limit_wall_time(Duration::ZERO),
    )
    .await;
    let refused = refusal(call(&session, &read, 1, None, &runs).await);
    assert_eq!(refused.limit, Limit::WallTime);
    let session = start_with(
        &durable,
        Budget::unlimited().with_limit_wall_time(Duration::from_secs(3600)),
    )
    .await;
    call(&session, &read, 1, None, &runs)
        .await
        .expect("an hour is plenty");
}

/// A turn replayed after a crash returns its recorded replies and results, charged once
/// and never refused (even at the ceiling they reached); the next fresh call is refused,
/// and the checkpoint carries exactly what was spent.
pub async fn budget_replay_is_charged_once_and_never_refused(store: Arc<dyn CheckpointStore>) {
    let (durable, _) = runtime(&store, "first");
    let budget = Budget::unlimited()
        .with_limit_model_calls(2)
        .with_limit_tool_calls(1)
        .with_limit_nano_usd(cents(20).nano_usd());
    let session = start_with(&durable, budget).await;
    let asked = Arc::new(AtomicUsize::new(0));
    let runs = Arc::new(AtomicUsize::new(0));
    let charge = spec("charge", ReplayClass::IdempotentWithKey);
    let first = ask(&session, &asked, cents(10)).await.expect("first");
    call(&session, &charge, 1, Some("k-1"), &runs)
        .await
        .expect("charge");
    let second = ask(&session, &asked, cents(10)).await.expect("second");
    let id = session.id().clone();
    drop(session); // crash before the checkpoint

    for worker in ["second", "third"] {
        let (resumed, _) = take_over(&store, &id, worker).await;
        let mut session = resumed.session;
        // Past a ceiling now (no time left): the recorded calls still replay.
        let mut past = session.budget();
        past.limit_wall_ms = Some(0);
        session.set_budget(past);
        assert_eq!(
            ask(&session, &asked, cents(99)).await.expect("replay"),
            first
        );
        call(&session, &charge, 1, Some("k-1"), &runs)
            .await
            .expect("the recorded result, at the tool ceiling");
        assert_eq!(
            ask(&session, &asked, cents(99)).await.expect("replay"),
            second,
            "a recorded reply is never refused, even at the ceilings it reached"
        );
        // Replaying the same rows again in one attempt charges nothing more.
        let budget = session.budget();
        assert_eq!(
            (budget.model_calls, budget.tool_calls, budget.spent_nano_usd),
            (2, 1, cents(20).nano_usd()),
            "charged once per row"
        );
        assert_eq!(
            refusal(ask(&session, &asked, cents(1)).await).limit,
            Limit::Usd
        );
        drop(session);
    }
    assert_eq!(
        asked.load(Ordering::SeqCst),
        2,
        "the model was asked twice in all"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let (resumed, _) = take_over(&store, &id, "fourth").await;
    let mut session = resumed.session;
    ask(&session, &asked, cents(99)).await.expect("replay");
    call(&session, &charge, 1, Some("k-1"), &runs)
        .await
        .expect("replay");
    ask(&session, &asked, cents(99)).await.expect("replay");
    session.checkpoint().await.expect("checkpoint");
    let stored = checkpointed(&store, &id).await;
    assert_eq!(
        (stored.model_calls, stored.tool_calls, stored.spent_nano_usd),
        (2, 1, cents(20).nano_usd())
    );
    assert_eq!(stored.tool_count("charge"), 1);
    assert_eq!(stored.total_tokens(), 220);
}

/// What was paid again is charged again: a call in doubt re-run after a crash and a
/// reply asked anew (the first was never recorded) each count once, as the run that
/// recorded them; the crashed attempts that recorded nothing are not charged (no row
/// says what they cost).
pub async fn budget_rerun_after_a_crash_counts_what_was_paid_again(
    store: Arc<dyn CheckpointStore>,
) {
    let (durable, _) = runtime(&store, "first");
    let session = start_with(&durable, Budget::unlimited().with_limit_tool_calls(1)).await;
    let charge = spec("charge", ReplayClass::IdempotentWithKey);
    let effects = Arc::new(AtomicUsize::new(0));
    call_and_die(&session, &charge, 1, Some("k-1"), &effects).await;
    // The model is asked, and the process dies before its reply is recorded.
    let asked = Arc::new(AtomicUsize::new(0));
    let hanging = Arc::clone(&asked);
    let cancelled = tokio::time::timeout(
        Duration::from_millis(50),
        session.journal().model_with_spend(
            move || async move {
                hanging.fetch_add(1, Ordering::SeqCst);
                std::future::pending::<Result<Value, String>>().await
            },
            |_| Some(cents(5)),
        ),
    )
    .await;
    assert!(cancelled.is_err(), "the model call hangs until cancelled");
    let id = session.id().clone();
    drop(session);

    let (resumed, _) = take_over(&store, &id, "second").await;
    let mut session = resumed.session;
    assert_eq!(resumed.report.in_doubt.len(), 1);
    let runs = Arc::clone(&effects);
    call(&session, &charge, 1, Some("k-1"), &runs)
        .await
        .expect("re-run with its recorded key, under the ceiling");
    assert_eq!(effects.load(Ordering::SeqCst), 2, "re-executed");
    ask(&session, &asked, cents(5)).await.expect("asked anew");
    assert_eq!(asked.load(Ordering::SeqCst), 2, "paid twice");
    let budget = session.budget();
    assert_eq!(
        (budget.tool_calls, budget.model_calls, budget.spent_nano_usd),
        (1, 1, cents(5).nano_usd())
    );
    // At the tool ceiling now: a new call is refused.
    assert_eq!(
        refusal(call(&session, &charge, 2, Some("k-2"), &runs).await).limit,
        Limit::ToolCalls
    );
    session.checkpoint().await.expect("checkpoint");
    let stored = checkpointed(&store, &id).await;
    assert_eq!(
        (stored.tool_calls, stored.model_calls, stored.spent_nano_usd),
        (1, 1, cents(5).nano_usd())
    );
}

/// A fork starts from its parent's budget at the fork point; an effect it inherits and
/// replays is charged to it once (never refused), a new one is checked against the
/// ceilings; the parent's own budget is untouched.
pub async fn budget_fork_counts_inherited_effects_once(store: Arc<dyn CheckpointStore>) {
    let (durable, _) = runtime(&store, "first");
    let mut session = start_with(&durable, Budget::unlimited().with_limit_tool_calls(2)).await;
    let charge = spec("charge", ReplayClass::IdempotentWithKey);
    let runs = Arc::new(AtomicUsize::new(0));
    call(&session, &charge, 1, Some("k-1"), &runs)
        .await
        .expect("first");
    session.checkpoint().await.expect("v1");
    call(&session, &charge, 2, Some("k-2"), &runs)
        .await
        .expect("second");
    let parent = session.id().clone();
    drop(session); // the parent dies mid-turn

    let mut fork: Session<Message> = durable
        .operator()
        .fork(&parent, 1, None)
        .await
        .expect("fork at v1");
    assert_eq!(fork.budget().tool_calls, 1, "the parent's budget at v1");
    call(&fork, &charge, 2, Some("k-2"), &runs)
        .await
        .expect("the inherited effect comes back");
    assert_eq!(runs.load(Ordering::SeqCst), 2, "never run again");
    assert_eq!(fork.budget().tool_calls, 2, "charged to the fork once");
    let refused = refusal(call(&fork, &charge, 3, Some("k-3"), &runs).await);
    assert_eq!(
        (&refused.limit, refused.spent),
        (&Limit::ToolCalls, 2),
        "a new effect is checked"
    );
    fork.checkpoint().await.expect("fork checkpoint");
    assert_eq!(checkpointed(&store, fork.id()).await.tool_calls, 2);
    assert_eq!(
        checkpointed(&store, &parent).await.tool_calls,
        1,
        "the parent's checkpoint is untouched"
    );
}

/// A call awaiting approval runs nothing and counts nothing; approved, it is checked and
/// counted when it runs, once, however often its turn is replayed.
pub async fn budget_approved_call_is_counted_once_when_it_runs(store: Arc<dyn CheckpointStore>) {
    let (durable, _) = runtime(&store, "first");
    let session = start_with(&durable, Budget::unlimited().with_limit_tool_calls(1)).await;
    let refund = spec("refund", ReplayClass::UnsafeOnReplay);
    let runs = Arc::new(AtomicUsize::new(0));
    let asked = |session: &Session<Message>| {
        let runs = Arc::clone(&runs);
        let refund = refund.clone();
        let journal = session.journal().clone();
        async move {
            journal
                .tool(&refund, json!({"n": 1}))
                .require_approval(durable_core::approval::tool_rule(&refund))
                .run(move |ctx| super::runtime::body(ctx, Arc::clone(&runs), 1))
                .await
        }
    };
    let requested = match asked(&session).await {
        Err(CallError::Durable(DurableError::AwaitingApproval { call, .. })) => call,
        other => panic!("awaiting approval expected, got {other:?}"),
    };
    assert_eq!(session.budget().tool_calls, 0, "a request runs nothing");
    let id = session.id().clone();
    session.await_approval().await.expect("park");
    durable
        .operator()
        .approve(&requested, None, "alice", None)
        .await
        .expect("approve");

    for worker in ["second", "third"] {
        let session = if worker == "second" {
            // Approved: active, no lease held.
            runtime(&store, worker)
                .0
                .resume::<Message>(&id)
                .await
                .expect("resume")
                .session
        } else {
            take_over(&store, &id, worker).await.0.session
        };
        asked(&session).await.expect("the approved call");
        assert_eq!(runs.load(Ordering::SeqCst), 1, "ran once");
        assert_eq!(session.budget().tool_calls, 1, "counted once");
        let read = spec("read", ReplayClass::Pure);
        assert_eq!(
            refusal(call(&session, &read, 9, None, &runs).await).limit,
            Limit::ToolCalls
        );
        drop(session);
    }
}

/// An operator's raise is audited, never lowers a ceiling, and puts a session parked at
/// its ceiling back to work: active again, resumed, its turn replayed and the refused
/// call run. A bad raise writes nothing.
pub async fn budget_raise_unparks_the_session_and_the_call_runs(store: Arc<dyn CheckpointStore>) {
    let (durable, _) = runtime(&store, "first");
    let session = start_with(&durable, Budget::unlimited().with_limit_model_calls(1)).await;
    let asked = Arc::new(AtomicUsize::new(0));
    let first = ask(&session, &asked, cents(1)).await.expect("first");
    let refused = refusal(ask(&session, &asked, cents(1)).await);
    let id = session.id().clone();
    session.park_for_budget(&refused).await.expect("park");
    let parked = store.session(&id).await.expect("session");
    assert_eq!(parked.status, SessionStatus::Parked);
    assert!(
        parked
            .status_reason
            .as_deref()
            .is_some_and(|r| r.starts_with(durable_core::PARKED_FOR_BUDGET)),
        "{parked:?}"
    );
    let now = store.now().await.expect("now");
    assert!(
        parked.lease_expires_at.is_none_or(|at| at <= now),
        "the lease is given up: {parked:?}"
    );
    assert!(
        runtime(&store, "eager")
            .0
            .resume::<Message>(&id)
            .await
            .is_err(),
        "a parked session is not resumed"
    );

    // Bad raises write nothing.
    let operator = durable.operator();
    let unknown = durable_core::SessionId::new(format!("{id}-missing"));
    assert!(matches!(
        operator
            .raise_limit(&unknown, Limit::ModelCalls, 5, "alice", None)
            .await,
        Err(DurableError::Store(StoreError::SessionNotFound(_)))
    ));
    assert!(matches!(
        store
            .raise_limit(RaiseLimit::new(
                id.clone(),
                Limit::ModelCalls,
                5,
                "bad\u{7}name"
            ))
            .await,
        Err(StoreError::InvalidId { .. })
    ));
    assert!(matches!(
        store
            .raise_limit(RaiseLimit::new(id.clone(), Limit::Usd, u64::MAX, "alice"))
            .await,
        Err(StoreError::InvalidRaise { .. })
    ));
    assert!(store.limit_raises(&id).await.expect("raises").is_empty());
    assert_eq!(
        store.session(&id).await.expect("session").status,
        SessionStatus::Parked
    );

    let before = store.now().await.expect("now");
    let raised = operator
        .raise_limit(
            &id,
            Limit::ModelCalls,
            2,
            "alice",
            Some("the customer agreed"),
        )
        .await
        .expect("raise");
    assert_eq!(
        (&raised.limit, raised.ceiling, raised.by.as_str()),
        (&Limit::ModelCalls, 2, "alice")
    );
    // A lower raise afterwards never lowers the ceiling.
    operator
        .raise_limit(&id, Limit::ModelCalls, 1, "bob", None)
        .await
        .expect("a lower raise is recorded");
    let audit = store.limit_raises(&id).await.expect("raises");
    assert_eq!(audit.len(), 2);
    assert_eq!(audit[0], raised, "read back as written, oldest first");
    assert_eq!(audit[0].note.as_deref(), Some("the customer agreed"));
    assert!(audit[0].at >= before - super::CLOCK_SLACK_MS);
    assert_eq!(audit[1].by, "bob");
    assert_eq!(
        store.session(&id).await.expect("session").status,
        SessionStatus::Active,
        "the session parked for its budget is active again"
    );
    let standing = operator.budget(&id).await.expect("budget");
    let ceiling = standing
        .ceilings
        .iter()
        .find(|c| c.limit == Limit::ModelCalls)
        .expect("model-call ceiling");
    assert_eq!(
        (ceiling.spent, ceiling.ceiling),
        (1, 2),
        "the turn under way counted, the raise applied"
    );

    let (durable2, _) = runtime(&store, "second");
    let mut session = tokio::time::timeout(GIVE_UP, durable2.resume::<Message>(&id))
        .await
        .expect("resume in time")
        .expect("resume")
        .session;
    assert_eq!(
        ask(&session, &asked, cents(1)).await.expect("replay"),
        first
    );
    ask(&session, &asked, cents(1))
        .await
        .expect("the refused call runs after the raise");
    assert_eq!(asked.load(Ordering::SeqCst), 2);
    assert_eq!(
        refusal(ask(&session, &asked, cents(1)).await).ceiling,
        2,
        "the raised ceiling binds in turn"
    );
    session.checkpoint().await.expect("checkpoint");
    let stored = checkpointed(&store, &id).await;
    assert_eq!(
        (stored.model_calls, stored.limit_model_calls),
        (2, Some(2)),
        "the checkpoint carries the raised ceiling"
    );

    // A raise for a session parked for another reason leaves it parked.
    let other = start_with(&durable, Budget::unlimited()).await;
    let other_id = other.id().clone();
    other.park("a poison pill").await.expect("park");
    operator
        .raise_limit(&other_id, Limit::Usd, 1, "alice", None)
        .await
        .expect("raise");
    assert_eq!(
        store.session(&other_id).await.expect("session").status,
        SessionStatus::Parked
    );
}
