//! The interpreter: runs one program against a store, then checks every property.
//!
//! A program drives one or more sessions (a fork adds one). Each session has at most one
//! live worker, a `Session` handle of its own `Durable` (owner `<tag>-w<n>`). A worker
//! that "dies" is dropped mid-turn with its lease still live, as after a `SIGKILL`; the
//! next worker releases that lease (as its expiry would) and resumes. A worker that loses
//! its lease goes on with its turn as a zombie while its successor holds the session.
//!
//! **Forks get fresh intents.** A fork is a new conversation: its model proposes intents
//! of its own, so the fork's effects never count against the source's intents (an email
//! sent in the source and one sent in a fork are two emails by design). The fork inherits
//! the source's effects from the forked version on (a fork never repeats them), so a fork
//! whose model proposes other calls in the re-run turn meets the inherited ones as a
//! divergence and stops there; `tests/fork_generator.rs` re-runs the source's own intents
//! in forks. The budget a fork starts with is the source's at the forked version.

use std::collections::BTreeMap;
use std::sync::Arc;

use durable::store::{CallStatus, Resolution, SessionStatus};
use durable::{Budget, CheckpointStore, Message, Session, SessionId, Spend, StartOptions};

use crate::harness::{self, Model, Release, TurnEnd};
use crate::program::{Class, Disrupt, Op, Schema, Verdict, VerifyMode};
use crate::tools;
use crate::world::{Property, Scene, Violation, World, found_result, release_dead_lease};

/// Spend totals, compared with a checkpoint's budget.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Totals {
    nano_usd: u64,
    input_tokens: u64,
    output_tokens: u64,
}

impl Totals {
    fn add(mut self, spend: &Spend) -> Self {
        self.nano_usd += spend.nano_usd();
        self.input_tokens += spend.input_tokens();
        self.output_tokens += spend.output_tokens();
        self
    }

    fn of(budget: &Budget) -> Self {
        Totals {
            nano_usd: budget.spent_nano_usd,
            input_tokens: budget.input_tokens,
            output_tokens: budget.output_tokens,
        }
    }
}

/// One session of the program and what the harness knows of it.
struct Agent {
    id: SessionId,
    model: Model,
    /// The live worker's handle and name.
    live: Option<(String, Session<Message>)>,
    /// A worker died holding the lease (it stays live until released).
    dead_lease: bool,
    release: Release,
    /// Expected spend at each checkpoint version the harness wrote (or forked from).
    expected: BTreeMap<i64, Totals>,
}

/// What running a program found.
pub struct Outcome {
    pub steps: usize,
    pub violations: Vec<Violation>,
    /// What happened (coverage counts).
    pub tally: BTreeMap<String, u64>,
}

struct Interp {
    world: Arc<World>,
    agents: Vec<Agent>,
    focus: usize,
    workers: u32,
}

impl Interp {
    fn worker_name(&mut self) -> String {
        self.workers += 1;
        format!("{}-w{}", self.world.tag, self.workers)
    }

    fn harness_error(&self, what: &str, e: impl std::fmt::Display) {
        self.world
            .violation(Property::Harness, format!("{what}: {e}"));
    }

    /// Makes sure the focused session has a live worker: resumes it if not.
    async fn ensure_live(&mut self) -> bool {
        if self.agents[self.focus].live.is_some() {
            return true;
        }
        let name = self.worker_name();
        let world = Arc::clone(&self.world);
        let agent = &mut self.agents[self.focus];
        if agent.dead_lease {
            if let Err(e) = release_dead_lease(&world, &agent.id).await {
                world.violation(Property::Harness, format!("releasing a dead lease: {e}"));
                return false;
            }
            agent.dead_lease = false;
        }
        if let Ok(record) = world.store.session(&agent.id).await
            && record.status == SessionStatus::AwaitingApproval
        {
            // No worker may take it until a person decides.
            world.tally("turn skipped: awaiting approval");
            return false;
        }
        match world.worker(&name).resume::<Message>(&agent.id).await {
            Ok(resumed) => {
                agent.live = Some((name, resumed.session));
                true
            }
            Err(e) => {
                world.violation(Property::Harness, format!("resuming {}: {e}", agent.id));
                false
            }
        }
    }

    /// The live worker stops cleanly (a deploy): it releases its lease.
    async fn stop(&mut self) {
        if let Some((_, session)) = self.agents[self.focus].live.take()
            && let Err(e) = session.release().await
        {
            self.harness_error("releasing the lease", e);
        }
    }

    async fn turn(&mut self, classes: &[Class], disrupt: Disrupt) {
        if !self.ensure_live().await {
            return;
        }
        let successor = self.worker_name();
        let world = Arc::clone(&self.world);
        let agent = &mut self.agents[self.focus];
        let Some((worker, mut session)) = agent.live.take() else {
            return;
        };
        let base = session.version();
        let scene = Scene::new(
            Arc::clone(&world),
            worker.clone(),
            agent.id.clone(),
            disrupt,
            successor,
        );
        let toolbox = tools::toolbox(agent.release.schema);
        let end = {
            let run = scene.enter(harness::turn(
                &mut session,
                &toolbox,
                &mut agent.model,
                agent.release,
                classes,
            ));
            tokio::select! {
                biased;
                end = run => Some(end),
                () = scene.crash.notified() => None,
            }
        };
        let taken = scene.taken();
        match end {
            None => {
                // The worker died mid-turn: its future is gone, its lease still live.
                drop(session);
                agent.dead_lease = true;
            }
            Some(TurnEnd::Checkpointed { version, used }) => {
                if taken.is_some() {
                    world.violation(
                        Property::Zombie,
                        format!("{worker} wrote checkpoint {version} after losing its lease"),
                    );
                }
                match agent.expected.get(&base).copied() {
                    Some(start) => {
                        let total = used.values().fold(start, Totals::add);
                        agent.expected.insert(version, total);
                    }
                    None => world.violation(
                        Property::Harness,
                        format!("no expected budget for version {base}"),
                    ),
                }
                agent.live = Some((worker, session));
            }
            Some(TurnEnd::Awaiting) => match session.await_approval().await {
                Ok(()) => world.tally("parked awaiting approval"),
                // A zombie's lease is gone: its successor holds the session.
                Err(_) if taken.is_some() => world.tally("zombie could not park"),
                Err(e) => world.violation(Property::Harness, format!("parking for approval: {e}")),
            },
            Some(TurnEnd::Stopped(_reason)) => {
                // A harness that cannot go on exits; a zombie is simply gone.
                drop(session);
                if taken.is_none() {
                    agent.dead_lease = true;
                }
            }
        }
        if let Some((successor, session)) = taken {
            agent.live = Some((successor, session));
            agent.dead_lease = false;
        }
        let id = agent.id.clone();
        world.note_orphans(&id).await;
    }

    /// An operator resolves every in-doubt call of the focused session from the ledger.
    async fn operator(&mut self) {
        let world = Arc::clone(&self.world);
        let name = self.worker_name();
        let agent = &mut self.agents[self.focus];
        if agent.live.is_none() && agent.dead_lease {
            // The dead worker's lease expires before anyone can see its calls in doubt.
            if let Err(e) = release_dead_lease(&world, &agent.id).await {
                world.violation(Property::Harness, format!("releasing a dead lease: {e}"));
                return;
            }
            agent.dead_lease = false;
        }
        let operator = world.worker(&name);
        let rows = match operator.operator().in_doubt(Some(&agent.id)).await {
            Ok(rows) => rows,
            Err(e) => {
                world.violation(Property::Harness, format!("listing in-doubt calls: {e}"));
                return;
            }
        };
        for row in rows {
            let resolution = match world.effect_of(&row.id) {
                Some(effect) => Resolution::Happened {
                    result: found_result(&effect, "operator"),
                },
                None => Resolution::DidNotHappen,
            };
            world.tally(match resolution {
                Resolution::Happened { .. } => "operator: happened",
                Resolution::DidNotHappen => "operator: did not happen",
            });
            if let Err(e) = operator
                .operator()
                .resolve(
                    &row.id,
                    resolution,
                    "operator",
                    Some("looked in the ledger"),
                )
                .await
            {
                world.violation(Property::Harness, format!("resolving {}: {e}", row.id));
            }
        }
    }

    /// A person decides every call of the focused session awaiting approval.
    async fn decide(&mut self, verdict: Verdict) {
        let world = Arc::clone(&self.world);
        let name = self.worker_name();
        let person = world.worker(&name);
        let id = self.agents[self.focus].id.clone();
        let pending = match person.operator().approvals(Some(&id)).await {
            Ok(pending) => pending,
            Err(e) => {
                world.violation(Property::Harness, format!("listing approvals: {e}"));
                return;
            }
        };
        for request in pending {
            let call = &request.call.id;
            let decided = match verdict {
                Verdict::Approve => person.operator().approve(call, None, "person", None).await,
                Verdict::Deny => {
                    person
                        .operator()
                        .deny(call, "not now", "person", None)
                        .await
                }
            };
            match decided {
                Ok(_) => world.tally(match verdict {
                    Verdict::Approve => "person: approved",
                    Verdict::Deny => "person: denied",
                }),
                Err(e) => world.violation(Property::Harness, format!("deciding {call}: {e}")),
            }
        }
    }

    async fn fork(&mut self, back: u8) {
        let world = Arc::clone(&self.world);
        let name = self.worker_name();
        let index = self.agents.len();
        let source = &self.agents[self.focus];
        let latest = match world.store.session(&source.id).await {
            Ok(record) => record.latest_version,
            Err(e) => {
                world.violation(Property::Harness, format!("reading the session: {e}"));
                return;
            }
        };
        let version = latest.saturating_sub(i64::from(back)).max(0);
        let id = SessionId::new(format!("{}-s{index}", world.tag));
        let forked = world
            .worker(&name)
            .operator()
            .fork::<Message>(&source.id, version, Some(id.clone()))
            .await;
        let session = match forked {
            Ok(session) => session,
            Err(e) => {
                world.violation(Property::Harness, format!("forking at {version}: {e}"));
                return;
            }
        };
        world.set_verify_mode(&id, world.verify_mode(&source.id));
        let mut expected = BTreeMap::new();
        if let Some(totals) = source.expected.get(&version) {
            expected.insert(0, *totals);
        } else {
            world.violation(
                Property::Harness,
                format!("no expected budget for forked version {version}"),
            );
        }
        let agent = Agent {
            id,
            model: Model {
                namespace: format!("{}-s{index}", world.tag),
                next: 0,
            },
            live: Some((name, session)),
            dead_lease: false,
            release: source.release,
            expected,
        };
        world.tally("forked");
        self.agents.push(agent);
        self.focus = index;
    }

    async fn step(&mut self, op: &Op) {
        match op {
            Op::Turn { calls, disrupt } => self.turn(calls, *disrupt).await,
            Op::Restart => {
                let agent = &mut self.agents[self.focus];
                if let Some((_, session)) = agent.live.take() {
                    drop(session);
                    agent.dead_lease = true;
                }
            }
            Op::ReAsk => {
                self.stop().await;
                self.agents[self.focus].release.format += 1;
            }
            Op::SchemaChange(schema) => {
                self.stop().await;
                self.agents[self.focus].release.schema = *schema;
            }
            Op::Operator => self.operator().await,
            Op::Verify(mode) => {
                let id = self.agents[self.focus].id.clone();
                self.world.set_verify_mode(&id, *mode);
            }
            Op::Fork { back } => self.fork(*back).await,
            Op::Switch => self.focus = (self.focus + 1) % self.agents.len(),
            Op::Approvals(on) => self
                .world
                .approvals
                .store(*on, std::sync::atomic::Ordering::SeqCst),
            Op::Decide(verdict) => self.decide(*verdict).await,
        }
    }

    /// The properties read off the store once the program has run.
    async fn check_store(&self) {
        let world = &self.world;
        for agent in &self.agents {
            let rows = match world.store.calls(&agent.id, None).await {
                Ok(rows) => rows,
                Err(e) => {
                    world.violation(Property::Harness, format!("reading the journal: {e}"));
                    continue;
                }
            };
            for row in &rows {
                if matches!(row.status, CallStatus::Requested | CallStatus::Denied)
                    && let Some(effect) = world.effect_of(&row.id)
                {
                    world.violation(
                        Property::Approval,
                        format!(
                            "call {} of {} is {} but took effect: {effect:?}",
                            row.id,
                            row.identity.tool,
                            row.status.as_str()
                        ),
                    );
                }
            }
            for row in rows {
                let recorded = matches!(row.status, CallStatus::Completed | CallStatus::Resolved);
                if let (true, Some(result), Some(seen)) =
                    (recorded, &row.result, world.seen_result(&row.id))
                    && result != &seen
                {
                    world.violation(
                        Property::ResultKept,
                        format!(
                            "call {} of {} recorded {result} but the harness got {seen}",
                            row.id, row.identity.tool
                        ),
                    );
                }
            }
            for (version, expected) in &agent.expected {
                match world.store.load_checkpoint(&agent.id, Some(*version)).await {
                    Ok(cp) => match serde_json::from_value::<Budget>(cp.budget) {
                        Ok(budget) if Totals::of(&budget) == *expected => {}
                        Ok(budget) => world.violation(
                            Property::BudgetOnce,
                            format!(
                                "{} checkpoint {version} spent {:?}; the rows its turns used cost {expected:?}",
                                agent.id,
                                Totals::of(&budget)
                            ),
                        ),
                        Err(e) => world.violation(Property::Harness, format!("budget: {e}")),
                    },
                    Err(e) => world.violation(
                        Property::Harness,
                        format!("loading checkpoint {version}: {e}"),
                    ),
                }
            }
        }
        world.check_ledger();
    }
}

/// Runs `program` on a new session of `store` (ids start with `tag`) and checks it.
pub async fn run(store: Arc<dyn CheckpointStore>, tag: String, program: &[Op]) -> Outcome {
    let world = Arc::new(World::new(store, tag.clone()));
    let mut interp = Interp {
        world: Arc::clone(&world),
        agents: Vec::new(),
        focus: 0,
        workers: 0,
    };
    let name = interp.worker_name();
    let id = SessionId::new(format!("{tag}-s0"));
    let started = world
        .worker(&name)
        .start::<Message>(
            StartOptions::new()
                .with_id(id.clone())
                .with_messages(vec![Message::user("Handle the customer's orders.")]),
        )
        .await;
    let session = match started {
        Ok(session) => session,
        Err(e) => {
            world.violation(Property::Harness, format!("starting the session: {e}"));
            return Outcome {
                steps: 0,
                violations: world.take_violations(),
                tally: world.take_tally(),
            };
        }
    };
    world.set_verify_mode(&id, VerifyMode::Unknown);
    interp.agents.push(Agent {
        id,
        model: Model {
            namespace: format!("{tag}-s0"),
            next: 0,
        },
        live: Some((name, session)),
        dead_lease: false,
        release: Release {
            format: 1,
            schema: Schema::V1,
        },
        expected: BTreeMap::from([(0, Totals::default())]),
    });
    for op in program {
        interp.step(op).await;
    }
    interp.check_store().await;
    Outcome {
        steps: program.len(),
        violations: world.take_violations(),
        tally: world.take_tally(),
    }
}
