//! Concurrent calls: two requests with the same call id at once run the call once (the
//! second waits for the first, then returns its recorded result), while a call without a
//! call id, serialized through the server's session, is not held up by them.

mod common;

use common::{Transport, World, call, structured};
use serde_json::json;

async fn the_same_call_id_twice_at_once_runs_once(transport: Transport) {
    let world = World::new();
    let server = world.server(transport, true).await;
    let args = json!({"to": "fay@x", "body": "Twice?"});
    let (peer_a, peer_b, args_a, args_b) = (server.peer(), server.peer(), args.clone(), args);
    let first =
        tokio::spawn(async move { call(&peer_a, "send_email", args_a, Some("both")).await });
    world.reached("send_email").await;
    let second =
        tokio::spawn(async move { call(&peer_b, "send_email", args_b, Some("both")).await });
    // The second request reached the server (it waits there for the first) before the
    // first is released.
    world.in_flight(2).await;
    // The lookup without a call id is not queued behind the held call.
    let price = structured(call(&server.peer(), "lookup", json!({"sku": "mug"}), None).await);
    assert_eq!(price["sku"], json!("mug"));
    world.release();
    let first = structured(first.await.expect("first"));
    let second = structured(second.await.expect("second"));
    assert_eq!(first, second, "the second request got the first's result");
    assert_eq!(world.effects("email").await, 1);
    server.kill().await;
}

both_transports! {
    the_same_call_id_twice_at_once_runs_once => super::the_same_call_id_twice_at_once_runs_once;
}
