// `verify` decides in-doubt `unsafe_on_replay` calls; an idempotent tool is re-executed with its key instead.
use durable::{ToolContext, Verification, durable_tool};

/// Charge a card.
#[durable_tool(
    replay = "idempotent_with_key",
    idempotency_key = |a| a.order_id.clone(),
    verify = was_charged,
)]
async fn charge_card(order_id: String) -> Result<String, std::io::Error> {
    Ok(order_id)
}

async fn was_charged(_ctx: &ToolContext, _args: &ChargeCardArgs) -> Verification<String> {
    Verification::Unknown
}

fn main() {}
