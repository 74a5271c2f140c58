// An `unsafe_on_replay` tool has no idempotency key (nothing deduplicates it), so it cannot ask for one.
use durable::{IdempotencyKey, durable_tool};

/// Send an email.
#[durable_tool(replay = "unsafe_on_replay")]
async fn send_email(to: String, key: IdempotencyKey) -> Result<String, std::io::Error> {
    Ok(format!("{to} {key}"))
}

fn main() {}
