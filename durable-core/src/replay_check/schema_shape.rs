//! A shallow structural check of recorded arguments against a tool's `input_schema`:
//! the root is an object, `required` properties are present, no unknown property when
//! `additionalProperties` is `false`, and each top-level property has a `type` the
//! schema allows.
//!
//! It is deliberately shallow: the full check is [`Tool::check_args`](crate::Tool::check_args)
//! (serde, through the tool's own argument type). This one catches the common breaking
//! changes even for hand-written tools that do not implement it, and for calls whose
//! masked secret arguments make deserialization impossible.

use serde_json::{Map, Value};

/// Whether a stored argument is a masked secret (`{"$secret": "<hash>"}`).
pub(super) fn is_masked(value: &Value) -> bool {
    crate::secret::is_masked(value)
}

pub(super) fn check(schema: &Value, args: &Value) -> Result<(), String> {
    let Some(schema) = schema.as_object() else {
        return Ok(());
    };
    let wants_object = schema.get("type").is_none_or(|t| type_allows(t, "object"));
    let Some(args) = args.as_object() else {
        return if wants_object && schema.get("type").is_some() {
            Err(format!(
                "at `$`: expected an object of named arguments, found {}",
                json_type(args)
            ))
        } else {
            Ok(())
        };
    };
    let properties = schema.get("properties").and_then(Value::as_object);
    if let Some(required) = schema.get("required").and_then(Value::as_array) {
        let missing: Vec<&str> = required
            .iter()
            .filter_map(Value::as_str)
            .filter(|name| !args.contains_key(*name))
            .collect();
        if !missing.is_empty() {
            return Err(format!(
                "at `$`: missing required argument{} {}",
                if missing.len() == 1 { "" } else { "s" },
                quoted(&missing)
            ));
        }
    }
    if schema.get("additionalProperties") == Some(&Value::Bool(false)) {
        let empty = Map::new();
        let known = properties.unwrap_or(&empty);
        let unknown: Vec<&str> = args
            .keys()
            .map(String::as_str)
            .filter(|k| !known.contains_key(*k))
            .collect();
        if !unknown.is_empty() {
            return Err(format!(
                "at `$`: unknown argument{} {} (the schema allows {})",
                if unknown.len() == 1 { "" } else { "s" },
                quoted(&unknown),
                if known.is_empty() {
                    "none".to_owned()
                } else {
                    quoted(&known.keys().map(String::as_str).collect::<Vec<_>>())
                }
            ));
        }
    }
    if let Some(properties) = properties {
        for (name, value) in args {
            if is_masked(value) {
                continue;
            }
            let Some(allowed) = properties.get(name).and_then(|p| p.get("type")) else {
                continue;
            };
            let found = json_type(value);
            let fits = match value {
                Value::Number(n) if n.is_i64() || n.is_u64() => {
                    type_allows(allowed, "integer") || type_allows(allowed, "number")
                }
                Value::Number(n) => {
                    type_allows(allowed, "number")
                        || (type_allows(allowed, "integer")
                            && n.as_f64().is_some_and(|f| f.fract() == 0.0))
                }
                _ => type_allows(allowed, found),
            };
            if !fits {
                return Err(format!(
                    "at `$.{name}`: the schema expects {}, found {found}",
                    describe(allowed)
                ));
            }
        }
    }
    Ok(())
}

fn type_allows(allowed: &Value, name: &str) -> bool {
    match allowed {
        Value::String(s) => s == name,
        Value::Array(items) => items.iter().any(|t| t.as_str() == Some(name)),
        _ => true,
    }
}

fn describe(allowed: &Value) -> String {
    match allowed {
        Value::String(s) => format!("`{s}`"),
        Value::Array(items) => items
            .iter()
            .filter_map(Value::as_str)
            .map(|s| format!("`{s}`"))
            .collect::<Vec<_>>()
            .join(" or "),
        other => other.to_string(),
    }
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Names in backticks, comma-separated.
pub(super) fn quoted<S: AsRef<str>>(names: &[S]) -> String {
    names
        .iter()
        .map(|n| format!("`{}`", n.as_ref()))
        .collect::<Vec<_>>()
        .join(", ")
}
