//! A `#[secret]` value never reaches the store, the WAL, the transcript, an export, the
//! logs or an error message in clear, nor as a bare SHA-256.
//!
//! `the_canary_is_nowhere_on_sqlite` runs a whole harness with a canary password: a
//! scripted model asks for a `#[durable_tool]` login with it (and for a PIN with the
//! canary where a number belongs), the tool runs and receives it, a checkpoint is saved,
//! the next turn is interrupted, the store is re-opened and the session resumed (a
//! recorded call replays without the secret; one that never ran is refused, never run with
//! the placeholder, until the model sends it again), the session is exported as
//! `durable export` does. Then every byte the store wrote (database, `-wal`, `-shm`, read
//! raw while open and after closing), the export, everything traced (a subscriber that
//! records every field of every span and event at every level), every error and the
//! transcript are searched for the canary and for the SHA-256 of anything it was part of.
//!
//! `the_canary_is_nowhere_for_any_signature` (proptest) hunts the class: generated tools
//! whose secret arguments are strings, numbers, arrays or nested objects, several calls of
//! one reply in parallel, in the shapes of the default message, OpenAI and Anthropic.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use durable::error::ArgumentErrorKind;
use durable::replay_check::{self, Fixture};
use durable::sqlite::SqliteStore;
use durable::{
    Block, CheckpointStore, Durable, DurableError, Message, ModelToolCall, SessionId, StartOptions,
    ToolResult, Toolbox, durable_tool,
};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

mod secrets_support;
use secrets_support::{Trace, proptest_cases};

const CANARY: &str = "CANARY-7f3a9c-hunter2";

/// Every password the login tool received, in order.
static RECEIVED: Mutex<Vec<String>> = Mutex::new(Vec::new());
static PIN_RUNS: AtomicUsize = AtomicUsize::new(0);
/// One scenario at a time: they share the tools' counters.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Log a user in.
#[durable_tool(replay = "unsafe_on_replay")]
async fn login(
    /// Who.
    user: String,
    /// Their password.
    #[secret]
    password: String,
) -> Result<String, String> {
    RECEIVED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(password);
    Ok(format!("welcome, {user}"))
}

/// Set the user's PIN.
#[durable_tool(replay = "pure")]
async fn set_pin(
    /// The new PIN.
    #[secret]
    pin: u32,
) -> Result<String, String> {
    PIN_RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(format!("pin of {} digits set", pin.to_string().len()))
}

fn received() -> Vec<String> {
    RECEIVED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone()
}

/// What must appear nowhere: the canary, and the lowercase hex SHA-256 of every text it
/// was part of (the value, its JSON, the canonical arguments of each call that held it),
/// which is what an unsalted digest or input hash would store.
struct Needles(Vec<(String, String)>);

impl Needles {
    fn new(args_with_canary: &[Value]) -> Self {
        let mut needles = vec![("the canary".to_owned(), CANARY.to_owned())];
        let mut hashed = vec![CANARY.to_owned(), json!(CANARY).to_string()];
        for args in args_with_canary {
            hashed.push(canonical(args));
        }
        for text in hashed {
            needles.push((format!("SHA-256 of {text}"), sha256_hex(text.as_bytes())));
        }
        Needles(needles)
    }

    fn assert_absent(&self, what: &str, bytes: &[u8]) {
        for (name, needle) in &self.0 {
            assert!(
                !contains(bytes, needle.as_bytes()),
                "{what} holds {name} ({} bytes searched)",
                bytes.len()
            );
        }
    }
}

fn canonical(value: &Value) -> String {
    durable_core::canonical::canonical_json(value).expect("canonical JSON")
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .fold(String::new(), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

/// Every file under `dir`, raw.
fn raw_files(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).expect("read dir") {
        let path = entry.expect("entry").path();
        if path.is_file() {
            let bytes = std::fs::read(&path).expect("read");
            files.push((path, bytes));
        }
    }
    files
}

fn runtime(store: &Arc<dyn CheckpointStore>, owner: &str) -> Durable {
    Durable::builder(Arc::clone(store))
        .owner(owner)
        .renew_leases(false)
        .build()
}

fn tools() -> Toolbox {
    Toolbox::new()
        .with(login)
        .expect("login")
        .with(set_pin)
        .expect("set_pin")
}

/// Dispatches a reply's calls; a call the model got wrong becomes the error result it
/// reads. Returns the results and every error's text.
async fn dispatch(
    tools: &Toolbox,
    journal: &durable::Journal,
    reply: &Message,
    errors: &mut Vec<String>,
) -> (Vec<ToolResult>, Vec<DurableError>) {
    let calls = ModelToolCall::from_message(reply);
    let mut results = Vec::new();
    let mut refused = Vec::new();
    for (call, outcome) in calls.iter().zip(tools.dispatch_all(journal, &calls).await) {
        match outcome {
            Ok(result) => results.push(result),
            Err(e) => {
                errors.push(e.to_string());
                errors.push(format!("{e:?}"));
                results.push(ToolResult::refused(call, &e).expect("a model-facing error"));
                refused.push(e);
            }
        }
    }
    (results, refused)
}

fn scripted(reply: Message) -> impl FnOnce() -> std::future::Ready<Result<Message, String>> {
    move || std::future::ready(Ok(reply))
}

fn never() -> std::future::Ready<Result<Message, String>> {
    std::future::ready(Err("the model must not be asked again".to_owned()))
}

/// A store under test, re-opened as a new process would, whose every written byte can
/// be read back raw.
trait Backend {
    /// Opens (or re-opens) the store.
    async fn open(&self) -> Arc<dyn CheckpointStore>;
    /// Closes the store opened last.
    async fn close(&self);
    /// Everything the store holds, raw, by where it came from.
    async fn raw(&self) -> Vec<(String, Vec<u8>)>;
    /// Whether `raw` read the database itself (not only its side files).
    fn raw_is_complete(&self, raw: &[(String, Vec<u8>)]) -> bool;
}

struct Sqlite {
    dir: PathBuf,
    last: Mutex<Option<Arc<SqliteStore>>>,
}

impl Backend for Sqlite {
    async fn open(&self) -> Arc<dyn CheckpointStore> {
        let store = Arc::new(
            SqliteStore::open(self.dir.join("agent.db"))
                .await
                .expect("open"),
        );
        *self.last.lock().expect("last") = Some(Arc::clone(&store));
        store
    }

    async fn close(&self) {
        let store = self.last.lock().expect("last").take();
        if let Some(store) = store {
            store.close().await;
        }
    }

    async fn raw(&self) -> Vec<(String, Vec<u8>)> {
        raw_files(&self.dir)
            .into_iter()
            .map(|(path, bytes)| (format!("store file {}", path.display()), bytes))
            .collect()
    }

    fn raw_is_complete(&self, raw: &[(String, Vec<u8>)]) -> bool {
        raw.iter().any(|(name, _)| name.ends_with("agent.db"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_canary_is_nowhere_on_sqlite() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db_dir = dir.path().join("db");
    std::fs::create_dir(&db_dir).expect("db dir");
    let backend = Sqlite {
        dir: db_dir,
        last: Mutex::new(None),
    };
    scenario(&backend, dir.path()).await;
}

#[cfg(feature = "_postgres-testing")]
mod postgres {
    use super::*;
    use durable::postgres::PostgresStore;
    use durable::postgres::testing::{TestDatabase, test_database};
    use sqlx::Row;

    /// Every table's rows as text (`SELECT t::text`): what a reader of the database sees.
    /// (The server's WAL files are outside this test's reach.)
    struct Postgres {
        db: TestDatabase,
        last: Mutex<Option<Arc<PostgresStore>>>,
    }

    impl Backend for Postgres {
        async fn open(&self) -> Arc<dyn CheckpointStore> {
            let store = Arc::new(self.db.store().await.expect("connect"));
            *self.last.lock().expect("last") = Some(Arc::clone(&store));
            store
        }

        async fn close(&self) {
            let store = self.last.lock().expect("last").take();
            if let Some(store) = store {
                store.pool().close().await;
            }
        }

        async fn raw(&self) -> Vec<(String, Vec<u8>)> {
            let pool = sqlx::PgPool::connect(self.db.url()).await.expect("connect");
            let tables: Vec<String> = sqlx::query(
                "SELECT table_schema || '.' || table_name FROM information_schema.tables \
                 WHERE table_schema NOT IN ('pg_catalog', 'information_schema')",
            )
            .fetch_all(&pool)
            .await
            .expect("tables")
            .iter()
            .map(|row| row.get::<String, _>(0))
            .collect();
            let mut out = Vec::new();
            for table in tables {
                let sql = format!("SELECT t::text FROM {table} t");
                let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
                    .fetch_all(&pool)
                    .await
                    .expect("rows");
                let text: String = rows
                    .iter()
                    .map(|row| row.get::<String, _>(0) + "\n")
                    .collect();
                out.push((format!("table {table}"), text.into_bytes()));
            }
            pool.close().await;
            out
        }

        fn raw_is_complete(&self, raw: &[(String, Vec<u8>)]) -> bool {
            raw.iter()
                .any(|(name, bytes)| name.ends_with("durable_tool_calls") && !bytes.is_empty())
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_canary_is_nowhere_on_postgres() {
        let dir = tempfile::tempdir().expect("temp dir");
        let backend = Postgres {
            db: test_database().await,
            last: Mutex::new(None),
        };
        scenario(&backend, dir.path()).await;
    }
}

/// The harness run, for any backend; `out` receives the export.
async fn scenario(backend: &impl Backend, out: &Path) {
    let _serial = SERIAL.lock().await;
    RECEIVED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clear();
    PIN_RUNS.store(0, Ordering::SeqCst);
    let trace = Trace::install();
    let tools = tools();
    let mut errors: Vec<String> = Vec::new();
    let ann = json!({"user": "ann", "password": CANARY});
    let carol = json!({"user": "carol", "password": CANARY});
    let dave = json!({"user": "dave", "password": CANARY});
    let needles = Needles::new(&[
        ann.clone(),
        carol.clone(),
        dave.clone(),
        json!({"pin": CANARY}),
    ]);

    // First process: a turn that logs in (and sends the canary as a PIN, the wrong type),
    // a checkpoint, then a turn interrupted after its first call.
    let store = backend.open().await;
    let mut session = runtime(&store, "worker-1")
        .start::<Message>(StartOptions::default())
        .await
        .expect("start");
    let id: SessionId = session.id().clone();
    session.push(Message::user("log in as ann, then set my pin"));
    let reply: Message = session
        .model(scripted(Message::assistant(vec![
            Block::text("Logging in."),
            Block::tool_call("c1", "login", ann.clone()),
            // OpenAI sends arguments as text.
            Block::tool_call("c2", "set_pin", json!(json!({"pin": CANARY}).to_string())),
        ])))
        .await
        .expect("model");
    needles.assert_absent("the reply the harness got", reply_bytes(&reply).as_slice());
    let (results, refused) = dispatch(&tools, session.journal(), &reply, &mut errors).await;
    assert_eq!(received(), [CANARY], "the tool receives the clear value");
    assert_eq!(results[0].output.content, json!("welcome, ann"));
    assert!(
        matches!(&refused[..], [DurableError::ArgumentsMismatch { path, .. }] if path == "$.pin"),
        "{refused:?}"
    );
    assert_eq!(PIN_RUNS.load(Ordering::SeqCst), 0);
    session.push(reply);
    session.push(ToolResult::message(&results));
    session.checkpoint().await.expect("checkpoint");

    let reply: Message = session
        .model(scripted(Message::assistant(vec![
            Block::tool_call("c3", "login", carol.clone()),
            Block::tool_call("c4", "login", dave.clone()),
        ])))
        .await
        .expect("model");
    let calls = ModelToolCall::from_message(&reply);
    // Only the first call runs before the "crash".
    tools
        .dispatch(session.journal(), &calls[0])
        .await
        .expect("carol");
    assert_eq!(received().len(), 2);
    session.push(reply);
    let mut raw = backend.raw().await;
    session.release().await.expect("release");
    drop(store);

    // Second process: re-open the file, resume, re-run the turn.
    let store = backend.open().await;
    let resumed = runtime(&store, "worker-2")
        .resume::<Message>(&id)
        .await
        .expect("resume");
    let mut session = resumed.session;
    let reply: Message = session.model(never).await.expect("journaled reply");
    needles.assert_absent("the replayed reply", reply_bytes(&reply).as_slice());
    let (mut results, refused) = dispatch(&tools, session.journal(), &reply, &mut errors).await;
    // carol's login was recorded: replayed without the secret. dave's never ran: refused,
    // not run with the placeholder.
    assert_eq!(results[0].output.content, json!("welcome, carol"));
    assert!(
        matches!(
            &refused[..],
            [DurableError::InvalidArguments { source, .. }]
                if source.kind == ArgumentErrorKind::SecretUnavailable && source.path == "$.password"
        ),
        "{refused:?}"
    );
    assert!(results[1].is_error());
    assert_eq!(received().len(), 2, "nothing ran with a placeholder");
    session.push(reply);
    session.push(ToolResult::message(&results));
    // The model, told so, sends the call again with the secret.
    let again: Message = session
        .model(scripted(Message::assistant(vec![Block::tool_call(
            "c5",
            "login",
            dave.clone(),
        )])))
        .await
        .expect("model");
    let (more, refused) = dispatch(&tools, session.journal(), &again, &mut errors).await;
    assert!(refused.is_empty(), "{refused:?}");
    assert_eq!(more[0].output.content, json!("welcome, dave"));
    assert_eq!(received(), [CANARY, CANARY, CANARY]);
    results.extend(more);
    session.push(again);
    session.push(ToolResult::message(&results[2..]));
    session.checkpoint().await.expect("checkpoint");
    let transcript = serde_json::to_vec(session.messages()).expect("transcript");

    // `durable export`, without the CLI.
    let exported = replay_check::export_session(store.as_ref(), &id)
        .await
        .expect("export");
    assert!(exported.unreadable.is_empty());
    let out = out.join("fixtures");
    std::fs::create_dir(&out).expect("fixtures dir");
    for fixture in &exported.fixtures {
        let text = fixture.to_json_pretty().expect("fixture JSON");
        std::fs::write(out.join(fixture.file_name()), text).expect("write fixture");
    }
    // The exported fixtures pass the replay check (masked secrets included).
    let fixtures = Fixture::load_dir(&out).expect("load fixtures");
    replay_check::check_fixtures(&tools, &fixtures).assert_ok();
    raw.extend(backend.raw().await);
    session.release().await.expect("release");
    drop(store);
    backend.close().await;
    let closed = backend.raw().await;
    assert!(
        backend.raw_is_complete(&closed),
        "the database was searched"
    );
    for (what, bytes) in raw.iter().chain(&closed) {
        needles.assert_absent(what, bytes);
    }
    for (path, bytes) in raw_files(&out) {
        needles.assert_absent(&format!("export {}", path.display()), &bytes);
    }
    needles.assert_absent("the transcript", &transcript);
    needles.assert_absent("the errors", errors.join("\n").as_bytes());
    let traced = trace.text();
    assert!(traced.contains("execute_tool"), "the trace was captured");
    needles.assert_absent("the trace", traced.as_bytes());
}

fn reply_bytes(reply: &Message) -> Vec<u8> {
    serde_json::to_vec(reply).expect("reply JSON")
}

#[test]
fn the_canary_is_nowhere_for_any_signature() {
    secrets_support::generated::run(proptest_cases());
}

/// While set, `unlock` and `peek` never finish: their call stays issued, in doubt.
static HANG: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Unlock the vault.
#[durable_tool(replay = "unsafe_on_replay")]
async fn unlock(
    /// The vault's code.
    #[secret]
    code: String,
) -> Result<String, String> {
    if HANG.load(Ordering::SeqCst) {
        std::future::pending::<()>().await;
    }
    Ok(format!("{} characters", code.len()))
}

/// Peek into a vault.
#[durable_tool(replay = "idempotent_with_key", idempotency_key = |a| a.vault.clone())]
async fn peek(
    /// Which vault.
    vault: String,
    /// The vault's code.
    #[secret]
    code: String,
) -> Result<String, String> {
    if HANG.load(Ordering::SeqCst) {
        std::future::pending::<()>().await;
    }
    Ok(format!("{} characters in {vault}", code.len()))
}

/// In doubt after a restart, with its secret redacted: an unsafe call is `ReplayUnsafe`
/// (neither its verify hook nor a re-run can have the value), a keyed one is refused as
/// `SecretUnavailable` and re-runs on its row once the model sends the value again.
/// Runs `call` of a fresh session until its tool hangs (issued, in doubt), "crashes",
/// and resumes the session: the resumed session and the replayed reply's calls.
async fn hang_and_resume(
    store: &Arc<dyn CheckpointStore>,
    tools: &Toolbox,
    call: Block,
) -> (durable::Session<Message>, Vec<ModelToolCall>) {
    let session = runtime(store, "worker-1")
        .start::<Message>(StartOptions::default())
        .await
        .expect("start");
    let id = session.id().clone();
    let reply: Message = session
        .model(scripted(Message::assistant(vec![call])))
        .await
        .expect("model");
    let calls = ModelToolCall::from_message(&reply);
    let hung = tokio::time::timeout(
        std::time::Duration::from_millis(200),
        tools.dispatch(session.journal(), &calls[0]),
    )
    .await;
    assert!(hung.is_err(), "the tool hangs: {hung:?}");
    session.release().await.expect("release");
    let session = runtime(store, "worker-2")
        .resume::<Message>(&id)
        .await
        .expect("resume")
        .session;
    let reply: Message = session.model(never).await.expect("journaled reply");
    (session, ModelToolCall::from_message(&reply))
}

/// In doubt after a restart, with its secret redacted: an unsafe call is `ReplayUnsafe`
/// (neither its verify hook nor a re-run can have the value), a keyed one is refused as
/// `SecretUnavailable` and re-runs on its row once the model sends the value again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_doubt_call_whose_secret_was_redacted_is_not_run_with_the_placeholder() {
    let store: Arc<dyn CheckpointStore> =
        Arc::new(SqliteStore::open_in_memory().await.expect("store"));
    let tools = Toolbox::new()
        .with(unlock)
        .expect("unlock")
        .with(peek)
        .expect("peek");
    HANG.store(true, Ordering::SeqCst);
    let code = json!({"code": CANARY});
    let (unsafe_session, unsafe_calls) = hang_and_resume(
        &store,
        &tools,
        Block::tool_call("u", "unlock", code.clone()),
    )
    .await;
    let peek_args = json!({"vault": "v-1", "code": CANARY});
    let (session, keyed_calls) = hang_and_resume(
        &store,
        &tools,
        Block::tool_call("p", "peek", peek_args.clone()),
    )
    .await;
    HANG.store(false, Ordering::SeqCst);

    let unsafe_call = tools
        .dispatch(unsafe_session.journal(), &unsafe_calls[0])
        .await;
    assert!(
        matches!(&unsafe_call, Err(DurableError::ReplayUnsafe { reason, .. }) if reason.contains("secret argument `code`")),
        "{unsafe_call:?}"
    );
    let keyed_call = tools.dispatch(session.journal(), &keyed_calls[0]).await;
    assert!(
        matches!(
            &keyed_call,
            Err(DurableError::InvalidArguments { source, .. })
                if source.kind == ArgumentErrorKind::SecretUnavailable
        ),
        "{keyed_call:?}"
    );
    // Sent again with the value (a new reply of the same turn): the keyed call re-runs
    // on its in-doubt row, with its recorded key.
    let again: Message = session
        .model(scripted(Message::assistant(vec![Block::tool_call(
            "p2",
            "peek",
            peek_args.clone(),
        )])))
        .await
        .expect("model");
    let result = tools
        .dispatch(session.journal(), &ModelToolCall::from_message(&again)[0])
        .await
        .expect("peek runs");
    assert!(!result.is_error(), "{result:?}");
    assert_eq!(
        result.output.content,
        json!(format!("{} characters in v-1", CANARY.len()))
    );
    let rows = store.calls(session.id(), None).await.expect("rows");
    let peeks: Vec<_> = rows.iter().filter(|r| r.identity.tool == "peek").collect();
    assert_eq!(peeks.len(), 1, "the re-sent call found its in-doubt row");
    assert_eq!(peeks[0].attempt, 2);
    let mut written = serde_json::to_string(
        &rows
            .iter()
            .map(|r| json!([r.args, r.result, r.identity.input_hash]))
            .collect::<Vec<_>>(),
    )
    .expect("rows");
    let unsafe_rows = store.calls(unsafe_session.id(), None).await.expect("rows");
    written.push_str(
        &serde_json::to_string(
            &unsafe_rows
                .iter()
                .map(|r| json!([r.args, r.result]))
                .collect::<Vec<_>>(),
        )
        .expect("rows"),
    );
    assert!(!written.contains(CANARY), "{written}");
}
