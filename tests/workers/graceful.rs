//! A graceful restart in real processes: sessions are submitted, a worker pool process
//! (`pool` role) runs them two at a time and is sent SIGTERM mid-run; it stops at safe
//! points, releases its leases and exits 0; a second pool process takes the rest over at
//! once (the lease TTL is 30 s: a lease left behind would stall it that long) and
//! completes them. The ledger shows every effect exactly once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use durable::store::{SessionFilter, SessionStatus};
use durable::{Durable, Message, SessionId, StartOptions};

use crate::backend::Backend;
use crate::proc::{Output, Worker, signal};
use crate::worker::{self, STEPS};

const SESSIONS: usize = 16;
/// Long: only a released lease lets the second pool start at once.
const TTL: Duration = Duration::from_secs(30);

/// Runs the case.
pub async fn graceful(backend: Backend) {
    let store = backend.store().await;
    let ledger = backend.ledger().await;
    let submitter = Durable::builder(Arc::clone(&store))
        .owner("submitter")
        .app_version(worker::APP_VERSION)
        .build();
    let mut ids = Vec::new();
    for i in 0..SESSIONS {
        let options = StartOptions::<Message>::new()
            .with_id(SessionId::new(format!("graceful-{i:02}")))
            .with_messages(vec![Message::user(format!("task {i}"))]);
        ids.push(submitter.submit(options).await.expect("submit"));
    }

    // The first pool: SIGTERM once it has completed a few sessions.
    let mut a = Worker::spawn("pool", &backend, "pool-a", TTL, &[], Output::Lines);
    for _ in 0..3 {
        a.line_starting("completed ", Duration::from_secs(60));
    }
    // Right after a claim: that session is in its first step, so it is released mid-run.
    a.line_starting("claimed ", Duration::from_secs(60));
    let term_sent = Instant::now();
    signal(a.pid(), "TERM");
    let status = a.wait(Duration::from_secs(20));
    let stopped = Instant::now();
    let lines = a.rest();
    assert!(status.success(), "pool-a exited with {status}: {lines:?}");
    let summary = lines
        .iter()
        .find(|l| l.starts_with("pool stopped"))
        .unwrap_or_else(|| panic!("no report from pool-a: {lines:?}"));
    assert!(summary.ends_with("aborted 0"), "{summary}");
    let released = lines.iter().filter(|l| l.starts_with("released ")).count();
    assert!(released > 0, "no session released mid-run: {lines:?}");
    for id in &ids {
        let record = store.session(id).await.expect("session");
        // (A completed session keeps its last owner's name; its lease is void.)
        if record.status == SessionStatus::Active {
            assert_eq!(
                record.lease_owner, None,
                "{id} still leased after pool-a stopped"
            );
        }
    }
    let left = worker::active_sessions(store.as_ref())
        .await
        .expect("active sessions");
    assert!(
        left > 0,
        "pool-a finished everything before SIGTERM: nothing tested"
    );

    // The second pool takes over at once.
    let mut b = Worker::spawn("pool", &backend, "pool-b", TTL, &[], Output::Lines);
    let (_, _) = b.line_starting("worker pool-b up", Duration::from_secs(30));
    let up = Instant::now();
    let (claimed, _) = b.line_starting("claimed ", Duration::from_secs(20));
    let handoff = up.elapsed();
    let since_exit = stopped.elapsed();
    // Well under the TTL: a session still leased by pool-a would hold pool-b up that long.
    let status = b.wait(TTL / 2);
    let lines = b.rest();
    assert!(status.success(), "pool-b exited with {status}: {lines:?}");
    assert!(
        handoff < Duration::from_secs(1),
        "pool-b waited {handoff:?} for its first claim ({claimed})"
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
    assert!(sessions.iter().all(|s| s.recovery_attempts == 0));
    let (emails, charges) = ledger.assert_effects_once(STEPS * SESSIONS as i64).await;
    println!(
        "graceful ({}): SIGTERM → exit {:.0} ms, {released} released, {left} left; \
         pool-b's first claim {:.1} ms after it was up ({:.0} ms after pool-a exited, \
         process start included); emails {emails}, charges {charges}, duplicates 0",
        backend.name(),
        (stopped - term_sent).as_secs_f64() * 1000.0,
        handoff.as_secs_f64() * 1000.0,
        since_exit.as_secs_f64() * 1000.0,
    );
}
