//! rig's streamed completions (an agent's `stream()` runs) through the journal: the
//! provider's events reach rig as they arrive, the response the stream folded into is
//! journaled once when it ends (the same row as a `run()` reply), and a re-run turn
//! replays the recorded response as a stream of events.

use std::sync::Arc;

use durable_core::journal::{ReplyEvent, StreamedReply};
use futures_util::stream::{self, Stream, StreamExt};
use rig_core::completion::{CompletionRequest, CompletionResponse};
use rig_core::error::ErrorReport;
use rig_core::message::AssistantContent;
use rig_core::serve::stream_truncated;
use rig_core::streaming::{Item, Relayed, StreamEvent, StreamEvents};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::model::{JournaledModel, call_error_report, spend_of};
use crate::shared::Shared;

/// A rig completion streamed as [`Relayed`] items (the origin, the provider's events,
/// then the response the stream folded into), journaled as that response: the same
/// [`CompletionResponse`] a `run()` reply records, so a turn recorded streamed can be
/// replayed by `run()` and the other way round.
///
/// A recorded response is replayed as: its origin, then for each block of its `choice`
/// a `start` event, the block's text (text blocks) or argument text (tool calls) as one
/// fragment, and an `end` event carrying the block, then the response. The fragments'
/// boundaries are not the live ones; the text they join to is.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct StreamedResponse(pub Option<CompletionResponse>);

impl StreamedReply for StreamedResponse {
    type Chunk = Relayed;

    fn push(&mut self, chunk: &Relayed) {
        if let Relayed::Done(response) = chunk {
            self.0 = Some((**response).clone());
        }
    }

    fn replay(&self) -> Vec<Relayed> {
        let Some(response) = &self.0 else {
            return Vec::new();
        };
        let mut chunks = vec![Relayed::Origin(response.origin.clone())];
        for (index, block) in response.choice.iter().enumerate() {
            chunks.extend(
                replay_block(index, block)
                    .into_iter()
                    .map(|event| Relayed::Item(Item::Event(event))),
            );
        }
        chunks.push(Relayed::Done(Box::new(response.clone())));
        chunks
    }
}

/// The events that stream one recorded block. rig builds its events' part positions
/// itself; they read back from their serialized form, which is how they are made here.
fn replay_block(index: usize, block: &AssistantContent) -> Vec<StreamEvent> {
    let (kind, name, fragment) = match block {
        AssistantContent::Text(text) => (
            "text",
            None,
            Some(json!({"event": "text", "part": index, "text": text.text})),
        ),
        AssistantContent::ToolCall(call) => {
            let arguments = call
                .function
                .invalid_arguments
                .clone()
                .unwrap_or_else(|| Value::Object(call.function.arguments.clone()).to_string());
            (
                "tool_call",
                Some(call.function.name.as_str().to_owned()),
                Some(json!({"event": "arguments", "part": index, "json": arguments})),
            )
        }
        AssistantContent::Reasoning(_) => ("reasoning", None, None),
        AssistantContent::Image(_) => ("image", None, None),
        _ => ("opaque", None, None),
    };
    let mut start = json!({"event": "start", "part": index, "kind": kind});
    if let Some(name) = name {
        start["name"] = Value::String(name);
    }
    let end = json!({"event": "end", "part": index, "content": block});
    [Some(start), fragment, Some(end)]
        .into_iter()
        .flatten()
        .filter_map(|event| serde_json::from_value(event).ok())
        .collect()
}

impl JournaledModel {
    /// A streamed reply, as rig's bus carries it: the recorded one replayed as events on
    /// a re-run turn, else the inner model's stream, whose events are relayed as they
    /// arrive and whose response is journaled when it ends. The response (rig's terminal
    /// item) is held back until it is journaled, so no tool it asks for runs before, and
    /// it is the journaled one (secret arguments masked).
    ///
    /// A stream that fails, ends without its response, or is dropped leaves nothing in
    /// the journal: the re-run turn asks the model again.
    pub fn stream(&self, request: CompletionRequest) -> StreamEvents {
        let journal = self.journal.clone();
        let inner = self.inner.clone();
        let shared = Arc::clone(&self.shared);
        let opened = async move {
            let source = Arc::clone(&shared);
            let open = move || -> StreamEvents {
                match inner.stream(request) {
                    Ok(streamed) => Box::pin(complete(streamed.into_relay(), source)),
                    Err(error) => Box::pin(stream::iter([Err(ErrorReport::from(error))])),
                }
            };
            let spend = |reply: &StreamedResponse| reply.0.as_ref().map(|r| spend_of(&r.usage));
            let reply = match journal
                .model_stream_with_spend::<StreamedResponse, ErrorReport, _, _, _>(open, spend)
                .await
            {
                Ok(reply) => reply,
                Err(error) => {
                    let failed: StreamEvents =
                        Box::pin(stream::iter([Err(call_error_report(error, &shared))]));
                    return failed;
                }
            };
            let events = reply.into_stream().filter_map(move |event| {
                let shared = Arc::clone(&shared);
                async move {
                    match event {
                        // Held back: handed to rig once journaled, below.
                        Ok(ReplyEvent::Chunk(Relayed::Done(_))) => None,
                        Ok(ReplyEvent::Chunk(chunk)) => Some(Ok(chunk)),
                        Ok(ReplyEvent::Reply(StreamedResponse(Some(response)))) => {
                            shared.note_reply(&response);
                            Some(Ok(Relayed::Done(Box::new(response))))
                        }
                        Ok(ReplyEvent::Reply(StreamedResponse(None))) => {
                            Some(Err(stream_truncated()))
                        }
                        Err(error) => Some(Err(call_error_report(error, &shared))),
                    }
                }
            });
            let events: StreamEvents = Box::pin(events);
            events
        };
        Box::pin(stream::once(opened).flatten())
    }
}

/// The provider's relayed stream, with the response's invalid secret arguments
/// withheld before it is journaled, and an error in place of a silent end when the
/// stream ends without its response (so nothing is journaled for a cut reply).
fn complete(
    relay: StreamEvents,
    shared: Arc<Shared>,
) -> impl Stream<Item = Result<Relayed, ErrorReport>> + Send + 'static {
    stream::unfold(Some((relay, false)), move |state| {
        let shared = Arc::clone(&shared);
        async move {
            let (mut relay, ended) = state?;
            match relay.next().await {
                Some(Ok(Relayed::Done(mut response))) => {
                    shared.withhold_invalid_arguments(&mut response);
                    Some((Ok(Relayed::Done(response)), Some((relay, true))))
                }
                Some(Err(error)) => Some((Err(error), None)),
                Some(item) => Some((item, Some((relay, ended)))),
                None if ended => None,
                None => Some((Err(stream_truncated()), None)),
            }
        }
    })
}
