//! `durable`'s spans exported to OpenTelemetry: `tracing-opentelemetry` turns each span
//! into an OpenTelemetry span (named by its `otel.name`: `execute_tool lookup`,
//! `chat gpt-4o-mini`, with the GenAI attributes of `durable::telemetry`), and the stdout
//! exporter prints them. Swap in an OTLP exporter to send them to a collector.
//!
//! ```sh
//! cargo run -p durable-otel-example
//! ```

use durable::{
    Block, Durable, IdempotencyKey, Message, ModelToolCall, Spend, StartOptions, Toolbox,
    durable_tool,
};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use serde_json::json;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::SubscriberExt;

/// Look up an order by id.
#[durable_tool(replay = "pure")]
async fn lookup_order(order_id: String) -> Result<String, std::io::Error> {
    Ok(format!("order {order_id}: 2 books, 3400 cents"))
}

/// Charge an order; the provider deduplicates on the key.
#[durable_tool(replay = "idempotent_with_key", idempotency_key = |a| format!("charge:{}", a.order_id))]
async fn charge_card(
    key: IdempotencyKey,
    order_id: String,
    cents: u64,
) -> Result<String, std::io::Error> {
    Ok(format!("charged {cents} for {order_id} ({})", key.as_str()))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The OpenTelemetry pipeline: spans are exported to stdout as each one ends.
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(opentelemetry_stdout::SpanExporter::default())
        .build();
    let tracer = provider.tracer("durable-otel-example");
    let otel = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_location(false)
        .with_threads(false);
    // Spans at INFO and above: durable's, not the SQL driver's DEBUG statement logs.
    let subscriber = tracing_subscriber::registry()
        .with(otel)
        .with(LevelFilter::INFO);
    tracing::subscriber::set_global_default(subscriber)?;

    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(turn())?;

    // Flushes what is left and stops the exporter.
    provider.shutdown()?;
    Ok(())
}

/// One turn of an agent: a journaled model reply (named, with its token usage), its two
/// tool calls dispatched through the journal, a checkpoint.
async fn turn() -> Result<(), Box<dyn std::error::Error>> {
    let store = durable::connect("sqlite::memory:").await?;
    let durable = Durable::builder(store).owner("worker-1").build();
    let tools = Toolbox::new().with(lookup_order)?.with(charge_card)?;
    let mut session = durable.start::<Message>(StartOptions::default()).await?;

    let reply: Message = session
        .journal()
        .with_model_name("gpt-4o-mini")
        .model_with_spend(
            || async {
                // Your provider's client goes here.
                Ok::<_, std::io::Error>(Message::assistant(vec![
                    Block::tool_call("call_1", "lookup_order", json!({"order_id": "o-17"})),
                    Block::tool_call(
                        "call_2",
                        "charge_card",
                        json!({"order_id": "o-17", "cents": 3400}),
                    ),
                ]))
            },
            |_reply| Spend::new(0.0004, 812, 64).ok(),
        )
        .await?;
    let calls = ModelToolCall::from_message(&reply);
    session.push(reply);
    for result in tools.dispatch_all(session.journal(), &calls).await {
        let result = result?;
        session.push(result.into_message());
    }
    session.checkpoint().await?;
    session.complete().await?;
    Ok(())
}
