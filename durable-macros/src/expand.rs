// Code generation. The pipeline is `durable_tool`: parse (args.rs, model.rs) → validate
// (validate.rs) → generate (below) or, on any error, fallback.rs.
//
// Names used below: `P` = `<root>::__private` (paths.rs), `Args` = the argument type (the
// generated `SendEmailArgs` or the user's `#[args]` struct), `R` = the user's return type,
// `T`/`E` = its `Ok`/`Err` types (spelled out when the user wrote `Result<T, E>`, else
// `<R as P::ToolReturn>::Ok`/`::Err`).

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Ident, ItemFn, Pat};

use crate::args;
use crate::body::body_fn;
use crate::ctxt::Ctxt;
use crate::fallback;
use crate::model::{Input, Output, ToolFn, unraw, upper_camel};
use crate::paths::Paths;
use crate::validate::{self, Approval, Checked, Class, KeyFn};

pub(crate) fn durable_tool(attr: TokenStream, item: TokenStream) -> TokenStream {
    let debug = std::env::var("DURABLE_MACROS_DEBUG").ok();
    let name = debug
        .as_ref()
        .and_then(|_| syn::parse2::<ItemFn>(item.clone()).ok())
        .map(|item| unraw(&item.sig.ident));
    let output = expand(attr, item);
    if let Some(filter) = debug {
        debug_print(&filter, name.as_deref(), &output);
    }
    output
}

fn expand(attr: TokenStream, item: TokenStream) -> TokenStream {
    let item_fn: ItemFn = match syn::parse2(item.clone()) {
        Ok(item_fn) => item_fn,
        Err(_) => {
            let error = syn::Error::new(
                Span::call_site(),
                "`#[durable_tool]` applies to an `async fn`; put it on the function that implements the tool",
            );
            return fallback::not_a_function(item, &error);
        }
    };
    let cx = Ctxt::new();
    let tool = ToolFn::from_item(&item_fn);
    let parsed = match args::parse(&cx, attr) {
        Ok(parsed) => Some(parsed),
        Err(error) => {
            cx.syn_error(error);
            None
        }
    };
    let checked = parsed
        .as_ref()
        .and_then(|parsed| validate::validate(&cx, parsed, &tool));
    let paths = Paths::new(
        parsed
            .as_ref()
            .and_then(|parsed| parsed.krate.get())
            .map(|arg| &arg.value),
    );
    match (cx.check(), checked) {
        (Ok(()), Some(checked)) => generate(&paths, &tool, &checked),
        (Err(error), _) => fallback::fallback(&paths, &tool, &error),
        (Ok(()), None) => {
            // validate returns nothing only after reporting an error.
            let error = syn::Error::new(
                Span::call_site(),
                "durable-macros bug: nothing validated and no error",
            );
            fallback::fallback(&paths, &tool, &error)
        }
    }
}

/// `DURABLE_MACROS_DEBUG=1` (or empty) prints every expansion to stderr;
/// `DURABLE_MACROS_DEBUG=<fn name>` only that tool's.
fn debug_print(filter: &str, name: Option<&str>, output: &TokenStream) {
    if filter.is_empty() || filter == "1" || name == Some(filter) {
        eprintln!(
            "--- #[durable_tool] expansion of `{}` ---\n{output}\n---",
            name.unwrap_or("?")
        );
    }
}

/// The argument type: where it comes from and how the body's parameters are bound from it.
struct ArgsShape {
    /// The type, as a path or the user's type tokens.
    ty: TokenStream,
    /// The generated struct (empty in the struct-argument form).
    definition: TokenStream,
    /// The pattern binding the user's parameter names from an `Args` value.
    destructure: TokenStream,
    /// Expression building `Args` from the user's parameter names (typed `call`).
    construct: TokenStream,
}

// Expansion of
//
//     /// Docs.
//     #[durable_tool(replay = "...", ...)]
//     vis async fn send_email(ctx: &ToolContext, to: String) -> R { body }
//
// (cfg attributes are repeated on every item):
//
//     /// Docs.
//     #[allow(non_camel_case_types)]
//     #[derive(Clone, Copy, Debug, Default)]
//     vis struct send_email;
//
//     /// Arguments of the [`send_email`] tool ...
//     #[derive(P::serde::Serialize, P::serde::Deserialize, P::schemars::JsonSchema, Clone)]
//     #[serde(crate = "P::serde", deny_unknown_fields)]
//     #[schemars(crate = "P::schemars", title = "", description = "")]
//     vis struct SendEmailArgs { /// param docs
//                                pub to: String }
//
//     impl send_email {
//         #[other attributes] #[doc(hidden)]
//         async fn __durable_body(ctx: &ToolContext, to: String) -> R { body }
//         vis fn spec() -> &'static P::ToolSpec { /* OnceLock */ }
//         vis async fn call(&self, journal: &P::Journal, to: String) -> Result<T, P::CallError<E>>
//         vis async fn dangerous_call_unjournaled(&self, ctx: &ToolContext, to: String) -> R
//         #[doc(hidden)] fn __durable_key(&Args, &P::SessionId)   // keyed tools only
//             -> Result<P::String, P::DurableError>
//         #[doc(hidden)] async fn __durable_journaled(journal, args: Args, value: P::Value)
//             -> Result<T, P::CallError<E>>   // journal.tool(spec, value).key(..) + P::run_tool*
//     }
//
//     impl P::Tool for send_email { fn spec(&self) ..; fn invoke(..) -> P::BoxFuture<..> }
//
//     const _: fn() = P::assert_tool_argument::<String>;   // spanned on each argument type
//     const _: fn() = P::assert_tool_return::<R>;          // if R is not spelled `Result<..>`
fn generate(p: &Paths, tool: &ToolFn<'_>, checked: &Checked<'_>) -> TokenStream {
    let private = p.private();
    let vis = &tool.original.vis;
    let ident = tool.ident;
    let cfgs = &tool.cfgs;
    let docs = &tool.docs;
    let shape = args_shape(p, tool);
    let args_ty = &shape.ty;
    let args_definition = &shape.definition;
    let (ok_ty, err_ty) = ok_err(&private, &tool.output);
    let ret = tool
        .output
        .ty()
        .map(ToTokens::to_token_stream)
        .unwrap_or_default();
    let call_result = quote!(::core::result::Result<#ok_ty, #private::CallError<#err_ty>>);

    let body_fn = body_fn(tool);
    let spec_fn = spec_fn(&private, tool, checked, args_ty);
    let call_fn = call_fn(&private, tool, &shape, &call_result);
    let dangerous_fn = dangerous_fn(tool, &ret);
    let journaled_fn = journaled_fn(&private, tool, checked, &shape, &call_result);
    let tool_impl = tool_impl(&private, tool, args_ty, checked.key.is_some());
    let checks = checks(&private, tool);

    quote! {
        #(#cfgs)*
        #(#docs)*
        #[allow(non_camel_case_types)]
        #[derive(
            ::core::clone::Clone,
            ::core::marker::Copy,
            ::core::fmt::Debug,
            ::core::default::Default
        )]
        #vis struct #ident;

        #args_definition

        #(#cfgs)*
        impl #ident {
            #body_fn
            #spec_fn
            #call_fn
            #dangerous_fn
            #journaled_fn
        }

        #(#cfgs)*
        #tool_impl

        #(#checks)*
    }
}

fn ok_err(private: &TokenStream, output: &Output<'_>) -> (TokenStream, TokenStream) {
    match output {
        Output::Result { ok, err, .. } => (ok.to_token_stream(), err.to_token_stream()),
        Output::Other(ty) => (
            quote!(<#ty as #private::ToolReturn>::Ok),
            quote!(<#ty as #private::ToolReturn>::Err),
        ),
        Output::Missing => (quote!(()), quote!(())),
    }
}

fn args_shape(p: &Paths, tool: &ToolFn<'_>) -> ArgsShape {
    let private = p.private();
    if let Some(param) = tool.struct_arg() {
        let ty = param.ty.to_token_stream();
        let name = param
            .ident
            .map(ToTokens::to_token_stream)
            .unwrap_or_default();
        return ArgsShape {
            definition: TokenStream::new(),
            destructure: name.clone(),
            construct: name,
            ty,
        };
    }
    let vis = &tool.original.vis;
    let cfgs = &tool.cfgs;
    let name = format!("{}Args", upper_camel(&tool.name()));
    let args_ident = Ident::new(&name, tool.ident.span());
    let doc = format!(
        " Arguments of the [`{}`] tool, as the model sends them (generated by `#[durable_tool]`).",
        tool.ident
    );
    let serde_crate = p.serde_crate();
    let schemars_crate = p.schemars_crate();
    let params: Vec<_> = tool.model_params().collect();
    let fields = params.iter().map(|param| {
        let docs = &param.docs;
        let attrs = &param.field_attrs;
        let name = param.ident;
        let ty = param.ty;
        quote!(#(#docs)* #(#attrs)* pub #name: #ty)
    });
    let names: Vec<_> = params.iter().filter_map(|param| param.ident).collect();
    ArgsShape {
        ty: args_ident.to_token_stream(),
        definition: quote! {
            #(#cfgs)*
            #[doc = #doc]
            #[derive(
                #private::serde::Serialize,
                #private::serde::Deserialize,
                #private::schemars::JsonSchema,
                ::core::clone::Clone
            )]
            #[serde(crate = #serde_crate, deny_unknown_fields)]
            #[schemars(crate = #schemars_crate, title = "", description = "")]
            #vis struct #args_ident {
                #(#fields,)*
            }
        },
        destructure: quote!(#args_ident { #(#names),* }),
        construct: quote!(#args_ident { #(#names),* }),
    }
}

fn spec_fn(
    private: &TokenStream,
    tool: &ToolFn<'_>,
    checked: &Checked<'_>,
    args_ty: &TokenStream,
) -> TokenStream {
    let vis = &tool.original.vis;
    let name = syn::LitStr::new(&checked.name, checked.name_span);
    let description = match checked.description {
        Some(lit) => lit.to_token_stream(),
        None => {
            let lines = tool.docs.iter().filter_map(|attr| match &attr.meta {
                syn::Meta::NameValue(nv) => Some(&nv.value),
                _ => None,
            });
            quote!(#private::doc_text(&[#(#lines),*]))
        }
    };
    let class = match checked.class {
        Class::Pure => quote!(Pure),
        Class::IdempotentWithKey => quote!(IdempotentWithKey),
        Class::UnsafeOnReplay => quote!(UnsafeOnReplay),
    };
    let retry = checked.retry.map(|retry| {
        quote_spanned!(retry.span()=> let __durable_spec = __durable_spec.with_retry(#retry);)
    });
    let secrets = (!checked.secrets.is_empty()).then(|| {
        let secrets = &checked.secrets;
        quote!(let __durable_spec = __durable_spec.with_secret_args([#(#secrets),*]);)
    });
    let verify = checked
        .verify
        .map(|_| quote!(let __durable_spec = __durable_spec.with_verify();));
    let rate_limit = checked
        .rate_limit
        .map(|limit| quote!(let __durable_spec = __durable_spec.with_rate_limit(#limit);));
    let doc = format!(
        " The `{}` tool's description: name, description, replay class `{}`, argument schema and \
         its fingerprint. Built on first use.",
        checked.name,
        checked.class.as_str()
    );
    quote! {
        #[doc = #doc]
        #vis fn spec() -> &'static #private::ToolSpec {
            static __DURABLE_SPEC: #private::OnceLock<#private::ToolSpec> = #private::OnceLock::new();
            __DURABLE_SPEC.get_or_init(|| {
                let __durable_spec = #private::ToolSpec::new(
                    #name,
                    #description,
                    #private::ReplayClass::#class,
                    #private::args_schema::<#args_ty>(),
                );
                #retry
                #secrets
                #verify
                #rate_limit
                __durable_spec
            })
        }
    }
}

fn call_fn(
    private: &TokenStream,
    tool: &ToolFn<'_>,
    shape: &ArgsShape,
    call_result: &TokenStream,
) -> TokenStream {
    let vis = &tool.original.vis;
    let params: Vec<_> = tool.model_params().collect();
    let names: Vec<_> = params.iter().filter_map(|p| p.ident).collect();
    let types = params.iter().map(|p| p.ty);
    // The journal parameter is called `journal` unless the tool has an argument of that name.
    let journal = if names.iter().any(|n| unraw(n) == "journal") {
        format_ident!("__durable_journal")
    } else {
        format_ident!("journal")
    };
    let construct = &shape.construct;
    let doc = format!(
        " Calls `{}` through the session's journal: the first time it runs and its outcome is \
         recorded; on a replay the recorded outcome is returned without running it, and an in-doubt \
         call is handled as its replay class says.",
        tool.name()
    );
    quote! {
        #[doc = #doc]
        ///
        /// # Errors
        /// `CallError::Tool` when the tool failed now, `CallError::Recorded` when a
        /// recorded failure was replayed, `CallError::Durable` when the runtime refused
        /// the call or the store failed.
        #vis async fn call(&self, #journal: &#private::Journal, #(#names: #types),*) -> #call_result {
            let __durable_args = #construct;
            let __durable_value = match #private::encode_args(Self::spec(), &__durable_args) {
                ::core::result::Result::Ok(value) => value,
                ::core::result::Result::Err(error) => {
                    return ::core::result::Result::Err(#private::CallError::Durable(error));
                }
            };
            Self::__durable_journaled(#journal, __durable_args, __durable_value).await
        }
    }
}

/// The name a forwarded parameter gets in generated signatures.
fn forward_name(input: &Input<'_>, index: usize) -> Ident {
    let pat = match input {
        Input::Context(c) => &c.original.pat,
        Input::Key(k) => &k.original.pat,
        Input::Model(p) => &p.original.pat,
    };
    match &**pat {
        Pat::Ident(p) if p.by_ref.is_none() && p.subpat.is_none() => p.ident.clone(),
        _ => format_ident!("__durable_arg{}", index),
    }
}

fn dangerous_fn(tool: &ToolFn<'_>, ret: &TokenStream) -> TokenStream {
    let vis = &tool.original.vis;
    let names: Vec<Ident> = tool
        .inputs
        .iter()
        .enumerate()
        .map(|(i, input)| forward_name(input, i))
        .collect();
    let types = tool.inputs.iter().map(|input| match input {
        Input::Context(c) => &c.original.ty,
        Input::Key(k) => &k.original.ty,
        Input::Model(p) => &p.original.ty,
    });
    quote! {
        /// Runs the tool's body directly, **without the journal**: nothing is recorded, a
        /// replay does not know this call happened, and an effect that cannot be repeated
        /// safely can be repeated. For tests of the body and deliberate one-off use; agents
        /// go through [`call`](Self::call) or a toolbox.
        #vis async fn dangerous_call_unjournaled(&self, #(#names: #types),*) -> #ret {
            Self::__durable_body(#(#names),*).await
        }
    }
}

// Expansion of the journaled call (`Args` and `R` as above):
//
//     // keyed tools only: the rule, expanded once, for this call and `Tool::derive_key`
//     #[doc(hidden)]
//     fn __durable_key(__durable_args: &Args, __durable_session: &P::SessionId)
//         -> Result<P::String, P::DurableError>
//     { P::checked_key(Self::spec(), P::derive_key(__durable_args, <rule>)) }   // refuses ""
//
//     #[doc(hidden)]
//     async fn __durable_journaled(__durable_journal: &P::Journal, __durable_args: Args,
//                                  __durable_value: P::Value) -> Result<T, P::CallError<E>> {
//         // arguments a person edited before approving the call, if any
//         let __durable_edited = P::EditedArgs::<Args>::new();
//         let __durable_call = __durable_journal.tool(Self::spec(), __durable_value);
//         // keyed: let __durable_call = __durable_call.key(Self::__durable_key(..)?);
//         // approval = "required":
//         //     let __durable_call = __durable_call.require_approval(P::tool_rule(Self::spec()));
//         // approval = rule:
//         //     let __durable_call = match P::rule_request::<Args, _>(spec, rule, &__durable_args)
//         //         { Some(request) => __durable_call.require_approval(request), None => .. };
//         let __durable_call = __durable_call.accept_edits(__durable_edited.check(Self::spec(),
//             |edited| Ok(None)));   // keyed: Self::__durable_key(edited, session).map(Some)
//         P::run_tool(__durable_call, |__durable_ctx: P::ToolContext| {
//             let Args { to } = __durable_edited.or(&__durable_args);
//             async move { P::ToolReturn::into_result(Self::__durable_body(&__durable_ctx, to).await) }
//         }).await
//         // keyed: P::run_tool_keyed, whose closure also takes `__durable_key: P::IdempotencyKey`
//         //        (the recorded key) and passes it where the user declared `key: IdempotencyKey`;
//         // verify: P::run_tool_verified(__durable_call, <run>, |__durable_ctx| verify(&ctx, &args)),
//         //         `args` from `__durable_edited.or(&__durable_args)` too
//     }
fn journaled_fn(
    private: &TokenStream,
    tool: &ToolFn<'_>,
    checked: &Checked<'_>,
    shape: &ArgsShape,
    call_result: &TokenStream,
) -> TokenStream {
    let args_ty = &shape.ty;
    let destructure = &shape.destructure;
    // The key rule lives in one hidden fn, used by the journaled call and by
    // `Tool::derive_key` (the replay check), so the user's expression is expanded once.
    let key_fn = checked.key.as_ref().map(|key| {
        let derive = match key {
            KeyFn::Args(expr) => quote_spanned! {expr.span()=>
                #private::derive_key(__durable_args, #expr)
            },
            KeyFn::ArgsAndSession(expr) => quote_spanned! {expr.span()=>
                #private::derive_key_with_session(__durable_args, __durable_session, #expr)
            },
        };
        quote! {
            #[doc(hidden)]
            fn __durable_key(
                __durable_args: &#args_ty,
                __durable_session: &#private::SessionId,
            ) -> ::core::result::Result<#private::String, #private::DurableError> {
                #private::checked_key(Self::spec(), #derive)
            }
        }
    });
    let key = checked.key.as_ref().map(|_| {
        quote! {
            let __durable_call = match Self::__durable_key(
                &__durable_args,
                __durable_journal.session_id(),
            ) {
                ::core::result::Result::Ok(__durable_key) => __durable_call.key(__durable_key),
                ::core::result::Result::Err(__durable_error) => {
                    return ::core::result::Result::Err(#private::CallError::Durable(__durable_error));
                }
            };
        }
    });
    let approval = checked.approval.as_ref().map(|approval| match approval {
        Approval::Required => quote! {
            let __durable_call =
                __durable_call.require_approval(#private::tool_rule(Self::spec()));
        },
        Approval::Rule(path) => {
            // Spanned on the path, so a fn of the wrong shape is reported there.
            let request = quote_spanned! {path.span()=>
                #private::rule_request::<#args_ty, _>(Self::spec(), #path, &__durable_args)
            };
            quote! {
                let __durable_call = match #request {
                    ::core::option::Option::Some(__durable_request) => {
                        __durable_call.require_approval(__durable_request)
                    }
                    ::core::option::Option::None => __durable_call,
                };
            }
        }
    });
    // An approved call with edited arguments runs with them (and a keyed one under the
    // key derived from them): the journal hands them to this check before anything runs.
    let edited_key = if checked.key.is_some() {
        quote! {
            Self::__durable_key(__durable_edited_args, __durable_session)
                .map(::core::option::Option::Some)
        }
    } else {
        quote! {
            let _ = (__durable_edited_args, __durable_session);
            ::core::result::Result::Ok(::core::option::Option::None)
        }
    };
    let edits = quote! {
        let __durable_session = __durable_journal.session_id();
        let __durable_call = __durable_call.accept_edits(__durable_edited.check(
            Self::spec(),
            move |__durable_edited_args: &#args_ty| { #edited_key },
        ));
    };
    let body_args = tool.inputs.iter().map(|input| match input {
        Input::Context(c) if c.by_ref => quote!(&__durable_ctx),
        Input::Context(_) => quote!(__durable_ctx),
        Input::Key(_) => quote!(__durable_key),
        Input::Model(p) => p.ident.map(ToTokens::to_token_stream).unwrap_or_default(),
    });
    // Every keyed tool runs through `run_tool_keyed`, which hands the body the recorded
    // key (and refuses to run it without one), whether or not the body takes it.
    let keyed = checked.class == Class::IdempotentWithKey;
    let key_param = keyed.then(|| quote!(, __durable_key: #private::IdempotencyKey));
    let run = quote! {
        |__durable_ctx: #private::ToolContext #key_param| {
            let #destructure = __durable_edited.or(&__durable_args);
            async move {
                #private::ToolReturn::into_result(Self::__durable_body(#(#body_args),*).await)
            }
        }
    };
    // `run_tool*` are bounded by `ToolOutputValue` / `ToolErrorValue`, so a result or error
    // type lacking a trait is reported with their notes.
    let out_span = output_span(tool);
    let run_call = match checked.verify {
        None => {
            let run_tool = if keyed {
                quote_spanned!(out_span=> #private::run_tool_keyed)
            } else {
                quote_spanned!(out_span=> #private::run_tool)
            };
            quote!(#run_tool(__durable_call, #run).await)
        }
        Some(verify) => {
            let check =
                quote_spanned!(verify.span()=> (#verify)(&__durable_ctx, __durable_args).await);
            let verify = quote! {
                |__durable_ctx: #private::ToolContext| {
                    let __durable_args = __durable_edited.or(&__durable_args);
                    async move {
                        let __durable_args = &__durable_args;
                        #check
                    }
                }
            };
            let run_tool = quote_spanned!(out_span=> #private::run_tool_verified);
            quote!(#run_tool(__durable_call, #run, #verify).await)
        }
    };
    quote! {
        #key_fn

        #[doc(hidden)]
        async fn __durable_journaled(
            __durable_journal: &#private::Journal,
            __durable_args: #args_ty,
            __durable_value: #private::Value,
        ) -> #call_result {
            let __durable_edited = #private::EditedArgs::<#args_ty>::new();
            let __durable_call = __durable_journal.tool(Self::spec(), __durable_value);
            #key
            #approval
            #edits
            #run_call
        }
    }
}

fn output_span(tool: &ToolFn<'_>) -> Span {
    tool.output
        .ty()
        .map_or_else(|| tool.ident.span(), Spanned::span)
}

fn tool_impl(
    private: &TokenStream,
    tool: &ToolFn<'_>,
    args_ty: &TokenStream,
    keyed: bool,
) -> TokenStream {
    let ident = tool.ident;
    let derive_key = if keyed {
        quote! {
            ::core::option::Option::Some(
                #private::decode_args::<#args_ty>(#ident::spec(), args)
                    .and_then(|__durable_args| #ident::__durable_key(&__durable_args, session)),
            )
        }
    } else {
        quote! {
            let _ = (args, session);
            ::core::option::Option::None
        }
    };
    let tool_output = quote_spanned!(output_span(tool)=> #private::tool_output);
    // A body that is not `Send` fails here, where the future is boxed for toolboxes on
    // multi-threaded runtimes; the span puts the error on the tool's name.
    let boxed = quote_spanned! {tool.ident.span()=>
        #private::Box::pin(async move {
            let __durable_spec = #ident::spec();
            let __durable_args: #args_ty = match #private::decode_args(__durable_spec, &args) {
                ::core::result::Result::Ok(decoded) => decoded,
                ::core::result::Result::Err(error) => return ::core::result::Result::Err(error),
            };
            #tool_output(__durable_spec, #ident::__durable_journaled(journal, __durable_args, args).await)
        })
    };
    quote! {
        impl #private::Tool for #ident {
            fn spec(&self) -> &#private::ToolSpec {
                #ident::spec()
            }

            fn check_args(
                &self,
                args: &#private::Value,
            ) -> ::core::result::Result<(), #private::DurableError> {
                #private::decode_args::<#args_ty>(#ident::spec(), args).map(|_| ())
            }

            fn derive_key(
                &self,
                args: &#private::Value,
                session: &#private::SessionId,
            ) -> ::core::option::Option<::core::result::Result<#private::String, #private::DurableError>> {
                #derive_key
            }

            fn invoke<'__durable>(
                &'__durable self,
                journal: &'__durable #private::Journal,
                args: #private::Value,
            ) -> #private::BoxFuture<'__durable, ::core::result::Result<#private::ToolOutput, #private::DurableError>> {
                #boxed
            }
        }
    }
}

/// Hidden items that state each type requirement once, spanned on the user's type, so a
/// missing derive is reported there with the `on_unimplemented` note of durable-core.
fn checks(private: &TokenStream, tool: &ToolFn<'_>) -> Vec<TokenStream> {
    let cfgs = &tool.cfgs;
    let mut checks = Vec::new();
    for param in tool.model_params() {
        let ty = param.ty;
        checks.push(
            quote_spanned!(ty.span()=> const _: fn() = #private::assert_tool_argument::<#ty>;),
        );
    }
    // `T` and `E` need no item of their own: the calls that use them (`run_tool`,
    // `tool_output`) are bounded by the marker traits and spanned on the return type.
    if let Output::Other(ty) = &tool.output {
        checks
            .push(quote_spanned!(ty.span()=> const _: fn() = #private::assert_tool_return::<#ty>;));
    }
    checks
        .into_iter()
        .map(|check| quote!(#(#cfgs)* #check))
        .collect()
}
