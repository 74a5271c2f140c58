//! [`StoredMessage`]: a transcript message as a store returns it, its JSON text unparsed.

use std::fmt;

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::error::StoreError;

use super::Checkpoint;

/// A transcript message as a [`CheckpointStore`](super::CheckpointStore) returns it in a
/// [`Checkpoint`]: the JSON text exactly as stored (the text its seal was checked over),
/// not parsed.
///
/// A resume parses each message once, straight from this text into the session's message
/// type ([`decode`](Self::decode)). Stores used to parse every message into a
/// [`serde_json::Value`] that the runtime then converted, so each message was parsed
/// twice and a long resume spent most of its time building and visiting `Value`s.
///
/// Why not `Box<serde_json::value::RawValue>`: serde_json builds one only through a full
/// validating scan of the text (`RawValue::from_string`; it has no unchecked
/// constructor), so every message would still be read twice, and a seal proves who wrote
/// a message, not that it is JSON. So the store checks nothing here beyond the seal, and a
/// message that is not JSON (a row written by a buggy older release) is reported by
/// whoever parses it, as a typed error, never a panic: [`decode`](Self::decode) and
/// [`to_value`](Self::to_value) return serde_json's error; a resume turns it into
/// [`DurableError::Decode`](crate::DurableError::Decode) naming the session, the
/// checkpoint version and the message; [`Checkpoint::message_values`] and
/// [`verify_sessions`](crate::verify::verify_sessions) into
/// [`StoreError::Corrupt`].
///
/// Equality compares the text byte for byte; compare parsed values with
/// [`to_value`](Self::to_value) or [`Checkpoint::message_values`].
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct StoredMessage(String);

impl StoredMessage {
    /// A message from its stored text. Not checked: the text is parsed when it is read.
    pub fn new(text: impl Into<String>) -> Self {
        StoredMessage(text.into())
    }

    /// The text a store writes for `value` (its compact JSON).
    pub fn from_value(value: &Value) -> Self {
        StoredMessage(value.to_string())
    }

    /// The stored text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The stored text, moved out.
    pub fn into_string(self) -> String {
        self.0
    }

    /// Parses the text straight into `T` (one pass, no intermediate `Value`).
    ///
    /// # Errors
    /// serde_json's error when the text is not JSON or does not fit `T`.
    pub fn decode<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_str(&self.0)
    }

    /// Parses the text into a [`Value`].
    ///
    /// # Errors
    /// serde_json's error when the text is not JSON.
    pub fn to_value(&self) -> Result<Value, serde_json::Error> {
        self.decode()
    }
}

impl fmt::Debug for StoredMessage {
    /// The text itself, so a failed comparison shows the JSON.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<String> for StoredMessage {
    fn from(text: String) -> Self {
        StoredMessage(text)
    }
}

impl Checkpoint {
    /// Every message parsed into a [`Value`], in order.
    ///
    /// # Errors
    /// [`StoreError::Corrupt`] naming the session, the version and the message (its
    /// position, 1, 2, …) for a message that is not JSON.
    pub fn message_values(&self) -> Result<Vec<Value>, StoreError> {
        let first = self.meta.last_seq - self.messages.len() as i64 + 1;
        (first..)
            .zip(&self.messages)
            .map(|(position, message)| {
                message.to_value().map_err(|e| StoreError::Corrupt {
                    session: self.meta.session.clone(),
                    version: Some(self.meta.version),
                    detail: format!("message {position} is not valid JSON: {e}"),
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::ids::SessionId;
    use crate::store::CheckpointMeta;

    fn checkpoint(texts: &[&str]) -> Checkpoint {
        Checkpoint {
            meta: CheckpointMeta {
                session: SessionId::new("s"),
                version: 3,
                last_seq: texts.len() as i64,
                message_count: texts.len() as i64,
                app_version: "v1".to_owned(),
                created_at: 0,
            },
            messages: texts.iter().copied().map(StoredMessage::new).collect(),
            plan: Value::Null,
            budget: Value::Null,
            state: Value::Null,
        }
    }

    #[test]
    fn the_text_is_kept_byte_for_byte_and_parsed_on_demand() {
        let text = r#"{"z": 1,  "a": [1.50, "\u00e9"]}"#;
        let message = StoredMessage::new(text);
        assert_eq!(message.as_str(), text);
        assert_eq!(format!("{message:?}"), text);
        assert_eq!(
            message.to_value().expect("JSON"),
            json!({"z": 1, "a": [1.5, "é"]})
        );
        let value = json!({"role": "user", "content": "hi"});
        assert_eq!(
            StoredMessage::from_value(&value)
                .decode::<Value>()
                .expect("JSON"),
            value
        );
        assert_ne!(StoredMessage::new("[1]"), StoredMessage::new("[ 1 ]"));
    }

    #[test]
    fn text_that_is_not_json_is_an_error_not_a_panic() {
        for text in ["", "[1,", "{\"a\":}", "nan", "\u{0}"] {
            assert!(StoredMessage::new(text).to_value().is_err(), "{text:?}");
            assert!(StoredMessage::new(text).decode::<u8>().is_err(), "{text:?}");
        }
        match checkpoint(&["{}", "[1,"]).message_values() {
            Err(StoreError::Corrupt {
                session,
                version,
                detail,
            }) => {
                assert_eq!((session.as_str(), version), ("s", Some(3)));
                assert!(
                    detail.starts_with("message 2 is not valid JSON"),
                    "{detail}"
                );
            }
            other => panic!("expected Corrupt, got {other:?}"),
        }
        assert_eq!(
            checkpoint(&["1", "\"a\""]).message_values().expect("JSON"),
            [json!(1), json!("a")]
        );
    }
}
