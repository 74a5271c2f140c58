//! What a worker may claim ([`Claim`]) and how its queues stand ([`QueueInfo`]): the
//! store's side of the worker pool.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::error::StoreError;

/// What [`CheckpointStore::claim_expired`](super::LeaseStore::claim_expired) may
/// take, and for whom.
///
/// ```
/// use std::time::Duration;
/// use durable_core::store::Claim;
///
/// let claim = Claim::new("worker-1", Duration::from_secs(30), 3)
///     .with_app_version("v3")
///     .with_queues(["email", "refunds"]);
/// assert_eq!(claim.queues, ["email", "refunds"]);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Claim {
    /// Who takes the lease.
    pub owner: String,
    /// How long the lease lasts.
    pub ttl: Duration,
    /// The poison-pill bound: a recovery beyond it parks the session instead.
    pub max_attempts: i32,
    /// Only sessions of this app version (any when `None`). A worker cannot run a
    /// session of another version: claiming one would only hand it back.
    pub app_version: Option<String>,
    /// Only sessions of these queues (any when empty).
    pub queues: Vec<String>,
}

impl Claim {
    /// A claim of any session, for `owner`, with a lease of `ttl`.
    pub fn new(owner: impl Into<String>, ttl: Duration, max_attempts: i32) -> Self {
        Claim {
            owner: owner.into(),
            ttl,
            max_attempts,
            app_version: None,
            queues: Vec::new(),
        }
    }

    /// Only sessions of this app version.
    pub fn with_app_version(mut self, version: impl Into<String>) -> Self {
        self.app_version = Some(version.into());
        self
    }

    /// Only sessions of these queues.
    pub fn with_queues<Q: Into<String>>(mut self, queues: impl IntoIterator<Item = Q>) -> Self {
        self.queues = queues.into_iter().map(Into::into).collect();
        self
    }

    /// Checks the owner, app version and queue names ([`validate_id`]). Stores call it
    /// before touching the database.
    ///
    /// [`validate_id`]: crate::validate::validate_id
    pub fn validate(&self) -> Result<(), StoreError> {
        crate::validate::validate_owner(&self.owner)?;
        if let Some(version) = &self.app_version {
            crate::validate::validate_id("app version", version)?;
        }
        for queue in &self.queues {
            crate::validate::validate_id("queue", queue)?;
        }
        Ok(())
    }
}

/// How claims schedule a session, set by its submitter
/// ([`CheckpointStore::set_scheduling`](super::QueueStore::set_scheduling)): its priority
/// (with the aging that bounds how long a lower one waits) and its tenant.
///
/// ```
/// use std::time::Duration;
/// use durable_core::store::Scheduling;
///
/// let scheduling = Scheduling::new()
///     .with_priority(5, Duration::from_secs(60))
///     .with_tenant("acme");
/// assert_eq!(scheduling.tenant.as_deref(), Some("acme"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Scheduling {
    /// Higher first; claims take the lowest rank `created_at − priority × aging` first.
    pub priority: i32,
    /// How much one priority level weighs against age.
    pub aging: Duration,
    /// The tenant the session counts against: at most the tenant's limit of its
    /// sessions hold a lease at once ([`set_tenant_limit`](super::QueueStore::set_tenant_limit)).
    pub tenant: Option<String>,
}

impl Default for Scheduling {
    fn default() -> Self {
        Scheduling {
            priority: 0,
            aging: Duration::from_secs(60),
            tenant: None,
        }
    }
}

impl Scheduling {
    /// Priority 0, aging 60 s, no tenant.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the priority and its aging.
    pub fn with_priority(mut self, priority: i32, aging: Duration) -> Self {
        self.priority = priority;
        self.aging = aging;
        self
    }

    /// Sets the tenant.
    pub fn with_tenant(mut self, tenant: impl Into<String>) -> Self {
        self.tenant = Some(tenant.into());
        self
    }

    /// The rank offset `priority × aging` (ms, saturating).
    pub fn rank_offset(&self) -> i64 {
        i64::from(self.priority)
            .saturating_mul(i64::try_from(self.aging.as_millis()).unwrap_or(i64::MAX))
    }

    /// Checks the tenant's name ([`validate_id`](crate::validate::validate_id)).
    pub fn validate(&self) -> Result<(), StoreError> {
        if let Some(tenant) = &self.tenant {
            crate::validate::validate_id("tenant", tenant)?;
        }
        Ok(())
    }
}

/// How one queue stands, from [`CheckpointStore::queues`](super::QueueStore::queues):
/// what operators watch (`durable workers`, the console).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct QueueInfo {
    /// The queue's name.
    pub name: String,
    /// Its fleet-wide limit: at most this many of its sessions leased at once.
    pub max_running: Option<u32>,
    /// Active sessions with a live lease: being worked on (or held by a worker that
    /// died, until the lease expires).
    pub running: i64,
    /// Active sessions a claim would take now: lease released or expired, not asleep, not
    /// waiting for their children.
    pub ready: i64,
    /// Active sessions asleep (their wake-up time is still to come), lease released.
    pub sleeping: i64,
    /// Active sessions waiting, lease released: parents waiting for their children
    /// (woken by a child's end, or at their recheck time:
    /// [`Session::await_children`](crate::Session::await_children)) and sessions released
    /// until a time ([`Session::release_until`](crate::Session::release_until)).
    pub waiting: i64,
    /// Sessions waiting for people to decide on their calls.
    pub awaiting_approval: i64,
    /// Parked sessions (an operator must look at them).
    pub parked: i64,
    /// The earliest wake-up time still to come (ms, database clock).
    pub next_wake_at: Option<i64>,
}

/// A tenant's figures at one moment: its fleet-wide limit and its sessions
/// ([`tenants`](super::QueueStore::tenants)), what operators watch (`durable workers`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct TenantInfo {
    /// The tenant's name.
    pub name: String,
    /// Its fleet-wide limit: at most this many of its active sessions leased at once
    /// ([`set_tenant_limit`](super::QueueStore::set_tenant_limit)).
    pub max_running: Option<u32>,
    /// Its active sessions with a live lease.
    pub running: i64,
    /// Its active sessions that are not leased (ready, asleep or waiting): what its
    /// limit holds back when `running` is at it.
    pub queued: i64,
}

impl TenantInfo {
    /// A tenant's figures (for backends building one).
    pub fn new(
        name: impl Into<String>,
        max_running: Option<u32>,
        running: i64,
        queued: i64,
    ) -> Self {
        TenantInfo {
            name: name.into(),
            max_running,
            running,
            queued,
        }
    }
}

impl QueueInfo {
    /// An empty queue's figures (for backends building one).
    pub fn new(name: impl Into<String>) -> Self {
        QueueInfo {
            name: name.into(),
            max_running: None,
            running: 0,
            ready: 0,
            sleeping: 0,
            waiting: 0,
            awaiting_approval: 0,
            parked: 0,
            next_wake_at: None,
        }
    }
}

/// Tells idle worker pools that work may have become available (a session submitted or
/// released, a decision taken, a sleeper woken), so that they claim at once instead of
/// at their next poll. A store holds one and hands out [`WorkEvents`]
/// ([`CheckpointStore::work_events`](super::QueueStore::work_events)); it is a
/// speed-up only: pools poll as well, and a notification may be spurious.
#[derive(Debug, Clone)]
pub struct WorkNotifier(std::sync::Arc<watch::Sender<u64>>);

impl Default for WorkNotifier {
    fn default() -> Self {
        WorkNotifier(std::sync::Arc::new(watch::channel(0).0))
    }
}

impl WorkNotifier {
    /// A notifier nobody listens to yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Tells every subscriber that work may be available.
    pub fn notify(&self) {
        self.0.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// A subscription: [`WorkEvents::changed`] resolves after the next
    /// [`notify`](Self::notify).
    pub fn subscribe(&self) -> WorkEvents {
        WorkEvents(self.0.subscribe())
    }
}

/// A subscription to a store's [`WorkNotifier`].
#[derive(Debug, Clone)]
pub struct WorkEvents(watch::Receiver<u64>);

impl WorkEvents {
    /// Resolves once work may have become available since the last call (at once if it
    /// did meanwhile); never, once the store is gone.
    pub async fn changed(&mut self) {
        if self.0.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}
