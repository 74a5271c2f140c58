//! Fleet-wide scheduling in real processes.
//!
//! - `fleet_limit`: 4 worker pool processes (4 slots each) run 16 sessions of a queue
//!   limited to 3 and 8 sessions of the default queue, one pool restarted with SIGTERM
//!   mid-run. The parent samples the store (`queues()`) every few milliseconds: the
//!   limited queue never has more than 3 sessions leased, and reaches 3 (the limit is
//!   what held it back, not a lack of work); the default queue runs past it.
//! - `sleepers`: 12 sessions each sleep 1.5 s after step 0 (no worker held). While they
//!   sleep, one pool is killed (SIGKILL) and the other stopped (SIGTERM); two new pools
//!   wake them. Every session wakes exactly once, never before its wake-up time on the
//!   store's clock, and its effects happen once.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use durable::store::{SessionFilter, SessionStatus};
use durable::{Durable, Message, SessionId, StartOptions};

use crate::backend::Backend;
use crate::hook::{CONCURRENCY, SLEEP_MS, THINK_MS};
use crate::proc::{Output, Worker, signal};
use crate::worker::{self, STEPS};

const TTL: Duration = Duration::from_secs(5);
const LIMIT: u32 = 3;
const LIMITED: usize = 16;
const UNLIMITED: usize = 8;

/// Spawns a `pool` child and waits for it to be up.
fn pool(backend: &Backend, owner: &str, extra: &[(&str, &str)]) -> Worker {
    let w = Worker::spawn("pool", backend, owner, TTL, extra, Output::Lines);
    w.line_starting(&format!("worker {owner} up"), Duration::from_secs(30));
    w
}

/// Waits for a pool to stop by itself, returning its lines.
fn finish(w: &mut Worker) -> Vec<String> {
    let status = w.wait(Duration::from_secs(90));
    let rest = w.rest();
    assert!(
        status.success(),
        "{} exited with {status}: {rest:?}",
        w.owner
    );
    rest
}

/// Submits `count` sessions named `<prefix>-NN`, in `queue` when given.
async fn submit(durable: &Durable, prefix: &str, count: usize, queue: Option<&str>) {
    for i in 0..count {
        let mut options = StartOptions::<Message>::new()
            .with_id(SessionId::new(format!("{prefix}-{i:02}")))
            .with_messages(vec![Message::user(format!("task {i}"))]);
        if let Some(queue) = queue {
            options = options.with_queue(queue);
        }
        durable.submit(options).await.expect("submit");
    }
}

/// Runs `fleet_limit`.
pub async fn fleet_limit(backend: Backend) {
    let store = backend.store().await;
    let ledger = backend.ledger().await;
    let admin = Durable::builder(Arc::clone(&store))
        .owner("admin")
        .app_version(worker::APP_VERSION)
        .build();
    admin
        .operator()
        .set_queue_limit("scarce", Some(LIMIT))
        .await
        .expect("set_queue_limit");
    submit(&admin, "scarce", LIMITED, Some("scarce")).await;
    submit(&admin, "plenty", UNLIMITED, None).await;

    // Sample the store while the fleet runs.
    let stop = Arc::new(AtomicBool::new(false));
    let (most_scarce, most_default) = (Arc::new(AtomicI64::new(0)), Arc::new(AtomicI64::new(0)));
    let sampler = {
        let (store, stop) = (Arc::clone(&store), Arc::clone(&stop));
        let (scarce, default) = (Arc::clone(&most_scarce), Arc::clone(&most_default));
        tokio::spawn(async move {
            let mut samples = 0_u64;
            while !stop.load(Ordering::SeqCst) {
                for q in store.queues().await.expect("queues") {
                    let most = if q.name == "scarce" {
                        &scarce
                    } else {
                        &default
                    };
                    most.fetch_max(q.running, Ordering::SeqCst);
                }
                samples += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            samples
        })
    };
    let extra = [(CONCURRENCY, "4"), (THINK_MS, "150")];
    let mut pools: Vec<Worker> = (0..4)
        .map(|n| pool(&backend, &format!("limit-{n}"), &extra))
        .collect();
    // A deploy mid-run: the limit holds across the restart.
    tokio::time::sleep(Duration::from_millis(600)).await;
    signal(pools[0].pid(), "TERM");
    let first = finish(&mut pools[0]);
    assert!(
        first
            .iter()
            .any(|l| l.starts_with("pool stopped") && l.ends_with("aborted 0")),
        "{first:?}"
    );
    pools[0] = pool(&backend, "limit-0b", &extra);
    for w in &mut pools {
        finish(w);
    }
    stop.store(true, Ordering::SeqCst);
    let samples = sampler.await.expect("sampler");

    let sessions = store
        .list_sessions(&SessionFilter::new())
        .await
        .expect("sessions");
    let completed = sessions
        .iter()
        .filter(|s| s.status == SessionStatus::Completed)
        .count();
    assert_eq!(completed, LIMITED + UNLIMITED, "{sessions:?}");
    let (scarce, default) = (
        most_scarce.load(Ordering::SeqCst),
        most_default.load(Ordering::SeqCst),
    );
    assert!(
        scarce <= i64::from(LIMIT),
        "{scarce} sessions of a queue limited to {LIMIT} were leased at once"
    );
    assert_eq!(
        scarce,
        i64::from(LIMIT),
        "the limited queue never reached its limit: nothing was tested"
    );
    assert!(
        default > i64::from(LIMIT),
        "the default queue ({default} at most) was held back too"
    );
    let (emails, charges) = ledger
        .assert_effects_once(STEPS * (LIMITED + UNLIMITED) as i64)
        .await;
    println!(
        "fleet_limit ({}): 4 pools, {LIMITED} sessions limited to {LIMIT} + {UNLIMITED} \
         unlimited, one restart; at most {scarce} of the limited queue running and {default} \
         of the other ({samples} samples of the store); emails {emails}, charges {charges}, \
         duplicates 0",
        backend.name()
    );
}

/// Runs `sleepers`.
pub async fn sleepers(backend: Backend) {
    const SESSIONS: usize = 12;
    let store = backend.store().await;
    let ledger = backend.ledger().await;
    let submitter = Durable::builder(Arc::clone(&store))
        .owner("submitter")
        .app_version(worker::APP_VERSION)
        .build();
    submit(&submitter, "sleeper", SESSIONS, None).await;
    let extra = [(CONCURRENCY, "6"), (SLEEP_MS, "1500")];
    let mut a = pool(&backend, "sleep-a", &extra);
    let mut b = pool(&backend, "sleep-b", &extra);
    // Every session asleep (step 0 done, the wake-up time checkpointed, no lease held).
    let mut lines: Vec<String> = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while lines.iter().filter(|l| l.starts_with("asleep ")).count() < SESSIONS {
        assert!(
            std::time::Instant::now() < deadline,
            "not every session went to sleep: {lines:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
        lines.extend(a.ready_lines());
        lines.extend(b.ready_lines());
    }
    let queues = store.queues().await.expect("queues");
    let default = queues.iter().find(|q| q.name == "default").expect("queue");
    assert_eq!(default.sleeping, SESSIONS as i64, "{queues:?}");
    assert_eq!(default.running, 0, "{queues:?}");
    // The workers go away while the sessions sleep: one killed, one stopped.
    a.kill();
    lines.extend(a.rest());
    signal(b.pid(), "TERM");
    lines.extend(finish(&mut b));
    let mut c = pool(&backend, "sleep-c", &extra);
    let mut d = pool(&backend, "sleep-d", &extra);
    lines.extend(finish(&mut c));
    lines.extend(finish(&mut d));

    // Each session woke once, at or after its wake-up time, on the store's clock.
    let mut asleep: HashMap<String, i64> = HashMap::new();
    let mut woke: HashMap<String, Vec<(i64, i64)>> = HashMap::new();
    for line in &lines {
        let words: Vec<&str> = line.split(' ').collect();
        let field = |name: &str| {
            words
                .iter()
                .find_map(|w| w.strip_prefix(name))
                .and_then(|v| v.parse::<i64>().ok())
        };
        match words.first() {
            Some(&"asleep") => {
                asleep.insert(words[1].to_owned(), field("until=").expect("until"));
            }
            Some(&"woke") => woke
                .entry(words[1].to_owned())
                .or_default()
                .push((field("due=").expect("due"), field("taken=").expect("taken"))),
            _ => {}
        }
    }
    assert_eq!(asleep.len(), SESSIONS, "{lines:?}");
    let mut late = Vec::new();
    for (id, due) in &asleep {
        let wakes = woke.get(id).cloned().unwrap_or_default();
        assert_eq!(wakes.len(), 1, "{id} woke {} times: {wakes:?}", wakes.len());
        let (woke_due, taken) = wakes[0];
        assert_eq!(woke_due, *due, "{id} woke from another sleep");
        assert!(
            taken >= *due,
            "{id} taken at {taken}, before its wake-up time {due}"
        );
        late.push(taken - due);
    }
    late.sort_unstable();
    let sessions = store
        .list_sessions(&SessionFilter::new())
        .await
        .expect("sessions");
    assert!(
        sessions
            .iter()
            .all(|s| s.status == SessionStatus::Completed),
        "{sessions:?}"
    );
    let (emails, charges) = ledger.assert_effects_once(STEPS * SESSIONS as i64).await;
    println!(
        "sleepers ({}): {SESSIONS} sessions slept 1.5 s while their workers were killed and \
         stopped; each woke once, {}–{} ms after its wake-up time (median {} ms); emails \
         {emails}, charges {charges}, duplicates 0",
        backend.name(),
        late[0],
        late[late.len() - 1],
        late[late.len() / 2],
    );
}
