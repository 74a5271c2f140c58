// A `pure` tool has no idempotency key, so it cannot ask for one.
use durable::{IdempotencyKey, durable_tool};

/// Read a file.
#[durable_tool(replay = "pure")]
async fn read_file(key: IdempotencyKey, path: String) -> Result<String, std::io::Error> {
    let _ = key;
    std::fs::read_to_string(path)
}

fn main() {}
