//! Crash an agent mid-workflow, resume it in a new process, and watch the journal decide.
//!
//! ```text
//! cargo run --example crash_resume                      # killed after the email left
//! cargo run --example crash_resume -- --crash-at after_issued::send_email
//! cargo run --example crash_resume -- --no-verify      # the in-doubt email needs an operator
//! cargo run --example crash_resume -- --approval       # the charge waits for a person's approval
//! cargo run --example crash_resume -- --help            # every crash point
//! ```
//!
//! The agent runs a five-step workflow (read the order, plan, email the customer, charge
//! the card, commit the order) with `#[durable_tool]` tools dispatched by a `Toolbox`
//! and a scripted model called through the journal. This program starts the agent as a
//! child process (itself, re-executed), kills it with SIGKILL at the chosen journal
//! boundary, starts a new process that resumes the session and narrates one line per
//! call, and finally audits the outside world: the outbox, the payment receiver, the
//! order system, and the store.

#[path = "crash_resume/agent.rs"]
mod agent;
#[path = "crash_resume/model.rs"]
mod model;
#[path = "crash_resume/narrate.rs"]
mod narrate;
#[path = "crash_resume/points.rs"]
mod points;
#[path = "crash_resume/tools.rs"]
mod tools;
#[path = "crash_resume/ui.rs"]
mod ui;
#[path = "crash_resume/world.rs"]
mod world;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use clap::{CommandFactory, FromArgMatches, Parser};
use durable::store::{ApprovalEvent, CallKind, CallStatus, Resolution, SessionStatus};
use durable::{Budget, CheckpointStore, Durable, Message, Plan, Role, SessionId, Spend};

use agent::Options;
use model::Script;
use points::{CrashPoint, PointInfo};
use ui::Style;
use world::World;

/// Crash an agent mid-workflow, resume it in a new process, and watch the journal decide.
#[derive(Debug, Parser)]
#[command(name = "crash_resume")]
struct Args {
    /// Where to kill the first run (a journal boundary, listed below), or `none`.
    #[arg(long, value_name = "POINT", default_value = "after_effect::send_email")]
    crash_at: String,
    /// The database: a SQLite file path or `sqlite:` URL, or a `postgres://` URL (built
    /// with `--features postgres`). Default: a SQLite file in a new temporary directory.
    #[arg(long, value_name = "PATH_OR_URL")]
    db: Option<String>,
    /// Keep the temporary directory (database, outbox, receivers) and print its path.
    #[arg(long)]
    keep: bool,
    /// Build `send_email` without its verify hook: an email in doubt then needs an
    /// operator (this program plays one, checking the outbox).
    #[arg(long)]
    no_verify: bool,
    /// The charge needs a person's approval: the first run parks the session before
    /// charging, this program plays the operator (lists the request, approves it), and
    /// the next run charges once. Adds the crash points `before_request::charge_card` and
    /// `after_requested::charge_card`.
    #[arg(long)]
    approval: bool,
}

/// The tool whose calls need approval with `--approval`.
const APPROVED_TOOL: &str = "charge_card";

fn points_help() -> String {
    let script = Script::Demo;
    let mut text =
        String::from("Crash points (journal boundaries of the workflow, in run order):\n");
    for info in points::crash_points(script)
        .iter()
        .filter(|i| i.tool.is_some())
    {
        text.push_str(&format!("  {:<34} {}\n", info.point.short(), info.meaning));
    }
    let counted = [
        (
            "after_model_recorded",
            script.model_calls(),
            "model reply N is recorded; its tool calls have not run",
        ),
        (
            "before_checkpoint",
            script.checkpoints(),
            "checkpoint N is not written",
        ),
        (
            "after_checkpoint",
            script.checkpoints(),
            "checkpoint N is written (the last one by `complete`)",
        ),
    ];
    for (name, n, meaning) in counted {
        text.push_str(&format!(
            "  {:<34} {meaning}\n",
            format!("{name}#N (N = 1..{n})")
        ));
    }
    text.push_str("  none                               run to the end without a crash");
    text
}

fn main() -> ExitCode {
    if agent::is_child() {
        return match agent::child_main() {
            0 => ExitCode::SUCCESS,
            code => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        };
    }
    let command = Args::command().after_help(points_help());
    let args = match Args::from_arg_matches(&command.get_matches()) {
        Ok(args) => args,
        Err(e) => e.exit(),
    };
    match demo(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("crash_resume: {e}");
            ExitCode::FAILURE
        }
    }
}

type Error = Box<dyn std::error::Error>;

/// How one child run ended.
enum Ended {
    /// Killed at this crash point.
    Killed(String),
    /// Exited with this code.
    Exited(i32),
}

fn demo(args: &Args) -> Result<bool, Error> {
    let started = Instant::now();
    let style = Style::new(ui::color_wanted());
    let crash = match args.crash_at.as_str() {
        "none" => None,
        text => {
            let point = CrashPoint::parse(text)?;
            let mut known = points::crash_points(Script::Demo);
            if args.approval {
                known.extend(points::approval_points(APPROVED_TOOL));
            }
            let info = known
                .into_iter()
                .find(|i| i.point == point)
                .ok_or_else(|| {
                    format!("`{text}` is not a crash point of this workflow; `--help` lists them")
                })?;
            Some(info)
        }
    };
    let dir = tempfile::Builder::new().prefix("durable-demo-").tempdir()?;
    let db = match &args.db {
        Some(db) => db.clone(),
        None => format!("sqlite:{}", dir.path().join("agent.db").display()),
    };
    let world_dir = dir.path().join("world");
    let world = World::new(world_dir.clone());
    world.create()?;
    let millis = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let session = format!("order-o-1017-{millis}");

    println!("{}", style.bold("durable · crash and resume"));
    println!("  {:<10} {db}", "store");
    println!("  {:<10} {}", "world", world.dir().display());
    match &crash {
        Some(info) => {
            println!(
                "  {:<10} {} — {}",
                "crash at",
                style.red(&info.point.short()),
                info.meaning
            );
            if info.in_unsafe_window() {
                println!(
                    "  {:<10} {}",
                    "",
                    style.dim("(inside an unsafe call's window: the journal cannot know whether it happened)")
                );
            }
        }
        None => println!("  {:<10} none", "crash at"),
    }

    let mut options = Options::new(db.clone(), world_dir, session.clone(), Script::Demo);
    options.verify = !args.no_verify;
    options.narrate = true;
    options.color = style.color();
    options.crash_at = crash.as_ref().map(|i| i.point.clone());
    if args.approval {
        options.approval = vec![APPROVED_TOOL.to_owned()];
        println!(
            "  {:<10} {APPROVED_TOOL} needs a person's approval",
            "approval"
        );
    }

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let exe = std::env::current_exe()?;
    let mut completed = false;
    let mut runs = 0;
    for run in 1..=5 {
        runs = run;
        println!();
        let heading = if run == 1 {
            format!("run {run} · new session {session}")
        } else {
            format!("run {run} · a new process resumes the session")
        };
        match run_child(&exe, &options, style, &heading)? {
            Ended::Killed(point) => {
                let (tool, class) = crash
                    .as_ref()
                    .and_then(|i| i.tool)
                    .map_or(("", ""), |(tool, class)| (tool, class.as_str()));
                let meaning = crash
                    .as_ref()
                    .map_or(String::new(), |i: &PointInfo| i.meaning.clone());
                let text = style.red(&format!("✗ SIGKILL at {point}: {meaning}"));
                println!("{}", ui::row_styled(style, tool, class, text));
            }
            Ended::Exited(agent::EXIT_DONE) => {
                completed = true;
                break;
            }
            Ended::Exited(agent::EXIT_OPERATOR) => {
                println!();
                println!("{}", style.bold("operator"));
                runtime.block_on(operator(&db, &session, &world, style))?;
            }
            Ended::Exited(agent::EXIT_AWAITING) => {
                println!();
                println!("{}", style.bold("operator · approvals"));
                match cli(&exe) {
                    Some(cli) => approve_with_cli(&cli, &db, &session, style)?,
                    None => runtime.block_on(approver(&db, &session, style))?,
                }
            }
            Ended::Exited(code) => return Err(format!("the agent exited with code {code}").into()),
        }
        // Later runs never crash: the point of the demo is the resume.
        options.crash_at = None;
    }
    if !completed {
        return Err("the session did not complete in 5 runs".into());
    }
    let ok = runtime.block_on(audit(&db, &session, &world, style, args.approval))?;
    println!(
        "\n{}",
        style.dim(&format!(
            "{runs} agent process{}, {:.1} s",
            if runs == 1 { "" } else { "es" },
            started.elapsed().as_secs_f64()
        ))
    );
    if args.keep {
        let kept = dir.keep();
        println!("kept {}", kept.display());
    }
    Ok(ok)
}

/// Starts a child run, echoes its narration, kills it (SIGKILL) when it reports that it
/// reached the crash point.
fn run_child(exe: &Path, options: &Options, style: Style, heading: &str) -> Result<Ended, Error> {
    let mut child = options.command(exe).spawn()?;
    println!(
        "{}",
        style.bold(&format!("▶ {heading} · pid {}", child.id()))
    );
    let stdout = child.stdout.take().ok_or("child stdout missing")?;
    let mut killed = None;
    for line in BufReader::new(stdout).lines() {
        let line = line?;
        if let Some(point) = line.strip_prefix("@@ crash ") {
            child.kill()?;
            killed = Some(point.to_owned());
            break;
        }
        if !line.starts_with("@@ ") {
            println!("{line}");
        }
    }
    let status = child.wait()?;
    Ok(match killed {
        Some(point) => Ended::Killed(point),
        None => Ended::Exited(status.code().unwrap_or(-1)),
    })
}

/// What an operator does with an in-doubt unsafe call: look for it where its effect
/// would be, and record what was found.
async fn operator(db: &str, session: &str, world: &World, style: Style) -> Result<(), Error> {
    let store = durable::connect(db).await?;
    let durable = Durable::builder(store)
        .owner("operator")
        .app_version(agent::APP_VERSION)
        .build();
    for call in durable
        .operator()
        .in_doubt(Some(&SessionId::new(session)))
        .await?
    {
        let tool = call.identity.tool.clone();
        let Some(channel) = tools::channel_of(&tool) else {
            continue;
        };
        let found = world.delivery_for(channel, call.id.as_str())?;
        let (resolution, text) = match found {
            Some(delivery) => (
                Resolution::Happened {
                    result: delivery.result.clone(),
                },
                format!(
                    "found in the {channel} (delivery {}) → resolved as happened",
                    delivery.seq
                ),
            ),
            None => (
                Resolution::DidNotHappen,
                format!("not in the {channel} → resolved as did not happen"),
            ),
        };
        durable
            .operator()
            .resolve(&call.id, resolution, "operator", Some("checked the outbox"))
            .await?;
        println!(
            "{}",
            ui::row_styled(style, &tool, call.class.as_str(), style.yellow(&text))
        );
    }
    Ok(())
}

/// The `durable` command-line tool built beside this example (`target/<profile>/durable`,
/// from `cargo build -p durable-cli`), if there is one.
fn cli(exe: &Path) -> Option<std::path::PathBuf> {
    let dir = exe.parent()?.parent()?;
    let cli = dir.join(format!("durable{}", std::env::consts::EXE_SUFFIX));
    cli.is_file().then_some(cli)
}

/// What a person on call does with the parked session, through the CLI: `durable
/// approvals` lists what awaits approval, `durable approve` approves it with a note.
fn approve_with_cli(cli: &Path, db: &str, session: &str, style: Style) -> Result<(), Error> {
    let run = |args: &[&str]| -> Result<String, Error> {
        let shown: Vec<String> = args
            .iter()
            .map(|a| {
                if a.contains(' ') {
                    format!("'{a}'")
                } else {
                    (*a).to_owned()
                }
            })
            .collect();
        println!(
            "{}",
            style.dim(&format!("$ durable --db {db} {}", shown.join(" ")))
        );
        let out = std::process::Command::new(cli)
            .arg("--db")
            .arg(db)
            .args(args)
            .env("NO_COLOR", "1")
            .output()?;
        if !out.status.success() {
            return Err(format!(
                "durable {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            )
            .into());
        }
        Ok(String::from_utf8(out.stdout)?)
    };
    let listed = run(&["approvals", "--session", session])?;
    for line in listed.lines() {
        println!("    {line}");
    }
    let pending: serde_json::Value = {
        let out = std::process::Command::new(cli)
            .arg("--db")
            .arg(db)
            .args(["approvals", "--session", session, "--json"])
            .output()?;
        serde_json::from_slice(&out.stdout)?
    };
    for request in pending.as_array().into_iter().flatten() {
        let Some(call) = request["id"].as_str() else {
            continue;
        };
        let approved = run(&[
            "approve",
            call,
            "--by",
            "operator",
            "--note",
            "amount matches the order",
        ])?;
        for line in approved.lines() {
            println!("    {line}");
        }
    }
    Ok(())
}

/// What a person on call does with the parked session when the CLI is not built: list
/// what awaits approval (as `durable approvals` does), then approve it (as `durable
/// approve` does), with a note, through the same API.
async fn approver(db: &str, session: &str, style: Style) -> Result<(), Error> {
    let store = durable::connect(db).await?;
    let id = SessionId::new(session);
    let status = store.session(&id).await?.status;
    println!(
        "{}",
        style.dim(&format!(
            "session {session} is {}: no worker holds it",
            status.as_str()
        ))
    );
    let durable = Durable::builder(store)
        .owner("operator")
        .app_version(agent::APP_VERSION)
        .build();
    println!(
        "{}",
        style.dim(&format!(
            "$ durable --db {db} approvals --session {session}"
        ))
    );
    let pending = durable.operator().approvals(Some(&id)).await?;
    for request in &pending {
        let call = &request.call;
        let approval = call.approval.as_ref();
        let args = durable::secret::mask_for_display(&call.args);
        println!(
            "{}",
            ui::row_styled(
                style,
                &call.identity.tool,
                call.class.as_str(),
                style.yellow(&format!(
                    "awaits approval · asked by {} · args {args}",
                    approval.map_or("?", |a| a.asked_by.as_str())
                ))
            )
        );
        if let Some(reasoning) = approval
            .and_then(|a| a.reasoning.as_deref())
            .filter(|r| !r.trim().is_empty())
        {
            let line: String = reasoning
                .chars()
                .filter(|c| !c.is_control())
                .take(100)
                .collect();
            println!(
                "{}",
                ui::row_styled(style, "", "", style.dim(&format!("model: “{line}”")))
            );
        }
    }
    for request in pending {
        let call = request.call.id;
        println!(
            "{}",
            style.dim(&format!(
                "$ durable --db {db} approve {call} --by operator --note 'amount matches the order'"
            ))
        );
        let row = durable
            .operator()
            .approve(&call, None, "operator", Some("amount matches the order"))
            .await?;
        println!(
            "{}",
            ui::row_styled(
                style,
                &row.identity.tool,
                row.class.as_str(),
                style.green("approved by operator: the next run charges once")
            )
        );
    }
    let status = durable.store().session(&id).await?.status;
    println!(
        "{}",
        style.dim(&format!("session {session} is {} again", status.as_str()))
    );
    Ok(())
}

fn requests(n: usize) -> String {
    if n == 1 {
        "1 request".into()
    } else {
        format!("{n} requests")
    }
}

fn usd(nano: u64) -> String {
    format!("${:.4}", nano as f64 / 1e9)
}

/// Reads the outside world and the store, and prints what happened.
async fn audit(
    db: &str,
    session: &str,
    world: &World,
    style: Style,
    approval: bool,
) -> Result<bool, Error> {
    let store: Arc<dyn CheckpointStore> = durable::connect(db).await?;
    let id = SessionId::new(session);
    let record = store.session(&id).await?;
    let checkpoint = store.load_checkpoint(&id, None).await?;
    let plan: Plan = serde_json::from_value(checkpoint.plan.clone())?;
    let budget: Budget = serde_json::from_value(checkpoint.budget.clone())?;
    let calls = store.calls(&id, None).await?;
    let versions = store.list_checkpoints(&id).await?.len().saturating_sub(1);
    let messages: Vec<Message> = checkpoint
        .messages
        .iter()
        .map(|m| m.decode())
        .collect::<Result<_, _>>()?;

    let emails = world.deliveries("outbox")?;
    let payments = world.requests("payments")?;
    let orders = world.requests("orders")?;
    let applied = |r: &[world::Request]| r.iter().filter(|r| r.applied).count();
    let refused = messages
        .iter()
        .filter(|m| m.role == Role::User && m.text().starts_with("The plan is not complete"))
        .count();
    let model_rows: Vec<Spend> = calls
        .iter()
        .filter(|c| c.kind == CallKind::Model && c.status == CallStatus::Completed)
        .filter_map(|c| c.spend.clone())
        .filter_map(|s| serde_json::from_value(s).ok())
        .collect();
    let journal_total: u64 = model_rows.iter().map(Spend::nano_usd).sum();

    let check = |ok: bool| {
        if ok {
            style.green("✓")
        } else {
            style.red("✗")
        }
    };
    let line = |ok: bool, what: &str, value: String, note: String| {
        println!("  {} {what:<20} {value:<8} {}", check(ok), style.dim(&note));
    };
    println!(
        "\n{}",
        style.bold("audit · read from the outbox, the receivers and the store")
    );
    line(
        emails.len() == 1,
        "emails sent",
        emails.len().to_string(),
        "outbox.jsonl".into(),
    );
    line(
        applied(&payments) == 1,
        "charges applied",
        applied(&payments).to_string(),
        format!(
            "payments.jsonl: {}, deduplicated by key",
            requests(payments.len())
        ),
    );
    line(
        applied(&orders) == 1,
        "orders committed",
        applied(&orders).to_string(),
        format!(
            "orders.jsonl: {}, deduplicated by key",
            requests(orders.len())
        ),
    );
    let finalized = plan.is_ready_to_finalize();
    line(
        finalized,
        "plan finalized",
        if finalized { "yes" } else { "no" }.into(),
        format!(
            "{}/{} steps done, {}/{} postconditions verified; early finish refused {refused}×",
            plan.steps.iter().filter(|s| s.status.is_terminal()).count(),
            plan.steps.len(),
            plan.postconditions.iter().filter(|p| p.satisfied).count(),
            plan.postconditions.len(),
        ),
    );
    line(
        budget.spent_nano_usd == journal_total,
        "budget spent",
        usd(budget.spent_nano_usd),
        format!(
            "{} model replies in the journal, {} in total: each charged once",
            model_rows.len(),
            usd(journal_total)
        ),
    );
    let mut runs: Vec<(String, usize)> = Vec::new();
    for e in world.executions()? {
        match runs.iter_mut().find(|(tool, _)| *tool == e.tool) {
            Some((_, n)) => *n += 1,
            None => runs.push((e.tool, 1)),
        }
    }
    let email_runs = runs
        .iter()
        .find(|(t, _)| t == "send_email")
        .map_or(0, |(_, n)| *n);
    line(
        email_runs == 1,
        "tool bodies run",
        runs.iter().map(|(_, n)| n).sum::<usize>().to_string(),
        runs.iter()
            .map(|(tool, n)| format!("{tool} {n}"))
            .collect::<Vec<_>>()
            .join(" · "),
    );
    line(
        true,
        "checkpoints written",
        versions.to_string(),
        format!("session {}", record.status.as_str()),
    );
    let mut approved_once = true;
    if approval {
        let log = store.approvals(&id).await?;
        let count = |event| log.iter().filter(|r| r.event == event).count();
        let (asked, approved, issued) = (
            count(ApprovalEvent::Requested),
            count(ApprovalEvent::Approved),
            count(ApprovalEvent::Issued),
        );
        approved_once = asked == 1 && approved == 1 && issued == 1;
        line(
            approved_once,
            "approvals",
            approved.to_string(),
            format!(
                "audit log: {asked} requested, {approved} approved, {issued} issued to run ({})",
                log.iter()
                    .filter(|r| r.event == ApprovalEvent::Approved)
                    .map(|r| format!("by {}", r.by))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        );
    }
    Ok(approved_once
        && emails.len() == 1
        && email_runs == 1
        && applied(&payments) == 1
        && applied(&orders) == 1
        && finalized
        && budget.spent_nano_usd == journal_total
        && record.status == SessionStatus::Completed)
}
