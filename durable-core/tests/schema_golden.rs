//! Golden files for the three schema dialects, and checks that each strict schema
//! describes what serde accepts.
//!
//! `SNAPSHOTS=overwrite cargo test -p durable-core --test schema_golden` rewrites the
//! files under `tests/schemas/`; review the diff before committing.

use std::collections::BTreeSet;
use std::path::PathBuf;

use durable_core::schema::{
    self, McpAnnotations, OPENAI_FORMATS, SchemaError, SchemaErrorKind, drop_optional_nulls,
};
use durable_core::{ReplayClass, ToolSpec};
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

// ---------------------------------------------------------------------------------------
// Realistic argument types (what `#[durable_tool]` will generate from doc comments).

/// Arguments of `read_file`.
#[derive(Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
struct ReadFile {
    /// Path of the file, relative to the workspace root.
    path: String,
    /// First line to return (1-based); the whole file when absent.
    start_line: Option<u32>,
    /// Most lines to return.
    #[serde(default = "default_limit")]
    limit: u32,
}

fn default_limit() -> u32 {
    200
}

/// How urgent a message is.
#[derive(Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
enum Priority {
    /// Deliver with the next batch.
    Low,
    /// Deliver now.
    High,
}

/// A file attached to an email.
#[derive(Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
struct Attachment {
    /// File name shown to the recipient.
    name: String,
    /// Where to fetch the content.
    url: String,
    /// Size, if known.
    bytes: Option<u64>,
}

/// Arguments of `send_email`.
#[derive(Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
struct SendEmail {
    /// Recipients' addresses.
    to: Vec<String>,
    /// Copy recipients.
    cc: Option<Vec<String>>,
    /// Subject line.
    subject: String,
    /// Plain-text body.
    body: String,
    /// Delivery priority.
    priority: Option<Priority>,
    /// Files to attach.
    #[serde(default)]
    attachments: Vec<Attachment>,
}

/// ISO 4217 currency.
#[derive(Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
enum Currency {
    Eur,
    Usd,
}

/// A postal address.
#[derive(Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
struct Address {
    /// Street and number.
    street: String,
    /// City.
    city: String,
    /// Postal code, where the country has them.
    zip: Option<String>,
}

/// Arguments of `charge_card`.
#[derive(Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
struct ChargeCard {
    /// Our order id; also the idempotency key.
    order_id: String,
    /// Amount in minor units (cents).
    cents: u64,
    /// Currency of the amount.
    currency: Currency,
    /// Billing address, if the card issuer asks for one.
    billing: Option<Address>,
    /// Day the charge is for.
    #[schemars(extend("format" = "date"))]
    value_date: Option<String>,
}

/// Who a ticket goes to.
#[derive(Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum Assignee {
    /// One person.
    User {
        /// Their login.
        login: String,
    },
    /// A team.
    Team {
        /// The team's slug.
        slug: String,
        /// Whether to notify every member.
        #[serde(default)]
        notify: bool,
    },
}

/// One item of a checklist, with sub-items.
#[derive(Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
struct ChecklistItem {
    /// What to do.
    text: String,
    /// Sub-items.
    #[serde(default)]
    children: Vec<ChecklistItem>,
}

/// Arguments of `file_ticket`.
#[derive(Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
struct FileTicket {
    /// One-line summary.
    title: String,
    /// Labels to set.
    labels: BTreeSet<String>,
    /// Who should handle it.
    assignee: Option<Assignee>,
    /// Steps to follow.
    checklist: Vec<ChecklistItem>,
    /// Effort estimate in hours.
    #[schemars(range(min = 0.5, max = 40.0))]
    estimate_hours: Option<f64>,
}

fn spec<T: JsonSchema>(name: &str, description: &str, class: ReplayClass) -> ToolSpec {
    ToolSpec::new(name, description, class, schema::schema_for::<T>())
}

fn specs() -> Vec<ToolSpec> {
    vec![
        spec::<ReadFile>(
            "read_file",
            "Read a text file from the workspace.",
            ReplayClass::Pure,
        ),
        spec::<SendEmail>(
            "send_email",
            "Send an email to a customer.",
            ReplayClass::UnsafeOnReplay,
        ),
        spec::<ChargeCard>(
            "charge_card",
            "Charge a card; the provider honours idempotency keys.",
            ReplayClass::IdempotentWithKey,
        ),
        // Built with `$defs` and `$ref`s (schemars' default) to exercise inlining.
        ToolSpec::new(
            "file_ticket",
            "Open a ticket in the tracker.",
            ReplayClass::IdempotentWithKey,
            serde_json::to_value(schemars::schema_for!(FileTicket)).expect("schema"),
        ),
    ]
}

// ---------------------------------------------------------------------------------------
// Golden files

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/schemas")
}

/// Rebuilds every object with sorted keys, so files do not depend on serde_json's
/// `preserve_order` feature.
fn sorted(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            let mut out = Map::new();
            for key in keys {
                out.insert(key.clone(), sorted(&map[key]));
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
        other => other.clone(),
    }
}

/// Compares `actual` with `tests/schemas/<file>`, or rewrites it under
/// `SNAPSHOTS=overwrite`. Returns a description of the mismatch, if any.
fn check_golden(file: &str, actual: &Value) -> Option<String> {
    let path = golden_dir().join(file);
    let text = format!(
        "{}\n",
        serde_json::to_string_pretty(&sorted(actual)).expect("serializable")
    );
    if std::env::var("SNAPSHOTS").as_deref() == Ok("overwrite") {
        std::fs::create_dir_all(golden_dir()).expect("create tests/schemas");
        std::fs::write(&path, &text).expect("write golden file");
        return None;
    }
    let expected = match std::fs::read_to_string(&path) {
        Ok(expected) => expected,
        Err(e) => {
            return Some(format!(
                "{file}: cannot read {} ({e}); run with SNAPSHOTS=overwrite to create it",
                path.display()
            ));
        }
    };
    let expected_value: Value = serde_json::from_str(&expected).expect("golden file is JSON");
    if expected_value == *actual {
        return None;
    }
    // A line diff, enough to see what moved.
    let (old, new): (Vec<&str>, Vec<&str>) = (expected.lines().collect(), text.lines().collect());
    let mut diff = String::new();
    for i in 0..old.len().max(new.len()) {
        match (old.get(i), new.get(i)) {
            (Some(a), Some(b)) if a == b => {}
            (a, b) => {
                diff.push_str(&format!(
                    "  line {}:\n    - {}\n    + {}\n",
                    i + 1,
                    a.unwrap_or(&"<none>"),
                    b.unwrap_or(&"<none>")
                ));
            }
        }
    }
    Some(format!(
        "{file} differs from {} (first differing lines below); if the change is intended, \
         rerun with SNAPSHOTS=overwrite and review the diff\n{diff}",
        path.display()
    ))
}

#[test]
fn golden_files_match_each_dialect() {
    let mut failures = Vec::new();
    for spec in specs() {
        let dialects = [
            ("openai", schema::openai_function(&spec)),
            ("anthropic", schema::anthropic_tool(&spec)),
            ("mcp", schema::mcp_tool(&spec)),
        ];
        for (dialect, value) in dialects {
            let value = value.unwrap_or_else(|e| panic!("{dialect} export failed: {e}"));
            if let Some(failure) = check_golden(&format!("{}.{dialect}.json", spec.name), &value) {
                failures.push(failure);
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

// ---------------------------------------------------------------------------------------
// Strict-mode structure

const STRICT_KEYWORDS: &[&str] = &[
    "type",
    "description",
    "enum",
    "const",
    "anyOf",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "$ref",
    "$defs",
    "pattern",
    "format",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "minItems",
    "maxItems",
];

/// Every rule of strict mode, checked on every node; returns the violations.
fn strict_violations(node: &Value, pointer: &str, out: &mut Vec<String>) {
    let Value::Object(map) = node else {
        out.push(format!("{pointer}: not an object schema"));
        return;
    };
    for key in map.keys() {
        if !STRICT_KEYWORDS.contains(&key.as_str()) {
            out.push(format!(
                "{pointer}: keyword `{key}` is not allowed in strict mode"
            ));
        }
    }
    if map.contains_key("$ref") && map.len() > 1 {
        out.push(format!("{pointer}: `$ref` has siblings"));
    }
    if let Some(format) = map.get("format").and_then(Value::as_str)
        && !OPENAI_FORMATS.contains(&format)
    {
        out.push(format!("{pointer}: format `{format}`"));
    }
    if !["type", "enum", "const", "anyOf", "$ref"]
        .iter()
        .any(|k| map.contains_key(*k))
    {
        out.push(format!("{pointer}: accepts any value"));
    }
    let is_object = map.get("type").is_some_and(|t| t == "object");
    if is_object {
        if map.get("additionalProperties") != Some(&Value::Bool(false)) {
            out.push(format!("{pointer}: additionalProperties is not false"));
        }
        let properties: BTreeSet<&str> = map
            .get("properties")
            .and_then(Value::as_object)
            .map(|p| p.keys().map(String::as_str).collect())
            .unwrap_or_default();
        let required: BTreeSet<&str> = map
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        if properties != required {
            out.push(format!(
                "{pointer}: required {required:?} != properties {properties:?}"
            ));
        }
    }
    if map.get("type").is_some_and(|t| t == "array") && !map.contains_key("items") {
        out.push(format!("{pointer}: array without items"));
    }
    if let Some(Value::Object(props)) = map.get("properties") {
        for (name, prop) in props {
            strict_violations(prop, &format!("{pointer}/properties/{name}"), out);
        }
    }
    if let Some(Value::Object(defs)) = map.get("$defs") {
        for (name, def) in defs {
            strict_violations(def, &format!("{pointer}/$defs/{name}"), out);
        }
    }
    if let Some(items) = map.get("items") {
        strict_violations(items, &format!("{pointer}/items"), out);
    }
    if let Some(Value::Array(branches)) = map.get("anyOf") {
        for (i, branch) in branches.iter().enumerate() {
            strict_violations(branch, &format!("{pointer}/anyOf/{i}"), out);
        }
    }
}

#[test]
fn strict_schemas_follow_every_rule() {
    for spec in specs() {
        let tool = schema::openai_function(&spec).expect("strict export");
        assert_eq!(tool["type"], "function");
        assert_eq!(tool["function"]["strict"], true);
        assert_eq!(tool["function"]["name"], spec.name.as_str());
        let parameters = &tool["function"]["parameters"];
        assert_eq!(parameters["type"], "object", "{}", spec.name);
        let mut violations = Vec::new();
        strict_violations(parameters, "", &mut violations);
        assert!(violations.is_empty(), "{}: {violations:#?}", spec.name);

        // The Responses API shape carries the same schema, flat.
        let flat = schema::openai_response_tool(&spec).expect("responses export");
        assert_eq!(flat["parameters"], *parameters);
        assert_eq!(flat["type"], "function");
        assert_eq!(flat["strict"], true);
        assert_eq!(flat["name"], spec.name.as_str());
    }
}

/// Inserts `null` for every property a strict schema requires but the value lacks:
/// what a strict-mode model sends when it leaves an optional argument out.
fn strict_form(schema: &Value, root: &Value, value: &mut Value) {
    let schema = match schema.get("$ref").and_then(Value::as_str) {
        Some(r) => {
            let name = r.trim_start_matches("#/$defs/");
            &root["$defs"][name]
        }
        None => schema,
    };
    if let Some(Value::Array(branches)) = schema.get("anyOf") {
        // The branch of the value's JSON type (objects: the one whose tags match).
        for branch in branches {
            let branch = match branch.get("$ref").and_then(Value::as_str) {
                Some(r) => &root["$defs"][r.trim_start_matches("#/$defs/")],
                None => branch,
            };
            let tags_match = branch
                .get("properties")
                .and_then(Value::as_object)
                .is_some_and(|p| {
                    p.iter()
                        .all(|(k, s)| s.get("const").is_none_or(|c| value.get(k) == Some(c)))
                });
            if value.is_object() && branch["type"] == "object" && tags_match {
                strict_form(branch, root, value);
                return;
            }
            if value.is_array() && branch["type"] == "array" {
                strict_form(branch, root, value);
                return;
            }
        }
        return;
    }
    match value {
        Value::Object(map) => {
            if let Some(Value::Object(props)) = schema.get("properties") {
                for (name, prop) in props {
                    let slot = map.entry(name.clone()).or_insert(Value::Null);
                    strict_form(prop, root, slot);
                }
            }
        }
        Value::Array(items) => {
            for item in items {
                strict_form(&schema["items"], root, item);
            }
        }
        _ => {}
    }
}

/// A value serde produced, sent the way a strict-mode model sends it (every optional
/// field present, as `null` when absent), must deserialize back to the same value after
/// the runtime drops those `null`s; and the same holds for the Anthropic form.
fn round_trips<T>(spec: &ToolSpec, samples: &[Value])
where
    T: DeserializeOwned + Serialize + PartialEq + std::fmt::Debug,
{
    let strict = schema::openai_strict_schema(spec).expect("strict export");
    for sample in samples {
        let expected: T = serde_json::from_value(sample.clone())
            .unwrap_or_else(|e| panic!("{}: sample {sample} is not valid: {e}", spec.name));
        let mut sent = sample.clone();
        strict_form(&strict, &strict, &mut sent);
        let mut received = sent.clone();
        drop_optional_nulls(&spec.input_schema, &mut received);
        let got: T = serde_json::from_value(received.clone()).unwrap_or_else(|e| {
            panic!(
                "{}: strict form {sent} (normalized {received}) fails: {e}",
                spec.name
            )
        });
        assert_eq!(got, expected, "{}: {sent}", spec.name);

        // Serializing the typed value and sending it back changes nothing either.
        let mut again = serde_json::to_value(&expected).expect("serializable");
        drop_optional_nulls(&spec.input_schema, &mut again);
        let back: T = serde_json::from_value(again).expect("round trip");
        assert_eq!(back, expected);
    }
}

#[test]
fn strict_nulls_deserialize_like_missing_fields() {
    let specs = specs();
    round_trips::<ReadFile>(
        &specs[0],
        &[
            json!({"path": "src/lib.rs"}),
            json!({"path": "a", "start_line": 3, "limit": 10}),
        ],
    );
    round_trips::<SendEmail>(
        &specs[1],
        &[
            json!({"to": ["ada@example.com"], "subject": "Hi", "body": "..."}),
            json!({"to": [], "cc": ["b@example.com"], "subject": "s", "body": "b",
                   "priority": "high",
                   "attachments": [{"name": "a.pdf", "url": "https://x/a.pdf"},
                                   {"name": "b.pdf", "url": "https://x/b.pdf", "bytes": 12}]}),
        ],
    );
    round_trips::<ChargeCard>(
        &specs[2],
        &[
            json!({"order_id": "o-1", "cents": 1200, "currency": "eur"}),
            json!({"order_id": "o-2", "cents": 5, "currency": "usd",
                   "billing": {"street": "1 Main St", "city": "Springfield"},
                   "value_date": "2026-01-31"}),
        ],
    );
    round_trips::<FileTicket>(
        &specs[3],
        &[
            json!({"title": "t", "labels": [], "checklist": []}),
            json!({"title": "t", "labels": ["bug", "p1"],
                   "assignee": {"kind": "team", "slug": "infra"},
                   "checklist": [{"text": "a", "children": [{"text": "a.1"}]}, {"text": "b"}],
                   "estimate_hours": 1.5}),
            json!({"title": "t", "labels": [], "assignee": {"kind": "user", "login": "ada"},
                   "checklist": []}),
        ],
    );
}

#[test]
fn defaults_move_into_descriptions_and_optionals_become_nullable() {
    let specs = specs();
    let read = schema::openai_strict_schema(&specs[0]).expect("strict");
    assert_eq!(
        read["properties"]["limit"],
        json!({"type": ["integer", "null"], "minimum": 0,
               "description": "Most lines to return. Default: 200 (send null to use it)."})
    );
    assert_eq!(read["properties"]["path"]["type"], "string");
    assert_eq!(read["required"], json!(["limit", "path", "start_line"]));

    // A nullable enum is split so that `null` is not an enum value of a string branch.
    let email = schema::openai_strict_schema(&specs[1]).expect("strict");
    let priority = &email["properties"]["priority"];
    assert_eq!(
        priority,
        &json!({"description": "Delivery priority.", "anyOf": [
            {"type": "string", "const": "low", "description": "Deliver with the next batch."},
            {"type": "string", "const": "high", "description": "Deliver now."},
            {"type": "null"}]})
    );

    // The recursive type stays a reference, and its definition is strict too.
    let ticket = schema::openai_strict_schema(&specs[3]).expect("strict");
    assert_eq!(
        ticket["properties"]["checklist"]["items"],
        json!({"$ref": "#/$defs/ChecklistItem"})
    );
    let item = &ticket["$defs"]["ChecklistItem"];
    assert_eq!(item["additionalProperties"], false);
    assert_eq!(item["required"], json!(["children", "text"]));
    // Only the recursive definition survives inlining.
    assert_eq!(
        ticket["$defs"].as_object().map(|d| d.len()),
        Some(1),
        "{ticket:#}"
    );
}

#[test]
fn anthropic_and_mcp_keep_optional_fields_optional() {
    let specs = specs();
    let tool = schema::anthropic_tool(&specs[0]).expect("anthropic");
    assert_eq!(tool["input_schema"]["required"], json!(["path"]));
    assert_eq!(tool["input_schema"]["properties"]["limit"]["default"], 200);
    assert!(tool["input_schema"].get("$schema").is_none());
    assert!(tool["input_schema"].get("title").is_none());

    let mcp = schema::mcp_tool(&specs[3]).expect("mcp");
    // `$ref`s to non-recursive definitions are inlined: no Assignee left in `$defs`.
    let defs = mcp["inputSchema"]["$defs"].as_object().expect("defs");
    assert_eq!(defs.keys().collect::<Vec<_>>(), ["ChecklistItem"]);
    assert_eq!(
        mcp["inputSchema"]["properties"]["assignee"]["anyOf"][0]["oneOf"][0]["properties"]["kind"]
            ["const"],
        "user"
    );
}

#[test]
fn mcp_hints_follow_the_replay_class() {
    let hints = |class| serde_json::to_value(McpAnnotations::for_class(class)).expect("json");
    assert_eq!(
        hints(ReplayClass::Pure),
        json!({"readOnlyHint": true, "idempotentHint": true, "destructiveHint": false})
    );
    assert_eq!(
        hints(ReplayClass::IdempotentWithKey),
        json!({"readOnlyHint": false, "idempotentHint": true, "destructiveHint": true})
    );
    assert_eq!(
        hints(ReplayClass::UnsafeOnReplay),
        json!({"readOnlyHint": false, "idempotentHint": false, "destructiveHint": true})
    );
    let custom = McpAnnotations::for_class(ReplayClass::Pure).with_open_world_hint(Some(true));
    let tool = schema::mcp_tool_with(&specs()[0], custom).expect("mcp");
    assert_eq!(tool["annotations"]["openWorldHint"], true);
}

// ---------------------------------------------------------------------------------------
// Refusals

fn refusal(schema_value: Value) -> SchemaError {
    let spec = ToolSpec::new("t", "", ReplayClass::Pure, schema_value);
    schema::openai_strict_schema(&spec).expect_err("not expressible in strict mode")
}

#[derive(Deserialize, JsonSchema)]
#[allow(dead_code)]
struct WithMap {
    /// Headers.
    headers: std::collections::HashMap<String, String>,
}

#[derive(Deserialize, JsonSchema)]
#[allow(dead_code)]
struct WithAny {
    inner: Inner,
}

#[derive(Deserialize, JsonSchema)]
#[allow(dead_code)]
struct Inner {
    payload: Value,
}

#[derive(Deserialize, JsonSchema)]
#[allow(dead_code)]
struct WithTuple {
    point: (f64, f64),
}

#[derive(Deserialize, JsonSchema)]
#[allow(dead_code)]
enum RootEnum {
    A,
    B,
}

#[test]
fn inexpressible_schemas_are_refused_with_a_pointer() {
    let err = refusal(schema::schema_for::<WithMap>());
    assert_eq!(err.pointer, "/properties/headers/additionalProperties");
    assert_eq!(err.kind, SchemaErrorKind::OpenMap("additionalProperties"));
    assert!(
        err.to_string()
            .starts_with("tool `t`: schema at `/properties/headers/additionalProperties` is a map")
    );

    let err = refusal(schema::schema_for::<WithAny>());
    assert_eq!(
        (err.pointer.as_str(), &err.kind),
        (
            "/properties/inner/properties/payload",
            &SchemaErrorKind::AnyValue
        )
    );
    // Through a `$ref` too: the pointer is in the inlined schema.
    let err = refusal(serde_json::to_value(schemars::schema_for!(WithAny)).expect("json"));
    assert_eq!(err.pointer, "/properties/inner/properties/payload");

    let err = refusal(schema::schema_for::<WithTuple>());
    assert_eq!(
        (err.pointer.as_str(), &err.kind),
        (
            "/properties/point/prefixItems",
            &SchemaErrorKind::Unsupported("prefixItems".into())
        )
    );

    let err = refusal(json!({"type": "object", "properties": {"a": {"type": "array"}}}));
    assert_eq!(
        (err.pointer.as_str(), &err.kind),
        ("/properties/a/items", &SchemaErrorKind::AnyValue)
    );
    let err = refusal(json!({"type": "object", "properties": {"a": {"allOf": [
        {"type": "string"}, {"minLength": 2}]}}}));
    assert_eq!(err.kind, SchemaErrorKind::Unsupported("allOf".into()));
    let err = refusal(
        json!({"type": "object", "properties": {"a": {"type": "string", "not": {"const": "x"}}}}),
    );
    assert_eq!(
        (err.pointer.as_str(), &err.kind),
        (
            "/properties/a/not",
            &SchemaErrorKind::Unsupported("not".into())
        )
    );
    let err =
        refusal(json!({"type": "object", "properties": {"a/b~c": {"patternProperties": {}}}}));
    assert_eq!(err.pointer, "/properties/a~1b~0c/patternProperties");
}

#[test]
fn every_dialect_refuses_a_root_that_is_not_an_object() {
    for root in [
        schema::schema_for::<RootEnum>(),
        json!(true),
        json!({"type": "string"}),
        json!({"type": ["object", "null"]}),
    ] {
        let spec = ToolSpec::new("t", "", ReplayClass::Pure, root.clone());
        for result in [
            schema::openai_function(&spec),
            schema::anthropic_tool(&spec),
            schema::mcp_tool(&spec),
        ] {
            let err = result.expect_err("not an object root");
            assert!(
                matches!(err.kind, SchemaErrorKind::RootNotObject(_)),
                "{root}: {err}"
            );
            assert_eq!(err.pointer, "");
        }
    }
}

#[test]
fn bad_names_and_references_are_refused() {
    for name in ["", "has space", "dotted.name", "@model", &"x".repeat(65)] {
        let spec = ToolSpec::new(name, "", ReplayClass::Pure, json!({"type": "object"}));
        let err = schema::anthropic_tool(&spec).expect_err("bad name");
        assert!(
            matches!(err.kind, SchemaErrorKind::InvalidName(_)),
            "{name}: {err}"
        );
    }
    let spec = ToolSpec::new(
        "t",
        "",
        ReplayClass::Pure,
        json!({"type": "object", "properties": {"a": {"$ref": "https://example.com/s.json"}}}),
    );
    let err = schema::mcp_tool(&spec).expect_err("remote ref");
    assert_eq!(
        (err.pointer.as_str(), &err.kind),
        (
            "/properties/a",
            &SchemaErrorKind::BadRef("https://example.com/s.json".into())
        )
    );
}

#[test]
fn an_empty_argument_struct_is_an_empty_strict_object() {
    #[derive(Deserialize, JsonSchema)]
    struct NoArgs {}
    let spec = ToolSpec::new(
        "ping",
        "Ping.",
        ReplayClass::Pure,
        schema::schema_for::<NoArgs>(),
    );
    assert_eq!(
        schema::openai_strict_schema(&spec).expect("strict"),
        json!({"type": "object", "properties": {}, "required": [], "additionalProperties": false})
    );
    assert_eq!(
        schema::anthropic_tool(&spec).expect("anthropic"),
        json!({"name": "ping", "description": "Ping.", "input_schema": {"type": "object"}})
    );
}
