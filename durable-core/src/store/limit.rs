//! The names of a session's budget ceilings ([`Limit`]) and their amounts, read and
//! written as text. Part of the backend contract: operators' raises
//! ([`RaiseLimit`](super::RaiseLimit)) name a ceiling; the runtime's budget
//! (`durable_core::snapshot::Budget`) checks them.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Nano-dollars per dollar: the unit of money amounts.
pub const NANO_USD_PER_USD: u64 = 1_000_000_000;

/// Dollars to nano-dollars; `None` for a value that is not finite, negative or too large.
pub(crate) fn nano_from_usd(usd: f64) -> Option<u64> {
    if !usd.is_finite() || usd < 0.0 {
        return None;
    }
    let nano = (usd * NANO_USD_PER_USD as f64).round();
    // `u64::MAX as f64` is 2^64, one past the largest u64.
    (nano < u64::MAX as f64).then_some(nano as u64)
}

/// Exact decimal rendering, e.g. `$0.0015`, `$5.00`.
pub(crate) fn format_usd(nano: u64) -> String {
    let whole = nano / NANO_USD_PER_USD;
    let frac = format!("{:09}", nano % NANO_USD_PER_USD);
    let frac = frac.trim_end_matches('0');
    format!("${whole}.{frac:0<2}")
}

/// One ceiling of a session's budget. Its amounts are integers in the limit's unit:
/// nano-dollars for [`Usd`](Limit::Usd), tokens (input + output) for
/// [`Tokens`](Limit::Tokens), calls for the call counts, milliseconds since the session
/// started for [`WallTime`](Limit::WallTime).
///
/// Written as text (the CLI's `durable budget raise <session> <limit> <amount>`, the
/// console, stored raises): `usd`, `tokens`, `model_calls`, `tool_calls`, `wall_time`,
/// `tool:<name>`.
///
/// ```
/// use durable_core::snapshot::Limit;
///
/// let limit: Limit = "tool:send_email".parse()?;
/// assert_eq!(limit, Limit::Tool("send_email".into()));
/// assert_eq!(Limit::Usd.parse_amount("2.50")?, 2_500_000_000);
/// assert_eq!(Limit::WallTime.parse_amount("90s")?, 90_000);
/// assert_eq!(Limit::Usd.format_amount(2_500_000_000), "$2.50");
/// # Ok::<(), durable_core::snapshot::InvalidLimit>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Limit {
    /// Money spent, in nano-USD.
    Usd,
    /// Input + output tokens.
    Tokens,
    /// Model calls (journaled replies).
    ModelCalls,
    /// Tool calls that ran, every tool together.
    ToolCalls,
    /// Milliseconds since the session started (its creation time in the store).
    WallTime,
    /// Calls of one tool that ran.
    Tool(String),
}

/// A limit name or amount that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidLimit {
    /// Not a limit this release knows.
    #[error(
        "unknown limit `{0}`; expected one of `usd`, `tokens`, `model_calls`, `tool_calls`, `wall_time`, `tool:<name>`"
    )]
    Unknown(String),
    /// The amount does not parse in the limit's unit.
    #[error("`{amount}` is not an amount for `{limit}`: {expected}")]
    Amount {
        /// The limit.
        limit: String,
        /// The text given.
        amount: String,
        /// What the limit takes.
        expected: &'static str,
    },
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Limit::Usd => f.write_str("usd"),
            Limit::Tokens => f.write_str("tokens"),
            Limit::ModelCalls => f.write_str("model_calls"),
            Limit::ToolCalls => f.write_str("tool_calls"),
            Limit::WallTime => f.write_str("wall_time"),
            Limit::Tool(name) => write!(f, "tool:{name}"),
        }
    }
}

impl FromStr for Limit {
    type Err = InvalidLimit;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "usd" => Limit::Usd,
            "tokens" => Limit::Tokens,
            "model_calls" => Limit::ModelCalls,
            "tool_calls" => Limit::ToolCalls,
            "wall_time" => Limit::WallTime,
            other => match other.strip_prefix("tool:") {
                Some(name) if !name.is_empty() => Limit::Tool(name.to_owned()),
                _ => return Err(InvalidLimit::Unknown(other.to_owned())),
            },
        })
    }
}

impl Serialize for Limit {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Limit {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

impl Limit {
    /// Reads an amount written in the limit's unit for people: dollars for `usd`
    /// (`2.50`), a duration for `wall_time` (`90s`, `15m`, `2h`, or milliseconds
    /// `5000ms`; a bare number is seconds), a count otherwise.
    pub fn parse_amount(&self, text: &str) -> Result<u64, InvalidLimit> {
        let text = text.trim();
        let bad = |expected| InvalidLimit::Amount {
            limit: self.to_string(),
            amount: text.to_owned(),
            expected,
        };
        match self {
            Limit::Usd => {
                const EXPECTED: &str = "dollars, e.g. `2.50`";
                let usd: f64 = text
                    .trim_start_matches('$')
                    .parse()
                    .map_err(|_| bad(EXPECTED))?;
                nano_from_usd(usd).ok_or_else(|| bad(EXPECTED))
            }
            Limit::WallTime => {
                const EXPECTED: &str = "a duration, e.g. `90s`, `15m`, `2h` or `5000ms`";
                let (number, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
                    Some(at) => text.split_at(at),
                    None => (text, "s"),
                };
                let n: u64 = number.parse().map_err(|_| bad(EXPECTED))?;
                let ms_per = match unit {
                    "ms" => 1,
                    "s" => 1_000,
                    "m" => 60_000,
                    "h" => 3_600_000,
                    _ => return Err(bad(EXPECTED)),
                };
                n.checked_mul(ms_per).ok_or_else(|| bad(EXPECTED))
            }
            _ => text.parse().map_err(|_| bad("a whole number")),
        }
    }

    /// An amount in the limit's unit, for people: `$2.50`, `90s`, `1200`.
    pub fn format_amount(&self, amount: u64) -> String {
        match self {
            Limit::Usd => format_usd(amount),
            Limit::WallTime => format!("{}s", amount as f64 / 1000.0),
            _ => amount.to_string(),
        }
    }
}
