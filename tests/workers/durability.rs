//! `synchronous_commit = off` end to end: an unsafe tool run through the journal is
//! refused with `NotDurable` naming the setting, and its body never runs; tools whose
//! replay does not depend on a durable *issued* row still run.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use durable::Message;
use durable::{CallError, Durable, DurableError, ReplayClass, StartOptions, StoreError, ToolSpec};
use serde_json::json;

pub async fn synchronous_commit_off() {
    let db = durable::postgres::testing::test_database().await;
    let sep = if db.url().contains('?') { '&' } else { '?' };
    let url = format!("{}{sep}options=-c%20synchronous_commit%3Doff", db.url());
    let store = durable::connect(&url).await.expect("connect");
    let durable = Durable::builder(store).owner("sync-off").build();
    let session = durable
        .start::<Message>(StartOptions::default())
        .await
        .expect("start");
    let schema = json!({"type": "object", "properties": {"to": {"type": "string"}}});
    let email = ToolSpec::new(
        "send_email",
        "Email.",
        ReplayClass::UnsafeOnReplay,
        schema.clone(),
    );
    let ran = Arc::new(AtomicBool::new(false));
    let body_ran = Arc::clone(&ran);
    let err = session
        .journal()
        .tool(&email, json!({"to": "ann@example.com"}))
        .run(move |_ctx| {
            let ran = Arc::clone(&body_ran);
            async move {
                ran.store(true, Ordering::SeqCst);
                Ok::<_, String>(json!({"receipt": "sent"}))
            }
        })
        .await
        .expect_err("an unsafe tool must refuse to run without synchronous_commit");
    match &err {
        CallError::Durable(DurableError::Store(StoreError::NotDurable { backend, setting })) => {
            assert_eq!(*backend, "postgres");
            assert_eq!(setting, "synchronous_commit = off");
        }
        other => panic!("expected NotDurable, got {other:?}"),
    }
    let message = err.to_string();
    assert!(
        message.contains("synchronous_commit = off") && message.contains("unsafe tools refuse"),
        "the error names the setting and what it blocks: {message}"
    );
    assert!(!ran.load(Ordering::SeqCst), "the tool body must not run");
    let calls = durable
        .store()
        .calls(session.id(), None)
        .await
        .expect("calls");
    assert!(calls.is_empty(), "nothing was journaled: {calls:?}");

    // A pure tool does not depend on a durable *issued* row: it runs.
    let read = ToolSpec::new("read", "Read.", ReplayClass::Pure, schema);
    let value: serde_json::Value = session
        .journal()
        .tool(&read, json!({"to": "ann@example.com"}))
        .run(|_ctx| async { Ok::<_, String>(json!("read")) })
        .await
        .expect("a pure tool still runs");
    assert_eq!(value, json!("read"));
    println!("synchronous_commit_off: unsafe tool refused with `{message}`");
}
