//! Snapshot references (schema 5): a plan, budget or state equal to the previous
//! version's is stored as `@k`, a reference to the version holding its text, so an
//! unchanged plan costs a few bytes per checkpoint; every version still loads its own
//! snapshots exactly, on the one-statement write, the locking one (a checkpoint written
//! with a call's outcome), after a fork and after the store's key changes.

use durable_core::store::{CheckpointLog, CheckpointStoreExt, JournalStore, SessionStore};
use std::time::Duration;

use durable_core::integrity::Keyring;
use durable_core::store::{
    CallIdentity, CallKind, CallOutcome, FinishCall, IssueOutcome, NewCall, NewCheckpoint,
    NewSession,
};
use durable_core::{CallId, ReplayClass, SessionId, StoreError};
use durable_postgres::testing::{TestDatabase, test_database};
use durable_postgres::{PostgresStore, PostgresStoreOptions};
use serde_json::{Value, json};
use sqlx::postgres::PgPool;

async fn open(db: &TestDatabase, ring: Keyring) -> Result<PostgresStore, StoreError> {
    PostgresStore::connect_with(PostgresStoreOptions::new(db.url()).keyring(ring)).await
}

/// A large plan (its size is what a reference saves), numbered.
fn plan(n: u32) -> Value {
    json!({ "objective": format!("plan {n}"), "steps": vec!["a long step description"; 40] })
}

fn checkpoint(plan: Value, budget: Value, state: Value) -> NewCheckpoint {
    NewCheckpoint {
        messages: vec![json!({ "role": "user", "text": "more" })],
        plan,
        budget,
        state,
        wake_at: None,
    }
}

/// What each version's plan, budget and state column holds, by version.
async fn stored(pool: &PgPool, id: &SessionId) -> Vec<(i64, String, String, String)> {
    sqlx::query_as(
        "SELECT version, plan, budget, state FROM durable_checkpoints \
         WHERE session_num = (SELECT num FROM durable_sessions WHERE id = $1) ORDER BY version",
    )
    .bind(id.as_str())
    .fetch_all(pool)
    .await
    .expect("stored snapshots")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unchanged_snapshots_are_references_and_every_version_loads_its_own() {
    let db = test_database().await;
    let pool = PgPool::connect(db.url()).await.expect("raw pool");
    let store = open(&db, Keyring::none()).await.expect("open");
    let id = SessionId::new("s");
    let (_, lease) = store
        .create_session(NewSession {
            id: id.clone(),
            app_version: "v1".into(),
            metadata: json!({}),
            owner: "w".into(),
            lease_ttl: Duration::from_secs(600),
            initial: checkpoint(plan(0), json!({ "usd": 0 }), Value::Null),
            queue: None,
        })
        .await
        .expect("create");
    // Versions 1..=8: the plan changes at 3 and back to plan 0 at 6 (a reference names
    // only the previous version's holder, so 6 holds its text again); the budget changes
    // at every even version; the state never.
    let plans = [0, 0, 0, 1, 1, 1, 0, 0, 0];
    let budget = |v: usize| json!({ "usd": v / 2 });
    let mut written = vec![(plan(0), json!({ "usd": 0 }), Value::Null)];
    for (v, &p) in plans.iter().enumerate().skip(1) {
        let cp = checkpoint(plan(p), budget(v), Value::Null);
        written.push((cp.plan.clone(), cp.budget.clone(), cp.state.clone()));
        if v == 5 {
            // The locking write: a checkpoint written with a call's outcome.
            let call = NewCall {
                id: CallId::random(),
                kind: CallKind::Tool,
                identity: CallIdentity {
                    session: id.clone(),
                    step: 1,
                    tool: "t".into(),
                    input_hash: "h".into(),
                    ordinal: 0,
                },
                class: ReplayClass::Pure,
                args: json!({}),
                idempotency_key: None,
                schema_hash: "s".into(),
            };
            let IssueOutcome::Inserted(row) =
                store.issue_call(lease.fence(), call).await.expect("issue")
            else {
                panic!("a new row");
            };
            let finish = FinishCall {
                outcome: CallOutcome::Completed(json!(1)),
                spend: None,
            };
            let meta = store
                .finish_call(lease.fence(), &row.id, finish, Some((v as i64 - 1, cp)))
                .await
                .expect("finish with a checkpoint")
                .expect("the checkpoint");
            assert_eq!(meta.version, v as i64);
        } else {
            store
                .save_checkpoint(lease.fence(), v as i64 - 1, cp)
                .await
                .expect("save");
        }
    }
    let rows = stored(&pool, &id).await;
    let holders = |column: usize| -> Vec<String> {
        rows.iter()
            .map(|r| match column {
                0 => r.1.clone(),
                1 => r.2.clone(),
                _ => r.3.clone(),
            })
            .map(|s| if s.starts_with('@') { s } else { "text".into() })
            .collect()
    };
    assert_eq!(
        holders(0),
        ["text", "@0", "@0", "text", "@3", "@3", "text", "@6", "@6"],
        "plans"
    );
    assert_eq!(
        holders(1),
        [
            "text", "@0", "text", "@2", "text", "@4", "text", "@6", "text"
        ],
        "budgets"
    );
    assert_eq!(
        holders(2),
        ["text", "@0", "@0", "@0", "@0", "@0", "@0", "@0", "@0"],
        "states"
    );
    // An unchanged plan costs a few bytes, whatever its size.
    let full = serde_json::to_string(&plan(0)).expect("json").len();
    assert!(full > 1000, "the plan is large: {full} bytes");
    for (version, plan, _, _) in &rows {
        if plan.starts_with('@') {
            assert!(plan.len() <= 3, "version {version} stores {plan:?}");
        }
    }
    // Every version loads its own snapshots, exactly.
    let check = |store: PostgresStore, id: SessionId, written: Vec<(Value, Value, Value)>| async move {
        for (v, (plan, budget, state)) in written.iter().enumerate() {
            let cp = store
                .load_checkpoint(&id, Some(v as i64))
                .await
                .unwrap_or_else(|e| panic!("version {v}: {e}"));
            assert_eq!(
                (&cp.plan, &cp.budget, &cp.state),
                (plan, budget, state),
                "version {v}"
            );
        }
    };
    check(store.clone(), id.clone(), written.clone()).await;

    // A fork from a version whose plan is a reference holds the text.
    let fork = SessionId::new("fork");
    store
        .fork_session(&id, 8, &fork, "w", Duration::from_secs(600))
        .await
        .expect("fork");
    let forked = stored(&pool, &fork).await;
    assert!(!forked[0].1.starts_with('@'), "the fork's plan is text");
    assert_eq!(
        store.load_checkpoint(&fork, None).await.expect("fork").plan,
        plan(0)
    );

    // A reference re-pointed behind the store's back is not returned: the seal covers
    // the text it names.
    sqlx::query(
        "UPDATE durable_checkpoints SET plan = '@3' \
         WHERE session_num = (SELECT num FROM durable_sessions WHERE id = $1) AND version = 7",
    )
    .bind(id.as_str())
    .execute(&pool)
    .await
    .expect("re-point");
    match store.load_checkpoint(&id, Some(7)).await {
        Err(StoreError::Tampered { .. }) => {}
        other => panic!("a re-pointed reference: {other:?}"),
    }
    sqlx::query(
        "UPDATE durable_checkpoints SET plan = '@6' \
         WHERE session_num = (SELECT num FROM durable_sessions WHERE id = $1) AND version = 7",
    )
    .bind(id.as_str())
    .execute(&pool)
    .await
    .expect("restore");

    // The store's key changes: every checkpoint is re-sealed over the text its
    // references name, and they stay references.
    store.pool().close().await;
    let key = Keyring::with_app_key(vec![9; 32]).expect("key");
    let store = open(&db, key).await.expect("rekey");
    assert_eq!(stored(&pool, &id).await, rows, "references are kept");
    check(store, id, written).await;
}
