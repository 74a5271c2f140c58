//! Model responses in the journal: a model call is a non-deterministic step, so its
//! response is recorded (keyed by its position in the step, not by prompt) before any
//! tool call it asks for runs, and a re-run turn gets the recorded response back
//! instead of asking the model again.

use std::fmt::Display;
use std::future::Future;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tracing::Instrument;

use super::call::decode_result;
use super::ordinals::Reservation;
use super::{CallError, Journal, MODEL_SLOT, Outcome};
use crate::error::DurableError;
use crate::ids::CallId;
use crate::replay::ReplayClass;
use crate::snapshot::Spend;
use crate::store::{
    CallIdentity, CallKind, CallOutcome, CallRecord, CallStatus, IssueOutcome, NewCall,
};
use crate::telemetry;

/// Where the reply at the next model position of a step stands.
pub(super) enum Begun {
    /// Recorded by an earlier run: returned, the model is not asked.
    Recorded(Box<CallRecord>, Reservation),
    /// Not recorded: the model is asked, and its reply journaled at this identity.
    Fresh(CallIdentity, Reservation),
}

impl Journal {
    /// Journals a model response by its position in the step: on a re-run turn the
    /// recorded response is returned instead of asking the model again.
    ///
    /// The arguments `#[secret]` in the tool calls the response asks for are masked
    /// before it is written, and the response returned is the journaled one, masked, on
    /// the first run as on a replay: push it to the transcript as it is. Dispatching its
    /// calls through a [`Toolbox`](crate::Toolbox) hands each tool the clear value, held
    /// in memory by this journal (see [`secret`](crate::secret)).
    ///
    /// Failures are not journaled (a model call has no side effect; retry it with
    /// [`retry`](crate::retry::retry), which records each failed attempt).
    pub async fn model<R, E, F, Fut>(&self, f: F) -> Result<R, CallError<E>>
    where
        R: Serialize + DeserializeOwned,
        E: Display,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<R, E>>,
    {
        self.model_with_spend(f, |_| None).await
    }

    /// Like [`model`](Self::model), recording what the response cost (charged to the
    /// session's budget once, however often the turn is replayed).
    pub async fn model_with_spend<R, E, F, Fut, S>(&self, f: F, spend: S) -> Result<R, CallError<E>>
    where
        R: Serialize + DeserializeOwned,
        E: Display,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<R, E>>,
        S: FnOnce(&R) -> Option<Spend>,
    {
        let step = self.step();
        let span = self.chat_span(step);
        let call = async {
            let (identity, reservation) = match self.begin_model(step).await? {
                Begun::Recorded(row, reservation) => {
                    self.replay_model(&row, reservation);
                    return decode_result(&row, row.result.as_ref());
                }
                Begun::Fresh(identity, reservation) => (identity, reservation),
            };
            let value = f().await.map_err(CallError::Tool)?;
            let spend = spend(&value);
            let row = self
                .record_model(identity, reservation, &value, spend)
                .await?;
            decode_result(&row, row.result.as_ref())
        };
        let result = call.instrument(span.clone()).await;
        if let Err(e) = &result {
            span.record(
                telemetry::ERROR_TYPE,
                telemetry::call_error_type(e, telemetry::ERROR_TYPE_MODEL),
            );
        }
        result
    }

    /// Takes the next model position of `step` (under the lease, marked running) and
    /// looks up a reply recorded there. Runs inside the call's `chat` span.
    pub(super) async fn begin_model(&self, step: i64) -> Result<Begun, DurableError> {
        self.check_lease().inspect_err(super::refused_span)?;
        self.check_cancelled()
            .await
            .inspect_err(super::refused_span)?;
        self.mark_running().await?;
        let (identity, reservation) = {
            let mut cache = self.inner.cache.lock().await;
            self.load_step(&mut cache).await?;
            let reservation =
                Reservation::take(&self.inner.state, (MODEL_SLOT.to_owned(), String::new()));
            let identity = CallIdentity {
                session: self.inner.session.clone(),
                step,
                tool: MODEL_SLOT.to_owned(),
                input_hash: String::new(),
                ordinal: reservation.number(),
            };
            (identity, reservation)
        };
        tracing::Span::current().record(telemetry::DURABLE_MODEL_POSITION, identity.ordinal);
        let recorded = {
            let mut cache = self.inner.cache.lock().await;
            let row = cache
                .rows
                .get(&identity)
                .filter(|r| r.status == CallStatus::Completed)
                .cloned();
            if let Some(row) = &row {
                cache.note_reply(Some(&row.id));
            }
            row
        };
        Ok(match recorded {
            Some(row) => Begun::Recorded(Box::new(row), reservation),
            None => Begun::Fresh(identity, reservation),
        })
    }

    /// A recorded reply is returned: its position is kept, its spend charged (once per
    /// row), the replay reported.
    pub(super) fn replay_model(&self, row: &CallRecord, mut reservation: Reservation) {
        reservation.keep();
        tracing::Span::current().record(telemetry::DURABLE_CALL_ID, row.id.as_str());
        self.charge(row);
        self.emit(self.event(row, Outcome::CacheHit));
    }

    /// Journals a fresh reply at `identity`: size-capped, checked (finite values), its
    /// secret arguments masked, recorded with its spend in one commit. Returns the row,
    /// whose result is the reply as journaled (masked).
    pub(super) async fn record_model<R: Serialize>(
        &self,
        identity: CallIdentity,
        mut reservation: Reservation,
        value: &R,
        spend: Option<Spend>,
    ) -> Result<CallRecord, DurableError> {
        // Capped before anything is encoded or written (counted, not copied).
        crate::sizes::check(value, self.inner.config.sizes.max_reply_bytes, || {
            crate::sizes::Oversized::ModelReply {
                session: identity.session.clone(),
                step: identity.step,
                position: identity.ordinal,
            }
        })?;
        // Checked before anything is recorded: a reply the replay could not decode
        // (NaN written as `null`) never becomes a completed row.
        let mut result = crate::encode::encode(value, "model response")?;
        // Secret arguments of the tool calls it asks for are masked before it is
        // written, and the reply handed back is the masked one (as on a replay); the
        // clear values stay in this handle's memory for dispatch (see `secret`).
        self.inner.vault.redact_reply(
            self.inner.store.keyring(),
            &self.inner.config.limits,
            &mut result,
        )?;
        let call = NewCall {
            id: CallId::random(),
            kind: CallKind::Model,
            identity: identity.clone(),
            class: ReplayClass::Pure,
            args: Value::Null,
            idempotency_key: None,
            schema_hash: String::new(),
        };
        if let Some(spend) = &spend {
            // As `i64`: OpenTelemetry has no unsigned integers (`tracing-opentelemetry`
            // would export a `u64` as text).
            let tokens = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
            let span = tracing::Span::current();
            span.record(
                telemetry::GEN_AI_USAGE_INPUT_TOKENS,
                tokens(spend.input_tokens()),
            );
            span.record(
                telemetry::GEN_AI_USAGE_OUTPUT_TOKENS,
                tokens(spend.output_tokens()),
            );
        }
        let row = match self
            .record(call, CallOutcome::Completed(result), spend)
            .await?
        {
            IssueOutcome::Inserted(row) | IssueOutcome::Existing(row) => row,
        };
        reservation.keep();
        tracing::Span::current().record(telemetry::DURABLE_CALL_ID, row.id.as_str());
        self.failpoint("after_model_recorded", MODEL_SLOT);
        self.charge(&row);
        {
            let mut cache = self.inner.cache.lock().await;
            cache.rows.insert(identity, row.clone());
            cache.note_reply(None);
        }
        self.emit(self.event(&row, Outcome::Executed));
        Ok(row)
    }

    /// The `chat` span of a model call in `step` (see [`telemetry`]).
    pub(super) fn chat_span(&self, step: i64) -> tracing::Span {
        let model = self.model_name.as_deref();
        tracing::info_span!(
            telemetry::CHAT,
            { telemetry::OTEL_NAME } = %format_args!(
                "{}{}{}",
                telemetry::OPERATION_CHAT,
                if model.is_some() { " " } else { "" },
                model.unwrap_or_default()
            ),
            { telemetry::GEN_AI_OPERATION_NAME } = telemetry::OPERATION_CHAT,
            { telemetry::GEN_AI_REQUEST_MODEL } = model,
            { telemetry::GEN_AI_CONVERSATION_ID } = self.inner.session.as_str(),
            { telemetry::DURABLE_STEP } = step,
            { telemetry::DURABLE_MODEL_POSITION } = tracing::field::Empty,
            { telemetry::GEN_AI_USAGE_INPUT_TOKENS } = tracing::field::Empty,
            { telemetry::GEN_AI_USAGE_OUTPUT_TOKENS } = tracing::field::Empty,
            { telemetry::DURABLE_REPLAY_OUTCOME } = tracing::field::Empty,
            { telemetry::DURABLE_CALL_OUTCOME } = tracing::field::Empty,
            { telemetry::DURABLE_CALL_ID } = tracing::field::Empty,
            { telemetry::ERROR_TYPE } = tracing::field::Empty,
        )
    }
}
