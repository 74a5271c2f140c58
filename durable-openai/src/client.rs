//! A journaled async-openai client: an existing agent keeps its turn loop and its calls to
//! `client.chat().create(..)` / `create_stream(..)`, and every reply goes through the
//! session's journal.

use std::pin::Pin;

use async_openai::Client;
use async_openai::config::{Config, OpenAIConfig};
use async_openai::error::OpenAIError;
use async_openai::types::chat::{
    CreateChatCompletionRequest, CreateChatCompletionResponse, CreateChatCompletionStreamResponse,
};
use durable_core::journal::{CallError, RecordedFailure, ReplyEvent};
use durable_core::{DurableError, Journal};
use futures_util::stream::{self, Stream, TryStreamExt};

use crate::{Pricing, StreamedCompletion};

/// async-openai's [`Client`] with its Chat Completions calls journaled in a session: a
/// drop-in for the client an agent already has (feature `client`).
///
/// `client.chat().create(request)` and `client.chat().create_stream(request)` take and
/// return async-openai's own types, so the agent's turn loop stays as it is; only the
/// client's construction changes (and the tools run through the journal, as
/// `#[durable_tool]`s). Each reply is journaled by its position in the session's step,
/// with its token usage charged to the session's budget ([`Pricing`], tokens only by
/// default): when the process dies and the agent runs again from the top with the same
/// session, every reply recorded before the crash comes back from the journal (a streamed
/// one as a stream) and the provider is not asked again; the first reply not recorded is
/// asked anew.
///
/// ```no_run
/// use async_openai::Client;
/// use async_openai::config::OpenAIConfig;
/// use async_openai::types::chat::CreateChatCompletionRequest;
/// use durable_openai::DurableClient;
///
/// # async fn agent(session: &durable_core::Session<durable_core::Message>,
/// #                request: CreateChatCompletionRequest) -> Result<(), Box<dyn std::error::Error>> {
/// let client = Client::with_config(OpenAIConfig::new());
/// let client = DurableClient::new(client, session.journal()); // the one line that changes
/// let response = client.chat().create(request).await?;      // journaled; replayed on resume
/// # let _ = response; Ok(()) }
/// ```
///
/// **Replies are matched by position, not by request.** Run the same agent again after a
/// crash (same prompt, same tools): a re-run that asks something else at a recorded
/// position silently gets the recorded reply. A tool whose effect must not be repeated
/// is a `#[durable_tool]` called with the session's journal; its recorded result comes
/// back on the re-run, so the transcript is rebuilt exactly.
///
/// Other endpoints (embeddings, files, …) are not journaled: reach them through
/// [`inner`](Self::inner).
#[derive(Clone)]
pub struct DurableClient<C: Config = OpenAIConfig> {
    client: Client<C>,
    journal: Journal,
    pricing: Pricing,
}

impl<C: Config> std::fmt::Debug for DurableClient<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DurableClient")
            .field("api_base", &self.client.config().api_base())
            .field("journal", &self.journal)
            .field("pricing", &self.pricing)
            .finish_non_exhaustive()
    }
}

impl<C: Config> DurableClient<C> {
    /// Wraps `client`: its chat calls are journaled in `journal`'s session (the handle is
    /// cloned; it follows the session's checkpoints).
    pub fn new(client: Client<C>, journal: &Journal) -> Self {
        DurableClient {
            client,
            journal: journal.clone(),
            pricing: Pricing::default(),
        }
    }

    /// Charges each reply's usage at `pricing` (the default counts tokens only, no cost).
    #[must_use]
    pub fn with_pricing(mut self, pricing: Pricing) -> Self {
        self.pricing = pricing;
        self
    }

    /// The chat completions, journaled.
    pub fn chat(&self) -> DurableChat<'_, C> {
        DurableChat { client: self }
    }

    /// The wrapped client, for the endpoints that are not journaled.
    pub fn inner(&self) -> &Client<C> {
        &self.client
    }

    /// The journal the replies go to.
    pub fn journal(&self) -> &Journal {
        &self.journal
    }
}

/// The journaled Chat Completions of a [`DurableClient`] (`client.chat()`).
pub struct DurableChat<'c, C: Config> {
    client: &'c DurableClient<C>,
}

impl<C: Config> std::fmt::Debug for DurableChat<'_, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DurableChat")
            .field("client", self.client)
            .finish()
    }
}

/// What [`DurableChat::create_stream`] returns: the chunks as async-openai yields them
/// (live) or from the journal (replayed); it ends once the assembled reply is journaled.
pub type DurableChatStream<'c> =
    Pin<Box<dyn Stream<Item = Result<CreateChatCompletionStreamResponse, ChatError>> + Send + 'c>>;

impl<'c, C: Config> DurableChat<'c, C> {
    /// async-openai's `create`, journaled: a reply recorded at this position is returned
    /// without asking the provider; otherwise the provider is asked and its response
    /// journaled (checked for size and exact values, secret arguments masked) with its
    /// usage as spend, then returned as the journal holds it.
    ///
    /// # Errors
    /// [`ChatError::OpenAI`] when the provider fails (nothing is journaled: the same call
    /// asks again); [`ChatError::Durable`] when the journal refuses or the store fails
    /// (stop the run).
    pub async fn create(
        &self,
        request: CreateChatCompletionRequest,
    ) -> Result<CreateChatCompletionResponse, ChatError> {
        let client = self.client;
        let pricing = client.pricing;
        client
            .journal
            .with_model_name(request.model.clone())
            .model_with_spend(
                || async move { client.client.chat().create(request).await },
                |response: &CreateChatCompletionResponse| pricing.spend(response),
            )
            .await
            .map_err(ChatError::from)
    }

    /// async-openai's `create_stream`, journaled: the chunks reach the caller as the
    /// provider sends them, and when the provider's stream ends the assembled response
    /// ([`StreamedCompletion`]) is journaled once, before the returned stream ends. A
    /// reply recorded at this position is yielded from the journal (one chunk per reply,
    /// of the same type: each choice's whole text and tool calls, then the usage) and the
    /// provider is not asked.
    ///
    /// **Pull the stream to its end** (`None`): the reply is journaled then. A process
    /// killed, a provider error, or a stream dropped before that leaves nothing in the
    /// journal, and the same call asks the provider again.
    ///
    /// Usage reaches the budget only when the request asks for it
    /// (`stream_options: Some(ChatCompletionStreamOptions { include_usage: Some(true), .. })`),
    /// as with async-openai alone.
    ///
    /// # Errors
    /// As [`create`](Self::create), at the start or as an item of the stream.
    pub async fn create_stream(
        &self,
        request: CreateChatCompletionRequest,
    ) -> Result<DurableChatStream<'c>, ChatError> {
        let client = self.client;
        let pricing = client.pricing;
        let reply = client
            .journal
            .with_model_name(request.model.clone())
            .model_stream_with_spend::<StreamedCompletion, _, _, _, _>(
                || {
                    stream::once(async move { client.client.chat().create_stream(request).await })
                        .try_flatten()
                },
                move |reply: &StreamedCompletion| pricing.spend(&reply.0),
            )
            .await
            .map_err(ChatError::from)?;
        let chunks = stream::unfold(Some(reply), |reply| async move {
            let mut reply = reply?;
            match reply.next().await? {
                Ok(ReplyEvent::Chunk(chunk)) => Some((Ok(chunk), Some(reply))),
                // Journaled: the stream ends.
                Ok(ReplyEvent::Reply(_)) => None,
                Err(e) => Some((Err(ChatError::from(e)), None)),
            }
        });
        Ok(Box::pin(chunks))
    }
}

/// Why a journaled chat call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ChatError {
    /// The provider failed (HTTP, an API error, a chunk that does not decode). Nothing
    /// was journaled: asking again asks the provider again.
    #[error(transparent)]
    OpenAI(#[from] OpenAIError),
    /// The journal refused or the store failed (a lost lease, a reply above the size
    /// limit, a call in doubt, …): stop the run and read the error.
    #[error(transparent)]
    Durable(#[from] DurableError),
    /// A failure recorded by an earlier run was replayed (model replies are not
    /// recorded as failures; a journal written by another program could hold one).
    #[error(transparent)]
    Recorded(RecordedFailure),
}

impl From<CallError<OpenAIError>> for ChatError {
    fn from(e: CallError<OpenAIError>) -> Self {
        match e {
            CallError::Tool(e) => ChatError::OpenAI(e),
            CallError::Durable(e) => ChatError::Durable(e),
            CallError::Recorded(e) => ChatError::Recorded(e),
        }
    }
}
