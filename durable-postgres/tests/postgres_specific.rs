//! Behaviour only a real PostgreSQL server can show: migrations and their tracking table,
//! schema-version refusal, corrupt rows, `synchronous_commit`, and several stores (pools,
//! like several machines) racing on one database. Each test has a database of its own.

use durable_core::store::Claim;
use durable_core::store::{
    CheckpointLog, CheckpointStoreExt, JournalStore, LeaseStore, MaintenanceStore, ResolutionStore,
    SessionStore, StoreBase,
};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use durable_core::StoreError;
use durable_core::ids::{CallId, SessionId};
use durable_core::replay::ReplayClass;
use durable_core::store::{
    CallIdentity, CallKind, CallOutcome, CallStatus, CheckpointStore, FinishCall, IssueOutcome,
    NewCall, NewCheckpoint, NewError, NewSession, PurgeOutcome, Resolution, ResolveCall,
    RetargetSession, SessionFilter, SessionStatus,
};
use durable_postgres::testing::{TestDatabase, test_database};
use durable_postgres::{MIGRATIONS_TABLE, PostgresStore, PostgresStoreOptions, migrations};
use serde_json::{Value, json};
use sqlx::postgres::PgPool;
use sqlx::{AssertSqlSafe, Row};

const TTL: Duration = Duration::from_secs(600);

/// A raw pool on the test database, for poking at rows behind the store's back.
async fn raw(db: &TestDatabase) -> PgPool {
    PgPool::connect(db.url())
        .await
        .expect("raw pool on the test database")
}

async fn store(db: &TestDatabase) -> PostgresStore {
    db.store().await.expect("connect PostgresStore")
}

fn new_session(id: &SessionId, owner: &str, ttl: Duration, messages: Vec<Value>) -> NewSession {
    NewSession {
        id: id.clone(),
        app_version: "v1".into(),
        metadata: json!({"scratch": "/tmp/x"}),
        owner: owner.into(),
        lease_ttl: ttl,
        initial: NewCheckpoint {
            messages,
            plan: json!({"objective": "o", "steps": []}),
            budget: json!({"spent_usd": 0.0}),
            state: Value::Null,
            wake_at: None,
        },
        queue: None,
    }
}

fn tool_call(session: &SessionId, tool: &str, hash: &str, key: Option<&str>) -> NewCall {
    NewCall {
        id: CallId::random(),
        kind: CallKind::Tool,
        identity: CallIdentity {
            session: session.clone(),
            step: 1,
            tool: tool.into(),
            input_hash: hash.into(),
            ordinal: 0,
        },
        class: ReplayClass::UnsafeOnReplay,
        args: json!({"hash": hash}),
        idempotency_key: key.map(str::to_owned),
        schema_hash: "schema:1".into(),
    }
}

async fn scalar_bool(pool: &PgPool, sql: &'static str) -> bool {
    sqlx::query(sql)
        .fetch_one(pool)
        .await
        .expect("query")
        .try_get(0)
        .expect("bool column")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrations_are_tracked_in_our_own_table() {
    let db = test_database().await;
    let _store = store(&db).await;
    let pool = raw(&db).await;
    assert_eq!(MIGRATIONS_TABLE, "durable_schema_migrations");
    assert!(
        scalar_bool(
            &pool,
            "SELECT to_regclass('durable_schema_migrations') IS NOT NULL"
        )
        .await,
        "the tracking table must exist"
    );
    assert!(
        !scalar_bool(&pool, "SELECT to_regclass('_sqlx_migrations') IS NOT NULL").await,
        "the host's _sqlx_migrations must never be created"
    );
    let applied: Vec<(i64, bool)> =
        sqlx::query_as("SELECT version, success FROM durable_schema_migrations ORDER BY version")
            .fetch_all(&pool)
            .await
            .expect("read tracking table");
    let embedded: Vec<(i64, bool)> = migrations().iter().map(|m| (m.version, true)).collect();
    assert_eq!(applied, embedded, "every embedded migration applied once");
    for table in [
        "durable_sessions",
        "durable_messages",
        "durable_checkpoints",
        "durable_tool_calls",
        "durable_errors",
        "durable_resolutions",
        "durable_migrations",
    ] {
        let exists: bool = sqlx::query("SELECT to_regclass($1) IS NOT NULL")
            .bind(table)
            .fetch_one(&pool)
            .await
            .expect("to_regclass")
            .get(0);
        assert!(exists, "table {table} missing");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_connects_migrate_once() {
    let db = test_database().await;
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let url = db.url().to_owned();
        tasks.push(tokio::spawn(async move {
            PostgresStore::connect_with(PostgresStoreOptions::new(url).max_connections(2)).await
        }));
    }
    for task in tasks {
        task.await
            .expect("connect task")
            .expect("every concurrent connect must succeed");
    }
    let rows: i64 = sqlx::query("SELECT count(*) FROM durable_schema_migrations")
        .fetch_one(&raw(&db).await)
        .await
        .expect("count")
        .get(0);
    assert_eq!(rows, migrations().iter().count() as i64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn newer_schema_is_refused_before_migrating() {
    let supported = migrations()
        .iter()
        .map(|m| m.version)
        .max()
        .expect("a migration");

    // A database a newer release started: its tracking table knows a version we do not,
    // and none of our tables exist yet. Connecting must refuse it and create nothing.
    let db = test_database().await;
    let pool = raw(&db).await;
    sqlx::query(
        "CREATE TABLE durable_schema_migrations (
             version BIGINT PRIMARY KEY, description TEXT NOT NULL,
             installed_on TIMESTAMPTZ NOT NULL DEFAULT now(), success BOOLEAN NOT NULL,
             checksum BYTEA NOT NULL, execution_time BIGINT NOT NULL)",
    )
    .execute(&pool)
    .await
    .expect("create tracking table");
    sqlx::query(
        "INSERT INTO durable_schema_migrations (version, description, success, checksum, execution_time)
         VALUES ($1, 'from the future', true, '\\x00', 1)",
    )
    .bind(supported + 41)
    .execute(&pool)
    .await
    .expect("insert future version");
    match PostgresStore::connect(db.url()).await {
        Err(StoreError::SchemaTooNew {
            backend,
            found,
            supported: s,
        }) => {
            assert_eq!((backend, found, s), ("postgres", supported + 41, supported));
        }
        other => panic!("expected SchemaTooNew, got {other:?}"),
    }
    assert!(
        !scalar_bool(&pool, "SELECT to_regclass('durable_sessions') IS NOT NULL").await,
        "a refused database must not be migrated"
    );

    // A database we migrated, later migrated further by a newer release.
    let db = test_database().await;
    let s = store(&db).await;
    let id = SessionId::random();
    s.create_session(new_session(&id, "w", TTL, vec![]))
        .await
        .expect("create");
    let pool = raw(&db).await;
    sqlx::query(
        "INSERT INTO durable_schema_migrations (version, description, success, checksum, execution_time)
         VALUES ($1, 'newer', true, '\\x00', 1)",
    )
    .bind(supported + 1)
    .execute(&pool)
    .await
    .expect("insert newer version");
    let err = PostgresStore::connect(db.url())
        .await
        .expect_err("a newer schema must be refused");
    assert!(
        matches!(err, StoreError::SchemaTooNew { found, .. } if found == supported + 1),
        "got {err:?}"
    );
    assert!(
        err.to_string().contains("upgrade `durable`"),
        "the message says what to do: {err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_rows_name_their_session_and_others_still_load() {
    let db = test_database().await;
    let s = store(&db).await;
    let pool = raw(&db).await;
    let (good, bad_plan, newer, bad_meta, bad_msg) = (
        SessionId::random(),
        SessionId::random(),
        SessionId::random(),
        SessionId::random(),
        SessionId::random(),
    );
    for id in [&good, &bad_plan, &newer, &bad_meta, &bad_msg] {
        s.create_session(new_session(id, "w", TTL, vec![json!({"m": 1})]))
            .await
            .expect("create");
    }
    let poke = |sql: &'static str, id: &SessionId| {
        let pool = pool.clone();
        let id = id.to_string();
        async move {
            sqlx::query(sql)
                .bind(id)
                .execute(&pool)
                .await
                .expect("corrupt a row");
        }
    };
    poke(
        "UPDATE durable_checkpoints SET plan = '{\"unterminated' WHERE session_num = (SELECT num FROM durable_sessions WHERE id = $1)",
        &bad_plan,
    )
    .await;
    poke(
        "UPDATE durable_checkpoints SET format = 99 WHERE session_num = (SELECT num FROM durable_sessions WHERE id = $1)",
        &newer,
    )
    .await;
    poke(
        "UPDATE durable_sessions SET metadata = 'not json' WHERE id = $1",
        &bad_meta,
    )
    .await;
    poke(
        "UPDATE durable_messages SET message = '[1,' WHERE session_num = (SELECT num FROM durable_sessions WHERE id = $1)",
        &bad_msg,
    )
    .await;

    match s.load_checkpoint(&bad_plan, None).await {
        Err(StoreError::Corrupt {
            session,
            version,
            detail,
        }) => {
            assert_eq!((session, version), (bad_plan.clone(), Some(0)));
            assert!(detail.contains("plan"), "detail names the column: {detail}");
        }
        other => panic!("expected Corrupt for a bad plan, got {other:?}"),
    }
    match s.load_checkpoint(&newer, Some(0)).await {
        Err(StoreError::Corrupt {
            session, detail, ..
        }) => {
            assert_eq!(session, newer);
            assert!(detail.contains("newer format 99"), "{detail}");
        }
        other => panic!("expected Corrupt for a newer format, got {other:?}"),
    }
    match s.session(&bad_meta).await {
        Err(StoreError::Corrupt {
            session, version, ..
        }) => assert_eq!((session, version), (bad_meta.clone(), None)),
        other => panic!("expected Corrupt for bad metadata, got {other:?}"),
    }
    // A changed message no longer matches its seal: it is reported as tampered before
    // its (now invalid) JSON is parsed.
    match s.load_checkpoint(&bad_msg, None).await {
        Err(e @ StoreError::Tampered { .. }) => {
            let text = e.to_string();
            assert!(
                text.contains(bad_msg.as_str()) && text.contains("message 1"),
                "{text}"
            );
        }
        other => panic!("expected Tampered for a changed message, got {other:?}"),
    }
    // Forking a checkpoint of a newer format is refused, not re-labelled.
    match s
        .fork_session(&newer, 0, &SessionId::random(), "w", TTL)
        .await
    {
        Err(StoreError::Corrupt { session, .. }) => assert_eq!(session, newer),
        other => panic!("expected Corrupt when forking a newer format, got {other:?}"),
    }
    // A message deleted behind the store's back is reported, not silently skipped.
    let lost = SessionId::random();
    s.create_session(new_session(
        &lost,
        "w",
        TTL,
        vec![json!(1), json!(2), json!(3)],
    ))
    .await
    .expect("create");
    poke(
        "DELETE FROM durable_messages WHERE session_num = (SELECT num FROM durable_sessions WHERE id = $1) AND seq = 2",
        &lost,
    )
    .await;
    match s.load_checkpoint(&lost, None).await {
        Err(StoreError::Tampered {
            session,
            what,
            detail,
        }) => {
            assert_eq!((session, what.as_str()), (lost.clone(), "message 2"));
            assert!(detail.contains("missing"), "{detail}");
        }
        other => panic!("expected Tampered for a lost message, got {other:?}"),
    }

    let cp = s
        .load_checkpoint(&good, None)
        .await
        .expect("an intact session still loads");
    assert_eq!(cp.message_values().expect("JSON"), vec![json!({"m": 1})]);
    // The corrupt checkpoints do not stop their sessions' rows from being read.
    s.session(&bad_plan)
        .await
        .expect("session row of a corrupt checkpoint");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn synchronous_commit_off_is_reported() {
    let db = test_database().await;
    let s = store(&db).await;
    assert_eq!(
        s.durability().await.expect("durability").unsafe_setting,
        None,
        "the default server settings are durable"
    );

    // Through the connection URL.
    let sep = if db.url().contains('?') { '&' } else { '?' };
    let url = format!("{}{sep}options=-c%20synchronous_commit%3Doff", db.url());
    let s = PostgresStore::connect(&url).await.expect("connect");
    assert_eq!(
        s.durability().await.expect("durability").unsafe_setting,
        Some("synchronous_commit = off".to_owned())
    );

    // Through the database's defaults, as an administrator would set them.
    let pool = raw(&db).await;
    sqlx::query(AssertSqlSafe(format!(
        "ALTER DATABASE {} SET synchronous_commit = off",
        db.name()
    )))
    .execute(&pool)
    .await
    .expect("alter database");
    let s = PostgresStore::connect(db.url()).await.expect("reconnect");
    assert_eq!(
        s.durability().await.expect("durability").unsafe_setting,
        Some("synchronous_commit = off".to_owned())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_machines_never_claim_the_same_session() {
    let db = test_database().await;
    let options = |db: &TestDatabase| PostgresStoreOptions::new(db.url()).max_connections(4);
    let a = Arc::new(PostgresStore::connect_with(options(&db)).await.expect("a"));
    let b = Arc::new(PostgresStore::connect_with(options(&db)).await.expect("b"));
    let mut expired = HashSet::new();
    for _ in 0..20 {
        let id = SessionId::random();
        a.create_session(new_session(&id, "crashed", Duration::ZERO, vec![]))
            .await
            .expect("create");
        expired.insert(id);
    }
    let mut tasks = Vec::new();
    for (n, store) in [&a, &b, &a, &b, &a, &b].into_iter().enumerate() {
        let store = Arc::clone(store);
        tasks.push(tokio::spawn(async move {
            let mut claimed = Vec::new();
            while let Some(lease) = store
                .claim_expired(&Claim::new(format!("worker-{n}"), TTL, 5))
                .await
                .expect("claim_expired")
            {
                claimed.push(lease);
            }
            claimed
        }));
    }
    let mut seen = HashSet::new();
    for task in tasks {
        for lease in task.await.expect("claimer") {
            assert!(
                seen.insert(lease.session.clone()),
                "session {} claimed twice",
                lease.session
            );
            assert_eq!(lease.fence, 2, "one claim after creation: token 2");
        }
    }
    assert_eq!(
        seen, expired,
        "every expired session is claimed exactly once"
    );
    assert!(a.list_expired(100).await.expect("list").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_idempotency_key_reuse_with_other_args_inserts_once() {
    let db = test_database().await;
    let a = Arc::new(store(&db).await);
    let b = Arc::new(store(&db).await);
    let (sa, sb) = (SessionId::random(), SessionId::random());
    let (_, la) = a
        .create_session(new_session(&sa, "wa", TTL, vec![]))
        .await
        .expect("a");
    let (_, lb) = b
        .create_session(new_session(&sb, "wb", TTL, vec![]))
        .await
        .expect("b");
    for round in 0..20 {
        let key = format!("pay-{round}");
        let ca = tool_call(&sa, "charge", &format!("hash-a-{round}"), Some(&key));
        let cb = tool_call(&sb, "charge", &format!("hash-b-{round}"), Some(&key));
        let (ra, rb) = tokio::join!(
            {
                let (a, la) = (Arc::clone(&a), la.clone());
                async move { a.issue_call(la.fence(), ca).await }
            },
            {
                let (b, lb) = (Arc::clone(&b), lb.clone());
                async move { b.issue_call(lb.fence(), cb).await }
            }
        );
        let inserted = [&ra, &rb]
            .iter()
            .filter(|r| matches!(r, Ok(IssueOutcome::Inserted(_))))
            .count();
        let conflicts = [&ra, &rb]
            .iter()
            .filter(|r| matches!(r, Err(StoreError::IdempotencyConflict { .. })))
            .count();
        assert_eq!(
            (inserted, conflicts),
            (1, 1),
            "round {round}: one use of key {key} wins, the other conflicts: {ra:?} / {rb:?}"
        );
    }
}

/// Every trait method once, in the order a worker, a recoverer and an operator use them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smoke_every_method() {
    let db = test_database().await;
    let s = store(&db).await;
    assert_eq!(s.backend(), "postgres");
    let t0 = s.now().await.expect("now");

    let id = SessionId::random();
    let (rec, lease) = s
        .create_session(new_session(&id, "w1", TTL, vec![json!({"role": "user"})]))
        .await
        .expect("create_session");
    assert_eq!(
        (rec.status, rec.fence, rec.latest_version),
        (SessionStatus::Active, 1, 0)
    );
    assert!(lease.expires_at >= t0 + 600_000);
    assert_eq!(s.session(&id).await.expect("session"), rec);
    let listed = s
        .list_sessions(&SessionFilter::new().with_statuses(vec![SessionStatus::Active]))
        .await
        .expect("list_sessions");
    assert_eq!(listed.len(), 1);

    let lease = s.renew_lease(&lease, TTL).await.expect("renew_lease");
    let meta = s
        .save_checkpoint(
            lease.fence(),
            0,
            NewCheckpoint {
                messages: vec![json!({"role": "assistant", "z": 1, "a": 2})],
                plan: json!({"p": 1}),
                budget: json!({"b": 1}),
                state: json!({"s": 1}),
                wake_at: None,
            },
        )
        .await
        .expect("save_checkpoint");
    assert_eq!((meta.version, meta.last_seq, meta.message_count), (1, 2, 2));
    let cp = s.load_checkpoint(&id, None).await.expect("load_checkpoint");
    let messages = cp.message_values().expect("JSON");
    assert_eq!(messages.len(), 2);
    assert_eq!(messages[1], json!({"role": "assistant", "z": 1, "a": 2}));
    let stored: String = sqlx::query(
        "SELECT message FROM durable_messages \
             WHERE session_num = (SELECT num FROM durable_sessions WHERE id = $1) AND seq = 2",
    )
    .bind(id.as_str())
    .fetch_one(&raw(&db).await)
    .await
    .expect("stored message")
    .get(0);
    assert_eq!(
        stored,
        serde_json::to_string(&messages[1]).expect("json"),
        "the exact serialized bytes are stored (TEXT, not JSONB, which respaces and reorders)"
    );
    assert_eq!(
        s.list_checkpoints(&id)
            .await
            .expect("list_checkpoints")
            .len(),
        2
    );

    let call = tool_call(&id, "send", "h1", Some("k1"));
    let IssueOutcome::Inserted(row) = s
        .issue_call(lease.fence(), call.clone())
        .await
        .expect("issue")
    else {
        panic!("first issue inserts")
    };
    assert_eq!(row.status, CallStatus::Issued);
    s.finish_call(
        lease.fence(),
        &call.id,
        FinishCall {
            outcome: CallOutcome::Completed(json!({"ok": true})),
            spend: Some(json!({"usd": 0.01})),
        },
        Some((1, NewCheckpoint::default())),
    )
    .await
    .expect("finish_call")
    .expect("checkpoint written");
    let pure = NewCall {
        class: ReplayClass::Pure,
        ..tool_call(&id, "read", "h2", None)
    };
    let recorded = s
        .record_call(
            lease.fence(),
            pure.clone(),
            FinishCall {
                outcome: CallOutcome::Failed(json!("nope")),
                spend: None,
            },
        )
        .await
        .expect("record_call");
    assert!(
        matches!(&recorded, IssueOutcome::Inserted(r) if r.status == CallStatus::Failed && r.finished_at.is_some())
    );
    assert_eq!(
        s.call(&call.id).await.expect("call").status,
        CallStatus::Completed
    );
    assert_eq!(s.calls(&id, Some(1)).await.expect("calls").len(), 2);

    // A worker dies mid-call; another takes the session and the call is in doubt.
    let doubtful = tool_call(&id, "wire", "h3", None);
    s.issue_call(lease.fence(), doubtful.clone())
        .await
        .expect("issue");
    s.release_lease(&lease).await.expect("release_lease");
    assert_eq!(s.list_expired(10).await.expect("list_expired").len(), 1);
    let claimed = s
        .claim_expired(&Claim::new("w2", TTL, 3))
        .await
        .expect("claim_expired")
        .expect("a session to claim");
    assert_eq!(claimed.session, id);
    let in_doubt = s.in_doubt(Some(&id)).await.expect("in_doubt");
    assert_eq!(
        in_doubt.iter().map(|c| &c.id).collect::<Vec<_>>(),
        vec![&doubtful.id]
    );
    let resolved = s
        .resolve_call(ResolveCall {
            call: doubtful.id.clone(),
            resolution: Resolution::DidNotHappen,
            by: "ops".into(),
            note: Some("checked the bank".into()),
        })
        .await
        .expect("resolve_call");
    assert_eq!(resolved.status, CallStatus::NotHappened);
    assert_eq!(s.resolutions(&id).await.expect("resolutions").len(), 1);
    let again = s
        .reissue_call(claimed.fence(), &doubtful.id)
        .await
        .expect("reissue_call");
    assert_eq!((again.attempt, again.fence), (2, claimed.fence));
    s.finish_call(
        claimed.fence(),
        &doubtful.id,
        FinishCall {
            outcome: CallOutcome::Completed(json!(1)),
            spend: None,
        },
        None,
    )
    .await
    .expect("finish");

    s.record_error(NewError {
        session: id.clone(),
        step: 1,
        context: "model".into(),
        attempt: 0,
        message: "429".into(),
    })
    .await
    .expect("record_error");
    assert_eq!(s.errors(&id).await.expect("errors").len(), 1);

    let moved = s
        .retarget_session(RetargetSession {
            session: id.clone(),
            from_version: "v1".into(),
            to_version: "v2".into(),
            step_map: vec![("send".into(), "send_v2".into())],
            by: "ops".into(),
        })
        .await
        .expect("retarget_session");
    assert_eq!(moved.app_version, "v2");
    assert_eq!(
        s.call(&call.id).await.expect("call").identity.tool,
        "send_v2"
    );

    let fork_id = SessionId::random();
    let (forked, fork_lease) = s
        .fork_session(&id, 1, &fork_id, "w3", TTL)
        .await
        .expect("fork_session");
    assert_eq!((forked.fence, fork_lease.fence), (1, 1));
    assert_eq!(
        s.load_checkpoint(&fork_id, None)
            .await
            .expect("load fork")
            .messages
            .len(),
        2
    );

    let reacquired = s
        .acquire_lease(&id, "w2", TTL, 5)
        .await
        .expect("acquire_lease");
    assert_eq!(reacquired.fence, claimed.fence + 1);
    s.set_status(reacquired.fence(), SessionStatus::Completed, Some("done"))
        .await
        .expect("set_status");
    assert_eq!(
        s.purge_session(&id, Duration::ZERO).await.expect("purge"),
        PurgeOutcome::Purged
    );
    assert!(matches!(
        s.session(&id).await,
        Err(StoreError::SessionNotFound(_))
    ));
    let durability = s.durability().await.expect("durability");
    assert_eq!(durability.unsafe_setting, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_is_clone_debug_and_shares_its_pool() {
    let db = test_database().await;
    let s = store(&db).await;
    let c = s.clone();
    assert!(format!("{c:?}").contains("PostgresStore"));
    let id = SessionId::random();
    s.create_session(new_session(&id, "w", TTL, vec![]))
        .await
        .expect("create");
    c.session(&id)
        .await
        .expect("a clone sees the same database");
    let dynamic: Arc<dyn CheckpointStore> = Arc::new(c);
    assert_eq!(dynamic.backend(), "postgres");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn step_map_is_a_mapping_not_a_chain() {
    let db = test_database().await;
    let s = store(&db).await;
    let id = SessionId::random();
    let (_, lease) = s
        .create_session(new_session(&id, "w", TTL, vec![]))
        .await
        .expect("create");
    let mut ids = Vec::new();
    for (tool, hash) in [("a", "h1"), ("b", "h2"), ("c", "h3")] {
        let call = tool_call(&id, tool, hash, None);
        ids.push(call.id.clone());
        s.issue_call(lease.fence(), call).await.expect("issue");
    }
    s.retarget_session(RetargetSession {
        session: id.clone(),
        from_version: "v1".into(),
        to_version: "v2".into(),
        // swap a and b; the second pair for `a` is ignored (first pair wins)
        step_map: vec![
            ("a".into(), "b".into()),
            ("b".into(), "a".into()),
            ("a".into(), "z".into()),
        ],
        by: "ops".into(),
    })
    .await
    .expect("migrate");
    let mut tools = Vec::new();
    for call in &ids {
        tools.push(s.call(call).await.expect("call").identity.tool);
    }
    assert_eq!(tools, ["b", "a", "c"]);
}
