//! `durable budget`: a session's spend against its ceilings, and an operator's raise of
//! one (audited) that puts a session parked at its ceiling back to work.

use std::sync::Arc;

use clap::{Args, Subcommand};
use durable::budget::{SessionBudget, session_budget};
use durable::{CheckpointStore, Durable, Limit, SessionId};
use serde_json::json;

use crate::display::{ID, NAME, TEXT, clip};
use crate::error::{CliError, Code};
use crate::operate::CLI_OWNER;
use crate::render::{self, table};

pub(crate) const BUDGET_HELP: &str = "\
A session's ceilings (dollars, tokens, model calls, tool calls, wall time since it
started, calls per tool) are checked before every fresh model or tool call; a call that
would go past one is refused (BudgetExceeded) and nothing runs. A harness that parks the
session at its ceiling (`Session::park_for_budget`) waits for an operator:

  durable budget show <session>                        spend against each ceiling
  durable budget raise <session> usd 5.00 --note \"approved by the customer\"
  durable budget raise <session> tool:send_email 10
  durable budget raise <session> wall_time 2h

Limits: usd (dollars), tokens, model_calls, tool_calls, wall_time (90s, 15m, 2h, or
5000ms), tool:<name>. A raise is audited (who, when, why), never lowers a ceiling, and
returns a session parked at its ceiling to active: the next worker continues it.";

#[derive(Debug, Args)]
pub(crate) struct BudgetArgs {
    #[command(subcommand)]
    pub(crate) action: BudgetAction,
}

#[derive(Debug, Subcommand)]
pub(crate) enum BudgetAction {
    /// Show a session's spend against each ceiling, and the raises.
    Show {
        /// The session.
        session: String,
    },
    /// Raise one ceiling of a session's budget (audited); a session parked at its
    /// ceiling is active again.
    Raise {
        /// The session.
        session: String,
        /// The ceiling: usd, tokens, model_calls, tool_calls, wall_time, tool:<name>.
        limit: String,
        /// Its new amount: dollars for usd (5.00), a duration for wall_time (90s, 15m,
        /// 2h), a count otherwise.
        amount: String,
        /// Why (kept in the audit row).
        #[arg(long)]
        note: Option<String>,
        /// Who raises it (default: $USER).
        #[arg(long, value_name = "NAME")]
        by: Option<String>,
    },
}

impl BudgetAction {
    pub(crate) fn writes(&self) -> bool {
        matches!(self, BudgetAction::Raise { .. })
    }
}

pub(crate) async fn budget(
    store: &Arc<dyn CheckpointStore>,
    json: bool,
    args: BudgetArgs,
) -> Result<(), CliError> {
    match args.action {
        BudgetAction::Show { session } => {
            let standing = session_budget(store.as_ref(), &SessionId::new(session)).await?;
            if json {
                return render::print_json(&standing_json(&standing));
            }
            print_standing(&standing);
            Ok(())
        }
        BudgetAction::Raise {
            session,
            limit,
            amount,
            note,
            by,
        } => {
            let by = crate::operator(by)?;
            let invalid =
                |e: durable::budget::InvalidLimit| CliError::new(Code::InvalidInput, e.to_string());
            let limit: Limit = limit.parse().map_err(invalid)?;
            let ceiling = limit.parse_amount(&amount).map_err(invalid)?;
            let id = SessionId::new(session);
            let durable = Durable::builder(Arc::clone(store)).owner(CLI_OWNER).build();
            let operator = durable.operator();
            let raised = operator
                .raise_limit(&id, limit.clone(), ceiling, &by, note.as_deref())
                .await?;
            let record = store.session(&id).await?;
            if json {
                return render::print_json(&json!({
                    "session": id,
                    "limit": raised.limit,
                    "ceiling": raised.ceiling,
                    "by": raised.by,
                    "note": raised.note,
                    "at": raised.at,
                    "status": record.status,
                }));
            }
            outln!(
                "raised the {} ceiling of session `{}` to {}, by {}: the next call it refused runs{}",
                limit,
                clip(id.as_str(), ID),
                limit.format_amount(ceiling),
                clip(&by, NAME),
                match record.status {
                    durable::store::SessionStatus::Active =>
                        "; the session is active and the next worker continues it",
                    _ => "",
                }
            );
            Ok(())
        }
    }
}

/// The JSON of `durable budget show` and of `show`'s `ceilings`.
pub(crate) fn standing_json(standing: &SessionBudget) -> serde_json::Value {
    json!({
        "session": standing.session,
        "version": standing.version,
        "elapsed_ms": standing.elapsed_ms,
        "spent_nano_usd": standing.budget.spent_nano_usd,
        "input_tokens": standing.budget.input_tokens,
        "output_tokens": standing.budget.output_tokens,
        "model_calls": standing.budget.model_calls,
        "tool_calls": standing.budget.tool_calls,
        "ceilings": standing.ceilings.iter().map(|c| json!({
            "limit": c.limit,
            "spent": c.spent,
            "ceiling": c.ceiling,
            "reached": c.spent >= c.ceiling,
        })).collect::<Vec<_>>(),
        "raises": standing.raises,
    })
}

/// The ceilings table (`durable show`'s budget section, `durable budget show`).
pub(crate) fn print_standing(standing: &SessionBudget) {
    let b = &standing.budget;
    outln!(
        "  spent {} · {} tokens ({} in, {} out) · {} model calls · {} tool calls",
        Limit::Usd.format_amount(b.spent_nano_usd),
        b.total_tokens(),
        b.input_tokens,
        b.output_tokens,
        b.model_calls,
        b.tool_calls
    );
    if standing.ceilings.is_empty() {
        outln!("  (no ceilings)");
    } else {
        let mut t = table(["LIMIT", "SPENT", "CEILING", "LEFT", ""]);
        for c in &standing.ceilings {
            t.add_row(vec![
                clip(&c.limit.to_string(), NAME),
                c.limit.format_amount(c.spent),
                c.limit.format_amount(c.ceiling),
                c.limit.format_amount(c.ceiling.saturating_sub(c.spent)),
                if c.spent >= c.ceiling {
                    "REACHED".to_owned()
                } else {
                    String::new()
                },
            ]);
        }
        render::print_table(&t);
    }
    for raise in &standing.raises {
        outln!(
            "  raised {} to {} by {} {}{}",
            clip(&raise.limit.to_string(), NAME),
            raise.limit.format_amount(raise.ceiling),
            clip(&raise.by, NAME),
            render::time(raise.at),
            raise
                .note
                .as_deref()
                .map(|n| format!(" ({})", clip(n, TEXT)))
                .unwrap_or_default()
        );
    }
}
