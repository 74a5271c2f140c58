//! `#[durable_tool]` end to end on the `SQLite` store: typed calls journal and replay,
//! model-style `invoke` validates arguments before anything is journaled, the key closure
//! reaches the body (as its `IdempotencyKey` parameter: derived first, recorded on a
//! re-execution), the verify hook decides in-doubt unsafe calls, secrets are masked.
//!
//! Each test has its own tools, so their execution counters do not interfere when tests
//! run in parallel.

#![warn(clippy::pedantic)]

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use durable::error::SchemaErrorKind;
use durable::sqlite::SqliteStore;
use durable::store::CallStatus;
use durable::{
    CallError, CheckpointStore, Durable, DurableError, IdempotencyKey, Message, ReplayClass,
    RetryPolicy, Session, SessionId, StartOptions, Tool, ToolContext, Toolbox, Verification,
    durable_tool,
};
use serde::{Deserialize, Serialize};
use serde_json::json;

#[derive(Debug)]
struct Failure(String);

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Receipt {
    id: String,
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

async fn start(store: &Arc<dyn CheckpointStore>) -> Session {
    runtime(store, "worker-1")
        .start::<Message>(StartOptions::default())
        .await
        .expect("start")
}

/// Releases the lease and resumes the same session as another worker: the turn is re-run
/// from the same checkpoint, as after a crash.
async fn crash_and_resume(
    store: &Arc<dyn CheckpointStore>,
    session: Session,
) -> durable::Resumed<Message> {
    let id = session.id().clone();
    session.release().await.expect("release");
    runtime(store, "worker-2")
        .resume(&id)
        .await
        .expect("resume")
}

async fn rows(store: &Arc<dyn CheckpointStore>, id: &SessionId) -> Vec<durable::store::CallRecord> {
    store.calls(id, None).await.expect("calls")
}

// ---------------------------------------------------------------------------------------

static LOOKUPS: AtomicUsize = AtomicUsize::new(0);

/// Look up a document by id.
#[durable_tool(replay = "pure", retry = RetryPolicy::default().with_max_attempts(1))]
async fn lookup(
    /// The document id.
    id: String,
    /// A revision; the latest when absent.
    revision: Option<u32>,
) -> Result<String, Failure> {
    LOOKUPS.fetch_add(1, Ordering::SeqCst);
    if id == "missing" {
        return Err(Failure(format!("no document `{id}`")));
    }
    Ok(format!("{id}@{}", revision.unwrap_or(0)))
}

static SENT: AtomicUsize = AtomicUsize::new(0);

/// Send an email to a customer.
#[durable_tool(replay = "unsafe_on_replay")]
async fn send_mail(to: String, #[secret] body: String) -> Result<Receipt, Failure> {
    SENT.fetch_add(1, Ordering::SeqCst);
    Ok(Receipt {
        id: format!("mail to {to}, {} bytes", body.len()),
    })
}

#[tokio::test]
async fn typed_calls_journal_and_replay_without_running_again() {
    let store = store().await;
    let session = start(&store).await;
    let id = session.id().clone();

    let doc = lookup
        .call(session.journal(), "a".into(), Some(2))
        .await
        .expect("lookup");
    assert_eq!(doc, "a@2");
    let receipt = send_mail
        .call(session.journal(), "ann@example.com".into(), "hello".into())
        .await
        .expect("send");
    let failed = lookup.call(session.journal(), "missing".into(), None).await;
    assert!(
        matches!(failed, Err(CallError::Tool(Failure(_)))),
        "{failed:?}"
    );
    assert_eq!(
        (LOOKUPS.load(Ordering::SeqCst), SENT.load(Ordering::SeqCst)),
        (2, 1)
    );

    // The secret argument is stored masked, the other in clear.
    let recorded = rows(&store, &id).await;
    let mail = recorded
        .iter()
        .find(|r| r.identity.tool == "send_mail")
        .expect("send_mail row");
    assert_eq!(mail.args["to"], "ann@example.com");
    assert!(mail.args["body"].get("$secret").is_some(), "{}", mail.args);

    // The same turn re-run by another worker: recorded results, nothing runs.
    let resumed = crash_and_resume(&store, session).await;
    let journal = resumed.session.journal();
    assert_eq!(
        lookup
            .call(journal, "a".into(), Some(2))
            .await
            .expect("replayed"),
        "a@2"
    );
    let replayed = send_mail
        .call(journal, "ann@example.com".into(), "hello".into())
        .await
        .expect("replayed send");
    assert_eq!(replayed, receipt);
    match lookup.call(journal, "missing".into(), None).await {
        Err(CallError::Recorded(failure)) => assert_eq!(failure.message, "no document `missing`"),
        other => panic!("expected the recorded failure, got {other:?}"),
    }
    assert_eq!(
        (LOOKUPS.load(Ordering::SeqCst), SENT.load(Ordering::SeqCst)),
        (2, 1)
    );
}

// ---------------------------------------------------------------------------------------

static SEARCHES: AtomicUsize = AtomicUsize::new(0);

/// Search the catalogue.
#[durable_tool(replay = "pure", name = "catalogue_search")]
async fn search(
    /// Words to look for.
    query: String,
    /// At most this many hits.
    limit: Option<u32>,
) -> Result<Vec<String>, Failure> {
    SEARCHES.fetch_add(1, Ordering::SeqCst);
    Ok((0..limit.unwrap_or(2))
        .map(|i| format!("{query}#{i}"))
        .collect())
}

#[tokio::test]
async fn invoke_validates_arguments_before_journaling() {
    let store = store().await;
    let session = start(&store).await;
    let journal = session.journal();

    for (args, path) in [
        (json!({"query": 5}), "$.query"),
        (json!({"limit": 1}), "$"),
        (json!({"query": "x", "limit": "many"}), "$.limit"),
        (json!({"query": "x", "sort": "asc"}), "$.sort"),
        (json!(["x"]), "$"),
    ] {
        match search.invoke(journal, args.clone()).await {
            Err(DurableError::ArgumentsMismatch {
                tool,
                path: found,
                message,
            }) => {
                assert_eq!(tool, "catalogue_search");
                assert_eq!(found, path, "{args}: {message}");
            }
            other => panic!("{args}: expected ArgumentsMismatch, got {other:?}"),
        }
    }
    assert_eq!(SEARCHES.load(Ordering::SeqCst), 0);
    assert!(
        rows(&store, session.id()).await.is_empty(),
        "nothing journaled"
    );

    // `null` for an optional argument is accepted, like a missing one.
    let output = search
        .invoke(journal, json!({"query": "tea", "limit": null}))
        .await
        .expect("invoke");
    assert!(!output.is_error);
    assert_eq!(output.content, json!(["tea#0", "tea#1"]));
    assert_eq!(SEARCHES.load(Ordering::SeqCst), 1);
}

// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Charge {
    key: String,
    cents: u64,
}

/// Charge a card; the provider honours idempotency keys.
#[durable_tool(
    replay = "idempotent_with_key",
    idempotency_key = |a, session| format!("{session}:charge:{}", a.order_id),
)]
async fn charge_card(key: IdempotencyKey, order_id: String, cents: u64) -> Result<Charge, Failure> {
    if cents == 0 {
        return Err(Failure(format!("order {order_id}: nothing to charge")));
    }
    Ok(Charge {
        key: key.into_string(),
        cents,
    })
}

#[tokio::test]
async fn the_key_closure_reaches_the_body_and_the_journal() {
    let store = store().await;
    let session = start(&store).await;
    let expected = format!("{}:charge:o-17", session.id());

    let charge = charge_card
        .call(session.journal(), "o-17".into(), 1200)
        .await
        .expect("charge");
    assert_eq!(charge.key, expected);

    let output = charge_card
        .invoke(session.journal(), json!({"order_id": "o-18", "cents": 0}))
        .await
        .expect("a tool failure is an output, not an error");
    assert!(output.is_error);
    assert_eq!(
        output.content,
        json!({"error": "order o-18: nothing to charge"})
    );

    let keys: Vec<_> = rows(&store, session.id())
        .await
        .into_iter()
        .map(|r| r.idempotency_key)
        .collect();
    assert!(keys.contains(&Some(expected)), "{keys:?}");
}

// ---------------------------------------------------------------------------------------

static OUTBOX: Mutex<Vec<String>> = Mutex::new(Vec::new());
static NOTIFY_RUNS: AtomicUsize = AtomicUsize::new(0);
static VERIFY_RUNS: AtomicUsize = AtomicUsize::new(0);
static STARTED: AtomicBool = AtomicBool::new(false);

/// Notify a customer (hangs after sending when `hang` is set, like a crash before the
/// result is recorded).
#[durable_tool(replay = "unsafe_on_replay", verify = notification_was_sent)]
async fn notify_customer(customer: String, hang: bool) -> Result<Receipt, Failure> {
    NOTIFY_RUNS.fetch_add(1, Ordering::SeqCst);
    OUTBOX.lock().expect("outbox").push(customer.clone());
    if hang {
        STARTED.store(true, Ordering::SeqCst);
        std::future::pending::<()>().await;
    }
    Ok(Receipt {
        id: format!("sent to {customer}"),
    })
}

/// Looks in the outbox: the verify hook of `notify_customer`.
#[allow(clippy::unused_async)] // verify hooks are async; this one needs no I/O
async fn notification_was_sent(
    ctx: &ToolContext,
    args: &NotifyCustomerArgs,
) -> Verification<Receipt> {
    VERIFY_RUNS.fetch_add(1, Ordering::SeqCst);
    assert_eq!(ctx.replay_class(), ReplayClass::UnsafeOnReplay);
    if OUTBOX.lock().expect("outbox").contains(&args.customer) {
        Verification::Happened(Receipt {
            id: format!("found in outbox: {}", args.customer),
        })
    } else {
        Verification::DidNotHappen
    }
}

#[tokio::test]
async fn the_verify_hook_decides_an_in_doubt_unsafe_call() {
    let store = store().await;
    let session = start(&store).await;
    let id = session.id().clone();

    // Issue the call and lose the worker while the effect is done but unrecorded.
    let journal = session.journal().clone();
    let task = tokio::spawn(async move { notify_customer.call(&journal, "bo".into(), true).await });
    while !STARTED.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    task.abort();
    assert!(task.await.is_err(), "the call was cut off");
    assert_eq!(rows(&store, &id).await[0].status, CallStatus::Issued);

    let resumed = crash_and_resume(&store, session).await;
    assert!(resumed.report.needs_attention());
    assert_eq!(resumed.report.in_doubt.len(), 1);

    // Same call on resume: the hook finds the effect, its answer becomes the result.
    let receipt = notify_customer
        .call(resumed.session.journal(), "bo".into(), true)
        .await
        .expect("verified");
    assert_eq!(receipt.id, "found in outbox: bo");
    assert_eq!(
        (
            NOTIFY_RUNS.load(Ordering::SeqCst),
            VERIFY_RUNS.load(Ordering::SeqCst)
        ),
        (1, 1)
    );
    let row = rows(&store, &id).await.remove(0);
    assert_eq!(row.status, CallStatus::Completed);
    assert_eq!(row.result, Some(json!({"id": "found in outbox: bo"})));
    assert!(notify_customer::spec().has_verify);
}

// ---------------------------------------------------------------------------------------

/// Arguments of [`find_flights`], written by hand (the struct-argument form).
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
struct FlightQuery {
    /// IATA code of the departure airport.
    from: String,
    /// IATA code of the arrival airport.
    to: String,
}

/// Find flights between two airports.
#[durable_tool(replay = "pure")]
async fn find_flights(
    ctx: &ToolContext,
    #[args] query: FlightQuery,
) -> std::io::Result<Vec<String>> {
    Ok(vec![format!(
        "{}→{} (attempt {})",
        query.from,
        query.to,
        ctx.attempt()
    )])
}

static SHOUTS: AtomicUsize = AtomicUsize::new(0);

/// Upper-case a word.
#[durable_tool(replay = "pure")]
async fn shout(word: String) -> Result<String, Failure> {
    SHOUTS.fetch_add(1, Ordering::SeqCst);
    Ok(word.to_uppercase())
}

#[tokio::test]
async fn specs_schemas_and_the_escape_hatch() {
    let spec = lookup::spec();
    assert_eq!(spec.name, "lookup");
    assert_eq!(spec.description, "Look up a document by id.");
    assert_eq!(spec.class, ReplayClass::Pure);
    assert_eq!(spec.retry.as_ref().map(|r| r.max_attempts), Some(1));
    assert!(spec.secret_args.is_empty() && !spec.has_verify);
    assert_eq!(
        spec.input_schema,
        json!({
            "type": "object",
            "properties": {
                "id": {"type": "string", "description": "The document id."},
                "revision": {
                    "type": ["integer", "null"],
                    "format": "uint32",
                    "minimum": 0,
                    "description": "A revision; the latest when absent."
                }
            },
            "required": ["id"],
            "additionalProperties": false
        })
    );
    assert_eq!(
        spec.fingerprint,
        durable_core::canonical::schema_fingerprint(&spec.input_schema)
    );
    assert!(std::ptr::eq(spec, Tool::spec(&lookup)), "built once");
    assert_eq!(send_mail::spec().secret_args, ["body"]);
    assert_eq!(search::spec().name, "catalogue_search");

    let flights = find_flights::spec();
    assert_eq!(
        flights.input_schema["properties"]["from"]["description"],
        "IATA code of the departure airport."
    );
    assert_eq!(flights.input_schema["required"], json!(["from", "to"]));

    // The escape hatch runs the body with no journal at all.
    let loud = shout
        .dangerous_call_unjournaled("x".into())
        .await
        .expect("unjournaled");
    assert_eq!(loud, "X");
    assert_eq!(SHOUTS.load(Ordering::SeqCst), 1);
    let key = IdempotencyKey::new("k-1").expect("not empty");
    let charge = charge_card
        .dangerous_call_unjournaled(key, "o".into(), 5)
        .await
        .expect("unjournaled charge");
    assert_eq!(charge.key, "k-1");

    // Struct form, journaled, through a boxed trait object on another thread.
    let store = store().await;
    let session = start(&store).await;
    let tool: Arc<dyn Tool> = Arc::new(find_flights);
    let journal = session.journal().clone();
    let output = tokio::spawn(async move {
        tool.invoke(&journal, json!({"from": "CDG", "to": "OSL"}))
            .await
    })
    .await
    .expect("join")
    .expect("invoke");
    assert_eq!(output.content, json!(["CDG→OSL (attempt 1)"]));
}

/// Records an event with free-form properties (a `Value`: strict mode cannot say it).
#[durable_tool(replay = "pure")]
async fn track_event(name: String, properties: serde_json::Value) -> Result<bool, Failure> {
    let _ = (name, properties);
    Ok(true)
}

#[test]
fn a_tool_strict_mode_cannot_express_costs_only_itself() {
    let toolbox = Toolbox::new()
        .with(lookup)
        .and_then(|t| t.with(track_event))
        .and_then(|t| t.with(send_mail))
        .expect("register");
    for (dialect, definitions, name) in [
        ("chat", toolbox.openai_tools(), "/function/name"),
        ("responses", toolbox.openai_response_tools(), "/name"),
    ] {
        let names: Vec<_> = definitions
            .tools()
            .iter()
            .filter_map(|t| t.pointer(name).and_then(serde_json::Value::as_str))
            .collect();
        assert_eq!(names, ["lookup", "send_mail"], "{dialect}");
        let [skipped] = definitions.skipped() else {
            panic!("{dialect}: {:?}", definitions.skipped());
        };
        assert_eq!(
            (skipped.tool.as_str(), skipped.pointer.as_str()),
            ("track_event", "/properties/properties"),
            "{dialect}"
        );
        assert_eq!(skipped.kind, SchemaErrorKind::AnyValue, "{dialect}");
        assert!(
            skipped
                .to_string()
                .contains("use a typed field, or a string holding JSON"),
            "{skipped}"
        );
        assert!(definitions.all().is_err(), "{dialect}");
    }
    // The other dialects carry a free value: every tool.
    assert_eq!(toolbox.anthropic_tools().all().map(|t| t.len()), Ok(3));
    assert_eq!(toolbox.mcp_tools().all().map(|t| t.len()), Ok(3));
}

/// The replay check's hooks: `check_args` decodes like `invoke` (path of the bad field),
/// `derive_key` applies the declared key rule for keyed tools only.
#[test]
fn replay_check_hooks_decode_arguments_and_derive_keys() {
    let ok = json!({"order_id": "o-7", "cents": 120});
    assert!(charge_card.check_args(&ok).is_ok());
    let bad = json!({"order_id": "o-7", "cents": "lots"});
    match charge_card.check_args(&bad) {
        Err(DurableError::ArgumentsMismatch { path, .. }) => assert_eq!(path, "$.cents"),
        other => panic!("expected ArgumentsMismatch at $.cents, got {other:?}"),
    }
    let session = SessionId::new("s-1");
    let key = charge_card
        .derive_key(&ok, &session)
        .expect("keyed tools derive a key")
        .expect("valid arguments");
    assert_eq!(key, "s-1:charge:o-7", "the rule sees the session too");
    assert!(matches!(
        charge_card.derive_key(&bad, &session),
        Some(Err(DurableError::ArgumentsMismatch { .. }))
    ));
    assert!(
        send_mail
            .derive_key(&json!({"to": "a", "body": "b"}), &session)
            .is_none()
    );
}

static INVOICED: AtomicUsize = AtomicUsize::new(0);

/// Send an invoice.
#[durable_tool(replay = "unsafe_on_replay")]
async fn send_invoice(order: String) -> Result<Receipt, Failure> {
    INVOICED.fetch_add(1, Ordering::SeqCst);
    Ok(Receipt {
        id: format!("inv-{order}"),
    })
}

/// A generated tool's call, inside `checkpoint_after`, on a spawned task (the future is
/// `Send`): its result and the checkpoint holding its message commit together.
#[tokio::test]
async fn a_macro_tool_commits_its_result_with_the_checkpoint() {
    let store = store().await;
    let mut session = start(&store).await;
    session.push(Message::user("invoice o-1"));
    let task = tokio::spawn(async move {
        let receipt = session
            .checkpoint_after(
                async |journal| send_invoice.call(journal, "o-1".into()).await,
                |outcome| Message::tool_outcome("call_1", outcome),
            )
            .await;
        (session, receipt)
    });
    let (session, receipt) = task.await.expect("the task");
    assert_eq!(receipt.expect("sent").id, "inv-o-1");
    assert_eq!(INVOICED.load(Ordering::SeqCst), 1);
    assert_eq!(session.version(), 1);
    let saved = store
        .load_checkpoint(session.id(), None)
        .await
        .expect("load");
    let messages: Vec<Message> = saved
        .messages
        .iter()
        .map(|m| m.decode().expect("a message"))
        .collect();
    assert_eq!(
        messages,
        [
            Message::user("invoice o-1"),
            Message::tool_result("call_1", json!({"id": "inv-o-1"}), false),
        ]
    );
    let rows = store.calls(session.id(), None).await.expect("calls");
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].status, CallStatus::Completed);
}

// ---------------------------------------------------------------------------------------

/// The version of `pay_invoice`'s key rule: bumped to make today's rule derive another
/// key than the one recorded.
static PAY_KEY_VERSION: AtomicUsize = AtomicUsize::new(1);
static PAY_HANG: AtomicBool = AtomicBool::new(true);
static PAY_STARTED: AtomicBool = AtomicBool::new(false);
/// Per run of the body: the key parameter, the context's key, the attempt.
static PAY_RUNS: Mutex<Vec<(String, Option<String>, i32)>> = Mutex::new(Vec::new());

/// Pay an invoice (hangs after paying while `PAY_HANG` is set, like a crash before the
/// result is recorded).
#[durable_tool(
    replay = "idempotent_with_key",
    idempotency_key = |a| format!("pay:v{}:{}", PAY_KEY_VERSION.load(Ordering::SeqCst), a.invoice),
)]
async fn pay_invoice(
    ctx: &ToolContext,
    invoice: String,
    key: IdempotencyKey,
) -> Result<String, Failure> {
    PAY_RUNS.lock().expect("runs").push((
        key.to_string(),
        ctx.idempotency_key().map(str::to_owned),
        ctx.attempt(),
    ));
    if PAY_HANG.load(Ordering::SeqCst) {
        PAY_STARTED.store(true, Ordering::SeqCst);
        std::future::pending::<()>().await;
    }
    Ok(format!("paid {invoice} with {key}"))
}

#[tokio::test]
async fn the_key_parameter_is_the_derived_key_then_exactly_the_recorded_one() {
    let store = store().await;
    let session = start(&store).await;
    let id = session.id().clone();

    // First execution: the key the rule derives; the worker is lost before the result.
    let journal = session.journal().clone();
    let task = tokio::spawn(async move { pay_invoice.call(&journal, "i-1".into()).await });
    while !PAY_STARTED.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    task.abort();
    assert!(task.await.is_err(), "the call was cut off");
    let row = rows(&store, &id).await.remove(0);
    assert_eq!(row.status, CallStatus::Issued);
    assert_eq!(row.idempotency_key.as_deref(), Some("pay:v1:i-1"));

    // Today's rule derives another key; the in-doubt call is re-executed with the
    // recorded one, verbatim.
    PAY_KEY_VERSION.store(2, Ordering::SeqCst);
    PAY_HANG.store(false, Ordering::SeqCst);
    let derived_now = pay_invoice
        .derive_key(&json!({"invoice": "i-1"}), &id)
        .expect("keyed")
        .expect("derivable");
    assert_eq!(derived_now, "pay:v2:i-1");
    let resumed = crash_and_resume(&store, session).await;
    let paid = pay_invoice
        .call(resumed.session.journal(), "i-1".into())
        .await
        .expect("re-executed");
    assert_eq!(paid, "paid i-1 with pay:v1:i-1");
    let recorded = Some("pay:v1:i-1".to_owned());
    assert_eq!(
        *PAY_RUNS.lock().expect("runs"),
        [
            ("pay:v1:i-1".to_owned(), recorded.clone(), 1),
            ("pay:v1:i-1".to_owned(), recorded.clone(), 2),
        ]
    );
    let row = rows(&store, &id).await.remove(0);
    assert_eq!(row.status, CallStatus::Completed);
    assert_eq!(row.idempotency_key, recorded);
}

static SHIP_RUNS: AtomicUsize = AtomicUsize::new(0);
static SHIP_STARTED: AtomicBool = AtomicBool::new(false);

/// Ship a parcel.
#[durable_tool(
    replay = "idempotent_with_key",
    idempotency_key = |a| format!("ship:{}", a.parcel),
)]
async fn ship_parcel(key: IdempotencyKey, parcel: String) -> Result<String, Failure> {
    SHIP_RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(format!("shipped {parcel} with {key}"))
}

/// A keyed tool never runs without its key: an in-doubt record that holds none (issued
/// while the tool was `unsafe_on_replay`) is refused with a typed error, before the body
/// runs, and stays in doubt for an operator.
#[tokio::test]
async fn a_keyed_call_whose_record_holds_no_key_does_not_run() {
    let store = store().await;
    let session = start(&store).await;
    let id = session.id().clone();

    // The same tool and arguments, issued under the class it had before: no key.
    let mut before = ship_parcel::spec().clone();
    before.class = ReplayClass::UnsafeOnReplay;
    let journal = session.journal().clone();
    let task = tokio::spawn(async move {
        journal
            .tool(&before, json!({"parcel": "p-1"}))
            .run(|_ctx| async {
                SHIP_STARTED.store(true, Ordering::SeqCst);
                std::future::pending::<Result<String, Failure>>().await
            })
            .await
    });
    while !SHIP_STARTED.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    task.abort();
    assert!(task.await.is_err(), "the call was cut off");
    let row = rows(&store, &id).await.remove(0);
    assert_eq!(
        (row.status, row.idempotency_key),
        (CallStatus::Issued, None)
    );

    let resumed = crash_and_resume(&store, session).await;
    let refused = ship_parcel
        .call(resumed.session.journal(), "p-1".into())
        .await;
    match refused {
        Err(CallError::Durable(DurableError::ReplayUnsafe { call, reason, .. })) => {
            assert_eq!(call, row.id);
            assert!(reason.contains("holds no idempotency key"), "{reason}");
        }
        other => panic!("expected ReplayUnsafe, got {other:?}"),
    }
    assert_eq!(SHIP_RUNS.load(Ordering::SeqCst), 0, "the body did not run");
    let row = rows(&store, &id).await.remove(0);
    assert_eq!(row.status, CallStatus::Issued, "still in doubt");
    assert_eq!(row.idempotency_key, None);
}

static TAGS: AtomicUsize = AtomicUsize::new(0);

/// Tag an order; the key is the tag itself.
#[durable_tool(replay = "idempotent_with_key", idempotency_key = |a| a.tag.clone())]
async fn tag_order(key: IdempotencyKey, tag: String) -> Result<String, Failure> {
    TAGS.fetch_add(1, Ordering::SeqCst);
    Ok(format!("{tag} {key}"))
}

/// A rule that derives an empty key is refused before anything is journaled: an empty key
/// deduplicates nothing.
#[tokio::test]
async fn an_empty_derived_key_is_refused_before_journaling() {
    let store = store().await;
    let session = start(&store).await;
    let journal = session.journal();

    let typed = tag_order.call(journal, String::new()).await;
    assert!(
        matches!(&typed, Err(CallError::Durable(DurableError::Encode { detail, .. })) if detail.contains("empty key")),
        "{typed:?}"
    );
    let invoked = tag_order.invoke(journal, json!({"tag": ""})).await;
    assert!(
        matches!(&invoked, Err(DurableError::Encode { what, .. }) if what.contains("`tag_order`")),
        "{invoked:?}"
    );
    assert!(matches!(
        tag_order.derive_key(&json!({"tag": ""}), session.id()),
        Some(Err(DurableError::Encode { .. }))
    ));
    assert_eq!(TAGS.load(Ordering::SeqCst), 0);
    assert!(
        rows(&store, session.id()).await.is_empty(),
        "nothing journaled"
    );

    let tagged = tag_order
        .call(journal, "gift".into())
        .await
        .expect("tagged");
    assert_eq!(tagged, "gift gift");
}

#[test]
fn idempotency_keys_are_plain_non_empty_strings() {
    assert_eq!(IdempotencyKey::new(""), None);
    let key = IdempotencyKey::new(String::from("charge:o-1")).expect("not empty");
    assert_eq!(key.as_str(), "charge:o-1");
    assert_eq!(key.to_string(), "charge:o-1");
    assert_eq!(AsRef::<str>::as_ref(&key), "charge:o-1");
    assert!(key.starts_with("charge:"), "derefs to `str`");
    assert_eq!(key, "charge:o-1");
    assert_eq!(String::from(key.clone()), key.into_string());
}

// ---------------------------------------------------------------------------------------
// `rate_limit`: the tool's calls wait under a fleet-wide limit.
// ---------------------------------------------------------------------------------------

static CRM_LOOKUPS: AtomicUsize = AtomicUsize::new(0);

/// Look a customer up in the CRM (one request per minute, shared by the fleet).
#[durable_tool(replay = "pure", rate_limit = "crm")]
async fn crm_lookup(id: String) -> Result<String, Failure> {
    CRM_LOOKUPS.fetch_add(1, Ordering::SeqCst);
    Ok(format!("customer {id}"))
}

#[tokio::test]
async fn a_tools_rate_limit_holds_its_calls_to_the_limit() {
    use durable::limiter::{Quota, RateLimit};
    assert_eq!(crm_lookup::spec().rate_limit.as_deref(), Some("crm"));
    let store = store().await;
    let session = Durable::builder(Arc::clone(&store))
        .owner("worker-1")
        .renew_leases(false)
        .rate_limit("crm", RateLimit::requests(Quota::per_minute(1)))
        .limiter_hold(Duration::from_millis(100))
        .build()
        .start::<Message>(StartOptions::default())
        .await
        .expect("start");
    let first = crm_lookup
        .call(session.journal(), "c-1".into())
        .await
        .expect("the first call is within the limit");
    assert_eq!(first, "customer c-1");
    // The next turn is a minute away, further than the worker holds a session: refused
    // before it runs or is journaled.
    let refused = crm_lookup.call(session.journal(), "c-2".into()).await;
    assert!(
        matches!(
            refused,
            Err(CallError::Durable(DurableError::RateLimited { ref limit, .. })) if limit == "crm"
        ),
        "{refused:?}"
    );
    assert_eq!(
        CRM_LOOKUPS.load(Ordering::SeqCst),
        1,
        "the refused call ran"
    );
}
