//! `durable show` lists a session's parent and children with their status, and `durable
//! cancel` cancels a session and its children (audited with who and why), on a real
//! SQLite store; a running session is asked to stop instead.

mod cli_support;

use std::sync::Arc;

use cli_support::run;
use durable::sqlite::SqliteStore;
use durable::store::SessionStatus;
use durable::{CheckpointStore, Durable, Message, SessionId, StartOptions};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_lists_the_family_and_cancel_ends_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("agent.db");
    let store: Arc<dyn CheckpointStore> =
        Arc::new(SqliteStore::open(&path).await.expect("open store"));
    let db = path.to_str().expect("utf-8 path").to_owned();
    let durable = Durable::builder(Arc::clone(&store)).owner("agent").build();
    let parent = durable
        .start::<Message>(StartOptions::new().with_id(SessionId::new("ticket-9")))
        .await
        .expect("start");
    let mut kids = Vec::new();
    for n in 0..2 {
        kids.push(
            parent
                .spawn_child(StartOptions::<Message>::new().with_state(json!({ "n": n })))
                .await
                .expect("spawn"),
        );
    }
    let child = durable
        .resume::<Message>(&kids[0])
        .await
        .expect("resume a child")
        .session;
    child.fail("no such page").await.expect("fail");

    let shown = run(&db, &["show", "ticket-9"]);
    let text = shown.ok();
    assert!(text.contains("Children (2;"), "{text}");
    assert!(
        text.contains(kids[1].as_str()) && text.contains("active"),
        "{text}"
    );
    assert!(text.contains("failed (no such page)"), "{text}");
    let child_view = run(&db, &["show", kids[1].as_str()]);
    assert!(
        child_view.ok().contains("parent       ticket-9 (active)"),
        "{}",
        child_view.stdout
    );
    let json = run(&db, &["--json", "show", "ticket-9"]).json();
    assert_eq!(json["children"].as_array().map(Vec::len), Some(2));
    assert_eq!(json["children"][0]["status"], "failed");

    // The parent is held by this process (a live lease): asked to stop; its idle child
    // is cancelled at once; the failed one is left as it was.
    let cancelled = run(&db, &["cancel", "ticket-9", "--reason", "duplicate ticket"]);
    let text = cancelled.ok();
    assert!(text.contains("session `ticket-9`: asked to stop"), "{text}");
    assert!(
        text.contains(&format!("session `{}`: cancelled", kids[1])),
        "{text}"
    );
    assert!(
        text.contains(&format!("session `{}`: had already ended", kids[0])),
        "{text}"
    );
    let record = store.session(&kids[1]).await.expect("child");
    assert_eq!(record.status, SessionStatus::Cancelled);
    assert_eq!(
        record.status_reason.as_deref(),
        Some("cancelled by test-operator: duplicate ticket")
    );
    let shown = run(&db, &["show", "ticket-9"]);
    assert!(
        shown.ok().contains("cancelling   asked by test-operator"),
        "{}",
        shown.stdout
    );
    // The parent's next call is refused, and it ends as cancelled.
    drop(parent);
    let lease_holder = store
        .session(&SessionId::new("ticket-9"))
        .await
        .expect("parent");
    assert_eq!(lease_holder.status, SessionStatus::Active);

    // An unknown session: not found, exit 3; no reason: usage, exit 2.
    run(&db, &["cancel", "nope", "--reason", "x"]).fails(3, "nope");
    let usage = run(&db, &["cancel", "ticket-9"]);
    assert_eq!(usage.code, 2, "{}", usage.stderr);
}
