//! SQLite-specific behaviour of `SqliteStore`: durability settings read back, schema
//! versioning, corruption reporting, multi-process contention and reopening. Generic
//! trait behaviour is covered by the conformance suite (`tests/conformance.rs`); the
//! smoke test here only proves every method works end to end on both store kinds.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use durable_core::store::{
    CallIdentity, CallKind, CallOutcome, CallStatus, FinishCall, IssueOutcome, Lease,
    MigrateSession, NewCall, NewCheckpoint, NewError, NewSession, PurgeOutcome, Resolution,
    ResolveCall, SessionFilter, SessionStatus,
};
use durable_core::{CallId, CheckpointStore, ReplayClass, SessionId, StoreError};
use durable_sqlite::{SqliteStore, SqliteStoreOptions, schema_version};
use serde_json::json;
use sqlx::{ConnectOptions, Connection, SqliteConnection};

const TTL: Duration = Duration::from_secs(60);

fn new_session(id: &SessionId, owner: &str) -> NewSession {
    NewSession {
        id: id.clone(),
        app_version: "v1".into(),
        metadata: json!({"root": "/tmp/scratch", "z": 1, "a": 2}),
        owner: owner.into(),
        lease_ttl: TTL,
        initial: NewCheckpoint {
            messages: vec![json!({"role": "user", "content": "hello"})],
            plan: json!({"objective": "greet"}),
            budget: json!({"usd": 0.0}),
            state: json!(null),
        },
    }
}

fn new_call(session: &SessionId, tool: &str, hash: &str, key: Option<&str>) -> NewCall {
    NewCall {
        id: CallId::random(),
        kind: CallKind::Tool,
        identity: CallIdentity {
            session: session.clone(),
            step: 0,
            tool: tool.into(),
            input_hash: hash.into(),
            ordinal: 0,
        },
        class: ReplayClass::UnsafeOnReplay,
        args: json!({"to": "a@example.com"}),
        idempotency_key: key.map(str::to_owned),
        schema_hash: "schema-1".into(),
    }
}

fn completed(value: serde_json::Value) -> FinishCall {
    FinishCall {
        outcome: CallOutcome::Completed(value),
        spend: Some(json!({"usd": 0.01})),
        mac: None,
    }
}

/// A connection that bypasses the store, like an operator's `sqlite3` shell.
async fn raw(path: &Path) -> SqliteConnection {
    sqlx::sqlite::SqliteConnectOptions::new()
        .filename(path)
        .busy_timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect("open a raw connection")
}

async fn file_store(dir: &tempfile::TempDir) -> SqliteStore {
    SqliteStore::open(dir.path().join("durable.db"))
        .await
        .expect("open the file store")
}

/// Calls every trait method once and checks the essentials of each answer.
async fn exercise_every_method(store: &dyn CheckpointStore) {
    assert_eq!(store.backend(), "sqlite");
    assert_eq!(
        store.durability().await.expect("durability").unsafe_setting,
        None
    );
    let t0 = store.now().await.expect("now");
    assert!(t0 > 1_600_000_000_000, "clock in ms since the epoch: {t0}");

    let id = SessionId::random();
    let (record, lease) = store
        .create_session(new_session(&id, "w1"))
        .await
        .expect("create_session");
    assert_eq!(record.status, SessionStatus::Active);
    assert_eq!(lease.fence, 1);
    assert_eq!(store.session(&id).await.expect("session"), record);
    let listed = store
        .list_sessions(&SessionFilter::default())
        .await
        .expect("list_sessions");
    assert!(listed.iter().any(|s| s.id == id));

    match store.acquire_lease(&id, "w2", TTL).await {
        Err(StoreError::Leased { owner, .. }) => assert_eq!(owner, "w1"),
        other => panic!("expected Leased, got {other:?}"),
    }
    let lease = store.renew_lease(&lease, TTL).await.expect("renew_lease");

    let meta = store
        .save_checkpoint(
            lease.fence(),
            0,
            NewCheckpoint {
                messages: vec![json!({"role": "assistant", "content": "hi"})],
                plan: json!({"objective": "greet", "done": true}),
                budget: json!({"usd": 0.5}),
                state: json!({"turn": 1}),
            },
        )
        .await
        .expect("save_checkpoint");
    assert_eq!((meta.version, meta.last_seq, meta.message_count), (1, 2, 2));
    let latest = store.load_checkpoint(&id, None).await.expect("load latest");
    assert_eq!(latest.meta, meta);
    assert_eq!(latest.messages.len(), 2);
    assert_eq!(latest.state, json!({"turn": 1}));
    let first = store.load_checkpoint(&id, Some(0)).await.expect("load v0");
    assert_eq!(first.messages.len(), 1);
    assert_eq!(
        store.list_checkpoints(&id).await.expect("list").len(),
        2,
        "versions 0 and 1"
    );

    let issued = new_call(&id, "send_email", "h1", Some("k1"));
    let row = match store
        .issue_call(lease.fence(), issued.clone())
        .await
        .expect("issue_call")
    {
        IssueOutcome::Inserted(row) => row,
        other => panic!("expected Inserted, got {other:?}"),
    };
    assert_eq!((row.status, row.attempt, row.fence), (CallStatus::Issued, 1, lease.fence));
    let again = new_call(&id, "send_email", "h1", Some("k1"));
    assert!(matches!(
        store.issue_call(lease.fence(), again).await.expect("issue again"),
        IssueOutcome::Existing(ref r) if r.id == row.id
    ));

    let pure = NewCall {
        class: ReplayClass::Pure,
        ..new_call(&id, "lookup", "h2", None)
    };
    let recorded = match store
        .record_call(lease.fence(), pure, completed(json!({"found": true})))
        .await
        .expect("record_call")
    {
        IssueOutcome::Inserted(r) => r,
        other => panic!("expected Inserted, got {other:?}"),
    };
    assert_eq!(recorded.status, CallStatus::Completed);
    assert!(recorded.finished_at.is_some());

    let cp = store
        .finish_call(
            lease.fence(),
            &row.id,
            completed(json!({"sent": true})),
            Some((1, NewCheckpoint::default())),
        )
        .await
        .expect("finish_call");
    assert_eq!(cp.map(|m| m.version), Some(2));
    let finished = store.call(&row.id).await.expect("call");
    assert_eq!(finished.result, Some(json!({"sent": true})));
    match store.reissue_call(lease.fence(), &row.id).await {
        Err(StoreError::CallNotInDoubt { status, .. }) => assert_eq!(status, "completed"),
        other => panic!("expected CallNotInDoubt, got {other:?}"),
    }
    assert_eq!(store.calls(&id, None).await.expect("calls").len(), 2);
    assert_eq!(store.calls(&id, Some(7)).await.expect("calls step").len(), 0);

    // An issued call whose lease is released is in doubt; an operator resolves it.
    let doubtful = match store
        .issue_call(lease.fence(), new_call(&id, "charge", "h3", None))
        .await
        .expect("issue charge")
    {
        IssueOutcome::Inserted(r) => r,
        other => panic!("expected Inserted, got {other:?}"),
    };
    store.release_lease(&lease).await.expect("release_lease");
    let in_doubt = store.in_doubt(Some(&id)).await.expect("in_doubt");
    assert_eq!(in_doubt.iter().map(|c| &c.id).collect::<Vec<_>>(), [&doubtful.id]);
    assert!(store.in_doubt(None).await.expect("in_doubt all").len() >= 1);
    let resolved = store
        .resolve_call(ResolveCall {
            call: doubtful.id.clone(),
            resolution: Resolution::Happened {
                result: json!({"charged": 5}),
            },
            by: "ops".into(),
            note: Some("checked the PSP dashboard".into()),
            mac: None,
        })
        .await
        .expect("resolve_call");
    assert_eq!(resolved.status, CallStatus::Resolved);
    let audit = store.resolutions(&id).await.expect("resolutions");
    assert_eq!(audit.len(), 1);
    assert_eq!(audit[0].by, "ops");

    let lease = store.acquire_lease(&id, "w2", TTL).await.expect("re-acquire");
    assert_eq!(lease.fence, 2);
    let reissue_me = match store
        .issue_call(lease.fence(), new_call(&id, "charge", "h4", None))
        .await
        .expect("issue")
    {
        IssueOutcome::Inserted(r) => r,
        other => panic!("expected Inserted, got {other:?}"),
    };
    let reissued = store
        .reissue_call(lease.fence(), &reissue_me.id)
        .await
        .expect("reissue_call");
    assert_eq!(reissued.attempt, 2);
    store
        .finish_call(
            lease.fence(),
            &reissue_me.id,
            FinishCall {
                outcome: CallOutcome::Failed(json!({"error": "declined"})),
                spend: None,
                mac: None,
            },
            None,
        )
        .await
        .expect("finish failed");

    store
        .record_error(NewError {
            session: id.clone(),
            step: 2,
            context: "model".into(),
            attempt: 0,
            message: "429 rate limited".into(),
        })
        .await
        .expect("record_error");
    assert_eq!(store.errors(&id).await.expect("errors")[0].message, "429 rate limited");

    let migrated = store
        .migrate_session(MigrateSession {
            session: id.clone(),
            from_version: "v1".into(),
            to_version: "v2".into(),
            step_map: vec![("charge".into(), "charge_card".into())],
            by: "ops".into(),
        })
        .await
        .expect("migrate_session");
    assert_eq!(migrated.app_version, "v2");
    assert_eq!(store.call(&reissue_me.id).await.expect("call").identity.tool, "charge_card");

    let fork_id = SessionId::random();
    let (forked, fork_lease) = store
        .fork_session(&id, 1, &fork_id, "w3", TTL)
        .await
        .expect("fork_session");
    assert_eq!((forked.app_version.as_str(), fork_lease.fence), ("v2", 1));
    let fork_cp = store.load_checkpoint(&fork_id, None).await.expect("fork v0");
    assert_eq!(fork_cp.meta.version, 0);
    assert_eq!(fork_cp.messages, latest.messages);

    store
        .set_status(lease.fence(), SessionStatus::Completed, Some("done"))
        .await
        .expect("set_status");
    assert_eq!(
        store.purge_session(&id, Duration::ZERO).await.expect("purge"),
        PurgeOutcome::Purged
    );
    assert!(matches!(
        store.session(&id).await,
        Err(StoreError::SessionNotFound(_))
    ));

    // The fork's lease is live, so nothing is claimable until it is released.
    store.release_lease(&fork_lease).await.expect("release fork");
    let expired = store.list_expired(100).await.expect("list_expired");
    assert!(expired.iter().any(|s| s.id == fork_id));
    let claimed: Option<Lease> = store
        .claim_expired("w4", TTL, 3)
        .await
        .expect("claim_expired");
    let claimed = claimed.expect("the fork is claimable");
    assert_eq!((claimed.session, claimed.fence), (fork_id.clone(), 2));
    assert_eq!(store.session(&fork_id).await.expect("fork").recovery_attempts, 1);
}

#[tokio::test]
async fn smoke_every_method_in_memory() {
    let store = SqliteStore::open_in_memory().await.expect("open in memory");
    exercise_every_method(&store).await;
}

#[tokio::test]
async fn smoke_every_method_on_a_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = file_store(&dir).await;
    let store: Arc<dyn CheckpointStore> = Arc::new(store);
    exercise_every_method(store.as_ref()).await;
}
