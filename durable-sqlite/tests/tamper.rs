//! Tamper evidence on SQLite: real `UPDATE`s and `DELETE`s behind the store's back
//! (`durable_core::conformance::tamper`), key handling (an application key, rotation, a
//! writer without the key, adoption of a store written without seals).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use durable_core::conformance::tamper::{Tamper, Tamperer, run_tamper_cases};
use durable_core::integrity::Keyring;
use durable_core::store::{CallOutcome, CheckpointStore, FinishCall};
use durable_core::transcript::Message;
use durable_core::{CallId, Durable, ReplayClass, StartOptions, StoreError, ToolSpec};
use durable_sqlite::{SqliteStore, SqliteStoreOptions};
use serde_json::json;
use sqlx::{AssertSqlSafe, SqlitePool};

/// Tampers with the database file through a connection of its own.
struct Raw(SqlitePool);

const NUM: &str = "(SELECT num FROM durable_sessions WHERE id = ?)";

#[async_trait]
impl Tamperer for Raw {
    async fn apply(&self, tamper: Tamper) {
        let pool = &self.0;
        let result = match &tamper {
            Tamper::SetInputHash { call, input_hash } => {
                sqlx::query("UPDATE durable_tool_calls SET input_hash = ? WHERE id = ?")
                    .bind(input_hash)
                    .bind(call.as_str())
                    .execute(pool)
                    .await
            }
            Tamper::ForgetOutcome { call } => sqlx::query(
                "UPDATE durable_tool_calls SET status = 'not_happened', result = NULL, \
                 mac = NULL WHERE id = ?",
            )
            .bind(call.as_str())
            .execute(pool)
            .await,
            Tamper::SetResult { call, result } => {
                sqlx::query("UPDATE durable_tool_calls SET result = ? WHERE id = ?")
                    .bind(result)
                    .bind(call.as_str())
                    .execute(pool)
                    .await
            }
            Tamper::MoveCall { call, step } => {
                sqlx::query("UPDATE durable_tool_calls SET step = ? WHERE id = ?")
                    .bind(step)
                    .bind(call.as_str())
                    .execute(pool)
                    .await
            }
            Tamper::SetStatus { call, status } => {
                sqlx::query("UPDATE durable_tool_calls SET status = ? WHERE id = ?")
                    .bind(status)
                    .bind(call.as_str())
                    .execute(pool)
                    .await
            }
            Tamper::DeleteCall { call } => {
                sqlx::query("DELETE FROM durable_tool_calls WHERE id = ?")
                    .bind(call.as_str())
                    .execute(pool)
                    .await
            }
            // Through a free position: positions are unique per session, checked row
            // by row.
            Tamper::SwapCallSeqs { a, b } => {
                let seq = |id: &CallId| {
                    sqlx::query_scalar::<_, i64>("SELECT seq FROM durable_tool_calls WHERE id = ?")
                        .bind(id.as_str().to_owned())
                        .fetch_one(pool)
                };
                let (seq_a, seq_b) = (seq(a).await.expect("seq a"), seq(b).await.expect("seq b"));
                sqlx::query(
                    "BEGIN; \
                     UPDATE durable_tool_calls SET seq = -1 WHERE id = ?1; \
                     UPDATE durable_tool_calls SET seq = ?3 WHERE id = ?2; \
                     UPDATE durable_tool_calls SET seq = ?4 WHERE id = ?1; \
                     COMMIT",
                )
                .bind(a.as_str())
                .bind(b.as_str())
                .bind(seq_a)
                .bind(seq_b)
                .execute(pool)
                .await
            }
            Tamper::SetMessage {
                session,
                seq,
                message,
            } => sqlx::query(AssertSqlSafe(format!(
                "UPDATE durable_messages SET message = ?, call_seq = NULL \
                 WHERE session_num = {NUM} AND seq = ?"
            )))
            .bind(message)
            .bind(session.as_str())
            .bind(seq)
            .execute(pool)
            .await,
            Tamper::DeleteMessage { session, seq } => sqlx::query(AssertSqlSafe(format!(
                "DELETE FROM durable_messages WHERE session_num = {NUM} AND seq = ?"
            )))
            .bind(session.as_str())
            .bind(seq)
            .execute(pool)
            .await,
            Tamper::SwapMessages { session, a, b } => sqlx::query(AssertSqlSafe(format!(
                "UPDATE durable_messages SET \
                 message = (SELECT o.message FROM durable_messages o WHERE o.session_num = durable_messages.session_num \
                   AND o.seq = CASE durable_messages.seq WHEN ?2 THEN ?3 ELSE ?2 END), \
                 seal = (SELECT o.seal FROM durable_messages o WHERE o.session_num = durable_messages.session_num \
                   AND o.seq = CASE durable_messages.seq WHEN ?2 THEN ?3 ELSE ?2 END) \
                 WHERE session_num = {} AND seq IN (?2, ?3)",
                "(SELECT num FROM durable_sessions WHERE id = ?1)"
            )))
            .bind(session.as_str())
            .bind(a)
            .bind(b)
            .execute(pool)
            .await,
            Tamper::SetPlan {
                session,
                version,
                plan,
            } => sqlx::query(AssertSqlSafe(format!(
                "UPDATE durable_checkpoints SET plan = ? WHERE session_num = {NUM} AND version = ?"
            )))
            .bind(plan)
            .bind(session.as_str())
            .bind(version)
            .execute(pool)
            .await,
            Tamper::RollBackCheckpoint { session } => {
                sqlx::query(AssertSqlSafe(format!(
                    "DELETE FROM durable_checkpoints WHERE session_num = {NUM} AND version = \
                     (SELECT latest_version FROM durable_sessions WHERE id = ?)"
                )))
                .bind(session.as_str())
                .bind(session.as_str())
                .execute(pool)
                .await
                .expect("delete the latest checkpoint");
                sqlx::query(
                    "UPDATE durable_sessions SET latest_version = latest_version - 1 WHERE id = ?",
                )
                .bind(session.as_str())
                .execute(pool)
                .await
            }
            Tamper::DeleteResolutions { session } => {
                sqlx::query("DELETE FROM durable_resolutions WHERE session_id = ?")
                    .bind(session.as_str())
                    .execute(pool)
                    .await
            }
            Tamper::WipeJournal { session } => {
                sqlx::query("DELETE FROM durable_tool_calls WHERE session_id = ?")
                    .bind(session.as_str())
                    .execute(pool)
                    .await
                    .expect("delete the journal");
                sqlx::query(
                    "UPDATE durable_sessions SET journal_rows = 0, resolutions = 0 WHERE id = ?",
                )
                .bind(session.as_str())
                .execute(pool)
                .await
            }
        };
        let done = result.unwrap_or_else(|e| panic!("{tamper:?}: {e}"));
        assert!(done.rows_affected() > 0, "{tamper:?} changed nothing");
    }
}

async fn open(path: &std::path::Path, ring: Keyring) -> Result<SqliteStore, StoreError> {
    SqliteStore::connect_with(SqliteStoreOptions::file(path).keyring(ring)).await
}

fn app(key: u8) -> Keyring {
    Keyring::with_app_key(vec![key; 32]).expect("key")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tampering_is_detected_with_the_stores_own_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open(&dir.path().join("d.db"), Keyring::none())
        .await
        .expect("open");
    let raw = Raw(store.pool().clone());
    run_tamper_cases(Arc::new(store), &raw).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tampering_is_detected_with_an_application_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open(&dir.path().join("d.db"), app(1)).await.expect("open");
    let raw = Raw(store.pool().clone());
    run_tamper_cases(Arc::new(store), &raw).await;
}

/// One completed unsafe call in a fresh session; returns the store and the session.
async fn one_call(store: &SqliteStore) -> durable_core::SessionId {
    let shared: Arc<dyn CheckpointStore> = Arc::new(store.clone());
    let durable = Durable::builder(shared)
        .owner("w")
        .app_version("v1")
        .build();
    let session = durable
        .start::<Message>(StartOptions::default())
        .await
        .expect("start");
    let spec = ToolSpec::new("pay", "pay", ReplayClass::UnsafeOnReplay, json!({}));
    session
        .journal()
        .tool(&spec, json!({"n": 1}))
        .run(|_| async { Ok::<_, String>(json!("paid")) })
        .await
        .expect("pay");
    session.id().clone()
}

#[tokio::test]
async fn a_writer_without_the_application_key_is_refused_at_open() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("d.db");
    let store = open(&path, app(1)).await.expect("open with the key");
    one_call(&store).await;
    store.close().await;
    let err = open(&path, Keyring::none()).await.expect_err("no key");
    let StoreError::KeyMissing { key, .. } = &err else {
        panic!("expected KeyMissing, got {err:?}");
    };
    assert_eq!(key, app(1).signing_id(), "names the missing key");
    assert!(!err.to_string().contains('\n'), "one line: {err}");
    let err = open(&path, app(2)).await.expect_err("another key");
    assert!(matches!(err, StoreError::KeyMissing { .. }), "{err:?}");
    // The right key still opens it, nothing re-sealed.
    open(&path, app(1)).await.expect("the key opens it");
}

#[tokio::test]
async fn turning_a_key_on_and_rotating_it_reseals_and_audits() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("d.db");
    let store = open(&path, Keyring::none()).await.expect("open");
    let id = one_call(&store).await;
    store.close().await;

    // Turning an application key on: every row checked under the store key, re-sealed.
    let store = open(&path, app(1)).await.expect("adopt the app key");
    assert!(
        store.calls(&id, None).await.expect("reads")[0]
            .mac
            .as_deref()
            .is_some_and(|m| m.starts_with("app-"))
    );
    store.close().await;
    // The store's own key no longer opens it: it is signed now.
    assert!(matches!(
        open(&path, Keyring::none()).await,
        Err(StoreError::KeyMissing { .. })
    ));
    // Rotation: the new key with the old one as previous.
    let rotated = app(2).previous_app_key(vec![1; 32]).expect("previous");
    let store = open(&path, rotated).await.expect("rotate");
    store
        .load_checkpoint(&id, None)
        .await
        .expect("reads after rotation");
    let log: Vec<(String, Option<String>, String)> =
        sqlx::query_as("SELECT event, from_key, to_key FROM durable_integrity_log ORDER BY id")
            .fetch_all(store.pool())
            .await
            .expect("log");
    assert_eq!(
        log.iter().map(|(e, _, _)| e.as_str()).collect::<Vec<_>>(),
        ["rekey", "rekey"],
        "{log:?}"
    );
    assert_eq!(log[1].1.as_deref(), Some(app(1).signing_id()));
    assert_eq!(log[1].2, app(2).signing_id());
    store.close().await;
    // The old key alone is refused now.
    assert!(matches!(
        open(&path, app(1)).await,
        Err(StoreError::KeyMissing { .. })
    ));
}

#[tokio::test]
async fn a_store_without_seals_is_adopted_once_audited() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("d.db");
    let store = open(&path, Keyring::none()).await.expect("open");
    let id = one_call(&store).await;
    // Simulate a store written by the release before seals: no seals, no signing key.
    for sql in [
        "UPDATE durable_tool_calls SET mac = NULL",
        "UPDATE durable_messages SET seal = NULL",
        "UPDATE durable_checkpoints SET seal = NULL",
        "UPDATE durable_sessions SET head = NULL",
        "DELETE FROM durable_meta WHERE name = 'signing_key'",
    ] {
        sqlx::query(sql).execute(store.pool()).await.expect(sql);
    }
    store.close().await;
    let store = open(&path, Keyring::none()).await.expect("adopts");
    let pay = ToolSpec::new("pay", "pay", ReplayClass::UnsafeOnReplay, json!({}));
    let runs = Arc::new(AtomicUsize::new(0));
    let shared: Arc<dyn CheckpointStore> = Arc::new(store.clone());
    let durable = Durable::builder(shared)
        .owner("w")
        .app_version("v1")
        .build();
    let resumed = durable.resume::<Message>(&id).await.expect("resume");
    let counter = Arc::clone(&runs);
    let out = resumed
        .session
        .journal()
        .tool(&pay, json!({"n": 1}))
        .run(move |_| {
            counter.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, String>(json!("paid again")) }
        })
        .await
        .expect("replays");
    assert_eq!(out, json!("paid"));
    assert_eq!(runs.load(Ordering::SeqCst), 0, "replayed, not re-run");
    let events: Vec<String> = sqlx::query_scalar("SELECT event FROM durable_integrity_log")
        .fetch_all(store.pool())
        .await
        .expect("log");
    assert_eq!(events, ["adopt"]);
}

#[tokio::test]
async fn resolve_and_finish_refuse_a_tampered_row() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open(&dir.path().join("d.db"), Keyring::none())
        .await
        .expect("open");
    let id = one_call(&store).await;
    let row = store.calls(&id, None).await.expect("calls").remove(0);
    sqlx::query("UPDATE durable_tool_calls SET status = 'issued', result = NULL WHERE id = ?")
        .bind(row.id.as_str())
        .execute(store.pool())
        .await
        .expect("tamper");
    let err = store
        .resolve_call(durable_core::store::ResolveCall {
            call: row.id.clone(),
            resolution: durable_core::store::Resolution::DidNotHappen,
            by: "ops".into(),
            note: None,
        })
        .await
        .expect_err("a tampered row is not resolved");
    assert!(matches!(err, StoreError::Tampered { .. }), "{err:?}");
    let session = store.session(&id).await.expect("session");
    let lease = durable_core::store::Lease {
        session: id.clone(),
        owner: session.lease_owner.unwrap_or_default(),
        fence: session.fence,
        expires_at: 0,
    };
    let err = store
        .finish_call(
            lease.fence(),
            &row.id,
            FinishCall {
                outcome: CallOutcome::Completed(json!("forged")),
                spend: None,
            },
            None,
        )
        .await
        .expect_err("a tampered row is not finished");
    assert!(matches!(err, StoreError::Tampered { .. }), "{err:?}");
}

#[tokio::test]
async fn verify_reports_each_session() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open(&dir.path().join("d.db"), Keyring::none())
        .await
        .expect("open");
    let good = one_call(&store).await;
    let bad = one_call(&store).await;
    let report = durable_core::verify::verify_sessions(&store, None)
        .await
        .expect("verify");
    assert!(report.iter().all(|c| c.is_ok()), "{report:?}");
    sqlx::query("UPDATE durable_tool_calls SET result = '\"forged\"' WHERE session_id = ?")
        .bind(bad.as_str())
        .execute(store.pool())
        .await
        .expect("tamper");
    let report = durable_core::verify::verify_sessions(&store, None)
        .await
        .expect("verify");
    let of = |id: &durable_core::SessionId| {
        report
            .iter()
            .find(|c| &c.session == id)
            .expect("reported")
            .clone()
    };
    assert!(of(&good).is_ok(), "{report:?}");
    assert_eq!(of(&good).journal_rows, 1);
    let problem = of(&bad).problem.expect("the tampered session is reported");
    assert!(problem.contains("journal row"), "{problem}");
    let one = durable_core::verify::verify_sessions(&store, Some(&good))
        .await
        .expect("verify one");
    assert_eq!(one.len(), 1);
}
