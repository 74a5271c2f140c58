//! Commands that change the store (`resolve`, `fork`, `prune`, `retarget`) or write
//! files (`export`).

use std::io::{IsTerminal, Read};
use std::sync::Arc;
use std::time::Duration;

use durable::json::ArgLimits;
use durable::replay_check::{self, Exported};
use durable::store::{
    CallStatus, ForkPlan, ForkSession, PurgeOutcome, Resolution, RetargetSession, SessionFilter,
    SessionStatus,
};
use durable::{CallId, CheckpointStore, Durable, SessionId};
use serde::Serialize;
use serde_json::{Value, json};

use crate::display::{ID, NAME, clip};
use crate::error::{CliError, Code};
use crate::render::{self, age, table};
use crate::{
    CancelArgs, ExportArgs, ForkArgs, PruneArgs, ResolveArgs, RetargetArgs, UnparkArgs, operator,
};

/// The lease owner recorded for the few writes this tool makes under a lease (fork).
pub(crate) const CLI_OWNER: &str = "durable-cli";

/// Reads `--result`: JSON text, `@file`, or `@-` for stdin; validated like tool
/// arguments (no duplicate keys, NaN or out-of-range integers).
fn read_result(raw: &str) -> Result<Value, CliError> {
    read_json(
        raw,
        "--result",
        "--result '{\"id\": \"m-1\"}', or a JSON string: '\"sent\"'",
    )
}

/// Reads the JSON value of `flag`: JSON text, `@file`, or `@-` for stdin; validated like
/// tool arguments (no duplicate keys, NaN or out-of-range integers). `example` completes
/// the error message (`e.g. …`).
pub(crate) fn read_json(raw: &str, flag: &str, example: &str) -> Result<Value, CliError> {
    let invalid = |m: String| CliError::new(Code::InvalidInput, m);
    let (text, source) = match raw.strip_prefix('@') {
        Some("-") => {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .map_err(|e| invalid(format!("cannot read {flag} from stdin: {e}")))?;
            (text, "stdin".to_owned())
        }
        Some(path) => (
            std::fs::read_to_string(path)
                .map_err(|e| invalid(format!("cannot read {flag} file `{path}`: {e}")))?,
            format!("`{path}`"),
        ),
        None => (raw.to_owned(), flag.to_owned()),
    };
    durable::json::parse_json(text.trim(), &ArgLimits::default())
        .map_err(|e| invalid(format!("{source} is not valid JSON ({e}); e.g. {example}")))
}

pub async fn resolve(
    store: &Arc<dyn CheckpointStore>,
    json: bool,
    args: ResolveArgs,
) -> Result<(), CliError> {
    let by = operator(args.by)?;
    // Input first: a malformed result is refused before anything is read or written.
    let resolution = if args.happened {
        let raw = args.result.as_deref().unwrap_or_default();
        Resolution::Happened {
            result: read_result(raw)?,
        }
    } else {
        Resolution::DidNotHappen
    };
    let id = CallId::new(args.call);
    let call = store.call(&id).await?;
    // For messages: escaped and clipped (the JSON output keeps the exact values).
    let tool = clip(&call.identity.tool, NAME);
    let session = clip(call.identity.session.as_str(), ID);
    let shown_id = clip(id.as_str(), ID);
    match call.status {
        CallStatus::Issued => {}
        CallStatus::NotHappened => {
            return Err(CliError::new(
                Code::Refused,
                format!(
                    "call `{shown_id}` (`{tool}`) is not in doubt: it was already resolved as not happened; the next resume runs it"
                ),
            ));
        }
        status => {
            return Err(CliError::new(
                Code::Refused,
                format!(
                    "call `{shown_id}` (`{tool}`) is not in doubt: its outcome is recorded (status `{}`); nothing to resolve",
                    status.as_str()
                ),
            ));
        }
    }
    let in_doubt = store.in_doubt(Some(&call.identity.session)).await?;
    if !in_doubt.iter().any(|c| c.id == id) {
        let record = store.session(&call.identity.session).await?;
        let holder = record
            .lease_owner
            .map_or_else(|| "a worker".into(), |o| clip(&o, NAME));
        return Err(CliError::new(
            Code::Refused,
            format!(
                "call `{shown_id}` (`{tool}`) is still running: session `{session}` is leased by `{holder}`; wait until the worker finishes or its lease expires, then look again"
            ),
        ));
    }
    // The store seals the resolution with its keys (`DURABLE_MAC_KEY`, read when it was
    // opened); a store sealed with an application key we lack refused to open.
    let durable = Durable::builder(Arc::clone(store)).owner(CLI_OWNER).build();
    let record = durable
        .operator()
        .resolve(&id, resolution.clone(), &by, args.note.as_deref())
        .await?;
    if json {
        return render::print_json(&json!({
            "call": record.id,
            "session": call.identity.session,
            "tool": call.identity.tool,
            "status": record.status,
            "resolution": resolution,
            "by": by,
            "note": args.note,
        }));
    }
    let shown_by = clip(&by, NAME);
    match resolution {
        Resolution::Happened { .. } => outln!(
            "resolved call `{shown_id}` (`{tool}` in session `{session}`) as happened, by {shown_by}: the next resume returns this result to the agent and runs nothing"
        ),
        Resolution::DidNotHappen => outln!(
            "resolved call `{shown_id}` (`{tool}` in session `{session}`) as not happened, by {shown_by}: the next resume runs the call again"
        ),
    }
    Ok(())
}

pub async fn unpark(
    store: &dyn CheckpointStore,
    json: bool,
    args: UnparkArgs,
) -> Result<(), CliError> {
    let id = SessionId::new(args.session);
    let record = store.unpark_session(&id).await?;
    if json {
        return render::print_json(&json!({
            "session": record.id,
            "status": record.status,
        }));
    }
    outln!(
        "unparked session `{}`: it is active again, and the next worker to recover it continues from its latest checkpoint",
        clip(id.as_str(), ID)
    );
    Ok(())
}

pub async fn cancel(
    store: &dyn CheckpointStore,
    json: bool,
    args: CancelArgs,
) -> Result<(), CliError> {
    let by = operator(args.by)?;
    let mut cancel =
        durable::store::CancelSession::new(SessionId::new(args.session), by, args.reason);
    if args.only {
        cancel = cancel.without_children();
    }
    let done = store.cancel_session(&cancel).await?;
    if json {
        return render::print_json(&done);
    }
    for reached in &done {
        let what = match reached.effect {
            durable::store::CancelEffect::Cancelled => "cancelled",
            durable::store::CancelEffect::Requested => {
                "asked to stop: a worker holds it, it ends at its next safe point"
            }
            durable::store::CancelEffect::AlreadyEnded => "had already ended: left as it was",
            _ => "reached",
        };
        outln!("session `{}`: {what}", clip(reached.session.as_str(), ID));
    }
    Ok(())
}

pub async fn fork(store: &dyn CheckpointStore, json: bool, args: ForkArgs) -> Result<(), CliError> {
    let from = SessionId::new(args.session);
    let to = args.to.map_or_else(SessionId::random, SessionId::new);
    let version = args.from_version;
    store.session(&from).await?;
    let rerun: Vec<CallId> = args.rerun.into_iter().map(CallId::new).collect();
    let by = if rerun.is_empty() {
        operator(args.by).unwrap_or_else(|_| CLI_OWNER.to_owned())
    } else {
        operator(args.by)?
    };
    // What the fork will do with the parent's effects, said before it is done.
    store.load_checkpoint(&from, Some(version)).await?;
    let rows = store.calls(&from, None).await?;
    let plan = ForkPlan::new(from.clone(), version, &rows, &rerun).map_err(|unknown| {
        CliError::new(
            Code::InvalidInput,
            format!(
                "--rerun {}: not a call of `{}` that a fork at version {version} would inherit \
                 (see `durable fork {} --from-version {version} --dry-run`)",
                clip(unknown[0].as_str(), ID),
                clip(from.as_str(), ID),
                clip(from.as_str(), ID),
            ),
        )
    })?;
    if args.dry_run {
        if json {
            return render::print_json(&json!({
                "dry_run": true,
                "session": from,
                "from_version": version,
                "parent_effects": plan.entries,
            }));
        }
        print_fork_plan(&plan);
        outln!("dry run: nothing was written");
        return Ok(());
    }
    if !json {
        print_fork_plan(&plan);
    }
    let request = ForkSession::new(
        from.clone(),
        version,
        to.clone(),
        CLI_OWNER,
        Duration::from_secs(1),
    )
    .rerun(rerun)
    .by(by);
    let (_, lease) = store.fork_session_with(&request).await?;
    // The fork is for a worker to pick up: give its lease back at once.
    store.release_lease(&lease).await?;
    let record = store.session(&to).await?;
    if json {
        let mut out = serde_json::to_value(&record)
            .map_err(|e| CliError::new(Code::Failure, format!("cannot encode JSON output: {e}")))?;
        if let Some(map) = out.as_object_mut() {
            map.insert(
                "parent_effects".to_owned(),
                serde_json::to_value(&plan.entries).unwrap_or(Value::Null),
            );
        }
        return render::print_json(&out);
    }
    outln!(
        "forked session `{}` at version {} into `{}` (app version {}); resume it with its id",
        clip(from.as_str(), ID),
        version,
        clip(to.as_str(), ID),
        clip(&record.app_version, NAME)
    );
    Ok(())
}

/// Prints what a fork does with each of the parent's effects.
fn print_fork_plan(plan: &ForkPlan) {
    if plan.entries.is_empty() {
        outln!(
            "session `{}` recorded no effect from version {} on: the fork inherits nothing it could repeat",
            clip(plan.source.as_str(), ID),
            plan.version
        );
        return;
    }
    outln!(
        "the parent's effects from version {} on, and what the fork does with each:",
        plan.version
    );
    let mut t = table(["CALL", "TOOL", "CLASS", "STEP", "STATUS", "IN THE FORK"]);
    for e in &plan.entries {
        t.add_row([
            clip(e.call.as_str(), ID),
            clip(&e.tool, NAME),
            e.class.as_str().to_owned(),
            e.step.to_string(),
            e.status.as_str().to_owned(),
            e.effect.clone(),
        ]);
    }
    render::print_table(&t);
}

#[derive(Serialize)]
struct Written {
    path: String,
    session: SessionId,
    version: i64,
    messages: usize,
    calls: usize,
}

pub async fn export(
    store: &dyn CheckpointStore,
    json: bool,
    args: ExportArgs,
) -> Result<(), CliError> {
    let exported: Exported = match (&args.session, args.last) {
        (Some(session), _) => {
            replay_check::export_session(store, &SessionId::new(session.as_str())).await?
        }
        (None, Some(n)) => replay_check::export_last(store, n).await?,
        (None, None) => unreachable!("clap requires a session or --last"),
    };
    std::fs::create_dir_all(&args.out).map_err(|e| {
        CliError::new(
            Code::InvalidInput,
            format!("cannot create `{}`: {e}", args.out.display()),
        )
    })?;
    let mut written = Vec::new();
    for fixture in &exported.fixtures {
        let path = args.out.join(fixture.file_name());
        let text = fixture.to_json_pretty().map_err(|e| {
            CliError::new(
                Code::Failure,
                format!(
                    "cannot encode checkpoint {} of `{}`: {e}",
                    fixture.version, fixture.session
                ),
            )
        })?;
        std::fs::write(&path, text + "\n").map_err(|e| {
            CliError::new(
                Code::Failure,
                format!("cannot write `{}`: {e}", path.display()),
            )
        })?;
        written.push(Written {
            path: path.display().to_string(),
            session: fixture.session.clone(),
            version: fixture.version,
            messages: fixture.messages.len(),
            calls: fixture.calls.len(),
        });
    }
    let unreadable: Vec<String> = exported
        .unreadable
        .iter()
        .map(ToString::to_string)
        .collect();
    if json {
        render::print_json(&json!({
            "format": replay_check::FIXTURE_FORMAT,
            "out": args.out.display().to_string(),
            "files": written,
            "unreadable": unreadable,
        }))?;
    } else if written.is_empty() {
        outln!("no checkpoints to export");
    } else {
        let mut t = table(["FILE", "SESSION", "VERSION", "MESSAGES", "CALLS"]);
        for w in &written {
            t.add_row(vec![
                crate::display::escape(&w.path).into_owned(),
                clip(w.session.as_str(), ID),
                w.version.to_string(),
                w.messages.to_string(),
                w.calls.to_string(),
            ]);
        }
        render::print_table(&t);
        outln!(
            "wrote {} fixture{} (format {}) to {}",
            written.len(),
            if written.len() == 1 { "" } else { "s" },
            replay_check::FIXTURE_FORMAT,
            crate::display::escape(&args.out.display().to_string())
        );
    }
    if unreadable.is_empty() {
        return Ok(());
    }
    for line in &unreadable {
        eprintln!(
            "warning: not exported: {}",
            clip(line, crate::display::LINE)
        );
    }
    Err(CliError::new(
        Code::Failure,
        format!(
            "{} checkpoint{} could not be read (listed above); the others were exported",
            unreadable.len(),
            if unreadable.len() == 1 { "" } else { "s" }
        ),
    ))
}

#[derive(Serialize)]
struct Pruned {
    session: SessionId,
    status: SessionStatus,
    updated_at: i64,
    outcome: &'static str,
}

fn outcome_name(outcome: PurgeOutcome) -> &'static str {
    match outcome {
        PurgeOutcome::Purged => "purged",
        PurgeOutcome::NotTerminal => "skipped: no longer terminal",
        PurgeOutcome::WithinRetention => "skipped: updated within the window",
        PurgeOutcome::CallInDoubt => "skipped: a call is in doubt",
    }
}

/// Above this many sessions, a progress bar is drawn (when stderr is a terminal).
const PROGRESS_THRESHOLD: usize = 20;

pub async fn prune(
    store: &dyn CheckpointStore,
    json: bool,
    args: PruneArgs,
) -> Result<(), CliError> {
    let now = store.now().await?;
    let window = i64::try_from(args.older_than.as_millis()).unwrap_or(i64::MAX);
    let candidates = store
        .list_sessions(
            &SessionFilter::new()
                .with_statuses(vec![
                    SessionStatus::Completed,
                    SessionStatus::Failed,
                    SessionStatus::Cancelled,
                ])
                .with_updated_before(now.saturating_sub(window)),
        )
        .await?;
    let bar = (!json
        && !args.dry_run
        && candidates.len() > PROGRESS_THRESHOLD
        && std::io::stderr().is_terminal())
    .then(|| {
        let bar = indicatif::ProgressBar::new(candidates.len() as u64);
        if let Ok(style) =
            indicatif::ProgressStyle::with_template("pruning {bar:40} {pos}/{len} sessions ({eta})")
        {
            bar.set_style(style);
        }
        bar
    });
    let mut results = Vec::with_capacity(candidates.len());
    for session in &candidates {
        let outcome = if args.dry_run {
            if store.in_doubt(Some(&session.id)).await?.is_empty() {
                "would purge"
            } else {
                outcome_name(PurgeOutcome::CallInDoubt)
            }
        } else {
            match store.purge_session(&session.id, args.older_than).await {
                Ok(outcome) => outcome_name(outcome),
                // Pruned by someone else meanwhile.
                Err(durable::StoreError::SessionNotFound(_)) => "skipped: already gone",
                Err(e) => {
                    if let Some(bar) = &bar {
                        bar.abandon();
                    }
                    return Err(e.into());
                }
            }
        };
        if let Some(bar) = &bar {
            bar.inc(1);
        }
        results.push(Pruned {
            session: session.id.clone(),
            status: session.status,
            updated_at: session.updated_at,
            outcome,
        });
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let deleted = results
        .iter()
        .filter(|r| r.outcome == "purged" || r.outcome == "would purge")
        .count();
    if json {
        return render::print_json(&json!({
            "dry_run": args.dry_run,
            "older_than_ms": window,
            "purged": if args.dry_run { 0 } else { deleted },
            "would_purge": if args.dry_run { deleted } else { 0 },
            "sessions": results,
        }));
    }
    const SHOWN: usize = 100;
    if !results.is_empty() {
        let mut t = table(["SESSION", "STATUS", "UPDATED", "OUTCOME"]);
        for r in results.iter().take(SHOWN) {
            t.add_row(vec![
                clip(r.session.as_str(), ID),
                r.status.as_str().to_owned(),
                age(r.updated_at, now),
                r.outcome.to_owned(),
            ]);
        }
        render::print_table(&t);
        if results.len() > SHOWN {
            outln!("… and {} more (--json lists all)", results.len() - SHOWN);
        }
    }
    let skipped = results.len() - deleted;
    let window_text = humantime::format_duration(args.older_than);
    if args.dry_run {
        outln!(
            "dry run: would purge {deleted} terminal session{} not updated for {window_text}; {skipped} skipped; nothing was deleted",
            if deleted == 1 { "" } else { "s" },
        );
    } else {
        outln!(
            "purged {deleted} terminal session{} not updated for {window_text}; {skipped} skipped",
            if deleted == 1 { "" } else { "s" },
        );
    }
    Ok(())
}

/// `durable retarget`: one session to another app version, through the store's
/// `retarget_session` (a session migration, not a schema migration).
pub async fn retarget(
    store: &dyn CheckpointStore,
    json: bool,
    args: RetargetArgs,
) -> Result<(), CliError> {
    let id = SessionId::new(args.session);
    let current = store.session(&id).await?;
    let rows = store.calls(&id, None).await?;
    let renames: Vec<Value> = args
        .map
        .iter()
        .map(|(old, new)| {
            let matching: Vec<_> = rows.iter().filter(|r| &r.identity.tool == old).collect();
            let in_flight = matching
                .iter()
                .filter(|r| matches!(r.status, CallStatus::Issued | CallStatus::NotHappened))
                .count();
            json!({"from": old, "to": new, "rows": matching.len(), "in_flight": in_flight})
        })
        .collect();
    if args.dry_run {
        if json {
            return render::print_json(&json!({
                "dry_run": true,
                "session": id,
                "from_version": current.app_version,
                "to_version": args.app_version,
                "renames": renames,
            }));
        }
        outln!(
            "dry run: session `{}` would move from app version `{}` to `{}`",
            clip(id.as_str(), ID),
            clip(&current.app_version, NAME),
            clip(&args.app_version, NAME)
        );
        print_renames(&renames);
        outln!("nothing was changed");
        return Ok(());
    }
    let by = operator(args.by)?;
    let record = store
        .retarget_session(RetargetSession {
            session: id.clone(),
            from_version: current.app_version.clone(),
            to_version: args.app_version.clone(),
            step_map: args.map.clone(),
            by: by.clone(),
        })
        .await?;
    if json {
        return render::print_json(&json!({
            "dry_run": false,
            "session": record,
            "from_version": current.app_version,
            "to_version": args.app_version,
            "renames": renames,
            "by": by,
        }));
    }
    outln!(
        "moved session `{}` from app version `{}` to `{}`, by {}",
        clip(id.as_str(), ID),
        clip(&current.app_version, NAME),
        clip(&record.app_version, NAME),
        clip(&by, NAME)
    );
    print_renames(&renames);
    Ok(())
}

fn print_renames(renames: &[Value]) {
    for r in renames {
        outln!(
            "  {} -> {}: {} journal row{} ({} in flight)",
            clip(r["from"].as_str().unwrap_or_default(), NAME),
            clip(r["to"].as_str().unwrap_or_default(), NAME),
            r["rows"],
            if r["rows"] == 1 { "" } else { "s" },
            r["in_flight"]
        );
    }
}

/// `durable acknowledge-rollback`: SQLite (its witness file) or PostgreSQL (where the
/// store lives).
pub async fn acknowledge_rollback(
    location: &crate::open::Location,
    json: bool,
    by: String,
    intact: bool,
) -> Result<(), CliError> {
    if let Some(path) = crate::open::sqlite_file(&location.url) {
        return acknowledge_sqlite(path, json, by, intact).await;
    }
    #[cfg(feature = "postgres")]
    if location.url.starts_with("postgres://") || location.url.starts_with("postgresql://") {
        let options = durable::postgres::PostgresStoreOptions::new(location.url.clone());
        let report = durable::postgres::PostgresStore::acknowledge_rollback(options, &by, intact)
            .await
            .map_err(CliError::open)?;
        if json {
            return render::print_json(&json!({
                "rolled_back": report.rolled_back(),
                "changes": report.changes,
                "intact": intact,
                "by": by,
            }));
        }
        if !report.rolled_back() {
            outln!(
                "no rollback found: the database is where the store last ran; nothing was parked"
            );
            return Ok(());
        }
        for change in &report.changes {
            outln!("changed: {}", clip(change, NAME));
        }
        if intact {
            outln!(
                "acknowledged: on your word (--intact) nothing was parked; the new place is recorded"
            );
        } else {
            outln!(
                "acknowledged: every unfinished session was parked; check each one's effects, then `durable unpark` it"
            );
        }
        return Ok(());
    }
    Err(CliError::new(
        Code::Usage,
        "acknowledge-rollback needs a SQLite store file or a postgres:// URL",
    ))
}

#[cfg(not(feature = "sqlite"))]
async fn acknowledge_sqlite(_: &str, _: bool, _: String, _: bool) -> Result<(), CliError> {
    Err(CliError::new(
        Code::Unavailable,
        "this `durable` binary was built without SQLite support",
    ))
}

#[cfg(feature = "sqlite")]
async fn acknowledge_sqlite(
    path: &str,
    json: bool,
    by: String,
    intact: bool,
) -> Result<(), CliError> {
    let report = durable::sqlite::SqliteStore::acknowledge_rollback(path, &by, intact)
        .await
        .map_err(CliError::open)?;
    if json {
        let lost: Vec<Value> = report
            .lost
            .iter()
            .map(|l| {
                json!({
                    "session": l.session,
                    "call": l.call,
                    "attempt": l.attempt,
                    "session_missing": l.session_missing,
                })
            })
            .collect();
        return render::print_json(&json!({
            "rolled_back": report.rolled_back(),
            "witness_missing": report.witness_missing,
            "foreign_witness": report.foreign_witness,
            "lost": lost,
            "parked_sessions": report.sessions(),
            "by": by,
        }));
    }
    if !report.rolled_back() {
        outln!("no rollback found: the database matches its witness; nothing was parked");
        return Ok(());
    }
    for lost in &report.lost {
        outln!(
            "lost: call `{}` (attempt {}) of session `{}`{}",
            clip(&lost.call, ID),
            lost.attempt,
            clip(&lost.session, ID),
            if lost.session_missing {
                " (session recreated, empty)"
            } else {
                ""
            }
        );
    }
    if report.witness_missing || report.foreign_witness {
        if intact {
            outln!(
                "acknowledged: no usable witness; on your word (--intact) nothing more was parked; a new witness was written"
            );
        } else {
            outln!(
                "acknowledged: no usable witness, so every unfinished session was parked; check each one's effects, then `durable unpark` it"
            );
        }
        return Ok(());
    }
    outln!(
        "acknowledged: {} session(s) parked; check each lost call's effect at its source, then `durable unpark` the session",
        report.sessions().len()
    );
    Ok(())
}
