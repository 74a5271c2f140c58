//! Calls awaiting a person's approval: `approvals` (and `approvals --expire`), `approve`
//! and `deny`, through the runtime's [`Operator::approvals`](durable::Operator::approvals), [`Operator::approve`](durable::Operator::approve),
//! [`Operator::deny`](durable::Operator::deny) and [`Operator::expire_approvals`](durable::Operator::expire_approvals).

use std::sync::Arc;

use durable::store::{ApprovalDecision, CallRecord, CallStatus, PendingApproval, SessionStatus};
use durable::{CallId, CheckpointStore, Durable, DurableError, SessionId, StoreError};
use serde::Serialize;
use serde_json::{Value, json};

use crate::display::{ID, NAME, clip};
use crate::error::{CliError, Code};
use crate::inspect::masked_call;
use crate::operate::{CLI_OWNER, read_json};
use crate::render::{self, age, mask, table};
use crate::{ApprovalsArgs, ApproveArgs, DenyArgs, operator};

/// Width of one line of reasoning or arguments in the listing.
const LINE: usize = 160;
/// Lines of reasoning shown per request (`--json` has all of it).
const REASONING_LINES: usize = 20;
/// Lines of pretty-printed arguments shown per request.
const ARGUMENT_LINES: usize = 40;
/// Width of the one-line arguments in a decision's report.
const ARGS: usize = 400;

/// The runtime the decisions go through; it writes no session of its own.
fn runtime(store: &Arc<dyn CheckpointStore>) -> Durable {
    Durable::builder(Arc::clone(store)).owner(CLI_OWNER).build()
}

/// A request as `approvals --json` lists it: the journal row, masked, and whether its
/// deadline passed.
#[derive(Serialize)]
struct PendingLine {
    #[serde(flatten)]
    call: CallRecord,
    expired: bool,
}

/// `durable approvals [--session S] [--expire]`.
pub async fn approvals(
    store: &Arc<dyn CheckpointStore>,
    json: bool,
    args: ApprovalsArgs,
) -> Result<(), CliError> {
    let session = args.session.map(SessionId::new);
    if let Some(id) = &session {
        store.session(id).await?;
    }
    let durable = runtime(store);
    if args.expire {
        return expire(store, &durable, session.as_ref(), json).await;
    }
    let pending = durable.operator().approvals(session.as_ref()).await?;
    if json {
        let lines: Vec<PendingLine> = pending
            .iter()
            .map(|p| PendingLine {
                call: masked_call(&p.call),
                expired: p.expired,
            })
            .collect();
        return render::print_json(&lines);
    }
    if pending.is_empty() {
        outln!("no calls awaiting approval");
        return Ok(());
    }
    let now = store.now().await?;
    for (i, p) in pending.iter().enumerate() {
        if i > 0 {
            outln!();
        }
        print_request(p, now);
    }
    outln!();
    outln!(
        "Decide each one: durable approve <CALL> [--args <JSON>] [--note <TEXT>]  |  durable deny <CALL> --reason <TEXT>"
    );
    let expired = pending.iter().filter(|p| p.expired).count();
    if expired > 0 {
        outln!(
            "{expired} request{} past the deadline: `durable approvals --expire` denies {}",
            if expired == 1 { " is" } else { "s are" },
            if expired == 1 { "it" } else { "them" }
        );
    }
    Ok(())
}

/// Prints `label` before the first line and aligns the others under it.
fn field(label: &str, lines: &[String]) {
    for (i, line) in lines.iter().enumerate() {
        let label = if i == 0 { label } else { "" };
        outln!("{label:<10} {line}");
    }
}

/// One request, as a block of labelled lines: store text escaped and clipped, arguments
/// masked.
fn print_request(p: &PendingApproval, now: i64) {
    let c = &p.call;
    field("call", &[clip(c.id.as_str(), ID)]);
    field(
        "session",
        &[format!(
            "{} (step {})",
            clip(c.identity.session.as_str(), ID),
            c.identity.step
        )],
    );
    field(
        "tool",
        &[format!(
            "{} ({})",
            clip(&c.identity.tool, NAME),
            c.class.as_str()
        )],
    );
    let Some(approval) = &c.approval else {
        field("requested", &["(no approval request recorded)".into()]);
        return;
    };
    field(
        "requested",
        &[format!(
            "{} ({}) by {}",
            render::time(approval.requested_at),
            age(approval.requested_at, now),
            clip(&approval.asked_by, NAME)
        )],
    );
    let deadline = match approval.deadline {
        None => "none".to_owned(),
        Some(at) if p.expired => format!("{} (expired {})", render::time(at), age(at, now)),
        Some(at) => format!("{} ({})", render::time(at), age(at, now)),
    };
    field("deadline", &[deadline]);
    if let Some(reasoning) = &approval.reasoning {
        // Untrusted model text: every line escaped and clipped, a `\r` shown, not obeyed.
        let all: Vec<&str> = reasoning.trim_end().split('\n').collect();
        let mut lines: Vec<String> = all
            .iter()
            .take(REASONING_LINES)
            .map(|l| clip(l, LINE))
            .collect();
        if all.len() > REASONING_LINES {
            lines.push(format!(
                "… {} more lines (--json has the whole text)",
                all.len() - REASONING_LINES
            ));
        }
        field("reasoning", &lines);
    }
    field("arguments", &pretty(&c.args));
}

/// `value` masked and pretty-printed, each line escaped and clipped.
fn pretty(value: &Value) -> Vec<String> {
    let text = serde_json::to_string_pretty(&mask(value)).unwrap_or_else(|e| e.to_string());
    let all: Vec<&str> = text.lines().collect();
    let mut lines: Vec<String> = all
        .iter()
        .take(ARGUMENT_LINES)
        .map(|l| clip(l, LINE))
        .collect();
    if all.len() > ARGUMENT_LINES {
        lines.push(format!(
            "… {} more lines (--json has them all)",
            all.len() - ARGUMENT_LINES
        ));
    }
    lines
}

/// `approvals --expire`: denies every request past its deadline, by the deadline.
async fn expire(
    store: &Arc<dyn CheckpointStore>,
    durable: &Durable,
    session: Option<&SessionId>,
    json: bool,
) -> Result<(), CliError> {
    let expired = durable.operator().expire_approvals(session).await?;
    let waiting = durable.operator().approvals(session).await?.len();
    if json {
        return render::print_json(&json!({
            "expired": expired.iter().map(masked_call).collect::<Vec<_>>(),
            "still_awaiting": waiting,
        }));
    }
    if expired.is_empty() {
        outln!("no request is past its deadline; nothing was expired");
    } else {
        let now = store.now().await?;
        let mut t = table(["CALL", "SESSION", "TOOL", "DEADLINE", "ARGS"]);
        for c in &expired {
            let deadline = c
                .approval
                .as_ref()
                .and_then(|a| a.deadline)
                .map_or_else(|| "-".to_owned(), |at| age(at, now));
            t.add_row(vec![
                clip(c.id.as_str(), ID),
                clip(c.identity.session.as_str(), ID),
                clip(&c.identity.tool, NAME),
                deadline,
                render::compact(&c.args, 80),
            ]);
        }
        render::print_table(&t);
        outln!(
            "expired {} request{}: denied by the deadline, never run; the next resume tells the model the request expired",
            expired.len(),
            if expired.len() == 1 { "" } else { "s" }
        );
    }
    if waiting > 0 {
        outln!(
            "{waiting} request{} still await{} a decision: `durable approvals` lists them",
            if waiting == 1 { "" } else { "s" },
            if waiting == 1 { "s" } else { "" }
        );
    }
    Ok(())
}

/// The call, if it awaits a decision; else a refusal naming its status.
async fn awaiting(store: &Arc<dyn CheckpointStore>, id: &CallId) -> Result<CallRecord, CliError> {
    let call = store.call(id).await?;
    if call.status == CallStatus::Requested {
        return Ok(call);
    }
    Err(not_awaiting(&call))
}

/// Why `call` cannot be decided: its status, and who decided it if someone did.
fn not_awaiting(call: &CallRecord) -> CliError {
    let decided = call.approval.as_ref().and_then(|a| a.decision.as_ref());
    let what = match decided {
        Some(d) => match &d.decision {
            ApprovalDecision::Approve { .. } => format!(
                "it was already approved by {} at {}",
                clip(&d.by, NAME),
                render::time(d.at)
            ),
            ApprovalDecision::Deny { .. } => format!(
                "it was already denied by {} at {}",
                clip(&d.by, NAME),
                render::time(d.at)
            ),
            ApprovalDecision::Revoke { .. } => format!(
                "its approval was revoked by {} at {}",
                clip(&d.by, NAME),
                render::time(d.at)
            ),
            ApprovalDecision::Expire => {
                format!("it expired undecided at {}", render::time(d.at))
            }
        },
        None => "it never needed a decision".to_owned(),
    };
    CliError::new(
        Code::Refused,
        format!(
            "call `{}` (`{}`) is not awaiting approval (status `{}`): {what}; nothing was decided",
            clip(call.id.as_str(), ID),
            clip(&call.identity.tool, NAME),
            call.status.as_str()
        ),
    )
}

/// A decision the runtime refused, as the operator reads it.
async fn refused(store: &Arc<dyn CheckpointStore>, call: &CallRecord, e: DurableError) -> CliError {
    let shown_id = clip(call.id.as_str(), ID);
    let tool = clip(&call.identity.tool, NAME);
    match e {
        DurableError::InvalidEdit { path, detail, .. } => CliError::new(
            Code::InvalidInput,
            format!(
                "edited arguments refused at {path}: {detail}; nothing was decided (call `{shown_id}`, `{tool}`)"
            ),
        ),
        DurableError::Store(StoreError::ApprovalExpired { deadline, .. }) => CliError::new(
            Code::Refused,
            format!(
                "the approval request of call `{shown_id}` (`{tool}`) expired at {}: it can no longer be approved or denied; `durable approvals --expire` denies it by the deadline",
                render::time(deadline)
            ),
        ),
        // Decided by someone else between our read and our decision.
        DurableError::Store(StoreError::NotAwaitingApproval { .. }) => {
            match store.call(&call.id).await {
                Ok(now) => not_awaiting(&now),
                Err(e) => e.into(),
            }
        }
        other => other.into(),
    }
}

/// `edit` with what the listing's mask hid put back: a placeholder kept as shown means
/// "unchanged" (see [`unmask_displayed`](durable::secret::unmask_displayed)).
fn unhide(edit: &Value, requested: &Value) -> Value {
    durable::secret::unmask_displayed(edit.clone(), requested)
}

/// Where the session stands after a decision: its status, and how many of its calls
/// still await one.
async fn session_after(
    durable: &Durable,
    session: &SessionId,
) -> Result<(SessionStatus, usize), CliError> {
    let status = durable.store().session(session).await?.status;
    let waiting = durable.operator().approvals(Some(session)).await?.len();
    Ok((status, waiting))
}

fn print_session_after(session: &SessionId, status: SessionStatus, waiting: usize) {
    let shown = clip(session.as_str(), ID);
    if waiting > 0 {
        outln!(
            "session `{shown}` still awaits {waiting} decision{} (`durable approvals --session {shown}`)",
            if waiting == 1 { "" } else { "s" }
        );
    } else if status == SessionStatus::Active {
        outln!("session `{shown}` is active again: the next resume continues it");
    } else {
        outln!("session `{shown}` is {}", status.as_str());
    }
}

/// `durable approve <CALL> [--args …] [--note …] [--by …]`.
pub async fn approve(
    store: &Arc<dyn CheckpointStore>,
    json: bool,
    args: ApproveArgs,
) -> Result<(), CliError> {
    let by = operator(args.by)?;
    // Input first: malformed JSON is refused before anything is read or written.
    let edited = args
        .edited
        .as_deref()
        .map(|raw| {
            read_json(
                raw,
                "--args",
                "--args '{\"amount\": 50}': every argument, as `durable approvals` shows them",
            )
        })
        .transpose()?;
    let id = CallId::new(args.call);
    let call = awaiting(store, &id).await?;
    let edited = edited.map(|e| unhide(&e, &call.args));
    let durable = runtime(store);
    let record = match durable
        .operator()
        .approve(&id, edited.clone(), &by, args.note.as_deref())
        .await
    {
        Ok(record) => record,
        Err(e) => return Err(refused(store, &call, e).await),
    };
    let approved = record
        .approval
        .as_ref()
        .and_then(|a| a.edited_args())
        .cloned();
    let session = &call.identity.session;
    let (status, waiting) = session_after(&durable, session).await?;
    if json {
        return render::print_json(&json!({
            "call": record.id,
            "session": session,
            "tool": call.identity.tool,
            "status": record.status,
            "by": by,
            "note": args.note,
            "edited": approved.is_some(),
            "requested_args": mask(&call.args),
            "approved_args": mask(approved.as_ref().unwrap_or(&call.args)),
            "session_status": status,
            "session_awaiting": waiting,
        }));
    }
    let shown_id = clip(id.as_str(), ID);
    let tool = clip(&call.identity.tool, NAME);
    let shown_session = clip(session.as_str(), ID);
    let shown_by = clip(&by, NAME);
    match &approved {
        Some(after) => {
            outln!(
                "approved call `{shown_id}` (`{tool}` in session `{shown_session}`) with edited arguments, by {shown_by}"
            );
            outln!("  requested  {}", render::compact(&call.args, ARGS));
            outln!("  approved   {}", render::compact(after, ARGS));
            outln!(
                "the next resume runs the call once with the approved arguments, not the requested ones"
            );
        }
        None => {
            outln!(
                "approved call `{shown_id}` (`{tool}` in session `{shown_session}`) as requested, by {shown_by}"
            );
            if edited.is_some() {
                outln!("  (the edited arguments equal the requested ones)");
            }
            outln!("  arguments  {}", render::compact(&call.args, ARGS));
            outln!("the next resume runs the call once with these arguments");
        }
    }
    print_session_after(session, status, waiting);
    Ok(())
}

/// `durable deny <CALL> --reason … [--note …] [--by …]`.
pub async fn deny(
    store: &Arc<dyn CheckpointStore>,
    json: bool,
    args: DenyArgs,
) -> Result<(), CliError> {
    let by = operator(args.by)?;
    if args.reason.trim().is_empty() {
        return Err(CliError::new(
            Code::InvalidInput,
            "a denial needs a reason: the model reads it as the tool's result; pass --reason <TEXT>",
        ));
    }
    let id = CallId::new(args.call);
    let call = if args.revoke {
        let call = store.call(&id).await?;
        if call.status != CallStatus::Approved {
            return Err(not_awaiting(&call));
        }
        call
    } else {
        awaiting(store, &id).await?
    };
    let durable = runtime(store);
    let decided = if args.revoke {
        durable
            .operator()
            .revoke(&id, &args.reason, &by, args.note.as_deref())
            .await
    } else {
        durable
            .operator()
            .deny(&id, &args.reason, &by, args.note.as_deref())
            .await
    };
    let record = match decided {
        Ok(record) => record,
        Err(e) => return Err(refused(store, &call, e).await),
    };
    let session = &call.identity.session;
    let (status, waiting) = session_after(&durable, session).await?;
    if json {
        return render::print_json(&json!({
            "call": record.id,
            "session": session,
            "tool": call.identity.tool,
            "status": record.status,
            "by": by,
            "reason": args.reason,
            "note": args.note,
            "result": record.error,
            "session_status": status,
            "session_awaiting": waiting,
        }));
    }
    let message = record
        .error
        .as_ref()
        .and_then(|e| e["message"].as_str())
        .unwrap_or(args.reason.as_str());
    outln!(
        "denied call `{}` (`{}` in session `{}`), by {}: it never runs; the next resume returns this to the model as the tool's result:",
        clip(id.as_str(), ID),
        clip(&call.identity.tool, NAME),
        clip(session.as_str(), ID),
        clip(&by, NAME)
    );
    outln!("  {}", clip(message, ARGS));
    print_session_after(session, status, waiting);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_kept_as_shown_stand_for_the_recorded_values() {
        let requested = json!({
            "amount": 500,
            "card": {"$secret": "k1:abc"},
            "auth": {"token": "t-1", "user": "ann"},
            "items": [{"api_key": "k-2", "n": 1}],
            "note": "***"
        });
        let edit = json!({
            "amount": 50,
            "card": "<secret>",
            "auth": {"token": "***", "user": "bo"},
            "items": [{"api_key": "***", "n": 2}, {"api_key": "***"}],
            "note": "***",
            "extra": "<secret>"
        });
        assert_eq!(
            unhide(&edit, &requested),
            json!({
                "amount": 50,
                "card": {"$secret": "k1:abc"},
                "auth": {"token": "t-1", "user": "bo"},
                "items": [{"api_key": "k-2", "n": 2}, {"api_key": "***"}],
                "note": "***",
                "extra": "<secret>"
            })
        );
        // A changed value is the operator's, placeholder-looking or not.
        let changed = json!({"card": "***", "auth": "<secret>"});
        assert_eq!(unhide(&changed, &requested), changed);
    }
}
