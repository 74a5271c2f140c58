//! A seeded simulation of a durable fleet: several worker pools, an operator, lease
//! expiry and a faulty store, driven by one seed, checked against the invariants users
//! rely on. On the memory store (the default) a seed gives one run, exactly.
//!
//! # What a run does
//!
//! From the seed it draws: 3 to 8 sessions, each with an agent program of 1 to 4 steps
//! (a model reply with a cost, then 1 to 3 tool calls, then a checkpoint; some steps
//! **re-plan** when they run again, asking for one more call with a side effect before
//! the ones they asked for the first time; [`program`]); 2 to 4 worker slots; a lease
//! duration of 150 to 250 ms; a mix of faults ([`FaultRates`]); how often the email's
//! verify hook cannot tell; and how long faults last (0.8 to 2 s). Then, on one
//! current-thread tokio runtime:
//!
//! - a **submitter** submits the sessions at seeded moments;
//! - each **worker slot** runs a pool ([`Durable::worker`](durable_core::Durable::worker),
//!   its own owner name, concurrency 1 to 3) whose handler runs the session's program from
//!   the checkpoint it resumed at (a third of the programs are single-turn handlers that
//!   run their one step and complete, whatever the version; half run each step's calls
//!   at once, as one batch), releasing the session when a call is refused as
//!   replay-unsafe (only an operator can go on), parking it when a call awaits approval,
//!   and releasing it when the pool shuts down; at seeded moments the slot **crashes** its
//!   pool (aborts the task: no release, every await point is a possible crash point, a
//!   store call in flight included) or **stops it gracefully** (SIGTERM: the handlers
//!   release at their next checkpoint), and starts a new pool under a new owner after a
//!   seeded delay;
//! - an **operator** wakes at seeded moments and: resolves every in-doubt call from the
//!   ledgers' truth (happened: `Happened` with the ledger's result; not: `DidNotHappen`);
//!   **approves or denies** (by the seed) every call awaiting approval; sometimes **forks**
//!   a completed session at a seeded version (the fork re-runs its parent's program from
//!   there, with its parent's arguments; a pool runs it); sometimes **retargets** an
//!   active session to the fleet's other app version, whoever holds it (worker slots run
//!   `sim` or `sim2` by their number, as during a rolling deploy; claims take only their
//!   own version's sessions); on the memory store, sometimes **loses a row** behind the
//!   store's back: the newest journal row with a side effect of a session no worker holds,
//!   between a crash and the next resume, as a lost `-wal` or a restored backup would;
//!   and unparks every parked session (the poison-pill bound parks a session after 3
//!   recoveries that died without a checkpoint) but a poison pill and a session that lost
//!   a row;
//! - in half the runs, a **poison pill**: a session that kills its worker (the handler
//!   returns an error without releasing) every time it runs, after a model call;
//! - every actor talks to the store through a [`Faulty`] of its own, which by the seed
//!   fails a call before it reaches the store, performs it and then loses its
//!   acknowledgement, delays it, or **pauses the actor** for longer than a lease (every
//!   call it makes meanwhile waits, its lease renewals included: a process stopped, then
//!   waking with a lease that is gone), before the call or after it committed.
//!
//! Once the faulty phase ends, faults, crashes and forks stop, and every session must
//! end within 15 s of the run's clock (liveness).
//!
//! # The tools and their ledgers
//!
//! The effects land in a [`World`] outside the store that survives every crash:
//! `send_email` (`unsafe_on_replay`, with a verify hook that reads the outbox, or answers
//! `Unknown` by the seed), `charge` (`idempotent_with_key`, against a payment API that
//! deduplicates by the key the journal recorded, and counts presentations), `wire`
//! (`unsafe_on_replay`, no verify hook, every call needs a person's approval: the
//! operator's decision is written in the ledger before the store hears of it) and
//! `lookup` (`pure`). Tool bodies sleep a millisecond before and after their effect, so
//! that a crash lands on either side of it.
//!
//! # The invariants
//!
//! Checked while the run goes on:
//! - **no `unsafe_on_replay` effect twice**: the outbox never sends two emails for one
//!   call, the bank never wires twice for one call, within one line (a session and its
//!   forks; two forks of one session are two lines, each running its own calls); a
//!   fork's calls are its parent's, so this is also **a fork never repeats an effect of
//!   its parent**;
//! - **an approved call runs at most once, a denied one never, none before its
//!   approval**;
//! - **no keyed charge applied twice**: no logical charge reaches the payment API under
//!   two keys;
//! - **nothing runs beside an in-doubt unsafe call**: when an effect lands, the store
//!   lists no other `unsafe_on_replay` call of the session in doubt (the session-wide
//!   barrier's promise);
//! - **no recorded result lost or changed**: every result the harness gets for one call
//!   (tool results and model replies, which differ each time they are asked for) is the
//!   one it got the first time;
//! - **never two writers of one session**: the store never accepts a fenced write whose
//!   token is lower than one it had already accepted or granted for that session before
//!   the write began ([`FenceLog`]);
//! - **no refusal without a cause**: a session's own program (not a fork's) is never
//!   refused as diverged or as repeating an inherited effect.
//!
//! Checked at the end, on the real store:
//! - **every session ended** within the bound once faults stopped: completed, a poison
//!   pill parked, a fork completed or failed (refused for repeating its parent);
//! - **absence surfaced, never trusted**: a session that lost a row is refused as
//!   tampered (every read of its journal says so) unless it had completed before; the
//!   lost row's effect is never run again (the first invariant above);
//! - **every in-doubt call surfaced**: every effect in a ledger is a completed or resolved
//!   journal row (of its session or a fork of it) with the ledger's result, or is listed
//!   by `in_doubt`;
//! - **spend charged once**: each completed session's budget shows exactly the cost of
//!   its program's model replies.
//!
//! A failing seed prints the command that runs it again ([`reproduce`]).
//!
//! # Determinism
//!
//! On the memory store (the default), a seed gives one run, bit for bit: the same
//! programs, faults, crashes, interleavings and results, and the same event log
//! ([`Trace`]: every store call of every actor with its time, fault and outcome, every
//! effect and operator action). `tests/determinism.rs` runs seeds twice in one process
//! and compares the logs' digests, so anything nondeterministic that creeps back fails
//! it. What makes it so:
//! - one seeded generator, split into one stream per actor (and per worker generation,
//!   and per [`Faulty`]); a current-thread runtime, whose tasks are polled in a
//!   deterministic order; every `select!` of the simulation and of the worker pool
//!   `biased` (an unbiased one draws from the runtime's own generator);
//! - virtual time: the runtime's clock is paused (`start_paused`) and jumps to the next
//!   timer whenever every task waits, so leases, delays and pauses are exact and a run
//!   costs only its CPU time; the memory store reads its clock from the runtime's
//!   ([`store::open`], `MemoryStoreOptions::clock`), and the journal's lease deadline is
//!   on the runtime's clock too;
//! - no IO and no other thread: the memory store answers in the calling task;
//! - nothing decided by a hash map's order (rows issued in one millisecond are told
//!   apart by their place in the journal, not by a map's iteration).
//!
//! What is not deterministic: the ids of sessions' calls and the store's sealing key are
//! random (nothing depends on their order, and the log leaves them out), and the wall
//! time a run takes. With `--sqlite` the run is on SQLite, a real SQL store that catches
//! what the memory store cannot, and on the real clock: SQLite answers from sqlx's
//! thread, so a seed gives the same programs, faults and schedule of crashes but not
//! always the same interleaving; a failure found there reproduces often, not always.
//!
//! Why not `turmoil` or `madsim`: both simulate a network and hosts, which this fleet
//! does not have (every actor shares one store in one process); what it needs is one
//! seeded schedule of faults at the store's boundary and crashes at await points, which a
//! store decorator and tokio's own runtime (its paused clock included) give without a new
//! executor.
//!
//! # Guards it finds switched off
//!
//! `--guard-off <guard>` switches one guard off (`durable_core::guard_switch`: a failpoint,
//! compiled only with `durable-core`'s `failpoints` feature, so it costs nothing in a
//! build without it) for a revert experiment: `cargo run -p durable-sim --release --
//! --guard-off barrier --seeds 500` runs seeds from 0 until one fails. Measured on the
//! memory store (seeds from 0, so exactly reproducible):
//!
//! | guard switched off | first failing seed | invariant that failed |
//! |---|---|---|
//! | `absence` (a journal row missing behind the head's count refused as tampered) | 12th (seed 11) | absence not surfaced: a session that lost a journal row behind the store's back read its journal as whole |
//! | `poison_pill` (recoveries counted, a session parked past the bound) | 1st (seed 0) | liveness: the poison pill still active after 81 recoveries |
//! | `finite` (non-finite floats refused on their way into the journal) | 2nd (seed 1) | a recorded result changed: `NaN` the first time, a result that no longer decodes on the replay |
//! | `fencing` (a write under a stale fencing token refused) | 3rd (seed 2) | never two writers: `record_call` with token 2 accepted after token 3 |
//! | `signal_key` (a read of a signal handed what its consumer key took before) | 10th (seed 9) | a signal lost: consumed by a read that died before its journal row, and the re-run read took the next one |
//! | `atomic_complete` (a session's final checkpoint and its completion in one transaction) | 18th (seed 17) | spend charged twice: a single-turn handler resumed from its final checkpoint (its completion lost with a paused worker's lease) ran its turn again |
//! | `divergence` (the divergence check) | 29th (seed 28) | an unsafe effect twice: a fork's re-worded email sent again |
//! | `barrier` (the session-wide barrier) | 71st (seed 70) | an effect beside an in-doubt unsafe call: calls run while an email was in doubt |
//! | `lease_recheck` (the lease checked again after the issue, before the effect) | 193rd (seed 192) | an unsafe effect twice: a worker waking after a pause past its lease sent an email again |
//!
//! # Running it
//!
//! `cargo test -p durable-sim` runs a fixed budget of seeds (`DURABLE_SIM_SEEDS` to
//! change it) and the determinism check. `cargo run -p durable-sim --release -- --seeds
//! 100000` or `--for 2h` runs many; `--seed N` runs one and prints what it did (`--trace`:
//! its whole event log); `--sqlite` runs on SQLite; `--no-pause-after-commit` keeps
//! pauses before the calls.

mod check;
pub mod faulty;
pub mod program;
mod run;
pub mod store;
pub mod trace;
pub mod world;

pub use faulty::{FaultRates, Faulty, FenceLog};
pub use run::{GUARDS, Options, Report, reproduce, run_seed};
pub use store::Backend;
pub use trace::Trace;
pub use world::World;
