//! Work became available → a worker started it, on PostgreSQL: an idle worker
//! pool woken by `LISTEN`/`NOTIFY` against the same pool polling only, measured in the
//! same run in interleaved rounds.
//!
//! Every pool and every submitter has a store of its own on one database (its own
//! connection pool and notifier, as separate processes would): the notified pool's store
//! listens, the polling pool's is opened with `listen(false)`; both poll every
//! `DURABLE_BENCH_POLL_MS`. One latency is `t1 − t0`: `t0` the instant `Durable::submit`
//! returned on the submitter (its release committed), `t1` the instant the pool entered
//! its handler for that session (see `durable_bench::wakeup`). Reported: median, p95 and
//! max (nearest rank) of each side, and notified ÷ polling.
//!
//! `cargo bench -p durable-postgres --features testing --bench wakeup` writes
//! `postgres-wakeup.json` to `DURABLE_BENCH_OUT` (default `target/durable-bench`). The
//! server is `DATABASE_URL` when set, else a throwaway cluster started from the machine's
//! PostgreSQL binaries. Knobs (environment):
//!
//! | variable | default | what |
//! |---|---|---|
//! | `DURABLE_BENCH_WAKEUPS` | 50 | submits per side |
//! | `DURABLE_BENCH_WAKEUP_ROUNDS` | 5 | interleaved rounds they are split into |
//! | `DURABLE_BENCH_POLL_MS` | 500 | every pool's poll interval |
//! | `DURABLE_BENCH_OUT` | `target/durable-bench` | where the JSON goes |
//! | `DATABASE_URL` | unset | a server to use instead of the throwaway cluster |

use durable_core::store::QueueStore;
use std::sync::Arc;
use std::time::Duration;

use durable_bench::wakeup::{self, Schedule, Side};
use durable_bench::{Report, env_usize, machine, out_dir};
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

async fn open(url: &str, listen: bool) -> PostgresStore {
    PostgresStore::connect_with(PostgresStoreOptions::new(url).listen(listen))
        .await
        .expect("open the store")
}

fn durable(store: &PostgresStore, owner: &str) -> Durable {
    Durable::builder(Arc::new(store.clone()))
        .owner(owner)
        .build()
}

async fn run() {
    let out = out_dir().expect("the output directory");
    let schedule = Schedule {
        poll: Duration::from_millis(env_usize("DURABLE_BENCH_POLL_MS", 500) as u64),
        submits: env_usize("DURABLE_BENCH_WAKEUPS", 50).max(1),
        rounds: env_usize("DURABLE_BENCH_WAKEUP_ROUNDS", 5).max(1),
    };
    let mut report = Report::new("postgres-wakeup");
    let db = test_database().await;
    let listening = open(db.url(), true).await;
    let polling = open(db.url(), false).await;
    let submitting = open(db.url(), false).await;
    let version: String = sqlx::query_scalar("SELECT current_setting('server_version')")
        .fetch_one(listening.pool())
        .await
        .expect("server version");
    for (name, value) in [
        ("server_version", serde_json::Value::from(version.clone())),
        ("poll_ms", (schedule.poll.as_millis() as u64).into()),
        ("submits_per_side", schedule.submits.into()),
        ("rounds", schedule.rounds.into()),
    ] {
        report.setting(name, value);
    }
    println!(
        "durable-postgres wakeup bench: PostgreSQL {version}, poll interval {:?}, {} submits per \
         side in {} rounds, {} cores, load average {}",
        schedule.poll,
        schedule.submits,
        schedule.rounds,
        report.cores,
        machine::load_text(report.load_before),
    );
    // The listener starts with the first subscription and bumps once it listens.
    let mut ready = listening.work_events().expect("work events");
    tokio::time::timeout(Duration::from_secs(10), ready.changed())
        .await
        .expect("the store listens");

    let submitter = durable(&submitting, "web");
    wakeup::compare(
        &mut report,
        "PostgreSQL",
        Side {
            pool: &durable(&listening, "pool-listen"),
            submitter: &submitter,
        },
        Side {
            pool: &durable(&polling, "pool-poll"),
            submitter: &submitter,
        },
        schedule,
        "notified: LISTEN/NOTIFY; baseline: the same pool on a store opened with listen(false), polling only",
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
