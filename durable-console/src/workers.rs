//! `/workers`: the worker pools as `durable workers` shows them: the queues with their
//! limits and depths, each owner with the leases it holds and their last renewal, and the
//! sleeping sessions with their due time, each with *wake now*.
//!
//! Waking is two `POST`s, as in the inboxes ([`crate::inbox`]): the first says what it
//! will do and changes nothing; the second, from that page, ends the sleep through
//! [`Operator::wake`](durable::Operator::wake), as `durable wake` does. The same checks run
//! before both: the session exists, is active and is still asleep.

use std::collections::BTreeMap;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use durable::SessionId;
use durable::store::{SessionFilter, SessionRecord, SessionStatus};
use maud::{Markup, html};
use serde::Deserialize;

use crate::AppState;
use crate::auth::{CsrfForm, Posted, Viewer};
use crate::error::PageError;
use crate::format::{age, time, visible};
use crate::layout::{self, Nav, csrf_field};
use crate::sessions::{encode, session_href};

/// Whether `s` holds a lease that has not expired at `now`.
pub(crate) fn lease_live(s: &SessionRecord, now: i64) -> bool {
    s.lease_owner.is_some() && s.lease_expires_at.is_some_and(|t| t > now)
}

/// Whether `s` is asleep at `now`: active, its wake-up time to come, its lease free.
pub(crate) fn asleep(s: &SessionRecord, now: i64) -> bool {
    s.status == SessionStatus::Active && s.wake_at.is_some_and(|t| t > now) && !lease_live(s, now)
}

/// `3s ago`, `in 9m`, or `—`.
fn when(at: Option<i64>, now: i64) -> String {
    at.map_or_else(|| "—".to_owned(), |at| age(at, now))
}

/// `500/60s (burst 500)`, or `—`.
fn quota(q: Option<durable::limiter::Quota>) -> String {
    q.map_or_else(
        || "—".to_owned(),
        |q| format!("{}/{}ms (burst {})", q.amount, q.period_ms, q.burst),
    )
}

/// `GET /workers`.
pub(crate) async fn page(
    State(state): State<AppState>,
    viewer: Viewer,
) -> Result<Markup, PageError> {
    let store = state.store.as_ref();
    let now = store.now().await?;
    let queues = store.queues().await?;
    let limits = store.limiters().await?;
    let active = store
        .list_sessions(&SessionFilter::new().with_statuses(vec![SessionStatus::Active]))
        .await?;
    let mut owners: BTreeMap<&str, Vec<&SessionRecord>> = BTreeMap::new();
    for s in active.iter().filter(|s| lease_live(s, now)) {
        owners
            .entry(s.lease_owner.as_deref().unwrap_or_default())
            .or_default()
            .push(s);
    }
    for held in owners.values_mut() {
        held.sort_by(|a, b| a.id.as_str().cmp(b.id.as_str()));
    }
    let mut sleeping: Vec<&SessionRecord> = active.iter().filter(|s| asleep(s, now)).collect();
    sleeping.sort_by_key(|s| (s.wake_at, s.id.as_str().to_owned()));
    let disabled = state.read_only.is_some();

    let body = html! {
        h1 { "Workers" }
        p.muted {
            "The worker pools as the store sees them, on its clock: how each queue stands, which worker holds which session "
            "(a worker that stopped renewing its leases shows an old renewal), and the sessions asleep until their due time."
        }
        h2 { "Queues" }
        @if queues.is_empty() {
            p.muted #no-queues { "No queue has a session or a limit." }
        } @else {
            table #queues {
                thead { tr {
                    th { "Queue" } th.num { "Limit" } th.num { "Running" } th.num { "Ready" }
                    th.num { "Sleeping" } th.num title="Parents waiting for their children" { "Waiting" }
                    th.num { "Awaiting approval" } th.num { "Parked" } th { "Next wake-up" }
                } }
                tbody {
                    @for q in &queues {
                        tr data-queue=(q.name) {
                            td.mono { (visible(&q.name, 64)) }
                            td.num.limit {
                                @match q.max_running {
                                    Some(n) => { (n) }
                                    None => { span.muted { "—" } }
                                }
                            }
                            td.num.running { (q.running) }
                            td.num.ready { (q.ready) }
                            td.num.sleeping { (q.sleeping) }
                            td.num.waiting { (q.waiting) }
                            td.num.awaiting { (q.awaiting_approval) }
                            td.num.parked { (q.parked) }
                            td.next-wake {
                                @match q.next_wake_at {
                                    Some(at) => { span title=(time(at)) { (age(at, now)) } }
                                    None => { span.muted { "—" } }
                                }
                            }
                        }
                    }
                }
            }
            p.muted { "Limits are fleet-wide, across every worker of the store: " code { "durable queue-limit <queue> <N>" } " sets one, " code { "--remove" } " lifts it." }
        }
        h2 { "Rate limits" }
        @if limits.is_empty() {
            p.muted #no-limits { "No rate limit is defined in this store." }
        } @else {
            table #limits {
                thead { tr {
                    th { "Limit" } th { "Requests" } th { "Tokens" } th.num { "Rate" }
                    th.num { "Waiters" } th { "Next start" } th { "Held until (429)" } th.num { "429s" } th.num { "Admitted" }
                } }
                tbody {
                    @for l in &limits {
                        tr data-limit=(l.name) {
                            td.mono { (visible(&l.name, 64)) }
                            td.requests { (quota(l.limit.requests)) }
                            td.tokens { (quota(l.limit.tokens)) }
                            td.num.rate {
                                @match l.current_requests {
                                    Some(r) => { (format!("{r:.1}")) }
                                    None => { span.muted { "—" } }
                                }
                            }
                            td.num.waiters { (l.waiters) }
                            td.next-start { (when(l.next_start_at.filter(|&at| at > now), now)) }
                            td.held { (when(l.throttled_until, now)) }
                            td.num.throttles { (l.throttles) }
                            td.num.admitted { (l.admitted) }
                        }
                    }
                }
            }
            p.muted { "Shared by every worker of the store; calls over a limit wait their turn, first come, first served. The rate counts calls started in the last period." }
        }
        h2 { "Owners" }
        @if owners.is_empty() {
            p.muted #no-owners { "No worker holds a live lease." }
        } @else {
            table #owners {
                thead { tr {
                    th { "Owner" } th.num { "Sessions" } th { "Oldest renewal" }
                    th { "Session" } th { "Queue" } th { "Renewed" } th { "Lease expires" }
                } }
                tbody {
                    @for (owner, held) in &owners {
                        @let oldest = held.iter().filter_map(|s| s.lease_renewed_at).min();
                        @for (i, s) in held.iter().enumerate() {
                            tr data-owner=(owner) {
                                @if i == 0 {
                                    td.mono.owner rowspan=(held.len()) { (visible(owner, 64)) }
                                    td.num.held rowspan=(held.len()) { (held.len()) }
                                    td.oldest rowspan=(held.len()) { (when(oldest, now)) }
                                }
                                td { a.mono href=(session_href(&s.id)) { (visible(s.id.as_str(), 64)) } }
                                td.mono { (visible(&s.queue, 64)) }
                                td { (when(s.lease_renewed_at, now)) }
                                td { (when(s.lease_expires_at, now)) }
                            }
                        }
                    }
                }
            }
        }
        h2 { "Sleeping" }
        @if sleeping.is_empty() {
            p.muted #no-sleepers { "No session is asleep." }
        } @else {
            @if let Some(reason) = &state.read_only { (layout::read_only_notice(reason)) }
            table #sleeping {
                thead { tr { th { "Session" } th { "Queue" } th { "Due" } th { "At" } th {} } }
                tbody {
                    @for s in &sleeping {
                        @let due = s.wake_at.unwrap_or_default();
                        tr data-session=(s.id.as_str()) {
                            td { a.mono href=(session_href(&s.id)) { (visible(s.id.as_str(), 64)) } }
                            td.mono { (visible(&s.queue, 64)) }
                            td.due { (age(due, now)) }
                            td { (time(due)) }
                            td {
                                form.wake method="post" action=(format!("/workers/{}/confirm", encode(s.id.as_str()))) {
                                    (csrf_field(&viewer))
                                    button.secondary type="submit" disabled[disabled] { "Wake now…" }
                                }
                            }
                        }
                    }
                }
            }
        }
    };
    Ok(layout::page(&state, &viewer, Nav::Workers, "Workers", body).await)
}

/// The wake form: its CSRF token only.
#[derive(Deserialize)]
pub(crate) struct WakeForm {
    csrf: Option<String>,
}

impl CsrfForm for WakeForm {
    fn csrf(&self) -> Option<&str> {
        self.csrf.as_deref()
    }
}

/// The session, checked to be asleep now (`durable wake`'s checks); with the store's now.
async fn check(state: &AppState, session: &str) -> Result<(SessionRecord, i64), PageError> {
    if let Some(reason) = &state.read_only {
        return Err(PageError::read_only(reason));
    }
    let store = state.store.as_ref();
    let record = store.session(&SessionId::new(session)).await?;
    let now = store.now().await?;
    let shown = visible(session, 64);
    let refused = |m: String| PageError::new(StatusCode::CONFLICT, m);
    if record.status != SessionStatus::Active {
        return Err(refused(format!(
            "session `{shown}` is {}, not active: only an active session sleeps; nothing was changed",
            record.status.as_str()
        )));
    }
    if !asleep(&record, now) {
        let why = match &record.lease_owner {
            Some(owner) if lease_live(&record, now) => {
                format!(": it is running, leased by `{}`", visible(owner, 64))
            }
            _ => String::new(),
        };
        return Err(refused(format!(
            "session `{shown}` is not asleep{why}; nothing was changed"
        )));
    }
    Ok((record, now))
}

/// What waking does: `before` the confirmation, or once `done`.
fn what_it_does(record: &SessionRecord, now: i64, done: bool) -> String {
    let until = record.wake_at.unwrap_or_default();
    format!(
        "{} session `{}` (asleep until {}, {}): the next claim of a pool serving queue `{}` takes it",
        if done { "woke" } else { "Wake" },
        visible(record.id.as_str(), 64),
        time(until),
        age(until, now),
        visible(&record.queue, 64)
    )
}

/// `POST /workers/{session}/confirm`: what waking will do; changes nothing.
pub(crate) async fn confirm(
    State(state): State<AppState>,
    viewer: Viewer,
    Path(session): Path<String>,
    Posted(_form): Posted<WakeForm>,
) -> Result<Markup, PageError> {
    let (record, now) = check(&state, &session).await?;
    let action = format!("/workers/{}/wake", encode(&session));
    let body = html! {
        h1 { "Confirm: wake the session" }
        div.card #confirm {
            p #consequence { strong { (what_it_does(&record, now, false)) "." } }
            p.muted { "Its sleep ends now instead of at its due time; the agent resumes from its latest checkpoint, as it would have at the due time." }
            form.inline method="post" action=(action) {
                (csrf_field(&viewer))
                button type="submit" { "Confirm" }
                a href="/workers" { "Cancel" }
            }
        }
    };
    Ok(layout::page(&state, &viewer, Nav::Workers, "Confirm", body).await)
}

/// `POST /workers/{session}/wake`: ends the sleep.
pub(crate) async fn wake(
    State(state): State<AppState>,
    viewer: Viewer,
    Path(session): Path<String>,
    Posted(_form): Posted<WakeForm>,
) -> Result<Markup, PageError> {
    let (record, now) = check(&state, &session).await?;
    crate::approvals::runtime(&state)
        .operator()
        .wake(&record.id)
        .await?;
    let body = html! {
        h1 { "Woken" }
        p.notice.done #outcome { (what_it_does(&record, now, true)) }
        p {
            a href="/workers" { "Back to the workers" } " · "
            a href=(session_href(&record.id)) { "Open the session" }
        }
    };
    Ok(layout::page(&state, &viewer, Nav::Workers, "Woken", body).await)
}
