// A tool takes at most one `ToolContext`; the second one is reported.
use durable::{ToolContext, durable_tool};

/// Read a file.
#[durable_tool(replay = "pure")]
async fn read_file(
    ctx: &ToolContext,
    again: &ToolContext,
    path: String,
) -> Result<String, std::io::Error> {
    let _ = (ctx.attempt(), again.attempt());
    std::fs::read_to_string(path)
}

fn main() {}
