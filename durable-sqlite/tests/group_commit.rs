//! Group commit: the journal writes of concurrent sessions share a
//! transaction and a sync, and one session's refused or failing write does not fail its
//! neighbours in the batch.
//!
//! Commits are counted from sqlx's query log (statements that end with `COMMIT`), so the
//! batching is observed, not inferred from timing.

use durable_core::store::{JournalStore, SessionStore};
use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};

use durable_core::store::{
    CallIdentity, CallKind, CallOutcome, FinishCall, IssueOutcome, Lease, NewCall, NewCheckpoint,
    NewSession,
};
use durable_core::{CallId, ReplayClass, SessionId, StoreError};
use durable_sqlite::SqliteStore;
use futures_util::future::join_all;
use serde_json::json;
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions, Connection};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

static COMMITS: AtomicUsize = AtomicUsize::new(0);

/// Counts the statement batches sqlx sends that commit.
struct CommitCounter;

struct Statement(bool);

impl Visit for Statement {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "db.statement" {
            let text = format!("{value:?}");
            self.0 |= text
                .trim_end_matches(['"', ' ', '\n', '\\', 'n'])
                .ends_with("COMMIT");
        }
    }
}

impl Subscriber for CommitCounter {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.target() == "sqlx::query"
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut statement = Statement(false);
        event.record(&mut statement);
        if statement.0 {
            COMMITS.fetch_add(1, Ordering::SeqCst);
        }
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

fn call(session: &SessionId, n: i64) -> NewCall {
    NewCall {
        id: CallId::random(),
        kind: CallKind::Tool,
        identity: CallIdentity {
            session: session.clone(),
            step: 1,
            tool: "lookup".to_owned(),
            input_hash: format!("h{n}"),
            ordinal: 0,
        },
        class: ReplayClass::Pure,
        args: json!({ "n": n }),
        idempotency_key: None,
        schema_hash: "s".to_owned(),
    }
}

fn done(n: i64) -> FinishCall {
    FinishCall {
        outcome: CallOutcome::Completed(json!({ "n": n })),
        spend: None,
    }
}

async fn sessions(store: &SqliteStore, n: usize) -> Vec<Lease> {
    let mut leases = Vec::with_capacity(n);
    for _ in 0..n {
        let id = SessionId::random();
        let new = NewSession {
            id,
            app_version: "v1".into(),
            metadata: json!({}),
            owner: "grouper".into(),
            lease_ttl: std::time::Duration::from_secs(60),
            initial: NewCheckpoint::default(),
            queue: None,
        };
        let (_, lease) = store.create_session(new).await.expect("create");
        leases.push(lease);
    }
    leases
}

#[tokio::test(flavor = "current_thread")]
async fn concurrent_writes_share_commits_and_fail_alone() {
    tracing::subscriber::set_global_default(CommitCounter).expect("the only subscriber");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("group.db");
    let store = SqliteStore::open(&path).await.expect("open");
    let leases = sessions(&store, 32).await;

    // 32 sessions write at once; one of them with a stale fencing token.
    let stale = 7;
    let before = COMMITS.load(Ordering::SeqCst);
    let results = join_all(leases.iter().enumerate().map(|(i, lease)| {
        let mut fence = lease.fence();
        if i == stale {
            fence.token -= 1;
        }
        let store = &store;
        async move {
            store
                .record_call(fence, call(&lease.session, i as i64), done(i as i64))
                .await
        }
    }))
    .await;
    let commits = COMMITS.load(Ordering::SeqCst) - before;
    for (i, result) in results.iter().enumerate() {
        match (i == stale, result) {
            (false, Ok(IssueOutcome::Inserted(_))) => {}
            (true, Err(StoreError::LeaseLost { .. })) => {}
            (_, other) => panic!("session {i}: {other:?}"),
        }
    }
    assert!(
        commits < 8,
        "32 concurrent writes took {commits} commits: they were not batched"
    );
    for (i, lease) in leases.iter().enumerate() {
        let rows = store.calls(&lease.session, None).await.expect("calls");
        assert_eq!(rows.len(), usize::from(i != stale), "rows of session {i}");
    }

    // A write whose statement fails (a trigger refuses one session's rows, as a full
    // disk or a constraint would) is rolled back alone; its neighbours commit.
    let victim = leases[3].session.clone();
    let mut admin = SqliteConnectOptions::from_str(&format!("sqlite://{}", path.display()))
        .expect("url")
        .connect()
        .await
        .expect("connect");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TRIGGER refuse_one BEFORE INSERT ON durable_tool_calls \
         WHEN NEW.session_id = '{victim}' BEGIN SELECT RAISE(ABORT, 'refused'); END"
    )))
    .execute(&mut admin)
    .await
    .expect("trigger");
    admin.close().await.expect("close");
    let results = join_all(leases.iter().enumerate().map(|(i, lease)| {
        let store = &store;
        async move {
            store
                .record_call(
                    lease.fence(),
                    call(&lease.session, 100 + i as i64),
                    done(100 + i as i64),
                )
                .await
        }
    }))
    .await;
    for (i, result) in results.iter().enumerate() {
        match (leases[i].session == victim, result) {
            (true, Err(StoreError::Database { .. })) => {}
            (false, Ok(IssueOutcome::Inserted(_))) => {}
            (_, other) => panic!("session {i}, second round: {other:?}"),
        }
    }
    for (i, lease) in leases.iter().enumerate() {
        let rows = store.calls(&lease.session, None).await.expect("calls");
        // The stale session's first write was refused; the victim's second one failed.
        let want = 2 - usize::from(i == stale) - usize::from(lease.session == victim);
        assert_eq!(
            rows.len(),
            want,
            "rows of session {i} after the second round"
        );
    }
}
