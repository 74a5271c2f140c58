//! Cases: the bounded resume. A resume with a window loads the transcript's
//! last messages only; earlier ones come on demand, checked like the rest; checkpoints
//! keep appending to the whole log.

use std::sync::Arc;

use durable_core::error::{DurableError, StoreError};
use durable_core::ids::SessionId;
use durable_core::runtime::{Durable, StartOptions};
use durable_core::session::Session;
use durable_core::store::CheckpointStore;
use durable_core::transcript::Message;

use super::{expect_err, owner};

/// The `n`-th message of the test transcripts.
fn message(n: usize) -> Message {
    Message::user(format!("message {n}"))
}

fn durable(store: &Arc<dyn CheckpointStore>, window: Option<usize>) -> Durable {
    let builder = Durable::builder(Arc::clone(store))
        .owner(owner("window"))
        .app_version("v1");
    match window {
        Some(window) => builder.resume_window(window),
        None => builder,
    }
    .build()
}

/// A released session whose transcript is messages `0..total`: one at start, then
/// checkpoints of `per_turn` messages (the last one shorter).
pub(super) async fn session_of(
    store: &Arc<dyn CheckpointStore>,
    total: usize,
    per_turn: usize,
) -> SessionId {
    let durable = durable(store, None);
    let mut session: Session<Message> = durable
        .start(StartOptions::new().with_messages((0..total.min(1)).map(message).collect()))
        .await
        .expect("start");
    let mut n = total.min(1);
    while n < total {
        for _ in 0..per_turn.max(1) {
            if n < total {
                session.push(message(n));
                n += 1;
            }
        }
        session.checkpoint().await.expect("checkpoint");
    }
    let id = session.id().clone();
    session.release().await.expect("release");
    id
}

/// Resumes `id` with `window`.
async fn resume(
    store: &Arc<dyn CheckpointStore>,
    id: &SessionId,
    window: Option<usize>,
) -> Session<Message> {
    durable(store, window)
        .resume::<Message>(id)
        .await
        .unwrap_or_else(|e| panic!("resume with window {window:?}: {e}"))
        .session
}

/// For transcripts of several lengths and every window around their edges, a windowed
/// resume holds exactly the transcript's tail, at the right position; loading earlier
/// messages in chunks of several sizes rebuilds the whole transcript; and a checkpoint
/// written after a windowed resume appends to the whole log (a full resume then reads
/// every message, in order).
pub async fn runtime_resume_window_holds_the_tail_and_the_rest_on_demand(
    store: Arc<dyn CheckpointStore>,
) {
    for (total, per_turn) in [(0, 1), (1, 1), (7, 2), (12, 5)] {
        let id = session_of(&store, total, per_turn).await;
        let whole: Vec<Message> = (0..total).map(message).collect();
        let mut written = total;
        for window in [0, 1, 2, 3, total.saturating_sub(1), total, total + 4] {
            for chunk in [1, 2, 7] {
                let case = format!("{total} messages, window {window}, chunks of {chunk}");
                let mut session = resume(&store, &id, Some(window)).await;
                let kept = window.min(written);
                let expected_tail: Vec<Message> = (written - kept..written).map(message).collect();
                assert_eq!(session.messages(), expected_tail, "{case}: the tail");
                assert_eq!(
                    session.first_position(),
                    (written - kept + 1) as i64,
                    "{case}: first_position"
                );
                let mut loads = 0;
                while session.first_position() > 1 {
                    let before = session.first_position();
                    let loaded = session
                        .load_earlier(chunk)
                        .await
                        .unwrap_or_else(|e| panic!("{case}: load_earlier: {e}"));
                    assert_eq!(
                        loaded,
                        chunk.min(before as usize - 1),
                        "{case}: load_earlier({chunk}) from position {before}"
                    );
                    loads += 1;
                    assert!(loads <= written, "{case}: load_earlier does not progress");
                }
                assert_eq!(
                    session.load_earlier(chunk).await.expect("at the start"),
                    0,
                    "{case}: nothing before position 1"
                );
                let all: Vec<Message> = (0..written).map(message).collect();
                assert_eq!(session.messages(), all, "{case}: the whole transcript");
                // A turn after the resume appends to the whole log.
                session.push(message(written));
                session
                    .checkpoint()
                    .await
                    .expect("checkpoint after a windowed resume");
                written += 1;
                session.release().await.expect("release");
                let full = resume(&store, &id, None).await;
                let all: Vec<Message> = (0..written).map(message).collect();
                assert_eq!(full.messages(), all, "{case}: a full resume after it");
                assert_eq!(full.first_position(), 1);
                full.release().await.expect("release");
            }
        }
        // The untouched start of the transcript is what it was.
        let full = resume(&store, &id, None).await;
        assert_eq!(&full.messages()[..total], whole.as_slice());
        full.release().await.expect("release");
    }
}

/// A windowed resume that pushes and checkpoints without loading anything earlier: the
/// pushed messages land after the whole log, not after the window.
pub async fn runtime_resume_window_checkpoints_append_after_the_unloaded_messages(
    store: Arc<dyn CheckpointStore>,
) {
    let id = session_of(&store, 9, 4).await;
    let mut session = resume(&store, &id, Some(2)).await;
    assert_eq!(session.first_position(), 8);
    session.push(message(9));
    session.push(message(10));
    let meta = session.checkpoint().await.expect("checkpoint");
    assert_eq!(meta.last_seq, 11, "the log's end, not the window's");
    assert_eq!(meta.message_count, 11);
    assert_eq!(session.messages(), (7..11).map(message).collect::<Vec<_>>());
    session.release().await.expect("release");
    let full = resume(&store, &id, None).await;
    assert_eq!(full.messages(), (0..11).map(message).collect::<Vec<_>>());
}

/// `messages(from, to)` returns exactly the range asked for, and refuses a range outside
/// the latest checkpoint's transcript with `MessagesOutOfRange` (a session that does not
/// exist: `SessionNotFound`).
pub async fn store_messages_reads_a_checked_range(store: Arc<dyn CheckpointStore>) {
    let id = session_of(&store, 6, 2).await;
    for from in 1..=7_i64 {
        for to in from - 1..=6 {
            let got = store
                .messages(&id, from, to)
                .await
                .unwrap_or_else(|e| panic!("messages({from}, {to}): {e}"));
            let want = (from..=to)
                .map(|n| message(n as usize - 1))
                .collect::<Vec<_>>();
            let got = got
                .into_iter()
                .map(|m| m.decode::<Message>().expect("a message"))
                .collect::<Vec<_>>();
            assert_eq!(got, want, "messages({from}, {to})");
        }
    }
    for (from, to) in [(0, 3), (2, 7), (5, 3), (-1, -2), (7, 7)] {
        expect_err!(
            store.messages(&id, from, to).await,
            StoreError::MessagesOutOfRange { .. },
            "messages({from}, {to}) of a transcript of 6"
        );
    }
    expect_err!(
        store.messages(&SessionId::random(), 1, 1).await,
        StoreError::SessionNotFound(_),
        "messages of a session that does not exist"
    );
}

/// A resume with a window that no message fits in (0) still resumes, with no messages,
/// and a session of no messages loads nothing earlier.
pub async fn runtime_resume_window_of_nothing(store: Arc<dyn CheckpointStore>) {
    let id = session_of(&store, 4, 4).await;
    let mut session = resume(&store, &id, Some(0)).await;
    assert!(session.messages().is_empty());
    assert_eq!(session.first_position(), 5);
    let loaded = session.load_earlier(usize::MAX).await.expect("everything");
    assert_eq!(loaded, 4);
    assert_eq!(session.messages(), (0..4).map(message).collect::<Vec<_>>());
    assert_eq!(session.load_earlier(1).await.expect("nothing earlier"), 0);
}

/// Every message of a transcript changed or deleted behind the store's back, one at a
/// time: a windowed resume fails with `Tampered` whenever the change is inside the window
/// (or deletes the message before it, whose seal starts the window's chain); otherwise
/// the change is found by the resume (a backend that reads the whole transcript) or, at
/// the latest, as soon as the earlier messages are loaded.
pub(super) async fn window_reads_detect_changed_messages(
    store: &Arc<dyn CheckpointStore>,
    tamperer: &dyn super::tamper::Tamperer,
) {
    use super::tamper::Tamper;
    const TOTAL: usize = 10;
    const WINDOW: usize = 3;
    for position in 1..=TOTAL as i64 {
        for delete in [false, true] {
            let id = session_of(store, TOTAL, 3).await;
            let tamper = if delete {
                Tamper::DeleteMessage {
                    session: id.clone(),
                    seq: position,
                }
            } else {
                Tamper::SetMessage {
                    session: id.clone(),
                    seq: position,
                    // A valid message: only its seal can tell.
                    message: serde_json::to_string(&Message::user("pay mallory"))
                        .expect("a message serializes"),
                }
            };
            let case = format!(
                "message {position} {} with a window of {WINDOW}",
                if delete { "deleted" } else { "changed" }
            );
            tamperer.apply(tamper).await;
            let first_in_window = (TOTAL - WINDOW + 1) as i64;
            let seen_at_resume =
                position >= first_in_window || (delete && position == first_in_window - 1);
            let resumed = durable(store, Some(WINDOW)).resume::<Message>(&id).await;
            match (resumed, seen_at_resume) {
                (Err(DurableError::Store(StoreError::Tampered { .. })), _) => {}
                (Ok(resumed), false) => {
                    let mut session = resumed.session;
                    match session.load_earlier(TOTAL).await {
                        Err(DurableError::Store(StoreError::Tampered { .. })) => {}
                        other => panic!("{case}: loading the earlier messages gave {other:?}"),
                    }
                }
                (Ok(_), true) => panic!("{case}: the windowed resume did not see it"),
                (Err(e), _) => panic!("{case}: the windowed resume failed with {e}"),
            }
        }
    }
}
