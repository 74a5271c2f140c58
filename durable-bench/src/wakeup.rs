//! "Work became available → a worker started it", the same on every backend.
//!
//! One [`Durable`] submits, another runs an idle worker pool. The latency of one submit is
//! `t1 − t0`: `t0` the instant [`Durable::submit`] returned (its release committed), `t1`
//! the instant the pool entered its handler for that session (0 when the pool was
//! quicker than the submitter's return). Before each submit the bench waits a settle time
//! and then an offset that walks through the poll interval, so that a polling pool is
//! caught at every phase of its wait, not always at the same one.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};

use crate::Row;
use crate::report::number;
use durable_core::{Durable, Resumed, ShutdownSignal, StartOptions};

/// The latencies of `submits` submits on `submitter`, each started by a pool on `pool`
/// that polls every `poll` (ms, in submit order).
///
/// # Panics
/// When a session is not started within three poll intervals, or a submit fails.
pub async fn latencies(
    pool: &Durable,
    submitter: &Durable,
    poll: Duration,
    submits: usize,
) -> Vec<f64> {
    let (started, mut starts) = mpsc::unbounded_channel();
    let (stop, stopped) = oneshot::channel::<()>();
    // The pool runs in this task beside the submits (`run_until`'s future is not `Send`,
    // so it cannot be spawned); its handlers run as tasks of their own.
    let worker = pool
        .worker(move |resumed: Resumed<Value>, _: ShutdownSignal| {
            let at = Instant::now();
            let started = started.clone();
            async move {
                let _ = started.send((resumed.session.id().clone(), at));
                resumed.session.complete().await.map(|_| ())
            }
        })
        .poll_interval(poll)
        .run_until(async move {
            let _ = stopped.await;
        });
    let submit = async move {
        let mut out = Vec::with_capacity(submits);
        for n in 0..submits {
            // Settle (the handler completes, the pool goes idle), then an offset that
            // walks through the poll interval in a scattered order (the golden ratio's
            // multiples).
            let phase = (n as f64 * 0.618_034).fract();
            tokio::time::sleep(Duration::from_millis(100) + poll.mul_f64(phase)).await;
            let id = submitter
                .submit(StartOptions::<Value>::new().with_messages(vec![json!({"task": n})]))
                .await
                .expect("submit");
            let t0 = Instant::now();
            let (handled, t1) = tokio::time::timeout(poll * 3, starts.recv())
                .await
                .expect("the pool started the session within three poll intervals")
                .expect("the pool is running");
            assert_eq!(handled, id, "the pool started another session");
            out.push(t1.saturating_duration_since(t0).as_secs_f64() * 1e3);
        }
        let _ = stop.send(());
        out
    };
    let (report, out) = tokio::join!(worker, submit);
    assert_eq!(report.handled, submits, "{report:?}");
    out
}

/// The `q`-quantile of `values` (nearest rank); `NaN` for none.
pub fn quantile(values: &[f64], q: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// Median, p95 and max of `notified` against `polled` (measured in the same run), as three
/// rows, `what` naming the pair.
pub fn rows(what: &str, notified: &[f64], polled: &[f64], note: &str) -> Vec<Row> {
    [("median", 0.5), ("p95", 0.95), ("max", 1.0)]
        .into_iter()
        .map(|(name, q)| {
            Row::new(
                format!("{what}: {name} submit → handler"),
                "ms",
                quantile(notified, q),
                quantile(polled, q),
            )
            .note(note.to_owned())
        })
        .collect()
}

/// One line per sample set: `n`, median, p95, max (ms).
pub fn summary(name: &str, values: &[f64]) -> String {
    format!(
        "{name:<40} n={:<4} median {:>8} ms  p95 {:>8} ms  max {:>8} ms",
        values.len(),
        number(quantile(values, 0.5)),
        number(quantile(values, 0.95)),
        number(quantile(values, 1.0)),
    )
}

/// One side of the comparison: the pool's [`Durable`] and the submitter's.
pub struct Side<'a> {
    /// Runs the idle pool.
    pub pool: &'a Durable,
    /// Submits.
    pub submitter: &'a Durable,
}

/// How many submits, in how many rounds, against pools polling how often.
#[derive(Debug, Clone, Copy)]
pub struct Schedule {
    /// Every pool's poll interval.
    pub poll: Duration,
    /// Submits per side.
    pub submits: usize,
    /// Interleaved rounds the submits are split into.
    pub rounds: usize,
}

/// Measures [`Schedule::submits`] latencies on each side, in interleaved rounds (so that
/// background load hits both alike), prints each side's summary and pushes the rows of
/// `notified` against `polled` (the baseline) to `report`. Returns the samples (ms).
pub async fn compare(
    report: &mut crate::Report,
    what: &str,
    notified: Side<'_>,
    polled: Side<'_>,
    schedule: Schedule,
    note: &str,
) -> (Vec<f64>, Vec<f64>) {
    let Schedule {
        poll,
        submits,
        rounds,
    } = schedule;
    let rounds = rounds.clamp(1, submits.max(1));
    let (mut fast, mut slow) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let n = submits / rounds + usize::from(round < submits % rounds);
        eprintln!("{what}: round {}/{rounds}, {n} submits each", round + 1);
        fast.extend(latencies(notified.pool, notified.submitter, poll, n).await);
        slow.extend(latencies(polled.pool, polled.submitter, poll, n).await);
    }
    println!("{}", summary(&format!("{what}, notified"), &fast));
    println!("{}", summary(&format!("{what}, polling only"), &slow));
    println!(
        "{what}: notified ÷ polling only: median {:.3}, p95 {:.3}, max {:.3}",
        quantile(&fast, 0.5) / quantile(&slow, 0.5),
        quantile(&fast, 0.95) / quantile(&slow, 0.95),
        quantile(&fast, 1.0) / quantile(&slow, 1.0),
    );
    for row in rows(what, &fast, &slow, note) {
        report.push(row);
    }
    (fast, slow)
}
