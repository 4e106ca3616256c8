//! Which variables a loop body or the arms of an `if` assign that are declared outside them:
//! these become the loop's carried values or the branch's results.

use crate::parse::ast::{Block, Expr, ExprKind, Stmt};
use std::collections::HashSet;
use syn::Ident;

/// The variables assigned in `blocks` (the regions of one loop or branch) but declared
/// outside them, in order of first assignment.
pub fn assigned_outside(blocks: &[&Block]) -> syn::Result<Vec<Ident>> {
    let mut w = Walk::default();
    for b in blocks {
        w.block(b);
    }
    // A top-level `let` that shadows one of them would be what the region yields instead.
    let mut errors: Option<syn::Error> = None;
    for b in blocks {
        for s in &b.stmts {
            for n in s.declared() {
                if w.out.iter().any(|o| o == n) {
                    let e = syn::Error::new(
                        n.span(),
                        format!(
                            "`{n}` is assigned in this loop or branch and declared again here; a \
                             value flowing out of a loop or branch cannot be shadowed inside \
                             it: rename this variable"
                        ),
                    );
                    match &mut errors {
                        Some(all) => all.combine(e),
                        None => errors = Some(e),
                    }
                }
            }
        }
    }
    match errors {
        Some(e) => Err(e),
        None => Ok(w.out),
    }
}

#[derive(Default)]
struct Walk {
    scopes: Vec<HashSet<String>>,
    out: Vec<Ident>,
}

impl Walk {
    fn declared(&self, n: &Ident) -> bool {
        let s = n.to_string();
        self.scopes.iter().any(|sc| sc.contains(&s))
    }

    fn block(&mut self, b: &Block) {
        self.scopes.push(HashSet::new());
        for s in &b.stmts {
            match s {
                Stmt::Let { init, .. } | Stmt::LetTuple { init, .. } => {
                    self.expr(init);
                    for n in s.declared() {
                        self.scopes.last_mut().unwrap().insert(n.to_string());
                    }
                }
                Stmt::Assign { target, value, .. } => {
                    self.expr(value);
                    if !self.declared(target) && !self.out.iter().any(|o| o == target) {
                        self.out.push(target.clone());
                    }
                }
                Stmt::For(f) => {
                    self.expr(&f.lo);
                    self.expr(&f.hi);
                    if let Some(s) = &f.step {
                        self.expr(s);
                    }
                    let mut sc = HashSet::new();
                    if let Some(v) = &f.var {
                        sc.insert(v.to_string());
                    }
                    self.scopes.push(sc);
                    self.block(&f.body);
                    self.scopes.pop();
                }
                Stmt::Expr(e) => self.expr(e),
            }
        }
        if let Some(t) = &b.tail {
            self.expr(t);
        }
        self.scopes.pop();
    }

    fn expr(&mut self, e: &Expr) {
        match &e.kind {
            ExprKind::Binary { lhs, rhs, .. } => {
                self.expr(lhs);
                self.expr(rhs);
            }
            ExprKind::Unary { expr, .. } | ExprKind::Cast { expr, .. } => self.expr(expr),
            ExprKind::Builtin { args, .. } | ExprKind::Helper { args, .. } => {
                args.iter().for_each(|a| self.expr(a))
            }
            ExprKind::Shape(items) | ExprKind::Tuple(items) => {
                items.iter().for_each(|d| self.expr(d))
            }
            ExprKind::If(i) => {
                self.expr(&i.cond);
                self.block(&i.then);
                if let Some(o) = &i.otherwise {
                    self.block(o);
                }
            }
            ExprKind::Block(b) => self.block(b),
            ExprKind::Var(_)
            | ExprKind::Int(..)
            | ExprKind::Float(..)
            | ExprKind::Bool(_)
            | ExprKind::PrimConst { .. } => {}
        }
    }
}
