use serde_json::json;

use super::inline::decode_segment;
use super::strict::make_nullable;
use super::*;

fn spec(schema: Value) -> ToolSpec {
    ToolSpec::new("t", "A tool.", ReplayClass::Pure, schema)
}

fn common(schema: Value) -> Value {
    input_schema(&spec(schema)).expect("common pass")
}

fn strict(schema: Value) -> Value {
    openai_strict_schema(&spec(schema)).expect("strict pass")
}

#[test]
fn refs_are_inlined_with_the_referring_keywords_winning() {
    let out = common(json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "Args",
        "type": "object",
        "properties": {
            "home": {"$ref": "#/$defs/Address", "description": "Home."},
            "work": {"$ref": "#/definitions/Address"},
            "tags": {"enum": [{"$ref": "#/$defs/NotASchema"}]},
        },
        "$defs": {"Address": {"description": "An address.", "type": "object",
                              "properties": {"city": {"$ref": "#/$defs/City"}}},
                  "City": {"type": "string"}},
        "definitions": {"Address": {"type": "string"}},
    }));
    assert_eq!(
        out,
        json!({
            "type": "object",
            "properties": {
                "home": {"description": "Home.", "type": "object",
                         "properties": {"city": {"type": "string"}}},
                "work": {"type": "string"},
                // `enum` holds data, not schemas: left alone.
                "tags": {"enum": [{"$ref": "#/$defs/NotASchema"}]},
            },
        })
    );
}

#[test]
fn recursive_definitions_stay_references() {
    // A tree, a pair of mutually recursive types, a reference to the root, and a
    // non-recursive type used by a recursive one.
    let out = common(json!({
        "type": "object",
        "properties": {
            "tree": {"$ref": "#/$defs/Node"},
            "even": {"$ref": "#/$defs/Even"},
            "again": {"$ref": "#"},
        },
        "$defs": {
            "Node": {"type": "object", "properties": {
                "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}},
                "tag": {"$ref": "#/$defs/Tag"}}},
            "Tag": {"type": "string"},
            "Even": {"type": "object", "properties": {"next": {"$ref": "#/$defs/Odd"}}},
            "Odd": {"type": "object", "properties": {"next": {"$ref": "#/$defs/Even"}}},
        },
    }));
    assert_eq!(out["properties"]["tree"], json!({"$ref": "#/$defs/Node"}));
    assert_eq!(out["properties"]["again"], json!({"$ref": "#"}));
    let defs = out["$defs"].as_object().expect("kept definitions");
    assert_eq!(defs.keys().collect::<Vec<_>>(), ["Even", "Node", "Odd"]);
    assert_eq!(
        defs["Node"]["properties"]["tag"],
        json!({"type": "string"}),
        "non-recursive references inside kept definitions are inlined"
    );
    // The strict pass keeps the references and makes every definition strict.
    let out = strict(out);
    for name in ["Even", "Node", "Odd"] {
        assert_eq!(out["$defs"][name]["additionalProperties"], false, "{name}");
    }
    assert_eq!(
        out["properties"]["again"],
        json!({"anyOf": [{"$ref": "#"}, {"type": "null"}]})
    );
}

#[test]
fn a_recursive_ref_with_siblings_is_unrolled_once_in_strict_mode() {
    let out = strict(json!({
        "type": "object",
        "properties": {"root": {"$ref": "#/$defs/Node", "description": "The root."}},
        "required": ["root"],
        "$defs": {"Node": {"type": "object", "description": "A node.", "properties": {
            "kids": {"type": "array", "items": {"$ref": "#/$defs/Node"}}}, "required": ["kids"]}},
    }));
    assert_eq!(
        out["properties"]["root"],
        json!({"type": "object", "description": "The root.", "additionalProperties": false,
               "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/Node"}}},
               "required": ["kids"]})
    );
}

#[test]
fn exponential_inlining_is_refused() {
    // Each level refers to the next twice: 2^30 nodes once inlined.
    let mut defs = Map::new();
    for i in 0..30 {
        defs.insert(
            format!("L{i}"),
            json!({"type": "object", "properties": {
                "a": {"$ref": format!("#/$defs/L{}", i + 1)},
                "b": {"$ref": format!("#/$defs/L{}", i + 1)}}}),
        );
    }
    defs.insert("L30".into(), json!({"type": "string"}));
    let schema =
        json!({"type": "object", "properties": {"x": {"$ref": "#/$defs/L0"}}, "$defs": defs});
    let err = input_schema(&spec(schema)).expect_err("too large");
    assert_eq!(err.kind, SchemaErrorKind::TooComplex);
}

#[test]
fn nullable_forms() {
    // Scalars get a type array; everything else an `anyOf` with a null branch.
    assert_eq!(
        make_nullable(json!({"type": "string", "description": "d"})),
        json!({"type": ["string", "null"], "description": "d"})
    );
    assert_eq!(
        make_nullable(json!({"type": "string", "enum": ["a"], "description": "d"})),
        json!({"description": "d", "anyOf": [{"type": "string", "enum": ["a"]}, {"type": "null"}]})
    );
    assert_eq!(
        make_nullable(json!({"anyOf": [{"type": "string"}, {"type": "integer"}]})),
        json!({"anyOf": [{"type": "string"}, {"type": "integer"}, {"type": "null"}]})
    );
    assert_eq!(
        make_nullable(json!({"$ref": "#/$defs/N"})),
        json!({"anyOf": [{"$ref": "#/$defs/N"}, {"type": "null"}]})
    );
    for already in [
        json!({"type": ["integer", "null"]}),
        json!({"type": "null"}),
        json!({"enum": ["a", null]}),
        json!({"anyOf": [{"type": "object"}, {"type": "null"}]}),
    ] {
        assert_eq!(make_nullable(already.clone()), already);
    }
}

#[test]
fn nullable_objects_arrays_and_enums_are_split_in_strict_mode() {
    let out = strict(json!({"type": "object", "properties": {
        "a": {"description": "A.", "type": ["object", "null"],
              "properties": {"x": {"type": "string"}}, "required": ["x"]},
        "e": {"type": ["string", "null"], "enum": ["x", "y", null]},
        "n": {"type": ["integer", "null"], "format": "int64"},
    }, "required": ["a", "e", "n"]}));
    assert_eq!(
        out["properties"],
        json!({
            "a": {"description": "A.", "anyOf": [
                {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"],
                 "additionalProperties": false},
                {"type": "null"}]},
            "e": {"anyOf": [{"type": "string", "enum": ["x", "y"]}, {"type": "null"}]},
            "n": {"type": ["integer", "null"]},
        })
    );
}

#[test]
fn strict_mode_drops_what_it_cannot_check_and_keeps_what_it_can() {
    let out = strict(json!({"type": "object", "title": "T", "properties": {
        "s": {"type": "string", "minLength": 1, "maxLength": 9, "pattern": "^a", "format": "email",
              "title": "S", "examples": ["a@b"], "deprecated": true},
        "u": {"type": "string", "format": "uri"},
        "n": {"type": "number", "minimum": 0, "exclusiveMaximum": 1, "multipleOf": 0.5,
              "format": "double", "default": 0.5},
        "l": {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3,
              "uniqueItems": true},
        "one": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
        "all": {"allOf": [{"type": "boolean"}], "description": "merged"},
    }, "required": ["s", "u", "n", "l", "one", "all"]}));
    assert_eq!(
        out["properties"],
        json!({
            "s": {"type": "string", "pattern": "^a", "format": "email"},
            "u": {"type": "string"},
            "n": {"type": "number", "minimum": 0, "exclusiveMaximum": 1, "multipleOf": 0.5},
            "l": {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3},
            "one": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
            "all": {"type": "boolean", "description": "merged"},
        })
    );
    assert!(out.get("title").is_none());
}

#[test]
fn root_unions_and_open_objects_are_refused_in_strict_mode() {
    let err = openai_strict_schema(&spec(json!({"type": "object", "anyOf": [
        {"properties": {"a": {"type": "string"}}}, {"properties": {"b": {"type": "string"}}}]})))
    .expect_err("root union");
    assert_eq!(err.pointer, "");
    assert!(matches!(err.kind, SchemaErrorKind::Unsupported(_)));
    let err = openai_strict_schema(&spec(
        json!({"type": "object", "additionalProperties": true}),
    ))
    .expect_err("open root");
    assert_eq!(err.pointer, "/additionalProperties");
    // Anthropic and MCP take both as they are.
    assert!(
        anthropic_tool(&spec(
            json!({"type": "object", "additionalProperties": true})
        ))
        .is_ok()
    );
}

#[test]
fn pointer_segments_are_escaped_and_decoded() {
    assert_eq!(decode_segment("a~1b~0c"), "a/b~c");
    assert_eq!(decode_segment("Wrapper%3CString%3E"), "Wrapper<String>");
    assert_eq!(decode_segment("100%"), "100%");
    let out = common(json!({"type": "object", "properties": {
        "w": {"$ref": "#/$defs/Wrapper%3CString%3E"},
        "s": {"$ref": "#/$defs/a~1b"}},
        "$defs": {"Wrapper<String>": {"type": "string"}, "a/b": {"type": "integer"}}}));
    assert_eq!(out["properties"]["w"], json!({"type": "string"}));
    assert_eq!(out["properties"]["s"], json!({"type": "integer"}));
}

#[test]
fn dropping_nulls_follows_the_schema() {
    let schema = json!({
        "type": "object",
        "properties": {
            "keep": {"type": ["string", "null"]},
            "opt": {"type": ["string", "null"]},
            "items": {"type": "array", "items": {"$ref": "#/$defs/Item"}},
            "target": {"$ref": "#/$defs/Target"},
            "ext": {"oneOf": [
                {"type": "object", "properties": {"A": {"$ref": "#/$defs/Item"}}, "required": ["A"]},
                {"type": "object", "properties": {"B": {"$ref": "#/$defs/Item"}}, "required": ["B"]}]},
            "free": {},
        },
        "required": ["keep", "items"],
        "$defs": {
            "Item": {"type": "object", "properties": {"n": {"type": "integer", "default": 1}}},
            "Target": {"oneOf": [
                {"type": "object", "properties": {"kind": {"const": "a"}, "x": {"type": "integer"}},
                 "required": ["kind"]},
                {"type": "object", "properties": {"kind": {"const": "b"}, "x": {"type": "string"}},
                 "required": ["kind", "x"]}]},
        },
    });
    let mut args = json!({
        "keep": null, "opt": null, "unknown": null,
        "items": [{"n": null}, {"n": 2}],
        "target": {"kind": "a", "x": null},
        "ext": {"B": {"n": null}},
        "free": {"n": null},
    });
    drop_optional_nulls(&schema, &mut args);
    assert_eq!(
        args,
        json!({
            // required stays null; unknown keys are not ours to judge
            "keep": null, "unknown": null,
            "items": [{}, {"n": 2}],
            "target": {"kind": "a"},
            "ext": {"B": {}},
            // a schema that says nothing about `n`
            "free": {"n": null},
        })
    );
    // A branch that cannot be told apart from another is left alone.
    let ambiguous = json!({"anyOf": [
        {"type": "object", "properties": {"x": {"type": "integer"}}},
        {"type": "object", "properties": {"x": {"type": "string"}}}]});
    let mut args = json!({"x": null});
    drop_optional_nulls(&ambiguous, &mut args);
    assert_eq!(args, json!({"x": null}));
}

#[test]
fn dropping_nulls_survives_hostile_schemas() {
    // Self-referencing aliases and a value nested deeper than any limit.
    let schema = json!({"$ref": "#/$defs/A", "$defs": {"A": {"$ref": "#/$defs/B"}, "B": {"$ref": "#/$defs/A"}}});
    let mut args = json!({"a": null});
    drop_optional_nulls(&schema, &mut args);
    assert_eq!(args, json!({"a": null}));

    let schema =
        json!({"$ref": "#", "type": "object", "properties": {"a": {"$ref": "#"}, "z": {}}});
    let mut deep = json!({"z": null});
    for _ in 0..400 {
        deep = json!({"a": deep, "z": null});
    }
    drop_optional_nulls(&schema, &mut deep);
}
