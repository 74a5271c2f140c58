//! The rows a backend seals, as it stores them, and what checks them: a journal row
//! ([`RawCall`]), the session head ([`HeadRow`]) with the journal's extent
//! ([`check_journal_extent`]), a checkpoint ([`RawCheckpoint`]), a transcript message
//! ([`seal_message`], [`check_message`]), a resolution ([`RawResolution`],
//! [`check_resolutions`]) and an approval event ([`RawApproval`], [`check_approvals`]).
//!
//! Written once for every backend: a backend reads its columns into these types (JSON
//! columns as the stored text, so a seal covers the bytes a reader decodes), calls
//! their `seal` before it writes and their `check` after it reads, and runs only its
//! own SQL. The same rows give the same seals on every backend.

use super::message_fields;
use super::{
    ApprovalFields, CallFields, CheckpointFields, Fields, Head, IssuedCount, Keyring,
    ResolutionFields,
};
use crate::error::StoreError;
use crate::ids::SessionId;

/// A journal row's sealed columns, as stored (see [`CallFields`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawCall {
    /// Row id.
    pub id: String,
    /// Session id.
    pub session: String,
    /// `tool` or `model`.
    pub kind: String,
    /// Step.
    pub step: i64,
    /// Tool name.
    pub tool: String,
    /// Input hash.
    pub input_hash: String,
    /// Ordinal.
    pub ordinal: i64,
    /// Replay class, as stored.
    pub class: String,
    /// Status, as stored.
    pub status: String,
    /// Arguments (JSON text, as stored).
    pub args: String,
    /// Idempotency key.
    pub key: Option<String>,
    /// Schema fingerprint.
    pub schema_hash: String,
    /// Recorded result (JSON text).
    pub result: Option<String>,
    /// Recorded error (JSON text).
    pub error: Option<String>,
    /// Recorded spend (JSON text).
    pub spend: Option<String>,
    /// Executions started.
    pub attempt: i64,
    /// Position in the session's journal.
    pub seq: i64,
    /// The row's seal (`None`: never sealed).
    pub mac: Option<String>,
    /// The call's approval as stored (JSON text), for a call that needed one: sealed as
    /// stored, so the seal covers the bytes a reader decodes.
    pub approval: Option<String>,
}

impl RawCall {
    /// The sealed bytes.
    pub fn fields(&self) -> Fields {
        CallFields {
            id: &self.id,
            session: &self.session,
            kind: &self.kind,
            step: self.step,
            tool: &self.tool,
            input_hash: &self.input_hash,
            ordinal: self.ordinal,
            class: &self.class,
            status: &self.status,
            args: &self.args,
            key: self.key.as_deref(),
            schema_hash: &self.schema_hash,
            result: self.result.as_deref(),
            error: self.error.as_deref(),
            spend: self.spend.as_deref(),
            attempt: self.attempt,
            seq: self.seq,
            approval: self.approval.as_deref(),
        }
        .fields()
    }

    /// Checks the row's seal: [`StoreError::Tampered`] naming the row and its position.
    pub fn check(&self, ring: &Keyring) -> Result<(), StoreError> {
        ring.verify(
            &SessionId::new(self.session.clone()),
            || format!("journal row `{}` (seq {})", self.id, self.seq),
            &self.fields(),
            self.mac.as_deref(),
        )
    }

    /// Seals the row as it now stands (into [`mac`](Self::mac)).
    pub fn seal(&mut self, ring: &Keyring) -> Result<(), StoreError> {
        self.mac = Some(ring.seal(&self.fields())?);
        Ok(())
    }
}

/// A session's head as stored: its counts and its latest checkpoint's seal (see
/// [`Head`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeadRow {
    /// The session.
    pub session: SessionId,
    /// Journal rows (the highest position).
    pub journal_rows: i64,
    /// Latest checkpoint version.
    pub latest_version: i64,
    /// Resolutions recorded.
    pub resolutions: i64,
    /// Journal rows whose status is `issued`; `None` on a head written before store
    /// schema 4 (sealed without the count: [`Head::legacy_fields`]), which the store
    /// upgrades when a writer opens the database.
    pub issued_rows: Option<i64>,
    /// Rows of the session's approval log (requests and decisions); 0 for every session
    /// without approvals, whose heads are sealed as before ([`Head::approvals`]).
    pub approvals: i64,
    /// The latest checkpoint's seal (`""`: none).
    pub checkpoint_seal: String,
    /// The head's seal (`None`: never sealed).
    pub head: Option<String>,
}

impl HeadRow {
    /// The sealed bytes, in the format the head was written in.
    pub fn fields(&self) -> Fields {
        IssuedCount(self.issued_rows).fields(Head {
            session: self.session.as_str(),
            journal_rows: self.journal_rows,
            latest_version: self.latest_version,
            checkpoint_seal: &self.checkpoint_seal,
            resolutions: self.resolutions,
            issued_rows: 0,
            approvals: self.approvals,
        })
    }

    /// Adds `delta` to the count of issued rows (a row issued: +1; finished or resolved:
    /// −1); a head without its count cannot be written ([`IssuedCount::add`]).
    pub fn count_issued(&mut self, delta: i64) -> Result<(), StoreError> {
        self.issued_rows = IssuedCount(self.issued_rows).add(&self.session, delta)?.0;
        Ok(())
    }

    /// Checks that a read of the session's issued rows found as many as the head counts
    /// ([`IssuedCount::check`]).
    pub fn check_issued(&self, found: usize) -> Result<(), StoreError> {
        if crate::guard_switch::guard_off("absence") {
            return Ok(());
        }
        IssuedCount(self.issued_rows).check(&self.session, found)
    }

    /// Checks the head's seal. A head without its count of issued rows is refused
    /// ([`IssuedCount::uncounted`]): a writer counted every head when it upgraded the
    /// database, so one left uncounted failed its checks then.
    pub fn check(&self, ring: &Keyring) -> Result<(), StoreError> {
        if self.issued_rows.is_none() {
            return Err(IssuedCount::uncounted(&self.session));
        }
        self.check_any_format(ring)
    }

    /// Checks the head's seal in whichever format it was written: with its count of
    /// issued rows, or (`issued_rows` is `None`) the format before schema 4. Only for the
    /// upgrade and the re-sealing that count such heads.
    pub fn check_any_format(&self, ring: &Keyring) -> Result<(), StoreError> {
        if self.issued_rows.is_none() && self.approvals != 0 {
            // A head of the old format was written before approvals existed: its seal
            // does not cover the count, so a count there was set behind the store's back.
            return Err(StoreError::Tampered {
                session: self.session.clone(),
                what: "the session head".to_owned(),
                detail: format!(
                    "it predates approvals but counts {} approval events",
                    self.approvals
                ),
            });
        }
        ring.verify(
            &self.session,
            || "the session head (its row counts and latest checkpoint)".to_owned(),
            &self.fields(),
            self.head.as_deref(),
        )
    }

    /// Seals the head as it now stands (after its counts changed), into
    /// [`head`](Self::head); the backend writes it with its counts.
    pub fn seal(&mut self, ring: &Keyring) -> Result<(), StoreError> {
        self.head = Some(ring.seal(&self.fields())?);
        Ok(())
    }
}

/// Checks that the session's journal holds exactly rows `1..=head.journal_rows`, from
/// its row count and its highest and lowest positions (`top`, `bottom`): a deleted row
/// leaves a gap or a short count, an inserted one a long count.
pub fn check_journal_extent(
    head: &HeadRow,
    count: i64,
    top: i64,
    bottom: i64,
) -> Result<(), StoreError> {
    if crate::guard_switch::guard_off("absence") {
        return Ok(());
    }
    if count != head.journal_rows || top != head.journal_rows || bottom != 1 {
        return Err(StoreError::Tampered {
            session: head.session.clone(),
            what: "the journal".to_owned(),
            detail: format!(
                "the session head records {} rows, the table holds {count} (seq {bottom}..={top}): rows were deleted or inserted",
                head.journal_rows
            ),
        });
    }
    Ok(())
}

/// The seal of message `seq`, chained to `previous` (the seal of the message before it,
/// `""` for the first).
pub fn seal_message(
    ring: &Keyring,
    session: &SessionId,
    seq: i64,
    message: &str,
    previous: &str,
) -> Result<String, StoreError> {
    ring.seal(&message_fields(session.as_str(), seq, message, previous))
}

/// Checks message `seq`'s seal, chained to `previous`.
pub fn check_message(
    ring: &Keyring,
    session: &SessionId,
    seq: i64,
    message: &str,
    previous: &str,
    seal: Option<&str>,
) -> Result<(), StoreError> {
    ring.verify(
        session,
        || format!("message {seq}"),
        &message_fields(session.as_str(), seq, message, previous),
        seal,
    )
}

/// A checkpoint's sealed columns (snapshots as their stored text; see
/// [`CheckpointFields`]).
#[derive(Debug, Clone, Copy)]
pub struct RawCheckpoint<'a> {
    /// The session.
    pub session: &'a SessionId,
    /// Version.
    pub version: i64,
    /// The transcript's last position.
    pub last_seq: i64,
    /// Messages in the transcript.
    pub message_count: i64,
    /// The seal of the transcript's last message (`""`: none).
    pub last_message_seal: &'a str,
    /// The plan snapshot.
    pub plan: &'a str,
    /// The budget snapshot.
    pub budget: &'a str,
    /// Application state.
    pub state: &'a str,
    /// App version.
    pub app_version: &'a str,
    /// The previous checkpoint's seal (`""` for version 0).
    pub previous: &'a str,
}

impl RawCheckpoint<'_> {
    /// The sealed bytes.
    pub fn fields(&self) -> Fields {
        CheckpointFields {
            session: self.session.as_str(),
            version: self.version,
            last_seq: self.last_seq,
            message_count: self.message_count,
            last_message_seal: self.last_message_seal,
            plan: self.plan,
            budget: self.budget,
            state: self.state,
            app_version: self.app_version,
            previous: self.previous,
        }
        .fields()
    }

    /// The checkpoint's seal.
    pub fn seal(&self, ring: &Keyring) -> Result<String, StoreError> {
        ring.seal(&self.fields())
    }

    /// Checks the checkpoint's seal.
    pub fn check(&self, ring: &Keyring, seal: Option<&str>) -> Result<(), StoreError> {
        ring.verify(
            self.session,
            || format!("checkpoint {}", self.version),
            &self.fields(),
            seal,
        )
    }
}

/// A resolution's sealed columns (see [`ResolutionFields`]).
pub fn resolution_fields<'a>(
    call: &'a str,
    session: &'a SessionId,
    position: i64,
    decision: &'a str,
    result: Option<&'a str>,
    by: &'a str,
    note: Option<&'a str>,
) -> Fields {
    ResolutionFields {
        call,
        session: session.as_str(),
        position,
        decision,
        result,
        by,
        note,
    }
    .fields()
}

/// A resolution audit row's sealed columns, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawResolution {
    /// The resolved call's id.
    pub call: String,
    /// The position stored with the row (named in errors; the seal is checked at the
    /// position the row is read at).
    pub position: i64,
    /// `happened` or `did_not_happen`, as stored.
    pub decision: String,
    /// The recorded result (JSON text).
    pub result: Option<String>,
    /// Who resolved it.
    pub by: String,
    /// The note.
    pub note: Option<String>,
    /// The row's seal.
    pub seal: Option<String>,
}

impl RawResolution {
    /// Checks the row's seal at position `expected` of `session`'s resolutions.
    pub fn check(
        &self,
        ring: &Keyring,
        session: &SessionId,
        expected: i64,
    ) -> Result<(), StoreError> {
        let fields = resolution_fields(
            &self.call,
            session,
            expected,
            &self.decision,
            self.result.as_deref(),
            &self.by,
            self.note.as_deref(),
        );
        ring.verify(
            session,
            || format!("resolution {} (call `{}`)", self.position, self.call),
            &fields,
            self.seal.as_deref(),
        )
    }
}

/// Checks the resolutions of a session, read in order, against their seals (each at its
/// position 1, 2, …) and the head's count: a deleted, reordered or altered resolution is
/// [`StoreError::Tampered`].
pub fn check_resolutions(
    ring: &Keyring,
    head: &HeadRow,
    found: &[RawResolution],
) -> Result<(), StoreError> {
    for (i, raw) in found.iter().enumerate() {
        let expected = i64::try_from(i + 1).unwrap_or(i64::MAX);
        raw.check(ring, &head.session, expected)?;
    }
    check_resolution_count(head, found.len())
}

/// Checks that a read of every resolution of a session found as many as the head counts.
pub fn check_resolution_count(head: &HeadRow, found: usize) -> Result<(), StoreError> {
    check_log_count(
        head,
        head.resolutions,
        found,
        ("the resolutions", "resolutions", "table"),
    )
}

/// Whether the `found` rows of one of a session's audit logs are as many as `counted`,
/// the head's count of that log; [`StoreError::Tampered`] naming the log otherwise (a row
/// deleted or added outside durable). `names`: the log as the error names it, what its
/// rows are, and where they are kept.
fn check_log_count(
    head: &HeadRow,
    counted: i64,
    found: usize,
    (what, rows, kept): (&str, &str, &str),
) -> Result<(), StoreError> {
    if i64::try_from(found).ok() == Some(counted) {
        return Ok(());
    }
    Err(StoreError::Tampered {
        session: head.session.clone(),
        what: what.to_owned(),
        detail: format!("the session head records {counted} {rows}, the {kept} holds {found}"),
    })
}

/// An approval log row's sealed columns, as stored (see [`ApprovalFields`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawApproval {
    /// The call the event is about.
    pub call: String,
    /// The position stored with the row (1, 2, …; the seal is checked at the position
    /// the row is read at, so a row moved in the log fails it).
    pub position: i64,
    /// `requested`, `approved`, `denied`, `expired` or `revoked`, as stored.
    pub event: String,
    /// Who asked or decided.
    pub actor: String,
    /// Reasoning, reason or note.
    pub note: Option<String>,
    /// Arguments before an edit (JSON text, as stored).
    pub args_before: Option<String>,
    /// Arguments approved by an edit (JSON text, as stored).
    pub args_after: Option<String>,
    /// The row's seal (`None`: never sealed).
    pub seal: Option<String>,
}

impl RawApproval {
    /// The sealed bytes, at `position` of `session`'s log.
    pub fn fields(&self, session: &SessionId, position: i64) -> Fields {
        ApprovalFields {
            call: &self.call,
            session: session.as_str(),
            position,
            event: &self.event,
            actor: &self.actor,
            note: self.note.as_deref(),
            args_before: self.args_before.as_deref(),
            args_after: self.args_after.as_deref(),
        }
        .fields()
    }

    /// Seals the row at its own position (into [`seal`](Self::seal)).
    pub fn seal(&mut self, ring: &Keyring, session: &SessionId) -> Result<(), StoreError> {
        self.seal = Some(ring.seal(&self.fields(session, self.position))?);
        Ok(())
    }

    /// Checks the row read at position `expected` of `session`'s log: its seal there,
    /// then the position stored with it. A row deleted before it, moved or altered is
    /// [`StoreError::Tampered`].
    pub fn check(
        &self,
        ring: &Keyring,
        session: &SessionId,
        expected: i64,
    ) -> Result<(), StoreError> {
        let what = || format!("approval event {} (call `{}`)", self.position, self.call);
        ring.verify(
            session,
            what,
            &self.fields(session, expected),
            self.seal.as_deref(),
        )?;
        // The seal holds at the expected position; a stored position that says otherwise
        // was edited.
        if self.position != expected {
            return Err(StoreError::Tampered {
                session: session.clone(),
                what: what(),
                detail: format!("it is at position {expected} of the log"),
            });
        }
        Ok(())
    }
}

/// Checks a session's approval log, read in position order, against the seals (each at
/// its position 1, 2, …), the positions stored and the head's count: a row deleted,
/// inserted, moved or altered is [`StoreError::Tampered`].
pub fn check_approvals(
    ring: &Keyring,
    head: &HeadRow,
    found: &[RawApproval],
) -> Result<(), StoreError> {
    for (i, raw) in found.iter().enumerate() {
        raw.check(
            ring,
            &head.session,
            i64::try_from(i + 1).unwrap_or(i64::MAX),
        )?;
    }
    check_approval_count(head, found.len())
}

/// Checks that a read of a session's whole approval log found as many rows as the head
/// counts.
pub fn check_approval_count(head: &HeadRow, found: usize) -> Result<(), StoreError> {
    check_log_count(
        head,
        head.approvals,
        found,
        ("the approval log", "approval events", "log"),
    )
}

/// A transcript message's sealed columns, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawMessage {
    /// Its position in the session's transcript (1, 2, …).
    pub seq: i64,
    /// The message's stored text.
    pub text: String,
    /// Its seal, chained to the message before it.
    pub seal: Option<String>,
}

/// A checkpoint row's sealed columns, owned (snapshots resolved to their text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointRow {
    /// Version.
    pub version: i64,
    /// The transcript's last position.
    pub last_seq: i64,
    /// Messages in the transcript.
    pub message_count: i64,
    /// The plan snapshot's text.
    pub plan: String,
    /// The budget snapshot's text.
    pub budget: String,
    /// The state snapshot's text.
    pub state: String,
    /// App version.
    pub app_version: String,
    /// The stored seal.
    pub seal: Option<String>,
}

impl CheckpointRow {
    /// The sealed columns, with the seals the checkpoint's seal covers: its transcript's
    /// last message seal and the previous checkpoint's seal.
    pub fn sealed<'b>(
        &'b self,
        session: &'b SessionId,
        last_message_seal: &'b str,
        previous: &'b str,
    ) -> RawCheckpoint<'b> {
        RawCheckpoint {
            session,
            version: self.version,
            last_seq: self.last_seq,
            message_count: self.message_count,
            last_message_seal,
            plan: &self.plan,
            budget: &self.budget,
            state: &self.state,
            app_version: &self.app_version,
            previous,
        }
    }
}

/// The re-seal walk of one session: every row checked under the key it was sealed with
/// (`from`; `None`: the rows were never sealed and are sealed as they are) and sealed
/// again under `to`, table by table, in the order a backend reads them: the head
/// ([`check_head`](Self::check_head)), the journal ([`calls`](Self::calls)), the
/// transcript in order ([`message`](Self::message)), the checkpoints in order
/// ([`checkpoint`](Self::checkpoint)), the resolutions
/// ([`resolution`](Self::resolution)), and last the head again, over the latest
/// checkpoint's new seal ([`point_head`](Self::point_head)). The backend reads each table
/// and writes the new seals back; the chains and what each seal covers are kept here.
#[derive(Debug)]
pub struct Reseal<'a> {
    from: Option<&'a Keyring>,
    to: &'a Keyring,
    session: &'a SessionId,
    old_messages: std::collections::HashMap<i64, String>,
    new_messages: std::collections::HashMap<i64, String>,
    old_message: String,
    new_message: String,
    old_checkpoint: String,
    new_checkpoint: String,
    new_checkpoints: std::collections::HashMap<i64, String>,
}

impl<'a> Reseal<'a> {
    /// Starts the walk of `session`'s rows from `from` to `to`.
    pub fn new(from: Option<&'a Keyring>, to: &'a Keyring, session: &'a SessionId) -> Self {
        Reseal {
            from,
            to,
            session,
            old_messages: std::collections::HashMap::from([(0, String::new())]),
            new_messages: std::collections::HashMap::from([(0, String::new())]),
            old_message: String::new(),
            new_message: String::new(),
            old_checkpoint: String::new(),
            new_checkpoint: String::new(),
            new_checkpoints: std::collections::HashMap::new(),
        }
    }

    /// Whether the rows are checked before they are sealed again (they were sealed).
    pub fn checks(&self) -> bool {
        self.from.is_some()
    }

    /// Checks the head under the old key, in whichever format it was written (a head
    /// written before schema 4 is counted by [`calls`](Self::calls)).
    pub fn check_head(&self, head: &HeadRow) -> Result<(), StoreError> {
        match self.from {
            Some(from) => head.check_any_format(from),
            None => Ok(()),
        }
    }

    /// Checks every journal row under the old key and seals it under the new one, then
    /// counts the issued rows into the head: a head that counted them already must
    /// agree ([`HeadRow::check_issued`]), one written before schema 4 gets its count.
    pub fn calls(&self, head: &mut HeadRow, calls: &mut [RawCall]) -> Result<(), StoreError> {
        for raw in calls.iter_mut() {
            if let Some(from) = self.from {
                raw.check(from)?;
            }
            raw.seal(self.to)?;
        }
        let issued = calls.iter().filter(|raw| raw.status == "issued").count();
        if self.from.is_some() && head.issued_rows.is_some() {
            head.check_issued(issued)?;
        }
        head.issued_rows = Some(i64::try_from(issued).unwrap_or(i64::MAX));
        Ok(())
    }

    /// Checks the next message of the transcript (in order) under the old key, chained
    /// to the one before, and returns its new seal, chained to the new seal before it.
    pub fn message(&mut self, message: &RawMessage) -> Result<String, StoreError> {
        let RawMessage { seq, text, seal } = message;
        if let Some(from) = self.from {
            check_message(
                from,
                self.session,
                *seq,
                text,
                &self.old_message,
                seal.as_deref(),
            )?;
        }
        self.old_message = seal.clone().unwrap_or_default();
        self.old_messages.insert(*seq, self.old_message.clone());
        let new = seal_message(self.to, self.session, *seq, text, &self.new_message)?;
        self.new_message.clone_from(&new);
        self.new_messages.insert(*seq, new.clone());
        Ok(new)
    }

    /// Checks the next checkpoint (in version order, after every message) under the old
    /// key, chained to the one before and covering its transcript's last old message
    /// seal, and returns its new seal. `old_missing` is the error when that message is
    /// not in the transcript; its new seal missing is the checkpoint's own error.
    pub fn checkpoint(
        &mut self,
        row: &CheckpointRow,
        old_missing: impl FnOnce() -> StoreError,
    ) -> Result<String, StoreError> {
        let session = self.session;
        if let Some(from) = self.from {
            let old_last = self
                .old_messages
                .get(&row.last_seq)
                .ok_or_else(old_missing)?;
            row.sealed(session, old_last, &self.old_checkpoint)
                .check(from, row.seal.as_deref())?;
        }
        self.old_checkpoint = row.seal.clone().unwrap_or_default();
        let new_last =
            self.new_messages
                .get(&row.last_seq)
                .ok_or_else(|| StoreError::Tampered {
                    session: session.clone(),
                    what: format!("checkpoint {}", row.version),
                    detail: format!(
                        "its transcript ends at message {}, which is missing",
                        row.last_seq
                    ),
                })?;
        let new = row
            .sealed(session, new_last, &self.new_checkpoint)
            .seal(self.to)?;
        self.new_checkpoint.clone_from(&new);
        self.new_checkpoints.insert(row.version, new.clone());
        Ok(new)
    }

    /// Checks a resolution under the old key at its stored position and returns its new
    /// seal.
    pub fn resolution(&self, raw: &RawResolution) -> Result<String, StoreError> {
        let fields = resolution_fields(
            &raw.call,
            self.session,
            raw.position,
            &raw.decision,
            raw.result.as_deref(),
            &raw.by,
            raw.note.as_deref(),
        );
        if let Some(from) = self.from {
            from.verify(
                self.session,
                || format!("resolution {} (call `{}`)", raw.position, raw.call),
                &fields,
                raw.seal.as_deref(),
            )?;
        }
        self.to.seal(&fields)
    }

    /// Points the head at the latest checkpoint's new seal (the backend then seals it
    /// under the new key and writes it with its counts).
    pub fn point_head(&self, head: &mut HeadRow) {
        if let Some(seal) = self.new_checkpoints.get(&head.latest_version) {
            head.checkpoint_seal.clone_from(seal);
        }
    }
}

/// Counts the issued rows of a head written before heads counted them, from the
/// session's journal rows, each checked under `ring` first (the head itself checked with
/// [`HeadRow::check_any_format`] and the journal's completeness before): a status changed
/// behind the store's back is never counted.
pub fn count_issued(
    ring: &Keyring,
    head: &mut HeadRow,
    calls: &[RawCall],
) -> Result<(), StoreError> {
    let mut issued = 0i64;
    for raw in calls {
        raw.check(ring)?;
        issued += i64::from(raw.status == "issued");
    }
    head.issued_rows = Some(issued);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(byte: u8) -> Keyring {
        Keyring::none().bind_store_key(vec![byte; 32])
    }

    fn session() -> SessionId {
        SessionId::new("s-1")
    }

    /// A transcript of two messages and one checkpoint over it, sealed under `ring`.
    fn sealed(ring: &Keyring) -> (Vec<RawMessage>, CheckpointRow) {
        let s = session();
        let first = seal_message(ring, &s, 1, "\"hi\"", "").expect("seal");
        let second = seal_message(ring, &s, 2, "\"there\"", &first).expect("seal");
        let mut checkpoint = CheckpointRow {
            version: 0,
            last_seq: 2,
            message_count: 2,
            plan: "{}".to_owned(),
            budget: "{}".to_owned(),
            state: "null".to_owned(),
            app_version: "v1".to_owned(),
            seal: None,
        };
        checkpoint.seal = Some(checkpoint.sealed(&s, &second, "").seal(ring).expect("seal"));
        let messages = vec![
            RawMessage {
                seq: 1,
                text: "\"hi\"".to_owned(),
                seal: Some(first),
            },
            RawMessage {
                seq: 2,
                text: "\"there\"".to_owned(),
                seal: Some(second),
            },
        ];
        (messages, checkpoint)
    }

    #[test]
    fn the_reseal_walk_gives_the_seals_the_new_key_writes() {
        let (old, new) = (ring(1), ring(2));
        let s = session();
        let (messages, checkpoint) = sealed(&old);
        let mut walk = Reseal::new(Some(&old), &new, &s);
        let seals: Vec<String> = messages
            .iter()
            .map(|m| walk.message(m).expect("checks under the old key"))
            .collect();
        let resealed = walk
            .checkpoint(&checkpoint, || unreachable!("the message is there"))
            .expect("checks under the old key");
        // Exactly what a write under the new key would have sealed.
        let (expected_messages, expected_checkpoint) = sealed(&new);
        let expected: Vec<String> = expected_messages
            .into_iter()
            .filter_map(|m| m.seal)
            .collect();
        assert_eq!(seals, expected);
        assert_eq!(Some(resealed.clone()), expected_checkpoint.seal);
        let mut head = HeadRow {
            session: s.clone(),
            journal_rows: 0,
            latest_version: 0,
            resolutions: 0,
            issued_rows: Some(0),
            approvals: 0,
            checkpoint_seal: String::new(),
            head: None,
        };
        walk.point_head(&mut head);
        assert_eq!(head.checkpoint_seal, resealed);
    }

    #[test]
    fn the_reseal_walk_refuses_a_message_changed_under_the_old_key() {
        let (old, new) = (ring(1), ring(2));
        let s = session();
        let (mut messages, _) = sealed(&old);
        messages[1].text = "\"edited\"".to_owned();
        let mut walk = Reseal::new(Some(&old), &new, &s);
        walk.message(&messages[0]).expect("the first message holds");
        match walk.message(&messages[1]) {
            Err(StoreError::Tampered { what, .. }) => assert_eq!(what, "message 2"),
            other => panic!("expected Tampered for message 2, got {other:?}"),
        }
        // Without an old key (a store written before seals) the rows are sealed as found.
        let mut adopt = Reseal::new(None, &new, &s);
        adopt.message(&messages[0]).expect("sealed as found");
        adopt.message(&messages[1]).expect("sealed as found");
    }

    #[test]
    fn an_old_format_head_that_counts_approvals_is_tampered() {
        let r = ring(1);
        let mut head = HeadRow {
            session: session(),
            journal_rows: 0,
            latest_version: 0,
            resolutions: 0,
            issued_rows: None,
            approvals: 0,
            checkpoint_seal: String::new(),
            head: None,
        };
        head.seal(&r).expect("seal");
        head.check_any_format(&r)
            .expect("an old head holds in its own format");
        assert!(matches!(head.check(&r), Err(StoreError::Tampered { .. })));
        head.approvals = 1;
        match head.check_any_format(&r) {
            Err(StoreError::Tampered { what, detail, .. }) => {
                assert_eq!(what, "the session head");
                assert_eq!(detail, "it predates approvals but counts 1 approval events");
            }
            other => panic!("expected Tampered, got {other:?}"),
        }
    }

    /// An approval log of three rows, sealed at their positions, and a head counting them.
    fn approval_log(ring: &Keyring) -> (HeadRow, Vec<RawApproval>) {
        let s = session();
        let log: Vec<RawApproval> = ["requested", "approved", "issued"]
            .iter()
            .enumerate()
            .map(|(i, event)| {
                let mut raw = RawApproval {
                    call: "c-1".to_owned(),
                    position: i64::try_from(i + 1).expect("small"),
                    event: (*event).to_owned(),
                    actor: "ops".to_owned(),
                    note: None,
                    args_before: None,
                    args_after: None,
                    seal: None,
                };
                raw.seal(ring, &s).expect("seal");
                raw
            })
            .collect();
        let head = HeadRow {
            session: s,
            journal_rows: 1,
            latest_version: 0,
            resolutions: 0,
            issued_rows: Some(0),
            approvals: 3,
            checkpoint_seal: String::new(),
            head: None,
        };
        (head, log)
    }

    #[test]
    fn an_approval_log_deleted_moved_or_altered_is_tampered() {
        let r = ring(1);
        let (head, log) = approval_log(&r);
        check_approvals(&r, &head, &log).expect("the log as written holds");
        let tampered = |found: &[RawApproval]| match check_approvals(&r, &head, found) {
            Err(StoreError::Tampered { what, detail, .. }) => format!("{what}: {detail}"),
            other => panic!("expected Tampered, got {other:?}"),
        };
        // The newest row deleted: no gap, only the head's count says so.
        assert_eq!(
            tampered(&log[..2]),
            "the approval log: the session head records 3 approval events, the log holds 2"
        );
        // A middle row deleted: the next row's seal does not hold at its new position.
        let without_middle = [log[0].clone(), log[2].clone()];
        assert!(tampered(&without_middle).starts_with("approval event 3 (call `c-1`)"));
        // A decision rewritten: `denied` for `approved`.
        let mut altered = log.clone();
        altered[1].event = "denied".to_owned();
        assert!(tampered(&altered).starts_with("approval event 2 (call `c-1`)"));
        // A stored position edited while the row stays where it was sealed.
        let mut moved = log.clone();
        moved[2].position = 7;
        assert_eq!(
            tampered(&moved),
            "approval event 7 (call `c-1`): it is at position 3 of the log"
        );
        // Another key's seal.
        assert!(check_approvals(&ring(2), &head, &log).is_err());
    }
}
