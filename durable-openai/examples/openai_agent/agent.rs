//! The agent of `examples/openai_agent.rs`, shared with `tests/crash.rs` (which runs it
//! in a child process and kills it): async-openai's typed messages as the session's
//! transcript, its client against an OpenAI-compatible base URL, every model reply
//! journaled, four `#[durable_tool]`s whose effects go to a ledger (a SQLite file of its
//! own, not the store), one checkpoint per turn.

use std::io::Write;
use std::path::PathBuf;
use std::sync::OnceLock;

use async_openai::Client;
use async_openai::config::OpenAIConfig;
use async_openai::types::chat::{
    ChatCompletionRequestMessage, ChatCompletionRequestSystemMessage,
    ChatCompletionRequestUserMessage, ChatCompletionStreamOptions, CreateChatCompletionRequest,
    CreateChatCompletionResponse,
};
use durable::stream::ReplyEvent;
use durable::{
    Durable, DurableError, IdempotencyKey, SessionId, StartOptions, ToolContext, ToolResult,
    Toolbox, Verification, durable_tool,
};
use durable_openai::StreamedCompletion;
use futures_util::{TryStreamExt, stream};
use serde::{Deserialize, Serialize};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool};

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
    /// The model name sent with each request.
    pub model: String,
    /// Stop (print `paused at <point>`, then wait to be killed) at `after_model` (the
    /// first model reply recorded), `after_email_effect` (the email's ledger row
    /// written, its result not yet recorded) or `before_checkpoint` (the first turn's
    /// tool messages pushed, not yet checkpointed); with `stream`, also `mid_stream`
    /// (the first chunk of the first reply handed out, the reply not yet journaled).
    pub pause_at: Option<String>,
    /// Whether the email's verify hook may look in the ledger (without it, an email in
    /// doubt is refused until an operator resolves it).
    pub verify: bool,
    /// Stream each reply (`create_stream`): the text chunks are printed as they arrive
    /// (`chunk "<text>"` lines: what a UI would show), the whole reply journaled at the
    /// end, and a re-run turn replays it as chunks.
    pub stream: bool,
}

/// What a tool reaches: the ledger and the test's pause point.
struct World {
    ledger: SqlitePool,
    pause_at: Option<String>,
    verify: bool,
}

static WORLD: OnceLock<World> = OnceLock::new();

fn world() -> Result<&'static World, std::io::Error> {
    WORLD
        .get()
        .ok_or_else(|| std::io::Error::other("the agent's world is not set up"))
}

/// Prints `paused at <point>` and waits forever when the run was asked to pause there
/// (the crash test kills the process on that line).
async fn pause(point: &str) {
    if WORLD.get().and_then(|w| w.pause_at.as_deref()) == Some(point) {
        println!("paused at {point}");
        let _ = std::io::stdout().flush();
        std::future::pending::<()>().await;
    }
}

/// An item in the catalogue.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Item {
    /// The SKU asked for.
    pub sku: String,
    /// Units in stock.
    pub in_stock: u32,
    /// Price in cents.
    pub price_cents: u64,
}

/// Look up an item's stock and price.
#[durable_tool(replay = "pure")]
pub async fn lookup(
    /// The item's SKU, e.g. `A-1`.
    sku: String,
) -> Result<Item, std::io::Error> {
    Ok(Item {
        sku,
        in_stock: 3,
        price_cents: 1200,
    })
}

/// A charge the payment provider made.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChargeReceipt {
    /// The key the provider deduplicated on.
    pub idempotency_key: String,
    /// Amount in cents.
    pub cents: u64,
}

/// Charge an order. The payment provider deduplicates on the idempotency key.
#[durable_tool(
    replay = "idempotent_with_key",
    idempotency_key = |a| format!("charge:{}", a.order_id),
)]
pub async fn charge(
    key: IdempotencyKey,
    /// The order to charge.
    order_id: String,
    /// Amount in cents.
    cents: u64,
) -> Result<ChargeReceipt, std::io::Error> {
    let key = key.into_string();
    // The provider's side: one charge per key, however often it is asked.
    sqlx::query(
        "INSERT OR IGNORE INTO effects (kind, call_id, dedup_key, detail) VALUES ('charge', '', ?, ?)",
    )
    .bind(&key)
    .bind(format!("{order_id}: {cents}"))
    .execute(&world()?.ledger)
    .await
    .map_err(std::io::Error::other)?;
    Ok(ChargeReceipt {
        idempotency_key: key,
        cents,
    })
}

/// A sent email.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EmailReceipt {
    /// The mail server's message id.
    pub message_id: String,
}

/// Email a customer. The mail server cannot deduplicate: every call sends a message.
#[durable_tool(replay = "unsafe_on_replay", verify = email_in_ledger)]
pub async fn send_email(
    ctx: &ToolContext,
    /// Recipient address.
    to: String,
    /// Plain-text body.
    body: String,
) -> Result<EmailReceipt, std::io::Error> {
    let row = sqlx::query(
        "INSERT INTO effects (kind, call_id, dedup_key, detail) VALUES ('email', ?, NULL, ?)",
    )
    .bind(ctx.call_id().as_str())
    .bind(format!("to {to}: {body}"))
    .execute(&world()?.ledger)
    .await
    .map_err(std::io::Error::other)?;
    // The email is out; its result is not recorded yet.
    pause("after_email_effect").await;
    Ok(EmailReceipt {
        message_id: format!("<{}@ledger>", row.last_insert_rowid()),
    })
}

/// The verify hook of `send_email`, asked on resume when a call is in doubt: the mail
/// server's log (the ledger) holds every message sent, tagged with the journal call.
async fn email_in_ledger(ctx: &ToolContext, _args: &SendEmailArgs) -> Verification<EmailReceipt> {
    let Ok(world) = world() else {
        return Verification::Unknown;
    };
    if !world.verify {
        return Verification::Unknown;
    }
    let found: Result<Option<(i64,)>, _> =
        sqlx::query_as("SELECT id FROM effects WHERE kind = 'email' AND call_id = ?")
            .bind(ctx.call_id().as_str())
            .fetch_optional(&world.ledger)
            .await;
    match found {
        Ok(Some((id,))) => Verification::Happened(EmailReceipt {
            message_id: format!("<{id}@ledger>"),
        }),
        Ok(None) => Verification::DidNotHappen,
        Err(_) => Verification::Unknown,
    }
}

/// Record an analytics event with free-form properties.
#[durable_tool(replay = "pure")]
pub async fn track_event(
    /// The event name.
    name: String,
    /// Any JSON: OpenAI strict mode cannot express a free value, so this tool is left
    /// out of the definitions sent to the model.
    properties: serde_json::Value,
) -> Result<bool, std::io::Error> {
    let _ = (name, properties);
    Ok(true)
}

/// The agent's tools.
pub fn toolbox() -> Result<Toolbox, durable::error::ToolboxError> {
    Toolbox::new()
        .with(lookup)?
        .with(charge)?
        .with(send_email)?
        .with(track_event)
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

/// The most turns one session may take before the agent gives up.
pub const MAX_TURNS: usize = 16;

/// How often one turn asks the model again after an empty response (`choices: []`).
pub const MAX_ASKS: usize = 3;

/// Runs the session to the end (or resumes it), one checkpoint per turn; returns the
/// number of turns this process ran.
///
/// # Errors
/// A store or model failure, a session still running after [`MAX_TURNS`] turns, a
/// model that answered [`MAX_ASKS`] empty responses in a row, or a refusal the harness
/// must handle: an email in doubt
/// that its verify hook cannot settle is [`DurableError::ReplayUnsafe`] (an operator
/// resolves it with `durable resolve`, then the agent is run again).
pub async fn run(options: Options) -> Result<usize, Box<dyn std::error::Error + Send + Sync>> {
    let ledger = open_ledger(&options.ledger).await?;
    let _ = WORLD.set(World {
        ledger,
        pause_at: options.pause_at.clone(),
        verify: options.verify,
    });
    let toolbox = toolbox()?;
    let tools = durable_openai::chat_tools(&toolbox);
    for skipped in tools.skipped() {
        println!("not offered to the model: {skipped}");
    }

    let store = durable::connect(&format!("sqlite:{}", options.store.display())).await?;
    let durable = Durable::builder(store).owner("openai-agent").build();
    let start = StartOptions::new()
        .with_id(SessionId::new(options.session.clone()))
        .with_messages(vec![
            ChatCompletionRequestMessage::System(ChatCompletionRequestSystemMessage::from(
                "You run a shop's back office. Use the tools.",
            )),
            ChatCompletionRequestMessage::User(ChatCompletionRequestUserMessage::from(
                "Order o-17 wants one A-1: check stock, charge it and email ann@example.com.",
            )),
        ]);
    let mut session = durable.start_or_resume(start).await?.session;
    let client = Client::with_config(
        OpenAIConfig::new()
            .with_api_base(options.base_url.clone())
            .with_api_key("unused-on-loopback"),
    );

    let mut turns = 0;
    loop {
        turns += 1;
        // Counted per process: a resumed session gets `MAX_TURNS` more.
        if turns > MAX_TURNS {
            return Err(format!(
                "the session `{}` is still asking for tools after {MAX_TURNS} turns; giving up",
                options.session
            )
            .into());
        }
        let request = CreateChatCompletionRequest {
            model: options.model.clone(),
            messages: session.messages().to_vec(),
            tools: tools.request_tools(),
            stream_options: options.stream.then(|| ChatCompletionStreamOptions {
                include_usage: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        };
        // Journaled: a re-run turn gets the recorded response, the model is not asked.
        // An empty response is journaled too: ask again (a new position in the journal,
        // so a re-run turn replays the empty response, then the next one).
        let chat = client.chat();
        let mut asks = 0;
        let response = loop {
            asks += 1;
            let journal = session.journal().with_model_name(options.model.clone());
            let response = if options.stream {
                streamed(&journal, || {
                    stream::once(chat.create_stream(request.clone())).try_flatten()
                })
                .await?
            } else {
                journal
                    .model_with_spend(|| chat.create(request.clone()), durable_openai::spend)
                    .await?
            };
            pause("after_model").await;
            match durable_openai::reply_message(&response) {
                Err(durable_openai::ReplyError::Empty(_)) if asks < MAX_ASKS => continue,
                Err(e) => return Err(e.into()),
                Ok(_) => break response,
            }
        };
        let reply = durable_openai::reply_message(&response)?;
        let calls = durable_openai::tool_calls(reply);
        session.push(durable_openai::assistant_message(reply));
        if calls.is_empty() {
            session.checkpoint().await?;
            break;
        }
        // Only the offered tools run: a call to `track_event` (left out) or a custom
        // tool call is refused as an unknown tool.
        let outcomes = tools
            .dispatch_all(&toolbox, session.journal(), &calls)
            .await;
        for (call, outcome) in calls.iter().zip(outcomes) {
            // Unknown tool or bad arguments (a duplicate key): an error result the model
            // reads. Anything else (an email in doubt, a store failure) stops the run.
            let result = outcome.or_else(|e| ToolResult::refused(call, &e).ok_or(e))?;
            session.push(durable_openai::tool_message(&result).into());
        }
        pause("before_checkpoint").await;
        session.checkpoint().await?;
    }
    session.complete().await?;
    Ok(turns)
}

/// One streamed reply: its text chunks printed as they arrive (live, or from the journal
/// on a re-run turn), the whole response returned once it is journaled.
async fn streamed<S>(
    journal: &durable::Journal,
    open: impl FnOnce() -> S,
) -> Result<CreateChatCompletionResponse, Box<dyn std::error::Error + Send + Sync>>
where
    S: futures_util::Stream<
            Item = Result<
                async_openai::types::chat::CreateChatCompletionStreamResponse,
                async_openai::error::OpenAIError,
            >,
        >,
{
    let mut reply = journal
        .model_stream_with_spend::<StreamedCompletion, _, _, _, _>(
            open,
            durable_openai::stream_spend,
        )
        .await?;
    let mut chunks = 0;
    while let Some(event) = reply.next().await {
        match event? {
            ReplyEvent::Chunk(chunk) => {
                for choice in &chunk.choices {
                    if let Some(text) = choice.delta.content.as_deref().filter(|t| !t.is_empty()) {
                        println!("chunk {text:?}");
                    }
                }
                chunks += 1;
                if chunks == 1 && !reply.is_replay() {
                    pause("mid_stream").await;
                }
            }
            ReplyEvent::Reply(whole) => return Ok(whole.0),
        }
    }
    Err("the streamed reply ended without its whole response".into())
}

/// Whether an agent's error is a call in doubt that an operator must resolve.
pub fn is_in_doubt(error: &(dyn std::error::Error + 'static)) -> bool {
    matches!(
        error.downcast_ref::<DurableError>(),
        Some(DurableError::ReplayUnsafe { .. })
    )
}
