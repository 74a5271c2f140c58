//! Cases: forking a session from one of its checkpoints.

use std::sync::Arc;

use serde_json::json;

use super::checkpoints::{load, values};
use super::{LONG_TTL, checkpoint, create, expect_err, message, owner, read, session_id};
use crate::error::StoreError;
use crate::store::{CheckpointStore, SessionStatus};

/// A fork's version 0 equals the source version; the source is untouched, the fork is
/// leased to the given owner and its log is its own.
pub async fn fork_copies_version_and_leaves_source_untouched(store: Arc<dyn CheckpointStore>) {
    let (source, lease) = create(&*store, &owner("w")).await;
    for v in 0..3 {
        store
            .save_checkpoint(
                lease.fence(),
                v,
                checkpoint(&format!("s{v}"), vec![message(2 + v as usize)]),
            )
            .await
            .expect("save_checkpoint");
    }
    let source_before = read(&*store, &source.id).await;
    let source_list = store
        .list_checkpoints(&source.id)
        .await
        .expect("list_checkpoints");
    let at = load(&*store, &source.id, Some(2)).await;

    let fork_id = session_id();
    let forker = owner("forker");
    let (fork, fork_lease) = store
        .fork_session(&source.id, 2, &fork_id, &forker, LONG_TTL)
        .await
        .expect("fork_session");
    assert_eq!(fork.id, fork_id, "fork id");
    assert_eq!(fork.status, SessionStatus::Active, "fork status");
    assert_eq!(fork.app_version, source.app_version, "fork app_version");
    assert_eq!(
        fork.metadata, source.metadata,
        "fork metadata (copied from the source)"
    );
    assert_eq!(fork.latest_version, 0, "fork latest_version");
    assert_eq!(
        fork.lease_owner.as_deref(),
        Some(forker.as_str()),
        "fork lease owner"
    );
    assert_eq!(fork.fence, fork_lease.fence, "fork fence");
    assert_eq!(
        fork.lease_expires_at,
        Some(fork_lease.expires_at),
        "fork expiry"
    );
    assert_eq!(
        (fork_lease.session.clone(), fork_lease.owner.clone()),
        (fork_id.clone(), forker.clone()),
        "fork lease"
    );
    assert_eq!(read(&*store, &fork_id).await, fork, "session() of the fork");

    let v0 = load(&*store, &fork_id, Some(0)).await;
    assert_eq!(v0.messages, at.messages, "fork transcript");
    assert_eq!(
        (&v0.plan, &v0.budget, &v0.state),
        (&at.plan, &at.budget, &at.state),
        "fork snapshots"
    );
    assert_eq!(v0.meta.version, 0, "fork version");
    assert_eq!(
        v0.meta.message_count, at.meta.message_count,
        "fork message_count"
    );
    assert_eq!(
        store.list_checkpoints(&fork_id).await.expect("list").len(),
        1,
        "fork has one checkpoint"
    );

    // Both logs grow independently.
    store
        .save_checkpoint(
            fork_lease.fence(),
            0,
            checkpoint("f1", vec![json!("fork only")]),
        )
        .await
        .expect("save_checkpoint on the fork");
    let mut expected = values(&at);
    expected.push(json!("fork only"));
    assert_eq!(
        values(&load(&*store, &fork_id, None).await),
        expected,
        "fork after a save"
    );
    assert_eq!(
        read(&*store, &source.id).await,
        source_before,
        "fork changed the source session"
    );
    assert_eq!(
        store.list_checkpoints(&source.id).await.expect("list"),
        source_list,
        "fork changed the source's checkpoints"
    );
    let latest = load(&*store, &source.id, None).await;
    assert_eq!(
        values(&latest),
        (0..5).map(message).collect::<Vec<_>>(),
        "fork changed the source's transcript"
    );
    store
        .save_checkpoint(
            lease.fence(),
            3,
            checkpoint("s3", vec![json!("source only")]),
        )
        .await
        .expect("save_checkpoint on the source after the fork");
    assert_eq!(
        values(&load(&*store, &fork_id, None).await),
        expected,
        "a source save leaked into the fork"
    );

    let again = store
        .fork_session(&source.id, 1, &fork_id, &owner("x"), LONG_TTL)
        .await;
    expect_err!(
        again,
        StoreError::SessionExists(_),
        "fork_session into an existing id"
    );
}

/// Forking a missing version (or session) is refused and creates nothing.
pub async fn fork_missing_version_is_refused(store: Arc<dyn CheckpointStore>) {
    let (source, _) = create(&*store, &owner("w")).await;
    let target = session_id();
    let (s, v) = expect_err!(
        store.fork_session(&source.id, 5, &target, &owner("f"), LONG_TTL).await,
        StoreError::VersionNotFound { session, version } => (session, version),
        "fork_session of version 5 when only version 0 exists"
    );
    assert_eq!((s, v), (source.id.clone(), 5), "VersionNotFound fields");
    expect_err!(
        store.session(&target).await,
        StoreError::SessionNotFound(_),
        "a refused fork created its target"
    );
    expect_err!(
        store
            .fork_session(&session_id(), 0, &target, &owner("f"), LONG_TTL)
            .await,
        StoreError::SessionNotFound(_) | StoreError::VersionNotFound { .. },
        "fork_session of a missing session"
    );
    expect_err!(
        store.session(&target).await,
        StoreError::SessionNotFound(_),
        "a refused fork created its target"
    );
}
