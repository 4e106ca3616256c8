//! `pipeline!`: a pipeline declared in a few lines, over the builder
//! (`dusk::kernels::pipeline::PipelineBuilder`). Two stages, as for `#[kernel]`: [`parse`]
//! reads the declaration into its syntax tree and checks what can be checked without
//! shapes (the stages known and given once, a selector's options, the compositions that
//! cannot work), each error at the user's span; [`generate`] turns it into the builder's
//! calls. A policy's parameters become its `Params` struct literal, so one left out is
//! the compiler's `missing field` error at the policy's name.

mod generate;
mod parse;

use proc_macro2::TokenStream;

pub fn expand(input: TokenStream) -> TokenStream {
    match parse::pipeline(input) {
        Ok(p) => generate::pipeline(&p),
        Err(e) => e.to_compile_error(),
    }
}
