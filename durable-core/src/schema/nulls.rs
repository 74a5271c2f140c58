//! `null` for an optional argument means "not given".

use std::collections::BTreeSet;

use serde_json::Value;

use super::inline::resolve;

// ---------------------------------------------------------------------------------------
// Runtime side: `null` for an optional argument means "not given".

/// Removes every `null` whose property `schema` does not require, at any depth the
/// schema describes (nested objects, array items, `$ref`s, a one-element `allOf`, and the
/// one `anyOf`/`oneOf` branch that fits an object value by its `required` keys and
/// `const` tags). Values the schema does not describe are left alone.
///
/// See the [module docs](crate::schema#openai-strict-mode-openai_strict_schema) for why.
///
/// ```
/// use durable_core::schema::drop_optional_nulls;
/// use serde_json::json;
///
/// let schema = json!({
///     "type": "object",
///     "properties": {"to": {"type": "string"}, "cc": {"type": ["string", "null"]}},
///     "required": ["to"],
/// });
/// let mut args = json!({"to": "ada@example.com", "cc": null});
/// drop_optional_nulls(&schema, &mut args);
/// assert_eq!(args, json!({"to": "ada@example.com"}));
/// ```
pub fn drop_optional_nulls(schema: &Value, args: &mut Value) {
    strip(schema, schema, args, 0);
}

fn strip(root: &Value, schema: &Value, value: &mut Value, depth: usize) {
    if depth > 2 * crate::args::MAX_SUPPORTED_DEPTH {
        return;
    }
    let Some(schema) = select(root, schema, value) else {
        return;
    };
    match value {
        Value::Object(map) => {
            let Some(Value::Object(props)) = schema.get("properties") else {
                return;
            };
            let required: BTreeSet<&str> = schema
                .get("required")
                .and_then(Value::as_array)
                .map(|r| r.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            map.retain(|k, v| {
                !(v.is_null() && props.contains_key(k) && !required.contains(k.as_str()))
            });
            for (k, v) in map.iter_mut() {
                if let Some(sub) = props.get(k) {
                    strip(root, sub, v, depth + 1);
                }
            }
        }
        Value::Array(items) => {
            if let Some(sub) = schema.get("items").filter(|s| s.is_object()) {
                for item in items {
                    strip(root, sub, item, depth + 1);
                }
            }
        }
        _ => {}
    }
}

/// Follows `$ref`s and a one-element `allOf`, and picks the single union branch that
/// fits the value (unions nested in unions included).
fn select<'a>(root: &'a Value, schema: &'a Value, value: &Value) -> Option<&'a Value> {
    let mut candidates = Vec::new();
    leaves(root, schema, &mut candidates, 0)?;
    match candidates.as_slice() {
        [one] => Some(one),
        _ => {
            let fitting: Vec<&Value> = candidates.into_iter().filter(|b| fits(b, value)).collect();
            match fitting.as_slice() {
                [one] => Some(one),
                _ => None,
            }
        }
    }
}

/// The non-union schemas a schema stands for: itself, or the branches of its unions.
fn leaves<'a>(
    root: &'a Value,
    schema: &'a Value,
    out: &mut Vec<&'a Value>,
    depth: usize,
) -> Option<()> {
    if depth > 16 || out.len() > 256 {
        return None;
    }
    let schema = deref(root, schema)?;
    if schema.get("properties").is_none() {
        if let Some(Value::Array(all)) = schema.get("allOf")
            && all.len() == 1
        {
            return leaves(root, &all[0], out, depth + 1);
        }
        let branches = schema
            .get("anyOf")
            .or_else(|| schema.get("oneOf"))
            .and_then(Value::as_array);
        if let Some(branches) = branches {
            for branch in branches {
                leaves(root, branch, out, depth + 1)?;
            }
            return Some(());
        }
    }
    out.push(schema);
    Some(())
}

fn deref<'a>(root: &'a Value, mut schema: &'a Value) -> Option<&'a Value> {
    for _ in 0..32 {
        match schema.get("$ref").and_then(Value::as_str) {
            Some(reference) => schema = resolve(root, reference)?,
            None => return Some(schema),
        }
    }
    None
}

/// Whether a union branch can describe `value` (by JSON type, required keys and
/// `const`-tagged properties).
fn fits(branch: &Value, value: &Value) -> bool {
    let Value::Object(map) = value else {
        // Only objects carry nulls to strip: any non-object branch is as good as none.
        return false;
    };
    let object_type = match branch.get("type") {
        Some(Value::String(t)) => t == "object",
        Some(Value::Array(ts)) => ts.iter().any(|t| t == "object"),
        None => branch.get("properties").is_some(),
        _ => false,
    };
    if !object_type {
        return false;
    }
    let required_present = branch
        .get("required")
        .and_then(Value::as_array)
        .is_none_or(|r| {
            r.iter()
                .filter_map(Value::as_str)
                .all(|k| map.contains_key(k))
        });
    let tags_match = branch
        .get("properties")
        .and_then(Value::as_object)
        .is_none_or(|props| {
            props.iter().all(|(k, p)| match p.get("const") {
                Some(tag) => map.get(k) == Some(tag),
                None => true,
            })
        });
    required_present && tags_match
}
