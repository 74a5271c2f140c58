//! Exit codes and the one-line error report.

mod code;

use std::process::ExitCode;
use std::sync::OnceLock;

use durable::error::{ConnectError, ErrorKind};
use durable::{DurableError, StoreError};

use crate::display::{LINE, clip};

pub use code::Code;
use code::code_of;

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
                    "this `durable` binary was built without `{scheme}:` support; reinstall durable-cli with `--features {feature}`"
                ),
            );
        }
        match e {
            ConnectError::Store(e) => CliError::open(e),
            other => CliError::new(Code::Unavailable, other.to_string()),
        }
    }

    /// An error while opening the store: the database's refusals (not a durable store,
    /// schema too new or too old, a key missing, cannot connect) are "unavailable".
    pub fn open(e: StoreError) -> Self {
        let code = match e.kind() {
            ErrorKind::Transient => Code::Unavailable,
            kind => code_of(kind),
        };
        CliError {
            code,
            ..CliError::from(e)
        }
    }

    /// Prints `error: …` (one line, control characters escaped, at most
    /// [`LINE`](crate::display::LINE) characters) and returns the exit code.
    pub fn report(&self) -> ExitCode {
        let line = hide_passwords(&one_line(&self.message));
        eprintln!("error: {}", clip(&line, LINE));
        self.code.into()
    }
}

impl From<StoreError> for CliError {
    fn from(e: StoreError) -> Self {
        let code = code_of(e.kind());
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
            other => CliError::new(code_of(other.kind()), other.to_string()),
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

/// What may be the password of the `--db` URL, for [`hide_passwords`].
static PASSWORDS: OnceLock<Vec<String>> = OnceLock::new();

/// Makes every later error report blank out the password of `url` (belt and braces: the
/// messages are built from redacted URLs already).
pub fn hide_password_of(url: &str) {
    let _ = PASSWORDS.set(password_parts(url));
}

fn hide_passwords(line: &str) -> String {
    let mut line = line.to_owned();
    for part in PASSWORDS.get().into_iter().flatten() {
        line = line.replace(part.as_str(), "***");
    }
    line
}

/// Every string that may be the password of `url`, or part of it, under both readings
/// of a URL whose password holds unencoded `/`, `?`, `#` or `@`: the standard one (the
/// authority ends at the first `/`, `?` or `#`; the userinfo at its last `@`) and the
/// generous one (the userinfo ends at the URL's last `@`). Also their percent-decoded
/// forms, `password=` query values, and the pieces between `/`, `?` and `#` of the
/// generous reading (a parser that cut the authority there may show one), longest
/// first. Pieces shorter than 3 characters are left: blanking them would garble the line.
fn password_parts(url: &str) -> Vec<String> {
    let mut found: Vec<String> = Vec::new();
    let Some((_, rest)) = url.split_once("://") else {
        return found;
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let standard = authority.rsplit_once('@').map(|(userinfo, _)| userinfo);
    let generous = rest.rsplit_once('@').map(|(userinfo, _)| userinfo);
    for userinfo in [standard, generous].into_iter().flatten() {
        if let Some((_, password)) = userinfo.split_once(':') {
            found.push(password.to_owned());
            found.push(percent_decode(password));
        }
    }
    if let Some(password) = generous.and_then(|u| u.split_once(':')).map(|(_, p)| p) {
        found.extend(
            password
                .split(['/', '?', '#'])
                .filter(|piece| !piece.contains('@'))
                .map(str::to_owned),
        );
    }
    for pair in rest.split(['?', '&']) {
        if let Some((key, value)) = pair.split_once('=')
            && key.to_ascii_lowercase().ends_with("password")
        {
            found.push(value.to_owned());
            found.push(percent_decode(value));
        }
    }
    found.retain(|p| p.chars().count() >= 3);
    found.sort_by_key(|p| std::cmp::Reverse(p.len()));
    found.dedup();
    found
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        if bytes[i] == b'%'
            && let (Some(Some(h)), Some(Some(l))) = (
                bytes.get(i + 1).map(|&b| hex(b)),
                bytes.get(i + 2).map(|&b| hex(b)),
            )
        {
            out.push(u8::try_from(h * 16 + l).unwrap_or(b'?'));
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reading_of_the_password_is_found() {
        // Parsed as the standard reading would, the host is `ann` and the port `s3cr`.
        let parts = password_parts("postgres://ann:s3cr/t?x#y@z@db.local:5432/agents");
        assert_eq!(parts, vec!["s3cr/t?x#y@z".to_owned(), "s3cr".to_owned()]);
        let at = password_parts("postgres://ann:p@ss@db.local/agents");
        assert_eq!(at, vec!["p@ss".to_owned()]);
        let encoded = password_parts("postgres://ann:p%40ss%2Fword@db/agents");
        assert!(encoded.contains(&"p@ss/word".to_owned()), "{encoded:?}");
        let query = password_parts("postgres://db/agents?user=ann&password=hunter2");
        assert_eq!(query, vec!["hunter2".to_owned()]);
        assert!(password_parts("agent.db").is_empty());
        assert!(password_parts("postgres://ann@db/agents").is_empty());
    }
}
