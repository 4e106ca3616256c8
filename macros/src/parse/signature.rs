//! The attribute's arguments and the function's signature: const generics and parameters.

use super::ast::{ConstParam, ElemTy, Options, Param, ParamTy, Returns, Signature};
use super::Errors;
use proc_macro2::TokenStream;
use quote::ToTokens;
use syn::spanned::Spanned;
use syn::{
    Error, FnArg, GenericArgument, GenericParam, Ident, Pat, PathArguments, ReturnType, Type,
};

const PARAM_TYPES: &str = "kernel parameters are `Ptr<T>` (T one of f16, bf16, f32, i32, i64, u8) \
     or the scalars i32, i64, f32, u8, bool; helpers may also take blocks, `Block<T>` or \
     `Block<Ptr<T>>`";

/// `num_warps = N`, `min_programs_per_sm = N` (literals or constant generics), `debug`,
/// `crate = "path"`.
pub fn options(attr: TokenStream) -> syn::Result<Options> {
    let mut o = Options::default();
    let parser = syn::meta::parser(|meta| {
        if meta.path.is_ident("num_warps") {
            o.num_warps = Some(meta.value()?.parse()?);
            Ok(())
        } else if meta.path.is_ident("min_programs_per_sm") {
            o.min_programs_per_sm = Some(meta.value()?.parse()?);
            Ok(())
        } else if meta.path.is_ident("debug") {
            o.debug = true;
            Ok(())
        } else if meta.path.is_ident("crate") {
            let lit: syn::LitStr = meta.value()?.parse()?;
            o.krate = Some(lit.parse()?);
            Ok(())
        } else {
            Err(meta.error(format!(
                "unknown #[kernel] option `{}`; the options are `num_warps = N` (default 4), \
                 `min_programs_per_sm = N`, `debug` and `crate = \"path\"`",
                meta.path.to_token_stream()
            )))
        }
    });
    syn::parse::Parser::parse2(parser, attr)?;
    Ok(o)
}

pub fn signature(f: &syn::ItemFn) -> syn::Result<Signature> {
    let mut errors = Errors::default();
    let s = &f.sig;
    if let Some(t) = &s.constness {
        errors.push(Error::new(
            t.span(),
            "#[kernel] functions cannot be `const`",
        ));
    }
    if let Some(t) = &s.asyncness {
        errors.push(Error::new(
            t.span(),
            "#[kernel] functions cannot be `async`",
        ));
    }
    if let Some(t) = &s.unsafety {
        errors.push(Error::new(
            t.span(),
            "#[kernel] functions cannot be `unsafe`",
        ));
    }
    if let Some(t) = &s.abi {
        errors.push(Error::new(
            t.span(),
            "#[kernel] functions cannot have an ABI",
        ));
    }
    if let Some(v) = &s.variadic {
        errors.push(Error::new(
            v.span(),
            "#[kernel] functions cannot be variadic",
        ));
    }
    let (type_params, consts) = generics(&s.generics, &mut errors);
    let mut params = vec![];
    for arg in &s.inputs {
        match arg {
            FnArg::Receiver(r) => errors.push(Error::new(
                r.span(),
                "#[kernel] functions take no `self`; write a free function",
            )),
            FnArg::Typed(pt) => {
                if let Some(p) = errors.take(param(&pt.pat, &pt.ty)) {
                    params.push(p);
                }
            }
        }
    }
    let returns = match &s.output {
        ReturnType::Default => None,
        ReturnType::Type(_, t) => {
            let count = match &**t {
                Type::Tuple(tt) if tt.elems.len() < 2 => {
                    errors.push(Error::new(
                        t.span(),
                        "a #[kernel] helper returns one value (`-> Tensor`) or a tuple of two or \
                         more (`-> (i32, i64)`); for no value, leave out the return type",
                    ));
                    1
                }
                Type::Tuple(tt) => tt.elems.len(),
                _ => 1,
            };
            Some(Returns {
                span: t.span(),
                count,
            })
        }
    };
    errors.finish(Signature {
        attrs: f.attrs.clone(),
        vis: f.vis.clone(),
        name: s.ident.clone(),
        type_params,
        consts,
        params,
        options: Options::default(),
        returns,
    })
}

/// The type parameters (each an element type: no bounds, no default) and the const
/// generics, the type parameters first.
fn generics(g: &syn::Generics, errors: &mut Errors) -> (Vec<Ident>, Vec<ConstParam>) {
    let mut types = vec![];
    let mut out: Vec<ConstParam> = vec![];
    for p in &g.params {
        match p {
            GenericParam::Type(t) => {
                if !t.bounds.is_empty() || t.default.is_some() || t.colon_token.is_some() {
                    errors.push(Error::new(
                        t.span(),
                        format!(
                            "type parameter `{}`: a #[kernel] function's type parameter takes no \
                             bounds or default; it stands for an element type (f16, bf16, f32, \
                             i32, i64 or u8), chosen when the kernel is built (`build::<f16>()`)",
                            t.ident
                        ),
                    ));
                }
                if !out.is_empty() {
                    errors.push(Error::new(
                        t.span(),
                        format!(
                            "type parameter `{}`: a #[kernel] function's type parameters come \
                             before its const generics",
                            t.ident
                        ),
                    ));
                }
                types.push(t.ident.clone());
            }
            GenericParam::Const(c) => {
                if let Some(d) = &c.default {
                    errors.push(Error::new(d.span(), "const generics of #[kernel] functions take no default"));
                }
                let name = match &c.ty {
                    Type::Path(tp) if tp.qself.is_none() => tp.path.get_ident().map(|i| i.to_string()),
                    _ => None,
                };
                let is_int = matches!(
                    name.as_deref(),
                    Some("usize" | "u8" | "u16" | "u32" | "u64" | "isize" | "i8" | "i16" | "i32" | "i64")
                );
                let is_bool = name.as_deref() == Some("bool");
                if !is_int && !is_bool {
                    errors.push(Error::new(
                        c.ty.span(),
                        "const generics of #[kernel] functions are integers (`const N: usize`) or `bool`",
                    ));
                }
                out.push(ConstParam {
                    name: c.ident.clone(),
                    ty: c.ty.clone(),
                    is_bool,
                });
            }
            GenericParam::Lifetime(l) => errors.push(Error::new(
                l.span(),
                "lifetimes are not supported in #[kernel] functions; kernel values are plain values",
            )),
        }
    }
    if let Some(w) = &g.where_clause {
        errors.push(Error::new(
            w.span(),
            "`where` clauses are not supported in #[kernel] functions",
        ));
    }
    (types, out)
}

fn param(pat: &Pat, ty: &Type) -> syn::Result<Param> {
    let (name, mutable) = match pat {
        Pat::Ident(pi) if pi.by_ref.is_none() && pi.subpat.is_none() => {
            (pi.ident.clone(), pi.mutability.is_some())
        }
        _ => {
            return Err(Error::new(
                pat.span(),
                "kernel parameters are plain names (`x: Ptr<f32>`), not patterns",
            ))
        }
    };
    Ok(Param {
        name,
        mutable,
        ty: param_ty(ty)?,
        ty_span: ty.span(),
    })
}

fn param_ty(ty: &Type) -> syn::Result<ParamTy> {
    let bad = || {
        Error::new_spanned(
            ty,
            format!("unsupported parameter type `{}`; {PARAM_TYPES}", pretty(ty)),
        )
    };
    let Some((name, arg)) = generic_path(ty) else {
        return Err(bad());
    };
    match (name.as_str(), arg) {
        ("Ptr", Some(arg)) => ptr_elem(ty, arg).map(ParamTy::Ptr),
        ("Block", Some(arg)) => match generic_path(arg) {
            Some((inner, Some(p))) if inner == "Ptr" => Ok(ParamTy::Block {
                elem: ptr_elem(ty, p)?,
                ptr: true,
            }),
            Some((inner, None)) => match ElemTy::from_name(&inner) {
                Some(elem) => Ok(ParamTy::Block { elem, ptr: false }),
                None => Err(Error::new_spanned(
                    ty,
                    format!(
                        "unsupported block element type in `{}`; blocks are `Block<T>` or \
                         `Block<Ptr<T>>` with T one of f16, bf16, f32, i32, i64, u8 (or bool)",
                        pretty(ty)
                    ),
                )),
            },
            _ => Err(bad()),
        },
        (scalar, None) => match ElemTy::from_name(scalar) {
            Some(e @ (ElemTy::I32 | ElemTy::I64 | ElemTy::F32 | ElemTy::U8 | ElemTy::Bool)) => {
                Ok(ParamTy::Scalar(e))
            }
            Some(ElemTy::Param(t)) => Err(Error::new_spanned(
                ty,
                format!(
                    "a scalar parameter of type parameter `{t}` is not supported; `{t}` is the \
                     element of a pointer or a block (`Ptr<{t}>`, `Block<{t}>`): pass an f32 \
                     and convert it with `as {t}`"
                ),
            )),
            _ => Err(bad()),
        },
        _ => Err(bad()),
    }
}

/// `Name` or `path::Name<Arg>`: the last segment's name and its one type argument.
fn generic_path(ty: &Type) -> Option<(String, Option<&Type>)> {
    let Type::Path(tp) = ty else { return None };
    if tp.qself.is_some() {
        return None;
    }
    let last = tp.path.segments.last()?;
    let name = last.ident.to_string();
    match &last.arguments {
        PathArguments::None if tp.path.segments.len() == 1 => Some((name, None)),
        PathArguments::AngleBracketed(args) => match args.args.iter().collect::<Vec<_>>()[..] {
            [GenericArgument::Type(t)] => Some((name, Some(t))),
            _ => None,
        },
        _ => None,
    }
}

/// The `T` of `Ptr<T>` (`whole` is the parameter's type, for the error).
fn ptr_elem(whole: &Type, arg: &Type) -> syn::Result<ElemTy> {
    if let Some((n, None)) = generic_path(arg) {
        if let Some(e) = ElemTy::from_name(&n).filter(|e| *e != ElemTy::Bool) {
            return Ok(e);
        }
    }
    Err(Error::new_spanned(
        whole,
        format!(
            "unsupported pointer element type in `{}`; pointers are `Ptr<T>` with T one \
             of f16, bf16, f32, i32, i64, u8",
            pretty(whole)
        ),
    ))
}

/// Tokens as a person writes them: `Vec<f32>`, not `Vec < f32 >`.
pub fn pretty(t: &impl ToTokens) -> String {
    let s = t.to_token_stream().to_string();
    s.replace(" < ", "<")
        .replace("< ", "<")
        .replace(" <", "<")
        .replace(" >", ">")
        .replace(" ,", ",")
        .replace(" :: ", "::")
        .replace(":: ", "::")
        .replace("& ", "&")
}
