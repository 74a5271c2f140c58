//! A canned OpenAI-compatible Chat Completions server on loopback.
//!
//! The integrations' tests and examples (async-openai, rig) talk to it instead of a
//! provider: no internet, no key, the same answers every run. It serves
//! `POST {base}/chat/completions` and answers each request with the reply a
//! [`Script`] picks for it, as a `chat.completion` object with `usage`, or, for a request
//! with `stream: true`, as server-sent `chat.completion.chunk` events (text and argument
//! text in pieces, usage last when `stream_options.include_usage` asks for it). Every
//! request body is logged, so a test can count how often the model was asked.
//!
//! A script picks its reply from the conversation, not from a counter: the *n*-th reply
//! answers a request whose `messages` hold *n* assistant messages. A process that is
//! killed and asks again with the same conversation gets the same reply, and a test
//! that counts requests sees each extra question.
//!
//! ```no_run
//! use durable_openai_stub::{Reply, Script, Stub};
//!
//! # async fn demo() -> std::io::Result<()> {
//! let stub = Stub::start(Script::new([
//!     Reply::tool_calls([("call_1", "lookup", r#"{"sku":"A-1"}"#)]),
//!     Reply::text("The item is in stock."),
//! ]))
//! .await?;
//! println!("OPENAI_BASE_URL={}", stub.base_url());
//! // ... run the agent against it ...
//! assert_eq!(stub.requests().len(), 2);
//! # Ok(()) }
//! ```

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// One canned answer of the model.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// An assistant message asking for tool calls: `(id, name, raw argument text)`.
    ToolCalls(Vec<(String, String, String)>),
    /// An assistant message with text and no tool call (`finish_reason: "stop"`).
    Text(String),
    /// An HTTP error with an OpenAI-style error body.
    Error(u16, String),
    /// HTTP 200 with `choices: []` the first time this turn is asked, then the inner
    /// reply (as some OpenAI-compatible providers do now and then).
    EmptyThen(Box<Reply>),
    /// Streamed, the first time this turn is asked: the inner reply's first text (or
    /// argument) piece, then nothing, the connection held open, so a client that
    /// buffers the stream cannot finish it before a test kills it mid-stream. Asked
    /// again, or not streamed: the inner reply.
    StallThen(Box<Reply>),
}

impl Reply {
    /// An assistant message asking for these tool calls, `(id, name, arguments)`; the
    /// arguments are sent as the raw text given (a test can send duplicate keys).
    pub fn tool_calls<'a>(calls: impl IntoIterator<Item = (&'a str, &'a str, &'a str)>) -> Self {
        Reply::ToolCalls(
            calls
                .into_iter()
                .map(|(id, name, args)| (id.to_owned(), name.to_owned(), args.to_owned()))
                .collect(),
        )
    }

    /// An assistant message with this text.
    pub fn text(text: impl Into<String>) -> Self {
        Reply::Text(text.into())
    }

    /// An empty response (`choices: []`) the first time, then `reply`.
    pub fn empty_then(reply: Reply) -> Self {
        Reply::EmptyThen(Box::new(reply))
    }

    /// A stream that stalls after its first piece the first time, then `reply`.
    pub fn stall_then(reply: Reply) -> Self {
        Reply::StallThen(Box::new(reply))
    }
}

/// The replies of a conversation, picked by how many assistant messages a request holds.
#[derive(Debug, Clone, Default)]
pub struct Script {
    replies: Vec<Reply>,
}

impl Script {
    /// The replies in order: the first answers a conversation with no assistant message.
    pub fn new(replies: impl IntoIterator<Item = Reply>) -> Self {
        Script {
            replies: replies.into_iter().collect(),
        }
    }

    /// The reply for a request body; past the end of the script, a 400 error saying so.
    pub fn reply(&self, request: &Value) -> Reply {
        let turn = assistant_messages(request);
        self.replies.get(turn).cloned().unwrap_or_else(|| {
            Reply::Error(
                400,
                format!(
                    "the stub's script has {} replies; this request holds {turn} assistant messages",
                    self.replies.len()
                ),
            )
        })
    }
}

fn assistant_messages(request: &Value) -> usize {
    request
        .get("messages")
        .and_then(Value::as_array)
        .map_or(0, |messages| {
            messages
                .iter()
                .filter(|m| m.get("role").and_then(Value::as_str) == Some("assistant"))
                .count()
        })
}

/// Token usage reported for every reply: prompt, completion.
pub const USAGE: (u64, u64) = (120, 30);

#[derive(Debug)]
struct Shared {
    script: Script,
    log: Mutex<Vec<Value>>,
}

/// A running stub server; stops when dropped.
#[derive(Debug)]
pub struct Stub {
    addr: SocketAddr,
    shared: Arc<Shared>,
    _stop: oneshot::Sender<()>,
}

impl Stub {
    /// Starts a server on `127.0.0.1`, on a port of its own, answering from `script`.
    ///
    /// # Errors
    /// When the listener cannot be bound.
    pub async fn start(script: Script) -> std::io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            script,
            log: Mutex::new(Vec::new()),
        });
        let app = Router::new()
            .route("/v1/chat/completions", post(completions))
            .with_state(Arc::clone(&shared));
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(async move {
            let server = axum::serve(listener, app).with_graceful_shutdown(async {
                let _ = stopped.await;
            });
            // A failed accept loop ends the stub; its requests then fail in the client.
            let _ = server.await;
        });
        Ok(Stub {
            addr,
            shared,
            _stop: stop,
        })
    }

    /// The API base URL, `http://127.0.0.1:<port>/v1` (what OpenAI clients call
    /// `api_base` or `base_url`).
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// The request bodies received so far, in order.
    pub fn requests(&self) -> Vec<Value> {
        self.shared
            .log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

async fn completions(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    let request: Value = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(e) => return error(400, &format!("the request body is not JSON: {e}")),
    };
    shared
        .log
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(request.clone());
    let stream = request.get("stream").and_then(Value::as_bool) == Some(true);
    let model = request
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or("stub-model")
        .to_owned();
    let mut reply = shared.script.reply(&request);
    // The request is logged: the first of its turn is the only one so far.
    let first_ask = || {
        let turn = assistant_messages(&request);
        let asked = shared
            .log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|r| assistant_messages(r) == turn)
            .count();
        asked == 1
    };
    let mut empty = false;
    let mut stall = false;
    if let Reply::EmptyThen(then) = reply {
        empty = first_ask();
        reply = *then;
    } else if let Reply::StallThen(then) = reply {
        stall = stream && first_ask();
        reply = *then;
    }
    let (message, finish_reason) = match reply {
        Reply::Error(status, message) => return error(status, &message),
        Reply::EmptyThen(_) | Reply::StallThen(_) => {
            return error(500, "the stub's script nests `EmptyThen` or `StallThen`");
        }
        Reply::Text(text) => (
            json!({"role": "assistant", "content": text, "refusal": null}),
            "stop",
        ),
        Reply::ToolCalls(calls) => {
            let calls: Vec<Value> = calls
                .into_iter()
                .map(|(id, name, arguments)| {
                    json!({"id": id, "type": "function",
                           "function": {"name": name, "arguments": arguments}})
                })
                .collect();
            (
                json!({"role": "assistant", "content": null, "refusal": null, "tool_calls": calls}),
                "tool_calls",
            )
        }
    };
    let (prompt, completion) = USAGE;
    let usage = json!({"prompt_tokens": prompt, "completion_tokens": completion,
                       "total_tokens": prompt + completion});
    let id = format!(
        "chatcmpl-stub-{}",
        shared
            .log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    );
    if stream {
        let include_usage = request
            .pointer("/stream_options/include_usage")
            .and_then(Value::as_bool)
            == Some(true);
        let mut chunks = stream_chunks(&message, finish_reason, empty);
        if stall {
            // The role, the first piece, then a connection that never ends.
            chunks.truncate(2);
            return stalled_sse(&id, &model, chunks);
        }
        return sse(&id, &model, chunks, include_usage.then_some(usage));
    }
    let body = json!({
        "id": id,
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": model,
        "choices": if empty { json!([]) } else {
            json!([{"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": null}])
        },
        "usage": usage,
    });
    json_response(StatusCode::OK, &body)
}

/// How many characters of text or argument text one streamed delta carries.
pub const STREAM_PIECE: usize = 8;

/// The `choices` of each chunk streaming `message`, as OpenAI streams them: the role
/// first, the text in pieces of [`STREAM_PIECE`] characters, each tool call's id and name
/// once and then its argument text in pieces, and the finish reason last. An empty
/// response streams no choice at all.
fn stream_chunks(message: &Value, finish_reason: &str, empty: bool) -> Vec<Value> {
    if empty {
        return Vec::new();
    }
    let choice = |delta: Value, finish: Value| json!([{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": null}]);
    let mut chunks = vec![choice(
        json!({"role": "assistant", "content": ""}),
        Value::Null,
    )];
    if let Some(text) = message.get("content").and_then(Value::as_str) {
        for piece in pieces(text) {
            chunks.push(choice(json!({"content": piece}), Value::Null));
        }
    }
    let calls = message.get("tool_calls").and_then(Value::as_array);
    for (index, call) in calls.into_iter().flatten().enumerate() {
        let first = json!({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
            "function": {"name": call["function"]["name"], "arguments": ""}}]});
        chunks.push(choice(first, Value::Null));
        let arguments = call["function"]["arguments"].as_str().unwrap_or_default();
        for piece in pieces(arguments) {
            let delta = json!({"tool_calls": [{"index": index, "function": {"arguments": piece}}]});
            chunks.push(choice(delta, Value::Null));
        }
    }
    chunks.push(choice(json!({}), json!(finish_reason)));
    chunks
}

/// `text` in pieces of [`STREAM_PIECE`] characters.
fn pieces(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    chars
        .chunks(STREAM_PIECE)
        .map(|piece| piece.iter().collect())
        .collect()
}

/// A `text/event-stream` response: one `chat.completion.chunk` event per entry of
/// `choices`, the usage chunk when asked for, then `[DONE]`.
fn sse(id: &str, model: &str, choices: Vec<Value>, usage: Option<Value>) -> Response {
    let chunk = |choices: Value, usage: Value| {
        json!({"id": id, "object": "chat.completion.chunk", "created": 1_700_000_000,
               "model": model, "choices": choices, "usage": usage})
    };
    let mut body = String::new();
    for choices in choices {
        body.push_str(&format!("data: {}\n\n", chunk(choices, Value::Null)));
    }
    if let Some(usage) = usage {
        body.push_str(&format!("data: {}\n\n", chunk(json!([]), usage)));
    }
    body.push_str("data: [DONE]\n\n");
    (StatusCode::OK, [(CONTENT_TYPE, "text/event-stream")], body).into_response()
}

/// [`sse`]'s first events, then a body that never ends (nor sends `[DONE]`).
fn stalled_sse(id: &str, model: &str, choices: Vec<Value>) -> Response {
    let events: Vec<Result<String, std::convert::Infallible>> = choices
        .into_iter()
        .map(|choices| {
            let chunk = json!({"id": id, "object": "chat.completion.chunk", "created": 1_700_000_000,
                               "model": model, "choices": choices, "usage": null});
            Ok(format!("data: {chunk}\n\n"))
        })
        .collect();
    let body = futures_util::stream::StreamExt::chain(
        futures_util::stream::iter(events),
        futures_util::stream::pending(),
    );
    (
        StatusCode::OK,
        [(CONTENT_TYPE, "text/event-stream")],
        axum::body::Body::from_stream(body),
    )
        .into_response()
}

fn error(status: u16, message: &str) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
    json_response(
        status,
        &json!({"error": {"message": message, "type": "invalid_request_error", "param": null, "code": null}}),
    )
}

fn json_response(status: StatusCode, body: &Value) -> Response {
    (
        status,
        [(CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}
