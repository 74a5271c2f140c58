//! Crash loops: what counts as a death toward parking a session.
//!
//! - `poison`: a poison pill resumed by id. A worker restarted under a stable owner
//!   resumes its session by id and runs a `pure` tool that aborts the process, again and
//!   again. Every restart re-acquires its own live lease without waiting for it; each one
//!   after a death while the session ran counts a recovery; the restart past
//!   `MAX_RECOVERY_ATTEMPTS` parks the session and gets the typed `Parked` error saying how
//!   to unpark it, instead of crash-looping forever.
//! - `idle_leases`: a worker restarted under a stable owner takes the leases of three
//!   sessions by id without running them and is SIGKILLed, more times than the bound:
//!   those deaths happened while the worker was elsewhere, so nothing is counted, no
//!   session is parked, and each runs to completion afterwards.

use std::os::unix::process::ExitStatusExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use durable::store::SessionStatus;
use durable::{Durable, Message, ReplayClass, SessionId, StartOptions, ToolSpec};
use serde_json::{Value, json};

use crate::backend::Backend;
use crate::proc::{Output, Worker};
use crate::worker::{APP_VERSION, MAX_RECOVERY_ATTEMPTS, SESSION};

/// The one worker's stable name, across its restarts.
const OWNER: &str = "poison-worker";
/// Far longer than the test: a restart that waited for its old lease would time out.
const TTL: Duration = Duration::from_secs(600);
/// SIGABRT: how the poison tool kills its worker.
const SIGABRT: i32 = 6;

fn runtime(store: &Arc<dyn durable::CheckpointStore>, owner: &str) -> Durable {
    Durable::builder(Arc::clone(store))
        .owner(owner)
        .app_version(APP_VERSION)
        .lease_ttl(TTL)
        .renew_leases(false)
        .max_recovery_attempts(MAX_RECOVERY_ATTEMPTS)
        .build()
}

pub async fn poison(backend: Backend) {
    let started = Instant::now();
    let store = backend.store().await;
    let _ledger = backend.ledger().await;
    let id = SessionId::new("poison-0");
    // The worker's first life: it starts the session and dies holding the lease, before
    // running anything (an idle lease: not counted).
    drop(
        runtime(&store, OWNER)
            .start::<Message>(StartOptions::new().with_id(id.clone()))
            .await
            .expect("start"),
    );
    let restart = || {
        let mut w = Worker::spawn(
            "poison",
            &backend,
            OWNER,
            TTL,
            &[(SESSION, id.as_str())],
            Output::Lines,
        );
        let status = w.wait(Duration::from_secs(60));
        (status, w.rest())
    };
    // Each restart aborts in the poison tool; the next one counts that death.
    for attempt in 1..=MAX_RECOVERY_ATTEMPTS + 1 {
        let (status, lines) = restart();
        assert_eq!(
            status.signal(),
            Some(SIGABRT),
            "restart {attempt} must resume its own session at once, then abort in the poison \
             tool ({status}): {lines:?}"
        );
        let expected = format!("resumed {id} recoveries {}", attempt - 1);
        assert!(
            lines.contains(&expected),
            "restart {attempt}: expected `{expected}`: {lines:?}"
        );
    }
    let (status, lines) = restart();
    assert!(
        status.success(),
        "the restart past the bound must be refused, not crash: {lines:?}"
    );
    let parked = lines
        .iter()
        .find(|l| l.starts_with(&format!("parked {id}: ")))
        .unwrap_or_else(|| panic!("the last restart must report `Parked`: {lines:?}"));
    assert!(
        parked.contains(&format!("durable unpark {id}")),
        "Parked says how to unpark: {parked}"
    );
    let record = store.session(&id).await.expect("session");
    assert_eq!(record.status, SessionStatus::Parked, "{lines:?}");
    assert!(
        record
            .status_reason
            .as_deref()
            .is_some_and(|r| r.contains("recovery attempts exhausted")),
        "{:?}",
        record.status_reason
    );
    assert!(
        started.elapsed() < TTL,
        "every restart must take back its own live lease at once"
    );
    println!(
        "poison[{}]: {} restarts under `{OWNER}` resumed by id and aborted in a pure tool, \
         the next was refused: {parked} ({:.1} s)",
        backend.name(),
        MAX_RECOVERY_ATTEMPTS + 1,
        started.elapsed().as_secs_f64()
    );
}

pub async fn idle_leases(backend: Backend) {
    const IDLE_OWNER: &str = "idle-worker";
    const SESSIONS: usize = 3;
    let kills = usize::try_from(MAX_RECOVERY_ATTEMPTS).expect("bound") + 3;
    let started = Instant::now();
    let store = backend.store().await;
    let _ledger = backend.ledger().await;
    let ids: Vec<SessionId> = (0..SESSIONS)
        .map(|i| SessionId::new(format!("idle-{i}")))
        .collect();
    // Started by the worker's first life, which dies holding them without running them.
    let first = runtime(&store, IDLE_OWNER);
    for id in &ids {
        drop(
            first
                .start::<Message>(StartOptions::new().with_id(id.clone()))
                .await
                .expect("start"),
        );
    }
    let names = ids
        .iter()
        .map(SessionId::as_str)
        .collect::<Vec<_>>()
        .join(",");
    for kill in 1..=kills {
        let mut w = Worker::spawn(
            "idle",
            &backend,
            IDLE_OWNER,
            TTL,
            &[(SESSION, names.as_str())],
            Output::Lines,
        );
        let (line, before) = w.line_starting("holding ", Duration::from_secs(60));
        assert!(
            before.iter().all(|l| !l.starts_with("parked ")),
            "life {kill}: a session held idle was parked: {before:?}"
        );
        assert_eq!(
            line,
            format!("holding {SESSIONS}"),
            "life {kill}: every session taken: {before:?}"
        );
        w.kill();
    }
    let last = runtime(&store, IDLE_OWNER);
    let spec = ToolSpec::new(
        "look",
        "A harmless read.",
        ReplayClass::Pure,
        json!({"type": "object"}),
    );
    for id in &ids {
        let record = store.session(id).await.expect("session");
        assert_eq!(
            (record.status, record.recovery_attempts),
            (SessionStatus::Active, 0),
            "{id}: killed {kills} times while held idle"
        );
        // And it runs: resumed by the same owner (not `Parked`), a call, completed.
        let session = last
            .resume::<Message>(id)
            .await
            .unwrap_or_else(|e| panic!("{id}: resume after {kills} idle deaths: {e}"))
            .session;
        let _: Value = session
            .journal()
            .tool(&spec, json!({}))
            .run(|_ctx| async { Ok::<_, String>(json!({"ok": true})) })
            .await
            .expect("call");
        session.complete().await.expect("complete");
        assert_eq!(
            store.session(id).await.expect("session").status,
            SessionStatus::Completed
        );
    }
    println!(
        "idle_leases[{}]: {SESSIONS} sessions held idle by a worker SIGKILLed {kills} times \
         (bound {MAX_RECOVERY_ATTEMPTS}): none parked, recovery counters 0, all completed \
         after ({:.1} s)",
        backend.name(),
        started.elapsed().as_secs_f64()
    );
}
