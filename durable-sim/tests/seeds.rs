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

/// The number before `what` in a run's summary (`3 retargets`).
fn counted(summary: &str, what: &str) -> usize {
    summary
        .split(';')
        .flat_map(|part| part.split(','))
        .find_map(|part| part.trim().strip_suffix(what)?.trim().parse().ok())
        .unwrap_or(0)
}

/// The seeds CI runs do exercise the operator's retargets and the rows lost between a
/// crash and the next resume, and every invariant holds for them (a session that lost a
/// row refused as tampered, its effect never run again).
#[test]
fn the_operator_retargets_and_rows_are_lost_in_the_ci_seeds() {
    let options = Options::default();
    let (mut retargets, mut lost) = (0, 0);
    for seed in 0..40 {
        let report = run_seed(seed, &options);
        assert!(
            report.passed(),
            "seed {seed} broke an invariant:\n{}\nreproduce with: {}",
            report.violations.join("\n"),
            reproduce(seed, &options)
        );
        retargets += counted(&report.summary, "retargets");
        lost += counted(&report.summary, "sessions lost a row");
    }
    assert!(
        retargets >= 20,
        "the operator retargeted {retargets} times in 40 runs"
    );
    assert!(lost >= 4, "{lost} sessions lost a row in 40 runs");
}
