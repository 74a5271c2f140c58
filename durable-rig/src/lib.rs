//! [rig](https://docs.rs/rig-agent) agents on durable: `#[durable_tool]`s as rig tools
//! bound to a session's journal, and a rig completion model whose replies are journaled.
//!
//! A [`DurableRig`] binds a [`Toolbox`] and a model to one session's [`Journal`];
//! [`DurableRig::agent`] hands back rig's own `AgentBuilder`, so the agent loop is rig's:
//!
//! - **The model's replies are journaled** ([`JournaledModel`]): recorded by position
//!   in the step on the first run, returned from the journal on a re-run turn (the
//!   provider is not asked again), the spend taken from the reply's `usage`. This holds
//!   for the agent's default model and for the routes added with [`DurableRig::route`];
//!   a route added with rig's own `model_route` is **not** journaled.
//! - **Every tool call goes through [`Toolbox::dispatch`]**: recorded results are
//!   returned, `pure` and `idempotent_with_key` tools re-run safely, an
//!   `unsafe_on_replay` call left in doubt by a crash is refused until an operator
//!   resolves it. The arguments dispatched are the text the provider sent, taken from
//!   the journaled reply by call id (rig itself hands tools a re-serialization, in which
//!   a duplicate key has vanished), when rig dispatches what it read from that text;
//!   when a hook rewrote the arguments (`DispatchAction::Patch`), rig's arguments are
//!   dispatched. Blank text is `{}`, as rig reads it. The model's call id is passed
//!   through, for the `execute_tool` span. Both need the [`CallIds`] hook and the
//!   [`JournaledModel`] of the same binding, which [`DurableRig::agent`] installs;
//!   without them a tool gets rig's re-serialized arguments and a call id of its own.
//! - **Secrets**: `#[secret]` arguments are masked in the journaled replies by durable's
//!   vault; arguments to a tool with secret arguments that are not a JSON object (which
//!   rig keeps as text, `invalid_arguments`) are replaced by a placeholder before the
//!   reply is journaled, and the model is told the call was malformed.
//! - **What the model reads**: a tool's result; a tool failure (now or recorded) as a
//!   failed result `{"error": ...}`; bad arguments as a failed result saying what is
//!   wrong and where ([`ToolResult::refused`](durable_core::ToolResult::refused)). A
//!   tool the agent does not have is answered by rig itself, before any handler.
//!   Any other durable error (a store failure, `ReplayUnsafe`, a lost lease) stops the
//!   run: rig's prompt fails, and [`DurableRig::take_error`] gives the typed error.
//!
//! A rig run is one step of the session: run the prompt, then checkpoint. A process that
//! dies mid-run resumes the session and runs the same prompt again; the journal makes
//! the re-run cheap and safe.
//!
//! # Rules
//!
//! - **Resume with the same prompt, preamble and tools.** Replies are matched by
//!   position in the step, not by request: a re-run with another prompt gets the
//!   recorded replies of the first run back, silently.
//! - **Keep `tool_concurrency` at 1** (rig's default). Identical calls of one turn are
//!   told apart by the order they reach the journal; with concurrent tools that is the
//!   order they finish, which a re-run may not repeat, so a re-run could hand one call
//!   the other's recorded result. Nothing stops a run with more; the binding cannot see
//!   the setting.
//! - **One run at a time per binding**: the call ids, the last reply's arguments and
//!   the stopping error are the binding's, not the run's. Make a [`DurableRig`] per
//!   concurrent run (and session).
//! - **Model selection must repeat on a re-run**: every journaled route shares the
//!   step's positions, so a hook that selects routes must select the same ones again.
//!
//! ```no_run
//! use std::sync::Arc;
//! use durable_core::{Session, Toolbox};
//! use durable_rig::DurableRig;
//! use rig_core::providers::openai::OpenAIConfig;
//!
//! # async fn demo(mut session: Session<serde_json::Value>, toolbox: Toolbox)
//! # -> Result<(), Box<dyn std::error::Error>> {
//! let model = OpenAIConfig::new("sk-...").client().chat("gpt-4o-mini");
//! let rig = DurableRig::new(session.journal().clone(), Arc::new(toolbox));
//! let agent = rig.agent(model)?.preamble("You run a shop.").build();
//! match agent.prompt("Order a mug for ada@example.com").max_turns(5).run().await {
//!     Ok(reply) => {
//!         session.push(serde_json::json!({"role": "assistant", "content": reply.output()}));
//!         session.checkpoint().await?;
//!     }
//!     // A durable refusal (e.g. `ReplayUnsafe`: an operator decides), typed.
//!     Err(error) => match rig.take_error() {
//!         Some(durable) => return Err(durable.into()),
//!         None => return Err(error.into()),
//!     },
//! }
//! # Ok(()) }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

mod model;
mod shared;
mod stream;
mod tools;

use std::sync::Arc;

use durable_core::schema::SchemaError;
use durable_core::{DurableError, Journal, Toolbox};
use rig_agent::AgentBuilder;
use rig_agent::agent::WithToolServerHandle;
use rig_agent::agent::{
    AgentHook, DispatchAction, DispatchEvent, HookContext, OutcomeAction, OutcomeEvent, RunStart,
    RunStartAction,
};
use rig_agent::tool::RegisteredTool;
use rig_agent::tool::server::{ToolServer, ToolServerHandle};
use rig_core::DynModel;
use rig_core::completion::ModelRef;
use rig_core::effect::EffectKind;
use rig_core::error::ErrorReport;
use rig_core::operation::Completion;

pub use model::{JournaledModel, spend_of, usage_of};
pub use stream::StreamedResponse;
pub use tools::DurableTool;
/// The rig crates this one is built against (`rig-core`, `rig-agent` 0.44), for a harness
/// that wants their exact versions.
pub use {rig_agent, rig_core};

use shared::Shared;

/// The label rig registers an agent's default model under.
const DEFAULT_MODEL: &str = "default";

/// A [`Toolbox`] and rig models bound to one session's [`Journal`].
///
/// Cheap to clone (clones share the binding). Make one per session (per resumed
/// session, with the new session's journal), and run one prompt at a time with it.
#[derive(Clone, Debug)]
pub struct DurableRig {
    journal: Journal,
    toolbox: Arc<Toolbox>,
    shared: Arc<Shared>,
}

impl DurableRig {
    /// Binds `toolbox` to `journal` (a session's [`journal`](durable_core::Session::journal)).
    pub fn new(journal: Journal, toolbox: Arc<Toolbox>) -> Self {
        let secret_tools = toolbox
            .specs()
            .filter(|spec| !spec.secret_args.is_empty())
            .map(|spec| spec.name.clone())
            .collect();
        DurableRig {
            journal,
            toolbox,
            shared: Arc::new(Shared::new(secret_tools)),
        }
    }

    /// Makes the journaled models' calls wait for their turn under the fleet-wide rate
    /// limit `name` (see [`durable_core::limiter`]; define it with
    /// [`DurableBuilder::rate_limit`](durable_core::DurableBuilder::rate_limit)); a reply
    /// returned from the journal does not wait, and each reply's tokens are charged to
    /// the limit's tokens quota. The toolbox's tools wait under the limits the toolbox
    /// names ([`Toolbox::rate_limit`]).
    ///
    /// ```no_run
    /// # use std::sync::Arc;
    /// # fn demo(session: &durable_core::Session<durable_core::Message>, toolbox: durable_core::Toolbox) {
    /// let rig = durable_rig::DurableRig::new(session.journal().clone(), Arc::new(toolbox))
    ///     .rate_limit("openai:gpt-4.1");
    /// # let _ = rig;
    /// # }
    /// ```
    pub fn rate_limit(mut self, name: &str) -> Self {
        self.journal = self.journal.with_rate_limit(name);
        self
    }

    /// The toolbox's tools as rig tool handlers, each with its argument schema as rig
    /// sends it to the model (draft 2020-12, inlined; see
    /// [`input_schema`](durable_core::schema::input_schema)).
    ///
    /// # Errors
    /// A tool whose schema cannot be exported ([`SchemaError`] names it).
    pub fn tools(&self) -> Result<Vec<DurableTool>, SchemaError> {
        DurableTool::all(&self.toolbox, &self.journal, &self.shared)
    }

    /// The toolbox's tools in a rig tool server (what
    /// `AgentBuilder::tool_server_handle` takes).
    ///
    /// # Errors
    /// A tool whose schema cannot be exported, or that rig refuses to register.
    pub fn tool_server(&self) -> Result<ToolServerHandle, Error> {
        let mut server = ToolServer::new();
        for tool in self.tools()? {
            server = server.registered_tool(RegisteredTool::from_handler(tool)?);
        }
        Ok(server.run())
    }

    /// `model` with its replies journaled, as the rig model handler labelled `label`.
    pub fn model(
        &self,
        label: impl Into<ModelRef>,
        model: impl Into<DynModel<Completion>>,
    ) -> JournaledModel {
        JournaledModel::new(
            label.into(),
            model.into(),
            &self.journal,
            Arc::clone(&self.shared),
        )
    }

    /// A hook that passes the model's call id of each tool call through to the tools
    /// (rig announces it to hooks only). [`agent`](Self::agent) adds it.
    pub fn call_ids(&self) -> CallIds {
        CallIds {
            shared: Arc::clone(&self.shared),
        }
    }

    /// rig's agent builder over `model`, journaled, with the toolbox's tools and the
    /// [`call_ids`](Self::call_ids) hook. Go on configuring it as any rig agent; add
    /// other models with [`route`](Self::route), not rig's `model_route` (unjournaled).
    ///
    /// The model is registered as rig registers an agent's default model, then its
    /// handler is replaced by the [`JournaledModel`] under the same label, so rig keeps
    /// the model's id and capabilities and the default model's completions go through
    /// the journal.
    ///
    /// Run it with rig's default `tool_concurrency` of 1 (see the crate docs): with
    /// more, identical calls of one turn may get each other's results on a re-run.
    ///
    /// # Errors
    /// As [`tool_server`](Self::tool_server).
    pub fn agent(
        &self,
        model: impl Into<DynModel<Completion>>,
    ) -> Result<AgentBuilder<WithToolServerHandle>, Error> {
        let model = model.into();
        let journaled = self.model(DEFAULT_MODEL, model.clone());
        Ok(AgentBuilder::named_model(DEFAULT_MODEL, model)
            .model_route_handler(DEFAULT_MODEL, journaled)
            .add_hook(self.call_ids())
            .tool_server_handle(self.tool_server()?))
    }

    /// `builder` with `model` as the route `label`, journaled (rig's `model_route`, with
    /// its handler replaced by the [`JournaledModel`], as [`agent`](Self::agent) does
    /// for the default model).
    pub fn route<S>(
        &self,
        builder: AgentBuilder<S>,
        label: impl Into<ModelRef>,
        model: impl Into<DynModel<Completion>>,
    ) -> AgentBuilder<S> {
        let label = label.into();
        let model = model.into();
        let journaled = self.model(label.clone(), model.clone());
        builder
            .model_route(label.clone(), model)
            .model_route_handler(label, journaled)
    }

    /// The durable error that stopped the last run (store failure, `ReplayUnsafe`,
    /// lease lost, ...), once: rig's own error only carries its message. A new run (with
    /// the [`CallIds`] hook) forgets an error not taken.
    pub fn take_error(&self) -> Option<DurableError> {
        self.shared.take_error()
    }

    /// The journal the binding records into.
    pub fn journal(&self) -> &Journal {
        &self.journal
    }
}

/// The rig hook that notes the model's call id of each tool dispatch for the
/// [`DurableTool`]s of the same [`DurableRig`] (built by [`DurableRig::call_ids`]); it
/// forgets the id at the dispatch's outcome, and the last run's error when a run starts.
#[derive(Debug, Clone)]
pub struct CallIds {
    shared: Arc<Shared>,
}

impl AgentHook for CallIds {
    fn name(&self) -> Option<String> {
        Some("durable_rig::CallIds".to_owned())
    }

    async fn on_dispatch(&self, _ctx: &HookContext, event: DispatchEvent<'_>) -> DispatchAction {
        if let (EffectKind::ToolCall { .. }, Some(call_id)) = (event.kind, event.call_id) {
            self.shared.note_call_id(event.id, call_id.to_string());
        }
        DispatchAction::Proceed
    }

    async fn on_outcome(&self, _ctx: &HookContext, event: OutcomeEvent<'_>) -> OutcomeAction {
        // A dispatch no durable tool served (rig answered it, or a hook did).
        self.shared.take_call_id(event.id);
        OutcomeAction::Proceed
    }

    async fn on_run_start(&self, _ctx: &HookContext, _event: RunStart<'_>) -> RunStartAction {
        self.shared.take_error();
        RunStartAction::Continue
    }
}

/// Why the tools could not be handed to rig.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A tool's argument schema could not be exported.
    #[error(transparent)]
    Schema(#[from] SchemaError),
    /// rig refused to register a tool.
    #[error("rig refused a durable tool: {0}")]
    Rig(Box<ErrorReport>),
}

impl From<ErrorReport> for Error {
    fn from(report: ErrorReport) -> Self {
        Error::Rig(Box::new(report))
    }
}
