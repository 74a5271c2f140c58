//! One run of the tier: a fresh store on the simulated disk, then cycles of: arm a cut at
//! a random write operation, run the workers until the power goes, close everything,
//! apply the cut, reopen and check.

use durable_core::store::{JournalStore, SessionStore};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use durable_core::store::{CallStatus, SessionStatus};
use durable_core::{CheckpointStore, Durable, SessionId, StoreError};
use durable_powercut::{Policy, PowerCut, Rng};
use durable_sqlite::{SqliteStore, SqliteStoreOptions};
use sqlx::sqlite::SqliteSynchronous;

use crate::workload::{self, Tools, World, lock};

/// The highest write operation a cut is armed at (a cycle of one to three workers
/// reaches it in a few dozen turns).
const MAX_OPS: u64 = 300;

/// How the store is opened.
#[derive(Debug, Clone, Copy)]
pub struct Mode {
    pub name: &'static str,
    pub synchronous: SqliteSynchronous,
    /// The store reports itself durable whatever its setting (the counterexample).
    pub report_durable: bool,
}

pub const FULL: Mode = Mode {
    name: "synchronous = FULL",
    synchronous: SqliteSynchronous::Full,
    report_durable: false,
};

/// What the tier counted.
#[derive(Debug, Default, Clone)]
pub struct Figures {
    pub runs: u64,
    pub cuts: u64,
    pub drop_cuts: u64,
    pub tear_cuts: u64,
    /// Cuts that came while the store was being created (before it was acknowledged).
    pub cuts_at_creation: u64,
    /// Write operations the workload made before its cuts.
    pub ops: u64,
    pub sectors_lost: u64,
    pub sectors_kept: u64,
    pub garbage_sectors: u64,
    /// Ledger effects of keyed and unsafe tools checked against the store, summed over
    /// cuts (each cut checks every effect of its run so far).
    pub issued_checks: u64,
    /// Distinct keyed and unsafe effects in the ledgers.
    pub effects: u64,
    pub checkpoint_checks: u64,
    /// Effects in the ledger whose journal row was missing after a cut: acknowledged
    /// *issued* rows lost (each counted once, however many cuts find it missing).
    pub lost_issued: u64,
    /// Acknowledged checkpoints (or completions) missing after a cut, each counted once.
    pub lost_checkpoints: u64,
    /// What was found lost so far in this run: (session, turn, tool), and (session,
    /// version) for checkpoints.
    lost_seen: BTreeSet<(String, i64, &'static str)>,
    /// Emails sent more than once (extra sends).
    pub duplicates: u64,
    /// Charges run under more than one idempotency key.
    pub key_mismatches: u64,
    /// Refusals after a cut: the store did not open, or integrity/verify found damage.
    pub loud: u64,
    /// Of those, refusals by the rollback witness (`StoreError::RolledBack`): acknowledged
    /// effects missing from the database, named; their calls count in `lost_issued`.
    pub witness_refusals: u64,
    /// Cuts during the store's creation that left an empty file, refused on reopen
    /// (`NotAStore`) before anything was acknowledged; the file is then removed.
    pub empty_at_creation: u64,
    pub in_doubt_resolved: u64,
    pub pure_runs: u64,
    /// WAL checkpoints (moving the WAL into the database file) that completed while a
    /// cut was armed.
    pub wal_checkpoints: u64,
    /// Problems that fail the case, each with the run seed.
    pub failures: Vec<String>,
}

impl Figures {
    pub fn add(&mut self, other: Figures) {
        self.runs += other.runs;
        self.cuts += other.cuts;
        self.drop_cuts += other.drop_cuts;
        self.tear_cuts += other.tear_cuts;
        self.cuts_at_creation += other.cuts_at_creation;
        self.ops += other.ops;
        self.sectors_lost += other.sectors_lost;
        self.sectors_kept += other.sectors_kept;
        self.garbage_sectors += other.garbage_sectors;
        self.issued_checks += other.issued_checks;
        self.effects += other.effects;
        self.checkpoint_checks += other.checkpoint_checks;
        self.lost_issued += other.lost_issued;
        self.lost_checkpoints += other.lost_checkpoints;
        self.duplicates += other.duplicates;
        self.key_mismatches += other.key_mismatches;
        self.loud += other.loud;
        self.witness_refusals += other.witness_refusals;
        self.empty_at_creation += other.empty_at_creation;
        self.in_doubt_resolved += other.in_doubt_resolved;
        self.pure_runs += other.pure_runs;
        self.wal_checkpoints += other.wal_checkpoints;
        self.failures.extend(other.failures);
    }
}

async fn open(path: &Path, mode: Mode, power: &PowerCut) -> Result<SqliteStore, StoreError> {
    SqliteStore::connect_with(
        SqliteStoreOptions::file(path)
            .vfs(power.vfs_name())
            .dangerous_synchronous(mode.synchronous)
            .dangerous_report_durable(mode.report_durable),
    )
    .await
}

/// Checkpoints the WAL into the database file every few milliseconds until the power
/// goes, so that cuts also land in the middle of a checkpoint (writes to the database
/// file, its sync, the WAL's reset and truncation), which SQLite otherwise runs only every
/// 1000 pages and at the last close. Returns how many completed.
async fn checkpointer(pool: sqlx::SqlitePool, power: PowerCut) -> u64 {
    let mut done = 0;
    let mut round = 0_u64;
    while !power.is_cut() {
        tokio::time::sleep(Duration::from_millis(3)).await;
        round += 1;
        let sql = if round.is_multiple_of(4) {
            "PRAGMA wal_checkpoint(TRUNCATE)"
        } else {
            "PRAGMA wal_checkpoint(PASSIVE)"
        };
        // (busy, WAL frames, frames checkpointed); busy or cut: try again or stop.
        if let Ok((0, _, _)) = sqlx::query_as::<_, (i64, i64, i64)>(sql)
            .fetch_one(&pool)
            .await
        {
            done += 1;
        }
    }
    done
}

/// Waits until `done` holds, up to `limit`.
async fn wait_for(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while !done() {
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    true
}

/// One run: `cycles` cuts on one store. `strict`: every loss or damage is a failure.
pub async fn run(
    mode: Mode,
    power: &PowerCut,
    run_seed: u64,
    cycles: u64,
    strict: bool,
) -> Figures {
    let mut rng = Rng::new(run_seed);
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("agent.db");
    let world = Arc::new(World::default());
    let tools = Arc::new(Tools::new());
    let workers = 1 + rng.below(3) as usize;
    let slots: Vec<Arc<Mutex<Option<String>>>> =
        (0..workers).map(|_| Arc::new(Mutex::new(None))).collect();
    let mut fig = Figures {
        runs: 1,
        ..Figures::default()
    };
    let fail = |fig: &mut Figures, what: String| {
        fig.failures.push(format!(
            "{}: run {run_seed:#x}: {what}\n  reproduce: DURABLE_POWER_RUN={run_seed:#x} cargo test -p durable-powercut --test power_loss -- full",
            mode.name
        ));
    };
    // One run in eight cuts the power while the store is being created (within its
    // first 40 write operations); the others create it first.
    let mut created = false;
    if rng.below(8) != 0 {
        match open(&path, mode, power).await {
            Ok(store) => {
                store.close().await;
                created = true;
            }
            Err(e) => {
                fail(&mut fig, format!("a new store did not open: {e}"));
                return fig;
            }
        }
    }

    for cycle in 0..cycles {
        power.arm(1 + rng.below(if created { MAX_OPS } else { 40 }));
        // The workers (the first cycle of a run that cuts at creation opens here).
        let opened = open(&path, mode, power).await;
        match opened {
            Ok(store) => {
                created = true;
                let store = Arc::new(store);
                let durable = Durable::builder(Arc::clone(&store) as Arc<dyn CheckpointStore>)
                    .owner("worker")
                    .renew_leases(false)
                    .max_recovery_attempts(i32::MAX)
                    .build();
                let mut tasks = Vec::new();
                for (i, slot) in slots.iter().enumerate() {
                    let current = lock(slot).clone();
                    tasks.push(tokio::spawn(workload::worker(
                        durable.clone(),
                        Arc::clone(&world),
                        Arc::clone(&tools),
                        power.clone(),
                        format!("w{i}"),
                        current,
                        Arc::clone(slot),
                    )));
                }
                let checkpointer = tokio::spawn(checkpointer(store.pool().clone(), power.clone()));
                let cut = wait_for(Duration::from_secs(30), || {
                    power.is_cut() || tasks.iter().all(|t| t.is_finished())
                })
                .await;
                if !power.is_cut() {
                    let why = if cut {
                        "every worker stopped"
                    } else {
                        "30 s passed"
                    };
                    fail(&mut fig, format!("cycle {cycle}: {why} before the cut"));
                    power.cut_now();
                }
                for task in tasks {
                    let abort = task.abort_handle();
                    if tokio::time::timeout(Duration::from_secs(10), task)
                        .await
                        .is_err()
                    {
                        abort.abort();
                        fail(
                            &mut fig,
                            format!("cycle {cycle}: a worker did not stop after the cut"),
                        );
                    }
                }
                match tokio::time::timeout(Duration::from_secs(10), checkpointer).await {
                    Ok(Ok(n)) => fig.wal_checkpoints += n,
                    _ => fail(
                        &mut fig,
                        format!("cycle {cycle}: the checkpointer did not stop"),
                    ),
                }
                drop(durable);
                store.close().await;
            }
            // The power went while opening.
            Err(_) if power.is_cut() => {}
            Err(e) => {
                fail(
                    &mut fig,
                    format!("cycle {cycle}: the store did not open with the power on: {e}"),
                );
                return fig;
            }
        }
        fig.ops += power.ops();
        if !wait_for(Duration::from_secs(10), || power.open_handles() == 0).await {
            fail(
                &mut fig,
                format!(
                    "cycle {cycle}: {} file handles still open after closing the store",
                    power.open_handles()
                ),
            );
            return fig;
        }
        let policy = if rng.below(2) == 0 {
            fig.drop_cuts += 1;
            Policy::DropUnsynced
        } else {
            fig.tear_cuts += 1;
            Policy::Tear
        };
        // The torn sectors from a generator of the cycle's own, so that the main one
        // (cut points, policies) does not drift with how many sectors were unsynced.
        let mut tear = Rng::new(rng.next_u64());
        let report = power.restart(policy, &mut tear).expect("apply the cut");
        fig.cuts += 1;
        fig.sectors_lost += report.lost;
        fig.sectors_kept += report.kept;
        fig.garbage_sectors += report.garbage;
        if !created {
            fig.cuts_at_creation += 1;
        }
        for problem in lock(&world.unexpected).drain(..) {
            fail(
                &mut fig,
                format!("cycle {cycle}: with the power on: {problem}"),
            );
        }
        match check(&path, mode, power, &world, created, &mut fig).await {
            Checked::Sound => created = true,
            Checked::NeverCreated => created = false,
            Checked::Refused => {
                if strict {
                    fail(&mut fig, format!("cycle {cycle} ({policy:?}): see above"));
                }
                // A store refused after a cut ends the run (an operator would restore it).
                break;
            }
        }
        if strict && (fig.lost_issued + fig.lost_checkpoints > 0) {
            fail(
                &mut fig,
                format!("cycle {cycle} ({policy:?}): acknowledged rows lost"),
            );
            break;
        }
    }
    let ledger = lock(&world.ledger).clone();
    fig.effects = ledger.len() as u64;
    let mut sends: BTreeMap<(String, i64), u64> = BTreeMap::new();
    let mut keys: BTreeMap<(String, i64), BTreeSet<Option<String>>> = BTreeMap::new();
    for effect in &ledger {
        match effect.tool {
            "send" => {
                *sends
                    .entry((effect.session.clone(), effect.turn))
                    .or_default() += 1
            }
            _ => {
                keys.entry((effect.session.clone(), effect.turn))
                    .or_default()
                    .insert(effect.key.clone());
            }
        }
    }
    fig.duplicates = sends.values().map(|n| n - 1).sum();
    fig.key_mismatches = keys.values().filter(|k| k.len() > 1).count() as u64;
    if strict && fig.duplicates + fig.key_mismatches > 0 {
        let what = format!(
            "{} emails sent twice, {} charges under two keys",
            fig.duplicates, fig.key_mismatches
        );
        fail(&mut fig, what);
    }
    fig.in_doubt_resolved = world.resolved.load(Ordering::SeqCst);
    fig.pure_runs = world.pure_runs.load(Ordering::SeqCst);
    fig
}

/// What a check after a cut found.
enum Checked {
    /// The store opened, is intact and holds everything acknowledged.
    Sound,
    /// The cut came before the store was ever acknowledged and left no store: refused
    /// loudly (an empty file), removed; the next cycle creates it again.
    NeverCreated,
    /// The store was refused or found damaged (loud); details in the figures.
    Refused,
}

/// After a cut, with the power back: reopens the store and checks it against the world
/// (losses are counted in `fig`).
async fn check(
    path: &Path,
    mode: Mode,
    power: &PowerCut,
    world: &World,
    created: bool,
    fig: &mut Figures,
) -> Checked {
    let store = match open(path, mode, power).await {
        Ok(store) => store,
        // Cut before the store was ever acknowledged: an empty file is refused loudly
        // (`NotAStore`: durable never turns an existing empty file into a store), and
        // nothing was acknowledged, so nothing can be lost. The run starts over.
        Err(StoreError::NotAStore { .. }) if !created => {
            fig.empty_at_creation += 1;
            std::fs::remove_file(path).expect("remove the empty store file");
            return Checked::NeverCreated;
        }
        Err(e) => {
            fig.loud += 1;
            if matches!(e, StoreError::RolledBack { .. }) {
                // The witness saw effects the database lost: count them as lost rows
                // (found loudly, by name), as the checks below would have.
                fig.witness_refusals += 1;
                if let Ok(reader) = SqliteStore::connect_with(
                    SqliteStoreOptions::file(path)
                        .vfs(power.vfs_name())
                        .read_only(true),
                )
                .await
                {
                    fig.lost_issued += reader.rollback_report().lost.len() as u64;
                    reader.close().await;
                }
            }
            fig.failures_note(format!("the store does not open after the cut: {e}"));
            return Checked::Refused;
        }
    };
    let result = check_open(&store, world, fig).await;
    store.close().await;
    match result {
        Ok(()) => Checked::Sound,
        Err(problem) => {
            fig.loud += 1;
            fig.failures_note(problem);
            Checked::Refused
        }
    }
}

impl Figures {
    /// A note kept for the failure report of a strict run (and shown by the
    /// counterexample): the first few only.
    fn failures_note(&mut self, note: String) {
        if self.failures.len() < 20 {
            self.failures.push(note);
        }
    }
}

/// Integrity, seals, and the ledger against the journal. `Err`: damage found loudly.
async fn check_open(store: &SqliteStore, world: &World, fig: &mut Figures) -> Result<(), String> {
    let integrity: Vec<String> = sqlx::query_scalar("PRAGMA integrity_check")
        .fetch_all(store.pool())
        .await
        .map_err(|e| format!("PRAGMA integrity_check failed: {e}"))?;
    if integrity != ["ok"] {
        return Err(format!("PRAGMA integrity_check: {integrity:?}"));
    }
    let checks = durable_core::verify::verify_sessions(store, None)
        .await
        .map_err(|e| format!("verify: {e}"))?;
    if let Some(bad) = checks.iter().find(|c| !c.is_ok()) {
        return Err(format!(
            "verify: session {}: {:?}",
            bad.session, bad.problem
        ));
    }
    let ledger = lock(&world.ledger).clone();
    let mut by_session: BTreeMap<&str, Vec<&workload::Effect>> = BTreeMap::new();
    for effect in &ledger {
        by_session
            .entry(effect.session.as_str())
            .or_default()
            .push(effect);
    }
    for (session, effects) in by_session {
        let rows = match store.calls(&SessionId::new(session), None).await {
            Ok(rows) => rows,
            Err(StoreError::SessionNotFound(_)) => Vec::new(),
            Err(e) => return Err(format!("journal of {session}: {e}")),
        };
        let recorded: BTreeSet<(String, i64)> = rows
            .iter()
            .filter(|r| r.status != CallStatus::NotHappened)
            .filter_map(|r| Some((r.identity.tool.clone(), r.args["turn"].as_i64()?)))
            .collect();
        for effect in effects {
            fig.issued_checks += 1;
            if !recorded.contains(&(effect.tool.to_owned(), effect.turn))
                && fig
                    .lost_seen
                    .insert((session.to_owned(), effect.turn, effect.tool))
            {
                fig.lost_issued += 1;
                fig.failures_note(format!(
                    "`{}` of {session} turn {} ran (ledger) but its journal row is gone",
                    effect.tool, effect.turn
                ));
            }
        }
    }
    let checkpoints = lock(&world.checkpoints).clone();
    let completed = lock(&world.completed).clone();
    for (session, version) in checkpoints {
        fig.checkpoint_checks += 1;
        let lost = match store.session(&SessionId::new(&session)).await {
            Ok(record) => {
                record.latest_version < version
                    || (completed.contains(&session) && record.status != SessionStatus::Completed)
            }
            Err(StoreError::SessionNotFound(_)) => true,
            Err(e) => return Err(format!("session {session}: {e}")),
        };
        if lost
            && fig
                .lost_seen
                .insert((session.clone(), version, "checkpoint"))
        {
            fig.lost_checkpoints += 1;
            fig.failures_note(format!(
                "{session}: acknowledged checkpoint {version} (or its completion) is gone"
            ));
        }
    }
    Ok(())
}
