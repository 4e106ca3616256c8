//! The private helpers every generated kernel module carries (`__dusk_rt`): the decisions
//! that need a value's type, which is only known when the kernel is built.

use proc_macro2::TokenStream;
use quote::quote;

pub fn module() -> TokenStream {
    quote! {
        #[allow(dead_code)]
        mod __dusk_rt {
            use super::__dusk;
            use __dusk::compiler::{Const, DType, Elem, KernelBuilder, Value};

            /// The type a number combined with `v` takes: `v`'s element type, or i32 (an
            /// offset) when `v` is a pointer.
            pub(super) fn arith_dtype(b: &KernelBuilder, v: Value) -> DType {
                match b.ty(v).elem {
                    Elem::Num(d) => d,
                    Elem::Ptr(_) | Elem::SharedPtr(_) => DType::I32,
                }
            }

            /// The element type `v` points to (or is).
            pub(super) fn pointee_dtype(b: &KernelBuilder, v: Value) -> DType {
                match b.ty(v).elem {
                    Elem::Num(d) | Elem::Ptr(d) | Elem::SharedPtr(d) => d,
                }
            }

            /// `prefetch_l2`: the bytes at each pointer brought into L2.
            #[track_caller]
            pub(super) fn prefetch_l2(
                b: &mut KernelBuilder,
                ptr: Value,
                mask: ::core::option::Option<Value>,
                bytes: u32,
            ) {
                b.prefetch(ptr, mask, bytes, __dusk::compiler::CacheLevel::L2);
            }

            /// An integer as a constant of type `d` (`as` semantics).
            #[track_caller]
            pub(super) fn int_const(b: &mut KernelBuilder, d: DType, v: i64) -> Value {
                let c = if d.is_float() {
                    Const::Float(v as f64)
                } else if d == DType::Bool {
                    Const::Bool(v != 0)
                } else {
                    Const::Int(v)
                };
                b.constant(c, d)
            }

            /// A float as a constant of type `d` (`as` semantics).
            #[track_caller]
            pub(super) fn float_const(b: &mut KernelBuilder, d: DType, v: f64) -> Value {
                let c = if d.is_float() {
                    Const::Float(v)
                } else if d == DType::Bool {
                    Const::Bool(v != 0.0)
                } else {
                    Const::Int(v as i64)
                };
                b.constant(c, d)
            }

            /// An integer literal meeting `like`: a constant of `like`'s type.
            #[track_caller]
            pub(super) fn int_like(b: &mut KernelBuilder, like: Value, v: i64) -> Value {
                let d = arith_dtype(b, like);
                int_const(b, d, v)
            }

            /// A float literal meeting `like`: a constant of `like`'s type when that is a
            /// float, else an f32 (and the op reports the mismatch).
            #[track_caller]
            pub(super) fn float_like(b: &mut KernelBuilder, like: Value, v: f64) -> Value {
                let d = arith_dtype(b, like);
                float_const(b, if d.is_float() { d } else { DType::F32 }, v)
            }

            /// An integer literal stored through or loaded from `p`: of the pointee's type.
            #[track_caller]
            pub(super) fn int_pointee(b: &mut KernelBuilder, p: Value, v: i64) -> Value {
                let d = pointee_dtype(b, p);
                int_const(b, d, v)
            }

            /// A float literal stored through or loaded from `p`.
            #[track_caller]
            pub(super) fn float_pointee(b: &mut KernelBuilder, p: Value, v: f64) -> Value {
                let d = pointee_dtype(b, p);
                float_const(b, if d.is_float() { d } else { DType::F32 }, v)
            }

            /// The values of an `#[unroll]` loop's variable; a step below 1 is a build error.
            #[track_caller]
            pub(super) fn unrolled(
                b: &mut KernelBuilder,
                lo: i64,
                hi: i64,
                step: i64,
            ) -> ::core::iter::StepBy<::core::ops::Range<i64>> {
                if step < 1 {
                    b.report(
                        "unroll",
                        ::std::format!("the step of an `#[unroll]` loop must be at least 1, found {step}"),
                    );
                    return (0..0).step_by(1);
                }
                (lo..hi).step_by(step as usize)
            }

            /// Checks that a helper's argument `v` has its parameter's declared type:
            /// `elem`, and a block (of any shape) when `block`, else a scalar.
            #[track_caller]
            pub(super) fn check_arg(
                b: &mut KernelBuilder,
                v: Value,
                helper: &str,
                param: &str,
                elem: Elem,
                block: bool,
                declared: &str,
            ) {
                let t = b.ty(v);
                if t.elem != elem || t.is_scalar() == block {
                    let msg = ::std::format!(
                        "`{helper}`'s parameter `{param}` is declared `{declared}`, but the argument is `{t}`"
                    );
                    b.report("call", msg);
                }
            }

            /// `x + y`: pointer arithmetic when either side is a pointer.
            #[track_caller]
            pub(super) fn add(b: &mut KernelBuilder, x: Value, y: Value) -> Value {
                let is_ptr = |b: &KernelBuilder, v: Value| b.ty(v).elem.pointee().is_some();
                if is_ptr(b, x) {
                    b.add_ptr(x, y)
                } else if is_ptr(b, y) {
                    b.add_ptr(y, x)
                } else {
                    b.add(x, y)
                }
            }
        }
    }
}
