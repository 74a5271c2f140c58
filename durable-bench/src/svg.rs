//! Small hand-written SVG plots: a line chart (linear or log x) and a grouped bar chart,
//! each with axes, ticks, labels, a title and a legend. Self-contained files that GitHub
//! renders inline from Markdown (`![…](docs/benchmarks/sqlite-turns.svg)`).

use std::fmt::Write as _;

const WIDTH: f64 = 760.0;
const HEIGHT: f64 = 420.0;
const LEFT: f64 = 84.0;
const RIGHT: f64 = 230.0;
const TOP: f64 = 48.0;
const BOTTOM: f64 = 62.0;
const COLORS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
];

/// One named line of a [`LineChart`]: `(x, y)` points in x order.
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// The points.
    pub points: Vec<(f64, f64)>,
}

impl Series {
    /// A series named `name`.
    pub fn new(name: impl Into<String>, points: Vec<(f64, f64)>) -> Self {
        Series {
            name: name.into(),
            points,
        }
    }
}

/// A line chart: y from 0, x linear or logarithmic (base 10).
#[derive(Debug, Clone)]
pub struct LineChart {
    /// Title above the plot.
    pub title: String,
    /// Label under the x axis.
    pub x_label: String,
    /// Label beside the y axis.
    pub y_label: String,
    /// A logarithmic x axis (every x must then be > 0).
    pub log_x: bool,
    /// The lines, drawn in order.
    pub series: Vec<Series>,
}

/// A grouped bar chart: one group per x label, one bar per series in each group.
#[derive(Debug, Clone)]
pub struct BarChart {
    /// Title above the plot.
    pub title: String,
    /// Label under the x axis.
    pub x_label: String,
    /// Label beside the y axis.
    pub y_label: String,
    /// The group labels, left to right.
    pub groups: Vec<String>,
    /// `(legend text, one value per group)`.
    pub series: Vec<(String, Vec<f64>)>,
}

/// Plot-area geometry shared by both charts.
struct Frame {
    y_max: f64,
}

impl Frame {
    fn plot_w() -> f64 {
        WIDTH - LEFT - RIGHT
    }

    fn plot_h() -> f64 {
        HEIGHT - TOP - BOTTOM
    }

    fn y(&self, value: f64) -> f64 {
        TOP + Self::plot_h() * (1.0 - value / self.y_max)
    }
}

impl LineChart {
    /// The chart as a standalone SVG document.
    pub fn render(&self) -> String {
        let points = self.series.iter().flat_map(|s| s.points.iter().copied());
        let (mut x_lo, mut x_hi, mut y_hi) = (f64::INFINITY, f64::NEG_INFINITY, 0.0_f64);
        for (x, y) in points.filter(|(x, y)| x.is_finite() && y.is_finite()) {
            let x = if self.log_x {
                x.max(f64::MIN_POSITIVE).log10()
            } else {
                x
            };
            x_lo = x_lo.min(x);
            x_hi = x_hi.max(x);
            y_hi = y_hi.max(y);
        }
        if !x_lo.is_finite() {
            (x_lo, x_hi) = (0.0, 1.0);
        }
        let x_ticks = if self.log_x {
            let (lo, hi) = (x_lo.floor(), x_hi.ceil().max(x_lo.floor() + 1.0));
            (x_lo, x_hi) = (lo, hi);
            (lo as i32..=hi as i32)
                .map(|e| (f64::from(e), tick_label(10f64.powi(e), 1.0)))
                .collect::<Vec<_>>()
        } else {
            let (ticks, step) = nice_ticks(x_lo, x_hi);
            (x_lo, x_hi) = (ticks[0], ticks[ticks.len() - 1]);
            ticks
                .into_iter()
                .map(|t| (t, tick_label(t, step)))
                .collect()
        };
        let (y_ticks, y_step) = nice_ticks(0.0, y_hi);
        let frame = Frame {
            y_max: y_ticks[y_ticks.len() - 1],
        };
        let x_px = |x: f64| {
            let x = if self.log_x {
                x.max(f64::MIN_POSITIVE).log10()
            } else {
                x
            };
            LEFT + Frame::plot_w() * (x - x_lo) / (x_hi - x_lo)
        };

        let mut svg = open(&self.title);
        axes(
            &mut svg,
            &frame,
            &y_ticks,
            y_step,
            &self.x_label,
            &self.y_label,
        );
        for (x, label) in &x_ticks {
            let px = LEFT + Frame::plot_w() * (x - x_lo) / (x_hi - x_lo);
            x_tick(&mut svg, px, label);
        }
        let names: Vec<&str> = self.series.iter().map(|s| s.name.as_str()).collect();
        for (i, series) in self.series.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            let mut coords = String::new();
            let visible = series
                .points
                .iter()
                .filter(|(x, y)| x.is_finite() && y.is_finite());
            for (x, y) in visible.clone() {
                let _ = write!(coords, "{:.1},{:.1} ", x_px(*x), frame.y(*y));
            }
            let _ = writeln!(
                svg,
                r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#,
                coords.trim_end()
            );
            if series.points.len() <= 40 {
                for (x, y) in visible {
                    let _ = writeln!(
                        svg,
                        r#"<circle cx="{:.1}" cy="{:.1}" r="3.5" fill="{color}"/>"#,
                        x_px(*x),
                        frame.y(*y)
                    );
                }
            }
        }
        legend(&mut svg, &names, true);
        svg.push_str("</svg>\n");
        svg
    }
}

impl BarChart {
    /// The chart as a standalone SVG document.
    pub fn render(&self) -> String {
        let y_hi = self
            .series
            .iter()
            .flat_map(|(_, values)| values.iter().copied())
            .filter(|v| v.is_finite())
            .fold(0.0_f64, f64::max);
        let (y_ticks, y_step) = nice_ticks(0.0, y_hi);
        let frame = Frame {
            y_max: y_ticks[y_ticks.len() - 1],
        };
        let mut svg = open(&self.title);
        axes(
            &mut svg,
            &frame,
            &y_ticks,
            y_step,
            &self.x_label,
            &self.y_label,
        );
        let group_w = Frame::plot_w() / self.groups.len().max(1) as f64;
        let bar_w = group_w * 0.8 / self.series.len().max(1) as f64;
        for (g, group) in self.groups.iter().enumerate() {
            let group_x = LEFT + group_w * g as f64;
            x_tick(&mut svg, group_x + group_w / 2.0, group);
            for (s, (_, values)) in self.series.iter().enumerate() {
                let value = values.get(g).copied().unwrap_or(f64::NAN);
                if !value.is_finite() {
                    continue;
                }
                let x = group_x + group_w * 0.1 + bar_w * s as f64;
                let y = frame.y(value);
                let _ = writeln!(
                    svg,
                    r#"<rect x="{x:.1}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="{}"><title>{}</title></rect>"#,
                    bar_w * 0.92,
                    TOP + Frame::plot_h() - y,
                    COLORS[s % COLORS.len()],
                    escape(&format!("{}: {}", self.series[s].0, tick_label(value, 1.0)))
                );
            }
        }
        let names: Vec<&str> = self.series.iter().map(|(n, _)| n.as_str()).collect();
        legend(&mut svg, &names, false);
        svg.push_str("</svg>\n");
        svg
    }
}

fn open(title: &str) -> String {
    let mut svg = format!(
        r#"<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">
<rect x="0" y="0" width="{WIDTH}" height="{HEIGHT}" fill="white"/>
"#
    );
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="26" text-anchor="middle" font-size="15" font-weight="bold">{}</text>"#,
        LEFT + Frame::plot_w() / 2.0,
        escape(title)
    );
    svg
}

/// The y grid, ticks and labels, both axis lines and both axis labels.
fn axes(svg: &mut String, frame: &Frame, y_ticks: &[f64], step: f64, x_label: &str, y_label: &str) {
    let right = LEFT + Frame::plot_w();
    let bottom = TOP + Frame::plot_h();
    for &t in y_ticks {
        let y = frame.y(t);
        let _ = writeln!(
            svg,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{right:.1}" y2="{y:.1}" stroke="#e4e4e4"/>"##
        );
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
            LEFT - 6.0,
            y + 4.0,
            escape(&tick_label(t, step))
        );
    }
    let _ = writeln!(
        svg,
        r#"<line x1="{LEFT}" y1="{bottom:.1}" x2="{right:.1}" y2="{bottom:.1}" stroke="black"/>"#
    );
    let _ = writeln!(
        svg,
        r#"<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{bottom:.1}" stroke="black"/>"#
    );
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
        LEFT + Frame::plot_w() / 2.0,
        HEIGHT - 16.0,
        escape(x_label)
    );
    let mid = TOP + Frame::plot_h() / 2.0;
    let _ = writeln!(
        svg,
        r#"<text x="18" y="{mid:.1}" text-anchor="middle" transform="rotate(-90 18 {mid:.1})">{}</text>"#,
        escape(y_label)
    );
}

fn x_tick(svg: &mut String, x: f64, label: &str) {
    let bottom = TOP + Frame::plot_h();
    let _ = writeln!(
        svg,
        r#"<line x1="{x:.1}" y1="{bottom:.1}" x2="{x:.1}" y2="{:.1}" stroke="black"/>"#,
        bottom + 5.0
    );
    let _ = writeln!(
        svg,
        r#"<text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
        bottom + 19.0,
        escape(label)
    );
}

fn legend(svg: &mut String, names: &[&str], lines: bool) {
    let x = WIDTH - RIGHT + 16.0;
    for (i, name) in names.iter().enumerate() {
        let y = TOP + 10.0 + 22.0 * i as f64;
        let color = COLORS[i % COLORS.len()];
        if lines {
            let _ = writeln!(
                svg,
                r#"<line x1="{x:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="{color}" stroke-width="3"/>"#,
                x + 22.0
            );
        } else {
            let _ = writeln!(
                svg,
                r#"<rect x="{x:.1}" y="{:.1}" width="22" height="10" fill="{color}"/>"#,
                y - 5.0
            );
        }
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}">{}</text>"#,
            x + 30.0,
            y + 4.0,
            escape(name)
        );
    }
}

/// Ticks at a 1/2/5 × 10ⁿ step covering `lo..=hi`, and the step.
fn nice_ticks(lo: f64, hi: f64) -> (Vec<f64>, f64) {
    let hi = if hi > lo { hi } else { lo + 1.0 };
    let raw = (hi - lo) / 5.0;
    let exp = 10f64.powf(raw.log10().floor());
    let step = match raw / exp {
        f if f <= 1.0 => exp,
        f if f <= 2.0 => 2.0 * exp,
        f if f <= 5.0 => 5.0 * exp,
        _ => 10.0 * exp,
    };
    let first = (lo / step).floor() as i64;
    let last = (hi / step).ceil() as i64;
    ((first..=last).map(|i| i as f64 * step).collect(), step)
}

/// A tick label with as many decimals as `step` needs, thousands separated.
fn tick_label(value: f64, step: f64) -> String {
    let decimals = if step >= 1.0 {
        0
    } else {
        (-step.log10().floor()) as usize
    };
    if decimals == 0 && value.abs() >= 1_000.0 {
        crate::report::number(value.round())
    } else if decimals == 0 {
        format!("{value:.0}")
    } else {
        format!("{value:.decimals$}")
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Checks that `svg` is well-formed XML of the shape we write: balanced tags, quoted
    /// attributes, no stray `<` or `&` in text, and every coordinate a finite number.
    fn check_well_formed(svg: &str) {
        let body = svg
            .strip_prefix(r#"<?xml version="1.0" encoding="UTF-8"?>"#)
            .expect("the XML declaration");
        let mut stack: Vec<&str> = Vec::new();
        let mut rest = body;
        let mut roots = 0;
        while let Some(open) = rest.find('<') {
            check_text(&rest[..open]);
            let close = rest[open..].find('>').expect("a tag closes") + open;
            let tag = &rest[open + 1..close];
            rest = &rest[close + 1..];
            if let Some(name) = tag.strip_prefix('/') {
                assert_eq!(stack.pop(), Some(name.trim()), "closing tag matches");
                continue;
            }
            let self_closing = tag.ends_with('/');
            let tag = tag.trim_end_matches('/');
            let (name, attrs) = tag.split_once(' ').unwrap_or((tag, ""));
            assert!(
                !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric()),
                "tag name {name:?}"
            );
            check_attributes(attrs);
            if stack.is_empty() {
                roots += 1;
            }
            if !self_closing {
                stack.push(name);
            }
        }
        check_text(rest);
        assert!(stack.is_empty(), "unclosed tags: {stack:?}");
        assert_eq!(roots, 1, "one root element");
    }

    fn check_text(text: &str) {
        for (i, _) in text.match_indices('&') {
            let entity = &text[i..text[i..].find(';').expect("entity ends") + i + 1];
            assert!(
                ["&amp;", "&lt;", "&gt;", "&quot;"].contains(&entity),
                "entity {entity}"
            );
        }
    }

    fn check_attributes(mut attrs: &str) {
        let numeric = [
            "x", "y", "x1", "y1", "x2", "y2", "cx", "cy", "r", "width", "height",
        ];
        loop {
            attrs = attrs.trim_start();
            if attrs.is_empty() {
                return;
            }
            let (name, after) = attrs.split_once("=\"").expect("name=\"value\"");
            let end = after.find('"').expect("closing quote");
            let value = &after[..end];
            assert!(!value.contains('<'), "no < in {name}");
            check_text(value);
            if numeric.contains(&name) {
                let v: f64 = value.parse().expect("a number");
                assert!(v.is_finite() && v >= 0.0, "{name}={value}");
            }
            if name == "points" {
                for pair in value.split_whitespace() {
                    let (x, y) = pair.split_once(',').expect("x,y");
                    for c in [x, y] {
                        assert!(c.parse::<f64>().expect("a number").is_finite());
                    }
                }
            }
            attrs = &after[end + 1..];
        }
    }

    #[test]
    fn line_chart_is_well_formed() {
        let chart = LineChart {
            title: "per-turn cost <sqlite> & more".into(),
            x_label: "turn".into(),
            y_label: "µs/turn".into(),
            log_x: false,
            series: vec![
                Series::new(
                    "durable",
                    (0..100)
                        .map(|i| (f64::from(i) * 100.0, 900.0 + f64::from(i)))
                        .collect(),
                ),
                Series::new("raw", vec![(0.0, 500.0), (9_900.0, 510.0)]),
            ],
        };
        let svg = chart.render();
        check_well_formed(&svg);
        assert!(svg.contains("&lt;sqlite&gt; &amp; more"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains(">10,000<"), "x ticks reach 10,000");

        let log = LineChart {
            log_x: true,
            series: vec![
                Series::new(
                    "durable",
                    vec![(100.0, 0.4), (1_000.0, 3.0), (10_000.0, 31.0)],
                ),
                Series::new("raw", vec![(100.0, 0.3), (1_000.0, 2.0), (10_000.0, 20.0)]),
            ],
            ..chart
        };
        let svg = log.render();
        check_well_formed(&svg);
        for tick in [">100<", ">1,000<", ">10,000<"] {
            assert!(svg.contains(tick), "log tick {tick}");
        }
    }

    #[test]
    fn bar_chart_is_well_formed() {
        let chart = BarChart {
            title: "calls/s".into(),
            x_label: "sessions at once".into(),
            y_label: "calls/s".into(),
            groups: vec!["1".into(), "8".into(), "32".into()],
            series: vec![
                ("pure".into(), vec![500.0, 2_000.0, 2_500.0]),
                ("unsafe_on_replay".into(), vec![250.0, 1_000.0, f64::NAN]),
                ("raw".into(), vec![900.0, 3_000.0, 3_500.0]),
            ],
        };
        let svg = chart.render();
        check_well_formed(&svg);
        // 8 bars (one NaN skipped) and 3 legend swatches, plus the background
        assert_eq!(svg.matches("<rect").count(), 8 + 3 + 1);
    }

    #[test]
    fn ticks() {
        assert_eq!(
            nice_ticks(0.0, 9.0),
            (vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0], 2.0)
        );
        assert_eq!(nice_ticks(0.0, 0.0).0.last(), Some(&1.0));
        assert_eq!(tick_label(0.25, 0.05), "0.25");
        assert_eq!(tick_label(12_000.0, 2_000.0), "12,000");
        assert_eq!(tick_label(0.0, 500.0), "0");
        assert_eq!(tick_label(5.0, 5.0), "5");
    }
}
