//! The replay protocol as data: what a tool call does, given what the journal holds for
//! its identity and what the call site brings.
//!
//! Everything here is pure: no IO, no lock, no clock. The journal's driver (`call`)
//! gathers the [`Facts`] (one read of the step's rows, the call site's arguments and
//! hooks), applies the [`Action`] that [`decide`] returns (it writes, runs the body or
//! the verify hook), and feeds what came back into the next decision: the hook's answer
//! into [`after_verify`], a row another holder of the lease inserted first into
//! [`after_insert_race`], an approved row that changed before it could be issued into
//! [`after_approved_issue_refused`]. The guards that need the store (the session-wide barrier, the
//! divergence check, the carried-effect check, the durability check) are named by the
//! action and run by the driver, in that order.
//!
//! ARCHITECTURE.md's decision table is generated from these functions ([`table`]); a
//! test fails when the two disagree, and another when a transition appears that no
//! hand-written case covers.

use crate::event::Outcome;
use crate::replay::ReplayClass;
use crate::store::CallStatus;

/// What the decision reads: finite, so every input can be enumerated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Facts {
    /// The class the running code declares (`ToolSpec::class`), not the row's.
    pub(crate) class: ReplayClass,
    /// The status of the row that holds the call's identity, as the store holds it now
    /// (a row without an outcome is re-read first); `None` when there is none.
    pub(crate) held: Option<CallStatus>,
    /// The row was issued under another argument schema (its fingerprint is recorded and
    /// differs from the tool's).
    pub(crate) schema_changed: bool,
    /// A secret argument holds its masked form: this process does not hold its value.
    pub(crate) withheld: bool,
    /// The row holds an idempotency key.
    pub(crate) recorded_key: bool,
    /// The call site or the approval policy asks a person first.
    pub(crate) approval_asked: bool,
    /// A person approved the row with edited arguments and the call site refused them
    /// (or takes no edits).
    pub(crate) edits_refused: bool,
}

/// What the driver does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Action {
    /// The row holds an outcome (or a denial): it is returned, whatever the class;
    /// nothing runs.
    Replay,
    /// No row, and a person must decide first: journaled `requested`; nothing runs.
    RequestApproval,
    /// The row waits for a person's decision: `AwaitingApproval`; nothing runs.
    AwaitApproval,
    /// No row, `pure`: runs, and its row and outcome are written in one commit.
    RunPure,
    /// No row, a side effect: the barrier, the divergence check, the carried-effect check
    /// and the durability check; then *issued* is committed, the body runs and its outcome
    /// is recorded.
    IssueAndRun,
    /// In doubt `unsafe_on_replay`: the verify hook is asked ([`after_verify`]).
    Verify,
    /// The verify hook found the effect: its result is recorded; nothing runs.
    RecordVerified,
    /// In doubt: re-executed on the same row (attempt + 1, a new fence), reported as
    /// `outcome`; behind the barrier (and the durability check) when `guarded`.
    ReRun { outcome: Outcome, guarded: bool },
    /// Approved by a person: runs once; behind the barrier and the carried-effect check
    /// when `guarded`.
    RunApproved { guarded: bool },
    /// Refused: nothing runs, and the ordinal is handed back, so the same call sent again
    /// maps onto the same row.
    Refuse(Refusal),
    /// An approved call that cannot run as approved: refused as `ApprovedCallRefused`
    /// with this reason; the row stays approved.
    RefuseApproved(Refusal),
}

/// Why a call is refused; each maps to one error (`call::refusal`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// `SchemaChanged`: the row was issued under another argument schema.
    SchemaChanged,
    /// `SecretUnavailable`: running would need a secret's value this process lacks.
    SecretUnavailable,
    /// `ReplayUnsafe`: in doubt `unsafe_on_replay` with a secret withheld, so neither the
    /// verify hook nor a re-execution can run.
    SecretWithheld,
    /// `InvalidEdit`: the approval's edited arguments were refused by the call site.
    EditsRefused,
    /// `ReplayUnsafe`: in doubt `idempotent_with_key` with no recorded key to re-run with.
    NoRecordedKey,
    /// `ReplayUnsafe`: the verify hook could not tell (or there is none).
    NotVerified,
    /// `ReplayUnsafe`: another holder of the lease issued the same call first and its
    /// outcome is not recorded.
    InFlight,
}

impl Refusal {
    /// Whether only an operator can settle the refused row: no later resume, on this
    /// worker or another, would decide otherwise (the hook already answered, the key or
    /// the secret is gone for good). The row is marked, and pools stop handing the
    /// session out until it is resolved.
    pub(crate) const fn needs_operator(self) -> bool {
        matches!(
            self,
            Refusal::SecretWithheld | Refusal::NoRecordedKey | Refusal::NotVerified
        )
    }
}

/// What the verify hook answered (`Verification`, without its value).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Answer {
    Happened,
    DidNotHappen,
    Unknown,
}

/// The decision table.
pub(crate) fn decide(facts: Facts) -> Action {
    use CallStatus::*;
    let side_effect = facts.class != ReplayClass::Pure;
    let Some(status) = facts.held else {
        return if facts.withheld {
            Action::Refuse(Refusal::SecretUnavailable)
        } else if facts.approval_asked {
            Action::RequestApproval
        } else if side_effect {
            Action::IssueAndRun
        } else {
            Action::RunPure
        };
    };
    match status {
        Completed | Failed | Resolved | Denied => Action::Replay,
        Requested => Action::AwaitApproval,
        Approved => {
            if facts.schema_changed {
                Action::RefuseApproved(Refusal::SchemaChanged)
            } else if facts.withheld {
                Action::RefuseApproved(Refusal::SecretUnavailable)
            } else if facts.edits_refused {
                Action::RefuseApproved(Refusal::EditsRefused)
            } else {
                Action::RunApproved {
                    guarded: side_effect,
                }
            }
        }
        Issued | NotHappened => {
            if facts.schema_changed {
                return Action::Refuse(Refusal::SchemaChanged);
            }
            if facts.withheld {
                // Settling it would run the tool (or its verify hook) without the value.
                return Action::Refuse(
                    if facts.class == ReplayClass::UnsafeOnReplay && status == Issued {
                        Refusal::SecretWithheld
                    } else {
                        Refusal::SecretUnavailable
                    },
                );
            }
            if facts.edits_refused {
                return Action::Refuse(Refusal::EditsRefused);
            }
            let rerun = |outcome| Action::ReRun {
                outcome,
                guarded: side_effect,
            };
            match (status, facts.class) {
                (NotHappened, _) | (_, ReplayClass::Pure) => rerun(Outcome::ReExecuted),
                // Issued before the tool became keyed: no key the upstream could have
                // deduplicated on, so a re-run could repeat the effect.
                (_, ReplayClass::IdempotentWithKey) if !facts.recorded_key => {
                    Action::Refuse(Refusal::NoRecordedKey)
                }
                (_, ReplayClass::IdempotentWithKey) => rerun(Outcome::ReExecutedWithKey),
                (_, ReplayClass::UnsafeOnReplay) => Action::Verify,
            }
        }
    }
}

/// After [`Action::Verify`]: what the hook's answer makes of the in-doubt call.
pub(crate) fn after_verify(answer: Answer) -> Action {
    match answer {
        Answer::Happened => Action::RecordVerified,
        Answer::DidNotHappen => Action::ReRun {
            outcome: Outcome::VerifiedNotHappened,
            guarded: true,
        },
        Answer::Unknown => Action::Refuse(Refusal::NotVerified),
    }
}

/// After an insert (*issued* or `requested`) found a row already there: another holder
/// of the same lease raced this one. Its outcome is returned if it has one; a request
/// that meets a request goes by it; anything else is refused rather than run twice.
pub(crate) fn after_insert_race(found: CallStatus, requesting: bool) -> Action {
    if found.has_outcome() {
        Action::Replay
    } else if requesting && found == CallStatus::Requested {
        Action::AwaitApproval
    } else {
        Action::Refuse(Refusal::InFlight)
    }
}

/// After the store refused to issue an approved row because its status changed since it
/// was read (a decision landed in between: a revocation, say), the row as read again
/// decides. Nothing ran. A decided row's outcome is returned as recorded (a revocation's
/// denial is the call's failure); a row sent back for a decision awaits it; a row another
/// holder of the lease issued meanwhile is in flight.
pub(crate) fn after_approved_issue_refused(found: CallStatus) -> Action {
    if found.has_outcome() {
        Action::Replay
    } else if found == CallStatus::Requested {
        Action::AwaitApproval
    } else {
        Action::Refuse(Refusal::InFlight)
    }
}

/// The table as ARCHITECTURE.md shows it, rendered from the functions above (only tests
/// render it: they compare it with the document).
#[cfg(test)]
mod render {
    use std::fmt::Write as _;

    use super::*;

    pub(super) const CLASSES: [ReplayClass; 3] = [
        ReplayClass::Pure,
        ReplayClass::IdempotentWithKey,
        ReplayClass::UnsafeOnReplay,
    ];

    pub(super) const STATUSES: [Option<CallStatus>; 9] = [
        None,
        Some(CallStatus::Issued),
        Some(CallStatus::NotHappened),
        Some(CallStatus::Requested),
        Some(CallStatus::Approved),
        Some(CallStatus::Completed),
        Some(CallStatus::Failed),
        Some(CallStatus::Resolved),
        Some(CallStatus::Denied),
    ];

    /// The facts of an ordinary call: same schema, secrets held, the key recorded, no
    /// approval asked, no edits refused.
    pub(super) fn ordinary(class: ReplayClass, held: Option<CallStatus>) -> Facts {
        Facts {
            class,
            held,
            schema_changed: false,
            withheld: false,
            recorded_key: true,
            approval_asked: false,
            edits_refused: false,
        }
    }

    /// The conditions that change an ordinary call's arm, as the table's second part lists
    /// them.
    /// A condition: its name in the table, and how it changes an ordinary call's facts.
    type Condition = (&'static str, fn(&mut Facts));

    const CONDITIONS: [Condition; 5] = [
        ("the row's schema fingerprint differs", |f| {
            f.schema_changed = true
        }),
        ("a secret argument is withheld", |f| f.withheld = true),
        ("the row holds no idempotency key", |f| {
            f.recorded_key = false
        }),
        ("the call site or the policy asks for approval", |f| {
            f.approval_asked = true
        }),
        ("the approval's edits are refused by the call site", |f| {
            f.edits_refused = true
        }),
    ];

    fn held_name(held: Option<CallStatus>) -> &'static str {
        held.map_or("nothing", CallStatus::as_str)
    }

    fn describe(action: Action) -> String {
        let refusal = |r: Refusal| match r {
            Refusal::SchemaChanged => "`SchemaChanged`",
            Refusal::SecretUnavailable => "`SecretUnavailable`",
            Refusal::SecretWithheld => "`ReplayUnsafe` (secret withheld)",
            Refusal::EditsRefused => "`InvalidEdit`",
            Refusal::NoRecordedKey => "`ReplayUnsafe` (no recorded key)",
            Refusal::NotVerified => "`ReplayUnsafe` (not verified)",
            Refusal::InFlight => "`ReplayUnsafe` (in flight)",
        };
        match action {
            Action::Replay => "returned; nothing runs".into(),
            Action::RequestApproval => "journaled `requested`; `AwaitingApproval`".into(),
            Action::AwaitApproval => "`AwaitingApproval`; nothing runs".into(),
            Action::RunPure => "runs; row and outcome in one commit".into(),
            Action::IssueAndRun => {
                "barrier, divergence, carried, durability; *issued*, runs, outcome".into()
            }
            Action::Verify => "verify hook asked (below)".into(),
            Action::RecordVerified => "the hook's result recorded; nothing runs".into(),
            Action::ReRun { outcome, guarded } => {
                let what = match outcome {
                    Outcome::ReExecutedWithKey => "re-executed with the recorded key",
                    Outcome::VerifiedNotHappened => "re-executed (`verified_not_happened`)",
                    _ => "re-executed",
                };
                if guarded {
                    format!("barrier, durability; {what}")
                } else {
                    what.into()
                }
            }
            Action::RunApproved { guarded } => {
                if guarded {
                    "barrier, carried, durability; runs once".into()
                } else {
                    "runs once".into()
                }
            }
            Action::Refuse(r) if r.needs_operator() => {
                format!("refused: {}; waits for an operator", refusal(r))
            }
            Action::Refuse(r) => format!("refused: {}", refusal(r)),
            Action::RefuseApproved(r) if r.needs_operator() => format!(
                "refused: `ApprovedCallRefused` ({}); waits for an operator",
                refusal(r)
            ),
            Action::RefuseApproved(r) => format!("refused: `ApprovedCallRefused` ({})", refusal(r)),
        }
    }

    /// The decision table in Markdown, generated from [`decide`], [`after_verify`] and
    /// [`after_insert_race`]: ARCHITECTURE.md §3 holds exactly this text.
    pub(super) fn table() -> String {
        let mut out = String::new();
        let class_header: Vec<String> = CLASSES.iter().map(|c| format!("`{c}`")).collect();
        let _ = writeln!(
            out,
            "| journal holds ↓ / class → | {} |",
            class_header.join(" | ")
        );
        let _ = writeln!(out, "|---|---|---|---|");
        for held in STATUSES {
            let cells: Vec<String> = CLASSES
                .iter()
                .map(|&class| describe(decide(ordinary(class, held))))
                .collect();
            let _ = writeln!(out, "| {} | {} |", held_name(held), cells.join(" | "));
        }
        let _ = writeln!(out);
        let _ = writeln!(out, "What changes an arm (each condition alone):");
        let _ = writeln!(out);
        let _ = writeln!(out, "| condition | journal holds | class | arm |");
        let _ = writeln!(out, "|---|---|---|---|");
        for (condition, apply) in CONDITIONS {
            for held in STATUSES {
                // Classes with the same changed arm share a line.
                let mut changed: Vec<(Action, Vec<String>)> = Vec::new();
                for &class in &CLASSES {
                    let base = ordinary(class, held);
                    let mut facts = base;
                    apply(&mut facts);
                    let action = decide(facts);
                    if action == decide(base) {
                        continue;
                    }
                    match changed.iter_mut().find(|(a, _)| *a == action) {
                        Some((_, classes)) => classes.push(format!("`{class}`")),
                        None => changed.push((action, vec![format!("`{class}`")])),
                    }
                }
                for (action, classes) in changed {
                    let classes = if classes.len() == CLASSES.len() {
                        "any".to_owned()
                    } else {
                        classes.join(", ")
                    };
                    let _ = writeln!(
                        out,
                        "| {condition} | {} | {classes} | {} |",
                        held_name(held),
                        describe(action)
                    );
                }
            }
        }
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "The verify hook's answer (in doubt `unsafe_on_replay`):"
        );
        let _ = writeln!(out);
        let _ = writeln!(out, "| answer | arm |");
        let _ = writeln!(out, "|---|---|");
        for (name, answer) in [
            ("`Happened(v)`", Answer::Happened),
            ("`DidNotHappen`", Answer::DidNotHappen),
            ("`Unknown`, or no hook", Answer::Unknown),
        ] {
            let _ = writeln!(out, "| {name} | {} |", describe(after_verify(answer)));
        }
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "An insert that finds a row already there (another holder of the same lease raced):"
        );
        let _ = writeln!(out);
        let _ = writeln!(out, "| inserting | row found | arm |");
        let _ = writeln!(out, "|---|---|---|");
        for (inserting, requesting) in [("*issued*", false), ("`requested`", true)] {
            for found in STATUSES.into_iter().flatten() {
                let _ = writeln!(
                    out,
                    "| {inserting} | {} | {} |",
                    found.as_str(),
                    describe(after_insert_race(found, requesting))
                );
            }
        }
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "An approved row whose status changed before it could be issued (a decision \
             landed meanwhile), as read again:"
        );
        let _ = writeln!(out);
        let _ = writeln!(out, "| row found | arm |");
        let _ = writeln!(out, "|---|---|");
        for found in STATUSES.into_iter().flatten() {
            let _ = writeln!(
                out,
                "| {} | {} |",
                found.as_str(),
                describe(after_approved_issue_refused(found))
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::render::{CLASSES, STATUSES, ordinary, table};
    use super::*;
    use ReplayClass::{IdempotentWithKey as Keyed, Pure, UnsafeOnReplay as Unsafe};

    /// Every input of [`decide`].
    fn domain() -> impl Iterator<Item = Facts> {
        let flags = [false, true];
        CLASSES.into_iter().flat_map(move |class| {
            STATUSES.into_iter().flat_map(move |held| {
                (0..32u8).map(move |bits| {
                    let bit = |n: u8| flags[usize::from(bits >> n & 1)];
                    Facts {
                        class,
                        held,
                        schema_changed: bit(0),
                        withheld: bit(1),
                        recorded_key: bit(2),
                        approval_asked: bit(3),
                        edits_refused: bit(4),
                    }
                })
            })
        })
    }

    /// A transition as the coverage test counts it: what the journal held, the class,
    /// and the arm taken.
    type Transition = (Option<CallStatus>, ReplayClass, Action);

    /// A hand-written case: facts (an ordinary call changed by `with`) and the arm
    /// expected, with why.
    struct Case {
        class: ReplayClass,
        held: Option<CallStatus>,
        with: fn(&mut Facts),
        expect: Action,
        why: &'static str,
    }

    fn none(_: &mut Facts) {}
    fn schema(f: &mut Facts) {
        f.schema_changed = true;
    }
    fn withheld(f: &mut Facts) {
        f.withheld = true;
    }
    fn keyless(f: &mut Facts) {
        f.recorded_key = false;
    }
    fn asked(f: &mut Facts) {
        f.approval_asked = true;
    }
    fn edits(f: &mut Facts) {
        f.edits_refused = true;
    }

    use Action::*;
    use CallStatus::*;

    const fn case(
        class: ReplayClass,
        held: Option<CallStatus>,
        with: fn(&mut Facts),
        expect: Action,
        why: &'static str,
    ) -> Case {
        Case {
            class,
            held,
            with,
            expect,
            why,
        }
    }

    const RERUN: Action = ReRun {
        outcome: Outcome::ReExecuted,
        guarded: false,
    };
    const RERUN_GUARDED: Action = ReRun {
        outcome: Outcome::ReExecuted,
        guarded: true,
    };
    const RERUN_KEYED: Action = ReRun {
        outcome: Outcome::ReExecutedWithKey,
        guarded: true,
    };

    fn cases() -> Vec<Case> {
        vec![
            // No row.
            case(
                Pure,
                None,
                none,
                RunPure,
                "a pure call runs and records in one commit",
            ),
            case(
                Keyed,
                None,
                none,
                IssueAndRun,
                "an effect is issued before it runs",
            ),
            case(
                Unsafe,
                None,
                none,
                IssueAndRun,
                "an effect is issued before it runs",
            ),
            case(
                Pure,
                None,
                withheld,
                Refuse(Refusal::SecretUnavailable),
                "never run with a placeholder",
            ),
            case(
                Keyed,
                None,
                withheld,
                Refuse(Refusal::SecretUnavailable),
                "never run with a placeholder",
            ),
            case(
                Unsafe,
                None,
                withheld,
                Refuse(Refusal::SecretUnavailable),
                "never run with a placeholder",
            ),
            case(
                Pure,
                None,
                asked,
                RequestApproval,
                "a person decides first, even for pure",
            ),
            case(
                Keyed,
                None,
                asked,
                RequestApproval,
                "a person decides first",
            ),
            case(
                Unsafe,
                None,
                asked,
                RequestApproval,
                "a person decides first",
            ),
            // Recorded: returned whatever the class and whatever else.
            case(
                Pure,
                Some(Completed),
                none,
                Replay,
                "a recorded result is returned",
            ),
            case(
                Keyed,
                Some(Failed),
                schema,
                Replay,
                "a recorded failure is returned; decoding decides, not the fingerprint",
            ),
            case(
                Unsafe,
                Some(Resolved),
                withheld,
                Replay,
                "an operator's result needs no secret",
            ),
            case(
                Unsafe,
                Some(Denied),
                edits,
                Replay,
                "a denial is the recorded failure",
            ),
            case(
                Pure,
                Some(Denied),
                asked,
                Replay,
                "a denied pure call is not asked again",
            ),
            case(
                Keyed,
                Some(Completed),
                keyless,
                Replay,
                "a recorded keyed call needs no key",
            ),
            case(
                Unsafe,
                Some(Completed),
                none,
                Replay,
                "never re-run what has an outcome",
            ),
            case(Keyed, Some(Resolved), none, Replay, "an operator's result"),
            case(Pure, Some(Resolved), none, Replay, "an operator's result"),
            case(Pure, Some(Failed), none, Replay, "a recorded failure"),
            case(Keyed, Some(Denied), none, Replay, "a denial"),
            case(
                Unsafe,
                Some(Failed),
                none,
                Replay,
                "a recorded failure of an effect is returned, never re-run",
            ),
            // Waiting for a person.
            case(
                Pure,
                Some(Requested),
                none,
                AwaitApproval,
                "nothing runs before the decision",
            ),
            case(
                Keyed,
                Some(Requested),
                withheld,
                AwaitApproval,
                "waiting needs no secret",
            ),
            case(
                Unsafe,
                Some(Requested),
                schema,
                AwaitApproval,
                "waiting is checked when it runs",
            ),
            // Approved: runs once.
            case(
                Pure,
                Some(Approved),
                none,
                RunApproved { guarded: false },
                "pure passes no barrier",
            ),
            case(
                Keyed,
                Some(Approved),
                none,
                RunApproved { guarded: true },
                "an effect passes the barrier",
            ),
            case(
                Unsafe,
                Some(Approved),
                none,
                RunApproved { guarded: true },
                "an effect passes the barrier",
            ),
            case(
                Pure,
                Some(Approved),
                schema,
                RefuseApproved(Refusal::SchemaChanged),
                "not what was approved",
            ),
            case(
                Keyed,
                Some(Approved),
                schema,
                RefuseApproved(Refusal::SchemaChanged),
                "not what was approved",
            ),
            case(
                Unsafe,
                Some(Approved),
                schema,
                RefuseApproved(Refusal::SchemaChanged),
                "not what was approved",
            ),
            case(
                Pure,
                Some(Approved),
                withheld,
                RefuseApproved(Refusal::SecretUnavailable),
                "never run with a placeholder",
            ),
            case(
                Keyed,
                Some(Approved),
                withheld,
                RefuseApproved(Refusal::SecretUnavailable),
                "never run with a placeholder",
            ),
            case(
                Unsafe,
                Some(Approved),
                withheld,
                RefuseApproved(Refusal::SecretUnavailable),
                "never run with a placeholder",
            ),
            case(
                Pure,
                Some(Approved),
                edits,
                RefuseApproved(Refusal::EditsRefused),
                "running the request would not be what was approved",
            ),
            case(
                Keyed,
                Some(Approved),
                edits,
                RefuseApproved(Refusal::EditsRefused),
                "running the request would not be what was approved",
            ),
            case(
                Unsafe,
                Some(Approved),
                edits,
                RefuseApproved(Refusal::EditsRefused),
                "running the request would not be what was approved",
            ),
            // In doubt.
            case(Pure, Some(Issued), none, RERUN, "pure re-runs"),
            case(
                Keyed,
                Some(Issued),
                none,
                RERUN_KEYED,
                "keyed re-runs with the recorded key",
            ),
            case(
                Keyed,
                Some(Issued),
                keyless,
                Refuse(Refusal::NoRecordedKey),
                "no key the upstream could deduplicate on",
            ),
            case(
                Unsafe,
                Some(Issued),
                none,
                Verify,
                "unsafe is verified, never re-run blindly",
            ),
            case(
                Unsafe,
                Some(Issued),
                withheld,
                Refuse(Refusal::SecretWithheld),
                "neither the hook nor a re-run can run",
            ),
            case(
                Pure,
                Some(Issued),
                withheld,
                Refuse(Refusal::SecretUnavailable),
                "never run with a placeholder",
            ),
            case(
                Keyed,
                Some(Issued),
                withheld,
                Refuse(Refusal::SecretUnavailable),
                "never run with a placeholder",
            ),
            case(
                Pure,
                Some(Issued),
                schema,
                Refuse(Refusal::SchemaChanged),
                "the arguments mean something else now",
            ),
            case(
                Keyed,
                Some(Issued),
                schema,
                Refuse(Refusal::SchemaChanged),
                "the arguments mean something else now",
            ),
            case(
                Unsafe,
                Some(Issued),
                schema,
                Refuse(Refusal::SchemaChanged),
                "the arguments mean something else now",
            ),
            case(
                Pure,
                Some(Issued),
                edits,
                Refuse(Refusal::EditsRefused),
                "an approved call re-runs as edited or not at all",
            ),
            case(
                Keyed,
                Some(Issued),
                edits,
                Refuse(Refusal::EditsRefused),
                "an approved call re-runs as edited or not at all",
            ),
            case(
                Unsafe,
                Some(Issued),
                edits,
                Refuse(Refusal::EditsRefused),
                "an approved call is verified as edited or not at all",
            ),
            // An operator said it did not happen.
            case(Pure, Some(NotHappened), none, RERUN, "it may run again"),
            case(
                Keyed,
                Some(NotHappened),
                keyless,
                RERUN_GUARDED,
                "it did not happen: no key needed",
            ),
            case(
                Keyed,
                Some(NotHappened),
                none,
                RERUN_GUARDED,
                "it may run again, behind the barrier",
            ),
            case(
                Unsafe,
                Some(NotHappened),
                none,
                RERUN_GUARDED,
                "no verify needed: an operator said so",
            ),
            case(
                Unsafe,
                Some(NotHappened),
                withheld,
                Refuse(Refusal::SecretUnavailable),
                "never run with a placeholder",
            ),
            case(
                Pure,
                Some(NotHappened),
                withheld,
                Refuse(Refusal::SecretUnavailable),
                "never run with a placeholder",
            ),
            case(
                Keyed,
                Some(NotHappened),
                withheld,
                Refuse(Refusal::SecretUnavailable),
                "never run with a placeholder",
            ),
            case(
                Pure,
                Some(NotHappened),
                schema,
                Refuse(Refusal::SchemaChanged),
                "the arguments mean something else now",
            ),
            case(
                Keyed,
                Some(NotHappened),
                schema,
                Refuse(Refusal::SchemaChanged),
                "the arguments mean something else now",
            ),
            case(
                Unsafe,
                Some(NotHappened),
                schema,
                Refuse(Refusal::SchemaChanged),
                "the arguments mean something else now",
            ),
            case(
                Pure,
                Some(NotHappened),
                edits,
                Refuse(Refusal::EditsRefused),
                "an approved call re-runs as edited or not at all",
            ),
            case(
                Keyed,
                Some(NotHappened),
                edits,
                Refuse(Refusal::EditsRefused),
                "an approved call re-runs as edited or not at all",
            ),
            case(
                Unsafe,
                Some(NotHappened),
                edits,
                Refuse(Refusal::EditsRefused),
                "an approved call re-runs as edited or not at all",
            ),
        ]
    }

    #[test]
    fn every_case_holds() {
        for case in cases() {
            let mut facts = ordinary(case.class, case.held);
            (case.with)(&mut facts);
            assert_eq!(
                decide(facts),
                case.expect,
                "{:?} holding {:?}: {}",
                case.class,
                case.held,
                case.why
            );
        }
    }

    /// Temporal's transition coverage, for a pure function: every (held, class, arm)
    /// that some input reaches has a hand-written case. A change to the table that adds a
    /// transition fails here until a case says why it is right.
    #[test]
    fn every_transition_has_a_case() {
        let reached: BTreeSet<String> = domain()
            .map(|f| format!("{:?}", (f.held, f.class, decide(f))))
            .collect();
        let covered: BTreeSet<String> = cases()
            .iter()
            .map(|c| {
                let t: Transition = (c.held, c.class, c.expect);
                format!("{t:?}")
            })
            .collect();
        let uncovered: Vec<&String> = reached.difference(&covered).collect();
        assert!(
            uncovered.is_empty(),
            "transitions without a case: {uncovered:#?}"
        );
        let unreachable: Vec<&String> = covered.difference(&reached).collect();
        assert!(
            unreachable.is_empty(),
            "cases no input reaches: {unreachable:#?}"
        );
    }

    /// What the driver relies on, over the whole domain.
    #[test]
    fn invariants_over_every_input() {
        for f in domain() {
            let action = decide(f);
            let has_outcome = f.held.is_some_and(CallStatus::has_outcome);
            // A recorded outcome is returned, whatever else holds.
            assert_eq!(has_outcome, action == Replay, "{f:?} → {action:?}");
            // Nothing runs with a secret withheld.
            if f.withheld {
                assert!(
                    matches!(
                        action,
                        Replay | AwaitApproval | Refuse(_) | RefuseApproved(_)
                    ),
                    "{f:?} → {action:?}"
                );
            }
            // An in-doubt unsafe call that was not declared not-happened is never re-run
            // without the verify hook's answer.
            if f.class == Unsafe && f.held == Some(Issued) {
                assert!(matches!(action, Verify | Refuse(_)), "{f:?} → {action:?}");
            }
            // Every effect that runs passes the barrier.
            if f.class != Pure {
                match action {
                    ReRun { guarded, .. } | RunApproved { guarded } => {
                        assert!(guarded, "{f:?} → {action:?}")
                    }
                    _ => {}
                }
            }
            // The verify hook is asked only where it is the arm.
            if action == Verify {
                assert_eq!((f.class, f.held), (Unsafe, Some(Issued)));
            }
        }
    }

    #[test]
    fn verify_and_insert_race() {
        assert_eq!(after_verify(Answer::Happened), RecordVerified);
        assert_eq!(
            after_verify(Answer::DidNotHappen),
            ReRun {
                outcome: Outcome::VerifiedNotHappened,
                guarded: true
            }
        );
        assert_eq!(after_verify(Answer::Unknown), Refuse(Refusal::NotVerified));
        for found in STATUSES.into_iter().flatten() {
            for requesting in [false, true] {
                let action = after_insert_race(found, requesting);
                let expect = if found.has_outcome() {
                    Replay
                } else if requesting && found == Requested {
                    AwaitApproval
                } else {
                    Refuse(Refusal::InFlight)
                };
                assert_eq!(action, expect, "{found:?}, requesting {requesting}");
            }
        }
        for found in STATUSES.into_iter().flatten() {
            let expect = match found {
                Completed | Failed | Resolved | Denied => Replay,
                Requested => AwaitApproval,
                Issued | NotHappened | Approved => Refuse(Refusal::InFlight),
            };
            assert_eq!(after_approved_issue_refused(found), expect, "{found:?}");
        }
    }

    /// ARCHITECTURE.md §3 holds the table generated from the code, between its markers.
    /// Run with `DURABLE_BLESS=1` to write it after a deliberate change.
    #[test]
    fn architecture_md_shows_this_table() {
        const BEGIN: &str = "<!-- decision-table: generated by durable-core's journal::protocol::table; do not edit -->\n";
        const END: &str = "<!-- decision-table end -->";
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../ARCHITECTURE.md");
        let text = std::fs::read_to_string(&path).expect("ARCHITECTURE.md beside durable-core");
        let start = text
            .find(BEGIN)
            .expect("ARCHITECTURE.md has the table's begin marker")
            + BEGIN.len();
        let end = start
            + text[start..]
                .find(END)
                .expect("ARCHITECTURE.md has the table's end marker");
        let generated = table();
        if text[start..end] != generated {
            if std::env::var_os("DURABLE_BLESS").is_some() {
                let blessed = format!("{}{generated}{}", &text[..start], &text[end..]);
                std::fs::write(&path, blessed).expect("write ARCHITECTURE.md");
                return;
            }
            panic!(
                "ARCHITECTURE.md's decision table differs from the code's; after a deliberate \
                 change, run `DURABLE_BLESS=1 cargo test -p durable-core --lib protocol` and \
                 review the diff. The code's table:\n{generated}"
            );
        }
    }
}
