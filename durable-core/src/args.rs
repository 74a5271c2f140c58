//! Tool and model arguments: the limits they are checked against ([`ArgLimits`]), the
//! rules that refuse ambiguous JSON before anything is hashed or journaled, and the
//! [`ArgumentError`] that names the offending value.
//!
//! A journaled call is identified by a hash of its arguments (the `canonical` module), so
//! two argument documents must hash alike exactly when the tool would receive the same
//! value, and a hostile or sloppy model must not be able to make two different calls look
//! like one. JSON text, `serde_json` and the JSON Canonicalization Scheme (RFC 8785,
//! "JCS") disagree on a few inputs, and each disagreement is refused here, *before*
//! anything is hashed or journaled, with an [`ArgumentError`] that names the JSON path of
//! the offending value (`$.items[3].price`, or `$["weird key"]` for keys that are not
//! identifiers):
//!
//! | Input | Why it is refused | Kind |
//! |---|---|---|
//! | text above [`ArgLimits::max_bytes`] | checked first, before any parsing | [`TooLarge`](ArgumentErrorKind::TooLarge) |
//! | nesting above [`ArgLimits::max_depth`] | checked by an iterative scan, so `[[[[…` 100 000 deep cannot overflow the stack | [`TooDeep`](ArgumentErrorKind::TooDeep) |
//! | an object key twice (compared *decoded*: `"a"` and `"\u0061"` are the same key) | `serde_json` silently keeps the last one, so the journal and the tool could disagree | [`DuplicateKey`](ArgumentErrorKind::DuplicateKey) |
//! | `NaN`, `Infinity`, `-Infinity`, or a literal such as `1e400` that overflows an `f64` | not JSON numbers; JCS cannot encode them | [`NonFinite`](ArgumentErrorKind::NonFinite) |
//! | an integer literal (no fraction, no exponent) outside ±(2^53−1) | JCS writes every number as an IEEE double, so `9007199254740993` and `9007199254740992` would get the same hash | [`IntegerOutOfRange`](ArgumentErrorKind::IntegerOutOfRange) |
//! | a `\uD800`–`\uDFFF` escape without its partner | not Unicode; cannot be canonicalized | [`LoneSurrogate`](ArgumentErrorKind::LoneSurrogate) |
//! | anything else that is not JSON | `serde_json`'s message, with line and column | [`Syntax`](ArgumentErrorKind::Syntax) |
//!
//! Text from a model goes through [`parse_arguments`] (tool arguments: the top level must
//! be an object) or [`parse_json`] (any JSON value). Typed values built in memory enter
//! the journal through [`to_journal_value`], which refuses non-finite floats
//! (`serde_json::to_value` would write them as `null`), and go through [`check_value`].
//! The canonical form and the input hash (`canonical_json` and `input_hash` in the
//! `canonical` module) re-check the integer rule and the depth cap themselves, so an
//! out-of-range integer can never reach JCS.
//!
//! # Depth
//!
//! Depth counts nested arrays/objects: `{}` and `[1]` have depth 1, `{"a":[1]}` depth 2,
//! a bare scalar depth 0. Whatever the limit says, no value deeper than
//! [`MAX_SUPPORTED_DEPTH`] (127, the most `serde_json` will parse) is accepted, parsed,
//! canonicalized or hashed.
//!
//! # Where the code is
//!
//! - here: the limits, the error types and the three entry points;
//! - `scanner`: raw text, checked in one iterative pass before `serde_json` parses it (its
//!   docs say why it is not a serde `DeserializeSeed`);
//! - `walk`: values in memory, checked by an iterative walk that can also write their
//!   compact JSON text into a sink (to count it, or to hash it);
//! - `finite`: [`to_journal_value`];
//! - `path`: the JSON path notation of every error, rendered in one place.
//!
//! # Example
//!
//! ```
//! use durable_core::args::{parse_arguments, ArgLimits, ArgumentErrorKind};
//! use durable_core::canonical::input_hash;
//!
//! let limits = ArgLimits::default();
//! let a = parse_arguments(r#"{"city": "Paris", "days": 3}"#, &limits)?;
//! let b = parse_arguments("{ \"days\":3.0,\n \"city\":\"Par\\u0069s\" }", &limits)?;
//! // Key order, whitespace, escapes and `3` vs `3.0` do not change the hash.
//! assert_eq!(input_hash(&a)?, input_hash(&b)?);
//! assert!(input_hash(&a)?.starts_with("v1:"));
//!
//! // serde_json would silently keep "mallory"; the journal refuses the call instead.
//! let err = parse_arguments(r#"{"to": "alice", "t\u006f": "mallory"}"#, &limits).unwrap_err();
//! assert_eq!(err.path, "$.to");
//! assert_eq!(err.kind, ArgumentErrorKind::DuplicateKey("to".into()));
//! # Ok::<(), durable_core::ArgumentError>(())
//! ```

use std::borrow::Cow;

use serde_json::Value;

mod finite;
pub(crate) mod path;
mod scanner;
pub(crate) mod walk;

pub use finite::to_journal_value;
pub(crate) use path::{path_is_inside, path_of_key};

use scanner::Stop;
use walk::{Count, walk};

/// Largest integer magnitude that every JSON reader (and JCS) keeps exact: 2^53 − 1.
pub const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;

/// Hard cap on nesting depth, whatever [`ArgLimits::max_depth`] says: `serde_json`
/// refuses to parse deeper documents, and canonicalization recurses once per level.
pub const MAX_SUPPORTED_DEPTH: usize = 127;

/// Limits applied to tool and model arguments before they are hashed or journaled:
/// 64 levels and 1 MiB by default.
///
/// ```
/// use durable_core::ArgLimits;
///
/// let strict = ArgLimits::default().with_max_depth(16).with_max_bytes(64 * 1024);
/// assert_eq!((strict.max_depth, strict.max_bytes), (16, 65_536));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ArgLimits {
    /// Deepest allowed nesting of arrays/objects (the root value is depth 1). Values
    /// above [`MAX_SUPPORTED_DEPTH`] act as [`MAX_SUPPORTED_DEPTH`].
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

impl ArgLimits {
    /// The deepest nesting of arrays and objects allowed (the root value is depth 1);
    /// above [`MAX_SUPPORTED_DEPTH`] it acts as [`MAX_SUPPORTED_DEPTH`].
    pub fn with_max_depth(mut self, max_depth: usize) -> Self {
        self.max_depth = max_depth;
        self
    }

    /// The largest document allowed, in bytes of JSON text.
    pub fn with_max_bytes(mut self, max_bytes: usize) -> Self {
        self.max_bytes = max_bytes;
        self
    }

    fn depth(&self) -> usize {
        self.max_depth.min(MAX_SUPPORTED_DEPTH)
    }
}

/// Why arguments were refused, with the JSON path of the offending value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("at `{path}`: {kind}")]
pub struct ArgumentError {
    /// JSON path of the bad value, e.g. `$.items[3].price` or `$["weird key"]` (very
    /// long keys are shortened with `…`).
    pub path: String,
    /// What is wrong.
    pub kind: ArgumentErrorKind,
}

/// The kinds of [`ArgumentError`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ArgumentErrorKind {
    /// Not JSON.
    #[error("malformed JSON: {0}; send one well-formed JSON document")]
    Syntax(String),
    /// An object has the same key twice (keys are compared after decoding escapes).
    #[error("object key `{0}` appears more than once; send each key once")]
    DuplicateKey(String),
    /// NaN, ±Infinity, or a number too large for a 64-bit float.
    #[error(
        "number is not finite (NaN, Infinity, or beyond the range of a 64-bit float); \
         JSON allows finite numbers only: send a finite number, null or a string"
    )]
    NonFinite,
    /// An integer outside ±(2^53−1), which RFC 8785 would round.
    #[error(
        "integer {0} is outside ±(2^53−1) = ±9007199254740991 and cannot be kept exact; \
         send it as a string"
    )]
    IntegerOutOfRange(String),
    /// A string with an unpaired UTF-16 surrogate escape.
    #[error(
        "string contains a lone UTF-16 surrogate escape (\\uD800-\\uDFFF without its \
         partner); strings must be valid Unicode"
    )]
    LoneSurrogate,
    /// Nesting deeper than the limit.
    #[error("nesting deeper than {limit} levels of arrays/objects; flatten the value")]
    TooDeep {
        /// The limit.
        limit: usize,
    },
    /// Document larger than the limit.
    #[error("document of {size} bytes exceeds the {limit}-byte limit; send less data")]
    TooLarge {
        /// Size found.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// Arguments must be a JSON object.
    #[error(
        "expected a JSON object of named arguments, found {0}; wrap the arguments in an object"
    )]
    NotAnObject(&'static str),
    /// A value built in memory that `serde_json` cannot write (a map key that is not a
    /// string, number, boolean or unit variant; an integer beyond 64 bits), or whose
    /// `Serialize` impl failed; with their message. Only from [`to_journal_value`].
    #[error(
        "cannot be written as JSON: {0}; give the value a JSON shape (maps with string, \
         integer or boolean keys, integers within 64 bits)"
    )]
    Unserializable(String),
    /// A secret argument that was masked in the journaled model reply, and whose clear
    /// value this process does not hold (the session was resumed after a restart): the
    /// call is not run with the placeholder. Send it again with the value (see
    /// [`secret`](crate::secret#after-a-restart)).
    #[error(
        "this secret argument was masked when the reply was journaled and its value is not \
         held after a restart, so the call did not run; send the call again with the value"
    )]
    SecretUnavailable,
}

impl ArgumentErrorKind {
    /// The same kind without any value it quotes (for an error inside a secret argument).
    pub(crate) fn without_values(self) -> Self {
        const HIDDEN: &str = "(inside a secret argument: not shown)";
        match self {
            ArgumentErrorKind::Syntax(_) => ArgumentErrorKind::Syntax(HIDDEN.into()),
            ArgumentErrorKind::IntegerOutOfRange(_) => {
                ArgumentErrorKind::IntegerOutOfRange(HIDDEN.into())
            }
            ArgumentErrorKind::Unserializable(_) => {
                ArgumentErrorKind::Unserializable(HIDDEN.into())
            }
            other => other,
        }
    }
}

/// Validates raw JSON text of tool arguments and parses it; the top level must be an
/// object. See the [module docs](self) for the rules.
pub fn parse_arguments(raw: &str, limits: &ArgLimits) -> Result<Value, ArgumentError> {
    let value = parse_json(raw, limits)?;
    if value.is_object() {
        Ok(value)
    } else {
        Err(ArgumentError {
            path: "$".into(),
            kind: ArgumentErrorKind::NotAnObject(type_name(&value)),
        })
    }
}

/// Validates raw JSON text holding any JSON value (a model response, a tool result) and
/// parses it. Same rules as [`parse_arguments`], without the object requirement.
pub fn parse_json(raw: &str, limits: &ArgLimits) -> Result<Value, ArgumentError> {
    if raw.len() > limits.max_bytes {
        return Err(ArgumentError {
            path: "$".into(),
            kind: ArgumentErrorKind::TooLarge {
                size: raw.len(),
                limit: limits.max_bytes,
            },
        });
    }
    let syntax = match scanner::scan(raw, limits.depth()) {
        Ok(()) => None,
        Err(Stop::Refused(err)) => return Err(err),
        Err(Stop::Syntax { path, at, what }) => Some((path, at, what)),
    };
    // The text is within depth and free of the ambiguous inputs (or malformed, which
    // serde_json describes in its own words, with line and column).
    match (serde_json::from_str(raw), syntax) {
        (Ok(value), None) => Ok(value),
        (Err(e), syntax) => Err(ArgumentError {
            path: syntax.map_or_else(|| "$".to_owned(), |(path, _, _)| path),
            kind: ArgumentErrorKind::Syntax(e.to_string()),
        }),
        // The scanner is stricter than serde_json here: never let unscanned text through.
        (Ok(_), Some((path, at, what))) => {
            let before = raw.get(..at).unwrap_or(raw);
            let line = before.matches('\n').count() + 1;
            let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1);
            Err(ArgumentError {
                path,
                kind: ArgumentErrorKind::Syntax(format!("{what} at line {line} column {column}")),
            })
        }
    }
}

/// Validates a value built in memory: depth, integer range and size (its compact
/// serialized length). Duplicate keys and NaN cannot exist in a [`Value`]. A value that
/// breaks several rules reports the first depth/integer problem in document order, and
/// the size only when the structure is fine.
pub fn check_value(value: &Value, limits: &ArgLimits) -> Result<(), ArgumentError> {
    let mut size = Count(0);
    walk(value, Some(limits.depth()), true, &mut size)?;
    if size.0 > limits.max_bytes {
        return Err(ArgumentError {
            path: "$".into(),
            kind: ArgumentErrorKind::TooLarge {
                size: size.0,
                limit: limits.max_bytes,
            },
        });
    }
    Ok(())
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Cuts long keys and literals for messages (on a char boundary).
fn shorten(text: &str) -> Cow<'_, str> {
    const KEEP: usize = 64;
    match text.char_indices().nth(KEEP) {
        None => Cow::Borrowed(text),
        Some((cut, _)) => Cow::Owned(format!("{}…", &text[..cut])),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn limits() -> ArgLimits {
        ArgLimits::default()
    }

    fn parse(raw: &str) -> Value {
        parse_json(raw, &limits()).expect("valid JSON must parse")
    }

    fn nested(depth: usize) -> String {
        format!("{}{}", "[".repeat(depth), "]".repeat(depth))
    }

    #[test]
    fn depth_at_the_limit_passes_and_one_more_fails() {
        let tight = ArgLimits {
            max_depth: 5,
            ..limits()
        };
        parse_json(&nested(5), &tight).expect("depth 5 is allowed");
        let err = parse_json(&nested(6), &tight).expect_err("depth 6 is refused");
        assert_eq!(err.path, "$[0][0][0][0][0]");
        assert_eq!(err.kind, ArgumentErrorKind::TooDeep { limit: 5 });
        let err = parse_arguments(
            r#"{"a":{"b":[{"c":[]}]}}"#,
            &ArgLimits {
                max_depth: 4,
                ..limits()
            },
        )
        .expect_err("depth 5");
        assert_eq!(err.path, "$.a.b[0].c");
        parse_json(
            "1",
            &ArgLimits {
                max_depth: 0,
                ..limits()
            },
        )
        .expect("a scalar has depth 0");

        let value = parse(&nested(5));
        check_value(&value, &tight).expect("depth 5 is allowed");
        let err = check_value(&parse(&nested(6)), &tight).expect_err("depth 6 is refused");
        assert_eq!(err.path, "$[0][0][0][0][0]");
        assert_eq!(err.kind, ArgumentErrorKind::TooDeep { limit: 5 });
    }

    #[test]
    fn size_cap() {
        let raw = r#"{"a":"0123456789"}"#;
        let exact = ArgLimits {
            max_bytes: raw.len(),
            ..limits()
        };
        parse_arguments(raw, &exact).expect("at the limit");
        let small = ArgLimits {
            max_bytes: raw.len() - 1,
            ..limits()
        };
        let err = parse_arguments(raw, &small).expect_err("over the limit");
        assert_eq!(err.path, "$");
        assert_eq!(
            err.kind,
            ArgumentErrorKind::TooLarge {
                size: raw.len(),
                limit: raw.len() - 1
            }
        );
        // Size is checked before anything else, even before syntax.
        let err = parse_json(
            "]]]]]]",
            &ArgLimits {
                max_bytes: 3,
                ..limits()
            },
        )
        .expect_err("large");
        assert!(matches!(
            err.kind,
            ArgumentErrorKind::TooLarge { size: 6, limit: 3 }
        ));

        // In memory: the compact serialized length, escapes included.
        let value = json!({"a": "x\ny\u{1}é"});
        let size = serde_json::to_string(&value).expect("serializable").len();
        assert_eq!(size, 20);
        check_value(
            &value,
            &ArgLimits {
                max_bytes: size,
                ..limits()
            },
        )
        .expect("at the limit");
        let err = check_value(
            &value,
            &ArgLimits {
                max_bytes: size - 1,
                ..limits()
            },
        )
        .expect_err("over");
        assert_eq!(
            err.kind,
            ArgumentErrorKind::TooLarge {
                size,
                limit: size - 1
            }
        );
    }

    #[test]
    fn arguments_must_be_an_object_but_json_may_be_anything() {
        for (raw, found) in [
            ("[1]", "an array"),
            ("\"s\"", "a string"),
            ("3", "a number"),
            ("null", "null"),
            ("true", "a boolean"),
        ] {
            let err = parse_arguments(raw, &limits()).expect_err("not an object");
            assert_eq!(
                (err.path.as_str(), err.kind),
                ("$", ArgumentErrorKind::NotAnObject(found))
            );
            parse_json(raw, &limits()).expect("any JSON value");
        }
    }
}
