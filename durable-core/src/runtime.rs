//! [`Durable`]: the entry point that starts, resumes and recovers sessions on a store.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tracing::Instrument;

use crate::args::ArgLimits;
use crate::config;
use crate::encode::encode;
use crate::error::{DurableError, StoreError};
use crate::event::CallEvent;
use crate::ids::{CallId, SessionId};
use crate::session::{ResumeReport, Resumed, Session};
use crate::snapshot::{Budget, Plan};
use crate::store::{
    CallRecord, CheckpointStore, Claim, ForkPlan, NewCheckpoint, NewSession, PendingApproval,
    Resolution, SessionRecord, SessionStatus,
};
use crate::telemetry;

mod budget;
mod operator;
pub use budget::{PARKED_FOR_BUDGET, SessionBudget, session_budget};
pub use operator::Operator;

/// The largest priority magnitude a session is given ([`StartOptions::with_priority`]).
const MAX_PRIORITY: i32 = 1_000_000;

/// Builds a [`Durable`].
#[must_use]
pub struct DurableBuilder {
    store: Arc<dyn CheckpointStore>,
    config: config::Config,
}

impl DurableBuilder {
    /// This worker's name, recorded as lease owner (default: `host-pid`).
    ///
    /// Give every worker a stable name (`"worker-1"`, a pod name) when workers are
    /// restarted: a lease is never refused to its own owner, so a restarted worker with the
    /// same name re-acquires its sessions at once, where under the default (a new pid
    /// after the restart) it is refused with [`StoreError::Leased`] until the old lease
    /// expires, up to a full [`lease_ttl`](Self::lease_ttl). Taking back an unreleased
    /// lease counts as a recovery (see [`Durable::resume`]), so a session that keeps
    /// killing its restarted worker is still parked. Two live processes must never share
    /// a name: the second would silently take the first one's sessions (the first then
    /// loses its lease at its next write).
    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.config.owner = owner.into();
        self
    }

    /// Lease duration (default 30 s). A background task renews it at a third of that.
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.config.lease_ttl = ttl;
        self
    }

    /// The application version this worker runs (default `"0"`). A session started on
    /// another version is refused until retargeted.
    pub fn app_version(mut self, version: impl Into<String>) -> Self {
        self.config.app_version = version.into();
        self
    }

    /// Argument limits (depth, size).
    pub fn limits(mut self, limits: ArgLimits) -> Self {
        self.config.limits = limits;
        self
    }

    /// Caps on model replies, tool results and transcript messages (default 4 MiB,
    /// 4 MiB and 8 MiB of JSON text), checked before anything is written; see
    /// [`sizes`](crate::sizes).
    ///
    /// ```
    /// use durable_core::sizes::SizeLimits;
    /// # fn f(store: std::sync::Arc<dyn durable_core::CheckpointStore>) {
    /// let durable = durable_core::Durable::builder(store)
    ///     .size_limits(SizeLimits::default().with_max_reply_bytes(16 * 1024 * 1024))
    ///     .build();
    /// # }
    /// ```
    pub fn size_limits(mut self, sizes: crate::sizes::SizeLimits) -> Self {
        self.config.sizes = sizes;
        self
    }

    /// Recoveries of one session before it is parked as dead-lettered (default 5).
    pub fn max_recovery_attempts(mut self, attempts: i32) -> Self {
        self.config.max_recovery_attempts = attempts;
        self
    }

    /// Makes a resume load only the last `messages` messages of the transcript, so that
    /// resuming a session costs the same however long it has run (default: the whole
    /// transcript). [`Session::messages`] then starts at
    /// [`Session::first_position`]; [`Session::load_earlier`] reads earlier messages on
    /// demand, checked like the rest. Checkpoints append to the log as before: the
    /// messages not loaded stay in the transcript.
    ///
    /// A harness that sends the model only a recent window of the conversation (with a
    /// summary kept in the plan or [`state`](Session::state)) never needs the rest.
    ///
    /// ```
    /// # async fn run(store: std::sync::Arc<dyn durable_core::CheckpointStore>) {
    /// let durable = durable_core::Durable::builder(store).resume_window(200).build();
    /// # }
    /// ```
    pub fn resume_window(mut self, messages: usize) -> Self {
        self.config.resume_window = Some(messages);
        self
    }

    /// Calls `observer` for every journal decision (executed, cache hit, re-executed,
    /// verified, refused): for narration, metrics or tests.
    pub fn on_call(mut self, observer: impl Fn(&CallEvent) + Send + Sync + 'static) -> Self {
        self.config.observer = Some(Arc::new(observer));
        self
    }

    /// How long a session waiting for its children
    /// ([`Session::await_children`](crate::Session::await_children)) stays released at
    /// most before a worker takes it to look again (default 60 s). A child's end wakes
    /// its parent at once; this is the safety net under that wake-up (a notification
    /// lost with a crashed process, say), as polling is under a pool's notifications.
    pub fn child_recheck(mut self, every: Duration) -> Self {
        self.config.child_recheck = every;
        self
    }

    /// Whether leases are renewed in the background (default on). Off, a session
    /// holds its lease for one `lease_ttl` only (useful in tests of expiry).
    pub fn renew_leases(mut self, renew: bool) -> Self {
        self.config.renew_leases = renew;
        self
    }

    /// Decides, per call, which calls need a person's approval besides those whose tool
    /// says so (`#[durable_tool(approval = …)]`): given the tool and the call's arguments
    /// (secret ones masked), return the request to journal, or `None` to run the call. A
    /// `pure` call asked for is journaled too. See [`approval`](crate::approval).
    ///
    /// ```
    /// use durable_core::approval::{self, RequestExt};
    /// use std::time::Duration;
    /// # fn f(store: std::sync::Arc<dyn durable_core::CheckpointStore>) {
    /// // Every refund above 100 waits for a person, for at most a day.
    /// let durable = durable_core::Durable::builder(store)
    ///     .approval_policy(|tool, args| {
    ///         (tool.name == "refund" && args["amount"].as_u64() > Some(100))
    ///             .then(|| approval::request("policy: refunds above 100").with_deadline(Duration::from_secs(86_400)))
    ///     })
    ///     .build();
    /// # }
    /// ```
    pub fn approval_policy(
        mut self,
        policy: impl Fn(&crate::tool_spec::ToolSpec, &Value) -> Option<crate::store::ApprovalRequest>
        + Send
        + Sync
        + 'static,
    ) -> Self {
        self.config.approval_policy = Some(Arc::new(policy));
        self
    }

    /// Calls `hook` with the journal row (status `requested`, its approval set) once a
    /// call's approval request is durable: notify a person (post to a webhook or a chat
    /// channel from here; spawn anything slow, the call returns after the hook). Not
    /// called again when a replay finds the request already journaled.
    pub fn on_approval_requested(
        mut self,
        hook: impl Fn(&CallRecord) + Send + Sync + 'static,
    ) -> Self {
        self.config.on_approval_requested = Some(Arc::new(hook));
        self
    }

    /// Defines the fleet-wide rate limit `name` (see [`limiter`](crate::limiter)): calls
    /// that name it ([`Journal::with_rate_limit`](crate::Journal::with_rate_limit),
    /// [`Toolbox::rate_limit`](crate::Toolbox::rate_limit)) wait for their turn under it,
    /// with every worker of the store.
    ///
    /// The definition is written to the store on the first call that names the limit,
    /// so every worker reads the same one. The last definition written wins: a worker
    /// that defines a name differently replaces it for the whole fleet, and logs a
    /// warning naming the definition it replaced. Define a limit the same way on every
    /// worker (or on one, with [`Operator::define_rate_limit`], and name it elsewhere).
    ///
    /// ```no_run
    /// # fn demo(store: std::sync::Arc<dyn durable_core::CheckpointStore>) {
    /// use durable_core::Durable;
    /// use durable_core::limiter::{Quota, RateLimit};
    ///
    /// let durable = Durable::builder(store)
    ///     .rate_limit(
    ///         "openai:gpt-4.1",
    ///         RateLimit::requests(Quota::per_minute(500)).with_tokens(Quota::per_minute(200_000)),
    ///     )
    ///     .rate_limit("crm", RateLimit::requests(Quota::per_second(10)))
    ///     .build();
    /// # }
    /// ```
    pub fn rate_limit(mut self, name: impl Into<String>, limit: crate::limiter::RateLimit) -> Self {
        self.config.rate_limits.insert(name.into(), limit);
        self
    }

    /// The longest a call waits in memory, holding its session's lease, for its turn
    /// under a rate limit (default [`DEFAULT_HOLD`](crate::limiter::DEFAULT_HOLD), 10 s).
    /// A call whose turn is further away is refused with
    /// [`DurableError::RateLimited`] before anything runs; it keeps its place in the
    /// queue: the handler releases the session until then
    /// ([`Session::release_until`](crate::Session::release_until): no worker is held, a
    /// pool takes it at its turn and the turn is replayed), and the same call, asked
    /// again once its turn has come, takes its place at once.
    pub fn limiter_hold(mut self, hold: Duration) -> Self {
        self.config.limiter_hold = hold;
        self
    }

    /// How much a session's priority weighs against its age in worker pools' claims
    /// (default 60 s per priority level; see [`StartOptions::with_priority`]).
    pub fn priority_aging(mut self, aging: Duration) -> Self {
        self.config.priority_aging = aging;
        self
    }

    /// The ceilings every session starts with (money, tokens, model calls, tool calls,
    /// wall time, calls per tool), unless its [`StartOptions::with_budget`] sets its own:
    /// each ceiling the session's budget leaves unset is taken from here
    /// ([`Budget::with_defaults`]). Only the ceilings are used, not the spend. Sessions
    /// started before keep the ceilings their checkpoints carry.
    ///
    /// The journal checks them before every fresh model or tool call: see
    /// [`DurableError::BudgetExceeded`].
    ///
    /// ```no_run
    /// # fn demo(store: std::sync::Arc<dyn durable_core::CheckpointStore>) -> Result<(), durable_core::snapshot::InvalidAmount> {
    /// use std::time::Duration;
    /// use durable_core::{Budget, Durable};
    ///
    /// let durable = Durable::builder(store)
    ///     .budget(
    ///         Budget::unlimited()
    ///             .with_limit_usd(2.00)?
    ///             .with_limit_model_calls(50)
    ///             .with_limit_wall_time(Duration::from_secs(15 * 60))
    ///             .with_limit_tool("send_email", 3),
    ///     )
    ///     .build();
    /// # Ok(()) }
    /// ```
    pub fn budget(mut self, ceilings: Budget) -> Self {
        self.config.budget = ceilings;
        self
    }

    /// What model usage costs, per model: a model call journaled with its usage
    /// ([`Journal::model_with_usage`](crate::Journal::model_with_usage), which
    /// `durable-openai` and `durable-rig` use) is charged the dollars the table computes.
    ///
    /// ```
    /// # fn demo(store: std::sync::Arc<dyn durable_core::CheckpointStore>) -> Result<(), durable_core::snapshot::InvalidAmount> {
    /// use durable_core::Durable;
    /// use durable_core::snapshot::{Price, PriceTable};
    ///
    /// let durable = Durable::builder(store)
    ///     .prices(PriceTable::new().with("gpt-4o-mini", Price::usd_per_million(0.15, 0.60, 0.075)?))
    ///     .build();
    /// # Ok(()) }
    /// ```
    pub fn prices(mut self, prices: crate::snapshot::PriceTable) -> Self {
        self.config.prices = prices;
        self
    }

    /// Builds the runtime.
    pub fn build(self) -> Durable {
        Durable {
            store: self.store,
            config: Arc::new(self.config),
        }
    }
}

/// What a new session starts with: build it with [`StartOptions::new`] and the `with_*`
/// methods (the fields can be read and changed, but new ones may be added in any
/// release).
///
/// ```
/// use durable_core::{Message, SessionId, StartOptions};
/// use serde_json::json;
///
/// let options = StartOptions::new()
///     .with_id(SessionId::new("ticket-4711"))
///     .with_messages(vec![Message::system("You are a support agent."), Message::user("My order is late.")])
///     .with_metadata(json!({"customer": "c-981"}));
/// assert_eq!(options.id.as_str(), "ticket-4711");
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct StartOptions<M> {
    /// Its id (random by default).
    pub id: SessionId,
    /// Free-form metadata.
    pub metadata: Value,
    /// First messages (e.g. the system prompt and the task).
    pub messages: Vec<M>,
    /// Initial plan.
    pub plan: Plan,
    /// Initial budget (limits).
    pub budget: Budget,
    /// Application state.
    pub state: Value,
    /// The queue ([`DEFAULT_QUEUE`](crate::store::DEFAULT_QUEUE) when `None`).
    pub queue: Option<String>,
    /// No worker's pool claims the session before this time (ms since the epoch,
    /// database clock).
    pub not_before: Option<i64>,
    /// The session's claim priority: higher first (0 by default; see
    /// [`with_priority`](Self::with_priority)).
    pub priority: i32,
    /// The tenant the session counts against (see [`with_tenant`](Self::with_tenant)).
    pub tenant: Option<String>,
    /// For a child session: its spend also counts against its parent's ceilings (see
    /// [`with_spend_charged_to_parent`](Self::with_spend_charged_to_parent)).
    pub charge_parent: bool,
}

impl<M> Default for StartOptions<M> {
    fn default() -> Self {
        StartOptions {
            id: SessionId::random(),
            metadata: Value::Null,
            messages: Vec::new(),
            plan: Plan::default(),
            budget: Budget::default(),
            state: Value::Null,
            queue: None,
            not_before: None,
            priority: 0,
            tenant: None,
            charge_parent: false,
        }
    }
}

impl<M> StartOptions<M> {
    /// A random id, no messages, an empty plan, no budget limit, `null` metadata and state.
    pub fn new() -> Self {
        Self::default()
    }

    /// The session's id: yours to choose (an order, a ticket, a conversation), so that
    /// after a restart the same id finds the session again
    /// ([`Durable::start_or_resume`]). Random by default.
    pub fn with_id(mut self, id: SessionId) -> Self {
        self.id = id;
        self
    }

    /// Free-form metadata, stored with the session and shown by `durable show`.
    pub fn with_metadata(mut self, metadata: Value) -> Self {
        self.metadata = metadata;
        self
    }

    /// The first messages (the system prompt and the task).
    pub fn with_messages(mut self, messages: Vec<M>) -> Self {
        self.messages = messages;
        self
    }

    /// The initial plan.
    pub fn with_plan(mut self, plan: Plan) -> Self {
        self.plan = plan;
        self
    }

    /// The initial budget: its ceilings (money, tokens, model calls, tool calls, wall
    /// time, calls per tool), checked before every fresh model or tool call. Ceilings it
    /// leaves unset come from the runtime's ([`DurableBuilder::budget`]).
    pub fn with_budget(mut self, budget: Budget) -> Self {
        self.budget = budget;
        self
    }

    /// The application's own state, checkpointed with the transcript.
    pub fn with_state(mut self, state: Value) -> Self {
        self.state = state;
        self
    }

    /// The queue the session runs in: pools may take from some queues only
    /// ([`Worker::queues`](crate::worker::Worker::queues)), and a queue may have a
    /// fleet-wide limit ([`Operator::set_queue_limit`]). A queue name is checked like an
    /// id ([`validate_id`](crate::validate::validate_id)).
    pub fn with_queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = Some(queue.into());
        self
    }

    /// The session's priority for worker pools' claims: a pool takes the session with
    /// the highest priority first, the oldest first within a priority, with aging so the
    /// lowest is never starved. Precisely, claims take the lowest *rank*
    /// `created_at − priority × aging` first, where `aging` is
    /// [`DurableBuilder::priority_aging`] (60 s by default): a session of priority `p`
    /// goes before every session of priority `q > p` submitted more than
    /// `(q − p) × aging` after it. Default 0; negative priorities are allowed. Clamped
    /// to ±1 000 000.
    pub fn with_priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }

    /// The tenant the session counts against: no pool claims it while the tenant's
    /// limit of its sessions hold a lease ([`Operator::set_tenant_limit`]), across every
    /// queue and worker. A tenant name is checked like an id
    /// ([`validate_id`](crate::validate::validate_id)).
    pub fn with_tenant(mut self, tenant: impl Into<String>) -> Self {
        self.tenant = Some(tenant.into());
        self
    }

    /// For a child session ([`Session::spawn_child`](crate::Session::spawn_child)): its
    /// spend also counts against its parent's ceilings. The child starts with its money,
    /// token and wall-time ceilings lowered to what the parent has left of its own when
    /// the child is created ([`Budget::capped_by_parent`]), so it cannot spend more than
    /// the parent may; and when the parent collects the child's outcome
    /// ([`collect_child`](crate::Session::collect_child),
    /// [`await_children`](crate::Session::await_children)), what the child spent (money
    /// and tokens) is charged to the parent, once: the collection is a journal row that
    /// carries the spend, so a re-run parent reads it back and is not charged again.
    /// The parent's next model or tool call is then checked against its ceilings with
    /// the child's spend counted.
    ///
    /// Children running at once are each capped at the headroom the parent had when it
    /// started them: together they may spend past it, and the parent's next call is then
    /// refused. A child's model and tool calls count against its own call ceilings, not
    /// the parent's. Ignored by [`Durable::start`] and [`Durable::submit`].
    ///
    /// ```
    /// use durable_core::{Budget, Message, StartOptions};
    ///
    /// let reader = StartOptions::<Message>::new()
    ///     .with_budget(Budget::unlimited().with_limit_usd(0.50)?)
    ///     .with_spend_charged_to_parent();
    /// assert!(reader.charge_parent);
    /// # Ok::<(), durable_core::snapshot::InvalidAmount>(())
    /// ```
    pub fn with_spend_charged_to_parent(mut self) -> Self {
        self.charge_parent = true;
        self
    }

    /// Delays the session: no pool claims it before `at` (ms since the epoch, on the
    /// database's clock), as if it had gone to sleep at its start
    /// ([`Session::sleep_until`](crate::Session::sleep_until)). Meant for
    /// [`Durable::submit`]: a session [`start`](Durable::start)ed holds its lease and
    /// runs at once.
    pub fn with_not_before(mut self, at: i64) -> Self {
        self.not_before = Some(at);
        self
    }
}

/// The durable runtime: a store plus this worker's settings.
///
/// These are the harness's verbs: start, resume and recover sessions, submit them to
/// worker pools and run the pools. What an operator does from outside a session (decide
/// approvals, resolve in-doubt calls, wake, unpark, retarget, fork, set queue limits, and
/// the listings that serve it) is on the [`Operator`] handle: [`Durable::operator`].
///
/// # Example
/// ```no_run
/// # use std::sync::Arc;
/// # use durable_core::{CheckpointStore, Durable, runtime::StartOptions, transcript::Message};
/// # async fn demo(store: Arc<dyn CheckpointStore>) -> Result<(), durable_core::DurableError> {
/// let durable = Durable::builder(store).owner("worker-1").app_version("v3").build();
/// let mut session = durable.start::<Message>(StartOptions::default()).await?;
/// session.push(Message::user("Summarise the report"));
/// session.checkpoint().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Durable {
    pub(crate) store: Arc<dyn CheckpointStore>,
    pub(crate) config: Arc<config::Config>,
}

impl std::fmt::Debug for Durable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Durable")
            .field("backend", &self.store.backend())
            .field("config", &self.config)
            .finish()
    }
}

/// `host-pid`: unique per process, so a restarted worker waits out its old leases
/// (see [`DurableBuilder::owner`] for a stable name).
fn default_owner() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "worker".into());
    format!("{host}-{}", std::process::id())
}

impl Durable {
    /// Starts configuring a runtime over `store`.
    pub fn builder(store: Arc<dyn CheckpointStore>) -> DurableBuilder {
        DurableBuilder {
            store,
            config: config::Config {
                owner: default_owner(),
                lease_ttl: Duration::from_secs(30),
                app_version: "0".into(),
                limits: ArgLimits::default(),
                sizes: crate::sizes::SizeLimits::default(),
                max_recovery_attempts: 5,
                observer: None,
                renew_leases: true,
                resume_window: None,
                approval_policy: None,
                on_approval_requested: None,
                rate_limits: std::collections::BTreeMap::new(),
                limiter_hold: crate::limiter::DEFAULT_HOLD,
                defined_limits: Default::default(),
                priority_aging: Duration::from_secs(60),
                budget: Budget::default(),
                prices: crate::snapshot::PriceTable::default(),
                child_recheck: Duration::from_secs(60),
            },
        }
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn CheckpointStore> {
        &self.store
    }

    /// The settings.
    pub fn config(&self) -> &config::Config {
        &self.config
    }

    /// Starts a new session: writes version 0 and takes its lease.
    ///
    /// A session id that [`validate_id`](crate::validate::validate_id) refuses fails with
    /// [`StoreError::InvalidId`] before anything is written.
    pub async fn start<M>(&self, options: StartOptions<M>) -> Result<Session<M>, DurableError>
    where
        M: Serialize + DeserializeOwned + Clone,
    {
        options.id.validate()?;
        let options = StartOptions {
            budget: options.budget.with_defaults(&self.config.budget),
            ..options
        };
        let messages = options
            .messages
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let max = self.config.sizes.max_message_bytes;
                crate::sizes::check(m, max, || crate::sizes::Oversized::Message {
                    session: options.id.clone(),
                    position: i64::try_from(i).unwrap_or(i64::MAX).saturating_add(1),
                })?;
                encode(m, format_args!("initial message {i} (counting from 0)"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let initial = NewCheckpoint {
            messages,
            plan: encode(&options.plan, "plan")?,
            budget: encode(&options.budget, "budget")?,
            state: options.state.clone(),
            wake_at: options.not_before,
        };
        if let Some(queue) = &options.queue {
            crate::validate::validate_id("queue", queue)?;
        }
        if let Some(tenant) = &options.tenant {
            crate::validate::validate_id("tenant", tenant)?;
        }
        let requested = tokio::time::Instant::now();
        let (record, lease) = self
            .store
            .create_session(NewSession {
                id: options.id,
                app_version: self.config.app_version.clone(),
                metadata: options.metadata,
                owner: self.config.owner.clone(),
                lease_ttl: self.config.lease_ttl,
                initial,
                queue: options.queue,
            })
            .await?;
        if options.priority != 0 || options.tenant.is_some() {
            // Before the lease is given up: no claim sees the session unscheduled.
            let mut scheduling = crate::store::Scheduling::new().with_priority(
                options.priority.clamp(-MAX_PRIORITY, MAX_PRIORITY),
                self.config.priority_aging,
            );
            scheduling.tenant = options.tenant;
            self.store
                .set_scheduling(lease.fence(), &scheduling)
                .await?;
        }
        tracing::info!(session = %record.id, "session started");
        Ok(Session::assemble(
            Arc::clone(&self.store),
            Arc::clone(&self.config),
            record,
            (lease, requested),
            0,
            (1, options.messages),
            options.plan,
            options.budget,
            options.state,
            (Vec::new(), true),
        ))
    }

    /// Resumes the session `options.id` names if it exists, or starts it with `options`:
    /// what a harness calls after a restart, with the id it keeps for the piece of work
    /// (an order, a ticket, a conversation). A new session comes back with an empty
    /// [`ResumeReport`] (version 0, nothing in doubt).
    ///
    /// Errors as [`resume`](Self::resume) and [`start`](Self::start): a session another
    /// worker holds is [`StoreError::Leased`], a completed one
    /// [`StoreError::NotResumable`]. Two workers racing
    /// to start the same id are safe: one creates it, the other resumes it (or finds it
    /// leased).
    ///
    /// ```no_run
    /// # use durable_core::{Durable, DurableError, Message, SessionId, StartOptions};
    /// # async fn demo(durable: Durable) -> Result<(), DurableError> {
    /// let options = StartOptions::new().with_id(SessionId::new("order-1017"));
    /// let resumed = durable.start_or_resume::<Message>(options).await?;
    /// for doubt in &resumed.report.in_doubt {
    ///     eprintln!("in doubt: {} ({:?})", doubt.call.identity.tool, doubt.action);
    /// }
    /// let mut session = resumed.session;
    /// # let _ = &mut session; Ok(()) }
    /// ```
    pub async fn start_or_resume<M>(
        &self,
        options: StartOptions<M>,
    ) -> Result<Resumed<M>, DurableError>
    where
        M: Serialize + DeserializeOwned + Clone,
    {
        options.id.validate()?;
        let id = options.id.clone();
        match self.resume(&id).await {
            Err(DurableError::Store(StoreError::SessionNotFound(_))) => {}
            resumed => return resumed,
        }
        match self.start(options).await {
            Ok(session) => Ok(Resumed {
                session,
                report: ResumeReport::new(0, Vec::new()),
            }),
            // Another worker created it in between: resume it like any other.
            Err(DurableError::Store(StoreError::SessionExists(_))) => self.resume(&id).await,
            Err(e) => Err(e),
        }
    }

    /// Resumes a session: takes its lease (refused while another worker holds it),
    /// loads the latest checkpoint and reports every in-doubt call.
    ///
    /// Messages logged after the latest checkpoint are ignored (not deleted): the
    /// incomplete turn is re-run, and its journaled model responses and tool results
    /// make the re-run replay the first attempt.
    ///
    /// A resume that takes over a lease its holder never released (the worker died, or
    /// this worker restarted under the same [`owner`](DurableBuilder::owner)) is a
    /// recovery, counted exactly as in [`recover_next`](Self::recover_next): once
    /// [`max_recovery_attempts`](DurableBuilder::max_recovery_attempts) recoveries died
    /// without a checkpoint, the session is parked and this fails with
    /// [`StoreError::Parked`]; an operator unparks it ([`Operator::unpark`],
    /// `durable unpark <id>`). Resuming a released session counts nothing.
    pub async fn resume<M>(&self, id: &SessionId) -> Result<Resumed<M>, DurableError>
    where
        M: Serialize + DeserializeOwned + Clone,
    {
        let requested = tokio::time::Instant::now();
        let lease = self
            .store
            .acquire_lease(
                id,
                &self.config.owner,
                self.config.lease_ttl,
                self.config.max_recovery_attempts,
            )
            .await?;
        self.resume_leased(lease, requested, OnFailure::Release)
            .await
    }

    /// Claims one session whose worker died (expired lease) or that was released, and
    /// resumes it. Sessions whose recoveries keep dying are parked after
    /// [`max_recovery_attempts`](DurableBuilder::max_recovery_attempts) (the count is
    /// shared with [`resume`](Self::resume); a checkpoint resets it).
    ///
    /// Only sessions of this runtime's [`app_version`](DurableBuilder::app_version) are
    /// claimed (a session of another version is left to workers of its version, or to
    /// [`retarget`](Self::retarget)), sessions asleep are left until their
    /// wake-up time ([`Session::sleep_until`](crate::Session::sleep_until)), and a queue
    /// at its fleet-wide limit ([`Operator::set_queue_limit`]) gives none.
    pub async fn recover_next<M>(&self) -> Result<Option<Resumed<M>>, DurableError>
    where
        M: Serialize + DeserializeOwned + Clone,
    {
        self.claim_next(&[]).await
    }

    /// [`recover_next`](Self::recover_next), from the given queues only (any when empty).
    pub(crate) async fn claim_next<M>(
        &self,
        queues: &[String],
    ) -> Result<Option<Resumed<M>>, DurableError>
    where
        M: Serialize + DeserializeOwned + Clone,
    {
        let claim = Claim::new(
            self.config.owner.clone(),
            self.config.lease_ttl,
            self.config.max_recovery_attempts,
        )
        .with_app_version(self.config.app_version.clone())
        .with_queues(queues.iter().cloned());
        loop {
            let requested = tokio::time::Instant::now();
            let claimed = self.store.claim_expired(&claim).await?;
            return match claimed {
                // A session that cannot be resumed (its messages no longer decode, a row
                // fails its seal, …) keeps the lease: it expires, the next claim counts a
                // recovery, and the poison-pill bound parks the session. Handed back at
                // once, it would be the oldest session again and the next claim would
                // take it again, forever.
                Some(lease) => match self
                    .resume_leased(lease, requested, OnFailure::LetExpire)
                    .await
                {
                    // Cancelled while its worker held it: ended now; claim the next one.
                    Err(DurableError::Cancelled { .. }) => continue,
                    resumed => resumed.map(Some),
                },
                None => Ok(None),
            };
        }
    }

    /// Resumes the session of `lease`, which was requested from the store at `requested`
    /// (the lease's local deadline counts from then: see `Journal::new`).
    async fn resume_leased<M>(
        &self,
        lease: crate::store::Lease,
        requested: tokio::time::Instant,
        on_failure: OnFailure,
    ) -> Result<Resumed<M>, DurableError>
    where
        M: Serialize + DeserializeOwned + Clone,
    {
        let span = tracing::info_span!(
            telemetry::RESUME,
            { telemetry::GEN_AI_CONVERSATION_ID } = lease.session.as_str(),
            { telemetry::DURABLE_SESSION_VERSION } = tracing::field::Empty,
            { telemetry::DURABLE_RESUME_IN_DOUBT } = tracing::field::Empty,
            { telemetry::ERROR_TYPE } = tracing::field::Empty,
        );
        let resumed = self
            .resume_in_span(lease, requested, on_failure)
            .instrument(span.clone())
            .await;
        if let Err(e) = &resumed {
            span.record(telemetry::ERROR_TYPE, telemetry::durable_error_type(e));
        }
        resumed
    }

    async fn resume_in_span<M>(
        &self,
        lease: crate::store::Lease,
        requested: tokio::time::Instant,
        on_failure: OnFailure,
    ) -> Result<Resumed<M>, DurableError>
    where
        M: Serialize + DeserializeOwned + Clone,
    {
        // The three reads run at once (the lease is ours, so nothing they read can change
        // under them), and their errors are reported in this order.
        let load = async {
            match self.config.resume_window {
                Some(window) => {
                    self.store
                        .load_checkpoint_window(&lease.session, None, window)
                        .await
                }
                None => self.store.load_checkpoint(&lease.session, None).await,
            }
        };
        // Only the issued rows, every one's seal checked and their number checked against
        // the head's sealed count: an in-doubt row shown as completed (or deleted) behind
        // the store's back leaves the count short, so the resume fails before any step is
        // replayed. Other rows are checked when their step is read.
        let (record, loaded, issued) = tokio::join!(
            self.store.session(&lease.session),
            load,
            self.store.issued_calls(&lease.session)
        );
        let record = match record {
            Ok(record) => record,
            Err(e) => {
                on_failure.apply(&*self.store, &lease).await;
                return Err(e.into());
            }
        };
        if record.app_version != self.config.app_version {
            on_failure.apply(&*self.store, &lease).await;
            return Err(DurableError::AppVersionMismatch {
                session: record.id,
                recorded: record.app_version,
                running: self.config.app_version.clone(),
            });
        }
        // Cancelled while a worker held it (that worker died or let go before its next
        // call): whoever takes it next ends it, and nothing of it runs.
        if let Some(request) = &record.cancel_requested {
            let reason = crate::store::cancel_reason(&request.by, &request.reason);
            match self
                .store
                .set_status(lease.fence(), SessionStatus::Cancelled, Some(&reason))
                .await
            {
                Ok(()) | Err(StoreError::LeaseLost { .. }) => {}
                Err(e) => return Err(e.into()),
            }
            tracing::info!(session = %record.id, by = %request.by, "session cancelled on resume");
            return Err(DurableError::Cancelled {
                session: record.id,
                by: request.by.clone(),
                reason: request.reason.clone(),
            });
        }
        let checkpoint = match loaded {
            Ok(cp) => cp,
            Err(e) => {
                on_failure.apply(&*self.store, &lease).await;
                return Err(e.into());
            }
        };
        let version = checkpoint.meta.version;
        let first_position = checkpoint.meta.last_seq - checkpoint.messages.len() as i64 + 1;
        let crate::store::Checkpoint {
            messages,
            plan,
            budget,
            state,
            ..
        } = checkpoint;
        // Each message is parsed once, from its stored text straight into `M`; each
        // snapshot is moved into its type, not cloned.
        let decoded = (|| {
            let messages = (first_position..)
                .zip(&messages)
                .map(|(position, m)| {
                    m.decode::<M>().map_err(|e| {
                        decode_error(&record.id, version, &format!("message {position}"), &e)
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            let plan = decode::<Plan>(&record.id, version, "plan", plan)?;
            let budget = decode::<Budget>(&record.id, version, "budget", budget)?;
            Ok::<_, DurableError>((messages, plan, budget))
        })();
        let (messages, plan, budget) = match decoded {
            Ok(d) => d,
            Err(e) => {
                on_failure.apply(&*self.store, &lease).await;
                return Err(e);
            }
        };
        let in_doubt = match issued {
            Ok(rows) => rows,
            Err(e) => {
                on_failure.apply(&*self.store, &lease).await;
                return Err(e.into());
            }
        };
        let report = ResumeReport::new(version, in_doubt.clone());
        let span = tracing::Span::current();
        span.record(telemetry::DURABLE_SESSION_VERSION, version);
        span.record(
            telemetry::DURABLE_RESUME_IN_DOUBT,
            i64::try_from(report.in_doubt.len()).unwrap_or(i64::MAX),
        );
        tracing::info!(version, in_doubt = report.in_doubt.len(), "session resumed");
        let session = Session::assemble(
            Arc::clone(&self.store),
            Arc::clone(&self.config),
            record,
            (lease, requested),
            version,
            (first_position, messages),
            plan,
            budget,
            state,
            (in_doubt, false),
        );
        Ok(Resumed { session, report })
    }
}

// The operator's verbs, on the runtime for one more release: each forwards to the same
// verb of `Durable::operator`.
impl Durable {
    /// Moved to [`Operator::in_doubt`]; forwards to it.
    #[deprecated(
        since = "0.2.0",
        note = "use `durable.operator().in_doubt(…)`: the operator's verbs moved to `Operator`"
    )]
    pub async fn in_doubt(
        &self,
        session: Option<&SessionId>,
    ) -> Result<Vec<CallRecord>, DurableError> {
        self.operator().in_doubt(session).await
    }

    /// Moved to [`Operator::resolve`]; forwards to it.
    #[deprecated(
        since = "0.2.0",
        note = "use `durable.operator().resolve(…)`: the operator's verbs moved to `Operator`"
    )]
    pub async fn resolve(
        &self,
        call: &CallId,
        resolution: Resolution,
        by: &str,
        note: Option<&str>,
    ) -> Result<CallRecord, DurableError> {
        self.operator().resolve(call, resolution, by, note).await
    }

    /// Moved to [`Operator::approvals`]; forwards to it.
    #[deprecated(
        since = "0.2.0",
        note = "use `durable.operator().approvals(…)`: the operator's verbs moved to `Operator`"
    )]
    pub async fn approvals(
        &self,
        session: Option<&SessionId>,
    ) -> Result<Vec<PendingApproval>, DurableError> {
        self.operator().approvals(session).await
    }

    /// Moved to [`Operator::approve`]; forwards to it.
    #[deprecated(
        since = "0.2.0",
        note = "use `durable.operator().approve(…)`: the operator's verbs moved to `Operator`"
    )]
    pub async fn approve(
        &self,
        call: &CallId,
        edited: Option<Value>,
        by: &str,
        note: Option<&str>,
    ) -> Result<CallRecord, DurableError> {
        self.operator().approve(call, edited, by, note).await
    }

    /// Moved to [`Operator::deny`]; forwards to it.
    #[deprecated(
        since = "0.2.0",
        note = "use `durable.operator().deny(…)`: the operator's verbs moved to `Operator`"
    )]
    pub async fn deny(
        &self,
        call: &CallId,
        reason: &str,
        by: &str,
        note: Option<&str>,
    ) -> Result<CallRecord, DurableError> {
        self.operator().deny(call, reason, by, note).await
    }

    /// Moved to [`Operator::revoke`]; forwards to it.
    #[deprecated(
        since = "0.2.0",
        note = "use `durable.operator().revoke(…)`: the operator's verbs moved to `Operator`"
    )]
    pub async fn revoke(
        &self,
        call: &CallId,
        reason: &str,
        by: &str,
        note: Option<&str>,
    ) -> Result<CallRecord, DurableError> {
        self.operator().revoke(call, reason, by, note).await
    }

    /// Moved to [`Operator::expire_approvals`]; forwards to it.
    #[deprecated(
        since = "0.2.0",
        note = "use `durable.operator().expire_approvals(…)`: the operator's verbs moved to `Operator`"
    )]
    pub async fn expire_approvals(
        &self,
        session: Option<&SessionId>,
    ) -> Result<Vec<CallRecord>, DurableError> {
        self.operator().expire_approvals(session).await
    }

    /// Moved to [`Operator::set_queue_limit`]; forwards to it.
    #[deprecated(
        since = "0.2.0",
        note = "use `durable.operator().set_queue_limit(…)`: the operator's verbs moved to `Operator`"
    )]
    pub async fn set_queue_limit(
        &self,
        queue: &str,
        max_running: Option<u32>,
    ) -> Result<(), DurableError> {
        self.operator().set_queue_limit(queue, max_running).await
    }

    /// Moved to [`Operator::queues`]; forwards to it.
    #[deprecated(
        since = "0.2.0",
        note = "use `durable.operator().queues(…)`: the operator's verbs moved to `Operator`"
    )]
    pub async fn queues(&self) -> Result<Vec<crate::store::QueueInfo>, DurableError> {
        self.operator().queues().await
    }

    /// Moved to [`Operator::wake`]; forwards to it.
    #[deprecated(
        since = "0.2.0",
        note = "use `durable.operator().wake(…)`: the operator's verbs moved to `Operator`"
    )]
    pub async fn wake(&self, session: &SessionId) -> Result<SessionRecord, DurableError> {
        self.operator().wake(session).await
    }

    /// Moved to [`Operator::unpark`]; forwards to it.
    #[deprecated(
        since = "0.2.0",
        note = "use `durable.operator().unpark(…)`: the operator's verbs moved to `Operator`"
    )]
    pub async fn unpark(&self, session: &SessionId) -> Result<SessionRecord, DurableError> {
        self.operator().unpark(session).await
    }

    /// Moved to [`Operator::retarget`]; forwards to it.
    #[deprecated(
        since = "0.2.0",
        note = "use `durable.operator().retarget(…)`: the operator's verbs moved to `Operator`"
    )]
    pub async fn retarget(
        &self,
        session: &SessionId,
        step_map: Vec<(String, String)>,
        by: &str,
    ) -> Result<SessionRecord, DurableError> {
        self.operator().retarget(session, step_map, by).await
    }

    /// Moved to [`Operator::fork`]; forwards to it.
    #[deprecated(
        since = "0.2.0",
        note = "use `durable.operator().fork(…)`: the operator's verbs moved to `Operator`"
    )]
    pub async fn fork<M>(
        &self,
        session: &SessionId,
        version: i64,
        new_id: Option<SessionId>,
    ) -> Result<Session<M>, DurableError>
    where
        M: Serialize + DeserializeOwned + Clone,
    {
        self.operator().fork::<M>(session, version, new_id).await
    }

    /// Moved to [`Operator::fork_plan`]; forwards to it.
    #[deprecated(
        since = "0.2.0",
        note = "use `durable.operator().fork_plan(…)`: the operator's verbs moved to `Operator`"
    )]
    pub async fn fork_plan(
        &self,
        session: &SessionId,
        version: i64,
        rerun: &[CallId],
    ) -> Result<ForkPlan, DurableError> {
        self.operator().fork_plan(session, version, rerun).await
    }

    /// Moved to [`Operator::fork_with`]; forwards to it.
    #[deprecated(
        since = "0.2.0",
        note = "use `durable.operator().fork_with(…)`: the operator's verbs moved to `Operator`"
    )]
    pub async fn fork_with<M>(
        &self,
        session: &SessionId,
        version: i64,
        options: ForkOptions,
    ) -> Result<(Session<M>, ForkPlan), DurableError>
    where
        M: Serialize + DeserializeOwned + Clone,
    {
        self.operator()
            .fork_with::<M>(session, version, options)
            .await
    }
}

/// An operator's options for [`Operator::fork_with`].
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct ForkOptions {
    /// The new session's id (random if `None`).
    pub new_id: Option<SessionId>,
    /// Calls of the parent the fork may run again (not inherited; audited). Each must be
    /// a call the fork would otherwise inherit ([`Operator::fork_plan`] lists them).
    pub rerun: Vec<CallId>,
    /// Who forks, for the audit (this worker's owner name if `None`).
    pub by: Option<String>,
}

impl ForkOptions {
    /// Default options: a random id, nothing run again, this worker as who forks.
    pub fn new() -> Self {
        Self::default()
    }

    /// The new session's id.
    #[must_use]
    pub fn new_id(mut self, id: SessionId) -> Self {
        self.new_id = Some(id);
        self
    }

    /// Lets the fork run these calls of the parent again (audited).
    #[must_use]
    pub fn rerun(mut self, calls: impl IntoIterator<Item = CallId>) -> Self {
        self.rerun.extend(calls);
        self
    }

    /// Who forks, for the audit.
    #[must_use]
    pub fn by(mut self, by: impl Into<String>) -> Self {
        self.by = Some(by.into());
        self
    }
}

fn decode<T: DeserializeOwned>(
    session: &SessionId,
    version: i64,
    what: &str,
    value: Value,
) -> Result<T, DurableError> {
    serde_json::from_value(value).map_err(|e| decode_error(session, version, what, &e))
}

fn decode_error(
    session: &SessionId,
    version: i64,
    what: &str,
    e: &serde_json::Error,
) -> DurableError {
    DurableError::Decode {
        session: session.clone(),
        what: format!("{what} at checkpoint version {version}"),
        detail: e.to_string(),
    }
}

/// What a resume that failed does with the lease it took.
#[derive(Debug, Clone, Copy)]
enum OnFailure {
    /// Gives it back (a resume by id: the caller sees the error and decides).
    Release,
    /// Leaves it to expire (a claim: the next one counts a recovery, so a session that
    /// cannot be resumed is parked after the bound instead of being claimed again at
    /// once, forever).
    LetExpire,
}

impl OnFailure {
    async fn apply(self, store: &dyn CheckpointStore, lease: &crate::store::Lease) {
        match self {
            OnFailure::Release => {
                let _ = store.release_lease(lease).await;
            }
            OnFailure::LetExpire => {
                tracing::warn!(session = %lease.session, "resume failed; the lease is left to expire, and the next claim counts a recovery");
            }
        }
    }
}

/// Moved to [`config::Config`]; kept for one release.
#[doc(hidden)]
#[deprecated(note = "moved to `durable_core::config::Config`")]
pub type Config = config::Config;

/// Moved to [`config::CallObserver`]; kept for one release.
#[doc(hidden)]
#[deprecated(note = "moved to `durable_core::config::CallObserver`")]
pub type CallObserver = config::CallObserver;
