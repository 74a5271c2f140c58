//! Output helpers: tables, times, sizes, masking and JSON.
//!
//! Every string that comes from the store reaches the terminal through
//! [`display`](crate::display): escaped, and clipped to a width in tables.

use std::time::{Duration, UNIX_EPOCH};

use comfy_table::{ContentArrangement, Table, presets};
use durable::{Block, Budget, Message, Plan};
use serde::Serialize;
use serde_json::Value;

use crate::display::{self, ID, NAME, TEXT, clip};
use crate::error::{CliError, Code};

/// A table with a plain, borderless look (like `kubectl get`), header underlined.
pub fn table<I, S>(header: I) -> Table
where
    I: IntoIterator<Item = S>,
    S: Into<comfy_table::Cell>,
{
    let mut table = Table::new();
    table
        .load_preset(presets::NOTHING)
        .set_content_arrangement(ContentArrangement::Disabled)
        .set_header(header);
    table.set_style(comfy_table::TableComponent::HeaderLines, '-');
    for column in table.column_iter_mut() {
        column.set_padding((0, 2));
    }
    table
}

/// Prints a table, without the padding comfy-table leaves at the end of each line.
///
/// Cells that come from the store are [`clip`]ped when added, which bounds the width; each
/// line is escaped once more here, so a cell added raw cannot reach the terminal as
/// control characters either.
pub fn print_table(table: &Table) {
    let lines: Vec<String> = table
        .lines()
        .map(|l| display::escape(l.trim_end()).into_owned())
        .collect();
    let is_rule = |l: &str| !l.is_empty() && l.chars().all(|c| c == '-');
    let width = lines
        .iter()
        .filter(|l| !is_rule(l))
        .map(|l| l.chars().count())
        .max()
        .unwrap_or(0);
    for line in &lines {
        if is_rule(line) {
            outln!("{}", "-".repeat(width));
        } else {
            outln!("{line}");
        }
    }
}

/// Prints `value` as pretty JSON on stdout: every value whole and exact, control
/// characters as JSON escapes ([`display::json_text`]).
static UNVERIFIED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Marks every output of this run as read without checking seals (`--unverified`): a
/// warning on stderr now, a first line `UNVERIFIED: …` before human output, and
/// `"unverified": true` in every JSON object printed.
pub fn mark_unverified(json: bool) {
    UNVERIFIED.store(true, std::sync::atomic::Ordering::Relaxed);
    eprintln!(
        "warning: --unverified: seals are not checked; what follows may have been changed \
         outside durable and must not be trusted to decide what ran"
    );
    if !json {
        outln!("UNVERIFIED (seals not checked; nothing below is authenticated)");
    }
}

fn unverified() -> bool {
    UNVERIFIED.load(std::sync::atomic::Ordering::Relaxed)
}

pub fn print_json<T: Serialize>(value: &T) -> Result<(), CliError> {
    if unverified() {
        let marked = match serde_json::to_value(value) {
            Ok(Value::Object(mut map)) => {
                map.insert("unverified".into(), Value::Bool(true));
                Value::Object(map)
            }
            Ok(other) => serde_json::json!({"unverified": true, "items": other}),
            Err(e) => {
                return Err(CliError::new(
                    Code::Failure,
                    format!("cannot encode JSON output: {e}"),
                ));
            }
        };
        return print_json_text(&marked);
    }
    print_json_text(value)
}

fn print_json_text<T: Serialize>(value: &T) -> Result<(), CliError> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|e| CliError::new(Code::Failure, format!("cannot encode JSON output: {e}")))?;
    outln!("{}", display::json_text(&text));
    Ok(())
}

/// `2026-11-22T04:40:35Z` for a time in ms since the epoch.
pub fn time(ms: i64) -> String {
    let Ok(ms) = u64::try_from(ms) else {
        return ms.to_string();
    };
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

/// `3m ago`, `2d ago`, or `in 25s` for a future time, relative to `now` (both ms).
pub fn age(ms: i64, now: i64) -> String {
    let delta = now - ms;
    let text = coarse(delta.unsigned_abs());
    if delta >= 0 {
        format!("{text} ago")
    } else {
        format!("in {text}")
    }
}

/// A millisecond span in its largest unit: `850ms`, `42s`, `12m`, `5h`, `3d`.
pub fn coarse(ms: u64) -> String {
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
pub fn size(bytes: usize) -> String {
    if bytes < 1024 {
        format!("{bytes} B")
    } else if bytes < 1024 * 1024 {
        format!("{:.1} KB", bytes as f64 / 1024.0)
    } else {
        format!("{:.1} MB", bytes as f64 / (1024.0 * 1024.0))
    }
}

/// Arguments (or any JSON) with secrets hidden, as the console hides them:
/// [`durable::secret::mask_for_display`].
pub fn mask(value: &Value) -> Value {
    durable::secret::mask_for_display(value)
}

/// Compact JSON of the masked value, escaped and cut to `max` characters.
pub fn compact(value: &Value, max: usize) -> String {
    clip(&mask(value).to_string(), max)
}

/// `2/5 done, 1/2 verified` for a plan snapshot, or `-`.
pub fn plan_progress(plan: &Value) -> String {
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
pub fn budget(value: &Value) -> String {
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

/// Width of one transcript line.
const LINE: usize = 160;

/// One transcript message: its role and its blocks as lines of text, secrets masked,
/// escaped and clipped.
pub fn message_lines(value: &Value) -> (String, Vec<String>) {
    let Ok(message) = serde_json::from_value::<Message>(value.clone()) else {
        return ("?".into(), vec![format!("(json) {}", compact(value, LINE))]);
    };
    let role = serde_json::to_value(message.role)
        .ok()
        .and_then(|r| r.as_str().map(str::to_owned))
        .unwrap_or_default();
    let lines = message
        .content
        .iter()
        .map(|block| match block {
            Block::Text { text } => clip(&text.replace('\n', " "), LINE),
            Block::Reasoning { text } => {
                format!("(reasoning) {}", clip(&text.replace('\n', " "), TEXT))
            }
            Block::ToolCall(call) => format!(
                "-> {}({}) [{}]",
                clip(&call.name, NAME),
                compact(&call.arguments, TEXT),
                clip(&call.id, ID)
            ),
            Block::ToolResult(result) => format!(
                "<- [{}]{} {}",
                clip(&result.call_id, ID),
                if result.is_error { " error:" } else { "" },
                compact(&result.content, TEXT)
            ),
        })
        .collect();
    (role, lines)
}

/// A table printed page by page as its rows come from the store, so a listing of any
/// length holds one page in memory: the columns take their widths from the first page
/// (at least the header's), and a later cell wider than its column pushes the rest of
/// its line along. Looks like [`table`]'s output; cells are clipped by the caller and
/// every line is escaped here.
pub struct StreamTable {
    header: Vec<String>,
    widths: Option<Vec<usize>>,
}

impl StreamTable {
    pub fn new<const N: usize>(header: [&str; N]) -> Self {
        StreamTable {
            header: header.iter().map(|h| (*h).to_owned()).collect(),
            widths: None,
        }
    }

    fn line(widths: &[usize], cells: &[String]) -> String {
        let mut line = String::new();
        for (i, cell) in cells.iter().enumerate() {
            line.push_str(cell);
            if i + 1 < cells.len() {
                let width = widths.get(i).copied().unwrap_or(0);
                let pad = width.saturating_sub(cell.chars().count()) + 2;
                line.extend(std::iter::repeat_n(' ', pad));
            }
        }
        display::escape(line.trim_end()).into_owned()
    }

    /// Prints a page of rows (the header first, before the first page).
    pub fn page(&mut self, rows: &[Vec<String>]) {
        if rows.is_empty() {
            return;
        }
        let widths = match &self.widths {
            Some(widths) => widths.clone(),
            None => {
                let mut widths: Vec<usize> =
                    self.header.iter().map(|h| h.chars().count()).collect();
                for row in rows {
                    for (w, cell) in widths.iter_mut().zip(row) {
                        *w = (*w).max(cell.chars().count());
                    }
                }
                let header = Self::line(&widths, &self.header);
                let rule: usize = widths.iter().sum::<usize>() + 2 * widths.len().saturating_sub(1);
                outln!("{header}");
                outln!("{}", "-".repeat(rule.max(header.chars().count())));
                self.widths = Some(widths.clone());
                widths
            }
        };
        for row in rows {
            outln!("{}", Self::line(&widths, row));
        }
    }
}

/// A JSON array printed element by element (pretty, like [`print_json`]): `[`, then each
/// element as it comes, then `]`; under `--unverified`, inside
/// `{"unverified": true, "items": […]}` as [`print_json`] marks an array.
pub struct JsonArray {
    count: usize,
}

impl JsonArray {
    pub fn begin() -> Self {
        if unverified() {
            outln!("{{\n  \"unverified\": true,\n  \"items\": [");
        } else {
            outln!("[");
        }
        JsonArray { count: 0 }
    }

    pub fn item<T: Serialize>(&mut self, value: &T) -> Result<(), CliError> {
        let text = serde_json::to_string_pretty(value)
            .map_err(|e| CliError::new(Code::Failure, format!("cannot encode JSON output: {e}")))?;
        let indent = if unverified() { "    " } else { "  " };
        let mut out = String::with_capacity(text.len() + 64);
        if self.count > 0 {
            out.push_str(",\n");
        }
        for (i, line) in text.lines().enumerate() {
            if i > 0 {
                out.push('\n');
            }
            out.push_str(indent);
            out.push_str(line);
        }
        self.count += 1;
        use std::io::Write as _;
        if write!(std::io::stdout().lock(), "{}", display::json_text(&out)).is_err() {
            std::process::exit(0);
        }
        Ok(())
    }

    pub fn end(self) {
        if self.count > 0 {
            outln!();
        }
        if unverified() {
            outln!("  ]\n}}");
        } else {
            outln!("]");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn masks_declared_and_sensitive_values_at_any_depth() {
        let args = json!({
            "to": "ann@example.com",
            "body": {"$secret": "v1:abc"},
            "auth": {"api_key": "sk-123", "Access-Key": "x", "user": "ann"},
            "headers": [{"Authorization": "Bearer t"}],
            "token_count": 5,
            "session_token": {"v": 1},
            "password": null
        });
        assert_eq!(
            mask(&args),
            json!({
                "to": "ann@example.com",
                "body": "<secret>",
                "auth": {"api_key": "***", "Access-Key": "***", "user": "ann"},
                "headers": [{"Authorization": "***"}],
                "token_count": 5,
                "session_token": "***",
                "password": null
            })
        );
    }

    #[test]
    fn times_sizes_and_truncation() {
        assert_eq!(time(0), "1970-01-01T00:00:00Z");
        assert_eq!(coarse(59_999), "59s");
        assert_eq!(age(1_000, 3 * 3_600_000), "2h ago");
        assert_eq!(age(10_000, 0), "in 10s");
        assert_eq!(size(2048), "2.0 KB");
        assert_eq!(
            compact(&json!({"t": "\u{1b}[1m"}), 100),
            r#"{"t":"\u001b[1m"}"#
        );
        assert_eq!(compact(&json!("\u{9b}abcdef"), 8), r#""\u{9b}…"#);
    }
}
