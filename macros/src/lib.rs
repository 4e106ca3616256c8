//! dusk-macros: the `#[kernel]` attribute, dusk's kernel language.
//!
//! A `#[kernel]` function is written in Triton's programming model with Rust syntax; the
//! macro turns it into a module of the same name whose `build` makes the kernel's IR
//! through `dusk::compiler::KernelBuilder`, and whose `launch` runs it with typed
//! arguments. See `docs/kernel-language.md` for the language.
//!
//! Two stages, as in CubeCL: `parse` reads syn's syntax tree into the language's own
//! (every construct the language does not have is an error at its span), and `generate`
//! turns that into builder calls.

use proc_macro::TokenStream;

mod generate;
mod parse;

/// Turns a function in the kernel language into a module with `build`, `launch` and
/// `inline` (only `inline` for a helper taking `Block<T>` parameters). Options: `num_warps = N` (default 4), `min_programs_per_sm = N`, `debug`
/// (print the IR when built).
#[proc_macro_attribute]
pub fn kernel(attr: TokenStream, item: TokenStream) -> TokenStream {
    let parsed = parse::kernel(attr.into(), item.into());
    let out = match (parsed.sig, parsed.body) {
        (Ok(sig), Ok(body)) => {
            let k = parse::ast::Kernel { sig, body };
            match generate::kernel(&k) {
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
