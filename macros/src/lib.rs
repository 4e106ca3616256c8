//! dusk-macros: the `#[kernel]` attribute, dusk's kernel language.
//!
//! A `#[kernel]` function is written in Triton's programming model with Rust syntax; the
//! macro turns it into a module of the same name whose `build` makes the kernel's IR
//! through `dusk::compiler::KernelBuilder`, and whose `launch` runs it with typed
//! arguments. See `docs/kernel-language.md` for the language.
//!
//! `pipeline!` declares a select-then-prune pipeline over the builder (`pipeline/`, parsed
//! and generated apart like the kernel language).
//!
//! Two stages, as in CubeCL: `parse` reads syn's syntax tree into the language's own
//! (every construct the language does not have is an error at its span), and `generate`
//! turns that into builder calls.

use proc_macro::TokenStream;
use proc_macro2::TokenStream as TokenStream2;

mod generate;
mod parse;
mod pipeline;
mod policy;
mod suggest;

/// Turns a function in the kernel language into a module with `build`, `launch` and
/// `inline` (only `inline` for a helper taking `Block<T>` parameters). Options: `num_warps = N` (default 4), `min_programs_per_sm = N`, `debug`
/// (print the IR when built).
#[proc_macro_attribute]
pub fn kernel(attr: TokenStream, item: TokenStream) -> TokenStream {
    let parsed = parse::kernel(attr.into(), item.into());
    let out = match (parsed.sig, parsed.body) {
        (Ok(sig), Ok(body)) => {
            let k = parse::ast::Kernel { sig, body };
            match generate::kernel(&k, TokenStream2::new()) {
                Ok(ts) => ts,
                Err(e) => {
                    let mut ts = e.to_compile_error();
                    ts.extend(generate::stub(&k.sig));
                    ts
                }
            }
        }
        (Ok(sig), Err(e)) => {
            let mut ts = e.to_compile_error();
            ts.extend(generate::stub(&sig));
            ts
        }
        (Err(mut e), body) => {
            if let Err(b) = body {
                e.combine(b);
            }
            e.to_compile_error()
        }
    };
    out.into()
}

/// A pruning policy: a monotone predicate over the set of candidates kept at a threshold,
/// written in the kernel language, that the fused threshold search runs (see
/// `dusk::kernels::threshold`). Parameters named `mass` (f32, the kept weights' sum),
/// `count` (i32), `threshold` (f32, the smallest kept weight), `below` (f32, the largest
/// weight left out, negative when none is), `max_weight` (f32) and `candidates` (i32) are
/// the kept set's statistics; every other parameter (f32 or i32) is the policy's own, a value
/// per row, checked on the host by its `#[check(expr)]` attribute. A parameter whose name is
/// one slip away from a statistic's (`kount`) is an error, taken for a misspelling, unless
/// it is marked `#[param]` (or has a `#[check]`). Expands to a module with the predicate's
/// `inline` and `POLICY`, the descriptor the search is built from.
///
/// (Not a doc test: this crate's doc tests cannot use `dusk`, which depends on it. The
/// guide's policy example, in `docs/kernel-language.md`, is run as a doc test of `dusk`.)
///
/// ```ignore
/// #[dusk::policy]
/// pub fn top_p(mass: f32, #[check(p > 0.0 && p <= 1.0)] p: f32) -> bool {
///     mass >= p
/// }
/// ```
#[proc_macro_attribute]
pub fn policy(attr: TokenStream, item: TokenStream) -> TokenStream {
    policy::expand(attr.into(), item.into()).into()
}

/// A pipeline declared in a few lines: a selector, zero or more pruners (any `#[policy]`
/// with its parameters), an attention; expands to the builder's calls, an expression of
/// type `dusk::kernels::Result<dusk::kernels::pipeline::Pipeline>`, planned later with the
/// shapes (`Pipeline::plan`). Compositions that cannot work are errors here, at their
/// span: an unknown stage, selector or attention, dense attention after a selector or a
/// pruner, SparQ's output mix without SparQ's selector, a policy parameter left out or
/// misnamed.
///
/// ```ignore
/// let p = dusk::pipeline! {
///     select: Quest(budget = 0.25),
///     prune: top_p(p = 0.95),
///     attend: group_varlen,
/// }?;
/// ```
#[proc_macro]
pub fn pipeline(input: TokenStream) -> TokenStream {
    pipeline::expand(input.into()).into()
}
