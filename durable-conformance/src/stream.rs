//! Cases: a streamed model reply is journaled once when its stream ends, replayed as a
//! stream of the same chunk type, and leaves nothing behind when the stream fails or is
//! dropped half-way (as a crash would).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures_util::stream::{self, StreamExt};
use serde::{Deserialize, Serialize};

use super::runtime::{runtime, start, take_over};
use durable_core::error::DurableError;
use durable_core::journal::{CallError, ReplyEvent, StreamedReply};
use durable_core::store::{CallKind, CheckpointStore};
use durable_core::transcript::Message;
use durable_core::{Session, Spend};

/// A reply streamed as text deltas, with a score the provider reports at the end.
#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
struct Reply {
    text: String,
    score: Option<f64>,
}

/// One chunk of a [`Reply`].
#[derive(Debug, Clone, PartialEq)]
enum Chunk {
    Text(String),
    Score(f64),
}

impl StreamedReply for Reply {
    type Chunk = Chunk;

    fn push(&mut self, chunk: &Chunk) {
        match chunk {
            Chunk::Text(delta) => self.text.push_str(delta),
            Chunk::Score(score) => self.score = Some(*score),
        }
    }

    fn replay(&self) -> Vec<Chunk> {
        let mut chunks = vec![Chunk::Text(self.text.clone())];
        chunks.extend(self.score.map(Chunk::Score));
        chunks
    }
}

/// The provider's stream: `chunks`, then `error` if given. Counts how often the model
/// was asked.
fn provider(
    asked: &Arc<AtomicUsize>,
    chunks: Vec<Chunk>,
    error: Option<&'static str>,
) -> impl FnOnce() -> stream::BoxStream<'static, Result<Chunk, String>> {
    let asked = Arc::clone(asked);
    move || {
        asked.fetch_add(1, Ordering::SeqCst);
        let items = chunks
            .into_iter()
            .map(Ok)
            .chain(error.map(|e| Err(e.to_owned())));
        stream::iter(items).boxed()
    }
}

fn hello() -> Vec<Chunk> {
    vec![
        Chunk::Text("Hel".into()),
        Chunk::Text("lo".into()),
        Chunk::Score(0.5),
    ]
}

/// Pulls every event of a streamed reply.
async fn pull(
    session: &Session<Message>,
    asked: &Arc<AtomicUsize>,
    chunks: Vec<Chunk>,
    error: Option<&'static str>,
) -> Vec<Result<ReplyEvent<Reply>, CallError<String>>> {
    let mut reply = session
        .model_stream::<Reply, _, _, _>(provider(asked, chunks, error))
        .await
        .expect("open the streamed reply");
    let mut events = Vec::new();
    while let Some(event) = reply.next().await {
        events.push(event);
    }
    events
}

async fn model_rows(store: &Arc<dyn CheckpointStore>, session: &durable_core::SessionId) -> usize {
    store
        .calls(session, None)
        .await
        .expect("calls")
        .iter()
        .filter(|row| row.kind == CallKind::Model)
        .count()
}

/// Live: every chunk as sent, then the assembled reply, journaled as one model row. A
/// re-run turn (after a crash once the reply was recorded) gets it back as a stream of the
/// same chunk type, and the model is not asked again.
pub async fn stream_reply_is_journaled_once_and_replayed_as_a_stream(
    store: Arc<dyn CheckpointStore>,
) {
    let (durable, _) = runtime(&store, "first");
    let session = start(&durable).await;
    let id = session.id().clone();
    let asked = Arc::new(AtomicUsize::new(0));
    let events = pull(&session, &asked, hello(), None).await;
    let expected = Reply {
        text: "Hello".into(),
        score: Some(0.5),
    };
    let live: Vec<ReplyEvent<Reply>> = events.into_iter().map(|e| e.expect("live")).collect();
    assert_eq!(
        live,
        vec![
            ReplyEvent::Chunk(Chunk::Text("Hel".into())),
            ReplyEvent::Chunk(Chunk::Text("lo".into())),
            ReplyEvent::Chunk(Chunk::Score(0.5)),
            ReplyEvent::Reply(expected.clone()),
        ]
    );
    assert_eq!(model_rows(&store, &id).await, 1, "one row for the reply");
    drop(session); // the worker dies after the reply was recorded

    let (resumed, _) = take_over(&store, &id, "second").await;
    let mut replay = resumed
        .session
        .model_stream::<Reply, _, _, _>(provider(&asked, vec![Chunk::Text("other".into())], None))
        .await
        .expect("replay");
    assert!(replay.is_replay());
    let mut replayed = Vec::new();
    while let Some(event) = replay.next().await {
        replayed.push(event.expect("replayed"));
    }
    assert_eq!(
        replayed,
        vec![
            ReplyEvent::Chunk(Chunk::Text("Hello".into())),
            ReplyEvent::Chunk(Chunk::Score(0.5)),
            ReplyEvent::Reply(expected),
        ],
        "the recorded reply, as chunks of the live type"
    );
    assert_eq!(asked.load(Ordering::SeqCst), 1, "the model was asked once");
    assert_eq!(model_rows(&store, &id).await, 1);
}

/// A stream that fails half-way, or one the caller drops, journals nothing and gives
/// the position back: the next streamed reply of the step is asked at the same position,
/// and a crash then resumes to ask the model again.
pub async fn stream_reply_failed_or_dropped_journals_nothing(store: Arc<dyn CheckpointStore>) {
    let (durable, _) = runtime(&store, "first");
    let session = start(&durable).await;
    let id = session.id().clone();
    let asked = Arc::new(AtomicUsize::new(0));

    // The provider fails after a chunk: the chunk reached the caller, then the error.
    let events = pull(
        &session,
        &asked,
        vec![Chunk::Text("Hel".into())],
        Some("reset"),
    )
    .await;
    assert_eq!(events.len(), 2, "{events:?}");
    assert!(matches!(&events[0], Ok(ReplyEvent::Chunk(_))));
    assert!(matches!(&events[1], Err(CallError::Tool(e)) if e == "reset"));
    assert_eq!(model_rows(&store, &id).await, 0, "nothing journaled");

    // The caller drops the stream after one chunk.
    {
        let mut reply = session
            .model_stream::<Reply, _, _, _>(provider(&asked, hello(), None))
            .await
            .expect("open");
        let first = reply.next().await.expect("a chunk").expect("ok");
        assert_eq!(first, ReplyEvent::Chunk(Chunk::Text("Hel".into())));
    }
    assert_eq!(model_rows(&store, &id).await, 0, "nothing journaled");

    // Asked again, at the same position (the first of the step).
    let reply = session
        .model_stream::<Reply, _, _, _>(provider(&asked, hello(), None))
        .await
        .expect("open")
        .into_reply()
        .await
        .expect("the reply");
    assert_eq!(reply.text, "Hello");
    let rows = store.calls(&id, None).await.expect("calls");
    assert_eq!(rows.len(), 1);
    assert_eq!(
        rows[0].identity.ordinal, 0,
        "the position given back was reused"
    );
    assert_eq!(asked.load(Ordering::SeqCst), 3);
}

/// The assembled reply goes through the same rules as a whole one: a non-finite value is
/// refused at the end of the stream and nothing is journaled; a reply asked for after it
/// was handed out is `StreamOver`.
pub async fn stream_reply_is_checked_like_a_whole_reply(store: Arc<dyn CheckpointStore>) {
    let (durable, _) = runtime(&store, "first");
    let session = start(&durable).await;
    let id = session.id().clone();
    let asked = Arc::new(AtomicUsize::new(0));
    let chunks = vec![Chunk::Text("x".into()), Chunk::Score(f64::NAN)];
    let events = pull(&session, &asked, chunks, None).await;
    let last = events.last().expect("events");
    assert!(
        matches!(
            last,
            Err(CallError::Durable(DurableError::InvalidValue { .. }))
        ),
        "{last:?}"
    );
    assert_eq!(model_rows(&store, &id).await, 0, "nothing journaled");

    // Spend is computed from the assembled reply and charged once.
    let reply = session
        .model_stream_with_spend::<Reply, _, _, _, _>(provider(&asked, hello(), None), |r| {
            r.score.map(|_| Spend::from_nano_usd(1_000, 3, 4))
        })
        .await
        .expect("open");
    let mut stream = Box::pin(reply.into_stream());
    let mut last = None;
    while let Some(event) = stream.next().await {
        last = Some(event.expect("event"));
    }
    assert!(matches!(last, Some(ReplyEvent::Reply(_))));
    let rows = store.calls(&id, None).await.expect("calls");
    assert!(
        rows[0].spend.is_some(),
        "the spend is recorded with the reply"
    );

    let mut over = session
        .model_stream::<Reply, _, _, _>(provider(&asked, hello(), None))
        .await
        .expect("open");
    while over.next().await.is_some() {}
    let refused = over.into_reply().await;
    assert!(
        matches!(
            refused,
            Err(CallError::Durable(DurableError::StreamOver { .. }))
        ),
        "{refused:?}"
    );
}
