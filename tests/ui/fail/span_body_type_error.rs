// A type error inside the body must be reported in the body, not at the attribute.
use durable::durable_tool;

/// Count words.
#[durable_tool(replay = "pure")]
async fn count_words(text: String) -> Result<usize, std::io::Error> {
    let count: usize = text;
    Ok(count)
}

fn main() {}
