//! The runner: settings, backends, the corpus, generation with a fixed seed, shrinking,
//! and the figures.

use std::any::Any;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use durable::CheckpointStore;
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

use crate::interp::{self, Outcome};
use crate::program::{self, Class, Disrupt, Op};
use crate::world::{Property, Violation};

/// The default run's seed: CI generates the same programs every time.
const DEFAULT_SEED: u64 = 0x6d62_7409;
const DEFAULT_CASES: u32 = 512;
const DEFAULT_STEPS: usize = 12;
/// A program that takes longer has hung (a deadlocked store call).
const PROGRAM_TIMEOUT: Duration = Duration::from_secs(60);
/// Shrinking budget per broken property.
const SHRINK_RUNS: u32 = 500;
const SHRINK_TIME: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
        }
    }
}

struct Settings {
    cases: u32,
    seed: u64,
    max_len: usize,
    save: Option<PathBuf>,
}

fn env_number(name: &str) -> Option<u64> {
    let text = std::env::var(name).ok()?;
    let text = text.trim();
    let parsed = match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => text.parse(),
    };
    Some(parsed.unwrap_or_else(|e| panic!("{name}=`{text}` is not a number: {e}")))
}

impl Settings {
    fn from_env() -> Self {
        let seed = match std::env::var("DURABLE_MBT_SEED").as_deref().map(str::trim) {
            Ok("random") => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(DEFAULT_SEED, |d| d.as_nanos() as u64),
            _ => env_number("DURABLE_MBT_SEED").unwrap_or(DEFAULT_SEED),
        };
        Settings {
            cases: env_number("DURABLE_MBT_CASES")
                .map_or(DEFAULT_CASES, |n| u32::try_from(n).unwrap_or(u32::MAX)),
            seed,
            max_len: env_number("DURABLE_MBT_STEPS").map_or(DEFAULT_STEPS, |n| {
                usize::try_from(n).unwrap_or(DEFAULT_STEPS).max(1)
            }),
            save: std::env::var_os("DURABLE_MBT_SAVE").map(PathBuf::from),
        }
    }
}

/// The corpus: every `*.txt` under `tests/model_based/corpus/`, in name order.
fn corpus() -> Vec<(String, Vec<Op>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/model_based/corpus");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "txt"))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files
        .into_iter()
        .map(|path| {
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
            let program = program::parse(&text)
                .unwrap_or_else(|e| panic!("corpus file {}: {e}", path.display()));
            (name, program)
        })
        .collect()
}

/// A store on a fresh database, and what must outlive it.
async fn open(backend: Backend) -> (Arc<dyn CheckpointStore>, Box<dyn Any>) {
    match backend {
        Backend::Sqlite => {
            let dir = tempfile::tempdir().expect("a temporary directory");
            let store = durable::sqlite::SqliteStore::open(dir.path().join("model_based.db"))
                .await
                .expect("open the SQLite store");
            (Arc::new(store), Box::new(dir))
        }
        #[cfg(feature = "_postgres-testing")]
        Backend::Postgres => {
            let database = durable_postgres::testing::test_database().await;
            let store = database.store().await.expect("open the PostgreSQL store");
            (Arc::new(store), Box::new(database))
        }
        #[cfg(not(feature = "_postgres-testing"))]
        Backend::Postgres => unreachable!("PostgreSQL runs only with `_postgres-testing`"),
    }
}

/// What one backend's run found for one property: the first failing program, shrunk.
struct Found {
    program: Vec<Op>,
    violations: Vec<Violation>,
    origin: String,
    shrink_runs: u32,
}

#[derive(Default)]
struct Report {
    programs: u64,
    steps: u64,
    failures: u64,
    shrink_runs: u64,
    /// What the corpus and generated programs did (not the shrinking runs).
    tally: BTreeMap<String, u64>,
    failed_corpus: Vec<(String, Vec<Violation>)>,
    found: BTreeMap<Property, Found>,
}

impl Report {
    fn count(&mut self, outcome: &Outcome) {
        self.programs += 1;
        self.steps += outcome.steps as u64;
        for (what, n) in &outcome.tally {
            *self.tally.entry(what.clone()).or_default() += n;
        }
    }
}

struct Bench {
    store: Arc<dyn CheckpointStore>,
    runs: u64,
}

impl Bench {
    async fn run(&mut self, kind: char, program: &[Op]) -> Outcome {
        self.runs += 1;
        let tag = format!("mbt{kind}{}", self.runs);
        let store = Arc::clone(&self.store);
        match tokio::time::timeout(PROGRAM_TIMEOUT, interp::run(store, tag, program)).await {
            Ok(outcome) => outcome,
            Err(_) => Outcome {
                steps: program.len(),
                violations: vec![Violation {
                    property: Property::Harness,
                    detail: format!("the program did not finish within {PROGRAM_TIMEOUT:?}"),
                }],
                tally: BTreeMap::new(),
            },
        }
    }
}

/// Shrinks `tree` (whose current program broke `property`) to a smaller program that
/// still breaks it.
async fn shrink(
    bench: &mut Bench,
    tree: &mut impl ValueTree<Value = Vec<Op>>,
    property: Property,
    violations: Vec<Violation>,
) -> (Vec<Op>, Vec<Violation>, u32) {
    let mut best = (tree.current(), violations);
    let started = Instant::now();
    let mut runs = 0;
    if tree.simplify() {
        while runs < SHRINK_RUNS && started.elapsed() < SHRINK_TIME {
            runs += 1;
            let candidate = tree.current();
            let outcome = bench.run('s', &candidate).await;
            if outcome.violations.iter().any(|v| v.property == property) {
                best = (candidate, outcome.violations);
                if !tree.simplify() {
                    break;
                }
            } else if !tree.complicate() {
                break;
            }
        }
    }
    let (program, violations, more) = tidy(bench, property, best.0, best.1).await;
    (program, violations, runs + more)
}

/// Simpler variants of step `i` of `program`, simplest first: without it; for a turn, one
/// undisturbed `pure` call, undisturbed, with fewer calls.
fn variants(program: &[Op], i: usize) -> Vec<Vec<Op>> {
    let mut out = Vec::new();
    let mut without = program.to_vec();
    without.remove(i);
    out.push(without);
    if let Op::Turn { calls, disrupt } = &program[i] {
        let mut replace = |op: Op| {
            if op != program[i] {
                let mut changed = program.to_vec();
                changed[i] = op;
                out.push(changed);
            }
        };
        replace(Op::Turn {
            calls: vec![Class::Pure],
            disrupt: Disrupt::None,
        });
        replace(Op::Turn {
            calls: calls.clone(),
            disrupt: Disrupt::None,
        });
        let first = match disrupt {
            Disrupt::CrashBeforeEffect(_) => Disrupt::CrashBeforeEffect(0),
            Disrupt::CrashAfterEffect(_) => Disrupt::CrashAfterEffect(0),
            Disrupt::LoseLeaseInCall(_) => Disrupt::LoseLeaseInCall(0),
            other => *other,
        };
        for call in calls {
            for disrupt in [*disrupt, first] {
                replace(Op::Turn {
                    calls: vec![*call],
                    disrupt,
                });
            }
        }
    }
    out
}

/// After proptest's shrinking: greedily drops steps and simplifies turns while the
/// program still breaks `property` (proptest shrinks each value towards its own
/// simplest form, which leaves e.g. a disruption that no longer matters).
async fn tidy(
    bench: &mut Bench,
    property: Property,
    mut program: Vec<Op>,
    mut violations: Vec<Violation>,
) -> (Vec<Op>, Vec<Violation>, u32) {
    let mut runs = 0;
    let mut changed = true;
    while changed && runs < SHRINK_RUNS {
        changed = false;
        let mut i = 0;
        while i < program.len() {
            for candidate in variants(&program, i) {
                runs += 1;
                let outcome = bench.run('t', &candidate).await;
                if outcome.violations.iter().any(|v| v.property == property) {
                    program = candidate;
                    violations = outcome.violations;
                    changed = true;
                    break;
                }
            }
            i += 1;
        }
    }
    (program, violations, runs)
}

fn seed_bytes(seed: u64) -> [u8; 32] {
    let mut bytes = [0u8; 32];
    for (i, chunk) in bytes.chunks_mut(8).enumerate() {
        let word =
            seed.rotate_left(17 * i as u32) ^ (0x9e37_79b9_7f4a_7c15u64.wrapping_mul(i as u64 + 1));
        chunk.copy_from_slice(&word.to_le_bytes());
    }
    bytes
}

async fn run_backend(
    backend: Backend,
    settings: &Settings,
    corpus: &[(String, Vec<Op>)],
) -> Report {
    let (store, guard) = open(backend).await;
    let mut bench = Bench { store, runs: 0 };
    let mut report = Report::default();

    for (name, program) in corpus {
        let outcome = bench.run('c', program).await;
        report.count(&outcome);
        if !outcome.violations.is_empty() {
            report.failures += 1;
            report
                .failed_corpus
                .push((name.clone(), outcome.violations));
        }
    }

    let config = Config {
        cases: settings.cases,
        rng_algorithm: RngAlgorithm::ChaCha,
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner = TestRunner::new_with_rng(
        config,
        TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes(settings.seed)),
    );
    let strategy = program::programs(settings.max_len);
    for case in 0..settings.cases {
        let mut tree = strategy
            .new_tree(&mut runner)
            .expect("the program strategy never rejects");
        let program = tree.current();
        assert!(
            program::round_trips(&program),
            "program does not read back from its text:\n{}",
            program::render(&program)
        );
        let outcome = bench.run('g', &program).await;
        report.count(&outcome);
        if outcome.violations.is_empty() {
            continue;
        }
        report.failures += 1;
        let mut broken: Vec<Property> = outcome.violations.iter().map(|v| v.property).collect();
        broken.sort();
        broken.dedup();
        // Shrink the first program that breaks each property (one at a time: the tree
        // is spent by shrinking, so a program that breaks two properties is shrunk for
        // the first new one).
        if let Some(&property) = broken.iter().find(|p| !report.found.contains_key(p)) {
            let before = bench.runs;
            let (program, violations, shrink_runs) =
                shrink(&mut bench, &mut tree, property, outcome.violations).await;
            report.shrink_runs += bench.runs - before;
            report.found.insert(
                property,
                Found {
                    program,
                    violations,
                    origin: format!("generated program {case}"),
                    shrink_runs,
                },
            );
        }
    }
    drop(bench);
    drop(guard);
    report
}

/// `1234567` as `1,234,567`.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("      {l}\n")).collect()
}

fn save(dir: &Path, backend: Backend, settings: &Settings, property: Property, found: &Found) {
    let mut text = format!(
        "# {property} broken on {backend} (seed {seed:#x}, {origin}, shrunk in {runs} runs):\n",
        property = property.name(),
        backend = backend.name(),
        seed = settings.seed,
        origin = found.origin,
        runs = found.shrink_runs,
    );
    for v in found
        .violations
        .iter()
        .filter(|v| v.property == property)
        .take(3)
    {
        text.push_str(&format!("#   {}\n", v.detail));
    }
    text.push_str(&program::render(&found.program));
    let path = dir.join(format!("{}-{}.txt", backend.name(), property.name()));
    if let Err(e) = std::fs::create_dir_all(dir).and_then(|()| std::fs::write(&path, text)) {
        eprintln!("cannot save {}: {e}", path.display());
    }
}

fn print_report(backend: Backend, settings: &Settings, report: &Report, secs: f64) {
    println!(
        "model_based {}: {} programs, {} steps, {} failures ({secs:.1} s; {} shrinking runs)",
        backend.name(),
        thousands(report.programs),
        thousands(report.steps),
        thousands(report.failures),
        thousands(report.shrink_runs),
    );
    let tally: Vec<String> = report
        .tally
        .iter()
        .map(|(what, n)| format!("{what}: {}", thousands(*n)))
        .collect();
    println!("  covered: {}", tally.join("; "));
    for (name, violations) in &report.failed_corpus {
        println!("  corpus {name} fails:");
        for v in violations.iter().take(4) {
            println!("    {}: {}", v.property.name(), v.detail);
        }
    }
    for (property, found) in &report.found {
        println!(
            "  {} broken by {} (shrunk to {} steps in {} runs):",
            property.name(),
            found.origin,
            found.program.len(),
            found.shrink_runs
        );
        print!("{}", indent(&program::render(&found.program)));
        for v in found
            .violations
            .iter()
            .filter(|v| v.property == *property)
            .take(3)
        {
            println!("    -> {}", v.detail);
        }
        if let Some(dir) = &settings.save {
            save(dir, backend, settings, *property, found);
        }
    }
}

/// Runs everything; returns the process exit code.
pub fn main() -> i32 {
    let started = Instant::now();
    let settings = Settings::from_env();
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let mut backends = vec![Backend::Sqlite];
    if cfg!(feature = "_postgres-testing") {
        backends.push(Backend::Postgres);
    }
    backends.retain(|b| filter.is_empty() || filter.iter().any(|f| b.name().contains(f.as_str())));
    let corpus = corpus();
    println!(
        "model_based: seed {:#x} (DURABLE_MBT_SEED), {} generated programs per backend (DURABLE_MBT_CASES), up to {} steps, {} corpus programs",
        settings.seed,
        settings.cases,
        settings.max_len,
        corpus.len()
    );
    if !cfg!(feature = "_postgres-testing") {
        println!("model_based: PostgreSQL not built (run with --all-features)");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let (mut passed, mut failed) = (0, 0);
    for backend in backends {
        let t = Instant::now();
        let report = runtime.block_on(run_backend(backend, &settings, &corpus));
        print_report(backend, &settings, &report, t.elapsed().as_secs_f64());
        if report.failures == 0 {
            passed += 1;
        } else {
            failed += 1;
        }
    }
    println!(
        "\ntest result: {}. {passed} passed; {failed} failed; 0 ignored; 0 measured; 0 filtered out; finished in {:.1} s",
        if failed == 0 { "ok" } else { "FAILED" },
        started.elapsed().as_secs_f64()
    );
    if failed > 0 { 101 } else { 0 }
}
