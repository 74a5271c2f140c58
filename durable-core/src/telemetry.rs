//! The names of the spans and attributes `durable` emits through `tracing`, after the
//! [OpenTelemetry GenAI semantic conventions](https://opentelemetry.io/docs/specs/semconv/gen-ai/),
//! in one place.
//!
//! | span (`tracing` name) | `otel.name` | attributes |
//! |---|---|---|
//! | [`EXECUTE_TOOL`] (every journaled tool call) | `execute_tool {tool}` | [`GEN_AI_OPERATION_NAME`] = `execute_tool`, [`GEN_AI_TOOL_NAME`], [`GEN_AI_TOOL_TYPE`] = `function`, [`GEN_AI_TOOL_CALL_ID`] (the model's call id, when given), [`GEN_AI_CONVERSATION_ID`] (the session), [`DURABLE_REPLAY_CLASS`], [`DURABLE_REPLAY_OUTCOME`], [`DURABLE_CALL_OUTCOME`], [`DURABLE_CALL_ID`], [`DURABLE_STEP`], [`DURABLE_RATE_LIMIT`] and [`DURABLE_RATE_LIMIT_WAIT_MS`] (calls under a rate limit), [`ERROR_TYPE`] on failure |
//! | [`CHAT`] (every journaled model call) | `chat {model}` (`chat` when the model is not named) | [`GEN_AI_OPERATION_NAME`] = `chat`, [`GEN_AI_REQUEST_MODEL`], [`GEN_AI_CONVERSATION_ID`], [`GEN_AI_USAGE_INPUT_TOKENS`] and [`GEN_AI_USAGE_OUTPUT_TOKENS`] (when the model ran now and its spend was given), [`DURABLE_REPLAY_OUTCOME`], [`DURABLE_CALL_ID`], [`DURABLE_STEP`], [`DURABLE_MODEL_POSITION`], [`DURABLE_RATE_LIMIT`] and [`DURABLE_RATE_LIMIT_WAIT_MS`] (calls under a rate limit), [`ERROR_TYPE`] on failure |
//! | [`CHECKPOINT`] | | [`GEN_AI_CONVERSATION_ID`], [`DURABLE_SESSION_VERSION`] (the version written), [`ERROR_TYPE`] on failure |
//! | [`RESUME`] | | [`GEN_AI_CONVERSATION_ID`], [`DURABLE_SESSION_VERSION`] (the version resumed from), [`DURABLE_RESUME_IN_DOUBT`], [`ERROR_TYPE`] on failure |
//!
//! `tracing` span names are static, so the OpenTelemetry name that carries the tool or
//! model goes in the [`OTEL_NAME`] field, which `tracing-opentelemetry` uses as the span's
//! name. The model's tool-call id reaches [`GEN_AI_TOOL_CALL_ID`] through
//! [`Toolbox::dispatch`](crate::Toolbox::dispatch) (from [`ModelToolCall::id`](crate::ModelToolCall)),
//! [`Journal::with_tool_call_id`](crate::Journal::with_tool_call_id) or
//! [`ToolCall::call_id`](crate::journal::ToolCall::call_id); the model's name reaches
//! [`GEN_AI_REQUEST_MODEL`] through [`Journal::with_model_name`](crate::Journal::with_model_name).
//!
//! Arguments, results and model replies are never recorded on spans. Recording costs no
//! store round trip: every value is one the journal holds already, and none is
//! formatted unless a subscriber is interested in the span.
//!
//! A replayed model call reports no token usage: the tokens were spent (and charged to the
//! budget) when the model ran.

use crate::error::{DurableError, StoreError};
use crate::event::Outcome;
use crate::journal::CallError;

/// The fleet-wide rate limit the call waited under (see [`limiter`](crate::limiter)),
/// on [`EXECUTE_TOOL`] and [`CHAT`] spans of calls that name one.
pub const DURABLE_RATE_LIMIT: &str = "durable.rate_limit.name";
/// How long the call waited for its turn under its rate limit, in ms (0 when it
/// started at once); set on calls that ran now.
pub const DURABLE_RATE_LIMIT_WAIT_MS: &str = "durable.rate_limit.wait_ms";

/// Span: one journaled tool call (the GenAI `execute_tool` operation).
pub const EXECUTE_TOOL: &str = "execute_tool";
/// Span: one journaled model call (the GenAI `chat` operation).
pub const CHAT: &str = "chat";
/// Span: writing a checkpoint ([`Session::checkpoint`](crate::Session::checkpoint)).
pub const CHECKPOINT: &str = "checkpoint";
/// Span: resuming a session (loading its latest checkpoint and its in-doubt calls).
pub const RESUME: &str = "resume";

/// The span's OpenTelemetry name, `execute_tool {tool}` or `chat {model}`
/// (honoured by `tracing-opentelemetry`).
pub const OTEL_NAME: &str = "otel.name";
/// GenAI: the operation, [`OPERATION_EXECUTE_TOOL`] or [`OPERATION_CHAT`].
pub const GEN_AI_OPERATION_NAME: &str = "gen_ai.operation.name";
/// GenAI: the tool's name.
pub const GEN_AI_TOOL_NAME: &str = "gen_ai.tool.name";
/// GenAI: the model's id for the tool call (e.g. OpenAI's `call_…`), passed through.
pub const GEN_AI_TOOL_CALL_ID: &str = "gen_ai.tool.call.id";
/// GenAI: the tool's type, always [`TOOL_TYPE_FUNCTION`].
pub const GEN_AI_TOOL_TYPE: &str = "gen_ai.tool.type";
/// GenAI: the conversation, i.e. the durable session's id.
pub const GEN_AI_CONVERSATION_ID: &str = "gen_ai.conversation.id";
/// GenAI: the model asked, when the harness names it.
pub const GEN_AI_REQUEST_MODEL: &str = "gen_ai.request.model";
/// GenAI: input (prompt) tokens the model call used.
pub const GEN_AI_USAGE_INPUT_TOKENS: &str = "gen_ai.usage.input_tokens";
/// GenAI: output (completion) tokens the model call used.
pub const GEN_AI_USAGE_OUTPUT_TOKENS: &str = "gen_ai.usage.output_tokens";
/// The class of error the operation ended with: [`ERROR_TYPE_TOOL`] for a tool's own
/// failure (run now or replayed), [`ERROR_TYPE_MODEL`] for a model call's, otherwise the
/// runtime's error kind (see [`durable_error_type`], e.g. `ReplayUnsafe`).
pub const ERROR_TYPE: &str = "error.type";

/// `durable`: the tool's replay class (`pure`, `idempotent_with_key`, `unsafe_on_replay`).
pub const DURABLE_REPLAY_CLASS: &str = "durable.replay.class";
/// `durable`: what the journal did with the call, in a few values (see [`replay_outcome`]):
/// [`OUTCOME_EXECUTED`], [`OUTCOME_RECORDED`], [`OUTCOME_RE_EXECUTED`],
/// [`OUTCOME_VERIFIED`], [`OUTCOME_REFUSED`], [`OUTCOME_AWAITING_APPROVAL`].
pub const DURABLE_REPLAY_OUTCOME: &str = "durable.replay.outcome";
/// `durable`: the journal's own [`Outcome`] ([`Outcome::as_str`]), finer than
/// [`DURABLE_REPLAY_OUTCOME`] (`cache_hit` or `resolved`, `re_executed_with_key`,
/// `verified_happened` or `verified_not_happened`).
pub const DURABLE_CALL_OUTCOME: &str = "durable.call.outcome";
/// `durable`: the journal row's id.
pub const DURABLE_CALL_ID: &str = "durable.call.id";
/// `durable`: the step (the checkpoint version the turn started from).
pub const DURABLE_STEP: &str = "durable.step";
/// `durable`: a model call's position in its step.
pub const DURABLE_MODEL_POSITION: &str = "durable.position";
/// `durable`: the checkpoint version written (checkpoint) or resumed from (resume).
pub const DURABLE_SESSION_VERSION: &str = "durable.session.version";
/// `durable`: how many calls a resume found in doubt.
pub const DURABLE_RESUME_IN_DOUBT: &str = "durable.resume.in_doubt";
/// `durable`: on a call a budget ceiling refused, the ceiling
/// ([`Limit`](crate::snapshot::Limit) as text: `usd`, `tokens`, `tool:<name>`, …).
pub const DURABLE_BUDGET_LIMIT: &str = "durable.budget.limit";
/// `durable`: on a call a budget ceiling refused, what was spent against it (in the
/// limit's unit: nano-dollars, tokens, calls, ms).
pub const DURABLE_BUDGET_SPENT: &str = "durable.budget.spent";
/// `durable`: on a call a budget ceiling refused, the ceiling's amount (same unit).
pub const DURABLE_BUDGET_CEILING: &str = "durable.budget.ceiling";

/// [`GEN_AI_OPERATION_NAME`] of a tool call.
pub const OPERATION_EXECUTE_TOOL: &str = "execute_tool";
/// [`GEN_AI_OPERATION_NAME`] of a model call.
pub const OPERATION_CHAT: &str = "chat";
/// [`GEN_AI_TOOL_TYPE`]: durable tools are functions the harness runs.
pub const TOOL_TYPE_FUNCTION: &str = "function";

/// [`DURABLE_REPLAY_OUTCOME`]: no record; the call ran (and its outcome was recorded).
pub const OUTCOME_EXECUTED: &str = "executed";
/// [`DURABLE_REPLAY_OUTCOME`]: a recorded outcome (or an operator's *happened*
/// resolution) was returned; nothing ran.
pub const OUTCOME_RECORDED: &str = "recorded";
/// [`DURABLE_REPLAY_OUTCOME`]: in doubt and run again (`pure`; `idempotent_with_key` with
/// the recorded key; after *did not happen*, from an operator or a verify hook).
pub const OUTCOME_RE_EXECUTED: &str = "re_executed";
/// [`DURABLE_REPLAY_OUTCOME`]: in doubt `unsafe_on_replay`; its verify hook found the
/// effect, whose result was recorded; nothing ran.
pub const OUTCOME_VERIFIED: &str = "verified";
/// [`DURABLE_REPLAY_OUTCOME`]: refused before anything ran (`ReplayUnsafe`,
/// `ReplayDiverged`, the session-wide barrier, a lost lease, invalid arguments, …).
pub const OUTCOME_REFUSED: &str = "refused";
/// [`DURABLE_REPLAY_OUTCOME`]: waits for a person's approval; nothing ran.
pub const OUTCOME_AWAITING_APPROVAL: &str = "awaiting_approval";

/// [`ERROR_TYPE`] of a tool's own failure.
pub const ERROR_TYPE_TOOL: &str = "tool_error";
/// [`ERROR_TYPE`] of a model call's own failure.
pub const ERROR_TYPE_MODEL: &str = "model_error";

/// The [`DURABLE_REPLAY_OUTCOME`] value of a journal [`Outcome`].
pub const fn replay_outcome(outcome: Outcome) -> &'static str {
    match outcome {
        Outcome::Executed => OUTCOME_EXECUTED,
        Outcome::CacheHit | Outcome::Resolved => OUTCOME_RECORDED,
        Outcome::ReExecuted | Outcome::ReExecutedWithKey | Outcome::VerifiedNotHappened => {
            OUTCOME_RE_EXECUTED
        }
        Outcome::VerifiedHappened => OUTCOME_VERIFIED,
        Outcome::ApprovalRequested => OUTCOME_AWAITING_APPROVAL,
        Outcome::Refused => OUTCOME_REFUSED,
    }
}

/// The [`ERROR_TYPE`] of a runtime error: its variant's name (a store error's own
/// variant for the ones a harness acts on, else `StoreError`).
pub const fn durable_error_type(error: &DurableError) -> &'static str {
    match error {
        DurableError::Store(store) => match store {
            StoreError::LeaseLost { .. } => "LeaseLost",
            StoreError::Leased { .. } => "Leased",
            StoreError::VersionConflict { .. } => "VersionConflict",
            StoreError::IdempotencyConflict { .. } => "IdempotencyConflict",
            StoreError::NotDurable { .. } => "NotDurable",
            _ => "StoreError",
        },
        DurableError::InvalidArguments { .. } => "InvalidArguments",
        DurableError::ArgumentsMismatch { .. } => "ArgumentsMismatch",
        DurableError::UnknownTool { .. } => "UnknownTool",
        DurableError::ReplayUnsafe { .. } => "ReplayUnsafe",
        DurableError::AwaitingApproval { .. } => "AwaitingApproval",
        DurableError::RateLimited { .. } => "RateLimited",
        DurableError::Cancelled { .. } => "Cancelled",
        DurableError::ChildNotStarted { .. } => "ChildNotStarted",
        DurableError::NotAChild { .. } => "NotAChild",
        DurableError::ApprovedCallRefused { .. } => "ApprovedCallRefused",
        DurableError::InvalidEdit { .. } => "InvalidEdit",
        DurableError::ReplayDiverged { .. } => "ReplayDiverged",
        DurableError::InheritedEffect { .. } => "InheritedEffect",
        DurableError::SchemaChanged { .. } => "SchemaChanged",
        DurableError::AppVersionMismatch { .. } => "AppVersionMismatch",
        DurableError::Decode { .. } => "Decode",
        DurableError::Encode { .. } => "Encode",
        DurableError::InvalidValue { .. } => "InvalidValue",
        DurableError::TooLarge { .. } => "TooLarge",
        DurableError::CheckpointInDoubt { .. } => "CheckpointInDoubt",
        DurableError::BudgetExceeded(_) => "BudgetExceeded",
        DurableError::Plan(_) => "Plan",
        DurableError::Connect(_) => "Connect",
        DurableError::OneCallPerCheckpoint { .. } => "OneCallPerCheckpoint",
        DurableError::StreamOver { .. } => "StreamOver",
    }
}

/// The [`ERROR_TYPE`] of a journaled call's error; `own` names the call's own failure
/// ([`ERROR_TYPE_TOOL`] or [`ERROR_TYPE_MODEL`]).
pub(crate) fn call_error_type<E>(error: &CallError<E>, own: &'static str) -> &'static str {
    match error {
        CallError::Tool(_) | CallError::Recorded(_) => own,
        CallError::Durable(e) => durable_error_type(e),
    }
}

/// Records a budget refusal on the current span (the call's `execute_tool` or `chat`
/// span): the ceiling, what was spent and the ceiling's amount (as `i64`: OpenTelemetry
/// has no unsigned integers).
pub(crate) fn record_budget_refusal(refusal: &crate::snapshot::BudgetExceeded) {
    let span = tracing::Span::current();
    let signed = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    span.record(DURABLE_BUDGET_LIMIT, refusal.limit.to_string().as_str());
    span.record(DURABLE_BUDGET_SPENT, signed(refusal.spent));
    span.record(DURABLE_BUDGET_CEILING, signed(refusal.ceiling));
}

/// Records `outcome` on the current span (the call's `execute_tool` or `chat` span).
pub(crate) fn record_outcome(outcome: Outcome) {
    let span = tracing::Span::current();
    span.record(DURABLE_REPLAY_OUTCOME, replay_outcome(outcome));
    span.record(DURABLE_CALL_OUTCOME, outcome.as_str());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_outcome_has_a_replay_outcome() {
        use Outcome::*;
        let all = [
            Executed,
            CacheHit,
            Resolved,
            ReExecuted,
            ReExecutedWithKey,
            VerifiedHappened,
            VerifiedNotHappened,
            ApprovalRequested,
            Refused,
        ];
        let values: Vec<_> = all.iter().map(|o| replay_outcome(*o)).collect();
        assert_eq!(
            values,
            [
                "executed",
                "recorded",
                "recorded",
                "re_executed",
                "re_executed",
                "verified",
                "re_executed",
                "awaiting_approval",
                "refused"
            ]
        );
    }
}
