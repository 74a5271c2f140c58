//! "A child ended → its waiting parent was started again", the same on every backend.
//!
//! Each sample: a parent session (queue `bench-parents`) starts one child (queue
//! `bench-children`, which the pool does not claim) and awaits it, so the parent gives its
//! lease up and waits. Another [`Durable`] (another worker) then completes the child:
//! `t0` is the instant `complete()` returned (the child's end and the parent's wake-up
//! committed together). An idle pool on `pool` claims the parent: `t1` is the instant its
//! handler was entered. The handler replays the parent's turn (the start is recorded,
//! the child's outcome collected) and completes it. The parent's wait has a recheck
//! deadline of a minute, so a sample is the wake-up's latency, not the safety net's.

use std::time::{Duration, Instant};

use serde_json::json;
use tokio::sync::{mpsc, oneshot};

use crate::wakeup::quantile;
use durable_core::{ChildWait, Durable, Message, Resumed, ShutdownSignal, StartOptions};

const PARENTS: &str = "bench-parents";
const CHILDREN: &str = "bench-children";

fn child() -> StartOptions<Message> {
    StartOptions::<Message>::new()
        .with_state(json!({ "role": "child" }))
        .with_queue(CHILDREN)
}

/// `samples` latencies (ms): a child's end on `finisher` to its parent's handler entered
/// by a pool on `pool` polling every `poll`.
///
/// # Panics
/// When a parent is not started within three poll intervals, or a store call fails.
pub async fn latencies(
    pool: &Durable,
    starter: &Durable,
    finisher: &Durable,
    poll: Duration,
    samples: usize,
) -> Vec<f64> {
    let (started, mut starts) = mpsc::unbounded_channel();
    let (stop, stopped) = oneshot::channel::<()>();
    let worker = pool
        .worker(move |resumed: Resumed<Message>, _: ShutdownSignal| {
            let at = Instant::now();
            let started = started.clone();
            async move {
                let session = resumed.session;
                let _ = started.send((session.id().clone(), at));
                let child = session.spawn_child(child()).await?;
                match session.await_children(&[child]).await? {
                    ChildWait::Ready { session, .. } => session.complete().await.map(|_| ()),
                    ChildWait::Released => Ok(()),
                }
            }
        })
        .queues([PARENTS])
        .poll_interval(poll)
        .run_until(async move {
            let _ = stopped.await;
        });
    let measure = async move {
        let mut out = Vec::with_capacity(samples);
        for _ in 0..samples {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let parent = starter
                .start::<Message>(StartOptions::new().with_queue(PARENTS))
                .await
                .expect("start a parent");
            let parent_id = parent.id().clone();
            let child_id = parent.spawn_child(child()).await.expect("start its child");
            let ChildWait::Released = parent
                .await_children(std::slice::from_ref(&child_id))
                .await
                .expect("await the child")
            else {
                panic!("the child runs: the parent must wait");
            };
            let mut child = finisher
                .resume::<Message>(&child_id)
                .await
                .expect("take the child")
                .session;
            child.set_state(json!({ "done": true }));
            // Settle, so that the pool is idle when the child ends.
            tokio::time::sleep(Duration::from_millis(100)).await;
            child.complete().await.expect("complete the child");
            let t0 = Instant::now();
            let (handled, t1) = tokio::time::timeout(poll * 3, starts.recv())
                .await
                .expect("the pool took the parent within three poll intervals")
                .expect("the pool is running");
            assert_eq!(handled, parent_id, "the pool took another session");
            out.push(t1.saturating_duration_since(t0).as_secs_f64() * 1e3);
        }
        let _ = stop.send(());
        out
    };
    let (_, out) = tokio::join!(worker, measure);
    out
}

/// Median, p95 and max of `samples`, one line.
pub fn summary(name: &str, samples: &[f64]) -> String {
    crate::wakeup::summary(name, samples)
}

/// The `q`-quantile of `samples` (see [`quantile`]).
pub fn at(samples: &[f64], q: f64) -> f64 {
    quantile(samples, q)
}
