// Pipeline tests on proc_macro2 tokens: what the whole macro emits for a tool, without a
// compiler. (What the emitted code means is tested by the facade's tests/tool_macro.rs
// and the trybuild suite.)

use proc_macro2::TokenStream;
use quote::quote;

use crate::expand::durable_tool;

fn expand(attr: TokenStream, item: TokenStream) -> syn::File {
    let output = durable_tool(attr, item);
    syn::parse2(output.clone())
        .unwrap_or_else(|e| panic!("expansion does not parse: {e}\n{output}"))
}

fn items(file: &syn::File) -> Vec<String> {
    file.items
        .iter()
        .map(|item| match item {
            syn::Item::Struct(s) => format!("struct {}", s.ident),
            syn::Item::Impl(i) => match &i.trait_ {
                Some((_, path, _)) => format!(
                    "impl {}",
                    path.segments
                        .last()
                        .map(|s| s.ident.to_string())
                        .unwrap_or_default()
                ),
                None => "impl".to_owned(),
            },
            syn::Item::Const(_) => "const".to_owned(),
            syn::Item::Macro(m) => format!(
                "{}!",
                m.mac
                    .path
                    .segments
                    .last()
                    .map(|s| s.ident.to_string())
                    .unwrap_or_default()
            ),
            other => format!("{:?}", std::mem::discriminant(other)),
        })
        .collect()
}

fn methods(file: &syn::File) -> Vec<String> {
    file.items
        .iter()
        .filter_map(|item| match item {
            syn::Item::Impl(i) if i.trait_.is_none() => Some(i),
            _ => None,
        })
        .flat_map(|i| i.items.iter())
        .filter_map(|item| match item {
            syn::ImplItem::Fn(f) => Some(f.sig.ident.to_string()),
            _ => None,
        })
        .collect()
}

#[test]
fn generated_form_emits_one_companion_struct() {
    let file = expand(
        quote!(replay = "unsafe_on_replay", verify = email_was_sent),
        quote! {
            /// Send an email.
            pub async fn send_email(
                /// Recipient.
                to: String,
                #[secret] body: String,
            ) -> Result<Receipt, MailError> { unreachable!() }
        },
    );
    assert_eq!(
        items(&file),
        [
            "struct send_email",
            "struct SendEmailArgs",
            "impl",
            "impl Tool",
            "const",
            "const"
        ]
    );
    assert_eq!(
        methods(&file),
        [
            "__durable_body",
            "spec",
            "call",
            "dangerous_call_unjournaled",
            "__durable_journaled"
        ]
    );
    let text = quote!(#file).to_string();
    assert!(text.contains("with_secret_args ([\"body\"])"), "{text}");
    assert!(text.contains("with_verify ()"), "{text}");
    assert!(text.contains("run_tool_verified"), "{text}");
    assert!(text.contains("deny_unknown_fields"), "{text}");
    // `#[secret]` and the parameter docs do not reach the re-emitted signatures.
    let body = file.items.iter().find_map(|item| match item {
        syn::Item::Impl(i) if i.trait_.is_none() => i.items.first(),
        _ => None,
    });
    let body = quote!(#body).to_string();
    assert!(
        !body.contains("secret") && !body.contains("Recipient"),
        "{body}"
    );
}

#[test]
fn struct_form_generates_no_args_struct() {
    let file = expand(
        quote!(replay = "pure"),
        quote!(
            async fn search(ctx: &ToolContext, #[args] query: SearchArgs) -> Result<Vec<Hit>, E> {
                unreachable!()
            }
        ),
    );
    assert_eq!(
        items(&file),
        ["struct search", "impl", "impl Tool", "const"]
    );
    let text = quote!(#file).to_string();
    assert!(text.contains("args_schema :: < SearchArgs >"), "{text}");
}

#[test]
fn renamed_crate_is_the_only_root() {
    let file = expand(
        quote!(
            replay = "idempotent_with_key",
            idempotency_key = |a| a.id.clone(),
            crate = "dur"
        ),
        quote!(
            async fn charge(id: String) -> Result<u8, E> {
                unreachable!()
            }
        ),
    );
    let text = quote!(#file).to_string();
    assert!(!text.contains("durable ::"), "{text}");
    assert!(text.contains("dur :: __private :: derive_key"), "{text}");
    assert!(text.contains("\"dur::__private::serde\""), "{text}");
}

#[test]
fn errors_fall_back_to_stubs_and_keep_the_body() {
    let output = durable_tool(
        quote!(replay = "maybe"),
        quote! {
            /// Docs.
            async fn read(path: String) -> Result<String, E> { let _ = 1; unreachable!() }
        },
    );
    let file: syn::File = syn::parse2(output).expect("fallback parses");
    assert_eq!(
        items(&file),
        [
            "compile_error!",
            "struct read",
            "struct ReadArgs",
            "impl",
            "impl Tool"
        ]
    );
    assert_eq!(methods(&file), ["__durable_body", "spec"]);
}

#[test]
fn every_error_is_reported_at_once() {
    let output = durable_tool(
        quote!(
            replay = "pure",
            retry = R::default(),
            verify = v,
            colour = 1
        ),
        quote!(
            fn read(&self) -> Result<String, E> {
                unreachable!()
            }
        ),
    );
    let text = output.to_string();
    assert_eq!(text.matches("compile_error").count(), 4, "{text}");
}

#[test]
fn not_a_function_is_kept() {
    let output = durable_tool(
        quote!(replay = "pure"),
        quote!(
            struct S;
        ),
    );
    let text = output.to_string();
    assert!(text.contains("applies to an `async fn`"), "{text}");
    assert!(text.contains("struct S"), "{text}");
}

#[test]
fn an_argument_named_journal_does_not_collide_with_the_journal_parameter() {
    let file = expand(
        quote!(replay = "pure"),
        quote!(
            async fn log(journal: String) -> Result<u8, E> {
                unreachable!()
            }
        ),
    );
    let call = file
        .items
        .iter()
        .filter_map(|item| match item {
            syn::Item::Impl(i) if i.trait_.is_none() => Some(i),
            _ => None,
        })
        .flat_map(|i| i.items.iter())
        .find_map(|item| match item {
            syn::ImplItem::Fn(f) if f.sig.ident == "call" => Some(f.sig.clone()),
            _ => None,
        })
        .expect("call method");
    let params: Vec<String> = call
        .inputs
        .iter()
        .filter_map(|input| match input {
            syn::FnArg::Typed(t) => Some(quote!(#t).to_string()),
            syn::FnArg::Receiver(_) => None,
        })
        .collect();
    assert_eq!(
        params,
        [
            "__durable_journal : & :: durable :: __private :: Journal",
            "journal : String"
        ]
    );
}

/// The parameters of a generated method, as token text.
fn method_params(file: &syn::File, name: &str) -> Vec<String> {
    let sig = file
        .items
        .iter()
        .filter_map(|item| match item {
            syn::Item::Impl(i) if i.trait_.is_none() => Some(i),
            _ => None,
        })
        .flat_map(|i| i.items.iter())
        .find_map(|item| match item {
            syn::ImplItem::Fn(f) if f.sig.ident == name => Some(f.sig.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no method `{name}`"));
    sig.inputs
        .iter()
        .filter_map(|input| match input {
            syn::FnArg::Typed(t) => Some(quote!(#t).to_string()),
            syn::FnArg::Receiver(_) => None,
        })
        .collect()
}

#[test]
fn the_key_parameter_is_supplied_by_the_runtime_not_the_model() {
    let file = expand(
        quote!(
            replay = "idempotent_with_key",
            idempotency_key = |a| a.order_id.clone()
        ),
        quote!(
            async fn charge(
                key: IdempotencyKey,
                ctx: &ToolContext,
                order_id: String,
            ) -> Result<u8, E> {
                unreachable!()
            }
        ),
    );
    // Not a model argument: no field, not a parameter of the typed call.
    let args = file.items.iter().find_map(|item| match item {
        syn::Item::Struct(s) if s.ident == "ChargeArgs" => Some(s),
        _ => None,
    });
    let fields: Vec<String> = args
        .expect("ChargeArgs")
        .fields
        .iter()
        .filter_map(|f| f.ident.as_ref().map(ToString::to_string))
        .collect();
    assert_eq!(fields, ["order_id"]);
    assert_eq!(
        method_params(&file, "call"),
        [
            "journal : & :: durable :: __private :: Journal",
            "order_id : String"
        ]
    );
    // The escape hatch keeps the user's exact parameters.
    assert_eq!(
        method_params(&file, "dangerous_call_unjournaled"),
        [
            "key : IdempotencyKey",
            "ctx : & ToolContext",
            "order_id : String"
        ]
    );
    let text = quote!(#file).to_string();
    assert!(
        text.contains(":: durable :: __private :: run_tool_keyed"),
        "{text}"
    );
    assert!(
        text.contains("__durable_key : :: durable :: __private :: IdempotencyKey"),
        "{text}"
    );
    assert!(
        text.contains("__durable_body (__durable_key , & __durable_ctx , order_id)"),
        "{text}"
    );
    assert!(text.contains("checked_key"), "{text}");
}

#[test]
fn approval_and_edits_reach_the_journaled_call() {
    let journaled = |attr: TokenStream| {
        let file = expand(
            attr,
            quote!(
                async fn refund(order: String, cents: u64) -> Result<u64, E> {
                    Ok(cents)
                }
            ),
        );
        let text = quote!(#file).to_string();
        let start = text
            .find("async fn __durable_journaled")
            .expect("journaled fn");
        text[start..].to_owned()
    };
    let plain = journaled(quote!(replay = "pure"));
    assert!(!plain.contains("require_approval"), "{plain}");
    assert!(plain.contains("accept_edits"), "{plain}");
    assert!(
        plain.contains("__durable_edited . or (& __durable_args)"),
        "{plain}"
    );
    let required = journaled(quote!(replay = "pure", approval = "required"));
    assert!(
        required.contains("require_approval (:: durable :: __private :: tool_rule"),
        "{required}"
    );
    let rule = journaled(quote!(replay = "unsafe_on_replay", approval = rules::large));
    assert!(
        rule.contains("rule_request :: < RefundArgs , _ > (Self :: spec () , rules :: large"),
        "{rule}"
    );
    let keyed = journaled(quote!(
        replay = "idempotent_with_key",
        idempotency_key = |a| a.order.clone()
    ));
    assert!(
        keyed.contains("Self :: __durable_key (__durable_edited_args , __durable_session)"),
        "{keyed}"
    );
}
