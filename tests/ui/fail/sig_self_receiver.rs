// A tool is a free function turned into a tool value; it cannot be a method.
use durable::durable_tool;

struct Mailer;

impl Mailer {
    /// Send an email.
    #[durable_tool(replay = "unsafe_on_replay")]
    async fn send_email(&self, to: String) -> Result<String, std::io::Error> {
        Ok(to)
    }
}

fn main() {}
