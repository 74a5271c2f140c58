//! A session's family on its page: its parent and children with their status, and the
//! cancel action (`POST /sessions/{id}/cancel`), which cancels the session and, unless
//! asked not to, its children.

use axum::extract::{Path, State};
use durable::store::{CancelEffect, CancelSession, ChildRecord, SessionRecord};
use durable::{CheckpointStore, SessionId, StoreError};
use maud::{Markup, html};
use serde::Deserialize;

use crate::AppState;
use crate::auth::{CsrfForm, Posted, Viewer};
use crate::error::PageError;
use crate::format::{age, visible};
use crate::layout::{self, Nav, csrf_field};
use crate::sessions::session_href;

/// The parent and children of `session` (none when the store has no child sessions).
pub(crate) async fn read(
    store: &dyn CheckpointStore,
    session: &SessionRecord,
) -> Result<(Option<SessionRecord>, Vec<ChildRecord>), PageError> {
    let children = match store.children(&session.id).await {
        Ok(children) => children,
        Err(StoreError::Unsupported { .. }) => Vec::new(),
        Err(e) => return Err(e.into()),
    };
    let parent = match &session.parent {
        Some(parent) => Some(store.session(parent).await?),
        None => None,
    };
    Ok((parent, children))
}

/// The family card: parent, children (each with its status), and the cancel form while
/// the session has not ended.
pub(crate) fn card(
    state: &AppState,
    viewer: &Viewer,
    session: &SessionRecord,
    (parent, children): &(Option<SessionRecord>, Vec<ChildRecord>),
    now: i64,
) -> Markup {
    html! {
        div.card #family {
            h2 { "Family" }
            dl.facts {
                dt { "Parent" }
                dd.parent {
                    @match parent {
                        Some(p) => {
                            a href=(session_href(&p.id)) { code { (visible(p.id.as_str(), 120)) } }
                            " " span class=(format!("pill {}", p.status.as_str())) { (p.status.as_str()) }
                        }
                        None => { "—" }
                    }
                }
                @if let Some(until) = session.waiting_until.filter(|&at| at > now && session.waiting_for.as_deref().is_none_or(|w| w == durable::store::WAITING_FOR_CHILDREN)) {
                    dt { "Waiting" }
                    dd.waiting { "for its children; a worker looks again " (age(until, now)) " at the latest" }
                }
                @if let Some(request) = session.cancel_requested.as_ref().filter(|_| !session.status.is_terminal()) {
                    dt { "Cancelling" }
                    dd.cancelling { "asked by " (visible(&request.by, 64)) " " (age(request.at, now)) ": " (visible(&request.reason, 300)) "; it stops at its next safe point" }
                }
            }
            @if children.is_empty() {
                p.muted { "No children." }
            } @else {
                table #children {
                    thead { tr { th { "Child" } th { "Status" } th { "Reason" } } }
                    tbody {
                        @for child in children {
                            tr {
                                td { a href=(session_href(&child.session.id)) { code { (visible(child.session.id.as_str(), 120)) } } }
                                td {
                                    span class=(format!("pill {}", child.session.status.as_str())) { (child.session.status.as_str()) }
                                    @if child.operator_needed { " " span.muted { "waits for an operator" } }
                                }
                                td { @if let Some(reason) = &child.session.status_reason { (visible(reason, 200)) } }
                            }
                        }
                    }
                }
            }
            @if !session.status.is_terminal() {
                @if let Some(reason) = &state.read_only { (layout::read_only_notice(reason)) }
                form.inline #cancel method="post" action=(format!("{}/cancel", session_href(&session.id))) {
                    (csrf_field(viewer))
                    label { "Reason" input type="text" name="reason" required; }
                    label { "By" input type="text" name="by" value=(state.operator); }
                    label { input type="checkbox" name="only" value="1"; " leave its children running" }
                    button type="submit" disabled[state.read_only.is_some()] { "Cancel session" }
                }
            }
        }
    }
}

#[derive(Deserialize)]
pub(crate) struct CancelForm {
    csrf: Option<String>,
    reason: String,
    by: String,
    #[serde(default)]
    only: Option<String>,
}

impl CsrfForm for CancelForm {
    fn csrf(&self) -> Option<&str> {
        self.csrf.as_deref()
    }
}

/// `POST /sessions/{id}/cancel`.
pub(crate) async fn cancel(
    State(state): State<AppState>,
    viewer: Viewer,
    Path(id): Path<String>,
    Posted(form): Posted<CancelForm>,
) -> Result<Markup, PageError> {
    if let Some(reason) = &state.read_only {
        return Err(PageError::read_only(reason));
    }
    let id = SessionId::new(id);
    let mut request = CancelSession::new(id.clone(), form.by.trim(), form.reason.trim());
    if form.only.is_some() {
        request = request.without_children();
    }
    let done = state.store.cancel_session(&request).await?;
    let body = html! {
        h1 { "Cancelled" }
        ul.notice.done #cancelled {
            @for reached in &done {
                li {
                    code { (visible(reached.session.as_str(), 200)) } ": "
                    @match reached.effect {
                        CancelEffect::Cancelled => { "cancelled" }
                        CancelEffect::Requested => { "asked to stop: a worker holds it, it ends at its next safe point" }
                        CancelEffect::AlreadyEnded => { "had already ended" }
                        _ => { "reached" }
                    }
                }
            }
        }
        p { a href=(session_href(&id)) { "Back to the session" } }
    };
    Ok(layout::page(&state, &viewer, Nav::Sessions, "Cancelled", body).await)
}
