//! The power-loss tier: the real `SqliteStore` on a simulated disk
//! (durable-powercut's VFS), the power cut at seeded random write operations of a
//! realistic workload, the files left as a power cut leaves them (unsynced writes dropped,
//! or torn sector by sector with garbage in lost growth), then reopened and checked
//! against a ledger of effects kept off the simulated disk.
//!
//! Cases (arguments filter them by name):
//!
//! - `full`: the store as shipped (`synchronous = FULL`). After every cut: the store opens,
//!   `PRAGMA integrity_check` is ok, `durable verify`'s walk finds every seal and chain
//!   intact, every effect in the ledger of a keyed or unsafe tool has its journal row
//!   (*issued* or finished), every acknowledged checkpoint and completion is there; the
//!   sessions resume (an operator settling each in-doubt email from the ledger) and run
//!   on; at the end no email was sent twice and no charge ran under two keys.
//! - `lowered_refuses_unsafe`: a store whose `synchronous` is lowered (test-only bypass
//!   of the open's refusal) refuses unsafe tools with `NotDurable` naming the setting.
//! - `lowered_loses`: the counterexample. The same tier with `synchronous = NORMAL` (and
//!   `OFF`) and the store made to report itself durable anyway: the cuts lose acknowledged
//!   *issued* rows and emails go out twice. The tier counts them, and the case fails if
//!   it finds none (the tier can fail).
//!
//! Environment: `DURABLE_POWER_CUTS` (cuts of the `full` case, default 300; long mode:
//! thousands), `DURABLE_SEED` (the master seed, decimal or `0x…`), `DURABLE_POWER_RUN`
//! (replays one run, by the run seed a failure prints). A seed fixes the cut points, the
//! policies, the tear decisions and the workload's shape; with more than one worker the
//! interleaving of sessions in group-committed batches (and so which bytes are unsynced
//! at a cut) still varies between runs of one seed.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

#[path = "power_loss/cases.rs"]
mod cases;
#[path = "power_loss/tier.rs"]
mod tier;
#[path = "power_loss/workload.rs"]
mod workload;

fn seed_from(var: &str) -> Option<u64> {
    let text = std::env::var(var).ok()?;
    let text = text.trim();
    let parsed = match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => text.parse(),
    };
    match parsed {
        Ok(seed) => Some(seed),
        Err(e) => {
            eprintln!("{var}={text:?} is not a number ({e})");
            std::process::exit(2);
        }
    }
}

fn main() {
    // `cargo test` passes libtest flags (`--quiet`, `--nocapture`, …): only bare words filter.
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let wanted =
        |name: &str| filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str()));
    let seed = seed_from("DURABLE_SEED").unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    });
    let cuts = std::env::var("DURABLE_POWER_CUTS")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(300_u64);
    let only_run = seed_from("DURABLE_POWER_RUN");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let started = Instant::now();
    let mut failed = false;
    if wanted("full") {
        failed |= !runtime.block_on(cases::full(seed, cuts, only_run));
    }
    if wanted("lowered_refuses_unsafe") {
        failed |= !runtime.block_on(cases::lowered_refuses_unsafe());
    }
    if wanted("lowered_loses") {
        failed |= !runtime.block_on(cases::lowered_loses(seed));
    }
    println!(
        "power_loss: seed {seed:#x}, {:.1} s",
        started.elapsed().as_secs_f64()
    );
    if failed {
        std::process::exit(1);
    }
}
