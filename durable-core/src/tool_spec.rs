//! Tool descriptions ([`ToolSpec`]), the [`ToolContext`] a tool body receives, the
//! [`IdempotencyKey`] a keyed tool receives and a verify hook's answer
//! ([`Verification`]): what the journal needs to know about a tool. The object-safe
//! [`Tool`](crate::Tool) trait a toolbox dispatches is in [`toolbox`](crate::toolbox).
//!
//! `#[durable_tool]` generates a [`ToolSpec`] and a `Tool` impl for each annotated
//! function. Both can be written by hand: the macro is sugar over
//! [`Journal::tool`](crate::Journal::tool).

use std::fmt;
use std::ops::Deref;
use std::sync::{Arc, Mutex};

use serde_json::Value;

use crate::error::DurableError;
use crate::ids::{CallId, SessionId};
use crate::replay::ReplayClass;
use crate::retry::RetryPolicy;
use crate::snapshot::Spend;
use crate::store::CallIdentity;

/// Everything the runtime needs to know about a tool, independent of its code.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ToolSpec {
    /// The name the model calls it by (unique in a toolbox).
    pub name: String,
    /// What the tool does, for the model (from the doc comment).
    pub description: String,
    /// The declared replay class.
    pub class: ReplayClass,
    /// JSON Schema (draft 2020-12, inlined) of the argument object.
    pub input_schema: Value,
    /// Fingerprint of the argument schema, stored with every call (see
    /// [`schema_fingerprint`](crate::canonical::schema_fingerprint)).
    pub fingerprint: String,
    /// Automatic retry on failure; only for `pure` and `idempotent_with_key` tools.
    pub retry: Option<RetryPolicy>,
    /// Top-level argument names that are never written in clear: masked with a keyed
    /// digest in the journal, in journaled model replies and in argument errors (see
    /// [`secret`](crate::secret)).
    pub secret_args: Vec<String>,
    /// Whether the tool has a `verify` hook for in-doubt calls.
    pub has_verify: bool,
    /// The fleet-wide rate limit its calls wait under (see [`limiter`](crate::limiter)),
    /// if any: each call that runs (not one whose recorded result is returned) takes its
    /// turn before it is issued, and each retry takes another.
    pub rate_limit: Option<String>,
}

impl ToolSpec {
    /// A spec with no retry, no secrets and no verify hook; the fingerprint is computed
    /// from `input_schema`.
    pub fn new(
        name: impl Into<String>,
        description: impl Into<String>,
        class: ReplayClass,
        input_schema: Value,
    ) -> Self {
        let fingerprint = crate::canonical::schema_fingerprint(&input_schema);
        ToolSpec {
            name: name.into(),
            description: description.into(),
            class,
            input_schema,
            fingerprint,
            retry: None,
            secret_args: Vec::new(),
            has_verify: false,
            rate_limit: None,
        }
    }

    /// Sets a retry policy.
    ///
    /// # Panics
    /// On an `unsafe_on_replay` tool: auto-retrying an unsafe tool is the
    /// duplicate-email bug. (`#[durable_tool]` rejects this at compile time.)
    pub fn with_retry(mut self, policy: RetryPolicy) -> Self {
        assert!(
            self.class.allows_retry(),
            "tool `{}` is unsafe_on_replay and cannot have a retry policy",
            self.name
        );
        self.retry = Some(policy);
        self
    }

    /// Marks top-level arguments as secret: never written in clear (see
    /// [`secret`](crate::secret)). Registers them for the process, so that model replies
    /// calling this tool are masked too.
    pub fn with_secret_args<I, S>(mut self, names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.secret_args = names.into_iter().map(Into::into).collect();
        crate::secret::register(&self.name, &self.secret_args);
        self
    }

    /// Declares that the tool has a verify hook.
    pub fn with_verify(mut self) -> Self {
        self.has_verify = true;
        self
    }

    /// Names the fleet-wide rate limit the tool's calls wait under (define it with
    /// [`DurableBuilder::rate_limit`](crate::DurableBuilder::rate_limit)).
    pub fn with_rate_limit(mut self, limit: impl Into<String>) -> Self {
        self.rate_limit = Some(limit.into());
        self
    }
}

/// What a verify hook found out about an in-doubt `unsafe_on_replay` call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verification<T> {
    /// The effect happened; this is its result (recorded as the call's result).
    Happened(T),
    /// The effect did not happen: the call may execute now.
    DidNotHappen,
    /// The hook cannot tell: the call is surfaced as `ReplayUnsafe`.
    Unknown,
}

/// What a tool body (or verify hook) knows about the call it serves.
#[derive(Debug, Clone)]
pub struct ToolContext {
    pub(crate) session: SessionId,
    pub(crate) call: CallId,
    pub(crate) identity: CallIdentity,
    pub(crate) class: ReplayClass,
    pub(crate) attempt: i32,
    pub(crate) idempotency_key: Option<String>,
    pub(crate) spend: Arc<Mutex<Option<Spend>>>,
    /// The arguments a person edited before approving the call, if they did.
    pub(crate) edited: Option<Arc<Value>>,
}

impl ToolContext {
    /// A context for running a tool body outside the journal: unit tests of the body,
    /// or a generated tool's `dangerous_call_unjournaled` escape hatch. Random call id,
    /// step 0, ordinal 0, attempt 1, empty input hash; nothing is recorded, and spend
    /// reported with [`record_spend`](Self::record_spend) is dropped.
    pub fn detached(spec: &ToolSpec, session: SessionId, idempotency_key: Option<String>) -> Self {
        ToolContext {
            identity: CallIdentity {
                session: session.clone(),
                step: 0,
                tool: spec.name.clone(),
                input_hash: String::new(),
                ordinal: 0,
            },
            session,
            call: CallId::random(),
            class: spec.class,
            attempt: 1,
            idempotency_key,
            spend: Arc::new(Mutex::new(None)),
            edited: None,
        }
    }

    /// The arguments the call runs with when a person edited them before approving it
    /// (clear values, checked against the tool's schema), else `None`: the call runs with
    /// the arguments it was made with. `#[durable_tool]` tools receive the edited
    /// arguments as their parameters; a hand-written tool reads them here (see
    /// [`ToolCall::accept_edits`](crate::journal::ToolCall::accept_edits)).
    pub fn edited_args(&self) -> Option<&Value> {
        self.edited.as_deref()
    }

    /// The session the call belongs to.
    pub fn session_id(&self) -> &SessionId {
        &self.session
    }

    /// The journal row of this call.
    pub fn call_id(&self) -> &CallId {
        &self.call
    }

    /// The call's identity `(session, step, tool, input_hash, ordinal)`.
    pub fn identity(&self) -> &CallIdentity {
        &self.identity
    }

    /// The tool's replay class.
    pub fn replay_class(&self) -> ReplayClass {
        self.class
    }

    /// Execution attempt: 1 on the first run, higher on re-execution after a crash or
    /// a retry.
    pub fn attempt(&self) -> i32 {
        self.attempt
    }

    /// The idempotency key recorded for this call, `None` for a call that has none
    /// (`pure` and `unsafe_on_replay` tools). On re-execution it is the key recorded the
    /// first time.
    ///
    /// For code that has the context anyway (a verify hook, a hand-written [`Tool`](crate::Tool)). A
    /// `#[durable_tool]` keyed tool takes an [`IdempotencyKey`] parameter instead: the
    /// key arrives as a plain value, so no `None` has to be turned into a key (an empty
    /// key would deduplicate nothing).
    pub fn idempotency_key(&self) -> Option<&str> {
        self.idempotency_key.as_deref()
    }

    /// The recorded key as an [`IdempotencyKey`], for the generated wrapper of a keyed
    /// tool. The journal records a key with every `idempotent_with_key` call, so a
    /// missing or empty one means the record was not written as such (an in-doubt call
    /// issued while the tool had another class): the call stays in doubt and an operator
    /// settles it, exactly as for an unsafe call (re-running it without the key it was
    /// first sent with could repeat its effect).
    pub(crate) fn recorded_key(&self) -> Result<IdempotencyKey, DurableError> {
        self.idempotency_key
            .as_deref()
            .and_then(IdempotencyKey::new)
            .ok_or_else(|| DurableError::ReplayUnsafe {
                call: self.call.clone(),
                tool: self.identity.tool.clone(),
                class: self.class,
                refused_tool: self.identity.tool.clone(),
                reason: format!(
                    "its record holds no idempotency key, and re-executing it without the key it was \
                     first sent with could repeat its effect (was it issued before `{}` became \
                     `idempotent_with_key`?)",
                    self.identity.tool
                ),
            })
    }

    /// Records what this call cost; it is stored with the result and charged to the
    /// session's budget exactly once.
    pub fn record_spend(&self, spend: Spend) {
        if let Ok(mut slot) = self.spend.lock() {
            *slot = Some(spend);
        }
    }
}

/// The idempotency key of an `idempotent_with_key` call: what the tool passes to the
/// upstream API (a payment provider's `Idempotency-Key` header) so that the upstream
/// performs the effect once however often the call runs. Never empty.
///
/// A `#[durable_tool(replay = "idempotent_with_key", ...)]` function receives it as a
/// parameter, by value, beside the arguments the model sends (it is not one of them):
/// `async fn charge_card(key: IdempotencyKey, order_id: String, cents: u64)`, whose body
/// passes `key.as_str()` (or `&key`, which derefs to `&str`) to the provider.
///
/// On the first execution it is the key the `idempotency_key` rule derived; on a
/// re-execution of an in-doubt call it is the key recorded the first time, verbatim,
/// whatever the rule derives today.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// A key with this text, `None` if it is empty (an empty key deduplicates nothing).
    ///
    /// The runtime builds the keys a tool receives; this is for calling a tool's body
    /// yourself (`dangerous_call_unjournaled` in a unit test).
    pub fn new(key: impl Into<String>) -> Option<Self> {
        let key = key.into();
        (!key.is_empty()).then_some(IdempotencyKey(key))
    }

    /// The key's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The key's text, owned.
    pub fn into_string(self) -> String {
        self.0
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for IdempotencyKey {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl Deref for IdempotencyKey {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl From<IdempotencyKey> for String {
    fn from(key: IdempotencyKey) -> String {
        key.0
    }
}

impl PartialEq<str> for IdempotencyKey {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for IdempotencyKey {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}
