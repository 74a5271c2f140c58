// Auto-retrying an `unsafe_on_replay` tool is the duplicate-email bug.
use durable::durable_tool;

/// Send an email.
#[durable_tool(replay = "unsafe_on_replay", retry = durable::RetryPolicy::default())]
async fn send_email(to: String) -> Result<String, std::io::Error> {
    Ok(to)
}

fn main() {}
