//! The stub answers over real HTTP on loopback, picks replies by conversation, logs
//! every request.

use durable_openai_stub::{Reply, Script, Stub};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Posts `body` to the stub with a bare HTTP/1.1 request; returns the status and body.
async fn post(stub: &Stub, body: &Value) -> (u16, Value) {
    let url = stub.base_url();
    let authority = url
        .trim_start_matches("http://")
        .trim_end_matches("/v1")
        .to_owned();
    let mut stream = TcpStream::connect(&authority).await.expect("connect");
    let body = body.to_string();
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut response = String::new();
    stream.read_to_string(&mut response).await.expect("read");
    let status = response[9..12].parse().expect("status");
    let json = response.split("\r\n\r\n").nth(1).expect("body");
    (status, serde_json::from_str(json).expect("json body"))
}

#[tokio::test]
async fn replies_follow_the_conversation_and_every_request_is_logged() {
    let stub = Stub::start(Script::new([
        Reply::tool_calls([("call_1", "lookup", r#"{"sku":"A-1","sku":"B"}"#)]),
        Reply::text("done"),
    ]))
    .await
    .expect("start");

    let first = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    let (status, body) = post(&stub, &first).await;
    assert_eq!(status, 200);
    let call = &body["choices"][0]["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "lookup");
    // The raw argument text goes out as given, duplicate key and all.
    assert_eq!(call["function"]["arguments"], r#"{"sku":"A-1","sku":"B"}"#);
    assert_eq!(body["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(body["usage"]["total_tokens"], 150);

    // The same conversation asked again gets the same reply.
    let (_, again) = post(&stub, &first).await;
    assert_eq!(
        again["choices"][0]["message"],
        body["choices"][0]["message"]
    );

    let second = json!({"model": "m", "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "tool_calls": []},
        {"role": "tool", "tool_call_id": "call_1", "content": "{}"}]});
    let (_, body) = post(&stub, &second).await;
    assert_eq!(body["choices"][0]["message"]["content"], "done");

    let third = json!({"model": "m", "messages": [
        {"role": "assistant"}, {"role": "assistant"}]});
    let (status, body) = post(&stub, &third).await;
    assert_eq!(status, 400);
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("has 2 replies")),
        "{body}"
    );
    assert_eq!(stub.requests().len(), 4);
    assert_eq!(stub.requests()[0], first);
}
