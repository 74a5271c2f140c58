//! Signals: messages sent into a session from outside its turn (an operator, an API,
//! another session), durable once sent and consumed exactly once by the session.
//!
//! A signal is a row of the store ([`send_signal`](super::SignalStore::send_signal)),
//! pending until the session consumes it
//! ([`consume_signal`](super::SignalStore::consume_signal)). A consumption is keyed by
//! the identity of the journal call that reads it ([`consumer_key`]): a turn re-run after a
//! crash between the consumption and its journal row asks with the same key and is handed
//! the same signal, never the next one. Senders may give an idempotency key: a send
//! retried with the same key finds the signal it sent.
//!
//! A session waiting for a signal ([`WaitFor::Signal`](super::WaitFor::Signal)) gives its
//! lease up; the send that delivers one clears the wait in its own transaction and tells
//! idle pools, so any worker takes the session at once.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::CallIdentity;
use crate::error::StoreError;
use crate::ids::SessionId;

/// The tool name under which a signal's consumption is journaled.
pub const SIGNAL_SLOT: &str = "@signal";

/// The tool name under which the deadline of a wait for a signal is journaled, so that a
/// replayed turn waits until the same moment.
pub const SIGNAL_DEADLINE_SLOT: &str = "@signal.deadline";

/// The prefix of the `waiting_for` value of a session waiting for a signal; the name
/// follows ([`waiting_for_signal`]).
pub const WAITING_FOR_SIGNAL: &str = "signal:";

/// The most bytes a signal's payload may have, as JSON text.
pub const MAX_SIGNAL_BYTES: usize = 1024 * 1024;

/// The deepest a signal's payload may nest (arrays and objects).
pub const MAX_SIGNAL_DEPTH: usize = 64;

/// The `waiting_for` value of a session waiting for the signal `name`.
pub fn waiting_for_signal(name: &str) -> String {
    format!("{WAITING_FOR_SIGNAL}{name}")
}

/// The key under which the journal call of `identity` consumes a signal: the same
/// identity always gives the same key, which is how a re-run turn is handed the signal an
/// earlier attempt consumed.
pub fn consumer_key(identity: &CallIdentity) -> String {
    format!("sig-{}", identity_hex(identity))
}

/// The first 12 bytes of a SHA-256 over the identity's parts, length-prefixed, in hex.
pub(crate) fn identity_hex(identity: &CallIdentity) -> String {
    let mut hash = Sha256::new();
    for part in [
        identity.session.as_str(),
        &identity.step.to_string(),
        &identity.tool,
        &identity.input_hash,
        &identity.ordinal.to_string(),
    ] {
        hash.update((part.len() as u64).to_be_bytes());
        hash.update(part.as_bytes());
    }
    let digest = hash.finalize();
    digest[..12].iter().map(|b| format!("{b:02x}")).collect()
}

/// A signal to send ([`send_signal`](super::SignalStore::send_signal)).
///
/// ```
/// use durable_core::store::NewSignal;
/// use durable_core::SessionId;
/// use serde_json::json;
///
/// let signal = NewSignal::new(
///     SessionId::new("support-42"),
///     "steer",
///     json!({ "say": "use the other account" }),
///     "alice",
/// )
/// .with_key("ticket-42-steer-1");
/// assert!(signal.validate().is_ok());
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct NewSignal {
    /// The session it goes to.
    pub session: SessionId,
    /// Its name: what the session waits for or reads
    /// ([`validate_id`](crate::validate::validate_id)).
    pub name: String,
    /// What it carries.
    pub payload: Value,
    /// Who sends it (an operator's name, a session's id, a service).
    pub sent_by: String,
    /// An idempotency key: a send with a key already used for this session returns the
    /// signal sent with it (and sends nothing), when its name and payload are the same.
    pub key: Option<String>,
}

impl NewSignal {
    /// A signal `name` carrying `payload` to `session`, from `sent_by`.
    pub fn new(
        session: SessionId,
        name: impl Into<String>,
        payload: Value,
        sent_by: impl Into<String>,
    ) -> Self {
        NewSignal {
            session,
            name: name.into(),
            payload,
            sent_by: sent_by.into(),
            key: None,
        }
    }

    /// Sends it at most once under `key`.
    pub fn with_key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Checks the name, sender and key ([`validate_id`](crate::validate::validate_id))
    /// and the payload (at most [`MAX_SIGNAL_BYTES`] of JSON text, [`MAX_SIGNAL_DEPTH`]
    /// levels deep). Every backend calls this before touching the database.
    pub fn validate(&self) -> Result<(), StoreError> {
        self.payload_text().map(|_| ())
    }

    /// The payload as the JSON text a backend stores, once the signal is checked
    /// ([`validate`](Self::validate)).
    pub fn payload_text(&self) -> Result<String, StoreError> {
        crate::validate::validate_id("signal name", &self.name)?;
        crate::validate::validate_id("signal sender", &self.sent_by)?;
        if let Some(key) = &self.key {
            crate::validate::validate_id("signal key", key)?;
        }
        let depth = depth(&self.payload);
        if depth > MAX_SIGNAL_DEPTH {
            return Err(StoreError::InvalidSignal {
                session: self.session.clone(),
                detail: format!(
                    "its payload nests {depth} levels deep, more than {MAX_SIGNAL_DEPTH}"
                ),
            });
        }
        let text = self.payload.to_string();
        if text.len() > MAX_SIGNAL_BYTES {
            return Err(StoreError::InvalidSignal {
                session: self.session.clone(),
                detail: format!(
                    "its payload is {} bytes of JSON, more than {MAX_SIGNAL_BYTES}; send a reference to the data instead",
                    text.len()
                ),
            });
        }
        Ok(text)
    }
}

/// How deep `value` nests, without recursion (a payload from a client may be deep).
fn depth(value: &Value) -> usize {
    let mut deepest = 0;
    let mut stack = vec![(value, 0usize)];
    while let Some((value, level)) = stack.pop() {
        deepest = deepest.max(level);
        match value {
            Value::Array(items) => stack.extend(items.iter().map(|v| (v, level + 1))),
            Value::Object(map) => stack.extend(map.values().map(|v| (v, level + 1))),
            _ => {}
        }
    }
    deepest
}

/// A signal as the store holds it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct SignalRecord {
    /// Its number, unique in the store and increasing in the order signals were sent.
    pub id: i64,
    /// The session it went to.
    pub session: SessionId,
    /// Its name.
    pub name: String,
    /// What it carries.
    pub payload: Value,
    /// Who sent it.
    pub sent_by: String,
    /// The sender's idempotency key, if it gave one.
    pub key: Option<String>,
    /// When it was sent (ms, database clock).
    pub sent_at: i64,
    /// The [`consumer_key`] of the journal call that consumed it; `None` while pending.
    pub consumed_by: Option<String>,
    /// When it was consumed (ms, database clock).
    pub consumed_at: Option<i64>,
}

impl SignalRecord {
    /// A signal row (for backends).
    #[expect(clippy::too_many_arguments, reason = "one argument per column")]
    pub fn new(
        id: i64,
        session: SessionId,
        name: String,
        payload: Value,
        sent_by: String,
        key: Option<String>,
        sent_at: i64,
        consumed: Option<(String, i64)>,
    ) -> Self {
        let (consumed_by, consumed_at) = consumed.unzip();
        SignalRecord {
            id,
            session,
            name,
            payload,
            sent_by,
            key,
            sent_at,
            consumed_by,
            consumed_at,
        }
    }

    /// A signal row as a SQL backend stores it, the payload as JSON text (for backends):
    /// a payload that is not JSON is [`StoreError::Corrupt`]. `consumed_by` alone says
    /// whether it was consumed, as the backends' `consumed_by IS NULL` does (a row whose
    /// time was erased still reads as consumed).
    #[expect(clippy::too_many_arguments, reason = "one argument per column")]
    pub fn stored(
        id: i64,
        session: SessionId,
        name: String,
        payload: &str,
        sent_by: String,
        key: Option<String>,
        sent_at: i64,
        (consumed_by, consumed_at): (Option<String>, Option<i64>),
    ) -> Result<Self, StoreError> {
        let payload = serde_json::from_str(payload).map_err(|e| StoreError::Corrupt {
            session: session.clone(),
            version: None,
            detail: format!("signal #{id}'s payload is not JSON: {e}"),
        })?;
        Ok(SignalRecord {
            id,
            session,
            name,
            payload,
            sent_by,
            key,
            sent_at,
            consumed_at: consumed_at.filter(|_| consumed_by.is_some()),
            consumed_by,
        })
    }

    /// Whether no session consumed it yet.
    pub fn is_pending(&self) -> bool {
        self.consumed_by.is_none()
    }

    /// Whether `new` is the send that made this signal (same session, name, payload):
    /// what a send retried under the same key must match.
    pub fn same_send(&self, new: &NewSignal) -> bool {
        self.session == new.session && self.name == new.name && self.payload == new.payload
    }

    /// The error for a key reused with another name or payload.
    pub fn key_conflict(&self) -> StoreError {
        StoreError::IdempotencyConflict {
            tool: SIGNAL_SLOT.into(),
            key: self.key.clone().unwrap_or_default(),
            existing: crate::ids::CallId::new(format!("signal-{}", self.id)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn signal(payload: Value) -> NewSignal {
        NewSignal::new(SessionId::new("s"), "go", payload, "op")
    }

    #[test]
    fn a_payload_at_the_depth_limit_passes_and_one_level_more_is_refused() {
        let mut deep = json!(1);
        for _ in 0..MAX_SIGNAL_DEPTH {
            deep = json!([deep]);
        }
        assert!(signal(deep.clone()).validate().is_ok());
        let err = signal(json!([deep])).validate().expect_err("too deep");
        assert!(matches!(err, StoreError::InvalidSignal { .. }), "{err}");
        assert!(err.to_string().contains("65 levels"), "{err}");
    }

    #[test]
    fn an_oversized_payload_is_refused_with_its_size() {
        let big = "x".repeat(MAX_SIGNAL_BYTES);
        let err = signal(json!(big)).validate().expect_err("too big");
        assert!(err.to_string().contains("send a reference"), "{err}");
    }

    #[test]
    fn names_senders_and_keys_are_checked_as_ids() {
        let mut s = signal(json!(null));
        s.name = String::new();
        assert!(matches!(s.validate(), Err(StoreError::InvalidId { .. })));
        let s = signal(json!(null)).with_key("a\u{7}b");
        assert!(matches!(s.validate(), Err(StoreError::InvalidId { .. })));
        let s = signal(json!("a\u{0}b"));
        assert!(
            s.validate().is_ok(),
            "a NUL in a string is escaped in the text"
        );
    }

    #[test]
    fn a_stored_row_reads_back_or_says_what_is_wrong() {
        let row = |payload: &str, consumed: (Option<String>, Option<i64>)| {
            SignalRecord::stored(
                7,
                SessionId::new("s"),
                "go".into(),
                payload,
                "op".into(),
                None,
                1,
                consumed,
            )
        };
        let err = row("{not json", (None, None)).expect_err("corrupt");
        assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
        assert!(err.to_string().contains("signal #7"), "{err}");
        // The consumer decides, as the backends' `consumed_by IS NULL` does.
        let timeless = row("1", (Some("k".into()), None)).expect("row");
        assert!(!timeless.is_pending());
        let stray = row("1", (None, Some(5))).expect("row");
        assert!(stray.is_pending() && stray.consumed_at.is_none());
    }

    #[test]
    fn the_consumer_key_is_the_identitys() {
        let identity = CallIdentity {
            session: SessionId::new("s"),
            step: 2,
            tool: SIGNAL_SLOT.into(),
            input_hash: "v1:x".into(),
            ordinal: 0,
        };
        let mut other = identity.clone();
        other.ordinal = 1;
        assert_eq!(consumer_key(&identity), consumer_key(&identity.clone()));
        assert_ne!(consumer_key(&identity), consumer_key(&other));
    }
}
