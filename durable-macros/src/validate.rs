// Checks the parsed attribute and the IR, and emits nothing. Every problem goes to the
// accumulator; a check is skipped only when it depends on one that already failed (e.g.
// class-specific rules need a known class). The result, `Checked`, is what expand.rs
// needs beyond the IR.

use proc_macro2::{Delimiter, Span, TokenStream, TokenTree};
use quote::ToTokens;
use syn::{Expr, Ident, LitStr, Pat, Type};

use crate::args::{ApprovalArg, Arg, ToolArgs, approval_forms, attribute_span};
use crate::ctxt::Ctxt;
use crate::model::{KeyForm, Param, ToolFn, unraw};

/// The replay classes, spelled as in the attribute. The runtime enum lives in
/// durable-core; this crate cannot depend on it, so the names are listed once here.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Class {
    Pure,
    IdempotentWithKey,
    UnsafeOnReplay,
}

const CLASSES: &[(&str, Class)] = &[
    ("pure", Class::Pure),
    ("idempotent_with_key", Class::IdempotentWithKey),
    ("unsafe_on_replay", Class::UnsafeOnReplay),
];

impl Class {
    pub(crate) fn as_str(self) -> &'static str {
        CLASSES
            .iter()
            .find(|(_, class)| *class == self)
            .map_or("pure", |(name, _)| name)
    }
}

fn class_list() -> String {
    CLASSES
        .iter()
        .map(|(name, _)| format!("`{name}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

pub(crate) enum KeyFn<'a> {
    /// `|args| ...` or a function of `&Args`.
    Args(&'a Expr),
    /// `|args, session| ...`.
    ArgsAndSession(&'a Expr),
}

/// When a call needs a person's approval before it runs.
pub(crate) enum Approval<'a> {
    /// `approval = "required"`: every call.
    Required,
    /// `approval = path`: when the fn says so for the call's arguments.
    Rule(&'a syn::Path),
}

/// The attribute, checked against the fn: everything expand needs that is not already in
/// the IR.
pub(crate) struct Checked<'a> {
    pub(crate) class: Class,
    pub(crate) name: String,
    pub(crate) name_span: Span,
    pub(crate) description: Option<&'a LitStr>,
    pub(crate) key: Option<KeyFn<'a>>,
    pub(crate) verify: Option<&'a Expr>,
    pub(crate) retry: Option<&'a Expr>,
    pub(crate) approval: Option<Approval<'a>>,
    /// The rate limit its calls wait under.
    pub(crate) rate_limit: Option<&'a LitStr>,
    /// Names of `#[secret]` parameters.
    pub(crate) secrets: Vec<String>,
}

pub(crate) fn validate<'a>(
    cx: &Ctxt,
    args: &'a ToolArgs,
    tool: &ToolFn<'_>,
) -> Option<Checked<'a>> {
    let class = check_class(cx, args);
    if let Some(class) = class {
        check_class_rules(cx, args, class);
    }
    check_signature(cx, tool);
    check_key_params(cx, tool, class);
    check_params(cx, tool);
    let key = check_key(cx, args, tool);
    let (name, name_span) = check_name(cx, args, tool);
    let approval = check_approval(cx, args);
    let rate_limit = check_rate_limit(cx, args);
    if cx.has_errors() {
        return None;
    }
    Some(Checked {
        class: class?,
        name,
        name_span,
        description: args.description.get().map(|a| &a.value),
        key,
        verify: args.verify.get().map(|a| &a.value),
        retry: args.retry.get().map(|a| &a.value),
        approval,
        rate_limit,
        secrets: tool
            .model_params()
            .filter(|p| p.secret.is_some())
            .filter_map(|p| p.ident.map(unraw))
            .collect(),
    })
}

fn check_class(cx: &Ctxt, args: &ToolArgs) -> Option<Class> {
    let Some(Arg { value: lit, .. }) = args.replay.get() else {
        cx.error_at(
            attribute_span(),
            format!(
                "missing `replay`; declare what a replay of this tool may do: `replay = \"<class>\"` with one of {}",
                class_list()
            ),
        );
        return None;
    };
    let value = lit.value();
    match CLASSES.iter().find(|(name, _)| *name == value) {
        Some((_, class)) => Some(*class),
        None => {
            cx.error_spanned_by(
                lit,
                format!(
                    "unknown `replay` class `{:?}`; expected one of {}",
                    value,
                    class_list()
                ),
            );
            None
        }
    }
}

fn check_class_rules(cx: &Ctxt, args: &ToolArgs, class: Class) {
    let this = class.as_str();
    if let (Class::IdempotentWithKey, None, Some(replay)) =
        (class, args.idempotency_key.get(), args.replay.get())
    {
        cx.error_spanned_by(
            &replay.value,
            "`replay = \"idempotent_with_key\"` needs `idempotency_key = |args| ...`: the key the \
             upstream API deduplicates on, derived from the arguments",
        );
    }
    if let Some(key) = args.idempotency_key.get()
        && class != Class::IdempotentWithKey
    {
        cx.error_spanned_by(
            &key.key,
            format!(
                "`idempotency_key` only applies to `replay = \"idempotent_with_key\"` tools, and this \
                 tool is `{this}`; remove the key or change the class"
            ),
        );
    }
    if let Some(verify) = args.verify.get()
        && class != Class::UnsafeOnReplay
    {
        cx.error_spanned_by(
            &verify.key,
            format!(
                "`verify` only applies to `replay = \"unsafe_on_replay\"` tools (it decides whether an \
                 in-doubt call's effect happened), and this tool is `{this}`, which is re-executed instead; \
                 remove `verify`"
            ),
        );
    }
    if let Some(retry) = args.retry.get()
        && class == Class::UnsafeOnReplay
    {
        cx.error_spanned_by(
            &retry.key,
            "`retry` is not allowed on `unsafe_on_replay` tools: automatically retrying a call whose \
             effect cannot be deduplicated is how one email gets sent twice; make the tool \
             `idempotent_with_key` or retry in the caller",
        );
    }
}

// Allowed on every class: what runs after the approval still follows the class.
fn check_approval<'a>(cx: &Ctxt, args: &'a ToolArgs) -> Option<Approval<'a>> {
    match &args.approval.get()?.value {
        ApprovalArg::Lit(lit) if lit.value() == "required" => Some(Approval::Required),
        ApprovalArg::Lit(lit) => {
            cx.error_spanned_by(
                lit,
                format!(
                    "unknown `approval` value `{:?}`; {}",
                    lit.value(),
                    approval_forms()
                ),
            );
            None
        }
        ApprovalArg::Rule(path) => Some(Approval::Rule(path)),
    }
}

fn check_signature(cx: &Ctxt, tool: &ToolFn<'_>) {
    let sig = &tool.original.sig;
    if sig.asyncness.is_none() {
        cx.error_spanned_by(
            sig.fn_token,
            "`#[durable_tool]` needs an `async fn`; add `async` before `fn`",
        );
    }
    if let Some(constness) = &sig.constness {
        cx.error_spanned_by(constness, "a tool cannot be a `const fn`; remove `const`");
    }
    if let Some(unsafety) = &sig.unsafety {
        cx.error_spanned_by(unsafety, "a tool cannot be an `unsafe fn`; remove `unsafe`");
    }
    if let Some(abi) = &sig.abi {
        cx.error_spanned_by(abi, "a tool cannot declare an ABI; remove `extern`");
    }
    if let Some(variadic) = &sig.variadic {
        cx.error_spanned_by(variadic, "a tool cannot be variadic");
    }
    if let Some(receiver) = tool.receiver {
        cx.error_spanned_by(
            receiver,
            "a tool cannot take `self`: `#[durable_tool]` turns the function into a tool value; \
             make it a free `async fn` and pass what it needs as arguments",
        );
    }
    if !sig.generics.params.is_empty() || sig.generics.where_clause.is_some() {
        cx.error_spanned_by(
            &sig.generics,
            "generic tool functions are not supported: a tool has one concrete argument schema \
             and result type; remove the generic parameters",
        );
    }
    if tool.output.ty().is_none() {
        cx.error_spanned_by(
            sig,
            "a tool must return `Result<T, E>`: `T` is recorded and returned to the model, `E` is \
             the failure it reads; add a return type",
        );
    }
    let mut contexts = tool.context_params();
    if let Some(first) = contexts.next() {
        if first.mutable {
            cx.error_spanned_by(
                &first.original.ty,
                "the tool context is shared, not mutable: take it as `&ToolContext`",
            );
        }
        for extra in contexts {
            cx.error_spanned_by(
                extra.original,
                "a tool takes at most one `ToolContext` parameter; remove this one",
            );
        }
    }
}

// One key, by value, and only where the runtime has one: a keyed tool's body receives
// the recorded key as a plain value, so it never has to make one up for a `None`.
fn check_key_params(cx: &Ctxt, tool: &ToolFn<'_>, class: Option<Class>) {
    let mut keys = tool.key_params();
    let Some(first) = keys.next() else {
        return;
    };
    match (class, first.form) {
        (Some(class), _) if class != Class::IdempotentWithKey => cx.error_spanned_by(
            first.original,
            format!(
                "`IdempotencyKey` parameter on a `replay = \"{}\"` tool; only `idempotent_with_key` \
                 tools receive a key: remove the parameter, or make the tool \
                 `replay = \"idempotent_with_key\"` with an `idempotency_key` rule if its upstream \
                 deduplicates on a key",
                class.as_str()
            ),
        ),
        (_, KeyForm::Value) => {}
        (_, KeyForm::Ref) => cx.error_spanned_by(
            first.original,
            "`&IdempotencyKey` parameter; take the key by value (`key: IdempotencyKey`) and borrow \
             it in the body (`&key`, `key.as_str()`)",
        ),
        (_, KeyForm::Option) => cx.error_spanned_by(
            first.original,
            "`Option<IdempotencyKey>` parameter; an `idempotent_with_key` tool always receives its \
             key: take `key: IdempotencyKey`",
        ),
    }
    for extra in keys {
        cx.error_spanned_by(
            extra.original,
            "a tool takes at most one `IdempotencyKey` parameter; remove this one",
        );
    }
}

fn check_params(cx: &Ctxt, tool: &ToolFn<'_>) {
    let params: Vec<&Param<'_>> = tool.model_params().collect();
    let struct_form = params.iter().any(|p| p.args.is_some());
    for param in &params {
        if param.ident.is_none() {
            cx.error_spanned_by(
                &param.original.pat,
                "tool arguments must be plain names (each becomes a field of the argument object); \
                 replace this pattern with a name",
            );
        }
        check_param_type(cx, param.ty);
        if struct_form && param.args.is_none() {
            cx.error_spanned_by(
                param.original,
                "a tool with an `#[args]` parameter takes no other arguments (its struct is the whole \
                 argument object); move this argument into the struct",
            );
        }
        if let (Some(args), true) = (param.args, !param.docs.is_empty() || param.secret.is_some()) {
            cx.error_spanned_by(
                args,
                "`#[args]` cannot be combined with `///` docs or `#[secret]` on the parameter: \
                 document and mark the struct's fields instead",
            );
        }
        if let Some(args) = param.args
            && !param.field_attrs.is_empty()
        {
            cx.error_spanned_by(
                args,
                "`#[args]` cannot be combined with `#[serde]`/`#[schemars]` on the parameter; put \
                 them on the struct",
            );
        }
        for attr in param.args.iter().chain(param.secret.iter()) {
            if !matches!(attr.meta, syn::Meta::Path(_)) {
                cx.error_spanned_by(
                    attr,
                    format!("`#[{}]` takes no arguments", attr.path().to_token_stream()),
                );
            }
        }
        if param.secret.is_some() && param.field_attrs.iter().any(|a| mentions(a, "rename")) {
            cx.error_spanned_by(
                param.original,
                "a `#[secret]` argument cannot be renamed with `#[serde(rename)]`: secrets are masked \
                 by their Rust name; rename the parameter instead",
            );
        }
    }
}

fn check_param_type(cx: &Ctxt, ty: &Type) {
    match ty {
        Type::Reference(_) => cx.error_spanned_by(
            ty,
            "tool arguments are decoded from the model's JSON and must own their data; use an owned \
             type (e.g. `String` for `&str`)",
        ),
        Type::ImplTrait(_) | Type::Infer(_) => cx.error_spanned_by(
            ty,
            "tool arguments need a concrete type (it becomes a field of the argument struct)",
        ),
        Type::Paren(inner) => check_param_type(cx, &inner.elem),
        _ => {}
    }
}

/// Whether `ident` appears anywhere in the attribute's arguments.
fn mentions(attr: &syn::Attribute, ident: &str) -> bool {
    fn scan(tokens: TokenStream, ident: &str) -> bool {
        tokens.into_iter().any(|tt| match tt {
            TokenTree::Ident(i) => i == ident,
            TokenTree::Group(g) => scan(g.stream(), ident),
            _ => false,
        })
    }
    scan(attr.meta.to_token_stream(), ident)
}

fn check_key<'a>(cx: &Ctxt, args: &'a ToolArgs, tool: &ToolFn<'_>) -> Option<KeyFn<'a>> {
    let expr = &args.idempotency_key.get()?.value;
    let Expr::Closure(closure) = expr else {
        return Some(KeyFn::Args(expr));
    };
    match closure.inputs.len() {
        1 | 2 => {}
        n => {
            cx.error_spanned_by(
                &closure.inputs,
                format!(
                    "the `idempotency_key` closure takes the arguments (`|args| ...`) or the arguments \
                     and the session id (`|args, session| ...`); found {n} parameters"
                ),
            );
            return None;
        }
    }
    // In the generated-struct form the fields are exactly the model parameters: check
    // every `args.field` the closure reads, so a typo names the parameters that exist.
    if tool.struct_arg().is_none()
        && let Some(var) = closure.inputs.first().and_then(binding)
    {
        let params: Vec<String> = tool
            .model_params()
            .filter_map(|p| p.ident.map(unraw))
            .collect();
        let secrets: Vec<String> = tool
            .model_params()
            .filter(|p| p.secret.is_some())
            .filter_map(|p| p.ident.map(unraw))
            .collect();
        let mut reads = Vec::new();
        field_reads(closure.body.to_token_stream(), &var, &mut reads);
        for field in reads {
            let name = unraw(&field);
            if secrets.contains(&name) {
                // The key is recorded in clear and sent upstream: a key made of the secret
                // would write it to the journal.
                cx.error_spanned_by(
                    &field,
                    format!(
                        "`idempotency_key` reads `{var}.{name}`, a `#[secret]` argument; the key is \
                         recorded in the journal in clear, so derive it from arguments that are not secret"
                    ),
                );
            } else if !params.contains(&name) {
                let known = if params.is_empty() {
                    "it takes no arguments".to_owned()
                } else {
                    format!(
                        "its arguments are {}",
                        params
                            .iter()
                            .map(|p| format!("`{p}`"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                };
                cx.error_spanned_by(
                    &field,
                    format!(
                        "`idempotency_key` reads `{var}.{name}`, but `{}` has no argument `{name}`; {known}",
                        tool.name()
                    ),
                );
            }
        }
    }
    Some(if closure.inputs.len() == 2 {
        KeyFn::ArgsAndSession(expr)
    } else {
        KeyFn::Args(expr)
    })
}

/// The name a closure parameter binds, if it is a plain identifier (`a` or `a: &T`).
fn binding(pat: &Pat) -> Option<String> {
    match pat {
        Pat::Ident(p) => Some(p.ident.to_string()),
        Pat::Type(t) => binding(&t.pat),
        _ => None,
    }
}

/// Collects `field` in every `var.field` that is a field read (not a method call
/// `var.m(...)` / `var.m::<T>(...)`, not a tuple index).
fn field_reads(tokens: TokenStream, var: &str, out: &mut Vec<Ident>) {
    let tts: Vec<TokenTree> = tokens.into_iter().collect();
    for (i, tt) in tts.iter().enumerate() {
        match tt {
            TokenTree::Group(g) => field_reads(g.stream(), var, out),
            TokenTree::Ident(id) if id == var => {
                let after_dot =
                    i > 0 && matches!(&tts[i - 1], TokenTree::Punct(p) if p.as_char() == '.');
                let (Some(TokenTree::Punct(dot)), Some(TokenTree::Ident(field))) =
                    (tts.get(i + 1), tts.get(i + 2))
                else {
                    continue;
                };
                let call = match tts.get(i + 3) {
                    Some(TokenTree::Group(g)) => g.delimiter() == Delimiter::Parenthesis,
                    Some(TokenTree::Punct(p)) => p.as_char() == ':',
                    _ => false,
                };
                if dot.as_char() == '.' && !after_dot && !call {
                    out.push(field.clone());
                }
            }
            _ => {}
        }
    }
}

fn check_name(cx: &Ctxt, args: &ToolArgs, tool: &ToolFn<'_>) -> (String, Span) {
    let Some(arg) = args.name.get() else {
        return (tool.name(), tool.ident.span());
    };
    let name = arg.value.value();
    let valid = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !valid {
        cx.error_spanned_by(
            &arg.value,
            format!(
                "tool name {name:?} is not accepted by model APIs; use 1 to 64 ASCII letters, digits, \
                 `_` or `-`"
            ),
        );
    }
    (name, arg.value.span())
}

/// The longest limit name (`durable_core::limiter::MAX_LIMIT_NAME`).
const MAX_LIMIT_NAME: usize = 200;

/// `rate_limit`'s name, checked as the limiter checks it at run time: 1 to 200 bytes, no
/// control characters.
fn check_rate_limit<'a>(cx: &Ctxt, args: &'a ToolArgs) -> Option<&'a LitStr> {
    let arg = args.rate_limit.get()?;
    let name = arg.value.value();
    let problem = if name.trim().is_empty() {
        Some("is empty".to_owned())
    } else if name.len() > MAX_LIMIT_NAME {
        Some(format!("is longer than {MAX_LIMIT_NAME} bytes"))
    } else if name.chars().any(char::is_control) {
        Some("holds a control character".to_owned())
    } else {
        None
    };
    if let Some(problem) = problem {
        cx.error_spanned_by(
            &arg.value,
            format!(
                "the rate limit's name {problem}; name the limit your runtime defines, e.g. \
                 `rate_limit = \"crm\"` with `Durable::builder(store).rate_limit(\"crm\", …)`"
            ),
        );
    }
    Some(&arg.value)
}

#[cfg(test)]
mod tests;
