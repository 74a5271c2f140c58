//! Approvals on PostgreSQL, beyond the shared conformance cases: decisions taken at once
//! from two pools (exactly one applied), deadlines decided on the database clock, a
//! schema-7 database upgraded to 8, the approval JSON and the approval log changed behind
//! the store's back, the log re-sealed under a new key and purged with its session, and
//! a session that waited for approval taken back without counting a recovery.

use durable_core::store::Claim;
use durable_core::store::{
    ApprovalStore, JournalStore, LeaseStore, MaintenanceStore, ResolutionStore, SessionStore,
    StoreBase,
};
use std::sync::Arc;
use std::time::Duration;

use durable_core::integrity::{Head, Keyring};
use durable_core::store::{
    ApprovalDecision, ApprovalEvent, ApprovalRequest, CallIdentity, CallKind, CallOutcome,
    CallRecord, CallStatus, DEADLINE, DecideApproval, FinishCall, IssueOutcome, Lease, NewCall,
    NewCheckpoint, NewSession, PurgeOutcome, Resolution, ResolveCall, SessionStatus,
};
use durable_core::{CallId, ReplayClass, SessionId, StoreError};
use durable_postgres::testing::{TestDatabase, test_database};
use durable_postgres::{PostgresStore, PostgresStoreOptions};
use serde_json::{Value, json};
use sqlx::postgres::PgPool;
use tokio::sync::Barrier;

mod schema_7;

const TTL: Duration = Duration::from_secs(600);

async fn open(db: &TestDatabase, ring: Keyring) -> Result<PostgresStore, StoreError> {
    PostgresStore::connect_with(PostgresStoreOptions::new(db.url()).keyring(ring)).await
}

async fn raw(db: &TestDatabase) -> PgPool {
    PgPool::connect(db.url())
        .await
        .expect("raw pool on the test database")
}

async fn session(store: &PostgresStore, name: &str) -> (SessionId, Lease) {
    let id = SessionId::new(name);
    let (_, lease) = store
        .create_session(NewSession {
            id: id.clone(),
            app_version: "v1".into(),
            metadata: json!({}),
            owner: "w".into(),
            lease_ttl: TTL,
            initial: NewCheckpoint {
                messages: vec![json!({"role": "user", "text": "hi"})],
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

fn call(session: &SessionId, step: i64, tool: &str) -> NewCall {
    NewCall {
        id: CallId::random(),
        kind: CallKind::Tool,
        identity: CallIdentity {
            session: session.clone(),
            step,
            tool: tool.into(),
            input_hash: format!("h-{tool}"),
            ordinal: 0,
        },
        class: ReplayClass::UnsafeOnReplay,
        args: json!({ "tool": tool, "amount": 10 }),
        idempotency_key: None,
        schema_hash: "schema:1".into(),
    }
}

fn asked(expires_in: Option<Duration>) -> ApprovalRequest {
    ApprovalRequest {
        asked_by: "pay: approval required".into(),
        reasoning: Some("the invoice is due".into()),
        expires_in,
        schema: Some(json!({"type": "object"})),
    }
}

fn decide(call: &CallId, decision: ApprovalDecision, by: &str) -> DecideApproval {
    DecideApproval {
        call: call.clone(),
        decision,
        by: by.into(),
        note: None,
    }
}

fn approve(call: &CallId, by: &str) -> DecideApproval {
    decide(call, ApprovalDecision::Approve { args: None }, by)
}

fn deny(call: &CallId, by: &str) -> DecideApproval {
    decide(
        call,
        ApprovalDecision::Deny {
            reason: "not this month".into(),
        },
        by,
    )
}

/// Journals `tool` at `step` as requested; returns the new row.
async fn request(
    store: &PostgresStore,
    lease: &Lease,
    step: i64,
    tool: &str,
    expires_in: Option<Duration>,
) -> CallRecord {
    match store
        .request_call(
            lease.fence(),
            call(&lease.session, step, tool),
            asked(expires_in),
        )
        .await
        .expect("request")
    {
        IssueOutcome::Inserted(row) => row,
        IssueOutcome::Existing(row) => panic!("a new row, got {row:?}"),
    }
}

fn tampered<T: std::fmt::Debug>(what: &str, result: Result<T, StoreError>) {
    match result {
        Err(StoreError::Tampered { .. }) => {}
        other => panic!("{what}: expected Tampered, got {other:?}"),
    }
}

/// Two operators decide on one call at the same moment, each through a pool of its own:
/// exactly one decision is applied, the other is refused as no longer awaiting one, and
/// the log holds the request and the one decision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_decisions_at_once_apply_exactly_one() {
    let db = test_database().await;
    let alice = Arc::new(db.store().await.expect("alice's pool"));
    let bob = Arc::new(db.store().await.expect("bob's pool"));
    let (id, lease) = session(&alice, "race").await;
    for round in 0..20 {
        let row = request(&alice, &lease, round, &format!("pay-{round}"), None).await;
        let barrier = Arc::new(Barrier::new(2));
        let take = |store: Arc<PostgresStore>, decision: DecideApproval| {
            let barrier = Arc::clone(&barrier);
            tokio::spawn(async move {
                barrier.wait().await;
                store.decide_approval(decision).await
            })
        };
        let a = take(Arc::clone(&alice), approve(&row.id, "alice"));
        let b = take(Arc::clone(&bob), deny(&row.id, "bob"));
        let (a, b) = (a.await.expect("join"), b.await.expect("join"));
        let (winner, status) = match (&a, &b) {
            (Ok(won), Err(StoreError::NotAwaitingApproval { call, status })) => {
                assert_eq!(call, &row.id, "round {round}");
                assert_eq!(status, "approved", "round {round}: the applied decision");
                (won, "alice")
            }
            (Err(StoreError::NotAwaitingApproval { call, status }), Ok(won)) => {
                assert_eq!(call, &row.id, "round {round}");
                assert_eq!(status, "denied", "round {round}: the applied decision");
                (won, "bob")
            }
            other => panic!("round {round}: exactly one decision applies, got {other:?}"),
        };
        let stored = alice.call(&row.id).await.expect("the row");
        assert_eq!(&stored, winner, "round {round}");
        let decided = stored
            .approval
            .as_ref()
            .and_then(|a| a.decision.as_ref())
            .expect("decided");
        assert_eq!(decided.by, status, "round {round}");
    }
    // The log: each request and its one decision, in order, the head counting them.
    let log = bob.approvals(&id).await.expect("the log");
    assert_eq!(log.len(), 40);
    for (i, pair) in log.chunks(2).enumerate() {
        assert_eq!(pair[0].event, ApprovalEvent::Requested, "round {i}");
        assert_ne!(pair[1].event, ApprovalEvent::Requested, "round {i}");
        assert_eq!(pair[0].call, pair[1].call, "round {i}");
    }
    assert_eq!(
        log.iter().map(|r| r.position).collect::<Vec<_>>(),
        (1..=40).collect::<Vec<_>>()
    );
}

/// Waits until the database clock reaches `at` (ms).
async fn until(store: &PostgresStore, at: i64) {
    while store.now().await.expect("the clock") < at {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// A deadline is set and decided on the database clock: a request that expires in 1 ms
/// can no longer be approved or denied once the clock passes it, only expired; one with
/// a long deadline, or none, cannot be expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadlines_are_decided_on_the_database_clock() {
    let db = test_database().await;
    let store = db.store().await.expect("connect");
    let (_, lease) = session(&store, "deadlines").await;

    let before = store.now().await.expect("the clock");
    let short = request(&store, &lease, 1, "short", Some(Duration::from_millis(1))).await;
    let after = store.now().await.expect("the clock");
    let approval = short.approval.clone().expect("an approval");
    assert!(
        (before..=after).contains(&approval.requested_at),
        "requested at {} on the database clock ({before}..={after})",
        approval.requested_at
    );
    assert_eq!(approval.deadline, Some(approval.requested_at + 1));
    assert_eq!(short.issued_at, approval.requested_at);
    let deadline = approval.deadline.expect("a deadline");
    until(&store, deadline).await;

    let pending = store.pending_approvals(None).await.expect("pending");
    assert_eq!(pending.len(), 1);
    assert!(
        pending[0].expired,
        "past its deadline on the database clock"
    );
    for refused in [approve(&short.id, "alice"), deny(&short.id, "alice")] {
        match store.decide_approval(refused).await {
            Err(StoreError::ApprovalExpired { call, deadline: at }) => {
                assert_eq!((call, at), (short.id.clone(), deadline));
            }
            other => panic!("expected ApprovalExpired, got {other:?}"),
        }
    }
    let expired = store
        .decide_approval(decide(&short.id, ApprovalDecision::Expire, DEADLINE))
        .await
        .expect("expire");
    assert_eq!(expired.status, CallStatus::Denied);
    assert!(expired.finished_at.is_some_and(|at| at >= deadline));
    let error = expired.error.expect("the denial is the recorded error");
    assert_eq!(error["by"], json!(DEADLINE));
    assert!(
        error["denied"]
            .as_str()
            .is_some_and(|d| d.contains(&deadline.to_string())),
        "{error}"
    );

    let long = request(&store, &lease, 2, "long", Some(Duration::from_secs(3600))).await;
    let none = request(&store, &lease, 3, "none", None).await;
    for open in [&long, &none] {
        match store
            .decide_approval(decide(&open.id, ApprovalDecision::Expire, DEADLINE))
            .await
        {
            Err(StoreError::ApprovalNotExpired { call, .. }) => assert_eq!(call, open.id),
            other => panic!("expected ApprovalNotExpired, got {other:?}"),
        }
    }
    let pending = store.pending_approvals(None).await.expect("pending");
    assert_eq!(
        pending
            .iter()
            .map(|p| (p.call.id.clone(), p.expired))
            .collect::<Vec<_>>(),
        [(long.id.clone(), false), (none.id.clone(), false)],
        "oldest request first, neither expired"
    );
    let approved = store
        .decide_approval(approve(&long.id, "alice"))
        .await
        .expect("approve before the deadline");
    assert_eq!(approved.status, CallStatus::Approved);
}

/// Everything a reader gets of a session that has no approvals.
async fn read_all(store: &PostgresStore, id: &SessionId) -> (Vec<CallRecord>, Vec<CallRecord>) {
    (
        store.calls(id, None).await.expect("calls"),
        store.issued_calls(id).await.expect("issued"),
    )
}

/// Seals every head as schema 7 did (its counts, without the approvals it did not know),
/// under the store's own key: what a database of schema 7 holds, whatever this release
/// writes for a session without approvals.
async fn seal_heads_as_schema_7(pool: &PgPool) {
    let hex: String = sqlx::query_scalar("SELECT value FROM durable_meta WHERE name = 'store_key'")
        .fetch_one(pool)
        .await
        .expect("the store key");
    let ring = Keyring::none().bind_store_key(Keyring::store_key_from_hex(&hex).expect("hex"));
    let found: Vec<(String, i64, i64, i64, i64, String)> = sqlx::query_as(
        "SELECT s.id, s.journal_rows, s.latest_version, s.resolutions, s.issued_rows, \
           (SELECT k.seal FROM durable_checkpoints k WHERE k.session_num = s.num \
            AND k.version = s.latest_version) FROM durable_sessions s",
    )
    .fetch_all(pool)
    .await
    .expect("heads");
    for (id, journal_rows, latest_version, resolutions, issued_rows, checkpoint_seal) in found {
        let head = Head {
            session: &id,
            journal_rows,
            latest_version,
            checkpoint_seal: &checkpoint_seal,
            resolutions,
            issued_rows,
            approvals: 0,
        };
        let seal = ring
            .seal(&head.legacy_fields().int(issued_rows))
            .expect("seal");
        sqlx::query("UPDATE durable_sessions SET head = $2 WHERE id = $1")
            .bind(&id)
            .bind(&seal)
            .execute(pool)
            .await
            .expect("a schema 7 head");
    }
}

async fn heads(pool: &PgPool) -> Vec<(String, Option<String>)> {
    sqlx::query_as("SELECT id, head FROM durable_sessions ORDER BY id")
        .fetch_all(pool)
        .await
        .expect("heads")
}

/// A database written by schema 7 (no approvals; heads sealed as schema 7 sealed them) is
/// upgraded to 8 when a writer opens it: no head is re-sealed (a head without approvals
/// is sealed as before, so it still checks), all of it reads back the same, and its
/// sessions then take approvals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_7_database_is_upgraded_and_reads_the_same() {
    let db = test_database().await;
    let pool = raw(&db).await;
    let store = db.store().await.expect("connect");
    let (id, lease) = session(&store, "old").await;
    let done = match store
        .issue_call(lease.fence(), call(&id, 1, "pay"))
        .await
        .expect("issue")
    {
        IssueOutcome::Inserted(row) => row,
        IssueOutcome::Existing(row) => panic!("a new row, got {row:?}"),
    };
    let finish = FinishCall {
        outcome: CallOutcome::Completed(json!("paid")),
        spend: None,
    };
    store
        .finish_call(lease.fence(), &done.id, finish.clone(), None)
        .await
        .expect("finish");
    store
        .record_call(lease.fence(), call(&id, 2, "model"), finish)
        .await
        .expect("record");
    let doubt = store
        .issue_call(lease.fence(), call(&id, 2, "email"))
        .await
        .expect("issue");
    let IssueOutcome::Inserted(doubt) = doubt else {
        panic!("a new row");
    };
    assert_eq!(doubt.status, CallStatus::Issued);
    store.release_lease(&lease).await.expect("release");
    // A resolution too: the head counts it.
    let (_, other) = session(&store, "resolved").await;
    let maybe = issue_one(&store, &other).await;
    store.release_lease(&other).await.expect("release");
    store
        .resolve_call(ResolveCall {
            call: maybe,
            resolution: Resolution::DidNotHappen,
            by: "ops".into(),
            note: None,
        })
        .await
        .expect("resolve");
    let before = (
        read_all(&store, &id).await,
        read_all(&store, &other.session).await,
        store
            .resolutions(&other.session)
            .await
            .expect("resolutions"),
    );
    store.pool().close().await;

    schema_7::back_to_schema_7(&pool).await;
    seal_heads_as_schema_7(&pool).await;
    let sealed = heads(&pool).await;
    let store = db.store().await.expect("the upgrade");
    let version: i64 = sqlx::query_scalar("SELECT max(version) FROM durable_schema_migrations")
        .fetch_one(&pool)
        .await
        .expect("version");
    assert_eq!(version, 16);
    assert_eq!(heads(&pool).await, sealed, "no head was re-sealed");
    let after = (
        read_all(&store, &id).await,
        read_all(&store, &other.session).await,
        store
            .resolutions(&other.session)
            .await
            .expect("resolutions"),
    );
    assert_eq!(after, before);
    assert!(
        after.0.0.iter().all(|row| row.approval.is_none()),
        "no row has an approval"
    );
    assert_eq!(store.approvals(&id).await.expect("an empty log"), []);
    // The session goes on, with approvals now.
    let lease = store
        .acquire_lease(&id, "w2", TTL, 3)
        .await
        .expect("acquire");
    let asked = request(&store, &lease, 3, "wire", None).await;
    store
        .decide_approval(approve(&asked.id, "alice"))
        .await
        .expect("approve");
    let again = store
        .reissue_call(lease.fence(), &asked.id)
        .await
        .expect("run the approved call");
    assert_eq!((again.status, again.attempt), (CallStatus::Issued, 1));
    assert_eq!(
        store
            .approvals(&id)
            .await
            .expect("the log")
            .iter()
            .map(|e| e.event)
            .collect::<Vec<_>>(),
        [
            ApprovalEvent::Requested,
            ApprovalEvent::Approved,
            ApprovalEvent::Issued
        ]
    );
    assert_eq!(
        store
            .issued_calls(&id)
            .await
            .expect("issued")
            .into_iter()
            .map(|row| row.id)
            .collect::<Vec<_>>(),
        [doubt.id, asked.id]
    );
    assert_eq!(
        store.calls(&id, None).await.expect("calls")[..3],
        before.0.0[..],
        "the old rows are untouched"
    );
}

/// Issues a call on `lease`'s session; returns its id.
async fn issue_one(store: &PostgresStore, lease: &Lease) -> CallId {
    match store
        .issue_call(lease.fence(), call(&lease.session, 1, "maybe"))
        .await
        .expect("issue")
    {
        IssueOutcome::Inserted(row) | IssueOutcome::Existing(row) => row.id,
    }
}

async fn exec(pool: &PgPool, sql: &'static str, id: &str) {
    let done = sqlx::query(sql).bind(id).execute(pool).await.expect(sql);
    assert_eq!(done.rows_affected(), 1, "{sql}");
}

/// The approval JSON of a requested row, changed behind the store's back (removed, or its
/// reasoning edited), fails the row's seal on every read of it and on a decision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_approval_is_tampered() {
    let cases = [
        (
            "approval removed",
            "UPDATE durable_tool_calls SET approval = NULL WHERE id = $1",
        ),
        (
            "reasoning edited",
            "UPDATE durable_tool_calls \
             SET approval = replace(approval, 'the invoice is due', 'the invoice is paid') \
             WHERE id = $1",
        ),
        (
            "deadline removed",
            "UPDATE durable_tool_calls SET approval = (approval::jsonb - 'deadline')::text \
             WHERE id = $1",
        ),
    ];
    for (case, sql) in cases {
        let db = test_database().await;
        let store = db.store().await.expect("connect");
        let pool = raw(&db).await;
        let (id, lease) = session(&store, "s").await;
        let row = request(&store, &lease, 1, "pay", Some(Duration::from_secs(3600))).await;
        exec(&pool, sql, row.id.as_str()).await;
        tampered(case, store.call(&row.id).await);
        tampered(case, store.calls(&id, None).await);
        tampered(case, store.calls(&id, Some(1)).await);
        tampered(case, store.pending_approvals(None).await);
        tampered(case, store.pending_approvals(Some(&id)).await);
        tampered(case, store.decide_approval(approve(&row.id, "alice")).await);
    }
}

/// A decided row set back to `requested` (to be decided again) fails its seal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decided_row_set_back_to_requested_is_tampered() {
    let db = test_database().await;
    let store = db.store().await.expect("connect");
    let pool = raw(&db).await;
    let (_, lease) = session(&store, "s").await;
    let row = request(&store, &lease, 1, "pay", None).await;
    store
        .decide_approval(deny(&row.id, "alice"))
        .await
        .expect("deny");
    exec(
        &pool,
        "UPDATE durable_tool_calls SET status = 'requested', error = NULL WHERE id = $1",
        row.id.as_str(),
    )
    .await;
    tampered("pending", store.pending_approvals(None).await);
    tampered(
        "decide again",
        store.decide_approval(approve(&row.id, "bob")).await,
    );
}

/// The approval log changed behind the store's back (a row deleted, first or last; an
/// actor, a note or an edited argument changed; two rows' positions swapped) fails its
/// check: each row is sealed at its position and the head counts them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_approval_log_is_tampered() {
    let cases: [(&str, &[&'static str]); 7] = [
        (
            "first row deleted",
            &["DELETE FROM durable_approvals WHERE session_id = $1 AND position = 1"],
        ),
        (
            "last row deleted",
            &["DELETE FROM durable_approvals WHERE session_id = $1 AND position = 4"],
        ),
        (
            "actor edited",
            &["UPDATE durable_approvals SET actor = 'mallory' \
               WHERE session_id = $1 AND position = 2"],
        ),
        (
            "reasoning edited",
            &["UPDATE durable_approvals SET note = 'because' \
               WHERE session_id = $1 AND position = 1"],
        ),
        (
            "edited arguments changed",
            &[
                "UPDATE durable_approvals SET args_after = '{\"amount\":1000}' \
               WHERE session_id = $1 AND position = 4",
            ],
        ),
        (
            // One row at a time through a free position: `(session_id, position)` is
            // unique.
            "positions swapped",
            &[
                "UPDATE durable_approvals SET position = 0 WHERE session_id = $1 AND position = 1",
                "UPDATE durable_approvals SET position = 1 WHERE session_id = $1 AND position = 4",
                "UPDATE durable_approvals SET position = 4 WHERE session_id = $1 AND position = 0",
            ],
        ),
        (
            "position moved past the end",
            &["UPDATE durable_approvals SET position = 9 WHERE session_id = $1 AND position = 4"],
        ),
    ];
    for (case, statements) in cases {
        let db = test_database().await;
        let store = db.store().await.expect("connect");
        let pool = raw(&db).await;
        let (id, lease) = session(&store, "s").await;
        let first = request(&store, &lease, 1, "pay", None).await;
        store
            .decide_approval(approve(&first.id, "alice"))
            .await
            .expect("approve");
        let second = request(&store, &lease, 1, "wire", None).await;
        store
            .decide_approval(decide(
                &second.id,
                ApprovalDecision::Approve {
                    args: Some(json!({"amount": 5})),
                },
                "bob",
            ))
            .await
            .expect("approve edited");
        let log = store.approvals(&id).await.expect("the log");
        assert_eq!(log.len(), 4, "{case}");
        assert_eq!(log[3].args_after, Some(json!({"amount": 5})), "{case}");
        assert_eq!(
            log[3].args_before,
            Some(json!({"tool": "wire", "amount": 10})),
            "{case}"
        );
        for sql in statements {
            exec(&pool, sql, id.as_str()).await;
        }
        tampered(case, store.approvals(&id).await);
    }
}

/// Turning an application key on re-seals the approval log and the approval of each row
/// with it: the store's own key proves nothing once an application key is configured.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_key_reseals_the_approvals() {
    let db = test_database().await;
    let store = open(&db, Keyring::none()).await.expect("open");
    let (id, lease) = session(&store, "s").await;
    let pending = request(&store, &lease, 1, "pay", None).await;
    let decided = request(&store, &lease, 1, "wire", None).await;
    store
        .decide_approval(deny(&decided.id, "alice"))
        .await
        .expect("deny");
    let log = store.approvals(&id).await.expect("the log");
    store.pool().close().await;
    let key = Keyring::with_app_key(vec![7; 32]).expect("key");
    let store = open(&db, key).await.expect("re-seal under the key");
    assert_eq!(store.approvals(&id).await.expect("the log"), log);
    let waiting = store.pending_approvals(Some(&id)).await.expect("pending");
    assert_eq!(waiting.len(), 1);
    assert_eq!(waiting[0].call.id, pending.id);
    assert!(
        waiting[0]
            .call
            .mac
            .as_deref()
            .is_some_and(|m| m.starts_with("app-"))
    );
    store
        .decide_approval(approve(&pending.id, "bob"))
        .await
        .expect("decided under the new key");
    assert_eq!(store.approvals(&id).await.expect("the log").len(), 4);
}

/// A terminal session with approvals is purged whole: its log goes before the journal
/// rows it names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_with_approvals_is_purged() {
    let db = test_database().await;
    let store = db.store().await.expect("connect");
    let (id, lease) = session(&store, "s").await;
    let row = request(&store, &lease, 1, "pay", None).await;
    store
        .decide_approval(deny(&row.id, "alice"))
        .await
        .expect("deny");
    store
        .set_status(lease.fence(), SessionStatus::Completed, None)
        .await
        .expect("complete");
    let purged = store
        .purge_session(&id, Duration::ZERO)
        .await
        .expect("purge");
    assert_eq!(purged, PurgeOutcome::Purged);
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM durable_approvals")
        .fetch_one(store.pool())
        .await
        .expect("count");
    assert_eq!(left, 0);
}

async fn lease_of(pool: &PgPool, id: &SessionId) -> (String, Option<String>, i32) {
    sqlx::query_as(
        "SELECT status, lease_owner, recovery_attempts FROM durable_sessions WHERE id = $1",
    )
    .bind(id.as_str())
    .fetch_one(pool)
    .await
    .expect("the session row")
}

/// A session parked for approval gives its lease up (no owner): when the last decision
/// makes it active again, or when every call was decided before it was parked, the next
/// worker takes it as a released session, not as a crash, so no recovery is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_back_from_approval_is_taken_without_a_recovery() {
    let db = test_database().await;
    let store = db.store().await.expect("connect");
    let pool = raw(&db).await;

    let (id, lease) = session(&store, "waits").await;
    let row = request(&store, &lease, 1, "pay", None).await;
    store
        .set_status(
            lease.fence(),
            SessionStatus::AwaitingApproval,
            Some("pay needs approval"),
        )
        .await
        .expect("await approval");
    assert_eq!(
        lease_of(&pool, &id).await,
        ("awaiting_approval".into(), None, 0)
    );
    assert!(matches!(
        store.acquire_lease(&id, "w2", TTL, 3).await,
        Err(StoreError::NotResumable { .. })
    ));
    assert!(
        store
            .claim_expired(&Claim::new("w2", TTL, 3))
            .await
            .expect("claim")
            .is_none()
    );
    store
        .decide_approval(approve(&row.id, "alice"))
        .await
        .expect("approve");
    let record = store.session(&id).await.expect("session");
    assert_eq!(
        (record.status, record.lease_owner, record.status_reason),
        (SessionStatus::Active, None, None)
    );
    let taken = store
        .claim_expired(&Claim::new("w2", TTL, 3))
        .await
        .expect("claim")
        .expect("the session is free");
    assert_eq!(taken.session, id);
    assert_eq!(
        lease_of(&pool, &id).await,
        ("active".into(), Some("w2".into()), 0)
    );

    // Decided before the harness parked it: it stays active, its lease given up.
    let (quick, lease) = session(&store, "quick").await;
    let row = request(&store, &lease, 1, "pay", None).await;
    store
        .decide_approval(approve(&row.id, "alice"))
        .await
        .expect("approve");
    store
        .set_status(lease.fence(), SessionStatus::AwaitingApproval, Some("late"))
        .await
        .expect("await approval");
    assert_eq!(lease_of(&pool, &quick).await, ("active".into(), None, 0));
    assert!(matches!(
        store.renew_lease(&lease, TTL).await,
        Err(StoreError::LeaseLost { .. })
    ));
    let taken = store
        .acquire_lease(&quick, "w3", TTL, 3)
        .await
        .expect("taken");
    assert!(taken.fence > lease.fence);
    assert_eq!(
        lease_of(&pool, &quick).await,
        ("active".into(), Some("w3".into()), 0)
    );
}

/// The columns of a journal row that a decision, an issue or an outcome changes.
const STATE: &str = "status, result, error, spend, approval, mac, finished_at, attempt, fence";

/// An older sealed version of a row put back behind the store's back is refused where
/// it would act: an approved call's row restored after it ran is not issued again (the
/// effect would run twice), and a denied call's row restored as requested is not
/// approved. Each row alone is sealed; the approval log, append-only, says where the
/// call stands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_version_of_a_decided_row_is_refused() {
    let db = test_database().await;
    let store = db.store().await.expect("connect");
    let pool = raw(&db).await;
    let (_, lease) = session(&store, "s").await;
    let ran = request(&store, &lease, 1, "pay", None).await;
    let denied = request(&store, &lease, 1, "email", None).await;
    store
        .decide_approval(approve(&ran.id, "alice"))
        .await
        .expect("approve");
    let save = |name: &'static str, id: CallId| {
        let pool = pool.clone();
        async move {
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                "CREATE TABLE {name} AS SELECT {STATE} FROM durable_tool_calls \
                 WHERE id = '{id}'"
            )))
            .execute(&pool)
            .await
            .expect("save");
        }
    };
    let restore = |name: &'static str, id: CallId| {
        let pool = pool.clone();
        async move {
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                "UPDATE durable_tool_calls SET ({STATE}) = (SELECT {STATE} FROM {name}) \
                 WHERE id = '{id}'"
            )))
            .execute(&pool)
            .await
            .expect("restore");
        }
    };
    save("approved_version", ran.id.clone()).await;
    save("requested_version", denied.id.clone()).await;
    store
        .reissue_call(lease.fence(), &ran.id)
        .await
        .expect("issue");
    store
        .finish_call(
            lease.fence(),
            &ran.id,
            FinishCall {
                outcome: CallOutcome::Completed(json!("paid")),
                spend: None,
            },
            None,
        )
        .await
        .expect("finish");
    store
        .decide_approval(deny(&denied.id, "alice"))
        .await
        .expect("deny");

    restore("approved_version", ran.id.clone()).await;
    tampered(
        "an approved call issued again",
        store.reissue_call(lease.fence(), &ran.id).await,
    );
    restore("requested_version", denied.id.clone()).await;
    tampered(
        "a denied call approved",
        store.decide_approval(approve(&denied.id, "mallory")).await,
    );
}
