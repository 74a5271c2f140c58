//! Identifiers of sessions and journal rows.

use std::fmt;

use serde::{Deserialize, Serialize};

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            /// Wraps an existing id.
            pub fn new(id: impl Into<String>) -> Self {
                Self(id.into())
            }

            /// A fresh random id (UUID v4).
            pub fn random() -> Self {
                Self(uuid::Uuid::new_v4().to_string())
            }

            /// The id as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl From<&str> for $name {
            fn from(s: &str) -> Self {
                Self(s.to_owned())
            }
        }

        impl From<String> for $name {
            fn from(s: String) -> Self {
                Self(s)
            }
        }
    };
}

id_type!(
    /// The id of a session (an agent run).
    SessionId
);
id_type!(
    /// The id of a journal row (a tool call or model call).
    CallId
);

/// The most bytes an id (session id, owner, app version) may have: enough for any UUID,
/// hostname-pid or path-like name, and small enough for an index row on every backend.
pub const MAX_ID_BYTES: usize = 256;
