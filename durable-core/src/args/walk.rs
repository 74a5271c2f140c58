//! Values in memory: one iterative walk over a [`Value`] that checks the depth and
//! integer rules and writes the compact JSON text `serde_json::to_string` would produce
//! into a [`Sink`], to count it ([`check_value`](super::check_value)'s size), to drop it
//! (a check alone) or to hash it (the fallback of `canonical::schema_fingerprint`). It
//! never recurses, so a value of any depth is walked on a constant stack.

use std::io;

use serde_json::Value;

use super::path::{Segment, render_path};
use super::{ArgumentError, ArgumentErrorKind, MAX_SAFE_INTEGER};

/// Drops a value of any depth on a constant stack. `Value`'s own `Drop` recurses once
/// per level, so a value too deep for the journal (refused by the walk) would overflow
/// the thread that drops it; this takes it apart level by level instead.
#[cfg(test)]
pub(crate) fn dismantle(value: Value) {
    let mut stack = vec![value];
    while let Some(value) = stack.pop() {
        match value {
            Value::Array(items) => stack.extend(items),
            Value::Object(map) => stack.extend(map.into_iter().map(|(_, v)| v)),
            _ => {}
        }
    }
}

/// Where the walk writes the compact JSON text.
pub(crate) trait Sink {
    /// Whether the sink wants the text at all (checking alone does not).
    const WANTS_TEXT: bool = true;
    /// Takes the next bytes of the text.
    fn put(&mut self, bytes: &[u8]);
}

/// Counts the bytes of the text.
pub(crate) struct Count(pub(crate) usize);

impl Sink for Count {
    fn put(&mut self, bytes: &[u8]) {
        self.0 += bytes.len();
    }
}

/// Drops the text: the walk only checks.
pub(crate) struct Discard;

impl Sink for Discard {
    const WANTS_TEXT: bool = false;
    fn put(&mut self, _: &[u8]) {}
}

struct SinkWriter<'s, S>(&'s mut S);

impl<S: Sink> io::Write for SinkWriter<'_, S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.put(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

enum Frame<'v> {
    Array {
        items: std::slice::Iter<'v, Value>,
        index: Option<usize>,
    },
    Object {
        members: serde_json::map::Iter<'v>,
        key: Option<&'v str>,
    },
}

fn frame_path(stack: &[Frame<'_>]) -> String {
    render_path(stack.iter().filter_map(|frame| match frame {
        Frame::Array { index, .. } => index.map(Segment::Index),
        Frame::Object { key, .. } => key.map(Segment::Key),
    }))
}

fn leaf<S: Sink, T: serde::Serialize + ?Sized>(
    sink: &mut S,
    leaf: &T,
    stack: &[Frame<'_>],
) -> Result<(), ArgumentError> {
    if !S::WANTS_TEXT {
        return Ok(());
    }
    serde_json::to_writer(SinkWriter(sink), leaf).map_err(|e| ArgumentError {
        path: frame_path(stack),
        kind: ArgumentErrorKind::Syntax(e.to_string()),
    })
}

/// Walks `root` in document order, writing its compact text into `sink`; refuses nesting
/// deeper than `max_depth` (when given) and, when `check_integers`, integers outside
/// ±(2^53−1), at the path of the value.
pub(crate) fn walk<S: Sink>(
    root: &Value,
    max_depth: Option<usize>,
    check_integers: bool,
    sink: &mut S,
) -> Result<(), ArgumentError> {
    let mut stack: Vec<Frame<'_>> = Vec::new();
    let mut next = root;
    loop {
        if matches!(next, Value::Array(_) | Value::Object(_))
            && let Some(limit) = max_depth
            && stack.len() >= limit
        {
            return Err(ArgumentError {
                path: frame_path(&stack),
                kind: ArgumentErrorKind::TooDeep { limit },
            });
        }
        match next {
            Value::Array(items) => {
                sink.put(b"[");
                stack.push(Frame::Array {
                    items: items.iter(),
                    index: None,
                });
            }
            Value::Object(members) => {
                sink.put(b"{");
                stack.push(Frame::Object {
                    members: members.iter(),
                    key: None,
                });
            }
            Value::Number(n) => {
                let exact = n
                    .as_u64()
                    .map(|u| u <= MAX_SAFE_INTEGER)
                    .or_else(|| n.as_i64().map(|i| i.unsigned_abs() <= MAX_SAFE_INTEGER))
                    .unwrap_or(true); // a float
                if check_integers && !exact {
                    return Err(ArgumentError {
                        path: frame_path(&stack),
                        kind: ArgumentErrorKind::IntegerOutOfRange(n.to_string()),
                    });
                }
                leaf(sink, n, &stack)?;
            }
            scalar => leaf(sink, scalar, &stack)?,
        }
        // Find the next value to visit, closing finished containers.
        loop {
            let Some(top) = stack.last_mut() else {
                return Ok(());
            };
            match top {
                Frame::Array { items, index } => match items.next() {
                    Some(item) => {
                        if index.is_some() {
                            sink.put(b",");
                        }
                        *index = Some(index.map_or(0, |i| i + 1));
                        next = item;
                        break;
                    }
                    None => {
                        sink.put(b"]");
                        stack.pop();
                    }
                },
                Frame::Object { members, key } => match members.next() {
                    Some((name, value)) => {
                        if key.is_some() {
                            sink.put(b",");
                        }
                        *key = Some(name);
                        next = value;
                        // The key is written with the frame pointing at it.
                        leaf(sink, name.as_str(), &stack)?;
                        sink.put(b":");
                        break;
                    }
                    None => {
                        sink.put(b"}");
                        stack.pop();
                    }
                },
            }
        }
    }
}
