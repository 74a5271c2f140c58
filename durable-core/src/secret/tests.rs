//! Masking, the vault, and the redaction of replies and errors.

use serde_json::json;
use sha2::{Digest, Sha256};

use super::*;

fn keyring() -> Keyring {
    Keyring::none().bind_store_key(vec![7; 32])
}

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

const CANARY: &str = "CANARY-unit-hunter2";

fn bare_sha256(value: &Value) -> String {
    let text = canonical::canonical_json(value).expect("canonical");
    Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn assert_clean(what: &str, text: &str) {
    assert!(!text.contains(CANARY), "{what} holds the canary: {text}");
    let hashed = bare_sha256(&json!(CANARY));
    assert!(
        !text.contains(&hashed),
        "{what} holds its bare SHA-256: {text}"
    );
}

#[test]
fn a_mask_is_keyed_by_store_tool_and_argument() {
    let value = json!(CANARY);
    let a = mask(&keyring(), "login", "password", &value).expect("mask");
    assert!(is_masked(&a) && is_keyed(&a), "{a}");
    assert_eq!(
        a,
        mask(&keyring(), "login", "password", &value).expect("mask")
    );
    // Canonical: key order and `1.0` vs `1` do not matter.
    assert_eq!(
        mask(&keyring(), "t", "a", &json!({"x": 1, "y": 2.0})).expect("mask"),
        mask(&keyring(), "t", "a", &json!({"y": 2, "x": 1.0})).expect("mask"),
    );
    let other_store = Keyring::none().bind_store_key(vec![8; 32]);
    assert_ne!(
        a,
        mask(&other_store, "login", "password", &value).expect("mask")
    );
    assert_ne!(a, mask(&keyring(), "login", "pin", &value).expect("mask"));
    assert_ne!(
        a,
        mask(&keyring(), "logout", "password", &value).expect("mask")
    );
    assert_clean("the mask", &a.to_string());
}

#[test]
fn mask_args_masks_declared_and_registered_secrets_and_keeps_withheld_ones() {
    register("unit_mask_args", &names(&["pin"]));
    let secrets = secret_args("unit_mask_args", &names(&["password"]));
    assert_eq!(secrets.len(), 2);
    let args = json!({"user": "ann", "password": CANARY, "pin": 1234});
    let masked = mask_args(&keyring(), "unit_mask_args", &secrets, &[], &args).expect("mask");
    assert_eq!(masked["user"], "ann");
    assert!(is_masked(&masked["password"]) && is_masked(&masked["pin"]));
    assert_clean("masked arguments", &masked.to_string());
    // Withheld (already masked) arguments are kept as they are, so a replayed call
    // hashes as the first one did.
    let again = mask_args(
        &keyring(),
        "unit_mask_args",
        &secrets,
        &names(&["password", "pin"]),
        &masked,
    )
    .expect("mask");
    assert_eq!(again, masked);
}

#[test]
fn replies_are_masked_in_every_provider_shape_and_revealed_from_memory() {
    let tool = "unit_login";
    register(tool, &names(&["password"]));
    let text_args = json!({"user": "ann", "password": CANARY}).to_string();
    let mut reply = json!({
        "role": "assistant",
        "content": [
            {"kind": "text", "text": "logging in"},
            {"kind": "tool_call", "id": "c1", "name": tool, "arguments": {"user": "ann", "password": CANARY}},
            {"kind": "tool_call", "id": "c2", "name": "other", "arguments": {"password": "not secret here"}},
        ],
        "openai": {"tool_calls": [{"id": "c3", "type": "function", "function": {"name": tool, "arguments": text_args}}]},
        "responses": [{"type": "function_call", "call_id": "c4", "name": tool, "arguments": text_args}],
        "anthropic": [{"type": "tool_use", "id": "c5", "name": tool, "input": {"password": {"nested": [CANARY, 1]}}}],
    });
    let vault = Vault::default();
    let count = vault
        .redact_reply(&keyring(), &ArgLimits::default(), &mut reply)
        .expect("redact");
    assert_eq!(count, 4);
    assert_clean("the masked reply", &reply.to_string());
    assert_eq!(
        reply["content"][2]["arguments"]["password"],
        "not secret here"
    );
    let secrets = secret_args(tool, &[]);
    // The message block: the clear value comes back from memory.
    let mut args = reply["content"][1]["arguments"].clone();
    assert!(vault.reveal(tool, &secrets, &mut args).is_empty());
    assert_eq!(args, json!({"user": "ann", "password": CANARY}));
    // OpenAI text stays text.
    let text = reply["openai"]["tool_calls"][0]["function"]["arguments"]
        .as_str()
        .expect("still text");
    let mut args: Value = serde_json::from_str(text).expect("json");
    assert!(vault.reveal(tool, &secrets, &mut args).is_empty());
    assert_eq!(args["password"], CANARY);
    // A structured secret is masked as a whole.
    let mut args = reply["anthropic"][0]["input"].clone();
    assert!(vault.reveal(tool, &secrets, &mut args).is_empty());
    assert_eq!(args["password"], json!({"nested": [CANARY, 1]}));
    // Another process (an empty vault) cannot reveal it.
    let mut args = reply["content"][1]["arguments"].clone();
    assert_eq!(
        Vault::default().reveal(tool, &secrets, &mut args),
        ["password"]
    );
    assert_clean("unrevealed arguments", &args.to_string());
}

#[test]
fn unreadable_arguments_text_is_masked_as_a_whole() {
    let tool = "unit_broken";
    register(tool, &names(&["password"]));
    let broken = format!(r#"{{"password": "{CANARY}""#);
    let mut reply = json!([{"type": "function_call", "name": tool, "arguments": broken}]);
    let vault = Vault::default();
    vault
        .redact_reply(&keyring(), &ArgLimits::default(), &mut reply)
        .expect("redact");
    assert_clean("the masked reply", &reply.to_string());
    let text = reply[0]["arguments"].as_str().expect("text");
    let masked: Value = serde_json::from_str(text).expect("a masked value");
    assert_eq!(
        vault.whole(tool, &masked),
        Some(Some(Value::String(broken)))
    );
    assert_eq!(Vault::default().whole(tool, &masked), Some(None));
}

#[test]
fn a_model_cannot_reveal_a_placeholder_it_copied() {
    let tool = "unit_copy";
    register(tool, &names(&["password"]));
    let vault = Vault::default();
    let mut first = json!({"name": tool, "arguments": {"password": CANARY}});
    vault
        .redact_reply(&keyring(), &ArgLimits::default(), &mut first)
        .expect("redact");
    // A later reply quotes the placeholder: it is masked again, as a value of its own,
    // and what the tool receives is the literal placeholder, not the secret.
    let placeholder = first["arguments"]["password"].clone();
    let mut second = json!({"name": tool, "arguments": {"password": placeholder.clone()}});
    vault
        .redact_reply(&keyring(), &ArgLimits::default(), &mut second)
        .expect("redact");
    let mut args = second["arguments"].clone();
    assert!(
        vault
            .reveal(tool, &secret_args(tool, &[]), &mut args)
            .is_empty()
    );
    assert_eq!(args["password"], placeholder);
}

#[test]
fn argument_errors_inside_a_secret_quote_nothing() {
    let tool = "unit_errors";
    let declared = names(&["pin"]);
    let error = ArgumentError {
        path: "$.pin".into(),
        kind: ArgumentErrorKind::IntegerOutOfRange("98765432109876543210".into()),
    };
    let redacted = redact_argument_error(tool, &declared, None, error);
    assert!(!redacted.to_string().contains("98765"), "{redacted}");
    assert_eq!(redacted.path, "$.pin");
    // Elsewhere, a clear secret value quoted in a message is cut out.
    let args = json!({"pin": CANARY, "n": 1});
    let message = redact_message(
        tool,
        &declared,
        &args,
        "$.n",
        format!("custom check failed near {CANARY}"),
    );
    assert_clean("the message", &message);
    let message = redact_message(
        tool,
        &declared,
        &args,
        "$.pin",
        format!("invalid type: string \"{CANARY}\", expected u32"),
    );
    assert_clean("the message", &message);
    assert!(message.contains("`pin`"), "{message}");
}

#[test]
fn paths_inside_an_argument() {
    assert!(args::path_is_inside("$.pin", "pin"));
    assert!(args::path_is_inside("$.pin.a[0]", "pin"));
    assert!(args::path_is_inside("$.pin[1]", "pin"));
    assert!(!args::path_is_inside("$.pins", "pin"));
    assert!(args::path_is_inside("$[\"odd key\"].x", "odd key"));
}

/// Inputs and what an operator's view must show of them.
fn display_fixtures() -> Vec<(Value, Value)> {
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

#[test]
fn display_masking_hides_stored_and_sensitive_values() {
    for (input, shown) in display_fixtures() {
        assert_eq!(mask_for_display(&input), shown, "{input}");
    }
}
