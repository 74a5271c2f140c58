//! Runtime cases for [`Session::checkpoint_after`](durable_core::Session::checkpoint_after): a
//! tool call's result and the checkpoint that follows it, committed together.
//!
//! The store is wrapped in a [`Probe`] that counts checkpoint writes, so that "one
//! transaction" is checked as the store sees it: a `finish_call` carrying the checkpoint
//! (the method whose atomicity `journal_finish_with_checkpoint_is_atomic` checks), and
//! no separate `save_checkpoint`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{Value, json};

use super::runtime::{
    GIVE_UP, call, email_in_doubt, runtime, spec, start, stopped_then_resumed, take_over,
};
use super::stall::Probe;
use durable_core::error::DurableError;
use durable_core::journal::CallError;
use durable_core::replay::ReplayClass;
use durable_core::snapshot::{Budget, Spend};
use durable_core::store::{CallStatus, CheckpointStore};
use durable_core::transcript::Message;
use durable_core::{Journal, Session};
use durable_core::{ToolSpec, Verification};

fn probe(store: &Arc<dyn CheckpointStore>) -> (Arc<Probe>, Arc<dyn CheckpointStore>) {
    let probe = Probe::new(Arc::clone(store));
    let dyn_store: Arc<dyn CheckpointStore> = Arc::clone(&probe) as _;
    (probe, dyn_store)
}

/// `send` with argument `n`: counts its runs, reports a spend, returns a receipt.
async fn send(
    journal: &Journal,
    s: &ToolSpec,
    n: i64,
    runs: &Arc<AtomicUsize>,
) -> Result<Value, CallError<String>> {
    let runs = Arc::clone(runs);
    journal
        .tool(s, json!({ "n": n }))
        .run(move |ctx| {
            let runs = Arc::clone(&runs);
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                ctx.record_spend(Spend::new(0.5, 10, 5).expect("valid spend"));
                Ok(json!({ "receipt": format!("r-{n}") }))
            }
        })
        .await
}

async fn send_checkpointed(
    session: &mut Session<Message>,
    s: &ToolSpec,
    n: i64,
    runs: &Arc<AtomicUsize>,
) -> Result<Value, CallError<String>> {
    session
        .checkpoint_after(
            async |journal| send(journal, s, n, runs).await,
            move |outcome| Message::tool_outcome(format!("call_{n}"), outcome),
        )
        .await
}

fn budget(value: &Value) -> Budget {
    serde_json::from_value(value.clone()).expect("the stored budget decodes")
}

/// The result row and the checkpoint holding its message are written by one
/// `finish_call`; the session, the store and the next step all agree afterwards.
pub async fn runtime_checkpoint_after_commits_result_and_checkpoint_together(
    store: Arc<dyn CheckpointStore>,
) {
    let (probe, probed) = probe(&store);
    let (durable, _) = runtime(&probed, "first");
    let mut session = start(&durable).await;
    session.push(Message::user("email Ann"));
    let s = spec("email", ReplayClass::UnsafeOnReplay);
    let runs = Arc::new(AtomicUsize::new(0));

    let receipt = send_checkpointed(&mut session, &s, 1, &runs)
        .await
        .expect("the call and its checkpoint");
    assert_eq!(receipt, json!({"receipt": "r-1"}));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(
        (probe.finishes_with_checkpoint(), probe.saves()),
        (1, 0),
        "one finish_call carried the checkpoint; no separate save_checkpoint"
    );
    assert_eq!(session.version(), 1);
    let expected = [
        Message::user("email Ann"),
        Message::tool_result("call_1", json!({"receipt": "r-1"}), false),
    ];
    assert_eq!(session.messages(), expected);
    assert!(session.pending_messages().is_empty());

    let saved = store
        .load_checkpoint(session.id(), None)
        .await
        .expect("load the checkpoint");
    assert_eq!(saved.meta.version, 1);
    let stored: Vec<Message> = saved
        .messages
        .iter()
        .map(|m| m.decode().expect("a message"))
        .collect();
    assert_eq!(stored, expected);
    assert_eq!(
        budget(&saved.budget).total_tokens(),
        15,
        "the checkpoint's budget holds the call's own spend"
    );
    let rows = store.calls(session.id(), None).await.expect("calls");
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].status, CallStatus::Completed);
    assert_eq!(rows[0].identity.step, 0);

    // The next call belongs to the new step, and the spend is charged once.
    call(&session, &s, 2, None, &runs).await.expect("next call");
    let rows = store.calls(session.id(), Some(1)).await.expect("calls");
    assert_eq!(rows.len(), 1, "the call after the scope is in step 1");
    session.checkpoint().await.expect("checkpoint 2");
    let saved = store
        .load_checkpoint(session.id(), None)
        .await
        .expect("load");
    assert_eq!(saved.meta.version, 2);
    assert_eq!(budget(&saved.budget).total_tokens(), 15);
    assert_eq!(session.budget().total_tokens(), 15);

    // A `pure` call is recorded in a single insert: an ordinary checkpoint follows it.
    let lookup = spec("lookup", ReplayClass::Pure);
    let result = session
        .checkpoint_after(
            async |journal| send(journal, &lookup, 3, &runs).await,
            |outcome| Message::tool_outcome("call_3", outcome),
        )
        .await
        .expect("pure call");
    assert_eq!(result, json!({"receipt": "r-3"}));
    assert_eq!(session.version(), 3);
    assert_eq!(
        session.messages().last(),
        Some(&Message::tool_result(
            "call_3",
            json!({"receipt": "r-3"}),
            false
        ))
    );
    assert_eq!(probe.finishes_with_checkpoint(), 1);
    assert_eq!(probe.saves(), 2);
    let saved = store
        .load_checkpoint(session.id(), None)
        .await
        .expect("load");
    assert_eq!(
        budget(&saved.budget).total_tokens(),
        30,
        "the pure call's spend, once"
    );
    assert_eq!(session.budget().total_tokens(), 30);
}

/// On a re-run turn the recorded result is returned, not run again, and becomes the
/// message of the checkpoint that follows.
pub async fn runtime_checkpoint_after_returns_recorded_results(store: Arc<dyn CheckpointStore>) {
    let s = spec("email", ReplayClass::UnsafeOnReplay);
    let runs = Arc::new(AtomicUsize::new(0));
    let (durable, _) = runtime(&store, "first");
    let session = start(&durable).await;
    // The first worker records the result and dies before any checkpoint.
    send(session.journal(), &s, 1, &runs)
        .await
        .expect("first run");
    let id = session.id().clone();
    drop(session);

    let (resumed, _) = take_over(&store, &id, "second").await;
    let mut session = resumed.session;
    assert_eq!(session.version(), 0);
    let receipt = send_checkpointed(&mut session, &s, 1, &runs)
        .await
        .expect("the recorded result");
    assert_eq!(receipt, json!({"receipt": "r-1"}));
    assert_eq!(runs.load(Ordering::SeqCst), 1, "not run again");
    assert_eq!(session.version(), 1);
    assert_eq!(
        session.messages(),
        [Message::tool_result(
            "call_1",
            json!({"receipt": "r-1"}),
            false
        )]
    );
    let saved = store.load_checkpoint(&id, None).await.expect("load");
    assert_eq!(saved.meta.version, 1);
    assert_eq!(saved.messages.len(), 1);
}

/// A tool failure is recorded and checkpointed as an error message; a refused call
/// (`ReplayUnsafe`) writes nothing and leaves the session where it was.
pub async fn runtime_checkpoint_after_records_failures_and_writes_nothing_on_refusal(
    store: Arc<dyn CheckpointStore>,
) {
    let (probe, probed) = probe(&store);
    let (durable, _) = runtime(&probed, "first");
    let mut session = start(&durable).await;
    let s = spec("charge", ReplayClass::UnsafeOnReplay);
    let err = session
        .checkpoint_after(
            async |journal| {
                journal
                    .tool(&s, json!({"n": 1}))
                    .run(|_ctx| async { Err::<Value, _>("card declined".to_owned()) })
                    .await
            },
            |outcome| Message::tool_outcome("call_1", outcome),
        )
        .await
        .expect_err("the tool failed");
    assert!(
        matches!(&err, CallError::Tool(m) if m == "card declined"),
        "{err:?}"
    );
    assert_eq!(session.version(), 1);
    assert_eq!(probe.finishes_with_checkpoint(), 1);
    assert_eq!(
        session.messages(),
        [Message::tool_result(
            "call_1",
            json!({"error": "card declined"}),
            true
        )]
    );
    let rows = store.calls(session.id(), None).await.expect("calls");
    assert_eq!(rows[0].status, CallStatus::Failed);

    // An email left in doubt by a dead worker: the live session is refused, writes nothing.
    let (id, email, effects) =
        email_in_doubt(&store, spec("email", ReplayClass::UnsafeOnReplay)).await;
    let (resumed, _) = take_over(&probed, &id, "second").await;
    let mut session = resumed.session;
    let saves = (probe.finishes_with_checkpoint(), probe.saves());
    let err = session
        .checkpoint_after(
            async |journal| call_on(journal, &email, &effects).await,
            |outcome| Message::tool_outcome("call_1", outcome),
        )
        .await
        .expect_err("in doubt");
    assert!(
        matches!(err, CallError::Durable(DurableError::ReplayUnsafe { .. })),
        "{err:?}"
    );
    assert_eq!(effects.load(Ordering::SeqCst), 1, "not sent again");
    assert_eq!(session.version(), 0);
    assert!(session.messages().is_empty());
    assert_eq!((probe.finishes_with_checkpoint(), probe.saves()), saves);
}

async fn call_on(
    journal: &Journal,
    s: &ToolSpec,
    runs: &Arc<AtomicUsize>,
) -> Result<Value, CallError<String>> {
    let runs = Arc::clone(runs);
    journal
        .tool(s, json!({"n": 1}))
        .run(move |_ctx| {
            let runs = Arc::clone(&runs);
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok(json!({"sent": true}))
            }
        })
        .await
}

/// A second tool call inside the scope is refused before it is journaled or run; the
/// first call's checkpoint is written as usual, and calls after the scope work.
pub async fn runtime_checkpoint_after_allows_one_call(store: Arc<dyn CheckpointStore>) {
    let (durable, _) = runtime(&store, "first");
    let mut session = start(&durable).await;
    let s = spec("email", ReplayClass::UnsafeOnReplay);
    let runs = Arc::new(AtomicUsize::new(0));
    let mut second = None;
    let first = session
        .checkpoint_after(
            async |journal| {
                let first = send(journal, &s, 1, &runs).await;
                second = Some(send(journal, &s, 2, &runs).await);
                first
            },
            |outcome| Message::tool_outcome("call_1", outcome),
        )
        .await
        .expect("the first call");
    assert_eq!(first, json!({"receipt": "r-1"}));
    let second = second.expect("the second call returned");
    assert!(
        matches!(
            &second,
            Err(CallError::Durable(DurableError::OneCallPerCheckpoint { tool, .. })) if tool == "email"
        ),
        "{second:?}"
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the second call did not run"
    );
    assert_eq!(
        store.calls(session.id(), None).await.expect("calls").len(),
        1
    );
    assert_eq!(session.version(), 1);
    assert_eq!(session.messages().len(), 1);

    send(session.journal(), &s, 2, &runs)
        .await
        .expect("a call after the scope");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// A combined write whose reply never arrives leaves the handle refusing to go on; the
/// resumed session finds both the result and the checkpoint.
pub async fn runtime_checkpoint_after_interrupted_stops_the_handle(
    store: Arc<dyn CheckpointStore>,
) {
    let (probe, probed) = probe(&store);
    let (durable, _) = runtime(&probed, "first");
    let mut session = start(&durable).await;
    session.push(Message::user("email Ann"));
    let s = spec("email", ReplayClass::UnsafeOnReplay);
    let runs = Arc::new(AtomicUsize::new(0));
    probe.arm();
    tokio::select! {
        done = send_checkpointed(&mut session, &s, 1, &runs) => {
            panic!("an armed write must stall: {done:?}")
        }
        () = probe.stalled() => {}
        () = tokio::time::sleep(GIVE_UP) => panic!("the write never reached the store"),
    }
    assert_eq!(
        (probe.finishes_with_checkpoint(), probe.saves()),
        (1, 0),
        "the stalled write is the combined one"
    );
    let err = send_checkpointed(&mut session, &s, 2, &runs)
        .await
        .expect_err("refused");
    assert!(
        matches!(
            err,
            CallError::Durable(DurableError::CheckpointInDoubt { version: 1, .. })
        ),
        "{err:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let resumed = stopped_then_resumed(
        &store,
        session,
        &[
            Message::user("email Ann"),
            Message::tool_result("call_1", json!({"receipt": "r-1"}), false),
        ],
    )
    .await;
    assert!(
        resumed.report.in_doubt.is_empty(),
        "the result committed too"
    );
}

/// A combined write that fails leaves nothing behind: no message, no checkpoint, the
/// session on its version and step, and the call in doubt, so that a retry of an
/// `unsafe_on_replay` call is refused rather than sent again.
pub async fn runtime_checkpoint_after_failed_write_pushes_nothing(store: Arc<dyn CheckpointStore>) {
    let (probe, probed) = probe(&store);
    let (durable, _) = runtime(&probed, "first");
    let mut session = start(&durable).await;
    session.push(Message::user("email Ann"));
    let s = spec("email", ReplayClass::UnsafeOnReplay);
    let runs = Arc::new(AtomicUsize::new(0));
    probe.fail_next_combined_write();
    let err = send_checkpointed(&mut session, &s, 1, &runs)
        .await
        .expect_err("the write failed");
    assert!(
        matches!(err, CallError::Durable(DurableError::Store(_))),
        "{err:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the effect ran once");
    assert_eq!(session.version(), 0);
    assert_eq!(session.messages(), [Message::user("email Ann")]);
    assert_eq!(
        probe.saves(),
        0,
        "no ordinary checkpoint was written instead"
    );
    let saved = store
        .load_checkpoint(session.id(), None)
        .await
        .expect("load");
    assert_eq!(saved.meta.version, 0);

    let err = send_checkpointed(&mut session, &s, 1, &runs)
        .await
        .expect_err("the retry is refused");
    assert!(
        matches!(err, CallError::Durable(DurableError::ReplayUnsafe { .. })),
        "{err:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "never sent twice");
    assert_eq!(session.version(), 0);
    assert_eq!(session.messages().len(), 1);
}

/// The scope's call executed, then the caller's code kept the scope open and the scope
/// was dropped before the session recorded the outcome: nothing recorded it, so the email
/// is in doubt, exactly as after a crash. The live handle refuses the next call with a
/// side effect (the session-wide barrier), and a resumed session starts from version 0
/// with the email in doubt; it never ran twice.
pub async fn runtime_checkpoint_after_dropped_after_the_call_leaves_it_in_doubt(
    store: Arc<dyn CheckpointStore>,
) {
    let (durable, _) = runtime(&store, "first");
    let mut session = start(&durable).await;
    let s = spec("email", ReplayClass::UnsafeOnReplay);
    let runs = Arc::new(AtomicUsize::new(0));
    let executed = tokio::sync::Notify::new();
    let scope = session.checkpoint_after(
        async |journal| {
            let receipt = send(journal, &s, 1, &runs).await;
            executed.notify_one();
            // Some other work of the caller's, during which the scope is dropped.
            std::future::pending::<()>().await;
            receipt
        },
        |outcome| Message::tool_outcome("call_1", outcome),
    );
    tokio::select! {
        done = scope => panic!("the scope must hang: {done:?}"),
        () = executed.notified() => {}
        () = tokio::time::sleep(GIVE_UP) => panic!("the call never finished"),
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let err = send(
        session.journal(),
        &spec("post", ReplayClass::UnsafeOnReplay),
        2,
        &runs,
    )
    .await
    .expect_err("the barrier refuses a new effect beside the unrecorded email");
    assert!(
        matches!(&err, CallError::Durable(DurableError::ReplayUnsafe { tool, refused_tool, .. }) if tool == "email" && refused_tool == "post"),
        "{err:?}"
    );
    let id = session.id().clone();
    drop(session);
    let (resumed, _) = take_over(&store, &id, "second").await;
    assert_eq!(resumed.session.version(), 0, "nothing was checkpointed");
    assert!(
        resumed.report.needs_attention(),
        "the email is in doubt: {:?}",
        resumed.report
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "sent once");
}

/// A call on another handle of the same journal (a clone) is not the scope's: it runs
/// as an ordinary call, and the checkpoint carries the scope's own call's message.
pub async fn runtime_checkpoint_after_other_handles_are_not_the_scope(
    store: Arc<dyn CheckpointStore>,
) {
    let (durable, _) = runtime(&store, "first");
    let mut session = start(&durable).await;
    let outer = session.journal().clone();
    let lookup = spec("lookup", ReplayClass::Pure);
    let s = spec("email", ReplayClass::UnsafeOnReplay);
    let runs = Arc::new(AtomicUsize::new(0));
    let receipt = session
        .checkpoint_after(
            async |journal| {
                send(&outer, &lookup, 7, &runs)
                    .await
                    .expect("a call on another handle");
                send(journal, &s, 1, &runs).await
            },
            |outcome| Message::tool_outcome("call_1", outcome),
        )
        .await
        .expect("the scope's call");
    assert_eq!(receipt, json!({"receipt": "r-1"}));
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert_eq!(session.version(), 1);
    assert_eq!(
        session.messages(),
        [Message::tool_result(
            "call_1",
            json!({"receipt": "r-1"}),
            false
        )]
    );
    // And after the scope, the session's handle makes ordinary calls again.
    send(session.journal(), &s, 2, &runs)
        .await
        .expect("a call after the scope");
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

/// An in-doubt email whose verify hook finds it sent: the verified result and the
/// checkpoint holding it are written together, and nothing is sent again.
pub async fn runtime_checkpoint_after_commits_a_verified_result(store: Arc<dyn CheckpointStore>) {
    let (id, s, effects) = email_in_doubt(
        &store,
        spec("email", ReplayClass::UnsafeOnReplay).with_verify(),
    )
    .await;
    let (probe, probed) = probe(&store);
    let (resumed, _) = take_over(&probed, &id, "second").await;
    let mut session = resumed.session;
    let counter = Arc::clone(&effects);
    let result = session
        .checkpoint_after(
            async |journal| {
                journal
                    .tool(&s, json!({"n": 1}))
                    .run_verified(
                        move |_| {
                            counter.fetch_add(1, Ordering::SeqCst);
                            async { Ok::<Value, String>(json!({"receipt": "fresh"})) }
                        },
                        |_| async { Verification::Happened(json!({"receipt": "seen"})) },
                    )
                    .await
            },
            |outcome| Message::tool_outcome("call_1", outcome),
        )
        .await
        .expect("the verified result");
    assert_eq!(result, json!({"receipt": "seen"}));
    assert_eq!(effects.load(Ordering::SeqCst), 1, "not sent again");
    assert_eq!((probe.finishes_with_checkpoint(), probe.saves()), (1, 0));
    assert_eq!(session.version(), 1);
    assert_eq!(
        session.messages(),
        [Message::tool_result(
            "call_1",
            json!({"receipt": "seen"}),
            false
        )]
    );
    let rows = store.calls(&id, None).await.expect("calls");
    assert!(
        rows.iter().all(|r| r.status == CallStatus::Completed),
        "{rows:?}"
    );
}

/// In a re-run step whose recorded charge has not been replayed, the scope's new call
/// (one the first attempt never reached) is recorded on its own, not with a checkpoint:
/// the checkpoint that would end the step past the unreplayed charge is refused, and
/// nothing of the turn is adopted.
pub async fn runtime_checkpoint_after_does_not_end_a_step_with_an_unreplayed_call(
    store: Arc<dyn CheckpointStore>,
) {
    let (durable, _) = runtime(&store, "first");
    let session = start(&durable).await;
    let charge = spec("charge", ReplayClass::IdempotentWithKey);
    let runs = Arc::new(AtomicUsize::new(0));
    call(&session, &charge, 1, Some("order-1"), &runs)
        .await
        .expect("the first attempt charges");
    let id = session.id().clone();
    drop(session); // dies before the email was issued

    let (resumed, _) = take_over(&store, &id, "second").await;
    let mut session = resumed.session;
    let email = spec("email", ReplayClass::UnsafeOnReplay);
    let err = send_checkpointed(&mut session, &email, 2, &runs)
        .await
        .expect_err("the checkpoint is refused");
    assert!(
        matches!(&err, CallError::Durable(DurableError::ReplayDiverged { recorded_tool, refused_tool, .. }) if recorded_tool == "charge" && refused_tool == "checkpoint"),
        "{err:?}"
    );
    assert_eq!(session.version(), 0, "nothing adopted");
    assert_eq!(
        store
            .load_checkpoint(&id, None)
            .await
            .expect("load")
            .meta
            .version,
        0,
        "no checkpoint was written with the email"
    );
    let rows = store.calls(&id, None).await.expect("calls");
    let sent = rows
        .iter()
        .find(|r| r.identity.tool == "email")
        .expect("the email's row");
    assert_eq!(sent.status, CallStatus::Completed, "recorded on its own");
    assert_eq!(runs.load(Ordering::SeqCst), 2, "one charge, one email");
}
