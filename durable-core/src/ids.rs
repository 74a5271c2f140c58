//! Identifiers of sessions and journal rows.

use std::fmt;

use serde::{Deserialize, Serialize};

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            /// Wraps an existing id.
            pub fn new(id: impl Into<String>) -> Self {
                Self(id.into())
            }

            /// A fresh random id (UUID v4).
            pub fn random() -> Self {
                Self(uuid::Uuid::new_v4().to_string())
            }

            /// The id as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl From<&str> for $name {
            fn from(s: &str) -> Self {
                Self(s.to_owned())
            }
        }

        impl From<String> for $name {
            fn from(s: String) -> Self {
                Self(s)
            }
        }
    };
}

id_type!(
    /// The id of a session (an agent run).
    SessionId
);
id_type!(
    /// The id of a journal row (a tool call or model call).
    CallId
);

/// The most bytes an id (session id, owner, app version) may have: enough for any UUID,
/// hostname-pid or path-like name, and small enough for an index row on every backend.
pub const MAX_ID_BYTES: usize = 256;

/// Why an id given to a store was refused (see [`validate_id`]).
///
/// Messages never quote the id itself: it may be a megabyte long or hold terminal
/// escape sequences.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IdProblem {
    /// The id is the empty string.
    #[error("it is empty")]
    Empty,
    /// The id holds only whitespace.
    #[error("it is only whitespace")]
    Blank,
    /// The id is longer than [`MAX_ID_BYTES`].
    #[error("it is {len} bytes long; at most {MAX_ID_BYTES} are allowed")]
    TooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// The id holds a NUL byte.
    #[error("it contains NUL at byte {at}")]
    Nul {
        /// Byte offset of the first NUL.
        at: usize,
    },
    /// The id holds a control character (C0, DEL, C1) or a bidirectional override or
    /// isolate (`U+202A`..`U+202E`, `U+2066`..`U+2069`), which a terminal would act on.
    #[error("it contains the control character U+{code:04X} at byte {at}")]
    Control {
        /// Byte offset of the first such character.
        at: usize,
        /// Its code point.
        code: u32,
    },
}

/// Checks an id a user chose (session id, fork target, owner, app version) before it
/// reaches a store: non-empty, not only whitespace, at most [`MAX_ID_BYTES`] bytes, no
/// NUL, no control character, no bidirectional override. Every backend calls this at
/// its boundary, so a bad id is refused identically on all of them and nothing is stored.
///
/// `what` names the id in the error (`"session id"`, `"owner"`, …).
///
/// ```
/// use durable_core::ids::{IdProblem, validate_id};
/// use durable_core::StoreError;
///
/// assert!(validate_id("session id", "run-42").is_ok());
/// let err = validate_id("session id", "a\u{1b}[31mred").unwrap_err();
/// assert!(matches!(
///     err,
///     StoreError::InvalidId { problem: IdProblem::Control { at: 1, code: 0x1b }, .. }
/// ));
/// ```
pub fn validate_id(what: &'static str, id: &str) -> Result<(), crate::StoreError> {
    id_problem(id).map_or(Ok(()), |problem| {
        Err(crate::StoreError::InvalidId { what, problem })
    })
}

/// The first thing wrong with `id`, if any.
fn id_problem(id: &str) -> Option<IdProblem> {
    if id.is_empty() {
        return Some(IdProblem::Empty);
    }
    if id.len() > MAX_ID_BYTES {
        return Some(IdProblem::TooLong { len: id.len() });
    }
    for (at, c) in id.char_indices() {
        if c == '\0' {
            return Some(IdProblem::Nul { at });
        }
        if c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}') {
            return Some(IdProblem::Control {
                at,
                code: u32::from(c),
            });
        }
    }
    if id.trim().is_empty() {
        return Some(IdProblem::Blank);
    }
    None
}

/// Checks a free text given to a store (status reason, resolution note, error message
/// and context, a migration's step names): any length and any character but NUL, which
/// PostgreSQL's `text` cannot hold. Every backend calls this at its boundary, so such a
/// text is refused identically on all of them with
/// [`StoreError::InvalidText`](crate::StoreError::InvalidText) and nothing is stored.
///
/// ```
/// use durable_core::ids::validate_text;
/// use durable_core::StoreError;
///
/// assert!(validate_text("status reason", "done: 3 \u{1b}[31m refunds").is_ok());
/// assert!(matches!(
///     validate_text("status reason", "done\0"),
///     Err(StoreError::InvalidText { what: "status reason", at: 4 })
/// ));
/// ```
pub fn validate_text(what: &'static str, text: &str) -> Result<(), crate::StoreError> {
    match text.find('\0') {
        Some(at) => Err(crate::StoreError::InvalidText { what, at }),
        None => Ok(()),
    }
}

/// Checks a worker's owner name with [`validate_id`] (`what` is `owner`).
pub fn validate_owner(owner: &str) -> Result<(), crate::StoreError> {
    validate_id("owner", owner)
}

/// Checks what a new session is created with: its id, owner and app version
/// ([`validate_id`]). Called by every store's `create_session` before it touches the
/// database.
pub fn validate_new_session(
    id: &SessionId,
    owner: &str,
    app_version: &str,
) -> Result<(), crate::StoreError> {
    id.validate()?;
    validate_owner(owner)?;
    validate_id("app version", app_version)
}

impl SessionId {
    /// Checks the id with [`validate_id`]: what every store does before creating a
    /// session under it.
    pub fn validate(&self) -> Result<(), crate::StoreError> {
        validate_id("session id", &self.0)
    }

    /// A validated session id (see [`validate_id`]).
    pub fn parse(id: impl Into<String>) -> Result<Self, crate::StoreError> {
        let id = Self(id.into());
        id.validate()?;
        Ok(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_validated() {
        assert_eq!(id_problem("conformance-1f3e"), None);
        assert_eq!(id_problem("worker 1 (eu-west)"), None);
        assert_eq!(id_problem("équipe-α"), None);
        assert_eq!(id_problem(&"x".repeat(MAX_ID_BYTES)), None);
        assert_eq!(id_problem(""), Some(IdProblem::Empty));
        assert_eq!(
            id_problem(" \t "),
            Some(IdProblem::Control { at: 1, code: 9 })
        );
        assert_eq!(id_problem("   "), Some(IdProblem::Blank));
        assert_eq!(
            id_problem(&"x".repeat(MAX_ID_BYTES + 1)),
            Some(IdProblem::TooLong {
                len: MAX_ID_BYTES + 1
            })
        );
        assert_eq!(id_problem("a\0b"), Some(IdProblem::Nul { at: 1 }));
        assert_eq!(
            id_problem("ab\u{1b}]0;title\u{7}"),
            Some(IdProblem::Control { at: 2, code: 0x1b })
        );
        assert_eq!(
            id_problem("a\u{7f}"),
            Some(IdProblem::Control { at: 1, code: 0x7f })
        );
        assert_eq!(
            id_problem("é\u{9b}"),
            Some(IdProblem::Control { at: 2, code: 0x9b })
        );
        assert_eq!(
            id_problem("evil\u{202e}txt"),
            Some(IdProblem::Control {
                at: 4,
                code: 0x202e
            })
        );
        assert_eq!(
            id_problem("a\nb"),
            Some(IdProblem::Control { at: 1, code: 10 })
        );
    }

    #[test]
    fn the_error_names_the_id_but_never_quotes_it() {
        let err = SessionId::parse("x\u{1b}[2J".repeat(100)).expect_err("escape");
        let text = err.to_string();
        assert!(text.starts_with("invalid session id:"), "{text}");
        assert!(!text.contains('\u{1b}'), "{text:?}");
        assert!(SessionId::parse("run-1").is_ok());
    }
}
