//! Replay classes: what the journal may do with a call on resume.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// How a tool may be treated when a session is resumed after a crash.
///
/// The class is **declared** on the tool, never inferred: the runtime cannot know
/// whether `send_email` is safe to run twice. See the table in the crate docs.
///
/// | class | recorded result | issued, no result ("in doubt") | no record |
/// |---|---|---|---|
/// | [`Pure`](ReplayClass::Pure) | returned | re-executed | executed, recorded |
/// | [`IdempotentWithKey`](ReplayClass::IdempotentWithKey) | returned | re-executed with the recorded key | key derived, *issued* recorded, executed |
/// | [`UnsafeOnReplay`](ReplayClass::UnsafeOnReplay) | returned | `verify` hook, else [`ReplayUnsafe`](crate::DurableError::ReplayUnsafe) | *issued* recorded durably, executed |
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplayClass {
    /// No side effect; the output depends only on the input.
    Pure,
    /// The upstream deduplicates on a key that the harness passes.
    IdempotentWithKey,
    /// The side effect cannot be deduplicated: never re-executed blindly.
    UnsafeOnReplay,
}

impl ReplayClass {
    /// All classes, in order of increasing strictness.
    pub const ALL: [ReplayClass; 3] = [
        ReplayClass::Pure,
        ReplayClass::IdempotentWithKey,
        ReplayClass::UnsafeOnReplay,
    ];

    /// The name used in attributes, storage and JSON (`pure`, `idempotent_with_key`,
    /// `unsafe_on_replay`).
    pub const fn as_str(self) -> &'static str {
        match self {
            ReplayClass::Pure => "pure",
            ReplayClass::IdempotentWithKey => "idempotent_with_key",
            ReplayClass::UnsafeOnReplay => "unsafe_on_replay",
        }
    }

    /// Strictness rank: `pure` 0, `idempotent_with_key` 1, `unsafe_on_replay` 2.
    ///
    /// Changing a tool's class to a *lower* rank is a loosening that replay checks refuse
    /// (recorded calls were journaled under the stricter rule).
    pub const fn strictness(self) -> u8 {
        match self {
            ReplayClass::Pure => 0,
            ReplayClass::IdempotentWithKey => 1,
            ReplayClass::UnsafeOnReplay => 2,
        }
    }

    /// Whether *issued* must be committed durably before the tool runs.
    pub const fn journals_issued(self) -> bool {
        !matches!(self, ReplayClass::Pure)
    }

    /// Whether an automatic retry policy may be attached to a tool of this class.
    pub const fn allows_retry(self) -> bool {
        !matches!(self, ReplayClass::UnsafeOnReplay)
    }
}

impl fmt::Display for ReplayClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The error returned when parsing an unknown replay class name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown replay class `{0}`; expected one of `pure`, `idempotent_with_key`, `unsafe_on_replay`"
)]
pub struct UnknownReplayClass(pub String);

impl FromStr for ReplayClass {
    type Err = UnknownReplayClass;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ReplayClass::ALL
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| UnknownReplayClass(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_through_str_and_serde() {
        for class in ReplayClass::ALL {
            assert_eq!(class.as_str().parse::<ReplayClass>(), Ok(class));
            let json = serde_json::to_string(&class).expect("serialize");
            assert_eq!(json, format!("\"{}\"", class.as_str()));
        }
        let err = "maybe"
            .parse::<ReplayClass>()
            .expect_err("`maybe` is not a class");
        assert!(err.to_string().contains("`maybe`"));
    }

    #[test]
    fn only_unsafe_refuses_retry_and_only_pure_skips_issued() {
        assert!(ReplayClass::Pure.allows_retry());
        assert!(ReplayClass::IdempotentWithKey.allows_retry());
        assert!(!ReplayClass::UnsafeOnReplay.allows_retry());
        assert!(!ReplayClass::Pure.journals_issued());
        assert!(ReplayClass::UnsafeOnReplay.journals_issued());
    }
}
