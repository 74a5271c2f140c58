//! The exit codes and the one place an error's kind chooses one.
//!
//! Kept free of the rest of the CLI so that `tests/exit_codes.rs` compiles this very file
//! and checks it against the README's table of exit codes.

use std::process::ExitCode;

use durable::error::ErrorKind;

/// What a failure means to a script (see `EXIT_CODES` in `main.rs`, and the README's
/// table of exit codes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    Ok = 0,
    Failure = 1,
    Usage = 2,
    NotFound = 3,
    Refused = 4,
    InvalidInput = 5,
    Unavailable = 6,
    Integrity = 7,
}

impl From<Code> for ExitCode {
    fn from(code: Code) -> Self {
        ExitCode::from(code as u8)
    }
}

/// The exit code of an error of this kind: the one place the CLI maps errors to codes.
pub fn code_of(kind: ErrorKind) -> Code {
    match kind {
        ErrorKind::NotFound => Code::NotFound,
        ErrorKind::Conflict
        | ErrorKind::OperatorNeeded
        | ErrorKind::AwaitingApproval
        | ErrorKind::LimitExceeded
        | ErrorKind::PermissionDenied
        | ErrorKind::Cancelled => Code::Refused,
        ErrorKind::InvalidInput => Code::InvalidInput,
        ErrorKind::Unavailable | ErrorKind::Overloaded => Code::Unavailable,
        ErrorKind::Integrity => Code::Integrity,
        _ => Code::Failure,
    }
}
