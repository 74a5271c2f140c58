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
use crate::snapshot::{Ask, Spend, Usage};
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
            if let Some(limit) = &self.rate_limit {
                let hold = Some(self.inner.config.limiter_hold);
                self.take_turn(limit, super::limit::waiter_id(&identity, 1), hold)
                    .await?;
            }
            let value = f().await.map_err(CallError::Tool)?;
            let spend = spend(&value);
            let tokens = spend
                .as_ref()
                .map_or(0, |s| s.input_tokens().saturating_add(s.output_tokens()));
            let row = self
                .record_model(identity, reservation, &value, spend)
                .await?;
            if let Some(limit) = &self.rate_limit {
                self.charge_tokens(limit, tokens).await;
            }
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

    /// Like [`model_with_spend`](Self::model_with_spend), with the reply's token usage
    /// instead of its cost: the runtime's [`PriceTable`](crate::snapshot::PriceTable)
    /// ([`DurableBuilder::prices`](crate::DurableBuilder::prices)) prices it for the
    /// model the usage names, else the one this handle names
    /// ([`with_model_name`](Self::with_model_name)). A model the table does not price
    /// is charged its tokens and no dollars (with a warning when the table prices other
    /// models). `durable-openai` and `durable-rig` map their providers' usage into
    /// [`Usage`].
    ///
    /// ```no_run
    /// # async fn f(journal: &durable_core::Journal) -> Result<(), Box<dyn std::error::Error>> {
    /// # #[derive(serde::Serialize, serde::Deserialize)] struct Reply { text: String, prompt_tokens: u64, completion_tokens: u64 }
    /// # async fn ask() -> Result<Reply, std::io::Error> { unreachable!() }
    /// use durable_core::snapshot::Usage;
    ///
    /// let reply = journal
    ///     .with_model_name("gpt-4o-mini")
    ///     .model_with_usage(ask, |r: &Reply| Some(Usage::new(r.prompt_tokens, r.completion_tokens)))
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub async fn model_with_usage<R, E, F, Fut, U>(&self, f: F, usage: U) -> Result<R, CallError<E>>
    where
        R: Serialize + DeserializeOwned,
        E: Display,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<R, E>>,
        U: FnOnce(&R) -> Option<Usage>,
    {
        let config = &self.inner.config;
        let model = self.model_name.as_deref();
        self.model_with_spend(f, |reply| {
            usage(reply).map(|usage| priced(config, model, &usage))
        })
        .await
    }

    /// What `usage` cost at the runtime's prices
    /// ([`DurableBuilder::prices`](crate::DurableBuilder::prices)), for the model it
    /// names or else the one this handle names; `None` when the table does not price
    /// that model. For an adapter that knows another cost to fall back on (a provider
    /// that reports its own).
    pub fn price(&self, usage: &Usage) -> Option<Spend> {
        self.inner
            .config
            .prices
            .spend(usage, self.model_name.as_deref())
    }

    /// Takes the next model position of `step` (under the lease, marked running) and
    /// looks up a reply recorded there. Runs inside the call's `chat` span.
    pub(super) async fn begin_model(&self, step: i64) -> Result<Begun, DurableError> {
        // Cancelled first, as a tool call checks (`journal/call.rs`): once this handle
        // ended the session, its lease is gone too, and the caller must read why.
        self.check_cancelled()
            .await
            .inspect_err(super::refused_span)?;
        self.check_lease().inspect_err(super::refused_span)?;
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
            None => {
                // A fresh reply costs: the ceilings are checked before the model is asked
                // (a recorded one is returned whatever the budget says). Refused, the
                // position goes back with `reservation`.
                self.check_budget(Ask::Model).await?;
                Begun::Fresh(identity, reservation)
            }
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
            { telemetry::DURABLE_RATE_LIMIT } = tracing::field::Empty,
            { telemetry::DURABLE_RATE_LIMIT_WAIT_MS } = tracing::field::Empty,
            { telemetry::DURABLE_BUDGET_LIMIT } = tracing::field::Empty,
            { telemetry::DURABLE_BUDGET_SPENT } = tracing::field::Empty,
            { telemetry::DURABLE_BUDGET_CEILING } = tracing::field::Empty,
        )
    }
}

/// What `usage` cost at the runtime's prices (tokens only, no dollars, for a model the
/// table does not price).
pub(super) fn priced(config: &crate::config::Config, model: Option<&str>, usage: &Usage) -> Spend {
    match config.prices.spend(usage, model) {
        Some(spend) => spend,
        None => {
            if !config.prices.is_empty() {
                tracing::warn!(
                    model = usage.model.as_deref().or(model).unwrap_or("(unnamed)"),
                    "no price for this model in the price table: its tokens are charged, no dollars"
                );
            }
            Spend::from_nano_usd(0, usage.input_tokens, usage.output_tokens)
        }
    }
}
