//! Streamed model replies: each chunk handed to the caller as it arrives, the assembled
//! reply journaled once when the stream ends (the same row as a whole reply, so dispatch,
//! divergence, the replay check, the console and exports see one reply), and a replayed
//! turn given the recorded reply back as chunks of the same type.
//!
//! What a crash leaves:
//! - **before the stream ended**, nothing: no row, and the reply's position in the step
//!   is free again. The re-run turn asks the model again. A partial reply is not kept in
//!   the journal (it is not a reply: a UI that showed part of it replaces it with the one
//!   the model gives again);
//! - **after it ended**, the reply's row: the re-run turn gets the recorded reply back as
//!   chunks ([`StreamedReply::replay`]) and the model is not asked.
//!
//! An error from the provider's stream, or a stream the caller drops half-way, leaves the
//! journal as a crash would: never a half-recorded reply.

use std::fmt::Display;
use std::pin::Pin;

use futures_util::stream::{Stream, StreamExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::Instrument;

use super::call::decode_result;
use super::model::Begun;
use super::ordinals::Reservation;
use super::{CallError, Journal};
use crate::error::DurableError;
use crate::snapshot::Spend;
use crate::store::{CallIdentity, CallRecord};
use crate::telemetry;

/// A model reply that arrives in chunks: how chunks fold into the reply that is
/// journaled, and how a recorded reply is handed back as chunks on a replay.
///
/// ```
/// use durable_core::journal::StreamedReply;
/// use serde::{Deserialize, Serialize};
///
/// /// A text reply, streamed as text deltas.
/// #[derive(Default, Serialize, Deserialize)]
/// struct Text {
///     text: String,
/// }
///
/// impl StreamedReply for Text {
///     type Chunk = String;
///
///     fn push(&mut self, chunk: &String) {
///         self.text.push_str(chunk);
///     }
///
///     fn replay(&self) -> Vec<String> {
///         vec![self.text.clone()]
///     }
/// }
/// ```
pub trait StreamedReply: Serialize + DeserializeOwned + Default {
    /// One piece of the reply as the provider streams it (a text delta, a tool call's
    /// argument delta, a usage report).
    type Chunk;

    /// Folds a chunk into the reply being assembled. Keep argument text exactly as the
    /// provider sent it (concatenate deltas; do not parse and re-serialise): the raw text
    /// is what the argument scanner checks when the calls are dispatched, as for a
    /// whole reply.
    fn push(&mut self, chunk: &Self::Chunk);

    /// The chunks a replay yields for a recorded reply: the live path's chunk type, so a
    /// UI has one code path (their boundaries need not be the live ones).
    fn replay(&self) -> Vec<Self::Chunk>;
}

/// What a [`ModelStream`] yields: the chunks, then the reply as journaled.
pub enum ReplyEvent<R: StreamedReply> {
    /// A chunk, as the provider sent it (live) or from the recorded reply (replay).
    Chunk(R::Chunk),
    /// The stream ended and the assembled reply is journaled: this is the reply as the
    /// journal holds it (secret arguments masked, as [`Journal::model`] returns it).
    /// Push this one to the transcript and dispatch its tool calls. The last event.
    Reply(R),
}

impl<R> std::fmt::Debug for ReplyEvent<R>
where
    R: StreamedReply + std::fmt::Debug,
    R::Chunk: std::fmt::Debug,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReplyEvent::Chunk(chunk) => f.debug_tuple("Chunk").field(chunk).finish(),
            ReplyEvent::Reply(reply) => f.debug_tuple("Reply").field(reply).finish(),
        }
    }
}

impl<R> PartialEq for ReplyEvent<R>
where
    R: StreamedReply + PartialEq,
    R::Chunk: PartialEq,
{
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (ReplyEvent::Chunk(a), ReplyEvent::Chunk(b)) => a == b,
            (ReplyEvent::Reply(a), ReplyEvent::Reply(b)) => a == b,
            _ => false,
        }
    }
}

/// A streamed model call in the journal: see [`Journal::model_stream`].
///
/// Pull it with [`next`](Self::next) (or turn it into a [`Stream`] with
/// [`into_stream`](Self::into_stream)): chunks as they arrive, then
/// [`ReplyEvent::Reply`] once the reply is journaled, then `None`. An error ends it.
/// Dropping it before the reply leaves the journal as a crash would.
///
/// It holds a handle of its own on the journal (not a borrow), so it can be moved into a
/// spawned task or an HTTP response body.
#[must_use = "a streamed model call does nothing until it is pulled"]
pub struct ModelStream<R: StreamedReply, E, S> {
    journal: Journal,
    span: tracing::Span,
    state: State<R, S>,
    spend: Option<SpendFn<R>>,
    _error: std::marker::PhantomData<fn() -> E>,
}

/// What a reply cost, computed from the assembled reply.
type SpendFn<R> = Box<dyn FnOnce(&R) -> Option<Spend> + Send>;

enum State<R: StreamedReply, S> {
    /// Asking the model: chunks fold into `reply`, journaled at `identity` at the end.
    Live {
        chunks: Pin<Box<S>>,
        reply: R,
        identity: CallIdentity,
        reservation: Reservation,
    },
    /// Replaying the recorded `row`.
    Replaying {
        chunks: std::vec::IntoIter<R::Chunk>,
        row: Box<CallRecord>,
    },
    /// The reply was handed out; nothing more comes.
    Done,
    /// An error was returned; nothing more comes, nothing was journaled.
    Failed,
}

impl<R, E, S> ModelStream<R, E, S>
where
    R: StreamedReply,
    E: Display,
    S: Stream<Item = Result<R::Chunk, E>>,
{
    /// Whether the chunks come from the journal (a replayed turn) rather than the model.
    pub fn is_replay(&self) -> bool {
        matches!(self.state, State::Replaying { .. })
    }

    /// The next event: a chunk, the journaled reply, or `None` once the reply was handed
    /// out (or after an error). An error of the provider's stream is
    /// [`CallError::Tool`]; nothing is journaled then.
    pub async fn next(&mut self) -> Option<Result<ReplyEvent<R>, CallError<E>>> {
        let span = self.span.clone();
        match &mut self.state {
            State::Live { chunks, reply, .. } => match chunks.next().await {
                Some(Ok(chunk)) => {
                    reply.push(&chunk);
                    Some(Ok(ReplyEvent::Chunk(chunk)))
                }
                Some(Err(e)) => {
                    // Dropping the live state gives the position back: the re-run asks
                    // again at the same place.
                    self.state = State::Failed;
                    let e = CallError::Tool(e);
                    record_error_type(&span, &e);
                    Some(Err(e))
                }
                None => Some(self.journal_reply().instrument(span).await),
            },
            State::Replaying { chunks, row } => match chunks.next() {
                Some(chunk) => Some(Ok(ReplyEvent::Chunk(chunk))),
                None => {
                    let reply = decode_result(row, row.result.as_ref());
                    self.state = State::Done;
                    Some(reply.map(ReplyEvent::Reply))
                }
            },
            State::Done | State::Failed => None,
        }
    }

    /// Pulls the rest of the stream and returns the reply as journaled (chunks not pulled
    /// yet are passed over). Refused with [`DurableError::StreamOver`] if the reply was
    /// already handed out or the stream failed.
    pub async fn into_reply(mut self) -> Result<R, CallError<E>> {
        while let Some(event) = self.next().await {
            if let ReplyEvent::Reply(reply) = event? {
                return Ok(reply);
            }
        }
        Err(CallError::Durable(DurableError::StreamOver {
            session: self.journal.session_id().clone(),
        }))
    }

    /// The same events as a [`Stream`], for code that composes streams (an SSE response,
    /// `StreamExt` adapters).
    pub fn into_stream(self) -> impl Stream<Item = Result<ReplyEvent<R>, CallError<E>>> {
        futures_util::stream::unfold(self, |mut stream| async move {
            let event = stream.next().await?;
            Some((event, stream))
        })
    }

    /// The stream ended: the assembled reply is journaled (one row, one commit) and
    /// handed back as the journal holds it.
    async fn journal_reply(&mut self) -> Result<ReplyEvent<R>, CallError<E>> {
        let State::Live {
            reply,
            identity,
            reservation,
            ..
        } = std::mem::replace(&mut self.state, State::Failed)
        else {
            unreachable!("journal_reply runs only on a live stream")
        };
        let spend = self.spend.take().and_then(|spend| spend(&reply));
        let tokens = spend
            .as_ref()
            .map_or(0, |s| s.input_tokens().saturating_add(s.output_tokens()));
        let recorded = self
            .journal
            .record_model(identity, reservation, &reply, spend)
            .await;
        if let (Ok(_), Some(limit)) = (&recorded, &self.journal.rate_limit) {
            self.journal.charge_tokens(limit, tokens).await;
        }
        let result = recorded
            .map_err(CallError::Durable)
            .and_then(|row| decode_result(&row, row.result.as_ref()));
        match result {
            Ok(reply) => {
                self.state = State::Done;
                Ok(ReplyEvent::Reply(reply))
            }
            Err(e) => {
                record_error_type(&tracing::Span::current(), &e);
                Err(e)
            }
        }
    }
}

fn record_error_type<E>(span: &tracing::Span, e: &CallError<E>) {
    span.record(
        telemetry::ERROR_TYPE,
        telemetry::call_error_type(e, telemetry::ERROR_TYPE_MODEL),
    );
}

impl Journal {
    /// Journals a streamed model reply by its position in the step, as
    /// [`model`](Self::model) journals a whole one: the chunks reach the caller as they
    /// arrive (nothing is added per chunk), and when the stream ends the assembled reply
    /// is checked (size, finite values), its secret arguments masked, and journaled once.
    /// On a re-run turn the recorded reply is yielded as chunks
    /// ([`StreamedReply::replay`]) and `open` is not called: the model is not asked.
    ///
    /// `open` starts the provider's stream (it is called at most once, and only when the
    /// reply is not recorded). The chunks of a live stream are the provider's, as sent;
    /// the [`ReplyEvent::Reply`] at the end is the journaled one, with secret arguments
    /// masked: render tool calls from it, not from the chunks, if secrets must stay out of
    /// a UI.
    ///
    /// A crash (or a provider error, or dropping the stream) before the stream ends
    /// leaves nothing: no row, and the position is free again, so the re-run turn asks
    /// the model again; a partial reply is not kept in the journal. A crash after it
    /// leaves the reply's row, which the re-run turn replays.
    ///
    /// ```no_run
    /// # use durable_core::journal::{ReplyEvent, StreamedReply};
    /// # #[derive(Default, serde::Serialize, serde::Deserialize)]
    /// # struct Text { text: String }
    /// # impl StreamedReply for Text {
    /// #     type Chunk = String;
    /// #     fn push(&mut self, c: &String) { self.text.push_str(c) }
    /// #     fn replay(&self) -> Vec<String> { vec![self.text.clone()] }
    /// # }
    /// # async fn turn(journal: &durable_core::Journal) -> Result<(), Box<dyn std::error::Error>> {
    /// let deltas = ["Hel", "lo"].map(|d| Ok::<_, std::io::Error>(d.to_owned()));
    /// let mut reply = journal
    ///     .model_stream::<Text, _, _, _>(|| futures_util::stream::iter(deltas))
    ///     .await?;
    /// while let Some(event) = reply.next().await {
    ///     match event? {
    ///         ReplyEvent::Chunk(delta) => print!("{delta}"),
    ///         ReplyEvent::Reply(text) => println!("\n(journaled: {})", text.text),
    ///     }
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn model_stream<R, E, S, F>(
        &self,
        open: F,
    ) -> Result<ModelStream<R, E, S>, CallError<E>>
    where
        R: StreamedReply,
        E: Display,
        S: Stream<Item = Result<R::Chunk, E>>,
        F: FnOnce() -> S,
    {
        self.model_stream_with_spend(open, |_| None).await
    }

    /// Like [`model_stream_with_spend`](Self::model_stream_with_spend), with the
    /// reply's token usage instead of its cost: priced by the runtime's
    /// [`PriceTable`](crate::snapshot::PriceTable) as
    /// [`model_with_usage`](Self::model_with_usage) does.
    pub async fn model_stream_with_usage<R, E, S, F, U>(
        &self,
        open: F,
        usage: U,
    ) -> Result<ModelStream<R, E, S>, CallError<E>>
    where
        R: StreamedReply,
        E: Display,
        S: Stream<Item = Result<R::Chunk, E>>,
        F: FnOnce() -> S,
        U: FnOnce(&R) -> Option<crate::snapshot::Usage> + Send + 'static,
    {
        let config = std::sync::Arc::clone(&self.inner.config);
        let model = self.model_name.clone();
        self.model_stream_with_spend(open, move |reply| {
            usage(reply).map(|usage| super::model::priced(&config, model.as_deref(), &usage))
        })
        .await
    }

    /// Like [`model_stream`](Self::model_stream), recording what the reply cost
    /// (computed from the assembled reply, e.g. from the usage chunk the provider sends
    /// last; charged to the session's budget once, however often the turn is replayed).
    pub async fn model_stream_with_spend<R, E, S, F, P>(
        &self,
        open: F,
        spend: P,
    ) -> Result<ModelStream<R, E, S>, CallError<E>>
    where
        R: StreamedReply,
        E: Display,
        S: Stream<Item = Result<R::Chunk, E>>,
        F: FnOnce() -> S,
        P: FnOnce(&R) -> Option<Spend> + Send + 'static,
    {
        let step = self.step();
        let span = self.chat_span(step);
        let begun = self.begin_model(step).instrument(span.clone()).await;
        let state = match begun {
            Ok(Begun::Recorded(row, reservation)) => {
                let _entered = span.enter();
                self.replay_model(&row, reservation);
                let reply: R = decode_result(&row, row.result.as_ref())?;
                State::Replaying {
                    chunks: reply.replay().into_iter(),
                    row,
                }
            }
            Ok(Begun::Fresh(identity, reservation)) => {
                if let Some(limit) = &self.rate_limit {
                    let hold = Some(self.inner.config.limiter_hold);
                    let waiter = super::limit::waiter_id(&identity, 1);
                    if let Err(e) = self
                        .take_turn(limit, waiter, hold)
                        .instrument(span.clone())
                        .await
                    {
                        let e = CallError::Durable(e);
                        record_error_type(&span, &e);
                        return Err(e);
                    }
                }
                State::Live {
                    chunks: Box::pin(open()),
                    reply: R::default(),
                    identity,
                    reservation,
                }
            }
            Err(e) => {
                let e = CallError::Durable(e);
                record_error_type(&span, &e);
                return Err(e);
            }
        };
        Ok(ModelStream {
            journal: self.clone(),
            span,
            state,
            spend: Some(Box::new(spend)),
            _error: std::marker::PhantomData,
        })
    }
}
