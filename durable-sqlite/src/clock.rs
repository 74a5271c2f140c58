//! Leases judged by observation, on each process's monotonic clock.
//!
//! SQLite has no server: the `now` a statement computes (`julianday('now')`) is the wall
//! clock of the process that runs it, and processes' wall clocks need not agree (a
//! clock stepped by NTP or by hand, a process under a time namespace or `faketime`, a
//! database on a disk several machines see). A lease written as "held until wall time
//! T" by one process and compared with another process's wall time is only as good as
//! the two clocks' agreement: a worker an hour ahead would take a live session at once,
//! and the session of a dead worker an hour ahead would stay locked for an hour.
//!
//! So a lease held by another worker is never judged by comparing wall times. A worker
//! judges it by what it sees change: every write of a lease (take, renewal) changes its
//! row's *beat* (`lease_owner`, `fence`, `lease_renewed_at`, `lease_expires_at`; a
//! renewal moves `lease_renewed_at` forward by at least 1 even if the renewer's clock
//! went back). The holder's lease duration is the difference of two times the holder
//! wrote in one statement with one clock (`lease_expires_at - lease_renewed_at`), so
//! skew does not touch it. A worker may take the session once it has seen the same beat
//! for one full lease duration on its **own monotonic clock**. The holder, meanwhile,
//! treats its lease as valid only until the instant it sent its last renewal plus 90%
//! of the duration, on *its* monotonic clock (`durable_core`'s journal): so whatever the
//! two processes' clocks read, the holder stops starting calls before anyone may take
//! the session, as long as their clocks *run* at about the same rate (within 10%).
//! Offsets, steps and different epochs do not matter; only rate does.
//!
//! The price: a lease this process never saw being written is taken one full lease
//! duration after it is first seen, even if its holder died long ago (a released lease
//! is free at once, and a worker restarted under the same owner takes its sessions back
//! at once, as before). What this process writes itself (a session it starts, a lease
//! it takes or renews) is seen from the moment it is written, by every store this
//! process opens on the same database file.
//!
//! The wall clock still times what is not a lease: `created_at`, `updated_at`, wake-up
//! times, approval deadlines, and the advisory counts of `queues()`.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Sightings kept per database before the oldest are forgotten (forgetting one only
/// delays a take-over by one lease duration).
const MAX_SIGHTINGS: usize = 1 << 16;

/// A lease as its row shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LeaseRow {
    pub(crate) owner: Option<String>,
    pub(crate) fence: i64,
    pub(crate) renewed_at: Option<i64>,
    pub(crate) expires_at: Option<i64>,
}

impl LeaseRow {
    /// The holder's lease duration: two times the holder wrote with one clock. `None`
    /// when the row does not say (a row written before `lease_renewed_at` existed).
    fn duration(&self) -> Option<Duration> {
        let (renewed, expires) = (self.renewed_at?, self.expires_at?);
        u64::try_from(expires.checked_sub(renewed)?)
            .ok()
            .map(Duration::from_millis)
    }
}

/// What this process judges of a lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// No one holds it, or its holder has not renewed it for a full lease duration.
    Free,
    /// Held, for at least `remaining` more on this process's clock.
    Held { remaining: Duration },
}

/// One lease beat, and when this process first saw it.
struct Sighting {
    beat: LeaseRow,
    since: Instant,
}

/// The sightings of one database, shared by every store this process opens on it.
#[derive(Default)]
pub(crate) struct LeaseClock {
    seen: Mutex<HashMap<String, Sighting>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The clocks of the databases this process opened, by location.
static CLOCKS: LazyLock<Mutex<HashMap<String, Arc<LeaseClock>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

impl LeaseClock {
    /// The clock of the database at `location` (a canonical file path, or an in-memory
    /// database's unique name), shared in this process.
    pub(crate) fn for_location(location: &str) -> Arc<LeaseClock> {
        Arc::clone(lock(&CLOCKS).entry(location.to_owned()).or_default())
    }

    /// Judges the lease of `session`, recording the beat if it is new to this process.
    /// `fallback` is the lease duration assumed when the row does not carry its own.
    pub(crate) fn judge(&self, session: &str, row: &LeaseRow, fallback: Duration) -> Verdict {
        if row.owner.is_none() || row.expires_at.is_none() {
            return Verdict::Free;
        }
        let ttl = row.duration().unwrap_or(fallback);
        let mut seen = lock(&self.seen);
        let since = match seen.get(session) {
            Some(s) if s.beat == *row => s.since,
            _ => {
                Self::make_room(&mut seen);
                let now = Instant::now();
                seen.insert(
                    session.to_owned(),
                    Sighting {
                        beat: row.clone(),
                        since: now,
                    },
                );
                now
            }
        };
        match ttl.checked_sub(since.elapsed()) {
            Some(remaining) if !remaining.is_zero() => Verdict::Held { remaining },
            _ => Verdict::Free,
        }
    }

    /// Records a beat this process has just written (committed), seen from `since`: when
    /// the transaction that wrote it read its clock ([`clock_read`]), so that the lease
    /// ends for this process when its row says (on a clock that agrees), as on a
    /// server's clock.
    pub(crate) fn wrote(&self, session: &str, row: LeaseRow, since: Instant) {
        let mut seen = lock(&self.seen);
        Self::make_room(&mut seen);
        seen.insert(session.to_owned(), Sighting { beat: row, since });
    }

    /// Whether a lease this process wrote with beat `row` has gone a full duration
    /// without being renewed, on this process's clock: another process may have
    /// judged it free. `false` when this process has no record of it.
    pub(crate) fn lapsed(&self, session: &str, row: &LeaseRow, fallback: Duration) -> bool {
        let ttl = row.duration().unwrap_or(fallback);
        lock(&self.seen)
            .get(session)
            .is_some_and(|s| s.beat == *row && s.since.elapsed() >= ttl)
    }

    fn make_room(seen: &mut HashMap<String, Sighting>) {
        if seen.len() >= MAX_SIGHTINGS {
            // Forget the older half: each forgotten lease is judged afresh, later.
            let mut ages: Vec<Instant> = seen.values().map(|s| s.since).collect();
            ages.sort_unstable();
            let cut = ages[ages.len() / 2];
            seen.retain(|_, s| s.since > cut);
        }
    }
}

/// When a transaction that began (asked for the write lock) at `began` and has just read
/// the database clock read it, on this process's monotonic clock: `began`, unless the
/// transaction waited for the lock (another process writing), then a few milliseconds
/// before now. A lease this process writes is seen from then (`LeaseClock::wrote`).
pub(crate) fn clock_read(began: Instant) -> Instant {
    let now = Instant::now();
    began.max(now.checked_sub(Duration::from_millis(5)).unwrap_or(now))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(fence: i64, renewed: i64, ttl: i64) -> LeaseRow {
        LeaseRow {
            owner: Some("w".into()),
            fence,
            renewed_at: Some(renewed),
            expires_at: Some(renewed + ttl),
        }
    }

    #[test]
    fn a_beat_unchanged_for_its_duration_is_free_and_a_new_beat_starts_again() {
        let clock = LeaseClock::default();
        // Wall times an hour apart: irrelevant, only the duration (50 ms) counts.
        let first = row(1, 3_600_000, 50);
        assert!(matches!(
            clock.judge("s", &first, Duration::from_secs(30)),
            Verdict::Held { .. }
        ));
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(
            clock.judge("s", &first, Duration::from_secs(30)),
            Verdict::Free
        );
        let renewed = row(1, 0, 50);
        assert!(matches!(
            clock.judge("s", &renewed, Duration::from_secs(30)),
            Verdict::Held { .. }
        ));
        let released = LeaseRow {
            owner: None,
            ..renewed
        };
        assert_eq!(
            clock.judge("s", &released, Duration::from_secs(30)),
            Verdict::Free
        );
    }
}
