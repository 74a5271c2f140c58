//! Statements shared by several trait methods, run on a connection that is already
//! inside a transaction.

use durable_core::store::{
    CallStatus, CheckpointMeta, FORMAT_VERSION, Fence, NewCheckpoint, SessionRecord,
};
use durable_core::{CallId, SessionId, StoreError};
use serde_json::Value;
use sqlx::{Row, SqliteConnection};

use durable_core::integrity::Keyring;

use crate::error::{corrupt, db, encode};
use crate::rows::{self, session_cols};
use crate::seal::{self, HeadRow, RawCheckpoint, head_cols};

/// Serializes a JSON value for a TEXT column.
pub(crate) fn json(value: &Value) -> Result<String, StoreError> {
    serde_json::to_string(value).map_err(encode)
}

/// Serializes an optional JSON value.
pub(crate) fn opt_json(value: Option<&Value>) -> Result<Option<String>, StoreError> {
    value.map(json).transpose()
}

/// Reads a session row, or [`StoreError::SessionNotFound`].
pub(crate) async fn load_session(
    conn: &mut SqliteConnection,
    id: &SessionId,
) -> Result<SessionRecord, StoreError> {
    let row = sqlx::query(concat!(
        "SELECT ",
        session_cols!(),
        " FROM durable_sessions WHERE id = ?"
    ))
    .bind(id.as_str())
    .fetch_optional(conn)
    .await
    .map_err(db)?
    .ok_or_else(|| StoreError::SessionNotFound(id.clone()))?;
    rows::session(&row)
}

/// What a fenced write needs to know about its session.
pub(crate) struct Fenced {
    pub(crate) latest_version: i64,
    pub(crate) app_version: String,
    /// The session's head, checked.
    pub(crate) head: HeadRow,
}

/// Checks a write credential: [`StoreError::SessionNotFound`] or
/// [`StoreError::LeaseLost`] unless `fence.token` is the session's current token.
///
/// Also reads the session's head and checks its seal: a writer that cannot check it
/// (another key signs the store) writes nothing.
pub(crate) async fn fenced(
    conn: &mut SqliteConnection,
    ring: &Keyring,
    fence: Fence<'_>,
) -> Result<Fenced, StoreError> {
    let row = sqlx::query(concat!(
        "SELECT s.fence, s.app_version, ",
        head_cols!(),
        " FROM durable_sessions s WHERE s.id = ?"
    ))
    .bind(fence.session.as_str())
    .fetch_optional(conn)
    .await
    .map_err(db)?
    .ok_or_else(|| StoreError::SessionNotFound(fence.session.clone()))?;
    let current: i64 = rows::col(&row, "fence", fence.session, None)?;
    if current != fence.token {
        return Err(StoreError::LeaseLost {
            session: fence.session.clone(),
            token: fence.token,
        });
    }
    let head = seal::head_from_row(&row, fence.session)?;
    head.check(ring)?;
    Ok(Fenced {
        latest_version: head.latest_version,
        app_version: rows::col(&row, "app_version", fence.session, None)?,
        head,
    })
}

/// Appends `messages` to the session's log and inserts checkpoint `version` whose
/// transcript ends with them, all sealed (messages chained to the log's last message,
/// the checkpoint to the previous version). Returns the checkpoint and its seal.
pub(crate) async fn append_checkpoint(
    conn: &mut SqliteConnection,
    ring: &Keyring,
    now: i64,
    session: &SessionId,
    app_version: &str,
    version: i64,
    checkpoint: &NewCheckpoint,
) -> Result<(CheckpointMeta, String), StoreError> {
    // Unchanged snapshots are stored as a reference to the version holding their text
    // (see `snapshot_ref`), so a long session whose plan and state rarely change grows by
    // its messages, not by a copy of every snapshot per checkpoint.
    let previous = if version > 0 {
        sqlx::query(
            "SELECT last_seq, message_count, plan, budget, state, seal FROM durable_checkpoints \
             WHERE session_num = (SELECT num FROM durable_sessions WHERE id = ?) AND version = ?",
        )
        .bind(session.as_str())
        .bind(version - 1)
        .fetch_optional(&mut *conn)
        .await
        .map_err(db)?
    } else {
        None
    };
    let mut snapshots = Vec::with_capacity(3);
    let mut texts = Vec::with_capacity(3);
    for (column, value) in [
        ("plan", &checkpoint.plan),
        ("budget", &checkpoint.budget),
        ("state", &checkpoint.state),
    ] {
        let text = json(value)?;
        let stored = match &previous {
            Some(prev) => {
                let prev_text: String = rows::col(prev, column, session, Some(version - 1))?;
                let (holder, holder_text) = match parse_snapshot_ref(&prev_text) {
                    Some(holder) => (
                        holder,
                        snapshot_text(&mut *conn, session, holder, column).await?,
                    ),
                    None => (version - 1, prev_text),
                };
                if holder_text == text {
                    snapshot_ref(holder)
                } else {
                    text.clone()
                }
            }
            None => text.clone(),
        };
        snapshots.push(stored);
        texts.push(text);
    }
    let [plan, budget, state]: [String; 3] = snapshots
        .try_into()
        .map_err(|_| corrupt(session, Some(version), "snapshot columns"))?;
    let (mut last_seq, mut message_count) = match &previous {
        Some(prev) => (
            rows::col::<i64>(prev, "last_seq", session, Some(version - 1))?,
            rows::col::<i64>(prev, "message_count", session, Some(version - 1))?,
        ),
        None => (
            sqlx::query_scalar(
                "SELECT COALESCE(MAX(seq), 0) FROM durable_messages WHERE session_num = (SELECT num FROM durable_sessions WHERE id = ?)",
            )
            .bind(session.as_str())
            .fetch_one(&mut *conn)
            .await
            .map_err(db)?,
            0,
        ),
    };
    let previous_seal = match &previous {
        Some(prev) => rows::col::<Option<String>>(prev, "seal", session, Some(version - 1))?
            .unwrap_or_default(),
        None => String::new(),
    };
    let mut message_seal = seal::message_seal_at(&mut *conn, session, last_seq).await?;
    for message in &checkpoint.messages {
        last_seq += 1;
        message_count += 1;
        let text = json(message)?;
        message_seal = seal::seal_message(ring, session, last_seq, &text, &message_seal)?;
        sqlx::query(
            "INSERT INTO durable_messages (session_num, seq, message, format, created_at, seal) \
             VALUES ((SELECT num FROM durable_sessions WHERE id = ?), ?, ?, ?, ?, ?)",
        )
        .bind(session.as_str())
        .bind(last_seq)
        .bind(text)
        .bind(FORMAT_VERSION)
        .bind(now)
        .bind(&message_seal)
        .execute(&mut *conn)
        .await
        .map_err(db)?;
    }
    let checkpoint_seal = RawCheckpoint {
        session,
        version,
        last_seq,
        message_count,
        last_message_seal: &message_seal,
        plan: &texts[0],
        budget: &texts[1],
        state: &texts[2],
        app_version,
        previous: &previous_seal,
    }
    .seal(ring)?;
    sqlx::query(
        "INSERT INTO durable_checkpoints (session_num, version, last_seq, message_count, plan, \
         budget, state, app_version, format, created_at, seal) \
         VALUES ((SELECT num FROM durable_sessions WHERE id = ?), ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(session.as_str())
    .bind(version)
    .bind(last_seq)
    .bind(message_count)
    .bind(plan)
    .bind(budget)
    .bind(state)
    .bind(app_version)
    .bind(FORMAT_VERSION)
    .bind(now)
    .bind(&checkpoint_seal)
    .execute(&mut *conn)
    .await
    .map_err(db)?;
    let meta = CheckpointMeta {
        session: session.clone(),
        version,
        last_seq,
        message_count,
        app_version: app_version.to_owned(),
        created_at: now,
    };
    Ok((meta, checkpoint_seal))
}

/// Compare-and-set checkpoint write for a session whose fence was checked: fails with
/// [`StoreError::VersionConflict`] unless the latest version is `expected`.
pub(crate) async fn save_checkpoint(
    conn: &mut SqliteConnection,
    ring: &Keyring,
    now: i64,
    session: &SessionId,
    fenced: &mut Fenced,
    expected: i64,
    checkpoint: &NewCheckpoint,
) -> Result<CheckpointMeta, StoreError> {
    if fenced.latest_version != expected {
        return Err(StoreError::VersionConflict {
            session: session.clone(),
            expected,
            actual: fenced.latest_version,
        });
    }
    let version = expected + 1;
    let (meta, checkpoint_seal) = append_checkpoint(
        &mut *conn,
        ring,
        now,
        session,
        &fenced.app_version,
        version,
        checkpoint,
    )
    .await?;
    sqlx::query(
        "UPDATE durable_sessions SET latest_version = ?, recovery_attempts = 0, updated_at = ? \
         WHERE id = ?",
    )
    .bind(version)
    .bind(now)
    .bind(session.as_str())
    .execute(&mut *conn)
    .await
    .map_err(db)?;
    fenced.latest_version = version;
    fenced.head.latest_version = version;
    fenced.head.checkpoint_seal = checkpoint_seal;
    fenced.head.store(conn, ring).await?;
    Ok(meta)
}

/// The few columns of a journal row that guard its state transitions.
pub(crate) struct CallState {
    pub(crate) session: SessionId,
    pub(crate) status: CallStatus,
    pub(crate) fence: i64,
}

/// Reads a journal row's session, status and fence, or [`StoreError::CallNotFound`].
pub(crate) async fn call_state(
    conn: &mut SqliteConnection,
    id: &CallId,
) -> Result<CallState, StoreError> {
    let row = sqlx::query("SELECT session_id, status, fence FROM durable_tool_calls WHERE id = ?")
        .bind(id.as_str())
        .fetch_optional(conn)
        .await
        .map_err(db)?
        .ok_or_else(|| StoreError::CallNotFound(id.clone()))?;
    let session = SessionId::new(row.try_get::<String, _>("session_id").map_err(db)?);
    let status: String = rows::col(&row, "status", &session, None)?;
    let status = CallStatus::parse(&status).ok_or_else(|| {
        corrupt(
            &session,
            None,
            format!("journal row `{id}`: unknown status `{status}`"),
        )
    })?;
    let fence = rows::col(&row, "fence", &session, None)?;
    Ok(CallState {
        session,
        status,
        fence,
    })
}

/// Reads a full journal row, or [`StoreError::CallNotFound`].
pub(crate) async fn load_call(
    conn: &mut SqliteConnection,
    ring: &Keyring,
    id: &CallId,
) -> Result<durable_core::store::CallRecord, StoreError> {
    let row = sqlx::query(concat!(
        "SELECT ",
        rows::call_cols!(),
        " FROM durable_tool_calls c WHERE c.id = ?"
    ))
    .bind(id.as_str())
    .fetch_optional(conn)
    .await
    .map_err(db)?
    .ok_or_else(|| StoreError::CallNotFound(id.clone()))?;
    rows::checked_call(ring, &row)
}

/// The stored form of "the same snapshot as version `v`": `@v`. JSON text never starts
/// with `@`, so a reference cannot be mistaken for a snapshot.
pub(crate) fn snapshot_ref(version: i64) -> String {
    format!("@{version}")
}

/// The version a stored snapshot refers to, if it is a reference.
pub(crate) fn parse_snapshot_ref(stored: &str) -> Option<i64> {
    stored.strip_prefix('@')?.parse().ok()
}

/// The text of `column` at `version`, which must hold text (not a reference).
pub(crate) async fn snapshot_text(
    conn: &mut SqliteConnection,
    session: &SessionId,
    version: i64,
    column: &str,
) -> Result<String, StoreError> {
    let sql = match column {
        "plan" => {
            "SELECT plan FROM durable_checkpoints WHERE session_num = (SELECT num FROM durable_sessions WHERE id = ?) AND version = ?"
        }
        "budget" => {
            "SELECT budget FROM durable_checkpoints WHERE session_num = (SELECT num FROM durable_sessions WHERE id = ?) AND version = ?"
        }
        _ => {
            "SELECT state FROM durable_checkpoints WHERE session_num = (SELECT num FROM durable_sessions WHERE id = ?) AND version = ?"
        }
    };
    let text: Option<String> = sqlx::query_scalar(sql)
        .bind(session.as_str())
        .bind(version)
        .fetch_optional(conn)
        .await
        .map_err(db)?;
    match text {
        Some(text) if parse_snapshot_ref(&text).is_none() => Ok(text),
        Some(_) => Err(corrupt(
            session,
            Some(version),
            format!("the {column} snapshot refers to another reference"),
        )),
        None => Err(corrupt(
            session,
            Some(version),
            format!("a {column} snapshot refers to missing version {version}"),
        )),
    }
}

/// Resolves a stored snapshot: its text, or the text of the version it refers to.
pub(crate) async fn resolve_snapshot(
    conn: &mut SqliteConnection,
    session: &SessionId,
    stored: String,
    column: &str,
) -> Result<String, StoreError> {
    match parse_snapshot_ref(&stored) {
        Some(holder) => snapshot_text(conn, session, holder, column).await,
        None => Ok(stored),
    }
}

/// What a session's row says about the lease that is being taken over.
pub(crate) struct Previous {
    /// The session's fencing token.
    pub(crate) fence: i64,
    /// Recoveries counted since the last checkpoint.
    pub(crate) recovery_attempts: i32,
    /// Whether the previous lease was never given up (`lease_owner` is still set: it
    /// expired, or its owner is taking it back after a restart). Taking it over is a
    /// recovery.
    pub(crate) unreleased: bool,
}

/// What [`take_lease`] did.
pub(crate) enum Taken {
    /// The lease is `owner`'s.
    Granted(durable_core::store::Lease),
    /// The take-over was a recovery beyond the bound: the session is parked instead.
    Parked {
        /// The recoveries counted before this one.
        attempts: i32,
    },
}

/// Gives the lease on a session to `owner` until `now + ttl` under a new fencing token:
/// the one place a lease is taken over, for `acquire_lease` and `claim_expired` alike, so
/// both count recoveries by one rule. Taking over an unreleased lease is a recovery and
/// counts an attempt; when `max_attempts` are already counted the session is parked
/// instead (reason recorded, lease cleared, token bumped so a straggler loses it).
pub(crate) async fn take_lease(
    conn: &mut SqliteConnection,
    id: &SessionId,
    owner: &str,
    previous: &Previous,
    now: i64,
    ttl: std::time::Duration,
    max_attempts: i32,
) -> Result<Taken, StoreError> {
    let fence = previous.fence + 1;
    let attempts = previous.recovery_attempts;
    if previous.unreleased && attempts >= max_attempts {
        sqlx::query(
            "UPDATE durable_sessions SET status = 'parked', status_reason = ?, \
             lease_owner = NULL, lease_expires_at = NULL, fence = ?, updated_at = ? \
             WHERE id = ?",
        )
        .bind(format!("recovery attempts exhausted ({attempts})"))
        .bind(fence)
        .bind(now)
        .bind(id.as_str())
        .execute(conn)
        .await
        .map_err(db)?;
        tracing::warn!(session = %id, attempts, "parked session: recovery attempts exhausted");
        return Ok(Taken::Parked { attempts });
    }
    let expires_at = now.saturating_add(crate::tx::millis(ttl));
    sqlx::query(
        "UPDATE durable_sessions SET fence = ?, lease_owner = ?, lease_expires_at = ?, \
         updated_at = ?, recovery_attempts = recovery_attempts + ? WHERE id = ?",
    )
    .bind(fence)
    .bind(owner)
    .bind(expires_at)
    .bind(now)
    .bind(i32::from(previous.unreleased))
    .bind(id.as_str())
    .execute(conn)
    .await
    .map_err(db)?;
    Ok(Taken::Granted(durable_core::store::Lease {
        session: id.clone(),
        owner: owner.to_owned(),
        fence,
        expires_at,
    }))
}
