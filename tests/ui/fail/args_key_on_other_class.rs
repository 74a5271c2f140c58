// An idempotency key means nothing to a `pure` tool: it is re-executed, not deduplicated.
use durable::durable_tool;

/// Read a file.
#[durable_tool(replay = "pure", idempotency_key = |a| a.path.clone())]
async fn read_file(path: String) -> Result<String, std::io::Error> {
    std::fs::read_to_string(path)
}

fn main() {}
