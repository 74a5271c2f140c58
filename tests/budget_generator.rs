//! A generator of harness programs with spend as the invariant: seeded random turns of
//! model calls (each costing a few cents and some tokens) and `pure` or keyed tool calls,
//! random ceilings (dollars, model calls, tool calls, calls of one tool), and crashes at
//! random points (between two calls, or in the middle of one: the body or the model runs
//! and the process dies before anything is recorded), after which another worker takes
//! the session over and re-runs the turn from its checkpoint.
//!
//! A ledger outside the store counts what really ran to an end: each model reply
//! returned (and what it cost), each tool body that returned. When a ceiling refuses a
//! call the harness parks the session for an operator; otherwise it completes it. Then:
//!
//! - the session's budget (its latest checkpoint with the turn under way, as `durable
//!   show` reads it) holds exactly the ledger: no replay charged twice, no re-run lost;
//! - no count went past its ceiling, and money past its ceiling by at most one reply;
//! - a refused call ran nothing (its body or model was never entered).
//!
//! On SQLite (in memory). `PROPTEST_CASES` sets the number of programs (default 64); a
//! failure prints the shrunk program.
#![cfg(feature = "sqlite")]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use durable::sqlite::SqliteStore;
use durable::{
    Budget, CallError, CheckpointStore, Durable, DurableError, Message, ReplayClass, Session,
    SessionId, Spend, StartOptions, ToolSpec,
};
use proptest::prelude::*;
use serde_json::{Value, json};
use tokio::sync::Notify;

/// Nano-dollars per cent.
const CENT: u64 = 10_000_000;

#[derive(Debug, Clone, Copy)]
enum Op {
    /// A model reply costing this many cents (and 10 + 5 tokens).
    Model(u8),
    /// A `pure` lookup of `n`.
    Lookup(u8),
    /// A keyed charge of `n`.
    Charge(u8),
}

/// Where a worker dies: in turn `turn`, before call `at` (or in the middle of it).
#[derive(Debug, Clone, Copy)]
struct Crash {
    turn: u8,
    at: u8,
    mid_call: bool,
}

#[derive(Debug, Clone)]
struct Program {
    turns: Vec<Vec<Op>>,
    crashes: Vec<Crash>,
    usd_cents: Option<u8>,
    model_calls: Option<u8>,
    tool_calls: Option<u8>,
    charges: Option<u8>,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u8..4).prop_map(Op::Model),
        (0u8..3).prop_map(Op::Lookup),
        (0u8..3).prop_map(Op::Charge),
    ]
}

fn program() -> impl Strategy<Value = Program> {
    (
        prop::collection::vec(prop::collection::vec(op(), 1..5), 1..5),
        prop::collection::vec(
            (0u8..5, 0u8..5, any::<bool>()).prop_map(|(turn, at, mid_call)| Crash {
                turn,
                at,
                mid_call,
            }),
            0..4,
        ),
        prop::option::of(0u8..12),
        prop::option::of(0u8..8),
        prop::option::of(0u8..10),
        prop::option::of(0u8..4),
    )
        .prop_map(
            |(turns, crashes, usd_cents, model_calls, tool_calls, charges)| Program {
                turns,
                crashes,
                usd_cents,
                model_calls,
                tool_calls,
                charges,
            },
        )
}

/// What really ran to an end, outside the store.
#[derive(Debug, Default)]
struct Ledger {
    model_calls: u64,
    nano_usd: u64,
    tokens: u64,
    tool_calls: u64,
    charges: u64,
    /// The most one reply cost.
    max_reply: u64,
}

type Shared = Arc<Mutex<Ledger>>;

fn specs() -> (ToolSpec, ToolSpec) {
    let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}}});
    (
        ToolSpec::new("lookup", "a lookup", ReplayClass::Pure, schema.clone()),
        ToolSpec::new("charge", "a charge", ReplayClass::IdempotentWithKey, schema),
    )
}

/// How a call ended.
enum Ended {
    Done,
    /// Refused by a ceiling (and nothing ran: checked here).
    Refused(durable::error::BudgetExceeded),
    /// The worker died in the middle of it.
    Died,
}

/// Runs op `index` of turn `turn`; with `die`, the body (or model) runs and the call is
/// dropped before it returns.
async fn run(
    session: &Session<Message>,
    ledger: &Shared,
    (turn, index): (usize, usize),
    op: Op,
    die: bool,
) -> Result<Ended, String> {
    let (lookup, charge) = specs();
    let entered = Arc::new(AtomicBool::new(false));
    let started = Arc::new(Notify::new());
    let result: Option<Result<Value, CallError<String>>> = match op {
        Op::Model(cents) => {
            let (ledger, entered, signal) = (
                Arc::clone(ledger),
                Arc::clone(&entered),
                Arc::clone(&started),
            );
            let cost = u64::from(cents) * CENT;
            let fut = session.journal().model_with_spend(
                move || async move {
                    entered.store(true, Ordering::SeqCst);
                    if die {
                        signal.notify_one();
                        std::future::pending::<()>().await;
                    }
                    let mut l = ledger.lock().expect("ledger");
                    l.model_calls += 1;
                    l.nano_usd += cost;
                    l.tokens += 15;
                    l.max_reply = l.max_reply.max(cost);
                    Ok::<_, String>(json!({"reply": [turn, index]}))
                },
                move |_| Some(Spend::from_nano_usd(cost, 10, 5)),
            );
            if die {
                tokio::select! {
                    _ = fut => None,
                    () = started.notified() => None,
                }
            } else {
                Some(fut.await)
            }
        }
        Op::Lookup(n) | Op::Charge(n) => {
            let keyed = matches!(op, Op::Charge(_));
            let spec = if keyed { &charge } else { &lookup };
            let mut call = session.journal().tool(spec, json!({ "n": n }));
            if keyed {
                call = call.key(format!("charge-{turn}-{index}"));
            }
            let (ledger, entered, signal) = (
                Arc::clone(ledger),
                Arc::clone(&entered),
                Arc::clone(&started),
            );
            let fut = call.run(move |_ctx| {
                let (ledger, entered, signal) = (
                    Arc::clone(&ledger),
                    Arc::clone(&entered),
                    Arc::clone(&signal),
                );
                async move {
                    entered.store(true, Ordering::SeqCst);
                    if die {
                        signal.notify_one();
                        std::future::pending::<()>().await;
                    }
                    let mut l = ledger.lock().expect("ledger");
                    l.tool_calls += 1;
                    if keyed {
                        l.charges += 1;
                    }
                    Ok::<Value, String>(json!({ "n": n }))
                }
            });
            if die {
                tokio::select! {
                    _ = fut => None,
                    () = started.notified() => None,
                }
            } else {
                Some(fut.await)
            }
        }
    };
    match result {
        None => Ok(Ended::Died),
        Some(Ok(_)) => Ok(Ended::Done),
        Some(Err(CallError::Durable(DurableError::BudgetExceeded(refused)))) => {
            if entered.load(Ordering::SeqCst) {
                return Err(format!("a refused call ran: {refused}"));
            }
            Ok(Ended::Refused(refused))
        }
        Some(Err(e)) => Err(format!("call {turn}.{index}: {e}")),
    }
}

async fn case(store: Arc<dyn CheckpointStore>, program: Program) -> Result<(), String> {
    let ledger: Shared = Arc::default();
    let mut ceilings = Budget::unlimited();
    if let Some(cents) = program.usd_cents {
        ceilings = ceilings.with_limit_nano_usd(u64::from(cents) * CENT);
    }
    if let Some(n) = program.model_calls {
        ceilings = ceilings.with_limit_model_calls(u64::from(n));
    }
    if let Some(n) = program.tool_calls {
        ceilings = ceilings.with_limit_tool_calls(u64::from(n));
    }
    if let Some(n) = program.charges {
        ceilings = ceilings.with_limit_tool("charge", u64::from(n));
    }
    let worker = |n: usize| {
        Durable::builder(Arc::clone(&store))
            .owner(format!("worker-{n}"))
            .renew_leases(false)
            .build()
    };
    let id = SessionId::new("generated");
    let mut workers = 0;
    let mut session = worker(workers)
        .start::<Message>(
            StartOptions::new()
                .with_id(id.clone())
                .with_budget(ceilings.clone()),
        )
        .await
        .map_err(|e| e.to_string())?;
    let mut crashes = program.crashes.clone();
    let mut refused = None;
    'turns: for (t, turn) in program.turns.iter().enumerate() {
        'attempt: loop {
            for (i, op) in turn.iter().enumerate() {
                let crash = crashes
                    .iter()
                    .position(|c| usize::from(c.turn) == t && usize::from(c.at) == i);
                let crash = crash.map(|k| crashes.remove(k));
                if let Some(Crash {
                    mid_call: false, ..
                }) = crash
                {
                    // Dies between two calls: the next worker re-runs the turn.
                    drop(session);
                    workers += 1;
                    session = take_over(&store, &id, &worker(workers)).await?;
                    continue 'attempt;
                }
                let die = crash.is_some();
                match run(&session, &ledger, (t, i), *op, die).await? {
                    Ended::Done => {}
                    Ended::Died => {
                        drop(session);
                        workers += 1;
                        session = take_over(&store, &id, &worker(workers)).await?;
                        continue 'attempt;
                    }
                    Ended::Refused(r) => {
                        refused = Some(r);
                        break 'turns;
                    }
                }
            }
            session
                .checkpoint()
                .await
                .map_err(|e| format!("checkpoint of turn {t}: {e}"))?;
            break;
        }
    }
    match &refused {
        Some(r) => session
            .park_for_budget(r)
            .await
            .map_err(|e| format!("park: {e}"))?,
        None => {
            session
                .complete()
                .await
                .map_err(|e| format!("complete: {e}"))?;
        }
    }

    let standing = durable::budget::session_budget(store.as_ref(), &id)
        .await
        .map_err(|e| format!("session budget: {e}"))?;
    let b = &standing.budget;
    let l = ledger.lock().expect("ledger");
    let counted = (
        b.model_calls,
        b.spent_nano_usd,
        b.total_tokens(),
        b.tool_calls,
        b.tool_count("charge"),
    );
    let ran = (l.model_calls, l.nano_usd, l.tokens, l.tool_calls, l.charges);
    if counted != ran {
        return Err(format!(
            "the budget says (model calls, nano-USD, tokens, tool calls, charges) = {counted:?}, the ledger {ran:?}"
        ));
    }
    let over = |what: &str, ran: u64, ceiling: Option<u8>| match ceiling {
        Some(c) if ran > u64::from(c) => Err(format!("{what}: {ran} ran past the ceiling {c}")),
        _ => Ok(()),
    };
    over("model calls", l.model_calls, program.model_calls)?;
    over("tool calls", l.tool_calls, program.tool_calls)?;
    over("charges", l.charges, program.charges)?;
    if let Some(cents) = program.usd_cents {
        let ceiling = u64::from(cents) * CENT;
        if l.nano_usd > ceiling + l.max_reply {
            return Err(format!(
                "spent {} nano-USD, past the ceiling {ceiling} by more than one reply ({})",
                l.nano_usd, l.max_reply
            ));
        }
    }
    Ok(())
}

/// Another worker takes the session over from a dead one whose lease is still live.
async fn take_over(
    store: &Arc<dyn CheckpointStore>,
    id: &SessionId,
    worker: &Durable,
) -> Result<Session<Message>, String> {
    let record = store.session(id).await.map_err(|e| e.to_string())?;
    let lease = durable::store::Lease {
        session: id.clone(),
        owner: record.lease_owner.clone().unwrap_or_default(),
        fence: record.fence,
        expires_at: 0,
    };
    store
        .release_lease(&lease)
        .await
        .map_err(|e| e.to_string())?;
    Ok(worker
        .resume::<Message>(id)
        .await
        .map_err(|e| format!("resume: {e}"))?
        .session)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(64),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn spend_is_counted_once_and_ceilings_hold(program in program()) {
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
