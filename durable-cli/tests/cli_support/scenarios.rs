//! Every subcommand against a populated store, and the end-to-end resolve: one function
//! per scenario, run by each backend's test file.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use durable::Message;
use durable::replay_check::Fixture;
use durable::store::{CallStatus, SessionStatus};
use durable::{CheckpointStore, DurableError, SessionId};
use serde_json::Value;

use super::{AgentEnd, populate, run, run_agent};

pub async fn sessions(store: &Arc<dyn CheckpointStore>, db: &str) {
    let p = populate(store).await;
    let table = run(db, &["sessions"]);
    let out = table.ok();
    for (id, status) in [
        (&p.done, "completed"),
        (&p.doubt, "active"),
        (&p.live, "active"),
        (&p.cancelled, "cancelled"),
    ] {
        let line = out
            .lines()
            .find(|l| l.starts_with(id.as_str()))
            .unwrap_or_else(|| panic!("no row for {id}:\n{out}"));
        assert!(line.contains(status), "{line}");
    }
    assert!(out.starts_with("SESSION"), "{out}");
    let live = out
        .lines()
        .find(|l| l.starts_with("s-live"))
        .expect("s-live");
    assert!(live.contains("worker-2 (live"), "{live}");
    assert!(live.contains("shop/2"), "{live}");

    let listed = run(db, &["sessions", "--json"]).json();
    let rows = listed.as_array().expect("array");
    assert_eq!(rows.len(), 4);
    let in_doubt = |id: &SessionId| {
        rows.iter()
            .find(|r| r["id"] == id.as_str())
            .map(|r| r["in_doubt"].clone())
    };
    assert_eq!(in_doubt(&p.doubt), Some(1.into()));
    assert_eq!(in_doubt(&p.cancelled), Some(1.into()));
    assert_eq!(
        in_doubt(&p.live),
        Some(0.into()),
        "a live call is not in doubt"
    );
    assert_eq!(in_doubt(&p.done), Some(0.into()));
    let done = rows.iter().find(|r| r["id"] == "s-done").expect("s-done");
    assert_eq!(done["latest_version"], 3);
    assert!(done["last_checkpoint_at"].is_i64());

    let active = run(db, &["sessions", "--status", "active", "--json"]).json();
    let ids: Vec<&str> = active
        .as_array()
        .expect("array")
        .iter()
        .filter_map(|r| r["id"].as_str())
        .collect();
    assert_eq!(ids.len(), 2, "{ids:?}");
    assert!(ids.contains(&"s-doubt") && ids.contains(&"s-live"));
    let terminal = run(
        db,
        &["sessions", "--status", "completed,cancelled", "--json"],
    )
    .json();
    assert_eq!(terminal.as_array().map(Vec::len), Some(2));
    let old = run(db, &["sessions", "--older-than", "1h"]);
    assert_eq!(old.ok().trim(), "no sessions match");
    let recent = run(
        db,
        &["sessions", "--newer-than", "1h", "--limit", "3", "--json"],
    )
    .json();
    assert_eq!(recent.as_array().map(Vec::len), Some(3));
}

pub async fn show(store: &Arc<dyn CheckpointStore>, db: &str) {
    let p = populate(store).await;
    let out = run(db, &["show", p.done.as_str()]);
    let text = out.ok();
    for needle in [
        "session      s-done",
        "status       completed",
        "app version  shop/1",
        "Checkpoints",
        "Plan (version 3)",
        "# Plan: Confirm order o-17",
        "1. [x] Read the order",
        "evidence: read_order: 1200 cents",
        "Budget (version 3)",
        "Transcript (version 3, 5 messages)",
        "-> read_order({\"order_id\":\"o-17\"}) [c1]",
        "<- [c2] {\"charge\":\"ch_charge:o-17\"}",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
    // One row per checkpoint, newest first.
    let versions: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("VERSION"))
        .skip(2)
        .take_while(|l| !l.is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(versions, ["3", "2", "1", "0"], "{text}");

    let v0 = run(
        db,
        &["show", p.done.as_str(), "--version", "0", "--tail", "1"],
    );
    let text = v0.ok();
    assert!(
        text.contains("Transcript (version 0, last 1 of 2 messages)"),
        "{text}"
    );
    assert!(text.contains("Confirm order o-17 for Ann."), "{text}");
    assert!(!text.contains("You confirm orders."), "{text}");

    let json = run(
        db,
        &["show", p.done.as_str(), "--json", "--checkpoints", "2"],
    )
    .json();
    assert_eq!(json["version"], 3);
    assert_eq!(json["message_count"], 5);
    assert_eq!(json["checkpoints"].as_array().map(Vec::len), Some(2));
    assert_eq!(
        json["checkpoints"][0]["plan_progress"],
        "1/2 steps, 0/1 checks"
    );
    assert_eq!(json["plan"]["objective"], "Confirm order o-17");

    // In-doubt calls and their masked arguments appear in `show` too.
    let doubt = run(db, &["show", p.doubt.as_str()]);
    let text = doubt.ok();
    assert!(text.contains("In doubt (1)"), "{text}");
    assert!(text.contains(p.doubt_call.id.as_str()), "{text}");
    assert!(
        !text.contains("tok-live-123") && !text.contains("8812"),
        "{text}"
    );
}

pub async fn calls(store: &Arc<dyn CheckpointStore>, db: &str) {
    let p = populate(store).await;
    let out = run(db, &["calls", p.done.as_str()]);
    let text = out.ok();
    assert!(text.starts_with("CALL"), "{text}");
    let charge = text
        .lines()
        .find(|l| l.contains("charge_card"))
        .expect("charge_card row");
    for needle in ["idempotent_with_key", "completed", "charge:o-17", " 1 "] {
        assert!(charge.contains(needle), "{needle:?} in {charge}");
    }
    assert!(
        text.contains("read_order") && text.contains("@model"),
        "{text}"
    );

    let step1 = run(db, &["calls", p.done.as_str(), "--step", "1", "--json"]).json();
    let tools: Vec<&str> = step1
        .as_array()
        .expect("array")
        .iter()
        .filter_map(|c| c["identity"]["tool"].as_str())
        .collect();
    assert_eq!(tools, ["charge_card"]);

    let doubt = run(db, &["calls", p.doubt.as_str()]);
    assert!(doubt.ok().contains("issued (in doubt)"), "{}", doubt.stdout);
    let live = run(db, &["calls", p.live.as_str()]);
    let live_text = live.ok();
    assert!(
        live_text.contains("issued") && !live_text.contains("in doubt"),
        "{live_text}"
    );
    let json = run(db, &["calls", p.doubt.as_str(), "--json"]).json();
    assert_eq!(json[0]["args"]["body"], "<secret>");
    assert_eq!(json[0]["args"]["auth"]["token"], "***");
    assert_eq!(json[0]["args"]["to"], "ann@example.com");
}

pub async fn in_doubt(store: &Arc<dyn CheckpointStore>, db: &str) {
    let p = populate(store).await;
    let out = run(db, &["in-doubt"]);
    let text = out.ok();
    assert!(text.contains(p.doubt_call.id.as_str()), "{text}");
    assert!(
        !text.contains(p.live_call.id.as_str()),
        "a live call is not in doubt: {text}"
    );
    assert!(
        text.contains("send_email") && text.contains("unsafe_on_replay"),
        "{text}"
    );
    assert!(text.contains("\"body\":\"<secret>\""), "{text}");
    assert!(text.contains("\"token\":\"***\""), "{text}");
    assert!(
        !text.contains("tok-live-123") && !text.contains("8812"),
        "{text}"
    );
    assert!(text.contains("durable resolve <CALL>"), "{text}");

    let json = run(db, &["in-doubt", "--json"]).json();
    assert_eq!(
        json.as_array().map(Vec::len),
        Some(2),
        "s-doubt and s-cancelled"
    );
    let one = run(db, &["in-doubt", "--session", p.doubt.as_str(), "--json"]).json();
    assert_eq!(one.as_array().map(Vec::len), Some(1));
    assert_eq!(one[0]["id"], p.doubt_call.id.as_str());
    assert!(!one.to_string().contains("tok-live-123"));

    let none = run(db, &["in-doubt", "--session", p.done.as_str()]);
    assert_eq!(none.ok().trim(), "no calls in doubt");
}

pub async fn resolve_refusals(store: &Arc<dyn CheckpointStore>, db: &str) {
    let p = populate(store).await;
    let call = p.doubt_call.id.as_str();
    run(db, &["resolve", "no-such-call", "--did-not-happen"])
        .fails(3, "call `no-such-call` not found");
    run(
        db,
        &["resolve", call, "--happened", "--result", "{\"id\": "],
    )
    .fails(5, "--result is not valid JSON");
    run(
        db,
        &[
            "resolve",
            call,
            "--happened",
            "--result",
            "{\"a\": 1, \"a\": 2}",
        ],
    )
    .fails(5, "appears more than once");
    run(
        db,
        &[
            "resolve",
            call,
            "--happened",
            "--result",
            "@/no/such/file.json",
        ],
    )
    .fails(5, "cannot read --result file `/no/such/file.json`");
    run(db, &["resolve", call]).fails(2, "--happened");
    run(db, &["resolve", call, "--happened"]).fails(2, "--result");
    run(db, &["resolve", call, "--did-not-happen", "--result", "{}"])
        .fails(2, "cannot be used with");
    run(
        db,
        &["resolve", p.live_call.id.as_str(), "--did-not-happen"],
    )
    .fails(
        4,
        "is still running: session `s-live` is leased by `worker-2`",
    );
    let done_rows = store.calls(&p.done, None).await.expect("calls");
    let completed = done_rows
        .iter()
        .find(|c| c.identity.tool == "charge_card")
        .expect("charge");
    run(db, &["resolve", completed.id.as_str(), "--did-not-happen"]).fails(
        4,
        "is not in doubt: its outcome is recorded (status `completed`)",
    );
    // Nothing was changed by the refusals.
    let still = store.call(&p.doubt_call.id).await.expect("call");
    assert_eq!(still.status, CallStatus::Issued);

    // A result read from a file; then the call is no longer in doubt.
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("result.json");
    std::fs::write(&file, "{\"id\": \"m-from-file\"}\n").expect("write");
    let at_file = format!("@{}", file.display());
    let resolved = run(
        db,
        &[
            "resolve",
            call,
            "--happened",
            "--result",
            &at_file,
            "--json",
        ],
    )
    .json();
    assert_eq!(resolved["status"], "resolved");
    assert_eq!(resolved["by"], "test-operator", "--by defaults to $USER");
    let row = store.call(&p.doubt_call.id).await.expect("call");
    assert_eq!(row.result, Some(serde_json::json!({"id": "m-from-file"})));
    run(db, &["resolve", call, "--did-not-happen"]).fails(4, "is not in doubt");

    // `--did-not-happen` on the cancelled session's call, audited with a note.
    let cancelled = store.in_doubt(Some(&p.cancelled)).await.expect("in doubt");
    let text = run(
        db,
        &[
            "resolve",
            cancelled[0].id.as_str(),
            "--did-not-happen",
            "--note",
            "not in the outbox",
            "--by",
            "bob",
        ],
    );
    assert!(
        text.ok().contains("as not happened, by bob"),
        "{}",
        text.stdout
    );
    let audit = store.resolutions(&p.cancelled).await.expect("audit");
    assert_eq!(audit.len(), 1);
    assert_eq!(audit[0].by, "bob");
    assert_eq!(audit[0].note.as_deref(), Some("not in the outbox"));
}

/// The agent crashes after its email left; resume refuses to send it again; the operator
/// resolves it as sent; the next resume continues with that result and sends nothing.
pub async fn resolve_end_to_end(store: &Arc<dyn CheckpointStore>, db: &str) {
    let id = SessionId::new("agent-e2e");
    let sent = AtomicUsize::new(0);
    assert!(matches!(
        run_agent(store, &id, &sent, true).await,
        AgentEnd::Crashed
    ));
    assert_eq!(sent.load(Ordering::SeqCst), 1, "the email left once");

    match run_agent(store, &id, &sent, false).await {
        AgentEnd::Refused(DurableError::ReplayUnsafe { tool, .. }) => {
            assert_eq!(tool, "send_email")
        }
        other => panic!("resume must refuse the in-doubt email, got {other:?}"),
    }
    assert_eq!(
        sent.load(Ordering::SeqCst),
        1,
        "nothing was sent on the refused resume"
    );

    let doubt = run(db, &["in-doubt", "--session", id.as_str(), "--json"]).json();
    let call = doubt[0]["id"].as_str().expect("call id").to_owned();
    assert_eq!(doubt[0]["identity"]["tool"], "send_email");
    let out = run(
        db,
        &[
            "resolve",
            &call,
            "--happened",
            "--result",
            "{\"id\": \"m-77\"}",
            "--note",
            "found in the outbox",
            "--by",
            "alice",
        ],
    );
    let text = out.ok();
    assert!(
        text.contains(&format!(
            "resolved call `{call}` (`send_email` in session `agent-e2e`) as happened, by alice"
        )),
        "{text}"
    );

    match run_agent(store, &id, &sent, false).await {
        AgentEnd::Completed(result) => assert_eq!(result, serde_json::json!({"id": "m-77"})),
        other => panic!("the resumed agent must complete, got {other:?}"),
    }
    assert_eq!(
        sent.load(Ordering::SeqCst),
        1,
        "the resolved email was not sent again"
    );

    let checkpoint = store.load_checkpoint(&id, None).await.expect("checkpoint");
    let messages: Vec<Message> = checkpoint
        .messages
        .iter()
        .map(|m| m.decode().expect("message"))
        .collect();
    let texts: Vec<String> = messages.iter().map(Message::text).collect();
    assert!(
        texts.iter().any(|t| t.contains("message m-77")),
        "the agent continued with the operator's result: {texts:?}"
    );
    assert_eq!(
        store.session(&id).await.expect("session").status,
        SessionStatus::Completed
    );
    let shown = run(db, &["show", id.as_str()]);
    let text = shown.ok();
    assert!(text.contains("Resolutions"), "{text}");
    assert!(
        text.contains("happened {\"id\":\"m-77\"}") && text.contains("alice"),
        "{text}"
    );
    assert!(text.contains("found in the outbox"), "{text}");
    assert_eq!(run(db, &["in-doubt"]).ok().trim(), "no calls in doubt");
}

pub async fn fork(store: &Arc<dyn CheckpointStore>, db: &str) {
    let p = populate(store).await;
    let out = run(
        db,
        &[
            "fork",
            p.done.as_str(),
            "--from-version",
            "1",
            "--to",
            "s-fork",
        ],
    );
    assert!(
        out.ok()
            .contains("forked session `s-done` at version 1 into `s-fork`"),
        "{}",
        out.stdout
    );
    let cp = store
        .load_checkpoint(&SessionId::new("s-fork"), None)
        .await
        .expect("fork checkpoint");
    let original = store
        .load_checkpoint(&p.done, Some(1))
        .await
        .expect("version 1");
    assert_eq!(cp.meta.version, 0);
    assert_eq!(cp.messages, original.messages);
    assert_eq!(cp.plan, original.plan);
    let record = store
        .session(&SessionId::new("s-fork"))
        .await
        .expect("fork");
    assert_eq!(record.status, SessionStatus::Active);
    assert!(
        record.lease_expires_at.unwrap_or(0) <= store.now().await.expect("now"),
        "the fork's lease is given back"
    );

    let random = run(
        db,
        &["fork", p.done.as_str(), "--from-version", "0", "--json"],
    )
    .json();
    assert_eq!(random["latest_version"], 0);
    assert_ne!(random["id"], "s-fork");

    run(
        db,
        &[
            "fork",
            p.done.as_str(),
            "--from-version",
            "1",
            "--to",
            "s-fork",
        ],
    )
    .fails(4, "session `s-fork` already exists");
    run(db, &["fork", p.done.as_str(), "--from-version", "9"])
        .fails(3, "has no checkpoint version 9");
    run(db, &["fork", "nope", "--from-version", "0"]).fails(3, "session `nope` not found");
    run(db, &["fork", p.done.as_str()]).fails(2, "--from-version");
}

pub async fn export(store: &Arc<dyn CheckpointStore>, db: &str) {
    let p = populate(store).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let out_dir = dir.path().join("fixtures");
    let out = out_dir.to_str().expect("utf-8 path");
    let written = run(db, &["export", p.done.as_str(), "--out", out]);
    let text = written.ok();
    assert!(text.contains("wrote 4 fixtures (format 1)"), "{text}");
    let fixtures = Fixture::load_dir(&out_dir).expect("fixtures load");
    let versions: Vec<i64> = fixtures.iter().map(|f| f.version).collect();
    assert_eq!(versions, [0, 1, 2, 3]);
    assert!(
        fixtures
            .iter()
            .all(|f| f.session == p.done && f.format == 1)
    );
    let calls: usize = fixtures.iter().map(|f| f.calls.len()).sum();
    assert_eq!(
        calls,
        store.calls(&p.done, None).await.expect("calls").len(),
        "every journal row exactly once"
    );
    assert_eq!(fixtures[3].messages.len(), 5);
    assert!(
        out_dir.join("s-done.v000002.json").is_file(),
        "file names are documented"
    );

    let last_dir = dir.path().join("last");
    let json = run(
        db,
        &[
            "export",
            "--last",
            "2",
            "--out",
            last_dir.to_str().expect("utf-8"),
            "--json",
        ],
    )
    .json();
    assert_eq!(json["format"], 1);
    assert_eq!(json["files"].as_array().map(Vec::len), Some(2));
    assert_eq!(Fixture::load_dir(&last_dir).expect("load").len(), 2);

    run(db, &["export", "nope", "--out", out]).fails(3, "session `nope` not found");
    run(db, &["export", "--out", out]).fails(2, "<SESSION|--last <N>>");
    run(
        db,
        &["export", p.done.as_str(), "--last", "1", "--out", out],
    )
    .fails(2, "cannot be used with");
}

pub async fn prune(store: &Arc<dyn CheckpointStore>, db: &str) {
    let p = populate(store).await;
    let dry = run(db, &["prune", "--older-than", "0s", "--dry-run"]);
    let text = dry.ok();
    assert!(
        text.contains("s-done") && text.contains("would purge"),
        "{text}"
    );
    assert!(
        text.contains("s-cancelled") && text.contains("skipped: a call is in doubt"),
        "{text}"
    );
    assert!(
        !text.contains("s-doubt") && !text.contains("s-live"),
        "only terminal sessions: {text}"
    );
    assert!(
        text.contains("dry run: would purge 1 terminal session"),
        "{text}"
    );
    store
        .session(&p.done)
        .await
        .expect("a dry run deletes nothing");

    let kept = run(db, &["prune", "--older-than", "30d"]);
    assert!(
        kept.ok()
            .contains("purged 0 terminal sessions not updated for 30days"),
        "{}",
        kept.stdout
    );
    store
        .session(&p.done)
        .await
        .expect("inside the retention window");

    let json = run(db, &["prune", "--older-than", "0s", "--json"]).json();
    assert_eq!(json["purged"], 1);
    let outcomes: Vec<(&str, &str)> = json["sessions"]
        .as_array()
        .expect("array")
        .iter()
        .map(|s| {
            (
                s["session"].as_str().unwrap_or(""),
                s["outcome"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert!(outcomes.contains(&("s-done", "purged")), "{outcomes:?}");
    assert!(
        outcomes.contains(&("s-cancelled", "skipped: a call is in doubt")),
        "{outcomes:?}"
    );
    assert!(matches!(
        store.session(&p.done).await,
        Err(durable::StoreError::SessionNotFound(_))
    ));
    assert!(
        store
            .calls(&p.done, None)
            .await
            .map_or(true, |c| c.is_empty())
    );
    store
        .session(&p.cancelled)
        .await
        .expect("kept: a call is in doubt");

    run(db, &["prune"]).fails(2, "--older-than");
    run(db, &["prune", "--older-than", "soon"]).fails(2, "expected a number and a unit");
}

pub async fn retarget(store: &Arc<dyn CheckpointStore>, db: &str) {
    let p = populate(store).await;
    let id = p.doubt.as_str();
    let dry = run(
        db,
        &[
            "retarget",
            id,
            "--app-version",
            "shop/2",
            "--map",
            "send_email=email_customer",
            "--dry-run",
        ],
    );
    let text = dry.ok();
    assert!(
        text.contains("would move from app version `shop/1` to `shop/2`"),
        "{text}"
    );
    assert!(
        text.contains("send_email -> email_customer: 1 journal row (1 in flight)"),
        "{text}"
    );
    assert_eq!(
        store.session(&p.doubt).await.expect("s").app_version,
        "shop/1"
    );

    let json = run(
        db,
        &[
            "retarget",
            id,
            "--app-version",
            "shop/2",
            "--map",
            "send_email=email_customer",
            "--by",
            "carol",
            "--json",
        ],
    )
    .json();
    assert_eq!(json["session"]["app_version"], "shop/2");
    assert_eq!(json["by"], "carol");
    let rows = store.calls(&p.doubt, None).await.expect("calls");
    assert!(
        rows.iter().any(|r| r.identity.tool == "email_customer"),
        "{rows:?}"
    );
    assert!(!rows.iter().any(|r| r.identity.tool == "send_email"));

    run(db, &["retarget", "nope", "--app-version", "x"]).fails(3, "session `nope` not found");
    run(
        db,
        &["retarget", id, "--app-version", "x", "--map", "nonsense"],
    )
    .fails(2, "expected `old=new`");
    run(db, &["retarget", id]).fails(2, "--app-version");
}

pub async fn unknown_things(store: &Arc<dyn CheckpointStore>, db: &str) {
    let p = populate(store).await;
    run(db, &["show", "nope"]).fails(3, "session `nope` not found");
    run(db, &["show", p.done.as_str(), "--version", "42"])
        .fails(3, "session `s-done` has no checkpoint version 42");
    run(db, &["calls", "nope"]).fails(3, "session `nope` not found");
    run(db, &["in-doubt", "--session", "nope"]).fails(3, "session `nope` not found");
    run(db, &["frobnicate"]).fails(2, "unrecognized subcommand");
    let _ = Value::Null;
}

pub async fn unpark(store: &Arc<dyn CheckpointStore>, db: &str) {
    let p = populate(store).await;
    let lease = store
        .acquire_lease(
            &p.doubt,
            "test-parker",
            std::time::Duration::from_secs(60),
            5,
        )
        .await
        .expect("lease");
    store
        .set_status(
            lease.fence(),
            SessionStatus::Parked,
            Some("recovery attempts exhausted (5)"),
        )
        .await
        .expect("park");
    let unparked = run(db, &["unpark", p.doubt.as_str()]);
    let text = unparked.ok();
    assert!(text.contains("unparked session"), "{text}");
    let record = store.session(&p.doubt).await.expect("session");
    assert_eq!(record.status, SessionStatus::Active);
    assert_eq!(record.status_reason, None);
    run(db, &["unpark", p.doubt.as_str()]).fails(4, "not parked");
    run(db, &["unpark", p.done.as_str()]).fails(4, "is completed, not parked");
    run(db, &["unpark", "no-such-session"]).fails(3, "not found");
}
