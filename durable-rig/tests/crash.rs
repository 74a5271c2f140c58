//! Crash tests in real processes: a child process runs rig's agent loop in a durable
//! session (SQLite store file) against the canned OpenAI-compatible server this process
//! serves on loopback, and is killed with SIGKILL at an exact point (it prints
//! `CRASH_POINT <name>` and waits there). A new process resumes the session and runs the
//! prompt again. The stub's request log shows which replies the model was asked for; a
//! ledger (a SQLite file of its own) shows every tool execution.
//!
//! `harness = false`: the same binary is the child when `DURABLE_RIG_CHILD` is set.

mod common;

use std::path::Path;
use std::process::{ExitCode, Stdio};
use std::sync::Arc;

use durable::store::Resolution;
use durable::{CheckpointStore, Durable, DurableError, SessionId, StartOptions};
use durable_openai_stub::{Reply, Stub};
use durable_rig::DurableRig;
use rig_core::providers::openai::OpenAIConfig;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

use common::{FINAL, PROMPT, crash_point, effects, script, script_ending, toolbox};

const SESSION: &str = "order-o-1";
/// The child's exit code when durable refused to go on (`ReplayUnsafe`).
const REFUSED: i32 = 3;

async fn runtime(store: &Path) -> Durable {
    let url = format!("sqlite:{}", store.display());
    let store: Arc<dyn CheckpointStore> = durable::connect(&url).await.expect("store");
    // One owner for every process: a new process takes over the lease its killed
    // predecessor never released (a recovery).
    Durable::builder(store).owner("rig-crash").build()
}

/// The child: resume (or start) the session, run the prompt with rig, checkpoint.
async fn child() -> i32 {
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    let durable = runtime(Path::new(&var("DURABLE_RIG_STORE"))).await;
    let resumed = durable
        .start_or_resume::<Value>(StartOptions::new().with_id(SessionId::new(SESSION)))
        .await
        .expect("session");
    let mut session = resumed.session;
    let rig = DurableRig::new(session.journal().clone(), toolbox());
    let model = OpenAIConfig::new("test-key")
        .with_base_url(var("DURABLE_RIG_BASE_URL"))
        .client()
        .chat("stub-model");
    let agent = rig
        .agent(model)
        .expect("tools")
        .preamble("You run a shop.")
        .build();
    let run = if std::env::var_os("DURABLE_RIG_STREAM").is_some() {
        streamed(agent.prompt(PROMPT).max_turns(5).stream()).await
    } else {
        agent
            .prompt(PROMPT)
            .max_turns(5)
            .run()
            .await
            .map(|reply| reply.output())
            .map_err(|e| e.to_string())
    };
    match run {
        Ok(output) => {
            session.push(json!({"role": "assistant", "content": output}));
            session.complete().await.expect("complete");
            println!("DONE {output}");
            0
        }
        Err(error) => match rig.take_error() {
            Some(e @ DurableError::ReplayUnsafe { .. }) => {
                println!("REFUSED {e}");
                REFUSED
            }
            other => {
                eprintln!("child failed: {error} ({other:?})");
                1
            }
        },
    }
}

/// A streamed run, as a UI reads it: each text fragment printed as `CHUNK <json>`, each
/// finished block as `END <json>`; crash points `mid_stream` (the first text fragment
/// shown, its reply not yet journaled) and `after_stream` (the final response handed
/// out: every reply journaled, nothing checkpointed).
async fn streamed(mut stream: rig_agent::agent::StreamingResult) -> Result<String, String> {
    use futures_util::StreamExt;
    use rig_agent::agent::MultiTurnStreamItem;
    use rig_core::streaming::{Item, StreamEvent};

    let mut shown = 0;
    while let Some(item) = stream.next().await {
        match item.map_err(|e| e.to_string())? {
            MultiTurnStreamItem::StreamAssistantItem(Item::Event(StreamEvent::Text {
                text,
                ..
            })) => {
                println!("CHUNK {}", json!(text));
                shown += 1;
                if shown == 1 {
                    crash_point("mid_stream").await;
                }
            }
            MultiTurnStreamItem::StreamAssistantItem(Item::Event(StreamEvent::End {
                content,
                ..
            })) => println!("END {}", json!(content)),
            MultiTurnStreamItem::FinalResponse(response) => {
                crash_point("after_stream").await;
                return Ok(response.output());
            }
            _ => {}
        }
    }
    Err("the streamed run ended without its final response".into())
}

/// The text a UI showed: the `CHUNK` lines' fragments, joined.
fn shown(lines: &[String]) -> String {
    lines
        .iter()
        .filter_map(|line| line.strip_prefix("CHUNK "))
        .map(|text| serde_json::from_str::<String>(text).expect("a JSON string"))
        .collect()
}

/// The blocks a UI rendered: the `END` lines.
fn ends(lines: &[String]) -> Vec<&str> {
    lines
        .iter()
        .filter_map(|line| line.strip_prefix("END "))
        .collect()
}

struct Run {
    /// The crash point reached (the child was killed there), if any.
    crashed: Option<String>,
    /// The child's exit code when it was not killed.
    code: Option<i32>,
    lines: Vec<String>,
}

/// Runs a child; kills it (SIGKILL) as soon as it reports `crash_at`.
async fn run_child(dir: &Path, stub: &Stub, crash_at: Option<&str>) -> Run {
    run_child_with(dir, stub, crash_at, false).await
}

/// [`run_child`], the agent streaming its run (`stream()`) when `stream` is set.
async fn run_child_with(dir: &Path, stub: &Stub, crash_at: Option<&str>, stream: bool) -> Run {
    let mut command = Command::new(std::env::current_exe().expect("test binary"));
    if stream {
        command.env("DURABLE_RIG_STREAM", "1");
    } else {
        command.env_remove("DURABLE_RIG_STREAM");
    }
    let mut child = command
        .env("DURABLE_RIG_CHILD", "1")
        .env("DURABLE_RIG_STORE", dir.join("store.db"))
        .env("DURABLE_RIG_LEDGER", dir.join("ledger.db"))
        .env("DURABLE_RIG_BASE_URL", stub.base_url())
        .env("DURABLE_RIG_CRASH_AT", crash_at.unwrap_or(""))
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn child");
    let mut out = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut lines = Vec::new();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(120);
    while let Ok(Ok(Some(line))) = tokio::time::timeout_at(deadline, out.next_line()).await {
        if let Some(point) = line.strip_prefix("CRASH_POINT ") {
            child.kill().await.expect("SIGKILL");
            return Run {
                crashed: Some(point.to_owned()),
                code: None,
                lines,
            };
        }
        lines.push(line);
    }
    let status = tokio::time::timeout_at(deadline, child.wait())
        .await
        .expect("child finished in time")
        .expect("child status");
    Run {
        crashed: None,
        code: status.code(),
        lines,
    }
}

/// Killed after the first model reply was recorded (inside the first tool, before it
/// did anything): the resumed run replays that reply and asks the model only for the
/// second; every tool runs once.
async fn killed_after_the_first_reply() {
    let dir = tempfile::tempdir().expect("dir");
    let stub = Stub::start(script()).await.expect("stub");
    let ledger = dir.path().join("ledger.db");

    let first = run_child(dir.path(), &stub, Some("in_lookup")).await;
    assert_eq!(
        first.crashed.as_deref(),
        Some("in_lookup"),
        "{:?}",
        first.lines
    );
    assert_eq!(stub.requests().len(), 1);
    assert!(effects(&ledger, SESSION).await.is_empty());

    let second = run_child(dir.path(), &stub, None).await;
    assert_eq!(second.code, Some(0), "{:?}", second.lines);
    assert_eq!(second.lines, [format!("DONE {FINAL}")]);
    assert_eq!(
        stub.requests().len(),
        2,
        "the recorded first reply was not asked for again"
    );
    assert_eq!(
        effects(&ledger, SESSION).await,
        ["lookup", "send_email", "charge"]
    );
}

/// Killed right after the email's ledger row was written (its outcome never recorded):
/// the resumed run refuses the in-doubt email (`ReplayUnsafe`) instead of sending it
/// again; once an operator resolves it as happened, a third process finishes the turn
/// with the recorded lookup, the operator's email result and a fresh charge.
async fn killed_after_the_email_left() {
    let dir = tempfile::tempdir().expect("dir");
    let stub = Stub::start(script()).await.expect("stub");
    let ledger = dir.path().join("ledger.db");

    let first = run_child(dir.path(), &stub, Some("after_email")).await;
    assert_eq!(
        first.crashed.as_deref(),
        Some("after_email"),
        "{:?}",
        first.lines
    );
    assert_eq!(effects(&ledger, SESSION).await, ["lookup", "send_email"]);

    let second = run_child(dir.path(), &stub, None).await;
    assert_eq!(second.code, Some(REFUSED), "{:?}", second.lines);
    assert!(
        second.lines.iter().any(|l| l.contains("send_email")),
        "the refusal names the tool: {:?}",
        second.lines
    );
    assert_eq!(stub.requests().len(), 1, "the first reply was replayed");
    assert_eq!(
        effects(&ledger, SESSION).await,
        ["lookup", "send_email"],
        "the in-doubt email was not sent again"
    );

    // The operator checks the mail server: it left. Resolve it as happened.
    let durable = runtime(&dir.path().join("store.db")).await;
    let in_doubt = durable
        .operator()
        .in_doubt(Some(&SessionId::new(SESSION)))
        .await
        .expect("in doubt");
    assert_eq!(in_doubt.len(), 1);
    assert_eq!(in_doubt[0].identity.tool, "send_email");
    durable
        .operator()
        .resolve(
            &in_doubt[0].id,
            Resolution::Happened {
                result: json!({"message_id": "msg-o-1"}),
            },
            "ops@example.com",
            Some("found in the outbox"),
        )
        .await
        .expect("resolve");

    let third = run_child(dir.path(), &stub, None).await;
    assert_eq!(third.code, Some(0), "{:?}", third.lines);
    assert_eq!(third.lines, [format!("DONE {FINAL}")]);
    assert_eq!(
        stub.requests().len(),
        2,
        "only the second reply was asked for"
    );
    assert_eq!(
        effects(&ledger, SESSION).await,
        ["lookup", "send_email", "charge"],
        "every tool ran once"
    );
    // What the model read for the email is the operator's result.
    let last = stub.requests().pop().expect("request");
    let email = last["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["tool_call_id"] == "call_email")
        .expect("email result")
        .clone();
    assert!(email["content"].to_string().contains("msg-o-1"), "{email}");
}

/// A streamed run killed after the first text fragment of its second reply reached the
/// UI (the tools of the first reply ran, the second reply is not journaled: its stream
/// is still open): the resumed
/// run replays the first reply as a stream, its tools' recorded results come back, and
/// only the second reply is asked for again; every tool ran once.
async fn streamed_killed_mid_stream() {
    let dir = tempfile::tempdir().expect("dir");
    // The answer's stream stalls after its first piece the first time it is asked: rig
    // relays a reply's events through a buffer, so a stream the stub sent whole could be
    // journaled before the kill lands.
    let stub = Stub::start(script_ending(Reply::stall_then(Reply::text(FINAL))))
        .await
        .expect("stub");
    let ledger = dir.path().join("ledger.db");

    let first = run_child_with(dir.path(), &stub, Some("mid_stream"), true).await;
    assert_eq!(
        first.crashed.as_deref(),
        Some("mid_stream"),
        "{:?}",
        first.lines
    );
    assert!(
        !shown(&first.lines).is_empty(),
        "part of the reply was shown"
    );
    assert_eq!(stub.requests().len(), 2);
    assert!(
        stub.requests().iter().all(|r| r["stream"] == true),
        "rig streamed"
    );
    assert_eq!(
        effects(&ledger, SESSION).await,
        ["lookup", "send_email", "charge"]
    );

    let second = run_child_with(dir.path(), &stub, None, true).await;
    assert_eq!(second.code, Some(0), "{:?}", second.lines);
    assert_eq!(second.lines.last(), Some(&format!("DONE {FINAL}")));
    assert_eq!(shown(&second.lines), FINAL, "the whole reply, shown once");
    assert_eq!(
        stub.requests().len(),
        3,
        "only the cut reply was asked for again"
    );
    let asked_last = stub.requests().pop().expect("request");
    assert_eq!(
        asked_last["messages"].as_array().map(Vec::len),
        stub.requests()[1]["messages"].as_array().map(Vec::len),
        "the same question as the cut reply's"
    );
    assert_eq!(
        effects(&ledger, SESSION).await,
        ["lookup", "send_email", "charge"],
        "no tool ran twice"
    );
}

/// A streamed run killed after its final response was handed out (every reply
/// journaled, nothing checkpointed): the resumed run replays both replies as streams,
/// shows the same text and the same blocks, asks the model nothing, runs no tool.
async fn streamed_killed_after_the_stream() {
    let dir = tempfile::tempdir().expect("dir");
    let stub = Stub::start(script()).await.expect("stub");
    let ledger = dir.path().join("ledger.db");

    let first = run_child_with(dir.path(), &stub, Some("after_stream"), true).await;
    assert_eq!(
        first.crashed.as_deref(),
        Some("after_stream"),
        "{:?}",
        first.lines
    );
    assert_eq!(shown(&first.lines), FINAL);
    assert!(
        first
            .lines
            .iter()
            .filter(|l| l.starts_with("CHUNK "))
            .count()
            > 1,
        "live, the text came in pieces: {:?}",
        first.lines
    );
    assert_eq!(stub.requests().len(), 2);

    let second = run_child_with(dir.path(), &stub, None, true).await;
    assert_eq!(second.code, Some(0), "{:?}", second.lines);
    assert_eq!(stub.requests().len(), 2, "the model was not asked again");
    assert_eq!(shown(&second.lines), shown(&first.lines), "the same text");
    assert_eq!(ends(&second.lines), ends(&first.lines), "the same blocks");
    assert_eq!(
        effects(&ledger, SESSION).await,
        ["lookup", "send_email", "charge"],
        "no tool ran twice"
    );
}

/// A scenario, boxed so the cases fit in one list.
type Case = fn() -> std::pin::Pin<Box<dyn Future<Output = ()>>>;

fn main() -> ExitCode {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    if std::env::var_os("DURABLE_RIG_CHILD").is_some() {
        let code = runtime.block_on(child());
        return ExitCode::from(u8::try_from(code).unwrap_or(1));
    }
    let cases: [(&str, Case); 4] = [
        ("streamed_killed_mid_stream", || {
            Box::pin(streamed_killed_mid_stream())
        }),
        ("streamed_killed_after_the_stream", || {
            Box::pin(streamed_killed_after_the_stream())
        }),
        ("killed_after_the_first_reply", || {
            Box::pin(killed_after_the_first_reply())
        }),
        ("killed_after_the_email_left", || {
            Box::pin(killed_after_the_email_left())
        }),
    ];
    let filter = std::env::args().nth(1).filter(|a| !a.starts_with('-'));
    let mut passed = 0;
    for (name, case) in cases {
        if filter.as_deref().is_some_and(|f| !name.contains(f)) {
            continue;
        }
        println!("crash: {name} ...");
        runtime.block_on(case());
        println!("crash: {name} ok");
        passed += 1;
    }
    println!("{passed} passed, 0 failed");
    ExitCode::SUCCESS
}
