//! Element and parameter types as the tokens the generated code uses.

use crate::parse::ast::{ElemTy, ParamTy};
use proc_macro2::{Ident, Span, TokenStream};
use quote::{quote, quote_spanned};

/// `dusk::compiler::DType::F32`, ...; for a type parameter `T`, its `Element::DTYPE`.
pub fn dtype(t: ElemTy) -> TokenStream {
    let v = match t {
        ElemTy::Param(_) => {
            let h = host(t);
            return quote!(<#h as __dusk::runtime::Element>::DTYPE);
        }
        ElemTy::F16 => quote!(F16),
        ElemTy::BF16 => quote!(BF16),
        ElemTy::F32 => quote!(F32),
        ElemTy::I32 => quote!(I32),
        ElemTy::I64 => quote!(I64),
        ElemTy::U8 => quote!(U8),
        ElemTy::Bool => quote!(Bool),
    };
    quote!(__dusk::compiler::DType::#v)
}

/// The host type of one element: what a `Buffer` of it holds, or a scalar argument is.
pub fn host(t: ElemTy) -> TokenStream {
    match t {
        ElemTy::F16 => quote!(__dusk::half::f16),
        ElemTy::BF16 => quote!(__dusk::half::bf16),
        ElemTy::F32 => quote!(f32),
        ElemTy::I32 => quote!(i32),
        ElemTy::I64 => quote!(i64),
        ElemTy::U8 => quote!(u8),
        ElemTy::Bool => quote!(bool),
        ElemTy::Param(n) => {
            let t = Ident::new(n, Span::call_site());
            quote!(#t)
        }
    }
}

/// The type of a parameter in the generated `launch`, spanned at the kernel's parameter type
/// (so type errors at a launch point at it).
pub fn launch_param(t: ParamTy, span: Span) -> TokenStream {
    match t {
        ParamTy::Ptr(e) => {
            let h = host(e);
            quote_spanned!(span=> &__dusk::runtime::Buffer<#h>)
        }
        ParamTy::Scalar(e) => {
            let h = host(e);
            quote_spanned!(span=> #h)
        }
        ParamTy::Block { .. } => unreachable!("no `launch` for kernels with block parameters"),
    }
}

/// A parameter's element (`dusk::compiler::Elem`) and whether it is a block.
pub fn elem_of(t: ParamTy) -> (TokenStream, bool) {
    let (e, ptr, block) = match t {
        ParamTy::Ptr(e) => (e, true, false),
        ParamTy::Scalar(e) => (e, false, false),
        ParamTy::Block { elem, ptr } => (elem, ptr, true),
    };
    let d = dtype(e);
    let elem = if ptr {
        quote!(__dusk::compiler::Elem::Ptr(#d))
    } else {
        quote!(__dusk::compiler::Elem::Num(#d))
    };
    (elem, block)
}

/// A parameter type as the kernel spells it: `Block<Ptr<f16>>`.
pub fn spelled(t: ParamTy) -> String {
    let name = |e: ElemTy| e.spelled();
    match t {
        ParamTy::Ptr(e) => format!("Ptr<{}>", name(e)),
        ParamTy::Scalar(e) => name(e),
        ParamTy::Block { elem, ptr: true } => format!("Block<Ptr<{}>>", name(elem)),
        ParamTy::Block { elem, ptr: false } => format!("Block<{}>", name(elem)),
    }
}

/// `x` as a launch argument.
pub fn launch_arg(t: ParamTy, x: &TokenStream) -> TokenStream {
    let v = match t {
        ParamTy::Ptr(_) | ParamTy::Block { .. } => return quote!(__dusk::runtime::Arg::from(#x)),
        ParamTy::Scalar(ElemTy::I32) => quote!(I32),
        ParamTy::Scalar(ElemTy::I64) => quote!(I64),
        ParamTy::Scalar(ElemTy::F32) => quote!(F32),
        ParamTy::Scalar(ElemTy::U8) => quote!(U8),
        ParamTy::Scalar(ElemTy::Bool) => quote!(Bool),
        // The parser accepts no other scalar parameters.
        ParamTy::Scalar(_) => return quote!(__dusk::runtime::Arg::from(#x)),
    };
    quote!(__dusk::runtime::Arg::#v(#x))
}
