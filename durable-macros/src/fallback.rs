// What is emitted when the attribute or the signature is rejected: the errors, plus the
// items a successful expansion would define, so that the rest of the crate (and the IDE)
// keeps resolving `send_email`, `SendEmailArgs` and `send_email::spec()` and reports
// nothing but the real problem. The user's body is kept, unchanged, so errors inside it
// are still reported and it is still analysed. The stubs never run: the crate does not
// compile while the error stands.

use proc_macro2::TokenStream;
use quote::quote;

use crate::body::{body_fn, without_macro_attrs};
use crate::model::{ToolFn, upper_camel};
use crate::paths::Paths;

pub(crate) fn fallback(p: &Paths, tool: &ToolFn<'_>, error: &syn::Error) -> TokenStream {
    let private = p.private();
    let errors = error.to_compile_error();
    if tool.receiver.is_some() {
        // A method lives in an `impl` block, where no struct can be declared: keep the
        // method as written (minus macro-only attributes) and report the error only.
        let method = without_macro_attrs(tool.original);
        return quote!(#errors #method);
    }
    let vis = &tool.original.vis;
    let ident = tool.ident;
    let cfgs = &tool.cfgs;
    let docs = &tool.docs;
    let body = body_fn(tool);
    let params: Vec<_> = tool.model_params().collect();
    let args_struct = (tool.struct_arg().is_none() && params.iter().all(|p| p.ident.is_some()))
        .then(|| {
            let args_ident = syn::Ident::new(
                &format!("{}Args", upper_camel(&tool.name())),
                tool.ident.span(),
            );
            let names = params.iter().filter_map(|p| p.ident);
            let types = params.iter().map(|p| p.ty);
            quote! {
                #(#cfgs)*
                #[doc(hidden)]
                #vis struct #args_ident { #(pub #names: #types,)* }
            }
        });
    quote! {
        #errors

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

        #args_struct

        #(#cfgs)*
        impl #ident {
            #[allow(dead_code)]
            #body

            #[doc(hidden)]
            #vis fn spec() -> &'static #private::ToolSpec {
                ::core::unreachable!("`#[durable_tool]` reported an error for this tool")
            }
        }

        #(#cfgs)*
        impl #private::Tool for #ident {
            fn spec(&self) -> &#private::ToolSpec {
                ::core::unreachable!("`#[durable_tool]` reported an error for this tool")
            }

            fn invoke<'__durable>(
                &'__durable self,
                _: &'__durable #private::Journal,
                _: #private::Value,
            ) -> #private::BoxFuture<'__durable, ::core::result::Result<#private::ToolOutput, #private::DurableError>> {
                ::core::unreachable!("`#[durable_tool]` reported an error for this tool")
            }
        }
    }
}

/// The attribute is on something that is not a function: emit it unchanged.
pub(crate) fn not_a_function(item: TokenStream, error: &syn::Error) -> TokenStream {
    let errors = error.to_compile_error();
    quote!(#errors #item)
}
