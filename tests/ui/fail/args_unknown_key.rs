// `retries` is not an argument of `durable_tool`; the error lists the supported ones.
use durable::durable_tool;

/// Read a file.
#[durable_tool(replay = "pure", retries = 3)]
async fn read_file(path: String) -> Result<String, std::io::Error> {
    std::fs::read_to_string(path)
}

fn main() {}
