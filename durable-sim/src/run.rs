//! One run: a seed in, a [`Report`] out.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use durable_core::snapshot::Spend;
use durable_core::store::{CheckpointStore, Resolution, SessionFilter, SessionStatus};
use durable_core::{
    CallError, Durable, DurableError, Message, Resumed, Session, SessionId, ShutdownSignal,
    StartOptions, Verification,
};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::faulty::{FaultRates, Faulty, FenceLog, lock};
use crate::program::{Op, Program, Programs, Tools, spend_of};
use crate::world::World;

/// What a run may be told besides its seed.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Let a pause strike after a write committed, before the caller hears of it (see
    /// [`FaultRates::pause_after_commit`]).
    pub pause_after_commit: bool,
}

/// What a run found.
#[derive(Debug, Clone)]
pub struct Report {
    /// The seed.
    pub seed: u64,
    /// Every invariant violation, in the order found (empty: the run passed).
    pub violations: Vec<String>,
    /// A one-line summary of what the run did.
    pub summary: String,
}

impl Report {
    /// Whether every invariant held.
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }
}

/// The command that runs `seed` again.
pub fn reproduce(seed: u64, options: &Options) -> String {
    format!(
        "cargo run -p durable-sim --release -- --seed {seed}{}",
        if options.pause_after_commit {
            " --pause-after-commit"
        } else {
            ""
        }
    )
}

/// Runs the simulation for `seed` on a fresh current-thread runtime and store.
pub fn run_seed(seed: u64, options: &Options) -> Report {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            return Report {
                seed,
                violations: vec![format!("could not build a runtime: {e}")],
                summary: String::new(),
            };
        }
    };
    runtime.block_on(simulate(seed, options))
}

/// Everything a handler needs, shared by every worker.
struct Ctx {
    world: Arc<World>,
    programs: Programs,
    tools: Tools,
    /// How often a verify hook answers `Unknown` instead of reading the outbox.
    unknown: f64,
    rng: std::sync::Mutex<SmallRng>,
}

/// Why a step stopped.
enum Stop {
    /// Refused as replay-unsafe: only an operator can go on; the handler releases.
    Operator,
    /// Anything else: the handler returns it (the lease is left to expire).
    Error(DurableError),
}

fn stop<E: std::fmt::Display>(world: &World, call: &str, e: CallError<E>) -> Stop {
    match e {
        CallError::Durable(refused @ DurableError::ReplayUnsafe { .. }) => {
            let _ = refused;
            Stop::Operator
        }
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

async fn run_step(
    session: &Session<Message>,
    ctx: &Arc<Ctx>,
    step: i64,
    ops: &[Op],
) -> Result<(), Stop> {
    let id = session.id().clone();
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
    for (j, op) in ops.iter().enumerate() {
        let key = format!("{id}/{step}/{j}");
        let journal = session.journal();
        let result = match *op {
            Op::Email => {
                let unknown = lock(&ctx.rng).random_bool(ctx.unknown);
                let (w1, w2, k1, k2) = (
                    Arc::clone(world),
                    Arc::clone(world),
                    key.clone(),
                    key.clone(),
                );
                journal
                    .tool(&ctx.tools.email, json!({ "call": key }))
                    .run_verified(
                        move |tool| {
                            let (world, key) = (Arc::clone(&w1), k1.clone());
                            let attempt =
                                format!("attempt {} of call {}", tool.attempt(), tool.call_id());
                            async move {
                                tokio::time::sleep(NETWORK).await;
                                let sent = world.send_email(&key, &attempt);
                                tokio::time::sleep(NETWORK).await;
                                Ok::<Value, String>(sent)
                            }
                        },
                        move |_| async move {
                            if unknown {
                                return Verification::Unknown;
                            }
                            match w2.email_sent(&k2) {
                                Some(sent) => Verification::Happened(sent),
                                None => Verification::DidNotHappen,
                            }
                        },
                    )
                    .await
            }
            Op::Charge(amount) => {
                let (w, k) = (Arc::clone(world), key.clone());
                journal
                    .tool(&ctx.tools.charge, json!({ "call": key, "amount": amount }))
                    .key(format!("pay-{key}"))
                    .run(move |tool| {
                        let (world, call) = (Arc::clone(&w), k.clone());
                        // The key the journal recorded with the row, as the payment API
                        // receives it.
                        let idem = tool.idempotency_key().unwrap_or_default().to_owned();
                        async move {
                            tokio::time::sleep(NETWORK).await;
                            let charged = world.charge(&call, &idem, amount);
                            tokio::time::sleep(NETWORK).await;
                            Ok::<Value, String>(charged)
                        }
                    })
                    .await
            }
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
        world.observe(&key, &value);
    }
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
    let Some(program) = ctx.programs.get(session.id()).cloned() else {
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
        let Some(ops) = usize::try_from(step)
            .ok()
            .and_then(|s| program.steps.get(s))
        else {
            return session.complete().await.map(|_| ());
        };
        match run_step(&session, &ctx, step, ops).await {
            Ok(()) => {}
            Err(Stop::Operator) => return session.release().await,
            Err(Stop::Error(e)) => return Err(e),
        }
        session.push(Message::user(format!("step {step} done")));
        session.checkpoint().await?;
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
    unparked: AtomicUsize,
    faulties: std::sync::Mutex<Vec<Arc<Faulty>>>,
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
        ));
        lock(&self.faulties).push(Arc::clone(&faulty));
        faulty
    }

    fn durable(&self, owner: &str, rng: &mut SmallRng) -> Durable {
        let store: Arc<dyn CheckpointStore> = self.faulty(owner, rng);
        Durable::builder(store)
            .owner(owner)
            .app_version("sim")
            .lease_ttl(self.ttl)
            .max_recovery_attempts(3)
            .build()
    }
}

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
        let durable = fleet.durable(&owner, &mut rng);
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
    let store = Arc::clone(durable.store());
    let world = Arc::clone(&fleet.ctx.world);
    let mut stop = fleet.stop.clone();
    loop {
        let pause = Duration::from_millis(rng.random_range(20..=250));
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            () = stopped(&mut stop) => return,
        }
        if let Ok(rows) = store.in_doubt(None).await {
            for row in rows {
                let call = row.args["call"].as_str().unwrap_or_default().to_owned();
                let truth = match row.identity.tool.as_str() {
                    "send_email" => world.email_sent(&call),
                    "charge" => row
                        .idempotency_key
                        .as_deref()
                        .and_then(|key| world.charge_applied(key)),
                    _ => continue,
                };
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
        let parked = SessionFilter::new().with_statuses(vec![SessionStatus::Parked]);
        if let Ok(sessions) = store.list_sessions(&parked).await {
            for session in sessions.iter().filter(|s| !is_poison(&s.id)) {
                if store.unpark_session(&session.id).await.is_ok() {
                    fleet.unparked.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
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
    }
}

/// The calm end's bound: once faults stop, every session must complete within it.
const LIVENESS: Duration = Duration::from_secs(15);

async fn simulate(seed: u64, options: &Options) -> Report {
    let started = std::time::Instant::now();
    let mut master = SmallRng::seed_from_u64(seed);
    let store = match crate::store::open().await {
        Ok(store) => store,
        Err(e) => {
            return Report {
                seed,
                violations: vec![format!("could not open the store: {e}")],
                summary: String::new(),
            };
        }
    };
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
    // Drawn from a stream of its own, so that adding it changed no other draw.
    if SmallRng::seed_from_u64(seed ^ 0x9e37_79b9_7f4a_7c15).random_bool(0.5) {
        programs.insert(
            SessionId::new("poison"),
            Program {
                steps: vec![vec![]],
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
            programs: programs.clone(),
            tools: Tools::default(),
            unknown: master.random_range(0.0..0.8),
            rng: std::sync::Mutex::new(SmallRng::seed_from_u64(master.random())),
        }),
        stop: stop_rx,
        crashes: AtomicUsize::new(0),
        graceful: AtomicUsize::new(0),
        resolved: AtomicUsize::new(0),
        unparked: AtomicUsize::new(0),
        faulties: std::sync::Mutex::new(Vec::new()),
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
        for id in programs.keys() {
            match store.session(id).await {
                Ok(s) if is_poison(id) && s.status == SessionStatus::Parked => {}
                Ok(s) if !is_poison(id) && s.status == SessionStatus::Completed => {}
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
    crate::check::check_end(&*store, &programs, &world, &mut violations).await;

    let mut injected = std::collections::BTreeMap::new();
    for faulty in lock(&fleet.faulties).iter() {
        for (kind, n) in lock(&faulty.injected).iter() {
            *injected.entry(*kind).or_insert(0) += n;
        }
    }
    let charges = world.charges();
    let summary = format!(
        "seed {seed}: {sessions} sessions{}, {workers} worker slots, ttl {}ms, faults for {}ms \
         ({injected:?}); {} crashes, {} graceful stops; {} emails, {} charges ({} presentations), \
         {} model replies; {} resolutions, {} unparks; {} fenced writes accepted; {:.1}s",
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
        fleet.resolved.load(Ordering::Relaxed),
        fleet.unparked.load(Ordering::Relaxed),
        fleet.log.accepted_writes(),
        started.elapsed().as_secs_f64(),
    );
    Report {
        seed,
        violations,
        summary,
    }
}
