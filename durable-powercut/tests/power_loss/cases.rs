//! The cases: the store as shipped, the refusal of a lowered `synchronous`, and the
//! counterexample that shows what the refusal prevents.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use durable_core::{
    CallError, CheckpointStore, Durable, DurableError, Message, ReplayClass, StartOptions,
    StoreError, ToolSpec,
};
use durable_powercut::{PowerCut, Rng};
use durable_sqlite::{SqliteStore, SqliteStoreOptions};
use serde_json::json;
use sqlx::sqlite::SqliteSynchronous;

use crate::tier::{self, FULL, Figures, Mode};

/// Cuts per run (one store).
const CYCLES: u64 = 10;

fn register(name: &str) -> PowerCut {
    PowerCut::register(name).expect("register the power-cut VFS")
}

/// The store as shipped: nothing acknowledged is ever lost, nothing runs twice, damage
/// (if any) is loud.
pub async fn full(seed: u64, cuts: u64, only_run: Option<u64>) -> bool {
    let power = register("powercut-full");
    let mut master = Rng::new(seed);
    let mut total = Figures::default();
    let run_seeds: Vec<u64> = match only_run {
        Some(run) => vec![run],
        None => (0..cuts.div_ceil(CYCLES))
            .map(|_| master.next_u64())
            .collect(),
    };
    for run_seed in run_seeds {
        let figures = tier::run(FULL, &power, run_seed, CYCLES, true).await;
        let failed = !figures.failures.is_empty();
        total.add(figures);
        if failed {
            break;
        }
    }
    println!(
        "full: {} cuts in {} runs ({} drop-all, {} torn; {} during store creation) after {} write operations and {} WAL checkpoints; \
         {} unsynced sectors lost, {} kept, {} filled with garbage; \
         {} acknowledged issued rows checked ({} distinct effects), {} acknowledged checkpoints checked; \
         lost issued rows: {}, lost checkpoints: {}, duplicate emails: {}, charges under two keys: {}; \
         loud refusals: {} (and {} empty files refused after a cut during creation); \
         in-doubt emails settled from the ledger: {}",
        total.cuts,
        total.runs,
        total.drop_cuts,
        total.tear_cuts,
        total.cuts_at_creation,
        total.ops,
        total.wal_checkpoints,
        total.sectors_lost,
        total.sectors_kept,
        total.garbage_sectors,
        total.issued_checks,
        total.effects,
        total.checkpoint_checks,
        total.lost_issued,
        total.lost_checkpoints,
        total.duplicates,
        total.key_mismatches,
        total.loud,
        total.empty_at_creation,
        total.in_doubt_resolved,
    );
    for failure in &total.failures {
        eprintln!("full: FAILED: {failure}");
    }
    total.failures.is_empty()
        && total.lost_issued == 0
        && total.lost_checkpoints == 0
        && total.duplicates == 0
        && total.key_mismatches == 0
}

/// A lowered `synchronous` (the open's refusal bypassed, test-only): unsafe tools refuse
/// with `NotDurable` naming the setting, and their bodies never run.
pub async fn lowered_refuses_unsafe() -> bool {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("agent.db");
    // As shipped, the store refuses no setting it can be asked for: it sets and reads
    // back FULL. The bypass is what a store that did not check would be.
    let store = SqliteStore::connect_with(
        SqliteStoreOptions::file(&path).dangerous_synchronous(SqliteSynchronous::Normal),
    )
    .await
    .expect("open with the refusal bypassed");
    let durable = Durable::builder(Arc::new(store) as Arc<dyn CheckpointStore>)
        .owner("lowered")
        .build();
    let session = durable
        .start::<Message>(StartOptions::default())
        .await
        .expect("start");
    let send = ToolSpec::new(
        "send",
        "An email.",
        ReplayClass::UnsafeOnReplay,
        json!({"type": "object"}),
    );
    let ran = Arc::new(AtomicBool::new(false));
    let body = Arc::clone(&ran);
    let result = session
        .journal()
        .tool(&send, json!({}))
        .run(move |_ctx| {
            let body = Arc::clone(&body);
            async move {
                body.store(true, Ordering::SeqCst);
                Ok::<_, String>(json!("sent"))
            }
        })
        .await;
    let ok = match &result {
        Err(CallError::Durable(DurableError::Store(StoreError::NotDurable {
            setting, ..
        }))) => setting == "synchronous = normal" && !ran.load(Ordering::SeqCst),
        _ => false,
    };
    let rows = durable
        .store()
        .calls(session.id(), None)
        .await
        .expect("calls");
    let ok = ok && rows.is_empty();
    match &result {
        Err(e) => println!(
            "lowered_refuses_unsafe: {} ({e})",
            if ok { "ok" } else { "FAILED" }
        ),
        Ok(v) => println!("lowered_refuses_unsafe: FAILED: the unsafe tool ran and returned {v}"),
    }
    ok
}

/// The counterexample: the tier on a store with `synchronous` lowered that reports itself
/// durable anyway. The cuts must lose acknowledged *issued* rows; a tier that found
/// nothing here could not find anything at all. (Before the rollback witness the lost
/// rows also sent emails twice; now the witness refuses the store and names them.)
pub async fn lowered_loses(seed: u64) -> bool {
    let mut ok = true;
    for (mode, vfs, runs) in [
        (
            Mode {
                name: "synchronous = NORMAL (reported durable)",
                synchronous: SqliteSynchronous::Normal,
                report_durable: true,
            },
            "powercut-normal",
            10,
        ),
        (
            Mode {
                name: "synchronous = OFF (reported durable)",
                synchronous: SqliteSynchronous::Off,
                report_durable: true,
            },
            "powercut-off",
            10,
        ),
    ] {
        let power = register(vfs);
        let mut master = Rng::new(seed ^ 0x5eed);
        let mut total = Figures::default();
        for _ in 0..runs {
            total.add(tier::run(mode, &power, master.next_u64(), CYCLES, false).await);
        }
        // Both lose acknowledged rows (NORMAL and OFF alike); OFF also corrupts the file.
        // A run ends at the first store refused.
        let found = total.lost_issued > 0;
        println!(
            "lowered_loses: {}: {} cuts, {} acknowledged issued rows checked: lost issued rows: {}, \
             lost checkpoints: {}, duplicate emails: {}, loud refusals: {} ({} by the rollback witness) -> {}",
            mode.name,
            total.cuts,
            total.issued_checks,
            total.lost_issued,
            total.lost_checkpoints,
            total.duplicates,
            total.loud,
            total.witness_refusals,
            if found {
                "the tier detects the losses"
            } else {
                "FAILED: the tier found no loss"
            },
        );
        if let Some(example) = total.failures.first() {
            println!("lowered_loses:   e.g. {example}");
        }
        ok &= found;
    }
    ok
}
