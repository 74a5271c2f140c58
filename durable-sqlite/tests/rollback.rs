//! A store that lost rows must not be trusted: a lost `-wal`, a `.db` file copied or
//! restored alone, a new store at an old path. Each case runs a real worker process that
//! sends emails through an `unsafe_on_replay` tool into a ledger file, kills it with
//! SIGKILL (so its `-wal` stays hot), damages the files as an operator or a backup tool
//! would, and starts the worker again: the ledger must never show an email twice.
//!
//! Then a generator: seeded random programs of turns, naive copies of the database (with
//! or without its `-wal`) and restores of them, in one process, checking after every step
//! that no effect ran twice. It found the lost-`-wal` and restored-backup cases with the
//! witness switched off.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use durable_core::{
    CheckpointStore, Durable, DurableError, ReplayClass, SessionId, StartOptions, StoreError,
    ToolSpec,
};
use durable_sqlite::SqliteStore;
use serde_json::{Value, json};

const EXIT_ROLLED_BACK: i32 = 4;
const EXIT_PARKED: i32 = 5;
const CHILD: &str = "DURABLE_ROLLBACK_CHILD";

fn email_spec() -> ToolSpec {
    ToolSpec::new(
        "send_email",
        "Email the customer.",
        ReplayClass::UnsafeOnReplay,
        json!({"type": "object", "properties": {"body": {"type": "string"}}}),
    )
}

fn append(path: &Path, line: &str) {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("open ledger");
    writeln!(file, "{line}").expect("write ledger");
}

fn ledger_lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// One worker run, in a child process: sends emails 1..=`DURABLE_ROLLBACK_EMAILS` of the
/// session, one per turn (checkpointed), and hangs after `DURABLE_ROLLBACK_HANG_AFTER`.
#[test]
fn child_worker() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let var = |name: &str| std::env::var(name).expect(name);
    let db = PathBuf::from(var("DURABLE_ROLLBACK_DB"));
    let ledger = PathBuf::from(var("DURABLE_ROLLBACK_LEDGER"));
    let emails: usize = var("DURABLE_ROLLBACK_EMAILS").parse().expect("emails");
    let hang_after: Option<usize> = std::env::var("DURABLE_ROLLBACK_HANG_AFTER")
        .ok()
        .map(|v| v.parse().expect("hang"));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let code = runtime.block_on(async move {
        let store = match SqliteStore::open(&db).await {
            Ok(store) => store,
            Err(e @ StoreError::RolledBack { .. }) => {
                println!("refused: {e}");
                return EXIT_ROLLED_BACK;
            }
            Err(e) => panic!("open: {e}"),
        };
        let durable = Durable::builder(Arc::new(store) as Arc<dyn CheckpointStore>)
            .owner("worker")
            .app_version("rollback-test")
            .build();
        let options = StartOptions::new().with_id(SessionId::new("onboard-ann"));
        let mut session = match durable.start_or_resume::<Value>(options).await {
            Ok(started) => started.session,
            Err(DurableError::Store(StoreError::NotResumable { status, .. }))
                if status == "parked" =>
            {
                return EXIT_PARKED;
            }
            Err(e) => panic!("start: {e}"),
        };
        let spec = email_spec();
        for n in session.messages().len() + 1..=emails {
            let ledger = ledger.clone();
            let body = format!("email {n}");
            let sent = session
                .journal()
                .tool(&spec, json!({"body": body}))
                .run(move |_ctx| {
                    let ledger = ledger.clone();
                    let body = body.clone();
                    async move {
                        append(&ledger, &body);
                        Ok::<_, String>(json!({"sent": body}))
                    }
                })
                .await
                .expect("send");
            session.push(sent);
            session.checkpoint().await.expect("checkpoint");
            if hang_after == Some(n) {
                println!("hanging");
                tokio::time::sleep(Duration::from_secs(3600)).await;
            }
        }
        0
    });
    std::process::exit(code);
}

/// Runs the worker; with `hang_after`, kills it (SIGKILL) once it says it hangs.
fn worker(db: &Path, ledger: &Path, emails: usize, hang_after: Option<usize>) -> i32 {
    let mut command = Command::new(std::env::current_exe().expect("exe"));
    command
        .args(["child_worker", "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env("DURABLE_ROLLBACK_DB", db)
        .env("DURABLE_ROLLBACK_LEDGER", ledger)
        .env("DURABLE_ROLLBACK_EMAILS", emails.to_string())
        .stdout(std::process::Stdio::piped());
    if let Some(n) = hang_after {
        command.env("DURABLE_ROLLBACK_HANG_AFTER", n.to_string());
    }
    let mut child = command.spawn().expect("spawn worker");
    if hang_after.is_some() {
        use std::io::{BufRead, BufReader};
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        loop {
            match lines.next() {
                Some(Ok(line)) if line.contains("hanging") => break,
                Some(_) => {}
                None => panic!("the worker ended before hanging"),
            }
        }
        child.kill().expect("SIGKILL");
        child.wait().expect("wait");
        return -9;
    }
    let output = child.wait_with_output().expect("wait");
    output.status.code().expect("exit code")
}

fn remove_wal(db: &Path) {
    for suffix in ["-wal", "-shm"] {
        let mut name = db.as_os_str().to_owned();
        name.push(suffix);
        let _ = std::fs::remove_file(PathBuf::from(name));
    }
}

fn sibling(db: &Path, suffix: &str) -> PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

#[test]
fn a_lost_wal_is_refused_and_its_sessions_parked_on_acknowledgment() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (db, ledger) = (dir.path().join("agent.db"), dir.path().join("ledger"));
    assert_eq!(worker(&db, &ledger, 2, Some(1)), -9);
    assert!(
        sibling(&db, "-wal").exists(),
        "the killed worker left its -wal"
    );
    remove_wal(&db);

    // Before the witness: the store opened empty and the email went out again.
    assert_eq!(worker(&db, &ledger, 2, None), EXIT_ROLLED_BACK);
    assert_eq!(ledger_lines(&ledger), ["email 1"]);

    // A reader still opens it, for inspection, and says what it found.
    let report = runtime().block_on(async {
        let store = SqliteStore::open_read_only(&db).await.expect("read-only");
        store.rollback_report().clone()
    });
    assert_eq!(report.sessions(), ["onboard-ann"]);
    assert!(report.lost.iter().all(|l| l.session_missing));

    let acknowledged = runtime()
        .block_on(SqliteStore::acknowledge_rollback(&db, "ops", false))
        .expect("acknowledge");
    assert_eq!(acknowledged.lost.len(), 1);
    // The session is back, parked: starting it again by id is refused.
    assert_eq!(worker(&db, &ledger, 2, None), EXIT_PARKED);
    assert_eq!(ledger_lines(&ledger), ["email 1"]);
    let logged: Vec<(String, String)> = runtime().block_on(async {
        let store = SqliteStore::open_read_only(&db).await.expect("read-only");
        sqlx::query_as("SELECT event, detail FROM durable_integrity_log WHERE event = 'rollback'")
            .fetch_all(store.pool())
            .await
            .expect("log")
    });
    assert_eq!(logged.len(), 1);
    assert!(logged[0].1.contains("`ops`"), "{logged:?}");
}

#[test]
fn a_restored_backup_is_refused_until_acknowledged() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (db, ledger) = (dir.path().join("agent.db"), dir.path().join("ledger"));
    let backup = dir.path().join("backup.db");
    assert_eq!(worker(&db, &ledger, 1, None), 0);
    runtime().block_on(async {
        let store = SqliteStore::open(&db).await.expect("open");
        store.backup_to(&backup).await.expect("backup");
        store.close().await;
    });
    assert_eq!(worker(&db, &ledger, 2, Some(2)), -9);
    assert_eq!(ledger_lines(&ledger), ["email 1", "email 2"]);

    // Restored over the store: email 2's row is gone, the witness has it.
    std::fs::copy(&backup, &db).expect("restore");
    remove_wal(&db);
    assert_eq!(worker(&db, &ledger, 2, None), EXIT_ROLLED_BACK);
    assert_eq!(ledger_lines(&ledger), ["email 1", "email 2"]);

    // Restored to a new place: no witness at all.
    let elsewhere = dir.path().join("moved.db");
    std::fs::copy(&backup, &elsewhere).expect("restore elsewhere");
    assert_eq!(worker(&elsewhere, &ledger, 2, None), EXIT_ROLLED_BACK);
    let report = runtime()
        .block_on(SqliteStore::acknowledge_rollback(&elsewhere, "ops", false))
        .expect("acknowledge");
    assert!(report.witness_missing);
    assert_eq!(worker(&elsewhere, &ledger, 2, None), EXIT_PARKED);

    runtime()
        .block_on(SqliteStore::acknowledge_rollback(&db, "ops", false))
        .expect("acknowledge");
    assert_eq!(worker(&db, &ledger, 2, None), EXIT_PARKED);
    assert_eq!(ledger_lines(&ledger), ["email 1", "email 2"]);
}

#[test]
fn a_new_store_at_an_old_path_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (db, ledger) = (dir.path().join("agent.db"), dir.path().join("ledger"));
    assert_eq!(worker(&db, &ledger, 1, None), 0);
    std::fs::remove_file(&db).expect("delete the store");
    remove_wal(&db);
    assert_eq!(worker(&db, &ledger, 1, None), EXIT_ROLLED_BACK);
    assert_eq!(ledger_lines(&ledger), ["email 1"]);
}

#[test]
fn a_complete_move_opens_and_a_purge_is_not_a_rollback() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (db, ledger) = (dir.path().join("agent.db"), dir.path().join("ledger"));
    assert_eq!(worker(&db, &ledger, 1, None), 0);
    // Moved with its witness (all the store's files): it opens.
    let moved = dir.path().join("moved.db");
    for suffix in ["", "-wal", "-witness"] {
        let from = sibling(&db, suffix);
        if from.exists() {
            std::fs::rename(&from, sibling(&moved, suffix)).expect("move");
        }
    }
    remove_wal(&db);
    assert_eq!(worker(&moved, &ledger, 2, None), 0);
    assert_eq!(ledger_lines(&ledger), ["email 1", "email 2"]);
}

// ---------------------------------------------------------------------------------------
// The generator.

/// xorshift64*: a seeded, dependency-free generator, so a failing seed replays exactly.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

/// One copy of the store's files, as a naive backup takes it.
struct Snapshot {
    db: Vec<u8>,
    wal: Option<Vec<u8>>,
}

/// Runs one turn of `session`: sends its next email (recorded in `effects`), checkpoints.
/// Without `checkpoint`, the worker stops after the email as if it died before its
/// checkpoint (the lease released so that the next turn may re-run the step at once).
async fn turn(
    store: &SqliteStore,
    session: &str,
    effects: &Mutex<HashMap<String, usize>>,
    checkpoint: bool,
) {
    let durable = Durable::builder(Arc::new(store.clone()) as Arc<dyn CheckpointStore>)
        .owner("gen")
        .app_version("gen")
        .build();
    let options = StartOptions::new().with_id(SessionId::new(session));
    let mut handle = match durable.start_or_resume::<Value>(options).await {
        Ok(started) => started.session,
        // A damaged store refuses, typed: nothing runs.
        Err(DurableError::Store(
            StoreError::Tampered { .. }
            | StoreError::KeyMissing { .. }
            | StoreError::Corrupt { .. },
        )) => return,
        Err(DurableError::Store(StoreError::NotResumable { status, .. })) if status == "parked" => {
            return;
        }
        Err(DurableError::Store(StoreError::Leased { .. })) => return,
        Err(e) => panic!("start {session}: {e}"),
    };
    let n = handle.messages().len() + 1;
    let key = format!("{session}/email {n}");
    let sent = handle
        .journal()
        .tool(&email_spec(), json!({"body": format!("email {n}")}))
        .run(|_ctx| async {
            *effects
                .lock()
                .expect("effects")
                .entry(key.clone())
                .or_default() += 1;
            Ok::<_, String>(json!({"sent": n}))
        })
        .await;
    match sent {
        Ok(value) => {
            if checkpoint {
                handle.push(value);
                handle.checkpoint().await.expect("checkpoint");
            }
            handle.release().await.expect("release");
        }
        Err(durable_core::CallError::Durable(
            DurableError::ReplayUnsafe { .. }
            | DurableError::Store(StoreError::Tampered { .. } | StoreError::Corrupt { .. }),
        )) => {
            let _ = handle.release().await;
        }
        Err(e) => panic!("send in {session}: {e}"),
    }
}

fn read_snapshot(db: &Path) -> Snapshot {
    Snapshot {
        db: std::fs::read(db).expect("read db"),
        wal: std::fs::read(sibling(db, "-wal")).ok(),
    }
}

/// Seeded random programs: turns of three sessions, naive snapshots (the `.db` alone, or
/// with its `-wal`) taken while the store is open, and restores of an earlier snapshot
/// over the store; a refused open is acknowledged, as an operator would. No email may
/// ever be sent twice.
#[test]
fn random_rollbacks_never_send_twice() {
    let seeds: u64 = std::env::var("DURABLE_ROLLBACK_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24);
    for seed in 1..=seeds {
        random_program(seed);
    }
}

/// Edits the closed store's file directly.
async fn damage(db: &Path, forge: bool, offset: i64, drop_store_key: bool) {
    use sqlx::{ConnectOptions, Connection};
    let mut conn = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(db)
        .connect()
        .await
        .expect("raw connection");
    if forge {
        sqlx::query(
            "UPDATE durable_tool_calls SET status = 'not_happened', result = NULL, mac = NULL \
             WHERE id = (SELECT id FROM durable_tool_calls \
               WHERE replay_class = 'unsafe_on_replay' AND status = 'completed' \
               ORDER BY id LIMIT 1 OFFSET ?)",
        )
        .bind(offset)
        .execute(&mut conn)
        .await
        .expect("forge");
        sqlx::query("DELETE FROM durable_meta WHERE name = 'signing_key'")
            .execute(&mut conn)
            .await
            .expect("drop the signing key row");
        if drop_store_key {
            sqlx::query("DELETE FROM durable_meta WHERE name = 'store_key'")
                .execute(&mut conn)
                .await
                .expect("drop the store key row");
        }
    } else {
        sqlx::query(
            "DELETE FROM durable_tool_calls WHERE id = \
             (SELECT id FROM durable_tool_calls ORDER BY id LIMIT 1 OFFSET ?)",
        )
        .bind(offset)
        .execute(&mut conn)
        .await
        .expect("delete a journal row");
    }
    conn.close().await.expect("close");
}

fn trace(seed: u64, step: usize, what: &str) {
    if std::env::var_os("DURABLE_ROLLBACK_TRACE").is_some() {
        eprintln!("seed {seed} step {step}: {what}");
    }
}

fn random_program(seed: u64) {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("agent.db");
    let effects = Mutex::new(HashMap::<String, usize>::new());
    let mut snapshots: Vec<Snapshot> = Vec::new();
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut acknowledged = 0;
    runtime().block_on(async {
        let mut store = SqliteStore::open(&db).await.expect("open");
        for step in 0..24 {
            match rng.below(12) {
                0..=5 => {
                    let session = format!("s{}", rng.below(3));
                    let checkpoint = rng.below(3) != 0;
                    trace(seed, step, &format!("turn {session} (checkpoint: {checkpoint})"));
                    turn(&store, &session, &effects, checkpoint).await;
                }
                6 | 7 => {
                    let mut snapshot = read_snapshot(&db);
                    if rng.below(2) == 0 {
                        snapshot.wal = None;
                    }
                    trace(seed, step, &format!("snapshot {} (wal: {})", snapshots.len(), snapshot.wal.is_some()));
                    snapshots.push(snapshot);
                }
                _ if !snapshots.is_empty() => {
                    let pick = usize::try_from(rng.below(snapshots.len() as u64)).expect("index");
                    trace(seed, step, &format!("restore {pick}"));
                    store.close().await;
                    let snapshot = &snapshots[pick];
                    std::fs::write(&db, &snapshot.db).expect("restore db");
                    remove_wal(&db);
                    if let Some(wal) = &snapshot.wal {
                        std::fs::write(sibling(&db, "-wal"), wal).expect("restore wal");
                    }
                    store = match SqliteStore::open(&db).await {
                        Ok(store) => store,
                        Err(StoreError::RolledBack { detail, .. }) => {
                            trace(seed, step, &format!("refused: {detail}"));
                            acknowledged += 1;
                            SqliteStore::acknowledge_rollback(&db, "gen", false)
                                .await
                                .expect("acknowledge");
                            SqliteStore::open(&db).await.expect("open after acknowledging")
                        }
                        Err(e) => panic!("seed {seed} step {step}: reopen: {e}"),
                    };
                }
                10 | 11 => {
                    // Damage from outside, as an attacker or a careless script would:
                    // forge a completed email as never sent and drop the key rows (the
                    // store must not adopt and re-seal that), or delete a journal row.
                    let forge = rng.below(2) == 0;
                    let offset = i64::try_from(rng.below(4)).expect("offset");
                    let drop_store_key = rng.below(2) == 0;
                    trace(seed, step, &format!("damage (forge: {forge}, offset {offset})"));
                    store.close().await;
                    damage(&db, forge, offset, drop_store_key).await;
                    store = match SqliteStore::open(&db).await {
                        Ok(store) => store,
                        Err(
                            e @ (StoreError::KeyMissing { .. }
                            | StoreError::Tampered { .. }
                            | StoreError::Corrupt { .. }),
                        ) => {
                            // Refused, typed: the operator's turn; the program ends here.
                            trace(seed, step, &format!("refused: {e}"));
                            break;
                        }
                        Err(StoreError::RolledBack { detail, .. }) => {
                            // A deleted journal row is a rollback the witness sees.
                            trace(seed, step, &format!("refused: {detail}"));
                            SqliteStore::acknowledge_rollback(&db, "gen", false)
                                .await
                                .expect("acknowledge");
                            SqliteStore::open(&db).await.expect("open after acknowledging")
                        }
                        Err(e) => panic!("seed {seed} step {step}: reopen after damage: {e}"),
                    };
                }
                _ => {}
            }
            let effects = effects.lock().expect("effects");
            let twice: Vec<_> = effects.iter().filter(|(_, n)| **n > 1).collect();
            assert!(
                twice.is_empty(),
                "seed {seed} step {step}: sent twice: {twice:?} (rerun with DURABLE_ROLLBACK_SEEDS={seed})"
            );
        }
        store.close().await;
    });
    let _ = acknowledged;
}
