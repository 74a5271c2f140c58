//! Calls under fleet-wide rate limits (see [`limiter`](crate::limiter)): a model or tool
//! call that names a limit takes its turn in the store before it runs, and waits for it.
//! Only calls that run now wait: a recorded reply or result returned on a replay costs
//! nothing again.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Journal;
use crate::error::{DurableError, StoreError};
use crate::limiter::{Acquire, Defined};
use crate::store::CallIdentity;
use crate::telemetry;

/// The id a call waits under: the call's identity and attempt, the same on every run of
/// the turn, so a session that comes back for its turn finds its place.
pub(super) fn waiter_id(identity: &CallIdentity, attempt: u32) -> String {
    format!(
        "{}/{}/{}/{}#{}/{attempt}",
        identity.session, identity.step, identity.tool, identity.input_hash, identity.ordinal
    )
}

impl Journal {
    /// A handle whose model calls ([`model`](Self::model),
    /// [`model_with_spend`](Self::model_with_spend), [`model_stream`](Self::model_stream))
    /// wait for their turn under the fleet-wide rate limit `name` before the model is
    /// asked (see [`limiter`](crate::limiter); define it with
    /// [`DurableBuilder::rate_limit`](crate::DurableBuilder::rate_limit)). A reply
    /// returned from the journal does not wait. The tokens a reply used (its
    /// [`Spend`](crate::Spend)) are charged to the limit's tokens quota after it.
    ///
    /// ```no_run
    /// # async fn f(session: &durable_core::Session<durable_core::Message>) -> Result<(), Box<dyn std::error::Error>> {
    /// # async fn ask() -> Result<durable_core::Message, std::io::Error> { unreachable!() }
    /// let reply = session.journal().with_rate_limit("openai:gpt-4.1").model(ask).await?;
    /// # Ok(()) }
    /// ```
    pub fn with_rate_limit(&self, name: impl Into<Arc<str>>) -> Journal {
        Journal {
            rate_limit: Some(name.into()),
            ..self.clone()
        }
    }

    /// A handle whose tool calls wait under `name` unless their spec names a limit.
    pub(crate) fn with_tool_rate_limit(&self, name: Option<Arc<str>>) -> Journal {
        Journal {
            tool_limit: name,
            ..self.clone()
        }
    }

    /// The rate limit of this handle's model calls, if any.
    pub fn rate_limit(&self) -> Option<&str> {
        self.rate_limit.as_deref()
    }

    /// Reports a provider's `429` (with its `retry-after`) on the rate limit `name`:
    /// every worker of the store holds its calls under the limit until then, and resumes
    /// at the limit's sustained rate. Returns when the hold ends (ms, the store's clock).
    ///
    /// # Errors
    /// [`StoreError::LimitNotDefined`] if no limit has this name.
    pub async fn report_throttle(
        &self,
        name: &str,
        retry_after: Duration,
    ) -> Result<i64, DurableError> {
        self.define_configured(name).await?;
        let until = self.inner.store.throttle_limit(name, retry_after).await?;
        tracing::warn!(
            limit = name,
            retry_after_ms = u64::try_from(retry_after.as_millis()).unwrap_or(u64::MAX),
            "provider throttled; the fleet holds its calls under the limit"
        );
        Ok(until)
    }

    /// Writes the builder's definition of `name` to the store, once per process.
    async fn define_configured(&self, name: &str) -> Result<(), DurableError> {
        let config = &self.inner.config;
        let Some(limit) = config.rate_limits.get(name) else {
            return Ok(());
        };
        if super::lock(&config.defined_limits).contains(name) {
            return Ok(());
        }
        match self.inner.store.define_limit(name, limit).await? {
            Defined::Replaced { previous } => tracing::warn!(
                limit = name,
                ?previous,
                defined = ?limit,
                "rate limit redefined: this worker's definition replaces the fleet's (the last one wins)"
            ),
            Defined::Created | Defined::Unchanged => {}
        }
        super::lock(&config.defined_limits).insert(name.to_owned());
        Ok(())
    }

    /// Takes the call's turn under `limit`, waiting for it in memory up to `hold`
    /// (without bound when `None`); records the wait on the call's span. Returns how
    /// long it waited.
    ///
    /// # Errors
    /// [`DurableError::RateLimited`] when the turn is further away than the hold (the
    /// place is kept under `waiter`); the store's errors.
    pub(super) async fn take_turn(
        &self,
        limit: &str,
        waiter: String,
        hold: Option<Duration>,
    ) -> Result<Duration, DurableError> {
        let began = Instant::now();
        let span = tracing::Span::current();
        span.record(telemetry::DURABLE_RATE_LIMIT, limit);
        let acquire = Acquire::new(limit).with_waiter(waiter);
        self.define_configured(limit).await?;
        loop {
            let admission = match self.inner.store.acquire_limit(&acquire).await {
                Err(StoreError::LimitNotDefined { .. })
                    if self.inner.config.rate_limits.contains_key(limit) =>
                {
                    // Another process removed it (or a store was swapped): define again.
                    super::lock(&self.inner.config.defined_limits).remove(limit);
                    self.define_configured(limit).await?;
                    self.inner.store.acquire_limit(&acquire).await?
                }
                other => other?,
            };
            if admission.is_granted() {
                break;
            }
            let wait = admission.wait();
            if hold.is_some_and(|hold| wait > hold) {
                return Err(DurableError::RateLimited {
                    session: self.inner.session.clone(),
                    limit: limit.to_owned(),
                    start_at: admission.start_at,
                    ahead: admission.ahead,
                });
            }
            tokio::time::sleep(wait).await;
        }
        let waited = began.elapsed();
        span.record(
            telemetry::DURABLE_RATE_LIMIT_WAIT_MS,
            i64::try_from(waited.as_millis()).unwrap_or(i64::MAX),
        );
        // The lease may have run out while it waited: nothing starts then.
        self.check_lease().inspect_err(super::refused_span)?;
        Ok(waited)
    }

    /// Charges a reply's tokens to `limit`'s tokens quota (when it has one, as far as
    /// this process knows). A failure is logged: the reply is journaled already.
    pub(super) async fn charge_tokens(&self, limit: &str, tokens: u64) {
        if tokens == 0 {
            return;
        }
        if let Some(defined) = self.inner.config.rate_limits.get(limit)
            && defined.tokens.is_none()
        {
            return;
        }
        if let Err(error) = self.inner.store.charge_limit(limit, tokens).await {
            tracing::warn!(limit, %error, "could not charge a reply's tokens to its rate limit");
        }
    }
}
