// Turns the annotated `ItemFn` into a typed IR. Nothing is checked here beyond what is
// needed to classify the pieces; `validate.rs` decides what is allowed. Every node keeps a
// reference to the original syntax for spans.

use syn::{
    Attribute, FnArg, GenericArgument, Ident, ItemFn, Pat, PatType, PathArguments, Receiver,
    ReturnType, Type,
};

/// The tool function.
pub(crate) struct ToolFn<'a> {
    pub(crate) original: &'a ItemFn,
    pub(crate) ident: &'a Ident,
    /// `#[doc = ...]` attributes of the fn: the tool's description and the struct's docs.
    pub(crate) docs: Vec<&'a Attribute>,
    /// `#[cfg(...)]`: copied onto every generated item.
    pub(crate) cfgs: Vec<&'a Attribute>,
    /// Everything else (`#[allow]`, `#[expect]`, `#[tracing::instrument]`, ...): kept on
    /// the body function, where the user's code lives.
    pub(crate) body_attrs: Vec<&'a Attribute>,
    pub(crate) receiver: Option<&'a Receiver>,
    /// The parameters in the order written.
    pub(crate) inputs: Vec<Input<'a>>,
    pub(crate) output: Output<'a>,
}

pub(crate) enum Input<'a> {
    Context(ContextParam<'a>),
    Key(KeyParam<'a>),
    Model(Param<'a>),
}

/// A parameter typed `&ToolContext` or `ToolContext` (recognised by the type's last path
/// segment, whatever path the user spelled it with).
pub(crate) struct ContextParam<'a> {
    pub(crate) original: &'a PatType,
    pub(crate) by_ref: bool,
    /// `&mut ToolContext`: recognised so that validate can say what to write instead.
    pub(crate) mutable: bool,
}

/// A parameter typed `IdempotencyKey` (recognised by the type's last path segment, like
/// the context), or a spelling of it that validate refuses.
pub(crate) struct KeyParam<'a> {
    pub(crate) original: &'a PatType,
    pub(crate) form: KeyForm,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum KeyForm {
    /// `IdempotencyKey`: the one accepted form.
    Value,
    /// `&IdempotencyKey` or `&mut IdempotencyKey`.
    Ref,
    /// `Option<IdempotencyKey>`.
    Option,
}

/// A parameter the model supplies.
pub(crate) struct Param<'a> {
    pub(crate) original: &'a PatType,
    /// The binding name, if the pattern is a plain (possibly `mut`) identifier.
    pub(crate) ident: Option<&'a Ident>,
    pub(crate) ty: &'a Type,
    /// `///` comments: the field's docs and its description in the schema.
    pub(crate) docs: Vec<&'a Attribute>,
    /// `#[serde(...)]` / `#[schemars(...)]`: forwarded to the argument struct's field.
    pub(crate) field_attrs: Vec<&'a Attribute>,
    pub(crate) secret: Option<&'a Attribute>,
    /// `#[args]`: this parameter's type is the whole argument struct.
    pub(crate) args: Option<&'a Attribute>,
    /// Any other attribute, kept on the body function's parameter.
    pub(crate) other_attrs: Vec<&'a Attribute>,
}

pub(crate) enum Output<'a> {
    /// No `-> ...`.
    Missing,
    /// Spelled `Result<T, E>` (any path ending in `Result` with two type arguments).
    Result {
        original: &'a Type,
        ok: &'a Type,
        err: &'a Type,
    },
    /// Anything else, e.g. `io::Result<T>`: resolved through the `ToolReturn` trait.
    Other(&'a Type),
}

impl<'a> Output<'a> {
    pub(crate) fn ty(&self) -> Option<&'a Type> {
        match self {
            Output::Missing => None,
            Output::Result { original, .. } => Some(original),
            Output::Other(ty) => Some(ty),
        }
    }
}

/// Macro-only parameter attributes, stripped from every re-emitted signature.
pub(crate) fn is_macro_param_attr(attr: &Attribute) -> bool {
    ["doc", "secret", "args", "serde", "schemars"]
        .iter()
        .any(|name| attr.path().is_ident(name))
}

impl<'a> ToolFn<'a> {
    pub(crate) fn from_item(item: &'a ItemFn) -> Self {
        let mut docs = Vec::new();
        let mut cfgs = Vec::new();
        let mut body_attrs = Vec::new();
        for attr in &item.attrs {
            if attr.path().is_ident("doc") {
                docs.push(attr);
            } else if attr.path().is_ident("cfg") {
                cfgs.push(attr);
            } else {
                body_attrs.push(attr);
            }
        }
        let mut receiver = None;
        let mut inputs = Vec::new();
        for input in &item.sig.inputs {
            match input {
                FnArg::Receiver(r) => receiver = Some(r),
                FnArg::Typed(pat_type) => inputs.push(Input::from_pat_type(pat_type)),
            }
        }
        ToolFn {
            original: item,
            ident: &item.sig.ident,
            docs,
            cfgs,
            body_attrs,
            receiver,
            inputs,
            output: Output::from_return(&item.sig.output),
        }
    }

    pub(crate) fn model_params(&self) -> impl Iterator<Item = &Param<'a>> {
        self.inputs.iter().filter_map(|input| match input {
            Input::Model(p) => Some(p),
            Input::Context(_) | Input::Key(_) => None,
        })
    }

    pub(crate) fn context_params(&self) -> impl Iterator<Item = &ContextParam<'a>> {
        self.inputs.iter().filter_map(|input| match input {
            Input::Context(c) => Some(c),
            Input::Key(_) | Input::Model(_) => None,
        })
    }

    pub(crate) fn key_params(&self) -> impl Iterator<Item = &KeyParam<'a>> {
        self.inputs.iter().filter_map(|input| match input {
            Input::Key(k) => Some(k),
            Input::Context(_) | Input::Model(_) => None,
        })
    }

    /// The `#[args]` parameter, if the tool uses the struct-argument form.
    pub(crate) fn struct_arg(&self) -> Option<&Param<'a>> {
        self.model_params().find(|p| p.args.is_some())
    }

    /// The fn name without a `r#` prefix.
    pub(crate) fn name(&self) -> String {
        unraw(self.ident)
    }
}

impl<'a> Input<'a> {
    fn from_pat_type(pat_type: &'a PatType) -> Self {
        if let Some((by_ref, mutable)) = context_type(&pat_type.ty) {
            return Input::Context(ContextParam {
                original: pat_type,
                by_ref,
                mutable,
            });
        }
        if let Some(form) = key_type(&pat_type.ty) {
            return Input::Key(KeyParam {
                original: pat_type,
                form,
            });
        }
        let mut param = Param {
            original: pat_type,
            ident: match &*pat_type.pat {
                Pat::Ident(p) if p.by_ref.is_none() && p.subpat.is_none() => Some(&p.ident),
                _ => None,
            },
            ty: &pat_type.ty,
            docs: Vec::new(),
            field_attrs: Vec::new(),
            secret: None,
            args: None,
            other_attrs: Vec::new(),
        };
        for attr in &pat_type.attrs {
            let path = attr.path();
            if path.is_ident("doc") {
                param.docs.push(attr);
            } else if path.is_ident("serde") || path.is_ident("schemars") {
                param.field_attrs.push(attr);
            } else if path.is_ident("secret") {
                param.secret = Some(attr);
            } else if path.is_ident("args") {
                param.args = Some(attr);
            } else {
                param.other_attrs.push(attr);
            }
        }
        Input::Model(param)
    }
}

/// `Some((by_ref, mutable))` if `ty` is `ToolContext`, `&ToolContext` or `&mut ToolContext`.
fn context_type(ty: &Type) -> Option<(bool, bool)> {
    let (inner, by_ref, mutable) = match ty {
        Type::Reference(r) => (&*r.elem, true, r.mutability.is_some()),
        other => (other, false, false),
    };
    match inner {
        Type::Path(p)
            if p.qself.is_none()
                && p.path
                    .segments
                    .last()
                    .is_some_and(|s| s.ident == "ToolContext" && s.arguments.is_empty()) =>
        {
            Some((by_ref, mutable))
        }
        Type::Paren(p) => context_type(&p.elem).map(|_| (by_ref, mutable)),
        _ => None,
    }
}

/// The form in which `ty` spells `IdempotencyKey`, if it does.
fn key_type(ty: &Type) -> Option<KeyForm> {
    match ty {
        Type::Reference(r) => is_key(&r.elem).then_some(KeyForm::Ref),
        Type::Paren(p) => key_type(&p.elem),
        Type::Path(p) if p.qself.is_none() => {
            let last = p.path.segments.last()?;
            if last.ident == "IdempotencyKey" && last.arguments.is_empty() {
                return Some(KeyForm::Value);
            }
            if last.ident == "Option"
                && let PathArguments::AngleBracketed(args) = &last.arguments
                && args.args.len() == 1
                && let Some(GenericArgument::Type(inner)) = args.args.first()
                && is_key(inner)
            {
                return Some(KeyForm::Option);
            }
            None
        }
        _ => None,
    }
}

fn is_key(ty: &Type) -> bool {
    key_type(ty) == Some(KeyForm::Value)
}

impl<'a> Output<'a> {
    fn from_return(output: &'a ReturnType) -> Self {
        let ty = match output {
            ReturnType::Default => return Output::Missing,
            ReturnType::Type(_, ty) => &**ty,
        };
        if let Type::Path(p) = ty
            && p.qself.is_none()
            && let Some(last) = p.path.segments.last()
            && last.ident == "Result"
            && let PathArguments::AngleBracketed(args) = &last.arguments
            && args.args.len() == 2
            && let (Some(GenericArgument::Type(ok)), Some(GenericArgument::Type(err))) =
                (args.args.first(), args.args.last())
        {
            return Output::Result {
                original: ty,
                ok,
                err,
            };
        }
        Output::Other(ty)
    }
}

pub(crate) fn unraw(ident: &Ident) -> String {
    let name = ident.to_string();
    match name.strip_prefix("r#") {
        Some(stripped) => stripped.to_owned(),
        None => name,
    }
}

/// `send_email` → `SendEmail`.
pub(crate) fn upper_camel(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut upper = true;
    for c in name.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::quote;

    fn item(tokens: proc_macro2::TokenStream) -> ItemFn {
        syn::parse2(tokens).expect("fn")
    }

    #[test]
    fn classifies_parameters_and_attributes() {
        let f = item(quote! {
            /// Charge a card.
            #[cfg(feature = "x")]
            #[allow(clippy::too_many_arguments)]
            async fn charge_card(
                ctx: &durable::ToolContext,
                /// The order.
                #[serde(default)] order_id: String,
                #[secret] mut cents: u64,
                (a, b): (u8, u8),
            ) -> std::result::Result<Charge, PayError> { unreachable!() }
        });
        let model = ToolFn::from_item(&f);
        assert_eq!(model.name(), "charge_card");
        assert_eq!(
            (model.docs.len(), model.cfgs.len(), model.body_attrs.len()),
            (1, 1, 1)
        );
        let ctx: Vec<_> = model.context_params().collect();
        assert_eq!(ctx.len(), 1);
        assert!(ctx[0].by_ref && !ctx[0].mutable);
        let params: Vec<_> = model.model_params().collect();
        assert_eq!(params.len(), 3);
        assert_eq!(
            params[0].ident.map(ToString::to_string).as_deref(),
            Some("order_id")
        );
        assert_eq!((params[0].docs.len(), params[0].field_attrs.len()), (1, 1));
        assert_eq!(
            params[1].ident.map(ToString::to_string).as_deref(),
            Some("cents")
        );
        assert!(params[1].secret.is_some());
        assert!(params[2].ident.is_none());
        assert!(matches!(model.output, Output::Result { .. }));
    }

    #[test]
    fn result_aliases_and_missing_outputs() {
        let f = item(quote!(
            async fn a() -> io::Result<u8> {
                unreachable!()
            }
        ));
        assert!(matches!(ToolFn::from_item(&f).output, Output::Other(_)));
        let f = item(quote!(
            async fn a() {}
        ));
        assert!(matches!(ToolFn::from_item(&f).output, Output::Missing));
        let f = item(quote!(
            async fn a(ctx: ToolContext, c: &mut ToolContext) {}
        ));
        let model = ToolFn::from_item(&f);
        let ctx: Vec<_> = model
            .context_params()
            .map(|c| (c.by_ref, c.mutable))
            .collect();
        assert_eq!(ctx, [(false, false), (true, true)]);
    }

    #[test]
    fn key_parameters_are_recognised_in_every_spelling() {
        let f = item(quote!(
            async fn a(
                k: durable::IdempotencyKey,
                r: &IdempotencyKey,
                o: Option<(IdempotencyKey)>,
                ctx: &ToolContext,
                id: String,
                n: Option<String>,
                v: Vec<IdempotencyKey>,
            ) {
            }
        ));
        let model = ToolFn::from_item(&f);
        let keys: Vec<_> = model.key_params().map(|k| k.form).collect();
        assert_eq!(keys, [KeyForm::Value, KeyForm::Ref, KeyForm::Option]);
        assert_eq!(model.context_params().count(), 1);
        assert_eq!(model.model_params().count(), 3);
    }

    #[test]
    fn names() {
        assert_eq!(upper_camel("send_email"), "SendEmail");
        assert_eq!(upper_camel("_x__y2z"), "XY2z");
        assert_eq!(upper_camel("read"), "Read");
        let f = item(quote!(
            async fn r#type() {}
        ));
        assert_eq!(ToolFn::from_item(&f).name(), "type");
    }
}
