use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};

use proptest::prelude::*;
use serde::{Serialize, Serializer};
use serde_json::json;

use super::*;

fn refused<T: Serialize + ?Sized>(value: &T) -> (String, ArgumentErrorKind) {
    let error = to_journal_value(value).expect_err("refused");
    (error.path, error.kind)
}

fn non_finite(value: &(impl Serialize + ?Sized), path: &str) {
    assert_eq!(
        refused(value),
        (path.to_owned(), ArgumentErrorKind::NonFinite),
        "{path}"
    );
}

/// Accepted, and exactly what `serde_json::to_value` gives.
fn same<T: Serialize + ?Sized>(value: &T) -> Value {
    let journal = to_journal_value(value).expect("accepted");
    let plain = serde_json::to_value(value).expect("serializable");
    assert_eq!(journal, plain);
    // Also bit for bit (`Value`'s `==` would call `-0.0` and `0.0` equal).
    assert_eq!(journal.to_string(), plain.to_string());
    journal
}

#[derive(Serialize)]
struct Item {
    name: &'static str,
    price: f64,
}

#[derive(Serialize)]
struct Order {
    items: Vec<Item>,
    discount: Option<f64>,
    weights: Vec<Vec<f32>>,
    by_code: BTreeMap<String, f64>,
}

fn order() -> Order {
    Order {
        items: vec![Item {
            name: "a",
            price: 1.5,
        }],
        discount: Some(0.1),
        weights: vec![vec![1.0], vec![2.0, 3.0]],
        by_code: BTreeMap::from([("x".to_owned(), 4.0), ("weird key".to_owned(), 5.0)]),
    }
}

#[test]
fn non_finite_floats_are_refused_with_their_path() {
    for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        let mut o = order();
        o.items.push(Item {
            name: "b",
            price: bad,
        });
        non_finite(&o, "$.items[1].price");

        let mut o = order();
        o.discount = Some(bad);
        non_finite(&o, "$.discount");

        let mut o = order();
        o.by_code.insert("weird key".into(), bad);
        non_finite(&o, r#"$.by_code["weird key"]"#);

        non_finite(&bad, "$");
        non_finite(&[Some(1.0), None, Some(bad)], "$[2]");
    }
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let mut o = order();
        o.weights[1][1] = bad;
        non_finite(&o, "$.weights[1][1]");
    }
    // The first one in document order is named.
    let mut o = order();
    o.items[0].price = f64::NAN;
    o.discount = Some(f64::INFINITY);
    non_finite(&o, "$.items[0].price");
}

#[test]
fn paths_go_through_options_newtypes_and_every_enum_shape() {
    #[derive(Serialize)]
    struct Wrapper(Item);
    #[derive(Serialize)]
    enum Shape {
        Newtype(f64),
        Tuple(u8, f64),
        Struct { inner: Option<Box<Wrapper>> },
    }
    #[derive(Serialize)]
    #[serde(tag = "type")]
    enum Tagged {
        Point { x: f64 },
    }
    #[derive(Serialize)]
    #[serde(untagged)]
    enum Untagged {
        List(Vec<f64>),
    }
    #[derive(Serialize)]
    struct Flat {
        id: u8,
        #[serde(flatten)]
        extra: BTreeMap<&'static str, f64>,
    }

    non_finite(&Shape::Newtype(f64::NAN), "$.Newtype");
    non_finite(&Shape::Tuple(1, f64::INFINITY), "$.Tuple[1]");
    let item = Item {
        name: "n",
        price: f64::NAN,
    };
    let nested = Shape::Struct {
        inner: Some(Box::new(Wrapper(item))),
    };
    non_finite(&nested, "$.Struct.inner.price");
    non_finite(&vec![nested], "$[0].Struct.inner.price");
    non_finite(&Tagged::Point { x: f64::NAN }, "$.x");
    non_finite(&Untagged::List(vec![0.0, f64::NAN]), "$[1]");
    let flat = Flat {
        id: 1,
        extra: BTreeMap::from([("a", 1.0), ("b c", f64::NEG_INFINITY)]),
    };
    non_finite(&flat, r#"$["b c"]"#);
    // Map keys are named as serde_json writes them.
    non_finite(&BTreeMap::from([(7_u8, f64::NAN)]), r#"$["7"]"#);
    non_finite(&HashMap::from([(true, f64::NAN)]), "$.true");
}

#[test]
fn a_non_finite_float_key_is_refused_at_the_map() {
    struct FloatKeys(Vec<(f64, u8)>);
    impl Serialize for FloatKeys {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.collect_map(self.0.iter().map(|(k, v)| (k, v)))
        }
    }
    non_finite(&json_like(FloatKeys(vec![(1.5, 1), (f64::NAN, 2)])), "$.m");
    // A finite float key is whatever serde_json makes of it.
    same(&FloatKeys(vec![(1.5, 1)]));
}

#[derive(Serialize)]
struct Holder<T> {
    m: T,
}

fn json_like<T>(m: T) -> Holder<T> {
    Holder { m }
}

#[test]
fn finite_values_are_exactly_serde_jsons() {
    #[derive(Serialize)]
    struct Unit;
    #[derive(Serialize)]
    enum Every {
        Unit,
        Newtype(f64),
        Tuple(i64, f32),
        Struct { a: u64, b: Option<f64> },
    }
    same(&order());
    for float in [
        -0.0,
        0.0,
        1e308,
        -1e308,
        f64::MIN_POSITIVE,
        f64::MAX,
        f64::MIN,
        f64::EPSILON,
        5e-324,
    ] {
        same(&float);
        same(&json_like(float));
    }
    assert_eq!(same(&-0.0_f64).to_string(), "-0.0");
    for float in [-0.0_f32, f32::MAX, f32::MIN_POSITIVE, 0.1] {
        same(&float);
    }
    assert_eq!(same(&u64::MAX), json!(u64::MAX));
    assert_eq!(same(&i64::MIN), json!(i64::MIN));
    same(&u128::from(u64::MAX));
    same(&i128::from(i64::MIN));
    same(&"text with \"quotes\" and é 😀");
    same(&'c');
    same(&());
    same(&Unit);
    same(&None::<f64>);
    same(&b"bytes"[..]);
    same(&[
        Every::Unit,
        Every::Newtype(2.5),
        Every::Tuple(-1, 0.5),
        Every::Struct { a: 3, b: None },
        Every::Struct {
            a: u64::MAX,
            b: Some(-0.0),
        },
    ]);
    same(&BTreeMap::from([(1_i32, "one"), (-2, "minus two")]));
    same(&HashMap::from([('k', 1)]));
    // A Value cannot hold a non-finite float: it passes as it is.
    let value = json!({"a": [1, -0.0, 1e308, {"b": null}], "c": "d"});
    assert_eq!(same(&value), value);
}

#[test]
fn what_serde_json_refuses_is_unserializable_with_a_path() {
    let (path, kind) = refused(&json_like(BTreeMap::from([(vec![1_u8], 1)])));
    assert_eq!(path, "$.m");
    assert!(
        matches!(&kind, ArgumentErrorKind::Unserializable(m) if m.contains("key must be")),
        "{kind:?}"
    );
    assert!(
        kind.to_string()
            .starts_with("cannot be written as JSON: key must be")
    );

    let (path, kind) = refused(&json_like([0, 1].map(|i| u128::from(u64::MAX) + i)));
    assert_eq!(path, "$.m[1]");
    assert!(matches!(kind, ArgumentErrorKind::Unserializable(_)));

    // A failing `Serialize` impl: its message, at the value's path.
    let cell = RefCell::new(1.0_f64);
    let _borrowed = cell.borrow_mut();
    let (path, kind) = refused(&json_like(vec![&cell]));
    assert_eq!(path, "$.m[0]");
    assert!(
        matches!(&kind, ArgumentErrorKind::Unserializable(m) if m.contains("borrowed")),
        "{kind:?}"
    );
    assert_eq!(refused(&cell).0, "$");
}

#[test]
fn a_swallowed_refusal_still_refuses() {
    struct Careless(f64);
    impl Serialize for Careless {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            use serde::ser::SerializeSeq;
            let mut seq = s.serialize_seq(Some(1))?;
            let _ = seq.serialize_element(&self.0);
            seq.end()
        }
    }
    non_finite(&json_like(Careless(f64::NAN)), "$.m[0]");
    same(&Careless(1.0));
}

// ---------------------------------------------------------------------------------------
// Property: on any value, either exactly serde_json's output (and the value holds no
// non-finite float), or NonFinite at the path of the first non-finite float.

/// Every serde shape the journal meets, with floats that may be NaN or infinite.
#[derive(Debug, Clone, Serialize)]
enum Shape {
    Float(f64),
    Single(f32),
    Int(i64),
    UInt(u64),
    Text(String),
    Nothing,
    Maybe(Option<Box<Shape>>),
    List(Vec<Shape>),
    Map(BTreeMap<String, Shape>),
    IntKeys(BTreeMap<i8, Shape>),
    Pair(f64, Box<Shape>),
    Record { x: Option<f64>, rest: Box<Shape> },
    Wrapped(Newtype),
}

#[derive(Debug, Clone, Serialize)]
struct Newtype(Box<Shape>);

/// The test's own account of where the non-finite floats are, in document order.
fn non_finite_paths(shape: &Shape, path: &mut Vec<Step>, out: &mut Vec<String>) {
    fn float(x: f64, path: &[Step], out: &mut Vec<String>) {
        if !x.is_finite() {
            out.push(render(path));
        }
    }
    fn key(name: &str) -> Step {
        Step::Key(Cow::Owned(name.to_owned()))
    }
    fn inside(shape: &Shape, step: Step, path: &mut Vec<Step>, out: &mut Vec<String>) {
        path.push(step);
        non_finite_paths(shape, path, out);
        path.pop();
    }
    // Externally tagged: every variant's content sits under its name.
    match shape {
        Shape::Float(x) => {
            path.push(key("Float"));
            float(*x, path, out);
            path.pop();
        }
        Shape::Single(x) => {
            path.push(key("Single"));
            float(f64::from(*x), path, out);
            path.pop();
        }
        Shape::Int(_) | Shape::UInt(_) | Shape::Text(_) | Shape::Nothing => {}
        Shape::Maybe(inner) => {
            if let Some(inner) = inner {
                inside(inner, key("Maybe"), path, out);
            }
        }
        Shape::List(items) => {
            path.push(key("List"));
            for (i, item) in items.iter().enumerate() {
                inside(item, Step::Index(i), path, out);
            }
            path.pop();
        }
        Shape::Map(map) => {
            path.push(key("Map"));
            for (k, v) in map {
                inside(v, key(k), path, out);
            }
            path.pop();
        }
        Shape::IntKeys(map) => {
            path.push(key("IntKeys"));
            for (k, v) in map {
                inside(v, key(&k.to_string()), path, out);
            }
            path.pop();
        }
        Shape::Pair(x, rest) => {
            path.extend([key("Pair"), Step::Index(0)]);
            float(*x, path, out);
            path.pop();
            inside(rest, Step::Index(1), path, out);
            path.pop();
        }
        Shape::Record { x, rest } => {
            path.extend([key("Record"), key("x")]);
            if let Some(x) = x {
                float(*x, path, out);
            }
            path.pop();
            inside(rest, key("rest"), path, out);
            path.pop();
        }
        Shape::Wrapped(Newtype(inner)) => inside(inner, key("Wrapped"), path, out),
    }
}

fn render(path: &[Step]) -> String {
    render_path(path.iter().map(|step| match step {
        Step::Index(i) => Segment::Index(*i),
        Step::Key(k) => Segment::Key(k),
    }))
}

fn shapes() -> impl Strategy<Value = Shape> {
    // Mostly finite floats, so that both outcomes are common.
    let float = prop_oneof![3 => -1e6..1e6_f64, 1 => proptest::num::f64::ANY];
    let single = prop_oneof![3 => -1e6..1e6_f32, 1 => proptest::num::f32::ANY];
    let leaf = prop_oneof![
        float.clone().prop_map(Shape::Float),
        single.prop_map(Shape::Single),
        any::<i64>().prop_map(Shape::Int),
        any::<u64>().prop_map(Shape::UInt),
        "[a-z\"é ]{0,4}".prop_map(Shape::Text),
        Just(Shape::Nothing),
    ];
    leaf.prop_recursive(5, 48, 4, move |inner| {
        prop_oneof![
            proptest::option::of(inner.clone().prop_map(Box::new)).prop_map(Shape::Maybe),
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Shape::List),
            proptest::collection::btree_map("[a-z_ \"]{0,3}", inner.clone(), 0..4)
                .prop_map(Shape::Map),
            proptest::collection::btree_map(any::<i8>(), inner.clone(), 0..3)
                .prop_map(Shape::IntKeys),
            (float.clone(), inner.clone().prop_map(Box::new))
                .prop_map(|(x, rest)| Shape::Pair(x, rest)),
            (
                proptest::option::of(float.clone()),
                inner.clone().prop_map(Box::new)
            )
                .prop_map(|(x, rest)| Shape::Record { x, rest }),
            inner.prop_map(|s| Shape::Wrapped(Newtype(Box::new(s)))),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn journal_value_is_serde_json_or_names_a_non_finite_float(shape in shapes()) {
        let mut expected = Vec::new();
        non_finite_paths(&shape, &mut Vec::new(), &mut expected);
        match to_journal_value(&shape) {
            Ok(value) => {
                prop_assert!(expected.is_empty(), "accepted {shape:?}, non-finite at {expected:?}");
                let plain = serde_json::to_value(&shape).expect("serializable");
                prop_assert_eq!(value.to_string(), plain.to_string());
            }
            Err(error) => {
                prop_assert_eq!(error.kind, ArgumentErrorKind::NonFinite);
                prop_assert_eq!(Some(&error.path), expected.first(), "{:?}", shape);
            }
        }
    }
}
