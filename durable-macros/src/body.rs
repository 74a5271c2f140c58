// The user's function as both outputs re-emit it: expand.rs (a successful expansion) and
// fallback.rs (an error) keep the body as the user wrote it, renamed `__durable_body` and
// without the macro-only parameter attributes. Both import from here, so neither imports
// the other's internals and dependencies point one way: expand.rs → fallback.rs → body.rs.

use proc_macro2::TokenStream;
use quote::quote;
use syn::{FnArg, Ident, ItemFn};

use crate::model::{ToolFn, is_macro_param_attr};

/// The user's function with the macro-only parameter attributes (`///`, `#[secret]`,
/// `#[args]`, `#[serde]`, `#[schemars]`) removed, which rustc would reject on a fn.
pub(crate) fn without_macro_attrs(item: &ItemFn) -> ItemFn {
    let mut item = item.clone();
    for input in &mut item.sig.inputs {
        if let FnArg::Typed(pat_type) = input {
            pat_type.attrs.retain(|attr| !is_macro_param_attr(attr));
        }
    }
    item
}

/// The user's function, renamed and with macro-only parameter attributes removed.
pub(crate) fn body_fn(tool: &ToolFn<'_>) -> TokenStream {
    let attrs = &tool.body_attrs;
    let mut sig = without_macro_attrs(tool.original).sig;
    sig.ident = Ident::new("__durable_body", tool.ident.span());
    let block = &tool.original.block;
    // `clippy::unused_async` is allowed because the macro, not the user, requires `async`
    // (a pure tool may well not await). It comes before the user's attributes so that
    // their own `#[expect]`/`#[warn]` of that lint still wins.
    quote! {
        #[allow(clippy::unused_async)]
        #(#attrs)*
        #[doc(hidden)]
        #sig #block
    }
}
