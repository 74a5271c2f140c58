//! The ceilings of a session's [`Budget`](super::Budget): which ones exist ([`Limit`]),
//! what a call asks of them ([`Ask`]), and the refusal when one is reached
//! ([`BudgetExceeded`]).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::budget::{format_usd, usd_to_nano};
use crate::ids::SessionId;

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
                usd_to_nano(usd).map_err(|_| bad(EXPECTED))
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

/// What a call about to run asks of the budget: one model call, or one call of a tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Ask<'a> {
    /// A model call.
    Model,
    /// A call of the named tool.
    Tool(&'a str),
}

/// A ceiling was reached: the call that asked was refused before it ran, and nothing
/// ran. Returned by [`Budget::check_call`](super::Budget::check_call) and, as
/// [`DurableError::BudgetExceeded`](crate::DurableError::BudgetExceeded), by the journal
/// before a fresh model or tool call.
///
/// The harness decides what follows: tell the model (a tool result,
/// [`ToolResult::refused`](crate::ToolResult::refused)), stop, or park the session until
/// an operator raises the ceiling
/// ([`Session::park_for_budget`](crate::Session::park_for_budget)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct BudgetExceeded {
    /// The session, when the journal refused (`None` from a bare [`Budget`](super::Budget)).
    pub session: Option<SessionId>,
    /// The ceiling that was reached.
    pub limit: Limit,
    /// Its amount, in the limit's unit.
    pub ceiling: u64,
    /// What was spent against it so far (for [`Limit::WallTime`], the time elapsed).
    pub spent: u64,
    /// What the refused call asked: `Some(1)` for a call count; `None` when its cost is
    /// only known once it has run (money, tokens, time).
    pub asked: Option<u64>,
}

impl std::error::Error for BudgetExceeded {}

impl fmt::Display for BudgetExceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match &self.limit {
            Limit::Usd => "dollar".to_owned(),
            Limit::Tokens => "token".to_owned(),
            Limit::ModelCalls => "model-call".to_owned(),
            Limit::ToolCalls => "tool-call".to_owned(),
            Limit::WallTime => "wall-time".to_owned(),
            Limit::Tool(name) => format!("`{name}` call"),
        };
        write!(
            f,
            "budget exceeded: {} spent of the {} {what} ceiling",
            self.limit.format_amount(self.spent),
            self.limit.format_amount(self.ceiling),
        )?;
        if let Some(asked) = self.asked {
            write!(f, ", {asked} more asked")?;
        }
        f.write_str("; nothing ran. ")?;
        match &self.session {
            Some(session) => write!(
                f,
                "Raise it (`durable budget raise {session} {} <amount>`) or end the session",
                self.limit
            ),
            None => f.write_str("Raise the limit or end the session"),
        }
    }
}
