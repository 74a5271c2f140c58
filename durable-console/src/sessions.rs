//! `/`: the sessions, filtered by status, app version and age, with their calls in doubt
//! and their calls awaiting approval.

use std::collections::HashMap;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use durable::SessionId;
use durable::store::{ListedSession, SessionFilter, SessionStatus};
use maud::{Markup, html};
use serde::Deserialize;

use crate::AppState;
use crate::auth::Viewer;
use crate::error::PageError;
use crate::format::{age, parse_duration, visible};
use crate::layout::{self, Nav};

/// The statuses the filter offers.
const STATUSES: &[SessionStatus] = &[
    SessionStatus::Active,
    SessionStatus::Parked,
    SessionStatus::AwaitingApproval,
    SessionStatus::Completed,
    SessionStatus::Failed,
    SessionStatus::Cancelled,
];

/// At most this many sessions are listed.
const LIMIT: i64 = 200;

/// The filter form (a `GET`: it changes nothing).
#[derive(Deserialize, Default)]
pub(crate) struct Filter {
    #[serde(default)]
    status: String,
    #[serde(default)]
    app_version: String,
    /// Only sessions updated within this long (`1h`).
    #[serde(default)]
    newer_than: String,
    /// Only sessions not updated within this long (`30d`).
    #[serde(default)]
    older_than: String,
}

/// `GET /`.
pub(crate) async fn page(
    State(state): State<AppState>,
    viewer: Viewer,
    Query(filter): Query<Filter>,
) -> Result<Markup, PageError> {
    let bad = |m: String| PageError::new(StatusCode::BAD_REQUEST, m);
    let store = state.store.as_ref();
    let now = store.now().await?;
    let mut query = SessionFilter::new();
    if !filter.status.is_empty() {
        let status = SessionStatus::parse(&filter.status)
            .ok_or_else(|| bad(format!("unknown status `{}`", filter.status)))?;
        query = query.with_statuses(vec![status]);
    }
    if !filter.older_than.trim().is_empty() {
        let window = parse_duration(&filter.older_than).map_err(bad)?;
        query = query.with_updated_before(now.saturating_sub(window));
    }
    let since = match filter.newer_than.trim() {
        "" => None,
        text => Some(now.saturating_sub(parse_duration(text).map_err(bad)?)),
    };
    let app_version = filter.app_version.trim();
    if since.is_none() && app_version.is_empty() {
        query = query.with_limit(LIMIT);
    }
    // A row this release cannot read (an unknown status) is listed as unknown, with its
    // raw status; it hides neither itself nor the others.
    let mut listed = Vec::new();
    let mut unreadable = Vec::new();
    for row in store.list_session_rows(&query).await? {
        match row {
            ListedSession::Read(s) => listed.push(*s),
            ListedSession::Unreadable { id, raw_status, .. } => unreadable.push((id, raw_status)),
            _ => {}
        }
    }
    listed.retain(|s| {
        since.is_none_or(|t| s.updated_at >= t)
            && (app_version.is_empty() || s.app_version == app_version)
    });
    let total = listed.len();
    listed.truncate(LIMIT as usize);
    let mut doubt: HashMap<SessionId, usize> = HashMap::new();
    for call in store.in_doubt(None).await? {
        *doubt.entry(call.identity.session).or_default() += 1;
    }
    let mut pending: HashMap<SessionId, usize> = HashMap::new();
    for p in crate::approvals::runtime(&state).approvals(None).await? {
        *pending.entry(p.call.identity.session).or_default() += 1;
    }

    let body = html! {
        h1 { "Sessions" }
        form.filters method="get" action="/" {
            label { "Status"
                select name="status" {
                    option value="" selected[filter.status.is_empty()] { "any" }
                    @for s in STATUSES {
                        option value=(s.as_str()) selected[filter.status == s.as_str()] { (s.as_str()) }
                    }
                }
            }
            label { "App version"
                input type="text" name="app_version" value=(filter.app_version) placeholder="any";
            }
            label { "Updated within"
                input type="text" name="newer_than" value=(filter.newer_than) placeholder="e.g. 1h" size="8";
            }
            label { "Not updated within"
                input type="text" name="older_than" value=(filter.older_than) placeholder="e.g. 30d" size="8";
            }
            button type="submit" { "Filter" }
            a href="/" { "clear" }
        }
        @if listed.is_empty() && unreadable.is_empty() {
            p.muted { "No sessions match." }
        } @else {
            table #sessions {
                thead { tr {
                    th { "Session" } th { "Status" } th { "App version" } th { "Lease" }
                    th { "Checkpoint" } th { "Updated" } th.num { "In doubt" } th.num { "Approvals" }
                } }
                tbody {
                    @for s in &listed {
                        @let in_doubt = doubt.get(&s.id).copied().unwrap_or(0);
                        @let awaiting = pending.get(&s.id).copied().unwrap_or(0);
                        tr {
                            td { a.mono href=(session_href(&s.id)) { (visible(s.id.as_str(), 64)) } }
                            td {
                                span class=(format!("pill {}", s.status.as_str())) { (s.status.as_str()) }
                                @if let Some(reason) = &s.status_reason {
                                    " " span.muted { (visible(reason, 80)) }
                                }
                            }
                            td.mono { (visible(&s.app_version, 64)) }
                            td {
                                @match (&s.lease_owner, s.lease_expires_at) {
                                    (Some(owner), Some(until)) if until > now => {
                                        (visible(owner, 64)) span.muted { " live, expires " (age(until, now)) }
                                    }
                                    (Some(owner), _) => { (visible(owner, 64)) span.muted { " expired" } }
                                    (None, _) => { span.muted { "—" } }
                                }
                            }
                            td { "v" (s.latest_version) }
                            td title=(crate::format::time(s.updated_at)) { (age(s.updated_at, now)) }
                            td.num {
                                @if in_doubt > 0 {
                                    a.count href=(format!("/in-doubt?session={}", encode(s.id.as_str()))) { (in_doubt) }
                                } @else { span.muted { "0" } }
                            }
                            td.num.approvals {
                                @if awaiting > 0 {
                                    a.count href=(format!("/approvals?session={}", encode(s.id.as_str()))) { (awaiting) }
                                } @else { span.muted { "0" } }
                            }
                        }
                    }
                    @for (id, raw) in &unreadable {
                        tr.unreadable {
                            td { a.mono href=(session_href(id)) { (visible(id.as_str(), 64)) } }
                            td {
                                span.pill.unknown { "unknown" }
                                " " span.muted { "status " code { (visible(raw, 64)) } ", which this release does not know" }
                            }
                            td colspan="6" { span.muted { "not readable by this release: upgrade durable, or repair the row" } }
                        }
                    }
                }
            }
            @if total > listed.len() {
                p.muted { "Showing " (listed.len()) " of " (total) "; narrow the filter to see the others." }
            }
        }
    };
    Ok(layout::page(&state, &viewer, Nav::Sessions, "Sessions", body).await)
}

/// The timeline's address for a session.
pub(crate) fn session_href(id: &SessionId) -> String {
    format!("/sessions/{}", encode(id.as_str()))
}

/// Percent-encodes everything but unreserved characters (a path segment or query value).
pub(crate) fn encode(text: &str) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}
