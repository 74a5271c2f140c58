//! Cases: creating, reading and listing sessions.

use std::sync::Arc;
use std::time::Duration;

use super::{
    CLOCK_SLACK_MS, LONG_TTL, MAX_ATTEMPTS, checkpoint, create, expect_err, message, ms,
    new_session, now, owner, read, session_id,
};
use durable_core::error::StoreError;
use durable_core::store::{CheckpointStore, SessionFilter, SessionStatus};

/// `create_session` stores every field and `session` reads them back; the lease it
/// returns matches the row.
pub async fn session_create_reads_back_every_field(store: Arc<dyn CheckpointStore>) {
    let owner = owner("creator");
    let ttl = Duration::from_secs(90);
    let new = new_session(&owner, ttl);
    let before = now(&*store).await;
    let (created, lease) = store
        .create_session(new.clone())
        .await
        .expect("create_session failed");
    let after = now(&*store).await;

    assert_eq!(
        created.id, new.id,
        "create_session: returned record has another id"
    );
    assert_eq!(
        created.status,
        SessionStatus::Active,
        "a new session must be active"
    );
    assert_eq!(
        created.app_version, new.app_version,
        "app_version not stored"
    );
    assert_eq!(created.metadata, new.metadata, "metadata not stored");
    assert_eq!(
        created.lease_owner.as_deref(),
        Some(owner.as_str()),
        "lease_owner"
    );
    assert_eq!(
        created.lease_expires_at,
        Some(lease.expires_at),
        "lease_expires_at != lease"
    );
    assert_eq!(created.fence, lease.fence, "record fence != lease fence");
    assert_eq!(
        created.recovery_attempts, 0,
        "recovery_attempts of a new session"
    );
    assert_eq!(
        created.status_reason, None,
        "status_reason of a new session"
    );
    assert_eq!(created.latest_version, 0, "latest_version of a new session");
    assert!(
        (before - CLOCK_SLACK_MS..=after + CLOCK_SLACK_MS).contains(&created.created_at),
        "created_at {} is not between the store clock readings {before} and {after} (ms since epoch)",
        created.created_at
    );
    assert!(
        created.updated_at >= created.created_at,
        "updated_at before created_at"
    );

    assert_eq!(lease.session, new.id, "lease names another session");
    assert_eq!(lease.owner, owner, "lease owner");
    let ttl = ms(ttl);
    assert!(
        (before + ttl - CLOCK_SLACK_MS..=after + ttl + CLOCK_SLACK_MS).contains(&lease.expires_at),
        "lease.expires_at {} is not now + ttl ({ttl} ms) on the store clock ({before}..{after})",
        lease.expires_at
    );

    let read_back = read(&*store, &new.id).await;
    assert_eq!(
        read_back, created,
        "session() differs from what create_session returned"
    );
}

/// A taken id is refused with `SessionExists`, and the existing session is untouched.
pub async fn session_duplicate_id_is_refused(store: Arc<dyn CheckpointStore>) {
    let owner_a = owner("first");
    let (first, _lease) = create(&*store, &owner_a).await;
    let before = store
        .load_checkpoint(&first.id, None)
        .await
        .expect("load_checkpoint of a new session");

    let mut dup = new_session(&owner("second"), LONG_TTL);
    dup.id = first.id.clone();
    dup.app_version = "other".to_owned();
    dup.initial = checkpoint("dup", vec![message(100), message(101), message(102)]);
    let id = expect_err!(
        store.create_session(dup).await,
        StoreError::SessionExists(id) => id,
        "create_session with a taken id"
    );
    assert_eq!(id, first.id, "SessionExists names another id");

    assert_eq!(
        read(&*store, &first.id).await,
        first,
        "a refused create changed the session"
    );
    let after = store
        .load_checkpoint(&first.id, None)
        .await
        .expect("load_checkpoint after a refused create");
    assert_eq!(
        after, before,
        "a refused create changed the checkpoint or its transcript"
    );
    let listed = store
        .list_checkpoints(&first.id)
        .await
        .expect("list_checkpoints");
    assert_eq!(
        listed.len(),
        1,
        "a refused create added a checkpoint: {listed:?}"
    );
}

/// Reading or leasing a missing session is `SessionNotFound`.
pub async fn session_missing_is_not_found(store: Arc<dyn CheckpointStore>) {
    let missing = session_id();
    let id = expect_err!(
        store.session(&missing).await,
        StoreError::SessionNotFound(id) => id,
        "session() of a missing id"
    );
    assert_eq!(id, missing, "SessionNotFound names another id");
    expect_err!(
        store
            .acquire_lease(&missing, &owner("w"), LONG_TTL, MAX_ATTEMPTS)
            .await,
        StoreError::SessionNotFound(_),
        "acquire_lease on a missing session"
    );
}

/// `list_sessions` filters by status and `updated_before`, orders newest update first and
/// honours `limit`.
pub async fn session_list_filters_and_orders(store: Arc<dyn CheckpointStore>) {
    let w = owner("lister");
    let (a, _) = create(&*store, &w).await;
    tokio::time::sleep(Duration::from_millis(15)).await;
    let (b, _) = create(&*store, &w).await;
    tokio::time::sleep(Duration::from_millis(15)).await;
    let (c, lease_c) = create(&*store, &w).await;
    tokio::time::sleep(Duration::from_millis(15)).await;
    store
        .set_status(lease_c.fence(), SessionStatus::Completed, Some("done"))
        .await
        .expect("set_status(completed)");
    let a = read(&*store, &a.id).await;
    let b = read(&*store, &b.id).await;
    let c = read(&*store, &c.id).await;
    assert!(
        a.updated_at + 1 < b.updated_at && b.updated_at < c.updated_at,
        "sessions created 15 ms apart (and the last completed after) must have increasing updated_at: {} {} {}",
        a.updated_at,
        b.updated_at,
        c.updated_at
    );
    let mine = [&a.id, &b.id, &c.id];

    let list = |filter: SessionFilter| {
        let store = Arc::clone(&store);
        async move {
            let got = store
                .list_sessions(&filter)
                .await
                .unwrap_or_else(|e| panic!("list_sessions({filter:?}) failed: {e:?}"));
            for pair in got.windows(2) {
                assert!(
                    pair[0].updated_at >= pair[1].updated_at,
                    "list_sessions({filter:?}) is not newest-update first: {} then {}",
                    pair[0].updated_at,
                    pair[1].updated_at
                );
            }
            got
        }
    };
    let ids = |got: &[durable_core::store::SessionRecord]| {
        got.iter()
            .filter(|s| mine.contains(&&s.id))
            .map(|s| s.id.clone())
            .collect::<Vec<_>>()
    };

    let all = list(SessionFilter::default()).await;
    assert_eq!(
        ids(&all),
        vec![c.id.clone(), b.id.clone(), a.id.clone()],
        "list_sessions(all) must hold the three sessions newest first"
    );
    let got = all.iter().find(|s| s.id == c.id).expect("c listed");
    assert_eq!(
        got, &c,
        "list_sessions returns another record than session()"
    );

    let completed = list(SessionFilter::new().with_statuses(vec![SessionStatus::Completed])).await;
    assert_eq!(
        ids(&completed),
        vec![c.id.clone()],
        "status filter [completed]"
    );
    assert!(
        completed
            .iter()
            .all(|s| s.status == SessionStatus::Completed),
        "status filter [completed] returned other statuses"
    );

    let active = list(SessionFilter::new().with_statuses(vec![SessionStatus::Active])).await;
    assert_eq!(
        ids(&active),
        vec![b.id.clone(), a.id.clone()],
        "status filter [active]"
    );

    let both = list(
        SessionFilter::new().with_statuses(vec![SessionStatus::Active, SessionStatus::Completed]),
    )
    .await;
    assert_eq!(ids(&both).len(), 3, "status filter [active, completed]");

    let old = list(SessionFilter::new().with_updated_before(a.updated_at + 1)).await;
    assert_eq!(
        ids(&old),
        vec![a.id.clone()],
        "updated_before = a.updated_at + 1 must list a only"
    );
    assert!(
        old.iter().all(|s| s.updated_at < a.updated_at + 1),
        "updated_before returned a session updated later"
    );

    let limited = list(SessionFilter::new().with_limit(2)).await;
    assert_eq!(limited.len(), 2, "limit 2 with at least 3 sessions stored");
    let floor = limited
        .iter()
        .map(|s| s.updated_at)
        .min()
        .expect("two rows");
    for s in [&a, &b, &c] {
        if !limited.iter().any(|l| l.id == s.id) {
            assert!(
                s.updated_at <= floor,
                "limit 2 left out session {} (updated_at {}) but kept an older one ({floor}): not the newest",
                s.id,
                s.updated_at
            );
        }
    }

    let combined = list(
        SessionFilter::new()
            .with_statuses(vec![SessionStatus::Active])
            .with_updated_before(c.updated_at)
            .with_limit(1),
    )
    .await;
    assert_eq!(combined.len(), 1, "active + updated_before + limit 1");
    assert_eq!(
        combined[0].status,
        SessionStatus::Active,
        "combined filter status"
    );
    assert!(
        combined[0].updated_at < c.updated_at,
        "combined filter updated_before"
    );

    let nothing = list(SessionFilter::new().with_updated_before(0)).await;
    assert!(
        nothing.is_empty(),
        "updated_before 1970 must list nothing: {nothing:?}"
    );
}
