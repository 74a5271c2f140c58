//! Cases: forking a session from one of its checkpoints.

use std::sync::Arc;

use serde_json::json;

use super::checkpoints::{load, values};
use super::{LONG_TTL, checkpoint, create, expect_err, message, owner, read, session_id};
use durable_core::error::DurableError;
use durable_core::error::StoreError;
use durable_core::store::{CallStatus, CheckpointStore, CheckpointStoreExt, SessionStatus};

/// A fork's version 0 equals the source version; the source is untouched, the fork is
/// leased to the given owner and its log is its own.
pub async fn fork_copies_version_and_leaves_source_untouched(store: Arc<dyn CheckpointStore>) {
    let (source, lease) = create(&*store, &owner("w")).await;
    for v in 0..3 {
        store
            .save_checkpoint(
                lease.fence(),
                v,
                checkpoint(&format!("s{v}"), vec![message(2 + v as usize)]),
            )
            .await
            .expect("save_checkpoint");
    }
    let source_before = read(&*store, &source.id).await;
    let source_list = store
        .list_checkpoints(&source.id)
        .await
        .expect("list_checkpoints");
    let at = load(&*store, &source.id, Some(2)).await;

    let fork_id = session_id();
    let forker = owner("forker");
    let (fork, fork_lease) = store
        .fork_session(&source.id, 2, &fork_id, &forker, LONG_TTL)
        .await
        .expect("fork_session");
    assert_eq!(fork.id, fork_id, "fork id");
    assert_eq!(fork.status, SessionStatus::Active, "fork status");
    assert_eq!(fork.app_version, source.app_version, "fork app_version");
    assert_eq!(
        fork.metadata, source.metadata,
        "fork metadata (copied from the source)"
    );
    assert_eq!(fork.latest_version, 0, "fork latest_version");
    assert_eq!(
        fork.lease_owner.as_deref(),
        Some(forker.as_str()),
        "fork lease owner"
    );
    assert_eq!(fork.fence, fork_lease.fence, "fork fence");
    assert_eq!(
        fork.lease_expires_at,
        Some(fork_lease.expires_at),
        "fork expiry"
    );
    assert_eq!(
        (fork_lease.session.clone(), fork_lease.owner.clone()),
        (fork_id.clone(), forker.clone()),
        "fork lease"
    );
    assert_eq!(read(&*store, &fork_id).await, fork, "session() of the fork");

    let v0 = load(&*store, &fork_id, Some(0)).await;
    assert_eq!(v0.messages, at.messages, "fork transcript");
    assert_eq!(
        (&v0.plan, &v0.budget, &v0.state),
        (&at.plan, &at.budget, &at.state),
        "fork snapshots"
    );
    assert_eq!(v0.meta.version, 0, "fork version");
    assert_eq!(
        v0.meta.message_count, at.meta.message_count,
        "fork message_count"
    );
    assert_eq!(
        store.list_checkpoints(&fork_id).await.expect("list").len(),
        1,
        "fork has one checkpoint"
    );

    // Both logs grow independently.
    store
        .save_checkpoint(
            fork_lease.fence(),
            0,
            checkpoint("f1", vec![json!("fork only")]),
        )
        .await
        .expect("save_checkpoint on the fork");
    let mut expected = values(&at);
    expected.push(json!("fork only"));
    assert_eq!(
        values(&load(&*store, &fork_id, None).await),
        expected,
        "fork after a save"
    );
    assert_eq!(
        read(&*store, &source.id).await,
        source_before,
        "fork changed the source session"
    );
    assert_eq!(
        store.list_checkpoints(&source.id).await.expect("list"),
        source_list,
        "fork changed the source's checkpoints"
    );
    let latest = load(&*store, &source.id, None).await;
    assert_eq!(
        values(&latest),
        (0..5).map(message).collect::<Vec<_>>(),
        "fork changed the source's transcript"
    );
    store
        .save_checkpoint(
            lease.fence(),
            3,
            checkpoint("s3", vec![json!("source only")]),
        )
        .await
        .expect("save_checkpoint on the source after the fork");
    assert_eq!(
        values(&load(&*store, &fork_id, None).await),
        expected,
        "a source save leaked into the fork"
    );

    let again = store
        .fork_session(&source.id, 1, &fork_id, &owner("x"), LONG_TTL)
        .await;
    expect_err!(
        again,
        StoreError::SessionExists(_),
        "fork_session into an existing id"
    );
}

/// Forking a missing version (or session) is refused and creates nothing.
pub async fn fork_missing_version_is_refused(store: Arc<dyn CheckpointStore>) {
    let (source, _) = create(&*store, &owner("w")).await;
    let target = session_id();
    let (s, v) = expect_err!(
        store.fork_session(&source.id, 5, &target, &owner("f"), LONG_TTL).await,
        StoreError::VersionNotFound { session, version } => (session, version),
        "fork_session of version 5 when only version 0 exists"
    );
    assert_eq!((s, v), (source.id.clone(), 5), "VersionNotFound fields");
    expect_err!(
        store.session(&target).await,
        StoreError::SessionNotFound(_),
        "a refused fork created its target"
    );
    expect_err!(
        store
            .fork_session(&session_id(), 0, &target, &owner("f"), LONG_TTL)
            .await,
        StoreError::SessionNotFound(_) | StoreError::VersionNotFound { .. },
        "fork_session of a missing session"
    );
    expect_err!(
        store.session(&target).await,
        StoreError::SessionNotFound(_),
        "a refused fork created its target"
    );
}

/// An effect ledger: how many times each `(tool, n)` intent really ran.
#[derive(Clone, Default)]
struct Ledger(Arc<std::sync::Mutex<std::collections::HashMap<(String, i64), usize>>>);

impl Ledger {
    fn count(&self, tool: &str, n: i64) -> usize {
        let map = self.0.lock().expect("ledger lock");
        map.get(&(tool.to_owned(), n)).copied().unwrap_or(0)
    }

    fn duplicates(&self) -> Vec<((String, i64), usize)> {
        let map = self.0.lock().expect("ledger lock");
        let mut dup: Vec<_> = map
            .iter()
            .filter(|(_, c)| **c > 1)
            .map(|(k, c)| (k.clone(), *c))
            .collect();
        dup.sort();
        dup
    }

    /// Runs `spec(n)` in `session`'s current step, writing the effect to the ledger when
    /// the body runs.
    async fn call(
        &self,
        session: &durable_core::Session<durable_core::Message>,
        spec: &durable_core::ToolSpec,
        n: i64,
    ) -> Result<serde_json::Value, durable_core::CallError<String>> {
        let mut call = session.journal().tool(spec, json!({ "n": n }));
        if spec.class == durable_core::ReplayClass::IdempotentWithKey {
            call = call.key(format!("key-{n}"));
        }
        let ledger = self.clone();
        let tool = spec.name.clone();
        call.run(move |_| {
            let ledger = ledger.clone();
            let tool = tool.clone();
            async move {
                *ledger
                    .0
                    .lock()
                    .expect("ledger lock")
                    .entry((tool, n))
                    .or_default() += 1;
                Ok::<_, String>(json!({ "n": n }))
            }
        })
        .await
    }
}

fn email() -> durable_core::ToolSpec {
    super::runtime::spec("email", durable_core::ReplayClass::UnsafeOnReplay)
}

fn charge() -> durable_core::ToolSpec {
    super::runtime::spec("charge", durable_core::ReplayClass::IdempotentWithKey)
}

/// The ledger case: the parent completes effects after version 1 (an email and a
/// keyed charge in the turn from version 1, another email in the next turn). A fork at
/// version 1 re-runs the turn: each recorded effect comes back recorded, the next turn's
/// email is refused as the parent's (`InheritedEffect`), a new email runs. A second fork,
/// of the parent and of the fork, does the same. Every intent ran once.
pub async fn fork_never_repeats_a_parent_effect_after_the_fork_point(
    store: Arc<dyn CheckpointStore>,
) {
    use super::runtime::{runtime, start};
    let ledger = Ledger::default();
    let (durable, _) = runtime(&store, "parent");
    let mut parent = start(&durable).await;
    parent.checkpoint().await.expect("v1");
    let first = ledger.call(&parent, &email(), 1).await.expect("email 1");
    ledger.call(&parent, &charge(), 1).await.expect("charge 1");
    parent.checkpoint().await.expect("v2");
    ledger.call(&parent, &email(), 2).await.expect("email 2");
    parent.checkpoint().await.expect("v3");
    // The same intent in a later turn: a second carried row of the same identity but
    // the step.
    ledger
        .call(&parent, &email(), 2)
        .await
        .expect("email 2 again");
    parent.checkpoint().await.expect("v4");
    let id = parent.id().clone();
    parent.release().await.expect("release");

    let (operator, _) = runtime(&store, "operator");
    let plan = operator
        .operator()
        .fork_plan(&id, 1, &[])
        .await
        .expect("fork plan");
    let fates: Vec<_> = plan
        .entries
        .iter()
        .map(|e| (e.tool.as_str(), e.step, e.fate))
        .collect();
    assert_eq!(
        fates,
        [
            ("email", 1, durable_core::store::ForkFate::Inherited),
            ("charge", 1, durable_core::store::ForkFate::Inherited),
            ("email", 2, durable_core::store::ForkFate::Carried),
            ("email", 3, durable_core::store::ForkFate::Carried),
        ],
        "what the fork does with each parent effect, said before forking"
    );

    let mut forks = Vec::new();
    for (i, from) in [id.clone(), id.clone()].into_iter().enumerate() {
        let (worker, _) = runtime(&store, &format!("fork-{i}"));
        let fork = worker
            .operator()
            .fork::<durable_core::Message>(&from, 1, None)
            .await
            .expect("fork");
        let replayed = ledger
            .call(&fork, &email(), 1)
            .await
            .expect("the re-run turn's email replays");
        assert_eq!(replayed, first, "the recorded result comes back");
        ledger
            .call(&fork, &charge(), 1)
            .await
            .expect("the keyed charge replays");
        let mut fork = fork;
        fork.checkpoint().await.expect("the re-run turn ends");
        let refused = ledger
            .call(&fork, &email(), 2)
            .await
            .expect_err("the parent's later email is not sent again");
        assert!(
            matches!(
                refused,
                durable_core::CallError::Durable(DurableError::InheritedEffect { .. })
            ),
            "{refused:?}"
        );
        ledger
            .call(&fork, &email(), 100 + i as i64)
            .await
            .expect("a new effect of the fork runs");
        fork.checkpoint().await.expect("the fork's own turn ends");
        forks.push(fork.id().clone());
        fork.release().await.expect("release");
    }
    // A fork of the fork (at its version 0: the parent's version 1) inherits the same.
    let (worker, _) = runtime(&store, "grandchild");
    let grandchild = worker
        .operator()
        .fork::<durable_core::Message>(&forks[0], 0, None)
        .await
        .expect("fork of a fork");
    ledger
        .call(&grandchild, &email(), 1)
        .await
        .expect("replays");
    ledger
        .call(&grandchild, &charge(), 1)
        .await
        .expect("replays");
    let mut grandchild = grandchild;
    grandchild.checkpoint().await.expect("ends");
    let refused = ledger.call(&grandchild, &email(), 2).await;
    assert!(
        matches!(
            refused,
            Err(durable_core::CallError::Durable(
                DurableError::InheritedEffect { .. }
            ))
        ),
        "{refused:?}"
    );
    assert_eq!(ledger.count("email", 1), 1);
    assert_eq!(
        ledger.count("email", 2),
        2,
        "the parent's two emails, nothing more"
    );
    // Sealed like any session: the offline check finds every fork clean.
    for check in durable_core::verify::verify_sessions(&*store, None)
        .await
        .expect("verify")
    {
        assert_eq!(check.problem, None, "{}", check.session);
    }
}

/// A fork from the last checkpoint, taken while the parent's turn was in flight: the
/// turn's completed call comes back recorded, its in-doubt call stays in doubt (refused,
/// and no effect runs beside it) until it is resolved in the fork.
pub async fn fork_from_the_last_checkpoint_keeps_the_in_flight_turn(
    store: Arc<dyn CheckpointStore>,
) {
    use super::runtime::{call_and_die, runtime, start};
    let ledger = Ledger::default();
    let (durable, _) = runtime(&store, "parent");
    let mut parent = start(&durable).await;
    parent.checkpoint().await.expect("v1");
    ledger.call(&parent, &email(), 1).await.expect("email 1");
    let doubt = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    call_and_die(&parent, &email(), 2, None, &doubt).await;
    let id = parent.id().clone();
    drop(parent); // the worker dies mid-turn
    super::runtime::release_dead_lease(&store, &id).await;

    let (operator, _) = runtime(&store, "operator");
    let plan = operator
        .operator()
        .fork_plan(&id, 1, &[])
        .await
        .expect("plan");
    assert_eq!(
        plan.entries
            .iter()
            .map(|e| (e.status, e.fate))
            .collect::<Vec<_>>(),
        [
            (
                CallStatus::Completed,
                durable_core::store::ForkFate::Inherited
            ),
            (CallStatus::Issued, durable_core::store::ForkFate::Inherited),
        ]
    );
    let fork = operator
        .operator()
        .fork::<durable_core::Message>(&id, 1, None)
        .await
        .expect("fork from the last checkpoint");
    ledger.call(&fork, &email(), 1).await.expect("recorded");
    let refused = ledger.call(&fork, &email(), 2).await;
    assert!(
        matches!(
            refused,
            Err(durable_core::CallError::Durable(
                DurableError::ReplayUnsafe { .. }
            ))
        ),
        "the in-doubt call stays in doubt: {refused:?}"
    );
    let refused = ledger.call(&fork, &email(), 3).await;
    assert!(
        matches!(
            refused,
            Err(durable_core::CallError::Durable(
                DurableError::ReplayUnsafe { .. }
            ))
        ),
        "no effect runs beside it: {refused:?}"
    );
    assert_eq!(ledger.count("email", 1), 1, "email 1 ran once");
    assert_eq!(doubt.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(ledger.count("email", 2), 0, "email 2 was not sent again");
    assert_eq!(ledger.count("email", 3), 0);
    // Resolved in the fork, it replays there; the parent's row is untouched.
    let fork_id = fork.id().clone();
    fork.release().await.expect("release the fork");
    let in_doubt = operator
        .operator()
        .in_doubt(Some(&fork_id))
        .await
        .expect("in doubt");
    assert_eq!(in_doubt.len(), 1, "{in_doubt:?}");
    operator
        .operator()
        .resolve(
            &in_doubt[0].id,
            durable_core::store::Resolution::Happened {
                result: json!({"n": 2}),
            },
            "ops",
            None,
        )
        .await
        .expect("resolve in the fork");
    let fork = operator
        .resume::<durable_core::Message>(&fork_id)
        .await
        .expect("resume the fork")
        .session;
    ledger.call(&fork, &email(), 1).await.expect("recorded");
    assert_eq!(
        ledger.call(&fork, &email(), 2).await.expect("resolved"),
        json!({"n": 2})
    );
    ledger
        .call(&fork, &email(), 3)
        .await
        .expect("the barrier lifted");
    assert_eq!(
        operator
            .operator()
            .in_doubt(Some(&id))
            .await
            .expect("parent")
            .len(),
        1,
        "the parent's call is still in doubt"
    );
    assert_eq!(ledger.duplicates(), []);
}

/// An in-doubt call of a turn before the fork point keeps barring effects in the fork.
pub async fn fork_keeps_the_barrier_of_an_earlier_in_doubt_call(store: Arc<dyn CheckpointStore>) {
    use super::runtime::{call_and_die, runtime, start};
    let (durable, _) = runtime(&store, "parent");
    let mut parent = start(&durable).await;
    let doubt = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    call_and_die(&parent, &email(), 1, None, &doubt).await;
    // The live worker feeds the refusal to the model and checkpoints (allowed under the
    // barrier): the in-doubt call is now in a turn before version 1.
    parent.checkpoint().await.expect("v1 under the barrier");
    let id = parent.id().clone();
    parent.release().await.expect("release");

    let (operator, _) = runtime(&store, "operator");
    let fork = operator
        .operator()
        .fork::<durable_core::Message>(&id, 1, None)
        .await
        .expect("fork");
    let ledger = Ledger::default();
    let refused = ledger.call(&fork, &email(), 1).await;
    assert!(
        matches!(
            refused,
            Err(durable_core::CallError::Durable(
                DurableError::ReplayUnsafe { .. }
            ))
        ),
        "{refused:?}"
    );
    let refused = ledger.call(&fork, &charge(), 2).await;
    assert!(
        matches!(
            refused,
            Err(durable_core::CallError::Durable(
                DurableError::ReplayUnsafe { .. }
            ))
        ),
        "{refused:?}"
    );
    assert_eq!(ledger.duplicates(), []);
    assert_eq!(ledger.count("email", 1), 0);
}

/// An operator lets the fork run one inherited effect again: only that one is not
/// copied, the decision is audited (the plan says so first), and a call the fork would
/// not copy anyway is refused as a rerun.
pub async fn fork_rerun_runs_only_the_named_call_again(store: Arc<dyn CheckpointStore>) {
    use super::runtime::{runtime, start};
    let ledger = Ledger::default();
    let (durable, _) = runtime(&store, "parent");
    let mut parent = start(&durable).await;
    parent.checkpoint().await.expect("v1");
    ledger.call(&parent, &email(), 1).await.expect("email 1");
    ledger.call(&parent, &email(), 2).await.expect("email 2");
    parent.checkpoint().await.expect("v2");
    let id = parent.id().clone();
    parent.release().await.expect("release");
    let rows = store.calls(&id, Some(1)).await.expect("rows");
    let rerun = rows[1].id.clone();

    let (operator, _) = runtime(&store, "operator");
    expect_err!(
        operator
            .operator()
            .fork_plan(&id, 1, &[durable_core::CallId::new("nope")])
            .await,
        DurableError::Store(StoreError::CallNotFound(_)),
        "a rerun of a call the source does not hold"
    );
    let plan = operator
        .operator()
        .fork_plan(&id, 1, std::slice::from_ref(&rerun))
        .await
        .expect("plan");
    assert!(plan.reruns(), "the plan says an effect may run again");
    let (fork, applied) = operator
        .operator()
        .fork_with::<durable_core::Message>(
            &id,
            1,
            durable_core::ForkOptions::new()
                .rerun([rerun.clone()])
                .by("ops@example"),
        )
        .await
        .expect("fork with a rerun");
    assert_eq!(applied, plan);
    ledger.call(&fork, &email(), 1).await.expect("replayed");
    ledger.call(&fork, &email(), 2).await.expect("run again");
    assert_eq!(ledger.count("email", 1), 1, "not named: not run again");
    assert_eq!(
        ledger.count("email", 2),
        2,
        "named: run again, deliberately"
    );
    let copied = store.calls(fork.id(), None).await.expect("fork rows");
    assert_eq!(copied.len(), 2, "one inherited row, one new: {copied:?}");
}
