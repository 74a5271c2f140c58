//! Secret arguments: how a `#[secret]` value stays out of everything `durable` writes.
//!
//! A tool argument marked `#[secret]` ([`ToolSpec::secret_args`](crate::ToolSpec::secret_args))
//! is *masked* wherever it would be written: in the journal row of the call, in its input
//! hash, in the journaled model reply that asked for the call (and so in the message the
//! harness pushes, and in exports), and in argument errors. The masked form is
//!
//! ```json
//! {"$secret": "k1:<hex>"}
//! ```
//!
//! where the digest is an HMAC-SHA256 under the store's own key
//! ([`Keyring::digest`](crate::integrity::Keyring::digest)) over the domain
//! `secret:<tool>.<argument>` and the value's canonical JSON: the same secret of the same
//! argument masks alike in one store (so a re-run finds its call), and a dictionary of
//! likely passwords does not reverse it without the store's key.
//!
//! # The path of a secret
//!
//! 1. **The model's reply** is journaled by [`Journal::model`](crate::Journal::model)
//!    with the arguments of every call to a tool with secret arguments masked: any JSON
//!    object whose `name` is such a tool and whose `arguments` (OpenAI, MCP, the default
//!    [`Message`](crate::Message)) or `input` (Anthropic) holds its arguments, as an
//!    object or as JSON text. Arguments text that cannot be read is masked as a whole.
//!    The reply the harness gets back is the journaled one, masked, on the first run as
//!    on a replay; the clear values stay in memory, in the session's journal handle.
//! 2. **Dispatch** ([`Toolbox::dispatch`](crate::Toolbox::dispatch)) puts the clear value
//!    back in place of each masked argument the journal handle holds, and the tool
//!    receives it.
//! 3. **The journal** masks secret arguments again before it hashes or writes the call,
//!    so the row and its input hash carry the masked form only.
//!
//! # After a restart
//!
//! The clear value of a masked argument lives only in the memory of the process that
//! received the reply. A resumed session replays the masked reply, and then:
//!
//! - a call that was **recorded** returns its recorded outcome: it does not need the
//!   secret (its identity is computed from the masked arguments);
//! - a call that **never ran**, or ran without a recorded outcome and would run again
//!   (`pure`, `idempotent_with_key`, or an `unsafe_on_replay` call an operator marked
//!   not happened), is **not run with the placeholder**: dispatch fails with
//!   [`DurableError::InvalidArguments`] of kind
//!   [`SecretUnavailable`](crate::ArgumentErrorKind::SecretUnavailable), which
//!   [`ToolResult::refused`](crate::ToolResult::refused) turns into an error result
//!   asking the model to send the call again with the secret;
//! - an in-doubt `unsafe_on_replay` call is refused as
//!   [`ReplayUnsafe`](crate::DurableError::ReplayUnsafe): neither its verify hook nor a
//!   re-execution can run without the value, so an operator resolves it.
//!
//! # Which tools have secrets
//!
//! A journal learns that a tool has secret arguments from its [`ToolSpec`](crate::ToolSpec): every spec
//! built with [`ToolSpec::with_secret_args`](crate::ToolSpec::with_secret_args) (which
//! `#[durable_tool]` calls for `#[secret]` parameters) is registered for the process, as
//! is every tool added to a [`Toolbox`](crate::Toolbox). Build the toolbox (or call the
//! tool's `spec()`) before the first model call, as telling the model about its tools
//! requires anyway. Tools are told apart by name: two tools of one name in one process
//! share their secret arguments.
//!
//! # What is not covered
//!
//! Only the arguments of the tool call are masked. A secret the harness writes itself
//! (in a user message, a plan, the state), a tool that returns or fails with the secret
//! in its result or error message, or an `idempotency_key` derived from it (which
//! `#[durable_tool]` refuses) is stored as given.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::{Mutex, PoisonError, RwLock};

use serde_json::{Map, Value};

use crate::args::{self, ArgLimits, ArgumentError, ArgumentErrorKind};
use crate::canonical;
use crate::error::DurableError;
use crate::integrity::Keyring;

/// The key of a masked value: `{"$secret": "<digest>"}`.
pub const MARKER: &str = "$secret";

/// The argument name under which arguments masked as a whole are kept (text that did not
/// read as an object of named arguments).
const WHOLE: &str = "$";

/// Tool name → secret argument names, for every tool described in this process.
static REGISTRY: RwLock<BTreeMap<String, BTreeSet<String>>> = RwLock::new(BTreeMap::new());

/// Registers the secret arguments of `tool` for the process (see the
/// [module docs](self#which-tools-have-secrets)).
pub(crate) fn register(tool: &str, secret_args: &[String]) {
    if secret_args.is_empty() {
        return;
    }
    let known = REGISTRY
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .get(tool)
        .is_some_and(|names| secret_args.iter().all(|a| names.contains(a)));
    if !known {
        REGISTRY
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(tool.to_owned())
            .or_default()
            .extend(secret_args.iter().cloned());
    }
}

/// The secret arguments of `tool`: those it declares and those registered under its name.
pub(crate) fn secret_args(tool: &str, declared: &[String]) -> BTreeSet<String> {
    let mut names: BTreeSet<String> = declared.iter().cloned().collect();
    if let Some(registered) = REGISTRY
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .get(tool)
    {
        names.extend(registered.iter().cloned());
    }
    names
}

fn registry() -> BTreeMap<String, BTreeSet<String>> {
    REGISTRY
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
}

/// Whether `value` is a masked secret: an object whose only key is `"$secret"`, holding
/// a string.
pub fn is_masked(value: &Value) -> bool {
    masked_digest(value).is_some()
}

/// The digest of a masked secret.
pub(crate) fn masked_digest(value: &Value) -> Option<&str> {
    let map = value.as_object()?;
    if map.len() != 1 {
        return None;
    }
    map.get(MARKER)?.as_str()
}

/// Whether a masked secret was made with a keyed digest (this release) rather than the
/// bare SHA-256 of earlier releases, whose input hash was computed over the clear value.
pub(crate) fn is_keyed(value: &Value) -> bool {
    masked_digest(value).is_some_and(|d| d.starts_with("k1:"))
}

/// The masked form of `value`, secret argument `arg` of `tool`.
pub(crate) fn mask(
    keyring: &Keyring,
    tool: &str,
    arg: &str,
    value: &Value,
) -> Result<Value, DurableError> {
    // Canonical JSON, so `1.0` and `1` or two key orders mask alike (as they hash alike);
    // a value JCS refuses (never journaled: the journal refuses it first) is digested in
    // its compact form instead.
    let bytes = canonical::canonical_json(value)
        .or_else(|_| serde_json::to_string(value))
        .unwrap_or_default();
    let digest = keyring.digest(&format!("secret:{tool}.{arg}"), bytes.as_bytes())?;
    let mut map = Map::new();
    map.insert(MARKER.to_owned(), Value::String(digest));
    Ok(Value::Object(map))
}

/// Masks the secret arguments of one call in `args` (an object of named arguments),
/// except those in `withheld`, which already hold their masked form.
pub(crate) fn mask_args(
    keyring: &Keyring,
    tool: &str,
    secrets: &BTreeSet<String>,
    withheld: &[String],
    args: &Value,
) -> Result<Value, DurableError> {
    let mut masked = args.clone();
    if let Value::Object(map) = &mut masked {
        for name in secrets {
            if let Some(value) = map.get_mut(name)
                && !(withheld.contains(name) && is_masked(value))
            {
                *value = mask(keyring, tool, name, value)?;
            }
        }
    }
    Ok(masked)
}

/// The clear values of the secrets masked in this session's model replies, held in
/// memory only, by tool, argument and digest.
#[derive(Default)]
pub(crate) struct Vault {
    entries: Mutex<HashMap<(String, String, String), Value>>,
}

impl fmt::Debug for Vault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let held = self
            .entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len();
        f.debug_struct("Vault").field("held", &held).finish()
    }
}

impl Vault {
    fn put(&self, tool: &str, arg: &str, digest: &str, value: Value) {
        self.entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert((tool.to_owned(), arg.to_owned(), digest.to_owned()), value);
    }

    fn get(&self, tool: &str, arg: &str, digest: &str) -> Option<Value> {
        self.entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&(tool.to_owned(), arg.to_owned(), digest.to_owned()))
            .cloned()
    }

    /// Masks `value` and keeps the clear value.
    fn hide(
        &self,
        keyring: &Keyring,
        tool: &str,
        arg: &str,
        value: &mut Value,
    ) -> Result<(), DurableError> {
        let masked = mask(keyring, tool, arg, value)?;
        if let Some(digest) = masked_digest(&masked) {
            self.put(tool, arg, digest, value.take());
        }
        *value = masked;
        Ok(())
    }

    /// The arguments a masked-as-a-whole argument value stands for, if this vault holds
    /// them; `None` when `args` is not masked as a whole.
    pub(crate) fn whole(&self, tool: &str, args: &Value) -> Option<Option<Value>> {
        let digest = masked_digest(args)?;
        Some(self.get(tool, WHOLE, digest))
    }

    /// Puts back the clear value of every masked secret argument of `args` that this
    /// vault holds; returns the names of those it does not hold (in name order).
    pub(crate) fn reveal(
        &self,
        tool: &str,
        secrets: &BTreeSet<String>,
        args: &mut Value,
    ) -> Vec<String> {
        let mut missing = Vec::new();
        let Value::Object(map) = args else {
            return missing;
        };
        for name in secrets {
            let Some(value) = map.get_mut(name) else {
                continue;
            };
            let Some(digest) = masked_digest(value) else {
                continue;
            };
            match self.get(tool, name, digest) {
                Some(clear) => *value = clear,
                None => missing.push(name.clone()),
            }
        }
        missing
    }

    /// Masks, in a model reply about to be journaled, the secret arguments of every tool
    /// call it holds (see the [module docs](self#the-path-of-a-secret)), keeping their
    /// clear values. Returns how many values were masked.
    pub(crate) fn redact_reply(
        &self,
        keyring: &Keyring,
        limits: &ArgLimits,
        reply: &mut Value,
    ) -> Result<usize, DurableError> {
        let registry = registry();
        if registry.is_empty() {
            return Ok(0);
        }
        let mut count = 0;
        let mut stack = vec![reply];
        while let Some(value) = stack.pop() {
            match value {
                Value::Array(items) => stack.extend(items.iter_mut()),
                Value::Object(map) => {
                    let tool = map.get("name").and_then(Value::as_str).map(str::to_owned);
                    if let Some((tool, secrets)) =
                        tool.and_then(|t| registry.get(&t).map(|s| (t, s)))
                    {
                        for field in ["arguments", "input"] {
                            if let Some(args) = map.get_mut(field) {
                                count += self.redact_args(keyring, limits, &tool, secrets, args)?;
                            }
                        }
                    }
                    stack.extend(map.values_mut());
                }
                _ => {}
            }
        }
        Ok(count)
    }

    /// Masks the secrets of one call's arguments: an object, JSON text of one, or
    /// anything else (masked as a whole: it may hold the secret where no name says so).
    fn redact_args(
        &self,
        keyring: &Keyring,
        limits: &ArgLimits,
        tool: &str,
        secrets: &BTreeSet<String>,
        args: &mut Value,
    ) -> Result<usize, DurableError> {
        match args {
            Value::Object(map) => self.redact_named(keyring, tool, secrets, map),
            Value::String(text) => match args::parse_arguments(text, limits) {
                Ok(Value::Object(mut map)) => {
                    let count = self.redact_named(keyring, tool, secrets, &mut map)?;
                    if count > 0 {
                        *text = Value::Object(map).to_string();
                    }
                    Ok(count)
                }
                // Unreadable text: the toolbox will refuse it, and its message never
                // quotes a value; the text itself is what must not be written.
                _ => {
                    let mut whole = Value::String(std::mem::take(text));
                    self.hide(keyring, tool, WHOLE, &mut whole)?;
                    *text = whole.to_string();
                    Ok(1)
                }
            },
            Value::Null => Ok(0),
            other => {
                self.hide(keyring, tool, WHOLE, other)?;
                Ok(1)
            }
        }
    }

    fn redact_named(
        &self,
        keyring: &Keyring,
        tool: &str,
        secrets: &BTreeSet<String>,
        map: &mut Map<String, Value>,
    ) -> Result<usize, DurableError> {
        let mut count = 0;
        for name in secrets {
            if let Some(value) = map.get_mut(name) {
                // Even a value that looks masked: only what this vault masked is revealed.
                self.hide(keyring, tool, name, value)?;
                count += 1;
            }
        }
        Ok(count)
    }
}

/// The refusal for a call whose secret argument `name` (`None`: its arguments as a
/// whole) this process does not hold.
pub(crate) fn unavailable(tool: &str, name: Option<&str>) -> DurableError {
    DurableError::InvalidArguments {
        tool: tool.to_owned(),
        source: ArgumentError {
            path: name.map_or_else(|| "$".to_owned(), args::path_of_key),
            kind: ArgumentErrorKind::SecretUnavailable,
        },
    }
}

/// An argument error with nothing of a secret argument's value in it: an error inside a
/// secret argument keeps its path and loses any quoted value, and elsewhere any clear
/// secret value it quotes is cut out.
pub(crate) fn redact_argument_error(
    tool: &str,
    declared: &[String],
    args: Option<&Value>,
    mut error: ArgumentError,
) -> ArgumentError {
    let secrets = secret_args(tool, declared);
    if secrets.is_empty() {
        return error;
    }
    if secrets
        .iter()
        .any(|name| args::path_is_inside(&error.path, name))
    {
        error.kind = error.kind.without_values();
    } else if let Some(args) = args {
        error.kind = match error.kind {
            ArgumentErrorKind::Syntax(m) => ArgumentErrorKind::Syntax(scrub(&secrets, args, m)),
            ArgumentErrorKind::IntegerOutOfRange(m) => {
                ArgumentErrorKind::IntegerOutOfRange(scrub(&secrets, args, m))
            }
            ArgumentErrorKind::Unserializable(m) => {
                ArgumentErrorKind::Unserializable(scrub(&secrets, args, m))
            }
            other => other,
        };
    }
    error
}

/// A serde message about `args` (at `path`) with nothing of a secret argument's value in
/// it: a message about a secret argument is replaced by one that quotes nothing, and
/// elsewhere any clear secret value it quotes is cut out.
pub(crate) fn redact_message(
    tool: &str,
    declared: &[String],
    args: &Value,
    path: &str,
    message: String,
) -> String {
    let secrets = secret_args(tool, declared);
    if secrets.is_empty() {
        return message;
    }
    // An unknown field is reported at its key and quotes the name only.
    let about_the_name = message.starts_with("unknown field `");
    if let Some(name) = secrets
        .iter()
        .find(|name| args::path_is_inside(path, name))
        .filter(|_| !about_the_name)
    {
        return format!(
            "the value of the secret argument `{name}` does not fit its type (the value is not \
             shown; see the argument's schema)"
        );
    }
    scrub(&secrets, args, message)
}

/// Replaces every occurrence of a clear secret value of `args` (a string's text, or the
/// JSON text of any other value, and each string inside it) in `message`.
fn scrub(secrets: &BTreeSet<String>, args: &Value, mut message: String) -> String {
    const SHOWN: &str = "<secret>";
    let mut texts = Vec::new();
    for name in secrets {
        if let Some(value) = args.get(name)
            && !is_masked(value)
        {
            collect_texts(value, &mut texts);
        }
    }
    // Longest first, so a secret that contains another is cut whole.
    texts.sort_by_key(|t| std::cmp::Reverse(t.len()));
    for text in texts {
        // A value of one or two characters is no secret, and cutting it would cut
        // line numbers out of messages.
        if text.chars().count() >= 3 && message.contains(&text) {
            message = message.replace(&text, SHOWN);
        }
    }
    message
}

fn collect_texts(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::String(s) => out.push(s.clone()),
        Value::Array(items) => {
            out.push(value.to_string());
            items.iter().for_each(|v| collect_texts(v, out));
        }
        Value::Object(map) => {
            out.push(value.to_string());
            map.values().for_each(|v| collect_texts(v, out));
        }
        Value::Number(n) => out.push(n.to_string()),
        Value::Bool(_) | Value::Null => {}
    }
}

/// Argument names whose values an operator's view hides wherever they appear, whatever
/// the tool declared (see [`mask_for_display`]).
pub const SENSITIVE_KEYS: &[&str] = &[
    "password",
    "passwd",
    "secret",
    "token",
    "api_key",
    "apikey",
    "authorization",
    "credential",
    "private_key",
    "access_key",
    "cookie",
];

/// Whether a key looks sensitive: it contains one of [`SENSITIVE_KEYS`], ignoring case,
/// with `-` read as `_`.
pub fn is_sensitive_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase().replace('-', "_");
    SENSITIVE_KEYS.iter().any(|s| key.contains(s))
}

/// Arguments (or any JSON) as an operator may see them, in the CLI and the console alike:
/// values stored masked by the journal (`{"$secret": …}`, a tool's declared secret
/// arguments) become `"<secret>"`, and values under a key that looks sensitive
/// ([`is_sensitive_key`]) become `"***"`, at any depth. Numbers, booleans and nulls stay:
/// `input_tokens: 12` is no secret.
///
/// ```
/// use durable_core::secret::mask_for_display;
/// use serde_json::json;
///
/// let shown = mask_for_display(&json!({"to": "ann", "body": {"$secret": "v1:…"}, "auth": {"token": "t"}}));
/// assert_eq!(shown, json!({"to": "ann", "body": "<secret>", "auth": {"token": "***"}}));
/// ```
pub fn mask_for_display(value: &Value) -> Value {
    match value {
        Value::Object(map) if map.len() == 1 && map.contains_key("$secret") => {
            Value::String("<secret>".into())
        }
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| {
                    let hideable = !(v.is_null() || v.is_number() || v.is_boolean());
                    let v = if hideable && is_sensitive_key(k) {
                        Value::String("***".into())
                    } else {
                        mask_for_display(v)
                    };
                    (k.clone(), v)
                })
                .collect::<Map<_, _>>(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(mask_for_display).collect()),
        other => other.clone(),
    }
}

/// Arguments an operator edited from what [`mask_for_display`] showed them, with what the
/// mask hid put back: wherever `edited` holds exactly what was shown for a part of
/// `original` (`"<secret>"`, `"***"`, or a whole object shown unchanged), that part of
/// `original` stands. So an operator copies the arguments they were shown, changes one
/// field, and the secrets they never saw stay as recorded; a value they did change is
/// theirs (a secret changed that way is then refused by
/// [`check_edited_args`](crate::approval::check_edited_args)).
///
/// ```
/// use durable_core::secret::{mask_for_display, unmask_displayed};
/// use serde_json::json;
///
/// let recorded = json!({"amount": 5, "card": {"$secret": "k1:abc"}, "auth": {"token": "t"}});
/// let mut edit = mask_for_display(&recorded);
/// edit["amount"] = json!(7);
/// assert_eq!(
///     unmask_displayed(edit, &recorded),
///     json!({"amount": 7, "card": {"$secret": "k1:abc"}, "auth": {"token": "t"}})
/// );
/// ```
pub fn unmask_displayed(edited: Value, original: &Value) -> Value {
    // What the mask shows for a value depends on its key (`"token": "t"` shows `***`), so
    // each field is compared with what was shown for it within its parent.
    const PLACEHOLDERS: [&str; 2] = ["<secret>", "***"];
    let placeholder = |v: &Value| v.as_str().is_some_and(|s| PLACEHOLDERS.contains(&s));
    let shown = mask_for_display(original);
    if placeholder(&edited) && shown == edited {
        return original.clone();
    }
    match (edited, original, &shown) {
        (Value::Object(fields), Value::Object(before), Value::Object(displayed)) => Value::Object(
            fields
                .into_iter()
                .map(|(k, v)| {
                    let restored = match (before.get(&k), displayed.get(&k)) {
                        (Some(b), Some(d)) if placeholder(&v) && d == &v => b.clone(),
                        (Some(b), _) => unmask_displayed(v, b),
                        _ => v,
                    };
                    (k, restored)
                })
                .collect(),
        ),
        (Value::Array(items), Value::Array(before), _) => Value::Array(
            items
                .into_iter()
                .enumerate()
                .map(|(i, v)| match before.get(i) {
                    Some(b) => unmask_displayed(v, b),
                    None => v,
                })
                .collect(),
        ),
        (edited, _, _) => edited,
    }
}

#[cfg(test)]
mod tests;
