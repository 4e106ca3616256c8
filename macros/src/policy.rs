//! `#[policy]`: a predicate in the kernel language plus the descriptor the threshold search
//! is built from, and a `Params` struct of the policy's own parameters (what `pipeline!`
//! fills in). The predicate goes through the kernel language's own parse and generate
//! stages (it becomes an inline helper kernel); this module only sorts its parameters into
//! the kept set's statistics and the policy's own values, and reads their `#[check]`s and
//! `#[param]`s.

use crate::{generate, parse, suggest};
use proc_macro2::{Span, TokenStream};
use quote::quote;
use syn::spanned::Spanned;
use syn::{Error, FnArg, Ident, LitStr, Pat, Type};

/// The statistics a predicate may take, with their types and the `KeptStats` field each
/// reads.
const STATS: [(&str, &str); 6] = [
    ("mass", "f32"),
    ("count", "i32"),
    ("threshold", "f32"),
    ("below", "f32"),
    ("max_weight", "f32"),
    ("candidates", "i32"),
];

enum Arg {
    Stat(Ident),
    Param {
        name: Ident,
        ty: Ident,
        check: Option<syn::Expr>,
    },
}

pub fn expand(attr: TokenStream, item: TokenStream) -> TokenStream {
    match expand_inner(attr, item) {
        Ok(ts) => ts,
        Err(e) => e.to_compile_error(),
    }
}

fn expand_inner(attr: TokenStream, item: TokenStream) -> syn::Result<TokenStream> {
    let mut func: syn::ItemFn = syn::parse2(item)
        .map_err(|e| Error::new(e.span(), format!("#[policy] goes on a function: {e}")))?;
    match &func.sig.output {
        syn::ReturnType::Type(_, t) if quote!(#t).to_string() == "bool" => {}
        other => {
            return Err(Error::new(
                other.span(),
                "a policy returns `bool`: whether the candidates kept at a threshold satisfy it",
            ))
        }
    }
    let mut args = vec![];
    for input in func.sig.inputs.iter_mut() {
        let FnArg::Typed(pt) = input else {
            return Err(Error::new(input.span(), "a policy takes no `self`"));
        };
        let Pat::Ident(pi) = &*pt.pat else {
            return Err(Error::new(
                pt.pat.span(),
                "policy parameters are plain names",
            ));
        };
        let name = pi.ident.clone();
        let ty = match &*pt.ty {
            Type::Path(p) if p.path.get_ident().is_some() => p.path.get_ident().cloned().unwrap(),
            t => {
                return Err(Error::new(
                    t.span(),
                    "policy parameters are `f32` or `i32` values",
                ))
            }
        };
        let mut check = None;
        let mut param = None;
        let mut rest = vec![];
        for a in pt.attrs.drain(..) {
            if a.path().is_ident("check") {
                check = Some(a.parse_args::<syn::Expr>()?);
            } else if a.path().is_ident("param") {
                a.meta.require_path_only()?;
                param = Some(a.path().span());
            } else {
                rest.push(a);
            }
        }
        pt.attrs = rest;
        let stat = STATS.iter().find(|(s, _)| name == s);
        if let (Some(_), Some(at)) = (stat, param) {
            return Err(Error::new(
                at,
                format!(
                    "`{name}` is a statistic of the kept set, filled in by the search; give the \
                     policy's own parameter another name"
                ),
            ));
        }
        // A name one slip away from a statistic is taken for a misspelt statistic, unless
        // it is declared the policy's own (`#[param]`, or a `#[check]`): otherwise `kount`
        // would silently become a parameter, and fail only when a plan runs.
        if stat.is_none() && param.is_none() && check.is_none() {
            let known = STATS.iter().map(|(s, _)| *s);
            if let Some(meant) = suggest::closest(&name.to_string(), known) {
                return Err(Error::new(
                    name.span(),
                    format!(
                        "`{name}` is not a statistic of the kept set; did you mean `{meant}`? \
                         (mark it #[param] if it is the policy's own parameter)"
                    ),
                ));
            }
        }
        if let Some((_, want)) = stat {
            if ty != want {
                return Err(Error::new(
                    ty.span(),
                    format!("`{name}` is the kept set's statistic of type `{want}`"),
                ));
            }
            if check.is_some() {
                return Err(Error::new(
                    name.span(),
                    format!("`{name}` is computed by the search; only the policy's own parameters take #[check]"),
                ));
            }
            args.push(Arg::Stat(name));
        } else {
            if ty != "f32" && ty != "i32" {
                return Err(Error::new(
                    ty.span(),
                    format!("policy parameter `{name}` must be `f32` or `i32` (a value per row), found `{ty}`"),
                ));
            }
            args.push(Arg::Param { name, ty, check });
        }
    }

    let (attr, target) = split_target(attr, &args)?;
    let parsed = parse::kernel(attr, quote!(#func));
    let sig = parsed.sig?;
    if !sig.consts.is_empty() {
        return Err(Error::new(
            sig.name.span(),
            "a policy has no constant generics: its parameters are values per row",
        ));
    }
    let body = parsed.body?;
    let k = parse::ast::Kernel { sig, body };
    let extra = descriptor(&k.sig.name, &args, target);
    generate::kernel(&k, extra)
}

/// `POLICY` and the function that calls the predicate with the search's values.
fn descriptor(name: &Ident, args: &[Arg], target: TokenStream) -> TokenStream {
    let b = Ident::new("__b", Span::mixed_site());
    let stats = Ident::new("__stats", Span::mixed_site());
    let vals = Ident::new("__params", Span::mixed_site());
    let mut call_args = vec![];
    let mut params = vec![];
    let mut i = 0usize;
    for a in args {
        match a {
            Arg::Stat(n) => call_args.push(quote!(#stats.#n)),
            Arg::Param { name, ty, check } => {
                call_args.push(quote!(#vals[#i]));
                i += 1;
                let pname = LitStr::new(&name.to_string(), name.span());
                let dtype = if ty == "f32" {
                    quote!(__dusk::compiler::DType::F32)
                } else {
                    quote!(__dusk::compiler::DType::I32)
                };
                let v = Ident::new("__v", Span::mixed_site());
                let (cond, text) = match check {
                    Some(e) => (quote!(#e), quote!(#e).to_string()),
                    None if ty == "i32" => (quote!(true), "any integer".to_string()),
                    None => (quote!(true), "any finite value".to_string()),
                };
                let text = LitStr::new(&text, Span::call_site());
                let integral = if ty == "i32" {
                    quote!(#v.fract() == 0.0 && #v >= i32::MIN as f64 && #v <= i32::MAX as f64 &&)
                } else {
                    quote!()
                };
                params.push(quote! {
                    __dusk::kernels::threshold::PolicyParam {
                        name: #pname,
                        dtype: #dtype,
                        check: {
                            #[allow(clippy::unnecessary_cast, unused_variables)]
                            fn __check(#v: f64) -> bool {
                                #v.is_finite() && #integral {
                                    let #name = #v as #ty;
                                    #cond
                                }
                            }
                            __check
                        },
                        expected: #text,
                    }
                });
            }
        }
    }
    let own: Vec<(&Ident, &Ident)> = args
        .iter()
        .filter_map(|a| match a {
            Arg::Param { name, ty, .. } => Some((name, ty)),
            Arg::Stat(_) => None,
        })
        .collect();
    // In `Params`, an f32 parameter is an f64 (as `ParamValues` holds values; the device
    // gets f32), so `p = 0.95` reads back as 0.95; an i32 one stays i32.
    let (own_names, own_types): (Vec<&Ident>, Vec<TokenStream>) = own
        .into_iter()
        .map(|(n, t)| (n, if t == "f32" { quote!(f64) } else { quote!(i32) }))
        .unzip();
    let pname = LitStr::new(&name.to_string(), name.span());
    let reads: Vec<LitStr> = args
        .iter()
        .filter_map(|a| match a {
            Arg::Stat(n) => Some(LitStr::new(&n.to_string(), n.span())),
            Arg::Param { .. } => None,
        })
        .collect();
    quote! {
        fn __predicate(
            #b: &mut __dusk::compiler::KernelBuilder,
            #stats: &__dusk::kernels::threshold::KeptStats,
            #vals: &[__dusk::compiler::Value],
        ) -> __dusk::compiler::Value {
            inline(#b, #(#call_args),*)
        }

        /// The policy, for `dusk::kernels::threshold` (the fused search) and
        /// `dusk::kernels::prune::PrunePlan`.
        pub const POLICY: __dusk::kernels::threshold::Policy = __dusk::kernels::threshold::Policy {
            name: #pname,
            params: &[#(#params),*],
            reads: &[#(#reads),*],
            target: #target,
            predicate: __predicate,
        };

        /// The policy's own parameters, one value for every row: what `pipeline!` fills in
        /// (a parameter left out there is a compile error).
        #[derive(Clone, Copy, Debug, PartialEq)]
        pub struct Params {
            #(pub #own_names: #own_types,)*
        }

        impl Params {
            /// The values in the policy's order, as `PrunePlan` and the pipeline builder
            /// take them.
            #[allow(clippy::unnecessary_cast)]
            pub fn values(&self) -> ::std::vec::Vec<__dusk::kernels::prune::ParamValues> {
                ::std::vec![#(__dusk::kernels::prune::ParamValues::Uniform(self.#own_names as f64)),*]
            }
        }
    }
}

/// Takes `target(mass = p)` or `target(count = k)` out of the attribute's options: the
/// search's interpolation hint, naming one of the policy's own parameters. The other
/// options go to the kernel language as they are.
fn split_target(attr: TokenStream, args: &[Arg]) -> syn::Result<(TokenStream, TokenStream)> {
    use syn::punctuated::Punctuated;
    use syn::{Meta, Token};
    let metas: Punctuated<Meta, Token![,]> =
        syn::parse::Parser::parse2(Punctuated::parse_terminated, attr)?;
    let mut rest = Punctuated::<Meta, Token![,]>::new();
    let mut target = quote!(::core::option::Option::None);
    for m in metas {
        if !m.path().is_ident("target") {
            rest.push(m);
            continue;
        }
        let list = m.require_list()?;
        let nv: syn::MetaNameValue = list.parse_args()?;
        let kind = match nv.path.get_ident().map(|i| i.to_string()).as_deref() {
            Some("mass") => quote!(Mass),
            Some("count") => quote!(Count),
            _ => {
                return Err(Error::new(
                    nv.path.span(),
                    "the search's target is `target(mass = param)` or `target(count = param)`",
                ))
            }
        };
        let syn::Expr::Path(pe) = &nv.value else {
            return Err(Error::new(
                nv.value.span(),
                "name one of the policy's parameters",
            ));
        };
        let wanted = pe.path.get_ident().cloned();
        let index = args
            .iter()
            .filter_map(|a| match a {
                Arg::Param { name, .. } => Some(name),
                Arg::Stat(_) => None,
            })
            .position(|n| Some(n) == wanted.as_ref())
            .ok_or_else(|| {
                Error::new(
                    nv.value.span(),
                    "the target names one of the policy's own parameters",
                )
            })?;
        target = quote!(::core::option::Option::Some(
            __dusk::kernels::threshold::SearchTarget::#kind(#index)
        ));
    }
    Ok((quote!(#rest), target))
}
