//! What the store holds: plain maps and vectors, the same rows a SQL backend keeps in
//! its tables, behind the store's one lock.

use std::collections::{BTreeMap, HashMap};

use durable_core::store::{CallRecord, ErrorRecord, SessionRecord};
use durable_core::{CallId, SessionId};

/// Every session, the index of call ids and the queue limits.
#[derive(Debug, Default)]
pub(crate) struct State {
    /// Sessions by id.
    pub(crate) sessions: BTreeMap<SessionId, Session>,
    /// The session of every journal row (ids are unique across sessions).
    pub(crate) calls: HashMap<CallId, SessionId>,
    /// Fleet-wide limits by queue name.
    pub(crate) queues: BTreeMap<String, u32>,
    /// Sessions created so far: the tie-breaker of "oldest first".
    pub(crate) created: u64,
    /// Fleet-wide limits by tenant.
    pub(crate) tenants: BTreeMap<String, u32>,
    /// Rate limits by name.
    pub(crate) limits: BTreeMap<String, crate::limiter::LimitRow>,
    /// Every signal, in the order sent (ids increase).
    pub(crate) signals: Vec<durable_core::store::SignalRecord>,
    /// The last signal id handed out.
    pub(crate) signal_seq: i64,
}

/// One session: its row, its head and its logs.
#[derive(Debug)]
pub(crate) struct Session {
    /// The session row (status, lease, fencing token, …).
    pub(crate) record: SessionRecord,
    /// Creation order, for claims that take the oldest session first.
    pub(crate) order: u64,
    /// Claim rank (`created_at − priority × aging`), once a priority was set; claims
    /// take the lowest first, a session without one ranking at its `created_at`.
    pub(crate) rank: Option<i64>,
    /// The tenant it counts against, if any.
    pub(crate) tenant: Option<String>,
    /// Whether the current lease's holder ran the session (`mark_running`).
    pub(crate) ran: bool,
    /// The session head: counts of its logs, sealed.
    pub(crate) head: Head,
    /// Checkpoints, by version (0, 1, …).
    pub(crate) checkpoints: Vec<CheckpointRow>,
    /// The message log, by position (1, 2, …).
    pub(crate) messages: Vec<MessageRow>,
    /// The journal, by position (1, 2, …).
    pub(crate) journal: Vec<CallRow>,
    /// Operator resolutions, by position.
    pub(crate) resolutions: Vec<AuditRow>,
    /// The approval log, by position.
    pub(crate) approvals: Vec<AuditRow>,
    /// Retry history (not sealed).
    pub(crate) errors: Vec<ErrorRecord>,
    /// App-version migrations, forks and cancellations: `(by, step map)` (not sealed).
    pub(crate) migrations: Vec<(String, Vec<(String, String)>)>,
    /// Operators' raises of the budget's ceilings (audit rows, not sealed).
    pub(crate) raises: Vec<durable_core::store::LimitRaise>,
}

/// The session head's counts and seal (the latest version and checkpoint seal are read
/// from the session row and its checkpoints when the seal is computed).
#[derive(Debug, Clone, Default)]
pub(crate) struct Head {
    /// Journal rows.
    pub(crate) journal_rows: i64,
    /// Resolutions recorded.
    pub(crate) resolutions: i64,
    /// Journal rows whose status is `issued`.
    pub(crate) issued_rows: i64,
    /// Rows of the approval log.
    pub(crate) approvals: i64,
    /// The seal over all of it.
    pub(crate) seal: Option<String>,
}

/// A checkpoint as stored: snapshots as JSON text (what the seal covers).
#[derive(Debug, Clone)]
pub(crate) struct CheckpointRow {
    pub(crate) version: i64,
    pub(crate) last_seq: i64,
    pub(crate) message_count: i64,
    pub(crate) plan: String,
    pub(crate) budget: String,
    pub(crate) state: String,
    pub(crate) app_version: String,
    pub(crate) created_at: i64,
    pub(crate) seal: Option<String>,
}

/// A message of the log: its text byte for byte, and its seal chained to the previous.
#[derive(Debug, Clone)]
pub(crate) struct MessageRow {
    pub(crate) seq: i64,
    pub(crate) text: String,
    pub(crate) seal: Option<String>,
}

/// A journal row: the record (its seal in `mac`), its position, and scheduling state
/// outside the seal.
#[derive(Debug, Clone)]
pub(crate) struct CallRow {
    pub(crate) record: CallRecord,
    pub(crate) seq: i64,
    /// A resume refused it and only an operator can settle it (`mark_operator_needed`).
    pub(crate) operator_needed: bool,
}

/// A sealed audit row of a resolution or an approval event, at its position.
#[derive(Debug, Clone)]
pub(crate) struct AuditRow {
    pub(crate) position: i64,
    pub(crate) call: CallId,
    /// `happened` / `did_not_happen`, or the approval event's name.
    pub(crate) event: String,
    /// The resolver, or the approval event's actor.
    pub(crate) by: String,
    pub(crate) note: Option<String>,
    /// A resolution's result; an approval's edited arguments (before, after).
    pub(crate) result: Option<String>,
    pub(crate) args_before: Option<String>,
    pub(crate) at: i64,
    pub(crate) seal: Option<String>,
}

impl State {
    /// The session, or [`StoreError::SessionNotFound`](durable_core::StoreError).
    pub(crate) fn session(&self, id: &SessionId) -> Result<&Session, durable_core::StoreError> {
        self.sessions
            .get(id)
            .ok_or_else(|| durable_core::StoreError::SessionNotFound(id.clone()))
    }

    /// The session, mutably.
    pub(crate) fn session_mut(
        &mut self,
        id: &SessionId,
    ) -> Result<&mut Session, durable_core::StoreError> {
        self.sessions
            .get_mut(id)
            .ok_or_else(|| durable_core::StoreError::SessionNotFound(id.clone()))
    }

    /// The session holding journal row `call`, or `CallNotFound`.
    pub(crate) fn session_of(&self, call: &CallId) -> Result<SessionId, durable_core::StoreError> {
        self.calls
            .get(call)
            .filter(|s| {
                self.sessions
                    .get(*s)
                    .is_some_and(|s| s.journal.iter().any(|r| r.record.id == *call))
            })
            .cloned()
            .ok_or_else(|| durable_core::StoreError::CallNotFound(call.clone()))
    }
}

impl Session {
    /// The index of journal row `call` in this session's journal.
    pub(crate) fn row_index(&self, call: &CallId) -> Result<usize, durable_core::StoreError> {
        self.journal
            .iter()
            .position(|r| r.record.id == *call)
            .ok_or_else(|| durable_core::StoreError::CallNotFound(call.clone()))
    }

    /// The checkpoint of `version`, if stored.
    pub(crate) fn checkpoint(&self, version: i64) -> Option<&CheckpointRow> {
        self.checkpoints.iter().find(|c| c.version == version)
    }

    /// The message at position `seq`, if stored.
    pub(crate) fn message(&self, seq: i64) -> Option<&MessageRow> {
        usize::try_from(seq - 1)
            .ok()
            .and_then(|i| self.messages.get(i))
            .filter(|m| m.seq == seq)
            .or_else(|| self.messages.iter().find(|m| m.seq == seq))
    }

    /// Whether any journal row is `requested`.
    pub(crate) fn has_requested(&self) -> bool {
        self.journal
            .iter()
            .any(|r| r.record.status == durable_core::store::CallStatus::Requested)
    }
}
