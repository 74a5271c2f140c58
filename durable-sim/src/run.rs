//! One run: a seed in, a [`Report`] out.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use durable_core::snapshot::Spend;
use durable_core::store::{
    ApprovalRequest, CheckpointStore, Resolution, SessionFilter, SessionStatus,
};
use durable_core::{
    CallError, Durable, DurableError, Message, ReplayClass, Resumed, Session, SessionId,
    ShutdownSignal, StartOptions, Verification,
};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::faulty::{FaultRates, Faulty, FenceLog, lock};
use crate::program::{Op, Program, Programs, Tools, spend_of};
use crate::store::Backend;
use crate::trace::Trace;
use crate::world::World;

/// What a run may be told besides its seed.
#[derive(Debug, Clone)]
pub struct Options {
    /// Let a pause strike after a write committed, before the caller hears of it (see
    /// [`FaultRates::pause_after_commit`]). On by default; `--no-pause-after-commit`.
    pub pause_after_commit: bool,
    /// The store the run shares (`--sqlite`: SQLite on the real clock).
    pub backend: Backend,
    /// A guard switched off for a revert experiment (`--guard-off <guard>`, see
    /// `durable_core::guard_switch`): the run should find a violation.
    pub guard_off: Option<String>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            pause_after_commit: true,
            backend: Backend::Memory,
            guard_off: None,
        }
    }
}

/// The guards a revert experiment may switch off (`--guard-off`).
pub const GUARDS: &[&str] = &[
    "absence",
    "atomic_complete",
    "barrier",
    "divergence",
    "poison_pill",
    "fencing",
    "finite",
    "lease_recheck",
    "signal_key",
];

/// What a run found.
#[derive(Debug, Clone)]
pub struct Report {
    /// The seed.
    pub seed: u64,
    /// Every invariant violation, in the order found (empty: the run passed).
    pub violations: Vec<String>,
    /// A one-line summary of what the run did.
    pub summary: String,
    /// The digest of the run's event log ([`Trace`]): the same for every run of the seed
    /// on the memory store.
    pub trace: u64,
    /// The run's event log, one line per event.
    pub events: Vec<String>,
}

impl Report {
    /// Whether every invariant held.
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }
}

/// The command that runs `seed` again.
pub fn reproduce(seed: u64, options: &Options) -> String {
    let mut command = format!("cargo run -p durable-sim --release -- --seed {seed}");
    if !options.pause_after_commit {
        command.push_str(" --no-pause-after-commit");
    }
    if options.backend == Backend::Sqlite {
        command.push_str(" --sqlite");
    }
    if let Some(guard) = &options.guard_off {
        command.push_str(" --guard-off ");
        command.push_str(guard);
    }
    command
}

fn failed(seed: u64, why: String) -> Report {
    Report {
        seed,
        violations: vec![why],
        summary: String::new(),
        trace: 0,
        events: Vec::new(),
    }
}

/// Runs the simulation for `seed` on a fresh current-thread runtime and store.
///
/// On the memory store the runtime's clock is paused: time moves only when every task
/// waits, straight to the next timer, so a run takes the CPU time it needs and no more,
/// and the same seed gives the same run.
pub fn run_seed(seed: u64, options: &Options) -> Report {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(options.backend.virtual_time())
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return failed(seed, format!("could not build a runtime: {e}")),
    };
    let switch = options
        .guard_off
        .as_ref()
        .map(|guard| format!("durable::guard_off::{guard}"));
    if let Some(name) = &switch
        && let Err(e) = fail::cfg(name, "return")
    {
        return failed(seed, format!("could not switch {name} off: {e}"));
    }
    let report = runtime.block_on(simulate(seed, options));
    if let Some(name) = &switch {
        fail::remove(name);
    }
    report
}

/// Everything a handler needs, shared by every worker.
struct Ctx {
    world: Arc<World>,
    /// The real store, without faults: what the invariants read.
    store: Arc<dyn CheckpointStore>,
    trace: Arc<Trace>,
    programs: Programs,
    tools: Tools,
    /// How often a verify hook answers `Unknown` instead of reading the outbox.
    unknown: f64,
    rng: std::sync::Mutex<SmallRng>,
    /// The forks the operator made: by fork, the session it was forked from and at
    /// which version (the fork's step `n` is its parent's step `version + n`).
    forks: std::sync::Mutex<BTreeMap<SessionId, (SessionId, i64)>>,
}

impl Ctx {
    /// The session whose program `id` runs, the offset of its steps in it, and whether
    /// `id` is a fork.
    fn origin(&self, id: &SessionId) -> (SessionId, i64, bool) {
        match lock(&self.forks).get(id) {
            Some((parent, version)) => (parent.clone(), *version, true),
            None => (id.clone(), 0, false),
        }
    }

    /// Every session of the run: the programs' and the forks'.
    fn sessions(&self) -> Vec<SessionId> {
        let mut all: Vec<SessionId> = self.programs.keys().cloned().collect();
        all.extend(lock(&self.forks).keys().cloned());
        all
    }
}

/// Why a step stopped.
enum Stop {
    /// Refused as replay-unsafe: only an operator can go on; the handler releases.
    Operator,
    /// A call awaits a person's approval: the handler parks the session until it is
    /// decided.
    Approval,
    /// A fork's call would repeat its parent's effect, or its re-run left the parent's
    /// path: refused; the fork ends there (failed).
    Refused(DurableError),
    /// Anything else: the handler returns it (the lease is left to expire).
    Error(DurableError),
}

fn stop<E: std::fmt::Display>(world: &World, call: &str, e: CallError<E>) -> Stop {
    match e {
        CallError::Durable(DurableError::ReplayUnsafe { .. }) => Stop::Operator,
        CallError::Durable(DurableError::AwaitingApproval { .. }) => Stop::Approval,
        CallError::Durable(
            refused @ (DurableError::InheritedEffect { .. } | DurableError::ReplayDiverged { .. }),
        ) => Stop::Refused(refused),
        CallError::Durable(e) => Stop::Error(e),
        other => {
            // The simulated tools never fail: a failure is not theirs.
            world.violation(format!("{call}: a tool failure came back: {other}"));
            Stop::Error(DurableError::Encode {
                what: call.to_owned(),
                detail: other.to_string(),
            })
        }
    }
}

/// The tools' bodies sleep a moment before and after their effect, so that a crash
/// lands before the effect as well as after it.
const NETWORK: Duration = Duration::from_millis(1);

/// An effect is about to land for logical call `key` of session `id`: no other
/// `unsafe_on_replay` call of the session may be in doubt in the store (the session-wide
/// barrier's promise: nothing with a side effect runs beside a call in doubt).
async fn beside_doubt(ctx: &Ctx, id: &SessionId, key: &str) {
    let Ok(rows) = ctx.store.in_doubt(Some(id)).await else {
        return;
    };
    if let Some(row) = rows
        .iter()
        .find(|row| row.class == ReplayClass::UnsafeOnReplay && row.args["call"] != key)
    {
        ctx.world.violation(format!(
            "effect beside an in-doubt unsafe call: {key} ran while {} {} was in doubt",
            row.identity.tool, row.args["call"]
        ));
    }
}

/// Runs one step of `session`'s program: `ops` are the calls of step `origin_step` of
/// the program of session `origin` (the session itself, or the one it was forked from:
/// a fork's calls are its parent's, with the same arguments).
async fn run_step(
    session: &Session<Message>,
    ctx: &Arc<Ctx>,
    (origin, origin_step): (&SessionId, i64),
    ops: &[(String, Op)],
    reword: bool,
    parallel: bool,
) -> Result<(), Stop> {
    let id = session.id().clone();
    let step = session.version();
    let world = &ctx.world;
    let model_key = format!("{id}/{step}/model");
    let reply: Value = session
        .model_with_spend(
            || {
                let world = Arc::clone(world);
                let key = model_key.clone();
                async move { Ok::<Value, String>(world.reply(&key)) }
            },
            |_| Some(Spend::from_nano_usd(spend_of(step as u64), 10, 5)),
        )
        .await
        .map_err(|e| stop(world, &model_key, e))?;
    world.observe(&model_key, &reply);
    if parallel {
        // The calls of the reply at once, as `Toolbox::dispatch_all` runs them.
        let journal = session.journal();
        let outcomes =
            journal
                .join_calls(ops.iter().map(|(j, op)| {
                    run_op(session, ctx, (origin, origin_step), (j, *op), reword, true)
                }))
                .await;
        return outcomes.into_iter().collect();
    }
    for (j, op) in ops {
        run_op(session, ctx, (origin, origin_step), (j, *op), reword, false).await?;
    }
    Ok(())
}

/// One call of a step: its tool run through the journal, its result observed.
async fn run_op(
    session: &Session<Message>,
    ctx: &Arc<Ctx>,
    (origin, origin_step): (&SessionId, i64),
    (j, op): (&String, Op),
    reword: bool,
    parallel: bool,
) -> Result<(), Stop> {
    let id = session.id().clone();
    let step = session.version();
    let world = &ctx.world;
    // The logical call (its ledgers' key, in its arguments), and what the harness saw
    // of it in this session.
    let key = format!("{origin}/{origin_step}/{j}");
    let seen = format!("{id}/{step}/{j}");
    let journal = session.journal();
    let result = match op {
        Op::Email => {
            let unknown = lock(&ctx.rng).random_bool(ctx.unknown);
            let (w1, w2, k1, k2) = (
                Arc::clone(world),
                Arc::clone(world),
                key.clone(),
                key.clone(),
            );
            let (c1, s1, s2) = (Arc::clone(ctx), id.clone(), id.clone());
            let args = if reword {
                json!({ "call": key, "draft": 2 })
            } else {
                json!({ "call": key })
            };
            journal
                .tool(&ctx.tools.email, args)
                .run_verified(
                    move |tool| {
                        let (world, key) = (Arc::clone(&w1), k1.clone());
                        let (ctx, session) = (Arc::clone(&c1), s1.clone());
                        let attempt =
                            format!("attempt {} of call {}", tool.attempt(), tool.call_id());
                        async move {
                            tokio::time::sleep(NETWORK).await;
                            beside_doubt(&ctx, &session, &key).await;
                            let sent = world.send_email(&key, session.as_str(), &attempt);
                            ctx.trace.record(format_args!("email {key} {sent}"));
                            tokio::time::sleep(NETWORK).await;
                            Ok::<Value, String>(sent)
                        }
                    },
                    move |_| async move {
                        if unknown {
                            return Verification::Unknown;
                        }
                        match w2.email_sent(&k2, s2.as_str()) {
                            Some(sent) => Verification::Happened(sent),
                            None => Verification::DidNotHappen,
                        }
                    },
                )
                .await
        }
        Op::Charge(amount) => {
            let (w, k) = (Arc::clone(world), key.clone());
            let (c1, s1) = (Arc::clone(ctx), id.clone());
            journal
                .tool(&ctx.tools.charge, json!({ "call": key, "amount": amount }))
                .key(format!("pay-{key}"))
                .run(move |tool| {
                    let (world, call) = (Arc::clone(&w), k.clone());
                    let (ctx, session) = (Arc::clone(&c1), s1.clone());
                    // The key the journal recorded with the row, as the payment API
                    // receives it.
                    let idem = tool.idempotency_key().unwrap_or_default().to_owned();
                    async move {
                        tokio::time::sleep(NETWORK).await;
                        beside_doubt(&ctx, &session, &call).await;
                        let charged = world.charge(&call, &idem, amount);
                        ctx.trace.record(format_args!("charge {call} {charged}"));
                        tokio::time::sleep(NETWORK).await;
                        Ok::<Value, String>(charged)
                    }
                })
                .await
        }
        Op::Wire(amount) => {
            let (w, k) = (Arc::clone(world), key.clone());
            let (c1, s1) = (Arc::clone(ctx), id.clone());
            let outcome = journal
                .tool(&ctx.tools.wire, json!({ "call": key, "amount": amount }))
                .require_approval(ApprovalRequest {
                    asked_by: "policy".into(),
                    reasoning: None,
                    expires_in: None,
                    schema: None,
                })
                .run(move |_| {
                    let (world, call) = (Arc::clone(&w), k.clone());
                    let (ctx, session) = (Arc::clone(&c1), s1.clone());
                    async move {
                        tokio::time::sleep(NETWORK).await;
                        beside_doubt(&ctx, &session, &call).await;
                        let sent = world.wire(&call, session.as_str(), amount);
                        ctx.trace.record(format_args!("wire {call} {sent}"));
                        tokio::time::sleep(NETWORK).await;
                        Ok::<Value, String>(sent)
                    }
                })
                .await;
            match outcome {
                // Denied: the denial is the call's result, as the model reads it.
                Err(CallError::Recorded(denied)) => Ok(json!({ "denied": denied.message })),
                other => other,
            }
        }
        Op::Measure(non_finite) => {
            let outcome =
                journal
                    .tool(&ctx.tools.measure, json!({ "call": key }))
                    .run(move |_| async move {
                        Ok::<f64, String>(if non_finite { f64::NAN } else { 0.5 })
                    })
                    .await;
            // What the harness sees, as text (JSON holds no NaN).
            match outcome {
                Ok(ratio) => Ok(json!(format!("{ratio:?}"))),
                Err(CallError::Durable(DurableError::InvalidValue { .. })) => {
                    Ok(json!("refused: not finite"))
                }
                Err(CallError::Durable(DurableError::Decode { .. })) => {
                    Ok(json!("the recorded result no longer decodes"))
                }
                Err(e) => Err(e),
            }
        }
        Op::Read => match session.recv_signal("note").await {
            Ok(read) => {
                let id = read.as_ref().map(|signal| signal.id);
                // Reads of one name in one batch of concurrent calls are told apart by
                // their arrival, as identical tool calls are: a signal is read once in
                // the step, not at a fixed one of them.
                let place = if parallel {
                    format!("{origin}/{origin_step}/read")
                } else {
                    key.clone()
                };
                if let Some(id) = id {
                    ctx.trace.record(format_args!("read {key} signal #{id}"));
                    world.read_signal(&place, id);
                }
                if parallel {
                    return Ok(());
                }
                Ok(json!(id))
            }
            Err(e) => Err(CallError::Durable(e)),
        },
        Op::Lookup => {
            let answer = json!({ "fact": format!("about {key}") });
            journal
                .tool(&ctx.tools.lookup, json!({ "call": key }))
                .run(move |_| {
                    let answer = answer.clone();
                    async move { Ok::<Value, String>(answer) }
                })
                .await
        }
    };
    let value = result.map_err(|e| stop(world, &key, e))?;
    ctx.trace.record(format_args!("result {seen} {value}"));
    world.observe(&seen, &value);
    Ok(())
}

/// The agent loop of one session: each step from the checkpoint it resumed at, a
/// checkpoint after each; completes after the last. Releases the session when an
/// operator is needed or the pool is shutting down.
async fn handle(
    resumed: Resumed<Message>,
    shutdown: ShutdownSignal,
    ctx: Arc<Ctx>,
) -> Result<(), DurableError> {
    let mut session = resumed.session;
    let (origin, offset, fork) = ctx.origin(session.id());
    let Some(program) = ctx.programs.get(&origin).cloned() else {
        return session.release().await;
    };
    if is_poison(session.id()) {
        // It runs (a model call marks the lease running), then dies without releasing,
        // every time: its recoveries must park it.
        let _ = session
            .model(|| async { Ok::<Value, String>(json!({ "reply": "poison" })) })
            .await;
        return Err(DurableError::Encode {
            what: "a poison pill".into(),
            detail: "this session kills its worker every time it runs".into(),
        });
    }
    loop {
        let step = session.version();
        // A handler of one turn runs its turn whatever the version says.
        let origin_step = if program.single_turn {
            0
        } else {
            step + offset
        };
        let Some(index) = usize::try_from(origin_step)
            .ok()
            .filter(|&s| s < program.steps.len())
        else {
            return session.complete().await.map(|_| ());
        };
        let attempt = ctx.world.attempt(session.id(), step);
        let ops = program.calls(index, attempt);
        ctx.trace.record(format_args!(
            "run {} step {step} attempt {attempt}",
            session.id()
        ));
        // A fork's first turn asks the model anew, and the new reply words its emails
        // differently: the divergence check must refuse them (they would repeat the
        // parent's email under other arguments).
        let reword = fork && step == 0;
        let refused = match run_step(
            &session,
            &ctx,
            (&origin, origin_step),
            &ops,
            reword,
            program.parallel,
        )
        .await
        {
            Ok(()) if program.single_turn => {
                session.push(Message::user("done"));
                return session.complete().await.map(|_| ());
            }
            Ok(()) => {
                session.push(Message::user(format!("step {step} done")));
                match session.checkpoint().await {
                    Ok(_) => None,
                    Err(refused @ DurableError::ReplayDiverged { .. }) => Some(refused),
                    Err(e) => return Err(e),
                }
            }
            Err(Stop::Operator) => {
                // A moment passes before the release, as it does for a real worker: on
                // virtual time, a pool that claims, is refused and releases in one
                // instant would spin without letting the clock (and the operator) move.
                tokio::time::sleep(Duration::from_millis(1)).await;
                return session.release().await;
            }
            Err(Stop::Approval) => return session.await_approval().await,
            Err(Stop::Refused(refused)) => Some(refused),
            Err(Stop::Error(e)) => return Err(e),
        };
        if let Some(refused) = refused {
            // Its kind only: the text names call ids, which no seed draws.
            let kind = match &refused {
                DurableError::ReplayDiverged { .. } => "replay diverged",
                DurableError::InheritedEffect { .. } => "an inherited effect",
                _ => "refused",
            };
            ctx.trace
                .record(format_args!("refused {}: {kind}", session.id()));
            if !fork {
                // Only a fork's re-run may be refused so: the programs of the sessions
                // themselves never leave their first attempt's path unless they re-plan,
                // and a re-planned call comes before the recorded ones.
                ctx.world.violation(format!(
                    "{} refused though it never left its path: {refused}",
                    session.id()
                ));
                return session.release().await;
            }
            return session.fail(&format!("refused: {refused}")).await;
        }
        if shutdown.is_shutting_down() {
            return session.release().await;
        }
    }
}

/// Shared by the actors of a run.
struct Fleet {
    store: Arc<dyn CheckpointStore>,
    rates: FaultRates,
    faults_on: Arc<AtomicBool>,
    log: Arc<FenceLog>,
    ttl: Duration,
    ctx: Arc<Ctx>,
    stop: watch::Receiver<bool>,
    crashes: AtomicUsize,
    graceful: AtomicUsize,
    resolved: AtomicUsize,
    decided: AtomicUsize,
    forked: AtomicUsize,
    unparked: AtomicUsize,
    retargeted: AtomicUsize,
    /// Signals the operator sent.
    signals: AtomicUsize,
    /// The operator's retargets of each session, in order: the version asked for, and
    /// whether the store said it was done (an error may still have committed it).
    retargets: std::sync::Mutex<BTreeMap<SessionId, Vec<(String, bool)>>>,
    /// Rows lost behind the store's back (memory store only), and the sessions they
    /// were lost from: those may end refused as tampered instead of completed.
    tamperer: Option<durable_memory::tamper::MemoryTamperer>,
    lost: std::sync::Mutex<std::collections::BTreeSet<SessionId>>,
    faulties: std::sync::Mutex<Vec<Arc<Faulty>>>,
    trace: Arc<Trace>,
    /// Whether the run is on virtual time (and must be exactly reproducible).
    virtual_time: bool,
}

impl Fleet {
    fn faulty(&self, actor: &str, rng: &mut SmallRng) -> Arc<Faulty> {
        let faulty = Arc::new(Faulty::new(
            Arc::clone(&self.store),
            actor,
            SmallRng::seed_from_u64(rng.random()),
            self.rates.clone(),
            Arc::clone(&self.faults_on),
            Arc::clone(&self.log),
            Arc::clone(&self.trace),
            !self.virtual_time,
        ));
        lock(&self.faulties).push(Arc::clone(&faulty));
        faulty
    }

    fn durable(&self, owner: &str, rng: &mut SmallRng) -> Durable {
        self.durable_of(owner, VERSIONS[0], rng)
    }

    /// A runtime of app version `version` (see [`VERSIONS`]).
    fn durable_of(&self, owner: &str, version: &str, rng: &mut SmallRng) -> Durable {
        let store: Arc<dyn CheckpointStore> = self.faulty(owner, rng);
        Durable::builder(store)
            .owner(owner)
            .app_version(version)
            .lease_ttl(self.ttl)
            .max_recovery_attempts(3)
            .build()
    }
}

/// The app versions of the fleet: worker slots run them in turn (slot `n` the version
/// `n % 2`), so both are always served, and the operator retargets sessions between
/// them, as a rolling deploy does. Their tools are the same.
const VERSIONS: [&str; 2] = ["sim", "sim2"];

/// A session that kills its worker every time it runs (see [`handle`]).
fn is_poison(id: &SessionId) -> bool {
    id.as_str().starts_with("poison")
}

/// Resolves once the run is over.
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await.map(|_| ());
}

/// A worker slot: runs a pool, crashes it (aborts its task: no release, its leases run
/// out) or stops it gracefully at seeded moments while faults are on, and starts a new
/// one after a seeded delay; once faults are off, keeps its pool running until the end.
async fn worker_slot(fleet: Arc<Fleet>, slot: usize, mut rng: SmallRng) {
    let mut stop = fleet.stop.clone();
    for generation in 1.. {
        let owner = format!("w{slot}.{generation}");
        let durable = fleet.durable_of(&owner, VERSIONS[slot % VERSIONS.len()], &mut rng);
        let (trigger, signal) = tokio::sync::oneshot::channel::<()>();
        let ctx = Arc::clone(&fleet.ctx);
        let pool = durable
            .worker(move |resumed: Resumed<Message>, shutdown: ShutdownSignal| {
                handle(resumed, shutdown, Arc::clone(&ctx))
            })
            .concurrency(rng.random_range(1..=3))
            .poll_interval(Duration::from_millis(20))
            .shutdown_deadline(fleet.ttl);
        let mut pool = tokio::spawn(pool.run_until(async {
            let _ = signal.await;
        }));
        let life = Duration::from_millis(rng.random_range(100..=900));
        let crash = rng.random_bool(0.6);
        let restart = Duration::from_millis(rng.random_range(0..=300));
        tokio::select! {
            // In the order written: `select!` would otherwise draw from the runtime's
            // own random generator, which no seed controls.
            biased;
            () = tokio::time::sleep(life), if fleet.faults_on.load(Ordering::SeqCst) => {}
            () = stopped(&mut stop) => {
                pool.abort();
                let _ = pool.await;
                return;
            }
        }
        if !fleet.faults_on.load(Ordering::SeqCst) {
            stopped(&mut stop).await;
            pool.abort();
            let _ = pool.await;
            return;
        }
        fleet.trace.record(format_args!(
            "{owner} {}",
            if crash { "crash" } else { "stop" }
        ));
        if crash {
            fleet.crashes.fetch_add(1, Ordering::Relaxed);
            pool.abort();
            let _ = (&mut pool).await;
        } else {
            fleet.graceful.fetch_add(1, Ordering::Relaxed);
            let _ = trigger.send(());
            let _ = (&mut pool).await;
        }
        tokio::time::sleep(restart).await;
    }
}

/// The operator: at seeded moments, resolves every in-doubt call from the ledgers' truth
/// and unparks every parked session.
async fn operator(fleet: Arc<Fleet>, mut rng: SmallRng) {
    let durable = fleet.durable("operator", &mut rng);
    // The operator of the other version: a retarget moves a session to its runtime's.
    let other = fleet.durable_of("operator", VERSIONS[1], &mut rng);
    let store = Arc::clone(durable.store());
    let world = Arc::clone(&fleet.ctx.world);
    let mut stop = fleet.stop.clone();
    loop {
        let pause = Duration::from_millis(rng.random_range(20..=250));
        tokio::select! {
            biased;
            () = tokio::time::sleep(pause) => {}
            () = stopped(&mut stop) => return,
        }
        if let Ok(rows) = store.in_doubt(None).await {
            for row in rows {
                let call = row.args["call"].as_str().unwrap_or_default().to_owned();
                let truth = match row.identity.tool.as_str() {
                    "send_email" => world.email_sent(&call, row.identity.session.as_str()),
                    "wire" => world.wire_sent(&call, row.identity.session.as_str()),
                    "charge" => row
                        .idempotency_key
                        .as_deref()
                        .and_then(|key| world.charge_applied(key)),
                    _ => continue,
                };
                fleet
                    .trace
                    .record(format_args!("operator resolves {call}: {truth:?}"));
                let resolution = match truth {
                    Some(result) => Resolution::Happened { result },
                    None => Resolution::DidNotHappen,
                };
                if durable
                    .operator()
                    .resolve(&row.id, resolution, "operator", Some("from the ledger"))
                    .await
                    .is_ok()
                {
                    fleet.resolved.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        if let Ok(pending) = store.pending_approvals(None).await {
            for request in pending {
                let call = request.call.args["call"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                let approve = rng.random_bool(0.7);
                fleet.trace.record(format_args!(
                    "operator {} {call}",
                    if approve { "approves" } else { "denies" }
                ));
                // Decided in the world first: the call may run the moment the store
                // has the approval.
                world.decide(&call, request.call.identity.session.as_str(), approve);
                let decided = if approve {
                    durable
                        .operator()
                        .approve(&request.call.id, None, "operator", None)
                        .await
                } else {
                    durable
                        .operator()
                        .deny(&request.call.id, "the operator said no", "operator", None)
                        .await
                };
                if decided.is_ok() {
                    fleet.decided.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        if rng.random_bool(0.5) {
            signal_one(&fleet, &durable, &mut rng).await;
        }
        if fleet.faults_on.load(Ordering::SeqCst) && rng.random_bool(0.15) {
            fork_one(&fleet, &durable, &mut rng).await;
        }
        if fleet.faults_on.load(Ordering::SeqCst) && rng.random_bool(0.2) {
            retarget_one(&fleet, [&durable, &other], &mut rng).await;
        }
        if fleet.faults_on.load(Ordering::SeqCst) && rng.random_bool(0.1) {
            lose_a_row(&fleet, &mut rng).await;
        }
        let parked = SessionFilter::new().with_statuses(vec![SessionStatus::Parked]);
        if let Ok(sessions) = store.list_sessions(&parked).await {
            // A session that lost a row stays parked: its absence is for a person.
            let lost = lock(&fleet.lost).clone();
            for session in sessions
                .iter()
                .filter(|s| !is_poison(&s.id) && !lost.contains(&s.id))
            {
                fleet
                    .trace
                    .record(format_args!("operator unparks {}", session.id));
                if store.unpark_session(&session.id).await.is_ok() {
                    fleet.unparked.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}

/// Sends the signal `note` to an active session drawn by the seed (its programs read
/// them, [`Op::Read`]).
async fn signal_one(fleet: &Fleet, durable: &Durable, rng: &mut SmallRng) {
    let active = SessionFilter::new().with_statuses(vec![SessionStatus::Active]);
    let Ok(sessions) = durable.store().list_sessions(&active).await else {
        return;
    };
    if sessions.is_empty() {
        return;
    }
    let session = &sessions[rng.random_range(0..sessions.len())];
    let n = fleet.signals.fetch_add(1, Ordering::Relaxed);
    match durable
        .operator()
        .send_signal(&session.id, "note", json!({ "n": n }))
        .await
    {
        Ok(sent) => fleet
            .trace
            .record(format_args!("operator signals {} #{}", session.id, sent.id)),
        Err(e) => fleet.trace.record(format_args!(
            "operator signals {}: refused ({})",
            session.id,
            e.kind()
        )),
    }
}

/// Retargets an active session (drawn by the seed) to the other app version, as a
/// rolling deploy does, whoever holds it: from then on only workers of that version
/// claim it, and its journal and checkpoints carry on.
async fn retarget_one(fleet: &Fleet, durables: [&Durable; 2], rng: &mut SmallRng) {
    let active = SessionFilter::new().with_statuses(vec![SessionStatus::Active]);
    let Ok(mut sessions) = durables[0].store().list_sessions(&active).await else {
        return;
    };
    sessions.retain(|s| !is_poison(&s.id));
    sessions.sort_by(|a, b| a.id.cmp(&b.id));
    if sessions.is_empty() {
        return;
    }
    let session = sessions.swap_remove(rng.random_range(0..sessions.len()));
    let to = usize::from(session.app_version == VERSIONS[0]);
    fleet.trace.record(format_args!(
        "operator retargets {} from {} to {}",
        session.id, session.app_version, VERSIONS[to]
    ));
    let moved = durables[to]
        .operator()
        .retarget(&session.id, Vec::new(), "operator")
        .await
        .is_ok();
    if moved {
        fleet.retargeted.fetch_add(1, Ordering::Relaxed);
    }
    lock(&fleet.retargets)
        .entry(session.id.clone())
        .or_default()
        .push((VERSIONS[to].to_owned(), moved));
}

/// Loses a row behind the store's back, as a lost `-wal` or a restored backup would: the
/// newest journal row with a side effect of an active session no worker holds (between
/// a crash and the next resume). The journal must not conclude from the row's absence
/// that its effect never happened: the session is refused as tampered (and parked for
/// an operator), never re-runs the effect.
async fn lose_a_row(fleet: &Fleet, rng: &mut SmallRng) {
    use durable_conformance::tamper::{Tamper, Tamperer};
    let Some(tamperer) = &fleet.tamperer else {
        return;
    };
    let store = &fleet.ctx.store;
    let active = SessionFilter::new().with_statuses(vec![SessionStatus::Active]);
    let Ok(now) = store.now().await else { return };
    let Ok(mut sessions) = store.list_sessions(&active).await else {
        return;
    };
    sessions.retain(|s| {
        fleet.ctx.programs.contains_key(&s.id)
            && !is_poison(&s.id)
            && s.lease_expires_at.is_none_or(|at| at <= now)
    });
    sessions.sort_by(|a, b| a.id.cmp(&b.id));
    if sessions.is_empty() {
        return;
    }
    let session = sessions.swap_remove(rng.random_range(0..sessions.len()));
    let Ok(rows) = store.calls(&session.id, None).await else {
        return;
    };
    let Some(row) = rows
        .iter()
        .rev()
        .find(|r| r.class != ReplayClass::Pure && r.identity.step >= 0)
    else {
        return;
    };
    fleet.trace.record(format_args!(
        "lost: row {} {} of {}",
        row.identity.tool, row.args["call"], session.id
    ));
    lock(&fleet.lost).insert(session.id.clone());
    tamperer
        .apply(Tamper::DeleteCall {
            call: row.id.clone(),
        })
        .await;
}

/// Forks a completed session (drawn by the seed) at a version drawn by the seed: the fork
/// re-runs its parent's program from there, with its parent's arguments, and must never
/// repeat one of its parent's effects (its calls are refused, or return the parent's
/// results). The operator releases the fork at once; a worker pool runs it.
async fn fork_one(fleet: &Fleet, durable: &Durable, rng: &mut SmallRng) {
    let ctx = &fleet.ctx;
    let done = SessionFilter::new().with_statuses(vec![SessionStatus::Completed]);
    let Ok(completed) = durable.store().list_sessions(&done).await else {
        return;
    };
    // Sessions of the programs only (a fork of a fork is left out), in id order.
    let mut parents: Vec<_> = completed
        .into_iter()
        .filter(|s| ctx.programs.contains_key(&s.id) && !is_poison(&s.id))
        .collect();
    parents.sort_by(|a, b| a.id.cmp(&b.id));
    if parents.is_empty() {
        return;
    }
    let parent = parents.swap_remove(rng.random_range(0..parents.len()));
    let version = rng.random_range(0..=parent.latest_version.max(1) - 1);
    let n = lock(&ctx.forks).len();
    let fork = SessionId::new(format!("{}.f{n}", parent.id));
    // Known before it exists: a pool may claim it the moment it does.
    lock(&ctx.forks).insert(fork.clone(), (parent.id.clone(), version));
    fleet.trace.record(format_args!(
        "operator forks {} at {version} as {fork}",
        parent.id
    ));
    match durable
        .operator()
        .fork::<Message>(&parent.id, version, Some(fork.clone()))
        .await
    {
        Ok(session) => {
            fleet.forked.fetch_add(1, Ordering::Relaxed);
            // Its lease runs out if this fails: a pool takes it then.
            let _ = session.release().await;
        }
        Err(e) => fleet.trace.record(format_args!("fork {fork} failed: {e}")),
    }
}

/// Submits every session, at seeded moments of the first part of the run, retrying
/// through injected faults.
async fn submitter(fleet: Arc<Fleet>, mut rng: SmallRng, spread: Duration) {
    let durable = fleet.durable("submitter", &mut rng);
    let ids: Vec<SessionId> = fleet.ctx.programs.keys().cloned().collect();
    for id in ids {
        let wait = rng.random_range(0..=spread.as_millis() as u64 / 4);
        tokio::time::sleep(Duration::from_millis(wait)).await;
        loop {
            let options = StartOptions::new()
                .with_id(id.clone())
                .with_messages(vec![Message::user("go")]);
            match durable.submit(options).await {
                Ok(_) => break,
                // Created, its acknowledgement lost: its lease runs out, then a pool
                // takes it.
                Err(DurableError::Store(durable_core::StoreError::SessionExists(_))) => break,
                Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
            }
        }
        // Notes for its reads, racing its first claim.
        for _ in 0..rng.random_range(0..=2) {
            let n = fleet.signals.fetch_add(1, Ordering::Relaxed);
            match durable
                .operator()
                .send_signal(&id, "note", json!({ "n": n }))
                .await
            {
                Ok(sent) => fleet
                    .trace
                    .record(format_args!("submitter signals {id} #{}", sent.id)),
                Err(e) => fleet.trace.record(format_args!(
                    "submitter signals {id}: refused ({})",
                    e.kind()
                )),
            }
        }
    }
}

/// The calm end's bound: once faults stop, every session must complete within it.
const LIVENESS: Duration = Duration::from_secs(15);

async fn simulate(seed: u64, options: &Options) -> Report {
    // Wall time, for the summary only (the run itself is on the runtime's clock).
    let started = std::time::Instant::now();
    let mut master = SmallRng::seed_from_u64(seed);
    let (store, tamperer) = match crate::store::open(options.backend).await {
        Ok(opened) => opened,
        Err(e) => return failed(seed, format!("could not open the store: {e}")),
    };
    let trace = Arc::new(Trace::new());
    let ttl = Duration::from_millis(master.random_range(150..=250));
    let mut rates = FaultRates::draw(&mut master, ttl);
    rates.pause_after_commit = options.pause_after_commit;
    let sessions = master.random_range(3..=8);
    let mut programs: Programs = (0..sessions)
        .map(|i| {
            (
                SessionId::new(format!("s{i}")),
                Program::generate(&mut master),
            )
        })
        .collect();
    // Drawn from streams of their own, so that adding them changed no other draw.
    let mut turns = SmallRng::seed_from_u64(seed ^ 0x5851_f42d_4c95_7f2d);
    for program in programs.values_mut() {
        if turns.random_bool(0.3) {
            *program = std::mem::take(program).into_single_turn();
        }
        program.parallel = turns.random_bool(0.5);
    }
    if SmallRng::seed_from_u64(seed ^ 0x9e37_79b9_7f4a_7c15).random_bool(0.5) {
        programs.insert(
            SessionId::new("poison"),
            Program {
                steps: vec![vec![]],
                replans: Default::default(),
                single_turn: false,
                parallel: false,
            },
        );
    }
    let workers = master.random_range(2..=4);
    let fault_window = Duration::from_millis(master.random_range(800..=2_000));
    let world = Arc::new(World::default());
    let (stop_tx, stop_rx) = watch::channel(false);
    let fleet = Arc::new(Fleet {
        store: Arc::clone(&store),
        rates: rates.clone(),
        faults_on: Arc::new(AtomicBool::new(true)),
        log: Arc::new(FenceLog::default()),
        ttl,
        ctx: Arc::new(Ctx {
            world: Arc::clone(&world),
            store: Arc::clone(&store),
            trace: Arc::clone(&trace),
            programs: programs.clone(),
            tools: Tools::default(),
            unknown: master.random_range(0.0..0.8),
            rng: std::sync::Mutex::new(SmallRng::seed_from_u64(master.random())),
            forks: std::sync::Mutex::new(BTreeMap::new()),
        }),
        stop: stop_rx,
        crashes: AtomicUsize::new(0),
        graceful: AtomicUsize::new(0),
        resolved: AtomicUsize::new(0),
        decided: AtomicUsize::new(0),
        forked: AtomicUsize::new(0),
        unparked: AtomicUsize::new(0),
        retargeted: AtomicUsize::new(0),
        signals: AtomicUsize::new(0),
        retargets: std::sync::Mutex::new(BTreeMap::new()),
        tamperer,
        lost: std::sync::Mutex::new(std::collections::BTreeSet::new()),
        faulties: std::sync::Mutex::new(Vec::new()),
        trace: Arc::clone(&trace),
        virtual_time: options.backend.virtual_time(),
    });
    let mut actors = tokio::task::JoinSet::new();
    actors.spawn(submitter(
        Arc::clone(&fleet),
        SmallRng::seed_from_u64(master.random()),
        fault_window,
    ));
    actors.spawn(operator(
        Arc::clone(&fleet),
        SmallRng::seed_from_u64(master.random()),
    ));
    for slot in 0..workers {
        actors.spawn(worker_slot(
            Arc::clone(&fleet),
            slot,
            SmallRng::seed_from_u64(master.random()),
        ));
    }

    // The faulty phase, then the calm one: every session must complete in time.
    tokio::time::sleep(fault_window).await;
    fleet.faults_on.store(false, Ordering::SeqCst);
    let calm = tokio::time::Instant::now();
    let mut unfinished = Vec::new();
    loop {
        unfinished.clear();
        for id in fleet.ctx.sessions() {
            let fork = !programs.contains_key(&id);
            let id = &id;
            let lost = lock(&fleet.lost).contains(id);
            match store.session(id).await {
                // A session that lost a row is refused as tampered: it ends where it is.
                Ok(_) if lost => {}
                Ok(s) if is_poison(id) && s.status == SessionStatus::Parked => {}
                Ok(s) if !is_poison(id) && s.status == SessionStatus::Completed => {}
                // A fork refused for repeating its parent's effect ends failed.
                Ok(s) if fork && s.status == SessionStatus::Failed => {}
                // A fork whose creation failed before reaching the store.
                Err(durable_core::StoreError::SessionNotFound(_)) if fork => {}
                Ok(s) => unfinished.push(format!(
                    "{id} {} at version {} (lease {:?}, recoveries {})",
                    s.status.as_str(),
                    s.latest_version,
                    s.lease_owner,
                    s.recovery_attempts
                )),
                Err(e) => unfinished.push(format!("{id}: {e}")),
            }
        }
        if unfinished.is_empty() || calm.elapsed() > LIVENESS {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = stop_tx.send(true);
    while actors.join_next().await.is_some() {}

    let mut violations = fleet.log.violations();
    violations.extend(world.violations());
    if !unfinished.is_empty() {
        let in_doubt = store.in_doubt(None).await.map(|rows| {
            rows.iter()
                .map(|r| format!("{} {}", r.identity.tool, r.args["call"]))
                .collect::<Vec<_>>()
        });
        violations.push(format!(
            "liveness: {} session(s) not completed (a poison pill: not parked) {LIVENESS:?} after faults stopped: {}; in doubt: {in_doubt:?}",
            unfinished.len(),
            unfinished.join("; ")
        ));
    }
    let lost = lock(&fleet.lost).clone();
    for id in &lost {
        // Unless it completed before its row was lost, every read of its journal must
        // say the row is missing.
        let completed = store
            .session(id)
            .await
            .is_ok_and(|s| s.status == SessionStatus::Completed);
        match store.calls(id, None).await {
            Err(durable_core::StoreError::Tampered { .. }) => {}
            _ if completed => {}
            other => violations.push(format!(
                "absence not surfaced: {id} lost a row and its journal reads as {:?}",
                other.map(|rows| rows.len())
            )),
        }
    }
    // A session moved to another version ends on the version its last retarget asked
    // for (or on one asked for after it, whose reply was lost): no worker of the old
    // version wrote it back.
    let retargets = lock(&fleet.retargets).clone();
    for (id, asked) in &retargets {
        let Some(last_done) = asked.iter().rposition(|(_, done)| *done) else {
            continue;
        };
        let Ok(record) = store.session(id).await else {
            continue;
        };
        if !asked[last_done..]
            .iter()
            .any(|(version, _)| *version == record.app_version)
        {
            violations.push(format!(
                "a retarget undone: {id} ends on {}, its last retarget moved it to {}",
                record.app_version, asked[last_done].0
            ));
        }
    }
    let everyone = fleet.ctx.sessions();
    crate::check::check_end(
        &*store,
        &programs,
        &everyone,
        &lost,
        &world,
        &mut violations,
    )
    .await;

    let mut injected = BTreeMap::new();
    for faulty in lock(&fleet.faulties).iter() {
        for (kind, n) in lock(&faulty.injected).iter() {
            *injected.entry(*kind).or_insert(0) += n;
        }
    }
    let charges = world.charges();
    let summary = format!(
        "seed {seed}: {sessions} sessions{}, {workers} worker slots, ttl {}ms, faults for {}ms \
         ({injected:?}); {} crashes, {} graceful stops; {} emails, {} charges ({} presentations), \
         {} model replies, {} wires; {} resolutions, {} approvals decided, {} forks, {} unparks, {} retargets, {} signals sent ({} read), {} sessions lost a row; {} fenced writes accepted; trace {:016x} \
         ({} events); {:.1}s",
        if programs.keys().any(is_poison) {
            " and a poison pill"
        } else {
            ""
        },
        ttl.as_millis(),
        fault_window.as_millis(),
        fleet.crashes.load(Ordering::Relaxed),
        fleet.graceful.load(Ordering::Relaxed),
        world.emails().len(),
        charges.len(),
        charges.values().map(|c| c.attempts).sum::<usize>(),
        world.replies(),
        world.wires().len(),
        fleet.resolved.load(Ordering::Relaxed),
        fleet.decided.load(Ordering::Relaxed),
        fleet.forked.load(Ordering::Relaxed),
        fleet.unparked.load(Ordering::Relaxed),
        fleet.retargeted.load(Ordering::Relaxed),
        fleet.signals.load(Ordering::Relaxed),
        world.signals_read(),
        lost.len(),
        fleet.log.accepted_writes(),
        trace.digest(),
        trace.events().len(),
        started.elapsed().as_secs_f64(),
    );
    Report {
        seed,
        violations,
        summary,
        trace: trace.digest(),
        events: trace.events(),
    }
}
