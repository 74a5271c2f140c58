//! Cases: in-doubt calls and operator resolutions.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use super::{
    CLOCK_SLACK_MS, LONG_TTL, MAX_ATTEMPTS, completed, create, create_with, expect_err,
    new_session, now, owner, tool_call, wait_past,
};
use durable_core::error::StoreError;
use durable_core::ids::{CallId, SessionId};
use durable_core::store::{
    CallRecord, CallStatus, CheckpointStore, IssueOutcome, Lease, Resolution, ResolveCall,
};

/// Issues a fresh call under `lease`.
async fn issue(store: &dyn CheckpointStore, lease: &Lease, tool: &str) -> CallRecord {
    match store
        .issue_call(lease.fence(), tool_call(&lease.session, 0, tool, "h", 0))
        .await
    {
        Ok(IssueOutcome::Inserted(r)) => r,
        other => panic!("issue_call must insert: {other:?}"),
    }
}

/// Ids of the in-doubt calls of `session`, checked against the global listing.
async fn in_doubt_ids(store: &dyn CheckpointStore, session: &SessionId) -> Vec<CallId> {
    let mine = store
        .in_doubt(Some(session))
        .await
        .expect("in_doubt(session)");
    assert!(
        mine.iter().all(|r| &r.identity.session == session),
        "in_doubt(session) returned another session's rows"
    );
    assert!(
        mine.iter().all(|r| r.status == CallStatus::Issued),
        "in_doubt returned a row that is not issued"
    );
    let all = store.in_doubt(None).await.expect("in_doubt(None)");
    let ids: Vec<CallId> = mine.iter().map(|r| r.id.clone()).collect();
    let global: Vec<CallId> = all
        .into_iter()
        .filter(|r| &r.identity.session == session)
        .map(|r| r.id)
        .collect();
    let (mut a, mut b) = (ids.clone(), global);
    a.sort();
    b.sort();
    assert_eq!(
        a, b,
        "in_doubt(None) and in_doubt(Some(session)) disagree about the session"
    );
    ids
}

/// A resolution by `by`.
fn resolve(call: &CallId, resolution: Resolution) -> ResolveCall {
    ResolveCall {
        call: call.clone(),
        resolution,
        by: "operator".to_owned(),
        note: Some("checked upstream".to_owned()),
    }
}

/// An issued call is in doubt only once its issuing lease is gone: released, expired or
/// superseded; a finished call never is.
pub async fn in_doubt_requires_a_lost_lease(store: Arc<dyn CheckpointStore>) {
    // Released.
    let (a, lease_a) = create(&*store, &owner("a")).await;
    let issued = issue(&*store, &lease_a, "send").await;
    let finished = issue(&*store, &lease_a, "other").await;
    store
        .finish_call(lease_a.fence(), &finished.id, completed(json!(1)), None)
        .await
        .expect("finish");
    assert!(
        in_doubt_ids(&*store, &a.id).await.is_empty(),
        "an issued call under a live lease is not in doubt"
    );
    store.release_lease(&lease_a).await.expect("release");
    assert_eq!(
        in_doubt_ids(&*store, &a.id).await,
        vec![issued.id.clone()],
        "after release the issued call (only) is in doubt"
    );

    // Superseded by a re-acquire, even of the same owner.
    let (b, lease_b) = create(&*store, &owner("b")).await;
    let issued_b = issue(&*store, &lease_b, "send").await;
    store
        .acquire_lease(&b.id, &lease_b.owner, LONG_TTL, MAX_ATTEMPTS)
        .await
        .expect("re-acquire");
    assert_eq!(
        in_doubt_ids(&*store, &b.id).await,
        vec![issued_b.id],
        "a call issued under a superseded token is in doubt"
    );

    // Expired.
    let (c, lease_c) = create_with(
        &*store,
        new_session(&owner("c"), Duration::from_millis(2_000)),
    )
    .await;
    let issued_c = issue(&*store, &lease_c, "send").await;
    assert!(
        in_doubt_ids(&*store, &c.id).await.is_empty(),
        "not in doubt before expiry"
    );
    wait_past(&*store, lease_c.expires_at).await;
    assert_eq!(
        in_doubt_ids(&*store, &c.id).await,
        vec![issued_c.id],
        "a call whose lease expired is in doubt"
    );

    // Other sessions are not listed under this one.
    assert!(
        in_doubt_ids(&*store, &SessionId::random()).await.is_empty(),
        "in_doubt of an unknown session"
    );
}

/// `Happened` records the result as *resolved* with an audit row.
pub async fn resolve_happened_records_result_and_audit(store: Arc<dyn CheckpointStore>) {
    let (session, lease) = create(&*store, &owner("w")).await;
    let call = issue(&*store, &lease, "send").await;
    store.release_lease(&lease).await.expect("release");
    let result = json!({"message_id": "m-1", "ok": true});
    let before = now(&*store).await;
    let resolved = store
        .resolve_call(resolve(
            &call.id,
            Resolution::Happened {
                result: result.clone(),
            },
        ))
        .await
        .expect("resolve_call(happened)");
    let after = now(&*store).await;
    assert_eq!(
        resolved.status,
        CallStatus::Resolved,
        "status after Happened"
    );
    assert_eq!(
        resolved.result,
        Some(result.clone()),
        "result after Happened"
    );
    assert!(resolved.mac.is_some(), "a resolved row is sealed");
    assert!(resolved.finished_at.is_some(), "finished_at after Happened");
    assert_eq!(
        (&resolved.id, &resolved.identity, resolved.attempt),
        (&call.id, &call.identity, call.attempt),
        "resolve changed the identity"
    );
    assert_eq!(
        store.call(&call.id).await.expect("call"),
        resolved,
        "call() after resolve"
    );
    assert!(
        in_doubt_ids(&*store, &session.id).await.is_empty(),
        "a resolved call is still in doubt"
    );

    let audit = store.resolutions(&session.id).await.expect("resolutions");
    assert_eq!(audit.len(), 1, "one audit row per resolution");
    let row = &audit[0];
    assert_eq!(
        (&row.call, &row.session),
        (&call.id, &session.id),
        "audit row ids"
    );
    assert_eq!(
        row.resolution,
        Resolution::Happened { result },
        "audit decision"
    );
    assert_eq!(
        (row.by.as_str(), row.note.as_deref()),
        ("operator", Some("checked upstream")),
        "audit by/note"
    );
    assert!(
        (before - CLOCK_SLACK_MS..=after + CLOCK_SLACK_MS).contains(&row.at),
        "audit time {} not in {before}..{after}",
        row.at
    );
    assert!(
        store
            .resolutions(&SessionId::random())
            .await
            .map(|r| r.is_empty())
            .unwrap_or(true),
        "resolutions of another session"
    );
}

/// `DidNotHappen` marks the call *not happened*; a later reissue runs it again.
pub async fn resolve_did_not_happen_allows_reissue(store: Arc<dyn CheckpointStore>) {
    let (session, lease) = create(&*store, &owner("w")).await;
    let call = issue(&*store, &lease, "send").await;
    store.release_lease(&lease).await.expect("release");
    let resolved = store
        .resolve_call(resolve(&call.id, Resolution::DidNotHappen))
        .await
        .expect("resolve_call(did not happen)");
    assert_eq!(
        resolved.status,
        CallStatus::NotHappened,
        "status after DidNotHappen"
    );
    assert_eq!(resolved.result, None, "DidNotHappen records no result");
    let audit = store.resolutions(&session.id).await.expect("resolutions");
    assert_eq!(
        audit.iter().map(|r| &r.resolution).collect::<Vec<_>>(),
        vec![&Resolution::DidNotHappen],
        "audit rows"
    );
    assert!(
        in_doubt_ids(&*store, &session.id).await.is_empty(),
        "a not_happened call is not in doubt"
    );

    let next = store
        .acquire_lease(&session.id, &owner("next"), LONG_TTL, MAX_ATTEMPTS)
        .await
        .expect("acquire");
    expect_err!(
        store
            .finish_call(next.fence(), &call.id, completed(json!("early")), None)
            .await,
        StoreError::CallNotInDoubt { .. },
        "finish_call of a not_happened row before it was reissued"
    );
    expect_err!(
        store
            .resolve_call(resolve(&call.id, Resolution::Happened { result: json!(1) }))
            .await,
        StoreError::CallNotInDoubt { .. },
        "resolve_call of a not_happened row"
    );
    let again = store
        .reissue_call(next.fence(), &call.id)
        .await
        .expect("reissue_call of a not_happened row");
    assert_eq!(
        (again.status, again.attempt, again.fence),
        (CallStatus::Issued, 2, next.fence),
        "reissued row"
    );
    assert_eq!(
        (again.result, again.finished_at),
        (None, None),
        "a reissued row has no outcome"
    );
}

/// Resolving a call that has an outcome, is already resolved, or still runs under a live
/// lease is refused with `CallNotInDoubt`, and writes no audit row.
pub async fn resolve_refuses_calls_not_in_doubt(store: Arc<dyn CheckpointStore>) {
    let (session, lease) = create(&*store, &owner("w")).await;
    let running = issue(&*store, &lease, "running").await;
    let done = issue(&*store, &lease, "done").await;
    store
        .finish_call(lease.fence(), &done.id, completed(json!("ok")), None)
        .await
        .expect("finish");

    expect_err!(
        store
            .resolve_call(resolve(&running.id, Resolution::DidNotHappen))
            .await,
        StoreError::CallNotInDoubt { .. },
        "resolve_call of a call still running under a live lease"
    );
    assert_eq!(
        store.call(&running.id).await.expect("call"),
        running,
        "a refused resolve changed a running call"
    );
    let status = expect_err!(
        store.resolve_call(resolve(&done.id, Resolution::Happened { result: json!("x") })).await,
        StoreError::CallNotInDoubt { status, .. } => status,
        "resolve_call of a completed call"
    );
    assert_eq!(status, "completed", "CallNotInDoubt status");
    let done_row = store.call(&done.id).await.expect("call");
    assert_eq!(
        done_row.result,
        Some(json!("ok")),
        "a refused resolve changed a completed call"
    );

    store.release_lease(&lease).await.expect("release");
    store
        .resolve_call(resolve(
            &running.id,
            Resolution::Happened { result: json!(1) },
        ))
        .await
        .expect("resolve once");
    expect_err!(
        store
            .resolve_call(resolve(&running.id, Resolution::DidNotHappen))
            .await,
        StoreError::CallNotInDoubt { .. },
        "resolving an already resolved call"
    );
    expect_err!(
        store
            .resolve_call(resolve(&CallId::random(), Resolution::DidNotHappen))
            .await,
        StoreError::CallNotFound(_),
        "resolve_call of a missing call"
    );
    assert_eq!(
        store
            .resolutions(&session.id)
            .await
            .expect("resolutions")
            .len(),
        1,
        "refused resolutions wrote audit rows"
    );
}
