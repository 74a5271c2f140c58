//! What every store checks at its boundary, identically on every backend, before anything
//! reaches the database: ids a user chose ([`validate_id`]) and free text
//! ([`validate_text`]).

use crate::error::{IdProblem, StoreError};
use crate::ids::{MAX_ID_BYTES, SessionId};

/// Checks an id a user chose (session id, fork target, owner, app version) before it
/// reaches a store: non-empty, not only whitespace, at most [`MAX_ID_BYTES`] bytes, no
/// NUL, no control character, no bidirectional override. Every backend calls this at
/// its boundary, so a bad id is refused identically on all of them and nothing is stored.
///
/// `what` names the id in the error (`"session id"`, `"owner"`, …).
///
/// ```
/// use durable_core::StoreError;
/// use durable_core::error::IdProblem;
/// use durable_core::validate::validate_id;
///
/// assert!(validate_id("session id", "run-42").is_ok());
/// let err = validate_id("session id", "a\u{1b}[31mred").unwrap_err();
/// assert!(matches!(
///     err,
///     StoreError::InvalidId { problem: IdProblem::Control { at: 1, code: 0x1b }, .. }
/// ));
/// ```
pub fn validate_id(what: &'static str, id: &str) -> Result<(), StoreError> {
    id_problem(id).map_or(Ok(()), |problem| {
        Err(StoreError::InvalidId { what, problem })
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
/// [`StoreError::InvalidText`] and nothing is stored.
///
/// ```
/// use durable_core::validate::validate_text;
/// use durable_core::StoreError;
///
/// assert!(validate_text("status reason", "done: 3 \u{1b}[31m refunds").is_ok());
/// assert!(matches!(
///     validate_text("status reason", "done\0"),
///     Err(StoreError::InvalidText { what: "status reason", at: 4 })
/// ));
/// ```
pub fn validate_text(what: &'static str, text: &str) -> Result<(), StoreError> {
    match text.find('\0') {
        Some(at) => Err(StoreError::InvalidText { what, at }),
        None => Ok(()),
    }
}

/// Checks a worker's owner name with [`validate_id`] (`what` is `owner`).
pub fn validate_owner(owner: &str) -> Result<(), StoreError> {
    validate_id("owner", owner)
}

/// Checks what a new session is created with: its id, owner and app version
/// ([`validate_id`]). Called by every store's `create_session` before it touches the
/// database.
pub fn validate_new_session(
    id: &SessionId,
    owner: &str,
    app_version: &str,
) -> Result<(), StoreError> {
    id.validate()?;
    validate_owner(owner)?;
    validate_id("app version", app_version)
}

impl SessionId {
    /// Checks the id with [`validate_id`]: what every store does before creating a
    /// session under it.
    pub fn validate(&self) -> Result<(), StoreError> {
        validate_id("session id", self.as_str())
    }

    /// A validated session id (see [`validate_id`]).
    pub fn parse(id: impl Into<String>) -> Result<Self, StoreError> {
        let id = Self::new(id);
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
