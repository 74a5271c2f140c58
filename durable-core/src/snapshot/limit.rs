//! The ceilings of a session's [`Budget`](super::Budget): which ones exist ([`Limit`]),
//! what a call asks of them ([`Ask`]), and the refusal when one is reached
//! ([`BudgetExceeded`]).

use std::fmt;

use crate::ids::SessionId;
pub use crate::store::{InvalidLimit, Limit};

/// What a call about to run asks of the budget: one model call, or one call of a tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Ask<'a> {
    /// A model call.
    Model,
    /// A call of the named tool.
    Tool(&'a str),
}

/// A ceiling was reached: the call that asked was refused before it ran, and nothing
/// ran. Returned by [`Budget::check_call`](super::Budget::check_call) and, as
/// [`DurableError::BudgetExceeded`](crate::DurableError::BudgetExceeded), by the journal
/// before a fresh model or tool call.
///
/// The harness decides what follows: tell the model (a tool result,
/// [`ToolResult::refused`](crate::ToolResult::refused)), stop, or park the session until
/// an operator raises the ceiling
/// ([`Session::park_for_budget`](crate::Session::park_for_budget)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct BudgetExceeded {
    /// The session, when the journal refused (`None` from a bare [`Budget`](super::Budget)).
    pub session: Option<SessionId>,
    /// The ceiling that was reached.
    pub limit: Limit,
    /// Its amount, in the limit's unit.
    pub ceiling: u64,
    /// What was spent against it so far (for [`Limit::WallTime`], the time elapsed).
    pub spent: u64,
    /// What the refused call asked: `Some(1)` for a call count; `None` when its cost is
    /// only known once it has run (money, tokens, time).
    pub asked: Option<u64>,
}

impl std::error::Error for BudgetExceeded {}

impl fmt::Display for BudgetExceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match &self.limit {
            Limit::Usd => "dollar".to_owned(),
            Limit::Tokens => "token".to_owned(),
            Limit::ModelCalls => "model-call".to_owned(),
            Limit::ToolCalls => "tool-call".to_owned(),
            Limit::WallTime => "wall-time".to_owned(),
            Limit::Tool(name) => format!("`{name}` call"),
        };
        write!(
            f,
            "budget exceeded: {} spent of the {} {what} ceiling",
            self.limit.format_amount(self.spent),
            self.limit.format_amount(self.ceiling),
        )?;
        if let Some(asked) = self.asked {
            write!(f, ", {asked} more asked")?;
        }
        f.write_str("; nothing ran. ")?;
        match &self.session {
            Some(session) => write!(
                f,
                "Raise it (`durable budget raise {session} {} <amount>`) or end the session",
                self.limit
            ),
            None => f.write_str("Raise the limit or end the session"),
        }
    }
}
