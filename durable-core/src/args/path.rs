//! The JSON path notation, rendered in one place: `$` for the root, then `[3]` for an
//! array index, `.name` for a key that is an ASCII identifier and `["other key"]`
//! (quoted as a JSON string) for any other key.
//!
//! Every path the crate reports is written here: [`ArgumentError::path`] (the scanner, the
//! walker, [`to_journal_value`](super::to_journal_value)), the paths of serde's refusals
//! in `macro_support::decode_args`, and the secret-argument checks ([`path_of_key`],
//! [`path_is_inside`]).
//!
//! [`ArgumentError::path`]: super::ArgumentError::path

use super::shorten;

/// One step of a JSON path.
pub(crate) enum Segment<'a> {
    /// An array element.
    Index(usize),
    /// An object member.
    Key(&'a str),
    /// A step serde could not name (`serde_path_to_error`'s `Unknown`): `[?]`.
    Unknown,
}

/// Renders a path in the notation of [`ArgumentError::path`](super::ArgumentError::path):
/// a quoted key longer than 64 characters is shortened with `…` (the text may be a
/// model's, and hostile).
pub(crate) fn render_path<'a>(segments: impl IntoIterator<Item = Segment<'a>>) -> String {
    render(segments, Keys::Shortened)
}

/// Renders the path of a serde refusal (`serde_path_to_error`), keys in full: the paths
/// `decode_args` reports have always named whole keys, and `replay_check` compares them
/// with the keys of recorded arguments.
pub(crate) fn render_serde_path(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment as Serde;
    let segments = path.iter().map(|segment| match segment {
        Serde::Seq { index } => Segment::Index(*index),
        Serde::Map { key } | Serde::Enum { variant: key } => Segment::Key(key),
        Serde::Unknown => Segment::Unknown,
    });
    render(segments, Keys::Whole)
}

/// The path of a top-level key (`$.name`, or `$["odd key"]`).
pub(crate) fn path_of_key(key: &str) -> String {
    render_path(std::iter::once(Segment::Key(key)))
}

/// The path [`render_serde_path`] writes for a top-level key: the key in full.
pub(crate) fn path_of_whole_key(key: &str) -> String {
    render(std::iter::once(Segment::Key(key)), Keys::Whole)
}

/// Whether `path` is the top-level key `key` or inside it.
pub(crate) fn path_is_inside(path: &str, key: &str) -> bool {
    let prefix = path_of_key(key);
    path.strip_prefix(&prefix)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('.') || rest.starts_with('['))
}

/// How quoted keys are written.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Keys {
    Shortened,
    Whole,
}

fn render<'a>(segments: impl IntoIterator<Item = Segment<'a>>, keys: Keys) -> String {
    let mut path = String::from("$");
    for segment in segments {
        match segment {
            Segment::Index(i) => {
                path.push('[');
                path.push_str(&i.to_string());
                path.push(']');
            }
            Segment::Unknown => path.push_str("[?]"),
            Segment::Key(key) => {
                let mut chars = key.chars();
                let ident = chars
                    .next()
                    .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                    && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
                if ident {
                    path.push('.');
                    path.push_str(key);
                } else {
                    let key = match keys {
                        Keys::Shortened => shorten(key),
                        Keys::Whole => key.into(),
                    };
                    path.push('[');
                    match serde_json::to_string(key.as_ref()) {
                        Ok(quoted) => path.push_str(&quoted),
                        Err(_) => path.push_str(&format!("{key:?}")),
                    }
                    path.push(']');
                }
            }
        }
    }
    path
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn odd_keys_are_quoted_in_paths() {
        let segments = || {
            [
                Segment::Key("weird key"),
                Segment::Key("ok_1"),
                Segment::Index(2),
            ]
        };
        assert_eq!(render_path(segments()), "$[\"weird key\"].ok_1[2]");
        assert_eq!(render(segments(), Keys::Whole), "$[\"weird key\"].ok_1[2]");
        assert_eq!(render_path([Segment::Unknown]), "$[?]");
    }

    #[test]
    fn only_argument_error_paths_shorten_long_keys() {
        let long = "a key ".repeat(20);
        let shortened = render_path([Segment::Key(&long)]);
        assert!(shortened.ends_with("…\"]"), "{shortened}");
        assert_eq!(shortened, path_of_key(&long));
        let whole = render([Segment::Key(&long)], Keys::Whole);
        assert_eq!(whole, format!("$[{}]", serde_json::Value::String(long)));
    }
}
