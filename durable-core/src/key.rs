//! Argument validation, RFC 8785 canonical JSON and the input hash.
//!
//! (Being implemented: see the module docs once complete.)

use serde_json::Value;

/// Limits applied to tool and model arguments before they are hashed or journaled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArgLimits {
    /// Deepest allowed nesting of arrays/objects (the root value is depth 1).
    pub max_depth: usize,
    /// Largest allowed document, in bytes of JSON text.
    pub max_bytes: usize,
}

impl Default for ArgLimits {
    fn default() -> Self {
        ArgLimits {
            max_depth: 64,
            max_bytes: 1024 * 1024,
        }
    }
}

/// Why arguments were refused, with the JSON path of the offending value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("at `{path}`: {kind}")]
pub struct ArgumentError {
    /// JSON path of the bad value, e.g. `$.items[3].price`.
    pub path: String,
    /// What is wrong.
    pub kind: ArgumentErrorKind,
}

/// The kinds of [`ArgumentError`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ArgumentErrorKind {
    /// Not JSON.
    #[error("malformed JSON: {0}")]
    Syntax(String),
    /// An object has the same key twice.
    #[error("duplicate object key `{0}`")]
    DuplicateKey(String),
    /// NaN or ±Infinity.
    #[error("number is not finite (NaN or Infinity)")]
    NonFinite,
    /// An integer outside ±(2^53−1), which RFC 8785 would round.
    #[error("integer {0} is outside ±(2^53−1); send it as a string")]
    IntegerOutOfRange(String),
    /// A string with an unpaired UTF-16 surrogate escape.
    #[error("string contains a lone surrogate")]
    LoneSurrogate,
    /// Nesting deeper than the limit.
    #[error("nesting deeper than {limit} levels")]
    TooDeep {
        /// The limit.
        limit: usize,
    },
    /// Document larger than the limit.
    #[error("document of {size} bytes exceeds the {limit}-byte limit")]
    TooLarge {
        /// Size found.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// Arguments must be a JSON object.
    #[error("expected a JSON object of named arguments, found {0}")]
    NotAnObject(&'static str),
}

/// Validates raw JSON text and parses it.
pub fn parse_arguments(raw: &str, limits: &ArgLimits) -> Result<Value, ArgumentError> {
    let _ = limits;
    serde_json::from_str(raw).map_err(|e| ArgumentError {
        path: "$".into(),
        kind: ArgumentErrorKind::Syntax(e.to_string()),
    })
}

/// Validates a value built in memory (depth, size, integer range).
pub fn check_value(value: &Value, limits: &ArgLimits) -> Result<(), ArgumentError> {
    let _ = (value, limits);
    Ok(())
}

/// RFC 8785 canonical JSON text of a value.
pub fn canonical_json(value: &Value) -> Result<String, ArgumentError> {
    Ok(value.to_string())
}

/// `"v1:"` + hex SHA-256 of the canonical JSON of `value`.
pub fn input_hash(value: &Value) -> Result<String, ArgumentError> {
    canonical_json(value)
}

/// `"v1:"` + hex SHA-256 of a schema's canonical JSON.
pub fn schema_fingerprint(schema: &Value) -> String {
    schema.to_string()
}
