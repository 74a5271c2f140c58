//! A poison pill resumed by id: a worker restarted under a stable owner resumes its
//! session by id and dies at once, again and again, each time holding the lease it took.
//! Every restart re-acquires its own live lease without waiting for it, and counts a
//! recovery; the restart past `MAX_RECOVERY_ATTEMPTS` parks the session and gets the typed
//! `Parked` error saying how to unpark it, instead of crash-looping forever.

use std::sync::Arc;
use std::time::{Duration, Instant};

use durable::Message;
use durable::store::SessionStatus;
use durable::{Durable, SessionId, StartOptions};

use crate::backend::Backend;
use crate::proc::{Output, Worker};
use crate::worker::{APP_VERSION, EXIT_CRASHED, MAX_RECOVERY_ATTEMPTS, SESSION};

/// The one worker's stable name, across its restarts.
const OWNER: &str = "poison-worker";
/// Far longer than the test: a restart that waited for its old lease would time out.
const TTL: Duration = Duration::from_secs(600);

pub async fn poison(backend: Backend) {
    let started = Instant::now();
    let store = backend.store().await;
    let _ledger = backend.ledger().await;
    let id = SessionId::new("poison-0");
    // The worker's first life: it starts the session (and dies holding the lease).
    let first = Durable::builder(Arc::clone(&store))
        .owner(OWNER)
        .app_version(APP_VERSION)
        .lease_ttl(TTL)
        .renew_leases(false)
        .build();
    drop(
        first
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
    for attempt in 1..=MAX_RECOVERY_ATTEMPTS {
        let (status, lines) = restart();
        assert_eq!(
            status.code(),
            Some(EXIT_CRASHED),
            "restart {attempt} must resume its own session at once, then crash: {lines:?}"
        );
        let expected = format!("resumed {id} recoveries {attempt}");
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
        "poison[{}]: {MAX_RECOVERY_ATTEMPTS} restarts under `{OWNER}` resumed by id and crashed, \
         the next was refused: {parked} ({:.1} s)",
        backend.name(),
        started.elapsed().as_secs_f64()
    );
}
