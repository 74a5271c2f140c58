//! A session's signals on its page: those sent to it, pending or read, and the send form
//! (`POST /sessions/{id}/signal`), how a person steers a running agent or answers one
//! that waits.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use durable::json::{ArgLimits, parse_json};
use durable::store::{NewSignal, SignalRecord};
use durable::{CheckpointStore, SessionId, StoreError};
use maud::{Markup, html};
use serde::Deserialize;
use serde_json::Value;

use crate::AppState;
use crate::auth::{CsrfForm, Posted, Viewer};
use crate::error::PageError;
use crate::format::{age, compact, visible};
use crate::layout::{self, Nav, csrf_field};
use crate::sessions::session_href;

/// The signals sent to `session`, oldest first (none when the store has no signals).
pub(crate) async fn read(
    store: &dyn CheckpointStore,
    session: &SessionId,
) -> Result<Vec<SignalRecord>, PageError> {
    match store.signals(session).await {
        Ok(signals) => Ok(signals),
        Err(StoreError::Unsupported { .. }) => Ok(Vec::new()),
        Err(e) => Err(e.into()),
    }
}

/// The signals card: each signal with its state, and the send form while the session
/// has not ended.
pub(crate) fn card(
    state: &AppState,
    viewer: &Viewer,
    session: &durable::store::SessionRecord,
    signals: &[SignalRecord],
    now: i64,
) -> Markup {
    let pending = signals.iter().filter(|s| s.is_pending()).count();
    html! {
        div.card #signals {
            h2 { "Signals" }
            @if let Some(name) = session
                .waiting_for
                .as_deref()
                .and_then(|w| w.strip_prefix(durable::store::WAITING_FOR_SIGNAL))
                .filter(|_| session.waiting_until.is_some_and(|at| at > now))
            {
                p.waiting { "Waiting for the signal " code { (visible(name, 64)) } ": sending it wakes the session at once." }
            }
            @if signals.is_empty() {
                p.muted { "No signals." }
            } @else {
                p.muted { (pending) " pending of " (signals.len()) "." }
                table #signal-list {
                    thead { tr { th { "#" } th { "Name" } th { "From" } th { "Sent" } th { "Read" } th { "Payload" } } }
                    tbody {
                        @for s in signals {
                            tr class=(if s.is_pending() { "pending" } else { "read" }) {
                                td.num { (s.id) }
                                td { code { (visible(&s.name, 64)) } }
                                td { (visible(&s.sent_by, 64)) }
                                td { (age(s.sent_at, now)) }
                                td {
                                    @match s.consumed_at {
                                        Some(at) => { (age(at, now)) }
                                        None => { span class="pill active" { "pending" } }
                                    }
                                }
                                td.mono { (compact(&s.payload, 300)) }
                            }
                        }
                    }
                }
            }
            @if !session.status.is_terminal() {
                @if let Some(reason) = &state.read_only { (layout::read_only_notice(reason)) }
                form.inline #send-signal method="post" action=(format!("{}/signal", session_href(&session.id))) {
                    (csrf_field(viewer))
                    label { "Name" input type="text" name="name" required; }
                    label { "Payload (JSON)" input type="text" name="payload" placeholder="\"use the other account\""; }
                    label { "By" input type="text" name="by" value=(state.operator); }
                    button type="submit" disabled[state.read_only.is_some()] { "Send signal" }
                }
            }
        }
    }
}

#[derive(Deserialize)]
pub(crate) struct SignalForm {
    csrf: Option<String>,
    name: String,
    #[serde(default)]
    payload: String,
    by: String,
}

impl CsrfForm for SignalForm {
    fn csrf(&self) -> Option<&str> {
        self.csrf.as_deref()
    }
}

/// `POST /sessions/{id}/signal`.
pub(crate) async fn send(
    State(state): State<AppState>,
    viewer: Viewer,
    Path(id): Path<String>,
    Posted(form): Posted<SignalForm>,
) -> Result<Markup, PageError> {
    if let Some(reason) = &state.read_only {
        return Err(PageError::read_only(reason));
    }
    let id = SessionId::new(id);
    let payload: Value = match form.payload.trim() {
        "" => Value::Null,
        text => parse_json(text, &ArgLimits::default()).map_err(|e| {
            PageError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                format!(
                    "the payload is not valid JSON ({e}); e.g. {{\"ok\": true}}, or a JSON string: \"use the other account\""
                ),
            )
        })?,
    };
    let signal = NewSignal::new(id.clone(), form.name.trim(), payload, form.by.trim());
    let sent = state.store.send_signal(&signal).await?;
    let body = html! {
        h1 { "Signal sent" }
        p.notice.done #signal-sent {
            "Sent signal " code { (visible(&sent.name, 64)) } " #" (sent.id) " to session "
            code { (visible(sent.session.as_str(), 200)) }
            ": it waits until the session reads it."
        }
        p { a href=(session_href(&id)) { "Back to the session" } }
    };
    Ok(layout::page(&state, &viewer, Nav::Sessions, "Signal sent", body).await)
}
