//! Keyed MACs over recorded outcomes (HMAC-SHA256).
//!
//! The journal is a privileged store: a row written behind the framework's back (a
//! buggy job, an attacker with database access) would otherwise be returned on replay
//! as if the tool had produced it. With a key configured
//! ([`DurableBuilder::mac_key`](crate::DurableBuilder::mac_key)), every outcome is signed
//! over `(call id, kind, canonical JSON)` and checked before it is returned.

use hmac::{Hmac, Mac};
use serde_json::Value;
use sha2::Sha256;

use crate::ids::CallId;

type HmacSha256 = Hmac<Sha256>;

fn mac(key: &[u8], call: &CallId, what: &str, value: &Value) -> Option<HmacSha256> {
    let canonical = crate::key::canonical_json(value).ok()?;
    let mut mac = HmacSha256::new_from_slice(key).ok()?;
    mac.update(b"durable-mac-v1\0");
    mac.update(call.as_str().as_bytes());
    mac.update(b"\0");
    mac.update(what.as_bytes());
    mac.update(b"\0");
    mac.update(canonical.as_bytes());
    Some(mac)
}

/// Signs an outcome: `"v1:"` + hex tag.
pub fn sign(key: &[u8], call: &CallId, what: &str, value: &Value) -> String {
    match mac(key, call, what, value) {
        Some(m) => format!("v1:{}", hex(&m.finalize().into_bytes())),
        None => "v1:unsignable".to_owned(),
    }
}

/// Checks a tag in constant time.
pub fn verify(key: &[u8], call: &CallId, what: &str, value: &Value, tag: &str) -> bool {
    let Some(hex_tag) = tag.strip_prefix("v1:") else {
        return false;
    };
    let Some(bytes) = unhex(hex_tag) else {
        return false;
    };
    match mac(key, call, what, value) {
        Some(m) => m.verify_slice(&bytes).is_ok(),
        None => false,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_tag_verifies_only_for_the_same_key_call_and_value() {
        let call = CallId::new("c1");
        let tag = sign(b"k", &call, "result", &json!({"a": 1}));
        assert!(verify(b"k", &call, "result", &json!({"a": 1}), &tag));
        assert!(!verify(b"other", &call, "result", &json!({"a": 1}), &tag));
        assert!(!verify(
            b"k",
            &CallId::new("c2"),
            "result",
            &json!({"a": 1}),
            &tag
        ));
        assert!(!verify(b"k", &call, "error", &json!({"a": 1}), &tag));
        assert!(!verify(b"k", &call, "result", &json!({"a": 2}), &tag));
        assert!(!verify(b"k", &call, "result", &json!({"a": 1}), "v1:zz"));
    }
}
