//! Every refusal of the decision table reaches the runtime's event hook
//! ([`DurableBuilder::on_call`](durable_core::DurableBuilder::on_call)) as an event with outcome
//! `refused`, each driven through the public API as a harness meets it.

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use serde_json::{Value, json};

use super::runtime::{
    Events, call, call_with_args_and_die, email_in_doubt, outcomes, runtime, spec, start, take_over,
};
use durable_core::ToolSpec;
use durable_core::approval;
use durable_core::error::DurableError;
use durable_core::ids::CallId;
use durable_core::journal::{CallError, Journal, Outcome, Refusal};
use durable_core::replay::ReplayClass;
use durable_core::store::{CallKind, CheckpointStore, IssueOutcome, NewCall};
use durable_core::toolbox::{BoxFuture, ModelToolCall, Tool, ToolOutput, ToolResult, Toolbox};
use durable_core::transcript::Message;

/// Every refusal, each once. A new [`Refusal`] fails to compile in [`provoke`] until it
/// has a case there; list it here too.
const REFUSALS: [Refusal; 7] = [
    Refusal::SchemaChanged,
    Refusal::SecretUnavailable,
    Refusal::SecretWithheld,
    Refusal::EditsRefused,
    Refusal::NoRecordedKey,
    Refusal::NotVerified,
    Refusal::InFlight,
];

/// Each refusal of the decision table, provoked as a harness meets it, is reported to the
/// event hook as `refused` for the refused tool, and returns its error.
pub async fn runtime_every_refusal_is_reported_as_refused(store: Arc<dyn CheckpointStore>) {
    for refusal in REFUSALS {
        let (tool, events, refused, returned) = provoke(refusal, &store).await;
        assert!(
            refused,
            "{refusal:?}: the call returns the refusal's error, not {returned}"
        );
        let seen = outcomes(&events);
        assert!(
            seen.contains(&(tool.clone(), Outcome::Refused)),
            "{refusal:?}: the hook saw `{tool}` refused: {seen:?}"
        );
    }
}

/// Provokes `refusal` on a session of its own: the refused tool's name, the events of
/// the runtime that refused it, whether the call returned the refusal's error, and what
/// it returned.
async fn provoke(
    refusal: Refusal,
    store: &Arc<dyn CheckpointStore>,
) -> (String, Events, bool, String) {
    let effects = Arc::new(AtomicUsize::new(0));
    match refusal {
        // The same call, resumed by code whose argument schema changed.
        Refusal::SchemaChanged => {
            let (id, email, _) =
                email_in_doubt(store, spec("email", ReplayClass::UnsafeOnReplay)).await;
            let (resumed, events) = take_over(store, &id, "second").await;
            let reshaped = ToolSpec::new(
                "email",
                "test tool email",
                ReplayClass::UnsafeOnReplay,
                json!({"type": "object", "properties": {"n": {"type": "string"}}}),
            );
            assert_ne!(reshaped.fingerprint, email.fingerprint);
            let err = call(&resumed.session, &reshaped, 1, None, &effects).await;
            let refused = matches!(
                err,
                Err(CallError::Durable(DurableError::SchemaChanged { .. }))
            );
            ("email".into(), events, refused, format!("{err:?}"))
        }
        // A call sent with a secret's masked form, whose value this process never held.
        Refusal::SecretUnavailable => {
            let tool = "refusals_secret_pure";
            let secretive = spec(tool, ReplayClass::Pure).with_secret_args(["password"]);
            let (durable, events) = runtime(store, "first");
            let first = start(&durable).await;
            let masked =
                masked_args(store, &first, &secretive, json!({"n": 1, "password": "pw"})).await;
            let other = start(&durable).await;
            let err = dispatch(&other, &secretive, masked).await;
            let refused = matches!(&err, Err(DurableError::InvalidArguments { .. }));
            (tool.into(), events, refused, format!("{err:?}"))
        }
        // An `unsafe_on_replay` call in doubt after a restart, its secret gone with it.
        Refusal::SecretWithheld => {
            let tool = "refusals_secret_unsafe";
            let secretive = spec(tool, ReplayClass::UnsafeOnReplay).with_secret_args(["code"]);
            let (durable, _) = runtime(store, "first");
            let session = start(&durable).await;
            call_with_args_and_die(
                &session,
                &secretive,
                json!({"n": 1, "code": "1234"}),
                None,
                &effects,
            )
            .await;
            let id = session.id().clone();
            let rows = store.calls(&id, None).await.expect("calls");
            let masked = rows[0].args.clone();
            let (resumed, events) = take_over(store, &id, "second").await;
            let err = dispatch(&resumed.session, &secretive, masked).await;
            let refused = matches!(
                &err,
                Err(DurableError::ReplayUnsafe { reason, .. }) if reason.contains("secret argument")
            );
            (tool.into(), events, refused, format!("{err:?}"))
        }
        // Approved with edited arguments, run by a call site that takes no edits.
        Refusal::EditsRefused => {
            let refund = spec("refund", ReplayClass::UnsafeOnReplay);
            let (durable, _) = runtime(store, "first");
            let session = start(&durable).await;
            let asked = session
                .journal()
                .tool(&refund, json!({"n": 9}))
                .require_approval(approval::tool_rule(&refund))
                .run(|_ctx| async { Ok::<_, String>(json!("ran")) })
                .await;
            let call_id: CallId = match asked {
                Err(CallError::Durable(DurableError::AwaitingApproval { call, .. })) => call,
                other => panic!("expected AwaitingApproval, got {other:?}"),
            };
            let id = session.id().clone();
            session.await_approval().await.expect("park");
            durable
                .operator()
                .approve(&call_id, Some(json!({"n": 8})), "alice", None)
                .await
                .expect("approve");
            let (durable, events) = runtime(store, "second");
            let resumed = durable.resume::<Message>(&id).await.expect("resume");
            let err = run(&resumed.session, &refund, json!({"n": 9})).await;
            let refused = matches!(
                err,
                Err(CallError::Durable(DurableError::ApprovedCallRefused { .. }))
            );
            ("refund".into(), events, refused, format!("{err:?}"))
        }
        // In doubt since before the tool became keyed: no key to re-run with.
        Refusal::NoRecordedKey => {
            let (id, _, _) =
                email_in_doubt(store, spec("charge", ReplayClass::UnsafeOnReplay)).await;
            let (resumed, events) = take_over(store, &id, "second").await;
            let keyed = spec("charge", ReplayClass::IdempotentWithKey);
            let err = call(&resumed.session, &keyed, 1, Some("k-1"), &effects).await;
            let refused = matches!(
                &err,
                Err(CallError::Durable(DurableError::ReplayUnsafe { reason, .. }))
                    if reason.contains("no idempotency key")
            );
            ("charge".into(), events, refused, format!("{err:?}"))
        }
        // In doubt `unsafe_on_replay`, and no verify hook to tell.
        Refusal::NotVerified => {
            let (id, email, _) =
                email_in_doubt(store, spec("email", ReplayClass::UnsafeOnReplay)).await;
            let (resumed, events) = take_over(store, &id, "second").await;
            let err = call(&resumed.session, &email, 1, None, &effects).await;
            let refused = matches!(
                &err,
                Err(CallError::Durable(DurableError::ReplayUnsafe { reason, .. }))
                    if reason.contains("verify hook")
            );
            ("email".into(), events, refused, format!("{err:?}"))
        }
        // Another holder of the lease issued the same call first (its row written after
        // this journal read the step), and its outcome is not recorded.
        Refusal::InFlight => {
            let email = spec("email", ReplayClass::UnsafeOnReplay);
            let (durable, events) = runtime(store, "first");
            let session = start(&durable).await;
            // The journal reads the step's rows once, at its first call.
            call(
                &session,
                &spec("read", ReplayClass::Pure),
                0,
                None,
                &effects,
            )
            .await
            .expect("a pure read");
            let read = store.calls(session.id(), None).await.expect("calls");
            let step = read[0].identity.step;
            // The identity the call has, from a session of its own.
            let elsewhere = start(&durable).await;
            call(&elsewhere, &email, 1, None, &effects)
                .await
                .expect("the email runs elsewhere");
            let row = &store.calls(elsewhere.id(), None).await.expect("calls")[0];
            let mut identity = row.identity.clone();
            identity.session = session.id().clone();
            identity.step = step;
            let raced = store
                .issue_call(
                    session.journal().lease().fence(),
                    NewCall {
                        id: CallId::random(),
                        kind: CallKind::Tool,
                        identity,
                        class: ReplayClass::UnsafeOnReplay,
                        args: row.args.clone(),
                        idempotency_key: None,
                        schema_hash: email.fingerprint.clone(),
                    },
                )
                .await
                .expect("the other holder's issue");
            assert!(matches!(raced, IssueOutcome::Inserted(_)), "{raced:?}");
            let err = call(&session, &email, 1, None, &effects).await;
            let refused = matches!(
                &err,
                Err(CallError::Durable(DurableError::ReplayUnsafe { reason, .. }))
                    if reason.contains("in flight")
            );
            ("email".into(), events, refused, format!("{err:?}"))
        }
    }
}

/// A tool that runs `spec` with the arguments it is given; the body returns `"ran"`.
struct Runs(ToolSpec);

impl Tool for Runs {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }

    fn invoke<'a>(
        &'a self,
        journal: &'a Journal,
        args: Value,
    ) -> BoxFuture<'a, Result<ToolOutput, DurableError>> {
        Box::pin(async move {
            let ran = journal
                .tool(&self.0, args)
                .run(|_ctx| async { Ok::<_, String>(json!("ran")) })
                .await;
            ToolOutput::from_call(&self.0, ran)
        })
    }
}

/// A model's call of `spec` with `args`, dispatched through a toolbox, as a harness
/// dispatches a replayed reply (a masked secret in it is one this process lacks).
async fn dispatch(
    session: &durable_core::Session<Message>,
    spec: &ToolSpec,
    args: Value,
) -> Result<ToolResult, DurableError> {
    let tools = Toolbox::new().with(Runs(spec.clone())).expect("a toolbox");
    tools
        .dispatch(
            session.journal(),
            &ModelToolCall::new("call-1", spec.name.clone(), args),
        )
        .await
}

/// Runs `spec` with `args` on `session`; the body returns `"ran"`.
async fn run(
    session: &durable_core::Session<Message>,
    spec: &ToolSpec,
    args: Value,
) -> Result<Value, CallError<String>> {
    session
        .journal()
        .tool(spec, args)
        .run(|_ctx| async { Ok::<_, String>(json!("ran")) })
        .await
}

/// Runs `spec` with `args` on `session` and returns the arguments as journaled (its
/// secrets masked).
async fn masked_args(
    store: &Arc<dyn CheckpointStore>,
    session: &durable_core::Session<Message>,
    spec: &ToolSpec,
    args: Value,
) -> Value {
    run(session, spec, args)
        .await
        .expect("runs with the secret");
    let rows = store.calls(session.id(), None).await.expect("calls");
    let masked = rows[0].args.clone();
    assert!(
        durable_core::secret::is_masked(&masked["password"]),
        "journaled masked: {masked}"
    );
    masked
}
