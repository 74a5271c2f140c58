//! Times, sizes, plan progress and budgets as the CLI shows them, and text made visible.

use std::time::{Duration, UNIX_EPOCH};

use durable::{Budget, Plan};
use serde_json::Value;

use crate::mask::mask;

/// `2026-11-22T04:40:35Z` for a time in ms since the epoch.
pub(crate) fn time(ms: i64) -> String {
    let Ok(ms) = u64::try_from(ms) else {
        return ms.to_string();
    };
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

/// `3m ago`, or `in 25s` for a future time, relative to `now` (both ms).
pub(crate) fn age(ms: i64, now: i64) -> String {
    let delta = now - ms;
    let text = coarse(delta.unsigned_abs());
    if delta >= 0 {
        format!("{text} ago")
    } else {
        format!("in {text}")
    }
}

/// A millisecond span in its largest unit: `850ms`, `42s`, `12m`, `5h`, `3d`.
pub(crate) fn coarse(ms: u64) -> String {
    const S: u64 = 1000;
    match ms {
        0..S => format!("{ms}ms"),
        S..60_000 => format!("{}s", ms / S),
        60_000..3_600_000 => format!("{}m", ms / 60_000),
        3_600_000..86_400_000 => format!("{}h", ms / 3_600_000),
        _ => format!("{}d", ms / 86_400_000),
    }
}

/// `1.2 KB` style sizes.
pub(crate) fn size(bytes: usize) -> String {
    if bytes < 1024 {
        format!("{bytes} B")
    } else if bytes < 1024 * 1024 {
        format!("{:.1} KB", bytes as f64 / 1024.0)
    } else {
        format!("{:.1} MB", bytes as f64 / (1024.0 * 1024.0))
    }
}

/// `2/5 steps, 1/2 checks` for a plan snapshot, or `-`.
pub(crate) fn plan_progress(plan: &Value) -> String {
    match serde_json::from_value::<Plan>(plan.clone()) {
        Ok(p) if p.is_empty() => "-".into(),
        Ok(p) => {
            let done = p.steps.iter().filter(|s| s.status.is_terminal()).count();
            let verified = p.postconditions.iter().filter(|c| c.satisfied).count();
            let mut text = format!("{done}/{} steps", p.steps.len());
            if !p.postconditions.is_empty() {
                text.push_str(&format!(", {verified}/{} checks", p.postconditions.len()));
            }
            text
        }
        Err(_) if plan.is_null() => "-".into(),
        Err(_) => "(unreadable)".into(),
    }
}

/// `$0.0123 of $1.00, 1234 tokens` for a budget snapshot, or `-`.
pub(crate) fn budget(value: &Value) -> String {
    match serde_json::from_value::<Budget>(value.clone()) {
        Ok(b) => {
            let mut text = format!("${:.4}", b.spent_usd());
            if let Some(limit) = b.limit_usd() {
                text.push_str(&format!(" of ${limit:.2}"));
            }
            text.push_str(&format!(", {} tokens", b.total_tokens()));
            if let Some(limit) = b.limit_tokens {
                text.push_str(&format!(" of {limit}"));
            }
            text
        }
        Err(_) if value.is_null() => "-".into(),
        Err(_) => "(unreadable)".into(),
    }
}

/// Whether `c` would hide or reorder what the operator reads: control characters and the
/// Unicode formatting characters that reorder or break lines (bidi overrides).
fn unsafe_char(c: char) -> bool {
    (c.is_control() && c != '\n' && c != '\t')
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

/// `text` with control and bidi characters shown as `\u{…}` and cut to `max` characters
/// (ending with `…`). HTML escaping is maud's job; this keeps the text honest.
pub(crate) fn visible(text: &str, max: usize) -> String {
    let mut out = String::new();
    for (n, c) in text.chars().enumerate() {
        if n == max {
            out.push('…');
            break;
        }
        if unsafe_char(c) {
            out.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    out
}

/// Compact JSON of the masked value, made visible and cut to `max` characters.
pub(crate) fn compact(value: &Value, max: usize) -> String {
    visible(&mask(value).to_string(), max)
}

/// Pretty JSON of the masked value, made visible and cut to `max` characters.
pub(crate) fn pretty(value: &Value, max: usize) -> String {
    let masked = mask(value);
    let text = serde_json::to_string_pretty(&masked).unwrap_or_else(|_| masked.to_string());
    visible(&text, max)
}

/// Pretty JSON of the masked value for a form to edit: complete (never cut), with the
/// characters [`visible`] shows escaped written as JSON `\uXXXX` escapes, so the text
/// parses back to the same value.
pub(crate) fn editable(value: &Value) -> String {
    let masked = mask(value);
    let text = serde_json::to_string_pretty(&masked).unwrap_or_else(|_| masked.to_string());
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if unsafe_char(c) {
            out.push_str(&format!("\\u{:04x}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    out
}

/// A duration in ms since the epoch for `30d`, `12h`, `90m` (humantime's grammar).
pub(crate) fn parse_duration(text: &str) -> Result<i64, String> {
    humantime::parse_duration(text.trim())
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .map_err(|e| {
            format!("`{text}`: {e}; expected a number and a unit, e.g. 30d, 12h, 90m, 1w or 2h30m")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shown_like_the_cli() {
        assert_eq!(time(0), "1970-01-01T00:00:00Z");
        assert_eq!(age(1_000, 3 * 3_600_000), "2h ago");
        assert_eq!(size(2048), "2.0 KB");
        assert_eq!(visible("a\u{202e}b\u{1b}", 10), "a\\u{202e}b\\u{1b}");
        assert_eq!(visible("abcdef", 3), "abc…");
        assert_eq!(parse_duration("2h"), Ok(7_200_000));
        assert!(parse_duration("soon").is_err());
        let tricky = serde_json::json!({"a": "x\u{202e}y", "s": {"$secret": "k"}});
        let text = editable(&tricky);
        assert!(!text.contains('\u{202e}'), "{text}");
        let back: Value = serde_json::from_str(&text).expect("parses");
        assert_eq!(
            back,
            serde_json::json!({"a": "x\u{202e}y", "s": "<secret>"})
        );
    }
}
