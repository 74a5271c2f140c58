//! `/sessions/{id}`: a session's journal rows (with their approvals), checkpoints,
//! resolutions and approval log in order, with the transcript of one checkpoint beside
//! them; and the fork form.

use std::time::Duration;

use axum::extract::{Path, Query, State};
use durable::store::{
    Approval, ApprovalDecision, ApprovalRecord, CallKind, CallRecord, CheckpointMeta, ForkEntry,
    ForkPlan, ForkSession, Resolution, ResolutionRecord,
};
use durable::{Block, Message, Plan, SessionId, StoreError};
use maud::{Markup, html};
use serde::Deserialize;
use serde_json::Value;

use crate::AppState;
use crate::auth::{CsrfForm, Posted, Viewer};
use crate::error::PageError;
use crate::format::{age, budget, coarse, compact, plan_progress, pretty, size, time, visible};
use crate::layout::{self, Nav, csrf_field};
use crate::sessions::session_href;

/// The lease owner recorded for the fork's first lease (given back at once), as the CLI's.
const OWNER: &str = "durable-console";

/// Plan and budget are read for at most this many of the newest checkpoints.
const CHECKPOINTS_READ: usize = 100;

/// Width of arguments in the timeline.
const ARGS: usize = 240;

/// Journal rows on one page of the timeline; the next page is a link (`?calls_after=`,
/// the position of the page's last row).
const JOURNAL_PAGE: i64 = 500;

/// Rows of the fork preview listed (the rest are counted).
const FORK_SHOWN: usize = 200;

#[derive(Deserialize)]
pub(crate) struct Version {
    version: Option<i64>,
    /// Show the journal after this position (the previous page's last row).
    calls_after: Option<i64>,
}

/// One line of the timeline.
enum Event<'a> {
    Checkpoint {
        meta: &'a CheckpointMeta,
        plan: Option<String>,
        budget: Option<String>,
    },
    Call(&'a CallRecord),
    Resolution(&'a ResolutionRecord),
    /// An entry of the session's approval log.
    Approval(&'a ApprovalRecord),
}

impl Event<'_> {
    fn at(&self) -> i64 {
        match self {
            Event::Checkpoint { meta, .. } => meta.created_at,
            Event::Call(c) => c.issued_at,
            Event::Resolution(r) => r.at,
            Event::Approval(a) => a.at,
        }
    }
}

/// `GET /sessions/{id}?version=N`.
pub(crate) async fn page(
    State(state): State<AppState>,
    viewer: Viewer,
    Path(id): Path<String>,
    Query(Version {
        version,
        calls_after,
    }): Query<Version>,
) -> Result<Markup, PageError> {
    let store = state.store.as_ref();
    let id = SessionId::new(id);
    let session = store.session(&id).await?;
    let now = store.now().await?;
    let checkpoint = store.load_checkpoint(&id, version).await?;
    let viewed = checkpoint.meta.version;
    let metas = store.list_checkpoints(&id).await?;
    // One page of the journal (keyset, by position): what the page holds is bounded.
    let after = calls_after.unwrap_or(0).max(0);
    let mut calls = store.calls_page(&id, after, JOURNAL_PAGE + 1).await?;
    let next_page =
        (calls.len() > usize::try_from(JOURNAL_PAGE).unwrap_or(usize::MAX)).then(|| {
            calls.truncate(usize::try_from(JOURNAL_PAGE).unwrap_or(usize::MAX));
            after + JOURNAL_PAGE
        });
    let first_page = after == 0;
    let last_page = next_page.is_none();
    let steps = (
        calls.first().map_or(i64::MIN, |c| c.identity.step),
        calls.last().map_or(i64::MAX, |c| c.identity.step),
    );
    let fork = fork_preview(store, &id, viewed).await?;
    let in_doubt: Vec<_> = store
        .in_doubt(Some(&id))
        .await?
        .into_iter()
        .map(|c| c.id)
        .collect();
    let resolutions = store.resolutions(&id).await?;
    let approval_log = store.approvals(&id).await?;
    let awaiting = store.pending_approvals(Some(&id)).await?.len();
    let family = crate::family::read(store, &session).await?;
    let signals = crate::signals::read(store, &id).await?;

    // Checkpoint v(n) opens step n: each checkpoint, then the rows of its step, then the
    // resolutions where they happened in time.
    let read_from = metas.len().saturating_sub(CHECKPOINTS_READ);
    let mut events = Vec::with_capacity(metas.len() + calls.len() + resolutions.len());
    for (i, meta) in metas.iter().enumerate() {
        // The checkpoints around this page's rows (all before them on the first page,
        // all after them on the last).
        let shown =
            (first_page || meta.version >= steps.0) && (last_page || meta.version <= steps.1);
        if !shown {
            continue;
        }
        let (plan, budget_text) = if meta.version == viewed {
            (
                Some(plan_progress(&checkpoint.plan)),
                Some(budget(&checkpoint.budget)),
            )
        } else if i >= read_from {
            match store.load_checkpoint(&id, Some(meta.version)).await {
                Ok(cp) => (Some(plan_progress(&cp.plan)), Some(budget(&cp.budget))),
                Err(StoreError::Corrupt { .. }) => (Some("(unreadable)".into()), None),
                Err(e) => return Err(e.into()),
            }
        } else {
            (None, None)
        };
        events.push(Event::Checkpoint {
            meta,
            plan,
            budget: budget_text,
        });
        events.extend(
            calls
                .iter()
                .filter(|c| c.identity.step == meta.version)
                .map(Event::Call),
        );
    }
    // Rows whose step has no checkpoint (none today; kept rather than hidden).
    events.extend(
        calls
            .iter()
            .filter(|c| !metas.iter().any(|m| m.version == c.identity.step))
            .map(Event::Call),
    );
    for r in &resolutions {
        let at = events
            .iter()
            .rposition(|e| e.at() <= r.at)
            .map_or(0, |i| i + 1);
        events.insert(at, Event::Resolution(r));
    }
    // The approval log after the row it is about (a request is logged with its row), else
    // where it happened in time; the log's own order is kept.
    for entry in &approval_log {
        let at = events
            .iter()
            .rposition(|e| e.at() <= entry.at)
            .map_or(0, |i| i + 1);
        events.insert(at, Event::Approval(entry));
    }

    let plan = serde_json::from_value::<Plan>(checkpoint.plan.clone()).ok();
    let messages: Vec<Value> = checkpoint
        .messages
        .iter()
        .map(|m| {
            m.to_value()
                .unwrap_or_else(|e| Value::String(format!("(not JSON: {e})")))
        })
        .collect();
    let spend = crate::budget::standing(&state, &id).await;
    let title = format!("Session {}", visible(id.as_str(), 64));
    let body = html! {
        h1 { "Session " code { (visible(id.as_str(), 200)) } }
        div.card {
            dl.facts {
                dt { "Status" }
                dd {
                    span class=(format!("pill {}", session.status.as_str())) { (session.status.as_str()) }
                    @if let Some(reason) = &session.status_reason { " " span.muted { (visible(reason, 300)) } }
                }
                dt { "App version" } dd.mono { (visible(&session.app_version, 100)) }
                dt { "Queue" } dd.mono.queue { (visible(&session.queue, 100)) }
                @if let Some(until) = session.wake_at.filter(|_| crate::workers::asleep(&session, now)) {
                    dt { "Asleep until" }
                    dd.asleep { (time(until)) " (" (age(until, now)) ") — " a href="/workers" { "wake it now from Workers" } }
                }
                dt { "Lease" }
                dd.lease {
                    @match (&session.lease_owner, session.lease_expires_at) {
                        (Some(owner), Some(until)) if until > now => { (visible(owner, 100)) ", live, expires " (age(until, now)) }
                        (Some(owner), _) => { (visible(owner, 100)) ", expired" }
                        (None, _) => { "—" }
                    }
                    @if let (Some(_), Some(at)) = (&session.lease_owner, session.lease_renewed_at) {
                        ", last renewed " (age(at, now))
                    }
                }
                dt { "Created" } dd { (time(session.created_at)) " (" (age(session.created_at, now)) ")" }
                dt { "Updated" } dd { (time(session.updated_at)) " (" (age(session.updated_at, now)) ")" }
                dt { "In doubt" }
                dd {
                    @if in_doubt.is_empty() { "none" } @else {
                        a.count href="/in-doubt" { (in_doubt.len()) " call" @if in_doubt.len() != 1 { "s" } } " — decide in the inbox"
                    }
                }
                dt { "Awaiting approval" }
                dd {
                    @if awaiting == 0 { "none" } @else {
                        a.count href=(format!("/approvals?session={}", crate::sessions::encode(id.as_str()))) { (awaiting) " call" @if awaiting != 1 { "s" } } " — decide in the approvals inbox"
                    }
                }
                @if !session.metadata.is_null() {
                    dt { "Metadata" } dd.mono { (compact(&session.metadata, 300)) }
                }
            }
        }
        (crate::budget::card(&state, &viewer, &id, &spend))
        (crate::family::card(&state, &viewer, &session, &family, now))
        (crate::signals::card(&state, &viewer, &session, &signals, now))
        div.split {
            div {
                h2 { "Timeline" }
                div.scroll { table #timeline {
                    thead { tr {
                        th { "At" } th { "Kind" } th { "Name · class" } th { "Status · attempt" }
                        th { "Key" } th { "Took" } th { "Arguments" } th { "Result" }
                    } }
                    tbody {
                        @for event in &events {
                            (event_row(event, &in_doubt, viewed, &id, now))
                        }
                    }
                } }
                @if !first_page || next_page.is_some() {
                    p.pages {
                        "Journal rows " (after + 1) "–" (after + i64::try_from(calls.len()).unwrap_or(0)) " "
                        @if !first_page {
                            a #first-calls href=(format!("{}?version={viewed}", session_href(&id))) { "← First rows" } " "
                        }
                        @if let Some(next) = next_page {
                            a #next-calls href=(format!("{}?version={viewed}&calls_after={next}", session_href(&id))) { "Next rows →" }
                        }
                    }
                }
            }
            div {
                h2 { "Checkpoint " (viewed) }
                p.versions {
                    "Versions: "
                    @for m in &metas {
                        a class=(if m.version == viewed { "on" } else { "" })
                          href=(format!("{}?version={}", session_href(&id), m.version)) { (m.version) }
                    }
                }
                div.card {
                    dl.facts {
                        dt { "Created" } dd { (time(checkpoint.meta.created_at)) }
                        dt { "Messages" } dd { (checkpoint.meta.message_count) }
                        dt { "Plan" } dd { (plan_progress(&checkpoint.plan)) }
                        dt { "Budget" } dd { (budget(&checkpoint.budget)) }
                    }
                    @if let Some(plan) = plan.filter(|p| !p.is_empty()) {
                        pre.plan { (visible(&plan.to_markdown(), 4000)) }
                    }
                }
                h2 { "Transcript (version " (viewed) ", " (messages.len()) " message" @if messages.len() != 1 { "s" } ")" }
                div.transcript {
                    @for (n, m) in messages.iter().enumerate() { (message(n + 1, m)) }
                }
                (fork_form(&state, &viewer, &id, viewed, &fork))
            }
        }
    };
    Ok(layout::page(&state, &viewer, Nav::Sessions, &title, body).await)
}

fn event_row(
    event: &Event<'_>,
    in_doubt: &[durable::CallId],
    viewed: i64,
    id: &SessionId,
    now: i64,
) -> Markup {
    match event {
        Event::Checkpoint { meta, plan, budget } => html! {
            tr class=(if meta.version == viewed { "checkpoint viewed" } else { "checkpoint" }) {
                td title=(time(meta.created_at)) { (age(meta.created_at, now)) }
                td { "checkpoint" }
                td { a href=(format!("{}?version={}", session_href(id), meta.version)) { "v" (meta.version) } }
                td colspan="5" {
                    (meta.message_count) " message" @if meta.message_count != 1 { "s" } " · plan " (plan.as_deref().unwrap_or("—"))
                    " · budget " (budget.as_deref().unwrap_or("—"))
                }
            }
        },
        Event::Call(c) => {
            let doubt = in_doubt.contains(&c.id);
            let kind = match c.kind {
                CallKind::Model => "model reply",
                CallKind::Tool => "tool call",
            };
            let took = c.finished_at.map_or_else(
                || "—".to_owned(),
                |f| coarse(u64::try_from(f - c.issued_at).unwrap_or(0)),
            );
            html! {
                tr class=(if doubt { "call doubt" } else { "call" }) data-call=(c.id.as_str()) {
                    td title=(time(c.issued_at)) { (age(c.issued_at, now)) }
                    td { (kind) }
                    td { span.mono { (visible(&c.identity.tool, 64)) } br; span.muted { (c.class.as_str()) } }
                    td {
                        @if doubt { span.pill.doubt { "issued (in doubt)" } }
                        @else { span class=(format!("pill {}", c.status.as_str())) { (c.status.as_str()) } }
                        span.muted { " · " (c.attempt) }
                    }
                    td.mono { (c.idempotency_key.as_deref().map_or_else(|| "—".to_owned(), |k| visible(k, 64))) }
                    td { (took) }
                    td.args {
                        @if let Some(edited) = c.approval.as_ref().and_then(|a| a.edited_args()) {
                            // Approved with an edit: the call ran (and its result is) with
                            // the approved arguments; both shown, labelled.
                            div { span.muted { "requested arguments " } code.args { (compact(&c.args, ARGS)) } }
                            div { span.muted { "approved (edited) arguments " } code.args { (compact(edited, ARGS)) } }
                        }
                        @else if c.args.is_null() { span.muted { "—" } }
                        @else { code.args { (compact(&c.args, ARGS)) } }
                    }
                    td { (result_size(c)) }
                }
                @if let Some(approval) = &c.approval { (approval_row(approval, now)) }
            }
        }
        Event::Approval(a) => html! {
            tr.approval data-call=(a.call.as_str()) {
                td title=(time(a.at)) { (age(a.at, now)) }
                td { "approval #" (a.position) }
                td.mono { (visible(a.call.as_str(), 64)) }
                td colspan="5" {
                    span class=(format!("pill {}", a.event.as_str())) { (a.event.as_str()) }
                    " · by " (visible(&a.by, 64))
                    @if let Some(note) = &a.note { " · " em { (visible(note, 300)) } }
                    @if let Some(after) = &a.args_after {
                        " · edited " code.args { (compact(a.args_before.as_ref().unwrap_or(&Value::Null), ARGS)) } " → " code.args { (compact(after, ARGS)) }
                    }
                }
            }
        },
        Event::Resolution(r) => html! {
            tr.resolution {
                td title=(time(r.at)) { (age(r.at, now)) }
                td { "resolution" }
                td.mono { (visible(r.call.as_str(), 64)) }
                td colspan="5" {
                    @match &r.resolution {
                        Resolution::Happened { result } => { "happened " code { (compact(result, ARGS)) } }
                        Resolution::DidNotHappen => { "did not happen" }
                    }
                    " · by " (visible(&r.by, 64))
                    @if let Some(note) = &r.note { " · " em { (visible(note, 300)) } }
                }
            }
        },
    }
}

/// The approval a journal row holds: the request and, once taken, the decision.
fn approval_row(approval: &Approval, now: i64) -> Markup {
    html! {
        tr.approval-detail {
            td {}
            td.muted { "approval" }
            td colspan="6" {
                "requested by " (visible(&approval.asked_by, 100)) " " span title=(time(approval.requested_at)) { (age(approval.requested_at, now)) }
                " · deadline "
                @match approval.deadline {
                    Some(at) => { span title=(time(at)) { (time(at)) " (" (age(at, now)) ")" } }
                    None => { "none" }
                }
                @if let Some(reasoning) = &approval.reasoning {
                    div { span.muted { "reasoning: " } span.reasoning-text { (visible(reasoning, 2000)) } }
                }
                div {
                    @match &approval.decision {
                        None => { span.pill.requested { "awaiting a decision" } " " a href="/approvals" { "decide" } }
                        Some(d) => {
                            @let event = match d.decision {
                                ApprovalDecision::Approve { .. } => "approved",
                                ApprovalDecision::Deny { .. } => "denied",
                                ApprovalDecision::Revoke { .. } => "revoked",
                                ApprovalDecision::Expire => "expired",
                            };
                            span class=(format!("pill {event}")) { (event) }
                            " by " (visible(&d.by, 64)) " at " (time(d.at))
                            @if let Some(note) = &d.note { " · " em { (visible(note, 300)) } }
                            @if let ApprovalDecision::Deny { reason } | ApprovalDecision::Revoke { reason } = &d.decision { " · reason: " em { (visible(reason, 300)) } }
                            @if let Some(edited) = approval.edited_args() { " · edited arguments " code.args { (compact(edited, ARGS)) } }
                        }
                    }
                }
            }
        }
    }
}

fn result_size(call: &CallRecord) -> String {
    match (&call.result, &call.error) {
        (Some(v), _) => size(v.to_string().len()),
        (None, Some(e)) => format!("error, {}", size(e.to_string().len())),
        (None, None) => "—".into(),
    }
}

/// One transcript message, secrets masked.
fn message(n: usize, value: &Value) -> Markup {
    let Ok(message) = serde_json::from_value::<Message>(value.clone()) else {
        return html! {
            div.msg { div.role { "#" (n) " (not a message)" } pre { (pretty(value, 4000)) } }
        };
    };
    let role = serde_json::to_value(message.role)
        .ok()
        .and_then(|r| r.as_str().map(str::to_owned))
        .unwrap_or_default();
    html! {
        div class=(format!("msg {role}")) {
            div.role { "#" (n) " " (role) }
            @for block in &message.content {
                @match block {
                    Block::Text { text } => { div.text { (visible(text, 20_000)) } }
                    Block::Reasoning { text } => { div.text.muted { "(reasoning) " (visible(text, 20_000)) } }
                    Block::ToolCall(call) => {
                        div.mono { "→ " (visible(&call.name, 64)) "(" (compact(&call.arguments, 2000)) ") "
                            span.muted { "[" (visible(&call.id, 64)) "]" } }
                    }
                    Block::ToolResult(result) => {
                        div.mono { "← " span.muted { "[" (visible(&result.call_id, 64)) "]" }
                            @if result.is_error { " error:" } " " (compact(&result.content, 2000)) }
                    }
                }
            }
        }
    }
}

/// What a fork at a version does with the parent's effects: the first [`FORK_SHOWN`]
/// entries and how many there are, read from the journal a page at a time.
struct ForkPreview {
    version: i64,
    entries: Vec<ForkEntry>,
    total: usize,
}

async fn fork_preview(
    store: &dyn durable::CheckpointStore,
    id: &SessionId,
    version: i64,
) -> Result<ForkPreview, StoreError> {
    let mut preview = ForkPreview {
        version,
        entries: Vec::new(),
        total: 0,
    };
    let mut after = 0;
    loop {
        let page = store.calls_page(id, after, JOURNAL_PAGE).await?;
        after += i64::try_from(page.len()).unwrap_or(i64::MAX);
        // No call is let run again, so no id can be unknown.
        if let Ok(plan) = ForkPlan::new(id.clone(), version, &page, &[]) {
            preview.total += plan.entries.len();
            let room = FORK_SHOWN.saturating_sub(preview.entries.len());
            preview.entries.extend(plan.entries.into_iter().take(room));
        }
        if i64::try_from(page.len()).unwrap_or(i64::MAX) < JOURNAL_PAGE {
            return Ok(preview);
        }
    }
}

/// What a fork at `version` does with the parent's effects, as a table (or a line when
/// there are none).
fn fork_effects(plan: &ForkPreview) -> Markup {
    html! {
        @if plan.entries.is_empty() {
            p { "This session recorded no effect from version " (plan.version) " on: the fork inherits nothing it could repeat." }
        } @else {
            p { "The parent's effects from version " (plan.version) " on, and what the fork does with each (a fork never repeats them):" }
            @if plan.total > plan.entries.len() {
                p.muted { "The first " (plan.entries.len()) " of " (plan.total) "; `durable fork <session> --from-version " (plan.version) " --dry-run` lists them all." }
            }
            div.scroll { table.fork-effects {
                thead { tr { th { "Call" } th { "Tool" } th { "Class" } th { "Step" } th { "Status" } th { "In the fork" } } }
                tbody {
                    @for e in &plan.entries {
                        tr {
                            td { code { (visible(e.call.as_str(), 100)) } }
                            td { (visible(&e.tool, 100)) }
                            td { (e.class.as_str()) }
                            td { (e.step) }
                            td { (e.status.as_str()) }
                            td { (e.effect) }
                        }
                    }
                }
            } }
        }
    }
}

fn fork_form(
    state: &AppState,
    viewer: &Viewer,
    id: &SessionId,
    viewed: i64,
    plan: &ForkPreview,
) -> Markup {
    let plan = Some(plan);
    html! {
        div.card {
            h2 { "Fork from a version" }
            p.muted { "Starts a new session from a checkpoint of this one (same app version); a worker resumes it by its id. \
                       The fork inherits the parent's effects from that version on: recorded results come back, in-doubt calls stay in doubt, \
                       and a call that would repeat one is refused. To let a fork run one again, use `durable fork --rerun` (audited)." }
            @if let Some(plan) = &plan { (fork_effects(plan)) }
            @if let Some(reason) = &state.read_only { (layout::read_only_notice(reason)) }
            form.inline #fork method="post" action=(format!("{}/fork", session_href(id))) {
                (csrf_field(viewer))
                label { "From version" input type="number" name="version" value=(viewed) min="0" size="5"; }
                label { "New session id" input type="text" name="to" placeholder="random UUID"; }
                button type="submit" disabled[state.read_only.is_some()] { "Fork" }
            }
        }
    }
}

#[derive(Deserialize)]
pub(crate) struct ForkForm {
    csrf: Option<String>,
    version: i64,
    #[serde(default)]
    to: String,
}

impl CsrfForm for ForkForm {
    fn csrf(&self) -> Option<&str> {
        self.csrf.as_deref()
    }
}

/// `POST /sessions/{id}/fork`.
pub(crate) async fn fork(
    State(state): State<AppState>,
    viewer: Viewer,
    Path(id): Path<String>,
    Posted(form): Posted<ForkForm>,
) -> Result<Markup, PageError> {
    if let Some(reason) = &state.read_only {
        return Err(PageError::read_only(reason));
    }
    let store = state.store.as_ref();
    let from = SessionId::new(id);
    let to = match form.to.trim() {
        "" => SessionId::random(),
        to => SessionId::new(to),
    };
    store.session(&from).await?;
    store.load_checkpoint(&from, Some(form.version)).await?;
    let plan = Some(fork_preview(store, &from, form.version).await?);
    let request = ForkSession::new(
        from.clone(),
        form.version,
        to.clone(),
        OWNER,
        Duration::from_secs(1),
    );
    let (_, lease) = store.fork_session_with(&request).await?;
    // The fork is for a worker to pick up: give its lease back at once.
    store.release_lease(&lease).await?;
    let record = store.session(&to).await?;
    let body = html! {
        h1 { "Forked" }
        p.notice.done {
            "forked session " code { (visible(from.as_str(), 200)) } " at version " (form.version)
            " into " code { (visible(to.as_str(), 200)) } " (app version " (visible(&record.app_version, 100))
            "); resume it with its id"
        }
        @if let Some(plan) = &plan { (fork_effects(plan)) }
        p { a href=(session_href(&to)) { "Open the new session" } " · " a href=(session_href(&from)) { "Back" } }
    };
    Ok(layout::page(&state, &viewer, Nav::Sessions, "Forked", body).await)
}
