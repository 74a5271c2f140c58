//! The agent the power is cut under, and the ledger of what its tools did.
//!
//! Each worker task drives one session at a time through turns of: a journaled model
//! reply, a `pure` lookup, an `idempotent_with_key` charge, an `unsafe_on_replay` send,
//! a message and a checkpoint (in odd turns, the send's outcome and the checkpoint in
//! one commit, `checkpoint_after`); after `TURNS` turns the session completes and the task
//! starts the next one. A tool body appends to the ledger the moment it runs, which for
//! the keyed and the unsafe tool is after the store acknowledged its *issued* row. The
//! ledger lives in this process's memory, off the simulated disk: the cut never touches
//! it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use durable_core::store::{Resolution, SessionStatus};
use durable_core::{
    CallError, Durable, DurableError, Message, ReplayClass, SessionId, StartOptions, StoreError,
    ToolSpec,
};
use serde_json::{Value, json};

/// Turns per session before it completes.
pub const TURNS: i64 = 5;

/// One run of a tool body: an effect on the world.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Effect {
    pub session: String,
    pub turn: i64,
    pub tool: &'static str,
    /// The idempotency key the body was given (keyed tools).
    pub key: Option<String>,
}

/// Everything outside the store: the ledger of effects, the checkpoints the store
/// acknowledged, the sessions the workers started, and the failures nobody expected.
#[derive(Debug, Default)]
pub struct World {
    pub ledger: Mutex<Vec<Effect>>,
    /// Session → the newest checkpoint version the store acknowledged.
    pub checkpoints: Mutex<BTreeMap<String, i64>>,
    /// Sessions whose completion the store acknowledged.
    pub completed: Mutex<Vec<String>>,
    /// Sessions started, in order (created or not: the store says).
    pub sessions: Mutex<Vec<String>>,
    /// Errors that happened while the power was on.
    pub unexpected: Mutex<Vec<String>>,
    pub pure_runs: AtomicU64,
    pub next_session: AtomicU64,
    /// In-doubt unsafe calls an operator resolved on resume (from the ledger).
    pub resolved: AtomicU64,
}

pub fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn schema() -> Value {
    json!({"type": "object", "properties": {"session": {"type": "string"}, "turn": {"type": "integer"}}})
}

pub struct Tools {
    lookup: ToolSpec,
    charge: ToolSpec,
    send: ToolSpec,
}

impl Tools {
    pub fn new() -> Self {
        Tools {
            lookup: ToolSpec::new("lookup", "A read.", ReplayClass::Pure, schema()),
            charge: ToolSpec::new(
                "charge",
                "A payment the upstream deduplicates by key.",
                ReplayClass::IdempotentWithKey,
                schema(),
            ),
            send: ToolSpec::new(
                "send",
                "An email: must never be sent twice.",
                ReplayClass::UnsafeOnReplay,
                schema(),
            ),
        }
    }
}

/// Whether an error is the cut's doing: once the power is off every write fails.
fn after_cut(power: &durable_powercut::PowerCut) -> bool {
    power.is_cut()
}

/// What one worker task does until the power goes (or `stop` turns true): resume its
/// session, or start new ones, and run turns.
pub async fn worker(
    durable: Durable,
    world: Arc<World>,
    tools: Arc<Tools>,
    power: durable_powercut::PowerCut,
    prefix: String,
    mut current: Option<String>,
    slot: Arc<Mutex<Option<String>>>,
) {
    loop {
        let id = match current.take() {
            Some(id) => id,
            None => {
                let n = world.next_session.fetch_add(1, Ordering::SeqCst);
                let id = format!("{prefix}-{n}");
                lock(&world.sessions).push(id.clone());
                id
            }
        };
        *lock(&slot) = Some(id.clone());
        match session(&durable, &world, &tools, &id).await {
            Ok(()) => {
                lock(&world.completed).push(id.clone());
                *lock(&slot) = None;
            }
            Err(e) => {
                if !after_cut(&power) {
                    lock(&world.unexpected).push(format!("session {id}: {e}"));
                }
                return;
            }
        }
    }
}

/// Runs session `id` (resumed if the store has it, else started) to completion.
async fn session(durable: &Durable, world: &World, tools: &Tools, id: &str) -> Result<(), String> {
    let sid = SessionId::new(id);
    let mut session = match durable.store().session(&sid).await {
        Ok(record) if record.status == SessionStatus::Completed => return Ok(()),
        Ok(_) => {
            let resumed = durable
                .resume::<Message>(&sid)
                .await
                .map_err(|e| format!("resume: {e}"))?;
            // The operator: an in-doubt email was sent if the ledger (the mail server's
            // log) says so, else it was not.
            for doubt in resumed.report.by_class(ReplayClass::UnsafeOnReplay) {
                let turn = doubt.call.args["turn"].as_i64().unwrap_or(-1);
                let sent = lock(&world.ledger)
                    .iter()
                    .any(|e| e.session == id && e.turn == turn && e.tool == "send");
                let resolution = if sent {
                    Resolution::Happened {
                        result: json!({"sent": turn}),
                    }
                } else {
                    Resolution::DidNotHappen
                };
                durable
                    .operator()
                    .resolve(&doubt.call.id, resolution, "power-loss-tier", None)
                    .await
                    .map_err(|e| format!("resolve: {e}"))?;
                world.resolved.fetch_add(1, Ordering::SeqCst);
            }
            resumed.session
        }
        Err(StoreError::SessionNotFound { .. }) => durable
            .start::<Message>(StartOptions::new().with_id(sid.clone()))
            .await
            .map_err(|e| format!("start: {e}"))?,
        Err(e) => return Err(format!("read the session: {e}")),
    };
    loop {
        let turn = session.version();
        if turn >= TURNS {
            return session
                .complete()
                .await
                .map(drop)
                .map_err(|e| format!("complete: {e}"));
        }
        let args = json!({"session": id, "turn": turn});
        session
            .model(|| async move { Ok::<_, String>(json!({"reply": turn})) })
            .await
            .map_err(call_error("model"))?;
        session
            .journal()
            .tool(&tools.lookup, args.clone())
            .run(|_ctx| async {
                world.pure_runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, String>(json!({"found": turn}))
            })
            .await
            .map_err(call_error("lookup"))?;
        session
            .journal()
            .tool(&tools.charge, args.clone())
            .key(format!("charge-{id}-{turn}"))
            .run(|ctx| {
                let key = ctx.idempotency_key().map(str::to_owned);
                async move {
                    lock(&world.ledger).push(Effect {
                        session: id.to_owned(),
                        turn,
                        tool: "charge",
                        key,
                    });
                    Ok::<_, String>(json!({"charged": turn}))
                }
            })
            .await
            .map_err(call_error("charge"))?;
        let send = async |journal: &durable_core::Journal| {
            journal
                .tool(&tools.send, args.clone())
                .run(|_ctx| async {
                    lock(&world.ledger).push(Effect {
                        session: id.to_owned(),
                        turn,
                        tool: "send",
                        key: None,
                    });
                    Ok::<_, String>(json!({"sent": turn}))
                })
                .await
        };
        let version = if turn % 2 == 1 {
            // The email's outcome and the checkpoint in one commit.
            session
                .checkpoint_after(send, |outcome| {
                    Message::tool_outcome(format!("send-{turn}"), outcome)
                })
                .await
                .map_err(call_error("send with checkpoint"))?;
            session.version()
        } else {
            send(session.journal()).await.map_err(call_error("send"))?;
            session.push(Message::user(format!("turn {turn} done")));
            session
                .checkpoint()
                .await
                .map_err(|e| format!("checkpoint: {e}"))?
                .version
        };
        lock(&world.checkpoints).insert(id.to_owned(), version);
    }
}

fn call_error(what: &'static str) -> impl Fn(CallError<String>) -> String {
    move |e| match e {
        CallError::Durable(DurableError::ReplayUnsafe { .. }) => {
            format!("{what}: refused as unsafe to replay (an in-doubt call was not resolved): {e}")
        }
        other => format!("{what}: {other}"),
    }
}
