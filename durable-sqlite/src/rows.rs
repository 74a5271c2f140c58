//! The stored form of rows: column lists, decoding rows into core records, encoding
//! JSON for TEXT columns, and snapshots stored as references to an older version.
//!
//! Nothing here panics on what the database holds: a value of the wrong type, an unknown
//! enum name, JSON that does not parse or a `format` newer than this release becomes
//! [`StoreError::Corrupt`] naming the session (and checkpoint version when there is one),
//! so one bad row never makes other sessions unreadable.

use durable_core::store::{
    Approval, CallIdentity, CallKind, CallRecord, CallStatus, CheckpointMeta, ErrorRecord,
    Resolution, ResolutionRecord, SessionRecord, SessionStatus,
};
use durable_core::{CallId, ReplayClass, SessionId, StoreError};
use serde_json::Value;
use sqlx::sqlite::SqliteRow;
use sqlx::{Decode, Row, Sqlite, SqliteConnection, Type};

use crate::error::{check_format, corrupt, db, encode, parse_json};

/// Columns of `durable_sessions`, in the order [`session`] reads them.
macro_rules! session_cols {
    () => {
        "id, status, app_version, metadata, lease_owner, lease_expires_at, fence, \
         recovery_attempts, status_reason, latest_version, created_at, updated_at, format, \
         queue, wake_at, lease_renewed_at, parent_id, waiting_until, waiting_for, cancel_by, cancel_reason, \
         cancel_requested_at"
    };
}
pub(crate) use session_cols;

/// Columns of `durable_tool_calls` aliased as `c`, for [`call`].
macro_rules! call_cols {
    () => {
        "c.id, c.session_id, c.kind, c.step, c.tool_name, c.input_hash, c.ordinal, \
         c.replay_class, c.status, c.args, c.idempotency_key, c.schema_hash, c.result, \
         c.error, c.spend, c.mac, c.attempt, c.fence, c.format, c.issued_at, c.finished_at, \
         c.seq, c.approval"
    };
}
pub(crate) use call_cols;

/// Columns of `durable_checkpoints` for [`checkpoint_meta`].
macro_rules! meta_cols {
    () => {
        "(SELECT s.id FROM durable_sessions s WHERE s.num = session_num) AS session_id, \
         version, last_seq, message_count, app_version, created_at"
    };
}
pub(crate) use meta_cols;

/// Reads one column; a decode failure is corruption of `session`'s data.
pub(crate) fn col<'r, T>(
    row: &'r SqliteRow,
    name: &str,
    session: &SessionId,
    version: Option<i64>,
) -> Result<T, StoreError>
where
    T: Decode<'r, Sqlite> + Type<Sqlite>,
{
    row.try_get::<T, _>(name)
        .map_err(|e| corrupt(session, version, format!("column `{name}`: {e}")))
}

/// Reads the session id of a row (the one column we cannot blame on a session).
fn session_id(row: &SqliteRow, name: &str) -> Result<SessionId, StoreError> {
    row.try_get::<String, _>(name)
        .map(SessionId::new)
        .map_err(db)
}

/// Decodes a `durable_sessions` row selected with [`session_cols!`].
pub(crate) fn session(row: &SqliteRow) -> Result<SessionRecord, StoreError> {
    let id = session_id(row, "id")?;
    let format: i64 = col(row, "format", &id, None)?;
    check_format(format, &id, None, "the session row")?;
    let status: String = col(row, "status", &id, None)?;
    let status = SessionStatus::parse(&status)
        .ok_or_else(|| corrupt(&id, None, format!("unknown session status `{status}`")))?;
    let metadata: String = col(row, "metadata", &id, None)?;
    let metadata = parse_json(&metadata, &id, None, "session metadata")?;
    Ok(SessionRecord {
        status,
        app_version: col(row, "app_version", &id, None)?,
        metadata,
        lease_owner: col(row, "lease_owner", &id, None)?,
        lease_expires_at: col(row, "lease_expires_at", &id, None)?,
        fence: col(row, "fence", &id, None)?,
        recovery_attempts: col(row, "recovery_attempts", &id, None)?,
        status_reason: col(row, "status_reason", &id, None)?,
        latest_version: col(row, "latest_version", &id, None)?,
        created_at: col(row, "created_at", &id, None)?,
        updated_at: col(row, "updated_at", &id, None)?,
        queue: col(row, "queue", &id, None)?,
        wake_at: col(row, "wake_at", &id, None)?,
        lease_renewed_at: col(row, "lease_renewed_at", &id, None)?,
        parent: col::<Option<String>>(row, "parent_id", &id, None)?.map(SessionId::new),
        waiting_until: col(row, "waiting_until", &id, None)?,
        waiting_for: col(row, "waiting_for", &id, None)?,
        cancel_requested: match (
            col::<Option<String>>(row, "cancel_by", &id, None)?,
            col::<Option<String>>(row, "cancel_reason", &id, None)?,
            col::<Option<i64>>(row, "cancel_requested_at", &id, None)?,
        ) {
            (Some(by), reason, Some(at)) => Some(durable_core::store::CancelRequest {
                by,
                reason: reason.unwrap_or_default(),
                at,
            }),
            _ => None,
        },
        id,
    })
}

/// Decodes a `durable_sessions` row for a listing: a row that cannot be read is listed as
/// [`ListedSession::Unreadable`](durable_core::store::ListedSession) with its raw status.
pub(crate) fn listed_session(
    row: &SqliteRow,
) -> Result<durable_core::store::ListedSession, StoreError> {
    use durable_core::store::ListedSession;
    match session(row) {
        Ok(record) => Ok(ListedSession::Read(Box::new(record))),
        Err(e @ (StoreError::Corrupt { .. } | StoreError::Database { .. })) => {
            Ok(ListedSession::Unreadable {
                id: session_id(row, "id")?,
                raw_status: row
                    .try_get::<String, _>("status")
                    .unwrap_or_else(|_| "?".to_owned()),
                updated_at: row.try_get::<i64, _>("updated_at").unwrap_or(0),
                problem: e.to_string(),
            })
        }
        Err(e) => Err(e),
    }
}

/// Decodes a `durable_checkpoints` row selected with [`meta_cols!`].
pub(crate) fn checkpoint_meta(row: &SqliteRow) -> Result<CheckpointMeta, StoreError> {
    let session = session_id(row, "session_id")?;
    let version: i64 = col(row, "version", &session, None)?;
    let v = Some(version);
    Ok(CheckpointMeta {
        version,
        last_seq: col(row, "last_seq", &session, v)?,
        message_count: col(row, "message_count", &session, v)?,
        app_version: col(row, "app_version", &session, v)?,
        created_at: col(row, "created_at", &session, v)?,
        session,
    })
}

/// Parses an optional JSON column of a journal row.
fn parse_opt_json(
    row: &SqliteRow,
    name: &str,
    session: &SessionId,
    call: &CallId,
) -> Result<Option<Value>, StoreError> {
    let text: Option<String> = col(row, name, session, None)?;
    text.map(|t| {
        parse_json(
            &t,
            session,
            None,
            &format!("`{name}` of journal row `{call}`"),
        )
    })
    .transpose()
}

/// Decodes a `durable_tool_calls` row selected with [`call_cols!`].
pub(crate) fn call(row: &SqliteRow) -> Result<CallRecord, StoreError> {
    let session = session_id(row, "session_id")?;
    let s = &session;
    let id = CallId::new(col::<String>(row, "id", s, None)?);
    let bad = |detail: String| corrupt(s, None, format!("journal row `{id}`: {detail}"));
    let format: i64 = col(row, "format", s, None)?;
    check_format(format, s, None, &format!("journal row `{id}`"))?;
    let kind: String = col(row, "kind", s, None)?;
    let kind = CallKind::parse(&kind).ok_or_else(|| bad(format!("unknown kind `{kind}`")))?;
    let class: String = col(row, "replay_class", s, None)?;
    let class: ReplayClass = class
        .parse()
        .map_err(|_| bad(format!("unknown replay class `{class}`")))?;
    let status: String = col(row, "status", s, None)?;
    let status =
        CallStatus::parse(&status).ok_or_else(|| bad(format!("unknown status `{status}`")))?;
    let args: String = col(row, "args", s, None)?;
    let args = parse_json(&args, s, None, &format!("`args` of journal row `{id}`"))?;
    Ok(CallRecord {
        kind,
        identity: CallIdentity {
            session: session.clone(),
            step: col(row, "step", s, None)?,
            tool: col(row, "tool_name", s, None)?,
            input_hash: col(row, "input_hash", s, None)?,
            ordinal: col(row, "ordinal", s, None)?,
        },
        class,
        status,
        args,
        idempotency_key: col(row, "idempotency_key", s, None)?,
        schema_hash: col(row, "schema_hash", s, None)?,
        result: parse_opt_json(row, "result", s, &id)?,
        error: parse_opt_json(row, "error", s, &id)?,
        spend: parse_opt_json(row, "spend", s, &id)?,
        mac: col(row, "mac", s, None)?,
        attempt: col(row, "attempt", s, None)?,
        fence: col(row, "fence", s, None)?,
        issued_at: col(row, "issued_at", s, None)?,
        finished_at: col(row, "finished_at", s, None)?,
        approval: approval(row, s, &id)?,
        id,
    })
}

/// Decodes the `approval` column of a journal row (the JSON of an [`Approval`]).
fn approval(row: &SqliteRow, s: &SessionId, id: &CallId) -> Result<Option<Approval>, StoreError> {
    let Some(text) = col::<Option<String>>(row, "approval", s, None)? else {
        return Ok(None);
    };
    serde_json::from_str(&text).map(Some).map_err(|e| {
        corrupt(
            s,
            None,
            format!("journal row `{id}`: its `approval` is not an approval ({e})"),
        )
    })
}

/// Decodes a `durable_resolutions` row.
pub(crate) fn resolution(row: &SqliteRow) -> Result<ResolutionRecord, StoreError> {
    let session = session_id(row, "session_id")?;
    let s = &session;
    let call = CallId::new(col::<String>(row, "call_id", s, None)?);
    let format: i64 = col(row, "format", s, None)?;
    check_format(format, s, None, &format!("the resolution of call `{call}`"))?;
    let decision: String = col(row, "decision", s, None)?;
    let result: Option<String> = col(row, "result", s, None)?;
    let resolution = match (decision.as_str(), result) {
        ("happened", Some(text)) => Resolution::Happened {
            result: parse_json(
                &text,
                s,
                None,
                &format!("the resolution result of call `{call}`"),
            )?,
        },
        ("did_not_happen", _) => Resolution::DidNotHappen,
        (other, _) => {
            return Err(corrupt(
                s,
                None,
                format!(
                    "resolution of call `{call}` has decision `{other}` (expected `happened` with a result, or `did_not_happen`)"
                ),
            ));
        }
    };
    Ok(ResolutionRecord {
        resolution,
        by: col(row, "resolved_by", s, None)?,
        note: col(row, "note", s, None)?,
        at: col(row, "created_at", s, None)?,
        call,
        session,
    })
}

/// Decodes a `durable_errors` row.
pub(crate) fn error(row: &SqliteRow) -> Result<ErrorRecord, StoreError> {
    let session = session_id(row, "session_id")?;
    let s = &session;
    Ok(ErrorRecord {
        step: col(row, "step", s, None)?,
        context: col(row, "context", s, None)?,
        attempt: col(row, "attempt", s, None)?,
        message: col(row, "message", s, None)?,
        at: col(row, "created_at", s, None)?,
        session,
    })
}

/// Serializes a JSON value for a TEXT column.
pub(crate) fn json(value: &Value) -> Result<String, StoreError> {
    serde_json::to_string(value).map_err(encode)
}

/// Serializes an optional JSON value.
pub(crate) fn opt_json(value: Option<&Value>) -> Result<Option<String>, StoreError> {
    value.map(json).transpose()
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
