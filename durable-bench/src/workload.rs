//! The durable side of every figure, the same for every backend (the benches write the raw
//! side in their backend's SQL): one journaled call per replay class, an agent turn, and
//! many sessions calling at once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use durable_core::{
    Block, Durable, Message, ReplayClass, Session, SessionId, StartOptions, ToolSpec,
};
use serde_json::json;

/// The bench tool of `class`: its body returns at once, so a call costs the journal only.
pub fn spec(class: ReplayClass) -> ToolSpec {
    ToolSpec::new(
        format!("bench_{class}"),
        "A tool whose body returns at once.",
        class,
        json!({"type": "object", "properties": {"n": {"type": "integer"}}}),
    )
}

/// A tool's result: a ~100-byte JSON object, the payload of the raw rows too.
pub fn result_payload() -> serde_json::Value {
    json!({"ok": true, "text": "x".repeat(64)})
}

/// One journaled call of `spec` with argument `n` (a key derived from `n` for the keyed
/// class). Panics if the journal refuses it: a bench has no error path.
pub async fn call(session: &Session<Message>, spec: &ToolSpec, n: u64) {
    let mut call = session.journal().tool(spec, json!({ "n": n }));
    if spec.class == ReplayClass::IdempotentWithKey {
        call = call.key(format!("key-{n}"));
    }
    call.run(|_ctx| async move { Ok::<_, String>(result_payload()) })
        .await
        .expect("journaled call");
}

/// The model's reply in turn `turn`: some text and one tool call (~450 bytes as JSON).
pub fn reply(turn: usize) -> Message {
    Message::assistant(vec![
        Block::text(format!(
            "turn {turn:05}: {}",
            "lorem ipsum dolor sit amet ".repeat(10)
        )),
        Block::tool_call(
            format!("call-{turn}"),
            "lookup",
            json!({"query": format!("order {turn}"), "limit": 5}),
        ),
    ])
}

/// The tool result message answering [`reply`]'s call (~150 bytes as JSON).
pub fn tool_result(turn: usize) -> Message {
    Message::tool_result(format!("call-{turn}"), result_payload(), false)
}

/// The JSON text of a message, as a raw table stores it.
pub fn message_json(message: &Message) -> String {
    serde_json::to_string(message).expect("a message serializes")
}

/// One agent turn: the model's reply journaled ([`Session::model`], the path a real
/// provider call takes), the reply and its tool result pushed, then a checkpoint.
pub async fn agent_turn(session: &mut Session<Message>, turn: usize) {
    let reply = session
        .model(|| async move { Ok::<_, String>(reply(turn)) })
        .await
        .expect("journaled model reply");
    session.push(reply);
    session.push(tool_result(turn));
    session.checkpoint().await.expect("checkpoint");
}

/// A new session (a fresh id, leased to this worker).
pub async fn start(durable: &Durable) -> Session<Message> {
    durable
        .start::<Message>(StartOptions::default())
        .await
        .expect("start a session")
}

/// `sessions` tasks at once, each on a session of its own (its own lease), each making
/// `per_session` calls of `spec`; journaled calls per second. The sessions are started
/// before the clock starts.
pub async fn throughput(
    durable: &Durable,
    spec: &ToolSpec,
    sessions: usize,
    per_session: usize,
) -> f64 {
    let spec = Arc::new(spec.clone());
    let mut ready = Vec::with_capacity(sessions);
    for _ in 0..sessions {
        ready.push(start(durable).await);
    }
    let started = Instant::now();
    let tasks: Vec<_> = ready
        .into_iter()
        .map(|session| {
            let spec = Arc::clone(&spec);
            tokio::spawn(async move {
                for n in 0..per_session as u64 {
                    call(&session, &spec, n).await;
                }
                session
            })
        })
        .collect();
    let mut done = Vec::with_capacity(sessions);
    for task in tasks {
        done.push(task.await.expect("session task"));
    }
    let rate = (sessions * per_session) as f64 / started.elapsed().as_secs_f64();
    for session in done {
        session.release().await.expect("release");
    }
    rate
}

/// µs per item of `took` spread over `items`.
pub fn micros_per(took: Duration, items: usize) -> f64 {
    took.as_secs_f64() * 1e6 / items.max(1) as f64
}

/// A session of `turns` agent turns, its lease released; its id.
pub async fn agent_session(durable: &Durable, turns: usize) -> SessionId {
    let mut session = start(durable).await;
    for turn in 0..turns {
        agent_turn(&mut session, turn).await;
    }
    let id = session.id().clone();
    session.release().await.expect("release");
    id
}

/// How long [`Durable::resume`] of session `id` takes (lease, latest checkpoint, in-doubt
/// report, transcript); the lease is released again after the clock stops. Checks that
/// the transcript holds `messages` messages.
pub async fn resume(durable: &Durable, id: &SessionId, messages: usize) -> Duration {
    let started = Instant::now();
    let resumed = durable
        .resume::<Message>(id)
        .await
        .expect("resume the session");
    let took = started.elapsed();
    assert_eq!(
        resumed.session.messages().len(),
        messages,
        "resumed transcript"
    );
    resumed.session.release().await.expect("release");
    took
}

/// How long taking the lease of released session `id` takes (`acquire_lease`: one durable
/// commit); the lease is released again after the clock stops.
pub async fn lease(durable: &Durable, id: &SessionId) -> Duration {
    let store = durable.store();
    let config = durable.config();
    let started = Instant::now();
    let lease = store
        .acquire_lease(
            id,
            &config.owner,
            config.lease_ttl,
            config.max_recovery_attempts,
        )
        .await
        .expect("take the lease");
    let took = started.elapsed();
    store.release_lease(&lease).await.expect("release");
    took
}
