//! The child side: this test binary re-executed as one worker process.
//!
//! Roles (`DURABLE_WORKERS_ROLE`):
//! - `fleet`: loops on `recover_next`, then on the shared queue of session ids, running
//!   each session to completion (or parking it for an operator); exits 0 once no session
//!   is left to run.
//! - `race`: reads `go <session>` lines on stdin and resumes that session at once with
//!   its twin process; prints `won <session> <version>` or `leased <session> <holder>`.
//! - `zombie-a`: runs a session and pauses before the unsafe tool of step 1 (the parent
//!   stops it there with SIGSTOP); on SIGCONT it must find its lease lost.
//! - `zombie-b`: recovers the expired session and runs it to completion.
//! - `poison`: resumes a session by id and runs a `pure` tool that aborts the process (a
//!   poison pill crashing its worker); prints `parked <session>: <error>` when the resume
//!   parked it.
//! - `idle`: resumes the sessions named by id without running them and waits to be
//!   killed holding their leases; prints `holding <n>`, and `parked <session>: <error>`
//!   for each resume that parked its session.
//! - `limited`: defines the rate limit of `tests/workers/limited.rs`, starts its sessions,
//!   prints `worker <owner> up`, waits for `go <start ms> <end ms>` on stdin, then asks a
//!   stand-in model under the limit from every session until the end time, printing
//!   `call <unix ms>` as each call starts, and `done <owner>` once every call returned.
//! - `pool`: a worker pool (`Durable::worker`, concurrency 2 by default) driving every
//!   claimable session, each handler releasing its session between steps once shutdown
//!   is requested; stops gracefully on SIGTERM, or once no session is active; prints
//!   `claimed`, `completed`, `released` lines (each ending `t=<unix ms>`) and
//!   `pool stopped <report>`. `tests/workers/hook.rs` tunes it (concurrency, shutdown
//!   deadline, think time) and holds it at a precise point for the parent.

use std::sync::Arc;
use std::time::Duration;

use durable::Message;
use durable::{
    CallError, CheckpointStore, Durable, DurableError, ReplayClass, Resumed, Session, SessionId,
    ShutdownSignal, StartOptions, StoreError, ToolContext, ToolSpec, Verification,
};
use serde_json::{Map, Value, json};

use crate::hook::{self, When};
use crate::ledger::{Ledger, random_below, uuid};

pub const ROLE: &str = "DURABLE_WORKERS_ROLE";
pub const STORE: &str = "DURABLE_WORKERS_STORE";
pub const LEDGER: &str = "DURABLE_WORKERS_LEDGER";
pub const OWNER: &str = "DURABLE_WORKERS_OWNER";
pub const TTL_MS: &str = "DURABLE_WORKERS_TTL_MS";
pub const SESSION: &str = "DURABLE_WORKERS_SESSION";

/// The app version every worker runs.
pub const APP_VERSION: &str = "workers-test";
/// Steps (checkpoints) per session, each a pure, a keyed and an unsafe call.
pub const STEPS: i64 = 2;
/// Recoveries of one session before it is parked.
pub const MAX_RECOVERY_ATTEMPTS: i32 = 5;
/// Tool names, as journaled.
pub const TOOLS: [(&str, &str); 3] = [
    ("read", "read_account"),
    ("charge", "charge_card"),
    ("email", "send_email"),
];

/// A zombie found its lease lost, and nothing it wrote afterwards was accepted.
pub const EXIT_LEASE_LOST: i32 = 4;
/// The ledger (the outside world) was unreachable while an effect was in flight: the
/// worker crashes, as a real one would, leaving the call in doubt.
pub const EXIT_LEDGER_DOWN: i32 = 75;

/// Runs the role named by `DURABLE_WORKERS_ROLE`; returns the exit code.
pub fn main(role: &str) -> i32 {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let env = Env::read();
        match role {
            "fleet" => fleet(&env).await,
            "race" => race(&env).await,
            "zombie-a" => zombie_a(&env).await,
            "zombie-b" => zombie_b(&env).await,
            "poison" => poison(&env).await,
            "idle" => idle(&env).await,
            "pool" => pool(&env).await,
            "limited" => limited(&env).await,
            "fanout" => crate::fanout::run_role(&env.store, &env.ledger, &env.owner, env.ttl).await,
            other => {
                eprintln!("unknown {ROLE} `{other}`");
                2
            }
        }
    })
}

struct Env {
    store: String,
    ledger: String,
    owner: String,
    ttl: Duration,
}

impl Env {
    fn read() -> Self {
        let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"));
        Env {
            store: var(STORE),
            ledger: var(LEDGER),
            owner: var(OWNER),
            ttl: Duration::from_millis(var(TTL_MS).parse().expect("TTL_MS is a number")),
        }
    }

    /// The runtime and the ledger, retried while the database is down (a server restart).
    async fn connect(&self) -> (Durable, Ledger) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let attempt = async {
                let store: Arc<dyn CheckpointStore> = durable::connect(&self.store)
                    .await
                    .map_err(|e| e.to_string())?;
                let ledger = Ledger::open(&self.ledger)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok::<_, String>((store, ledger))
            };
            match attempt.await {
                Ok((store, ledger)) => {
                    let durable = Durable::builder(store)
                        .owner(&self.owner)
                        .app_version(APP_VERSION)
                        .lease_ttl(self.ttl)
                        .max_recovery_attempts(MAX_RECOVERY_ATTEMPTS)
                        .build();
                    return (durable, ledger);
                }
                Err(e) if tokio::time::Instant::now() < deadline => {
                    eprintln!("connect failed, retrying: {e}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("cannot connect for 30 s: {e}"),
            }
        }
    }
}

/// The three tools. Sessions with an even index give `send_email` a verify hook that looks
/// in the ledger; the others have none, so an in-doubt email parks the session.
pub fn specs(verify: bool) -> [ToolSpec; 3] {
    let schema = |props: Value| json!({"type": "object", "properties": props});
    let email = ToolSpec::new(
        "send_email",
        "Email the customer.",
        ReplayClass::UnsafeOnReplay,
        schema(json!({"to": {"type": "string"}, "step": {"type": "integer"}})),
    );
    [
        ToolSpec::new(
            "read_account",
            "Read the account.",
            ReplayClass::Pure,
            schema(json!({"account": {"type": "string"}, "step": {"type": "integer"}})),
        ),
        ToolSpec::new(
            "charge_card",
            "Charge the card.",
            ReplayClass::IdempotentWithKey,
            schema(json!({"order": {"type": "string"}, "cents": {"type": "integer"}})),
        ),
        if verify { email.with_verify() } else { email },
    ]
}

/// Whether the session's email tool has a verify hook (even session index).
pub fn uses_verify(session: &str) -> bool {
    session
        .rsplit('-')
        .next()
        .and_then(|n| n.parse::<u32>().ok())
        .is_some_and(|n| n % 2 == 0)
}

/// The key of the keyed effect and the effect key of the email of a step.
pub fn effect_keys(session: &str, step: i64) -> (String, String) {
    (
        format!("charge:{session}:{step}"),
        format!("email:{session}:{step}"),
    )
}

/// A few milliseconds of work, so that kills land inside tool bodies too.
async fn work() {
    let ms = 5 + random_below(20);
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

fn ledger_down(e: sqlx::Error) -> ! {
    println!("crash: ledger unreachable during an effect: {e}");
    std::process::exit(EXIT_LEDGER_DOWN);
}

/// How a session run ended.
#[derive(Debug)]
enum Driven {
    Completed,
    Parked,
    /// Shutdown was requested: released between steps.
    Released,
    /// Asleep after step 0 (`DURABLE_WORKERS_SLEEP_MS`), until the given time.
    Asleep(i64),
    LeaseLost(DurableError),
    /// A store error (e.g. the server restarting): the session is left to recovery.
    Abandoned(DurableError),
    /// Refused as `ReplayUnsafe`, and the park failed on a store error: the refusal
    /// marked the call as waiting for an operator, so no claim takes the session again;
    /// [`settle`] resumes it by id until the park is written.
    ParkFailed(DurableError),
}

/// Where `zombie-a` stops to be paused.
struct Pause {
    step: i64,
    wait: Duration,
}

/// Sorts a runtime error into how the run ends.
fn ended(e: DurableError) -> Driven {
    match e {
        DurableError::Store(StoreError::LeaseLost { .. }) => Driven::LeaseLost(e),
        e => Driven::Abandoned(e),
    }
}

/// Runs a session from its latest checkpoint to completion: per step a pure read, a keyed
/// charge and an unsafe email, then a checkpoint with the results in its state.
async fn drive(
    mut session: Session<Message>,
    ledger: &Ledger,
    owner: &str,
    pause: Option<Pause>,
    shutdown: Option<&ShutdownSignal>,
) -> Driven {
    let id = session.id().to_string();
    let [read_spec, charge_spec, email_spec] = specs(uses_verify(&id));
    let mut state = match session.state() {
        Value::Object(map) => map.clone(),
        _ => Map::new(),
    };
    if let Some(due) = session.woke_from() {
        let taken = session.record().lease_renewed_at.unwrap_or_default();
        println!("woke {id} due={due} taken={taken} t={}", hook::now_ms());
    }
    while session.version() < STEPS {
        hook::think(shutdown).await;
        // A safe point: the last step is checkpointed, nothing is in flight.
        if shutdown.is_some_and(ShutdownSignal::is_shutting_down) {
            return match session.release().await {
                Ok(()) => Driven::Released,
                Err(e) => ended(e),
            };
        }
        let step = session.version();
        let (charge_key, email_key) = effect_keys(&id, step);
        let journal = session.journal();
        let read = journal
            .tool(&read_spec, json!({"account": id, "step": step}))
            .run(|_ctx| async {
                hook::hold("read_account", When::Before, &id, step).await;
                work().await;
                hook::hold("read_account", When::After, &id, step).await;
                Ok::<_, String>(json!({"token": uuid()}))
            })
            .await;
        let charge = match read {
            Ok(read) => journal
                .tool(
                    &charge_spec,
                    json!({"order": format!("{id}-{step}"), "cents": 100 + step}),
                )
                .key(charge_key)
                .run(|ctx: ToolContext| {
                    let (ledger, id) = (ledger.clone(), id.clone());
                    async move {
                        work().await;
                        hook::hold("charge_card", When::Before, &id, step).await;
                        let key = ctx.idempotency_key().unwrap_or_default();
                        let charge_id = ledger
                            .charge(key, i64::from(ctx.attempt()), owner)
                            .await
                            .unwrap_or_else(|e| ledger_down(e));
                        hook::hold("charge_card", When::After, &id, step).await;
                        work().await;
                        Ok::<_, String>(json!({"charge_id": charge_id}))
                    }
                })
                .await
                .map(|charge| (read, charge)),
            Err(e) => Err(e),
        };
        let (read, charge) = match charge {
            Ok(pair) => pair,
            Err(e) => return stop(session, e, pause.is_some()).await,
        };
        if let Some(p) = &pause
            && p.step == step
        {
            println!("pausing before send_email of step {step}");
            tokio::time::sleep(p.wait).await;
            println!("resumed after the pause");
        }
        let email = journal
            .tool(&email_spec, json!({"to": id, "step": step}))
            .run_verified(
                |ctx: ToolContext| {
                    let (ledger, email_key, id) = (ledger.clone(), email_key.clone(), id.clone());
                    async move {
                        work().await;
                        hook::hold("send_email", When::Before, &id, step).await;
                        let receipt = ledger
                            .send_email(
                                &email_key,
                                ctx.call_id().as_str(),
                                i64::from(ctx.attempt()),
                                owner,
                            )
                            .await
                            .unwrap_or_else(|e| ledger_down(e));
                        hook::hold("send_email", When::After, &id, step).await;
                        work().await;
                        Ok::<_, String>(json!({"receipt": receipt}))
                    }
                },
                |ctx: ToolContext| {
                    let ledger = ledger.clone();
                    let verify = email_spec.has_verify;
                    async move {
                        if !verify {
                            return Verification::Unknown;
                        }
                        match ledger.email_of_call(ctx.call_id().as_str()).await {
                            Ok(Some(receipt)) => {
                                println!("verify: happened {}", ctx.call_id());
                                Verification::Happened(json!({"receipt": receipt}))
                            }
                            Ok(None) => {
                                println!("verify: did not happen {}", ctx.call_id());
                                Verification::DidNotHappen
                            }
                            Err(e) => ledger_down(e),
                        }
                    }
                },
            )
            .await;
        let email = match email {
            Ok(email) => email,
            Err(e) => return stop(session, e, pause.is_some()).await,
        };
        state.insert(
            step.to_string(),
            json!({"read": read, "charge": charge, "email": email}),
        );
        session.set_state(Value::Object(state.clone()));
        session.push(Message::user(format!("step {step} done by {owner}")));
        hook::hold("checkpoint", When::Before, &id, step).await;
        if let Some(ms) = hook::sleep_after_step_0().filter(|_| step == 0) {
            // The step's checkpoint carries the wake-up time; the lease is given up.
            let now = match session.journal().store().now().await {
                Ok(now) => now,
                Err(e) => return ended(e.into()),
            };
            let due = now + ms;
            return match session.sleep_until(due).await {
                Ok(_) => Driven::Asleep(due),
                Err(e) => ended(e),
            };
        }
        if let Err(e) = session.checkpoint().await {
            return ended(e);
        }
    }
    match session.complete().await {
        Ok(_) => Driven::Completed,
        Err(e) => ended(e),
    }
}

/// A journaled call failed: park on `ReplayUnsafe`, give up on a lost lease, leave the
/// session to recovery on a store error. Tool failures are bugs here (no body fails).
async fn stop(session: Session<Message>, e: CallError<String>, zombie: bool) -> Driven {
    let e = match e {
        CallError::Durable(e) => e,
        other => panic!("a tool body failed, which no body here does: {other}"),
    };
    match e {
        DurableError::ReplayUnsafe { .. } => {
            let reason = format!("operator needed: {e}");
            match session.park(&reason).await {
                Ok(()) => Driven::Parked,
                Err(e @ DurableError::Store(StoreError::LeaseLost { .. })) => Driven::LeaseLost(e),
                Err(e) => Driven::ParkFailed(e),
            }
        }
        DurableError::Store(StoreError::LeaseLost { .. }) => {
            if zombie {
                // Nothing else may be accepted either: try to checkpoint anyway.
                let mut session = session;
                session.push(Message::user("zombie write"));
                match session.checkpoint().await {
                    Ok(meta) => println!("zombie checkpoint ACCEPTED at version {}", meta.version),
                    Err(refused) => println!("checkpoint refused: {refused}"),
                }
            }
            Driven::LeaseLost(e)
        }
        e => {
            // Best effort: let another worker (or us) recover it without waiting the ttl.
            let _ = session.release().await;
            Driven::Abandoned(e)
        }
    }
}

fn report(id: &SessionId, driven: &Driven) {
    println!("{}", outcome(id, driven));
}

fn outcome(id: &SessionId, driven: &Driven) -> String {
    match driven {
        Driven::Completed => format!("completed {id}"),
        Driven::Parked => format!("parked {id}"),
        Driven::Released => format!("released {id}"),
        Driven::Asleep(due) => format!("asleep {id} until={due}"),
        Driven::LeaseLost(e) => format!("lease lost on {id}: {e}"),
        Driven::Abandoned(e) => format!("abandoned {id}: {e}"),
        Driven::ParkFailed(e) => format!("park failed on {id}, resuming it: {e}"),
    }
}

/// Reports how `driven` ended; a session whose park failed is resumed by id (as an
/// operator's nudge would: claims skip a session waiting for an operator) and driven
/// again, until its park is written.
async fn settle(
    durable: &Durable,
    ledger: &Ledger,
    owner: &str,
    id: &SessionId,
    mut driven: Driven,
) {
    for _ in 0..150 {
        if !matches!(driven, Driven::ParkFailed(_)) {
            break;
        }
        report(id, &driven);
        tokio::time::sleep(Duration::from_millis(200)).await;
        driven = match durable.resume::<Message>(id).await {
            Ok(resumed) => drive(resumed.session, ledger, owner, None, None).await,
            Err(e)
                if e.is_retryable()
                    || matches!(e, DurableError::Store(StoreError::Leased { .. })) =>
            {
                Driven::ParkFailed(e)
            }
            Err(e) => Driven::Abandoned(e),
        };
    }
    report(id, &driven);
}

async fn fleet(env: &Env) -> i32 {
    let (durable, ledger) = env.connect().await;
    println!("worker {} up", env.owner);
    loop {
        match durable.recover_next::<Message>().await {
            Ok(Some(resumed)) => {
                let id = resumed.session.id().clone();
                println!("recovered {id} at version {}", resumed.report.version);
                let driven = drive(resumed.session, &ledger, &env.owner, None, None).await;
                settle(&durable, &ledger, &env.owner, &id, driven).await;
                continue;
            }
            Ok(None) => {}
            Err(e) => {
                println!("recover_next failed, retrying: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        }
        match ledger.queued().await {
            Ok(Some(id)) => {
                let started = durable
                    .start::<Message>(
                        StartOptions::new()
                            .with_id(SessionId::new(&id))
                            .with_messages(vec![Message::user(format!("task {id}"))]),
                    )
                    .await;
                match started {
                    Ok(session) => {
                        let _ = ledger.dequeue(&id).await;
                        println!("started {id}");
                        let driven = drive(session, &ledger, &env.owner, None, None).await;
                        settle(&durable, &ledger, &env.owner, &SessionId::new(&id), driven).await;
                    }
                    Err(DurableError::Store(StoreError::SessionExists(_))) => {
                        let _ = ledger.dequeue(&id).await;
                    }
                    Err(e) => {
                        println!("start {id} failed, retrying: {e}");
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            }
            Ok(None) => match active_sessions(durable.store().as_ref()).await {
                Some(0) => {
                    println!("worker {} done", env.owner);
                    return 0;
                }
                _ => tokio::time::sleep(Duration::from_millis(100)).await,
            },
            Err(e) => {
                println!("queue unreachable, retrying: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// Sessions still active (running or waiting for recovery); `None` on a store error.
pub async fn active_sessions(store: &dyn CheckpointStore) -> Option<usize> {
    store
        .list_sessions(
            &durable::store::SessionFilter::new()
                .with_statuses(vec![durable::store::SessionStatus::Active]),
        )
        .await
        .ok()
        .map(|s| s.len())
}

async fn race(env: &Env) -> i32 {
    let (durable, _ledger) = env.connect().await;
    // Stdin is read on a thread of its own: a blocking read on the runtime's only thread
    // would also stall the pool's background work (e.g. the rollback of a dropped
    // transaction, which holds row locks until it runs).
    let (tx, mut lines) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    println!("ready");
    while let Some(line) = lines.recv().await {
        let Some(id) = line.trim().strip_prefix("go ") else {
            panic!("unexpected line {line:?}");
        };
        let id = SessionId::new(id);
        match durable.resume::<Message>(&id).await {
            Ok(mut resumed) => {
                resumed
                    .session
                    .push(Message::user(format!("written by {}", env.owner)));
                match resumed.session.checkpoint().await {
                    // The session is dropped without release: the lease stays live, so a
                    // twin that comes late is refused as surely as one that comes at once.
                    Ok(meta) => println!("won {id} {}", meta.version),
                    Err(e) => println!("error {id} checkpoint: {e}"),
                }
            }
            Err(DurableError::Store(StoreError::Leased { owner, .. })) => {
                println!("leased {id} {owner}");
            }
            Err(e) => println!("error {id} resume: {e}"),
        }
    }
    0
}

async fn poison(env: &Env) -> i32 {
    let (durable, _ledger) = env.connect().await;
    let id = SessionId::new(std::env::var(SESSION).expect("session"));
    match durable.resume::<Message>(&id).await {
        Ok(resumed) => {
            let recoveries = match durable.store().session(&id).await {
                Ok(record) => record.recovery_attempts,
                Err(e) => panic!("read {id}: {e}"),
            };
            println!("resumed {id} recoveries {recoveries}");
            // The poison: a `pure` tool (nothing is journaled before it runs) that aborts
            // the process, every time. The worker dies running the session.
            let spec = ToolSpec::new(
                "poison",
                "Aborts the process.",
                ReplayClass::Pure,
                json!({"type": "object"}),
            );
            let _ = resumed
                .session
                .journal()
                .tool(&spec, json!({}))
                .run(|_ctx| async {
                    if spec.name == "poison" {
                        std::process::abort();
                    }
                    Ok::<Value, String>(Value::Null)
                })
                .await;
            println!("error {id}: the poison tool returned");
            1
        }
        Err(e @ DurableError::Store(StoreError::Parked { .. })) => {
            println!("parked {id}: {e}");
            0
        }
        Err(e) => {
            println!("error {id} resume: {e}");
            1
        }
    }
}

/// Takes the lease on every session named (comma-separated) in `DURABLE_WORKERS_SESSION`
/// by id, without running any, prints `holding <n>`, then waits to be killed: a worker
/// killed while it holds sessions it is not running (idle leases).
async fn idle(env: &Env) -> i32 {
    let (durable, _ledger) = env.connect().await;
    let ids = std::env::var(SESSION).expect("sessions");
    let mut held = Vec::new();
    for id in ids.split(',').map(SessionId::new) {
        match durable.resume::<Message>(&id).await {
            Ok(resumed) => held.push(resumed.session),
            Err(e @ DurableError::Store(StoreError::Parked { .. })) => {
                println!("parked {id}: {e}");
            }
            Err(e) => {
                println!("error {id} resume: {e}");
                return 1;
            }
        }
    }
    println!("holding {}", held.len());
    std::future::pending::<()>().await;
    0
}

async fn zombie_a(env: &Env) -> i32 {
    let (durable, ledger) = env.connect().await;
    let id = SessionId::new(std::env::var(SESSION).expect("session"));
    let session = durable
        .start::<Message>(StartOptions::new().with_id(id.clone()))
        .await
        .expect("start");
    // Long enough for the parent to stop us even after a few tries (a stopped process's
    // timer keeps running, so this does not slow the test down).
    let pause = Pause {
        step: 1,
        wait: Duration::from_secs(3),
    };
    let driven = drive(session, &ledger, &env.owner, Some(pause), None).await;
    report(&id, &driven);
    match driven {
        Driven::LeaseLost(_) => EXIT_LEASE_LOST,
        _ => 1,
    }
}

async fn zombie_b(env: &Env) -> i32 {
    let (durable, ledger) = env.connect().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while tokio::time::Instant::now() < deadline {
        match durable
            .recover_next::<Message>()
            .await
            .expect("recover_next")
        {
            Some(resumed) => {
                let id = resumed.session.id().clone();
                println!(
                    "claimed {id} at version {} with fence {}",
                    resumed.report.version,
                    resumed.session.journal().fence_token()
                );
                let driven = drive(resumed.session, &ledger, &env.owner, None, None).await;
                report(&id, &driven);
                return if matches!(driven, Driven::Completed) {
                    0
                } else {
                    1
                };
            }
            None => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    println!("nothing to recover in 20 s");
    1
}

async fn pool(env: &Env) -> i32 {
    let (durable, ledger) = env.connect().await;
    let store = Arc::clone(durable.store());
    // Before `up`: from then on the parent may send SIGTERM, which must not kill us.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    println!("worker {} up", env.owner);
    let owner = env.owner.clone();
    let handler = move |resumed: Resumed<Message>, shutdown: ShutdownSignal| {
        let (ledger, owner) = (ledger.clone(), owner.clone());
        async move {
            let id = resumed.session.id().clone();
            println!(
                "claimed {id} at version {} t={}",
                resumed.report.version,
                hook::now_ms()
            );
            let driven = drive(resumed.session, &ledger, &owner, None, Some(&shutdown)).await;
            println!("{} t={}", outcome(&id, &driven), hook::now_ms());
            Ok(())
        }
    };
    let stop = async {
        let idle = async {
            while active_sessions(store.as_ref()).await != Some(0) {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        tokio::select! {
            _ = term.recv() => println!("SIGTERM: stopping gracefully t={}", hook::now_ms()),
            () = idle => {}
        }
    };
    let report = durable
        .worker(handler)
        .concurrency(hook::env_number(hook::CONCURRENCY).map_or(2, |n| n as usize))
        .poll_interval(Duration::from_millis(100))
        .shutdown_deadline(Duration::from_millis(
            hook::env_number(hook::DEADLINE_MS).unwrap_or(10_000),
        ))
        .run_until(stop)
        .await;
    println!(
        "pool stopped handled {} succeeded {} failed {} aborted {}",
        report.handled, report.succeeded, report.failed, report.aborted
    );
    0
}

/// The `limited` role: see the module docs and `tests/workers/limited.rs`.
async fn limited(env: &Env) -> i32 {
    use durable::limiter::{Quota, RateLimit};

    use crate::limited::{BURST, LIMIT, RATE, SESSIONS};

    let store: Arc<dyn CheckpointStore> = durable::connect(&env.store).await.expect("connect");
    let durable = Durable::builder(store)
        .owner(&env.owner)
        .app_version(APP_VERSION)
        .lease_ttl(env.ttl)
        .rate_limit(
            LIMIT,
            RateLimit::requests(Quota::per_second(RATE).with_burst(BURST)),
        )
        .limiter_hold(Duration::from_secs(120))
        .build();
    let mut sessions = Vec::new();
    for _ in 0..SESSIONS {
        sessions.push(
            durable
                .start::<Message>(StartOptions::new())
                .await
                .expect("start a session"),
        );
    }
    println!("worker {} up", env.owner);
    let mut go = String::new();
    std::io::stdin().read_line(&mut go).expect("a go line");
    let mut words = go
        .trim()
        .split(' ')
        .skip(1)
        .map(|w| w.parse::<i64>().expect("ms"));
    let (start, end) = (words.next().expect("start"), words.next().expect("end"));
    let unix_ms = || {
        i64::try_from(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("clock")
                .as_millis(),
        )
        .expect("ms")
    };
    tokio::time::sleep(Duration::from_millis(
        u64::try_from(start - unix_ms()).unwrap_or(0),
    ))
    .await;
    let tasks: Vec<_> = sessions
        .iter()
        .map(|session| {
            let journal = session.journal().with_rate_limit(LIMIT);
            tokio::spawn(async move {
                while unix_ms() < end {
                    journal
                        .model(|| async {
                            let t = unix_ms();
                            println!("call {t}");
                            Ok::<_, String>(json!({ "t": t }))
                        })
                        .await?;
                }
                Ok::<_, CallError<String>>(())
            })
        })
        .collect();
    for task in tasks {
        if let Err(e) = task.await.expect("a session task") {
            println!("error {e}");
            return 1;
        }
    }
    println!("done {}", env.owner);
    0
}
