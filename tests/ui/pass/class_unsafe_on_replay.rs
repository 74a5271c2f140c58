// An `unsafe_on_replay` tool with a verify hook and a secret argument.
use durable::{ReplayClass, ToolContext, Verification, durable_tool};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Receipt {
    id: String,
}

/// Send an email to a customer.
#[durable_tool(replay = "unsafe_on_replay", verify = email_was_sent)]
async fn send_email(
    /// Recipient address.
    to: String,
    /// The API token of the mail provider (stored hashed, never in clear).
    #[secret]
    token: String,
) -> Result<Receipt, std::io::Error> {
    Ok(Receipt {
        id: format!("{to}:{}", token.len()),
    })
}

/// Looks in the provider's outbox.
async fn email_was_sent(ctx: &ToolContext, args: &SendEmailArgs) -> Verification<Receipt> {
    let _ = (ctx.call_id(), &args.to);
    Verification::Unknown
}

fn main() {
    let spec = send_email::spec();
    assert_eq!(spec.class, ReplayClass::UnsafeOnReplay);
    assert!(spec.has_verify);
    assert_eq!(spec.secret_args, ["token"]);
}
