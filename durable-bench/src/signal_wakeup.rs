//! "A signal was sent → the waiting session read it", the same on every backend.
//!
//! Each sample: a session (queue `bench-waiters`) waits for the signal `go`
//! ([`Session::wait_signal`](durable_core::Session::wait_signal)), so it gives its lease up.
//! Another [`Durable`] (an operator) then sends it: `t0` is the instant
//! `send_signal` returned (the signal and the wake-up committed together). An idle pool
//! on the waiters' queue claims the session and its handler replays the wait, which now
//! consumes the signal and journals it: `t1` is the instant the wait returned it. The
//! wait's deadline is a minute, so a sample is the wake-up's latency, not the deadline's.

use std::time::{Duration, Instant};

use serde_json::json;
use tokio::sync::{mpsc, oneshot};

use durable_core::{Durable, Message, Resumed, ShutdownSignal, SignalWait, StartOptions};

const WAITERS: &str = "bench-waiters";

/// How long each wait is (its safety net, never reached in a sample).
const DEADLINE: Duration = Duration::from_secs(60);

/// `samples` latencies (ms): a signal sent by `sender` to its read by a session a pool on
/// `pool` (polling every `poll`) took after the send woke it.
///
/// # Panics
/// When a signal is not read within three poll intervals, or a store call fails.
pub async fn latencies(
    pool: &Durable,
    starter: &Durable,
    sender: &Durable,
    poll: Duration,
    samples: usize,
) -> Vec<f64> {
    let (read, mut reads) = mpsc::unbounded_channel();
    let (stop, stopped) = oneshot::channel::<()>();
    let worker = pool
        .worker(move |resumed: Resumed<Message>, _: ShutdownSignal| {
            let read = read.clone();
            async move {
                match resumed.session.wait_signal("go", DEADLINE).await? {
                    SignalWait::Received { session, signal } => {
                        let _ = read.send((session.id().clone(), signal.id, Instant::now()));
                        session.complete().await.map(|_| ())
                    }
                    SignalWait::TimedOut { session } => session.complete().await.map(|_| ()),
                    SignalWait::Released => Ok(()),
                }
            }
        })
        .queues([WAITERS])
        .poll_interval(poll)
        .run_until(async move {
            let _ = stopped.await;
        });
    let measure = async move {
        let mut out = Vec::with_capacity(samples);
        for _ in 0..samples {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let session = starter
                .start::<Message>(StartOptions::new().with_queue(WAITERS))
                .await
                .expect("start a session");
            let id = session.id().clone();
            let SignalWait::Released = session
                .wait_signal("go", DEADLINE)
                .await
                .expect("wait for the signal")
            else {
                panic!("nothing was sent: the session must wait");
            };
            // Settle, so that the pool is idle when the signal is sent.
            tokio::time::sleep(Duration::from_millis(100)).await;
            let sent = sender
                .operator()
                .send_signal(&id, "go", json!({ "n": out.len() }))
                .await
                .expect("send the signal");
            let t0 = Instant::now();
            let (session, signal, t1) = tokio::time::timeout(poll * 3, reads.recv())
                .await
                .expect("the signal was read within three poll intervals")
                .expect("the pool is running");
            assert_eq!((session, signal), (id, sent.id), "another signal was read");
            out.push(t1.saturating_duration_since(t0).as_secs_f64() * 1e3);
        }
        let _ = stop.send(());
        out
    };
    let (_, out) = tokio::join!(worker, measure);
    out
}
