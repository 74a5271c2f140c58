//! Checkpoints: compare-and-set writes, snapshot reads and forks, and the sealed
//! append of a checkpoint with its messages that session creation and `finish_call`
//! share. A checkpoint is read back with the session head, the checkpoint row, its
//! transcript and the chain of seals between them, all from one snapshot (`reads`).

pub(crate) mod reads;
pub(crate) mod single_statement;

pub(crate) use reads::{load_checkpoint, load_checkpoint_window, messages};

use async_trait::async_trait;
use durable_core::StoreError;
use durable_core::ids::{CallId, SessionId};
use durable_core::integrity::Keyring;
use durable_core::store::{
    Checkpoint, CheckpointLog, CheckpointMeta, FORMAT_VERSION, Fence, ForkCopy, ForkSession, Lease,
    NewCheckpoint, SessionRecord, StoredMessage, fork_audit_map, fork_copies,
};
use serde_json::Value;
use sqlx::postgres::PgConnection;

use crate::PostgresStore;
use crate::error::{db, unique_violation};
use crate::keys;
use crate::rows::{self, checkpoint_meta_cols, get, session_cols};
use crate::seal::{self, RawCheckpoint};
use crate::tx::{self, Lock, Locked, Want, ttl_ms};

pub(crate) async fn save_checkpoint(
    store: &PostgresStore,
    fence: Fence<'_>,
    expected: i64,
    checkpoint: NewCheckpoint,
) -> Result<CheckpointMeta, StoreError> {
    if let Some(meta) = single_statement::save(store, fence, expected, &checkpoint).await? {
        return Ok(meta);
    }
    save_in_transaction(store, fence, expected, checkpoint, false).await
}

/// The final checkpoint and the session's completion, in one transaction (the
/// checkpoint's single-statement path is not taken: the status is written beside it).
pub(crate) async fn complete_with_checkpoint(
    store: &PostgresStore,
    fence: Fence<'_>,
    expected: i64,
    checkpoint: NewCheckpoint,
) -> Result<CheckpointMeta, StoreError> {
    save_in_transaction(store, fence, expected, checkpoint, true).await
}

/// A checkpoint written in a transaction of its own; `completes` marks the session
/// `completed` in it.
async fn save_in_transaction(
    store: &PostgresStore,
    fence: Fence<'_>,
    expected: i64,
    checkpoint: NewCheckpoint,
    completes: bool,
) -> Result<CheckpointMeta, StoreError> {
    let mut tx = tx::begin(&store.pool).await?;
    let ring = store.keyring();
    let mut locked =
        tx::lock_fenced(&mut tx, ring, fence, Lock::Update, Want { tail: true }).await?;
    let now = locked.now;
    let meta = append_checkpoint(
        &mut tx,
        ring,
        fence.session,
        &mut locked,
        expected,
        checkpoint,
        now,
    )
    .await?;
    if completes {
        let completed = durable_core::store::SessionStatus::Completed;
        crate::sessions::update_status(&mut tx, fence.session, completed, None, now).await?;
    }
    tx.commit().await.map_err(db)?;
    Ok(meta)
}

pub(crate) async fn list_checkpoints(
    store: &PostgresStore,
    id: &SessionId,
) -> Result<Vec<CheckpointMeta>, StoreError> {
    let mut conn = store.conn().await?;
    // Distinguish "no such session" from "no checkpoints".
    tx::session(&mut conn, id, None).await?;
    sqlx::query(concat!(
        "SELECT ",
        checkpoint_meta_cols!(),
        " FROM durable_checkpoints WHERE session_num = ",
        rows::session_num!("$1"),
        " ORDER BY version"
    ))
    .bind(id.as_str())
    .fetch_all(&mut *conn)
    .await
    .map_err(db)?
    .iter()
    .map(|row| rows::checkpoint_meta(id, row))
    .collect()
}

pub(crate) async fn fork_session(
    store: &PostgresStore,
    fork: &ForkSession,
) -> Result<(SessionRecord, Lease), StoreError> {
    let (id, version, new_id) = (&fork.source, fork.version, &fork.new_id);
    let (owner, ttl) = (fork.owner.as_str(), fork.ttl);
    new_id.validate()?;
    durable_core::validate::validate_owner(owner)?;
    // The source is checked before it is copied (head, chain, transcript, journal), as
    // SQLite's fork does: a fork must not launder a forged row under fresh seals.
    load_checkpoint(store, id, Some(version)).await?;
    let source_rows = crate::journal::calls(store, id, None).await?;
    let copies = fork_copies(fork, &source_rows)?;
    let mut tx = tx::begin(&store.pool).await?;
    let now = tx::now(&mut tx).await?;
    // Locked: the source's journal writes wait until the fork is committed, so the rows
    // checked above are the rows copied (or the fork is refused as changed).
    let source = sqlx::query(
        "SELECT app_version, metadata, format, queue FROM durable_sessions WHERE id = $1 \
         FOR UPDATE",
    )
    .bind(id.as_str())
    .fetch_optional(&mut *tx)
    .await
    .map_err(db)?
    .ok_or_else(|| StoreError::SessionNotFound(id.clone()))?;
    let cp = sqlx::query(concat!(
        "SELECT c.last_seq, c.message_count, ",
        rows::snapshot!("c", "plan"),
        " AS plan, ",
        rows::snapshot!("c", "budget"),
        " AS budget, ",
        rows::snapshot!("c", "state"),
        " AS state, c.format FROM durable_checkpoints c WHERE c.session_num = ",
        rows::session_num!("$1"),
        " AND c.version = $2"
    ))
    .bind(id.as_str())
    .bind(version)
    .fetch_optional(&mut *tx)
    .await
    .map_err(db)?
    .ok_or_else(|| StoreError::VersionNotFound {
        session: id.clone(),
        version,
    })?;
    let cp_format: i32 = get(&cp, "format")?;
    rows::check_format(id, Some(version), "the checkpoint", cp_format)?;
    let app_version: String = get(&source, "app_version")?;
    let expires = now.saturating_add(ttl_ms(ttl));
    let row = sqlx::query(concat!(
        "INSERT INTO durable_sessions (id, status, app_version, metadata, lease_owner, \
         lease_expires_at, fence, recovery_attempts, status_reason, latest_version, \
         created_at, updated_at, format, queue, lease_renewed_at) \
         VALUES ($1, 'active', $2, $3, $4, $5, 1, 0, NULL, 0, $6, $6, $7, $8, $6) \
         ON CONFLICT (id) DO NOTHING RETURNING ",
        session_cols!()
    ))
    .bind(new_id.as_str())
    .bind(&app_version)
    .bind(get::<String>(&source, "metadata")?)
    .bind(owner)
    .bind(expires)
    .bind(now)
    .bind(get::<i32>(&source, "format")?)
    .bind(get::<String>(&source, "queue")?)
    .fetch_optional(&mut *tx)
    .await
    .map_err(db)?
    .ok_or_else(|| StoreError::SessionExists(new_id.clone()))?;
    let record = rows::session(&row)?;
    let last_seq: i64 = get(&cp, "last_seq")?;
    // The transcript keeps its positions and bytes. A message stored as a reference to a
    // model row is copied as its text: the fork inherits no model row.
    sqlx::query(concat!(
        "INSERT INTO durable_messages (session_num, seq, message, format, created_at) \
         SELECT ",
        rows::session_num!("$1"),
        ", seq, message, format, created_at FROM durable_transcript \
         WHERE session_num = ",
        rows::session_num!("$2"),
        " AND seq <= $3"
    ))
    .bind(new_id.as_str())
    .bind(id.as_str())
    .bind(last_seq)
    .execute(&mut *tx)
    .await
    .map_err(db)?;
    insert_checkpoint(
        &mut tx,
        CheckpointRow {
            session: new_id,
            version: 0,
            last_seq,
            message_count: get(&cp, "message_count")?,
            plan: rows::snapshot_text(id, version, "the plan", get(&cp, "plan")?)?,
            budget: rows::snapshot_text(id, version, "the budget", get(&cp, "budget")?)?,
            state: rows::snapshot_text(id, version, "the state", get(&cp, "state")?)?,
            app_version: &app_version,
            format: cp_format,
            seal: None,
        },
        now,
    )
    .await?;
    copy_journal(&mut tx, fork, &copies, source_rows.len(), &app_version, now).await?;
    keys::reseal_session(&mut tx, None, store.keyring(), new_id).await?;
    tx.commit().await.map_err(db)?;
    let lease = Lease {
        session: new_id.clone(),
        owner: owner.to_owned(),
        fence: record.fence,
        expires_at: expires,
    };
    Ok((record, lease))
}

/// Copies the source's effects a fork must not repeat into its journal (rows `copies`,
/// from [`fork_copies`]), sets the new head's journal count (the caller re-seals the
/// session) and writes the fork's audit row. Each row is copied only if it still holds
/// the seal it was checked under, and only if the source's journal still has
/// `checked_rows` rows: otherwise [`StoreError::ForkSourceChanged`], nothing written.
async fn copy_journal(
    conn: &mut PgConnection,
    fork: &ForkSession,
    copies: &[ForkCopy],
    checked_rows: usize,
    app_version: &str,
    now: i64,
) -> Result<(), StoreError> {
    let (source, new_id) = (&fork.source, &fork.new_id);
    let rows_now: i64 =
        sqlx::query_scalar("SELECT count(*) FROM durable_tool_calls WHERE session_id = $1")
            .bind(source.as_str())
            .fetch_one(&mut *conn)
            .await
            .map_err(db)?;
    if usize::try_from(rows_now).ok() != Some(checked_rows) {
        return Err(StoreError::ForkSourceChanged(source.clone()));
    }
    for copy in copies {
        let done = sqlx::query(
            "INSERT INTO durable_tool_calls (id, session_id, kind, step, tool_name, input_hash, \
             ordinal, replay_class, status, args, idempotency_key, schema_hash, result, error, \
             spend, mac, attempt, fence, format, issued_at, finished_at, seq, approval) \
             SELECT $1, $2, kind, $3, tool_name, input_hash, COALESCE($8, ordinal), \
             replay_class, status, args, idempotency_key, schema_hash, result, error, spend, \
             NULL, attempt, 1, format, issued_at, finished_at, $4, approval \
             FROM durable_tool_calls WHERE id = $5 AND session_id = $6 \
             AND mac IS NOT DISTINCT FROM $7",
        )
        .bind(copy.to.as_str())
        .bind(new_id.as_str())
        .bind(copy.step)
        .bind(copy.seq)
        .bind(copy.from.as_str())
        .bind(source.as_str())
        .bind(copy.mac.as_deref())
        .bind(copy.ordinal)
        .execute(&mut *conn)
        .await
        .map_err(db)?;
        if done.rows_affected() != 1 {
            return Err(StoreError::ForkSourceChanged(source.clone()));
        }
    }
    sqlx::query("UPDATE durable_sessions SET journal_rows = $1 WHERE id = $2")
        .bind(i64::try_from(copies.len()).unwrap_or(i64::MAX))
        .bind(new_id.as_str())
        .execute(&mut *conn)
        .await
        .map_err(db)?;
    let pairs: Vec<(CallId, CallId)> = copies
        .iter()
        .map(|c| (c.from.clone(), c.to.clone()))
        .collect();
    let step_map = Value::from(
        fork_audit_map(source, fork.version, &pairs, &fork.rerun)
            .into_iter()
            .map(|(a, b)| serde_json::json!([a, b]))
            .collect::<Vec<_>>(),
    );
    sqlx::query(
        "INSERT INTO durable_migrations (session_id, from_version, to_version, step_map, \
         migrated_by, format, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7)",
    )
    .bind(new_id.as_str())
    .bind(app_version)
    .bind(app_version)
    .bind(step_map.to_string())
    .bind(&fork.by)
    .bind(FORMAT_VERSION)
    .bind(now)
    .execute(&mut *conn)
    .await
    .map_err(db)?;
    Ok(())
}

pub(crate) use crate::seal::Tail;

/// `insert_messages!(session, num, first_seq, format, created_at, texts, seals, version,
/// more_from)`: the `INSERT` of a checkpoint's new messages (`texts` and their `seals`, at
/// `first_seq..`) for checkpoint `version` of the session whose id is `session` and key
/// `num`, `more_from` appended to its `FROM` list. A
/// message whose text equals the result of a `model` row of the step the checkpoint ends
/// (`version - 1`, the latest version when it is written) is stored once (schema 6): as
/// `''` with `call_seq`, the row's position, read back through the view
/// `durable_transcript`. Decided in the statement, by the journal's identity index: no
/// round trip added. The seal covers the text.
macro_rules! insert_messages {
    ($session:literal, $num:literal, $first:literal, $format:literal, $now:literal,
     $texts:literal, $seals:literal, $version:literal, $more_from:literal) => {
        concat!(
            "INSERT INTO durable_messages \
               (session_num, seq, message, format, created_at, seal, call_seq) \
             SELECT ",
            $num,
            ", ",
            $first,
            " + t.ord - 1, CASE WHEN r.seq IS NULL THEN t.message ELSE '' END, ",
            $format,
            ", ",
            $now,
            ", t.seal, r.seq FROM unnest(",
            $texts,
            "::text[], ",
            $seals,
            "::text[]) WITH ORDINALITY AS t(message, seal, ord) \
             LEFT JOIN LATERAL (SELECT c.seq FROM durable_tool_calls c \
               WHERE c.session_id = ",
            $session,
            " AND c.step = ",
            $version,
            " - 1 AND c.kind = 'model' AND c.result = t.message \
               ORDER BY c.seq LIMIT 1) r ON true",
            $more_from
        )
    };
}
pub(crate) use insert_messages;

/// The tail of checkpoint `version` of a session: its transcript's end and its seal.
pub(crate) async fn tail(
    conn: &mut PgConnection,
    session: &SessionId,
    version: i64,
) -> Result<Tail, StoreError> {
    let row = sqlx::query(
        "SELECT k.last_seq, k.message_count, k.seal, m.seal AS message_seal, \
                m.seq IS NOT NULL AS message_found \
         FROM durable_checkpoints k \
         LEFT JOIN durable_messages m ON m.session_num = k.session_num AND m.seq = k.last_seq \
         WHERE k.session_num = (SELECT num FROM durable_sessions WHERE id = $1) \
           AND k.version = $2",
    )
    .bind(session.as_str())
    .bind(version)
    .fetch_optional(&mut *conn)
    .await
    .map_err(db)?
    .ok_or_else(|| StoreError::Tampered {
        session: session.clone(),
        what: format!("checkpoint {version}"),
        detail: "it is missing".to_owned(),
    })?;
    let last_seq: i64 = get(&row, "last_seq")?;
    if last_seq > 0 && !get::<bool>(&row, "message_found")? {
        return Err(StoreError::Tampered {
            session: session.clone(),
            what: format!("message {last_seq}"),
            detail: "it is missing from the transcript".to_owned(),
        });
    }
    Ok(Tail {
        version: Some(version),
        last_seq,
        message_count: get(&row, "message_count")?,
        message_seal: get::<Option<String>>(&row, "message_seal")?.unwrap_or_default(),
        checkpoint_seal: get::<Option<String>>(&row, "seal")?.unwrap_or_default(),
    })
}

/// A checkpoint and its new messages, sealed, ready to write: the messages go at
/// `first_seq..`, each chained to the one before, the checkpoint after `tail`'s.
pub(crate) struct Sealed {
    pub(crate) version: i64,
    /// The position of the first new message.
    pub(crate) first_seq: i64,
    pub(crate) texts: Vec<String>,
    pub(crate) seals: Vec<String>,
    pub(crate) row: CheckpointRowOwned,
}

/// [`CheckpointRow`]'s owned columns.
pub(crate) struct CheckpointRowOwned {
    pub(crate) last_seq: i64,
    pub(crate) message_count: i64,
    pub(crate) plan: String,
    pub(crate) budget: String,
    pub(crate) state: String,
    pub(crate) seal: String,
}

/// Seals `checkpoint` (its messages appended after `tail`, the checkpoint chained to
/// `tail`'s) and moves `tail` to it. Writes nothing.
pub(crate) fn seal_checkpoint(
    ring: &Keyring,
    session: &SessionId,
    app_version: &str,
    tail: &mut Tail,
    checkpoint: &NewCheckpoint,
) -> Result<Sealed, StoreError> {
    let version = tail.version.map_or(0, |v| v + 1);
    let first_seq = tail.last_seq + 1;
    let texts: Vec<String> = checkpoint.messages.iter().map(Value::to_string).collect();
    let mut seals = Vec::with_capacity(texts.len());
    for text in &texts {
        let seq = tail.last_seq + 1;
        tail.message_seal = seal::seal_message(ring, session, seq, text, &tail.message_seal)?;
        seals.push(tail.message_seal.clone());
        tail.last_seq = seq;
        tail.message_count += 1;
    }
    let (plan, budget, state) = (
        checkpoint.plan.to_string(),
        checkpoint.budget.to_string(),
        checkpoint.state.to_string(),
    );
    let sealed = RawCheckpoint {
        session,
        version,
        last_seq: tail.last_seq,
        message_count: tail.message_count,
        last_message_seal: &tail.message_seal,
        plan: &plan,
        budget: &budget,
        state: &state,
        app_version,
        previous: &tail.checkpoint_seal,
    }
    .seal(ring)?;
    tail.checkpoint_seal.clone_from(&sealed);
    tail.version = Some(version);
    Ok(Sealed {
        version,
        first_seq,
        texts,
        seals,
        row: CheckpointRowOwned {
            last_seq: tail.last_seq,
            message_count: tail.message_count,
            plan,
            budget,
            state,
            seal: sealed,
        },
    })
}

/// The stored form of a checkpoint row.
pub(crate) struct CheckpointRow<'a> {
    pub(crate) session: &'a SessionId,
    pub(crate) version: i64,
    pub(crate) last_seq: i64,
    pub(crate) message_count: i64,
    pub(crate) plan: String,
    pub(crate) budget: String,
    pub(crate) state: String,
    pub(crate) app_version: &'a str,
    pub(crate) format: i32,
    /// Its seal (`None` for a copy that is re-sealed afterwards, as a fork's).
    pub(crate) seal: Option<String>,
}

/// Inserts a checkpoint row. A primary-key collision means another writer got the
/// version first: [`StoreError::VersionConflict`].
pub(crate) async fn insert_checkpoint(
    conn: &mut PgConnection,
    row: CheckpointRow<'_>,
    now: i64,
) -> Result<CheckpointMeta, StoreError> {
    let result = sqlx::query(concat!(
        "INSERT INTO durable_checkpoints (session_num, version, last_seq, message_count, plan, \
         budget, state, app_version, format, created_at, seal) \
         VALUES (",
        rows::session_num!("$1"),
        ", $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) RETURNING ",
        checkpoint_meta_cols!()
    ))
    .bind(row.session.as_str())
    .bind(row.version)
    .bind(row.last_seq)
    .bind(row.message_count)
    .bind(&row.plan)
    .bind(&row.budget)
    .bind(&row.state)
    .bind(row.app_version)
    .bind(row.format)
    .bind(now)
    .bind(&row.seal)
    .fetch_one(&mut *conn)
    .await;
    match result {
        Ok(r) => rows::checkpoint_meta(row.session, &r),
        Err(e) if unique_violation(&e).is_some() => Err(StoreError::VersionConflict {
            session: row.session.clone(),
            expected: row.version - 1,
            actual: row.version,
        }),
        Err(e) => Err(db(e)),
    }
}

/// Appends `checkpoint`'s messages after `tail` and inserts the checkpoint after
/// `tail`'s, whose transcript ends with them, all sealed (messages chained to the log's
/// last message, the checkpoint to the previous version's seal in `tail`). Moves `tail`
/// to the new checkpoint.
pub(crate) async fn insert_sealed_checkpoint(
    conn: &mut PgConnection,
    ring: &Keyring,
    session: &SessionId,
    app_version: &str,
    tail: &mut Tail,
    checkpoint: &NewCheckpoint,
    now: i64,
) -> Result<CheckpointMeta, StoreError> {
    let sealed = seal_checkpoint(ring, session, app_version, tail, checkpoint)?;
    if !sealed.texts.is_empty() {
        sqlx::query(concat!(
            "INSERT INTO durable_messages (session_num, seq, message, format, created_at, seal) \
             SELECT ",
            rows::session_num!("$1"),
            ", $2 + t.ord - 1, t.message, $3, $4, t.seal \
             FROM unnest($5::text[], $6::text[]) WITH ORDINALITY AS t(message, seal, ord)"
        ))
        .bind(session.as_str())
        .bind(sealed.first_seq)
        .bind(FORMAT_VERSION)
        .bind(now)
        .bind(&sealed.texts)
        .bind(&sealed.seals)
        .execute(&mut *conn)
        .await
        .map_err(db)?;
    }
    let row = sealed.row;
    insert_checkpoint(
        conn,
        CheckpointRow {
            session,
            version: sealed.version,
            last_seq: row.last_seq,
            message_count: row.message_count,
            plan: row.plan,
            budget: row.budget,
            state: row.state,
            app_version,
            format: FORMAT_VERSION,
            seal: Some(row.seal),
        },
        now,
    )
    .await
}

/// Compare-and-set append of checkpoint `expected + 1` to a session locked by
/// [`lock_fenced`](tx::lock_fenced) with [`Lock::Update`]: messages, checkpoint row and
/// session row with its re-sealed head, written by one statement. Continues from
/// `locked.tail` when the lock read it, else reads it.
pub(crate) async fn append_checkpoint(
    conn: &mut PgConnection,
    ring: &Keyring,
    session: &SessionId,
    locked: &mut Locked,
    expected: i64,
    checkpoint: NewCheckpoint,
    now: i64,
) -> Result<CheckpointMeta, StoreError> {
    if locked.latest_version != expected {
        return Err(StoreError::VersionConflict {
            session: session.clone(),
            expected,
            actual: locked.latest_version,
        });
    }
    let mut tail = match locked.tail.take() {
        Some(tail) => tail,
        None => tail(conn, session, expected).await?,
    };
    let sealed = seal_checkpoint(ring, session, &locked.app_version, &mut tail, &checkpoint)?;
    let version = sealed.version;
    locked.head.latest_version = version;
    locked
        .head
        .checkpoint_seal
        .clone_from(&tail.checkpoint_seal);
    locked.head.seal(ring)?;
    let result = sqlx::query(concat!(
        "WITH k AS (SELECT num FROM durable_sessions WHERE id = $1), \
         messages AS (",
        insert_messages!("$1", "k.num", "$2", "$3", "$4", "$5", "$6", "$7", ", k"),
        "), \
         checkpoint AS ( \
           INSERT INTO durable_checkpoints (session_num, version, last_seq, message_count, \
             plan, budget, state, app_version, format, created_at, seal) \
           SELECT k.num, $7, $8, $9, ",
        rows::stored_snapshot!("plan", "$10", "k.num", "$7"),
        ", ",
        rows::stored_snapshot!("budget", "$11", "k.num", "$7"),
        ", ",
        rows::stored_snapshot!("state", "$12", "k.num", "$7"),
        ", $13, $3, $4, $14 FROM k) \
         UPDATE durable_sessions \
         SET latest_version = $7, recovery_attempts = 0, updated_at = $4, head = $15, \
           wake_at = $16 \
         WHERE id = $1"
    ))
    .bind(session.as_str())
    .bind(sealed.first_seq)
    .bind(FORMAT_VERSION)
    .bind(now)
    .bind(&sealed.texts)
    .bind(&sealed.seals)
    .bind(version)
    .bind(sealed.row.last_seq)
    .bind(sealed.row.message_count)
    .bind(&sealed.row.plan)
    .bind(&sealed.row.budget)
    .bind(&sealed.row.state)
    .bind(&locked.app_version)
    .bind(&sealed.row.seal)
    .bind(locked.head.head.as_deref())
    .bind(checkpoint.wake_at)
    .execute(&mut *conn)
    .await;
    match result {
        Ok(_) => {}
        Err(e) if unique_violation(&e).as_deref() == Some("durable_checkpoints_pkey") => {
            return Err(StoreError::VersionConflict {
                session: session.clone(),
                expected,
                actual: version,
            });
        }
        Err(e) => return Err(db(e)),
    }
    locked.latest_version = version;
    Ok(CheckpointMeta {
        session: session.clone(),
        version,
        last_seq: sealed.row.last_seq,
        message_count: sealed.row.message_count,
        app_version: locked.app_version.clone(),
        created_at: now,
    })
}

#[async_trait]
impl CheckpointLog for PostgresStore {
    async fn save_checkpoint(
        &self,
        fence: Fence<'_>,
        expected: i64,
        checkpoint: NewCheckpoint,
    ) -> Result<CheckpointMeta, StoreError> {
        save_checkpoint(self, fence, expected, checkpoint).await
    }

    async fn complete_with_checkpoint(
        &self,
        fence: Fence<'_>,
        expected: i64,
        checkpoint: NewCheckpoint,
    ) -> Result<CheckpointMeta, StoreError> {
        let meta = complete_with_checkpoint(self, fence, expected, checkpoint).await?;
        self.work_available();
        Ok(meta)
    }

    async fn load_checkpoint(
        &self,
        id: &SessionId,
        version: Option<i64>,
    ) -> Result<Checkpoint, StoreError> {
        load_checkpoint(self, id, version).await
    }

    async fn load_checkpoint_window(
        &self,
        id: &SessionId,
        version: Option<i64>,
        window: usize,
    ) -> Result<Checkpoint, StoreError> {
        load_checkpoint_window(self, id, version, Some(window)).await
    }

    async fn messages(
        &self,
        id: &SessionId,
        from: i64,
        to: i64,
    ) -> Result<Vec<StoredMessage>, StoreError> {
        messages(self, id, from, to).await
    }

    async fn list_checkpoints(&self, id: &SessionId) -> Result<Vec<CheckpointMeta>, StoreError> {
        list_checkpoints(self, id).await
    }

    async fn fork_session_with(
        &self,
        fork: &ForkSession,
    ) -> Result<(SessionRecord, Lease), StoreError> {
        fork_session(self, fork).await
    }
}
