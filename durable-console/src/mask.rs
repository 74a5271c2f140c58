//! Secrets hidden from the operator, exactly as the `durable` CLI hides them: both call
//! [`durable::secret::mask_for_display`].

pub use durable::secret::{SENSITIVE_KEYS as SENSITIVE, is_sensitive_key as is_sensitive};

/// Arguments (or any JSON) with secrets hidden: [`durable::secret::mask_for_display`].
///
/// ```
/// use durable_console::mask::mask;
/// use serde_json::json;
///
/// let shown = mask(&json!({"to": "ann", "body": {"$secret": "v1:…"}, "auth": {"token": "t"}}));
/// assert_eq!(shown, json!({"to": "ann", "body": "<secret>", "auth": {"token": "***"}}));
/// ```
pub fn mask(value: &serde_json::Value) -> serde_json::Value {
    durable::secret::mask_for_display(value)
}
