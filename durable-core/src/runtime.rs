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
    ApprovalDecision, CallRecord, CallStatus, CheckpointStore, Claim, DEADLINE, DecideApproval,
    ForkPlan, ForkSession, NewCheckpoint, NewSession, PendingApproval, Resolution, ResolveCall,
    RetargetSession, SessionRecord, SessionStatus,
};
use crate::telemetry;

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

    /// The initial budget (its limits).
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
    /// fleet-wide limit ([`Durable::set_queue_limit`]). A queue name is checked like an
    /// id ([`validate_id`](crate::validate::validate_id)).
    pub fn with_queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = Some(queue.into());
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
        tracing::info!(session = %record.id, "session started");
        Ok(Session::assemble(
            Arc::clone(&self.store),
            Arc::clone(&self.config),
            record,
            lease,
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
    /// [`StoreError::Parked`]; an operator unparks it ([`unpark`](Self::unpark),
    /// `durable unpark <id>`). Resuming a released session counts nothing.
    pub async fn resume<M>(&self, id: &SessionId) -> Result<Resumed<M>, DurableError>
    where
        M: Serialize + DeserializeOwned + Clone,
    {
        let lease = self
            .store
            .acquire_lease(
                id,
                &self.config.owner,
                self.config.lease_ttl,
                self.config.max_recovery_attempts,
            )
            .await?;
        self.resume_leased(lease, OnFailure::Release).await
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
    /// at its fleet-wide limit ([`set_queue_limit`](Self::set_queue_limit)) gives none.
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
        let claimed = self.store.claim_expired(&claim).await?;
        match claimed {
            // A session that cannot be resumed (its messages no longer decode, a row fails
            // its seal, …) keeps the lease: it expires, the next claim counts a recovery,
            // and the poison-pill bound parks the session. Handed back at once, it would be
            // the oldest session again and the next claim would take it again, forever.
            Some(lease) => self
                .resume_leased(lease, OnFailure::LetExpire)
                .await
                .map(Some),
            None => Ok(None),
        }
    }

    async fn resume_leased<M>(
        &self,
        lease: crate::store::Lease,
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
            .resume_in_span(lease, on_failure)
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
            lease,
            version,
            (first_position, messages),
            plan,
            budget,
            state,
            (in_doubt, false),
        );
        Ok(Resumed { session, report })
    }

    /// Every in-doubt call (all sessions, or one).
    pub async fn in_doubt(
        &self,
        session: Option<&SessionId>,
    ) -> Result<Vec<CallRecord>, DurableError> {
        Ok(self.store.in_doubt(session).await?)
    }

    /// Resolves an in-doubt call as an operator, audited with `by` and `note`.
    ///
    /// *Happened* records `result` as the call's result: on resume it is what the
    /// tool call returns, so the agent continues with it. *Did not happen* lets the
    /// next resume execute the call.
    ///
    /// A session parked for this call (a harness parks on `ReplayUnsafe`) is returned to
    /// `active` once none of its calls is in doubt any more, so the next resume (or
    /// [`recover_next`](Self::recover_next)) continues it.
    pub async fn resolve(
        &self,
        call: &CallId,
        resolution: Resolution,
        by: &str,
        note: Option<&str>,
    ) -> Result<CallRecord, DurableError> {
        let record = self
            .store
            .resolve_call(ResolveCall {
                call: call.clone(),
                resolution,
                by: by.to_owned(),
                note: note.map(str::to_owned),
            })
            .await?;
        let session = &record.identity.session;
        if self.store.session(session).await?.status == SessionStatus::Parked
            && self.store.in_doubt(Some(session)).await?.is_empty()
        {
            match self.store.unpark_session(session).await {
                Ok(_) | Err(StoreError::NotParked { .. }) => {}
                Err(e) => return Err(e.into()),
            }
            tracing::info!(%session, "session unparked: no call is in doubt any more");
        }
        Ok(record)
    }

    /// Calls awaiting a person's decision (all sessions, or one), oldest request first;
    /// `expired` says whether a deadline passed (see
    /// [`expire_approvals`](Self::expire_approvals)).
    pub async fn approvals(
        &self,
        session: Option<&SessionId>,
    ) -> Result<Vec<PendingApproval>, DurableError> {
        Ok(self.store.pending_approvals(session).await?)
    }

    /// Approves a requested call as `by`, with `edited` arguments instead of the
    /// requested ones when `Some` (checked by
    /// [`check_edited_args`](crate::approval::check_edited_args): valid against the
    /// tool's schema, secret arguments unchanged; an edit equal to the request approves
    /// it as requested). Audited with `by` and `note`. Once no call of the session awaits
    /// a decision, it is `active` again and the next resume runs the call, exactly once.
    ///
    /// # Errors
    /// [`DurableError::InvalidEdit`] (nothing decided);
    /// [`StoreError::NotAwaitingApproval`] when the call is not awaiting a decision (of
    /// two operators deciding at once, the second gets this);
    /// [`StoreError::ApprovalExpired`] past its deadline.
    pub async fn approve(
        &self,
        call: &CallId,
        edited: Option<Value>,
        by: &str,
        note: Option<&str>,
    ) -> Result<CallRecord, DurableError> {
        let args = match edited {
            None => None,
            Some(edited) => {
                let row = self.store.call(call).await?;
                if row.status != CallStatus::Requested {
                    return Err(StoreError::NotAwaitingApproval {
                        call: call.clone(),
                        status: row.status.as_str().to_owned(),
                    }
                    .into());
                }
                crate::approval::check_edited_args(&row, &edited, &self.config.limits)?
            }
        };
        self.decide(call, ApprovalDecision::Approve { args }, by, note)
            .await
    }

    /// Denies a requested call as `by`: it never runs, and `reason` becomes the tool
    /// result the model reads on the next resume. Errors as for
    /// [`approve`](Self::approve); an empty reason is
    /// [`StoreError::EmptyDenialReason`].
    pub async fn deny(
        &self,
        call: &CallId,
        reason: &str,
        by: &str,
        note: Option<&str>,
    ) -> Result<CallRecord, DurableError> {
        let decision = ApprovalDecision::Deny {
            reason: reason.to_owned(),
        };
        self.decide(call, decision, by, note).await
    }

    /// Takes back the approval of a call that has not run, as `by`: it never runs, and
    /// `reason` becomes the tool result the model reads. For an approved call that cannot
    /// run any more ([`DurableError::ApprovedCallRefused`]: its tool's schema changed,
    /// its edited arguments no longer decode, a secret is not held after a restart): the
    /// session's step cannot end until it is decided again.
    ///
    /// # Errors
    /// [`StoreError::NotAwaitingApproval`] unless the call is `approved` (a requested one
    /// is denied with [`deny`](Self::deny)); an empty reason is
    /// [`StoreError::EmptyDenialReason`].
    pub async fn revoke(
        &self,
        call: &CallId,
        reason: &str,
        by: &str,
        note: Option<&str>,
    ) -> Result<CallRecord, DurableError> {
        let decision = ApprovalDecision::Revoke {
            reason: reason.to_owned(),
        };
        self.decide(call, decision, by, note).await
    }

    /// Denies every request whose deadline has passed (on the store's clock), by the
    /// deadline (audited as `deadline`), across sessions or for one; returns the calls
    /// expired now. A request decided meanwhile by a person is left to that decision.
    pub async fn expire_approvals(
        &self,
        session: Option<&SessionId>,
    ) -> Result<Vec<CallRecord>, DurableError> {
        let mut expired = Vec::new();
        for pending in self.store.pending_approvals(session).await? {
            if !pending.expired {
                continue;
            }
            match self
                .decide(&pending.call.id, ApprovalDecision::Expire, DEADLINE, None)
                .await
            {
                Ok(row) => expired.push(row),
                Err(DurableError::Store(StoreError::NotAwaitingApproval { .. })) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(expired)
    }

    async fn decide(
        &self,
        call: &CallId,
        decision: ApprovalDecision,
        by: &str,
        note: Option<&str>,
    ) -> Result<CallRecord, DurableError> {
        let row = self
            .store
            .decide_approval(DecideApproval {
                call: call.clone(),
                decision,
                by: by.to_owned(),
                note: note.map(str::to_owned),
            })
            .await?;
        tracing::info!(call = %row.id, tool = %row.identity.tool, status = row.status.as_str(), by, "approval decided");
        Ok(row)
    }

    /// Sets (or, with `None`, removes) a queue's fleet-wide limit: at most `max_running`
    /// of its sessions run at once across every worker of the store (the store enforces
    /// it when a pool claims; see [`CheckpointStore::set_queue_limit`](crate::store::QueueStore::set_queue_limit)).
    ///
    /// ```no_run
    /// # async fn demo(durable: durable_core::Durable) -> Result<(), durable_core::DurableError> {
    /// // The mail provider allows two concurrent senders: two email agents at most.
    /// durable.set_queue_limit("email", Some(2)).await?;
    /// # Ok(()) }
    /// ```
    pub async fn set_queue_limit(
        &self,
        queue: &str,
        max_running: Option<u32>,
    ) -> Result<(), DurableError> {
        self.store.set_queue_limit(queue, max_running).await?;
        tracing::info!(queue, ?max_running, "queue limit set");
        Ok(())
    }

    /// How each queue stands: running, ready, sleeping, awaiting approval, parked, and
    /// its limit ([`QueueInfo`](crate::store::QueueInfo)).
    pub async fn queues(&self) -> Result<Vec<crate::store::QueueInfo>, DurableError> {
        Ok(self.store.queues().await?)
    }

    /// Wakes a sleeping session now, so that the next pool claim takes it (an operator's
    /// decision; see [`Session::sleep_until`](crate::Session::sleep_until)).
    pub async fn wake(&self, session: &SessionId) -> Result<SessionRecord, DurableError> {
        Ok(self.store.wake_session(session).await?)
    }

    /// Returns a parked session to `active` (an operator's decision, e.g. after fixing
    /// what made its recoveries die). Refused with `NotParked` for any other status.
    pub async fn unpark(&self, session: &SessionId) -> Result<SessionRecord, DurableError> {
        Ok(self.store.unpark_session(session).await?)
    }

    /// Moves a session to this worker's app version, with a mapping of renamed tools or
    /// steps (audited; `durable retarget` from the command line). Not a schema migration:
    /// the database is untouched.
    pub async fn retarget(
        &self,
        session: &SessionId,
        step_map: Vec<(String, String)>,
        by: &str,
    ) -> Result<SessionRecord, DurableError> {
        let current = self.store.session(session).await?;
        Ok(self
            .store
            .retarget_session(RetargetSession {
                session: session.clone(),
                from_version: current.app_version,
                to_version: self.config.app_version.clone(),
                step_map,
                by: by.to_owned(),
            })
            .await?)
    }

    /// Forks `session` at `version` into a new session leased to this worker.
    ///
    /// **A fork never repeats an effect of its parent.** The fork's version 0 is the
    /// parent's version `version` and its first turn (step 0) re-runs the turn the parent
    /// ran from there, asking the model anew. The parent's calls with a side effect made
    /// from that version on are inherited: those of the re-run turn by identity (a
    /// recorded result comes back, an in-doubt call stays in doubt and bars the fork's
    /// effects until it is resolved or verified, and a re-run that asks for something else
    /// while one is unreplayed is refused as [`DurableError::ReplayDiverged`]), those of
    /// later turns by tool and arguments (a fork call that would repeat one is refused with
    /// [`DurableError::InheritedEffect`]); the parent's in-doubt calls of earlier turns
    /// keep barring the fork's effects. `pure` calls and model replies are not inherited.
    /// See [`store::ForkSession`](crate::store::ForkSession) for the rule and
    /// [`fork_plan`](Self::fork_plan) to see what it does to a given session before
    /// forking it; [`fork_with`](Self::fork_with) lets an operator run chosen calls again.
    pub async fn fork<M>(
        &self,
        session: &SessionId,
        version: i64,
        new_id: Option<SessionId>,
    ) -> Result<Session<M>, DurableError>
    where
        M: Serialize + DeserializeOwned + Clone,
    {
        let options = ForkOptions {
            new_id,
            ..ForkOptions::default()
        };
        Ok(self.fork_with(session, version, options).await?.0)
    }

    /// What forking `session` at `version` would do with each of its calls with a side
    /// effect, `rerun` being the calls an operator would let the fork run again. Reads
    /// only (every row checked under its seal). A `rerun` call the fork would not copy
    /// anyway (or not a call of `session`) is [`StoreError::CallNotFound`].
    pub async fn fork_plan(
        &self,
        session: &SessionId,
        version: i64,
        rerun: &[CallId],
    ) -> Result<ForkPlan, DurableError> {
        // The version must exist before anything is said about it.
        self.store.load_checkpoint(session, Some(version)).await?;
        let rows = self.store.calls(session, None).await?;
        ForkPlan::new(session.clone(), version, &rows, rerun)
            .map_err(|unknown| DurableError::Store(StoreError::CallNotFound(unknown[0].clone())))
    }

    /// Forks `session` at `version` as [`fork`](Self::fork) does, with the options of an
    /// operator: the new id, the calls the fork may run again
    /// ([`ForkOptions::rerun`], audited with the fork) and who forks. Returns the new
    /// session and the plan that was applied (computed just before the fork's
    /// transaction, which applies the same rule).
    pub async fn fork_with<M>(
        &self,
        session: &SessionId,
        version: i64,
        options: ForkOptions,
    ) -> Result<(Session<M>, ForkPlan), DurableError>
    where
        M: Serialize + DeserializeOwned + Clone,
    {
        let new_id = options.new_id.unwrap_or_else(SessionId::random);
        new_id.validate()?;
        let plan = self.fork_plan(session, version, &options.rerun).await?;
        let by = options.by.unwrap_or_else(|| self.config.owner.clone());
        let request = ForkSession::new(
            session.clone(),
            version,
            new_id,
            self.config.owner.clone(),
            self.config.lease_ttl,
        )
        .rerun(options.rerun)
        .by(by);
        let (_, lease) = self.store.fork_session_with(&request).await?;
        let resumed = self.resume_leased::<M>(lease, OnFailure::Release).await?;
        Ok((resumed.session, plan))
    }
}

/// An operator's options for [`Durable::fork_with`].
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct ForkOptions {
    /// The new session's id (random if `None`).
    pub new_id: Option<SessionId>,
    /// Calls of the parent the fork may run again (not inherited; audited). Each must be
    /// a call the fork would otherwise inherit ([`Durable::fork_plan`] lists them).
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
