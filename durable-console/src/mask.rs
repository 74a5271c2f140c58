//! Secrets hidden from the operator, exactly as the `durable` CLI hides them.
//!
//! This is the rule of `durable-cli`'s `render::mask`, kept identical: the CLI's tests run
//! both functions over the same fixtures (`masks_like_the_console` in
//! `durable-cli/src/render.rs`).

use serde_json::{Map, Value};

/// Argument names that are masked wherever they appear, whatever the tool declared.
pub const SENSITIVE: &[&str] = &[
    "password",
    "passwd",
    "secret",
    "token",
    "api_key",
    "apikey",
    "authorization",
    "credential",
    "private_key",
    "access_key",
    "cookie",
];

/// Whether a key looks sensitive: it contains one of [`SENSITIVE`], ignoring case, with
/// `-` read as `_`.
pub fn is_sensitive(key: &str) -> bool {
    let key = key.to_ascii_lowercase().replace('-', "_");
    SENSITIVE.iter().any(|s| key.contains(s))
}

/// Arguments (or any JSON) with secrets hidden: values stored masked by the journal
/// (`{"$secret": …}`, a tool's declared secret arguments) become `"<secret>"`, and values
/// under a key that looks sensitive ([`is_sensitive`]) become `"***"`, at any depth.
/// Numbers, booleans and nulls stay: `input_tokens: 12` is no secret.
///
/// ```
/// use durable_console::mask::mask;
/// use serde_json::json;
///
/// let shown = mask(&json!({"to": "ann", "body": {"$secret": "v1:…"}, "auth": {"token": "t"}}));
/// assert_eq!(shown, json!({"to": "ann", "body": "<secret>", "auth": {"token": "***"}}));
/// ```
pub fn mask(value: &Value) -> Value {
    match value {
        Value::Object(map) if is_stored_secret(map) => Value::String("<secret>".into()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| {
                    let hideable = !(v.is_null() || v.is_number() || v.is_boolean());
                    let v = if hideable && is_sensitive(k) {
                        Value::String("***".into())
                    } else {
                        mask(v)
                    };
                    (k.clone(), v)
                })
                .collect::<Map<_, _>>(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(mask).collect()),
        other => other.clone(),
    }
}

fn is_stored_secret(map: &Map<String, Value>) -> bool {
    map.len() == 1 && map.contains_key("$secret")
}

/// Fixtures both maskers are checked on: each is an input and what must be shown.
#[doc(hidden)]
pub fn fixtures() -> Vec<(Value, Value)> {
    use serde_json::json;
    vec![
        (
            json!({
                "to": "ann@example.com",
                "body": {"$secret": "v1:abc"},
                "auth": {"api_key": "sk-123", "Access-Key": "x", "user": "ann"},
                "headers": [{"Authorization": "Bearer t"}],
                "token_count": 5,
                "session_token": {"v": 1},
                "password": null
            }),
            json!({
                "to": "ann@example.com",
                "body": "<secret>",
                "auth": {"api_key": "***", "Access-Key": "***", "user": "ann"},
                "headers": [{"Authorization": "***"}],
                "token_count": 5,
                "session_token": "***",
                "password": null
            }),
        ),
        (
            json!([{"$secret": "x", "other": 1}, {"COOKIE": "c"}, {"Passwd": ["a"]}, "token"]),
            json!([{"$secret": "***", "other": 1}, {"COOKIE": "***"}, {"Passwd": "***"}, "token"]),
        ),
        (
            json!({"private-key": {"$secret": "k"}, "credentials": true, "nested": {"a": {"secret_sauce": "s"}}}),
            json!({"private-key": "***", "credentials": true, "nested": {"a": {"secret_sauce": "***"}}}),
        ),
        (json!("plain"), json!("plain")),
        (json!({"$secret": "only"}), json!("<secret>")),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixtures_hold() {
        for (input, shown) in fixtures() {
            assert_eq!(mask(&input), shown, "{input}");
        }
    }
}
