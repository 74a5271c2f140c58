//! Narration of a run for a person: one line per journal decision (the `on_call`
//! observer) and per harness decision (plan, finalization, checkpoints).

use std::sync::{Arc, Mutex};

use durable::Message;
use durable::runtime::MODEL_SLOT;
use durable::runtime::{CallEvent, Outcome};

use super::agent::say;
use super::ui::{self, Style};

/// Narrates journal decisions (the `on_call` observer) and harness decisions.
#[derive(Clone)]
pub struct Narrator {
    pub on: bool,
    pub style: Style,
    /// What the journal did with the latest model call (narrated with the reply).
    pub last_model: Arc<Mutex<Option<Outcome>>>,
}

impl Narrator {
    pub fn line(&self, name: &str, class: &str, text: String) {
        if self.on {
            say(&ui::row_styled(self.style, name, class, text));
        }
    }

    pub fn event(&self, e: &CallEvent) {
        let call = e.call.as_ref().map_or("-", |c| c.as_str());
        say(&format!(
            "@@ event {} {} {call}",
            e.tool,
            e.outcome.as_str()
        ));
        let s = self.style;
        if e.tool == MODEL_SLOT {
            if let Ok(mut last) = self.last_model.lock() {
                *last = Some(e.outcome);
            }
            return;
        }
        let text = match e.outcome {
            Outcome::Executed => s.green("executed, result recorded"),
            Outcome::CacheHit => s.cyan("recorded result returned, not run again"),
            Outcome::Resolved => s.cyan("operator's resolution returned as its result"),
            Outcome::ReExecuted => s.yellow("in doubt → re-run (pure: safe to repeat)"),
            Outcome::ReExecutedWithKey => s.yellow(&format!(
                "in doubt → re-run with the same key `{}`",
                e.idempotency_key.as_deref().unwrap_or("?")
            )),
            Outcome::VerifiedHappened => {
                s.yellow("in doubt → verify hook: it happened; result recorded, not re-run")
            }
            Outcome::VerifiedNotHappened => {
                s.yellow("in doubt → verify hook: it never happened; ran once now")
            }
            Outcome::Refused => s.red("in doubt → needs an operator (ReplayUnsafe)"),
            Outcome::ApprovalRequested => s.yellow("awaits a person's approval: nothing ran"),
        };
        self.line(&e.tool, e.class.as_str(), text);
    }

    /// The model line: what the journal did, and what the reply asks for.
    pub fn model(&self, message: &Message) {
        let s = self.style;
        let outcome = self.last_model.lock().ok().and_then(|mut l| l.take());
        let mut asked: Vec<(&str, usize)> = Vec::new();
        for call in message.tool_calls() {
            match asked.last_mut() {
                Some((name, n)) if *name == call.name => *n += 1,
                _ => asked.push((&call.name, 1)),
            }
        }
        let wants = if asked.is_empty() {
            "a final answer".to_owned()
        } else {
            let names: Vec<String> = asked
                .iter()
                .map(|(name, n)| {
                    if *n == 1 {
                        (*name).to_owned()
                    } else {
                        format!("{name} ×{n}")
                    }
                })
                .collect();
            names.join(", ")
        };
        let text = match outcome {
            Some(Outcome::CacheHit) => s.cyan(&format!(
                "recorded reply returned, not asked again → {wants}"
            )),
            _ => format!("asked; reply recorded → {wants}"),
        };
        self.line("model", "", text);
    }
}

/// Joins the plan tools' notes of a turn, `postcondition 1 verified; postcondition 2
/// verified` becoming `postconditions 1, 2 verified`.
pub fn summarize_plan_notes(notes: &[String]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut verified: Vec<&str> = Vec::new();
    for note in notes {
        match note
            .strip_prefix("postcondition ")
            .and_then(|n| n.strip_suffix(" verified"))
        {
            Some(n) => verified.push(n),
            None => out.push(note.clone()),
        }
    }
    match verified.as_slice() {
        [] => {}
        [one] => out.push(format!("postcondition {one} verified")),
        many => out.push(format!("postconditions {} verified", many.join(", "))),
    }
    out.join("; ")
}
