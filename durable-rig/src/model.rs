//! A rig completion model whose replies go through a session's journal.

use std::sync::Arc;

use durable_core::snapshot::Spend;
use durable_core::{CallError, Journal};
use rig_core::DynModel;
use rig_core::completion::{CompletionRequest, CompletionResponse, ModelRef, Usage};
use rig_core::effect::{EffectKind, FamilyDescriptor, HandlerDescriptor, Outcome, family};
use rig_core::error::{ErrorKind, ErrorReport};
use rig_core::operation::Completion;
use rig_core::serve::{Dispatch, Reply, Serve};

use crate::shared::Shared;

/// A rig completion model journaled by durable: the model handler (rig's [`Serve`],
/// completion family) that a rig agent asks for each reply.
///
/// Each reply is recorded by its position in the session's step
/// ([`Journal::model_with_spend`]) under the inner model's id
/// ([`Journal::with_model_name`]); a re-run turn gets the recorded replies back and the
/// inner model is not asked. What is recorded is rig's [`CompletionResponse`] as
/// serde writes it: the assistant content (`choice`), the `usage`, the `origin`, the
/// finish reason and `raw`, the provider's response document. The spend charged to the
/// session is the reply's `usage`: input and output tokens, and its cost: priced by
/// the runtime's [`PriceTable`](durable_core::PriceTable) for the inner model's id
/// ([`usage_of`]: cached input tokens at their own price) when the table prices it,
/// else the cost in USD the provider reported, if any.
///
/// Streamed completions (an agent's `stream()` runs) are journaled too
/// ([`stream`](Self::stream)): the provider's events reach rig as they arrive, the
/// response the stream folded into is recorded when it ends (the same row as a `run()`
/// reply), and a re-run turn replays it as events; a stream cut by a crash leaves
/// nothing, and the re-run asks the model again.
///
/// Built by [`DurableRig::model`](crate::DurableRig::model).
pub struct JournaledModel {
    label: ModelRef,
    pub(crate) inner: DynModel<Completion>,
    pub(crate) journal: Journal,
    pub(crate) shared: Arc<Shared>,
}

impl std::fmt::Debug for JournaledModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JournaledModel")
            .field("label", &self.label)
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

/// A reply's usage as durable prices it: input tokens (cached ones included, as rig
/// counts them), output tokens, and the part of the input read from the provider's
/// cache (`cached_input_tokens`), so a [`PriceTable`](durable_core::PriceTable) charges
/// those at their own price.
///
/// ```
/// use rig_core::completion::Usage;
///
/// let mut usage = Usage::new();
/// usage.input_tokens = Some(1_000);
/// usage.output_tokens = Some(50);
/// usage.cached_input_tokens = Some(400);
/// let mapped = durable_rig::usage_of(&usage);
/// assert_eq!((mapped.input_tokens, mapped.output_tokens, mapped.cached_input_tokens), (1_000, 50, 400));
/// ```
pub fn usage_of(usage: &Usage) -> durable_core::Usage {
    durable_core::Usage::new(
        usage.input_tokens.unwrap_or(0),
        usage.output_tokens.unwrap_or(0),
    )
    .with_cached_input(usage.cached_input_tokens.unwrap_or(0))
}

/// What a reply cost: its tokens, and its cost when the provider reported one (a cost
/// that is not a finite, non-negative amount is left out, the tokens still count).
pub fn spend_of(usage: &Usage) -> Spend {
    let input = usage.input_tokens.unwrap_or(0);
    let output = usage.output_tokens.unwrap_or(0);
    usage
        .cost
        .and_then(|cost| Spend::new(cost.total, input, output).ok())
        .unwrap_or(Spend::from_nano_usd(0, input, output))
}

impl JournaledModel {
    pub(crate) fn new(
        label: ModelRef,
        inner: DynModel<Completion>,
        journal: &Journal,
        shared: Arc<Shared>,
    ) -> Self {
        let journal = match inner.id() {
            Some(id) => journal.with_model_name(id),
            None => journal.clone(),
        };
        JournaledModel {
            label,
            inner,
            journal,
            shared,
        }
    }

    /// Asks the journal for the next reply: the recorded one on a re-run turn, else the
    /// inner model's, recorded before it is returned.
    ///
    /// # Errors
    /// The inner model's error (nothing is recorded), or the journal's (the run stops;
    /// the typed error waits in [`DurableRig::take_error`](crate::DurableRig::take_error)).
    pub async fn complete(
        &self,
        request: CompletionRequest,
    ) -> Result<CompletionResponse, ErrorReport> {
        let reply = self
            .journal
            .model_with_spend(
                || async {
                    let mut response = self.inner.call(request).await?;
                    self.shared.withhold_invalid_arguments(&mut response);
                    Ok::<_, rig_core::error::ProviderError>(response)
                },
                |response: &CompletionResponse| {
                    // The runtime's price table first (dollars computed from usage),
                    // else the cost the provider reported.
                    Some(
                        self.journal
                            .price(&usage_of(&response.usage))
                            .unwrap_or_else(|| spend_of(&response.usage)),
                    )
                },
            )
            .await;
        match reply {
            Ok(response) => {
                self.shared.note_reply(&response);
                Ok(response)
            }
            Err(error) => Err(call_error_report(error, &self.shared)),
        }
    }
}

/// What rig is told when a journaled model call fails: the provider's error as is; a
/// durable error stops the run (the typed error waits in the binding).
pub(crate) fn call_error_report<E>(error: CallError<E>, shared: &Shared) -> ErrorReport
where
    ErrorReport: From<E>,
{
    match error {
        CallError::Tool(error) => ErrorReport::from(error),
        CallError::Recorded(failure) => ErrorReport::new(
            ErrorKind::Provider,
            format!("recorded model failure: {}", failure.message),
        ),
        CallError::Durable(error) => {
            let report = ErrorReport::new(
                ErrorKind::HandlerUnavailable,
                format!(
                    "durable stopped the run at a model reply: {error} \
                     (`DurableRig::take_error` gives the typed error)"
                ),
            )
            .with_retryable(false);
            shared.stopped(error);
            report
        }
    }
}

impl Serve for JournaledModel {
    type Family = family::Completion;

    fn descriptor(&self) -> HandlerDescriptor {
        HandlerDescriptor {
            key: rig_core::effect::model_key(self.label.as_str()),
            family: FamilyDescriptor::Completion {
                model: self.label.clone(),
                capabilities: self.inner.capabilities().completion,
            },
            layers: Vec::new(),
        }
    }

    async fn serve(&self, kind: EffectKind, _dispatch: Dispatch) -> Reply {
        match kind {
            EffectKind::Completion {
                request,
                stream: false,
            } => Reply::Outcome(self.complete(request).await.map(Outcome::Completion)),
            EffectKind::Completion {
                request,
                stream: true,
            } => Reply::Stream(self.stream(request)),
            other => Reply::Outcome(Err(ErrorReport::new(
                ErrorKind::HandlerUnavailable,
                format!(
                    "a journaled completion model cannot serve a `{}` effect",
                    other.name()
                ),
            ))),
        }
    }
}
