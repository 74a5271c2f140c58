#![cfg_attr(docsrs, feature(doc_cfg))]
//! Durable tools for LLM agent harnesses: journaled, replay-safe tool calls and
//! versioned checkpoints.
//!
//! A harness that crashes mid-turn must not fire a side effect twice on resume, nor lose
//! a result it already paid for. `durable` records every tool call in a journal (issued
//! before the effect, result after) and decides what a replay may do from the tool's
//! declared **replay class**:
//!
//! | class | result recorded | issued, outcome unknown ("in doubt") | no record |
//! |---|---|---|---|
//! | `pure` | returned | re-executed | executed, recorded |
//! | `idempotent_with_key` | returned | re-executed with the recorded key | key derived, *issued* recorded, executed |
//! | `unsafe_on_replay` | returned | `verify` hook, else [`DurableError::ReplayUnsafe`] | *issued* recorded durably, executed |
//!
//! Declare tools with [`#[durable_tool]`](macro@durable_tool), run sessions with
//! [`Durable`], dispatch a model's tool calls with a [`Toolbox`].
//!
//! Four rules hold whatever the harness does with an error (feed it back to the model,
//! checkpoint, ask again):
//!
//! - **The barrier is session-wide.** While any `unsafe_on_replay` call of a session is in
//!   doubt and unresolved, no call with a side effect (`idempotent_with_key` or
//!   `unsafe_on_replay`) runs in that session, in *any* step; `pure` calls and model calls
//!   may. The refusal is [`DurableError::ReplayUnsafe`], naming the in-doubt call (`call`,
//!   `tool`) and the refused tool (`refused_tool`). [`Session::checkpoint`] is allowed
//!   meanwhile (the turn's transcript, with the refusal the model saw, is kept), and the
//!   barrier stays: it lives in the journal, so a resume on any worker finds it again.
//!   It lifts when an operator resolves the call ([`Operator::resolve`], `durable
//!   resolve`), or when the call's own step is re-run and its `verify` hook settles it;
//!   the live session sees the resolution without a resume.
//! - **A re-run step may not diverge.** While a step is re-run after a crash and the
//!   model has been asked anew in it (its recorded reply no longer decoded), a call with a
//!   side effect that matches no record, while a recorded call with a side effect of that
//!   step has not been replayed yet, is refused with [`DurableError::ReplayDiverged`]
//!   naming both; a checkpoint that would end a step with a recorded call unreplayed is
//!   refused the same way, so a recorded effect never drops out of the conversation
//!   unseen. Model calls must go through the journal ([`Session::model`]) for this to
//!   see a re-ask. The ways out are
//!   explicit: make the recorded call replay again (a `#[serde(alias = "…")]` for a
//!   renamed argument lets its record decode and match, and the replay check accepts it),
//!   or an operator's decision (fork the session from its last checkpoint, letting the
//!   fork run the unreplayed call again: `durable fork --rerun`, audited).
//! - **A fork never repeats an effect of its parent.** [`Operator::fork`] copies the
//!   parent's calls with a side effect from the forked version on into the fork's journal:
//!   the re-run turn gets recorded results back and keeps in-doubt calls in doubt, and a
//!   later call that would repeat one of the parent's effects is refused
//!   ([`DurableError::InheritedEffect`]). [`Operator::fork_plan`] (`durable fork
//!   --dry-run`) says what a fork will do before it is made; [`Operator::fork_with`] lets an
//!   operator name calls the fork may run again (audited).
//! - **Only exact values enter the journal.** Arguments, results, model replies,
//!   messages, plan, budget and state are checked with the same rules as a model's JSON
//!   text: NaN and ±Infinity (which `serde_json` would silently turn into `null`, making
//!   three calls share one hash), duplicate keys, integers JCS would round, lone
//!   surrogates, too deep or too large documents are typed errors naming the JSON path,
//!   and nothing is journaled for them.
//! - **An approved call runs once, after a person decided.** A call that needs approval
//!   ([`approval`]: the tool's `approval = …`, the runtime's policy, or the harness) is
//!   journaled as requested and returns [`DurableError::AwaitingApproval`]; nothing runs,
//!   and a checkpoint that would end its step is refused the same way, so the harness parks
//!   the session ([`Session::await_approval`]) and the turn replays once a person decided:
//!   the approved call runs exactly once (with the edited arguments, if any), a denied one
//!   returns its denial to the model.
//!
//! ```no_run
//! use durable::{Durable, Message, StartOptions, Toolbox, durable_tool};
//!
//! /// Read a file.
//! #[durable_tool(replay = "pure")]
//! async fn read_file(
//!     /// Path of the file.
//!     path: String,
//! ) -> Result<String, std::io::Error> {
//!     std::fs::read_to_string(path)
//! }
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let durable = Durable::builder(durable::connect("sqlite:agent.db").await?)
//!     .owner("worker-1")
//!     .build();
//! let session = durable.start::<Message>(StartOptions::default()).await?;
//! let text = read_file.call(session.journal(), "notes.txt".into()).await?;
//! let toolbox = Toolbox::new().with(read_file)?;
//! # let _ = (text, toolbox); Ok(()) }
//! ```
//!
//! # Features
//!
//! | feature | default | provides |
//! |---|---|---|
//! | `sqlite` | yes | [`sqlite`]: the embedded SQLite store |
//! | `postgres` | no | `postgres`: the PostgreSQL store, for many workers on many machines |
//! | `memory` | no | `memory`: an in-process store for tests and simulations (not durable across processes) |
//! | `mcp` | no | `mcp`: serve a [`Toolbox`] over MCP, call remote MCP tools durably (rmcp) |
//! | `openai` | no | `openai`: typed adapters for async-openai's Chat Completions types, and Anthropic's streamed events |
//! | `openai-client` | no | `openai::DurableClient`: async-openai's client with its chat calls journaled |
//! | `rig` | no | `rig`: `#[durable_tool]`s as rig tools and a journaled rig completion model |
//!
//! [`connect`] opens whichever of them a URL names.

// What a harness names, at the root: one path per item (sqlx's facade is the model).
// Everything else is in a module below, named for what it holds, and only there.

pub use connect::{connect, connect_read_only};
// Runtime and sessions.
pub use durable_core::{
    Durable, DurableBuilder, ForkOptions, InDoubtAction, InDoubtCall, Journal, Operator,
    ResumeReport, Resumed, Session, StartOptions,
};
// Child sessions.
pub use durable_core::{ChildOutcome, ChildWait, Signal, SignalWait};
// Worker pools.
pub use durable_core::{PoolReport, ShutdownSignal, ShutdownTrigger, Worker};
// Tools and dispatch.
pub use durable_core::{
    Definitions, IdempotencyKey, ModelToolCall, ReplayClass, RetryPolicy, Tool, ToolArguments,
    ToolContext, ToolOutput, ToolResult, ToolSpec, Toolbox, Verification,
};
// The function only: `durable_core::retry` is also a module, which re-exporting the name
// from the crate root would bring along as a second path to `RetryPolicy` and the rest.
pub use durable_core::retry::retry;
// The transcript.
pub use durable_core::{Block, Message, Role, ToolCallBlock, ToolResultBlock};
// Plan and budget.
pub use durable_core::{Budget, Limit, Plan, Postcondition, Spend, Step, StepStatus};
// The store and identities.
pub use durable_core::{CallId, CheckpointStore, CheckpointStoreExt, SessionId};
// Errors: a harness matches on these three (the others are in `error`).
pub use durable_core::{CallError, DurableError, StoreError};

mod connect;

// Old paths, kept as deprecated aliases for one release: each warns with where the item
// lives now (see CHANGELOG.md). Hidden from the docs: the paths above are the ones to use.
// (A `#[deprecated]` re-export would not warn, and a trait cannot be aliased: the
// `toolbox` module's `Tool` is a plain re-export.)

/// Moved to [`runtime::Outcome`].
#[doc(hidden)]
#[deprecated(note = "moved to `durable::runtime::Outcome`")]
pub type Outcome = durable_core::journal::Outcome;
/// Moved to [`runtime::CallEvent`].
#[doc(hidden)]
#[deprecated(note = "moved to `durable::runtime::CallEvent`")]
pub type CallEvent = durable_core::journal::CallEvent;
/// Moved to [`error::ArgumentErrorKind`].
#[doc(hidden)]
#[deprecated(note = "moved to `durable::error::ArgumentErrorKind`")]
pub type ArgumentErrorKind = durable_core::ArgumentErrorKind;
/// Moved to [`error::ArgumentError`].
#[doc(hidden)]
#[deprecated(note = "moved to `durable::error::ArgumentError`")]
pub type ArgumentError = durable_core::ArgumentError;
/// Moved to [`error::RecordedFailure`].
#[doc(hidden)]
#[deprecated(note = "moved to `durable::error::RecordedFailure`")]
pub type RecordedFailure = durable_core::journal::RecordedFailure;
/// Moved to [`error::RetryError`].
#[doc(hidden)]
#[deprecated(note = "moved to `durable::error::RetryError`")]
pub type RetryError<E> = durable_core::retry::RetryError<E>;
/// Moved to [`error::SchemaError`].
#[doc(hidden)]
#[deprecated(note = "moved to `durable::error::SchemaError`")]
pub type SchemaError = durable_core::schema::SchemaError;
/// Moved to [`error::ConnectError`].
#[doc(hidden)]
#[deprecated(note = "moved to `durable::error::ConnectError`")]
pub type ConnectError = durable_core::error::ConnectError;

/// Moved to [`store::redact_url`].
#[doc(hidden)]
#[deprecated(note = "moved to `durable::store::redact_url`")]
pub fn redact_url(url: &str) -> String {
    durable_core::redact::redact_url(url)
}

/// Moved to the crate root (`durable::Toolbox`, `durable::Tool`, …).
#[doc(hidden)]
pub mod toolbox {
    /// Moved to [`crate::Toolbox`].
    #[deprecated(note = "moved to the crate root: `durable::Toolbox`")]
    pub type Toolbox = crate::Toolbox;
    /// Moved to [`crate::Definitions`].
    #[deprecated(note = "moved to the crate root: `durable::Definitions`")]
    pub type Definitions = crate::Definitions;
    /// Moved to [`crate::ModelToolCall`].
    #[deprecated(note = "moved to the crate root: `durable::ModelToolCall`")]
    pub type ModelToolCall = crate::ModelToolCall;
    /// Moved to [`crate::ToolArguments`].
    #[deprecated(note = "moved to the crate root: `durable::ToolArguments`")]
    pub type ToolArguments = crate::ToolArguments;
    /// Moved to [`crate::ToolOutput`].
    #[deprecated(note = "moved to the crate root: `durable::ToolOutput`")]
    pub type ToolOutput = crate::ToolOutput;
    /// Moved to [`crate::ToolResult`].
    #[deprecated(note = "moved to the crate root: `durable::ToolResult`")]
    pub type ToolResult = crate::ToolResult;
    /// Moved to [`crate::error::ToolboxError`].
    #[deprecated(note = "moved to `durable::error::ToolboxError`")]
    pub type ToolboxError = crate::error::ToolboxError;
    /// Moved to [`crate::error::IncompleteExport`].
    #[deprecated(note = "moved to `durable::error::IncompleteExport`")]
    pub type IncompleteExport = crate::error::IncompleteExport;
    // A trait cannot be aliased: the old path still works, without a warning.
    pub use crate::Tool;
}

pub mod error {
    //! The error types of `durable` beside the three at the root (and
    //! [`replay_check::FixtureError`](crate::replay_check::FixtureError), with the fixtures
    //! it is about).
    //!
    //! A harness matches on few enums: [`DurableError`](crate::DurableError) for anything
    //! the runtime does (it converts from [`PlanError`], [`ConnectError`] and
    //! [`BudgetExceeded`]; a [`ToolboxError`] comes only from building a toolbox),
    //! [`CallError`](crate::CallError) for a typed tool call (the tool's own error, a
    //! replayed failure, or a `DurableError`), and [`StoreError`](crate::StoreError) for
    //! what a store says (also inside `DurableError::Store`).
    //!
    //! To route an error without matching every variant, match its
    //! [`kind()`](crate::DurableError::kind) ([`ErrorKind`]: not found, conflict, invalid
    //! input, operator needed, awaiting approval, limit exceeded, integrity, unavailable,
    //! permission denied, transient, unsupported); the CLI's exit codes and the console's
    //! HTTP statuses are chosen from it.
    //!
    //! | error | returned by |
    //! |---|---|
    //! | [`ArgumentError`] (+ [`ArgumentErrorKind`]) | JSON that cannot be journaled exactly; inside `DurableError::InvalidArguments` / `InvalidValue` |
    //! | [`ToolboxError`] | [`Toolbox::with`](crate::Toolbox::with) |
    //! | [`SchemaError`] (+ [`SchemaErrorKind`]) | tool names and schemas a provider would refuse |
    //! | [`IncompleteExport`] | [`Definitions::all`](crate::Definitions::all): tools a dialect cannot express |
    //! | [`PlanError`] | plan operations (messages written for the model) |
    //! | [`BudgetExceeded`], [`InvalidAmount`] | budget checks and amounts |
    //! | [`RetryError`] | [`retry`](crate::retry()) |
    //! | [`ConnectError`] | [`connect`](crate::connect), [`connect_read_only`](crate::connect_read_only) |
    //! | [`KeyError`] | [`integrity::Keyring`](crate::integrity::Keyring) construction |
    //! | [`IdProblem`] | inside `StoreError::InvalidId` |
    //! | [`RecordedFailure`] | inside `CallError::Recorded` |
    //! | [`UnknownReplayClass`] | parsing a [`ReplayClass`](crate::ReplayClass) |

    pub use durable_core::error::ConnectError;
    pub use durable_core::error::ErrorKind;
    pub use durable_core::error::IdProblem;
    pub use durable_core::integrity::KeyError;
    pub use durable_core::journal::RecordedFailure;
    pub use durable_core::replay::UnknownReplayClass;
    pub use durable_core::retry::RetryError;
    pub use durable_core::schema::{SchemaError, SchemaErrorKind};
    pub use durable_core::snapshot::{BudgetExceeded, InvalidAmount, PlanError};
    pub use durable_core::toolbox::{IncompleteExport, ToolboxError};
    pub use durable_core::{ArgumentError, ArgumentErrorKind};
}

pub mod runtime {
    //! The runtime's settings and what it reports: [`Config`] (read back with
    //! [`Durable::config`](crate::Durable::config)), the journal's [`CallEvent`]s (observe
    //! them with [`DurableBuilder::on_call`](crate::DurableBuilder::on_call)), the
    //! [`ToolCall`] builder [`Journal::tool`](crate::Journal::tool) returns, the
    //! [`BoxFuture`] a hand-written [`Tool`](crate::Tool) returns, and the retry helper's
    //! pieces.

    pub use durable_core::config::{CallObserver, Config};
    pub use durable_core::journal::{CallEvent, MODEL_SLOT, Outcome, ToolCall};
    pub use durable_core::retry::{AfterFailure, AttemptHistory};
    pub use durable_core::toolbox::BoxFuture;
}

pub mod budget {
    //! Budgets that bind: a session's ceilings ([`Budget`](crate::Budget), each one a
    //! [`Limit`](crate::Limit)) are checked by the journal before every fresh model or
    //! tool call, and spend is charged once per journal row. What a call asks of them
    //! ([`Ask`]); what model usage costs ([`PriceTable`], [`Price`], [`Usage`], given to
    //! a runtime with [`DurableBuilder::prices`](crate::DurableBuilder::prices)); how a
    //! session stands against its ceilings ([`session_budget`], [`SessionBudget`],
    //! [`Ceiling`]); the operator's raises ([`RaiseLimit`], [`LimitRaise`],
    //! [`Operator::raise_limit`](crate::Operator::raise_limit)) and the status reason of a
    //! session parked at a ceiling ([`PARKED_FOR_BUDGET`]). See the README's "Budgets".

    pub use durable_core::snapshot::{Ask, Ceiling, InvalidLimit, Price, PriceTable, Usage};
    pub use durable_core::store::{LimitRaise, RaiseLimit};
    pub use durable_core::{PARKED_FOR_BUDGET, SessionBudget, session_budget};
}

pub mod stream {
    //! Streamed model replies ([`Session::model_stream`](crate::Session::model_stream)):
    //! chunks reach the caller as they arrive, the assembled reply is journaled once when
    //! the stream ends, and a replayed turn gets the recorded reply back as chunks of the
    //! same type. A crash before the end leaves nothing (the model is asked again).
    //! Implement [`StreamedReply`] for your reply type: how chunks fold into it, and how a
    //! recorded reply is handed back as chunks.

    pub use durable_core::journal::{ModelStream, ReplyEvent, StreamedReply};
}

pub mod json {
    //! The exact-JSON rules every value entering the journal follows: parsing a model's
    //! text within [`ArgLimits`] (duplicate keys, NaN, integers JCS would round, lone
    //! surrogates and too deep or large documents are refused with the JSON path), the
    //! canonical form (RFC 8785) and the hashes a call's identity is made of.

    pub use durable_core::ArgLimits;
    pub use durable_core::args::{
        MAX_SAFE_INTEGER, MAX_SUPPORTED_DEPTH, check_value, parse_arguments, parse_json,
        to_journal_value,
    };
    pub use durable_core::canonical::{canonical_json, input_hash, schema_fingerprint};
}

pub mod schema {
    //! Tool schemas in each provider's dialect (OpenAI Chat Completions and Responses,
    //! Anthropic, MCP), built from a [`ToolSpec`](crate::ToolSpec): one schema policy,
    //! checked against what each provider accepts.

    pub use durable_core::schema::{
        MAX_TOOL_NAME, McpAnnotations, OPENAI_FORMATS, anthropic_tool, check_name, input_schema,
        mcp_tool, mcp_tool_with, openai_function, openai_response_tool, openai_strict_schema,
        schema_for,
    };
}

pub mod store {
    //! What a [`CheckpointStore`](crate::CheckpointStore) reads and writes: the records a
    //! backend stores (sessions, leases, checkpoints, journal rows, resolutions, approvals), for
    //! inspection tools, and the validation every backend applies at its boundary. A
    //! backend of your own depends on `durable-core` itself, without its default `runtime`
    //! feature (the contract and its seals are there), and runs the `durable-conformance`
    //! suite in its tests (see ARCHITECTURE.md).

    pub use durable_core::ids::MAX_ID_BYTES;
    pub use durable_core::redact::redact_url;
    pub use durable_core::store::{
        Approval, ApprovalDecision, ApprovalEvent, ApprovalRecord, ApprovalRequest, CARRIED_STEP,
        CallIdentity, CallKind, CallOutcome, CallRecord, CallStatus, Checkpoint, CheckpointMeta,
        DEADLINE, DecideApproval, Decided, Durability, ErrorRecord, FORMAT_VERSION, Fence,
        FinishCall, ForkEntry, ForkFate, ForkPlan, ForkSession, IssueOutcome, Lease, ListedSession,
        NewCall, NewCheckpoint, NewError, NewSession, PendingApproval, PurgeOutcome, QueueInfo,
        Resolution, ResolutionRecord, ResolveCall, RetargetSession, SessionCursor, SessionFilter,
        SessionRecord, SessionStatus, StoredMessage, TenantInfo, Transition,
    };
    // Child sessions and cancellation.
    pub use durable_core::store::{
        CHILD_SLOT, COLLECT_SLOT, CancelEffect, CancelRequest, CancelSession, CancelledSession,
        ChildRecord, WAITING_FOR_CHILDREN, WAITING_FOR_DEADLINE, Wait, WaitFor, cancel_reason,
        child_id, wakes_parent,
    };
    // Signals.
    pub use durable_core::store::{
        MAX_SIGNAL_BYTES, MAX_SIGNAL_DEPTH, NewSignal, SIGNAL_DEADLINE_SLOT, SIGNAL_SLOT,
        SignalRecord, WAITING_FOR_SIGNAL, consumer_key, waiting_for_signal,
    };
    // The concept traits `CheckpointStore` is the sum of: import the ones whose methods
    // you call on a concrete store (`SqliteStore`, `PostgresStore`).
    pub use durable_core::store::{
        ApprovalStore, BudgetStore, CheckpointLog, JournalStore, LeaseStore, LimiterStore,
        MaintenanceStore, QueueStore, ResolutionStore, SessionStore, SignalStore, StoreBase,
    };
    pub use durable_core::validate::{
        validate_id, validate_new_session, validate_owner, validate_text,
    };
}

pub mod integrity {
    //! Tamper evidence: the keys rows are sealed with ([`Keyring`], `DURABLE_MAC_KEY`) and
    //! the offline check of a whole store ([`verify_sessions`]). What the seals cover, and
    //! what they do not, is in the README's security section and [`Keyring`]'s crate.

    pub use durable_core::integrity::{
        IntegrityEvent, IntegrityLog, Keyring, MAC_KEY_ENV, MIN_KEY_LEN, PREVIOUS_MAC_KEYS_ENV,
        key_id, random_key,
    };
    pub use durable_core::verify::{SessionCheck, verify_each, verify_sessions};
}

pub use durable_core::approval;
pub use durable_core::limiter;
pub use durable_core::replay_check;
pub use durable_core::secret;
pub use durable_core::sizes;
pub use durable_core::telemetry;

/// The embedded SQLite store ([`SqliteStore`](sqlite::SqliteStore)).
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub use durable_sqlite as sqlite;

/// The PostgreSQL store (`PostgresStore`).
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use durable_postgres as postgres;

/// An in-process store ([`MemoryStore`](memory::MemoryStore)) for tests and simulations:
/// not durable across processes, and [`connect`] never opens it.
#[cfg(feature = "memory")]
#[cfg_attr(docsrs, doc(cfg(feature = "memory")))]
pub use durable_memory as memory;

/// MCP, both directions (rmcp): serve a [`Toolbox`] as an MCP server with journaled,
/// exactly-once calls ([`DurableMcpServer`](mcp::DurableMcpServer)), and call a remote
/// server's tools durably ([`RemoteTools`](mcp::RemoteTools)).
#[cfg(feature = "mcp")]
#[cfg_attr(docsrs, doc(cfg(feature = "mcp")))]
pub use durable_mcp as mcp;

/// Typed adapters for async-openai's Chat Completions types: tool definitions, tool
/// calls from the raw argument text, tool messages, usage as [`Spend`].
#[cfg(feature = "openai")]
#[cfg_attr(docsrs, doc(cfg(feature = "openai")))]
pub use durable_openai as openai;
/// rig agents on durable: tools bound to a session's journal, a journaled completion
/// model (`DurableRig`).
#[cfg(feature = "rig")]
#[cfg_attr(docsrs, doc(cfg(feature = "rig")))]
pub use durable_rig as rig;

/// Turns an `async fn` into a durable tool: a JSON schema for its arguments, a replay
/// class, an idempotency-key rule and a journaling wrapper.
///
/// ```no_run
/// use durable::{IdempotencyKey, RetryPolicy, ToolContext, Verification, durable_tool};
/// # #[derive(Debug, Clone, serde::Serialize, serde::Deserialize)] pub struct Receipt;
/// # #[derive(Debug, Clone, serde::Serialize, serde::Deserialize)] pub struct Charge;
/// # #[derive(Debug)] pub struct MailError;
/// # impl std::fmt::Display for MailError { fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { f.write_str("mail") } }
/// # type PayError = MailError;
/// # async fn mail(_: &str, _: &str, _: &str) -> Result<Receipt, MailError> { Ok(Receipt) }
/// # async fn pay(_: &str, _: u64, _: &str) -> Result<Charge, PayError> { Ok(Charge) }
/// # async fn outbox_has(_: &str, _: &str) -> Option<Receipt> { None }
///
/// /// Send an email to a customer.
/// #[durable_tool(replay = "unsafe_on_replay", verify = email_was_sent)]
/// async fn send_email(
///     /// Recipient address.
///     to: String,
///     /// Subject line.
///     subject: String,
///     /// Plain-text body.
///     body: String,
/// ) -> Result<Receipt, MailError> {
///     mail(&to, &subject, &body).await
/// }
///
/// /// Asked after a crash whether an in-doubt `send_email` went out.
/// async fn email_was_sent(ctx: &ToolContext, args: &SendEmailArgs) -> Verification<Receipt> {
///     match outbox_has(&args.to, &args.subject).await {
///         Some(receipt) => Verification::Happened(receipt),
///         None => Verification::DidNotHappen,
///     }
/// }
///
/// /// Charge a card; the provider honours idempotency keys.
/// #[durable_tool(
///     replay = "idempotent_with_key",
///     idempotency_key = |a| format!("charge:{}", a.order_id),
/// )]
/// async fn charge_card(
///     key: IdempotencyKey,
///     /// The order being paid.
///     order_id: String,
///     /// Amount in cents.
///     cents: u64,
/// ) -> Result<Charge, PayError> {
///     pay(&order_id, cents, key.as_str()).await
/// }
///
/// /// Read a file.
/// #[durable_tool(replay = "pure", retry = RetryPolicy::default().with_max_attempts(3))]
/// async fn read_file(
///     /// Path of the file.
///     path: String,
/// ) -> Result<String, std::io::Error> {
///     std::fs::read_to_string(path)
/// }
/// ```
///
/// # Arguments of the attribute
///
/// | argument | | meaning |
/// |---|---|---|
/// | `replay = "<class>"` | required | `"pure"`, `"idempotent_with_key"` or `"unsafe_on_replay"` (see below). Declared, never inferred. |
/// | `idempotency_key = <fn>` | required for, and only for, `idempotent_with_key` | derives the key the upstream API deduplicates on (see *Keys*) |
/// | `verify = <path>` | only `unsafe_on_replay` | async hook asked whether an in-doubt call's effect happened (see *Verify hooks*) |
/// | `retry = <expr>` | `pure` and `idempotent_with_key` only | a [`RetryPolicy`]: failed executions are retried with backoff. Refused on `unsafe_on_replay`: auto-retrying a call whose effect cannot be deduplicated is the duplicate-email bug |
/// | `approval = "required"` or `approval = <path>` | any class | every call needs a person's approval before it runs, or when the fn `fn(&Args) -> bool` says so for the call's arguments (see *Approvals*) |
/// | `name = "..."` | default: the fn name | the name the model calls; 1–64 of `A–Z a–z 0–9 _ -` |
/// | `description = "..."` | default: the fn's doc comment | what the model reads about the tool |
/// | `crate = "path"` | default: `::durable` | where the runtime is, for a crate that renames the dependency (`dur = { package = "durable", ... }` → `crate = "dur"`) |
///
/// Each argument may appear once. Mistakes are compile errors on the offending token
/// that say what is allowed.
///
/// # Replay classes
///
/// | class | for | on resume, call in doubt |
/// |---|---|---|
/// | `pure` | no side effect (reads, computations) | re-executed |
/// | `idempotent_with_key` | the upstream deduplicates on a key you pass it | re-executed with the key recorded the first time |
/// | `unsafe_on_replay` | an effect nothing deduplicates (email, SMS, a webhook) | the `verify` hook decides; without one, or if it cannot tell, the call fails with [`DurableError::ReplayUnsafe`] until an operator resolves it |
///
/// In every class a call whose result is recorded returns that result on replay without
/// running; a failure is recorded and replayed too.
///
/// # Parameters
///
/// - **Model arguments.** Every parameter other than the context and the key is an
///   argument the model sends. Each becomes a `pub` field of the generated argument
///   struct and a property of the JSON schema; its `///` comment becomes the property's
///   description (and the field's rustdoc: under `#![deny(missing_docs)]` an
///   undocumented argument is reported, as it should be, since the model gets no
///   description either).
///   `Option<T>` arguments are optional: absent and `null` both mean `None`. Types must
///   be owned and implement `Serialize`, `Deserialize`, `JsonSchema`, `Clone`, `Send`
///   and `Sync`; a missing trait is reported at the type. `#[serde(...)]` and
///   `#[schemars(...)]` attributes on a parameter are forwarded to its field.
/// - **`#[secret]`** on an argument keeps its value out of everything `durable` writes:
///   the journal row, the journaled model reply that asked for the call (and so the
///   message the harness pushes and `durable export` fixtures), logs and argument errors
///   carry `{"$secret": "k1:…"}` instead, an HMAC under the store's own key (the same
///   secret still gives the same call identity in that store; a dictionary does not
///   reverse it). The tool receives the real value, in memory:
///   [`Journal::model`](crate::Journal::model) hands the harness the masked reply and
///   keeps the clear values, and [`Toolbox::dispatch`](crate::Toolbox::dispatch) puts
///   them back. **After a restart** that memory is gone: a call whose outcome was
///   recorded replays it without the secret; a call that did not run (or would run
///   again) is never run with the placeholder but refused with
///   [`ArgumentErrorKind::SecretUnavailable`](crate::error::ArgumentErrorKind::SecretUnavailable), an error result asking the model to send
///   the call again with the value; an
///   in-doubt `unsafe_on_replay` call is `ReplayUnsafe` for an operator. An
///   `idempotency_key` rule may not read a secret argument (the key is recorded in
///   clear), and a secret cannot be renamed with `#[serde(rename)]`. What the tool
///   returns, or fails with, is recorded as it is. See [`secret`].
/// - **The key**: an `idempotent_with_key` tool takes one parameter of type
///   [`IdempotencyKey`], by value, recognised by its type name, anywhere in the list:
///   the key to pass to the upstream API. It is never empty and never optional: on the
///   first execution it is the key the `idempotency_key` rule derived, on a re-execution
///   the key recorded the first time, verbatim (see *Keys*). It is a compile error on a
///   `pure` or `unsafe_on_replay` tool (they have no key), twice, or as
///   `Option<IdempotencyKey>` or `&IdempotencyKey` (take it by value and borrow it with
///   `&key` or `key.as_str()`).
/// - **The context**: one optional parameter of type `&ToolContext` (or `ToolContext`),
///   recognised by its type name, anywhere in the list, alone or beside the key. It
///   gives the body the session id, the call id and identity and the attempt number.
///   (It also has the recorded key as an `Option`, [`ToolContext::idempotency_key`],
///   for code that has only the context; a keyed tool takes the key parameter.)
/// - **The struct-argument form**: a single argument marked `#[args]` whose type is
///   your own `#[derive(Clone, Serialize, Deserialize, JsonSchema)]` struct is the whole
///   argument object; no struct is generated and doc comments come from your fields.
///   Your crate then needs `serde` and `schemars` itself.
///
/// ```no_run
/// use durable::{ToolContext, durable_tool};
/// use schemars::JsonSchema;
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Clone, Serialize, Deserialize, JsonSchema)]
/// struct SearchQuery {
///     /// Words to look for.
///     text: String,
///     /// At most this many hits.
///     limit: Option<u32>,
/// }
///
/// /// Search the catalogue.
/// #[durable_tool(replay = "pure")]
/// async fn search(ctx: &ToolContext, #[args] query: SearchQuery) -> std::io::Result<Vec<String>> {
///     Ok(vec![query.text; query.limit.unwrap_or(1) as usize])
/// }
/// ```
///
/// The function must be a free `async fn` (no `self`, no generics) returning
/// `Result<T, E>`, spelled out or as an alias such as `std::io::Result<T>`. `T` is
/// recorded and replayed, so it implements `Serialize` and `Deserialize`; `E` is
/// recorded by its `Display` text. The future must be `Send`: toolboxes run tools on
/// multi-threaded runtimes.
///
/// # Keys
///
/// `idempotency_key` is a closure over the arguments, `|a| ...` where `a` is
/// `&SendEmailArgs` (one field per argument; `&YourStruct` in the struct-argument form),
/// or `|a, session| ...` to also get the [`SessionId`], or the path of a function
/// `fn(&Args) -> impl Into<String>`. It returns anything `Into<String>`. The key is
/// derived when the call is first issued and recorded with it; a re-execution after a
/// crash uses the **recorded** key, never a freshly derived one. Derive it from every
/// argument that changes the effect: the same key with other arguments is refused
/// ([`StoreError::IdempotencyConflict`]). Reading an argument that does not exist is a
/// compile error naming the arguments that do. A rule that derives an empty key is
/// refused at run time ([`DurableError::Encode`]) before anything is journaled: an empty
/// key deduplicates nothing.
///
/// The body receives the key as its [`IdempotencyKey`] parameter: the derived key on
/// the first execution, the recorded one on a re-execution, even when today's rule
/// would derive another. The runtime records a key with every keyed call; a record
/// without one (a call issued while the tool had another class) is not re-executed:
/// the call stays in doubt and is returned as [`DurableError::ReplayUnsafe`] for an
/// operator to resolve.
///
/// ```no_run
/// # use durable::{IdempotencyKey, durable_tool};
/// /// Refund a charge, once per session and charge.
/// #[durable_tool(
///     replay = "idempotent_with_key",
///     idempotency_key = |a, session| format!("{session}:refund:{}", a.charge_id),
/// )]
/// async fn refund(key: IdempotencyKey, charge_id: String) -> Result<String, std::io::Error> {
///     Ok(format!("refunded {charge_id} with key {key}"))
/// }
/// ```
///
/// # Verify hooks
///
/// `verify = f` names an `async fn f(ctx: &ToolContext, args: &SendEmailArgs) ->
/// Verification<T>` (with `T` the tool's success type). It runs only when a resumed
/// session meets an `unsafe_on_replay` call that was issued but has no recorded
/// outcome, and answers from the outside world (the provider's outbox, a ledger):
/// [`Verification::Happened`] records its value as the call's result and returns it,
/// [`Verification::DidNotHappen`] lets the call run now, [`Verification::Unknown`]
/// surfaces it as [`DurableError::ReplayUnsafe`] for an operator.
///
/// # Approvals
///
/// `approval = "required"` journals every call of the tool as *requested* instead of
/// running it; `approval = needs_approval` names a `fn needs_approval(args: &Args) ->
/// bool` over the argument struct (`&YourStruct` in the struct-argument form) that
/// decides per call. A call that needs approval returns
/// [`DurableError::AwaitingApproval`] (as `CallError::Durable`, or `Err` from
/// [`Tool::invoke`]) and its body does not run; the harness parks the session with
/// [`Session::await_approval`](crate::Session::await_approval). A person approves
/// ([`Operator::approve`](crate::Operator::approve), `durable approve`), optionally with
/// edited arguments, or denies with a reason. The resumed session replays the turn: an
/// approved call runs once, with the edited arguments when there are some (decoded into
/// the argument struct, and a keyed tool's key derived from them by its
/// `idempotency_key` rule); a denied one returns the reason as the tool's error, which
/// the model reads ([`ToolOutput`] with `is_error: true`). What runs after the approval
/// still follows the replay class. See [`approval`] for the
/// whole flow. A value other than `"required"` or a path is a compile error, and a fn
/// of the wrong shape is reported at its path.
///
/// ```no_run
/// # use durable::{IdempotencyKey, durable_tool};
/// /// Refund an order; refunds above 100.00 need a person's approval.
/// #[durable_tool(
///     replay = "idempotent_with_key",
///     idempotency_key = |a| format!("refund:{}:{}", a.order, a.cents),
///     approval = large_refund,
/// )]
/// async fn refund(key: IdempotencyKey, order: String, cents: u64) -> Result<String, std::io::Error> {
///     Ok(format!("refunded {cents} on {order} with key {key}"))
/// }
///
/// fn large_refund(args: &RefundArgs) -> bool {
///     args.cents > 10_000
/// }
///
/// /// Delete a customer's account.
/// #[durable_tool(replay = "unsafe_on_replay", approval = "required")]
/// async fn delete_account(customer: String) -> Result<(), std::io::Error> {
///     Ok(())
/// }
/// ```
///
/// # What it generates
///
/// For `vis async fn send_email(...)`, in the same module and with the same visibility:
///
/// - **`struct send_email;`** — the tool itself, a unit value carrying your doc comment.
///   It implements [`Tool`] (register it: `Toolbox::new().with(send_email)`), `Clone`,
///   `Copy`, `Debug` and `Default`. The function is not callable any more:
///   `send_email(...)` does not compile, so the side effect cannot run outside the
///   journal by accident. (Like any unit struct, the name is a pattern in `let`
///   position: do not name a local variable after a tool.)
/// - **`SendEmailArgs`** — the argument struct (fn name in UpperCamelCase + `Args`),
///   the one public companion item (none in the struct-argument form). It derives
///   `Serialize`, `Deserialize`, `JsonSchema` and `Clone` through `durable`'s own
///   re-exports, so your crate needs no serde or schemars dependency. It refuses unknown
///   fields: a model that invents an argument gets an error naming it instead of a call
///   that silently ignores it (OpenAI strict mode forbids extra fields anyway).
/// - **`send_email::spec() -> &'static ToolSpec`** — name, description, class, the
///   argument schema (JSON Schema draft 2020-12, inlined, see [`schema`]), its
///   fingerprint, retry policy, secret arguments and whether a verify hook exists.
///   Built once.
/// - **`send_email.call(&journal, to, subject, body).await`** — the typed journaled
///   call: `Result<Receipt, CallError<MailError>>`. The arguments are serialized,
///   hashed into the call's identity and journaled.
/// - **`send_email.dangerous_call_unjournaled(...)`** — the body, with your exact
///   parameters (context and key included; build them with [`ToolContext::detached`]
///   and [`IdempotencyKey::new`]), run with no journal at all. For tests of the body
///   and deliberate one-off use.
/// - **[`Tool::invoke`]** — what a toolbox calls with the model's JSON. The arguments are
///   decoded first; a mismatch is [`DurableError::ArgumentsMismatch`] naming the JSON
///   path (`$.cents`), and nothing is journaled or run. Then the key is derived and the
///   call goes through [`Journal::tool`] with the model's JSON as sent. A tool failure,
///   now or recorded, comes back as a [`ToolOutput`] with `is_error: true` and content
///   `{"error": "<message>"}` for the model to read; `Err` is reserved for the runtime
///   (refusals, store errors).
///
/// Attributes on the function: doc comments go to the struct (and the description),
/// `#[cfg]` to every generated item, anything else (`#[allow]`, `#[expect]`,
/// `#[tracing::instrument]`) to the function body, which is kept token for token, so
/// errors inside it point at your code.
///
/// Set `DURABLE_MACROS_DEBUG=1` (or `=send_email`) while building to print the
/// expansion to stderr. The macro is sugar over [`Journal::tool`]: everything it
/// generates can be written by hand for tools built at run time.
#[doc(inline)]
pub use durable_macros::durable_tool;

#[doc(hidden)]
pub mod __private {
    //! Not public API; may change in any release.
    //!
    //! What code generated by `#[durable_tool]` names: it reaches the runtime only
    //! through this module, so users need no direct dependency on serde, schemars or
    //! durable-core.

    pub use durable_core::__macro_support::{
        ApprovalRule, BoxFuture, EditedArgs, ToolArgument, ToolErrorValue, ToolOutputValue,
        ToolReturn, args_schema, assert_tool_argument, assert_tool_return, checked_key,
        decode_args, derive_key, derive_key_with_session, doc_text, encode_args, rule_request,
        run_tool, run_tool_keyed, run_tool_verified, tool_output,
    };
    pub use durable_core::approval::tool_rule;
    pub use durable_core::toolbox::{Tool, ToolOutput};
    pub use durable_core::{CallError, DurableError, Journal, ReplayClass, SessionId};
    pub use durable_core::{IdempotencyKey, ToolContext, ToolSpec};
    pub use serde_json::Value;
    pub use std::boxed::Box;
    pub use std::string::String;
    pub use std::sync::OnceLock;

    pub use schemars;
    pub use serde;
    pub use serde_json;
    pub use serde_path_to_error;
}
