//! The agent programs the simulated sessions run, generated from the seed, and the tools
//! they call.

use std::collections::BTreeMap;

use durable_core::{ReplayClass, SessionId, ToolSpec};
use rand::Rng;
use rand::rngs::SmallRng;
use serde_json::json;

/// One tool call of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `send_email`, `unsafe_on_replay` with a verify hook.
    Email,
    /// `charge`, `idempotent_with_key`, of this amount.
    Charge(u64),
    /// `lookup`, `pure`.
    Lookup,
}

/// A session's program: for each step (checkpoint version), a model reply and then these
/// calls, in order; then a checkpoint. After the last step the session completes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Program {
    /// The calls of each step.
    pub steps: Vec<Vec<Op>>,
}

impl Program {
    /// A program of 1 to 4 steps of 1 to 3 calls.
    pub fn generate(rng: &mut SmallRng) -> Self {
        let steps = (0..rng.random_range(1..=4))
            .map(|_| {
                (0..rng.random_range(1..=3))
                    .map(|_| match rng.random_range(0..3) {
                        0 => Op::Email,
                        1 => Op::Charge(rng.random_range(1..=500)),
                        _ => Op::Lookup,
                    })
                    .collect()
            })
            .collect();
        Program { steps }
    }

    /// What the model replies of the whole program cost, in nano-dollars: what the
    /// session's budget must show once it completed (each reply charged once).
    pub fn spend(&self) -> u64 {
        (0..self.steps.len() as u64).map(spend_of).sum()
    }
}

/// The cost of step `step`'s model reply, in nano-dollars.
pub fn spend_of(step: u64) -> u64 {
    1_000 + step
}

/// The programs of a run, by session.
pub type Programs = BTreeMap<SessionId, Program>;

/// The three tools.
#[derive(Debug, Clone)]
pub struct Tools {
    /// `send_email`: `unsafe_on_replay`, with a verify hook.
    pub email: ToolSpec,
    /// `charge`: `idempotent_with_key`.
    pub charge: ToolSpec,
    /// `lookup`: `pure`.
    pub lookup: ToolSpec,
}

impl Default for Tools {
    fn default() -> Self {
        let schema = json!({ "type": "object" });
        Tools {
            email: ToolSpec::new(
                "send_email",
                "sends an email",
                ReplayClass::UnsafeOnReplay,
                schema.clone(),
            )
            .with_verify(),
            charge: ToolSpec::new(
                "charge",
                "charges a card",
                ReplayClass::IdempotentWithKey,
                schema.clone(),
            ),
            lookup: ToolSpec::new("lookup", "looks a fact up", ReplayClass::Pure, schema),
        }
    }
}
