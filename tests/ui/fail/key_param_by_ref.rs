// The key is taken by value (one spelling); `&IdempotencyKey` is reported with what to write.
use durable::{IdempotencyKey, durable_tool};

/// Charge a card.
#[durable_tool(replay = "idempotent_with_key", idempotency_key = |a| a.order_id.clone())]
async fn charge_card(key: &IdempotencyKey, order_id: String) -> Result<String, std::io::Error> {
    Ok(format!("{order_id} {key}"))
}

fn main() {}
