//! RFC 8785 canonical JSON ("JCS") and the hashes a call's identity is made of: the
//! [`input_hash`] of its arguments and the [`schema_fingerprint`] of its tool's schema.
//!
//! Values reach this module already checked by the [`args`](crate::args) rules
//! (duplicate keys, NaN, lone surrogates and oversized documents never get here);
//! [`canonical_json`] re-checks the two rules a value built in memory could still break,
//! the integer range and the depth cap, so an out-of-range integer can never reach JCS.
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
//! # Example
//!
//! ```
//! use durable_core::args::{parse_arguments, ArgLimits};
//! use durable_core::canonical::{canonical_json, input_hash};
//!
//! let limits = ArgLimits::default();
//! let value = parse_arguments(r#"{"b": 1.0, "a": "\u00e9"}"#, &limits)?;
//! assert_eq!(canonical_json(&value)?, r#"{"a":"é","b":1}"#);
//! assert!(input_hash(&value)?.starts_with("v1:"));
//! # Ok::<(), durable_core::ArgumentError>(())
//! ```

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::args::walk::{Discard, Sink, walk};
use crate::args::{ArgumentError, ArgumentErrorKind, MAX_SUPPORTED_DEPTH};

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

/// The fingerprint fallback hashes the walk's compact text as it is written.
impl Sink for Sha256 {
    fn put(&mut self, bytes: &[u8]) {
        self.update(bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::walk::{Count, dismantle};
    use crate::args::{ArgLimits, check_value, parse_arguments, parse_json};
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

    /// `{"items": … {"items": {}} …}`, `depth` levels, built without recursion.
    fn deep_schema(depth: usize) -> Value {
        let mut schema = json!({});
        for _ in 0..depth {
            let mut outer = serde_json::Map::new();
            outer.insert("items".into(), schema);
            schema = Value::Object(outer);
        }
        schema
    }

    #[test]
    fn deep_schema_fingerprint_falls_back_without_recursion() {
        // Deep enough to overflow a 2 MiB test thread in a debug build if anything on
        // the path (the fingerprint, cloning, serialising or dropping the value)
        // recursed once per level.
        const DEPTH: usize = 20_000;
        let schema = deep_schema(DEPTH);
        let fingerprint = schema_fingerprint(&schema);
        let text = format!("{}{{}}{}", r#"{"items":"#.repeat(DEPTH), "}".repeat(DEPTH));
        assert_eq!(fingerprint, v1_hex(&Sha256::digest(text.as_bytes())));
        let again = deep_schema(DEPTH);
        assert_eq!(fingerprint, schema_fingerprint(&again));
        dismantle(schema);
        dismantle(again);
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
    fn a_full_size_document_is_accepted() {
        let item = r#"{"id":12345,"name":"caf\u00e9 item","tags":["a","b"],"price":12.5},"#;
        let count = (limits().max_bytes - 20) / item.len();
        let raw = format!(r#"{{"items":[{}{{}}]}}"#, item.repeat(count));
        assert!(raw.len() <= limits().max_bytes && raw.len() > limits().max_bytes - 200);
        let value = parse_arguments(&raw, &limits()).expect("within every limit");
        check_value(&value, &limits()).expect("within every limit");
        assert!(input_hash(&value).expect("hashable").starts_with("v1:"));
    }
}
