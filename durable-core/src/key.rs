//! The old path of [`args`](crate::args) and [`canonical`](crate::canonical), hidden and
//! kept only until its last callers (the facade's `json` module, `durable-cli`) name the
//! new modules. Write `durable_core::args::…` or `durable_core::canonical::…`.

pub use crate::args::{
    ArgLimits, ArgumentError, ArgumentErrorKind, MAX_SAFE_INTEGER, MAX_SUPPORTED_DEPTH,
    check_value, parse_arguments, parse_json, to_journal_value,
};
pub use crate::canonical::{canonical_json, input_hash, schema_fingerprint};
