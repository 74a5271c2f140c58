// Each attribute argument may appear once; the second `replay` is the one reported.
use durable::durable_tool;

/// Read a file.
#[durable_tool(replay = "pure", replay = "unsafe_on_replay")]
async fn read_file(path: String) -> Result<String, std::io::Error> {
    std::fs::read_to_string(path)
}

fn main() {}
