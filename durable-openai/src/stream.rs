//! Streamed Chat Completions (`create_stream`): the chunks folded into the response a
//! whole `create` would have returned, journaled once when the stream ends.

use async_openai::types::chat::{
    ChatChoice, ChatChoiceStream, ChatCompletionMessageToolCall,
    ChatCompletionMessageToolCallChunk, ChatCompletionMessageToolCalls,
    ChatCompletionStreamResponseDelta, CreateChatCompletionResponse,
    CreateChatCompletionStreamResponse, FunctionCallStream, FunctionType, Role,
};
use durable_core::Spend;
use durable_core::journal::StreamedReply;
use serde::{Deserialize, Serialize};

/// A Chat Completions reply streamed with `create_stream`, assembled from its chunks into
/// the [`CreateChatCompletionResponse`] a `create` would have returned (`.0`), so
/// [`reply_message`](crate::reply_message), [`tool_calls`](crate::tool_calls) and
/// [`spend`](crate::spend) work on it as on a whole reply.
///
/// Journal it with `session.model_stream`: the chunks reach the caller as they arrive,
/// the assembled response is journaled once when the stream ends, and a re-run turn gets
/// it back as chunks of the same type (one per reply: each choice's whole content and
/// tool calls, then the usage), without asking the model.
///
/// ```no_run
/// # use durable_openai::{StreamedCompletion, async_openai};
/// # use futures_util::{StreamExt, TryStreamExt, stream};
/// # async fn turn(
/// #     session: &durable_core::Session<async_openai::types::chat::ChatCompletionRequestMessage>,
/// #     chat: impl Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<
/// #         std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<
/// #             async_openai::types::chat::CreateChatCompletionStreamResponse, std::io::Error>> + Send>>,
/// #         std::io::Error>> + Send>>,
/// # ) -> Result<(), Box<dyn std::error::Error>> {
/// use durable_core::journal::ReplyEvent;
///
/// // `chat()` is `client.chat().create_stream(request)`: a future of the stream, opened
/// // only when the reply is not recorded.
/// let mut reply = session
///     .model_stream_with_spend::<StreamedCompletion, _, _, _, _>(
///         || stream::once(chat()).try_flatten(),
///         durable_openai::stream_spend,
///     )
///     .await?;
/// while let Some(event) = reply.next().await {
///     match event? {
///         ReplyEvent::Chunk(chunk) => {
///             for choice in &chunk.choices {
///                 print!("{}", choice.delta.content.as_deref().unwrap_or_default());
///             }
///         }
///         ReplyEvent::Reply(whole) => {
///             let message = durable_openai::reply_message(&whole.0)?;
///             // push it, dispatch durable_openai::tool_calls(message), checkpoint
///         }
///     }
/// }
/// # Ok(())
/// # }
/// ```
///
/// Folding keeps text exactly as sent: content, refusals, tool-call names and argument
/// text are the concatenation of their deltas (the raw argument text is what
/// [`tool_calls`](crate::tool_calls) hands the argument scanner, so a duplicate key or a
/// NaN split across deltas is still caught). Log probabilities of streamed chunks and
/// the deprecated `system_fingerprint` are not kept. Usage arrives only when the request asks for it
/// (`stream_options: { include_usage: true }`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct StreamedCompletion(pub CreateChatCompletionResponse);

impl StreamedReply for StreamedCompletion {
    type Chunk = CreateChatCompletionStreamResponse;

    fn push(&mut self, chunk: &CreateChatCompletionStreamResponse) {
        let reply = &mut self.0;
        if reply.id.is_empty() {
            reply.id.clone_from(&chunk.id);
        }
        if reply.model.is_empty() {
            reply.model.clone_from(&chunk.model);
        }
        reply.created = reply.created.max(chunk.created);
        reply.object = "chat.completion".to_owned();
        if chunk.service_tier.is_some() {
            reply.service_tier.clone_from(&chunk.service_tier);
        }
        if chunk.usage.is_some() {
            reply.usage.clone_from(&chunk.usage);
        }
        for streamed in &chunk.choices {
            let choice = choice_at(&mut reply.choices, streamed.index);
            fold_delta(choice, &streamed.delta);
            if streamed.finish_reason.is_some() {
                choice.finish_reason = streamed.finish_reason;
            }
        }
    }

    fn replay(&self) -> Vec<CreateChatCompletionStreamResponse> {
        let reply = &self.0;
        let choices = reply
            .choices
            .iter()
            .map(|choice| ChatChoiceStream {
                index: choice.index,
                delta: ChatCompletionStreamResponseDelta {
                    content: choice.message.content.clone(),
                    refusal: choice.message.refusal.clone(),
                    role: Some(choice.message.role),
                    tool_calls: choice.message.tool_calls.as_ref().map(|calls| {
                        calls
                            .iter()
                            .enumerate()
                            .filter_map(|(index, call)| replay_call(index, call))
                            .collect()
                    }),
                    ..ChatCompletionStreamResponseDelta::default()
                },
                finish_reason: choice.finish_reason,
                logprobs: None,
            })
            .collect();
        vec![CreateChatCompletionStreamResponse {
            id: reply.id.clone(),
            choices,
            created: reply.created,
            model: reply.model.clone(),
            service_tier: reply.service_tier.clone(),
            object: "chat.completion.chunk".to_owned(),
            usage: reply.usage.clone(),
            ..CreateChatCompletionStreamResponse::default()
        }]
    }
}

/// What a streamed reply cost, from the usage chunk the provider sends last when asked
/// (`stream_options: { include_usage: true }`): [`spend`](crate::spend) of the
/// assembled response. Pass it to `session.model_stream_with_spend`.
pub fn stream_spend(reply: &StreamedCompletion) -> Option<Spend> {
    crate::spend(&reply.0)
}

/// The token usage of a streamed reply, from the usage chunk the provider sends last
/// when asked (`stream_options: { include_usage: true }`): [`usage`](crate::usage) of
/// the assembled response. Pass it to `session.model_stream_with_usage`, which prices
/// it with the runtime's price table.
pub fn stream_usage(reply: &StreamedCompletion) -> Option<durable_core::Usage> {
    crate::usage(&reply.0)
}

/// The choice with `index`, created (an assistant message) when its first delta arrives.
fn choice_at(choices: &mut Vec<ChatChoice>, index: u32) -> &mut ChatChoice {
    let position = match choices.iter().position(|c| c.index == index) {
        Some(position) => position,
        None => {
            let mut choice = ChatChoice {
                index,
                ..ChatChoice::default()
            };
            choice.message.role = Role::Assistant;
            choices.push(choice);
            choices.len() - 1
        }
    };
    &mut choices[position]
}

/// Folds one delta into its choice: text concatenated as sent, tool calls by their index.
fn fold_delta(choice: &mut ChatChoice, delta: &ChatCompletionStreamResponseDelta) {
    let message = &mut choice.message;
    if let Some(role) = delta.role {
        message.role = role;
    }
    append(&mut message.content, delta.content.as_deref());
    append(&mut message.refusal, delta.refusal.as_deref());
    for call in delta.tool_calls.iter().flatten() {
        let calls = message.tool_calls.get_or_insert_with(Vec::new);
        // The index is the provider's (or a model's proxy's): one far beyond the calls
        // seen so far would have the gap filled with empty calls, up to 4 billion of
        // them. Such a delta is not a tool call of this reply; it is left out.
        let Ok(index) = usize::try_from(call.index) else {
            continue;
        };
        if index > calls.len() + MAX_INDEX_GAP {
            continue;
        }
        while calls.len() <= index {
            calls.push(ChatCompletionMessageToolCalls::Function(
                ChatCompletionMessageToolCall::default(),
            ));
        }
        let ChatCompletionMessageToolCalls::Function(function) = &mut calls[index] else {
            continue;
        };
        if let Some(id) = &call.id {
            function.id.push_str(id);
        }
        if let Some(FunctionCallStream { name, arguments }) = &call.function {
            function
                .function
                .name
                .push_str(name.as_deref().unwrap_or_default());
            function
                .function
                .arguments
                .push_str(arguments.as_deref().unwrap_or_default());
        }
    }
}

/// How far past the tool calls seen so far a delta's index may point (providers number
/// their calls 0, 1, 2, …; a gap is filled with empty calls).
const MAX_INDEX_GAP: usize = 64;

fn append(text: &mut Option<String>, delta: Option<&str>) {
    if let Some(delta) = delta {
        text.get_or_insert_with(String::new).push_str(delta);
    }
}

/// A recorded function call as one chunk (a custom tool call has no streamed form).
fn replay_call(
    index: usize,
    call: &ChatCompletionMessageToolCalls,
) -> Option<ChatCompletionMessageToolCallChunk> {
    let ChatCompletionMessageToolCalls::Function(function) = call else {
        return None;
    };
    Some(ChatCompletionMessageToolCallChunk {
        index: u32::try_from(index).unwrap_or(u32::MAX),
        id: Some(function.id.clone()),
        r#type: Some(FunctionType::Function),
        function: Some(FunctionCallStream {
            name: Some(function.function.name.clone()),
            arguments: Some(function.function.arguments.clone()),
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_openai::types::chat::{CompletionUsage, FinishReason};

    fn chunk(choices: Vec<ChatChoiceStream>) -> CreateChatCompletionStreamResponse {
        CreateChatCompletionStreamResponse {
            id: "chatcmpl-1".into(),
            created: 7,
            model: "gpt-4o-mini".into(),
            object: "chat.completion.chunk".into(),
            choices,
            ..CreateChatCompletionStreamResponse::default()
        }
    }

    fn delta(delta: ChatCompletionStreamResponseDelta) -> ChatChoiceStream {
        ChatChoiceStream {
            index: 0,
            delta,
            ..ChatChoiceStream::default()
        }
    }

    fn args(index: u32, id: Option<&str>, name: Option<&str>, text: &str) -> ChatChoiceStream {
        delta(ChatCompletionStreamResponseDelta {
            tool_calls: Some(vec![ChatCompletionMessageToolCallChunk {
                index,
                id: id.map(Into::into),
                r#type: id.map(|_| FunctionType::Function),
                function: Some(FunctionCallStream {
                    name: name.map(Into::into),
                    arguments: Some(text.into()),
                }),
            }]),
            ..ChatCompletionStreamResponseDelta::default()
        })
    }

    /// A reply with text and two tool calls, streamed the way OpenAI streams them: the
    /// role first, text deltas, each call's id and name once and its arguments in
    /// pieces (a duplicate key split across them), the finish reason, then usage.
    fn streamed() -> Vec<CreateChatCompletionStreamResponse> {
        let mut chunks = vec![
            chunk(vec![delta(ChatCompletionStreamResponseDelta {
                role: Some(Role::Assistant),
                content: Some("Sending".into()),
                ..ChatCompletionStreamResponseDelta::default()
            })]),
            chunk(vec![delta(ChatCompletionStreamResponseDelta {
                content: Some(" now.".into()),
                ..ChatCompletionStreamResponseDelta::default()
            })]),
            chunk(vec![args(
                0,
                Some("call_a"),
                Some("send_email"),
                "{\"to\": \"a",
            )]),
            chunk(vec![args(0, None, None, "nn\", \"to\": \"mallory\"}")]),
            chunk(vec![args(1, Some("call_b"), Some("lookup"), "{\"q\":")]),
            chunk(vec![args(1, None, None, " 1}")]),
            chunk(vec![ChatChoiceStream {
                finish_reason: Some(FinishReason::ToolCalls),
                ..ChatChoiceStream::default()
            }]),
        ];
        let mut usage = chunk(Vec::new());
        usage.usage = Some(CompletionUsage {
            prompt_tokens: 12,
            completion_tokens: 5,
            total_tokens: 17,
            ..CompletionUsage::default()
        });
        chunks.push(usage);
        chunks
    }

    fn assemble(chunks: &[CreateChatCompletionStreamResponse]) -> StreamedCompletion {
        let mut reply = StreamedCompletion::default();
        for chunk in chunks {
            reply.push(chunk);
        }
        reply
    }

    #[test]
    fn chunks_fold_into_the_whole_response() {
        let reply = assemble(&streamed());
        let message = crate::reply_message(&reply.0).expect("one choice");
        assert_eq!(message.content.as_deref(), Some("Sending now."));
        assert_eq!(message.role, Role::Assistant);
        assert_eq!(
            reply.0.choices[0].finish_reason,
            Some(FinishReason::ToolCalls)
        );
        let calls = crate::tool_calls(message);
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].id, "call_a");
        assert_eq!(calls[0].name, "send_email");
        // The raw text as sent, duplicate key and all: the argument scanner refuses it at
        // dispatch, as it would in a whole reply.
        assert_eq!(
            calls[0].arguments,
            durable_core::ToolArguments::Text("{\"to\": \"ann\", \"to\": \"mallory\"}".into())
        );
        assert_eq!(calls[1].name, "lookup");
        let spend = stream_spend(&reply).expect("usage");
        assert_eq!((spend.input_tokens(), spend.output_tokens()), (12, 5));
        assert_eq!(reply.0.id, "chatcmpl-1");
        assert_eq!(reply.0.object, "chat.completion");
    }

    #[test]
    fn a_replay_folds_into_the_same_response() {
        let reply = assemble(&streamed());
        let replayed = reply.replay();
        assert_eq!(replayed.len(), 1, "one chunk per reply");
        assert_eq!(assemble(&replayed), reply);
        // And through the journal's JSON, as a recorded reply is read back.
        let json = serde_json::to_value(&reply).expect("encode");
        let decoded: StreamedCompletion = serde_json::from_value(json).expect("decode");
        assert_eq!(assemble(&decoded.replay()), reply);
    }

    #[test]
    fn an_absurd_tool_call_index_allocates_nothing() {
        let mut chunks = streamed();
        chunks.insert(3, chunk(vec![args(u32::MAX, Some("x"), Some("y"), "{}")]));
        let reply = assemble(&chunks);
        let calls = crate::tool_calls(crate::reply_message(&reply.0).expect("one choice"));
        assert_eq!(calls.len(), 2, "the delta with index u32::MAX is left out");
    }

    #[test]
    fn choices_are_kept_apart_by_index() {
        let text = |index: u32, text: &str| ChatChoiceStream {
            index,
            delta: ChatCompletionStreamResponseDelta {
                content: Some(text.into()),
                ..ChatCompletionStreamResponseDelta::default()
            },
            ..ChatChoiceStream::default()
        };
        let reply = assemble(&[
            chunk(vec![text(0, "a"), text(1, "x")]),
            chunk(vec![text(1, "y"), text(0, "b")]),
        ]);
        let contents: Vec<_> = reply
            .0
            .choices
            .iter()
            .map(|c| (c.index, c.message.content.clone().unwrap_or_default()))
            .collect();
        assert_eq!(contents, [(0, "ab".to_owned()), (1, "xy".to_owned())]);
        assert_eq!(assemble(&reply.replay()), reply);
    }
}
