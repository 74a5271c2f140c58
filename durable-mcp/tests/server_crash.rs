//! The example MCP server killed (SIGKILL) mid-call and restarted, over stdio and over
//! streamable HTTP; effects counted in the ledger, a SQLite file outside server and client.

mod common;

use common::{Transport, World, call, call_session, mcp_error, structured};
use durable::store::Resolution;
use durable_mcp::codes;
use serde_json::json;

fn email(to: &str) -> serde_json::Value {
    json!({"to": to, "body": "Your order shipped."})
}

/// A call with a call id that completed before the crash: the retry after the restart
/// returns the recorded result, and nothing runs again.
async fn retry_after_restart_returns_the_recorded_result(transport: Transport) {
    let world = World::new();
    let server = world.server(transport, false).await;
    let first =
        structured(call(&server.peer(), "send_email", email("ann@x"), Some("mail-1")).await);
    server.kill().await;

    let server = world.server(transport, false).await;
    let again =
        structured(call(&server.peer(), "send_email", email("ann@x"), Some("mail-1")).await);
    assert_eq!(again, first, "the retry returns the first call's result");
    assert_eq!(world.effects("email").await, 1, "one email for one call id");
    server.kill().await;
}

/// A call with a call id killed after its effect: the retry is refused as in doubt, naming
/// the durable call an operator resolves; after the resolution it returns what the
/// operator said; the same id with other arguments is refused; one email throughout.
async fn unsafe_call_in_doubt_waits_for_the_operator(transport: Transport) {
    let world = World::new();
    let server = world.server(transport, true).await;
    let peer = server.peer();
    let pending =
        tokio::spawn(
            async move { call(&peer, "send_email", email("bob@x"), Some("mail-2")).await },
        );
    world.reached("send_email").await;
    server.kill().await;
    let _ = pending.await;
    assert_eq!(world.effects("email").await, 1);

    let server = world.server(transport, false).await;
    let refused =
        mcp_error(call(&server.peer(), "send_email", email("bob@x"), Some("mail-2")).await);
    assert_eq!(refused.code, codes::IN_DOUBT, "{refused:?}");
    let data = refused.data.clone().expect("data");
    let in_doubt = data["call"].as_str().expect("the in-doubt call").to_owned();
    assert!(refused.message.contains("mail-2"), "{}", refused.message);
    assert!(
        refused
            .message
            .contains(&format!("durable resolve {in_doubt}")),
        "the message says what an operator does: {}",
        refused.message
    );
    assert_eq!(data["session"], json!(call_session("mail-2")));

    let reused =
        mcp_error(call(&server.peer(), "send_email", email("eve@x"), Some("mail-2")).await);
    assert_eq!(reused.code, codes::CALL_ID_REUSED, "{reused:?}");
    assert_eq!(
        world.effects("email").await,
        1,
        "neither refusal sent an email"
    );

    world
        .resolve(
            &in_doubt,
            Resolution::Happened {
                result: json!({"message_id": 777}),
            },
        )
        .await;
    let resolved =
        structured(call(&server.peer(), "send_email", email("bob@x"), Some("mail-2")).await);
    assert_eq!(
        resolved,
        json!({"message_id": 777}),
        "the operator's result"
    );
    assert_eq!(world.effects("email").await, 1);
    server.kill().await;
}

/// A keyed call with a call id killed after its effect: the retry re-executes it with the
/// recorded key (the provider charges the key once) and returns a result.
async fn keyed_call_in_doubt_reexecutes_with_its_key(transport: Transport) {
    let world = World::new();
    let server = world.server(transport, true).await;
    let peer = server.peer();
    let args = json!({"order_id": "o-5", "cents": 500});
    let sent = args.clone();
    let pending = tokio::spawn(async move { call(&peer, "charge", sent, Some("charge-5")).await });
    world.reached("charge").await;
    server.kill().await;
    let _ = pending.await;

    let server = world.server(transport, false).await;
    let charged = structured(call(&server.peer(), "charge", args.clone(), Some("charge-5")).await);
    assert_eq!(
        charged["key"],
        json!("charge:o-5"),
        "re-executed with the recorded key"
    );
    assert_eq!(
        charged["attempt"],
        json!(2),
        "the same journaled call, executed again"
    );
    let again = structured(call(&server.peer(), "charge", args, Some("charge-5")).await);
    assert_eq!(again, charged);
    assert_eq!(world.effects("charge").await, 1);
    assert_eq!(
        world.effects("charge_attempt").await,
        2,
        "the crashed attempt and one re-execution"
    );
    server.kill().await;
}

/// Without a call id, an unsafe call left in doubt by the crash bars every later call with
/// a side effect in the server's session (pure calls still run), until an operator
/// resolves it; then the barred call runs.
async fn without_call_id_the_barrier_holds_until_resolved(transport: Transport) {
    let world = World::new();
    let server = world.server(transport, true).await;
    let peer = server.peer();
    let pending =
        tokio::spawn(async move { call(&peer, "send_email", email("dan@x"), None).await });
    world.reached("send_email").await;
    server.kill().await;
    let _ = pending.await;

    let server = world.server(transport, false).await;
    let charge = json!({"order_id": "o-6", "cents": 600});
    let refused = mcp_error(call(&server.peer(), "charge", charge.clone(), None).await);
    assert_eq!(refused.code, codes::IN_DOUBT, "{refused:?}");
    let data = refused.data.clone().expect("data");
    assert_eq!(
        data["tool"],
        json!("send_email"),
        "names the in-doubt call's tool"
    );
    assert_eq!(data["refused_tool"], json!("charge"));
    assert_eq!(data["session"], json!("mcp-example"));
    let in_doubt = data["call"].as_str().expect("call").to_owned();
    assert!(
        refused
            .message
            .contains(&format!("durable resolve {in_doubt}")),
        "{}",
        refused.message
    );
    let retry = mcp_error(call(&server.peer(), "send_email", email("dan@x"), None).await);
    assert_eq!(
        retry.code,
        codes::IN_DOUBT,
        "a resend without call id is refused too"
    );
    let price = structured(call(&server.peer(), "lookup", json!({"sku": "mug"}), None).await);
    assert_eq!(price["sku"], json!("mug"), "pure calls still run");
    assert_eq!(world.effects("charge").await, 0);
    assert_eq!(world.effects("email").await, 1);

    world.resolve(&in_doubt, Resolution::DidNotHappen).await;
    let charged = structured(call(&server.peer(), "charge", charge, None).await);
    assert_eq!(charged["order_id"], json!("o-6"));
    assert_eq!(world.effects("charge").await, 1);
    assert_eq!(
        world.effects("email").await,
        1,
        "the resolved email was not sent again"
    );
    server.kill().await;
}

/// The barrier is server-wide: a call id does not bypass it. An unsafe call left in doubt
/// without a call id bars a call with a fresh call id; an unsafe call in doubt under call
/// id A bars a call under call id B; pure calls still run; after the resolution, they run.
async fn a_call_id_does_not_bypass_the_barrier(transport: Transport) {
    let world = World::new();
    let server = world.server(transport, true).await;
    let peer = server.peer();
    let pending =
        tokio::spawn(async move { call(&peer, "send_email", email("gus@x"), None).await });
    world.reached("send_email").await;
    server.kill().await;
    let _ = pending.await;

    let server = world.server(transport, false).await;
    let refused = mcp_error(
        call(
            &server.peer(),
            "send_email",
            email("hal@x"),
            Some("fresh-1"),
        )
        .await,
    );
    assert_eq!(refused.code, codes::IN_DOUBT, "{refused:?}");
    let data = refused.data.clone().expect("data");
    assert_eq!(data["session"], json!("mcp-example"));
    let in_doubt = data["call"].as_str().expect("call").to_owned();
    assert!(
        refused
            .message
            .contains(&format!("durable resolve {in_doubt}")),
        "{}",
        refused.message
    );
    let price = structured(
        call(
            &server.peer(),
            "lookup",
            json!({"sku": "mug"}),
            Some("look-1"),
        )
        .await,
    );
    assert_eq!(price["sku"], json!("mug"), "pure calls still run");
    assert_eq!(world.effects("email").await, 1);
    world.resolve(&in_doubt, Resolution::DidNotHappen).await;
    structured(
        call(
            &server.peer(),
            "send_email",
            email("hal@x"),
            Some("fresh-1"),
        )
        .await,
    );
    assert_eq!(world.effects("email").await, 2);
    server.kill().await;

    // Call id A in doubt bars call id B.
    std::fs::remove_file(world.gate().join("reached-send_email")).expect("reset the gate");
    let server = world.server(transport, true).await;
    let peer = server.peer();
    let pending =
        tokio::spawn(async move { call(&peer, "send_email", email("ida@x"), Some("A")).await });
    world.reached("send_email").await;
    server.kill().await;
    let _ = pending.await;
    assert_eq!(world.effects("email").await, 3);

    let server = world.server(transport, false).await;
    let refused = mcp_error(call(&server.peer(), "send_email", email("jo@x"), Some("B")).await);
    assert_eq!(refused.code, codes::IN_DOUBT, "{refused:?}");
    let data = refused.data.clone().expect("data");
    assert_eq!(data["session"], json!(call_session("A")));
    let without_id = mcp_error(call(&server.peer(), "send_email", email("kim@x"), None).await);
    assert_eq!(without_id.code, codes::IN_DOUBT, "{without_id:?}");
    assert_eq!(
        world.effects("email").await,
        3,
        "nothing ran beside the doubt"
    );
    let in_doubt = data["call"].as_str().expect("call").to_owned();
    world
        .resolve(
            &in_doubt,
            Resolution::Happened {
                result: json!({"message_id": 1}),
            },
        )
        .await;
    structured(call(&server.peer(), "send_email", email("jo@x"), Some("B")).await);
    assert_eq!(world.effects("email").await, 4);
    server.kill().await;
}

both_transports! {
    retry_after_restart_returns_the_recorded_result => super::retry_after_restart_returns_the_recorded_result;
    unsafe_call_in_doubt_waits_for_the_operator => super::unsafe_call_in_doubt_waits_for_the_operator;
    keyed_call_in_doubt_reexecutes_with_its_key => super::keyed_call_in_doubt_reexecutes_with_its_key;
    without_call_id_the_barrier_holds_until_resolved => super::without_call_id_the_barrier_holds_until_resolved;
    a_call_id_does_not_bypass_the_barrier => super::a_call_id_does_not_bypass_the_barrier;
}
