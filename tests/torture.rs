//! The crash torture suite: the agent of `examples/crash_resume` (the torture script: three
//! `pure`, three `idempotent_with_key` and three `unsafe_on_replay` tools, parallel calls,
//! four checkpoints) killed with SIGKILL, in real processes, on SQLite and PostgreSQL.
//!
//! - **every crash point**: killed at each journal boundary in turn, then resumed to the
//!   end (an operator resolving what needs one); inside an unsafe call's window the
//!   resume stops with `ReplayUnsafe` and the tool runs 0 more times; every run ends with
//!   the crash-free run's transcript, byte for byte.
//! - **random kills**: SIGKILL at seeded random instants, restarting until each session
//!   ends (completed, or parked for an operator): no duplicate effect, no lost recorded
//!   result, `PRAGMA integrity_check` ok after every kill on SQLite.
//! - **completed means never again**: 100 resumes of a turn whose calls are recorded (10
//!   killed mid-resume, each frozen after a seeded random journal event and killed
//!   there): 0 executions, identical bytes.
//! - **the model changes its mind**: after a crash behind an unsafe call's issued commit,
//!   a re-asked model proposes other arguments or another unsafe tool: refused, 0
//!   executions.
//! - **approval crash points**: a keyed and an unsafe tool need approval; killed before
//!   and after each request is journaled and at every boundary of each approved call's
//!   run, then run to the end with a person approving: the transcript of the run without
//!   approvals, byte for byte, every effect once, one request/approval/issue per tool.
//!
//! The world (outbox, chat, webhook, payment/stock/order receivers, a log of every tool
//! run) lives in files outside the store: they are the ledger the checks trust.
//!
//! `harness = false`: this binary is also the agent (run with `DURABLE_AGENT_CHILD=1`).
//! It prints one summary line per case and backend. Environment: `DURABLE_SEED` (decimal
//! or `0x…` hex) replays the random kill times of an earlier run (the seed fixes the
//! times, not the machine's speed); `DURABLE_TORTURE_KILLS` sets the number of random
//! kills (default 200, shared between the backends). Arguments filter cases by name.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Fails the case with a message unless `cond` holds.
macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+));
        }
    };
}

// The agent, shared with the demo; this suite uses only part of each module.
#[allow(dead_code)]
#[path = "../examples/crash_resume/agent.rs"]
mod agent;
#[allow(dead_code)]
#[path = "../examples/crash_resume/model.rs"]
mod model;
#[allow(dead_code)]
#[path = "../examples/crash_resume/narrate.rs"]
mod narrate;
#[allow(dead_code)]
#[path = "../examples/crash_resume/points.rs"]
mod points;
#[allow(dead_code)]
#[path = "../examples/crash_resume/tools.rs"]
mod tools;
#[allow(dead_code)]
#[path = "../examples/crash_resume/ui.rs"]
mod ui;
#[allow(dead_code)]
#[path = "../examples/crash_resume/world.rs"]
mod world;

#[path = "torture/cases.rs"]
mod cases;
#[path = "torture/support.rs"]
mod support;

use support::{Backend, Ctx};

fn seed() -> u64 {
    match std::env::var("DURABLE_SEED") {
        Ok(text) => {
            let text = text.trim();
            let parsed = match text.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => text.parse(),
            };
            parsed.unwrap_or_else(|e| panic!("DURABLE_SEED=`{text}` is not a number: {e}"))
        }
        Err(_) => SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0x5eed, |d| d.as_nanos() as u64),
    }
}

fn main() {
    if agent::is_child() {
        std::process::exit(agent::child_main());
    }
    let started = Instant::now();
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let mut backends = vec![Backend::Sqlite];
    if cfg!(feature = "_postgres-testing") {
        backends.push(Backend::Postgres);
    }
    let kills: usize = std::env::var("DURABLE_TORTURE_KILLS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(200);
    let per_backend = kills.div_ceil(backends.len());
    let seed = seed();
    println!(
        "torture: seed {seed:#x} (DURABLE_SEED={seed:#x} replays the kill times); {kills} random kills over {} backend(s)",
        backends.len()
    );
    if !cfg!(feature = "_postgres-testing") {
        println!("torture: PostgreSQL cases not built (run with --all-features)");
    }

    let ctx = Ctx::new();
    type Case<'a> = (
        &'static str,
        Box<dyn Fn(Backend) -> Result<cases::Figures, String> + 'a>,
    );
    let ctx_ref = &ctx;
    let cases: Vec<Case> = vec![
        (
            "every_crash_point",
            Box::new(move |b| cases::every_crash_point(ctx_ref, b)),
        ),
        (
            "random_kills",
            Box::new(move |b| cases::random_kills(ctx_ref, b, per_backend, seed ^ salt(b))),
        ),
        (
            "completed_means_never_again",
            Box::new(move |b| cases::completed_never_again(ctx_ref, b, seed ^ salt(b))),
        ),
        (
            "model_changes_its_mind",
            Box::new(move |b| cases::model_changes_its_mind(ctx_ref, b)),
        ),
        (
            "approval_crash_points",
            Box::new(move |b| cases::approval_crash_points(ctx_ref, b)),
        ),
    ];
    let (mut passed, mut failed) = (0, 0);
    for (name, case) in &cases {
        if !filter.is_empty() && !filter.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        for &backend in &backends {
            let t = Instant::now();
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| case(backend)));
            let secs = t.elapsed().as_secs_f64();
            match outcome {
                Ok(Ok(figures)) => {
                    println!(
                        "test {name} [{}] ... ok ({secs:.1} s): {}",
                        backend.name(),
                        figures.line()
                    );
                    passed += 1;
                }
                Ok(Err(failure)) => {
                    println!(
                        "test {name} [{}] ... FAILED ({secs:.1} s)\n  {failure}",
                        backend.name()
                    );
                    failed += 1;
                }
                Err(_) => {
                    println!(
                        "test {name} [{}] ... FAILED (panicked, {secs:.1} s)",
                        backend.name()
                    );
                    failed += 1;
                }
            }
        }
    }
    println!(
        "\ntest result: {}. {passed} passed; {failed} failed; 0 ignored; 0 measured; 0 filtered out; finished in {:.1} s",
        if failed == 0 { "ok" } else { "FAILED" },
        started.elapsed().as_secs_f64()
    );
    if failed > 0 {
        std::process::exit(101);
    }
}

/// Gives each backend its own kill times from the one seed.
fn salt(backend: Backend) -> u64 {
    match backend {
        Backend::Sqlite => 0,
        Backend::Postgres => 0x9e37_79b9_7f4a_7c15,
    }
}
