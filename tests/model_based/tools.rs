//! The tools, declared with `#[durable_tool]` as an application would: one of each replay
//! class (and an unsafe one without a verify hook), each in three registrations:
//!
//! | schema | `lookup` (pure) | `charge` (keyed) | `send_email` (unsafe, verify) | `post_webhook` (unsafe) |
//! |---|---|---|---|---|
//! | `v1` | `query` | `order` | `to` | `url` |
//! | `v2` | `topic` | `order_ref` | `recipient` | `endpoint` |
//! | `v2-alias` | `topic`, alias `query` | `order_ref`, alias `order` | `recipient`, alias `to` | `endpoint`, alias `url` |
//!
//! Every tool also takes `memo`, kept by every schema: it carries the call's intent, which
//! is how the ledger recognises one logical effect under different argument shapes. The
//! charge's idempotency key is derived from the intent.

use durable::{ToolContext, Toolbox, Verification, durable_tool};
use serde_json::Value;

use crate::program::{Class, Schema, VerifyMode};
use crate::world::{Scene, body, found_result, intent_of};

type Outcome = Result<Value, std::io::Error>;

fn charge_key(memo: &str) -> String {
    format!("charge:{}", intent_of(memo))
}

/// The email verify hook: the outbox (the ledger) is asked about this very row, or, in
/// `unknown` mode, nothing can be told.
async fn email_sent<A>(ctx: &ToolContext, _args: &A) -> Verification<Value> {
    let world = &Scene::current().world;
    let verdict = match world.verify_mode(ctx.session_id()) {
        VerifyMode::Unknown => Verification::Unknown,
        VerifyMode::Truthful => match world.effect_of(ctx.call_id()) {
            Some(effect) => Verification::Happened(found_result(&effect, "verify")),
            None => Verification::DidNotHappen,
        },
    };
    world.tally(match &verdict {
        Verification::Happened(_) => "verify happened",
        Verification::DidNotHappen => "verify did not happen",
        Verification::Unknown => "verify unknown",
    });
    verdict
}

// --- v1 ------------------------------------------------------------------------------

/// Look a topic up.
#[durable_tool(replay = "pure", name = "lookup")]
pub(crate) async fn lookup_v1(
    ctx: &ToolContext,
    /// What to look up.
    query: String,
    /// Free text; carries the intent.
    memo: String,
) -> Outcome {
    let _ = query;
    Ok(body(ctx, Class::Pure, &memo).await)
}

/// Charge an order (the provider deduplicates on the key).
#[durable_tool(
    replay = "idempotent_with_key",
    name = "charge",
    idempotency_key = |a| charge_key(&a.memo)
)]
pub(crate) async fn charge_v1(
    ctx: &ToolContext,
    /// The order.
    order: String,
    /// Amount in cents.
    cents: u64,
    /// Free text; carries the intent.
    memo: String,
) -> Outcome {
    let _ = (order, cents);
    Ok(body(ctx, Class::Keyed, &memo).await)
}

/// Send an email.
#[durable_tool(replay = "unsafe_on_replay", name = "send_email", verify = email_sent)]
pub(crate) async fn send_email_v1(
    ctx: &ToolContext,
    /// Recipient.
    to: String,
    /// Free text; carries the intent.
    memo: String,
) -> Outcome {
    let _ = to;
    Ok(body(ctx, Class::Email, &memo).await)
}

/// Post to a webhook.
#[durable_tool(replay = "unsafe_on_replay", name = "post_webhook")]
pub(crate) async fn post_webhook_v1(
    ctx: &ToolContext,
    /// Where to post.
    url: String,
    /// Free text; carries the intent.
    memo: String,
) -> Outcome {
    let _ = url;
    Ok(body(ctx, Class::Webhook, &memo).await)
}

// --- v2: one field renamed -------------------------------------------------------------

/// Look a topic up.
#[durable_tool(replay = "pure", name = "lookup")]
pub(crate) async fn lookup_v2(
    ctx: &ToolContext,
    /// What to look up.
    topic: String,
    /// Free text; carries the intent.
    memo: String,
) -> Outcome {
    let _ = topic;
    Ok(body(ctx, Class::Pure, &memo).await)
}

/// Charge an order (the provider deduplicates on the key).
#[durable_tool(
    replay = "idempotent_with_key",
    name = "charge",
    idempotency_key = |a| charge_key(&a.memo)
)]
pub(crate) async fn charge_v2(
    ctx: &ToolContext,
    /// The order.
    order_ref: String,
    /// Amount in cents.
    cents: u64,
    /// Free text; carries the intent.
    memo: String,
) -> Outcome {
    let _ = (order_ref, cents);
    Ok(body(ctx, Class::Keyed, &memo).await)
}

/// Send an email.
#[durable_tool(replay = "unsafe_on_replay", name = "send_email", verify = email_sent)]
pub(crate) async fn send_email_v2(
    ctx: &ToolContext,
    /// Recipient.
    recipient: String,
    /// Free text; carries the intent.
    memo: String,
) -> Outcome {
    let _ = recipient;
    Ok(body(ctx, Class::Email, &memo).await)
}

/// Post to a webhook.
#[durable_tool(replay = "unsafe_on_replay", name = "post_webhook")]
pub(crate) async fn post_webhook_v2(
    ctx: &ToolContext,
    /// Where to post.
    endpoint: String,
    /// Free text; carries the intent.
    memo: String,
) -> Outcome {
    let _ = endpoint;
    Ok(body(ctx, Class::Webhook, &memo).await)
}

// --- v2 with a serde alias for the old name --------------------------------------------

/// Look a topic up.
#[durable_tool(replay = "pure", name = "lookup")]
pub(crate) async fn lookup_v2_alias(
    ctx: &ToolContext,
    /// What to look up.
    #[serde(alias = "query")]
    topic: String,
    /// Free text; carries the intent.
    memo: String,
) -> Outcome {
    let _ = topic;
    Ok(body(ctx, Class::Pure, &memo).await)
}

/// Charge an order (the provider deduplicates on the key).
#[durable_tool(
    replay = "idempotent_with_key",
    name = "charge",
    idempotency_key = |a| charge_key(&a.memo)
)]
pub(crate) async fn charge_v2_alias(
    ctx: &ToolContext,
    /// The order.
    #[serde(alias = "order")]
    order_ref: String,
    /// Amount in cents.
    cents: u64,
    /// Free text; carries the intent.
    memo: String,
) -> Outcome {
    let _ = (order_ref, cents);
    Ok(body(ctx, Class::Keyed, &memo).await)
}

/// Send an email.
#[durable_tool(replay = "unsafe_on_replay", name = "send_email", verify = email_sent)]
pub(crate) async fn send_email_v2_alias(
    ctx: &ToolContext,
    /// Recipient.
    #[serde(alias = "to")]
    recipient: String,
    /// Free text; carries the intent.
    memo: String,
) -> Outcome {
    let _ = recipient;
    Ok(body(ctx, Class::Email, &memo).await)
}

/// Post to a webhook.
#[durable_tool(replay = "unsafe_on_replay", name = "post_webhook")]
pub(crate) async fn post_webhook_v2_alias(
    ctx: &ToolContext,
    /// Where to post.
    #[serde(alias = "url")]
    endpoint: String,
    /// Free text; carries the intent.
    memo: String,
) -> Outcome {
    let _ = endpoint;
    Ok(body(ctx, Class::Webhook, &memo).await)
}

/// The toolbox a worker of this release registers.
pub fn toolbox(schema: Schema) -> Toolbox {
    let built = match schema {
        Schema::V1 => Toolbox::new()
            .with(lookup_v1)
            .and_then(|t| t.with(charge_v1))
            .and_then(|t| t.with(send_email_v1))
            .and_then(|t| t.with(post_webhook_v1)),
        Schema::V2 => Toolbox::new()
            .with(lookup_v2)
            .and_then(|t| t.with(charge_v2))
            .and_then(|t| t.with(send_email_v2))
            .and_then(|t| t.with(post_webhook_v2)),
        Schema::V2Alias => Toolbox::new()
            .with(lookup_v2_alias)
            .and_then(|t| t.with(charge_v2_alias))
            .and_then(|t| t.with(send_email_v2_alias))
            .and_then(|t| t.with(post_webhook_v2_alias)),
    };
    built.expect("four tools with distinct names")
}

/// The name of the field each schema renames, for the model's arguments.
pub fn renamed_field(class: Class, schema: Schema) -> &'static str {
    match (class, schema) {
        (Class::Pure, Schema::V1) => "query",
        (Class::Pure, _) => "topic",
        (Class::Keyed, Schema::V1) => "order",
        (Class::Keyed, _) => "order_ref",
        (Class::Email, Schema::V1) => "to",
        (Class::Email, _) => "recipient",
        (Class::Webhook, Schema::V1) => "url",
        (Class::Webhook, _) => "endpoint",
    }
}
