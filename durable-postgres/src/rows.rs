//! Decoding of stored rows into core records. Anything a row holds that this release cannot
//! read becomes [`StoreError::Corrupt`] naming the session (and checkpoint version).

use durable_core::StoreError;
use durable_core::ids::{CallId, SessionId};
use durable_core::replay::ReplayClass;
use durable_core::store::{
    Approval, ApprovalEvent, ApprovalRecord, CallIdentity, CallKind, CallRecord, CallStatus,
    CheckpointMeta, ErrorRecord, FORMAT_VERSION, Resolution, ResolutionRecord, SessionRecord,
    SessionStatus,
};
use serde_json::Value;
use sqlx::Row;
use sqlx::postgres::PgRow;

use crate::error::{corrupt, db};

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

/// `session_num!("$1")`: the key of the session whose id is `$1`, the integer that names
/// it in `durable_messages` and `durable_checkpoints` (schema 7). One lookup by the
/// sessions' unique index, planned once per statement.
macro_rules! session_num {
    ($id:literal) => {
        concat!("(SELECT num FROM durable_sessions WHERE id = ", $id, ")")
    };
}
pub(crate) use session_num;

/// A plan, budget or state of `durable_checkpoints` as stored: the JSON text, or `@k`, a
/// reference to version `k` of the same session, which holds the same text (JSON never
/// starts with `@`). A snapshot equal to the previous version's is stored as a reference
/// (see [`stored_snapshot!`]), so a session whose plan, budget and state rarely change
/// grows by a few bytes per checkpoint, not by their size. Seals cover the text.
///
/// `snapshot!("k", "plan")`: the text of column `plan` of the row aliased `k`, a
/// reference resolved (`NULL` when it names no version, or a version holding a reference
/// itself: [`snapshot_text`] says so).
macro_rules! snapshot {
    ($alias:literal, $col:literal) => {
        concat!(
            "CASE WHEN ",
            $alias,
            ".",
            $col,
            " ~ '^@[0-9]{1,18}$' THEN \
               (SELECT r.",
            $col,
            " FROM durable_checkpoints r \
                WHERE r.session_num = ",
            $alias,
            ".session_num \
                  AND r.version = substr(",
            $alias,
            ".",
            $col,
            ", 2)::bigint \
                  AND r.",
            $col,
            " !~ '^@') \
             ELSE ",
            $alias,
            ".",
            $col,
            " END"
        )
    };
}
pub(crate) use snapshot;

/// `stored_snapshot!("plan", "$9", "l.num", "$6")`: what to store as column `plan` of
/// version `$6` of the session whose key (`durable_sessions.num`) is `l.num` and whose
/// text is `$9`: a reference to the version holding
/// the previous version's text when that text is the same (byte for byte), else the
/// text. References always name a version that holds text.
macro_rules! stored_snapshot {
    ($col:literal, $text:literal, $num:literal, $version:literal) => {
        concat!(
            "COALESCE((SELECT CASE \
               WHEN p.",
            $col,
            " ~ '^@[0-9]{1,18}$' THEN \
                 CASE WHEN (SELECT r.",
            $col,
            " FROM durable_checkpoints r \
                   WHERE r.session_num = p.session_num \
                     AND r.version = substr(p.",
            $col,
            ", 2)::bigint) = ",
            $text,
            " \
                 THEN p.",
            $col,
            " END \
               WHEN p.",
            $col,
            " = ",
            $text,
            " THEN '@' || p.version END \
             FROM durable_checkpoints p \
             WHERE p.session_num = ",
            $num,
            " AND p.version = ",
            $version,
            " - 1), ",
            $text,
            ")"
        )
    };
}
pub(crate) use stored_snapshot;

/// The text of a snapshot read with [`snapshot!`] (`None`: a reference that names no
/// snapshot).
pub(crate) fn snapshot_text(
    session: &SessionId,
    version: i64,
    what: &str,
    text: Option<String>,
) -> Result<String, StoreError> {
    text.ok_or_else(|| {
        corrupt(
            session,
            Some(version),
            format!("{what} refers to a version that holds no snapshot"),
        )
    })
}

/// Columns of `durable_tool_calls`, in the order [`call`] reads them.
macro_rules! call_cols {
    () => {
        "id, session_id, kind, step, tool_name, input_hash, ordinal, replay_class, status, \
         args, idempotency_key, schema_hash, result, error, spend, mac, attempt, fence, \
         format, issued_at, finished_at, seq, approval"
    };
}
pub(crate) use call_cols;

/// Columns of `durable_checkpoints` read as metadata by [`checkpoint_meta`].
macro_rules! checkpoint_meta_cols {
    () => {
        "version, last_seq, message_count, app_version, created_at"
    };
}
pub(crate) use checkpoint_meta_cols;

/// A typed column read; a type mismatch is a database error (the schema is ours).
pub(crate) fn get<'r, T>(row: &'r PgRow, col: &str) -> Result<T, StoreError>
where
    T: sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    row.try_get(col).map_err(db)
}

/// Refuses a row written by a newer JSON format.
pub(crate) fn check_format(
    session: &SessionId,
    version: Option<i64>,
    what: &str,
    format: i32,
) -> Result<(), StoreError> {
    if format > FORMAT_VERSION {
        return Err(corrupt(
            session,
            version,
            format!(
                "{what} was written by a newer format {format} (this release reads formats up to {FORMAT_VERSION}); upgrade `durable` to read it"
            ),
        ));
    }
    Ok(())
}

/// Parses stored JSON text.
pub(crate) fn json(
    session: &SessionId,
    version: Option<i64>,
    what: &str,
    text: &str,
) -> Result<Value, StoreError> {
    serde_json::from_str(text)
        .map_err(|e| corrupt(session, version, format!("{what} is not valid JSON: {e}")))
}

/// Parses optional stored JSON text.
fn json_opt(
    session: &SessionId,
    what: &str,
    text: Option<String>,
) -> Result<Option<Value>, StoreError> {
    text.map(|t| json(session, None, what, &t)).transpose()
}

/// Decodes a `durable_sessions` row.
/// Decodes a `durable_sessions` row for a listing: a row that cannot be read is listed as
/// [`ListedSession::Unreadable`](durable_core::store::ListedSession) with its raw status.
pub(crate) fn listed_session(
    row: &PgRow,
) -> Result<durable_core::store::ListedSession, StoreError> {
    use durable_core::store::ListedSession;
    match session(row) {
        Ok(record) => Ok(ListedSession::Read(Box::new(record))),
        Err(e @ (StoreError::Corrupt { .. } | StoreError::Database { .. })) => {
            Ok(ListedSession::Unreadable {
                id: SessionId::new(get::<String>(row, "id")?),
                raw_status: get::<String>(row, "status").unwrap_or_else(|_| "?".to_owned()),
                updated_at: get::<i64>(row, "updated_at").unwrap_or(0),
                problem: e.to_string(),
            })
        }
        Err(e) => Err(e),
    }
}

pub(crate) fn session(row: &PgRow) -> Result<SessionRecord, StoreError> {
    let id = SessionId::new(get::<String>(row, "id")?);
    check_format(&id, None, "session row", get(row, "format")?)?;
    let status: String = get(row, "status")?;
    let status = SessionStatus::parse(&status)
        .ok_or_else(|| corrupt(&id, None, format!("unknown session status `{status}`")))?;
    let metadata = json(
        &id,
        None,
        "the session metadata",
        &get::<String>(row, "metadata")?,
    )?;
    Ok(SessionRecord {
        status,
        app_version: get(row, "app_version")?,
        metadata,
        lease_owner: get(row, "lease_owner")?,
        lease_expires_at: get(row, "lease_expires_at")?,
        fence: get(row, "fence")?,
        recovery_attempts: get(row, "recovery_attempts")?,
        status_reason: get(row, "status_reason")?,
        latest_version: get(row, "latest_version")?,
        created_at: get(row, "created_at")?,
        updated_at: get(row, "updated_at")?,
        queue: get(row, "queue")?,
        wake_at: get(row, "wake_at")?,
        lease_renewed_at: get(row, "lease_renewed_at")?,
        parent: get::<Option<String>>(row, "parent_id")?.map(SessionId::new),
        waiting_until: get(row, "waiting_until")?,
        waiting_for: get(row, "waiting_for")?,
        cancel_requested: match (
            get::<Option<String>>(row, "cancel_by")?,
            get::<Option<String>>(row, "cancel_reason")?,
            get::<Option<i64>>(row, "cancel_requested_at")?,
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

/// Decodes the metadata of a checkpoint of `session` (the row names the session by its
/// key).
pub(crate) fn checkpoint_meta(
    session: &SessionId,
    row: &PgRow,
) -> Result<CheckpointMeta, StoreError> {
    Ok(CheckpointMeta {
        session: session.clone(),
        version: get(row, "version")?,
        last_seq: get(row, "last_seq")?,
        message_count: get(row, "message_count")?,
        app_version: get(row, "app_version")?,
        created_at: get(row, "created_at")?,
    })
}

/// Decodes a `durable_tool_calls` row.
pub(crate) fn call(row: &PgRow) -> Result<CallRecord, StoreError> {
    let session = SessionId::new(get::<String>(row, "session_id")?);
    let id = CallId::new(get::<String>(row, "id")?);
    let bad = |detail: String| corrupt(&session, None, format!("journal row `{id}`: {detail}"));
    let format: i32 = get(row, "format")?;
    if format > FORMAT_VERSION {
        return Err(bad(format!(
            "written by a newer format {format} (this release reads formats up to {FORMAT_VERSION}); upgrade `durable` to read it"
        )));
    }
    let kind: String = get(row, "kind")?;
    let kind = CallKind::parse(&kind).ok_or_else(|| bad(format!("unknown kind `{kind}`")))?;
    let class: String = get(row, "replay_class")?;
    let class: ReplayClass = class
        .parse()
        .map_err(|_| bad(format!("unknown replay class `{class}`")))?;
    let status: String = get(row, "status")?;
    let status =
        CallStatus::parse(&status).ok_or_else(|| bad(format!("unknown status `{status}`")))?;
    let what = |col: &str| format!("`{col}` of journal row `{id}`");
    let args = json(&session, None, &what("args"), &get::<String>(row, "args")?)?;
    let result = json_opt(&session, &what("result"), get(row, "result")?)?;
    let error = json_opt(&session, &what("error"), get(row, "error")?)?;
    let spend = json_opt(&session, &what("spend"), get(row, "spend")?)?;
    let approval = get::<Option<String>>(row, "approval")?
        .map(|text| approval(&session, &id, &text))
        .transpose()?;
    Ok(CallRecord {
        kind,
        identity: CallIdentity {
            session: session.clone(),
            step: get(row, "step")?,
            tool: get(row, "tool_name")?,
            input_hash: get(row, "input_hash")?,
            ordinal: get(row, "ordinal")?,
        },
        class,
        status,
        args,
        idempotency_key: get(row, "idempotency_key")?,
        schema_hash: get(row, "schema_hash")?,
        result,
        error,
        spend,
        mac: get(row, "mac")?,
        attempt: get(row, "attempt")?,
        fence: get(row, "fence")?,
        issued_at: get(row, "issued_at")?,
        finished_at: get(row, "finished_at")?,
        approval,
        id,
    })
}

/// Parses the stored `approval` of journal row `call`: the JSON text of an [`Approval`].
/// Text that is not one (a newer release's shape, or a row edited and re-sealed by hand)
/// is [`StoreError::Corrupt`] naming the row.
pub(crate) fn approval(
    session: &SessionId,
    call: &CallId,
    text: &str,
) -> Result<Approval, StoreError> {
    serde_json::from_str(text).map_err(|e| {
        corrupt(
            session,
            None,
            format!("`approval` of journal row `{call}` is not an approval: {e}"),
        )
    })
}

/// Decodes a `durable_resolutions` row.
pub(crate) fn resolution(row: &PgRow) -> Result<ResolutionRecord, StoreError> {
    let session = SessionId::new(get::<String>(row, "session_id")?);
    let call = CallId::new(get::<String>(row, "call_id")?);
    let what = format!("resolution of call `{call}`");
    check_format(&session, None, &what, get(row, "format")?)?;
    let decision: String = get(row, "decision")?;
    let resolution = match decision.as_str() {
        "happened" => {
            let text: Option<String> = get(row, "result")?;
            let text = text.ok_or_else(|| {
                corrupt(
                    &session,
                    None,
                    format!("{what}: `happened` without a result"),
                )
            })?;
            Resolution::Happened {
                result: json(&session, None, &format!("{what} result"), &text)?,
            }
        }
        "did_not_happen" => Resolution::DidNotHappen,
        other => {
            return Err(corrupt(
                &session,
                None,
                format!("{what}: unknown decision `{other}`"),
            ));
        }
    };
    Ok(ResolutionRecord {
        call,
        session,
        resolution,
        by: get(row, "resolved_by")?,
        note: get(row, "note")?,
        at: get(row, "created_at")?,
    })
}

/// Decodes a `durable_approvals` row (its seal checked by the caller, at its position).
pub(crate) fn approval_record(row: &PgRow) -> Result<ApprovalRecord, StoreError> {
    let session = SessionId::new(get::<String>(row, "session_id")?);
    let call = CallId::new(get::<String>(row, "call_id")?);
    let position: i64 = get(row, "position")?;
    let what = format!("approval log row {position} (call `{call}`)");
    check_format(&session, None, &what, get(row, "format")?)?;
    let event: String = get(row, "event")?;
    let event = ApprovalEvent::parse(&event)
        .ok_or_else(|| corrupt(&session, None, format!("{what}: unknown event `{event}`")))?;
    let args_before = json_opt(
        &session,
        &format!("{what}: the arguments before"),
        get(row, "args_before")?,
    )?;
    let args_after = json_opt(
        &session,
        &format!("{what}: the arguments approved"),
        get(row, "args_after")?,
    )?;
    Ok(ApprovalRecord {
        call,
        position,
        event,
        by: get(row, "actor")?,
        note: get(row, "note")?,
        args_before,
        args_after,
        at: get(row, "created_at")?,
        session,
    })
}

/// Decodes a `durable_errors` row.
pub(crate) fn error_record(row: &PgRow) -> Result<ErrorRecord, StoreError> {
    Ok(ErrorRecord {
        session: SessionId::new(get::<String>(row, "session_id")?),
        step: get(row, "step")?,
        context: get(row, "context")?,
        attempt: get(row, "attempt")?,
        message: get(row, "message")?,
        at: get(row, "created_at")?,
    })
}
