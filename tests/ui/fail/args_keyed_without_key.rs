// An `idempotent_with_key` tool needs the key its upstream deduplicates on.
use durable::durable_tool;

/// Charge a card.
#[durable_tool(replay = "idempotent_with_key")]
async fn charge_card(order_id: String, cents: u64) -> Result<String, std::io::Error> {
    Ok(format!("{order_id}: {cents}"))
}

fn main() {}
