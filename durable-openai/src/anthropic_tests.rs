use super::*;
use durable_core::ArgLimits;
use durable_core::journal::StreamedReply;

/// A streamed Messages reply as Anthropic sends it (the shape of the API's documented
/// example: text, then a tool call whose input arrives in pieces), the raw
/// `text/event-stream` body. The tool input holds a duplicate key split across deltas.
const RECORDED: &str = "event: message_start
data: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_014p7gG3wDgGV9EUtLvnow3U\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-sonnet-4-5\",\"stop_sequence\":null,\"usage\":{\"input_tokens\":472,\"output_tokens\":2},\"content\":[],\"stop_reason\":null}}

event: content_block_start
data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}

event: ping
data: {\"type\": \"ping\"}

event: content_block_delta
data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Okay, let me\"}}

event: content_block_delta
data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\" send that.\"}}

event: content_block_stop
data: {\"type\":\"content_block_stop\",\"index\":0}

event: content_block_start
data: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_01T1x1fJ34qAmk2tNTrN7Up6\",\"name\":\"send_email\",\"input\":{}}}

event: content_block_delta
data: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"\"}}

event: content_block_delta
data: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"to\\\": \\\"ann\"}}

event: content_block_delta
data: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"\\\", \\\"to\\\": \\\"mal\"}}

event: content_block_delta
data: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"lory\\\"}\"}}

event: content_block_stop
data: {\"type\":\"content_block_stop\",\"index\":1}

event: message_delta
data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":89}}

event: message_stop
data: {\"type\":\"message_stop\"}

";

fn events(body: &str, piece: usize) -> Vec<MessageStreamEvent> {
    // Fed in pieces that cut lines (and events) anywhere, as a connection delivers them.
    let mut decoder = SseDecoder::default();
    let bytes: Vec<char> = body.chars().collect();
    bytes
        .chunks(piece)
        .flat_map(|chunk| decoder.push(&chunk.iter().collect::<String>()))
        .map(|data| parse_event(&data).expect("an event"))
        .collect()
}

fn assemble(events: &[MessageStreamEvent]) -> StreamedMessage {
    let mut message = StreamedMessage::default();
    for event in events {
        message.push(event);
    }
    message
}

#[test]
fn a_recorded_stream_folds_into_the_message_with_the_input_text_as_sent() {
    let events = events(RECORDED, 7);
    assert_eq!(events.len(), 14, "every event, the ping included");
    let message = assemble(&events);
    assert_eq!(message.id, "msg_014p7gG3wDgGV9EUtLvnow3U");
    assert_eq!(message.model, "claude-sonnet-4-5");
    assert_eq!(message.text(), "Okay, let me send that.");
    assert_eq!(message.stop_reason.as_deref(), Some("tool_use"));
    assert_eq!(
        (message.usage.input_tokens, message.usage.output_tokens),
        (472, 89)
    );
    let calls = message.tool_calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].id, "toolu_01T1x1fJ34qAmk2tNTrN7Up6");
    assert_eq!(calls[0].name, "send_email");
    assert_eq!(
        calls[0].arguments,
        ToolArguments::Text(r#"{"to": "ann", "to": "mallory"}"#.into()),
        "the partial_json pieces joined exactly as sent"
    );
    let spend = spend(&message).expect("usage");
    assert_eq!((spend.input_tokens(), spend.output_tokens()), (472, 89));
    // Text deltas, as a UI shows them.
    let shown: String = events
        .iter()
        .filter_map(MessageStreamEvent::text_delta)
        .collect();
    assert_eq!(shown, "Okay, let me send that.");
}

#[test]
fn the_assembled_input_goes_through_the_same_scanner_as_a_whole_reply() {
    let limits = ArgLimits::default();
    let check = |partials: &[&str]| {
        let mut events = vec![MessageStreamEvent::ContentBlockStart {
            index: 0,
            content_block: serde_json::json!({"type": "tool_use", "id": "toolu_1", "name": "pay", "input": {}}),
        }];
        events.extend(
            partials
                .iter()
                .map(|piece| MessageStreamEvent::ContentBlockDelta {
                    index: 0,
                    delta: ContentDelta::InputJsonDelta {
                        partial_json: (*piece).to_owned(),
                    },
                }),
        );
        let calls = assemble(&events).tool_calls();
        let ToolArguments::Text(text) = &calls[0].arguments else {
            panic!("raw text");
        };
        durable_core::args::parse_arguments(text, &limits)
    };
    // A duplicate key split across pieces.
    let duplicate = check(&[r#"{"to": "a", "#, r#""to": "b"}"#]).expect_err("duplicate key");
    assert!(duplicate.to_string().contains("to"), "{duplicate}");
    // An integer JCS would round, split across pieces: its exact digits are kept.
    check(&[r#"{"cents": 90071992"#, r#"54740993}"#]).expect_err("beyond 2^53 - 1");
    // NaN, which JSON does not have.
    check(&[r#"{"x": Na"#, "N}"]).expect_err("NaN");
    // A fine input passes.
    let fine = check(&[r#"{"cents": 12"#, "00}"]).expect("fine");
    assert_eq!(fine, serde_json::json!({"cents": 1200}));
    // A call with no delta has no arguments: `{}`.
    assert_eq!(check(&[]).expect("empty"), serde_json::json!({}));
}

#[test]
fn a_replay_yields_events_that_fold_into_the_same_message() {
    let message = assemble(&events(RECORDED, 64));
    let replayed = message.replay();
    assert_eq!(assemble(&replayed), message);
    // Through the journal's JSON, as a recorded reply is read back.
    let json = serde_json::to_value(&message).expect("encode");
    assert_eq!(
        json["content"][1]["input"],
        r#"{"to": "ann", "to": "mallory"}"#
    );
    let decoded: StreamedMessage = serde_json::from_value(json).expect("decode");
    assert_eq!(assemble(&decoded.replay()), message);
    // The same kinds of events as the live stream, so a UI has one code path.
    let shown: String = replayed
        .iter()
        .filter_map(MessageStreamEvent::text_delta)
        .collect();
    assert_eq!(shown, "Okay, let me send that.");
    // And each event reads back from its JSON (a replay sent on to a browser).
    for event in &replayed {
        let data = serde_json::to_string(event).expect("encode");
        assert_eq!(&parse_event(&data).expect("decode"), event);
    }
}

#[test]
fn thinking_unknown_blocks_and_deltas_and_errors() {
    let body = "data: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"role\":\"assistant\",\"model\":\"m\",\"usage\":{\"input_tokens\":3,\"output_tokens\":0,\"cache_read_input_tokens\":10}}}\n\n\
data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\"}}\n\n\
data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"Let me think\"}}\n\n\
data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"signature_delta\",\"signature\":\"EqQB\"}}\n\n\
data: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"server_tool_use\",\"id\":\"srvtoolu_1\",\"name\":\"web_search\"}}\n\n\
data: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"citations_delta\",\"citation\":{}}}\n\n\
data: {\"type\":\"content_block_delta\",\"index\":4000000000,\"delta\":{\"type\":\"text_delta\",\"text\":\"far\"}}\n\n\
data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":5}}\n\n";
    let message = assemble(&events(body, 5));
    assert_eq!(
        message.content[0],
        Block::Thinking {
            thinking: "Let me think".into(),
            signature: "EqQB".into()
        }
    );
    assert!(
        matches!(&message.content[1], Block::Other { block } if block["type"] == "server_tool_use")
    );
    assert_eq!(
        message.content.len(),
        2,
        "an index far beyond the blocks is left out"
    );
    assert_eq!(spend(&message).map(|s| s.input_tokens()), Some(13));
    assert_eq!(assemble(&message.replay()), message);

    let error = parse_event(
        r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
    )
    .expect_err("an error event");
    assert!(matches!(error, StreamError::Provider(_)), "{error}");
    assert!(matches!(
        parse_event("{not json"),
        Err(StreamError::Decode { .. })
    ));
}
