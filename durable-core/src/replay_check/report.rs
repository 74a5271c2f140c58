//! What a replay check found: the report, its failures and its notes.

use std::fmt;
use std::path::PathBuf;

use super::schema_shape;
use crate::ids::{CallId, SessionId};
use crate::replay::ReplayClass;

/// The outcome of a replay check.
#[derive(Debug, Clone, Default)]
#[must_use = "a replay check does nothing unless its report is looked at (e.g. `.assert_ok()`)"]
pub struct ReplayCheckReport {
    /// Checkpoints checked.
    pub checkpoints: usize,
    /// Distinct tool calls checked.
    pub calls: usize,
    /// Of those, calls with masked secret arguments (their idempotency key
    /// cannot be recomputed, and a placeholder stands in for each masked value).
    pub calls_with_secrets: usize,
    /// Every problem found, in fixture order.
    pub failures: Vec<ReplayFailure>,
    /// What the check noticed without failing, in fixture order: arguments that serde
    /// reads although the argument schema says otherwise (a `#[serde(alias)]`, which the
    /// schema does not show), or a masked secret that only the schema could check.
    pub notes: Vec<ReplayNote>,
}

impl ReplayCheckReport {
    /// Whether nothing failed.
    pub fn is_ok(&self) -> bool {
        self.failures.is_empty()
    }

    /// Panics with the full report unless every check passed. For tests.
    ///
    /// # Panics
    /// When [`is_ok`](Self::is_ok) is false; the message lists every failure.
    #[track_caller]
    pub fn assert_ok(&self) {
        assert!(self.is_ok(), "{self}");
    }
}

impl fmt::Display for ReplayCheckReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scope = format!(
            "{} checkpoint{}, {} tool call{}",
            self.checkpoints,
            plural(self.checkpoints),
            self.calls,
            plural(self.calls)
        );
        let secrets = if self.calls_with_secrets > 0 {
            format!(
                " ({} with masked secret arguments, whose idempotency key cannot be recomputed)",
                self.calls_with_secrets
            )
        } else {
            String::new()
        };
        if self.is_ok() {
            write!(f, "replay check passed: {scope}{secrets}")?;
        } else {
            write!(
                f,
                "replay check failed: {} problem{} in {scope}{secrets}",
                self.failures.len(),
                plural(self.failures.len())
            )?;
            for failure in &self.failures {
                write!(f, "\n  - {failure}")?;
            }
        }
        for note in &self.notes {
            write!(f, "\n  note: {note}")?;
        }
        Ok(())
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// One problem found by the replay check.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayFailure {
    /// The session.
    pub session: SessionId,
    /// The checkpoint version (`None` when the session's checkpoint list itself is unreadable).
    pub version: Option<i64>,
    /// The journal row, for call checks.
    pub call: Option<CallId>,
    /// The recorded tool name, for call checks.
    pub tool: Option<String>,
    /// The fixture file, when the check ran over files.
    pub path: Option<PathBuf>,
    /// What is wrong.
    pub kind: FailureKind,
}

impl fmt::Display for ReplayFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "session `{}`", self.session)?;
        if let Some(version) = self.version {
            write!(f, " version {version}")?;
        }
        if let Some(call) = &self.call {
            write!(f, " call `{call}`")?;
        }
        if let Some(tool) = &self.tool {
            write!(f, " (`{tool}`)")?;
        }
        write!(f, ": {}", self.kind)?;
        if let Some(path) = &self.path {
            write!(f, " [{}]", path.display())?;
        }
        Ok(())
    }
}

/// Something the check noticed about one call without failing it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ReplayNote {
    /// The session.
    pub session: SessionId,
    /// The checkpoint version.
    pub version: i64,
    /// The journal row.
    pub call: CallId,
    /// The recorded tool name.
    pub tool: String,
    /// The fixture file, when the check ran over files.
    pub path: Option<PathBuf>,
    /// What was noticed.
    pub detail: String,
}

impl fmt::Display for ReplayNote {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "session `{}` version {} call `{}` (`{}`): {}",
            self.session, self.version, self.call, self.tool, self.detail
        )?;
        if let Some(path) = &self.path {
            write!(f, " [{}]", path.display())?;
        }
        Ok(())
    }
}

/// What a [`ReplayFailure`] found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FailureKind {
    /// The checkpoint could not be read from the store.
    #[error("the checkpoint cannot be read: {0}")]
    Unreadable(String),
    /// A message does not deserialize into today's message type.
    #[error(
        "message #{index} does not deserialize as `{type_name}`: {detail}; keep the type able to read old messages (`#[serde(default)]` on new fields, `#[serde(alias)]` for renamed ones)"
    )]
    Message {
        /// 0-based position in the transcript.
        index: usize,
        /// The type it was read as.
        type_name: &'static str,
        /// The serde error.
        detail: String,
    },
    /// The plan does not deserialize into [`Plan`](crate::snapshot::Plan).
    #[error("the plan does not deserialize: {0}")]
    Plan(String),
    /// The budget does not deserialize into [`Budget`](crate::snapshot::Budget).
    #[error("the budget does not deserialize: {0}")]
    Budget(String),
    /// The application state does not deserialize into the type given to
    /// [`ReplayCheck::state`](super::ReplayCheck::state).
    #[error("the state does not deserialize as `{type_name}`: {detail}")]
    State {
        /// The type it was read as.
        type_name: &'static str,
        /// The serde error.
        detail: String,
    },
    /// No registered tool has the recorded name.
    #[error(
        "no registered tool has this name (registered: {registered}); keep the tool registered, or map the old name with `durable retarget <session> --app-version <v> --map old=new`"
    )]
    UnknownTool {
        /// The registered names.
        registered: String,
    },
    /// The tool's replay class is less strict than the one the call was recorded under.
    #[error(
        "replay class loosened from `{recorded}` to `{current}`: the journal guarded this call as `{recorded}`, and a looser class could re-run its effect; restore the class (tightening is fine, loosening is not)"
    )]
    ClassLoosened {
        /// The class at record time.
        recorded: ReplayClass,
        /// Today's class.
        current: ReplayClass,
    },
    /// Today's argument type does not read the recorded arguments.
    #[error(
        "the recorded arguments no longer fit the tool's arguments: {0}; accept the old shape (optional or defaulted fields, aliases) or retarget the sessions (`durable retarget`)"
    )]
    ArgumentsRejected(String),
    /// Today's argument type does not read the recorded arguments, which lack a field it
    /// requires and hold one it does not know: most likely a field renamed without a
    /// `#[serde(alias)]` for its old name.
    #[error(
        "the recorded arguments lack {} and hold {}, which today's argument type does not read ({detail}): {}, or retarget the sessions recorded with the old name (`durable retarget`)",
        schema_shape::quoted(.missing),
        schema_shape::quoted(.unread),
        rename_hint(.missing, .unread)
    )]
    ArgumentRenamed {
        /// Fields today's type requires that the recorded arguments lack.
        missing: Vec<String>,
        /// Recorded arguments today's schema does not know.
        unread: Vec<String>,
        /// serde's error, with its JSON path.
        detail: String,
    },
    /// The recorded idempotency key no longer derives from the recorded arguments.
    #[error(
        "the idempotency key derives differently today (`{derived}`, recorded `{recorded}`): a re-executed call would reach the upstream as a new request; keep the key function stable"
    )]
    KeyChanged {
        /// The key in the journal.
        recorded: String,
        /// The key today's code derives.
        derived: String,
    },
    /// Today's key function fails on the recorded arguments.
    #[error("the idempotency key cannot be derived from the recorded arguments: {0}")]
    KeyNotDerivable(String),
    /// The recorded input hash is not the hash of the recorded arguments.
    #[error(
        "the recorded input hash `{recorded}` is not the hash of the recorded arguments (`{now}`): replay would not find this call and would run it again"
    )]
    InputHashChanged {
        /// The hash in the journal.
        recorded: String,
        /// The hash computed today.
        now: String,
    },
    /// A call still in doubt was recorded under another argument schema.
    #[error(
        "the call is in doubt and its tool's argument schema changed since (fingerprint `{recorded}` → `{current}`): resuming will fail with SchemaChanged; resolve the call first (`durable resolve`)"
    )]
    SchemaChangedInDoubt {
        /// Fingerprint at record time.
        recorded: String,
        /// Today's fingerprint.
        current: String,
    },
}

/// The way out of [`FailureKind::ArgumentRenamed`], spelled for its fields.
fn rename_hint(missing: &[String], unread: &[String]) -> String {
    match (missing, unread) {
        ([new], [old]) => format!(
            "if `{old}` was renamed to `{new}`, keep reading the old name with \
             `#[serde(alias = \"{old}\")]` on `{new}`"
        ),
        _ => format!(
            "if one of {} was renamed to one of {}, keep reading the old name with \
             `#[serde(alias = \"<old name>\")]` on the new field",
            schema_shape::quoted(unread),
            schema_shape::quoted(missing)
        ),
    }
}
