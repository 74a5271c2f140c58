//! State snapshotted in every checkpoint besides the transcript: the agent's [`Plan`]
//! and its [`Budget`].
//!
//! Both are plain serde values. A checkpoint stores them as JSON
//! ([`NewCheckpoint::plan`](crate::store::NewCheckpoint::plan),
//! [`NewCheckpoint::budget`](crate::store::NewCheckpoint::budget)), and resume restores
//! them, so a long session keeps its plan across compaction and crashes, and its spend
//! across processes.
//!
//! - [`Plan`] is the structured plan with the *finalization gate*: steps and
//!   postconditions that the model marks with evidence, and
//!   [`Plan::is_ready_to_finalize`], which a harness checks before it accepts a final
//!   answer. The model cannot self-certify completion; the harness decides.
//! - [`Budget`] tracks money and tokens against optional limits. Spend is charged once
//!   per journal row ([`Spend`] is what a row carries), so a replay neither
//!   double-counts nor loses it.
//!
//! # Money is counted in integer nano-dollars
//!
//! Amounts are stored as `u64` nano-USD (10⁻⁹ USD), and only shown as `f64` dollars.
//! The reasons:
//!
//! - **Replay must be byte-identical.** A crash-free run and a run that crashed, restored
//!   its budget from a checkpoint and charged the remaining journal rows must end with
//!   the same budget JSON, byte for byte. Integer sums are exact and order-free. With
//!   `f64` they would hinge on every float surviving a JSON round-trip unchanged, which
//!   `serde_json` does not promise for every value unless its `float_roundtrip`
//!   feature is on (its default parser is best-effort in the last bit).
//! - **Limits compare exactly.** Spends of $0.10 and $0.20 against a $0.30 limit reach
//!   the limit; they do not overshoot it by 4·10⁻¹⁷ as `f64` addition does.
//! - **Nano, not micro.** Per-token prices go below a micro-dollar (an embedding token
//!   at $0.02 per million tokens costs 0.02 µUSD), so micro-dollars would round whole
//!   calls to zero. `u64` nano-USD still holds $18 billion; sums saturate there.
//! - **No NaN can get in.** A stored budget has no float field, so no NaN, infinity or
//!   negative value can be deserialized into it; dollar amounts given as `f64` are
//!   checked once, when converted ([`Spend::new`], [`Budget::with_limit_usd`]).

mod budget;
mod limit;
mod plan;
mod prices;

pub use budget::{Budget, Ceiling, InvalidAmount, NANO_USD_PER_USD, Spend};
pub use limit::{Ask, BudgetExceeded, InvalidLimit, Limit};
pub use plan::{Plan, PlanError, Postcondition, Step, StepStatus};
pub use prices::{Price, PriceTable, Usage};
