//! rig's own agent loop (multi-turn, with tools) against the canned OpenAI-compatible
//! server on loopback, through rig's Chat Completions client, inside durable sessions.

mod common;

use std::sync::Arc;

use durable::{CheckpointStore, Durable, SessionId, StartOptions};
use durable_openai_stub::{Reply, Script, Stub};
use durable_rig::DurableRig;
use rig_core::completion::CompletionRequest;
use rig_core::providers::openai::OpenAIConfig;
use rig_core::providers::openai::wire::Chat;
use serde_json::{Value, json};

use common::{FINAL, PROMPT, effects, ledger_path, script, toolbox};

fn chat(stub: &Stub) -> rig_core::Model<Chat> {
    OpenAIConfig::new("test-key")
        .with_base_url(stub.base_url())
        .client()
        .chat("stub-model")
}

async fn runtime(dir: &tempfile::TempDir) -> Durable {
    let url = format!("sqlite:{}", dir.path().join("store.db").display());
    let store: Arc<dyn CheckpointStore> = durable::connect(&url).await.expect("store");
    Durable::builder(store).owner("rig-tests").build()
}

/// One rig run in `session`'s journal; the reply's text.
async fn run_agent(journal: &durable::Journal, stub: &Stub) -> Result<String, String> {
    let rig = DurableRig::new(journal.clone(), toolbox());
    let agent = rig
        .agent(chat(stub))
        .expect("tools")
        .preamble("You run a shop.")
        .build();
    match agent.prompt(PROMPT).max_turns(5).run().await {
        Ok(reply) => Ok(reply.output()),
        Err(error) => Err(match rig.take_error() {
            Some(durable) => format!("durable: {durable}"),
            None => format!("rig: {error}"),
        }),
    }
}

/// The tool messages of a request body, `(call id, content)`.
fn tool_messages(body: &Value) -> Vec<(String, String)> {
    body["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["role"] == "tool")
        .map(|m| {
            let content = match &m["content"] {
                Value::String(text) => text.clone(),
                other => other.to_string(),
            };
            (m["tool_call_id"].as_str().unwrap_or("").to_owned(), content)
        })
        .collect()
}

#[tokio::test]
async fn a_run_is_journaled_and_a_rerun_asks_the_model_nothing_and_runs_no_tool() {
    let stub = Stub::start(script()).await.expect("stub");
    let dir = tempfile::tempdir().expect("dir");
    let durable = runtime(&dir).await;
    let id = SessionId::new("order-1");
    let session = durable
        .start::<Value>(StartOptions::new().with_id(id.clone()))
        .await
        .expect("session");

    assert_eq!(
        run_agent(session.journal(), &stub).await.as_deref(),
        Ok(FINAL)
    );
    let requests = stub.requests();
    assert_eq!(requests.len(), 2, "two model turns");
    // The tool results reached the model in its second request, by the model's call ids.
    let results = tool_messages(&requests[1]);
    let ids: Vec<&str> = results.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids, ["call_lookup", "call_email", "call_charge"]);
    assert!(results[0].1.contains("\"price_cents\":1200"), "{results:?}");
    assert!(results[2].1.contains("ch_o-1_1200"), "{results:?}");
    // The definitions rig sent are durable's schemas.
    let tools = requests[0]["tools"].as_array().expect("tools sent");
    let charge = tools
        .iter()
        .find(|t| t["function"]["name"] == "charge")
        .expect("charge defined");
    assert_eq!(
        charge["function"]["parameters"]["required"],
        json!(["order", "cents"])
    );
    let ledger = ledger_path();
    assert_eq!(
        effects(&ledger, id.as_str()).await,
        ["lookup", "send_email", "charge"]
    );

    // The worker dies before its checkpoint; the run is re-run in a resumed session.
    drop(session);
    let mut resumed = durable.resume::<Value>(&id).await.expect("resume").session;
    assert_eq!(
        run_agent(resumed.journal(), &stub).await.as_deref(),
        Ok(FINAL)
    );
    assert_eq!(
        stub.requests().len(),
        2,
        "the recorded replies were replayed"
    );
    assert_eq!(
        effects(&ledger, id.as_str()).await,
        ["lookup", "send_email", "charge"],
        "no tool ran again"
    );
    // The spend of both replies, from the provider's usage, charged once.
    resumed.push(json!({"role": "assistant", "content": FINAL}));
    resumed.checkpoint().await.expect("checkpoint");
    let (input, output) = durable_openai_stub::USAGE;
    assert_eq!(resumed.budget().total_tokens(), 2 * (input + output));
}

#[tokio::test]
async fn duplicate_keys_in_the_raw_arguments_are_refused_to_the_model() {
    let stub = Stub::start(Script::new([
        Reply::tool_calls([(
            "call_dup",
            "charge",
            r#"{"order":"o-1","order":"o-2","cents":1}"#,
        )]),
        Reply::text("I will ask again."),
    ]))
    .await
    .expect("stub");
    let dir = tempfile::tempdir().expect("dir");
    let durable = runtime(&dir).await;
    let session = durable
        .start::<Value>(StartOptions::new().with_id(SessionId::new("dup")))
        .await
        .expect("session");
    assert_eq!(
        run_agent(session.journal(), &stub).await.as_deref(),
        Ok("I will ask again.")
    );
    // rig parses the arguments (the last `order` wins) before a tool sees them; the
    // raw text from the journaled reply is what durable checked.
    let results = tool_messages(&stub.requests()[1]);
    assert_eq!(results.len(), 1);
    assert!(
        results[0].1.contains("`order` appears more than once"),
        "{results:?}"
    );
    assert!(
        effects(&ledger_path(), "dup").await.is_empty(),
        "nothing charged"
    );
}

#[tokio::test]
async fn a_recorded_reply_round_trips_and_the_inner_model_is_not_asked() {
    let stub = Stub::start(Script::new([Reply::tool_calls([(
        "call_1",
        "lookup",
        r#"{"sku":"MUG-1"}"#,
    )])]))
    .await
    .expect("stub");
    let dir = tempfile::tempdir().expect("dir");
    let durable = runtime(&dir).await;
    let id = SessionId::new("round-trip");
    let session = durable
        .start::<Value>(StartOptions::new().with_id(id.clone()))
        .await
        .expect("session");
    let rig = DurableRig::new(session.journal().clone(), toolbox());
    let first = rig
        .model("default", chat(&stub))
        .complete(CompletionRequest::new("Is MUG-1 in stock?"))
        .await
        .expect("reply");
    drop(session);
    let resumed = durable.resume::<Value>(&id).await.expect("resume").session;
    let rig = DurableRig::new(resumed.journal().clone(), toolbox());
    let replayed = rig
        .model("default", chat(&stub))
        .complete(CompletionRequest::new("Is MUG-1 in stock?"))
        .await
        .expect("replayed");
    assert_eq!(stub.requests().len(), 1, "asked once");
    assert_eq!(
        first, replayed,
        "the whole CompletionResponse, raw document included"
    );
    assert_eq!(
        replayed.raw["choices"][0]["message"]["tool_calls"][0]["id"],
        "call_1"
    );
}

/// One streamed rig run in `journal`'s session: the text its events showed, the end
/// events' blocks in order, and the run's output.
async fn stream_agent(journal: &durable::Journal, stub: &Stub) -> (String, Vec<Value>, String) {
    use futures_util::StreamExt;
    use rig_agent::agent::MultiTurnStreamItem;
    use rig_core::streaming::{Item, StreamEvent};

    let rig = DurableRig::new(journal.clone(), toolbox());
    let agent = rig
        .agent(chat(stub))
        .expect("tools")
        .preamble("You run a shop.")
        .build();
    let mut stream = agent.prompt(PROMPT).max_turns(5).stream();
    let (mut text, mut ends) = (String::new(), Vec::new());
    while let Some(item) = stream.next().await {
        match item
            .unwrap_or_else(|e| panic!("the streamed run failed: {e} ({:?})", rig.take_error()))
        {
            MultiTurnStreamItem::StreamAssistantItem(Item::Event(StreamEvent::Text {
                text: piece,
                ..
            })) => text.push_str(&piece),
            MultiTurnStreamItem::StreamAssistantItem(Item::Event(StreamEvent::End {
                content,
                ..
            })) => ends.push(serde_json::to_value(content).expect("a block")),
            MultiTurnStreamItem::FinalResponse(response) => {
                return (text, ends, response.output());
            }
            _ => {}
        }
    }
    panic!("the streamed run ended without its final response");
}

#[tokio::test]
async fn a_streamed_run_is_journaled_and_replayed_as_a_stream() {
    let stub = Stub::start(script()).await.expect("stub");
    let dir = tempfile::tempdir().expect("dir");
    let durable = runtime(&dir).await;
    let id = SessionId::new("streamed");
    let session = durable
        .start::<Value>(StartOptions::new().with_id(id.clone()))
        .await
        .expect("session");
    let (live_text, live_ends, output) = stream_agent(session.journal(), &stub).await;
    assert_eq!(output, FINAL);
    assert_eq!(live_text, FINAL, "the final reply's text, streamed");
    assert_eq!(stub.requests().len(), 2);
    assert!(
        stub.requests().iter().all(|r| r["stream"] == true),
        "rig streamed"
    );
    assert_eq!(
        effects(&ledger_path(), "streamed").await,
        ["lookup", "send_email", "charge"]
    );

    // The worker dies before its checkpoint; the re-run streams from the journal.
    drop(session);
    let resumed = durable.resume::<Value>(&id).await.expect("resume").session;
    let (text, ends, again) = stream_agent(resumed.journal(), &stub).await;
    assert_eq!(stub.requests().len(), 2, "the model was not asked again");
    assert_eq!(again, FINAL);
    assert_eq!(text, live_text, "the same text, replayed as a stream");
    assert_eq!(ends, live_ends, "the same blocks, in the same order");
    assert_eq!(
        effects(&ledger_path(), "streamed").await,
        ["lookup", "send_email", "charge"],
        "no tool ran twice"
    );
    // The streamed replies are the rows a `run()` reply records: a `run()` replays them.
    drop(resumed);
    let resumed = durable.resume::<Value>(&id).await.expect("resume").session;
    assert_eq!(
        run_agent(resumed.journal(), &stub).await.as_deref(),
        Ok(FINAL)
    );
    assert_eq!(stub.requests().len(), 2);
}

#[tokio::test]
async fn a_tool_failure_is_text_the_model_reads_and_is_replayed_as_recorded() {
    let stub = Stub::start(Script::new([
        Reply::tool_calls([("call_gone", "lookup", r#"{"sku":"GONE-1"}"#)]),
        Reply::text("That item does not exist."),
    ]))
    .await
    .expect("stub");
    let dir = tempfile::tempdir().expect("dir");
    let durable = runtime(&dir).await;
    let id = SessionId::new("gone");
    let session = durable
        .start::<Value>(StartOptions::new().with_id(id.clone()))
        .await
        .expect("session");
    assert_eq!(
        run_agent(session.journal(), &stub).await.as_deref(),
        Ok("That item does not exist.")
    );
    let results = tool_messages(&stub.requests()[1]);
    assert_eq!(
        results,
        [(
            "call_gone".to_owned(),
            r#"{"error":"no such SKU: GONE-1"}"#.to_owned()
        )]
    );
    // Re-run: the recorded failure is what the tool returns; it does not run again.
    drop(session);
    let resumed = durable.resume::<Value>(&id).await.expect("resume").session;
    assert_eq!(
        run_agent(resumed.journal(), &stub).await.as_deref(),
        Ok("That item does not exist.")
    );
    assert_eq!(stub.requests().len(), 2);
    assert_eq!(effects(&ledger_path(), "gone").await, ["lookup"]);
}

/// The runtime's price table prices each reply from rig's usage (for the model's id),
/// and a model-call ceiling stops the run before the second turn asks the provider.
#[tokio::test]
async fn replies_are_priced_by_the_table_and_a_ceiling_stops_the_run() {
    use durable::budget::{Price, PriceTable};

    let stub = Stub::start(script()).await.expect("stub");
    let dir = tempfile::tempdir().expect("dir");
    let url = format!("sqlite:{}", dir.path().join("store.db").display());
    let store: Arc<dyn CheckpointStore> = durable::connect(&url).await.expect("store");
    let durable = Durable::builder(store)
        .owner("rig-tests")
        // $1 per million input tokens, $2 per million output tokens.
        .prices(PriceTable::new().with(
            "stub-model",
            Price::usd_per_million(1.0, 2.0, 0.5).expect("price"),
        ))
        .build();
    let session = durable
        .start::<Value>(
            StartOptions::new()
                .with_id(SessionId::new("order-priced"))
                .with_budget(durable::Budget::unlimited().with_limit_model_calls(1)),
        )
        .await
        .expect("session");
    let stopped = run_agent(session.journal(), &stub).await;
    let stopped = stopped.expect_err("the second model turn is refused");
    assert!(
        stopped.starts_with("durable: budget exceeded: 1 spent of the 1 model-call ceiling"),
        "{stopped}"
    );
    assert_eq!(stub.requests().len(), 1, "the provider was asked once");
    let budget = session.budget();
    let (input, output) = durable_openai_stub::USAGE;
    assert_eq!(budget.model_calls, 1);
    assert_eq!(budget.total_tokens(), input + output);
    assert_eq!(
        budget.spent_nano_usd,
        input * 1_000 + output * 2_000,
        "priced from the usage, not the provider's cost"
    );
}
