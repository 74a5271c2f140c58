//! A child ended → its waiting parent was started again, and a signal sent → the session
//! waiting for it read it, on PostgreSQL: the child
//! completed by one worker, the parent taken by an idle pool of another, each with a
//! store of its own on one database (as separate processes: the pool hears of the
//! parent's wake-up through `LISTEN`/`NOTIFY`). See `durable_bench::child_wakeup`.
//!
//! `cargo bench -p durable-postgres --features testing --bench child_wakeup` writes
//! `postgres-child-wakeup.json` to `DURABLE_BENCH_OUT` (default `target/durable-bench`).
//! Knobs: `DURABLE_BENCH_WAKEUPS` (samples, default 50), `DURABLE_BENCH_POLL_MS` (the
//! pool's poll interval, default 500), `DATABASE_URL` (a server instead of a throwaway
//! cluster).

use std::sync::Arc;
use std::time::Duration;

use durable_bench::{Report, Row, child_wakeup, env_usize, out_dir};
use durable_core::Durable;
use durable_postgres::testing::test_database;
use durable_postgres::{PostgresStore, PostgresStoreOptions};

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(run());
}

async fn durable(url: &str, owner: &str) -> Durable {
    let store = PostgresStore::connect_with(PostgresStoreOptions::new(url))
        .await
        .expect("open the store");
    Durable::builder(Arc::new(store))
        .owner(owner)
        .child_recheck(Duration::from_secs(60))
        .build()
}

async fn run() {
    let out = out_dir().expect("the output directory");
    let poll = Duration::from_millis(env_usize("DURABLE_BENCH_POLL_MS", 500) as u64);
    let samples = env_usize("DURABLE_BENCH_WAKEUPS", 50).max(1);
    let db = test_database().await;
    let mut report = Report::new("postgres-child-wakeup");
    report.setting("poll_ms", serde_json::Value::from(poll.as_millis() as u64));
    report.setting("samples", samples);
    let values = child_wakeup::latencies(
        &durable(db.url(), "pool").await,
        &durable(db.url(), "parent").await,
        &durable(db.url(), "child").await,
        poll,
        samples,
    )
    .await;
    println!(
        "{}",
        child_wakeup::summary("PostgreSQL child end → parent", &values)
    );
    for (name, q) in [("median", 0.5), ("p95", 0.95), ("max", 1.0)] {
        report.push(
            Row::new(
                format!("PostgreSQL: {name} child end → parent's handler"),
                "ms",
                child_wakeup::at(&values, q),
                poll.as_secs_f64() * 1e3,
            )
            .note("baseline: the pool's poll interval"),
        );
    }
    let values = durable_bench::signal_wakeup::latencies(
        &durable(db.url(), "pool").await,
        &durable(db.url(), "waiter").await,
        &durable(db.url(), "operator").await,
        poll,
        samples,
    )
    .await;
    println!(
        "{}",
        child_wakeup::summary("PostgreSQL signal sent → read", &values)
    );
    for (name, q) in [("median", 0.5), ("p95", 0.95), ("max", 1.0)] {
        report.push(
            Row::new(
                format!("PostgreSQL: {name} signal sent → read by the woken session"),
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
