//! `approvals`, `approve` and `deny` on every backend: calls journaled as requested
//! through the runtime (`ToolCall::require_approval`), sessions parked with
//! `Session::await_approval`, and the binary deciding them.

use std::sync::Arc;
use std::time::Duration;

use durable::store::{ApprovalDecision, ApprovalRequest, CallRecord, CallStatus, SessionStatus};
use durable::{
    CallError, CallId, CheckpointStore, Durable, DurableError, Message, ReplayClass, SessionId,
    StartOptions, ToolSpec,
};
use serde_json::{Value, json};

use super::{APP, Run, hardening, read_order, run};

/// A card number: declared secret, so stored as a keyed digest and never shown.
pub const CARD: &str = "4111-1111-1111-1111";
/// A credential under a sensitive key: stored as given, shown as `***`.
pub const API_KEY: &str = "sk-live-approve-999";
/// The model's reasoning: two lines, and a terminal escape it must not get to send.
pub const REASONING: &str =
    "The customer was charged twice.\nRefund the second charge. \x1b]0;pwned\x07";
/// How long the late request stays open.
const DEADLINE: Duration = Duration::from_millis(300);

/// A refund that needs approval; `card` is secret.
pub fn refund() -> ToolSpec {
    ToolSpec::new(
        "refund",
        "Refund an order.",
        ReplayClass::UnsafeOnReplay,
        json!({
            "type": "object",
            "properties": {
                "order_id": {"type": "string"},
                "amount": {"type": "integer", "minimum": 0},
                "card": {"type": "string"},
                "api_key": {"type": "string"}
            },
            "required": ["order_id", "amount", "card"],
            "additionalProperties": false
        }),
    )
    .with_secret_args(["card"])
}

fn notify() -> ToolSpec {
    ToolSpec::new(
        "notify_customer",
        "Message the customer.",
        ReplayClass::UnsafeOnReplay,
        json!({
            "type": "object",
            "properties": {"to": {"type": "string"}, "text": {"type": "string"}},
            "required": ["to", "text"],
            "additionalProperties": false
        }),
    )
}

fn gift() -> ToolSpec {
    ToolSpec::new(
        "send_gift",
        "Send the customer a gift card.",
        ReplayClass::UnsafeOnReplay,
        json!({"type": "object", "properties": {"to": {"type": "string"}}, "required": ["to"]}),
    )
}

pub fn refund_args() -> Value {
    json!({"order_id": "o-17", "amount": 500, "card": CARD, "api_key": API_KEY})
}

/// What [`requests`] journaled.
pub struct Requests {
    /// Awaiting approval: `refund` then `notify`, requested in one turn.
    pub session: SessionId,
    pub refund: CallId,
    pub notify: CallId,
    /// Awaiting approval: one `send_gift` whose request expires after [`DEADLINE`], after
    /// a `read_order` that ran (it never needed a decision).
    pub late_session: SessionId,
    pub late: CallId,
    pub read: CallId,
}

fn request(asked_by: &str, expires_in: Option<Duration>) -> ApprovalRequest {
    ApprovalRequest {
        asked_by: asked_by.into(),
        reasoning: None,
        expires_in,
        schema: None,
    }
}

#[track_caller]
fn awaiting(outcome: Result<Value, CallError<String>>) -> CallId {
    match outcome {
        Err(CallError::Durable(DurableError::AwaitingApproval { call, .. })) => call,
        other => panic!("expected AwaitingApproval, got {other:?}"),
    }
}

/// Two sessions parked awaiting approval, through the runtime as a harness does it.
pub async fn requests(store: &Arc<dyn CheckpointStore>) -> Requests {
    let worker = Durable::builder(Arc::clone(store))
        .owner("worker-a")
        .app_version(APP)
        .renew_leases(false)
        .lease_ttl(Duration::from_secs(600))
        .build();
    let ran = |_ctx| async { Ok::<Value, String>(json!("ran")) };

    let session_id = SessionId::new("s-approve");
    let session = worker
        .start::<Message>(
            StartOptions::new()
                .with_id(session_id.clone())
                .with_messages(vec![Message::user("Refund the double charge on o-17.")]),
        )
        .await
        .expect("start s-approve");
    let journal = session.journal().with_reasoning(REASONING);
    let refund = awaiting(
        journal
            .tool(&refund(), refund_args())
            .require_approval(request("policy: refunds", None))
            .run(ran)
            .await,
    );
    let notify = awaiting(
        journal
            .tool(
                &notify(),
                json!({"to": "ann@example.com", "text": "Your refund is on its way."}),
            )
            .require_approval(request("policy: messages", None))
            .run(ran)
            .await,
    );
    session.await_approval().await.expect("await approval");

    let late_session = SessionId::new("s-late");
    let session = worker
        .start::<Message>(StartOptions::new().with_id(late_session.clone()))
        .await
        .expect("start s-late");
    let _: Value = session
        .journal()
        .tool(&read_order(), json!({"order_id": "o-17"}))
        .run(|_ctx| async { Ok::<_, String>(json!({"order_id": "o-17"})) })
        .await
        .expect("read_order runs");
    let late = awaiting(
        session
            .journal()
            .tool(&gift(), json!({"to": "ann@example.com"}))
            .require_approval(request("policy: gifts", Some(DEADLINE)))
            .run(ran)
            .await,
    );
    session.await_approval().await.expect("await approval");
    let read = store
        .calls(&late_session, None)
        .await
        .expect("calls")
        .into_iter()
        .find(|c| c.identity.tool == "read_order")
        .expect("read_order row")
        .id;
    Requests {
        session: session_id,
        refund,
        notify,
        late_session,
        late,
        read,
    }
}

/// Waits until the late request is past its deadline.
async fn past_deadline() {
    tokio::time::sleep(DEADLINE + Duration::from_millis(200)).await;
}

async fn row(store: &Arc<dyn CheckpointStore>, id: &CallId) -> CallRecord {
    store.call(id).await.expect("call")
}

async fn status(store: &Arc<dyn CheckpointStore>, session: &SessionId) -> SessionStatus {
    store.session(session).await.expect("session").status
}

#[track_caller]
fn no_secrets(what: &str, out: &Run) {
    for secret in [CARD, API_KEY] {
        assert!(
            !out.stdout.contains(secret) && !out.stderr.contains(secret),
            "{what} printed {secret}:\n{}\n{}",
            out.stdout,
            out.stderr
        );
    }
}

/// `durable approvals`: oldest first, every field, reasoning escaped, secrets masked,
/// the hint; `--json` whole; `--session`; the status filter.
pub async fn approvals_listing(store: &Arc<dyn CheckpointStore>, db: &str) {
    let r = requests(store).await;
    past_deadline().await;

    let out = run(db, &["approvals"]);
    let text = out.ok().to_owned();
    hardening::assert_run_safe("approvals", &out);
    no_secrets("approvals", &out);
    let at = |needle: &str| {
        text.find(needle)
            .unwrap_or_else(|| panic!("{needle:?} missing:\n{text}"))
    };
    // Oldest first.
    assert!(at(r.refund.as_str()) < at(r.notify.as_str()), "{text}");
    assert!(at(r.notify.as_str()) < at(r.late.as_str()), "{text}");
    for needle in [
        "session    s-approve (step ",
        "tool       refund (unsafe_on_replay)",
        "tool       notify_customer (unsafe_on_replay)",
        "by policy: refunds",
        "by policy: gifts",
        "deadline   none",
        "reasoning  The customer was charged twice.",
        "           Refund the second charge. \\e]0;pwned\\u{7}",
        "\"card\": \"<secret>\"",
        "\"api_key\": \"***\"",
        "\"amount\": 500",
        "Decide each one: durable approve <CALL>",
        "durable deny <CALL> --reason <TEXT>",
        "1 request is past the deadline: `durable approvals --expire` denies it",
    ] {
        at(needle);
    }
    let late_block = &text[at(r.late.as_str())..];
    assert!(
        late_block.contains("(expired ") && late_block.contains(" ago)"),
        "{late_block}"
    );
    assert!(
        !text[..at(r.late.as_str())].contains("(expired "),
        "only the late request is expired:\n{text}"
    );

    let out = run(db, &["approvals", "--json"]);
    no_secrets("approvals --json", &out);
    let listed = out.json();
    let listed = listed.as_array().expect("array");
    assert_eq!(listed.len(), 3, "{listed:?}");
    assert_eq!(listed[0]["id"], r.refund.as_str());
    assert_eq!(listed[0]["identity"]["session"], "s-approve");
    assert_eq!(listed[0]["identity"]["tool"], "refund");
    assert_eq!(listed[0]["class"], "unsafe_on_replay");
    assert_eq!(listed[0]["status"], "requested");
    assert_eq!(listed[0]["expired"], false);
    assert_eq!(listed[0]["approval"]["asked_by"], "policy: refunds");
    assert_eq!(listed[0]["approval"]["reasoning"], REASONING, "kept whole");
    assert_eq!(listed[0]["args"]["card"], "<secret>");
    assert_eq!(listed[0]["args"]["api_key"], "***");
    assert_eq!(listed[0]["args"]["amount"], 500);
    assert_eq!(listed[1]["id"], r.notify.as_str());
    assert_eq!(listed[2]["id"], r.late.as_str());
    assert_eq!(listed[2]["expired"], true);
    assert!(listed[2]["approval"]["deadline"].is_i64(), "{}", listed[2]);

    let one = run(db, &["approvals", "--session", "s-late", "--json"]).json();
    assert_eq!(one.as_array().map(Vec::len), Some(1), "{one}");
    assert_eq!(one[0]["id"], r.late.as_str());
    run(db, &["approvals", "--session", "s-nope"]).fails(3, "s-nope");

    // The sessions wait in their own status, which `sessions --status` filters on.
    let waiting = run(db, &["sessions", "--status", "awaiting_approval", "--json"]).json();
    let mut ids: Vec<&str> = waiting
        .as_array()
        .expect("array")
        .iter()
        .filter_map(|s| s["id"].as_str())
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, ["s-approve", "s-late"]);

    // `show` lists a session's requests too, masked.
    let out = run(db, &["show", "s-approve"]);
    no_secrets("show", &out);
    let text = out.ok();
    let section = text
        .find("Awaiting approval (2): `durable approvals --session s-approve`")
        .map(|at| &text[at..])
        .unwrap_or_else(|| panic!("no approval section:\n{text}"));
    for needle in [
        r.refund.as_str(),
        r.notify.as_str(),
        "\"card\":\"<secret>\"",
    ] {
        assert!(section.contains(needle), "{needle:?} missing:\n{section}");
    }
    let shown = run(db, &["show", "s-late", "--json"]).json();
    assert_eq!(
        shown["awaiting_approval"][0]["id"],
        r.late.as_str(),
        "{shown}"
    );

    // Listing changed nothing.
    assert_eq!(row(store, &r.refund).await.status, CallStatus::Requested);
    assert_eq!(
        status(store, &r.session).await,
        SessionStatus::AwaitingApproval
    );
}

/// `durable approve`: as requested, with an edit (refused with its path and nothing
/// decided; then accepted, masked values kept as shown), and the session active again.
pub async fn approve(store: &Arc<dyn CheckpointStore>, db: &str) {
    let r = requests(store).await;
    let refund = r.refund.as_str();
    let requested_card = row(store, &r.refund).await.args["card"].clone();
    assert_ne!(requested_card, json!(CARD), "the card is stored masked");

    // As requested.
    let out = run(
        db,
        &[
            "approve",
            r.notify.as_str(),
            "--note",
            "checked the text",
            "--by",
            "alice",
        ],
    );
    let text = out.ok();
    assert!(
        text.contains(&format!(
            "approved call `{}` (`notify_customer` in session `s-approve`) as requested, by alice",
            r.notify
        )),
        "{text}"
    );
    assert!(
        text.contains("the next resume runs the call once with these arguments"),
        "{text}"
    );
    assert!(
        text.contains("session `s-approve` still awaits 1 decision"),
        "{text}"
    );
    let notify = row(store, &r.notify).await;
    assert_eq!(notify.status, CallStatus::Approved);
    let decided = notify
        .approval
        .and_then(|a| a.decision)
        .expect("a decision");
    assert_eq!(decided.by, "alice");
    assert_eq!(decided.note.as_deref(), Some("checked the text"));
    assert_eq!(decided.decision, ApprovalDecision::Approve { args: None });
    assert_eq!(
        status(store, &r.session).await,
        SessionStatus::AwaitingApproval
    );

    // Edits the tool does not accept: the path, exit 5, nothing decided.
    for (edit, needle) in [
        (
            json!({"order_id": "o-17", "amount": "fifty", "card": "<secret>"}),
            "edited arguments refused at $.amount:",
        ),
        (
            json!({"order_id": "o-17", "amount": 50, "card": "<secret>", "tip": 5}),
            "edited arguments refused at $:",
        ),
        (
            json!({"order_id": "o-17", "amount": 50, "card": "4242-4242"}),
            "edited arguments refused at $.card: a secret argument cannot be edited",
        ),
        (
            json!([1, 2]),
            "edited arguments refused at $: the arguments must be a JSON object",
        ),
    ] {
        let out = run(db, &["approve", refund, "--args", &edit.to_string()]);
        out.fails(5, needle);
        assert!(out.stderr.contains("nothing was decided"), "{}", out.stderr);
        no_secrets("approve --args", &out);
    }
    run(db, &["approve", refund, "--args", "{\"amount\": "]).fails(5, "--args is not valid JSON");
    run(db, &["approve", refund, "--args", "@/no/such/edit.json"])
        .fails(5, "cannot read --args file `/no/such/edit.json`");
    assert_eq!(row(store, &r.refund).await.status, CallStatus::Requested);
    assert!(
        store
            .approvals(&r.session)
            .await
            .expect("log")
            .iter()
            .all(|a| a.call != r.refund || a.event == durable::store::ApprovalEvent::Requested),
        "no decision logged for the refund"
    );

    // A valid edit from a file, the masked values kept as `approvals` shows them.
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("edit.json");
    std::fs::write(
        &file,
        json!({"order_id": "o-17", "amount": 50, "card": "<secret>", "api_key": "***"}).to_string(),
    )
    .expect("write edit");
    let arg = format!("@{}", file.display());
    let out = run(db, &["approve", refund, "--args", &arg]);
    no_secrets("approve", &out);
    let text = out.ok();
    assert!(
        text.contains(&format!(
            "approved call `{refund}` (`refund` in session `s-approve`) with edited arguments, by test-operator"
        )),
        "{text}"
    );
    let line = |label: &str| {
        text.lines()
            .find(|l| l.trim_start().starts_with(label))
            .unwrap_or_else(|| panic!("no {label} line:\n{text}"))
            .to_owned()
    };
    assert!(line("requested  {").contains("\"amount\":500"), "{text}");
    assert!(line("approved   {").contains("\"amount\":50,"), "{text}");
    assert!(
        line("approved   {").contains("\"card\":\"<secret>\""),
        "{text}"
    );
    assert!(
        text.contains("the next resume runs the call once with the approved arguments"),
        "{text}"
    );
    assert!(
        text.contains("session `s-approve` is active again"),
        "{text}"
    );
    let approved = row(store, &r.refund).await;
    assert_eq!(approved.status, CallStatus::Approved);
    let edited = approved
        .approval
        .as_ref()
        .and_then(|a| a.edited_args())
        .expect("edited arguments recorded");
    assert_eq!(
        edited,
        &json!({"order_id": "o-17", "amount": 50, "card": requested_card, "api_key": API_KEY}),
        "placeholders put back to the recorded values"
    );
    assert_eq!(approved.args, row(store, &r.refund).await.args);
    assert_eq!(approved.args["amount"], 500, "the row keeps the request");
    // `calls` shows both sets of arguments, labelled, in the table and in JSON.
    let out = run(db, &["calls", "s-approve"]);
    no_secrets("calls", &out);
    let text = out.ok().to_owned();
    let labelled = |label: &str| {
        text.lines()
            .find(|l| l.trim_start().starts_with(label))
            .unwrap_or_else(|| panic!("no {label} line:\n{text}"))
            .to_owned()
    };
    assert!(
        labelled("requested arguments").contains("\"amount\":500"),
        "{text}"
    );
    assert!(
        labelled("approved (edited) arguments").contains("\"amount\":50,"),
        "{text}"
    );
    let rows = run(db, &["calls", "s-approve", "--json"]).json();
    let refund_row = rows
        .as_array()
        .expect("array")
        .iter()
        .find(|c| c["id"] == json!(r.refund.as_str()))
        .expect("the refund's row")
        .clone();
    assert_eq!(refund_row["requested_args"]["amount"], 500, "{refund_row}");
    assert_eq!(refund_row["approved_args"]["amount"], 50, "{refund_row}");
    assert_eq!(
        refund_row["approved_args"]["card"], "<secret>",
        "{refund_row}"
    );

    // The last decision: the session is active again, without a lease.
    assert_eq!(status(store, &r.session).await, SessionStatus::Active);
    let shown = run(db, &["show", "s-approve", "--json"]).json();
    assert_eq!(shown["session"]["status"], "active", "{shown}");
    assert!(shown["session"]["lease_owner"].is_null(), "{shown}");
    assert_eq!(shown["awaiting_approval"], json!([]), "{shown}");
    assert!(
        run(db, &["approvals", "--json"])
            .json()
            .as_array()
            .expect("array")
            .iter()
            .all(|p| p["identity"]["session"] != "s-approve")
    );

    // An approved call that has not run can be revoked (when it cannot run as approved):
    // denied, with the reason as what the model reads.
    let out = run(
        db,
        &[
            "deny",
            refund,
            "--revoke",
            "--reason",
            "the order was refunded by phone",
            "--json",
        ],
    )
    .json();
    assert_eq!(out["status"], "denied", "{out}");
    let revoked = row(store, &r.refund).await;
    assert_eq!(revoked.status, CallStatus::Denied);
    assert!(matches!(
        revoked
            .approval
            .and_then(|a| a.decision)
            .map(|d| d.decision),
        Some(ApprovalDecision::Revoke { .. })
    ));
}

/// `durable deny`, and every decision refused: empty reasons, decided calls (with their
/// status and who decided), a call that never needed a decision, an expired request, an
/// unknown call.
pub async fn deny_and_refusals(store: &Arc<dyn CheckpointStore>, db: &str) {
    let r = requests(store).await;
    let notify = r.notify.as_str();
    let refund = r.refund.as_str();

    for reason in ["", "   "] {
        run(db, &["deny", notify, "--reason", reason]).fails(5, "a denial needs a reason");
    }
    run(db, &["deny", notify]).fails(2, "--reason");
    assert_eq!(row(store, &r.notify).await.status, CallStatus::Requested);

    let out = run(
        db,
        &[
            "deny",
            notify,
            "--reason",
            "Do not message the customer twice.",
            "--by",
            "bob",
            "--note",
            "ticket 12",
            "--json",
        ],
    )
    .json();
    assert_eq!(out["call"], notify, "{out}");
    assert_eq!(out["status"], "denied", "{out}");
    assert_eq!(out["by"], "bob");
    assert_eq!(out["reason"], "Do not message the customer twice.");
    assert_eq!(
        out["result"]["message"],
        "not run: denied by bob: Do not message the customer twice."
    );
    assert_eq!(out["session_status"], "awaiting_approval", "{out}");
    assert_eq!(out["session_awaiting"], 1, "{out}");
    let denied = row(store, &r.notify).await;
    assert_eq!(denied.status, CallStatus::Denied);
    assert_eq!(
        denied.error.as_ref().and_then(|e| e["denied"].as_str()),
        Some("Do not message the customer twice.")
    );

    // Decided already: refused with its status and who decided, whatever is asked.
    for args in [
        &["deny", notify, "--reason", "again"][..],
        &["deny", notify, "--revoke", "--reason", "again"][..],
        &["approve", notify],
    ] {
        run(db, args).fails(
            4,
            "is not awaiting approval (status `denied`): it was already denied by bob",
        );
    }

    // Revoking is for an approved call that has not run; a requested one is denied.
    run(db, &["deny", refund, "--revoke", "--reason", "x"])
        .fails(4, "is not awaiting approval (status `requested`)");

    // Text output of a denial.
    let reason = "Refunds above 100 need a ticket.";
    let out = run(db, &["deny", refund, "--reason", reason]);
    let text = out.ok();
    assert!(
        text.contains(&format!(
            "denied call `{refund}` (`refund` in session `s-approve`), by test-operator: it never runs"
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!("not run: denied by test-operator: {reason}")),
        "{text}"
    );
    assert!(
        text.contains("session `s-approve` is active again"),
        "{text}"
    );
    assert_eq!(status(store, &r.session).await, SessionStatus::Active);
    run(db, &["approve", refund, "--json"]).fails(4, "(status `denied`)");

    // Never needed a decision; unknown.
    run(db, &["approve", r.read.as_str()]).fails(
        4,
        "is not awaiting approval (status `completed`): it never needed a decision",
    );
    run(db, &["deny", "no-such-call", "--reason", "x"]).fails(3, "call `no-such-call` not found");

    // Past its deadline: only an expiry may decide it.
    past_deadline().await;
    for args in [
        &["approve", r.late.as_str()][..],
        &["deny", r.late.as_str(), "--reason", "too late"],
    ] {
        run(db, args).fails(
            4,
            "can no longer be approved or denied; `durable approvals --expire`",
        );
    }
    assert_eq!(row(store, &r.late).await.status, CallStatus::Requested);

    // Approved: refused as approved.
    let r2 = requests_again(store).await;
    run(db, &["approve", r2.as_str()]).ok();
    run(db, &["deny", r2.as_str(), "--reason", "no"]).fails(
        4,
        "is not awaiting approval (status `approved`): it was already approved by test-operator",
    );
}

/// One more requested call, in a session of its own.
async fn requests_again(store: &Arc<dyn CheckpointStore>) -> CallId {
    let worker = Durable::builder(Arc::clone(store))
        .owner("worker-b")
        .build();
    let session = worker
        .start::<Message>(StartOptions::new().with_id(SessionId::new("s-again")))
        .await
        .expect("start s-again");
    let call = awaiting(
        session
            .journal()
            .tool(&notify(), json!({"to": "bo@example.com", "text": "hi"}))
            .require_approval(request("policy: messages", None))
            .run(|_ctx| async { Ok::<Value, String>(json!("ran")) })
            .await,
    );
    session.await_approval().await.expect("await approval");
    call
}

/// `durable approvals --expire`: denies the request past its deadline by the deadline,
/// leaves the others, and returns its session to active.
pub async fn expire(store: &Arc<dyn CheckpointStore>, db: &str) {
    let r = requests(store).await;
    // Before the deadline nothing expires.
    let early = run(db, &["approvals", "--expire", "--json"]).json();
    assert_eq!(
        early["expired"].as_array().map(Vec::len),
        Some(0),
        "{early}"
    );
    assert_eq!(early["still_awaiting"], 3, "{early}");
    assert_eq!(row(store, &r.late).await.status, CallStatus::Requested);

    past_deadline().await;
    let out = run(db, &["approvals", "--expire"]);
    hardening::assert_run_safe("approvals --expire", &out);
    let text = out.ok();
    assert!(text.contains(r.late.as_str()), "{text}");
    assert!(
        text.contains("expired 1 request: denied by the deadline"),
        "{text}"
    );
    assert!(text.contains("2 requests still await a decision"), "{text}");
    let late = row(store, &r.late).await;
    assert_eq!(late.status, CallStatus::Denied);
    let decided = late.approval.and_then(|a| a.decision).expect("decided");
    assert_eq!(decided.decision, ApprovalDecision::Expire);
    assert_eq!(decided.by, "deadline");
    assert_eq!(status(store, &r.late_session).await, SessionStatus::Active);
    assert_eq!(
        status(store, &r.session).await,
        SessionStatus::AwaitingApproval
    );
    assert_eq!(row(store, &r.refund).await.status, CallStatus::Requested);

    let again = run(db, &["approvals", "--expire", "--json"]).json();
    assert_eq!(
        again["expired"].as_array().map(Vec::len),
        Some(0),
        "{again}"
    );
    assert_eq!(again["still_awaiting"], 2);
    let text = run(db, &["approvals", "--expire"]).ok().to_owned();
    assert!(text.contains("nothing was expired"), "{text}");
    let listed = run(db, &["approvals"]).ok().to_owned();
    assert!(!listed.contains(r.late.as_str()), "{listed}");
    assert!(!listed.contains("past the deadline"), "{listed}");
}
