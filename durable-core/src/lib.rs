#![cfg_attr(docsrs, feature(doc_cfg))]
//! The core of `durable`: replay classes, call identity, the journal protocol, sessions
//! and the [`CheckpointStore`] trait that backends implement.
//!
//! Most users depend on the `durable` facade crate instead, which re-exports this crate
//! together with the `#[durable_tool]` attribute and the backends.

pub mod approval;
pub mod args;
pub mod canonical;
pub mod config;
#[cfg(any(test, feature = "conformance"))]
#[cfg_attr(docsrs, doc(cfg(feature = "conformance")))]
pub mod conformance;
mod encode;
pub mod error;
mod event;
pub mod ids;
pub mod integrity;
pub mod journal;
pub mod redact;
pub mod replay;
pub mod replay_check;
pub mod retry;
pub mod runtime;
pub mod schema;
pub mod secret;
pub mod session;
pub mod sizes;
pub mod snapshot;
pub mod store;
pub mod telemetry;
pub mod tool;
pub mod tool_bounds;
pub mod toolbox;
pub mod transcript;
pub mod validate;
pub mod verify;
pub mod worker;

pub use args::{ArgLimits, ArgumentError, ArgumentErrorKind};
pub use error::{DurableError, StoreError};
pub use ids::{CallId, SessionId};
pub use journal::{CallError, CallEvent, Journal, Outcome, RecordedFailure};
pub use replay::ReplayClass;
pub use retry::{RetryError, RetryPolicy, retry};
pub use runtime::{Durable, DurableBuilder, ForkOptions, Operator, StartOptions};
pub use schema::{McpAnnotations, SchemaError, SchemaErrorKind};
pub use session::{InDoubtAction, InDoubtCall, ResumeReport, Resumed, Session};
pub use snapshot::{
    Budget, BudgetExceeded, Plan, PlanError, Postcondition, Spend, Step, StepStatus,
};
pub use store::CheckpointStore;
pub use tool::{IdempotencyKey, ToolContext, ToolSpec, Verification};
pub use toolbox::{
    Definitions, IncompleteExport, ModelToolCall, Tool, ToolArguments, ToolOutput, ToolResult,
    Toolbox, ToolboxError,
};
pub use transcript::{Block, Message, Role, ToolCallBlock, ToolResultBlock};
pub use worker::{PoolReport, ShutdownSignal, ShutdownTrigger, Worker};
