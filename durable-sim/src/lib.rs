//! A seeded simulation of a durable fleet: several worker pools, an operator, lease
//! expiry and a faulty store, driven by one seed, checked against the invariants users
//! rely on.
//!
//! # What a run does
//!
//! From the seed it draws: 3 to 8 sessions, each with an agent program of 1 to 4 steps
//! (a model reply with a cost, then 1 to 3 tool calls, then a checkpoint;
//! [`program`]); 2 to 4 worker slots; a lease duration of 150 to 250 ms; a mix of
//! faults ([`FaultRates`]); how often the email's verify hook cannot tell; and how long
//! faults last (0.8 to 2 s). Then, on one current-thread tokio runtime:
//!
//! - a **submitter** submits the sessions at seeded moments;
//! - each **worker slot** runs a pool ([`Durable::worker`](durable_core::Durable::worker),
//!   its own owner name, concurrency 1 to 3) whose handler runs the session's program from
//!   the checkpoint it resumed at, releasing the session when a call is refused as
//!   replay-unsafe (only an operator can go on) or the pool shuts down; at seeded moments
//!   the slot **crashes** its pool (aborts the task: no release, every await point is a
//!   possible crash point, a store call in flight included) or **stops it gracefully**
//!   (SIGTERM: the handlers release at their next checkpoint), and starts a new pool
//!   under a new owner after a seeded delay;
//! - an **operator** wakes at seeded moments, resolves every in-doubt call from the
//!   ledgers' truth (happened: `Happened` with the ledger's result; not: `DidNotHappen`)
//!   and unparks every parked session (the poison-pill bound parks a session after 3
//!   recoveries that died without a checkpoint) but a poison pill;
//! - in half the runs, a **poison pill**: a session that kills its worker (the handler
//!   returns an error without releasing) every time it runs, after a model call;
//! - every actor talks to the store through a [`Faulty`] of its own, which by the seed
//!   fails a call before it reaches the store, performs it and then loses its
//!   acknowledgement, delays it, or **pauses the actor** for longer than a lease (every
//!   call it makes meanwhile waits, its lease renewals included: a process stopped, then
//!   waking with a lease that is gone).
//!
//! Once the faulty phase ends, faults and crashes stop, and every session must complete
//! within 15 s (liveness).
//!
//! # The tools and their ledgers
//!
//! The effects land in a [`World`] outside the store that survives every crash:
//! `send_email` (`unsafe_on_replay`, with a verify hook that reads the outbox, or answers
//! `Unknown` by the seed), `charge` (`idempotent_with_key`, against a payment API that
//! deduplicates by the key the journal recorded, and counts presentations), and `lookup`
//! (`pure`). Tool bodies sleep a millisecond before and after their effect, so that a
//! crash lands on either side of it.
//!
//! # The invariants
//!
//! Checked while the run goes on:
//! - **no `unsafe_on_replay` effect twice**: the outbox never sends two emails for one
//!   call;
//! - **no keyed charge applied twice**: no logical charge reaches the payment API under
//!   two keys;
//! - **no recorded result lost or changed**: every result the harness gets for one call
//!   (tool results and model replies, which differ each time they are asked for) is the
//!   one it got the first time;
//! - **never two writers of one session**: the store never accepts a fenced write whose
//!   token is lower than one it had already accepted or granted for that session before
//!   the write began ([`FenceLog`]; comparing with what had *completed before the write
//!   began* keeps the check sound whatever order the store's thread and the runtime's
//!   tasks interleave in).
//!
//! Checked at the end, on the real store:
//! - **every session completed** within the bound once faults stopped, and a poison
//!   pill parked;
//! - **every in-doubt call surfaced**: every effect in a ledger is a completed or resolved
//!   journal row with the ledger's result, or is listed by `in_doubt`;
//! - **spend charged once**: each completed session's budget shows exactly the cost of
//!   its program's model replies.
//!
//! A failing seed prints the command that runs it again ([`reproduce`]).
//!
//! # Determinism, and why a real store
//!
//! A run is one seeded generator, split into one stream per actor (and per worker
//! generation, and per `Faulty`), on a current-thread runtime, so tasks are polled in a
//! deterministic order. It is not yet exactly reproducible: SQLite runs on sqlx's own
//! thread, so when a query's answer wakes its task depends on that thread, and leases,
//! delays and pauses are measured on the real clock (SQLite judges a lease by observing
//! it on the process's monotonic clock; the journal stops starting calls by the same
//! clock). A seed therefore runs the same programs, fault mix and schedule of crashes,
//! and usually interleaves them the same way; a failure found once reproduces often,
//! not always. With an in-process memory store (no IO, no other thread) the runs become
//! deterministic once time is virtual too: tokio's paused clock (`start_paused`) drives
//! every sleep and timer here, and the store's `now()` and lease judgement and the
//! journal's lease deadline would have to read tokio's clock (`tokio::time::Instant`)
//! instead of the system's. The store is chosen in one place, [`store::open`].
//!
//! Why not `turmoil` or `madsim`: both simulate a network and hosts, which this fleet
//! does not have (every actor shares one store in one process); what it needs is one
//! seeded schedule of faults at the store's boundary and crashes at await points, which a
//! store decorator and tokio's own runtime give without a new executor.
//!
//! # Guards it finds switched off
//!
//! Measured on the debug build, two cores, each from several starting seeds:
//! - the store's fencing check accepting a stale token: "two writers of session …" at
//!   the 1st to 4th seed;
//! - the journal re-running an in-doubt `unsafe_on_replay` call instead of asking its
//!   verify hook: "unsafe effect twice: email for … sent again" at the 1st to 21st seed;
//! - poison-pill counting (the store never parking a session whose recoveries keep
//!   dying): "liveness: … poison active at version 0 (…, recoveries 80)" at the first seed
//!   that has a poison pill (half of them do);
//! - the session-wide barrier: not found in 100 seeds. The generated programs never
//!   diverge (a re-run asks for the same calls in the same order), so the in-doubt call
//!   is always met, and refused, before any later effect; finding it needs programs whose
//!   re-runs ask for other calls.
//!
//! # A pause after a commit
//!
//! [`FaultRates::pause_after_commit`] (`--pause-after-commit`) lets a pause strike after
//! a write committed and before its caller hears of it. It is off by default because it
//! finds a double send today (at the 12th of the seeds from 0 and the 73rd from 100, when
//! this was written): the worker's *issued* row commits, the worker pauses past its
//! lease, another worker takes the session over, the verify hook reads an empty outbox
//! and the call runs there; then the first worker wakes
//! and runs the tool body it had been cleared to run before the pause. The journal
//! checks its lease deadline before a call starts, not after the issue returns; checking
//! it again there (before the body runs) made 250 seeds of this mode pass. A pause between
//! that check and the effect itself stays possible, as in any system whose effects are
//! not fenced at their destination.
//!
//! # Running it
//!
//! `cargo test -p durable-sim` runs a fixed budget of seeds (`DURABLE_SIM_SEEDS` to
//! change it). `cargo run -p durable-sim --release -- --seeds 100000` or `--for 2h` runs
//! many; `--seed N` runs one and prints what it did.

mod check;
pub mod faulty;
pub mod program;
mod run;
pub mod store;
pub mod world;

pub use faulty::{FaultRates, Faulty, FenceLog};
pub use run::{Options, Report, reproduce, run_seed};
pub use world::World;
