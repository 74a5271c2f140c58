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
use super::numbers::Reservation;
use super::{CallError, Journal, MODEL_SLOT, Outcome};
use crate::ids::CallId;
use crate::replay::ReplayClass;
use crate::snapshot::Spend;
use crate::store::{CallIdentity, CallKind, CallOutcome, CallStatus, IssueOutcome, NewCall};

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
        self.check_lease()?;
        let step = self.step();
        let (identity, mut reservation) = {
            let mut cache = self.inner.cache.lock().await;
            self.load_step(&mut cache).await?;
            let reservation =
                Reservation::take(&self.inner.numbers, (MODEL_SLOT.to_owned(), String::new()));
            let identity = CallIdentity {
                session: self.inner.session.clone(),
                step,
                tool: MODEL_SLOT.to_owned(),
                input_hash: String::new(),
                ordinal: reservation.number(),
            };
            (identity, reservation)
        };
        let span = tracing::info_span!(
            "model_call",
            durable.step = step,
            durable.position = identity.ordinal,
            durable.replay.outcome = tracing::field::Empty
        );
        async move {
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
            if let Some(row) = recorded {
                reservation.keep();
                self.charge(&row);
                self.emit(self.event(&row, Outcome::CacheHit));
                return decode_result(&row, row.result.as_ref());
            }
            let value = f().await.map_err(CallError::Tool)?;
            // Checked before anything is recorded: a reply the replay could not decode
            // (NaN written as `null`) never becomes a completed row.
            let mut result = crate::encode::encode(&value, "model response")?;
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
            let row = match self
                .record(call, CallOutcome::Completed(result), spend(&value))
                .await?
            {
                IssueOutcome::Inserted(row) | IssueOutcome::Existing(row) => row,
            };
            reservation.keep();
            self.failpoint("after_model_recorded", MODEL_SLOT);
            self.charge(&row);
            {
                let mut cache = self.inner.cache.lock().await;
                cache.rows.insert(identity, row.clone());
                cache.note_reply(None);
            }
            self.emit(self.event(&row, Outcome::Executed));
            decode_result(&row, row.result.as_ref())
        }
        .instrument(span)
        .await
    }
}
