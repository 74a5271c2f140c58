//! The OpenAI strict pass.

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

use super::inline::{Ptr, error, resolve, type_name};
use super::{MAX_DEPTH, OPENAI_FORMATS, STRICT_REFUSED, SchemaError, SchemaErrorKind};

// ---------------------------------------------------------------------------------------
// The OpenAI strict pass (on the output of the common pass).

pub(super) struct Strict<'a> {
    pub(super) tool: &'a str,
    /// The common-pass schema, with its kept definitions (to unroll `$ref`s).
    pub(super) common: &'a Value,
}

impl Strict<'_> {
    pub(super) fn fail(&self, ptr: &Ptr, kind: SchemaErrorKind) -> SchemaError {
        error(self.tool, ptr, kind)
    }

    pub(super) fn node(
        &self,
        node: &Value,
        ptr: &mut Ptr,
        depth: usize,
    ) -> Result<Value, SchemaError> {
        if depth > MAX_DEPTH {
            return Err(self.fail(ptr, SchemaErrorKind::TooComplex));
        }
        let mut s = match node {
            Value::Object(map) => map.clone(),
            Value::Bool(true) => return Err(self.fail(ptr, SchemaErrorKind::AnyValue)),
            Value::Bool(false) => return Err(self.fail(ptr, SchemaErrorKind::Unsatisfiable)),
            other => return Err(self.fail(ptr, SchemaErrorKind::NotASchema(type_name(other)))),
        };

        if let Some(reference) = s.get("$ref").cloned() {
            let Value::String(reference) = &reference else {
                return Err(self.fail(ptr, SchemaErrorKind::BadRef(reference.to_string())));
            };
            if s.len() == 1 {
                return match resolve(self.common, reference) {
                    Some(_) => Ok(Value::Object(s)),
                    None => Err(self.fail(ptr, SchemaErrorKind::BadRef(reference.clone()))),
                };
            }
            // Strict mode refuses `$ref` beside other keywords: unroll one level.
            let Some(Value::Object(target)) = resolve(self.common, reference) else {
                return Err(self.fail(ptr, SchemaErrorKind::BadRef(reference.clone())));
            };
            s.remove("$ref");
            let mut merged = target.clone();
            if reference == "#" {
                for key in ["$defs", "definitions"] {
                    merged.remove(key);
                }
            }
            merged.extend(s);
            return self.node(&Value::Object(merged), ptr, depth + 1);
        }

        if let Some(all_of) = s.remove("allOf") {
            match all_of {
                Value::Array(mut items) if items.len() == 1 => {
                    let Value::Object(mut merged) = items.remove(0) else {
                        ptr.push("allOf");
                        ptr.push("0");
                        return Err(self.fail(ptr, SchemaErrorKind::Unsupported("allOf".into())));
                    };
                    merged.extend(s);
                    return self.node(&Value::Object(merged), ptr, depth + 1);
                }
                _ => {
                    ptr.push("allOf");
                    return Err(self.fail(ptr, SchemaErrorKind::Unsupported("allOf".into())));
                }
            }
        }

        if let Some(split) = split_nullable(&mut s) {
            let branch = self.node(&Value::Object(split), ptr, depth + 1)?;
            let mut out = Map::new();
            if let Some(description) = s.remove("description") {
                out.insert("description".into(), description);
            }
            let branches = flatten(
                vec![branch, json!({"type": "null"})],
                out.contains_key("description"),
            );
            out.insert("anyOf".into(), Value::Array(branches));
            return Ok(Value::Object(out));
        }

        if s.contains_key("oneOf") && s.contains_key("anyOf") {
            ptr.push("oneOf");
            return Err(self.fail(
                ptr,
                SchemaErrorKind::Unsupported("oneOf beside anyOf".into()),
            ));
        }

        let mut out = Map::new();
        for (key, value) in &s {
            match key.as_str() {
                "type" | "description" | "enum" | "const" | "pattern" | "minimum" | "maximum"
                | "exclusiveMinimum" | "exclusiveMaximum" | "multipleOf" | "minItems"
                | "maxItems" => {
                    out.insert(key.clone(), value.clone());
                }
                "format" if value.as_str().is_some_and(|f| OPENAI_FORMATS.contains(&f)) => {
                    out.insert(key.clone(), value.clone());
                }
                "anyOf" | "oneOf" => {
                    ptr.push(key.as_str());
                    let Value::Array(branches) = value else {
                        return Err(self.fail(ptr, SchemaErrorKind::NotASchema(type_name(value))));
                    };
                    let mut out_branches = Vec::with_capacity(branches.len());
                    for (i, branch) in branches.iter().enumerate() {
                        ptr.push(i.to_string());
                        out_branches.push(self.node(branch, ptr, depth + 1)?);
                        ptr.pop();
                    }
                    ptr.pop();
                    let described = s.contains_key("description");
                    out.insert(
                        "anyOf".into(),
                        Value::Array(flatten(out_branches, described)),
                    );
                }
                "items" => {
                    ptr.push("items");
                    if !value.is_object() && !value.is_boolean() {
                        return Err(self.fail(ptr, SchemaErrorKind::Unsupported("items".into())));
                    }
                    out.insert("items".into(), self.node(value, ptr, depth + 1)?);
                    ptr.pop();
                }
                // `false` is what strict mode wants (written below for every object).
                "additionalProperties" | "unevaluatedProperties"
                    if value == &Value::Bool(false) => {}
                "additionalProperties"
                | "unevaluatedProperties"
                | "patternProperties"
                | "propertyNames" => {
                    let keyword = match key.as_str() {
                        "additionalProperties" => "additionalProperties",
                        "unevaluatedProperties" => "unevaluatedProperties",
                        "patternProperties" => "patternProperties",
                        _ => "propertyNames",
                    };
                    ptr.push(keyword);
                    return Err(self.fail(ptr, SchemaErrorKind::OpenMap(keyword)));
                }
                k if STRICT_REFUSED.contains(&k) => {
                    ptr.push(k);
                    return Err(self.fail(ptr, SchemaErrorKind::Unsupported(k.to_owned())));
                }
                // `properties` and `required` are rebuilt below; everything else is an
                // annotation or an assertion strict mode does not support (dropped).
                _ => {}
            }
        }

        let is_object =
            s.get("type").is_some_and(|t| t == "object") || s.contains_key("properties");
        if is_object {
            let required: BTreeSet<&str> = s
                .get("required")
                .and_then(Value::as_array)
                .map(|r| r.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let mut properties = Map::new();
            if let Some(props) = s.get("properties") {
                let Value::Object(props) = props else {
                    ptr.push("properties");
                    return Err(self.fail(ptr, SchemaErrorKind::NotASchema(type_name(props))));
                };
                for (name, prop) in props {
                    ptr.push("properties");
                    ptr.push(name.clone());
                    let mut strict = self.node(prop, ptr, depth + 1)?;
                    ptr.pop();
                    ptr.pop();
                    if !required.contains(name.as_str()) {
                        strict = make_nullable(strict);
                        if let Some(default) = prop.get("default") {
                            add_default_hint(&mut strict, default);
                        }
                    }
                    properties.insert(name.clone(), strict);
                }
            }
            // Sorted, whatever the map keeps: with serde_json's `preserve_order` (which
            // another crate of the build may turn on) keys come in declaration order.
            let mut names: Vec<String> = properties.keys().cloned().collect();
            names.sort();
            let names: Vec<Value> = names.into_iter().map(Value::String).collect();
            out.insert("type".into(), "object".into());
            out.insert("properties".into(), Value::Object(properties));
            out.insert("required".into(), Value::Array(names));
            out.insert("additionalProperties".into(), Value::Bool(false));
        }
        let is_array = s.get("type").is_some_and(|t| t == "array");
        if is_array && !out.contains_key("items") {
            ptr.push("items");
            return Err(self.fail(ptr, SchemaErrorKind::AnyValue));
        }
        if !["type", "enum", "const", "anyOf", "$ref"]
            .iter()
            .any(|k| out.contains_key(*k))
        {
            return Err(self.fail(ptr, SchemaErrorKind::AnyValue));
        }
        Ok(Value::Object(out))
    }
}

/// Splices branches that are themselves bare unions (`anyOf` plus at most a
/// description) into the outer union: `anyOf: [anyOf: [a, b], c]` is `anyOf: [a, b, c]`.
/// An inner description is given up only when the outer node has its own.
fn flatten(branches: Vec<Value>, outer_described: bool) -> Vec<Value> {
    let mut out = Vec::with_capacity(branches.len());
    for branch in branches {
        let bare = branch.as_object().is_some_and(|map| {
            map.contains_key("anyOf")
                && map.keys().all(|k| k == "anyOf" || k == "description")
                && (outer_described || !map.contains_key("description"))
        });
        match branch {
            Value::Object(mut map) if bare => match map.remove("anyOf") {
                Some(Value::Array(inner)) => out.extend(inner),
                _ => out.push(Value::Object(map)),
            },
            other => out.push(other),
        }
    }
    out
}

/// `"type": [X, "null"]` where X is an object, an array, several types, or carries an
/// `enum`/`const`: returns the non-null part (and removes it from `s`, leaving only
/// annotations), so the caller can write `anyOf: [part, {"type": "null"}]`.
fn split_nullable(s: &mut Map<String, Value>) -> Option<Map<String, Value>> {
    let Some(Value::Array(types)) = s.get("type") else {
        return None;
    };
    if !types.iter().any(|t| t == "null") {
        return None;
    }
    let others: Vec<Value> = types.iter().filter(|t| *t != "null").cloned().collect();
    let simple = others.len() == 1
        && others[0]
            .as_str()
            .is_some_and(|t| matches!(t, "string" | "number" | "integer" | "boolean"))
        && !s.contains_key("enum")
        && !s.contains_key("const");
    if simple || others.is_empty() {
        return None;
    }
    let mut part = s.clone();
    part.remove("description");
    part.insert(
        "type".into(),
        if others.len() == 1 {
            others[0].clone()
        } else {
            Value::Array(others)
        },
    );
    if let Some(Value::Array(values)) = part.get_mut("enum") {
        values.retain(|v| !v.is_null());
    }
    s.retain(|k, _| k == "description");
    Some(part)
}

/// Whether a (strict) schema accepts `null` at its top level.
fn admits_null(schema: &Value) -> bool {
    let type_null = |t: &Value| match t {
        Value::String(t) => t == "null",
        Value::Array(ts) => ts.iter().any(|t| t == "null"),
        _ => false,
    };
    if schema.get("enum").is_some() || schema.get("const").is_some() {
        return schema
            .get("enum")
            .and_then(Value::as_array)
            .is_some_and(|e| e.iter().any(Value::is_null))
            || schema.get("const").is_some_and(Value::is_null);
    }
    if schema.get("type").is_some_and(type_null) {
        return true;
    }
    schema
        .get("anyOf")
        .and_then(Value::as_array)
        .is_some_and(|branches| branches.iter().any(admits_null))
}

/// Makes a strict schema accept `null` too (for a property that was optional).
pub(super) fn make_nullable(schema: Value) -> Value {
    if admits_null(&schema) {
        return schema;
    }
    let Value::Object(mut map) = schema else {
        return schema;
    };
    let scalar = map.get("type").and_then(Value::as_str).filter(|t| {
        matches!(*t, "string" | "number" | "integer" | "boolean")
            && !map.contains_key("enum")
            && !map.contains_key("const")
    });
    if let Some(t) = scalar {
        let t = t.to_owned();
        map.insert("type".into(), json!([t, "null"]));
        return Value::Object(map);
    }
    let only_union = map.keys().all(|k| k == "anyOf" || k == "description");
    if only_union && let Some(Value::Array(branches)) = map.get_mut("anyOf") {
        branches.push(json!({"type": "null"}));
        return Value::Object(map);
    }
    let mut out = Map::new();
    if let Some(description) = map.remove("description") {
        out.insert("description".into(), description);
    }
    out.insert(
        "anyOf".into(),
        json!([Value::Object(map), {"type": "null"}]),
    );
    Value::Object(out)
}

/// Appends `Default: <value> (send null to use it).` to a property's description.
fn add_default_hint(schema: &mut Value, default: &Value) {
    if default.is_null() {
        return;
    }
    let text = default.to_string();
    if text.len() > 200 {
        return;
    }
    let Value::Object(map) = schema else {
        return;
    };
    let hint = format!("Default: {text} (send null to use it).");
    let description = match map.get("description").and_then(Value::as_str) {
        Some(d) if !d.is_empty() => {
            let sep = if d.ends_with('.') { " " } else { ". " };
            format!("{d}{sep}{hint}")
        }
        _ => hint,
    };
    map.insert("description".into(), description.into());
}
