//! A fleet-wide rate limit in real processes.
//!
//! `rate_limit`: N worker processes (4 on one SQLite file, 8 on PostgreSQL), each running
//! 4 sessions that ask a model as fast as they can for a bounded time, all under one
//! limit of 20 calls per second with a burst capacity of 5. The parent reads the time of
//! every call and checks: the observed rate within 5% of the limit (before and after the
//! hold below), no window with more calls than the capacity plus the rate allows, every
//! waiter served (every worker ends its calls without an error). Halfway, a provider's
//! 429 with `retry-after: 1 s` is reported to the store: no call of any process starts
//! during the hold.
//!
//! 10 s by default, to keep CI cheap; `DURABLE_LIMITS_LONG=1` runs it for 60 s.

use std::time::Duration;

use crate::backend::Backend;
use crate::proc::{Output, Worker};

/// The limit every process shares.
pub const LIMIT: &str = "provider:model";
/// Calls per second.
pub const RATE: u64 = 20;
/// The bucket's capacity.
pub const BURST: u64 = 5;
/// Sessions per process.
pub const SESSIONS: usize = 4;
/// The hold of the 429.
const HOLD: Duration = Duration::from_secs(1);

fn now_ms() -> i64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970");
    i64::try_from(since.as_millis()).expect("ms fit")
}

/// Calls started in `[from, to)`, per second.
fn rate(times: &[i64], from: i64, to: i64) -> f64 {
    let n = times.iter().filter(|&&t| t >= from && t < to).count();
    n as f64 * 1000.0 / (to - from) as f64
}

pub async fn rate_limit(backend: Backend, processes: usize) {
    let seconds: i64 = if std::env::var("DURABLE_LIMITS_LONG").is_ok_and(|v| !v.is_empty()) {
        60
    } else {
        10
    };
    let store = backend.store().await;
    let mut workers: Vec<Worker> = (0..processes)
        .map(|n| {
            Worker::spawn(
                "limited",
                &backend,
                &format!("limited-{n}"),
                Duration::from_secs(30),
                &[],
                Output::Lines,
            )
        })
        .collect();
    for w in &workers {
        w.line_starting(&format!("worker {} up", w.owner), Duration::from_secs(60));
    }
    let start = now_ms() + 1000;
    let end = start + seconds * 1000;
    for w in &mut workers {
        w.send(&format!("go {start} {end}"));
    }
    // Halfway: the provider answers 429 with `retry-after: 1`.
    let halfway = start + seconds * 500;
    tokio::time::sleep(Duration::from_millis(
        u64::try_from(halfway - now_ms()).unwrap_or(0),
    ))
    .await;
    let throttled_at = now_ms();
    store
        .throttle_limit(LIMIT, HOLD)
        .await
        .expect("report the 429");
    let held_until = throttled_at + i64::try_from(HOLD.as_millis()).expect("ms");

    let mut times = Vec::new();
    for w in &mut workers {
        let status = w.wait(Duration::from_secs(u64::try_from(seconds).expect("s") + 60));
        let lines = w.rest();
        assert!(
            status.success(),
            "{} exited with {status}: {lines:?}",
            w.owner
        );
        assert!(
            lines.iter().any(|l| l.starts_with("done ")),
            "{}: every waiter served, without an error: {lines:?}",
            w.owner
        );
        for line in &lines {
            if let Some(t) = line.strip_prefix("call ") {
                times.push(t.parse::<i64>().expect("a call time"));
            }
        }
    }
    times.sort_unstable();
    let name = backend.name();

    // The rate, before the hold and after it (a second after each edge: the initial
    // burst and the restart are the capacity's, not the rate's).
    let before = rate(&times, start + 1000, throttled_at);
    let after = rate(&times, held_until + 1000, end);
    println!(
        "  {name}: {processes} processes × {SESSIONS} sessions, limit {RATE}/s burst {BURST}, {seconds} s: \
         {} calls, {before:.2}/s before the 429, {after:.2}/s after it",
        times.len()
    );
    for (what, observed) in [("before the 429", before), ("after the 429", after)] {
        assert!(
            (observed - RATE as f64).abs() <= RATE as f64 * 0.05,
            "{name}: {observed:.2} calls/s {what}, limit {RATE}/s (within 5%)"
        );
    }
    // No burst above the capacity: in any window, at most BURST + length × RATE calls
    // (two calls of slack for the processes' wake-up jitter).
    let mut worst = 0.0_f64;
    for i in 0..times.len() {
        for j in i..times.len() {
            let allowed = BURST as f64 + (times[j] - times[i]) as f64 * RATE as f64 / 1000.0;
            let count = (j - i + 1) as f64;
            worst = worst.max(count - allowed);
            if times[j] - times[i] > 3000 {
                break;
            }
        }
    }
    assert!(
        worst <= 2.0,
        "{name}: a window held {worst:.1} calls more than the capacity and the rate allow"
    );
    // The 429 held every process.
    let during: Vec<i64> = times
        .iter()
        .copied()
        .filter(|&t| t >= throttled_at + 150 && t < held_until)
        .collect();
    assert!(
        during.is_empty(),
        "{name}: {} calls started during the 429's hold ({throttled_at}..{held_until}): {during:?}",
        during.len()
    );
}
