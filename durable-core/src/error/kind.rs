//! [`ErrorKind`]: what an error means to the caller, in a handful of cases.

#[cfg(feature = "runtime")]
use super::DurableError;
use super::{ConnectError, StoreError};

/// What an error means to the code that has to handle it: a handful of kinds to match
/// on instead of every variant, as [`std::io::ErrorKind`] classifies I/O errors. The
/// CLI's exit codes and the console's HTTP statuses are chosen from the kind alone.
///
/// ```
/// use durable_core::{DurableError, StoreError, error::ErrorKind};
/// use durable_core::ids::SessionId;
///
/// let session = SessionId::new("s-1");
/// let e = DurableError::from(StoreError::SessionNotFound(session));
/// let advice = match e.kind() {
///     ErrorKind::NotFound => "no such session: start one",
///     ErrorKind::Transient | ErrorKind::Overloaded => "retry later",
///     ErrorKind::OperatorNeeded => "surface it to a person",
///     _ => "report it",
/// };
/// assert_eq!(advice, "no such session: start one");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// What was named does not exist: a session, a call, a checkpoint version, a tool.
    NotFound,
    /// The request is well-formed, and the state does not allow it now: the session is
    /// leased or was taken over, a version moved on, the call is not in the state the
    /// operation needs. Re-read, then decide; retrying blindly does not help.
    Conflict,
    /// The input was refused before anything was written: arguments, ids, text,
    /// edits, values that cannot be journaled exactly.
    InvalidInput,
    /// A person must decide before this can go on: a call whose effect may have happened
    /// (`ReplayUnsafe`), a re-run that diverged from the journal, an effect a fork
    /// inherited, a changed schema, a checkpoint in doubt, an approved call that cannot
    /// run as approved, a parked session. Never retried automatically: that is how an
    /// effect happens twice.
    OperatorNeeded,
    /// The call waits for a person's approval; nothing ran. Park the session
    /// ([`Session::await_approval`](crate::Session::await_approval)).
    AwaitingApproval,
    /// A limit was reached: a budget, a size cap.
    LimitExceeded,
    /// What the store holds cannot be trusted: a seal does not hold, the store was
    /// rolled back. Nothing was changed; an operator investigates (`durable verify`).
    Integrity,
    /// A row this release cannot read: corrupt, or written by a newer release (an
    /// unknown status, say). Upgrade, or repair the row; the rest of the store is usable.
    Unreadable,
    /// The store cannot be used as configured: not a durable store, a schema too new or
    /// too old, a key missing, durability settings refused, a backend not compiled in.
    Unavailable,
    /// The store is read-only (or opened unverified) and was asked to change something.
    PermissionDenied,
    /// A passing failure of the database (connection lost, disk I/O): retrying later may
    /// succeed ([`DurableError::is_retryable`]).
    Transient,
    /// The store's capacity is used up (its connection pool stayed full): nothing was
    /// done; retry after the hint ([`DurableError::retry_after`]), or raise the pool's
    /// size ([`DurableError::is_retryable`]).
    Overloaded,
    /// The backend does not support the operation.
    Unsupported,
    /// The call waits for its turn under a fleet-wide rate limit, longer than the
    /// worker holds a session; nothing ran. Release the session until the time the
    /// error gives ([`Session::release_until`](crate::Session::release_until)) and ask
    /// again then ([`DurableError::RateLimited`]).
    RateLimited,
    /// The session was cancelled: nothing new runs in it. Return from the handler; an
    /// operator (or the parent) decided it.
    Cancelled,
}

impl ErrorKind {
    /// The snake_case name, for logs and JSON.
    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorKind::NotFound => "not_found",
            ErrorKind::Conflict => "conflict",
            ErrorKind::InvalidInput => "invalid_input",
            ErrorKind::OperatorNeeded => "operator_needed",
            ErrorKind::AwaitingApproval => "awaiting_approval",
            ErrorKind::LimitExceeded => "limit_exceeded",
            ErrorKind::Integrity => "integrity",
            ErrorKind::Unreadable => "unreadable",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::PermissionDenied => "permission_denied",
            ErrorKind::Transient => "transient",
            ErrorKind::Overloaded => "overloaded",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::RateLimited => "rate_limited",
            ErrorKind::Cancelled => "cancelled",
        }
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl StoreError {
    /// What this error means to the caller (see [`ErrorKind`]).
    pub fn kind(&self) -> ErrorKind {
        use StoreError as E;
        // Exhaustive on purpose: a new variant must say what it means.
        match self {
            E::SessionNotFound(_)
            | E::VersionNotFound { .. }
            | E::MessagesOutOfRange { .. }
            | E::CallNotFound(_)
            | E::LimitNotDefined { .. } => ErrorKind::NotFound,
            E::SessionExists(_)
            | E::Leased { .. }
            | E::LeaseLost { .. }
            | E::NotResumable { .. }
            | E::NotParked { .. }
            | E::SessionEnded { .. }
            | E::VersionConflict { .. }
            | E::ForkSourceChanged(_)
            | E::CallNotInDoubt { .. }
            | E::NotAwaitingApproval { .. }
            | E::ApprovalExpired { .. }
            | E::ApprovalNotExpired { .. }
            | E::IdempotencyConflict { .. }
            | E::StepClosed { .. }
            | E::AppVersionMismatch { .. } => ErrorKind::Conflict,
            E::Parked { .. } => ErrorKind::OperatorNeeded,
            E::CancelRequested { .. } => ErrorKind::Cancelled,
            E::EmptyDenialReason { .. }
            | E::InvalidId { .. }
            | E::InvalidText { .. }
            | E::InvalidSignal { .. }
            | E::InvalidLimit { .. }
            | E::InvalidRaise { .. } => ErrorKind::InvalidInput,
            E::Tampered { .. } | E::RolledBack { .. } => ErrorKind::Integrity,
            E::Corrupt { .. } => ErrorKind::Unreadable,
            E::KeyMissing { .. }
            | E::SchemaTooNew { .. }
            | E::SchemaTooOld { .. }
            | E::NotDurable { .. }
            | E::NotAStore { .. } => ErrorKind::Unavailable,
            E::ReadOnly { .. } => ErrorKind::PermissionDenied,
            E::Unsupported { .. } => ErrorKind::Unsupported,
            E::Database { .. } => ErrorKind::Transient,
            E::Overloaded { .. } => ErrorKind::Overloaded,
        }
    }
}

impl ConnectError {
    /// What this error means to the caller (see [`ErrorKind`]).
    pub fn kind(&self) -> ErrorKind {
        match self {
            ConnectError::FeatureDisabled { .. } | ConnectError::UnknownScheme { .. } => {
                ErrorKind::Unavailable
            }
            ConnectError::Store(e) => e.kind(),
        }
    }
}

#[cfg(feature = "runtime")]
impl DurableError {
    /// What this error means to the caller (see [`ErrorKind`]).
    pub fn kind(&self) -> ErrorKind {
        use DurableError as E;
        // Exhaustive on purpose: a new variant must say what it means.
        match self {
            E::Store(e) => e.kind(),
            E::Connect(e) => e.kind(),
            E::UnknownTool { .. } => ErrorKind::NotFound,
            E::InvalidArguments { .. }
            | E::ArgumentsMismatch { .. }
            | E::InvalidEdit { .. }
            | E::Encode { .. }
            | E::InvalidValue { .. }
            | E::Plan(_)
            | E::OneCallPerCheckpoint { .. }
            | E::StreamOver { .. } => ErrorKind::InvalidInput,
            E::ReplayUnsafe { .. }
            | E::ApprovedCallRefused { .. }
            | E::ReplayDiverged { .. }
            | E::InheritedEffect { .. }
            | E::SchemaChanged { .. }
            | E::CheckpointInDoubt { .. } => ErrorKind::OperatorNeeded,
            E::AwaitingApproval { .. } => ErrorKind::AwaitingApproval,
            E::RateLimited { .. } => ErrorKind::RateLimited,
            E::Cancelled { .. } => ErrorKind::Cancelled,
            E::NotAChild { .. } => ErrorKind::NotFound,
            E::ChildNotStarted { .. } => ErrorKind::Conflict,
            E::AppVersionMismatch { .. } | E::Decode { .. } => ErrorKind::Conflict,
            E::BudgetExceeded(_) | E::TooLarge { .. } => ErrorKind::LimitExceeded,
        }
    }
}

#[cfg(all(test, feature = "runtime"))]
mod tests {
    use super::*;
    use crate::ids::SessionId;

    #[test]
    fn kinds_route_the_common_cases() {
        let session = SessionId::new("s");
        assert_eq!(
            StoreError::SessionNotFound(session.clone()).kind(),
            ErrorKind::NotFound
        );
        assert_eq!(
            DurableError::from(StoreError::SessionNotFound(session)).kind(),
            ErrorKind::NotFound,
            "a store error inside a runtime error keeps its kind"
        );
        assert_eq!(
            StoreError::database("sqlite", std::io::Error::other("disk I/O error")).kind(),
            ErrorKind::Transient
        );
        assert_eq!(
            DurableError::BudgetExceeded(crate::snapshot::BudgetExceeded {
                session: None,
                limit: crate::snapshot::Limit::Tokens,
                ceiling: 1,
                spent: 1,
                asked: None
            })
            .kind(),
            ErrorKind::LimitExceeded
        );
    }

    #[test]
    fn only_transient_errors_are_retryable() {
        let session = SessionId::new("s");
        let transient = DurableError::from(StoreError::database(
            "sqlite",
            std::io::Error::other("disk I/O error"),
        ));
        assert_eq!(transient.kind(), ErrorKind::Transient);
        assert!(transient.is_retryable());
        let lost = DurableError::from(StoreError::LeaseLost { session, token: 1 });
        assert_eq!(lost.kind(), ErrorKind::Conflict);
        assert!(!lost.is_retryable());
    }
}
