// The struct-argument form: the user's own struct is the whole argument object.
use durable::{ToolContext, durable_tool};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What to search for.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
struct SearchQuery {
    /// Words to look for.
    text: String,
    /// At most this many hits.
    limit: Option<u32>,
}

/// Search the catalogue.
#[durable_tool(replay = "pure")]
async fn search(ctx: &ToolContext, #[args] query: SearchQuery) -> std::io::Result<Vec<String>> {
    let _ = ctx.session_id();
    Ok(vec![query.text; query.limit.unwrap_or(1) as usize])
}

fn main() {
    let spec = search::spec();
    assert_eq!(
        spec.input_schema["properties"]["text"]["description"],
        "Words to look for."
    );
}
