//! Model-based test: generated harness programs against SQLite and PostgreSQL, checked
//! against a ledger the store knows nothing about (hunting the class, not the
//! instances).
//!
//! A program is a list of steps from a small vocabulary (`model_based/program.rs`): model
//! turns proposing calls of each replay class, crashes at journal boundaries, restarts,
//! re-asked models with changed arguments, tool schema changes, operator resolutions,
//! verify hooks that know or cannot tell, forks, lost leases, approvals (a policy that
//! makes every call with a side effect await a person, who approves or denies). An **ordinary** harness runs
//! it (`model_based/harness.rs`): it dispatches what the model proposes, feeds every
//! refusal back as a tool result and checkpoints each turn (a checkpoint refused because
//! calls await approval parks the session instead). After every program:
//!
//! | property | checked against |
//! |---|---|
//! | `unsafe-at-most-once`: every `unsafe_on_replay` intent took effect at most once | the ledger (outbox, webhook channel) |
//! | `keyed-applied-once`: every `idempotent_with_key` intent reached the receiver under one non-empty key | the ledger (a receiver that dedups by key) |
//! | `recorded-result-kept`: a recorded result is what every later replay of that call returns | the results the harness got, the journal |
//! | `budget-once-per-row`: each checkpoint's spend is the previous one's plus the cost of each journal row its turn used, once per row | the costs carried in replies and results, the checkpoints |
//! | `session-wide-barrier`: no new side effect starts while an unsafe call of its session is in doubt and unresolved | the journal, read as the effect starts |
//! | `zombie-acts-not`: a worker that lost its lease starts no side effect | the ledger |
//! | `undecided-or-denied-runs-not`: a call awaiting approval, or denied, took no effect | the ledger, the journal |
//!
//! `harness = false`. The corpus (`model_based/corpus/*.txt`, programs that once failed or
//! are otherwise interesting) replays first, then generated programs, the same on each
//! backend; one summary line per backend. A failing generated program is shrunk (per
//! broken property) and printed in the corpus's text form.
//!
//! Environment:
//! - `DURABLE_MBT_CASES`: generated programs per backend (default 512; nightly: 20000);
//! - `DURABLE_MBT_SEED`: the generator's seed (decimal or `0x…`; default a fixed seed, so
//!   CI runs the same programs every time; `random` for a fresh one, printed);
//! - `DURABLE_MBT_STEPS`: longest program (default 12);
//! - `DURABLE_MBT_SAVE`: a directory where each shrunk failure is written as a corpus file.
//!
//! Arguments filter the backends (`sqlite`, `postgres`). PostgreSQL runs with the
//! `_postgres-testing` feature (`cargo test --all-features --test model_based`): one
//! throwaway server for the whole binary (or `DATABASE_URL`), one database, a fresh
//! session id per program.

#[path = "model_based/harness.rs"]
mod harness;
#[path = "model_based/interp.rs"]
mod interp;
#[path = "model_based/program.rs"]
mod program;
#[path = "model_based/runner.rs"]
mod runner;
#[path = "model_based/tools.rs"]
mod tools;
#[path = "model_based/world.rs"]
mod world;

fn main() {
    std::process::exit(runner::main());
}
