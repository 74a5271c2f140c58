// The only place that names the runtime root. Generated code reaches the runtime through
// `<root>::__private::...`, where `<root>` is `::durable` or the `crate = "..."` path, and
// reaches the language through `::core::...` (a leading `::` skips any local `mod core`).

use proc_macro2::TokenStream;
use quote::{ToTokens, quote};
use syn::LitStr;

pub(crate) struct Paths {
    root: TokenStream,
}

impl Paths {
    pub(crate) fn new(krate: Option<&syn::Path>) -> Self {
        let root = match krate {
            Some(path) => path.to_token_stream(),
            None => quote!(::durable),
        };
        Paths { root }
    }

    /// `<root>::__private`.
    pub(crate) fn private(&self) -> TokenStream {
        let root = &self.root;
        quote!(#root::__private)
    }

    /// The value of `#[serde(crate = "...")]` on generated argument structs.
    pub(crate) fn serde_crate(&self) -> LitStr {
        self.crate_lit("serde")
    }

    /// The value of `#[schemars(crate = "...")]` on generated argument structs.
    pub(crate) fn schemars_crate(&self) -> LitStr {
        self.crate_lit("schemars")
    }

    fn crate_lit(&self, name: &str) -> LitStr {
        let private: String = self
            .private()
            .to_string()
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect();
        LitStr::new(
            &format!("{private}::{name}"),
            proc_macro2::Span::call_site(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_and_renamed_roots() {
        let default = Paths::new(None);
        assert_eq!(default.serde_crate().value(), "::durable::__private::serde");
        let path: syn::Path = syn::parse_str("dur").expect("path");
        let renamed = Paths::new(Some(&path));
        assert_eq!(renamed.schemars_crate().value(), "dur::__private::schemars");
        assert_eq!(renamed.private().to_string(), "dur :: __private");
    }
}
