//! Text from the store, made safe for a terminal.
//!
//! Anything the store holds (model text, session and call ids, tool names, notes, error
//! messages, metadata) was written by an agent, a model or whoever can write the database.
//! Printed raw, `ESC ] 0;…BEL` retitles the operator's terminal, `ESC [ 1;31m` recolours
//! it, a carriage return or a bidi override hides or reorders what is shown, and one 1 MB
//! id pads every row of a table. So every such string goes through this module before it
//! reaches stdout or stderr:
//!
//! - [`escape`] shows control characters as visible escapes: `\e` (ESC), `\r`, `\n`, `\t`,
//!   `\u{7}` (BEL), `\u{9b}` (CSI and the other C1 controls), `\u{202e}` (bidi overrides),
//!   and so on. Everything else, including all printable Unicode, is kept.
//! - [`clip`] escapes and cuts to a width, ending with `…` (tables and one-line reports).
//! - [`json_text`] makes serialized JSON terminal-safe without changing its value: `--json`
//!   keeps every string whole and exact, and JSON's own escapes (`\u001b`, `\u009b`) carry
//!   the control characters.

use std::borrow::Cow;
use std::fmt::Write as _;

/// Width of an id (session, call) in tables: a UUID is 36, a readable id fits.
pub const ID: usize = 64;
/// Width of a short name (tool, app version, owner, status reason) in tables.
pub const NAME: usize = 64;
/// Width of a text cell (a message line, arguments, a note, an error message).
pub const TEXT: usize = 120;
/// Width of a whole `error: …` line.
pub const LINE: usize = 1000;

/// Whether `c` must not reach a terminal as itself: C0 controls (tab and newline
/// included: they break a table's columns and rows), DEL, C1 controls, and the Unicode
/// formatting characters that reorder or break lines (bidi embeddings, overrides and
/// isolates, the line and paragraph separators).
fn unsafe_char(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}'
                | '\u{200e}'
                | '\u{200f}'
                | '\u{2028}'
                | '\u{2029}'
                | '\u{202a}'..='\u{202e}'
                | '\u{2066}'..='\u{2069}'
        )
}

/// The visible form of an unsafe character.
fn push_escaped(out: &mut String, c: char) {
    match c {
        '\x1b' => out.push_str("\\e"),
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        other => {
            let _ = write!(out, "\\u{{{:x}}}", u32::from(other));
        }
    }
}

/// `text` with every control character shown as a visible escape (see the module docs).
/// Borrows when there is nothing to escape.
pub fn escape(text: &str) -> Cow<'_, str> {
    if !text.chars().any(unsafe_char) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if unsafe_char(c) {
            push_escaped(&mut out, c);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// `text` escaped and cut to at most `max` characters, the last one `…` when cut. Reads
/// only as much of `text` as it shows, so a megabyte costs nothing.
pub fn clip(text: &str, max: usize) -> String {
    let mut out = String::new();
    let mut width = 0;
    let mut piece = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        piece.clear();
        if unsafe_char(c) {
            push_escaped(&mut piece, c);
        } else {
            piece.push(c);
        }
        let w = piece.chars().count();
        // Room for the piece, and for `…` unless this is the last piece.
        let reserve = usize::from(chars.peek().is_some());
        if width + w + reserve > max {
            // Each earlier piece left room for this.
            out.push('…');
            return out;
        }
        out.push_str(&piece);
        width += w;
    }
    out
}

/// Serialized JSON made safe for a terminal with its value unchanged: serde_json already
/// escapes C0 controls in strings; this also escapes DEL, the C1 controls and the
/// line-breaking and bidi formatting characters as `\uXXXX`. Outside strings JSON holds
/// only ASCII punctuation, digits and whitespace, so every such character is inside a
/// string, where `\uXXXX` is the same character.
pub fn json_text(json: &str) -> Cow<'_, str> {
    if !json.chars().any(unsafe_char) {
        return Cow::Borrowed(json);
    }
    let mut out = String::with_capacity(json.len() + 16);
    for c in json.chars() {
        // Whitespace between tokens (pretty printing) stays.
        if unsafe_char(c) && !matches!(c, '\n' | '\t' | '\r' | ' ') {
            let _ = write!(out, "\\u{:04x}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_terminal_controls() {
        assert_eq!(escape("\x1b]0;pwned\x07"), "\\e]0;pwned\\u{7}");
        assert_eq!(escape("\x1b[1;31mred\x1b[0m"), "\\e[1;31mred\\e[0m");
        assert_eq!(escape("a\rb\nc\td\0e\x7f"), "a\\rb\\nc\\td\\u{0}e\\u{7f}");
        assert_eq!(escape("\u{9b}31m"), "\\u{9b}31m");
        assert_eq!(escape("abc\u{202e}fed"), "abc\\u{202e}fed");
        assert!(matches!(
            escape("héllo, 世界 ✓"),
            Cow::Borrowed("héllo, 世界 ✓")
        ));
    }

    #[test]
    fn clips_to_a_width_after_escaping() {
        assert_eq!(clip("short", 10), "short");
        assert_eq!(clip("exactly10!", 10), "exactly10!");
        assert_eq!(clip("eleven chars", 10), "eleven ch…");
        assert_eq!(clip("héllo wörld", 5), "héll…");
        // An escape is never cut in half: it goes whole or not at all.
        assert_eq!(clip("ab\x1b[0m", 4), "ab…");
        assert_eq!(clip("ab\x1b[0m", 5), "ab\\e…");
        assert_eq!(clip("ab\u{9b}", 5), "ab…");
        assert_eq!(clip("ab\u{9b}", 8), "ab\\u{9b}");
        assert_eq!(clip("abc", 0), "…");
        let huge = "x".repeat(1 << 20);
        assert_eq!(clip(&huge, ID).chars().count(), ID);
    }

    #[test]
    fn json_keeps_its_value_and_loses_raw_controls() {
        let value = serde_json::json!({"text": "\x1b]0;t\x07 \u{9b}1m \u{202e} \x7f", "n": [1, 2]});
        let pretty = serde_json::to_string_pretty(&value).expect("json");
        let safe = json_text(&pretty);
        assert!(!safe.chars().any(|c| unsafe_char(c) && c != '\n'), "{safe}");
        let back: serde_json::Value = serde_json::from_str(&safe).expect("still JSON");
        assert_eq!(back, value);
    }
}
