// Parses the attribute arguments: `#[durable_tool(key = value, ...)]`.
//
// Grammar (strict; every key at most once, in any order):
//   replay          = "<class>"            string literal, required (checked in validate)
//   idempotency_key = <expr>               closure `|args| ..` / `|args, session| ..` or a fn path
//   verify          = <expr>               async fn `(ctx: &ToolContext, args: &Args) -> Verification<T>`
//   retry           = <expr>               a `RetryPolicy` value
//   approval        = "required" | <path>  every call needs approval, or a fn `(&Args) -> bool`
//                                          deciding per call (the string is checked in validate)
//   rate_limit      = "<limit name>"       the fleet-wide rate limit its calls wait under
//   name            = "<tool name>"        defaults to the fn name
//   description     = "<text>"             defaults to the fn's doc comment
//   crate           = "<path>"             the runtime root, defaults to `::durable`
//
// The supported keys live in one table (`KEYS`); the unknown-key message is generated from
// it. Duplicates are reported at their second occurrence by `Slot::set`.

use proc_macro2::{Span, TokenStream};
use syn::ext::IdentExt;
use syn::parse::{ParseStream, Parser};
use syn::{Expr, Ident, LitStr, Token};

use crate::ctxt::Ctxt;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Keyword {
    Replay,
    IdempotencyKey,
    Verify,
    Retry,
    Approval,
    RateLimit,
    Name,
    Description,
    Crate,
}

/// The one keyword table: spelling and meaning of every supported key.
const KEYS: &[(&str, Keyword)] = &[
    ("replay", Keyword::Replay),
    ("idempotency_key", Keyword::IdempotencyKey),
    ("verify", Keyword::Verify),
    ("retry", Keyword::Retry),
    ("approval", Keyword::Approval),
    ("rate_limit", Keyword::RateLimit),
    ("name", Keyword::Name),
    ("description", Keyword::Description),
    ("crate", Keyword::Crate),
];

pub(crate) fn supported_keys() -> String {
    KEYS.iter()
        .map(|(name, _)| format!("`{name}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// One attribute argument as written: the key (for spans) and its value.
pub(crate) struct Arg<T> {
    pub(crate) key: Ident,
    pub(crate) value: T,
}

/// A key's value, set at most once (serde_derive's `Attr<T>`).
pub(crate) struct Slot<T> {
    name: &'static str,
    arg: Option<Arg<T>>,
}

impl<T> Slot<T> {
    fn new(name: &'static str) -> Self {
        Slot { name, arg: None }
    }

    fn set(&mut self, cx: &Ctxt, key: Ident, value: T) {
        if self.arg.is_some() {
            cx.error_spanned_by(
                &key,
                format!(
                    "duplicate `{}` argument; each `durable_tool` argument may appear once",
                    self.name
                ),
            );
        } else {
            self.arg = Some(Arg { key, value });
        }
    }

    pub(crate) fn get(&self) -> Option<&Arg<T>> {
        self.arg.as_ref()
    }
}

/// The value of `approval = ...` as written.
pub(crate) enum ApprovalArg {
    /// A string: `"required"` (other strings are reported by validate).
    Lit(LitStr),
    /// The path of a fn deciding per call.
    Rule(syn::Path),
}

/// The parsed attribute.
pub(crate) struct ToolArgs {
    pub(crate) replay: Slot<LitStr>,
    pub(crate) idempotency_key: Slot<Expr>,
    pub(crate) verify: Slot<Expr>,
    pub(crate) retry: Slot<Expr>,
    pub(crate) approval: Slot<ApprovalArg>,
    pub(crate) rate_limit: Slot<LitStr>,
    pub(crate) name: Slot<LitStr>,
    pub(crate) description: Slot<LitStr>,
    pub(crate) krate: Slot<syn::Path>,
}

impl ToolArgs {
    fn empty() -> Self {
        ToolArgs {
            replay: Slot::new("replay"),
            idempotency_key: Slot::new("idempotency_key"),
            verify: Slot::new("verify"),
            retry: Slot::new("retry"),
            approval: Slot::new("approval"),
            rate_limit: Slot::new("rate_limit"),
            name: Slot::new("name"),
            description: Slot::new("description"),
            krate: Slot::new("crate"),
        }
    }
}

/// Parses the attribute. Syntax errors abort (`Err`); unknown keys, duplicates and
/// wrongly typed values go to `cx` and parsing continues, so all of them are reported.
pub(crate) fn parse(cx: &Ctxt, tokens: TokenStream) -> syn::Result<ToolArgs> {
    let parser = |input: ParseStream<'_>| parse_args(cx, input);
    parser.parse2(tokens)
}

fn parse_args(cx: &Ctxt, input: ParseStream<'_>) -> syn::Result<ToolArgs> {
    let mut args = ToolArgs::empty();
    while !input.is_empty() {
        // `Ident::parse_any` so that the keyword `crate` is accepted as a key.
        let key = input.call(Ident::parse_any)?;
        input.parse::<Token![=]>()?;
        let name = key.to_string();
        match KEYS.iter().find(|(spelling, _)| *spelling == name) {
            None => {
                cx.error_spanned_by(
                    &key,
                    format!(
                        "unknown `durable_tool` argument `{name}`; supported arguments: {}",
                        supported_keys()
                    ),
                );
                // Skip the value so the rest of the list is still checked.
                input.parse::<Expr>()?;
            }
            Some((_, Keyword::Replay)) => {
                if let Some(lit) = string_value(cx, input, &key, "replay = \"pure\"")? {
                    args.replay.set(cx, key, lit);
                }
            }
            Some((_, Keyword::IdempotencyKey)) => {
                let value = input.parse()?;
                args.idempotency_key.set(cx, key, value);
            }
            Some((_, Keyword::Verify)) => {
                let value = input.parse()?;
                args.verify.set(cx, key, value);
            }
            Some((_, Keyword::Retry)) => {
                let value = input.parse()?;
                args.retry.set(cx, key, value);
            }
            Some((_, Keyword::Approval)) => {
                if let Some(value) = approval_value(cx, input)? {
                    args.approval.set(cx, key, value);
                }
            }
            Some((_, Keyword::RateLimit)) => {
                if let Some(lit) = string_value(cx, input, &key, "rate_limit = \"crm\"")? {
                    args.rate_limit.set(cx, key, lit);
                }
            }
            Some((_, Keyword::Name)) => {
                if let Some(lit) = string_value(cx, input, &key, "name = \"send_email\"")? {
                    args.name.set(cx, key, lit);
                }
            }
            Some((_, Keyword::Description)) => {
                if let Some(lit) =
                    string_value(cx, input, &key, "description = \"Send an email.\"")?
                {
                    args.description.set(cx, key, lit);
                }
            }
            Some((_, Keyword::Crate)) => {
                if let Some(lit) = string_value(cx, input, &key, "crate = \"my_durable\"")? {
                    match lit.parse::<syn::Path>() {
                        Ok(path) => args.krate.set(cx, key, path),
                        Err(_) => cx.error_spanned_by(
                            &lit,
                            format!(
                                "`crate` must name a path, e.g. `crate = \"my_durable\"`; found `{:?}`",
                                lit.value()
                            ),
                        ),
                    }
                }
            }
        }
        if input.is_empty() {
            break;
        }
        input.parse::<Token![,]>()?;
    }
    Ok(args)
}

/// Reads a string-literal value; anything else is reported (with `example`) and skipped.
fn string_value(
    cx: &Ctxt,
    input: ParseStream<'_>,
    key: &Ident,
    example: &str,
) -> syn::Result<Option<LitStr>> {
    if input.peek(LitStr) {
        return Ok(Some(input.parse()?));
    }
    let value: Expr = input.parse()?;
    cx.error_spanned_by(
        &value,
        format!("`{key}` takes a string literal, e.g. `{example}`"),
    );
    Ok(None)
}

/// Reads `approval`'s value: a string literal or a path; anything else is reported and
/// skipped.
fn approval_value(cx: &Ctxt, input: ParseStream<'_>) -> syn::Result<Option<ApprovalArg>> {
    if input.peek(LitStr) {
        return Ok(Some(ApprovalArg::Lit(input.parse()?)));
    }
    match input.parse::<Expr>()? {
        Expr::Path(path) if path.qself.is_none() && path.attrs.is_empty() => {
            Ok(Some(ApprovalArg::Rule(path.path)))
        }
        value => {
            cx.error_spanned_by(&value, approval_forms());
            Ok(None)
        }
    }
}

/// What `approval` accepts, for its error messages.
pub(crate) fn approval_forms() -> &'static str {
    "`approval` takes `\"required\"` (every call needs approval) or the path of a fn \
     `fn(&Args) -> bool` deciding per call, e.g. `approval = needs_approval`"
}

/// The span of the whole attribute, for errors about a missing key.
pub(crate) fn attribute_span() -> Span {
    Span::call_site()
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::quote;

    fn parse_ok(tokens: TokenStream) -> ToolArgs {
        let cx = Ctxt::new();
        let args = parse(&cx, tokens).expect("syntax");
        cx.check().expect("no errors");
        args
    }

    fn parse_errors(tokens: TokenStream) -> Vec<String> {
        let cx = Ctxt::new();
        let _ = parse(&cx, tokens);
        match cx.check() {
            Ok(()) => Vec::new(),
            Err(e) => e.into_iter().map(|e| e.to_string()).collect(),
        }
    }

    #[test]
    fn parses_every_key() {
        let args = parse_ok(quote!(
            replay = "idempotent_with_key",
            idempotency_key = |a, session| format!("{}:{}", session, a.id),
            retry = RetryPolicy::default(),
            name = "charge",
            description = "Charge.",
            crate = "dur",
        ));
        assert_eq!(
            args.replay.get().map(|a| a.value.value()),
            Some("idempotent_with_key".into())
        );
        assert!(args.idempotency_key.get().is_some());
        assert!(args.retry.get().is_some());
        assert_eq!(
            args.name.get().map(|a| a.value.value()),
            Some("charge".into())
        );
        let krate = args.krate.get().expect("crate");
        assert!(krate.value.is_ident("dur"));
        assert!(args.verify.get().is_none());
    }

    #[test]
    fn unknown_keys_list_the_table() {
        let errors = parse_errors(quote!(replay = "pure", colour = 3));
        assert_eq!(
            errors,
            [
                "unknown `durable_tool` argument `colour`; supported arguments: `replay`, \
              `idempotency_key`, `verify`, `retry`, `approval`, `rate_limit`, `name`, `description`, `crate`"
            ]
        );
    }

    #[test]
    fn duplicates_and_bad_values_are_all_reported() {
        let errors = parse_errors(quote!(
            replay = "pure",
            replay = "pure",
            name = tool,
            crate = "1x"
        ));
        assert_eq!(errors.len(), 3, "{errors:?}");
        assert!(errors[0].starts_with("duplicate `replay` argument"));
        assert!(errors[1].starts_with("`name` takes a string literal"));
        assert!(errors[2].starts_with("`crate` must name a path"));
    }

    #[test]
    fn syntax_errors_abort() {
        let cx = Ctxt::new();
        assert!(parse(&cx, quote!(replay "pure")).is_err());
        cx.check()
            .expect("syntax errors are returned, not accumulated");
    }
}
