//! The journal: how one call is recorded, replayed, re-executed or refused.
//!
//! [`Journal::tool`] is the explicit API under `#[durable_tool]`; [`Journal::model`]
//! journals a model response. The decision table (ARCHITECTURE.md §3) is a pure function
//! in `protocol`: what the journal holds for the call's identity and what the call site
//! brings decide the arm. `call` drives it: it finds the row, gathers the facts, applies
//! the arm (returns a recorded outcome, runs the guards it names, writes, runs the body or
//! the verify hook) and feeds what came back into the next decision. The guards that need
//! the store (the session-wide barrier, the divergence check, the carried-effect check)
//! are in `barrier`.
//!
//! Model responses are journaled by position in `model`; the `checkpoint_after` scope is
//! in `commit`; ordinals and positions are handed out in `numbers`.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

// The lease deadline is measured on tokio's clock (the real monotonic clock, unless a
// runtime pauses time, as a simulation does), the clock every sleep of the runtime uses.
use tokio::time::Instant;

use serde_json::Value;

use crate::config::Config;
use crate::error::{DurableError, StoreError};
use crate::ids::{CallId, SessionId};
use crate::replay::ReplayClass;
use crate::snapshot::{Budget, Spend};
use crate::store::{
    CallIdentity, CallOutcome, CallRecord, CallStatus, CheckpointStore, FinishCall, IssueOutcome,
    Lease, NewCall,
};
use crate::tool_spec::ToolSpec;

mod barrier;
mod budget;
mod call;
mod cancel;
mod checkpoint_scope;
mod limit;
mod model;
mod ordinals;
mod protocol;
mod stream;

pub use crate::event::{CallEvent, Outcome};
use budget::Charge;
pub(crate) use budget::charge_row;
pub use call::ToolCall;
pub(crate) use checkpoint_scope::{CommitSlot, Executed, ScopeOutcome};
use ordinals::Numbers;
/// Not public API; may change in any release: why the decision table refuses a call,
/// named by the conformance suite (`durable-conformance`), whose refusal case matches on
/// it exhaustively so that a new refusal cannot go without a case.
#[doc(hidden)]
pub use protocol::Refusal;
pub use stream::{ModelStream, ReplyEvent, StreamedReply};

/// The tool name under which model responses are journaled.
pub const MODEL_SLOT: &str = "@model";

/// The error of a journaled call.
#[derive(Debug, thiserror::Error)]
pub enum CallError<E> {
    /// The tool ran now and failed (its failure was recorded).
    #[error("{0}")]
    Tool(E),
    /// A failure recorded by an earlier run was replayed; the tool did not run.
    #[error("{0}")]
    Recorded(RecordedFailure),
    /// The runtime refused or failed (nothing ran, or the store failed).
    #[error(transparent)]
    Durable(#[from] DurableError),
}

impl<E> CallError<E> {
    /// The runtime error, if this is one.
    pub fn as_durable(&self) -> Option<&DurableError> {
        match self {
            CallError::Durable(e) => Some(e),
            _ => None,
        }
    }
}

/// A tool failure as recorded in the journal (its message).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct RecordedFailure {
    /// The tool error's `Display` text.
    pub message: String,
}

#[derive(Default)]
struct StepCache {
    /// The step these rows belong to.
    step: i64,
    /// Whether `rows` was loaded from the store for `step`.
    loaded: bool,
    /// Rows of this step, by identity.
    rows: HashMap<CallIdentity, CallRecord>,
    /// Rows with a side effect that an earlier attempt of this step recorded and this
    /// attempt has not replayed yet (see `barrier`).
    unreplayed: HashSet<CallId>,
    /// Where each row loaded from the store stands in issue order.
    order: HashMap<CallId, usize>,
    /// Whether this attempt has left the first attempt's path: it took a model reply
    /// that was asked for after a recorded call with a side effect it has not replayed
    /// (a reply asked anew now, or by an earlier re-run).
    diverged: bool,
}

pub(crate) struct JournalInner {
    pub(crate) store: Arc<dyn CheckpointStore>,
    pub(crate) config: Arc<Config>,
    pub(crate) session: SessionId,
    /// What the journal knows between calls, behind one lock (see [`JournalState`]).
    state: Arc<Mutex<JournalState>>,
    cache: tokio::sync::Mutex<StepCache>,
    durable_checked: tokio::sync::OnceCell<Option<String>>,
    /// The rows of [`CARRIED_STEP`](crate::store::CARRIED_STEP): a fork's parent's effects
    /// it never runs again, read once, on the first fresh call with a side effect after
    /// a resume (a journal that started its session knows there are none).
    carried: tokio::sync::OnceCell<Vec<CallRecord>>,
    /// The clear values of the secret arguments masked in this session's model replies
    /// (memory only; see [`secret`](crate::secret)).
    pub(crate) vault: crate::secret::Vault,
    /// Woken whenever a call of a batch decides (see `barrier`).
    siblings: tokio::sync::Notify,
}

/// What a session's journal knows between calls, in one place behind one lock: the lease,
/// the step and its ordinals, the barrier's doubts, the spend charged, the checkpoint
/// scope. The lock is never held across an `.await` (each use is one statement, or a
/// block that awaits nothing); the rows of the current step, which are read from the
/// store under their lock, are in the journal's step cache instead.
pub(crate) struct JournalState {
    pub(crate) lease: Lease,
    /// Set once the store said the lease was taken over, or it was not renewed in time.
    pub(crate) lease_lost: bool,
    /// When this worker must consider its lease gone if it could not renew it (a margin
    /// before the store's expiry), so it stops starting effects an operator may already
    /// be resolving.
    lease_deadline: Instant,
    /// The checkpoint version the running turn started from.
    step: i64,
    /// Ordinals and model positions of the current step.
    numbers: Numbers,
    /// Set while a checkpoint's outcome is unknown (its future was dropped mid-write).
    checkpoint_in_doubt: Option<i64>,
    /// The fencing token under which the store was told this worker runs the session
    /// (its first model or tool call under that lease), 0 before: see
    /// [`mark_running`](Journal::mark_running).
    running_marked: i64,
    /// Rows this journal issued itself and is running (everything else still `issued`
    /// is in doubt).
    issued_here: HashSet<CallId>,
    /// The session's `unsafe_on_replay` calls known to be in doubt: the session-wide
    /// barrier (see `barrier`).
    doubts: Vec<CallRecord>,
    /// The budget as of the last checkpoint (or the last sync): what
    /// [`pending`](Self::pending) adds to.
    budget: Budget,
    /// When the session started (ms since the epoch, the store's clock): what the
    /// wall-time ceiling counts from.
    started_at: i64,
    /// What the rows used since the last sync cost, charged once per row.
    pending: Vec<Charge>,
    /// The rows charged.
    charged: HashSet<CallId>,
    /// The checkpoint scope of `Session::checkpoint_after`, if one is open.
    commit: CommitSlot,
    /// The last scope number handed out.
    scopes: u64,
    /// A cancellation asked of the session, once this worker learned of it (on resume,
    /// or at a lease renewal): no new call starts (see `cancel`).
    pub(crate) cancelled: Option<crate::store::CancelRequest>,
    /// The calls of each running [`join_calls`](Journal::join_calls) batch that have not
    /// decided yet (see `barrier`), by batch.
    batches: HashMap<u64, HashSet<usize>>,
    /// The last batch number handed out.
    last_batch: u64,
    /// How many times a call of a batch decided (what the barrier compares before it
    /// refuses, see `barrier`).
    batch_decisions: u64,
}

impl AsMut<Numbers> for JournalState {
    fn as_mut(&mut self) -> &mut Numbers {
        &mut self.numbers
    }
}

/// The journaling handle of a leased session. Cheap to clone; shared by parallel calls.
#[derive(Clone)]
pub struct Journal {
    pub(crate) inner: Arc<JournalInner>,
    /// The `checkpoint_after` scope this handle was given to, if any.
    pub(crate) scope: Option<u64>,
    /// The model's reasoning, journaled with the approval requests of calls made on
    /// this handle ([`with_reasoning`](Self::with_reasoning)).
    pub(crate) reasoning: Option<Arc<str>>,
    /// The model's id for the tool call made on this handle, for traces
    /// ([`with_tool_call_id`](Self::with_tool_call_id)).
    pub(crate) tool_call_id: Option<Arc<str>>,
    /// The model asked by the model calls made on this handle, for traces
    /// ([`with_model_name`](Self::with_model_name)).
    pub(crate) model_name: Option<Arc<str>>,
    /// The rate limit the model calls made on this handle wait under
    /// ([`with_rate_limit`](Self::with_rate_limit)).
    pub(crate) rate_limit: Option<Arc<str>>,
    /// The rate limit the tool calls made on this handle wait under, unless their spec
    /// names one (set by [`Toolbox::dispatch`](crate::Toolbox::dispatch) from
    /// [`Toolbox::rate_limit`](crate::Toolbox::rate_limit)).
    pub(crate) tool_limit: Option<Arc<str>>,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("session", &self.inner.session)
            .field("step", &self.step())
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Journal {
    /// The journal's state, locked: hold it for one statement or a block without an
    /// `.await`, and never call another method that takes it meanwhile.
    pub(crate) fn state(&self) -> MutexGuard<'_, JournalState> {
        lock(&self.inner.state)
    }

    /// Marks the lease lost: later calls fail fast with `LeaseLost`.
    pub(crate) fn lose_lease(&self) {
        self.state().lease_lost = true;
    }
}

impl Journal {
    pub(crate) fn new(
        store: Arc<dyn CheckpointStore>,
        config: Arc<Config>,
        (lease, requested): (Lease, Instant),
        step: i64,
        in_doubt: Vec<CallRecord>,
        started: bool,
        (budget, started_at): (Budget, i64),
    ) -> Self {
        // Counted from when the lease was requested, not from now: the store granted it
        // at some point after that, and a process that stalled since (between the claim
        // and this resume, say) may hold a lease that is already gone.
        let deadline = requested + lease_margin(config.lease_ttl);
        Journal {
            inner: Arc::new(JournalInner {
                store,
                config,
                session: lease.session.clone(),
                state: Arc::new(Mutex::new(JournalState {
                    lease,
                    lease_lost: false,
                    lease_deadline: deadline,
                    step,
                    numbers: Numbers::new(step),
                    checkpoint_in_doubt: None,
                    running_marked: 0,
                    issued_here: HashSet::new(),
                    doubts: barrier::initial_doubts(in_doubt),
                    budget,
                    started_at,
                    pending: Vec::new(),
                    charged: HashSet::new(),
                    commit: CommitSlot::Idle,
                    scopes: 0,
                    cancelled: None,
                    batches: HashMap::new(),
                    last_batch: 0,
                    batch_decisions: 0,
                })),
                cache: tokio::sync::Mutex::new(StepCache {
                    step,
                    ..StepCache::default()
                }),
                durable_checked: tokio::sync::OnceCell::new(),
                // A session this journal started holds no carried row: nothing to read.
                carried: tokio::sync::OnceCell::new_with(started.then(Vec::new)),
                vault: crate::secret::Vault::default(),
                siblings: tokio::sync::Notify::new(),
            }),
            scope: None,
            reasoning: None,
            tool_call_id: None,
            model_name: None,
            rate_limit: None,
            tool_limit: None,
        }
    }

    /// A handle whose calls journal `reasoning` (the model's text explaining them) with
    /// any approval request they make, for the person who decides (see
    /// [`approval`](crate::approval)); cut at
    /// [`MAX_REASONING_BYTES`](crate::approval::MAX_REASONING_BYTES). Model text is
    /// attacker-influenced: the CLI and the console show it escaped.
    ///
    /// ```no_run
    /// # async fn f(session: &durable_core::Session<durable_core::Message>, tools: &durable_core::Toolbox,
    /// #            calls: &[durable_core::ModelToolCall], reply_text: &str) {
    /// let results = tools.dispatch_all(&session.journal().with_reasoning(reply_text), calls).await;
    /// # }
    /// ```
    pub fn with_reasoning(&self, reasoning: impl Into<String>) -> Journal {
        Journal {
            reasoning: Some(Arc::from(reasoning.into())),
            ..self.clone()
        }
    }

    /// A handle whose tool calls carry `id`, the model's id for the call (OpenAI's
    /// `call_…`, Anthropic's `toolu_…`), as the
    /// [`gen_ai.tool.call.id`](crate::telemetry::GEN_AI_TOOL_CALL_ID) of their
    /// `execute_tool` span. Only traces see it; the journal identifies a call by its
    /// arguments and position. [`Toolbox::dispatch`](crate::Toolbox::dispatch) sets it
    /// from [`ModelToolCall::id`](crate::ModelToolCall); for one call,
    /// [`ToolCall::call_id`] does the same.
    pub fn with_tool_call_id(&self, id: impl Into<Arc<str>>) -> Journal {
        Journal {
            tool_call_id: Some(id.into()),
            ..self.clone()
        }
    }

    /// A handle whose model calls ([`model`](Self::model),
    /// [`model_with_spend`](Self::model_with_spend)) name `model` in their `chat` span
    /// ([`gen_ai.request.model`](crate::telemetry::GEN_AI_REQUEST_MODEL), and the span's
    /// OpenTelemetry name `chat {model}`). Only traces see it: a model reply is journaled
    /// by its position, whatever model gave it.
    ///
    /// ```no_run
    /// # async fn f(session: &durable_core::Session<durable_core::Message>) -> Result<(), Box<dyn std::error::Error>> {
    /// # async fn ask() -> Result<durable_core::Message, std::io::Error> { unreachable!() }
    /// let reply = session.journal().with_model_name("gpt-4o-mini").model(ask).await?;
    /// # Ok(()) }
    /// ```
    pub fn with_model_name(&self, model: impl Into<Arc<str>>) -> Journal {
        Journal {
            model_name: Some(model.into()),
            ..self.clone()
        }
    }

    /// The session.
    pub fn session_id(&self) -> &SessionId {
        &self.inner.session
    }

    /// The current step: the checkpoint version the running turn started from.
    pub fn step(&self) -> i64 {
        self.state().step
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn CheckpointStore> {
        &self.inner.store
    }

    /// The current fencing token.
    pub fn fence_token(&self) -> i64 {
        self.state().lease.fence
    }

    /// Not public API; may change in any release: the lease this journal writes under,
    /// for the conformance suite's cases that write to the store beside a live session.
    #[doc(hidden)]
    pub fn lease(&self) -> Lease {
        self.state().lease.clone()
    }

    /// Moves to a new step (after a checkpoint): ordinals and positions restart.
    pub(crate) async fn enter_step(&self, step: i64) {
        {
            let mut state = self.state();
            state.step = step;
            state.numbers.reset(step);
        }
        let mut cache = self.inner.cache.lock().await;
        *cache = StepCache {
            step,
            ..StepCache::default()
        };
    }

    /// Whether this journal may start a call: its lease is neither lost nor past the
    /// local renewal deadline, and no checkpoint is in doubt.
    pub(crate) fn check_lease(&self) -> Result<(), DurableError> {
        let (lost, in_doubt, deadline) = {
            let state = self.state();
            (
                state.lease_lost,
                state.checkpoint_in_doubt,
                state.lease_deadline,
            )
        };
        if lost {
            let lease = self.lease();
            return Err(StoreError::LeaseLost {
                session: lease.session,
                token: lease.fence,
            }
            .into());
        }
        if let Some(version) = in_doubt {
            return Err(DurableError::CheckpointInDoubt {
                session: self.inner.session.clone(),
                version,
            });
        }
        if Instant::now() > deadline {
            // Not renewed in time: the store may hand the session to another worker (or
            // an operator may resolve our calls) at any moment, so no new call starts.
            let lease = self.lease();
            tracing::warn!(session = %lease.session, "lease not renewed in time; treating it as lost");
            self.state().lease_lost = true;
            return Err(StoreError::LeaseLost {
                session: lease.session,
                token: lease.fence,
            }
            .into());
        }
        Ok(())
    }

    /// Tells the store, once per lease, that this worker runs the session: before its
    /// first model or tool call under the lease, so that if the worker dies from now on,
    /// the next take-over counts a recovery (a death while the session ran). A worker
    /// that dies holding the lease without having made a call (an idle lease) is not
    /// counted against the session. See
    /// [`CheckpointStore::mark_running`](crate::store::LeaseStore::mark_running).
    pub(crate) async fn mark_running(&self) -> Result<(), DurableError> {
        let lease = self.lease();
        if self.state().running_marked == lease.fence {
            return Ok(());
        }
        self.inner.store.mark_running(lease.fence()).await?;
        self.state().running_marked = lease.fence;
        Ok(())
    }

    /// What a refusal leaves in the store: an in-doubt row only an operator can settle
    /// ([`Refusal::needs_operator`]) is marked as waiting for one, so that pools stop
    /// handing the session out until it is resolved
    /// ([`CheckpointStore::mark_operator_needed`](crate::store::LeaseStore::mark_operator_needed)).
    /// The refusal stands whatever the store answers: a failure is logged, and costs at
    /// most one more claim of the session, refused again.
    pub(crate) async fn after_refusal(&self, why: Refusal, row: Option<&CallRecord>) {
        let Some(row) = row.filter(|row| why.needs_operator() && row.status == CallStatus::Issued)
        else {
            return;
        };
        let lease = self.lease();
        if let Err(error) = self
            .inner
            .store
            .mark_operator_needed(lease.fence(), &row.id)
            .await
        {
            tracing::warn!(
                call = %row.id,
                %error,
                "could not mark the in-doubt call as waiting for an operator"
            );
        }
    }

    /// Records a successful renewal requested at `sent`.
    pub(crate) fn renewed(&self, lease: Lease, sent: Instant) {
        let mut state = self.state();
        state.lease_deadline = sent + lease_margin(self.inner.config.lease_ttl);
        state.lease = lease;
    }

    /// Marks (or clears) a checkpoint whose outcome is unknown.
    pub(crate) fn set_checkpoint_in_doubt(&self, version: Option<i64>) {
        self.state().checkpoint_in_doubt = version;
    }

    /// The version of a checkpoint whose write was interrupted, if any.
    pub(crate) fn checkpoint_in_doubt(&self) -> Option<i64> {
        self.state().checkpoint_in_doubt
    }

    /// Wraps a store error, remembering a lost lease so later calls fail fast.
    pub(crate) fn note_store_error(&self, e: StoreError) -> DurableError {
        if matches!(e, StoreError::LeaseLost { .. }) {
            self.state().lease_lost = true;
        }
        DurableError::Store(e)
    }

    /// Reports a decision: on the current span (the call's) and to the observer.
    fn emit(&self, event: CallEvent) {
        crate::telemetry::record_outcome(event.outcome);
        self.notify(event);
    }

    /// Reports a decision to the observer only (the call's span has closed).
    fn notify(&self, event: CallEvent) {
        if let Some(observer) = &self.inner.config.observer {
            observer(&event);
        }
    }

    /// Starts a journaled tool call.
    ///
    /// The call's ordinal is assigned when `.run(...)` is first polled, under a fair
    /// (FIFO) lock: calls polled in dispatch order (as `join_all` does) get ordinals in
    /// dispatch order, whatever order they complete in.
    ///
    /// # Example
    /// ```no_run
    /// # use durable_core::{Journal, ReplayClass, tool::ToolSpec};
    /// # async fn demo(journal: &Journal) -> Result<(), Box<dyn std::error::Error>> {
    /// let spec = ToolSpec::new("charge_card", "Charge a card.", ReplayClass::IdempotentWithKey,
    ///     serde_json::json!({"type": "object"}));
    /// let args = serde_json::json!({"order_id": "o-17", "cents": 1200});
    /// let charge: String = journal
    ///     .tool(&spec, args)
    ///     .key("charge:o-17")
    ///     .run(|ctx| async move {
    ///         // pass ctx.idempotency_key() to the payment API
    ///         Ok::<_, std::io::Error>(format!("charged with {:?}", ctx.idempotency_key()))
    ///     })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn tool<'j>(&'j self, spec: &'j ToolSpec, args: Value) -> ToolCall<'j> {
        ToolCall {
            journal: self,
            spec,
            args,
            key: None,
            call_id: self.tool_call_id.clone(),
            withheld: Vec::new(),
            approval: None,
            edits: None,
        }
    }

    async fn load_step(&self, cache: &mut StepCache) -> Result<(), DurableError> {
        let step = self.step();
        if cache.step != step {
            *cache = StepCache {
                step,
                ..StepCache::default()
            };
        }
        if cache.loaded {
            return Ok(());
        }
        let rows = self
            .inner
            .store
            .calls(&self.inner.session, Some(step))
            .await
            .map_err(|e| self.note_store_error(e))?;
        cache.unreplayed = rows
            .iter()
            .filter(|r| barrier::must_replay(r))
            .map(|r| r.id.clone())
            .collect();
        cache.order = rows
            .iter()
            .enumerate()
            .map(|(i, r)| (r.id.clone(), i))
            .collect();
        cache.rows = rows.into_iter().map(|r| (r.identity.clone(), r)).collect();
        cache.loaded = true;
        Ok(())
    }

    /// Re-reads a row from the store (an operator may have resolved it since the step was
    /// loaded) and updates the step cache.
    async fn refresh(
        &self,
        cache: &mut StepCache,
        id: &CallId,
    ) -> Result<CallRecord, DurableError> {
        let row = self
            .inner
            .store
            .call(id)
            .await
            .map_err(|e| self.note_store_error(e))?;
        cache.rows.insert(row.identity.clone(), row.clone());
        Ok(row)
    }

    /// Keeps a row as the store now holds it in the step cache.
    async fn remember(&self, row: &CallRecord) {
        let mut cache = self.inner.cache.lock().await;
        if cache.step == row.identity.step {
            cache.rows.insert(row.identity.clone(), row.clone());
        }
    }

    /// Reports a call refused before any row existed for it.
    fn emit_refused(&self, spec: &ToolSpec, idempotency_key: Option<String>) {
        self.emit(CallEvent {
            session: self.inner.session.clone(),
            call: None,
            tool: spec.name.clone(),
            class: spec.class,
            outcome: Outcome::Refused,
            idempotency_key,
            step: self.step(),
        });
    }

    /// Records a call that ran without an *issued* row (pure tools, model replies) with
    /// its outcome and spend: one commit (the store seals the row).
    async fn record(
        &self,
        call: NewCall,
        outcome: CallOutcome,
        spend: Option<Spend>,
    ) -> Result<IssueOutcome, DurableError> {
        let lease = self.lease();
        self.inner
            .store
            .record_call(
                lease.fence(),
                call,
                FinishCall {
                    outcome,
                    spend: spend_json(spend),
                },
            )
            .await
            .map_err(|e| self.note_store_error(e))
    }

    fn event(&self, row: &CallRecord, outcome: Outcome) -> CallEvent {
        CallEvent {
            session: self.inner.session.clone(),
            call: Some(row.id.clone()),
            tool: row.identity.tool.clone(),
            class: row.class,
            outcome,
            idempotency_key: row.idempotency_key.clone(),
            step: row.identity.step,
        }
    }

    #[allow(unused_variables)]
    fn failpoint(&self, boundary: &str, tool: &str) {
        #[cfg(feature = "failpoints")]
        {
            fail::fail_point!(&format!("durable::{boundary}"));
            fail::fail_point!(&format!("durable::{boundary}::{tool}"));
        }
    }

    async fn ensure_durable(&self, spec: &ToolSpec) -> Result<(), DurableError> {
        if spec.class != ReplayClass::UnsafeOnReplay {
            return Ok(());
        }
        let store = &self.inner.store;
        let setting = self
            .inner
            .durable_checked
            .get_or_try_init(|| async { store.durability().await.map(|d| d.unsafe_setting) })
            .await
            .map_err(|e| self.note_store_error(e))?;
        match setting {
            None => Ok(()),
            Some(setting) => {
                let refused = StoreError::NotDurable {
                    backend: store.backend(),
                    setting: setting.clone(),
                }
                .into();
                refused_span(&refused);
                Err(refused)
            }
        }
    }
}

/// Records a refusal on the current span (the call's) where no [`CallEvent`] reports it
/// (a refusal before the journal decided anything, or one the observer is not told of).
/// It takes the refusal to read as `.inspect_err(refused_span)`.
fn refused_span(_refused: &DurableError) {
    crate::telemetry::record_outcome(Outcome::Refused);
}

/// A row's spend as stored (`Spend` always serializes; `null` would only mean a bug).
fn spend_json(spend: Option<Spend>) -> Option<Value> {
    spend.map(|s| serde_json::to_value(s).unwrap_or(Value::Null))
}

/// How long after a (re)acquisition this worker trusts its lease: 90% of the TTL, so it
/// stops starting effects before the store can hand the session to someone else.
fn lease_margin(ttl: Duration) -> Duration {
    ttl.mul_f64(0.9)
}

/// A recorded failure's message: its `message` field, else the recorded JSON.
fn failure_message(error: Option<&Value>) -> String {
    match error {
        Some(Value::Object(map)) => match map.get("message") {
            Some(Value::String(s)) => s.clone(),
            _ => Value::Object(map.clone()).to_string(),
        },
        Some(other) => other.to_string(),
        None => "recorded failure".into(),
    }
}
