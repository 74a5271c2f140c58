//! The [`CheckpointStore`] trait every backend implements, and the records it stores.
//!
//! A store is deliberately low-level: it knows rows, versions and fencing tokens, not
//! replay rules. The replay protocol lives in the runtime's journal (`crate::journal`,
//! feature `runtime`), so that every backend behaves the same and the conformance suite
//! (the `durable-conformance` crate) can prove it.
//!
//! Times are milliseconds since the Unix epoch **as read from the database's clock**, so
//! that leases mean the same thing to every worker that shares a database.

use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::StoreError;
use crate::ids::{CallId, SessionId};
use crate::replay::ReplayClass;

mod approval;
mod budget;
mod family;
mod fork;
pub(crate) mod limit;
mod message;
mod queue;
mod signal;

pub use approval::{
    Approval, ApprovalDecision, ApprovalEvent, ApprovalRecord, ApprovalRequest, DEADLINE,
    DecideApproval, Decided, PendingApproval, Transition,
};
pub use budget::{BudgetStore, LimitRaise, RaiseLimit};
pub use family::{
    CHILD_SLOT, COLLECT_SLOT, CancelEffect, CancelRequest, CancelSession, CancelledSession,
    ChildRecord, WAITING_FOR_CHILDREN, WAITING_FOR_DEADLINE, Wait, WaitFor, cancel_reason,
    child_id, wakes_parent,
};
pub use fork::{
    CARRIED_STEP, FORK_AUDIT_MARK, FORK_AUDIT_RERUN, ForkCopy, ForkEntry, ForkFate, ForkPlan,
    ForkSession, audit_map as fork_audit_map, copies as fork_copies, effect as fork_effect,
    fate as fork_fate, fork_step,
};
pub use limit::{InvalidLimit, Limit};
pub use message::StoredMessage;
pub use queue::{Claim, QueueInfo, Scheduling, TenantInfo, WorkEvents, WorkNotifier};
pub use signal::{
    MAX_SIGNAL_BYTES, MAX_SIGNAL_DEPTH, NewSignal, SIGNAL_DEADLINE_SLOT, SIGNAL_SLOT, SignalRecord,
    WAITING_FOR_SIGNAL, consumer_key, waiting_for_signal,
};

/// The version of the JSON formats written by this release (messages, plan, budget,
/// results). Stored with every JSON row; a reader that finds a larger number refuses it.
pub const FORMAT_VERSION: i32 = 1;

/// Lifecycle status of a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionStatus {
    /// Running or resumable.
    Active,
    /// Finished successfully (terminal).
    Completed,
    /// Finished with an error (terminal).
    Failed,
    /// Stopped on purpose (terminal).
    Cancelled,
    /// Dead-lettered: its recoveries kept dying; an operator must look at it.
    Parked,
    /// Waiting for people to decide on its requested calls
    /// ([`CallStatus::Requested`]); holds no lease. It becomes `active` again when the
    /// last one is decided.
    AwaitingApproval,
}

impl SessionStatus {
    /// The storage name (`active`, `completed`, …).
    pub const fn as_str(self) -> &'static str {
        match self {
            SessionStatus::Active => "active",
            SessionStatus::Completed => "completed",
            SessionStatus::Failed => "failed",
            SessionStatus::Cancelled => "cancelled",
            SessionStatus::Parked => "parked",
            SessionStatus::AwaitingApproval => "awaiting_approval",
        }
    }

    /// Parses a storage name.
    pub fn parse(s: &str) -> Option<Self> {
        [
            SessionStatus::Active,
            SessionStatus::Completed,
            SessionStatus::Failed,
            SessionStatus::Cancelled,
            SessionStatus::Parked,
            SessionStatus::AwaitingApproval,
        ]
        .into_iter()
        .find(|st| st.as_str() == s)
    }

    /// Completed, failed or cancelled: the session will not run again.
    pub const fn is_terminal(self) -> bool {
        matches!(
            self,
            SessionStatus::Completed | SessionStatus::Failed | SessionStatus::Cancelled
        )
    }
}

/// A session row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionRecord {
    /// The session's id.
    pub id: SessionId,
    /// Lifecycle status.
    pub status: SessionStatus,
    /// The application/graph version the session runs under.
    pub app_version: String,
    /// Free-form metadata (e.g. a scratchpad root).
    pub metadata: Value,
    /// Current lease holder, if any (may be expired); `None` once the lease was released.
    pub lease_owner: Option<String>,
    /// When the current lease expires (database clock, ms).
    pub lease_expires_at: Option<i64>,
    /// The fencing token of the latest lease; bumped by every acquisition.
    pub fence: i64,
    /// Recoveries attempted since the last checkpoint (poison-pill counter).
    pub recovery_attempts: i32,
    /// Why the session was parked or failed, if it was.
    pub status_reason: Option<String>,
    /// Latest checkpoint version (0 when only the initial checkpoint exists).
    pub latest_version: i64,
    /// Creation time (ms).
    pub created_at: i64,
    /// Last update time (ms).
    pub updated_at: i64,
    /// The queue the session belongs to ([`DEFAULT_QUEUE`] unless it was started in
    /// another).
    pub queue: String,
    /// When the session's sleep ends (ms, database clock), set by the latest checkpoint
    /// ([`NewCheckpoint::wake_at`]); a claim does not take it before. Stays set once
    /// past, until the next checkpoint: a resumed session reads from it that it woke up.
    pub wake_at: Option<i64>,
    /// When the current lease was last taken or renewed (ms, database clock).
    pub lease_renewed_at: Option<i64>,
    /// The session that started this one as its child
    /// ([`create_child`](crate::store::SessionStore::create_child)), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<SessionId>,
    /// While the session waits with its lease given up
    /// ([`wait`](crate::store::LeaseStore::wait)): when the wait ends at the latest
    /// (ms, database clock). No claim takes it before, unless what it waits for
    /// happens first (a child ends), which clears it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_until: Option<i64>,
    /// What the session waits for while [`waiting_until`](Self::waiting_until) is set:
    /// [`WAITING_FOR_CHILDREN`], [`WAITING_FOR_DEADLINE`], or
    /// [`waiting_for_signal`]`(name)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_for: Option<String>,
    /// A cancellation asked while a worker held the session
    /// ([`cancel_session`](crate::store::SessionStore::cancel_session)): the worker stops
    /// at its next safe point, and whoever takes the session next ends it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancel_requested: Option<CancelRequest>,
}

/// One row of a session listing ([`CheckpointStore::list_session_rows`](crate::store::SessionStore::list_session_rows)).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ListedSession {
    /// A session row, read whole (boxed: the other variant is small).
    Read(Box<SessionRecord>),
    /// A row this release cannot read: listed with its id and raw status, the rest
    /// unknown. Acting on the session fails with the typed error `problem` describes.
    Unreadable {
        /// The session's id.
        id: SessionId,
        /// The status as stored (`suspended`, say, from a newer release).
        raw_status: String,
        /// When it was last updated (ms, as stored): where it sorts in a listing.
        updated_at: i64,
        /// Why the row cannot be read.
        problem: String,
    },
}

/// The queue of sessions started without one.
pub const DEFAULT_QUEUE: &str = "default";

/// What [`CheckpointStore::create_session`](crate::store::SessionStore::create_session) needs.
#[derive(Debug, Clone, PartialEq)]
pub struct NewSession {
    /// The new session's id.
    pub id: SessionId,
    /// The application version it starts on.
    pub app_version: String,
    /// Free-form metadata.
    pub metadata: Value,
    /// Who takes the first lease.
    pub owner: String,
    /// How long that lease lasts.
    pub lease_ttl: Duration,
    /// The initial checkpoint (version 0): plan, budget and first messages. Its
    /// `wake_at` delays the session's first claim.
    pub initial: NewCheckpoint,
    /// The queue the session belongs to (`None`: [`DEFAULT_QUEUE`]). Pools may claim
    /// from some queues only, and a queue may have a fleet-wide limit
    /// ([`CheckpointStore::set_queue_limit`](crate::store::QueueStore::set_queue_limit)).
    pub queue: Option<String>,
}

/// A lease on a session, proved by its fencing token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The leased session.
    pub session: SessionId,
    /// Who holds it.
    pub owner: String,
    /// The fencing token: every write made under this lease carries it, and the store
    /// rejects a write whose token is no longer the session's current one.
    pub fence: i64,
    /// Expiry on the database clock (ms).
    pub expires_at: i64,
}

/// A write credential: session plus fencing token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fence<'a> {
    /// The session written to.
    pub session: &'a SessionId,
    /// The token of the writer's lease.
    pub token: i64,
}

impl Lease {
    /// The credential for writes made under this lease.
    pub fn fence(&self) -> Fence<'_> {
        Fence {
            session: &self.session,
            token: self.fence,
        }
    }
}

/// A checkpoint to write: new messages are appended to the log in the same transaction.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NewCheckpoint {
    /// Messages appended to the session's log, in order.
    pub messages: Vec<Value>,
    /// The plan snapshot (JSON).
    pub plan: Value,
    /// The budget snapshot (JSON).
    pub budget: Value,
    /// Application-defined state (JSON; `null` when unused).
    pub state: Value,
    /// Parks the session until this time (ms since the epoch, database clock): no claim
    /// takes it before ([`CheckpointStore::claim_expired`](crate::store::LeaseStore::claim_expired)). `None` clears a previous
    /// one: every checkpoint sets the session's wake-up time to its own. See
    /// [`Session::sleep_until`](crate::Session::sleep_until).
    pub wake_at: Option<i64>,
}

/// Metadata of a stored checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointMeta {
    /// The session.
    pub session: SessionId,
    /// Version: 0 for the initial checkpoint, then 1, 2, …
    pub version: i64,
    /// The transcript of this version is the log up to and including this sequence
    /// number (0 when empty).
    pub last_seq: i64,
    /// Number of messages in this version's transcript.
    pub message_count: i64,
    /// The app version the checkpoint was written under.
    pub app_version: String,
    /// Creation time (ms).
    pub created_at: i64,
}

/// A loaded checkpoint: metadata, transcript and snapshots.
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    /// Metadata.
    pub meta: CheckpointMeta,
    /// The transcript (the log up to `meta.last_seq`), each message as its stored JSON
    /// text, parsed by the reader ([`StoredMessage::decode`]).
    pub messages: Vec<StoredMessage>,
    /// The plan snapshot.
    pub plan: Value,
    /// The budget snapshot.
    pub budget: Value,
    /// Application-defined state.
    pub state: Value,
}

/// What a journal row records: a tool call or a model response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallKind {
    /// A tool call.
    Tool,
    /// A model (LLM) response, keyed by its position in the step.
    Model,
}

impl CallKind {
    /// The storage name.
    pub const fn as_str(self) -> &'static str {
        match self {
            CallKind::Tool => "tool",
            CallKind::Model => "model",
        }
    }

    /// Parses a storage name.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "tool" => Some(CallKind::Tool),
            "model" => Some(CallKind::Model),
            _ => None,
        }
    }
}

/// Status of a journal row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallStatus {
    /// Recorded before execution; no outcome yet.
    Issued,
    /// The tool returned `Ok`; the result is recorded.
    Completed,
    /// The tool returned `Err`; the error is recorded.
    Failed,
    /// An operator resolved an in-doubt call as *happened*, with a result.
    Resolved,
    /// An operator resolved an in-doubt call as *did not happen*: it may run again.
    NotHappened,
    /// Journaled before execution, waiting for a person's decision
    /// ([`approval`](crate::store::Approval)); nothing has run.
    Requested,
    /// A person approved it; nothing has run yet. The next replay of its step issues and
    /// runs it once ([`CheckpointStore::reissue_call`](crate::store::JournalStore::reissue_call)).
    Approved,
    /// A person denied it, or its deadline passed: the denial is its recorded error,
    /// which replay returns.
    Denied,
}

impl CallStatus {
    /// The storage name.
    pub const fn as_str(self) -> &'static str {
        match self {
            CallStatus::Issued => "issued",
            CallStatus::Completed => "completed",
            CallStatus::Failed => "failed",
            CallStatus::Resolved => "resolved",
            CallStatus::NotHappened => "not_happened",
            CallStatus::Requested => "requested",
            CallStatus::Approved => "approved",
            CallStatus::Denied => "denied",
        }
    }

    /// Parses a storage name.
    pub fn parse(s: &str) -> Option<Self> {
        [
            CallStatus::Issued,
            CallStatus::Completed,
            CallStatus::Failed,
            CallStatus::Resolved,
            CallStatus::NotHappened,
            CallStatus::Requested,
            CallStatus::Approved,
            CallStatus::Denied,
        ]
        .into_iter()
        .find(|st| st.as_str() == s)
    }

    /// Whether the row holds an outcome that replay returns.
    pub const fn has_outcome(self) -> bool {
        matches!(
            self,
            CallStatus::Completed | CallStatus::Failed | CallStatus::Resolved | CallStatus::Denied
        )
    }
}

/// The identity of a call: `(session, step, tool, input_hash, ordinal)`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CallIdentity {
    /// The session.
    pub session: SessionId,
    /// The scope: by default the checkpoint version the turn started from.
    pub step: i64,
    /// Tool name (for model calls, the model slot,
    /// [`MODEL_SLOT`](crate::journal::MODEL_SLOT), `"@model"`).
    pub tool: String,
    /// Versioned SHA-256 of the canonical arguments (empty for model calls).
    pub input_hash: String,
    /// The n-th call with the same `(step, tool, input_hash)`, in dispatch order.
    pub ordinal: i64,
}

/// The idempotency key an approved call runs with when a person edited its arguments
/// (see [`CheckpointStore::issue_approved`](crate::store::JournalStore::issue_approved)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EditedKey {
    /// The key derived from the edited arguments.
    pub key: String,
    /// The input hash of the edited arguments (masked as journaled), against which
    /// another holder of the key is checked.
    pub input_hash: String,
}

/// A journal row to insert with status [`CallStatus::Issued`].
#[derive(Debug, Clone, PartialEq)]
pub struct NewCall {
    /// Fresh id for the row (kept if the row is inserted).
    pub id: CallId,
    /// Tool or model.
    pub kind: CallKind,
    /// The identity.
    pub identity: CallIdentity,
    /// Replay class of the tool (`pure` for model calls).
    pub class: ReplayClass,
    /// Arguments as stored (secret fields masked).
    pub args: Value,
    /// The idempotency key, for `idempotent_with_key` tools.
    pub idempotency_key: Option<String>,
    /// Fingerprint of the tool's argument schema.
    pub schema_hash: String,
}

/// A journal row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallRecord {
    /// Row id.
    pub id: CallId,
    /// Tool or model.
    pub kind: CallKind,
    /// The identity.
    pub identity: CallIdentity,
    /// Replay class.
    pub class: ReplayClass,
    /// Status.
    pub status: CallStatus,
    /// Arguments as stored.
    pub args: Value,
    /// Idempotency key, if any.
    pub idempotency_key: Option<String>,
    /// Schema fingerprint at issue time.
    pub schema_hash: String,
    /// The recorded result (`Completed`, `Resolved`).
    pub result: Option<Value>,
    /// The recorded error (`Failed`).
    pub error: Option<Value>,
    /// Spend recorded with the outcome (budget JSON fragment), if any.
    pub spend: Option<Value>,
    /// The row's seal (`<key id>:<hex>`, see [`integrity`](crate::integrity)), checked
    /// by the store before it returned the row.
    pub mac: Option<String>,
    /// Number of executions started (1 on first issue).
    pub attempt: i32,
    /// The fencing token of the lease the row was (last) issued under.
    pub fence: i64,
    /// When the row was issued (ms).
    pub issued_at: i64,
    /// When the outcome was recorded (ms).
    pub finished_at: Option<i64>,
    /// The call's approval, for a call that needed one: the request and, once taken,
    /// the decision (sealed with the row).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<Approval>,
}

/// Outcome of [`CheckpointStore::issue_call`](crate::store::JournalStore::issue_call).
#[derive(Debug, Clone, PartialEq)]
pub enum IssueOutcome {
    /// The row did not exist and was inserted as *issued* (committed, synced).
    Inserted(CallRecord),
    /// A row with the same identity already exists; it is returned untouched.
    Existing(CallRecord),
}

/// The outcome recorded by [`CheckpointStore::finish_call`](crate::store::JournalStore::finish_call).
#[derive(Debug, Clone, PartialEq)]
pub enum CallOutcome {
    /// The tool succeeded with this result.
    Completed(Value),
    /// The tool failed with this error.
    Failed(Value),
}

/// A recorded outcome with its spend (the store seals the row).
#[derive(Debug, Clone, PartialEq)]
pub struct FinishCall {
    /// The outcome.
    pub outcome: CallOutcome,
    /// Spend carried by the row (budget JSON fragment), if any.
    pub spend: Option<Value>,
}

/// An operator's decision about an in-doubt call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "decision", rename_all = "snake_case")]
pub enum Resolution {
    /// The effect happened; this is its result (it becomes the call's tool result).
    Happened {
        /// The result to record.
        result: Value,
    },
    /// The effect did not happen; the next resume may execute the call.
    DidNotHappen,
}

/// An audited resolution request.
#[derive(Debug, Clone, PartialEq)]
pub struct ResolveCall {
    /// The in-doubt call.
    pub call: CallId,
    /// The decision.
    pub resolution: Resolution,
    /// Who decided (operator name).
    pub by: String,
    /// Free-form note.
    pub note: Option<String>,
}

impl ResolveCall {
    /// Checks what the store is given: `by` with [`validate_id`](crate::validate::validate_id)
    /// (`resolver`), the note with [`validate_text`](crate::validate::validate_text). Every
    /// backend calls this before touching the database.
    pub fn validate(&self) -> Result<(), StoreError> {
        crate::validate::validate_id("resolver", &self.by)?;
        self.note.as_deref().map_or(Ok(()), |note| {
            crate::validate::validate_text("resolution note", note)
        })
    }
}

/// An audit row of a resolution.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResolutionRecord {
    /// The resolved call.
    pub call: CallId,
    /// Its session.
    pub session: SessionId,
    /// The decision.
    pub resolution: Resolution,
    /// Who decided.
    pub by: String,
    /// Note.
    pub note: Option<String>,
    /// When (ms).
    pub at: i64,
}

/// An LLM/API error to record (retry history).
#[derive(Debug, Clone, PartialEq)]
pub struct NewError {
    /// The session.
    pub session: SessionId,
    /// Step the error happened in.
    pub step: i64,
    /// What was being attempted (e.g. `"model"` or a tool name).
    pub context: String,
    /// 0-based attempt number.
    pub attempt: i32,
    /// The error message.
    pub message: String,
}

impl NewError {
    /// Checks the context and message with [`validate_text`](crate::validate::validate_text).
    /// Every backend calls this before touching the database.
    pub fn validate(&self) -> Result<(), StoreError> {
        crate::validate::validate_text("error context", &self.context)?;
        crate::validate::validate_text("error message", &self.message)
    }
}

/// A recorded error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorRecord {
    /// The session.
    pub session: SessionId,
    /// Step.
    pub step: i64,
    /// What was being attempted.
    pub context: String,
    /// 0-based attempt number.
    pub attempt: i32,
    /// The error message.
    pub message: String,
    /// When (ms).
    pub at: i64,
}

/// An audited app-version migration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RetargetSession {
    /// The session.
    pub session: SessionId,
    /// The version it must be on now (checked).
    pub from_version: String,
    /// The version it moves to.
    pub to_version: String,
    /// Step (tool or node name) mapping old → new, applied to in-flight journal rows.
    pub step_map: Vec<(String, String)>,
    /// Who migrated.
    pub by: String,
}

impl RetargetSession {
    /// Checks both versions and `by` with [`validate_id`](crate::validate::validate_id) and
    /// the step names with [`validate_text`](crate::validate::validate_text). Every backend
    /// calls this before touching the database.
    pub fn validate(&self) -> Result<(), StoreError> {
        crate::validate::validate_id("app version", &self.from_version)?;
        crate::validate::validate_id("app version", &self.to_version)?;
        crate::validate::validate_id("migrated by", &self.by)?;
        for (old, new) in &self.step_map {
            crate::validate::validate_text("step name", old)?;
            crate::validate::validate_text("step name", new)?;
        }
        Ok(())
    }
}

/// Filter for [`CheckpointStore::list_sessions`](SessionStore::list_sessions): every session by default, narrowed with
/// the `with_*` methods.
///
/// ```
/// use durable_core::store::{SessionFilter, SessionStatus};
///
/// let parked = SessionFilter::new().with_statuses(vec![SessionStatus::Parked]).with_limit(50);
/// assert_eq!(parked.limit, Some(50));
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct SessionFilter {
    /// Only these statuses (all when empty).
    pub statuses: Vec<SessionStatus>,
    /// Only sessions last updated before this time (ms).
    pub updated_before: Option<i64>,
    /// At most this many (newest first); unlimited when `None`.
    pub limit: Option<i64>,
    /// Only sessions after this one in the listing's order (the last row of the previous
    /// page): keyset pagination.
    pub after: Option<SessionCursor>,
}

/// Where a page of [`CheckpointStore::list_sessions`](crate::store::SessionStore::list_sessions) ends: the last session listed, by
/// its `updated_at` and id (the listing's order is `updated_at` then id, both
/// descending). Written `<updated_at>:<id>` ([`Display`](std::fmt::Display),
/// [`parse`](Self::parse)), the form `durable sessions --after` takes.
///
/// ```
/// use durable_core::store::SessionCursor;
///
/// let cursor = SessionCursor::parse("1700000000000:order:7").unwrap();
/// assert_eq!(cursor.updated_at, 1_700_000_000_000);
/// assert_eq!(cursor.id.as_str(), "order:7");
/// assert_eq!(cursor.to_string(), "1700000000000:order:7");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionCursor {
    /// The last listed session's `updated_at` (ms).
    pub updated_at: i64,
    /// The last listed session's id.
    pub id: SessionId,
}

impl SessionCursor {
    /// The cursor after `session`.
    pub fn after(session: &SessionRecord) -> Self {
        SessionCursor {
            updated_at: session.updated_at,
            id: session.id.clone(),
        }
    }

    /// The cursor after a listed row, read or not.
    pub fn of(row: &ListedSession) -> Self {
        match row {
            ListedSession::Read(session) => SessionCursor::after(session),
            ListedSession::Unreadable { id, updated_at, .. } => SessionCursor {
                updated_at: *updated_at,
                id: id.clone(),
            },
        }
    }

    /// Reads `<updated_at>:<id>`; `None` if it is not of that form.
    pub fn parse(text: &str) -> Option<Self> {
        let (at, id) = text.split_once(':')?;
        let updated_at = at.trim().parse().ok()?;
        if id.is_empty() {
            return None;
        }
        Some(SessionCursor {
            updated_at,
            id: SessionId::new(id),
        })
    }
}

impl std::fmt::Display for SessionCursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.updated_at, self.id)
    }
}

impl SessionFilter {
    /// Every session.
    pub fn new() -> Self {
        Self::default()
    }

    /// Only sessions with one of these statuses (all when empty).
    pub fn with_statuses(mut self, statuses: Vec<SessionStatus>) -> Self {
        self.statuses = statuses;
        self
    }

    /// Only sessions last updated before this time (ms since the epoch, database clock).
    pub fn with_updated_before(mut self, ms: i64) -> Self {
        self.updated_before = Some(ms);
        self
    }

    /// At most this many, newest first.
    pub fn with_limit(mut self, limit: i64) -> Self {
        self.limit = Some(limit);
        self
    }

    /// Only sessions after `cursor` in the listing's order (the next page).
    pub fn with_after(mut self, cursor: SessionCursor) -> Self {
        self.after = Some(cursor);
        self
    }
}

/// Result of a purge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PurgeOutcome {
    /// All of the session's rows were deleted.
    Purged,
    /// Not purged: the session is not terminal.
    NotTerminal,
    /// Not purged: it was updated within the retention window.
    WithinRetention,
    /// Not purged: a call is in doubt.
    CallInDoubt,
}

/// Durability settings a store read back from its database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Durability {
    /// `None` when acknowledged writes survive a crash; otherwise the setting at fault,
    /// e.g. `"synchronous_commit = off"`.
    pub unsafe_setting: Option<String>,
}

/// Checks a range of transcript positions asked of [`CheckpointStore::messages`](CheckpointLog::messages):
/// `1 <= from <= to + 1` and `to <= last_seq` (the latest checkpoint's last message), or
/// [`StoreError::MessagesOutOfRange`]. For backends.
pub fn check_message_range(
    session: &SessionId,
    from: i64,
    to: i64,
    last_seq: i64,
) -> Result<(), StoreError> {
    if from < 1 || to > last_seq || from > to.saturating_add(1) {
        return Err(StoreError::MessagesOutOfRange {
            session: session.clone(),
            from,
            to,
            last_seq,
        });
    }
    Ok(())
}

/// Checks a page read by [`CheckpointStore::calls_page`](crate::store::JournalStore::calls_page) against the session head's count
/// of journal rows (`head_rows`), for backends: the journal's extent (`top`, its highest
/// position, and `bottom`, its lowest; index look-ups, not a count) must be
/// `1..=head_rows`, the page's positions (`seqs`) must be `after + 1, after + 2, …`
/// without a gap, and a page shorter than `limit` must end at `head_rows`. Over a walk of
/// every page, that is the whole journal checked complete, at the cost of a page each.
/// A broken rule is [`StoreError::Tampered`].
pub fn check_journal_page(
    session: &SessionId,
    head_rows: i64,
    (top, bottom): (i64, i64),
    after: i64,
    limit: i64,
    seqs: &[i64],
) -> Result<(), StoreError> {
    let tampered = |detail: String| StoreError::Tampered {
        session: session.clone(),
        what: "the journal".to_owned(),
        detail,
    };
    if top != head_rows || bottom != 1 {
        return Err(tampered(format!(
            "the session head records {head_rows} rows, the table holds positions {bottom}..={top}: rows were deleted or inserted"
        )));
    }
    let mut expected = after;
    for &seq in seqs {
        expected += 1;
        if seq != expected {
            return Err(tampered(format!(
                "position {expected} is missing (the next row is at {seq}): rows were deleted"
            )));
        }
    }
    let short = i64::try_from(seqs.len()).unwrap_or(i64::MAX) < limit;
    if short && expected < head_rows {
        return Err(tampered(format!(
            "the session head records {head_rows} rows, the table ends at position {expected}: rows were deleted"
        )));
    }
    Ok(())
}

/// A persistent home for sessions, checkpoints and the call journal.
///
/// Every method is a single atomic transaction. Methods that write under a lease take a
/// [`Fence`] and fail with [`StoreError::LeaseLost`] when the session's fencing token has
/// moved on. The trait is object safe: runtimes hold an `Arc<dyn CheckpointStore>`.
///
/// The contract is split by concept into the traits it is the sum of ([`StoreBase`],
/// [`SessionStore`], [`LeaseStore`], [`QueueStore`], [`CheckpointLog`], [`JournalStore`],
/// [`ResolutionStore`], [`ApprovalStore`], [`MaintenanceStore`], [`LimiterStore`], [`BudgetStore`], [`SignalStore`]); a backend implements
/// each of them and gets this trait from the blanket implementation. Conveniences built
/// from these methods are on [`CheckpointStoreExt`], which nobody implements.
pub trait CheckpointStore:
    StoreBase
    + SessionStore
    + LeaseStore
    + QueueStore
    + CheckpointLog
    + JournalStore
    + ResolutionStore
    + ApprovalStore
    + MaintenanceStore
    + LimiterStore
    + BudgetStore
    + SignalStore
{
}

impl<T> CheckpointStore for T where
    T: StoreBase
        + SessionStore
        + LeaseStore
        + QueueStore
        + CheckpointLog
        + JournalStore
        + ResolutionStore
        + ApprovalStore
        + MaintenanceStore
        + LimiterStore
        + BudgetStore
        + SignalStore
        + ?Sized
{
}

/// What every store answers about itself: its backend's name, the keys it seals rows with,
/// its clock and the durability of its writes. The base of the concept traits below.
#[async_trait]
pub trait StoreBase: Send + Sync + 'static {
    /// A short backend name for errors and logs (`"sqlite"`, `"postgres"`).
    ///
    /// # Contract
    /// A constant of the backend, never read from the database: the same name the
    /// store's own errors carry in their `backend` field.
    fn backend(&self) -> &'static str;

    /// The keys this store seals and checks rows with, its own key bound.
    ///
    /// # Contract
    /// Every write seals the rows it writes and the session head in the same
    /// transaction; every read checks the seals of the rows it returns and fails with
    /// [`StoreError::Tampered`] (see [`integrity`](crate::integrity)).
    fn keyring(&self) -> &crate::integrity::Keyring;

    /// Reads back the settings that make *issued* rows durable.
    ///
    /// # Contract
    /// Reports the live settings of the connection used for journal writes.
    async fn durability(&self) -> Result<Durability, StoreError>;

    /// The database clock, in ms since the epoch.
    ///
    /// # Contract
    /// Read from the database, never from the caller's machine: it is the clock this
    /// store measures lease expiry, `created_at` / `updated_at` and purge retention on,
    /// so its values compare with theirs. Writes nothing (a read-only store answers it).
    async fn now(&self) -> Result<i64, StoreError>;
}

/// Sessions: creating one with its initial checkpoint and first lease, reading and listing
/// them, and setting their status (the `sessions` conformance cases).
#[async_trait]
pub trait SessionStore: Send + Sync + 'static {
    /// Creates a session with its initial checkpoint (version 0) and a first lease.
    ///
    /// # Contract
    /// Atomic. Fails with [`StoreError::SessionExists`] if the id is taken.
    async fn create_session(&self, new: NewSession) -> Result<(SessionRecord, Lease), StoreError>;

    /// Reads a session.
    ///
    /// # Contract
    /// [`StoreError::SessionNotFound`] if absent.
    async fn session(&self, id: &SessionId) -> Result<SessionRecord, StoreError>;

    /// Lists sessions, newest update first.
    ///
    /// # Contract
    /// Read-only, one statement. Ordered by `updated_at`, newest first, then by id,
    /// descending (byte order), so a [`SessionCursor`] marks one place in it. An empty
    /// `statuses` matches every status; `updated_before` is exclusive; `after` lists only
    /// the sessions that come after the cursor (`updated_at` lower, or equal with a lower
    /// id); a negative `limit` counts as 0 and `None` lists all. A row that cannot be
    /// decoded is [`StoreError::Corrupt`].
    async fn list_sessions(&self, filter: &SessionFilter)
    -> Result<Vec<SessionRecord>, StoreError>;

    /// Lists sessions as [`list_sessions`](Self::list_sessions) does, except that a row
    /// this release cannot read (a status it does not know, written by a newer release
    /// or changed outside `durable`) does not fail the listing: it is listed as
    /// [`ListedSession::Unreadable`] with its raw status, and the rest are listed whole.
    /// Acting on that session (reading, resuming, leasing it) still fails with the typed
    /// error. For listings shown to operators (`durable sessions`, the console).
    ///
    /// The default lists with [`list_sessions`](Self::list_sessions) (so one unreadable
    /// row fails it); the stores of this workspace override it.
    async fn list_session_rows(
        &self,
        filter: &SessionFilter,
    ) -> Result<Vec<ListedSession>, StoreError> {
        Ok(self
            .list_sessions(filter)
            .await?
            .into_iter()
            .map(|s| ListedSession::Read(Box::new(s)))
            .collect())
    }

    /// Sets a session's status (e.g. completed), with a reason.
    ///
    /// # Contract
    /// A reason holding NUL is [`StoreError::InvalidText`] before anything is written
    /// ([`validate_text`](crate::validate::validate_text)). Fenced. When the new status is
    /// terminal, parked or awaiting approval, releases the lease and bumps the fencing
    /// token, so the former holder can write nothing more.
    ///
    /// [`SessionStatus::AwaitingApproval`] is set only while the session has a requested
    /// call: when every one was decided before this (an operator was quick), the session
    /// stays `active`, its lease released all the same, and the next worker takes it.
    async fn set_status(
        &self,
        fence: Fence<'_>,
        status: SessionStatus,
        reason: Option<&str>,
    ) -> Result<(), StoreError>;

    /// Creates `new` as a child of `parent`: [`create_session`](Self::create_session)
    /// with the parent link recorded on the child's row.
    ///
    /// # Contract
    /// As [`create_session`](Self::create_session), atomic. [`StoreError::SessionNotFound`]
    /// if `parent` does not exist. When `new.id` is taken, fails with
    /// [`StoreError::SessionExists`] and writes nothing, whoever holds the id: the caller
    /// reads the row to tell its own child (started by an earlier attempt) from another
    /// session. The default returns [`StoreError::Unsupported`].
    async fn create_child(
        &self,
        parent: &SessionId,
        new: NewSession,
    ) -> Result<(SessionRecord, Lease), StoreError> {
        let _ = (parent, new);
        Err(StoreError::Unsupported {
            operation: "create_child",
            backend: "this store",
        })
    }

    /// The children of `parent` (sessions whose parent link names it), oldest first.
    ///
    /// # Contract
    /// Read-only, one snapshot. A session without children, or one that does not exist,
    /// has none (no error). [`ChildRecord::operator_needed`] says whether an `issued` row
    /// of the child was marked by [`mark_operator_needed`](LeaseStore::mark_operator_needed).
    /// The default returns [`StoreError::Unsupported`].
    async fn children(&self, parent: &SessionId) -> Result<Vec<ChildRecord>, StoreError> {
        let _ = parent;
        Err(StoreError::Unsupported {
            operation: "children",
            backend: "this store",
        })
    }

    /// Cancels a session and, with `cancel.cascade`, its children and theirs: an
    /// operator's decision (or a parent's), audited.
    ///
    /// # Contract
    /// [`CancelSession::validate`] runs first. Atomic: every session reached is handled
    /// in one transaction. For each session (the named one first, then its descendants,
    /// parents before children):
    /// - terminal (completed, failed, cancelled): left as it is
    ///   ([`CancelEffect::AlreadyEnded`]); its children are still visited;
    /// - held by a worker (an owner and a lease not yet expired on the database clock,
    ///   status `active`): its [`cancel_requested`](SessionRecord::cancel_requested) is
    ///   set (who, why, when), its fencing token left alone so that an effect in flight
    ///   is still recorded ([`CancelEffect::Requested`]);
    /// - otherwise (released, expired, asleep, waiting, parked, awaiting approval):
    ///   status `cancelled`, reason [`cancel_reason`], lease cleared, fencing token
    ///   bumped, the request recorded too ([`CancelEffect::Cancelled`]); its parent, if
    ///   it waits ([`wait`](LeaseStore::wait)), is woken.
    ///
    /// Each session not already ended gets an audit row in its migrations log
    /// (`by`, the step map `[["@cancel", reason]]`). In-doubt journal rows are left as
    /// they are, for an operator. [`StoreError::SessionNotFound`] if the named session
    /// does not exist. The default returns [`StoreError::Unsupported`].
    async fn cancel_session(
        &self,
        cancel: &CancelSession,
    ) -> Result<Vec<CancelledSession>, StoreError> {
        let _ = cancel;
        Err(StoreError::Unsupported {
            operation: "cancel_session",
            backend: "this store",
        })
    }
}

/// Leases and recovery: taking, renewing and giving up a session's lease, the fencing
/// token every write carries, claiming expired sessions with poison-pill counting, and
/// parking (the `leases` and `recovery` conformance cases).
#[async_trait]
pub trait LeaseStore: Send + Sync + 'static {
    /// Takes the lease on a session for `owner`, bumping its fencing token; counts the
    /// take-over as a recovery when the previous lease was never given up and its holder
    /// had started running the session under it.
    ///
    /// # Contract
    /// Atomic. Fails with [`StoreError::Leased`] while another owner's lease is live,
    /// with the time left: live and time left as the store judges them (PostgreSQL: on
    /// the server's clock; SQLite: by observation on this process's monotonic clock,
    /// the lease free once seen unrenewed for its full duration, see `durable_sqlite`). The same owner is never refused:
    /// re-acquiring its own live lease gets a new token (the old one is stale), so a
    /// worker restarted under the same owner name takes its session back at once.
    /// Refuses terminal, parked and awaiting-approval sessions with
    /// [`StoreError::NotResumable`].
    ///
    /// Recovery counting, the same rule as [`claim_expired`](Self::claim_expired): taking
    /// over a lease that was not given up with [`release_lease`](Self::release_lease)
    /// (it expired, or it is still live under this same owner: a restarted worker) and
    /// that its holder had marked running ([`mark_running`](Self::mark_running): it had
    /// made a model or tool call under it) is a recovery: the holder died while running
    /// the session. A holder that died without running it (an idle lease: killed while
    /// it was elsewhere) counts nothing. A recovery increments the session's recovery counter; when the counter
    /// already stands at `max_attempts` the session is parked instead (status
    /// [`SessionStatus::Parked`], reason `recovery attempts exhausted (N)`, lease cleared,
    /// fencing token bumped, all committed) and the call fails with
    /// [`StoreError::Parked`]. Taking a released lease, or the first lease after
    /// [`unpark_session`](Self::unpark_session), is not a recovery and leaves the counter
    /// alone; a release does not reset it either (a clean hand-over is not progress).
    /// [`save_checkpoint`](CheckpointLog::save_checkpoint) and [`finish_call`](JournalStore::finish_call)
    /// with a checkpoint reset it to 0 (progress), and so does `unpark_session`.
    /// [`fork_session`](CheckpointStoreExt::fork_session) starts a new session at 0 and leaves the
    /// source's counter alone: a fork is an operator's new start, not a recovery.
    async fn acquire_lease(
        &self,
        id: &SessionId,
        owner: &str,
        ttl: Duration,
        max_attempts: i32,
    ) -> Result<Lease, StoreError>;

    /// Extends a lease.
    ///
    /// # Contract
    /// [`StoreError::LeaseLost`] if the token is no longer current.
    async fn renew_lease(&self, lease: &Lease, ttl: Duration) -> Result<Lease, StoreError>;

    /// Gives a lease up: sets it expired and clears its owner, so that whoever takes
    /// the session next is not counted as a recovery.
    ///
    /// # Contract
    /// No-op if the token is no longer current. Leaves the recovery counter alone.
    async fn release_lease(&self, lease: &Lease) -> Result<(), StoreError>;

    /// Records that the holder of `fence` runs the session under this lease: the journal
    /// calls it once per lease, before the lease's first model or tool call. Only a
    /// take-over of a lease marked so counts as a recovery (a death while the session
    /// ran, see [`acquire_lease`](Self::acquire_lease)): a worker killed while it held
    /// the session without running it (an idle lease) is not counted against it.
    ///
    /// # Contract
    /// Durable when it returns (a crash after it counts). [`StoreError::LeaseLost`] if
    /// the token is no longer current. Writes nothing else: no journal row, no seal.
    async fn mark_running(&self, fence: Fence<'_>) -> Result<(), StoreError>;

    /// Records that only an operator can settle `call`, an in-doubt (`issued`) journal
    /// row of the fence's session: a resume refused it as
    /// [`ReplayUnsafe`](crate::DurableError::ReplayUnsafe) (its verify hook could not
    /// tell whether the effect happened, or it has none, or it cannot run again). From
    /// then on [`claim_expired`](Self::claim_expired) leaves the session out, so that no
    /// worker pool hands it out in a loop, until the row leaves `issued`
    /// ([`resolve_call`](ResolutionStore::resolve_call)) or is issued again
    /// ([`reissue_call`](JournalStore::reissue_call) clears the mark). Taking the session by id
    /// ([`acquire_lease`](Self::acquire_lease)) is not affected.
    ///
    /// # Contract
    /// Durable when it returns. [`StoreError::LeaseLost`] if the token is no longer
    /// current. A row that is not `issued` (settled meanwhile) or already marked is left
    /// as it is (`Ok`). Scheduling state, outside the row's seal: erasing the mark only
    /// lets a pool claim the session once more, to be refused again.
    async fn mark_operator_needed(&self, fence: Fence<'_>, call: &CallId)
    -> Result<(), StoreError>;

    /// Claims one active session whose lease expired or was released, for recovery or
    /// for a worker pool, for `claim.owner` until `now + claim.ttl`.
    ///
    /// # Contract
    /// [`Claim::validate`] runs first. Atomic and safe under concurrency (two claimers
    /// never get the same session). Takes only a session that is:
    /// - `active`, with its lease released or expired (as
    ///   [`acquire_lease`](Self::acquire_lease) judges a live lease);
    /// - awake: no `wake_at`, or `wake_at <= now` on the database clock;
    /// - of `claim.app_version` when set, and of one of `claim.queues` when not empty;
    /// - in a queue below its fleet-wide limit ([`set_queue_limit`](QueueStore::set_queue_limit)):
    ///   fewer of the queue's active sessions hold a live lease than the limit, counted
    ///   in a way that two concurrent claims cannot both take the last place.
    /// - not waiting for an operator: none of its `issued` rows is marked by
    ///   [`mark_operator_needed`](Self::mark_operator_needed).
    ///
    /// Oldest session first (by creation): a session handed over mid-run (released,
    /// recovered, woken) goes before work submitted after it, so a deploy's hand-overs
    /// do not wait behind a backlog. Counts recoveries by the rule of
    /// [`acquire_lease`](Self::acquire_lease): claiming a lease that expired without a
    /// release, its holder running the session, increments the session's recovery counter, and when the counter already
    /// stands at `max_attempts` the session is parked instead (status
    /// [`SessionStatus::Parked`], reason recorded) and the next candidate is tried;
    /// claiming a released lease counts nothing. `None` when nothing is claimable.
    async fn claim_expired(&self, claim: &Claim) -> Result<Option<Lease>, StoreError>;

    /// Returns a parked session to `active`: an operator's decision after looking at it
    /// (for example once its in-doubt call is resolved). Clears the recovery counter and
    /// the parked reason and the lease; the next worker takes it with a fresh lease,
    /// which is not counted as a recovery.
    ///
    /// # Contract
    /// Atomic. [`StoreError::NotParked`] unless the session is parked;
    /// [`StoreError::SessionNotFound`] if absent.
    async fn unpark_session(&self, id: &SessionId) -> Result<SessionRecord, StoreError>;

    /// Lists active sessions whose lease has expired (or who have none).
    ///
    /// # Contract
    /// Read-only: it takes nothing, so a listed session may be claimed by another worker
    /// before the caller acts on it (use [`claim_expired`](Self::claim_expired) to take
    /// one). Lists sessions with status `active` whose lease was released or has
    /// `lease_expires_at <= now` on the database clock and that are not asleep
    /// (`wake_at` unset or past); parked and terminal sessions never appear. Oldest
    /// update first, at most `limit` (a negative `limit` counts as 0).
    async fn list_expired(&self, limit: i64) -> Result<Vec<SessionRecord>, StoreError>;

    /// Gives the lease up to wait, without a checkpoint: until `wait.until` no claim
    /// ([`claim_expired`](Self::claim_expired)) takes the session, unless what it waits
    /// for happens first. Returns `false`, writing nothing, when it already happened.
    ///
    /// # Contract
    /// Atomic and fenced. For [`WaitFor::Deadline`]: the session's
    /// [`waiting_until`](SessionRecord::waiting_until) becomes `wait.until`, its
    /// `waiting_for` [`WAITING_FOR_DEADLINE`], its lease is given up, and `Ok(true)`.
    /// For [`WaitFor::Children`]: when one of the named sessions
    /// (children of the fenced one) already [wakes its parent](wakes_parent), `Ok(false)`
    /// and nothing is written. Otherwise the session's
    /// [`waiting_until`](SessionRecord::waiting_until) becomes `wait.until` and its
    /// `waiting_for` [`WAITING_FOR_CHILDREN`], and its lease is given up as by
    /// [`release_lease`](Self::release_lease) (no recovery counted by the next take).
    /// Race-free against a child ending concurrently: one of the two transactions sees
    /// the other's write (a child that ends, is parked or is marked
    /// ([`mark_operator_needed`](Self::mark_operator_needed)) clears its parent's
    /// `waiting_until` in its own transaction when the parent waits for children).
    /// For [`WaitFor::Signal`]: when a signal of that name is pending for the session,
    /// `Ok(false)` and nothing is written; otherwise `waiting_for` becomes
    /// [`waiting_for_signal`]`(name)`, race-free against
    /// [`send_signal`](SignalStore::send_signal) as against a child's end.
    /// Taking the session by id ([`acquire_lease`](Self::acquire_lease)) is not affected.
    /// The default returns [`StoreError::Unsupported`].
    async fn wait(&self, fence: Fence<'_>, wait: &Wait) -> Result<bool, StoreError> {
        let _ = (fence, wait);
        Err(StoreError::Unsupported {
            operation: "wait",
            backend: "this store",
        })
    }
}

/// Queues and sleep: fleet-wide queue limits, the figures of each queue, waking a
/// sleeping session and telling idle pools that work may be available (the `workers`
/// conformance cases).
#[async_trait]
pub trait QueueStore: Send + Sync + 'static {
    /// Sets (or, with `None`, removes) a queue's fleet-wide limit: at most `max_running`
    /// of its active sessions leased at once, enforced by
    /// [`claim_expired`](LeaseStore::claim_expired).
    ///
    /// # Contract
    /// The name is checked with [`validate_id`](crate::validate::validate_id). The limit
    /// binds claims only: a session started, or resumed by id, in a full queue is not
    /// refused (it counts toward the limit while it holds its lease). Lowering a limit
    /// below the sessions running stops new claims until enough of them finish.
    async fn set_queue_limit(
        &self,
        queue: &str,
        max_running: Option<u32>,
    ) -> Result<(), StoreError>;

    /// Sets how claims schedule the session under `fence` ([`Scheduling`]): claims take
    /// the session of lowest rank `created_at − priority × aging` first (ms, saturating),
    /// then as before (creation order); a session never given a priority ranks at its
    /// `created_at`. A session with a tenant is not claimed while the tenant's limit of
    /// its sessions hold live leases ([`set_tenant_limit`](Self::set_tenant_limit)).
    ///
    /// # Contract
    /// Atomic; checked with [`Scheduling::validate`] first; fenced
    /// ([`StoreError::LeaseLost`] when the token moved on, [`StoreError::SessionNotFound`]
    /// if absent). Scheduling state, outside the seals.
    async fn set_scheduling(
        &self,
        fence: Fence<'_>,
        scheduling: &Scheduling,
    ) -> Result<(), StoreError>;

    /// Sets (or, with `None`, removes) a tenant's fleet-wide limit: at most
    /// `max_running` of its active sessions leased at once, enforced by
    /// [`claim_expired`](LeaseStore::claim_expired) as a queue's limit is, across every
    /// queue.
    ///
    /// # Contract
    /// As [`set_queue_limit`](Self::set_queue_limit): the name is checked with
    /// [`validate_id`](crate::validate::validate_id); the limit binds claims only.
    async fn set_tenant_limit(
        &self,
        tenant: &str,
        max_running: Option<u32>,
    ) -> Result<(), StoreError>;

    /// Every tenant with a limit or with an active session, by name, with its figures
    /// at one moment of the database clock.
    ///
    /// # Contract
    /// Read-only. `running` counts the tenant's active sessions with a live lease,
    /// `queued` its other active sessions. The default returns
    /// [`StoreError::Unsupported`].
    async fn tenants(&self) -> Result<Vec<TenantInfo>, StoreError> {
        Err(StoreError::Unsupported {
            operation: "tenants",
            backend: "this store",
        })
    }

    /// Every queue with a session that is not terminal, or with a limit, by name, with
    /// its figures at one moment of the database clock.
    ///
    /// # Contract
    /// Read-only. Counts as [`QueueInfo`] documents them.
    async fn queues(&self) -> Result<Vec<QueueInfo>, StoreError>;

    /// The earliest wake-up time still to come among active sessions whose lease is
    /// released or expired: when a pool with nothing to claim should look again.
    ///
    /// # Contract
    /// Read-only; `None` when no such session sleeps.
    async fn next_wake_at(&self) -> Result<Option<i64>, StoreError>;

    /// Notifications that work may have become available, for idle worker pools.
    ///
    /// # Contract
    /// A speed-up only (pools poll as well): `None` when the backend has none. A backend
    /// that has them notifies after committing what can make a session claimable: a
    /// session created, a lease released, an approval or resolution decided, a session
    /// unparked or woken, a queue limit changed. Within one process at least; across
    /// processes where the database can tell them (PostgreSQL's `LISTEN`/`NOTIFY`).
    fn work_events(&self) -> Option<WorkEvents> {
        None
    }

    /// Wakes a sleeping session now: its `wake_at` becomes the database clock's now, so
    /// the next claim may take it. An operator's decision.
    ///
    /// # Contract
    /// Atomic. [`StoreError::SessionNotFound`] if absent; [`StoreError::NotResumable`]
    /// unless the session is `active`. A session that is not asleep is returned
    /// unchanged.
    async fn wake_session(&self, id: &SessionId) -> Result<SessionRecord, StoreError>;
}

/// Checkpoints and the transcript: the compare-and-set checkpoint write with the messages
/// it appends, loading a checkpoint (whole or its tail), reading the transcript by range,
/// and forking a session from a checkpoint (the `checkpoints`, `window` and `fork`
/// conformance cases).
#[async_trait]
pub trait CheckpointLog: Send + Sync + 'static {
    /// Appends `checkpoint.messages` to the log and writes checkpoint `expected + 1`.
    ///
    /// # Contract
    /// Atomic and fenced; compare-and-set: fails with [`StoreError::VersionConflict`]
    /// unless the latest version is `expected`. Resets the recovery counter.
    async fn save_checkpoint(
        &self,
        fence: Fence<'_>,
        expected: i64,
        checkpoint: NewCheckpoint,
    ) -> Result<CheckpointMeta, StoreError>;

    /// Writes checkpoint `expected + 1`, as [`save_checkpoint`](Self::save_checkpoint),
    /// and marks the session `completed`, as
    /// [`set_status`](SessionStore::set_status) does (the lease ends, the token moves
    /// on, a parent waiting for the session is woken), in **one transaction**.
    ///
    /// What [`Session::complete`](crate::Session::complete) writes: a session whose final
    /// checkpoint was committed but not its status would be resumed from that
    /// checkpoint, as a step that recorded nothing yet, and its handler would repeat
    /// the calls it made before it completed.
    ///
    /// # Contract
    /// Atomic and fenced, all or nothing: on [`StoreError::VersionConflict`] or
    /// [`StoreError::LeaseLost`] neither the checkpoint nor the status is written.
    async fn complete_with_checkpoint(
        &self,
        fence: Fence<'_>,
        expected: i64,
        checkpoint: NewCheckpoint,
    ) -> Result<CheckpointMeta, StoreError>;

    /// Loads a checkpoint: `None` = the latest.
    ///
    /// # Contract
    /// [`StoreError::VersionNotFound`] for a missing version;
    /// [`StoreError::Corrupt`] names the session and version when a row cannot be read.
    /// Messages are returned as their stored text, seals checked but not parsed: a
    /// message that is not JSON is reported by whoever parses it ([`StoredMessage`]).
    async fn load_checkpoint(
        &self,
        id: &SessionId,
        version: Option<i64>,
    ) -> Result<Checkpoint, StoreError>;

    /// Loads a checkpoint (`None` = the latest) with only the last `window` messages of
    /// its transcript, for a resume whose cost does not grow with the session. The first
    /// message returned is at position `meta.last_seq - messages.len() + 1`; earlier ones
    /// are read on demand with [`messages`](Self::messages).
    ///
    /// # Contract
    /// As [`load_checkpoint`](Self::load_checkpoint), with `window` or fewer messages (all
    /// of them when the transcript is shorter). The checkpoint's seal, the session head
    /// and the returned messages are checked: each message's seal, chained from the stored
    /// seal of the message before the window, the last one's against the checkpoint's
    /// sealed transcript end. A message before the window is not read, so a change to it
    /// is not seen here ([`messages`](Self::messages) sees it). A backend should read only
    /// the window's rows; the default loads the whole transcript and keeps its tail.
    async fn load_checkpoint_window(
        &self,
        id: &SessionId,
        version: Option<i64>,
        window: usize,
    ) -> Result<Checkpoint, StoreError> {
        let mut checkpoint = self.load_checkpoint(id, version).await?;
        let skip = checkpoint.messages.len().saturating_sub(window);
        checkpoint.messages.drain(..skip);
        Ok(checkpoint)
    }

    /// Messages `from..=to` of a session's transcript (positions 1, 2, …), in order: the
    /// history before a [windowed](Self::load_checkpoint_window) resume, on demand.
    ///
    /// # Contract
    /// Read-only, one snapshot. [`StoreError::SessionNotFound`] if the session does not
    /// exist; [`StoreError::MessagesOutOfRange`] unless `1 <= from` and `to <=` the latest
    /// checkpoint's `last_seq` (`from = to + 1` asks for nothing and returns nothing).
    /// Messages logged after the latest checkpoint are not part of the transcript. Every
    /// returned message's seal is checked, chained from the stored seal of the message
    /// before `from`, so a changed, deleted or reordered message in the range is
    /// [`StoreError::Tampered`]. A backend should read only the range's rows; the default
    /// loads the latest checkpoint's whole transcript.
    async fn messages(
        &self,
        id: &SessionId,
        from: i64,
        to: i64,
    ) -> Result<Vec<StoredMessage>, StoreError> {
        let checkpoint = self.load_checkpoint(id, None).await?;
        let last_seq = checkpoint.meta.last_seq;
        check_message_range(id, from, to, last_seq)?;
        let first = checkpoint.meta.last_seq - checkpoint.messages.len() as i64 + 1;
        let start = usize::try_from(from - first).unwrap_or(0);
        let end = usize::try_from(to - first + 1).unwrap_or(0);
        Ok(checkpoint
            .messages
            .into_iter()
            .skip(start)
            .take(end.saturating_sub(start))
            .collect())
    }

    /// Lists checkpoint metadata, oldest first.
    ///
    /// # Contract
    /// Read-only. Versions in ascending order, from 0. [`StoreError::SessionNotFound`]
    /// if the session does not exist. It returns metadata only and checks no seal:
    /// [`load_checkpoint`](Self::load_checkpoint) checks a checkpoint and its transcript.
    async fn list_checkpoints(&self, id: &SessionId) -> Result<Vec<CheckpointMeta>, StoreError>;

    /// Creates session `fork.new_id` from version `fork.version` of `fork.source`: its
    /// version 0 is that checkpoint (transcript copied), leased to `fork.owner`, and its
    /// journal holds the source's effects the fork must not repeat.
    ///
    /// # Contract
    /// `new_id` ([`SessionId::validate`]) and `owner`
    /// ([`validate_owner`](crate::validate::validate_owner)) are checked before anything is
    /// written. Atomic: the new session row, its transcript (the source's log up to that
    /// checkpoint, bytes unchanged), its version 0, its journal and their seals under the
    /// store's signing key are written in one transaction, all or nothing. Not fenced: it
    /// needs no lease on the source, and leaves the source untouched. The new session is
    /// `active` on the source's app version with its metadata, fencing token 1 and a
    /// recovery counter of 0.
    ///
    /// **The parent's effects** ([`ForkFate`], decided by [`fork_fate`] for each of the
    /// source's journal rows, each checked under its seal first): a row
    /// [`ForkFate::Inherited`] is copied into step 0, one [`ForkFate::Carried`] into
    /// [`CARRIED_STEP`], carried rows first, each in the source's journal order, with a
    /// new id and everything else (identity but the step, class, status, arguments, key,
    /// schema fingerprint, outcome, spend, attempt, approval, times) unchanged; rows
    /// [`ForkFate::Rerun`] and [`ForkFate::Left`] are not copied. The head counts the
    /// copied rows and their issued ones. An audit row (`durable_migrations`, step map
    /// from [`fork_audit_map`]) names `fork.by`, the source and version, every copied
    /// call with the source's call it came from, and every rerun.
    ///
    /// [`StoreError::SessionNotFound`] if `id` does not exist,
    /// [`StoreError::VersionNotFound`] if it has no version `version`,
    /// [`StoreError::SessionExists`] if `new_id` is taken, [`StoreError::CallNotFound`]
    /// for a `rerun` call that is not one of the source's rows the fork would copy,
    /// [`StoreError::Corrupt`] for a checkpoint of a newer format,
    /// [`StoreError::Tampered`] if the source's transcript or journal fails its seals.
    async fn fork_session_with(
        &self,
        fork: &ForkSession,
    ) -> Result<(SessionRecord, Lease), StoreError>;
}

/// The call journal: issuing a call before it runs (insert-or-get on its identity),
/// recording outcomes, re-issuing in-doubt rows, and reading the journal with every seal
/// and the head's counts checked (the `journal`, `outcomes` and `tamper` conformance
/// cases).
#[async_trait]
pub trait JournalStore: Send + Sync + 'static {
    /// Inserts a journal row as *issued*, or returns the row with the same identity.
    ///
    /// # Contract
    /// Atomic insert-or-get on the identity: of concurrent callers with one identity,
    /// exactly one sees [`IssueOutcome::Inserted`]. Fenced. The insert is committed
    /// (and synced) before this returns. If `call.idempotency_key` is set and a row of
    /// the same tool holds that key with another `input_hash`, fails with
    /// [`StoreError::IdempotencyConflict`] and writes nothing.
    ///
    /// Steps only move forward: a call whose step is before the step of the session's
    /// latest journal row is refused with [`StoreError::StepClosed`] and writes nothing.
    /// So a step's rows are contiguous in the journal, which lets
    /// [`calls`](Self::calls) check one step's completeness without reading the rest.
    ///
    /// A session asked to stop ([`SessionRecord::cancel_requested`] set by
    /// [`cancel_session`](SessionStore::cancel_session)) issues nothing: fails with
    /// [`StoreError::CancelRequested`] and writes nothing, checked in the same
    /// transaction as the fence, so no effect starts once the cancellation committed.
    /// ([`record_call`](Self::record_call) is not refused: what it records already ran.)
    async fn issue_call(&self, fence: Fence<'_>, call: NewCall)
    -> Result<IssueOutcome, StoreError>;

    /// Records a call that ran without an *issued* row first (pure tools, model
    /// responses): inserts the row directly with its outcome, or returns the row that
    /// already holds this identity.
    ///
    /// # Contract
    /// One atomic, fenced transaction (one commit): insert-or-get on the identity
    /// exactly as [`issue_call`](Self::issue_call) (with its idempotency-key and step
    /// checks), but a new row is written with status
    /// `completed`/`failed` from `finish`, attempt 1 and `finished_at` set.
    async fn record_call(
        &self,
        fence: Fence<'_>,
        call: NewCall,
        finish: FinishCall,
    ) -> Result<IssueOutcome, StoreError>;

    /// Re-issues an in-doubt (`issued`), `not_happened` or `approved` row for another
    /// execution: attempt + 1, status `issued`, fence = the caller's token. An approved
    /// row keeps its [`approval`](CallRecord::approval): the edited arguments it runs
    /// with, if any.
    ///
    /// # Contract
    /// Fenced. Fails with [`StoreError::CallNotInDoubt`] if the row has an outcome or
    /// still awaits a decision (`requested`). Clears the row's
    /// [`mark_operator_needed`](LeaseStore::mark_operator_needed) mark. A session asked
    /// to stop issues nothing again: [`StoreError::CancelRequested`], checked with the
    /// fence, the row left as it was (as [`issue_call`](Self::issue_call) refuses it).
    async fn reissue_call(&self, fence: Fence<'_>, call: &CallId)
    -> Result<CallRecord, StoreError>;

    /// Issues an approved row to run, as [`reissue_call`](Self::reissue_call) does, with
    /// `key`'s key as its idempotency key when `Some`: the key a keyed tool derives from
    /// the arguments a person edited (the row's own, requested arguments derived the old
    /// one). The new key is sealed with the row, so a re-execution after a crash sends
    /// the same key.
    ///
    /// # Contract
    /// Fenced, atomic, and the `issued` audit row is written as for `reissue_call`. Fails
    /// with [`StoreError::CallNotInDoubt`] unless the row is `approved`, and with
    /// [`StoreError::IdempotencyConflict`] when another call of the tool holds the new key
    /// with arguments other than the edited ones (as [`issue_call`](Self::issue_call)
    /// refuses it); the row then stays approved. A session asked to stop runs no approved
    /// call: [`StoreError::CancelRequested`], the row left approved.
    async fn issue_approved(
        &self,
        fence: Fence<'_>,
        call: &CallId,
        key: Option<EditedKey>,
    ) -> Result<CallRecord, StoreError>;

    /// Records a call's outcome; optionally writes a checkpoint in the same transaction.
    ///
    /// # Contract
    /// Atomic and fenced. Fails with [`StoreError::CallNotInDoubt`] if the row already
    /// has an outcome. With `checkpoint = Some((expected, cp))` the checkpoint is
    /// compare-and-set as in [`save_checkpoint`](CheckpointLog::save_checkpoint), all or nothing.
    async fn finish_call(
        &self,
        fence: Fence<'_>,
        call: &CallId,
        finish: FinishCall,
        checkpoint: Option<(i64, NewCheckpoint)>,
    ) -> Result<Option<CheckpointMeta>, StoreError>;

    /// Reads one journal row.
    ///
    /// # Contract
    /// Read-only. [`StoreError::CallNotFound`] if absent; the row's seal is checked, and a
    /// row that does not match it is [`StoreError::Tampered`].
    async fn call(&self, id: &CallId) -> Result<CallRecord, StoreError>;

    /// Journal rows of a session (optionally one step), in issue order.
    ///
    /// # Contract
    /// Read-only, from one snapshot. [`StoreError::SessionNotFound`] if the session does
    /// not exist. The session head's seal is checked, and so is the journal's
    /// completeness (the head counts its rows: a deleted or inserted row is
    /// [`StoreError::Tampered`]) and every returned row's seal.
    async fn calls(
        &self,
        session: &SessionId,
        step: Option<i64>,
    ) -> Result<Vec<CallRecord>, StoreError>;

    /// One page of a session's journal, in issue order: the rows at positions
    /// `after + 1 ..= after + limit` (a row's position is its place in the session's
    /// journal, counting from 1; `after = 0` starts at the first row). Listings and
    /// `durable verify` walk a long journal page by page (keyset pagination on the
    /// position, never `OFFSET`), so their memory does not grow with the journal.
    ///
    /// # Contract
    /// Read-only, from one snapshot. [`StoreError::SessionNotFound`] if the session does
    /// not exist. The session head's seal is checked, every returned row's seal, and the
    /// page against the head's count of rows with [`check_journal_page`] (the journal's
    /// extent, no gap in the page, a short page ends the journal): a walk of every page
    /// checks the journal complete, as [`calls`](Self::calls) does, at the cost of a page
    /// each. A page shorter than `limit` is the journal's last. A
    /// negative `after` counts as 0 and a `limit` below 1 as 1. A backend should answer
    /// from its index of positions, so that a page costs the same at any depth; the
    /// default reads the whole journal and slices it.
    async fn calls_page(
        &self,
        session: &SessionId,
        after: i64,
        limit: i64,
    ) -> Result<Vec<CallRecord>, StoreError> {
        let after = usize::try_from(after.max(0)).unwrap_or(usize::MAX);
        let limit = usize::try_from(limit.max(1)).unwrap_or(usize::MAX);
        Ok(self
            .calls(session, None)
            .await?
            .into_iter()
            .skip(after)
            .take(limit)
            .collect())
    }

    /// The session's rows whose stored status is `issued`, in issue order: what a resume
    /// reports as in doubt.
    ///
    /// # Contract
    /// Read-only, from one snapshot. [`StoreError::SessionNotFound`] if the session does
    /// not exist. The session head's seal is checked, every returned row's seal is
    /// checked, and the number of rows returned must be the head's sealed count of
    /// issued rows ([`Head::issued_rows`](crate::integrity::Head)): a row set to or from
    /// `issued` behind the store's back, or a deleted issued row, is
    /// [`StoreError::Tampered`]. A backend should answer from an index of the issued
    /// rows, so that the cost does not grow with the journal; the default reads the
    /// whole journal (every seal checked) and filters it.
    ///
    /// What it does not see: a row changed between two statuses other than `issued`
    /// (completed to failed, say), or moved to another step without being issued. Such a
    /// row fails its seal when its step is read ([`calls`](Self::calls) with a step),
    /// before the step's replay uses it.
    async fn issued_calls(&self, session: &SessionId) -> Result<Vec<CallRecord>, StoreError> {
        Ok(self
            .calls(session, None)
            .await?
            .into_iter()
            .filter(|c| c.status == CallStatus::Issued)
            .collect())
    }

    /// Rows with status `issued` whose issuing lease is gone (expired, released or
    /// superseded), across sessions or for one session.
    ///
    /// # Contract
    /// Read-only, one statement, decided on the database clock: a row is in doubt when
    /// the session's fencing token is no longer the row's, or the session's lease was
    /// released or has expired. Grouped by session, in issue order within one; every
    /// returned row's seal is checked ([`StoreError::Tampered`]). A session that does not
    /// exist has no rows in doubt (no error).
    async fn in_doubt(&self, session: Option<&SessionId>) -> Result<Vec<CallRecord>, StoreError>;
}

/// Operators' resolutions of in-doubt calls and their sealed audit log (the `resolution`
/// conformance cases).
#[async_trait]
pub trait ResolutionStore: Send + Sync + 'static {
    /// Applies an operator's resolution and writes its audit row.
    ///
    /// # Contract
    /// Atomic. Refuses ([`StoreError::CallNotInDoubt`]) a call whose status is not
    /// `issued`. `Happened` sets status `resolved` with the result; `DidNotHappen`
    /// sets `not_happened`. Either way the row leaves `issued`, so a session that
    /// waited for this resolution ([`mark_operator_needed`](LeaseStore::mark_operator_needed))
    /// is claimable again.
    ///
    /// [`ResolveCall::validate`] runs first: a bad resolver or note is refused before
    /// anything is written.
    async fn resolve_call(&self, resolve: ResolveCall) -> Result<CallRecord, StoreError>;

    /// Audit rows of resolutions for a session.
    ///
    /// # Contract
    /// Read-only, from one snapshot, in the order the resolutions were written.
    /// [`StoreError::SessionNotFound`] if the session does not exist. The session head's
    /// seal is checked, and so is every row's seal at its position and their number
    /// against the head: a deleted, reordered or altered resolution is
    /// [`StoreError::Tampered`].
    async fn resolutions(&self, session: &SessionId) -> Result<Vec<ResolutionRecord>, StoreError>;
}

/// Calls that need a person's approval: requesting, deciding (approve, deny, expire,
/// revoke), the pending ones, and the sealed approval log (the `approval` conformance
/// cases).
#[async_trait]
pub trait ApprovalStore: Send + Sync + 'static {
    /// Journals a call that needs a person's approval: inserts its row as
    /// [`CallStatus::Requested`] with its [`Approval`] (nothing runs), or returns the row
    /// that already holds this identity, whatever its status.
    ///
    /// # Contract
    /// One atomic, fenced transaction (one commit), synced before it returns:
    /// insert-or-get on the identity exactly as [`issue_call`](JournalStore::issue_call) (with
    /// its idempotency-key and step checks). A new row has attempt 0 (nothing ran), the
    /// deadline `expires_in` after the store's clock, and a `requested` audit row at the
    /// next position of the session's approval log, counted by the head.
    /// [`ApprovalRequest::validate`] runs first. The session's status is not changed:
    /// the harness parks it once every call of the turn is dispatched
    /// ([`set_status`](SessionStore::set_status) with [`SessionStatus::AwaitingApproval`]).
    async fn request_call(
        &self,
        fence: Fence<'_>,
        call: NewCall,
        request: ApprovalRequest,
    ) -> Result<IssueOutcome, StoreError>;

    /// Applies a person's decision on a requested call and writes its audit row.
    ///
    /// # Contract
    /// Atomic; not fenced (an operator decides, not the session's worker).
    /// [`DecideApproval::validate`] runs first. Refuses with
    /// [`StoreError::NotAwaitingApproval`] a call whose status is not `requested` (for
    /// `Revoke`: not `approved`, an approved call that has not run): of two decisions on
    /// one call taken at once, exactly one is applied and the other gets this error.
    /// Decided on the store's clock: approving or denying a request after the deadline
    /// is [`StoreError::ApprovalExpired`], expiring before it (or a request without one)
    /// [`StoreError::ApprovalNotExpired`].
    ///
    /// `Approve` sets status `approved` and records the edited arguments, if any, in the
    /// row's approval (the row's own arguments and identity stay those requested: a
    /// replay of the turn asks with them). `Deny` and `Expire` set status `denied` with
    /// the denial as the recorded error (`{"denied": reason, "by": who}`), which replay
    /// returns to the model. The audit row (position, seal, head count) is written in the
    /// same transaction. When no requested call is left in the session and its status is
    /// [`SessionStatus::AwaitingApproval`], it becomes `active` again, in the same
    /// transaction, with no lease: the next worker takes it.
    async fn decide_approval(&self, decide: DecideApproval) -> Result<CallRecord, StoreError>;

    /// Calls awaiting a decision (status `requested`), across sessions or for one:
    /// oldest request first. A session that ended (completed, failed, cancelled) has
    /// none: its requests can never run.
    ///
    /// # Contract
    /// Read-only, one statement, from an index of the requested rows (the cost follows
    /// the pending calls, not the journals). Every returned row's seal is checked
    /// ([`StoreError::Tampered`]); `expired` is decided on the store's clock. A session
    /// that does not exist has none (no error).
    async fn pending_approvals(
        &self,
        session: Option<&SessionId>,
    ) -> Result<Vec<PendingApproval>, StoreError>;

    /// The approval log of a session: every request and decision, in the order written.
    ///
    /// # Contract
    /// Read-only, from one snapshot. [`StoreError::SessionNotFound`] if the session does
    /// not exist. The session head's seal is checked, and so is every row's seal at its
    /// position and their number against the head: a deleted, reordered or altered
    /// audit row is [`StoreError::Tampered`].
    async fn approvals(&self, session: &SessionId) -> Result<Vec<ApprovalRecord>, StoreError>;
}

/// Maintenance: the error history, moving a session to another app version, and purging
/// finished sessions (the `maintenance` conformance cases).
#[async_trait]
pub trait MaintenanceStore: Send + Sync + 'static {
    /// Records an LLM/API error (retry history). Not fenced: errors are history.
    ///
    /// # Contract
    /// [`NewError::validate`] runs first: a context or message holding NUL is refused
    /// before anything is written.
    async fn record_error(&self, error: NewError) -> Result<(), StoreError>;

    /// The recorded errors of a session, oldest first.
    ///
    /// # Contract
    /// Read-only, in the order they were recorded. Error history is not sealed, so
    /// nothing is checked; a session that does not exist (or was purged) has none: an
    /// empty list, not an error.
    async fn errors(&self, session: &SessionId) -> Result<Vec<ErrorRecord>, StoreError>;

    /// Moves a session to another app version, audited.
    ///
    /// # Contract
    /// Atomic. [`StoreError::AppVersionMismatch`] if the session is not on
    /// `from_version`. Renames `tool` of the session's journal rows per `step_map`.
    /// [`RetargetSession::validate`] runs first.
    async fn retarget_session(&self, migrate: RetargetSession)
    -> Result<SessionRecord, StoreError>;

    /// Deletes a terminal session and all its rows, if it was last updated more than
    /// `retention` ago and no call is in doubt.
    ///
    /// # Contract
    /// Atomic: all rows or none.
    async fn purge_session(
        &self,
        id: &SessionId,
        retention: Duration,
    ) -> Result<PurgeOutcome, StoreError>;
}

/// Fleet-wide rate limits kept in the store, shared by every worker of it (the
/// `limiter` conformance cases). See [`limiter`](crate::limiter) for the algorithm
/// (GCRA by reservation), fairness and what a `429` does.
#[async_trait]
pub trait LimiterStore: Send + Sync + 'static {
    /// Defines (or redefines) the limit `name`, persisted for every worker of the store.
    ///
    /// # Contract
    /// Atomic; checked with [`RateLimit::validate`](crate::limiter::RateLimit::validate)
    /// first. The last definition written wins: a different definition replaces the
    /// stored one ([`Defined::Replaced`](crate::limiter::Defined::Replaced)) and keeps
    /// the buckets' state; the same one changes nothing.
    async fn define_limit(
        &self,
        name: &str,
        limit: &crate::limiter::RateLimit,
    ) -> Result<crate::limiter::Defined, StoreError>;

    /// Reserves a start for one call under a limit (see
    /// [`Acquire`](crate::limiter::Acquire) and
    /// [`LimiterState::reserve`](crate::limiter::LimiterState::reserve)).
    ///
    /// # Contract
    /// One transaction, serialised with every other acquire of the limit (its row is
    /// locked): starts are given in that order and never go backwards. With a waiter
    /// id, a reservation the waiter already holds is answered again (still to come) or
    /// taken and removed (due), as [`WaiterStep`](crate::limiter::WaiterStep) decides;
    /// a new reservation still to come is stored under the id. Reservations abandoned
    /// for [`ABANDONED_AFTER`](crate::limiter::ABANDONED_AFTER) are removed.
    /// [`StoreError::LimitNotDefined`] if no limit has this name.
    async fn acquire_limit(
        &self,
        acquire: &crate::limiter::Acquire,
    ) -> Result<crate::limiter::Admission, StoreError>;

    /// Charges `tokens` more on a limit's tokens dimension (a reply's real usage).
    ///
    /// # Contract
    /// Atomic ([`LimiterState::charge`](crate::limiter::LimiterState::charge)); a limit
    /// without a tokens quota is left unchanged. [`StoreError::LimitNotDefined`] if no
    /// limit has this name.
    async fn charge_limit(&self, name: &str, tokens: u64) -> Result<(), StoreError>;

    /// A provider answered `429` with `retry-after`: holds every start of the limit
    /// until the database clock's now plus `retry_after`, for the whole fleet. Returns
    /// that time (ms).
    ///
    /// # Contract
    /// Atomic ([`LimiterState::throttle`](crate::limiter::LimiterState::throttle)): a
    /// shorter `retry_after` than one already in force changes nothing but the count.
    /// [`StoreError::LimitNotDefined`] if no limit has this name.
    async fn throttle_limit(&self, name: &str, retry_after: Duration) -> Result<i64, StoreError>;

    /// Every limit defined, by name, with its figures at one moment of the database
    /// clock.
    ///
    /// # Contract
    /// Read-only.
    async fn limiters(&self) -> Result<Vec<crate::limiter::LimiterInfo>, StoreError>;
}

/// Signals into a session: sending one, consuming it once from the session's turn, and
/// listing them (the `signals` conformance cases). See [`NewSignal`] and
/// [`consumer_key`].
#[async_trait]
pub trait SignalStore: Send + Sync + 'static {
    /// Sends a signal to a session, where it waits until the session consumes it. Wakes
    /// the session if it waits for a signal of this name.
    ///
    /// # Contract
    /// [`NewSignal::validate`] runs first. Atomic and durable when it returns.
    /// [`StoreError::SessionNotFound`] if the session is absent; [`StoreError::SessionEnded`]
    /// if it is completed, failed or cancelled (nothing would ever read it). A parked
    /// session takes signals (they wait for its unpark). With a key already used for this
    /// session: the signal sent with it is returned and nothing is written when the name
    /// and payload are the same ([`SignalRecord::same_send`]),
    /// [`StoreError::IdempotencyConflict`] otherwise. In the transaction of the insert, a
    /// session whose `waiting_for` is [`waiting_for_signal`]`(name)` has its wait cleared
    /// (race-free against [`wait`](LeaseStore::wait): one of the two sees the other's
    /// write), and idle pools are told at commit. The default returns
    /// [`StoreError::Unsupported`].
    async fn send_signal(&self, signal: &NewSignal) -> Result<SignalRecord, StoreError> {
        let _ = signal;
        Err(StoreError::Unsupported {
            operation: "send_signal",
            backend: "this store",
        })
    }

    /// Consumes a signal named `name` of the fenced session for the journal call whose
    /// [`consumer_key`] is `consumer`: the signal this key consumed before if there is
    /// one (a re-run call is handed the same signal), else the oldest pending one (by
    /// [`id`](SignalRecord::id)), marked consumed by `consumer`. `None` (nothing
    /// written) when there is neither.
    ///
    /// # Contract
    /// Atomic and fenced ([`StoreError::LeaseLost`] when the token moved on). Two
    /// consumers never get the same signal; a signal, once consumed, is never pending
    /// again. The default returns [`StoreError::Unsupported`].
    async fn consume_signal(
        &self,
        fence: Fence<'_>,
        name: &str,
        consumer: &str,
    ) -> Result<Option<SignalRecord>, StoreError> {
        let _ = (fence, name, consumer);
        Err(StoreError::Unsupported {
            operation: "consume_signal",
            backend: "this store",
        })
    }

    /// The signals sent to `session`, pending and consumed, oldest first.
    ///
    /// # Contract
    /// Read-only. [`StoreError::SessionNotFound`] if the session is absent. The default
    /// returns [`StoreError::Unsupported`].
    async fn signals(&self, session: &SessionId) -> Result<Vec<SignalRecord>, StoreError> {
        let _ = session;
        Err(StoreError::Unsupported {
            operation: "signals",
            backend: "this store",
        })
    }
}

/// Conveniences over [`CheckpointStore`], compositions of its methods: implemented for
/// every store (nobody implements this trait), in scope with `use
/// durable_core::store::CheckpointStoreExt` (or `durable::CheckpointStoreExt`).
#[async_trait]
pub trait CheckpointStoreExt: CheckpointStore {
    /// Creates session `new_id` from version `version` of `id`, inheriting every effect of
    /// `id` (no operator rerun): [`fork_session_with`](CheckpointLog::fork_session_with) with
    /// [`ForkSession::new`], `owner` named in the audit.
    async fn fork_session(
        &self,
        id: &SessionId,
        version: i64,
        new_id: &SessionId,
        owner: &str,
        ttl: Duration,
    ) -> Result<(SessionRecord, Lease), StoreError> {
        self.fork_session_with(&ForkSession::new(
            id.clone(),
            version,
            new_id.clone(),
            owner,
            ttl,
        ))
        .await
    }
}

impl<T: CheckpointStore + ?Sized> CheckpointStoreExt for T {}
