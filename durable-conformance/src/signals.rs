//! Cases: signals. A signal sent once is read once, in the order sent, whatever dies
//! between its consumption and its journal row; a send retried under its key sends
//! nothing more; a session that waits for a signal holds no lease and is woken by the
//! send; a wait's deadline is journaled, and a replay reads what the first run read
//! (a signal, or nothing) at the same place.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use super::children::worker;
use super::owner;
use super::runtime::release_dead_lease;
use super::stall::Probe;
use durable_core::error::{DurableError, StoreError};
use durable_core::runtime::StartOptions;
use durable_core::store::{CheckpointStore, Claim, MAX_SIGNAL_DEPTH, NewSignal, SessionStatus};
use durable_core::transcript::Message;
use durable_core::{SessionId, SignalWait};

fn signal(session: &SessionId, name: &str, n: i64) -> NewSignal {
    NewSignal::new(session.clone(), name, json!({ "n": n }), "ops")
}

/// The store's side: consumptions are keyed (the same key is handed the same signal),
/// oldest first, by name; two keys never get the same signal; a stale fence is refused;
/// the list shows who consumed what.
pub async fn signals_are_consumed_once_in_order_under_their_key(store: Arc<dyn CheckpointStore>) {
    let durable = worker(&store, "signals");
    let session = durable
        .start::<Message>(StartOptions::new())
        .await
        .expect("start");
    let id = session.id().clone();
    let lease = session.journal().lease();
    let a = store.send_signal(&signal(&id, "go", 1)).await.expect("a");
    let b = store.send_signal(&signal(&id, "go", 2)).await.expect("b");
    let c = store
        .send_signal(&signal(&id, "other", 3))
        .await
        .expect("c");
    assert!(a.id < b.id && b.id < c.id, "ids increase in the order sent");
    assert!(a.is_pending());
    assert_eq!(
        (a.sent_by.as_str(), a.payload.clone()),
        ("ops", json!({ "n": 1 }))
    );

    let first = store
        .consume_signal(lease.fence(), "go", "k1")
        .await
        .expect("consume")
        .expect("a pending signal");
    assert_eq!(first.id, a.id, "the oldest first");
    assert_eq!(first.consumed_by.as_deref(), Some("k1"));
    let again = store
        .consume_signal(lease.fence(), "go", "k1")
        .await
        .expect("consume again")
        .expect("the same key's signal");
    assert_eq!(again.id, a.id, "the same key is handed the same signal");
    let second = store
        .consume_signal(lease.fence(), "go", "k2")
        .await
        .expect("consume")
        .expect("the next");
    assert_eq!(second.id, b.id);
    assert_eq!(
        store
            .consume_signal(lease.fence(), "go", "k3")
            .await
            .expect("consume"),
        None,
        "nothing pending of that name"
    );
    let other = store
        .consume_signal(lease.fence(), "other", "k4")
        .await
        .expect("consume")
        .expect("by name");
    assert_eq!(other.id, c.id);

    let stale = durable_core::store::Fence {
        session: &id,
        token: lease.fence - 1,
    };
    let refused = store.consume_signal(stale, "go", "k5").await;
    assert!(
        matches!(refused, Err(StoreError::LeaseLost { .. })),
        "a stale fence consumes nothing: {refused:?}"
    );

    let listed = store.signals(&id).await.expect("signals");
    let seen: Vec<(i64, Option<&str>)> = listed
        .iter()
        .map(|s| (s.id, s.consumed_by.as_deref()))
        .collect();
    assert_eq!(
        seen,
        vec![(a.id, Some("k1")), (b.id, Some("k2")), (c.id, Some("k4"))]
    );
    assert!(listed.iter().all(|s| s.consumed_at.is_some()));
    assert!(matches!(
        store.signals(&SessionId::new("no-such-session")).await,
        Err(StoreError::SessionNotFound(_))
    ));
}

/// Sends: a retry under the same key returns the first signal and writes nothing more;
/// the same key with another payload is a conflict; a missing session, an ended one and
/// a payload too deep are refused with their typed errors, nothing written.
pub async fn signals_a_keyed_send_is_sent_once_and_bad_sends_are_refused(
    store: Arc<dyn CheckpointStore>,
) {
    let durable = worker(&store, "signals");
    let session = durable
        .start::<Message>(StartOptions::new())
        .await
        .expect("start");
    let id = session.id().clone();
    let first = store
        .send_signal(&signal(&id, "go", 1).with_key("req-1"))
        .await
        .expect("send");
    let retried = store
        .send_signal(&signal(&id, "go", 1).with_key("req-1"))
        .await
        .expect("retry");
    assert_eq!(retried, first, "the retry finds the first send");
    let conflict = store
        .send_signal(&signal(&id, "go", 2).with_key("req-1"))
        .await;
    assert!(
        matches!(conflict, Err(StoreError::IdempotencyConflict { .. })),
        "{conflict:?}"
    );
    let mut deep = json!(0);
    for _ in 0..=MAX_SIGNAL_DEPTH {
        deep = json!([deep]);
    }
    let too_deep = store
        .send_signal(&NewSignal::new(id.clone(), "go", deep, "ops"))
        .await;
    assert!(
        matches!(too_deep, Err(StoreError::InvalidSignal { .. })),
        "{too_deep:?}"
    );
    let missing = store
        .send_signal(&signal(&SessionId::new("no-such-session"), "go", 1))
        .await;
    assert!(
        matches!(missing, Err(StoreError::SessionNotFound(_))),
        "{missing:?}"
    );
    assert_eq!(store.signals(&id).await.expect("signals").len(), 1);

    session.complete().await.expect("complete");
    let ended = store.send_signal(&signal(&id, "go", 3)).await;
    match ended {
        Err(StoreError::SessionEnded { session, status }) => {
            assert_eq!((session, status.as_str()), (id.clone(), "completed"));
        }
        other => panic!("a send to an ended session is refused, got {other:?}"),
    }
    assert_eq!(store.signals(&id).await.expect("signals").len(), 1);
}

/// A session dies after the store marked a signal consumed and before its journal row:
/// the re-run read is handed that signal (not the next one), and every later replay
/// reads what was recorded, in the same places, whatever was sent since.
pub async fn signals_a_read_killed_after_its_consumption_reads_the_same_signal(
    store: Arc<dyn CheckpointStore>,
) {
    let probe = Probe::new(Arc::clone(&store));
    let probed: Arc<dyn CheckpointStore> = probe.clone();
    let first = worker(&probed, "first");
    let second = worker(&store, "second");
    let session = first
        .start::<Message>(StartOptions::new())
        .await
        .expect("start");
    let id = session.id().clone();
    let a = store.send_signal(&signal(&id, "go", 1)).await.expect("a");
    let b = store.send_signal(&signal(&id, "go", 2)).await.expect("b");
    probe.stall_signal_read();
    tokio::select! {
        read = session.recv_signal("go") => panic!("the read was to park, it returned {read:?}"),
        () = probe.stalled() => {}
    }
    drop(session);
    release_dead_lease(&store, &id).await;
    let taken = store.signals(&id).await.expect("signals");
    assert!(
        !taken[0].is_pending() && taken[1].is_pending(),
        "the dead read consumed the first signal"
    );

    let rerun = second.resume::<Message>(&id).await.expect("resume").session;
    let reads = [
        rerun.recv_signal("go").await.expect("read 1"),
        rerun.recv_signal("go").await.expect("read 2"),
        rerun.recv_signal("go").await.expect("read 3"),
    ];
    let ids: Vec<Option<i64>> = reads.iter().map(|r| r.as_ref().map(|s| s.id)).collect();
    assert_eq!(
        ids,
        vec![Some(a.id), Some(b.id), None],
        "the re-run reads the dead read's signal, then the next, then nothing"
    );
    assert_eq!(reads[0].as_ref().expect("a").payload, json!({ "n": 1 }));
    drop(rerun);
    release_dead_lease(&store, &id).await;

    let c = store.send_signal(&signal(&id, "go", 3)).await.expect("c");
    let replay = second.resume::<Message>(&id).await.expect("resume").session;
    let mut ids = Vec::new();
    for _ in 0..4 {
        ids.push(replay.recv_signal("go").await.expect("read").map(|s| s.id));
    }
    assert_eq!(
        ids,
        vec![Some(a.id), Some(b.id), None, Some(c.id)],
        "a replay reads the recorded reads (nothing at the third, though a signal came \
         since), and the signal sent since at the first new read"
    );
}

/// A session that waits for a signal gives its lease up and no claim takes it; the
/// send makes it claimable at once; the replayed turn reads the signal. A wait with the
/// signal already pending reads it without letting go.
pub async fn signals_a_wait_releases_the_session_and_a_send_wakes_it(
    store: Arc<dyn CheckpointStore>,
) {
    let durable = worker(&store, "waiter");
    let session = durable
        .start::<Message>(StartOptions::new().with_queue("waiters"))
        .await
        .expect("start");
    let id = session.id().clone();
    match session
        .wait_signal("approve", Duration::from_secs(3600))
        .await
        .expect("wait")
    {
        SignalWait::Released => {}
        other => panic!("a wait with nothing pending releases the session, got {other:?}"),
    }
    let waiting = store.session(&id).await.expect("row");
    assert_eq!(
        waiting.lease_owner, None,
        "the waiting session holds no lease"
    );
    assert!(waiting.waiting_until.is_some(), "it waits");
    let claim = Claim::new(owner("pool"), Duration::from_secs(30), 5).with_queues(["waiters"]);
    assert_eq!(
        store.claim_expired(&claim).await.expect("claim"),
        None,
        "a session waiting for a signal is not claimed"
    );
    // A signal of another name does not wake it.
    durable
        .operator()
        .send_signal(&id, "unrelated", json!(null))
        .await
        .expect("send");
    assert!(
        store
            .session(&id)
            .await
            .expect("row")
            .waiting_until
            .is_some()
    );

    let sent = durable
        .operator()
        .send_signal(&id, "approve", json!({ "ok": true }))
        .await
        .expect("send");
    assert_eq!(
        store.session(&id).await.expect("row").waiting_until,
        None,
        "the send ends the wait"
    );
    let lease = store
        .claim_expired(&claim)
        .await
        .expect("claim")
        .expect("the woken session is claimable at once");
    assert_eq!(lease.session, id);
    store.release_lease(&lease).await.expect("release");

    let rerun = durable
        .resume::<Message>(&id)
        .await
        .expect("resume")
        .session;
    let SignalWait::Received { session, signal } = rerun
        .wait_signal("approve", Duration::from_secs(3600))
        .await
        .expect("wait")
    else {
        panic!("the replayed wait reads the signal");
    };
    assert_eq!(
        (signal.id, signal.payload),
        (sent.id, json!({ "ok": true }))
    );

    // Already pending: read at once, the session kept.
    durable
        .operator()
        .send_signal(&id, "approve", json!(2))
        .await
        .expect("send");
    let SignalWait::Received { session, signal } = session
        .wait_signal("approve", Duration::from_secs(3600))
        .await
        .expect("wait")
    else {
        panic!("a pending signal is read at once");
    };
    assert_eq!(signal.payload, json!(2));
    assert_eq!(
        store.session(&id).await.expect("row").status,
        SessionStatus::Active
    );
    session.complete().await.expect("complete");
}

/// A wait's deadline is fixed when it first runs (journaled): past it, the replayed wait
/// times out, and that is recorded, so a later replay times out at the same place even
/// though a signal came since; the signal waits for the next read.
pub async fn signals_a_wait_times_out_at_its_journaled_deadline(store: Arc<dyn CheckpointStore>) {
    let durable = worker(&store, "waiter");
    let session = durable
        .start::<Message>(StartOptions::new())
        .await
        .expect("start");
    let id = session.id().clone();
    let before = store.now().await.expect("now");
    let SignalWait::Released = session
        .wait_signal("answer", Duration::from_millis(150))
        .await
        .expect("wait")
    else {
        panic!("nothing pending: released");
    };
    let until = store
        .session(&id)
        .await
        .expect("row")
        .waiting_until
        .expect("a deadline");
    assert!(
        until >= before + 150 && until <= before + 150 + 5_000,
        "the wait ends at its deadline: {until} vs {before}"
    );
    // Before the deadline, a replay waits again until the same moment.
    let early = durable
        .resume::<Message>(&id)
        .await
        .expect("resume")
        .session;
    let SignalWait::Released = early
        .wait_signal("answer", Duration::from_millis(150))
        .await
        .expect("wait")
    else {
        panic!("before the deadline the replay waits again");
    };
    assert_eq!(
        store.session(&id).await.expect("row").waiting_until,
        Some(until),
        "the replay keeps the journaled deadline"
    );
    while store.now().await.expect("now") < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let late = durable
        .resume::<Message>(&id)
        .await
        .expect("resume")
        .session;
    let SignalWait::TimedOut { session } = late
        .wait_signal("answer", Duration::from_millis(150))
        .await
        .expect("wait")
    else {
        panic!("past the deadline the wait times out");
    };
    drop(session);
    release_dead_lease(&store, &id).await;

    let sent = durable
        .operator()
        .send_signal(&id, "answer", json!("late"))
        .await
        .expect("send");
    let replay = durable
        .resume::<Message>(&id)
        .await
        .expect("resume")
        .session;
    let SignalWait::TimedOut { session } = replay
        .wait_signal("answer", Duration::from_millis(150))
        .await
        .expect("wait")
    else {
        panic!("a replay times out where the first run did");
    };
    let next = session.recv_signal("answer").await.expect("read");
    assert_eq!(
        next.map(|s| s.id),
        Some(sent.id),
        "the late signal is read next"
    );
    let bad = session.recv_signal("").await;
    assert!(
        matches!(bad, Err(DurableError::Store(StoreError::InvalidId { .. }))),
        "{bad:?}"
    );
}
