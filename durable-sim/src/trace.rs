//! The run's event log: every store call each actor made (when, on the run's clock; which
//! fault it drew; whether it succeeded), every effect and every operator action, in the
//! order they happened. Its digest is the run's fingerprint: two runs of one seed on the
//! memory store must give the same one.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Mutex;

use tokio::time::Instant;

use crate::faulty::lock;

/// The event log of one run.
#[derive(Debug)]
pub struct Trace {
    start: Instant,
    /// Each event, as a line: `<ms> <what>`.
    events: Mutex<Vec<String>>,
}

impl Trace {
    /// An empty log, its clock starting now (the runtime's clock).
    pub fn new() -> Self {
        Trace {
            start: Instant::now(),
            events: Mutex::new(Vec::new()),
        }
    }

    /// Records `what`, at the run's current time.
    pub fn record(&self, what: impl std::fmt::Display) {
        let at = self.start.elapsed().as_millis();
        lock(&self.events).push(format!("{at} {what}"));
    }

    /// The events so far.
    pub fn events(&self) -> Vec<String> {
        lock(&self.events).clone()
    }

    /// A digest of every event: the same for two runs exactly when their logs are.
    /// (`DefaultHasher::new` has fixed keys: the digest is stable within one build.)
    pub fn digest(&self) -> u64 {
        let mut hasher = DefaultHasher::new();
        lock(&self.events).hash(&mut hasher);
        hasher.finish()
    }
}

impl Default for Trace {
    fn default() -> Self {
        Self::new()
    }
}
