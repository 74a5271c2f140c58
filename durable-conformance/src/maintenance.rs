//! Cases: error history, app-version migration, purge, durability and the clock.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use super::checkpoints::values;
use super::{
    CLOCK_SLACK_MS, MAX_ATTEMPTS, checkpoint, completed, create, create_with, expect_err, message,
    new_session, now, owner, read, session_id, system_ms, tool_call,
};
use durable_core::error::StoreError;
use durable_core::ids::SessionId;
use durable_core::store::{
    CheckpointStore, IssueOutcome, NewError, PurgeOutcome, Resolution, ResolveCall,
    RetargetSession, SessionStatus,
};

fn error(session: &SessionId, step: i64, attempt: i32, message: &str) -> NewError {
    NewError {
        session: session.clone(),
        step,
        context: "model".to_owned(),
        attempt,
        message: message.to_owned(),
    }
}

/// `record_error` / `errors` round-trip every field, oldest first, per session.
pub async fn errors_round_trip_in_order(store: Arc<dyn CheckpointStore>) {
    let (session, _) = create(&*store, &owner("w")).await;
    let (other, _) = create(&*store, &owner("w")).await;
    let before = now(&*store).await;
    let written = [
        error(&session.id, 3, 0, "429 rate limited — retry in 2s"),
        error(&session.id, 3, 1, "500 internal error"),
        error(&session.id, 1, 0, "timeout"),
    ];
    for e in &written {
        store.record_error(e.clone()).await.expect("record_error");
    }
    store
        .record_error(error(&other.id, 0, 0, "elsewhere"))
        .await
        .expect("record_error");
    let after = now(&*store).await;
    let got = store.errors(&session.id).await.expect("errors");
    assert_eq!(got.len(), 3, "errors of the session: {got:?}");
    for (g, w) in got.iter().zip(&written) {
        assert_eq!(
            (&g.session, g.step, &g.context, g.attempt, &g.message),
            (&w.session, w.step, &w.context, w.attempt, &w.message),
            "errors() must return the recorded errors in recording order"
        );
        assert!(
            (before - CLOCK_SLACK_MS..=after + CLOCK_SLACK_MS).contains(&g.at),
            "error time {}",
            g.at
        );
    }
    assert!(
        got.windows(2).all(|p| p[0].at <= p[1].at),
        "errors not oldest first"
    );
    assert_eq!(
        store.errors(&other.id).await.expect("errors").len(),
        1,
        "errors of the other session"
    );
}

/// `retarget_session` checks the current version, renames the session's journal tools and
/// moves the session (and later checkpoints) to the new version.
pub async fn migrate_checks_version_and_renames_tools(store: Arc<dyn CheckpointStore>) {
    let (session, lease) = create(&*store, &owner("w")).await;
    let (bystander, other_lease) = create(&*store, &owner("w")).await;
    let old_call = tool_call(&session.id, 0, "old_tool", "h", 0);
    let kept_call = tool_call(&session.id, 0, "kept_tool", "h", 0);
    let other_call = tool_call(&bystander.id, 0, "old_tool", "h", 0);
    for (fence, call) in [
        (lease.fence(), &old_call),
        (lease.fence(), &kept_call),
        (other_lease.fence(), &other_call),
    ] {
        store
            .issue_call(fence, call.clone())
            .await
            .expect("issue_call");
    }
    let migrate = |from: &str| RetargetSession {
        session: session.id.clone(),
        from_version: from.to_owned(),
        to_version: "v2".to_owned(),
        step_map: vec![("old_tool".to_owned(), "new_tool".to_owned())],
        by: "operator".to_owned(),
    };
    let (s, expected, actual) = expect_err!(
        store.retarget_session(migrate("v0")).await,
        StoreError::AppVersionMismatch { session, expected, actual } => (session, expected, actual),
        "retarget_session from a version the session is not on"
    );
    assert_eq!(
        (s, expected.as_str(), actual.as_str()),
        (session.id.clone(), "v0", "v1"),
        "AppVersionMismatch fields"
    );
    assert_eq!(
        store.call(&old_call.id).await.expect("call").identity.tool,
        "old_tool",
        "a refused migration renamed a tool"
    );
    assert_eq!(
        read(&*store, &session.id).await.app_version,
        "v1",
        "a refused migration changed app_version"
    );

    let migrated = store
        .retarget_session(migrate("v1"))
        .await
        .expect("retarget_session");
    assert_eq!(migrated.app_version, "v2", "returned app_version");
    assert_eq!(
        read(&*store, &session.id).await,
        migrated,
        "session() after migration"
    );
    assert_eq!(
        store.call(&old_call.id).await.expect("call").identity.tool,
        "new_tool",
        "step_map must rename the tool"
    );
    assert_eq!(
        store.call(&kept_call.id).await.expect("call").identity.tool,
        "kept_tool",
        "an unmapped tool was renamed"
    );
    assert_eq!(
        store
            .call(&other_call.id)
            .await
            .expect("call")
            .identity
            .tool,
        "old_tool",
        "retarget_session renamed a journal row of another session"
    );
    // The renamed row is found under its new identity.
    match store
        .issue_call(lease.fence(), tool_call(&session.id, 0, "new_tool", "h", 0))
        .await
    {
        Ok(IssueOutcome::Existing(r)) => assert_eq!(r.id, old_call.id, "renamed row"),
        other => panic!("issue_call under the renamed identity: expected Existing, got {other:?}"),
    }
    let meta = store
        .save_checkpoint(lease.fence(), 0, checkpoint("v2", vec![message(2)]))
        .await
        .expect("save_checkpoint");
    assert_eq!(
        meta.app_version, "v2",
        "a checkpoint written after migration carries the new app_version"
    );
    let v0 = store
        .load_checkpoint(&session.id, Some(0))
        .await
        .expect("load v0");
    assert_eq!(
        v0.meta.app_version, "v1",
        "migration rewrote an old checkpoint's app_version"
    );
    expect_err!(
        store
            .retarget_session(RetargetSession {
                session: session_id(),
                ..migrate("v1")
            })
            .await,
        StoreError::SessionNotFound(_),
        "retarget_session of a missing session"
    );
}

/// Purge refuses active, recently updated and in-doubt sessions (and writes nothing).
pub async fn purge_refuses_active_recent_and_in_doubt(store: Arc<dyn CheckpointStore>) {
    let hour = Duration::from_secs(3_600);
    let (active, lease) = create(&*store, &owner("w")).await;
    assert_eq!(
        store
            .purge_session(&active.id, Duration::ZERO)
            .await
            .expect("purge"),
        PurgeOutcome::NotTerminal,
        "purge of an active session"
    );
    let (parked, parked_lease) = create(&*store, &owner("w")).await;
    store
        .set_status(parked_lease.fence(), SessionStatus::Parked, Some("poison"))
        .await
        .expect("park");
    assert_eq!(
        store
            .purge_session(&parked.id, Duration::ZERO)
            .await
            .expect("purge"),
        PurgeOutcome::NotTerminal,
        "purge of a parked session (parked is not terminal)"
    );

    store
        .set_status(lease.fence(), SessionStatus::Completed, None)
        .await
        .expect("complete");
    assert_eq!(
        store.purge_session(&active.id, hour).await.expect("purge"),
        PurgeOutcome::WithinRetention,
        "purge of a session completed just now, retention 1 h"
    );

    let (doubtful, d_lease) = create(&*store, &owner("w")).await;
    let call = tool_call(&doubtful.id, 0, "send", "h", 0);
    store
        .issue_call(d_lease.fence(), call.clone())
        .await
        .expect("issue_call");
    store
        .set_status(d_lease.fence(), SessionStatus::Failed, Some("crashed"))
        .await
        .expect("fail");
    assert_eq!(
        store
            .purge_session(&doubtful.id, Duration::ZERO)
            .await
            .expect("purge"),
        PurgeOutcome::CallInDoubt,
        "purge of a session with an issued call"
    );
    for id in [&active.id, &parked.id, &doubtful.id] {
        read(&*store, id).await;
        assert_eq!(
            store.list_checkpoints(id).await.expect("list").len(),
            1,
            "a refused purge deleted checkpoints"
        );
    }
    store
        .call(&call.id)
        .await
        .expect("a refused purge deleted the in-doubt call");

    // Once resolved, the session can go.
    store
        .resolve_call(ResolveCall {
            call: call.id.clone(),
            resolution: Resolution::DidNotHappen,
            by: "op".to_owned(),
            note: None,
        })
        .await
        .expect("resolve");
    assert_eq!(
        store
            .purge_session(&doubtful.id, Duration::ZERO)
            .await
            .expect("purge"),
        PurgeOutcome::Purged,
        "purge after the call was resolved"
    );
}

/// A terminal, old session is purged with every row; other sessions are untouched, and
/// the id can be reused from scratch.
pub async fn purge_deletes_every_row(store: Arc<dyn CheckpointStore>) {
    let make = || async {
        let (s, lease) = create(&*store, &owner("w")).await;
        let a = tool_call(&s.id, 0, "a", "h", 0);
        let b = tool_call(&s.id, 0, "b", "h", 0);
        for c in [&a, &b] {
            store
                .issue_call(lease.fence(), c.clone())
                .await
                .expect("issue_call");
        }
        store
            .finish_call(
                lease.fence(),
                &a.id,
                completed(json!(1)),
                Some((0, checkpoint("c1", vec![message(2)]))),
            )
            .await
            .expect("finish");
        store
            .record_error(error(&s.id, 0, 0, "boom"))
            .await
            .expect("record_error");
        store.release_lease(&lease).await.expect("release");
        store
            .resolve_call(ResolveCall {
                call: b.id.clone(),
                resolution: Resolution::Happened { result: json!(2) },
                by: "op".to_owned(),
                note: None,
            })
            .await
            .expect("resolve");
        store
            .raise_limit(durable_core::store::RaiseLimit::new(
                s.id.clone(),
                durable_core::snapshot::Limit::Usd,
                5,
                "op",
            ))
            .await
            .expect("raise_limit");
        (s, a, b)
    };
    let (victim, va, vb) = make().await;
    let (keeper, ka, _) = make().await;
    let victim_id = victim.id.clone();
    let lease = store
        .acquire_lease(
            &victim_id,
            &owner("closer"),
            Duration::from_secs(60),
            MAX_ATTEMPTS,
        )
        .await
        .expect("acquire");
    store
        .set_status(lease.fence(), SessionStatus::Completed, None)
        .await
        .expect("complete");
    let keeper_before = (
        read(&*store, &keeper.id).await,
        store.load_checkpoint(&keeper.id, None).await.expect("load"),
        store.calls(&keeper.id, None).await.expect("calls"),
        store.errors(&keeper.id).await.expect("errors"),
        store.resolutions(&keeper.id).await.expect("resolutions"),
        store.limit_raises(&keeper.id).await.expect("limit_raises"),
    );

    assert_eq!(
        store
            .purge_session(&victim_id, Duration::ZERO)
            .await
            .expect("purge"),
        PurgeOutcome::Purged,
        "purge of an old terminal session"
    );
    expect_err!(
        store.session(&victim_id).await,
        StoreError::SessionNotFound(_),
        "session() after purge"
    );
    expect_err!(
        store.load_checkpoint(&victim_id, Some(0)).await,
        StoreError::SessionNotFound(_) | StoreError::VersionNotFound { .. },
        "load_checkpoint after purge"
    );
    for c in [&va.id, &vb.id] {
        expect_err!(
            store.call(c).await,
            StoreError::CallNotFound(_),
            "call() after purge"
        );
    }
    for (what, empty) in [
        (
            "list_checkpoints",
            store
                .list_checkpoints(&victim_id)
                .await
                .map(|v| v.is_empty()),
        ),
        (
            "calls",
            store.calls(&victim_id, None).await.map(|v| v.is_empty()),
        ),
        (
            "errors",
            store.errors(&victim_id).await.map(|v| v.is_empty()),
        ),
        (
            "resolutions",
            store.resolutions(&victim_id).await.map(|v| v.is_empty()),
        ),
        (
            "in_doubt",
            store.in_doubt(Some(&victim_id)).await.map(|v| v.is_empty()),
        ),
        (
            "limit_raises",
            store.limit_raises(&victim_id).await.map(|v| v.is_empty()),
        ),
    ] {
        assert!(
            !matches!(empty, Ok(false)),
            "{what} still returns rows of a purged session"
        );
    }
    let keeper_after = (
        read(&*store, &keeper.id).await,
        store.load_checkpoint(&keeper.id, None).await.expect("load"),
        store.calls(&keeper.id, None).await.expect("calls"),
        store.errors(&keeper.id).await.expect("errors"),
        store.resolutions(&keeper.id).await.expect("resolutions"),
        store.limit_raises(&keeper.id).await.expect("limit_raises"),
    );
    assert_eq!(keeper_after, keeper_before, "purge touched another session");
    store
        .call(&ka.id)
        .await
        .expect("another session's call after purge");

    // Reusing the id starts from nothing: no old messages, calls or errors leak in.
    let mut again = new_session(&owner("w"), Duration::from_secs(60));
    again.id = victim_id.clone();
    again.initial = checkpoint("reborn", vec![json!("only message")]);
    let (_, lease) = create_with(&*store, again).await;
    let cp = store.load_checkpoint(&victim_id, None).await.expect("load");
    assert_eq!(
        (cp.meta.version, values(&cp)),
        (0, vec![json!("only message")]),
        "a reused id must not see the purged transcript"
    );
    assert!(
        store
            .calls(&victim_id, None)
            .await
            .expect("calls")
            .is_empty(),
        "a reused id sees purged calls"
    );
    assert!(
        store.errors(&victim_id).await.expect("errors").is_empty(),
        "a reused id sees purged errors"
    );
    match store
        .issue_call(lease.fence(), tool_call(&victim_id, 0, "a", "h", 0))
        .await
    {
        Ok(IssueOutcome::Inserted(_)) => {}
        other => {
            panic!("issue_call on a reused id must insert (the purged row is gone), got {other:?}")
        }
    }
}

/// `durability` answers.
pub async fn durability_reports(store: Arc<dyn CheckpointStore>) {
    let d = store.durability().await.expect("durability()");
    if let Some(setting) = &d.unsafe_setting {
        assert!(
            !setting.is_empty(),
            "an unsafe durability setting must be named"
        );
    }
    assert!(
        !store.backend().is_empty(),
        "backend() must name the backend"
    );
}

/// `now` is milliseconds since the epoch, close to the system clock, and does not run
/// backwards.
pub async fn now_tracks_the_system_clock(store: Arc<dyn CheckpointStore>) {
    let first = now(&*store).await;
    let system = system_ms();
    assert!(
        (first - system).abs() < 60_000,
        "now() = {first} is more than a minute from the system clock ({system} ms since epoch)"
    );
    let mut last = first;
    for _ in 0..20 {
        let t = now(&*store).await;
        assert!(t + 5 >= last, "now() went backwards: {last} then {t}");
        last = t;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let later = now(&*store).await;
    assert!(
        later >= first + 40,
        "now() advanced {} ms over a 50 ms sleep",
        later - first
    );
}
