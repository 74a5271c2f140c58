//! Cases: journal outcomes (finish, reissue, record) and listing.

use std::sync::Arc;

use serde_json::json;

use super::checkpoints::values;
use super::journal::{insert, row};
use super::{
    LONG_TTL, MAX_ATTEMPTS, checkpoint, completed, create, expect_err, message, owner, read,
    tool_call,
};
use durable_core::error::StoreError;
use durable_core::ids::CallId;
use durable_core::replay::ReplayClass;
use durable_core::store::{
    CallIdentity, CallKind, CallOutcome, CallStatus, CheckpointStore, FinishCall, IssueOutcome,
    NewCall,
};

/// `finish_call` records result or error, spend, MAC and `finished_at`.
pub async fn journal_finish_records_outcome(store: Arc<dyn CheckpointStore>) {
    let (session, lease) = create(&*store, &owner("w")).await;
    let ok = insert(
        &*store,
        lease.fence(),
        tool_call(&session.id, 0, "a", "h", 0),
    )
    .await;
    let bad = insert(
        &*store,
        lease.fence(),
        tool_call(&session.id, 0, "b", "h", 0),
    )
    .await;
    let result = json!({"sent": true, "id": "msg-1", "ß": [1.25, null]});
    let meta = store
        .finish_call(lease.fence(), &ok.id, completed(result.clone()), None)
        .await
        .expect("finish_call(completed)");
    assert_eq!(meta, None, "finish_call without a checkpoint returns None");
    let done = row(&*store, &ok.id).await;
    assert_eq!(done.status, CallStatus::Completed, "status after Completed");
    assert_eq!(done.result, Some(result), "result");
    assert_eq!(done.error, None, "error of a completed row");
    assert_eq!(done.spend, Some(json!({"usd": 0.5})), "spend");
    assert!(
        done.mac
            .as_deref()
            .is_some_and(|m| m != ok.mac.as_deref().unwrap_or_default()),
        "the finished row is sealed anew: {:?}",
        done.mac
    );
    assert!(
        done.finished_at.is_some_and(|f| f >= done.issued_at),
        "finished_at must be set, not before issued_at"
    );
    assert_eq!(
        (done.attempt, done.fence, &done.args),
        (ok.attempt, ok.fence, &ok.args),
        "finish changed other fields"
    );

    let error = json!({"kind": "timeout", "message": "upstream timed out"});
    store
        .finish_call(
            lease.fence(),
            &bad.id,
            FinishCall {
                outcome: CallOutcome::Failed(error.clone()),
                spend: None,
            },
            None,
        )
        .await
        .expect("finish_call(failed)");
    let failed = row(&*store, &bad.id).await;
    assert_eq!(failed.status, CallStatus::Failed, "status after Failed");
    assert_eq!(
        (failed.error, failed.result, failed.spend),
        (Some(error), None, None),
        "failed row outcome"
    );
    assert!(failed.finished_at.is_some(), "finished_at of a failed row");
    expect_err!(
        store
            .finish_call(lease.fence(), &CallId::random(), completed(json!(1)), None)
            .await,
        StoreError::CallNotFound(_),
        "finish_call of a missing call"
    );
}

/// A row with an outcome cannot be finished again, and keeps its first outcome.
pub async fn journal_finish_twice_is_refused(store: Arc<dyn CheckpointStore>) {
    let (session, lease) = create(&*store, &owner("w")).await;
    let call = insert(
        &*store,
        lease.fence(),
        tool_call(&session.id, 0, "a", "h", 0),
    )
    .await;
    store
        .finish_call(lease.fence(), &call.id, completed(json!("first")), None)
        .await
        .expect("first finish_call");
    let first = row(&*store, &call.id).await;
    let (c, status) = expect_err!(
        store.finish_call(lease.fence(), &call.id, completed(json!("second")), None).await,
        StoreError::CallNotInDoubt { call, status } => (call, status),
        "finishing a completed call again"
    );
    assert_eq!(
        (c, status.as_str()),
        (call.id.clone(), "completed"),
        "CallNotInDoubt fields"
    );
    expect_err!(
        store
            .finish_call(
                lease.fence(),
                &call.id,
                completed(json!("third")),
                Some((0, checkpoint("x", vec![message(5)])))
            )
            .await,
        StoreError::CallNotInDoubt { .. },
        "finishing a completed call again, with a checkpoint"
    );
    assert_eq!(
        row(&*store, &call.id).await,
        first,
        "a refused finish changed the row"
    );
    assert_eq!(
        read(&*store, &session.id).await.latest_version,
        0,
        "a refused finish wrote its checkpoint"
    );
}

/// `finish_call` with a checkpoint commits both or neither.
pub async fn journal_finish_with_checkpoint_is_atomic(store: Arc<dyn CheckpointStore>) {
    let (session, lease) = create(&*store, &owner("w")).await;
    let a = insert(
        &*store,
        lease.fence(),
        tool_call(&session.id, 0, "a", "h", 0),
    )
    .await;
    let meta = store
        .finish_call(
            lease.fence(),
            &a.id,
            completed(json!("ok")),
            Some((0, checkpoint("after-a", vec![message(2)]))),
        )
        .await
        .expect("finish_call with a checkpoint")
        .expect("finish_call with a checkpoint returns its meta");
    assert_eq!(
        (meta.version, meta.message_count),
        (1, 3),
        "checkpoint written by finish_call"
    );
    assert_eq!(
        row(&*store, &a.id).await.status,
        CallStatus::Completed,
        "call status after finish + checkpoint"
    );
    let cp = store
        .load_checkpoint(&session.id, None)
        .await
        .expect("load_checkpoint");
    assert_eq!(
        (cp.meta.version, cp.plan["plan"].as_str()),
        (1, Some("after-a")),
        "checkpoint of finish_call"
    );

    let b = insert(
        &*store,
        lease.fence(),
        tool_call(&session.id, 0, "b", "h", 0),
    )
    .await;
    let (expected, actual) = expect_err!(
        store
            .finish_call(lease.fence(), &b.id, completed(json!("lost")), Some((0, checkpoint("stale", vec![message(99)]))))
            .await,
        StoreError::VersionConflict { expected, actual, .. } => (expected, actual),
        "finish_call with a checkpoint expecting an old version"
    );
    assert_eq!((expected, actual), (0, 1), "VersionConflict fields");
    assert_eq!(
        row(&*store, &b.id).await,
        b,
        "a failed finish_call + checkpoint must not record the outcome"
    );
    assert_eq!(
        store
            .load_checkpoint(&session.id, None)
            .await
            .expect("load"),
        cp,
        "a failed finish_call wrote a checkpoint"
    );
    store
        .finish_call(
            lease.fence(),
            &b.id,
            completed(json!("ok")),
            Some((1, checkpoint("after-b", vec![message(3)]))),
        )
        .await
        .expect("finish_call retried with the right version");
    assert_eq!(
        values(
            &store
                .load_checkpoint(&session.id, None)
                .await
                .expect("load")
        ),
        (0..4).map(message).collect::<Vec<_>>(),
        "messages of the failed attempt leaked into the log"
    );
}

/// `reissue_call` bumps the attempt and takes the caller's token; rows with an outcome
/// are refused.
pub async fn journal_reissue_bumps_attempt(store: Arc<dyn CheckpointStore>) {
    let w = owner("w");
    let (session, first) = create(&*store, &w).await;
    let call = insert(
        &*store,
        first.fence(),
        tool_call(&session.id, 0, "a", "h", 0),
    )
    .await;
    let second = store
        .acquire_lease(&session.id, &w, LONG_TTL, MAX_ATTEMPTS)
        .await
        .expect("re-acquire");
    let again = store
        .reissue_call(second.fence(), &call.id)
        .await
        .expect("reissue_call");
    assert_eq!(again.attempt, 2, "reissue must bump attempt");
    assert_eq!(again.status, CallStatus::Issued, "a reissued row is issued");
    assert_eq!(
        again.fence, second.fence,
        "a reissued row carries the caller's token"
    );
    assert_eq!(
        (&again.id, &again.identity, &again.args),
        (&call.id, &call.identity, &call.args),
        "reissue changed the row's identity"
    );
    assert_eq!(row(&*store, &call.id).await, again, "call() after reissue");

    store
        .finish_call(second.fence(), &call.id, completed(json!(1)), None)
        .await
        .expect("finish");
    let status = expect_err!(
        store.reissue_call(second.fence(), &call.id).await,
        StoreError::CallNotInDoubt { status, .. } => status,
        "reissue_call of a completed row"
    );
    assert_eq!(status, "completed", "CallNotInDoubt status");
    let failed = insert(
        &*store,
        second.fence(),
        tool_call(&session.id, 0, "b", "h", 0),
    )
    .await;
    store
        .finish_call(
            second.fence(),
            &failed.id,
            FinishCall {
                outcome: CallOutcome::Failed(json!("e")),
                spend: None,
            },
            None,
        )
        .await
        .expect("finish(failed)");
    expect_err!(
        store.reissue_call(second.fence(), &failed.id).await,
        StoreError::CallNotInDoubt { .. },
        "reissue_call of a failed row"
    );
    assert_eq!(
        row(&*store, &failed.id).await.status,
        CallStatus::Failed,
        "a refused reissue changed the row"
    );
    expect_err!(
        store.reissue_call(second.fence(), &CallId::random()).await,
        StoreError::CallNotFound(_),
        "reissue_call of a missing row"
    );
}

/// `calls` lists rows in issue order, optionally one step; model rows round-trip.
pub async fn journal_calls_filter_and_order(store: Arc<dyn CheckpointStore>) {
    let (session, lease) = create(&*store, &owner("w")).await;
    // Names chosen so that neither id nor name order is issue order; step 2 has no
    // rows (steps only move forward, so a step's rows are contiguous).
    let plan = [
        (1, "zeta"),
        (1, "alpha"),
        (3, "alpha"),
        (3, "mid"),
        (3, "alpha"),
    ];
    let mut issued = Vec::new();
    for (i, (step, tool)) in plan.into_iter().enumerate() {
        issued.push(
            insert(
                &*store,
                lease.fence(),
                tool_call(&session.id, step, tool, "h", i as i64),
            )
            .await,
        );
    }
    let model = NewCall {
        id: CallId::random(),
        kind: CallKind::Model,
        identity: CallIdentity {
            session: session.id.clone(),
            step: 3,
            tool: "model".to_owned(),
            input_hash: String::new(),
            ordinal: 0,
        },
        class: ReplayClass::Pure,
        args: json!({"messages": 3}),
        idempotency_key: None,
        schema_hash: String::new(),
    };
    let model_row = insert(&*store, lease.fence(), model.clone()).await;
    assert_eq!(
        (
            model_row.kind,
            model_row.class,
            model_row.identity.input_hash.as_str()
        ),
        (CallKind::Model, ReplayClass::Pure, ""),
        "model row"
    );
    issued.push(model_row);

    let all = store.calls(&session.id, None).await.expect("calls(all)");
    assert_eq!(
        all.iter().map(|r| &r.id).collect::<Vec<_>>(),
        issued.iter().map(|r| &r.id).collect::<Vec<_>>(),
        "calls(None) must be in issue order"
    );
    assert_eq!(all, issued, "calls() rows differ from the inserted rows");
    let step1 = store
        .calls(&session.id, Some(1))
        .await
        .expect("calls(step 1)");
    let want: Vec<&CallId> = issued
        .iter()
        .filter(|r| r.identity.step == 1)
        .map(|r| &r.id)
        .collect();
    assert_eq!(
        step1.iter().map(|r| &r.id).collect::<Vec<_>>(),
        want,
        "calls(Some(1)) must hold step 1 only, in issue order"
    );
    assert!(
        store
            .calls(&session.id, Some(7))
            .await
            .expect("calls(step 7)")
            .is_empty(),
        "calls of an empty step"
    );
    assert!(
        store
            .calls(&session.id, Some(2))
            .await
            .expect("calls(step 2), between steps with rows")
            .is_empty(),
        "calls of an empty step between two others"
    );
    let step3 = store
        .calls(&session.id, Some(3))
        .await
        .expect("calls(step 3)");
    assert_eq!(
        step3.iter().map(|r| &r.id).collect::<Vec<_>>(),
        issued[2..].iter().map(|r| &r.id).collect::<Vec<_>>(),
        "calls(Some(3)) must hold step 3, the model row last"
    );

    // Finishing a row does not move it.
    store
        .finish_call(lease.fence(), &issued[0].id, completed(json!(0)), None)
        .await
        .expect("finish");
    let after = store.calls(&session.id, None).await.expect("calls");
    assert_eq!(
        after.iter().map(|r| &r.id).collect::<Vec<_>>(),
        issued.iter().map(|r| &r.id).collect::<Vec<_>>(),
        "finishing a row reordered calls()"
    );
    // Every row was issued; the first one is finished now.
    let issued_now = store.issued_calls(&session.id).await.expect("issued_calls");
    assert_eq!(
        issued_now.iter().map(|r| &r.id).collect::<Vec<_>>(),
        issued[1..].iter().map(|r| &r.id).collect::<Vec<_>>(),
        "issued_calls must hold exactly the rows still issued, in issue order"
    );
}

/// Steps only move forward: a call of a step before the latest row's is refused with
/// `StepClosed` by `issue_call` and `record_call`, and writes nothing; the same step and
/// later ones are accepted.
pub async fn journal_refuses_a_call_of_a_closed_step(store: Arc<dyn CheckpointStore>) {
    let (session, lease) = create(&*store, &owner("w")).await;
    insert(
        &*store,
        lease.fence(),
        tool_call(&session.id, 4, "a", "h", 0),
    )
    .await;
    let late = tool_call(&session.id, 3, "b", "h", 0);
    for (how, got) in [
        (
            "issue_call",
            store.issue_call(lease.fence(), late.clone()).await,
        ),
        (
            "record_call",
            store
                .record_call(lease.fence(), late.clone(), completed(json!(1)))
                .await,
        ),
    ] {
        match got {
            Err(StoreError::StepClosed {
                session: s,
                step,
                latest,
            }) => assert_eq!(
                (s, step, latest),
                (session.id.clone(), 3, 4),
                "{how}: StepClosed fields"
            ),
            other => panic!(
                "{how} of a call in step 3 after a row of step 4 must be StepClosed, got {other:?}"
            ),
        }
    }
    assert_eq!(
        store.calls(&session.id, None).await.expect("calls").len(),
        1,
        "a refused call of a closed step wrote a row"
    );
    insert(
        &*store,
        lease.fence(),
        tool_call(&session.id, 4, "c", "h", 0),
    )
    .await;
    insert(
        &*store,
        lease.fence(),
        tool_call(&session.id, 9, "d", "h", 0),
    )
    .await;
    assert_eq!(
        store
            .calls(&session.id, Some(4))
            .await
            .expect("step 4")
            .len(),
        2,
        "the latest step and later ones accept calls"
    );
}

/// `record_call` inserts a finished row in one step, or returns the existing row.
pub async fn journal_record_call_inserts_finished_row(store: Arc<dyn CheckpointStore>) {
    let (session, lease) = create(&*store, &owner("w")).await;
    let mut call = tool_call(&session.id, 0, "lookup", "h", 0);
    call.class = ReplayClass::Pure;
    let result = json!({"answer": 42});
    let recorded = match store
        .record_call(lease.fence(), call.clone(), completed(result.clone()))
        .await
    {
        Ok(IssueOutcome::Inserted(r)) => r,
        other => panic!("record_call of a new identity: expected Inserted, got {other:?}"),
    };
    assert_eq!(recorded.status, CallStatus::Completed, "record_call status");
    assert_eq!(
        (recorded.result.clone(), recorded.attempt, recorded.fence),
        (Some(result), 1, lease.fence),
        "record_call row"
    );
    assert!(
        recorded.finished_at.is_some(),
        "record_call sets finished_at"
    );
    assert_eq!(
        row(&*store, &call.id).await,
        recorded,
        "call() after record_call"
    );
    let mut again = call.clone();
    again.id = CallId::random();
    match store
        .record_call(lease.fence(), again, completed(json!("other")))
        .await
    {
        Ok(IssueOutcome::Existing(r)) => assert_eq!(
            r, recorded,
            "record_call of an existing identity returns it untouched"
        ),
        other => panic!("record_call of an existing identity: expected Existing, got {other:?}"),
    }
    let failing = tool_call(&session.id, 0, "lookup", "h", 1);
    match store
        .record_call(
            lease.fence(),
            failing,
            FinishCall {
                outcome: CallOutcome::Failed(json!("nope")),
                spend: None,
            },
        )
        .await
    {
        Ok(IssueOutcome::Inserted(r)) => assert_eq!(
            (r.status, r.error),
            (CallStatus::Failed, Some(json!("nope"))),
            "failed record_call"
        ),
        other => panic!("record_call(failed): expected Inserted, got {other:?}"),
    }
    let _fresh = store
        .acquire_lease(&session.id, &lease.owner, LONG_TTL, MAX_ATTEMPTS)
        .await
        .expect("re-acquire");
    expect_err!(
        store
            .record_call(
                lease.fence(),
                tool_call(&session.id, 0, "lookup", "h", 2),
                completed(json!(1))
            )
            .await,
        StoreError::LeaseLost { .. },
        "record_call with a stale token"
    );
    assert_eq!(
        store.calls(&session.id, None).await.expect("calls").len(),
        2,
        "a stale record_call wrote a row"
    );
}
