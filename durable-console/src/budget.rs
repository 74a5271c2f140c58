//! A session's budget on its page: spend against each ceiling, the operator's raises, and
//! the form that raises a ceiling (`POST /sessions/{id}/budget`), through
//! [`Operator::raise_limit`](durable::Operator::raise_limit) as `durable budget raise`
//! does: audited, and a session parked at its ceiling is active again.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use durable::budget::{SessionBudget, session_budget};
use durable::{Durable, Limit, SessionId};
use maud::{Markup, html};
use serde::Deserialize;

use crate::AppState;
use crate::auth::{CsrfForm, Posted, Viewer};
use crate::error::PageError;
use crate::format::{time, visible};
use crate::layout::{self, Nav, csrf_field};
use crate::sessions::session_href;

/// The lease owner of the runtime that records raises, as the CLI's.
const OWNER: &str = "durable-console";

/// How `id` stands against its ceilings, or why it cannot be told (a budget that does
/// not decode is shown as such, the page still renders).
pub(crate) async fn standing(state: &AppState, id: &SessionId) -> Result<SessionBudget, String> {
    session_budget(state.store.as_ref(), id)
        .await
        .map_err(|e| e.to_string())
}

/// The session page's budget card.
pub(crate) fn card(
    state: &AppState,
    viewer: &Viewer,
    id: &SessionId,
    standing: &Result<SessionBudget, String>,
) -> Markup {
    html! {
        div.card #budget {
            h2 { "Budget" }
            @match standing {
                Err(e) => { p.muted { "(unreadable: " (visible(e, 300)) ")" } }
                Ok(standing) => {
                    @let b = &standing.budget;
                    p {
                        "Spent " strong { (Limit::Usd.format_amount(b.spent_nano_usd)) }
                        " · " (b.total_tokens()) " tokens (" (b.input_tokens) " in, " (b.output_tokens) " out)"
                        " · " (b.model_calls) " model calls · " (b.tool_calls) " tool calls"
                        span.muted { " (version " (standing.version) " with the turn under way)" }
                    }
                    @if standing.ceilings.is_empty() {
                        p.muted #no-ceilings { "No ceilings." }
                    } @else {
                        table #ceilings {
                            thead { tr { th { "Limit" } th { "Spent" } th { "Ceiling" } th { "Left" } th {} } }
                            tbody {
                                @for c in &standing.ceilings {
                                    @let reached = c.spent >= c.ceiling;
                                    tr class=(if reached { "ceiling reached" } else { "ceiling" }) data-limit=(c.limit.to_string()) {
                                        td.mono { (visible(&c.limit.to_string(), 100)) }
                                        td { (c.limit.format_amount(c.spent)) }
                                        td { (c.limit.format_amount(c.ceiling)) }
                                        td { (c.limit.format_amount(c.ceiling.saturating_sub(c.spent))) }
                                        td { @if reached { span.pill.parked { "reached" } } }
                                    }
                                }
                            }
                        }
                    }
                    @for raise in &standing.raises {
                        p.muted.raise {
                            "Raised " code { (visible(&raise.limit.to_string(), 100)) } " to "
                            (raise.limit.format_amount(raise.ceiling)) " by " (visible(&raise.by, 100))
                            " " (time(raise.at))
                            @if let Some(note) = &raise.note { " — " (visible(note, 300)) }
                        }
                    }
                }
            }
            @if let Some(reason) = &state.read_only { (layout::read_only_notice(reason)) }
            form.inline #raise method="post" action=(format!("{}/budget", session_href(id))) {
                (csrf_field(viewer))
                label { "Limit" input type="text" name="limit" placeholder="usd, tokens, model_calls, tool_calls, wall_time, tool:<name>" size="18"; }
                label { "New ceiling" input type="text" name="amount" placeholder="5.00, 2h, 100" size="8"; }
                label { "Note" input type="text" name="note"; }
                label { "By" input type="text" name="by" value=(state.operator); }
                button type="submit" disabled[state.read_only.is_some()] { "Raise ceiling" }
            }
        }
    }
}

#[derive(Deserialize)]
pub(crate) struct RaiseForm {
    csrf: Option<String>,
    limit: String,
    amount: String,
    #[serde(default)]
    note: String,
    #[serde(default)]
    by: String,
}

impl CsrfForm for RaiseForm {
    fn csrf(&self) -> Option<&str> {
        self.csrf.as_deref()
    }
}

/// `POST /sessions/{id}/budget`.
pub(crate) async fn raise(
    State(state): State<AppState>,
    viewer: Viewer,
    Path(id): Path<String>,
    Posted(form): Posted<RaiseForm>,
) -> Result<Markup, PageError> {
    if let Some(reason) = &state.read_only {
        return Err(PageError::read_only(reason));
    }
    let id = SessionId::new(id);
    let invalid =
        |e: durable::budget::InvalidLimit| PageError::new(StatusCode::BAD_REQUEST, e.to_string());
    let limit: Limit = form.limit.trim().parse().map_err(invalid)?;
    let ceiling = limit.parse_amount(&form.amount).map_err(invalid)?;
    let by = match form.by.trim() {
        "" => state.operator.to_string(),
        by => by.to_owned(),
    };
    let note = Some(form.note.trim()).filter(|n| !n.is_empty());
    let durable = Durable::builder(std::sync::Arc::clone(&state.store))
        .owner(OWNER)
        .build();
    let raised = durable
        .operator()
        .raise_limit(&id, limit.clone(), ceiling, &by, note)
        .await?;
    let record = state.store.session(&id).await?;
    let body = html! {
        h1 { "Ceiling raised" }
        p.notice.done #raised {
            "raised the " code { (visible(&raised.limit.to_string(), 100)) } " ceiling of session "
            code { (visible(id.as_str(), 200)) } " to " (limit.format_amount(ceiling)) ", by " (visible(&by, 100))
            "; the session is " (record.status.as_str())
            @if record.status == durable::store::SessionStatus::Active { ": the next worker continues it" }
        }
        p { a href=(session_href(&id)) { "Back to the session" } }
    };
    Ok(layout::page(&state, &viewer, Nav::Sessions, "Ceiling raised", body).await)
}
