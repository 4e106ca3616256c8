//! The kernel language's syntax tree to Rust: a module named after the kernel with
//!
//! - `build::<CONSTS>()`: the kernel's IR, made with the `KernelBuilder`;
//! - `launch::<CONSTS>(device, kernel, grid, args..)`: a launch with typed arguments;
//! - `inline::<CONSTS>(b, args..)`: the body, emitted into another kernel's builder (how
//!   one kernel calls another), after checking each argument against its parameter's type.
//!
//! A kernel with `Block<T>` parameters is a helper only: its module has just `inline`.

mod body;
mod carried;
mod support;
mod types;

use crate::parse::ast::{Kernel, LitOrConst, ParamTy, Signature};
use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::ext::IdentExt;
use syn::{Ident, LitStr};

/// The module for a kernel, with `extra` items added inside it (a policy's descriptor).
pub fn kernel(k: &Kernel, extra: TokenStream) -> syn::Result<TokenStream> {
    let b = builder_ident();
    let mut lower = body::Lower::new(b);
    for c in &k.sig.consts {
        lower.declare_const(c);
    }
    for p in &k.sig.params {
        lower.declare_param(p);
    }
    let body = lower.fn_body(&k.body, k.sig.returns)?;
    Ok(module(&k.sig, Some(body), extra))
}

/// The module for a kernel whose body has errors: the same items, with bodies that are
/// never run (the errors stop the build), so uses of the kernel do not report more errors.
pub fn stub(sig: &Signature) -> TokenStream {
    module(sig, None, TokenStream::new())
}

fn builder_ident() -> Ident {
    Ident::new("__b", Span::mixed_site())
}

fn module(sig: &Signature, body: Option<TokenStream>, extra: TokenStream) -> TokenStream {
    let b = builder_ident();
    let attrs = &sig.attrs;
    let vis = &sig.vis;
    let name = &sig.name;
    let kname = name.unraw().to_string();

    let const_decls: Vec<TokenStream> = sig
        .consts
        .iter()
        .map(|c| {
            let (n, t) = (&c.name, &c.ty);
            quote!(const #n: #t)
        })
        .collect();
    let type_params = &sig.type_params;
    let decls: Vec<TokenStream> = type_params
        .iter()
        .map(|t| quote!(#t: __dusk::runtime::Element))
        .chain(const_decls)
        .collect();
    let names: Vec<&Ident> = type_params
        .iter()
        .chain(sig.consts.iter().map(|c| &c.name))
        .collect();
    let (generics, turbofish) = if names.is_empty() {
        (quote!(), quote!())
    } else {
        (quote!(<#(#decls),*>), quote!(::<#(#names),*>))
    };

    // The kernel's name: the function's, then each type parameter's element type and each
    // constant's name and value (`copy_Tf16_N64`).
    let mut fmt = kname.clone();
    for n in &names {
        fmt.push_str(&format!("_{}{{}}", n.unraw()));
    }
    let fmt = LitStr::new(&fmt, Span::call_site());
    let name_var = Ident::new("name", Span::mixed_site());
    let values = type_params
        .iter()
        .map(|t| quote!(<#t as __dusk::runtime::Element>::DTYPE.lang_name()))
        .chain(sig.consts.iter().map(|c| {
            let n = &c.name;
            quote!(#n)
        }));
    let make_name = if names.is_empty() {
        quote!(let #name_var = ::std::string::String::from(#fmt);)
    } else {
        quote!(let #name_var = ::std::format!(#fmt, #(#values),*);)
    };

    let option = |o: &LitOrConst| match o {
        LitOrConst::Lit(n) => quote!(#n),
        LitOrConst::Const(c) => quote!((#c as u32)),
    };
    let num_warps = sig
        .options
        .num_warps
        .as_ref()
        .map(option)
        .unwrap_or_else(|| quote!(4));
    let min_programs = sig.options.min_programs_per_sm.as_ref().map(|n| {
        let n = option(n);
        quote!(#b.set_min_programs_per_sm(#n);)
    });
    let k = Ident::new("kernel", Span::mixed_site());
    let debug = sig
        .options
        .debug
        .then(|| quote!(::std::eprintln!("{}", __dusk::compiler::print::print_kernel(&#k));));

    // Parameters: in `build` as builder parameters, in `inline` as values, in `launch` as
    // host arguments.
    let param_vals: Vec<Ident> = (0..sig.params.len())
        .map(|i| format_ident!("__p{}", i, span = Span::mixed_site()))
        .collect();
    // A kernel with block parameters is a helper only: there is nothing to build or launch.
    let helper_only = sig
        .params
        .iter()
        .any(|p| matches!(p.ty, ParamTy::Block { .. }));
    let make_params = sig.params.iter().zip(&param_vals).map(|(p, v)| {
        let pname = LitStr::new(&p.name.unraw().to_string(), p.name.span());
        let call = match p.ty {
            ParamTy::Ptr(e) => {
                let d = types::dtype(e);
                quote!(#b.param_ptr(#pname, #d))
            }
            ParamTy::Scalar(e) => {
                let d = types::dtype(e);
                quote!(#b.param_scalar(#pname, #d))
            }
            ParamTy::Block { .. } => unreachable!("no `build` for kernels with block parameters"),
        };
        quote!(let #v = #call;)
    });
    let call_inline = quote!(inline #turbofish(&mut #b, #(#param_vals),*));
    let run_inline = if sig.returns.is_some() {
        quote!(let _ = #call_inline;)
    } else {
        quote!(#call_inline;)
    };

    let inline_params = sig.params.iter().map(|p| {
        let n = &p.name;
        let m = p.mutable.then(|| quote!(mut));
        quote!(#m #n: __dusk::compiler::Value)
    });
    let inline_ret = sig.returns.map(|r| {
        let values = (0..r.count).map(|_| quote!(__dusk::compiler::Value));
        if r.count == 1 {
            quote_spanned!(r.span=> -> __dusk::compiler::Value)
        } else {
            quote_spanned!(r.span=> -> (#(#values),*))
        }
    });
    // Each argument checked against its declared type as the helper is inlined.
    let check_args = sig.params.iter().map(|p| {
        let n = &p.name;
        let (elem, block) = types::elem_of(p.ty);
        let declared = LitStr::new(&types::spelled(p.ty), p.ty_span);
        let pname = LitStr::new(&n.unraw().to_string(), n.span());
        quote_spanned!(p.ty_span=> self::__dusk_rt::check_arg(#b, #n, #kname, #pname, #elem, #block, #declared);)
    });
    let stub_allow = body
        .is_none()
        .then(|| quote!(#[allow(unused_variables, unused_mut)]));
    let inline_body = match body {
        Some(b) => b,
        None => quote!(::core::unreachable!("this kernel failed to compile")),
    };

    let (device, kernel, grid) = (
        Ident::new("device", Span::mixed_site()),
        Ident::new("kernel", Span::mixed_site()),
        Ident::new("grid", Span::mixed_site()),
    );
    let launch_params = sig.params.iter().map(|p| {
        let n = &p.name;
        let ty = types::launch_param(p.ty, p.ty_span);
        quote!(#n: #ty)
    });
    let launch_args = sig
        .params
        .iter()
        .map(|p| {
            let n = &p.name;
            types::launch_arg(p.ty, &quote!(#n))
        })
        .collect::<Vec<_>>();
    let support = support::module();
    let root = match &sig.options.krate {
        Some(p) => quote!(#p),
        None => quote!(::dusk),
    };

    let doc_build = format!(
        " Builds kernel `{kname}` (named `{}` with its constants' values).",
        fmt.value().replace("{}", "N")
    );
    let doc_launch = format!(
        " Launches kernel `{kname}` (from [`build`], loaded on `device`) over `grid` programs, \
         with arguments typed after the kernel's parameters."
    );
    let entry = (!helper_only).then(|| {
        quote! {
            #[doc = #doc_build]
            pub fn build #generics () -> ::core::result::Result<__dusk::compiler::Kernel, __dusk::compiler::CompileError> {
                #make_name
                let mut #b = __dusk::compiler::KernelBuilder::new(&#name_var);
                #b.set_num_warps(#num_warps);
                #min_programs
                #(#make_params)*
                #run_inline
                let #k = #b.finish()?;
                #debug
                ::core::result::Result::Ok(#k)
            }

            #[doc = #doc_launch]
            #[allow(clippy::too_many_arguments)]
            pub fn launch #generics (
                #device: &__dusk::runtime::Device,
                #kernel: &__dusk::runtime::LoadedKernel,
                #grid: [u32; 3],
                #(#launch_params),*
            ) -> ::core::result::Result<(), __dusk::runtime::RuntimeError> {
                #device.launch(#kernel, #grid, &[#(#launch_args),*])
            }
        }
    });
    quote! {
        #(#attrs)*
        #vis mod #name {
            #[allow(unused_imports)]
            use super::*;
            /// Where dusk's crates are: `::dusk`, or the path given by `#[kernel(crate = "...")]`.
            #[allow(unused_imports)]
            use #root as __dusk;

            #entry

            /// Emits the kernel's body into `b` with the given parameter values: how another
            /// kernel calls this one.
            #[allow(
                clippy::too_many_arguments,
                clippy::approx_constant,
                clippy::unnecessary_cast,
                unused_parens
            )]
            #stub_allow
            pub fn inline #generics (
                #b: &mut __dusk::compiler::KernelBuilder,
                #(#inline_params),*
            ) #inline_ret {
                #(#check_args)*
                #inline_body
            }

            #support

            #extra
        }
    }
}
