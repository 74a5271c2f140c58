//! `/in-doubt`: the calls in doubt, each with *happened (result)* and *did not happen*.
//!
//! Each decision is two `POST`s: the first shows what the decision will do (the CLI's
//! words) and changes nothing; the second, from that page, resolves the call through
//! [`Operator::resolve`](durable::Operator::resolve), as `durable resolve` does. The same checks and refusals as the
//! CLI's run before both.
//!
//! Calls awaiting approval have an inbox of their own: [`crate::approvals`].

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use durable::json::{ArgLimits, parse_json};
use durable::store::{CallRecord, CallStatus, Resolution};
use durable::{CallId, Durable, SessionId};
use maud::{Markup, html};
use serde::Deserialize;

use crate::AppState;
use crate::auth::{CsrfForm, Posted, Viewer};
use crate::error::PageError;
use crate::format::{age, pretty, time, visible};
use crate::layout::{self, Nav, csrf_field};
use crate::sessions::{encode, session_href};

/// The lease owner of the runtime that records resolutions, as the CLI's.
const OWNER: &str = "durable-console";

#[derive(Deserialize)]
pub(crate) struct InboxQuery {
    session: Option<String>,
}

/// `GET /in-doubt[?session=ID]`.
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
    let calls: Vec<CallRecord> = store
        .in_doubt(session.as_ref())
        .await?
        .into_iter()
        .filter(|c| c.status == CallStatus::Issued)
        .collect();
    let body = html! {
        h1 { "Calls in doubt" }
        p.muted {
            "An " code { "unsafe_on_replay" } " call whose worker died between recording it and recording its outcome: "
            "the runtime refuses to run it again. Find out whether the effect happened (the outbox, the payment provider…), then decide."
        }
        @if let Some(id) = &session {
            p { "Session " code { (visible(id.as_str(), 200)) } " only · " a href="/in-doubt" { "all sessions" } }
        }
        @if calls.is_empty() {
            p.notice.done #empty { "No calls in doubt." }
        }
        @for call in &calls {
            (call_card(&state, &viewer, call, now))
        }
    };
    Ok(layout::page(&state, &viewer, Nav::InDoubt, "In doubt", body).await)
}

fn call_card(state: &AppState, viewer: &Viewer, call: &CallRecord, now: i64) -> Markup {
    let action = format!("/in-doubt/{}/confirm", encode(call.id.as_str()));
    let disabled = state.read_only.is_some();
    html! {
        div.card.in-doubt data-call=(call.id.as_str()) {
            dl.facts {
                dt { "Call" } dd.mono { (visible(call.id.as_str(), 200)) }
                dt { "Session" } dd { a.mono href=(session_href(&call.identity.session)) { (visible(call.identity.session.as_str(), 200)) } }
                dt { "Tool" } dd.mono { (visible(&call.identity.tool, 100)) " · " (call.class.as_str()) " · step " (call.identity.step) " · attempt " (call.attempt) }
                dt { "Issued" } dd { (time(call.issued_at)) " (" (age(call.issued_at, now)) ")" }
                dt { "Arguments" } dd { pre.args { (pretty(&call.args, 8000)) } }
            }
            @if let Some(reason) = &state.read_only { (layout::read_only_notice(reason)) }
            div.decisions {
                form.happened method="post" action=(action) {
                    h3 { "It happened" }
                    p.muted { "Record this JSON as the call's result; the resumed agent continues with it and nothing re-runs." }
                    (csrf_field(viewer))
                    input type="hidden" name="decision" value="happened";
                    label { "Result (JSON)" textarea name="result" rows="3" placeholder="{\"id\": \"m-1\"}" {} }
                    label { "Note: what you checked" input type="text" name="note"; }
                    label { "By" input type="text" name="by" value=(state.operator); }
                    button type="submit" disabled[disabled] { "Review: happened…" }
                }
                form.did-not-happen method="post" action=(action) {
                    h3 { "It did not happen" }
                    p.muted { "The effect never took place; the next resume runs the call again." }
                    (csrf_field(viewer))
                    input type="hidden" name="decision" value="did_not_happen";
                    label { "Note: what you checked" input type="text" name="note"; }
                    label { "By" input type="text" name="by" value=(state.operator); }
                    button.secondary type="submit" disabled[disabled] { "Review: did not happen…" }
                }
            }
        }
    }
}

/// The decision forms' fields.
#[derive(Deserialize)]
pub(crate) struct Decision {
    csrf: Option<String>,
    #[serde(default)]
    decision: String,
    #[serde(default)]
    result: String,
    #[serde(default)]
    note: String,
    #[serde(default)]
    by: String,
}

impl CsrfForm for Decision {
    fn csrf(&self) -> Option<&str> {
        self.csrf.as_deref()
    }
}

/// A decision read from a form, checked.
struct Checked {
    call: CallRecord,
    resolution: Resolution,
    note: Option<String>,
    by: String,
}

fn unprocessable(message: String) -> PageError {
    PageError::new(StatusCode::UNPROCESSABLE_ENTITY, message)
}

/// The form's decision, validated, and the call, checked to be in doubt, with the CLI's
/// refusals.
async fn check(state: &AppState, call: &str, form: &Decision) -> Result<Checked, PageError> {
    if let Some(reason) = &state.read_only {
        return Err(PageError::read_only(reason));
    }
    let by = form.by.trim();
    if by.is_empty() {
        return Err(unprocessable(
            "say who decides (the `By` field): it is kept in the audit row".into(),
        ));
    }
    let resolution = match form.decision.as_str() {
        "happened" => {
            let result = parse_json(form.result.trim(), &ArgLimits::default()).map_err(|e| {
                unprocessable(format!(
                    "the result is not valid JSON ({e}); e.g. {{\"id\": \"m-1\"}}, or a JSON string: \"sent\""
                ))
            })?;
            Resolution::Happened { result }
        }
        "did_not_happen" => Resolution::DidNotHappen,
        other => {
            return Err(unprocessable(format!(
                "unknown decision `{}`; expected `happened` or `did_not_happen`",
                visible(other, 64)
            )));
        }
    };
    let store = state.store.as_ref();
    let id = CallId::new(call);
    let record = store.call(&id).await?;
    let tool = visible(&record.identity.tool, 64);
    let shown_id = visible(id.as_str(), 64);
    let refused = |m: String| PageError::new(StatusCode::CONFLICT, m);
    match record.status {
        CallStatus::Issued => {}
        CallStatus::NotHappened => {
            return Err(refused(format!(
                "call `{shown_id}` (`{tool}`) is not in doubt: it was already resolved as not happened; the next resume runs it"
            )));
        }
        status => {
            return Err(refused(format!(
                "call `{shown_id}` (`{tool}`) is not in doubt: its outcome is recorded (status `{}`); nothing to resolve",
                status.as_str()
            )));
        }
    }
    let in_doubt = store.in_doubt(Some(&record.identity.session)).await?;
    if !in_doubt.iter().any(|c| c.id == id) {
        let session = store.session(&record.identity.session).await?;
        let holder = session
            .lease_owner
            .map_or_else(|| "a worker".into(), |o| visible(&o, 64));
        return Err(refused(format!(
            "call `{shown_id}` (`{tool}`) is still running: session `{}` is leased by `{holder}`; wait until the worker finishes or its lease expires, then look again",
            visible(record.identity.session.as_str(), 64)
        )));
    }
    let note = Some(form.note.trim().to_owned()).filter(|n| !n.is_empty());
    Ok(Checked {
        call: record,
        resolution,
        note,
        by: by.to_owned(),
    })
}

/// What the decision does, in the CLI's words: `resolve{d}` is "resolve" before and
/// "resolved" after.
fn what_it_does(checked: &Checked, done: bool) -> String {
    let verb = if done { "resolved" } else { "resolve" };
    let call = &checked.call;
    let head = format!(
        "{verb} call `{}` (`{}` in session `{}`)",
        visible(call.id.as_str(), 64),
        visible(&call.identity.tool, 64),
        visible(call.identity.session.as_str(), 64)
    );
    let by = visible(&checked.by, 64);
    match checked.resolution {
        Resolution::Happened { .. } => format!(
            "{head} as happened, by {by}: the next resume returns this result to the agent and runs nothing"
        ),
        Resolution::DidNotHappen => {
            format!("{head} as not happened, by {by}: the next resume runs the call again")
        }
    }
}

/// `POST /in-doubt/{call}/confirm`: what the decision will do; changes nothing.
pub(crate) async fn confirm(
    State(state): State<AppState>,
    viewer: Viewer,
    Path(call): Path<String>,
    Posted(form): Posted<Decision>,
) -> Result<Markup, PageError> {
    let checked = check(&state, &call, &form).await?;
    let action = format!("/in-doubt/{}/resolve", encode(call.as_str()));
    let mut sentence = what_it_does(&checked, false);
    sentence.replace_range(..1, "R");
    let body = html! {
        h1 { "Confirm the decision" }
        div.card #confirm {
            p #consequence { strong { (sentence) "." } }
            @if let Resolution::Happened { result } = &checked.resolution {
                p { "Result recorded:" }
                pre.args { (pretty(result, 8000)) }
            }
            @if let Some(note) = &checked.note { p { "Note: " em { (visible(note, 1000)) } } }
            p.muted { "The store seals the resolution like every row it writes, with who, when and why, and it cannot be undone from the console." }
            form.inline method="post" action=(action) {
                (csrf_field(&viewer))
                input type="hidden" name="decision" value=(form.decision);
                input type="hidden" name="result" value=(form.result);
                input type="hidden" name="note" value=(form.note);
                input type="hidden" name="by" value=(form.by);
                button type="submit" { "Confirm" }
                a href="/in-doubt" { "Cancel" }
            }
        }
    };
    Ok(layout::page(&state, &viewer, Nav::InDoubt, "Confirm", body).await)
}

/// `POST /in-doubt/{call}/resolve`: records the decision.
pub(crate) async fn resolve(
    State(state): State<AppState>,
    viewer: Viewer,
    Path(call): Path<String>,
    Posted(form): Posted<Decision>,
) -> Result<Markup, PageError> {
    let checked = check(&state, &call, &form).await?;
    let durable = Durable::builder(Arc::clone(&state.store))
        .owner(OWNER)
        .build();
    durable
        .operator()
        .resolve(
            &checked.call.id,
            checked.resolution.clone(),
            &checked.by,
            checked.note.as_deref(),
        )
        .await?;
    let body = html! {
        h1 { "Resolved" }
        p.notice.done #outcome { (what_it_does(&checked, true)) }
        p {
            a href="/in-doubt" { "Back to the calls in doubt" } " · "
            a href=(session_href(&checked.call.identity.session)) { "Open the session" }
        }
    };
    Ok(layout::page(&state, &viewer, Nav::InDoubt, "Resolved", body).await)
}
