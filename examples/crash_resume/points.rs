//! The crash points of a script: every journal boundary a run passes, by name.
//!
//! The runtime evaluates failpoints `durable::<boundary>` and `durable::<boundary>::<tool>`
//! at its journal boundaries (durable-core's `failpoints` feature): `before_issue`,
//! `after_issued`, `after_effect`, `after_result` for tool calls (a `pure` call has only
//! `after_result`: it is recorded in one commit after it ran), `after_model_recorded` for
//! model calls, `before_checkpoint` and `after_checkpoint` for sessions. The last three
//! are passed several times per run; a crash point names which pass (`#n`).

use durable::ReplayClass;

use super::model::Script;
use super::tools;

/// A journal boundary to crash at: a failpoint name and which hit of it (1-based).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CrashPoint {
    /// The failpoint, e.g. `durable::after_effect::send_email`.
    pub failpoint: String,
    /// Which hit (counted boundaries: the n-th checkpoint or model reply).
    pub nth: usize,
}

impl CrashPoint {
    /// Parses `after_effect::send_email`, `durable::after_effect::send_email`,
    /// `before_checkpoint#2`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        let text = text.strip_prefix("durable::").unwrap_or(text);
        let (name, nth) = match text.split_once('#') {
            Some((name, n)) => (
                name,
                n.parse::<usize>()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| format!("`{text}`: the count after `#` must be 1 or more"))?,
            ),
            None => (text, 1),
        };
        if name.is_empty() {
            return Err("empty crash point".into());
        }
        Ok(CrashPoint {
            failpoint: format!("durable::{name}"),
            nth,
        })
    }

    /// The short name: `after_effect::send_email`, `before_checkpoint#2`.
    pub fn short(&self) -> String {
        let name = self
            .failpoint
            .strip_prefix("durable::")
            .unwrap_or(&self.failpoint);
        if counted(name) {
            format!("{name}#{}", self.nth)
        } else {
            name.to_owned()
        }
    }
}

fn counted(name: &str) -> bool {
    matches!(
        name,
        "after_model_recorded" | "before_checkpoint" | "after_checkpoint"
    )
}

/// A crash point of a script, with what a crash there means.
#[derive(Debug, Clone)]
pub struct PointInfo {
    /// The point.
    pub point: CrashPoint,
    /// The tool whose call it interrupts, if any, and its class.
    pub tool: Option<(&'static str, ReplayClass)>,
    /// What has and has not happened when the process dies there.
    pub meaning: String,
}

impl PointInfo {
    /// Inside an unsafe call's window: issued, outcome unknown.
    pub fn in_unsafe_window(&self) -> bool {
        matches!(self.tool, Some((_, ReplayClass::UnsafeOnReplay)))
            && (self.point.failpoint.starts_with("durable::after_issued::")
                || self.point.failpoint.starts_with("durable::after_effect::"))
    }
}

/// The boundaries a call of `tool` passes before it runs when it needs approval: the
/// request journaled or not (the boundaries after the approval are the tool's own).
pub fn approval_points(tool: &'static str) -> Vec<PointInfo> {
    let class = tools::toolbox(true)
        .ok()
        .and_then(|t| t.get(tool).map(|t| t.spec().class))
        .unwrap_or(ReplayClass::UnsafeOnReplay);
    [
        (
            "before_request",
            format!("{tool}'s approval request is not journaled yet"),
        ),
        (
            "after_requested",
            format!("{tool} is journaled as awaiting approval; the session is not parked"),
        ),
    ]
    .into_iter()
    .map(|(boundary, meaning)| PointInfo {
        point: CrashPoint {
            failpoint: format!("durable::{boundary}::{tool}"),
            nth: 1,
        },
        tool: Some((tool, class)),
        meaning,
    })
    .collect()
}

/// Every journal boundary a crash-free run of `script` passes, in the order of the run's
/// kinds: tools (conversation order), model replies, checkpoints.
pub fn crash_points(script: Script) -> Vec<PointInfo> {
    let toolbox = tools::toolbox(true).ok();
    let mut points = Vec::new();
    for &tool in script.tools() {
        let class = toolbox
            .as_ref()
            .and_then(|t| t.get(tool))
            .map_or(ReplayClass::Pure, |t| t.spec().class);
        let effect = match tool {
            "send_email" => "the email has left",
            "post_slack" => "the chat message is posted",
            "notify_warehouse" => "the warehouse was called",
            "charge_card" => "the card is charged",
            "reserve_stock" => "the stock is reserved",
            "commit_order" => "the order is committed",
            _ => "it ran",
        };
        let boundaries: Vec<(&str, String)> = if class == ReplayClass::Pure {
            vec![(
                "after_result",
                format!("{tool} ran and its result is recorded"),
            )]
        } else {
            vec![
                ("before_issue", format!("{tool} is not recorded yet")),
                ("after_issued", format!("{tool} is issued; it has not run")),
                (
                    "after_effect",
                    format!("{effect}; the result is not recorded"),
                ),
                (
                    "after_result",
                    format!("{tool}'s result is recorded; the turn is not checkpointed"),
                ),
            ]
        };
        for (boundary, meaning) in boundaries {
            points.push(PointInfo {
                point: CrashPoint {
                    failpoint: format!("durable::{boundary}::{tool}"),
                    nth: 1,
                },
                tool: Some((tool, class)),
                meaning,
            });
        }
    }
    for n in 1..=script.model_calls() {
        points.push(PointInfo {
            point: CrashPoint {
                failpoint: "durable::after_model_recorded".into(),
                nth: n,
            },
            tool: None,
            meaning: format!("model reply {n} is recorded; its tool calls have not run"),
        });
    }
    for (boundary, meaning) in [
        ("before_checkpoint", "is not written"),
        (
            "after_checkpoint",
            "is written; the next turn has not started",
        ),
    ] {
        for n in 1..=script.checkpoints() {
            points.push(PointInfo {
                point: CrashPoint {
                    failpoint: format!("durable::{boundary}"),
                    nth: n,
                },
                tool: None,
                meaning: format!("checkpoint {n} {meaning}"),
            });
        }
    }
    points
}
