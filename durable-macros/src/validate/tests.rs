use super::*;
use crate::args;
use quote::quote;

fn errors(attr: TokenStream, item: TokenStream) -> Vec<String> {
    let cx = Ctxt::new();
    let args = args::parse(&cx, attr).expect("attribute syntax");
    let item: syn::ItemFn = syn::parse2(item).expect("fn");
    let tool = ToolFn::from_item(&item);
    let checked = validate(&cx, &args, &tool);
    match cx.check() {
        Ok(()) => {
            assert!(checked.is_some());
            Vec::new()
        }
        Err(e) => {
            assert!(checked.is_none());
            e.into_iter().map(|e| e.to_string()).collect()
        }
    }
}

fn one(attr: TokenStream, item: TokenStream) -> String {
    let mut errors = errors(attr, item);
    assert_eq!(errors.len(), 1, "{errors:?}");
    errors.remove(0)
}

#[test]
fn accepts_each_class() {
    let f = quote!(
        async fn t(ctx: &ToolContext, id: String) -> Result<u8, E> {
            unreachable!()
        }
    );
    assert!(errors(quote!(replay = "pure", retry = R::default()), f.clone()).is_empty());
    assert!(
        errors(
            quote!(
                replay = "idempotent_with_key",
                idempotency_key = |a| a.id.clone()
            ),
            f.clone()
        )
        .is_empty()
    );
    assert!(errors(quote!(replay = "unsafe_on_replay", verify = check), f).is_empty());
}

#[test]
fn class_errors() {
    let f = quote!(
        async fn t() -> Result<u8, E> {
            unreachable!()
        }
    );
    assert!(one(quote!(), f.clone()).starts_with("missing `replay`"));
    assert_eq!(
        one(quote!(replay = "maybe"), f.clone()),
        "unknown `replay` class `\"maybe\"`; expected one of `pure`, `idempotent_with_key`, `unsafe_on_replay`"
    );
    assert!(
        one(quote!(replay = "idempotent_with_key"), f.clone()).contains("needs `idempotency_key")
    );
    assert!(
        one(
            quote!(replay = "pure", idempotency_key = |a| "k"),
            f.clone()
        )
        .contains("this tool is `pure`")
    );
    assert!(
        one(quote!(replay = "pure", verify = v), f.clone()).starts_with("`verify` only applies")
    );
    assert!(
        one(quote!(replay = "unsafe_on_replay", retry = R::default()), f)
            .contains("one email gets sent twice")
    );
}

#[test]
fn signature_errors_are_all_reported() {
    let errors = errors(
        quote!(replay = "pure"),
        quote!(
            const unsafe fn t<T>(&self, a: &str, (b, c): (u8, u8), x: impl Sized) {}
        ),
    );
    assert_eq!(errors.len(), 9, "{errors:#?}");
    assert!(errors[0].contains("needs an `async fn`"));
    assert!(errors[1].contains("`const fn`"));
    assert!(errors[2].contains("`unsafe fn`"));
    assert!(errors[3].contains("cannot take `self`"));
    assert!(errors[4].contains("generic tool functions"));
    assert!(errors[5].contains("must return `Result<T, E>`"));
    assert!(errors[6].contains("must own their data"));
    assert!(errors[7].contains("plain names"));
    assert!(errors[8].contains("concrete type"));
}

#[test]
fn context_rules() {
    let e = one(
        quote!(replay = "pure"),
        quote!(
            async fn t(a: &ToolContext, b: &ToolContext) -> Result<u8, E> {
                unreachable!()
            }
        ),
    );
    assert!(e.starts_with("a tool takes at most one `ToolContext`"));
    let e = one(
        quote!(replay = "pure"),
        quote!(
            async fn t(a: &mut ToolContext) -> Result<u8, E> {
                unreachable!()
            }
        ),
    );
    assert!(e.contains("take it as `&ToolContext`"));
}

#[test]
fn a_key_rule_may_not_read_a_secret() {
    let e = one(
        quote!(
            replay = "idempotent_with_key",
            idempotency_key = |a| format!("{}:{}", a.user, a.password)
        ),
        quote!(
            async fn t(user: String, #[secret] password: String) -> Result<u8, E> {
                unreachable!()
            }
        ),
    );
    assert_eq!(
        e,
        "`idempotency_key` reads `a.password`, a `#[secret]` argument; the key is recorded in \
         the journal in clear, so derive it from arguments that are not secret"
    );
    let ok = quote!(
        async fn t(user: String, #[secret] password: String) -> Result<u8, E> {
            unreachable!()
        }
    );
    let keyed = quote!(
        replay = "idempotent_with_key",
        idempotency_key = |a| a.user.clone()
    );
    assert!(errors(keyed, ok).is_empty());
}

#[test]
fn key_parameter_rules() {
    let keyed = quote!(
        replay = "idempotent_with_key",
        idempotency_key = |a| a.id.clone()
    );
    let ok = quote!(
        async fn t(ctx: &ToolContext, key: IdempotencyKey, id: String) -> Result<u8, E> {
            unreachable!()
        }
    );
    assert!(errors(keyed.clone(), ok).is_empty());
    let ok = quote!(
        async fn t(mut key: durable::IdempotencyKey, #[args] a: Args) -> Result<u8, E> {
            unreachable!()
        }
    );
    assert!(
        errors(
            quote!(replay = "idempotent_with_key", idempotency_key = k),
            ok
        )
        .is_empty()
    );
    let with_key = quote!(
        async fn t(key: IdempotencyKey, id: String) -> Result<u8, E> {
            unreachable!()
        }
    );
    assert_eq!(
        one(quote!(replay = "pure"), with_key.clone()),
        "`IdempotencyKey` parameter on a `replay = \"pure\"` tool; only `idempotent_with_key` \
         tools receive a key: remove the parameter, or make the tool \
         `replay = \"idempotent_with_key\"` with an `idempotency_key` rule if its upstream \
         deduplicates on a key"
    );
    assert!(
        one(quote!(replay = "unsafe_on_replay"), with_key)
            .starts_with("`IdempotencyKey` parameter on a `replay = \"unsafe_on_replay\"` tool;")
    );
    let e = one(
        keyed.clone(),
        quote!(
            async fn t(a: IdempotencyKey, id: String, b: IdempotencyKey) -> Result<u8, E> {
                unreachable!()
            }
        ),
    );
    assert_eq!(
        e,
        "a tool takes at most one `IdempotencyKey` parameter; remove this one"
    );
    let e = one(
        keyed.clone(),
        quote!(
            async fn t(key: &IdempotencyKey, id: String) -> Result<u8, E> {
                unreachable!()
            }
        ),
    );
    assert!(e.starts_with("`&IdempotencyKey` parameter; take the key by value"));
    let e = one(
        keyed,
        quote!(
            async fn t(key: Option<IdempotencyKey>, id: String) -> Result<u8, E> {
                unreachable!()
            }
        ),
    );
    assert!(
        e.starts_with("`Option<IdempotencyKey>` parameter; an `idempotent_with_key` tool always")
    );
}

#[test]
fn struct_form_rules() {
    let ok = quote!(
        async fn t(ctx: &ToolContext, #[args] a: SearchArgs) -> Result<u8, E> {
            unreachable!()
        }
    );
    assert!(errors(quote!(replay = "pure"), ok).is_empty());
    let e = one(
        quote!(replay = "pure"),
        quote!(
            async fn t(#[args] a: SearchArgs, b: u8) -> Result<u8, E> {
                unreachable!()
            }
        ),
    );
    assert!(e.contains("takes no other arguments"));
    let e = one(
        quote!(replay = "pure"),
        quote!(
            async fn t(
                #[args]
                #[secret]
                a: SearchArgs,
            ) -> Result<u8, E> {
                unreachable!()
            }
        ),
    );
    assert!(e.contains("cannot be combined"));
    let e = one(
        quote!(replay = "pure"),
        quote!(
            async fn t(#[secret(x)] a: String) -> Result<u8, E> {
                unreachable!()
            }
        ),
    );
    assert_eq!(e, "`#[secret]` takes no arguments");
    let e = one(
        quote!(replay = "pure"),
        quote!(
            async fn t(
                #[secret]
                #[serde(rename = "k")]
                a: String,
            ) -> Result<u8, E> {
                unreachable!()
            }
        ),
    );
    assert!(e.contains("cannot be renamed"));
}

#[test]
fn key_closure_rules() {
    let f = quote!(
        async fn charge(order_id: String, cents: u64) -> Result<u8, E> {
            unreachable!()
        }
    );
    let attr = |key: TokenStream| quote!(replay = "idempotent_with_key", idempotency_key = #key);
    assert!(
        errors(
            attr(quote!(|a| format!("{}:{}", a.order_id, a.cents))),
            f.clone()
        )
        .is_empty()
    );
    assert!(
        errors(
            attr(quote!(|a, s| format!("{s}:{}", a.order_id.to_uppercase()))),
            f.clone()
        )
        .is_empty()
    );
    assert!(errors(attr(quote!(|a: &ChargeArgs| a.order_id.clone())), f.clone()).is_empty());
    assert!(errors(attr(quote!(key_of)), f.clone()).is_empty());
    assert_eq!(
        one(attr(quote!(|a| format!("{}", a.order_idd))), f.clone()),
        "`idempotency_key` reads `a.order_idd`, but `charge` has no argument `order_idd`; its arguments are `order_id`, `cents`"
    );
    assert!(one(attr(quote!(|| "k")), f.clone()).contains("found 0 parameters"));
    // Method calls, ranges and tuple fields are not field reads.
    let mut reads = Vec::new();
    field_reads(
        quote!(a.len() + a.into::<u8>() + x.a.b + a..b + a.0 + a.cents),
        "a",
        &mut reads,
    );
    let reads: Vec<String> = reads.iter().map(ToString::to_string).collect();
    assert_eq!(reads, ["cents"]);
}

#[test]
fn tool_names() {
    let f = quote!(
        async fn t() -> Result<u8, E> {
            unreachable!()
        }
    );
    assert!(errors(quote!(replay = "pure", name = "search-v2"), f.clone()).is_empty());
    assert!(
        one(quote!(replay = "pure", name = "has space"), f).contains("not accepted by model APIs")
    );
}

#[test]
fn approval_forms() {
    let f = quote!(
        async fn t(id: String) -> Result<u8, E> {
            unreachable!()
        }
    );
    for class in ["pure", "unsafe_on_replay"] {
        assert!(errors(quote!(replay = #class, approval = "required"), f.clone()).is_empty());
        assert!(errors(quote!(replay = #class, approval = rules::risky), f.clone()).is_empty());
    }
    assert!(
        errors(
            quote!(
                replay = "idempotent_with_key",
                idempotency_key = |a| a.id.clone(),
                approval = "required"
            ),
            f.clone()
        )
        .is_empty()
    );
    assert_eq!(
        one(quote!(replay = "pure", approval = "sometimes"), f.clone()),
        "unknown `approval` value `\"sometimes\"`; `approval` takes `\"required\"` (every call \
         needs approval) or the path of a fn `fn(&Args) -> bool` deciding per call, e.g. \
         `approval = needs_approval`"
    );
    assert!(one(quote!(replay = "pure", approval = 3), f.clone()).starts_with("`approval` takes"));
    assert!(
        one(quote!(replay = "pure", approval = |a| true), f.clone())
            .starts_with("`approval` takes")
    );
    assert!(
        one(
            quote!(replay = "pure", approval = "required", approval = risky),
            f
        )
        .starts_with("duplicate `approval` argument")
    );
}
