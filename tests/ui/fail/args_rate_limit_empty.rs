// `rate_limit` names a limit: an empty name limits nothing and is refused here, not at
// the first call.
use durable::durable_tool;

/// Look a customer up in the CRM.
#[durable_tool(replay = "pure", rate_limit = " ")]
async fn crm_lookup(id: String) -> Result<String, std::io::Error> {
    Ok(id)
}

fn main() {}
