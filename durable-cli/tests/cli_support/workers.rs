//! `workers`, `wake`, `queue-limit` and what `show` says of queues, sleep and leases,
//! against a store with sessions in two queues: one asleep, two leased by one owner, one
//! ready, a limit on one queue.

use std::sync::Arc;
use std::time::Duration;

use durable::{CheckpointStore, Durable, Message, SessionId, StartOptions};
use serde_json::Value;

use super::{APP, run};

/// What [`populate`] made.
struct Pool {
    /// `email`, asleep for an hour, lease released.
    asleep: SessionId,
    /// Its wake-up time (ms, store clock).
    wake_at: i64,
}

fn runtime(store: &Arc<dyn CheckpointStore>, owner: &str) -> Durable {
    Durable::builder(Arc::clone(store))
        .owner(owner)
        .app_version(APP)
        .renew_leases(false)
        .lease_ttl(Duration::from_secs(600))
        .build()
}

/// `s-held` (`email`) and `s-held-2` (`reports`) leased by `worker-1` for ten minutes;
/// `s-asleep` (`email`) asleep for an hour; `s-ready` (`reports`) released; `s-finished`
/// completed; a limit of 2 on `email`.
async fn populate(store: &Arc<dyn CheckpointStore>) -> Pool {
    let worker = runtime(store, "worker-1");
    for (id, queue) in [("s-held", "email"), ("s-held-2", "reports")] {
        let session = worker
            .start::<Message>(
                StartOptions::new()
                    .with_id(SessionId::new(id))
                    .with_queue(queue),
            )
            .await
            .expect("start a held session");
        drop(session); // the lease stays live for ten minutes
    }
    let asleep = SessionId::new("s-asleep");
    let sleeper = runtime(store, "worker-2")
        .start::<Message>(
            StartOptions::new()
                .with_id(asleep.clone())
                .with_queue("email"),
        )
        .await
        .expect("start s-asleep");
    sleeper
        .sleep(Duration::from_secs(3600))
        .await
        .expect("sleep");
    let wake_at = store
        .session(&asleep)
        .await
        .expect("session")
        .wake_at
        .expect("asleep");
    worker
        .submit::<Message>(
            StartOptions::new()
                .with_id(SessionId::new("s-ready"))
                .with_queue("reports"),
        )
        .await
        .expect("submit s-ready");
    let finished = worker
        .start::<Message>(StartOptions::new().with_id(SessionId::new("s-finished")))
        .await
        .expect("start s-finished");
    finished.complete().await.expect("complete");
    store
        .set_queue_limit("email", Some(2))
        .await
        .expect("limit email");
    Pool { asleep, wake_at }
}

/// The lines of section `name` of `workers` (up to the next blank line).
fn section<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
    text.lines()
        .skip_while(|l| *l != name)
        .skip(1)
        .take_while(|l| !l.is_empty())
        .collect()
}

/// The words of the row of `lines` that starts with `first`.
#[track_caller]
fn row<'a>(lines: &[&'a str], first: &str) -> Vec<&'a str> {
    lines
        .iter()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|w| w.first() == Some(&first))
        .unwrap_or_else(|| panic!("no row {first:?} in {lines:#?}"))
}

/// The queue named `name` of `workers --json`.
fn queue<'a>(json: &'a Value, name: &str) -> &'a Value {
    json["queues"]
        .as_array()
        .and_then(|q| q.iter().find(|q| q["name"] == name))
        .unwrap_or_else(|| panic!("no queue {name}: {json}"))
}

pub async fn workers(store: &Arc<dyn CheckpointStore>, db: &str) {
    let pool = populate(store).await;
    let out = run(db, &["workers"]);
    let text = out.ok();

    let queues = section(text, "Queues");
    assert_eq!(
        row(&queues, "QUEUE"),
        [
            "QUEUE", "LIMIT", "RUNNING", "READY", "SLEEPING", "WAITING", "AWAITING", "APPROVAL",
            "PARKED", "NEXT", "WAKE-UP"
        ],
        "{text}"
    );
    let email = row(&queues, "email");
    // The limit, one running, none ready, one asleep, none waiting for children, due
    // within the hour.
    assert_eq!(
        email[..8],
        ["email", "2", "1", "0", "1", "0", "0", "0"],
        "{text}"
    );
    assert_eq!(email[8..], ["in", "59m"], "{text}");
    let reports = row(&queues, "reports");
    assert_eq!(
        reports,
        ["reports", "-", "1", "1", "0", "0", "0", "0", "-"],
        "{text}"
    );
    assert!(
        queues.iter().all(|l| !l.starts_with("default")),
        "a queue of terminal sessions only is not listed: {text}"
    );

    let owners = section(text, "Workers");
    let first = row(&owners, "worker-1");
    // Owner, two sessions, the oldest renewal, then its first session.
    assert_eq!(first[1], "2", "{text}");
    assert!(first[3] == "ago" && first[4] == "s-held", "{text}");
    assert!(
        first.contains(&"email") && first.ends_with(&["in", "9m"]),
        "{text}"
    );
    let second = row(&owners, "s-held-2");
    assert!(
        second.contains(&"reports") && second.ends_with(&["in", "9m"]),
        "{text}"
    );
    assert!(
        owners.iter().all(|l| !l.contains("worker-2")),
        "a sleeper's released lease is nobody's: {text}"
    );

    let sleeping = section(text, "Sleeping");
    let asleep = row(&sleeping, "s-asleep");
    assert_eq!(asleep[1..4], ["email", "in", "59m"], "{text}");
    assert_eq!(asleep[4], durable_time(pool.wake_at), "{text}");
    assert_eq!(sleeping.len(), 3, "header, rule, one sleeper: {text}");

    let json = run(db, &["workers", "--json"]).json();
    assert!(json["now"].is_i64(), "{json}");
    let email = queue(&json, "email");
    assert_eq!(email["max_running"], 2, "{json}");
    assert_eq!(
        (&email["running"], &email["ready"], &email["sleeping"]),
        (&1.into(), &0.into(), &1.into()),
        "{json}"
    );
    assert_eq!(email["next_wake_at"], pool.wake_at, "{json}");
    let reports = queue(&json, "reports");
    assert_eq!(reports["max_running"], Value::Null, "{json}");
    assert_eq!(reports["ready"], 1, "{json}");
    let workers = json["workers"].as_array().expect("workers");
    assert_eq!(workers.len(), 1, "{json}");
    assert_eq!(workers[0]["owner"], "worker-1");
    let held: Vec<(&str, &str)> = workers[0]["sessions"]
        .as_array()
        .expect("sessions")
        .iter()
        .map(|s| {
            assert!(
                s["lease_expires_at"].is_i64() && s["lease_renewed_at"].is_i64(),
                "{s}"
            );
            (
                s["session"].as_str().unwrap_or_default(),
                s["queue"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(held, [("s-held", "email"), ("s-held-2", "reports")]);
    assert!(workers[0]["oldest_renewal_at"].is_i64(), "{json}");
    let sleeping = json["sleeping"].as_array().expect("sleeping");
    assert_eq!(sleeping.len(), 1, "{json}");
    assert_eq!(sleeping[0]["session"], "s-asleep");
    assert_eq!(sleeping[0]["queue"], "email");
    assert_eq!(sleeping[0]["wake_at"], pool.wake_at);
}

/// A wake-up time as the CLI prints it (`2026-11-24T08:00:00Z`).
fn durable_time(ms: i64) -> String {
    let at = std::time::UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).expect("ms"));
    humantime::format_rfc3339_seconds(at).to_string()
}

pub async fn wake(store: &Arc<dyn CheckpointStore>, db: &str) {
    let pool = populate(store).await;
    let id = pool.asleep.as_str();
    let out = run(db, &["wake", id]);
    let text = out.ok();
    assert!(
        text.contains("woke session `s-asleep` (asleep until ")
            && text.contains("the next claim of a pool serving queue `email` takes it"),
        "{text}"
    );
    let record = store.session(&pool.asleep).await.expect("session");
    let now = store.now().await.expect("now");
    assert!(
        record.wake_at.is_some_and(|t| t <= now && t < pool.wake_at),
        "{record:?}"
    );
    // No longer listed as sleeping; its queue counts it ready.
    let json = run(db, &["workers", "--json"]).json();
    assert_eq!(json["sleeping"], Value::Array(Vec::new()), "{json}");
    let email = queue(&json, "email");
    assert_eq!(
        (&email["ready"], &email["sleeping"]),
        (&1.into(), &0.into())
    );
    assert_eq!(email["next_wake_at"], Value::Null, "{json}");
    let table = run(db, &["workers"]);
    assert!(
        table.ok().contains("Sleeping\n  no session is asleep"),
        "{}",
        table.stdout
    );

    // Again, and a running session: nothing to do.
    let again = run(db, &["wake", id, "--json"]).json();
    assert_eq!(again["woken"], false, "{again}");
    let held = run(db, &["wake", "s-held"]);
    assert!(
        held.ok()
            .contains("session `s-held` is not asleep: it is running, leased by `worker-1`"),
        "{}",
        held.stdout
    );
    run(db, &["wake", "s-finished"]).fails(4, "is completed, not active");
    run(db, &["wake", "no-such-session"]).fails(3, "not found");
}

pub async fn queue_limit(store: &Arc<dyn CheckpointStore>, db: &str) {
    populate(store).await;
    let out = run(db, &["queue-limit", "reports", "1"]);
    let text = out.ok();
    assert!(
        text.starts_with("queue `reports` limited to 1 session running at once"),
        "{text}"
    );
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        row(&lines, "reports"),
        ["reports", "1", "1", "1", "0", "0", "0", "0", "-"],
        "{text}"
    );
    let json = run(db, &["workers", "--json"]).json();
    assert_eq!(queue(&json, "reports")["max_running"], 1, "{json}");
    let table = run(db, &["workers"]);
    let queues = section(table.ok(), "Queues");
    assert_eq!(row(&queues, "reports")[1], "1", "{}", table.stdout);

    let removed = run(db, &["queue-limit", "reports", "--remove", "--json"]).json();
    assert_eq!(removed["name"], "reports");
    assert_eq!(removed["max_running"], Value::Null, "{removed}");
    assert_eq!(removed["ready"], 1, "{removed}");
    let json = run(db, &["workers", "--json"]).json();
    assert_eq!(queue(&json, "reports")["max_running"], Value::Null);

    // A queue with no session: listed for its limit, gone once the limit is.
    let paused = run(db, &["queue-limit", "idle", "0"]);
    assert!(
        paused.ok().starts_with("queue `idle` paused"),
        "{}",
        paused.stdout
    );
    let json = run(db, &["workers", "--json"]).json();
    assert_eq!(queue(&json, "idle")["max_running"], 0, "{json}");
    run(db, &["queue-limit", "idle", "--remove"]).ok();
    let json = run(db, &["workers", "--json"]).json();
    let names: Vec<&str> = json["queues"]
        .as_array()
        .expect("queues")
        .iter()
        .filter_map(|q| q["name"].as_str())
        .collect();
    assert_eq!(names, ["email", "reports"], "{json}");

    run(db, &["queue-limit", "reports"]).fails(2, "required");
    run(db, &["queue-limit", "reports", "2", "--remove"]).fails(2, "cannot be used with");
    run(db, &["queue-limit", "reports", "-1"]).fails(2, "");
}

/// `tenant-limit` sets and lifts a tenant's limit; `workers` shows each tenant with its
/// limit, running and queued sessions (and no Tenants section while there is none).
pub async fn tenant_limit(store: &Arc<dyn CheckpointStore>, db: &str) {
    let none = run(db, &["workers"]);
    assert!(
        !none.ok().lines().any(|l| l == "Tenants"),
        "no tenant, no section: {}",
        none.stdout
    );
    let worker = runtime(store, "worker-1");
    let held = worker
        .start::<Message>(StartOptions::new().with_tenant("acme"))
        .await
        .expect("start a session of acme");
    for _ in 0..2 {
        worker
            .submit::<Message>(StartOptions::new().with_tenant("acme"))
            .await
            .expect("submit a session of acme");
    }
    let out = run(db, &["tenant-limit", "acme", "1"]);
    let text = out.ok();
    assert!(
        text.starts_with("tenant `acme` limited to 1 session running at once"),
        "{text}"
    );
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(row(&lines, "acme"), ["acme", "1", "1", "2"], "{text}");
    let table = run(db, &["workers"]);
    let tenants = section(table.ok(), "Tenants");
    assert_eq!(
        row(&tenants, "TENANT"),
        ["TENANT", "LIMIT", "RUNNING", "QUEUED"]
    );
    assert_eq!(
        row(&tenants, "acme"),
        ["acme", "1", "1", "2"],
        "{}",
        table.stdout
    );
    let json = run(db, &["workers", "--json"]).json();
    assert_eq!(
        json["tenants"],
        serde_json::json!([{ "name": "acme", "max_running": 1, "running": 1, "queued": 2 }]),
        "{json}"
    );
    // A tenant with no session: listed for its limit, gone once the limit is.
    run(db, &["tenant-limit", "idle", "0"]).ok();
    let removed = run(db, &["tenant-limit", "idle", "--remove", "--json"]).json();
    assert_eq!(
        removed,
        serde_json::json!({ "name": "idle", "max_running": null, "running": 0, "queued": 0 })
    );
    let json = run(db, &["workers", "--json"]).json();
    assert_eq!(json["tenants"].as_array().map(Vec::len), Some(1), "{json}");
    drop(held);
    run(db, &["tenant-limit", "acme"]).fails(2, "required");
    run(db, &["tenant-limit", "acme", "2", "--remove"]).fails(2, "cannot be used with");
    run(db, &["tenant-limit", "", "1"]).fails(5, "tenant");
}

pub async fn show_queue_sleep_and_lease(store: &Arc<dyn CheckpointStore>, db: &str) {
    let pool = populate(store).await;
    let asleep = run(db, &["show", pool.asleep.as_str()]);
    let text = asleep.ok();
    for needle in [
        "queue        email",
        &format!("asleep until {} (in 59m)", durable_time(pool.wake_at)),
        "`durable wake s-asleep` ends the sleep now",
        "lease        -",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
    let json = run(db, &["show", pool.asleep.as_str(), "--json"]).json();
    assert_eq!(json["asleep"], true, "{json}");
    assert_eq!(json["session"]["queue"], "email");
    assert_eq!(json["session"]["wake_at"], pool.wake_at);

    let held = run(db, &["show", "s-held-2"]);
    let text = held.ok();
    assert!(text.contains("queue        reports"), "{text}");
    assert!(!text.contains("asleep until"), "{text}");
    let lease = text
        .lines()
        .find(|l| l.starts_with("lease"))
        .expect("a lease line");
    assert!(
        lease.starts_with("lease        worker-1, live, expires in 9m, last renewed ")
            && lease.ends_with(" ago"),
        "{lease}"
    );
    let json = run(db, &["show", "s-held-2", "--json"]).json();
    assert_eq!(json["asleep"], false, "{json}");
    assert!(json["session"]["lease_renewed_at"].is_i64(), "{json}");

    // Once woken, the sleep is over (its time stays recorded until the next checkpoint).
    run(db, &["wake", pool.asleep.as_str()]).ok();
    let woken = run(db, &["show", pool.asleep.as_str()]);
    assert!(!woken.ok().contains("asleep until"), "{}", woken.stdout);
}

/// `durable signal send|list` and what `show` says of a session waiting for a signal:
/// the send wakes it, a retry under its key sends nothing more, bad JSON and an ended
/// session are refused with their exit codes.
pub async fn signal(store: &Arc<dyn CheckpointStore>, db: &str) {
    let worker = runtime(store, "worker-1");
    let session = worker
        .start::<Message>(StartOptions::new().with_id(SessionId::new("s-steer")))
        .await
        .expect("start");
    let durable::SignalWait::Released = session
        .wait_signal("approve", Duration::from_secs(3600))
        .await
        .expect("wait")
    else {
        panic!("nothing pending: the session waits");
    };
    let shown = run(db, &["show", "s-steer"]);
    let text = shown.ok();
    assert!(
        text.contains(
            "waiting      for signal `approve` (`durable signal send s-steer approve` sends it)"
        ),
        "{text}"
    );
    run(db, &["signal", "list", "s-steer"])
        .ok()
        .contains("no signals for session `s-steer`")
        .then_some(())
        .expect("no signal yet");

    let sent = run(
        db,
        &[
            "signal",
            "send",
            "s-steer",
            "approve",
            "--payload",
            r#"{"ok": true}"#,
            "--key",
            "ticket-42",
        ],
    );
    let text = sent.ok();
    assert!(
        text.starts_with("sent signal `approve` #")
            && text.contains("to session `s-steer`: it waits until the session reads it"),
        "{text}"
    );
    let record = store
        .session(&SessionId::new("s-steer"))
        .await
        .expect("row");
    assert_eq!(record.waiting_until, None, "the send woke the session");
    run(
        db,
        &[
            "signal",
            "send",
            "s-steer",
            "approve",
            "--payload",
            r#"{"ok": true}"#,
            "--key",
            "ticket-42",
        ],
    )
    .ok();
    run(
        db,
        &[
            "signal",
            "send",
            "s-steer",
            "approve",
            "--payload",
            r#"{"ok": false}"#,
            "--key",
            "ticket-42",
        ],
    )
    .fails(4, "ticket-42");
    run(
        db,
        &["signal", "send", "s-steer", "approve", "--payload", "yes"],
    )
    .fails(5, "--payload is not JSON");
    run(db, &["signal", "send", "no-such-session", "approve"]).fails(3, "not found");
    let listed = run(db, &["signal", "list", "s-steer"]);
    let lines: Vec<&str> = listed.ok().lines().collect();
    assert_eq!(
        lines.len(),
        3,
        "a header, its rule and one signal: {lines:?}"
    );
    let fields: Vec<&str> = lines[2].split_whitespace().collect();
    assert_eq!(
        fields[1..4],
        ["approve", "test-operator", fields[3]],
        "{lines:?}"
    );
    assert!(
        lines[2].contains("pending") && lines[2].contains(r#"{"ok":true}"#),
        "{lines:?}"
    );
    let json = run(db, &["--json", "signal", "list", "s-steer"]).json();
    assert_eq!(json.as_array().map(Vec::len), Some(1), "{json}");
    assert_eq!(json[0]["payload"]["ok"], true);
    let shown = run(db, &["show", "s-steer"]);
    assert!(
        shown.ok().contains("signals      1 pending"),
        "{}",
        shown.stdout
    );

    // The session reads it: nothing pending any more.
    let resumed = worker
        .resume::<Message>(&SessionId::new("s-steer"))
        .await
        .expect("resume")
        .session;
    let durable::SignalWait::Received { session, signal } = resumed
        .wait_signal("approve", Duration::from_secs(3600))
        .await
        .expect("wait")
    else {
        panic!("the signal is read");
    };
    assert_eq!(signal.payload["ok"], true);
    assert!(
        run(db, &["signal", "list", "s-steer", "--pending"])
            .ok()
            .contains("no pending signals"),
    );
    let json = run(db, &["--json", "signal", "list", "s-steer"]).json();
    assert!(json[0]["consumed_at"].is_i64(), "{json}");
    session.complete().await.expect("complete");
    run(db, &["signal", "send", "s-steer", "approve"]).fails(4, "has ended (completed)");
}
