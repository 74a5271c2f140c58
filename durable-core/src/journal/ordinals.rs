//! Ordinals and model positions, reserved per step and handed back when no journal row
//! was written for them.
//!
//! A call's ordinal (or a model reply's position) is part of its identity. If a number
//! were used up by an attempt that wrote nothing (a store error, a refusal, a model call
//! that failed, a future dropped mid-call), the calls after it would shift by one, and a
//! turn re-run after a crash would map its calls onto the wrong rows: a recorded reply
//! returned to the wrong model call, a fresh ordinal for an effect that already ran. So a
//! number is held by a [`Reservation`] and returns to the pool, smallest first, unless
//! the reservation is [kept](Reservation::keep) once a row holds it.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

/// `(tool, input_hash)`; model replies use `(MODEL_SLOT, "")`.
pub(crate) type Key = (String, String);

#[derive(Debug, Default)]
pub(crate) struct Numbers {
    step: i64,
    next: HashMap<Key, i64>,
    free: HashMap<Key, BTreeSet<i64>>,
}

impl Numbers {
    pub(crate) fn new(step: i64) -> Self {
        Numbers {
            step,
            ..Numbers::default()
        }
    }

    /// Restarts numbering for a new step.
    pub(crate) fn reset(&mut self, step: i64) {
        *self = Numbers::new(step);
    }

    fn take(&mut self, key: &Key) -> i64 {
        if let Some(n) = self.free.get_mut(key).and_then(BTreeSet::pop_first) {
            return n;
        }
        let next = self.next.entry(key.clone()).or_insert(0);
        let n = *next;
        *next += 1;
        n
    }

    fn give_back(&mut self, step: i64, key: Key, n: i64) {
        if self.step == step {
            self.free.entry(key).or_default().insert(n);
        }
    }
}

fn lock<S>(numbers: &Mutex<S>) -> std::sync::MutexGuard<'_, S> {
    numbers
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl AsMut<Numbers> for Numbers {
    fn as_mut(&mut self) -> &mut Numbers {
        self
    }
}

/// A reserved ordinal or position: handed back on drop unless kept. `S` is what holds
/// the numbers (the journal's state; bare [`Numbers`] in tests): dropping a reservation
/// takes its lock.
pub(crate) struct Reservation<S: AsMut<Numbers> = super::JournalState> {
    numbers: Arc<Mutex<S>>,
    step: i64,
    key: Key,
    n: i64,
    kept: bool,
}

impl<S: AsMut<Numbers>> Reservation<S> {
    /// Reserves the smallest free number for `key` in the current step.
    pub(crate) fn take(numbers: &Arc<Mutex<S>>, key: Key) -> Self {
        let mut guard = lock(numbers);
        let held = guard.as_mut();
        let n = held.take(&key);
        Reservation {
            numbers: Arc::clone(numbers),
            step: held.step,
            key,
            n,
            kept: false,
        }
    }

    /// The reserved number.
    pub(crate) fn number(&self) -> i64 {
        self.n
    }

    /// A journal row holds this number now: it is never handed out again in this step.
    pub(crate) fn keep(&mut self) {
        self.kept = true;
    }

    /// Undoes [`keep`](Self::keep): the call was refused, and a retry must get this number
    /// (and so the same row) again.
    pub(crate) fn release(&mut self) {
        self.kept = false;
    }
}

impl<S: AsMut<Numbers>> Drop for Reservation<S> {
    fn drop(&mut self) {
        if !self.kept {
            lock(&self.numbers).as_mut().give_back(
                self.step,
                std::mem::take(&mut self.key),
                self.n,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(tool: &str) -> Key {
        (tool.to_owned(), "h".to_owned())
    }

    #[test]
    fn numbers_not_kept_are_handed_out_again_smallest_first() {
        let numbers = Arc::new(Mutex::new(Numbers::new(0)));
        let mut a = Reservation::take(&numbers, key("t"));
        let b = Reservation::take(&numbers, key("t"));
        let c = Reservation::take(&numbers, key("t"));
        assert_eq!((a.number(), b.number(), c.number()), (0, 1, 2));
        a.keep();
        drop(c);
        drop(b);
        assert_eq!(Reservation::take(&numbers, key("t")).number(), 1);
        let other = Reservation::take(&numbers, key("other"));
        assert_eq!(other.number(), 0, "keys are numbered separately");
    }

    #[test]
    fn a_number_from_an_old_step_is_not_handed_back() {
        let numbers = Arc::new(Mutex::new(Numbers::new(0)));
        let r = Reservation::take(&numbers, key("t"));
        lock(&numbers).reset(1);
        drop(r);
        let mut next = Reservation::take(&numbers, key("t"));
        assert_eq!(next.number(), 0);
        next.keep();
        assert_eq!(Reservation::take(&numbers, key("t")).number(), 1);
    }
}
