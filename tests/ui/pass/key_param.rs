// A keyed tool receives its key as an `IdempotencyKey` parameter: alone, beside the context, anywhere in the list, `mut`, spelled with a path, with the struct form.
#![deny(missing_docs, unused_qualifications, unused_results)]
//! Keyed tools that take their key as a parameter.

use durable::{IdempotencyKey, ToolContext, durable_tool};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Charge a card; the provider honours idempotency keys.
#[durable_tool(
    replay = "idempotent_with_key",
    idempotency_key = |a| format!("charge:{}", a.order_id),
)]
pub async fn charge_card(
    key: IdempotencyKey,
    /// The order being paid.
    order_id: String,
    /// Amount in cents.
    cents: u64,
) -> Result<String, std::io::Error> {
    let text: &str = &key;
    Ok(format!(
        "{order_id}: {cents} with {text} ({})",
        key.as_str().len()
    ))
}

/// Refund a charge; the key comes after the context and an argument.
#[durable_tool(
    replay = "idempotent_with_key",
    idempotency_key = |a, session| format!("{session}:refund:{}", a.charge_id),
)]
pub async fn refund(
    ctx: &ToolContext,
    /// The charge to refund.
    charge_id: String,
    mut key: IdempotencyKey,
) -> Result<String, std::io::Error> {
    key = key.clone();
    Ok(format!("{charge_id} {key} attempt {}", ctx.attempt()))
}

/// Tools whose types are spelled with paths.
pub mod spelled {
    use durable::durable_tool;

    /// Cancel an order.
    #[durable_tool(replay = "idempotent_with_key", idempotency_key = |a| a.order_id.clone())]
    pub async fn cancel_order(
        ctx: durable::ToolContext,
        key: durable::IdempotencyKey,
        /// The order to cancel.
        order_id: String,
    ) -> Result<String, std::io::Error> {
        Ok(format!("{order_id} {key} {}", ctx.attempt()))
    }
}

/// A shipment request.
#[derive(Clone, Serialize, Deserialize, JsonSchema)]
pub struct Shipment {
    /// The order to ship.
    pub order_id: String,
}

/// Book a shipment (struct-argument form).
#[durable_tool(replay = "idempotent_with_key", idempotency_key = shipment_key)]
pub async fn book_shipment(
    #[args] shipment: Shipment,
    key: IdempotencyKey,
) -> Result<String, std::io::Error> {
    Ok(format!("{}: {}", shipment.order_id, key.into_string()))
}

fn shipment_key(shipment: &Shipment) -> String {
    format!("ship:{}", shipment.order_id)
}

fn main() {
    // The key is not an argument of the model: it is not in the schema.
    let schema = &charge_card::spec().input_schema;
    assert!(schema["properties"].get("key").is_none());
    assert_eq!(schema["required"], serde_json::json!(["order_id", "cents"]));
    // The escape hatch takes the user's exact parameters, key included.
    let key = IdempotencyKey::new("charge:o-1").expect("not empty");
    let _future = charge_card.dangerous_call_unjournaled(key, "o-1".into(), 5);
    assert!(IdempotencyKey::new("").is_none());
    let _ = (
        refund::spec(),
        book_shipment::spec(),
        spelled::cancel_order::spec(),
    );
}
