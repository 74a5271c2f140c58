// A key rule may not read a `#[secret]` argument: the key is recorded in clear.
use durable::{IdempotencyKey, durable_tool};

/// Log in to the provider and set a password, once.
#[durable_tool(
    replay = "idempotent_with_key",
    idempotency_key = |a| format!("set-password:{}:{}", a.user, a.password),
)]
async fn set_password(
    key: IdempotencyKey,
    /// The account.
    user: String,
    /// The new password.
    #[secret]
    password: String,
) -> Result<(), std::io::Error> {
    let _ = (key, user, password);
    Ok(())
}

fn main() {}
