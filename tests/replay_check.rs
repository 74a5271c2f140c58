//! The replay check over fixtures exported from the demo (`tests/fixtures/demo`), against
//! the demo's own toolbox: the committed format-1 fixtures keep loading under today's
//! code, and a loosened tool, arguments that no longer fit, or an unregistered tool are
//! each reported with session, version and call. And over a live store: an argument
//! renamed with a `#[serde(alias)]` for its old name still fits, and without one it is
//! reported with its two ways out.

#[path = "../examples/crash_resume/world.rs"]
#[allow(dead_code)]
mod world;

#[path = "../examples/crash_resume/tools.rs"]
#[allow(dead_code)]
mod tools;

use std::path::Path;
use std::sync::Arc;

use durable::Message;
use durable::ModelToolCall;
use durable::replay_check::{self, FailureKind, Fixture, FixtureError};
use durable::sqlite::SqliteStore;
use durable::{
    CheckpointStore, Durable, DurableError, Journal, ReplayClass, SessionId, StartOptions, Tool,
    ToolOutput, ToolSpec, Toolbox,
};
use serde_json::{Value, json};

const FIXTURES: &str = "tests/fixtures/demo/format-1";

fn fixtures() -> Vec<Fixture> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(FIXTURES);
    Fixture::load_dir(dir).expect("the committed fixtures load")
}

fn demo_toolbox() -> Toolbox {
    tools::toolbox(true).expect("demo toolbox")
}

/// A registered tool under another replay class: what a careless edit of
/// `#[durable_tool(replay = …)]` ships.
struct Reclassed {
    inner: Arc<dyn Tool>,
    spec: ToolSpec,
}

impl Tool for Reclassed {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn invoke<'a>(
        &'a self,
        journal: &'a Journal,
        args: Value,
    ) -> durable::runtime::BoxFuture<'a, Result<ToolOutput, DurableError>> {
        self.inner.invoke(journal, args)
    }

    fn check_args(&self, args: &Value) -> Result<(), DurableError> {
        self.inner.check_args(args)
    }

    fn derive_key(
        &self,
        args: &Value,
        session: &SessionId,
    ) -> Option<Result<String, DurableError>> {
        self.inner.derive_key(args, session)
    }
}

/// The demo toolbox with `name` changed to `class` (or left out, with `None`).
fn demo_toolbox_with(name: &str, class: Option<ReplayClass>) -> Toolbox {
    let demo = demo_toolbox();
    let mut tools = Toolbox::new();
    for tool_name in demo.names() {
        let tool = Arc::clone(demo.get(tool_name).expect("registered"));
        if tool_name != name {
            tools.register_arc(tool).expect("register");
            continue;
        }
        if let Some(class) = class {
            let mut spec = tool.spec().clone();
            spec.class = class;
            tools
                .register(Reclassed { inner: tool, spec })
                .expect("register");
        }
    }
    tools
}

#[test]
fn the_committed_demo_fixtures_replay_under_todays_code() {
    let fixtures = fixtures();
    assert_eq!(fixtures.len(), 18, "three demo runs of six checkpoints");
    assert!(fixtures.iter().all(|f| f.format == 1));
    let report = replay_check::check_fixtures_as::<Message>(&demo_toolbox(), &fixtures);
    report.assert_ok();
    assert_eq!((report.checkpoints, report.calls), (18, 12), "{report}");
    // The journal holds every status a resume must read back.
    let statuses: Vec<&str> = fixtures
        .iter()
        .flat_map(|f| &f.calls)
        .map(|c| c.status.as_str())
        .collect();
    assert!(statuses.contains(&"resolved"), "{statuses:?}");
    assert!(
        fixtures
            .iter()
            .flat_map(|f| &f.calls)
            .any(|c| c.attempt == 2)
    );
    // The unverified build of `send_email` is the same tool to the journal.
    replay_check::check_fixtures(&tools::toolbox(false).expect("toolbox"), &fixtures).assert_ok();
}

#[test]
fn a_loosened_tool_is_reported_with_session_version_and_call() {
    let fixtures = fixtures();
    let loosened = demo_toolbox_with("send_email", Some(ReplayClass::Pure));
    let report = replay_check::check_fixtures(&loosened, &fixtures);
    assert!(!report.is_ok());
    assert_eq!(
        report.failures.len(),
        3,
        "one email per demo session: {report}"
    );
    for failure in &report.failures {
        assert_eq!(
            failure.kind,
            FailureKind::ClassLoosened {
                recorded: ReplayClass::UnsafeOnReplay,
                current: ReplayClass::Pure
            }
        );
        assert_eq!(failure.tool.as_deref(), Some("send_email"));
        assert_eq!(
            failure.version,
            Some(1),
            "the email is sent in the turn after checkpoint 1"
        );
        let call = failure.call.as_ref().expect("call id");
        let fixture = fixtures
            .iter()
            .find(|f| f.session == failure.session && f.version == 1)
            .expect("fixture");
        assert!(fixture.calls.iter().any(|c| &c.id == call));
        let text = failure.to_string();
        assert!(
            text.contains(&format!(
                "session `{}` version 1 call `{call}` (`send_email`)",
                failure.session
            )) && text.contains("replay class loosened from `unsafe_on_replay` to `pure`"),
            "{text}"
        );
    }

    // Tightening is fine: a pure lookup now guarded as unsafe.
    let tightened = demo_toolbox_with("read_context", Some(ReplayClass::UnsafeOnReplay));
    replay_check::check_fixtures(&tightened, &fixtures).assert_ok();
}

#[test]
fn arguments_that_no_longer_fit_and_missing_tools_are_reported() {
    let mut fixtures = fixtures();
    // Simulate the stored shape of an older release: `charge_card` took `cents`.
    let (index, call) = fixtures
        .iter()
        .enumerate()
        .find_map(|(i, f)| {
            f.calls
                .iter()
                .find(|c| c.tool == "charge_card")
                .map(|c| (i, c.id.clone()))
        })
        .expect("a charge_card call");
    for c in &mut fixtures[index].calls {
        if c.id == call
            && let Some(args) = c.args.as_object_mut()
        {
            let amount = args.remove("amount_cents").expect("amount_cents");
            args.insert("cents".into(), amount);
        }
    }
    let report = replay_check::check_fixtures(&demo_toolbox(), &fixtures);
    let rejected: Vec<_> = report
        .failures
        .iter()
        .filter(|f| {
            matches!(
                f.kind,
                FailureKind::ArgumentsRejected(_) | FailureKind::ArgumentRenamed { .. }
            )
        })
        .collect();
    assert_eq!(rejected.len(), 1, "{report}");
    assert_eq!(rejected[0].call.as_ref(), Some(&call));
    assert_eq!(rejected[0].session, fixtures[index].session);
    assert_eq!(rejected[0].version, Some(fixtures[index].version));
    // serde decides (the decode a resume runs), and the rename is named as one.
    assert!(
        matches!(
            &rejected[0].kind,
            FailureKind::ArgumentRenamed { missing, unread, .. }
                if missing == &["amount_cents"] && unread == &["cents"]
        ),
        "{report}"
    );
    assert!(
        rejected[0]
            .to_string()
            .contains("`#[serde(alias = \"cents\")]` on `amount_cents`"),
        "{report}"
    );
    // The renamed argument also changes what the recorded hash was computed over.
    assert!(
        report
            .failures
            .iter()
            .any(|f| matches!(f.kind, FailureKind::InputHashChanged { .. })),
        "{report}"
    );

    let without = demo_toolbox_with("commit_order", None);
    let report = replay_check::check_fixtures(&without, &fixtures);
    let unknown: Vec<_> = report
        .failures
        .iter()
        .filter(|f| matches!(f.kind, FailureKind::UnknownTool { .. }))
        .collect();
    assert_eq!(unknown.len(), 3, "{report}");
    assert!(
        unknown
            .iter()
            .all(|f| f.tool.as_deref() == Some("commit_order"))
    );
}

#[test]
fn fixtures_of_a_newer_format_are_refused_with_their_path() {
    let dir = tempfile::tempdir().expect("tempdir");
    let source = fixtures().remove(0);
    let mut value: Value =
        serde_json::from_str(&source.to_json_pretty().expect("json")).expect("json");
    value["format"] = json!(2);
    let path = dir.path().join("future.json");
    std::fs::write(&path, value.to_string()).expect("write");
    match Fixture::load_dir(dir.path()) {
        Err(e @ FixtureError::TooNew { found: 2, .. }) => {
            assert!(e.to_string().contains("future.json"), "{e}");
        }
        other => panic!("expected TooNew, got {other:?}"),
    }
}

#[tokio::test]
async fn check_store_runs_the_last_checkpoints_of_a_live_store() {
    let dir = tempfile::tempdir().expect("tempdir");
    world::install(dir.path().join("world"));
    std::fs::create_dir_all(dir.path().join("world")).expect("world dir");
    let store: Arc<dyn CheckpointStore> = Arc::new(
        SqliteStore::open(dir.path().join("agent.db"))
            .await
            .expect("store"),
    );
    let toolbox = demo_toolbox();
    let mut session = Durable::builder(Arc::clone(&store))
        .owner("test")
        .build()
        .start::<Message>(
            StartOptions::new()
                .with_id(SessionId::new("live-1"))
                .with_messages(vec![Message::user("Read order o-1017.")]),
        )
        .await
        .expect("start");
    let call = ModelToolCall::new("c1", "read_context", json!({"order_id": "o-1017"}));
    let result = toolbox
        .dispatch(session.journal(), &call)
        .await
        .expect("read_context");
    assert!(!result.is_error(), "{:?}", result.output);
    session.push(result.into_message());
    session.checkpoint().await.expect("checkpoint");

    let report = replay_check::check_store(&toolbox, store.as_ref(), 10)
        .await
        .expect("check");
    report.assert_ok();
    assert_eq!((report.checkpoints, report.calls), (2, 1));
    // The last checkpoint alone: its turn has not started, so no call to check.
    let last = replay_check::check_store(&toolbox, store.as_ref(), 1)
        .await
        .expect("check");
    assert_eq!((last.checkpoints, last.calls), (1, 0));

    let without = demo_toolbox_with("read_context", None);
    let report = replay_check::check_store(&without, store.as_ref(), 2)
        .await
        .expect("check");
    match report.failures.as_slice() {
        [failure] => {
            assert_eq!(failure.session.as_str(), "live-1");
            // The call belongs to the turn that started from checkpoint 0.
            assert_eq!(failure.version, Some(0));
            assert!(matches!(failure.kind, FailureKind::UnknownTool { .. }));
        }
        other => panic!("expected one UnknownTool failure, got {other:?}"),
    }
}

/// `notify` as the calls were recorded, and two later builds that renamed its argument
/// `to` to `recipient`: one keeps reading the old name, one does not.
mod notify {
    use std::convert::Infallible;

    use durable::durable_tool;

    /// Notify someone.
    #[durable_tool(replay = "unsafe_on_replay", name = "notify")]
    pub async fn recorded(to: String, body: String) -> Result<String, Infallible> {
        Ok(format!("{to}: {body}"))
    }

    /// Notify someone.
    #[durable_tool(replay = "unsafe_on_replay", name = "notify")]
    pub async fn renamed_with_alias(
        #[serde(alias = "to")] recipient: String,
        body: String,
    ) -> Result<String, Infallible> {
        Ok(format!("{recipient}: {body}"))
    }

    /// Notify someone.
    #[durable_tool(replay = "unsafe_on_replay", name = "notify")]
    pub async fn renamed(recipient: String, body: String) -> Result<String, Infallible> {
        Ok(format!("{recipient}: {body}"))
    }
}

#[tokio::test]
async fn a_renamed_argument_fits_through_its_serde_alias_and_is_reported_without_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store: Arc<dyn CheckpointStore> = Arc::new(
        SqliteStore::open(dir.path().join("agent.db"))
            .await
            .expect("store"),
    );
    let recorded = Toolbox::new().with(notify::recorded).expect("toolbox");
    let mut session = Durable::builder(Arc::clone(&store))
        .owner("test")
        .build()
        .start::<Message>(
            StartOptions::new()
                .with_id(SessionId::new("rename-1"))
                .with_messages(vec![Message::user("Tell Ann.")]),
        )
        .await
        .expect("start");
    let call = ModelToolCall::new(
        "c1",
        "notify",
        json!({"to": "ann@example.com", "body": "shipped"}),
    );
    let result = recorded
        .dispatch(session.journal(), &call)
        .await
        .expect("notify");
    assert!(!result.is_error(), "{:?}", result.output);
    session.push(result.into_message());
    session.checkpoint().await.expect("checkpoint");
    replay_check::check_store(&recorded, store.as_ref(), 10)
        .await
        .expect("check")
        .assert_ok();

    // Renamed, with `#[serde(alias = "to")]`: the recorded call decodes, so it fits; the
    // schema (which does not show aliases) disagreeing is a note.
    let with_alias = Toolbox::new()
        .with(notify::renamed_with_alias)
        .expect("toolbox");
    let report = replay_check::check_store(&with_alias, store.as_ref(), 10)
        .await
        .expect("check");
    report.assert_ok();
    assert_eq!(report.calls, 1, "{report}");
    match report.notes.as_slice() {
        [note] => {
            assert_eq!(note.session.as_str(), "rename-1");
            assert_eq!(note.tool, "notify");
            assert!(note.detail.contains("`recipient`"), "{note}");
        }
        other => panic!("expected one note, got {other:?}"),
    }

    // Renamed without it: reported, naming both fields and both ways out.
    let without = Toolbox::new().with(notify::renamed).expect("toolbox");
    let report = replay_check::check_store(&without, store.as_ref(), 10)
        .await
        .expect("check");
    match report.failures.as_slice() {
        [failure] => {
            assert_eq!(failure.session.as_str(), "rename-1");
            assert_eq!(failure.version, Some(0));
            assert_eq!(failure.tool.as_deref(), Some("notify"));
            assert!(
                matches!(
                    &failure.kind,
                    FailureKind::ArgumentRenamed { missing, unread, .. }
                        if missing == &["recipient"] && unread == &["to"]
                ),
                "{failure}"
            );
            let text = failure.to_string();
            assert!(
                text.contains("the recorded arguments lack `recipient` and hold `to`")
                    && text.contains("`#[serde(alias = \"to\")]` on `recipient`")
                    && text.contains(
                        "or retarget the sessions recorded with the old name (`durable retarget`)"
                    ),
                "{text}"
            );
        }
        other => panic!("expected one failure, got {other:?}"),
    }
}
