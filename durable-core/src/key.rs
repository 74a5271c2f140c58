//! Argument validation, RFC 8785 canonical JSON and the input hash.
//!
//! A journaled call is identified by a hash of its arguments, so two argument documents
//! must hash alike exactly when the tool would receive the same value, and a hostile or
//! sloppy model must not be able to make two different calls look like one. JSON text,
//! `serde_json` and the JSON Canonicalization Scheme (RFC 8785, "JCS") disagree on a few
//! inputs, and each disagreement is refused here, *before* anything is hashed or
//! journaled, with an [`ArgumentError`] that names the JSON path of the offending value
//! (`$.items[3].price`, or `$["weird key"]` for keys that are not identifiers):
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
//! [`canonical_json`] and [`input_hash`] re-check the integer rule and the depth cap
//! themselves, so an out-of-range integer can never reach JCS.
//!
//! # Numbers
//!
//! JCS treats every number as an IEEE-754 double, like JavaScript. Consequences, all
//! deliberate:
//!
//! - `1`, `1.0`, `1.00` and `1e0` have the same canonical form (`1`) and hash alike. A
//!   tool taking an `f64` receives the same value for each. (A tool taking an integer
//!   type refuses `1.0` when it deserializes its arguments; the hash does not try to
//!   tell them apart.)
//! - Exactness is guaranteed only for integers, which is why integer literals beyond
//!   ±(2^53−1) are refused rather than rounded: send such ids as strings.
//! - A literal with a fraction or exponent is a *float* and is accepted whatever its
//!   magnitude: `9007199254740993.0` denotes the double `9007199254740992`, exactly as
//!   `9007199254740992.0` does, and the tool receives that same `f64` from either text,
//!   so the two hash alike legitimately. Only the integer-literal form is ambiguous.
//! - `-0` and `0` are the same canonical number (`0`); `1e-400` underflows to `0`.
//!
//! # Depth
//!
//! Depth counts nested arrays/objects: `{}` and `[1]` have depth 1, `{"a":[1]}` depth 2,
//! a bare scalar depth 0. Whatever the limit says, no value deeper than
//! [`MAX_SUPPORTED_DEPTH`] (127, the most `serde_json` will parse) is accepted, parsed,
//! canonicalized or hashed.
//!
//! # Example
//!
//! ```
//! use durable_core::key::{input_hash, parse_arguments, ArgLimits, ArgumentErrorKind};
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
use std::collections::HashSet;
use std::io;

use serde_json::Value;
use sha2::{Digest, Sha256};

mod finite;

pub use finite::to_journal_value;

/// Largest integer magnitude that every JSON reader (and JCS) keeps exact: 2^53 − 1.
pub const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;

/// Hard cap on nesting depth, whatever [`ArgLimits::max_depth`] says: `serde_json`
/// refuses to parse deeper documents, and canonicalization recurses once per level.
pub const MAX_SUPPORTED_DEPTH: usize = 127;

/// Limits applied to tool and model arguments before they are hashed or journaled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

/// The path of a top-level key (`$.name`, or `$["odd key"]`).
pub(crate) fn path_of_key(key: &str) -> String {
    render_path(std::iter::once(Segment::Key(key)))
}

/// Whether `path` is the top-level key `key` or inside it.
pub(crate) fn path_is_inside(path: &str, key: &str) -> bool {
    let prefix = path_of_key(key);
    path.strip_prefix(&prefix)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('.') || rest.starts_with('['))
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
    let mut scanner = Scanner {
        text: raw,
        pos: 0,
        max_depth: limits.depth(),
        stack: Vec::new(),
    };
    let syntax = match scanner.run() {
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

/// RFC 8785 canonical JSON text of a value. Refuses integers outside ±(2^53−1) and
/// values deeper than [`MAX_SUPPORTED_DEPTH`] before canonicalizing.
pub fn canonical_json(value: &Value) -> Result<String, ArgumentError> {
    walk(value, Some(MAX_SUPPORTED_DEPTH), true, &mut Discard)?;
    serde_json_canonicalizer::to_string(value).map_err(|e| ArgumentError {
        path: "$".into(),
        kind: ArgumentErrorKind::Syntax(format!("cannot canonicalize: {e}")),
    })
}

/// `"v1:"` + lowercase hex SHA-256 of the canonical JSON of `value`. The prefix versions
/// the scheme, so a future change of canonical form cannot be mistaken for this one.
pub fn input_hash(value: &Value) -> Result<String, ArgumentError> {
    Ok(v1_hex(&Sha256::digest(canonical_json(value)?.as_bytes())))
}

/// `"v1:"` + hex SHA-256 of a schema's canonical JSON. Never fails: a schema that cannot
/// be canonicalized (an integer beyond 2^53, absurd depth) is hashed in the compact
/// `serde_json::to_string` form instead, produced without recursion.
pub fn schema_fingerprint(schema: &Value) -> String {
    match canonical_json(schema) {
        Ok(text) => v1_hex(&Sha256::digest(text.as_bytes())),
        Err(_) => {
            let mut hasher = Sha256::new();
            // Without depth or integer rules, and with a sink that cannot fail, the walk
            // cannot fail either.
            let _ = walk(schema, None, false, &mut hasher);
            v1_hex(&hasher.finalize())
        }
    }
}

fn v1_hex(digest: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(3 + 2 * digest.len());
    out.push_str("v1:");
    for byte in digest {
        out.push(char::from(HEX[usize::from(byte >> 4)]));
        out.push(char::from(HEX[usize::from(byte & 0xf)]));
    }
    out
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

enum Segment<'a> {
    Index(usize),
    Key(&'a str),
}

fn render_path<'a>(segments: impl Iterator<Item = Segment<'a>>) -> String {
    let mut path = String::from("$");
    for segment in segments {
        match segment {
            Segment::Index(i) => {
                path.push('[');
                path.push_str(&i.to_string());
                path.push(']');
            }
            Segment::Key(key) => {
                let mut chars = key.chars();
                let ident = chars
                    .next()
                    .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                    && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
                if ident {
                    path.push('.');
                    path.push_str(key);
                } else {
                    let key = shorten(key);
                    path.push('[');
                    match serde_json::to_string(key.as_ref()) {
                        Ok(quoted) => path.push_str(&quoted),
                        Err(_) => path.push_str(&format!("{key:?}")),
                    }
                    path.push(']');
                }
            }
        }
    }
    path
}

// ---------------------------------------------------------------------------------------
// Raw-text scanner: one iterative pass over the bytes, before serde_json sees them.

enum Stop {
    /// A typed refusal.
    Refused(ArgumentError),
    /// Not JSON: serde_json is asked for its own description of the problem.
    Syntax {
        path: String,
        at: usize,
        what: &'static str,
    },
}

enum Open<'a> {
    Array {
        index: usize,
    },
    Object {
        keys: HashSet<Cow<'a, str>>,
        current: Option<Cow<'a, str>>,
    },
}

struct Scanner<'a> {
    text: &'a str,
    pos: usize,
    max_depth: usize,
    stack: Vec<Open<'a>>,
}

impl<'a> Scanner<'a> {
    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.pos).copied()
    }

    fn skip_ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.pos += 1;
        }
    }

    fn path(&self) -> String {
        render_path(self.stack.iter().filter_map(|open| match open {
            Open::Array { index } => Some(Segment::Index(*index)),
            Open::Object { current, .. } => current.as_deref().map(Segment::Key),
        }))
    }

    fn refuse(&self, kind: ArgumentErrorKind) -> Stop {
        Stop::Refused(ArgumentError {
            path: self.path(),
            kind,
        })
    }

    fn syntax(&self, at: usize, what: &'static str) -> Stop {
        Stop::Syntax {
            path: self.path(),
            at,
            what,
        }
    }

    fn open(&mut self, open: Open<'a>) -> Result<(), Stop> {
        if self.stack.len() >= self.max_depth {
            return Err(self.refuse(ArgumentErrorKind::TooDeep {
                limit: self.max_depth,
            }));
        }
        self.stack.push(open);
        self.pos += 1;
        self.skip_ws();
        Ok(())
    }

    fn run(&mut self) -> Result<(), Stop> {
        'value: loop {
            self.skip_ws();
            match self.peek() {
                Some(b'[') => {
                    self.open(Open::Array { index: 0 })?;
                    if self.peek() == Some(b']') {
                        self.pos += 1;
                        self.stack.pop();
                    } else {
                        continue 'value;
                    }
                }
                Some(b'{') => {
                    self.open(Open::Object {
                        keys: HashSet::new(),
                        current: None,
                    })?;
                    if self.peek() == Some(b'}') {
                        self.pos += 1;
                        self.stack.pop();
                    } else {
                        self.member_key()?;
                        continue 'value;
                    }
                }
                Some(b'"') => {
                    self.string(false)?;
                }
                Some(b'-' | b'0'..=b'9') => self.number()?,
                Some(b't') => self.literal("true")?,
                Some(b'f') => self.literal("false")?,
                Some(b'n') => self.literal("null")?,
                Some(b'N' | b'I' | b'+') => return Err(self.not_a_number()),
                _ => return Err(self.syntax(self.pos, "expected a value")),
            }
            // A value ended: close finished containers, or move to the next element.
            loop {
                self.skip_ws();
                let next = self.peek();
                match self.stack.last_mut() {
                    None if next.is_none() => return Ok(()),
                    None => return Err(self.syntax(self.pos, "trailing characters")),
                    Some(Open::Array { index }) => match next {
                        Some(b',') => {
                            *index += 1;
                            self.pos += 1;
                            continue 'value;
                        }
                        Some(b']') => {
                            self.pos += 1;
                            self.stack.pop();
                        }
                        _ => return Err(self.syntax(self.pos, "expected `,` or `]`")),
                    },
                    Some(Open::Object { .. }) => match next {
                        Some(b',') => {
                            self.pos += 1;
                            self.skip_ws();
                            self.member_key()?;
                            continue 'value;
                        }
                        Some(b'}') => {
                            self.pos += 1;
                            self.stack.pop();
                        }
                        _ => return Err(self.syntax(self.pos, "expected `,` or `}`")),
                    },
                }
            }
        }
    }

    /// Reads `"key" :` inside the innermost object and records the key.
    fn member_key(&mut self) -> Result<(), Stop> {
        if let Some(Open::Object { current, .. }) = self.stack.last_mut() {
            *current = None;
        }
        if self.peek() != Some(b'"') {
            return Err(self.syntax(self.pos, "expected a string key"));
        }
        let key = self.string(true)?.unwrap_or_default();
        let Some(Open::Object { keys, current }) = self.stack.last_mut() else {
            return Err(self.syntax(self.pos, "key outside an object"));
        };
        *current = Some(key.clone());
        if !keys.insert(key) {
            let shown = current.as_deref().map(shorten).unwrap_or_default();
            let kind = ArgumentErrorKind::DuplicateKey(shown.into_owned());
            return Err(self.refuse(kind));
        }
        self.skip_ws();
        if self.peek() != Some(b':') {
            return Err(self.syntax(self.pos, "expected `:`"));
        }
        self.pos += 1;
        Ok(())
    }

    fn hex4(&self, at: usize) -> Option<u16> {
        let digits = self.text.as_bytes().get(at..at + 4)?;
        let digits = std::str::from_utf8(digits).ok()?;
        if !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        u16::from_str_radix(digits, 16).ok()
    }

    /// Reads a string starting at the opening quote; decodes it only when `decode`.
    fn string(&mut self, decode: bool) -> Result<Option<Cow<'a, str>>, Stop> {
        let text = self.text;
        let bytes = text.as_bytes();
        let start = self.pos + 1;
        let mut i = start;
        let mut owned: Option<String> = None;
        loop {
            match bytes.get(i) {
                None => return Err(self.syntax(i, "unterminated string")),
                Some(b'"') => {
                    self.pos = i + 1;
                    if !decode {
                        return Ok(None);
                    }
                    return Ok(Some(match owned {
                        None => Cow::Borrowed(&text[start..i]),
                        Some(s) => Cow::Owned(s),
                    }));
                }
                Some(b'\\') => {
                    let (ch, len) = self.escape(i)?;
                    if decode {
                        let s = owned.get_or_insert_with(|| text[start..i].to_owned());
                        s.push(ch);
                    }
                    i += len;
                }
                Some(0..=0x1f) => return Err(self.syntax(i, "control character in string")),
                Some(_) => {
                    // Copy the run of plain bytes up to the next quote or backslash.
                    let run = bytes[i..]
                        .iter()
                        .position(|&b| b == b'"' || b == b'\\' || b < 0x20)
                        .map_or(bytes.len(), |n| i + n);
                    if let Some(s) = owned.as_mut() {
                        s.push_str(&text[i..run]);
                    }
                    i = run;
                }
            }
        }
    }

    /// Decodes the escape at `at` (a backslash): the char and the escape's length.
    fn escape(&self, at: usize) -> Result<(char, usize), Stop> {
        let simple = match self.text.as_bytes().get(at + 1) {
            Some(b'"') => '"',
            Some(b'\\') => '\\',
            Some(b'/') => '/',
            Some(b'b') => '\u{8}',
            Some(b'f') => '\u{c}',
            Some(b'n') => '\n',
            Some(b'r') => '\r',
            Some(b't') => '\t',
            Some(b'u') => {
                let Some(unit) = self.hex4(at + 2) else {
                    return Err(self.syntax(at, "invalid `\\u` escape"));
                };
                return match unit {
                    0xD800..=0xDBFF => {
                        let after = at + 6;
                        if self.text.as_bytes().get(after..after + 2) != Some(b"\\u") {
                            return Err(self.refuse(ArgumentErrorKind::LoneSurrogate));
                        }
                        let Some(low) = self.hex4(after + 2) else {
                            return Err(self.syntax(after, "invalid `\\u` escape"));
                        };
                        if !(0xDC00..=0xDFFF).contains(&low) {
                            return Err(self.refuse(ArgumentErrorKind::LoneSurrogate));
                        }
                        let code = 0x10000
                            + ((u32::from(unit) - 0xD800) << 10)
                            + (u32::from(low) - 0xDC00);
                        char::from_u32(code)
                            .map(|c| (c, 12))
                            .ok_or_else(|| self.refuse(ArgumentErrorKind::LoneSurrogate))
                    }
                    0xDC00..=0xDFFF => Err(self.refuse(ArgumentErrorKind::LoneSurrogate)),
                    _ => char::from_u32(u32::from(unit))
                        .map(|c| (c, 6))
                        .ok_or_else(|| self.refuse(ArgumentErrorKind::LoneSurrogate)),
                };
            }
            _ => return Err(self.syntax(at, "invalid escape")),
        };
        Ok((simple, 2))
    }

    fn number(&mut self) -> Result<(), Stop> {
        let bytes = self.text.as_bytes();
        let start = self.pos;
        let mut i = start;
        if bytes.get(i) == Some(&b'-') {
            i += 1;
            if matches!(bytes.get(i), Some(b'N' | b'I')) {
                return Err(self.not_a_number());
            }
        }
        let digits_start = i;
        let skip_digits = |mut i: usize| {
            while bytes.get(i).is_some_and(u8::is_ascii_digit) {
                i += 1;
            }
            i
        };
        match bytes.get(i) {
            Some(b'0') => i += 1,
            Some(b'1'..=b'9') => i = skip_digits(i),
            _ => return Err(self.syntax(i, "invalid number")),
        }
        let digits_end = i;
        let mut integer = true;
        if bytes.get(i) == Some(&b'.') {
            integer = false;
            if !bytes.get(i + 1).is_some_and(u8::is_ascii_digit) {
                return Err(self.syntax(i + 1, "invalid number"));
            }
            i = skip_digits(i + 1);
        }
        if matches!(bytes.get(i), Some(b'e' | b'E')) {
            integer = false;
            i += 1;
            if matches!(bytes.get(i), Some(b'+' | b'-')) {
                i += 1;
            }
            if !bytes.get(i).is_some_and(u8::is_ascii_digit) {
                return Err(self.syntax(i, "invalid number"));
            }
            i = skip_digits(i);
        }
        let literal = &self.text[start..i];
        if integer {
            let digits = &self.text[digits_start..digits_end];
            // 2^53 − 1 has 16 digits; longer literals (no leading zeros) are out of range.
            let exact = digits.len() <= 16
                && digits
                    .parse::<u64>()
                    .is_ok_and(|magnitude| magnitude <= MAX_SAFE_INTEGER);
            if !exact {
                let shown = shorten(literal).into_owned();
                return Err(self.refuse(ArgumentErrorKind::IntegerOutOfRange(shown)));
            }
        } else if !literal.parse::<f64>().is_ok_and(f64::is_finite) {
            return Err(self.refuse(ArgumentErrorKind::NonFinite));
        }
        self.pos = i;
        Ok(())
    }

    /// At `NaN`, `Infinity` and their signed forms: say so precisely.
    fn not_a_number(&self) -> Stop {
        let rest = &self.text[self.pos..];
        let words = ["NaN", "Infinity", "-Infinity", "+Infinity", "-NaN", "+NaN"];
        if words.iter().any(|word| rest.starts_with(word)) {
            self.refuse(ArgumentErrorKind::NonFinite)
        } else {
            self.syntax(self.pos, "expected a value")
        }
    }

    fn literal(&mut self, word: &'static str) -> Result<(), Stop> {
        if self.text[self.pos..].starts_with(word) {
            self.pos += word.len();
            Ok(())
        } else {
            Err(self.syntax(self.pos, "expected a value"))
        }
    }
}

// ---------------------------------------------------------------------------------------
// In-memory values: an iterative walk that checks the rules and writes the compact JSON
// text `serde_json::to_string` would produce into a sink (to count or hash it).

trait Sink {
    /// Whether the sink wants the text at all (checking alone does not).
    const WANTS_TEXT: bool = true;
    fn put(&mut self, bytes: &[u8]);
}

struct Count(usize);

impl Sink for Count {
    fn put(&mut self, bytes: &[u8]) {
        self.0 += bytes.len();
    }
}

struct Discard;

impl Sink for Discard {
    const WANTS_TEXT: bool = false;
    fn put(&mut self, _: &[u8]) {}
}

impl Sink for Sha256 {
    fn put(&mut self, bytes: &[u8]) {
        self.update(bytes);
    }
}

struct SinkWriter<'s, S>(&'s mut S);

impl<S: Sink> io::Write for SinkWriter<'_, S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.put(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

enum Frame<'v> {
    Array {
        items: std::slice::Iter<'v, Value>,
        index: Option<usize>,
    },
    Object {
        members: serde_json::map::Iter<'v>,
        key: Option<&'v str>,
    },
}

fn frame_path(stack: &[Frame<'_>]) -> String {
    render_path(stack.iter().filter_map(|frame| match frame {
        Frame::Array { index, .. } => index.map(Segment::Index),
        Frame::Object { key, .. } => key.map(Segment::Key),
    }))
}

fn leaf<S: Sink, T: serde::Serialize + ?Sized>(
    sink: &mut S,
    leaf: &T,
    stack: &[Frame<'_>],
) -> Result<(), ArgumentError> {
    if !S::WANTS_TEXT {
        return Ok(());
    }
    serde_json::to_writer(SinkWriter(sink), leaf).map_err(|e| ArgumentError {
        path: frame_path(stack),
        kind: ArgumentErrorKind::Syntax(e.to_string()),
    })
}

fn walk<S: Sink>(
    root: &Value,
    max_depth: Option<usize>,
    check_integers: bool,
    sink: &mut S,
) -> Result<(), ArgumentError> {
    let mut stack: Vec<Frame<'_>> = Vec::new();
    let mut next = root;
    loop {
        if matches!(next, Value::Array(_) | Value::Object(_))
            && let Some(limit) = max_depth
            && stack.len() >= limit
        {
            return Err(ArgumentError {
                path: frame_path(&stack),
                kind: ArgumentErrorKind::TooDeep { limit },
            });
        }
        match next {
            Value::Array(items) => {
                sink.put(b"[");
                stack.push(Frame::Array {
                    items: items.iter(),
                    index: None,
                });
            }
            Value::Object(members) => {
                sink.put(b"{");
                stack.push(Frame::Object {
                    members: members.iter(),
                    key: None,
                });
            }
            Value::Number(n) => {
                let exact = n
                    .as_u64()
                    .map(|u| u <= MAX_SAFE_INTEGER)
                    .or_else(|| n.as_i64().map(|i| i.unsigned_abs() <= MAX_SAFE_INTEGER))
                    .unwrap_or(true); // a float
                if check_integers && !exact {
                    return Err(ArgumentError {
                        path: frame_path(&stack),
                        kind: ArgumentErrorKind::IntegerOutOfRange(n.to_string()),
                    });
                }
                leaf(sink, n, &stack)?;
            }
            scalar => leaf(sink, scalar, &stack)?,
        }
        // Find the next value to visit, closing finished containers.
        loop {
            let Some(top) = stack.last_mut() else {
                return Ok(());
            };
            match top {
                Frame::Array { items, index } => match items.next() {
                    Some(item) => {
                        if index.is_some() {
                            sink.put(b",");
                        }
                        *index = Some(index.map_or(0, |i| i + 1));
                        next = item;
                        break;
                    }
                    None => {
                        sink.put(b"]");
                        stack.pop();
                    }
                },
                Frame::Object { members, key } => match members.next() {
                    Some((name, value)) => {
                        if key.is_some() {
                            sink.put(b",");
                        }
                        *key = Some(name);
                        next = value;
                        // The key is written with the frame pointing at it.
                        leaf(sink, name.as_str(), &stack)?;
                        sink.put(b":");
                        break;
                    }
                    None => {
                        sink.put(b"}");
                        stack.pop();
                    }
                },
            }
        }
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

    fn refused(raw: &str) -> ArgumentError {
        match parse_json(raw, &limits()) {
            Ok(value) => panic!("{raw:?} must be refused, parsed as {value}"),
            Err(err) => err,
        }
    }

    fn canonical(raw: &str) -> String {
        canonical_json(&parse(raw)).expect("canonicalizable")
    }

    fn hash(raw: &str) -> String {
        input_hash(&parse(raw)).expect("hashable")
    }

    fn nested(depth: usize) -> String {
        format!("{}{}", "[".repeat(depth), "]".repeat(depth))
    }

    #[test]
    fn key_order_whitespace_and_escapes_do_not_change_the_hash() {
        let a = hash(r#"{"b":[1,2,{"y":true,"x":null}],"a":"text"}"#);
        let b =
            hash("{\n  \"a\" : \"t\\u0065xt\",\r\n\t\"b\": [ 1 , 2, {\"x\":null, \"y\":true} ]\n}");
        assert_eq!(a, b);
        assert_ne!(a, hash(r#"{"b":[2,1,{"y":true,"x":null}],"a":"text"}"#));
        assert_eq!(a.len(), 3 + 64);
        assert!(a.starts_with("v1:"));
        assert!(
            a[3..]
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        );
    }

    #[test]
    fn empty_object_hash_is_pinned() {
        // `printf '{}' | sha256sum`
        let pinned = "v1:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a";
        assert_eq!(hash("{}"), pinned);
        assert_eq!(hash(" { } "), pinned);
        assert_eq!(input_hash(&json!({})).expect("hashable"), pinned);
        assert_eq!(schema_fingerprint(&json!({})), pinned);
    }

    #[test]
    fn integral_floats_and_integers_share_a_canonical_form() {
        // JCS numbers are IEEE doubles: 1, 1.0, 1.00 and 1e0 are the same number.
        for text in ["1", "1.0", "1.00", "1e0", "10e-1"] {
            assert_eq!(canonical(text), "1", "{text}");
        }
        assert_eq!(hash(r#"{"n":1}"#), hash(r#"{"n":1.0}"#));
        assert_eq!(canonical("-0"), "0");
        assert_eq!(canonical("-0.0"), "0");
        assert_eq!(canonical("1e-400"), "0");
    }

    #[test]
    fn numbers_follow_the_rfc_8785_table() {
        // RFC 8785 appendix B: IEEE-754 bit patterns and their canonical text.
        let table: [(u64, &str); 21] = [
            (0x0000_0000_0000_0000, "0"),
            (0x8000_0000_0000_0000, "0"),
            (0x0000_0000_0000_0001, "5e-324"),
            (0x8000_0000_0000_0001, "-5e-324"),
            (0x7fef_ffff_ffff_ffff, "1.7976931348623157e+308"),
            (0xffef_ffff_ffff_ffff, "-1.7976931348623157e+308"),
            (0x4340_0000_0000_0000, "9007199254740992"),
            (0xc340_0000_0000_0000, "-9007199254740992"),
            (0x4430_0000_0000_0000, "295147905179352830000"),
            (0x44b5_2d02_c7e1_4af5, "9.999999999999997e+22"),
            (0x44b5_2d02_c7e1_4af6, "1e+23"),
            (0x44b5_2d02_c7e1_4af7, "1.0000000000000001e+23"),
            (0x444b_1ae4_d6e2_ef4e, "999999999999999700000"),
            (0x444b_1ae4_d6e2_ef4f, "999999999999999900000"),
            (0x444b_1ae4_d6e2_ef50, "1e+21"),
            (0x3eb0_c6f7_a0b5_ed8c, "9.999999999999997e-7"),
            (0x3eb0_c6f7_a0b5_ed8d, "0.000001"),
            (0x41b3_de43_5555_5553, "333333333.3333332"),
            (0x41b3_de43_5555_5554, "333333333.33333325"),
            (0xbecb_f647_612f_3696, "-0.0000033333333333333333"),
            (0x4314_3ff3_c1cb_0959, "1424953923781206.2"),
        ];
        for (bits, expected) in table {
            let value = json!(f64::from_bits(bits));
            assert_eq!(
                canonical_json(&value).expect("finite"),
                expected,
                "{bits:#x}"
            );
        }
        // From text: exponent from 1e21 up and below 1e-6, plain decimals in between.
        assert_eq!(canonical("1e21"), "1e+21");
        assert_eq!(canonical("1e20"), "100000000000000000000");
        assert_eq!(canonical("0.000001"), "0.000001");
        assert_eq!(canonical("0.0000001"), "1e-7");
        assert_eq!(canonical("1E30"), "1e+30");
    }

    #[test]
    fn rfc_8785_sample_document() {
        // RFC 8785 section 3.2.2 input and output.
        let input = r#"{
          "numbers": [333333333.33333329, 1E30, 4.50,
                      2e-3, 0.000000000000000000000000001],
          "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
          "literals": [null, true, false]
        }"#;
        let expected = concat!(
            r#"{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"#,
            r#""string":"€$\u000f\nA'B\"\\\\\"/"}"#
        );
        let value = parse_arguments(input, &limits()).expect("valid");
        assert_eq!(canonical_json(&value).expect("canonical"), expected);
    }

    #[test]
    fn keys_sort_by_utf16_code_units() {
        // RFC 8785 section 3.2.3: U+1F600 (a surrogate pair) sorts before U+FB33.
        let input = r#"{"\u20ac":"Euro","\r":"CR","\ufb33":"Hebrew","1":"One",
                        "\ud83d\ude00":"Smiley","\u0080":"Control","\u00f6":"Latin"}"#;
        let expected = "{\"\\r\":\"CR\",\"1\":\"One\",\"\u{80}\":\"Control\",\"ö\":\"Latin\",\
                        \"€\":\"Euro\",\"😀\":\"Smiley\",\"\u{fb33}\":\"Hebrew\"}";
        // (No Unicode normalization either: U+FB33 stays U+FB33.)
        assert_eq!(canonical(input), expected);
    }

    #[test]
    fn unicode_stays_utf8_and_controls_are_escaped() {
        assert_eq!(
            canonical(r#"{"s":"caf\u00e9 é 日本 😀 \u0007\u001f\u2028 \t"}"#),
            "{\"s\":\"café é 日本 😀 \\u0007\\u001f\u{2028} \\t\"}"
        );
        assert_eq!(hash(r#"["\u00e9"]"#), hash(r#"["é"]"#));
    }

    #[test]
    fn big_integers_are_refused_so_they_never_collide() {
        // JCS would write both as 9007199254740992.
        for text in ["9007199254740993", "9007199254740992", "-9007199254740992"] {
            let err = refused(&format!(r#"{{"id":{text}}}"#));
            assert_eq!(err.path, "$.id");
            assert_eq!(err.kind, ArgumentErrorKind::IntegerOutOfRange(text.into()));
        }
        let long = "1".repeat(400);
        assert!(
            matches!(refused(&long).kind, ArgumentErrorKind::IntegerOutOfRange(s) if s.ends_with('…'))
        );
        assert!(matches!(
            refused("18446744073709551616").kind,
            ArgumentErrorKind::IntegerOutOfRange(_)
        ));
        assert_eq!(canonical("9007199254740991"), "9007199254740991");
        assert_eq!(canonical("-9007199254740991"), "-9007199254740991");
        // In memory too: check_value, canonical_json and input_hash refuse them.
        for value in [
            json!({"id": 1_u64 << 53}),
            json!({"id": i64::MIN}),
            json!({"id": u64::MAX}),
        ] {
            let expected = ArgumentErrorKind::IntegerOutOfRange(value["id"].to_string());
            for err in [
                check_value(&value, &limits()).expect_err("refused"),
                canonical_json(&value).expect_err("refused"),
                input_hash(&value).expect_err("refused"),
            ] {
                assert_eq!((err.path.as_str(), &err.kind), ("$.id", &expected));
            }
        }
    }

    #[test]
    fn float_literals_beyond_2_pow_53_denote_doubles() {
        // A float literal is an IEEE double: both texts are the double 2^53, which is
        // what the tool receives from either, so they hash alike on purpose.
        assert_eq!(canonical("9007199254740993.0"), "9007199254740992");
        assert_eq!(hash("[9007199254740993.0]"), hash("[9007199254740992.0]"));
        assert_eq!(canonical("1.0e20"), "100000000000000000000");
    }

    #[test]
    fn duplicate_keys_are_refused_after_decoding() {
        let err = refused(r#"{"a":1,"a":2}"#);
        assert_eq!(err.path, "$.a");
        assert_eq!(err.kind, ArgumentErrorKind::DuplicateKey("a".into()));
        let err = refused(r#"{"a":1,"\u0061":2}"#);
        assert_eq!(err.kind, ArgumentErrorKind::DuplicateKey("a".into()));
        let err = refused(r#"{"x":[{"k\/":1},{"k/":1,"k\u002f":2}]}"#);
        assert_eq!(err.path, r#"$.x[1]["k/"]"#);
        assert_eq!(err.kind, ArgumentErrorKind::DuplicateKey("k/".into()));
        let err = refused(r#"{"😀":1,"\ud83d\ude00":2}"#);
        assert_eq!(err.kind, ArgumentErrorKind::DuplicateKey("😀".into()));
        // The same key in different objects is fine; so are keys differing in escapes only
        // by what they decode to.
        parse(r#"{"a":{"a":1},"b":{"a":{"a":2}},"c":[{"a":1},{"a":1}]}"#);
        parse(r#"{"a":1,"A":2,"\u0061\u0061":3}"#);
    }

    #[test]
    fn nan_and_infinity_are_named_precisely() {
        for text in ["NaN", "Infinity", "-Infinity", "+Infinity", "-NaN"] {
            let err = refused(&format!(r#"{{"p":[0,{text}]}}"#));
            assert_eq!(
                (err.path.as_str(), err.kind),
                ("$.p[1]", ArgumentErrorKind::NonFinite),
                "{text}"
            );
        }
        for text in ["1e400", "-1e400", "1.8e308"] {
            assert_eq!(refused(text).kind, ArgumentErrorKind::NonFinite, "{text}");
        }
        assert!(matches!(refused("Nope").kind, ArgumentErrorKind::Syntax(_)));
        assert!(matches!(refused("nan").kind, ArgumentErrorKind::Syntax(_)));
    }

    #[test]
    fn lone_surrogates_are_refused() {
        for text in [
            r#""\ud800""#,
            r#""\udc00x""#,
            r#""a\uDBFF\u0041""#,
            r#""\udc00\ud800""#,
            r#""\ud800\""#,
        ] {
            assert_eq!(
                refused(text).kind,
                ArgumentErrorKind::LoneSurrogate,
                "{text}"
            );
        }
        let err = refused(r#"{"ok":{"\udfff":1}}"#);
        assert_eq!(
            (err.path.as_str(), err.kind),
            ("$.ok", ArgumentErrorKind::LoneSurrogate)
        );
        let err = refused(r#"{"s":["x","\ud800"]}"#);
        assert_eq!(err.path, "$.s[1]");
        assert_eq!(parse(r#""\ud83d\ude00""#), json!("😀"));
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
    fn depth_is_capped_at_what_serde_json_parses() {
        let generous = ArgLimits {
            max_depth: 10_000,
            ..limits()
        };
        let deepest = parse_json(&nested(MAX_SUPPORTED_DEPTH), &generous).expect("127 levels");
        canonical_json(&deepest).expect("127 levels canonicalize");
        let err = parse_json(&nested(MAX_SUPPORTED_DEPTH + 1), &generous).expect_err("128 levels");
        assert_eq!(
            err.kind,
            ArgumentErrorKind::TooDeep {
                limit: MAX_SUPPORTED_DEPTH
            }
        );
        // One level deeper, built in memory.
        let deeper = json!([deepest]);
        let err = canonical_json(&deeper).expect_err("too deep to canonicalize");
        assert_eq!(
            err.kind,
            ArgumentErrorKind::TooDeep {
                limit: MAX_SUPPORTED_DEPTH
            }
        );
        assert!(check_value(&deeper, &generous).is_err());
    }

    #[test]
    fn very_deep_text_is_refused_without_recursion() {
        // Runs on the default test thread: a recursive check would overflow its stack.
        let raw = "[".repeat(200_000);
        let err = parse_json(&raw, &limits()).expect_err("too deep");
        assert_eq!(err.kind, ArgumentErrorKind::TooDeep { limit: 64 });
        let raw = format!("{{\"a\":{}", "{\"a\":".repeat(200_000));
        let err = parse_arguments(&raw, &limits()).expect_err("too deep");
        assert_eq!(err.kind, ArgumentErrorKind::TooDeep { limit: 64 });
        assert!(err.path.starts_with("$.a.a.a"));
    }

    #[test]
    fn deep_schema_fingerprint_falls_back_without_recursion() {
        let mut schema = json!({});
        for _ in 0..1_000 {
            schema = json!({ "items": schema });
        }
        let fingerprint = schema_fingerprint(&schema);
        assert!(fingerprint.starts_with("v1:"));
        assert_eq!(fingerprint, schema_fingerprint(&schema.clone()));
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
    fn the_iterative_writer_matches_serde_json() {
        let value = parse(
            r#"{"z":[1,-2,3.5,1e300,-0.0,true,null,"q\"\\\u0000é😀"],"a":{},"m":[[],{"k":[{}]}],
                "weird key":{"\n":0.1}}"#,
        );
        let mut size = Count(0);
        walk(&value, None, true, &mut size).expect("valid");
        assert_eq!(
            size.0,
            serde_json::to_string(&value).expect("serializable").len()
        );
        // The fallback fingerprint hashes exactly `serde_json::to_string`.
        let big = json!({"maximum": u64::MAX, "items": value});
        let text = serde_json::to_string(&big).expect("serializable");
        assert_eq!(
            schema_fingerprint(&big),
            v1_hex(&Sha256::digest(text.as_bytes()))
        );
        // The normal fingerprint hashes the canonical form.
        let canonical = canonical_json(&value).expect("canonical");
        assert_eq!(
            schema_fingerprint(&value),
            v1_hex(&Sha256::digest(canonical.as_bytes()))
        );
        assert_eq!(
            schema_fingerprint(&value),
            input_hash(&value).expect("hashable")
        );
    }

    #[test]
    fn paths_name_nested_values_and_quote_odd_keys() {
        let err = refused(r#"{"a":{"b":[0,1,9007199254740993]}}"#);
        assert_eq!(err.path, "$.a.b[2]");
        let err = refused(r#"{"weird key":[{"1st":{"é":{"a\"b":{"_ok9":NaN}}}}]}"#);
        assert_eq!(err.path, r#"$["weird key"][0]["1st"]["é"]["a\"b"]._ok9"#);
        let err = refused(r#"{"":{"line\nbreak":Infinity}}"#);
        assert_eq!(err.path, r#"$[""]["line\nbreak"]"#);
        assert_eq!(
            err.to_string(),
            format!(
                "at `$[\"\"][\"line\\nbreak\"]`: {}",
                ArgumentErrorKind::NonFinite
            )
        );
        let value = json!({"list": [0, {"big key": [u64::MAX]}]});
        let err = check_value(&value, &limits()).expect_err("too big");
        assert_eq!(err.path, r#"$.list[1]["big key"][0]"#);
    }

    #[test]
    fn malformed_text_reports_serde_json_syntax_errors() {
        for (raw, path) in [
            (r#"{"a":}"#, "$.a"),
            (r#"{"a":1,}"#, "$"),
            ("[1 2]", "$[0]"),
            ("", "$"),
            ("{} x", "$"),
            (r#"{"a":"unterminated"#, "$.a"),
            (r#"["tab	in string"]"#, "$[0]"),
            (r#"["\x"]"#, "$[0]"),
            ("[01]", "$[0]"),
            ("[1.]", "$[0]"),
            ("[.5]", "$[0]"),
            ("[tru]", "$[0]"),
            ("{a:1}", "$"),
        ] {
            let err = refused(raw);
            let ArgumentErrorKind::Syntax(message) = &err.kind else {
                panic!("{raw:?}: expected a syntax error, got {err}");
            };
            assert!(message.contains("line 1 column"), "{raw:?}: {message}");
            assert_eq!(err.path, path, "{raw:?}");
        }
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

    #[test]
    fn a_full_size_document_is_accepted() {
        let item = r#"{"id":12345,"name":"caf\u00e9 item","tags":["a","b"],"price":12.5},"#;
        let count = (limits().max_bytes - 20) / item.len();
        let raw = format!(r#"{{"items":[{}{{}}]}}"#, item.repeat(count));
        assert!(raw.len() <= limits().max_bytes && raw.len() > limits().max_bytes - 200);
        let value = parse_arguments(&raw, &limits()).expect("within every limit");
        check_value(&value, &limits()).expect("within every limit");
        assert!(input_hash(&value).expect("hashable").starts_with("v1:"));
    }

    #[test]
    fn accepted_text_parses_exactly_as_serde_json_does() {
        for raw in [
            r#"{"a":[1,-2,3.25e-2,0,-0,1E+2,true,false,null,"",{}],"b":{"c":"\"\\\/\b\f\n\r\t\u00e9"}}"#,
            " \t\r\n[ ] ",
            r#"{"k":"plain then \u0041 escape then plain","k2":"😀 raw"}"#,
            "-9007199254740991",
            "\"\"",
        ] {
            let expected: Value = serde_json::from_str(raw).expect("valid JSON");
            assert_eq!(parse(raw), expected, "{raw}");
        }
    }
}
