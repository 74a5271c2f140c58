//! The structured plan and its finalization gate (after chapter 16 of the harness
//! book: "Structured Plans and Verified Completion").

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The status of a plan step: `pending` → `in_progress` → `done` (requires evidence),
/// or `blocked` (requires a reason) when the step cannot be completed.
///
/// Any transition is allowed (plans are revised mid-task); only the evidence rules are
/// enforced. `done` and `blocked` are *terminal*: a plan whose steps are all terminal
/// has passed the step half of the gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepStatus {
    /// Not started.
    #[default]
    Pending,
    /// Being worked on.
    InProgress,
    /// Finished; carries evidence of completion.
    Done,
    /// Cannot be completed; carries the reason.
    Blocked,
}

impl StepStatus {
    /// Every status, in lifecycle order.
    pub const ALL: [StepStatus; 4] = [
        StepStatus::Pending,
        StepStatus::InProgress,
        StepStatus::Done,
        StepStatus::Blocked,
    ];

    /// The wire name (`pending`, `in_progress`, `done`, `blocked`).
    pub const fn as_str(self) -> &'static str {
        match self {
            StepStatus::Pending => "pending",
            StepStatus::InProgress => "in_progress",
            StepStatus::Done => "done",
            StepStatus::Blocked => "blocked",
        }
    }

    /// `done` or `blocked`.
    pub const fn is_terminal(self) -> bool {
        matches!(self, StepStatus::Done | StepStatus::Blocked)
    }

    /// The checkbox used by [`Plan::to_markdown`]: `[ ]`, `[~]`, `[x]`, `[!]`.
    pub const fn mark(self) -> &'static str {
        match self {
            StepStatus::Pending => "[ ]",
            StepStatus::InProgress => "[~]",
            StepStatus::Done => "[x]",
            StepStatus::Blocked => "[!]",
        }
    }
}

impl fmt::Display for StepStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for StepStatus {
    type Err = PlanError;

    /// Parses a wire name, as a plan tool receives it from the model.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        StepStatus::ALL
            .into_iter()
            .find(|st| st.as_str() == s.trim())
            .ok_or_else(|| PlanError::InvalidStatus {
                found: s.to_owned(),
            })
    }
}

/// One step of a [`Plan`]: something to do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    /// A specific, actionable item.
    pub description: String,
    /// Where the step stands.
    pub status: StepStatus,
    /// What proved the step done, or why it is blocked.
    pub evidence: Option<String>,
}

/// A condition that must hold when the task is declared complete.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Postcondition {
    /// What must be true, e.g. "tests in module Z pass".
    pub description: String,
    /// Whether it was verified.
    pub satisfied: bool,
    /// The proof given when it was verified.
    pub evidence: Option<String>,
}

/// A structured plan: an objective, ordered steps and postconditions.
///
/// The harness is the verifier: it refuses a final answer until
/// [`is_ready_to_finalize`](Self::is_ready_to_finalize) holds, and tells the model why
/// with [`missing_for_finalization`](Self::missing_for_finalization). The rules:
///
/// - marking a step `done` requires non-blank evidence (what proved it complete);
/// - marking a step `blocked` requires a non-blank reason, given as evidence: `blocked`
///   is terminal and passes the gate, so without a reason a model could block every
///   inconvenient step and finalize;
/// - verifying a postcondition requires non-blank evidence.
///
/// Evidence is required, not checked: the plan makes the model say what proved the
/// work, and leaves a paper trail. Write a verifier tool when a postcondition must be
/// proved by running something. Steps and postconditions are numbered from 1, as the
/// model sees them in [`to_markdown`](Self::to_markdown).
///
/// ```
/// use durable_core::{Plan, StepStatus};
///
/// let mut plan = Plan::new(
///     "report the largest of three files",
///     ["measure /etc/hostname", "measure /etc/os-release"],
///     ["the winner is named with its size"],
/// )?;
/// assert!(!plan.is_ready_to_finalize());
///
/// // `done` without evidence is refused, with a message the model can act on.
/// let refused = plan.update_step(1, StepStatus::Done, None).unwrap_err();
/// assert!(refused.to_string().contains("requires evidence"));
///
/// plan.update_step(1, StepStatus::Done, Some("stat: 8 bytes"))?;
/// plan.update_step(2, StepStatus::Blocked, Some("permission denied"))?;
/// assert_eq!(plan.missing_for_finalization().len(), 1); // the postcondition
///
/// plan.verify_postcondition(1, "os-release, 386 bytes")?;
/// assert!(plan.is_ready_to_finalize());
/// # Ok::<(), durable_core::PlanError>(())
/// ```
///
/// [`Plan::default()`] is the empty plan a session holds before the model creates one:
/// nothing is planned, so its gate passes. [`Plan::new`] refuses to build such a plan.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Plan {
    /// One sentence: what the agent is trying to accomplish.
    pub objective: String,
    /// Ordered steps.
    pub steps: Vec<Step>,
    /// Conditions checked before finalization.
    pub postconditions: Vec<Postcondition>,
}

/// A refused plan operation. The messages are written to be returned to the model as
/// tool results: each says what was wrong and what to do instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PlanError {
    /// The objective is empty or whitespace.
    #[error(
        "the plan's objective is empty; state in one sentence what you are trying to accomplish"
    )]
    EmptyObjective,
    /// The plan has neither steps nor postconditions, so its gate would pass vacuously.
    #[error(
        "the plan has no steps and no postconditions; list the steps you will take and the conditions that must hold when you are done"
    )]
    EmptyPlan,
    /// A step or postcondition description is empty or whitespace.
    #[error("{what} {number} has an empty description; describe it as a specific, checkable item")]
    BlankDescription {
        /// `"step"` or `"postcondition"`.
        what: &'static str,
        /// Its 1-based number.
        number: usize,
    },
    /// A step number outside the plan.
    #[error("step {number} does not exist: {}; call `plan_show` to see the plan", valid_range("step", *len))]
    StepOutOfRange {
        /// The number asked for.
        number: usize,
        /// How many steps the plan has.
        len: usize,
    },
    /// A postcondition number outside the plan.
    #[error(
        "postcondition {number} does not exist: {}; call `plan_show` to see the plan",
        valid_range("postcondition", *len)
    )]
    PostconditionOutOfRange {
        /// The number asked for.
        number: usize,
        /// How many postconditions the plan has.
        len: usize,
    },
    /// A status name that is not one of the four.
    #[error(
        "invalid step status `{found}`; use one of `pending`, `in_progress`, `done`, `blocked`"
    )]
    InvalidStatus {
        /// What was given.
        found: String,
    },
    /// `done` without evidence.
    #[error(
        "marking step {number} `done` requires evidence; describe what proved the step complete (e.g. \"wrote the file and read it back; content matches\"), or leave it `in_progress`"
    )]
    EvidenceRequired {
        /// The step.
        number: usize,
    },
    /// `blocked` without a reason.
    #[error(
        "marking step {number} `blocked` requires a reason in `evidence`; say what prevents the step (e.g. \"permission denied reading /etc/shadow\")"
    )]
    ReasonRequired {
        /// The step.
        number: usize,
    },
    /// A postcondition verified without evidence.
    #[error(
        "verifying postcondition {number} requires evidence; give concrete proof that it holds (e.g. a tool result you observed)"
    )]
    PostconditionEvidenceRequired {
        /// The postcondition.
        number: usize,
    },
}

fn valid_range(what: &str, len: usize) -> String {
    match len {
        0 => format!("this plan has no {what}s"),
        1 => format!("this plan has only {what} 1"),
        n => format!("valid {what} numbers are 1 to {n}"),
    }
}

/// Trims evidence; `None` when absent or blank.
fn non_blank(evidence: Option<&str>) -> Option<String> {
    evidence
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(str::to_owned)
}

impl Plan {
    /// A plan with every step `pending` and every postcondition unverified.
    ///
    /// Refuses an empty objective, blank descriptions, and a plan with neither steps nor
    /// postconditions (its gate would pass without any work). A plan may have steps and
    /// no postconditions, or the reverse.
    pub fn new<S, P>(
        objective: impl Into<String>,
        steps: impl IntoIterator<Item = S>,
        postconditions: impl IntoIterator<Item = P>,
    ) -> Result<Self, PlanError>
    where
        S: Into<String>,
        P: Into<String>,
    {
        let objective = objective.into().trim().to_owned();
        if objective.is_empty() {
            return Err(PlanError::EmptyObjective);
        }
        let steps = steps
            .into_iter()
            .enumerate()
            .map(|(i, d)| {
                let description = d.into().trim().to_owned();
                if description.is_empty() {
                    return Err(PlanError::BlankDescription {
                        what: "step",
                        number: i + 1,
                    });
                }
                Ok(Step {
                    description,
                    status: StepStatus::Pending,
                    evidence: None,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let postconditions = postconditions
            .into_iter()
            .enumerate()
            .map(|(i, d)| {
                let description = d.into().trim().to_owned();
                if description.is_empty() {
                    return Err(PlanError::BlankDescription {
                        what: "postcondition",
                        number: i + 1,
                    });
                }
                Ok(Postcondition {
                    description,
                    satisfied: false,
                    evidence: None,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        if steps.is_empty() && postconditions.is_empty() {
            return Err(PlanError::EmptyPlan);
        }
        Ok(Plan {
            objective,
            steps,
            postconditions,
        })
    }

    /// Whether this is the empty plan (no steps, no postconditions): no plan was made.
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty() && self.postconditions.is_empty()
    }

    /// Sets the status of step `number` (1-based).
    ///
    /// `done` requires evidence and `blocked` a reason (non-blank; stored trimmed). For
    /// `pending` and `in_progress` evidence is optional; the step's evidence is replaced
    /// by what is given (so moving a `done` step back to `in_progress` without evidence
    /// clears the old proof). On error the plan is unchanged.
    pub fn update_step(
        &mut self,
        number: usize,
        status: StepStatus,
        evidence: Option<&str>,
    ) -> Result<(), PlanError> {
        let len = self.steps.len();
        let step = number
            .checked_sub(1)
            .and_then(|i| self.steps.get_mut(i))
            .ok_or(PlanError::StepOutOfRange { number, len })?;
        let evidence = non_blank(evidence);
        match status {
            StepStatus::Done if evidence.is_none() => {
                return Err(PlanError::EvidenceRequired { number });
            }
            StepStatus::Blocked if evidence.is_none() => {
                return Err(PlanError::ReasonRequired { number });
            }
            _ => {}
        }
        step.status = status;
        step.evidence = evidence;
        Ok(())
    }

    /// Marks postcondition `number` (1-based) satisfied, with evidence (required,
    /// non-blank; stored trimmed). Verifying again replaces the evidence. On error the
    /// plan is unchanged.
    pub fn verify_postcondition(&mut self, number: usize, evidence: &str) -> Result<(), PlanError> {
        let len = self.postconditions.len();
        let pc = number
            .checked_sub(1)
            .and_then(|i| self.postconditions.get_mut(i))
            .ok_or(PlanError::PostconditionOutOfRange { number, len })?;
        let evidence =
            non_blank(Some(evidence)).ok_or(PlanError::PostconditionEvidenceRequired { number })?;
        pc.satisfied = true;
        pc.evidence = Some(evidence);
        Ok(())
    }

    /// Every step is `done` or `blocked` (true when there are no steps).
    pub fn all_steps_terminal(&self) -> bool {
        self.steps.iter().all(|s| s.status.is_terminal())
    }

    /// Every postcondition is verified (true when there are none).
    pub fn all_postconditions_satisfied(&self) -> bool {
        self.postconditions.iter().all(|pc| pc.satisfied)
    }

    /// The finalization gate: all steps terminal and all postconditions verified. A
    /// harness checks this before accepting a final answer.
    pub fn is_ready_to_finalize(&self) -> bool {
        self.all_steps_terminal() && self.all_postconditions_satisfied()
    }

    /// What stands between the plan and finalization, one human-readable line per open
    /// item (empty exactly when [`is_ready_to_finalize`](Self::is_ready_to_finalize)).
    /// A harness that refuses a final answer sends these to the model.
    pub fn missing_for_finalization(&self) -> Vec<String> {
        let steps = self
            .steps
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.status.is_terminal())
            .map(|(i, s)| {
                format!(
                    "step {} ({:?}) is {}: mark it `done` with evidence, or `blocked` with a reason",
                    i + 1,
                    s.description,
                    s.status
                )
            });
        let postconditions = self
            .postconditions
            .iter()
            .enumerate()
            .filter(|(_, pc)| !pc.satisfied)
            .map(|(i, pc)| {
                format!(
                    "postcondition {} ({:?}) is not verified: verify it with evidence",
                    i + 1,
                    pc.description
                )
            });
        steps.chain(postconditions).collect()
    }

    /// Renders the plan as Markdown for the model to read:
    ///
    /// ```markdown
    /// # Plan: <objective>
    ///
    /// ## Steps
    /// 1. [x] <description>
    ///      evidence: <evidence>
    /// 2. [~] <description>
    ///
    /// ## Postconditions
    /// 1. [ ] <description>
    /// ```
    ///
    /// Marks: `[ ]` pending, `[~]` in progress, `[x]` done, `[!]` blocked; a
    /// postcondition is `[x]` once verified. An empty list renders as `(none)`. Line
    /// breaks inside text are indented under their item, so text the model wrote cannot
    /// forge a heading or a checkbox line. No trailing newline.
    pub fn to_markdown(&self) -> String {
        let mut out = format!("# Plan: {}\n\n## Steps", indent(&self.objective));
        if self.steps.is_empty() {
            out.push_str("\n(none)");
        }
        for (i, s) in self.steps.iter().enumerate() {
            item(
                &mut out,
                i + 1,
                s.status.mark(),
                &s.description,
                s.evidence.as_deref(),
            );
        }
        out.push_str("\n\n## Postconditions");
        if self.postconditions.is_empty() {
            out.push_str("\n(none)");
        }
        for (i, pc) in self.postconditions.iter().enumerate() {
            let mark = if pc.satisfied { "[x]" } else { "[ ]" };
            item(
                &mut out,
                i + 1,
                mark,
                &pc.description,
                pc.evidence.as_deref(),
            );
        }
        out
    }
}

const EVIDENCE_INDENT: &str = "     ";

fn item(out: &mut String, number: usize, mark: &str, description: &str, evidence: Option<&str>) {
    out.push_str(&format!("\n{number}. {mark} {}", indent(description)));
    if let Some(evidence) = evidence {
        out.push_str(&format!(
            "\n{EVIDENCE_INDENT}evidence: {}",
            indent(evidence)
        ));
    }
}

/// Indents continuation lines so they stay inside their item.
fn indent(text: &str) -> String {
    // A lone `\r` is a line break to some renderers: flatten it too.
    text.lines()
        .map(|line| line.replace('\r', " "))
        .collect::<Vec<_>>()
        .join(&format!("\n{EVIDENCE_INDENT}  "))
}

#[cfg(test)]
mod tests;
