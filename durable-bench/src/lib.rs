//! Shared support for `durable`'s benches (not published).
//!
//! Every figure a bench reports is measured next to a raw sqlx baseline **in the same run**,
//! in rounds that interleave the figures (so background load hits them alike), and reported
//! as the median round. This crate holds what the SQLite and PostgreSQL benches share:
//!
//! - [`Samples`] and [`median`]: per-figure samples collected round by round;
//! - [`machine`]: the load average (`/proc/loadavg`), the cores, today's date;
//! - [`Report`] and [`Row`]: every figure with its baseline, ratio, target and pass/miss,
//!   printed as text and Markdown and written as `<backend>.json`;
//! - [`svg`]: small hand-written SVG plots (a line chart and a grouped bar chart), since no
//!   plotting crate is in the offline registry;
//! - [`harness`]: each figure measured the same way on every backend, against the raw
//!   side a bench supplies as a [`harness::Baseline`];
//! - [`workload`]: the durable side of each figure, the same on every backend (journaled
//!   calls, agent turns, many sessions at once, resume). The raw side is each bench's own;
//! - [`wakeup`]: how soon an idle worker pool starts a submitted session (the `wakeup`
//!   benches), notified against polling only.

pub mod child_wakeup;
pub mod harness;
pub mod limits;
pub mod machine;
mod report;
pub mod signal_wakeup;
pub mod svg;
pub mod wakeup;
pub mod workload;

use std::collections::BTreeMap;
use std::path::PathBuf;

pub use report::{Report, Row, Target, TargetOn};

/// The median of `values` (the mean of the two middle ones for an even count); `NaN` for
/// none.
pub fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// Samples of several figures, one per round each: a bench runs round after round, each
/// round measuring every figure once, and reports each figure's median round.
#[derive(Debug, Default, Clone)]
pub struct Samples {
    by_figure: BTreeMap<String, Vec<f64>>,
}

impl Samples {
    /// No samples yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records one round's value of `figure`.
    pub fn add(&mut self, figure: &str, value: f64) {
        self.by_figure
            .entry(figure.to_owned())
            .or_default()
            .push(value);
    }

    /// The median round of `figure` (`NaN` if it was never measured).
    pub fn median(&self, figure: &str) -> f64 {
        self.by_figure
            .get(figure)
            .map_or(f64::NAN, |values| median(values))
    }

    /// Every round's value of `figure`, in order.
    pub fn values(&self, figure: &str) -> &[f64] {
        self.by_figure.get(figure).map_or(&[], Vec::as_slice)
    }
}

/// A `usize` from the environment variable `name`, or `default` when unset or unparsable.
pub fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().replace('_', "").parse().ok())
        .unwrap_or(default)
}

/// Where a bench writes its JSON and SVGs: `DURABLE_BENCH_OUT`, else
/// `<workspace>/target/durable-bench`. Created if missing.
pub fn out_dir() -> std::io::Result<PathBuf> {
    let dir = match std::env::var_os("DURABLE_BENCH_OUT") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join("target")
            .join("durable-bench"),
    };
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert!(median(&[]).is_nan());
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        let mut samples = Samples::new();
        for v in [5.0, 1.0, 3.0] {
            samples.add("a", v);
        }
        assert_eq!(samples.median("a"), 3.0);
        assert_eq!(samples.values("a"), &[5.0, 1.0, 3.0]);
        assert!(samples.median("b").is_nan());
    }
}
