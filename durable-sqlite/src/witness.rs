//! The rollback witness: a record, kept beside the database but outside it, of every
//! effect the store acknowledged, so that a database that lost acknowledged rows is
//! noticed instead of trusted.
//!
//! SQLite's own files cannot tell a store that lost its newest writes from one that never
//! made them: delete the `-wal` of a store whose workers were killed (or copy only the
//! `.db` file, restore a backup, put another store at the same path) and the database opens
//! cleanly, its latest sessions and journal rows simply absent. A worker would then start
//! those sessions afresh and run their effects a second time. The witness is what such a
//! rollback cannot take with it:
//!
//! - **`<store>-witness`**, a small append-only text file next to the database (mode
//!   `0600`). Its first line names the store (`durable_meta.witness`, a random id written
//!   when the store got its witness). Before a non-`pure` call's effect may run (after its
//!   *issued* row is committed and synced, before [`issue_call`] returns), the store
//!   appends the call's session, id and attempt; a purged session gets a tombstone. Each
//!   line carries a checksum, so a torn last line (a power cut) is ignored, never misread.
//!   One `write` per effect, never synced: a process kill keeps it (the kernel has it),
//!   and a power cut can only make it *older* than the database, never newer, so it
//!   cannot invent a rollback.
//! - **At every writer's open** the database is checked against it: every witnessed
//!   call must still be in the journal, at its witnessed attempt or later. A missing row,
//!   a witness of another store, a witness without a database (a new store at an old
//!   path), or a database that expects a witness that is gone: the open fails with
//!   [`StoreError::RolledBack`], naming what was lost and the way out
//!   ([`SqliteStore::acknowledge_rollback`], `durable acknowledge-rollback`).
//! - **Acknowledging** a rollback parks every session the witness shows lost calls for
//!   (recreating, parked, those lost entirely), so that no worker resumes them until a
//!   person has looked (`durable unpark`); with no witness at all the store cannot know
//!   which sessions are affected, and parks every session that is not finished unless the
//!   operator states that the copy is complete (`--intact`). It is audited in
//!   `durable_integrity_log`, and the witness is rebuilt from the database.
//!
//! What it cannot catch: a rollback that takes the witness too (a whole directory
//! restored from an old snapshot, an attacker who deletes both). The seals cannot either:
//! a consistent older state is consistent. Keep the witness where the database's backups
//! do not go, if that threat matters to you.
//!
//! [`issue_call`]: durable_core::store::JournalStore::issue_call
//! [`SqliteStore::acknowledge_rollback`]: crate::SqliteStore::acknowledge_rollback

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use durable_core::StoreError;
use durable_core::store::CallRecord;
use sha2::{Digest, Sha256};
use sqlx::SqliteConnection;

use crate::error::{BACKEND, db};

/// The first word of a witness file.
const MAGIC: &str = "durable-witness";
/// The format version written and read.
const FORMAT: &str = "1";
/// The `durable_meta` row holding the store's witness id.
const META: &str = "witness";
/// A witness above this size is compacted when a writer opens the store.
const COMPACT_ABOVE: u64 = 1 << 20;
/// How many lost calls an error message names.
const NAMED: usize = 5;

/// The witness file of the database at `db`: `<db>-witness`.
pub(crate) fn path_for(db: &Path) -> PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push("-witness");
    PathBuf::from(name)
}

/// One line of a witness file.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Entry {
    /// A call whose effect may have run: `(session, call, attempt)`.
    Call {
        session: String,
        call: String,
        attempt: i64,
    },
    /// A call an operator acknowledged as lost (`durable acknowledge-rollback`): its row
    /// may stay missing, but its session (parked, or recreated parked) must stay.
    Acknowledged {
        session: String,
        call: String,
        attempt: i64,
    },
    /// A session purged on purpose: the calls witnessed before are gone legitimately.
    Purged { session: String },
}

impl Entry {
    fn line(&self) -> String {
        let body = match self {
            Entry::Call {
                session,
                call,
                attempt,
            } => format!("c\t{}\t{}\t{attempt}", escape(session), escape(call)),
            Entry::Acknowledged {
                session,
                call,
                attempt,
            } => format!("a\t{}\t{}\t{attempt}", escape(session), escape(call)),
            Entry::Purged { session } => format!("p\t{}", escape(session)),
        };
        format!("{body}\t{}\n", checksum(&body))
    }

    fn parse(line: &str) -> Option<Entry> {
        let (body, sum) = line.rsplit_once('\t')?;
        if checksum(body) != sum {
            return None;
        }
        let fields: Vec<&str> = body.split('\t').collect();
        match fields.as_slice() {
            ["c", session, call, attempt] => Some(Entry::Call {
                session: unescape(session)?,
                call: unescape(call)?,
                attempt: attempt.parse().ok()?,
            }),
            ["a", session, call, attempt] => Some(Entry::Acknowledged {
                session: unescape(session)?,
                call: unescape(call)?,
                attempt: attempt.parse().ok()?,
            }),
            ["p", session] => Some(Entry::Purged {
                session: unescape(session)?,
            }),
            _ => None,
        }
    }
}

/// Ids are validated (no control characters), but a tab, newline or backslash is still
/// escaped so that a line always splits the same way.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c => out.push(c),
        }
    }
    out
}

fn unescape(text: &str) -> Option<String> {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        out.push(match chars.next()? {
            '\\' => '\\',
            't' => '\t',
            'n' => '\n',
            'r' => '\r',
            _ => return None,
        });
    }
    Some(out)
}

fn checksum(body: &str) -> String {
    let digest = Sha256::digest(body.as_bytes());
    let mut out = String::with_capacity(8);
    for byte in &digest[..4] {
        let _ = write!(out, "{byte:02x}");
    }
    out
}

fn io_error(path: &Path, what: &str, e: io::Error) -> StoreError {
    StoreError::database(
        BACKEND,
        io::Error::new(
            e.kind(),
            format!("{what} the rollback witness `{}`: {e}", path.display()),
        ),
    )
}

/// A call as the witness knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Witnessed {
    call: String,
    /// The highest attempt seen issued.
    attempt: i64,
    /// An operator acknowledged that attempt as lost: only its session must remain.
    acknowledged: bool,
}

/// A witness file as read.
#[derive(Debug)]
struct Parsed {
    store_id: String,
    /// Per session, the calls that may have run, in file order since the session's last
    /// tombstone.
    sessions: BTreeMap<String, Vec<Witnessed>>,
    /// Lines that failed their checksum (a torn last line after a power cut).
    torn: usize,
}

/// Folds one witnessed call into what is known of it: the highest attempt wins; an
/// acknowledgment covers the attempts up to its own, and a later issue is a new effect.
fn note(parsed: &mut Parsed, session: String, call: String, attempt: i64, acknowledged: bool) {
    let calls = parsed.sessions.entry(session).or_default();
    match calls.iter_mut().find(|w| w.call == call) {
        Some(known) if attempt > known.attempt => {
            known.attempt = attempt;
            known.acknowledged = acknowledged;
        }
        Some(known) if attempt == known.attempt => known.acknowledged |= acknowledged,
        Some(_) => {}
        None => calls.push(Witnessed {
            call,
            attempt,
            acknowledged,
        }),
    }
}

fn read(path: &Path) -> Result<Option<Parsed>, StoreError> {
    let mut text = String::new();
    match File::open(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_error(path, "cannot open", e)),
        Ok(mut file) => {
            let mut bytes = Vec::new();
            file.read_to_end(&mut bytes)
                .map_err(|e| io_error(path, "cannot read", e))?;
            // A torn line may end in the middle of a UTF-8 sequence.
            text.push_str(&String::from_utf8_lossy(&bytes));
        }
    }
    let mut lines = text.split_inclusive('\n');
    let header = lines.next().unwrap_or_default();
    let store_id = match header.trim_end().split(' ').collect::<Vec<_>>().as_slice() {
        [MAGIC, FORMAT, id] if !id.is_empty() => (*id).to_owned(),
        _ => {
            return Err(StoreError::RolledBack {
                location: path.display().to_string(),
                detail: format!(
                    "the rollback witness `{}` does not start with a `{MAGIC} {FORMAT}` header; it was damaged or is not a durable witness. Move it aside only if you know the database is complete, then run `durable acknowledge-rollback`",
                    path.display()
                ),
            });
        }
    };
    let mut parsed = Parsed {
        store_id,
        sessions: BTreeMap::new(),
        torn: 0,
    };
    for line in lines {
        let Some(entry) = line.strip_suffix('\n').and_then(Entry::parse) else {
            parsed.torn += 1;
            continue;
        };
        match entry {
            Entry::Call {
                session,
                call,
                attempt,
            } => note(&mut parsed, session, call, attempt, false),
            Entry::Acknowledged {
                session,
                call,
                attempt,
            } => note(&mut parsed, session, call, attempt, true),
            Entry::Purged { session } => {
                parsed.sessions.remove(&session);
            }
        }
    }
    Ok(Some(parsed))
}

/// A call the witness saw issued that the database no longer holds (at that attempt).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LostCall {
    /// The session.
    pub session: String,
    /// The call's id.
    pub call: String,
    /// The attempt the witness saw issued.
    pub attempt: i64,
    /// Whether the whole session is missing from the database.
    pub session_missing: bool,
}

/// What a writer's open found when it compared the database with its witness.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RollbackReport {
    /// Witnessed calls missing from the database.
    pub lost: Vec<LostCall>,
    /// The database expects a witness (it had one) and there is none: it was moved,
    /// copied or restored without it, and which sessions lost what cannot be known.
    pub witness_missing: bool,
    /// A witness was found but belongs to another store (or the database has none).
    pub foreign_witness: bool,
    /// Torn lines skipped in the witness (a power cut while one was being written).
    pub torn_lines: usize,
}

impl RollbackReport {
    /// Whether the database was found rolled back.
    pub fn rolled_back(&self) -> bool {
        !self.lost.is_empty() || self.witness_missing || self.foreign_witness
    }

    /// The sessions with lost calls (each once, sorted).
    pub fn sessions(&self) -> Vec<String> {
        let mut sessions: Vec<String> = self.lost.iter().map(|l| l.session.clone()).collect();
        sessions.sort();
        sessions.dedup();
        sessions
    }

    fn describe(&self, db: &Path) -> String {
        let witness = path_for(db);
        if self.foreign_witness {
            return format!(
                "its rollback witness `{}` belongs to another store (or this database was replaced by an older copy or by one that never had it): the store that was here is gone or was swapped, and {} call(s) it witnessed are not in this database. Put the right database back; or, if this database is the one to keep, run `durable acknowledge-rollback {}` (it parks every unfinished session, and recreates parked the sessions it lost, for a person to check)",
                witness.display(),
                self.lost.len(),
                db.display()
            );
        }
        if self.witness_missing {
            return format!(
                "this database had a rollback witness `{}` and it is gone: the database was moved, copied or restored without it, so writes made since may be lost and their effects would run again. Run `durable acknowledge-rollback {}` (it parks every unfinished session; add `--intact` only if you know the copy is complete)",
                witness.display(),
                db.display()
            );
        }
        let sessions = self.sessions();
        let mut named = String::new();
        for lost in self.lost.iter().take(NAMED) {
            let _ = write!(
                named,
                "{}call `{}` (attempt {}) of session `{}`{}",
                if named.is_empty() { "" } else { ", " },
                lost.call,
                lost.attempt,
                lost.session,
                if lost.session_missing {
                    " (the whole session is gone)"
                } else {
                    ""
                }
            );
        }
        if self.lost.len() > NAMED {
            let _ = write!(named, " and {} more", self.lost.len() - NAMED);
        }
        format!(
            "{} call(s) in {} session(s) whose effects may have run are missing from the database ({named}); its `-wal` was lost, or it was restored from a backup or copied without the `-wal`. If the `-wal` still exists somewhere, put it back; otherwise run `durable acknowledge-rollback {}`, which parks these sessions so that nothing runs them again before a person has checked",
            self.lost.len(),
            sessions.len(),
            db.display()
        )
    }
}

/// The appender a writer keeps.
#[derive(Debug)]
pub(crate) struct Witness {
    path: PathBuf,
    file: Mutex<File>,
}

fn open_append(path: &Path) -> Result<File, StoreError> {
    let mut options = OpenOptions::new();
    options.append(true).create(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options
        .open(path)
        .map_err(|e| io_error(path, "cannot open", e))
}

#[cfg(unix)]
fn same_file(a: &std::fs::Metadata, b: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    a.ino() == b.ino() && a.dev() == b.dev()
}

#[cfg(not(unix))]
fn same_file(_: &std::fs::Metadata, _: &std::fs::Metadata) -> bool {
    true
}

impl Witness {
    /// Appends a call whose *issued* row was just committed, before its effect may run.
    pub(crate) fn call(&self, record: &CallRecord) -> Result<(), StoreError> {
        self.append(&Entry::Call {
            session: record.identity.session.as_str().to_owned(),
            call: record.id.as_str().to_owned(),
            attempt: i64::from(record.attempt),
        })
    }

    /// Appends a tombstone for a purged session.
    pub(crate) fn purged(&self, session: &str) -> Result<(), StoreError> {
        self.append(&Entry::Purged {
            session: session.to_owned(),
        })
    }

    /// One `write` under a shared lock; reopens the file if a compaction replaced it.
    fn append(&self, entry: &Entry) -> Result<(), StoreError> {
        let line = entry.line();
        let mut file = self
            .file
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for _ in 0..3 {
            file.lock_shared()
                .map_err(|e| io_error(&self.path, "cannot lock", e))?;
            let current = std::fs::metadata(&self.path);
            let mine = file.metadata();
            match (current, mine) {
                (Ok(current), Ok(mine)) if same_file(&current, &mine) => {
                    let written = file.write_all(line.as_bytes());
                    let _ = file.unlock();
                    return written.map_err(|e| io_error(&self.path, "cannot write", e));
                }
                (Err(e), _) if e.kind() == io::ErrorKind::NotFound => {
                    let _ = file.unlock();
                    return Err(StoreError::RolledBack {
                        location: self.path.display().to_string(),
                        detail: format!(
                            "its rollback witness `{}` was deleted while the store was open; nothing more runs until it is back (restart the workers: the next open says what to do)",
                            self.path.display()
                        ),
                    });
                }
                _ => {
                    // Replaced by a compaction: append to the new file.
                    let _ = file.unlock();
                    *file = open_append(&self.path)?;
                }
            }
        }
        Err(io_error(
            &self.path,
            "cannot append to",
            io::Error::other("it keeps being replaced"),
        ))
    }
}

/// Writes a witness from scratch (temporary file, synced, renamed into place, directory
/// synced), under an exclusive lock on the file it replaces.
fn rewrite(path: &Path, store_id: &str, entries: &[Entry]) -> Result<(), StoreError> {
    let mut text = format!("{MAGIC} {FORMAT} {store_id}\n");
    for entry in entries {
        text.push_str(&entry.line());
    }
    let old = File::open(path).ok();
    if let Some(old) = &old {
        old.lock().map_err(|e| io_error(path, "cannot lock", e))?;
    }
    let mut tmp_name = path.as_os_str().to_owned();
    tmp_name.push(".tmp");
    let tmp = PathBuf::from(tmp_name);
    let result = (|| {
        let mut options = OpenOptions::new();
        options.write(true).create(true).truncate(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut file = options.open(&tmp)?;
        file.write_all(text.as_bytes())?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            File::open(dir)?.sync_all()?;
        }
        Ok(())
    })();
    if let Some(old) = &old {
        let _ = old.unlock();
    }
    result.map_err(|e| io_error(path, "cannot write", e))
}

async fn meta(conn: &mut SqliteConnection) -> Result<Option<String>, StoreError> {
    sqlx::query_scalar("SELECT value FROM durable_meta WHERE name = ?")
        .bind(META)
        .fetch_optional(conn)
        .await
        .map_err(db)
}

async fn set_meta(conn: &mut SqliteConnection, id: &str) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO durable_meta (name, value) VALUES (?, ?) \
         ON CONFLICT (name) DO UPDATE SET value = excluded.value",
    )
    .bind(META)
    .bind(id)
    .execute(conn)
    .await
    .map_err(db)?;
    Ok(())
}

/// Compares the database with its witness. `created`: this open created the file.
async fn compare(
    conn: &mut SqliteConnection,
    parsed: Option<&Parsed>,
    expected: Option<&str>,
    created: bool,
) -> Result<RollbackReport, StoreError> {
    let mut report = RollbackReport::default();
    let Some(parsed) = parsed else {
        report.witness_missing = expected.is_some();
        return Ok(report);
    };
    report.torn_lines = parsed.torn;
    // A witness of another store (or of the store that was at this path before) still
    // tells which effects ran here: its calls are compared all the same.
    report.foreign_witness = created || expected != Some(parsed.store_id.as_str());
    let mut present: HashMap<String, bool> = HashMap::new();
    for (session, calls) in &parsed.sessions {
        for witnessed in calls {
            let found: Option<i64> =
                sqlx::query_scalar("SELECT attempt FROM durable_tool_calls WHERE id = ?")
                    .bind(&witnessed.call)
                    .fetch_optional(&mut *conn)
                    .await
                    .map_err(db)?;
            if found.is_some_and(|found| found >= witnessed.attempt) {
                continue;
            }
            let session_present = match present.get(session) {
                Some(&known) => known,
                None => {
                    let known: bool = sqlx::query_scalar(
                        "SELECT EXISTS (SELECT 1 FROM durable_sessions WHERE id = ?)",
                    )
                    .bind(session)
                    .fetch_one(&mut *conn)
                    .await
                    .map_err(db)?;
                    present.insert(session.clone(), known);
                    known
                }
            };
            if witnessed.acknowledged && session_present {
                continue;
            }
            report.lost.push(LostCall {
                session: session.clone(),
                call: witnessed.call.clone(),
                attempt: witnessed.attempt,
                session_missing: !session_present,
            });
        }
    }
    Ok(report)
}

/// The witness entries that stand for the database as it is: per session, its newest
/// non-`pure` call (which a restore to an older state would lose first), and every call
/// run more than once (whose older attempt a restore would bring back).
async fn baseline(conn: &mut SqliteConnection) -> Result<Vec<Entry>, StoreError> {
    let rows: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT c.session_id, c.id, c.attempt FROM durable_tool_calls c \
         WHERE c.replay_class <> 'pure' AND (c.attempt > 1 OR c.seq = \
           (SELECT MAX(d.seq) FROM durable_tool_calls d \
            WHERE d.session_id = c.session_id AND d.replay_class <> 'pure')) \
         ORDER BY c.session_id, c.seq",
    )
    .fetch_all(conn)
    .await
    .map_err(db)?;
    Ok(rows
        .into_iter()
        .map(|(session, call, attempt)| Entry::Call {
            session,
            call,
            attempt,
        })
        .collect())
}

/// The compacted form of a parsed witness, one line per call it must keep: per session
/// its newest call, every call issued more than once, every acknowledged one; the calls
/// in `lost` become acknowledged (an operator just acknowledged them).
fn compacted(parsed: &Parsed, lost: &[LostCall]) -> Vec<Entry> {
    let mut out = Vec::new();
    for (session, calls) in &parsed.sessions {
        let last = calls.len().saturating_sub(1);
        for (i, witnessed) in calls.iter().enumerate() {
            let now_lost = lost
                .iter()
                .any(|l| l.call == witnessed.call && l.session == *session);
            let (session, call, attempt) =
                (session.clone(), witnessed.call.clone(), witnessed.attempt);
            if witnessed.acknowledged || now_lost {
                out.push(Entry::Acknowledged {
                    session,
                    call,
                    attempt,
                });
            } else if i == last || witnessed.attempt > 1 {
                out.push(Entry::Call {
                    session,
                    call,
                    attempt,
                });
            }
        }
    }
    out
}

/// What a writer does about the witness when it opens a file store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnOpen {
    /// Check, and refuse a rollback.
    Check,
    /// Report, and rebuild the witness from the database (an operator's acknowledgment).
    Acknowledge,
}

/// Runs at a writer's open, inside the open's setup (after the schema and keys), in one
/// `BEGIN IMMEDIATE` transaction so that concurrent openers of one file take turns:
/// checks the database against its witness (or creates the witness for a store that has
/// none yet), compacts a large one, and returns the appender and what was found.
pub(crate) async fn open(
    conn: &mut SqliteConnection,
    db_path: &Path,
    created: bool,
    mode: OnOpen,
) -> Result<(Witness, RollbackReport), StoreError> {
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut *conn)
        .await
        .map_err(db)?;
    let result = open_in(&mut *conn, db_path, created, mode).await;
    let end = if result.is_ok() { "COMMIT" } else { "ROLLBACK" };
    sqlx::query(end).execute(&mut *conn).await.map_err(db)?;
    result
}

async fn open_in(
    conn: &mut SqliteConnection,
    db_path: &Path,
    created: bool,
    mode: OnOpen,
) -> Result<(Witness, RollbackReport), StoreError> {
    let path = path_for(db_path);
    let parsed = read(&path)?;
    let expected = meta(&mut *conn).await?;
    let report = compare(&mut *conn, parsed.as_ref(), expected.as_deref(), created).await?;
    if report.rolled_back() && mode == OnOpen::Check {
        return Err(StoreError::RolledBack {
            location: db_path.display().to_string(),
            detail: report.describe(db_path),
        });
    }
    if report.torn_lines > 0 {
        tracing::warn!(witness = %path.display(), lines = report.torn_lines, "skipped torn lines of the rollback witness (a power cut while one was being written)");
    }
    match (&parsed, &expected) {
        (Some(parsed), Some(id)) if mode == OnOpen::Check => {
            let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
            if size > COMPACT_ABOVE {
                rewrite(&path, id, &compacted(parsed, &[]))?;
            }
        }
        _ => {
            // No witness yet (a new store, or one written before witnesses), or an
            // acknowledged rollback: the database as it is becomes the baseline, under a
            // new id when acknowledging (a stale copy of the old witness no longer fits).
            let id = match (&expected, mode) {
                (Some(id), OnOpen::Check) => id.clone(),
                _ => uuid::Uuid::new_v4().simple().to_string(),
            };
            set_meta(&mut *conn, &id).await?;
            // What the old witness knew stays known (an acknowledged loss stays
            // acknowledged: its session must not vanish again), then the database's own.
            let mut entries = parsed
                .as_ref()
                .map(|parsed| compacted(parsed, &report.lost))
                .unwrap_or_default();
            entries.extend(baseline(&mut *conn).await?);
            rewrite(&path, &id, &entries)?;
        }
    }
    let file = open_append(&path)?;
    Ok((
        Witness {
            path,
            file: Mutex::new(file),
        },
        report,
    ))
}

/// For a read-only open: what a writer's open would find, without writing anything.
pub(crate) async fn inspect(
    conn: &mut SqliteConnection,
    db_path: &Path,
) -> Result<RollbackReport, StoreError> {
    let parsed = read(&path_for(db_path))?;
    let expected = meta(&mut *conn).await?;
    if parsed.is_none() && expected.is_none() {
        // A store written before witnesses: its first writer creates one.
        return Ok(RollbackReport::default());
    }
    compare(conn, parsed.as_ref(), expected.as_deref(), false).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_round_trip_and_torn_lines_are_refused() {
        let entry = Entry::Call {
            session: "s\t1\\x".into(),
            call: "c:1".into(),
            attempt: 2,
        };
        let line = entry.line();
        assert_eq!(Entry::parse(line.trim_end_matches('\n')), Some(entry));
        let torn = &line[..line.len() - 4];
        assert_eq!(Entry::parse(torn), None);
        let flipped = line.replacen("c:1", "c:2", 1);
        assert_eq!(Entry::parse(flipped.trim_end_matches('\n')), None);
    }

    #[test]
    fn a_purge_forgets_the_session_and_attempts_keep_their_highest() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("w");
        let call = |session: &str, call: &str, attempt| Entry::Call {
            session: session.into(),
            call: call.into(),
            attempt,
        };
        let entries = [
            call("a", "a1", 1),
            call("b", "b1", 1),
            call("a", "a1", 2),
            Entry::Purged {
                session: "b".into(),
            },
            call("a", "a2", 1),
        ];
        rewrite(&path, "id", &entries).expect("write");
        // A torn tail, as a power cut leaves it.
        let mut file = OpenOptions::new().append(true).open(&path).expect("open");
        file.write_all(b"c\ta\ta3\t1\t12").expect("write");
        let parsed = read(&path).expect("read").expect("present");
        assert_eq!(parsed.store_id, "id");
        assert_eq!(parsed.torn, 1);
        assert_eq!(
            parsed.sessions.into_iter().collect::<Vec<_>>(),
            vec![(
                "a".to_owned(),
                vec![
                    Witnessed {
                        call: "a1".to_owned(),
                        attempt: 2,
                        acknowledged: false
                    },
                    Witnessed {
                        call: "a2".to_owned(),
                        attempt: 1,
                        acknowledged: false
                    }
                ]
            )]
        );
    }
}
