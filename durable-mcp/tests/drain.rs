//! A call in flight when the stdio client goes away runs to its end before the server
//! process exits: its outcome is recorded, and the retry with its call id gets it.
//! (A regression check of `serve_stdio`'s drain: with rmcp 3.11 this scenario also passed
//! before the drain existed, the stdio server staying up until the handler ended.)

mod common;

use std::time::Duration;

use common::{Transport, World, call, structured};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdio_waits_for_calls_in_flight_before_exiting() {
    let world = World::new();
    let server = world.server(Transport::Stdio, true).await;
    let peer = server.peer();
    let args = json!({"to": "lee@x", "body": "Bye."});
    let sent = args.clone();
    let pending =
        tokio::spawn(async move { call(&peer, "send_email", sent, Some("drain-1")).await });
    world.reached("send_email").await;
    pending.abort(); // the request is dropped (rmcp sends `notifications/cancelled`)
    tokio::time::sleep(Duration::from_millis(300)).await;
    let common::Server {
        mut child, client, ..
    } = server;
    let _ = client.cancel().await; // closes the server's stdin: its client is gone
    tokio::time::sleep(Duration::from_millis(500)).await;
    world.release();
    let status = tokio::time::timeout(Duration::from_secs(60), child.wait())
        .await
        .expect("the server exits once its call ended")
        .expect("wait");
    assert!(status.success(), "{status:?}");

    let server = world.server(Transport::Stdio, false).await;
    let again = structured(call(&server.peer(), "send_email", args, Some("drain-1")).await);
    assert!(again.get("message_id").is_some(), "{again}");
    assert_eq!(world.effects("email").await, 1);
    server.kill().await;
}
