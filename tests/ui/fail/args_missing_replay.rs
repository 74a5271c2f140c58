// A tool must declare its replay class: it is never inferred.
use durable::durable_tool;

/// Read a file.
#[durable_tool]
async fn read_file(path: String) -> Result<String, std::io::Error> {
    std::fs::read_to_string(path)
}

fn main() {}
