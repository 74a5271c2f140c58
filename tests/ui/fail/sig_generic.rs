// A tool has one concrete argument schema: generic tool functions are rejected.
use durable::durable_tool;

/// Echo a value.
#[durable_tool(replay = "pure")]
async fn echo<T: Clone>(value: T) -> Result<String, std::io::Error> {
    let _copy = value.clone();
    Ok(String::new())
}

fn main() {}
