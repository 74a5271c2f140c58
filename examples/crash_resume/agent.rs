//! The agent process: one worker run of the session, configured by environment
//! variables, so that a parent (the demo, the torture suite) can start it, kill it with
//! SIGKILL at a journal boundary or at any instant, and start it again.
//!
//! A run resumes the session if it exists (or starts it), then plays the harness loop:
//! ask the model (journaled), apply plan tools to the plan, dispatch the other tool calls
//! through the [`Toolbox`](durable::Toolbox) (journaled), checkpoint after every turn
//! that ran journaled tools, refuse a final answer while the plan is open, complete.
//!
//! What it tells the parent goes to stdout: narration for a person, and lines starting
//! with `@@ ` for a program (`crash`, `resumed`, `in_doubt`, `event`, `replay_unsafe`,
//! `result`, `hits`, `done`).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use durable::store::SessionStatus;
use durable::{
    Budget, Durable, DurableError, Message, ModelToolCall, ReplayClass, Role, SessionId,
    StartOptions, StoreError, ToolResult, approval,
};
use serde_json::json;

use super::model::{Script, ScriptedModel};
use super::narrate::{Narrator, summarize_plan_notes};
use super::points::{CrashPoint, crash_points};
use super::tools::{self, apply_plan_tool, gate_message, is_plan_tool};
use super::ui::Style;
use super::world;

/// The worker name every run uses: a restarted worker takes its own lease back.
pub const OWNER: &str = "worker-1";
/// The application version sessions are started on.
pub const APP_VERSION: &str = "crash-resume/1";

/// Exit code: the session completed (or a replay-only run finished).
pub const EXIT_DONE: i32 = 0;
/// Exit code: an in-doubt unsafe call needs an operator; the lease was released.
pub const EXIT_OPERATOR: i32 = 3;
/// Exit code: an in-doubt unsafe call needs an operator; the session was parked.
pub const EXIT_PARKED: i32 = 4;
/// Exit code: calls await a person's approval; the session is parked as
/// `awaiting_approval` (no lease held).
pub const EXIT_AWAITING: i32 = 5;

const SYSTEM: &str = "You are an order assistant. Plan with plan_create, record progress with \
step_update (evidence required), verify every postcondition before you finish.";

/// What a run does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Run the session to its end.
    Run,
    /// Re-run the current turn from the journal, print its results, stop without
    /// checkpointing.
    ReplayTurn,
    /// Like `Run`, but a model re-asked for the turn that holds an in-doubt unsafe call
    /// changes its mind (other arguments; with `true`, a second unsafe tool too).
    Rethink(bool),
}

/// What a run does when an in-doubt unsafe call needs an operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnUnsafe {
    /// Release the lease (a later run continues once the operator resolved the call).
    Release,
    /// Park the session for an operator.
    Park,
}

/// How a child run is configured (the environment protocol between parent and child).
#[derive(Debug, Clone)]
pub struct Options {
    /// Database: a SQLite path or URL, or a Postgres URL.
    pub db: String,
    /// The world's directory.
    pub world: PathBuf,
    /// The session id.
    pub session: String,
    /// The conversation.
    pub script: Script,
    /// Whether `send_email` has its verify hook.
    pub verify: bool,
    /// What the run does.
    pub mode: Mode,
    /// What to do with an in-doubt unsafe call.
    pub on_unsafe: OnUnsafe,
    /// Where to freeze and wait for SIGKILL.
    pub crash_at: Option<CrashPoint>,
    /// Freeze and wait for SIGKILL right after the n-th journal event (`@@ event`).
    pub freeze_after_events: Option<usize>,
    /// Count the hits of every crash point and print them at the end.
    pub count_hits: bool,
    /// Recoveries (takeovers of a lease never released) before the session is parked as
    /// a poison pill.
    pub max_recoveries: i32,
    /// Narrate for a person.
    pub narrate: bool,
    /// Colour the narration.
    pub color: bool,
    /// Tools whose every call needs a person's approval (the runtime's approval policy).
    pub approval: Vec<String>,
}

const ENV_CHILD: &str = "DURABLE_AGENT_CHILD";

/// Whether this process is a child run.
pub fn is_child() -> bool {
    std::env::var_os(ENV_CHILD).is_some()
}

impl Options {
    /// Defaults for a run of `script` on `db` with the world in `world`.
    pub fn new(
        db: impl Into<String>,
        world: PathBuf,
        session: impl Into<String>,
        script: Script,
    ) -> Self {
        Options {
            db: db.into(),
            world,
            session: session.into(),
            script,
            verify: false,
            mode: Mode::Run,
            on_unsafe: OnUnsafe::Release,
            crash_at: None,
            freeze_after_events: None,
            count_hits: false,
            max_recoveries: 5,
            narrate: false,
            color: false,
            approval: Vec::new(),
        }
    }

    /// A command that runs `exe` as a child with these options, stdout piped.
    pub fn command(&self, exe: &std::path::Path) -> Command {
        let mut cmd = Command::new(exe);
        let flag = |b: bool| if b { "1" } else { "0" };
        cmd.env(ENV_CHILD, "1")
            .env("DURABLE_AGENT_DB", &self.db)
            .env("DURABLE_AGENT_WORLD", &self.world)
            .env("DURABLE_AGENT_SESSION", &self.session)
            .env("DURABLE_AGENT_SCRIPT", self.script.name())
            .env("DURABLE_AGENT_VERIFY", flag(self.verify))
            .env(
                "DURABLE_AGENT_MODE",
                match self.mode {
                    Mode::Run => "run",
                    Mode::ReplayTurn => "replay-turn",
                    Mode::Rethink(false) => "rethink",
                    Mode::Rethink(true) => "rethink-other",
                },
            )
            .env(
                "DURABLE_AGENT_ON_UNSAFE",
                match self.on_unsafe {
                    OnUnsafe::Release => "release",
                    OnUnsafe::Park => "park",
                },
            )
            .env("DURABLE_AGENT_COUNT_HITS", flag(self.count_hits))
            .env(
                "DURABLE_AGENT_MAX_RECOVERIES",
                self.max_recoveries.to_string(),
            )
            .env("DURABLE_AGENT_NARRATE", flag(self.narrate))
            .env("DURABLE_AGENT_COLOR", flag(self.color))
            .env("DURABLE_AGENT_APPROVAL", self.approval.join(","))
            .env_remove("DURABLE_AGENT_CRASH_AT")
            .env_remove("DURABLE_AGENT_FREEZE_AFTER_EVENTS")
            .stdin(Stdio::null())
            .stdout(Stdio::piped());
        if let Some(point) = &self.crash_at {
            cmd.env("DURABLE_AGENT_CRASH_AT", point.short());
        }
        if let Some(n) = self.freeze_after_events {
            cmd.env("DURABLE_AGENT_FREEZE_AFTER_EVENTS", n.to_string());
        }
        cmd
    }

    fn from_env() -> Result<Self, String> {
        let var = |name: &str| std::env::var(name).map_err(|_| format!("{name} is not set"));
        let on = |name: &str| std::env::var(name).is_ok_and(|v| v == "1");
        let script = var("DURABLE_AGENT_SCRIPT")?;
        Ok(Options {
            db: var("DURABLE_AGENT_DB")?,
            world: PathBuf::from(var("DURABLE_AGENT_WORLD")?),
            session: var("DURABLE_AGENT_SESSION")?,
            script: Script::parse(&script).ok_or_else(|| format!("unknown script `{script}`"))?,
            verify: on("DURABLE_AGENT_VERIFY"),
            mode: match var("DURABLE_AGENT_MODE")?.as_str() {
                "run" => Mode::Run,
                "replay-turn" => Mode::ReplayTurn,
                "rethink" => Mode::Rethink(false),
                "rethink-other" => Mode::Rethink(true),
                other => return Err(format!("unknown mode `{other}`")),
            },
            on_unsafe: match var("DURABLE_AGENT_ON_UNSAFE")?.as_str() {
                "park" => OnUnsafe::Park,
                _ => OnUnsafe::Release,
            },
            crash_at: std::env::var("DURABLE_AGENT_CRASH_AT")
                .ok()
                .map(|p| CrashPoint::parse(&p))
                .transpose()?,
            freeze_after_events: std::env::var("DURABLE_AGENT_FREEZE_AFTER_EVENTS")
                .ok()
                .map(|n| {
                    n.parse()
                        .map_err(|_| format!("DURABLE_AGENT_FREEZE_AFTER_EVENTS = `{n}`"))
                })
                .transpose()?,
            count_hits: on("DURABLE_AGENT_COUNT_HITS"),
            max_recoveries: match std::env::var("DURABLE_AGENT_MAX_RECOVERIES") {
                Ok(n) => n
                    .parse()
                    .map_err(|_| format!("DURABLE_AGENT_MAX_RECOVERIES = `{n}`"))?,
                Err(_) => 5,
            },
            narrate: on("DURABLE_AGENT_NARRATE"),
            color: on("DURABLE_AGENT_COLOR"),
            approval: std::env::var("DURABLE_AGENT_APPROVAL")
                .unwrap_or_default()
                .split(',')
                .filter(|t| !t.is_empty())
                .map(str::to_owned)
                .collect(),
        })
    }
}

/// Prints a line and flushes it (the parent may kill this process at any moment).
pub fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Stops this process where it stands until the parent's SIGKILL arrives.
fn freeze() -> ! {
    // A parent that died cannot kill us: give up after a while.
    std::thread::sleep(Duration::from_secs(30));
    std::process::abort();
}

type Hits = Arc<Mutex<BTreeMap<String, Arc<AtomicUsize>>>>;

fn install_failpoints(options: &Options) -> Hits {
    let hits: Hits = Arc::default();
    if let Some(point) = options.crash_at.clone() {
        let seen = AtomicUsize::new(0);
        let short = point.short();
        let nth = point.nth;
        let name = point.failpoint.clone();
        let installed = fail::cfg_callback(name, move || {
            if seen.fetch_add(1, Ordering::SeqCst) + 1 == nth {
                say(&format!("@@ crash {short}"));
                freeze();
            }
        });
        if let Err(e) = installed {
            say(&format!("@@ error cannot set failpoint: {e}"));
        }
    } else if options.count_hits {
        let mut names: Vec<String> = crash_points(options.script)
            .into_iter()
            .map(|p| p.point.failpoint)
            .collect();
        names.dedup();
        for name in names {
            let counter = Arc::new(AtomicUsize::new(0));
            if let Ok(mut map) = hits.lock() {
                map.insert(name.clone(), Arc::clone(&counter));
            }
            let _ = fail::cfg_callback(name, move || {
                counter.fetch_add(1, Ordering::SeqCst);
            });
        }
    }
    hits
}

/// The child's `main`: runs the agent per the environment and returns the exit code.
pub fn child_main() -> i32 {
    let options = match Options::from_env() {
        Ok(options) => options,
        Err(e) => {
            eprintln!("agent: {e}");
            return 2;
        }
    };
    world::install(options.world.clone());
    let hits = install_failpoints(&options);
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("agent: cannot start a runtime: {e}");
            return 2;
        }
    };
    let code = runtime.block_on(run(&options)).unwrap_or_else(|e| {
        eprintln!("agent: {e}");
        say(&format!("@@ error {e}"));
        1
    });
    if let Ok(map) = hits.lock() {
        for (name, n) in map.iter() {
            say(&format!("@@ hits {name} {}", n.load(Ordering::SeqCst)));
        }
    }
    code
}

type Error = Box<dyn std::error::Error>;

async fn run(options: &Options) -> Result<i32, Error> {
    let store = durable::connect(&options.db).await?;
    let narrator = Narrator {
        on: options.narrate,
        style: Style::new(options.color),
        last_model: Arc::default(),
    };
    let s = narrator.style;
    let observer = narrator.clone();
    let freeze_after = options.freeze_after_events;
    let events = AtomicUsize::new(0);
    let needs_approval = options.approval.clone();
    let durable = Durable::builder(Arc::clone(&store))
        .owner(OWNER)
        .max_recovery_attempts(options.max_recoveries)
        .app_version(APP_VERSION)
        .approval_policy(move |tool, _args| {
            needs_approval
                .contains(&tool.name)
                .then(|| approval::request(format!("policy: {} needs a person", tool.name)))
        })
        .on_call(move |e| {
            observer.event(e);
            let n = events.fetch_add(1, Ordering::SeqCst) + 1;
            if freeze_after == Some(n) {
                say(&format!("@@ crash event#{n}"));
                freeze();
            }
        })
        .build();
    let id = SessionId::new(options.session.as_str());
    let toolbox = tools::toolbox(options.verify)?;
    let model = ScriptedModel::new(options.script);

    let (mut session, in_doubt) = match store.session(&id).await {
        Ok(record) if record.status == SessionStatus::Completed => {
            say("@@ done completed");
            return Ok(EXIT_DONE);
        }
        Ok(record) if record.status == SessionStatus::Parked => {
            say("@@ done parked");
            return Ok(EXIT_PARKED);
        }
        Ok(record) if record.status == SessionStatus::AwaitingApproval => {
            narrator.line(
                "session",
                "",
                s.yellow("still awaiting a person's approval"),
            );
            say("@@ done awaiting");
            return Ok(EXIT_AWAITING);
        }
        Ok(record) if record.status.is_terminal() => {
            return Err(format!("session {id} is {}", record.status.as_str()).into());
        }
        Ok(_) => {
            let resumed = durable.resume::<Message>(&id).await?;
            say(&format!("@@ resumed {}", resumed.report.version));
            let mut doubts = Vec::new();
            for doubt in &resumed.report.in_doubt {
                let c = &doubt.call;
                say(&format!(
                    "@@ in_doubt {} {} {}",
                    c.identity.tool,
                    c.class.as_str(),
                    c.id.as_str()
                ));
                doubts.push(format!("{} ({})", c.identity.tool, c.class.as_str()));
            }
            let doubt_text = if doubts.is_empty() {
                "nothing in doubt".to_owned()
            } else {
                s.yellow(&format!("in doubt: {}", doubts.join(", ")))
            };
            narrator.line(
                "resume",
                "",
                format!("from checkpoint {} · {doubt_text}", resumed.report.version),
            );
            let unsafe_tools = resumed
                .report
                .by_class(ReplayClass::UnsafeOnReplay)
                .map(|d| d.call.identity.tool.clone())
                .collect::<Vec<_>>();
            (resumed.session, unsafe_tools)
        }
        Err(StoreError::SessionNotFound(_)) => {
            let session = durable
                .start(
                    StartOptions::new()
                        .with_id(id.clone())
                        .with_messages(vec![Message::system(SYSTEM), options.script.task()])
                        .with_budget(Budget::unlimited().with_limit_nano_usd(1_000_000_000))
                        .with_metadata(json!({"world": options.world})),
                )
                .await?;
            say(&format!("@@ started {id}"));
            (session, Vec::new())
        }
        Err(e) => return Err(e.into()),
    };
    let definitions = toolbox.anthropic_tools().all()?;

    loop {
        // A crash after the last checkpoint but before the status was written: the
        // final answer is already in the transcript.
        if session
            .messages()
            .last()
            .is_some_and(|m| m.role == Role::Assistant && !m.has_tool_calls())
        {
            break;
        }
        let transcript = session.messages().to_vec();
        let reply = session
            .model_with_spend(
                || async { model.respond(&transcript, &definitions) },
                |r| Some(r.spend()),
            )
            .await
            .map_err(|e| format!("model: {e}"))?;
        let mut message = reply.message;
        narrator.model(&message);
        let mut calls = ModelToolCall::from_message(&message);

        if let Mode::Rethink(other) = options.mode
            && let Some(tool) = calls
                .iter()
                .find(|c| in_doubt.contains(&c.name))
                .map(|c| c.name.clone())
        {
            message = model.rethink(&tool, other);
            calls = ModelToolCall::from_message(&message);
            let names: Vec<&str> = calls.iter().map(|c| c.name.as_str()).collect();
            say(&format!("@@ rethink {}", names.join(",")));
            narrator.line(
                "model",
                "",
                s.yellow(&format!("re-asked, changed its mind: {}", names.join(", "))),
            );
        }
        session.push(message);

        if calls.is_empty() {
            let plan = session.plan();
            if plan.is_ready_to_finalize() {
                narrator.line(
                    "finalize",
                    "",
                    s.green("accepted: every step done, every postcondition verified"),
                );
                break;
            }
            let steps = plan
                .steps
                .iter()
                .filter(|st| !st.status.is_terminal())
                .count();
            let postconditions = plan.postconditions.iter().filter(|p| !p.satisfied).count();
            narrator.line(
                "finalize",
                "",
                s.yellow(&format!(
                    "refused by the plan gate: {} open, {} unverified; the model is told which",
                    plural(steps, "step"),
                    plural(postconditions, "postcondition")
                )),
            );
            let text = gate_message(plan);
            session.push(Message::user(text));
            continue;
        }

        // Plan tools act on the session's plan; the others go through the journal.
        let mut results: Vec<Option<ToolResult>> = vec![None; calls.len()];
        let mut plan_notes = Vec::new();
        for (i, call) in calls
            .iter()
            .enumerate()
            .filter(|(_, c)| is_plan_tool(&c.name))
        {
            let args = match &call.arguments {
                durable::ToolArguments::Json(v) => v.clone(),
                durable::ToolArguments::Text(t) => serde_json::from_str(t).unwrap_or_default(),
            };
            let (result, note) = apply_plan_tool(session.plan_mut(), &call.id, &call.name, &args);
            results[i] = Some(result);
            plan_notes.push(note);
        }
        let journaled: Vec<(usize, ModelToolCall)> = calls
            .iter()
            .enumerate()
            .filter(|(_, c)| !is_plan_tool(&c.name))
            .map(|(i, c)| (i, c.clone()))
            .collect();
        let batch: Vec<ModelToolCall> = journaled.iter().map(|(_, c)| c.clone()).collect();
        // The model's text explains its calls: journaled with any approval request.
        let reasoning = session
            .messages()
            .last()
            .map(Message::text)
            .unwrap_or_default();
        let journal = session.journal().with_reasoning(reasoning);
        let outcomes = toolbox.dispatch_all(&journal, &batch).await;
        let mut refusal: Option<DurableError> = None;
        let mut awaiting = Vec::new();
        for ((i, call), outcome) in journaled.iter().zip(outcomes) {
            match outcome {
                Ok(result) => results[*i] = Some(result),
                Err(DurableError::AwaitingApproval {
                    call: row, tool, ..
                }) => {
                    // The observer narrated it (`approval_requested`).
                    say(&format!("@@ awaiting {tool} {}", row.as_str()));
                    awaiting.push(tool);
                }
                Err(e @ DurableError::ReplayUnsafe { .. }) => {
                    if let DurableError::ReplayUnsafe {
                        call: unresolved,
                        tool,
                        ..
                    } = &e
                    {
                        say(&format!(
                            "@@ replay_unsafe {} {tool} {}",
                            call.name,
                            unresolved.as_str()
                        ));
                    }
                    refusal.get_or_insert(e);
                }
                Err(e) => match ToolResult::refused(call, &e) {
                    Some(result) => results[*i] = Some(result),
                    None => return Err(e.into()),
                },
            }
        }
        if let Some(e) = refusal {
            return stop_for_operator(session, options, &narrator, e).await;
        }
        if !awaiting.is_empty() {
            // No checkpoint: once decided, the next run replays this turn.
            session.await_approval().await?;
            narrator.line(
                "session",
                "",
                s.yellow(&format!(
                    "parked: awaiting approval of {} (no worker held)",
                    awaiting.join(", ")
                )),
            );
            say("@@ done awaiting");
            return Ok(EXIT_AWAITING);
        }
        if !plan_notes.is_empty() {
            narrator.line("plan", "", s.dim(&summarize_plan_notes(&plan_notes)));
        }
        let results: Vec<ToolResult> = results.into_iter().flatten().collect();
        if options.mode == Mode::ReplayTurn {
            for r in &results {
                say(&format!(
                    "@@ result {} {}",
                    r.call_id,
                    serde_json::to_string(&r.output)?
                ));
            }
            session.release().await?;
            say("@@ done replayed");
            return Ok(EXIT_DONE);
        }
        session.push(ToolResult::message(&results));
        if !journaled.is_empty() {
            let meta = session.checkpoint().await?;
            narrator.line(
                "checkpoint",
                "",
                s.dim(&format!("{} written", meta.version)),
            );
        }
    }
    let meta = session.complete().await?;
    narrator.line(
        "checkpoint",
        "",
        s.dim(&format!("{} written", meta.version)),
    );
    narrator.line("session", "", s.green("completed"));
    say("@@ done completed");
    Ok(EXIT_DONE)
}

async fn stop_for_operator(
    session: durable::Session<Message>,
    options: &Options,
    narrator: &Narrator,
    error: DurableError,
) -> Result<i32, Error> {
    let s = narrator.style;
    match options.on_unsafe {
        OnUnsafe::Release => {
            session.release().await?;
            narrator.line(
                "session",
                "",
                s.red("stopped: an operator must say whether the call happened"),
            );
            say("@@ done operator");
            Ok(EXIT_OPERATOR)
        }
        OnUnsafe::Park => {
            session.park(&error.to_string()).await?;
            narrator.line("session", "", s.red("parked for an operator"));
            say("@@ done parked");
            Ok(EXIT_PARKED)
        }
    }
}

/// `1 step`, `2 steps`.
fn plural(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}
