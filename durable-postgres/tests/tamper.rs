//! Tamper evidence on PostgreSQL: real `UPDATE`s and `DELETE`s behind the store's back
//! (`durable_conformance::tamper`), key handling (an application key, rotation, a
//! writer without the key, adoption of a store written without seals), and the upgrade
//! of a database written by schema version 1.

use durable_core::store::{CheckpointLog, JournalStore, ResolutionStore, SessionStore};
use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use durable_conformance::tamper::{Tamper, Tamperer, run_tamper_cases};
use durable_core::integrity::Keyring;
use durable_core::store::{CallOutcome, CallStatus, CheckpointStore, FinishCall};
use durable_core::transcript::Message;
use durable_core::{Durable, ReplayClass, SessionId, StartOptions, StoreError, ToolSpec};
use durable_postgres::testing::{TestDatabase, test_database};
use durable_postgres::{PostgresStore, PostgresStoreOptions, migrations};
use serde_json::json;
use sqlx::postgres::PgPool;

/// Tampers with the database through a pool of its own.
struct Raw(PgPool);

#[async_trait]
impl Tamperer for Raw {
    async fn apply(&self, tamper: Tamper) {
        let pool = &self.0;
        let result = match &tamper {
            Tamper::SetInputHash { call, input_hash } => {
                sqlx::query("UPDATE durable_tool_calls SET input_hash = $2 WHERE id = $1")
                    .bind(call.as_str())
                    .bind(input_hash)
                    .execute(pool)
                    .await
            }
            Tamper::ForgetOutcome { call } => {
                sqlx::query(
                    "UPDATE durable_tool_calls SET status = 'not_happened', result = NULL, \
                 mac = NULL WHERE id = $1",
                )
                .bind(call.as_str())
                .execute(pool)
                .await
            }
            Tamper::SetResult { call, result } => {
                sqlx::query("UPDATE durable_tool_calls SET result = $2 WHERE id = $1")
                    .bind(call.as_str())
                    .bind(result)
                    .execute(pool)
                    .await
            }
            Tamper::MoveCall { call, step } => {
                sqlx::query("UPDATE durable_tool_calls SET step = $1 WHERE id = $2")
                    .bind(step)
                    .bind(call.as_str())
                    .execute(pool)
                    .await
            }
            Tamper::SetStatus { call, status } => {
                sqlx::query("UPDATE durable_tool_calls SET status = $1 WHERE id = $2")
                    .bind(status)
                    .bind(call.as_str())
                    .execute(pool)
                    .await
            }
            Tamper::DeleteCall { call } => {
                sqlx::query("DELETE FROM durable_tool_calls WHERE id = $1")
                    .bind(call.as_str())
                    .execute(pool)
                    .await
            }
            Tamper::SwapCallSeqs { a, b } => {
                // One row at a time through a free position: `(session_id, seq)` is unique.
                let seq = |id: &str| {
                    sqlx::query_scalar::<_, i64>("SELECT seq FROM durable_tool_calls WHERE id = $1")
                        .bind(id.to_owned())
                        .fetch_one(pool)
                };
                let (x, y) = (
                    seq(a.as_str()).await.expect("a's seq"),
                    seq(b.as_str()).await.expect("b's seq"),
                );
                let mut tx = pool.begin().await.expect("begin");
                let mut moved = Default::default();
                for (id, to) in [(a, -x), (b, x), (a, y)] {
                    moved = sqlx::query("UPDATE durable_tool_calls SET seq = $2 WHERE id = $1")
                        .bind(id.as_str())
                        .bind(to)
                        .execute(&mut *tx)
                        .await
                        .expect("move a row");
                }
                tx.commit().await.map(|()| moved)
            }
            Tamper::SetMessage {
                session,
                seq,
                message,
            } => {
                sqlx::query(
                    "UPDATE durable_messages SET message = $3, call_seq = NULL \
                     WHERE session_num = (SELECT num FROM durable_sessions WHERE id = $1) AND seq = $2",
                )
                .bind(session.as_str())
                .bind(seq)
                .bind(message)
                .execute(pool)
                .await
            }
            Tamper::DeleteMessage { session, seq } => {
                sqlx::query(
                    "DELETE FROM durable_messages \
                     WHERE session_num = (SELECT num FROM durable_sessions WHERE id = $1) AND seq = $2",
                )
                    .bind(session.as_str())
                    .bind(seq)
                    .execute(pool)
                    .await
            }
            Tamper::SwapMessages { session, a, b } => {
                sqlx::query(
                    "UPDATE durable_messages m SET message = o.message, seal = o.seal \
                 FROM durable_messages o \
                 WHERE m.session_num = (SELECT num FROM durable_sessions WHERE id = $1) \
                   AND o.session_num = m.session_num AND m.seq IN ($2, $3) \
                   AND o.seq = CASE m.seq WHEN $2 THEN $3 ELSE $2 END",
                )
                .bind(session.as_str())
                .bind(a)
                .bind(b)
                .execute(pool)
                .await
            }
            Tamper::SetPlan {
                session,
                version,
                plan,
            } => sqlx::query(
                "UPDATE durable_checkpoints SET plan = $3 \
                 WHERE session_num = (SELECT num FROM durable_sessions WHERE id = $1) AND version = $2",
            )
            .bind(session.as_str())
            .bind(version)
            .bind(plan)
            .execute(pool)
            .await,
            Tamper::RollBackCheckpoint { session } => {
                sqlx::query(
                    "DELETE FROM durable_checkpoints \
                     WHERE session_num = (SELECT num FROM durable_sessions WHERE id = $1) AND version = \
                     (SELECT latest_version FROM durable_sessions WHERE id = $1)",
                )
                .bind(session.as_str())
                .execute(pool)
                .await
                .expect("delete the latest checkpoint");
                sqlx::query(
                    "UPDATE durable_sessions SET latest_version = latest_version - 1 WHERE id = $1",
                )
                .bind(session.as_str())
                .execute(pool)
                .await
            }
            Tamper::DeleteResolutions { session } => {
                sqlx::query("DELETE FROM durable_resolutions WHERE session_id = $1")
                    .bind(session.as_str())
                    .execute(pool)
                    .await
            }
            Tamper::WipeJournal { session } => {
                sqlx::query("DELETE FROM durable_tool_calls WHERE session_id = $1")
                    .bind(session.as_str())
                    .execute(pool)
                    .await
                    .expect("delete the journal");
                sqlx::query(
                    "UPDATE durable_sessions SET journal_rows = 0, resolutions = 0 WHERE id = $1",
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

async fn open(db: &TestDatabase, ring: Keyring) -> Result<PostgresStore, StoreError> {
    PostgresStore::connect_with(PostgresStoreOptions::new(db.url()).keyring(ring)).await
}

fn app(key: u8) -> Keyring {
    Keyring::with_app_key(vec![key; 32]).expect("key")
}

async fn raw(db: &TestDatabase) -> PgPool {
    PgPool::connect(db.url())
        .await
        .expect("raw pool on the test database")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tampering_is_detected_with_the_stores_own_key() {
    let db = test_database().await;
    let store = open(&db, Keyring::none()).await.expect("open");
    let raw = Raw(raw(&db).await);
    run_tamper_cases(Arc::new(store), &raw).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tampering_is_detected_with_an_application_key() {
    let db = test_database().await;
    let store = open(&db, app(1)).await.expect("open");
    let raw = Raw(raw(&db).await);
    run_tamper_cases(Arc::new(store), &raw).await;
}

/// One completed unsafe call in a fresh session; returns the session.
async fn one_call(store: &PostgresStore) -> SessionId {
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

/// Resumes `id` and calls `pay(1)` again: it must replay the recorded result.
async fn pay_replays(store: &PostgresStore, id: &SessionId) {
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
    assert_eq!(runs.load(Ordering::SeqCst), 0, "replayed, not re-run");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_without_the_application_key_is_refused_at_open() {
    let db = test_database().await;
    let store = open(&db, app(1)).await.expect("open with the key");
    one_call(&store).await;
    store.pool().close().await;
    let err = open(&db, Keyring::none()).await.expect_err("no key");
    let StoreError::KeyMissing { key, .. } = &err else {
        panic!("expected KeyMissing, got {err:?}");
    };
    assert_eq!(key, app(1).signing_id(), "names the missing key");
    assert!(!err.to_string().contains('\n'), "one line: {err}");
    let err = open(&db, app(2)).await.expect_err("another key");
    assert!(matches!(err, StoreError::KeyMissing { .. }), "{err:?}");
    // A read-only open re-seals nothing: a wrong key, or none, is one clear line too,
    // not a `Tampered` on every read.
    for ring in [Keyring::none(), app(2)] {
        let err = PostgresStore::connect_with(
            PostgresStoreOptions::new(db.url())
                .keyring(ring)
                .read_only(true),
        )
        .await
        .expect_err("a reader without the key");
        assert!(matches!(err, StoreError::KeyMissing { .. }), "{err:?}");
    }
    // The right key still opens it, nothing re-sealed.
    let store = open(&db, app(1)).await.expect("the key opens it");
    let log: i64 = sqlx::query_scalar("SELECT count(*) FROM durable_integrity_log")
        .fetch_one(store.pool())
        .await
        .expect("log");
    assert_eq!(log, 0, "an empty store had nothing to re-seal");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turning_a_key_on_and_rotating_it_reseals_and_audits() {
    let db = test_database().await;
    let store = open(&db, Keyring::none()).await.expect("open");
    let id = one_call(&store).await;
    store.pool().close().await;

    // Turning an application key on: every row checked under the store key, re-sealed.
    let store = open(&db, app(1)).await.expect("adopt the app key");
    assert!(
        store.calls(&id, None).await.expect("reads")[0]
            .mac
            .as_deref()
            .is_some_and(|m| m.starts_with("app-"))
    );
    store.pool().close().await;
    // The store's own key no longer opens it: it is signed now.
    assert!(matches!(
        open(&db, Keyring::none()).await,
        Err(StoreError::KeyMissing { .. })
    ));
    // Rotation: the new key with the old one as previous.
    let rotated = app(2).previous_app_key(vec![1; 32]).expect("previous");
    let store = open(&db, rotated).await.expect("rotate");
    store
        .load_checkpoint(&id, None)
        .await
        .expect("reads after rotation");
    pay_replays(&store, &id).await;
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
    store.pool().close().await;
    // The old key alone is refused now.
    assert!(matches!(
        open(&db, app(1)).await,
        Err(StoreError::KeyMissing { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_connectors_set_the_keys_up_once() {
    let db = test_database().await;
    let mut connects = Vec::new();
    for _ in 0..4 {
        let url = db.url().to_owned();
        connects.push(tokio::spawn(async move {
            PostgresStore::connect_with(PostgresStoreOptions::new(url).keyring(Keyring::none()))
                .await
        }));
    }
    let mut stores = Vec::new();
    for connect in connects {
        stores.push(connect.await.expect("join").expect("connect"));
    }
    // Every connector bound the same store key: what one seals, another checks.
    let id = one_call(&stores[0]).await;
    for store in &stores[1..] {
        store
            .calls(&id, None)
            .await
            .expect("another connector reads");
    }
    let keys: i64 = sqlx::query_scalar("SELECT count(*) FROM durable_meta WHERE name LIKE '%_key'")
        .fetch_one(stores[0].pool())
        .await
        .expect("meta");
    assert_eq!(keys, 2, "one store key, one signing key");
}

async fn exec(pool: &PgPool, sqls: &[&str]) {
    for sql in sqls {
        sqlx::query(sqlx::AssertSqlSafe(*sql))
            .execute(pool)
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
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_signing_key_row_never_seals_a_forged_row() {
    let db = test_database().await;
    let store = open(&db, app(1)).await.expect("open");
    let id = one_call(&store).await;
    exec(store.pool(), &[FORGE, NO_SIGNING_KEY]).await;
    store.pool().close().await;
    let err = open(&db, app(1))
        .await
        .expect_err("the forged row is named");
    let StoreError::Tampered { session, what, .. } = &err else {
        panic!("expected Tampered, got {err:?}");
    };
    assert_eq!(session, &id);
    assert!(what.contains("journal row"), "{what}");
    let err = open(&db, Keyring::none())
        .await
        .expect_err("without the key");
    assert!(
        matches!(&err, StoreError::KeyMissing { key, .. } if key == app(1).signing_id()),
        "{err:?}"
    );
    assert!(err.to_string().contains("signing_key"), "{err}");
    assert!(open(&db, app(1)).await.is_err(), "still refused");
}

/// The same with the store's own key: the signing key row deleted next to a forged row,
/// or both key rows deleted, is refused, with advice that works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_key_store_with_deleted_key_rows_is_refused() {
    let db = test_database().await;
    let store = open(&db, Keyring::none()).await.expect("open");
    one_call(&store).await;
    exec(store.pool(), &[FORGE, NO_SIGNING_KEY]).await;
    store.pool().close().await;
    let err = open(&db, Keyring::none()).await.expect_err("forged row");
    assert!(matches!(err, StoreError::Tampered { .. }), "{err:?}");
    let pool = raw(&db).await;
    exec(&pool, &["DELETE FROM durable_meta"]).await;
    let err = open(&db, Keyring::none()).await.expect_err("no key rows");
    assert!(
        matches!(&err, StoreError::KeyMissing { key, .. } if key == "store"),
        "{err:?}"
    );
    assert!(!err.to_string().contains("as a previous key"), "{err}");
    let keys: i64 = sqlx::query_scalar("SELECT count(*) FROM durable_meta")
        .fetch_one(&pool)
        .await
        .expect("meta");
    assert_eq!(keys, 0, "no new store key was made");
    // Only the store key row gone: a reader says so in one line too (not a `Tampered`
    // on every read), with the same advice.
    exec(
        &pool,
        &["INSERT INTO durable_meta (name, value) VALUES ('signing_key', 'store-0badc0de')"],
    )
    .await;
    let err = PostgresStore::connect_with(PostgresStoreOptions::new(db.url()).read_only(true))
        .await
        .expect_err("a reader without the store key");
    assert!(
        matches!(&err, StoreError::KeyMissing { key, .. } if key == "store"),
        "{err:?}"
    );
}

/// Only the `signing_key` row deleted, the rows intact: a writer holding the key checks
/// every row, writes the row back and audits it; the recorded result still replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_signing_key_row_is_restored_after_every_row_is_checked() {
    for ring in [app(1), Keyring::none()] {
        let db = test_database().await;
        let store = open(&db, ring.clone()).await.expect("open");
        let id = one_call(&store).await;
        exec(store.pool(), &[NO_SIGNING_KEY]).await;
        store.pool().close().await;
        let store = open(&db, ring.clone()).await.expect("restored");
        pay_replays(&store, &id).await;
        let log = store.integrity_log().await.expect("log");
        assert!(log.is_ok(), "{log:?}");
        assert_eq!(
            log.events
                .iter()
                .map(|e| e.event.as_str())
                .collect::<Vec<_>>(),
            ["restore"]
        );
    }
}

/// A changed `store_key` row: the advice names the row and a backup, not a previous key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_store_key_gives_advice_that_works() {
    let db = test_database().await;
    let store = open(&db, Keyring::none()).await.expect("open");
    one_call(&store).await;
    exec(
        store.pool(),
        &["UPDATE durable_meta SET value = '00112233445566778899aabbccddeeff' WHERE name = 'store_key'"],
    )
    .await;
    store.pool().close().await;
    let err = open(&db, Keyring::none()).await.expect_err("changed key");
    let text = err.to_string();
    assert!(matches!(err, StoreError::KeyMissing { .. }), "{err:?}");
    assert!(text.contains("`store_key` row"), "{text}");
    assert!(!text.contains("as a previous key"), "{text}");
}

/// Every seal and head nulled as well as the key rows deleted: that looks like a store
/// written before seals, but its sealing migration did not run in this open, so it is
/// refused, never adopted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_whose_seals_were_all_removed_is_refused_not_adopted() {
    let db = test_database().await;
    let store = open(&db, app(1)).await.expect("open");
    one_call(&store).await;
    exec(
        store.pool(),
        &[
            FORGE,
            "UPDATE durable_messages SET seal = NULL",
            "UPDATE durable_checkpoints SET seal = NULL",
            "UPDATE durable_sessions SET head = NULL",
            NO_SIGNING_KEY,
        ],
    )
    .await;
    store.pool().close().await;
    let err = open(&db, app(1)).await.expect_err("never adopted");
    assert!(
        matches!(&err, StoreError::KeyMissing { key, .. } if key == "signing_key"),
        "{err:?}"
    );
}

/// Key rotation on PostgreSQL: rotating a session with messages and checkpoints,
/// store key → K1 → K2 (K1 as previous).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotation_rekeys_a_session_with_messages() {
    let db = test_database().await;
    let store = open(&db, Keyring::none()).await.expect("open");
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
    store.pool().close().await;
    let store = open(&db, app(1)).await.expect("store key → K1");
    store.load_checkpoint(&id, None).await.expect("reads");
    store.pool().close().await;
    let rotated = app(2).previous_app_key(vec![1; 32]).expect("previous");
    let store = open(&db, rotated).await.expect("K1 → K2");
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
    // The log is sealed as a whole: an edited or a deleted event shows.
    exec(
        store.pool(),
        &["UPDATE durable_integrity_log SET rows = rows + 1"],
    )
    .await;
    assert!(!store.integrity_log().await.expect("log").is_ok());
    exec(
        store.pool(),
        &["UPDATE durable_integrity_log SET rows = rows - 1"],
    )
    .await;
    assert!(store.integrity_log().await.expect("log").is_ok());
    exec(
        store.pool(),
        &["DELETE FROM durable_integrity_log WHERE id = (SELECT max(id) FROM durable_integrity_log)"],
    )
    .await;
    assert!(!store.integrity_log().await.expect("log").is_ok());
}

/// A database at schema version 1 (one table-wide `seq`, outcome-only MACs) with two
/// interleaved sessions is upgraded: `seq` becomes each session's position, the heads
/// count the rows, everything is sealed once (audited), and it all reads back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_1_database_is_upgraded_and_adopted() {
    let db = test_database().await;
    let pool = raw(&db).await;
    let mut first = migrations();
    first.migrations = Cow::Owned(
        first
            .migrations
            .iter()
            .filter(|m| m.version == 1)
            .cloned()
            .collect(),
    );
    first.run(&pool).await.expect("schema version 1");
    for sql in [
        "INSERT INTO durable_sessions (id, status, app_version, metadata, fence, latest_version, \
         created_at, updated_at, format) VALUES \
         ('a', 'active', 'v1', '{}', 1, 0, 1, 1, 1), ('b', 'active', 'v1', '{}', 1, 0, 2, 2, 1)",
        "INSERT INTO durable_messages (session_id, seq, message, format, created_at) VALUES \
         ('a', 1, '{\"role\":\"user\",\"text\":\"hi\"}', 1, 1)",
        "INSERT INTO durable_checkpoints (session_id, version, last_seq, message_count, plan, \
         budget, state, app_version, format, created_at) VALUES \
         ('a', 0, 1, 1, '{}', '{}', 'null', 'v1', 1, 1), \
         ('b', 0, 0, 0, '{}', '{}', 'null', 'v1', 1, 2)",
    ] {
        sqlx::query(sql).execute(&pool).await.expect(sql);
    }
    // Journal rows of the two sessions interleaved in the table-wide sequence.
    for (id, session, tool, status) in [
        ("a1", "a", "x", "completed"),
        ("b1", "b", "x", "issued"),
        ("a2", "a", "y", "completed"),
        ("b2", "b", "y", "completed"),
        ("a3", "a", "z", "failed"),
    ] {
        sqlx::query(
            "INSERT INTO durable_tool_calls (id, session_id, kind, step, tool_name, input_hash, \
             ordinal, replay_class, status, args, schema_hash, result, error, mac, attempt, \
             fence, format, issued_at) \
             VALUES ($1, $2, 'tool', 1, $3, 'h', 0, 'pure', $4, '{}', 's', \
                     CASE WHEN $4 = 'completed' THEN '1' END, \
                     CASE WHEN $4 = 'failed' THEN '\"no\"' END, 'old-mac', 1, 1, 1, 1)",
        )
        .bind(id)
        .bind(session)
        .bind(tool)
        .bind(status)
        .execute(&pool)
        .await
        .expect("a version 1 journal row");
    }
    sqlx::query(
        "INSERT INTO durable_resolutions (call_id, session_id, decision, result, resolved_by, \
         format, created_at) VALUES ('b1', 'b', 'did_not_happen', NULL, 'ops', 1, 3)",
    )
    .execute(&pool)
    .await
    .expect("a resolution");

    let store = open(&db, Keyring::none()).await.expect("upgrade");
    let (a, b) = (SessionId::new("a"), SessionId::new("b"));
    let calls = store.calls(&a, None).await.expect("a's journal");
    assert_eq!(
        calls.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(),
        ["a1", "a2", "a3"],
        "insertion order is kept"
    );
    assert!(calls.iter().all(|c| c.mac.as_deref() != Some("old-mac")));
    let calls = store.calls(&b, None).await.expect("b's journal");
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0].status, CallStatus::Issued);
    let seqs: Vec<(String, i64)> =
        sqlx::query_as("SELECT id, seq FROM durable_tool_calls ORDER BY id")
            .fetch_all(&pool)
            .await
            .expect("seqs");
    assert_eq!(
        seqs,
        [
            ("a1".into(), 1),
            ("a2".into(), 2),
            ("a3".into(), 3),
            ("b1".into(), 1),
            ("b2".into(), 2)
        ]
    );
    assert_eq!(
        store
            .load_checkpoint(&a, None)
            .await
            .expect("a")
            .message_values()
            .expect("JSON"),
        [json!({"role": "user", "text": "hi"})]
    );
    assert_eq!(
        store.resolutions(&b).await.expect("b's resolutions").len(),
        1
    );
    let log: Vec<(String, i64)> = sqlx::query_as("SELECT event, rows FROM durable_integrity_log")
        .fetch_all(&pool)
        .await
        .expect("log");
    // 5 journal rows, 1 message, 2 checkpoints, 1 resolution, 2 heads.
    assert_eq!(log, [("adopt".into(), 11)]);
    // A new row continues the session's numbering.
    let session = store.session(&b).await.expect("b");
    let lease = durable_core::store::Lease {
        session: b.clone(),
        owner: String::new(),
        fence: session.fence,
        expires_at: 0,
    };
    let call = durable_core::store::NewCall {
        id: durable_core::CallId::new("b3"),
        kind: durable_core::store::CallKind::Tool,
        identity: durable_core::store::CallIdentity {
            session: b.clone(),
            step: 2,
            tool: "x".into(),
            input_hash: "h".into(),
            ordinal: 0,
        },
        class: ReplayClass::Pure,
        args: json!({}),
        idempotency_key: None,
        schema_hash: "s".into(),
    };
    store
        .record_call(
            lease.fence(),
            call,
            FinishCall {
                outcome: CallOutcome::Completed(json!(2)),
                spend: None,
            },
        )
        .await
        .expect("record");
    assert_eq!(store.calls(&b, None).await.expect("b").len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resolve_and_finish_refuse_a_tampered_row() {
    let db = test_database().await;
    let store = open(&db, Keyring::none()).await.expect("open");
    let id = one_call(&store).await;
    let row = store.calls(&id, None).await.expect("calls").remove(0);
    sqlx::query("UPDATE durable_tool_calls SET status = 'issued', result = NULL WHERE id = $1")
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_reports_each_session() {
    let db = test_database().await;
    let store = open(&db, Keyring::none()).await.expect("open");
    let good = one_call(&store).await;
    let bad = one_call(&store).await;
    let report = durable_core::verify::verify_sessions(&store, None)
        .await
        .expect("verify");
    assert!(report.iter().all(|c| c.is_ok()), "{report:?}");
    sqlx::query("UPDATE durable_tool_calls SET result = '\"forged\"' WHERE session_id = $1")
        .bind(bad.as_str())
        .execute(store.pool())
        .await
        .expect("tamper");
    let report = durable_core::verify::verify_sessions(&store, None)
        .await
        .expect("verify");
    let of = |id: &SessionId| {
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
