//! Exit codes and the one-line error report.

use std::process::ExitCode;

use durable::{ConnectError, DurableError, StoreError};

/// What a failure means to a script (see `EXIT_CODES` in `main.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    Ok = 0,
    Failure = 1,
    Usage = 2,
    NotFound = 3,
    Refused = 4,
    InvalidInput = 5,
    Unavailable = 6,
}

impl From<Code> for ExitCode {
    fn from(code: Code) -> Self {
        ExitCode::from(code as u8)
    }
}

/// A failed command: an exit code and one line for stderr.
#[derive(Debug)]
pub struct CliError {
    pub code: Code,
    pub message: String,
}

impl CliError {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        CliError {
            code,
            message: message.into(),
        }
    }

    /// An error while opening the store: anything the database says is "unavailable".
    pub fn connect(e: ConnectError) -> Self {
        if let ConnectError::FeatureDisabled { scheme, feature } = &e {
            return CliError::new(
                Code::Unavailable,
                format!(
                    "this `durable` binary was built without `{scheme}:` support; rebuild it with `--features cli,{feature}`"
                ),
            );
        }
        let code = match &e {
            ConnectError::UnknownScheme { .. } => Code::Unavailable,
            ConnectError::Store(StoreError::SchemaTooNew { .. } | StoreError::Database { .. }) => {
                Code::Unavailable
            }
            ConnectError::Store(other) => store_code(other),
            _ => Code::Unavailable,
        };
        CliError::new(code, e.to_string())
    }

    /// Prints `error: …` (one line) and returns the exit code.
    pub fn report(&self) -> ExitCode {
        eprintln!("error: {}", one_line(&self.message));
        self.code.into()
    }
}

fn store_code(e: &StoreError) -> Code {
    match e {
        StoreError::SessionNotFound(_)
        | StoreError::VersionNotFound { .. }
        | StoreError::CallNotFound(_) => Code::NotFound,
        StoreError::SessionExists(_)
        | StoreError::Leased { .. }
        | StoreError::LeaseLost { .. }
        | StoreError::NotResumable { .. }
        | StoreError::NotParked { .. }
        | StoreError::VersionConflict { .. }
        | StoreError::CallNotInDoubt { .. }
        | StoreError::IdempotencyConflict { .. }
        | StoreError::AppVersionMismatch { .. }
        | StoreError::NotDurable { .. } => Code::Refused,
        StoreError::SchemaTooNew { .. }
        | StoreError::NotAStore { .. }
        | StoreError::KeyMissing { .. } => Code::Unavailable,
        _ => Code::Failure,
    }
}

impl From<StoreError> for CliError {
    fn from(e: StoreError) -> Self {
        let code = store_code(&e);
        let message = match &e {
            // The error's source carries the detail ("connection refused", …).
            StoreError::Database { .. } => {
                let mut text = e.to_string();
                let mut source = std::error::Error::source(&e);
                while let Some(s) = source {
                    let more = s.to_string();
                    if !text.contains(&more) {
                        text.push_str(": ");
                        text.push_str(&more);
                    }
                    source = s.source();
                }
                text
            }
            _ => e.to_string(),
        };
        CliError::new(code, message)
    }
}

impl From<DurableError> for CliError {
    fn from(e: DurableError) -> Self {
        match e {
            DurableError::Store(s) => s.into(),
            other => CliError::new(Code::Failure, other.to_string()),
        }
    }
}

/// Newlines (multi-line driver errors) folded so the report stays one line.
fn one_line(text: &str) -> String {
    text.split(['\n', '\r'])
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}
