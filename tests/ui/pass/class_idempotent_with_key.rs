// An `idempotent_with_key` tool whose key uses the session id, with the context parameter.
use durable::{IdempotencyKey, ReplayClass, ToolContext, durable_tool};

/// Charge a card; the provider honours idempotency keys.
#[durable_tool(
    replay = "idempotent_with_key",
    idempotency_key = |args, session| format!("{session}:charge:{}", args.order_id),
)]
async fn charge_card(
    ctx: &ToolContext,
    key: IdempotencyKey,
    order_id: String,
    cents: u64,
) -> Result<String, std::io::Error> {
    Ok(format!(
        "{order_id}: {cents} (key {key}, attempt {})",
        ctx.attempt()
    ))
}

/// Refund a charge; the key is a plain function of the arguments, and the body reads it
/// from the context (kept for tools that take only the context).
#[durable_tool(replay = "idempotent_with_key", idempotency_key = refund_key)]
async fn refund(ctx: ToolContext, charge_id: String) -> Result<String, std::io::Error> {
    Ok(format!("{charge_id} {:?}", ctx.idempotency_key()))
}

fn refund_key(args: &RefundArgs) -> String {
    format!("refund:{}", args.charge_id)
}

fn main() {
    assert_eq!(charge_card::spec().class, ReplayClass::IdempotentWithKey);
    assert_eq!(refund::spec().name, "refund");
}
