//! SQLite-specific behaviour of `SqliteStore`: durability settings read back, schema
//! versioning, corruption reporting, multi-process contention and reopening. Generic
//! trait behaviour is covered by the conformance suite (`tests/conformance.rs`); the
//! smoke test here only proves every method works end to end on both store kinds.

use durable_core::store::Claim;
use durable_core::store::{
    CheckpointLog, CheckpointStoreExt, JournalStore, LeaseStore, MaintenanceStore, SessionStore,
    StoreBase,
};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use durable_core::store::{
    CallIdentity, CallKind, CallOutcome, CallStatus, FinishCall, IssueOutcome, Lease, NewCall,
    NewCheckpoint, NewError, NewSession, PurgeOutcome, Resolution, ResolveCall, RetargetSession,
    SessionFilter, SessionStatus,
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
            wake_at: None,
        },
        queue: None,
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

    match store.acquire_lease(&id, "w2", TTL, 5).await {
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
                wake_at: None,
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
    assert_eq!(
        (row.status, row.attempt, row.fence),
        (CallStatus::Issued, 1, lease.fence)
    );
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
    assert_eq!(
        store.calls(&id, Some(7)).await.expect("calls step").len(),
        0
    );

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
    assert_eq!(
        in_doubt.iter().map(|c| &c.id).collect::<Vec<_>>(),
        [&doubtful.id]
    );
    assert!(!store.in_doubt(None).await.expect("in_doubt all").is_empty());
    let resolved = store
        .resolve_call(ResolveCall {
            call: doubtful.id.clone(),
            resolution: Resolution::Happened {
                result: json!({"charged": 5}),
            },
            by: "ops".into(),
            note: Some("checked the PSP dashboard".into()),
        })
        .await
        .expect("resolve_call");
    assert_eq!(resolved.status, CallStatus::Resolved);
    let audit = store.resolutions(&id).await.expect("resolutions");
    assert_eq!(audit.len(), 1);
    assert_eq!(audit[0].by, "ops");

    let lease = store
        .acquire_lease(&id, "w2", TTL, 5)
        .await
        .expect("re-acquire");
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
    assert_eq!(
        store.errors(&id).await.expect("errors")[0].message,
        "429 rate limited"
    );

    let migrated = store
        .retarget_session(RetargetSession {
            session: id.clone(),
            from_version: "v1".into(),
            to_version: "v2".into(),
            step_map: vec![("charge".into(), "charge_card".into())],
            by: "ops".into(),
        })
        .await
        .expect("retarget_session");
    assert_eq!(migrated.app_version, "v2");
    assert_eq!(
        store
            .call(&reissue_me.id)
            .await
            .expect("call")
            .identity
            .tool,
        "charge_card"
    );

    let fork_id = SessionId::random();
    let (forked, fork_lease) = store
        .fork_session(&id, 1, &fork_id, "w3", TTL)
        .await
        .expect("fork_session");
    assert_eq!((forked.app_version.as_str(), fork_lease.fence), ("v2", 1));
    let fork_cp = store
        .load_checkpoint(&fork_id, None)
        .await
        .expect("fork v0");
    assert_eq!(fork_cp.meta.version, 0);
    assert_eq!(fork_cp.messages, latest.messages);

    store
        .set_status(lease.fence(), SessionStatus::Completed, Some("done"))
        .await
        .expect("set_status");
    assert_eq!(
        store
            .purge_session(&id, Duration::ZERO)
            .await
            .expect("purge"),
        PurgeOutcome::Purged
    );
    assert!(matches!(
        store.session(&id).await,
        Err(StoreError::SessionNotFound(_))
    ));

    // The fork's lease is live, so nothing is claimable until it is released.
    store
        .release_lease(&fork_lease)
        .await
        .expect("release fork");
    let expired = store.list_expired(100).await.expect("list_expired");
    assert!(expired.iter().any(|s| s.id == fork_id));
    let claimed: Option<Lease> = store
        .claim_expired(&Claim::new("w4", TTL, 3))
        .await
        .expect("claim_expired");
    let claimed = claimed.expect("the fork is claimable");
    assert_eq!((claimed.session, claimed.fence), (fork_id.clone(), 2));
    // The fork's lease was released, not lost: claiming it is not a recovery.
    assert_eq!(
        store
            .session(&fork_id)
            .await
            .expect("fork")
            .recovery_attempts,
        0
    );
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

/// Reads (journal_mode, synchronous, foreign_keys, busy_timeout) on one connection.
async fn settings(conn: &mut SqliteConnection) -> (String, i64, i64, i64) {
    let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(&mut *conn)
        .await
        .expect("journal_mode");
    let sync: i64 = sqlx::query_scalar("PRAGMA synchronous")
        .fetch_one(&mut *conn)
        .await
        .expect("synchronous");
    let fk: i64 = sqlx::query_scalar("PRAGMA foreign_keys")
        .fetch_one(&mut *conn)
        .await
        .expect("foreign_keys");
    let busy: i64 = sqlx::query_scalar("PRAGMA busy_timeout")
        .fetch_one(&mut *conn)
        .await
        .expect("busy_timeout");
    (mode, sync, fk, busy)
}

#[tokio::test]
async fn file_store_reads_back_wal_and_full_on_every_pooled_connection() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SqliteStore::connect_with(
        SqliteStoreOptions::file(dir.path().join("durable.db"))
            .busy_timeout(Duration::from_millis(7_500))
            .max_readers(4),
    )
    .await
    .expect("open");
    // Hold four connections at once, so that they are four distinct connections.
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(store.pool().acquire().await.expect("acquire a reader"));
    }
    for conn in &mut held {
        assert_eq!(settings(conn).await, ("wal".to_owned(), 2, 1, 7_500));
    }
    drop(held);
    // And the writer connection, as the durability report sees it.
    assert_eq!(
        store.durability().await.expect("durability").unsafe_setting,
        None
    );
    // A raw connection that sets nothing still sees WAL: it is a property of the file.
    let mut outside = raw(&dir.path().join("durable.db")).await;
    assert_eq!(settings(&mut outside).await.0, "wal");
}

#[tokio::test]
async fn in_memory_store_is_unsafe_unless_volatility_is_accepted() {
    let strict = SqliteStore::connect_with(SqliteStoreOptions::in_memory())
        .await
        .expect("open in memory");
    assert_eq!(
        strict
            .durability()
            .await
            .expect("durability")
            .unsafe_setting
            .as_deref(),
        Some("journal_mode = memory (in-memory database)")
    );
    let volatile = SqliteStore::open_in_memory().await.expect("open in memory");
    assert_eq!(
        volatile
            .durability()
            .await
            .expect("durability")
            .unsafe_setting,
        None
    );
    // Two in-memory stores are two databases.
    let id = SessionId::random();
    strict
        .create_session(new_session(&id, "w"))
        .await
        .expect("create");
    assert!(matches!(
        volatile.session(&id).await,
        Err(StoreError::SessionNotFound(_))
    ));
}

#[tokio::test]
async fn open_refuses_a_file_that_cannot_switch_to_wal() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("busy.db");
    let mut holder = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(&path)
        .create_if_missing(true)
        .journal_mode(sqlx::sqlite::SqliteJournalMode::Delete)
        .connect()
        .await
        .expect("create a rollback-journal database");
    sqlx::query("CREATE TABLE t (x INTEGER)")
        .execute(&mut holder)
        .await
        .expect("create table");
    // An open read transaction holds a shared lock; switching to WAL needs an exclusive
    // one and cannot wait for it. The store must not run in `delete` mode instead.
    let mut tx = holder.begin().await.expect("begin");
    sqlx::query("SELECT COUNT(*) FROM t")
        .fetch_one(&mut *tx)
        .await
        .expect("read");
    let refused = SqliteStore::connect_with(
        SqliteStoreOptions::file(&path).busy_timeout(Duration::from_millis(100)),
    )
    .await;
    assert!(refused.is_err(), "opened a store that is not in WAL mode");
    let tables: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM sqlite_master WHERE name LIKE 'durable%'")
            .fetch_one(&mut *tx)
            .await
            .expect("count tables");
    assert_eq!(tables, 0, "a refused open must not create tables");
    tx.rollback().await.expect("rollback");
    // Once the lock is gone the same file opens, in WAL mode.
    let store = SqliteStore::open(&path)
        .await
        .expect("open after the lock is gone");
    assert_eq!(
        store.durability().await.expect("durability").unsafe_setting,
        None
    );
}

#[tokio::test]
async fn migrations_are_tracked_in_durable_schema_migrations_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("durable.db");
    file_store(&dir).await.close().await;
    // Reopening must not apply anything twice.
    file_store(&dir).await.close().await;
    let mut conn = raw(&path).await;
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE '%migrations' \
         ORDER BY name",
    )
    .fetch_all(&mut conn)
    .await
    .expect("list tables");
    assert_eq!(tables, ["durable_migrations", "durable_schema_migrations"]);
    let applied: Vec<(i64, bool)> =
        sqlx::query_as("SELECT version, success FROM durable_schema_migrations")
            .fetch_all(&mut conn)
            .await
            .expect("read the tracking table");
    let every: Vec<(i64, bool)> = (1..=schema_version()).map(|v| (v, true)).collect();
    assert_eq!(applied, every);
}

#[tokio::test]
async fn a_newer_schema_is_refused_and_left_untouched() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("durable.db");
    let store = file_store(&dir).await;
    let id = SessionId::random();
    store
        .create_session(new_session(&id, "w1"))
        .await
        .expect("create");
    store.close().await;

    // A newer release applied migration 99 (and, say, dropped a column we need).
    let mut conn = raw(&path).await;
    sqlx::query(
        "INSERT INTO durable_schema_migrations (version, description, success, checksum, \
         execution_time) VALUES (99, 'from the future', TRUE, X'00', 0)",
    )
    .execute(&mut conn)
    .await
    .expect("insert a future migration");
    let schema_before: Vec<String> =
        sqlx::query_scalar("SELECT sql FROM sqlite_master ORDER BY name")
            .fetch_all(&mut conn)
            .await
            .expect("schema");

    match SqliteStore::open(&path).await {
        Err(StoreError::SchemaTooNew {
            backend,
            found,
            supported,
        }) => assert_eq!(
            (backend, found, supported),
            ("sqlite", 99, schema_version())
        ),
        other => panic!("expected SchemaTooNew, got {other:?}"),
    }
    let error = SqliteStore::open(&path).await.expect_err("still refused");
    assert!(error.to_string().contains("upgrade `durable`"), "{error}");

    let schema_after: Vec<String> =
        sqlx::query_scalar("SELECT sql FROM sqlite_master ORDER BY name")
            .fetch_all(&mut conn)
            .await
            .expect("schema");
    assert_eq!(schema_before, schema_after);
    let versions: Vec<i64> =
        sqlx::query_scalar("SELECT version FROM durable_schema_migrations ORDER BY version")
            .fetch_all(&mut conn)
            .await
            .expect("versions");
    let expected: Vec<i64> = (1..=schema_version()).chain([99]).collect();
    assert_eq!(versions, expected);
    let sessions: Vec<String> = sqlx::query_scalar("SELECT id FROM durable_sessions")
        .fetch_all(&mut conn)
        .await
        .expect("sessions");
    assert_eq!(sessions, [id.to_string()]);
}

#[tokio::test]
async fn corrupt_rows_name_their_session_and_spare_the_others() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("durable.db");
    let store = file_store(&dir).await;
    let (bad, good) = (
        SessionId::new("bad-session"),
        SessionId::new("good-session"),
    );
    let (_, bad_lease) = store
        .create_session(new_session(&bad, "w"))
        .await
        .expect("create bad");
    store
        .create_session(new_session(&good, "w"))
        .await
        .expect("create good");
    let call = match store
        .issue_call(bad_lease.fence(), new_call(&bad, "send_email", "h", None))
        .await
        .expect("issue")
    {
        IssueOutcome::Inserted(row) => row,
        other => panic!("expected Inserted, got {other:?}"),
    };
    store
        .save_checkpoint(
            bad_lease.fence(),
            0,
            NewCheckpoint {
                messages: vec![json!({"role": "assistant", "content": "ok"})],
                ..NewCheckpoint::default()
            },
        )
        .await
        .expect("save v1");

    let mut conn = raw(&path).await;
    for (sql, what) in [
        (
            "UPDATE durable_checkpoints SET plan = '{\"objective\": ' WHERE session_num = (SELECT num FROM durable_sessions WHERE id = ?) AND version = 0",
            "plan",
        ),
        (
            "UPDATE durable_messages SET format = 99 WHERE session_num = (SELECT num FROM durable_sessions WHERE id = ?) AND seq = 2",
            "message",
        ),
        (
            "UPDATE durable_sessions SET metadata = 'not json' WHERE id = ?",
            "metadata",
        ),
        (
            "UPDATE durable_tool_calls SET args = '[1, 2' WHERE session_id = ?",
            "args",
        ),
    ] {
        let changed = sqlx::query(sql)
            .bind(bad.as_str())
            .execute(&mut conn)
            .await
            .expect(what)
            .rows_affected();
        assert_eq!(changed, 1, "{what}");
    }

    let expect_corrupt =
        |result: Result<(), StoreError>, version: Option<i64>, needle: &str| match result {
            Err(StoreError::Corrupt {
                session,
                version: v,
                detail,
            }) => {
                assert_eq!((session, v), (bad.clone(), version), "{detail}");
                assert!(
                    detail.contains(needle),
                    "`{detail}` should mention `{needle}`"
                );
            }
            other => panic!("expected Corrupt, got {other:?}"),
        };
    expect_corrupt(
        store.load_checkpoint(&bad, Some(0)).await.map(drop),
        Some(0),
        "plan is not valid JSON",
    );
    expect_corrupt(
        store.load_checkpoint(&bad, None).await.map(drop),
        Some(1),
        "written by a newer format 99",
    );
    expect_corrupt(store.session(&bad).await.map(drop), None, "metadata");
    // A journal row edited outside durable fails its seal before it is decoded.
    for result in [
        store.call(&call.id).await.map(drop),
        store.calls(&bad, None).await.map(drop),
    ] {
        match result {
            Err(StoreError::Tampered { session, what, .. }) => {
                assert_eq!(session, bad);
                assert!(what.contains(call.id.as_str()), "{what}");
            }
            other => panic!("expected Tampered, got {other:?}"),
        }
    }

    // The other session is untouched and fully usable.
    let cp = store
        .load_checkpoint(&good, None)
        .await
        .expect("good loads");
    assert_eq!(
        cp.message_values().expect("JSON"),
        [json!({"role": "user", "content": "hello"})]
    );
    let record = store.session(&good).await.expect("good session");
    assert_eq!(
        record.metadata,
        json!({"root": "/tmp/scratch", "z": 1, "a": 2})
    );
    let display = store
        .load_checkpoint(&bad, Some(0))
        .await
        .expect_err("corrupt");
    assert!(
        display
            .to_string()
            .contains("session `bad-session` at version 0"),
        "{display}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_stores_on_one_file_issue_each_identity_exactly_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Two stores = two writer connections = what two processes sharing the file do.
    let a = file_store(&dir).await;
    let b = file_store(&dir).await;
    let id = SessionId::random();
    let (_, lease) = a
        .create_session(new_session(&id, "w"))
        .await
        .expect("create");

    const IDENTITIES: usize = 8;
    const CALLERS: usize = 12;
    let mut tasks = Vec::new();
    for identity in 0..IDENTITIES {
        for caller in 0..CALLERS {
            let store = if caller % 2 == 0 {
                a.clone()
            } else {
                b.clone()
            };
            let (session, lease) = (id.clone(), lease.clone());
            tasks.push(tokio::spawn(async move {
                let call = new_call(&session, "send_email", &format!("hash-{identity}"), None);
                let outcome = store.issue_call(lease.fence(), call).await;
                (identity, outcome)
            }));
        }
    }
    let mut inserted = vec![Vec::new(); IDENTITIES];
    let mut ids = vec![std::collections::BTreeSet::new(); IDENTITIES];
    for task in tasks {
        let (identity, outcome) = task.await.expect("task");
        // Any SQLITE_BUSY would surface here as an error.
        match outcome.expect("issue_call under contention") {
            IssueOutcome::Inserted(row) => {
                ids[identity].insert(row.id.clone());
                inserted[identity].push(row.id);
            }
            IssueOutcome::Existing(row) => {
                ids[identity].insert(row.id);
            }
        }
    }
    for identity in 0..IDENTITIES {
        assert_eq!(
            inserted[identity].len(),
            1,
            "identity {identity}: {inserted:?}"
        );
        assert_eq!(ids[identity].len(), 1, "everyone sees the one row");
    }
    let rows = b.calls(&id, None).await.expect("calls");
    assert_eq!(rows.len(), IDENTITIES);
    let mut seqs: Vec<i64> = Vec::new();
    let mut mine = raw(&dir.path().join("durable.db")).await;
    for row in &rows {
        seqs.push(
            sqlx::query_scalar("SELECT seq FROM durable_tool_calls WHERE id = ?")
                .bind(row.id.as_str())
                .fetch_one(&mut mine)
                .await
                .expect("seq"),
        );
    }
    assert_eq!(seqs, (1..=IDENTITIES as i64).collect::<Vec<_>>());
}

#[tokio::test]
async fn a_reopened_file_store_finds_everything() {
    let dir = tempfile::tempdir().expect("tempdir");
    let id = SessionId::random();
    let store = file_store(&dir).await;
    let (_, lease) = store
        .create_session(new_session(&id, "w"))
        .await
        .expect("create");
    let call = match store
        .issue_call(
            lease.fence(),
            new_call(&id, "send_email", "h", Some("key-1")),
        )
        .await
        .expect("issue")
    {
        IssueOutcome::Inserted(row) => row,
        other => panic!("expected Inserted, got {other:?}"),
    };
    store
        .finish_call(
            lease.fence(),
            &call.id,
            completed(json!({"id": "msg-1", "price": 1.10})),
            Some((
                0,
                NewCheckpoint {
                    messages: vec![json!({"role": "tool", "content": "sent"})],
                    plan: json!({"steps": ["send"]}),
                    budget: json!({"usd": 0.01}),
                    state: json!({"k": [1, 2, 3]}),
                    wake_at: None,
                },
            )),
        )
        .await
        .expect("finish with checkpoint");
    store
        .record_error(NewError {
            session: id.clone(),
            step: 1,
            context: "model".into(),
            attempt: 2,
            message: "timeout".into(),
        })
        .await
        .expect("record_error");
    let before = (
        store.session(&id).await.expect("session"),
        store.load_checkpoint(&id, None).await.expect("checkpoint"),
        store.list_checkpoints(&id).await.expect("checkpoints"),
        store.calls(&id, None).await.expect("calls"),
        store.errors(&id).await.expect("errors"),
    );
    store.close().await;
    drop(store);

    let store = file_store(&dir).await;
    let after = (
        store.session(&id).await.expect("session"),
        store.load_checkpoint(&id, None).await.expect("checkpoint"),
        store.list_checkpoints(&id).await.expect("checkpoints"),
        store.calls(&id, None).await.expect("calls"),
        store.errors(&id).await.expect("errors"),
    );
    assert_eq!(before, after);
    assert_eq!(after.1.meta.version, 1);
    assert_eq!(
        after.3[0].result,
        Some(json!({"id": "msg-1", "price": 1.10}))
    );
    // The lease survives the restart too: another owner is still refused.
    assert!(matches!(
        store.acquire_lease(&id, "other", TTL, 5).await,
        Err(StoreError::Leased { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_write_never_leaves_a_transaction_open() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = file_store(&dir).await;
    // A second store with a short busy timeout: a leaked write lock makes it fail.
    let other = SqliteStore::connect_with(
        SqliteStoreOptions::file(dir.path().join("durable.db"))
            .busy_timeout(Duration::from_secs(2)),
    )
    .await
    .expect("open a second store");
    let id = SessionId::random();
    let (_, lease) = store
        .create_session(new_session(&id, "w"))
        .await
        .expect("create");
    let big = NewCheckpoint {
        messages: (0..200)
            .map(|i| json!({"n": i, "pad": "x".repeat(200)}))
            .collect(),
        ..NewCheckpoint::default()
    };
    // One cancellation that does not depend on the machine's speed: the write waits for
    // a lock held elsewhere, is dropped, and the lock is then released under it.
    let mut holder = raw(&dir.path().join("durable.db")).await;
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut holder)
        .await
        .expect("take the write lock");
    let blocked = tokio::time::timeout(
        Duration::from_millis(200),
        store.save_checkpoint(lease.fence(), 0, big.clone()),
    )
    .await;
    assert!(blocked.is_err(), "a write behind a held lock must wait");
    sqlx::query("ROLLBACK")
        .execute(&mut holder)
        .await
        .expect("release the write lock");
    // The blocked write may have committed once the lock was released.
    let mut expected = store.session(&id).await.expect("session").latest_version;
    // Then cancellations spread over the whole length of a write, measured here.
    let clock = std::time::Instant::now();
    store
        .save_checkpoint(lease.fence(), expected, big.clone())
        .await
        .expect("an uncancelled save");
    let full = clock.elapsed();
    expected += 1;
    let mut cancelled = 1;
    for attempt in 0..40u32 {
        let write = store.save_checkpoint(lease.fence(), expected, big.clone());
        match tokio::time::timeout(full * attempt / 30, write).await {
            Ok(result) => {
                result.expect("save");
                expected += 1;
            }
            Err(_) => cancelled += 1,
        }
        // The writer of the other store gets the lock, and this store's next write works.
        other
            .record_error(NewError {
                session: id.clone(),
                step: 0,
                context: "probe".into(),
                attempt: 0,
                message: format!("after attempt {attempt}"),
            })
            .await
            .expect("no write lock leaked");
        // A cancelled save either committed fully or not at all.
        let latest = store.session(&id).await.expect("session").latest_version;
        if latest == expected + 1 {
            expected += 1;
        }
        assert_eq!(latest, expected);
        let cp = store.load_checkpoint(&id, None).await.expect("load");
        assert_eq!(cp.messages.len() as i64, 1 + 200 * expected);
    }
    println!("{cancelled} of 41 writes cancelled (a full write took {full:?})");
}

/// Unchanged snapshots are stored as references (`@v`) to the version holding their text,
/// yet every version, and a fork of any version, loads exactly what was written.
#[tokio::test]
async fn unchanged_snapshots_are_stored_once_and_every_version_still_loads() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = file_store(&dir).await;
    let id = SessionId::random();
    let (_, lease) = store
        .create_session(new_session(&id, "w1"))
        .await
        .expect("create");
    // (plan, budget, state) per version 1..=4: plan constant, budget changes, state
    // goes A, B, A, A (a value equal to an older, non-adjacent version is stored again).
    let versions = [
        (
            json!({"objective": "greet"}),
            json!({"usd": 0.1}),
            json!("A"),
        ),
        (
            json!({"objective": "greet"}),
            json!({"usd": 0.2}),
            json!("B"),
        ),
        (
            json!({"objective": "greet"}),
            json!({"usd": 0.2}),
            json!("A"),
        ),
        (
            json!({"objective": "greet"}),
            json!({"usd": 0.3}),
            json!("A"),
        ),
    ];
    for (i, (plan, budget, state)) in versions.iter().enumerate() {
        store
            .save_checkpoint(
                lease.fence(),
                i as i64,
                NewCheckpoint {
                    messages: vec![json!({"turn": i})],
                    plan: plan.clone(),
                    budget: budget.clone(),
                    state: state.clone(),
                    wake_at: None,
                },
            )
            .await
            .expect("save");
    }
    for (i, (plan, budget, state)) in versions.iter().enumerate() {
        let cp = store
            .load_checkpoint(&id, Some(i as i64 + 1))
            .await
            .expect("load");
        assert_eq!(
            (&cp.plan, &cp.budget, &cp.state),
            (plan, budget, state),
            "version {}",
            i + 1
        );
        assert_eq!(
            cp.messages.len(),
            i + 2,
            "transcript prefix of version {}",
            i + 1
        );
        assert_eq!(cp.meta.message_count, i as i64 + 2);
    }
    let mut conn = raw(&dir.path().join("durable.db")).await;
    let stored: Vec<(i64, String, String, String)> = sqlx::query_as(
        "SELECT version, plan, budget, state FROM durable_checkpoints \
         WHERE session_num = (SELECT num FROM durable_sessions WHERE id = ?) ORDER BY version",
    )
    .bind(id.as_str())
    .fetch_all(&mut conn)
    .await
    .expect("raw rows");
    let plan_refs = stored.iter().filter(|r| r.1 == "@0").count();
    assert_eq!(
        plan_refs, 4,
        "the unchanged plan is stored once: {stored:?}"
    );
    assert_eq!(stored[3].2, "@2", "budget of v3 equals v2's: {stored:?}");
    assert_eq!(stored[4].3, "@3", "state of v4 equals v3's: {stored:?}");
    assert!(
        !stored[3].3.starts_with('@'),
        "A after B is new text: {stored:?}"
    );

    let (_, _) = store
        .fork_session(&id, 4, &SessionId::new(format!("{id}-fork")), "w2", TTL)
        .await
        .expect("fork");
    let forked = store
        .load_checkpoint(&SessionId::new(format!("{id}-fork")), Some(0))
        .await
        .expect("fork loads");
    assert_eq!(forked.plan, versions[3].0);
    assert_eq!(forked.budget, versions[3].1);
    assert_eq!(forked.state, versions[3].2);
}

/// A checkpoint may append more messages than SQLite takes parameters in one statement
/// (32,766; six per message): they are written in several statements, in order, and
/// read back whole.
#[tokio::test]
async fn a_checkpoint_with_thousands_of_new_messages_is_written_and_read_whole() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = file_store(&dir).await;
    let id = SessionId::random();
    let (_, lease) = store
        .create_session(new_session(&id, "w"))
        .await
        .expect("create");
    let many = NewCheckpoint {
        messages: (0..6_000).map(|i| json!({"n": i})).collect(),
        ..NewCheckpoint::default()
    };
    let meta = store
        .save_checkpoint(lease.fence(), 0, many)
        .await
        .expect("a checkpoint of 6,000 new messages");
    assert_eq!(meta.message_count, 6_001);
    let loaded = store.load_checkpoint(&id, None).await.expect("load");
    assert_eq!(loaded.messages.len(), 6_001);
    for (i, message) in loaded.message_values().expect("JSON")[1..]
        .iter()
        .enumerate()
    {
        assert_eq!(message, &json!({"n": i}), "message {} in order", i + 1);
    }
}

/// A 50 MiB model reply is refused before anything reaches the file: the database and
/// its WAL stay a few hundred KiB (it took 51 MB in each before the cap), and the session
/// goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_50_mib_reply_leaves_the_file_small() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("reply.db");
    let store: Arc<dyn CheckpointStore> = Arc::new(SqliteStore::open(&path).await.expect("open"));
    let durable = durable_core::Durable::builder(Arc::clone(&store))
        .owner("big-reply")
        .build();
    let session = durable
        .start::<durable_core::Message>(durable_core::StartOptions::new())
        .await
        .expect("start");
    let huge = "x".repeat(50 * 1024 * 1024);
    let refused = session
        .journal()
        .model(|| async { Ok::<_, String>(json!({ "content": huge })) })
        .await;
    assert!(
        matches!(
            refused,
            Err(durable_core::CallError::Durable(
                durable_core::DurableError::TooLarge { .. }
            ))
        ),
        "refused with TooLarge"
    );
    let size = |suffix: &str| {
        std::fs::metadata(format!("{}{suffix}", path.display()))
            .map(|m| m.len())
            .unwrap_or(0)
    };
    let (db, wal) = (size(""), size("-wal"));
    assert!(
        db < 2 * 1024 * 1024 && wal < 2 * 1024 * 1024,
        "nothing of the reply was written: db {db} bytes, WAL {wal} bytes"
    );
    assert!(
        store
            .calls(session.id(), None)
            .await
            .expect("calls")
            .is_empty()
    );
}
