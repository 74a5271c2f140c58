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
//! - whose argument type still reads the recorded arguments: serde decides, through
//!   [`Tool::check_args`], which is the decode a resumed session runs, so a field renamed
//!   with `#[serde(alias = "old")]` still fits. The tool's [`input_schema`] cannot decide
//!   this (schemars leaves aliases out); its `required` and `properties` decide only for a
//!   tool that does not decode (the default `check_args`), and where they disagree with
//!   serde the report carries a [note](ReplayCheckReport::notes). A masked secret
//!   argument (`{"$secret": "k1:…"}`, see [`secret`](crate::secret)) is decoded with a
//!   placeholder value in its place;
//! - whose idempotency key still derives the same from the recorded arguments
//!   ([`Tool::derive_key`]; a changed key would reach the upstream as a new request),
//! - and whose recorded input hash is still the hash of the recorded arguments (else the
//!   call would not be found on replay and would run again). The hash is taken over the
//!   arguments as stored, secret arguments masked, so it is checked for calls with
//!   secrets too; only the idempotency key of such a call, derived from the clear
//!   arguments, cannot be recomputed (nor the hash of a call recorded before secrets
//!   were masked with a keyed digest, which was taken over the clear value);
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

mod arguments;
mod fixture;
mod report;
mod schema_shape;
#[cfg(test)]
mod tests;

use std::collections::HashSet;
use std::fmt;

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::canonical;
use crate::error::StoreError;
use crate::ids::{CallId, SessionId};
use crate::snapshot::{Budget, Plan};
use crate::store::{CallKind, CallStatus, CheckpointStore};
use crate::toolbox::Toolbox;

pub use fixture::{
    Exported, FIXTURE_FORMAT, Fixture, FixtureCall, FixtureError, export_last, export_session,
};
pub use report::{FailureKind, ReplayCheckReport, ReplayFailure, ReplayNote};

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
            // The runtime's own calls (a child's start and outcome) belong to no toolbox.
            let runtime_call =
                call.tool == crate::store::CHILD_SLOT || call.tool == crate::store::COLLECT_SLOT;
            if call.kind != CallKind::Tool
                || runtime_call
                || !seen.insert((fixture.session.clone(), call.id.clone()))
            {
                continue;
            }
            report.calls += 1;
            let masked = has_masked_secret(&call.args);
            if masked {
                report.calls_with_secrets += 1;
            }
            let (failures, note) = self.check_call(fixture, call, masked);
            if let Some(detail) = note {
                report.notes.push(ReplayNote {
                    session: fixture.session.clone(),
                    version: fixture.version,
                    call: call.id.clone(),
                    tool: call.tool.clone(),
                    path: fixture.path.clone(),
                    detail,
                });
            }
            for kind in failures {
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

    /// The failures of one call, and a note on its arguments if there is one.
    fn check_call(
        &self,
        fixture: &Fixture,
        call: &FixtureCall,
        masked: bool,
    ) -> (Vec<FailureKind>, Option<String>) {
        let mut failures = Vec::new();
        let Some(tool) = self.toolbox.get(&call.tool) else {
            let registered = self.toolbox.names().collect::<Vec<_>>().join(", ");
            let unknown = FailureKind::UnknownTool {
                registered: if registered.is_empty() {
                    "(none)".into()
                } else {
                    registered
                },
            };
            return (vec![unknown], None);
        };
        let spec = tool.spec();
        if spec.class.strictness() < call.class.strictness() {
            failures.push(FailureKind::ClassLoosened {
                recorded: call.class,
                current: spec.class,
            });
        }
        let mut note = None;
        match arguments::check(tool.as_ref(), &call.args) {
            arguments::Verdict::Fits => {}
            arguments::Verdict::FitsWithNote(detail) => note = Some(detail),
            arguments::Verdict::Rejected(kind) => failures.push(kind),
        }
        if !masked || !has_legacy_masked_secret(&call.args) {
            match canonical::input_hash(&call.args) {
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
        }
        if !masked && let Some(recorded) = &call.idempotency_key {
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
        // Rows that may still run: in doubt, resolved as not happened, awaiting a decision or
        // approved.
        let in_doubt = matches!(
            call.status,
            CallStatus::Issued
                | CallStatus::NotHappened
                | CallStatus::Requested
                | CallStatus::Approved
        );
        if in_doubt && !call.schema_hash.is_empty() && call.schema_hash != spec.fingerprint {
            failures.push(FailureKind::SchemaChangedInDoubt {
                recorded: call.schema_hash.clone(),
                current: spec.fingerprint.clone(),
            });
        }
        (failures, note)
    }
}

fn type_decoder<T: DeserializeOwned>() -> (Decode, &'static str) {
    (decode_as::<T>, std::any::type_name::<T>())
}

/// Whether a top-level argument was stored masked (`{"$secret": "<digest>"}`): the
/// idempotency key of such calls cannot be recomputed (it was derived from the clear
/// value).
fn has_masked_secret(args: &Value) -> bool {
    args.as_object()
        .is_some_and(|map| map.values().any(crate::secret::is_masked))
}

/// Whether a secret argument was masked by an earlier release (a bare SHA-256 instead of
/// a keyed digest), whose input hash was taken over the clear value and so cannot be
/// recomputed either.
fn has_legacy_masked_secret(args: &Value) -> bool {
    args.as_object().is_some_and(|map| {
        map.values()
            .any(|v| crate::secret::is_masked(v) && !crate::secret::is_keyed(v))
    })
}
