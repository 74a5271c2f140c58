// `approval` on every replay class: `"required"`, a rule over the generated argument
// struct, a rule over the user's struct (struct-argument form), beside a key and a
// verify hook.
use durable::{IdempotencyKey, ToolContext, Verification, durable_tool};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Read a secret document.
#[durable_tool(replay = "pure", approval = "required")]
async fn read_document(id: String) -> Result<String, std::io::Error> {
    Ok(id)
}

/// Refund an order.
#[durable_tool(
    replay = "idempotent_with_key",
    idempotency_key = |a| format!("refund:{}:{}", a.order, a.cents),
    approval = policy::large_refund,
)]
async fn refund(key: IdempotencyKey, order: String, cents: u64) -> Result<String, std::io::Error> {
    Ok(format!("{key} {order} {cents}"))
}

mod policy {
    pub fn large_refund(args: &super::RefundArgs) -> bool {
        args.cents > 100
    }
}

/// What to wire.
#[derive(Clone, Serialize, Deserialize, JsonSchema)]
struct Wire {
    /// Account.
    to: String,
    /// Amount in cents.
    cents: u64,
}

/// Wire money.
#[durable_tool(replay = "unsafe_on_replay", verify = was_wired, approval = large_wire)]
async fn wire_money(#[args] order: Wire) -> Result<u64, std::io::Error> {
    let _ = order.to;
    Ok(order.cents)
}

fn large_wire(wire: &Wire) -> bool {
    wire.cents > 1_000
}

async fn was_wired(_ctx: &ToolContext, _wire: &Wire) -> Verification<u64> {
    Verification::Unknown
}

fn main() {
    assert_eq!(read_document::spec().name, "read_document");
    assert!(policy::large_refund(&RefundArgs {
        order: "o".into(),
        cents: 101
    }));
    let _ = (refund, wire_money);
}
