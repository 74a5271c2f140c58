//! Schema 7 on PostgreSQL: messages and checkpoints name their session by its integer key
//! (`durable_sessions.num`), as SQLite's store does. A database written by schema 6 is
//! rebuilt when a writer opens it, and reads back exactly as before: every checkpoint,
//! every message (model replies stored once included), every journal row; sessions then
//! go on.

use durable_core::store::{CheckpointLog, CheckpointStoreExt, JournalStore, LeaseStore};
use std::sync::Arc;
use std::time::Duration;

use durable_core::store::{CallRecord, Checkpoint, CheckpointMeta};
use durable_core::{Block, CheckpointStore, Durable, Message, Session, SessionId, StartOptions};
use durable_postgres::PostgresStore;
use durable_postgres::testing::{TestDatabase, test_database};
use serde_json::json;
use sqlx::postgres::PgPool;

mod schema_6;
mod schema_7;

fn durable(store: &PostgresStore) -> Durable {
    Durable::builder(Arc::new(store.clone()) as Arc<dyn CheckpointStore>)
        .owner("rekey")
        .build()
}

/// One agent turn: the model's reply journaled and pushed (edited on odd turns, so that
/// both stored forms of a message occur), a tool result, a checkpoint.
async fn turn(session: &mut Session<Message>, turn: usize) {
    let reply = session
        .model(|| async move {
            Ok::<_, String>(Message::assistant(vec![
                Block::text(format!("turn {turn}: {}", "an answer ".repeat(10))),
                Block::tool_call(format!("call-{turn}"), "lookup", json!({ "turn": turn })),
            ]))
        })
        .await
        .expect("model");
    let reply = if turn % 2 == 1 {
        Message::assistant(vec![Block::text(format!("edited {turn}"))])
    } else {
        reply
    };
    session.push(reply);
    session.push(Message::tool_result(
        format!("call-{turn}"),
        json!({ "ok": turn }),
        false,
    ));
    session.checkpoint().await.expect("checkpoint");
}

async fn agent(durable: &Durable, turns: usize) -> SessionId {
    let mut options = StartOptions::default();
    options.messages = vec![Message::user("start")];
    let mut session: Session<Message> = durable.start(options).await.expect("start");
    for n in 0..turns {
        turn(&mut session, n).await;
    }
    let id = session.id().clone();
    session.release().await.expect("release");
    id
}

/// Everything a reader gets of `sessions`: each one's checkpoint list, every checkpoint
/// with its transcript, and its journal.
type Seen = Vec<(Vec<CheckpointMeta>, Vec<Checkpoint>, Vec<CallRecord>)>;

async fn read_all(store: &PostgresStore, sessions: &[SessionId]) -> Seen {
    let mut seen = Vec::new();
    for id in sessions {
        let metas = store.list_checkpoints(id).await.expect("list");
        let mut checkpoints = Vec::new();
        for meta in &metas {
            checkpoints.push(
                store
                    .load_checkpoint(id, Some(meta.version))
                    .await
                    .expect("load"),
            );
        }
        seen.push((
            metas,
            checkpoints,
            store.calls(id, None).await.expect("calls"),
        ));
    }
    seen
}

async fn columns(pool: &PgPool, table: &str) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT column_name::text FROM information_schema.columns \
         WHERE table_name = $1 ORDER BY column_name",
    )
    .bind(table)
    .fetch_all(pool)
    .await
    .expect("columns")
}

async fn setup() -> (TestDatabase, PgPool, PostgresStore) {
    let db = test_database().await;
    let pool = PgPool::connect(db.url()).await.expect("raw pool");
    let store = db.store().await.expect("connect");
    (db, pool, store)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_6_database_is_rekeyed_and_reads_the_same() {
    let (db, pool, store) = setup().await;
    let runtime = durable(&store);
    let a = agent(&runtime, 6).await;
    let b = agent(&runtime, 3).await;
    // A fork: its transcript is a copy, its journal empty.
    let forked = SessionId::new("forked");
    let (_, lease) = store
        .fork_session(&a, 3, &forked, "rekey", Duration::from_secs(60))
        .await
        .expect("fork");
    store.release_lease(&lease).await.expect("release");
    let sessions = [a.clone(), b, forked];
    let before = read_all(&store, &sessions).await;
    store.pool().close().await;

    schema_6::back_to_schema_6(&pool).await;
    let references: i64 = sqlx::query_scalar("SELECT count(call_seq) FROM durable_messages")
        .fetch_one(&pool)
        .await
        .expect("references");
    assert!(
        references >= 4,
        "replies stored once are rekeyed too ({references})"
    );
    assert!(
        columns(&pool, "durable_messages")
            .await
            .contains(&"session_id".to_owned())
    );

    let store = db.store().await.expect("the upgrade");
    assert_eq!(read_all(&store, &sessions).await, before);
    for table in ["durable_messages", "durable_checkpoints"] {
        let names = columns(&pool, table).await;
        assert!(
            names.contains(&"session_num".to_owned()) && !names.contains(&"session_id".to_owned()),
            "{table}: {names:?}"
        );
    }
    // The session goes on under its key: resumed, one more turn, read back.
    let runtime = durable(&store);
    let mut session = runtime.resume::<Message>(&a).await.expect("resume").session;
    let version = session.version();
    turn(&mut session, 6).await;
    session.release().await.expect("release");
    let latest = store.load_checkpoint(&a, None).await.expect("load");
    assert_eq!(latest.meta.version, version + 1);
    assert_eq!(
        latest.messages.len(),
        before[0].1.last().expect("a").messages.len() + 2
    );
    assert_eq!(store.calls(&a, None).await.expect("calls").len(), 7);
}

/// Sessions created before and after the upgrade get keys of their own: one session's
/// messages and checkpoints never show in another's reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_keep_their_rows_apart_across_the_upgrade() {
    let (db, pool, store) = setup().await;
    let old = agent(&durable(&store), 2).await;
    store.pool().close().await;
    schema_6::back_to_schema_6(&pool).await;
    let store = db.store().await.expect("the upgrade");
    let new = agent(&durable(&store), 4).await;
    let keys: Vec<i64> = sqlx::query_scalar(
        "SELECT num FROM durable_sessions WHERE id = ANY($1) ORDER BY created_at",
    )
    .bind([old.as_str(), new.as_str()])
    .fetch_all(&pool)
    .await
    .expect("keys");
    assert_eq!(keys.len(), 2);
    assert_ne!(keys[0], keys[1]);
    let count = |id: &SessionId| {
        let store = store.clone();
        let id = id.clone();
        async move {
            let checkpoint = store.load_checkpoint(&id, None).await.expect("load");
            (checkpoint.meta.version, checkpoint.messages.len())
        }
    };
    assert_eq!(count(&old).await, (2, 5));
    assert_eq!(count(&new).await, (4, 9));
}
