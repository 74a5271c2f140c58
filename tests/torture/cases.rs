//! The four torture cases. Each returns its figures (printed on its summary line) or the
//! first failed check.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use durable::ReplayClass;
use durable::store::{CallKind, CallStatus, SessionStatus};

use super::agent::{EXIT_AWAITING, EXIT_DONE, EXIT_OPERATOR, EXIT_PARKED, Mode, OnUnsafe};
use super::model::Script;
use super::points::crash_points;
use super::support::{
    Backend, Ctx, Db, Failure, Kill, Rng, Snapshot, Subject, lost, outcomes, point, tool_rows,
};

/// Named figures of a case, in order.
#[derive(Debug, Default)]
pub struct Figures(Vec<(&'static str, String)>);

impl Figures {
    fn add(&mut self, name: &'static str, value: impl ToString) {
        self.0.push((name, value.to_string()));
    }

    /// `name value, name value, …`
    pub fn line(&self) -> String {
        self.0
            .iter()
            .map(|(name, value)| format!("{name} {value}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// A crash-free run: what every other run must end with.
struct Reference {
    snapshot: Snapshot,
    hits: BTreeMap<String, usize>,
}

fn reference(ctx: &Ctx, db: &Db) -> Result<Reference, Failure> {
    let subject = Subject::new(ctx, db);
    let mut options = subject.options.clone();
    options.count_hits = true;
    let run = subject.run(&options, Kill::Never);
    ensure!(
        run.code == Some(EXIT_DONE),
        "the crash-free run exited with {:?}:\n{}",
        run.code,
        run.output()
    );
    ensure!(
        subject.status() == SessionStatus::Completed,
        "the crash-free run did not complete"
    );
    let counts = subject.counts();
    ensure!(
        counts.exactly_once(),
        "the crash-free run's effects are not exactly once: {counts:?}"
    );
    let hits = run
        .marks("hits")
        .filter_map(|m| {
            let (name, n) = m.rsplit_once(' ')?;
            Some((name.to_owned(), n.parse().ok()?))
        })
        .collect();
    let snapshot = subject.latest();
    ensure!(
        snapshot.version == Script::Torture.checkpoints() as i64,
        "the crash-free run wrote {} checkpoints, the script {}",
        snapshot.version,
        Script::Torture.checkpoints()
    );
    Ok(Reference { snapshot, hits })
}

/// The end of every session that completed: the crash-free run's transcript and budget,
/// byte for byte, and every effect exactly once.
fn same_end(subject: &Subject, reference: &Reference, what: &str) -> Result<(), Failure> {
    let status = subject.status();
    ensure!(
        status == SessionStatus::Completed,
        "{what}: the session ended {}",
        status.as_str()
    );
    let end = subject.latest();
    ensure!(
        end.transcript == reference.snapshot.transcript,
        "{what}: the final transcript differs from the crash-free run's\n  crash-free: {}\n  this run:   {}",
        String::from_utf8_lossy(&reference.snapshot.transcript),
        String::from_utf8_lossy(&end.transcript)
    );
    ensure!(
        end.budget == reference.snapshot.budget,
        "{what}: budget {} differs from the crash-free run's {} (spend counted twice or lost)",
        end.budget,
        reference.snapshot.budget
    );
    ensure!(
        end.plan == reference.snapshot.plan,
        "{what}: the final plan differs"
    );
    let counts = subject.counts();
    ensure!(
        counts.exactly_once(),
        "{what}: effects are not exactly once: {counts:?}"
    );
    Ok(())
}

/// Runs until the session completes, resolving in-doubt calls as an operator when a run
/// stops for one. Returns (runs, resolutions).
fn finish(subject: &Subject, what: &str) -> Result<(usize, usize), Failure> {
    let mut resolutions = 0;
    for runs in 1..=6 {
        let run = subject.run_plain();
        match run.code {
            Some(EXIT_DONE) => return Ok((runs, resolutions)),
            Some(EXIT_OPERATOR) => resolutions += subject.operator(),
            other => {
                return Err(format!(
                    "{what}: a resume exited with {other:?}:\n{}",
                    run.output()
                ));
            }
        }
    }
    Err(format!("{what}: not completed after 6 resumes"))
}

/// Kills the script at every journal boundary in turn, then resumes it to the end.
pub fn every_crash_point(ctx: &Ctx, backend: Backend) -> Result<Figures, Failure> {
    let db = ctx.db(backend);
    let reference = reference(ctx, &db)?;
    let points = crash_points(Script::Torture);
    let count = |class| {
        points
            .iter()
            .filter(|p| p.tool.is_some_and(|(_, c)| c == class))
            .count()
    };
    for info in &points {
        let hits = reference
            .hits
            .get(&info.point.failpoint)
            .copied()
            .unwrap_or(0);
        ensure!(
            hits >= info.point.nth,
            "{}: a crash-free run passes `{}` {hits} times, fewer than the point needs",
            info.point.short(),
            info.point.failpoint
        );
    }
    let (mut kills, mut resumes, mut resolutions, mut window) = (0, 0, 0, 0);
    for info in &points {
        let what = info.point.short();
        let subject = Subject::new(ctx, &db);
        let mut crash = subject.options.clone();
        crash.crash_at = Some(info.point.clone());
        let run = subject.run(&crash, Kill::AtCrashPoint);
        ensure!(
            run.killed && run.crashed_at.as_deref() == Some(what.as_str()),
            "{what}: the child never reached the point (exit {:?}):\n{}",
            run.code,
            run.output()
        );
        kills += 1;
        if let Some(check) = subject.integrity() {
            ensure!(
                check == "ok",
                "{what}: PRAGMA integrity_check after the kill: {check}"
            );
        }
        if info.in_unsafe_window() {
            // Inside the unsafe call's window: the resume refuses, the tool runs 0 more times.
            let (tool, _) = info.tool.ok_or("a window point names its tool")?;
            window += 1;
            let before = subject.counts();
            let run = subject.run_plain();
            resumes += 1;
            ensure!(
                run.code == Some(EXIT_OPERATOR),
                "{what}: the resume must stop with ReplayUnsafe; it exited with {:?}:\n{}",
                run.code,
                run.output()
            );
            ensure!(
                run.marks("replay_unsafe")
                    .any(|m| m.split(' ').nth(1) == Some(tool)),
                "{what}: ReplayUnsafe does not name `{tool}`:\n{}",
                run.output()
            );
            let after = subject.counts();
            ensure!(
                after.ran(tool) == before.ran(tool) && after.delivered == before.delivered,
                "{what}: `{tool}` ran again on resume ({} → {} runs)",
                before.ran(tool),
                after.ran(tool)
            );
            resolutions += subject.operator();
        }
        let (runs, resolved) = finish(&subject, &what)?;
        resumes += runs;
        resolutions += resolved;
        same_end(&subject, &reference, &what)?;
    }
    let mut f = Figures::default();
    f.add(
        "points",
        format!(
            "{} ({} pure, {} keyed, {} unsafe tool boundaries; {} model; {} checkpoint), every one hit",
            points.len(),
            count(ReplayClass::Pure),
            count(ReplayClass::IdempotentWithKey),
            count(ReplayClass::UnsafeOnReplay),
            Script::Torture.model_calls(),
            2 * Script::Torture.checkpoints()
        ),
    );
    f.add("kills", kills);
    f.add("resumes", resumes);
    f.add("ReplayUnsafe in a window", format!("{window}/{window}"));
    f.add("operator resolutions", resolutions);
    f.add("duplicates", 0);
    f.add("lost", 0);
    f.add("parked", 0);
    f.add(
        "transcripts identical",
        format!("{}/{}", points.len(), points.len()),
    );
    Ok(f)
}

/// The tools whose calls need approval in [`approval_crash_points`]: a keyed one and an
/// unsafe one.
const APPROVED: [&str; 2] = ["charge_card", "send_email"];

/// Runs the session to its end: a person approves what awaits approval, an operator
/// resolves what is in doubt. Returns (runs, approvals, resolutions).
fn finish_approving(
    subject: &Subject,
    options: &super::agent::Options,
    what: &str,
) -> Result<(usize, usize, usize), Failure> {
    let (mut approvals, mut resolutions) = (0, 0);
    for runs in 1..=10 {
        let run = subject.run(options, Kill::Never);
        match run.code {
            Some(EXIT_DONE) => return Ok((runs, approvals, resolutions)),
            Some(EXIT_AWAITING) => {
                ensure!(
                    subject.status() == SessionStatus::AwaitingApproval,
                    "{what}: the run said it parked for approval, the session is {}",
                    subject.status().as_str()
                );
                approvals += subject.approve_all();
            }
            Some(EXIT_OPERATOR) => resolutions += subject.operator(),
            other => {
                return Err(format!(
                    "{what}: a run exited with {other:?}:\n{}",
                    run.output()
                ));
            }
        }
    }
    Err(format!("{what}: not completed after 10 runs"))
}

/// Every boundary of the approval path, killed in turn: before and after the request is
/// journaled, and every boundary of the approved call's run (a keyed and an unsafe tool).
/// Each session then runs to its end with a person approving: the final transcript is the
/// crash-free run's without approvals, byte for byte, every effect happened once, and the
/// approval log holds one request, one approval and one issue per tool.
pub fn approval_crash_points(ctx: &Ctx, backend: Backend) -> Result<Figures, Failure> {
    let db = ctx.db(backend);
    let reference = reference(ctx, &db)?;
    let mut points = Vec::new();
    for tool in APPROVED {
        points.extend(super::points::approval_points(tool));
        points.extend(
            crash_points(Script::Torture)
                .into_iter()
                .filter(|p| p.tool.is_some_and(|(t, _)| t == tool)),
        );
    }
    let (mut kills, mut runs, mut approvals, mut resolutions) = (0, 0, 0, 0);
    for info in &points {
        let what = info.point.short();
        let subject = Subject::new(ctx, &db);
        let mut options = subject.options.clone();
        options.approval = APPROVED.iter().map(|t| (*t).to_owned()).collect();
        let mut crash = options.clone();
        crash.crash_at = Some(info.point.clone());
        // Run (approving between runs) until the point is reached and the child killed.
        let mut killed = false;
        for _ in 0..6 {
            let run = subject.run(&crash, Kill::AtCrashPoint);
            runs += 1;
            if run.killed {
                ensure!(
                    run.crashed_at.as_deref() == Some(what.as_str()),
                    "{what}: killed at {:?}",
                    run.crashed_at
                );
                killed = true;
                break;
            }
            match run.code {
                Some(EXIT_AWAITING) => approvals += subject.approve_all(),
                Some(EXIT_OPERATOR) => resolutions += subject.operator(),
                other => {
                    return Err(format!(
                        "{what}: exited with {other:?} before the point:\n{}",
                        run.output()
                    ));
                }
            }
        }
        ensure!(killed, "{what}: the point was never reached");
        kills += 1;
        if let Some(check) = subject.integrity() {
            ensure!(check == "ok", "{what}: PRAGMA integrity_check: {check}");
        }
        let (n, a, r) = finish_approving(&subject, &options, &what)?;
        runs += n;
        approvals += a;
        resolutions += r;
        same_end(&subject, &reference, &what)?;
        let log = subject.approval_log();
        for event in ["requested", "approved", "issued"] {
            ensure!(
                log.get(event) == Some(&APPROVED.len()),
                "{what}: the approval log holds {log:?}, one `{event}` per tool expected"
            );
        }
    }
    let mut f = Figures::default();
    f.add(
        "points",
        format!(
            "{} (request and run boundaries of {})",
            points.len(),
            APPROVED.join(", ")
        ),
    );
    f.add("kills", kills);
    f.add("runs", runs);
    f.add("approvals", approvals);
    f.add("operator resolutions", resolutions);
    f.add("duplicates", 0);
    f.add(
        "transcripts identical to the run without approvals",
        format!("{}/{}", points.len(), points.len()),
    );
    Ok(f)
}

/// Kills runs at seeded random instants, restarting each session until it ends.
pub fn random_kills(
    ctx: &Ctx,
    backend: Backend,
    kills_wanted: usize,
    seed: u64,
) -> Result<Figures, Failure> {
    let db = ctx.db(backend);
    let reference = reference(ctx, &db)?;
    // Kill anywhere from the spawn to a little past a whole run (the fastest of two more
    // crash-free runs: the first one pays for cold caches).
    let mut fastest = Duration::MAX;
    for _ in 0..2 {
        let timing = Subject::new(ctx, &db).run_plain();
        ensure!(
            timing.code == Some(EXIT_DONE),
            "a timing run failed:\n{}",
            timing.output()
        );
        fastest = fastest.min(timing.elapsed);
    }
    let window = (fastest.as_micros() as u64 * 11 / 10).max(20_000);
    let mut rng = Rng::new(seed);
    let (mut kills, mut resumes, mut sessions, mut completed, mut parked, mut checks) =
        (0, 0, 0, 0, 0, 0);
    let (mut in_session, mut in_call) = (0, 0);
    // Parked as crash loops (recovery attempts exhausted), among `parked`.
    let mut crash_loops = 0;
    while kills < kills_wanted {
        sessions += 1;
        let mut subject = Subject::new(ctx, &db);
        subject.options.on_unsafe = OnUnsafe::Park;
        let what = format!("session {sessions}");
        let mut seen = BTreeMap::new();
        let mut runs = 0;
        loop {
            runs += 1;
            ensure!(runs <= 200, "{what}: still running after 200 restarts");
            let kill = if kills < kills_wanted {
                Kill::After(Duration::from_micros(rng.below(window)))
            } else {
                Kill::Never
            };
            let run = subject.run(&subject.options, kill);
            if runs > 1 {
                resumes += 1;
            }
            if run.killed {
                kills += 1;
                if run.marks("started").next().is_some() || run.marks("resumed").next().is_some() {
                    in_session += 1;
                }
                if run.marks("event").next().is_some() {
                    in_call += 1;
                }
                if let Some(check) = subject.integrity() {
                    checks += 1;
                    ensure!(
                        check == "ok",
                        "{what}, kill {kills}: PRAGMA integrity_check: {check}"
                    );
                }
                let now = outcomes(&subject.journal());
                let gone = lost(&seen, &now);
                ensure!(
                    gone.is_empty(),
                    "{what}, kill {kills}: recorded results lost: {gone:?}"
                );
                seen = now;
                let counts = subject.counts();
                ensure!(
                    counts.duplicates() == 0,
                    "{what}, kill {kills}: duplicate effects: {counts:?}"
                );
                continue;
            }
            match run.code {
                Some(EXIT_DONE) => {
                    completed += 1;
                    break;
                }
                Some(EXIT_PARKED) => {
                    parked += 1;
                    if subject
                        .status_reason()
                        .is_some_and(|r| r.contains("recovery attempts exhausted"))
                    {
                        crash_loops += 1;
                    }
                    break;
                }
                other => {
                    return Err(format!(
                        "{what}: a run exited with {other:?}:\n{}",
                        run.output()
                    ));
                }
            }
        }
        let rows = subject.journal();
        let gone = lost(&seen, &outcomes(&rows));
        ensure!(gone.is_empty(), "{what}: recorded results lost: {gone:?}");
        let counts = subject.counts();
        ensure!(
            counts.duplicates() == 0,
            "{what}: duplicate effects: {counts:?}"
        );
        match subject.status() {
            SessionStatus::Completed => same_end(&subject, &reference, &what)?,
            SessionStatus::Parked => ensure!(
                rows.iter()
                    .any(|r| r.class == ReplayClass::UnsafeOnReplay
                        && r.status == CallStatus::Issued),
                "{what}: parked with no unsafe call in doubt"
            ),
            other => return Err(format!("{what}: ended {}", other.as_str())),
        }
    }
    let mut f = Figures::default();
    f.add("seed", format!("{seed:#x}"));
    f.add(
        "kills",
        format!("{kills} ({in_session} with the session open, {in_call} after a journal decision)"),
    );
    f.add("kill window", format!("{} ms", window / 1000));
    f.add("resumes", resumes);
    f.add("sessions", sessions);
    f.add("completed", completed);
    f.add("parked", parked);
    f.add("parked as crash loops", crash_loops);
    f.add("duplicates", 0);
    f.add("lost", 0);
    if backend == Backend::Sqlite {
        f.add("integrity_check ok", format!("{checks}/{checks}"));
    }
    Ok(f)
}

/// Once a call's result is recorded, resumes never run it again and return its bytes.
pub fn completed_never_again(ctx: &Ctx, backend: Backend, seed: u64) -> Result<Figures, Failure> {
    const RESUMES: usize = 100;
    const KILLED: usize = 10;
    let db = ctx.db(backend);
    let reference = reference(ctx, &db)?;
    let subject = Subject::new(ctx, &db);
    // Every call of the second turn is recorded; its checkpoint is not written.
    let mut crash = subject.options.clone();
    crash.crash_at = Some(point("before_checkpoint#2"));
    let run = subject.run(&crash, Kill::AtCrashPoint);
    ensure!(
        run.killed,
        "the child never reached before_checkpoint#2:\n{}",
        run.output()
    );
    subject.settle();
    let rows = subject.journal();
    let turn: Vec<_> = rows
        .iter()
        .filter(|r| r.identity.step == 1 && r.kind == CallKind::Tool)
        .collect();
    ensure!(
        turn.len() == 4 && turn.iter().all(|r| r.status == CallStatus::Completed),
        "the second turn's four calls are not all recorded: {:?}",
        turn.iter()
            .map(|r| (&r.identity.tool, r.status))
            .collect::<Vec<_>>()
    );
    let recorded = outcomes(&rows);
    let before = subject.counts();

    let mut replay = subject.options.clone();
    replay.mode = Mode::ReplayTurn;
    let mut rng = Rng::new(seed);
    let mut kill_at: BTreeSet<usize> = BTreeSet::new();
    while kill_at.len() < KILLED {
        kill_at.insert(1 + rng.below(RESUMES as u64 - 1) as usize);
    }
    let (mut killed, mut clean) = (0, 0);
    let mut bytes: BTreeSet<String> = BTreeSet::new();
    // Journal events in a clean resume (run 0 is always clean): a killed resume freezes
    // after a random one of them, so every kill lands mid-resume on any machine.
    let mut events = 0;
    for i in 0..RESUMES {
        let kill = i > 0 && kill_at.contains(&i);
        let run = if kill {
            let mut frozen = replay.clone();
            frozen.freeze_after_events = Some(1 + rng.below(events.max(1)) as usize);
            subject.run(&frozen, Kill::AtCrashPoint)
        } else {
            subject.run(&replay, Kill::Never)
        };
        if run.killed {
            killed += 1;
            let gone = lost(&recorded, &outcomes(&subject.journal()));
            ensure!(
                gone.is_empty(),
                "resume {i} (killed): recorded results lost: {gone:?}"
            );
            continue;
        }
        ensure!(
            run.code == Some(EXIT_DONE),
            "resume {i} exited with {:?}:\n{}",
            run.code,
            run.output()
        );
        events = run.marks("event").count() as u64;
        clean += 1;
        let results: Vec<&str> = run.marks("result").collect();
        ensure!(
            results.len() == 5,
            "resume {i}: {} results, expected 5:\n{}",
            results.len(),
            run.output()
        );
        bytes.insert(results.join("\n"));
        for event in run.marks("event") {
            let mut parts = event.split(' ');
            let (tool, outcome) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
            if outcome != "cache_hit" {
                return Err(format!(
                    "resume {i}: `{tool}` was not returned from the journal: {outcome}"
                ));
            }
        }
    }
    ensure!(
        killed == KILLED,
        "only {killed} of {KILLED} resumes could be killed mid-resume"
    );
    ensure!(
        bytes.len() == 1,
        "the resumes returned {} different result sets",
        bytes.len()
    );
    let after = subject.counts();
    let more: usize =
        after.executions.values().sum::<usize>() - before.executions.values().sum::<usize>();
    ensure!(
        after == before,
        "tools ran during the resumes: {before:?} → {after:?}"
    );
    ensure!(
        lost(&recorded, &outcomes(&subject.journal())).is_empty(),
        "recorded results changed during the resumes"
    );
    finish(&subject, "after the resumes")?;
    same_end(&subject, &reference, "after the resumes")?;
    let runs: usize = subject.counts().executions.values().sum();
    ensure!(
        runs == Script::Torture.tools().len(),
        "{runs} tool runs in all, expected one per tool"
    );

    let mut f = Figures::default();
    f.add("resumes", RESUMES);
    f.add("killed mid-resume", killed);
    f.add("clean", clean);
    f.add("calls replayed", 4 * clean);
    f.add("more executions", more);
    f.add("distinct result bytes", bytes.len());
    f.add("duplicates", 0);
    f.add("lost", 0);
    f.add("parked", 0);
    Ok(f)
}

/// After a crash behind an unsafe call's *issued* commit, a model re-asked for the turn
/// proposes other arguments (and, in half the trials, another unsafe tool): refused.
pub fn model_changes_its_mind(ctx: &Ctx, backend: Backend) -> Result<Figures, Failure> {
    const TRIALS: usize = 6;
    let db = ctx.db(backend);
    let reference = reference(ctx, &db)?;
    let (mut proposals, mut refused, mut executions, mut with_other) = (0, 0, 0, 0);
    for trial in 0..TRIALS {
        let tool = ["send_email", "post_slack", "notify_warehouse"][trial % 3];
        let other = trial % 2 == 1;
        with_other += usize::from(other);
        let what = format!(
            "trial {trial} ({tool}{})",
            if other { " + another unsafe tool" } else { "" }
        );
        let subject = Subject::new(ctx, &db);
        let mut crash = subject.options.clone();
        crash.crash_at = Some(point(&format!("after_issued::{tool}")));
        let run = subject.run(&crash, Kill::AtCrashPoint);
        ensure!(
            run.killed,
            "{what}: the child never reached after_issued::{tool}:\n{}",
            run.output()
        );
        subject.settle();
        let rows = subject.journal();
        let in_doubt: BTreeSet<String> = rows
            .iter()
            .filter(|r| r.class == ReplayClass::UnsafeOnReplay && r.status == CallStatus::Issued)
            .map(|r| r.id.as_str().to_owned())
            .collect();
        ensure!(
            !in_doubt.is_empty(),
            "{what}: nothing in doubt after the crash"
        );
        let before = subject.counts();

        let mut rethink = subject.options.clone();
        rethink.mode = Mode::Rethink(other);
        let run = subject.run(&rethink, Kill::Never);
        ensure!(
            run.code == Some(EXIT_OPERATOR) && run.marks("rethink").count() == 1,
            "{what}: the re-asked turn must be refused; exit {:?}:\n{}",
            run.code,
            run.output()
        );
        let marks: Vec<&str> = run.marks("replay_unsafe").collect();
        proposals += 1 + usize::from(other);
        refused += marks.len();
        ensure!(
            marks.len() == 1 + usize::from(other),
            "{what}: {} proposals, {} refused:\n{}",
            1 + usize::from(other),
            marks.len(),
            run.output()
        );
        for mark in &marks {
            let unresolved = mark.split(' ').nth(2).unwrap_or("");
            ensure!(
                in_doubt.contains(unresolved),
                "{what}: the refusal does not name the unresolved call: {mark}"
            );
        }
        let ran: Vec<&str> = run
            .marks("event")
            .filter(|e| !e.contains(" refused ") && !e.contains(" cache_hit "))
            .collect();
        executions += ran.len();
        ensure!(
            ran.is_empty(),
            "{what}: something ran beside the unresolved call: {ran:?}"
        );
        let after_rows = subject.journal();
        ensure!(
            tool_rows(&after_rows) == tool_rows(&rows)
                && after_rows
                    .iter()
                    .map(|r| (&r.id, r.status))
                    .collect::<Vec<_>>()
                    == rows.iter().map(|r| (&r.id, r.status)).collect::<Vec<_>>(),
            "{what}: the refused proposals changed the journal:\n  before: {:?}\n  after:  {:?}",
            rows.iter()
                .map(|r| (&r.identity.tool, r.status))
                .collect::<Vec<_>>(),
            after_rows
                .iter()
                .map(|r| (&r.identity.tool, r.status))
                .collect::<Vec<_>>()
        );
        ensure!(
            subject.counts() == before,
            "{what}: the world changed: {before:?} → {:?}",
            subject.counts()
        );

        finish(&subject, &what)?;
        same_end(&subject, &reference, &what)?;
    }
    let mut f = Figures::default();
    f.add("trials", TRIALS);
    f.add("with another unsafe tool", with_other);
    f.add("proposals", proposals);
    f.add("refused", refused);
    f.add("executions", executions);
    f.add("duplicates", 0);
    f.add("lost", 0);
    f.add("parked", 0);
    Ok(f)
}
