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
use durable_core::error::StoreError;
use durable_core::ids::SessionId;
use durable_core::store::{CheckpointStore, Claim, Lease, NewSession, SessionStatus};

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
    store
        .mark_running(lease.fence())
        .await
        .expect("mark_running");
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

/// A seeded generator (SplitMix64): programs that are the same on every run and backend.
struct Seeded(u64);

impl Seeded {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// A session as the model sees it.
struct Modelled {
    id: SessionId,
    queue: usize,
    app_version: usize,
    active: bool,
    lease: Option<Lease>,
    /// Its wake-up time has passed (or it has none).
    awake: bool,
    /// Its latest checkpoint version.
    version: i64,
}

/// Random programs of submits (some delayed), releases, sleeps (due or not), wake-ups,
/// completions, limit changes and claims with random queue and app-version filters, each
/// claim checked against a model of the contract: the oldest session that is active,
/// unleased, awake, of the claim's version and queues, in a queue below its limit (or
/// none when there is no such session); and `queues()` checked against the model's
/// counts. Times are an hour away or an hour past, so nothing depends on the clock.
pub async fn worker_claims_match_a_model(store: Arc<dyn CheckpointStore>) {
    const VERSIONS: [&str; 2] = ["v1", "v2"];
    const HOUR: i64 = 3_600_000;
    for seed in 0..16_u64 {
        let mut rng = Seeded(seed);
        let tag = owner(&format!("model-{seed}"));
        let queues = [format!("{tag}-a"), format!("{tag}-b")];
        let mut limits: [Option<u32>; 2] = [None, None];
        let mut sessions: Vec<Modelled> = Vec::new();
        let mut trace: Vec<String> = Vec::new();
        for _ in 0..40 {
            let held: Vec<usize> = (0..sessions.len())
                .filter(|&i| sessions[i].active && sessions[i].lease.is_some())
                .collect();
            match rng.below(10) {
                0..=2 => {
                    // Submit, perhaps delayed (due already, or in an hour).
                    let (queue, app_version) = (rng.below(2), rng.below(2));
                    // Ids in creation order, so that ties of the creation time (same
                    // millisecond) break the same way on every backend.
                    let id = SessionId::new(format!("{tag}-{:03}", sessions.len()));
                    let mut new = in_queue(&queues[queue], &owner("submit"), LONG_TTL);
                    new.id = id.clone();
                    new.app_version = VERSIONS[app_version].to_owned();
                    let awake = match rng.below(4) {
                        0 => {
                            new.initial.wake_at = Some(now(&*store).await + HOUR);
                            false
                        }
                        1 => {
                            new.initial.wake_at = Some(now(&*store).await - HOUR);
                            true
                        }
                        _ => true,
                    };
                    let (_, lease) = create_with(&*store, new).await;
                    let keep = rng.below(4) == 0;
                    if !keep {
                        store.release_lease(&lease).await.expect("release_lease");
                    }
                    trace.push(format!(
                        "submit {id} q{queue} {app_version} awake={awake} held={keep}"
                    ));
                    sessions.push(Modelled {
                        id,
                        queue,
                        app_version,
                        active: true,
                        lease: keep.then_some(lease),
                        awake,
                        version: 0,
                    });
                }
                3 if !held.is_empty() => {
                    let s = &mut sessions[held[rng.below(held.len())]];
                    let lease = s.lease.take().expect("held");
                    match rng.below(3) {
                        0 => {
                            store.release_lease(&lease).await.expect("release_lease");
                            trace.push(format!("release {}", s.id));
                        }
                        1 => {
                            // Asleep for an hour, or "until" an hour ago.
                            let due = rng.below(2) == 0;
                            let at = now(&*store).await + if due { -HOUR } else { HOUR };
                            let mut next = checkpoint("model", Vec::new());
                            next.wake_at = Some(at);
                            store
                                .save_checkpoint(lease.fence(), s.version, next)
                                .await
                                .expect("a checkpoint with a wake-up time");
                            s.version += 1;
                            store.release_lease(&lease).await.expect("release_lease");
                            s.awake = due;
                            trace.push(format!("sleep {} due={due}", s.id));
                        }
                        _ => {
                            store
                                .set_status(lease.fence(), SessionStatus::Completed, None)
                                .await
                                .expect("complete");
                            s.active = false;
                            trace.push(format!("complete {}", s.id));
                        }
                    }
                }
                4 => {
                    let queue = rng.below(2);
                    let limit = [None, Some(0), Some(1), Some(2)][rng.below(4)];
                    store
                        .set_queue_limit(&queues[queue], limit)
                        .await
                        .expect("set_queue_limit");
                    limits[queue] = limit;
                    trace.push(format!("limit q{queue} {limit:?}"));
                }
                5 if !sessions.is_empty() => {
                    let pick = rng.below(sessions.len());
                    let s = &mut sessions[pick];
                    let woken = store.wake_session(&s.id).await;
                    if s.active {
                        woken.expect("wake_session");
                        s.awake = true;
                    } else {
                        assert!(
                            matches!(woken, Err(StoreError::NotResumable { .. })),
                            "wake_session of an ended session: {woken:?}"
                        );
                    }
                    trace.push(format!("wake {}", s.id));
                }
                _ => {
                    let filter: Vec<usize> = match rng.below(3) {
                        0 => vec![0],
                        1 => vec![1],
                        _ => vec![0, 1],
                    };
                    let version = [None, Some(0), Some(1)][rng.below(3)];
                    let mut claim = Claim::new(owner("claimer"), LONG_TTL, MAX_ATTEMPTS)
                        .with_queues(filter.iter().map(|&q| queues[q].clone()));
                    if let Some(v) = version {
                        claim = claim.with_app_version(VERSIONS[v]);
                    }
                    let running = |q: usize, sessions: &[Modelled]| {
                        sessions
                            .iter()
                            .filter(|s| s.active && s.queue == q && s.lease.is_some())
                            .count()
                    };
                    let expected = (0..sessions.len()).find(|&i| {
                        let s = &sessions[i];
                        s.active
                            && s.lease.is_none()
                            && s.awake
                            && filter.contains(&s.queue)
                            && version.is_none_or(|v| v == s.app_version)
                            && limits[s.queue]
                                .is_none_or(|l| running(s.queue, &sessions) < l as usize)
                    });
                    let got = store.claim_expired(&claim).await.expect("claim_expired");
                    trace.push(format!(
                        "claim {filter:?} {version:?} -> {:?}",
                        got.as_ref().map(|l| l.session.as_str())
                    ));
                    assert_eq!(
                        got.as_ref().map(|l| &l.session),
                        expected.map(|i| &sessions[i].id),
                        "seed {seed}: the claim took another session than the contract \
                         says\n{}",
                        trace.join("\n")
                    );
                    if let (Some(lease), Some(i)) = (got, expected) {
                        sessions[i].lease = Some(lease);
                    }
                }
            }
        }
        // The operators' figures agree with the model.
        let listed = store.queues().await.expect("queues");
        for (q, name) in queues.iter().enumerate() {
            let of = |f: &dyn Fn(&Modelled) -> bool| {
                sessions.iter().filter(|s| s.queue == q && f(s)).count() as i64
            };
            let running = of(&|s| s.active && s.lease.is_some());
            let ready = of(&|s| s.active && s.lease.is_none() && s.awake);
            let sleeping = of(&|s| s.active && s.lease.is_none() && !s.awake);
            match listed.iter().find(|info| &info.name == name) {
                Some(info) => assert_eq!(
                    (info.running, info.ready, info.sleeping, info.max_running),
                    (running, ready, sleeping, limits[q]),
                    "seed {seed}: queue {name}\n{}",
                    trace.join("\n")
                ),
                None => assert_eq!(
                    (running + ready + sleeping, limits[q]),
                    (0, None),
                    "seed {seed}: queue {name} not listed\n{}",
                    trace.join("\n")
                ),
            }
        }
    }
}

/// A lease that expired in a limited queue is not renewed (`LeaseLost`): a claim may
/// have counted its place free meanwhile and taken another session of the queue, and
/// the renewal would make the queue exceed its limit. Outside a limited queue, renewing
/// a lease nobody took over still works.
pub async fn worker_an_expired_lease_in_a_limited_queue_is_not_renewed(
    store: Arc<dyn CheckpointStore>,
) {
    let queue = owner("renew-limited");
    store
        .set_queue_limit(&queue, Some(1))
        .await
        .expect("set_queue_limit");
    let ttl = Duration::from_millis(100);
    let waiting = submitted(&*store, &queue, 1).await;
    let (stalled, lease) = create_with(&*store, in_queue(&queue, &owner("w1"), ttl)).await;
    wait_past(&*store, lease.expires_at).await;
    let taken = store
        .claim_expired(&claim(&queue, "w2"))
        .await
        .expect("claim")
        .expect("the stalled session's place is free");
    assert_eq!(
        taken.session, waiting[0],
        "the older session waiting for the place"
    );
    assert_ne!(taken.session, stalled.id);
    expect_err!(
        store.renew_lease(&lease, LONG_TTL).await,
        StoreError::LeaseLost { .. } => (),
        "renewing an expired lease in a queue at its limit"
    );
    let queues = store.queues().await.expect("queues");
    let info = queues.iter().find(|q| q.name == queue).expect("the queue");
    assert_eq!(info.running, 1, "{info:?}");

    let free = owner("renew-free");
    let (_, lease) = create_with(&*store, in_queue(&free, &owner("w3"), ttl)).await;
    wait_past(&*store, lease.expires_at).await;
    store
        .renew_lease(&lease, LONG_TTL)
        .await
        .expect("an expired lease nobody took, outside a limited queue, is renewed");
}
