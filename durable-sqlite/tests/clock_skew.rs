//! Leases on one clock: workers whose wall clocks disagree, run as real
//! processes under `faketime` (Debian's `faketime`, libfaketime; `scripts/test.sh`
//! installs it when missing).
//!
//! A SQLite store has no server whose clock every worker reads: each process computes
//! `now` itself. These tests run one worker on the machine's clock and another an hour
//! ahead or behind (libfaketime's `-f ±1h`, which offsets the process's wall clock *and*
//! its monotonic clock, as a time namespace or a different machine would), and check:
//!
//! - a worker an hour ahead does not take a live session (its owner keeps it);
//! - a worker an hour behind keeps its own session (another worker does not take it);
//! - a dead worker an hour ahead does not lock its session for an hour: another worker
//!   takes it about one lease duration after it last renewed.
//!
//! The test binary is its own child: with `DURABLE_SKEW_ROLE` set,
//! [`child_process_entry`] runs one worker role.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use durable_core::{Durable, DurableError, Message, ReplayClass, SessionId, StoreError, ToolSpec};
use durable_sqlite::SqliteStore;
use serde_json::json;

const ROLE: &str = "DURABLE_SKEW_ROLE";
const STORE: &str = "DURABLE_SKEW_STORE";
const FOR_MS: &str = "DURABLE_SKEW_FOR_MS";
/// The lease duration every worker uses.
const TTL: Duration = Duration::from_secs(3);
const SESSION: &str = "skew-0";

fn spec() -> ToolSpec {
    ToolSpec::new(
        "look",
        "A harmless read, made while the worker holds its session.",
        ReplayClass::Pure,
        json!({"type": "object", "properties": {"n": {"type": "integer"}}}),
    )
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").expect("stdout");
    out.flush().expect("flush");
}

/// The child's work; does nothing when run as an ordinary test.
///
/// - `hold`: starts (or resumes) the session as `holder`, prints `held`, then makes a call
///   every 100 ms for `DURABLE_SKEW_FOR_MS`, renewing its lease in the background;
///   prints `lost` (exit 3) if its lease is lost, `done` otherwise.
/// - `take`: tries to resume the session as `taker`, by id and by claiming, every 100 ms
///   for `DURABLE_SKEW_FOR_MS`; prints `took <ms>` (the time it took on its own clock) or
///   `never`.
#[test]
fn child_process_entry() {
    let Some(role) = std::env::var_os(ROLE) else {
        return;
    };
    let role = role.into_string().expect("role");
    let path = std::env::var(STORE).expect("store");
    let run_for = Duration::from_millis(
        std::env::var(FOR_MS)
            .expect("duration")
            .parse()
            .expect("ms"),
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let code = runtime.block_on(async move {
        let store = SqliteStore::open(&path).await.expect("open");
        let owner = if role == "hold" { "holder" } else { "taker" };
        let durable = Durable::builder(Arc::new(store))
            .owner(owner)
            .lease_ttl(TTL)
            .build();
        let id = SessionId::new(SESSION);
        let started = Instant::now();
        match role.as_str() {
            "hold" => {
                let session = durable
                    .start_or_resume::<Message>(durable_core::StartOptions::new().with_id(id))
                    .await
                    .expect("hold")
                    .session;
                say("held");
                let spec = spec();
                let mut n = 0;
                while started.elapsed() < run_for {
                    let call = session
                        .journal()
                        .tool(&spec, json!({ "n": n }))
                        .run(|_ctx| async move { Ok::<_, String>(json!({ "n": n })) })
                        .await;
                    match call {
                        Ok(_) => {}
                        Err(e) => {
                            say(&format!("lost {e}"));
                            return 3;
                        }
                    }
                    n += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                say("done");
                0
            }
            "take" => {
                while started.elapsed() < run_for {
                    match durable.resume::<Message>(&id).await {
                        Ok(_) => {
                            say(&format!("took {}", started.elapsed().as_millis()));
                            return 0;
                        }
                        Err(DurableError::Store(StoreError::Leased { .. })) => {}
                        Err(e) => panic!("resume: {e}"),
                    }
                    if durable
                        .recover_next::<Message>()
                        .await
                        .expect("claim")
                        .is_some()
                    {
                        say(&format!("took {} (claimed)", started.elapsed().as_millis()));
                        return 0;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                say("never");
                0
            }
            other => panic!("unknown role {other}"),
        }
    });
    std::process::exit(code);
}

/// A worker process: this test binary, with its wall clock `skew` away from the machine's
/// (`None`: the machine's own clock).
struct Worker {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Worker {
    fn spawn(role: &str, store: &std::path::Path, skew: Option<&str>, run_for: Duration) -> Self {
        let exe = std::env::current_exe().expect("current_exe");
        let mut command = Command::new(exe);
        if let Some(offset) = skew {
            // libfaketime preloaded into the worker itself (not the `faketime` wrapper,
            // which would stand between the test and the process it kills). The
            // multi-threaded build: SQLite runs on a thread of its own.
            command
                .env("LD_PRELOAD", libfaketime())
                .env("FAKETIME", offset);
        }
        command
            .args([
                "child_process_entry",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(ROLE, role)
            .env(STORE, store)
            .env(FOR_MS, run_for.as_millis().to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = command.spawn().expect("spawn worker");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Worker { child, lines }
    }

    /// Waits for a line starting with one of `words`; returns it.
    fn expect(&self, words: &[&str], within: Duration) -> String {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    // The harness prints `test child_process_entry ... ` before the
                    // child's first line.
                    let line = line.rsplit("... ").next().unwrap_or_default().to_owned();
                    if words.iter().any(|w| line.starts_with(w)) {
                        return line;
                    }
                }
                Err(e) => panic!("no line starting with {words:?} within {within:?}: {e}"),
            }
        }
    }

    fn finish(mut self) -> std::process::ExitStatus {
        self.child.wait().expect("wait")
    }
}

impl Drop for Worker {
    /// A failed test leaves no worker behind.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// libfaketime's multi-threaded build (Debian's `libfaketime`, which `faketime` pulls
/// in; `FAKETIME_LIB` names another).
fn libfaketime() -> std::path::PathBuf {
    if let Some(path) = std::env::var_os("FAKETIME_LIB") {
        return path.into();
    }
    // Debian: /usr/lib/<multiarch triple>/faketime/; elsewhere /usr/lib or /usr/local/lib.
    let mut candidates: Vec<std::path::PathBuf> = std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path().join("faketime/libfaketimeMT.so.1"))
        .collect();
    candidates.push("/usr/lib/faketime/libfaketimeMT.so.1".into());
    candidates.push("/usr/local/lib/faketime/libfaketimeMT.so.1".into());
    candidates
        .iter()
        .find(|p| p.exists())
        .cloned()
        .unwrap_or_else(|| {
            panic!(
                "these tests need libfaketime (Debian: `apt-get install faketime`; \
                 scripts/test.sh installs it), or FAKETIME_LIB naming libfaketimeMT.so.1"
            )
        })
}

fn store_file() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("skew.db");
    (dir, path)
}

/// A live holder on the machine's clock, a taker an hour ahead that tries for two lease
/// durations: the taker gets nothing, the holder keeps its lease.
#[test]
fn a_worker_an_hour_ahead_does_not_take_a_live_session() {
    libfaketime();
    let (_dir, path) = store_file();
    let holder = Worker::spawn("hold", &path, None, TTL * 4);
    holder.expect(&["held"], Duration::from_secs(30));
    let taker = Worker::spawn("take", &path, Some("+1h"), TTL * 2);
    let verdict = taker.expect(&["took", "never"], TTL * 10);
    assert_eq!(
        verdict, "never",
        "a worker an hour ahead took a live session"
    );
    assert!(taker.finish().success());
    let end = holder.expect(&["done", "lost"], TTL * 10);
    assert_eq!(end, "done", "the live holder lost its lease");
    assert!(holder.finish().success());
}

/// A live holder an hour behind, a taker on the machine's clock: the holder keeps its
/// own lease.
#[test]
fn a_worker_an_hour_behind_keeps_its_own_session() {
    libfaketime();
    let (_dir, path) = store_file();
    let holder = Worker::spawn("hold", &path, Some("-1h"), TTL * 4);
    holder.expect(&["held"], Duration::from_secs(30));
    let taker = Worker::spawn("take", &path, None, TTL * 2);
    let verdict = taker.expect(&["took", "never"], TTL * 10);
    assert_eq!(
        verdict, "never",
        "a worker on the machine's clock took the live session of a worker an hour behind"
    );
    assert!(taker.finish().success());
    let end = holder.expect(&["done", "lost"], TTL * 10);
    assert_eq!(end, "done", "a live holder an hour behind lost its lease");
    assert!(holder.finish().success());
}

/// A holder an hour ahead is killed: a worker on the machine's clock takes its session
/// about one lease duration later, not an hour later.
#[test]
fn a_dead_worker_an_hour_ahead_does_not_lock_its_session_for_an_hour() {
    libfaketime();
    let (_dir, path) = store_file();
    let mut holder = Worker::spawn("hold", &path, Some("+1h"), Duration::from_secs(3600));
    holder.expect(&["held"], Duration::from_secs(30));
    holder.child.kill().expect("kill");
    let killed = Instant::now();
    holder.finish();
    let taker = Worker::spawn("take", &path, None, TTL * 6);
    let verdict = taker.expect(&["took", "never"], TTL * 12);
    assert!(
        verdict.starts_with("took"),
        "the session of a dead worker an hour ahead stayed locked: {verdict}"
    );
    let waited = killed.elapsed();
    assert!(
        waited < TTL * 4,
        "taken {waited:?} after the kill; expected about one lease duration ({TTL:?})"
    );
    assert!(taker.finish().success());
    println!("clock_skew: the dead worker's session was taken {waited:?} after the kill");
}
