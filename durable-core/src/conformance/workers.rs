//! Cases: what worker pools rely on. Sleeping sessions are claimed once due and never
//! before, a crash after going to sleep keeps the wake-up, an operator wakes one early;
//! claims keep to their app version and queues; a queue's fleet-wide limit bounds the
//! claims, concurrent ones included; the figures operators read.
//!
//! Every case puts its sessions in a queue of its own and claims from that queue only,
//! so that it takes nothing of another case's.

use std::sync::Arc;
use std::time::Duration;

use super::{
    LONG_TTL, MAX_ATTEMPTS, checkpoint, create_with, expect_err, new_session, now, owner, read,
    wait_past,
};
use crate::error::StoreError;
use crate::ids::SessionId;
use crate::store::{CheckpointStore, Claim, Lease, NewSession, SessionStatus};

/// A session of `queue`, leased to `owner` for `ttl`.
fn in_queue(queue: &str, owner: &str, ttl: Duration) -> NewSession {
    let mut new = new_session(owner, ttl);
    new.queue = Some(queue.to_owned());
    new
}

/// A claim of `queue` only.
fn claim(queue: &str, claimer: &str) -> Claim {
    Claim::new(claimer, LONG_TTL, MAX_ATTEMPTS).with_queues([queue])
}

/// Creates `count` sessions in `queue` and releases them: submitted work.
async fn submitted(store: &dyn CheckpointStore, queue: &str, count: usize) -> Vec<SessionId> {
    let mut ids = Vec::new();
    for _ in 0..count {
        let (record, lease) = create_with(store, in_queue(queue, &owner("submit"), LONG_TTL)).await;
        store.release_lease(&lease).await.expect("release_lease");
        ids.push(record.id);
    }
    ids
}

/// Writes checkpoint 1 of the session `lease` holds, asleep until `wake_at`.
async fn sleep_until(store: &dyn CheckpointStore, lease: &Lease, wake_at: Option<i64>) {
    let mut next = checkpoint("asleep", Vec::new());
    next.wake_at = wake_at;
    store
        .save_checkpoint(lease.fence(), 0, next)
        .await
        .expect("save_checkpoint with a wake-up time");
}

/// A session asleep is not claimed, listed or counted ready before its wake-up time; it
/// is claimed once that time has passed (not as a recovery), still showing the time it
/// woke from, which its next checkpoint clears.
pub async fn worker_sleeping_session_is_claimed_once_due(store: Arc<dyn CheckpointStore>) {
    let queue = owner("sleepers");
    let (record, lease) = create_with(&*store, in_queue(&queue, &owner("w"), LONG_TTL)).await;
    assert_eq!(record.queue, queue, "the session's queue reads back");
    assert_eq!(record.wake_at, None);
    let wake_at = now(&*store).await + 700;
    sleep_until(&*store, &lease, Some(wake_at)).await;
    store.release_lease(&lease).await.expect("release_lease");
    let asleep = read(&*store, &record.id).await;
    assert_eq!(
        asleep.wake_at,
        Some(wake_at),
        "the checkpoint wrote the wake-up time"
    );

    assert_eq!(
        store
            .claim_expired(&claim(&queue, "early"))
            .await
            .expect("claim"),
        None,
        "a session asleep was claimed before its wake-up time"
    );
    let listed = store.list_expired(1_000).await.expect("list_expired");
    assert!(
        listed.iter().all(|s| s.id != record.id),
        "list_expired listed a session asleep"
    );
    let next = store.next_wake_at().await.expect("next_wake_at");
    assert!(
        next.is_some_and(|at| at <= wake_at),
        "next_wake_at {next:?} does not announce the wake-up at {wake_at}"
    );
    let queues = store.queues().await.expect("queues");
    let info = queues
        .iter()
        .find(|q| q.name == queue)
        .unwrap_or_else(|| panic!("queue {queue} not listed: {queues:?}"));
    assert_eq!(
        (info.sleeping, info.ready, info.running),
        (1, 0, 0),
        "{info:?}"
    );
    assert_eq!(info.next_wake_at, Some(wake_at));

    wait_past(&*store, wake_at).await;
    let taken = store
        .claim_expired(&claim(&queue, "due"))
        .await
        .expect("claim")
        .expect("the session is due");
    assert_eq!(taken.session, record.id);
    let woken = read(&*store, &record.id).await;
    assert_eq!(woken.recovery_attempts, 0, "a wake-up is not a recovery");
    assert_eq!(
        woken.wake_at,
        Some(wake_at),
        "the woken session reads its wake-up time"
    );
    assert!(
        woken.lease_renewed_at.is_some_and(|t| t >= wake_at),
        "lease_renewed_at {:?} is not the claim's time",
        woken.lease_renewed_at
    );
    store
        .save_checkpoint(taken.fence(), 1, checkpoint("awake", Vec::new()))
        .await
        .expect("the next checkpoint");
    assert_eq!(
        read(&*store, &record.id).await.wake_at,
        None,
        "the next checkpoint clears the wake-up time"
    );
}

/// A worker that dies after its session went to sleep (the checkpoint committed, the
/// lease never given up): the session is not taken when the lease expires, only once the
/// wake-up time has passed, and then as a recovery.
pub async fn worker_crash_after_sleeping_keeps_the_wake_up(store: Arc<dyn CheckpointStore>) {
    let queue = owner("crashed-sleepers");
    let ttl = Duration::from_millis(150);
    let (record, lease) = create_with(&*store, in_queue(&queue, &owner("dies"), ttl)).await;
    let wake_at = now(&*store).await + 900;
    sleep_until(&*store, &lease, Some(wake_at)).await;
    wait_past(&*store, lease.expires_at).await;
    assert_eq!(
        store
            .claim_expired(&claim(&queue, "early"))
            .await
            .expect("claim"),
        None,
        "the lease expired, but the session sleeps until {wake_at}"
    );
    wait_past(&*store, wake_at).await;
    let taken = store
        .claim_expired(&claim(&queue, "late"))
        .await
        .expect("claim")
        .expect("due and its lease expired");
    assert_eq!(taken.session, record.id);
    assert_eq!(
        read(&*store, &record.id).await.recovery_attempts,
        1,
        "taking over a lease never given up is a recovery"
    );
}

/// `wake_session` ends a sleep now; a session that is not asleep comes back unchanged;
/// a session that is not active is refused, a missing one not found. Sessions started
/// with a wake-up time (`not_before`) wait for it like sleepers.
pub async fn worker_wake_session_ends_a_sleep_early(store: Arc<dyn CheckpointStore>) {
    let queue = owner("woken");
    let (record, lease) = create_with(&*store, in_queue(&queue, &owner("w"), LONG_TTL)).await;
    let far = now(&*store).await + 3_600_000;
    sleep_until(&*store, &lease, Some(far)).await;
    store.release_lease(&lease).await.expect("release_lease");
    assert_eq!(
        store
            .claim_expired(&claim(&queue, "c"))
            .await
            .expect("claim"),
        None
    );
    let woken = store.wake_session(&record.id).await.expect("wake_session");
    let at = woken.wake_at.expect("the wake-up time stays set");
    assert!(at < far && at <= now(&*store).await, "woken at {at}");
    let again = store
        .wake_session(&record.id)
        .await
        .expect("wake_session again");
    assert_eq!(again.wake_at, Some(at), "a session awake is left as it is");
    let taken = store
        .claim_expired(&claim(&queue, "c"))
        .await
        .expect("claim")
        .expect("the woken session");
    assert_eq!(taken.session, record.id);
    store
        .set_status(taken.fence(), SessionStatus::Completed, None)
        .await
        .expect("complete");
    expect_err!(
        store.wake_session(&record.id).await,
        StoreError::NotResumable { .. } => (),
        "wake_session on a completed session"
    );
    expect_err!(
        store.wake_session(&SessionId::new(owner("missing"))).await,
        StoreError::SessionNotFound(_) => (),
        "wake_session on a missing session"
    );

    // Submitted with a start time: asleep from its creation.
    let mut later = in_queue(&queue, &owner("w"), LONG_TTL);
    later.initial.wake_at = Some(now(&*store).await + 3_600_000);
    let (delayed, lease) = create_with(&*store, later).await;
    store.release_lease(&lease).await.expect("release_lease");
    assert_eq!(
        store
            .claim_expired(&claim(&queue, "c"))
            .await
            .expect("claim"),
        None,
        "a session created with a wake-up time was claimed before it"
    );
    store.wake_session(&delayed.id).await.expect("wake_session");
    assert!(
        store
            .claim_expired(&claim(&queue, "c"))
            .await
            .expect("claim")
            .is_some(),
        "the delayed session, woken"
    );
}

/// A claim takes sessions of its app version only, and of its queues only; a claim
/// with neither takes any.
pub async fn worker_claims_keep_to_their_app_version_and_queues(store: Arc<dyn CheckpointStore>) {
    let (a, b) = (owner("queue-a"), owner("queue-b"));
    let mut other_version = in_queue(&a, &owner("w"), LONG_TTL);
    other_version.app_version = "v2".to_owned();
    let (v2, lease) = create_with(&*store, other_version).await;
    store.release_lease(&lease).await.expect("release_lease");
    let in_b = submitted(&*store, &b, 1).await;

    let v1_of_a = claim(&a, "c").with_app_version("v1");
    assert_eq!(
        store.claim_expired(&v1_of_a).await.expect("claim"),
        None,
        "a claim for v1 took a session of v2"
    );
    let v2_of_a = claim(&a, "c").with_app_version("v2");
    let taken = store
        .claim_expired(&v2_of_a)
        .await
        .expect("claim")
        .expect("v2's session");
    assert_eq!(taken.session, v2.id);
    assert_eq!(
        store.claim_expired(&claim(&a, "c")).await.expect("claim"),
        None,
        "queue a is empty now; b's session is not a's"
    );
    let both = Claim::new("c", LONG_TTL, MAX_ATTEMPTS).with_queues([a.clone(), b.clone()]);
    let taken = store
        .claim_expired(&both)
        .await
        .expect("claim")
        .expect("b's session");
    assert_eq!(taken.session, in_b[0]);
    expect_err!(
        store.claim_expired(&claim("bad\0queue", "c")).await,
        StoreError::InvalidId { what: "queue", .. } => (),
        "a queue name with NUL"
    );
}

/// A queue's limit bounds the claims: with `max_running` sessions leased, a claim of the
/// queue gets nothing; a lease given up makes a place; removing the limit frees the
/// rest; a limit of 0 stops the queue. `queues` reports the limit and the counts.
pub async fn worker_queue_limit_bounds_claims(store: Arc<dyn CheckpointStore>) {
    let queue = owner("limited");
    submitted(&*store, &queue, 4).await;
    store
        .set_queue_limit(&queue, Some(2))
        .await
        .expect("set_queue_limit");
    let first = store
        .claim_expired(&claim(&queue, "c1"))
        .await
        .expect("claim")
        .expect("1 of 2");
    let _second = store
        .claim_expired(&claim(&queue, "c2"))
        .await
        .expect("claim")
        .expect("2 of 2");
    assert_eq!(
        store
            .claim_expired(&claim(&queue, "c3"))
            .await
            .expect("claim"),
        None,
        "a third session of a queue limited to 2"
    );
    let queues = store.queues().await.expect("queues");
    let info = queues.iter().find(|q| q.name == queue).expect("the queue");
    assert_eq!(info.max_running, Some(2));
    assert_eq!((info.running, info.ready), (2, 2), "{info:?}");

    store.release_lease(&first).await.expect("release");
    let third = store
        .claim_expired(&claim(&queue, "c3"))
        .await
        .expect("claim");
    assert!(third.is_some(), "a released lease makes a place");
    assert_eq!(
        store
            .claim_expired(&claim(&queue, "c4"))
            .await
            .expect("claim"),
        None
    );
    store
        .set_queue_limit(&queue, None)
        .await
        .expect("remove the limit");
    assert!(
        store
            .claim_expired(&claim(&queue, "c4"))
            .await
            .expect("claim")
            .is_some(),
        "without its limit the queue gives its last session"
    );
    let queues = store.queues().await.expect("queues");
    let info = queues.iter().find(|q| q.name == queue).expect("the queue");
    assert_eq!(info.max_running, None);

    let stopped = owner("stopped");
    submitted(&*store, &stopped, 1).await;
    store
        .set_queue_limit(&stopped, Some(0))
        .await
        .expect("limit 0");
    assert_eq!(
        store
            .claim_expired(&claim(&stopped, "c"))
            .await
            .expect("claim"),
        None,
        "a queue limited to 0 gives nothing"
    );
    expect_err!(
        store.set_queue_limit("", Some(1)).await,
        StoreError::InvalidId { what: "queue", .. } => (),
        "an empty queue name"
    );
}

/// Claims made at the same moment by many workers never take more of a limited queue
/// than its limit.
pub async fn worker_concurrent_claims_respect_the_queue_limit(store: Arc<dyn CheckpointStore>) {
    const LIMIT: u32 = 3;
    const SESSIONS: usize = 10;
    for round in 0..3 {
        let queue = owner(&format!("contended-{round}"));
        submitted(&*store, &queue, SESSIONS).await;
        store
            .set_queue_limit(&queue, Some(LIMIT))
            .await
            .expect("set_queue_limit");
        let claims = (0..SESSIONS).map(|n| {
            let store = Arc::clone(&store);
            let claim = claim(&queue, &format!("claimer-{n}"));
            tokio::spawn(async move { store.claim_expired(&claim).await })
        });
        let mut granted = 0_u32;
        for handle in futures_join(claims.collect()).await {
            if handle
                .expect("a claimer task")
                .expect("claim_expired")
                .is_some()
            {
                granted += 1;
            }
        }
        assert_eq!(
            granted, LIMIT,
            "round {round}: {SESSIONS} concurrent claims of a queue limited to {LIMIT}"
        );
    }
}

/// Awaits every handle, in order.
async fn futures_join<T>(
    handles: Vec<tokio::task::JoinHandle<T>>,
) -> Vec<Result<T, tokio::task::JoinError>> {
    let mut out = Vec::with_capacity(handles.len());
    for handle in handles {
        out.push(handle.await);
    }
    out
}

/// A lease records when it was taken, and each renewal moves that time on.
pub async fn worker_lease_renewed_at_tracks_take_and_renew(store: Arc<dyn CheckpointStore>) {
    let queue = owner("renewed");
    let before = now(&*store).await;
    let (record, lease) = create_with(&*store, in_queue(&queue, &owner("w"), LONG_TTL)).await;
    let taken = record
        .lease_renewed_at
        .expect("set when the session was created");
    assert!(taken >= before, "{taken} < {before}");
    wait_past(&*store, taken).await;
    store
        .renew_lease(&lease, LONG_TTL)
        .await
        .expect("renew_lease");
    let renewed = read(&*store, &record.id)
        .await
        .lease_renewed_at
        .expect("renewed");
    assert!(renewed > taken, "a renewal at {renewed} after {taken}");
}
