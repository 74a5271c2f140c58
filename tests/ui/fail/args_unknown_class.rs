// `maybe` is not a replay class; the error lists the three that exist.
use durable::durable_tool;

/// Read a file.
#[durable_tool(replay = "maybe")]
async fn read_file(path: String) -> Result<String, std::io::Error> {
    std::fs::read_to_string(path)
}

fn main() {}
