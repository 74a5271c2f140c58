//! `durable`: the operator's command-line tool for the sessions, checkpoints and call
//! journal of a `durable` store (SQLite file or PostgreSQL).
//!
//! Run `durable --help` for the commands and exit codes. Every command takes `--json`
//! for scripts; errors are one `error: …` line on stderr with a meaningful exit code.

/// `println!` that stops quietly when stdout is closed (`durable … | head`) instead of
/// panicking on a broken pipe.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use ::std::io::Write as _;
        if ::std::writeln!(::std::io::stdout().lock(), $($arg)*).is_err() {
            ::std::process::exit(0);
        }
    }};
}

mod approvals;
mod backup;
mod budget;
mod display;
mod error;
mod inspect;
mod limits;
mod open;
mod operate;
mod render;
#[cfg(feature = "console")]
mod serve;
mod signals;
mod verify;
mod workers;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use durable::store::SessionStatus;

use crate::error::{CliError, Code};
use crate::workers::{QueueLimitArgs, TenantLimitArgs, WakeArgs, WorkersArgs};

const EXIT_CODES: &str = "\
Exit codes:
  0  success
  1  unexpected failure (a database error mid-command, corrupt data or a row written by
     a newer release)
  2  usage error (unknown flag, missing argument, bad duration or mapping, no store given)
  3  not found (session, call or checkpoint version)
  4  refused (call not in doubt or not awaiting approval, id already taken, app version
     changed meanwhile, approval request past its deadline, waking a session not active,
     a change asked of a read-only store, a call that needs an operator first, a
     cancelled session)
  5  invalid input (malformed JSON result, edited arguments the tool does not accept, an
     empty denial reason, unreadable file)
  6  database unavailable (no such file, not a durable store, cannot connect, unknown
     URL, schema too new, sealed with a key DURABLE_MAC_KEY does not hold)
  7  integrity check failed (a row was changed outside durable, the store was rolled
     back)

The store: --db, else the DURABLE_DB environment variable, else DATABASE_URL (the
variable sqlx and most PostgreSQL tools read). An empty variable counts as unset.

Commands that only read (sessions, show, calls, in-doubt, approvals without --expire,
workers, export, backup, verify, and --dry-run) open the store read-only: they never create, migrate or change a database.
Everything read from the store is shown with control characters escaped (`\\e`,
`\\u{9b}`) and clipped in tables; --json keeps every value whole.

Examples:
  durable --db agent.db sessions --status active
  durable --db agent.db in-doubt
  durable --db agent.db resolve 5f0c… --happened --result '{\"id\": \"m-1\"}' --note 'in outbox'
  durable --db agent.db approvals
  durable --db agent.db approve 7c1e… --args '{\"amount\": 50, \"card\": \"<secret>\"}' --note 'capped'
  durable --db agent.db deny 7c1e… --reason 'refunds above 100 need a ticket'
  durable --db agent.db approvals --expire
  durable --db agent.db retarget 5f0c… --app-version shop/2 --map lookup=read_order --dry-run
  durable --db agent.db workers
  durable --db agent.db queue-limit email 2
  durable --db agent.db backup --to agent-backup.db
  durable --db agent.db serve
  DURABLE_DB=postgres://durable@db/agents durable sessions --json";

/// Inspect and operate durable agent sessions: list and show sessions, read the call
/// journal, resolve in-doubt calls, approve or deny calls awaiting approval, watch worker
/// pools (queues, leases, sleepers), wake a session, limit a queue, fork, export
/// replay-check fixtures, prune, move a session to another app version, back up and
/// verify the store.
#[derive(Debug, Parser)]
#[command(name = "durable", version, after_help = EXIT_CODES, max_term_width = 100)]
struct Cli {
    /// The store: a SQLite file (`agent.db`, `sqlite:agent.db`) or a PostgreSQL URL
    /// (`postgres://user@host/db`). Without --db: $DURABLE_DB, else $DATABASE_URL.
    #[arg(long, global = true, value_name = "URL")]
    db: Option<String>,

    /// Print JSON on stdout instead of tables (for scripts).
    #[arg(long, global = true)]
    json: bool,

    /// Read a store whose key is lost without checking its seals (read-only commands
    /// only). Nothing shown is authenticated: every output is marked UNVERIFIED.
    #[arg(long, global = true)]
    unverified: bool,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List sessions, most recently updated first.
    Sessions(SessionsArgs),
    /// Show one session: checkpoints, plan, budget, the transcript tail, and its calls in
    /// doubt or awaiting approval.
    Show(ShowArgs),
    /// List a session's journal: every tool call and model response.
    Calls(CallsArgs),
    /// List calls in doubt: issued, outcome unknown, their worker gone.
    #[command(name = "in-doubt")]
    InDoubt(InDoubtArgs),
    /// Record what happened to an in-doubt call (audited with who, when and why).
    #[command(after_help = RESOLVE_HELP)]
    Resolve(ResolveArgs),
    /// List calls awaiting a person's approval, oldest first (--expire: deny those past
    /// their deadline).
    #[command(after_help = APPROVALS_HELP)]
    Approvals(ApprovalsArgs),
    /// Approve a call awaiting approval, as requested or with edited arguments (audited).
    #[command(after_help = APPROVE_HELP)]
    Approve(ApproveArgs),
    /// Deny a call awaiting approval; the reason is the tool result the model reads (audited).
    #[command(after_help = DENY_HELP)]
    Deny(DenyArgs),
    /// Return a parked session to active, so that a worker resumes it.
    #[command(after_help = UNPARK_HELP)]
    Unpark(UnparkArgs),
    /// Show a session's spend against its ceilings, or raise one (audited; a session
    /// parked at its ceiling goes on).
    #[command(after_help = budget::BUDGET_HELP)]
    Budget(budget::BudgetArgs),
    /// Cancel a session and its children (audited with who and why): at once when no
    /// worker holds it, at its next safe point when one does.
    #[command(after_help = CANCEL_HELP)]
    Cancel(CancelArgs),
    /// Send a signal into a session (steer a running agent, answer one that waits), or
    /// list a session's signals.
    #[command(after_help = signals::SIGNAL_HELP)]
    Signal(signals::SignalArgs),
    /// Show the worker pools: queues with their limits and depths, who holds which lease
    /// and when it last renewed, and the sleeping sessions with their due time.
    #[command(after_help = workers::WORKERS_HELP)]
    Workers(WorkersArgs),
    /// Show the fleet's rate limits: their definitions, the current rate, the waiters and
    /// a provider's hold.
    #[command(after_help = limits::LIMITS_HELP)]
    Limits(limits::LimitsArgs),
    /// End a session's sleep now, so that the next claim takes it.
    #[command(after_help = workers::WAKE_HELP)]
    Wake(WakeArgs),
    /// Set (or --remove) a queue's fleet-wide limit of sessions running at once.
    #[command(name = "queue-limit", after_help = workers::QUEUE_LIMIT_HELP)]
    QueueLimit(QueueLimitArgs),
    /// Set (or --remove) a tenant's fleet-wide limit of sessions running at once.
    #[command(name = "tenant-limit", after_help = workers::TENANT_LIMIT_HELP)]
    TenantLimit(TenantLimitArgs),
    /// Start a new session from a checkpoint of another one; it never repeats the
    /// parent's effects (--dry-run shows what it inherits).
    #[command(after_help = FORK_HELP)]
    Fork(ForkArgs),
    /// Write checkpoints as replay-check fixtures, one JSON file each.
    #[command(after_help = EXPORT_HELP)]
    Export(ExportArgs),
    /// Delete terminal sessions not updated within a retention window.
    #[command(after_help = PRUNE_HELP)]
    Prune(PruneArgs),
    /// Move a session to another app version, renaming steps or tools in its journal (audited).
    ///
    /// Not a schema migration: the database schema is never touched.
    #[command(after_help = RETARGET_HELP)]
    Retarget(RetargetArgs),
    /// Copy a SQLite store to a new file while it is in use (PostgreSQL: how to pg_dump).
    #[command(after_help = BACKUP_HELP)]
    Backup(BackupArgs),
    /// Check every seal, chain and count of the store (or one session), offline.
    #[command(after_help = VERIFY_HELP)]
    Verify(VerifyArgs),
    /// Let a rolled-back store run again: park every session whose effects the rollback
    /// made unknown (audited).
    #[command(name = "acknowledge-rollback", after_help = ACK_HELP)]
    AcknowledgeRollback(AckArgs),
    /// Move the store to the key in DURABLE_MAC_KEY (rotation, or turning a key on).
    #[command(after_help = REKEY_HELP)]
    Rekey,
    /// Serve the operator console in the browser: sessions, timelines, the in-doubt inbox.
    #[cfg(feature = "console")]
    #[command(after_help = SERVE_HELP)]
    Serve(ServeArgs),
}

/// How a command uses the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Opened read-only: nothing is created, migrated or written.
    Read,
    /// Opened for writing (the store must exist and be a durable store already).
    Write,
}

impl Command {
    fn access(&self) -> Access {
        match self {
            Command::Resolve(_)
            | Command::Approve(_)
            | Command::Deny(_)
            | Command::Unpark(_)
            | Command::Cancel(_)
            | Command::Wake(_)
            | Command::QueueLimit(_)
            | Command::TenantLimit(_)
            | Command::Fork(_)
            | Command::Rekey => Access::Write,
            Command::Approvals(a) if a.expire => Access::Write,
            Command::Budget(a) if a.action.writes() => Access::Write,
            Command::Signal(a) if a.action.writes() => Access::Write,
            #[cfg(feature = "console")]
            Command::Serve(_) => Access::Write,
            Command::Prune(a) if !a.dry_run => Access::Write,
            Command::Retarget(a) if !a.dry_run => Access::Write,
            Command::Sessions(_)
            | Command::Show(_)
            | Command::Calls(_)
            | Command::InDoubt(_)
            | Command::Approvals(_)
            | Command::Budget(_)
            | Command::Signal(_)
            | Command::Workers(_)
            | Command::Limits(_)
            | Command::Export(_)
            | Command::Prune(_)
            | Command::Retarget(_)
            | Command::Backup(_)
            | Command::Verify(_) => Access::Read,
            // Opened by the command itself: a writer's ordinary open refuses the store.
            Command::AcknowledgeRollback(_) => Access::Write,
        }
    }
}

const BACKUP_HELP: &str = "\
SQLite: writes a consistent copy of the store to FILE (`VACUUM INTO`, one read
transaction, so workers keep running), created readable by you only; an existing FILE is
refused. The copy is then opened read-only and checked (`PRAGMA integrity_check`, the
durable schema) before the command reports the sessions and bytes copied. Copying the
`.db` file yourself is not a backup: acknowledged writes may still be in the `-wal` file.

Restoring a backup is a rollback: every effect that ran after the copy was taken is
missing from it, and a worker that trusted it would run those effects again. A restored
store therefore refuses every writer (its rollback witness, `<store>-witness`, names the
calls it lost; restored elsewhere, it has no witness at all) until an operator runs
`durable acknowledge-rollback`, which parks the sessions whose effects became unknown.

PostgreSQL: prints the `pg_dump` command for the durable tables (password redacted) and
writes nothing.";

const ACK_HELP: &str = "\
A store notices when it was rolled back, and every worker then refuses to open it
(`... was rolled back: ...`) rather than run lost effects a second time:

SQLite keeps a rollback witness beside its file (`<file>-witness`): every call whose
effect may run is noted there once its *issued* row is committed. A store that lost rows
(its `-wal` deleted, the `.db` file copied or restored alone, a backup put back, a new
store at an old path) no longer matches it. This command parks each session with lost
calls (its status reason names them), recreates parked any session lost entirely (so
starting it again by id is refused), audits the decision in the integrity log and
rebuilds the witness. With no witness at all (moved or restored without it) it cannot
know which sessions are affected and parks every unfinished one, unless --intact says the
copy is complete.

PostgreSQL records where the store lives (cluster, timeline, database and table OIDs): a
dump restored with pg_restore, a point-in-time recovery, a promoted replica or a copy in
another database is refused. This command parks every unfinished session, unless
--intact says nothing was lost (a planned switchover with synchronous replication), audits
the decision and records the new place. A file-system snapshot of the whole cluster put
back as it was is not detected.

Stop every worker first. Then check each parked session's effects at their source and
`durable unpark` it. If the lost `-wal` (or the old database) still exists, put it back
instead.";

const VERIFY_HELP: &str = "\
Reads every checkpoint with its transcript, the whole journal and the resolutions of each
session through the store's checked reads, and reports per session `ok` or `TAMPERED`
with the first problem found (a changed, deleted, reordered or forged row). Then shows
the store's integrity log (every adoption, re-keying and restored key row) and checks the
seal over it, and runs the database's own check (SQLite: `PRAGMA integrity_check`).
Exits 7 if anything failed. Read-only: it never repairs; restore a backup taken before
the change.";

const REKEY_HELP: &str = "\
Opens the store for writing with the keys of the environment, which moves it to
DURABLE_MAC_KEY: every row is checked under the key it is sealed with now and re-sealed
under the new one, in one transaction, audited in the integrity log (`durable verify`
shows it).

  Rotating:        DURABLE_MAC_KEY=<new> DURABLE_PREVIOUS_MAC_KEYS=<old> durable rekey
  Turning a key on over the store's own key: DURABLE_MAC_KEY=<new> durable rekey

Stop every worker first: a worker still running with the old key fails its next write
with an integrity error, which can leave an unsafe call in doubt. Start the workers again
with the new key (the old one is no longer accepted).";

#[cfg(feature = "console")]
const SERVE_HELP: &str = "\
Serves the console on 127.0.0.1:7878 (--bind to change it; an address other than loopback
also needs --allow-remote, and prints a warning: the console speaks plain HTTP). It prints
its URL, and the token every request needs: $DURABLE_CONSOLE_TOKEN when set, else 32
random bytes generated at start. Log in with the token in the browser (an HttpOnly,
SameSite=Strict cookie), or send `Authorization: Bearer <token>` from scripts.

Pages: the sessions (filtered by status, app version and age, with their calls in doubt),
a session's timeline (journal rows, checkpoints and resolutions beside the transcript, any
checkpoint version, fork from a version), the calls in doubt with their decisions
(happened with a result / did not happen), the calls awaiting approval, and the worker
pools (queues, leases, sleeping sessions with *wake now*), each change shown before it is
submitted. GET never
changes anything; every change is a POST with a CSRF token. Store text is HTML-escaped
and secrets are masked as in `show` and `calls`.

The store is opened for writing, as `resolve` opens it (a signed store needs
DURABLE_MAC_KEY). If it can only be opened read-only, or with --read-only, the console
serves it read-only and says so on every form. Stop it with Ctrl-C.";

#[cfg(feature = "console")]
#[derive(Debug, Args)]
struct ServeArgs {
    /// The address and port to listen on.
    #[arg(long, value_name = "ADDR", default_value = durable_console::DEFAULT_BIND, value_parser = serve::parse_bind)]
    bind: std::net::SocketAddr,
    /// Allow a --bind address other than loopback (reachable from other machines).
    #[arg(long)]
    allow_remote: bool,
    /// Serve read-only: show everything, change nothing.
    #[arg(long)]
    read_only: bool,
    /// Who decides, for the audit rows (default: $USER; each form can change it).
    #[arg(long, value_name = "NAME")]
    by: Option<String>,
}

#[derive(Debug, Args)]
struct VerifyArgs {
    /// Only this session.
    session: Option<String>,
}

#[derive(Debug, Args)]
struct BackupArgs {
    /// The new file to write (SQLite); it must not exist.
    #[arg(long, value_name = "FILE")]
    to: Option<PathBuf>,
}

const RESOLVE_HELP: &str = "\
An `unsafe_on_replay` call whose worker died between recording it and recording its
outcome is in doubt: the runtime refuses to run it again. Find out whether the effect
happened (the outbox, the payment provider…), then:

  --happened --result <JSON>  the effect happened; the JSON becomes the call's result,
                              and the resumed agent continues with it (nothing re-runs)
  --did-not-happen            the effect did not happen; the next resume runs the call

The store seals the resolution like every row it writes. If the application seals the
store with its own key (DURABLE_MAC_KEY, or a key ring in the store options), set
DURABLE_MAC_KEY to the same key: without it the store refuses to open.";

const FORK_HELP: &str = "\
A fork never repeats an effect of its parent. Its version 0 is the parent's version N,
and its first turn re-runs the turn the parent ran from N. The parent's calls with a side
effect (idempotent_with_key, unsafe_on_replay) from version N on are inherited, and the
command lists them, with what will happen to each, before it forks:

  not run again   the re-run turn gets the recorded outcome back; a later call of the
                  fork with the same tool and arguments is refused (InheritedEffect)
  stays in doubt  an in-doubt call blocks every effect of the fork until it is resolved
                  in the fork (durable resolve <call in the fork>)
  MAY RUN AGAIN   --rerun <call>: the operator lets the fork run it again (audited)

Pure calls and model replies are not inherited: the fork asks the model anew. If the
re-asked model chooses other calls while an inherited one of the re-run turn is
unreplayed, the fork refuses them (ReplayDiverged) until an operator forks again with
--rerun for that call. Fork a session that no worker is running: effects the parent
records after the fork are not the fork's to know.

  durable fork s-1 --from-version 3 --dry-run
  durable fork s-1 --from-version 3 --to s-1-retry --rerun 5f0c… --by alice";

const EXPORT_HELP: &str = "\
Each file holds one checkpoint in fixture format 1 (`{\"format\": 1, \"session\": …,
\"version\": …, \"messages\": …, \"plan\": …, \"budget\": …, \"state\": …, \"calls\": …}`)
with the journal rows of the turns that start from it. Commit them and run
`durable::replay_check` over them in your tests: stored sessions keep loading under
today's code, or the test says which session, version and call broke.";

const PRUNE_HELP: &str = "\
Only completed, failed and cancelled sessions are deleted, never one with a call in
doubt; each session's rows go in one transaction. Durations: 30d, 12h, 90m, 1w, 2h30m.";

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Status {
    Active,
    Completed,
    Failed,
    Cancelled,
    Parked,
    /// Spelled as `sessions` shows it; `awaiting-approval` is accepted too.
    #[value(name = "awaiting_approval", alias = "awaiting-approval")]
    AwaitingApproval,
}

impl From<Status> for SessionStatus {
    fn from(s: Status) -> Self {
        match s {
            Status::Active => SessionStatus::Active,
            Status::Completed => SessionStatus::Completed,
            Status::Failed => SessionStatus::Failed,
            Status::Cancelled => SessionStatus::Cancelled,
            Status::Parked => SessionStatus::Parked,
            Status::AwaitingApproval => SessionStatus::AwaitingApproval,
        }
    }
}

#[derive(Debug, Args)]
struct SessionsArgs {
    /// Only sessions with these statuses (repeat or comma-separate).
    #[arg(long, value_enum, value_delimiter = ',')]
    status: Vec<Status>,
    /// Only sessions not updated within this long (e.g. 30d, 12h).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    older_than: Option<Duration>,
    /// Only sessions updated within this long (e.g. 1h).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    newer_than: Option<Duration>,
    /// At most this many sessions (0: all of them). Rows are read and printed a page at a
    /// time, so a listing of any length runs in bounded memory.
    #[arg(long, default_value_t = 100)]
    limit: u32,
    /// Start after this session: the cursor `<updated_at>:<id>` that the previous page
    /// printed on stderr (`more: … --after …`).
    #[arg(long, value_name = "CURSOR", value_parser = parse_session_cursor)]
    after: Option<durable::store::SessionCursor>,
}

#[derive(Debug, Args)]
struct ShowArgs {
    /// The session id.
    session: String,
    /// Show this checkpoint version instead of the latest.
    #[arg(long, value_name = "N")]
    version: Option<i64>,
    /// How many messages of the transcript to show, from the end.
    #[arg(long, value_name = "N", default_value_t = 10)]
    tail: usize,
    /// How many checkpoints to list, newest first (0 for all).
    #[arg(long, value_name = "N", default_value_t = 20)]
    checkpoints: usize,
}

#[derive(Debug, Args)]
struct CallsArgs {
    /// The session id.
    session: String,
    /// Only the calls of this step (the checkpoint version their turn started from).
    #[arg(long, value_name = "N")]
    step: Option<i64>,
    /// At most this many rows (default: all of them). Rows are read and printed a page at
    /// a time, so a journal of any length is listed in bounded memory.
    #[arg(long, value_name = "N")]
    limit: Option<u32>,
    /// Start after this position in the journal (rows are numbered from 1 in issue
    /// order; the previous page printed the value to use on stderr).
    #[arg(long, value_name = "POSITION", conflicts_with = "step")]
    after: Option<u64>,
}

#[derive(Debug, Args)]
struct InDoubtArgs {
    /// Only this session's calls.
    #[arg(long, value_name = "ID")]
    session: Option<String>,
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("decision").required(true).args(["happened", "did_not_happen"])))]
struct ResolveArgs {
    /// The in-doubt call's id (see `durable in-doubt`).
    call: String,
    /// The effect happened; record `--result` as the call's result.
    #[arg(long, requires = "result")]
    happened: bool,
    /// The effect did not happen; the next resume may run the call.
    #[arg(long, conflicts_with = "result")]
    did_not_happen: bool,
    /// The result to record: JSON text, `@file` to read it from a file, `@-` from stdin.
    #[arg(long, value_name = "JSON|@FILE")]
    result: Option<String>,
    /// Why: what you checked (kept in the audit row).
    #[arg(long)]
    note: Option<String>,
    /// Who decided (default: $USER).
    #[arg(long, value_name = "NAME")]
    by: Option<String>,
}

const APPROVALS_HELP: &str = "\
A call that needs approval (its tool says so, the harness asked, or the runtime's approval
policy) is journaled as requested and does not run; its session waits as
`awaiting_approval` and holds no worker. Each request shows its call, session, tool and
replay class, when it was requested and its deadline (`expired` once past), who asked,
the model's reasoning and the requested arguments, secrets masked.

Decide each one with `durable approve <CALL>` or `durable deny <CALL> --reason <TEXT>`.
Once no call of a session awaits a decision, the session is active again and the next
resume continues it.

--expire denies, by the deadline (audited as `deadline`), every request whose deadline
passed on the store's clock, and lists them; it opens the store for writing. Without it
the command only reads.

--json prints the journal rows (arguments masked, reasoning whole) each with `expired`;
with --expire, `{\"expired\": [rows], \"still_awaiting\": N}`.";

#[derive(Debug, Args)]
struct ApprovalsArgs {
    /// Only this session's calls.
    #[arg(long, value_name = "ID")]
    session: Option<String>,
    /// Deny every request whose deadline has passed (writes).
    #[arg(long)]
    expire: bool,
}

const APPROVE_HELP: &str = "\
Approves a call that awaits approval (see `durable approvals`). The next resume of its
session runs the call once, under its replay class.

--args replaces the requested arguments: a JSON object, checked against the tool's
argument schema recorded with the request; a problem is reported with its JSON path and
nothing is decided (exit 5). Values shown masked (`<secret>`, `***`) may be kept as shown:
they stand for the recorded values, which are put back. A secret argument cannot be
changed. The requested and the approved arguments are both kept in the audit log.

A call that is no longer awaiting approval (decided meanwhile by another operator,
expired, never requested) is refused with its status (exit 4), as is one past its
deadline (`durable approvals --expire` denies those).

The store seals the decision like every row it writes: a store sealed with an application
key needs DURABLE_MAC_KEY, as for `resolve`.";

#[derive(Debug, Args)]
struct ApproveArgs {
    /// The call's id (see `durable approvals`).
    call: String,
    /// Approve these arguments instead of the requested ones: JSON text, `@file` to read
    /// them from a file, `@-` from stdin.
    #[arg(long = "args", value_name = "JSON|@FILE")]
    edited: Option<String>,
    /// Why: what you checked (kept in the audit row).
    #[arg(long)]
    note: Option<String>,
    /// Who decided (default: $USER).
    #[arg(long, value_name = "NAME")]
    by: Option<String>,
}

const DENY_HELP: &str = "\
Denies a call that awaits approval (see `durable approvals`): it never runs. The reason
becomes the call's recorded outcome, which the model reads as the tool's error result on
the next resume (`not run: denied by <you>: <reason>`), so write it for the model. An
empty reason is refused (exit 5); a call no longer awaiting approval is refused with its
status (exit 4).";

#[derive(Debug, Args)]
struct DenyArgs {
    /// The call's id (see `durable approvals`).
    call: String,
    /// Why not: the model reads it as the tool's result.
    #[arg(long)]
    reason: String,
    /// Take back the approval of an approved call that has not run (the runtime refused
    /// it as `ApprovedCallRefused`: its tool changed, its edit no longer decodes), so the
    /// session can go on; without it only a call awaiting a decision is denied.
    #[arg(long)]
    revoke: bool,
    /// A note for the audit row (not shown to the model).
    #[arg(long)]
    note: Option<String>,
    /// Who decided (default: $USER).
    #[arg(long, value_name = "NAME")]
    by: Option<String>,
}

const UNPARK_HELP: &str = "\
A session is parked when its recoveries kept dying (poison pill) or when its harness parked
it on an in-doubt call. Resolving its last in-doubt call unparks it by itself; use this
command for the other cases, once whatever killed its workers is fixed.";

#[derive(Debug, Args)]
struct UnparkArgs {
    /// The parked session.
    session: String,
}

const CANCEL_HELP: &str = "\
A session no worker holds (released, asleep, waiting for its children, parked, awaiting
approval) is cancelled at once. A running one is asked to stop: its worker learns of it at
its next lease renewal and stops at its next call (an effect in flight finishes and is
recorded; nothing new starts), or the next worker to take it ends it. Its children, and
theirs, are cancelled the same way unless --only. Calls in doubt stay for an operator.
A waiting parent is woken and reads the cancellation as its child's outcome.";

#[derive(Debug, Args)]
struct CancelArgs {
    /// The session.
    session: String,
    /// Why (recorded, shown as the session's status reason).
    #[arg(long, value_name = "TEXT")]
    reason: String,
    /// Who cancels (default: $USER).
    #[arg(long, value_name = "NAME")]
    by: Option<String>,
    /// Leave its children running.
    #[arg(long)]
    only: bool,
}

#[derive(Debug, Args)]
struct ForkArgs {
    /// The session to fork.
    session: String,
    /// The checkpoint version the new session starts from.
    #[arg(long, value_name = "N")]
    from_version: i64,
    /// The new session's id (default: a random UUID).
    #[arg(long, value_name = "ID")]
    to: Option<String>,
    /// Let the fork run this call of the parent again (repeatable; audited with the fork).
    /// Without it, the fork inherits the call and never repeats its effect.
    #[arg(long, value_name = "CALL")]
    rerun: Vec<String>,
    /// Show what the fork would do with the parent's effects, and write nothing.
    #[arg(long)]
    dry_run: bool,
    /// Who forks, for the audit row (default: $USER, or `durable-cli`; required with
    /// --rerun when $USER is not set).
    #[arg(long, value_name = "NAME")]
    by: Option<String>,
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("what").required(true).args(["session", "last"])))]
struct ExportArgs {
    /// Export every checkpoint of this session.
    session: Option<String>,
    /// Export the N most recent checkpoints across sessions instead.
    #[arg(long, value_name = "N")]
    last: Option<usize>,
    /// The directory to write into (created if missing; same-named files are replaced).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
}

#[derive(Debug, Args)]
struct PruneArgs {
    /// Delete terminal sessions not updated within this long (e.g. 30d).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    older_than: Duration,
    /// List what would be deleted; delete nothing.
    #[arg(long)]
    dry_run: bool,
}

const RETARGET_HELP: &str = "\
After a deploy renames a tool or a step, a stored session still names the old one. Move
the session to the new app version and map each renamed name (`--map old=new`): the
change is one transaction with an audit row, and it is refused if the session's app
version changed meanwhile. --dry-run lists how many journal rows each mapping renames and
how many of them are in flight, and changes nothing.

Formerly `durable migrate`. It changes one session's app version, never the database
schema: the library upgrades the schema itself when the application opens the store.";

#[derive(Debug, Args)]
struct RetargetArgs {
    /// The session to move.
    session: String,
    /// The app version to move it to.
    #[arg(long, value_name = "VERSION")]
    app_version: String,
    /// Rename a step or tool in the session's journal: `old=new` (repeatable).
    #[arg(long = "map", value_name = "OLD=NEW", value_parser = parse_mapping)]
    map: Vec<(String, String)>,
    /// Show what would change; change nothing.
    #[arg(long)]
    dry_run: bool,
    /// Who moved it (default: $USER).
    #[arg(long, value_name = "NAME")]
    by: Option<String>,
}

/// `durable acknowledge-rollback`.
#[derive(Debug, Args)]
struct AckArgs {
    /// The operator states that the database is complete (moved or restored with every
    /// write): nothing is parked. Only for a store without a usable witness.
    #[arg(long)]
    intact: bool,
    /// Who acknowledges (default: $USER).
    #[arg(long, value_name = "NAME")]
    by: Option<String>,
}

/// `30d`, `12h`, `90m`, `1w`, `2h30m`: humantime's grammar, which also formats the
/// timestamps we print, so one small crate covers both.
fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text)
        .map_err(|e| format!("{e}; expected a number and a unit, e.g. 30d, 12h, 90m, 1w or 2h30m"))
}

fn parse_session_cursor(text: &str) -> Result<durable::store::SessionCursor, String> {
    durable::store::SessionCursor::parse(text).ok_or_else(|| {
        format!("`{text}` is not a cursor: use the `<updated_at>:<id>` a previous page printed")
    })
}

fn parse_mapping(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((old, new)) if !old.trim().is_empty() && !new.trim().is_empty() => {
            Ok((old.trim().to_owned(), new.trim().to_owned()))
        }
        _ => Err("expected `old=new`, both names non-empty".into()),
    }
}

/// Who is acting: `--by`, else `$USER`, else `$LOGNAME`.
fn operator(by: Option<String>) -> Result<String, CliError> {
    let named = |v: Option<String>| v.filter(|s| !s.trim().is_empty());
    named(by)
        .or_else(|| named(std::env::var("USER").ok()))
        .or_else(|| named(std::env::var("LOGNAME").ok()))
        .or_else(|| named(std::env::var("USERNAME").ok()))
        .or_else(process_uid)
        .ok_or_else(|| {
            CliError::new(
                Code::Usage,
                "cannot tell who is acting ($USER is not set); pass --by <name> for the audit row",
            )
        })
}

/// Who runs this process when no variable names them (a container, CI): `uid:<n>`, the
/// owner of `/proc/self`, which the audit row can still tie to a person.
fn process_uid() -> Option<String> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata("/proc/self")
            .ok()
            .map(|m| format!("uid:{}", m.uid()))
    }
    #[cfg(not(unix))]
    {
        None
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if renamed_command(&e) == Some("migrate") => {
            return CliError::new(
                Code::Usage,
                "`durable migrate` is now `durable retarget` (it moves a session to another app \
                 version; it never changed the database schema); see `durable retarget --help`",
            )
            .report();
        }
        Err(e) => {
            let code = if e.use_stderr() {
                Code::Usage
            } else {
                Code::Ok
            };
            // Help and version go to stdout, usage errors to stderr, as clap prints them.
            let _ = e.print();
            return code.into();
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return CliError::new(Code::Failure, format!("cannot start: {e}")).report(),
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => Code::Ok.into(),
        Err(e) => e.report(),
    }
}

/// The unknown subcommand of a usage error, if that is what it is.
fn renamed_command(e: &clap::Error) -> Option<&str> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};

    if e.kind() != ErrorKind::InvalidSubcommand {
        return None;
    }
    match e.get(ContextKind::InvalidSubcommand) {
        Some(ContextValue::String(name)) => Some(name.as_str()),
        _ => None,
    }
}

async fn run(cli: Cli) -> Result<(), CliError> {
    let location = open::locate(cli.db, |name| std::env::var(name).ok())?;
    // The console opens the store itself: read-only when writing is refused.
    let command = match cli.command {
        #[cfg(feature = "console")]
        Command::Serve(a) => return serve::serve(&location, a).await,
        Command::AcknowledgeRollback(a) => {
            return operate::acknowledge_rollback(&location, cli.json, operator(a.by)?, a.intact)
                .await;
        }
        other => other,
    };
    if cli.unverified {
        if command.access() == Access::Write {
            return Err(CliError::new(
                Code::Usage,
                "--unverified only reads: it cannot be used with a command that writes",
            ));
        }
        if matches!(command, Command::Verify(_) | Command::Backup(_)) {
            return Err(CliError::new(
                Code::Usage,
                "--unverified skips the seals that `verify` checks and `backup` copies: \
                 use it with sessions, show, calls, in-doubt, approvals, workers or export",
            ));
        }
        render::mark_unverified(cli.json);
    }
    let opened = open::open(&location, command.access(), cli.unverified).await?;
    let json = cli.json;
    let shared = &opened.shared;
    let store = shared.as_ref();
    match command {
        Command::Sessions(a) => inspect::sessions(store, json, a).await,
        Command::Show(a) => inspect::show(store, json, a).await,
        Command::Calls(a) => inspect::calls(store, json, a).await,
        Command::InDoubt(a) => inspect::in_doubt(store, json, a).await,
        Command::Resolve(a) => operate::resolve(shared, json, a).await,
        Command::Approvals(a) => approvals::approvals(shared, json, a).await,
        Command::Approve(a) => approvals::approve(shared, json, a).await,
        Command::Deny(a) => approvals::deny(shared, json, a).await,
        Command::Unpark(a) => operate::unpark(store, json, a).await,
        Command::Budget(a) => budget::budget(shared, json, a).await,
        Command::Cancel(a) => operate::cancel(store, json, a).await,
        Command::Signal(a) => signals::signal(shared, json, a).await,
        Command::Workers(a) => workers::workers(store, json, a).await,
        Command::Limits(a) => limits::limits(store, json, a).await,
        Command::Wake(a) => workers::wake(store, json, a).await,
        Command::QueueLimit(a) => workers::queue_limit(store, json, a).await,
        Command::TenantLimit(a) => workers::tenant_limit(store, json, a).await,
        Command::Fork(a) => operate::fork(store, json, a).await,
        Command::Export(a) => operate::export(store, json, a).await,
        Command::Prune(a) => operate::prune(store, json, a).await,
        Command::Retarget(a) => operate::retarget(store, json, a).await,
        Command::Backup(a) => backup::backup(&opened, json, a).await,
        Command::Verify(a) => verify::verify(&opened, json, a).await,
        Command::Rekey => verify::rekey(&opened, json).await,
        #[cfg(feature = "console")]
        Command::Serve(_) => unreachable!("served above"),
        Command::AcknowledgeRollback(_) => unreachable!("acknowledged above"),
    }
}
