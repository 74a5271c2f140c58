//! The journal on SQLite against raw sqlx, every figure measured next to its raw baseline
//! in the same run, on the same file system, with the store's durability settings (WAL,
//! `synchronous = FULL`, `BEGIN IMMEDIATE`, one writer connection), in interleaved rounds,
//! each figure the median round:
//!
//! 1. `pure` call µs against one raw commit (target ≤ 1.10×);
//! 2. `unsafe_on_replay` call µs against a raw two-commit pair (≤ 1.10×), and
//!    `idempotent_with_key` (informational);
//! 3. calls/s with 1, 8 and 32 sessions at once (a task each, with its own lease), `pure`
//!    and `unsafe_on_replay`, against as many tasks committing one row each on one raw
//!    file (targets at 32: ≥ 10,000 and ≥ 5,000);
//! 4. an agent turn (journaled model reply, two messages pushed, a checkpoint) over 10,000
//!    turns: µs of the first and last 100, and last ÷ first (≤ 1.10×), next to a raw turn
//!    (one transaction: the reply into a journal table, the messages into a messages table);
//! 5. storage ÷ message bytes of a 1,000-turn session (≤ 1.5×): what the session added to
//!    the file after `PRAGMA wal_checkpoint(TRUNCATE)`, against the same messages in a raw
//!    table;
//! 6. `Durable::resume` of a 100, 1,000 and 10,000-turn session against selecting and
//!    parsing the same messages raw (≤ 1.2×);
//! 7. the same resumes with `resume_window(20)` (the last 20 messages), against selecting
//!    and parsing the last 20 raw (≤ 1 ms at any length);
//! 8. a streamed model reply against the same chunks iterated raw: µs added before the
//!    first chunk (≤ 1 ms), per chunk (≤ 1 µs), and journaling the assembled reply at the
//!    end against one raw commit (≤ 1.10×).
//!
//! `cargo bench -p durable-sqlite` writes `sqlite.json` and
//! `sqlite-{turns,throughput,resume,resume-window}.svg` to `DURABLE_BENCH_OUT` (default
//! `target/durable-bench`). Knobs (environment):
//!
//! | variable | default | what |
//! |---|---|---|
//! | `DURABLE_BENCH_CALLS` | 700 | calls per latency figure (figures 1–2) |
//! | `DURABLE_BENCH_ROUNDS` | 7 | interleaved rounds of the latency figures |
//! | `DURABLE_BENCH_THROUGHPUT_CALLS` | 1920 | calls per throughput round, split over the sessions |
//! | `DURABLE_BENCH_THROUGHPUT_ROUNDS` | 3 | interleaved throughput rounds |
//! | `DURABLE_BENCH_TURNS` | 10000 | agent turns of figure 4, the longest session resumed |
//! | `DURABLE_BENCH_STORAGE_TURNS` | 1000 | turns of the session measured in figure 5 |
//! | `DURABLE_BENCH_RESUME_RUNS` | 7 | interleaved resumes of each session |
//! | `DURABLE_BENCH_STREAM_REPLIES` | 140 | streamed replies of 200 chunks (figure 8) |
//! | `DURABLE_BENCH_DIR` | the output directory | where the databases go (a temporary directory in it) |
//! | `DURABLE_BENCH_OUT` | `target/durable-bench` | where the JSON and SVGs go |

use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use durable_bench::harness::{self, Baseline, Targets};
use durable_bench::{Report, env_usize, machine, out_dir, workload};
use durable_core::{CheckpointStore, Durable, Message};
use durable_sqlite::SqliteStore;
use sqlx::SqlitePool;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};

const TARGETS: Targets = Targets {
    pure_per_s: 10_000.0,
    unsafe_per_s: 5_000.0,
    storage: 1.5,
    window_ms: 1.0,
};

/// The raw side: one file, the store's settings, one connection (the store's writer pool).
struct Raw {
    pool: SqlitePool,
    payload: String,
    /// Numbers the throughput rounds (their rows need ids of their own).
    rounds: AtomicU64,
}

impl Raw {
    async fn open(path: &Path) -> Raw {
        let options = SqliteConnectOptions::from_str(&format!("sqlite://{}", path.display()))
            .expect("url")
            .create_if_missing(true)
            .foreign_keys(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(5));
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(options)
            .await
            .expect("connect raw");
        sqlx::raw_sql(
            "CREATE TABLE rows (id TEXT PRIMARY KEY, payload TEXT NOT NULL);
             CREATE TABLE journal (session_id TEXT NOT NULL, step INTEGER NOT NULL,
                 slot TEXT NOT NULL, body TEXT NOT NULL, PRIMARY KEY (session_id, step, slot));
             CREATE TABLE messages (session_id TEXT NOT NULL, seq INTEGER NOT NULL,
                 body TEXT NOT NULL, PRIMARY KEY (session_id, seq));",
        )
        .execute(&pool)
        .await
        .expect("create the raw tables");
        Raw {
            pool,
            payload: workload::result_payload().to_string(),
            rounds: AtomicU64::new(0),
        }
    }

    async fn commit_row(pool: &SqlitePool, id: String, payload: &str) {
        let mut conn = pool.acquire().await.expect("acquire");
        sqlx::query("BEGIN IMMEDIATE")
            .execute(&mut *conn)
            .await
            .expect("begin");
        sqlx::query("INSERT INTO rows (id, payload) VALUES (?, ?)")
            .bind(id)
            .bind(payload)
            .execute(&mut *conn)
            .await
            .expect("insert");
        sqlx::query("COMMIT")
            .execute(&mut *conn)
            .await
            .expect("commit");
    }
    /// One turn in one transaction: the reply into the journal table (unless
    /// `journal` is false: figure 5's raw side holds the messages only), the reply and
    /// the tool result into the messages table.
    async fn write_turn(&self, session: &str, turn: usize, journal: bool) {
        let reply = workload::message_json(&workload::reply(turn));
        let result = workload::message_json(&workload::tool_result(turn));
        let seq = 2 * turn as i64;
        let mut conn = self.pool.acquire().await.expect("acquire");
        sqlx::query("BEGIN IMMEDIATE")
            .execute(&mut *conn)
            .await
            .expect("begin");
        if journal {
            sqlx::query(
                "INSERT INTO journal (session_id, step, slot, body) VALUES (?, ?, '@model', ?)",
            )
            .bind(session)
            .bind(turn as i64)
            .bind(&reply)
            .execute(&mut *conn)
            .await
            .expect("insert the reply");
        }
        for (i, body) in [reply, result].into_iter().enumerate() {
            sqlx::query("INSERT INTO messages (session_id, seq, body) VALUES (?, ?, ?)")
                .bind(session)
                .bind(seq + i as i64)
                .bind(body)
                .execute(&mut *conn)
                .await
                .expect("insert a message");
        }
        sqlx::query("COMMIT")
            .execute(&mut *conn)
            .await
            .expect("commit");
    }
}

impl Baseline for Raw {
    async fn one_commit(&self, n: u64) {
        Raw::commit_row(&self.pool, format!("one-{n}"), &self.payload).await;
    }

    async fn two_commits(&self, n: u64) {
        let id = format!("two-{n}");
        Raw::commit_row(&self.pool, id.clone(), "{}").await;
        let mut conn = self.pool.acquire().await.expect("acquire");
        sqlx::query("BEGIN IMMEDIATE")
            .execute(&mut *conn)
            .await
            .expect("begin");
        sqlx::query("UPDATE rows SET payload = ? WHERE id = ?")
            .bind(&self.payload)
            .bind(id)
            .execute(&mut *conn)
            .await
            .expect("update");
        sqlx::query("COMMIT")
            .execute(&mut *conn)
            .await
            .expect("commit");
    }

    async fn throughput(&self, tasks: usize, per_task: usize) -> f64 {
        let round = self.rounds.fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        let handles: Vec<_> = (0..tasks)
            .map(|task| {
                let pool = self.pool.clone();
                let payload = self.payload.clone();
                tokio::spawn(async move {
                    for i in 0..per_task {
                        Raw::commit_row(&pool, format!("t-{round}-{task}-{i}"), &payload).await;
                    }
                })
            })
            .collect();
        for handle in handles {
            handle.await.expect("raw task");
        }
        (tasks * per_task) as f64 / started.elapsed().as_secs_f64()
    }

    async fn turn(&self, session: &str, turn: usize) {
        self.write_turn(session, turn, true).await;
    }

    async fn read_messages(&self, session: &str, last: Option<usize>) -> Vec<Message> {
        let bodies: Vec<String> = sqlx::query_scalar(
            "SELECT body FROM (SELECT seq, body FROM messages WHERE session_id = ? \
             ORDER BY seq DESC LIMIT ?) ORDER BY seq",
        )
        .bind(session)
        .bind(last.map_or(-1, |n| n as i64))
        .fetch_all(&self.pool)
        .await
        .expect("select the messages");
        bodies
            .iter()
            .map(|b| serde_json::from_str(b).expect("a message"))
            .collect()
    }
}

async fn store(path: &Path) -> (SqliteStore, Durable) {
    let store = SqliteStore::open(path).await.expect("open the store");
    let durable = Durable::builder(Arc::new(store.clone()) as Arc<dyn CheckpointStore>)
        .owner("bench")
        .build();
    (store, durable)
}

/// The file's size after moving the WAL into it and truncating the WAL.
async fn file_size(pool: &SqlitePool, path: &Path) -> u64 {
    sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
        .execute(pool)
        .await
        .expect("wal checkpoint");
    std::fs::metadata(path).expect("file size").len()
}

/// Figure 5: what a `turns`-turn session adds to a fresh store, and the same messages to
/// a fresh raw table, each file measured after `PRAGMA wal_checkpoint(TRUNCATE)`.
async fn storage(report: &mut Report, dir: &Path, turns: usize) {
    let path = dir.join("storage.db");
    let (store, durable) = store(&path).await;
    let empty = file_size(store.pool(), &path).await;
    workload::agent_session(&durable, turns).await;
    let full = file_size(store.pool(), &path).await;
    store.close().await;

    let raw_path = dir.join("storage-raw.db");
    let raw = Raw::open(&raw_path).await;
    let raw_empty = file_size(&raw.pool, &raw_path).await;
    let mut message_bytes = 0;
    for turn in 0..turns {
        for message in [workload::reply(turn), workload::tool_result(turn)] {
            message_bytes += workload::message_json(&message).len() as u64;
        }
        raw.write_turn("storage", turn, false).await;
    }
    let raw_full = file_size(&raw.pool, &raw_path).await;
    harness::storage(
        report,
        turns,
        message_bytes,
        full - empty,
        raw_full.saturating_sub(raw_empty),
        TARGETS.storage,
        &format!(
            "file growth after wal_checkpoint(TRUNCATE) (durable file {full} B, {empty} B empty)"
        ),
    );
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(run());
}

async fn run() {
    let out = out_dir().expect("the output directory");
    let base = std::env::var_os("DURABLE_BENCH_DIR").map_or_else(|| out.clone(), Into::into);
    let dir = tempfile::tempdir_in(&base).expect("a temporary directory");
    let calls = env_usize("DURABLE_BENCH_CALLS", 700);
    let rounds = env_usize("DURABLE_BENCH_ROUNDS", 7).max(1);
    let throughput_calls = env_usize("DURABLE_BENCH_THROUGHPUT_CALLS", 1920);
    let throughput_rounds = env_usize("DURABLE_BENCH_THROUGHPUT_ROUNDS", 3).max(1);
    let turns = env_usize("DURABLE_BENCH_TURNS", 10_000).max(100);
    let storage_turns = env_usize("DURABLE_BENCH_STORAGE_TURNS", 1_000).max(1);
    let resume_runs = env_usize("DURABLE_BENCH_RESUME_RUNS", 7).max(1);

    let mut report = Report::new("sqlite");
    let raw = Raw::open(&dir.path().join("raw.db")).await;
    let sqlite_version: String = sqlx::query_scalar("SELECT sqlite_version()")
        .fetch_one(&raw.pool)
        .await
        .expect("version");
    for (name, value) in [
        (
            "sqlite_version",
            serde_json::Value::from(sqlite_version.clone()),
        ),
        ("calls_per_latency_figure", calls.into()),
        ("latency_rounds", rounds.into()),
        ("throughput_calls_per_round", throughput_calls.into()),
        ("throughput_rounds", throughput_rounds.into()),
        ("turns", turns.into()),
        ("storage_turns", storage_turns.into()),
        ("resume_runs", resume_runs.into()),
        (
            "settings",
            "WAL, synchronous=FULL, BEGIN IMMEDIATE, one writer connection".into(),
        ),
    ] {
        report.setting(name, value);
    }
    println!(
        "durable-sqlite bench: SQLite {sqlite_version}, {} cores, load average {}, databases in {}",
        report.cores,
        machine::load_text(report.load_before),
        dir.path().display()
    );

    let (_calls_store, durable) = store(&dir.path().join("calls.db")).await;
    eprintln!("latency: {calls} calls per figure in {rounds} rounds");
    harness::latency(&mut report, &durable, &raw, calls, rounds).await;
    eprintln!("throughput: {throughput_calls} calls per round, {throughput_rounds} rounds");
    let throughput_svg = harness::throughput(
        &mut report,
        &durable,
        &raw,
        throughput_calls,
        throughput_rounds,
        TARGETS,
    )
    .await;

    let stream_replies = env_usize("DURABLE_BENCH_STREAM_REPLIES", 140);
    eprintln!("streamed replies: {stream_replies} of 200 chunks, {rounds} rounds");
    harness::stream(&mut report, &durable, &raw, stream_replies, 200, rounds).await;

    let limited_calls = env_usize("DURABLE_BENCH_LIMITED_CALLS", 300);
    eprintln!("rate limits: {limited_calls} model calls per side, {rounds} rounds");
    durable_bench::limits::limited_call(
        &mut report,
        Arc::clone(durable.store()),
        limited_calls,
        rounds,
    )
    .await;
    let claim_sessions = env_usize("DURABLE_BENCH_CLAIM_SESSIONS", 300);
    eprintln!("claims: {claim_sessions} sessions per side, {rounds} rounds");
    durable_bench::limits::claims(
        &mut report,
        Arc::clone(durable.store()),
        claim_sessions,
        rounds,
    )
    .await;

    let (_turns_store, durable) = store(&dir.path().join("turns.db")).await;
    eprintln!("agent turns: {turns}");
    let (long, turns_svg) = harness::turns(&mut report, &durable, &raw, turns).await;
    eprintln!("storage: {storage_turns} turns");
    storage(&mut report, dir.path(), storage_turns).await;

    eprintln!("resume: {resume_runs} runs each");
    let mut sessions = Vec::new();
    for length in [100, 1_000] {
        if length < turns {
            sessions.push(harness::build_session(&durable, &raw, length).await);
        }
    }
    sessions.push(long);
    let (resume_svg, window_svg) = harness::resume(
        &mut report,
        &durable,
        &raw,
        &sessions,
        resume_runs,
        TARGETS.window_ms,
    )
    .await;

    report.finish();
    println!(
        "load average: {} before, {} after",
        machine::load_text(report.load_before),
        machine::load_text(report.load_after)
    );
    harness::write(
        &report,
        &out,
        &[
            ("turns", turns_svg),
            ("throughput", throughput_svg),
            ("resume", resume_svg),
            ("resume-window", window_svg),
        ],
    );
}
