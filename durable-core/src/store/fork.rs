//! What a fork does with its parent's effects: one rule, applied by every backend inside
//! the fork's transaction ([`fate`]) and shown to the operator before it happens
//! ([`ForkPlan`]).
//!
//! **A fork never repeats an effect of its parent.** A fork from version *v* re-runs the
//! turn the parent ran from *v* (the fork's step 0) and then runs turns of its own. The
//! parent's journal rows with a side effect (`idempotent_with_key`, `unsafe_on_replay`)
//! are copied into the fork's journal, re-sealed under the store's key, in the fork's
//! transaction:
//!
//! - rows of step *v* (the turn the fork re-runs) become the fork's step 0 with their
//!   identity otherwise unchanged ([`ForkFate::Inherited`]), so the journal's decision
//!   table does the rest: a recorded result comes back, an in-doubt call stays in doubt
//!   (verify hook, `ReplayUnsafe`, the session-wide barrier), and a re-run that asks for
//!   something else while one of them is unreplayed is refused as a divergence;
//! - rows of later steps, in-doubt rows of earlier steps and rows the parent itself
//!   carried from its own parent go to the fork's [`CARRIED_STEP`] (`-1`, a step the fork
//!   never runs, before its first; numbered by their position there, so rows of several
//!   steps never share an identity) ([`ForkFate::Carried`]): an in-doubt one bars every
//!   call with a side effect in the fork until it is resolved (in the fork), and a fresh
//!   call of the fork with the same tool and arguments as a carried effect is refused
//!   ([`DurableError::InheritedEffect`](crate::DurableError::InheritedEffect)), whatever
//!   step it is in;
//! - an operator may name calls to run again ([`ForkSession::rerun`], `durable fork
//!   --rerun <call>`): those are not copied, so the fork may run them again
//!   ([`ForkFate::Rerun`]); the decision is audited with the fork;
//! - everything else is left ([`ForkFate::Left`]): model replies (the fork asks the model
//!   anew: that is what a fork is for), `pure` calls (no effect; they run again), calls
//!   that only awaited or were denied approval (nothing ran), and settled calls of earlier
//!   steps (their results are in the transcript the fork starts from).
//!
//! The audit of a fork (who, from which session and version, every copied call with the
//! parent's call it came from, every rerun) is a row of `durable_migrations` for the new
//! session, its step map a JSON array of pairs: `["@fork", "<parent>@<version>"]`, then
//! `["<parent call>", "<fork call>"]` per copied call and `["<parent call>", "rerun"]`
//! per call the operator let run again.

use std::time::Duration;

use serde::Serialize;

use crate::error::StoreError;
use crate::ids::{CallId, SessionId};
use crate::replay::ReplayClass;
use crate::store::{CallKind, CallRecord, CallStatus};

/// The step of a fork's journal that holds the parent's effects the fork does not re-run
/// (see [`ForkFate::Carried`]). No turn ever runs in it.
pub const CARRIED_STEP: i64 = -1;

/// The first pair of a fork's audit step map: `("@fork", "<parent>@<version>")`.
pub const FORK_AUDIT_MARK: &str = "@fork";

/// The second element of an audit pair for a call the operator let the fork run again.
pub const FORK_AUDIT_RERUN: &str = "rerun";

/// A fork request ([`CheckpointStore::fork_session_with`](crate::store::CheckpointLog::fork_session_with)).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ForkSession {
    /// The session to fork.
    pub source: SessionId,
    /// Its checkpoint version the fork starts from (the fork's version 0).
    pub version: i64,
    /// The new session's id.
    pub new_id: SessionId,
    /// The worker the new session is leased to.
    pub owner: String,
    /// The lease's time to live.
    pub ttl: Duration,
    /// Calls of the source an operator lets the fork run again: not copied, audited.
    pub rerun: Vec<CallId>,
    /// Who forks (the audit row).
    pub by: String,
}

impl ForkSession {
    /// A fork of `source` at `version` into `new_id`, leased to `owner`, that inherits
    /// every effect of the source (no rerun); the audit names `owner` as who forked.
    pub fn new(
        source: SessionId,
        version: i64,
        new_id: SessionId,
        owner: impl Into<String>,
        ttl: Duration,
    ) -> Self {
        let owner = owner.into();
        Self {
            source,
            version,
            new_id,
            by: owner.clone(),
            owner,
            ttl,
            rerun: Vec::new(),
        }
    }

    /// Lets the fork run these calls of the source again (not copied, audited).
    #[must_use]
    pub fn rerun(mut self, calls: impl IntoIterator<Item = CallId>) -> Self {
        self.rerun.extend(calls);
        self
    }

    /// Names who forks in the audit row.
    #[must_use]
    pub fn by(mut self, by: impl Into<String>) -> Self {
        self.by = by.into();
        self
    }
}

/// What a fork does with one journal row of its parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ForkFate {
    /// Copied into the step the fork re-runs (step 0): replayed by identity.
    Inherited,
    /// Copied into [`CARRIED_STEP`]: never run again by the fork (an in-doubt one bars
    /// the fork's effects until resolved).
    Carried,
    /// Not copied because an operator lets the fork run it again (audited).
    Rerun,
    /// Not copied: it has no effect the fork could repeat.
    Left,
}

/// What a fork from `version` does with a row of the source: the one rule every backend
/// applies (see [`ForkFate`]). `rerun`: an operator named the row to run again.
pub fn fate(
    kind: CallKind,
    class: ReplayClass,
    status: CallStatus,
    step: i64,
    version: i64,
    rerun: bool,
) -> ForkFate {
    if kind != CallKind::Tool || class == ReplayClass::Pure {
        return ForkFate::Left;
    }
    if matches!(
        status,
        CallStatus::Requested | CallStatus::Approved | CallStatus::Denied
    ) {
        return ForkFate::Left;
    }
    let copied = if step == version {
        ForkFate::Inherited
    } else if step > version || step == CARRIED_STEP || status == CallStatus::Issued {
        ForkFate::Carried
    } else {
        return ForkFate::Left;
    };
    if rerun { ForkFate::Rerun } else { copied }
}

/// The step a copied row takes in the fork.
pub fn fork_step(fate: ForkFate) -> Option<i64> {
    match fate {
        ForkFate::Inherited => Some(0),
        ForkFate::Carried => Some(CARRIED_STEP),
        ForkFate::Rerun | ForkFate::Left => None,
    }
}

/// One row of the parent a fork copies or lets run again, with what will happen to it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct ForkEntry {
    /// The parent's call.
    pub call: CallId,
    /// Its tool.
    pub tool: String,
    /// Its replay class.
    pub class: ReplayClass,
    /// Its status in the parent.
    pub status: CallStatus,
    /// Its step in the parent.
    pub step: i64,
    /// What the fork does with it.
    pub fate: ForkFate,
    /// What that means for the effect, in words.
    pub effect: String,
}

/// What a fork will do with its parent's effects, computed before it is made
/// ([`Operator::fork_plan`](crate::Operator::fork_plan), `durable fork --dry-run`).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct ForkPlan {
    /// The session forked.
    pub source: SessionId,
    /// The version forked.
    pub version: i64,
    /// Every row copied or let run again, in the parent's journal order.
    pub entries: Vec<ForkEntry>,
}

impl ForkPlan {
    /// The plan for `rows` (the source's journal, in order) forked at `version`, with
    /// `rerun` let run again. Unknown ids in `rerun` are returned as the error.
    pub fn new(
        source: SessionId,
        version: i64,
        rows: &[CallRecord],
        rerun: &[CallId],
    ) -> Result<Self, Vec<CallId>> {
        let mut entries = Vec::new();
        let mut used = Vec::new();
        for row in rows {
            let asked = rerun.contains(&row.id);
            let fate = fate(
                row.kind,
                row.class,
                row.status,
                row.identity.step,
                version,
                asked,
            );
            if fate == ForkFate::Left {
                continue;
            }
            if asked {
                used.push(row.id.clone());
            }
            entries.push(ForkEntry {
                call: row.id.clone(),
                tool: row.identity.tool.clone(),
                class: row.class,
                status: row.status,
                step: row.identity.step,
                fate,
                effect: effect(fate, row.status).to_owned(),
            });
        }
        let unknown: Vec<CallId> = rerun
            .iter()
            .filter(|c| !used.contains(c))
            .cloned()
            .collect();
        if !unknown.is_empty() {
            return Err(unknown);
        }
        Ok(Self {
            source,
            version,
            entries,
        })
    }

    /// Whether the fork may run any effect of the parent again (an operator's rerun).
    pub fn reruns(&self) -> bool {
        self.entries.iter().any(|e| e.fate == ForkFate::Rerun)
    }
}

/// One row a fork copies: the source row (its id and the seal it was checked under) and
/// where it goes in the fork.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ForkCopy {
    /// The source's call.
    pub from: CallId,
    /// Its seal when it was read and checked: the copy is made only if it still holds it.
    pub mac: Option<String>,
    /// The fork's call (a new id).
    pub to: CallId,
    /// Its step in the fork ([`CARRIED_STEP`] or 0).
    pub step: i64,
    /// Its position in the fork's journal, from 1.
    pub seq: i64,
    /// Its ordinal in the fork: `None` keeps the source's (an inherited row keeps its
    /// identity but the step); a carried row gets its position among the carried rows,
    /// since rows of several source steps share [`CARRIED_STEP`] and could otherwise
    /// share an identity.
    pub ordinal: Option<i64>,
}

/// The rows a fork of `fork.source` at `fork.version` copies, from `rows` (the source's
/// whole journal, in order, checked): carried rows first, then inherited ones, each in
/// the source's order, numbered from 1. A `fork.rerun` call that is not a row the fork
/// would copy is [`StoreError::CallNotFound`]: naming a call the fork would not repeat
/// anyway, or a mistyped one, is refused rather than audited as a rerun.
pub fn copies(fork: &ForkSession, rows: &[CallRecord]) -> Result<Vec<ForkCopy>, StoreError> {
    let plan = ForkPlan::new(fork.source.clone(), fork.version, rows, &fork.rerun)
        .map_err(|unknown| StoreError::CallNotFound(unknown[0].clone()))?;
    let mut out = Vec::new();
    for wanted in [ForkFate::Carried, ForkFate::Inherited] {
        for entry in plan.entries.iter().filter(|e| e.fate == wanted) {
            let row = rows
                .iter()
                .find(|r| r.id == entry.call)
                .ok_or_else(|| StoreError::CallNotFound(entry.call.clone()))?;
            let at = i64::try_from(out.len()).unwrap_or(i64::MAX);
            out.push(ForkCopy {
                from: row.id.clone(),
                mac: row.mac.clone(),
                to: CallId::random(),
                step: fork_step(wanted).unwrap_or(CARRIED_STEP),
                seq: at + 1,
                ordinal: (wanted == ForkFate::Carried).then_some(at),
            });
        }
    }
    Ok(out)
}

/// What a fate means for a row of this status, in words for the operator.
pub fn effect(fate: ForkFate, status: CallStatus) -> &'static str {
    match (fate, status) {
        (ForkFate::Rerun, _) => "MAY RUN AGAIN: an operator lets the fork run it again (audited)",
        (ForkFate::Left, _) => "left: nothing the fork could repeat",
        (ForkFate::Inherited, CallStatus::Issued) => {
            "stays in doubt: the re-run asks its verify hook or is refused until it is resolved in the fork; no effect runs beside it"
        }
        (ForkFate::Inherited, CallStatus::NotHappened) => {
            "may run again: an operator resolved it as not happened"
        }
        (ForkFate::Inherited, _) => "not run again: the re-run turn gets its recorded outcome back",
        (ForkFate::Carried, CallStatus::Issued) => {
            "stays in doubt: no effect runs in the fork until it is resolved in the fork"
        }
        (ForkFate::Carried, CallStatus::NotHappened) => {
            "may run again: an operator resolved it as not happened"
        }
        (ForkFate::Carried, _) => {
            "not run again: a call of the fork with the same tool and arguments is refused"
        }
    }
}

/// The audit step map of a fork: `("@fork", "<source>@<version>")`, then
/// `(parent call, fork call)` per copied row and `(parent call, "rerun")` per rerun.
pub fn audit_map(
    source: &SessionId,
    version: i64,
    copied: &[(CallId, CallId)],
    rerun: &[CallId],
) -> Vec<(String, String)> {
    let mut map = vec![(FORK_AUDIT_MARK.to_owned(), format!("{source}@{version}"))];
    map.extend(
        copied
            .iter()
            .map(|(from, to)| (from.to_string(), to.to_string())),
    );
    map.extend(
        rerun
            .iter()
            .map(|c| (c.to_string(), FORK_AUDIT_RERUN.to_owned())),
    );
    map
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [CallStatus; 8] = [
        CallStatus::Issued,
        CallStatus::Completed,
        CallStatus::Failed,
        CallStatus::Resolved,
        CallStatus::NotHappened,
        CallStatus::Requested,
        CallStatus::Approved,
        CallStatus::Denied,
    ];

    #[test]
    fn every_effect_of_the_fork_point_or_later_is_copied_unless_rerun() {
        for class in [ReplayClass::IdempotentWithKey, ReplayClass::UnsafeOnReplay] {
            for status in ALL {
                let nothing_ran = matches!(
                    status,
                    CallStatus::Requested | CallStatus::Approved | CallStatus::Denied
                );
                for (step, expected) in [
                    (3, ForkFate::Inherited),
                    (4, ForkFate::Carried),
                    (CARRIED_STEP, ForkFate::Carried),
                ] {
                    let want = if nothing_ran {
                        ForkFate::Left
                    } else {
                        expected
                    };
                    assert_eq!(
                        fate(CallKind::Tool, class, status, step, 3, false),
                        want,
                        "{class:?} {status:?} step {step}"
                    );
                    let want = if nothing_ran {
                        ForkFate::Left
                    } else {
                        ForkFate::Rerun
                    };
                    assert_eq!(fate(CallKind::Tool, class, status, step, 3, true), want);
                }
                let before = fate(CallKind::Tool, class, status, 2, 3, false);
                let want = if status == CallStatus::Issued {
                    ForkFate::Carried
                } else {
                    ForkFate::Left
                };
                assert_eq!(before, want, "{class:?} {status:?} before the fork point");
            }
        }
        for status in ALL {
            assert_eq!(
                fate(CallKind::Tool, ReplayClass::Pure, status, 3, 3, false),
                ForkFate::Left
            );
            assert_eq!(
                fate(CallKind::Model, ReplayClass::Pure, status, 3, 3, false),
                ForkFate::Left
            );
        }
    }
}
