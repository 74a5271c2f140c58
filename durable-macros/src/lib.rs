//! The `#[durable_tool]` attribute of `durable`.
//!
//! Use it through the `durable` crate (`durable::durable_tool`), whose documentation is
//! the reference: generated code names the runtime through `::durable::__private`, so
//! this crate is not usable on its own.
//!
//! Internals: parse (`args`, `model`) → validate (`validate`) → generate (`expand`), or
//! on any error `fallback`; both re-emit the user's fn through `body`; `paths` is the only
//! module that names the runtime root.

mod args;
mod body;
mod ctxt;
mod expand;
mod fallback;
mod model;
mod paths;
mod validate;

use proc_macro::TokenStream;

/// Turns an `async fn` into a durable tool. See `durable::durable_tool` for the
/// reference documentation.
#[proc_macro_attribute]
pub fn durable_tool(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::durable_tool(args.into(), item.into()).into()
}

#[cfg(test)]
mod tests;
