//! A failed request as a page: a status code and one sentence.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use durable::error::ErrorKind;
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

/// The status an error of this kind is shown with (the CLI's exit codes, as HTTP): the
/// one place the console maps errors to statuses.
fn status_of(kind: ErrorKind) -> StatusCode {
    match kind {
        ErrorKind::NotFound => StatusCode::NOT_FOUND,
        ErrorKind::Conflict
        | ErrorKind::OperatorNeeded
        | ErrorKind::AwaitingApproval
        | ErrorKind::LimitExceeded
        | ErrorKind::Cancelled => StatusCode::CONFLICT,
        ErrorKind::InvalidInput => StatusCode::UNPROCESSABLE_ENTITY,
        ErrorKind::PermissionDenied => StatusCode::FORBIDDEN,
        ErrorKind::Unavailable | ErrorKind::Transient | ErrorKind::Overloaded => {
            StatusCode::SERVICE_UNAVAILABLE
        }
        ErrorKind::Unsupported => StatusCode::NOT_IMPLEMENTED,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl From<StoreError> for PageError {
    fn from(e: StoreError) -> Self {
        PageError::new(status_of(e.kind()), e.to_string())
    }
}

impl From<DurableError> for PageError {
    fn from(e: DurableError) -> Self {
        match e {
            DurableError::Store(e) => e.into(),
            other => PageError::new(status_of(other.kind()), other.to_string()),
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
