// An `approval` rule takes the tool's arguments by reference: a fn of another argument
// type is reported at its path.
use durable::durable_tool;

/// Refund an order.
#[durable_tool(replay = "unsafe_on_replay", approval = large_refund)]
async fn refund(order: String, cents: u64) -> Result<u64, std::io::Error> {
    let _ = order;
    Ok(cents)
}

fn large_refund(cents: &u64) -> bool {
    *cents > 100
}

fn main() {}
