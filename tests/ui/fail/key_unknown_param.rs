// The key closure reads `a.order`, but the tool's argument is `order_id`.
use durable::durable_tool;

/// Charge a card.
#[durable_tool(replay = "idempotent_with_key", idempotency_key = |a| format!("charge:{}", a.order))]
async fn charge_card(order_id: String, cents: u64) -> Result<String, std::io::Error> {
    Ok(format!("{order_id}: {cents}"))
}

fn main() {}
