//! Errors: [`StoreError`] from backends, [`DurableError`] from the runtime.

#[cfg(feature = "runtime")]
use crate::args::ArgumentError;
use crate::ids::{CallId, SessionId};
#[cfg(feature = "runtime")]
use crate::replay::ReplayClass;

mod kind;

pub use kind::ErrorKind;

/// An error from a [`CheckpointStore`](crate::CheckpointStore).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// No session with this id.
    #[error("session `{0}` not found")]
    SessionNotFound(SessionId),
    /// A session with this id already exists.
    #[error("session `{0}` already exists")]
    SessionExists(SessionId),
    /// Another worker holds a live lease on the session.
    ///
    /// The same owner is never refused (it re-acquires its own live lease at once, with a
    /// new fencing token), so a worker with a stable owner name that restarts takes its
    /// sessions back without waiting: see [`DurableBuilder::owner`](crate::DurableBuilder::owner).
    #[error(
        "session `{session}` is leased by `{owner}` until {} ({} s left); wait for it to expire or recover another session. \
         If `{owner}` was this worker before a restart, give every worker a stable owner (`.owner(\"worker-1\")`) \
         instead of the default `host-pid`: a restarted worker then re-acquires its own sessions at once",
        lease_expiry(.expires_at),
        seconds_left(.remaining_ms)
    )]
    Leased {
        /// The session.
        session: SessionId,
        /// The current holder.
        owner: String,
        /// Expiry on the database clock (ms since the epoch).
        expires_at: i64,
        /// Time left on the lease, measured by the database clock (ms, positive).
        remaining_ms: i64,
    },
    /// Taking the lease was a recovery (the previous holder never released it) that would
    /// exceed the recovery bound, so the store parked the session instead: its resumes
    /// keep dying before a checkpoint. An operator looks at it, then unparks it.
    #[error(
        "session `{session}` was parked: its last {attempts} recoveries died before a checkpoint (a poison pill); \
         find out why (`durable show {session}`), then unpark it: `durable unpark {session}` or `Operator::unpark`"
    )]
    Parked {
        /// The session.
        session: SessionId,
        /// The recoveries counted before this one.
        attempts: i32,
    },
    /// The writer's fencing token is no longer current: another worker took the session.
    #[error(
        "lease lost on session `{session}`: fencing token {token} is stale; stop working on this session"
    )]
    LeaseLost {
        /// The session.
        session: SessionId,
        /// The stale token.
        token: i64,
    },
    /// The session was asked to stop ([`cancel_session`](crate::store::SessionStore::cancel_session))
    /// while a worker held it: the store issues no new call of it, so no effect starts
    /// after the cancellation committed. Return from the handler; the runtime ends the
    /// session as `cancelled`.
    #[error(
        "session `{session}` was cancelled by {by} ({reason}); no new call of it starts: return from the handler"
    )]
    CancelRequested {
        /// The session.
        session: SessionId,
        /// Who asked.
        by: String,
        /// Why.
        reason: String,
        /// When (ms, database clock).
        at: i64,
    },
    /// The session is terminal or parked and cannot be leased.
    #[error("session `{session}` is {status} and cannot be resumed")]
    NotResumable {
        /// The session.
        session: SessionId,
        /// Its status.
        status: String,
    },
    /// The session has ended (completed, failed or cancelled): what was sent to it would
    /// never be read.
    #[error(
        "session `{session}` has ended ({status}): nothing sent to it would be read; send to a running or parked session"
    )]
    SessionEnded {
        /// The session.
        session: SessionId,
        /// Its status.
        status: String,
    },
    /// A signal was refused before anything reached the database (see
    /// [`NewSignal::validate`](crate::store::NewSignal::validate)).
    #[error("invalid signal to session `{session}`: {detail}")]
    InvalidSignal {
        /// The session it was sent to.
        session: SessionId,
        /// What is wrong with it.
        detail: String,
    },
    /// Only a parked session can be unparked.
    #[error("session `{session}` is {status}, not parked; only parked sessions can be unparked")]
    NotParked {
        /// The session.
        session: SessionId,
        /// Its status.
        status: String,
    },
    /// Compare-and-set on the checkpoint version failed.
    #[error(
        "version conflict on session `{session}`: expected latest checkpoint {expected}, found {actual}"
    )]
    VersionConflict {
        /// The session.
        session: SessionId,
        /// The version the writer expected.
        expected: i64,
        /// The version the store has.
        actual: i64,
    },
    /// No checkpoint with this version.
    #[error("session `{session}` has no checkpoint version {version}")]
    VersionNotFound {
        /// The session.
        session: SessionId,
        /// The version asked for.
        version: i64,
    },
    /// Messages asked for outside a session's checkpointed transcript.
    #[error(
        "session `{session}` has no messages {from}..={to}: its latest checkpoint holds messages 1..={last_seq}; ask for positions from 1 up to that"
    )]
    MessagesOutOfRange {
        /// The session.
        session: SessionId,
        /// The first position asked for.
        from: i64,
        /// The last position asked for.
        to: i64,
        /// The last message of the session's latest checkpoint (0: none).
        last_seq: i64,
    },
    /// The session being forked changed while the fork was made (a call was recorded or
    /// settled between the check of its journal and the copy): nothing was written.
    #[error(
        "session `{0}` changed while it was being forked (a call was recorded or settled meanwhile); nothing was written: fork it again"
    )]
    ForkSourceChanged(SessionId),
    /// No journal row with this id.
    #[error("call `{0}` not found")]
    CallNotFound(CallId),
    /// The call is not in doubt (already has an outcome, or still running under a live lease).
    #[error("call `{call}` is not in doubt (status `{status}`)")]
    CallNotInDoubt {
        /// The call.
        call: CallId,
        /// Its status.
        status: String,
    },
    /// A decision on a call that is not awaiting one: it was never requested, or it was
    /// already approved, denied or expired (by another operator, say: of two decisions
    /// taken at once, exactly one is applied).
    #[error(
        "call `{call}` is not awaiting approval (status `{status}`): it was already decided, or never needed a decision"
    )]
    NotAwaitingApproval {
        /// The call.
        call: CallId,
        /// Its status.
        status: String,
    },
    /// An approval or denial after the request's deadline: the request can only expire.
    #[error(
        "the approval request of call `{call}` expired at {deadline} (ms since the epoch, the store's clock); it can only be expired now"
    )]
    ApprovalExpired {
        /// The call.
        call: CallId,
        /// Its deadline (ms).
        deadline: i64,
    },
    /// An expiry before the request's deadline (or of a request without one).
    #[error("the approval request of call `{call}` has not expired ({detail})")]
    ApprovalNotExpired {
        /// The call.
        call: CallId,
        /// Its deadline, or that it has none.
        detail: String,
    },
    /// A denial without a reason: the reason is the tool result the model reads.
    #[error("a denial needs a reason: the model reads it as the tool's result (call `{call}`)")]
    EmptyDenialReason {
        /// The call.
        call: CallId,
    },
    /// An idempotency key was reused with different arguments.
    #[error(
        "idempotency key `{key}` of tool `{tool}` was already used with other arguments (call `{existing}`); derive keys from every argument that changes the effect"
    )]
    IdempotencyConflict {
        /// The tool.
        tool: String,
        /// The key.
        key: String,
        /// The call that holds the key.
        existing: CallId,
    },
    /// A call of a step that the session has already left: its journal holds rows of a
    /// later step. Steps only move forward (a checkpoint advances them), which keeps a
    /// step's rows contiguous in the journal; a call that started before a checkpoint
    /// and reached the store after it (a cloned [`Journal`](crate::Journal) racing
    /// [`Session::checkpoint`](crate::Session::checkpoint)) is refused, and nothing is
    /// written.
    #[error(
        "call in step {step} of session `{session}` reached the store after step {latest} began: a checkpoint ended its step while it ran; finish a step's calls before checkpointing"
    )]
    StepClosed {
        /// The session.
        session: SessionId,
        /// The call's step.
        step: i64,
        /// The step of the session's latest journal row.
        latest: i64,
    },
    /// The session is not on the app version the operation expects.
    #[error("session `{session}` is on app version `{actual}`, not `{expected}`")]
    AppVersionMismatch {
        /// The session.
        session: SessionId,
        /// The expected version.
        expected: String,
        /// The session's version.
        actual: String,
    },
    /// A stored row could not be read.
    #[error("corrupt data in session `{session}`{}: {detail}", version.map(|v| format!(" at version {v}")).unwrap_or_default())]
    Corrupt {
        /// The session.
        session: SessionId,
        /// The checkpoint version, if the row belongs to one.
        version: Option<i64>,
        /// What is wrong.
        detail: String,
    },
    /// A row failed its integrity check: it was changed, deleted, reordered or forged
    /// outside `durable` (see [`integrity`](crate::integrity)).
    #[error(
        "integrity check failed in session `{session}`: {what}: {detail}; the store was changed outside durable. \
         Nothing was replayed from it. Run `durable verify` for the whole picture and restore from a backup"
    )]
    Tampered {
        /// The session.
        session: SessionId,
        /// The row (`journal row c-1 (seq 3)`, `message 4`, `checkpoint 2`, `session head`).
        what: String,
        /// Why it does not hold.
        detail: String,
    },
    /// The store is sealed with a key this process does not have, or a key row of the
    /// store is missing; the detail says what to do.
    #[error("key `{key}` is missing or unusable: {detail}")]
    KeyMissing {
        /// The id of the missing key (`app-…`, `store-…`), `store` (the store's own key
        /// row), `signing_key` (the row naming the signing key) or the variable at fault.
        key: String,
        /// What needs it.
        detail: String,
    },
    /// The database was written by a newer release of `durable`.
    #[error(
        "the {backend} database schema is at version {found}, newer than this release supports ({supported}); upgrade `durable`"
    )]
    SchemaTooNew {
        /// The backend.
        backend: &'static str,
        /// The database's schema version.
        found: i64,
        /// The newest version this release knows.
        supported: i64,
    },
    /// The store's durability settings could lose an acknowledged write.
    #[error(
        "the {backend} store is not durable: {setting}; unsafe tools refuse to run until it is fixed"
    )]
    NotDurable {
        /// The backend.
        backend: &'static str,
        /// The offending setting.
        setting: String,
    },
    /// No rate limit of this name is defined in the store.
    #[error(
        "no rate limit named `{name}` is defined in this store; define it first (`DurableBuilder::rate_limit` or `LimiterStore::define_limit`)"
    )]
    LimitNotDefined {
        /// The name asked for.
        name: String,
    },
    /// A rate limit's definition or name was refused before anything reached the
    /// database.
    #[error("invalid rate limit `{name}`: {problem}")]
    InvalidLimit {
        /// The limit's name (cut at the longest name allowed).
        name: String,
        /// What is wrong, and what to change.
        problem: String,
    },
    /// The backend does not support this operation.
    #[error("`{operation}` is not supported by the {backend} store")]
    Unsupported {
        /// The operation.
        operation: &'static str,
        /// The backend.
        backend: &'static str,
    },
    /// An id given to the store (session id, fork target, owner, app version) was refused
    /// before anything reached the database; see [`validate_id`](crate::validate::validate_id).
    #[error("invalid {what}: {problem}")]
    InvalidId {
        /// Which id: `session id`, `owner`, `app version`.
        what: &'static str,
        /// What is wrong with it.
        problem: IdProblem,
    },
    /// A free text given to the store (a status reason, a resolution note, an error
    /// message) holds NUL, which PostgreSQL cannot store in text; refused on every backend
    /// alike before anything reached the database, see
    /// [`validate_text`](crate::validate::validate_text).
    #[error(
        "invalid {what}: it contains NUL at byte {at}; remove it or escape it (for example as \\u0000)"
    )]
    InvalidText {
        /// Which text: `status reason`, `resolution note`, `error message`, …
        what: &'static str,
        /// Byte offset of the first NUL.
        at: usize,
    },
    /// An operator's raise of a budget ceiling was refused before anything was written
    /// (see [`RaiseLimit::validate`](crate::store::RaiseLimit::validate)).
    #[error("invalid limit raise: {detail}")]
    InvalidRaise {
        /// What is wrong with it.
        detail: String,
    },
    /// The location does not hold a durable store and was not made into one: a missing or
    /// empty file, a file that is not SQLite, a database without the durable schema (for a
    /// read-only open), or something that is not a regular file.
    #[error("`{location}` is not a durable store: {detail}")]
    NotAStore {
        /// The file path, or the database URL with its password removed.
        location: String,
        /// What was found there.
        detail: String,
    },
    /// The store was rolled back: its witness (a record kept outside the database of every
    /// effect the store acknowledged) names journal rows the database no longer holds, or
    /// the database expects a witness that is gone. A lost `-wal`, a database file copied
    /// without it, a restored backup or a different store at the same path all look like
    /// this. Nothing runs until an operator acknowledges the rollback (`durable
    /// acknowledge-rollback`), which parks every session whose effects are unknown instead
    /// of letting a worker run them again.
    #[error("`{location}` was rolled back: {detail}")]
    RolledBack {
        /// The store's location.
        location: String,
        /// What was lost, and what to do.
        detail: String,
    },
    /// A read-only open found a schema older than this release reads; a writer upgrades it.
    #[error(
        "the {backend} database schema is at version {found}, older than this release reads ({supported}); \
         open it once with a writer (your application, or a store opened without `read_only`) to upgrade it"
    )]
    SchemaTooOld {
        /// The backend.
        backend: &'static str,
        /// The database's schema version.
        found: i64,
        /// The version this release reads.
        supported: i64,
    },
    /// A write was attempted through a store opened read-only.
    #[error("the {backend} store was opened read-only; this write was refused")]
    ReadOnly {
        /// The backend.
        backend: &'static str,
    },
    /// The store is overloaded: every connection of its pool stayed busy for the whole
    /// acquire timeout, so this operation was refused before it reached the database
    /// (nothing was written). More operations ran at once in this process than the pool
    /// serves within its acquire timeout; see "Limits" in the README.
    ///
    /// Retryable ([`DurableError::is_retryable`]): wait [`retry_after`](StoreError::retry_after)
    /// (a hint) and try again, or start fewer sessions at once. If it persists, `advice`
    /// names the pool size to raise, or the acquire timeout, to queue longer.
    #[error(
        "the {backend} store is overloaded: no connection of its {pool} pool ({pool_size} connections) came free within {} ms; \
         nothing was done. Retry in {} ms, or run fewer operations at once in this process; if this persists, {advice}",
        .waited.as_millis(),
        .retry_after.as_millis()
    )]
    Overloaded {
        /// The backend.
        backend: &'static str,
        /// The pool that stayed full: `writer`, `reader` (SQLite) or `connection` (PostgreSQL).
        pool: &'static str,
        /// Its number of connections.
        pool_size: u32,
        /// How long the operation waited for a connection (the pool's acquire timeout).
        waited: std::time::Duration,
        /// When to try again (a hint).
        retry_after: std::time::Duration,
        /// Which setting to raise if it persists, e.g. ``raise `PostgresStoreOptions::max_connections` …``.
        advice: &'static str,
    },
    /// The database could not be reached or failed.
    #[error("{backend} database error: {source}")]
    Database {
        /// The backend.
        backend: &'static str,
        /// The underlying error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl StoreError {
    /// Wraps a backend's own error.
    pub fn database(
        backend: &'static str,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        StoreError::Database {
            backend,
            source: Box::new(source),
        }
    }

    /// A refusal because no connection of a pool came free within its acquire timeout:
    /// [`StoreError::Overloaded`], with a retry hint derived from the timeout (a quarter of
    /// it, between 50 ms and 5 s).
    pub fn overloaded(
        backend: &'static str,
        pool: &'static str,
        pool_size: u32,
        waited: std::time::Duration,
        advice: &'static str,
    ) -> Self {
        let retry_after = (waited / 4).clamp(
            std::time::Duration::from_millis(50),
            std::time::Duration::from_secs(5),
        );
        StoreError::Overloaded {
            backend,
            pool,
            pool_size,
            waited,
            retry_after,
            advice,
        }
    }

    /// If the store was overloaded ([`StoreError::Overloaded`]): how long to wait before
    /// trying again. Nothing was done.
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            StoreError::Overloaded { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }
}

/// A lease expiry (ms since the epoch) in RFC 3339, UTC, to the millisecond.
fn lease_expiry(ms: &i64) -> String {
    let at = u64::try_from(*ms)
        .ok()
        .and_then(|ms| std::time::UNIX_EPOCH.checked_add(std::time::Duration::from_millis(ms)));
    match at {
        Some(at) => humantime::format_rfc3339_millis(at).to_string(),
        None => format!("{ms} ms since the epoch"),
    }
}

/// Whole seconds left, rounded up (a live lease never shows "0 s left").
fn seconds_left(ms: &i64) -> i64 {
    ms.max(&0).saturating_add(999) / 1000
}

/// An error from the durable runtime (sessions, journal, toolbox).
#[cfg(feature = "runtime")]
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DurableError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Tool or model arguments were refused before anything was journaled.
    #[error("invalid arguments for `{tool}`: {source}")]
    InvalidArguments {
        /// The tool.
        tool: String,
        /// What is wrong, with its JSON path.
        #[source]
        source: ArgumentError,
    },
    /// Arguments are valid JSON but do not match the tool's argument type.
    #[error("arguments for `{tool}` do not match its schema at `{path}`: {message}")]
    ArgumentsMismatch {
        /// The tool.
        tool: String,
        /// JSON path of the offending field (`$` for the root).
        path: String,
        /// What serde reported.
        message: String,
    },
    /// The model asked for a tool that is not registered.
    #[error("unknown tool `{name}`; registered tools: {available}")]
    UnknownTool {
        /// The name the model used.
        name: String,
        /// The registered names, comma-separated.
        available: String,
    },
    /// An `unsafe_on_replay` call is in doubt, so the refused call did not run: either it
    /// is that call (it cannot be re-run blindly), or it is another non-pure call of the
    /// same session (the barrier is session-wide: nothing with a side effect runs beside
    /// an unresolved unsafe call, in any step).
    ///
    /// Never retried automatically: an operator must resolve the in-doubt call (API or
    /// CLI), or its verify hook must settle it when its step is re-run.
    #[error(
        "replay unsafe: `{refused_tool}` was not run: call `{call}` of `{tool}` ({class}) was issued but its outcome is unknown; {reason}. Resolve it: `durable resolve {call} --happened --result <json>` or `--did-not-happen`"
    )]
    ReplayUnsafe {
        /// The in-doubt call.
        call: CallId,
        /// The in-doubt call's tool.
        tool: String,
        /// The in-doubt call's class.
        class: ReplayClass,
        /// The tool whose call was refused: `tool` itself when the in-doubt call was
        /// asked for again, another tool when the session-wide barrier refused it.
        refused_tool: String,
        /// Why the runtime refused.
        reason: String,
    },
    /// The session was cancelled ([`Operator::cancel`](crate::Operator::cancel), `durable
    /// cancel`, or a cancelled parent): nothing new runs in it. An effect that was in
    /// flight when the cancellation came finished and was recorded; calls in doubt stay
    /// for an operator. The session's status is `cancelled`: return from the handler.
    #[error(
        "session `{session}` was cancelled by {by}: {reason}; nothing new runs in it (recorded effects stay recorded, calls in doubt stay for an operator)"
    )]
    Cancelled {
        /// The session.
        session: SessionId,
        /// Who cancelled it.
        by: String,
        /// Why.
        reason: String,
    },
    /// A child session could not be started: its id (derived from the start's call
    /// identity) is held by a session that is not this parent's child. Recorded as the
    /// start's failure; nothing was created.
    #[error("no child session was started by `{parent}`: {reason}")]
    ChildNotStarted {
        /// The parent session.
        parent: SessionId,
        /// Why.
        reason: String,
    },
    /// The session named is not a child of this one (or does not exist): only a
    /// parent's own children can be collected or awaited.
    #[error(
        "session `{child}` is not a child of `{parent}`: collect or await only the ids `spawn_child` returned"
    )]
    NotAChild {
        /// The parent session.
        parent: SessionId,
        /// The session named.
        child: SessionId,
    },
    /// The call awaits a person's decision (its journal row is `requested`): nothing ran.
    /// Park the session with [`Session::await_approval`](crate::Session::await_approval);
    /// a person decides with `durable approve` / `durable deny`, the console, or
    /// [`Operator::approve`](crate::Operator::approve) / [`Operator::deny`](crate::Operator::deny).
    /// See [`approval`](crate::approval).
    #[error(
        "call `{call}` of `{tool}` was not run: it awaits approval (status `{status}`); nothing ran. \
         Park the session (`Session::await_approval`) until a person decides (`durable approve` / `durable deny`)"
    )]
    AwaitingApproval {
        /// The call.
        call: CallId,
        /// Its tool.
        tool: String,
        /// `requested` (awaiting a decision) or `approved`.
        status: String,
    },
    /// A call a person approved cannot run as approved: its tool's argument schema changed
    /// since the request, its edited arguments no longer decode into the tool's type, or
    /// a secret argument's value is not held after a restart. Nothing ran; the row stays
    /// approved, and the session's step cannot end until it is decided again: revoke the
    /// approval ([`Operator::revoke`](crate::Operator::revoke), `durable deny --revoke`), and
    /// the model reads the reason.
    #[error(
        "call `{call}` of `{tool}` was approved but cannot run: {reason}; nothing ran. \
         Revoke the approval (`durable deny {call} --revoke --reason …`) so the session can go on"
    )]
    ApprovedCallRefused {
        /// The call.
        call: CallId,
        /// Its tool.
        tool: String,
        /// Why it cannot run.
        reason: String,
    },
    /// Arguments a person edited before approving a call do not fit the tool (see
    /// [`check_edited_args`](crate::approval::check_edited_args)): nothing was decided.
    #[error(
        "edited arguments of call `{call}` (`{tool}`) refused at {path}: {detail}; nothing was decided"
    )]
    InvalidEdit {
        /// The call.
        call: CallId,
        /// Its tool.
        tool: String,
        /// JSON path of the problem (`$` for the whole object).
        path: String,
        /// What is wrong.
        detail: String,
    },
    /// A re-run step, after asking the model anew, asked for a non-pure call that matches
    /// no record while a recorded non-pure call of that step has not been replayed: the
    /// re-run diverged from the first attempt (its recorded reply no longer decoded after
    /// an argument shape changed, and the re-asked model chose differently), and running
    /// the new call could repeat the recorded effect. Nothing ran. Also returned by a
    /// checkpoint that would end a step whose recorded call was not replayed.
    ///
    /// Never retried automatically. Ways out: make the recorded call replay again (a
    /// `#[serde(alias = "...")]` for a renamed field lets its record decode and match), or
    /// an operator's explicit decision: fork the session from its last checkpoint letting
    /// the fork run the recorded call again (`durable fork … --rerun <recorded>`, audited;
    /// a fork without it inherits the record and diverges the same way, see
    /// [`store::ForkSession`](crate::store::ForkSession)).
    #[error(
        "replay diverged in step {step} of session `{session}`: the re-run asks for `{refused_tool}`, which matches no recorded call, \
         while recorded call `{recorded}` of `{recorded_tool}` has not been replayed; nothing ran. \
         Make the recorded call replay (e.g. a `#[serde(alias)]` for a renamed argument), or let an operator decide that its effect may happen again: \
         `durable fork {session} --from-version {step} --rerun {recorded}` (audited; see `durable fork --dry-run`)"
    )]
    ReplayDiverged {
        /// The session.
        session: SessionId,
        /// The step being re-run.
        step: i64,
        /// The recorded call the re-run has not matched.
        recorded: CallId,
        /// Its tool.
        recorded_tool: String,
        /// What was refused: the tool asked for, or `checkpoint`.
        refused_tool: String,
    },
    /// A fork asked for a call with a side effect whose tool and arguments are those of an
    /// effect its parent ran after the fork point (carried into the fork, see
    /// [`store::ForkSession`](crate::store::ForkSession)): a fork never repeats an effect
    /// of its parent. Nothing ran. Never retried automatically. If the effect must happen
    /// again, an operator forks the parent again letting it run
    /// (`durable fork <parent> --from-version N --rerun <parent call>`, audited); an
    /// in-doubt carried call is resolved in the fork instead (`durable resolve`).
    #[error(
        "`{refused_tool}` was not run: the session this one was forked from already ran it with these arguments \
         after the fork point (carried as call `{call}`, status `{status}`), and a fork never repeats its parent's effects; nothing ran. \
         To run it again deliberately, fork the parent again with `durable fork <parent> --from-version N --rerun <parent call>` \
         (`durable fork --dry-run` lists the parent's calls)"
    )]
    InheritedEffect {
        /// The carried call in the fork's journal.
        call: CallId,
        /// Its status.
        status: String,
        /// The tool whose call was refused.
        refused_tool: String,
    },
    /// The tool's argument schema changed since the call was recorded.
    #[error(
        "tool `{tool}` changed its argument schema since call `{call}` was recorded ({recorded} → {current}); retarget the session (`durable retarget`) or resolve the call (`durable resolve`)"
    )]
    SchemaChanged {
        /// The tool.
        tool: String,
        /// The recorded call.
        call: CallId,
        /// Recorded fingerprint.
        recorded: String,
        /// Current fingerprint.
        current: String,
    },
    /// The session is on another app version.
    #[error(
        "session `{session}` was started on app version `{recorded}` but this worker runs `{running}`; move it explicitly (`durable retarget`)"
    )]
    AppVersionMismatch {
        /// The session.
        session: SessionId,
        /// The session's version.
        recorded: String,
        /// This worker's version.
        running: String,
    },
    /// A recorded value no longer deserializes into today's type.
    #[error("recorded {what} of session `{session}` does not deserialize: {detail}")]
    Decode {
        /// The session.
        session: SessionId,
        /// What was being read.
        what: String,
        /// The serde error.
        detail: String,
    },
    /// A value could not be serialized for the journal.
    #[error("cannot serialize {what}: {detail}")]
    Encode {
        /// What was being written.
        what: String,
        /// The serde error.
        detail: String,
    },
    /// A value could not enter the journal: it holds something JSON cannot keep exactly (a non-finite float, …).
    #[error("cannot journal {what}: {source}")]
    InvalidValue {
        /// What was being written, e.g. `plan` or ``result of `send_email` ``.
        what: String,
        /// What is wrong, with the JSON path of the value inside it.
        #[source]
        source: ArgumentError,
    },
    /// A model reply, a tool's result or a transcript message is larger than its cap
    /// ([`SizeLimits`](crate::sizes::SizeLimits)): checked before anything is written.
    /// `what` says which one and what became of it (a result too large is recorded as the
    /// call's failure and never run again; a reply or a message wrote nothing).
    #[error(
        "{what} is {size} bytes of JSON, above the {limit}-byte limit; {consequence}. To \
         allow more, raise `SizeLimits::{setting}` (`Durable::builder(store).size_limits(\
         SizeLimits::default().with_{setting}(…))`)",
        consequence = what.consequence(),
        setting = what.setting()
    )]
    TooLarge {
        /// What was too big.
        what: crate::sizes::Oversized,
        /// Its size, in bytes of compact JSON text.
        size: usize,
        /// The limit it is above.
        limit: usize,
    },
    /// A checkpoint write was interrupted and may or may not have committed: this session
    /// handle cannot tell which step it is in any more.
    #[error(
        "checkpoint {version} of session `{session}` was interrupted and may have been written; resume the session to continue"
    )]
    CheckpointInDoubt {
        /// The session.
        session: SessionId,
        /// The version being written.
        version: i64,
    },
    /// A streamed model reply was asked for after it was handed out, or after its stream
    /// failed ([`ModelStream::into_reply`](crate::journal::ModelStream::into_reply)).
    #[error(
        "the streamed model reply of session `{session}` is over: its reply was already handed out, \
         or its stream failed (nothing was journaled then; the re-run turn asks the model again)"
    )]
    StreamOver {
        /// The session.
        session: SessionId,
    },
    /// The call's turn under a fleet-wide rate limit is further away than this worker
    /// holds a session waiting ([`DurableBuilder::limiter_hold`](crate::DurableBuilder::limiter_hold)).
    /// Nothing ran and nothing was journaled; the call keeps its place in the limit's
    /// queue. Release the session until `start_at`
    /// ([`Session::release_until`](crate::Session::release_until)): a pool takes it then,
    /// and the same call, asked again by the replayed turn, takes its place at once.
    #[error(
        "the call of session `{session}` waits for its turn under rate limit `{limit}` until {start_at} (ms since the epoch, the store's clock), {ahead} waiter(s) ahead; nothing ran. Release the session until then (`Session::release_until`) and return from the handler: its place is kept"
    )]
    RateLimited {
        /// The session.
        session: SessionId,
        /// The limit's name.
        limit: String,
        /// When the call's turn comes (ms, the store's clock).
        start_at: i64,
        /// Waiters ahead of it.
        ahead: i64,
    },
    /// A ceiling of the session's budget is reached: the model or tool call that asked
    /// was refused before it ran, and nothing ran (see
    /// [`BudgetExceeded`](crate::snapshot::BudgetExceeded): which limit, what was spent,
    /// what was asked).
    #[error(transparent)]
    BudgetExceeded(crate::snapshot::BudgetExceeded),
    /// A plan operation was refused (the message is written for the model).
    #[error(transparent)]
    Plan(#[from] crate::snapshot::PlanError),
    /// A store could not be opened from its URL (`durable::connect`).
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// A second tool call started inside [`Session::checkpoint_after`]: its checkpoint
    /// commits exactly one call's result. Nothing was journaled or run for this call.
    ///
    /// [`Session::checkpoint_after`]: crate::Session::checkpoint_after
    #[error(
        "`{tool}` was called inside `checkpoint_after` of session `{session}` after its one tool call; \
         make further calls after it returns (or use `checkpoint()` for a turn of several calls)"
    )]
    OneCallPerCheckpoint {
        /// The session.
        session: SessionId,
        /// The tool of the refused call.
        tool: String,
    },
}

/// Why `durable::connect` could not open a store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The URL names a backend whose Cargo feature is off.
    #[error(
        "`{scheme}:` URLs need the `{feature}` feature of `durable`; enable it: durable = {{ features = [\"{feature}\"] }}"
    )]
    FeatureDisabled {
        /// The URL scheme.
        scheme: String,
        /// The feature that provides it.
        feature: &'static str,
    },
    /// The URL's scheme is not one `durable` knows.
    #[error(
        "unsupported database URL `{url}`: expected `sqlite:<path>`, `sqlite::memory:`, `postgres://…`, `postgresql://…`, or a file path"
    )]
    UnknownScheme {
        /// The URL (credentials removed).
        url: String,
    },
    /// The store refused to open (unreachable server, newer schema, durability settings…).
    #[error(transparent)]
    Store(#[from] StoreError),
}

#[cfg(feature = "runtime")]
impl From<crate::snapshot::BudgetExceeded> for DurableError {
    fn from(e: crate::snapshot::BudgetExceeded) -> Self {
        DurableError::BudgetExceeded(e)
    }
}

#[cfg(feature = "runtime")]
impl DurableError {
    /// Whether a retry loop may retry this error: the errors of [kind](Self::kind)
    /// [`ErrorKind::Transient`] (a database error) or [`ErrorKind::Overloaded`] (which
    /// says how long to wait, [`retry_after`](Self::retry_after)). `ReplayUnsafe`, lease
    /// and integrity errors are never retryable: retrying them is the duplicate-email bug.
    pub fn is_retryable(&self) -> bool {
        matches!(self.kind(), ErrorKind::Transient | ErrorKind::Overloaded)
    }

    /// If the store was overloaded ([`StoreError::Overloaded`]): how long to wait before
    /// trying again. Nothing was done.
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            DurableError::Store(e) => e.retry_after(),
            _ => None,
        }
    }

    /// Whether the call was journaled as awaiting a person's approval
    /// ([`DurableError::AwaitingApproval`]): nothing ran, and the harness parks the
    /// session with [`Session::await_approval`](crate::Session::await_approval).
    pub fn is_awaiting_approval(&self) -> bool {
        matches!(self, DurableError::AwaitingApproval { .. })
    }
}

/// Why an id given to a store was refused (see [`validate_id`](crate::validate::validate_id)).
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
    /// The id is longer than [`MAX_ID_BYTES`](crate::ids::MAX_ID_BYTES).
    #[error("it is {len} bytes long; at most {max} are allowed", max = crate::ids::MAX_ID_BYTES)]
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
