//! What the torture cases share: backends, child runs and kills, the operator, and the
//! checks made from outside the agent (the world's files, the journal, the transcript).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use durable::store::{CallKind, CallStatus, Resolution, SessionStatus};
use durable::{CheckpointStore, Durable, SessionId};
use serde_json::Value;

use super::agent::{self, Options};
use super::model::Script;
use super::points::CrashPoint;
use super::tools;
use super::world::{CHANNELS, RECEIVERS, World};

/// A failed check: the message says what was expected and what was found.
pub type Failure = String;

/// A small seeded generator (SplitMix64): the same seed gives the same kill times.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// Where the sessions of a case are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// A SQLite file in a temporary directory.
    Sqlite,
    /// A fresh database on the throwaway PostgreSQL cluster.
    #[allow(dead_code)] // only built with the `_postgres-testing` feature
    Postgres,
}

impl Backend {
    /// `sqlite` or `postgres`.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
        }
    }
}

/// A database of one case, with the parent's own handle on it.
pub struct Db {
    /// The URL children get.
    pub url: String,
    /// The SQLite file, for `PRAGMA integrity_check`.
    pub sqlite_file: Option<PathBuf>,
    /// The parent's store.
    pub store: Arc<dyn CheckpointStore>,
    /// Postgres: the parent's own connections, tagged with [`PARENT_APP`].
    #[cfg(feature = "_postgres-testing")]
    probe: Option<std::sync::Mutex<sqlx::PgConnection>>,
}

/// The `application_name` of the parent's Postgres connections.
#[cfg(feature = "_postgres-testing")]
const PARENT_APP: &str = "torture-parent";

/// The parent's context: a runtime for store calls, the executable, a scratch directory.
pub struct Ctx {
    /// Runs the parent's store calls.
    pub rt: tokio::runtime::Runtime,
    /// This test binary (children are itself).
    pub exe: PathBuf,
    /// Scratch space, removed at the end.
    pub dir: tempfile::TempDir,
    counter: std::cell::Cell<u64>,
}

impl Ctx {
    /// A context.
    pub fn new() -> Self {
        Ctx {
            rt: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("tokio runtime"),
            exe: std::env::current_exe().expect("current exe"),
            dir: tempfile::Builder::new()
                .prefix("durable-torture-")
                .tempdir()
                .expect("tempdir"),
            counter: std::cell::Cell::new(0),
        }
    }

    /// A fresh name for files and sessions.
    pub fn fresh(&self, label: &str) -> String {
        let n = self.counter.get() + 1;
        self.counter.set(n);
        format!("{label}-{n}")
    }

    /// A new, empty database on `backend`.
    pub fn db(&self, backend: Backend) -> Db {
        let (url, sqlite_file) = match backend {
            Backend::Sqlite => {
                let file = self.dir.path().join(format!("{}.db", self.fresh("db")));
                (format!("sqlite:{}", file.display()), Some(file))
            }
            Backend::Postgres => (self.postgres_url(), None),
        };
        let store = match backend {
            Backend::Sqlite => self.rt.block_on(durable::connect(&url)),
            Backend::Postgres => self.rt.block_on(parent_store(&url)),
        }
        .unwrap_or_else(|e| panic!("open {url}: {e}"));
        Db {
            #[cfg(feature = "_postgres-testing")]
            probe: (backend == Backend::Postgres).then(|| {
                use sqlx::Connection;
                let conn = self
                    .rt
                    .block_on(sqlx::PgConnection::connect(&parent_url(&url)))
                    .expect("probe connection");
                std::sync::Mutex::new(conn)
            }),
            url,
            sqlite_file,
            store,
        }
    }

    #[cfg(feature = "_postgres-testing")]
    fn postgres_url(&self) -> String {
        let db = self
            .rt
            .block_on(durable::postgres::testing::test_database());
        db.url().to_owned()
    }

    #[cfg(not(feature = "_postgres-testing"))]
    fn postgres_url(&self) -> String {
        panic!("the Postgres cases need the `_postgres-testing` feature")
    }

    /// Waits until the database has finished the work of runs that are over.
    ///
    /// A killed client's last `COMMIT` may still be on its way through the server when
    /// the client is dead: Postgres completes it, then ends the backend when it reads
    /// end-of-file. Checks made before that would see a journal that is about to change.
    /// So: wait until no backend but the parent's is left on the database. (SQLite has
    /// no server: a dead process's work ends with it.)
    pub fn settle(&self, db: &Db) {
        #[cfg(feature = "_postgres-testing")]
        if let Some(probe) = &db.probe {
            let mut conn = probe
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let started = Instant::now();
            loop {
                let others: i64 = self
                    .rt
                    .block_on(
                        sqlx::query_scalar(
                            "SELECT count(*) FROM pg_stat_activity \
                             WHERE datname = current_database() AND pid <> pg_backend_pid() \
                             AND coalesce(application_name, '') <> $1",
                        )
                        .bind(PARENT_APP)
                        .fetch_one(&mut *conn),
                    )
                    .expect("pg_stat_activity");
                if others == 0 {
                    return;
                }
                assert!(
                    started.elapsed() < Duration::from_secs(10),
                    "{others} backends of finished runs still on the database after 10 s"
                );
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        let _ = db;
    }

    /// A new, empty world.
    pub fn world(&self) -> World {
        let world = World::new(self.dir.path().join(self.fresh("world")));
        world.create().expect("create world");
        world
    }
}

/// The parent's connection URL: the children's, with the parent's `application_name`.
#[cfg(feature = "_postgres-testing")]
fn parent_url(url: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}application_name={PARENT_APP}")
}

/// The parent's Postgres store, its connections tagged with [`PARENT_APP`].
#[cfg(feature = "_postgres-testing")]
async fn parent_store(url: &str) -> Result<Arc<dyn CheckpointStore>, durable::error::ConnectError> {
    let mut options = durable::postgres::PostgresStoreOptions::new(url);
    options.application_name = PARENT_APP.to_owned();
    Ok(Arc::new(
        durable::postgres::PostgresStore::connect_with(options).await?,
    ))
}

#[cfg(not(feature = "_postgres-testing"))]
async fn parent_store(url: &str) -> Result<Arc<dyn CheckpointStore>, durable::error::ConnectError> {
    durable::connect(url).await
}

/// A session of a case: where it is stored and what world it acts on.
pub struct Subject<'a> {
    /// The parent's context.
    pub ctx: &'a Ctx,
    /// The database.
    pub db: &'a Db,
    /// The world.
    pub world: World,
    /// Options of its runs.
    pub options: Options,
}

impl<'a> Subject<'a> {
    /// A new session of the torture script on `db`, with a world of its own.
    pub fn new(ctx: &'a Ctx, db: &'a Db) -> Self {
        let world = ctx.world();
        let session = ctx.fresh("session");
        let mut options = Options::new(
            db.url.clone(),
            world.dir().to_path_buf(),
            session,
            Script::Torture,
        );
        // The suite kills one session many times before it checkpoints (random kills,
        // killed replays of a recorded turn), which the default bound would rightly take
        // for a poison pill; poison pills have cases of their own (conformance, workers).
        options.max_recoveries = 1_000;
        Subject {
            ctx,
            db,
            world,
            options,
        }
    }

    /// The session id.
    pub fn id(&self) -> SessionId {
        SessionId::new(self.options.session.as_str())
    }

    /// Runs a child with these options, killed as `kill` says. The next run may start
    /// while the database still finishes the last one's work, as a restarted worker
    /// would; call [`settle`](Self::settle) before comparing journals.
    pub fn run(&self, options: &Options, kill: Kill) -> Run {
        run_child(&self.ctx.exe, options, kill)
    }

    /// Waits until the database finished the work of runs that are over ([`Ctx::settle`]).
    pub fn settle(&self) {
        self.ctx.settle(self.db);
    }

    /// A run to the end (or to an operator), never killed.
    pub fn run_plain(&self) -> Run {
        self.run(&self.options, Kill::Never)
    }

    /// What the journal holds for the session: nothing when a kill came before the
    /// session was created (its journal is then empty, and `calls` says the session is
    /// not found).
    pub fn journal(&self) -> Vec<durable::store::CallRecord> {
        match self.ctx.rt.block_on(self.db.store.calls(&self.id(), None)) {
            Ok(rows) => rows,
            Err(durable::StoreError::SessionNotFound(_)) => Vec::new(),
            Err(e) => panic!("journal rows: {e:?}"),
        }
    }

    /// The session's status.
    pub fn status(&self) -> SessionStatus {
        self.ctx
            .rt
            .block_on(self.db.store.session(&self.id()))
            .expect("session row")
            .status
    }

    /// Why the session was parked or failed, if it was.
    pub fn status_reason(&self) -> Option<String> {
        self.ctx
            .rt
            .block_on(self.db.store.session(&self.id()))
            .expect("session row")
            .status_reason
    }

    /// The latest checkpoint: transcript bytes, budget, plan.
    pub fn latest(&self) -> Snapshot {
        let cp = self
            .ctx
            .rt
            .block_on(self.db.store.load_checkpoint(&self.id(), None))
            .expect("latest checkpoint");
        Snapshot {
            transcript: serde_json::to_vec(&cp.message_values().expect("JSON messages"))
                .expect("encode transcript"),
            budget: cp.budget,
            plan: cp.plan,
            version: cp.meta.version,
        }
    }

    /// Resolves every in-doubt unsafe call as an operator would: found on its channel →
    /// happened, with the channel's answer as its result; not found → did not happen.
    pub fn operator(&self) -> usize {
        let durable = Durable::builder(Arc::clone(&self.db.store))
            .owner("operator")
            .app_version(agent::APP_VERSION)
            .build();
        let doubts = self
            .ctx
            .rt
            .block_on(durable.operator().in_doubt(Some(&self.id())))
            .expect("in-doubt calls");
        let mut resolved = 0;
        for call in doubts {
            let Some(channel) = tools::channel_of(&call.identity.tool) else {
                continue;
            };
            let resolution = match self
                .world
                .delivery_for(channel, call.id.as_str())
                .expect("read channel")
            {
                Some(delivery) => Resolution::Happened {
                    result: delivery.result,
                },
                None => Resolution::DidNotHappen,
            };
            self.ctx
                .rt
                .block_on(durable.operator().resolve(
                    &call.id,
                    resolution,
                    "torture-operator",
                    Some("checked the channel"),
                ))
                .expect("resolve");
            resolved += 1;
        }
        resolved
    }

    /// Approves every call of the session awaiting approval, as a person would: returns
    /// how many.
    pub fn approve_all(&self) -> usize {
        let durable = Durable::builder(Arc::clone(&self.db.store))
            .owner("approver")
            .app_version(agent::APP_VERSION)
            .build();
        let pending = self
            .ctx
            .rt
            .block_on(durable.operator().approvals(Some(&self.id())))
            .expect("pending approvals");
        for request in &pending {
            self.ctx
                .rt
                .block_on(durable.operator().approve(
                    &request.call.id,
                    None,
                    "torture-approver",
                    None,
                ))
                .expect("approve");
        }
        pending.len()
    }

    /// The session's approval log, by event name.
    pub fn approval_log(&self) -> BTreeMap<&'static str, usize> {
        let log = self
            .ctx
            .rt
            .block_on(self.db.store.approvals(&self.id()))
            .expect("approval log");
        let mut counts = BTreeMap::new();
        for row in log {
            *counts.entry(row.event.as_str()).or_insert(0) += 1;
        }
        counts
    }

    /// `PRAGMA integrity_check` on the SQLite file (`None` on Postgres).
    pub fn integrity(&self) -> Option<String> {
        let file = self.db.sqlite_file.as_ref()?;
        Some(self.ctx.rt.block_on(integrity_check(file)))
    }

    /// Counts of what happened in the world.
    pub fn counts(&self) -> Counts {
        Counts::of(&self.world)
    }
}

async fn integrity_check(file: &Path) -> String {
    use sqlx::{ConnectOptions, Row};
    let mut conn = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(file)
        .connect()
        .await
        .expect("open the SQLite file");
    let rows = sqlx::query("PRAGMA integrity_check")
        .fetch_all(&mut conn)
        .await
        .expect("PRAGMA integrity_check");
    rows.iter()
        .map(|r| r.try_get::<String, _>(0).unwrap_or_else(|e| e.to_string()))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The latest checkpoint, as compared between runs.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// The transcript, as bytes.
    pub transcript: Vec<u8>,
    /// The budget.
    pub budget: Value,
    /// The plan.
    pub plan: Value,
    /// Its version.
    pub version: i64,
}

/// What the world shows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counts {
    /// Deliveries per channel.
    pub delivered: BTreeMap<&'static str, usize>,
    /// Applied requests per receiver.
    pub applied: BTreeMap<&'static str, usize>,
    /// Requests per receiver (including deduplicated ones).
    pub requests: BTreeMap<&'static str, usize>,
    /// Tool body runs per tool.
    pub executions: BTreeMap<String, usize>,
}

impl Counts {
    /// Reads the world's files.
    pub fn of(world: &World) -> Self {
        let mut counts = Counts::default();
        for channel in CHANNELS {
            counts.delivered.insert(
                channel,
                world.deliveries(channel).expect("read channel").len(),
            );
        }
        for receiver in RECEIVERS {
            let requests = world.requests(receiver).expect("read receiver");
            counts
                .applied
                .insert(receiver, requests.iter().filter(|r| r.applied).count());
            counts.requests.insert(receiver, requests.len());
        }
        for e in world.executions().expect("read executions") {
            *counts.executions.entry(e.tool).or_default() += 1;
        }
        counts
    }

    /// Unsafe effects beyond the first, over all channels (a duplicate email, post…).
    pub fn duplicates(&self) -> usize {
        self.delivered
            .values()
            .map(|n| n.saturating_sub(1))
            .sum::<usize>()
            + self
                .applied
                .values()
                .map(|n| n.saturating_sub(1))
                .sum::<usize>()
    }

    /// Every channel delivered once and every receiver applied once.
    pub fn exactly_once(&self) -> bool {
        self.delivered.values().all(|n| *n == 1) && self.applied.values().all(|n| *n == 1)
    }

    /// Runs of one tool's body.
    pub fn ran(&self, tool: &str) -> usize {
        self.executions.get(tool).copied().unwrap_or(0)
    }
}

/// Recorded outcomes of a journal, by call id: `(status, result or error)`.
pub fn outcomes(rows: &[durable::store::CallRecord]) -> BTreeMap<String, (CallStatus, String)> {
    rows.iter()
        .filter(|r| r.status.has_outcome())
        .map(|r| {
            let value = r
                .result
                .as_ref()
                .or(r.error.as_ref())
                .map(Value::to_string)
                .unwrap_or_default();
            (r.id.as_str().to_owned(), (r.status, value))
        })
        .collect()
}

/// Outcomes in `before` that `after` lost or changed.
pub fn lost(
    before: &BTreeMap<String, (CallStatus, String)>,
    after: &BTreeMap<String, (CallStatus, String)>,
) -> Vec<String> {
    before
        .iter()
        .filter(|(id, outcome)| after.get(*id) != Some(*outcome))
        .map(|(id, (status, _))| format!("{id} ({})", status.as_str()))
        .collect()
}

/// Tool rows of the journal (model rows left out).
pub fn tool_rows(rows: &[durable::store::CallRecord]) -> usize {
    rows.iter().filter(|r| r.kind == CallKind::Tool).count()
}

/// How a child run is stopped.
#[derive(Debug, Clone, Copy)]
pub enum Kill {
    /// SIGKILL when the child reports that it reached its crash point.
    AtCrashPoint,
    /// SIGKILL this long after the spawn, if it is still running.
    After(Duration),
    /// Let it finish.
    Never,
}

/// How a child run ended.
#[derive(Debug, Clone)]
pub struct Run {
    /// Exit code, when it exited.
    pub code: Option<i32>,
    /// Whether the parent killed it.
    pub killed: bool,
    /// The crash point it reported reaching.
    pub crashed_at: Option<String>,
    /// Its stdout.
    pub lines: Vec<String>,
    /// From spawn to exit.
    pub elapsed: Duration,
}

impl Run {
    /// The `@@ <kind> …` lines, without the prefix.
    pub fn marks<'a>(&'a self, kind: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        let prefix = format!("@@ {kind} ");
        self.lines
            .iter()
            .filter_map(move |l| l.strip_prefix(prefix.as_str()))
    }

    /// Stdout, for failure messages.
    pub fn output(&self) -> String {
        self.lines.join("\n")
    }
}

/// Starts `exe` as a child with `options`, and kills it as `kill` says.
pub fn run_child(exe: &Path, options: &Options, kill: Kill) -> Run {
    let started = Instant::now();
    let mut child = options.command(exe).spawn().expect("spawn child");
    let stdout = child.stdout.take().expect("child stdout");
    let (tx, rx) = mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut lines = Vec::new();
    let mut killed = false;
    let mut crashed_at = None;
    match kill {
        Kill::AtCrashPoint => {
            for line in rx.iter() {
                if let Some(point) = line.strip_prefix("@@ crash ") {
                    crashed_at = Some(point.to_owned());
                    let _ = child.kill();
                    killed = true;
                    lines.push(line);
                    break;
                }
                lines.push(line);
            }
        }
        Kill::After(delay) => {
            std::thread::sleep(delay);
            if child.try_wait().expect("try_wait").is_none() {
                let _ = child.kill();
                killed = true;
            }
        }
        Kill::Never => {}
    }
    let status = child.wait().expect("wait for child");
    let elapsed = started.elapsed();
    let _ = reader.join();
    lines.extend(rx.try_iter());
    // A child that exited on its own between `try_wait` and `kill` was not killed.
    use std::os::unix::process::ExitStatusExt;
    if killed && status.signal() != Some(9) {
        killed = false;
    }
    Run {
        code: status.code(),
        killed,
        crashed_at,
        lines,
        elapsed,
    }
}

/// A crash point by its short name.
pub fn point(name: &str) -> CrashPoint {
    CrashPoint::parse(name).expect("crash point")
}
