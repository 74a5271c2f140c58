// A tool's error is recorded by its message: it must implement Display.
use durable::durable_tool;

#[derive(Debug)]
struct MailError;

/// Send an email.
#[durable_tool(replay = "unsafe_on_replay")]
async fn send_email(to: String) -> Result<String, MailError> {
    Ok(to)
}

fn main() {}
