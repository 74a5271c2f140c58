//! The world outside the store: a ledger of every effect the tool bodies performed (an
//! outbox and a webhook channel that deliver every call, a payment receiver that applies
//! each idempotency key once), the checks made while a program runs, and the task-local
//! `Scene` through which the interpreter interrupts a running turn.
//!
//! The store knows nothing of the ledger: it is the ground truth the properties are
//! checked against.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use durable::store::{CallStatus, Lease};
use durable::{
    CallId, CheckpointStore, Durable, DurableError, Message, Resumed, Session, SessionId, Spend,
    ToolContext,
};
use serde_json::{Value, json};
use tokio::sync::Notify;

use crate::program::{Class, Disrupt, VerifyMode};

tokio::task_local! {
    static SCENE: Arc<Scene>;
}

/// The properties a program must not break.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Property {
    /// Every `unsafe_on_replay` effect (one intent) happened at most once.
    UnsafeOnce,
    /// Every `idempotent_with_key` intent reached the receiver under one non-empty key.
    KeyedOnce,
    /// A recorded result is what every later replay of its call returns.
    ResultKept,
    /// Each checkpoint's spend is the sum, once per journal row, of the rows its turn used.
    BudgetOnce,
    /// No new side effect ran while an unsafe call of its session was in doubt.
    Barrier,
    /// A worker that lost its lease started no side effect.
    Zombie,
    /// A call awaiting approval or denied took no effect.
    Approval,
    /// The interpreter itself could not go on (a resume or a store read failed).
    Harness,
}

impl Property {
    pub fn name(self) -> &'static str {
        match self {
            Property::UnsafeOnce => "unsafe-at-most-once",
            Property::KeyedOnce => "keyed-applied-once",
            Property::ResultKept => "recorded-result-kept",
            Property::BudgetOnce => "budget-once-per-row",
            Property::Barrier => "session-wide-barrier",
            Property::Zombie => "zombie-acts-not",
            Property::Approval => "undecided-or-denied-runs-not",
            Property::Harness => "harness",
        }
    }
}

/// A broken property, with what showed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub property: Property,
    pub detail: String,
}

/// One execution of a non-pure tool body, as the outside world saw it.
#[derive(Debug, Clone)]
pub struct Effect {
    pub session: SessionId,
    pub worker: String,
    pub tool: &'static str,
    pub class: Class,
    pub intent: String,
    pub key: Option<String>,
    pub call: CallId,
    pub attempt: i32,
    /// What the body returned.
    pub result: Value,
}

#[derive(Default)]
struct State {
    effects: Vec<Effect>,
    /// The payment receiver: first result per key (a repeated key is not applied again).
    receiver: HashMap<String, Value>,
    verify: HashMap<SessionId, VerifyMode>,
    /// Rows left `issued` by a worker that died or lost its lease: (row, attempt, unsafe).
    orphans: HashMap<SessionId, Vec<(CallId, i32, bool)>>,
    /// Workers whose lease another worker took.
    fenced: HashSet<String>,
    /// The first result the harness received for each journal row.
    seen: HashMap<String, Value>,
    violations: Vec<Violation>,
    counter: u64,
    /// What happened, for the coverage line.
    tally: BTreeMap<String, u64>,
}

/// One program's world.
pub struct World {
    pub store: Arc<dyn CheckpointStore>,
    /// Makes ids unique across the programs sharing a store.
    pub tag: String,
    state: Mutex<State>,
    /// Whether calls with a side effect need a person's approval ([`Op::Approvals`]).
    ///
    /// [`Op::Approvals`]: crate::program::Op::Approvals
    pub approvals: Arc<std::sync::atomic::AtomicBool>,
}

impl World {
    pub fn new(store: Arc<dyn CheckpointStore>, tag: String) -> Self {
        World {
            store,
            tag,
            state: Mutex::default(),
            approvals: Arc::default(),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn violation(&self, property: Property, detail: String) {
        self.state().violations.push(Violation { property, detail });
    }

    pub fn take_violations(&self) -> Vec<Violation> {
        std::mem::take(&mut self.state().violations)
    }

    /// Counts one occurrence of `what` (coverage).
    pub fn tally(&self, what: impl Into<String>) {
        *self.state().tally.entry(what.into()).or_default() += 1;
    }

    pub fn take_tally(&self) -> BTreeMap<String, u64> {
        std::mem::take(&mut self.state().tally)
    }

    /// A number never handed out before in this program.
    pub fn next(&self) -> u64 {
        let mut state = self.state();
        state.counter += 1;
        state.counter
    }

    /// A runtime for a worker named `owner`: leases are never renewed (a worker that
    /// stops is dead at once) and last far longer than a program.
    pub fn worker(&self, owner: &str) -> Durable {
        let approvals = Arc::clone(&self.approvals);
        Durable::builder(Arc::clone(&self.store))
            .owner(owner)
            .lease_ttl(Duration::from_secs(600))
            .renew_leases(false)
            .approval_policy(move |tool, _args| {
                (approvals.load(Ordering::SeqCst) && tool.class != durable::ReplayClass::Pure)
                    .then(|| durable::approval::request("mbt: side effects need a person"))
            })
            .build()
    }

    pub fn verify_mode(&self, session: &SessionId) -> VerifyMode {
        self.state()
            .verify
            .get(session)
            .copied()
            .unwrap_or(VerifyMode::Unknown)
    }

    pub fn set_verify_mode(&self, session: &SessionId, mode: VerifyMode) {
        self.state().verify.insert(session.clone(), mode);
    }

    pub fn fence(&self, worker: &str) {
        self.state().fenced.insert(worker.to_owned());
    }

    fn is_fenced(&self, worker: &str) -> bool {
        self.state().fenced.contains(worker)
    }

    /// Remembers the rows a stopped worker left `issued` (nothing runs them any more).
    pub async fn note_orphans(&self, session: &SessionId) {
        match self.store.calls(session, None).await {
            Ok(rows) => {
                let mut state = self.state();
                let known = state.orphans.entry(session.clone()).or_default();
                for row in rows.iter().filter(|r| r.status == CallStatus::Issued) {
                    let entry = (
                        row.id.clone(),
                        row.attempt,
                        row.class == durable::ReplayClass::UnsafeOnReplay,
                    );
                    if !known.contains(&entry) {
                        known.push(entry);
                    }
                }
            }
            Err(e) => self.violation(Property::Harness, format!("reading the journal: {e}")),
        }
    }

    /// Checks a result the harness received: a row returns the same result every time.
    pub fn saw_result(&self, result: &Value) {
        let Some(call) = result.get("call_id").and_then(Value::as_str) else {
            self.violation(
                Property::ResultKept,
                format!("a tool result without its call id: {result}"),
            );
            return;
        };
        let mut state = self.state();
        match state.seen.get(call) {
            None => {
                state.seen.insert(call.to_owned(), result.clone());
            }
            Some(first) if first == result => {}
            Some(first) => {
                let detail = format!(
                    "call {call} returned {first} and later {result}: the recorded result was not replayed"
                );
                drop(state);
                self.violation(Property::ResultKept, detail);
            }
        }
    }

    pub fn seen_result(&self, call: &CallId) -> Option<Value> {
        self.state().seen.get(call.as_str()).cloned()
    }

    /// What the outside world knows of a journal row's effect: the body's result, if an
    /// execution of it performed its effect.
    pub fn effect_of(&self, call: &CallId) -> Option<Effect> {
        self.state()
            .effects
            .iter()
            .rev()
            .find(|e| &e.call == call)
            .cloned()
    }

    fn cost(&self, base: u64) -> Spend {
        let n = self.next();
        Spend::from_nano_usd(base * (1 + n % 7), 10 + n % 13, 1 + n % 5)
    }

    /// Performs a body's effect and returns its result (and what it cost).
    fn perform(&self, scene: &Scene, ctx: &ToolContext, class: Class, intent: &str) -> Value {
        let tool = tool_name(class);
        self.tally(format!("ran {tool} (attempt {})", ctx.attempt().min(3)));
        let spend = self.cost(100);
        ctx.record_spend(spend.clone());
        let nonce = self.next();
        let mut result = json!({
            "call_id": ctx.call_id().as_str(),
            "intent": intent,
            "nonce": nonce,
            "cost": spend,
        });
        let key = ctx.idempotency_key().map(str::to_owned);
        let receipt = match class {
            Class::Pure => {
                result["answer"] = json!(format!("facts about {intent}"));
                return result;
            }
            Class::Keyed => {
                let key = key.clone().unwrap_or_default();
                let fresh = json!(format!("ch_{nonce}"));
                self.state().receiver.entry(key).or_insert(fresh).clone()
            }
            Class::Email | Class::Webhook => json!(format!("{tool}-{nonce}")),
        };
        result["receipt"] = receipt;
        if let Some(key) = &key {
            result["key"] = json!(key);
        }
        self.state().effects.push(Effect {
            session: ctx.session_id().clone(),
            worker: scene.worker.clone(),
            tool,
            class,
            intent: intent.to_owned(),
            key,
            call: ctx.call_id().clone(),
            attempt: ctx.attempt(),
            result: result.clone(),
        });
        result
    }

    /// Properties read off the ledger once a program has run.
    pub fn check_ledger(&self) {
        let state = self.state();
        let mut unsafe_by_intent: BTreeMap<&str, Vec<&Effect>> = BTreeMap::new();
        let mut keys_by_intent: BTreeMap<&str, HashSet<&str>> = BTreeMap::new();
        let mut found = Vec::new();
        for effect in &state.effects {
            match effect.class {
                Class::Email | Class::Webhook => unsafe_by_intent
                    .entry(&effect.intent)
                    .or_default()
                    .push(effect),
                Class::Keyed => match effect.key.as_deref() {
                    Some(key) if !key.is_empty() => {
                        keys_by_intent
                            .entry(&effect.intent)
                            .or_default()
                            .insert(key);
                    }
                    _ => found.push(Violation {
                        property: Property::KeyedOnce,
                        detail: format!(
                            "charge {} (intent {}) reached the receiver without a key",
                            effect.call, effect.intent
                        ),
                    }),
                },
                Class::Pure => {}
            }
        }
        for (intent, effects) in unsafe_by_intent {
            if effects.len() > 1 {
                let runs: Vec<String> = effects
                    .iter()
                    .map(|e| {
                        format!(
                            "{} call {} attempt {} by {} in {}",
                            e.tool, e.call, e.attempt, e.worker, e.session
                        )
                    })
                    .collect();
                found.push(Violation {
                    property: Property::UnsafeOnce,
                    detail: format!(
                        "intent {intent} took effect {} times: {}",
                        effects.len(),
                        runs.join("; ")
                    ),
                });
            }
        }
        for (intent, keys) in keys_by_intent {
            if keys.len() > 1 {
                let mut keys: Vec<&str> = keys.into_iter().collect();
                keys.sort_unstable();
                found.push(Violation {
                    property: Property::KeyedOnce,
                    detail: format!("intent {intent} reached the receiver under keys {keys:?}"),
                });
            }
        }
        drop(state);
        self.state().violations.extend(found);
    }
}

/// The tool a call of this class goes to.
pub fn tool_name(class: Class) -> &'static str {
    match class {
        Class::Pure => "lookup",
        Class::Keyed => "charge",
        Class::Email => "send_email",
        Class::Webhook => "post_webhook",
    }
}

/// Releases the lease a dead worker left live, as its expiry would.
pub async fn release_dead_lease(world: &World, session: &SessionId) -> Result<(), DurableError> {
    let record = world.store.session(session).await?;
    let lease = Lease {
        session: session.clone(),
        owner: record.lease_owner.clone().unwrap_or_default(),
        fence: record.fence,
        expires_at: 0,
    };
    world.store.release_lease(&lease).await?;
    Ok(())
}

/// Another worker takes the session over: the current holder's lease is released behind
/// its back (as if it had expired) and `owner` resumes it.
pub async fn take_over(
    world: &World,
    session: &SessionId,
    owner: &str,
) -> Result<Resumed<Message>, DurableError> {
    release_dead_lease(world, session).await?;
    world.worker(owner).resume::<Message>(session).await
}

/// One worker's run of one turn, seen from inside it (task-local): where to interrupt it.
pub struct Scene {
    pub world: Arc<World>,
    pub worker: String,
    session: SessionId,
    disrupt: Disrupt,
    /// Tool bodies started in this attempt.
    bodies: AtomicUsize,
    /// Notified when the worker "dies": the interpreter drops the turn's future.
    pub crash: Notify,
    /// The worker that takes the session on a lease loss, and its session once it has.
    successor: String,
    taken: Mutex<Option<Session<Message>>>,
}

impl Scene {
    pub fn new(
        world: Arc<World>,
        worker: String,
        session: SessionId,
        disrupt: Disrupt,
        successor: String,
    ) -> Arc<Self> {
        Arc::new(Scene {
            world,
            worker,
            session,
            disrupt,
            bodies: AtomicUsize::new(0),
            crash: Notify::new(),
            successor,
            taken: Mutex::new(None),
        })
    }

    /// Runs `fut` with this scene visible to the tool bodies it runs.
    pub async fn enter<F: Future>(self: &Arc<Self>, fut: F) -> F::Output {
        SCENE.scope(Arc::clone(self), fut).await
    }

    /// The scene of the running turn.
    pub fn current() -> Arc<Scene> {
        SCENE
            .try_with(Arc::clone)
            .expect("a tool body runs inside a harness turn")
    }

    /// The session taken over by the successor, if the lease was lost.
    pub fn taken(&self) -> Option<(String, Session<Message>)> {
        let session = self.taken.lock().unwrap_or_else(|e| e.into_inner()).take();
        session.map(|s| (self.successor.clone(), s))
    }

    async fn die(&self) -> ! {
        self.world.tally(format!("disrupt {:?}", self.disrupt));
        self.crash.notify_one();
        std::future::pending::<()>().await;
        unreachable!("a dead worker's future is dropped, never resumed")
    }

    async fn lose_lease(&self) {
        self.world.tally(format!("disrupt {:?}", self.disrupt));
        self.world.fence(&self.worker);
        match take_over(&self.world, &self.session, &self.successor).await {
            Ok(resumed) => {
                *self.taken.lock().unwrap_or_else(|e| e.into_inner()) = Some(resumed.session);
            }
            Err(e) => self
                .world
                .violation(Property::Harness, format!("taking the lease over: {e}")),
        }
    }

    pub async fn after_model(&self) {
        match self.disrupt {
            Disrupt::CrashAfterModel => self.die().await,
            Disrupt::LoseLeaseAfterModel => self.lose_lease().await,
            _ => {}
        }
    }

    pub async fn before_checkpoint(&self) {
        if self.disrupt == Disrupt::CrashBeforeCheckpoint {
            self.die().await;
        }
    }

    /// A tool body starts: checks that it may have an effect at all, and dies here if
    /// told to.
    async fn body_start(&self, ctx: &ToolContext, class: Class) -> usize {
        let n = self.bodies.fetch_add(1, Ordering::SeqCst);
        if class != Class::Pure {
            self.check_may_act(ctx, class).await;
        }
        if self.disrupt == Disrupt::CrashBeforeEffect(index(n)) {
            self.die().await;
        }
        n
    }

    async fn body_end(&self, n: usize) {
        if self.disrupt == Disrupt::CrashAfterEffect(index(n)) {
            self.die().await;
        }
        if self.disrupt == Disrupt::LoseLeaseInCall(index(n)) {
            self.lose_lease().await;
        }
    }

    /// The zombie and barrier checks, made before a non-pure effect.
    async fn check_may_act(&self, ctx: &ToolContext, class: Class) {
        let world = &self.world;
        let tool = tool_name(class);
        if world.is_fenced(&self.worker) {
            world.violation(
                Property::Zombie,
                format!(
                    "{tool} call {} ran for {} after another worker took its lease",
                    ctx.call_id(),
                    self.worker
                ),
            );
        }
        let orphans = world
            .state()
            .orphans
            .get(ctx.session_id())
            .cloned()
            .unwrap_or_default();
        if orphans.iter().any(|(id, _, _)| id == ctx.call_id()) {
            // A recorded call re-executed under its class (in doubt keyed, or unsafe that
            // a verify hook or an operator found did not happen): the protocol itself.
            return;
        }
        for (id, attempt, is_unsafe) in orphans {
            if !is_unsafe {
                continue;
            }
            match world.store.call(&id).await {
                Ok(row) if row.status == CallStatus::Issued && row.attempt == attempt => {
                    let intent = row
                        .args
                        .get("memo")
                        .and_then(Value::as_str)
                        .map(intent_of)
                        .unwrap_or_default();
                    world.violation(
                        Property::Barrier,
                        format!(
                            "{tool} call {} (step {}) ran while {} call {id} (step {}, intent {intent}) was in doubt and unresolved",
                            ctx.call_id(),
                            ctx.identity().step,
                            row.identity.tool,
                            row.identity.step,
                        ),
                    );
                }
                Ok(_) => {}
                Err(e) => world.violation(Property::Harness, format!("reading call {id}: {e}")),
            }
        }
    }
}

fn index(n: usize) -> u8 {
    u8::try_from(n).unwrap_or(u8::MAX)
}

/// The intent a call's `memo` carries (`intent=<id> draft=<n>`).
pub fn intent_of(memo: &str) -> String {
    memo.split_whitespace()
        .find_map(|w| w.strip_prefix("intent="))
        .unwrap_or_default()
        .to_owned()
}

/// A tool body: the effect on the world, between the scene's interruption points.
pub async fn body(ctx: &ToolContext, class: Class, memo: &str) -> Value {
    let scene = Scene::current();
    let n = scene.body_start(ctx, class).await;
    let result = scene.world.perform(&scene, ctx, class, &intent_of(memo));
    scene.body_end(n).await;
    result
}

/// What an outside look (a verify hook, an operator) finds about a row: the receipt of its
/// effect, without the cost, which only the body knew.
pub fn found_result(effect: &Effect, by: &str) -> Value {
    let mut result = json!({
        "call_id": effect.call.as_str(),
        "intent": effect.intent,
        "receipt": effect.result["receipt"],
        "found_by": by,
    });
    if let Some(key) = &effect.key {
        result["key"] = json!(key);
    }
    result
}
