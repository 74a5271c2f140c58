//! The toolbox on the SQLite store: model tool calls are validated before anything is
//! journaled, `null` for an optional argument is accepted, a turn's parallel calls run
//! concurrently with identities that follow the model's order, and a re-run turn returns
//! the recorded results without running the tool again.
//!
//! The tool is written by hand against the `Tool` trait (what `#[durable_tool]`
//! generates), so these tests exercise the toolbox alone.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use durable_core::schema;
use durable_core::store::CallRecord;
use durable_core::toolbox::{ModelToolCall, ToolArguments, ToolResult, Toolbox};
use durable_core::transcript::{Block, Message, Role};
use durable_core::{
    ArgLimits, ArgumentErrorKind, CallError, CheckpointStore, Durable, DurableError, Journal,
    ReplayClass, Session, SessionId, StartOptions, Tool, ToolOutput, ToolSpec,
};
use durable_sqlite::SqliteStore;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::{Barrier, watch};

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Arguments of `lookup`.
#[derive(Debug, Deserialize, JsonSchema)]
struct LookupArgs {
    /// The document key.
    key: String,
    /// Most entries to return.
    #[serde(default = "default_limit")]
    limit: u32,
    /// Free-form note.
    note: Option<String>,
}

fn default_limit() -> u32 {
    10
}

/// A pure tool that counts its executions and logs the order in which calls finish.
///
/// Built with `reversed: Some(n)`, it expects `n` concurrent calls: each body first waits
/// until all `n` are running at once (a barrier: calls run one after another would never
/// get past it), then finishes only after every higher ordinal has, so the calls finish
/// in reverse order on any machine, however it schedules them.
struct Lookup {
    spec: ToolSpec,
    runs: AtomicUsize,
    finished: Mutex<Vec<i64>>,
    reversed: Option<Reversed>,
}

struct Reversed {
    all_running: Barrier,
    /// How many calls have finished.
    done: watch::Sender<i64>,
    calls: i64,
}

impl Lookup {
    fn new(reversed: Option<usize>) -> Arc<Self> {
        Arc::new(Lookup {
            spec: ToolSpec::new(
                "lookup",
                "Look up a document.",
                ReplayClass::Pure,
                schema::schema_for::<LookupArgs>(),
            ),
            runs: AtomicUsize::new(0),
            finished: Mutex::new(Vec::new()),
            reversed: reversed.map(|n| Reversed {
                all_running: Barrier::new(n),
                done: watch::Sender::new(0),
                calls: i64::try_from(n).expect("a small number of calls"),
            }),
        })
    }

    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }
}

/// The registered handle (the test keeps the other one to read the counters).
struct LookupTool(Arc<Lookup>);

impl Tool for LookupTool {
    fn spec(&self) -> &ToolSpec {
        &self.0.spec
    }

    fn invoke<'a>(
        &'a self,
        journal: &'a Journal,
        args: Value,
    ) -> BoxFuture<'a, Result<ToolOutput, DurableError>> {
        Box::pin(async move {
            let spec = &self.0.spec;
            let typed: LookupArgs = serde_path_to_error::deserialize(&args).map_err(|e| {
                DurableError::ArgumentsMismatch {
                    tool: spec.name.clone(),
                    path: format!("$.{}", e.path()),
                    message: e.inner().to_string(),
                }
            })?;
            let this = Arc::clone(&self.0);
            let result = journal
                .tool(spec, args)
                .run(move |ctx| {
                    let this = Arc::clone(&this);
                    let key = typed.key.clone();
                    let note = typed.note.clone();
                    let limit = typed.limit;
                    async move {
                        this.runs.fetch_add(1, Ordering::SeqCst);
                        let ordinal = ctx.identity().ordinal;
                        if let Some(r) = &this.reversed {
                            r.all_running.wait().await;
                            // Ordinal n-1 goes first, then n-2, … then 0.
                            let mut done = r.done.subscribe();
                            done.wait_for(|d| *d == r.calls - 1 - ordinal)
                                .await
                                .expect("the sender lives in `this`");
                            this.finished.lock().expect("finish log").push(ordinal);
                            r.done.send_modify(|d| *d += 1);
                        } else {
                            this.finished.lock().expect("finish log").push(ordinal);
                        }
                        Ok::<_, std::io::Error>(json!({
                            "key": key, "limit": limit, "note": note, "ordinal": ordinal,
                        }))
                    }
                })
                .await;
            match result {
                Ok(content) => Ok(ToolOutput {
                    content,
                    is_error: false,
                }),
                Err(CallError::Durable(e)) => Err(e),
                Err(other) => Ok(ToolOutput {
                    content: json!({ "error": other.to_string() }),
                    is_error: true,
                }),
            }
        })
    }
}

async fn store() -> Arc<dyn CheckpointStore> {
    Arc::new(
        SqliteStore::open_in_memory()
            .await
            .expect("in-memory store"),
    )
}

fn runtime(store: &Arc<dyn CheckpointStore>, owner: &str) -> Durable {
    Durable::builder(Arc::clone(store))
        .owner(owner)
        .renew_leases(false)
        .build()
}

async fn start(store: &Arc<dyn CheckpointStore>) -> Session<Message> {
    runtime(store, "worker-1")
        .start::<Message>(StartOptions::default())
        .await
        .expect("start")
}

async fn rows(store: &Arc<dyn CheckpointStore>, id: &SessionId) -> Vec<CallRecord> {
    store.calls(id, None).await.expect("calls")
}

fn toolbox(tool: &Arc<Lookup>) -> Toolbox {
    Toolbox::new()
        .with(LookupTool(Arc::clone(tool)))
        .expect("register")
}

fn call(id: &str, arguments: impl Into<ToolArguments>) -> ModelToolCall {
    ModelToolCall::new(id, "lookup", arguments)
}

#[tokio::test]
async fn an_unknown_tool_runs_nothing_and_journals_nothing() {
    let store = store().await;
    let session = start(&store).await;
    let lookup = Lookup::new(None);
    let tools = toolbox(&lookup);

    let asked = ModelToolCall::new("call_1", "delete_everything", r#"{"really": true}"#);
    let err = tools
        .dispatch(session.journal(), &asked)
        .await
        .expect_err("unknown tool");
    match &err {
        DurableError::UnknownTool { name, available } => {
            assert_eq!(name, "delete_everything");
            assert_eq!(available, "lookup");
        }
        other => panic!("expected UnknownTool, got {other:?}"),
    }
    assert!(rows(&store, session.id()).await.is_empty());
    assert_eq!(lookup.runs(), 0);

    // The model is told, so it can pick a real tool.
    let answer = ToolResult::refused(&asked, &err).expect("a model error");
    assert!(answer.is_error());
    assert_eq!(answer.call_id, "call_1");
    assert!(
        answer
            .content_text()
            .contains("unknown tool `delete_everything`")
    );
}

#[tokio::test]
async fn invalid_arguments_are_typed_errors_and_journal_nothing() {
    let store = store().await;
    let session = start(&store).await;
    let lookup = Lookup::new(None);
    let tools = toolbox(&lookup).limits(ArgLimits::default().with_max_depth(8));
    let deep = format!(
        r#"{{"key": "a", "note": {}1{}}}"#,
        "[".repeat(20),
        "]".repeat(20)
    );
    let big = ToolArguments::Json(json!({"key": "a", "limit": u64::MAX}));
    // (arguments, expected path if pinned, expected kind)
    type Case<'a> = (
        ToolArguments,
        Option<&'a str>,
        fn(&ArgumentErrorKind) -> bool,
    );
    let cases: Vec<Case> = vec![
        (r#"{"key": "a""#.into(), None, |k| {
            matches!(k, ArgumentErrorKind::Syntax(_))
        }),
        (
            r#"{"key": "a", "k\u0065y": "b"}"#.into(),
            Some("$.key"),
            |k| *k == ArgumentErrorKind::DuplicateKey("key".into()),
        ),
        (
            r#"{"key": "a", "limit": NaN}"#.into(),
            Some("$.limit"),
            |k| *k == ArgumentErrorKind::NonFinite,
        ),
        (
            deep.as_str().into(),
            Some("$.note[0][0][0][0][0][0][0]"),
            |k| *k == ArgumentErrorKind::TooDeep { limit: 8 },
        ),
        (r#"["a"]"#.into(), Some("$"), |k| {
            *k == ArgumentErrorKind::NotAnObject("an array")
        }),
        (ToolArguments::Json(json!("not text")), Some("$"), |k| {
            *k == ArgumentErrorKind::NotAnObject("a string")
        }),
        (ToolArguments::Json(json!([1])), Some("$"), |k| {
            *k == ArgumentErrorKind::NotAnObject("an array")
        }),
        (big, Some("$.limit"), |k| {
            matches!(k, ArgumentErrorKind::IntegerOutOfRange(_))
        }),
    ];
    for (arguments, path, kind) in cases {
        let shown = format!("{arguments:?}");
        let err = tools
            .dispatch(session.journal(), &call("c", arguments))
            .await
            .expect_err("invalid arguments");
        let DurableError::InvalidArguments { tool, source } = &err else {
            panic!("{shown}: expected InvalidArguments, got {err:?}");
        };
        assert_eq!(tool, "lookup");
        if let Some(path) = path {
            assert_eq!(source.path, path, "{shown}");
        }
        assert!(kind(&source.kind), "{shown}: {:?}", source.kind);
        assert!(ToolResult::refused(&call("c", "{}"), &err).is_some());
    }

    // Valid JSON of the wrong shape: refused by the tool, with the field's path.
    let err = tools
        .dispatch(session.journal(), &call("c", r#"{"key": 5}"#))
        .await
        .expect_err("mismatch");
    let DurableError::ArgumentsMismatch { tool, path, .. } = &err else {
        panic!("expected ArgumentsMismatch, got {err:?}");
    };
    assert_eq!((tool.as_str(), path.as_str()), ("lookup", "$.key"));

    assert!(rows(&store, session.id()).await.is_empty());
    assert_eq!(lookup.runs(), 0);
}

#[tokio::test]
async fn null_for_an_optional_argument_is_accepted() {
    let store = store().await;
    let session = start(&store).await;
    let lookup = Lookup::new(None);
    let tools = toolbox(&lookup);

    // What a strict-mode model sends: every field, `null` where it means "not given".
    let strict = tools
        .dispatch(
            session.journal(),
            &call("c1", r#"{"key": "a", "limit": null, "note": null}"#),
        )
        .await
        .expect("strict-mode call");
    assert_eq!(strict.call_id, "c1");
    assert_eq!(strict.name, "lookup");
    assert_eq!(
        strict.output.content,
        json!({"key": "a", "limit": 10, "note": null, "ordinal": 0})
    );
    // What Anthropic sends for the same call: the fields left out.
    let anthropic = tools
        .dispatch(
            session.journal(),
            &call("c2", ToolArguments::Json(json!({"key": "a"}))),
        )
        .await
        .expect("anthropic call");
    assert_eq!(anthropic.output.content["limit"], 10);

    // Both are the same call: same arguments, same hash (the second is ordinal 1).
    let rows = rows(&store, session.id()).await;
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0].args, json!({"key": "a"}));
    assert_eq!(rows[0].args, rows[1].args);
    assert_eq!(rows[0].identity.input_hash, rows[1].identity.input_hash);
    let mut ordinals: Vec<i64> = rows.iter().map(|r| r.identity.ordinal).collect();
    ordinals.sort_unstable();
    assert_eq!(ordinals, [0, 1]);
}

#[tokio::test]
async fn parallel_calls_get_ordinals_in_the_models_order() {
    let store = store().await;
    let session = start(&store).await;
    let lookup = Lookup::new(Some(5));
    let tools = toolbox(&lookup);

    let calls: Vec<ModelToolCall> = (0..5)
        .map(|i| call(&format!("call_{i}"), r#"{"key": "same"}"#))
        .collect();
    // Calls dispatched one after another would wait at the barrier for ever.
    let results = tokio::time::timeout(
        Duration::from_secs(60),
        tools.dispatch_all(session.journal(), &calls),
    )
    .await
    .expect("the five calls must run concurrently");

    // Each body waited for the higher ordinals: they ran at once and finished in reverse.
    assert_eq!(*lookup.finished.lock().expect("log"), [4, 3, 2, 1, 0]);
    assert_eq!(lookup.runs(), 5);
    // Yet results come back in the model's order, and call i holds ordinal i.
    for (i, result) in results.into_iter().enumerate() {
        let result = result.expect("dispatch");
        assert_eq!(result.call_id, format!("call_{i}"));
        assert_eq!(result.output.content["ordinal"], json!(i));
    }
    let rows = rows(&store, session.id()).await;
    let mut ordinals: Vec<i64> = rows.iter().map(|r| r.identity.ordinal).collect();
    ordinals.sort_unstable();
    assert_eq!(ordinals, [0, 1, 2, 3, 4]);
    for row in &rows {
        assert_eq!(
            row.result.as_ref().map(|r| r["ordinal"].clone()),
            Some(json!(row.identity.ordinal))
        );
    }
}

#[tokio::test]
async fn one_bad_call_does_not_stop_the_others() {
    let store = store().await;
    let session = start(&store).await;
    let lookup = Lookup::new(None);
    let tools = toolbox(&lookup);

    let calls = [
        call("a", r#"{"key": "x"}"#),
        ModelToolCall::new("b", "nope", "{}"),
        call("c", r#"{"key": "x", "key": "y"}"#),
        call("d", r#"{"key": "x"}"#),
    ];
    let results = tools.dispatch_all(session.journal(), &calls).await;
    assert_eq!(results.len(), 4);
    assert_eq!(results[0].as_ref().expect("a").output.content["ordinal"], 0);
    assert!(matches!(results[1], Err(DurableError::UnknownTool { .. })));
    assert!(matches!(
        results[2],
        Err(DurableError::InvalidArguments { .. })
    ));
    assert_eq!(results[3].as_ref().expect("d").output.content["ordinal"], 1);
    assert_eq!(rows(&store, session.id()).await.len(), 2);
}

#[tokio::test]
async fn a_rerun_turn_returns_the_recorded_results_without_running_the_tool() {
    let store = store().await;
    let mut session = start(&store).await;
    let lookup = Lookup::new(None);
    let tools = toolbox(&lookup);

    // The model's reply, journaled, asks for three calls (two identical).
    let reply = Message::assistant(vec![
        Block::text("Looking these up."),
        Block::tool_call("call_1", "lookup", json!(r#"{"key": "a", "note": null}"#)),
        Block::tool_call("call_2", "lookup", json!({"key": "b", "limit": 3})),
        Block::tool_call("call_3", "lookup", json!({"key": "a"})),
    ]);
    let first_reply: Message = session
        .model(|| async { Ok::<_, std::io::Error>(reply.clone()) })
        .await
        .expect("model");
    let calls = ModelToolCall::from_message(&first_reply);
    assert_eq!(calls.len(), 3);
    let first: Vec<ToolResult> = tools
        .dispatch_all(session.journal(), &calls)
        .await
        .into_iter()
        .map(|r| r.expect("dispatch"))
        .collect();
    assert_eq!(lookup.runs(), 3);
    assert_eq!(first[0].output.content["ordinal"], 0);
    assert_eq!(first[2].output.content["ordinal"], 1);
    session.push(first_reply);
    session.push(ToolResult::message(&first));
    // Crash before the checkpoint: the turn will be re-run.
    let id = session.id().clone();
    session.release().await.expect("release");
    let recorded = rows(&store, &id).await;

    let resumed = runtime(&store, "worker-2")
        .resume::<Message>(&id)
        .await
        .expect("resume");
    let session = resumed.session;
    // The re-run asks the model again and gets the journaled reply back.
    let again_reply: Message = session
        .model(|| async {
            Err::<Message, _>(std::io::Error::other("the model must not be asked again"))
        })
        .await
        .expect("journaled reply");
    let calls = ModelToolCall::from_message(&again_reply);
    let again: Vec<ToolResult> = tools
        .dispatch_all(session.journal(), &calls)
        .await
        .into_iter()
        .map(|r| r.expect("replayed dispatch"))
        .collect();

    assert_eq!(again, first);
    assert_eq!(lookup.runs(), 3, "nothing ran again");
    assert_eq!(rows(&store, &id).await.len(), recorded.len());

    let message = ToolResult::message(&again);
    assert_eq!(message.role, Role::Tool);
    assert_eq!(
        message
            .tool_results()
            .map(|r| r.call_id.as_str())
            .collect::<Vec<_>>(),
        ["call_1", "call_2", "call_3"]
    );
}

/// A turn's parallel calls dispatched inside `checkpoint_after`: the first claims the
/// scope; the others are refused before anything is journaled or run.
#[tokio::test]
async fn only_one_dispatched_call_belongs_to_a_checkpoint_scope() {
    let store = store().await;
    let mut session = start(&store).await;
    let lookup = Lookup::new(None);
    let tools = toolbox(&lookup);
    let calls: Vec<ModelToolCall> = (0..3)
        .map(|i| call(&format!("call_{i}"), format!(r#"{{"key": "k{i}"}}"#)))
        .collect();
    let mut results = Vec::new();
    session
        .checkpoint_after(
            async |journal| {
                results = tools.dispatch_all(journal, &calls).await;
                Ok::<_, CallError<String>>(())
            },
            |outcome| Message::tool_outcome("call_0", outcome),
        )
        .await
        .expect("the scope");
    assert!(results[0].is_ok(), "{:?}", results[0]);
    for refused in &results[1..] {
        assert!(
            matches!(refused, Err(DurableError::OneCallPerCheckpoint { tool, .. }) if tool == "lookup"),
            "{refused:?}"
        );
    }
    assert_eq!(lookup.runs(), 1);
    assert_eq!(rows(&store, session.id()).await.len(), 1);
    assert_eq!(session.version(), 1);
    let last = session.messages().last().expect("the result message");
    let result = last.tool_results().next().expect("a tool result");
    assert_eq!(result.call_id, "call_0");
    assert_eq!(result.content["key"], "k0");
}
