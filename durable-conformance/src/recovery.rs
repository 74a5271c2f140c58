//! Cases: listing and claiming expired sessions, the poison-pill counter (shared by
//! `claim_expired` and resuming by id).

use durable_core::store::Claim;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::{
    CLOCK_SLACK_MS, LONG_TTL, MAX_ATTEMPTS, checkpoint, create, create_with, expect_err, message,
    ms, new_session, now, owner, read,
};
use durable_core::error::{DurableError, StoreError};
use durable_core::ids::SessionId;
use durable_core::runtime::{Durable, StartOptions};
use durable_core::store::{CheckpointStore, Lease, SessionStatus};
use durable_core::transcript::Message;

/// Claims until `claim_expired` returns `None` (at most `bound` claims), returning the
/// leases of the claims.
async fn claim_all(
    store: &dyn CheckpointStore,
    claimer: &str,
    ttl: Duration,
    max_attempts: i32,
    bound: usize,
) -> Vec<Lease> {
    let mut leases = Vec::new();
    for _ in 0..bound {
        match store
            .claim_expired(&Claim::new(claimer, ttl, max_attempts))
            .await
            .unwrap_or_else(|e| panic!("claim_expired({claimer}) failed: {e:?}"))
        {
            Some(lease) => leases.push(lease),
            None => return leases,
        }
    }
    panic!("claim_expired still returned sessions after {bound} claims");
}

/// Marks `lease` running ([`CheckpointStore::mark_running`](durable_core::store::LeaseStore::mark_running)): its holder ran the session,
/// so a death from now on counts.
async fn ran(store: &dyn CheckpointStore, lease: &Lease) {
    store
        .mark_running(lease.fence())
        .await
        .unwrap_or_else(|e| panic!("mark_running({}): {e:?}", lease.session));
}

/// `list_expired` lists active sessions whose lease expired or was released, and no live,
/// terminal or parked session.
pub async fn recovery_list_expired_shows_only_active_expired(store: Arc<dyn CheckpointStore>) {
    let (live, _) = create(&*store, &owner("live")).await;
    let (expired, _) = create_with(&*store, new_session(&owner("dead"), Duration::ZERO)).await;
    let (released, released_lease) = create(&*store, &owner("released")).await;
    store
        .release_lease(&released_lease)
        .await
        .expect("release_lease");
    let (done, done_lease) = create(&*store, &owner("done")).await;
    store
        .set_status(done_lease.fence(), SessionStatus::Completed, None)
        .await
        .expect("set_status(completed)");
    let (parked, parked_lease) = create(&*store, &owner("parked")).await;
    store
        .set_status(parked_lease.fence(), SessionStatus::Parked, Some("poison"))
        .await
        .expect("set_status(parked)");

    let listed = store.list_expired(10_000).await.expect("list_expired");
    let t = now(&*store).await;
    for s in &listed {
        assert_eq!(
            s.status,
            SessionStatus::Active,
            "list_expired returned a {:?} session",
            s.status
        );
        assert!(
            s.lease_owner.is_none() || s.lease_expires_at.is_none_or(|e| e <= t),
            "list_expired returned session {} whose lease is live until {:?} (now {t})",
            s.id,
            s.lease_expires_at
        );
    }
    let has = |id: &SessionId| listed.iter().any(|s| &s.id == id);
    assert!(
        has(&expired.id),
        "list_expired must list the session whose lease expired"
    );
    assert!(
        has(&released.id),
        "list_expired must list the session whose lease was released"
    );
    assert!(
        !has(&live.id),
        "list_expired listed a session with a live lease"
    );
    assert!(!has(&done.id), "list_expired listed a completed session");
    assert!(!has(&parked.id), "list_expired listed a parked session");
    let one = store.list_expired(1).await.expect("list_expired(1)");
    assert_eq!(
        one.len(),
        1,
        "list_expired(1) with two expired sessions stored"
    );
}

/// Many concurrent claimers over several expired sessions: each session is claimed
/// exactly once, the claim bumps its fence and counts a recovery attempt.
pub async fn recovery_concurrent_claims_are_exclusive(store: Arc<dyn CheckpointStore>) {
    let mut expired = HashMap::new();
    for _ in 0..6 {
        let (s, lease) = create_with(&*store, new_session(&owner("crashed"), Duration::ZERO)).await;
        ran(&*store, &lease).await;
        expired.insert(s.id.clone(), lease);
    }
    let (live, live_lease) = create(&*store, &owner("alive")).await;
    // Terminal and parked sessions have released leases but are not recoverable.
    let mut finished = Vec::new();
    for status in [SessionStatus::Completed, SessionStatus::Parked] {
        let (s, lease) = create(&*store, &owner("finished")).await;
        store
            .set_status(lease.fence(), status, Some("finished"))
            .await
            .expect("set_status");
        finished.push(read(&*store, &s.id).await);
    }

    let mut tasks = Vec::new();
    for i in 0..8 {
        let store = Arc::clone(&store);
        tasks.push(tokio::spawn(async move {
            let claimer = owner(&format!("claimer{i}"));
            let before = now(&*store).await;
            let leases = claim_all(&*store, &claimer, LONG_TTL, 5, 1_000).await;
            (claimer, before, leases)
        }));
    }
    let mut claims: HashMap<SessionId, Vec<Lease>> = HashMap::new();
    for task in tasks {
        let (claimer, before, leases) = task.await.expect("claim task panicked");
        for lease in leases {
            assert_eq!(
                lease.owner, claimer,
                "claim_expired returned a lease of another owner"
            );
            assert!(
                lease.expires_at >= before + ms(LONG_TTL) - CLOCK_SLACK_MS,
                "claimed lease expires at {}, not now + ttl",
                lease.expires_at
            );
            claims.entry(lease.session.clone()).or_default().push(lease);
        }
    }
    for (id, original) in &expired {
        let got = claims.get(id).map(Vec::as_slice).unwrap_or_default();
        assert_eq!(
            got.len(),
            1,
            "expired session {id} must be claimed exactly once, got {got:?}"
        );
        let lease = &got[0];
        assert!(lease.fence > original.fence, "a claim must bump the fence");
        let record = read(&*store, id).await;
        assert_eq!(
            record.lease_owner.as_deref(),
            Some(lease.owner.as_str()),
            "claimed session owner"
        );
        assert_eq!(record.fence, lease.fence, "claimed session fence");
        assert_eq!(
            record.lease_expires_at,
            Some(lease.expires_at),
            "claimed session expiry"
        );
        assert_eq!(
            record.recovery_attempts, 1,
            "a claim must count one recovery attempt"
        );
        assert_eq!(
            record.status,
            SessionStatus::Active,
            "a claimed session stays active"
        );
        expect_err!(
            store
                .save_checkpoint(original.fence(), 0, checkpoint("crashed", vec![]))
                .await,
            StoreError::LeaseLost { .. },
            "the crashed worker writing after its session was claimed"
        );
    }
    assert!(
        !claims.contains_key(&live.id),
        "claim_expired claimed a session with a live lease"
    );
    assert_eq!(
        read(&*store, &live.id).await.fence,
        live_lease.fence,
        "live session fence changed"
    );
    for s in finished {
        assert!(
            !claims.contains_key(&s.id),
            "claim_expired claimed a {:?} session",
            s.status
        );
        assert_eq!(
            read(&*store, &s.id).await,
            s,
            "claim_expired changed a {:?} session",
            s.status
        );
    }
}

/// Each claim counts an attempt; the claim that would exceed `max_attempts` parks the
/// session (reason recorded) instead of returning it.
pub async fn recovery_attempts_count_up_then_park(store: Arc<dyn CheckpointStore>) {
    let (session, first) =
        create_with(&*store, new_session(&owner("poison"), Duration::ZERO)).await;
    ran(&*store, &first).await;
    let max_attempts = 3;
    let claimer = owner("recoverer");
    // A ttl of zero leaves each claimed lease expired at once, so the session comes back;
    // each claimer runs it (and dies).
    let mut leases = Vec::new();
    for _ in 0..1_000 {
        match store
            .claim_expired(&Claim::new(&claimer, Duration::ZERO, max_attempts))
            .await
            .expect("claim_expired")
        {
            Some(lease) => {
                ran(&*store, &lease).await;
                leases.push(lease);
            }
            None => break,
        }
    }
    let mine: Vec<&Lease> = leases.iter().filter(|l| l.session == session.id).collect();
    assert_eq!(
        mine.len(),
        3,
        "with max_attempts = 3 the session must be claimed 3 times, then parked: {mine:?}"
    );
    for pair in mine.windows(2) {
        assert!(
            pair[1].fence > pair[0].fence,
            "each claim must bump the fence"
        );
    }
    let record = read(&*store, &session.id).await;
    assert_eq!(
        record.status,
        SessionStatus::Parked,
        "the 4th claim must park the session"
    );
    assert!(
        record
            .status_reason
            .as_deref()
            .is_some_and(|r| !r.is_empty()),
        "a parked session must record why: {:?}",
        record.status_reason
    );
    let listed = store.list_expired(10_000).await.expect("list_expired");
    assert!(
        !listed.iter().any(|s| s.id == session.id),
        "list_expired lists a parked session"
    );
    expect_err!(
        store
            .acquire_lease(&session.id, &owner("op"), LONG_TTL, MAX_ATTEMPTS)
            .await,
        StoreError::NotResumable { .. },
        "acquire_lease on a parked session"
    );
}

/// Claims count up `recovery_attempts`; a checkpoint saved by the recovering worker
/// resets it to 0.
pub async fn recovery_checkpoint_resets_attempts(store: Arc<dyn CheckpointStore>) {
    let (session, first) = create_with(&*store, new_session(&owner("flaky"), Duration::ZERO)).await;
    ran(&*store, &first).await;
    let claimer = owner("recoverer");
    let mut claimed = 0;
    let mut last = None;
    // First claim with ttl 0 (the session expires again at once), then a long one.
    for ttl in [Duration::ZERO, LONG_TTL] {
        for _ in 0..1_000 {
            let lease = store
                .claim_expired(&Claim::new(&claimer, ttl, 10))
                .await
                .expect("claim_expired")
                .expect("claim_expired returned None with an expired session stored");
            if lease.session == session.id {
                ran(&*store, &lease).await;
                claimed += 1;
                assert_eq!(
                    read(&*store, &session.id).await.recovery_attempts,
                    claimed,
                    "recovery_attempts after {claimed} claims"
                );
                last = Some(lease);
                break;
            }
        }
    }
    assert_eq!(claimed, 2, "the expired session was not claimed twice");
    let lease = last.expect("claimed");
    store
        .save_checkpoint(lease.fence(), 0, checkpoint("progress", vec![message(2)]))
        .await
        .expect("save_checkpoint under the recovery lease");
    let record = read(&*store, &session.id).await;
    assert_eq!(
        record.recovery_attempts, 0,
        "save_checkpoint must reset recovery_attempts"
    );
    assert_eq!(record.latest_version, 1, "latest_version after the save");
}

/// Resuming by id counts recoveries as `claim_expired` does: each take-over of a lease
/// that expired without a release counts one; the one beyond `max_attempts` parks the
/// session (reason recorded, committed) and fails with the typed `Parked` error naming
/// the way out; an unparked session resumes again, not counted.
pub async fn recovery_resume_by_id_parks_a_poison_pill(store: Arc<dyn CheckpointStore>) {
    let max_attempts = 3;
    // A lease ttl of zero: every lease is expired the moment it is taken, as if each
    // worker died right after resuming.
    let worker = |name: &str| {
        Durable::builder(Arc::clone(&store))
            .owner(owner(name))
            .lease_ttl(Duration::ZERO)
            .renew_leases(false)
            .max_recovery_attempts(max_attempts)
            .build()
    };
    let first = worker("first")
        .start::<Message>(StartOptions::default())
        .await
        .expect("start");
    let id = first.id().clone();
    ran_current(&*store, &id).await;
    drop(first);
    for attempt in 1..=max_attempts {
        let resumed = worker(&format!("crash{attempt}"))
            .resume::<Message>(&id)
            .await
            .unwrap_or_else(|e| panic!("resume {attempt} of {max_attempts} failed: {e:?}"));
        // It runs the session, then dies.
        ran_current(&*store, &id).await;
        drop(resumed);
        assert_eq!(
            read(&*store, &id).await.recovery_attempts,
            attempt,
            "resume by id of a session whose lease expired must count a recovery"
        );
    }
    let err = worker("last")
        .resume::<Message>(&id)
        .await
        .err()
        .unwrap_or_else(|| {
            panic!(
                "resume {} of {max_attempts} must park the session",
                max_attempts + 1
            )
        });
    let text = err.to_string();
    match &err {
        DurableError::Store(StoreError::Parked { session, attempts }) => {
            assert_eq!(session, &id, "Parked names another session");
            assert_eq!(*attempts, max_attempts, "Parked attempts");
        }
        other => panic!("expected Parked, got {other:?}"),
    }
    assert!(
        text.contains(&format!("durable unpark {id}")) && text.contains("Operator::unpark"),
        "Parked must say how to unpark: {text:?}"
    );
    let record = read(&*store, &id).await;
    assert_eq!(record.status, SessionStatus::Parked, "parked by the resume");
    assert!(
        record
            .status_reason
            .as_deref()
            .is_some_and(|r| r.contains("recovery attempts exhausted")),
        "the parked reason is recorded as for claim_expired: {:?}",
        record.status_reason
    );
    assert_eq!(record.lease_owner, None, "a parked session holds no lease");
    let again = worker("again").resume::<Message>(&id).await.err();
    assert!(
        matches!(
            again,
            Some(DurableError::Store(StoreError::NotResumable { .. }))
        ),
        "a parked session is not resumable: {again:?}"
    );

    let operator = worker("operator");
    let unparked = operator.operator().unpark(&id).await.expect("unpark");
    assert_eq!(unparked.recovery_attempts, 0, "unpark clears the counter");
    operator
        .resume::<Message>(&id)
        .await
        .expect("an unparked session resumes");
    assert_eq!(
        read(&*store, &id).await.recovery_attempts,
        0,
        "the first resume after an unpark is not a recovery"
    );
}

/// Marks the current lease of `id` running, as its holder's first call would (the
/// runtime's marking is tested with real processes in the facade's `tests/workers`).
async fn ran_current(store: &dyn CheckpointStore, id: &SessionId) {
    let token = read(store, id).await.fence;
    store
        .mark_running(durable_core::store::Fence { session: id, token })
        .await
        .unwrap_or_else(|e| panic!("mark_running({id}): {e:?}"));
}

/// A worker that dies holding a session it never ran (no model or tool call under its
/// lease: an idle lease, its worker killed while it was elsewhere) is not counted against
/// the session, by `acquire_lease` or `claim_expired`, however often; once the holder
/// marks the lease running (`mark_running`), its death counts.
pub async fn recovery_idle_lease_is_not_counted(store: Arc<dyn CheckpointStore>) {
    let w = owner("restarted");
    let (session, mut lease) = create(&*store, &w).await;
    for round in 0..4 {
        // Restarted under the same owner: takes its own unreleased lease back at once.
        lease = store
            .acquire_lease(&session.id, &w, LONG_TTL, 2)
            .await
            .unwrap_or_else(|e| panic!("round {round}: an idle lease's death parked: {e:?}"));
        assert_eq!(
            read(&*store, &session.id).await.recovery_attempts,
            0,
            "round {round}: the take-over of an idle lease counted a recovery"
        );
    }
    // Expired and claimed: still not counted.
    let dying = store
        .renew_lease(&lease, Duration::ZERO)
        .await
        .expect("renew to an expired lease");
    let claimer = owner("claimer");
    let claimed = claim_all(&*store, &claimer, LONG_TTL, 2, 1_000).await;
    let ours = claimed
        .iter()
        .find(|l| l.session == session.id)
        .expect("the expired idle lease is claimed");
    assert!(ours.fence > dying.fence, "fence bumped");
    assert_eq!(
        read(&*store, &session.id).await.recovery_attempts,
        0,
        "claim_expired of an expired idle lease counted a recovery"
    );
    // Now the claimer runs it (marking twice is harmless), and dies: counted.
    let holder = ours;
    ran(&*store, holder).await;
    ran(&*store, holder).await;
    store
        .acquire_lease(&session.id, &claimer, LONG_TTL, 2)
        .await
        .expect("acquire after a death while running");
    assert_eq!(
        read(&*store, &session.id).await.recovery_attempts,
        1,
        "the take-over of a lease marked running counts a recovery"
    );
    // `mark_running` is fenced: a stale token is refused.
    expect_err!(
        store.mark_running(holder.fence()).await,
        StoreError::LeaseLost { .. },
        "mark_running with a replaced token"
    );
}

/// A lease given up with `release_lease` is not a recovery for whoever takes it next,
/// by `acquire_lease` or `claim_expired`, however often; a release does not reset the
/// counter either, and a checkpoint does.
pub async fn recovery_released_lease_is_not_counted(store: Arc<dyn CheckpointStore>) {
    let (session, mut lease) = create(&*store, &owner("clean")).await;
    for round in 0..3 {
        store.release_lease(&lease).await.expect("release_lease");
        lease = store
            .acquire_lease(&session.id, &owner(&format!("next{round}")), LONG_TTL, 1)
            .await
            .unwrap_or_else(|e| panic!("acquire after a clean release (round {round}): {e:?}"));
        assert_eq!(
            read(&*store, &session.id).await.recovery_attempts,
            0,
            "acquire_lease after a clean release counted a recovery"
        );
    }
    store.release_lease(&lease).await.expect("release_lease");
    // Another released session may be claimed first; claim until ours comes up.
    let claimer = owner("claimer");
    let claimed = claim_all(&*store, &claimer, LONG_TTL, 1, 1_000);
    let claimed = claimed.await;
    let ours = claimed
        .iter()
        .find(|l| l.session == session.id)
        .expect("claim_expired must claim a released session");
    assert_eq!(
        read(&*store, &session.id).await.recovery_attempts,
        0,
        "claim_expired of a released session counted a recovery"
    );

    // Now the holder runs the session and dies (its lease expires unreleased): that
    // take-over counts.
    ran(&*store, ours).await;
    let dying = store
        .renew_lease(ours, Duration::ZERO)
        .await
        .expect("renew to an expired lease");
    let recovered = store
        .acquire_lease(&session.id, &owner("recoverer"), LONG_TTL, 1)
        .await
        .expect("acquire after an expiry");
    assert!(recovered.fence > dying.fence, "fence bumped");
    assert_eq!(
        read(&*store, &session.id).await.recovery_attempts,
        1,
        "acquire_lease of an expired, unreleased lease counts a recovery"
    );
    store
        .release_lease(&recovered)
        .await
        .expect("release_lease");
    assert_eq!(
        read(&*store, &session.id).await.recovery_attempts,
        1,
        "release_lease must not reset the counter"
    );
    let after = store
        .acquire_lease(&session.id, &owner("after"), LONG_TTL, 1)
        .await
        .expect("a released session at the bound is acquired, not parked");
    store
        .save_checkpoint(after.fence(), 0, checkpoint("progress", vec![message(2)]))
        .await
        .expect("save_checkpoint");
    assert_eq!(
        read(&*store, &session.id).await.recovery_attempts,
        0,
        "save_checkpoint resets the counter"
    );
}
