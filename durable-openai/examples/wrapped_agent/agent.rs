//! The agent of `examples/wrapped_agent.rs`, shared with `tests/wrapped.rs` (which runs it
//! in a child process and kills it): a plain async-openai agent (its own transcript, its
//! own tool definitions, its own dispatch by name) made durable by the lines marked
//! `// durable:` below, and nothing else. The README counts them.
//!
//! Resumed after a crash, the agent runs again from the top: every reply recorded before
//! the crash comes back from the journal (a streamed one as a stream), every tool call
//! recorded returns its recorded result, so the transcript is rebuilt as it was, and the
//! first reply not recorded is asked anew.

use std::io::Write;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_openai::Client;
use async_openai::config::OpenAIConfig;
use async_openai::types::chat::{
    ChatCompletionMessageToolCalls, ChatCompletionRequestAssistantMessage,
    ChatCompletionRequestMessage, ChatCompletionRequestSystemMessage,
    ChatCompletionRequestToolMessage, ChatCompletionRequestUserMessage,
    ChatCompletionResponseMessage, ChatCompletionStreamOptions, ChatCompletionTool,
    ChatCompletionTools, CreateChatCompletionRequest, FunctionObject,
};
use durable::{Durable, Message, SessionId, StartOptions, durable_tool}; // durable:
use durable_openai::DurableClient; // durable: (`durable::openai::DurableClient` with the facade's `openai-client` feature)
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::json;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool};

/// The agent's error type (boxed, as a small agent's usually is).
pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// How one run of the agent is set up.
#[derive(Debug, Clone)]
pub struct Options {
    /// The store (a SQLite file).
    pub store: PathBuf,
    /// The ledger of effects (a SQLite file of its own).
    pub ledger: PathBuf,
    /// The session id: the same id resumes the session.
    pub session: String,
    /// The OpenAI-compatible API base, e.g. `http://127.0.0.1:8080/v1`.
    pub base_url: String,
    /// Stream each reply (`create_stream`), printing `chunk "<text>"` lines as they arrive.
    pub stream: bool,
    /// The test's hook: print `paused at <point>` and wait to be killed at
    /// `mid_stream:<n>` (the second chunk of the n-th reply handled, after the role: its
    /// first piece of text printed, the reply not yet journaled) or `after_model:<n>` (the n-th reply journaled), n counted from 1.
    pub pause_at: Option<String>,
}

static LEDGER: OnceLock<SqlitePool> = OnceLock::new();
static PAUSE_AT: OnceLock<Option<String>> = OnceLock::new();
/// The replies this process was given so far (the test's pause points count them).
static REPLIES: AtomicUsize = AtomicUsize::new(0);

/// Prints `paused at <point>` and waits forever when the run was asked to pause there.
async fn pause(point: &str) {
    if PAUSE_AT.get().and_then(Option::as_deref) == Some(point) {
        println!("paused at {point}");
        let _ = std::io::stdout().flush();
        std::future::pending::<()>().await;
    }
}

/// Writes an effect to the ledger (the stock system's log, the mail server's outbox).
async fn effect(kind: &str, detail: String) -> Result<(), std::io::Error> {
    let ledger = LEDGER
        .get()
        .ok_or_else(|| std::io::Error::other("no ledger"))?;
    sqlx::query("INSERT INTO effects (kind, call_id, dedup_key, detail) VALUES (?, '', NULL, ?)")
        .bind(kind)
        .bind(detail)
        .execute(ledger)
        .await
        .map_err(std::io::Error::other)?;
    Ok(())
}

/// Look up an item's stock (the stock system logs each lookup).
#[durable_tool(replay = "pure")] // durable:
async fn lookup(sku: String) -> Result<String, std::io::Error> {
    effect("lookup", sku.clone()).await?;
    Ok(format!("{sku}: 3 in stock"))
}

/// Email a customer: every call sends a message.
#[durable_tool(replay = "unsafe_on_replay")] // durable:
async fn send_email(to: String, body: String) -> Result<String, std::io::Error> {
    effect("email", format!("to {to}: {body}")).await?;
    Ok(format!("sent to {to}"))
}

#[derive(Deserialize)]
struct LookupInput {
    sku: String,
}

#[derive(Deserialize)]
struct EmailInput {
    to: String,
    body: String,
}

/// The agent's tools, as the model sees them.
fn tools() -> Vec<ChatCompletionTools> {
    let tool = |name: &str, description: &str, parameters| {
        ChatCompletionTools::Function(ChatCompletionTool {
            function: FunctionObject {
                name: name.into(),
                description: Some(description.into()),
                parameters: Some(parameters),
                strict: None,
            },
        })
    };
    vec![
        tool(
            "lookup",
            "Look up an item's stock.",
            json!({"type": "object", "properties": {"sku": {"type": "string"}}, "required": ["sku"]}),
        ),
        tool(
            "send_email",
            "Email a customer.",
            json!({"type": "object", "properties": {"to": {"type": "string"}, "body": {"type": "string"}},
                   "required": ["to", "body"]}),
        ),
    ]
}

/// Opens (or creates) the ledger.
pub async fn open_ledger(path: &std::path::Path) -> Result<SqlitePool, sqlx::Error> {
    let pool = SqlitePool::connect_with(
        SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true),
    )
    .await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS effects (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            kind TEXT NOT NULL,
            call_id TEXT NOT NULL,
            dedup_key TEXT UNIQUE,
            detail TEXT NOT NULL
        )",
    )
    .execute(&pool)
    .await?;
    Ok(pool)
}

/// Runs the conversation to the model's final answer (or resumes it), and returns it.
///
/// # Errors
/// A model, tool or store failure.
pub async fn run(options: Options) -> Result<String, Error> {
    let _ = LEDGER.set(open_ledger(&options.ledger).await?);
    let _ = PAUSE_AT.set(options.pause_at.clone());

    let durable =
        Durable::builder(durable::connect(&format!("sqlite:{}", options.store.display())).await?)
            .owner("wrapped-agent")
            .build(); // durable:
    let session = durable
        .start_or_resume::<Message>(StartOptions::new().with_id(SessionId::new(options.session)))
        .await?
        .session; // durable:
    let client = Client::with_config(
        OpenAIConfig::new()
            .with_api_base(options.base_url)
            .with_api_key("unused-on-loopback"),
    );
    let client = DurableClient::new(client, session.journal()); // durable:

    let mut messages: Vec<ChatCompletionRequestMessage> = vec![
        ChatCompletionRequestSystemMessage::from("You run a shop's back office.").into(),
        ChatCompletionRequestUserMessage::from("Is A-1 in stock? Email ann@example.com.").into(),
    ];
    for _turn in 0..8 {
        let request = CreateChatCompletionRequest {
            model: "stub-model".into(),
            messages: messages.clone(),
            tools: Some(tools()),
            stream_options: options.stream.then(|| ChatCompletionStreamOptions {
                include_usage: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        };
        let reply = REPLIES.fetch_add(1, Ordering::SeqCst) + 1;
        let message = if options.stream {
            streamed(&client, request, reply).await?
        } else {
            let response = client.chat().create(request).await?;
            response
                .choices
                .into_iter()
                .next()
                .ok_or("no choice")?
                .message
        };
        pause(&format!("after_model:{reply}")).await;
        messages.push(
            ChatCompletionRequestAssistantMessage {
                content: message.content.clone().map(Into::into),
                tool_calls: message.tool_calls.clone(),
                ..Default::default()
            }
            .into(),
        );
        let Some(calls) = message.tool_calls else {
            return Ok(message.content.unwrap_or_default());
        };
        for call in calls {
            let ChatCompletionMessageToolCalls::Function(call) = call else {
                continue;
            };
            let arguments = &call.function.arguments;
            let output = match call.function.name.as_str() {
                "lookup" => {
                    let args: LookupInput = serde_json::from_str(arguments)?;
                    lookup.call(session.journal(), args.sku).await? // durable: was `lookup(args.sku).await?`
                }
                "send_email" => {
                    let args: EmailInput = serde_json::from_str(arguments)?;
                    send_email
                        .call(session.journal(), args.to, args.body)
                        .await? // durable: was `send_email(args.to, args.body).await?`
                }
                other => format!("no tool named {other}"),
            };
            messages.push(
                ChatCompletionRequestToolMessage {
                    content: output.into(),
                    tool_call_id: call.id,
                }
                .into(),
            );
        }
    }
    Err("still asking for tools after 8 turns".into())
}

/// One streamed reply: its text printed as it arrives, the message assembled from the
/// chunks (text, and each tool call's id, name and argument text).
async fn streamed(
    client: &DurableClient, // durable: was `&Client<OpenAIConfig>`
    request: CreateChatCompletionRequest,
    reply: usize,
) -> Result<ChatCompletionResponseMessage, Error> {
    let mut stream = client.chat().create_stream(request).await?;
    let mut message = ChatCompletionResponseMessage::default();
    let mut chunks = 0;
    while let Some(chunk) = stream.next().await {
        for choice in chunk?.choices {
            if let Some(text) = choice.delta.content.filter(|t| !t.is_empty()) {
                println!("chunk {text:?}");
                message.content.get_or_insert_default().push_str(&text);
            }
            for delta in choice.delta.tool_calls.into_iter().flatten() {
                let calls = message.tool_calls.get_or_insert_default();
                let index = delta.index as usize;
                if index > calls.len() {
                    return Err("a tool call's index skips one".into());
                }
                if index == calls.len() {
                    calls.push(ChatCompletionMessageToolCalls::Function(Default::default()));
                }
                let ChatCompletionMessageToolCalls::Function(call) = &mut calls[index] else {
                    continue;
                };
                call.id.push_str(delta.id.as_deref().unwrap_or_default());
                if let Some(function) = delta.function {
                    call.function
                        .name
                        .push_str(function.name.as_deref().unwrap_or_default());
                    call.function
                        .arguments
                        .push_str(function.arguments.as_deref().unwrap_or_default());
                }
            }
        }
        chunks += 1;
        if chunks == 2 {
            pause(&format!("mid_stream:{reply}")).await;
        }
    }
    Ok(message)
}
