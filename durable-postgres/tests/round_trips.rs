//! How many statements each store operation sends, read from the server's statement log
//! (`log_statement = all` on the test database), checked against the counts each
//! operation is meant to take. Not a timed test. It reads the throwaway cluster's log
//! file, so with `DATABASE_URL` set it has nothing to read and says so. To see the
//! statements: `cargo test -p durable-postgres --features testing --test round_trips --
//! --nocapture`.
//!
//! Each operation runs once to warm the connection's statement cache (a statement's first
//! use on a connection costs one more round trip to prepare it), then once measured. The
//! store has one connection, so every logged line of its backend is one of its statements.
//! A logged statement is one round trip; a pool configured to ping before each acquire adds
//! one more, which the log does not show.

use durable_core::store::{CheckpointLog, JournalStore, LeaseStore, QueueStore, SessionStore};
use std::time::Duration;

use durable_core::ids::{CallId, SessionId};
use durable_core::replay::ReplayClass;
use durable_core::store::{
    CallIdentity, CallKind, CallOutcome, Fence, FinishCall, IssueOutcome, Lease, NewCall,
    NewCheckpoint, NewSession,
};
use durable_postgres::testing::test_database;
use durable_postgres::{PostgresStore, PostgresStoreOptions};
use serde_json::{Value, json};
use sqlx::postgres::PgPool;
use sqlx::{AssertSqlSafe, Row};

/// Reads the statements the store's backend logged after `from` (a byte offset).
struct Log {
    pool: PgPool,
    path: String,
    pid: i32,
}

impl Log {
    async fn len(&self) -> i64 {
        sqlx::query("SELECT (pg_stat_file($1)).size AS size")
            .bind(&self.path)
            .fetch_one(&self.pool)
            .await
            .expect("log size")
            .get("size")
    }

    /// The statements logged by the store's backend since `from`.
    async fn since(&self, from: i64) -> Vec<String> {
        // The server writes the log asynchronously to our reads of it.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let to = self.len().await;
        let text: String = sqlx::query("SELECT pg_read_file($1, $2, $3) AS text")
            .bind(&self.path)
            .bind(from)
            .bind(to - from)
            .fetch_one(&self.pool)
            .await
            .expect("read the log")
            .get("text");
        let mine = format!("[{}]", self.pid);
        text.lines()
            .filter(|l| l.contains(&mine))
            .filter(|l| l.contains("LOG:  statement: ") || l.contains("LOG:  execute "))
            .map(|l| {
                let at = l.find("LOG:  ").unwrap_or(0);
                l[at + 6..].to_owned()
            })
            .collect()
    }
}

fn call(session: &SessionId, step: i64, tool: &str) -> NewCall {
    NewCall {
        id: CallId::random(),
        kind: CallKind::Tool,
        identity: CallIdentity {
            session: session.clone(),
            step,
            tool: tool.into(),
            input_hash: "h".into(),
            ordinal: 0,
        },
        class: ReplayClass::Pure,
        args: json!({"q": tool}),
        idempotency_key: None,
        schema_hash: "s".into(),
    }
}

fn done() -> FinishCall {
    FinishCall {
        outcome: CallOutcome::Completed(json!(1)),
        spend: None,
    }
}

fn checkpoint(text: &str) -> NewCheckpoint {
    NewCheckpoint {
        messages: vec![json!({"role": "user", "text": text})],
        plan: json!({}),
        budget: json!({}),
        state: Value::Null,
        wake_at: None,
    }
}

fn id_of(outcome: IssueOutcome) -> CallId {
    match outcome {
        IssueOutcome::Inserted(r) | IssueOutcome::Existing(r) => r.id,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_per_operation() {
    if std::env::var_os("DATABASE_URL").is_some() {
        // The statement log is read from the throwaway cluster's log file; a server of
        // the user's own has it elsewhere, if at all.
        eprintln!("statements_per_operation: needs the throwaway cluster (DATABASE_URL is set)");
        return;
    }
    let db = test_database().await;
    let admin = PgPool::connect(db.url()).await.expect("admin pool");
    sqlx::query(AssertSqlSafe(format!(
        "ALTER DATABASE {} SET log_statement = 'all'",
        db.name()
    )))
    .execute(&admin)
    .await
    .expect("log statements");
    let data: String = sqlx::query("SELECT current_setting('data_directory') AS d")
        .fetch_one(&admin)
        .await
        .expect("data directory")
        .get("d");
    let path = format!("{}/server.log", data.trim_end_matches("/data"));
    let store = PostgresStore::connect_with(PostgresStoreOptions::new(db.url()).max_connections(1))
        .await
        .expect("store");
    let pid: i32 = sqlx::query("SELECT pg_backend_pid() AS pid")
        .fetch_one(store.pool())
        .await
        .expect("pid")
        .get("pid");
    let log = Log {
        pool: admin,
        path,
        pid,
    };
    let session = SessionId::random();
    let (_, lease) = store
        .create_session(NewSession {
            id: session.clone(),
            app_version: "v1".into(),
            metadata: json!({}),
            owner: "w".into(),
            lease_ttl: Duration::from_secs(600),
            initial: checkpoint("hi"),
            queue: None,
        })
        .await
        .expect("create");
    let fence: Fence<'_> = lease.fence();
    let mut version = 0;
    // Some history, so that nothing is measured on an empty session.
    for step in 1..=20 {
        store
            .record_call(fence, call(&session, step, "warm"), done())
            .await
            .expect("warm record");
    }

    let mut report = Vec::new();
    for round in 0..2 {
        let step = 100 + round;
        let mut measure = |name: &'static str, lines: Vec<String>| {
            if round == 1 {
                report.push((name, lines));
            }
        };

        let from = log.len().await;
        store
            .record_call(fence, call(&session, step, "pure"), done())
            .await
            .expect("record");
        measure("record_call", log.since(from).await);

        let from = log.len().await;
        let id = id_of(
            store
                .issue_call(fence, call(&session, step, "unsafe"))
                .await
                .expect("issue"),
        );
        measure("issue_call", log.since(from).await);

        let from = log.len().await;
        store
            .finish_call(fence, &id, done(), None)
            .await
            .expect("finish");
        measure("finish_call", log.since(from).await);

        let from = log.len().await;
        store
            .save_checkpoint(fence, version, checkpoint("turn"))
            .await
            .expect("checkpoint");
        version += 1;
        measure("save_checkpoint", log.since(from).await);

        let from = log.len().await;
        store.calls(&session, Some(step)).await.expect("step");
        measure("calls(step)", log.since(from).await);

        let from = log.len().await;
        store.issued_calls(&session).await.expect("issued");
        measure("issued_calls", log.since(from).await);

        let from = log.len().await;
        store.load_checkpoint(&session, None).await.expect("load");
        measure("load_checkpoint", log.since(from).await);

        let from = log.len().await;
        let window = store
            .load_checkpoint_window(&session, None, 2)
            .await
            .expect("window");
        assert_eq!(window.messages.len(), 2);
        measure("load_checkpoint_window", log.since(from).await);

        let from = log.len().await;
        let range = store.messages(&session, 1, 2).await.expect("messages");
        assert_eq!(range.len(), 2);
        measure("messages", log.since(from).await);

        let from = log.len().await;
        let renewed: Lease = store
            .renew_lease(&lease, Duration::from_secs(600))
            .await
            .expect("renew");
        assert_eq!(renewed.fence, lease.fence);
        measure("renew_lease", log.since(from).await);
    }
    // A resume on another worker: take the lease, read the session, its latest
    // checkpoint and its issued rows.
    for round in 0..2 {
        store.release_lease(&lease).await.expect("release");
        let from = log.len().await;
        let taken = store
            .acquire_lease(&session, "w", Duration::from_secs(600), 10)
            .await
            .expect("acquire");
        let acquire = log.since(from).await;
        let from = log.len().await;
        store.session(&session).await.expect("session");
        store.load_checkpoint(&session, None).await.expect("load");
        store.issued_calls(&session).await.expect("issued");
        let reads = log.since(from).await;
        let from = log.len().await;
        store.session(&session).await.expect("session");
        store
            .load_checkpoint_window(&session, None, 20)
            .await
            .expect("window");
        store.issued_calls(&session).await.expect("issued");
        let windowed = log.since(from).await;
        if round == 1 {
            report.push((
                "windowed resume reads (session, load_checkpoint_window, issued_calls)",
                windowed,
            ));
            report.push(("acquire_lease", acquire));
            report.push((
                "resume reads (session, load_checkpoint, issued_calls)",
                reads,
            ));
        }
        store.release_lease(&taken).await.expect("release");
        store
            .acquire_lease(&session, "w", Duration::from_secs(600), 10)
            .await
            .expect("acquire");
    }
    // The writes that wake idle pools on other processes: the `NOTIFY` rides
    // on a statement each sends anyway.
    for round in 0..2 {
        let from = log.len().await;
        store
            .set_queue_limit("mail", Some(2))
            .await
            .expect("set a limit");
        let set = log.since(from).await;
        let from = log.len().await;
        store
            .set_queue_limit("mail", None)
            .await
            .expect("lift the limit");
        let lifted = log.since(from).await;
        let from = log.len().await;
        let (_, created) = store
            .create_session(NewSession {
                id: SessionId::random(),
                app_version: "v1".into(),
                metadata: json!({}),
                owner: "w".into(),
                lease_ttl: Duration::from_secs(600),
                initial: checkpoint("hi"),
                queue: None,
            })
            .await
            .expect("create");
        let create = log.since(from).await;
        let from = log.len().await;
        store.release_lease(&created).await.expect("release");
        let release = log.since(from).await;
        if round == 1 {
            for (name, lines) in [
                ("set_queue_limit (set)", set),
                ("set_queue_limit (lifted)", lifted),
                ("create_session", create),
                ("release_lease", release),
            ] {
                assert!(
                    lines.iter().any(|l| l.contains("pg_notify")),
                    "{name} notifies: {lines:#?}"
                );
                report.push((name, lines));
            }
        }
    }
    for (name, lines) in &report {
        println!("{name}: {} statements", lines.len());
        for line in lines {
            println!("    {}", line.chars().take(110).collect::<String>());
        }
    }
    // The contract of the write and read paths: a statement added to one of
    // them fails here, not only in a benchmark.
    let expected = [
        ("record_call", 2),
        ("issue_call", 2),
        ("finish_call", 2),
        ("save_checkpoint", 2),
        ("calls(step)", 1),
        ("issued_calls", 1),
        ("load_checkpoint", 1),
        ("load_checkpoint_window", 1),
        ("messages", 1),
        ("renew_lease", 4),
        ("set_queue_limit (set)", 1),
        ("set_queue_limit (lifted)", 1),
        ("create_session", 7),
        ("release_lease", 1),
        ("acquire_lease", 4),
        ("resume reads (session, load_checkpoint, issued_calls)", 3),
        (
            "windowed resume reads (session, load_checkpoint_window, issued_calls)",
            3,
        ),
    ];
    for (name, count) in expected {
        let lines = report
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, lines)| lines)
            .unwrap_or_else(|| panic!("{name} was not measured"));
        assert_eq!(lines.len(), count, "{name}: {lines:#?}");
    }
}
