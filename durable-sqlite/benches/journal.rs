//! Journal overhead on SQLite, as ratios against a raw sqlx baseline measured in the same
//! run, on the same file system, with the same durability settings (WAL,
//! `synchronous = FULL`, `BEGIN IMMEDIATE`).
//!
//! `cargo bench -p durable-sqlite` prints:
//! - µs per journaled call for each replay class, and the ratio to one raw
//!   `BEGIN IMMEDIATE; INSERT; COMMIT` (targets: `pure` ≤ 1.2×, `unsafe_on_replay` ≤ 2.3×:
//!   an unsafe call needs two durable commits, *issued* then the result);
//! - µs per `unsafe_on_replay` call *followed by a checkpoint* holding its result message,
//!   two ways: the call then `checkpoint()` (three commits: issued, result, checkpoint)
//!   and `Session::checkpoint_after` (two: issued, then result and checkpoint together);
//! - the database size after a 1,000-turn session of ~500-byte messages, as a ratio to the
//!   message bytes (target ≤ 1.5×: linear, where a store copying the transcript into every
//!   checkpoint grows quadratically).
//!
//! `DURABLE_BENCH_CALLS` sets the number of calls per figure (default 400), run in 7 rounds
//! that interleave the four figures (so background load hits them alike); each figure is
//! the median round. `DURABLE_BENCH_DIR` sets where the databases go (default: here).

use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use durable_core::transcript::Message;
use durable_core::{CheckpointStore, Durable, ReplayClass, StartOptions, ToolSpec};
use durable_sqlite::SqliteStore;
use serde_json::json;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};

fn calls() -> usize {
    std::env::var("DURABLE_BENCH_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400)
}

/// Raw baseline: one row per transaction, same settings as the store.
async fn raw_pool(dir: &std::path::Path) -> sqlx::SqlitePool {
    let options =
        SqliteConnectOptions::from_str(&format!("sqlite://{}", dir.join("raw.db").display()))
            .expect("url")
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(5));
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await
        .expect("connect raw");
    sqlx::query("CREATE TABLE rows (id TEXT PRIMARY KEY, payload TEXT NOT NULL)")
        .execute(&pool)
        .await
        .expect("create");
    pool
}

async fn raw_round(pool: &sqlx::SqlitePool, round: usize, n: usize) -> Duration {
    let mut conn = pool.acquire().await.expect("acquire");
    let payload = json!({"n": 0, "result": {"ok": true, "text": "x".repeat(64)}}).to_string();
    let start = Instant::now();
    for i in (round * n)..((round + 1) * n) {
        sqlx::query("BEGIN IMMEDIATE")
            .execute(&mut *conn)
            .await
            .expect("begin");
        sqlx::query("INSERT INTO rows (id, payload) VALUES (?, ?)")
            .bind(format!("row-{i}"))
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

async fn journaled_setup(
    dir: &std::path::Path,
    class: ReplayClass,
) -> (durable_core::Session<Message>, ToolSpec) {
    let store: Arc<dyn CheckpointStore> = Arc::new(
        SqliteStore::open(dir.join(format!("{class}.db")))
            .await
            .expect("open store"),
    );
    let durable = Durable::builder(store).owner("bench").build();
    let session = durable
        .start::<Message>(StartOptions::default())
        .await
        .expect("start");
    let spec = ToolSpec::new(
        "bench_tool",
        "A tool whose body returns at once.",
        class,
        json!({"type": "object", "properties": {"n": {"type": "integer"}}}),
    );
    // warm-up: the step cache, the durability check, prepared statements
    for i in 0..5 {
        run_one(&session, &spec, 1_000_000 + i).await;
    }
    (session, spec)
}

async fn journaled_round(
    session: &durable_core::Session<Message>,
    spec: &ToolSpec,
    round: usize,
    n: usize,
) -> Duration {
    let start = Instant::now();
    for i in (round * n)..((round + 1) * n) {
        run_one(session, spec, i as i64).await;
    }
    start.elapsed()
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

async fn run_one(session: &durable_core::Session<Message>, spec: &ToolSpec, n: i64) {
    run_on(session.journal(), spec, n).await;
}

async fn run_on(journal: &durable_core::Journal, spec: &ToolSpec, n: i64) {
    let mut call = journal.tool(spec, json!({ "n": n }));
    if spec.class == ReplayClass::IdempotentWithKey {
        call = call.key(format!("key-{n}"));
    }
    call.run(|_ctx| async move { Ok::<_, String>(json!({"ok": true, "text": "x".repeat(64)})) })
        .await
        .expect("journaled call");
}

/// An unsafe call and a checkpoint holding its result, per iteration: the call then
/// `checkpoint()`, or both through `checkpoint_after`.
async fn turn_round(
    session: &mut durable_core::Session<Message>,
    spec: &ToolSpec,
    atomic: bool,
    round: usize,
    n: usize,
) -> Duration {
    let start = Instant::now();
    for i in (round * n)..((round + 1) * n) {
        if atomic {
            session
                .checkpoint_after(
                    async |journal| {
                        run_on(journal, spec, i as i64).await;
                        Ok::<_, durable_core::CallError<String>>(())
                    },
                    |outcome| Message::tool_outcome("call", outcome),
                )
                .await
                .expect("call and checkpoint");
        } else {
            run_one(session, spec, i as i64).await;
            session.push(Message::tool_result("call", json!({"ok": true}), false));
            session.checkpoint().await.expect("checkpoint");
        }
    }
    start.elapsed()
}

async fn size_after_turns(dir: &std::path::Path, turns: usize) -> (u64, u64) {
    let path = dir.join("size.db");
    let store = SqliteStore::open(&path).await.expect("open");
    let durable = Durable::builder(Arc::new(store.clone()))
        .owner("bench")
        .build();
    let mut session = durable
        .start::<Message>(StartOptions::default())
        .await
        .expect("start");
    let mut message_bytes = 0u64;
    for turn in 0..turns {
        let text = format!(
            "turn {turn:05}: {}",
            "lorem ipsum dolor sit amet ".repeat(18)
        );
        let message = Message::user(text);
        message_bytes += serde_json::to_string(&message).expect("json").len() as u64;
        session.push(message);
        session.checkpoint().await.expect("checkpoint");
    }
    drop(session);
    sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
        .execute(store.pool())
        .await
        .expect("wal checkpoint");
    store.close().await;
    let size = std::fs::metadata(&path).expect("db size").len();
    (size, message_bytes)
}

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let dir =
            tempfile::tempdir_in(std::env::var("DURABLE_BENCH_DIR").unwrap_or_else(|_| ".".into()))
                .expect("tempdir");
        let n = calls();
        println!(
            "durable-sqlite journal benchmark ({n} calls per figure in 7 interleaved rounds, median round; dir {})",
            dir.path().display()
        );
        // Rounds interleave the four figures so background load hits them alike; each
        // figure is the median round.
        const ROUNDS: usize = 7;
        let per_round = n.div_ceil(ROUNDS);
        let pool = raw_pool(dir.path()).await;
        let classes = [
            (ReplayClass::Pure, 1.2),
            (ReplayClass::IdempotentWithKey, 2.3),
            (ReplayClass::UnsafeOnReplay, 2.3),
        ];
        let mut setups = Vec::new();
        for (class, _) in classes {
            setups.push(journaled_setup(dir.path(), class).await);
        }
        let mut turns = Vec::new();
        for name in ["turn_separate", "turn_atomic"] {
            let sub = dir.path().join(name);
            std::fs::create_dir(&sub).expect("mkdir");
            turns.push(journaled_setup(&sub, ReplayClass::UnsafeOnReplay).await);
        }
        let mut raw_us = Vec::new();
        let mut class_us = vec![Vec::new(); classes.len()];
        let mut turn_us = vec![Vec::new(); 2];
        let per = |d: Duration| d.as_secs_f64() * 1e6 / per_round as f64;
        for round in 0..ROUNDS {
            raw_us.push(per(raw_round(&pool, round, per_round).await));
            for (i, (session, spec)) in setups.iter().enumerate() {
                class_us[i].push(per(journaled_round(session, spec, round, per_round).await));
            }
            for (i, (session, spec)) in turns.iter_mut().enumerate() {
                let atomic = i == 1;
                turn_us[i].push(per(turn_round(session, spec, atomic, round, per_round).await));
            }
        }
        let raw = median(raw_us);
        println!(
            "{:<34} {:>9.1} µs/call   1.00×",
            "raw INSERT+COMMIT (baseline)", raw
        );
        for ((class, target), samples) in classes.iter().zip(class_us) {
            let took = median(samples);
            println!(
                "{:<34} {:>9.1} µs/call   {:.2}×  (target ≤ {target}×)",
                format!("journaled {class}"),
                took,
                took / raw
            );
        }
        for (name, samples) in [
            "unsafe + checkpoint()",
            "unsafe + checkpoint_after (atomic)",
        ]
        .iter()
        .zip(turn_us)
        {
            let took = median(samples);
            println!("{name:<34} {took:>9.1} µs/call   {:.2}×", took / raw);
        }
        let (size, bytes) = size_after_turns(dir.path(), 1_000).await;
        println!(
            "{:<34} {:>9} bytes for {} message bytes: {:.2}×  (target ≤ 1.5×)",
            "1,000-turn session, db size",
            size,
            bytes,
            size as f64 / bytes as f64
        );
    });
}
