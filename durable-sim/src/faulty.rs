//! [`Faulty`]: a store that forwards every call to a real one and, by the seed, fails,
//! loses the acknowledgement of, delays or pauses it; and [`FenceLog`], the record of
//! every fenced write the real store accepted, which proves "never two writers".
//!
//! Each simulated worker (and the operator, and the submitter) talks to the shared real
//! store through a `Faulty` of its own, with a random stream of its own: a pause stalls
//! every call of that one actor, its lease renewals included, as a process stopped by
//! the kernel or a long garbage-collection pause would be.
//!
//! All the fault logic is in one generic function, `Faulty::faulted`: each trait
//! method only names itself, says which fenced write it makes (if any) and which lease
//! it grants (if any), and forwards (in `forward`, in the trait's order).

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use durable_core::store::{CheckpointStore, Fence};
use durable_core::{SessionId, StoreError};
use rand::Rng;
use rand::rngs::SmallRng;
use tokio::time::Instant;

use crate::trace::Trace;

mod forward;

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// How often each fault strikes a store call (probabilities, each in `0.0..=1.0`), and
/// how long delays and pauses last.
#[derive(Debug, Clone)]
pub struct FaultRates {
    /// The call fails before it reaches the store: nothing is written.
    pub error_before: f64,
    /// The call is performed (committed) and then fails: the acknowledgement is lost.
    pub error_after: f64,
    /// The call waits a little (up to `short_delay`) before it reaches the store.
    pub delay: f64,
    /// The actor stops for `pause` (longer than a lease): this call and every other call
    /// it makes meanwhile wait, then go on as if nothing happened.
    pub pause: f64,
    /// The longest short delay.
    pub short_delay: Duration,
    /// How long a pause lasts, at least and at most.
    pub pause_range: (Duration, Duration),
    /// Whether a pause may also strike after a write committed, before its
    /// acknowledgement reaches the caller (the caller then goes on, late, with a lease
    /// that may be gone). On in every run unless `--no-pause-after-commit`.
    pub pause_after_commit: bool,
}

impl FaultRates {
    /// Rates drawn from `rng`: each run stresses a different mix.
    pub fn draw(rng: &mut SmallRng, lease_ttl: Duration) -> Self {
        FaultRates {
            error_before: rng.random_range(0.0..0.06),
            error_after: rng.random_range(0.0..0.06),
            delay: rng.random_range(0.0..0.2),
            pause: rng.random_range(0.0..0.03),
            short_delay: Duration::from_millis(15),
            pause_range: (lease_ttl + lease_ttl / 5, lease_ttl * 3),
            pause_after_commit: false,
        }
    }
}

/// What one store call does, drawn by the seed.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fault {
    None,
    ErrorBefore,
    ErrorAfter,
    Delay(Duration),
    Pause(Duration),
    PauseAfter(Duration),
}

/// Every fenced write the real store accepted, per session: the greatest fencing token
/// it had accepted or granted by then. A write accepted with a token lower than one the
/// store had already accepted or granted for that session *before the write began* is
/// two writers of one session.
#[derive(Debug, Default)]
pub struct FenceLog {
    /// Per session, the greatest token seen accepted or granted (in completion order).
    greatest: Mutex<HashMap<SessionId, i64>>,
    /// The violations found.
    violations: Mutex<Vec<String>>,
    /// Fenced writes accepted.
    accepted: std::sync::atomic::AtomicUsize,
}

impl FenceLog {
    /// The greatest token of `session` accepted or granted so far.
    fn floor(&self, session: &SessionId) -> i64 {
        lock(&self.greatest).get(session).copied().unwrap_or(0)
    }

    /// A token the store accepted (a write) or granted (a lease) just now.
    fn saw(&self, session: &SessionId, token: i64) {
        let mut greatest = lock(&self.greatest);
        let entry = greatest.entry(session.clone()).or_insert(0);
        *entry = (*entry).max(token);
    }

    /// A write with `token` began when `floor` was already accepted or granted, and the
    /// store accepted it.
    fn accepted(&self, op: &str, session: &SessionId, token: i64, floor: i64) {
        self.accepted.fetch_add(1, Ordering::Relaxed);
        if token < floor {
            lock(&self.violations).push(format!(
                "two writers of session {session}: `{op}` with fencing token {token} was \
                 accepted after token {floor} had been accepted or granted"
            ));
        }
        self.saw(session, token);
    }

    /// The violations found so far.
    pub fn violations(&self) -> Vec<String> {
        lock(&self.violations).clone()
    }

    /// How many fenced writes the store accepted.
    pub fn accepted_writes(&self) -> usize {
        self.accepted.load(Ordering::Relaxed)
    }
}

/// The fenced write a call makes: the session and the token it writes under.
pub(crate) type Write<'a> = Option<(&'a SessionId, i64)>;

/// The lease a call's result grants, if any.
pub(crate) type Granted<T> = fn(&T) -> Option<(SessionId, i64)>;

pub(crate) fn none<T>(_: &T) -> Option<(SessionId, i64)> {
    None
}

pub(crate) fn fence_of(fence: Fence<'_>) -> Write<'_> {
    Some((fence.session, fence.token))
}

/// A store that forwards to `inner` with faults drawn from its own random stream; see
/// the module docs.
pub struct Faulty {
    inner: Arc<dyn CheckpointStore>,
    /// Who this is (for messages).
    actor: String,
    rng: Mutex<SmallRng>,
    rates: FaultRates,
    /// Faults strike only while this is set (the simulation clears it for its calm end).
    on: Arc<AtomicBool>,
    /// Until when this actor is paused.
    paused_until: Mutex<Option<Instant>>,
    log: Arc<FenceLog>,
    /// The run's event log: every call, its fault and its outcome.
    trace: Arc<Trace>,
    /// Whether the store's work notifications reach this actor (see `work_events`).
    notifications: bool,
    /// Faults injected, by kind (for the run's statistics).
    pub(crate) injected: Mutex<HashMap<&'static str, usize>>,
}

impl Faulty {
    /// Wraps `inner` for `actor`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        inner: Arc<dyn CheckpointStore>,
        actor: impl Into<String>,
        rng: SmallRng,
        rates: FaultRates,
        on: Arc<AtomicBool>,
        log: Arc<FenceLog>,
        trace: Arc<Trace>,
        notifications: bool,
    ) -> Self {
        Faulty {
            inner,
            actor: actor.into(),
            rng: Mutex::new(rng),
            rates,
            on,
            paused_until: Mutex::new(None),
            log,
            trace,
            notifications,
            injected: Mutex::new(HashMap::new()),
        }
    }

    fn draw(&self, writes: bool) -> Fault {
        if !self.on.load(Ordering::SeqCst) {
            return Fault::None;
        }
        let r = &self.rates;
        let mut rng = lock(&self.rng);
        let x: f64 = rng.random();
        let pause = |rng: &mut SmallRng| {
            let (lo, hi) = r.pause_range;
            Duration::from_millis(rng.random_range(lo.as_millis() as u64..=hi.as_millis() as u64))
        };
        let mut at = r.error_before;
        if x < at {
            return Fault::ErrorBefore;
        }
        at += r.error_after;
        if x < at {
            return Fault::ErrorAfter;
        }
        at += r.pause;
        if x < at {
            return if writes && r.pause_after_commit && rng.random_bool(0.5) {
                Fault::PauseAfter(pause(&mut rng))
            } else {
                Fault::Pause(pause(&mut rng))
            };
        }
        at += r.delay;
        if x < at {
            let most = r.short_delay.as_millis() as u64;
            return Fault::Delay(Duration::from_millis(rng.random_range(0..=most)));
        }
        Fault::None
    }

    fn count(&self, kind: &'static str) {
        *lock(&self.injected).entry(kind).or_insert(0) += 1;
    }

    fn pause_for(&self, d: Duration) {
        let until = Instant::now() + d;
        let mut paused = lock(&self.paused_until);
        *paused = Some(paused.map_or(until, |p| p.max(until)));
    }

    async fn wait_if_paused(&self) {
        loop {
            let until = *lock(&self.paused_until);
            match until {
                Some(until) if until > Instant::now() => tokio::time::sleep_until(until).await,
                _ => return,
            }
        }
    }

    fn injected_error(&self, op: &str, after: bool) -> StoreError {
        let what = if after {
            "performed, then the acknowledgement was lost"
        } else {
            "failed before reaching the store"
        };
        StoreError::Database {
            backend: "sim",
            source: format!("injected fault ({}): `{op}` {what}", self.actor).into(),
        }
    }

    /// The one place faults are applied: waits out a pause of this actor, draws a fault
    /// for the call, and runs `call` (or not) accordingly. A fenced write (`write`) that
    /// the store accepted, and a lease that it granted (`granted`), are recorded in the
    /// [`FenceLog`], whatever the caller is told.
    pub(crate) async fn faulted<'a, T, F>(
        &'a self,
        op: &'static str,
        write: Write<'a>,
        granted: Granted<T>,
        call: F,
    ) -> Result<T, StoreError>
    where
        F: Future<Output = Result<T, StoreError>> + 'a,
    {
        self.wait_if_paused().await;
        let writes = write.is_some();
        let fault = self.draw(writes);
        match fault {
            Fault::None | Fault::ErrorAfter | Fault::PauseAfter(_) => {}
            Fault::ErrorBefore => {
                self.count("error_before");
                self.trace
                    .record(format_args!("{} {op} ErrorBefore", self.actor));
                return Err(self.injected_error(op, false));
            }
            Fault::Delay(d) => {
                self.count("delay");
                tokio::time::sleep(d).await;
            }
            Fault::Pause(d) => {
                self.count("pause");
                self.pause_for(d);
                self.wait_if_paused().await;
            }
        }
        // The floor is read as the real call begins: whatever was accepted or granted
        // before this point must fence this write out if its token is lower.
        let floor = write.map(|(session, _)| self.log.floor(session));
        let result = call.await;
        if let Ok(value) = &result {
            if let (Some((session, token)), Some(floor)) = (write, floor) {
                self.log.accepted(op, session, token, floor);
            }
            if let Some((session, token)) = granted(value) {
                self.log.saw(&session, token);
            }
        }
        self.trace.record(format_args!(
            "{} {op} {fault:?} {}",
            self.actor,
            if result.is_ok() { "ok" } else { "err" }
        ));
        match fault {
            Fault::ErrorAfter if result.is_ok() => {
                self.count("error_after");
                Err(self.injected_error(op, true))
            }
            Fault::PauseAfter(d) => {
                self.count("pause_after_commit");
                self.pause_for(d);
                self.wait_if_paused().await;
                result
            }
            _ => result,
        }
    }
}
