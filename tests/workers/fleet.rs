//! A fleet: 4 worker processes, 40 sessions of pure, keyed and unsafe tools whose effects
//! go to ledger tables; workers are killed at random (SIGKILL) and restarted, and on
//! PostgreSQL the server itself may be crashed and restarted mid-run. At the end every
//! session is completed or parked for an operator, no unsafe effect happened twice, no
//! recorded result was lost, and every keyed effect was applied once by its receiver.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use durable::CheckpointStore;
use durable::store::{CallKind, CallRecord, CallStatus, SessionFilter, SessionStatus};

use crate::backend::Backend;
use crate::ledger::{Arg, Ledger, random_below};
use crate::proc::{Output, Worker};
use crate::worker::{self, EXIT_LEDGER_DOWN, STEPS, TOOLS};

const SESSIONS: usize = 40;
const WORKERS: usize = 4;
/// Short, so that killed workers' sessions are recovered quickly; long enough that a worker
/// stalled by a loaded machine between an unsafe call's issue and its effect is not
/// overtaken by a recovery (the ledger, like most receivers, is not fenced).
const TTL: Duration = Duration::from_secs(3);
/// Kills stop after this many, so that the run converges.
const MAX_KILLS: usize = 30;
const DEADLINE: Duration = Duration::from_secs(120);

/// What a fleet run did and found.
#[derive(Debug, Default)]
pub struct Summary {
    pub completed: usize,
    pub parked: usize,
    /// Among `parked`: crash loops (recovery attempts exhausted).
    pub crash_loops: usize,
    pub kills: usize,
    pub crashes: usize,
    pub restarts: usize,
    pub duplicates: usize,
    pub lost: usize,
    pub keyed_attempts: i64,
    pub keyed_applied: i64,
    pub in_doubt: usize,
    /// Lines where a worker met a database error and carried on (or crashed on purpose).
    pub db_errors: usize,
    /// In-doubt emails the verify hook found in the ledger (result recorded, not re-sent).
    pub verified_happened: usize,
    /// In-doubt emails the verify hook did not find (sent now, once).
    pub verified_not_happened: usize,
}

/// Runs the fleet; `restarts` server restarts are spread over the run (PostgreSQL only).
pub async fn fleet(backend: Backend, restarts: usize) {
    let started = Instant::now();
    let store = backend.store().await;
    let ledger = backend.ledger().await;
    for i in 0..SESSIONS {
        ledger
            .execute(
                "INSERT INTO ledger_queue (id) VALUES ($1)",
                &[Arg::S(&format!("fleet-{i:02}"))],
            )
            .await
            .expect("queue");
    }
    let logs = backend.log_dir();
    let mut generation = 0usize;
    let mut spawn = |slot: usize| {
        generation += 1;
        let owner = format!("{}-w{slot}-g{generation}", backend.name());
        let log = logs.path().join(format!("{owner}.log"));
        Worker::spawn("fleet", &backend, &owner, TTL, &[], Output::Log(log))
    };
    let mut slots: Vec<Option<Worker>> = (0..WORKERS).map(|s| Some(spawn(s))).collect();
    let mut summary = Summary::default();
    // Restarts are placed by progress, not by the clock: restart i comes once 8 + 12·i
    // sessions are done, whatever the machine's speed, so each one lands mid-run.
    let restart_after: Vec<usize> = (0..restarts).map(|i| 8 + 12 * i).collect();
    assert!(restart_after.last().is_none_or(|&n| n < SESSIONS));
    let mut finished = false;
    loop {
        tokio::time::sleep(Duration::from_millis(150 + random_below(300))).await;
        assert!(
            started.elapsed() < DEADLINE,
            "the fleet did not finish in {DEADLINE:?}{}",
            slots
                .iter()
                .flatten()
                .map(Worker::log_text)
                .collect::<String>()
        );
        for (slot, worker) in slots.iter_mut().enumerate() {
            let Some(w) = worker else { continue };
            let Some(status) = w.child.try_wait().expect("try_wait") else {
                continue;
            };
            match status.code() {
                Some(0) => *worker = None,
                Some(EXIT_LEDGER_DOWN) => {
                    summary.crashes += 1;
                    *worker = Some(spawn(slot));
                }
                _ => panic!("{} failed with {status}{}", w.owner, w.log_text()),
            }
        }
        if slots.iter().all(Option::is_none) {
            break;
        }
        if !finished {
            finished = matches!(worker::active_sessions(store.as_ref()).await, Some(0))
                && ledger
                    .scalar("SELECT count(*) FROM ledger_queue", &[])
                    .await
                    .is_ok_and(|n| n == 0);
        }
        if summary.restarts < restart_after.len()
            && done_sessions(store.as_ref())
                .await
                .is_some_and(|done| done >= restart_after[summary.restarts])
        {
            assert!(
                !finished,
                "the fleet finished before server restart {}: it would test nothing",
                summary.restarts + 1
            );
            #[cfg(feature = "_postgres-testing")]
            backend.restart_server();
            summary.restarts += 1;
            println!(
                "fleet[{}]: server restarted at {:.1} s, after {} sessions",
                backend.name(),
                started.elapsed().as_secs_f64(),
                restart_after[summary.restarts - 1]
            );
        }
        if !finished && summary.kills < MAX_KILLS {
            let live: Vec<usize> = (0..WORKERS).filter(|&s| slots[s].is_some()).collect();
            let slot = live[random_below(live.len() as u64) as usize];
            if let Some(mut w) = slots[slot].take() {
                w.kill();
                summary.kills += 1;
            }
            slots[slot] = Some(spawn(slot));
        }
    }
    assert_eq!(
        summary.restarts, restarts,
        "the run ended before every server restart"
    );
    let logged = |pick: &dyn Fn(&str) -> bool| -> usize {
        std::fs::read_dir(logs.path())
            .expect("logs")
            .flatten()
            .map(|entry| {
                let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
                text.lines().filter(|l| pick(l)).count()
            })
            .sum()
    };
    summary.db_errors = logged(&|l| {
        l.contains("retrying") || l.starts_with("abandoned") || l.starts_with("crash:")
    });
    summary.verified_happened = logged(&|l| l.starts_with("verify: happened"));
    summary.verified_not_happened = logged(&|l| l.starts_with("verify: did not happen"));
    check(store.as_ref(), &ledger, &mut summary).await;
    println!(
        "fleet: backend={} sessions={SESSIONS} completed={} parked={} (crash loops {}) kills={} crashes={} \
         restarts={} duplicates={} lost={} keyed_attempts={} keyed_applied={} \
         in_doubt_for_operator={} verified_happened={} verified_not_happened={} \
         db_errors_survived={} ({:.1} s)",
        backend.name(),
        summary.completed,
        summary.parked,
        summary.crash_loops,
        summary.kills,
        summary.crashes,
        summary.restarts,
        summary.duplicates,
        summary.lost,
        summary.keyed_attempts,
        summary.keyed_applied,
        summary.in_doubt,
        summary.verified_happened,
        summary.verified_not_happened,
        summary.db_errors,
        started.elapsed().as_secs_f64()
    );
    assert_eq!(summary.completed + summary.parked, SESSIONS);
    assert_eq!(summary.duplicates, 0, "duplicate unsafe effects");
    assert_eq!(summary.lost, 0, "lost recorded results");
}

/// Checks every invariant from the store and the ledger; counts into `summary`, panics on
/// what must never happen.
async fn check(store: &dyn CheckpointStore, ledger: &Ledger, summary: &mut Summary) {
    let sessions = store
        .list_sessions(&SessionFilter::default())
        .await
        .expect("sessions");
    assert_eq!(sessions.len(), SESSIONS, "every queued session was started");
    let emails = ledger
        .rows(
            "SELECT receipt, effect_key, call_id FROM ledger_emails",
            &[],
        )
        .await
        .expect("emails");
    let mut per_effect: HashMap<&str, usize> = HashMap::new();
    for e in &emails {
        *per_effect.entry(e[1].as_str()).or_default() += 1;
    }
    summary.duplicates = per_effect.values().filter(|&&n| n > 1).count();
    let receipts: HashMap<&str, (&str, &str)> = emails
        .iter()
        .map(|e| (e[0].as_str(), (e[1].as_str(), e[2].as_str())))
        .collect();
    let charges: HashMap<String, String> = ledger
        .rows("SELECT charge_key, charge_id FROM ledger_charges", &[])
        .await
        .expect("charges")
        .into_iter()
        .map(|r| (r[0].clone(), r[1].clone()))
        .collect();
    let attempted: HashSet<String> = ledger
        .rows(
            "SELECT DISTINCT charge_key FROM ledger_charge_attempts",
            &[],
        )
        .await
        .expect("attempts")
        .into_iter()
        .map(|r| r[0].clone())
        .collect();
    summary.keyed_attempts = ledger
        .scalar("SELECT count(*) FROM ledger_charge_attempts", &[])
        .await
        .expect("count");
    summary.keyed_applied = charges.len() as i64;

    let mut lost = Vec::new();
    for record in &sessions {
        let id = record.id.as_str();
        match record.status {
            SessionStatus::Completed => summary.completed += 1,
            SessionStatus::Parked => {
                summary.parked += 1;
                if record
                    .status_reason
                    .as_deref()
                    .is_some_and(|r| r.contains("recovery attempts exhausted"))
                {
                    summary.crash_loops += 1;
                }
            }
            other => panic!("{id} ended {other:?}: {:?}", record.status_reason),
        }
        let versions: Vec<i64> = store
            .list_checkpoints(&record.id)
            .await
            .expect("checkpoints")
            .iter()
            .map(|c| c.version)
            .collect();
        assert_eq!(
            versions,
            (0..=record.latest_version).collect::<Vec<_>>(),
            "{id}: versions are contiguous"
        );
        let calls = store.calls(&record.id, None).await.expect("calls");
        let row = |step: i64, tool: &str| -> Option<&CallRecord> {
            calls.iter().find(|c| {
                c.kind == CallKind::Tool && c.identity.step == step && c.identity.tool == tool
            })
        };
        // Every recorded email result is the receipt of one email of that call.
        for c in calls.iter().filter(|c| c.identity.tool == "send_email") {
            match c.status {
                CallStatus::Completed | CallStatus::Resolved => {
                    let receipt = c.result.as_ref().and_then(|r| r["receipt"].as_str());
                    let (_, email_key) = worker::effect_keys(id, c.identity.step);
                    match receipt.and_then(|r| receipts.get(r)) {
                        Some((key, call)) if *key == email_key && *call == c.id.as_str() => {}
                        found => lost.push(format!(
                            "{id} step {}: recorded email {receipt:?} matches no email of the call ({found:?})",
                            c.identity.step
                        )),
                    }
                }
                CallStatus::Issued => summary.in_doubt += 1,
                other => panic!("{id}: email call {} ended {other:?}", c.id),
            }
        }
        // A keyed effect attempted and never applied is only possible if its session
        // stopped in that very call.
        for step in 0..STEPS {
            let (charge_key, _) = worker::effect_keys(id, step);
            if attempted.contains(&charge_key) && !charges.contains_key(&charge_key) {
                assert_eq!(
                    record.status,
                    SessionStatus::Parked,
                    "{id}: charge {charge_key} attempted but never applied"
                );
            }
        }
        if record.status != SessionStatus::Completed {
            assert!(
                calls.iter().any(|c| c.status == CallStatus::Issued)
                    || record
                        .status_reason
                        .as_deref()
                        .is_some_and(|r| r.contains("recovery attempts")),
                "{id} was parked with nothing in doubt: {:?}",
                record.status_reason
            );
            continue;
        }
        // Completed: what the application kept (checkpoint state) is exactly what the
        // journal recorded, and what the receivers applied.
        let state = store
            .load_checkpoint(&record.id, None)
            .await
            .expect("latest")
            .state;
        for step in 0..STEPS {
            let (charge_key, _) = worker::effect_keys(id, step);
            for (short, tool) in TOOLS {
                let kept = &state[step.to_string()][short];
                let recorded = row(step, tool)
                    .filter(|c| c.status.has_outcome())
                    .and_then(|c| c.result.as_ref());
                if recorded != Some(kept) || kept.is_null() {
                    lost.push(format!(
                        "{id} step {step} {tool}: kept {kept} but the journal recorded {recorded:?}"
                    ));
                }
            }
            let kept_charge = state[step.to_string()]["charge"]["charge_id"].as_str();
            if kept_charge != charges.get(&charge_key).map(String::as_str) {
                lost.push(format!(
                    "{id} step {step}: kept charge {kept_charge:?}, receiver applied {:?}",
                    charges.get(&charge_key)
                ));
            }
            if state[step.to_string()]["email"]["receipt"]
                .as_str()
                .is_none_or(|r| !receipts.contains_key(r))
            {
                lost.push(format!(
                    "{id} step {step}: kept an email receipt the ledger never saw"
                ));
            }
        }
        if state.as_object().map(|m| m.len()) != Some(STEPS as usize) {
            lost.push(format!("{id}: state {state}"));
        }
    }
    for line in &lost {
        eprintln!("lost: {line}");
    }
    summary.lost = lost.len();
}

/// Sessions completed or parked; `None` while the store is unreachable.
async fn done_sessions(store: &dyn CheckpointStore) -> Option<usize> {
    store
        .list_sessions(
            &SessionFilter::new()
                .with_statuses(vec![SessionStatus::Completed, SessionStatus::Parked]),
        )
        .await
        .ok()
        .map(|s| s.len())
}
