//! What `#[durable_tool]` expansions rely on: the trait bounds a tool's types must meet
//! (each with a readable error when they do not) and the few runtime helpers that
//! generated code calls.
//!
//! The helpers live here rather than in the macro so that there is exactly one
//! implementation of each rule (schema policy, argument decoding, key derivation, the
//! shape of a tool result), shared by generated tools and hand-written [`Tool`] impls.
//!
//! Every bound is a marker trait with a blanket impl, so a type never implements it by
//! hand: it holds exactly when the listed traits hold. Its only purpose is the
//! `#[diagnostic::on_unimplemented]` message, which the compiler shows at the user's
//! type (the macro spans its checks there) instead of a bare serde error.
//!
//! [`Tool`]: crate::toolbox::Tool

use std::fmt::Display;
use std::future::{Future, poll_fn};
use std::pin::pin;
use std::sync::{Mutex, OnceLock, PoisonError};
use std::task::Poll;

use futures_util::future::Either;

use schemars::JsonSchema;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::approval::tool_rule;
use crate::args::path::render_serde_path;
use crate::args::{ArgumentErrorKind, to_journal_value};
use crate::error::DurableError;
use crate::ids::SessionId;
use crate::journal::{CallError, ToolCall};
use crate::store::ApprovalRequest;
use crate::tool_spec::{IdempotencyKey, ToolContext, ToolSpec, Verification};
use crate::toolbox::ToolOutput;

pub use crate::toolbox::BoxFuture;

/// A type a tool can take as an argument: a field of the generated argument struct, or
/// the struct of a tool written in the struct-argument form.
///
/// Arguments are read from the model's JSON (`Deserialize`), described to it
/// (`JsonSchema`), journaled and passed back on typed calls (`Serialize`), and shared by
/// the tool body and its verify hook across `.await` points (`Clone + Send + Sync`).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a tool argument",
    label = "not a tool argument",
    note = "tool arguments are read from the model's JSON and described to it by a JSON schema: \
            derive `serde::Serialize`, `serde::Deserialize`, `schemars::JsonSchema` and `Clone` for `{Self}`, \
            and keep it `Send + Sync`"
)]
pub trait ToolArgument:
    Serialize + DeserializeOwned + JsonSchema + Clone + Send + Sync + 'static
{
}

impl<T> ToolArgument for T where
    T: Serialize + DeserializeOwned + JsonSchema + Clone + Send + Sync + 'static
{
}

/// A type a tool can return on success: it is recorded in the journal (`Serialize`) and
/// returned again on replay (`Deserialize`).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a tool result",
    label = "not a tool result",
    note = "a tool's result is recorded in the journal and returned again on replay: \
            derive `serde::Serialize` and `serde::Deserialize` for `{Self}`, and keep it `Send`"
)]
pub trait ToolOutputValue: Serialize + DeserializeOwned + Send {}

impl<T> ToolOutputValue for T where T: Serialize + DeserializeOwned + Send {}

/// A type a tool can fail with: the journal records its `Display` text.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a tool error",
    label = "not a tool error",
    note = "a tool's error is recorded by its message and shown to the model: \
            implement `std::fmt::Display` for `{Self}` (e.g. with `thiserror`), and keep it `Send`"
)]
pub trait ToolErrorValue: Display + Send {}

impl<T> ToolErrorValue for T where T: Display + Send {}

/// The return type of a tool: `Result<T, E>`, spelled out or through an alias such as
/// `std::io::Result<T>` or `anyhow::Result<T>`.
#[diagnostic::on_unimplemented(
    message = "a tool must return `Result<T, E>`, not `{Self}`",
    label = "not a `Result`",
    note = "return `Result<T, E>` where `T` is the value recorded for the model and `E` the failure it reads"
)]
pub trait ToolReturn {
    /// The success type.
    type Ok;
    /// The error type.
    type Err;
    /// Converts into a plain `Result`.
    fn into_result(self) -> Result<Self::Ok, Self::Err>;
}

impl<T, E> ToolReturn for Result<T, E> {
    type Ok = T;
    type Err = E;
    fn into_result(self) -> Result<T, E> {
        self
    }
}

/// Runs a journaled call with no verify hook: [`ToolCall::run`] with the tool bounds
/// spelled as this module's marker traits, so that a result or error type that does not
/// fit is reported with their notes (and at the span generated code gives the call).
pub async fn run_tool<T, E, F, Fut>(call: ToolCall<'_>, run: F) -> Result<T, CallError<E>>
where
    T: ToolOutputValue,
    E: ToolErrorValue,
    F: FnMut(ToolContext) -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    call.run(run).await
}

/// [`ToolCall::run_verified`] with the tool bounds spelled as marker traits (see
/// [`run_tool`]).
pub async fn run_tool_verified<T, E, F, Fut, V, VFut>(
    call: ToolCall<'_>,
    run: F,
    verify: V,
) -> Result<T, CallError<E>>
where
    T: ToolOutputValue,
    E: ToolErrorValue,
    F: FnMut(ToolContext) -> Fut,
    Fut: Future<Output = Result<T, E>>,
    V: FnOnce(ToolContext) -> VFut,
    VFut: Future<Output = Verification<T>>,
{
    call.run_verified(run, verify).await
}

/// Runs a journaled `idempotent_with_key` call whose body receives the call's
/// [`IdempotencyKey`]: the derived key on the first execution, the recorded one, verbatim,
/// on a re-execution.
///
/// The journal records a key with every keyed call, so the key is always there. Should a
/// record hold none (see [`DurableError::ReplayUnsafe`]), the body does not run: the
/// journaled call is dropped before its outcome is recorded, exactly as a cancelled call
/// is, so the call stays in doubt, and the error is returned as
/// [`CallError::Durable`]. Never an empty or made-up key.
pub async fn run_tool_keyed<T, E, F, Fut>(call: ToolCall<'_>, mut run: F) -> Result<T, CallError<E>>
where
    T: ToolOutputValue,
    E: ToolErrorValue,
    F: FnMut(ToolContext, IdempotencyKey) -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let refused: Mutex<Option<DurableError>> = Mutex::new(None);
    let journaled = call.run(|ctx: ToolContext| match ctx.recorded_key() {
        Ok(key) => Either::Left(run(ctx, key)),
        Err(error) => {
            *refused.lock().unwrap_or_else(PoisonError::into_inner) = Some(error);
            Either::Right(std::future::pending())
        }
    });
    let mut journaled = pin!(journaled);
    poll_fn(|cx| {
        if let Poll::Ready(result) = journaled.as_mut().poll(cx) {
            return Poll::Ready(result);
        }
        // The body was refused and the journal now waits on a future that never ends:
        // returning drops it, and with it the journal's hold on the call.
        match refused
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            Some(error) => Poll::Ready(Err(CallError::Durable(error))),
            None => Poll::Pending,
        }
    })
    .await
}

/// The key a keyed tool's `idempotency_key` rule derived, refused when empty: an empty
/// key deduplicates nothing, so the call must not reach the upstream with it.
///
/// # Errors
/// [`DurableError::Encode`] naming the tool when `key` is empty; nothing is journaled or
/// run for such a call.
pub fn checked_key(spec: &ToolSpec, key: String) -> Result<String, DurableError> {
    if key.is_empty() {
        return Err(DurableError::Encode {
            what: format!("the idempotency key of `{}`", spec.name),
            detail: "the `idempotency_key` rule derived an empty key from these arguments, and an \
                     empty key deduplicates nothing; derive it from arguments that cannot be empty \
                     (nothing was journaled or run)"
                .into(),
        });
    }
    Ok(key)
}

/// A per-call approval rule (`#[durable_tool(approval = needs_approval)]`): a fn over the
/// tool's typed arguments saying whether this call needs a person's approval.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot decide whether a call needs approval",
    label = "not a `fn(&{A}) -> bool`",
    note = "`approval = <path>` names a fn that takes the tool's arguments and says whether the \
            call needs approval: `fn(&{A}) -> bool`; for every call, write `approval = \"required\"`"
)]
pub trait ApprovalRule<A> {
    /// Whether the call with `args` needs approval.
    fn needs_approval(&self, args: &A) -> bool;
}

impl<A, F: Fn(&A) -> bool> ApprovalRule<A> for F {
    fn needs_approval(&self, args: &A) -> bool {
        self(args)
    }
}

/// The request a tool's `approval = <rule>` journals for `args`, when the rule asks for
/// one ([`tool_rule`]); `None` runs the call.
pub fn rule_request<A, R: ApprovalRule<A>>(
    spec: &ToolSpec,
    rule: R,
    args: &A,
) -> Option<ApprovalRequest> {
    rule.needs_approval(args).then(|| tool_rule(spec))
}

/// The arguments a generated tool's body runs with: the call's own, or those a person
/// edited before approving it.
///
/// The journal hands edited arguments (as JSON) to the check [`check`](Self::check)
/// returns ([`ToolCall::accept_edits`]) before anything runs; it decodes them, keeps
/// them here and derives the call's idempotency key from them. The run (and verify)
/// closures then take [`or`](Self::or) of the arguments the call was made with.
pub struct EditedArgs<A> {
    edited: OnceLock<A>,
}

impl<A> Default for EditedArgs<A> {
    fn default() -> Self {
        Self::new()
    }
}

impl<A> EditedArgs<A> {
    /// An empty slot: the call runs with its own arguments unless an approval edits them.
    pub fn new() -> Self {
        EditedArgs {
            edited: OnceLock::new(),
        }
    }
}

impl<A: DeserializeOwned + Clone + Send + Sync> EditedArgs<A> {
    /// The check to give [`ToolCall::accept_edits`]: decodes the edited arguments with
    /// [`decode_args`] (so a misfit is [`DurableError::ArgumentsMismatch`] naming the
    /// JSON path), keeps them, and returns `key` of them: the idempotency key derived
    /// from the edited arguments for a keyed tool, `Ok(None)` for the others.
    pub fn check<'a, K>(
        &'a self,
        spec: &'a ToolSpec,
        key: K,
    ) -> impl FnOnce(&Value) -> Result<Option<String>, DurableError> + Send + 'a
    where
        K: FnOnce(&A) -> Result<Option<String>, DurableError> + Send + 'a,
    {
        move |edited: &Value| {
            let args: A = decode_args(spec, edited)?;
            let key = key(&args)?;
            // The journal takes the edits once per call; a second value would be the same.
            let _ = self.edited.set(args);
            Ok(key)
        }
    }

    /// The edited arguments when an approval edited them, else a clone of `original`.
    pub fn or(&self, original: &A) -> A {
        self.edited.get().unwrap_or(original).clone()
    }
}

/// Compile-time check used by generated code: `T` is a [`ToolArgument`].
pub fn assert_tool_argument<T: ToolArgument>() {}

/// Compile-time check used by generated code: `T` is a [`ToolReturn`].
pub fn assert_tool_return<T: ToolReturn>() {}

/// The argument schema of a generated tool: [`schema_for`](crate::schema::schema_for)
/// (the crate's one schema policy: draft 2020-12, subschemas inlined) without `$schema`
/// and without the root `title`. The title is the Rust type's name, which means nothing
/// to a model; dropping it keeps the schema fingerprint stable when the type is renamed.
/// The root `description`, if the type has one, is kept.
pub fn args_schema<A: JsonSchema>() -> Value {
    let mut schema = crate::schema::schema_for::<A>();
    if let Value::Object(map) = &mut schema {
        map.remove("title");
        map.remove("$schema");
    }
    schema
}

/// The description text of a tool from its doc-comment lines (one `#[doc]` attribute
/// each): the single leading space rustdoc leaves on each line is removed, lines are
/// joined with `\n`, and the whole is trimmed.
pub fn doc_text(lines: &[&str]) -> String {
    let joined = lines
        .iter()
        .flat_map(|chunk| chunk.split('\n'))
        .map(|line| line.strip_prefix(' ').unwrap_or(line))
        .collect::<Vec<_>>()
        .join("\n");
    joined.trim().to_owned()
}

/// Decodes a model's arguments into the tool's argument type.
///
/// # Errors
/// [`DurableError::ArgumentsMismatch`] naming the tool and the JSON path of the first
/// offending value (`$` for the root, then `.field` and `[index]`), with serde's
/// message. Nothing is journaled for such a call.
///
/// serde quotes the offending value (`invalid type: string "hunter2", expected u32`):
/// for a value inside a secret argument the message says only that it does not fit, and
/// a clear secret value quoted anywhere else is cut out (see [`secret`](crate::secret)).
pub fn decode_args<A: DeserializeOwned>(spec: &ToolSpec, args: &Value) -> Result<A, DurableError> {
    serde_path_to_error::deserialize(args).map_err(|error| {
        let path = render_serde_path(error.path());
        let message = crate::secret::redact_message(
            &spec.name,
            &spec.secret_args,
            args,
            &path,
            error.inner().to_string(),
        );
        DurableError::ArgumentsMismatch {
            tool: spec.name.clone(),
            path,
            message,
        }
    })
}

/// Encodes typed arguments (a typed call) into the JSON the journal records and hashes,
/// with [`to_journal_value`]: the same rules as arguments a model sends as text.
///
/// # Errors
/// - [`DurableError::InvalidArguments`] when an argument holds a non-finite float
///   (`serde_json` would write it as `null`, so NaN and ±infinity would share one
///   record), with the JSON path of the value from the arguments' root.
/// - [`DurableError::Encode`] when `serde_json` cannot write the arguments (a map key
///   that is not a string, number or boolean) or their `Serialize` impl fails.
pub fn encode_args<A: Serialize>(spec: &ToolSpec, args: &A) -> Result<Value, DurableError> {
    to_journal_value(args).map_err(|source| match source.kind {
        ArgumentErrorKind::Unserializable(_) => DurableError::Encode {
            what: format!("arguments of `{}`", spec.name),
            detail: source.to_string(),
        },
        _ => DurableError::InvalidArguments {
            tool: spec.name.clone(),
            source,
        },
    })
}

/// Derives an idempotency key from the arguments with the tool's key function.
pub fn derive_key<A, K: Into<String>>(args: &A, key: impl FnOnce(&A) -> K) -> String {
    key(args).into()
}

/// Derives an idempotency key from the arguments and the session id.
pub fn derive_key_with_session<A, K: Into<String>>(
    args: &A,
    session: &SessionId,
    key: impl FnOnce(&A, &SessionId) -> K,
) -> String {
    key(args, session).into()
}

/// Turns the outcome of a journaled call into what the model reads.
///
/// A success is serialized as the content; a tool failure, whether it happened now or
/// was recorded by an earlier run, is `{"error": "<message>"}` with `is_error: true`.
///
/// # Errors
/// The runtime's own errors ([`CallError::Durable`]) are passed through. A result that
/// holds a non-finite float is [`DurableError::InvalidValue`] (with the JSON path of the
/// value inside the result), and one that does not serialize is
/// [`DurableError::Encode`].
pub fn tool_output<T: ToolOutputValue, E: ToolErrorValue>(
    spec: &ToolSpec,
    result: Result<T, CallError<E>>,
) -> Result<ToolOutput, DurableError> {
    ToolOutput::from_call(spec, result)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::encode::encode;
    use crate::replay::ReplayClass;
    use serde::Deserialize;
    use serde_json::json;

    #[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Args {
        /// Recipient.
        to: String,
        cc: Option<String>,
        items: Vec<Item>,
    }

    #[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
    struct Item {
        price: u64,
    }

    fn spec() -> ToolSpec {
        ToolSpec::new("send", "Send.", ReplayClass::Pure, args_schema::<Args>())
    }

    fn mismatch(value: Value) -> (String, String) {
        match decode_args::<Args>(&spec(), &value) {
            Err(DurableError::ArgumentsMismatch {
                tool,
                path,
                message,
            }) => {
                assert_eq!(tool, "send");
                (path, message)
            }
            other => panic!("expected ArgumentsMismatch, got {other:?}"),
        }
    }

    #[test]
    fn decode_reports_the_json_path() {
        let (path, message) = mismatch(json!({"to": "a", "items": [{"price": 1}, {"price": "x"}]}));
        assert_eq!(path, "$.items[1].price");
        assert!(message.contains("invalid type"), "{message}");

        let (path, message) = mismatch(json!({"items": []}));
        assert_eq!(path, "$");
        assert!(message.contains("missing field `to`"), "{message}");

        let (path, message) = mismatch(json!({"to": "a", "items": [], "bcc": "x"}));
        assert_eq!(path, "$.bcc");
        assert!(message.contains("unknown field `bcc`"), "{message}");

        let (path, _) = mismatch(json!("not an object"));
        assert_eq!(path, "$");
    }

    #[test]
    fn decode_accepts_null_and_missing_optionals() {
        let spec = spec();
        let with_null: Args =
            decode_args(&spec, &json!({"to": "a", "cc": null, "items": []})).expect("null cc");
        let missing: Args = decode_args(&spec, &json!({"to": "a", "items": []})).expect("no cc");
        assert_eq!(with_null, missing);
        assert_eq!(with_null.cc, None);
    }

    #[test]
    fn schema_is_inlined_untitled_and_described() {
        let schema = args_schema::<Args>();
        assert!(schema.get("title").is_none(), "{schema}");
        assert!(schema.get("$schema").is_none(), "{schema}");
        assert!(schema.get("$defs").is_none(), "{schema}");
        assert_eq!(schema["properties"]["to"]["description"], "Recipient.");
        assert_eq!(schema["properties"]["items"]["items"]["type"], "object");
        assert_eq!(schema["additionalProperties"], false);
        let required: Vec<&str> = schema["required"]
            .as_array()
            .expect("required")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert_eq!(required, ["to", "items"]);
    }

    #[test]
    fn doc_text_strips_rustdoc_spaces() {
        assert_eq!(
            doc_text(&[" Send an email.", "", " Twice?  "]),
            "Send an email.\n\nTwice?"
        );
        assert_eq!(doc_text(&[]), "");
        assert_eq!(doc_text(&[" a\n  b"]), "a\n b");
    }

    #[test]
    fn tool_output_shapes() {
        let spec = spec();
        let ok = tool_output::<_, String>(&spec, Ok(json!({"id": 1}))).expect("ok");
        assert_eq!(
            ok,
            ToolOutput {
                content: json!({"id": 1}),
                is_error: false
            }
        );
        let failed = tool_output::<Value, _>(&spec, Err(CallError::Tool("boom"))).expect("tool");
        assert_eq!(
            failed,
            ToolOutput {
                content: json!({"error": "boom"}),
                is_error: true
            }
        );
        let recorded = tool_output::<Value, String>(
            &spec,
            Err(CallError::Recorded(crate::journal::RecordedFailure {
                message: "old".into(),
            })),
        )
        .expect("recorded");
        assert_eq!(recorded.content, json!({"error": "old"}));
        assert!(recorded.is_error);
        let durable = tool_output::<Value, String>(
            &spec,
            Err(CallError::Durable(DurableError::BudgetExceeded(
                crate::snapshot::BudgetExceeded {
                    session: None,
                    limit: crate::snapshot::Limit::Tokens,
                    ceiling: 1,
                    spent: 1,
                    asked: None,
                },
            ))),
        );
        assert!(matches!(durable, Err(DurableError::BudgetExceeded(_))));
    }

    #[test]
    fn non_finite_floats_never_reach_the_journal() {
        #[derive(Serialize, Deserialize)]
        struct Typed {
            items: Vec<Point>,
        }
        #[derive(Serialize, Deserialize)]
        struct Point {
            x: f64,
        }
        let spec = spec();
        for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let args = Typed {
                items: vec![Point { x: 1.0 }, Point { x: bad }],
            };
            match encode_args(&spec, &args) {
                Err(DurableError::InvalidArguments { tool, source }) => {
                    assert_eq!(tool, "send");
                    assert_eq!(source.path, "$.items[1].x");
                    assert_eq!(source.kind, ArgumentErrorKind::NonFinite);
                }
                other => panic!("expected InvalidArguments, got {other:?}"),
            }
            match tool_output::<_, String>(&spec, Ok(args)) {
                Err(error @ DurableError::InvalidValue { .. }) => assert_eq!(
                    error.to_string(),
                    format!(
                        "cannot journal result of `send`: at `$.items[1].x`: {}",
                        ArgumentErrorKind::NonFinite
                    )
                ),
                other => panic!("expected InvalidValue, got {other:?}"),
            }
            match encode(&Some(bad), "plan") {
                Err(DurableError::InvalidValue { what, source }) => {
                    assert_eq!((what.as_str(), source.path.as_str()), ("plan", "$"));
                }
                other => panic!("expected InvalidValue, got {other:?}"),
            }
        }
        // Finite values are encoded as before.
        let args = Typed {
            items: vec![Point { x: -0.0 }],
        };
        assert_eq!(
            encode_args(&spec, &args).expect("finite"),
            serde_json::to_value(&args).expect("finite")
        );
        // What serde_json refuses stays an encoding error.
        let keys = std::collections::BTreeMap::from([(vec![1_u8], 1)]);
        assert!(matches!(
            encode_args(&spec, &keys),
            Err(DurableError::Encode { .. })
        ));
        assert!(matches!(
            tool_output::<_, String>(&spec, Ok(keys)),
            Err(DurableError::Encode { .. })
        ));
    }

    #[test]
    fn edited_args_are_decoded_kept_and_keyed() {
        let spec = spec();
        let original = Args {
            to: "a".into(),
            cc: None,
            items: vec![],
        };
        let slot = EditedArgs::<Args>::new();
        assert_eq!(slot.or(&original), original);
        let check = slot.check(&spec, |edited: &Args| Ok(Some(format!("k:{}", edited.to))));
        let key = check(&json!({"to": "b", "items": [{"price": 3}]})).expect("decoded");
        assert_eq!(key.as_deref(), Some("k:b"));
        assert_eq!(slot.or(&original).to, "b");
        assert_eq!(slot.or(&original).items, [Item { price: 3 }]);

        let refused = EditedArgs::<Args>::new();
        let check = refused.check(&spec, |_: &Args| Ok(None));
        match check(&json!({"to": "b", "items": [{"price": "x"}]})) {
            Err(DurableError::ArgumentsMismatch { path, .. }) => {
                assert_eq!(path, "$.items[0].price");
            }
            other => panic!("expected ArgumentsMismatch, got {other:?}"),
        }
        assert_eq!(refused.or(&original), original);
    }

    #[test]
    fn approval_rules_ask_with_the_tool_rule() {
        fn large(args: &Args) -> bool {
            args.items.iter().any(|i| i.price > 100)
        }
        let spec = spec();
        let mut args = Args {
            to: "a".into(),
            cc: None,
            items: vec![Item { price: 5 }],
        };
        assert!(rule_request(&spec, large, &args).is_none());
        args.items.push(Item { price: 500 });
        let request = rule_request(&spec, large, &args).expect("asked");
        assert_eq!(request.asked_by, "tool send");
    }

    #[test]
    fn keys() {
        let args = Args {
            to: "a".into(),
            cc: None,
            items: vec![],
        };
        assert_eq!(derive_key(&args, |a| format!("k:{}", a.to)), "k:a");
        let session = SessionId::new("s1");
        assert_eq!(
            derive_key_with_session(&args, &session, |a, s| format!("{s}:{}", a.to)),
            "s1:a"
        );
    }
}
