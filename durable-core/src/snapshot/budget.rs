//! Spend tracking: [`Budget`] (what a session has spent, against optional limits) and
//! [`Spend`] (the cost of one journal row).
//!
//! Why money is counted in integer nano-dollars: see the [`snapshot`](crate::snapshot)
//! module docs.

use serde::{Deserialize, Serialize};

/// Nano-USD per USD.
pub const NANO_USD_PER_USD: u64 = 1_000_000_000;

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
fn usd_to_nano(usd: f64) -> Result<u64, InvalidAmount> {
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

/// Exact decimal rendering, e.g. `$0.0015`, `$5.00`.
fn format_usd(nano: u64) -> String {
    let whole = nano / NANO_USD_PER_USD;
    let frac = format!("{:09}", nano % NANO_USD_PER_USD);
    let frac = frac.trim_end_matches('0');
    format!("${whole}.{frac:0<2}")
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

/// Spend so far, against optional limits. Snapshotted in every checkpoint.
///
/// The token limit applies to input plus output tokens. A budget is *exhausted* when
/// spend has reached a limit (a limit of zero is exhausted from the start);
/// [`check`](Self::check) is what a runtime calls before it starts a paid call.
/// [`charge`](Self::charge) always records the spend, even past a limit: the money is
/// gone, and the record must say so.
///
/// Amounts are integer nano-USD (see the [module docs](crate::snapshot) for why), so charging the
/// same spends in the same order, with or without a checkpoint round-trip in between,
/// gives byte-identical JSON.
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
/// assert_eq!(err.to_string(), "budget exhausted: spent $0.30 of the $0.30 limit; raise the limit or end the session");
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
}

/// A budget limit was reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BudgetExceeded {
    /// The money limit.
    #[error(
        "budget exhausted: spent {} of the {} limit; raise the limit or end the session",
        format_usd(*spent_nano_usd),
        format_usd(*limit_nano_usd)
    )]
    Usd {
        /// Spent, nano-USD.
        spent_nano_usd: u64,
        /// The limit, nano-USD.
        limit_nano_usd: u64,
    },
    /// The token limit.
    #[error(
        "token budget exhausted: spent {spent} of the {limit} token limit; raise the limit or end the session"
    )]
    Tokens {
        /// Input + output tokens spent.
        spent: u64,
        /// The limit.
        limit: u64,
    },
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

    /// `Ok` while both limits have room; otherwise the limit that was reached (money
    /// first). Call it before starting a paid call.
    pub fn check(&self) -> Result<(), BudgetExceeded> {
        if let Some(limit) = self.limit_nano_usd
            && self.spent_nano_usd >= limit
        {
            return Err(BudgetExceeded::Usd {
                spent_nano_usd: self.spent_nano_usd,
                limit_nano_usd: limit,
            });
        }
        if let Some(limit) = self.limit_tokens
            && self.total_tokens() >= limit
        {
            return Err(BudgetExceeded::Tokens {
                spent: self.total_tokens(),
                limit,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spend(usd: f64, input: u64, output: u64) -> Spend {
        Spend::new(usd, input, output).expect("valid spend")
    }

    #[test]
    fn spend_refuses_amounts_that_cannot_be_counted() {
        assert_eq!(
            Spend::new(f64::NAN, 0, 0).map_err(|e| matches!(e, InvalidAmount::NotFinite(_))),
            Err(true)
        );
        assert_eq!(
            Spend::new(f64::INFINITY, 0, 0),
            Err(InvalidAmount::NotFinite(f64::INFINITY))
        );
        assert_eq!(
            Spend::new(f64::NEG_INFINITY, 0, 0),
            Err(InvalidAmount::NotFinite(f64::NEG_INFINITY))
        );
        assert_eq!(
            Spend::new(-0.000_001, 0, 0),
            Err(InvalidAmount::Negative(-0.000_001))
        );
        assert_eq!(Spend::new(2e10, 0, 0), Err(InvalidAmount::TooLarge(2e10)));
        assert_eq!(Spend::new(-0.0, 0, 0), Ok(Spend::ZERO));
        assert_eq!(
            spend(18_000_000_000.0, 0, 0).nano_usd(),
            18_000_000_000 * NANO_USD_PER_USD
        );
        // Sub-micro-dollar prices survive.
        assert_eq!(spend(0.000_000_02, 1, 0).nano_usd(), 20);
        assert!(
            Spend::new(f64::NAN, 0, 0)
                .expect_err("nan")
                .to_string()
                .contains("not a finite number")
        );
    }

    #[test]
    fn charging_accumulates_and_limits_trip_at_the_limit() {
        let mut b = Budget::unlimited()
            .with_limit_usd(1.0)
            .expect("limit")
            .with_limit_tokens(1000);
        assert_eq!(b.check(), Ok(()));
        b.charge(&spend(0.25, 300, 100));
        b.charge(&spend(0.5, 200, 100));
        assert_eq!(b.spent_nano_usd, 750_000_000);
        assert_eq!(
            (b.input_tokens, b.output_tokens, b.total_tokens()),
            (500, 200, 700)
        );
        assert_eq!(b.spent_usd(), 0.75);
        assert_eq!(b.remaining_usd(), Some(0.25));
        assert_eq!(b.remaining_tokens(), Some(300));
        assert!(!b.is_exhausted());

        b.charge(&Spend::from_nano_usd(0, 250, 50));
        assert_eq!(
            b.check(),
            Err(BudgetExceeded::Tokens {
                spent: 1000,
                limit: 1000
            })
        );
        b.charge(&spend(0.3, 0, 0));
        // Money is reported first, and spend past the limit is still recorded.
        assert_eq!(
            b.check(),
            Err(BudgetExceeded::Usd {
                spent_nano_usd: 1_050_000_000,
                limit_nano_usd: 1_000_000_000
            })
        );
        assert_eq!(b.remaining_usd(), Some(0.0));
        assert_eq!(
            b.check().expect_err("exhausted").to_string(),
            "budget exhausted: spent $1.05 of the $1.00 limit; raise the limit or end the session"
        );
    }

    #[test]
    fn float_sums_that_drift_reach_the_limit_exactly() {
        // 0.1 + 0.2 > 0.3 in f64; in nano-dollars it is exactly the limit.
        let mut b = Budget::unlimited().with_limit_usd(0.3).expect("limit");
        b.charge(&spend(0.1, 0, 0));
        b.charge(&spend(0.2, 0, 0));
        assert_eq!(b.remaining_nano_usd(), Some(0));
        assert_eq!(b.spent_nano_usd, b.limit_nano_usd.expect("limit"));
    }

    #[test]
    fn unlimited_and_zero_limits() {
        let mut b = Budget::unlimited();
        b.charge(&Spend::from_nano_usd(u64::MAX, u64::MAX, 1));
        b.charge(&Spend::from_nano_usd(1, 1, 1));
        assert_eq!(b.spent_nano_usd, u64::MAX, "saturates, never wraps");
        assert_eq!(b.remaining_usd(), None);
        assert_eq!(b.check(), Ok(()));
        assert!(Budget::unlimited().with_limit_tokens(0).is_exhausted());
        assert!(Budget::unlimited().with_limit_nano_usd(0).is_exhausted());
    }

    #[test]
    fn json_is_pinned_and_byte_stable_across_a_checkpoint_round_trip() {
        let spends = [
            spend(0.001_234_567, 1500, 230),
            spend(0.1, 20, 5),
            spend(0.2, 7, 0),
            spend(0.000_000_015, 1, 1),
        ];
        // Crash-free: charge everything in one process.
        let mut straight = Budget::unlimited().with_limit_usd(2.5).expect("limit");
        for s in &spends {
            straight.charge(s);
        }
        // Replayed: checkpoint after two spends, restore from JSON, charge the rest as
        // read back from journal-row JSON.
        let mut first = Budget::unlimited().with_limit_usd(2.5).expect("limit");
        first.charge(&spends[0]);
        first.charge(&spends[1]);
        let snapshot = serde_json::to_string(&first).expect("serialize");
        let mut resumed: Budget = serde_json::from_str(&snapshot).expect("deserialize");
        for s in &spends[2..] {
            let row = serde_json::to_string(s).expect("serialize spend");
            resumed.charge(&serde_json::from_str::<Spend>(&row).expect("deserialize spend"));
        }
        let a = serde_json::to_string(&straight).expect("serialize");
        let b = serde_json::to_string(&resumed).expect("serialize");
        assert_eq!(a, b);
        assert_eq!(
            a,
            r#"{"spent_nano_usd":301234582,"input_tokens":1528,"output_tokens":236,"limit_nano_usd":2500000000,"limit_tokens":null}"#
        );
        assert_eq!(
            serde_json::to_string(&spends[0]).expect("serialize"),
            r#"{"nano_usd":1234567,"input_tokens":1500,"output_tokens":230}"#
        );
    }

    #[test]
    fn stored_json_with_floats_or_negatives_is_refused() {
        for bad in [
            r#"{"spent_nano_usd":1.5,"input_tokens":0,"output_tokens":0}"#,
            r#"{"spent_nano_usd":-1,"input_tokens":0,"output_tokens":0}"#,
            r#"{"spent_usd":0.5,"input_tokens":0,"output_tokens":0}"#,
        ] {
            assert!(serde_json::from_str::<Budget>(bad).is_err(), "{bad}");
        }
        assert!(
            serde_json::from_str::<Spend>(r#"{"nano_usd":-5,"input_tokens":0,"output_tokens":0}"#)
                .is_err()
        );
    }

    #[test]
    fn usd_formatting_is_exact() {
        assert_eq!(format_usd(0), "$0.00");
        assert_eq!(format_usd(1_500_000), "$0.0015");
        assert_eq!(format_usd(5 * NANO_USD_PER_USD), "$5.00");
        assert_eq!(format_usd(1), "$0.000000001");
        assert_eq!(format_usd(12_340_000_000), "$12.34");
    }
}
