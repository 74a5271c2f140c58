//! `/`: the sessions, filtered by status, app version and age, with their calls in doubt
//! and their calls awaiting approval.

use std::collections::HashMap;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use durable::SessionId;
use durable::store::{ListedSession, SessionCursor, SessionFilter, SessionStatus};
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

/// Sessions on one page; the next page is a link (a keyset cursor, `?after=`).
const LIMIT: usize = 100;

/// Sessions read from the store at a time while filling a page.
const READ: i64 = 200;

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
    /// The page after this cursor (`<updated_at>:<id>`, the last session of the
    /// previous page).
    #[serde(default)]
    after: String,
}

impl Filter {
    /// This filter's first page.
    fn first_href(&self) -> String {
        format!(
            "/?status={}&app_version={}&newer_than={}&older_than={}",
            encode(&self.status),
            encode(&self.app_version),
            encode(&self.newer_than),
            encode(&self.older_than)
        )
    }

    /// This filter's address with `after` as the cursor: the next page's link.
    fn next_href(&self, after: &SessionCursor) -> String {
        format!(
            "/?status={}&app_version={}&newer_than={}&older_than={}&after={}",
            encode(&self.status),
            encode(&self.app_version),
            encode(&self.newer_than),
            encode(&self.older_than),
            encode(&after.to_string())
        )
    }
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
    let mut cursor = match filter.after.trim() {
        "" => None,
        text => Some(SessionCursor::parse(text).ok_or_else(|| {
            bad(format!(
                "`{text}` is not a page cursor (`<updated_at>:<id>`); follow the \"Next page\" link"
            ))
        })?),
    };
    // Page by page from the store (keyset, newest first), keeping the sessions that match,
    // until the page is full and one more shows there is a next page: what is held is a
    // page, whatever the store holds.
    let mut listed = Vec::with_capacity(LIMIT + 1);
    // A row this release cannot read (an unknown status) is listed as unknown, with its
    // raw status; it hides neither itself nor the others.
    let mut unreadable = Vec::new();
    'read: loop {
        let mut page = query.clone().with_limit(READ);
        if let Some(after) = &cursor {
            page = page.with_after(after.clone());
        }
        let page = store.list_session_rows(&page).await?;
        let full = page.len() == usize::try_from(READ).unwrap_or(usize::MAX);
        cursor = page.last().map(SessionCursor::of).or(cursor);
        for row in page {
            let s = match row {
                ListedSession::Read(s) => *s,
                ListedSession::Unreadable { id, raw_status, .. } => {
                    unreadable.push((id, raw_status));
                    continue;
                }
                _ => continue,
            };
            if since.is_some_and(|t| s.updated_at < t) {
                // Newest first: the rest is older still.
                break 'read;
            }
            if app_version.is_empty() || s.app_version == app_version {
                listed.push(s);
                if listed.len() > LIMIT {
                    break 'read;
                }
            }
        }
        if !full {
            break;
        }
    }
    let next = (listed.len() > LIMIT).then(|| {
        listed.truncate(LIMIT);
        listed.last().map(SessionCursor::after)
    });
    let next = next.flatten();
    let mut doubt: HashMap<SessionId, usize> = HashMap::new();
    for call in store.in_doubt(None).await? {
        *doubt.entry(call.identity.session).or_default() += 1;
    }
    let mut pending: HashMap<SessionId, usize> = HashMap::new();
    for p in crate::approvals::runtime(&state)
        .operator()
        .approvals(None)
        .await?
    {
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
            @if next.is_some() || !filter.after.trim().is_empty() {
                p.pages {
                    @if !filter.after.trim().is_empty() {
                        a #first-page href=(filter.first_href()) { "← First page" } " "
                    }
                    @if let Some(after) = &next {
                        a #next-page href=(filter.next_href(after)) { "Next page →" }
                    }
                }
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
