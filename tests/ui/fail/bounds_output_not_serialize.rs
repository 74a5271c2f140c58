// A tool's result is recorded in the journal and replayed: it must be Serialize + Deserialize.
use durable::durable_tool;

#[derive(serde::Deserialize)]
struct Receipt {
    id: u64,
}

/// Send an email.
#[durable_tool(replay = "unsafe_on_replay")]
async fn send_email(to: String) -> Result<Receipt, std::io::Error> {
    Ok(Receipt {
        id: to.len() as u64,
    })
}

fn main() {}
