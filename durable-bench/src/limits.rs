//! Rate limits and priorities, the same on every backend: a model call under a rate
//! limit that never makes it wait against the same call without a limit (the price of
//! taking a turn: one acquire transaction), and claims per second with priorities
//! against claims of the same sessions without.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::{Report, Row, median};
use durable_core::limiter::{Quota, RateLimit};
use durable_core::store::Claim;
use durable_core::{CheckpointStore, Durable, StartOptions};

/// The limit the bench names: so high that no call ever waits.
const UNBOUNDED: &str = "bench:unbounded";

/// µs per model call on a fresh session of `durable`, `calls` calls, under `limit`.
async fn model_calls(durable: &Durable, calls: usize, limit: Option<&str>) -> f64 {
    let session = durable
        .start::<Value>(StartOptions::new())
        .await
        .expect("start");
    let journal = match limit {
        Some(limit) => session.journal().with_rate_limit(limit),
        None => session.journal().clone(),
    };
    let began = Instant::now();
    for n in 0..calls {
        journal
            .model(|| async move { Ok::<_, String>(json!({ "reply": n })) })
            .await
            .expect("model call");
    }
    let per_call = began.elapsed().as_secs_f64() * 1e6 / calls.max(1) as f64;
    session.complete().await.expect("complete");
    per_call
}

/// Pushes the row "model call under a rate limit": µs per call with a limit that never
/// makes it wait, against the same call without a limit, in `rounds` interleaved rounds
/// of `calls` calls each (medians).
pub async fn limited_call(
    report: &mut Report,
    store: Arc<dyn CheckpointStore>,
    calls: usize,
    rounds: usize,
) {
    let durable = Durable::builder(store)
        .owner("bench-limits")
        .rate_limit(
            UNBOUNDED,
            RateLimit::requests(Quota::per_second(1 << 39).with_burst(1 << 39)),
        )
        .build();
    let (mut limited, mut plain) = (Vec::new(), Vec::new());
    for round in 0..rounds.max(1) {
        eprintln!(
            "rate limit: round {}/{rounds}, {calls} calls each",
            round + 1
        );
        limited.push(model_calls(&durable, calls, Some(UNBOUNDED)).await);
        plain.push(model_calls(&durable, calls, None).await);
    }
    report.push(
        Row::new(
            "model call under a rate limit (never waiting)",
            "µs/call",
            median(&limited),
            median(&plain),
        )
        .note("baseline: the same journaled model call without a limit; the difference is the turn's acquire transaction"),
    );
}

/// Claims per second of `sessions` sessions submitted to a queue of their own, with
/// priorities (0..4) or without.
async fn claim_rate(durable: &Durable, sessions: usize, priorities: bool, round: usize) -> f64 {
    let queue = format!("bench-claims-{round}-{priorities}");
    for n in 0..sessions {
        let priority = if priorities { (n % 5) as i32 } else { 0 };
        durable
            .submit(
                StartOptions::<Value>::new()
                    .with_queue(queue.clone())
                    .with_priority(priority),
            )
            .await
            .expect("submit");
    }
    let claim = Claim::new("bench-claimer", Duration::from_secs(600), 5).with_queues([queue]);
    let began = Instant::now();
    let mut claimed = 0;
    while durable
        .store()
        .claim_expired(&claim)
        .await
        .expect("claim")
        .is_some()
    {
        claimed += 1;
    }
    assert_eq!(claimed, sessions, "every session claimed");
    claimed as f64 / began.elapsed().as_secs_f64()
}

/// Pushes the row "claims/s with priorities": one claimer taking `sessions` submitted
/// sessions of five priorities, against the same with every priority 0, in `rounds`
/// interleaved rounds (medians).
pub async fn claims(
    report: &mut Report,
    store: Arc<dyn CheckpointStore>,
    sessions: usize,
    rounds: usize,
) {
    let durable = Durable::builder(store).owner("bench-claims").build();
    let (mut on, mut off) = (Vec::new(), Vec::new());
    for round in 0..rounds.max(1) {
        eprintln!(
            "claims: round {}/{rounds}, {sessions} sessions each",
            round + 1
        );
        on.push(claim_rate(&durable, sessions, true, round).await);
        off.push(claim_rate(&durable, sessions, false, round).await);
    }
    report.push(
        Row::new(
            "claims/s with priorities",
            "claims/s",
            median(&on),
            median(&off),
        )
        .note("one claimer; baseline: the same sessions all of priority 0 (claims ordered by creation alone)"),
    );
}
