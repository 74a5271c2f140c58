//! A child ended → its waiting parent was started again, and a signal sent → the session
//! waiting for it read it, on SQLite: the child completed
//! by one worker, the parent taken by an idle pool of another, all on one store (one
//! process: the pool hears of the parent's wake-up from the store's in-process
//! notification). See `durable_bench::child_wakeup`.
//!
//! `cargo bench -p durable-sqlite --bench child_wakeup` writes `sqlite-child-wakeup.json`
//! to `DURABLE_BENCH_OUT` (default `target/durable-bench`). Knobs: `DURABLE_BENCH_WAKEUPS`
//! (samples, default 50), `DURABLE_BENCH_POLL_MS` (the pool's poll interval, default 500),
//! `DURABLE_BENCH_DIR` (where the database goes).

use std::sync::Arc;
use std::time::Duration;

use durable_bench::{Report, Row, child_wakeup, env_usize, out_dir};
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
        .child_recheck(Duration::from_secs(60))
        .build()
}

async fn run() {
    let out = out_dir().expect("the output directory");
    let base = std::env::var_os("DURABLE_BENCH_DIR").map_or_else(|| out.clone(), Into::into);
    let dir = tempfile::tempdir_in(&base).expect("a temporary directory");
    let poll = Duration::from_millis(env_usize("DURABLE_BENCH_POLL_MS", 500) as u64);
    let samples = env_usize("DURABLE_BENCH_WAKEUPS", 50).max(1);
    let store = SqliteStore::open(dir.path().join("children.db"))
        .await
        .expect("open the store");
    let mut report = Report::new("sqlite-child-wakeup");
    report.setting("poll_ms", serde_json::Value::from(poll.as_millis() as u64));
    report.setting("samples", samples);
    let values = child_wakeup::latencies(
        &durable(&store, "pool"),
        &durable(&store, "parent"),
        &durable(&store, "child"),
        poll,
        samples,
    )
    .await;
    println!(
        "{}",
        child_wakeup::summary("SQLite child end → parent", &values)
    );
    for (name, q) in [("median", 0.5), ("p95", 0.95), ("max", 1.0)] {
        report.push(
            Row::new(
                format!("SQLite: {name} child end → parent's handler"),
                "ms",
                child_wakeup::at(&values, q),
                poll.as_secs_f64() * 1e3,
            )
            .note("baseline: the pool's poll interval"),
        );
    }
    let values = durable_bench::signal_wakeup::latencies(
        &durable(&store, "pool"),
        &durable(&store, "waiter"),
        &durable(&store, "operator"),
        poll,
        samples,
    )
    .await;
    println!(
        "{}",
        child_wakeup::summary("SQLite signal sent → read", &values)
    );
    for (name, q) in [("median", 0.5), ("p95", 0.95), ("max", 1.0)] {
        report.push(
            Row::new(
                format!("SQLite: {name} signal sent → read by the woken session"),
                "ms",
                child_wakeup::at(&values, q),
                poll.as_secs_f64() * 1e3,
            )
            .note("baseline: the pool's poll interval"),
        );
    }
    report.finish();
    let path = report.write_json(&out).expect("write the report");
    println!("wrote {}", path.display());
}
