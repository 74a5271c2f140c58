//! What model usage costs: a [`PriceTable`] (per model: input, output and cached-input
//! tokens per million) turns a provider's [`Usage`] into the [`Spend`] a journal row
//! carries, so dollars are computed from usage, not guessed.

use std::collections::BTreeMap;

use super::budget::{InvalidAmount, Spend, usd_to_nano};

/// The prices of one model, in nano-dollars per million tokens (exact integers: $2.50
/// per million tokens is 2 500 000 000).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub struct Price {
    /// Per million input (prompt) tokens that were not read from a cache.
    pub input_per_million: u64,
    /// Per million output (completion) tokens, reasoning included.
    pub output_per_million: u64,
    /// Per million input tokens read from the provider's cache.
    pub cached_input_per_million: u64,
}

impl Price {
    /// Dollars per million input, output and cached-input tokens (checked as
    /// [`Spend::new`] checks an amount).
    pub fn usd_per_million(
        input: f64,
        output: f64,
        cached_input: f64,
    ) -> Result<Self, InvalidAmount> {
        Ok(Price {
            input_per_million: usd_to_nano(input)?,
            output_per_million: usd_to_nano(output)?,
            cached_input_per_million: usd_to_nano(cached_input)?,
        })
    }

    /// The spend of `usage` at these prices, rounded to the nearest nano-dollar
    /// (saturating at `u64::MAX`). Cached tokens are part of the input tokens (as
    /// providers report them) and are charged at the cached price; the tokens counted are
    /// input + output.
    pub fn spend(&self, usage: &Usage) -> Spend {
        let cached = usage.cached_input_tokens.min(usage.input_tokens);
        let fresh = usage.input_tokens - cached;
        // Each product fits in u128; their sum may not (saturates: the result is capped
        // at u64::MAX anyway).
        let scaled = (u128::from(fresh) * u128::from(self.input_per_million))
            .saturating_add(u128::from(cached) * u128::from(self.cached_input_per_million))
            .saturating_add(u128::from(usage.output_tokens) * u128::from(self.output_per_million));
        let nano = scaled.saturating_add(500_000) / 1_000_000;
        Spend::from_nano_usd(
            u64::try_from(nano).unwrap_or(u64::MAX),
            usage.input_tokens,
            usage.output_tokens,
        )
    }
}

/// The token usage a provider reported for one model reply: what
/// [`PriceTable::spend`] prices. `durable-openai` and `durable-rig` map their
/// providers' usage into it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub struct Usage {
    /// The model that answered, as the provider names it (`gpt-4o-mini-2024-07-18`);
    /// `None` to use the model the call names
    /// ([`Journal::with_model_name`](crate::Journal::with_model_name)).
    pub model: Option<String>,
    /// Every input token, cached ones included.
    pub input_tokens: u64,
    /// Every output token.
    pub output_tokens: u64,
    /// The part of `input_tokens` read from the provider's cache.
    pub cached_input_tokens: u64,
}

impl Usage {
    /// Usage of `input_tokens` and `output_tokens`, none cached, model unnamed.
    pub fn new(input_tokens: u64, output_tokens: u64) -> Self {
        Usage {
            model: None,
            input_tokens,
            output_tokens,
            cached_input_tokens: 0,
        }
    }

    /// The part of the input tokens read from the provider's cache.
    #[must_use]
    pub fn with_cached_input(mut self, tokens: u64) -> Self {
        self.cached_input_tokens = tokens;
        self
    }

    /// The model that answered.
    #[must_use]
    pub fn with_model(mut self, model: impl Into<String>) -> Self {
        self.model = Some(model.into());
        self
    }
}

/// Prices per model, given to a runtime with
/// [`DurableBuilder::prices`](crate::DurableBuilder::prices): a model call journaled
/// with its [`Usage`] ([`Journal::model_with_usage`](crate::Journal::model_with_usage))
/// is charged what the table says it cost.
///
/// A model is found by its exact name, else by the longest name in the table that
/// starts it followed by `-` (so `gpt-4o-mini` prices `gpt-4o-mini-2024-07-18`). A model
/// the table does not price costs no dollars (its tokens still count against the token
/// ceiling) and a warning says so: a dollar ceiling binds only on priced models.
///
/// ```
/// use durable_core::snapshot::{Price, PriceTable, Usage};
///
/// let prices = PriceTable::new()
///     .with("gpt-4o-mini", Price::usd_per_million(0.15, 0.60, 0.075)?);
/// let usage = Usage::new(10_000, 1_000).with_cached_input(4_000).with_model("gpt-4o-mini-2024-07-18");
/// let spend = prices.spend(&usage, None).expect("priced");
/// // 6 000 fresh × $0.15 + 4 000 cached × $0.075 + 1 000 out × $0.60, per million
/// assert_eq!(spend.nano_usd(), 900_000 + 300_000 + 600_000);
/// assert_eq!((spend.input_tokens(), spend.output_tokens()), (10_000, 1_000));
/// assert!(prices.spend(&Usage::new(1, 1).with_model("o3"), None).is_none());
/// # Ok::<(), durable_core::snapshot::InvalidAmount>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PriceTable {
    models: BTreeMap<String, Price>,
}

impl PriceTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// The table with `model`'s price set.
    #[must_use]
    pub fn with(mut self, model: impl Into<String>, price: Price) -> Self {
        self.models.insert(model.into(), price);
        self
    }

    /// Whether the table prices nothing.
    pub fn is_empty(&self) -> bool {
        self.models.is_empty()
    }

    /// The price of `model`: its own, else that of the longest name in the table that
    /// starts it followed by `-`.
    pub fn price(&self, model: &str) -> Option<&Price> {
        if let Some(price) = self.models.get(model) {
            return Some(price);
        }
        self.models
            .iter()
            .filter(|(name, _)| {
                model
                    .strip_prefix(name.as_str())
                    .is_some_and(|rest| rest.starts_with('-'))
            })
            .max_by_key(|(name, _)| name.len())
            .map(|(_, price)| price)
    }

    /// The spend of `usage`, priced for its model (or `model` when the usage names
    /// none); `None` when the table has no price for it.
    pub fn spend(&self, usage: &Usage, model: Option<&str>) -> Option<Spend> {
        let name = usage.model.as_deref().or(model)?;
        self.price(name).map(|price| price.spend(usage))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prices_round_to_the_nearest_nano_dollar_and_saturate() {
        let price = Price::usd_per_million(2.5, 10.0, 1.25).expect("price");
        // 1 token at $2.50/M is 2 500 nano-dollars.
        assert_eq!(price.spend(&Usage::new(1, 0)).nano_usd(), 2_500);
        assert_eq!(
            price.spend(&Usage::new(1_000_000, 0)).nano_usd(),
            2_500_000_000
        );
        assert_eq!(price.spend(&Usage::new(0, 3)).nano_usd(), 30_000);
        // Cached tokens above the input are capped at the input: 10 × $1.25/M.
        let odd = Usage::new(10, 0).with_cached_input(50);
        assert_eq!(price.spend(&odd).nano_usd(), 12_500);
        // Sub-nano-dollar token prices round to the nearest nano-dollar (half up).
        let cheap = Price::usd_per_million(0.0015, 0.0, 0.0).expect("price");
        assert_eq!(cheap.spend(&Usage::new(1, 0)).nano_usd(), 2); // 1.5
        assert_eq!(cheap.spend(&Usage::new(3, 0)).nano_usd(), 5); // 4.5
        let huge = Price {
            input_per_million: u64::MAX,
            output_per_million: u64::MAX,
            cached_input_per_million: 0,
        };
        assert_eq!(
            huge.spend(&Usage::new(u64::MAX, u64::MAX)).nano_usd(),
            u64::MAX
        );
        assert!(Price::usd_per_million(f64::NAN, 0.0, 0.0).is_err());
    }

    #[test]
    fn a_model_is_found_by_name_then_by_its_longest_dated_prefix() {
        let a = Price::usd_per_million(1.0, 0.0, 0.0).expect("a");
        let b = Price::usd_per_million(2.0, 0.0, 0.0).expect("b");
        let table = PriceTable::new().with("gpt-4o", a).with("gpt-4o-mini", b);
        assert_eq!(table.price("gpt-4o"), Some(&a));
        assert_eq!(table.price("gpt-4o-2024-08-06"), Some(&a));
        assert_eq!(table.price("gpt-4o-mini-2024-07-18"), Some(&b));
        assert_eq!(table.price("gpt-4"), None);
        assert_eq!(table.price("gpt-4omega"), None);
        // The usage's model wins over the call's.
        let usage = Usage::new(1_000_000, 0).with_model("gpt-4o-mini");
        assert_eq!(
            table.spend(&usage, Some("gpt-4o")).map(|s| s.nano_usd()),
            Some(2_000_000_000)
        );
        assert_eq!(
            table
                .spend(&Usage::new(1_000_000, 0), Some("gpt-4o"))
                .map(|s| s.nano_usd()),
            Some(1_000_000_000)
        );
        assert_eq!(table.spend(&Usage::new(1, 0), None), None);
    }
}
