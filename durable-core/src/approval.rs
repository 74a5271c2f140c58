//! Approvals at run time: a person decides on a call before it runs.
//!
//! A call needs approval when its tool says so (`#[durable_tool(approval = "required")]`,
//! or `approval = needs_approval` naming a function over the typed arguments), when the
//! harness asks for it on one call ([`ToolCall::require_approval`]), or when the
//! runtime's policy ([`DurableBuilder::approval_policy`]) says so. Such a call is
//! journaled as *requested* (its arguments, who asked, the model's reasoning when the
//! harness passes it with [`Journal::with_reasoning`], an optional deadline); nothing
//! runs, and the call returns [`DurableError::AwaitingApproval`]. The harness parks the
//! session with [`Session::await_approval`]: it releases its lease and holds no worker.
//!
//! A person decides, from the CLI (`durable approve`, `durable deny`), the console, or
//! code ([`Operator::approve`], [`Operator::deny`], [`Operator::expire_approvals`]):
//!
//! - **approve**, optionally with edited arguments. An edit is checked here
//!   ([`check_edited_args`]): an object, within the argument limits, valid against the
//!   tool's argument schema (recorded with the request), secret arguments unchanged. The
//!   journal row keeps the requested arguments (its identity: a replay of the turn asks
//!   with them); the approval holds the edit, the audit log both. The approved call runs
//!   with the edited arguments, and a keyed tool's idempotency key is derived from them.
//! - **deny** with a reason: the call's recorded outcome is the denial, which the model
//!   reads as the tool's error result.
//! - let it **expire**: after its deadline (on the store's clock) it can only be denied
//!   by the deadline ([`Operator::expire_approvals`] sweeps them).
//!
//! The last decision returns the session to `active` with no lease. The next resume, on
//! any worker, replays the turn: the approved call runs exactly once under its replay
//! class (a crash while it runs leaves it in doubt like any call), a denied one returns
//! its denial, and the turn goes on.
//!
//! # Example
//!
//! ```no_run
//! use durable_core::{Durable, DurableError, Session};
//! use durable_core::toolbox::{ModelToolCall, Toolbox, ToolResult};
//! use durable_core::transcript::Message;
//!
//! # async fn turn(mut session: Session<Message>, tools: Toolbox, calls: Vec<ModelToolCall>)
//! # -> Result<(), DurableError> {
//! let mut answers = Vec::new();
//! let mut awaiting = false;
//! for (call, outcome) in calls.iter().zip(tools.dispatch_all(session.journal(), &calls).await) {
//!     match outcome {
//!         Ok(result) => answers.push(result),
//!         // Journaled as requested; nothing ran. The other calls of the turn go on.
//!         Err(e) if e.is_awaiting_approval() => awaiting = true,
//!         Err(e) => answers.push(ToolResult::refused(call, &e).ok_or(e)?),
//!     }
//! }
//! if awaiting {
//!     // Parked: no worker is held. Once every request is decided, the next resume
//!     // replays this turn, runs what was approved and returns the denials.
//!     return session.await_approval().await;
//! }
//! session.push(ToolResult::message(&answers));
//! session.checkpoint().await?;
//! # Ok(()) }
//!
//! # async fn operator(durable: &Durable) -> Result<(), DurableError> {
//! for pending in durable.operator().approvals(None).await? {
//!     durable.operator().approve(&pending.call.id, None, "alice", Some("checked the invoice")).await?;
//! }
//! # Ok(()) }
//! ```
//!
//! [`ToolCall::require_approval`]: crate::journal::ToolCall::require_approval
//! [`DurableBuilder::approval_policy`]: crate::DurableBuilder::approval_policy
//! [`Journal::with_reasoning`]: crate::Journal::with_reasoning
//! [`Session::await_approval`]: crate::Session::await_approval
//! [`Operator::approve`]: crate::Operator::approve
//! [`Operator::deny`]: crate::Operator::deny
//! [`Operator::expire_approvals`]: crate::Operator::expire_approvals

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::args::{self, ArgLimits};
use crate::error::DurableError;
use crate::secret;
use crate::store::{ApprovalRequest, CallRecord};
use crate::tool_spec::ToolSpec;

/// The keyword under which a request's recorded argument schema lists the tool's secret
/// arguments (JSON Schema validators ignore unknown keywords): an edit may not touch
/// them, present or absent.
pub const SECRET_ARGS_KEYWORD: &str = "x-durable-secret-args";

/// The schema a request records: the tool's argument schema, with its secret arguments
/// listed under [`SECRET_ARGS_KEYWORD`].
pub(crate) fn recorded_schema(schema: &Value, secrets: &[String]) -> Value {
    let mut schema = schema.clone();
    if let (false, Some(object)) = (secrets.is_empty(), schema.as_object_mut()) {
        object.insert(SECRET_ARGS_KEYWORD.to_owned(), serde_json::json!(secrets));
    }
    schema
}

/// Longest model reasoning journaled with a request, in bytes; longer text is cut at a
/// character boundary and marked (it is shown to a person, not replayed).
pub const MAX_REASONING_BYTES: usize = 16 * 1024;

/// Decides, per call, whether a call needs approval: see
/// [`DurableBuilder::approval_policy`](crate::DurableBuilder::approval_policy). Given the
/// tool and the call's arguments (secret ones masked), returns the request to journal, or
/// `None` to run the call.
pub type ApprovalPolicy =
    Arc<dyn Fn(&ToolSpec, &Value) -> Option<ApprovalRequest> + Send + Sync + 'static>;

/// Called once a call's *requested* row is durable: notify a person (a webhook, a chat
/// message). See [`DurableBuilder::on_approval_requested`](crate::DurableBuilder::on_approval_requested).
pub type ApprovalHook = Arc<dyn Fn(&CallRecord) + Send + Sync + 'static>;

/// The request a tool's own rule journals (`#[durable_tool(approval = …)]`): asked by
/// `tool <name>`, no deadline.
pub fn tool_rule(spec: &ToolSpec) -> ApprovalRequest {
    ApprovalRequest {
        asked_by: format!("tool {}", spec.name),
        reasoning: None,
        expires_in: None,
        schema: None,
    }
}

/// A request asked by `asked_by` (a policy's or the harness's name), with no deadline:
/// a starting point for [`with_deadline`](RequestExt::with_deadline).
pub fn request(asked_by: impl Into<String>) -> ApprovalRequest {
    ApprovalRequest {
        asked_by: asked_by.into(),
        reasoning: None,
        expires_in: None,
        schema: None,
    }
}

/// Builder-style additions to an [`ApprovalRequest`].
pub trait RequestExt {
    /// The request stays open this long (on the store's clock), then may be expired.
    fn with_deadline(self, expires_in: Duration) -> Self;
}

impl RequestExt for ApprovalRequest {
    fn with_deadline(mut self, expires_in: Duration) -> Self {
        self.expires_in = Some(expires_in);
        self
    }
}

/// The reasoning text as journaled: at most [`MAX_REASONING_BYTES`], cut at a character
/// boundary and marked when longer; a NUL (which no store's text holds, and which a model
/// can be made to write) becomes U+FFFD, so the request is journaled all the same.
pub(crate) fn cap_reasoning(text: &str) -> String {
    let text = &text.replace('\0', "\u{FFFD}");
    if text.len() <= MAX_REASONING_BYTES {
        return text.to_owned();
    }
    let mut cut = MAX_REASONING_BYTES;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}… [cut: {} bytes in all]", &text[..cut], text.len())
}

/// Checks arguments a person edited before approving `call`, so that nothing the tool
/// could not have been called with is recorded:
///
/// - a JSON object, within `limits` (size, depth, string lengths, as for a model's);
/// - valid against the tool's argument schema recorded with the request (draft 2020-12);
/// - every secret argument unchanged: the journal holds it masked, an operator never
///   sees its value, and the approved call runs with the value the model sent (an edit
///   cannot introduce one either).
///
/// Returns `Ok(None)` when the edit changes nothing (approve as requested), else the
/// arguments to record.
///
/// # Errors
/// [`DurableError::InvalidEdit`] naming the call, the tool, the JSON path and the
/// problem; nothing is decided.
pub fn check_edited_args(
    call: &CallRecord,
    edited: &Value,
    limits: &ArgLimits,
) -> Result<Option<Value>, DurableError> {
    let invalid = |path: String, detail: String| DurableError::InvalidEdit {
        call: call.id.clone(),
        tool: call.identity.tool.clone(),
        path,
        detail,
    };
    if edited == &call.args {
        return Ok(None);
    }
    let Some(fields) = edited.as_object() else {
        return Err(invalid(
            "$".into(),
            "the arguments must be a JSON object".into(),
        ));
    };
    args::check_value(edited, limits).map_err(|e| invalid(e.path.clone(), e.kind.to_string()))?;
    // Secret arguments (those masked in the request, and those the tool declares, which
    // the request's schema lists): each stays exactly as requested, present or absent,
    // and no new masked value may appear.
    let requested = call.args.as_object();
    let schema = call.approval.as_ref().and_then(|a| a.schema.as_ref());
    let mut secrets: Vec<String> = requested
        .map(|r| {
            r.iter()
                .filter(|(_, v)| secret::is_masked(v))
                .map(|(k, _)| k.clone())
                .collect()
        })
        .unwrap_or_default();
    let declared = schema
        .and_then(|s| s.get(SECRET_ARGS_KEYWORD))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str);
    for name in declared {
        if !secrets.iter().any(|s| s == name) {
            secrets.push(name.to_owned());
        }
    }
    for name in &secrets {
        let before = requested.and_then(|r| r.get(name.as_str()));
        if fields.get(name.as_str()) != before {
            return Err(invalid(
                format!("$.{name}"),
                "a secret argument cannot be edited: the journal holds it masked, and the call \
                 runs with the value the model sent; keep it as shown"
                    .into(),
            ));
        }
    }
    if let Some((name, _)) = fields
        .iter()
        .find(|(k, v)| secret::is_masked(v) && !secrets.contains(*k))
    {
        return Err(invalid(
            format!("$.{name}"),
            "a masked secret value may only stay where the request had it".into(),
        ));
    }
    let Some(schema) = schema else {
        return Err(invalid(
            "$".into(),
            "the request recorded no argument schema, so an edit cannot be checked; approve it \
             as requested or deny it"
                .into(),
        ));
    };
    let validator = jsonschema::draft202012::new(schema).map_err(|e| {
        invalid(
            "$".into(),
            format!(
                "the recorded argument schema does not compile ({e}); approve as requested or deny"
            ),
        )
    })?;
    // A masked secret does not have its argument's type: its place is checked above.
    let problem = validator.iter_errors(edited).find(|error| {
        let path = error.instance_path().to_string();
        !secrets.iter().any(|name| {
            let pointer = format!("/{name}");
            path == pointer || path.starts_with(&format!("{pointer}/"))
        })
    });
    if let Some(error) = problem {
        let pointer = error.instance_path().to_string();
        return Err(invalid(pointer_to_path(&pointer), error.to_string()));
    }
    Ok(Some(edited.clone()))
}

/// A JSON pointer (`/items/0/name`) as the `$.items[0].name` path argument errors use.
fn pointer_to_path(pointer: &str) -> String {
    let mut path = String::from("$");
    for part in pointer.split('/').skip(1) {
        let part = part.replace("~1", "/").replace("~0", "~");
        if !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()) {
            path.push_str(&format!("[{part}]"));
        } else {
            path.push('.');
            path.push_str(&part);
        }
    }
    path
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{CallId, SessionId};
    use crate::replay::ReplayClass;
    use crate::store::{Approval, CallIdentity, CallKind, CallStatus};
    use serde_json::json;

    fn requested(args: Value, schema: Option<Value>) -> CallRecord {
        CallRecord {
            id: CallId::random(),
            kind: CallKind::Tool,
            identity: CallIdentity {
                session: SessionId::new("s"),
                step: 0,
                tool: "refund".into(),
                input_hash: String::new(),
                ordinal: 0,
            },
            class: ReplayClass::UnsafeOnReplay,
            status: CallStatus::Requested,
            attempt: 0,
            args,
            result: None,
            error: None,
            idempotency_key: None,
            schema_hash: String::new(),
            spend: None,
            issued_at: 0,
            fence: 0,
            mac: None,
            finished_at: None,
            approval: Some(Approval {
                asked_by: "tool refund".into(),
                reasoning: None,
                requested_at: 0,
                deadline: None,
                schema,
                decision: None,
            }),
        }
    }

    fn schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "amount": {"type": "integer", "minimum": 0},
                "note": {"type": "string"},
                "card": {"type": "string"}
            },
            "required": ["amount", "card"],
            "additionalProperties": false
        })
    }

    #[test]
    fn an_edit_is_checked_against_the_recorded_schema() {
        let card = json!({"$secret": "k1:abc"});
        let row = requested(json!({"amount": 500, "card": card}), Some(schema()));
        let limits = ArgLimits::default();
        assert_eq!(
            check_edited_args(&row, &row.args, &limits).expect("accepted"),
            None
        );
        let lower = json!({"amount": 50, "card": card});
        assert_eq!(
            check_edited_args(&row, &lower, &limits).expect("accepted"),
            Some(lower.clone())
        );
        let bad = json!({"amount": "fifty", "card": card});
        let err = check_edited_args(&row, &bad, &limits).expect_err("refused");
        assert!(
            matches!(&err, DurableError::InvalidEdit { path, .. } if path == "$.amount"),
            "{err}"
        );
        let extra = json!({"amount": 5, "card": card, "to": "x"});
        assert!(check_edited_args(&row, &extra, &limits).is_err());
        let missing = json!({"card": card});
        assert!(check_edited_args(&row, &missing, &limits).is_err());
        assert!(check_edited_args(&row, &json!([1]), &limits).is_err());
    }

    #[test]
    fn a_secret_argument_cannot_be_edited_or_introduced() {
        let card = json!({"$secret": "k1:abc"});
        let row = requested(json!({"amount": 5, "card": card}), Some(schema()));
        let limits = ArgLimits::default();
        let changed = json!({"amount": 5, "card": "4242"});
        let err = check_edited_args(&row, &changed, &limits).expect_err("refused");
        assert!(err.to_string().contains("secret argument"), "{err}");
        let dropped = json!({"amount": 5});
        assert!(check_edited_args(&row, &dropped, &limits).is_err());
        let planted = json!({"amount": 5, "card": card, "note": {"$secret": "k1:zzz"}});
        assert!(check_edited_args(&row, &planted, &limits).is_err());
    }

    #[test]
    fn a_declared_secret_the_model_did_not_send_cannot_be_added() {
        let schema = recorded_schema(
            &json!({"type": "object", "properties": {"amount": {"type": "integer"}, "token": {"type": "string"}}}),
            &["token".to_owned()],
        );
        let row = requested(json!({"amount": 5}), Some(schema));
        let added = json!({"amount": 5, "token": "operator-chosen"});
        let err = check_edited_args(&row, &added, &ArgLimits::default()).expect_err("refused");
        assert!(
            matches!(&err, DurableError::InvalidEdit { path, .. } if path == "$.token"),
            "{err}"
        );
        let fine = json!({"amount": 6});
        assert!(check_edited_args(&row, &fine, &ArgLimits::default()).is_ok());
    }

    #[test]
    fn reasoning_with_nul_is_journaled_all_the_same() {
        assert_eq!(cap_reasoning("a\0b"), "a\u{FFFD}b");
    }

    #[test]
    fn an_edit_without_a_recorded_schema_is_refused() {
        let row = requested(json!({"amount": 5}), None);
        let err = check_edited_args(&row, &json!({"amount": 6}), &ArgLimits::default())
            .expect_err("refused");
        assert!(err.to_string().contains("no argument schema"), "{err}");
    }

    #[test]
    fn reasoning_is_capped_at_a_char_boundary() {
        let long = "é".repeat(MAX_REASONING_BYTES);
        let capped = cap_reasoning(&long);
        assert!(capped.len() < long.len());
        assert!(capped.ends_with("bytes in all]"));
        assert_eq!(cap_reasoning("short"), "short");
    }

    #[test]
    fn pointers_become_paths() {
        assert_eq!(pointer_to_path(""), "$");
        assert_eq!(pointer_to_path("/items/0/a~1b"), "$.items[0].a/b");
    }
}
