//! Where the parent can hold a `pool` child, and how the child's pool is tuned, both from
//! environment variables (read once per process).
//!
//! - `DURABLE_WORKERS_BLOCK`: `<point>:<session>:<before|after>`, comma-separated. At
//!   step 0 of that session the child prints `in <point> <session> step 0` at that point,
//!   waits until the file named by `DURABLE_WORKERS_GATE` exists, then prints
//!   `through <point> <session>`. The points are the three tools (`read_account`,
//!   `charge_card`, `send_email`; before or after the tool's ledger effect) and
//!   `checkpoint` (right before `session.checkpoint()`, every call of the step recorded).
//! - `DURABLE_WORKERS_THINK_MS`: a pause at the start of every step (the model thinking),
//!   cut short by a shutdown request: nothing is in flight then, so the handler releases.
//! - `DURABLE_WORKERS_CONCURRENCY`, `DURABLE_WORKERS_DEADLINE_MS`: the pool's concurrency
//!   (default 2) and shutdown deadline (default 10 s).
//! - `DURABLE_WORKERS_SLEEP_MS`: every session sleeps this long after step 0 (the step's
//!   checkpoint carries the wake-up time, the lease is given up); the child prints
//!   `asleep <session> until=<ms>` then, and `woke <session> due=<ms> taken=<ms>` when a
//!   pool resumes it after the sleep (both on the store's clock).

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use durable::ShutdownSignal;

pub const BLOCK: &str = "DURABLE_WORKERS_BLOCK";
pub const GATE: &str = "DURABLE_WORKERS_GATE";
pub const THINK_MS: &str = "DURABLE_WORKERS_THINK_MS";
pub const CONCURRENCY: &str = "DURABLE_WORKERS_CONCURRENCY";
pub const DEADLINE_MS: &str = "DURABLE_WORKERS_DEADLINE_MS";
pub const SLEEP_MS: &str = "DURABLE_WORKERS_SLEEP_MS";

/// How long a session sleeps after step 0, if the parent asked for sleeps.
pub fn sleep_after_step_0() -> Option<i64> {
    env_number(SLEEP_MS).map(|ms| i64::try_from(ms).expect("SLEEP_MS fits an i64"))
}

/// Where, relative to the tool's effect on the ledger, a call is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    Before,
    After,
}

struct Hooks {
    blocks: Vec<(String, String, When)>,
    gate: Option<PathBuf>,
    think: Duration,
}

fn hooks() -> &'static Hooks {
    static HOOKS: OnceLock<Hooks> = OnceLock::new();
    HOOKS.get_or_init(|| {
        let blocks = std::env::var(BLOCK)
            .unwrap_or_default()
            .split(',')
            .filter(|s| !s.is_empty())
            .map(|spec| match spec.split(':').collect::<Vec<_>>()[..] {
                [point, session, when] => {
                    let when = match when {
                        "before" => When::Before,
                        "after" => When::After,
                        other => panic!("{BLOCK}: `{other}` is neither `before` nor `after`"),
                    };
                    (point.to_owned(), session.to_owned(), when)
                }
                _ => panic!("{BLOCK}: `{spec}` is not `<point>:<session>:<before|after>`"),
            })
            .collect();
        Hooks {
            blocks,
            gate: std::env::var_os(GATE).map(PathBuf::from),
            think: Duration::from_millis(env_number(THINK_MS).unwrap_or(0)),
        }
    })
}

/// A numeric environment variable, if set.
pub fn env_number(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{name} is not a number"))
    })
}

/// Holds the caller at `point` of `session`'s step 0 if the parent asked for it (see the
/// module docs); returns at once otherwise.
pub async fn hold(point: &str, when: When, session: &str, step: i64) {
    let hooks = hooks();
    let listed = hooks
        .blocks
        .iter()
        .any(|(p, s, w)| p == point && s == session && *w == when);
    if step != 0 || !listed {
        return;
    }
    println!("in {point} {session} step {step} t={}", now_ms());
    let gate = hooks
        .gate
        .as_ref()
        .unwrap_or_else(|| panic!("{BLOCK} is set without {GATE}"));
    while !gate.exists() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    println!("through {point} {session} t={}", now_ms());
}

/// The model thinking at the start of a step: cut short once shutdown is requested.
pub async fn think(shutdown: Option<&ShutdownSignal>) {
    let think = hooks().think;
    if think.is_zero() {
        return;
    }
    match shutdown {
        Some(signal) => {
            tokio::select! {
                () = tokio::time::sleep(think) => {}
                () = signal.requested() => {}
            }
        }
        None => tokio::time::sleep(think).await,
    }
}

/// Wall-clock milliseconds, comparable between the processes of one machine.
pub fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis()
}
