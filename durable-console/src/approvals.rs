//! `/approvals`: the calls awaiting a person's approval, each with *approve*, *edit and
//! approve* and *deny*, or, past its deadline, *expire*.
//!
//! As in the in-doubt inbox ([`crate::inbox`]), each decision is two `POST`s: the first
//! shows what the decision will do and changes nothing; the second, from that page,
//! records it through [`Operator::approve`](durable::Operator::approve), [`Operator::deny`](durable::Operator::deny) or
//! [`Operator::expire_approvals`](durable::Operator::expire_approvals). The same checks run before both: edited arguments go
//! through [`check_edited_args`] (a problem is shown with its JSON path, and nothing is
//! decided), a denial needs a reason, and a call another operator decided first is
//! refused, naming its status and who decided.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use durable::approval::check_edited_args;
use durable::json::{ArgLimits, parse_json};
use durable::store::{
    ApprovalDecision, CallRecord, CallStatus, DEADLINE, Decided, PendingApproval,
};
use durable::{CallId, Durable, DurableError, SessionId, StoreError};
use maud::{Markup, html};
use serde::Deserialize;
use serde_json::Value;

use crate::AppState;
use crate::auth::{CsrfForm, Posted, Viewer};
use crate::edit::{diff, shown, unmask};
use crate::error::PageError;
use crate::format::{age, editable, pretty, time, visible};
use crate::layout::{self, Nav, csrf_field};
use crate::mask::mask;
use crate::sessions::{encode, session_href};

/// The lease owner of the runtime that records decisions, as the CLI's.
const OWNER: &str = "durable-console";

/// Widest arguments shown, in characters.
const ARGS: usize = 8000;

/// The runtime the console decides through (its default argument limits, as the CLI's).
pub(crate) fn runtime(state: &AppState) -> Durable {
    Durable::builder(Arc::clone(&state.store))
        .owner(OWNER)
        .build()
}

#[derive(Deserialize)]
pub(crate) struct InboxQuery {
    session: Option<String>,
}

/// `GET /approvals[?session=ID]`.
pub(crate) async fn page(
    State(state): State<AppState>,
    viewer: Viewer,
    Query(query): Query<InboxQuery>,
) -> Result<Markup, PageError> {
    let store = state.store.as_ref();
    let session = query.session.filter(|s| !s.is_empty()).map(SessionId::new);
    if let Some(id) = &session {
        store.session(id).await?;
    }
    let now = store.now().await?;
    let pending = runtime(&state)
        .operator()
        .approvals(session.as_ref())
        .await?;
    let body = html! {
        h1 { "Calls awaiting approval" }
        p.muted {
            "The agent asked before running these calls, and its session is parked until each is decided: nothing ran. "
            "Approve one (as requested, or with edited arguments) and the next resume runs it once; deny it and the model reads your reason as the tool's result. "
            "The reasoning below is the model's own text: it may be written to persuade you."
        }
        @if let Some(id) = &session {
            p { "Session " code { (visible(id.as_str(), 200)) } " only · " a href="/approvals" { "all sessions" } }
        }
        @if pending.is_empty() {
            p.notice.done #empty { "No calls await approval." }
        }
        @for p in &pending {
            (card(&state, &viewer, p, now))
        }
    };
    Ok(layout::page(&state, &viewer, Nav::Approvals, "Approvals", body).await)
}

fn card(state: &AppState, viewer: &Viewer, pending: &PendingApproval, now: i64) -> Markup {
    let call = &pending.call;
    let action = format!("/approvals/{}/confirm", encode(call.id.as_str()));
    let disabled = state.read_only.is_some();
    let approval = call.approval.as_ref();
    html! {
        div.card.approval data-call=(call.id.as_str()) {
            dl.facts {
                dt { "Call" } dd.mono { (visible(call.id.as_str(), 200)) }
                dt { "Session" } dd { a.mono href=(session_href(&call.identity.session)) { (visible(call.identity.session.as_str(), 200)) } }
                dt { "Tool" } dd.mono { (visible(&call.identity.tool, 100)) " · " (call.class.as_str()) " · step " (call.identity.step) }
                @if let Some(a) = approval {
                    dt { "Asked by" } dd.asked-by { (visible(&a.asked_by, 200)) }
                    dt { "Requested" } dd { (time(a.requested_at)) " (" (age(a.requested_at, now)) ")" }
                    dt { "Deadline" }
                    dd.deadline {
                        @match a.deadline {
                            None => { span.muted { "none" } }
                            Some(at) if pending.expired => { span.pill.expired { "expired" } " " (time(at)) " (" (age(at, now)) ")" }
                            Some(at) => { (time(at)) " (" (age(at, now)) ")" }
                        }
                    }
                    dt { "Reasoning" }
                    dd {
                        @match &a.reasoning {
                            Some(text) => { pre.reasoning { (visible(text, 20_000)) } }
                            None => { span.muted { "none given" } }
                        }
                    }
                }
                dt { "Arguments" } dd { pre.args { (pretty(&call.args, ARGS)) } }
            }
            @if let Some(reason) = &state.read_only { (layout::read_only_notice(reason)) }
            @if pending.expired {
                div.decisions {
                    form.expire method="post" action=(action) {
                        h3 { "Expired" }
                        p.muted { "Its deadline passed undecided: it can no longer be approved or denied. Expire it: it is denied by its deadline, and the next resume returns that to the model." }
                        (csrf_field(viewer))
                        input type="hidden" name="decision" value="expire";
                        button.danger type="submit" disabled[disabled] { "Review: expire…" }
                    }
                }
            } @else {
                div.decisions.three {
                    form.approve method="post" action=(action) {
                        h3 { "Approve" }
                        p.muted { "The next resume runs the call once, with the arguments above." }
                        (csrf_field(viewer))
                        input type="hidden" name="decision" value="approve";
                        label { "Note" input type="text" name="note"; }
                        label { "By" input type="text" name="by" value=(state.operator); }
                        button type="submit" disabled[disabled] { "Review: approve…" }
                    }
                    form.edit method="post" action=(action) {
                        h3 { "Edit and approve" }
                        p.muted { "The call runs with these arguments instead. Secret values (" code { "<secret>" } ", " code { "***" } ") must stay as shown." }
                        (csrf_field(viewer))
                        input type="hidden" name="decision" value="edit";
                        label { "Arguments (JSON)" textarea name="args" rows="6" { (editable(&call.args)) } }
                        label { "Note" input type="text" name="note"; }
                        label { "By" input type="text" name="by" value=(state.operator); }
                        button type="submit" disabled[disabled] { "Review: edit and approve…" }
                    }
                    form.deny method="post" action=(action) {
                        h3 { "Deny" }
                        p.muted { "The call never runs; the model reads your reason as the tool's result." }
                        (csrf_field(viewer))
                        input type="hidden" name="decision" value="deny";
                        label { "Reason (the model reads it)" textarea name="reason" rows="2" required {} }
                        label { "Note" input type="text" name="note"; }
                        label { "By" input type="text" name="by" value=(state.operator); }
                        button.danger type="submit" disabled[disabled] { "Review: deny…" }
                    }
                }
            }
        }
    }
}

/// The decision forms' fields.
#[derive(Deserialize)]
pub(crate) struct DecisionForm {
    csrf: Option<String>,
    #[serde(default)]
    decision: String,
    /// Edited arguments (JSON, secrets as shown).
    #[serde(default)]
    args: String,
    /// A denial's reason.
    #[serde(default)]
    reason: String,
    #[serde(default)]
    note: String,
    #[serde(default)]
    by: String,
}

impl CsrfForm for DecisionForm {
    fn csrf(&self) -> Option<&str> {
        self.csrf.as_deref()
    }
}

/// What was chosen, checked.
enum Choice {
    /// Approve; with the arguments to record when the edit changed them.
    Approve {
        edited: Option<Value>,
        edit: bool,
    },
    Deny {
        reason: String,
    },
    Expire,
}

/// A decision read from a form, checked against the call as it stands.
struct Checked {
    call: CallRecord,
    choice: Choice,
    note: Option<String>,
    by: String,
}

fn unprocessable(message: String) -> PageError {
    PageError::new(StatusCode::UNPROCESSABLE_ENTITY, message)
}

/// The refusal for a call that no longer awaits a decision: its status, and who decided
/// and when, when it was decided.
fn not_awaiting(row: &CallRecord) -> PageError {
    let decided = row.approval.as_ref().and_then(|a| a.decision.as_ref());
    let what = match decided {
        Some(d) => {
            let verb = match d.decision {
                ApprovalDecision::Approve { .. } => "approved",
                ApprovalDecision::Deny { .. } => "denied",
                ApprovalDecision::Revoke { .. } => "revoked",
                ApprovalDecision::Expire => "expired",
            };
            format!(
                "it was already {verb} by {} at {}",
                visible(&d.by, 64),
                time(d.at)
            )
        }
        None => "it never needed a decision".to_owned(),
    };
    PageError::new(
        StatusCode::CONFLICT,
        format!(
            "call `{}` (`{}`) is not awaiting approval (status `{}`): {what}; nothing was changed",
            visible(row.id.as_str(), 64),
            visible(&row.identity.tool, 64),
            row.status.as_str()
        ),
    )
}

/// The form's decision, validated, and the call, checked to await it.
async fn check(state: &AppState, call: &str, form: &DecisionForm) -> Result<Checked, PageError> {
    if let Some(reason) = &state.read_only {
        return Err(PageError::read_only(reason));
    }
    let store = state.store.as_ref();
    let expire = form.decision == "expire";
    let by = if expire { DEADLINE } else { form.by.trim() };
    if by.is_empty() {
        return Err(unprocessable(
            "say who decides (the `By` field): it is kept in the audit log".into(),
        ));
    }
    let row = store.call(&CallId::new(call)).await?;
    if row.status != CallStatus::Requested {
        return Err(not_awaiting(&row));
    }
    let deadline = row.approval.as_ref().and_then(|a| a.deadline);
    let now = store.now().await?;
    let expired = deadline.is_some_and(|d| now >= d);
    let tool = visible(&row.identity.tool, 64);
    let shown_id = visible(row.id.as_str(), 64);
    if expired && !expire {
        return Err(PageError::new(
            StatusCode::CONFLICT,
            format!(
                "call `{shown_id}` (`{tool}`) can no longer be approved or denied: its deadline passed at {} undecided; expire it instead. Nothing was changed",
                time(deadline.unwrap_or_default())
            ),
        ));
    }
    let choice = match form.decision.as_str() {
        "approve" => Choice::Approve {
            edited: None,
            edit: false,
        },
        "edit" => {
            let typed = parse_json(form.args.trim(), &ArgLimits::default()).map_err(|e| {
                unprocessable(format!(
                    "the edited arguments are not valid JSON ({e}); nothing was decided"
                ))
            })?;
            let edited = unmask(typed, &row.args);
            let edited = check_edited_args(&row, &edited, &ArgLimits::default())?;
            Choice::Approve { edited, edit: true }
        }
        "deny" => {
            let reason = form.reason.trim();
            if reason.is_empty() {
                return Err(unprocessable(
                    "a denial needs a reason: the model reads it as the tool's result; nothing was decided".into(),
                ));
            }
            Choice::Deny {
                reason: reason.to_owned(),
            }
        }
        "expire" if !expired => {
            return Err(PageError::new(
                StatusCode::CONFLICT,
                match deadline {
                    Some(at) => format!(
                        "call `{shown_id}` (`{tool}`) has not expired: its deadline is {} ({}); nothing was changed",
                        time(at),
                        age(at, now)
                    ),
                    None => format!(
                        "call `{shown_id}` (`{tool}`) has no deadline, so it cannot expire; approve or deny it"
                    ),
                },
            ));
        }
        "expire" => Choice::Expire,
        other => {
            return Err(unprocessable(format!(
                "unknown decision `{}`; expected `approve`, `edit`, `deny` or `expire`",
                visible(other, 64)
            )));
        }
    };
    let note = Some(form.note.trim().to_owned()).filter(|n| !n.is_empty());
    Ok(Checked {
        call: row,
        choice,
        note,
        by: by.to_owned(),
    })
}

/// What the model reads for a denial (or an expiry): the recorded error's message.
fn denial_text(checked: &Checked) -> String {
    let decision = match &checked.choice {
        Choice::Deny { reason } => ApprovalDecision::Deny {
            reason: reason.clone(),
        },
        Choice::Expire => ApprovalDecision::Expire,
        Choice::Approve { .. } => return String::new(),
    };
    let decided = Decided {
        decision,
        by: checked.by.clone(),
        at: 0,
        note: None,
    };
    let deadline = checked.call.approval.as_ref().and_then(|a| a.deadline);
    decided
        .denial(deadline)
        .and_then(|e| e.get("message").and_then(Value::as_str).map(str::to_owned))
        .unwrap_or_default()
}

/// What the decision does: `before` the confirmation, or once `done`.
fn what_it_does(checked: &Checked, done: bool) -> String {
    let call = &checked.call;
    let tool = visible(&call.identity.tool, 64);
    let subject = format!(
        "call `{}` (`{tool}` in session `{}`)",
        visible(call.id.as_str(), 64),
        visible(call.identity.session.as_str(), 64)
    );
    let by = visible(&checked.by, 64);
    let (verb, rest) = match &checked.choice {
        Choice::Approve { edited: None, edit } => (
            ["Approve", "approved"],
            format!(
                "{}, by {by}: the next resume runs `{tool}` once with these arguments",
                if *edit {
                    " as requested (the edit changed nothing)"
                } else {
                    " as requested"
                }
            ),
        ),
        Choice::Approve {
            edited: Some(_), ..
        } => (
            ["Approve", "approved"],
            format!(
                " with edited arguments, by {by}: the next resume runs `{tool}` once with the edited arguments"
            ),
        ),
        Choice::Deny { .. } => (
            ["Deny", "denied"],
            format!(
                ", by {by}: it never runs; the model will read: {}",
                visible(&denial_text(checked), 2000)
            ),
        ),
        Choice::Expire => (
            ["Expire", "expired"],
            format!(
                ", denied by its deadline: it never runs; the model will read: {}",
                visible(&denial_text(checked), 2000)
            ),
        ),
    };
    let verb = if done { verb[1] } else { verb[0] };
    format!("{verb} {subject}{rest}")
}

/// `POST /approvals/{call}/confirm`: what the decision will do; changes nothing.
pub(crate) async fn confirm(
    State(state): State<AppState>,
    viewer: Viewer,
    Path(call): Path<String>,
    Posted(form): Posted<DecisionForm>,
) -> Result<Markup, PageError> {
    let checked = check(&state, &call, &form).await?;
    let action = format!("/approvals/{}/decide", encode(call.as_str()));
    let mut changes = Vec::new();
    if let Choice::Approve {
        edited: Some(edited),
        ..
    } = &checked.choice
    {
        diff(&mask(&checked.call.args), &mask(edited), "$", &mut changes);
    }
    let body = html! {
        h1 { "Confirm the decision" }
        div.card #confirm {
            p #consequence { strong { (what_it_does(&checked, false)) "." } }
            @match &checked.choice {
                Choice::Approve { edited: Some(edited), .. } => {
                    h2 { "What the edit changes" }
                    table.diff #diff {
                        thead { tr { th { "Path" } th { "Requested" } th { "Runs with" } } }
                        tbody {
                            @for (path, before, after) in &changes {
                                tr { td { (visible(path, 200)) } td.before { (shown(before.as_ref())) } td.after { (shown(after.as_ref())) } }
                            }
                        }
                    }
                    p { "The arguments the call runs with:" }
                    pre.args #args { (pretty(edited, ARGS)) }
                }
                Choice::Approve { edited: None, .. } => {
                    pre.args #args { (pretty(&checked.call.args, ARGS)) }
                }
                Choice::Deny { .. } | Choice::Expire => {
                    p #denial { "The model will read: " code { (visible(&denial_text(&checked), 2000)) } }
                }
            }
            @if let Choice::Expire = &checked.choice {
                p.muted { "Expiring sweeps the session: any other request of session " code { (visible(checked.call.identity.session.as_str(), 200)) } " past its deadline is expired with it." }
            }
            @if let Some(note) = &checked.note { p { "Note: " em { (visible(note, 1000)) } } }
            p.muted { "The store seals the decision like every row it writes, with who, when and why, in the session's approval log; it cannot be undone from the console." }
            form.inline method="post" action=(action) {
                (csrf_field(&viewer))
                input type="hidden" name="decision" value=(form.decision);
                input type="hidden" name="args" value=(form.args);
                input type="hidden" name="reason" value=(form.reason);
                input type="hidden" name="note" value=(form.note);
                input type="hidden" name="by" value=(form.by);
                button type="submit" { "Confirm" }
                a href="/approvals" { "Cancel" }
            }
        }
    };
    Ok(layout::page(&state, &viewer, Nav::Approvals, "Confirm", body).await)
}

/// `POST /approvals/{call}/decide`: records the decision.
pub(crate) async fn decide(
    State(state): State<AppState>,
    viewer: Viewer,
    Path(call): Path<String>,
    Posted(form): Posted<DecisionForm>,
) -> Result<Markup, PageError> {
    let checked = check(&state, &call, &form).await?;
    let durable = runtime(&state);
    let id = &checked.call.id;
    let session = &checked.call.identity.session;
    let note = checked.note.as_deref();
    let decided = match &checked.choice {
        Choice::Approve { edited, .. } => durable
            .operator()
            .approve(id, edited.clone(), &checked.by, note)
            .await
            .map(|_| ()),
        Choice::Deny { reason } => durable
            .operator()
            .deny(id, reason, &checked.by, note)
            .await
            .map(|_| ()),
        Choice::Expire => match durable.operator().expire_approvals(Some(session)).await {
            Ok(rows) if rows.iter().any(|r| &r.id == id) => Ok(()),
            Ok(_) => Err(DurableError::Store(StoreError::NotAwaitingApproval {
                call: id.clone(),
                status: String::new(),
            })),
            Err(e) => Err(e),
        },
    };
    match decided {
        Ok(()) => {}
        // Another operator decided first: say what they decided.
        Err(DurableError::Store(StoreError::NotAwaitingApproval { .. })) => {
            return Err(not_awaiting(&state.store.call(id).await?));
        }
        Err(e) => return Err(e.into()),
    }
    let remaining = durable.operator().approvals(Some(session)).await?.len();
    let shown_session = visible(session.as_str(), 64);
    let next = if remaining == 0 {
        format!(
            "No call of session `{shown_session}` awaits a decision any more: it is active again, and the next resume (on any worker) continues it."
        )
    } else {
        format!(
            "{remaining} more call{} of session `{shown_session}` await{} a decision; it resumes once every one is decided.",
            if remaining == 1 { "" } else { "s" },
            if remaining == 1 { "s" } else { "" }
        )
    };
    let body = html! {
        h1 { "Decided" }
        p.notice.done #outcome { (what_it_does(&checked, true)) }
        p #next { (next) }
        p {
            a href="/approvals" { "Back to the approvals" } " · "
            a href=(session_href(session)) { "Open the session" }
        }
    };
    Ok(layout::page(&state, &viewer, Nav::Approvals, "Decided", body).await)
}
