// An argument type must be readable from the model's JSON (Deserialize) and described to it (JsonSchema).
use durable::durable_tool;

#[derive(Clone, serde::Serialize)]
struct Recipient {
    address: String,
}

/// Send an email.
#[durable_tool(replay = "unsafe_on_replay")]
async fn send_email(to: Recipient) -> Result<String, std::io::Error> {
    Ok(to.address)
}

fn main() {}
