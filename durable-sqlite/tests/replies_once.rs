//! Schema 5: a model reply pushed onto the transcript is stored once, in the journal, and
//! the message refers to its row; everything that reads the transcript reads the text.

use durable_core::store::CheckpointLog;
use std::sync::Arc;

use durable_core::{
    Block, CheckpointStore, Durable, Message, Session, SessionId, StartOptions, StoreError,
};
use durable_sqlite::SqliteStore;
use serde_json::json;
use sqlx::ConnectOptions;

fn reply(turn: usize) -> Message {
    Message::assistant(vec![
        Block::text(format!("turn {turn}: {}", "a long answer ".repeat(20))),
        Block::tool_call(format!("call-{turn}"), "lookup", json!({ "turn": turn })),
    ])
}

fn result(turn: usize) -> Message {
    Message::tool_result(format!("call-{turn}"), json!({ "ok": turn }), false)
}

async fn setup() -> (tempfile::TempDir, SqliteStore, Durable) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SqliteStore::open(dir.path().join("durable.db"))
        .await
        .expect("open");
    let durable = Durable::builder(Arc::new(store.clone()) as Arc<dyn CheckpointStore>)
        .owner("replies")
        .build();
    (dir, store, durable)
}

/// `turns` agent turns: the reply journaled, pushed (as is, or edited on odd turns when
/// `edit_odd`), its tool result pushed, a checkpoint. Returns the session and what was
/// pushed.
async fn agent(durable: &Durable, turns: usize, edit_odd: bool) -> (SessionId, Vec<Message>) {
    let mut options = StartOptions::default();
    options.messages = vec![Message::user("start")];
    let mut session: Session<Message> = durable.start(options).await.expect("start");
    let mut pushed = vec![Message::user("start")];
    for turn in 0..turns {
        let answer = session
            .model(|| async move { Ok::<_, String>(reply(turn)) })
            .await
            .expect("model");
        let answer = if edit_odd && turn % 2 == 1 {
            Message::assistant(vec![Block::text(format!("edited {turn}"))])
        } else {
            answer
        };
        session.push(answer.clone());
        session.push(result(turn));
        pushed.extend([answer, result(turn)]);
        session.checkpoint().await.expect("checkpoint");
    }
    let id = session.id().clone();
    session.release().await.expect("release");
    (id, pushed)
}

async fn raw(dir: &tempfile::TempDir) -> sqlx::SqliteConnection {
    sqlx::sqlite::SqliteConnectOptions::new()
        .filename(dir.path().join("durable.db"))
        .connect()
        .await
        .expect("raw")
}

/// (messages stored as a reference, their stored bytes) of a session.
async fn references(conn: &mut sqlx::SqliteConnection, id: &SessionId) -> (i64, i64) {
    sqlx::query_as(
        "SELECT COUNT(call_seq), COALESCE(SUM(CASE WHEN call_seq IS NOT NULL \
         THEN length(message) END), 0) FROM durable_messages \
         WHERE session_num = (SELECT num FROM durable_sessions WHERE id = ?)",
    )
    .bind(id.as_str())
    .fetch_one(conn)
    .await
    .expect("count references")
}

#[tokio::test]
async fn a_pushed_model_reply_is_stored_once_and_read_back_whole() {
    let (dir, store, durable) = setup().await;
    let (id, pushed) = agent(&durable, 6, false).await;
    assert_eq!(
        references(&mut raw(&dir).await, &id).await,
        (6, 0),
        "each of the 6 replies is a reference of no bytes"
    );
    // Every reader sees the text: a resume, a windowed resume, ranges, every version.
    let resumed = durable.resume::<Message>(&id).await.expect("resume");
    assert_eq!(resumed.session.messages(), pushed.as_slice());
    resumed.session.release().await.expect("release");
    let windowed = Durable::builder(Arc::new(store.clone()) as Arc<dyn CheckpointStore>)
        .owner("replies")
        .resume_window(3)
        .build();
    let mut session = windowed
        .resume::<Message>(&id)
        .await
        .expect("resume")
        .session;
    assert_eq!(session.messages(), &pushed[pushed.len() - 3..]);
    session.load_earlier(100).await.expect("earlier");
    assert_eq!(session.messages(), pushed.as_slice());
    session.release().await.expect("release");
    for version in 0..=6 {
        let cp = store
            .load_checkpoint(&id, Some(version))
            .await
            .expect("load");
        let texts: Vec<Message> = cp
            .messages
            .iter()
            .map(|m| m.decode().expect("a message"))
            .collect();
        assert_eq!(
            texts,
            pushed[..1 + 2 * version as usize],
            "version {version}"
        );
    }
}

#[tokio::test]
async fn an_edited_reply_is_stored_in_full() {
    let (dir, _store, durable) = setup().await;
    let (id, pushed) = agent(&durable, 4, true).await;
    assert_eq!(references(&mut raw(&dir).await, &id).await, (2, 0));
    let resumed = durable.resume::<Message>(&id).await.expect("resume");
    assert_eq!(resumed.session.messages(), pushed.as_slice());
}

#[tokio::test]
async fn a_fork_copies_the_text_of_a_referenced_reply() {
    let (dir, store, durable) = setup().await;
    let (id, pushed) = agent(&durable, 3, false).await;
    let fork = durable
        .operator()
        .fork::<Message>(&id, 2, None)
        .await
        .expect("fork at version 2");
    assert_eq!(fork.messages(), &pushed[..5]);
    let fork_id = fork.id().clone();
    fork.release().await.expect("release");
    assert_eq!(references(&mut raw(&dir).await, &fork_id).await, (0, 0));
    let cp = store.load_checkpoint(&fork_id, None).await.expect("load");
    assert_eq!(cp.messages.len(), 5);
}

#[tokio::test]
async fn a_changed_journal_result_breaks_the_message_that_refers_to_it() {
    let (dir, store, durable) = setup().await;
    let (id, _) = agent(&durable, 2, false).await;
    // A valid message, so only the seal can tell.
    let forged =
        serde_json::to_string(&Message::assistant(vec![Block::text("pay mallory")])).expect("json");
    sqlx::query(
        "UPDATE durable_tool_calls SET result = ? WHERE session_id = ? AND kind = 'model' \
         AND step = 0",
    )
    .bind(&forged)
    .bind(id.as_str())
    .execute(&mut raw(&dir).await)
    .await
    .expect("edit the journal");
    match store.load_checkpoint(&id, None).await {
        Err(StoreError::Tampered { what, .. }) => assert_eq!(what, "message 2"),
        other => panic!("a changed reply read as {other:?}"),
    }
}
