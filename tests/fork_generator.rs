//! A generator for forks: seeded random programs of `pure`, keyed and unsafe calls and
//! checkpoints, a parent that may die mid-turn (even mid-call), two forks at random
//! versions that re-run the parent's turns from there, and a ledger of real effects
//! checked for duplicates: an unsafe intent run twice, or a keyed intent applied under two
//! keys (upstream deduplicates one key, not two).
//!
//! Each fork runs exactly the calls the parent made from its version on, so every call
//! of a fork is an intent the parent already had: a correct fork never runs one again
//! (it replays, refuses, or waits for an operator). With the fork's journal starting
//! empty (the bug where a fork copied none of its parent's effects) this finds a duplicate within a few cases.
//!
//! On SQLite (in memory) and, with the `_postgres-testing` feature, on PostgreSQL.
//! `PROPTEST_CASES` sets the number of programs (default 64 on SQLite, 24 on PostgreSQL);
//! a failure prints the shrunk program.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use durable::sqlite::SqliteStore;
use durable::{
    CheckpointStore, Durable, Message, ReplayClass, Session, SessionId, StartOptions, ToolSpec,
};
use proptest::prelude::*;
use serde_json::{Value, json};
use tokio::sync::Notify;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Class {
    Pure,
    Keyed,
    Unsafe,
}

/// One call of the program: its class, its argument, and the intent it stands for (its
/// position in the parent's program).
#[derive(Debug, Clone, Copy)]
struct Op {
    class: Class,
    n: u8,
}

/// The parent's program: turns of calls, each ended by a checkpoint but the last, which
/// is in flight when the parent dies (after its last call, or in the middle of it).
#[derive(Debug, Clone)]
struct Program {
    turns: Vec<Vec<Op>>,
    dies_mid_call: bool,
    forks: [u8; 2],
}

fn op() -> impl Strategy<Value = Op> {
    (
        prop_oneof![Just(Class::Pure), Just(Class::Keyed), Just(Class::Unsafe)],
        0u8..3,
    )
        .prop_map(|(class, n)| Op { class, n })
}

fn program() -> impl Strategy<Value = Program> {
    (
        prop::collection::vec(prop::collection::vec(op(), 0..4), 1..5),
        any::<bool>(),
        [any::<u8>(), any::<u8>()],
    )
        .prop_map(|(turns, dies_mid_call, forks)| Program {
            turns,
            dies_mid_call,
            forks,
        })
}

fn spec(class: Class) -> ToolSpec {
    let (name, replay) = match class {
        Class::Pure => ("lookup", ReplayClass::Pure),
        Class::Keyed => ("charge", ReplayClass::IdempotentWithKey),
        Class::Unsafe => ("email", ReplayClass::UnsafeOnReplay),
    };
    ToolSpec::new(
        name,
        "a generated tool",
        replay,
        json!({"type": "object", "properties": {"n": {"type": "integer"}}}),
    )
}

/// Effects: unsafe intents by run, keyed intents by the keys they were applied under.
#[derive(Default)]
struct Ledger {
    runs: BTreeMap<(usize, usize), usize>,
    keys: BTreeMap<(usize, usize), BTreeSet<String>>,
}

type Shared = Arc<Mutex<Ledger>>;

/// Runs op `(turn, index)` in `session`; with `die`, drops the call once its effect is
/// done, before its outcome is recorded.
async fn call(session: &Session<Message>, ledger: &Shared, at: (usize, usize), op: Op, die: bool) {
    let spec = spec(op.class);
    let mut call = session.journal().tool(&spec, json!({ "n": op.n }));
    if op.class == Class::Keyed {
        // The key names the session: a fork that re-ran the charge would derive another.
        call = call.key(format!("{}-{}-{}", session.id(), at.0, at.1));
    }
    let ledger = Arc::clone(ledger);
    let started = Arc::new(Notify::new());
    let signal = Arc::clone(&started);
    let class = op.class;
    let fut = call.run(move |ctx| {
        let ledger = Arc::clone(&ledger);
        let signal = Arc::clone(&signal);
        async move {
            {
                let mut l = ledger.lock().expect("ledger");
                match class {
                    Class::Pure => {}
                    Class::Unsafe => *l.runs.entry(at).or_default() += 1,
                    Class::Keyed => {
                        let key = ctx.idempotency_key().unwrap_or("").to_owned();
                        l.keys.entry(at).or_default().insert(key);
                    }
                }
            }
            if die {
                signal.notify_one();
                std::future::pending::<()>().await;
            }
            Ok::<Value, String>(json!({ "at": [at.0, at.1] }))
        }
    });
    if die {
        tokio::select! {
            _ = fut => {}
            () = started.notified() => {}
        }
    } else {
        // A refusal (in doubt, inherited, diverged) runs nothing: that is allowed.
        let _ = fut.await;
    }
}

/// Runs the parent's turns `from..` in `session` (a fork), as the parent ran them, ending
/// each but the in-flight one with a checkpoint; stops at the first refused checkpoint.
async fn rerun(session: &mut Session<Message>, program: &Program, ledger: &Shared, from: usize) {
    let last = program.turns.len() - 1;
    for (t, turn) in program.turns.iter().enumerate().skip(from) {
        for (i, op) in turn.iter().enumerate() {
            call(session, ledger, (t, i), *op, false).await;
        }
        if t < last && session.checkpoint().await.is_err() {
            return;
        }
    }
}

async fn case(store: Arc<dyn CheckpointStore>, program: Program) -> Result<(), String> {
    let ledger: Shared = Arc::default();
    let durable = Durable::builder(Arc::clone(&store))
        .owner("parent")
        .app_version("gen/1")
        .build();
    let id = SessionId::new("parent");
    let mut parent = durable
        .start::<Message>(StartOptions::new().with_id(id.clone()))
        .await
        .map_err(|e| e.to_string())?;
    let last = program.turns.len() - 1;
    for (t, turn) in program.turns.iter().enumerate() {
        for (i, op) in turn.iter().enumerate() {
            let die = t == last && i + 1 == turn.len() && program.dies_mid_call;
            call(&parent, &ledger, (t, i), *op, die).await;
        }
        if t < last {
            parent
                .checkpoint()
                .await
                .map_err(|e| format!("parent checkpoint: {e}"))?;
        }
    }
    drop(parent); // dies in flight, lease live
    for (k, pick) in program.forks.iter().enumerate() {
        let version = usize::from(*pick) % program.turns.len();
        let worker = Durable::builder(Arc::clone(&store))
            .owner(format!("fork-{k}"))
            .app_version("gen/1")
            .build();
        let v = i64::try_from(version).map_err(|e| e.to_string())?;
        let mut fork = worker
            .operator()
            .fork::<Message>(&id, v, Some(SessionId::new(format!("fork-{k}"))))
            .await
            .map_err(|e| format!("fork at {version}: {e}"))?;
        rerun(&mut fork, &program, &ledger, version).await;
    }
    let l = ledger.lock().expect("ledger");
    for (at, runs) in &l.runs {
        if *runs > 1 {
            return Err(format!("unsafe intent {at:?} ran {runs} times"));
        }
    }
    for (at, keys) in &l.keys {
        if keys.len() > 1 {
            return Err(format!("keyed intent {at:?} applied under keys {keys:?}"));
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(64),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn forks_never_repeat_a_parent_effect(program in program()) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let found = runtime.block_on(async {
            let store: Arc<dyn CheckpointStore> = Arc::new(
                SqliteStore::open_in_memory().await.map_err(|e| e.to_string())?,
            );
            case(store, program).await
        });
        if let Err(found) = found {
            prop_assert!(false, "{}", found);
        }
    }
}

// PostgreSQL (the throwaway cluster of `durable_postgres::testing`, a fresh database per
// program): fewer programs, each a real server round trip per write.
#[cfg(feature = "_postgres-testing")]
proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(24),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn postgres_forks_never_repeat_a_parent_effect(program in program()) {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let found = runtime.block_on(async {
            let database = durable_postgres::testing::test_database().await;
            let store: Arc<dyn CheckpointStore> =
                Arc::new(database.store().await.map_err(|e| e.to_string())?);
            let found = case(store, program).await;
            drop(database);
            found
        });
        if let Err(found) = found {
            prop_assert!(false, "{}", found);
        }
    }
}
