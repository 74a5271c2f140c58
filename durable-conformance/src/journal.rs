//! Cases: inserting journal rows (identity, concurrency, idempotency keys).

use std::sync::Arc;

use serde_json::json;

use super::{CLOCK_SLACK_MS, completed, create, expect_err, now, owner, tool_call};
use durable_core::error::StoreError;
use durable_core::ids::CallId;
use durable_core::replay::ReplayClass;
use durable_core::store::{
    CallKind, CallRecord, CallStatus, CheckpointStore, Fence, IssueOutcome, NewCall,
};

/// Issues `call`, which must be inserted.
pub(super) async fn insert(
    store: &dyn CheckpointStore,
    fence: Fence<'_>,
    call: NewCall,
) -> CallRecord {
    match store.issue_call(fence, call.clone()).await {
        Ok(IssueOutcome::Inserted(row)) => row,
        other => panic!(
            "issue_call({:?}) must insert a new row, got {other:?}",
            call.identity
        ),
    }
}

/// Reads a journal row that must exist.
pub(super) async fn row(store: &dyn CheckpointStore, id: &CallId) -> CallRecord {
    store
        .call(id)
        .await
        .unwrap_or_else(|e| panic!("call(`{id}`) failed: {e:?}"))
}

/// `issue_call` inserts an *issued* row with attempt 1 and the caller's token, and `call`
/// reads back every field.
pub async fn journal_issue_inserts_issued_row(store: Arc<dyn CheckpointStore>) {
    let (session, lease) = create(&*store, &owner("w")).await;
    let mut call = tool_call(&session.id, 3, "send_email", "sha256:v1:abc", 0);
    call.class = ReplayClass::IdempotentWithKey;
    call.idempotency_key = Some(format!("key-{}", call.id));
    call.args = json!({"to": "ü@example.com", "body": {"z": 1, "a": [1.5, "🦀"]}, "secret": "***"});
    let before = now(&*store).await;
    let inserted = insert(&*store, lease.fence(), call.clone()).await;
    let after = now(&*store).await;
    assert_eq!(inserted.id, call.id, "inserted row id");
    assert_eq!(inserted.kind, CallKind::Tool, "kind");
    assert_eq!(inserted.identity, call.identity, "identity");
    assert_eq!(inserted.class, ReplayClass::IdempotentWithKey, "class");
    assert_eq!(inserted.status, CallStatus::Issued, "a new row is issued");
    assert_eq!(inserted.args, call.args, "args");
    assert_eq!(
        inserted.idempotency_key, call.idempotency_key,
        "idempotency_key"
    );
    assert_eq!(inserted.schema_hash, call.schema_hash, "schema_hash");
    assert_eq!(
        (&inserted.result, &inserted.error, &inserted.spend),
        (&None, &None, &None),
        "an issued row has no outcome"
    );
    assert_eq!(inserted.attempt, 1, "attempt of a new row");
    assert_eq!(
        inserted.fence, lease.fence,
        "row fence must be the issuing token"
    );
    assert!(
        (before - CLOCK_SLACK_MS..=after + CLOCK_SLACK_MS).contains(&inserted.issued_at),
        "issued_at {} not within the store clock readings {before}..{after}",
        inserted.issued_at
    );
    assert_eq!(inserted.finished_at, None, "finished_at of an issued row");
    assert_eq!(
        row(&*store, &call.id).await,
        inserted,
        "call() differs from the inserted row"
    );
    expect_err!(
        store.call(&CallId::random()).await,
        StoreError::CallNotFound(_),
        "call() of a missing id"
    );
}

/// The same identity again returns the existing row untouched.
pub async fn journal_issue_same_identity_returns_existing(store: Arc<dyn CheckpointStore>) {
    let (session, lease) = create(&*store, &owner("w")).await;
    let first = insert(
        &*store,
        lease.fence(),
        tool_call(&session.id, 1, "pay", "h", 0),
    )
    .await;
    let mut again = tool_call(&session.id, 1, "pay", "h", 0);
    again.args = json!({"different": "args"});
    again.schema_hash = "schema-2".to_owned();
    match store.issue_call(lease.fence(), again.clone()).await {
        Ok(IssueOutcome::Existing(existing)) => assert_eq!(
            existing, first,
            "Existing must return the stored row untouched"
        ),
        other => panic!("issue_call with an existing identity: expected Existing, got {other:?}"),
    }
    expect_err!(
        store.call(&again.id).await,
        StoreError::CallNotFound(_),
        "the id of a deduplicated issue must not exist"
    );
    assert_eq!(
        store.calls(&session.id, None).await.expect("calls"),
        vec![first],
        "one row per identity"
    );
}

/// Of 20 concurrent `issue_call`s with one identity, exactly one inserts.
pub async fn journal_concurrent_issue_inserts_once(store: Arc<dyn CheckpointStore>) {
    let (session, lease) = create(&*store, &owner("w")).await;
    let lease = Arc::new(lease);
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let store = Arc::clone(&store);
        let lease = Arc::clone(&lease);
        let call = tool_call(&session.id, 0, "charge", "same", 0);
        tasks.push(tokio::spawn(async move {
            store.issue_call(lease.fence(), call).await
        }));
    }
    let mut inserted = Vec::new();
    let mut existing = Vec::new();
    for task in tasks {
        match task.await.expect("issue task panicked") {
            Ok(IssueOutcome::Inserted(r)) => inserted.push(r),
            Ok(IssueOutcome::Existing(r)) => existing.push(r),
            Err(e) => panic!("concurrent issue_call failed: {e:?}"),
        }
    }
    assert_eq!(
        inserted.len(),
        1,
        "exactly one of 20 concurrent issue_calls must insert"
    );
    for e in &existing {
        assert_eq!(
            e.id, inserted[0].id,
            "Existing must return the inserted row"
        );
    }
    assert_eq!(
        store.calls(&session.id, None).await.expect("calls").len(),
        1,
        "rows after the race"
    );
}

/// Step, tool, input hash and ordinal each make a separate identity.
pub async fn journal_identity_components_are_distinct(store: Arc<dyn CheckpointStore>) {
    let (session, lease) = create(&*store, &owner("w")).await;
    let (other, other_lease) = create(&*store, &owner("w2")).await;
    let base = insert(
        &*store,
        lease.fence(),
        tool_call(&session.id, 0, "t", "h", 0),
    )
    .await;
    // The later step last: steps only move forward.
    let variants = [
        tool_call(&session.id, 0, "t", "h", 1),
        tool_call(&session.id, 0, "u", "h", 0),
        tool_call(&session.id, 0, "t", "h2", 0),
        tool_call(&session.id, 1, "t", "h", 0),
    ];
    for call in variants {
        let r = insert(&*store, lease.fence(), call).await;
        assert_ne!(r.id, base.id, "a distinct identity got the base row");
    }
    let theirs = insert(
        &*store,
        other_lease.fence(),
        tool_call(&other.id, 0, "t", "h", 0),
    )
    .await;
    assert_eq!(
        store.calls(&session.id, None).await.expect("calls").len(),
        5,
        "rows of the session"
    );
    assert_eq!(
        store.calls(&other.id, None).await.expect("calls").len(),
        1,
        "rows of the other session"
    );

    // A fence proves the right to write one session only.
    let foreign = tool_call(&other.id, 9, "t", "h", 0);
    let result = store.issue_call(lease.fence(), foreign.clone()).await;
    assert!(
        result.is_err(),
        "issue_call of a row of session B under a fence of session A must fail, got {result:?}"
    );
    expect_err!(
        store.call(&foreign.id).await,
        StoreError::CallNotFound(_),
        "a refused cross-session issue wrote its row"
    );
    let result = store
        .finish_call(lease.fence(), &theirs.id, completed(json!("x")), None)
        .await;
    assert!(
        result.is_err(),
        "finish_call of a row of session B under a fence of session A must fail, got {result:?}"
    );
    assert_eq!(
        row(&*store, &theirs.id).await,
        theirs,
        "a refused cross-session finish changed the row"
    );
    let result = store.reissue_call(lease.fence(), &theirs.id).await;
    assert!(
        result.is_err(),
        "reissue_call of a row of session B under a fence of session A must fail, got {result:?}"
    );
    assert_eq!(
        row(&*store, &theirs.id).await,
        theirs,
        "a refused cross-session reissue changed the row"
    );
}

/// An idempotency key reused by the same tool with another input hash is refused and
/// writes nothing; the same key with the same hash (another step) is allowed.
pub async fn journal_idempotency_key_conflict(store: Arc<dyn CheckpointStore>) {
    let (session, lease) = create(&*store, &owner("w")).await;
    let key = format!("pay-{}", uuid::Uuid::new_v4());
    let keyed = |step: i64, tool: &str, hash: &str, ordinal: i64| {
        let mut c = tool_call(&session.id, step, tool, hash, ordinal);
        c.class = ReplayClass::IdempotentWithKey;
        c.idempotency_key = Some(key.clone());
        c
    };
    let first = insert(&*store, lease.fence(), keyed(0, "pay", "amount-10", 0)).await;
    let conflicting = keyed(0, "pay", "amount-99", 0);
    let (tool, k, existing) = expect_err!(
        store.issue_call(lease.fence(), conflicting.clone()).await,
        StoreError::IdempotencyConflict { tool, key, existing } => (tool, key, existing),
        "issue_call reusing an idempotency key with another input_hash"
    );
    assert_eq!(
        (tool.as_str(), k.as_str(), &existing),
        ("pay", key.as_str(), &first.id),
        "IdempotencyConflict fields"
    );
    expect_err!(
        store.call(&conflicting.id).await,
        StoreError::CallNotFound(_),
        "a refused issue wrote its row"
    );
    assert_eq!(
        store.calls(&session.id, None).await.expect("calls").len(),
        1,
        "a refused issue wrote a row"
    );

    // Same key, same hash, another step: the upstream sees the same request again.
    insert(&*store, lease.fence(), keyed(1, "pay", "amount-10", 0)).await;
    // The key belongs to a tool: another tool may use the same string.
    insert(&*store, lease.fence(), keyed(1, "refund", "amount-99", 0)).await;
    // Keys are upstream deduplication keys, so the check spans sessions.
    let (other, other_lease) = create(&*store, &owner("w2")).await;
    let mut cross = tool_call(&other.id, 0, "pay", "amount-77", 0);
    cross.idempotency_key = Some(key.clone());
    let existing = expect_err!(
        store.issue_call(other_lease.fence(), cross).await,
        StoreError::IdempotencyConflict { existing, .. } => existing,
        "issue_call in another session reusing an idempotency key with another input_hash"
    );
    assert_eq!(
        existing, first.id,
        "IdempotencyConflict across sessions names the holder"
    );
    assert!(
        store
            .calls(&other.id, None)
            .await
            .expect("calls")
            .is_empty(),
        "a refused issue wrote a row"
    );
}
