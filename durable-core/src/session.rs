//! [`Session`]: a leased agent run with its transcript, plan, budget and journal.

use std::future::Future;
use std::sync::Arc;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tracing::Instrument;

use crate::config::Config;
use crate::encode::encode;
use crate::error::{DurableError, StoreError};
use crate::ids::SessionId;
use crate::journal::{CallError, Executed, Journal, ModelStream, ScopeOutcome, StreamedReply};
use crate::replay::ReplayClass;
use crate::snapshot::{Budget, Plan, Spend};
use crate::store::{
    CallRecord, CheckpointMeta, CheckpointStore, Lease, NewCheckpoint, SessionRecord, SessionStatus,
};
use crate::telemetry;

mod children;
mod signals;

pub use children::{ChildOutcome, ChildWait};
pub use signals::{Signal, SignalWait};

/// What the runtime will do with an in-doubt call when its step is re-run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InDoubtAction {
    /// `pure`: re-executed.
    ReExecute,
    /// `idempotent_with_key`: re-executed with this recorded key.
    ReExecuteWithKey(Option<String>),
    /// `unsafe_on_replay`: the verify hook is asked; without an answer the call is
    /// refused with `ReplayUnsafe` until an operator resolves it.
    VerifyOrOperator,
}

/// One in-doubt call found on resume.
#[derive(Debug, Clone, PartialEq)]
pub struct InDoubtCall {
    /// The journal row.
    pub call: CallRecord,
    /// What will happen to it.
    pub action: InDoubtAction,
}

/// What [`Durable::resume`](crate::Durable::resume) found.
#[derive(Debug, Clone, PartialEq)]
pub struct ResumeReport {
    /// The checkpoint version resumed from.
    pub version: i64,
    /// Calls issued by an earlier worker whose outcome is unknown, oldest first.
    pub in_doubt: Vec<InDoubtCall>,
}

impl ResumeReport {
    pub(crate) fn new(version: i64, mut calls: Vec<CallRecord>) -> Self {
        calls.sort_by_key(|c| c.issued_at);
        let in_doubt = calls
            .into_iter()
            .map(|call| {
                let action = match call.class {
                    ReplayClass::Pure => InDoubtAction::ReExecute,
                    ReplayClass::IdempotentWithKey => {
                        InDoubtAction::ReExecuteWithKey(call.idempotency_key.clone())
                    }
                    ReplayClass::UnsafeOnReplay => InDoubtAction::VerifyOrOperator,
                };
                InDoubtCall { call, action }
            })
            .collect();
        ResumeReport { version, in_doubt }
    }

    /// In-doubt calls of one class.
    pub fn by_class(&self, class: ReplayClass) -> impl Iterator<Item = &InDoubtCall> {
        self.in_doubt.iter().filter(move |c| c.call.class == class)
    }

    /// Whether an operator (or a verify hook) must look at something.
    pub fn needs_attention(&self) -> bool {
        self.by_class(ReplayClass::UnsafeOnReplay).next().is_some()
    }
}

/// A resumed session and what was found in doubt.
#[derive(Debug)]
pub struct Resumed<M> {
    /// The session, leased to this worker.
    pub session: Session<M>,
    /// In-doubt calls by class.
    pub report: ResumeReport,
}

/// A leased agent run: transcript (of `M`, [`Message`](crate::transcript::Message) by
/// default, or any serde type of yours), plan, budget, application state and the
/// [`Journal`] its tool and model calls go through.
///
/// A turn is: model call(s) and tool calls through [`journal`](Self::journal), messages
/// [`push`](Self::push)ed, then [`checkpoint`](Self::checkpoint). The checkpoint appends
/// the turn's messages to the log and snapshots plan and budget in one transaction,
/// compare-and-set on the version.
pub struct Session<M = crate::transcript::Message> {
    store: Arc<dyn CheckpointStore>,
    record: SessionRecord,
    journal: Journal,
    messages: Vec<M>,
    /// The transcript position of `messages[0]` (1 unless a windowed resume left the
    /// earlier messages unloaded).
    first_position: i64,
    committed: usize,
    plan: Plan,
    state: Value,
    version: i64,
    renewer: Option<tokio::task::JoinHandle<()>>,
    /// See [`Session::woke_from`].
    woke_from: Option<i64>,
}

impl<M> std::fmt::Debug for Session<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("id", &self.record.id)
            .field("version", &self.version)
            .field("messages", &self.messages.len())
            .finish_non_exhaustive()
    }
}

impl<M> Drop for Session<M> {
    fn drop(&mut self) {
        if let Some(task) = self.renewer.take() {
            task.abort();
        }
    }
}

impl<M> Session<M>
where
    M: Serialize + DeserializeOwned + Clone,
{
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn assemble(
        store: Arc<dyn CheckpointStore>,
        config: Arc<Config>,
        record: SessionRecord,
        (lease, requested): (Lease, tokio::time::Instant),
        version: i64,
        (first_position, messages): (i64, Vec<M>),
        plan: Plan,
        budget: Budget,
        state: Value,
        (in_doubt, started): (Vec<CallRecord>, bool),
    ) -> Self {
        let journal = Journal::new(
            Arc::clone(&store),
            Arc::clone(&config),
            (lease, requested),
            version,
            in_doubt,
            started,
            (budget, record.created_at),
        );
        let renewer = config
            .renew_leases
            .then(|| tokio::runtime::Handle::try_current().ok())
            .flatten()
            .map(|handle| handle.spawn(renew_loop(journal.clone())));
        if let Some(request) = record.cancel_requested.clone() {
            journal.note_cancel(request);
        }
        let committed = messages.len();
        // The latest checkpoint put the session to sleep (version 0's wake-up time is a
        // delayed start, not a sleep): this resume ends that sleep.
        let woke_from = record.wake_at.filter(|_| record.latest_version > 0);
        Session {
            store,
            woke_from,
            record,
            journal,
            messages,
            first_position,
            committed,
            plan,
            state,
            version,
            renewer,
        }
    }

    /// The session id.
    pub fn id(&self) -> &SessionId {
        &self.record.id
    }

    /// The session row as it was when this handle was created.
    pub fn record(&self) -> &SessionRecord {
        &self.record
    }

    /// The latest checkpoint version this handle wrote or loaded.
    pub fn version(&self) -> i64 {
        self.version
    }

    /// The journal for tool and model calls of the current turn.
    pub fn journal(&self) -> &Journal {
        &self.journal
    }

    /// The transcript: checkpointed messages followed by this turn's. After a resume
    /// with a [window](crate::DurableBuilder::resume_window), the checkpointed part
    /// starts at [`first_position`](Self::first_position); the messages before it are in
    /// the store ([`load_earlier`](Self::load_earlier)).
    pub fn messages(&self) -> &[M] {
        &self.messages
    }

    /// The transcript position (1, 2, …) of the first message in
    /// [`messages`](Self::messages): 1 unless a windowed resume left earlier messages
    /// unloaded.
    pub fn first_position(&self) -> i64 {
        self.first_position
    }

    /// Reads up to `count` of the messages before [`first_position`](Self::first_position)
    /// from the store (checked: each one's seal, chained) and puts them at the front of
    /// [`messages`](Self::messages). Returns how many were loaded: fewer than `count` once
    /// the transcript's start is reached, 0 after it.
    ///
    /// ```
    /// # async fn run(mut session: durable_core::Session) -> Result<(), durable_core::DurableError> {
    /// // The whole transcript, however the session was resumed.
    /// while session.load_earlier(500).await? > 0 {}
    /// assert_eq!(session.first_position(), 1);
    /// # Ok(()) }
    /// ```
    pub async fn load_earlier(&mut self, count: usize) -> Result<usize, DurableError> {
        let to = self.first_position - 1;
        let from = (to - i64::try_from(count).unwrap_or(i64::MAX)).max(0) + 1;
        if to < from {
            return Ok(0);
        }
        let stored = self.store.messages(&self.record.id, from, to).await?;
        let earlier = stored
            .iter()
            .enumerate()
            .map(|(i, message)| {
                message.decode::<M>().map_err(|e| DurableError::Decode {
                    session: self.record.id.clone(),
                    what: format!("message {}", from + i as i64),
                    detail: e.to_string(),
                })
            })
            .collect::<Result<Vec<M>, _>>()?;
        let loaded = earlier.len();
        self.messages.splice(0..0, earlier);
        self.committed += loaded;
        self.first_position = from;
        Ok(loaded)
    }

    /// Messages pushed since the last checkpoint.
    pub fn pending_messages(&self) -> &[M] {
        &self.messages[self.committed..]
    }

    /// Appends a message to the transcript (logged at the next checkpoint).
    pub fn push(&mut self, message: M) {
        self.messages.push(message);
    }

    /// The plan.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The plan, for updates.
    pub fn plan_mut(&mut self) -> &mut Plan {
        &mut self.plan
    }

    /// The budget including what this turn's calls cost (each journal row charged
    /// once): spend, call counts and ceilings.
    pub fn budget(&self) -> Budget {
        self.journal.budget()
    }

    /// Replaces the budget's limits or spend (e.g. raising a limit): start from
    /// [`budget`](Self::budget), which holds this turn's spend, and change what you
    /// need. Snapshotted with the next checkpoint; the next call is checked against it.
    pub fn set_budget(&mut self, budget: Budget) {
        self.journal.set_budget(budget);
    }

    /// Application state saved with every checkpoint.
    pub fn state(&self) -> &Value {
        &self.state
    }

    /// Sets the application state.
    pub fn set_state(&mut self, state: Value) {
        self.state = state;
    }

    fn snapshot(&mut self) -> Result<NewCheckpoint, DurableError> {
        let budget = self.journal.sync_budget();
        let first = self.first_position.saturating_add(self.committed as i64);
        Ok(NewCheckpoint {
            messages: self.messages[self.committed..]
                .iter()
                .enumerate()
                .map(|(i, m)| {
                    self.check_message(m, first.saturating_add(i as i64))?;
                    encode(m, format_args!("message {i} of the turn (counting from 0)"))
                })
                .collect::<Result<_, _>>()?,
            plan: encode(&self.plan, "plan")?,
            budget: encode(&budget, "budget")?,
            state: self.state.clone(),
            wake_at: None,
        })
    }

    /// Writes the next checkpoint: this turn's messages, plan, budget and state, in one
    /// transaction, compare-and-set on the version this handle holds. The next calls
    /// belong to a new step.
    pub async fn checkpoint(&mut self) -> Result<CheckpointMeta, DurableError> {
        self.checkpoint_waking_at(None).await
    }

    /// Like [`checkpoint`](Self::checkpoint), but ends the step even when this attempt
    /// did not replay every recorded call with a side effect of it: their rows stay in
    /// the journal (an in-doubt `unsafe_on_replay` one keeps holding the session-wide
    /// barrier, in every later step, until it is settled), and the session moves on
    /// without their results.
    ///
    /// For harnesses whose steps are independent requests rather than turns of one
    /// conversation, such as an MCP server's own session (`durable-mcp`): the client of a
    /// request a crash interrupted is gone, and no re-run will ever ask for that call
    /// again, so there is no conversation its result could drop out of. Anywhere else
    /// it drops a recorded effect from the conversation unseen, which is what
    /// [`DurableError::ReplayDiverged`] protects against: use
    /// [`checkpoint`](Self::checkpoint). Calls awaiting approval still refuse it
    /// ([`DurableError::AwaitingApproval`]).
    pub async fn dangerous_checkpoint_unreplayed(
        &mut self,
    ) -> Result<CheckpointMeta, DurableError> {
        let span = self.checkpoint_span();
        let written = self
            .write_checkpoint(None, false, Ending::Continues)
            .instrument(span.clone())
            .await;
        if let Err(e) = &written {
            span.record(telemetry::ERROR_TYPE, telemetry::durable_error_type(e));
        }
        written
    }

    async fn checkpoint_waking_at(
        &mut self,
        wake_at: Option<i64>,
    ) -> Result<CheckpointMeta, DurableError> {
        let span = self.checkpoint_span();
        let written = self
            .write_checkpoint(wake_at, true, Ending::Continues)
            .instrument(span.clone())
            .await;
        if let Err(e) = &written {
            span.record(telemetry::ERROR_TYPE, telemetry::durable_error_type(e));
        }
        written
    }

    /// The span of writing the next checkpoint (see [`telemetry`]).
    fn checkpoint_span(&self) -> tracing::Span {
        tracing::info_span!(
            telemetry::CHECKPOINT,
            { telemetry::GEN_AI_CONVERSATION_ID } = self.record.id.as_str(),
            { telemetry::DURABLE_SESSION_VERSION } = self.version + 1,
            { telemetry::ERROR_TYPE } = tracing::field::Empty,
        )
    }

    /// Writes the next checkpoint; `replayed` refuses a step whose recorded calls were
    /// not all replayed (false only for
    /// [`dangerous_checkpoint_unreplayed`](Self::dangerous_checkpoint_unreplayed)).
    async fn write_checkpoint(
        &mut self,
        wake_at: Option<i64>,
        replayed: bool,
        ending: Ending,
    ) -> Result<CheckpointMeta, DurableError> {
        if let Some(version) = self.journal.checkpoint_in_doubt() {
            return Err(DurableError::CheckpointInDoubt {
                session: self.record.id.clone(),
                version,
            });
        }
        // A re-run step whose recorded effects were not all replayed may not end: their
        // results would vanish from the conversation and the next step could repeat them.
        if replayed {
            self.journal.check_step_replayed().await?;
        } else {
            self.journal.check_approvals_settled().await?;
        }
        let mut checkpoint = self.snapshot()?;
        checkpoint.wake_at = wake_at;
        #[cfg(feature = "failpoints")]
        fail::fail_point!("durable::before_checkpoint");
        if ending == Ending::Completes {
            self.stop_renewing();
            self.end_if_cancelled().await?;
        }
        let lease = self.journal.lease();
        // If this future is dropped mid-write, the write may or may not have committed:
        // the flag stays set and the handle refuses to go on (resume the session).
        self.journal.set_checkpoint_in_doubt(Some(self.version + 1));
        let saved = match ending {
            Ending::Continues => {
                self.store
                    .save_checkpoint(lease.fence(), self.version, checkpoint)
                    .await
            }
            Ending::Completes => {
                self.store
                    .complete_with_checkpoint(lease.fence(), self.version, checkpoint)
                    .await
            }
        };
        self.journal.set_checkpoint_in_doubt(None);
        let meta = saved.map_err(|e| self.lost(e))?;
        #[cfg(feature = "failpoints")]
        fail::fail_point!("durable::after_checkpoint");
        self.version = meta.version;
        self.committed = self.messages.len();
        self.woke_from = None;
        self.journal.enter_step(meta.version).await;
        Ok(meta)
    }

    /// Runs one tool call and checkpoints after it, committing the call's result and the
    /// checkpoint in **one transaction**: after a crash either both are in the store or
    /// neither is, and the pair costs one commit (one `fsync`) instead of two.
    ///
    /// `call` makes the tool call through the journal it is given (a
    /// [`Journal::tool`] call, a `#[durable_tool]`'s `.call(journal, …)`, or one
    /// [`Toolbox`](crate::Toolbox) dispatch). `message` turns the call's outcome
    /// (`Ok(result as JSON)` or `Err(failure message)`) into the transcript message
    /// that follows it, e.g. [`Message::tool_outcome`](crate::transcript::Message::tool_outcome).
    /// The checkpoint holds this turn's pending messages, that message, the plan, the
    /// budget (with the call's spend) and the state.
    ///
    /// Returns what the call returned. When it reached an outcome (`Ok`,
    /// [`CallError::Tool`] or [`CallError::Recorded`]) the message was pushed and the
    /// checkpoint written; a [`CallError::Durable`] (e.g. `ReplayUnsafe`) writes nothing.
    /// A recorded result returned on replay, or a `pure` call (recorded in a single
    /// insert), is followed by an ordinary checkpoint: nothing to make atomic there.
    ///
    /// Exactly one tool call belongs to the scope: the first one made on the journal
    /// handle `call` is given. A second one on that handle is refused with
    /// [`DurableError::OneCallPerCheckpoint`] before anything is journaled; calls on
    /// other handles (clones of [`journal`](Self::journal)) are ordinary calls, not the
    /// scope's. Several parallel calls of one turn go through the journal, then
    /// `checkpoint`. If `call` makes no tool call, an ordinary checkpoint is written.
    ///
    /// The journal does not record the scope's call itself: when it has executed, the
    /// outcome is handed back, and this method records it together with the checkpoint
    /// once `call` returns. So if this future is dropped while `call` is still running
    /// after its tool call, nothing recorded the outcome and the call is in doubt, as
    /// after a crash (the session-wide barrier then refuses further calls with a side
    /// effect on this handle until it is settled). If it is dropped during the combined
    /// write, or before the session took the new version, the handle refuses to go on
    /// (`CheckpointInDoubt`: resume it), as after an interrupted
    /// [`checkpoint`](Self::checkpoint).
    ///
    /// If the combined write fails, the call's row stays *issued* (in doubt, as after a
    /// crash: a retry is decided by its replay class) and nothing is pushed. While a
    /// re-run step has recorded calls with a side effect that it has not replayed, the
    /// outcome is recorded on its own and the checkpoint is refused
    /// ([`DurableError::ReplayDiverged`]).
    ///
    /// ```no_run
    /// # use durable_core::{Durable, runtime::StartOptions, tool::ToolSpec};
    /// # use durable_core::transcript::Message;
    /// # use serde_json::json;
    /// # async fn demo(durable: Durable, spec: ToolSpec) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut session = durable.start::<Message>(StartOptions::default()).await?;
    /// let receipt = session
    ///     .checkpoint_after(
    ///         async |journal| {
    ///             journal
    ///                 .tool(&spec, json!({"to": "ann@example.com"}))
    ///                 .run(|_ctx| async { Ok::<_, std::io::Error>(json!({"id": "m-1"})) })
    ///                 .await
    ///         },
    ///         |outcome| Message::tool_outcome("call_1", outcome),
    ///     )
    ///     .await?;
    /// assert_eq!(receipt["id"], "m-1");
    /// # Ok(()) }
    /// ```
    pub async fn checkpoint_after<T, E, C, Mk>(
        &mut self,
        call: C,
        message: Mk,
    ) -> Result<T, CallError<E>>
    where
        C: AsyncFnOnce(&Journal) -> Result<T, CallError<E>>,
        Mk: FnOnce(Result<&Value, &str>) -> M,
    {
        if let Some(version) = self.journal.checkpoint_in_doubt() {
            return Err(DurableError::CheckpointInDoubt {
                session: self.record.id.clone(),
                version,
            }
            .into());
        }
        let scoped = self.journal.open_scope();
        let (result, done) = {
            let scope = CloseScope(&scoped);
            let result = call(&scoped).await;
            (result, scope.0.close_scope())
        };
        let executed = match done {
            // No tool call on the scope's handle ran to an end.
            None => {
                if result.is_ok() {
                    self.checkpoint().await?;
                }
                return result;
            }
            // Nothing was written with the outcome (a recorded result, a `pure` call, a
            // verified result): an ordinary checkpoint follows it.
            Some(ScopeOutcome::Recorded(outcome)) => {
                self.messages
                    .push(message(outcome.as_ref().map_err(String::as_str)));
                if let Err(e) = self.checkpoint().await {
                    self.messages.pop();
                    return Err(e.into());
                }
                return result;
            }
            Some(ScopeOutcome::Executed(executed)) => executed,
        };
        // The call executed and its outcome is ours to record, with the checkpoint, unless
        // another call of the step awaits approval: then it is recorded on its own, and
        // the step stays open for the approved call to run in.
        if let Err(awaiting) = self.journal.check_approvals_settled().await {
            self.journal.record_with_checkpoint(executed, None).await?;
            return Err(awaiting.into());
        }
        let made = message(executed.message_input().as_deref().map_err(String::as_str));
        let checkpoint = match self.checkpoint_with(&made, &executed) {
            Ok(checkpoint) => checkpoint,
            Err(e) => {
                // The outcome is recorded on its own; the checkpoint could not be made.
                self.journal.record_with_checkpoint(executed, None).await?;
                return Err(e.into());
            }
        };
        let span = self.checkpoint_span();
        let written = self
            .journal
            .record_with_checkpoint(executed, Some((self.version, checkpoint)))
            .instrument(span.clone())
            .await
            .and_then(|meta| {
                meta.ok_or_else(|| DurableError::Encode {
                    what: "checkpoint_after".into(),
                    detail: "the store wrote the result without its checkpoint".into(),
                })
            });
        if let Err(e) = &written {
            span.record(telemetry::ERROR_TYPE, telemetry::durable_error_type(e));
        }
        let meta = written?;
        // The result and the checkpoint committed together: adopt the version.
        self.messages.push(made);
        self.version = meta.version;
        self.committed = self.messages.len();
        self.woke_from = None;
        self.journal.enter_step(meta.version).await;
        self.journal.set_checkpoint_in_doubt(None);
        result
    }

    /// The checkpoint `checkpoint_after` writes with a call's outcome: this turn's
    /// messages with `message` appended, plan, state, and the budget with the call
    /// charged.
    fn checkpoint_with(
        &mut self,
        message: &M,
        executed: &Executed,
    ) -> Result<NewCheckpoint, DurableError> {
        let mut checkpoint = self.snapshot()?;
        let position = self
            .first_position
            .saturating_add(self.messages.len() as i64);
        self.check_message(message, position)?;
        checkpoint
            .messages
            .push(encode(message, "the message made from the call's outcome")?);
        let mut budget = self.journal.budget();
        executed.charge_into(&mut budget);
        checkpoint.budget = encode(&budget, "budget")?;
        Ok(checkpoint)
    }

    /// Refuses a message above [`SizeLimits::max_message_bytes`](crate::sizes::SizeLimits)
    /// before anything is written; `position` is its place in the transcript.
    fn check_message(&self, message: &M, position: i64) -> Result<(), DurableError> {
        let max = self.journal.inner.config.sizes.max_message_bytes;
        crate::sizes::check(message, max, || crate::sizes::Oversized::Message {
            session: self.record.id.clone(),
            position,
        })
    }

    fn lost(&self, e: StoreError) -> DurableError {
        self.journal.note_store_error(e)
    }

    /// Journals a model response by position (see [`Journal::model`]).
    pub async fn model<R, E, F, Fut>(&self, f: F) -> Result<R, CallError<E>>
    where
        R: Serialize + DeserializeOwned,
        E: std::fmt::Display,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<R, E>>,
    {
        self.journal.model(f).await
    }

    /// Journals a model response with its cost (see [`Journal::model_with_spend`]).
    pub async fn model_with_spend<R, E, F, Fut, S>(&self, f: F, spend: S) -> Result<R, CallError<E>>
    where
        R: Serialize + DeserializeOwned,
        E: std::fmt::Display,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<R, E>>,
        S: FnOnce(&R) -> Option<Spend>,
    {
        self.journal.model_with_spend(f, spend).await
    }

    /// Journals a model response with its token usage, priced by the runtime's price
    /// table (see [`Journal::model_with_usage`]).
    pub async fn model_with_usage<R, E, F, Fut, U>(&self, f: F, usage: U) -> Result<R, CallError<E>>
    where
        R: Serialize + DeserializeOwned,
        E: std::fmt::Display,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<R, E>>,
        U: FnOnce(&R) -> Option<crate::snapshot::Usage>,
    {
        self.journal.model_with_usage(f, usage).await
    }

    /// Journals a streamed model reply by position (see [`Journal::model_stream`]).
    pub async fn model_stream<R, E, S, F>(
        &self,
        open: F,
    ) -> Result<ModelStream<R, E, S>, CallError<E>>
    where
        R: StreamedReply,
        E: std::fmt::Display,
        S: futures_util::Stream<Item = Result<R::Chunk, E>>,
        F: FnOnce() -> S,
    {
        self.journal.model_stream(open).await
    }

    /// Journals a streamed model reply with its cost (see
    /// [`Journal::model_stream_with_spend`]).
    pub async fn model_stream_with_spend<R, E, S, F, P>(
        &self,
        open: F,
        spend: P,
    ) -> Result<ModelStream<R, E, S>, CallError<E>>
    where
        R: StreamedReply,
        E: std::fmt::Display,
        S: futures_util::Stream<Item = Result<R::Chunk, E>>,
        F: FnOnce() -> S,
        P: FnOnce(&R) -> Option<Spend> + Send + 'static,
    {
        self.journal.model_stream_with_spend(open, spend).await
    }

    /// Writes a final checkpoint (with the pending messages, plan and budget, even when
    /// nothing changed since the last one) and marks the session completed, releasing
    /// its lease.
    pub async fn complete(mut self) -> Result<CheckpointMeta, DurableError> {
        if crate::guard_switch::guard_off("atomic_complete") {
            let meta = self.checkpoint().await?;
            self.finish(SessionStatus::Completed, None).await?;
            return Ok(meta);
        }
        let span = self.checkpoint_span();
        let written = self
            .write_checkpoint(None, true, Ending::Completes)
            .instrument(span.clone())
            .await;
        if let Err(e) = &written {
            span.record(telemetry::ERROR_TYPE, telemetry::durable_error_type(e));
        }
        written
    }

    /// Marks the session failed (terminal), with a reason.
    pub async fn fail(mut self, reason: &str) -> Result<(), DurableError> {
        self.finish(SessionStatus::Failed, Some(reason)).await
    }

    /// Marks the session cancelled (terminal).
    pub async fn cancel(mut self, reason: Option<&str>) -> Result<(), DurableError> {
        self.finish(SessionStatus::Cancelled, reason).await
    }

    /// Parks the session for an operator (e.g. after `ReplayUnsafe`), releasing its lease.
    pub async fn park(mut self, reason: &str) -> Result<(), DurableError> {
        self.finish(SessionStatus::Parked, Some(reason)).await
    }

    /// Parks the session at a budget ceiling, until an operator raises it (after a call
    /// returned [`DurableError::BudgetExceeded`]): status `parked` with the refusal as
    /// its reason (starting [`PARKED_FOR_BUDGET`](crate::PARKED_FOR_BUDGET)), lease
    /// released, no worker's pool claims it. Call it *without* a checkpoint: the turn is
    /// replayed when the session goes on (recorded replies and results come back from
    /// the journal, charged once, never refused), and the call the ceiling refused runs
    /// then.
    ///
    /// [`Operator::raise_limit`](crate::Operator::raise_limit) (`durable budget raise`,
    /// the console's session page) raises the ceiling and returns the session to
    /// `active`; [`Durable::resume`](crate::Durable::resume) or a pool continues it.
    ///
    /// ```no_run
    /// # use durable_core::{DurableError, Message, Resumed, ShutdownSignal};
    /// # async fn turn(session: &mut durable_core::Session) -> Result<(), DurableError> { Ok(()) }
    /// async fn handler(resumed: Resumed<Message>, _: ShutdownSignal) -> Result<(), DurableError> {
    ///     let mut session = resumed.session;
    ///     match turn(&mut session).await {
    ///         Err(DurableError::BudgetExceeded(refusal)) => session.park_for_budget(&refusal).await,
    ///         Err(other) => Err(other),
    ///         Ok(()) => session.complete().await.map(drop),
    ///     }
    /// }
    /// ```
    pub async fn park_for_budget(
        mut self,
        refusal: &crate::snapshot::BudgetExceeded,
    ) -> Result<(), DurableError> {
        let reason = refusal.to_string();
        debug_assert!(reason.starts_with(crate::PARKED_FOR_BUDGET));
        self.finish(SessionStatus::Parked, Some(&reason)).await
    }

    /// Parks the session until a person decides its calls awaiting approval (after a
    /// call returned [`DurableError::AwaitingApproval`]; see
    /// [`approval`](crate::approval)): status `awaiting_approval`, lease released, no
    /// worker held. Call it once every call of the turn was dispatched, *without* a
    /// checkpoint: the turn is replayed when the session resumes (the model's reply from
    /// the journal, the calls that ran returning their recorded results, the approved
    /// ones running once, the denied ones returning their denial).
    ///
    /// Once the last request is decided the session is `active` again with no lease:
    /// [`Durable::resume`](crate::Durable::resume) or
    /// [`recover_next`](crate::Durable::recover_next) continues it on any worker. If
    /// every request was decided already, the session stays `active` and is only
    /// released.
    pub async fn await_approval(mut self) -> Result<(), DurableError> {
        self.finish(SessionStatus::AwaitingApproval, None).await
    }

    /// Puts the session to sleep until `at` (ms since the epoch, on the store's
    /// clock): writes a checkpoint that carries the wake-up time (this turn's messages,
    /// plan, budget and state, as [`checkpoint`](Self::checkpoint) does), then gives the
    /// lease up. No worker is held while it sleeps; once `at` has passed, a worker pool
    /// ([`Durable::worker`](crate::Durable::worker)) or
    /// [`recover_next`](crate::Durable::recover_next) on any worker claims it and the
    /// handler resumes from that checkpoint, where [`woke_from`](Self::woke_from) tells
    /// it the sleep is over.
    ///
    /// The wake-up time is written in the same transaction as the checkpoint, so a crash
    /// neither loses nor doubles it: before that commit the session has not gone to
    /// sleep (the turn is replayed from the journal), after it the session sleeps until
    /// `at` whether or not the lease was given up (a lease left behind expires first).
    /// The next checkpoint clears the wake-up time. [`Operator::wake`](crate::Operator::wake)
    /// (an operator's `durable wake`) ends a sleep early, and
    /// [`resume`](crate::Durable::resume) by id takes a sleeping session at once.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # use durable_core::{Block, DurableError, Message, Resumed, ShutdownSignal};
    /// async fn follow_up(resumed: Resumed<Message>, _: ShutdownSignal) -> Result<(), DurableError> {
    ///     let mut session = resumed.session;
    ///     if session.woke_from().is_none() {
    ///         session.push(Message::assistant(vec![Block::text("I'll check on the refund tomorrow.")]));
    ///         // Checkpoint, sleep a day, release: any worker picks it up then.
    ///         session.sleep(Duration::from_secs(24 * 3600)).await?;
    ///         return Ok(());
    ///     }
    ///     // The day has passed: check the refund, …
    ///     session.complete().await?;
    ///     Ok(())
    /// }
    /// ```
    pub async fn sleep_until(mut self, at: i64) -> Result<CheckpointMeta, DurableError> {
        let meta = self.checkpoint_waking_at(Some(at)).await?;
        self.stop_renewing();
        let lease = self.journal.lease();
        self.store.release_lease(&lease).await?;
        tracing::info!(session = %self.record.id, wake_at = at, "session asleep");
        Ok(meta)
    }

    /// [`sleep_until`](Self::sleep_until) the store's clock now plus `duration`.
    pub async fn sleep(
        self,
        duration: std::time::Duration,
    ) -> Result<CheckpointMeta, DurableError> {
        let now = self.store.now().await?;
        let ms = i64::try_from(duration.as_millis()).unwrap_or(i64::MAX);
        self.sleep_until(now.saturating_add(ms)).await
    }

    /// The wake-up time of the sleep this resume ends: `Some` when the latest checkpoint
    /// put the session to sleep ([`sleep_until`](Self::sleep_until)), `None` otherwise
    /// (a session [submitted with a start time](crate::StartOptions::with_not_before) is
    /// not waking from a sleep) and after the next checkpoint.
    ///
    /// A pool resumes a sleeper once its time has passed; an explicit
    /// [`resume`](crate::Durable::resume) by id, or [`Operator::wake`](crate::Operator::wake),
    /// ends the sleep early, and this says so all the same: the handler continues after
    /// the sleep. To tell an early wake-up from a due one, compare with the store's clock
    /// ([`CheckpointStore::now`](crate::store::StoreBase::now)).
    pub fn woke_from(&self) -> Option<i64> {
        self.woke_from
    }

    /// Gives the lease up without changing the status: another worker (or a later
    /// resume) may continue from the latest checkpoint.
    ///
    /// Fails with [`StoreError::LeaseLost`] when the lease had already been taken over
    /// (it expired and another worker claimed the session): nothing was given up, and
    /// whatever this handle did after losing it was refused.
    pub async fn release(mut self) -> Result<(), DurableError> {
        self.stop_renewing();
        let lease = self.journal.lease();
        // Releasing a stale token is a no-op in the store; say so instead of `Ok`. Read
        // before releasing: once released, another worker may take the session at once.
        let now = self.store.session(&lease.session).await?;
        if now.fence != lease.fence {
            return Err(StoreError::LeaseLost {
                session: lease.session.clone(),
                token: lease.fence,
            }
            .into());
        }
        Ok(self.store.release_lease(&lease).await?)
    }

    /// Gives the lease up without a checkpoint until `at` (ms since the epoch, the
    /// store's clock): no worker pool claims the session before then, and a pool on any
    /// machine takes it after; the handler then replays the turn from the journal
    /// (recorded replies and results returned, nothing run twice) to where it stopped.
    /// Return from the handler after it.
    ///
    /// Meant for a call refused with [`DurableError::RateLimited`]: its turn under the
    /// limit is `start_at`, its place is kept, and asked again once released it takes
    /// the place at once. The session holds no worker meanwhile, however far the turn:
    ///
    /// ```no_run
    /// # use durable_core::{CallError, DurableError, Message, Resumed, ShutdownSignal};
    /// async fn handler(resumed: Resumed<Message>, _: ShutdownSignal) -> Result<(), DurableError> {
    ///     let session = resumed.session;
    ///     let asked = session
    ///         .journal()
    ///         .with_rate_limit("openai:gpt-4.1")
    ///         .model(|| async { Ok::<_, std::io::Error>(Message::assistant(vec![])) })
    ///         .await;
    ///     match asked {
    ///         Err(CallError::Durable(DurableError::RateLimited { start_at, .. })) => {
    ///             // Woken at its turn on any worker; the turn is replayed to here.
    ///             return session.release_until(start_at).await;
    ///         }
    ///         // … the reply …
    ///         _ => session.complete().await.map(|_| ()),
    ///     }
    /// }
    /// ```
    ///
    /// Unlike [`sleep_until`](Self::sleep_until), nothing is checkpointed: messages
    /// pushed since the last checkpoint are pushed again by the replay.
    /// [`resume`](crate::Durable::resume) by id takes the session at once all the same.
    pub async fn release_until(mut self, at: i64) -> Result<(), DurableError> {
        self.stop_renewing();
        let lease = self.journal.lease();
        self.store
            .wait(lease.fence(), &crate::store::Wait::until(at))
            .await
            .map_err(|e| self.lost(e))?;
        tracing::info!(session = %self.record.id, until = at, "session released until its turn");
        Ok(())
    }

    async fn finish(
        &mut self,
        status: SessionStatus,
        reason: Option<&str>,
    ) -> Result<(), DurableError> {
        self.stop_renewing();
        if status != SessionStatus::Cancelled {
            self.end_if_cancelled().await?;
        }
        let lease = self.journal.lease();
        self.store
            .set_status(lease.fence(), status, reason)
            .await
            .map_err(|e| self.lost(e))
    }

    /// Cancelled meanwhile (learned at a lease renewal): the session ends as cancelled,
    /// whatever the handler was about to end it as, and the caller gets `Cancelled`.
    async fn end_if_cancelled(&self) -> Result<(), DurableError> {
        let Some(request) = self.journal.cancel_request() else {
            return Ok(());
        };
        self.journal.end_cancelled(&request).await;
        Err(DurableError::Cancelled {
            session: self.record.id.clone(),
            by: request.by,
            reason: request.reason,
        })
    }

    fn stop_renewing(&mut self) {
        if let Some(task) = self.renewer.take() {
            task.abort();
        }
    }
}

async fn renew_loop(journal: Journal) {
    let ttl = journal.inner.config.lease_ttl;
    let period = (ttl / 3).max(std::time::Duration::from_millis(10));
    loop {
        tokio::time::sleep(period).await;
        let lease = journal.lease();
        let sent = tokio::time::Instant::now();
        match journal.inner.store.renew_lease(&lease, ttl).await {
            Ok(renewed) => {
                journal.renewed(renewed, sent);
                // A cancellation asked while this worker runs the session: learned here,
                // honoured by the next call.
                // The read runs in a task of its own: this loop is aborted when the session
                // ends, and a read cut off mid-statement would cost its connection.
                let store = Arc::clone(&journal.inner.store);
                let id = lease.session.clone();
                let read = tokio::spawn(async move { store.session(&id).await });
                if let Ok(Ok(record)) = read.await
                    && let Some(request) = record.cancel_requested
                {
                    journal.note_cancel(request);
                }
            }
            Err(StoreError::LeaseLost { .. }) => {
                tracing::warn!(session = %lease.session, "lease lost; this worker must stop working on the session");
                journal.lose_lease();
                return;
            }
            Err(e) => {
                tracing::warn!(session = %lease.session, error = %e, "lease renewal failed; retrying")
            }
        }
    }
}

/// Closes a `checkpoint_after` scope however its future ends (dropped included), so that
/// later calls are not taken for the scope's.
struct CloseScope<'a>(&'a Journal);

impl Drop for CloseScope<'_> {
    fn drop(&mut self) {
        // Dropped with an executed outcome nobody will record: it is in doubt.
        if let Some(ScopeOutcome::Executed(executed)) = self.0.close_scope() {
            self.0.abandon(executed);
        }
    }
}

/// Whether a checkpoint ends the session (written with its completion, in one
/// transaction).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// The session goes on.
    Continues,
    /// The session's final checkpoint: `completed` in the same transaction.
    Completes,
}
