//! syn's syntax tree to the kernel language's ([`ast`]). Everything the language does not
//! have is a `syn::Error` at the offending span that says what to write instead; errors
//! are collected, so one expansion reports all of them.

pub mod ast;
mod body;
mod builtins;
mod signature;

use ast::{Block, Signature};
use proc_macro2::TokenStream;

/// The result of parsing a `#[kernel]` function: the signature and the body fail apart,
/// so a kernel with a bad body still gets its module (with a stub body), and uses of it
/// elsewhere do not pile up errors.
pub struct Parsed {
    pub sig: syn::Result<Signature>,
    pub body: syn::Result<Block>,
}

/// Parses the attribute's arguments and the function it is on.
pub fn kernel(attr: TokenStream, item: TokenStream) -> Parsed {
    let func: syn::ItemFn = match syn::parse2(item) {
        Ok(f) => f,
        Err(e) => {
            let e = syn::Error::new(e.span(), format!("#[kernel] goes on a function: {e}"));
            return Parsed {
                sig: Err(e.clone()),
                body: Err(e),
            };
        }
    };
    // The function's type parameters are element types in its signature and body.
    let type_params: Vec<String> = func
        .sig
        .generics
        .type_params()
        .map(|t| t.ident.to_string())
        .collect();
    ast::TypeParams::scoped(&type_params, || {
        let mut errors = Errors::default();
        let options = errors.take(signature::options(attr));
        let sig = errors.take(signature::signature(&func));
        let sig = match (sig, options) {
            (Some(mut s), Some(o)) => {
                s.options = o;
                errors.finish(s)
            }
            _ => Err(errors.0.expect("an error was recorded")),
        };
        let body = body::fn_body(&func.block);
        Parsed { sig, body }
    })
}

/// Collects errors: the first one, with every later one combined into it.
#[derive(Default)]
pub struct Errors(Option<syn::Error>);

impl Errors {
    pub fn push(&mut self, e: syn::Error) {
        match &mut self.0 {
            Some(all) => all.combine(e),
            None => self.0 = Some(e),
        }
    }
    /// Keeps the value of `r`, or records its error.
    pub fn take<T>(&mut self, r: syn::Result<T>) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(e) => {
                self.push(e);
                None
            }
        }
    }
    pub fn finish<T>(self, v: T) -> syn::Result<T> {
        match self.0 {
            Some(e) => Err(e),
            None => Ok(v),
        }
    }
}
