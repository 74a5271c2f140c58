//! SIGTERM at a precise point of a pool's work, in real processes.
//!
//! `mid_call`: a pool process (`pool` role) is held inside one tool call of a session's
//! first step (a pure, a keyed or an unsafe call, before its ledger effect) or right
//! before that step's checkpoint, and is sent SIGTERM there. The hold is released only
//! once the pool has acknowledged the signal, so the call finishes with shutdown already
//! requested: it must record its outcome and apply its effect once, the handler must
//! release the session at the next safe point, and the pool must exit 0 with nothing
//! aborted. A second pool process then claims the session at once (the lease TTL is 30 s)
//! and completes it; the ledger shows every effect once.
//!
//! `deadline`: the pool's shutdown deadline is short (500 ms) and three calls are held
//! past it, each right after its ledger effect: an unsafe email with a verify hook, one
//! without, and a keyed charge. The pool aborts the three handlers and exits; their leases
//! are left to expire (TTL 2 s). The next pool recovers them after the TTL, and the
//! journal decides: the verified email is found sent (not sent again), the other is in
//! doubt (the session is parked for an operator), the charge re-executes with the same
//! key and the receiver applies it once. 0 duplicate effects.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use durable::store::{CallKind, CallRecord, CallStatus, SessionFilter, SessionStatus};
use durable::{CheckpointStore, Durable, Message, SessionId, StartOptions};

use crate::backend::Backend;
use crate::hook::{BLOCK, CONCURRENCY, DEADLINE_MS, GATE, now_ms};
use crate::ledger::{Arg, Ledger};
use crate::proc::{Output, Worker, signal};
use crate::worker::{self, STEPS, TOOLS};

/// Where `mid_call` holds the pool when SIGTERM is sent.
#[derive(Debug, Clone, Copy)]
pub enum Point {
    /// In the pure `read_account` call.
    Pure,
    /// In the keyed `charge_card` call, before the charge.
    Keyed,
    /// In the unsafe `send_email` call, before the email.
    Unsafe,
    /// Right before the step's checkpoint (every call of the step recorded).
    Checkpoint,
}

impl Point {
    fn name(self) -> &'static str {
        match self {
            Point::Pure => "read_account",
            Point::Keyed => "charge_card",
            Point::Unsafe => "send_email",
            Point::Checkpoint => "checkpoint",
        }
    }
}

const SESSIONS: usize = 4;
/// Long: only a released lease lets the second pool claim at once.
const TTL: Duration = Duration::from_secs(30);
/// The session held at step 0.
const HELD: &str = "sigterm-00";

/// Submits `ids` in order (so that a pool claims them in that order).
async fn submit(store: &Arc<dyn CheckpointStore>, ids: &[String]) {
    let submitter = Durable::builder(Arc::clone(store))
        .owner("submitter")
        .app_version(worker::APP_VERSION)
        .build();
    for id in ids {
        let options = StartOptions::<Message>::new()
            .with_id(SessionId::new(id))
            .with_messages(vec![Message::user(format!("task {id}"))]);
        submitter.submit(options).await.expect("submit");
        // Distinct `updated_at` milliseconds: claims are oldest first.
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
}

/// The tool call row of `session`'s `step`, if any.
async fn call_row(
    store: &dyn CheckpointStore,
    session: &str,
    step: i64,
    tool: &str,
) -> Option<CallRecord> {
    store
        .calls(&SessionId::new(session), None)
        .await
        .expect("calls")
        .into_iter()
        .find(|c| c.kind == CallKind::Tool && c.identity.step == step && c.identity.tool == tool)
}

/// Rows of a ledger table with `column = value`.
async fn count(ledger: &Ledger, table: &str, column: &str, value: &str) -> i64 {
    ledger
        .scalar(
            &format!("SELECT count(*) FROM {table} WHERE {column} = $1"),
            &[Arg::S(value)],
        )
        .await
        .expect("ledger count")
}

/// Effect keys with more than one email.
async fn duplicate_emails(ledger: &Ledger) -> i64 {
    ledger
        .scalar(
            "SELECT count(*) FROM (SELECT effect_key FROM ledger_emails GROUP BY effect_key \
             HAVING count(*) > 1) AS d",
            &[],
        )
        .await
        .expect("duplicates")
}

/// The `pool stopped …` line of a pool's output.
fn pool_summary<'a>(owner: &str, lines: &'a [String]) -> &'a str {
    lines
        .iter()
        .find(|l| l.starts_with("pool stopped"))
        .unwrap_or_else(|| panic!("no report from {owner}: {lines:?}"))
}

/// Runs the `mid_call` case with the pool held at `point`.
pub async fn mid_call(backend: Backend, point: Point) {
    let store = backend.store().await;
    let ledger = backend.ledger().await;
    let ids: Vec<String> = (0..SESSIONS).map(|i| format!("sigterm-{i:02}")).collect();
    submit(&store, &ids).await;
    let gate_dir = tempfile::tempdir().expect("gate dir");
    let gate = gate_dir.path().join("open");
    let block = format!("{}:{HELD}:before", point.name());
    let gate_path = gate.display().to_string();
    let mut a = Worker::spawn(
        "pool",
        &backend,
        "pool-a",
        TTL,
        &[(BLOCK, &block), (GATE, &gate_path)],
        Output::Lines,
    );
    let (_, mut lines) = a.line_starting(
        &format!("in {} {HELD} ", point.name()),
        Duration::from_secs(60),
    );
    let term_sent = Instant::now();
    signal(a.pid(), "TERM");
    let (_, before) = a.line_starting("SIGTERM: stopping", Duration::from_secs(10));
    lines.extend(before);
    // Still held: the call has no outcome yet (a pure call has no row until it returns),
    // or the step's checkpoint is not written yet.
    let held = store.session(&SessionId::new(HELD)).await.expect("session");
    assert_eq!(held.latest_version, 0, "{HELD} went past step 0 while held");
    assert_eq!(held.lease_owner.as_deref(), Some("pool-a"));
    for (_, tool) in TOOLS {
        let row = call_row(store.as_ref(), HELD, 0, tool).await;
        let done = row.as_ref().is_some_and(|r| r.status.has_outcome());
        match point {
            Point::Checkpoint => assert!(done, "{tool} not recorded before the checkpoint"),
            _ if tool == point.name() => assert!(!done, "{tool} recorded while held: {row:?}"),
            _ => {}
        }
    }
    let opened = Instant::now();
    std::fs::write(&gate, b"").expect("open the gate");
    let status = a.wait(Duration::from_secs(20));
    let stopped = Instant::now();
    lines.extend(a.rest());
    assert!(status.success(), "pool-a exited with {status}: {lines:?}");
    let summary = pool_summary("pool-a", &lines);
    assert!(summary.ends_with("aborted 0"), "{summary}");
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with(&format!("through {} {HELD} ", point.name()))),
        "the held call never went on: {lines:?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with(&format!("released {HELD} "))),
        "{HELD} was not released at its next safe point: {lines:?}"
    );

    // The step finished under shutdown: recorded, checkpointed, released.
    let record = store.session(&SessionId::new(HELD)).await.expect("session");
    assert_eq!(record.status, SessionStatus::Active, "{record:?}");
    assert_eq!(
        record.lease_owner, None,
        "{HELD} still leased after pool-a exited"
    );
    assert_eq!(
        record.latest_version, 1,
        "step 0 not checkpointed: {record:?}"
    );
    for (_, tool) in TOOLS {
        let row = call_row(store.as_ref(), HELD, 0, tool)
            .await
            .unwrap_or_else(|| panic!("no row for {tool}"));
        assert!(row.status.has_outcome(), "{tool}: {row:?}");
        assert_eq!(row.attempt, 1, "{tool} ran more than once: {row:?}");
    }
    let (charge_key, email_key) = worker::effect_keys(HELD, 0);
    assert_eq!(
        count(&ledger, "ledger_charge_attempts", "charge_key", &charge_key).await,
        1
    );
    assert_eq!(
        count(&ledger, "ledger_charges", "charge_key", &charge_key).await,
        1
    );
    assert_eq!(
        count(&ledger, "ledger_emails", "effect_key", &email_key).await,
        1
    );

    // The second pool (room for every session) claims the held one at once.
    let mut b = Worker::spawn(
        "pool",
        &backend,
        "pool-b",
        TTL,
        &[(CONCURRENCY, "4")],
        Output::Lines,
    );
    b.line_starting("worker pool-b up", Duration::from_secs(30));
    let up = Instant::now();
    let (claimed, _) = b.line_starting(&format!("claimed {HELD} "), Duration::from_secs(20));
    let handoff = up.elapsed();
    let since_exit = stopped.elapsed();
    let status = b.wait(TTL / 2);
    let lines_b = b.rest();
    assert!(status.success(), "pool-b exited with {status}: {lines_b:?}");
    assert!(pool_summary("pool-b", &lines_b).ends_with("aborted 0"));
    assert!(claimed.contains(" at version 1 "), "{claimed}");
    assert!(
        handoff < Duration::from_secs(1),
        "pool-b waited {handoff:?} to claim {HELD} ({claimed})"
    );

    let sessions = store
        .list_sessions(&SessionFilter::new())
        .await
        .expect("sessions");
    assert!(
        sessions
            .iter()
            .all(|s| s.status == SessionStatus::Completed && s.recovery_attempts == 0),
        "{sessions:?}"
    );
    for (_, tool) in TOOLS {
        let row = call_row(store.as_ref(), HELD, 0, tool).await.expect("row");
        assert_eq!(row.attempt, 1, "{tool} re-executed by pool-b: {row:?}");
    }
    let effects = STEPS * SESSIONS as i64;
    let emails = ledger
        .scalar("SELECT count(*) FROM ledger_emails", &[])
        .await
        .expect("emails");
    let charges = ledger
        .scalar("SELECT count(*) FROM ledger_charges", &[])
        .await
        .expect("charges");
    let attempts = ledger
        .scalar("SELECT count(*) FROM ledger_charge_attempts", &[])
        .await
        .expect("attempts");
    assert_eq!(duplicate_emails(&ledger).await, 0);
    assert_eq!((emails, charges, attempts), (effects, effects, effects));
    println!(
        "sigterm mid {} ({}): SIGTERM → exit {:.0} ms (the call held {:.0} ms of it, gate \
         opened → exit {:.0} ms); pool-b claimed {HELD} {:.1} ms after it was up ({:.0} ms \
         after pool-a exited, process start included); emails {emails}, charges {charges}, \
         duplicates 0",
        point.name(),
        backend.name(),
        (stopped - term_sent).as_secs_f64() * 1000.0,
        (opened - term_sent).as_secs_f64() * 1000.0,
        (stopped - opened).as_secs_f64() * 1000.0,
        handoff.as_secs_f64() * 1000.0,
        since_exit.as_secs_f64() * 1000.0,
    );
}

/// Short, so the aborted handlers' leases expire within the case.
const DEADLINE_TTL: Duration = Duration::from_secs(2);
const SHUTDOWN_DEADLINE: Duration = Duration::from_millis(500);
/// Held past the deadline, each right after its effect: (session, point). `-00` has a
/// verify hook on its email (even index), `-01` has none.
const ABORTED: [(&str, &str); 3] = [
    ("deadline-00", "send_email"),
    ("deadline-01", "send_email"),
    ("deadline-02", "charge_card"),
];

/// Runs the `deadline` case.
pub async fn deadline(backend: Backend) {
    let store = backend.store().await;
    let ledger = backend.ledger().await;
    let ids: Vec<String> = ABORTED.iter().map(|(s, _)| (*s).to_owned()).collect();
    submit(&store, &ids).await;
    let gate_dir = tempfile::tempdir().expect("gate dir");
    // Never opened: the calls are held until the pool aborts them.
    let gate = gate_dir.path().join("never").display().to_string();
    let block = ABORTED
        .iter()
        .map(|(s, p)| format!("{p}:{s}:after"))
        .collect::<Vec<_>>()
        .join(",");
    let deadline_ms = SHUTDOWN_DEADLINE.as_millis().to_string();
    let mut a = Worker::spawn(
        "pool",
        &backend,
        "pool-a",
        DEADLINE_TTL,
        &[
            (BLOCK, &block),
            (GATE, &gate),
            (CONCURRENCY, "3"),
            (DEADLINE_MS, &deadline_ms),
        ],
        Output::Lines,
    );
    let mut lines = Vec::new();
    for _ in ABORTED {
        let (line, before) = a.line_starting("in ", Duration::from_secs(60));
        lines.extend(before);
        lines.push(line);
    }
    let term_sent = Instant::now();
    signal(a.pid(), "TERM");
    let status = a.wait(Duration::from_secs(20));
    let stopped = Instant::now();
    let stopped_ms = now_ms();
    lines.extend(a.rest());
    assert!(status.success(), "pool-a exited with {status}: {lines:?}");
    let summary = pool_summary("pool-a", &lines);
    assert!(
        summary.ends_with(&format!("aborted {}", ABORTED.len())),
        "{summary}"
    );
    let term_to_exit = stopped - term_sent;
    assert!(
        term_to_exit >= SHUTDOWN_DEADLINE,
        "pool-a exited {term_to_exit:?} after SIGTERM, before its deadline"
    );
    assert!(
        !lines.iter().any(|l| l.starts_with("through ")),
        "{lines:?}"
    );

    // Left as after a crash: leased by pool-a until the TTL, each held call in doubt,
    // its effect applied once.
    let now = store.now().await.expect("now");
    // Per session, how long its lease had to run at pool-a's exit (each one was renewed
    // on its own schedule, every TTL / 3).
    let mut left = HashMap::new();
    for (session, tool) in ABORTED {
        let record = store
            .session(&SessionId::new(session))
            .await
            .expect("session");
        assert_eq!(record.lease_owner.as_deref(), Some("pool-a"), "{record:?}");
        let until = record.lease_expires_at.expect("lease expiry");
        assert!(until > now, "{session}: lease already expired: {record:?}");
        left.insert(session, until - now);
        let row = call_row(store.as_ref(), session, 0, tool)
            .await
            .expect("row");
        assert_eq!(row.status, CallStatus::Issued, "{session} {tool}: {row:?}");
    }
    let (charge_key, _) = worker::effect_keys("deadline-02", 0);
    assert_eq!(
        count(&ledger, "ledger_charges", "charge_key", &charge_key).await,
        1
    );
    for session in ["deadline-00", "deadline-01"] {
        let (_, email_key) = worker::effect_keys(session, 0);
        assert_eq!(
            count(&ledger, "ledger_emails", "effect_key", &email_key).await,
            1
        );
    }

    // The next pool recovers them once the leases expired.
    let mut b = Worker::spawn(
        "pool",
        &backend,
        "pool-b",
        DEADLINE_TTL,
        &[(CONCURRENCY, "3")],
        Output::Lines,
    );
    let (first, mut lines_b) = b.line_starting("claimed ", Duration::from_secs(20));
    let first_claim = stopped.elapsed();
    lines_b.push(first);
    let status = b.wait(Duration::from_secs(30));
    lines_b.extend(b.rest());
    assert!(status.success(), "pool-b exited with {status}: {lines_b:?}");
    // Each session claimed once its own lease expired, not before (nor a TTL late).
    let mut waits = Vec::new();
    for (session, _) in ABORTED {
        let claimed = lines_b
            .iter()
            .find_map(|l| {
                let rest = l.strip_prefix(&format!("claimed {session} "))?;
                rest.rsplit_once(" t=")?.1.parse::<u128>().ok()
            })
            .unwrap_or_else(|| panic!("pool-b never claimed {session}: {lines_b:?}"));
        let waited = i64::try_from(claimed - stopped_ms).expect("ms");
        let left = left[session];
        assert!(
            waited >= left - 50,
            "pool-b claimed {session} {waited} ms after pool-a exited, before its lease \
             expired ({left} ms were left)"
        );
        assert!(
            waited < left + DEADLINE_TTL.as_millis() as i64,
            "{session}: claimed {waited} ms after pool-a exited ({left} ms were left)"
        );
        waits.push((left, waited));
    }

    // deadline-00: the verify hook found the email sent; recorded, not sent again.
    let s0 = store
        .session(&SessionId::new("deadline-00"))
        .await
        .expect("s0");
    assert_eq!(s0.status, SessionStatus::Completed, "{s0:?}");
    let email0 = call_row(store.as_ref(), "deadline-00", 0, "send_email")
        .await
        .expect("row");
    assert_eq!(
        (email0.status, email0.attempt),
        (CallStatus::Completed, 1),
        "{email0:?}"
    );
    assert!(
        lines_b.iter().any(|l| l.starts_with("verify: happened")),
        "{lines_b:?}"
    );
    let (_, email_key0) = worker::effect_keys("deadline-00", 0);
    let sent = ledger
        .rows(
            "SELECT receipt FROM ledger_emails WHERE effect_key = $1",
            &[Arg::S(&email_key0)],
        )
        .await
        .expect("email")[0][0]
        .clone();
    assert_eq!(
        email0.result.as_ref().and_then(|r| r["receipt"].as_str()),
        Some(sent.as_str()),
        "the recorded receipt is the one email sent"
    );
    // deadline-01: no verify hook, the email is in doubt: parked for an operator.
    let s1 = store
        .session(&SessionId::new("deadline-01"))
        .await
        .expect("s1");
    assert_eq!(s1.status, SessionStatus::Parked, "{s1:?}");
    let email1 = call_row(store.as_ref(), "deadline-01", 0, "send_email")
        .await
        .expect("row");
    assert_eq!(email1.status, CallStatus::Issued, "{email1:?}");
    // deadline-02: the charge re-executed with the same key, applied once.
    let s2 = store
        .session(&SessionId::new("deadline-02"))
        .await
        .expect("s2");
    assert_eq!(s2.status, SessionStatus::Completed, "{s2:?}");
    let charge2 = call_row(store.as_ref(), "deadline-02", 0, "charge_card")
        .await
        .expect("row");
    assert_eq!(charge2.status, CallStatus::Completed, "{charge2:?}");
    assert_eq!(charge2.attempt, 2, "{charge2:?}");
    assert_eq!(
        charge2.idempotency_key.as_deref(),
        Some(charge_key.as_str())
    );
    let attempts = count(&ledger, "ledger_charge_attempts", "charge_key", &charge_key).await;
    assert_eq!(attempts, 2);
    assert_eq!(
        count(&ledger, "ledger_charges", "charge_key", &charge_key).await,
        1
    );
    let applied = ledger
        .rows(
            "SELECT charge_id FROM ledger_charges WHERE charge_key = $1",
            &[Arg::S(&charge_key)],
        )
        .await
        .expect("charge")[0][0]
        .clone();
    assert_eq!(
        charge2
            .result
            .as_ref()
            .and_then(|r| r["charge_id"].as_str()),
        Some(applied.as_str())
    );

    assert_eq!(duplicate_emails(&ledger).await, 0);
    let emails = ledger
        .scalar("SELECT count(*) FROM ledger_emails", &[])
        .await
        .expect("emails");
    // Two steps each for the completed sessions; one email for the parked one.
    assert_eq!(emails, 2 * STEPS + 1);
    println!(
        "sigterm past the deadline ({}): SIGTERM → exit {:.0} ms (deadline {} ms, aborted \
         {}); (lease left, claimed) ms after pool-a exited: {waits:?}, pool-b's first claim \
         {:.0} ms after pool-a exited; verified email recorded, unverified email in doubt (parked), charge \
         attempts {attempts} applied 1; emails {emails}, duplicates 0",
        backend.name(),
        term_to_exit.as_secs_f64() * 1000.0,
        SHUTDOWN_DEADLINE.as_millis(),
        ABORTED.len(),
        first_claim.as_secs_f64() * 1000.0,
    );
}
