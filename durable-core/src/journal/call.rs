//! One tool call through the journal: the driver of the decision table in `protocol`
//! (find the row, gather the facts, apply the arm) and the execution paths behind it.

use std::fmt::Display;
use std::future::Future;
use std::sync::{Arc, Mutex};

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tracing::Instrument;

use super::checkpoint_scope::{Executed, ScopeClaim, ScopeOutcome};
use super::ordinals::Reservation;
use super::protocol::{self, Action, Answer, Facts, Refusal};
use super::{CallError, CallEvent, Journal, Outcome, RecordedFailure, failure_message, lock};
use crate::args;
use crate::canonical;
use crate::error::{DurableError, StoreError};
use crate::ids::CallId;
use crate::replay::ReplayClass;
use crate::secret;
use crate::snapshot::{Ask, Spend};
use crate::store::{
    ApprovalRequest, CallIdentity, CallKind, CallOutcome, CallRecord, CallStatus, CancelRequest,
    CheckpointMeta, EditedKey, FinishCall, IssueOutcome, NewCall, NewCheckpoint, NewError,
};
use crate::telemetry;
use crate::tool_spec::{ToolContext, ToolSpec, Verification};

/// What a journaled tool call returns: recorded as JSON, decoded again on a replay.
pub(crate) trait Recordable: Serialize + DeserializeOwned {}

impl<T: Serialize + DeserializeOwned> Recordable for T {}

/// A tool body as the driver runs it: started once per execution (and again for each
/// retry of its policy), its future the tool's outcome. Every `FnMut(ToolContext)`
/// returning such a future is one.
pub(crate) trait Body<T, E> {
    /// The running execution.
    type Running: Future<Output = Result<T, E>>;

    /// Starts one execution.
    fn start(&mut self, ctx: ToolContext) -> Self::Running;
}

impl<T, E, F, Fut> Body<T, E> for F
where
    F: FnMut(ToolContext) -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    type Running = Fut;

    fn start(&mut self, ctx: ToolContext) -> Fut {
        self(ctx)
    }
}

/// A tool call being built: see [`Journal::tool`].
#[must_use = "a tool call does nothing until `.run(...)` is awaited"]
pub struct ToolCall<'j> {
    pub(super) journal: &'j Journal,
    pub(super) spec: &'j ToolSpec,
    pub(super) args: Value,
    pub(super) key: Option<String>,
    /// The model's id for this call, for its span (see [`call_id`](ToolCall::call_id)).
    pub(super) call_id: Option<Arc<str>>,
    /// Secret arguments that hold their masked form because this process does not hold
    /// their value (a replayed reply): the call may replay a recorded outcome, never run.
    pub(super) withheld: Vec<String>,
    /// The approval this call needs before it runs, if the tool or the harness asks.
    pub(super) approval: Option<ApprovalRequest>,
    /// Takes arguments a person edited before approving (clear values): see
    /// [`accept_edits`](ToolCall::accept_edits).
    pub(super) edits: Option<EditCheck<'j>>,
}

/// What [`ToolCall::accept_edits`] is given.
type EditCheck<'j> = Box<dyn FnOnce(&Value) -> Result<Option<String>, DurableError> + Send + 'j>;

impl<'j> ToolCall<'j> {
    /// Sets the idempotency key (required for `idempotent_with_key` tools).
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Sets the model's id for this call (OpenAI's `call_…`, Anthropic's `toolu_…`), which
    /// its `execute_tool` span carries as
    /// [`gen_ai.tool.call.id`](crate::telemetry::GEN_AI_TOOL_CALL_ID). Only traces see
    /// it; the journal identifies a call by its arguments and position. Defaults to the
    /// handle's ([`Journal::with_tool_call_id`]).
    pub fn call_id(mut self, id: impl Into<Arc<str>>) -> Self {
        self.call_id = Some(id.into());
        self
    }

    /// Journals the call as awaiting a person's approval instead of running it, when no
    /// row holds it yet: it returns [`DurableError::AwaitingApproval`] and nothing runs
    /// (see [`approval`](crate::approval)). The request's `schema` defaults to the tool's
    /// argument schema, its `reasoning` to the handle's
    /// ([`Journal::with_reasoning`]). A call found in the journal goes by its row: a
    /// recorded outcome (or denial) is returned, an approved call runs.
    pub fn require_approval(mut self, request: ApprovalRequest) -> Self {
        self.approval = Some(request);
        self
    }

    /// Accepts arguments a person edited before approving this call: `check` is given
    /// them (clear values: secret arguments, which cannot be edited, hold the value this
    /// call was made with), decodes them into the tool's argument type for the body to
    /// run with ([`ToolContext::edited_args`] holds them too), and returns the
    /// idempotency key derived from them (`None` for a tool without one). An error
    /// refuses the call, nothing runs.
    ///
    /// `#[durable_tool]` sets it for every tool. A call approved with edits is refused
    /// unless it is set: running the requested arguments would not be what the person
    /// approved.
    pub fn accept_edits(
        mut self,
        check: impl FnOnce(&Value) -> Result<Option<String>, DurableError> + Send + 'j,
    ) -> Self {
        self.edits = Some(Box::new(check));
        self
    }

    /// Replays the call's recorded outcome, for a call whose secret arguments `withheld`
    /// hold their masked form (their value was redacted from a replayed model reply):
    /// nothing runs. A call with no recorded outcome is refused with
    /// [`ArgumentErrorKind::SecretUnavailable`](crate::ArgumentErrorKind::SecretUnavailable)
    /// (an in-doubt `unsafe_on_replay` one with `ReplayUnsafe`).
    pub(crate) async fn replay_only(
        mut self,
        withheld: Vec<String>,
    ) -> Result<Value, CallError<std::convert::Infallible>> {
        self.withheld = withheld;
        self.run(|_ctx| async {
            unreachable!("a call with withheld secrets is refused before it could run")
        })
        .await
    }

    /// Runs the call through the journal with no verify hook.
    ///
    /// # Why the body is `FnMut`, not `FnOnce`
    ///
    /// `run` calls the closure once per *attempt*: a tool with a retry policy
    /// ([`ToolSpec::with_retry`](crate::ToolSpec::with_retry), for `pure` and
    /// `idempotent_with_key` tools) runs it again after a failed attempt, within this one
    /// call. So the closure must be callable more than once, and the future it returns
    /// cannot take a capture of the closure by value: with an owned `body: String`,
    /// `move |_ctx| async move { send(body).await }` is error E0507 ("cannot move out of
    /// `body`, a captured variable in an `FnMut` closure"), once per moved capture.
    ///
    /// ```compile_fail,E0507
    /// # use durable_core::{CallError, Journal, ToolSpec};
    /// # use serde_json::{Value, json};
    /// # async fn send(body: String) -> Result<Value, String> { Ok(json!(body.len())) }
    /// # async fn demo(journal: &Journal, spec: &ToolSpec) -> Result<Value, CallError<String>> {
    /// let body = String::from("Your refund is on its way.");
    /// journal
    ///     .tool(spec, json!({ "body": body }))
    ///     .run(move |_ctx| async move { send(body).await }) // E0507: `body` moved out
    ///     .await
    /// # }
    /// ```
    ///
    /// The closure keeps the captures; each attempt clones what its future takes, inside
    /// the closure, and moves the clone in:
    ///
    /// ```no_run
    /// # use durable_core::{CallError, Journal, ToolSpec};
    /// # use serde_json::{Value, json};
    /// # async fn send(to: &str, body: String) -> Result<Value, String> { Ok(json!({ "to": to, "len": body.len() })) }
    /// # async fn demo(journal: &Journal, spec: &ToolSpec) -> Result<Value, CallError<String>> {
    /// let to = String::from("ada@example.com");
    /// let body = String::from("Your refund is on its way.");
    /// journal
    ///     .tool(spec, json!({ "to": to, "body": body }))
    ///     .run(move |_ctx| {
    ///         // One copy per attempt: the future owns it, the closure keeps the original.
    ///         let (to, body) = (to.clone(), body.clone());
    ///         async move { send(&to, body).await }
    ///     })
    ///     .await
    /// # }
    /// ```
    ///
    /// (An `Arc` of what is expensive to clone does the same for the price of a counter.)
    pub async fn run<T, E, F, Fut>(self, run: F) -> Result<T, CallError<E>>
    where
        T: Serialize + DeserializeOwned,
        E: Display,
        F: FnMut(ToolContext) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        self.run_verified(run, |_ctx| async { Verification::Unknown })
            .await
    }

    /// Runs the call with a verify hook for in-doubt `unsafe_on_replay` calls: it is
    /// asked whether the effect happened (e.g. by looking in the outbox) before the
    /// runtime either records its answer or surfaces the call as `ReplayUnsafe`.
    pub async fn run_verified<T, E, F, Fut, V, VFut>(
        self,
        run: F,
        verify: V,
    ) -> Result<T, CallError<E>>
    where
        T: Serialize + DeserializeOwned,
        E: Display,
        F: FnMut(ToolContext) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        V: FnOnce(ToolContext) -> VFut,
        VFut: Future<Output = Verification<T>>,
    {
        let span = tool_span(self.journal, self.spec, self.call_id.as_deref());
        let journal = self.journal;
        let spec = self.spec;
        let mut claim = match journal.claim_scope(&spec.name) {
            Ok(claim) => claim,
            Err(refused) => {
                span.in_scope(|| super::refused_span(&refused));
                span.record(
                    telemetry::ERROR_TYPE,
                    telemetry::durable_error_type(&refused),
                );
                return Err(refused.into());
            }
        };
        let result = self
            .run_inner(run, verify, claim.as_mut())
            .instrument(span.clone())
            .await;
        if let Err(e) = &result {
            span.record(
                telemetry::ERROR_TYPE,
                telemetry::call_error_type(e, telemetry::ERROR_TYPE_TOOL),
            );
        }
        let Some(mut claim) = claim else {
            return result;
        };
        if claim.outcome.is_none() {
            // Nothing left to record with the checkpoint (a recorded result returned, a
            // `pure` call's single insert, a verified result): the message is made of
            // what the call returns, and the session writes an ordinary checkpoint.
            let message = match &result {
                Ok(value) => Some(encode_result(spec, value).map_err(|e| e.to_string())),
                Err(CallError::Tool(e)) => Some(Err(e.to_string())),
                Err(CallError::Recorded(failure)) => Some(Err(failure.message.clone())),
                Err(CallError::Durable(_)) => None,
            };
            claim.outcome = message.map(ScopeOutcome::Recorded);
        }
        journal.return_claim(claim);
        result
    }

    /// Validates and hashes the arguments, finds the row, gathers the [`Facts`] and
    /// applies the arm [`protocol::decide`] chooses.
    async fn run_inner<T, E, B, V, VFut>(
        mut self,
        mut run: B,
        verify: V,
        scope: Option<&mut ScopeClaim>,
    ) -> Result<T, CallError<E>>
    where
        T: Recordable,
        E: Display,
        B: Body<T, E>,
        V: FnOnce(ToolContext) -> VFut,
        VFut: Future<Output = Verification<T>>,
    {
        let journal = self.journal;
        let spec = self.spec;
        // A session known to be cancelled says so first: once this handle ended it, its
        // lease is gone too, and the caller must read why.
        journal
            .check_cancelled()
            .await
            .inspect_err(super::refused_span)?;
        journal.check_lease().inspect_err(super::refused_span)?;
        journal.mark_running().await?;
        let limits = journal.inner.config.limits;
        let invalid = |source| {
            let refused = DurableError::InvalidArguments {
                tool: spec.name.clone(),
                source: secret::redact_argument_error(
                    &spec.name,
                    &spec.secret_args,
                    Some(&self.args),
                    source,
                ),
            };
            super::refused_span(&refused);
            refused
        };
        args::check_value(&self.args, &limits).map_err(invalid)?;
        // The row and the input hash carry secret arguments masked (a keyed digest): the
        // same secret gives the same identity in this store, and neither is a bare hash a
        // dictionary could reverse.
        secret::register(&spec.name, &spec.secret_args);
        let secrets = secret::secret_args(&spec.name, &spec.secret_args);
        let masked = if secrets.is_empty() {
            self.args.clone()
        } else {
            let keyring = journal.inner.store.keyring();
            secret::mask_args(keyring, &spec.name, &secrets, &self.withheld, &self.args)
                .inspect_err(super::refused_span)?
        };
        let hash = canonical::input_hash(&masked).map_err(invalid)?;
        // A call whose secrets are withheld only ever replays a recorded outcome, which
        // needs no key.
        if spec.class == ReplayClass::IdempotentWithKey
            && self.key.is_none()
            && self.withheld.is_empty()
        {
            let refused = DurableError::Encode {
                what: format!("call of `{}`", spec.name),
                detail: "an idempotent_with_key tool needs an idempotency key: call `.key(...)`"
                    .into(),
            };
            super::refused_span(&refused);
            return Err(refused.into());
        }
        let (identity, found, mut reservation) = journal.find(spec, hash).await?;

        // What the decision reads besides the row.
        let request = match &found {
            None => self.approval.take().or_else(|| {
                let policy = journal.inner.config.approval_policy.as_ref()?;
                policy(spec, &masked)
            }),
            Some(_) => None,
        };
        let edits = match &found {
            Some(row)
                if matches!(
                    row.status,
                    CallStatus::Issued | CallStatus::NotHappened | CallStatus::Approved
                ) =>
            {
                self.take_edits(row)
            }
            _ => Ok((None, None)),
        };
        let facts = Facts {
            class: spec.class,
            held: found.as_ref().map(|row| row.status),
            schema_changed: found.as_ref().is_some_and(|row| {
                !row.schema_hash.is_empty() && row.schema_hash != spec.fingerprint
            }),
            withheld: !self.withheld.is_empty(),
            recorded_key: found
                .as_ref()
                .is_some_and(|row| row.idempotency_key.is_some()),
            approval_asked: request.is_some(),
            edits_refused: edits.is_err(),
        };
        let action = protocol::decide(facts);
        if matches!(
            action,
            Action::RunPure
                | Action::IssueAndRun
                | Action::ReRun { .. }
                | Action::RunApproved { .. }
        ) && let Some(limit) = spec.rate_limit.as_deref().or(journal.tool_limit.as_deref())
        {
            // The call is about to run: it takes its turn under its rate limit first,
            // before anything is issued (a call refused for a far turn leaves no row).
            let hold = Some(journal.inner.config.limiter_hold);
            journal
                .take_turn(limit, super::limit::waiter_id(&identity, 1), hold)
                .await?;
        }
        if let Some(row) = &found {
            tracing::Span::current().record(telemetry::DURABLE_CALL_ID, row.id.as_str());
        }
        let (key, edited, edits_refused) = match edits {
            Ok((key, edited)) => (key, edited, None),
            Err(refused) => (None, None, Some(refused)),
        };
        // A call about to run costs: the budget's ceilings are checked before anything
        // is journaled or run for it (a recorded outcome replays whatever the budget
        // says; a request for approval runs nothing, the approved call is checked when
        // it runs). Refused, the ordinal goes back with `reservation`.
        if matches!(
            action,
            Action::RunPure
                | Action::IssueAndRun
                | Action::ReRun { .. }
                | Action::RunApproved { .. }
        ) && let Err(refused) = journal.check_budget(Ask::Tool(&spec.name)).await
        {
            reservation.release();
            journal.notify(CallEvent {
                session: journal.inner.session.clone(),
                call: found.as_ref().map(|row| row.id.clone()),
                tool: spec.name.clone(),
                class: spec.class,
                outcome: Outcome::Refused,
                idempotency_key: self.key.clone(),
                step: journal.step(),
            });
            return Err(refused.into());
        }
        match (action, found) {
            (Action::Replay, Some(row)) => journal.replay_recorded(row, reservation).await,
            (Action::RequestApproval, None) => {
                let call = self.new_call(identity, masked);
                let Some(request) = request else {
                    unreachable!("protocol::decide requests approval only when asked")
                };
                journal.request(spec, call, request, reservation).await
            }
            (Action::AwaitApproval, Some(row)) => {
                reservation.release();
                journal.emit(journal.event(&row, Outcome::ApprovalRequested));
                Err(DurableError::AwaitingApproval {
                    call: row.id,
                    tool: spec.name.clone(),
                    status: row.status.as_str().to_owned(),
                }
                .into())
            }
            (Action::RunPure, None) => {
                let call = self.new_call(identity, masked);
                journal
                    .execute_pure(spec, call, &mut run, &mut reservation)
                    .await
            }
            (Action::IssueAndRun, None) => {
                let call = self.new_call(identity, masked);
                self.issue_and_run(call, reservation, &mut run, scope).await
            }
            (Action::Verify, Some(row)) => {
                self.verify(row, edited, verify, reservation, &mut run, scope)
                    .await
            }
            (Action::ReRun { outcome, guarded }, Some(row)) => {
                self.rerun(row, outcome, guarded, edited, reservation, &mut run, scope)
                    .await
            }
            (Action::RunApproved { guarded }, Some(row)) => {
                self.run_approved(row, key, edited, guarded, reservation, &mut run, scope)
                    .await
            }
            (Action::Refuse(why), row) => {
                let error = self.refuse(why, row.as_ref(), edits_refused, &mut reservation);
                journal.after_refusal(why, row.as_ref()).await;
                Err(error.into())
            }
            (Action::RefuseApproved(why), Some(row)) => {
                let error = self.refuse(why, Some(&row), edits_refused, &mut reservation);
                journal.after_refusal(why, Some(&row)).await;
                Err(DurableError::ApprovedCallRefused {
                    call: row.id.clone(),
                    tool: spec.name.clone(),
                    reason: error.to_string(),
                }
                .into())
            }
            (action, found) => unreachable!(
                "protocol::decide chose {action:?} for a call whose row is {:?}",
                found.map(|row| row.status)
            ),
        }
    }

    /// In doubt `unsafe_on_replay`: asks the verify hook (with the arguments a person
    /// approved, if they edited them) and applies what [`protocol::after_verify`] makes
    /// of its answer.
    #[allow(clippy::too_many_arguments)]
    async fn verify<T, E, B, V, VFut>(
        self,
        row: CallRecord,
        edited: Option<Arc<Value>>,
        verify: V,
        mut reservation: Reservation,
        run: &mut B,
        scope: Option<&mut ScopeClaim>,
    ) -> Result<T, CallError<E>>
    where
        T: Recordable,
        E: Display,
        B: Body<T, E>,
        V: FnOnce(ToolContext) -> VFut,
        VFut: Future<Output = Verification<T>>,
    {
        let journal = self.journal;
        let spec = self.spec;
        let ctx = {
            let mut ctx = journal.context(&row);
            ctx.edited = edited.clone();
            ctx
        };
        let (answer, value) = match verify(ctx).await {
            Verification::Happened(value) => (Answer::Happened, Some(value)),
            Verification::DidNotHappen => (Answer::DidNotHappen, None),
            Verification::Unknown => (Answer::Unknown, None),
        };
        match (protocol::after_verify(answer), value) {
            (Action::RecordVerified, Some(value)) => {
                reservation.keep();
                // Too large to store: recorded as the call's failure (it happened, and is
                // never run again).
                let (result, returned) = match journal.check_result(&row, &value) {
                    Err(too_large) => (
                        CallOutcome::Failed(crate::sizes::recorded_failure(&too_large)),
                        Err(CallError::Durable(too_large)),
                    ),
                    Ok(()) => (
                        CallOutcome::Completed(encode_result(spec, &value)?),
                        Ok(value),
                    ),
                };
                journal
                    .record_outcome(&row, result, None, Outcome::VerifiedHappened, scope)
                    .await?;
                returned
            }
            (Action::ReRun { outcome, guarded }, _) => {
                self.rerun(row, outcome, guarded, edited, reservation, run, scope)
                    .await
            }
            (Action::Refuse(why), _) => {
                let error = self.refuse(why, Some(&row), None, &mut reservation);
                journal.after_refusal(why, Some(&row)).await;
                Err(error.into())
            }
            (action, _) => unreachable!("after_verify gave {action:?}"),
        }
    }

    /// The row a fresh call writes.
    fn new_call(&self, identity: CallIdentity, masked: Value) -> NewCall {
        NewCall {
            id: CallId::random(),
            kind: CallKind::Tool,
            identity,
            class: self.spec.class,
            args: masked,
            idempotency_key: self.key.clone(),
            schema_hash: self.spec.fingerprint.clone(),
        }
    }

    /// The error a refusal returns, reported as refused; the ordinal is handed back, so
    /// the same call sent again maps onto the same row. Every refusal of the decision
    /// table goes through here, then through [`Journal::after_refusal`].
    fn refuse(
        &self,
        why: Refusal,
        row: Option<&CallRecord>,
        edits_refused: Option<DurableError>,
        reservation: &mut Reservation,
    ) -> DurableError {
        let journal = self.journal;
        let spec = self.spec;
        reservation.release();
        match row {
            Some(row) => journal.emit(journal.event(row, Outcome::Refused)),
            None => journal.emit_refused(spec, self.key.clone()),
        }
        let replay_unsafe = |row: &CallRecord, class, reason: String| DurableError::ReplayUnsafe {
            call: row.id.clone(),
            tool: spec.name.clone(),
            class,
            refused_tool: spec.name.clone(),
            reason,
        };
        let withheld = self.withheld.first().map(String::as_str);
        match (why, row) {
            (Refusal::SchemaChanged, Some(row)) => DurableError::SchemaChanged {
                tool: spec.name.clone(),
                call: row.id.clone(),
                recorded: row.schema_hash.clone(),
                current: spec.fingerprint.clone(),
            },
            (Refusal::SecretUnavailable, _) => secret::unavailable(&spec.name, withheld),
            (Refusal::SecretWithheld, Some(row)) => replay_unsafe(
                row,
                spec.class,
                format!(
                    "its secret argument `{}` was masked in the journal and its value is not \
                     held after a restart, so neither its verify hook nor a re-execution can run",
                    withheld.unwrap_or_default()
                ),
            ),
            (Refusal::EditsRefused, _) => edits_refused.unwrap_or_else(|| DurableError::Encode {
                what: format!("call of `{}`", spec.name),
                detail: "the approval's edited arguments were refused".into(),
            }),
            (Refusal::NoRecordedKey, Some(row)) => replay_unsafe(
                row,
                row.class,
                format!(
                    "its record holds no idempotency key (was it issued before `{}` became \
                     `idempotent_with_key`?), so re-running it could repeat the effect",
                    spec.name
                ),
            ),
            (Refusal::NotVerified, Some(row)) => replay_unsafe(
                row,
                spec.class,
                if spec.has_verify {
                    "its verify hook could not tell whether the effect happened".into()
                } else {
                    "the tool has no verify hook, and re-running it could repeat the effect".into()
                },
            ),
            (Refusal::InFlight, Some(row)) => replay_unsafe(
                row,
                spec.class,
                "another execution of the same call is in flight".into(),
            ),
            (why, None) => unreachable!("{why:?} is only chosen for a row"),
        }
    }

    /// In doubt: re-executed on the same row, behind the session-wide barrier when
    /// `guarded`, with the arguments a person approved if they edited them (the key stays
    /// the recorded one).
    #[allow(clippy::too_many_arguments)]
    async fn rerun<T, E, B>(
        self,
        row: CallRecord,
        outcome: Outcome,
        guarded: bool,
        edited: Option<Arc<Value>>,
        mut reservation: Reservation,
        run: &mut B,
        scope: Option<&mut ScopeClaim>,
    ) -> Result<T, CallError<E>>
    where
        T: Recordable,
        E: Display,
        B: Body<T, E>,
    {
        let journal = self.journal;
        let spec = self.spec;
        if outcome == Outcome::ReExecutedWithKey && row.idempotency_key != self.key {
            tracing::warn!(
                recorded = ?row.idempotency_key, derived = ?self.key,
                "idempotency key derived now differs from the recorded one; re-executing with the recorded key"
            );
        }
        if guarded && let Err(refused) = journal.barrier(spec, Some(&row.id)).await {
            reservation.release();
            super::refused_span(&refused);
            return Err(refused.into());
        }
        // The row holds this ordinal from here on.
        reservation.keep();
        journal.ensure_durable(spec).await?;
        let (row, running) = journal.reissue(&row).await?;
        journal
            .execute(
                spec,
                row,
                run,
                Execution { outcome, edited },
                running,
                scope,
            )
            .await
    }

    /// No record, a side effect: passes the session-wide barrier, the divergence check
    /// and the carried-effect check, is recorded *issued* (committed and synced), runs,
    /// and has its outcome recorded.
    async fn issue_and_run<T, E, B>(
        self,
        call: NewCall,
        mut reservation: Reservation,
        run: &mut B,
        scope: Option<&mut ScopeClaim>,
    ) -> Result<T, CallError<E>>
    where
        T: Recordable,
        E: Display,
        B: Body<T, E>,
    {
        let journal = self.journal;
        let spec = self.spec;
        // Refused here, nothing holds this ordinal: `reservation` hands it back.
        if let Err(refused) = journal.barrier(spec, None).await {
            journal.emit_refused(spec, self.key.clone());
            return Err(refused.into());
        }
        if let Err(diverged) = journal.check_divergence(spec).await {
            journal.emit_refused(spec, self.key.clone());
            return Err(diverged.into());
        }
        if let Err(carried) = journal.check_carried(spec, &call.identity.input_hash).await {
            journal.emit_refused(spec, self.key.clone());
            return Err(carried.into());
        }
        journal.ensure_durable(spec).await?;
        journal.failpoint("before_issue", &spec.name);
        let lease = journal.lease();
        let issued = match journal.inner.store.issue_call(lease.fence(), call).await {
            Ok(issued) => issued,
            // Cancelled since this worker last looked: nothing starts, and the session
            // ends as `cancelled` under this lease.
            Err(StoreError::CancelRequested { by, reason, at, .. }) => {
                journal.note_cancel(CancelRequest { by, reason, at });
                journal.emit_refused(spec, self.key.clone());
                return Err(journal.refuse_cancelled().await.into());
            }
            Err(e) => return Err(journal.note_store_error(e).into()),
        };
        let row = match issued {
            IssueOutcome::Inserted(row) => row,
            IssueOutcome::Existing(row) => {
                return match protocol::after_insert_race(row.status, false) {
                    Action::Replay => {
                        reservation.keep();
                        journal.charge(&row);
                        journal.emit(journal.event(&row, Outcome::CacheHit));
                        recorded_outcome(&row)
                    }
                    Action::Refuse(why) => {
                        let error = self.refuse(why, Some(&row), None, &mut reservation);
                        journal.after_refusal(why, Some(&row)).await;
                        Err(error.into())
                    }
                    action => unreachable!("after_insert_race gave {action:?}"),
                };
            }
        };
        reservation.keep();
        let running = IssuedHere::new(journal, &row);
        journal.remember(&row).await;
        tracing::Span::current().record(telemetry::DURABLE_CALL_ID, row.id.as_str());
        journal.failpoint("after_issued", &spec.name);
        journal
            .execute(spec, row, run, Execution::fresh(), running, scope)
            .await
    }

    /// Approved: a person decided the call may run. It runs now, once, under its replay
    /// class: behind the session-wide barrier and the carried-effect check when
    /// `guarded`, with the edited arguments if the person edited them (and, for a keyed
    /// tool, the key derived from them, recorded with the row before it runs).
    #[allow(clippy::too_many_arguments)]
    async fn run_approved<T, E, B>(
        self,
        row: CallRecord,
        key: Option<EditedKey>,
        edited: Option<Arc<Value>>,
        guarded: bool,
        mut reservation: Reservation,
        run: &mut B,
        scope: Option<&mut ScopeClaim>,
    ) -> Result<T, CallError<E>>
    where
        T: Recordable,
        E: Display,
        B: Body<T, E>,
    {
        let journal = self.journal;
        let spec = self.spec;
        if guarded {
            let checked = match journal.barrier(spec, Some(&row.id)).await {
                Ok(()) => journal.check_carried(spec, &row.identity.input_hash).await,
                Err(refused) => Err(refused),
            };
            if let Err(refused) = checked {
                reservation.release();
                super::refused_span(&refused);
                return Err(refused.into());
            }
        }
        reservation.keep();
        journal.ensure_durable(spec).await?;
        journal.failpoint("before_issue", &spec.name);
        let lease = journal.lease();
        let issued = match journal
            .inner
            .store
            .issue_approved(lease.fence(), &row.id, key)
            .await
        {
            Ok(issued) => issued,
            // Cancelled since this worker last looked: the approved call does not run,
            // and the session ends as `cancelled` under this lease.
            Err(StoreError::CancelRequested { by, reason, at, .. }) => {
                journal.note_cancel(CancelRequest { by, reason, at });
                journal.emit(journal.event(&row, Outcome::Refused));
                return Err(journal.refuse_cancelled().await.into());
            }
            // The edited arguments' key is another call's: the row stays approved.
            Err(conflict @ StoreError::IdempotencyConflict { .. }) => {
                reservation.release();
                journal.emit(journal.event(&row, Outcome::Refused));
                return Err(DurableError::ApprovedCallRefused {
                    call: row.id.clone(),
                    tool: spec.name.clone(),
                    reason: DurableError::from(conflict).to_string(),
                }
                .into());
            }
            // A decision landed between this worker's read of the row and its issue (a
            // person revoked the approval, say): nothing ran, and the row as read again
            // decides what the harness gets (a denial is the call's recorded failure), not
            // the resolve vocabulary of `CallNotInDoubt`.
            Err(StoreError::CallNotInDoubt { call, .. }) => {
                let found = journal
                    .inner
                    .store
                    .call(&call)
                    .await
                    .map_err(|e| journal.note_store_error(e))?;
                return match protocol::after_approved_issue_refused(found.status) {
                    Action::Replay => {
                        journal.remember(&found).await;
                        journal.replay_recorded(found, reservation).await
                    }
                    Action::AwaitApproval => {
                        reservation.release();
                        journal.emit(journal.event(&found, Outcome::ApprovalRequested));
                        Err(DurableError::AwaitingApproval {
                            call: found.id,
                            tool: spec.name.clone(),
                            status: found.status.as_str().to_owned(),
                        }
                        .into())
                    }
                    Action::Refuse(why) => {
                        let error = self.refuse(why, Some(&found), None, &mut reservation);
                        journal.after_refusal(why, Some(&found)).await;
                        Err(error.into())
                    }
                    action => unreachable!("after_approved_issue_refused gave {action:?}"),
                };
            }
            Err(e) => return Err(journal.note_store_error(e).into()),
        };
        let running = IssuedHere::new(journal, &issued);
        journal.remember(&issued).await;
        journal.failpoint("after_issued", &spec.name);
        journal
            .execute(
                spec,
                issued,
                run,
                Execution {
                    outcome: Outcome::Executed,
                    edited,
                },
                running,
                scope,
            )
            .await
    }

    /// The arguments a person edited before approving `row`, as the call runs with them
    /// (clear: each secret argument, kept masked in the edit, holds this call's value),
    /// with the idempotency key derived from them by [`accept_edits`](Self::accept_edits).
    /// `(None, None)` when the approval edited nothing.
    fn take_edits(
        &mut self,
        row: &CallRecord,
    ) -> Result<(Option<EditedKey>, Option<Arc<Value>>), DurableError> {
        let Some(edited) = row.approval.as_ref().and_then(|a| a.edited_args()) else {
            return Ok((None, None));
        };
        let mut effective = edited.clone();
        let secrets = secret::secret_args(&self.spec.name, &self.spec.secret_args);
        if let (Some(fields), Some(called)) = (effective.as_object_mut(), self.args.as_object()) {
            for name in &secrets {
                if fields.get(name).is_some_and(secret::is_masked)
                    && let Some(value) = called.get(name)
                {
                    fields.insert(name.clone(), value.clone());
                }
            }
        }
        let Some(check) = self.edits.take() else {
            return Err(DurableError::InvalidEdit {
                call: row.id.clone(),
                tool: self.spec.name.clone(),
                path: "$".into(),
                detail: "the call was approved with edited arguments, and this call site takes \
                         no edits (`ToolCall::accept_edits`; `#[durable_tool]` tools do); nothing \
                         ran, and running the requested arguments would not be what was approved"
                    .into(),
            });
        };
        let key = check(&effective)?;
        let input_hash = canonical::input_hash(edited).map_err(|e| DurableError::InvalidEdit {
            call: row.id.clone(),
            tool: self.spec.name.clone(),
            path: e.path.clone(),
            detail: e.kind.to_string(),
        })?;
        let key = key.map(|key| EditedKey { key, input_hash });
        if self.spec.class == ReplayClass::IdempotentWithKey && key.is_none() {
            return Err(DurableError::InvalidEdit {
                call: row.id.clone(),
                tool: self.spec.name.clone(),
                path: "$".into(),
                detail: "an idempotent_with_key tool's `accept_edits` must derive the key from \
                         the edited arguments; nothing ran"
                    .into(),
            });
        }
        Ok((key, Some(Arc::new(effective))))
    }
}

impl Journal {
    /// Journals `call` as awaiting a person's approval: nothing runs.
    async fn request<T, E>(
        &self,
        spec: &ToolSpec,
        call: NewCall,
        mut request: ApprovalRequest,
        mut reservation: Reservation,
    ) -> Result<T, CallError<E>>
    where
        T: DeserializeOwned,
    {
        let secrets = secret::secret_args(&spec.name, &spec.secret_args);
        let schema = request
            .schema
            .take()
            .unwrap_or_else(|| spec.input_schema.clone());
        let secrets: Vec<String> = secrets.into_iter().collect();
        request.schema = Some(crate::approval::recorded_schema(&schema, &secrets));
        request.reasoning = request
            .reasoning
            .take()
            .or_else(|| self.reasoning.as_deref().map(str::to_owned))
            .filter(|text| !text.trim().is_empty())
            .map(|text| crate::approval::cap_reasoning(&text));
        self.failpoint("before_request", &spec.name);
        let lease = self.lease();
        let requested = self
            .inner
            .store
            .request_call(lease.fence(), call, request)
            .await
            .map_err(|e| self.note_store_error(e))?;
        // A requested row hands its ordinal back, as a replay that finds it does: asked
        // again before it is decided, the call maps onto the same row (not a second
        // request). Decided, the row keeps its ordinal on the replay that runs or denies it.
        let row = match requested {
            IssueOutcome::Inserted(row) => {
                reservation.release();
                self.remember(&row).await;
                tracing::Span::current().record(telemetry::DURABLE_CALL_ID, row.id.as_str());
                self.failpoint("after_requested", &spec.name);
                self.emit(self.event(&row, Outcome::ApprovalRequested));
                if let Some(hook) = &self.inner.config.on_approval_requested {
                    hook(&row);
                }
                row
            }
            // Another holder of the same lease raced us: go by its row.
            IssueOutcome::Existing(row) => match protocol::after_insert_race(row.status, true) {
                Action::Replay => {
                    reservation.keep();
                    self.charge(&row);
                    self.emit(self.event(&row, Outcome::CacheHit));
                    return recorded_outcome(&row);
                }
                Action::AwaitApproval => {
                    reservation.release();
                    row
                }
                action => {
                    reservation.release();
                    self.emit(self.event(&row, Outcome::Refused));
                    let refused = DurableError::ReplayUnsafe {
                        call: row.id.clone(),
                        tool: spec.name.clone(),
                        class: spec.class,
                        refused_tool: spec.name.clone(),
                        reason: "another execution of the same call is in flight".into(),
                    };
                    debug_assert_eq!(action, Action::Refuse(Refusal::InFlight));
                    return Err(refused.into());
                }
            },
        };
        Err(DurableError::AwaitingApproval {
            call: row.id,
            tool: spec.name.clone(),
            status: row.status.as_str().to_owned(),
        }
        .into())
    }

    /// Finds the row for this call (loading the step's rows on first use); a row
    /// without an outcome is re-read, as an operator may have decided it since. A row
    /// found is replayed by this attempt: one without an outcome no longer counts against
    /// the divergence check (a recorded one counts once its outcome is delivered, see
    /// `replay_recorded`).
    async fn find(
        &self,
        spec: &ToolSpec,
        hash: String,
    ) -> Result<(CallIdentity, Option<CallRecord>, Reservation), DurableError> {
        let step = self.step();
        let mut cache = self.inner.cache.lock().await;
        self.load_step(&mut cache).await?;
        // Handed back unless a row ends up holding it (see `numbers`).
        let reservation = Reservation::take(&self.inner.state, (spec.name.clone(), hash.clone()));
        let identity = CallIdentity {
            session: self.inner.session.clone(),
            step,
            tool: spec.name.clone(),
            input_hash: hash,
            ordinal: reservation.number(),
        };
        let found = match cache.rows.get(&identity).cloned() {
            None => None,
            Some(row) if row.status.has_outcome() => Some(row),
            Some(row) => {
                let current = self.refresh(&mut cache, &row.id).await?;
                if !current.status.has_outcome() {
                    cache.unreplayed.remove(&current.id);
                }
                Some(current)
            }
        };
        Ok((identity, found, reservation))
    }

    /// Recorded: the row's outcome is returned, whatever the class; nothing runs.
    ///
    /// The row counts as replayed only once its outcome was delivered: one that fails
    /// its integrity check or no longer decodes into today's type was not seen by the
    /// harness, so the step has left the first attempt's path (its calls with a side
    /// effect that match no record are refused as diverged) and cannot end past it.
    async fn replay_recorded<T: DeserializeOwned, E>(
        &self,
        row: CallRecord,
        mut reservation: Reservation,
    ) -> Result<T, CallError<E>> {
        reservation.keep();
        tracing::Span::current().record(telemetry::DURABLE_CALL_ID, row.id.as_str());
        // The store checked the row's seal when it read it (a broken seal fails the read).
        let delivered = recorded_outcome::<T, E>(&row);
        let undelivered = matches!(&delivered, Err(CallError::Durable(_)));
        {
            let mut cache = self.inner.cache.lock().await;
            if undelivered {
                cache.diverged |= cache.unreplayed.contains(&row.id);
            } else {
                cache.unreplayed.remove(&row.id);
            }
        }
        if undelivered {
            return delivered;
        }
        self.charge(&row);
        let outcome = if row.status == CallStatus::Resolved {
            Outcome::Resolved
        } else {
            Outcome::CacheHit
        };
        self.emit(self.event(&row, outcome));
        delivered
    }

    fn context(&self, row: &CallRecord) -> ToolContext {
        ToolContext {
            session: self.inner.session.clone(),
            call: row.id.clone(),
            identity: row.identity.clone(),
            class: row.class,
            attempt: row.attempt,
            idempotency_key: row.idempotency_key.clone(),
            spend: Arc::new(Mutex::new(None)),
            edited: None,
        }
    }

    async fn reissue(
        &self,
        row: &CallRecord,
    ) -> Result<(CallRecord, IssuedHere<'_>), DurableError> {
        let lease = self.lease();
        let row = match self.inner.store.reissue_call(lease.fence(), &row.id).await {
            Ok(row) => row,
            // Cancelled since this worker last looked: nothing runs again, and the
            // session ends as `cancelled` under this lease.
            Err(StoreError::CancelRequested { by, reason, at, .. }) => {
                self.note_cancel(CancelRequest { by, reason, at });
                return Err(self.refuse_cancelled().await);
            }
            Err(e) => return Err(self.note_store_error(e)),
        };
        let running = IssuedHere::new(self, &row);
        self.remember(&row).await;
        Ok((row, running))
    }

    /// Records `outcome` on an issued row and reports `event`. The call of a
    /// `checkpoint_after` scope leaves it to the session instead, which records it with
    /// its checkpoint in one transaction (not while the step has recorded effects this
    /// re-run has not replayed: the session's own checkpoint then refuses to end the step).
    async fn record_outcome(
        &self,
        row: &CallRecord,
        outcome: CallOutcome,
        spend: Option<Spend>,
        event: Outcome,
        scope: Option<&mut ScopeClaim>,
    ) -> Result<(), DurableError> {
        if let Some(claim) = scope
            && self.scope_claimed()
            && self.step_replayed().await
        {
            // Decided: the session records it with its checkpoint, after this span.
            telemetry::record_outcome(event);
            // Ours until the session records it (or hands it to the barrier).
            {
                let mut state = self.state();
                state.issued_here.insert(row.id.clone());
                state.doubts.retain(|r| r.id != row.id);
            }
            claim.outcome = Some(ScopeOutcome::Executed(Box::new(Executed {
                row: row.clone(),
                outcome,
                spend,
                event,
            })));
            return Ok(());
        }
        let (finished, _) = self.write_outcome(row, outcome, spend, None).await?;
        self.emit(self.event(&finished, event));
        Ok(())
    }

    /// Writes `outcome` on an issued row, with `checkpoint` in the same transaction.
    pub(super) async fn write_outcome(
        &self,
        row: &CallRecord,
        outcome: CallOutcome,
        spend: Option<Spend>,
        checkpoint: Option<(i64, NewCheckpoint)>,
    ) -> Result<(CallRecord, Option<CheckpointMeta>), DurableError> {
        let spend_value = super::spend_json(spend);
        // The finished row, as the store now holds it (no read-back: one round trip less
        // on the hot path; `finished_at` is the store's and not needed here).
        let mut finished = row.clone();
        finished.spend = spend_value.clone();
        match &outcome {
            CallOutcome::Completed(v) => {
                finished.status = CallStatus::Completed;
                finished.result = Some(v.clone());
            }
            CallOutcome::Failed(v) => {
                finished.status = CallStatus::Failed;
                finished.error = Some(v.clone());
            }
        }
        let lease = self.lease();
        let meta = self
            .inner
            .store
            .finish_call(
                lease.fence(),
                &row.id,
                FinishCall {
                    outcome,
                    spend: spend_value,
                },
                checkpoint,
            )
            .await
            .map_err(|e| self.note_store_error(e))?;
        self.failpoint("after_result", &row.identity.tool);
        self.settled(&row.id);
        self.charge(&finished);
        self.remember(&finished).await;
        Ok((finished, meta))
    }

    /// Runs the tool (with its retry policy) on an issued row and records the outcome.
    async fn execute<T, E, B>(
        &self,
        spec: &ToolSpec,
        row: CallRecord,
        run: &mut B,
        execution: Execution,
        running: IssuedHere<'_>,
        scope: Option<&mut ScopeClaim>,
    ) -> Result<T, CallError<E>>
    where
        T: Recordable,
        E: Display,
        B: Body<T, E>,
    {
        // Until its outcome is recorded, this row is ours; if this future is dropped or
        // the outcome cannot be recorded, `running` hands it over to the barrier.
        let Execution { outcome, edited } = execution;
        // The write that issued the row may have returned after this worker's lease ran
        // out (the process paused after the commit): another worker may hold the session
        // and have settled the call by now. Nothing runs then; the row is in doubt, as
        // after a crash.
        if !crate::guard_switch::guard_off("lease_recheck") {
            self.check_lease().inspect_err(super::refused_span)?;
        }
        let mut ctx = self.context(&row);
        ctx.edited = edited;
        let (result, spend) = self.run_with_retry(spec, ctx, run).await;
        self.failpoint("after_effect", &spec.name);
        let (recorded, returned) = match result {
            // The effect ran and its result cannot be stored: recorded as the call's
            // failure, so no replay runs it again.
            Ok(value) if let Err(too_large) = self.check_result(&row, &value) => (
                CallOutcome::Failed(crate::sizes::recorded_failure(&too_large)),
                Err(CallError::Durable(too_large)),
            ),
            Ok(value) => (
                CallOutcome::Completed(encode_result(spec, &value)?),
                Ok(value),
            ),
            Err(e) => (
                CallOutcome::Failed(json!({ "message": e.to_string() })),
                Err(CallError::Tool(e)),
            ),
        };
        self.record_outcome(&row, recorded, spend, outcome, scope)
            .await?;
        // Recorded, or handed to the scope's session: no longer the guard's.
        running.disarm();
        returned
    }

    /// `pure`, no record: run, then record the outcome in one commit.
    async fn execute_pure<T, E, B>(
        &self,
        spec: &ToolSpec,
        call: NewCall,
        run: &mut B,
        reservation: &mut Reservation,
    ) -> Result<T, CallError<E>>
    where
        T: Recordable,
        E: Display,
        B: Body<T, E>,
    {
        let ctx = ToolContext {
            session: self.inner.session.clone(),
            call: call.id.clone(),
            identity: call.identity.clone(),
            class: call.class,
            attempt: 1,
            idempotency_key: None,
            spend: Arc::new(Mutex::new(None)),
            edited: None,
        };
        tracing::Span::current().record(telemetry::DURABLE_CALL_ID, call.id.as_str());
        let (result, spend) = self.run_with_retry(spec, ctx, run).await;
        let (outcome, tool_err) = match result {
            Ok(value)
                if let Err(too_large) = self.check_result_of(&call.id, &call.identity, &value) =>
            {
                (
                    CallOutcome::Failed(crate::sizes::recorded_failure(&too_large)),
                    Err(CallError::Durable(too_large)),
                )
            }
            Ok(value) => (
                CallOutcome::Completed(encode_result(spec, &value)?),
                Ok(value),
            ),
            Err(e) => (
                CallOutcome::Failed(json!({ "message": e.to_string() })),
                Err(CallError::Tool(e)),
            ),
        };
        let recorded = self.record(call, outcome, spend).await?;
        reservation.keep();
        let (row, fresh) = match recorded {
            IssueOutcome::Inserted(row) => (row, true),
            IssueOutcome::Existing(row) => (row, false),
        };
        self.failpoint("after_result", &spec.name);
        self.charge(&row);
        self.remember(&row).await;
        if fresh {
            self.emit(self.event(&row, Outcome::Executed));
            tool_err
        } else {
            self.emit(self.event(&row, Outcome::CacheHit));
            recorded_outcome(&row)
        }
    }

    async fn run_with_retry<T, E, B>(
        &self,
        spec: &ToolSpec,
        ctx: ToolContext,
        run: &mut B,
    ) -> (Result<T, E>, Option<Spend>)
    where
        E: Display,
        B: Body<T, E>,
    {
        let spend_slot = Arc::clone(&ctx.spend);
        let policy = spec.retry.as_ref().filter(|_| spec.class.allows_retry());
        let limit = spec.rate_limit.as_deref().or(self.tool_limit.as_deref());
        let mut attempt: u32 = 0;
        loop {
            let mut this = ctx.clone();
            this.attempt = this_attempt(ctx.attempt, attempt);
            if let Some(limit) = limit.filter(|_| attempt > 0) {
                // Every retry reaches the upstream again: it takes a turn of its own,
                // waited for in memory as the retry's delay is (the first attempt took
                // its turn before the call was issued).
                let waiter = format!(
                    "{}/retry{attempt}",
                    super::limit::waiter_id(&ctx.identity, 1)
                );
                if let Err(error) = self.take_turn(limit, waiter, None).await {
                    tracing::warn!(tool = %spec.name, limit, %error, "could not take a retry's turn under its rate limit; retrying without it");
                }
            }
            let result = run.start(this).await;
            match (result, policy) {
                (Err(e), Some(policy)) if attempt + 1 < policy.effective_max_attempts() => {
                    tracing::warn!(tool = %spec.name, attempt = attempt + 1, error = %e, "tool failed; retrying per its policy");
                    // Retry history, as for model calls: one `errors` row per failed attempt.
                    let record = NewError {
                        session: ctx.session.clone(),
                        step: ctx.identity.step,
                        context: format!("tool:{}#{}", spec.name, ctx.identity.ordinal),
                        attempt: this_attempt(ctx.attempt, attempt),
                        message: e.to_string(),
                    };
                    if let Err(store_error) = self.inner.store.record_error(record).await {
                        tracing::warn!(error = %store_error, "could not record a failed tool attempt");
                    }
                    tokio::time::sleep(policy.delay_for(attempt)).await;
                    attempt += 1;
                }
                (result, _) => {
                    let spend = lock(&spend_slot).take();
                    return (result, spend);
                }
            }
        }
    }
}

/// How an issued row is executed: what the run is reported as, and the arguments a
/// person edited before approving it, if any.
struct Execution {
    outcome: Outcome,
    edited: Option<Arc<Value>>,
}

impl Execution {
    /// A first execution with the call's own arguments.
    fn fresh() -> Self {
        Execution {
            outcome: Outcome::Executed,
            edited: None,
        }
    }
}

/// A tool's result as the journal records it: checked like every value that enters the
/// journal (a non-finite float is refused, and nothing is recorded).
fn encode_result<T: Serialize>(spec: &ToolSpec, value: &T) -> Result<Value, DurableError> {
    crate::encode::encode(value, format_args!("result of `{}`", spec.name))
}

pub(super) fn decode_result<T: DeserializeOwned, E>(
    row: &CallRecord,
    value: Option<&Value>,
) -> Result<T, CallError<E>> {
    let value = value.cloned().unwrap_or(Value::Null);
    serde_json::from_value(value).map_err(|e| {
        CallError::Durable(DurableError::Decode {
            session: row.identity.session.clone(),
            what: format!("result of call `{}` (`{}`)", row.id, row.identity.tool),
            detail: e.to_string(),
        })
    })
}

/// The attempt a retry runs as: the row's attempt plus the retries within this execution.
fn this_attempt(row_attempt: i32, retries: u32) -> i32 {
    row_attempt.saturating_add(i32::try_from(retries).unwrap_or(i32::MAX))
}

/// What a row with an outcome returns: its result, or its recorded failure.
fn recorded_outcome<T: DeserializeOwned, E>(row: &CallRecord) -> Result<T, CallError<E>> {
    match row.status {
        // A denial (by a person or a deadline) is the call's recorded failure.
        CallStatus::Failed | CallStatus::Denied => {
            // A result that was too large to store comes back as the same typed error.
            let too_large = (row.status == CallStatus::Failed)
                .then(|| crate::sizes::from_recorded(row.error.as_ref(), || result_of(row)))
                .flatten();
            Err(match too_large {
                Some(error) => CallError::Durable(error),
                None => CallError::Recorded(RecordedFailure {
                    message: failure_message(row.error.as_ref()),
                }),
            })
        }
        _ => decode_result(row, row.result.as_ref()),
    }
}

/// What a [`TooLarge`](DurableError::TooLarge) result of `row`'s call names.
fn result_of(row: &CallRecord) -> crate::sizes::Oversized {
    oversized_result(&row.id, &row.identity)
}

fn oversized_result(call: &CallId, identity: &CallIdentity) -> crate::sizes::Oversized {
    crate::sizes::Oversized::ToolResult {
        session: identity.session.clone(),
        step: identity.step,
        tool: identity.tool.clone(),
        call: call.clone(),
    }
}

impl Journal {
    /// Refuses a result of `row`'s call above [`SizeLimits::max_result_bytes`](crate::sizes::SizeLimits).
    fn check_result<T: Serialize>(&self, row: &CallRecord, value: &T) -> Result<(), DurableError> {
        self.check_result_of(&row.id, &row.identity, value)
    }

    fn check_result_of<T: Serialize>(
        &self,
        call: &CallId,
        identity: &CallIdentity,
        value: &T,
    ) -> Result<(), DurableError> {
        crate::sizes::check(value, self.inner.config.sizes.max_result_bytes, || {
            oversized_result(call, identity)
        })
    }
}

/// Marks a row as being executed by this journal (so the barrier leaves it to us) for as
/// long as the guard lives. Dropped before its outcome was recorded, the row is nobody's:
/// if it is an `unsafe_on_replay` call, it is in doubt, and the session-wide barrier
/// refuses every call with a side effect beside it until it is settled.
pub(super) struct IssuedHere<'j> {
    journal: &'j Journal,
    row: CallRecord,
    armed: bool,
}

impl<'j> IssuedHere<'j> {
    fn new(journal: &'j Journal, row: &CallRecord) -> Self {
        let mut state = journal.state();
        state.issued_here.insert(row.id.clone());
        // Ours now, not in doubt (it may come back there when this guard drops).
        state.doubts.retain(|r| r.id != row.id);
        drop(state);
        // A sibling of its batch waiting at the barrier looks again.
        journal.decided();
        IssuedHere {
            journal,
            row: row.clone(),
            armed: true,
        }
    }

    /// The outcome was recorded, or handed over to a `checkpoint_after` scope.
    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for IssuedHere<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.journal.hand_to_barrier(&self.row);
        }
    }
}

/// The `execute_tool` span of a call of `spec` (see [`telemetry`]).
fn tool_span(journal: &Journal, spec: &ToolSpec, call_id: Option<&str>) -> tracing::Span {
    tracing::info_span!(
        telemetry::EXECUTE_TOOL,
        { telemetry::OTEL_NAME } = %format_args!("{} {}", telemetry::OPERATION_EXECUTE_TOOL, spec.name),
        { telemetry::GEN_AI_OPERATION_NAME } = telemetry::OPERATION_EXECUTE_TOOL,
        { telemetry::GEN_AI_TOOL_NAME } = spec.name.as_str(),
        { telemetry::GEN_AI_TOOL_TYPE } = telemetry::TOOL_TYPE_FUNCTION,
        { telemetry::GEN_AI_TOOL_CALL_ID } = call_id,
        { telemetry::GEN_AI_CONVERSATION_ID } = journal.inner.session.as_str(),
        { telemetry::DURABLE_REPLAY_CLASS } = spec.class.as_str(),
        { telemetry::DURABLE_STEP } = journal.step(),
        { telemetry::DURABLE_REPLAY_OUTCOME } = tracing::field::Empty,
        { telemetry::DURABLE_CALL_OUTCOME } = tracing::field::Empty,
        { telemetry::DURABLE_CALL_ID } = tracing::field::Empty,
        { telemetry::ERROR_TYPE } = tracing::field::Empty,
        { telemetry::DURABLE_RATE_LIMIT } = tracing::field::Empty,
        { telemetry::DURABLE_RATE_LIMIT_WAIT_MS } = tracing::field::Empty,
        { telemetry::DURABLE_BUDGET_LIMIT } = tracing::field::Empty,
        { telemetry::DURABLE_BUDGET_SPENT } = tracing::field::Empty,
        { telemetry::DURABLE_BUDGET_CEILING } = tracing::field::Empty,
    )
}
