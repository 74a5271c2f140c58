//! [`Config`]: the settings every session of a [`Durable`](crate::Durable) shares.

use std::sync::Arc;
use std::time::Duration;

use crate::args::ArgLimits;
use crate::event::CallEvent;

/// Observer of journal decisions (see [`DurableBuilder::on_call`](crate::DurableBuilder::on_call)).
pub type CallObserver = Arc<dyn Fn(&CallEvent) + Send + Sync>;

/// Runtime settings shared by every session of a [`Durable`](crate::Durable): set with
/// [`DurableBuilder`](crate::DurableBuilder), read back with
/// [`Durable::config`](crate::Durable::config).
#[non_exhaustive]
pub struct Config {
    /// This worker's name (lease owner).
    pub owner: String,
    /// How long a lease lasts without renewal.
    pub lease_ttl: Duration,
    /// The application/graph version this worker runs.
    pub app_version: String,
    /// Argument limits.
    pub limits: ArgLimits,
    /// Caps on model replies, tool results and transcript messages.
    pub sizes: crate::sizes::SizeLimits,
    /// Recoveries before a session is parked.
    pub max_recovery_attempts: i32,
    /// Journal observer.
    pub observer: Option<CallObserver>,
    /// Whether a background task renews leases.
    pub renew_leases: bool,
    /// How many of the transcript's last messages a resume loads (`None`: all of them).
    pub resume_window: Option<usize>,
    /// Which calls need a person's approval besides those whose tool says so.
    pub approval_policy: Option<crate::approval::ApprovalPolicy>,
    /// Called once a call's approval request is durable.
    pub on_approval_requested: Option<crate::approval::ApprovalHook>,
    /// Rate limits this worker defines in the store, by name (written on the first call
    /// that names one; see [`DurableBuilder::rate_limit`](crate::DurableBuilder::rate_limit)).
    pub rate_limits: std::collections::BTreeMap<String, crate::limiter::RateLimit>,
    /// The longest a call waits in memory for its turn under a rate limit; a longer wait
    /// is refused with [`DurableError::RateLimited`](crate::DurableError::RateLimited),
    /// keeping its place (see [`DurableBuilder::limiter_hold`](crate::DurableBuilder::limiter_hold)).
    pub limiter_hold: Duration,
    /// How much a priority level weighs against age in claims
    /// ([`DurableBuilder::priority_aging`](crate::DurableBuilder::priority_aging)).
    pub priority_aging: Duration,
    /// The names of [`rate_limits`](Self::rate_limits) written to the store by this
    /// process so far.
    pub(crate) defined_limits: std::sync::Mutex<std::collections::HashSet<String>>,
    /// The ceilings every session starts with unless its
    /// [`StartOptions`](crate::StartOptions) set their own.
    pub budget: crate::snapshot::Budget,
    /// What model usage costs, per model.
    pub prices: crate::snapshot::PriceTable,
    /// How long a session waiting for its children stays released at most before a
    /// worker takes it to look again (the safety net under the wake-up a child's end
    /// gives it).
    pub child_recheck: Duration,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("owner", &self.owner)
            .field("lease_ttl", &self.lease_ttl)
            .field("app_version", &self.app_version)
            .field("limits", &self.limits)
            .field("sizes", &self.sizes)
            .field("max_recovery_attempts", &self.max_recovery_attempts)
            .field("resume_window", &self.resume_window)
            .field("approval_policy", &self.approval_policy.is_some())
            .field("rate_limits", &self.rate_limits)
            .field("limiter_hold", &self.limiter_hold)
            .field("budget", &self.budget)
            .field("prices", &self.prices)
            .finish_non_exhaustive()
    }
}
