//! Cases: approvals. A requested call runs nothing until a person decides; a decision
//! is applied once (of two at once, exactly one), audited, and bound by the deadline on
//! the store's clock; a session awaiting approval holds no lease and comes back when the
//! last decision is taken.

use durable_core::store::Claim;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use super::{LONG_TTL, MAX_ATTEMPTS, create, expect_err, now, owner, read, tool_call, wait_past};
use durable_core::error::StoreError;
use durable_core::ids::CallId;
use durable_core::store::{
    ApprovalDecision, ApprovalEvent, ApprovalRequest, CallRecord, CallStatus, CheckpointStore,
    DEADLINE, DecideApproval, IssueOutcome, Lease, SessionStatus,
};

/// A request with the model's reasoning and, optionally, a deadline.
fn request(expires_in: Option<Duration>) -> ApprovalRequest {
    ApprovalRequest {
        asked_by: "tool: approval required".to_owned(),
        reasoning: Some("the customer asked for a refund of 120 EUR".to_owned()),
        expires_in,
        schema: Some(json!({"type": "object"})),
    }
}

/// Requests approval of a fresh call `tool` at step 0; panics unless it was inserted.
async fn requested(
    store: &dyn CheckpointStore,
    lease: &Lease,
    tool: &str,
    expires_in: Option<Duration>,
) -> CallRecord {
    match store
        .request_call(
            lease.fence(),
            tool_call(&lease.session, 0, tool, "h", 0),
            request(expires_in),
        )
        .await
    {
        Ok(IssueOutcome::Inserted(row)) => row,
        other => panic!("request_call must insert: {other:?}"),
    }
}

/// A decision by `alice`.
fn decide(call: &CallId, decision: ApprovalDecision) -> DecideApproval {
    DecideApproval {
        call: call.clone(),
        decision,
        by: "alice".to_owned(),
        note: Some("checked the order".to_owned()),
    }
}

fn deny(call: &CallId, reason: &str) -> DecideApproval {
    decide(
        call,
        ApprovalDecision::Deny {
            reason: reason.to_owned(),
        },
    )
}

fn approve(call: &CallId) -> DecideApproval {
    decide(call, ApprovalDecision::Approve { args: None })
}

/// A requested call is journaled (attempt 0, its approval sealed with it), not in doubt
/// and not issued, listed as pending, audited once; asking again returns it untouched.
pub async fn approval_request_runs_nothing_and_is_pending(store: Arc<dyn CheckpointStore>) {
    let (session, lease) = create(&*store, &owner("approve")).await;
    let before = now(&*store).await;
    let row = requested(&*store, &lease, "refund", Some(Duration::from_secs(3600))).await;
    assert_eq!(row.status, CallStatus::Requested);
    assert_eq!(row.attempt, 0, "nothing ran");
    let approval = row.approval.clone().expect("the row holds its approval");
    assert_eq!(approval.asked_by, "tool: approval required");
    assert_eq!(
        approval.reasoning.as_deref(),
        Some("the customer asked for a refund of 120 EUR")
    );
    assert!(approval.decision.is_none());
    let deadline = approval.deadline.expect("a deadline");
    assert!(
        (deadline - approval.requested_at - 3_600_000).abs() <= 1,
        "deadline {deadline} is an hour after {}",
        approval.requested_at
    );
    assert!(approval.requested_at >= before - super::CLOCK_SLACK_MS);

    let again = store
        .request_call(
            lease.fence(),
            tool_call(&session.id, 0, "refund", "h", 0),
            request(None),
        )
        .await
        .expect("request again");
    assert_eq!(again, IssueOutcome::Existing(row.clone()), "insert-or-get");

    let pending = store
        .pending_approvals(Some(&session.id))
        .await
        .expect("pending");
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].call, row);
    assert!(!pending[0].expired);
    let everywhere = store.pending_approvals(None).await.expect("pending");
    assert!(everywhere.iter().any(|p| p.call.id == row.id));
    assert!(
        store
            .pending_approvals(Some(&super::session_id()))
            .await
            .expect("pending of an unknown session")
            .is_empty()
    );

    assert_eq!(
        store.calls(&session.id, None).await.expect("calls"),
        vec![row.clone()]
    );
    assert!(
        store
            .issued_calls(&session.id)
            .await
            .expect("issued")
            .is_empty()
    );
    store.release_lease(&lease).await.expect("release");
    assert!(
        store
            .in_doubt(Some(&session.id))
            .await
            .expect("in doubt")
            .is_empty(),
        "a requested call ran nothing: it is never in doubt"
    );

    let log = store.approvals(&session.id).await.expect("approval log");
    assert_eq!(log.len(), 1);
    assert_eq!(log[0].event, ApprovalEvent::Requested);
    assert_eq!(log[0].position, 1);
    assert_eq!(log[0].call, row.id);
    assert_eq!(log[0].by, "tool: approval required");
    assert_eq!(log[0].note, approval.reasoning);
}

/// An approval with edited arguments is recorded on the row and audited (before and
/// after); the row is issued once, with its approval kept, and then finished.
pub async fn approval_with_edited_args_is_issued_once(store: Arc<dyn CheckpointStore>) {
    let (session, lease) = create(&*store, &owner("approve")).await;
    let row = requested(&*store, &lease, "refund", None).await;
    expect_err!(
        store.reissue_call(lease.fence(), &row.id).await,
        StoreError::CallNotInDoubt { .. } => (),
        "a requested call cannot be issued before a decision"
    );
    let edited = json!({"to": "a@example.com", "body": "hello", "n": 0, "amount": 100});
    let approved = store
        .decide_approval(decide(
            &row.id,
            ApprovalDecision::Approve {
                args: Some(edited.clone()),
            },
        ))
        .await
        .expect("approve");
    assert_eq!(approved.status, CallStatus::Approved);
    assert_eq!(
        approved.args, row.args,
        "the identity keeps the requested arguments"
    );
    let approval = approved.approval.clone().expect("approval");
    assert_eq!(approval.edited_args(), Some(&edited));
    let decided = approval.decision.expect("decided");
    assert_eq!(decided.by, "alice");
    assert_eq!(decided.note.as_deref(), Some("checked the order"));
    assert!(
        store
            .pending_approvals(Some(&session.id))
            .await
            .expect("pending")
            .is_empty()
    );
    let log = store.approvals(&session.id).await.expect("log");
    assert_eq!(log.len(), 2);
    assert_eq!(log[1].event, ApprovalEvent::Approved);
    assert_eq!(log[1].position, 2);
    assert_eq!(log[1].args_before.as_ref(), Some(&row.args));
    assert_eq!(log[1].args_after.as_ref(), Some(&edited));

    let issued = store
        .reissue_call(lease.fence(), &row.id)
        .await
        .expect("issue the approved call");
    assert_eq!(issued.status, CallStatus::Issued);
    assert_eq!(issued.attempt, 1);
    assert_eq!(issued.approval, approved.approval, "the approval stays");
    assert_eq!(
        store.issued_calls(&session.id).await.expect("issued"),
        vec![issued.clone()]
    );
    store
        .finish_call(
            lease.fence(),
            &row.id,
            super::completed(json!("refunded")),
            None,
        )
        .await
        .expect("finish");
    let done = store.call(&row.id).await.expect("call");
    assert_eq!(done.status, CallStatus::Completed);
    assert_eq!(done.approval, approved.approval);
    expect_err!(
        store.decide_approval(deny(&row.id, "too late")).await,
        StoreError::NotAwaitingApproval { status, .. } => assert_eq!(status, "completed"),
        "a finished call takes no decision"
    );
    let log = store.approvals(&session.id).await.expect("log");
    assert_eq!(
        log.iter()
            .map(|e| (e.event, e.by.as_str()))
            .collect::<Vec<_>>(),
        [
            (ApprovalEvent::Requested, "tool: approval required"),
            (ApprovalEvent::Approved, "alice"),
            (ApprovalEvent::Issued, "worker"),
        ],
        "the issue of the approved call is in the log"
    );
}

/// A denial is the call's recorded outcome (what the model reads), audited with its
/// reason; a denial without a reason is refused and changes nothing.
pub async fn approval_denial_is_the_recorded_outcome(store: Arc<dyn CheckpointStore>) {
    let (session, lease) = create(&*store, &owner("deny")).await;
    let row = requested(&*store, &lease, "refund", None).await;
    expect_err!(
        store.decide_approval(deny(&row.id, "  ")).await,
        StoreError::EmptyDenialReason { .. } => (),
        "a denial without a reason"
    );
    assert_eq!(store.call(&row.id).await.expect("call"), row);
    let denied = store
        .decide_approval(deny(&row.id, "refunds above 100 EUR need a manager"))
        .await
        .expect("deny");
    assert_eq!(denied.status, CallStatus::Denied);
    assert!(denied.status.has_outcome());
    let error = denied
        .error
        .clone()
        .expect("the denial is the recorded error");
    assert_eq!(
        error["message"],
        "not run: denied by alice: refunds above 100 EUR need a manager"
    );
    assert!(denied.finished_at.is_some());
    expect_err!(
        store.reissue_call(lease.fence(), &row.id).await,
        StoreError::CallNotInDoubt { .. } => (),
        "a denied call never runs"
    );
    let log = store.approvals(&session.id).await.expect("log");
    assert_eq!(log.len(), 2);
    assert_eq!(log[1].event, ApprovalEvent::Denied);
    assert_eq!(
        log[1].note.as_deref(),
        Some("refunds above 100 EUR need a manager")
    );
    assert_eq!(log[1].args_after, None);
}

/// Of two decisions on one call taken at once, exactly one is applied; the other is
/// refused with `NotAwaitingApproval`, and only the winner is audited.
pub async fn approval_two_decisions_at_once_one_wins(store: Arc<dyn CheckpointStore>) {
    let (session, lease) = create(&*store, &owner("race")).await;
    for round in 0..8_i64 {
        let call = tool_call(&session.id, 0, "refund", "h", round);
        let row = match store
            .request_call(lease.fence(), call, request(None))
            .await
            .expect("request")
        {
            IssueOutcome::Inserted(row) => row,
            other => panic!("round {round}: {other:?}"),
        };
        let (a, b) = tokio::join!(
            store.decide_approval(approve(&row.id)),
            store.decide_approval(deny(&row.id, "no"))
        );
        let won = match (&a, &b) {
            (Ok(won), Err(StoreError::NotAwaitingApproval { .. }))
            | (Err(StoreError::NotAwaitingApproval { .. }), Ok(won)) => won.clone(),
            other => panic!("round {round}: exactly one decision must win: {other:?}"),
        };
        assert_eq!(store.call(&row.id).await.expect("call"), won);
    }
    // Eight requests and eight decisions, no more.
    let log = store.approvals(&session.id).await.expect("log");
    assert_eq!(log.len(), 16);
    assert!(
        log.iter()
            .enumerate()
            .all(|(i, e)| e.position == i64::try_from(i + 1).expect("position"))
    );
}

/// The deadline is the store's clock's: before it, an expiry is refused; after it, an
/// approval or denial is refused, the pending listing says so, and an expiry denies the
/// call by its deadline. A request without a deadline never expires.
pub async fn approval_deadline_is_kept_on_the_store_clock(store: Arc<dyn CheckpointStore>) {
    let (session, lease) = create(&*store, &owner("deadline")).await;
    let open = requested(&*store, &lease, "open", None).await;
    expect_err!(
        store
            .decide_approval(decide(&open.id, ApprovalDecision::Expire))
            .await,
        StoreError::ApprovalNotExpired { .. } => (),
        "a request without a deadline does not expire"
    );
    let row = requested(
        &*store,
        &lease,
        "refund",
        Some(Duration::from_millis(1_500)),
    )
    .await;
    let deadline = row
        .approval
        .as_ref()
        .and_then(|a| a.deadline)
        .expect("deadline");
    if now(&*store).await < deadline {
        expect_err!(
            store
                .decide_approval(decide(&row.id, ApprovalDecision::Expire))
                .await,
            StoreError::ApprovalNotExpired { .. } => (),
            "an expiry before the deadline"
        );
    }
    wait_past(&*store, deadline).await;
    let pending = store
        .pending_approvals(Some(&session.id))
        .await
        .expect("pending");
    let expired: Vec<(CallId, bool)> = pending
        .iter()
        .map(|p| (p.call.id.clone(), p.expired))
        .collect();
    assert_eq!(
        expired,
        vec![(open.id.clone(), false), (row.id.clone(), true)]
    );
    expect_err!(
        store.decide_approval(approve(&row.id)).await,
        StoreError::ApprovalExpired { deadline: d, .. } => assert_eq!(d, deadline),
        "an approval after the deadline"
    );
    expect_err!(
        store.decide_approval(deny(&row.id, "no")).await,
        StoreError::ApprovalExpired { .. } => (),
        "a denial after the deadline"
    );
    let mut expiry = decide(&row.id, ApprovalDecision::Expire);
    expiry.by = DEADLINE.to_owned();
    expiry.note = None;
    let expired = store.decide_approval(expiry).await.expect("expire");
    assert_eq!(expired.status, CallStatus::Denied);
    let message = expired.error.as_ref().expect("error")["message"].clone();
    assert_eq!(
        message,
        format!("not run: the approval request expired at {deadline} ms undecided")
    );
    let log = store.approvals(&session.id).await.expect("log");
    assert_eq!(
        log.iter().map(|e| e.event).collect::<Vec<_>>(),
        [
            ApprovalEvent::Requested,
            ApprovalEvent::Requested,
            ApprovalEvent::Expired
        ]
    );
    assert_eq!(log[2].by, DEADLINE);
}

/// A session awaiting approval holds no lease (its former token writes nothing) and is
/// not resumable; the last decision makes it `active` again, and the next take is not a
/// recovery. Parking with nothing requested leaves it `active`, released.
pub async fn approval_awaiting_session_holds_no_lease(store: Arc<dyn CheckpointStore>) {
    let (session, lease) = create(&*store, &owner("await")).await;
    let first = requested(&*store, &lease, "refund", None).await;
    let second = store
        .request_call(
            lease.fence(),
            tool_call(&session.id, 0, "email", "h", 0),
            request(None),
        )
        .await
        .expect("second request");
    let IssueOutcome::Inserted(second) = second else {
        panic!("a second call of the turn: {second:?}");
    };
    store
        .set_status(
            lease.fence(),
            SessionStatus::AwaitingApproval,
            Some("2 calls await approval"),
        )
        .await
        .expect("park for approval");
    let parked = read(&*store, &session.id).await;
    assert_eq!(parked.status, SessionStatus::AwaitingApproval);
    assert!(
        parked.fence > lease.fence,
        "the former holder's token is stale"
    );
    expect_err!(
        store
            .reissue_call(lease.fence(), &first.id)
            .await,
        StoreError::LeaseLost { .. } => (),
        "the former holder writes nothing"
    );
    expect_err!(
        store
            .acquire_lease(&session.id, "other", LONG_TTL, MAX_ATTEMPTS)
            .await,
        StoreError::NotResumable { status, .. } => assert_eq!(status, "awaiting_approval"),
        "a session awaiting approval is not resumable"
    );
    assert!(
        store
            .claim_expired(&Claim::new("other", LONG_TTL, MAX_ATTEMPTS))
            .await
            .expect("claim")
            .is_none_or(|l| l.session != session.id),
        "nor claimed for recovery"
    );
    store
        .decide_approval(approve(&first.id))
        .await
        .expect("approve");
    assert_eq!(
        read(&*store, &session.id).await.status,
        SessionStatus::AwaitingApproval,
        "one decision is still awaited"
    );
    store
        .decide_approval(deny(&second.id, "not this customer"))
        .await
        .expect("deny");
    let back = read(&*store, &session.id).await;
    assert_eq!(back.status, SessionStatus::Active);
    assert_eq!(back.status_reason, None);
    let taken = store
        .acquire_lease(&session.id, "other", LONG_TTL, MAX_ATTEMPTS)
        .await
        .expect("resumable again");
    assert_eq!(
        read(&*store, &session.id).await.recovery_attempts,
        0,
        "taking it back is not a recovery"
    );

    // Parked for approval with every request decided already: stays active, released.
    store
        .set_status(taken.fence(), SessionStatus::AwaitingApproval, None)
        .await
        .expect("park with nothing pending");
    let after = read(&*store, &session.id).await;
    assert_eq!(after.status, SessionStatus::Active);
    assert!(after.fence > taken.fence);
    store
        .acquire_lease(&session.id, "third", LONG_TTL, MAX_ATTEMPTS)
        .await
        .expect("taken at once: the lease was released");
}

/// On replay, the runtime never runs a requested call (whatever its class: here a `pure`
/// one, which an in-doubt row would re-run): the call returns `AwaitingApproval` with the
/// row's status, the same row each time it is asked, and the tool body does not run.
pub async fn runtime_requested_calls_are_not_run(store: Arc<dyn CheckpointStore>) {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::runtime::{call, runtime, spec, start};

    use durable_core::error::DurableError;
    use durable_core::journal::CallError;
    use durable_core::replay::ReplayClass;
    use durable_core::store::{CallIdentity, CallKind, NewCall};

    let (durable, _) = runtime(&store, "approval");
    let session = start(&durable).await;
    let journal = session.journal();
    let tool = spec("lookup", ReplayClass::Pure);
    let new = NewCall {
        id: CallId::random(),
        kind: CallKind::Tool,
        identity: CallIdentity {
            session: session.id().clone(),
            step: journal.step(),
            tool: "lookup".to_owned(),
            input_hash: durable_core::canonical::input_hash(&json!({ "n": 1 })).expect("hash"),
            ordinal: 0,
        },
        class: ReplayClass::Pure,
        args: json!({ "n": 1 }),
        idempotency_key: None,
        schema_hash: tool.fingerprint.clone(),
    };
    let row = match store
        .request_call(journal.lease().fence(), new, request(None))
        .await
        .expect("request")
    {
        IssueOutcome::Inserted(row) => row,
        other => panic!("{other:?}"),
    };
    // The worker that journaled the request stops; the next one replays the step from
    // the store.
    let id = session.id().clone();
    drop(session);
    let (resumed, _) = super::runtime::take_over(&store, &id, "next").await;
    let session = resumed.session;
    let runs = Arc::new(AtomicUsize::new(0));
    for attempt in 0..2 {
        // Asked again in the same attempt: the same row, not the next ordinal.
        let err = call(&session, &tool, 1, None, &runs)
            .await
            .expect_err("not run");
        match err {
            CallError::Durable(DurableError::AwaitingApproval { call, status, .. }) => {
                assert_eq!(call, row.id);
                assert_eq!(status, "requested");
            }
            other => panic!("ask {attempt}: expected AwaitingApproval, got {other:?}"),
        }
        assert_eq!(runs.load(Ordering::SeqCst), 0, "the tool did not run");
    }
}

/// A session that ended has no pending approvals: its requests can never run, so the
/// inbox does not offer them.
pub async fn approval_ended_sessions_have_none_pending(store: Arc<dyn CheckpointStore>) {
    let (session, lease) = create(&*store, &owner("ended")).await;
    let row = requested(&*store, &lease, "refund", None).await;
    let pending = store
        .pending_approvals(Some(&session.id))
        .await
        .expect("pending");
    assert_eq!(pending.len(), 1);
    store
        .set_status(
            lease.fence(),
            SessionStatus::Cancelled,
            Some("customer left"),
        )
        .await
        .expect("cancel");
    let pending = store
        .pending_approvals(Some(&session.id))
        .await
        .expect("pending");
    assert!(pending.is_empty(), "{pending:?}");
    let everywhere = store.pending_approvals(None).await.expect("pending");
    assert!(everywhere.iter().all(|p| p.call.id != row.id));
}
