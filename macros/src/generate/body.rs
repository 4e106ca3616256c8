//! A kernel body to the statements of its `inline` function: one builder call per op, each
//! spanned at the source it came from.
//!
//! Every expression lowers to a [`Gen`]: a builder value (a `Value` in a local), or a
//! compile-time number or bool (an `i64`, `f64` or `bool` Rust expression, folded by rustc).
//! Compile-time numbers become IR constants only where they meet a value, taking its type
//! (`x * 2` multiplies by a constant of `x`'s type), or where a value is needed (`i32`,
//! `f32`, `bool` by default).

use super::carried;
use super::types::dtype;
use crate::parse::ast::{
    BinOp, Block, Builtin, ConstParam, Expr, ExprKind, For, If, Param, Returns, Stmt, UnOp,
};
use crate::parse::Errors;
use proc_macro2::{Literal, Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::{Error, Ident};

type Result<T> = syn::Result<T>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// A builder `Value`.
    Value,
    /// A compile-time `i64`.
    Int,
    /// A compile-time `f64`.
    Float,
    /// A compile-time `bool`.
    Bool,
    /// No value (`store(..)`).
    Unit,
}

impl Kind {
    fn is_const(self) -> bool {
        matches!(self, Kind::Int | Kind::Float | Kind::Bool)
    }
    fn describe(self) -> &'static str {
        match self {
            Kind::Value => "a kernel value (known only when the kernel runs)",
            Kind::Int => "a compile-time integer",
            Kind::Float => "a compile-time float",
            Kind::Bool => "a compile-time bool",
            Kind::Unit => "nothing (this expression has no value)",
        }
    }
}

/// A lowered expression: its kind and the Rust expression that holds it (a local for
/// values, an atomic or parenthesised expression for compile-time ones).
struct Gen {
    kind: Kind,
    ts: TokenStream,
    span: Span,
}

#[derive(Clone, Copy)]
struct Var {
    kind: Kind,
    mutable: bool,
    /// A const generic: its uses are `(N as i64)`.
    konst: bool,
}

pub struct Lower {
    /// The builder's name in the generated code (mixed-site, so no user name can clash).
    b: Ident,
    next: usize,
    scopes: Vec<Vec<(String, Var)>>,
    errors: Errors,
}

fn rt(span: Span) -> TokenStream {
    quote_spanned!(span=> self::__dusk_rt)
}

impl Lower {
    pub fn new(b: Ident) -> Self {
        Lower {
            b,
            next: 0,
            scopes: vec![vec![]],
            errors: Errors::default(),
        }
    }

    pub fn declare_const(&mut self, c: &ConstParam) {
        let kind = if c.is_bool { Kind::Bool } else { Kind::Int };
        self.declare(
            &c.name,
            Var {
                kind,
                mutable: false,
                konst: true,
            },
        );
    }

    pub fn declare_param(&mut self, p: &Param) {
        self.declare(
            &p.name,
            Var {
                kind: Kind::Value,
                mutable: p.mutable,
                konst: false,
            },
        );
    }

    /// The statements of the `inline` function's body; with `returns`, ending with the
    /// body's value (a Rust tuple of values for a helper returning a tuple).
    pub fn fn_body(mut self, body: &Block, returns: Option<Returns>) -> Result<TokenStream> {
        let mut out = TokenStream::new();
        match returns {
            Some(r) if r.count > 1 => {
                self.scopes.push(vec![]);
                for s in &body.stmts {
                    self.stmt(s, &mut out);
                }
                if let Some(t) = self.record(|s| s.tuple_tail(body.tail.as_deref(), r, &mut out)) {
                    out.extend(t);
                }
                self.scopes.pop();
            }
            Some(r) => {
                let tail = self.block_stmts(body, true, &mut out);
                match tail {
                    Some(g) if g.kind != Kind::Unit => {
                        if let Some(v) = self.record(|s| s.value(g, &mut out)) {
                            out.extend(v);
                        }
                    }
                    _ => self.errors.push(Error::new(
                        r.span,
                        "this #[kernel] function declares a return type, but its body does not \
                         end with a value; end it with an expression without `;`",
                    )),
                }
            }
            None => {
                self.block_stmts(body, false, &mut out);
            }
        }
        let Lower { errors, .. } = self;
        errors.finish(out)
    }

    /// The values of a helper's tail tuple `(a, b, ..)`, `r.count` of them, as a Rust tuple.
    fn tuple_tail(
        &mut self,
        tail: Option<&Expr>,
        r: Returns,
        out: &mut TokenStream,
    ) -> Result<TokenStream> {
        let items = match tail {
            Some(Expr {
                kind: ExprKind::Tuple(items),
                span,
            }) => {
                if items.len() != r.count {
                    return Err(Error::new(
                        *span,
                        format!(
                            "this helper returns {} values (its return type), but this tuple \
                             has {}",
                            r.count,
                            items.len()
                        ),
                    ));
                }
                items
            }
            _ => {
                return Err(Error::new(
                    tail.map_or(r.span, |t| t.span),
                    format!(
                        "this #[kernel] helper returns a tuple of {} values, so its body ends \
                         with one: `(a, b, ..)` without `;`",
                        r.count
                    ),
                ))
            }
        };
        let mut vals = vec![];
        for e in items {
            let g = self.expr(e, out)?;
            vals.push(self.value(g, out)?);
        }
        Ok(quote!((#(#vals),*)))
    }

    // ---- scopes and names ----

    fn declare(&mut self, name: &Ident, v: Var) {
        self.scopes
            .last_mut()
            .expect("a scope")
            .push((name.to_string(), v));
    }

    fn lookup(&self, name: &Ident) -> Option<Var> {
        let s = name.to_string();
        self.scopes
            .iter()
            .rev()
            .flat_map(|sc| sc.iter().rev())
            .find(|(n, _)| *n == s)
            .map(|(_, v)| *v)
    }

    fn temp(&mut self) -> Ident {
        self.next += 1;
        Ident::new(&format!("__t{}", self.next), Span::mixed_site())
    }

    /// Runs `f`, keeping its error for the end.
    fn record<T>(&mut self, f: impl FnOnce(&mut Self) -> Result<T>) -> Option<T> {
        let r = f(self);
        self.errors.take(r)
    }

    /// `let tN = call;`, as a value.
    fn emit(&mut self, span: Span, call: TokenStream, out: &mut TokenStream) -> Gen {
        let t = self.temp();
        out.extend(quote_spanned!(span=> let #t = #call;));
        Gen {
            kind: Kind::Value,
            ts: quote!(#t),
            span,
        }
    }

    // ---- blocks and statements ----

    /// Lowers `b`'s statements into `out` (in a new scope of the symbol table; the caller
    /// provides the Rust braces) and returns its tail when `want` a value.
    fn block_stmts(&mut self, b: &Block, want: bool, out: &mut TokenStream) -> Option<Gen> {
        self.scopes.push(vec![]);
        for s in &b.stmts {
            self.stmt(s, out);
        }
        let tail = match &b.tail {
            Some(t) if want => self.record(|s| s.expr(t, out)),
            Some(t) => {
                self.record(|s| s.expr_stmt(t, out));
                None
            }
            None => None,
        };
        self.scopes.pop();
        tail
    }

    fn stmt(&mut self, s: &Stmt, out: &mut TokenStream) {
        match s {
            Stmt::Let {
                name,
                mutable,
                init,
                span,
            } => self.let_(name.as_ref(), *mutable, init, *span, out),
            Stmt::LetTuple { names, init, span } => self.let_tuple(names, init, *span, out),
            Stmt::Assign {
                target,
                op,
                value,
                span,
            } => {
                self.record(|s| s.assign(target, *op, value, *span, out));
            }
            Stmt::For(f) => {
                self.record(|s| s.for_(f, out));
            }
            Stmt::Expr(e) => {
                self.record(|s| s.expr_stmt(e, out));
            }
        }
    }

    fn let_(
        &mut self,
        name: Option<&Ident>,
        mutable: bool,
        init: &Expr,
        span: Span,
        out: &mut TokenStream,
    ) {
        let declared = |mutable| Var {
            kind: Kind::Value,
            mutable,
            konst: false,
        };
        let Some(name) = name else {
            self.record(|s| s.expr_stmt(init, out));
            return;
        };
        let var = self.record(|s| {
            let g = s.expr(init, out)?;
            s.bind(name, mutable, g, span, out)
        });
        // On an error the name is still declared, so its uses do not report again.
        self.declare(name, var.unwrap_or(declared(mutable)));
    }

    /// `let [mut] name = g;`, returning what `name` is (not yet declared).
    fn bind(
        &mut self,
        name: &Ident,
        mutable: bool,
        g: Gen,
        span: Span,
        out: &mut TokenStream,
    ) -> Result<Var> {
        if mutable {
            let v = self.value(g, out)?;
            out.extend(quote_spanned!(span=> let mut #name = #v;));
            return Ok(Var {
                kind: Kind::Value,
                mutable: true,
                konst: false,
            });
        }
        let ts = &g.ts;
        match g.kind {
            Kind::Value => out.extend(quote_spanned!(span=> let #name = #ts;)),
            Kind::Int => out.extend(quote_spanned!(span=> let #name: i64 = #ts;)),
            Kind::Float => out.extend(quote_spanned!(span=> let #name: f64 = #ts;)),
            Kind::Bool => out.extend(quote_spanned!(span=> let #name: bool = #ts;)),
            Kind::Unit => return Err(no_value(g.span)),
        }
        Ok(Var {
            kind: g.kind,
            mutable: false,
            konst: false,
        })
    }

    /// `let (a, mut b, _) = helper(..);`: the helper's tuple bound to fresh names, typed so
    /// that a helper returning another number of values is reported at the `let`. `let (a,
    /// b) = (x, y);`: every element evaluated, then bound as its own `let` would bind it.
    fn let_tuple(
        &mut self,
        names: &[(Option<Ident>, bool)],
        init: &Expr,
        span: Span,
        out: &mut TokenStream,
    ) {
        if let ExprKind::Tuple(items) = &init.kind {
            let vars = self.record(|s| {
                // Each element into a temporary first: `let (a, b) = (b, a);` swaps.
                let mut gens = vec![];
                for e in items {
                    let g = s.expr(e, out)?;
                    let (t, ts) = (s.temp(), &g.ts);
                    out.extend(quote_spanned!(g.span=> let #t = #ts;));
                    gens.push(Gen {
                        ts: quote!(#t),
                        ..g
                    });
                }
                let mut vars = vec![];
                for ((name, mutable), g) in names.iter().zip(gens) {
                    vars.push(match name {
                        Some(n) => Some(s.bind(n, *mutable, g, span, out)?),
                        None => None,
                    });
                }
                Ok(vars)
            });
            for (i, (name, mutable)) in names.iter().enumerate() {
                if let Some(n) = name {
                    let var = vars.as_ref().and_then(|v| v[i]).unwrap_or(Var {
                        kind: Kind::Value,
                        mutable: *mutable,
                        konst: false,
                    });
                    self.declare(n, var);
                }
            }
            return;
        }
        self.record(|s| {
            let call = s.helper_call(init, out)?;
            let temps: Vec<Ident> = names.iter().map(|_| s.temp()).collect();
            let tys = names.iter().map(|_| quote!(__dusk::compiler::Value));
            out.extend(quote_spanned!(span=> let (#(#temps),*): (#(#tys),*) = #call;));
            for ((name, mutable), t) in names.iter().zip(&temps) {
                if let Some(n) = name {
                    let m = mutable.then(|| quote!(mut));
                    out.extend(quote_spanned!(span=> let #m #n = #t;));
                }
            }
            Ok(())
        });
        for (name, mutable) in names {
            if let Some(n) = name {
                self.declare(
                    n,
                    Var {
                        kind: Kind::Value,
                        mutable: *mutable,
                        konst: false,
                    },
                );
            }
        }
    }

    fn assign(
        &mut self,
        target: &Ident,
        op: Option<(BinOp, Span)>,
        value: &Expr,
        span: Span,
        out: &mut TokenStream,
    ) -> Result<()> {
        self.assignable(target)?;
        let mut g = self.expr(value, out)?;
        let cur = Gen {
            kind: Kind::Value,
            ts: quote!(#target),
            span: target.span(),
        };
        if let Some((op, op_span)) = op {
            g = self.binary(op, cur, g, op_span, out)?;
        }
        let v = self.value_like(g, &quote!(#target), out)?;
        out.extend(quote_spanned!(span=> #target = #v;));
        Ok(())
    }

    fn assignable(&self, target: &Ident) -> Result<()> {
        match self.lookup(target) {
            None => Err(Error::new(
                target.span(),
                format!("cannot find variable `{target}` in this kernel"),
            )),
            Some(v) if v.konst => Err(Error::new(
                target.span(),
                format!("cannot assign to the const generic `{target}`"),
            )),
            Some(v) if !v.mutable => Err(Error::new(
                target.span(),
                format!(
                    "cannot assign twice to the immutable variable `{target}`; declare it with \
                     `let mut {target}`"
                ),
            )),
            Some(_) => Ok(()),
        }
    }

    /// The mutable values declared outside `blocks` that they assign.
    fn carried(&self, blocks: &[&Block]) -> Result<Vec<Ident>> {
        let all = carried::assigned_outside(blocks)?;
        Ok(all
            .into_iter()
            .filter(|n| matches!(self.lookup(n), Some(v) if v.mutable && v.kind == Kind::Value))
            .collect())
    }

    /// A loop bound or step: an i32 value.
    fn index(&mut self, e: &Expr, out: &mut TokenStream) -> Result<TokenStream> {
        let g = self.expr(e, out)?;
        self.value(g, out)
    }

    fn for_(&mut self, f: &For, out: &mut TokenStream) -> Result<()> {
        if f.unroll {
            return self.unrolled_for(f, out);
        }
        let b = self.b.clone();
        let span = f.span;
        let lo = self.index(&f.lo, out)?;
        let hi = self.index(&f.hi, out)?;
        let step = match &f.step {
            Some(s) => self.index(s, out)?,
            None => {
                let one = Gen {
                    kind: Kind::Int,
                    ts: quote_spanned!(span=> 1i64),
                    span,
                };
                self.value(one, out)?
            }
        };
        let carried = self.carried(&[&f.body])?;
        let c = Ident::new("__carried", Span::mixed_site());
        self.scopes.push(vec![]);
        if let Some(v) = &f.var {
            self.declare(
                v,
                Var {
                    kind: Kind::Value,
                    mutable: false,
                    konst: false,
                },
            );
        }
        let mut body = TokenStream::new();
        for (k, v) in carried.iter().enumerate() {
            body.extend(quote_spanned!(v.span()=> #[allow(unused_mut, unused_assignments)] let mut #v = #c[#k];));
        }
        self.block_stmts(&f.body, false, &mut body);
        self.scopes.pop();
        let var = match &f.var {
            Some(v) => quote!(#v),
            None => quote!(_),
        };
        let c_pat = if carried.is_empty() {
            quote!(_)
        } else {
            quote!(#c)
        };
        let closure = quote_spanned! {span=>
            move |#b: &mut __dusk::compiler::KernelBuilder, #var: __dusk::compiler::Value, #c_pat: &[__dusk::compiler::Value]| {
                #body
                ::std::vec![#(#carried),*]
            }
        };
        let call = quote_spanned!(span=> #b.for_range(#lo, #hi, #step, &[#(#carried),*], #closure));
        self.finish_region(call, &carried, None, span, out);
        Ok(())
    }

    /// `#[unroll] for`: a Rust loop run when the kernel is built, its variable a
    /// compile-time integer; variables it assigns are plain Rust assignments.
    fn unrolled_for(&mut self, f: &For, out: &mut TokenStream) -> Result<()> {
        let b = self.b.clone();
        let span = f.span;
        let what = "a bound of an `#[unroll]` loop";
        let lo = self.const_int(&f.lo, what, out)?;
        let hi = self.const_int(&f.hi, what, out)?;
        let step = match &f.step {
            Some(s) => self.const_int(s, "the step of an `#[unroll]` loop", out)?,
            None => quote_spanned!(span=> 1i64),
        };
        self.scopes.push(vec![]);
        if let Some(v) = &f.var {
            self.declare(
                v,
                Var {
                    kind: Kind::Int,
                    mutable: false,
                    konst: false,
                },
            );
        }
        let mut body = TokenStream::new();
        self.block_stmts(&f.body, false, &mut body);
        self.scopes.pop();
        let var = match &f.var {
            Some(v) => quote!(#v),
            None => quote!(_),
        };
        let rt = rt(span);
        out.extend(quote_spanned! {span=>
            for #var in #rt::unrolled(#b, #lo, #hi, #step) { #body }
        });
        Ok(())
    }

    /// Emits a region op (`for_range`, `if_else`) and assigns its results back to the
    /// carried variables; returns the extra result (the `if`'s value) when `value_at` is set.
    fn finish_region(
        &mut self,
        call: TokenStream,
        carried: &[Ident],
        value_at: Option<usize>,
        span: Span,
        out: &mut TokenStream,
    ) -> Option<Gen> {
        if carried.is_empty() && value_at.is_none() {
            out.extend(quote_spanned!(span=> #call;));
            return None;
        }
        let r = self.temp();
        out.extend(quote_spanned!(span=> let #r = #call;));
        for (k, v) in carried.iter().enumerate() {
            out.extend(quote_spanned!(v.span()=> #v = #r[#k];));
        }
        value_at.map(|k| self.emit(span, quote_spanned!(span=> #r[#k]), out))
    }

    /// An expression evaluated for its effect.
    fn expr_stmt(&mut self, e: &Expr, out: &mut TokenStream) -> Result<()> {
        match &e.kind {
            ExprKind::Helper { .. } => {
                let call = self.helper_call(e, out)?;
                out.extend(quote_spanned!(e.span=> #call;));
            }
            ExprKind::If(i) => {
                self.if_(i, false, out)?;
            }
            ExprKind::Block(b) => {
                let mut inner = TokenStream::new();
                self.block_stmts(b, false, &mut inner);
                out.extend(quote_spanned!(e.span=> { #inner }));
            }
            _ => {
                self.expr(e, out)?;
            }
        }
        Ok(())
    }

    fn if_(&mut self, i: &If, want: bool, out: &mut TokenStream) -> Result<Option<Gen>> {
        if want && i.otherwise.is_none() {
            return Err(Error::new(
                i.span,
                "an `if` without `else` has no value; add an `else` arm",
            ));
        }
        let cond = self.expr(&i.cond, out)?;
        match cond.kind {
            Kind::Bool => self.if_const(i, cond, want, out),
            Kind::Value => self.if_value(i, cond, want, out),
            k => Err(Error::new(
                cond.span,
                format!("an `if` condition must be a bool, found {}", k.describe()),
            )),
        }
    }

    /// `if` on a compile-time bool: decided when the kernel is built.
    fn if_const(
        &mut self,
        i: &If,
        cond: Gen,
        want: bool,
        out: &mut TokenStream,
    ) -> Result<Option<Gen>> {
        let span = i.span;
        let c = &cond.ts;
        let mut then_ts = TokenStream::new();
        let then_tail = self.block_stmts(&i.then, want, &mut then_ts);
        let mut else_ts = TokenStream::new();
        let else_tail = match &i.otherwise {
            Some(o) => self.block_stmts(o, want, &mut else_ts),
            None => None,
        };
        if !want {
            let otherwise = i
                .otherwise
                .as_ref()
                .map(|_| quote_spanned!(span=> else { #else_ts }));
            out.extend(quote_spanned!(span=> if #c { #then_ts } #otherwise));
            return Ok(None);
        }
        let (Some(a), Some(b)) = (then_tail, else_tail) else {
            return Err(Error::new(
                span,
                "both arms of an `if` with a value must end with a value",
            ));
        };
        if a.kind == Kind::Unit || b.kind == Kind::Unit {
            return Err(no_value(span));
        }
        let (kind, a, b) = if a.kind == b.kind {
            (a.kind, a.ts, b.ts)
        } else {
            let a = self.value(a, &mut then_ts)?;
            let b = self.value(b, &mut else_ts)?;
            (Kind::Value, a, b)
        };
        let t = self.temp();
        out.extend(quote_spanned!(span=> let #t = if #c { #then_ts #a } else { #else_ts #b };));
        Ok(Some(Gen {
            kind,
            ts: quote!(#t),
            span,
        }))
    }

    /// `if` on a kernel value: an `if` op, with the variables the arms assign (and the
    /// value, when wanted) as its results.
    fn if_value(
        &mut self,
        i: &If,
        cond: Gen,
        want: bool,
        out: &mut TokenStream,
    ) -> Result<Option<Gen>> {
        let b = self.b.clone();
        let span = i.span;
        let c = &cond.ts;
        let mut blocks = vec![&i.then];
        blocks.extend(i.otherwise.as_ref());
        let carried = self.carried(&blocks)?;
        let arm = |s: &mut Self, blk: Option<&Block>| -> Result<TokenStream> {
            let mut body = TokenStream::new();
            for v in &carried {
                body.extend(quote_spanned!(v.span()=> #[allow(unused_mut, unused_assignments)] let mut #v = #v;));
            }
            let mut results: Vec<TokenStream> = carried.iter().map(|v| quote!(#v)).collect();
            if let Some(blk) = blk {
                let tail = s.block_stmts(blk, want, &mut body);
                if want {
                    let g = tail.ok_or_else(|| {
                        Error::new(
                            span,
                            "both arms of an `if` with a value must end with a value",
                        )
                    })?;
                    results.push(s.value(g, &mut body)?);
                }
            }
            Ok(quote_spanned! {span=>
                move |#b: &mut __dusk::compiler::KernelBuilder| {
                    #body
                    ::std::vec![#(#results),*]
                }
            })
        };
        if carried.is_empty() && !want && i.otherwise.is_none() {
            let mut body = TokenStream::new();
            self.block_stmts(&i.then, false, &mut body);
            out.extend(quote_spanned! {span=>
                #b.if_then(#c, move |#b: &mut __dusk::compiler::KernelBuilder| { #body });
            });
            return Ok(None);
        }
        let then = arm(self, Some(&i.then))?;
        let otherwise = arm(self, i.otherwise.as_ref())?;
        let call = quote_spanned!(span=> #b.if_else(#c, #then, #otherwise));
        let value_at = want.then_some(carried.len());
        Ok(self.finish_region(call, &carried, value_at, span, out))
    }

    // ---- expressions ----

    fn expr(&mut self, e: &Expr, out: &mut TokenStream) -> Result<Gen> {
        let span = e.span;
        match &e.kind {
            ExprKind::Var(name) => {
                let v = self.lookup(name).ok_or_else(|| {
                    Error::new(
                        name.span(),
                        format!(
                            "cannot find `{name}` in this kernel; kernels see their parameters, \
                             const generics and local variables"
                        ),
                    )
                })?;
                let ts = if v.konst && v.kind == Kind::Int {
                    quote_spanned!(span=> (#name as i64))
                } else {
                    quote!(#name)
                };
                Ok(Gen {
                    kind: v.kind,
                    ts,
                    span,
                })
            }
            ExprKind::Int(lit, ty) => {
                let v: i64 = lit.base10_parse()?;
                let mut l = Literal::i64_suffixed(v);
                l.set_span(literal_span(span));
                let g = Gen {
                    kind: Kind::Int,
                    ts: quote!(#l),
                    span,
                };
                match ty {
                    None => Ok(g),
                    Some(t) => self.cast(g, *t, span, out),
                }
            }
            ExprKind::Float(lit, ty) => {
                let v: f64 = lit.base10_parse()?;
                let mut l = Literal::f64_suffixed(v);
                l.set_span(literal_span(span));
                let g = Gen {
                    kind: Kind::Float,
                    ts: quote!(#l),
                    span,
                };
                match ty {
                    None => Ok(g),
                    Some(t) => self.cast(g, *t, span, out),
                }
            }
            ExprKind::Bool(v) => Ok(Gen {
                kind: Kind::Bool,
                ts: quote_spanned!(span=> #v),
                span,
            }),
            ExprKind::PrimConst { path, is_float } => {
                let (kind, ts) = if *is_float {
                    (Kind::Float, quote_spanned!(span=> (#path as f64)))
                } else {
                    (Kind::Int, quote_spanned!(span=> (#path as i64)))
                };
                Ok(Gen { kind, ts, span })
            }
            ExprKind::Binary { op, lhs, rhs } => {
                let l = self.expr(lhs, out)?;
                let r = self.expr(rhs, out)?;
                self.binary(*op, l, r, span, out)
            }
            ExprKind::Unary { op, expr } => {
                let g = self.expr(expr, out)?;
                self.unary(*op, g, span, out)
            }
            ExprKind::Cast { expr, to } => {
                let g = self.expr(expr, out)?;
                self.cast(g, *to, span, out)
            }
            ExprKind::Builtin { func, ty, args } => self.builtin(*func, *ty, args, span, out),
            ExprKind::Shape(_) => Err(Error::new(
                span,
                "a shape (`[d0, d1]`) is only an argument of `splat` and `zeros`",
            )),
            ExprKind::Tuple(_) => Err(Error::new(
                span,
                "a tuple is only the value a helper returns, at the end of its body (`-> (i32, \
                 i64)`), or the value of a `let (a, b) = (x, y);`",
            )),
            ExprKind::Helper { .. } => {
                // Typed, so a helper with no value used as one is reported at the call.
                let call = self.helper_call(e, out)?;
                let t = self.temp();
                out.extend(quote_spanned!(span=> let #t: __dusk::compiler::Value = #call;));
                Ok(Gen {
                    kind: Kind::Value,
                    ts: quote!(#t),
                    span,
                })
            }
            ExprKind::If(i) => Ok(self.if_(i, true, out)?.expect("an `if` with a value")),
            ExprKind::Block(blk) => {
                let mut inner = TokenStream::new();
                let tail = self.block_stmts(blk, true, &mut inner);
                let Some(g) = tail else {
                    out.extend(quote_spanned!(span=> { #inner }));
                    return Ok(Gen {
                        kind: Kind::Unit,
                        ts: quote!(()),
                        span,
                    });
                };
                let t = self.temp();
                let ts = &g.ts;
                out.extend(quote_spanned!(span=> let #t = { #inner #ts };));
                Ok(Gen {
                    kind: g.kind,
                    ts: quote!(#t),
                    span,
                })
            }
        }
    }

    /// `helper::inline(b, args..)` for a call of another kernel.
    fn helper_call(&mut self, e: &Expr, out: &mut TokenStream) -> Result<TokenStream> {
        let ExprKind::Helper {
            path,
            generics,
            args,
        } = &e.kind
        else {
            unreachable!("helper_call on a helper call")
        };
        let b = self.b.clone();
        let mut vals = vec![];
        for a in args {
            let g = self.expr(a, out)?;
            vals.push(self.value(g, out)?);
        }
        let turbofish = generics.as_ref().map(|g| {
            let a = &g.args;
            quote_spanned!(e.span=> ::<#a>)
        });
        // A plain name is looked up in the module around the kernel's (so a missing helper
        // is reported as missing there); longer paths resolve as written, through the
        // kernel module's `use super::*`.
        let prefix = if path.leading_colon.is_none() && path.segments.len() == 1 {
            quote_spanned!(e.span=> super::)
        } else {
            quote!()
        };
        Ok(quote_spanned!(e.span=> #prefix #path::inline #turbofish(#b, #(#vals),*)))
    }

    /// `g` as a value: compile-time numbers become i32 / f32 / bool constants.
    fn value(&mut self, g: Gen, out: &mut TokenStream) -> Result<TokenStream> {
        let b = &self.b;
        let (span, ts) = (g.span, &g.ts);
        let call = match g.kind {
            Kind::Value => return Ok(g.ts),
            Kind::Int => quote_spanned!(span=> #b.i32(#ts as i32)),
            Kind::Float => quote_spanned!(span=> #b.f32(#ts as f32)),
            Kind::Bool => quote_spanned!(span=> #b.bool(#ts)),
            Kind::Unit => return Err(no_value(span)),
        };
        Ok(self.emit(span, call, out).ts)
    }

    /// `g` as a value of the type of `like` (a value).
    fn value_like(
        &mut self,
        g: Gen,
        like: &TokenStream,
        out: &mut TokenStream,
    ) -> Result<TokenStream> {
        let b = &self.b;
        let (span, ts) = (g.span, &g.ts);
        let rt = rt(span);
        let call = match g.kind {
            Kind::Int => quote_spanned!(span=> #rt::int_like(#b, #like, #ts)),
            Kind::Float => quote_spanned!(span=> #rt::float_like(#b, #like, #ts)),
            _ => return self.value(g, out),
        };
        Ok(self.emit(span, call, out).ts)
    }

    /// `g` as a value of the type `p` points to (the `other` of a load, a stored value).
    fn value_pointee(
        &mut self,
        g: Gen,
        p: &TokenStream,
        out: &mut TokenStream,
    ) -> Result<TokenStream> {
        let b = &self.b;
        let (span, ts) = (g.span, &g.ts);
        let rt = rt(span);
        let call = match g.kind {
            Kind::Int => quote_spanned!(span=> #rt::int_pointee(#b, #p, #ts)),
            Kind::Float => quote_spanned!(span=> #rt::float_pointee(#b, #p, #ts)),
            _ => return self.value(g, out),
        };
        Ok(self.emit(span, call, out).ts)
    }

    /// Two operands as values, a compile-time one taking the other's type.
    fn pair(
        &mut self,
        l: Gen,
        r: Gen,
        out: &mut TokenStream,
    ) -> Result<(TokenStream, TokenStream)> {
        match (l.kind, r.kind) {
            (Kind::Value, Kind::Value) => Ok((l.ts, r.ts)),
            (Kind::Value, _) => {
                let r = self.value_like(r, &l.ts, out)?;
                Ok((l.ts, r))
            }
            (_, Kind::Value) => {
                let l = self.value_like(l, &r.ts, out)?;
                Ok((l, r.ts))
            }
            _ => {
                let l = self.value(l, out)?;
                let r = self.value(r, out)?;
                Ok((l, r))
            }
        }
    }

    fn binary(
        &mut self,
        op: BinOp,
        l: Gen,
        r: Gen,
        span: Span,
        out: &mut TokenStream,
    ) -> Result<Gen> {
        for g in [&l, &r] {
            if g.kind == Kind::Unit {
                return Err(no_value(g.span));
            }
        }
        if l.kind.is_const() && r.kind.is_const() {
            return fold_binary(op, l, r, span);
        }
        let (lv, rv) = self.pair(l, r, out)?;
        let b = &self.b;
        let m = match op {
            BinOp::Add => {
                let rt = rt(span);
                return Ok(self.emit(span, quote_spanned!(span=> #rt::add(#b, #lv, #rv)), out));
            }
            BinOp::Sub => quote_spanned!(span=> sub),
            BinOp::Mul => quote_spanned!(span=> mul),
            BinOp::Div => quote_spanned!(span=> div),
            BinOp::Rem => quote_spanned!(span=> rem),
            BinOp::BitAnd | BinOp::And => quote_spanned!(span=> and),
            BinOp::BitOr | BinOp::Or => quote_spanned!(span=> or),
            BinOp::BitXor => quote_spanned!(span=> xor),
            BinOp::Shl => quote_spanned!(span=> shl),
            BinOp::Shr => quote_spanned!(span=> shr),
            BinOp::Lt => quote_spanned!(span=> lt),
            BinOp::Le => quote_spanned!(span=> le),
            BinOp::Gt => quote_spanned!(span=> gt),
            BinOp::Ge => quote_spanned!(span=> ge),
            BinOp::Eq => quote_spanned!(span=> eq),
            BinOp::Ne => quote_spanned!(span=> ne),
        };
        Ok(self.emit(span, quote_spanned!(span=> #b.#m(#lv, #rv)), out))
    }

    fn unary(&mut self, op: UnOp, g: Gen, span: Span, out: &mut TokenStream) -> Result<Gen> {
        let ts = &g.ts;
        match (op, g.kind) {
            (UnOp::Neg, Kind::Int | Kind::Float) => Ok(Gen {
                kind: g.kind,
                ts: quote_spanned!(span=> (-#ts)),
                span,
            }),
            (UnOp::Not, Kind::Int | Kind::Bool) => Ok(Gen {
                kind: g.kind,
                ts: quote_spanned!(span=> (!#ts)),
                span,
            }),
            (UnOp::Neg, Kind::Value) => {
                let b = &self.b;
                Ok(self.emit(span, quote_spanned!(span=> #b.neg(#ts)), out))
            }
            (UnOp::Not, Kind::Value) => {
                let b = &self.b;
                Ok(self.emit(span, quote_spanned!(span=> #b.not(#ts)), out))
            }
            (_, k) => Err(Error::new(
                span,
                format!(
                    "`{}` is not defined on {}",
                    if op == UnOp::Neg { "-" } else { "!" },
                    k.describe()
                ),
            )),
        }
    }

    fn cast(
        &mut self,
        g: Gen,
        to: crate::parse::ast::ElemTy,
        span: Span,
        out: &mut TokenStream,
    ) -> Result<Gen> {
        let b = &self.b;
        let d = dtype(to);
        let ts = &g.ts;
        let rt = rt(span);
        let call = match g.kind {
            Kind::Value => quote_spanned!(span=> #b.cast(#ts, #d)),
            Kind::Int => quote_spanned!(span=> #rt::int_const(#b, #d, #ts)),
            Kind::Float => quote_spanned!(span=> #rt::float_const(#b, #d, #ts)),
            Kind::Bool => quote_spanned!(span=> #rt::int_const(#b, #d, #ts as i64)),
            Kind::Unit => return Err(no_value(g.span)),
        };
        Ok(self.emit(span, call, out))
    }

    /// A compile-time integer argument (an axis, a size, a bound).
    fn const_int(&mut self, e: &Expr, what: &str, out: &mut TokenStream) -> Result<TokenStream> {
        let g = self.expr(e, out)?;
        match g.kind {
            Kind::Int => Ok(g.ts),
            k => Err(Error::new(
                g.span,
                format!(
                    "{what} must be a compile-time integer (a literal, a const generic, or \
                     arithmetic on them), found {}",
                    k.describe()
                ),
            )),
        }
    }

    fn builtin(
        &mut self,
        func: Builtin,
        ty: Option<crate::parse::ast::ElemTy>,
        args: &[Expr],
        span: Span,
        out: &mut TokenStream,
    ) -> Result<Gen> {
        let b = self.b.clone();
        let rt = rt(span);
        // Lowers argument `i` as a value (compile-time numbers to their default type).
        macro_rules! val {
            ($i:expr) => {{
                let g = self.expr(&args[$i], out)?;
                self.value(g, out)?
            }};
        }
        let call = match func {
            Builtin::ProgramId | Builtin::NumPrograms => {
                let axis = self.const_int(&args[0], "the grid axis", out)?;
                let m = if func == Builtin::ProgramId {
                    quote_spanned!(span=> program_id)
                } else {
                    quote_spanned!(span=> num_programs)
                };
                quote_spanned!(span=> #b.#m(#axis as u8))
            }
            Builtin::Arange => {
                let lo = self.const_int(&args[0], "`arange`'s start", out)?;
                let hi = self.const_int(&args[1], "`arange`'s end", out)?;
                quote_spanned!(span=> #b.arange(#lo, #hi))
            }
            Builtin::Load => {
                let p = val!(0);
                if args.len() == 1 {
                    quote_spanned!(span=> #b.load(#p))
                } else {
                    let m = val!(1);
                    let other = match args.get(2) {
                        Some(o) => {
                            let g = self.expr(o, out)?;
                            let o = self.value_pointee(g, &p, out)?;
                            quote_spanned!(span=> ::core::option::Option::Some(#o))
                        }
                        None => quote_spanned!(span=> ::core::option::Option::None),
                    };
                    quote_spanned!(span=> #b.load_masked(#p, ::core::option::Option::Some(#m), #other))
                }
            }
            Builtin::Store => {
                let p = val!(0);
                let g = self.expr(&args[1], out)?;
                let v = self.value_pointee(g, &p, out)?;
                if args.len() == 2 {
                    out.extend(quote_spanned!(span=> #b.store(#p, #v);));
                } else {
                    let m = val!(2);
                    out.extend(quote_spanned!(span=> #b.store_masked(#p, #v, ::core::option::Option::Some(#m));));
                }
                return Ok(Gen {
                    kind: Kind::Unit,
                    ts: quote!(()),
                    span,
                });
            }
            Builtin::Where => {
                let c = val!(0);
                let x = self.expr(&args[1], out)?;
                let y = self.expr(&args[2], out)?;
                let (x, y) = self.pair(x, y, out)?;
                quote_spanned!(span=> #b.select(#c, #x, #y))
            }
            Builtin::Exp2 | Builtin::Log2 | Builtin::Sqrt | Builtin::Rsqrt | Builtin::Abs => {
                let x = val!(0);
                let m = match func {
                    Builtin::Exp2 => quote_spanned!(span=> exp2),
                    Builtin::Log2 => quote_spanned!(span=> log2),
                    Builtin::Sqrt => quote_spanned!(span=> sqrt),
                    Builtin::Rsqrt => quote_spanned!(span=> rsqrt),
                    _ => quote_spanned!(span=> abs),
                };
                quote_spanned!(span=> #b.#m(#x))
            }
            Builtin::Exp => {
                // e^x = 2^(x log2 e)
                let x = val!(0);
                let c = self
                    .emit(
                        span,
                        quote_spanned!(span=> #rt::float_like(#b, #x, ::core::f64::consts::LOG2_E)),
                        out,
                    )
                    .ts;
                let t = self
                    .emit(span, quote_spanned!(span=> #b.mul(#x, #c)), out)
                    .ts;
                quote_spanned!(span=> #b.exp2(#t))
            }
            Builtin::Log => {
                // ln x = log2(x) ln 2
                let x = val!(0);
                let l = self.emit(span, quote_spanned!(span=> #b.log2(#x)), out).ts;
                let c = self
                    .emit(
                        span,
                        quote_spanned!(span=> #rt::float_like(#b, #l, ::core::f64::consts::LN_2)),
                        out,
                    )
                    .ts;
                quote_spanned!(span=> #b.mul(#l, #c))
            }
            Builtin::Minimum | Builtin::Maximum => {
                let x = self.expr(&args[0], out)?;
                let y = self.expr(&args[1], out)?;
                let (x, y) = self.pair(x, y, out)?;
                let m = if func == Builtin::Minimum {
                    quote_spanned!(span=> minimum)
                } else {
                    quote_spanned!(span=> maximum)
                };
                quote_spanned!(span=> #b.#m(#x, #y))
            }
            Builtin::Sum | Builtin::Max | Builtin::Min => {
                let x = val!(0);
                let what = match func {
                    Builtin::Sum => "the axis of `sum`",
                    Builtin::Max => "the axis of `max` (for the elementwise maximum of two values use `maximum(a, b)`)",
                    _ => "the axis of `min` (for the elementwise minimum of two values use `minimum(a, b)`)",
                };
                let axis = self.const_int(&args[1], what, out)?;
                let m = match func {
                    Builtin::Sum => quote_spanned!(span=> sum),
                    Builtin::Max => quote_spanned!(span=> max),
                    _ => quote_spanned!(span=> min),
                };
                quote_spanned!(span=> #b.#m(#x, #axis as u8))
            }
            Builtin::Expand => {
                let x = val!(0);
                let axis = self.const_int(&args[1], "the axis of `expand`", out)?;
                let size = self.const_int(&args[2], "the size of `expand`", out)?;
                quote_spanned!(span=> #b.expand(#x, #axis as u8, #size as usize))
            }
            Builtin::Splat => {
                let x = val!(0);
                let shape = self.shape(&args[1], out)?;
                quote_spanned!(span=> #b.splat(#x, #shape))
            }
            Builtin::Zeros => {
                let d = dtype(ty.expect("zeros has a type"));
                let shape = self.shape(&args[0], out)?;
                let z = self
                    .emit(span, quote_spanned!(span=> #rt::int_const(#b, #d, 0)), out)
                    .ts;
                quote_spanned!(span=> #b.splat(#z, #shape))
            }
            Builtin::PtrCast => {
                let d = dtype(ty.expect("ptr_cast has a type"));
                let p = val!(0);
                quote_spanned!(span=> #b.ptr_cast(#p, #d))
            }
            Builtin::Shared => {
                let d = dtype(ty.expect("shared has a type"));
                let len = self.const_int(&args[0], "`shared`'s length", out)?;
                quote_spanned!(span=> #b.shared_alloc(#d, #len as usize))
            }
            Builtin::AtomicAdd => {
                let p = val!(0);
                let g = self.expr(&args[1], out)?;
                let v = self.value_pointee(g, &p, out)?;
                let m = if args.len() == 3 {
                    let m = val!(2);
                    quote_spanned!(span=> ::core::option::Option::Some(#m))
                } else {
                    quote_spanned!(span=> ::core::option::Option::None)
                };
                out.extend(quote_spanned!(span=> #b.atomic_add(#p, #v, #m);));
                return Ok(Gen {
                    kind: Kind::Unit,
                    ts: quote!(()),
                    span,
                });
            }
            Builtin::Cumsum => {
                let x = val!(0);
                quote_spanned!(span=> #b.cumsum(#x))
            }
            Builtin::Arrive => {
                let c = val!(0);
                quote_spanned!(span=> #b.arrive(#c))
            }
            Builtin::AwaitCount => {
                let c = val!(0);
                let t = val!(1);
                quote_spanned!(span=> #b.await_count(#c, #t))
            }
            Builtin::LoadFresh => {
                let p = val!(0);
                let m = if args.len() == 2 {
                    let m = val!(1);
                    quote_spanned!(span=> ::core::option::Option::Some(#m))
                } else {
                    quote_spanned!(span=> ::core::option::Option::None)
                };
                quote_spanned!(span=> #b.load_fresh(#p, #m))
            }
            Builtin::GlobalTimer => quote_spanned!(span=> #b.global_timer()),
            Builtin::SmId => quote_spanned!(span=> #b.sm_id()),
            Builtin::Signal | Builtin::Sleep => {
                if func == Builtin::Signal {
                    let c = val!(0);
                    out.extend(quote_spanned!(span=> #b.signal(#c);));
                } else {
                    let ns = self.const_int(&args[0], "`sleep`'s nanoseconds", out)?;
                    out.extend(quote_spanned!(span=> #b.sleep(#ns as u32);));
                }
                return Ok(Gen {
                    kind: Kind::Unit,
                    ts: quote!(()),
                    span,
                });
            }
            Builtin::Barrier => {
                out.extend(quote_spanned!(span=> #b.barrier();));
                return Ok(Gen {
                    kind: Kind::Unit,
                    ts: quote!(()),
                    span,
                });
            }
            Builtin::PrefetchL2 => {
                let p = val!(0);
                let bytes = self.const_int(&args[1], "`prefetch_l2`'s bytes", out)?;
                let m = if args.len() == 3 {
                    let m = val!(2);
                    quote_spanned!(span=> ::core::option::Option::Some(#m))
                } else {
                    quote_spanned!(span=> ::core::option::Option::None)
                };
                out.extend(quote_spanned!(span=> #rt::prefetch_l2(#b, #p, #m, #bytes as u32);));
                return Ok(Gen {
                    kind: Kind::Unit,
                    ts: quote!(()),
                    span,
                });
            }
            Builtin::Bitcast => {
                let d = dtype(ty.expect("bitcast has a type"));
                let x = val!(0);
                quote_spanned!(span=> #b.bitcast(#x, #d))
            }
            Builtin::Dp2a => {
                let pairs = val!(0);
                let bytes = val!(1);
                let acc = val!(2);
                let g = self.expr(&args[3], out)?;
                if g.kind != Kind::Bool {
                    return Err(Error::new(
                        g.span,
                        format!(
                            "`dp2a`'s `high` must be a compile-time bool (`true`, `false` or a \
                             `const H: bool`), found {}",
                            g.kind.describe()
                        ),
                    ));
                }
                let high = g.ts;
                quote_spanned!(span=> #b.dp2a(#pairs, #bytes, #acc, #high))
            }
            Builtin::DotInt4 => {
                let codes = val!(0);
                let q = val!(1);
                quote_spanned!(span=> #b.dot_int4(#codes, #q))
            }
            Builtin::Dot | Builtin::DotTa => {
                let (x, y) = (val!(0), val!(1));
                let acc = if args.len() == 3 {
                    let c = val!(2);
                    quote_spanned!(span=> ::core::option::Option::Some(#c))
                } else {
                    quote_spanned!(span=> ::core::option::Option::None)
                };
                if func == Builtin::Dot {
                    quote_spanned!(span=> #b.dot(#x, #y, #acc))
                } else {
                    quote_spanned!(span=> #b.dot_ta(#x, #y, #acc))
                }
            }
        };
        Ok(self.emit(span, call, out))
    }

    /// `[d0, d1]` as `&[usize]`.
    fn shape(&mut self, e: &Expr, out: &mut TokenStream) -> Result<TokenStream> {
        let ExprKind::Shape(dims) = &e.kind else {
            return Err(Error::new(e.span, "expected a shape: `[d0, d1]`"));
        };
        let mut ds = vec![];
        for d in dims {
            let v = self.const_int(d, "a shape's size", out)?;
            ds.push(quote_spanned!(d.span=> #v as usize));
        }
        Ok(quote_spanned!(e.span=> &[#(#ds),*]))
    }
}

/// A literal's span: the user's location, marked as made by the macro, so lints on Rust
/// source (clippy's `approx_constant` on `1.4426950408889634`) leave the kernel's numbers
/// alone.
fn literal_span(span: Span) -> Span {
    span.resolved_at(Span::mixed_site())
}

fn no_value(span: Span) -> Error {
    Error::new(
        span,
        "this expression has no value (`store` and `for` return nothing)",
    )
}

/// A binary op on two compile-time operands, folded by rustc when the kernel is built.
fn fold_binary(op: BinOp, l: Gen, r: Gen, span: Span) -> Result<Gen> {
    use Kind::*;
    let sym = match op {
        BinOp::Add => quote_spanned!(span=> +),
        BinOp::Sub => quote_spanned!(span=> -),
        BinOp::Mul => quote_spanned!(span=> *),
        BinOp::Div => quote_spanned!(span=> /),
        BinOp::Rem => quote_spanned!(span=> %),
        BinOp::BitAnd => quote_spanned!(span=> &),
        BinOp::BitOr => quote_spanned!(span=> |),
        BinOp::BitXor => quote_spanned!(span=> ^),
        BinOp::Shl => quote_spanned!(span=> <<),
        BinOp::Shr => quote_spanned!(span=> >>),
        BinOp::Lt => quote_spanned!(span=> <),
        BinOp::Le => quote_spanned!(span=> <=),
        BinOp::Gt => quote_spanned!(span=> >),
        BinOp::Ge => quote_spanned!(span=> >=),
        BinOp::Eq => quote_spanned!(span=> ==),
        BinOp::Ne => quote_spanned!(span=> !=),
        BinOp::And => quote_spanned!(span=> &&),
        BinOp::Or => quote_spanned!(span=> ||),
    };
    let numeric = |k: Kind| matches!(k, Int | Float);
    let (lk, rk) = (l.kind, r.kind);
    // Mixed integer and float operands compute in f64.
    let as_f64 = |g: &Gen| {
        let ts = &g.ts;
        if g.kind == Int {
            quote_spanned!(g.span=> (#ts as f64))
        } else {
            ts.clone()
        }
    };
    let (lt, rt) = if numeric(lk) && numeric(rk) && lk != rk {
        (as_f64(&l), as_f64(&r))
    } else {
        (l.ts.clone(), r.ts.clone())
    };
    let kind = match op {
        BinOp::Add | BinOp::Sub | BinOp::Mul | BinOp::Div | BinOp::Rem
            if numeric(lk) && numeric(rk) =>
        {
            if lk == Float || rk == Float {
                Float
            } else {
                Int
            }
        }
        BinOp::BitAnd | BinOp::BitOr | BinOp::BitXor if lk == rk && matches!(lk, Int | Bool) => lk,
        BinOp::Shl | BinOp::Shr if lk == Int && rk == Int => Int,
        _ if op.is_cmp() && numeric(lk) && numeric(rk) => Bool,
        BinOp::Eq | BinOp::Ne if lk == Bool && rk == Bool => Bool,
        BinOp::And | BinOp::Or if lk == Bool && rk == Bool => Bool,
        _ => {
            return Err(Error::new(
                span,
                format!(
                    "`{}` is not defined between {} and {}",
                    sym.to_string().replace(' ', ""),
                    lk.describe(),
                    rk.describe()
                ),
            ))
        }
    };
    Ok(Gen {
        kind,
        ts: quote_spanned!(span=> (#lt #sym #rt)),
        span,
    })
}
