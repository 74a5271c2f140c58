//! The replay check: run your stored checkpoints against today's code, in your own tests.
//!
//! Every deploy changes code that old sessions will be resumed under. This module
//! answers, before the deploy, the question a resume would answer too late: *does every
//! stored checkpoint still load, and does every recorded tool call still map onto a tool
//! that will treat it the way it was journaled?* For each checkpoint it checks that
//!
//! - every message deserializes into today's message type (and the plan, the budget
//!   and, if you ask, the application state into theirs);
//! - every recorded tool call maps to a registered tool,
//! - whose replay class was not loosened (`unsafe_on_replay` → `pure` is an error:
//!   the journal guarded an effect that the new class would re-execute; tightening,
//!   `pure` → `unsafe_on_replay`, is fine),
//! - whose argument schema still accepts the recorded arguments ([`Tool::check_args`],
//!   plus the `required` and `properties` of the tool's [`input_schema`]),
//! - whose idempotency key still derives the same from the recorded arguments
//!   ([`Tool::derive_key`]; a changed key would reach the upstream as a new request),
//! - and whose recorded input hash is still the hash of the recorded arguments (else the
//!   call would not be found on replay and would run again);
//! - and a call still in doubt was recorded under today's argument schema fingerprint
//!   (else resuming it fails with [`SchemaChanged`](crate::DurableError::SchemaChanged)).
//!
//! Every failure names the session, the checkpoint version and the call.
//!
//! # In an application's test suite
//!
//! Export fixtures from production or staging (`durable export --last 50 --out
//! tests/fixtures/checkpoints`), commit them, and add one test:
//!
//! ```no_run
//! use durable_core::replay_check::{self, Fixture};
//! # fn my_toolbox() -> durable_core::Toolbox { unreachable!("your toolbox") }
//! # #[derive(serde::Deserialize)] struct MyMessage;
//!
//! #[test]
//! fn stored_checkpoints_replay_under_todays_code() {
//!     let fixtures = Fixture::load_dir("tests/fixtures/checkpoints").expect("fixtures");
//!     replay_check::check_fixtures_as::<MyMessage>(&my_toolbox(), &fixtures).assert_ok();
//! }
//! ```
//!
//! Or check the last N checkpoints of a live store with [`check_store`].
//!
//! # The fixture format (version 1)
//!
//! One JSON file per checkpoint, written by `durable export`:
//!
//! ```json
//! {
//!   "format": 1,
//!   "durable": "0.1.0",
//!   "session": "s-42", "version": 2, "app_version": "v7", "created_at": 1763786400000,
//!   "messages": [{"role": "user", "content": [{"kind": "text", "text": "…"}]}],
//!   "plan": {"objective": "…", "steps": [], "postconditions": []},
//!   "budget": {"spent_nano_usd": 0, "input_tokens": 0, "output_tokens": 0,
//!              "limit_nano_usd": null, "limit_tokens": null},
//!   "state": null,
//!   "calls": [{"id": "…", "kind": "tool", "step": 2, "tool": "send_email",
//!              "input_hash": "v1:…", "ordinal": 0, "class": "unsafe_on_replay",
//!              "status": "completed", "args": {"to": "ann@example.com"},
//!              "idempotency_key": null, "schema_hash": "v1:…",
//!              "result": {"id": "m-1"}, "error": null, "spend": null,
//!              "attempt": 1, "issued_at": 1763786400100, "finished_at": 1763786400200}]
//! }
//! ```
//!
//! `calls` holds the journal rows of the turns that start from this checkpoint: rows
//! whose `step` is at least `version` and below the next exported version of the
//! session, so that a full export lists every row exactly once. `format` is checked
//! first: a reader refuses a format newer than [`FIXTURE_FORMAT`], and every release
//! keeps reading every older format, so committed fixtures keep loading forever.
//!
//! [`Tool::check_args`]: crate::Tool::check_args
//! [`Tool::derive_key`]: crate::Tool::derive_key
//! [`input_schema`]: crate::ToolSpec::input_schema

mod fixture;
mod schema_shape;
#[cfg(test)]
mod tests;

use std::collections::HashSet;
use std::fmt;
use std::path::PathBuf;

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::error::StoreError;
use crate::ids::{CallId, SessionId};
use crate::key;
use crate::replay::ReplayClass;
use crate::snapshot::{Budget, Plan};
use crate::store::{CallKind, CallStatus, CheckpointStore};
use crate::toolbox::Toolbox;

pub use fixture::{
    Exported, FIXTURE_FORMAT, Fixture, FixtureCall, FixtureError, export_last, export_session,
};

/// Checks fixtures with the default message type ([`Message`](crate::transcript::Message)).
pub fn check_fixtures(toolbox: &Toolbox, fixtures: &[Fixture]) -> ReplayCheckReport {
    ReplayCheck::new(toolbox).run(fixtures)
}

/// Checks fixtures whose messages are the application's own type `M`.
pub fn check_fixtures_as<M: DeserializeOwned>(
    toolbox: &Toolbox,
    fixtures: &[Fixture],
) -> ReplayCheckReport {
    ReplayCheck::new(toolbox).messages::<M>().run(fixtures)
}

/// Checks the `last_n` most recent checkpoints of a store (default message type).
///
/// # Errors
/// Database errors. A corrupt checkpoint is a failure in the report, not an error.
pub async fn check_store(
    toolbox: &Toolbox,
    store: &dyn CheckpointStore,
    last_n: usize,
) -> Result<ReplayCheckReport, StoreError> {
    ReplayCheck::new(toolbox).run_store(store, last_n).await
}

type Decode = fn(&Value) -> Result<(), String>;

fn decode_as<T: DeserializeOwned>(value: &Value) -> Result<(), String> {
    serde_path_to_error::deserialize::<_, T>(value)
        .map(drop)
        .map_err(|e| {
            let path = e.path().to_string();
            if path == "." {
                e.inner().to_string()
            } else {
                format!("at `{path}`: {}", e.inner())
            }
        })
}

/// A configurable replay check: which types the checkpoints must deserialize into.
///
/// [`check_fixtures`], [`check_fixtures_as`] and [`check_store`] are shorthands.
///
/// ```no_run
/// # use durable_core::replay_check::{Fixture, ReplayCheck};
/// # fn demo(toolbox: &durable_core::Toolbox) {
/// # #[derive(serde::Deserialize)] struct MyMessage;
/// # #[derive(serde::Deserialize)] struct MyState;
/// let fixtures = Fixture::load_dir("tests/fixtures/checkpoints").expect("fixtures");
/// ReplayCheck::new(toolbox)
///     .messages::<MyMessage>()
///     .state::<MyState>()
///     .run(&fixtures)
///     .assert_ok();
/// # }
/// ```
#[derive(Clone)]
pub struct ReplayCheck<'t> {
    toolbox: &'t Toolbox,
    messages: (Decode, &'static str),
    state: Option<(Decode, &'static str)>,
}

impl fmt::Debug for ReplayCheck<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReplayCheck")
            .field("toolbox", self.toolbox)
            .field("messages", &self.messages.1)
            .field("state", &self.state.map(|s| s.1))
            .finish()
    }
}

impl<'t> ReplayCheck<'t> {
    /// A check against `toolbox`, with messages read as
    /// [`Message`](crate::transcript::Message) and the state not checked.
    pub fn new(toolbox: &'t Toolbox) -> Self {
        ReplayCheck {
            toolbox,
            messages: type_decoder::<crate::transcript::Message>(),
            state: None,
        }
    }

    /// Messages must deserialize as `M`.
    #[must_use]
    pub fn messages<M: DeserializeOwned>(mut self) -> Self {
        self.messages = type_decoder::<M>();
        self
    }

    /// The application state must deserialize as `S` (checkpoints whose state is `null`
    /// included: use `Option<S>` if a session may have none).
    #[must_use]
    pub fn state<S: DeserializeOwned>(mut self) -> Self {
        self.state = Some(type_decoder::<S>());
        self
    }

    /// Checks the fixtures. A call that appears in several fixtures is checked once.
    pub fn run(&self, fixtures: &[Fixture]) -> ReplayCheckReport {
        let mut report = ReplayCheckReport::default();
        let mut seen: HashSet<(SessionId, CallId)> = HashSet::new();
        for fixture in fixtures {
            report.checkpoints += 1;
            self.check_fixture(fixture, &mut seen, &mut report);
        }
        report
    }

    /// Checks the `last_n` most recent checkpoints of `store`.
    ///
    /// # Errors
    /// Database errors. A corrupt checkpoint is a failure in the report.
    pub async fn run_store(
        &self,
        store: &dyn CheckpointStore,
        last_n: usize,
    ) -> Result<ReplayCheckReport, StoreError> {
        let exported = export_last(store, last_n).await?;
        let mut report = self.run(&exported.fixtures);
        report.checkpoints += exported.unreadable.len();
        report.failures.splice(0..0, exported.unreadable);
        Ok(report)
    }

    fn check_fixture(
        &self,
        fixture: &Fixture,
        seen: &mut HashSet<(SessionId, CallId)>,
        report: &mut ReplayCheckReport,
    ) {
        let fail = |report: &mut ReplayCheckReport, kind| {
            report.failures.push(ReplayFailure {
                session: fixture.session.clone(),
                version: Some(fixture.version),
                call: None,
                tool: None,
                path: fixture.path.clone(),
                kind,
            });
        };
        let (decode_message, message_type) = self.messages;
        for (index, message) in fixture.messages.iter().enumerate() {
            if let Err(detail) = decode_message(message) {
                fail(
                    report,
                    FailureKind::Message {
                        index,
                        type_name: message_type,
                        detail,
                    },
                );
            }
        }
        if !fixture.plan.is_null()
            && let Err(detail) = decode_as::<Plan>(&fixture.plan)
        {
            fail(report, FailureKind::Plan(detail));
        }
        if !fixture.budget.is_null()
            && let Err(detail) = decode_as::<Budget>(&fixture.budget)
        {
            fail(report, FailureKind::Budget(detail));
        }
        if let Some((decode_state, type_name)) = self.state
            && let Err(detail) = decode_state(&fixture.state)
        {
            fail(report, FailureKind::State { type_name, detail });
        }
        for call in &fixture.calls {
            if call.kind != CallKind::Tool
                || !seen.insert((fixture.session.clone(), call.id.clone()))
            {
                continue;
            }
            report.calls += 1;
            let masked = has_masked_secret(&call.args);
            if masked {
                report.calls_with_secrets += 1;
            }
            for kind in self.check_call(fixture, call, masked) {
                report.failures.push(ReplayFailure {
                    session: fixture.session.clone(),
                    version: Some(fixture.version),
                    call: Some(call.id.clone()),
                    tool: Some(call.tool.clone()),
                    path: fixture.path.clone(),
                    kind,
                });
            }
        }
    }

    fn check_call(&self, fixture: &Fixture, call: &FixtureCall, masked: bool) -> Vec<FailureKind> {
        let mut failures = Vec::new();
        let Some(tool) = self.toolbox.get(&call.tool) else {
            let registered = self.toolbox.names().collect::<Vec<_>>().join(", ");
            return vec![FailureKind::UnknownTool {
                registered: if registered.is_empty() {
                    "(none)".into()
                } else {
                    registered
                },
            }];
        };
        let spec = tool.spec();
        if spec.class.strictness() < call.class.strictness() {
            failures.push(FailureKind::ClassLoosened {
                recorded: call.class,
                current: spec.class,
            });
        }
        if let Err(detail) = schema_shape::check(&spec.input_schema, &call.args) {
            failures.push(FailureKind::ArgumentsRejected(detail));
        } else if !masked && let Err(e) = tool.check_args(&call.args) {
            failures.push(FailureKind::ArgumentsRejected(e.to_string()));
        }
        if !masked {
            match key::input_hash(&call.args) {
                Ok(now) if now != call.input_hash => failures.push(FailureKind::InputHashChanged {
                    recorded: call.input_hash.clone(),
                    now,
                }),
                Ok(_) => {}
                Err(e) => failures.push(FailureKind::InputHashChanged {
                    recorded: call.input_hash.clone(),
                    now: format!("(cannot hash: {e})"),
                }),
            }
            if let Some(recorded) = &call.idempotency_key {
                match tool.derive_key(&call.args, &fixture.session) {
                    Some(Ok(derived)) if &derived != recorded => {
                        failures.push(FailureKind::KeyChanged {
                            recorded: recorded.clone(),
                            derived,
                        });
                    }
                    Some(Err(e)) => failures.push(FailureKind::KeyNotDerivable(e.to_string())),
                    Some(Ok(_)) | None => {}
                }
            }
        }
        let in_doubt = matches!(call.status, CallStatus::Issued | CallStatus::NotHappened);
        if in_doubt && !call.schema_hash.is_empty() && call.schema_hash != spec.fingerprint {
            failures.push(FailureKind::SchemaChangedInDoubt {
                recorded: call.schema_hash.clone(),
                current: spec.fingerprint.clone(),
            });
        }
        failures
    }
}

fn type_decoder<T: DeserializeOwned>() -> (Decode, &'static str) {
    (decode_as::<T>, std::any::type_name::<T>())
}

/// Whether a top-level argument was stored masked (`{"$secret": "<hash>"}`): such calls
/// are checked structurally only (their key and hash cannot be recomputed).
fn has_masked_secret(args: &Value) -> bool {
    args.as_object()
        .is_some_and(|map| map.values().any(schema_shape::is_masked))
}

/// The outcome of a replay check.
#[derive(Debug, Clone, Default)]
#[must_use = "a replay check does nothing unless its report is looked at (e.g. `.assert_ok()`)"]
pub struct ReplayCheckReport {
    /// Checkpoints checked.
    pub checkpoints: usize,
    /// Distinct tool calls checked.
    pub calls: usize,
    /// Of those, calls with masked secret arguments, checked structurally only.
    pub calls_with_secrets: usize,
    /// Every problem found, in fixture order.
    pub failures: Vec<ReplayFailure>,
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
                " ({} with masked secret arguments, checked against the schema only)",
                self.calls_with_secrets
            )
        } else {
            String::new()
        };
        if self.is_ok() {
            return write!(f, "replay check passed: {scope}{secrets}");
        }
        write!(
            f,
            "replay check failed: {} problem{} in {scope}{secrets}",
            self.failures.len(),
            plural(self.failures.len())
        )?;
        for failure in &self.failures {
            write!(f, "\n  - {failure}")?;
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
    /// The plan does not deserialize into [`Plan`].
    #[error("the plan does not deserialize: {0}")]
    Plan(String),
    /// The budget does not deserialize into [`Budget`].
    #[error("the budget does not deserialize: {0}")]
    Budget(String),
    /// The application state does not deserialize into the type given to
    /// [`ReplayCheck::state`].
    #[error("the state does not deserialize as `{type_name}`: {detail}")]
    State {
        /// The type it was read as.
        type_name: &'static str,
        /// The serde error.
        detail: String,
    },
    /// No registered tool has the recorded name.
    #[error(
        "no registered tool has this name (registered: {registered}); keep the tool registered, or map the old name with `durable migrate --map old=new`"
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
    /// Today's argument schema does not accept the recorded arguments.
    #[error(
        "the recorded arguments no longer fit the tool's arguments: {0}; accept the old shape (optional or defaulted fields, aliases) or migrate the sessions"
    )]
    ArgumentsRejected(String),
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
