// Generated items satisfy strict lints: documented, no needless qualification, pedantic-clean.
#![deny(missing_docs, unused_qualifications, unused_results, clippy::pedantic)]
//! A crate with strict lints around a tool.

use durable::{ToolContext, durable_tool};

/// Look up a customer.
#[durable_tool(replay = "pure")]
pub async fn lookup_customer(
    ctx: &ToolContext,
    /// The customer id.
    id: String,
    /// Include closed accounts.
    include_closed: Option<bool>,
) -> Result<String, std::io::Error> {
    Ok(format!("{id} {include_closed:?} {}", ctx.attempt()))
}

fn main() {
    let _spec = lookup_customer::spec();
}
