//! Approvals on SQLite (schema 6), behind the store's back: a requested row's approval
//! and the approval log are sealed, so a change made with plain SQL (the approval
//! removed or edited, a status moved on, an audit row deleted or edited, the head's
//! count lowered) is `Tampered` on the next read, never taken as a decision.

use durable_core::store::{ApprovalStore, JournalStore, LeaseStore, SessionStore};
use std::path::Path;
use std::time::Duration;

use durable_core::store::{
    ApprovalDecision, ApprovalRequest, CallIdentity, CallKind, DecideApproval, IssueOutcome,
    NewCall, NewCheckpoint, NewSession,
};
use durable_core::{CallId, ReplayClass, SessionId, StoreError};
use durable_sqlite::{SqliteStore, SqliteStoreOptions};
use serde_json::{Value, json};
use sqlx::{ConnectOptions, SqliteConnection};

async fn raw(path: &Path) -> SqliteConnection {
    sqlx::sqlite::SqliteConnectOptions::new()
        .filename(path)
        .busy_timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect("open a raw connection")
}

/// A store with one session holding a requested call (`pending`) and a decided one
/// (`decided`, approved); returns the session and the two calls.
async fn journal(store: &SqliteStore) -> (SessionId, CallId, CallId) {
    let id = SessionId::random();
    let (_, lease) = store
        .create_session(NewSession {
            id: id.clone(),
            app_version: "v1".into(),
            metadata: json!({}),
            owner: "w".into(),
            lease_ttl: Duration::from_secs(600),
            initial: NewCheckpoint {
                messages: vec![json!({"role": "user"})],
                plan: json!({}),
                budget: json!({}),
                state: Value::Null,
                wake_at: None,
            },
            queue: None,
        })
        .await
        .expect("create");
    let mut calls = Vec::new();
    for tool in ["refund", "email"] {
        let call = NewCall {
            id: CallId::random(),
            kind: CallKind::Tool,
            identity: CallIdentity {
                session: id.clone(),
                step: 1,
                tool: tool.into(),
                input_hash: "h".into(),
                ordinal: 0,
            },
            class: ReplayClass::UnsafeOnReplay,
            args: json!({ "amount": 120 }),
            idempotency_key: None,
            schema_hash: "s".into(),
        };
        let request = ApprovalRequest {
            asked_by: "tool: approval required".into(),
            reasoning: Some("a refund".into()),
            expires_in: None,
            schema: None,
        };
        match store
            .request_call(lease.fence(), call, request)
            .await
            .expect("request")
        {
            IssueOutcome::Inserted(row) => calls.push(row.id),
            other => panic!("{other:?}"),
        }
    }
    store
        .decide_approval(DecideApproval {
            call: calls[1].clone(),
            decision: ApprovalDecision::Approve {
                args: Some(json!({ "amount": 100 })),
            },
            by: "alice".into(),
            note: None,
        })
        .await
        .expect("approve");
    (id, calls[0].clone(), calls[1].clone())
}

/// What the store reads of the session: its pending approvals, its approval log and its
/// whole journal; the first failure, if any.
async fn reads(store: &SqliteStore, id: &SessionId) -> Result<(), StoreError> {
    store.pending_approvals(Some(id)).await?;
    store.approvals(id).await?;
    store.calls(id, None).await?;
    Ok(())
}

#[tokio::test]
async fn approvals_changed_behind_the_stores_back_are_tampered() {
    let cases: [(&str, &str); 8] = [
        (
            "the approval of a requested row removed",
            "UPDATE durable_tool_calls SET approval = NULL WHERE id = :pending",
        ),
        (
            "the reasoning of a requested row edited",
            "UPDATE durable_tool_calls \
             SET approval = json_set(approval, '$.reasoning', 'an urgent refund') \
             WHERE id = :pending",
        ),
        (
            "a requested row shown as approved",
            "UPDATE durable_tool_calls SET status = 'approved' WHERE id = :pending",
        ),
        (
            "the edited arguments of an approval changed",
            "UPDATE durable_tool_calls \
             SET approval = json_set(approval, '$.decision.args.amount', 1000) \
             WHERE id = :decided",
        ),
        (
            "an audit row deleted",
            "DELETE FROM durable_approvals WHERE position = 3",
        ),
        (
            "an audit row's actor edited",
            "UPDATE durable_approvals SET actor = 'mallory' WHERE position = 3",
        ),
        (
            "the head's count of audit rows lowered with the last row",
            "DELETE FROM durable_approvals WHERE position = 3; \
             UPDATE durable_sessions SET approvals = 2",
        ),
        (
            "the head's count of audit rows set to 0 with every row",
            "DELETE FROM durable_approvals; UPDATE durable_sessions SET approvals = 0",
        ),
    ];
    for (case, sql) in cases {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("durable.db");
        let store = SqliteStore::connect_with(SqliteStoreOptions::file(&path))
            .await
            .expect("open");
        let (id, pending, decided) = journal(&store).await;
        reads(&store, &id).await.expect("untouched reads");
        let sql = sql
            .replace(":pending", &format!("'{pending}'"))
            .replace(":decided", &format!("'{decided}'"));
        let mut conn = raw(&path).await;
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&mut conn)
            .await
            .expect(case);
        match reads(&store, &id).await {
            Err(StoreError::Tampered { .. }) => {}
            other => panic!("{case}: expected Tampered, got {other:?}"),
        }
        store.close().await;
    }
}

/// The columns of a journal row that a decision, an issue or an outcome changes, as
/// stored.
const STATE: &str = "status, result, error, spend, approval, mac, finished_at, attempt, fence";

/// Saves the state columns of row `id` under `name` (a table of the raw connection).
async fn save(conn: &mut SqliteConnection, name: &str, id: &CallId) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {name} AS SELECT {STATE} FROM durable_tool_calls WHERE id = '{id}'"
    )))
    .execute(conn)
    .await
    .expect("save the row");
}

/// Puts the saved state columns back on row `id`: an older sealed version of the row.
async fn restore(conn: &mut SqliteConnection, name: &str, id: &CallId) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "UPDATE durable_tool_calls SET ({STATE}) = (SELECT {STATE} FROM {name}) \
         WHERE id = '{id}'"
    )))
    .execute(conn)
    .await
    .expect("restore the row");
}

/// An older sealed version of a row put back is refused where it would act: an approved
/// call's row restored after it ran is not issued again, and a denied call's row
/// restored as requested is not approved. (Each row alone is sealed; the approval log,
/// append-only, says where the call stands.)
#[tokio::test]
async fn an_older_version_of_a_decided_row_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("durable.db");
    let store = SqliteStore::connect_with(SqliteStoreOptions::file(&path))
        .await
        .expect("open");
    let (id, pending, approved) = journal(&store).await;
    let mut conn = raw(&path).await;
    save(&mut conn, "approved_version", &approved).await;
    save(&mut conn, "requested_version", &pending).await;
    let lease = store
        .acquire_lease(&id, "w", Duration::from_secs(600), 5)
        .await
        .expect("lease");
    store
        .reissue_call(lease.fence(), &approved)
        .await
        .expect("issue the approved call");
    store
        .finish_call(
            lease.fence(),
            &approved,
            durable_core::store::FinishCall {
                outcome: durable_core::store::CallOutcome::Completed(json!("refunded")),
                spend: None,
            },
            None,
        )
        .await
        .expect("finish");
    store
        .decide_approval(DecideApproval {
            call: pending.clone(),
            decision: ApprovalDecision::Deny {
                reason: "no".into(),
            },
            by: "alice".into(),
            note: None,
        })
        .await
        .expect("deny");

    restore(&mut conn, "approved_version", &approved).await;
    match store.reissue_call(lease.fence(), &approved).await {
        Err(StoreError::Tampered { .. }) => {}
        other => panic!("an approved call that ran must not be issued again: {other:?}"),
    }
    restore(&mut conn, "requested_version", &pending).await;
    match store
        .decide_approval(DecideApproval {
            call: pending.clone(),
            decision: ApprovalDecision::Approve { args: None },
            by: "mallory".into(),
            note: None,
        })
        .await
    {
        Err(StoreError::Tampered { .. }) => {}
        other => panic!("a denied call must not be approved: {other:?}"),
    }
    let log = store.approvals(&id).await.expect("the log");
    assert!(
        log.iter().all(|e| e.by != "mallory"),
        "nothing of the refused decision was written"
    );
}
