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
    /// `wire`, `unsafe_on_replay` without a verify hook, of this amount, which needs a
    /// person's approval: the operator approves or denies it.
    Wire(u64),
    /// `measure`, `pure`, whose typed result (an `f64`) is not finite when `true`: the
    /// journal must refuse to record it (JSON would keep `null`, and a replay would not
    /// give the harness what it saw the first time).
    Measure(bool),
    /// A read of the signal `note` ([`Session::recv_signal`](durable_core::Session::recv_signal)):
    /// the operator sends them; each must be read once, at one place, whatever dies.
    Read,
}

/// A session's program: for each step (checkpoint version), a model reply and then these
/// calls, in order; then a checkpoint. After the last step the session completes.
///
/// Some steps **re-plan** when they run again (after a crash, a refusal, a lost lease):
/// from their second attempt on, they ask for one more call with a side effect, at a
/// position of its own, before the calls they asked for the first time. A re-run that
/// asks for a new call while one of the first attempt's calls is in doubt is what the
/// session-wide barrier is for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Program {
    /// The calls of each step.
    pub steps: Vec<Vec<Op>>,
    /// By step: where the re-planned call goes in the step's calls, and what it is.
    pub replans: BTreeMap<usize, (usize, Op)>,
    /// A handler of one turn, as most are written: it runs its calls and completes, and
    /// never looks at the session's version (it has one step). What makes a completion
    /// that is not one write repeat its calls.
    pub single_turn: bool,
    /// The calls of a step run at once ([`Journal::join_calls`](durable_core::Journal::join_calls)), as a
    /// harness runs the parallel calls of one reply; one after another otherwise.
    pub parallel: bool,
}

impl Program {
    /// A program of 1 to 4 steps of 1 to 3 calls.
    pub fn generate(rng: &mut SmallRng) -> Self {
        let steps = (0..rng.random_range(1..=4))
            .map(|_| {
                (0..rng.random_range(1..=3))
                    .map(|_| match rng.random_range(0..9) {
                        0 | 1 => Op::Email,
                        2 | 3 => Op::Charge(rng.random_range(1..=500)),
                        4 => Op::Wire(rng.random_range(1..=500)),
                        5 => Op::Measure(rng.random_bool(0.5)),
                        6 => Op::Read,
                        _ => Op::Lookup,
                    })
                    .collect()
            })
            .collect::<Vec<Vec<Op>>>();
        let mut replans = BTreeMap::new();
        for (i, ops) in steps.iter().enumerate() {
            if rng.random_bool(0.35) {
                let at = rng.random_range(0..=ops.len());
                let op = if rng.random_bool(0.5) {
                    Op::Email
                } else {
                    Op::Charge(rng.random_range(1..=500))
                };
                replans.insert(i, (at, op));
            }
        }
        Program {
            steps,
            replans,
            single_turn: false,
            parallel: false,
        }
    }

    /// Makes it a handler of one turn (its first step only).
    pub fn into_single_turn(mut self) -> Self {
        self.steps.truncate(1);
        self.replans.retain(|&step, _| step == 0);
        self.single_turn = true;
        self
    }

    /// The calls of step `step` on its `attempt`th run (1 for the first): with its
    /// re-planned call from the second on. Each comes with its place in the program (its
    /// index in the step, `r` for the re-planned one), which names its logical call.
    pub fn calls(&self, step: usize, attempt: u32) -> Vec<(String, Op)> {
        let mut calls: Vec<(String, Op)> = self
            .steps
            .get(step)
            .map(|ops| {
                ops.iter()
                    .enumerate()
                    .map(|(j, op)| (j.to_string(), *op))
                    .collect()
            })
            .unwrap_or_default();
        if attempt >= 2
            && let Some(&(at, op)) = self.replans.get(&step)
        {
            calls.insert(at.min(calls.len()), ("r".to_owned(), op));
        }
        calls
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

/// The five tools.
#[derive(Debug, Clone)]
pub struct Tools {
    /// `send_email`: `unsafe_on_replay`, with a verify hook.
    pub email: ToolSpec,
    /// `charge`: `idempotent_with_key`.
    pub charge: ToolSpec,
    /// `lookup`: `pure`.
    pub lookup: ToolSpec,
    /// `wire`: `unsafe_on_replay`, no verify hook; every call needs an approval.
    pub wire: ToolSpec,
    /// `measure`: `pure`, a number.
    pub measure: ToolSpec,
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
            lookup: ToolSpec::new(
                "lookup",
                "looks a fact up",
                ReplayClass::Pure,
                schema.clone(),
            ),
            wire: ToolSpec::new(
                "wire",
                "wires money, once a person approved",
                ReplayClass::UnsafeOnReplay,
                schema.clone(),
            ),
            measure: ToolSpec::new("measure", "measures a ratio", ReplayClass::Pure, schema),
        }
    }
}
