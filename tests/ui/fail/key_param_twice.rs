// A call has one idempotency key; a second `IdempotencyKey` parameter is reported.
use durable::{IdempotencyKey, durable_tool};

/// Charge a card.
#[durable_tool(replay = "idempotent_with_key", idempotency_key = |a| a.order_id.clone())]
async fn charge_card(
    key: IdempotencyKey,
    order_id: String,
    again: IdempotencyKey,
) -> Result<String, std::io::Error> {
    Ok(format!("{order_id} {key} {again}"))
}

fn main() {}
