//! The raw-text scanner: one iterative pass over the bytes of a JSON document, before
//! `serde_json` parses it, that finds what `serde_json` would accept silently or report
//! only in prose (the table in the [module docs](super)) and names the path of the
//! offending value. `serde_json::from_str` builds the value once the scan has passed,
//! and describes malformed text in its own words.
//!
//! # Why not a serde `DeserializeSeed`
//!
//! A seed driven by `serde_json`'s deserializer sees the document through serde's data
//! model, which drops facts the rules need:
//!
//! - **Integer literals beyond 64 bits.** Without `serde_json`'s `arbitrary_precision`
//!   feature, `18446744073709551616` reaches a visitor as `visit_f64`, exactly as
//!   `18446744073709551616.0` does; the first must be refused
//!   ([`IntegerOutOfRange`](ArgumentErrorKind::IntegerOutOfRange)) and the second
//!   accepted (a float literal denotes its double). `arbitrary_precision` would hand the
//!   literal over, but it is a Cargo feature: it unifies across the whole build and
//!   changes how every `serde_json::Number` in the user's program is stored, compared
//!   and printed.
//! - **Typed refusals.** `NaN`, `Infinity`, `1e400` and a lone surrogate escape are
//!   `serde_json` syntax errors ("expected value", "number out of range", "lone leading
//!   surrogate"): no visitor method is called, so
//!   [`NonFinite`](ArgumentErrorKind::NonFinite) and
//!   [`LoneSurrogate`](ArgumentErrorKind::LoneSurrogate) could only be recovered by
//!   matching `serde_json`'s message text.
//! - **Depth without recursion.** The deserializer recurses once per level, and a seed
//!   with it, up to `serde_json`'s own limit of 128. A seed could count levels and refuse
//!   at [`ArgLimits::max_depth`](super::ArgLimits::max_depth), but stack safety would
//!   then rest on that limit and on the caller's stack size; this scan keeps its stack
//!   on the heap and never recurses.
//!
//! Duplicate keys alone could be caught by a seed (map keys arrive decoded), and so could
//! the path; they are not why the scanner exists. The test
//! `serde_json_alone_cannot_tell_these_apart` pins the first two points.

use std::borrow::Cow;
use std::collections::HashSet;

use super::path::{Segment, render_path};
use super::{ArgumentError, ArgumentErrorKind, MAX_SAFE_INTEGER, shorten};

/// Scans `text` and checks the rules, refusing nesting deeper than `max_depth`.
pub(super) fn scan(text: &str, max_depth: usize) -> Result<(), Stop> {
    Scanner {
        text,
        pos: 0,
        max_depth,
        stack: Vec::new(),
    }
    .run()
}

/// Why a scan stopped.
pub(super) enum Stop {
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

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::super::{ArgLimits, check_value, parse_arguments, parse_json};
    use super::*;

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

    #[test]
    fn serde_json_alone_cannot_tell_these_apart() {
        // Why the scanner is not a `DeserializeSeed` (module docs): serde_json hands an
        // integer literal beyond 64 bits over as the double a float literal gives...
        let integer: Value = serde_json::from_str("18446744073709551616").expect("parsed");
        let float: Value = serde_json::from_str("18446744073709551616.0").expect("parsed");
        assert_eq!(integer, float);
        assert!(integer.is_f64());
        // ...though only the float is accepted here.
        assert!(matches!(
            refused("18446744073709551616").kind,
            ArgumentErrorKind::IntegerOutOfRange(_)
        ));
        parse("18446744073709551616.0");
        // And it reports these as untyped syntax errors, which the scanner names.
        for (raw, kind) in [
            ("[NaN]", ArgumentErrorKind::NonFinite),
            ("[1e400]", ArgumentErrorKind::NonFinite),
            (r#"["\ud800"]"#, ArgumentErrorKind::LoneSurrogate),
        ] {
            assert!(serde_json::from_str::<Value>(raw).is_err(), "{raw}");
            assert_eq!(refused(raw).kind, kind, "{raw}");
        }
    }
}
