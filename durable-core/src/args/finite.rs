//! [`to_journal_value`]: `serde_json::to_value` for values built in memory, with the rules
//! model text gets from [`parse_json`](super::parse_json).

use std::borrow::Cow;
use std::fmt;

use serde::Serialize;
use serde::ser::{self, Serializer as _};
use serde_json::Value;

use super::path::{Segment, render_path};
use super::{ArgumentError, ArgumentErrorKind};

#[cfg(test)]
mod tests;

/// Serializes a value built in memory into the JSON the journal records, like
/// [`serde_json::to_value`], but refuses what that function would silently change.
///
/// `serde_json::to_value` writes `f32`/`f64` NaN, `INFINITY` and `NEG_INFINITY` as
/// `null`, so three different inputs would share one journal record and one input hash.
/// Here any non-finite float, wherever it is (a field, an element, a map value or key, an
/// enum variant's content), is refused with
/// [`NonFinite`](ArgumentErrorKind::NonFinite) and the JSON path of the value, in the
/// notation of [`ArgumentError::path`]; a float used as a map key is named by the map's
/// path. Every other value gives exactly what `serde_json::to_value` gives.
///
/// Map keys follow `serde_json`: strings, chars, integers, booleans and unit variants
/// become string keys (`{1: x}` is `{"1": x}`, and its path is `$["1"]`), and paths name
/// keys as they are written in the JSON.
///
/// # Errors
/// - [`ArgumentErrorKind::NonFinite`] at the path of the first non-finite float, in
///   document order.
/// - [`ArgumentErrorKind::Unserializable`] with `serde_json`'s message (or the message of
///   a failing `Serialize` impl) at the path of the value it refused: a map key that is
///   not a string, number, boolean or unit variant, an integer beyond 64 bits, a
///   `RefCell` that is mutably borrowed.
///
/// # Example
///
/// ```
/// use durable_core::args::to_journal_value;
/// use durable_core::ArgumentErrorKind;
/// use serde::Serialize;
///
/// #[derive(Serialize)]
/// struct Item {
///     price: f64,
/// }
///
/// let items = vec![Item { price: 2.5 }, Item { price: f64::NAN }];
/// // serde_json::to_value would journal `{"price":null}`.
/// let err = to_journal_value(&items).unwrap_err();
/// assert_eq!(err.path, "$[1].price");
/// assert_eq!(err.kind, ArgumentErrorKind::NonFinite);
///
/// let fine = to_journal_value(&items[..1])?;
/// assert_eq!(fine, serde_json::json!([{"price": 2.5}]));
/// # Ok::<(), durable_core::ArgumentError>(())
/// ```
pub fn to_journal_value<T: Serialize + ?Sized>(value: &T) -> Result<Value, ArgumentError> {
    let mut state = State::default();
    match value.serialize(Check(&mut state)) {
        Err(Refusal::At(error)) => return Err(error),
        Err(Refusal::Unplaced(message)) => return Err(unserializable("$".into(), message)),
        // A `Serialize` impl may have swallowed a refusal: it still stands.
        Ok(()) => {
            if let Some(error) = state.first {
                return Err(error);
            }
        }
    }
    serde_json::to_value(value).map_err(|error| unserializable("$".into(), error.to_string()))
}

fn unserializable(path: String, message: String) -> ArgumentError {
    ArgumentError {
        path,
        kind: ArgumentErrorKind::Unserializable(message),
    }
}

/// One step of the path: an array index or an object key (a field, a map key as
/// `serde_json` writes it, or the variant name of an externally tagged enum).
enum Step {
    Index(usize),
    Key(Cow<'static, str>),
}

#[derive(Default)]
struct State {
    path: Vec<Step>,
    first: Option<ArgumentError>,
}

impl State {
    fn here(&self) -> String {
        render_path(self.path.iter().map(|step| match step {
            Step::Index(index) => Segment::Index(*index),
            Step::Key(key) => Segment::Key(key),
        }))
    }

    /// Refuses the value at the current path (and remembers the first refusal).
    fn refuse(&mut self, kind: ArgumentErrorKind) -> Refusal {
        let error = ArgumentError {
            path: self.here(),
            kind,
        };
        self.first.get_or_insert_with(|| error.clone());
        Refusal::At(error)
    }

    /// Checks `value`, one `step` below the current path.
    fn nested<T: Serialize + ?Sized>(&mut self, step: Step, value: &T) -> Result<(), Refusal> {
        self.path.push(step);
        let result = value
            .serialize(Check(self))
            .map_err(|refusal| match refusal {
                // Raised by the value's own `Serialize` impl: it belongs here.
                Refusal::Unplaced(message) => Refusal::At(unserializable(self.here(), message)),
                placed => placed,
            });
        self.path.pop();
        result
    }
}

/// The error of [`Check`].
#[derive(Debug)]
enum Refusal {
    /// A refusal with its path.
    At(ArgumentError),
    /// A `Serialize` impl's own error, until it reaches the [`State::nested`] that knows
    /// its path.
    Unplaced(String),
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::At(error) => error.fmt(f),
            Refusal::Unplaced(message) => f.write_str(message),
        }
    }
}

impl std::error::Error for Refusal {}

impl ser::Error for Refusal {
    fn custom<M: fmt::Display>(message: M) -> Self {
        Refusal::Unplaced(message.to_string())
    }
}

/// A serializer that writes nothing: it walks the value, tracks the JSON path and
/// refuses non-finite floats.
struct Check<'a>(&'a mut State);

/// The state of a compound value being walked: the next element index, the pending map
/// key, and whether `end` leaves an enum variant's key.
struct Compound<'a> {
    state: &'a mut State,
    next: usize,
    key: Option<String>,
    variant: bool,
}

impl<'a> Compound<'a> {
    fn new(state: &'a mut State, variant: Option<&'static str>) -> Self {
        if let Some(variant) = variant {
            state.path.push(Step::Key(Cow::Borrowed(variant)));
        }
        Compound {
            state,
            next: 0,
            key: None,
            variant: variant.is_some(),
        }
    }

    fn element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Refusal> {
        let index = self.next;
        self.next += 1;
        self.state.nested(Step::Index(index), value)
    }

    fn end(self) -> Result<(), Refusal> {
        if self.variant {
            self.state.path.pop();
        }
        Ok(())
    }
}

macro_rules! accept {
    ($($method:ident($ty:ty)),* $(,)?) => {$(
        fn $method(self, _: $ty) -> Result<(), Refusal> {
            Ok(())
        }
    )*};
}

macro_rules! finite {
    ($($method:ident($ty:ty)),*) => {$(
        fn $method(self, v: $ty) -> Result<(), Refusal> {
            if v.is_finite() {
                Ok(())
            } else {
                Err(self.0.refuse(ArgumentErrorKind::NonFinite))
            }
        }
    )*};
}

/// 128-bit integers: `serde_json` decides (it keeps those that fit in 64 bits).
macro_rules! wide {
    ($($method:ident($ty:ty)),*) => {$(
        fn $method(self, v: $ty) -> Result<(), Refusal> {
            match serde_json::value::Serializer.$method(v) {
                Ok(_) => Ok(()),
                Err(error) => Err(self.0.refuse(ArgumentErrorKind::Unserializable(error.to_string()))),
            }
        }
    )*};
}

impl<'a> ser::Serializer for Check<'a> {
    type Ok = ();
    type Error = Refusal;
    type SerializeSeq = Compound<'a>;
    type SerializeTuple = Compound<'a>;
    type SerializeTupleStruct = Compound<'a>;
    type SerializeTupleVariant = Compound<'a>;
    type SerializeMap = Compound<'a>;
    type SerializeStruct = Compound<'a>;
    type SerializeStructVariant = Compound<'a>;

    accept!(
        serialize_bool(bool),
        serialize_i8(i8),
        serialize_i16(i16),
        serialize_i32(i32),
        serialize_i64(i64),
        serialize_u8(u8),
        serialize_u16(u16),
        serialize_u32(u32),
        serialize_u64(u64),
        serialize_char(char),
        serialize_str(&str),
        serialize_bytes(&[u8]),
        serialize_unit_struct(&'static str),
    );
    finite!(serialize_f32(f32), serialize_f64(f64));
    wide!(serialize_i128(i128), serialize_u128(u128));

    fn serialize_none(self) -> Result<(), Refusal> {
        Ok(())
    }

    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), Refusal> {
        value.serialize(self)
    }

    fn serialize_unit(self) -> Result<(), Refusal> {
        Ok(())
    }

    fn serialize_unit_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
    ) -> Result<(), Refusal> {
        Ok(())
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<(), Refusal> {
        value.serialize(self)
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<(), Refusal> {
        self.0.nested(Step::Key(Cow::Borrowed(variant)), value)
    }

    fn serialize_seq(self, _: Option<usize>) -> Result<Compound<'a>, Refusal> {
        Ok(Compound::new(self.0, None))
    }

    fn serialize_tuple(self, _: usize) -> Result<Compound<'a>, Refusal> {
        Ok(Compound::new(self.0, None))
    }

    fn serialize_tuple_struct(self, _: &'static str, _: usize) -> Result<Compound<'a>, Refusal> {
        Ok(Compound::new(self.0, None))
    }

    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        _: usize,
    ) -> Result<Compound<'a>, Refusal> {
        Ok(Compound::new(self.0, Some(variant)))
    }

    fn serialize_map(self, _: Option<usize>) -> Result<Compound<'a>, Refusal> {
        Ok(Compound::new(self.0, None))
    }

    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Compound<'a>, Refusal> {
        Ok(Compound::new(self.0, None))
    }

    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        _: usize,
    ) -> Result<Compound<'a>, Refusal> {
        Ok(Compound::new(self.0, Some(variant)))
    }
}

macro_rules! elements {
    ($($trait:ident::$method:ident),*) => {$(
        impl ser::$trait for Compound<'_> {
            type Ok = ();
            type Error = Refusal;

            fn $method<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Refusal> {
                self.element(value)
            }

            fn end(self) -> Result<(), Refusal> {
                Compound::end(self)
            }
        }
    )*};
}

elements!(
    SerializeSeq::serialize_element,
    SerializeTuple::serialize_element,
    SerializeTupleStruct::serialize_field,
    SerializeTupleVariant::serialize_field
);

macro_rules! fields {
    ($($trait:ident),*) => {$(
        impl ser::$trait for Compound<'_> {
            type Ok = ();
            type Error = Refusal;

            fn serialize_field<T: Serialize + ?Sized>(
                &mut self,
                key: &'static str,
                value: &T,
            ) -> Result<(), Refusal> {
                self.state.nested(Step::Key(Cow::Borrowed(key)), value)
            }

            fn end(self) -> Result<(), Refusal> {
                Compound::end(self)
            }
        }
    )*};
}

fields!(SerializeStruct, SerializeStructVariant);

impl ser::SerializeMap for Compound<'_> {
    type Ok = ();
    type Error = Refusal;

    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), Refusal> {
        // A non-finite float key is refused as such, at the map's path.
        key.serialize(Check(self.state))?;
        // Any other key is written exactly as serde_json writes it (or refused as it
        // refuses it): ask serde_json for a one-entry object and keep its key.
        let label = serde_json::value::Serializer
            .serialize_map(Some(1))
            .and_then(|mut map| {
                map.serialize_key(key)?;
                map.serialize_value(&())?;
                map.end()
            });
        match label {
            Ok(Value::Object(map)) => {
                self.key = map.into_iter().next().map(|(key, _)| key);
                Ok(())
            }
            Ok(_) => Ok(()),
            Err(error) => Err(self
                .state
                .refuse(ArgumentErrorKind::Unserializable(error.to_string()))),
        }
    }

    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Refusal> {
        let key = self.key.take().unwrap_or_default();
        self.state.nested(Step::Key(Cow::Owned(key)), value)
    }

    fn end(self) -> Result<(), Refusal> {
        Compound::end(self)
    }
}
