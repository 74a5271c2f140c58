//! Switches that turn one guard of the replay protocol or of a store off, for the
//! simulation's revert experiments (does the simulation notice when the guard is
//! gone?). They exist only with the `failpoints` feature, as failpoints named
//! `durable::guard_off::<guard>` (set one to `return` with `fail::cfg`); without it,
//! [`guard_off`] is `false` and compiles away.
//!
//! Guards: `barrier` (the session-wide barrier), `divergence` (the divergence check),
//! `lease_recheck` (the lease checked again after an issue, before the effect runs),
//! `finite` (non-finite floats refused on their way into the journal), `atomic_complete`
//! (a session's final checkpoint and its completion written in one transaction),
//! `absence` (a journal row missing behind the head's count refused as tampered: the
//! journal's extent and its count of issued rows, in `integrity::rows`), and, read by the
//! memory store, `fencing` (a write under a stale fencing token refused),
//! `poison_pill` (recoveries counted and a session parked past the bound) and
//! `signal_key` (a read of a signal handed the signal its consumer key took before).

/// Whether the guard `name` is switched off (never, without the `failpoints` feature).
#[cfg(feature = "failpoints")]
pub fn guard_off(name: &str) -> bool {
    fail::eval(&format!("durable::guard_off::{name}"), |_| ()).is_some()
}

/// Whether the guard `name` is switched off (never, without the `failpoints` feature).
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn guard_off(_name: &str) -> bool {
    false
}
