//! Reads that do not grow with the session: one step's rows (`calls(session, Some(step))`)
//! and the issued rows (`issued_calls`) are checked complete without reading the rest of
//! the journal, and still catch rows deleted behind the store's back. Also the upgrade of
//! a database written by schema version 2 (migration 3 adds the indexes these reads use).

use durable_core::store::{JournalStore, SessionStore};
use std::borrow::Cow;
use std::time::Duration;

use durable_core::StoreError;
use durable_core::ids::{CallId, SessionId};
use durable_core::integrity::Keyring;
use durable_core::replay::ReplayClass;
use durable_core::store::{
    CallIdentity, CallKind, CallOutcome, CallStatus, Fence, FinishCall, IssueOutcome, Lease,
    NewCall, NewCheckpoint, NewSession,
};
use durable_postgres::testing::{TestDatabase, test_database};
use durable_postgres::{PostgresStore, PostgresStoreOptions, migrations};
use serde_json::{Value, json};
use sqlx::postgres::PgPool;

async fn raw(db: &TestDatabase) -> PgPool {
    PgPool::connect(db.url())
        .await
        .expect("raw pool on the test database")
}

async fn session(store: &PostgresStore) -> (SessionId, Lease) {
    let id = SessionId::random();
    let (_, lease) = store
        .create_session(NewSession {
            id: id.clone(),
            app_version: "v1".into(),
            metadata: json!({}),
            owner: "w".into(),
            lease_ttl: Duration::from_secs(600),
            initial: NewCheckpoint {
                messages: vec![],
                plan: json!({}),
                budget: json!({}),
                state: Value::Null,
                wake_at: None,
            },
            queue: None,
        })
        .await
        .expect("create");
    (id, lease)
}

fn call(session: &SessionId, step: i64, tool: &str, ordinal: i64) -> NewCall {
    NewCall {
        id: CallId::random(),
        kind: CallKind::Tool,
        identity: CallIdentity {
            session: session.clone(),
            step,
            tool: tool.into(),
            input_hash: "h".into(),
            ordinal,
        },
        class: ReplayClass::UnsafeOnReplay,
        args: json!({"step": step, "ordinal": ordinal}),
        idempotency_key: None,
        schema_hash: "s".into(),
    }
}

fn done(step: i64) -> FinishCall {
    FinishCall {
        outcome: CallOutcome::Completed(json!(step)),
        spend: None,
    }
}

fn inserted(outcome: IssueOutcome) -> CallId {
    match outcome {
        IssueOutcome::Inserted(r) => r.id,
        IssueOutcome::Existing(r) => panic!("{} already existed", r.id),
    }
}

/// Steps 1..=`steps`, step k with `k % 4` calls (so every fourth step has none), as the
/// runtime writes them: steps only move forward. Returns each step's call ids.
async fn steps(
    store: &PostgresStore,
    fence: Fence<'_>,
    id: &SessionId,
    steps: i64,
) -> Vec<Vec<CallId>> {
    let mut ids = vec![Vec::new()];
    for step in 1..=steps {
        let mut these = Vec::new();
        for ordinal in 0..step % 4 {
            let outcome = store
                .record_call(fence, call(id, step, "t", ordinal), done(step))
                .await
                .expect("record");
            these.push(inserted(outcome));
        }
        ids.push(these);
    }
    ids
}

async fn delete(pool: &PgPool, call: &CallId) {
    let done = sqlx::query("DELETE FROM durable_tool_calls WHERE id = $1")
        .bind(call.as_str())
        .execute(pool)
        .await
        .expect("delete");
    assert_eq!(done.rows_affected(), 1);
}

fn ids(calls: &[durable_core::store::CallRecord]) -> Vec<CallId> {
    calls.iter().map(|c| c.id.clone()).collect()
}

/// `calls(step)` of a tampered journal: [`StoreError::Tampered`] about the journal, whose
/// detail names `position`.
async fn assert_step_tampered(store: &PostgresStore, id: &SessionId, step: i64, position: &str) {
    match store.calls(id, Some(step)).await {
        Err(StoreError::Tampered { what, detail, .. }) => {
            assert_eq!(what, "the journal");
            assert!(
                detail.contains(position),
                "step {step}: the detail names {position}: {detail}"
            );
        }
        other => panic!("step {step}: expected Tampered, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_steps_with_empty_ones_read_clean() {
    let db = test_database().await;
    let store = db.store().await.expect("store");
    let (id, lease) = session(&store).await;
    let written = steps(&store, lease.fence(), &id, 40).await;
    for step in 0..=42 {
        let calls = store.calls(&id, Some(step)).await.expect("step read");
        let expected = written.get(step as usize).cloned().unwrap_or_default();
        assert_eq!(ids(&calls), expected, "step {step}");
        assert!(calls.iter().all(|c| c.identity.step == step));
    }
    let all = store.calls(&id, None).await.expect("whole journal");
    assert_eq!(ids(&all), written.concat());

    // Steps only move forward: a call of an earlier step is refused, and writes nothing.
    match store
        .record_call(lease.fence(), call(&id, 3, "late", 0), done(3))
        .await
    {
        Err(StoreError::StepClosed { step, latest, .. }) => assert_eq!((step, latest), (3, 39)),
        other => panic!("expected StepClosed, got {other:?}"),
    }
    assert_eq!(store.calls(&id, Some(3)).await.expect("step 3").len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_read_detects_deleted_rows() {
    let db = test_database().await;
    let store = db.store().await.expect("store");
    let pool = raw(&db).await;
    // Positions: step 1 → 1, step 2 → 2..=3, step 3 → 4..=6, step 5 → 7, step 6 → 8..=9,
    // step 7 → 10..=12, step 9 → 13, step 10 → 14..=15, step 11 → 16..=18.
    let setup = || async {
        let (id, lease) = session(&store).await;
        let written = steps(&store, lease.fence(), &id, 11).await;
        (id, written)
    };

    // The first row of a step: the row before the step's new first row is missing.
    let (id, w) = setup().await;
    delete(&pool, &w[3][0]).await;
    assert_step_tampered(&store, &id, 3, "seq 4").await;
    store
        .calls(&id, Some(2))
        .await
        .expect_err("step 2 ends next to the gap");

    // The last row of a step.
    let (id, w) = setup().await;
    delete(&pool, &w[7][2]).await;
    assert_step_tampered(&store, &id, 7, "seq 12").await;

    // A middle row.
    let (id, w) = setup().await;
    delete(&pool, &w[11][1]).await;
    assert_step_tampered(&store, &id, 11, "seq 16..=18").await;

    // The journal's last row (the head still counts it).
    let (id, w) = setup().await;
    delete(&pool, &w[11][2]).await;
    assert_step_tampered(&store, &id, 11, "seq 18").await;

    // A whole step in the middle: its read finds no rows, and a gap where they were.
    let (id, w) = setup().await;
    for call in &w[6] {
        delete(&pool, call).await;
    }
    assert_step_tampered(&store, &id, 6, "seq 8..=9").await;
    // Its neighbours see the gap too; steps away from it still read.
    store
        .calls(&id, Some(5))
        .await
        .expect_err("step 5 ends at the gap");
    store
        .calls(&id, Some(7))
        .await
        .expect_err("step 7 starts at the gap");
    assert_eq!(store.calls(&id, Some(10)).await.expect("step 10").len(), 2);
    // The whole journal is short.
    assert!(matches!(
        store.calls(&id, None).await,
        Err(StoreError::Tampered { .. })
    ));
}

/// A row moved to the neighbouring step behind the store's back, its seal untouched:
/// the step it was recorded in still looks whole by position (its remaining rows are
/// contiguous, with rows of an earlier and a later step around them), so the step read
/// checks the seals of those neighbours too. Without it, a resume that reads only the
/// issued rows would replay the step without the moved call, and run it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_read_detects_a_row_moved_to_the_next_step() {
    let db = test_database().await;
    let store = db.store().await.expect("store");
    let pool = raw(&db).await;
    let setup = || async {
        let (id, lease) = session(&store).await;
        let written = steps(&store, lease.fence(), &id, 11).await;
        (id, written)
    };
    let move_to = |call: CallId, step: i64| {
        let pool = pool.clone();
        async move {
            // A fresh ordinal: the step's own rows already use the moved row's identity.
            let done = sqlx::query(
                "UPDATE durable_tool_calls SET step = $2, ordinal = ordinal + 100 WHERE id = $1",
            )
            .bind(call.as_str())
            .bind(step)
            .execute(&pool)
            .await
            .expect("move");
            assert_eq!(done.rows_affected(), 1);
        }
    };
    let tampered =
        |what: &str, result: Result<Vec<durable_core::store::CallRecord>, StoreError>| match result
        {
            Err(StoreError::Tampered { what: found, .. }) => {
                assert!(found.starts_with("journal row"), "{what}: {found}");
            }
            other => panic!("{what}: expected Tampered, got {other:?}"),
        };
    // Positions: step 1 → 1, step 2 → 2..=3, step 3 → 4..=6, step 5 → 7, step 6 → 8..=9,
    // step 7 → 10..=12, step 9 → 13, step 10 → 14..=15, step 11 → 16..=18.
    // Step 3's first row to step 2.
    let (id, w) = setup().await;
    move_to(w[3][0].clone(), 2).await;
    tampered("step 3", store.calls(&id, Some(3)).await);
    // Step 7's last row to step 9.
    let (id, w) = setup().await;
    move_to(w[7][2].clone(), 9).await;
    tampered("step 7", store.calls(&id, Some(7)).await);
    // Step 5's only row to step 3: step 5 reads no rows, between neighbours.
    let (id, w) = setup().await;
    move_to(w[5][0].clone(), 3).await;
    tampered("step 5", store.calls(&id, Some(5)).await);
    // Step 11's last row (the journal's last) to step 10.
    let (id, w) = setup().await;
    move_to(w[11][2].clone(), 10).await;
    tampered("step 11", store.calls(&id, Some(11)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issued_calls_reads_the_issued_rows_and_detects_a_deleted_one() {
    let db = test_database().await;
    let store = db.store().await.expect("store");
    let pool = raw(&db).await;
    let (id, lease) = session(&store).await;
    let fence = lease.fence();
    let old = inserted(
        store
            .issue_call(fence, call(&id, 1, "pay", 0))
            .await
            .expect("issue"),
    );
    let finished = inserted(
        store
            .issue_call(fence, call(&id, 2, "pay", 0))
            .await
            .expect("issue"),
    );
    store
        .finish_call(fence, &finished, done(2), None)
        .await
        .expect("finish");
    for step in 3..=8 {
        store
            .record_call(fence, call(&id, step, "t", 0), done(step))
            .await
            .expect("record");
    }
    let recent = inserted(
        store
            .issue_call(fence, call(&id, 9, "pay", 0))
            .await
            .expect("issue"),
    );

    let issued = store.issued_calls(&id).await.expect("issued");
    assert_eq!(ids(&issued), [old.clone(), recent]);
    assert!(issued.iter().all(|c| c.status == CallStatus::Issued));

    // The issued row of an older step, deleted behind the store's back: a resume must not
    // take the session for one with nothing in doubt.
    delete(&pool, &old).await;
    // The head counts two issued rows; the partial index holds one.
    match store.issued_calls(&id).await {
        Err(StoreError::Tampered { what, detail, .. }) => {
            assert_eq!(what, "the journal's issued rows");
            assert!(
                detail.contains("counts 2 issued rows, the journal holds 1"),
                "{detail}"
            );
        }
        other => panic!("expected Tampered, got {other:?}"),
    }
    assert!(matches!(
        store.issued_calls(&SessionId::new("nobody")).await,
        Err(StoreError::SessionNotFound(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_1_database_is_upgraded_with_steps_out_of_order() {
    let db = test_database().await;
    let pool = raw(&db).await;
    let mut first = migrations();
    first.migrations = Cow::Owned(
        first
            .migrations
            .iter()
            .filter(|m| m.version <= 1)
            .cloned()
            .collect(),
    );
    // Version 1, before seals: the store's own open runs the sealing migration (version 2,
    // which numbers each session's journal and counts it) and adopts the rows as found,
    // which it does only for a store whose sealing migration it runs itself.
    first.run(&pool).await.expect("schema version 1");
    for sql in [
        "INSERT INTO durable_sessions (id, status, app_version, metadata, fence, latest_version, \
         created_at, updated_at, format) \
         VALUES ('a', 'active', 'v1', '{}', 1, 0, 1, 1, 1)",
        "INSERT INTO durable_checkpoints (session_id, version, last_seq, message_count, plan, \
         budget, state, app_version, format, created_at) \
         VALUES ('a', 0, 0, 0, '{}', '{}', 'null', 'v1', 1, 1)",
    ] {
        sqlx::query(sql).execute(&pool).await.expect(sql);
    }
    // Steps out of order, as a store used directly could write them before version 3
    // refused it: the step reads count the whole journal instead.
    for (seq, step, status) in [
        (1, 1, "completed"),
        (2, 3, "issued"),
        (3, 1, "completed"),
        (4, 3, "completed"),
    ] {
        sqlx::query(
            "INSERT INTO durable_tool_calls (id, session_id, kind, step, tool_name, input_hash, \
             ordinal, replay_class, status, args, schema_hash, result, attempt, fence, format, \
             issued_at, seq) OVERRIDING SYSTEM VALUE \
             VALUES ('c' || $1, 'a', 'tool', $2, 't', 'h', $1, 'pure', $3, '{}', 's', \
                     CASE WHEN $3 = 'completed' THEN '1' END, 1, 1, 1, 1, $1)",
        )
        .bind(seq)
        .bind(step)
        .bind(status)
        .execute(&pool)
        .await
        .expect("a version 1 journal row");
    }

    let store =
        PostgresStore::connect_with(PostgresStoreOptions::new(db.url()).keyring(Keyring::none()))
            .await
            .expect("upgrade");
    let a = SessionId::new("a");
    assert_eq!(store.calls(&a, Some(1)).await.expect("step 1").len(), 2);
    assert_eq!(store.calls(&a, Some(2)).await.expect("step 2").len(), 0);
    assert_eq!(store.calls(&a, Some(3)).await.expect("step 3").len(), 2);
    let issued = store.issued_calls(&a).await.expect("issued");
    assert_eq!(ids(&issued), [CallId::new("c2")]);
    let indexes: Vec<String> = sqlx::query_scalar(
        "SELECT indexname::text FROM pg_indexes WHERE tablename = 'durable_tool_calls' \
         ORDER BY indexname COLLATE \"C\"",
    )
    .fetch_all(&pool)
    .await
    .expect("indexes");
    assert_eq!(
        indexes,
        [
            "durable_tool_calls_idempotency",
            "durable_tool_calls_identity",
            "durable_tool_calls_issued",
            "durable_tool_calls_pkey",
            "durable_tool_calls_position",
            "durable_tool_calls_requested",
        ]
    );
}
