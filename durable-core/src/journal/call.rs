//! One tool call through the journal: the decision table (recorded → returned; in doubt
//! → re-executed, re-executed with the recorded key, verified or refused; no record →
//! issued, executed, recorded) and the execution paths behind it.

use std::fmt::Display;
use std::future::Future;
use std::sync::{Arc, Mutex};

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tracing::Instrument;

use super::numbers::Reservation;
use super::{CallError, CallEvent, Journal, Outcome, PendingCommit, RecordedFailure, lock};
use crate::error::DurableError;
use crate::ids::CallId;
use crate::key;
use crate::replay::ReplayClass;
use crate::snapshot::Spend;
use crate::store::{
    CallIdentity, CallKind, CallOutcome, CallRecord, CallStatus, FinishCall, IssueOutcome, NewCall,
    NewError,
};
use crate::tool::{ToolContext, ToolSpec, Verification};

/// A tool call being built: see [`Journal::tool`].
#[must_use = "a tool call does nothing until `.run(...)` is awaited"]
pub struct ToolCall<'j> {
    pub(super) journal: &'j Journal,
    pub(super) spec: &'j ToolSpec,
    pub(super) args: Value,
    pub(super) key: Option<String>,
}

/// What `prepare` decided before anything ran.
enum Plan {
    /// A row holds an outcome: return it.
    Recorded(CallRecord),
    /// An issued row from an earlier attempt (or a `not_happened` resolution).
    InDoubt(CallRecord),
    /// No row.
    Fresh,
}

impl<'j> ToolCall<'j> {
    /// Sets the idempotency key (required for `idempotent_with_key` tools).
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Runs the call through the journal with no verify hook.
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
        let span = tracing::info_span!(
            "execute_tool",
            otel.name = %format!("execute_tool {}", self.spec.name),
            gen_ai.operation.name = "execute_tool",
            gen_ai.tool.name = %self.spec.name,
            durable.replay.class = self.spec.class.as_str(),
            durable.replay.outcome = tracing::field::Empty,
            durable.call.id = tracing::field::Empty,
        );
        let journal = self.journal;
        let spec = self.spec;
        let Some(mut commit) = journal.claim_commit(&spec.name)? else {
            return self.run_inner(run, verify, None).instrument(span).await;
        };
        let result = self
            .run_inner(run, verify, Some(&mut commit))
            .instrument(span)
            .await;
        if !commit.has_message() && commit.error.is_none() {
            // An outcome that wrote nothing with a checkpoint (a recorded result returned,
            // a `pure` call's single insert): make the message; the session writes it.
            match &result {
                Ok(value) => match encode_result(spec, value) {
                    Ok(encoded) => {
                        commit.message(Ok(&encoded));
                    }
                    Err(e) => commit.error = Some(e),
                },
                Err(CallError::Tool(e)) => {
                    commit.message(Err(&e.to_string()));
                }
                Err(CallError::Recorded(failure)) => {
                    commit.message(Err(&failure.message));
                }
                Err(CallError::Durable(_)) => {}
            }
        }
        journal.return_commit(commit);
        result
    }

    async fn run_inner<T, E, F, Fut, V, VFut>(
        self,
        mut run: F,
        verify: V,
        commit: Option<&mut PendingCommit>,
    ) -> Result<T, CallError<E>>
    where
        T: Serialize + DeserializeOwned,
        E: Display,
        F: FnMut(ToolContext) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        V: FnOnce(ToolContext) -> VFut,
        VFut: Future<Output = Verification<T>>,
    {
        let journal = self.journal;
        let spec = self.spec;
        journal.check_lease()?;
        let limits = journal.inner.config.limits;
        key::check_value(&self.args, &limits).map_err(|source| DurableError::InvalidArguments {
            tool: spec.name.clone(),
            source,
        })?;
        let hash =
            key::input_hash(&self.args).map_err(|source| DurableError::InvalidArguments {
                tool: spec.name.clone(),
                source,
            })?;
        if spec.class == ReplayClass::IdempotentWithKey && self.key.is_none() {
            return Err(DurableError::Encode {
                what: format!("call of `{}`", spec.name),
                detail: "an idempotent_with_key tool needs an idempotency key: call `.key(...)`"
                    .into(),
            }
            .into());
        }
        let step = journal.step();
        let (identity, plan, orphan, mut reservation) = {
            let mut cache = journal.inner.cache.lock().await;
            journal.load_step(&mut cache).await?;
            // Handed back unless a row ends up holding it (see `numbers`).
            let reservation =
                Reservation::take(&journal.inner.numbers, (spec.name.clone(), hash.clone()));
            let identity = CallIdentity {
                session: journal.inner.session.clone(),
                step,
                tool: spec.name.clone(),
                input_hash: hash,
                ordinal: reservation.number(),
            };
            let mut plan = match cache.rows.get(&identity) {
                Some(row) if row.status.has_outcome() => Plan::Recorded(row.clone()),
                Some(row) => Plan::InDoubt(row.clone()),
                None => Plan::Fresh,
            };
            if let Plan::InDoubt(row) = &plan {
                // An operator may have resolved it since the step was loaded.
                let current = journal.refresh(&mut cache, &row.id).await?;
                if current.status.has_outcome() {
                    plan = Plan::Recorded(current);
                } else {
                    plan = Plan::InDoubt(current);
                }
            }
            let orphan = if matches!(plan, Plan::Fresh) && spec.class != ReplayClass::Pure {
                journal.find_orphan(&mut cache).await?
            } else {
                None
            };
            (identity, plan, orphan, reservation)
        };

        match plan {
            // Row has an outcome: return it, whatever the class.
            Plan::Recorded(row) => {
                reservation.keep();
                tracing::Span::current().record("durable.call.id", row.id.as_str());
                journal.verify_mac(&row)?;
                journal.charge(&row);
                let outcome = if row.status == CallStatus::Resolved {
                    Outcome::Resolved
                } else {
                    Outcome::CacheHit
                };
                journal.emit(journal.event(&row, outcome));
                recorded_outcome(&row)
            }
            Plan::InDoubt(row) => {
                tracing::Span::current().record("durable.call.id", row.id.as_str());
                if row.schema_hash != spec.fingerprint && !row.schema_hash.is_empty() {
                    return Err(DurableError::SchemaChanged {
                        tool: spec.name.clone(),
                        call: row.id.clone(),
                        recorded: row.schema_hash.clone(),
                        current: spec.fingerprint.clone(),
                    }
                    .into());
                }
                // The row holds this ordinal whatever happens now, except when the call
                // is refused below: then a retry must map onto the same row again.
                reservation.keep();
                let not_happened = row.status == CallStatus::NotHappened;
                match spec.class {
                    _ if not_happened => {
                        journal.ensure_durable(spec).await?;
                        let (row, running) = journal.reissue(&row).await?;
                        journal
                            .execute(spec, row, &mut run, Outcome::ReExecuted, running, commit)
                            .await
                    }
                    ReplayClass::Pure => {
                        let (row, running) = journal.reissue(&row).await?;
                        journal
                            .execute(spec, row, &mut run, Outcome::ReExecuted, running, commit)
                            .await
                    }
                    ReplayClass::IdempotentWithKey => {
                        if row.idempotency_key != self.key {
                            tracing::warn!(
                                recorded = ?row.idempotency_key, derived = ?self.key,
                                "idempotency key derived now differs from the recorded one; re-executing with the recorded key"
                            );
                        }
                        let (row, running) = journal.reissue(&row).await?;
                        journal
                            .execute(
                                spec,
                                row,
                                &mut run,
                                Outcome::ReExecutedWithKey,
                                running,
                                commit,
                            )
                            .await
                    }
                    ReplayClass::UnsafeOnReplay => {
                        let ctx = journal.context(&row);
                        match verify(ctx).await {
                            Verification::Happened(value) => {
                                let result = encode_result(spec, &value)?;
                                let row = journal
                                    .finish(&row, CallOutcome::Completed(result), None, commit)
                                    .await?;
                                journal.emit(journal.event(&row, Outcome::VerifiedHappened));
                                Ok(value)
                            }
                            Verification::DidNotHappen => {
                                journal.ensure_durable(spec).await?;
                                let (row, running) = journal.reissue(&row).await?;
                                journal
                                    .execute(
                                        spec,
                                        row,
                                        &mut run,
                                        Outcome::VerifiedNotHappened,
                                        running,
                                        commit,
                                    )
                                    .await
                            }
                            Verification::Unknown => {
                                reservation.release();
                                journal.emit(journal.event(&row, Outcome::Refused));
                                Err(DurableError::ReplayUnsafe {
                                    call: row.id.clone(),
                                    tool: spec.name.clone(),
                                    class: spec.class,
                                    reason: if spec.has_verify {
                                        "its verify hook could not tell whether the effect happened".into()
                                    } else {
                                        "the tool has no verify hook, and re-running it could repeat the effect".into()
                                    },
                                }
                                .into())
                            }
                        }
                    }
                }
            }
            Plan::Fresh => {
                if let Some(orphan) = orphan {
                    // `reservation` is dropped: nothing holds this ordinal.
                    journal.emit(CallEvent {
                        session: journal.inner.session.clone(),
                        call: None,
                        tool: spec.name.clone(),
                        class: spec.class,
                        outcome: Outcome::Refused,
                        idempotency_key: self.key.clone(),
                        step,
                    });
                    return Err(DurableError::ReplayUnsafe {
                        call: orphan.id.clone(),
                        tool: orphan.identity.tool.clone(),
                        class: orphan.class,
                        reason: format!(
                            "this step was re-run and now asks for `{}` with arguments that match no recorded call; \
                             no side effect may run beside an unresolved unsafe call",
                            spec.name
                        ),
                    }
                    .into());
                }
                let stored_args = mask_secrets(spec, &self.args);
                let call = NewCall {
                    id: CallId::random(),
                    kind: CallKind::Tool,
                    identity: identity.clone(),
                    class: spec.class,
                    args: stored_args,
                    idempotency_key: self.key.clone(),
                    schema_hash: spec.fingerprint.clone(),
                };
                if spec.class == ReplayClass::Pure {
                    return journal
                        .execute_pure(spec, call, &mut run, &mut reservation)
                        .await;
                }
                journal.ensure_durable(spec).await?;
                journal.failpoint("before_issue", &spec.name);
                let lease = journal.lease();
                let issued = journal
                    .inner
                    .store
                    .issue_call(lease.fence(), call)
                    .await
                    .map_err(|e| journal.note_store_error(e))?;
                reservation.keep();
                match issued {
                    IssueOutcome::Inserted(row) => {
                        let running = IssuedHere::new(journal, &row.id);
                        journal
                            .inner
                            .cache
                            .lock()
                            .await
                            .rows
                            .insert(identity, row.clone());
                        tracing::Span::current().record("durable.call.id", row.id.as_str());
                        journal.failpoint("after_issued", &spec.name);
                        journal
                            .execute(spec, row, &mut run, Outcome::Executed, running, commit)
                            .await
                    }
                    IssueOutcome::Existing(row) => {
                        // Someone recorded this identity between our read and write: only
                        // possible if another holder of the same lease raced us. Return its
                        // outcome if any; otherwise refuse rather than run twice.
                        if row.status.has_outcome() {
                            journal.verify_mac(&row)?;
                            journal.charge(&row);
                            journal.emit(journal.event(&row, Outcome::CacheHit));
                            recorded_outcome(&row)
                        } else {
                            Err(DurableError::ReplayUnsafe {
                                call: row.id.clone(),
                                tool: spec.name.clone(),
                                class: spec.class,
                                reason: "another execution of the same call is in flight".into(),
                            }
                            .into())
                        }
                    }
                }
            }
        }
    }
}

impl Journal {
    fn context(&self, row: &CallRecord) -> ToolContext {
        ToolContext {
            session: self.inner.session.clone(),
            call: row.id.clone(),
            identity: row.identity.clone(),
            class: row.class,
            attempt: row.attempt,
            idempotency_key: row.idempotency_key.clone(),
            spend: Arc::new(Mutex::new(None)),
        }
    }

    async fn reissue(
        &self,
        row: &CallRecord,
    ) -> Result<(CallRecord, IssuedHere<'_>), DurableError> {
        let lease = self.lease();
        let row = self
            .inner
            .store
            .reissue_call(lease.fence(), &row.id)
            .await
            .map_err(|e| self.note_store_error(e))?;
        let running = IssuedHere::new(self, &row.id);
        self.inner
            .cache
            .lock()
            .await
            .rows
            .insert(row.identity.clone(), row.clone());
        Ok((row, running))
    }

    /// Records `outcome` on an issued row; with `commit`, the checkpoint made of the
    /// outcome goes in the same transaction.
    async fn finish(
        &self,
        row: &CallRecord,
        outcome: CallOutcome,
        spend: Option<Spend>,
        commit: Option<&mut PendingCommit>,
    ) -> Result<CallRecord, DurableError> {
        let mac = self.mac_for(&row.id, &outcome);
        let spend_value = super::spend_json(spend.clone());
        // The finished row, as the store now holds it (no read-back: one round trip less
        // on the hot path; `finished_at` is the store's and not needed here).
        let mut finished = row.clone();
        finished.spend = spend_value.clone();
        finished.mac = mac.clone();
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
        // With a scope's commit (still claimed: not if its scope closed meanwhile), the
        // checkpoint made of this outcome goes in the same transaction.
        let (checkpoint, commit) = match commit {
            Some(commit) if self.scope_claimed() => {
                let mut spends = self.pending_spend();
                spends.extend(spend.clone());
                let message = match &outcome {
                    CallOutcome::Completed(v) => commit.message(Ok(v)),
                    CallOutcome::Failed(v) => commit.message(Err(&failure_message(Some(v)))),
                };
                let checkpoint = message.and_then(|m| commit.checkpoint(m, &spends));
                (checkpoint, Some(commit))
            }
            _ => (None, None),
        };
        // If this future is dropped mid-write, the checkpoint may or may not have
        // committed: the handle refuses to go on, as after an interrupted `checkpoint()`.
        // Once it committed, the flag stays until the session has adopted the new version
        // (`Session::checkpoint_after`): a handle dropped in between refuses too.
        let writing = checkpoint.as_ref().map(|(expected, _)| expected + 1);
        if writing.is_some() {
            self.set_checkpoint_in_doubt(writing);
        }
        let lease = self.lease();
        let written = self
            .inner
            .store
            .finish_call(
                lease.fence(),
                &row.id,
                FinishCall {
                    outcome,
                    spend: spend_value,
                    mac,
                },
                checkpoint,
            )
            .await;
        let meta = match written {
            Ok(meta) => meta,
            Err(e) => {
                if let Some(commit) = commit {
                    commit.withdraw();
                    self.set_checkpoint_in_doubt(None);
                }
                return Err(self.note_store_error(e));
            }
        };
        if let (Some(commit), Some(meta)) = (commit, meta) {
            commit.committed = Some(meta);
        }
        self.failpoint("after_result", &row.identity.tool);
        self.charge(&finished);
        self.inner
            .cache
            .lock()
            .await
            .rows
            .insert(finished.identity.clone(), finished.clone());
        Ok(finished)
    }

    /// Runs the tool (with its retry policy) on an issued row and records the outcome.
    async fn execute<T, E, F, Fut>(
        &self,
        spec: &ToolSpec,
        row: CallRecord,
        run: &mut F,
        outcome: Outcome,
        running: IssuedHere<'_>,
        commit: Option<&mut PendingCommit>,
    ) -> Result<T, CallError<E>>
    where
        T: Serialize + DeserializeOwned,
        E: Display,
        F: FnMut(ToolContext) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        // Until its outcome is recorded, this row is ours; if this future is dropped or
        // the outcome cannot be recorded, `running` hands it over to the orphan rule.
        let _running = running;
        let ctx = self.context(&row);
        let (result, spend) = self.run_with_retry(spec, ctx, run).await;
        self.failpoint("after_effect", &spec.name);
        match result {
            Ok(value) => {
                let encoded = encode_result(spec, &value)?;
                let row = self
                    .finish(&row, CallOutcome::Completed(encoded), spend, commit)
                    .await?;
                self.emit(self.event(&row, outcome));
                Ok(value)
            }
            Err(e) => {
                let row = self
                    .finish(
                        &row,
                        CallOutcome::Failed(json!({ "message": e.to_string() })),
                        spend,
                        commit,
                    )
                    .await?;
                self.emit(self.event(&row, outcome));
                Err(CallError::Tool(e))
            }
        }
    }

    /// `pure`, no record: run, then record the outcome in one commit.
    async fn execute_pure<T, E, F, Fut>(
        &self,
        spec: &ToolSpec,
        call: NewCall,
        run: &mut F,
        reservation: &mut Reservation,
    ) -> Result<T, CallError<E>>
    where
        T: Serialize + DeserializeOwned,
        E: Display,
        F: FnMut(ToolContext) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let ctx = ToolContext {
            session: self.inner.session.clone(),
            call: call.id.clone(),
            identity: call.identity.clone(),
            class: call.class,
            attempt: 1,
            idempotency_key: None,
            spend: Arc::new(Mutex::new(None)),
        };
        tracing::Span::current().record("durable.call.id", call.id.as_str());
        let (result, spend) = self.run_with_retry(spec, ctx, run).await;
        let (outcome, tool_err) = match result {
            Ok(value) => (
                CallOutcome::Completed(encode_result(spec, &value)?),
                Ok(value),
            ),
            Err(e) => (
                CallOutcome::Failed(json!({ "message": e.to_string() })),
                Err(e),
            ),
        };
        let identity = call.identity.clone();
        let recorded = self.record(call, outcome, spend).await?;
        reservation.keep();
        let (row, fresh) = match recorded {
            IssueOutcome::Inserted(row) => (row, true),
            IssueOutcome::Existing(row) => (row, false),
        };
        self.failpoint("after_result", &spec.name);
        self.charge(&row);
        self.inner
            .cache
            .lock()
            .await
            .rows
            .insert(identity, row.clone());
        if fresh {
            self.emit(self.event(&row, Outcome::Executed));
            tool_err.map_err(CallError::Tool)
        } else {
            self.emit(self.event(&row, Outcome::CacheHit));
            match row.status {
                CallStatus::Failed => Err(CallError::Recorded(RecordedFailure {
                    message: failure_message(row.error.as_ref()),
                })),
                _ => decode_result(&row, row.result.as_ref()),
            }
        }
    }

    async fn run_with_retry<T, E, F, Fut>(
        &self,
        spec: &ToolSpec,
        ctx: ToolContext,
        run: &mut F,
    ) -> (Result<T, E>, Option<Spend>)
    where
        E: Display,
        F: FnMut(ToolContext) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let spend_slot = Arc::clone(&ctx.spend);
        let policy = spec.retry.as_ref().filter(|_| spec.class.allows_retry());
        let mut attempt: u32 = 0;
        loop {
            let mut this = ctx.clone();
            this.attempt = this_attempt(ctx.attempt, attempt);
            let result = run(this).await;
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

fn encode_result<T: Serialize>(spec: &ToolSpec, value: &T) -> Result<Value, DurableError> {
    serde_json::to_value(value).map_err(|e| DurableError::Encode {
        what: format!("result of `{}`", spec.name),
        detail: e.to_string(),
    })
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

/// Replaces secret top-level arguments by a hash of their canonical value.
fn mask_secrets(spec: &ToolSpec, args: &Value) -> Value {
    if spec.secret_args.is_empty() {
        return args.clone();
    }
    let mut masked = args.clone();
    if let Value::Object(map) = &mut masked {
        for name in &spec.secret_args {
            if let Some(v) = map.get_mut(name) {
                let digest = key::input_hash(v).unwrap_or_else(|_| "unhashable".into());
                *v = json!({ "$secret": digest });
            }
        }
    }
    masked
}

/// The attempt a retry runs as: the row's attempt plus the retries within this execution.
fn this_attempt(row_attempt: i32, retries: u32) -> i32 {
    row_attempt.saturating_add(i32::try_from(retries).unwrap_or(i32::MAX))
}

/// What a row with an outcome returns: its result, or its recorded failure.
fn recorded_outcome<T: DeserializeOwned, E>(row: &CallRecord) -> Result<T, CallError<E>> {
    match row.status {
        CallStatus::Failed => Err(CallError::Recorded(RecordedFailure {
            message: failure_message(row.error.as_ref()),
        })),
        _ => decode_result(row, row.result.as_ref()),
    }
}

/// Marks a row as being executed by this journal (so the orphan rule leaves it to us)
/// for as long as the guard lives; dropped, the row is nobody's, and if it is still
/// `issued` the orphan rule refuses any effect beside it.
pub(super) struct IssuedHere<'j> {
    journal: &'j Journal,
    id: CallId,
}

impl<'j> IssuedHere<'j> {
    fn new(journal: &'j Journal, id: &CallId) -> Self {
        lock(&journal.inner.issued_here).insert(id.clone());
        IssuedHere {
            journal,
            id: id.clone(),
        }
    }
}

impl Drop for IssuedHere<'_> {
    fn drop(&mut self) {
        lock(&self.journal.inner.issued_here).remove(&self.id);
    }
}
