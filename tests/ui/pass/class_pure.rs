// A `pure` tool with a retry policy, an optional argument and a doc comment per argument.
use durable::{ReplayClass, RetryPolicy, durable_tool};

/// Read a file.
#[durable_tool(replay = "pure", retry = RetryPolicy::default().with_max_attempts(3))]
async fn read_file(
    /// Path of the file.
    path: String,
    /// Read at most this many bytes.
    limit: Option<usize>,
) -> Result<String, std::io::Error> {
    let mut text = std::fs::read_to_string(path)?;
    text.truncate(limit.unwrap_or(text.len()));
    Ok(text)
}

fn main() {
    let spec = read_file::spec();
    assert_eq!(spec.class, ReplayClass::Pure);
    assert_eq!(spec.retry.as_ref().map(|r| r.max_attempts), Some(3));
    assert_eq!(spec.input_schema["required"], serde_json::json!(["path"]));
    let _args = ReadFileArgs {
        path: "a".into(),
        limit: None,
    };
}
