//! The journal on PostgreSQL against raw sqlx, every figure measured next to its raw
//! baseline in the same run, on the same server and database, with the same durability
//! settings (`fsync` and `synchronous_commit` on), in interleaved rounds, each figure the
//! median round:
//!
//! 1. `pure` call µs against one raw `BEGIN; INSERT; COMMIT` (target ≤ 1.10×);
//! 2. `unsafe_on_replay` call µs against a raw two-commit pair (≤ 1.10×), and
//!    `idempotent_with_key` (informational);
//! 3. calls/s with 1, 8 and 32 sessions at once (a task each, with its own lease), `pure`
//!    and `unsafe_on_replay`, against as many tasks committing one row each over as many
//!    connections (targets at 32: ≥ 15,000 and ≥ 8,000);
//! 4. an agent turn (journaled model reply, two messages pushed, a checkpoint) over 10,000
//!    turns: µs of the first and last 100, and last ÷ first (≤ 1.10×), next to a raw turn
//!    (one transaction: the reply into a journal table, the messages into a messages table);
//! 5. storage ÷ message bytes of a 1,000-turn session (≤ 1.8×): what the session added to
//!    `pg_total_relation_size` of the `durable_*` tables of a fresh database (VACUUMed
//!    before and after), against the same messages in a raw table;
//! 6. `Durable::resume` of a 100, 1,000 and 10,000-turn session against selecting and
//!    parsing the same messages raw (≤ 1.2×);
//! 7. the same resumes with `resume_window(20)` (the last 20 messages), against selecting
//!    and parsing the last 20 raw (≤ 2 ms at any length);
//! 8. server CPU per `pure` call against a raw commit (≤ 1.5×) and per `unsafe_on_replay`
//!    call against a raw two-commit pair (informational): the CPU time of the server's
//!    processes (`/proc/<pid>/schedstat` of the postmaster and its children, so only on
//!    the throwaway cluster or a server on this machine), in interleaved rounds;
//! 9. a streamed model reply against the same chunks iterated raw: µs added before the
//!    first chunk (≤ 1 ms), per chunk (≤ 1 µs), and journaling the assembled reply at the
//!    end against one raw commit (≤ 1.10×).
//!
//! `cargo bench -p durable-postgres --features testing` writes `postgres.json` and
//! `postgres-{turns,throughput,resume,resume-window}.svg` to `DURABLE_BENCH_OUT` (default
//! `target/durable-bench`). The server is `DATABASE_URL` when set, else a throwaway cluster
//! started from the machine's PostgreSQL binaries (`durable_postgres::testing`); each run
//! uses fresh databases. Knobs (environment):
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
//! | `DURABLE_BENCH_STREAM_REPLIES` | 140 | streamed replies of 200 chunks (figure 9) |
//! | `DURABLE_BENCH_OUT` | `target/durable-bench` | where the JSON and SVGs go |
//! | `DATABASE_URL` | unset | a server to use instead of the throwaway cluster |
//! | `DURABLE_BENCH_ONLY` | unset | `latency`: figures 1, 2 and 8 only |
//! | `DURABLE_BENCH_PG_BEFORE` | unset | `1`: the store as before the plan fixes, emulated (every statement re-planned, `plan_cache_mode = force_custom_plan`; the partial index over `issued_rows` back) |

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use durable_bench::harness::{self, Baseline, Targets};
use durable_bench::{Report, Row, Target, env_usize, machine, out_dir, workload};
use durable_core::{CheckpointStore, Durable, Message};
use durable_postgres::testing::test_database;
use durable_postgres::{PostgresStore, PostgresStoreOptions};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

const TARGETS: Targets = Targets {
    pure_per_s: 15_000.0,
    unsafe_per_s: 8_000.0,
    storage: 1.8,
    window_ms: 2.0,
};

/// Connections of the store's pool and of the raw pool: one per session at 32, and spare.
const POOL: u32 = 36;

/// The raw side: tables in the same database as the store's, a pool of as many
/// connections.
struct Raw {
    pool: PgPool,
    payload: String,
    /// Numbers the throughput rounds (their rows need ids of their own).
    rounds: AtomicU64,
}

impl Raw {
    async fn connect(url: &str) -> Raw {
        let pool = PgPoolOptions::new()
            .max_connections(POOL)
            .connect(url)
            .await
            .expect("connect raw");
        sqlx::raw_sql(
            "CREATE TABLE bench_rows (id TEXT PRIMARY KEY, payload TEXT NOT NULL);
             CREATE TABLE bench_journal (session_id TEXT NOT NULL, step BIGINT NOT NULL,
                 slot TEXT NOT NULL, body TEXT NOT NULL, PRIMARY KEY (session_id, step, slot));
             CREATE TABLE bench_messages (session_id TEXT NOT NULL, seq BIGINT NOT NULL,
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

    async fn commit_row(pool: &PgPool, id: String, payload: &str) {
        let mut conn = pool.acquire().await.expect("acquire");
        sqlx::query("BEGIN")
            .execute(&mut *conn)
            .await
            .expect("begin");
        sqlx::query("INSERT INTO bench_rows (id, payload) VALUES ($1, $2)")
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

    /// One turn in one transaction: the reply into the journal table (unless `journal`
    /// is false: figure 5's raw side holds the messages only), the reply and the tool
    /// result into the messages table.
    async fn write_turn(&self, session: &str, turn: usize, journal: bool) {
        let reply = workload::message_json(&workload::reply(turn));
        let result = workload::message_json(&workload::tool_result(turn));
        let seq = 2 * turn as i64;
        let mut conn = self.pool.acquire().await.expect("acquire");
        sqlx::query("BEGIN")
            .execute(&mut *conn)
            .await
            .expect("begin");
        if journal {
            sqlx::query(
                "INSERT INTO bench_journal (session_id, step, slot, body) VALUES ($1, $2, '@model', $3)",
            )
            .bind(session)
            .bind(turn as i64)
            .bind(&reply)
            .execute(&mut *conn)
            .await
            .expect("insert the reply");
        }
        for (i, body) in [reply, result].into_iter().enumerate() {
            sqlx::query("INSERT INTO bench_messages (session_id, seq, body) VALUES ($1, $2, $3)")
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
        sqlx::query("BEGIN")
            .execute(&mut *conn)
            .await
            .expect("begin");
        sqlx::query("UPDATE bench_rows SET payload = $1 WHERE id = $2")
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
            "SELECT body FROM (SELECT seq, body FROM bench_messages WHERE session_id = $1 \
             ORDER BY seq DESC LIMIT $2) m ORDER BY seq",
        )
        .bind(session)
        .bind(last.map(|n| n as i64))
        .fetch_all(&self.pool)
        .await
        .expect("select the messages");
        bodies
            .iter()
            .map(|b| serde_json::from_str(b).expect("a message"))
            .collect()
    }
}

/// Whether to emulate the store as it was before the plan fixes (`DURABLE_BENCH_PG_BEFORE=1`).
fn before() -> bool {
    std::env::var("DURABLE_BENCH_PG_BEFORE").is_ok_and(|v| v == "1")
}

async fn store(url: &str) -> (PostgresStore, Durable) {
    let url = if before() {
        // Every connection re-plans every statement, as those opened before the first
        // ANALYZE did; and the index whose predicate names `issued_rows` is back.
        let sep = if url.contains('?') { '&' } else { '?' };
        format!("{url}{sep}options=-c%20plan_cache_mode%3Dforce_custom_plan")
    } else {
        url.to_owned()
    };
    let store = PostgresStore::connect_with(PostgresStoreOptions::new(&url).max_connections(POOL))
        .await
        .expect("connect the store");
    if before() {
        sqlx::raw_sql(
            "CREATE INDEX IF NOT EXISTS durable_sessions_uncounted \
             ON durable_sessions (created_at, id) WHERE issued_rows IS NULL",
        )
        .execute(store.pool())
        .await
        .expect("the old partial index");
    }
    let durable = Durable::builder(Arc::new(store.clone()) as Arc<dyn CheckpointStore>)
        .owner("bench")
        .build();
    (store, durable)
}

/// Nanoseconds of CPU the server's processes have used so far: the postmaster and every
/// process whose parent it is (`/proc/<pid>/schedstat`). `None` where the server's
/// processes are not on this machine.
fn server_cpu_ns(postmaster: u32) -> Option<u64> {
    let cpu = |pid: &str| -> Option<u64> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/schedstat")).ok()?;
        text.split_whitespace().next()?.parse().ok()
    };
    let mut total = cpu(&postmaster.to_string())?;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // The parent's pid is the second field after the command's closing parenthesis.
        let parent = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if parent == Some(postmaster) {
            total += cpu(pid).unwrap_or(0);
        }
    }
    Some(total)
}

/// The postmaster's pid, from `postmaster.pid` in the data directory; `None` when the
/// server is not on this machine (or the role may not read `data_directory`).
async fn postmaster_pid(pool: &PgPool) -> Option<u32> {
    let dir: String = sqlx::query_scalar("SELECT current_setting('data_directory')")
        .fetch_one(pool)
        .await
        .ok()?;
    let text = std::fs::read_to_string(format!("{dir}/postmaster.pid")).ok()?;
    text.lines().next()?.trim().parse().ok()
}

/// Figure 8: server CPU µs per `pure` call against a raw commit, and per
/// `unsafe_on_replay` call against a raw two-commit pair, `calls` of each per figure in
/// `rounds` interleaved rounds, each figure the median round.
async fn server_cpu(
    report: &mut Report,
    durable: &Durable,
    raw: &Raw,
    calls: usize,
    rounds: usize,
) {
    use durable_bench::Samples;
    use durable_core::ReplayClass;

    let Some(postmaster) = postmaster_pid(&raw.pool)
        .await
        .filter(|p| server_cpu_ns(*p).is_some())
    else {
        eprintln!("server CPU: the server's processes are not on this machine; not measured");
        return;
    };
    let per_round = calls.div_ceil(rounds).max(1);
    let pure = workload::spec(ReplayClass::Pure);
    let unsafe_ = workload::spec(ReplayClass::UnsafeOnReplay);
    let sessions = [
        workload::start(durable).await,
        workload::start(durable).await,
    ];
    for n in 0..5 {
        workload::call(&sessions[0], &pure, 3_000_000_000 + n).await;
        workload::call(&sessions[1], &unsafe_, 3_000_000_000 + n).await;
    }
    let cpu = || server_cpu_ns(postmaster).unwrap_or(0);
    let per_call = |from: u64| (cpu().saturating_sub(from)) as f64 / 1_000.0 / per_round as f64;
    let mut samples = Samples::new();
    for round in 0..rounds {
        let base = 4_000_000_000 + (round * per_round) as u64;
        let ids = base..base + per_round as u64;
        let from = cpu();
        for n in ids.clone() {
            raw.one_commit(n).await;
        }
        samples.add("raw1", per_call(from));
        let from = cpu();
        for n in ids.clone() {
            workload::call(&sessions[0], &pure, n).await;
        }
        samples.add("pure", per_call(from));
        let from = cpu();
        for n in ids.clone() {
            raw.two_commits(n).await;
        }
        samples.add("raw2", per_call(from));
        let from = cpu();
        for n in ids.clone() {
            workload::call(&sessions[1], &unsafe_, n).await;
        }
        samples.add("unsafe", per_call(from));
    }
    for session in sessions {
        session.release().await.expect("release");
    }
    report.push(
        Row::new(
            "server CPU per `pure` call",
            "µs/call",
            samples.median("pure"),
            samples.median("raw1"),
        )
        .target(Target::ratio_at_most(1.5))
        .note("raw: one commit; CPU of the postmaster and its children"),
    );
    report.push(
        Row::new(
            "server CPU per `unsafe_on_replay` call (informational)",
            "µs/call",
            samples.median("unsafe"),
            samples.median("raw2"),
        )
        .note("raw: a two-commit pair"),
    );
}

/// `pg_total_relation_size` (heap, indexes, TOAST, free-space and visibility maps) of the
/// tables whose names are `LIKE pattern`, each VACUUMed first.
async fn tables_size(pool: &PgPool, pattern: &str) -> u64 {
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT tablename::text FROM pg_tables WHERE schemaname = current_schema() AND tablename LIKE $1",
    )
    .bind(pattern)
    .fetch_all(pool)
    .await
    .expect("list the tables");
    for table in &tables {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("VACUUM \"{table}\"")))
            .execute(pool)
            .await
            .expect("vacuum");
    }
    let size: i64 = sqlx::query_scalar(
        "SELECT COALESCE(SUM(pg_total_relation_size(quote_ident(tablename)))::bigint, 0)
         FROM pg_tables WHERE schemaname = current_schema() AND tablename LIKE $1",
    )
    .bind(pattern)
    .fetch_one(pool)
    .await
    .expect("table sizes");
    u64::try_from(size).unwrap_or(0)
}

/// Each `durable_*` table's bytes (VACUUMed by [`tables_size`] just before): its rows
/// (heap and TOAST) and its indexes, by table name.
async fn tables_breakdown(pool: &PgPool) -> Vec<(String, i64, i64)> {
    sqlx::query_as(
        "SELECT tablename::text, \
           (pg_total_relation_size(quote_ident(tablename)) \
            - pg_indexes_size(quote_ident(tablename)))::bigint, \
           pg_indexes_size(quote_ident(tablename))::bigint \
         FROM pg_tables WHERE schemaname = current_schema() AND tablename LIKE 'durable\\_%' \
         ORDER BY tablename",
    )
    .fetch_all(pool)
    .await
    .expect("table sizes")
}

/// Figure 5: what a `turns`-turn session adds to the `durable_*` tables of a fresh
/// database, and the same messages to a raw table in it. Prints what each table grew by
/// (rows and indexes), which says where the bytes above the messages' own go.
async fn storage(report: &mut Report, turns: usize) {
    let db = test_database().await;
    let (store, durable) = store(db.url()).await;
    let raw = Raw::connect(db.url()).await;
    let empty = tables_size(store.pool(), "durable\\_%").await;
    let before = tables_breakdown(store.pool()).await;
    workload::agent_session(&durable, turns).await;
    let full = tables_size(store.pool(), "durable\\_%").await;
    for (table, rows, indexes) in tables_breakdown(store.pool()).await {
        let (rows_0, indexes_0) = before
            .iter()
            .find(|(t, _, _)| *t == table)
            .map_or((0, 0), |(_, r, i)| (*r, *i));
        if rows > rows_0 || indexes > indexes_0 {
            eprintln!(
                "storage: {table} grew by {} B of rows, {} B of indexes",
                rows - rows_0,
                indexes - indexes_0
            );
        }
    }
    let raw_empty = tables_size(&raw.pool, "bench\\_messages").await;
    let mut message_bytes = 0;
    for turn in 0..turns {
        for message in [workload::reply(turn), workload::tool_result(turn)] {
            message_bytes += workload::message_json(&message).len() as u64;
        }
        raw.write_turn("storage", turn, false).await;
    }
    let raw_full = tables_size(&raw.pool, "bench\\_messages").await;
    harness::storage(
        report,
        turns,
        message_bytes,
        full.saturating_sub(empty),
        raw_full.saturating_sub(raw_empty),
        TARGETS.storage,
        &format!(
            "growth of pg_total_relation_size, VACUUMed (durable_* tables {full} B, {empty} B empty)"
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
    let calls = env_usize("DURABLE_BENCH_CALLS", 700);
    let rounds = env_usize("DURABLE_BENCH_ROUNDS", 7).max(1);
    let throughput_calls = env_usize("DURABLE_BENCH_THROUGHPUT_CALLS", 1920);
    let throughput_rounds = env_usize("DURABLE_BENCH_THROUGHPUT_ROUNDS", 3).max(1);
    let turns = env_usize("DURABLE_BENCH_TURNS", 10_000).max(100);
    let storage_turns = env_usize("DURABLE_BENCH_STORAGE_TURNS", 1_000).max(1);
    let resume_runs = env_usize("DURABLE_BENCH_RESUME_RUNS", 7).max(1);

    let mut report = Report::new("postgres");
    let db = test_database().await;
    let raw = Raw::connect(db.url()).await;
    let (version, fsync, sync_commit): (String, String, String) = sqlx::query_as(
        "SELECT current_setting('server_version'), current_setting('fsync'), \
         current_setting('synchronous_commit')",
    )
    .fetch_one(&raw.pool)
    .await
    .expect("settings");
    for (name, value) in [
        ("server_version", serde_json::Value::from(version.clone())),
        ("fsync", fsync.clone().into()),
        ("synchronous_commit", sync_commit.clone().into()),
        ("pool_connections", POOL.into()),
        ("calls_per_latency_figure", calls.into()),
        ("latency_rounds", rounds.into()),
        ("throughput_calls_per_round", throughput_calls.into()),
        ("throughput_rounds", throughput_rounds.into()),
        ("turns", turns.into()),
        ("storage_turns", storage_turns.into()),
        ("resume_runs", resume_runs.into()),
    ] {
        report.setting(name, value);
    }
    println!(
        "durable-postgres bench: PostgreSQL {version}, fsync={fsync} synchronous_commit={sync_commit}, \
         {} cores, load average {}",
        report.cores,
        machine::load_text(report.load_before),
    );

    report.setting("emulated_before_issue_26", before());
    let (_store, durable) = store(db.url()).await;
    eprintln!("latency: {calls} calls per figure in {rounds} rounds");
    harness::latency(&mut report, &durable, &raw, calls, rounds).await;
    eprintln!("server CPU: {calls} calls per figure in {rounds} rounds");
    server_cpu(&mut report, &durable, &raw, calls, rounds).await;
    if std::env::var("DURABLE_BENCH_ONLY").is_ok_and(|v| v == "latency") {
        report.finish();
        println!(
            "load average: {} before, {} after",
            machine::load_text(report.load_before),
            machine::load_text(report.load_after)
        );
        harness::write(&report, &out, &[]);
        return;
    }
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

    eprintln!("agent turns: {turns}");
    let (long, turns_svg) = harness::turns(&mut report, &durable, &raw, turns).await;
    eprintln!("storage: {storage_turns} turns");
    storage(&mut report, storage_turns).await;

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
