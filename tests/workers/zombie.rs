//! A zombie: worker A is stopped (SIGSTOP) just before an unsafe tool, until its 3 s lease
//! has expired on the store's clock; B recovers the session and runs it to completion; A is continued (SIGCONT). Nothing A
//! writes afterwards is accepted: its unsafe call is refused before the body runs, its
//! checkpoint is refused, and A exits with "lease lost".

use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

use durable::Message;
use durable::SessionId;
use durable::store::{CallStatus, SessionStatus};

use crate::backend::Backend;
use crate::ledger::Arg;
use crate::proc::{Output, Worker, signal};
use crate::worker::{EXIT_LEASE_LOST, SESSION, STEPS};

/// A's lease: short, so that the test waits little for it to expire once A is stopped,
/// and long enough that A's renewals (every third of it) never miss on a loaded machine.
const A_TTL: Duration = Duration::from_secs(3);
/// B's lease: B only needs A's to expire, never its own.
const B_TTL: Duration = Duration::from_secs(30);

pub async fn zombie(backend: Backend) {
    let started = Instant::now();
    let store = backend.store().await;
    let ledger = backend.ledger().await;
    let id = SessionId::new("zombie-0");
    let mut a = Worker::spawn(
        "zombie-a",
        &backend,
        "zombie-a",
        A_TTL,
        &[(SESSION, id.as_str())],
        Output::Lines,
    );
    let (_, before) = a.line_starting("pausing", Duration::from_secs(30));
    // Stop A where it holds no transaction open (its lease renewal may be mid-commit):
    // a stopped process holding a lock would stall B for reasons that are not ours.
    let mut stops = 0;
    loop {
        signal(a.pid(), "STOP");
        stops += 1;
        if backend.others_idle(&ledger).await {
            break;
        }
        signal(a.pid(), "CONT");
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert!(stops < 100, "A never stopped outside a transaction");
    }
    let stopped = store.session(&id).await.expect("session");
    let a_fence = stopped.fence;
    // Wait for A's lease to expire on the store's clock (the one the store compares).
    let expires = stopped.lease_expires_at.expect("A holds a lease");
    while store.now().await.expect("now") <= expires {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // B recovers the expired session (it polls `recover_next`) and completes.
    let mut b = Worker::spawn("zombie-b", &backend, "zombie-b", B_TTL, &[], Output::Lines);
    let status = b.wait(Duration::from_secs(60));
    let b_lines = b.rest();
    assert!(status.success(), "B failed ({status}): {b_lines:?}");
    assert!(
        b_lines
            .iter()
            .any(|l| l.starts_with("claimed zombie-0 at version 1 ")),
        "B recovered the session from A's step-0 checkpoint: {b_lines:?}"
    );
    let record = store.session(&id).await.expect("session");
    assert_eq!(record.status, SessionStatus::Completed, "{b_lines:?}");
    assert!(record.fence > a_fence, "B's claim bumped the fencing token");

    // Now A wakes up.
    signal(a.pid(), "CONT");
    let status = a.wait(Duration::from_secs(30));
    let a_lines = a.rest();
    assert_eq!(
        status.code(),
        Some(EXIT_LEASE_LOST),
        "A must stop with `lease lost` (signal {:?}): {before:?} {a_lines:?}",
        status.signal()
    );
    let text = a_lines.join("\n");
    assert!(text.contains("lease lost on zombie-0"), "{text}");
    assert!(
        text.contains("checkpoint refused: lease lost"),
        "A's checkpoint must be refused too: {text}"
    );
    assert!(!text.contains("ACCEPTED"), "{text}");

    // The ledger: step 1's email was sent once, by B; A's email body never ran.
    let emails = ledger
        .rows(
            "SELECT effect_key, owner FROM ledger_emails ORDER BY effect_key",
            &[],
        )
        .await
        .expect("emails");
    assert_eq!(
        emails,
        vec![
            vec!["email:zombie-0:0".to_owned(), "zombie-a".to_owned()],
            vec!["email:zombie-0:1".to_owned(), "zombie-b".to_owned()],
        ],
        "one email per step; step 1's by B only"
    );
    let b_recharged = ledger
        .scalar(
            "SELECT count(*) FROM ledger_charge_attempts WHERE owner = $1 AND charge_key = $2",
            &[Arg::S("zombie-b"), Arg::S("charge:zombie-0:1")],
        )
        .await
        .expect("count");
    assert_eq!(
        b_recharged, 0,
        "A's step-1 charge was recorded before the pause: B replayed it, not re-charged"
    );

    // The journal: nothing issued under A's fence after the takeover; step 1's email is
    // B's and completed.
    let calls = store.calls(&id, None).await.expect("calls");
    let email_1 = calls
        .iter()
        .find(|c| c.identity.tool == "send_email" && c.identity.step == 1)
        .expect("step 1 email row");
    assert_eq!(email_1.status, CallStatus::Completed);
    assert!(email_1.fence > a_fence, "issued under B's lease");
    assert!(
        calls.iter().all(|c| c.status != CallStatus::Issued),
        "nothing left in doubt: {calls:?}"
    );

    // The checkpoints: contiguous, and every message after step 0 is B's.
    let versions: Vec<i64> = store
        .list_checkpoints(&id)
        .await
        .expect("checkpoints")
        .iter()
        .map(|c| c.version)
        .collect();
    assert_eq!(versions, (0..=STEPS + 1).collect::<Vec<_>>());
    let transcript = store.load_checkpoint(&id, None).await.expect("latest");
    let texts: Vec<String> = transcript
        .messages
        .iter()
        .map(|m| m.decode::<Message>().expect("message").text())
        .collect();
    assert_eq!(
        texts,
        vec!["step 0 done by zombie-a", "step 1 done by zombie-b"],
        "A's zombie checkpoint left no message"
    );
    println!(
        "zombie[{}]: A stopped {stops} time(s) to catch it outside a transaction; B completed \
         the session; A's writes accepted after the takeover: 0; A said: {} ({:.1} s)",
        backend.name(),
        a_lines
            .iter()
            .find(|l| l.starts_with("lease lost on"))
            .map_or("", String::as_str),
        started.elapsed().as_secs_f64()
    );
}
