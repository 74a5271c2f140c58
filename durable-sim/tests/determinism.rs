//! One seed, one run: on the memory store and tokio's paused clock, running a seed twice
//! in one process gives the same event log, bit for bit. Anything nondeterministic that
//! creeps back (the wall clock, a hash map's order, a random draw no seed controls)
//! makes these runs differ.

use durable_sim::{Options, run_seed};

fn first_difference(a: &[String], b: &[String]) -> String {
    match a.iter().zip(b).position(|(x, y)| x != y) {
        Some(i) => format!("event {i}: `{}` vs `{}`", a[i], b[i]),
        None => format!("one log is longer: {} vs {} events", a.len(), b.len()),
    }
}

#[test]
fn the_same_seed_twice_gives_the_same_trace() {
    let options = Options::default();
    for seed in [3, 11, 42] {
        let first = run_seed(seed, &options);
        let second = run_seed(seed, &options);
        assert!(
            first.events.len() > 100,
            "seed {seed} did too little to compare: {}",
            first.summary
        );
        assert_eq!(
            (first.trace, first.events.len()),
            (second.trace, second.events.len()),
            "seed {seed} ran differently the second time: {}\n{}\n{}",
            first_difference(&first.events, &second.events),
            first.summary,
            second.summary
        );
        assert_eq!(first.violations, second.violations);
    }
}
