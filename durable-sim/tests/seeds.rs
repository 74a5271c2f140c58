//! CI's budget of seeds: every invariant holds for each (see the crate docs).

use durable_sim::{Options, reproduce, run_seed};

/// Seeds run by default, on the memory store and virtual time: under a minute on two busy
/// cores (debug build). Seed 147 once sent an email twice (a worker paused between its
/// claim and its resume trusted a lease that had already expired).
const DEFAULT_SEEDS: u64 = 150;

#[test]
fn a_fixed_budget_of_seeds_keeps_every_invariant() {
    let seeds = std::env::var("DURABLE_SIM_SEEDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(DEFAULT_SEEDS);
    let options = Options::default();
    for seed in 0..seeds {
        let report = run_seed(seed, &options);
        println!("{}", report.summary);
        assert!(
            report.passed(),
            "seed {seed} broke an invariant:\n{}\nreproduce with: {}",
            report.violations.join("\n"),
            reproduce(seed, &options)
        );
    }
}
