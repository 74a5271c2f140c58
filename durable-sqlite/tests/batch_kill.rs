//! A process killed in the middle of group-committed batches: every call the
//! process was told had been journaled is in the store with its outcome, and every
//! session still reads and resumes.
//!
//! The test binary is its own child: with `DURABLE_BATCH_CHILD` set,
//! [`child_process_entry`] runs 16 sessions at once on one store, each making
//! `unsafe_on_replay` calls one after the other and printing `acked <session> <n>` once a
//! call has returned. The parent reads those lines, kills the child with `SIGKILL` while
//! its writes are in flight, and checks the file.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;

use durable_core::store::{CallStatus, CheckpointStore, Lease};
use durable_core::{Durable, Message, ReplayClass, SessionId, StartOptions, ToolSpec};
use durable_sqlite::SqliteStore;
use serde_json::json;

const SESSIONS: usize = 16;
const CHILD: &str = "DURABLE_BATCH_CHILD";

fn spec() -> ToolSpec {
    ToolSpec::new(
        "send",
        "An effect that must not run twice.",
        ReplayClass::UnsafeOnReplay,
        json!({"type": "object", "properties": {"n": {"type": "integer"}}}),
    )
}

fn session_id(i: usize) -> SessionId {
    SessionId::new(format!("batch-kill-{i:02}"))
}

/// The child's work; does nothing when run as an ordinary test.
#[test]
fn child_process_entry() {
    let Some(path) = std::env::var_os(CHILD) else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        let store = SqliteStore::open(path).await.expect("open");
        let durable = Durable::builder(Arc::new(store)).owner("child").build();
        let mut tasks = Vec::new();
        for i in 0..SESSIONS {
            let session = durable
                .start::<Message>(StartOptions::new().with_id(session_id(i)))
                .await
                .expect("start");
            tasks.push(tokio::spawn(async move {
                let spec = spec();
                for n in 0.. {
                    session
                        .journal()
                        .tool(&spec, json!({ "n": n }))
                        .run(|_ctx| async move { Ok::<_, String>(json!({ "sent": n })) })
                        .await
                        .expect("journaled call");
                    let mut out = std::io::stdout().lock();
                    writeln!(out, "acked {i} {n}").expect("stdout");
                    out.flush().expect("flush");
                }
            }));
        }
        for task in tasks {
            task.await.expect("task");
        }
    });
}

#[tokio::test]
async fn a_kill_in_the_middle_of_a_batch_loses_no_acknowledged_call() {
    for (run, kill_after) in [(0, 60), (1, 250), (2, 600)].into_iter() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("batch.db");
        let mut child = Command::new(std::env::current_exe().expect("test binary"))
            .args(["child_process_entry", "--exact", "--nocapture", "--quiet"])
            .env(CHILD, &path)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn the child");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let mut acked: BTreeMap<usize, BTreeSet<i64>> = BTreeMap::new();
        let mut count = 0;
        while count < kill_after {
            let line = lines
                .next()
                .expect("the child stopped before being killed")
                .expect("read");
            if let Some(rest) = line.strip_prefix("acked ") {
                let (i, n) = rest.split_once(' ').expect("acked <session> <n>");
                acked
                    .entry(i.parse().expect("session"))
                    .or_default()
                    .insert(n.parse().expect("n"));
                count += 1;
            }
        }
        child.kill().expect("SIGKILL");
        // Acknowledgements printed before the kill are still in the pipe.
        for line in lines.map_while(Result::ok) {
            if let Some(rest) = line.strip_prefix("acked ") {
                let (i, n) = rest.split_once(' ').expect("acked <session> <n>");
                acked
                    .entry(i.parse().expect("session"))
                    .or_default()
                    .insert(n.parse().expect("n"));
            }
        }
        child.wait().expect("reap");

        let store: Arc<dyn CheckpointStore> =
            Arc::new(SqliteStore::open(&path).await.expect("reopen"));
        for i in 0..SESSIONS {
            let id = session_id(i);
            let rows = store
                .calls(&id, None)
                .await
                .unwrap_or_else(|e| panic!("run {run}: session {i} after the kill: {e}"));
            let completed: BTreeSet<i64> = rows
                .iter()
                .filter(|r| r.status == CallStatus::Completed)
                .filter_map(|r| r.args["n"].as_i64())
                .collect();
            for n in acked.get(&i).into_iter().flatten() {
                assert!(
                    completed.contains(n),
                    "run {run}: session {i}: call {n} was acknowledged but is not in the store \
                     as completed ({} rows)",
                    rows.len()
                );
            }
            // At most the call in flight is in doubt: the session resumes and says so.
            let in_doubt = rows
                .iter()
                .filter(|r| r.status == CallStatus::Issued)
                .count();
            assert!(
                in_doubt <= 1,
                "run {run}: session {i}: {in_doubt} rows in doubt"
            );
        }
        let durable = Durable::builder(Arc::clone(&store)).owner("after").build();
        for i in 0..SESSIONS {
            let id = session_id(i);
            // The dead child's lease is still live: release it, as its supervisor would.
            let record = store.session(&id).await.expect("session");
            let dead = Lease {
                session: id.clone(),
                owner: record.lease_owner.clone().unwrap_or_default(),
                fence: record.fence,
                expires_at: 0,
            };
            store
                .release_lease(&dead)
                .await
                .expect("release the dead lease");
            let resumed = durable
                .resume::<Message>(&id)
                .await
                .unwrap_or_else(|e| panic!("run {run}: session {i} does not resume: {e}"));
            assert!(
                resumed.report.in_doubt.len() <= 1,
                "run {run}: session {i}: the resume reports {} calls in doubt",
                resumed.report.in_doubt.len()
            );
        }
    }
}
