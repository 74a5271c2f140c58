//! Fleet-wide rate limits, on SQLite: two sessions share one model's limit (5 requests
//! per second, bursts of 2) and one tool's upstream limit (4 calls per second); a
//! provider's `429` with `retry-after` holds every worker of the store.
//!
//! ```sh
//! cargo run --example rate_limits
//! ```

use std::time::{Duration, Instant};

use durable::limiter::{Quota, RateLimit};
use durable::{
    CheckpointStore, Durable, Message, ModelToolCall, StartOptions, Toolbox, durable_tool,
};
use serde_json::json;

/// Look a customer up in the CRM (an upstream API limited to 4 calls per second).
#[durable_tool(replay = "pure")]
async fn crm_lookup(
    /// The customer's id.
    customer: String,
) -> Result<serde_json::Value, std::io::Error> {
    Ok(json!({"customer": customer, "tier": "gold"}))
}

/// A stand-in for the provider: answers at once.
async fn ask_model(n: usize) -> Result<serde_json::Value, std::io::Error> {
    Ok(json!({"reply": n}))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let url = format!("sqlite:{}", dir.path().join("agent.db").display());
    let store: std::sync::Arc<dyn CheckpointStore> = durable::connect(&url).await?;

    // Defined on the builder, written to the store: every worker of it shares them.
    let durable = Durable::builder(store)
        .rate_limit(
            "openai:gpt-4.1",
            RateLimit::requests(Quota::per_second(5).with_burst(2))
                .with_tokens(Quota::per_minute(200_000)),
        )
        .rate_limit("crm", RateLimit::requests(Quota::per_second(4)))
        .build();
    // One line per integration: the toolbox names the tool's limit ...
    let tools = Toolbox::new()
        .with(crm_lookup)?
        .rate_limit("crm_lookup", "crm");

    let began = Instant::now();
    let a = durable.start::<Message>(StartOptions::new()).await?;
    let b = durable.start::<Message>(StartOptions::new()).await?;
    // ... and a journal handle names the model's.
    let (ja, jb) = (
        a.journal().with_rate_limit("openai:gpt-4.1"),
        b.journal().with_rate_limit("openai:gpt-4.1"),
    );
    // Ten model calls from two sessions at once: 2 at once, then one every 200 ms.
    let tasks: Vec<_> = (0..10)
        .map(|n| {
            let journal = if n % 2 == 0 { ja.clone() } else { jb.clone() };
            tokio::spawn(async move { journal.model(move || ask_model(n)).await })
        })
        .collect();
    for task in tasks {
        task.await??;
    }
    let models = began.elapsed();
    assert!(
        models >= Duration::from_millis(1500),
        "the limit held: {models:?}"
    );
    println!("10 model calls at 5/s (bursts of 2) took {models:.2?}");

    // Eight CRM lookups dispatched at once: 4 at once, then one every 250 ms.
    let began = Instant::now();
    let lookups: Vec<ModelToolCall> = (0..8)
        .map(|n| {
            ModelToolCall::new(
                format!("call-{n}"),
                "crm_lookup",
                json!({"customer": format!("c-{n}")}),
            )
        })
        .collect();
    for result in tools.dispatch_all(a.journal(), &lookups).await {
        result?;
    }
    println!("8 CRM lookups at 4/s took {:.2?}", began.elapsed());

    // The provider answers 429 with `retry-after: 1`: the whole fleet holds for a second.
    let until = ja
        .report_throttle("openai:gpt-4.1", Duration::from_secs(1))
        .await?;
    let held = Instant::now();
    jb.model(|| ask_model(99)).await?;
    assert!(
        held.elapsed() >= Duration::from_millis(900),
        "the 429 held the other session"
    );
    println!(
        "after a 429 (held until {until} ms), the other session waited {:.2?}",
        held.elapsed()
    );

    // What `durable limits` shows.
    for limit in durable.operator().rate_limits().await? {
        println!(
            "{}: {} admitted, {} waiting, {} 429s",
            limit.name, limit.admitted, limit.waiters, limit.throttles
        );
    }
    a.complete().await?;
    b.complete().await?;
    Ok(())
}
