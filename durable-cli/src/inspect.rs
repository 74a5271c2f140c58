//! Read-only commands: `sessions`, `show`, `calls`, `in-doubt`.

use std::collections::{HashMap, HashSet};

use durable::store::{
    ApprovalDecision, CallRecord, CallStatus, CheckpointMeta, Decided, ListedSession,
    SessionCursor, SessionFilter, SessionRecord,
};
use durable::{CallId, CheckpointStore, Plan, SessionId, StoreError};
use serde::Serialize;
use serde_json::{Value, json};

use crate::display::{ID, NAME, TEXT, clip};
use crate::error::{CliError, Code};
use crate::render::{self, age, mask, table};
use crate::{CallsArgs, InDoubtArgs, SessionsArgs, ShowArgs};

/// Width of a plan line or an error message in `show`.
const PLAN_LINE: usize = 160;

fn ms(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// A session row with what `sessions` adds to it.
#[derive(Serialize)]
struct SessionLine {
    #[serde(flatten)]
    session: SessionRecord,
    lease_live: bool,
    last_checkpoint_at: Option<i64>,
    in_doubt: usize,
    /// Why the session's rows could not be read (a failed seal): the row is still listed.
    #[serde(skip_serializing_if = "Option::is_none")]
    problem: Option<String>,
}

/// A row of `sessions`: a session read whole, or one this release cannot read (an
/// unknown status), listed with its raw status so that it hides neither itself nor the
/// others.
#[derive(Serialize)]
#[serde(untagged)]
enum Listed {
    Session(Box<SessionLine>),
    Unreadable {
        id: SessionId,
        /// Always `unknown`.
        status: &'static str,
        raw_status: String,
        in_doubt: usize,
        problem: String,
    },
}

/// Rows the long listings read from the store at a time: what they hold in memory.
const PAGE: usize = 200;

pub async fn sessions(
    store: &dyn CheckpointStore,
    json: bool,
    args: SessionsArgs,
) -> Result<(), CliError> {
    let now = store.now().await?;
    let mut base =
        SessionFilter::new().with_statuses(args.status.iter().map(|&s| s.into()).collect());
    if let Some(d) = args.older_than {
        base = base.with_updated_before(now.saturating_sub(ms(d)));
    }
    // Newest first: the sessions updated within the window are a prefix of the listing.
    let since = args.newer_than.map(|within| now.saturating_sub(ms(within)));
    let limit = match args.limit {
        0 => usize::MAX,
        n => usize::try_from(n).unwrap_or(usize::MAX),
    };
    let mut doubt: HashMap<SessionId, usize> = HashMap::new();
    for call in store.in_doubt(None).await? {
        *doubt.entry(call.identity.session).or_default() += 1;
    }
    let mut table = render::StreamTable::new([
        "SESSION",
        "STATUS",
        "APP VERSION",
        "LEASE",
        "CHECKPOINT",
        "UPDATED",
        "IN DOUBT",
    ]);
    let mut array = json.then(render::JsonArray::begin);
    let mut cursor = args.after;
    let (mut shown, mut broken, mut unreadable) = (0usize, 0usize, 0usize);
    let mut more = None;
    loop {
        let want = (limit - shown).min(PAGE);
        let page_filter = |limit: usize| {
            let mut filter = base
                .clone()
                .with_limit(i64::try_from(limit).unwrap_or(i64::MAX));
            if let Some(after) = &cursor {
                filter = filter.with_after(after.clone());
            }
            filter
        };
        if want == 0 {
            // The limit is reached: say whether a next page exists.
            let next = store.list_session_rows(&page_filter(1)).await?;
            if next.iter().any(|s| since.is_none_or(|t| listed_at(s) >= t)) {
                more = cursor.clone();
            }
            break;
        }
        let page = store.list_session_rows(&page_filter(want)).await?;
        let full = page.len() == want;
        let mut lines = Vec::with_capacity(page.len());
        let mut past_window = false;
        for row in page {
            if since.is_some_and(|t| listed_at(&row) < t) {
                past_window = true;
                break;
            }
            cursor = Some(SessionCursor::of(&row));
            match row {
                ListedSession::Read(session) => lines.push(Listed::Session(Box::new(
                    session_line(store, *session, now, &doubt).await?,
                ))),
                ListedSession::Unreadable {
                    id,
                    raw_status,
                    problem,
                    ..
                } => {
                    unreadable += 1;
                    lines.push(Listed::Unreadable {
                        in_doubt: doubt.get(&id).copied().unwrap_or(0),
                        id,
                        status: "unknown",
                        raw_status,
                        problem,
                    });
                }
                other => {
                    return Err(CliError::new(
                        Code::Failure,
                        format!("a session row of a kind this release does not list: {other:?}"),
                    ));
                }
            }
        }
        shown += lines.len();
        broken += lines
            .iter()
            .filter(|l| matches!(l, Listed::Session(l) if l.problem.is_some()))
            .count();
        match &mut array {
            Some(array) => {
                for line in &lines {
                    array.item(line)?;
                }
            }
            None => table.page(
                &lines
                    .iter()
                    .map(|l| session_row(l, now))
                    .collect::<Vec<_>>(),
            ),
        }
        if past_window || !full {
            break;
        }
    }
    match array {
        Some(array) => array.end(),
        None if shown == 0 => outln!("no sessions match"),
        None => {}
    }
    if unreadable > 0 && !json {
        outln!();
        outln!(
            "{unreadable} session{} with a status this release does not know (written by a newer release of durable, or changed outside it): \
             listed as `unknown`; acting on {} fails until `durable` is upgraded or the row is repaired",
            if unreadable == 1 { "" } else { "s" },
            if unreadable == 1 { "it" } else { "them" }
        );
    }
    if let Some(cursor) = more {
        eprintln!(
            "more sessions: add `--after {}` for the next page",
            crate::display::escape(&cursor.to_string())
        );
    }
    if broken == 0 {
        return Ok(());
    }
    Err(CliError::new(
        Code::Integrity,
        format!(
            "{broken} session{} failed the integrity check (marked TAMPERED); run `durable verify` for the reasons",
            if broken == 1 { "" } else { "s" }
        ),
    ))
}

/// A session with what `sessions` adds to it.
async fn session_line(
    store: &dyn CheckpointStore,
    session: SessionRecord,
    now: i64,
    doubt: &HashMap<SessionId, usize>,
) -> Result<SessionLine, CliError> {
    let mut problem = None;
    let last_checkpoint_at = match store.list_checkpoints(&session.id).await {
        Ok(metas) => metas.last().map(|m| m.created_at),
        // Deleted meanwhile (a concurrent prune): show the row without it.
        Err(StoreError::SessionNotFound(_)) => None,
        // One broken session does not hide the others: listed, marked, and the
        // command fails at the end.
        Err(e @ (StoreError::Tampered { .. } | StoreError::Corrupt { .. })) => {
            problem = Some(e.to_string());
            None
        }
        Err(e) => return Err(e.into()),
    };
    Ok(SessionLine {
        lease_live: session.lease_expires_at.is_some_and(|t| t > now),
        in_doubt: doubt.get(&session.id).copied().unwrap_or(0),
        last_checkpoint_at,
        problem,
        session,
    })
}

/// When a listed row was last updated (an unreadable row's, as stored).
fn listed_at(row: &ListedSession) -> i64 {
    match row {
        ListedSession::Read(s) => s.updated_at,
        ListedSession::Unreadable { updated_at, .. } => *updated_at,
        _ => i64::MIN,
    }
}

/// A row in the `sessions` table.
fn session_row(l: &Listed, now: i64) -> Vec<String> {
    let l = match l {
        Listed::Session(l) => l,
        Listed::Unreadable {
            id,
            raw_status,
            in_doubt,
            ..
        } => {
            return vec![
                clip(id.as_str(), ID),
                format!("unknown (`{}`)", clip(raw_status, 40)),
                "?".into(),
                "?".into(),
                "?".into(),
                "?".into(),
                in_doubt.to_string(),
            ];
        }
    };
    let s = &l.session;
    let lease = match (&s.lease_owner, s.lease_expires_at) {
        (Some(owner), Some(until)) if l.lease_live => {
            format!("{} (live, expires {})", clip(owner, NAME), age(until, now))
        }
        (Some(owner), _) => format!("{} (expired)", clip(owner, NAME)),
        (None, _) => "-".into(),
    };
    let checkpoint = match l.last_checkpoint_at {
        _ if l.problem.is_some() => "TAMPERED".to_owned(),
        Some(at) => format!("v{} {}", s.latest_version, age(at, now)),
        None => format!("v{}", s.latest_version),
    };
    let mut status = s.status.as_str().to_owned();
    if let Some(reason) = &s.status_reason {
        status.push_str(&format!(" ({})", clip(reason, 40)));
    }
    vec![
        clip(s.id.as_str(), ID),
        status,
        clip(&s.app_version, NAME),
        lease,
        checkpoint,
        age(s.updated_at, now),
        l.in_doubt.to_string(),
    ]
}

#[derive(Serialize)]
struct CheckpointLine {
    #[serde(flatten)]
    meta: CheckpointMeta,
    plan_progress: String,
    budget: Value,
}

pub async fn show(store: &dyn CheckpointStore, json: bool, args: ShowArgs) -> Result<(), CliError> {
    let id = SessionId::new(args.session);
    let session = store.session(&id).await?;
    let now = store.now().await?;
    let checkpoint = store.load_checkpoint(&id, args.version).await?;
    let metas = store.list_checkpoints(&id).await?;
    let shown = if args.checkpoints == 0 {
        metas.len()
    } else {
        args.checkpoints.min(metas.len())
    };
    let mut lines = Vec::with_capacity(shown);
    for meta in metas.iter().rev().take(shown) {
        let (plan, budget) = if meta.version == checkpoint.meta.version {
            (checkpoint.plan.clone(), checkpoint.budget.clone())
        } else {
            match store.load_checkpoint(&id, Some(meta.version)).await {
                Ok(cp) => (cp.plan, cp.budget),
                Err(StoreError::Corrupt { detail, .. }) => {
                    (json!({"unreadable": detail}), Value::Null)
                }
                Err(e) => return Err(e.into()),
            }
        };
        lines.push(CheckpointLine {
            meta: meta.clone(),
            plan_progress: render::plan_progress(&plan),
            budget,
        });
    }
    let in_doubt = store.in_doubt(Some(&id)).await?;
    let awaiting = store.pending_approvals(Some(&id)).await?;
    let resolutions = store.resolutions(&id).await?;
    let errors = store.errors(&id).await?;
    let total = checkpoint.messages.len();
    let tail_from = total.saturating_sub(args.tail);
    // Only the tail is parsed (messages are stored text); one that is not JSON is the
    // same error a corrupt row is.
    let shown_messages = (tail_from + 1..)
        .zip(&checkpoint.messages[tail_from..])
        .map(|(position, message)| {
            message.to_value().map_err(|e| StoreError::Corrupt {
                session: id.clone(),
                version: Some(checkpoint.meta.version),
                detail: format!("message {position} is not valid JSON: {e}"),
            })
        })
        .collect::<Result<Vec<Value>, _>>()?;
    let tail: Vec<Value> = shown_messages.iter().map(mask).collect();

    let asleep = crate::workers::asleep(&session, now);
    // Spend against each ceiling: the latest checkpoint's budget with the turn under way
    // and the operator's raises.
    let standing = durable::budget::session_budget(store, &id).await?;
    // The family: its parent and children with their status (a store without child
    // sessions has none).
    let children = match store.children(&id).await {
        Ok(children) => children,
        Err(StoreError::Unsupported { .. }) => Vec::new(),
        Err(e) => return Err(e.into()),
    };
    // Signals sent and not read yet (a store without signals has none).
    let pending_signals = match store.signals(&id).await {
        Ok(mut signals) => {
            signals.retain(|s| s.is_pending());
            Some(signals)
        }
        Err(StoreError::Unsupported { .. }) => None,
        Err(e) => return Err(e.into()),
    };
    let parent = match &session.parent {
        Some(parent) => Some(store.session(parent).await?),
        None => None,
    };
    let children_json: Vec<Value> = children
        .iter()
        .map(|c| {
            json!({
                "session": c.session.id,
                "status": c.session.status,
                "status_reason": c.session.status_reason,
                "operator_needed": c.operator_needed,
            })
        })
        .collect();
    if json {
        return render::print_json(&json!({
            "session": session,
            "parent": parent.as_ref().map(|p| json!({ "session": p.id, "status": p.status })),
            "children": children_json,
            "pending_signals": pending_signals,
            "asleep": asleep,
            "version": checkpoint.meta.version,
            "checkpoints": lines,
            "plan": checkpoint.plan,
            "budget": checkpoint.budget,
            "spend": crate::budget::standing_json(&standing),
            "state": mask(&checkpoint.state),
            "message_count": total,
            "transcript_tail": tail,
            "in_doubt": in_doubt.iter().map(call_json).collect::<Vec<_>>(),
            "awaiting_approval": awaiting.iter().map(|p| call_json(&p.call)).collect::<Vec<_>>(),
            "resolutions": resolutions,
            "errors": errors,
        }));
    }

    outln!("session      {}", clip(session.id.as_str(), ID));
    let mut status = session.status.as_str().to_owned();
    if let Some(reason) = &session.status_reason {
        status.push_str(&format!(" ({})", clip(reason, TEXT)));
    }
    outln!("status       {status}");
    outln!("app version  {}", clip(&session.app_version, NAME));
    outln!("queue        {}", clip(&session.queue, NAME));
    if let Some(until) = session.wake_at.filter(|_| asleep) {
        outln!(
            "asleep until {} ({}); `durable wake {}` ends the sleep now",
            render::time(until),
            age(until, now),
            clip(id.as_str(), ID)
        );
    }
    let renewed = session
        .lease_renewed_at
        .map(|at| format!(", last renewed {}", age(at, now)))
        .unwrap_or_default();
    match (&session.lease_owner, session.lease_expires_at) {
        (Some(owner), Some(until)) if until > now => {
            outln!(
                "lease        {}, live, expires {}{renewed}",
                clip(owner, NAME),
                age(until, now)
            );
        }
        (Some(owner), _) => outln!("lease        {}, expired{renewed}", clip(owner, NAME)),
        (None, _) => outln!("lease        -"),
    }
    outln!(
        "created      {} ({})",
        render::time(session.created_at),
        age(session.created_at, now)
    );
    outln!(
        "updated      {} ({})",
        render::time(session.updated_at),
        age(session.updated_at, now)
    );
    if session.recovery_attempts > 0 {
        outln!("recoveries   {}", session.recovery_attempts);
    }
    if let Some(parent) = &parent {
        outln!(
            "parent       {} ({})",
            clip(parent.id.as_str(), ID),
            parent.status.as_str()
        );
    }
    if let Some(until) = session.waiting_until.filter(|&at| at > now) {
        let what = match session.waiting_for.as_deref() {
            Some(durable::store::WAITING_FOR_CHILDREN) => "for its children".to_owned(),
            Some(durable::store::WAITING_FOR_DEADLINE) => "for its turn".to_owned(),
            Some(other) => match other.strip_prefix(durable::store::WAITING_FOR_SIGNAL) {
                Some(name) => format!(
                    "for signal `{}` (`durable signal send {} {}` sends it)",
                    clip(name, NAME),
                    clip(id.as_str(), ID),
                    clip(name, NAME)
                ),
                None => format!("for {}", clip(other, NAME)),
            },
            None => "for its children".to_owned(),
        };
        outln!(
            "waiting      {what}; a worker looks again {} at the latest",
            age(until, now)
        );
    }
    if let Some(pending) = pending_signals.as_ref().filter(|p| !p.is_empty()) {
        outln!(
            "signals      {} pending (`durable signal list {}`)",
            pending.len(),
            clip(id.as_str(), ID)
        );
    }
    if let Some(request) = session
        .cancel_requested
        .as_ref()
        .filter(|_| !session.status.is_terminal())
    {
        outln!(
            "cancelling   asked by {} {}: {}; it stops at its next safe point",
            clip(&request.by, NAME),
            age(request.at, now),
            clip(&request.reason, TEXT)
        );
    }
    if !session.metadata.is_null() {
        outln!("metadata     {}", render::compact(&session.metadata, 200));
    }

    if !children.is_empty() {
        outln!();
        outln!(
            "Children ({}; `durable cancel {}` cancels them with it)",
            children.len(),
            clip(id.as_str(), ID)
        );
        for child in &children {
            let mut status = child.session.status.as_str().to_owned();
            if child.operator_needed {
                status.push_str(", waits for an operator");
            }
            if let Some(reason) = &child.session.status_reason {
                status.push_str(&format!(" ({})", clip(reason, TEXT)));
            }
            outln!("  {}  {status}", clip(child.session.id.as_str(), ID));
        }
    }
    outln!();
    if shown < metas.len() {
        outln!(
            "Checkpoints (newest {shown} of {}; --checkpoints 0 for all)",
            metas.len()
        );
    } else {
        outln!("Checkpoints");
    }
    let mut t = table([
        "VERSION",
        "CREATED",
        "MESSAGES",
        "PLAN",
        "BUDGET",
        "APP VERSION",
    ]);
    for line in &lines {
        let m = &line.meta;
        t.add_row(vec![
            m.version.to_string(),
            render::time(m.created_at),
            m.message_count.to_string(),
            line.plan_progress.clone(),
            render::budget(&line.budget),
            clip(&m.app_version, NAME),
        ]);
    }
    render::print_table(&t);

    let version = checkpoint.meta.version;
    outln!();
    outln!("Plan (version {version})");
    match serde_json::from_value::<Plan>(checkpoint.plan.clone()) {
        Ok(plan) if plan.is_empty() => outln!("  (no plan)"),
        Ok(plan) => {
            for line in plan.to_markdown().lines() {
                outln!("{}", clip(format!("  {line}").trim_end(), PLAN_LINE));
            }
        }
        Err(e) => outln!(
            "  (does not deserialize as a plan: {})",
            clip(&e.to_string(), TEXT)
        ),
    }
    outln!();
    outln!("Budget (version {version}) with the calls since");
    crate::budget::print_standing(&standing);

    outln!();
    if tail_from > 0 {
        outln!(
            "Transcript (version {version}, last {} of {total} messages)",
            total - tail_from
        );
    } else {
        outln!(
            "Transcript (version {version}, {total} message{})",
            if total == 1 { "" } else { "s" }
        );
    }
    for (i, message) in shown_messages.iter().enumerate() {
        let (role, lines) = render::message_lines(message);
        let number = format!("#{}", tail_from + i + 1);
        if lines.is_empty() {
            outln!("  {number:>4} {role:<9}");
        }
        for (j, line) in lines.iter().enumerate() {
            if j == 0 {
                outln!("  {number:>4} {role:<9} {line}");
            } else {
                outln!("  {:>4} {:<9} {line}", "", "");
            }
        }
    }

    if !in_doubt.is_empty() {
        outln!();
        outln!(
            "In doubt ({}): resolve with `durable resolve <call> …`",
            in_doubt.len()
        );
        print_in_doubt(&in_doubt, now, false);
    }
    if !awaiting.is_empty() {
        outln!();
        outln!(
            "Awaiting approval ({}): `durable approvals --session {}` shows each request; decide with `durable approve <call>` or `durable deny <call> --reason …`",
            awaiting.len(),
            clip(id.as_str(), ID)
        );
        let mut t = table(["CALL", "STEP", "TOOL", "REQUESTED", "DEADLINE", "ARGS"]);
        for p in &awaiting {
            let c = &p.call;
            let approval = c.approval.as_ref();
            let deadline = match approval.and_then(|a| a.deadline) {
                None => "-".to_owned(),
                Some(at) if p.expired => format!("expired {}", age(at, now)),
                Some(at) => age(at, now),
            };
            t.add_row(vec![
                clip(c.id.as_str(), ID),
                c.identity.step.to_string(),
                clip(&c.identity.tool, NAME),
                approval.map_or_else(|| "-".to_owned(), |a| age(a.requested_at, now)),
                deadline,
                render::compact(&c.args, 80),
            ]);
        }
        render::print_table(&t);
    }
    if !resolutions.is_empty() {
        outln!();
        outln!("Resolutions");
        let mut t = table(["CALL", "DECISION", "BY", "AT", "NOTE"]);
        for r in &resolutions {
            let decision = match &r.resolution {
                durable::store::Resolution::Happened { result } => {
                    format!("happened {}", render::compact(result, 60))
                }
                durable::store::Resolution::DidNotHappen => "did not happen".into(),
            };
            t.add_row(vec![
                clip(r.call.as_str(), ID),
                decision,
                clip(&r.by, NAME),
                render::time(r.at),
                clip(r.note.as_deref().unwrap_or_default(), TEXT),
            ]);
        }
        render::print_table(&t);
    }
    if !errors.is_empty() {
        outln!();
        outln!("Errors (last 5 of {})", errors.len());
        for e in errors.iter().rev().take(5).rev() {
            outln!(
                "  {} step {} {} attempt {}: {}",
                render::time(e.at),
                e.step,
                clip(&e.context, NAME),
                e.attempt,
                clip(&e.message, PLAN_LINE)
            );
        }
    }
    Ok(())
}

/// A journal row for output: arguments (those asked and those an approval edited in)
/// masked, result replaced by its size in tables.
pub(crate) fn masked_call(call: &CallRecord) -> CallRecord {
    let mut approval = call.approval.clone();
    if let Some(Decided {
        decision: ApprovalDecision::Approve { args: Some(args) },
        ..
    }) = approval.as_mut().and_then(|a| a.decision.as_mut())
    {
        *args = mask(args);
    }
    CallRecord {
        args: mask(&call.args),
        result: call.result.as_ref().map(mask),
        approval,
        ..call.clone()
    }
}

/// A journal row as JSON ([`masked_call`]), with its arguments labelled apart:
/// `requested_args` (what the model asked for, the row's `args`) and `approved_args` (the
/// arguments a person edited in when approving, which the call ran with; `null` when the
/// approval edited nothing or there was none).
pub(crate) fn call_json(call: &CallRecord) -> Value {
    let masked = masked_call(call);
    let approved = masked
        .approval
        .as_ref()
        .and_then(|a| a.edited_args())
        .cloned()
        .unwrap_or(Value::Null);
    let mut value = serde_json::to_value(&masked).unwrap_or(Value::Null);
    if let Some(fields) = value.as_object_mut() {
        fields.insert("requested_args".into(), masked.args.clone());
        fields.insert("approved_args".into(), approved);
    }
    value
}

/// A row's arguments in a table cell: the requested ones, and beside them, labelled, the
/// ones a person edited in when approving (which the call runs with).
fn args_cell(call: &CallRecord, width: usize) -> String {
    match call.approval.as_ref().and_then(|a| a.edited_args()) {
        Some(edited) => format!(
            "requested arguments {} · approved (edited) arguments {}",
            render::compact(&call.args, width / 2),
            render::compact(edited, width / 2)
        ),
        None => render::compact(&call.args, width),
    }
}

fn result_size(call: &CallRecord) -> String {
    match (&call.result, &call.error) {
        (Some(v), _) => render::size(v.to_string().len()),
        (None, Some(e)) => format!("error, {}", render::size(e.to_string().len())),
        (None, None) => "-".into(),
    }
}

pub async fn calls(
    store: &dyn CheckpointStore,
    json: bool,
    args: CallsArgs,
) -> Result<(), CliError> {
    let id = SessionId::new(args.session);
    store.session(&id).await?;
    let now = store.now().await?;
    let in_doubt: HashSet<CallId> = store
        .in_doubt(Some(&id))
        .await?
        .into_iter()
        .map(|c| c.id)
        .collect();
    let limit = match args.limit {
        None | Some(0) => usize::MAX,
        Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
    };
    let mut table = render::StreamTable::new([
        "CALL", "STEP", "TOOL", "CLASS", "STATUS", "KEY", "ATTEMPT", "ISSUED", "TOOK", "RESULT",
    ]);
    let mut array = json.then(render::JsonArray::begin);
    // Rows approved with edited arguments: listed again after the table, both sets
    // labelled (few; only their ids, tools and arguments are kept).
    let mut edited: Vec<(CallId, String, Value, Value)> = Vec::new();
    let mut print = |rows: &[CallRecord]| -> Result<(), CliError> {
        for c in rows {
            if let Some(approved) = c.approval.as_ref().and_then(|a| a.edited_args()) {
                let masked = masked_call(c);
                let approved_masked = masked
                    .approval
                    .as_ref()
                    .and_then(|a| a.edited_args())
                    .cloned()
                    .unwrap_or_else(|| approved.clone());
                edited.push((
                    c.id.clone(),
                    c.identity.tool.clone(),
                    masked.args,
                    approved_masked,
                ));
            }
        }
        match &mut array {
            Some(array) => {
                for row in rows {
                    array.item(&call_json(row))?;
                }
            }
            None => table.page(
                &rows
                    .iter()
                    .map(|c| call_row(c, now, &in_doubt))
                    .collect::<Vec<_>>(),
            ),
        }
        Ok(())
    };
    let mut shown = 0usize;
    let mut more = None;
    if let Some(step) = args.step {
        // One step's rows, read together: their checks span the step.
        let rows = store.calls(&id, Some(step)).await?;
        shown = rows.len().min(limit);
        print(&rows[..shown])?;
    } else {
        // The journal page by page, by position: one page in memory at a time.
        let mut position = i64::try_from(args.after.unwrap_or(0)).unwrap_or(i64::MAX);
        loop {
            let want = (limit - shown).min(PAGE);
            if want == 0 {
                if !store.calls_page(&id, position, 1).await?.is_empty() {
                    more = Some(position);
                }
                break;
            }
            let page = store
                .calls_page(&id, position, i64::try_from(want).unwrap_or(i64::MAX))
                .await?;
            position = position.saturating_add(i64::try_from(page.len()).unwrap_or(i64::MAX));
            shown += page.len();
            print(&page)?;
            if page.len() < want {
                break;
            }
        }
    }
    let json = array.is_some();
    match array {
        Some(array) => array.end(),
        None if shown == 0 => outln!("no journal rows"),
        None => {}
    }
    if !json && !edited.is_empty() {
        // A row approved with edited arguments ran with the edit: its result is the
        // edited call's. Both sets of arguments, labelled.
        outln!();
        outln!(
            "Approved with edited arguments (the call runs, and its result is, with the approved ones):"
        );
        for (call, tool, requested, approved) in &edited {
            outln!("  {} ({})", clip(call.as_str(), ID), clip(tool, NAME));
            outln!(
                "    requested arguments          {}",
                render::compact(requested, 200)
            );
            outln!(
                "    approved (edited) arguments  {}",
                render::compact(approved, 200)
            );
        }
    }
    if let Some(position) = more {
        eprintln!(
            "more rows: add `--after {position}` for the next page (`durable calls {} --after {position}`)",
            clip(id.as_str(), ID)
        );
    }
    Ok(())
}

/// A journal row in the `calls` table.
fn call_row(c: &CallRecord, now: i64, in_doubt: &HashSet<CallId>) -> Vec<String> {
    let status = if in_doubt.contains(&c.id) {
        "issued (in doubt)".to_owned()
    } else {
        c.status.as_str().to_owned()
    };
    let took = c.finished_at.map_or_else(
        || "-".to_owned(),
        |f| render::coarse(u64::try_from(f - c.issued_at).unwrap_or(0)),
    );
    vec![
        clip(c.id.as_str(), ID),
        c.identity.step.to_string(),
        clip(&c.identity.tool, NAME),
        c.class.as_str().to_owned(),
        status,
        c.idempotency_key
            .as_deref()
            .map_or_else(|| "-".into(), |k| clip(k, ID)),
        c.attempt.to_string(),
        age(c.issued_at, now),
        took,
        result_size(c),
    ]
}

fn print_in_doubt(calls: &[CallRecord], now: i64, with_session: bool) {
    let mut header = vec!["CALL"];
    if with_session {
        header.push("SESSION");
    }
    header.extend(["STEP", "TOOL", "CLASS", "ATTEMPT", "ISSUED", "ARGS"]);
    let mut t = table(header);
    for c in calls {
        let mut row = vec![clip(c.id.as_str(), ID)];
        if with_session {
            row.push(clip(c.identity.session.as_str(), ID));
        }
        row.extend([
            c.identity.step.to_string(),
            clip(&c.identity.tool, NAME),
            c.class.as_str().to_owned(),
            c.attempt.to_string(),
            age(c.issued_at, now),
            args_cell(c, 80),
        ]);
        t.add_row(row);
    }
    render::print_table(&t);
}

pub async fn in_doubt(
    store: &dyn CheckpointStore,
    json: bool,
    args: InDoubtArgs,
) -> Result<(), CliError> {
    let session = args.session.map(SessionId::new);
    if let Some(id) = &session {
        store.session(id).await?;
    }
    let calls: Vec<CallRecord> = store
        .in_doubt(session.as_ref())
        .await?
        .into_iter()
        .filter(|c| c.status == CallStatus::Issued)
        .collect();
    if json {
        return render::print_json(&calls.iter().map(call_json).collect::<Vec<_>>());
    }
    if calls.is_empty() {
        outln!("no calls in doubt");
        return Ok(());
    }
    let now = store.now().await?;
    print_in_doubt(&calls, now, true);
    outln!();
    outln!(
        "Decide each one: durable resolve <CALL> --happened --result <JSON>  |  --did-not-happen"
    );
    Ok(())
}
