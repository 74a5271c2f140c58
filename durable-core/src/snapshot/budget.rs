//! Spend tracking: [`Budget`] (what a session has spent, against optional limits) and
//! [`Spend`] (the cost of one journal row).
//!
//! Why money is counted in integer nano-dollars: see the [`snapshot`](crate::snapshot)
//! module docs.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::limit::{Ask, BudgetExceeded, Limit};

/// Nano-USD per USD.
pub use crate::store::limit::NANO_USD_PER_USD;

/// A dollar amount that cannot be counted: NaN or infinite, negative, or too large.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidAmount {
    /// NaN or ±infinity.
    #[error("amount {0} USD is not a finite number; report costs as finite, non-negative USD")]
    NotFinite(f64),
    /// Below zero.
    #[error("amount {0} USD is negative; costs and limits must be zero or more")]
    Negative(f64),
    /// More than `u64::MAX` nano-USD (about $18.4 billion).
    #[error("amount {0} USD is too large (at most 18446744073 USD); check the unit of the cost")]
    TooLarge(f64),
}

/// Converts dollars to nano-dollars, rounding to the nearest nano-dollar.
pub(super) fn usd_to_nano(usd: f64) -> Result<u64, InvalidAmount> {
    if !usd.is_finite() {
        return Err(InvalidAmount::NotFinite(usd));
    }
    if usd < 0.0 {
        return Err(InvalidAmount::Negative(usd));
    }
    let nano = (usd * NANO_USD_PER_USD as f64).round();
    // `u64::MAX as f64` is 2^64, one past the largest u64.
    if nano >= u64::MAX as f64 {
        return Err(InvalidAmount::TooLarge(usd));
    }
    Ok(nano as u64)
}

fn nano_to_usd(nano: u64) -> f64 {
    nano as f64 / NANO_USD_PER_USD as f64
}

/// The cost of one recorded model or tool call: what a journal row carries
/// ([`FinishCall::spend`](crate::store::FinishCall::spend)).
///
/// Charged to the [`Budget`] exactly once per journal row, so a replay that returns a
/// recorded result neither charges it again nor loses it. Construct it with
/// [`Spend::new`] (dollars, checked) or [`Spend::from_nano_usd`]. JSON shape:
/// `{"nano_usd":1500000,"input_tokens":1200,"output_tokens":300}`.
///
/// ```
/// use durable_core::Spend;
///
/// let spend = Spend::new(0.0015, 1200, 300)?;
/// assert_eq!(spend.nano_usd(), 1_500_000);
/// assert!(Spend::new(f64::NAN, 0, 0).is_err());
/// assert!(Spend::new(-0.01, 0, 0).is_err());
/// # Ok::<(), durable_core::snapshot::InvalidAmount>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct Spend {
    nano_usd: u64,
    input_tokens: u64,
    output_tokens: u64,
}

impl Spend {
    /// No cost.
    pub const ZERO: Spend = Spend::from_nano_usd(0, 0, 0);

    /// A spend in dollars (rounded to the nearest nano-dollar). Refuses NaN, infinities,
    /// negative amounts and amounts above about $18.4 billion. `-0.0` counts as zero.
    pub fn new(usd: f64, input_tokens: u64, output_tokens: u64) -> Result<Self, InvalidAmount> {
        Ok(Spend {
            nano_usd: usd_to_nano(usd)?,
            input_tokens,
            output_tokens,
        })
    }

    /// A spend in nano-dollars (exact).
    pub const fn from_nano_usd(nano_usd: u64, input_tokens: u64, output_tokens: u64) -> Self {
        Spend {
            nano_usd,
            input_tokens,
            output_tokens,
        }
    }

    /// The cost in USD (for display).
    pub fn usd(&self) -> f64 {
        nano_to_usd(self.nano_usd)
    }

    /// The cost in nano-USD (exact).
    pub const fn nano_usd(&self) -> u64 {
        self.nano_usd
    }

    /// Input (prompt) tokens.
    pub const fn input_tokens(&self) -> u64 {
        self.input_tokens
    }

    /// Output (completion) tokens.
    pub const fn output_tokens(&self) -> u64 {
        self.output_tokens
    }
}

/// Spend so far, against optional ceilings. Snapshotted in every checkpoint.
///
/// The ceilings ([`Limit`]): money, input + output tokens, model calls, tool calls,
/// wall time since the session started, and calls per tool. The journal checks them
/// *before* a fresh model or tool call ([`check_call`](Self::check_call)); a ceiling is
/// reached when what was spent is at it (a limit of zero is reached from the start), so
/// a call that would go past it is refused and nothing runs. Spend and counts are
/// charged once per journal row: a recorded reply or result replayed is charged once
/// and never refused. [`charge`](Self::charge) always records the spend, even past a
/// limit: the money is gone, and the record must say so.
///
/// Amounts are integer nano-USD (see the [module docs](crate::snapshot) for why), so charging the
/// same spends in the same order, with or without a checkpoint round-trip in between,
/// gives byte-identical JSON. The call counts and ceilings added later are left out of
/// the JSON while unused, and a budget written before them loads with none.
///
/// ```
/// use durable_core::{Budget, Spend};
///
/// let mut budget = Budget::unlimited().with_limit_usd(0.30)?.with_limit_tokens(10_000);
/// budget.charge(&Spend::new(0.10, 1000, 200)?);
/// budget.check()?; // $0.10 of $0.30 spent
/// budget.charge(&Spend::new(0.20, 1000, 200)?);
/// assert_eq!(budget.remaining_usd(), Some(0.0)); // exactly, no float drift
/// assert!(budget.is_exhausted());
/// let err = budget.check().unwrap_err();
/// assert_eq!(err.to_string(), "budget exceeded: $0.30 spent of the $0.30 dollar ceiling; nothing ran. Raise the limit or end the session");
///
/// let json = serde_json::to_string(&budget).unwrap();
/// assert_eq!(json, r#"{"spent_nano_usd":300000000,"input_tokens":2000,"output_tokens":400,"limit_nano_usd":300000000,"limit_tokens":10000}"#);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Budget {
    /// Money spent, in nano-USD.
    pub spent_nano_usd: u64,
    /// Input tokens spent.
    pub input_tokens: u64,
    /// Output tokens spent.
    pub output_tokens: u64,
    /// Money limit in nano-USD; `None` = unlimited.
    pub limit_nano_usd: Option<u64>,
    /// Limit on input + output tokens; `None` = unlimited.
    pub limit_tokens: Option<u64>,
    /// Model calls made (journaled replies, each once).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub model_calls: u64,
    /// Tool calls that ran (each journal row once).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub tool_calls: u64,
    /// Tool calls that ran, by tool.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tool_counts: BTreeMap<String, u64>,
    /// Limit on model calls; `None` = unlimited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_model_calls: Option<u64>,
    /// Limit on tool calls, every tool together; `None` = unlimited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_tool_calls: Option<u64>,
    /// Limit on the time since the session started, in ms; `None` = unlimited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_wall_ms: Option<u64>,
    /// Limits on the calls of single tools, by tool name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub limit_per_tool: BTreeMap<String, u64>,
    /// A child session's budget whose spend also counts against its parent's ceilings
    /// ([`StartOptions::with_spend_charged_to_parent`](crate::StartOptions::with_spend_charged_to_parent)):
    /// the parent charges what the child spent when it collects the child's outcome.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub charged_to_parent: bool,
}

/// `Err` when `spent` is at `ceiling` (none: unlimited).
fn reached(
    limit: Limit,
    ceiling: Option<u64>,
    spent: u64,
    asked: Option<u64>,
) -> Result<(), BudgetExceeded> {
    match ceiling {
        Some(ceiling) if spent >= ceiling => Err(BudgetExceeded {
            session: None,
            limit,
            ceiling,
            spent,
            asked,
        }),
        _ => Ok(()),
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// One ceiling of a budget against what was spent: a row of `durable show`'s budget.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Ceiling {
    /// The limit.
    pub limit: Limit,
    /// Spent against it (in the limit's unit).
    pub spent: u64,
    /// The ceiling (in the limit's unit).
    pub ceiling: u64,
}

impl Budget {
    /// Nothing spent, no limits.
    pub fn unlimited() -> Self {
        Budget::default()
    }

    /// Sets the money limit in dollars (rounded to the nearest nano-dollar).
    pub fn with_limit_usd(self, usd: f64) -> Result<Self, InvalidAmount> {
        Ok(self.with_limit_nano_usd(usd_to_nano(usd)?))
    }

    /// Sets the money limit in nano-dollars.
    pub fn with_limit_nano_usd(mut self, nano_usd: u64) -> Self {
        self.limit_nano_usd = Some(nano_usd);
        self
    }

    /// Sets the limit on input + output tokens.
    pub fn with_limit_tokens(mut self, tokens: u64) -> Self {
        self.limit_tokens = Some(tokens);
        self
    }

    /// Adds a spend (saturating). Always records it, even past a limit.
    pub fn charge(&mut self, spend: &Spend) {
        self.spent_nano_usd = self.spent_nano_usd.saturating_add(spend.nano_usd);
        self.input_tokens = self.input_tokens.saturating_add(spend.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(spend.output_tokens);
    }

    /// Money spent, in USD (for display).
    pub fn spent_usd(&self) -> f64 {
        nano_to_usd(self.spent_nano_usd)
    }

    /// Input + output tokens spent.
    pub fn total_tokens(&self) -> u64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }

    /// The money limit in USD, if any.
    pub fn limit_usd(&self) -> Option<f64> {
        self.limit_nano_usd.map(nano_to_usd)
    }

    /// Money left before the limit (zero once reached); `None` when unlimited.
    pub fn remaining_usd(&self) -> Option<f64> {
        self.remaining_nano_usd().map(nano_to_usd)
    }

    /// Money left in nano-USD (zero once reached); `None` when unlimited.
    pub fn remaining_nano_usd(&self) -> Option<u64> {
        self.limit_nano_usd
            .map(|limit| limit.saturating_sub(self.spent_nano_usd))
    }

    /// Tokens left before the limit (zero once reached); `None` when unlimited.
    pub fn remaining_tokens(&self) -> Option<u64> {
        self.limit_tokens
            .map(|limit| limit.saturating_sub(self.total_tokens()))
    }

    /// Whether a limit has been reached.
    pub fn is_exhausted(&self) -> bool {
        self.check().is_err()
    }

    /// `Ok` while no ceiling is reached (wall time and per-tool ceilings aside: they need
    /// the clock and the tool; see [`check_call`](Self::check_call)), otherwise the first
    /// one reached (money first).
    pub fn check(&self) -> Result<(), BudgetExceeded> {
        reached(Limit::Usd, self.limit_nano_usd, self.spent_nano_usd, None)?;
        reached(Limit::Tokens, self.limit_tokens, self.total_tokens(), None)?;
        reached(
            Limit::ModelCalls,
            self.limit_model_calls,
            self.model_calls,
            Some(1),
        )?;
        reached(
            Limit::ToolCalls,
            self.limit_tool_calls,
            self.tool_calls,
            Some(1),
        )
    }

    /// Whether the call `ask` may start, `elapsed_ms` after the session started: `Ok`
    /// unless a ceiling it counts against is reached (money, tokens, wall time, and the
    /// model-call or the tool-call and per-tool counts). What the journal runs before a
    /// fresh call.
    ///
    /// ```
    /// use durable_core::snapshot::{Ask, Budget, Limit};
    ///
    /// let mut budget = Budget::unlimited().with_limit_tool("send_email", 1);
    /// budget.check_call(Ask::Tool("send_email"), 0)?;
    /// budget.count_call(Ask::Tool("send_email"));
    /// let refused = budget.check_call(Ask::Tool("send_email"), 0).unwrap_err();
    /// assert_eq!((refused.limit, refused.spent, refused.asked), (Limit::Tool("send_email".into()), 1, Some(1)));
    /// budget.check_call(Ask::Tool("search"), 0)?; // other tools still run
    /// # Ok::<(), durable_core::snapshot::BudgetExceeded>(())
    /// ```
    pub fn check_call(&self, ask: Ask<'_>, elapsed_ms: u64) -> Result<(), BudgetExceeded> {
        reached(Limit::Usd, self.limit_nano_usd, self.spent_nano_usd, None)?;
        reached(Limit::Tokens, self.limit_tokens, self.total_tokens(), None)?;
        match ask {
            Ask::Model => reached(
                Limit::ModelCalls,
                self.limit_model_calls,
                self.model_calls,
                Some(1),
            )?,
            Ask::Tool(tool) => {
                reached(
                    Limit::ToolCalls,
                    self.limit_tool_calls,
                    self.tool_calls,
                    Some(1),
                )?;
                reached(
                    Limit::Tool(tool.to_owned()),
                    self.limit_per_tool.get(tool).copied(),
                    self.tool_count(tool),
                    Some(1),
                )?;
            }
        }
        reached(Limit::WallTime, self.limit_wall_ms, elapsed_ms, None)
    }

    /// Counts one call that ran (a model reply, or a tool call), past any ceiling.
    pub fn count_call(&mut self, call: Ask<'_>) {
        match call {
            Ask::Model => self.model_calls = self.model_calls.saturating_add(1),
            Ask::Tool(tool) => {
                self.tool_calls = self.tool_calls.saturating_add(1);
                let count = self.tool_counts.entry(tool.to_owned()).or_default();
                *count = count.saturating_add(1);
            }
        }
    }

    /// The calls of `tool` that ran.
    pub fn tool_count(&self, tool: &str) -> u64 {
        self.tool_counts.get(tool).copied().unwrap_or(0)
    }

    /// Sets the limit on model calls.
    pub fn with_limit_model_calls(mut self, calls: u64) -> Self {
        self.limit_model_calls = Some(calls);
        self
    }

    /// Sets the limit on tool calls (every tool together).
    pub fn with_limit_tool_calls(mut self, calls: u64) -> Self {
        self.limit_tool_calls = Some(calls);
        self
    }

    /// Sets the limit on the time since the session started.
    pub fn with_limit_wall_time(mut self, wall: std::time::Duration) -> Self {
        self.limit_wall_ms = Some(u64::try_from(wall.as_millis()).unwrap_or(u64::MAX));
        self
    }

    /// Sets the limit on the calls of one tool.
    pub fn with_limit_tool(mut self, tool: impl Into<String>, calls: u64) -> Self {
        self.limit_per_tool.insert(tool.into(), calls);
        self
    }

    /// The ceiling set for `limit`, if any (in the limit's unit).
    pub fn limit(&self, limit: &Limit) -> Option<u64> {
        match limit {
            Limit::Usd => self.limit_nano_usd,
            Limit::Tokens => self.limit_tokens,
            Limit::ModelCalls => self.limit_model_calls,
            Limit::ToolCalls => self.limit_tool_calls,
            Limit::WallTime => self.limit_wall_ms,
            Limit::Tool(name) => self.limit_per_tool.get(name).copied(),
        }
    }

    /// Sets (or, with `None`, removes) the ceiling `limit`.
    pub fn set_limit(&mut self, limit: &Limit, ceiling: Option<u64>) {
        match limit {
            Limit::Usd => self.limit_nano_usd = ceiling,
            Limit::Tokens => self.limit_tokens = ceiling,
            Limit::ModelCalls => self.limit_model_calls = ceiling,
            Limit::ToolCalls => self.limit_tool_calls = ceiling,
            Limit::WallTime => self.limit_wall_ms = ceiling,
            Limit::Tool(name) => match ceiling {
                Some(ceiling) => {
                    self.limit_per_tool.insert(name.clone(), ceiling);
                }
                None => {
                    self.limit_per_tool.remove(name);
                }
            },
        }
    }

    /// Raises the ceiling `limit` to `ceiling` if it is lower (an unlimited one stays
    /// unlimited): what an operator's raise does. Returns whether it changed.
    pub fn raise(&mut self, limit: &Limit, ceiling: u64) -> bool {
        match self.limit(limit) {
            Some(current) if current < ceiling => {
                self.set_limit(limit, Some(ceiling));
                true
            }
            _ => false,
        }
    }

    /// What was spent against `limit` (`elapsed_ms` for wall time).
    pub fn spent(&self, limit: &Limit, elapsed_ms: u64) -> u64 {
        match limit {
            Limit::Usd => self.spent_nano_usd,
            Limit::Tokens => self.total_tokens(),
            Limit::ModelCalls => self.model_calls,
            Limit::ToolCalls => self.tool_calls,
            Limit::WallTime => elapsed_ms,
            Limit::Tool(name) => self.tool_count(name),
        }
    }

    /// Every ceiling set, with what was spent against it (`elapsed_ms` for wall time),
    /// in the order `usd`, `tokens`, `model_calls`, `tool_calls`, `wall_time`, then per
    /// tool by name.
    pub fn ceilings(&self, elapsed_ms: u64) -> Vec<Ceiling> {
        let mut limits = vec![
            Limit::Usd,
            Limit::Tokens,
            Limit::ModelCalls,
            Limit::ToolCalls,
            Limit::WallTime,
        ];
        limits.extend(self.limit_per_tool.keys().cloned().map(Limit::Tool));
        limits
            .into_iter()
            .filter_map(|limit| {
                let ceiling = self.limit(&limit)?;
                Some(Ceiling {
                    spent: self.spent(&limit, elapsed_ms),
                    ceiling,
                    limit,
                })
            })
            .collect()
    }

    /// Fills each ceiling `self` leaves unset from `defaults` (spend is kept): how a
    /// runtime's default ceilings ([`DurableBuilder::budget`](crate::DurableBuilder::budget))
    /// apply to a session started with a budget of its own.
    pub fn with_defaults(mut self, defaults: &Budget) -> Self {
        for ceiling in defaults.ceilings(0) {
            if self.limit(&ceiling.limit).is_none() {
                self.set_limit(&ceiling.limit, Some(ceiling.ceiling));
            }
        }
        self
    }

    /// This budget (a child's) with its money, token and wall-time ceilings lowered to
    /// what `parent` has left of its own (`parent_elapsed_ms`: the parent's time since
    /// it started), and marked [`charged_to_parent`](Self::charged_to_parent): a child
    /// cannot spend more than its parent may. Ceilings the parent does not have are
    /// left as they are; a ceiling is never raised.
    ///
    /// ```
    /// use durable_core::{Budget, Spend};
    ///
    /// let mut parent = Budget::unlimited().with_limit_usd(1.00)?;
    /// parent.charge(&Spend::new(0.75, 0, 0)?);
    /// let child = Budget::unlimited().with_limit_usd(0.50)?.with_limit_tokens(9_000);
    /// let child = child.capped_by_parent(&parent, 0);
    /// assert_eq!(child.limit_usd(), Some(0.25)); // what the parent has left
    /// assert_eq!(child.limit_tokens, Some(9_000)); // the parent has no token ceiling
    /// assert!(child.charged_to_parent);
    /// # Ok::<(), durable_core::snapshot::InvalidAmount>(())
    /// ```
    pub fn capped_by_parent(mut self, parent: &Budget, parent_elapsed_ms: u64) -> Self {
        fn lower(own: Option<u64>, parent: Option<u64>) -> Option<u64> {
            match (own, parent) {
                (Some(own), Some(parent)) => Some(own.min(parent)),
                (own, parent) => own.or(parent),
            }
        }
        self.limit_nano_usd = lower(self.limit_nano_usd, parent.remaining_nano_usd());
        self.limit_tokens = lower(self.limit_tokens, parent.remaining_tokens());
        let wall_left = parent
            .limit_wall_ms
            .map(|limit| limit.saturating_sub(parent_elapsed_ms));
        self.limit_wall_ms = lower(self.limit_wall_ms, wall_left);
        self.charged_to_parent = true;
        self
    }

    /// What was spent (money and tokens) as one [`Spend`]: what a parent charges for a
    /// child whose budget is [`charged_to_parent`](Self::charged_to_parent).
    pub fn total_spend(&self) -> Spend {
        Spend::from_nano_usd(self.spent_nano_usd, self.input_tokens, self.output_tokens)
    }
}

#[cfg(test)]
mod tests;
