//! A plain async-openai agent made durable by wrapping its client
//! (`examples/wrapped_agent/agent.rs`: `DurableClient`, `#[durable_tool]`s), killed with
//! SIGKILL at exact points and run again from the top in a new process, against the stub
//! in this process; its tools' effects go to a ledger beside the store.
//!
//! `harness = false`: this binary is also the child (`DURABLE_WRAPPED_CHILD` set).
//!
//! What each case relies on, and what was checked to make it fail:
//! - a reply recorded before the crash is not asked again, streamed or not, and the
//!   streamed one is shown again as the same text (the client's `create` or
//!   `create_stream` passed through to async-openai unjournaled → every question is
//!   asked again and the lookup runs twice);
//! - a streamed reply cut by the kill is asked again and nothing half-recorded stays;
//! - every reply's usage is recorded with it (charged to the budget).

use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use durable::SessionId;
use durable_openai_stub::{Reply, Script, Stub};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

#[path = "../examples/wrapped_agent/agent.rs"]
#[allow(dead_code, reason = "the example's module; the test uses part of it")]
mod agent;

const CHILD: &str = "DURABLE_WRAPPED_CHILD";
const SESSION: &str = "wrapped-1";
const LIMIT: Duration = Duration::from_secs(120);
const ANSWER: &str = "A-1 is in stock; ann@example.com has been told.";

type Case = fn() -> std::pin::Pin<Box<dyn Future<Output = ()>>>;

fn main() {
    if std::env::var_os(CHILD).is_some() {
        std::process::exit(child());
    }
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let cases: [(&str, Case); 3] = [
        (
            "wrapped_killed_after_a_reply_the_rerun_asks_nothing_twice",
            || Box::pin(wrapped_killed_after_a_reply_the_rerun_asks_nothing_twice()),
        ),
        (
            "wrapped_streamed_killed_mid_stream_the_rerun_asks_that_reply_again",
            || Box::pin(wrapped_streamed_killed_mid_stream_the_rerun_asks_that_reply_again()),
        ),
        (
            "wrapped_streamed_killed_after_the_stream_the_rerun_replays_it_as_a_stream",
            || {
                Box::pin(
                    wrapped_streamed_killed_after_the_stream_the_rerun_replays_it_as_a_stream(),
                )
            },
        ),
    ];
    for (name, case) in cases {
        if !filter.is_empty() && !filter.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        println!("test {name} ...");
        runtime.block_on(case());
        println!("test {name} ... ok");
    }
}

fn child() -> i32 {
    let var = |name: &str| std::env::var(name).ok();
    let (Some(store), Some(ledger), Some(base_url)) = (
        var("DURABLE_WRAPPED_STORE"),
        var("DURABLE_WRAPPED_LEDGER"),
        var("DURABLE_WRAPPED_BASE_URL"),
    ) else {
        eprintln!("the child needs DURABLE_WRAPPED_STORE, _LEDGER and _BASE_URL");
        return 2;
    };
    let options = agent::Options {
        store: PathBuf::from(store),
        ledger: PathBuf::from(ledger),
        session: SESSION.into(),
        base_url,
        stream: var("DURABLE_WRAPPED_STREAM").is_some(),
        pause_at: var("DURABLE_WRAPPED_PAUSE_AT"),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("runtime: {e}");
            return 1;
        }
    };
    match runtime.block_on(agent::run(options)) {
        Ok(answer) => {
            println!("answer: {answer}");
            0
        }
        Err(e) => {
            eprintln!("error: {e}");
            1
        }
    }
}

fn script() -> Script {
    Script::new([
        Reply::tool_calls([("call_1", "lookup", r#"{"sku":"A-1"}"#)]),
        Reply::tool_calls([(
            "call_2",
            "send_email",
            r#"{"to":"ann@example.com","body":"A-1 is in stock."}"#,
        )]),
        Reply::text(ANSWER),
    ])
}

struct World {
    dir: tempfile::TempDir,
    stub: Stub,
    stream: bool,
}

impl World {
    async fn new(stream: bool) -> Self {
        World {
            dir: tempfile::tempdir().expect("tempdir"),
            stub: Stub::start(script()).await.expect("stub"),
            stream,
        }
    }

    fn store(&self) -> PathBuf {
        self.dir.path().join("agent.db")
    }

    fn ledger(&self) -> PathBuf {
        self.dir.path().join("ledger.db")
    }

    fn spawn(&self, pause_at: Option<&str>) -> Child {
        let mut cmd = Command::new(std::env::current_exe().expect("current exe"));
        cmd.env(CHILD, "1")
            .env("DURABLE_WRAPPED_STORE", self.store())
            .env("DURABLE_WRAPPED_LEDGER", self.ledger())
            .env("DURABLE_WRAPPED_BASE_URL", self.stub.base_url())
            .env_remove("DURABLE_WRAPPED_PAUSE_AT")
            .env_remove("DURABLE_WRAPPED_STREAM")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if let Some(point) = pause_at {
            cmd.env("DURABLE_WRAPPED_PAUSE_AT", point);
        }
        if self.stream {
            cmd.env("DURABLE_WRAPPED_STREAM", "1");
        }
        cmd.spawn().expect("spawn the agent")
    }

    /// Runs the agent until it prints `paused at <point>`, then SIGKILLs it; returns
    /// what it printed before.
    async fn kill_at(&self, point: &str) -> Vec<String> {
        let mut child = self.spawn(Some(point));
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        let wanted = format!("paused at {point}");
        let mut printed = Vec::new();
        let reached = tokio::time::timeout(LIMIT, async {
            while let Some(line) = lines.next_line().await.expect("read stdout") {
                if line == wanted {
                    return true;
                }
                printed.push(line);
            }
            false
        })
        .await
        .expect("the agent reaches its pause point in time");
        if !reached {
            let out = child.wait_with_output().await.expect("wait");
            panic!(
                "the agent ended before `{point}`: {:?}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        child.kill().await.expect("SIGKILL the agent");
        printed
    }

    /// Runs the agent to its end: its status, stdout and stderr.
    async fn run(&self) -> (ExitStatus, String, String) {
        let child = self.spawn(None);
        let out = tokio::time::timeout(LIMIT, child.wait_with_output())
            .await
            .expect("the agent ends in time")
            .expect("wait");
        (
            out.status,
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    async fn count(&self, kind: &str) -> usize {
        let pool = agent::open_ledger(&self.ledger()).await.expect("ledger");
        let (n,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM effects WHERE kind = ?")
            .bind(kind)
            .fetch_one(&pool)
            .await
            .expect("count");
        usize::try_from(n).expect("a count")
    }

    /// The model replies in the journal, with the tokens recorded with each.
    async fn model_rows(&self) -> Vec<Option<(u64, u64)>> {
        let store = durable::connect(&format!("sqlite:{}", self.store().display()))
            .await
            .expect("store");
        let rows = store
            .calls(&SessionId::new(SESSION), None)
            .await
            .expect("journal");
        rows.iter()
            .filter(|r| r.identity.tool == durable::runtime::MODEL_SLOT)
            .map(|r| {
                let spend: durable::Spend =
                    serde_json::from_value(r.spend.clone()?).expect("a recorded spend");
                Some((spend.input_tokens(), spend.output_tokens()))
            })
            .collect()
    }

    /// How often the model was asked the question that `assistant` replies precede.
    fn asked(&self, assistant: usize) -> usize {
        self.stub
            .requests()
            .iter()
            .filter(|r| assistant_messages(r) == assistant)
            .count()
    }

    /// The run went to its end with the model's answer, the lookup and the email ran
    /// once each, and every reply was journaled with its usage.
    async fn assert_done_once(&self, status: ExitStatus, stdout: &str, stderr: &str) {
        assert!(status.success(), "{status:?}\n{stderr}");
        assert!(
            stdout.contains(&format!("answer: {ANSWER}")),
            "the model's answer: {stdout}"
        );
        assert_eq!(self.count("lookup").await, 1, "the lookup ran once");
        assert_eq!(self.count("email").await, 1, "the email was sent once");
        let usage = durable_openai_stub::USAGE;
        assert_eq!(
            self.model_rows().await,
            vec![Some(usage); 3],
            "three replies journaled, each with its usage"
        );
    }
}

fn assistant_messages(request: &Value) -> usize {
    request["messages"]
        .as_array()
        .map_or(0, |m| m.iter().filter(|m| m["role"] == "assistant").count())
}

/// The text a UI showed: the `chunk "<text>"` lines, concatenated.
fn shown<S: AsRef<str>>(lines: impl IntoIterator<Item = S>) -> String {
    lines
        .into_iter()
        .filter_map(|line| {
            let text = line.as_ref().strip_prefix("chunk ")?;
            Some(serde_json::from_str::<String>(text).expect("a chunk line holds a JSON string"))
        })
        .collect()
}

/// `create`: killed after the second reply was journaled (the lookup ran, the email not
/// yet asked for by the run): the re-run from the top replays both replies and the
/// lookup's result, asks only the third question, and sends the email once.
async fn wrapped_killed_after_a_reply_the_rerun_asks_nothing_twice() {
    let world = World::new(false).await;
    world.kill_at("after_model:2").await;
    assert_eq!(world.stub.requests().len(), 2);
    assert_eq!(world.count("lookup").await, 1);

    let (status, stdout, stderr) = world.run().await;
    world.assert_done_once(status, &stdout, &stderr).await;
    assert_eq!(
        (world.asked(0), world.asked(1), world.asked(2)),
        (1, 1, 1),
        "each question asked once, across the crash"
    );
}

/// `create_stream`: killed after the first chunk of the last reply reached the UI, before
/// it was journaled: the re-run replays the first two replies (as streams) and asks the
/// last one again; no tool runs twice.
async fn wrapped_streamed_killed_mid_stream_the_rerun_asks_that_reply_again() {
    let world = World::new(true).await;
    let live = world.kill_at("mid_stream:3").await;
    assert!(!shown(&live).is_empty(), "part of the reply was shown");
    assert_eq!(world.model_rows().await.len(), 2, "no half-recorded reply");
    assert!(world.stub.requests().iter().all(|r| r["stream"] == true));

    let (status, stdout, stderr) = world.run().await;
    world.assert_done_once(status, &stdout, &stderr).await;
    assert_eq!((world.asked(0), world.asked(1)), (1, 1));
    assert_eq!(world.asked(2), 2, "the cut reply was asked again");
    assert_eq!(shown(stdout.lines()), ANSWER);
}

/// `create_stream`: killed after the last reply was journaled: the re-run asks nothing,
/// runs no tool, and shows the same text, replayed as a stream.
async fn wrapped_streamed_killed_after_the_stream_the_rerun_replays_it_as_a_stream() {
    let world = World::new(true).await;
    let live = world.kill_at("after_model:3").await;
    assert_eq!(shown(&live), ANSWER);
    assert!(
        live.iter().filter(|l| l.starts_with("chunk ")).count() > 1,
        "live, the text came in pieces: {live:?}"
    );
    assert_eq!(world.model_rows().await.len(), 3);

    let (status, stdout, stderr) = world.run().await;
    world.assert_done_once(status, &stdout, &stderr).await;
    assert_eq!(world.stub.requests().len(), 3, "nothing asked again");
    assert_eq!(
        shown(stdout.lines()),
        shown(&live),
        "the UI shows the same reply"
    );
}
