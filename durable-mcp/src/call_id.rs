//! The client-supplied call id: where it travels in a `tools/call` request, and the
//! durable session id derived from it.

use rmcp::ErrorData;
use rmcp::model::RequestMetaObject;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::error::codes;

/// The `_meta` key of a `tools/call` request that carries the client's call id:
/// `{"_meta": {"durable/callId": "order-17-email"}}`.
///
/// A call carrying one runs exactly once however often it is sent (see the
/// [crate docs](crate#exactly-once-a-call-id-per-call)). [`RemoteTools`](crate::RemoteTools)
/// sends its durable call id under this key, so a durable client and a durable server
/// deduplicate retries end to end.
pub const CALL_ID_META: &str = "durable/callId";

/// Longest accepted call id, in bytes (it is stored in the call's session metadata).
pub const MAX_CALL_ID_BYTES: usize = 1024;

/// The call id of a request's `_meta`, if it has one; an id that is not a non-empty
/// string of at most [`MAX_CALL_ID_BYTES`] bytes without NUL is an invalid-params error
/// (nothing is journaled).
pub(crate) fn client_call_id(meta: &RequestMetaObject) -> Result<Option<String>, ErrorData> {
    let Some(value) = meta.get(CALL_ID_META) else {
        return Ok(None);
    };
    let bad = |what: &str| {
        ErrorData::new(
            codes::INVALID_PARAMS,
            format!(
                "`_meta.{CALL_ID_META}` {what}; send a non-empty string of at most \
                 {MAX_CALL_ID_BYTES} bytes that names this call (the same for every retry)"
            ),
            Some(json!({ "path": format!("$._meta[\"{CALL_ID_META}\"]") })),
        )
    };
    match value {
        Value::String(id) if id.is_empty() => Err(bad("is empty")),
        Value::String(id) if id.len() > MAX_CALL_ID_BYTES => Err(bad("is too long")),
        Value::String(id) if id.contains('\0') => Err(bad("holds a NUL character")),
        Value::String(id) => Ok(Some(id.clone())),
        _ => Err(bad("is not a string")),
    }
}

/// `<prefix><hex>`: the first 32 hex digits (128 bits) of the SHA-256 of the call id. The
/// id itself may hold any character; the hash always passes `validate_id`.
pub(crate) fn call_session_id(prefix: &str, call_id: &str) -> String {
    let digest = Sha256::digest(call_id.as_bytes());
    let mut id = String::with_capacity(prefix.len() + 32);
    id.push_str(prefix);
    for byte in &digest[..16] {
        id.push_str(&format!("{byte:02x}"));
    }
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(value: Value) -> RequestMetaObject {
        let mut object = serde_json::Map::new();
        object.insert(CALL_ID_META.into(), value);
        RequestMetaObject::from(object)
    }

    #[test]
    fn reads_a_string_and_refuses_other_shapes() {
        assert_eq!(
            client_call_id(&meta(json!("c-1")))
                .ok()
                .flatten()
                .as_deref(),
            Some("c-1")
        );
        assert_eq!(
            client_call_id(&RequestMetaObject::default()).ok(),
            Some(None)
        );
        for bad in [json!(""), json!(7), json!("a\0b"), json!("x".repeat(2000))] {
            let err = client_call_id(&meta(bad)).err();
            assert_eq!(err.map(|e| e.code), Some(codes::INVALID_PARAMS));
        }
    }

    #[test]
    fn session_ids_are_stable_and_distinct() {
        let a = call_session_id("mcp-x-call-", "order-17");
        assert_eq!(a, call_session_id("mcp-x-call-", "order-17"));
        assert_ne!(a, call_session_id("mcp-x-call-", "order-18"));
        assert_eq!(a.len(), "mcp-x-call-".len() + 32);
        assert!(durable_core::validate::validate_id("session id", &a).is_ok());
    }
}
