//! A budget that binds, on SQLite: a research agent with ceilings (dollars from a price
//! table, model calls), refused before the call that would go past one,
//! parked for an operator, raised (audited), and continued by the next worker: the reply
//! paid before the park comes back from the journal, charged once.
//!
//! ```sh
//! cargo run --example budget
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use durable::budget::{Price, PriceTable, Usage};
use durable::store::SessionStatus;
use durable::{
    Budget, CallError, CheckpointStore, Durable, DurableError, Limit, Message, Session, SessionId,
    StartOptions,
};
use serde::{Deserialize, Serialize};

/// What the (stand-in) provider answers: the text and its token usage.
#[derive(Debug, Serialize, Deserialize)]
struct Reply {
    text: String,
    model: String,
    prompt_tokens: u64,
    cached_tokens: u64,
    completion_tokens: u64,
}

static ASKED: AtomicUsize = AtomicUsize::new(0);

async fn provider() -> Result<Reply, std::io::Error> {
    let n = ASKED.fetch_add(1, Ordering::SeqCst);
    Ok(Reply {
        text: format!("finding {n}"),
        model: "gpt-4o-mini-2024-07-18".into(),
        prompt_tokens: 20_000,
        cached_tokens: 8_000,
        completion_tokens: 2_000,
    })
}

// README: budgets
/// One research step: ask the model, journaled with its usage (priced by the runtime's
/// price table). A ceiling refuses the call before the provider is asked.
async fn research(session: &Session<Message>) -> Result<Reply, DurableError> {
    let reply = session
        .journal()
        .with_model_name("gpt-4o-mini")
        .model_with_usage(provider, |r: &Reply| {
            Some(
                Usage::new(r.prompt_tokens, r.completion_tokens)
                    .with_cached_input(r.cached_tokens)
                    .with_model(r.model.clone()),
            )
        })
        .await;
    match reply {
        Ok(reply) => Ok(reply),
        Err(CallError::Durable(e)) => Err(e),
        Err(other) => Err(DurableError::Encode {
            what: "the provider's reply".into(),
            detail: other.to_string(),
        }),
    }
}

/// A worker's handler: research until done; at a ceiling, park for an operator.
async fn run(session: Session<Message>, steps: usize) -> Result<(), DurableError> {
    for _ in 0..steps {
        match research(&session).await {
            Ok(_) => {}
            Err(DurableError::BudgetExceeded(refusal)) => {
                // Or tell the model (`ToolResult::over_budget`), or stop.
                println!("refused: {refusal}");
                return session.park_for_budget(&refusal).await;
            }
            Err(other) => return Err(other),
        }
    }
    session.complete().await.map(drop)
}
// README: end

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let store: Arc<dyn CheckpointStore> =
        durable::connect(&format!("sqlite:{}", dir.path().join("agent.db").display())).await?;
    // README: budgets setup
    let durable = Durable::builder(Arc::clone(&store))
        // Dollars per million input, output and cached-input tokens.
        .prices(PriceTable::new().with("gpt-4o-mini", Price::usd_per_million(0.15, 0.60, 0.075)?))
        // Ceilings every session starts with unless it sets its own.
        .budget(
            Budget::unlimited()
                .with_limit_usd(0.02)?
                .with_limit_model_calls(3),
        )
        .build();
    let id = SessionId::new("research-ann");
    let session = durable
        .start::<Message>(StartOptions::new().with_id(id.clone()))
        .await?;
    run(session, 5).await?; // each reply costs $0.0036; the fourth is one model call too many
    // README: end
    let parked = store.session(&id).await?;
    assert_eq!(parked.status, SessionStatus::Parked);
    println!("parked: {}", parked.status_reason.unwrap_or_default());

    // The operator raises the ceiling (`durable budget raise research-ann model_calls 5`).
    durable
        .operator()
        .raise_limit(&id, Limit::ModelCalls, 5, "alice", Some("worth it"))
        .await?;
    let resumed = durable.resume::<Message>(&id).await?;
    run(resumed.session, 5).await?;
    let standing = durable.operator().budget(&id).await?;
    println!(
        "completed after {} model calls (the provider was asked {} times), {} spent",
        standing.budget.model_calls,
        ASKED.load(Ordering::SeqCst),
        Limit::Usd.format_amount(standing.budget.spent_nano_usd),
    );
    assert_eq!(
        standing.budget.model_calls as usize,
        ASKED.load(Ordering::SeqCst)
    );
    Ok(())
}
