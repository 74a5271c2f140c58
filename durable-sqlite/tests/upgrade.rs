//! Opening a database written by schema 3, whose session heads did not count their issued
//! rows: the store counts and re-seals every head once, after checking the session, and a
//! session that fails its checks is refused on its own while the others work.
//!
//! A schema-3 database is made from a current one the way schema 3 would have left it:
//! the head re-sealed in the old format (`Head::legacy_fields`), the `issued_rows` column
//! and its index dropped (and schema 5's `call_seq` and view: these sessions have no model
//! replies), migrations 4 and 5 forgotten.

use durable_core::store::{CheckpointLog, JournalStore, SessionStore};
use std::path::Path;
use std::time::Duration;

use durable_core::integrity::{Head, Keyring};
use durable_core::store::{
    CallIdentity, CallKind, CallOutcome, CallStatus, FinishCall, IssueOutcome, Lease, NewCall,
    NewCheckpoint, NewSession,
};
use durable_core::{CallId, ReplayClass, SessionId, StoreError};
use durable_sqlite::{SqliteStore, SqliteStoreOptions};
use serde_json::json;
use sqlx::{ConnectOptions, Row, SqliteConnection};

const KEY: &[u8] = b"an application key of at least 32 bytes, for the upgrade test";

fn ring() -> Keyring {
    Keyring::with_app_key(KEY.to_vec()).expect("key")
}

async fn open(path: &Path) -> Result<SqliteStore, StoreError> {
    SqliteStore::connect_with(SqliteStoreOptions::file(path).keyring(ring())).await
}

async fn raw(path: &Path) -> SqliteConnection {
    sqlx::sqlite::SqliteConnectOptions::new()
        .filename(path)
        .busy_timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect("open a raw connection")
}

fn new_call(session: &SessionId, n: i64) -> NewCall {
    NewCall {
        id: CallId::random(),
        kind: CallKind::Tool,
        identity: CallIdentity {
            session: session.clone(),
            step: 1,
            tool: "transfer".into(),
            input_hash: format!("hash-{n}"),
            ordinal: 0,
        },
        class: ReplayClass::UnsafeOnReplay,
        args: json!({ "n": n }),
        idempotency_key: None,
        schema_hash: "schema-1".into(),
    }
}

/// A session with `issued` rows left in doubt and `completed` rows finished; its lease.
async fn session(store: &SqliteStore, issued: i64, completed: i64) -> (SessionId, Lease) {
    let id = SessionId::random();
    let (_, lease) = store
        .create_session(NewSession {
            id: id.clone(),
            app_version: "v1".into(),
            metadata: json!({}),
            owner: "w1".into(),
            lease_ttl: Duration::from_secs(60),
            initial: NewCheckpoint {
                messages: vec![json!({"role": "user", "content": "hi"})],
                plan: json!({}),
                budget: json!({}),
                state: json!(null),
                wake_at: None,
            },
            queue: None,
        })
        .await
        .expect("create");
    for n in 0..issued + completed {
        let row = match store
            .issue_call(lease.fence(), new_call(&id, n))
            .await
            .expect("issue")
        {
            IssueOutcome::Inserted(row) => row,
            other => panic!("not inserted: {other:?}"),
        };
        if n >= issued {
            let finish = FinishCall {
                outcome: CallOutcome::Completed(json!({ "n": n })),
                spend: None,
            };
            store
                .finish_call(lease.fence(), &row.id, finish, None)
                .await
                .expect("finish");
        }
    }
    (id, lease)
}

/// Rewrites the database as schema 3 left it: every head sealed without its count, and
/// nothing of schemas 4 to 6 (these sessions requested no approvals).
async fn as_schema_3(path: &Path) {
    let mut conn = raw(path).await;
    let heads = sqlx::query(
        "SELECT s.id, s.journal_rows, s.latest_version, s.resolutions, \
         (SELECT k.seal FROM durable_checkpoints k WHERE k.session_num = s.num \
          AND k.version = s.latest_version) AS checkpoint_seal FROM durable_sessions s",
    )
    .fetch_all(&mut conn)
    .await
    .expect("heads");
    for row in heads {
        let id: String = row.get("id");
        let checkpoint_seal: String = row.get("checkpoint_seal");
        let head = Head {
            session: &id,
            journal_rows: row.get("journal_rows"),
            latest_version: row.get("latest_version"),
            checkpoint_seal: &checkpoint_seal,
            resolutions: row.get("resolutions"),
            issued_rows: 0,
            approvals: 0,
        };
        let seal = ring().seal(&head.legacy_fields()).expect("seal");
        sqlx::query("UPDATE durable_sessions SET head = ? WHERE id = ?")
            .bind(seal)
            .bind(&id)
            .execute(&mut conn)
            .await
            .expect("old head");
    }
    sqlx::query(
        "DROP TABLE durable_signals; \
         DROP INDEX durable_sessions_parent; \
         ALTER TABLE durable_sessions DROP COLUMN parent_id; \
         ALTER TABLE durable_sessions DROP COLUMN waiting_for; \
         ALTER TABLE durable_sessions DROP COLUMN waiting_until; \
         ALTER TABLE durable_sessions DROP COLUMN cancel_by; \
         ALTER TABLE durable_sessions DROP COLUMN cancel_reason; \
         ALTER TABLE durable_sessions DROP COLUMN cancel_requested_at; \
                 DROP TABLE durable_limit_raises; \
         DROP INDEX durable_sessions_active_tenant; \
         DROP TABLE durable_tenants; \
         ALTER TABLE durable_sessions DROP COLUMN tenant; \
         DROP INDEX durable_sessions_claim_rank; \
         ALTER TABLE durable_sessions DROP COLUMN claim_rank; \
         ALTER TABLE durable_sessions DROP COLUMN priority; \
         DROP TABLE durable_limit_waiters; \
         DROP TABLE durable_limits; \
         ALTER TABLE durable_tool_calls DROP COLUMN operator_needed_at; \
         ALTER TABLE durable_sessions DROP COLUMN lease_ran; \
         DROP INDEX durable_sessions_claim; \
         DROP INDEX durable_sessions_sleeping; \
         DROP INDEX durable_sessions_active_queue; \
         DROP TABLE durable_queues; \
         ALTER TABLE durable_sessions DROP COLUMN lease_renewed_at; \
         ALTER TABLE durable_sessions DROP COLUMN wake_at; \
         ALTER TABLE durable_sessions DROP COLUMN queue; \
         DROP TABLE durable_approvals; \
         ALTER TABLE durable_sessions DROP COLUMN approvals; \
         DROP INDEX durable_tool_calls_requested; \
         ALTER TABLE durable_tool_calls DROP COLUMN approval; \
         DROP VIEW durable_transcript; \
         ALTER TABLE durable_messages DROP COLUMN call_seq; \
         DROP INDEX durable_sessions_uncounted; \
         ALTER TABLE durable_sessions DROP COLUMN issued_rows; \
         DELETE FROM durable_schema_migrations WHERE version >= 4",
    )
    .execute(&mut conn)
    .await
    .expect("back to schema 3");
}

#[tokio::test]
async fn a_schema_3_database_counts_its_issued_rows_when_opened() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("durable.db");
    let store = open(&path).await.expect("open");
    let (mixed, _) = session(&store, 2, 3).await;
    let (quiet, _) = session(&store, 0, 0).await;
    store.close().await;
    as_schema_3(&path).await;

    let store = open(&path).await.expect("open and upgrade");
    let issued = store.issued_calls(&mixed).await.expect("issued_calls");
    assert_eq!(issued.len(), 2, "the two rows left in doubt");
    assert!(issued.iter().all(|r| r.status == CallStatus::Issued));
    assert_eq!(store.calls(&mixed, None).await.expect("calls").len(), 5);
    assert!(store.issued_calls(&quiet).await.expect("quiet").is_empty());
    let counts: Vec<Option<i64>> =
        sqlx::query_scalar("SELECT issued_rows FROM durable_sessions ORDER BY num")
            .fetch_all(&mut raw(&path).await)
            .await
            .expect("counts");
    assert_eq!(counts, [Some(2), Some(0)]);
    store.close().await;
    // Opening again counts nothing again and reads the same.
    let store = open(&path).await.expect("reopen");
    assert_eq!(store.issued_calls(&mixed).await.expect("again").len(), 2);
}

#[tokio::test]
async fn an_edited_schema_3_session_is_refused_and_spares_the_others() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("durable.db");
    let store = open(&path).await.expect("open");
    let (edited, _) = session(&store, 1, 1).await;
    let (intact, _) = session(&store, 1, 0).await;
    store.close().await;
    as_schema_3(&path).await;
    // Before the upgrade, the in-doubt call of one session is shown as completed: counted
    // as found, its resume would not report it.
    sqlx::query(
        "UPDATE durable_tool_calls SET status = 'completed' \
         WHERE session_id = ? AND status = 'issued'",
    )
    .bind(edited.as_str())
    .execute(&mut raw(&path).await)
    .await
    .expect("edit");

    let store = open(&path).await.expect("the store opens");
    for read in [
        store.issued_calls(&edited).await.map(|_| ()),
        store.calls(&edited, None).await.map(|_| ()),
    ] {
        match read {
            Err(StoreError::Tampered { session, .. }) => assert_eq!(session, edited),
            other => panic!("the edited session read as {other:?}"),
        }
    }
    assert_eq!(
        store
            .issued_calls(&intact)
            .await
            .expect("the other session")
            .len(),
        1
    );
}

/// A session refused at the upgrade (left uncounted) is refused on every read and write,
/// as on PostgreSQL: it is not served, and no write re-seals its head in the old format.
/// (Review finding: its old-format head passed the read check, and a checkpoint was
/// written.)
#[tokio::test]
async fn a_refused_session_is_refused_on_every_read_and_write() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("durable.db");
    let store = open(&path).await.expect("open");
    let (edited, lease) = session(&store, 1, 1).await;
    store.close().await;
    as_schema_3(&path).await;
    sqlx::query(
        "UPDATE durable_tool_calls SET status = 'completed' \
         WHERE session_id = ? AND status = 'issued'",
    )
    .bind(edited.as_str())
    .execute(&mut raw(&path).await)
    .await
    .expect("edit");
    let store = open(&path).await.expect("the store opens");
    let load = store.load_checkpoint(&edited, None).await.map(|_| ());
    let steps = store.calls(&edited, Some(1)).await.map(|_| ());
    let range = store.messages(&edited, 1, 1).await.map(|_| ());
    let saved = store
        .save_checkpoint(
            lease.fence(),
            0,
            NewCheckpoint {
                messages: vec![json!({"role": "user", "content": "more"})],
                plan: json!({}),
                budget: json!({}),
                state: json!(null),
                wake_at: None,
            },
        )
        .await
        .map(|_| ());
    for (what, result) in [
        ("load_checkpoint", load),
        ("a step read", steps),
        ("messages", range),
        ("save_checkpoint", saved),
    ] {
        match result {
            Err(StoreError::Tampered { session, .. }) => assert_eq!(session, edited, "{what}"),
            other => panic!("{what} of a session refused at the upgrade: {other:?}"),
        }
    }
    let head: Option<i64> =
        sqlx::query_scalar("SELECT issued_rows FROM durable_sessions WHERE id = ?")
            .bind(edited.as_str())
            .fetch_one(&mut raw(&path).await)
            .await
            .expect("head");
    assert_eq!(head, None, "nothing re-sealed the head");
}
