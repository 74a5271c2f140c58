//! The class, hunted: generated tools whose secret arguments are strings (with quotes,
//! escapes, non-ASCII), numbers, arrays or nested objects, beside plain ones; one reply
//! asking for several calls of them in parallel, in the default message (arguments as an
//! object or as text), OpenAI and Anthropic shapes; run, checkpointed, resumed and
//! replayed. No stored row, exported fixture, transcript message or error may hold a
//! secret, and every tool must receive exactly the clear values the model sent.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use durable::sqlite::SqliteStore;
use durable::{
    Block, CallError, CheckpointStore, Durable, DurableError, Journal, Message, ModelToolCall,
    ReplayClass, StartOptions, Tool, ToolOutput, ToolResult, ToolSpec, Toolbox,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};
use serde_json::{Value, json};

const CANARY: &str = "CANARY-7f3a9c-hunter2";

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

#[derive(Debug, Clone, Copy)]
enum Kind {
    Text,
    Escaped,
    Number,
    Array,
    Nested,
}

#[derive(Debug, Clone, Copy)]
struct Arg {
    secret: bool,
    kind: Kind,
}

#[derive(Debug, Clone, Copy)]
enum Shape {
    MessageObject,
    MessageText,
    OpenAi,
    Anthropic,
}

#[derive(Debug, Clone)]
struct Case {
    /// Each tool's class and arguments (at least one secret each).
    tools: Vec<(ReplayClass, Vec<Arg>)>,
    /// The calls of the one reply: which tool, and which secret values (calls with the
    /// same variant of the same tool are identical).
    calls: Vec<(usize, u64)>,
    shape: Shape,
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        Just(Kind::Text),
        Just(Kind::Escaped),
        Just(Kind::Number),
        Just(Kind::Array),
        Just(Kind::Nested),
    ]
}

fn class() -> impl Strategy<Value = ReplayClass> {
    prop_oneof![
        Just(ReplayClass::Pure),
        Just(ReplayClass::IdempotentWithKey),
        Just(ReplayClass::UnsafeOnReplay),
    ]
}

fn tool() -> impl Strategy<Value = (ReplayClass, Vec<Arg>)> {
    (
        class(),
        kind(),
        prop::collection::vec((any::<bool>(), kind()), 0..3),
    )
        .prop_map(|(class, first, rest)| {
            let mut args = vec![Arg {
                secret: true,
                kind: first,
            }];
            args.extend(rest.into_iter().map(|(secret, kind)| Arg { secret, kind }));
            (class, args)
        })
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop::collection::vec(tool(), 1..3),
        prop::collection::vec((any::<prop::sample::Index>(), 0..3u64), 1..5),
        prop_oneof![
            Just(Shape::MessageObject),
            Just(Shape::MessageText),
            Just(Shape::OpenAi),
            Just(Shape::Anthropic),
        ],
    )
        .prop_map(|(tools, calls, shape)| Case {
            calls: calls
                .into_iter()
                .map(|(i, v)| (i.index(tools.len()), v))
                .collect(),
            tools,
            shape,
        })
}

/// A secret (or plain) value of `kind`, for call variant `v` and argument `i`.
fn value(arg: Arg, v: u64, i: usize) -> Value {
    if !arg.secret {
        return json!(format!("plain-{v}-{i}"));
    }
    let text = format!("{CANARY}-{v}-{i}");
    match arg.kind {
        Kind::Text => json!(text),
        Kind::Escaped => json!(format!("\"q\" \\ {text}\n\u{e9}\u{1F512}")),
        Kind::Number => json!(number(v, i)),
        Kind::Array => json!([text, 1, {"x": CANARY}]),
        Kind::Nested => json!({"outer": {"inner": [text], "n": 7, "deep": {"k": CANARY}}}),
    }
}

/// A secret number: 16 digits, unique per variant and argument, within ±(2^53−1).
fn number(v: u64, i: usize) -> u64 {
    4_000_000_000_000_000 + v * 1_000 + i as u64
}

/// A tool written against the `Tool` trait, as `#[durable_tool]` would generate it,
/// that keeps every argument object it received.
struct Probe {
    spec: ToolSpec,
    received: Mutex<Vec<Value>>,
}

impl Tool for Probe {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn invoke<'a>(
        &'a self,
        journal: &'a Journal,
        args: Value,
    ) -> BoxFuture<'a, Result<ToolOutput, DurableError>> {
        Box::pin(async move {
            let mut call = journal.tool(&self.spec, args.clone());
            if self.spec.class == ReplayClass::IdempotentWithKey {
                // From the arguments that are not secret, as `#[durable_tool]` requires.
                let plain: Vec<String> = args
                    .as_object()
                    .into_iter()
                    .flatten()
                    .filter(|(name, _)| !self.spec.secret_args.contains(name))
                    .map(|(name, v)| format!("{name}={v}"))
                    .collect();
                call = call.key(format!("{}:{}", self.spec.name, plain.join(",")));
            }
            let result: Result<Value, CallError<String>> = call
                .run(|_ctx| {
                    self.received
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(args.clone());
                    async { Ok(json!("ok")) }
                })
                .await;
            durable::__private::tool_output(&self.spec, result)
        })
    }
}

static TOOLS: AtomicUsize = AtomicUsize::new(0);

/// Runs the property on `cases` generated cases (fixed seed, shrinking on failure).
pub fn run(cases: u32) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let config = Config {
        cases,
        rng_algorithm: RngAlgorithm::ChaCha,
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner = TestRunner::new_with_rng(
        config,
        TestRng::from_seed(RngAlgorithm::ChaCha, &[0x5e; 32]),
    );
    if let Err(failure) = runner.run(&case(), |case| rt.block_on(check(&case))) {
        panic!("{failure}");
    }
}

async fn check(case: &Case) -> Result<(), TestCaseError> {
    // Names are unique per case: tools of one name share their secret arguments.
    let probes: Vec<Arc<Probe>> = case
        .tools
        .iter()
        .map(|(class, args)| {
            let name = format!("probe_{}", TOOLS.fetch_add(1, Ordering::SeqCst));
            let mut properties: serde_json::Map<String, Value> = (0..args.len())
                .map(|i| (format!("a{i}"), json!({})))
                .collect();
            properties.insert("id".into(), json!({"type": "integer"}));
            let secrets = args
                .iter()
                .enumerate()
                .filter(|(_, a)| a.secret)
                .map(|(i, _)| format!("a{i}"));
            let spec = ToolSpec::new(
                name,
                "A probe.",
                *class,
                json!({"type": "object", "properties": properties}),
            )
            .with_secret_args(secrets);
            Arc::new(Probe {
                spec,
                received: Mutex::new(Vec::new()),
            })
        })
        .collect();
    let mut tools = Toolbox::new();
    for probe in &probes {
        tools
            .register_arc(Arc::clone(probe) as Arc<dyn Tool>)
            .expect("register");
    }
    let mut sent = Vec::new();
    let mut needles = vec![CANARY.to_owned()];
    let calls: Vec<(String, String, Value)> = case
        .calls
        .iter()
        .enumerate()
        .map(|(n, &(t, v))| {
            let (_, args) = &case.tools[t];
            let mut object: serde_json::Map<String, Value> = args
                .iter()
                .enumerate()
                .map(|(i, &arg)| {
                    if arg.secret && matches!(arg.kind, Kind::Number) {
                        needles.push(number(v, i).to_string());
                    }
                    (format!("a{i}"), value(arg, v, i))
                })
                .collect();
            // What a keyed tool derives its key from (never from a secret).
            object.insert("id".into(), json!(v));
            sent.push((t, Value::Object(object.clone())));
            (
                format!("call_{n}"),
                probes[t].spec.name.clone(),
                Value::Object(object),
            )
        })
        .collect();
    let reply = reply(case.shape, &calls);

    let store: Arc<dyn CheckpointStore> =
        Arc::new(SqliteStore::open_in_memory().await.expect("store"));
    let runtime = |owner: &str| {
        Durable::builder(Arc::clone(&store))
            .owner(owner)
            .renew_leases(false)
            .build()
    };
    let mut session = runtime("w1")
        .start::<Value>(StartOptions::default())
        .await
        .expect("start");
    let id = session.id().clone();
    let got: Value = session
        .model(|| async { Ok::<_, String>(reply.clone()) })
        .await
        .expect("model");
    let first_calls = model_calls(case.shape, &got);
    prop_assert_eq!(first_calls.len(), calls.len());
    let mut results = Vec::new();
    for outcome in tools.dispatch_all(session.journal(), &first_calls).await {
        match outcome {
            Ok(result) => results.push(result),
            Err(e) => return Err(TestCaseError::fail(format!("dispatch failed: {e}"))),
        }
    }
    // Every tool received exactly the clear values the model sent.
    for (t, probe) in probes.iter().enumerate() {
        let mut want: Vec<String> = sent
            .iter()
            .filter(|(i, _)| *i == t)
            .map(|(_, v)| v.to_string())
            .collect();
        let mut got: Vec<String> = probe
            .received
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(Value::to_string)
            .collect();
        want.sort();
        got.sort();
        prop_assert_eq!(got, want);
    }
    session.push(got.clone());
    session.push(serde_json::to_value(ToolResult::message(&results)).expect("results"));
    let runs = total_runs(&probes);

    // A crash before the checkpoint; the resumed turn gets the masked reply back, and
    // every call returns its recorded result without the secret: nothing runs again.
    session.release().await.expect("release");
    let resumed = runtime("w2").resume::<Value>(&id).await.expect("resume");
    let mut session = resumed.session;
    let again: Value = session
        .model(|| async { Err::<Value, _>("the model must not be asked again".to_owned()) })
        .await
        .expect("journaled reply");
    prop_assert_eq!(&again, &got);
    let mut replayed = Vec::new();
    for outcome in tools
        .dispatch_all(session.journal(), &model_calls(case.shape, &again))
        .await
    {
        match outcome {
            Ok(result) => replayed.push(result),
            Err(e) => return Err(TestCaseError::fail(format!("replay failed: {e}"))),
        }
    }
    prop_assert_eq!(&replayed, &results);
    prop_assert_eq!(total_runs(&probes), runs);
    session.push(again);
    session.push(serde_json::to_value(ToolResult::message(&replayed)).expect("results"));
    session.checkpoint().await.expect("checkpoint");

    let rows = store.calls(&id, None).await.expect("rows");
    let exported = durable::replay_check::export_session(store.as_ref(), &id)
        .await
        .expect("export");
    let mut written =
        serde_json::to_string(&rows.iter().map(row_json).collect::<Vec<_>>()).expect("rows JSON");
    for fixture in &exported.fixtures {
        written.push_str(&fixture.to_json_pretty().expect("fixture"));
    }
    written.push_str(&serde_json::to_string(session.messages()).expect("messages"));
    for needle in &needles {
        prop_assert!(
            !written.contains(needle.as_str()),
            "`{}` was written: {}",
            needle,
            written
        );
    }
    Ok(())
}

fn total_runs(probes: &[Arc<Probe>]) -> usize {
    probes
        .iter()
        .map(|p| {
            p.received
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .len()
        })
        .sum()
}

fn row_json(row: &durable::store::CallRecord) -> Value {
    json!({
        "tool": row.identity.tool, "hash": row.identity.input_hash, "args": row.args,
        "key": row.idempotency_key, "result": row.result, "error": row.error,
    })
}

fn reply(shape: Shape, calls: &[(String, String, Value)]) -> Value {
    match shape {
        Shape::MessageObject | Shape::MessageText => {
            let mut blocks = vec![Block::text("calling")];
            for (id, name, args) in calls {
                let args = match shape {
                    Shape::MessageText => json!(args.to_string()),
                    _ => args.clone(),
                };
                blocks.push(Block::tool_call(id.clone(), name.clone(), args));
            }
            serde_json::to_value(Message::assistant(blocks)).expect("message")
        }
        Shape::OpenAi => json!({
            "role": "assistant",
            "tool_calls": calls.iter().map(|(id, name, args)| json!({
                "id": id, "type": "function",
                "function": {"name": name, "arguments": args.to_string()},
            })).collect::<Vec<_>>(),
        }),
        Shape::Anthropic => json!({
            "role": "assistant",
            "content": calls.iter().map(|(id, name, args)| json!({
                "type": "tool_use", "id": id, "name": name, "input": args,
            })).collect::<Vec<_>>(),
        }),
    }
}

fn model_calls(shape: Shape, reply: &Value) -> Vec<ModelToolCall> {
    match shape {
        Shape::MessageObject | Shape::MessageText => {
            let message: Message = serde_json::from_value(reply.clone()).expect("a message");
            ModelToolCall::from_message(&message)
        }
        Shape::OpenAi => reply["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(ModelToolCall::from_openai)
            .collect(),
        Shape::Anthropic => reply["content"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(ModelToolCall::from_anthropic)
            .collect(),
    }
}
