// A keyed tool always receives its key; `Option<IdempotencyKey>` would invite an empty fallback.
use durable::{IdempotencyKey, durable_tool};

/// Charge a card.
#[durable_tool(replay = "idempotent_with_key", idempotency_key = |a| a.order_id.clone())]
async fn charge_card(
    key: Option<IdempotencyKey>,
    order_id: String,
) -> Result<String, std::io::Error> {
    Ok(format!(
        "{order_id} {}",
        key.map(IdempotencyKey::into_string).unwrap_or_default()
    ))
}

fn main() {}
