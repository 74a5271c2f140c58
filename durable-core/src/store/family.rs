//! Child sessions, waiting on them, and cancellation: the store's side of sessions that
//! work together.
//!
//! A child session is an ordinary session with a parent link
//! ([`SessionRecord::parent`](super::SessionRecord::parent)), created by
//! [`create_child`](super::SessionStore::create_child) under an id derived from the
//! parent's call identity ([`child_id`]), so a re-run parent finds the child it already
//! started. A parent that waits for its children gives its lease up
//! ([`wait`](super::LeaseStore::wait)) and no claim takes it until one of them ends or
//! the wait's deadline passes. Cancellation ([`cancel_session`](super::SessionStore::cancel_session))
//! ends a session that no worker runs at once and asks a running one to stop.

use serde::{Deserialize, Serialize};

use super::{CallIdentity, SessionRecord};
use crate::error::StoreError;
use crate::ids::{MAX_ID_BYTES, SessionId};

/// The tool name under which a child's start is journaled in its parent.
pub const CHILD_SLOT: &str = "@child";

/// The tool name under which a child's outcome, once collected, is journaled in its
/// parent.
pub const COLLECT_SLOT: &str = "@child.outcome";

/// The `waiting_for` value of a session waiting for its children.
pub const WAITING_FOR_CHILDREN: &str = "children";

/// The `waiting_for` value of a session released until a time, with nothing to end the
/// wait early ([`WaitFor::Deadline`]).
pub const WAITING_FOR_DEADLINE: &str = "deadline";

/// The id of the child started by the journal row of `identity` (a row of
/// [`CHILD_SLOT`]): `<parent>.child-<hash>` where the hash covers the whole identity, or
/// `child-<hash>` when the parent's id is too long for that. The same identity always
/// gives the same id, which is how a re-run parent finds the child it started.
///
/// ```
/// use durable_core::store::{CallIdentity, child_id};
/// use durable_core::SessionId;
///
/// let identity = CallIdentity {
///     session: SessionId::new("order-7"),
///     step: 3,
///     tool: "@child".into(),
///     input_hash: "v1:ab".into(),
///     ordinal: 0,
/// };
/// let id = child_id(&identity);
/// assert!(id.as_str().starts_with("order-7.child-"));
/// assert_eq!(id, child_id(&identity));
/// ```
pub fn child_id(identity: &CallIdentity) -> SessionId {
    let hex = super::signal::identity_hex(identity);
    let nested = format!("{}.child-{hex}", identity.session);
    if nested.len() <= MAX_ID_BYTES {
        SessionId::new(nested)
    } else {
        SessionId::new(format!("child-{hex}"))
    }
}

/// A child of a session, as [`children`](super::SessionStore::children) lists it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ChildRecord {
    /// The child's session row.
    pub session: SessionRecord,
    /// Whether one of its in-doubt calls waits for an operator (a resume refused it as
    /// replay-unsafe): the child cannot go on until an operator settles it.
    pub operator_needed: bool,
}

impl ChildRecord {
    /// A child row (for backends).
    pub fn new(session: SessionRecord, operator_needed: bool) -> Self {
        ChildRecord {
            session,
            operator_needed,
        }
    }
}

/// What a session waits for while no worker holds it
/// ([`wait`](super::LeaseStore::wait)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum WaitFor {
    /// Any of these children (of the waiting session) to end, be parked or need an
    /// operator.
    Children(Vec<SessionId>),
    /// Nothing but the wait's end: the session is released until then (a call's turn
    /// under a rate limit, [`Session::release_until`](crate::Session::release_until)).
    Deadline,
    /// A signal of this name sent to the waiting session
    /// ([`send_signal`](super::SignalStore::send_signal)).
    Signal(String),
}

/// A wait: what for, and until when at the latest.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Wait {
    /// What ends the wait early.
    pub wait_for: WaitFor,
    /// When the wait ends anyway (ms since the epoch, database clock): the safety net
    /// under the wake-up, after which a worker takes the session to look again.
    pub until: i64,
}

impl Wait {
    /// A wait for any of `children` to end, until `until` at the latest.
    pub fn children(children: Vec<SessionId>, until: i64) -> Self {
        Wait {
            wait_for: WaitFor::Children(children),
            until,
        }
    }

    /// A wait for a signal named `name`, until `until` at the latest.
    pub fn signal(name: impl Into<String>, until: i64) -> Self {
        Wait {
            wait_for: WaitFor::Signal(name.into()),
            until,
        }
    }

    /// A wait that only `until` ends.
    pub fn until(until: i64) -> Self {
        Wait {
            wait_for: WaitFor::Deadline,
            until,
        }
    }
}

/// Whether a child in this state ends a parent's wait: it ended (completed, failed,
/// cancelled), was parked, or waits for an operator. For backends.
pub fn wakes_parent(child: &SessionRecord, operator_needed: bool) -> bool {
    child.status.is_terminal() || child.status == super::SessionStatus::Parked || operator_needed
}

/// A request to cancel a session ([`cancel_session`](super::SessionStore::cancel_session)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CancelSession {
    /// The session.
    pub session: SessionId,
    /// Who cancels (an operator's name, or a parent session's id).
    pub by: String,
    /// Why.
    pub reason: String,
    /// Whether its children (and theirs) are cancelled too.
    pub cascade: bool,
}

impl CancelSession {
    /// Cancels `session` and its children, recursively.
    pub fn new(session: SessionId, by: impl Into<String>, reason: impl Into<String>) -> Self {
        CancelSession {
            session,
            by: by.into(),
            reason: reason.into(),
            cascade: true,
        }
    }

    /// Leaves the children running.
    pub fn without_children(mut self) -> Self {
        self.cascade = false;
        self
    }

    /// Checks `by` ([`validate_id`](crate::validate::validate_id)) and the reason
    /// ([`validate_text`](crate::validate::validate_text)). Every backend calls this before
    /// touching the database.
    pub fn validate(&self) -> Result<(), StoreError> {
        crate::validate::validate_id("cancelled by", &self.by)?;
        crate::validate::validate_text("cancel reason", &self.reason)
    }

    /// The status reason a cancelled session records.
    pub fn status_reason(&self) -> String {
        cancel_reason(&self.by, &self.reason)
    }
}

/// The status reason of a session cancelled by `by` for `reason`:
/// `cancelled by <by>: <reason>`.
pub fn cancel_reason(by: &str, reason: &str) -> String {
    format!("cancelled by {by}: {reason}")
}

/// A cancellation asked of a running session, recorded on its row until the worker
/// holding it stops ([`SessionRecord::cancel_requested`](super::SessionRecord::cancel_requested)).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CancelRequest {
    /// Who asked.
    pub by: String,
    /// Why.
    pub reason: String,
    /// When (ms, database clock).
    pub at: i64,
}

/// What [`cancel_session`](super::SessionStore::cancel_session) did to one session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum CancelEffect {
    /// No worker held it: it is `cancelled` now.
    Cancelled,
    /// A worker holds it: it was asked to stop, and ends as `cancelled` at its next safe
    /// point (or when the next worker takes it).
    Requested,
    /// It had already ended: left as it was.
    AlreadyEnded,
}

/// One session [`cancel_session`](super::SessionStore::cancel_session) reached.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CancelledSession {
    /// The session.
    pub session: SessionId,
    /// What happened to it.
    pub effect: CancelEffect,
}
