//! Work became available → a worker started it, on SQLite: an idle worker pool
//! woken by its store's in-process notification against a pool that only polls, measured
//! in the same run in interleaved rounds.
//!
//! One file. Notified: the pool and the submitter share one `SqliteStore` (one process).
//! Polling only: the pool's store and the submitter's are two `SqliteStore`s opened on the
//! file, as two processes would have (SQLite has no cross-process notification). Both
//! pools poll every `DURABLE_BENCH_POLL_MS`. One latency is `t1 − t0`: `t0` the instant
//! `Durable::submit` returned (its release committed), `t1` the instant the pool entered
//! its handler for that session (see `durable_bench::wakeup`). Reported: median, p95 and
//! max (nearest rank) of each side, and notified ÷ polling.
//!
//! `cargo bench -p durable-sqlite --bench wakeup` writes `sqlite-wakeup.json` to
//! `DURABLE_BENCH_OUT` (default `target/durable-bench`). Knobs (environment):
//!
//! | variable | default | what |
//! |---|---|---|
//! | `DURABLE_BENCH_WAKEUPS` | 50 | submits per side |
//! | `DURABLE_BENCH_WAKEUP_ROUNDS` | 5 | interleaved rounds they are split into |
//! | `DURABLE_BENCH_POLL_MS` | 500 | every pool's poll interval |
//! | `DURABLE_BENCH_DIR` | the output directory | where the database goes (a temporary directory in it) |
//! | `DURABLE_BENCH_OUT` | `target/durable-bench` | where the JSON goes |

use std::sync::Arc;
use std::time::Duration;

use durable_bench::wakeup::{self, Schedule, Side};
use durable_bench::{Report, env_usize, machine, out_dir};
use durable_core::Durable;
use durable_sqlite::SqliteStore;

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(run());
}

fn durable(store: &SqliteStore, owner: &str) -> Durable {
    Durable::builder(Arc::new(store.clone()))
        .owner(owner)
        .build()
}

async fn run() {
    let out = out_dir().expect("the output directory");
    let base = std::env::var_os("DURABLE_BENCH_DIR").map_or_else(|| out.clone(), Into::into);
    let dir = tempfile::tempdir_in(&base).expect("a temporary directory");
    let schedule = Schedule {
        poll: Duration::from_millis(env_usize("DURABLE_BENCH_POLL_MS", 500) as u64),
        submits: env_usize("DURABLE_BENCH_WAKEUPS", 50).max(1),
        rounds: env_usize("DURABLE_BENCH_WAKEUP_ROUNDS", 5).max(1),
    };
    let mut report = Report::new("sqlite-wakeup");
    let path = dir.path().join("wakeup.db");
    let shared = SqliteStore::open(&path).await.expect("open the store");
    let other = SqliteStore::open(&path).await.expect("open the file again");
    for (name, value) in [
        (
            "poll_ms",
            serde_json::Value::from(schedule.poll.as_millis() as u64),
        ),
        ("submits_per_side", schedule.submits.into()),
        ("rounds", schedule.rounds.into()),
    ] {
        report.setting(name, value);
    }
    println!(
        "durable-sqlite wakeup bench: poll interval {:?}, {} submits per side in {} rounds, {} \
         cores, load average {}, database in {}",
        schedule.poll,
        schedule.submits,
        schedule.rounds,
        report.cores,
        machine::load_text(report.load_before),
        dir.path().display()
    );

    let submitter = durable(&shared, "web");
    wakeup::compare(
        &mut report,
        "SQLite",
        Side {
            pool: &durable(&shared, "pool-shared"),
            submitter: &submitter,
        },
        Side {
            pool: &durable(&other, "pool-other"),
            submitter: &submitter,
        },
        schedule,
        "notified: pool and submitter on one store (in-process); baseline: the pool on a second store of the file, polling only",
    )
    .await;

    report.finish();
    println!(
        "load average: {} before, {} after",
        machine::load_text(report.load_before),
        machine::load_text(report.load_after)
    );
    println!("{}", report.markdown());
    let path = report.write_json(&out).expect("write the report");
    println!("wrote {}", path.display());
}
