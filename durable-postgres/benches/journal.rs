//! Journal overhead on PostgreSQL, as ratios against a raw sqlx baseline measured in the
//! same run, on the same server and database, with the same durability settings
//! (`fsync` and `synchronous_commit` on).
//!
//! `cargo bench -p durable-postgres --features testing` prints:
//! - µs per journaled call for each replay class, its ratio to one raw
//!   `BEGIN; INSERT; COMMIT` on one connection, and the overhead in µs (a `pure` call is
//!   one commit; `idempotent_with_key` and `unsafe_on_replay` need two durable commits,
//!   *issued* before the effect and the result after);
//! - throughput in journaled calls per second with 1, 8 and 32 sessions running at once
//!   (each session a task with its own lease; calls cycle through the three classes), next
//!   to raw `INSERT`+`COMMIT`s per second from as many concurrent connections.
//!
//! The server is `DATABASE_URL` when set, else a throwaway cluster started from the
//! machine's PostgreSQL binaries (`durable_postgres::testing`). `DURABLE_BENCH_CALLS` sets
//! the calls per latency figure (default 700), run in 7 rounds that interleave the figures
//! (so background load hits them alike); each figure is the median round.

use std::sync::Arc;
use std::time::{Duration, Instant};

use durable_core::transcript::Message;
use durable_core::{CheckpointStore, Durable, ReplayClass, Session, StartOptions, ToolSpec};
use durable_postgres::testing::test_database;
use durable_postgres::{PostgresStore, PostgresStoreOptions};
use serde_json::json;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

const ROUNDS: usize = 7;
const CONCURRENCY: [usize; 3] = [1, 8, 32];
/// Rounds per throughput figure, and calls per session per round.
const THROUGHPUT_ROUNDS: usize = 3;
const THROUGHPUT_CALLS: usize = 960;

fn calls() -> usize {
    std::env::var("DURABLE_BENCH_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(700)
}

fn payload() -> String {
    json!({"n": 0, "result": {"ok": true, "text": "x".repeat(64)}}).to_string()
}

/// One round trip: `SELECT 1` on one connection (to read the others in round trips).
async fn round_trip(pool: &PgPool, n: usize) -> Duration {
    let mut conn = pool.acquire().await.expect("acquire");
    let start = Instant::now();
    for _ in 0..n {
        sqlx::query("SELECT 1")
            .execute(&mut *conn)
            .await
            .expect("select 1");
    }
    start.elapsed()
}

/// The load average, to judge how quiet the machine was.
fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".into())
}

/// Raw baseline: one row per transaction.
async fn raw_round(pool: &PgPool, tag: &str, n: usize) -> Duration {
    let mut conn = pool.acquire().await.expect("acquire");
    let payload = payload();
    let start = Instant::now();
    for i in 0..n {
        sqlx::query("BEGIN")
            .execute(&mut *conn)
            .await
            .expect("begin");
        sqlx::query("INSERT INTO bench_rows (id, payload) VALUES ($1, $2)")
            .bind(format!("{tag}-{i}"))
            .bind(&payload)
            .execute(&mut *conn)
            .await
            .expect("insert");
        sqlx::query("COMMIT")
            .execute(&mut *conn)
            .await
            .expect("commit");
    }
    start.elapsed()
}

fn spec(class: ReplayClass) -> ToolSpec {
    ToolSpec::new(
        format!("bench_{class}"),
        "A tool whose body returns at once.",
        class,
        json!({"type": "object", "properties": {"n": {"type": "integer"}}}),
    )
}

async fn session(durable: &Durable) -> Session<Message> {
    durable
        .start::<Message>(StartOptions::default())
        .await
        .expect("start")
}

async fn run_one(session: &Session<Message>, spec: &ToolSpec, n: i64) {
    let mut call = session.journal().tool(spec, json!({ "n": n }));
    if spec.class == ReplayClass::IdempotentWithKey {
        call = call.key(format!("key-{n}"));
    }
    call.run(|_ctx| async move { Ok::<_, String>(json!({"ok": true, "text": "x".repeat(64)})) })
        .await
        .expect("journaled call");
}

async fn journaled_round(
    session: &Session<Message>,
    spec: &ToolSpec,
    from: i64,
    n: usize,
) -> Duration {
    let start = Instant::now();
    for i in 0..n as i64 {
        run_one(session, spec, from + i).await;
    }
    start.elapsed()
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// `sessions` tasks, each running `per_session` calls cycling through the classes on a
/// session of its own; journaled calls per second.
async fn journaled_throughput(durable: &Durable, sessions: usize, per_session: usize) -> f64 {
    let specs: Arc<[ToolSpec; 3]> = Arc::new(ReplayClass::ALL.map(spec));
    let mut handles = Vec::with_capacity(sessions);
    let mut ready = Vec::with_capacity(sessions);
    for _ in 0..sessions {
        ready.push(session(durable).await);
    }
    let start = Instant::now();
    for s in ready {
        let specs = Arc::clone(&specs);
        handles.push(tokio::spawn(async move {
            for i in 0..per_session {
                run_one(&s, &specs[i % 3], i as i64).await;
            }
        }));
    }
    for h in handles {
        h.await.expect("session task");
    }
    (sessions * per_session) as f64 / start.elapsed().as_secs_f64()
}

/// `connections` tasks, each committing `per_conn` single-row transactions.
async fn raw_throughput(pool: &PgPool, tag: &str, connections: usize, per_conn: usize) -> f64 {
    let start = Instant::now();
    let handles: Vec<_> = (0..connections)
        .map(|c| {
            let pool = pool.clone();
            let tag = format!("{tag}-{c}");
            tokio::spawn(async move { raw_round(&pool, &tag, per_conn).await })
        })
        .collect();
    for h in handles {
        h.await.expect("raw task");
    }
    (connections * per_conn) as f64 / start.elapsed().as_secs_f64()
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let db = test_database().await;
        let pool_size = CONCURRENCY[CONCURRENCY.len() - 1] as u32 + 4;
        let store =
            PostgresStore::connect_with(PostgresStoreOptions::new(db.url()).max_connections(pool_size))
                .await
        .expect("connect store");
        let raw = PgPoolOptions::new()
            .max_connections(pool_size)
            .connect(db.url())
            .await
            .expect("connect raw");
        sqlx::query("CREATE TABLE bench_rows (id TEXT PRIMARY KEY, payload TEXT NOT NULL)")
            .execute(&raw)
            .await
            .expect("create");
        let settings: (String, String) =
            sqlx::query_as("SELECT current_setting('fsync'), current_setting('synchronous_commit')")
                .fetch_one(&raw)
                .await
                .expect("settings");
        let version: String = sqlx::query_scalar("SHOW server_version")
            .fetch_one(&raw)
            .await
            .expect("version");
        let n = calls();
        let per_round = n.div_ceil(ROUNDS);
        println!(
            "durable-postgres journal benchmark: PostgreSQL {version}, fsync={} synchronous_commit={}, \
             {n} calls per latency figure in {ROUNDS} interleaved rounds (median round); \
             load average {}",
            settings.0,
            settings.1,
            load()
        );
        let durable = Durable::builder(Arc::new(store.clone()) as Arc<dyn CheckpointStore>)
            .owner("bench")
            .build();
        let classes = ReplayClass::ALL;
        let mut setups = Vec::new();
        for class in classes {
            let s = session(&durable).await;
            let spec = spec(class);
            // warm-up: the step cache, the durability check, prepared statements
            journaled_round(&s, &spec, 1_000_000, 5).await;
            setups.push((s, spec));
        }
        raw_round(&raw, "warm", 5).await;
        let per = |d: Duration| d.as_secs_f64() * 1e6 / per_round as f64;
        let mut raw_us = Vec::new();
        let mut rtt_us = Vec::new();
        let mut class_us = vec![Vec::new(); classes.len()];
        for round in 0..ROUNDS {
            raw_us.push(per(raw_round(&raw, &format!("r{round}"), per_round).await));
            rtt_us.push(per(round_trip(&raw, per_round).await));
            for (i, (s, spec)) in setups.iter().enumerate() {
                let from = (round * per_round) as i64;
                class_us[i].push(per(journaled_round(s, spec, from, per_round).await));
            }
        }
        drop(setups);
        let raw_median = median(raw_us);
        println!(
            "{:<34} {:>8.1} µs/call   1.00×",
            "raw INSERT+COMMIT (baseline)", raw_median
        );
        println!(
            "{:<34} {:>8.1} µs/call   {:.2}×",
            "one round trip (SELECT 1)",
            median(rtt_us.clone()),
            median(rtt_us) / raw_median
        );
        for (class, samples) in classes.iter().zip(class_us) {
            let took = median(samples);
            println!(
                "{:<34} {:>8.1} µs/call   {:.2}×   overhead {:+.1} µs",
                format!("journaled {class}"),
                took,
                took / raw_median,
                took - raw_median
            );
        }

        println!(
            "throughput ({THROUGHPUT_ROUNDS} interleaved rounds, median; {THROUGHPUT_CALLS} calls per \
             round split over the sessions; calls cycle pure → keyed → unsafe):"
        );
        for sessions in CONCURRENCY {
            let per_session = THROUGHPUT_CALLS / sessions;
            let (mut raw_rates, mut journal_rates) = (Vec::new(), Vec::new());
            for round in 0..THROUGHPUT_ROUNDS {
                raw_rates.push(
                    raw_throughput(&raw, &format!("t{sessions}-{round}"), sessions, per_session).await,
                );
                journal_rates.push(journaled_throughput(&durable, sessions, per_session).await);
            }
            let (raw_rate, journal_rate) = (median(raw_rates), median(journal_rates));
            println!(
                "  {sessions:>2} session(s): {journal_rate:>7.0} journaled calls/s   \
                 raw INSERT+COMMIT {raw_rate:>7.0}/s from {sessions} connection(s)   ({:.2}× raw)",
                journal_rate / raw_rate
            );
        }
        println!("load average at the end: {}", load());
    });
}
