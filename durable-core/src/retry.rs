//! Retrying LLM/API calls with exponential backoff, with attempt counts kept in the
//! store so they survive a crash.
//!
//! [`retry`] runs an async call until it succeeds, fails with an error the caller
//! classifies as not retryable, or uses up [`RetryPolicy::max_attempts`]. Every failed
//! attempt is recorded with [`CheckpointStore::record_error`](crate::store::MaintenanceStore::record_error) *before* the backoff
//! sleep, so the `errors` table is the retry history.
//!
//! # The attempt budget is per `(session, step, context)`, across processes
//!
//! Before the first call, [`retry`] reads the session's recorded errors and continues
//! numbering after the highest attempt recorded for the same `step` and `context`. A
//! process that crashes after three failed attempts and resumes gets only the attempts
//! the policy has left, not a fresh set: a crash loop cannot multiply the load on a
//! struggling provider. Consequences:
//!
//! - give each logical call its own `context` within a step (e.g. `"model#0"`,
//!   `"model#1"` for the first and second model call of a turn); two calls that share a
//!   context share one budget;
//! - an attempt that dies with its process before its error is recorded is not counted;
//! - when the budget was already spent before the call, [`retry`] does not call at all
//!   and returns [`RetryError::AlreadyExhausted`]. Use a new step or context to try
//!   again on purpose.
//!
//! Attempt numbers are 0-based, the same numbers as
//! [`ErrorRecord::attempt`](crate::store::ErrorRecord::attempt).
//!
//! Only retry calls that are safe to repeat: model calls, and `pure` or
//! `idempotent_with_key` tools. Auto-retrying an `unsafe_on_replay` tool is the
//! duplicate-email bug.
//!
//! # Why delays are not computed by backon
//!
//! The workspace lists `backon` for retry delays, and its API was checked: it does not
//! fit the persisted-attempt design, so this module computes the schedule itself (ten
//! lines of integer arithmetic). backon's `ExponentialBuilder` yields delays from a
//! stateful iterator that starts at attempt 0 in every process, while here the attempt
//! number comes from the store; it multiplies in `f32`, so a 200 ms base becomes
//! 800.000012 ms at attempt 2 instead of 800 ms; and its jitter adds up to one extra
//! delay on top of the capped value, so jittered delays can exceed `max_delay`.
//!
//! # Testing
//!
//! The bookkeeping is factored into pure functions ([`AttemptHistory::from_errors`],
//! [`RetryPolicy::after_failure`], [`RetryPolicy::delay_for`]), unit-tested here. The
//! loop against a real store belongs to the backend conformance suite.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::StoreError;
use crate::ids::SessionId;
use crate::store::{CheckpointStore, ErrorRecord, NewError};

/// Error messages longer than this (bytes) are truncated when recorded.
pub const MAX_RECORDED_MESSAGE_LEN: usize = 8 * 1024;

/// How often and how patiently to retry.
///
/// Delays grow exponentially: after failed attempt `n` (0-based) the base delay is
/// `base_delay · 2ⁿ`, capped at `max_delay`. With `jitter`, the actual delay is drawn
/// uniformly from `[0.5, 1.0] ×` that ("equal jitter"): concurrent workers spread out,
/// yet every wait stays at least half the base delay and never exceeds `max_delay`.
///
/// JSON (all fields optional, unknown fields refused so that a typo in a config file is
/// an error rather than a silent default):
/// `{"max_attempts":4,"base_delay_ms":500,"max_delay_ms":30000,"jitter":true}`.
///
/// ```
/// use std::time::Duration;
/// use durable_core::RetryPolicy;
///
/// let policy = RetryPolicy::default()
///     .with_max_attempts(5)
///     .with_base_delay(Duration::from_millis(200))
///     .with_jitter(false);
/// assert_eq!(policy.delay_for(0), Duration::from_millis(200));
/// assert_eq!(policy.delay_for(2), Duration::from_millis(800));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct RetryPolicy {
    /// Total attempts, the first included, per `(session, step, context)`. `0` behaves
    /// as `1` (a call is always tried once unless its budget was already spent).
    pub max_attempts: u32,
    /// The delay after the first failure.
    #[serde(rename = "base_delay_ms", with = "millis")]
    pub base_delay: Duration,
    /// The longest delay between two attempts.
    #[serde(rename = "max_delay_ms", with = "millis")]
    pub max_delay: Duration,
    /// Randomize delays within `[0.5, 1.0] ×` the base delay.
    pub jitter: bool,
}

impl Default for RetryPolicy {
    /// 4 attempts, 500 ms base delay, 30 s max delay, jitter on.
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 4,
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(30),
            jitter: true,
        }
    }
}

/// What to do after a failed attempt (see [`RetryPolicy::after_failure`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterFailure {
    /// Wait [`RetryPolicy::delay_for`] the failed attempt, then run `attempt`.
    Retry {
        /// The next attempt's number.
        attempt: u32,
    },
    /// The error is not retryable.
    NotRetryable,
    /// The failed attempt was the last one allowed.
    Exhausted {
        /// Attempts used in total (across processes).
        attempts: u32,
    },
}

impl RetryPolicy {
    /// The default policy.
    pub fn new() -> Self {
        Self::default()
    }

    /// One attempt, no retry.
    pub fn no_retry() -> Self {
        Self::default().with_max_attempts(1)
    }

    /// Sets the total number of attempts (first included).
    pub fn with_max_attempts(mut self, max_attempts: u32) -> Self {
        self.max_attempts = max_attempts;
        self
    }

    /// Sets the delay after the first failure.
    pub fn with_base_delay(mut self, base_delay: Duration) -> Self {
        self.base_delay = base_delay;
        self
    }

    /// Sets the cap on delays.
    pub fn with_max_delay(mut self, max_delay: Duration) -> Self {
        self.max_delay = max_delay;
        self
    }

    /// Turns jitter on or off.
    pub fn with_jitter(mut self, jitter: bool) -> Self {
        self.jitter = jitter;
        self
    }

    /// `max_attempts`, at least 1.
    pub fn effective_max_attempts(&self) -> u32 {
        self.max_attempts.max(1)
    }

    /// The delay before the attempt that follows failed attempt `attempt` (0-based),
    /// without jitter: `base_delay · 2^attempt`, capped at `max_delay`. Exact integer
    /// arithmetic; at most a few dozen doublings whatever `attempt` is.
    pub fn base_delay_for(&self, attempt: u32) -> Duration {
        let cap = self.max_delay;
        let mut delay = self.base_delay.min(cap);
        for _ in 0..attempt {
            if delay >= cap || delay.is_zero() {
                break;
            }
            delay = delay.saturating_mul(2);
        }
        delay.min(cap)
    }

    /// The delay before the attempt that follows failed attempt `attempt` (0-based):
    /// [`base_delay_for`](Self::base_delay_for), scaled by a random factor in
    /// `[0.5, 1.0]` when `jitter` is on.
    pub fn delay_for(&self, attempt: u32) -> Duration {
        let delay = self.base_delay_for(attempt);
        if self.jitter {
            jittered(delay, random_unit())
        } else {
            delay
        }
    }

    /// Decides what follows the failure of attempt `attempt` (0-based): pure, so the
    /// whole retry schedule can be tested without a store or a clock.
    pub fn after_failure(&self, attempt: u32, retryable: bool) -> AfterFailure {
        let used = attempt.saturating_add(1);
        if !retryable {
            AfterFailure::NotRetryable
        } else if used >= self.effective_max_attempts() {
            AfterFailure::Exhausted { attempts: used }
        } else {
            AfterFailure::Retry { attempt: used }
        }
    }
}

/// Equal jitter: `delay · (0.5 + 0.5 · unit)`, `unit` clamped to `[0, 1]`.
pub fn jittered(delay: Duration, unit: f64) -> Duration {
    let unit = if unit.is_nan() {
        1.0
    } else {
        unit.clamp(0.0, 1.0)
    };
    delay.mul_f64(0.5 + 0.5 * unit).min(delay)
}

/// A uniform random number in `[0, 1)`, from the operating system's generator (through
/// a v4 UUID, which core already depends on), so that workers do not wait in lockstep.
fn random_unit() -> f64 {
    // The low 53 bits of the second half of a v4 UUID are random (the version and
    // variant bits live elsewhere).
    let (_, low) = uuid::Uuid::new_v4().as_u64_pair();
    (low & ((1 << 53) - 1)) as f64 / (1u64 << 53) as f64
}

/// What the store's error history says about one `(step, context)`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AttemptHistory {
    /// The number the next attempt gets: one past the highest recorded attempt (0 when
    /// none). Gaps (an attempt whose error could not be recorded) are not reused.
    pub next_attempt: u32,
    /// The message of the highest recorded attempt.
    pub last_message: Option<String>,
}

impl AttemptHistory {
    /// Reads the history of `(step, context)` out of a session's error rows. Rows with
    /// a negative attempt (not written by this crate) are ignored.
    pub fn from_errors(errors: &[ErrorRecord], step: i64, context: &str) -> Self {
        errors
            .iter()
            .filter(|e| e.step == step && e.context == context)
            .filter_map(|e| u32::try_from(e.attempt).ok().map(|a| (a, e)))
            // `max_by_key` keeps the last of equal keys: the latest row wins a tie.
            .max_by_key(|(a, _)| *a)
            .map(|(a, e)| AttemptHistory {
                next_attempt: a.saturating_add(1),
                last_message: Some(e.message.clone()),
            })
            .unwrap_or_default()
    }
}

/// Why [`retry`] gave up.
#[derive(Debug, thiserror::Error)]
pub enum RetryError<E> {
    /// Every attempt the policy allows failed; `last` is the final error.
    #[error("gave up after {attempts} attempts: {last}")]
    Exhausted {
        /// Attempts used in total, counting those recorded by earlier processes.
        attempts: u32,
        /// The last error.
        last: E,
    },
    /// The classifier said this error is not worth retrying.
    #[error("{0}")]
    NotRetryable(E),
    /// The attempt budget was spent before this call (by an earlier process); nothing
    /// was attempted.
    #[error(
        "retry budget already spent: {attempts} attempts were recorded for this step and context (last error: {last_message}); retry under a new step or context to try again"
    )]
    AlreadyExhausted {
        /// Attempts recorded.
        attempts: u32,
        /// The message of the last recorded attempt.
        last_message: String,
    },
    /// The retry history could not be read, so the remaining budget is unknown.
    #[error("cannot read the retry history: {0}")]
    Store(#[source] StoreError),
}

impl<E> RetryError<E> {
    /// The call's own last error, when there is one.
    pub fn last_error(&self) -> Option<&E> {
        match self {
            RetryError::Exhausted { last, .. } | RetryError::NotRetryable(last) => Some(last),
            RetryError::AlreadyExhausted { .. } | RetryError::Store(_) => None,
        }
    }
}

/// Runs `f` until it succeeds, recording each failure and backing off between attempts.
///
/// `f` receives the 0-based attempt number (continuing after those already recorded
/// for `(session, step, context)`, see the [module docs](self)). After a failure, the
/// error is recorded with [`CheckpointStore::record_error`](crate::store::MaintenanceStore::record_error) first; a failure to record
/// it is logged with `tracing::warn!` and does not replace the call's error. Then
/// `is_retryable` decides: not retryable → [`RetryError::NotRetryable`]; last attempt →
/// [`RetryError::Exhausted`]; otherwise sleep [`RetryPolicy::delay_for`] and try again.
///
/// ```no_run
/// use durable_core::retry::{RetryError, RetryPolicy, retry};
/// use durable_core::{CheckpointStore, SessionId};
///
/// #[derive(Debug)]
/// struct HttpError { status: u16 }
/// impl std::fmt::Display for HttpError {
///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
///         write!(f, "HTTP {}", self.status)
///     }
/// }
///
/// async fn call_provider(_attempt: u32) -> Result<String, HttpError> {
///     Err(HttpError { status: 503 })
/// }
///
/// async fn ask_model(
///     store: &dyn CheckpointStore,
///     session: &SessionId,
///     step: i64,
/// ) -> Result<String, RetryError<HttpError>> {
///     retry(
///         store,
///         session,
///         step,
///         "model#0",
///         &RetryPolicy::default(),
///         |e: &HttpError| e.status == 429 || e.status >= 500,
///         |attempt| call_provider(attempt),
///     )
///     .await
/// }
/// ```
pub async fn retry<T, E, F, Fut, R>(
    store: &dyn CheckpointStore,
    session: &SessionId,
    step: i64,
    context: &str,
    policy: &RetryPolicy,
    is_retryable: R,
    mut f: F,
) -> Result<T, RetryError<E>>
where
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: fmt::Display,
    R: Fn(&E) -> bool,
{
    let history = store.errors(session).await.map_err(RetryError::Store)?;
    let history = AttemptHistory::from_errors(&history, step, context);
    if history.next_attempt >= policy.effective_max_attempts() {
        return Err(RetryError::AlreadyExhausted {
            attempts: history.next_attempt,
            last_message: history.last_message.unwrap_or_default(),
        });
    }
    let mut attempt = history.next_attempt;
    loop {
        let error = match f(attempt).await {
            Ok(value) => return Ok(value),
            Err(error) => error,
        };
        let message = truncate_message(error.to_string());
        let record = NewError {
            session: session.clone(),
            step,
            context: context.to_owned(),
            attempt: i32::try_from(attempt).unwrap_or(i32::MAX),
            message,
        };
        if let Err(store_error) = store.record_error(record).await {
            tracing::warn!(
                session = %session,
                step,
                context,
                attempt,
                error = %store_error,
                "could not record a failed attempt; its retry history is incomplete"
            );
        }
        match policy.after_failure(attempt, is_retryable(&error)) {
            AfterFailure::NotRetryable => return Err(RetryError::NotRetryable(error)),
            AfterFailure::Exhausted { attempts } => {
                return Err(RetryError::Exhausted {
                    attempts,
                    last: error,
                });
            }
            AfterFailure::Retry { attempt: next } => {
                let delay = policy.delay_for(attempt);
                tracing::debug!(
                    session = %session,
                    step,
                    context,
                    attempt,
                    delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                    error = %error,
                    "attempt failed; retrying"
                );
                tokio::time::sleep(delay).await;
                attempt = next;
            }
        }
    }
}

/// Cuts a message to [`MAX_RECORDED_MESSAGE_LEN`] bytes at a character boundary.
fn truncate_message(mut message: String) -> String {
    if message.len() > MAX_RECORDED_MESSAGE_LEN {
        let mut end = MAX_RECORDED_MESSAGE_LEN;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
        message.push_str("… (truncated)");
    }
    message
}

/// `Duration` as integer milliseconds.
mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_millis)
    }
}

#[cfg(test)]
mod tests;
