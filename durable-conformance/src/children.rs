//! Cases: child sessions. A parent dropped at any point of a child's start never ends up
//! with two children; a parent that awaits its children holds no lease and is woken by a
//! child's end on another worker; fan-out and fan-in through worker pools; a child's
//! failure, cancellation or `ReplayUnsafe` reaches the parent as its typed outcome, and a
//! replayed parent reads the same one.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::owner;
use super::runtime::{call_and_die, release_dead_lease, spec};
use super::stall::{ChildStall, Probe};
use durable_core::error::DurableError;
use durable_core::journal::CallError;
use durable_core::replay::ReplayClass;
use durable_core::runtime::{Durable, StartOptions};
use durable_core::session::{ChildOutcome, ChildWait};
use durable_core::store::{CheckpointStore, Claim, Resolution, SessionStatus};
use durable_core::transcript::Message;
use durable_core::worker::ShutdownSignal;
use durable_core::{Session, SessionId};

/// A runtime on `store` for one worker: its own owner name, app version `v1`.
pub(super) fn worker(store: &Arc<dyn CheckpointStore>, tag: &str) -> Durable {
    Durable::builder(Arc::clone(store))
        .owner(owner(tag))
        .app_version("v1")
        .build()
}

/// What a child is started with: its number in its state.
fn child_options(n: i64) -> StartOptions<Message> {
    StartOptions::<Message>::new()
        .with_messages(vec![Message::user(format!("part {n}"))])
        .with_state(json!({ "role": "child", "n": n }))
        .with_queue("kids")
}

/// A parent killed at every point around a child's start and re-run by another worker:
/// before the start's row, after it (the child not created), after the child was created
/// (holding its first lease), after that lease was given up (the start's outcome not
/// recorded), and after the outcome was recorded (its reply lost). Each time: exactly one
/// child, the one the re-run's start returns, whose parent link names the parent.
pub async fn children_a_rerun_parent_never_starts_a_second_child(store: Arc<dyn CheckpointStore>) {
    let probe = Probe::new(Arc::clone(&store));
    let probed: Arc<dyn CheckpointStore> = probe.clone();
    let first = worker(&probed, "parent-a");
    let second = worker(&store, "parent-b");
    let points = [
        None,
        Some(ChildStall::BeforeCreate),
        Some(ChildStall::AfterCreate),
        Some(ChildStall::AfterRelease),
        Some(ChildStall::AfterFinish),
    ];
    for point in points {
        let parent = first
            .start::<Message>(StartOptions::new().with_queue("parents"))
            .await
            .expect("start the parent");
        let id = parent.id().clone();
        if let Some(point) = point {
            probe.stall_child_start(point);
            tokio::select! {
                started = parent.spawn_child(child_options(1)) => {
                    panic!("the start at {point:?} was to park, it returned {started:?}")
                }
                () = probe.stalled() => {}
            }
        }
        // The worker dies there: its futures dropped, its lease given up (as its expiry
        // would).
        drop(parent);
        release_dead_lease(&store, &id).await;
        let rerun = second.resume::<Message>(&id).await.expect("resume").session;
        let child = rerun
            .spawn_child(child_options(1))
            .await
            .expect("the re-run's start");
        let children = store.children(&id).await.expect("children");
        assert_eq!(
            children.len(),
            1,
            "a parent killed at {point:?} has {} children",
            children.len()
        );
        assert_eq!(
            children[0].session.id, child,
            "the re-run found the first child ({point:?})"
        );
        assert_eq!(children[0].session.parent.as_ref(), Some(&id));
        // A second start with the same options in the same turn is a second child (its
        // ordinal tells it apart), as two identical tool calls are two calls.
        let other = rerun
            .spawn_child(child_options(1))
            .await
            .expect("a second start");
        assert_ne!(other, child);
        assert_eq!(store.children(&id).await.expect("children").len(), 2);
    }
}

/// Resumes child `id` on `durable`, sets its state to `result` and completes it.
async fn complete_child(durable: &Durable, id: &SessionId, result: Value) {
    let mut child = durable
        .resume::<Message>(id)
        .await
        .expect("resume the child")
        .session;
    assert_eq!(child.state()["role"], "child", "the child's own state");
    child.set_state(result);
    child.complete().await.expect("complete the child");
}

/// A parent that awaits its child gives its lease up and no claim takes it; the child's
/// end, on another worker, makes it claimable at once (long before the recheck), and the
/// replayed turn reads the child's outcome.
pub async fn children_await_releases_the_parent_and_a_child_end_wakes_it(
    store: Arc<dyn CheckpointStore>,
) {
    let parents = worker(&store, "parent");
    let kids = worker(&store, "kid");
    let parent = parents
        .start::<Message>(StartOptions::new().with_queue("parents"))
        .await
        .expect("start the parent");
    let id = parent.id().clone();
    let child = parent.spawn_child(child_options(7)).await.expect("spawn");
    let record = store.session(&child).await.expect("child row");
    assert_eq!(record.parent.as_ref(), Some(&id));
    assert_eq!(record.lease_owner, None, "a child starts released");
    assert_eq!(record.queue, "kids");
    match parent.await_children(std::slice::from_ref(&child)).await {
        Ok(ChildWait::Released) => {}
        other => panic!("awaiting a running child must release the parent, got {other:?}"),
    }
    let waiting = store.session(&id).await.expect("parent row");
    assert_eq!(waiting.status, SessionStatus::Active);
    assert_eq!(
        waiting.lease_owner, None,
        "the waiting parent holds no lease"
    );
    assert!(waiting.waiting_until.is_some(), "the parent waits");
    let claim = Claim::new(owner("pool"), Duration::from_secs(30), 5).with_queues(["parents"]);
    assert_eq!(
        store.claim_expired(&claim).await.expect("claim"),
        None,
        "a parent waiting for its child is not claimed"
    );
    let queues = store.queues().await.expect("queues");
    let parents = queues
        .iter()
        .find(|q| q.name == "parents")
        .expect("the parents' queue");
    assert_eq!(
        (parents.waiting, parents.ready, parents.running),
        (1, 0, 0),
        "the waiting parent is counted as waiting, not ready: {parents:?}"
    );

    complete_child(&kids, &child, json!({ "answer": 42 })).await;
    let woken = store.session(&id).await.expect("parent row");
    assert_eq!(woken.waiting_until, None, "the child's end ends the wait");
    let queues = store.queues().await.expect("queues");
    let parents = queues.iter().find(|q| q.name == "parents").expect("queue");
    assert_eq!(
        (parents.waiting, parents.ready),
        (0, 1),
        "the woken parent is ready: {parents:?}"
    );
    let lease = store
        .claim_expired(&claim)
        .await
        .expect("claim")
        .expect("the woken parent is claimable at once");
    assert_eq!(lease.session, id);
    store.release_lease(&lease).await.expect("release");

    let third = worker(&store, "parent-c");
    let rerun = third.resume::<Message>(&id).await.expect("resume").session;
    let again = rerun.spawn_child(child_options(7)).await.expect("spawn");
    assert_eq!(
        again, child,
        "the replayed start returns the recorded child"
    );
    let ChildWait::Ready { session, outcomes } = rerun
        .await_children(std::slice::from_ref(&child))
        .await
        .expect("await")
    else {
        panic!("a completed child is ready");
    };
    assert_eq!(
        outcomes,
        vec![ChildOutcome::Completed {
            state: json!({ "answer": 42 })
        }]
    );
    session.complete().await.expect("complete the parent");
    assert_eq!(store.children(&id).await.expect("children").len(), 1);
}

/// Fan-out and fan-in through worker pools: a coordinator starts three children and
/// awaits them all; two pools (two workers) run parent and children. Every child runs
/// once (its email sent once), the parent is woken by its children's ends (the recheck
/// is a minute away), and it completes with their results.
pub async fn children_fan_out_and_fan_in_across_workers(store: Arc<dyn CheckpointStore>) {
    let email = spec("email", ReplayClass::UnsafeOnReplay);
    let sent = Arc::new(AtomicUsize::new(0));
    let submitter = worker(&store, "submit");
    let parent = submitter
        .submit(StartOptions::<Message>::new().with_state(json!({ "role": "parent" })))
        .await
        .expect("submit the coordinator");
    let started = Instant::now();
    // The pools stop once the coordinator completed: watched by a task of its own, so
    // that the pools' shutdown futures hold no store connection while they claim.
    let (finished, watch) = tokio::sync::watch::channel(false);
    let watcher = {
        let (store, parent) = (Arc::clone(&store), parent.clone());
        tokio::spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline
                && store.session(&parent).await.expect("parent").status != SessionStatus::Completed
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let _ = finished.send(true);
        })
    };
    let pool = |tag: &str| {
        let durable = Durable::builder(Arc::clone(&store))
            .owner(owner(tag))
            .app_version("v1")
            .child_recheck(Duration::from_secs(60))
            .build();
        let (email, sent) = (email.clone(), Arc::clone(&sent));
        let mut watch = watch.clone();
        async move {
            durable
                .worker(
                    move |resumed: durable_core::Resumed<Message>, _: ShutdownSignal| {
                        let (email, sent) = (email.clone(), Arc::clone(&sent));
                        async move { fan_handler(resumed.session, &email, &sent).await }
                    },
                )
                .concurrency(2)
                .poll_interval(Duration::from_millis(50))
                .run_until(async move {
                    let _ = watch.wait_for(|done| *done).await;
                })
                .await
        }
    };
    let (a, b) = tokio::join!(pool("worker-a"), pool("worker-b"));
    watcher.await.expect("the watcher");
    let record = store.session(&parent).await.expect("parent");
    let probe = if record.status == SessionStatus::Completed {
        String::new()
    } else {
        let claim = Claim::new(owner("probe"), Duration::from_secs(30), 5).with_app_version("v1");
        let claimed = store.claim_expired(&claim).await;
        let resumed = match &claimed {
            Ok(Some(lease)) => {
                store.release_lease(lease).await.expect("release");
                format!(
                    "{:?}",
                    worker(&store, "probe-b")
                        .resume::<Message>(&lease.session)
                        .await
                        .map(|_| ())
                )
            }
            _ => String::new(),
        };
        format!("{record:?} claim: {claimed:?} resume: {resumed}")
    };
    assert_eq!(
        record.status,
        SessionStatus::Completed,
        "the coordinator did not finish in 30 s (pools: {a:?} {b:?}) {probe}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "woken by its children, not by the recheck"
    );
    let children = store.children(&parent).await.expect("children");
    assert_eq!(children.len(), 3, "three children, never more");
    assert!(
        children
            .iter()
            .all(|c| c.session.status == SessionStatus::Completed)
    );
    assert_eq!(
        sent.load(Ordering::SeqCst),
        3,
        "each child's email sent once"
    );
    let last = store.load_checkpoint(&parent, None).await.expect("last");
    assert_eq!(last.state, json!({ "role": "parent", "sum": 30 }));
}

/// The handler of [`children_fan_out_and_fan_in_across_workers`]: a child sends its
/// email and completes with `n * 10`; the parent fans out and in.
async fn fan_handler(
    mut session: Session<Message>,
    email: &durable_core::ToolSpec,
    sent: &Arc<AtomicUsize>,
) -> Result<(), DurableError> {
    if session.state()["role"] == "child" {
        let n = session.state()["n"].as_i64().unwrap_or_default();
        let counter = Arc::clone(sent);
        session
            .journal()
            .tool(email, json!({ "n": n }))
            .run(move |_| {
                counter.fetch_add(1, Ordering::SeqCst);
                async { Ok::<Value, String>(json!({ "sent": true })) }
            })
            .await
            .map_err(|e| match e {
                CallError::Durable(e) => e,
                other => panic!("the email failed: {other}"),
            })?;
        session.set_state(json!({ "role": "child", "answer": n * 10 }));
        session.complete().await?;
        return Ok(());
    }
    let mut children = Vec::new();
    for n in 0..3 {
        children.push(
            session
                .spawn_child(
                    StartOptions::<Message>::new().with_state(json!({ "role": "child", "n": n })),
                )
                .await?,
        );
    }
    match session.await_children(&children).await? {
        ChildWait::Released => Ok(()),
        ChildWait::Ready {
            mut session,
            outcomes,
        } => {
            let sum: i64 = outcomes
                .iter()
                .map(|o| match o {
                    ChildOutcome::Completed { state } => state["answer"].as_i64().unwrap_or(0),
                    other => panic!("a child ended as {other:?}"),
                })
                .sum();
            session.set_state(json!({ "role": "parent", "sum": sum }));
            session.complete().await?;
            Ok(())
        }
    }
}

/// A child's failure, cancellation and `ReplayUnsafe` reach the parent as typed
/// outcomes, recorded in its journal: a replayed parent reads the same outcomes even
/// after the blocked child was resolved and completed.
pub async fn children_failure_cancellation_and_replay_unsafe_reach_the_parent(
    store: Arc<dyn CheckpointStore>,
) {
    let parents = worker(&store, "parent");
    let kids = worker(&store, "kid");
    let parent = parents
        .start::<Message>(StartOptions::new().with_queue("parents"))
        .await
        .expect("start the parent");
    let id = parent.id().clone();
    let mut ids = Vec::new();
    for n in 0..3 {
        ids.push(parent.spawn_child(child_options(n)).await.expect("spawn"));
    }
    // Child 0 fails.
    let failing = kids
        .resume::<Message>(&ids[0])
        .await
        .expect("resume")
        .session;
    failing.fail("boom").await.expect("fail");
    // Child 1 is cancelled by an operator while no worker holds it.
    let cancelled = kids
        .operator()
        .cancel(&ids[1], "not needed")
        .await
        .expect("cancel");
    assert_eq!(cancelled.len(), 1);
    // Child 2 sends an email and dies; the next worker's resume is refused.
    let email = spec("email", ReplayClass::UnsafeOnReplay);
    let effects = Arc::new(AtomicUsize::new(0));
    let dying = kids
        .resume::<Message>(&ids[2])
        .await
        .expect("resume")
        .session;
    call_and_die(&dying, &email, 1, None, &effects).await;
    drop(dying);
    release_dead_lease(&store, &ids[2]).await;
    let refused = worker(&store, "kid-b")
        .resume::<Message>(&ids[2])
        .await
        .expect("resume")
        .session;
    let again = refused
        .journal()
        .tool(&email, json!({ "n": 1 }))
        .run(|_| async { Ok::<Value, String>(json!({ "sent": "again" })) })
        .await;
    assert!(
        matches!(
            again,
            Err(CallError::Durable(DurableError::ReplayUnsafe { .. }))
        ),
        "the in-doubt email is refused: {again:?}"
    );
    refused.release().await.expect("release");

    let ChildWait::Ready { session, outcomes } = parent.await_children(&ids).await.expect("await")
    else {
        panic!("every child has an outcome");
    };
    assert_eq!(
        outcomes[0],
        ChildOutcome::Failed {
            reason: "boom".into()
        }
    );
    match &outcomes[1] {
        ChildOutcome::Cancelled { reason } => {
            assert!(reason.contains("not needed"), "{reason}")
        }
        other => panic!("child 1 was cancelled, read {other:?}"),
    }
    assert_eq!(outcomes[2], ChildOutcome::ReplayUnsafe);
    drop(session);
    release_dead_lease(&store, &id).await;

    // An operator settles child 2, which completes; the parent's replay still reads
    // what it read.
    let doubt = store.in_doubt(Some(&ids[2])).await.expect("in doubt");
    kids.operator()
        .resolve(
            &doubt[0].id,
            Resolution::Happened {
                result: json!({ "sent": "checked" }),
            },
            "ops",
            None,
        )
        .await
        .expect("resolve");
    let mut settled = kids
        .resume::<Message>(&ids[2])
        .await
        .expect("resume the settled child")
        .session;
    let replayed = settled
        .journal()
        .tool(&email, json!({ "n": 1 }))
        .run(|_| async { Ok::<Value, String>(json!({ "sent": "thrice" })) })
        .await
        .expect("the resolution is the email's result");
    assert_eq!(replayed, json!({ "sent": "checked" }));
    settled.set_state(json!({ "late": true }));
    settled
        .complete()
        .await
        .expect("complete the settled child");
    assert_eq!(effects.load(Ordering::SeqCst), 1, "the email was sent once");
    let rerun = worker(&store, "parent-b")
        .resume::<Message>(&id)
        .await
        .expect("resume")
        .session;
    for n in 0..3 {
        assert_eq!(
            rerun.spawn_child(child_options(n)).await.expect("spawn"),
            ids[usize::try_from(n).expect("small")]
        );
    }
    let ChildWait::Ready {
        outcomes: replayed, ..
    } = rerun.await_children(&ids).await.expect("await")
    else {
        panic!("recorded outcomes are ready");
    };
    assert_eq!(
        replayed, outcomes,
        "a replayed parent reads the same outcomes"
    );
}

/// Only a parent's own children can be collected: another session's id is refused, and
/// nothing is journaled.
pub async fn children_only_a_parents_own_children_are_collected(store: Arc<dyn CheckpointStore>) {
    let durable = worker(&store, "parent");
    let parent = durable
        .start::<Message>(StartOptions::new())
        .await
        .expect("start");
    let stranger = durable
        .submit(StartOptions::<Message>::new())
        .await
        .expect("another session");
    let refused = parent.collect_child(&stranger).await;
    assert!(
        matches!(refused, Err(DurableError::NotAChild { .. })),
        "{refused:?}"
    );
    let rows = store.calls(parent.id(), None).await.expect("journal");
    assert!(rows.is_empty(), "nothing journaled: {rows:?}");
}

/// A child started with [`StartOptions::with_spend_charged_to_parent`] is capped at what
/// its parent has left, and its spend is charged to the parent once, when the parent
/// collects its outcome: a re-run parent reads the collection back and is not charged
/// again, and the parent's next call is refused once the child's spend reached its
/// ceiling. A child started without it costs the parent nothing.
pub async fn children_spend_is_charged_to_the_parent_once_when_asked(
    store: Arc<dyn CheckpointStore>,
) {
    use durable_core::snapshot::{Budget, Limit, Spend};

    let cents = |n: u64| Spend::from_nano_usd(n * 10_000_000, 100, 10);
    let ask = |session: &Session<Message>, spend: Spend| {
        let journal = session.journal().clone();
        async move {
            journal
                .model_with_spend(
                    || async { Ok::<_, String>(json!({ "reply": "ok" })) },
                    move |_| Some(spend),
                )
                .await
        }
    };
    let first = worker(&store, "parent-a");
    let second = worker(&store, "parent-b");
    let kids = worker(&store, "kid");
    let parent = first
        .start::<Message>(
            StartOptions::new()
                .with_budget(Budget::unlimited().with_limit_nano_usd(100 * 10_000_000)),
        )
        .await
        .expect("start the parent");
    let id = parent.id().clone();
    ask(&parent, cents(60))
        .await
        .expect("the parent's own reply");
    let charged = parent
        .spawn_child(
            child_options(1)
                .with_budget(Budget::unlimited().with_limit_nano_usd(50 * 10_000_000))
                .with_spend_charged_to_parent(),
        )
        .await
        .expect("start a child charged to the parent");
    let free = parent
        .spawn_child(child_options(2))
        .await
        .expect("start a child of its own budget");

    // The charged child may spend what the parent has left (40 cents), not its own 50.
    let child_budget: Budget = serde_json::from_value(
        store
            .load_checkpoint(&charged, None)
            .await
            .expect("the child's checkpoint")
            .budget,
    )
    .expect("budget decodes");
    assert_eq!(child_budget.limit(&Limit::Usd), Some(40 * 10_000_000));
    assert!(child_budget.charged_to_parent);

    for (child, spend) in [(&charged, 30), (&free, 25)] {
        let mut session = kids
            .resume::<Message>(child)
            .await
            .expect("resume the child")
            .session;
        ask(&session, cents(spend))
            .await
            .expect("the child's reply");
        session.set_state(json!({ "spent": spend }));
        session.complete().await.expect("complete the child");
    }

    let outcome = parent.collect_child(&charged).await.expect("collect");
    assert!(outcome.is_some_and(|o| o.is_completed()));
    parent
        .collect_child(&free)
        .await
        .expect("collect")
        .expect("an outcome");
    assert_eq!(
        parent.budget().spent_nano_usd,
        90 * 10_000_000,
        "the parent's 60 cents and the charged child's 30, not the free child's 25"
    );

    // The parent dies before its checkpoint; another worker re-runs the turn.
    drop(parent);
    release_dead_lease(&store, &id).await;
    let rerun = second.resume::<Message>(&id).await.expect("resume").session;
    ask(&rerun, cents(60)).await.expect("the reply, replayed");
    assert_eq!(
        rerun
            .spawn_child(
                child_options(1)
                    .with_budget(Budget::unlimited().with_limit_nano_usd(50 * 10_000_000))
                    .with_spend_charged_to_parent()
            )
            .await
            .expect("the start, replayed"),
        charged
    );
    assert_eq!(
        rerun.spawn_child(child_options(2)).await.expect("replayed"),
        free
    );
    rerun
        .collect_child(&charged)
        .await
        .expect("replayed")
        .expect("recorded");
    rerun
        .collect_child(&free)
        .await
        .expect("replayed")
        .expect("recorded");
    assert_eq!(
        rerun.budget().spent_nano_usd,
        90 * 10_000_000,
        "the collection replayed is charged once"
    );
    assert_eq!(store.children(&id).await.expect("children").len(), 2);

    // 10 cents left: a reply costing 10 reaches the ceiling, and the next call is refused.
    ask(&rerun, cents(10)).await.expect("the last 10 cents");
    match ask(&rerun, cents(1)).await {
        Err(CallError::Durable(DurableError::BudgetExceeded(refused))) => {
            assert_eq!(refused.limit, Limit::Usd);
            assert_eq!(refused.spent, 100 * 10_000_000);
        }
        other => panic!("expected the parent's ceiling to refuse the call, got {other:?}"),
    }
}

/// A fork of a parent that started a child re-runs the start and gets the parent's child
/// back (a fork never repeats its parent's effects: no second child), and collects that
/// child's outcome as its own, since its journal holds the start.
pub async fn children_a_fork_collects_the_children_its_origin_started(
    store: Arc<dyn CheckpointStore>,
) {
    let parents = worker(&store, "parent");
    let kids = worker(&store, "kid");
    let parent = parents
        .start::<Message>(StartOptions::new().with_queue("parents"))
        .await
        .expect("start the parent");
    let id = parent.id().clone();
    let child = parent
        .spawn_child(child_options(1))
        .await
        .expect("start the child");
    complete_child(&kids, &child, json!({ "role": "child", "answer": 42 })).await;
    // The parent's worker dies before it collects; an operator forks the turn.
    drop(parent);
    release_dead_lease(&store, &id).await;
    let fork = worker(&store, "operator")
        .operator()
        .fork::<Message>(&id, 0, None)
        .await
        .expect("fork the parent at its start");
    let fork_id = fork.id().clone();
    assert_eq!(
        fork.spawn_child(child_options(1))
            .await
            .expect("the start, inherited"),
        child,
        "the fork's re-run start returns the parent's child"
    );
    let outcome = fork
        .collect_child(&child)
        .await
        .expect("a fork collects the child its origin started");
    assert_eq!(
        outcome,
        Some(ChildOutcome::Completed {
            state: json!({ "role": "child", "answer": 42 })
        })
    );
    match fork.await_children(std::slice::from_ref(&child)).await {
        Ok(ChildWait::Ready { outcomes, .. }) => {
            assert!(outcomes[0].is_completed(), "{outcomes:?}");
        }
        Ok(ChildWait::Released) => panic!("the child has ended: nothing to wait for"),
        Err(e) => panic!("await: {e}"),
    }
    assert_eq!(store.children(&id).await.expect("children").len(), 1);
    assert!(
        store.children(&fork_id).await.expect("children").is_empty(),
        "no second child"
    );
}
