// An `approval` rule returns `bool`: whether the call needs approval.
use durable::durable_tool;

/// Refund an order.
#[durable_tool(replay = "unsafe_on_replay", approval = refund_limit)]
async fn refund(order: String, cents: u64) -> Result<u64, std::io::Error> {
    let _ = order;
    Ok(cents)
}

fn refund_limit(args: &RefundArgs) -> u64 {
    args.cents
}

fn main() {}
