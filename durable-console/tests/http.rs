//! The console over plain HTTP (no browser): the token, the login cookie, CSRF, the
//! confirmation step, escaping, masking and the read-only mode, the approvals inbox,
//! against a real SQLite store file.

mod support;

use std::sync::Arc;

use axum::body::Body;
use axum::http::{StatusCode, header};
use durable::store::{ApprovalEvent, CallStatus, SessionStatus};
use serde_json::json;
use support::http::{bearer, csrf_of, get, login, page_of, post, send};
use support::{OPERATOR, SCRIPT, awaiting_approval, options, scenario};

#[tokio::test]
async fn every_request_needs_the_token() {
    let s = scenario().await;
    let app = durable_console::router(Arc::clone(&s.store), options());
    // A browser without the cookie is sent to the login form; nothing is shown.
    for path in ["/", "/sessions/s-doubt", "/in-doubt"] {
        let reply = send(&app, get(path).body(Body::empty()).expect("request")).await;
        assert_eq!(reply.status, StatusCode::SEE_OTHER, "{path}");
        assert_eq!(
            reply.headers.get(header::LOCATION).map(|v| v.as_bytes()),
            Some(&b"/login"[..])
        );
        assert!(!reply.body.contains("s-doubt"), "{}", reply.body);
    }
    let wrong = get("/")
        .header(header::AUTHORIZATION, "Bearer nope")
        .body(Body::empty())
        .expect("request");
    assert_eq!(send(&app, wrong).await.status, StatusCode::UNAUTHORIZED);
    let forged = get("/")
        .header(header::COOKIE, "durable_console=0123")
        .body(Body::empty())
        .expect("request");
    assert_eq!(send(&app, forged).await.status, StatusCode::SEE_OTHER);
    // A POST without credentials is refused and changes nothing.
    let call = format!("/in-doubt/{}/resolve", s.doubt_call.id);
    let reply = send(
        &app,
        post(&call, None, &[("decision", "did_not_happen"), ("by", "x")]),
    )
    .await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
    let bad_login = send(&app, post("/login", None, &[("token", "guess")])).await;
    assert_eq!(bad_login.status, StatusCode::UNAUTHORIZED);
    assert!(bad_login.headers.get(header::SET_COOKIE).is_none());

    let reply = send(&app, bearer("/")).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(reply.body.contains("s-doubt"), "{}", reply.body);
    let csp = reply
        .headers
        .get(header::CONTENT_SECURITY_POLICY)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    assert!(csp.contains("default-src 'none'"), "{csp}");
    assert!(!csp.contains("script-src"), "no script may run: {csp}");

    let cookie = login(&app).await;
    let reply = send(
        &app,
        get("/")
            .header(header::COOKIE, &cookie)
            .body(Body::empty())
            .expect("request"),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    // Logging out ends the cookie's session.
    let csrf = csrf_of(&app, &cookie, "/").await;
    let out = send(&app, post("/logout", Some(&cookie), &[("csrf", &csrf)])).await;
    assert_eq!(out.status, StatusCode::SEE_OTHER);
    let after = send(
        &app,
        get("/")
            .header(header::COOKIE, &cookie)
            .body(Body::empty())
            .expect("request"),
    )
    .await;
    assert_eq!(after.status, StatusCode::SEE_OTHER);
}

#[tokio::test]
async fn changes_need_the_csrf_token_and_a_confirmation() {
    let s = scenario().await;
    let app = durable_console::router(Arc::clone(&s.store), options());
    let cookie = login(&app).await;
    let csrf = csrf_of(&app, &cookie, "/in-doubt").await;
    let resolve = format!("/in-doubt/{}/resolve", s.doubt_call.id);
    let decision = [("decision", "did_not_happen"), ("by", OPERATOR)];
    let still_in_doubt = || async {
        assert_eq!(
            s.store.call(&s.doubt_call.id).await.expect("call").status,
            CallStatus::Issued
        );
    };

    let missing = send(&app, post(&resolve, Some(&cookie), &decision)).await;
    assert_eq!(missing.status, StatusCode::FORBIDDEN, "{}", missing.body);
    assert!(
        missing.body.contains("CSRF token is missing or wrong"),
        "{}",
        missing.body
    );
    still_in_doubt().await;

    let mut wrong = decision.to_vec();
    wrong.push(("csrf", "00ff"));
    let reply = send(&app, post(&resolve, Some(&cookie), &wrong)).await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN);
    still_in_doubt().await;

    // Another login session's token is not this one's.
    let other = login(&app).await;
    let other_csrf = csrf_of(&app, &other, "/in-doubt").await;
    assert_ne!(other_csrf, csrf);
    let mut crossed = decision.to_vec();
    crossed.push(("csrf", &other_csrf));
    let reply = send(&app, post(&resolve, Some(&cookie), &crossed)).await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN);
    still_in_doubt().await;

    // The right token, sent from another site: refused.
    let mut good = decision.to_vec();
    good.push(("csrf", &csrf));
    let mut req = post(&resolve, Some(&cookie), &good);
    req.headers_mut().insert(
        header::ORIGIN,
        "http://evil.example".parse().expect("header"),
    );
    assert_eq!(send(&app, req).await.status, StatusCode::FORBIDDEN);
    still_in_doubt().await;

    // The confirmation says what will happen, and changes nothing.
    let confirm = format!("/in-doubt/{}/confirm", s.doubt_call.id);
    let reply = send(&app, post(&confirm, Some(&cookie), &good)).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert!(
        reply.body.contains(&format!(
            "Resolve call `{}` (`send_email` in session `s-doubt`) as not happened, by {OPERATOR}: the next resume runs the call again",
            s.doubt_call.id
        )),
        "{}",
        reply.body
    );
    still_in_doubt().await;

    // A malformed result is refused before anything is read or written.
    let happened = [
        ("decision", "happened"),
        ("result", "{\"id\": "),
        ("by", OPERATOR),
        ("csrf", &csrf),
    ];
    let reply = send(&app, post(&confirm, Some(&cookie), &happened)).await;
    assert_eq!(reply.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        reply.body.contains("the result is not valid JSON"),
        "{}",
        reply.body
    );

    let reply = send(&app, post(&resolve, Some(&cookie), &good)).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert!(
        reply.body.contains("as not happened, by console-op"),
        "{}",
        reply.body
    );
    assert_eq!(
        s.store.call(&s.doubt_call.id).await.expect("call").status,
        CallStatus::NotHappened
    );
    // Twice: the CLI's refusal.
    let again = send(&app, post(&resolve, Some(&cookie), &good)).await;
    assert_eq!(again.status, StatusCode::CONFLICT);
    assert!(
        again
            .body
            .contains("is not in doubt: it was already resolved as not happened"),
        "{}",
        again.body
    );

    // Happened, with a result: recorded as the call's result.
    let refund = format!("/in-doubt/{}/resolve", s.refund_call.id);
    let happened = [
        ("decision", "happened"),
        ("result", "{\"refund\": \"r-9\"}"),
        ("note", "in the provider's dashboard"),
        ("by", "alice"),
        ("csrf", &csrf),
    ];
    let reply = send(&app, post(&refund, Some(&cookie), &happened)).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert!(
        reply.body.contains("as happened, by alice: the next resume returns this result to the agent and runs nothing"),
        "{}",
        reply.body
    );
    let row = s.store.call(&s.refund_call.id).await.expect("call");
    assert_eq!(row.status, CallStatus::Resolved);
    assert_eq!(row.result, Some(serde_json::json!({"refund": "r-9"})));

    // Fork needs the token too, then works.
    let fork = "/sessions/s-done/fork";
    let reply = send(
        &app,
        post(fork, Some(&cookie), &[("version", "1"), ("to", "s-fork")]),
    )
    .await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN);
    let reply = send(
        &app,
        post(
            fork,
            Some(&cookie),
            &[("version", "1"), ("to", "s-fork"), ("csrf", &csrf)],
        ),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert!(
        reply
            .body
            .contains("forked session <code>s-done</code> at version 1 into <code>s-fork</code>"),
        "{}",
        reply.body
    );
    let forked = s
        .store
        .load_checkpoint(&durable::SessionId::new("s-fork"), None)
        .await;
    assert_eq!(forked.expect("the fork exists").meta.version, 0);
    // The page says what the fork did with the parent's effects, as the form did before.
    let plan = durable::store::ForkPlan::new(
        durable::SessionId::new("s-done"),
        1,
        &s.store
            .calls(&durable::SessionId::new("s-done"), None)
            .await
            .expect("calls"),
        &[],
    )
    .expect("plan");
    let said = if plan.entries.is_empty() {
        "the fork inherits nothing it could repeat"
    } else {
        "and what the fork does with each (a fork never repeats them)"
    };
    assert!(reply.body.contains(said), "{said}: {}", reply.body);
    let page = send(&app, bearer("/sessions/s-done?version=1")).await;
    assert!(page.body.contains(said), "{said}: {}", page.body);
}

#[tokio::test]
async fn store_text_is_escaped_and_secrets_masked() {
    let s = scenario().await;
    let app = durable_console::router(Arc::clone(&s.store), options());
    let escaped = "&lt;script&gt;alert(1)&lt;/script&gt;";
    for path in [
        "/sessions/s-doubt",
        "/in-doubt",
        "/sessions/s-doubt?version=0",
    ] {
        let reply = send(&app, bearer(path)).await;
        assert_eq!(reply.status, StatusCode::OK, "{path}: {}", reply.body);
        assert!(!reply.body.contains("<script"), "{path}: {}", reply.body);
        assert!(reply.body.contains(escaped), "{path}: {}", reply.body);
        assert!(
            !reply.body.contains("tok-live-123"),
            "{path} shows the token"
        );
    }
    let timeline = send(&app, bearer("/sessions/s-doubt")).await.body;
    assert!(
        timeline.contains("&quot;token&quot;:&quot;***&quot;"),
        "{timeline}"
    );
    assert!(
        timeline.contains("&quot;body&quot;:&quot;&lt;secret&gt;&quot;"),
        "{timeline}"
    );
    assert!(timeline.contains("issued (in doubt)"), "{timeline}");
    assert!(timeline.contains(SCRIPT.replace('<', "&lt;").replace('>', "&gt;").as_str()));

    let done = send(&app, bearer("/sessions/s-done")).await.body;
    for needle in [
        "model reply",
        "tool call",
        "idempotent_with_key",
        "charge:o-17",
        "2/2 steps, 0/1 checks",
        "$0.0042 of $1.00, 1380 tokens of 50000",
        "Transcript (version 3, 6 messages)",
    ] {
        assert!(done.contains(needle), "missing {needle:?}:\n{done}");
    }
    let v1 = send(&app, bearer("/sessions/s-done?version=1")).await.body;
    assert!(v1.contains("Transcript (version 1, 4 messages)"), "{v1}");
    let missing = send(&app, bearer("/sessions/s-done?version=42")).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert!(
        missing.body.contains("has no checkpoint version 42"),
        "{}",
        missing.body
    );

    // Filters.
    let parked = send(&app, bearer("/?status=completed")).await.body;
    assert!(
        parked.contains("s-done") && !parked.contains("s-refund"),
        "{parked}"
    );
    let other_app = send(&app, bearer("/?app_version=shop%2F9")).await.body;
    assert!(other_app.contains("No sessions match."), "{other_app}");
    let old = send(&app, bearer("/?older_than=1h")).await.body;
    assert!(old.contains("No sessions match."), "{old}");
    let recent = send(&app, bearer("/?newer_than=1h")).await.body;
    assert!(recent.contains("s-refund"), "{recent}");
    let bad = send(&app, bearer("/?newer_than=soon")).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn a_read_only_console_says_so_and_changes_nothing() {
    let s = scenario().await;
    let app = durable_console::router(
        Arc::clone(&s.store),
        options().read_only("opened without DURABLE_MAC_KEY"),
    );
    for path in ["/in-doubt", "/sessions/s-done"] {
        let body = send(&app, bearer(path)).await.body;
        assert!(
            body.contains("Read-only: </strong>opened without DURABLE_MAC_KEY"),
            "{body}"
        );
        assert!(body.contains("disabled"), "{body}");
    }
    let cookie = login(&app).await;
    let csrf = csrf_of(&app, &cookie, "/in-doubt").await;
    let resolve = format!("/in-doubt/{}/resolve", s.doubt_call.id);
    let reply = send(
        &app,
        post(
            &resolve,
            Some(&cookie),
            &[("decision", "did_not_happen"), ("by", "x"), ("csrf", &csrf)],
        ),
    )
    .await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN);
    assert!(
        reply.body.contains("this console is read-only"),
        "{}",
        reply.body
    );
    assert_eq!(
        s.store.call(&s.doubt_call.id).await.expect("call").status,
        CallStatus::Issued
    );
}

/// Store data reaches a page only through maud's escaping `(expr)`: `PreEscaped` appears
/// in `layout.rs` alone (for the constant stylesheet).
#[test]
fn pre_escaped_only_in_the_layout() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    for entry in std::fs::read_dir(&src).expect("src") {
        let path = entry.expect("entry").path();
        let text = std::fs::read_to_string(&path).expect("read");
        let named = text.contains("PreEscaped");
        let layout = path.file_name().is_some_and(|n| n == "layout.rs");
        assert!(!named || layout, "{} uses PreEscaped", path.display());
    }
}

/// The card number a refund is requested with: journaled masked, never shown.
const CARD: &str = "4242424242424242";

fn refund_args(amount: i64) -> serde_json::Value {
    json!({"amount": amount, "card": CARD})
}

#[tokio::test]
async fn the_approvals_inbox_lists_pending_calls_escaped_and_masked() {
    let s = scenario().await;
    let reasoning = format!("The customer is owed this. {SCRIPT}");
    let call = awaiting_approval(&s.store, "s-approve", refund_args(1200), &reasoning, None).await;
    let app = durable_console::router(Arc::clone(&s.store), options());

    let inbox = send(&app, bearer("/approvals")).await;
    assert_eq!(inbox.status, StatusCode::OK, "{}", inbox.body);
    let body = &inbox.body;
    for needle in [
        call.id.as_str(),
        "issue_refund",
        "href=\"/sessions/s-approve\"",
        "policy: refunds need a person",
        "The customer is owed this. &lt;script&gt;alert(1)&lt;/script&gt;",
        "&quot;card&quot;: &quot;&lt;secret&gt;&quot;",
        "Review: approve…",
        "Review: edit and approve…",
        "Review: deny…",
        "Approvals <span class=\"badge\">1</span>",
    ] {
        assert!(body.contains(needle), "missing {needle:?}:\n{body}");
    }
    assert!(!body.contains("<script"), "{body}");
    assert!(!body.contains(CARD), "the card number is shown");

    // The sessions page counts it, and the status filter finds the parked session.
    let sessions = send(&app, bearer("/")).await.body;
    assert!(
        sessions.contains("href=\"/approvals?session=s-approve\">1</a>"),
        "{sessions}"
    );
    let filtered = send(&app, bearer("/?status=awaiting_approval")).await.body;
    assert!(
        filtered.contains("s-approve") && !filtered.contains("s-done"),
        "{filtered}"
    );
    let one = send(&app, bearer("/approvals?session=s-done")).await.body;
    assert!(one.contains("No calls await approval."), "{one}");

    // The timeline shows the request and the approval log.
    let timeline = send(&app, bearer("/sessions/s-approve")).await.body;
    for needle in [
        "requested by policy: refunds need a person",
        "awaiting a decision",
        "approval #1",
        "The customer is owed this. &lt;script&gt;",
    ] {
        assert!(timeline.contains(needle), "missing {needle:?}:\n{timeline}");
    }
    assert!(
        !timeline.contains("<script") && !timeline.contains(CARD),
        "{timeline}"
    );
}

#[tokio::test]
async fn approve_edit_and_deny_through_the_forms() {
    let s = scenario().await;
    let approve = awaiting_approval(&s.store, "s-a", refund_args(1200), "ok", None).await;
    let edit = awaiting_approval(&s.store, "s-e", refund_args(1200), "ok", None).await;
    let deny = awaiting_approval(&s.store, "s-d", refund_args(90_000), "ok", None).await;
    let app = durable_console::router(Arc::clone(&s.store), options());
    let cookie = login(&app).await;
    let csrf = csrf_of(&app, &cookie, "/approvals").await;
    let status = |id: durable::CallId| {
        let store = Arc::clone(&s.store);
        async move { store.call(&id).await.expect("call").status }
    };

    // Without the CSRF token: refused, nothing decided.
    let decide = format!("/approvals/{}/decide", approve.id);
    let bare = [("decision", "approve"), ("by", OPERATOR)];
    let reply = send(&app, post(&decide, Some(&cookie), &bare)).await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN, "{}", reply.body);
    assert_eq!(status(approve.id.clone()).await, CallStatus::Requested);

    // Approve: the confirmation says what it does, and decides nothing.
    let form = [("decision", "approve"), ("by", OPERATOR), ("csrf", &csrf)];
    let confirm = format!("/approvals/{}/confirm", approve.id);
    let reply = send(&app, post(&confirm, Some(&cookie), &form)).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert!(
        reply.body.contains(&format!(
            "Approve call `{}` (`issue_refund` in session `s-a`) as requested, by {OPERATOR}: the next resume runs `issue_refund` once with these arguments",
            approve.id
        )),
        "{}",
        reply.body
    );
    assert_eq!(status(approve.id.clone()).await, CallStatus::Requested);
    let reply = send(&app, post(&decide, Some(&cookie), &form)).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert!(reply.body.contains("approved call"), "{}", reply.body);
    assert!(reply.body.contains("it is active again"), "{}", reply.body);
    assert_eq!(status(approve.id.clone()).await, CallStatus::Approved);
    let session = s
        .store
        .session(&approve.identity.session)
        .await
        .expect("session");
    assert_eq!(session.status, SessionStatus::Active);
    // Deciding it again: refused, naming the status and who decided.
    let again = send(&app, post(&decide, Some(&cookie), &form)).await;
    assert_eq!(again.status, StatusCode::CONFLICT);
    assert!(
        again.body.contains(
            "is not awaiting approval (status `approved`): it was already approved by console-op"
        ),
        "{}",
        again.body
    );

    // Edit: an invalid edit shows the problem's path and decides nothing.
    let confirm = format!("/approvals/{}/confirm", edit.id);
    let decide = format!("/approvals/{}/decide", edit.id);
    let invalid = r#"{"amount": "fifty", "card": "<secret>"}"#;
    let form = [
        ("decision", "edit"),
        ("args", invalid),
        ("by", OPERATOR),
        ("csrf", &csrf),
    ];
    for path in [&confirm, &decide] {
        let reply = send(&app, post(path, Some(&cookie), &form)).await;
        assert_eq!(
            reply.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{}",
            reply.body
        );
        assert!(reply.body.contains("refused at $.amount"), "{}", reply.body);
        assert!(reply.body.contains("nothing was decided"), "{}", reply.body);
    }
    // A secret cannot be changed either.
    let planted = r#"{"amount": 5, "card": "1111"}"#;
    let form = [
        ("decision", "edit"),
        ("args", planted),
        ("by", OPERATOR),
        ("csrf", &csrf),
    ];
    let reply = send(&app, post(&confirm, Some(&cookie), &form)).await;
    assert_eq!(
        reply.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        reply.body
    );
    assert!(reply.body.contains("refused at $.card"), "{}", reply.body);
    assert_eq!(status(edit.id.clone()).await, CallStatus::Requested);
    // A valid edit: the confirmation shows the change, the decision records it.
    let valid = "{\n  \"amount\": 500,\n  \"card\": \"<secret>\"\n}";
    let form = [
        ("decision", "edit"),
        ("args", valid),
        ("note", "half now"),
        ("by", OPERATOR),
        ("csrf", &csrf),
    ];
    let reply = send(&app, post(&confirm, Some(&cookie), &form)).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    for needle in [
        "with edited arguments, by console-op: the next resume runs `issue_refund` once with the edited arguments",
        "<td>$.amount</td><td class=\"before\">1200</td><td class=\"after\">500</td>",
    ] {
        assert!(
            reply.body.contains(needle),
            "missing {needle:?}:\n{}",
            reply.body
        );
    }
    assert!(!reply.body.contains(CARD), "{}", reply.body);
    assert_eq!(status(edit.id.clone()).await, CallStatus::Requested);
    let reply = send(&app, post(&decide, Some(&cookie), &form)).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let row = s.store.call(&edit.id).await.expect("call");
    assert_eq!(row.status, CallStatus::Approved);
    let edited = row
        .approval
        .as_ref()
        .and_then(|a| a.edited_args())
        .expect("edited");
    assert_eq!(edited["amount"], json!(500));
    assert_eq!(
        edited["card"], edit.args["card"],
        "the secret stays as recorded"
    );
    let log = s
        .store
        .approvals(&edit.identity.session)
        .await
        .expect("log");
    let last = log.last().expect("a decision");
    assert_eq!(last.event, ApprovalEvent::Approved);
    assert_eq!(last.note.as_deref(), Some("half now"));
    // The session's timeline shows both sets of arguments of the row, labelled: the
    // requested ones and those approved (which the call runs with).
    let timeline = send(
        &app,
        bearer(&format!("/sessions/{}", edit.identity.session.as_str())),
    )
    .await
    .body;
    let after = |label: &str| {
        let at = timeline
            .find(label)
            .unwrap_or_else(|| panic!("no {label:?} in the timeline:\n{timeline}"));
        timeline[at..].chars().take(200).collect::<String>()
    };
    assert!(
        after("requested arguments").contains("1200"),
        "{}",
        after("requested arguments")
    );
    assert!(
        after("approved (edited) arguments").contains("500"),
        "{}",
        after("approved (edited) arguments")
    );

    // Deny: a reason is required; the confirmation shows what the model will read.
    let confirm = format!("/approvals/{}/confirm", deny.id);
    let decide = format!("/approvals/{}/decide", deny.id);
    let empty = [
        ("decision", "deny"),
        ("reason", "  "),
        ("by", OPERATOR),
        ("csrf", &csrf),
    ];
    for path in [&confirm, &decide] {
        let reply = send(&app, post(path, Some(&cookie), &empty)).await;
        assert_eq!(
            reply.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{}",
            reply.body
        );
        assert!(
            reply.body.contains("a denial needs a reason"),
            "{}",
            reply.body
        );
    }
    assert_eq!(status(deny.id.clone()).await, CallStatus::Requested);
    let form = [
        ("decision", "deny"),
        ("reason", "over the refund limit"),
        ("by", "alice"),
        ("csrf", &csrf),
    ];
    let reply = send(&app, post(&confirm, Some(&cookie), &form)).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert!(
        reply
            .body
            .contains("the model will read: not run: denied by alice: over the refund limit"),
        "{}",
        reply.body
    );
    assert_eq!(status(deny.id.clone()).await, CallStatus::Requested);
    let reply = send(&app, post(&decide, Some(&cookie), &form)).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert!(reply.body.contains("denied call"), "{}", reply.body);
    assert_eq!(status(deny.id.clone()).await, CallStatus::Denied);
    let log = s
        .store
        .approvals(&deny.identity.session)
        .await
        .expect("log");
    let last = log.last().expect("a decision");
    assert_eq!(
        (last.event, last.by.as_str()),
        (ApprovalEvent::Denied, "alice")
    );

    // All decided: the inbox is empty, and the timeline shows the decisions.
    let inbox = page_of(&app, &cookie, "/approvals").await.body;
    assert!(inbox.contains("No calls await approval."), "{inbox}");
    let timeline = page_of(&app, &cookie, "/sessions/s-e").await.body;
    assert!(
        timeline.contains("approved</span> by console-op"),
        "{timeline}"
    );
    assert!(timeline.contains("edited arguments"), "{timeline}");
}

#[tokio::test]
async fn of_two_decisions_at_once_the_loser_is_refused() {
    let s = scenario().await;
    let call = awaiting_approval(&s.store, "s-race", refund_args(1200), "ok", None).await;
    let app = durable_console::router(Arc::clone(&s.store), options());
    let (ann, bob) = (login(&app).await, login(&app).await);
    let (ann_csrf, bob_csrf) = (
        csrf_of(&app, &ann, "/approvals").await,
        csrf_of(&app, &bob, "/approvals").await,
    );
    let decide = format!("/approvals/{}/decide", call.id);
    let approve = [("decision", "approve"), ("by", "ann"), ("csrf", &ann_csrf)];
    let deny = [
        ("decision", "deny"),
        ("reason", "no"),
        ("by", "bob"),
        ("csrf", &bob_csrf),
    ];
    let (a, b) = tokio::join!(
        send(&app, post(&decide, Some(&ann), &approve)),
        send(&app, post(&decide, Some(&bob), &deny)),
    );
    let row = s.store.call(&call.id).await.expect("call");
    let (winner, loser, status, who) = match row.status {
        CallStatus::Approved => (a, b, "approved", "ann"),
        CallStatus::Denied => (b, a, "denied", "bob"),
        other => panic!("undecided: {other:?}"),
    };
    assert_eq!(winner.status, StatusCode::OK, "{}", winner.body);
    assert_eq!(loser.status, StatusCode::CONFLICT, "{}", loser.body);
    assert!(
        loser.body.contains(&format!(
            "is not awaiting approval (status `{status}`): it was already {status} by {who}"
        )),
        "{}",
        loser.body
    );
    let log = s
        .store
        .approvals(&call.identity.session)
        .await
        .expect("log");
    assert_eq!(log.len(), 2, "one request, one decision: {log:?}");
}

#[tokio::test]
async fn an_expired_request_can_only_be_expired() {
    let s = scenario().await;
    let call = awaiting_approval(
        &s.store,
        "s-late",
        refund_args(1200),
        "ok",
        Some(std::time::Duration::from_millis(1)),
    )
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let app = durable_console::router(Arc::clone(&s.store), options());
    let cookie = login(&app).await;
    let inbox = page_of(&app, &cookie, "/approvals").await.body;
    assert!(inbox.contains("Review: expire…"), "{inbox}");
    assert!(!inbox.contains("Review: approve…"), "{inbox}");
    let csrf = csrf_of(&app, &cookie, "/approvals").await;
    let decide = format!("/approvals/{}/decide", call.id);
    let late = [("decision", "approve"), ("by", OPERATOR), ("csrf", &csrf)];
    let reply = send(&app, post(&decide, Some(&cookie), &late)).await;
    assert_eq!(reply.status, StatusCode::CONFLICT, "{}", reply.body);
    assert!(reply.body.contains("expire it instead"), "{}", reply.body);
    let expire = [("decision", "expire"), ("csrf", &csrf)];
    let confirm = format!("/approvals/{}/confirm", call.id);
    let reply = send(&app, post(&confirm, Some(&cookie), &expire)).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert!(
        reply.body.contains("denied by its deadline"),
        "{}",
        reply.body
    );
    assert_eq!(
        s.store.call(&call.id).await.expect("call").status,
        CallStatus::Requested
    );
    let reply = send(&app, post(&decide, Some(&cookie), &expire)).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let row = s.store.call(&call.id).await.expect("call");
    assert_eq!(row.status, CallStatus::Denied);
    let log = s
        .store
        .approvals(&call.identity.session)
        .await
        .expect("log");
    assert_eq!(log.last().map(|r| r.event), Some(ApprovalEvent::Expired));
}

#[tokio::test]
async fn a_read_only_console_decides_no_approval() {
    let s = scenario().await;
    let call = awaiting_approval(&s.store, "s-ro", refund_args(1200), "ok", None).await;
    let app = durable_console::router(
        Arc::clone(&s.store),
        options().read_only("opened without DURABLE_MAC_KEY"),
    );
    let body = send(&app, bearer("/approvals")).await.body;
    assert!(body.contains("Read-only: </strong>"), "{body}");
    assert!(body.contains("disabled"), "{body}");
    let cookie = login(&app).await;
    let csrf = csrf_of(&app, &cookie, "/approvals").await;
    let decide = format!("/approvals/{}/decide", call.id);
    let form = [("decision", "approve"), ("by", OPERATOR), ("csrf", &csrf)];
    let reply = send(&app, post(&decide, Some(&cookie), &form)).await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN);
    assert_eq!(
        s.store.call(&call.id).await.expect("call").status,
        CallStatus::Requested
    );
}

/// The sessions page shows a page of sessions and a link to the next (a keyset cursor):
/// following the links lists every session once, newest first, a page at a time, and
/// the filters stay applied on every page.
#[tokio::test]
async fn the_sessions_listing_pages_with_a_next_link() {
    let s = scenario().await;
    let durable = durable::Durable::builder(Arc::clone(&s.store))
        .owner("pager")
        .app_version("pages/1")
        .build();
    let mut started = Vec::new();
    for n in 0..230 {
        let options =
            durable::StartOptions::new().with_id(durable::SessionId::new(format!("page-{n:03}")));
        let session = durable
            .start::<durable::Message>(options)
            .await
            .expect("start");
        started.push(session.id().as_str().to_owned());
        session.release().await.expect("release");
    }
    let app = durable_console::router(Arc::clone(&s.store), options());
    let mut path = "/?app_version=pages%2F1".to_owned();
    let mut seen: Vec<String> = Vec::new();
    let mut pages = 0;
    loop {
        let reply = send(&app, bearer(&path)).await;
        assert_eq!(reply.status, StatusCode::OK, "{path}: {}", reply.body);
        pages += 1;
        let on_page: Vec<String> = reply
            .body
            .split("href=\"/sessions/")
            .skip(1)
            .filter_map(|rest| rest.split('"').next())
            .map(str::to_owned)
            .collect();
        assert!(
            on_page.len() <= 100,
            "a page holds at most 100: {}",
            on_page.len()
        );
        assert!(
            on_page.iter().all(|id| id.starts_with("page-")),
            "the filter applies on every page: {on_page:?}"
        );
        seen.extend(on_page);
        let Some((_, rest)) = reply.body.split_once("id=\"next-page\" href=\"") else {
            break;
        };
        path = rest
            .split('"')
            .next()
            .expect("the link")
            .replace("&amp;", "&");
        assert!(path.contains("app_version=pages%2F1"), "{path}");
        assert!(pages < 10, "the links end");
    }
    assert_eq!(pages, 3, "230 sessions, 100 a page");
    let mut expected = started.clone();
    expected.sort();
    let mut listed = seen.clone();
    listed.sort();
    listed.dedup();
    assert_eq!(listed.len(), seen.len(), "no session twice: {seen:?}");
    assert_eq!(listed, expected, "every session once");
    let bad = send(&app, bearer("/?after=yesterday")).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert!(bad.body.contains("not a page cursor"), "{}", bad.body);
}

/// A session's timeline shows its journal a page of 500 rows at a time, with a link to
/// the next rows: following the links shows every row once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_timeline_pages_a_long_journal() {
    use durable::store::{
        CallIdentity, CallKind, CallOutcome, FinishCall, NewCall, NewCheckpoint, NewSession,
    };
    let s = scenario().await;
    let id = durable::SessionId::new("long-journal");
    let (_, lease) = s
        .store
        .create_session(NewSession {
            id: id.clone(),
            app_version: "v1".into(),
            metadata: json!({}),
            owner: "pager".into(),
            lease_ttl: std::time::Duration::from_secs(600),
            initial: NewCheckpoint::default(),
            queue: None,
        })
        .await
        .expect("create");
    let lease = Arc::new(lease);
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..1_200 {
        let store = Arc::clone(&s.store);
        let lease = Arc::clone(&lease);
        tasks.spawn(async move {
            let call = NewCall {
                id: durable::CallId::random(),
                kind: CallKind::Tool,
                identity: CallIdentity {
                    session: lease.session.clone(),
                    step: 0,
                    tool: "lookup".into(),
                    input_hash: format!("v1:{n:064x}"),
                    ordinal: 0,
                },
                class: durable::ReplayClass::Pure,
                args: json!({ "n": n }),
                idempotency_key: None,
                schema_hash: "s".into(),
            };
            let finish = FinishCall {
                outcome: CallOutcome::Completed(json!(n)),
                spend: None,
            };
            store
                .record_call(lease.fence(), call, finish)
                .await
                .expect("record");
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("joined");
    }
    let rows = s.store.calls(&id, None).await.expect("calls");
    let app = durable_console::router(Arc::clone(&s.store), options());
    let mut path = "/sessions/long-journal".to_owned();
    let mut shown = vec![0usize; rows.len()];
    let mut pages = 0;
    loop {
        let reply = send(&app, bearer(&path)).await;
        assert_eq!(reply.status, StatusCode::OK, "{path}: {}", reply.body);
        pages += 1;
        let on_page = rows
            .iter()
            .enumerate()
            .filter(|(_, r)| reply.body.contains(r.id.as_str()))
            .map(|(i, _)| i)
            .collect::<Vec<_>>();
        assert!(on_page.len() <= 500, "{} rows on a page", on_page.len());
        for i in on_page {
            shown[i] += 1;
        }
        let Some((_, rest)) = reply.body.split_once("id=\"next-calls\" href=\"") else {
            break;
        };
        path = rest
            .split('"')
            .next()
            .expect("the link")
            .replace("&amp;", "&");
        assert!(pages < 10, "the links end");
    }
    assert_eq!(pages, 3, "1,200 rows, 500 a page");
    assert!(
        shown.iter().all(|&n| n == 1),
        "every row on exactly one page: {:?}",
        shown.iter().filter(|&&n| n != 1).count()
    );
}

/// The session page lists the signals sent to a session (escaped: a payload is store
/// text) and sends one through its form, CSRF-checked; a payload that is not JSON is
/// refused before anything is written, and a session that ended shows no form.
#[tokio::test]
async fn a_signal_is_sent_through_the_session_page() {
    let s = scenario().await;
    let app = durable_console::router(Arc::clone(&s.store), options());
    let cookie = login(&app).await;
    let page = format!("/sessions/{}", s.doubt);
    let csrf = csrf_of(&app, &cookie, &page).await;
    let shown = page_of(&app, &cookie, &page).await;
    assert!(shown.body.contains("No signals."), "{}", shown.body);
    assert!(shown.body.contains("id=\"send-signal\""), "{}", shown.body);
    let action = format!("{page}/signal");
    let form = [
        ("name", "steer"),
        ("payload", &format!("{{\"say\": \"{SCRIPT}\"}}")),
        ("by", "alice"),
    ];

    let missing = send(&app, post(&action, Some(&cookie), &form)).await;
    assert_eq!(missing.status, StatusCode::FORBIDDEN, "{}", missing.body);
    let bad = [
        ("name", "steer"),
        ("payload", "use the other account"),
        ("by", "alice"),
        ("csrf", &csrf),
    ];
    let reply = send(&app, post(&action, Some(&cookie), &bad)).await;
    assert_eq!(reply.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        reply.body.contains("the payload is not valid JSON"),
        "{}",
        reply.body
    );
    assert!(s.store.signals(&s.doubt).await.expect("signals").is_empty());

    let mut good = form.to_vec();
    good.push(("csrf", &csrf));
    let reply = send(&app, post(&action, Some(&cookie), &good)).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert!(
        reply.body.contains("Sent signal <code>steer</code> #"),
        "{}",
        reply.body
    );
    let stored = s.store.signals(&s.doubt).await.expect("signals");
    assert_eq!(stored.len(), 1);
    assert_eq!(
        (
            stored[0].sent_by.as_str(),
            stored[0].payload["say"].as_str()
        ),
        ("alice", Some(SCRIPT))
    );
    let shown = page_of(&app, &cookie, &page).await;
    assert!(shown.body.contains("1 pending of 1."), "{}", shown.body);
    assert!(
        !shown.body.contains(SCRIPT),
        "the payload is escaped: {}",
        shown.body
    );

    let done = page_of(&app, &cookie, &format!("/sessions/{}", s.done)).await;
    assert!(!done.body.contains("id=\"send-signal\""), "{}", done.body);
    let reply = send(
        &app,
        post(&format!("/sessions/{}/signal", s.done), Some(&cookie), &{
            let mut f = form.to_vec();
            f.push(("csrf", &csrf));
            f
        }),
    )
    .await;
    assert_eq!(reply.status, StatusCode::CONFLICT, "{}", reply.body);
    assert!(
        reply.body.contains("has ended (completed)"),
        "{}",
        reply.body
    );
}
