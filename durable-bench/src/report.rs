//! The figures of one bench run: printed as text and Markdown, written as JSON.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Value;

use crate::machine;

/// What a [`Target`] bounds: the durable figure itself, or its ratio to the raw baseline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TargetOn {
    /// The durable figure (a rate, or a ratio such as storage ÷ message bytes).
    Durable,
    /// Durable ÷ raw.
    Ratio,
}

/// A bound a figure should meet: at most or at least `value`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Target {
    /// What is bounded.
    pub on: TargetOn,
    /// `"<="` or `">="`.
    pub op: &'static str,
    /// The bound.
    pub value: f64,
}

impl Target {
    /// Durable ÷ raw at most `value`.
    pub fn ratio_at_most(value: f64) -> Self {
        Target {
            on: TargetOn::Ratio,
            op: "<=",
            value,
        }
    }

    /// The durable figure at most `value`.
    pub fn at_most(value: f64) -> Self {
        Target {
            on: TargetOn::Durable,
            op: "<=",
            value,
        }
    }

    /// The durable figure at least `value`.
    pub fn at_least(value: f64) -> Self {
        Target {
            on: TargetOn::Durable,
            op: ">=",
            value,
        }
    }

    fn met(&self, row: &Row) -> bool {
        let x = match self.on {
            TargetOn::Durable => row.durable,
            TargetOn::Ratio => row.ratio,
        };
        if self.op == ">=" {
            x >= self.value
        } else {
            x <= self.value
        }
    }

    fn text(&self, unit: &str) -> String {
        let op = if self.op == ">=" { "≥" } else { "≤" };
        match self.on {
            TargetOn::Ratio => format!("{op} {}× raw", number(self.value)),
            TargetOn::Durable if unit == "×" => format!("{op} {}×", number(self.value)),
            TargetOn::Durable => format!("{op} {} {unit}", number(self.value)),
        }
    }
}

/// One figure: durable, its raw baseline from the same run, their ratio, and its target.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// What was measured, e.g. "`pure` call".
    pub figure: String,
    /// The unit of `durable` and `raw`, e.g. "µs/call".
    pub unit: String,
    /// The durable figure.
    pub durable: f64,
    /// The raw baseline, measured in the same run.
    pub raw: f64,
    /// `durable / raw`.
    pub ratio: f64,
    /// The bound the figure should meet, if any (informational rows have none).
    pub target: Option<Target>,
    /// Whether the target is met (`None` without a target).
    pub pass: Option<bool>,
    /// How the baseline was measured, or anything else worth saying.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl Row {
    /// A row without a target.
    pub fn new(figure: impl Into<String>, unit: impl Into<String>, durable: f64, raw: f64) -> Self {
        Row {
            figure: figure.into(),
            unit: unit.into(),
            durable,
            raw,
            ratio: durable / raw,
            target: None,
            pass: None,
            note: None,
        }
    }

    /// Sets the target (and whether it is met).
    pub fn target(mut self, target: Target) -> Self {
        self.pass = Some(target.met(&self));
        self.target = Some(target);
        self
    }

    /// Adds a note.
    pub fn note(mut self, note: impl Into<String>) -> Self {
        self.note = Some(note.into());
        self
    }

    fn verdict(&self) -> &'static str {
        match self.pass {
            Some(true) => "pass",
            Some(false) => "MISS",
            None => "",
        }
    }
}

/// Every figure of one bench run, with what the machine was doing meanwhile.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// `"sqlite"` or `"postgres"`.
    pub backend: String,
    /// When the run started (UTC).
    pub date: String,
    /// Cores available to the bench.
    pub cores: usize,
    /// The checkout measured (`git describe --always --dirty`), if known.
    pub commit: Option<String>,
    /// Load averages (1, 5, 15 min) when the run started.
    pub load_before: Option<[f64; 3]>,
    /// Load averages when it ended.
    pub load_after: Option<[f64; 3]>,
    /// The run's settings (sizes, server version, durability settings, …).
    pub settings: BTreeMap<String, Value>,
    /// The figures, in the order printed.
    pub rows: Vec<Row>,
    /// The plotted data, by plot name.
    pub series: BTreeMap<String, Value>,
}

impl Report {
    /// A report for `backend`, stamped with the date, the cores and the load average now.
    pub fn new(backend: impl Into<String>) -> Self {
        Report {
            backend: backend.into(),
            date: machine::utc_now(),
            cores: machine::cores(),
            commit: machine::git_commit(),
            load_before: machine::load_average(),
            load_after: None,
            settings: BTreeMap::new(),
            rows: Vec::new(),
            series: BTreeMap::new(),
        }
    }

    /// Records a setting of the run.
    pub fn setting(&mut self, name: &str, value: impl Into<Value>) {
        self.settings.insert(name.to_owned(), value.into());
    }

    /// Adds a row and prints it.
    pub fn push(&mut self, row: Row) {
        println!("{}", text_line(&row));
        self.rows.push(row);
    }

    /// Stamps the load average at the end of the run.
    pub fn finish(&mut self) {
        self.load_after = machine::load_average();
    }

    /// The rows as a Markdown table (figure, durable, raw, ratio, target, pass/miss).
    pub fn markdown(&self) -> String {
        let mut out = String::from(
            "| figure | durable | raw (same run) | durable ÷ raw | target | |\n|---|---:|---:|---:|---|---|\n",
        );
        for row in &self.rows {
            out.push_str(&format!(
                "| {} | {} {} | {} {} | {:.2}× | {} | {} |\n",
                row.figure,
                number(row.durable),
                row.unit,
                number(row.raw),
                row.unit,
                row.ratio,
                row.target.map_or_else(String::new, |t| t.text(&row.unit)),
                row.verdict(),
            ));
        }
        out
    }

    /// Writes `<dir>/<backend>.json` and returns its path.
    pub fn write_json(&self, dir: &Path) -> std::io::Result<PathBuf> {
        let path = dir.join(format!("{}.json", self.backend));
        let json = serde_json::to_string_pretty(self).map_err(std::io::Error::other)?;
        std::fs::write(&path, json + "\n")?;
        Ok(path)
    }
}

fn text_line(row: &Row) -> String {
    format!(
        "{:<46} {:>11} {:<9} raw {:>11}   {:>6.2}×  {:<22} {}",
        row.figure,
        number(row.durable),
        row.unit,
        number(row.raw),
        row.ratio,
        row.target.map_or_else(String::new, |t| t.text(&row.unit)),
        row.verdict()
    )
}

/// A figure for people: thousands separated, three significant digits below 100.
pub fn number(x: f64) -> String {
    if !x.is_finite() {
        return format!("{x}");
    }
    let magnitude = x.abs();
    if magnitude >= 100.0 {
        let digits = format!("{:.0}", magnitude);
        let mut grouped = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i) % 3 == 0 {
                grouped.push(',');
            }
            grouped.push(c);
        }
        if x < 0.0 {
            grouped.insert(0, '-');
        }
        grouped
    } else if magnitude >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_and_targets() {
        let row =
            Row::new("`pure` call", "µs/call", 110.0, 100.0).target(Target::ratio_at_most(1.1));
        assert_eq!(row.pass, Some(true));
        let row =
            Row::new("calls/s", "calls/s", 9_000.0, 3_000.0).target(Target::at_least(10_000.0));
        assert_eq!(row.pass, Some(false));
        let mut report = Report::new("test");
        report.push(row);
        report.finish();
        let md = report.markdown();
        assert!(md.contains(
            "| calls/s | 9,000 calls/s | 3,000 calls/s | 3.00× | ≥ 10,000 calls/s | MISS |"
        ));
        let json = serde_json::to_value(&report).expect("json");
        assert_eq!(json["rows"][0]["pass"], false);
        assert_eq!(json["rows"][0]["target"]["op"], ">=");
    }

    #[test]
    fn numbers() {
        assert_eq!(number(1_234_567.4), "1,234,567");
        assert_eq!(number(-1_234.0), "-1,234");
        assert_eq!(number(100.0), "100");
        assert_eq!(number(12.34), "12.3");
        assert_eq!(number(1.234), "1.23");
    }
}
