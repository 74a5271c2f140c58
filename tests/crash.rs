//! Crash tests in real processes.
//!
//! This binary is its own child: run with `DURABLE_CRASH_CHILD=1` it plays one worker of
//! an agent session on a SQLite file, with a `pure`, an `idempotent_with_key` and an
//! `unsafe_on_replay` tool whose effects are appended to an external ledger file. A
//! failpoint named by `DURABLE_CRASH_AT` turns a journal boundary into
//! `std::process::abort()`: the process dies there, mid-turn, with whatever it had
//! committed. The parent then starts fresh workers and checks, from the ledger and the
//! store, that no unsafe effect fired twice, no recorded result was lost, and the keyed
//! tool was re-run with the key recorded the first time. With
//! `DURABLE_CRASH_CHECKPOINT_AFTER=1` the email goes through `Session::checkpoint_after`,
//! and a crash right after its result commit must find the checkpoint committed with it.
//!
//! `harness = false`: the parent prints one line per case and a closing
//! `N passed, N failed` line.

use durable_core::store::{CheckpointLog, JournalStore};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::sync::Arc;

use durable_core::store::{CallStatus, Resolution};
use durable_core::transcript::{Block, Message};
use durable_core::{
    CallError, CheckpointStore, Durable, DurableError, ReplayClass, SessionId, StartOptions,
    StoreError, ToolContext, ToolSpec,
};
use durable_sqlite::SqliteStore;
use serde_json::{Value, json};

const SESSION: &str = "crash-session";
const OWNER: &str = "crash-worker";
const EXIT_REPLAY_UNSAFE: i32 = 3;

fn main() {
    if std::env::var_os("DURABLE_CRASH_CHILD").is_some() {
        std::process::exit(child());
    }
    parent();
}

// ---------------------------------------------------------------------------------------
// The child: one worker run.

fn specs() -> [ToolSpec; 3] {
    let schema = |props: Value| json!({"type": "object", "properties": props});
    [
        ToolSpec::new(
            "read_context",
            "Read the customer record.",
            ReplayClass::Pure,
            schema(json!({"customer": {"type": "string"}})),
        ),
        ToolSpec::new(
            "charge_card",
            "Charge the customer's card.",
            ReplayClass::IdempotentWithKey,
            schema(json!({"order_id": {"type": "string"}, "cents": {"type": "integer"}})),
        ),
        ToolSpec::new(
            "send_email",
            "Email the customer.",
            ReplayClass::UnsafeOnReplay,
            schema(json!({"to": {"type": "string"}, "body": {"type": "string"}})),
        ),
    ]
}

/// The scripted model: one turn asking for the three tools in order.
fn scripted_model_turn() -> Message {
    Message::assistant(vec![
        Block::tool_call("c1", "read_context", json!({"customer": "ann"})),
        Block::tool_call(
            "c2",
            "charge_card",
            json!({"order_id": "o-17", "cents": 1200}),
        ),
        Block::tool_call(
            "c3",
            "send_email",
            json!({"to": "ann@example.com", "body": "Your order o-17 is confirmed."}),
        ),
    ])
}

fn append_ledger(path: &Path, line: &str) {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("open ledger");
    writeln!(file, "{line}").expect("write ledger");
    file.sync_all().expect("sync ledger");
}

/// A single-threaded runtime, for the child and for the parent's store checks.
fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// The email's effect: a line in the ledger, with a receipt named after the call.
fn send_email_now(ledger: &Path, ctx: &ToolContext) -> Value {
    let receipt = format!("msg-{}", ctx.call_id());
    append_ledger(ledger, &format!("email ann@example.com {receipt}"));
    json!({"receipt": receipt})
}

fn child() -> i32 {
    let db = PathBuf::from(std::env::var("DURABLE_CRASH_DB").expect("DURABLE_CRASH_DB"));
    let ledger =
        PathBuf::from(std::env::var("DURABLE_CRASH_LEDGER").expect("DURABLE_CRASH_LEDGER"));
    if let Ok(point) = std::env::var("DURABLE_CRASH_AT") {
        fail::cfg_callback(point, || std::process::abort()).expect("configure failpoint");
    }
    let runtime = current_thread();
    runtime.block_on(async move {
        let store: Arc<dyn CheckpointStore> =
            Arc::new(SqliteStore::open(&db).await.expect("open store"));
        let durable = Durable::builder(store)
            .owner(OWNER)
            .app_version("crash-test")
            .build();
        let id = SessionId::new(SESSION);
        let session = match durable.resume::<Message>(&id).await {
            Ok(resumed) => {
                for doubt in &resumed.report.in_doubt {
                    println!("in_doubt {} {}", doubt.call.identity.tool, doubt.call.class);
                }
                resumed.session
            }
            Err(DurableError::Store(StoreError::SessionNotFound(_))) => durable
                .start(
                    StartOptions::new()
                        .with_id(id.clone())
                        .with_messages(vec![Message::user("Confirm order o-17 for ann.")]),
                )
                .await
                .expect("start"),
            Err(e) => panic!("resume: {e}"),
        };
        let mut session = session;
        if session
            .messages()
            .iter()
            .any(|m| m.tool_results().any(|r| r.call_id == "c3"))
        {
            // A checkpoint already holds the turn's last result: go on from the transcript.
            session.complete().await.expect("complete");
            println!("completed from checkpoint");
            return 0;
        }
        let atomic = std::env::var_os("DURABLE_CRASH_CHECKPOINT_AFTER").is_some();
        let [read, charge, email] = specs();
        let turn: Message = session
            .model(|| async { Ok::<_, String>(scripted_model_turn()) })
            .await
            .expect("model");
        session.push(turn.clone());
        for call in turn.tool_calls() {
            let args = call.arguments.clone();
            let ledger = ledger.clone();
            let mut pushed = false;
            let result = match call.name.as_str() {
                "read_context" => {
                    session
                        .journal()
                        .tool(&read, args)
                        .run(|_ctx| async move {
                            Ok::<_, String>(json!({"customer": "ann", "tier": "gold"}))
                        })
                        .await
                }
                "charge_card" => {
                    let key = format!("charge:{}", args["order_id"].as_str().unwrap_or_default());
                    session
                        .journal()
                        .tool(&charge, args)
                        .key(key)
                        .run(move |ctx| {
                            let ledger = ledger.clone();
                            async move {
                                let key = ctx.idempotency_key().unwrap_or_default().to_owned();
                                append_ledger(
                                    &ledger,
                                    &format!("charge {key} attempt={}", ctx.attempt()),
                                );
                                Ok::<_, String>(
                                    json!({"charge": format!("ch_{key}"), "cents": 1200}),
                                )
                            }
                        })
                        .await
                }
                "send_email" if atomic => {
                    // The email's result and the checkpoint after it, in one transaction.
                    pushed = true;
                    let call_id = call.id.clone();
                    session
                        .checkpoint_after(
                            async |journal| {
                                journal
                                    .tool(&email, args)
                                    .run(|ctx| {
                                        let sent = send_email_now(&ledger, &ctx);
                                        async move { Ok::<_, String>(sent) }
                                    })
                                    .await
                            },
                            move |outcome| Message::tool_outcome(call_id, outcome),
                        )
                        .await
                }
                "send_email" => {
                    session
                        .journal()
                        .tool(&email, args)
                        .run(|ctx| {
                            let sent = send_email_now(&ledger, &ctx);
                            async move { Ok::<_, String>(sent) }
                        })
                        .await
                }
                other => panic!("unknown tool {other}"),
            };
            match result {
                Ok(value) => {
                    println!("result {} {}", call.name, value);
                    if !pushed {
                        session.push(Message::tool_result(&call.id, value, false));
                    }
                }
                Err(CallError::Durable(e @ DurableError::ReplayUnsafe { .. })) => {
                    println!("replay_unsafe {e}");
                    session.release().await.expect("release");
                    return EXIT_REPLAY_UNSAFE;
                }
                Err(e) => panic!("tool {}: {e}", call.name),
            }
        }
        session.complete().await.expect("complete");
        println!("completed");
        0
    })
}

// ---------------------------------------------------------------------------------------
// The parent.

struct Run {
    status: ExitStatus,
    stdout: String,
}

fn run_child(dir: &Path, crash_at: Option<&str>) -> Run {
    run_child_with(dir, crash_at, false)
}

/// `atomic`: the email goes through `Session::checkpoint_after`.
fn run_child_with(dir: &Path, crash_at: Option<&str>, atomic: bool) -> Run {
    run_child_env(dir, crash_at, atomic, None)
}

/// `mac_key`: the worker seals with this application key (`DURABLE_MAC_KEY`).
fn run_child_env(dir: &Path, crash_at: Option<&str>, atomic: bool, mac_key: Option<&str>) -> Run {
    let exe = std::env::current_exe().expect("current exe");
    let mut cmd = Command::new(exe);
    cmd.env("DURABLE_CRASH_CHILD", "1")
        .env("DURABLE_CRASH_DB", dir.join("agent.db"))
        .env("DURABLE_CRASH_LEDGER", dir.join("ledger.txt"))
        .env_remove("DURABLE_CRASH_AT")
        .env_remove("DURABLE_CRASH_CHECKPOINT_AFTER")
        .env_remove("DURABLE_MAC_KEY")
        .env_remove("DURABLE_PREVIOUS_MAC_KEYS");
    if let Some(key) = mac_key {
        cmd.env("DURABLE_MAC_KEY", key);
    }
    if let Some(point) = crash_at {
        cmd.env("DURABLE_CRASH_AT", point);
    }
    if atomic {
        cmd.env("DURABLE_CRASH_CHECKPOINT_AFTER", "1");
    }
    let out = cmd.output().expect("spawn child");
    Run {
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
    }
}

fn ledger(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("ledger.txt"))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

fn count(lines: &[String], prefix: &str) -> usize {
    lines.iter().filter(|l| l.starts_with(prefix)).count()
}

/// The receiver dedups charges by key: how many distinct charges were applied.
fn charges_applied(lines: &[String]) -> usize {
    lines
        .iter()
        .filter_map(|l| l.strip_prefix("charge "))
        .filter_map(|rest| rest.split_whitespace().next())
        .collect::<HashSet<_>>()
        .len()
}

fn assert_crashed(run: &Run, point: &str) {
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        run.status.signal(),
        Some(6),
        "the child must die by abort() at `{point}`; it exited with {:?}\n{}",
        run.status,
        run.stdout
    );
}

fn resolve(dir: &Path, resolution: Resolution) {
    let runtime = current_thread();
    runtime.block_on(async {
        let store: Arc<dyn CheckpointStore> =
            Arc::new(SqliteStore::open(dir.join("agent.db")).await.expect("open"));
        let durable = Durable::builder(store)
            .owner("operator")
            .app_version("crash-test")
            .build();
        let doubt = durable
            .operator()
            .in_doubt(Some(&SessionId::new(SESSION)))
            .await
            .expect("in doubt");
        assert_eq!(doubt.len(), 1, "exactly one call in doubt: {doubt:?}");
        assert_eq!(doubt[0].identity.tool, "send_email");
        durable
            .operator()
            .resolve(
                &doubt[0].id,
                resolution,
                "operator",
                Some("checked the outbox"),
            )
            .await
            .expect("resolve");
    });
}

fn statuses(dir: &Path) -> Vec<(String, CallStatus)> {
    let runtime = current_thread();
    runtime.block_on(async {
        let store = SqliteStore::open(dir.join("agent.db")).await.expect("open");
        store
            .calls(&SessionId::new(SESSION), None)
            .await
            .expect("calls")
            .into_iter()
            .filter(|c| c.identity.tool != "@model")
            .map(|c| (c.identity.tool, c.status))
            .collect()
    })
}

/// (a) killed after the unsafe tool's *issued* commit, before its effect.
fn after_issued_unsafe() {
    let dir = tempfile::tempdir().expect("tempdir");
    let point = "durable::after_issued::send_email";
    assert_crashed(&run_child(dir.path(), Some(point)), point);
    assert_eq!(
        count(&ledger(dir.path()), "email"),
        0,
        "the email never left"
    );
    assert_eq!(count(&ledger(dir.path()), "charge"), 1);

    let resumed = run_child(dir.path(), None);
    assert_eq!(
        resumed.status.code(),
        Some(EXIT_REPLAY_UNSAFE),
        "{}",
        resumed.stdout
    );
    assert!(
        resumed
            .stdout
            .contains("in_doubt send_email unsafe_on_replay"),
        "{}",
        resumed.stdout
    );
    assert_eq!(
        count(&ledger(dir.path()), "email"),
        0,
        "ReplayUnsafe: the tool was not re-run"
    );
    assert_eq!(
        count(&ledger(dir.path()), "charge"),
        1,
        "the recorded charge was returned, not re-run"
    );

    // the operator checked: it did not happen, so the next resume may send it, once
    resolve(dir.path(), Resolution::DidNotHappen);
    let finished = run_child(dir.path(), None);
    assert_eq!(finished.status.code(), Some(0), "{}", finished.stdout);
    let lines = ledger(dir.path());
    assert_eq!(count(&lines, "email"), 1);
    assert_eq!(charges_applied(&lines), 1);
}

/// (b) killed after the effect, before the result commit: the seed's bug.
fn after_effect_unsafe() {
    let dir = tempfile::tempdir().expect("tempdir");
    let point = "durable::after_effect::send_email";
    assert_crashed(&run_child(dir.path(), Some(point)), point);
    assert_eq!(
        count(&ledger(dir.path()), "email"),
        1,
        "the email left before the crash"
    );

    let resumed = run_child(dir.path(), None);
    assert_eq!(
        resumed.status.code(),
        Some(EXIT_REPLAY_UNSAFE),
        "{}",
        resumed.stdout
    );
    assert_eq!(count(&ledger(dir.path()), "email"), 1, "never sent twice");

    resolve(
        dir.path(),
        Resolution::Happened {
            result: json!({"receipt": "confirmed-by-operator"}),
        },
    );
    let finished = run_child(dir.path(), None);
    assert_eq!(finished.status.code(), Some(0), "{}", finished.stdout);
    assert!(
        finished.stdout.contains("confirmed-by-operator"),
        "{}",
        finished.stdout
    );
    assert_eq!(
        count(&ledger(dir.path()), "email"),
        1,
        "the resolution became the result; nothing re-sent"
    );
}

/// (c) killed after the result commit: the recorded result is returned.
fn after_result_unsafe() {
    let dir = tempfile::tempdir().expect("tempdir");
    let point = "durable::after_result::send_email";
    assert_crashed(&run_child(dir.path(), Some(point)), point);
    let sent = ledger(dir.path());
    assert_eq!(count(&sent, "email"), 1);
    let receipt = sent
        .iter()
        .find_map(|l| l.strip_prefix("email ann@example.com "))
        .expect("receipt")
        .to_owned();

    let resumed = run_child(dir.path(), None);
    assert_eq!(resumed.status.code(), Some(0), "{}", resumed.stdout);
    assert!(
        resumed.stdout.contains(&receipt),
        "the recorded receipt is returned: {}",
        resumed.stdout
    );
    let lines = ledger(dir.path());
    assert_eq!(count(&lines, "email"), 1);
    assert_eq!(count(&lines, "charge"), 1);
    assert!(
        statuses(dir.path())
            .iter()
            .all(|(_, s)| *s == CallStatus::Completed)
    );
}

/// The keyed tool in doubt: re-executed with the key it recorded; the receiver applies it once.
fn after_issued_keyed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let point = "durable::after_effect::charge_card";
    assert_crashed(&run_child(dir.path(), Some(point)), point);
    assert_eq!(count(&ledger(dir.path()), "charge"), 1);

    let resumed = run_child(dir.path(), None);
    assert_eq!(resumed.status.code(), Some(0), "{}", resumed.stdout);
    let lines = ledger(dir.path());
    let charges: Vec<&String> = lines.iter().filter(|l| l.starts_with("charge")).collect();
    assert_eq!(charges.len(), 2, "re-executed once: {lines:?}");
    assert_eq!(charges[0], "charge charge:o-17 attempt=1");
    assert_eq!(
        charges[1], "charge charge:o-17 attempt=2",
        "same key, next attempt"
    );
    assert_eq!(charges_applied(&lines), 1, "the receiver dedups by key");
    assert_eq!(count(&lines, "email"), 1);
}

/// The latest checkpoint: its version and the call ids of its tool results.
fn latest_checkpoint(dir: &Path) -> (i64, Vec<String>) {
    let runtime = current_thread();
    runtime.block_on(async {
        let store = SqliteStore::open(dir.join("agent.db")).await.expect("open");
        let checkpoint = store
            .load_checkpoint(&SessionId::new(SESSION), None)
            .await
            .expect("load the latest checkpoint");
        let results = checkpoint
            .messages
            .iter()
            .map(|m| m.decode::<Message>().expect("a message"))
            .flat_map(|m| {
                m.tool_results()
                    .map(|r| r.call_id.clone())
                    .collect::<Vec<_>>()
            })
            .collect();
        (checkpoint.meta.version, results)
    })
}

/// With `checkpoint_after`, a crash right after the email's result commit finds the
/// checkpoint holding that result committed too; the resume goes on from it and sends
/// nothing. A crash after the effect and before that commit finds neither.
fn atomic_result_and_checkpoint() {
    let dir = tempfile::tempdir().expect("tempdir");
    let point = "durable::after_result::send_email";
    assert_crashed(&run_child_with(dir.path(), Some(point), true), point);
    assert_eq!(count(&ledger(dir.path()), "email"), 1);
    assert_eq!(
        latest_checkpoint(dir.path()),
        (1, vec!["c1".into(), "c2".into(), "c3".into()]),
        "the checkpoint committed with the result"
    );
    assert!(
        statuses(dir.path())
            .iter()
            .all(|(_, s)| *s == CallStatus::Completed)
    );
    let resumed = run_child_with(dir.path(), None, true);
    assert_eq!(resumed.status.code(), Some(0), "{}", resumed.stdout);
    assert!(
        resumed.stdout.contains("completed from checkpoint"),
        "{}",
        resumed.stdout
    );
    assert_eq!(count(&ledger(dir.path()), "email"), 1, "never sent twice");

    let dir = tempfile::tempdir().expect("tempdir");
    let point = "durable::after_effect::send_email";
    assert_crashed(&run_child_with(dir.path(), Some(point), true), point);
    assert_eq!(
        latest_checkpoint(dir.path()),
        (0, vec![]),
        "no checkpoint without the result"
    );
    let resumed = run_child_with(dir.path(), None, true);
    assert_eq!(
        resumed.status.code(),
        Some(EXIT_REPLAY_UNSAFE),
        "{}",
        resumed.stdout
    );
    assert_eq!(count(&ledger(dir.path()), "email"), 1, "never sent twice");
}

/// A forged "not happened" under a deleted store key, end to end: the email was sent
/// and its result recorded (the worker
/// died right after, the turn unfinished); then, from outside, its row is set back to
/// `not_happened` (seal nulled) and the `signing_key` row deleted. A fresh worker with the
/// key must refuse the store rather than seal the forged row and send the email again.
fn forged_row_with_deleted_key_row() {
    const KEY: &str = "0123456789abcdef-crash-test-key";
    let dir = tempfile::tempdir().expect("tempdir");
    let point = "durable::after_result::send_email";
    assert_crashed(
        &run_child_env(dir.path(), Some(point), false, Some(KEY)),
        point,
    );
    assert_eq!(count(&ledger(dir.path()), "email"), 1);
    current_thread().block_on(async {
        let pool =
            sqlx::SqlitePool::connect(&format!("sqlite:{}", dir.path().join("agent.db").display()))
                .await
                .expect("raw pool");
        for sql in [
            "UPDATE durable_tool_calls SET status = 'not_happened', result = NULL, mac = NULL \
             WHERE tool_name = 'send_email'",
            "DELETE FROM durable_meta WHERE name = 'signing_key'",
        ] {
            let done = sqlx::query(sql).execute(&pool).await.expect(sql);
            assert_eq!(done.rows_affected(), 1, "{sql}");
        }
        pool.close().await;
    });
    let runs: Vec<Run> = (0..2)
        .map(|_| run_child_env(dir.path(), None, false, Some(KEY)))
        .collect();
    assert_eq!(count(&ledger(dir.path()), "email"), 1, "never sent twice");
    for resumed in runs {
        assert!(
            !resumed.status.success(),
            "the worker must refuse the store: {}",
            resumed.stdout
        );
    }
}

fn parent() {
    let cases: [(&str, fn()); 6] = [
        (
            "forged_row_with_deleted_signing_key_is_refused_never_resent",
            forged_row_with_deleted_key_row,
        ),
        (
            "crash_after_issued_unsafe_surfaces_replay_unsafe",
            after_issued_unsafe,
        ),
        (
            "crash_after_effect_unsafe_never_sends_twice",
            after_effect_unsafe,
        ),
        (
            "crash_after_result_returns_recorded_result",
            after_result_unsafe,
        ),
        (
            "crash_in_keyed_call_reuses_recorded_key",
            after_issued_keyed,
        ),
        (
            "crash_after_atomic_result_keeps_result_and_checkpoint",
            atomic_result_and_checkpoint,
        ),
    ];
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let (mut passed, mut failed) = (0, 0);
    for (name, case) in cases {
        if !filter.is_empty() && !filter.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        match std::panic::catch_unwind(case) {
            Ok(()) => {
                println!("test {name} ... ok");
                passed += 1;
            }
            Err(_) => {
                println!("test {name} ... FAILED");
                failed += 1;
            }
        }
    }
    println!(
        "\ntest result: {}. {passed} passed; {failed} failed; 0 ignored; 0 measured; 0 filtered out",
        if failed == 0 { "ok" } else { "FAILED" }
    );
    if failed > 0 {
        std::process::exit(101);
    }
}
