// `approval` takes `"required"` or the path of a fn, not a number.
use durable::durable_tool;

/// Delete a file.
#[durable_tool(replay = "unsafe_on_replay", approval = 3)]
async fn delete_file(path: String) -> Result<(), std::io::Error> {
    std::fs::remove_file(path)
}

fn main() {}
