//! Whether a recorded call's arguments still fit today's tool.
//!
//! serde decides. A recorded call fits when its arguments decode into today's argument
//! type ([`Tool::check_args`]), because that decode is exactly what a resumed session
//! does with them. The JSON schema cannot decide on its own: schemars leaves
//! `#[serde(alias)]` out of it, so a renamed field that still reads its old name looks
//! like a missing one. [`schema_shape`] (a shallow reading of the schema) therefore
//! decides only where there is no decode to run:
//!
//! - for a tool that does not decode (a hand-written [`Tool`] that keeps the default
//!   `check_args`, which accepts everything);
//! - for a masked secret argument (`{"$secret": "<hash>"}`) that no placeholder value
//!   stands in for (see [`decode`]).
//!
//! Elsewhere, the schema shape check disagreeing with serde is a note, not a failure.

use serde_json::{Map, Value};

use super::{FailureKind, schema_shape};
use crate::error::DurableError;
use crate::toolbox::Tool;

/// The argument verdict on one recorded call.
#[derive(Debug)]
pub(super) enum Verdict {
    /// The arguments fit (and the schema shape check agrees).
    Fits,
    /// The arguments fit, with something worth knowing: serde reads what the schema
    /// shape check rejects (an alias, a default), or a masked secret could not be
    /// decoded and the schema decided.
    FitsWithNote(String),
    /// The arguments do not fit.
    Rejected(FailureKind),
}

pub(super) fn check(tool: &dyn Tool, args: &Value) -> Verdict {
    let spec = tool.spec();
    let shape = schema_shape::check(&spec.input_schema, args);
    let by_schema = |shape: Result<(), String>, note: Option<String>| match (shape, note) {
        (Err(detail), _) => Verdict::Rejected(FailureKind::ArgumentsRejected(detail)),
        (Ok(()), Some(note)) => Verdict::FitsWithNote(note),
        (Ok(()), None) => Verdict::Fits,
    };
    if !decodes(tool) {
        return by_schema(shape, None);
    }
    match decode(tool, args) {
        Decoded::Yes => match shape {
            Ok(()) => Verdict::Fits,
            Err(detail) => Verdict::FitsWithNote(format!(
                "the schema shape check reports {detail}, but the arguments decode into \
                 today's type (serde reads what the schema does not show, such as a \
                 `#[serde(alias)]`)"
            )),
        },
        Decoded::No(error) => Verdict::Rejected(rejection(&spec.input_schema, args, &error)),
        Decoded::Undecidable(key) => by_schema(
            shape,
            Some(format!(
                "the masked secret `{key}` cannot be stood in for, so the arguments were \
                 checked against the schema only"
            )),
        ),
    }
}

/// Whether `check_args` decodes, probed with values no argument struct reads (a struct
/// refuses `null`, a boolean and a string): the trait's default accepts all three, and
/// then the schema decides. An argument type that reads them all (a `serde_json::Value`)
/// has a schema that accepts them too, so the two verdicts agree.
fn decodes(tool: &dyn Tool) -> bool {
    [
        Value::Null,
        Value::Bool(false),
        Value::String(String::new()),
    ]
    .iter()
    .any(|probe| tool.check_args(probe).is_err())
}

#[derive(Debug)]
enum Decoded {
    Yes,
    No(DurableError),
    /// No placeholder for this masked argument decodes.
    Undecidable(String),
}

/// Decodes `args` with today's type. A masked secret is replaced by a placeholder: first
/// one built from its property in today's schema, then plain values of each JSON type.
/// While serde fails inside a masked argument, that argument's next placeholder is
/// tried; a failure anywhere else is the verdict. A masked argument's recorded value is
/// unknown, so what this checks of it is that today's type still reads it under its
/// recorded name, not its value.
fn decode(tool: &dyn Tool, args: &Value) -> Decoded {
    let Some(map) = args.as_object() else {
        return verdict(tool.check_args(args));
    };
    let properties = tool
        .spec()
        .input_schema
        .get("properties")
        .and_then(Value::as_object);
    let masked: Vec<(&String, Vec<Value>)> = map
        .iter()
        .filter(|(_, value)| schema_shape::is_masked(value))
        .map(|(key, _)| {
            let from_schema = properties.and_then(|p| p.get(key)).and_then(placeholder);
            (key, from_schema.into_iter().chain(plain_values()).collect())
        })
        .collect();
    if masked.is_empty() {
        return verdict(tool.check_args(args));
    }
    let mut tried = vec![0; masked.len()];
    let mut current = map.clone();
    for (key, candidates) in &masked {
        current.insert((*key).clone(), candidates[0].clone());
    }
    loop {
        let error = match tool.check_args(&Value::Object(current.clone())) {
            Ok(()) => return Decoded::Yes,
            Err(error) => error,
        };
        let inside = masked
            .iter()
            .position(|(key, _)| error_is_inside(&error, key));
        let Some(i) = inside else {
            return Decoded::No(error);
        };
        let (key, candidates) = &masked[i];
        tried[i] += 1;
        let Some(next) = candidates.get(tried[i]) else {
            return Decoded::Undecidable((*key).clone());
        };
        current.insert((*key).clone(), next.clone());
    }
}

fn verdict(result: Result<(), DurableError>) -> Decoded {
    match result {
        Ok(()) => Decoded::Yes,
        Err(error) => Decoded::No(error),
    }
}

fn plain_values() -> [Value; 6] {
    [
        Value::String(String::new()),
        Value::from(0),
        Value::Bool(false),
        Value::Null,
        Value::Array(Vec::new()),
        Value::Object(Map::new()),
    ]
}

/// A value a (sub)schema accepts, as plain as possible: its `const`, first `enum` value
/// or `default`, else the zero of its first `type` (an object with its `required`
/// properties), else the first `anyOf` / `oneOf` branch that has one.
fn placeholder(schema: &Value) -> Option<Value> {
    placeholder_within(schema, 8)
}

fn placeholder_within(schema: &Value, depth: u8) -> Option<Value> {
    let schema = schema.as_object()?;
    if depth == 0 {
        return None;
    }
    if let Some(value) = schema.get("const").or_else(|| schema.get("default")) {
        return Some(value.clone());
    }
    if let Some(first) = schema
        .get("enum")
        .and_then(Value::as_array)
        .and_then(|values| values.first())
    {
        return Some(first.clone());
    }
    let first_type = match schema.get("type") {
        Some(Value::String(t)) => Some(t.as_str()),
        Some(Value::Array(types)) => types.first().and_then(Value::as_str),
        _ => None,
    };
    match first_type {
        Some("string") => Some(Value::String(String::new())),
        Some("integer" | "number") => Some(Value::from(0)),
        Some("boolean") => Some(Value::Bool(false)),
        Some("null") => Some(Value::Null),
        Some("array") => Some(Value::Array(Vec::new())),
        Some("object") => {
            let properties = schema.get("properties").and_then(Value::as_object);
            let mut object = Map::new();
            for name in schema
                .get("required")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
            {
                let property = properties.and_then(|p| p.get(name))?;
                object.insert(name.to_owned(), placeholder_within(property, depth - 1)?);
            }
            Some(Value::Object(object))
        }
        _ => ["anyOf", "oneOf"]
            .iter()
            .filter_map(|k| schema.get(*k).and_then(Value::as_array))
            .flatten()
            .find_map(|branch| placeholder_within(branch, depth - 1)),
    }
}

/// Whether serde's error lies inside the value of the top-level argument `key` (an
/// unknown field is reported at its key, but it is the name that is refused).
fn error_is_inside(error: &DurableError, key: &str) -> bool {
    let DurableError::ArgumentsMismatch { path, message, .. } = error else {
        return false;
    };
    path.strip_prefix(&crate::args::path::path_of_whole_key(key))
        .is_some_and(|rest| {
            rest.starts_with(['.', '[']) || (rest.is_empty() && !is_unknown_field(message))
        })
}

fn is_unknown_field(message: &str) -> bool {
    message.starts_with("unknown field `")
}

/// The failure for arguments serde refused. A field that is missing while the call
/// holds arguments today's schema does not know (or serde naming one of those as
/// unknown) reads as a rename, reported with its two ways out.
fn rejection(schema: &Value, args: &Value, error: &DurableError) -> FailureKind {
    let detail = match error {
        DurableError::ArgumentsMismatch { path, message, .. } => format!("at `{path}`: {message}"),
        other => other.to_string(),
    };
    let (Some(recorded), Some(properties), DurableError::ArgumentsMismatch { path, message, .. }) = (
        args.as_object(),
        schema.get("properties").and_then(Value::as_object),
        error,
    ) else {
        return FailureKind::ArgumentsRejected(detail);
    };
    // serde reports a missing field at the object, an unknown one at its key.
    let top_level = path == "$"
        || recorded
            .keys()
            .any(|key| crate::args::path::path_of_whole_key(key) == *path);
    let names_a_field = message.starts_with("missing field `") || is_unknown_field(message);
    if !top_level || !names_a_field {
        return FailureKind::ArgumentsRejected(detail);
    }
    let missing: Vec<String> = schema
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .filter(|name| !recorded.contains_key(*name))
        .map(str::to_owned)
        .collect();
    let unread: Vec<String> = recorded
        .keys()
        .filter(|key| !properties.contains_key(*key))
        .cloned()
        .collect();
    if missing.is_empty() || unread.is_empty() {
        return FailureKind::ArgumentsRejected(detail);
    }
    FailureKind::ArgumentRenamed {
        missing,
        unread,
        detail,
    }
}
