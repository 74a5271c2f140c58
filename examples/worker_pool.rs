//! A worker pool, a graceful restart and a durable sleep, on SQLite.
//!
//! Six orders are submitted; a small scripted agent handles each in three turns (look the
//! order up, charge the card, email a receipt), each turn checkpointed, then sleeps half a
//! second before it checks the delivery (no worker is held while it sleeps) and
//! completes. A first pool (concurrency 2) is stopped after a short time, as a deploy
//! would stop it: its handlers release their sessions at the next safe point, so a second
//! pool takes them over at once instead of waiting out the lease (60 s here), wakes the
//! sleepers when they are due, and finishes them all. Every effect happens exactly once.
//!
//! ```sh
//! cargo run --example worker_pool
//! ```
//!
//! Ctrl-C or SIGTERM stops either pool the same graceful way; a second one stops it hard
//! (the handlers still running are aborted, as a kill would; the journal decides what
//! their sessions may do when they resume).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use durable::store::SessionStatus;
use durable::{
    CallError, CheckpointStore, Durable, DurableError, IdempotencyKey, Message, Resumed, SessionId,
    ShutdownSignal, StartOptions, durable_tool,
};
use serde_json::json;
use tokio::sync::Notify;

const ORDERS: usize = 6;

static CHARGES: AtomicUsize = AtomicUsize::new(0);
static EMAILS: AtomicUsize = AtomicUsize::new(0);

/// Look up an order by id.
#[durable_tool(replay = "pure")]
async fn lookup_order(
    /// The order id.
    order_id: String,
) -> Result<serde_json::Value, std::io::Error> {
    Ok(json!({"order_id": order_id, "customer": "ann@example.com", "cents": 1200}))
}

/// Charge the customer's card; the provider deduplicates on the key.
#[durable_tool(
    replay = "idempotent_with_key",
    idempotency_key = |a| format!("charge:{}", a.order_id),
)]
async fn charge_card(
    key: IdempotencyKey,
    /// The order to charge for.
    order_id: String,
    /// Amount in cents.
    cents: u64,
) -> Result<String, std::io::Error> {
    CHARGES.fetch_add(1, Ordering::SeqCst);
    Ok(format!("ch_{order_id}_{cents} ({})", key.into_string()))
}

/// Email the receipt.
#[durable_tool(replay = "unsafe_on_replay")]
async fn send_receipt(
    /// Recipient.
    to: String,
    /// The order charged for.
    order_id: String,
) -> Result<String, std::io::Error> {
    let n = EMAILS.fetch_add(1, Ordering::SeqCst) + 1;
    Ok(format!("msg-{n} to {to} for {order_id}"))
}

/// What both pools share: the sessions finished, when each session was released and when
/// a released one was claimed again.
struct Progress {
    completed: AtomicUsize,
    all_done: Notify,
    released: Mutex<HashMap<String, Instant>>,
    claimed: Mutex<Vec<Instant>>,
}

/// The agent loop for one session: three scripted turns, each one tool call checkpointed
/// with its result; between turns, a safe point where a stopping pool releases the session.
async fn agent(
    pool: &'static str,
    resumed: Resumed<Message>,
    shutdown: ShutdownSignal,
    progress: Arc<Progress>,
) -> Result<(), DurableError> {
    let mut session = resumed.session;
    let order = session.id().to_string();
    if let Some(at) = progress.released.lock().expect("lock").remove(&order) {
        let handoff = at.elapsed();
        println!(
            "[{pool}] {order}: claimed {:.1} ms after it was released, at turn {}",
            handoff.as_secs_f64() * 1000.0,
            session.state()["turn"]
        );
        progress.claimed.lock().expect("lock").push(Instant::now());
    }
    loop {
        if shutdown.is_shutting_down() {
            session.release().await?;
            println!("[{pool}] {order}: stopped at a safe point, lease released");
            progress
                .released
                .lock()
                .expect("lock")
                .insert(order, Instant::now());
            return Ok(());
        }
        let turn = session.state()["turn"].as_u64().unwrap_or(0);
        // Stands for the model thinking.
        tokio::time::sleep(Duration::from_millis(150)).await;
        let call_id = format!("call_{turn}");
        // The next turn's number goes into the checkpoint written with this turn's result.
        session.set_state(json!({"turn": turn + 1}));
        let outcome = match turn {
            0 => {
                session
                    .checkpoint_after(
                        async |j| lookup_order.call(j, order.clone()).await,
                        |o| Message::tool_outcome(&call_id, o),
                    )
                    .await
            }
            1 => session
                .checkpoint_after(
                    async |j| charge_card.call(j, order.clone(), 1200).await,
                    |o| Message::tool_outcome(&call_id, o),
                )
                .await
                .map(|charge| json!(charge)),
            2 => session
                .checkpoint_after(
                    async |j| {
                        send_receipt
                            .call(j, "ann@example.com".into(), order.clone())
                            .await
                    },
                    |o| Message::tool_outcome(&call_id, o),
                )
                .await
                .map(|sent| json!(sent)),
            3 => {
                // Checkpoint (with the next turn's number), sleep, release: any worker
                // resumes the session once it is due.
                let meta = session.sleep(Duration::from_millis(500)).await?;
                println!("[{pool}] {order}: asleep (checkpoint {})", meta.version);
                return Ok(());
            }
            _ => {
                if let Some(due) = session.woke_from() {
                    let late = session.record().lease_renewed_at.unwrap_or(due) - due;
                    println!(
                        "[{pool}] {order}: woke up {late} ms after it was due; delivery checked"
                    );
                }
                session.complete().await?;
                println!("[{pool}] {order}: completed");
                if progress.completed.fetch_add(1, Ordering::SeqCst) + 1 == ORDERS {
                    progress.all_done.notify_one();
                }
                return Ok(());
            }
        };
        match outcome {
            Ok(result) => println!("[{pool}] {order}: turn {turn} → {result}"),
            Err(CallError::Durable(e)) => return Err(e),
            // A tool's failure is in the transcript for the model; the script goes on.
            Err(e) => println!("[{pool}] {order}: turn {turn} failed: {e}"),
        }
    }
}

/// Counts Ctrl-C and SIGTERM: the first stops a pool gracefully (`run_until`), the
/// second hard (`hard_stop`).
#[derive(Clone)]
struct Signals(tokio::sync::watch::Receiver<usize>);

impl Signals {
    fn listen() -> Self {
        let (tx, rx) = tokio::sync::watch::channel(0);
        tokio::spawn(async move {
            #[cfg(unix)]
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .expect("SIGTERM handler");
            loop {
                #[cfg(unix)]
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
                #[cfg(not(unix))]
                let _ = tokio::signal::ctrl_c().await;
                tx.send_modify(|n| *n += 1);
            }
        });
        Signals(rx)
    }

    /// Resolves once `n` signals came in all.
    fn nth(&self, n: usize) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.0.clone();
        async move {
            let _ = rx.wait_for(|count| *count >= n).await;
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let url = format!("sqlite:{}", dir.path().join("pool.db").display());
    let store: Arc<dyn CheckpointStore> = durable::connect(&url).await?;
    let ttl = Duration::from_secs(60);
    let progress = Arc::new(Progress {
        completed: AtomicUsize::new(0),
        all_done: Notify::new(),
        released: Mutex::new(HashMap::new()),
        claimed: Mutex::new(Vec::new()),
    });
    let signals = Signals::listen();

    let first = Durable::builder(Arc::clone(&store))
        .owner("pool-a")
        .lease_ttl(ttl)
        .build();
    let mut ids = Vec::new();
    for n in 1..=ORDERS {
        let options = StartOptions::<Message>::new()
            .with_id(SessionId::new(format!("order-{n}")))
            .with_messages(vec![Message::user(format!("Process order {n}."))]);
        ids.push(first.submit(options).await?);
    }
    println!("submitted {ORDERS} orders; pool-a runs 2 at a time and is stopped after 1 s");

    let report = first
        .worker({
            let progress = Arc::clone(&progress);
            move |resumed, shutdown| agent("pool-a", resumed, shutdown, Arc::clone(&progress))
        })
        .concurrency(2)
        .poll_interval(Duration::from_millis(200))
        .shutdown_deadline(Duration::from_secs(10))
        .hard_stop(signals.nth(2))
        .run_until(async {
            tokio::select! {
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
                () = signals.nth(1) => {}
            }
        })
        .await;
    let stopped = Instant::now();
    println!("pool-a stopped: {report:?}");
    let (mut active, mut held) = (0, 0);
    for id in &ids {
        let record = store.session(id).await?;
        if record.status == SessionStatus::Active {
            active += 1;
            held += usize::from(record.lease_owner.is_some());
        }
    }
    println!(
        "after pool-a: {active} sessions left, {held} of them still leased (lease TTL {ttl:?})"
    );

    // The new deployment, bigger: it takes every session left at once.
    let second = Durable::builder(Arc::clone(&store))
        .owner("pool-b")
        .lease_ttl(ttl)
        .build();
    let report = second
        .worker({
            let progress = Arc::clone(&progress);
            move |resumed, shutdown| agent("pool-b", resumed, shutdown, Arc::clone(&progress))
        })
        .concurrency(4)
        .poll_interval(Duration::from_millis(200))
        .shutdown_deadline(Duration::from_secs(10))
        .hard_stop(signals.nth(2))
        .run_until(async {
            tokio::select! {
                () = progress.all_done.notified() => {}
                () = signals.nth(1) => {}
            }
        })
        .await;
    println!("pool-b stopped: {report:?}");
    let claimed = progress.claimed.lock().expect("lock").clone();
    if let Some(last) = claimed.iter().max() {
        println!(
            "handoff: the {} released sessions were all resumed by pool-b within {:.1} ms of \
             pool-a's stop",
            claimed.len(),
            last.saturating_duration_since(stopped).as_secs_f64() * 1000.0,
        );
    }
    let completed = progress.completed.load(Ordering::SeqCst);
    let (charges, emails) = (
        CHARGES.load(Ordering::SeqCst),
        EMAILS.load(Ordering::SeqCst),
    );
    println!("completed {completed}/{ORDERS}; charges made {charges}, receipts sent {emails}");
    if completed == ORDERS {
        assert_eq!(
            (charges, emails),
            (ORDERS, ORDERS),
            "every effect exactly once"
        );
    }
    Ok(())
}
