//! Many workers in real processes, on a SQLite file and on PostgreSQL.
//!
//! This binary is its own child: with `DURABLE_WORKERS_ROLE` set it plays one worker
//! (`tests/workers/worker.rs`); otherwise it is the parent that spawns workers, kills,
//! stops and continues them, and checks the store and the ledger afterwards:
//!
//! | case | what |
//! |---|---|
//! | `race` | 2 workers resume one session at once, 200 trials: exactly one proceeds, the other gets `StoreError::Leased`; versions stay contiguous |
//! | `zombie` | A is stopped (SIGSTOP) past its lease, B recovers and completes, A is continued: none of A's writes is accepted, A exits with "lease lost" |
//! | `fleet` | 4 workers, 40 sessions, workers SIGKILLed at random and restarted: completed or parked, 0 duplicate unsafe effects, 0 lost results, keyed effects applied once |
//! | `fleet_server_restart` | the same with the PostgreSQL server crashed and restarted (`pg_ctl restart -m immediate`) twice mid-run |
//! | `poison` | 1 worker restarted under a stable owner resumes its session by id and aborts in a `pure` tool, again and again: each restart re-acquires its own live lease at once and counts the previous death (it ran the session); the one past the bound parks the session (`StoreError::Parked`) |
//! | `idle_leases` | 1 worker restarted under a stable owner takes 3 sessions by id without running them and is SIGKILLed, 8 times (bound 5): idle-lease deaths count nothing, no session is parked, each completes afterwards |
//! | `graceful` | a worker pool process is sent SIGTERM mid-run: it exits 0 having released every lease; a second pool process claims at once (well under the 30 s TTL) and completes all; effects once each (ledger) |
//! | `sigterm_mid_{pure,keyed,unsafe,checkpoint}` | a pool process is held inside a tool call of each replay class (before its effect), or right before a checkpoint, and sent SIGTERM there: the call finishes and records once, the pool exits 0 with `aborted 0` and the session's lease released; a second pool claims it under 1 s (TTL 30 s) and completes everything; effects once each |
//! | `sigterm_deadline` | three calls held past a 500 ms shutdown deadline, right after their effects: the pool aborts them (`aborted 3`) and exits, leaving their leases to expire (TTL 2 s); the next pool recovers them after the TTL: the verified email is found sent, the unverified one is in doubt (parked), the keyed charge re-executes with the same key and is applied once; 0 duplicates |
//! | `rolling_deploy` | 3 pool processes (16 sessions at most each), 30 sessions, the pools restarted one by one with SIGTERM for two full rounds: all completed, 0 recoveries, every release claimed again within 3 s (TTL 30 s; median and max handoff, throughput printed), 0 duplicates |
//! | `rolling_deploy_saturated` | the same with 4 sessions at most per pool (12 slots for 30 sessions): a released session goes before those not yet started (claims take the oldest by creation), handoffs within 3 s |
//! | `fleet_limit` | 4 pool processes run 16 sessions of a queue limited to 3 and 8 of the default queue, one pool restarted with SIGTERM: the store, sampled every few ms, never has more than 3 of the limited queue leased, and has 3 at some point; the default queue runs past 3; effects once each |
//! | `sleepers` | 12 sessions sleep 1.5 s after step 0; while they sleep one pool is SIGKILLed and the other stopped; two new pools wake each session exactly once, never before its wake-up time (store clock); effects once each |
//! | `rate_limit` | 4 processes on SQLite, 8 on PostgreSQL, 4 sessions each, under one limit of 20 calls/s (burst 5) for 10 s (`DURABLE_LIMITS_LONG=1`: 60 s): the observed rate within 5% of the limit, no window above the capacity plus the rate, every waiter served; a 429 reported halfway holds every process for its `retry-after` |
//! | `fanout` | a coordinator starts 20 child sessions and awaits them all, on 4 pool processes SIGKILLed at random (12 kills) and restarted: exactly 20 children, each completed, each child's email once (ledger), the coordinator's sum of their results |
//! | `synchronous_commit_off` | an unsafe tool refuses to run (`NotDurable` naming the setting) |
//!
//! The PostgreSQL cases need the `_postgres-testing` feature (`--all-features`, as
//! `scripts/test.sh` runs): a throwaway cluster, or `DATABASE_URL`.
//!
//! `harness = false`: one line per case, then `test result: … N passed; N failed`.
//! Arguments filter cases by substring (`cargo test --test workers -- zombie`).

#[path = "workers/backend.rs"]
mod backend;
#[cfg(feature = "_postgres-testing")]
#[path = "workers/durability.rs"]
mod durability;
#[path = "workers/fanout.rs"]
mod fanout;
#[path = "workers/fleet.rs"]
mod fleet;
#[path = "workers/graceful.rs"]
mod graceful;
#[path = "workers/hook.rs"]
mod hook;
#[path = "workers/ledger.rs"]
mod ledger;
#[path = "workers/limited.rs"]
mod limited;
#[path = "workers/poison.rs"]
mod poison;
#[path = "workers/proc.rs"]
mod proc;
#[path = "workers/queues.rs"]
mod queues;
#[path = "workers/race.rs"]
mod race;
#[path = "workers/rolling.rs"]
mod rolling;
#[path = "workers/sigterm.rs"]
mod sigterm;
#[path = "workers/worker.rs"]
mod worker;
#[path = "workers/zombie.rs"]
mod zombie;

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::time::Instant;

use backend::Backend;
use sigterm::Point;

type Case = fn() -> Pin<Box<dyn Future<Output = ()>>>;

fn cases() -> Vec<(&'static str, Case)> {
    #[allow(unused_mut)]
    let mut cases: Vec<(&'static str, Case)> = vec![
        ("sqlite_race", || Box::pin(race::race(Backend::sqlite()))),
        ("sqlite_zombie", || {
            Box::pin(zombie::zombie(Backend::sqlite()))
        }),
        ("sqlite_fleet", || {
            Box::pin(fleet::fleet(Backend::sqlite(), 0))
        }),
        ("sqlite_poison", || {
            Box::pin(poison::poison(Backend::sqlite()))
        }),
        ("sqlite_idle_leases", || {
            Box::pin(poison::idle_leases(Backend::sqlite()))
        }),
        ("sqlite_graceful", || {
            Box::pin(graceful::graceful(Backend::sqlite()))
        }),
        ("sqlite_sigterm_mid_pure", || {
            Box::pin(sigterm::mid_call(Backend::sqlite(), Point::Pure))
        }),
        ("sqlite_sigterm_mid_keyed", || {
            Box::pin(sigterm::mid_call(Backend::sqlite(), Point::Keyed))
        }),
        ("sqlite_sigterm_mid_unsafe", || {
            Box::pin(sigterm::mid_call(Backend::sqlite(), Point::Unsafe))
        }),
        ("sqlite_sigterm_mid_checkpoint", || {
            Box::pin(sigterm::mid_call(Backend::sqlite(), Point::Checkpoint))
        }),
        ("sqlite_sigterm_deadline", || {
            Box::pin(sigterm::deadline(Backend::sqlite()))
        }),
        ("sqlite_rolling_deploy", || {
            Box::pin(rolling::rolling(Backend::sqlite(), rolling::SPARE))
        }),
        ("sqlite_rolling_deploy_saturated", || {
            Box::pin(rolling::rolling(Backend::sqlite(), rolling::SATURATED))
        }),
        ("sqlite_fleet_limit", || {
            Box::pin(queues::fleet_limit(Backend::sqlite()))
        }),
        ("sqlite_sleepers", || {
            Box::pin(queues::sleepers(Backend::sqlite()))
        }),
        ("sqlite_rate_limit", || {
            Box::pin(limited::rate_limit(Backend::sqlite(), 4))
        }),
        ("sqlite_fanout", || {
            Box::pin(fanout::fanout(Backend::sqlite()))
        }),
    ];
    #[cfg(feature = "_postgres-testing")]
    cases.extend([
        (
            "postgres_race",
            (|| Box::pin(async { race::race(Backend::postgres().await).await })) as Case,
        ),
        ("postgres_zombie", || {
            Box::pin(async { zombie::zombie(Backend::postgres().await).await })
        }),
        ("postgres_poison", || {
            Box::pin(async { poison::poison(Backend::postgres().await).await })
        }),
        ("postgres_idle_leases", || {
            Box::pin(async { poison::idle_leases(Backend::postgres().await).await })
        }),
        ("postgres_graceful", || {
            Box::pin(async { graceful::graceful(Backend::postgres().await).await })
        }),
        ("postgres_sigterm_mid_pure", || {
            Box::pin(async { sigterm::mid_call(Backend::postgres().await, Point::Pure).await })
        }),
        ("postgres_sigterm_mid_keyed", || {
            Box::pin(async { sigterm::mid_call(Backend::postgres().await, Point::Keyed).await })
        }),
        ("postgres_sigterm_mid_unsafe", || {
            Box::pin(async { sigterm::mid_call(Backend::postgres().await, Point::Unsafe).await })
        }),
        ("postgres_sigterm_mid_checkpoint", || {
            Box::pin(async {
                sigterm::mid_call(Backend::postgres().await, Point::Checkpoint).await
            })
        }),
        ("postgres_sigterm_deadline", || {
            Box::pin(async { sigterm::deadline(Backend::postgres().await).await })
        }),
        ("postgres_rolling_deploy", || {
            Box::pin(async { rolling::rolling(Backend::postgres().await, rolling::SPARE).await })
        }),
        ("postgres_rolling_deploy_saturated", || {
            Box::pin(async {
                rolling::rolling(Backend::postgres().await, rolling::SATURATED).await
            })
        }),
        ("postgres_fleet_limit", || {
            Box::pin(async { queues::fleet_limit(Backend::postgres().await).await })
        }),
        ("postgres_sleepers", || {
            Box::pin(async { queues::sleepers(Backend::postgres().await).await })
        }),
        ("postgres_rate_limit", || {
            Box::pin(async { limited::rate_limit(Backend::postgres().await, 8).await })
        }),
        ("postgres_fanout", || {
            Box::pin(async { fanout::fanout(Backend::postgres().await).await })
        }),
        ("postgres_fleet", || {
            Box::pin(async { fleet::fleet(Backend::postgres().await, 0).await })
        }),
        ("postgres_fleet_server_restart", || {
            Box::pin(async { fleet::fleet(Backend::postgres().await, 2).await })
        }),
        ("postgres_synchronous_commit_off", || {
            Box::pin(durability::synchronous_commit_off())
        }),
    ]);
    cases
}

/// Why a case cannot run here: only a server restart on a server we do not own.
fn cannot_run(name: &str) -> Option<&'static str> {
    let shared_server = std::env::var("DATABASE_URL").is_ok_and(|u| !u.trim().is_empty());
    (name.contains("server_restart") && shared_server).then_some(
        "DATABASE_URL is set and its server is never restarted by tests; unset it to run this \
         case on a throwaway cluster",
    )
}

fn main() {
    if let Ok(role) = std::env::var(worker::ROLE) {
        std::process::exit(worker::main(&role));
    }
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let (mut passed, mut failed, mut ignored, mut filtered) = (0, 0, 0, 0);
    for (name, case) in cases() {
        if !filter.is_empty() && !filter.iter().any(|f| name.contains(f.as_str())) {
            filtered += 1;
            continue;
        }
        if let Some(reason) = cannot_run(name) {
            println!("test {name} ... ignored, {reason}");
            ignored += 1;
            continue;
        }
        let started = Instant::now();
        // A runtime per case: a panicking case takes only its own runtime down.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let ok = std::panic::catch_unwind(AssertUnwindSafe(|| runtime.block_on(case()))).is_ok();
        let took = started.elapsed().as_secs_f64();
        if ok {
            println!("test {name} ... ok ({took:.1} s)");
            passed += 1;
        } else {
            println!("test {name} ... FAILED ({took:.1} s)");
            failed += 1;
        }
    }
    println!(
        "\ntest result: {}. {passed} passed; {failed} failed; {ignored} ignored; 0 measured; {filtered} filtered out",
        if failed == 0 { "ok" } else { "FAILED" }
    );
    if failed > 0 {
        std::process::exit(101);
    }
}
