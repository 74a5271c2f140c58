//! The common pass: JSON pointers, local references, and inlining.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

use super::{MAX_DEPTH, MAX_NODES, SchemaError, SchemaErrorKind};
use crate::tool_spec::ToolSpec;

// ---------------------------------------------------------------------------------------
// JSON pointers

#[derive(Default)]
pub(super) struct Ptr(Vec<String>);

impl Ptr {
    pub(super) fn push(&mut self, segment: impl Into<String>) {
        self.0.push(segment.into());
    }

    pub(super) fn pop(&mut self) {
        self.0.pop();
    }

    fn render(&self) -> String {
        self.0
            .iter()
            .map(|s| format!("/{}", s.replace('~', "~0").replace('/', "~1")))
            .collect()
    }
}

pub(super) fn error(tool: &str, ptr: &Ptr, kind: SchemaErrorKind) -> SchemaError {
    SchemaError {
        tool: tool.to_owned(),
        pointer: ptr.render(),
        kind,
    }
}

pub(super) fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Decodes one pointer segment (`~1` → `/`, `~0` → `~`, `%XX` percent escapes).
pub(super) fn decode_segment(segment: &str) -> String {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(byte) = segment
                .get(i + 1..i + 3)
                .and_then(|hex| u8::from_str_radix(hex, 16).ok())
        {
            out.push(byte);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out)
        .replace("~1", "/")
        .replace("~0", "~")
}

/// Splits `#/$defs/Name` into (`$defs`, `Name`); `None` for anything else.
fn def_ref(reference: &str) -> Option<(&'static str, String)> {
    for key in ["$defs", "definitions"] {
        if let Some(name) = reference
            .strip_prefix("#/")
            .and_then(|r| r.strip_prefix(key))
            .and_then(|r| r.strip_prefix('/'))
            && !name.contains('/')
        {
            return Some((key, decode_segment(name)));
        }
    }
    None
}

/// Resolves a local reference against a root schema.
pub(super) fn resolve<'a>(root: &'a Value, reference: &str) -> Option<&'a Value> {
    if reference == "#" {
        return Some(root);
    }
    let (key, name) = def_ref(reference)?;
    root.get(key)?.get(&name)
}

/// Calls `f` on each direct subschema of a schema node, with its pointer segments.
fn for_each_subschema(node: &Map<String, Value>, mut f: impl FnMut(&str, Option<String>, &Value)) {
    for (key, value) in node {
        match key.as_str() {
            "additionalProperties"
            | "items"
            | "not"
            | "if"
            | "then"
            | "else"
            | "contains"
            | "propertyNames"
            | "unevaluatedItems"
            | "unevaluatedProperties"
            | "additionalItems" => match value {
                Value::Array(items) => {
                    for (i, item) in items.iter().enumerate() {
                        f(key, Some(i.to_string()), item);
                    }
                }
                other => f(key, None, other),
            },
            "properties" | "patternProperties" | "dependentSchemas" => {
                if let Value::Object(map) = value {
                    for (name, item) in map {
                        f(key, Some(name.clone()), item);
                    }
                }
            }
            "anyOf" | "oneOf" | "allOf" | "prefixItems" => {
                if let Value::Array(items) = value {
                    for (i, item) in items.iter().enumerate() {
                        f(key, Some(i.to_string()), item);
                    }
                }
            }
            _ => {}
        }
    }
}

// ---------------------------------------------------------------------------------------
// The common pass: inline non-recursive references.

pub(super) struct Inliner<'a> {
    tool: &'a str,
    root: &'a Value,
    /// References that stay references (recursive definitions, and `#`).
    kept: BTreeSet<String>,
    nodes: usize,
}

impl<'a> Inliner<'a> {
    pub(super) fn new(spec: &'a ToolSpec) -> Result<Self, SchemaError> {
        let root = &spec.input_schema;
        let Value::Object(map) = root else {
            let found = match root {
                Value::Bool(b) => format!("the boolean schema `{b}`"),
                other => type_name(other).to_owned(),
            };
            return Err(error(
                &spec.name,
                &Ptr::default(),
                SchemaErrorKind::RootNotObject(found),
            ));
        };
        // The reference graph between definitions: a definition is kept as a reference
        // when it can reach itself.
        let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for key in ["$defs", "definitions"] {
            if let Some(Value::Object(defs)) = map.get(key) {
                for (name, def) in defs {
                    let from = format!("#/{key}/{}", name.replace('~', "~0").replace('/', "~1"));
                    let mut refs = BTreeSet::new();
                    collect_refs(def, &mut refs, 0);
                    edges.insert(from, refs);
                }
            }
        }
        let mut kept = BTreeSet::from(["#".to_owned()]);
        for start in edges.keys() {
            if reaches(&edges, start) {
                kept.insert(start.clone());
            }
        }
        Ok(Inliner {
            tool: &spec.name,
            root,
            kept,
            nodes: 0,
        })
    }

    pub(super) fn run(mut self) -> Result<Value, SchemaError> {
        let Value::Object(map) = self.root else {
            return Err(error(
                self.tool,
                &Ptr::default(),
                SchemaErrorKind::NotASchema("a non-object"),
            ));
        };
        let mut body = map.clone();
        for key in ["$schema", "title", "$defs", "definitions", "$id"] {
            body.remove(key);
        }
        let mut ptr = Ptr::default();
        let Value::Object(mut out) = self.node(&Value::Object(body), &mut ptr, 0)? else {
            return Err(error(
                self.tool,
                &ptr,
                SchemaErrorKind::NotASchema("a non-object"),
            ));
        };
        match out.get("type") {
            Some(Value::String(t)) if t == "object" => {}
            None if out.contains_key("properties") => {
                out.insert("type".into(), "object".into());
            }
            None => {
                return Err(error(
                    self.tool,
                    &ptr,
                    SchemaErrorKind::RootNotObject(
                        "a schema without `\"type\": \"object\"`".into(),
                    ),
                ));
            }
            Some(other) => {
                return Err(error(
                    self.tool,
                    &ptr,
                    SchemaErrorKind::RootNotObject(format!("`\"type\": {other}`")),
                ));
            }
        }
        // Keep the recursive definitions, under the key they came from.
        let kept: Vec<String> = self.kept.iter().filter(|r| *r != "#").cloned().collect();
        for reference in kept {
            let Some((key, name)) = def_ref(&reference) else {
                continue;
            };
            let Some(def) = resolve(self.root, &reference) else {
                continue;
            };
            ptr.push(key);
            ptr.push(name.clone());
            let def = self.node(def, &mut ptr, 0)?;
            ptr.pop();
            ptr.pop();
            let defs = out.entry(key).or_insert_with(|| Value::Object(Map::new()));
            if let Value::Object(defs) = defs {
                defs.insert(name, def);
            }
        }
        Ok(Value::Object(out))
    }

    fn node(&mut self, node: &Value, ptr: &mut Ptr, depth: usize) -> Result<Value, SchemaError> {
        self.nodes += 1;
        if self.nodes > MAX_NODES || depth > MAX_DEPTH {
            return Err(error(self.tool, ptr, SchemaErrorKind::TooComplex));
        }
        let Value::Object(map) = node else {
            return Ok(node.clone());
        };
        if let Some(reference) = map.get("$ref") {
            let Value::String(reference) = reference else {
                return Err(error(
                    self.tool,
                    ptr,
                    SchemaErrorKind::BadRef(reference.to_string()),
                ));
            };
            let Some(target) = resolve(self.root, reference) else {
                return Err(error(
                    self.tool,
                    ptr,
                    SchemaErrorKind::BadRef(reference.clone()),
                ));
            };
            if !self.kept.contains(reference) {
                // Inline: the target, then this node's own keywords on top.
                let mut siblings = map.clone();
                siblings.remove("$ref");
                let inlined = self.node(target, ptr, depth + 1)?;
                let siblings = self.children(&siblings, ptr, depth)?;
                return Ok(match inlined {
                    Value::Object(mut merged) => {
                        merged.extend(siblings);
                        Value::Object(merged)
                    }
                    Value::Bool(true) => Value::Object(siblings),
                    other => other,
                });
            }
        }
        Ok(Value::Object(self.children(map, ptr, depth)?))
    }

    /// Copies a node, inlining inside its subschemas (never inside data such as `enum`).
    fn children(
        &mut self,
        map: &Map<String, Value>,
        ptr: &mut Ptr,
        depth: usize,
    ) -> Result<Map<String, Value>, SchemaError> {
        let mut out = map.clone();
        let mut replaced: Vec<(String, Option<String>, Value)> = Vec::new();
        let mut failure = None;
        for_each_subschema(map, |key, segment, sub| {
            if failure.is_some() {
                return;
            }
            ptr.push(key);
            if let Some(segment) = &segment {
                ptr.push(segment.clone());
            }
            match self.node(sub, ptr, depth + 1) {
                Ok(value) => replaced.push((key.to_owned(), segment.clone(), value)),
                Err(e) => failure = Some(e),
            }
            if segment.is_some() {
                ptr.pop();
            }
            ptr.pop();
        });
        if let Some(e) = failure {
            return Err(e);
        }
        for (key, segment, value) in replaced {
            let Some(slot) = out.get_mut(&key) else {
                continue;
            };
            match (slot, segment) {
                (Value::Object(map), Some(name)) => {
                    map.insert(name, value);
                }
                (Value::Array(items), Some(index)) => {
                    if let Some(item) = index.parse::<usize>().ok().and_then(|i| items.get_mut(i)) {
                        *item = value;
                    }
                }
                (slot, None) => *slot = value,
                _ => {}
            }
        }
        Ok(out)
    }
}

/// Collects the `$ref` strings used anywhere in a schema.
fn collect_refs(node: &Value, refs: &mut BTreeSet<String>, depth: usize) {
    let Value::Object(map) = node else {
        return;
    };
    if depth > MAX_DEPTH {
        return;
    }
    if let Some(Value::String(reference)) = map.get("$ref") {
        refs.insert(reference.clone());
    }
    for_each_subschema(map, |_, _, sub| collect_refs(sub, refs, depth + 1));
}

/// Whether `start` can reach itself through the reference graph.
fn reaches(edges: &BTreeMap<String, BTreeSet<String>>, start: &str) -> bool {
    let mut seen = BTreeSet::new();
    let mut stack: Vec<&str> = edges
        .get(start)
        .map(|s| s.iter().map(String::as_str).collect())
        .unwrap_or_default();
    while let Some(next) = stack.pop() {
        if next == start {
            return true;
        }
        if seen.insert(next)
            && let Some(more) = edges.get(next)
        {
            stack.extend(more.iter().map(String::as_str));
        }
    }
    false
}
