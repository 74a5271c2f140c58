//! Cases: claim priorities. A pool takes the highest priority first and the oldest first
//! within a priority; aging bounds how long the lowest waits: a session of priority `p`
//! goes before every session of priority `q > p` submitted more than `(q − p) × aging`
//! after it.
//!
//! Every case puts its sessions in a queue of its own and claims from that queue only.

use std::sync::Arc;
use std::time::Duration;

use super::{LONG_TTL, MAX_ATTEMPTS, owner};
use durable_core::ids::SessionId;
use durable_core::runtime::{Durable, StartOptions};
use durable_core::store::{CheckpointStore, Claim};
use durable_core::transcript::Message;

fn queue_name(tag: &str) -> String {
    format!("prio-{tag}-{}", uuid::Uuid::new_v4().simple())
}

fn runtime(store: &Arc<dyn CheckpointStore>, aging: Duration) -> Durable {
    Durable::builder(Arc::clone(store))
        .owner(owner("submitter"))
        .app_version("v1")
        .priority_aging(aging)
        .build()
}

async fn submit(durable: &Durable, queue: &str, priority: i32) -> SessionId {
    durable
        .submit::<Message>(
            StartOptions::new()
                .with_queue(queue)
                .with_priority(priority),
        )
        .await
        .expect("submit")
}

/// Claims every session of `queue`, one at a time: the order a pool takes them in.
async fn claim_all(store: &dyn CheckpointStore, queue: &str) -> Vec<SessionId> {
    let mut order = Vec::new();
    while let Some(lease) = store
        .claim_expired(&Claim::new(owner("pool"), LONG_TTL, MAX_ATTEMPTS).with_queues([queue]))
        .await
        .expect("claim")
    {
        order.push(lease.session);
    }
    order
}

/// Higher priority first, oldest first within a priority, whatever the submission order.
pub async fn worker_priorities_take_the_highest_first_then_the_oldest(
    store: Arc<dyn CheckpointStore>,
) {
    let queue = queue_name("order");
    let durable = runtime(&store, Duration::from_secs(3600));
    let low_a = submit(&durable, &queue, 0).await;
    let high_a = submit(&durable, &queue, 5).await;
    let low_b = submit(&durable, &queue, 0).await;
    let high_b = submit(&durable, &queue, 5).await;
    let lowest = submit(&durable, &queue, -1).await;
    let order = claim_all(&*store, &queue).await;
    assert_eq!(
        order,
        [high_a, high_b, low_a, low_b, lowest],
        "claims take priority 5, then 0, then -1, each oldest first"
    );
}

/// Aging: with 100 ms per level, a priority-0 session waits for priority-3 work
/// submitted less than 300 ms after it, never for work submitted later; priority-5 work
/// submitted 350 ms after it still goes first (its bound is 500 ms).
pub async fn worker_priority_aging_bounds_how_long_the_lowest_waits(
    store: Arc<dyn CheckpointStore>,
) {
    let queue = queue_name("aging");
    let durable = runtime(&store, Duration::from_millis(100));
    let low = submit(&durable, &queue, 0).await;
    let submitted = super::now(&*store).await;
    super::wait_past(&*store, submitted + 350).await;
    let later_high = submit(&durable, &queue, 3).await;
    let much_higher = submit(&durable, &queue, 5).await;
    let order = claim_all(&*store, &queue).await;
    assert_eq!(
        order,
        [much_higher, low, later_high],
        "priority 3 submitted 350 ms (> 3 × 100 ms) after the priority-0 session waits behind it; \
         priority 5 (5 × 100 ms > 350 ms) goes first"
    );
}
