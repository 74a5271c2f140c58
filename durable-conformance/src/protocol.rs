//! Runtime cases for the two guards of the replay protocol, driven as an ordinary harness
//! drives a session: a refusal is fed back to the model as a tool result, the turn is
//! checkpointed, and the model's next proposal is dispatched.
//!
//! - the session-wide barrier: while an `unsafe_on_replay` call is in doubt, no call with a
//!   side effect runs in the session, in any step;
//! - divergence: a re-run step may not take a new call with a side effect, nor end, while
//!   a recorded one of that step has not been replayed.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{Value, json};

use super::runtime::{
    call, call_and_die, email_in_doubt, resolve_only_doubt, runtime, spec, start, take_over,
};
use durable_core::error::DurableError;
use durable_core::journal::CallError;
use durable_core::replay::ReplayClass;
use durable_core::session::Session;
use durable_core::store::{CallStatus, CheckpointStore, Resolution};
use durable_core::transcript::Message;

/// What an ordinary harness does with a refusal: tell the model and close the turn.
async fn feed_back_and_checkpoint(session: &mut Session<Message>, err: &CallError<String>) {
    session.push(Message::tool_result(
        "call",
        json!({ "error": err.to_string() }),
        true,
    ));
    session
        .checkpoint()
        .await
        .expect("a turn that ran nothing with a side effect checkpoints");
}

fn refused_by_barrier(err: &CallError<String>, in_doubt: &str, refused: &str) -> bool {
    matches!(
        err,
        CallError::Durable(DurableError::ReplayUnsafe { tool, refused_tool, .. })
            if tool == in_doubt && refused_tool == refused
    )
}

/// An email left in doubt by a dead worker guards the whole session: the harness feeds
/// the refusal to the model, checkpoints, and the model's next turn asks for a new email
/// and a charge; both are refused (naming the in-doubt email and the refused tool) while a
/// pure read runs. An operator's resolution lifts the barrier for the live handle.
pub async fn runtime_barrier_holds_across_steps(store: Arc<dyn CheckpointStore>) {
    let (id, email, effects) =
        email_in_doubt(&store, spec("email", ReplayClass::UnsafeOnReplay)).await;
    let (resumed, _) = take_over(&store, &id, "second").await;
    let mut session = resumed.session;
    let err = call(&session, &email, 1, None, &effects)
        .await
        .expect_err("the in-doubt email is refused");
    assert!(refused_by_barrier(&err, "email", "email"), "{err:?}");
    feed_back_and_checkpoint(&mut session, &err).await;

    // The next turn: the model tries again with other words, and charges the card.
    let err = call(&session, &email, 2, None, &effects)
        .await
        .expect_err("a new email in a later step is refused");
    assert!(refused_by_barrier(&err, "email", "email"), "{err:?}");
    let charge = spec("charge", ReplayClass::IdempotentWithKey);
    let charges = Arc::new(AtomicUsize::new(0));
    let err = call(&session, &charge, 2, Some("order-2"), &charges)
        .await
        .expect_err("a keyed call in a later step is refused");
    assert!(refused_by_barrier(&err, "email", "charge"), "{err:?}");
    let CallError::Durable(DurableError::ReplayUnsafe { call: blocked, .. }) = &err else {
        unreachable!("checked above: {err:?}")
    };
    assert_eq!(
        store.call(blocked).await.expect("row").status,
        CallStatus::Issued,
        "the refusal names the in-doubt row"
    );
    let reads = Arc::new(AtomicUsize::new(0));
    call(&session, &spec("read", ReplayClass::Pure), 2, None, &reads)
        .await
        .expect("a pure read runs beside the in-doubt call");
    session
        .model(|| async { Ok::<_, String>(json!({"text": "thinking"})) })
        .await
        .expect("a model call runs beside the in-doubt call");
    assert_eq!(effects.load(Ordering::SeqCst), 1, "one email, not two");
    assert_eq!(charges.load(Ordering::SeqCst), 0, "no charge beside it");

    // Settled by an operator: the live handle goes on without a resume.
    let (operator, _) = runtime(&store, "operator");
    resolve_only_doubt(
        &operator,
        &id,
        Resolution::Happened {
            result: json!({"receipt": "r-1"}),
        },
        "dana",
        None,
    )
    .await;
    call(&session, &charge, 2, Some("order-2"), &charges)
        .await
        .expect("the charge runs once the email is settled");
    assert_eq!(charges.load(Ordering::SeqCst), 1);
}

/// The barrier is in the store, not in the handle: a worker that checkpointed past a
/// refused in-doubt call and died leaves it to the next worker, whose resume finds it and
/// refuses a new unsafe call in a later step.
pub async fn runtime_barrier_survives_checkpoint_and_resume(store: Arc<dyn CheckpointStore>) {
    let (id, email, effects) =
        email_in_doubt(&store, spec("email", ReplayClass::UnsafeOnReplay)).await;
    let (resumed, _) = take_over(&store, &id, "second").await;
    let mut session = resumed.session;
    let err = call(&session, &email, 1, None, &effects)
        .await
        .expect_err("in doubt");
    feed_back_and_checkpoint(&mut session, &err).await;
    drop(session);

    let (resumed, _) = take_over(&store, &id, "third").await;
    assert!(
        resumed.report.needs_attention(),
        "the resume reports the email from an earlier step: {:?}",
        resumed.report
    );
    let post = spec("post", ReplayClass::UnsafeOnReplay);
    let err = call(&resumed.session, &post, 7, None, &effects)
        .await
        .expect_err("another unsafe tool is refused in a later step");
    assert!(refused_by_barrier(&err, "email", "post"), "{err:?}");
    assert_eq!(effects.load(Ordering::SeqCst), 1);
}

/// A call of this very handle whose outcome is unknown (its future was dropped after the
/// effect) guards the later steps of the live session too, not only its own.
pub async fn runtime_barrier_covers_own_interrupted_call_in_later_steps(
    store: Arc<dyn CheckpointStore>,
) {
    let (durable, _) = runtime(&store, "first");
    let mut session = start(&durable).await;
    let email = spec("email", ReplayClass::UnsafeOnReplay);
    let effects = Arc::new(AtomicUsize::new(0));
    call_and_die(&session, &email, 1, None, &effects).await;
    let err = call(&session, &email, 1, None, &effects)
        .await
        .expect_err("the retry is refused");
    feed_back_and_checkpoint(&mut session, &err).await;
    let err = call(&session, &email, 1, None, &effects)
        .await
        .expect_err("the same email asked for in the next step is refused");
    assert!(refused_by_barrier(&err, "email", "email"), "{err:?}");
    assert_eq!(effects.load(Ordering::SeqCst), 1);
}

/// A step recorded the model's reply and the email it asked for, then its worker died
/// before the checkpoint. On the re-run the recorded reply no longer decodes (a field was
/// renamed), so the harness asks the model again, and the model asks for the email in the
/// new shape, which matches no record: refused as `ReplayDiverged`, naming the recorded
/// call; a keyed call too; a pure read runs; the step cannot be checkpointed past the
/// unreplayed email. Once the re-run replays the recorded email, new calls and the
/// checkpoint are allowed.
pub async fn runtime_diverged_rerun_is_refused(store: Arc<dyn CheckpointStore>) {
    let (durable, _) = runtime(&store, "first");
    let session = start(&durable).await;
    let email = spec("email", ReplayClass::UnsafeOnReplay);
    let effects = Arc::new(AtomicUsize::new(0));
    let reply: Value = session
        .model(|| async { Ok::<_, String>(json!({ "to": "ann", "n": 1 })) })
        .await
        .expect("the model's reply is journaled");
    assert_eq!(reply["to"], "ann");
    let first = call(&session, &email, 1, None, &effects)
        .await
        .expect("the first attempt sends the email");
    let recorded = store
        .calls(session.id(), None)
        .await
        .expect("calls")
        .into_iter()
        .find(|r| r.identity.tool == "email")
        .expect("the email's row")
        .id;
    let id = session.id().clone();
    drop(session); // dies before the checkpoint: the step is re-run

    let (resumed, _) = take_over(&store, &id, "second").await;
    let mut session = resumed.session;
    // Today's reply type reads `recipient`: the recorded reply no longer decodes.
    #[derive(serde::Serialize, serde::Deserialize, Debug)]
    struct Reply {
        recipient: String,
    }
    let err = session
        .model(|| async {
            Ok::<_, String>(Reply {
                recipient: "never asked".into(),
            })
        })
        .await
        .expect_err("the recorded reply does not decode");
    assert!(
        matches!(&err, CallError::Durable(DurableError::Decode { .. })),
        "{err:?}"
    );
    // The harness tells the model and asks again: a reply asked for anew.
    let again: Reply = session
        .model(|| async {
            Ok::<_, String>(Reply {
                recipient: "ann".into(),
            })
        })
        .await
        .expect("the model is asked again");
    assert_eq!(again.recipient, "ann");
    let diverged = |err: &CallError<String>, refused: &str| {
        matches!(
            err,
            CallError::Durable(DurableError::ReplayDiverged { recorded: r, recorded_tool, refused_tool, step, .. })
                if *r == recorded && recorded_tool == "email" && refused_tool == refused && *step == 0
        )
    };
    let err = call(&session, &email, 2, None, &effects)
        .await
        .expect_err("a new email in the re-run step is refused");
    assert!(diverged(&err, "email"), "{err:?}");
    let charge = spec("charge", ReplayClass::IdempotentWithKey);
    let err = call(&session, &charge, 2, Some("k"), &effects)
        .await
        .expect_err("a new keyed call is refused too");
    assert!(diverged(&err, "charge"), "{err:?}");
    call(
        &session,
        &spec("read", ReplayClass::Pure),
        2,
        None,
        &effects,
    )
    .await
    .expect("a pure read runs");
    assert_eq!(effects.load(Ordering::SeqCst), 2, "one email and one read");
    session.push(Message::tool_result(
        "call",
        json!({ "error": err.to_string() }),
        true,
    ));
    let refused = session
        .checkpoint()
        .await
        .expect_err("the step cannot end past its unreplayed email");
    assert!(
        matches!(&refused, DurableError::ReplayDiverged { refused_tool, .. } if refused_tool == "checkpoint"),
        "{refused:?}"
    );

    // The fix (e.g. a serde alias) makes the re-run replay the recorded call.
    let again: Value = call(&session, &email, 1, None, &effects)
        .await
        .expect("the recorded email is returned");
    assert_eq!(again, first);
    call(&session, &email, 2, None, &effects)
        .await
        .expect("a new email after the replayed one is the model's new decision");
    session
        .checkpoint()
        .await
        .expect("every recorded call was replayed: the step ends");
    assert_eq!(effects.load(Ordering::SeqCst), 3, "two emails and one read");
}

/// Before the model is asked anew, a re-run step's calls come from recorded replies: a
/// call the first attempt never reached runs, even before a sibling of the same reply has
/// been replayed (parallel calls are decided in any order), and the step ends once every
/// recorded call was replayed.
pub async fn runtime_rerun_runs_calls_the_first_attempt_never_reached(
    store: Arc<dyn CheckpointStore>,
) {
    let (durable, _) = runtime(&store, "first");
    let session = start(&durable).await;
    session
        .model(|| async { Ok::<_, String>(json!({ "calls": ["email", "charge"] })) })
        .await
        .expect("the reply is journaled");
    let email = spec("email", ReplayClass::UnsafeOnReplay);
    let charge = spec("charge", ReplayClass::IdempotentWithKey);
    let emails = Arc::new(AtomicUsize::new(0));
    let charges = Arc::new(AtomicUsize::new(0));
    let first = call(&session, &email, 1, None, &emails)
        .await
        .expect("the email is sent");
    let id = session.id().clone();
    drop(session); // dies before the charge was issued

    let (resumed, _) = take_over(&store, &id, "second").await;
    let mut session = resumed.session;
    session
        .model(|| async { Ok::<_, String>(json!({ "never": "asked" })) })
        .await
        .expect("the recorded reply is replayed");
    call(&session, &charge, 2, Some("order-2"), &charges)
        .await
        .expect("the charge the first attempt never reached runs, before the email's replay");
    let again = call(&session, &email, 1, None, &emails)
        .await
        .expect("the email is replayed");
    assert_eq!(again, first);
    session
        .checkpoint()
        .await
        .expect("every recorded call was replayed");
    assert_eq!(emails.load(Ordering::SeqCst), 1);
    assert_eq!(charges.load(Ordering::SeqCst), 1);
}

/// A re-run step that never reaches its recorded effect (the harness gave up on the turn)
/// may not checkpoint past it: otherwise the next step could repeat it unseen.
pub async fn runtime_rerun_cannot_skip_a_recorded_effect(store: Arc<dyn CheckpointStore>) {
    let (durable, _) = runtime(&store, "first");
    let session = start(&durable).await;
    let charge = spec("charge", ReplayClass::IdempotentWithKey);
    let runs = Arc::new(AtomicUsize::new(0));
    call(&session, &charge, 1, Some("order-1"), &runs)
        .await
        .expect("first attempt");
    let id = session.id().clone();
    drop(session);

    let (resumed, _) = take_over(&store, &id, "second").await;
    let mut session = resumed.session;
    let err = session
        .checkpoint()
        .await
        .expect_err("a checkpoint that skips the recorded charge is refused");
    assert!(
        matches!(&err, DurableError::ReplayDiverged { recorded_tool, .. } if recorded_tool == "charge"),
        "{err:?}"
    );
    call(&session, &charge, 1, Some("order-1"), &runs)
        .await
        .expect("replayed");
    session.checkpoint().await.expect("replayed: the step ends");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A non-finite float never enters the journal: not in a typed result (a `pure` call's
/// row is not written; an unsafe call whose effect ran stays in doubt instead of being
/// recorded as `null`), not in a model reply (no completed row that the replay could not
/// decode). Each is a typed error naming the path.
pub async fn runtime_non_finite_values_never_enter_the_journal(store: Arc<dyn CheckpointStore>) {
    #[derive(serde::Serialize, serde::Deserialize, Debug)]
    struct Reading {
        celsius: f64,
    }
    let (durable, _) = runtime(&store, "first");
    let session = start(&durable).await;
    let read = spec("read", ReplayClass::Pure);
    for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        let err = session
            .journal()
            .tool(&read, json!({ "n": 1 }))
            .run(move |_ctx| async move { Ok::<_, String>(Reading { celsius: bad }) })
            .await
            .expect_err("a non-finite result is refused");
        assert!(
            matches!(&err, CallError::Durable(DurableError::InvalidValue { source, .. }) if source.path == "$.celsius"),
            "{err:?}"
        );
        let err = session
            .model(move || async move { Ok::<_, String>(Reading { celsius: bad }) })
            .await
            .expect_err("a non-finite model reply is refused");
        assert!(
            matches!(&err, CallError::Durable(DurableError::InvalidValue { source, .. }) if source.path == "$.celsius"),
            "{err:?}"
        );
    }
    assert!(
        store
            .calls(session.id(), None)
            .await
            .expect("calls")
            .is_empty(),
        "nothing was journaled"
    );

    let email = spec("email", ReplayClass::UnsafeOnReplay);
    let err = session
        .journal()
        .tool(&email, json!({ "n": 1 }))
        .run(|_ctx| async { Ok::<_, String>(Reading { celsius: f64::NAN }) })
        .await
        .expect_err("the email's result cannot be journaled");
    assert!(
        matches!(&err, CallError::Durable(DurableError::InvalidValue { .. })),
        "{err:?}"
    );
    let rows = store.calls(session.id(), None).await.expect("calls");
    assert_eq!(rows.len(), 1);
    assert_eq!(
        rows[0].status,
        CallStatus::Issued,
        "the email ran, its result is unknown to the journal: in doubt, not `null`"
    );
    let runs = Arc::new(AtomicUsize::new(0));
    let err = call(
        &session,
        &spec("post", ReplayClass::UnsafeOnReplay),
        2,
        None,
        &runs,
    )
    .await
    .expect_err("the barrier holds behind it");
    assert!(refused_by_barrier(&err, "email", "post"), "{err:?}");
}

/// The re-asked reply of a diverged re-run is itself recorded: a later re-run replays it
/// instead of asking anew, and must still see that it has left the first attempt's path
/// (the reply was asked after the recorded email) and refuse the email in its new shape.
pub async fn runtime_divergence_survives_a_second_rerun(store: Arc<dyn CheckpointStore>) {
    #[derive(serde::Serialize, serde::Deserialize, Debug)]
    struct Reply {
        recipient: String,
    }
    async fn rerun(
        store: &Arc<dyn CheckpointStore>,
        id: &durable_core::SessionId,
        owner: &str,
        email: &durable_core::ToolSpec,
        effects: &Arc<AtomicUsize>,
    ) -> CallError<String> {
        let (resumed, _) = take_over(store, id, owner).await;
        let session = resumed.session;
        session
            .model(|| async {
                Ok::<_, String>(Reply {
                    recipient: "x".into(),
                })
            })
            .await
            .expect_err("the first attempt's reply does not decode");
        session
            .model(|| async {
                Ok::<_, String>(Reply {
                    recipient: "ann".into(),
                })
            })
            .await
            .expect("the re-asked reply, asked anew or replayed");
        call(&session, email, 2, None, effects)
            .await
            .expect_err("the email in its new shape is refused")
    }
    let (durable, _) = runtime(&store, "first");
    let session = start(&durable).await;
    let email = spec("email", ReplayClass::UnsafeOnReplay);
    let effects = Arc::new(AtomicUsize::new(0));
    session
        .model(|| async { Ok::<_, String>(json!({ "to": "ann" })) })
        .await
        .expect("journaled");
    call(&session, &email, 1, None, &effects)
        .await
        .expect("sent");
    let id = session.id().clone();
    drop(session);

    for owner in ["second", "third"] {
        let err = rerun(&store, &id, owner, &email, &effects).await;
        assert!(
            matches!(&err, CallError::Durable(DurableError::ReplayDiverged { recorded_tool, .. }) if recorded_tool == "email"),
            "{owner}: {err:?}"
        );
    }
    assert_eq!(effects.load(Ordering::SeqCst), 1, "one email");
}

/// A recorded result that no longer decodes into today's type was not delivered: it does
/// not count as replayed. The harness feeds the error back, the model is asked again and
/// retries the same email (which now has the next ordinal, so it matches no record): it
/// is refused as diverged, and the step cannot end past the undelivered record.
pub async fn runtime_undecodable_record_is_not_replayed(store: Arc<dyn CheckpointStore>) {
    #[derive(serde::Serialize, serde::Deserialize, Debug)]
    struct Sent {
        message_id: String,
    }
    let (durable, _) = runtime(&store, "first");
    let session = start(&durable).await;
    let email = spec("email", ReplayClass::UnsafeOnReplay);
    let effects = Arc::new(AtomicUsize::new(0));
    session
        .model(|| async { Ok::<_, String>(json!({ "send": 1 })) })
        .await
        .expect("journaled");
    call(&session, &email, 1, None, &effects)
        .await
        .expect("sent");
    let id = session.id().clone();
    drop(session);

    let (resumed, _) = take_over(&store, &id, "second").await;
    let mut session = resumed.session;
    session
        .model(|| async { Ok::<_, String>(json!({ "never": "asked" })) })
        .await
        .expect("replayed");
    let err = session
        .journal()
        .tool(&email, json!({ "n": 1 }))
        .run(|_ctx| async {
            Ok::<_, String>(Sent {
                message_id: "never".into(),
            })
        })
        .await
        .expect_err("the record does not decode into today's type");
    assert!(
        matches!(&err, CallError::Durable(DurableError::Decode { .. })),
        "{err:?}"
    );
    session
        .model(|| async { Ok::<_, String>(json!({ "send": 1, "again": true })) })
        .await
        .expect("asked anew");
    let err = call(&session, &email, 1, None, &effects)
        .await
        .expect_err("the retry is refused");
    assert!(
        matches!(&err, CallError::Durable(DurableError::ReplayDiverged { recorded_tool, .. }) if recorded_tool == "email"),
        "{err:?}"
    );
    let err = session.checkpoint().await.expect_err("the step cannot end");
    assert!(
        matches!(&err, DurableError::ReplayDiverged { .. }),
        "{err:?}"
    );
    assert_eq!(effects.load(Ordering::SeqCst), 1, "one email");
}

/// A tool whose argument schema changed since its call was recorded in the step (a field
/// added or renamed) cannot match its record, model re-asked or not: a new call of it is
/// refused as diverged instead of running beside the recorded one.
pub async fn runtime_reshaped_tool_is_refused_without_a_reask(store: Arc<dyn CheckpointStore>) {
    let (durable, _) = runtime(&store, "first");
    let session = start(&durable).await;
    let email = spec("email", ReplayClass::UnsafeOnReplay);
    let effects = Arc::new(AtomicUsize::new(0));
    call(&session, &email, 1, None, &effects)
        .await
        .expect("sent");
    let id = session.id().clone();
    drop(session);

    let (resumed, _) = take_over(&store, &id, "second").await;
    let reshaped = durable_core::ToolSpec::new(
        "email",
        "test tool email, with a cc",
        ReplayClass::UnsafeOnReplay,
        json!({"type": "object", "properties": {"n": {"type": "integer"}, "cc": {"type": ["string", "null"]}}}),
    );
    let runs = Arc::clone(&effects);
    let err = resumed
        .session
        .journal()
        .tool(&reshaped, json!({ "n": 1, "cc": null }))
        .run(move |ctx| super::runtime::body(ctx, Arc::clone(&runs), 1))
        .await
        .expect_err("refused");
    assert!(
        matches!(&err, CallError::Durable(DurableError::ReplayDiverged { recorded_tool, refused_tool, .. }) if recorded_tool == "email" && refused_tool == "email"),
        "{err:?}"
    );
    assert_eq!(effects.load(Ordering::SeqCst), 1, "one email");
}
