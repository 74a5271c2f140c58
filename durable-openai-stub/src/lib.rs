//! A canned OpenAI-compatible Chat Completions server on loopback.
//!
//! The integrations' tests and examples (async-openai, rig) talk to it instead of a
//! provider: no internet, no key, the same answers every run. It serves
//! `POST {base}/chat/completions` and answers each request with the reply a
//! [`Script`] picks for it, as a `chat.completion` object with `usage`. Every request
//! body is logged, so a test can count how often the model was asked.
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
        let turn = request
            .get("messages")
            .and_then(Value::as_array)
            .map_or(0, |messages| {
                messages
                    .iter()
                    .filter(|m| m.get("role").and_then(Value::as_str) == Some("assistant"))
                    .count()
            });
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
    if request.get("stream").and_then(Value::as_bool) == Some(true) {
        return error(400, "the stub does not stream; send `stream: false`");
    }
    let model = request
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or("stub-model")
        .to_owned();
    let (message, finish_reason) = match shared.script.reply(&request) {
        Reply::Error(status, message) => return error(status, &message),
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
    let body = json!({
        "id": format!("chatcmpl-stub-{}", shared.log.lock().unwrap_or_else(PoisonError::into_inner).len()),
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": null}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                  "total_tokens": prompt + completion},
    });
    json_response(StatusCode::OK, &body)
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
