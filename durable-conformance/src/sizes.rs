//! Size caps ([`SizeLimits`](durable_core::sizes::SizeLimits)): a model reply, a tool result or
//! a message above its cap is refused with [`DurableError::TooLarge`] before anything is
//! written, on every backend; a result too large of a tool that ran is recorded as the
//! call's failure and never run again.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{Value, json};

use durable_core::error::DurableError;
use durable_core::journal::CallError;
use durable_core::replay::ReplayClass;
use durable_core::runtime::Durable;
use durable_core::sizes::{Oversized, SizeLimits};
use durable_core::store::{CallStatus, CheckpointStore};
use durable_core::transcript::Message;

use super::runtime::{release_dead_lease, spec, start};

fn capped(store: &Arc<dyn CheckpointStore>, owner: &str, sizes: SizeLimits) -> Durable {
    Durable::builder(Arc::clone(store))
        .owner(super::owner(owner))
        .app_version("v1")
        .size_limits(sizes)
        .build()
}

/// A 50 MiB model reply (the default cap is 4 MiB) is refused with `TooLarge`, naming
/// the session, step and position, its size and the limit; no journal row and no
/// checkpoint is written, and the position is handed back (the next reply takes it).
pub async fn sizes_a_reply_above_the_cap_writes_nothing(store: Arc<dyn CheckpointStore>) {
    let durable = capped(&store, "sizes", SizeLimits::default());
    let mut session = start(&durable).await;
    let id = session.id().clone();
    let huge = "x".repeat(50 * 1024 * 1024);
    let refused = session
        .journal()
        .model(|| async { Ok::<_, String>(json!({"content": huge})) })
        .await;
    match &refused {
        Err(CallError::Durable(DurableError::TooLarge { what, size, limit })) => {
            assert_eq!(
                what,
                &Oversized::ModelReply {
                    session: id.clone(),
                    step: 0,
                    position: 0
                }
            );
            assert!(*size > 50 * 1024 * 1024, "{size}");
            assert_eq!(*limit, 4 * 1024 * 1024);
        }
        other => panic!(
            "a 50 MiB reply must be refused with TooLarge, got {}",
            short(other)
        ),
    }
    let message = refused.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(
        message.contains("max_reply_bytes") && message.contains("size_limits"),
        "the error says how to raise the limit: {message}"
    );
    assert!(
        store.calls(&id, None).await.expect("calls").is_empty(),
        "nothing is journaled for a refused reply"
    );
    // The position was handed back: a reply within the cap takes it.
    let reply: Value = session
        .journal()
        .model(|| async { Ok::<_, String>(json!({"content": "short"})) })
        .await
        .expect("a reply within the cap");
    assert_eq!(reply["content"], "short");
    let rows = store.calls(&id, None).await.expect("calls");
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].identity.ordinal, 0);
    session.push(Message::user("short"));
    session.checkpoint().await.expect("checkpoint");
}

/// An `unsafe_on_replay` tool whose result is above the cap: its effect ran, so the call
/// is recorded as failed (the size and the limit kept) and returns `TooLarge`; a resume
/// on another worker gets the same `TooLarge` back and never runs the tool again.
pub async fn sizes_a_result_above_the_cap_is_failed_and_never_rerun(
    store: Arc<dyn CheckpointStore>,
) {
    let sizes = SizeLimits::default().with_max_result_bytes(1024);
    let durable = capped(&store, "first", sizes);
    let session = start(&durable).await;
    let id = session.id().clone();
    let s = spec("export_report", ReplayClass::UnsafeOnReplay);
    let runs = Arc::new(AtomicUsize::new(0));
    let first = export(&session, &s, &runs).await;
    let call = match &first {
        Err(CallError::Durable(DurableError::TooLarge {
            what: Oversized::ToolResult {
                tool, call, step, ..
            },
            limit: 1024,
            ..
        })) => {
            assert_eq!((tool.as_str(), *step), ("export_report", 0));
            call.clone()
        }
        other => panic!(
            "a result above the cap must be TooLarge, got {}",
            short(other)
        ),
    };
    let row = store.call(&call).await.expect("the row");
    assert_eq!(
        row.status,
        CallStatus::Failed,
        "recorded as failed, not left issued (in doubt): {row:?}"
    );
    assert!(row.result.is_none(), "the result is not stored: {row:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // The worker dies before a checkpoint; another one re-runs the turn.
    drop(session);
    release_dead_lease(&store, &id).await;
    let second = capped(&store, "second", sizes);
    let resumed = second.resume::<Message>(&id).await.expect("resume");
    assert!(
        resumed.report.in_doubt.is_empty(),
        "the call is not in doubt: {:?}",
        resumed.report.in_doubt
    );
    let again = export(&resumed.session, &s, &runs).await;
    assert!(
        matches!(
            &again,
            Err(CallError::Durable(DurableError::TooLarge { what: Oversized::ToolResult { call: c, .. }, .. })) if *c == call
        ),
        "the replay returns the same typed error: {}",
        short(&again)
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the tool never runs again");
    // A pure tool's too-large result is recorded the same way (one row, failed).
    let p = spec("summarise", ReplayClass::Pure);
    let pure = resumed
        .session
        .journal()
        .tool(&p, json!({"n": 2}))
        .run(|_| async { Ok::<_, String>(json!("p".repeat(4096))) })
        .await;
    assert!(
        matches!(
            &pure,
            Err(CallError::Durable(DurableError::TooLarge { .. }))
        ),
        "{}",
        short(&pure)
    );
}

/// The start of a value's debug text (a value over a cap is megabytes long).
fn short(value: &impl std::fmt::Debug) -> String {
    format!("{value:?}").chars().take(300).collect()
}

/// Runs `spec` with a result of 4 KiB, counting its runs.
async fn export(
    session: &durable_core::Session<Message>,
    spec: &durable_core::ToolSpec,
    runs: &Arc<AtomicUsize>,
) -> Result<Value, CallError<String>> {
    let runs = Arc::clone(runs);
    session
        .journal()
        .tool(spec, json!({"n": 1}))
        .run(move |_| {
            runs.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, String>(json!({"report": "r".repeat(4096)})) }
        })
        .await
}

/// A message above the cap: the checkpoint is refused with `TooLarge` naming its
/// position, and the session's version does not move; the same holds for the initial
/// messages of a new session (nothing is created).
pub async fn sizes_a_message_above_the_cap_writes_no_checkpoint(store: Arc<dyn CheckpointStore>) {
    let sizes = SizeLimits::default().with_max_message_bytes(1024);
    let durable = capped(&store, "sizes", sizes);
    let mut session = start(&durable).await;
    let id = session.id().clone();
    session.push(Message::user("hello"));
    session.push(Message::user("y".repeat(4096)));
    let refused = session.checkpoint().await;
    match &refused {
        Err(DurableError::TooLarge {
            what: Oversized::Message { session, position },
            limit: 1024,
            ..
        }) => {
            assert_eq!((session, *position), (&id, 2));
        }
        other => panic!("a message above the cap must be TooLarge, got {other:?}"),
    }
    assert_eq!(
        store.session(&id).await.expect("session").latest_version,
        0,
        "no checkpoint was written"
    );
    let options = durable_core::runtime::StartOptions::new()
        .with_id(durable_core::SessionId::new(format!("{id}-initial")))
        .with_messages(vec![Message::user("z".repeat(4096))]);
    let initial = durable.start::<Message>(options).await;
    assert!(
        matches!(
            &initial,
            Err(DurableError::TooLarge {
                what: Oversized::Message { position: 1, .. },
                ..
            })
        ),
        "{initial:?}"
    );
    assert!(matches!(
        store
            .session(&durable_core::SessionId::new(format!("{id}-initial")))
            .await,
        Err(durable_core::StoreError::SessionNotFound(_))
    ));
}

/// `calls_page` walks a journal by position: pages of `limit` rows, in issue order, the
/// last one short; together they are the whole journal, and a page past the end is empty.
pub async fn paging_calls_page_walks_the_journal_by_position(store: Arc<dyn CheckpointStore>) {
    let durable = capped(&store, "pages", SizeLimits::default());
    let session = start(&durable).await;
    let id = session.id().clone();
    let s = spec("lookup", ReplayClass::Pure);
    for n in 0..7 {
        session
            .journal()
            .tool(&s, json!({ "n": n }))
            .run(move |_| async move { Ok::<_, String>(json!(n)) })
            .await
            .expect("a pure call");
    }
    let whole = store.calls(&id, None).await.expect("calls");
    assert_eq!(whole.len(), 7);
    let mut walked = Vec::new();
    let mut sizes = Vec::new();
    let mut after = 0;
    loop {
        let page = store.calls_page(&id, after, 3).await.expect("a page");
        sizes.push(page.len());
        after += i64::try_from(page.len()).expect("small");
        let last = page.len() < 3;
        walked.extend(page);
        if last {
            break;
        }
    }
    assert_eq!(sizes, [3, 3, 1], "pages of 3, the last one short");
    assert_eq!(walked, whole, "the pages are the journal, in issue order");
    assert!(
        store
            .calls_page(&id, 100, 3)
            .await
            .expect("past the end")
            .is_empty()
    );
    assert!(matches!(
        store
            .calls_page(&durable_core::SessionId::new(format!("{id}-none")), 0, 3)
            .await,
        Err(durable_core::StoreError::SessionNotFound(_))
    ));
}

/// `list_sessions` with a cursor: walking the listing page by page (keyset, by
/// `updated_at` then id, both descending) lists every session once, in order.
pub async fn paging_session_listing_resumes_after_a_cursor(store: Arc<dyn CheckpointStore>) {
    use durable_core::store::{SessionCursor, SessionFilter};
    let durable = capped(&store, "pages", SizeLimits::default());
    let mut mine = Vec::new();
    for _ in 0..5 {
        mine.push(start(&durable).await.id().clone());
    }
    let whole = store
        .list_sessions(&SessionFilter::new())
        .await
        .expect("list");
    let mut walked = Vec::new();
    let mut filter = SessionFilter::new().with_limit(2);
    loop {
        let page = store.list_sessions(&filter).await.expect("a page");
        assert!(page.len() <= 2, "{page:?}");
        let Some(last) = page.last() else { break };
        filter = SessionFilter::new()
            .with_limit(2)
            .with_after(SessionCursor::after(last));
        walked.extend(page);
    }
    let ids = |list: &[durable_core::store::SessionRecord]| {
        list.iter().map(|s| s.id.clone()).collect::<Vec<_>>()
    };
    assert_eq!(ids(&walked), ids(&whole), "every session once, in order");
    for pair in walked.windows(2) {
        let key = |s: &durable_core::store::SessionRecord| (s.updated_at, s.id.as_str().to_owned());
        assert!(key(&pair[0]) > key(&pair[1]), "descending: {pair:?}");
    }
    for id in &mine {
        assert!(ids(&walked).contains(id), "{id} is listed");
    }
}
