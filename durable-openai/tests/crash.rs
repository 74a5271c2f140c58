//! The async-openai agent (`examples/openai_agent/agent.rs`) killed with SIGKILL at exact
//! points and resumed in a new process, against the stub in this process; its tools'
//! effects go to a ledger, a SQLite file of its own beside the store.
//!
//! `harness = false`: this binary is also the child. With `DURABLE_OPENAI_CHILD` set it
//! runs the agent once (flags in environment variables) and exits; otherwise it runs the
//! cases below, each spawning itself as the agent. The kill is exact: the child prints
//! `paused at <point>` there and waits, and the parent kills it on that line.
//!
//! What each case relies on, and what was checked to make it fail:
//! - a recorded model reply is not asked again (the model call made without
//!   `model_with_spend` → the first question is asked twice);
//! - an email in doubt is refused without its verify hook and verified with it, never
//!   sent twice (the email declared `pure` → resumed, it is sent again);
//! - duplicate keys in the model's argument text are an error result the model reads,
//!   nothing journaled, nothing sent (arguments parsed into a `Value` first → the email
//!   goes out to the last `to`);
//! - the recorded spend counts each model reply once across a crash (checked against
//!   a journal that charges a replayed reply again);
//! - an empty response (`choices: []`) recorded before a crash does not block the
//!   session: the resumed turn replays it and asks again (the agent stopping on the
//!   first empty response → the resumed run replays it and fails every time).

use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use durable::SessionId;
use durable_openai_stub::{Reply, Script, Stub};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

#[path = "../examples/openai_agent/agent.rs"]
#[allow(dead_code, reason = "the example's module; the test uses part of it")]
mod agent;

const CHILD: &str = "DURABLE_OPENAI_CHILD";
const SESSION: &str = "order-o-17";
const LIMIT: Duration = Duration::from_secs(120);

/// One case: an async fn of the parent.
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
    let cases: [(&str, Case); 8] = [
        (
            "streamed_killed_mid_stream_the_resumed_run_asks_again",
            || Box::pin(streamed_killed_mid_stream_the_resumed_run_asks_again()),
        ),
        (
            "streamed_killed_after_the_reply_the_resumed_run_replays_it_as_a_stream",
            || Box::pin(streamed_killed_after_the_reply_the_resumed_run_replays_it_as_a_stream()),
        ),
        (
            "killed_after_the_first_model_reply_the_resumed_run_does_not_ask_again",
            || Box::pin(killed_after_the_first_model_reply_the_resumed_run_does_not_ask_again()),
        ),
        (
            "killed_after_the_email_left_it_is_refused_then_verified_never_sent_twice",
            || Box::pin(killed_after_the_email_left_it_is_refused_then_verified_never_sent_twice()),
        ),
        (
            "killed_before_the_checkpoint_the_turn_reruns_and_spend_is_counted_once",
            || Box::pin(killed_before_the_checkpoint_the_turn_reruns_and_spend_is_counted_once()),
        ),
        (
            "an_empty_response_recorded_before_a_crash_is_asked_again_on_resume",
            || Box::pin(an_empty_response_recorded_before_a_crash_is_asked_again_on_resume()),
        ),
        (
            "a_model_that_never_stops_asking_for_tools_hits_the_turn_cap",
            || Box::pin(a_model_that_never_stops_asking_for_tools_hits_the_turn_cap()),
        ),
        (
            "duplicate_keys_are_an_error_result_the_model_reads_and_nothing_is_journaled",
            || {
                Box::pin(
                    duplicate_keys_are_an_error_result_the_model_reads_and_nothing_is_journaled(),
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

/// The child: one run of the agent, configured by the parent's environment.
fn child() -> i32 {
    let var = |name: &str| std::env::var(name).ok();
    let (Some(store), Some(ledger), Some(base_url)) = (
        var("DURABLE_OPENAI_STORE"),
        var("DURABLE_OPENAI_LEDGER"),
        var("DURABLE_OPENAI_BASE_URL"),
    ) else {
        eprintln!("the child needs DURABLE_OPENAI_STORE, _LEDGER and _BASE_URL");
        return 2;
    };
    let options = agent::Options {
        store: PathBuf::from(store),
        ledger: PathBuf::from(ledger),
        session: SESSION.into(),
        base_url,
        model: "stub-model".into(),
        pause_at: var("DURABLE_OPENAI_PAUSE_AT"),
        verify: var("DURABLE_OPENAI_NO_VERIFY").is_none(),
        stream: var("DURABLE_OPENAI_STREAM").is_some(),
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
        Ok(turns) => {
            println!("done after {turns} turn(s)");
            0
        }
        Err(e) if agent::is_in_doubt(&*e) => {
            eprintln!("in doubt: {e}");
            3
        }
        Err(e) => {
            eprintln!("error: {e}");
            1
        }
    }
}

// ---------------------------------------------------------------------------------------
// The parent.

/// A stub, a store and a ledger in a temporary directory.
struct World {
    dir: tempfile::TempDir,
    stub: Stub,
    /// Whether the agent streams its replies.
    stream: bool,
}

impl World {
    async fn new(script: Script) -> Self {
        World {
            dir: tempfile::tempdir().expect("tempdir"),
            stub: Stub::start(script).await.expect("stub"),
            stream: false,
        }
    }

    /// The same, with an agent that streams its replies (`create_stream`).
    async fn streaming(script: Script) -> Self {
        World {
            stream: true,
            ..World::new(script).await
        }
    }

    fn store(&self) -> PathBuf {
        self.dir.path().join("agent.db")
    }

    fn ledger(&self) -> PathBuf {
        self.dir.path().join("ledger.db")
    }

    fn spawn(&self, pause_at: Option<&str>, verify: bool) -> Child {
        let mut cmd = Command::new(std::env::current_exe().expect("current exe"));
        cmd.env(CHILD, "1")
            .env("DURABLE_OPENAI_STORE", self.store())
            .env("DURABLE_OPENAI_LEDGER", self.ledger())
            .env("DURABLE_OPENAI_BASE_URL", self.stub.base_url())
            .env_remove("DURABLE_OPENAI_PAUSE_AT")
            .env_remove("DURABLE_OPENAI_NO_VERIFY")
            .env_remove("DURABLE_OPENAI_STREAM")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if let Some(point) = pause_at {
            cmd.env("DURABLE_OPENAI_PAUSE_AT", point);
        }
        if !verify {
            cmd.env("DURABLE_OPENAI_NO_VERIFY", "1");
        }
        if self.stream {
            cmd.env("DURABLE_OPENAI_STREAM", "1");
        }
        cmd.spawn().expect("spawn the agent")
    }

    /// Runs the agent until it prints `paused at <point>`, then SIGKILLs it. Returns
    /// what it printed before.
    async fn kill_at(&self, point: &str) -> Vec<String> {
        let mut child = self.spawn(Some(point), true);
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

    /// Runs the agent to its end; returns its status and stderr.
    async fn run(&self, verify: bool) -> (ExitStatus, String) {
        let (status, _, stderr) = self.run_printing(verify).await;
        (status, stderr)
    }

    /// Runs the agent to its end; returns its status, stdout and stderr.
    async fn run_printing(&self, verify: bool) -> (ExitStatus, String, String) {
        let child = self.spawn(None, verify);
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

    /// The ledger's rows: `(kind, call id, detail)`.
    async fn effects(&self) -> Vec<(String, String, String)> {
        let pool = agent::open_ledger(&self.ledger()).await.expect("ledger");
        sqlx::query_as("SELECT kind, call_id, detail FROM effects ORDER BY id")
            .fetch_all(&pool)
            .await
            .expect("read the ledger")
    }

    /// The session's recorded budget (its latest checkpoint).
    async fn budget(&self) -> durable::Budget {
        let store = durable::connect(&format!("sqlite:{}", self.store().display()))
            .await
            .expect("store");
        let checkpoint = store
            .load_checkpoint(&SessionId::new(SESSION), None)
            .await
            .expect("checkpoint");
        serde_json::from_value(checkpoint.budget).expect("a budget")
    }

    /// The model replies in the journal.
    async fn model_rows(&self) -> usize {
        let store = durable::connect(&format!("sqlite:{}", self.store().display()))
            .await
            .expect("store");
        let rows = store
            .calls(&SessionId::new(SESSION), None)
            .await
            .expect("journal");
        rows.iter()
            .filter(|r| r.identity.tool == durable::runtime::MODEL_SLOT)
            .count()
    }

    async fn count(&self, kind: &str) -> usize {
        self.effects()
            .await
            .iter()
            .filter(|(k, _, _)| k == kind)
            .count()
    }

    /// How often the model was asked the question that `assistant` earlier replies
    /// precede.
    fn asked(&self, assistant: usize) -> usize {
        self.stub
            .requests()
            .iter()
            .filter(|r| assistant_messages(r) == assistant)
            .count()
    }
}

/// The text a UI showed: the `chunk "<text>"` lines the agent printed, concatenated.
fn shown<S: AsRef<str>>(lines: impl IntoIterator<Item = S>) -> String {
    lines
        .into_iter()
        .filter_map(|line| {
            let text = line.as_ref().strip_prefix("chunk ")?;
            Some(serde_json::from_str::<String>(text).expect("a chunk line holds a JSON string"))
        })
        .collect()
}

/// Killed after the first chunk of a streamed reply reached the UI, before the reply was
/// journaled: nothing is in the journal, the resumed run asks the model again (the
/// stub's log shows the second request), and nothing runs twice.
async fn streamed_killed_mid_stream_the_resumed_run_asks_again() {
    let world = World::streaming(shop_script()).await;
    world.kill_at("mid_stream").await;
    assert_eq!(world.stub.requests().len(), 1);
    assert_eq!(
        world.stub.requests()[0]["stream"],
        true,
        "the agent streamed"
    );
    assert_eq!(world.model_rows().await, 0, "no half-recorded reply");

    let (status, stdout, stderr) = world.run_printing(true).await;
    assert!(status.success(), "{status:?}\n{stderr}");
    assert_eq!(world.asked(0), 2, "the interrupted reply was asked again");
    assert_eq!((world.asked(1), world.asked(2)), (1, 1));
    assert_eq!(world.count("charge").await, 1);
    assert_eq!(world.count("email").await, 1);
    assert_eq!(world.model_rows().await, 3);
    assert_eq!(
        shown(stdout.lines()),
        "Charged o-17 and emailed ann@example.com."
    );
    // Usage came with the stream's last chunk: charged once per reply.
    let (prompt, completion) = durable_openai_stub::USAGE;
    assert_eq!(
        world.budget().await.total_tokens(),
        3 * (prompt + completion)
    );
}

/// Killed after a streamed reply was journaled: the resumed run replays it as a stream
/// (the UI shows the same text, from the journal) and the model is not asked again.
async fn streamed_killed_after_the_reply_the_resumed_run_replays_it_as_a_stream() {
    let world = World::streaming(Script::new([Reply::text(
        "Nothing to do: o-17 shipped already.",
    )]))
    .await;
    let live = world.kill_at("after_model").await;
    assert_eq!(world.model_rows().await, 1);
    let shown_live = shown(&live);
    assert_eq!(shown_live, "Nothing to do: o-17 shipped already.");
    assert!(
        live.iter().filter(|l| l.starts_with("chunk ")).count() > 1,
        "live, the text came in pieces: {live:?}"
    );

    let (status, stdout, stderr) = world.run_printing(true).await;
    assert!(status.success(), "{status:?}\n{stderr}");
    assert_eq!(world.asked(0), 1, "the recorded reply was not asked again");
    assert_eq!(
        shown(stdout.lines()),
        shown_live,
        "the UI shows the same reply"
    );
}

fn assistant_messages(request: &Value) -> usize {
    request["messages"]
        .as_array()
        .map_or(0, |m| m.iter().filter(|m| m["role"] == "assistant").count())
}

/// The content of the tool message answering `call_id` in a request.
fn tool_answer(request: &Value, call_id: &str) -> String {
    request["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["role"] == "tool" && m["tool_call_id"] == call_id)
        .and_then(|m| m["content"].as_str())
        .unwrap_or_else(|| panic!("no tool message for `{call_id}` in {request}"))
        .to_owned()
}

fn shop_script() -> Script {
    Script::new([
        Reply::tool_calls([("call_1", "lookup", r#"{"sku":"A-1"}"#)]),
        Reply::tool_calls([
            ("call_2", "charge", r#"{"order_id":"o-17","cents":1200}"#),
            (
                "call_3",
                "send_email",
                r#"{"to":"ann@example.com","body":"Your A-1 is on its way."}"#,
            ),
        ]),
        Reply::text("Charged o-17 and emailed ann@example.com."),
    ])
}

async fn killed_after_the_first_model_reply_the_resumed_run_does_not_ask_again() {
    let world = World::new(shop_script()).await;
    world.kill_at("after_model").await;
    assert_eq!(world.stub.requests().len(), 1, "killed after one answer");

    let (status, stderr) = world.run(true).await;
    assert!(status.success(), "{status:?}\n{stderr}");
    // The first reply was journaled before the kill: the resumed turn replays it.
    assert_eq!(world.asked(0), 1, "the first question was asked again");
    assert_eq!((world.asked(1), world.asked(2)), (1, 1));
    assert_eq!(world.count("charge").await, 1);
    assert_eq!(world.count("email").await, 1);
    // The tools sent to the model: the free-`Value` tool is left out, the others are in.
    let names: Vec<_> = world.stub.requests()[0]["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .map(|t| t["function"]["name"].clone())
        .collect();
    assert_eq!(names, ["charge", "lookup", "send_email"]);
    // Three replies, each counted once: the replayed first one is not charged again.
    let (prompt, completion) = durable_openai_stub::USAGE;
    assert_eq!(
        world.budget().await.total_tokens(),
        3 * (prompt + completion)
    );
}

async fn killed_before_the_checkpoint_the_turn_reruns_and_spend_is_counted_once() {
    let world = World::new(shop_script()).await;
    world.kill_at("before_checkpoint").await;
    assert_eq!(world.stub.requests().len(), 1, "killed in the first turn");

    let (status, stderr) = world.run(true).await;
    assert!(status.success(), "{status:?}\n{stderr}");
    assert_eq!(
        (world.asked(0), world.asked(1), world.asked(2)),
        (1, 1, 1),
        "a recorded reply was asked again"
    );
    assert_eq!(world.count("charge").await, 1);
    assert_eq!(world.count("email").await, 1);
    assert_eq!(world.model_rows().await, 3);
    let (prompt, completion) = durable_openai_stub::USAGE;
    assert_eq!(
        world.budget().await.total_tokens(),
        3 * (prompt + completion),
        "a replayed reply was charged again"
    );
}

async fn an_empty_response_recorded_before_a_crash_is_asked_again_on_resume() {
    let mut replies = vec![Reply::empty_then(Reply::tool_calls([(
        "call_1",
        "lookup",
        r#"{"sku":"A-1"}"#,
    )]))];
    replies.push(Reply::text("A-1 is in stock."));
    let world = World::new(Script::new(replies)).await;
    // Killed right after the empty response was journaled.
    world.kill_at("after_model").await;
    assert_eq!(world.stub.requests().len(), 1);

    let (status, stderr) = world.run(true).await;
    assert!(status.success(), "{status:?}\n{stderr}");
    // The empty response is replayed, the turn asks again (a new journal position).
    assert_eq!((world.asked(0), world.asked(1)), (2, 1));
    assert_eq!(world.model_rows().await, 3);
    let (prompt, completion) = durable_openai_stub::USAGE;
    assert_eq!(
        world.budget().await.total_tokens(),
        3 * (prompt + completion)
    );
}

async fn killed_after_the_email_left_it_is_refused_then_verified_never_sent_twice() {
    let world = World::new(shop_script()).await;
    world.kill_at("after_email_effect").await;
    assert_eq!(
        world.count("email").await,
        1,
        "the email left before the kill"
    );
    assert_eq!(world.stub.requests().len(), 2);

    // Without its verify hook the email is in doubt: refused, not sent again.
    let (status, stderr) = world.run(false).await;
    assert_eq!(status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("replay unsafe"), "{stderr}");
    assert!(stderr.contains("send_email"), "{stderr}");
    assert_eq!(
        world.count("email").await,
        1,
        "an email in doubt was re-sent"
    );

    // With it, the hook finds the email in the mail server's log: its result is
    // recorded and returned to the model, and the email is not sent again.
    let (status, stderr) = world.run(true).await;
    assert!(status.success(), "{status:?}\n{stderr}");
    let effects = world.effects().await;
    let emails: Vec<_> = effects.iter().filter(|(k, _, _)| k == "email").collect();
    assert_eq!(emails.len(), 1, "the email was sent twice: {effects:?}");
    assert_eq!(world.count("charge").await, 1);
    let requests = world.stub.requests();
    assert_eq!(
        (world.asked(0), world.asked(1), world.asked(2)),
        (1, 1, 1),
        "a recorded reply was asked again"
    );
    let answer = tool_answer(&requests[2], "call_3");
    assert!(
        answer.contains("@ledger>"),
        "the verified receipt: {answer}"
    );
}

async fn duplicate_keys_are_an_error_result_the_model_reads_and_nothing_is_journaled() {
    let world = World::new(Script::new([
        Reply::tool_calls([(
            "call_1",
            "send_email",
            r#"{"to":"ann@example.com","to":"mallory@example.com","body":"hi"}"#,
        )]),
        Reply::text("I will send each key once."),
    ]))
    .await;
    let (status, stderr) = world.run(true).await;
    assert!(status.success(), "{status:?}\n{stderr}");

    let requests = world.stub.requests();
    assert_eq!(requests.len(), 2);
    let answer = tool_answer(&requests[1], "call_1");
    assert!(
        answer.contains("`to` appears more than once"),
        "the model reads why: {answer}"
    );
    assert_eq!(world.count("email").await, 0, "an email went out");

    // Only the two model replies are in the journal: the refused call left no row.
    let store = durable::connect(&format!("sqlite:{}", world.store().display()))
        .await
        .expect("store");
    let rows = store
        .calls(&SessionId::new(SESSION), None)
        .await
        .expect("journal");
    let tools: Vec<_> = rows.iter().map(|r| r.identity.tool.as_str()).collect();
    assert_eq!(tools, [durable::runtime::MODEL_SLOT; 2]);
}

async fn a_model_that_never_stops_asking_for_tools_hits_the_turn_cap() {
    let lookups =
        (0..=agent::MAX_TURNS).map(|_| Reply::tool_calls([("call", "lookup", r#"{"sku":"A-1"}"#)]));
    let world = World::new(Script::new(lookups)).await;
    let (status, stderr) = world.run(true).await;
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("after {} turns", agent::MAX_TURNS)),
        "{stderr}"
    );
    assert_eq!(world.stub.requests().len(), agent::MAX_TURNS);
}
