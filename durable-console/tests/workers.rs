//! The Workers page over plain HTTP: the queues with their limits and depths, who holds
//! which lease and when it last renewed, the sleeping sessions with their due time, and
//! *wake now* through the confirmation step and CSRF; what the session page says of its
//! queue, sleep and lease. Against a real SQLite store file.

mod support;

use std::sync::Arc;

use axum::http::StatusCode;
use durable::SessionId;
use support::http::{bearer, csrf_of, login, page_of, post, send};
use support::{options, pools, scenario};

/// The `<tr …>` element of `body` that starts with `open` (e.g. `<tr data-queue="email">`).
#[track_caller]
fn row<'a>(body: &'a str, open: &str) -> &'a str {
    let at = body
        .find(open)
        .unwrap_or_else(|| panic!("no {open} in:\n{body}"));
    let end = body[at..].find("</tr>").expect("a closed row");
    &body[at..at + end]
}

#[tokio::test]
async fn the_workers_page_shows_queues_owners_and_sleepers() {
    let s = scenario().await;
    pools(&s.store).await;
    let app = durable_console::router(Arc::clone(&s.store), options());
    let reply = send(&app, bearer("/workers")).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let body = &reply.body;
    assert!(
        body.contains(r#"<a href="/workers" class="on">Workers</a>"#),
        "the navigation links it: {body}"
    );

    // Queues: limits, depths and the next wake-up.
    let email = row(body, r#"<tr data-queue="email">"#);
    for cell in [
        r#"<td class="num limit">2</td>"#,
        r#"<td class="num running">0</td>"#,
        r#"<td class="num ready">0</td>"#,
        r#"<td class="num sleeping">2</td>"#,
        ">in 29m</span>",
    ] {
        assert!(email.contains(cell), "missing {cell:?} in {email}");
    }
    let support = row(body, r#"<tr data-queue="support">"#);
    for cell in [
        r#"<td class="num limit">4</td>"#,
        r#"<td class="num running">2</td>"#,
        r#"<td class="num sleeping">0</td>"#,
    ] {
        assert!(support.contains(cell), "missing {cell:?} in {support}");
    }
    // The two sessions whose workers died: released, claimable now; no limit.
    let default = row(body, r#"<tr data-queue="default">"#);
    assert!(
        default.contains(r#"<td class="num ready">2</td>"#),
        "{default}"
    );
    assert!(
        default.contains(r#"<td class="num limit"><span class="muted">—</span></td>"#),
        "{default}"
    );

    // Owners: worker-7 holds both tickets, each renewed just now, expiring in ten minutes.
    let first = row(body, r#"<tr data-owner="worker-7">"#);
    for needle in [
        r#"<td class="mono owner" rowspan="2">worker-7</td>"#,
        r#"<td class="num held" rowspan="2">2</td>"#,
        r#"href="/sessions/ticket-4411""#,
        "<td class=\"mono\">support</td>",
        " ago</td>",
        "<td>in 9m</td>",
    ] {
        assert!(first.contains(needle), "missing {needle:?} in {first}");
    }
    assert_eq!(body.matches(r#"<tr data-owner="worker-7">"#).count(), 2);
    assert!(body.contains(r#"href="/sessions/ticket-4412""#), "{body}");
    assert!(
        !body.contains(r#"data-owner="worker-3""#),
        "a sleeper's released lease is nobody's: {body}"
    );

    // Sleeping: soonest first, each with its due time and a wake form.
    let soon = body
        .find(r#"<tr data-session="reminder-o-17">"#)
        .expect("reminder-o-17 sleeps");
    let later = body
        .find(r#"<tr data-session="digest-ann">"#)
        .expect("digest-ann sleeps");
    assert!(soon < later, "soonest first");
    let reminder = row(body, r#"<tr data-session="reminder-o-17">"#);
    assert!(
        reminder.contains(r#"<td class="due">in 29m</td>"#),
        "{reminder}"
    );
    assert!(
        reminder.contains(r#"action="/workers/reminder-o-17/confirm""#)
            && reminder.contains("Wake now…")
            && reminder.contains(r#"name="csrf""#),
        "{reminder}"
    );
    let digest = row(body, r#"<tr data-session="digest-ann">"#);
    assert!(digest.contains(r#"<td class="due">in 1h</td>"#), "{digest}");

    // The session pages: queue, sleep and lease.
    let asleep = send(&app, bearer("/sessions/digest-ann")).await.body;
    for needle in [
        r#"<dd class="mono queue">email</dd>"#,
        "<dt>Asleep until</dt>",
        "(in 1h)",
        r#"<dd class="lease">—</dd>"#,
    ] {
        assert!(asleep.contains(needle), "missing {needle:?}:\n{asleep}");
    }
    let held = send(&app, bearer("/sessions/ticket-4411")).await.body;
    assert!(
        held.contains(r#"<dd class="mono queue">support</dd>"#),
        "{held}"
    );
    assert!(
        held.contains("worker-7, live, expires in 9m, last renewed "),
        "{held}"
    );
    assert!(!held.contains("Asleep until"), "{held}");
}

#[tokio::test]
async fn nothing_leased_and_nothing_asleep_is_said() {
    let s = scenario().await;
    let app = durable_console::router(Arc::clone(&s.store), options());
    let body = send(&app, bearer("/workers")).await.body;
    assert!(body.contains("No worker holds a live lease."), "{body}");
    assert!(body.contains("No session is asleep."), "{body}");
    assert!(body.contains(r#"<tr data-queue="default">"#), "{body}");
}

#[tokio::test]
async fn waking_needs_the_csrf_token_and_a_confirmation() {
    let s = scenario().await;
    let pools = pools(&s.store).await;
    let app = durable_console::router(Arc::clone(&s.store), options());
    let cookie = login(&app).await;
    let csrf = csrf_of(&app, &cookie, "/workers").await;
    let id = &pools.asleep[0];
    let confirm = format!("/workers/{id}/confirm");
    let wake = format!("/workers/{id}/wake");
    let wake_at = |id: SessionId| {
        let store = Arc::clone(&s.store);
        async move {
            let record = store.session(&id).await.expect("session");
            (
                record.wake_at.expect("a wake-up time"),
                store.now().await.expect("now"),
            )
        }
    };
    let still_asleep = || async {
        let (at, now) = wake_at(id.clone()).await;
        assert!(at > now, "still asleep");
    };

    // Without the CSRF token, or from another site: refused, nothing changed.
    let reply = send(&app, post(&wake, Some(&cookie), &[])).await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN, "{}", reply.body);
    still_asleep().await;
    let mut req = post(&wake, Some(&cookie), &[("csrf", &csrf)]);
    req.headers_mut().insert(
        axum::http::header::ORIGIN,
        "http://evil.example".parse().expect("header"),
    );
    assert_eq!(send(&app, req).await.status, StatusCode::FORBIDDEN);
    still_asleep().await;

    // The confirmation says what waking does, and changes nothing.
    let reply = send(&app, post(&confirm, Some(&cookie), &[("csrf", &csrf)])).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert!(
        reply
            .body
            .contains("Wake session `reminder-o-17` (asleep until ")
            && reply
                .body
                .contains("in 29m): the next claim of a pool serving queue `email` takes it"),
        "{}",
        reply.body
    );
    assert!(
        reply
            .body
            .contains(r#"action="/workers/reminder-o-17/wake""#),
        "{}",
        reply.body
    );
    still_asleep().await;

    // Confirmed: the sleep ends now, and the page no longer lists it.
    let reply = send(&app, post(&wake, Some(&cookie), &[("csrf", &csrf)])).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert!(
        reply.body.contains("woke session `reminder-o-17`"),
        "{}",
        reply.body
    );
    let (at, now) = wake_at(id.clone()).await;
    assert!(at <= now, "awake: {at} > {now}");
    let page = page_of(&app, &cookie, "/workers").await.body;
    assert!(!page.contains(r#"data-session="reminder-o-17""#), "{page}");
    assert!(page.contains(r#"data-session="digest-ann""#), "{page}");
    let email = row(&page, r#"<tr data-queue="email">"#);
    assert!(
        email.contains(r#"<td class="num ready">1</td>"#)
            && email.contains(r#"<td class="num sleeping">1</td>"#),
        "{email}"
    );

    // The CLI's refusals.
    let again = send(&app, post(&wake, Some(&cookie), &[("csrf", &csrf)])).await;
    assert_eq!(again.status, StatusCode::CONFLICT, "{}", again.body);
    assert!(
        again.body.contains("session `reminder-o-17` is not asleep"),
        "{}",
        again.body
    );
    let held = format!("/workers/{}/confirm", pools.held[0]);
    let reply = send(&app, post(&held, Some(&cookie), &[("csrf", &csrf)])).await;
    assert_eq!(reply.status, StatusCode::CONFLICT, "{}", reply.body);
    assert!(
        reply
            .body
            .contains("is not asleep: it is running, leased by `worker-7`"),
        "{}",
        reply.body
    );
    let done = send(
        &app,
        post("/workers/s-done/confirm", Some(&cookie), &[("csrf", &csrf)]),
    )
    .await;
    assert_eq!(done.status, StatusCode::CONFLICT, "{}", done.body);
    assert!(
        done.body.contains("is completed, not active"),
        "{}",
        done.body
    );
    let missing = send(
        &app,
        post(
            "/workers/no-such/confirm",
            Some(&cookie),
            &[("csrf", &csrf)],
        ),
    )
    .await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND, "{}", missing.body);
}

#[tokio::test]
async fn a_read_only_console_wakes_nobody() {
    let s = scenario().await;
    let pools = pools(&s.store).await;
    let app = durable_console::router(
        Arc::clone(&s.store),
        options().read_only("opened without DURABLE_MAC_KEY"),
    );
    let body = send(&app, bearer("/workers")).await.body;
    assert!(body.contains("Read-only: </strong>"), "{body}");
    let reminder = row(&body, r#"<tr data-session="reminder-o-17">"#);
    assert!(reminder.contains("disabled"), "{reminder}");
    let cookie = login(&app).await;
    let csrf = csrf_of(&app, &cookie, "/workers").await;
    let wake = format!("/workers/{}/wake", pools.asleep[0]);
    let reply = send(&app, post(&wake, Some(&cookie), &[("csrf", &csrf)])).await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN, "{}", reply.body);
    let record = s.store.session(&pools.asleep[0]).await.expect("session");
    let now = s.store.now().await.expect("now");
    assert!(record.wake_at.is_some_and(|t| t > now), "still asleep");
}

/// The Workers page lists the fleet's rate limits: definition, waiters and a 429's hold.
#[tokio::test]
async fn the_workers_page_shows_the_rate_limits() {
    use durable::limiter::{Acquire, Quota, RateLimit};
    let s = scenario().await;
    let store = Arc::clone(&s.store);
    let app = durable_console::router(Arc::clone(&store), options());
    let reply = send(&app, bearer("/workers")).await;
    assert!(
        reply
            .body
            .contains("No rate limit is defined in this store."),
        "{}",
        reply.body
    );

    store
        .define_limit(
            "openai:gpt-4.1",
            // One a minute: the two waiters' turns are still ahead however slow the
            // machine is between the acquisitions and the page.
            &RateLimit::requests(Quota::per_minute(1).with_burst(1)),
        )
        .await
        .expect("define");
    for waiter in ["w1", "w2", "w3"] {
        store
            .acquire_limit(&Acquire::new("openai:gpt-4.1").with_waiter(waiter))
            .await
            .expect("acquire");
    }
    store
        .throttle_limit("openai:gpt-4.1", std::time::Duration::from_secs(600))
        .await
        .expect("throttle");
    let reply = send(&app, bearer("/workers")).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let limit = row(&reply.body, r#"<tr data-limit="openai:gpt-4.1">"#);
    for cell in [
        r#"<td class="requests">1/60000ms (burst 1)</td>"#,
        r#"<td class="num waiters">2</td>"#,
        r#"<td class="num throttles">1</td>"#,
        r#"<td class="num admitted">3</td>"#,
    ] {
        assert!(limit.contains(cell), "missing {cell:?} in {limit}");
    }
    // Held for ten minutes from the throttle: shown as 10m when the page is rendered in
    // the throttle's millisecond (the store's clock), 9m once one has passed.
    assert!(
        limit.contains(r#"<td class="held">in 9m</td>"#)
            || limit.contains(r#"<td class="held">in 10m</td>"#),
        "the hold's end in {limit}"
    );
}
