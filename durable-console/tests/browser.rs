//! The console in a real headless browser: Debian's `chromium` driven over WebDriver by
//! `chromedriver`, which the test starts on a free loopback port and stops on drop (as
//! durable-postgres's harness starts a throwaway cluster). `scripts/test.sh` installs
//! both packages when they are missing: this test is never skipped.
//!
//! One browser session for the whole file (chromium's start-up is the slow part).
//! `DURABLE_SCREENSHOTS=1` writes the pages shown in the README to `docs/console/`.
//!
//! The Workers page comes last: worker pools (queues with limits, leases, sleepers) are
//! added to the store, and one sleeper is woken through its confirmation.
//!
//! The approvals part runs a real agent process, the `approval_agent` example (built by
//! cargo into this test's target directory), against the same store file: once to park
//! its refund awaiting approval, and again after the operator approved it in the browser.

mod support;

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use durable::SessionId;
use durable::store::{CallStatus, Resolution, SessionStatus};
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::json;
use support::{AgentEnd, OPERATOR, SCRIPT, TOKEN, options, run_agent, scenario, serve};

/// A `chromedriver` process of our own, killed (with the browser it started) on drop.
struct Driver {
    child: Child,
    url: String,
}

impl Driver {
    fn start() -> Driver {
        let binary = std::env::var("CHROMEDRIVER").unwrap_or_else(|_| "chromedriver".into());
        let port = free_port();
        let mut command = Command::new(&binary);
        command
            .arg(format!("--port={port}"))
            .arg("--allowed-ips=127.0.0.1")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // Its own process group, so that drop stops the browsers it started too.
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let child = command.spawn().unwrap_or_else(|e| {
            panic!(
                "cannot start `{binary}` ({e}); install Debian's chromium and chromium-driver \
                 (scripts/test.sh does), or set CHROMEDRIVER"
            )
        });
        let driver = Driver {
            child,
            url: format!("http://127.0.0.1:{port}"),
        };
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            assert!(
                Instant::now() < deadline,
                "chromedriver did not listen within 20 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        driver
    }

    async fn browser(&self) -> Client {
        let mut args = vec![
            "--headless=new",
            "--disable-dev-shm-usage",
            "--disable-gpu",
            "--no-first-run",
            "--window-size=1440,960",
            "--hide-scrollbars",
        ];
        if is_root() {
            // Chromium refuses to run its sandbox as root (containers, CI).
            args.push("--no-sandbox");
        }
        let mut chrome = json!({ "args": args });
        if let Ok(binary) = std::env::var("CHROME") {
            chrome["binary"] = json!(binary);
        }
        let mut caps = serde_json::Map::new();
        caps.insert("goog:chromeOptions".into(), chrome);
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        ClientBuilder::new(connector)
            .capabilities(caps)
            .connect(&self.url)
            .await
            .expect("a chromium session")
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// Writes a screenshot of the current page to `docs/console/<name>.png` when
/// `DURABLE_SCREENSHOTS=1`.
async fn screenshot(client: &Client, name: &str) {
    if std::env::var("DURABLE_SCREENSHOTS").as_deref() != Ok("1") {
        return;
    }
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/console");
    std::fs::create_dir_all(&dir).expect("docs/console");
    let png = client.screenshot().await.expect("screenshot");
    std::fs::write(dir.join(format!("{name}.png")), png).expect("write the screenshot");
}

/// The text of the first element matching `css`, waiting up to 10 s for it to appear (a
/// click that submits a form returns before the next page is there); on a timeout the
/// panic shows the page.
async fn text(client: &Client, css: &str) -> String {
    let found = client
        .wait()
        .at_most(Duration::from_secs(10))
        .every(Duration::from_millis(50))
        .for_element(Locator::Css(css))
        .await;
    match found {
        Ok(element) => element.text().await.expect("text"),
        Err(e) => {
            let url = client
                .current_url()
                .await
                .map(|u| u.to_string())
                .unwrap_or_default();
            let page = client.source().await.unwrap_or_default();
            panic!("no `{css}` on {url} within 10 s ({e}):\n{page}")
        }
    }
}

/// Waits up to 10 s for the browser to be at `expected` (a path), as after a click.
async fn at(client: &Client, expected: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let path = client.current_url().await.expect("url").path().to_owned();
        if path == expected {
            return;
        }
        assert!(Instant::now() < deadline, "at {path}, expected {expected}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The `approval_agent` example, built by cargo into the target directory this test
/// binary runs from (with its profile), so that it runs the code under test.
fn agent_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    // target/<profile>/deps/browser-… → target/<profile>
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("the test binary is in target/<profile>/deps");
    let target_dir = profile_dir.parent().expect("target/");
    let mut build = Command::new(env!("CARGO"));
    build
        .args([
            "build",
            "--quiet",
            "-p",
            "durable-console",
            "--example",
            "approval_agent",
        ])
        .arg("--target-dir")
        .arg(target_dir);
    match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => {}
        Some(profile) => {
            build.args(["--profile", profile]);
        }
    }
    let status = build.status().expect("run cargo");
    assert!(
        status.success(),
        "cargo build --example approval_agent failed"
    );
    profile_dir.join("examples").join("approval_agent")
}

/// Runs the agent process once over the store file `db`; the line it printed.
fn run_agent_process(binary: &Path, db: &Path, ledger: &Path) -> String {
    let out = Command::new(binary)
        .arg(db)
        .arg(ledger)
        .output()
        .expect("run approval_agent");
    let stdout = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(
        out.status.success(),
        "approval_agent failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn ledger_lines(ledger: &Path) -> usize {
    std::fs::read_to_string(ledger)
        .map(|t| t.lines().count())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_resolves_a_call_in_the_browser() {
    let s = scenario().await;
    // An agent process parks its refund awaiting approval, and exits.
    let agent = agent_binary();
    let ledger = s.dir.path().join("ledger.txt");
    assert_eq!(
        run_agent_process(&agent, &s.path, &ledger),
        "awaiting approval"
    );
    assert_eq!(ledger_lines(&ledger), 0, "nothing ran");
    let refund_session = SessionId::new("refund-o-17");
    let requested = s
        .store
        .calls(&refund_session, None)
        .await
        .expect("calls")
        .into_iter()
        .find(|c| c.status == CallStatus::Requested)
        .expect("a call awaiting approval");
    let addr = serve(&s.store, options()).await;
    let base = format!("http://{addr}");
    let driver = Driver::start();
    let client = driver.browser().await;

    // Without the token, every page leads to the login form.
    client
        .goto(&format!("{base}/in-doubt"))
        .await
        .expect("goto");
    at(&client, "/login").await;
    let page = client.source().await.expect("source");
    assert!(!page.contains("s-doubt"), "{page}");
    // A wrong token is refused.
    client
        .find(Locator::Id("token"))
        .await
        .expect("token field")
        .send_keys("guess")
        .await
        .expect("type");
    client
        .find(Locator::Css("form button"))
        .await
        .expect("button")
        .click()
        .await
        .expect("click");
    assert!(
        text(&client, ".problem")
            .await
            .contains("not the console's token")
    );

    // Log in with the token: the sessions page.
    client
        .find(Locator::Id("token"))
        .await
        .expect("token field")
        .send_keys(TOKEN)
        .await
        .expect("type");
    client
        .find(Locator::Css("form button"))
        .await
        .expect("button")
        .click()
        .await
        .expect("click");
    at(&client, "/").await;
    let sessions = text(&client, "#sessions").await;
    for id in ["s-done", "s-doubt", "s-refund"] {
        assert!(sessions.contains(id), "{sessions}");
    }
    let doubt_row = text(&client, "#sessions tbody tr:nth-child(1)").await;
    assert!(!doubt_row.is_empty());
    screenshot(&client, "sessions").await;

    // The in-doubt session's timeline: the call in doubt, and the attacker's markup as text.
    client
        .find(Locator::LinkText("s-doubt"))
        .await
        .expect("a link to s-doubt")
        .click()
        .await
        .expect("click");
    at(&client, "/sessions/s-doubt").await;
    let transcript = text(&client, ".transcript").await;
    assert!(
        transcript.contains(&format!("Tell Ann her order o-17 is confirmed. {SCRIPT}")),
        "{transcript}"
    );
    let args = text(&client, "tr.doubt code.args").await;
    assert!(args.contains(SCRIPT), "{args}");
    assert!(
        args.contains("\"token\":\"***\"") && args.contains("\"body\":\"<secret>\""),
        "{args}"
    );
    assert!(
        text(&client, "tr.doubt")
            .await
            .contains("issued (in doubt)")
    );
    let scripts = client
        .find_all(Locator::Css("script"))
        .await
        .expect("find_all");
    assert!(scripts.is_empty(), "no script element may exist");
    let page = client.source().await.expect("source");
    assert!(!page.contains("tok-live-123"));

    // The inbox: both calls in doubt.
    client
        .goto(&format!("{base}/in-doubt"))
        .await
        .expect("goto");
    let doubt = format!(".card[data-call='{}']", s.doubt_call.id);
    let refund = format!(".card[data-call='{}']", s.refund_call.id);
    text(&client, &doubt).await;
    text(&client, &refund).await;
    screenshot(&client, "in-doubt").await;

    // A form stripped of its CSRF token is refused, and changes nothing.
    client
        .execute(
            "document.querySelectorAll('form.did-not-happen input[name=csrf]').forEach(e => e.remove()); return null;",
            vec![],
        )
        .await
        .expect("strip the CSRF fields");
    client
        .find(Locator::Css(&format!(
            "{refund} form.did-not-happen button"
        )))
        .await
        .expect("button")
        .click()
        .await
        .expect("click");
    let problem = text(&client, ".problem").await;
    assert!(
        problem.contains("CSRF token is missing or wrong"),
        "{problem}"
    );
    assert_eq!(
        s.store.call(&s.refund_call.id).await.expect("call").status,
        CallStatus::Issued
    );

    // Did not happen: the confirmation says what it will do, and changes nothing yet.
    client
        .goto(&format!("{base}/in-doubt"))
        .await
        .expect("goto");
    let form = format!("{doubt} form.did-not-happen");
    client
        .find(Locator::Css(&format!("{form} input[name=note]")))
        .await
        .expect("note")
        .send_keys("not in the outbox")
        .await
        .expect("type");
    client
        .find(Locator::Css(&format!("{form} button")))
        .await
        .expect("button")
        .click()
        .await
        .expect("click");
    let consequence = text(&client, "#consequence").await;
    assert_eq!(
        consequence,
        format!(
            "Resolve call `{}` (`send_email` in session `s-doubt`) as not happened, by {OPERATOR}: the next resume runs the call again.",
            s.doubt_call.id
        )
    );
    assert_eq!(
        s.store.call(&s.doubt_call.id).await.expect("call").status,
        CallStatus::Issued
    );
    client
        .find(Locator::Css("#confirm button"))
        .await
        .expect("confirm")
        .click()
        .await
        .expect("click");
    let outcome = text(&client, "#outcome").await;
    assert!(outcome.starts_with("resolved call"), "{outcome}");
    assert!(
        outcome.contains("as not happened, by console-op"),
        "{outcome}"
    );

    // It left the inbox; the other call is still there.
    client
        .goto(&format!("{base}/in-doubt"))
        .await
        .expect("goto");
    assert!(
        client
            .find_all(Locator::Css(&doubt))
            .await
            .expect("find_all")
            .is_empty()
    );
    text(&client, &refund).await;

    // A worker resumes the session: the email runs again (it did not happen) and the
    // session completes; the journal keeps the resolution.
    let before = s.sent.load(Ordering::SeqCst);
    match run_agent(&s.store, &s.doubt, &s.sent, false).await {
        AgentEnd::Completed(result) => assert_eq!(result, json!({"id": "m-1"})),
        other => panic!("the resumed agent must complete, got {other:?}"),
    }
    assert_eq!(s.sent.load(Ordering::SeqCst), before + 1, "sent once more");
    let resolutions = s.store.resolutions(&s.doubt).await.expect("resolutions");
    assert_eq!(resolutions.len(), 1);
    assert!(matches!(
        resolutions[0].resolution,
        Resolution::DidNotHappen
    ));
    assert_eq!(resolutions[0].by, OPERATOR);
    assert_eq!(resolutions[0].note.as_deref(), Some("not in the outbox"));
    assert_eq!(
        s.store.session(&s.doubt).await.expect("session").status,
        SessionStatus::Completed
    );

    // The timeline shows the resolution and the call's second attempt.
    client
        .goto(&format!("{base}/sessions/s-doubt"))
        .await
        .expect("goto");
    let resolution = text(&client, "tr.resolution").await;
    assert!(
        resolution.contains("did not happen") && resolution.contains(OPERATOR),
        "{resolution}"
    );
    assert!(
        client
            .find_all(Locator::Css("tr.doubt"))
            .await
            .expect("find_all")
            .is_empty()
    );
    let page = client.source().await.expect("source");
    assert!(
        !page.contains("tok-live-123"),
        "the transcript masks it too"
    );
    screenshot(&client, "timeline").await;

    // The approvals inbox: the agent's refund, with who asked and the model's reasoning.
    client
        .goto(&format!("{base}/approvals"))
        .await
        .expect("goto");
    let card = format!(".card.approval[data-call='{}']", requested.id);
    let shown = text(&client, &card).await;
    for needle in [
        "issue_refund",
        "refund-o-17",
        "policy: every refund needs a person",
        "The customer sent a photo of the broken item",
    ] {
        assert!(shown.contains(needle), "missing {needle:?}: {shown}");
    }
    screenshot(&client, "approvals").await;
    // Approve: the confirmation says what will run, and decides nothing yet.
    client
        .find(Locator::Css(&format!("{card} form.approve button")))
        .await
        .expect("approve")
        .click()
        .await
        .expect("click");
    let consequence = text(&client, "#consequence").await;
    assert_eq!(
        consequence,
        format!(
            "Approve call `{}` (`issue_refund` in session `refund-o-17`) as requested, by {OPERATOR}: the next resume runs `issue_refund` once with these arguments.",
            requested.id
        )
    );
    assert!(text(&client, "#args").await.contains("\"amount\": 1200"));
    assert_eq!(
        s.store.call(&requested.id).await.expect("call").status,
        CallStatus::Requested
    );
    screenshot(&client, "approval-confirm").await;
    client
        .find(Locator::Css("#confirm button"))
        .await
        .expect("confirm")
        .click()
        .await
        .expect("click");
    let outcome = text(&client, "#outcome").await;
    assert!(outcome.starts_with("approved call"), "{outcome}");
    assert!(
        text(&client, "#next").await.contains("it is active again"),
        "the session is no longer parked"
    );
    assert_eq!(
        s.store.call(&requested.id).await.expect("call").status,
        CallStatus::Approved
    );

    // A second agent process resumes the session: the refund runs exactly once.
    let second = run_agent_process(&agent, &s.path, &ledger);
    assert!(second.starts_with("completed:"), "{second}");
    assert_eq!(ledger_lines(&ledger), 1, "the refund ran once");
    let third = run_agent_process(&agent, &s.path, &ledger);
    assert!(third.starts_with("nothing to do:"), "{third}");
    assert_eq!(ledger_lines(&ledger), 1, "and never again");
    assert_eq!(
        s.store
            .session(&refund_session)
            .await
            .expect("session")
            .status,
        SessionStatus::Completed
    );
    // Its timeline: the call's approval, and the log (requested, approved, issued).
    client
        .goto(&format!("{base}/sessions/refund-o-17"))
        .await
        .expect("goto");
    let detail = text(&client, "tr.approval-detail").await;
    assert!(
        detail.contains("requested by policy: every refund needs a person")
            && detail.contains(&format!("approved by {OPERATOR}")),
        "{detail}"
    );
    let log: Vec<String> = {
        let mut rows = Vec::new();
        for row in client
            .find_all(Locator::Css("tr.approval"))
            .await
            .expect("find_all")
        {
            rows.push(row.text().await.expect("text"));
        }
        rows
    };
    assert_eq!(log.len(), 3, "{log:?}");
    for (row, event) in log.iter().zip(["requested", "approved", "issued"]) {
        assert!(row.contains(event), "{row} is not {event}: {log:?}");
    }

    // The worker pools: the queues with their limits, who holds which lease, the
    // sleepers; one is woken through its confirmation.
    let pools = support::pools(&s.store).await;
    client.goto(&format!("{base}/workers")).await.expect("goto");
    let queues = text(&client, "#queues").await;
    for needle in ["email", "support", "default"] {
        assert!(queues.contains(needle), "missing {needle:?}: {queues}");
    }
    let owners = text(&client, "#owners").await;
    for needle in ["worker-7", "ticket-4411", "ticket-4412", "in 9m"] {
        assert!(owners.contains(needle), "missing {needle:?}: {owners}");
    }
    let sleeping = text(&client, "#sleeping").await;
    for needle in ["reminder-o-17", "in 29m", "digest-ann", "in 1h"] {
        assert!(sleeping.contains(needle), "missing {needle:?}: {sleeping}");
    }
    screenshot(&client, "workers").await;
    client
        .find(Locator::Css(
            "tr[data-session='reminder-o-17'] form.wake button",
        ))
        .await
        .expect("wake now")
        .click()
        .await
        .expect("click");
    let consequence = text(&client, "#consequence").await;
    assert!(
        consequence.starts_with("Wake session `reminder-o-17` (asleep until ")
            && consequence.ends_with("the next claim of a pool serving queue `email` takes it."),
        "{consequence}"
    );
    let asleep = |id: SessionId| {
        let store = std::sync::Arc::clone(&s.store);
        async move {
            let record = store.session(&id).await.expect("session");
            record.wake_at.expect("wake_at") > store.now().await.expect("now")
        }
    };
    assert!(
        asleep(pools.asleep[0].clone()).await,
        "not woken before the confirmation"
    );
    client
        .find(Locator::Css("#confirm button"))
        .await
        .expect("confirm")
        .click()
        .await
        .expect("click");
    let outcome = text(&client, "#outcome").await;
    assert!(
        outcome.starts_with("woke session `reminder-o-17`"),
        "{outcome}"
    );
    assert!(!asleep(pools.asleep[0].clone()).await, "woken");
    client.goto(&format!("{base}/workers")).await.expect("goto");
    let sleeping = text(&client, "#sleeping").await;
    assert!(
        !sleeping.contains("reminder-o-17") && sleeping.contains("digest-ann"),
        "{sleeping}"
    );

    // A session parked at its budget ceiling: its spend against each ceiling on its
    // page, and an operator raises the ceiling there; the session is active again.
    let parked = support::parked_at_budget(&s.store).await;
    client
        .goto(&format!("{base}/sessions/{parked}"))
        .await
        .expect("goto");
    let ceilings = text(&client, "#ceilings").await;
    for needle in [
        "usd",
        "$0.0125",
        "$0.05",
        "model_calls",
        "tool:send_email",
        "reached",
    ] {
        assert!(ceilings.contains(needle), "missing {needle:?}: {ceilings}");
    }
    let reached = text(&client, "tr.reached").await;
    assert!(reached.starts_with("model_calls"), "{reached}");
    screenshot(&client, "budget").await;
    for (field, value) in [
        ("limit", "model_calls"),
        ("amount", "5"),
        ("note", "the customer approved more research"),
    ] {
        client
            .find(Locator::Css(&format!("#raise input[name='{field}']")))
            .await
            .expect("a raise field")
            .send_keys(value)
            .await
            .expect("type");
    }
    client
        .find(Locator::Css("#raise button"))
        .await
        .expect("raise")
        .click()
        .await
        .expect("click");
    let raised = text(&client, "#raised").await;
    assert!(
        raised.contains("model_calls") && raised.contains("to 5") && raised.contains("active"),
        "{raised}"
    );
    assert_eq!(
        s.store.session(&parked).await.expect("session").status,
        SessionStatus::Active
    );
    let audit = s.store.limit_raises(&parked).await.expect("raises");
    assert_eq!(audit.len(), 1);
    assert_eq!(audit[0].by, OPERATOR);
    client
        .goto(&format!("{base}/sessions/{parked}"))
        .await
        .expect("goto");
    let raise = text(&client, "p.raise").await;
    assert!(
        raise.contains("the customer approved more research"),
        "{raise}"
    );
    assert!(
        !text(&client, "#ceilings").await.contains("reached"),
        "no ceiling reached after the raise"
    );

    // A coordinator and its two children: the session page shows the family, and the
    // cancel form cancels all three (none is held by a worker), audited.
    let family = durable::Durable::builder(std::sync::Arc::clone(&s.store))
        .owner("family-test")
        .build();
    let coordinator = family
        .start::<durable::Message>(
            durable::StartOptions::new().with_id(SessionId::new("coordinator-7")),
        )
        .await
        .expect("start the coordinator");
    let mut kids = Vec::new();
    for n in 0..2 {
        kids.push(
            coordinator
                .spawn_child(
                    durable::StartOptions::<durable::Message>::new().with_state(json!({ "n": n })),
                )
                .await
                .expect("start a child"),
        );
    }
    coordinator
        .release()
        .await
        .expect("release the coordinator");
    client
        .goto(&format!("{base}/sessions/coordinator-7"))
        .await
        .expect("goto");
    let shown = text(&client, "#family").await;
    for kid in &kids {
        assert!(shown.contains(kid.as_str()), "missing child {kid}: {shown}");
    }
    assert!(shown.contains("active"), "{shown}");
    // A person steers the coordinator: the signal form sends it, the card lists it.
    for (field, value) in [
        ("name", "steer"),
        ("payload", "\"focus on the billing question\""),
    ] {
        client
            .find(Locator::Css(&format!("#send-signal input[name='{field}']")))
            .await
            .expect("signal field")
            .send_keys(value)
            .await
            .expect("type");
    }
    client
        .find(Locator::Css("#send-signal button"))
        .await
        .expect("send")
        .click()
        .await
        .expect("click");
    let sent = text(&client, "#signal-sent").await;
    assert!(
        sent.contains("Sent signal steer #") && sent.contains("coordinator-7"),
        "{sent}"
    );
    client
        .goto(&format!("{base}/sessions/coordinator-7"))
        .await
        .expect("goto");
    let listed = text(&client, "#signals").await;
    assert!(
        listed.contains("1 pending of 1.") && listed.contains("focus on the billing question"),
        "{listed}"
    );
    let signals = s
        .store
        .signals(&SessionId::new("coordinator-7"))
        .await
        .expect("signals");
    assert_eq!(signals.len(), 1);
    assert_eq!(signals[0].sent_by, OPERATOR);
    client
        .execute(
            "document.getElementById('family').scrollIntoView()",
            Vec::new(),
        )
        .await
        .expect("scroll to the family");
    screenshot(&client, "family-signals").await;
    client
        .find(Locator::Css("#cancel input[name='reason']"))
        .await
        .expect("reason field")
        .send_keys("wrong ticket")
        .await
        .expect("type");
    client
        .find(Locator::Css("#cancel button"))
        .await
        .expect("cancel")
        .click()
        .await
        .expect("click");
    let cancelled = text(&client, "#cancelled").await;
    assert!(
        cancelled.contains("coordinator-7") && cancelled.matches("cancelled").count() >= 3,
        "{cancelled}"
    );
    for id in std::iter::once(SessionId::new("coordinator-7")).chain(kids.iter().cloned()) {
        let record = s.store.session(&id).await.expect("session");
        assert_eq!(record.status, SessionStatus::Cancelled, "{id}");
        assert!(
            record
                .status_reason
                .unwrap_or_default()
                .contains(&format!("cancelled by {OPERATOR}: wrong ticket")),
            "{id}"
        );
    }
    // The child's page names its parent.
    client
        .goto(&format!("{base}/sessions/{}", kids[0]))
        .await
        .expect("goto");
    let parent = text(&client, "#family .parent").await;
    assert!(
        parent.contains("coordinator-7") && parent.contains("cancelled"),
        "{parent}"
    );

    // Logging out: the pages lead to the login form again.
    client
        .find(Locator::Css("header.top form button"))
        .await
        .expect("log out")
        .click()
        .await
        .expect("click");
    client.goto(&format!("{base}/")).await.expect("goto");
    at(&client, "/login").await;

    client.close().await.expect("close the browser");
    drop(driver);
}
