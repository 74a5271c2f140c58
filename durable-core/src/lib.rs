//! The core of `durable`: replay classes, call identity, the journal protocol, sessions
//! and the [`CheckpointStore`] trait that backends implement.
//!
//! Most users depend on the `durable` facade crate instead, which re-exports this crate
//! together with the `#[durable_tool]` attribute and the backends.

pub mod error;
pub mod ids;
pub mod key;
pub mod replay;
pub mod store;

pub use error::{DurableError, StoreError};
pub use ids::{CallId, SessionId};
pub use key::{ArgLimits, ArgumentError, ArgumentErrorKind};
pub use replay::ReplayClass;
pub use store::CheckpointStore;
