//! Cases: leases and fencing tokens.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use super::{
    CLOCK_SLACK_MS, LONG_TTL, MAX_ATTEMPTS, checkpoint, completed, create, create_with, expect_err,
    message, ms, new_session, now, owner, read, tool_call, wait_past,
};
use durable_core::error::StoreError;
use durable_core::store::{CheckpointStore, IssueOutcome, SessionStatus};

/// While one owner's lease is live, another owner is refused with `Leased` naming the
/// holder and its expiry.
pub async fn lease_second_owner_is_refused(store: Arc<dyn CheckpointStore>) {
    let holder = owner("holder");
    let (session, lease) = create(&*store, &holder).await;
    let (who, expires_at) = expect_err!(
        store.acquire_lease(&session.id, &owner("intruder"), LONG_TTL, MAX_ATTEMPTS).await,
        StoreError::Leased { session: s, owner, expires_at, .. } => {
            assert_eq!(s, session.id, "Leased names another session");
            (owner, expires_at)
        },
        "acquire_lease by a second owner while the first lease is live"
    );
    assert_eq!(who, holder, "Leased must name the current holder");
    assert_eq!(
        expires_at, lease.expires_at,
        "Leased must carry the holder's expiry"
    );
    assert_eq!(
        read(&*store, &session.id).await,
        session,
        "a refused acquire changed the session"
    );
}

/// `Leased` carries the time left on the store's clock, and its text gives the expiry in
/// RFC 3339 (UTC, ms) and the whole seconds left; it suggests a stable owner name, which
/// must be true advice: the holder itself re-acquires at once.
pub async fn lease_refusal_text_gives_expiry_and_time_left(store: Arc<dyn CheckpointStore>) {
    let holder = owner("holder");
    let (session, lease) = create(&*store, &holder).await;
    let before = now(&*store).await;
    let err = store
        .acquire_lease(&session.id, &owner("intruder"), LONG_TTL, MAX_ATTEMPTS)
        .await
        .expect_err("acquire_lease by a second owner while the first lease is live");
    let after = now(&*store).await;
    let remaining_ms = match &err {
        StoreError::Leased {
            expires_at,
            remaining_ms,
            ..
        } => {
            assert_eq!(*expires_at, lease.expires_at, "Leased expiry");
            *remaining_ms
        }
        other => panic!("expected Leased, got {other:?}"),
    };
    assert!(
        (lease.expires_at - after..=lease.expires_at - before).contains(&remaining_ms),
        "remaining_ms {remaining_ms} is not the expiry {} minus the store's clock ({before}..{after})",
        lease.expires_at
    );
    let text = err.to_string();
    let (stamp, rest) = text
        .split_once(" until ")
        .and_then(|(_, rest)| rest.split_once(" ("))
        .unwrap_or_else(|| panic!("no `until <time> (` in {text:?}"));
    let parsed = humantime::parse_rfc3339(stamp)
        .unwrap_or_else(|e| panic!("`{stamp}` is not RFC 3339 ({e}): {text:?}"));
    assert!(
        stamp.ends_with('Z') && stamp.len() == "2026-11-23T12:00:05.123Z".len(),
        "expiry must be UTC to the millisecond: `{stamp}`"
    );
    let parsed_ms = parsed
        .duration_since(std::time::UNIX_EPOCH)
        .expect("expiry after 1970")
        .as_millis();
    assert_eq!(
        i64::try_from(parsed_ms).expect("ms"),
        lease.expires_at,
        "the printed expiry must be the lease's: {text:?}"
    );
    let seconds: i64 = rest
        .split_once(" s left)")
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or_else(|| panic!("no `(<n> s left)` in {text:?}"));
    assert_eq!(
        seconds,
        (remaining_ms + 999) / 1000,
        "seconds left, rounded up: {text:?}"
    );
    assert!(
        text.contains(&format!("`{holder}`")) && text.contains(".owner("),
        "Leased must name the holder and suggest a stable owner: {text:?}"
    );
    store
        .acquire_lease(&session.id, &holder, LONG_TTL, MAX_ATTEMPTS)
        .await
        .expect("the holder re-acquiring at once, as the message promises");
}

/// The same owner re-acquiring its live lease (a worker restarted under a stable name) is
/// not refused: it gets a new, larger token at once, the old token is stale, and the
/// take-over of an unreleased lease counts as a recovery.
pub async fn lease_same_owner_reacquire_bumps_fence(store: Arc<dyn CheckpointStore>) {
    let w = owner("worker");
    let (session, first) = create(&*store, &w).await;
    // The first holder ran the session (then died): its take-over is a recovery.
    store
        .mark_running(first.fence())
        .await
        .expect("mark_running");
    let second = store
        .acquire_lease(&session.id, &w, LONG_TTL, MAX_ATTEMPTS)
        .await
        .expect("the same owner re-acquiring its live lease");
    assert!(
        second.fence > first.fence,
        "re-acquire must bump the fence: {} then {}",
        first.fence,
        second.fence
    );
    assert_eq!(second.owner, w, "re-acquired lease owner");
    let record = read(&*store, &session.id).await;
    assert_eq!(record.fence, second.fence, "session fence");
    assert_eq!(
        record.lease_expires_at,
        Some(second.expires_at),
        "session lease_expires_at after the re-acquire"
    );
    assert_eq!(
        record.recovery_attempts, 1,
        "taking back an unreleased lease (a restarted worker) is a recovery"
    );
    let token = expect_err!(
        store.save_checkpoint(first.fence(), 0, checkpoint("stale", vec![])).await,
        StoreError::LeaseLost { token, .. } => token,
        "save_checkpoint with the token replaced by a re-acquire"
    );
    assert_eq!(token, first.fence, "LeaseLost must name the stale token");
    store
        .save_checkpoint(second.fence(), 0, checkpoint("fresh", vec![]))
        .await
        .expect("save_checkpoint with the new token");
}

/// After a lease expires another owner takes the session, with a strictly larger token.
pub async fn lease_expiry_lets_another_owner_in(store: Arc<dyn CheckpointStore>) {
    let ttl = Duration::from_millis(2_000);
    let (session, first) = create_with(&*store, new_session(&owner("short"), ttl)).await;
    expect_err!(
        store
            .acquire_lease(&session.id, &owner("early"), LONG_TTL, MAX_ATTEMPTS)
            .await,
        StoreError::Leased { .. },
        "acquire_lease before a 2 s lease expired"
    );
    wait_past(&*store, first.expires_at).await;
    let next_owner = owner("late");
    let second = store
        .acquire_lease(&session.id, &next_owner, LONG_TTL, MAX_ATTEMPTS)
        .await
        .expect("acquire_lease after the previous lease expired");
    assert!(
        second.fence > first.fence,
        "fence must increase: {} then {}",
        first.fence,
        second.fence
    );
    assert_eq!(second.owner, next_owner, "new lease owner");
    let record = read(&*store, &session.id).await;
    assert_eq!(
        record.lease_owner.as_deref(),
        Some(next_owner.as_str()),
        "session lease_owner"
    );
    assert_eq!(
        record.lease_expires_at,
        Some(second.expires_at),
        "session lease_expires_at"
    );
    assert_eq!(record.fence, second.fence, "session fence");
}

/// Of many owners racing for one expired lease, exactly one wins.
pub async fn lease_concurrent_acquire_has_one_winner(store: Arc<dyn CheckpointStore>) {
    let (session, first) = create_with(&*store, new_session(&owner("gone"), Duration::ZERO)).await;
    let mut tasks = Vec::new();
    for i in 0..16 {
        let store = Arc::clone(&store);
        let id = session.id.clone();
        tasks.push(tokio::spawn(async move {
            store
                .acquire_lease(&id, &owner(&format!("racer{i}")), LONG_TTL, MAX_ATTEMPTS)
                .await
        }));
    }
    let mut winners = Vec::new();
    for task in tasks {
        match task.await.expect("acquire task panicked") {
            Ok(lease) => winners.push(lease),
            Err(StoreError::Leased { .. }) => {}
            Err(other) => panic!("concurrent acquire_lease: expected Ok or Leased, got {other:?}"),
        }
    }
    assert_eq!(
        winners.len(),
        1,
        "exactly one of 16 concurrent acquirers must win: {winners:?}"
    );
    assert!(
        winners[0].fence > first.fence,
        "winner's fence must be larger"
    );
    assert_eq!(
        read(&*store, &session.id).await.fence,
        winners[0].fence,
        "session fence"
    );
}

/// Every fenced write with a superseded token fails with `LeaseLost` and writes nothing.
pub async fn lease_stale_token_writes_nothing(store: Arc<dyn CheckpointStore>) {
    let (session, stale) = create(&*store, &owner("zombie")).await;
    let issued = match store
        .issue_call(stale.fence(), tool_call(&session.id, 0, "send", "h1", 0))
        .await
        .expect("issue_call under the live lease")
    {
        IssueOutcome::Inserted(row) => row,
        other => panic!("first issue_call must insert: {other:?}"),
    };
    store.release_lease(&stale).await.expect("release_lease");
    let current = store
        .acquire_lease(&session.id, &owner("successor"), LONG_TTL, MAX_ATTEMPTS)
        .await
        .expect("acquire after release");
    assert!(
        current.fence > stale.fence,
        "fence must increase on acquire"
    );
    let session_before = read(&*store, &session.id).await;
    let checkpoints_before = store
        .list_checkpoints(&session.id)
        .await
        .expect("list_checkpoints");
    let calls_before = store.calls(&session.id, None).await.expect("calls");

    let lost = |what: &str, result: Result<(), StoreError>| match result {
        Err(StoreError::LeaseLost { session: s, token }) => {
            assert_eq!(s, session.id, "{what}: LeaseLost names another session");
            assert_eq!(
                token, stale.fence,
                "{what}: LeaseLost must name the stale token"
            );
        }
        other => panic!("{what} with a stale token: expected LeaseLost, got {other:?}"),
    };
    lost(
        "save_checkpoint",
        store
            .save_checkpoint(stale.fence(), 0, checkpoint("zombie", vec![message(9)]))
            .await
            .map(drop),
    );
    lost(
        "issue_call (new identity)",
        store
            .issue_call(stale.fence(), tool_call(&session.id, 0, "send", "h2", 0))
            .await
            .map(drop),
    );
    lost(
        "issue_call (existing identity)",
        store
            .issue_call(stale.fence(), tool_call(&session.id, 0, "send", "h1", 0))
            .await
            .map(drop),
    );
    lost(
        "finish_call",
        store
            .finish_call(stale.fence(), &issued.id, completed(json!("zombie")), None)
            .await
            .map(drop),
    );
    lost(
        "finish_call with a checkpoint",
        store
            .finish_call(
                stale.fence(),
                &issued.id,
                completed(json!("zombie")),
                Some((0, checkpoint("zombie", vec![message(9)]))),
            )
            .await
            .map(drop),
    );
    lost(
        "reissue_call",
        store
            .reissue_call(stale.fence(), &issued.id)
            .await
            .map(drop),
    );
    lost(
        "set_status",
        store
            .set_status(stale.fence(), SessionStatus::Completed, Some("zombie"))
            .await,
    );
    lost(
        "renew_lease",
        store.renew_lease(&stale, LONG_TTL).await.map(drop),
    );

    assert_eq!(
        read(&*store, &session.id).await,
        session_before,
        "a stale write changed the session"
    );
    assert_eq!(
        store
            .list_checkpoints(&session.id)
            .await
            .expect("list_checkpoints"),
        checkpoints_before,
        "a stale write added a checkpoint"
    );
    assert_eq!(
        store.calls(&session.id, None).await.expect("calls"),
        calls_before,
        "a stale write changed the journal"
    );
    let latest = store
        .load_checkpoint(&session.id, None)
        .await
        .expect("load_checkpoint");
    assert_eq!(latest.messages.len(), 2, "a stale write appended messages");

    store
        .release_lease(&stale)
        .await
        .expect("release_lease with a stale token is a no-op");
    let after = read(&*store, &session.id).await;
    assert_eq!(
        after, session_before,
        "release_lease with a stale token changed the session"
    );
    expect_err!(
        store
            .acquire_lease(&session.id, &owner("third"), LONG_TTL, MAX_ATTEMPTS)
            .await,
        StoreError::Leased { .. },
        "acquire_lease after a stale release: the current lease must still be live"
    );
}

/// `renew_lease` keeps the token and moves the expiry; a renewed short lease outlives its
/// original expiry.
pub async fn lease_renew_extends(store: Arc<dyn CheckpointStore>) {
    let ttl = Duration::from_millis(1_000);
    let (session, lease) = create_with(&*store, new_session(&owner("renewer"), ttl)).await;
    let before = now(&*store).await;
    let renewed = store
        .renew_lease(&lease, LONG_TTL)
        .await
        .expect("renew_lease with the current token");
    let after = now(&*store).await;
    assert_eq!(
        renewed.fence, lease.fence,
        "renew_lease must keep the fencing token"
    );
    assert_eq!(
        renewed.owner, lease.owner,
        "renew_lease must keep the owner"
    );
    assert_eq!(renewed.session, lease.session, "renew_lease session");
    let ttl_ms = ms(LONG_TTL);
    assert!(
        (before + ttl_ms - CLOCK_SLACK_MS..=after + ttl_ms + CLOCK_SLACK_MS)
            .contains(&renewed.expires_at),
        "renewed expiry {} is not now + ttl ({before}..{after} + {ttl_ms} ms)",
        renewed.expires_at
    );
    let record = read(&*store, &session.id).await;
    assert_eq!(
        record.lease_expires_at,
        Some(renewed.expires_at),
        "session lease_expires_at after renew"
    );
    assert_eq!(
        record.fence, lease.fence,
        "renew must not bump the session fence"
    );

    // Past the original expiry, on the store's clock.
    wait_past(&*store, lease.expires_at).await;
    expect_err!(
        store
            .acquire_lease(&session.id, &owner("other"), LONG_TTL, MAX_ATTEMPTS)
            .await,
        StoreError::Leased { .. },
        "acquire_lease after the original expiry of a renewed lease"
    );
    store
        .save_checkpoint(renewed.fence(), 0, checkpoint("renewed", vec![message(2)]))
        .await
        .expect("writes under a renewed lease");
}

/// Renewing a superseded lease fails with `LeaseLost` and does not touch the new lease.
pub async fn lease_renew_with_stale_token_is_lost(store: Arc<dyn CheckpointStore>) {
    let w = owner("w");
    let (session, old) = create(&*store, &w).await;
    let current = store
        .acquire_lease(&session.id, &w, Duration::from_secs(60), MAX_ATTEMPTS)
        .await
        .expect("re-acquire");
    expect_err!(
        store.renew_lease(&old, LONG_TTL).await,
        StoreError::LeaseLost { .. },
        "renew_lease with a superseded token"
    );
    let record = read(&*store, &session.id).await;
    assert_eq!(
        record.fence, current.fence,
        "a refused renew changed the fence"
    );
    assert_eq!(
        record.lease_expires_at,
        Some(current.expires_at),
        "a refused renew changed the expiry"
    );
}

/// After `release_lease` another owner acquires at once; the released token is stale.
pub async fn lease_release_lets_another_owner_in(store: Arc<dyn CheckpointStore>) {
    let (session, lease) = create(&*store, &owner("leaver")).await;
    store.release_lease(&lease).await.expect("release_lease");
    let record = read(&*store, &session.id).await;
    let t = now(&*store).await;
    assert!(
        record.lease_expires_at.is_none_or(|e| e <= t),
        "a released lease must be expired: expires {:?}, now {t}",
        record.lease_expires_at
    );
    assert_eq!(
        record.lease_owner, None,
        "a released lease has no owner any more"
    );
    let next = store
        .acquire_lease(&session.id, &owner("next"), LONG_TTL, MAX_ATTEMPTS)
        .await
        .expect("acquire_lease right after release");
    assert!(
        next.fence > lease.fence,
        "fence must increase after release + acquire"
    );
    expect_err!(
        store
            .save_checkpoint(lease.fence(), 0, checkpoint("late", vec![]))
            .await,
        StoreError::LeaseLost { .. },
        "save_checkpoint with the released token after another owner acquired"
    );
}

/// Terminal and parked sessions cannot be leased (`NotResumable`); `set_status` records
/// the reason and releases the lease.
pub async fn lease_terminal_and_parked_are_not_resumable(store: Arc<dyn CheckpointStore>) {
    for status in [
        SessionStatus::Completed,
        SessionStatus::Failed,
        SessionStatus::Cancelled,
        SessionStatus::Parked,
    ] {
        let w = owner("finisher");
        let (session, lease) = create(&*store, &w).await;
        let reason = format!("because {}", status.as_str());
        store
            .set_status(lease.fence(), status, Some(&reason))
            .await
            .unwrap_or_else(|e| panic!("set_status({status:?}) failed: {e:?}"));
        let record = read(&*store, &session.id).await;
        assert_eq!(record.status, status, "status after set_status");
        assert_eq!(
            record.status_reason.as_deref(),
            Some(reason.as_str()),
            "status_reason"
        );
        let t = now(&*store).await;
        assert!(
            record.lease_expires_at.is_none_or(|e| e <= t),
            "set_status({status:?}) must release the lease: expires {:?}, now {t}",
            record.lease_expires_at
        );
        assert!(
            record.fence > lease.fence,
            "set_status({status:?}) must bump the fence so the former holder writes nothing more"
        );
        expect_err!(
            store
                .save_checkpoint(lease.fence(), 0, checkpoint("after the end", vec![]))
                .await,
            StoreError::LeaseLost { .. },
            "a checkpoint by the holder of a {} session",
            status.as_str()
        );
        for who in [w.clone(), owner("other")] {
            let (s, st) = expect_err!(
                store.acquire_lease(&session.id, &who, LONG_TTL, MAX_ATTEMPTS).await,
                StoreError::NotResumable { session, status } => (session, status),
                "acquire_lease on a {} session", status.as_str()
            );
            assert_eq!(s, session.id, "NotResumable names another session");
            assert_eq!(
                st,
                status.as_str(),
                "NotResumable must carry the storage name of the status"
            );
        }
        assert_eq!(
            read(&*store, &session.id).await,
            record,
            "a refused acquire changed a {} session",
            status.as_str()
        );
    }
}
