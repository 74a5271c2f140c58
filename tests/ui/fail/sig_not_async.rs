// A tool is an `async fn`: the journal awaits it.
use durable::durable_tool;

/// Read a file.
#[durable_tool(replay = "pure")]
fn read_file(path: String) -> Result<String, std::io::Error> {
    std::fs::read_to_string(path)
}

fn main() {}
