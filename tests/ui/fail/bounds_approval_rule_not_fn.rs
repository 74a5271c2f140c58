// An `approval` path must name a fn, not a value.
use durable::durable_tool;

const LIMIT: u64 = 100;

/// Refund an order.
#[durable_tool(replay = "unsafe_on_replay", approval = LIMIT)]
async fn refund(order: String, cents: u64) -> Result<u64, std::io::Error> {
    let _ = order;
    Ok(cents)
}

fn main() {}
