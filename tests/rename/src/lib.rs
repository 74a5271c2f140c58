//! Uses `#[durable_tool]` through a renamed dependency: generated code must reach the
//! runtime only through `crate = "dur"`, never through a hard-coded `::durable`.
#![deny(missing_docs)]

use dur::{ReplayClass, Tool, ToolContext, durable_tool};

/// Charge a card; the provider honours idempotency keys.
#[durable_tool(
    crate = "dur",
    replay = "idempotent_with_key",
    idempotency_key = |a| format!("charge:{}", a.order_id),
)]
pub async fn charge_card(
    ctx: &ToolContext,
    /// The order to charge.
    order_id: String,
    /// Amount in cents.
    cents: u64,
) -> Result<String, std::io::Error> {
    Ok(format!("{order_id} {cents} {:?}", ctx.idempotency_key()))
}

/// The class of the generated tool, through the `Tool` trait.
pub fn class() -> ReplayClass {
    charge_card.spec().class
}

/// Builds the arguments struct the macro generated.
pub fn args() -> ChargeCardArgs {
    ChargeCardArgs {
        order_id: "o-1".into(),
        cents: 5,
    }
}
