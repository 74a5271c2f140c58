//! A failed request as a page: a status code and one sentence.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use durable::{DurableError, StoreError};
use maud::html;

use crate::layout;

/// A request that failed: what to tell the operator, and the status code.
#[derive(Debug)]
pub(crate) struct PageError {
    status: StatusCode,
    message: String,
}

impl PageError {
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> Self {
        PageError {
            status,
            message: message.into(),
        }
    }

    /// A change refused because the console is read-only.
    pub(crate) fn read_only(reason: &str) -> Self {
        PageError::new(
            StatusCode::FORBIDDEN,
            format!("this console is read-only ({reason}); nothing was changed"),
        )
    }
}

/// The status a store error is shown with (the CLI's exit codes, as HTTP).
fn store_status(e: &StoreError) -> StatusCode {
    match e {
        StoreError::SessionNotFound(_)
        | StoreError::VersionNotFound { .. }
        | StoreError::MessagesOutOfRange { .. }
        | StoreError::CallNotFound(_) => StatusCode::NOT_FOUND,
        StoreError::SessionExists(_)
        | StoreError::Leased { .. }
        | StoreError::LeaseLost { .. }
        | StoreError::NotResumable { .. }
        | StoreError::NotParked { .. }
        | StoreError::VersionConflict { .. }
        | StoreError::CallNotInDoubt { .. }
        | StoreError::NotAwaitingApproval { .. }
        | StoreError::ApprovalExpired { .. }
        | StoreError::ApprovalNotExpired { .. }
        | StoreError::IdempotencyConflict { .. }
        | StoreError::StepClosed { .. }
        | StoreError::AppVersionMismatch { .. }
        | StoreError::NotDurable { .. } => StatusCode::CONFLICT,
        StoreError::InvalidId { .. }
        | StoreError::InvalidText { .. }
        | StoreError::EmptyDenialReason { .. } => StatusCode::UNPROCESSABLE_ENTITY,
        StoreError::ReadOnly { .. } | StoreError::KeyMissing { .. } => StatusCode::FORBIDDEN,
        StoreError::Overloaded { .. } => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl From<StoreError> for PageError {
    fn from(e: StoreError) -> Self {
        PageError::new(store_status(&e), e.to_string())
    }
}

impl From<DurableError> for PageError {
    fn from(e: DurableError) -> Self {
        match e {
            DurableError::Store(e) => e.into(),
            e @ DurableError::InvalidEdit { .. } => {
                PageError::new(StatusCode::UNPROCESSABLE_ENTITY, e.to_string())
            }
            other => PageError::new(StatusCode::CONFLICT, other.to_string()),
        }
    }
}

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        let title = self.status.canonical_reason().unwrap_or("Error");
        let body = html! {
            section.problem-page {
                h1 { (self.status.as_u16()) " " (title) }
                p.problem { (self.message) }
                p { a href="/" { "Sessions" } " · " a href="/in-doubt" { "In doubt" } " · " a href="/approvals" { "Approvals" } " · " a href="/workers" { "Workers" } }
            }
        };
        (self.status, layout::bare(title, body)).into_response()
    }
}

/// Any route the console does not have.
pub(crate) async fn not_found() -> PageError {
    PageError::new(StatusCode::NOT_FOUND, "no such page")
}
