//! Round trips to SQLite per journal operation, counted from sqlx's own query log (one
//! `sqlx::query` event per batch of statements sent to a connection's worker thread).
//!
//! Each round trip is a hop to that thread and back, which is what a journaled call
//! costs beyond its commit (a measurement found ~200 µs per call outside SQLite with six
//! of them). These counts are the contract of the write paths: a change that adds a
//! statement to a hot path fails here, not only in a benchmark. One test, so that the
//! process-wide subscriber counts nothing else.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use durable_core::transcript::Message;
use durable_core::{Durable, ReplayClass, Session, StartOptions, ToolSpec};
use durable_sqlite::SqliteStore;
use serde_json::json;
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

static QUERIES: AtomicUsize = AtomicUsize::new(0);

/// Whether a query event's statement is a `PRAGMA`.
struct Pragma(bool);

impl tracing::field::Visit for Pragma {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "summary" {
            self.0 |= format!("{value:?}")
                .trim_start_matches('"')
                .starts_with("PRAGMA");
        }
    }
}

/// Counts sqlx's query events other than `PRAGMA`s; records nothing else.
struct QueryCounter;

impl Subscriber for QueryCounter {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.target() == "sqlx::query"
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        if event.metadata().target() != "sqlx::query" {
            return;
        }
        // Opening a connection (sqlx returns one to its pool from a spawned task, so a
        // read right after another may open a new one) and the store's one-time
        // durability check are PRAGMAs; the operations themselves use none.
        let mut pragma = Pragma(false);
        event.record(&mut pragma);
        if !pragma.0 {
            QUERIES.fetch_add(1, Ordering::SeqCst);
        }
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

/// Round trips made by `f`.
async fn count<T>(f: impl AsyncFnOnce() -> T) -> (usize, T) {
    let before = QUERIES.load(Ordering::SeqCst);
    let out = f().await;
    (QUERIES.load(Ordering::SeqCst) - before, out)
}

fn spec(name: &str, class: ReplayClass) -> ToolSpec {
    ToolSpec::new(
        name,
        "A tool whose body returns at once.",
        class,
        json!({"type": "object", "properties": {"n": {"type": "integer"}}}),
    )
}

async fn call(session: &Session<Message>, spec: &ToolSpec, n: i64) {
    session
        .journal()
        .tool(spec, json!({ "n": n }))
        .run(|_ctx| async move { Ok::<_, String>(json!({"ok": n})) })
        .await
        .expect("journaled call");
}

#[tokio::test(flavor = "current_thread")]
async fn journal_operations_take_these_round_trips() {
    tracing::subscriber::set_global_default(QueryCounter).expect("the only subscriber");
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SqliteStore::open(dir.path().join("trips.db"))
        .await
        .expect("open");
    let durable = Durable::builder(Arc::new(store)).owner("trips").build();
    let mut session = durable
        .start::<Message>(StartOptions::new())
        .await
        .expect("start");
    let pure = spec("lookup", ReplayClass::Pure);
    let unsafe_ = spec("send", ReplayClass::UnsafeOnReplay);

    // The first call of a lease marks it running (one statement, once per lease: a death
    // from now on counts toward parking the session); the first call of a step reads the
    // step's rows: one statement.
    let (first, ()) = count(async || call(&session, &pure, 0).await).await;
    assert_eq!(
        first,
        1 + 1 + 2,
        "first call of a lease and of a step: the running mark, the step read, then the write"
    );

    // BEGIN IMMEDIATE + the fenced SELECT; INSERT + head UPDATE + COMMIT.
    let (trips, ()) = count(async || call(&session, &pure, 1).await).await;
    assert_eq!(trips, 2, "a pure call (record_call)");

    // The first unsafe call of a journal checks the store's durability settings once
    // (two PRAGMAs, not counted); then issue_call and finish_call, two each.
    let (trips, ()) = count(async || call(&session, &unsafe_, 2).await).await;
    assert_eq!(trips, 4, "the first unsafe_on_replay call");
    let (trips, ()) = count(async || call(&session, &unsafe_, 3).await).await;
    assert_eq!(
        trips, 4,
        "an unsafe_on_replay call (issue_call, finish_call)"
    );

    // BEGIN IMMEDIATE + the fenced SELECT with the latest checkpoint's tail; the
    // messages, the checkpoint, the session row and COMMIT.
    session.push(Message::user("one"));
    session.push(Message::user("two"));
    let (trips, meta) = count(async || session.checkpoint().await).await;
    meta.expect("checkpoint");
    assert_eq!(trips, 2, "a checkpoint with two messages");

    // Whatever the journal's length: a session of many steps costs the same per step.
    for n in 0..50 {
        call(&session, &pure, 100 + n).await;
        session.push(Message::user(format!("turn {n}")));
        session.checkpoint().await.expect("checkpoint");
    }
    let (trips, ()) = count(async || {
        call(&session, &pure, 1_000).await;
        call(&session, &pure, 1_001).await;
    })
    .await;
    assert_eq!(trips, 1 + 2 + 2, "two calls of a step, 50 steps later");
    let (trips, meta) = count(async || session.checkpoint().await).await;
    meta.expect("checkpoint");
    assert_eq!(trips, 2, "a checkpoint, 50 steps later");

    // Resume: the lease (BEGIN IMMEDIATE + the session row; UPDATE; COMMIT), the session
    // row, the checkpoint (BEGIN + head and checkpoint; transcript + COMMIT) and the
    // whole journal with its count (one statement).
    // A resume first opens reader connections (sqlx returns a connection to its pool
    // from a spawned task, so back-to-back reads may open another): warm them up.
    let id = session.id().clone();
    session.release().await.expect("release");
    let warm = durable.resume::<Message>(&id).await.expect("resume");
    warm.session.release().await.expect("release");
    let (trips, resumed) = count(async || durable.resume::<Message>(&id).await).await;
    let resumed = resumed.expect("resume");
    assert_eq!(resumed.session.messages().len(), 2 + 50);
    assert_eq!(trips, 3 + 1 + 2 + 1, "a resume");
}
