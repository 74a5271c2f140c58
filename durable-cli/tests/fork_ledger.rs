//! `durable fork` never repeats the parent's effects, in real processes.
//!
//! This test binary is its own worker: run with `DURABLE_FORK_WORKER=<script>` (the test
//! `worker` below, alone), it opens the store at `DURABLE_FORK_DB`, starts or resumes the
//! session `DURABLE_FORK_SESSION` and runs the script: `e<n>` sends email `n` (an
//! `unsafe_on_replay` tool whose effect is a line appended, synced, to the ledger file
//! `DURABLE_FORK_LEDGER`), `|` checkpoints, `!` dies on the spot (`abort`), `.` releases.
//! Each call's outcome is printed (`e1 ok`, `e2 InheritedEffect`, …). The tests run the
//! parent's turns, fork with the `durable` binary, run the fork's worker, and read the
//! ledger: each intended email was sent once.

mod cli_support;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use cli_support::run;
use durable::{CallError, CheckpointStore, Durable, DurableError, Message, ReplayClass, SessionId};
use durable::{StartOptions, ToolSpec};
use serde_json::json;

const APP: &str = "mail/1";

fn email() -> ToolSpec {
    ToolSpec::new(
        "send_email",
        "Email the customer.",
        ReplayClass::UnsafeOnReplay,
        json!({"type": "object", "properties": {"n": {"type": "integer"}}}),
    )
}

/// The worker, when this binary runs as one; a no-op test otherwise.
#[test]
fn worker() {
    let Ok(script) = std::env::var("DURABLE_FORK_WORKER") else {
        return;
    };
    let db = std::env::var("DURABLE_FORK_DB").expect("DURABLE_FORK_DB");
    let ledger = std::env::var("DURABLE_FORK_LEDGER").expect("DURABLE_FORK_LEDGER");
    let id = SessionId::new(std::env::var("DURABLE_FORK_SESSION").expect("session"));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        let store = durable::connect(&db).await.expect("connect");
        let durable = Durable::builder(store)
            .owner("fork-ledger-worker")
            .app_version(APP)
            .build();
        let mut session = durable
            .start_or_resume::<Message>(StartOptions::new().with_id(id.clone()))
            .await
            .expect("start or resume")
            .session;
        for step in script.split(',') {
            match step {
                "|" => {
                    session.checkpoint().await.expect("checkpoint");
                }
                "!" => {
                    // Dies mid-turn, as a killed worker does.
                    std::process::abort();
                }
                "." => {
                    session.release().await.expect("release");
                    return;
                }
                e => {
                    let n: i64 = e.trim_start_matches('e').parse().expect("e<n>");
                    let ledger = ledger.clone();
                    let session_id = id.clone();
                    let out = session
                        .journal()
                        .tool(&email(), json!({ "n": n }))
                        .run(move |_| {
                            let line = format!("email {n} from {session_id}");
                            append(Path::new(&ledger), &line);
                            async move { Ok::<_, String>(json!({ "sent": n })) }
                        })
                        .await;
                    let word = match out {
                        Ok(_) => "ok".to_owned(),
                        Err(CallError::Durable(DurableError::InheritedEffect { .. })) => {
                            "InheritedEffect".to_owned()
                        }
                        Err(CallError::Durable(DurableError::ReplayUnsafe { .. })) => {
                            "ReplayUnsafe".to_owned()
                        }
                        Err(other) => format!("error {other}"),
                    };
                    println!("{e} {word}");
                }
            }
        }
    });
}

fn append(path: &Path, line: &str) {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("open ledger");
    writeln!(file, "{line}").expect("write ledger");
    file.sync_all().expect("sync ledger");
}

/// Runs the worker process on `session` with `script`; returns its status and stdout.
fn work(db: &str, ledger: &Path, session: &str, script: &str) -> (Option<i32>, String) {
    let out = Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", "worker", "--nocapture", "--test-threads", "1"])
        .env("DURABLE_FORK_WORKER", script)
        .env("DURABLE_FORK_DB", db)
        .env("DURABLE_FORK_LEDGER", ledger)
        .env("DURABLE_FORK_SESSION", session)
        .env_remove("DATABASE_URL")
        .env_remove("DURABLE_MAC_KEY")
        .output()
        .expect("run the worker");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// How many times each email was sent.
fn sent(ledger: &Path, n: i64) -> usize {
    let text = std::fs::read_to_string(ledger).unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with(&format!("email {n} ")))
        .count()
}

/// The scenario, on any store `db` names (a SQLite path or a PostgreSQL URL).
async fn forks_never_resend(db: &str, store: &Arc<dyn CheckpointStore>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let ledger = dir.path().join("ledger.txt");

    // The parent: version 1, then email 1, version 2, email 2, version 3.
    let (code, out) = work(db, &ledger, "p", "|,e1,|,e2,|,.");
    assert_eq!(code, Some(0), "{out}");
    assert_eq!((sent(&ledger, 1), sent(&ledger, 2)), (1, 1));

    // What the fork will do, said before anything is written.
    let dry = run(db, &["fork", "p", "--from-version", "1", "--dry-run"]);
    let text = dry.ok();
    assert!(text.contains("dry run: nothing was written"), "{text}");
    assert_eq!(text.matches("send_email").count(), 2, "{text}");
    assert!(text.contains("not run again"), "{text}");
    let json = run(
        db,
        &["fork", "p", "--from-version", "1", "--dry-run", "--json"],
    )
    .json();
    let fates: Vec<_> = json["parent_effects"]
        .as_array()
        .expect("parent_effects")
        .iter()
        .map(|e| (e["step"].as_i64(), e["fate"].as_str().map(str::to_owned)))
        .collect();
    assert_eq!(
        fates,
        [
            (Some(1), Some("inherited".to_owned())),
            (Some(2), Some("carried".to_owned()))
        ]
    );

    // Two forks through the CLI, each re-run by a worker process: the re-run turn's email
    // comes back recorded, the next turn's is refused, nothing is sent again.
    for fork in ["f1", "f2"] {
        let out = run(db, &["fork", "p", "--from-version", "1", "--to", fork]);
        assert!(out.ok().contains("not run again"), "{}", out.stdout);
        let (code, out) = work(db, &ledger, fork, "e1,|,e2,.");
        assert_eq!(code, Some(0), "{out}");
        assert!(out.contains("e1 ok"), "{out}");
        assert!(out.contains("e2 InheritedEffect"), "{out}");
    }
    assert_eq!(
        (sent(&ledger, 1), sent(&ledger, 2)),
        (1, 1),
        "a fork sent an email again"
    );

    // A fork from the last checkpoint of a turn in flight: the worker sent email 7 and
    // died before its checkpoint; the fork's re-run gets the recorded result back.
    let (code, _) = work(db, &ledger, "t", "|,e7,!");
    assert_ne!(code, Some(0), "the worker died");
    assert_eq!(sent(&ledger, 7), 1);
    run(db, &["fork", "t", "--from-version", "1", "--to", "t1"]).ok();
    let (code, out) = work(db, &ledger, "t1", "e7,|,.");
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("e7 ok"), "{out}");
    assert_eq!(sent(&ledger, 7), 1, "the in-flight email was sent again");

    // An operator says "run it again" for one call: only that one runs again, audited.
    let rows = store
        .calls(&SessionId::new("p"), Some(1))
        .await
        .expect("rows");
    let call = rows[0].id.to_string();
    let out = run(
        db,
        &[
            "fork",
            "p",
            "--from-version",
            "1",
            "--to",
            "f3",
            "--rerun",
            &call,
            "--by",
            "alice",
        ],
    );
    assert!(out.ok().contains("MAY RUN AGAIN"), "{}", out.stdout);
    let (code, out) = work(db, &ledger, "f3", "e1,|,e2,.");
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("e2 InheritedEffect"), "{out}");
    assert_eq!(sent(&ledger, 1), 2, "the operator's rerun ran");
    assert_eq!(sent(&ledger, 2), 1);
    run(
        db,
        &[
            "fork",
            "p",
            "--from-version",
            "1",
            "--rerun",
            "no-such-call",
        ],
    )
    .fails(5, "--rerun no-such-call");

    // Every fork is sealed: `durable verify` finds the store clean.
    let verified = run(db, &["verify"]);
    verified.ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_forks_never_resend() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("agent.db");
    let store: Arc<dyn CheckpointStore> = Arc::new(
        durable::sqlite::SqliteStore::open(&path)
            .await
            .expect("open store"),
    );
    let db = path.to_str().expect("utf-8 path").to_owned();
    forks_never_resend(&db, &store).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_forks_never_resend() {
    let database = durable_postgres::testing::test_database().await;
    let store: Arc<dyn CheckpointStore> = Arc::new(database.store().await.expect("store"));
    forks_never_resend(database.url(), &store).await;
}
