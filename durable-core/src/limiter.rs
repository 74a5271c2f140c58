//! Fleet-wide rate limits: named limits kept in the store, shared by every worker of it.
//!
//! A limit ([`RateLimit`]) has up to two dimensions, requests and tokens, each a
//! [`Quota`] (so many per period, with a burst capacity). It is defined by name on the
//! store ([`LimiterStore::define_limit`](crate::store::LimiterStore::define_limit)),
//! persisted, so every worker of the store sees the same definition; the last
//! definition written wins (a rolling deploy that changes a limit takes it over; two
//! workers that keep defining one name differently flip it back and forth, and each
//! redefinition is logged as a warning by [`DurableBuilder::rate_limit`](crate::DurableBuilder::rate_limit)).
//!
//! # The algorithm: GCRA by reservation
//!
//! Each dimension is a GCRA (the generic cell rate algorithm, a token bucket written as
//! one timestamp): its *theoretical arrival time* `tat`. A call of cost `n` on a quota
//! of emission interval `T = period / amount` and capacity `B` may start at
//! `max(now, tat + n·T − B·T)`, and then `tat ← max(tat, start) + n·T`. Every
//! [`acquire`](crate::store::LimiterStore::acquire_limit) *reserves* its start in one
//! store transaction, so the reservations are taken in the order the store serialises
//! them: the waiters are served first come, first served across every worker and
//! machine, and starts never go backwards (each start is at least the previous one).
//! Over any window of length `L` the calls started cost at most `B + L/T`: the burst
//! never exceeds the capacity.
//!
//! A call over the limit therefore *waits* for its start rather than failing. A
//! waiter with an id leaves a row in the store ([`Acquire::waiter`]): acquiring again
//! with the same id returns the same reservation, and once due, takes it (the row is
//! removed). That is what lets a session wait without holding a worker: it is released
//! and, woken at its start, finds its place kept.
//!
//! # A provider's `429`
//!
//! [`throttle_limit`](crate::store::LimiterStore::throttle_limit) with the provider's
//! `retry-after` stops every worker of the fleet until then: no start is given before it,
//! and the buckets are empty at that time (the fleet resumes at the sustained rate, not
//! with a burst).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::StoreError;

/// Microseconds per millisecond: the limiter keeps its times in µs (a token quota's
/// interval is often below a millisecond) and reports them in the store's ms.
const US_PER_MS: i64 = 1000;

/// How long an abandoned reservation (its waiter never came back) is kept: after this
/// past its start, any acquire of the limit removes it. A waiter that comes back later
/// queues again at the back.
pub const ABANDONED_AFTER: Duration = Duration::from_secs(3600);

/// How long a call waits in memory for its turn by default (see
/// [`DurableBuilder::limiter_hold`](crate::DurableBuilder::limiter_hold)): 10 s.
pub const DEFAULT_HOLD: Duration = Duration::from_secs(10);

/// Longest name of a limit, in bytes.
pub const MAX_LIMIT_NAME: usize = 200;

/// So many units (requests or tokens) per period, with a burst capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Quota {
    /// Units per period (at least 1).
    pub amount: u64,
    /// The period, in ms (at least 1).
    pub period_ms: u64,
    /// The bucket's capacity: at most this many units at once after a quiet time
    /// (at least 1; [`amount`](Self::amount) unless set with
    /// [`with_burst`](Self::with_burst)).
    pub burst: u64,
}

impl Quota {
    /// `amount` units per `period`, burst capacity `amount`.
    pub fn new(amount: u64, period: Duration) -> Self {
        let period_ms = u64::try_from(period.as_millis()).unwrap_or(u64::MAX);
        Quota {
            amount,
            period_ms,
            burst: amount,
        }
    }

    /// `amount` units per second.
    pub fn per_second(amount: u64) -> Self {
        Quota::new(amount, Duration::from_secs(1))
    }

    /// `amount` units per minute.
    pub fn per_minute(amount: u64) -> Self {
        Quota::new(amount, Duration::from_secs(60))
    }

    /// Sets the burst capacity: the most units admitted at once after a quiet time.
    pub fn with_burst(mut self, burst: u64) -> Self {
        self.burst = burst;
        self
    }

    /// The time `n` units take at the sustained rate, in µs, rounded up (so rounding
    /// never admits more than the quota).
    fn interval_us(&self, n: u64) -> i64 {
        let num = u128::from(n) * u128::from(self.period_ms) * 1000;
        let den = u128::from(self.amount.max(1));
        i64::try_from(num.div_ceil(den)).unwrap_or(i64::MAX)
    }

    /// The burst tolerance `B·T`, in µs.
    fn tolerance_us(&self) -> i64 {
        self.interval_us(self.burst)
    }

    fn validate(&self, limit: &str, what: &str) -> Result<(), StoreError> {
        let problem = if self.amount == 0 {
            Some(format!(
                "its {what} amount is 0; give at least 1 per period"
            ))
        } else if self.period_ms == 0 {
            Some(format!("its {what} period is 0 ms; give at least 1 ms"))
        } else if self.burst == 0 {
            Some(format!("its {what} burst is 0; give at least 1"))
        } else if self.amount > 1 << 40 || self.burst > 1 << 40 || self.period_ms > 1 << 40 {
            Some(format!("its {what} figures are too large (at most 2^40)"))
        } else {
            None
        };
        match problem {
            Some(problem) => Err(StoreError::InvalidLimit {
                name: limit.to_owned(),
                problem,
            }),
            None => Ok(()),
        }
    }
}

/// A named limit's definition: requests, tokens, or both.
///
/// ```
/// use durable_core::limiter::{Quota, RateLimit};
///
/// // 500 requests and 200k tokens per minute.
/// let gpt = RateLimit::requests(Quota::per_minute(500)).with_tokens(Quota::per_minute(200_000));
/// // An upstream API: 10 calls per second, no burst above 2.
/// let crm = RateLimit::requests(Quota::per_second(10).with_burst(2));
/// # let _ = (gpt, crm);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct RateLimit {
    /// Calls admitted (each costs 1).
    pub requests: Option<Quota>,
    /// Tokens (a model call's input and output tokens, charged after the reply).
    pub tokens: Option<Quota>,
}

impl RateLimit {
    /// A limit on requests only.
    pub fn requests(quota: Quota) -> Self {
        RateLimit {
            requests: Some(quota),
            tokens: None,
        }
    }

    /// A limit on tokens only.
    pub fn tokens(quota: Quota) -> Self {
        RateLimit {
            requests: None,
            tokens: Some(quota),
        }
    }

    /// Adds (or replaces) the tokens dimension.
    pub fn with_tokens(mut self, quota: Quota) -> Self {
        self.tokens = Some(quota);
        self
    }

    /// Adds (or replaces) the requests dimension.
    pub fn with_requests(mut self, quota: Quota) -> Self {
        self.requests = Some(quota);
        self
    }

    /// Checks the name and the figures; stores call it before touching the database.
    ///
    /// # Errors
    /// [`StoreError::InvalidLimit`] naming what to change.
    pub fn validate(&self, name: &str) -> Result<(), StoreError> {
        validate_name(name)?;
        if self.requests.is_none() && self.tokens.is_none() {
            return Err(StoreError::InvalidLimit {
                name: name.to_owned(),
                problem: "it limits nothing; give a requests or a tokens quota".into(),
            });
        }
        if let Some(q) = &self.requests {
            q.validate(name, "requests")?;
        }
        if let Some(q) = &self.tokens {
            q.validate(name, "tokens")?;
        }
        Ok(())
    }
}

/// Checks a limit's name: 1 to [`MAX_LIMIT_NAME`] bytes, no control characters
/// (`openai:gpt-4.1` and `crm` are fine).
pub fn validate_name(name: &str) -> Result<(), StoreError> {
    let problem = if name.trim().is_empty() {
        Some("the name is empty".to_owned())
    } else if name.len() > MAX_LIMIT_NAME {
        Some(format!("the name is longer than {MAX_LIMIT_NAME} bytes"))
    } else if name.chars().any(char::is_control) {
        Some("the name holds a control character".to_owned())
    } else {
        None
    };
    match problem {
        Some(problem) => Err(StoreError::InvalidLimit {
            name: name.chars().take(MAX_LIMIT_NAME).collect(),
            problem,
        }),
        None => Ok(()),
    }
}

/// What [`define_limit`](crate::store::LimiterStore::define_limit) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Defined {
    /// The name was new.
    Created,
    /// The same definition was stored already: nothing changed.
    Unchanged,
    /// Another definition was stored under the name; it was replaced (the last
    /// definition wins). Its buckets are kept: the new rates apply from the next call.
    Replaced {
        /// The definition replaced.
        previous: RateLimit,
    },
}

/// A request to take a place under a limit
/// ([`acquire_limit`](crate::store::LimiterStore::acquire_limit)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Acquire {
    /// The limit's name.
    pub limit: String,
    /// Who waits, if the caller may come back for its place: acquiring again with the
    /// same id returns the same reservation instead of a new one, and takes it once it
    /// is due. `None`: a one-shot reservation (the caller waits in memory).
    pub waiter: Option<String>,
    /// Tokens charged now on the tokens dimension (an estimate; more can be charged
    /// after the reply with [`charge_limit`](crate::store::LimiterStore::charge_limit)).
    /// Capped at the quota's burst.
    pub tokens: u64,
}

impl Acquire {
    /// One request under `limit`, no waiter id, no tokens.
    pub fn new(limit: impl Into<String>) -> Self {
        Acquire {
            limit: limit.into(),
            waiter: None,
            tokens: 0,
        }
    }

    /// A waiter that may come back for its place.
    pub fn with_waiter(mut self, waiter: impl Into<String>) -> Self {
        self.waiter = Some(waiter.into());
        self
    }

    /// Tokens to charge now.
    pub fn with_tokens(mut self, tokens: u64) -> Self {
        self.tokens = tokens;
        self
    }
}

/// The store's answer to an acquire: when the call may start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Admission {
    /// When the call may start (ms, database clock).
    pub start_at: i64,
    /// The database clock when the answer was given (ms).
    pub now: i64,
    /// Waiters of this limit whose start comes before this one's.
    pub ahead: i64,
}

impl Admission {
    /// The call may start now (its place was taken).
    pub fn is_granted(&self) -> bool {
        self.start_at <= self.now
    }

    /// How long to wait before starting (zero when granted).
    pub fn wait(&self) -> Duration {
        Duration::from_millis(u64::try_from(self.start_at - self.now).unwrap_or(0))
    }
}

/// How a limit stands, for operators (`durable limits`, the console).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct LimiterInfo {
    /// The limit's name.
    pub name: String,
    /// Its definition.
    pub limit: RateLimit,
    /// Requests started in the last period (a sliding-window estimate), if the limit
    /// has a requests quota; started calls count at their start.
    pub current_requests: Option<f64>,
    /// Waiters whose start is still to come.
    pub waiters: i64,
    /// The latest start given (ms, database clock): a new call would start after it.
    pub next_start_at: Option<i64>,
    /// Until when a provider's `429` holds the fleet (ms), when still to come.
    pub throttled_until: Option<i64>,
    /// `429`s reported so far.
    pub throttles: i64,
    /// Calls admitted so far.
    pub admitted: i64,
}

/// A limit's buckets as the store keeps them (one JSON document per limit, beside its
/// definition). Backends load it under the limit's lock, apply [`reserve`](Self::reserve),
/// [`charge`](Self::charge) or [`throttle`](Self::throttle), and write it back.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct LimiterState {
    /// The requests dimension's theoretical arrival time (µs).
    #[serde(default)]
    pub requests_tat: i64,
    /// The tokens dimension's theoretical arrival time (µs).
    #[serde(default)]
    pub tokens_tat: i64,
    /// The latest start given (µs): starts never go backwards (first come, first served).
    #[serde(default)]
    pub last_start: i64,
    /// Until when a `429` holds the fleet (ms).
    #[serde(default)]
    pub throttled_until: i64,
    /// `429`s reported.
    #[serde(default)]
    pub throttles: i64,
    /// Calls admitted.
    #[serde(default)]
    pub admitted: i64,
    /// Start of the current counting window (ms).
    #[serde(default)]
    pub window_start: i64,
    /// Calls started in the current window.
    #[serde(default)]
    pub window_count: i64,
    /// Calls started in the window before it.
    #[serde(default)]
    pub previous_count: i64,
}

impl LimiterState {
    /// Reserves a start for one call costing `tokens` (capped at the tokens burst) at
    /// `now` (ms): the start, in µs. Updates the buckets and counters.
    pub fn reserve(&mut self, limit: &RateLimit, tokens: u64, now: i64) -> i64 {
        let now_us = now.saturating_mul(US_PER_MS);
        let mut start = now_us
            .max(self.last_start)
            .max(self.throttled_until.saturating_mul(US_PER_MS));
        if let Some(q) = &limit.requests {
            start = start.max(
                self.requests_tat
                    .saturating_add(q.interval_us(1))
                    .saturating_sub(q.tolerance_us()),
            );
        }
        let tokens = limit.tokens.map(|q| tokens.min(q.burst)).unwrap_or(0);
        if let Some(q) = &limit.tokens {
            start = start.max(
                self.tokens_tat
                    .saturating_add(q.interval_us(tokens))
                    .saturating_sub(q.tolerance_us()),
            );
        }
        if let Some(q) = &limit.requests {
            self.requests_tat = self
                .requests_tat
                .max(start)
                .saturating_add(q.interval_us(1));
        }
        if let Some(q) = &limit.tokens {
            self.tokens_tat = self
                .tokens_tat
                .max(start)
                .saturating_add(q.interval_us(tokens));
        }
        self.last_start = start;
        self.admitted = self.admitted.saturating_add(1);
        self.count(limit, start.div_euclid(US_PER_MS));
        start
    }

    /// Charges `tokens` more on the tokens dimension at `now` (ms): the reply's real
    /// usage beyond what was charged at the start. Later calls wait for them.
    pub fn charge(&mut self, limit: &RateLimit, tokens: u64, now: i64) {
        if let Some(q) = &limit.tokens {
            let now_us = now.saturating_mul(US_PER_MS);
            self.tokens_tat = self
                .tokens_tat
                .max(now_us)
                .saturating_add(q.interval_us(tokens));
        }
    }

    /// A provider refused with `429` at `now` (ms), asking to come back after
    /// `retry_after`: nothing starts before then, and the buckets are empty at that
    /// time. Returns the time the fleet resumes (ms).
    pub fn throttle(&mut self, limit: &RateLimit, retry_after: Duration, now: i64) -> i64 {
        let after = i64::try_from(retry_after.as_millis()).unwrap_or(i64::MAX);
        let until = now.saturating_add(after).max(self.throttled_until);
        self.throttled_until = until;
        self.throttles = self.throttles.saturating_add(1);
        let until_us = until.saturating_mul(US_PER_MS);
        if let Some(q) = &limit.requests {
            let empty = until_us + q.tolerance_us() - q.interval_us(1);
            self.requests_tat = self.requests_tat.max(empty);
        }
        if let Some(q) = &limit.tokens {
            let empty = until_us + q.tolerance_us() - q.interval_us(1);
            self.tokens_tat = self.tokens_tat.max(empty);
        }
        until
    }

    /// Counts a call started at `at` (ms) in the sliding window of the requests period.
    fn count(&mut self, limit: &RateLimit, at: i64) {
        let period = limit.requests.or(limit.tokens).map_or(1000, |q| {
            i64::try_from(q.period_ms).unwrap_or(i64::MAX).max(1)
        });
        if self.window_start == 0 || at < self.window_start {
            self.window_start = at;
        }
        let elapsed = at - self.window_start;
        if elapsed >= period {
            let windows = elapsed / period;
            self.previous_count = if windows == 1 { self.window_count } else { 0 };
            self.window_start += windows * period;
            self.window_count = 0;
        }
        self.window_count = self.window_count.saturating_add(1);
    }

    /// Calls started in the last period at `now` (ms), estimated from the current and
    /// previous windows (the sliding-window counter).
    pub fn current_rate(&self, limit: &RateLimit, now: i64) -> f64 {
        let period = limit.requests.or(limit.tokens).map_or(1000, |q| {
            i64::try_from(q.period_ms).unwrap_or(i64::MAX).max(1)
        });
        let elapsed = now - self.window_start;
        if elapsed >= 2 * period || elapsed < 0 {
            return 0.0;
        }
        if elapsed >= period {
            let weight = 1.0 - (elapsed - period) as f64 / period as f64;
            return self.window_count as f64 * weight;
        }
        let weight = 1.0 - elapsed as f64 / period as f64;
        self.previous_count as f64 * weight + self.window_count as f64
    }

    /// The figures operators see.
    pub fn info(&self, name: &str, limit: &RateLimit, waiters: i64, now: i64) -> LimiterInfo {
        LimiterInfo {
            name: name.to_owned(),
            limit: *limit,
            current_requests: Some(self.current_rate(limit, now)),
            waiters,
            next_start_at: (self.last_start > 0).then(|| ms_ceil(self.last_start)),
            throttled_until: (self.throttled_until > now).then_some(self.throttled_until),
            throttles: self.throttles,
            admitted: self.admitted,
        }
    }
}

/// µs to ms, rounded up (a start is never reported before it is due).
pub fn ms_ceil(us: i64) -> i64 {
    us.div_euclid(US_PER_MS) + i64::from(us.rem_euclid(US_PER_MS) != 0)
}

/// What an acquire does with the waiter's row, decided from the row found (its start,
/// µs) and the clock: the same in every backend.
// Not `non_exhaustive`: every backend must act on every step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaiterStep {
    /// A reservation held and due: taken; remove the row.
    Take {
        /// Its start (µs).
        start: i64,
    },
    /// A reservation held, still to come: answer it again, change nothing.
    Keep {
        /// Its start (µs).
        start: i64,
    },
    /// No reservation held (or one abandoned): reserve a new start; store a row for
    /// it if it is still to come and the caller gave a waiter id.
    Reserve,
}

impl WaiterStep {
    /// Decides from the waiter's row (its start in µs, if any) at `now` (ms), with the
    /// limit's buckets: a reservation whose start falls inside a `429`'s hold (it was
    /// made before the hold) is given up and a new one taken after the hold.
    pub fn decide(found: Option<i64>, now: i64, state: &LimiterState) -> WaiterStep {
        let now_us = now.saturating_mul(US_PER_MS);
        let held_until = state.throttled_until.saturating_mul(US_PER_MS);
        match found {
            Some(start) if start < now_us - abandoned_us() => WaiterStep::Reserve,
            Some(start) if start < held_until && now_us < held_until => WaiterStep::Reserve,
            Some(start) if start <= now_us => WaiterStep::Take { start },
            Some(start) => WaiterStep::Keep { start },
            None => WaiterStep::Reserve,
        }
    }
}

/// [`ABANDONED_AFTER`] in µs.
pub fn abandoned_us() -> i64 {
    i64::try_from(ABANDONED_AFTER.as_micros()).unwrap_or(i64::MAX)
}

/// The [`Admission`] for a start (µs) at `now` (ms) with `ahead` waiters before it.
pub fn admission(start: i64, now: i64, ahead: i64) -> Admission {
    Admission {
        start_at: ms_ceil(start),
        now,
        ahead,
    }
}

/// A limit's row as SQL backends store it: the definition and the buckets, each a JSON
/// text. Unsealed scheduling state, as a queue's limit is: changing it outside
/// `durable` changes how fast calls start, never what the journal holds.
pub mod stored {
    use super::{LimiterState, RateLimit};
    use crate::error::StoreError;

    /// The definition's JSON text.
    pub fn definition(limit: &RateLimit) -> String {
        serde_json::to_string(limit).unwrap_or_default()
    }

    /// The buckets' JSON text.
    pub fn state(state: &LimiterState) -> String {
        serde_json::to_string(state).unwrap_or_default()
    }

    /// Reads a stored row back.
    ///
    /// # Errors
    /// [`StoreError::InvalidLimit`] when a text does not decode; defining the limit
    /// again repairs it.
    pub fn decode(
        name: &str,
        definition: &str,
        state: &str,
    ) -> Result<(RateLimit, LimiterState), StoreError> {
        let bad = |what: &str, e: serde_json::Error| StoreError::InvalidLimit {
            name: name.to_owned(),
            problem: format!(
                "its stored {what} does not decode ({e}); define the limit again to repair it"
            ),
        };
        let limit = serde_json::from_str(definition).map_err(|e| bad("definition", e))?;
        let state = serde_json::from_str(state).map_err(|e| bad("state", e))?;
        Ok((limit, state))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_is_capped_at_capacity_then_the_sustained_rate() {
        let limit = RateLimit::requests(Quota::per_second(10).with_burst(3));
        let mut state = LimiterState::default();
        let now = 1_000_000;
        let starts: Vec<i64> = (0..6).map(|_| state.reserve(&limit, 0, now)).collect();
        // Three at once, then one every 100 ms.
        assert_eq!(
            starts,
            [0, 0, 0, 100_000, 200_000, 300_000].map(|d| now * 1000 + d)
        );
    }

    #[test]
    fn starts_never_go_backwards() {
        let limit = RateLimit::requests(Quota::per_second(5)).with_tokens(Quota::per_second(100));
        let mut state = LimiterState::default();
        let mut last = 0;
        for (i, tokens) in [100, 1, 1, 50, 1, 100, 1].into_iter().enumerate() {
            let start = state.reserve(&limit, tokens, 1000 + i as i64);
            assert!(start >= last, "call {i} started before the one before it");
            last = start;
        }
    }

    #[test]
    fn a_throttle_holds_every_start_and_empties_the_bucket() {
        let limit = RateLimit::requests(Quota::per_second(10));
        let mut state = LimiterState::default();
        let until = state.throttle(&limit, Duration::from_secs(2), 5000);
        assert_eq!(until, 7000);
        assert_eq!(state.reserve(&limit, 0, 5000), 7_000_000);
        assert_eq!(
            state.reserve(&limit, 0, 5000),
            7_100_000,
            "no burst after a 429"
        );
    }

    #[test]
    fn the_waiter_row_decides_take_keep_or_reserve() {
        let quiet = LimiterState::default();
        assert_eq!(WaiterStep::decide(None, 10, &quiet), WaiterStep::Reserve);
        assert_eq!(
            WaiterStep::decide(Some(9_000), 10, &quiet),
            WaiterStep::Take { start: 9_000 }
        );
        assert_eq!(
            WaiterStep::decide(Some(11_000), 10, &quiet),
            WaiterStep::Keep { start: 11_000 }
        );
        let long_ago = 10_000 - abandoned_us() - 1;
        assert_eq!(
            WaiterStep::decide(Some(long_ago), 10, &quiet),
            WaiterStep::Reserve
        );
        // A 429 came after the reservation: its start inside the hold is given up.
        let held = LimiterState {
            throttled_until: 20,
            ..LimiterState::default()
        };
        assert_eq!(
            WaiterStep::decide(Some(9_000), 10, &held),
            WaiterStep::Reserve
        );
        assert_eq!(
            WaiterStep::decide(Some(15_000), 10, &held),
            WaiterStep::Reserve
        );
        assert_eq!(
            WaiterStep::decide(Some(25_000), 10, &held),
            WaiterStep::Keep { start: 25_000 }
        );
    }

    #[test]
    fn definitions_are_checked() {
        assert!(
            RateLimit::requests(Quota::per_second(0))
                .validate("x")
                .is_err()
        );
        assert!(
            RateLimit::requests(Quota::per_second(1))
                .validate("")
                .is_err()
        );
        assert!(
            RateLimit {
                requests: None,
                tokens: None
            }
            .validate("x")
            .is_err()
        );
        assert!(
            RateLimit::requests(Quota::per_second(1))
                .validate("openai:gpt-4.1")
                .is_ok()
        );
    }
}
