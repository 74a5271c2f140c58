//! Checkpoint fixtures: the versioned file format of `durable export`, and how to read
//! them back (from files or straight from a store).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::{FailureKind, ReplayFailure};
use crate::error::StoreError;
use crate::ids::{CallId, SessionId};
use crate::replay::ReplayClass;
use crate::store::{
    CallIdentity, CallKind, CallRecord, CallStatus, CheckpointMeta, CheckpointStore, SessionFilter,
};

/// The fixture format this release writes, and the newest it reads.
///
/// Every release keeps reading every older format: a fixture committed to an
/// application's repository must keep loading for as long as the repository keeps it.
pub const FIXTURE_FORMAT: u32 = 1;

/// One exported checkpoint: what a session held at one version, and the journal rows of
/// the turn that starts from it. See the [module docs](super) for the file format.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Fixture {
    /// The format version ([`FIXTURE_FORMAT`] when written by this release).
    pub format: u32,
    /// The release of `durable` that wrote the file (informational).
    #[serde(default)]
    pub durable: String,
    /// The session.
    pub session: SessionId,
    /// The checkpoint version.
    pub version: i64,
    /// The app version the checkpoint was written under.
    pub app_version: String,
    /// When the checkpoint was written (ms since the epoch).
    #[serde(default)]
    pub created_at: i64,
    /// The transcript of this version, one JSON value per message.
    pub messages: Vec<Value>,
    /// The plan snapshot.
    #[serde(default)]
    pub plan: Value,
    /// The budget snapshot.
    #[serde(default)]
    pub budget: Value,
    /// Application-defined state.
    #[serde(default)]
    pub state: Value,
    /// Journal rows whose step belongs to this checkpoint (the turn that starts from it,
    /// up to the next exported version).
    #[serde(default)]
    pub calls: Vec<FixtureCall>,
    /// The file this fixture was read from, if any (not part of the format).
    #[serde(skip)]
    pub path: Option<PathBuf>,
}

/// A journal row as stored in a fixture (format 1). Field for field a
/// [`CallRecord`](crate::store::CallRecord), with the identity flattened; the fencing
/// token is not exported.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FixtureCall {
    /// Row id.
    pub id: CallId,
    /// Tool or model.
    pub kind: CallKind,
    /// The step (checkpoint version the turn started from).
    pub step: i64,
    /// Tool name (`@model` for model responses).
    pub tool: String,
    /// Versioned SHA-256 of the canonical arguments.
    pub input_hash: String,
    /// Ordinal among identical calls of the step.
    pub ordinal: i64,
    /// Replay class at record time.
    pub class: ReplayClass,
    /// Status at export time.
    pub status: CallStatus,
    /// Arguments as stored (secret arguments masked as `{"$secret": "<hash>"}`).
    pub args: Value,
    /// Idempotency key, if any.
    #[serde(default)]
    pub idempotency_key: Option<String>,
    /// Fingerprint of the argument schema at record time.
    #[serde(default)]
    pub schema_hash: String,
    /// Recorded result.
    #[serde(default)]
    pub result: Option<Value>,
    /// Recorded error.
    #[serde(default)]
    pub error: Option<Value>,
    /// Spend recorded with the outcome.
    #[serde(default)]
    pub spend: Option<Value>,
    /// Executions started.
    #[serde(default)]
    pub attempt: i32,
    /// When issued (ms).
    #[serde(default)]
    pub issued_at: i64,
    /// When the outcome was recorded (ms).
    #[serde(default)]
    pub finished_at: Option<i64>,
}

impl From<&CallRecord> for FixtureCall {
    fn from(r: &CallRecord) -> Self {
        FixtureCall {
            id: r.id.clone(),
            kind: r.kind,
            step: r.identity.step,
            tool: r.identity.tool.clone(),
            input_hash: r.identity.input_hash.clone(),
            ordinal: r.identity.ordinal,
            class: r.class,
            status: r.status,
            args: r.args.clone(),
            idempotency_key: r.idempotency_key.clone(),
            schema_hash: r.schema_hash.clone(),
            result: r.result.clone(),
            error: r.error.clone(),
            spend: r.spend.clone(),
            attempt: r.attempt,
            issued_at: r.issued_at,
            finished_at: r.finished_at,
        }
    }
}

impl FixtureCall {
    /// The call's identity in `session`.
    pub fn identity(&self, session: &SessionId) -> CallIdentity {
        CallIdentity {
            session: session.clone(),
            step: self.step,
            tool: self.tool.clone(),
            input_hash: self.input_hash.clone(),
            ordinal: self.ordinal,
        }
    }
}

/// Why a fixture file could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FixtureError {
    /// The file or directory could not be read.
    #[error("cannot read `{}`: {source}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid JSON, or not a checkpoint fixture of its format.
    #[error("`{}` is not a valid durable fixture: {detail}", path.display())]
    Invalid {
        /// The path.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// The file was written in a newer fixture format than this release reads.
    #[error(
        "`{}` is in fixture format {found}, newer than this release reads ({supported}); upgrade `durable`",
        path.display()
    )]
    TooNew {
        /// The path.
        path: PathBuf,
        /// The file's format.
        found: u64,
        /// The newest format this release reads.
        supported: u32,
    },
}

impl Fixture {
    /// Builds the fixture of a loaded checkpoint with the given journal rows.
    ///
    /// # Errors
    /// [`StoreError::Corrupt`] for a message of the checkpoint that is not JSON.
    pub fn new(
        checkpoint: &crate::store::Checkpoint,
        calls: &[CallRecord],
    ) -> Result<Self, StoreError> {
        let meta = &checkpoint.meta;
        Ok(Fixture {
            format: FIXTURE_FORMAT,
            durable: env!("CARGO_PKG_VERSION").to_owned(),
            session: meta.session.clone(),
            version: meta.version,
            app_version: meta.app_version.clone(),
            created_at: meta.created_at,
            messages: checkpoint.message_values()?,
            plan: checkpoint.plan.clone(),
            budget: checkpoint.budget.clone(),
            state: checkpoint.state.clone(),
            calls: calls.iter().map(FixtureCall::from).collect(),
            path: None,
        })
    }

    /// Parses a fixture from JSON text; `path` only names the source in errors.
    ///
    /// # Errors
    /// [`FixtureError::Invalid`] for malformed JSON, a missing `format` or a body that
    /// does not match its format; [`FixtureError::TooNew`] for a newer format.
    pub fn from_json(text: &str, path: &Path) -> Result<Self, FixtureError> {
        let invalid = |detail: String| FixtureError::Invalid {
            path: path.to_owned(),
            detail,
        };
        let value: Value = serde_json::from_str(text).map_err(|e| invalid(e.to_string()))?;
        let format = match value.get("format") {
            Some(Value::Number(n)) => n.as_u64().ok_or_else(|| {
                invalid(format!("`format` must be a positive integer, found {n}"))
            })?,
            Some(other) => {
                return Err(invalid(format!("`format` must be a number, found {other}")));
            }
            None => {
                return Err(invalid(
                    "no `format` field; export fixtures with `durable export`".into(),
                ));
            }
        };
        if format == 0 || format > u64::from(FIXTURE_FORMAT) {
            if format == 0 {
                return Err(invalid(
                    "format 0 does not exist; the first format is 1".into(),
                ));
            }
            return Err(FixtureError::TooNew {
                path: path.to_owned(),
                found: format,
                supported: FIXTURE_FORMAT,
            });
        }
        // Format 1 is the only format so far; older formats would be upgraded here.
        let mut fixture: Fixture = serde_path_to_error::deserialize(value)
            .map_err(|e| invalid(format!("at `{}`: {}", e.path(), e.inner())))?;
        fixture.path = Some(path.to_owned());
        Ok(fixture)
    }

    /// Reads one fixture file.
    ///
    /// # Errors
    /// See [`from_json`](Self::from_json); [`FixtureError::Io`] if the file cannot be read.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, FixtureError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| FixtureError::Io {
            path: path.to_owned(),
            source,
        })?;
        Fixture::from_json(&text, path)
    }

    /// Reads every `*.json` file under `dir` (subdirectories included), in path order.
    ///
    /// # Errors
    /// The first file that does not load, or [`FixtureError::Io`] for an unreadable
    /// directory.
    pub fn load_dir(dir: impl AsRef<Path>) -> Result<Vec<Self>, FixtureError> {
        let mut files = Vec::new();
        collect_json_files(dir.as_ref(), &mut files)?;
        files.sort();
        files.iter().map(Fixture::load).collect()
    }

    /// The file name `durable export` gives this fixture:
    /// `<session>.v<version, 6 digits>.json`. A session id with characters other than
    /// ASCII letters, digits, `-`, `_` and (not first) `.`, or longer than 100
    /// characters, has them replaced by `_` and gets an 8-digit hash suffix, so two ids
    /// never share a name.
    pub fn file_name(&self) -> String {
        let id = self.session.as_str();
        let clean: String = id
            .chars()
            .enumerate()
            .map(|(i, c)| {
                if c.is_ascii_alphanumeric() || matches!(c, '-' | '_') || (c == '.' && i > 0) {
                    c
                } else {
                    '_'
                }
            })
            .take(100)
            .collect();
        let stem = if clean == id && !id.is_empty() {
            clean
        } else {
            let digest = Sha256::digest(id.as_bytes());
            let hex: String = digest.iter().take(4).map(|b| format!("{b:02x}")).collect();
            format!("{clean}-{hex}")
        };
        format!("{stem}.v{:06}.json", self.version)
    }

    /// The fixture as pretty-printed JSON (what `durable export` writes).
    ///
    /// # Errors
    /// When a JSON value cannot be written (not expected for values read from a store).
    pub fn to_json_pretty(&self) -> Result<String, serde_json::Error> {
        serde_json::to_string_pretty(self)
    }
}

fn collect_json_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), FixtureError> {
    let io = |source| FixtureError::Io {
        path: dir.to_owned(),
        source,
    };
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let path = entry.map_err(io)?.path();
        if path.is_dir() {
            collect_json_files(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "json") {
            out.push(path);
        }
    }
    Ok(())
}

/// Fixtures read from a store, and the checkpoints that could not be read.
#[derive(Debug, Clone, Default)]
pub struct Exported {
    /// One fixture per readable checkpoint, by session then version.
    pub fixtures: Vec<Fixture>,
    /// Checkpoints whose rows are corrupt ([`StoreError::Corrupt`]): reported, and the
    /// other checkpoints are still exported.
    pub unreadable: Vec<ReplayFailure>,
}

/// Exports every checkpoint of one session.
///
/// # Errors
/// [`StoreError::SessionNotFound`] for an unknown session; database errors. Corrupt
/// checkpoints are not errors: they are listed in [`Exported::unreadable`].
pub async fn export_session(
    store: &dyn CheckpointStore,
    session: &SessionId,
) -> Result<Exported, StoreError> {
    store.session(session).await?;
    let metas = store.list_checkpoints(session).await?;
    let mut exported = Exported::default();
    export_versions(store, session, &metas, &mut exported).await?;
    Ok(exported)
}

/// Exports the `last_n` most recent checkpoints of the store, across sessions.
///
/// # Errors
/// Database errors. Corrupt checkpoints are listed in [`Exported::unreadable`].
pub async fn export_last(
    store: &dyn CheckpointStore,
    last_n: usize,
) -> Result<Exported, StoreError> {
    let mut exported = Exported::default();
    if last_n == 0 {
        return Ok(exported);
    }
    let sessions = store.list_sessions(&SessionFilter::default()).await?;
    let mut all: Vec<CheckpointMeta> = Vec::new();
    for session in &sessions {
        match store.list_checkpoints(&session.id).await {
            Ok(metas) => all.extend(metas),
            Err(StoreError::Corrupt {
                session,
                version,
                detail,
            }) => exported
                .unreadable
                .push(unreadable(session, version, detail)),
            // Deleted between the two reads (a concurrent prune): nothing to export.
            Err(StoreError::SessionNotFound(_)) => {}
            Err(e) => return Err(e),
        }
    }
    all.sort_by(|a, b| {
        (b.created_at, b.version, &b.session).cmp(&(a.created_at, a.version, &a.session))
    });
    all.truncate(last_n);
    let mut by_session: BTreeMap<SessionId, Vec<CheckpointMeta>> = BTreeMap::new();
    for meta in all {
        by_session
            .entry(meta.session.clone())
            .or_default()
            .push(meta);
    }
    for (session, mut metas) in by_session {
        metas.sort_by_key(|m| m.version);
        export_versions(store, &session, &metas, &mut exported).await?;
    }
    Ok(exported)
}

fn unreadable(session: SessionId, version: Option<i64>, detail: String) -> ReplayFailure {
    ReplayFailure {
        session,
        version,
        call: None,
        tool: None,
        path: None,
        kind: FailureKind::Unreadable(detail),
    }
}

/// Loads `metas` (ascending versions of one session) and gives each the journal rows
/// whose step is at least its version and below the next exported version.
async fn export_versions(
    store: &dyn CheckpointStore,
    session: &SessionId,
    metas: &[CheckpointMeta],
    exported: &mut Exported,
) -> Result<(), StoreError> {
    if metas.is_empty() {
        return Ok(());
    }
    let calls = store.calls(session, None).await?;
    for (i, meta) in metas.iter().enumerate() {
        let next = metas.get(i + 1).map_or(i64::MAX, |m| m.version);
        let rows: Vec<CallRecord> = calls
            .iter()
            .filter(|c| c.identity.step >= meta.version && c.identity.step < next)
            .cloned()
            .collect();
        let fixture = store
            .load_checkpoint(session, Some(meta.version))
            .await
            .and_then(|checkpoint| Fixture::new(&checkpoint, &rows));
        match fixture {
            Ok(fixture) => exported.fixtures.push(fixture),
            Err(StoreError::Corrupt {
                session,
                version,
                detail,
            }) => exported.unreadable.push(unreadable(
                session,
                version.or(Some(meta.version)),
                detail,
            )),
            Err(StoreError::VersionNotFound { .. } | StoreError::SessionNotFound(_)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
