//! The store's integrity log (`durable_integrity_log`): every adoption, re-keying and
//! restored key row, sealed as a whole.

use super::{Fields, Keyring};
use crate::error::StoreError;
use crate::ids::SessionId;

/// One row of a store's integrity log (`durable_integrity_log`): a key event of the
/// whole store (`adopt`, `rekey`, `restore`, `seal_log`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct IntegrityEvent {
    /// Position (the table's row id).
    pub id: i64,
    /// What happened.
    pub event: String,
    /// The key the rows were sealed with before, if any.
    pub from_key: Option<String>,
    /// The key they are sealed with after.
    pub to_key: String,
    /// Rows checked or sealed.
    pub rows: i64,
    /// What it means.
    pub detail: String,
    /// When (the store's clock, milliseconds since the Unix epoch).
    pub created_at: i64,
}

impl IntegrityEvent {
    /// An event as read from its table.
    pub fn new(
        id: i64,
        event: String,
        from_key: Option<String>,
        to_key: String,
        rows: i64,
        detail: String,
        created_at: i64,
    ) -> Self {
        IntegrityEvent {
            id,
            event,
            from_key,
            to_key,
            rows,
            detail,
            created_at,
        }
    }
}

/// The `durable_meta` row that holds the integrity log's seal.
pub const INTEGRITY_LOG_SEAL: &str = "integrity_log";

/// The sealed bytes of a store's whole integrity log, in order. One seal (kept in
/// `durable_meta` as [`INTEGRITY_LOG_SEAL`], re-made by every writer that appends an
/// event) covers every row and their number, so an edited, inserted, reordered or deleted
/// row (the newest one too) breaks it.
pub fn integrity_log_fields(events: &[IntegrityEvent]) -> Fields {
    let mut fields =
        Fields::new("integrity log").int(i64::try_from(events.len()).unwrap_or(i64::MAX));
    for e in events {
        fields = fields
            .int(e.id)
            .str(&e.event)
            .opt(e.from_key.as_deref())
            .str(&e.to_key)
            .int(e.rows)
            .str(&e.detail)
            .int(e.created_at);
    }
    fields
}

/// A store's integrity log as read back, with the check of its seal.
#[derive(Debug, Clone, serde::Serialize)]
#[non_exhaustive]
pub struct IntegrityLog {
    /// The events, oldest first.
    pub events: Vec<IntegrityEvent>,
    /// Why the log's seal does not hold (`None`: it holds, or the log is empty).
    pub problem: Option<String>,
}

impl IntegrityLog {
    /// Checks `events` against the log's `seal` under `ring`.
    pub fn check(ring: &Keyring, events: Vec<IntegrityEvent>, seal: Option<&str>) -> Self {
        let problem = match seal {
            None if events.is_empty() => None,
            None => Some(format!(
                "the log holds {} event(s) but no seal (the `{INTEGRITY_LOG_SEAL}` row of \
                 `durable_meta` is missing): it was deleted, or the store was last written \
                 by a release that did not seal its log (a writer seals it once, as \
                 found, audited as `seal_log`)",
                events.len()
            )),
            Some(seal) => ring
                .check(&integrity_log_fields(&events), Some(seal))
                .err()
                .map(|broken| {
                    format!(
                        "{broken}: an event was edited, added, reordered or deleted outside durable"
                    )
                }),
        };
        IntegrityLog { events, problem }
    }

    /// Whether the log's seal holds.
    pub fn is_ok(&self) -> bool {
        self.problem.is_none()
    }

    /// The error a writer that must extend the log returns when it does not hold.
    pub fn refused(&self) -> Option<StoreError> {
        self.problem.as_ref().map(|detail| StoreError::Tampered {
            session: SessionId::new("(integrity log)"),
            what: "the store's integrity log (`durable_integrity_log`)".to_owned(),
            detail: detail.clone(),
        })
    }
}
