//! Tamper evidence on SQLite: real `UPDATE`s and `DELETE`s behind the store's back
//! (`durable_conformance::tamper`), key handling (an application key, rotation, a
//! writer without the key, adoption of a store written without seals).

use durable_core::store::{CheckpointLog, JournalStore, ResolutionStore, SessionStore};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use durable_conformance::tamper::{Tamper, Tamperer, run_tamper_cases};
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

/// Resumes `id` and runs its `pay` call again: a recorded result comes back; the body
/// runs only if the journal says it never happened. Returns how often the body ran.
async fn pay_again(store: &SqliteStore, id: &durable_core::SessionId) -> usize {
    let pay = ToolSpec::new("pay", "pay", ReplayClass::UnsafeOnReplay, json!({}));
    let runs = Arc::new(AtomicUsize::new(0));
    let shared: Arc<dyn CheckpointStore> = Arc::new(store.clone());
    let durable = Durable::builder(shared)
        .owner("w")
        .app_version("v1")
        .build();
    let resumed = durable.resume::<Message>(id).await.expect("resume");
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
    runs.load(Ordering::SeqCst)
}

async fn exec(store: &SqliteStore, sqls: &[&str]) {
    for sql in sqls {
        sqlx::query(AssertSqlSafe(*sql))
            .execute(store.pool())
            .await
            .expect(sql);
    }
}

const FORGE: &str =
    "UPDATE durable_tool_calls SET status = 'not_happened', result = NULL, mac = NULL";
const NO_SIGNING_KEY: &str = "DELETE FROM durable_meta WHERE name = 'signing_key'";

/// A forged "not happened": a completed unsafe call set back to `not_happened` (its seal
/// nulled) and the `signing_key` row deleted. The next writer must not seal the forged
/// row as found: with the key it checks every row and names the forged one; without it,
/// it names the missing key. Nothing opens, so nothing runs again.
#[tokio::test]
async fn a_deleted_signing_key_row_never_seals_a_forged_row() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("d.db");
    let store = open(&path, app(1)).await.expect("open");
    let id = one_call(&store).await;
    exec(&store, &[FORGE, NO_SIGNING_KEY]).await;
    store.close().await;
    let err = open(&path, app(1))
        .await
        .expect_err("the forged row is named");
    let StoreError::Tampered { session, what, .. } = &err else {
        panic!("expected Tampered, got {err:?}");
    };
    assert_eq!(session, &id);
    assert!(what.contains("journal row"), "{what}");
    let err = open(&path, Keyring::none())
        .await
        .expect_err("without the key");
    assert!(
        matches!(&err, StoreError::KeyMissing { key, .. } if key == app(1).signing_id()),
        "{err:?}"
    );
    assert!(err.to_string().contains("signing_key"), "{err}");
    // Still refused on the next try: nothing was sealed or written back.
    assert!(open(&path, app(1)).await.is_err());
}

/// The same with the store's own key: deleting both key rows, or the signing key row
/// next to a forged row, is refused.
#[tokio::test]
async fn a_store_key_store_with_deleted_key_rows_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("d.db");
    let store = open(&path, Keyring::none()).await.expect("open");
    one_call(&store).await;
    exec(&store, &[FORGE, NO_SIGNING_KEY]).await;
    store.close().await;
    let err = open(&path, Keyring::none()).await.expect_err("forged row");
    assert!(matches!(err, StoreError::Tampered { .. }), "{err:?}");
    let raw = SqlitePool::connect(&format!("sqlite:{}", path.display()))
        .await
        .expect("raw");
    sqlx::query("DELETE FROM durable_meta")
        .execute(&raw)
        .await
        .expect("delete both rows");
    raw.close().await;
    let err = open(&path, Keyring::none()).await.expect_err("no key rows");
    assert!(
        matches!(&err, StoreError::KeyMissing { key, .. } if key == "store"),
        "{err:?}"
    );
    // Only the store key row gone: a reader says so in one line too (not a `Tampered`
    // on every read), with the same advice.
    let raw = SqlitePool::connect(&format!("sqlite:{}", path.display()))
        .await
        .expect("raw");
    sqlx::query("INSERT INTO durable_meta (name, value) VALUES ('signing_key', 'store-0badc0de')")
        .execute(&raw)
        .await
        .expect("signing key row back");
    raw.close().await;
    let err = SqliteStore::open_read_only(&path)
        .await
        .expect_err("a reader without the store key");
    assert!(
        matches!(&err, StoreError::KeyMissing { key, .. } if key == "store"),
        "{err:?}"
    );
    assert!(err.to_string().contains("durable backup"), "{err}");
    let text = err.to_string();
    assert!(text.contains("durable backup"), "{text}");
    assert!(!text.contains("as a previous key"), "{text}");
}

/// Only the `signing_key` row deleted, the rows intact: a writer holding the key checks
/// every row, writes the row back and audits it; the recorded result still replays.
#[tokio::test]
async fn a_deleted_signing_key_row_is_restored_after_every_row_is_checked() {
    for ring in [app(1), Keyring::none()] {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("d.db");
        let store = open(&path, ring.clone()).await.expect("open");
        let id = one_call(&store).await;
        exec(&store, &[NO_SIGNING_KEY]).await;
        store.close().await;
        let store = open(&path, ring.clone()).await.expect("restored");
        assert_eq!(pay_again(&store, &id).await, 0, "replayed, not re-run");
        let log = store.integrity_log().await.expect("log");
        assert!(log.is_ok(), "{log:?}");
        assert_eq!(
            log.events
                .iter()
                .map(|e| e.event.as_str())
                .collect::<Vec<_>>(),
            ["restore"]
        );
        let signing: String =
            sqlx::query_scalar("SELECT value FROM durable_meta WHERE name = 'signing_key'")
                .fetch_one(store.pool())
                .await
                .expect("written back");
        assert!(signing.starts_with(if ring.has_app_key() { "app-" } else { "store-" }));
    }
}

/// A changed `store_key` row: the advice names the row and a backup, not a previous key.
#[tokio::test]
async fn a_changed_store_key_gives_advice_that_works() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("d.db");
    let store = open(&path, Keyring::none()).await.expect("open");
    one_call(&store).await;
    exec(
        &store,
        &["UPDATE durable_meta SET value = '00112233445566778899aabbccddeeff' WHERE name = 'store_key'"],
    )
    .await;
    store.close().await;
    let err = open(&path, Keyring::none()).await.expect_err("changed key");
    let text = err.to_string();
    assert!(matches!(err, StoreError::KeyMissing { .. }), "{err:?}");
    assert!(text.contains("`store_key` row"), "{text}");
    assert!(!text.contains("as a previous key"), "{text}");
}

/// A store written by schema version 1 (no seals, no key rows) is adopted once, audited,
/// because its sealing migration runs in the opening transaction.
#[tokio::test]
async fn a_version_1_store_is_adopted_once_audited() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("d.db");
    {
        let mut conn = sqlx::ConnectOptions::connect(
            &sqlx::sqlite::SqliteConnectOptions::new()
                .filename(&path)
                .create_if_missing(true),
        )
        .await
        .expect("raw");
        let mut first = durable_sqlite::migrations();
        first.migrations = std::borrow::Cow::Owned(
            first
                .migrations
                .iter()
                .filter(|m| m.version == 1)
                .cloned()
                .collect(),
        );
        first.run(&mut conn).await.expect("schema version 1");
        sqlx::query(
            "INSERT INTO durable_sessions (num, id, status, app_version, metadata, fence, \
             latest_version, created_at, updated_at, format) \
             VALUES (1, 'a', 'active', 'v1', '{}', 1, 0, 1, 1, 1)",
        )
        .execute(&mut conn)
        .await
        .expect("session");
        sqlx::query(
            "INSERT INTO durable_checkpoints (session_num, version, last_seq, message_count, \
             plan, budget, state, app_version, format, created_at) \
             VALUES (1, 0, 0, 0, '{}', '{}', 'null', 'v1', 1, 1)",
        )
        .execute(&mut conn)
        .await
        .expect("checkpoint");
        sqlx::Connection::close(conn).await.expect("close");
    }
    let store = open(&path, app(1)).await.expect("adopts");
    store
        .load_checkpoint(&durable_core::SessionId::new("a"), None)
        .await
        .expect("reads");
    let log = store.integrity_log().await.expect("log");
    assert!(log.is_ok(), "{log:?}");
    assert_eq!(
        log.events
            .iter()
            .map(|e| e.event.as_str())
            .collect::<Vec<_>>(),
        ["adopt"]
    );
    store.close().await;
    open(&path, app(1))
        .await
        .expect("opens again, nothing to do");
}

/// Every seal, message head and head nulled as well as the key rows deleted: that looks
/// like a store written before seals, but its sealing migration did not run in this
/// open, so it is refused, never adopted.
#[tokio::test]
async fn a_store_whose_seals_were_all_removed_is_refused_not_adopted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("d.db");
    let store = open(&path, app(1)).await.expect("open");
    one_call(&store).await;
    exec(
        &store,
        &[
            FORGE,
            "UPDATE durable_tool_calls SET mac = NULL",
            "UPDATE durable_messages SET seal = NULL",
            "UPDATE durable_checkpoints SET seal = NULL",
            "UPDATE durable_sessions SET head = NULL",
            NO_SIGNING_KEY,
        ],
    )
    .await;
    store.close().await;
    let err = open(&path, app(1)).await.expect_err("never adopted");
    assert!(
        matches!(&err, StoreError::KeyMissing { key, .. } if key == "signing_key"),
        "{err:?}"
    );
}

/// Key rotation: rotating a session that has messages and checkpoints, K1 → K2 (K1 as
/// previous) and store key → application key, checks each checkpoint against the old
/// transcript seals, not the new ones.
#[tokio::test]
async fn rotation_rekeys_a_session_with_messages() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("d.db");
    let store = open(&path, Keyring::none()).await.expect("open");
    let id = with_messages(&store).await;
    store.close().await;
    let store = open(&path, app(1)).await.expect("store key → K1");
    store.load_checkpoint(&id, None).await.expect("reads");
    store.close().await;
    let rotated = app(2).previous_app_key(vec![1; 32]).expect("previous");
    let store = open(&path, rotated).await.expect("K1 → K2");
    let loaded = store.load_checkpoint(&id, None).await.expect("reads");
    assert_eq!(loaded.message_values().expect("JSON").len(), 4);
    let report = durable_core::verify::verify_sessions(&store, None)
        .await
        .expect("verify");
    assert!(report.iter().all(|c| c.is_ok()), "{report:?}");
    let log = store.integrity_log().await.expect("log");
    assert!(log.is_ok(), "{log:?}");
    assert_eq!(
        log.events
            .iter()
            .map(|e| e.event.as_str())
            .collect::<Vec<_>>(),
        ["rekey", "rekey"]
    );
}

/// A session with four messages over two checkpoints.
async fn with_messages(store: &SqliteStore) -> durable_core::SessionId {
    let shared: Arc<dyn CheckpointStore> = Arc::new(store.clone());
    let durable = Durable::builder(shared)
        .owner("w")
        .app_version("v1")
        .build();
    let mut options = StartOptions::default();
    options.messages = vec![Message::user("start")];
    let mut session = durable.start::<Message>(options).await.expect("start");
    session.push(Message::user("one"));
    session.checkpoint().await.expect("checkpoint");
    session.push(Message::user("two"));
    session.push(Message::user("three"));
    session.checkpoint().await.expect("checkpoint");
    let id = session.id().clone();
    session.release().await.expect("release");
    id
}

/// The integrity log is sealed as a whole: an edited or deleted event shows.
#[tokio::test]
async fn the_integrity_log_is_sealed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("d.db");
    let store = open(&path, Keyring::none()).await.expect("open");
    one_call(&store).await;
    store.close().await;
    let store = open(&path, app(1)).await.expect("rekey");
    store.close().await;
    let rotated = app(2).previous_app_key(vec![1; 32]).expect("previous");
    let store = open(&path, rotated).await.expect("rotate");
    assert!(store.integrity_log().await.expect("log").is_ok());
    exec(
        &store,
        &["UPDATE durable_integrity_log SET rows = rows + 1 WHERE id = 1"],
    )
    .await;
    let log = store.integrity_log().await.expect("log");
    assert!(!log.is_ok(), "an edited event shows: {log:?}");
    exec(
        &store,
        &["UPDATE durable_integrity_log SET rows = rows - 1 WHERE id = 1"],
    )
    .await;
    assert!(store.integrity_log().await.expect("log").is_ok());
    exec(&store, &["DELETE FROM durable_integrity_log WHERE id = 2"]).await;
    let log = store.integrity_log().await.expect("log");
    assert!(!log.is_ok(), "a deleted event shows: {log:?}");
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

/// The witness for adoption cannot be faked from the database: rolling the migrations
/// table back to schema 1 (so that the sealing migration would "run in this open") makes
/// that migration fail on the tables it creates, and nothing is sealed as found.
#[tokio::test]
async fn a_rolled_back_migrations_table_does_not_fake_a_version_1_store() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("d.db");
    let store = open(&path, app(1)).await.expect("open");
    one_call(&store).await;
    exec(
        &store,
        &[
            FORGE,
            "UPDATE durable_messages SET seal = NULL",
            "UPDATE durable_checkpoints SET seal = NULL",
            "UPDATE durable_sessions SET head = NULL",
            "DELETE FROM durable_meta",
            "DELETE FROM durable_schema_migrations WHERE version >= 2",
        ],
    )
    .await;
    store.close().await;
    let err = open(&path, app(1)).await.expect_err("never adopted");
    assert!(!matches!(err, StoreError::Tampered { .. }), "{err:?}");
    let raw = SqlitePool::connect(&format!("sqlite:{}", path.display()))
        .await
        .expect("raw");
    let sealed: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM durable_tool_calls WHERE mac IS NOT NULL")
            .fetch_one(&raw)
            .await
            .expect("count");
    assert_eq!(sealed, 0, "the forged row was not sealed");
}
