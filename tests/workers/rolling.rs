//! A rolling deploy in real processes: 3 worker pool processes run 30 submitted sessions;
//! while they run, the pools are restarted one by one (SIGTERM, wait for the exit, spawn
//! the replacement, next one), two full rounds. Each stopped pool releases its sessions
//! at their next safe point (a step's think time is cut short by the shutdown request; a
//! tool call in flight finishes first) and the other pools claim them.
//!
//! Run with spare capacity (16 sessions per pool: two pools hold every session, so a
//! stopped pool's sessions find free slots at once and the handoff measures the lease,
//! not a queue) and saturated (4 per pool, 12 slots for 30 sessions: claims take the
//! oldest session first, by creation, so a released session goes before the sessions
//! not yet started; when claims took the least recently updated first, it waited behind
//! all of them, 4–6.6 s).
//!
//! Measured: SIGTERM → exit per restart, the handoff latency (a `released` line to the
//! next `claimed` line of the same session, from the wall-clock stamps the children
//! print), throughput. Checked: every session completed, no lease left to expire (0
//! recoveries), every handoff under 3 s, saturated or not (a
//! lease left behind takes the 30 s TTL), 0 duplicate effects, keyed effects applied
//! once.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use durable::store::{SessionFilter, SessionStatus};
use durable::{Durable, Message, SessionId, StartOptions};

use crate::backend::Backend;
use crate::hook::{CONCURRENCY, THINK_MS};
use crate::proc::{Output, Worker, signal};
use crate::worker::{self, STEPS};

const SESSIONS: usize = 30;
const POOLS: usize = 3;
const ROUNDS: usize = 2;
/// Per pool, with spare capacity: two pools hold every session.
pub const SPARE: usize = 16;
/// Per pool, saturated: 12 slots for 30 sessions.
pub const SATURATED: usize = 4;
/// Think time per step: sessions last long enough for the restarts to land mid-run.
const THINK: &str = "1500";
/// Long: a lease left behind would show as a handoff of 30 s.
const TTL: Duration = Duration::from_secs(30);

/// A stamped line: `<what> <session> … t=<ms>`.
fn stamped(line: &str) -> Option<(&str, &str, u128)> {
    let (head, t) = line.rsplit_once(" t=")?;
    let mut words = head.split(' ');
    Some((words.next()?, words.next()?, t.parse().ok()?))
}

/// Runs the case.
/// Runs the case with `per_pool` sessions at most in each pool.
pub async fn rolling(backend: Backend, per_pool: usize) {
    // The bound asserted on every handoff (a lease left to expire takes the TTL).
    // The bound asserted on every handoff, saturated or not (a lease left to expire
    // takes the TTL; a release queued behind the sessions not yet started took 4–6.6 s).
    let handoff_bound = Duration::from_secs(3);
    let concurrency = per_pool.to_string();
    let store = backend.store().await;
    let ledger = backend.ledger().await;
    let submitter = Durable::builder(Arc::clone(&store))
        .owner("submitter")
        .app_version(worker::APP_VERSION)
        .build();
    for i in 0..SESSIONS {
        let options = StartOptions::<Message>::new()
            .with_id(SessionId::new(format!("rolling-{i:02}")))
            .with_messages(vec![Message::user(format!("task {i}"))]);
        submitter.submit(options).await.expect("submit");
    }
    let started = Instant::now();
    let mut generation = 0;
    let mut spawn = |slot: usize| {
        generation += 1;
        let owner = format!("pool-{slot}-g{generation}");
        let w = Worker::spawn(
            "pool",
            &backend,
            &owner,
            TTL,
            &[(CONCURRENCY, concurrency.as_str()), (THINK_MS, THINK)],
            Output::Lines,
        );
        let (_, before) = w.line_starting(&format!("worker {owner} up"), Duration::from_secs(30));
        (w, before)
    };
    // (owner, line) of every pool.
    let mut lines: Vec<(String, String)> = Vec::new();
    let tag = |owner: &str, new: Vec<String>| -> Vec<(String, String)> {
        new.into_iter().map(|l| (owner.to_owned(), l)).collect()
    };
    let mut pools: Vec<Worker> = (0..POOLS)
        .map(|slot| {
            let (w, before) = spawn(slot);
            lines.extend(tag(&w.owner, before));
            w
        })
        .collect();
    let mut exits = Vec::new();
    // Sessions still active at each restart (so that each one landed mid-run).
    let mut active_at = Vec::new();
    for restart in 0..ROUNDS * POOLS {
        // Let the fleet run a little between restarts.
        tokio::time::sleep(Duration::from_millis(300)).await;
        for w in &pools {
            lines.extend(tag(&w.owner, w.ready_lines()));
        }
        let active = worker::active_sessions(store.as_ref())
            .await
            .expect("active sessions");
        assert!(
            active > 0,
            "every session finished before restart {restart}: the deploy would test nothing"
        );
        active_at.push(active);
        let slot = restart % POOLS;
        let old = &mut pools[slot];
        let term_sent = Instant::now();
        signal(old.pid(), "TERM");
        let status = old.wait(Duration::from_secs(20));
        exits.push(term_sent.elapsed());
        let rest = old.rest();
        assert!(
            status.success(),
            "{} exited with {status}: {rest:?}",
            old.owner
        );
        let summary = rest
            .iter()
            .find(|l| l.starts_with("pool stopped"))
            .unwrap_or_else(|| panic!("no report from {}: {rest:?}", old.owner));
        assert!(summary.ends_with("aborted 0"), "{}: {summary}", old.owner);
        lines.extend(tag(&old.owner, rest));
        let (w, before) = spawn(slot);
        lines.extend(tag(&w.owner, before));
        pools[slot] = w;
    }
    // The last pools stop by themselves once no session is active.
    for w in &mut pools {
        let status = w.wait(Duration::from_secs(60));
        let rest = w.rest();
        assert!(
            status.success(),
            "{} exited with {status}: {rest:?}",
            w.owner
        );
        lines.extend(tag(&w.owner, rest));
    }
    let took = started.elapsed();

    // Handoffs: each release to the next claim of the same session. A pool shutting down
    // claims nothing, so that claim is another pool's; its stamp may come a hair before
    // the release's own (two processes print them), hence the slack.
    let mut claims: HashMap<&str, Vec<(&str, u128)>> = HashMap::new();
    let mut releases = Vec::new();
    let mut completions = Vec::new();
    for (owner, line) in &lines {
        match stamped(line) {
            Some(("claimed", id, t)) => claims.entry(id).or_default().push((owner, t)),
            Some(("released", id, t)) => releases.push((owner.as_str(), id, t)),
            Some(("completed", _, t)) => completions.push(t),
            _ => {}
        }
    }
    let mut handoffs: Vec<u128> = releases
        .iter()
        .map(|&(releaser, id, released)| {
            claims
                .get(id)
                .and_then(|cs| {
                    cs.iter()
                        .filter(|&&(owner, t)| owner != releaser && t + 50 >= released)
                        .map(|&(_, t)| t)
                        .min()
                })
                .map(|claimed| claimed.saturating_sub(released))
                .unwrap_or_else(|| panic!("{id} released at {released} and never claimed again"))
        })
        .collect();
    handoffs.sort_unstable();
    assert!(
        handoffs.len() >= ROUNDS * POOLS,
        "only {} releases in {} restarts",
        handoffs.len(),
        ROUNDS * POOLS
    );
    let median = handoffs[handoffs.len() / 2];
    let max = *handoffs.last().expect("handoffs");
    assert!(
        max < handoff_bound.as_millis(),
        "a handoff took {max} ms (bound {handoff_bound:?}): {handoffs:?}"
    );

    let sessions = store
        .list_sessions(&SessionFilter::new())
        .await
        .expect("sessions");
    let completed = sessions
        .iter()
        .filter(|s| s.status == SessionStatus::Completed)
        .count();
    assert_eq!(completed, SESSIONS, "{sessions:?}");
    assert_eq!(completions.len(), SESSIONS, "completed lines");
    assert!(
        sessions.iter().all(|s| s.recovery_attempts == 0),
        "a lease was left to expire: {sessions:?}"
    );
    let effects = STEPS * SESSIONS as i64;
    let scalar = |sql: &'static str| {
        let ledger = ledger.clone();
        async move { ledger.scalar(sql, &[]).await.expect(sql) }
    };
    let duplicates = scalar(
        "SELECT count(*) FROM (SELECT effect_key FROM ledger_emails GROUP BY effect_key \
         HAVING count(*) > 1) AS d",
    )
    .await;
    let emails = scalar("SELECT count(*) FROM ledger_emails").await;
    let charges = scalar("SELECT count(*) FROM ledger_charges").await;
    let attempts = scalar("SELECT count(*) FROM ledger_charge_attempts").await;
    assert_eq!(duplicates, 0);
    assert_eq!((emails, charges, attempts), (effects, effects, effects));
    let mut exit_ms: Vec<u128> = exits.iter().map(Duration::as_millis).collect();
    exit_ms.sort_unstable();
    println!(
        "rolling deploy ({}): {POOLS} pools × {per_pool}, {} restarts ({ROUNDS} \
         rounds); SIGTERM → exit median {} ms max {} ms; {} handoffs, release → next claim \
         median {median} ms max {max} ms; {completed}/{SESSIONS} completed in {:.1} s \
         ({:.2} sessions/s, {THINK} ms think per step, {STEPS} steps; active at the \
         restarts {active_at:?}); emails {emails}, charges {charges}, duplicates 0, \
         recoveries 0",
        backend.name(),
        ROUNDS * POOLS,
        exit_ms[exit_ms.len() / 2],
        exit_ms.last().expect("exits"),
        handoffs.len(),
        took.as_secs_f64(),
        SESSIONS as f64 / took.as_secs_f64(),
    );
}
