//! Runs the fleet simulation: `--seed N` (one seed; `--trace` prints its event log),
//! `--seeds N` (seeds `--start`..), `--for 2h` (as many seeds as fit); `--sqlite` (SQLite
//! on the real clock instead of the memory store on virtual time),
//! `--no-pause-after-commit`, `--guard-off <guard>` (a revert experiment).

use std::process::ExitCode;
use std::time::{Duration, Instant};

use durable_sim::{Backend, GUARDS, Options, reproduce, run_seed};

fn duration(text: &str) -> Option<Duration> {
    let (number, unit) = text.split_at(text.find(|c: char| !c.is_ascii_digit())?);
    let n: u64 = number.parse().ok()?;
    Some(Duration::from_secs(match unit {
        "s" => n,
        "m" => n * 60,
        "h" => n * 3_600,
        _ => return None,
    }))
}

fn usage(problem: &str) -> ExitCode {
    eprintln!(
        "{problem}\nusage: durable-sim [--seed N [--trace] | --seeds N [--start S] | --for 30s|10m|2h] [--sqlite] \
         [--no-pause-after-commit] [--guard-off {}]",
        GUARDS.join("|")
    );
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let (mut one, mut count, mut start, mut until) = (None, None, 0u64, None);
    let mut print_trace = false;
    let mut options = Options::default();
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or_else(|| format!("{name} needs a value"));
        let parsed = match arg.as_str() {
            "--seed" => value("--seed").and_then(|v| {
                v.parse()
                    .map_err(|e| format!("--seed: {e}"))
                    .map(|v| one = Some(v))
            }),
            "--seeds" => value("--seeds").and_then(|v| {
                v.parse()
                    .map_err(|e| format!("--seeds: {e}"))
                    .map(|v| count = Some(v))
            }),
            "--start" => value("--start").and_then(|v| {
                v.parse()
                    .map_err(|e| format!("--start: {e}"))
                    .map(|v| start = v)
            }),
            "--for" => value("--for").and_then(|v| {
                duration(&v)
                    .ok_or(format!("--for: not a duration: {v}"))
                    .map(|d| until = Some(Instant::now() + d))
            }),
            "--pause-after-commit" => {
                options.pause_after_commit = true;
                Ok(())
            }
            "--no-pause-after-commit" => {
                options.pause_after_commit = false;
                Ok(())
            }
            "--sqlite" => {
                options.backend = Backend::Sqlite;
                Ok(())
            }
            "--trace" => {
                print_trace = true;
                Ok(())
            }
            "--guard-off" => value("--guard-off").and_then(|g| {
                if GUARDS.contains(&g.as_str()) {
                    options.guard_off = Some(g);
                    Ok(())
                } else {
                    Err(format!("--guard-off: not a guard: {g}"))
                }
            }),
            other => Err(format!("unknown argument `{other}`")),
        };
        if let Err(problem) = parsed {
            return usage(&problem);
        }
    }
    if let Some(seed) = one {
        let report = run_seed(seed, &options);
        if print_trace {
            for event in &report.events {
                println!("{event}");
            }
        }
        println!("{}", report.summary);
        for v in &report.violations {
            println!("VIOLATION: {v}");
        }
        return if report.passed() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
    }
    if count.is_none() && until.is_none() {
        return usage("say how many seeds: --seed, --seeds or --for");
    }
    let started = Instant::now();
    let mut seed = start;
    let mut ran = 0u64;
    loop {
        if count.is_some_and(|n| ran >= n) || until.is_some_and(|t| Instant::now() >= t) {
            break;
        }
        let report = run_seed(seed, &options);
        ran += 1;
        if !report.passed() {
            println!("{}", report.summary);
            for v in &report.violations {
                println!("VIOLATION: {v}");
            }
            println!(
                "seed {seed} failed after {ran} seeds; reproduce with: {}",
                reproduce(seed, &options)
            );
            return ExitCode::FAILURE;
        }
        if ran.is_multiple_of(10) {
            println!(
                "{ran} seeds passed ({:.0}s)",
                started.elapsed().as_secs_f64()
            );
        }
        seed += 1;
    }
    println!(
        "{ran} seeds passed ({start}..{seed}) in {:.0}s",
        started.elapsed().as_secs_f64()
    );
    ExitCode::SUCCESS
}
