//! Long listings in bounded memory: a session with 20,000 journal rows and a store of
//! 3,000 sessions, listed and verified by the real `durable` binary in a child process,
//! whose peak resident memory (`ru_maxrss`, reported by GNU `time`) must stay well below
//! what loading everything takes.
//!
//! Measured on the reference machine (2 cores, shared), peak RSS and wall time:
//!
//! | command | before (loaded whole) | after (paged) |
//! |---|---|---|
//! | `calls`, 20,000 rows | 249 MiB, 3.9 s | 31 MiB, 3.4 s |
//! | `calls --json`, 20,000 rows | 324 MiB, 4.2 s | 30 MiB, 6.9 s |
//! | `sessions`, 3,000 sessions | 36 MiB, 1.4 s | 26 MiB, 0.8 s |
//! | `verify`, 3,000 sessions, one of 20,000 rows | 205 MiB, 10.7 s | 43 MiB, 10.5 s |
//!
//! With 100,000 rows (after): `calls` 31 MiB, `calls --json` 31 MiB, `verify` 43 MiB.
//! Each run prints its figures (`--nocapture`).

use durable::store::{JournalStore, SessionStore};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use durable::sqlite::SqliteStore;
use durable::store::{
    CallIdentity, CallKind, CallOutcome, FinishCall, IssueOutcome, NewCall, NewCheckpoint,
    NewSession,
};
use durable::{CallId, ReplayClass, SessionId};
use serde_json::json;

mod cli_support;

use cli_support::{Run, clean_env};

/// Journal rows in the long session.
const CALLS: usize = 20_000;
/// Sessions in the store (the long one among them).
const SESSIONS: usize = 3_000;
/// The peak resident memory a listing may reach, in KiB: the binary's own footprint
/// (its runtime, the SQLite page cache) and a few pages of rows, nothing that grows with
/// the store.
const BOUND_KIB: u64 = 64 * 1024;

fn new_session(id: SessionId) -> NewSession {
    NewSession {
        id,
        app_version: "v1".into(),
        metadata: json!({}),
        owner: "populate".into(),
        lease_ttl: Duration::from_secs(3600),
        initial: NewCheckpoint::default(),
        queue: None,
    }
}

/// A store with one session of `calls` rows (each with a 1 KiB result) and
/// `sessions` − 1 others, written through the store's API, many writes at once (group
/// commit).
async fn populate(path: &std::path::Path, calls: usize, sessions: usize) -> SessionId {
    let store = Arc::new(SqliteStore::open(path).await.expect("open"));
    let long = SessionId::new("long-session");
    let (_, lease) = store
        .create_session(new_session(long.clone()))
        .await
        .expect("create");
    let lease = Arc::new(lease);
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..calls {
        let store = Arc::clone(&store);
        let lease = Arc::clone(&lease);
        tasks.spawn(async move {
            let call = NewCall {
                id: CallId::random(),
                kind: CallKind::Tool,
                identity: CallIdentity {
                    session: lease.session.clone(),
                    step: 0,
                    tool: "lookup".into(),
                    input_hash: format!("v1:{n:064x}"),
                    ordinal: 0,
                },
                class: ReplayClass::Pure,
                args: json!({ "n": n }),
                idempotency_key: None,
                schema_hash: "s".into(),
            };
            let finish = FinishCall {
                outcome: CallOutcome::Completed(json!({ "n": n, "text": "r".repeat(1024) })),
                spend: None,
            };
            let done = store.record_call(lease.fence(), call, finish).await;
            assert!(matches!(done, Ok(IssueOutcome::Inserted(_))), "{done:?}");
        });
        if tasks.len() >= 256 {
            tasks.join_next().await.expect("a task").expect("joined");
        }
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("joined");
    }
    for n in 1..sessions {
        let store = Arc::clone(&store);
        tasks.spawn(async move {
            store
                .create_session(new_session(SessionId::new(format!("other-{n:05}"))))
                .await
                .expect("create");
        });
        if tasks.len() >= 256 {
            tasks.join_next().await.expect("a task").expect("joined");
        }
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("joined");
    }
    long
}

/// What one run of the binary printed (without GNU `time`'s line) and cost.
struct Measured {
    run: Run,
    peak_kib: u64,
    seconds: f64,
}

impl std::ops::Deref for Measured {
    type Target = Run;

    fn deref(&self) -> &Run {
        &self.run
    }
}

/// Runs `durable --db <db> <args…>` under GNU `time`, which reports the child's peak
/// resident set (`ru_maxrss`, from `wait4`) on the last line of stderr.
fn measure(db: &str, args: &[&str]) -> Measured {
    let started = Instant::now();
    let out = clean_env(
        Command::new("/usr/bin/time")
            .args(["-f", "peak-rss-kib=%M"])
            .arg(env!("CARGO_BIN_EXE_durable"))
            .arg("--db")
            .arg(db)
            .args(args),
    )
    .output()
    .expect("run /usr/bin/time (GNU time; scripts/test.sh installs it)");
    let seconds = started.elapsed().as_secs_f64();
    let mut run = Run::from(out);
    let stderr = std::mem::take(&mut run.stderr);
    let (rest, last) = stderr
        .trim_end()
        .rsplit_once('\n')
        .unwrap_or(("", stderr.trim_end()));
    let peak_kib = last
        .strip_prefix("peak-rss-kib=")
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("GNU time's report is the last line of stderr: {stderr}"));
    run.stderr = rest.to_owned();
    let measured = Measured {
        run,
        peak_kib,
        seconds,
    };
    eprintln!(
        "durable {}: peak RSS {} MiB, {:.1} s, {} lines",
        args.join(" "),
        measured.peak_kib / 1024,
        measured.seconds,
        measured.stdout.lines().count()
    );
    measured
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_listings_and_verify_stay_within_bounded_memory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("big.db");
    let long = populate(&path, CALLS, SESSIONS).await;
    let db = path.to_str().expect("utf-8 path");

    // Every row of the long session, streamed: all of them printed, memory bounded.
    let calls = measure(db, &["calls", long.as_str()]);
    assert_eq!(calls.code, 0, "{}", calls.stderr);
    assert_eq!(
        calls.stdout.lines().count(),
        CALLS + 2,
        "a header, its rule and every row"
    );
    let json_calls = measure(db, &["--json", "calls", long.as_str()]);
    assert_eq!(json_calls.code, 0, "{}", json_calls.stderr);
    let rows: serde_json::Value = serde_json::from_str(&json_calls.stdout).expect("JSON");
    assert_eq!(rows.as_array().map(Vec::len), Some(CALLS));
    let sessions = measure(db, &["sessions", "--limit", "100000"]);
    assert_eq!(sessions.code, 0, "{}", sessions.stderr);
    assert_eq!(sessions.stdout.lines().count(), SESSIONS + 2);
    let verify = measure(db, &["verify"]);
    assert_eq!(verify.code, 0, "{}", verify.stderr);
    assert!(
        verify
            .stdout
            .contains(&format!("{SESSIONS} sessions verified, 0 failed")),
        "{}",
        verify.stdout
    );
    for (what, run) in [
        ("calls", &calls),
        ("calls --json", &json_calls),
        ("sessions", &sessions),
        ("verify", &verify),
    ] {
        assert!(
            run.peak_kib < BOUND_KIB,
            "`durable {what}` peaked at {} MiB, above the {} MiB bound: it holds what grows with the store",
            run.peak_kib / 1024,
            BOUND_KIB / 1024
        );
    }
}

/// `--limit` and `--after` page through `calls` and `sessions`: each page holds the next
/// rows, and the cursor for the next page is on stderr until the last page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_and_sessions_page_with_limit_and_after() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("pages.db");
    let long = populate(&path, 7, 5).await;
    let db = path.to_str().expect("utf-8 path");
    let ids = |run: &Measured| -> Vec<String> {
        let rows: serde_json::Value = serde_json::from_str(&run.stdout).expect("JSON");
        rows.as_array()
            .expect("an array")
            .iter()
            .map(|r| r["id"].as_str().expect("an id").to_owned())
            .collect()
    };
    let all = ids(&measure(db, &["--json", "calls", long.as_str()]));
    assert_eq!(all.len(), 7);
    let first = measure(db, &["--json", "calls", long.as_str(), "--limit", "3"]);
    assert_eq!(ids(&first), all[..3]);
    assert!(
        first.stderr.contains("--after 3"),
        "the next page's cursor: {}",
        first.stderr
    );
    let second = measure(
        db,
        &[
            "--json",
            "calls",
            long.as_str(),
            "--limit",
            "3",
            "--after",
            "3",
        ],
    );
    assert_eq!(ids(&second), all[3..6]);
    let last = measure(
        db,
        &["calls", long.as_str(), "--limit", "3", "--after", "6"],
    );
    assert_eq!(
        last.stdout.lines().count(),
        3,
        "header, rule, one row: {}",
        last.stdout
    );
    assert!(last.stdout.contains(&all[6]), "{}", last.stdout);
    assert!(
        !last.stderr.contains("--after"),
        "the last page: {}",
        last.stderr
    );

    let everyone = ids(&measure(db, &["--json", "sessions", "--limit", "0"]));
    assert_eq!(everyone.len(), 5);
    let mut walked = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut args = vec!["--json", "sessions", "--limit", "2"];
        if let Some(cursor) = &after {
            args.extend(["--after", cursor.as_str()]);
        }
        let page = measure(db, &args);
        assert_eq!(page.code, 0, "{}", page.stderr);
        walked.extend(ids(&page));
        match page.stderr.split_once("--after ") {
            Some((_, rest)) => {
                after = Some(rest.split('`').next().expect("a cursor").to_owned());
            }
            None => break,
        }
    }
    assert_eq!(
        walked, everyone,
        "pages of 2 list every session once, in order"
    );
    let bad = measure(db, &["sessions", "--after", "yesterday"]);
    assert_eq!(bad.code, 2, "{}", bad.stderr);
    assert!(bad.stderr.contains("not a cursor"), "{}", bad.stderr);
}
