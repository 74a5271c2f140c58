//! Calls a client got wrong are MCP errors naming the JSON path, and nothing is journaled
//! for them: no call session is created, the server's session holds no row.

mod common;

use common::{Transport, World, call, call_session, mcp_error};
use durable_mcp::codes;
use serde_json::json;

async fn refused_with_the_path_and_nothing_journaled(transport: Transport) {
    let world = World::new();
    let server = world.server(transport, false).await;
    let peer = server.peer();
    let cases = [
        // (tool, arguments, the JSON path the error names, what its message names)
        ("send_email", json!({"to": 5, "body": "hi"}), "$.to", "to"),
        ("send_email", json!({"to": "a@x"}), "$", "body"),
        (
            "charge",
            json!({"order_id": "o-1", "cents": -3}),
            "$.cents",
            "cents",
        ),
        (
            "lookup",
            json!({"sku": 9_007_199_254_740_993_u64}),
            "$.sku",
            "sku",
        ),
        (
            "lookup",
            json!({"sku": "mug", "extra": true}),
            "$.extra",
            "extra",
        ),
        ("nope", json!({}), "$.name", "nope"),
    ];
    for (i, (tool, arguments, path, named)) in cases.into_iter().enumerate() {
        for id in [None, Some(format!("bad-{i}"))] {
            let error = mcp_error(call(&peer, tool, arguments.clone(), id.as_deref()).await);
            assert_eq!(
                error.code,
                codes::INVALID_PARAMS,
                "{tool} {arguments}: {error:?}"
            );
            let data = error.data.clone().expect("data");
            assert_eq!(data["path"], json!(path), "{tool} {arguments}: {error:?}");
            assert!(
                error.message.contains(named),
                "the message names `{named}`: {}",
                error.message
            );
            if let Some(id) = id {
                assert!(
                    !world.session_exists(&call_session(&id)).await,
                    "no session for a refused call id"
                );
            }
        }
    }
    let bad_id = mcp_error(call(&peer, "lookup", json!({"sku": "mug"}), Some("")).await);
    assert_eq!(bad_id.code, codes::INVALID_PARAMS);
    assert!(
        bad_id.message.contains("durable/callId"),
        "{}",
        bad_id.message
    );

    assert_eq!(
        world.rows("mcp-example").await,
        0,
        "nothing journaled in the server's session"
    );
    assert_eq!(
        world.effects("email").await + world.effects("charge").await,
        0
    );
    server.kill().await;
}

both_transports! {
    refused_with_the_path_and_nothing_journaled => super::refused_with_the_path_and_nothing_journaled;
}
