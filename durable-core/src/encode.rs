//! How values enter the journal: every one (arguments, results, model replies, messages,
//! plan, budget) is serialized through [`to_journal_value`], so a value JSON cannot keep
//! exactly is a typed error instead of a silent `null`.

use serde::Serialize;
use serde_json::Value;

use crate::args::{ArgumentErrorKind, to_journal_value};
use crate::error::DurableError;

/// Serializes a value for the journal with [`to_journal_value`]: a non-finite float is
/// [`DurableError::InvalidValue`], a value `serde_json` cannot write is
/// [`DurableError::Encode`]; `what` names the value in either.
pub(crate) fn encode<T: Serialize + ?Sized>(
    value: &T,
    what: impl std::fmt::Display,
) -> Result<Value, DurableError> {
    if crate::guard_switch::guard_off("finite") {
        return serde_json::to_value(value).map_err(|e| DurableError::Encode {
            what: what.to_string(),
            detail: e.to_string(),
        });
    }
    to_journal_value(value).map_err(|source| match source.kind {
        ArgumentErrorKind::Unserializable(_) => DurableError::Encode {
            what: what.to_string(),
            detail: source.to_string(),
        },
        _ => DurableError::InvalidValue {
            what: what.to_string(),
            source,
        },
    })
}
