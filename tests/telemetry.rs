//! The spans a session emits, as an OpenTelemetry exporter sees them: a `tracing` layer
//! captures every span with its fields, and the test asserts the names and attributes of
//! the GenAI conventions (`durable::telemetry`) for each thing the journal can do with a
//! call: executed, failed, recorded on replay, refused after a crash, plus the model call
//! with its token usage, the checkpoint and the resume.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use durable::telemetry as otel;
use durable::{
    Block, CheckpointStore, Durable, IdempotencyKey, Message, ModelToolCall, Session, Spend,
    StartOptions, Toolbox, durable_tool,
};
use serde_json::json;
use tokio::sync::Notify;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// Read a document.
#[durable_tool(replay = "pure")]
async fn lookup(key: String) -> Result<String, std::io::Error> {
    if key == "missing" {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "no such document",
        ));
    }
    Ok(format!("the text of {key}"))
}

/// Charge an order; the provider deduplicates on the key.
#[durable_tool(replay = "idempotent_with_key", idempotency_key = |a| format!("charge:{}", a.order_id))]
async fn charge(
    key: IdempotencyKey,
    order_id: String,
    cents: u64,
) -> Result<String, std::io::Error> {
    Ok(format!("charged {cents} for {order_id} ({})", key.as_str()))
}

/// Told when `send_email` has started a send that never finishes (the crash point).
static SEND_STARTED: Notify = Notify::const_new();

/// Send an email; with `hang`, the process "dies" mid-send.
#[durable_tool(replay = "unsafe_on_replay")]
async fn send_email(to: String, hang: bool) -> Result<String, std::io::Error> {
    if hang {
        SEND_STARTED.notify_one();
        std::future::pending::<()>().await;
    }
    Ok(format!("sent to {to}"))
}

/// A closed span: its `tracing` name and its fields as text.
#[derive(Debug, Clone)]
struct Captured {
    name: &'static str,
    fields: BTreeMap<String, String>,
}

impl Captured {
    fn get(&self, field: &str) -> Option<&str> {
        self.fields.get(field).map(String::as_str)
    }

    #[track_caller]
    fn has(&self, field: &str, value: &str) {
        assert_eq!(self.get(field), Some(value), "`{field}` of {self:#?}");
    }

    #[track_caller]
    fn lacks(&self, field: &str) {
        assert_eq!(self.get(field), None, "`{field}` of {self:#?}");
    }
}

#[derive(Default)]
struct Fields(BTreeMap<String, String>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().to_owned(), value.to_string());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().to_owned(), value.to_string());
    }
}

/// The layer: every span's fields, kept until it closes, then appended in close order.
#[derive(Clone, Default)]
struct Capture {
    closed: Arc<Mutex<Vec<Captured>>>,
    open: Arc<AtomicUsize>,
}

impl Capture {
    /// Takes the spans closed so far, once every span has closed: a span closes when its
    /// last handle drops, and SQLite's worker thread drops the handle it was given with
    /// each statement (to log under the caller's span) a moment after answering.
    async fn take(&self) -> Vec<Captured> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.open.load(Ordering::SeqCst) > 0 {
            assert!(Instant::now() < deadline, "spans left open");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        std::mem::take(&mut *self.closed.lock().expect("capture"))
    }
}

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        self.open.fetch_add(1, Ordering::SeqCst);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(fields);
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id)
            && let Some(fields) = span.extensions_mut().get_mut::<Fields>()
        {
            values.record(fields);
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(&id) {
            let fields = span.extensions_mut().remove::<Fields>().unwrap_or_default();
            self.open.fetch_sub(1, Ordering::SeqCst);
            self.closed.lock().expect("capture").push(Captured {
                name: span.name(),
                fields: fields.0,
            });
        }
    }
}

fn tools() -> Toolbox {
    Toolbox::new()
        .with(lookup)
        .and_then(|t| t.with(charge))
        .and_then(|t| t.with(send_email))
        .expect("tools")
}

/// The model's reply, journaled by `session.model`: named `gpt-test`, with usage.
async fn ask(session: &Session<Message>, reply: Message) -> Message {
    session
        .journal()
        .with_model_name("gpt-test")
        .model_with_spend(
            || async { Ok::<_, std::io::Error>(reply) },
            |_| Some(Spend::new(0.01, 120, 30).expect("spend")),
        )
        .await
        .expect("model")
}

/// The `execute_tool` span of the model's call `call_id`.
#[track_caller]
fn tool_span<'s>(spans: &'s [Captured], call_id: &str) -> &'s Captured {
    let found: Vec<_> = spans
        .iter()
        .filter(|s| {
            s.name == otel::EXECUTE_TOOL && s.get(otel::GEN_AI_TOOL_CALL_ID) == Some(call_id)
        })
        .collect();
    assert_eq!(
        found.len(),
        1,
        "one `execute_tool` span for {call_id} in {spans:#?}"
    );
    found[0]
}

#[track_caller]
fn only<'s>(spans: &'s [Captured], name: &str) -> &'s Captured {
    let found: Vec<_> = spans.iter().filter(|s| s.name == name).collect();
    assert_eq!(found.len(), 1, "one `{name}` span in {spans:#?}");
    found[0]
}

#[tokio::test]
async fn spans_carry_the_genai_names_and_the_journals_outcome() {
    let capture = Capture::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(capture.clone()));
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite:{}", dir.path().join("agent.db").display());
    let store: Arc<dyn CheckpointStore> = durable::connect(&url).await.expect("store");
    let durable = Durable::builder(Arc::clone(&store))
        .owner("worker-1")
        .renew_leases(false)
        .build();
    let tools = tools();
    let mut session = durable
        .start::<Message>(StartOptions::default())
        .await
        .expect("start");
    let session_id = session.id().as_str().to_owned();
    capture.take().await;

    // Turn 1: a model call, then a pure, a failing pure, a keyed and an unsafe call.
    let reply = ask(
        &session,
        Message::assistant(vec![
            Block::tool_call("call_1", "lookup", json!({"key": "a"})),
            Block::tool_call("call_2", "lookup", json!({"key": "missing"})),
            Block::tool_call("call_3", "charge", json!({"order_id": "o-1", "cents": 500})),
            Block::tool_call(
                "call_4",
                "send_email",
                json!({"to": "ann@example.com", "hang": false}),
            ),
        ]),
    )
    .await;
    for call in ModelToolCall::from_message(&reply) {
        tools
            .dispatch(session.journal(), &call)
            .await
            .expect("dispatch");
    }
    session.push(reply);
    session.checkpoint().await.expect("checkpoint");
    let spans = capture.take().await;

    let chat = only(&spans, otel::CHAT);
    chat.has(otel::OTEL_NAME, "chat gpt-test");
    chat.has(otel::GEN_AI_OPERATION_NAME, "chat");
    chat.has(otel::GEN_AI_REQUEST_MODEL, "gpt-test");
    chat.has(otel::GEN_AI_CONVERSATION_ID, &session_id);
    chat.has(otel::GEN_AI_USAGE_INPUT_TOKENS, "120");
    chat.has(otel::GEN_AI_USAGE_OUTPUT_TOKENS, "30");
    chat.has(otel::DURABLE_REPLAY_OUTCOME, "executed");
    chat.lacks(otel::ERROR_TYPE);

    let pure = tool_span(&spans, "call_1");
    pure.has(otel::OTEL_NAME, "execute_tool lookup");
    pure.has(otel::GEN_AI_OPERATION_NAME, "execute_tool");
    pure.has(otel::GEN_AI_TOOL_NAME, "lookup");
    pure.has(otel::GEN_AI_TOOL_TYPE, "function");
    pure.has(otel::GEN_AI_CONVERSATION_ID, &session_id);
    pure.has(otel::DURABLE_REPLAY_CLASS, "pure");
    pure.has(otel::DURABLE_REPLAY_OUTCOME, "executed");
    pure.has(otel::DURABLE_STEP, "0");
    assert!(pure.get(otel::DURABLE_CALL_ID).is_some(), "{pure:#?}");
    pure.lacks(otel::ERROR_TYPE);

    let failed = tool_span(&spans, "call_2");
    failed.has(otel::DURABLE_REPLAY_OUTCOME, "executed");
    failed.has(otel::ERROR_TYPE, "tool_error");

    let keyed = tool_span(&spans, "call_3");
    keyed.has(otel::OTEL_NAME, "execute_tool charge");
    keyed.has(otel::DURABLE_REPLAY_CLASS, "idempotent_with_key");
    keyed.has(otel::DURABLE_REPLAY_OUTCOME, "executed");

    let unsafe_call = tool_span(&spans, "call_4");
    unsafe_call.has(otel::OTEL_NAME, "execute_tool send_email");
    unsafe_call.has(otel::DURABLE_REPLAY_CLASS, "unsafe_on_replay");
    unsafe_call.has(otel::DURABLE_REPLAY_OUTCOME, "executed");

    let checkpoint = only(&spans, otel::CHECKPOINT);
    checkpoint.has(otel::GEN_AI_CONVERSATION_ID, &session_id);
    checkpoint.has(otel::DURABLE_SESSION_VERSION, "1");
    checkpoint.lacks(otel::ERROR_TYPE);

    // Turn 2: a pure call runs, then the process dies mid-send: the unsafe call's outcome
    // is never recorded.
    let reply = ask(
        &session,
        Message::assistant(vec![
            Block::tool_call("call_5", "lookup", json!({"key": "b"})),
            Block::tool_call(
                "call_6",
                "send_email",
                json!({"to": "bob@example.com", "hang": true}),
            ),
        ]),
    )
    .await;
    let calls = ModelToolCall::from_message(&reply);
    tools
        .dispatch(session.journal(), &calls[0])
        .await
        .expect("dispatch");
    tokio::select! {
        _ = tools.dispatch(session.journal(), &calls[1]) => panic!("the send never finishes"),
        _ = SEND_STARTED.notified() => {}
    }
    let id = session.id().clone();
    session.release().await.expect("release");
    capture.take().await;

    // Resume: the turn is re-run from the journal.
    let resumed = durable.resume::<Message>(&id).await.expect("resume");
    let session = resumed.session;
    let again = session
        .journal()
        .with_model_name("gpt-test")
        .model(|| async {
            Err::<Message, _>(std::io::Error::other("the model must not be asked again"))
        })
        .await
        .expect("journaled reply");
    let calls = ModelToolCall::from_message(&again);
    tools
        .dispatch(session.journal(), &calls[0])
        .await
        .expect("replayed");
    let refused = tools
        .dispatch(session.journal(), &calls[1])
        .await
        .expect_err("in doubt");
    assert!(
        matches!(refused, durable::DurableError::ReplayUnsafe { .. }),
        "{refused}"
    );
    // The barrier: no call with a side effect runs beside the in-doubt send.
    let charge_call =
        ModelToolCall::new("call_7", "charge", json!({"order_id": "o-2", "cents": 100}));
    let barred = tools
        .dispatch(session.journal(), &charge_call)
        .await
        .expect_err("barred");
    assert!(
        matches!(barred, durable::DurableError::ReplayUnsafe { .. }),
        "{barred}"
    );
    let spans = capture.take().await;

    let resume = only(&spans, otel::RESUME);
    resume.has(otel::GEN_AI_CONVERSATION_ID, &session_id);
    resume.has(otel::DURABLE_SESSION_VERSION, "1");
    resume.has(otel::DURABLE_RESUME_IN_DOUBT, "1");
    resume.lacks(otel::ERROR_TYPE);

    let chat = only(&spans, otel::CHAT);
    chat.has(otel::OTEL_NAME, "chat gpt-test");
    chat.has(otel::DURABLE_REPLAY_OUTCOME, "recorded");
    chat.has(otel::DURABLE_STEP, "1");
    chat.lacks(otel::GEN_AI_USAGE_INPUT_TOKENS);

    let recorded = tool_span(&spans, "call_5");
    recorded.has(otel::DURABLE_REPLAY_OUTCOME, "recorded");
    recorded.has(otel::DURABLE_CALL_OUTCOME, "cache_hit");
    recorded.has(otel::DURABLE_STEP, "1");
    recorded.lacks(otel::ERROR_TYPE);

    let in_doubt = tool_span(&spans, "call_6");
    in_doubt.has(otel::DURABLE_REPLAY_CLASS, "unsafe_on_replay");
    in_doubt.has(otel::DURABLE_REPLAY_OUTCOME, "refused");
    in_doubt.has(otel::ERROR_TYPE, "ReplayUnsafe");
    assert!(
        in_doubt.get(otel::DURABLE_CALL_ID).is_some(),
        "{in_doubt:#?}"
    );

    let barred = tool_span(&spans, "call_7");
    barred.has(otel::DURABLE_REPLAY_CLASS, "idempotent_with_key");
    barred.has(otel::DURABLE_REPLAY_OUTCOME, "refused");
    barred.has(otel::ERROR_TYPE, "ReplayUnsafe");
}

/// A call a budget ceiling refused: its span says it was refused as `BudgetExceeded`,
/// and carries the ceiling, what was spent and the ceiling's amount; nothing ran.
#[tokio::test]
async fn a_call_refused_by_a_ceiling_carries_the_spend() {
    let capture = Capture::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(capture.clone()));
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite:{}", dir.path().join("agent.db").display());
    let store: Arc<dyn CheckpointStore> = durable::connect(&url).await.expect("store");
    let durable = Durable::builder(Arc::clone(&store))
        .owner("worker-1")
        .renew_leases(false)
        .build();
    let tools = tools();
    let session = durable
        .start::<Message>(
            StartOptions::new().with_budget(
                durable::Budget::unlimited()
                    .with_limit_usd(0.01)
                    .expect("a limit")
                    .with_limit_tool("send_email", 0),
            ),
        )
        .await
        .expect("start");
    capture.take().await;

    // $0.01 spent of $0.01: the next model call is refused before the model is asked.
    ask(&session, Message::assistant(vec![Block::text("hello")])).await;
    let asked = AtomicUsize::new(0);
    let refused = session
        .journal()
        .with_model_name("gpt-test")
        .model_with_spend(
            || async {
                asked.fetch_add(1, Ordering::SeqCst);
                Ok::<_, std::io::Error>(Message::assistant(vec![]))
            },
            |_| None,
        )
        .await;
    assert!(
        matches!(
            refused,
            Err(durable::CallError::Durable(
                durable::DurableError::BudgetExceeded(_)
            ))
        ),
        "{refused:?}"
    );
    assert_eq!(asked.load(Ordering::SeqCst), 0, "the model was not asked");
    // A tool whose own ceiling is zero.
    let email = ModelToolCall::new(
        "call_9",
        "send_email",
        json!({"to": "ann@example.com", "hang": false}),
    );
    let dispatched = tools.dispatch(session.journal(), &email).await;
    assert!(
        matches!(
            dispatched,
            Err(durable::DurableError::BudgetExceeded(ref r)) if r.limit == durable::Limit::Usd
        ),
        "money is checked first: {dispatched:?}"
    );
    let spans = capture.take().await;
    let chats: Vec<_> = spans.iter().filter(|s| s.name == otel::CHAT).collect();
    assert_eq!(chats.len(), 2, "{spans:#?}");
    let chat = chats[1];
    chat.has(otel::DURABLE_REPLAY_OUTCOME, "refused");
    chat.has(otel::ERROR_TYPE, "BudgetExceeded");
    chat.has(otel::DURABLE_BUDGET_LIMIT, "usd");
    chat.has(otel::DURABLE_BUDGET_SPENT, "10000000");
    chat.has(otel::DURABLE_BUDGET_CEILING, "10000000");
    chats[0].lacks(otel::DURABLE_BUDGET_LIMIT);
    let tool = tool_span(&spans, "call_9");
    tool.has(otel::DURABLE_REPLAY_OUTCOME, "refused");
    tool.has(otel::ERROR_TYPE, "BudgetExceeded");
    tool.has(otel::DURABLE_BUDGET_LIMIT, "usd");
    tool.has(otel::DURABLE_BUDGET_SPENT, "10000000");
}
