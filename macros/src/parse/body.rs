//! Statements and expressions of a kernel body.

use super::ast::{BinOp, Block, Builtin, ElemTy, Expr, ExprKind, For, If, Stmt, UnOp};
use super::builtins;
use super::Errors;
use crate::suggest;
use proc_macro2::Span;
use quote::ToTokens;
use syn::spanned::Spanned;
use syn::{Error, GenericArgument, Lit, Pat, PathArguments, RangeLimits};

type Result<T> = syn::Result<T>;

/// The function's body.
pub fn fn_body(b: &syn::Block) -> Result<Block> {
    let mut errors = Errors::default();
    let block = block(b, &mut errors);
    errors.finish(block)
}

fn block(b: &syn::Block, errors: &mut Errors) -> Block {
    let mut stmts = vec![];
    let mut tail = None;
    let n = b.stmts.len();
    for (i, s) in b.stmts.iter().enumerate() {
        match s {
            syn::Stmt::Local(l) => {
                if let Some(s) = errors.take(local(l)) {
                    stmts.push(s);
                }
            }
            syn::Stmt::Item(item) => errors.push(Error::new(
                item_span(item),
                "items (`fn`, `use`, `const`, `struct`, ...) cannot be declared inside a #[kernel] \
                 function; write helpers as separate #[kernel] functions and call them",
            )),
            syn::Stmt::Macro(m) => errors.push(macro_error(&m.mac)),
            syn::Stmt::Expr(e, semi) => {
                let last = i + 1 == n && semi.is_none();
                if last && !matches!(e, syn::Expr::ForLoop(_) | syn::Expr::While(_)) {
                    let Some(e) = errors.take(expr(e)) else {
                        continue;
                    };
                    // An `if` or a block with no value at the end is a statement.
                    let value = match &e.kind {
                        ExprKind::If(i) => i.then.tail.is_some(),
                        ExprKind::Block(b) => b.tail.is_some(),
                        _ => true,
                    };
                    if value {
                        tail = Some(Box::new(e));
                    } else {
                        stmts.push(Stmt::Expr(e));
                    }
                } else if let Some(s) = errors.take(stmt_expr(e)) {
                    stmts.push(s);
                }
            }
        }
    }
    Block { stmts, tail }
}

fn item_span(item: &syn::Item) -> Span {
    item.to_token_stream()
        .into_iter()
        .next()
        .map(|t| t.span())
        .unwrap_or_else(Span::call_site)
}

fn macro_error(m: &syn::Macro) -> Error {
    let name = m.path.to_token_stream().to_string().replace(' ', "");
    Error::new_spanned(
        m,
        format!(
            "macros (`{name}!`) are not supported inside #[kernel] functions; kernels run on the \
             GPU, where there is no printing or formatting (use #[kernel(debug)] to print the \
             kernel's IR when it is built)"
        ),
    )
}

fn local(l: &syn::Local) -> Result<Stmt> {
    if let Pat::Tuple(t) = &l.pat {
        return local_tuple(l, t);
    }
    let (name, mutable) =
        match &l.pat {
            Pat::Ident(pi) if pi.by_ref.is_none() && pi.subpat.is_none() => {
                (Some(pi.ident.clone()), pi.mutability.is_some())
            }
            Pat::Wild(_) => (None, false),
            Pat::Type(pt) => return Err(Error::new_spanned(
                &pt.ty,
                "type annotations on `let` are not supported in #[kernel] functions; a value's \
                 type comes from its expression (use `as` to convert)",
            )),
            p => {
                return Err(Error::new_spanned(
                    p,
                    "this pattern is not supported in #[kernel] functions; bind one value per \
                 `let`, or a helper's tuple to names (`let (a, mut b, _) = helper(..);`)",
                ))
            }
        };
    let Some(init) = &l.init else {
        return Err(Error::new_spanned(
            l,
            "`let` without a value is not supported in #[kernel] functions; give the variable \
             its first value (`let mut x = 0.0;`)",
        ));
    };
    if let Some((e, _)) = &init.diverge {
        return Err(Error::new(
            e.span(),
            "`let ... else` is not supported in #[kernel] functions",
        ));
    }
    Ok(Stmt::Let {
        name,
        mutable,
        init: expr(&init.expr)?,
        span: l.let_token.span,
    })
}

/// `let (a, mut b, _) = helper(..);`: names (or `_`) for the values of a helper that returns a
/// tuple, or of a tuple of as many values.
fn local_tuple(l: &syn::Local, t: &syn::PatTuple) -> Result<Stmt> {
    let mut names = vec![];
    for p in &t.elems {
        names.push(match p {
            Pat::Ident(pi) if pi.by_ref.is_none() && pi.subpat.is_none() => {
                (Some(pi.ident.clone()), pi.mutability.is_some())
            }
            Pat::Wild(_) => (None, false),
            p => {
                return Err(Error::new_spanned(
                    p,
                    "each element of a `let (..)` in a #[kernel] function is a name, `mut name` \
                     or `_`",
                ))
            }
        });
    }
    let init = match &l.init {
        Some(init) if init.diverge.is_none() => expr(&init.expr)?,
        _ => return Err(Error::new_spanned(l, TUPLE_LET)),
    };
    match &init.kind {
        ExprKind::Helper { .. } => {}
        ExprKind::Tuple(items) if items.len() == names.len() => {}
        ExprKind::Tuple(items) => {
            return Err(Error::new(
                init.span,
                format!(
                    "this tuple has {} values, but the `let` names {}",
                    items.len(),
                    names.len()
                ),
            ))
        }
        _ => return Err(Error::new(init.span, TUPLE_LET)),
    }
    Ok(Stmt::LetTuple {
        names,
        init,
        span: l.let_token.span,
    })
}

const TUPLE_LET: &str = "a `let (..)` in a #[kernel] function takes the values of a helper that \
     returns a tuple, `let (a, b) = helper(..);`, or of a tuple, `let (a, b) = (x, y);`";

/// An expression in statement position: assignments and loops are allowed here.
fn stmt_expr(e: &syn::Expr) -> Result<Stmt> {
    match e {
        syn::Expr::Assign(a) => Ok(Stmt::Assign {
            target: assign_target(&a.left)?,
            op: None,
            value: expr(&a.right)?,
            span: a.eq_token.span,
        }),
        syn::Expr::Binary(b) if compound_op(&b.op).is_some() => Ok(Stmt::Assign {
            target: assign_target(&b.left)?,
            op: Some((compound_op(&b.op).unwrap(), b.op.span())),
            value: expr(&b.right)?,
            span: b.op.span(),
        }),
        syn::Expr::ForLoop(f) => for_loop(f).map(|f| Stmt::For(Box::new(f))),
        syn::Expr::While(w) => while_loop(w).map(|f| Stmt::For(Box::new(f))),
        e => expr(e).map(Stmt::Expr),
    }
}

fn assign_target(e: &syn::Expr) -> Result<syn::Ident> {
    match e {
        syn::Expr::Path(p) if p.qself.is_none() => p.path.get_ident().cloned().ok_or_else(|| {
            Error::new_spanned(p, "only variables can be assigned in #[kernel] functions")
        }),
        syn::Expr::Index(_) => Err(Error::new_spanned(
            e,
            "assigning to an element (`x[i] = ...`) is not supported in #[kernel] functions; \
             write memory with `store(ptr + offset, value)`",
        )),
        syn::Expr::Unary(_) => Err(Error::new_spanned(
            e,
            "assigning through a pointer is not supported in #[kernel] functions; write memory \
             with `store(ptr, value)`",
        )),
        _ => Err(Error::new_spanned(
            e,
            "only variables can be assigned in #[kernel] functions",
        )),
    }
}

fn compound_op(op: &syn::BinOp) -> Option<BinOp> {
    use syn::BinOp as S;
    Some(match op {
        S::AddAssign(_) => BinOp::Add,
        S::SubAssign(_) => BinOp::Sub,
        S::MulAssign(_) => BinOp::Mul,
        S::DivAssign(_) => BinOp::Div,
        S::RemAssign(_) => BinOp::Rem,
        S::BitAndAssign(_) => BinOp::BitAnd,
        S::BitOrAssign(_) => BinOp::BitOr,
        S::BitXorAssign(_) => BinOp::BitXor,
        S::ShlAssign(_) => BinOp::Shl,
        S::ShrAssign(_) => BinOp::Shr,
        _ => return None,
    })
}

fn binary_op(op: &syn::BinOp) -> Option<BinOp> {
    use syn::BinOp as S;
    Some(match op {
        S::Add(_) => BinOp::Add,
        S::Sub(_) => BinOp::Sub,
        S::Mul(_) => BinOp::Mul,
        S::Div(_) => BinOp::Div,
        S::Rem(_) => BinOp::Rem,
        S::BitAnd(_) => BinOp::BitAnd,
        S::BitOr(_) => BinOp::BitOr,
        S::BitXor(_) => BinOp::BitXor,
        S::Shl(_) => BinOp::Shl,
        S::Shr(_) => BinOp::Shr,
        S::Lt(_) => BinOp::Lt,
        S::Le(_) => BinOp::Le,
        S::Gt(_) => BinOp::Gt,
        S::Ge(_) => BinOp::Ge,
        S::Eq(_) => BinOp::Eq,
        S::Ne(_) => BinOp::Ne,
        S::And(_) => BinOp::And,
        S::Or(_) => BinOp::Or,
        _ => return None,
    })
}

const FOR_FORMS: &str = "`for i in lo..hi` or `for i in (lo..hi).step_by(step)`";

const WHILE_FORM: &str = "`#[bound(n)] while cond { .. }`, which stops after `n` iterations \
     if `cond` still holds (`n` a constant or an i32 value)";

/// Whether a `for` loop is marked `#[unroll]`; any other attribute is an error.
fn unroll_attr(attrs: &[syn::Attribute]) -> Result<bool> {
    let mut unroll = false;
    for a in attrs {
        if a.path().is_ident("unroll") {
            a.meta.require_path_only()?;
            unroll = true;
        } else {
            return Err(Error::new_spanned(
                a,
                "the only attribute of a `for` loop in #[kernel] functions is `#[unroll]` (run \
                 the loop when the kernel is built, over compile-time bounds)",
            ));
        }
    }
    Ok(unroll)
}

/// `#[bound(n)] while cond { body }` as `for _ in 0..n { if cond { body } }`: once `cond`
/// fails nothing in the body runs, so nothing it reads changes and the rest of the
/// iterations do nothing.
fn while_loop(w: &syn::ExprWhile) -> Result<For> {
    if let Some(l) = &w.label {
        return Err(Error::new_spanned(
            l,
            "loop labels are not supported in #[kernel] functions (there is no `break`)",
        ));
    }
    if let syn::Expr::Let(l) = &*w.cond {
        return Err(Error::new_spanned(
            l,
            format!("`while let` is not supported in #[kernel] functions; write {WHILE_FORM}"),
        ));
    }
    let mut bound = None;
    for a in &w.attrs {
        if a.path().is_ident("bound") && bound.is_none() {
            bound = Some(expr(&a.parse_args::<syn::Expr>()?)?);
        } else {
            return Err(Error::new_spanned(
                a,
                format!("the only attribute of a `while` loop in #[kernel] functions is `#[bound(n)]`: {WHILE_FORM}"),
            ));
        }
    }
    let span = w.while_token.span;
    let Some(hi) = bound else {
        return Err(Error::new(
            span,
            format!(
                "a `while` loop in a #[kernel] function needs an iteration bound (a GPU loop \
                 must end): write {WHILE_FORM}"
            ),
        ));
    };
    let (cond, then) = both(expr(&w.cond), {
        let mut errors = Errors::default();
        let b = block(&w.body, &mut errors);
        errors.finish(b)
    })?;
    let guarded = Expr {
        kind: ExprKind::If(If {
            cond: Box::new(cond),
            then,
            otherwise: None,
            span,
        }),
        span,
    };
    Ok(For {
        var: None,
        lo: Expr {
            kind: ExprKind::Int(syn::LitInt::new("0", span), None),
            span,
        },
        hi,
        step: None,
        body: Block {
            stmts: vec![Stmt::Expr(guarded)],
            tail: None,
        },
        unroll: false,
        span,
    })
}

fn for_loop(f: &syn::ExprForLoop) -> Result<For> {
    let unroll = unroll_attr(&f.attrs)?;
    if let Some(l) = &f.label {
        return Err(Error::new_spanned(
            l,
            "loop labels are not supported in #[kernel] functions (there is no `break`)",
        ));
    }
    let var = match &*f.pat {
        Pat::Ident(pi) if pi.by_ref.is_none() && pi.subpat.is_none() && pi.mutability.is_none() => {
            Some(pi.ident.clone())
        }
        Pat::Wild(_) => None,
        p => {
            return Err(Error::new_spanned(
                p,
                format!("a `for` loop's variable is a plain name or `_`: {FOR_FORMS}"),
            ))
        }
    };
    let (range, step) = match &*f.expr {
        syn::Expr::MethodCall(m) if m.method == "step_by" => {
            if m.args.len() != 1 || m.turbofish.is_some() {
                return Err(Error::new_spanned(m, "`.step_by(step)` takes one argument"));
            }
            (strip_parens(&m.receiver), Some(expr(&m.args[0])?))
        }
        e => (strip_parens(e), None),
    };
    let syn::Expr::Range(r) = range else {
        return Err(Error::new_spanned(
            &f.expr,
            format!("`for` loops in #[kernel] functions iterate over a range: {FOR_FORMS}"),
        ));
    };
    if let RangeLimits::Closed(t) = r.limits {
        return Err(Error::new(
            t.span(),
            "inclusive ranges are not supported in #[kernel] functions; write `lo..hi + 1`",
        ));
    }
    let (Some(lo), Some(hi)) = (&r.start, &r.end) else {
        return Err(Error::new_spanned(
            r,
            "a `for` loop's range needs both bounds: `lo..hi`",
        ));
    };
    let (lo, hi) = both(expr(lo), expr(hi))?;
    Ok(For {
        var,
        lo,
        hi,
        step,
        body: {
            let mut errors = Errors::default();
            let b = block(&f.body, &mut errors);
            errors.finish(b)?
        },
        unroll,
        span: f.for_token.span,
    })
}

fn strip_parens(e: &syn::Expr) -> &syn::Expr {
    match e {
        syn::Expr::Paren(p) => strip_parens(&p.expr),
        syn::Expr::Group(g) => strip_parens(&g.expr),
        e => e,
    }
}

/// Both results, or both errors combined.
fn both<A, B>(a: Result<A>, b: Result<B>) -> Result<(A, B)> {
    match (a, b) {
        (Ok(a), Ok(b)) => Ok((a, b)),
        (Err(mut e), Err(f)) => {
            e.combine(f);
            Err(e)
        }
        (Err(e), _) | (_, Err(e)) => Err(e),
    }
}

/// All the expressions, or all their errors combined.
fn exprs<'a>(es: impl IntoIterator<Item = &'a syn::Expr>) -> Result<Vec<Expr>> {
    let mut errors = Errors::default();
    let out: Vec<Expr> = es
        .into_iter()
        .filter_map(|e| errors.take(expr(e)))
        .collect();
    errors.finish(out)
}

fn if_expr(i: &syn::ExprIf) -> Result<If> {
    if let syn::Expr::Let(l) = &*i.cond {
        return Err(Error::new_spanned(
            l,
            "`if let` is not supported in #[kernel] functions; branch on a boolean: `if cond { .. }`",
        ));
    }
    let cond = expr(&i.cond);
    let then = {
        let mut errors = Errors::default();
        let b = block(&i.then_branch, &mut errors);
        errors.finish(b)
    };
    let otherwise = match &i.else_branch {
        None => Ok(None),
        Some((_, e)) => match &**e {
            syn::Expr::Block(b) => {
                let mut errors = Errors::default();
                let b = block(&b.block, &mut errors);
                errors.finish(b).map(Some)
            }
            syn::Expr::If(inner) => if_expr(inner).map(|inner| {
                let span = inner.span;
                let value = inner.then.tail.is_some();
                let e = Expr {
                    kind: ExprKind::If(inner),
                    span,
                };
                Some(if value {
                    Block {
                        stmts: vec![],
                        tail: Some(Box::new(e)),
                    }
                } else {
                    Block {
                        stmts: vec![Stmt::Expr(e)],
                        tail: None,
                    }
                })
            }),
            e => Err(Error::new_spanned(e, "expected a block after `else`")),
        },
    };
    let (cond, (then, otherwise)) = both(cond, both(then, otherwise))?;
    Ok(If {
        cond: Box::new(cond),
        then,
        otherwise,
        span: i.if_token.span,
    })
}

fn lit_suffix(suffix: &str, span: Span, float: bool) -> Result<Option<ElemTy>> {
    if suffix.is_empty() {
        return Ok(None);
    }
    match ElemTy::from_name(suffix) {
        Some(t @ (ElemTy::I32 | ElemTy::I64 | ElemTy::U8)) if !float => Ok(Some(t)),
        Some(ElemTy::F32) => Ok(Some(ElemTy::F32)),
        _ => Err(Error::new(
            span,
            format!(
                "the literal suffix `{suffix}` is not a kernel type; write the literal without a \
                 suffix (it takes the type of the value it meets) or with one of {}",
                if float { "f32" } else { "i32, i64, u8, f32" }
            ),
        )),
    }
}

fn elem_ty(t: &syn::Type) -> Result<ElemTy> {
    let name = match t {
        syn::Type::Path(tp) if tp.qself.is_none() => tp.path.get_ident().map(|i| i.to_string()),
        _ => None,
    };
    name.as_deref().and_then(ElemTy::from_name).ok_or_else(|| {
        Error::new_spanned(
            t,
            format!(
                "`{}` is not a kernel element type; the element types are f16, bf16, f32, i32, \
                 i64, u8 and bool",
                t.to_token_stream()
            ),
        )
    })
}

fn turbofish_type(args: &syn::AngleBracketedGenericArguments) -> Result<ElemTy> {
    match args.args.iter().collect::<Vec<_>>()[..] {
        [GenericArgument::Type(t)] => elem_ty(t),
        _ => Err(Error::new_spanned(
            args,
            "expected one element type: `::<f32>`",
        )),
    }
}

/// An expression in value position.
pub fn expr(e: &syn::Expr) -> Result<Expr> {
    let span = e.span();
    let kind = match e {
        syn::Expr::Paren(p) => return expr(&p.expr),
        syn::Expr::Group(g) => return expr(&g.expr),
        syn::Expr::Lit(l) => match &l.lit {
            Lit::Int(i) => ExprKind::Int(i.clone(), lit_suffix(i.suffix(), i.span(), false)?),
            Lit::Float(f) => ExprKind::Float(f.clone(), lit_suffix(f.suffix(), f.span(), true)?),
            Lit::Bool(b) => ExprKind::Bool(b.value),
            other => {
                return Err(Error::new_spanned(
                    other,
                    "only number and `true`/`false` literals are supported in #[kernel] functions",
                ))
            }
        },
        syn::Expr::Path(p) => path_expr(p)?,
        syn::Expr::Binary(b) => {
            let Some(op) = binary_op(&b.op) else {
                return Err(Error::new(
                    b.op.span(),
                    "compound assignment is a statement in #[kernel] functions: write it on its \
                     own line (`x += y;`)",
                ));
            };
            let (lhs, rhs) = both(expr(&b.left), expr(&b.right))?;
            return Ok(Expr {
                kind: ExprKind::Binary {
                    op,
                    lhs: Box::new(lhs),
                    rhs: Box::new(rhs),
                },
                span: b.op.span(),
            });
        }
        syn::Expr::Unary(u) => {
            let op = match u.op {
                syn::UnOp::Neg(_) => UnOp::Neg,
                syn::UnOp::Not(_) => UnOp::Not,
                _ => return Err(Error::new_spanned(
                    u,
                    "dereferencing (`*p`) is not supported in #[kernel] functions; read memory \
                         with `load(p)`",
                )),
            };
            ExprKind::Unary {
                op,
                expr: Box::new(expr(&u.expr)?),
            }
        }
        syn::Expr::Cast(c) => {
            let (inner, to) = both(expr(&c.expr), elem_ty(&c.ty))?;
            return Ok(Expr {
                kind: ExprKind::Cast {
                    expr: Box::new(inner),
                    to,
                },
                span: c.as_token.span,
            });
        }
        syn::Expr::Call(c) => return call(c),
        syn::Expr::MethodCall(m) => return method_call(m),
        syn::Expr::If(i) => ExprKind::If(if_expr(i)?),
        syn::Expr::Block(b) => {
            if let Some(l) = &b.label {
                return Err(Error::new_spanned(
                    l,
                    "block labels are not supported in #[kernel] functions",
                ));
            }
            let mut errors = Errors::default();
            let blk = block(&b.block, &mut errors);
            ExprKind::Block(errors.finish(blk)?)
        }
        syn::Expr::Tuple(t) => {
            ExprKind::Tuple(t.elems.iter().map(expr).collect::<Result<Vec<_>>>()?)
        }
        syn::Expr::Array(a) => {
            return Err(Error::new_spanned(
                a,
                "arrays are only supported as shapes in #[kernel] functions, as in \
                 `splat(x, [ROWS, COLS])` and `zeros::<f32>([ROWS, COLS])`",
            ))
        }
        other => return Err(unsupported(other)),
    };
    Ok(Expr { kind, span })
}

fn path_expr(p: &syn::ExprPath) -> Result<ExprKind> {
    if p.qself.is_none() {
        if let Some(i) = p.path.get_ident() {
            return Ok(ExprKind::Var(i.clone()));
        }
        let segs: Vec<String> = p
            .path
            .segments
            .iter()
            .map(|s| s.ident.to_string())
            .collect();
        let plain = p.path.segments.iter().all(|s| s.arguments.is_none());
        // `std::f32::consts::LOG2_E` and the like.
        let consts_path = segs.len() == 4
            && matches!(segs[0].as_str(), "std" | "core")
            && matches!(segs[1].as_str(), "f32" | "f64")
            && segs[2] == "consts";
        if plain && consts_path {
            return Ok(ExprKind::PrimConst {
                path: p.path.clone(),
                is_float: true,
            });
        }
        if plain && segs.len() == 2 {
            let is_float = matches!(segs[0].as_str(), "f32" | "f64");
            let is_int = matches!(segs[0].as_str(), "i32" | "i64" | "u8" | "u32" | "usize");
            if is_float || is_int {
                return Ok(ExprKind::PrimConst {
                    path: p.path.clone(),
                    is_float,
                });
            }
        }
    }
    Err(Error::new_spanned(
        p,
        "paths are not supported as values in #[kernel] functions; use variables, parameters, \
         const generics, literals or constants such as `f32::INFINITY` and \
         `std::f32::consts::LN_2`",
    ))
}

fn call(c: &syn::ExprCall) -> Result<Expr> {
    let syn::Expr::Path(fp) = &*c.func else {
        return Err(Error::new_spanned(
            &c.func,
            "only named functions can be called in #[kernel] functions: builtins such as \
             `load(p)` or other #[kernel] functions",
        ));
    };
    if fp.qself.is_some() {
        return Err(Error::new_spanned(
            fp,
            "qualified paths are not supported in #[kernel] functions",
        ));
    }
    let mut path = fp.path.clone();
    let last = path.segments.last_mut().expect("a path has a segment");
    let span = last.ident.span();
    let generics = match std::mem::replace(&mut last.arguments, PathArguments::None) {
        PathArguments::None => None,
        PathArguments::AngleBracketed(a) => Some(a),
        PathArguments::Parenthesized(p) => {
            return Err(Error::new_spanned(p, "unexpected parenthesized arguments"))
        }
    };
    let name = last.ident.to_string();
    if path.segments.len() == 1 && path.leading_colon.is_none() {
        if let Some(spec) = builtins::lookup(&name) {
            return builtin(
                spec,
                generics.as_ref(),
                c.args.iter().collect(),
                span,
                &c.args,
            );
        }
    }
    if path.segments.len() == 1 && path.leading_colon.is_none() {
        if let Some(known) = suggest::closest(&name, builtins::BUILTINS.iter().map(|s| s.name)) {
            let spec = builtins::lookup(known).expect("a builtin's name");
            return Err(Error::new(
                span,
                format!(
                    "unknown builtin `{name}`; did you mean `{known}`? (`{}`; a #[kernel] helper \
                     named `{name}` is called as `self::{name}(..)`)",
                    spec.usage
                ),
            ));
        }
    }
    if let Some(s) = path.segments.iter().find(|s| !s.arguments.is_none()) {
        return Err(Error::new_spanned(
            s,
            "generic arguments go on the last segment of a helper's path",
        ));
    }
    Ok(Expr {
        kind: ExprKind::Helper {
            path,
            generics,
            args: exprs(&c.args)?,
        },
        span,
    })
}

fn builtin(
    spec: &builtins::Spec,
    generics: Option<&syn::AngleBracketedGenericArguments>,
    args: Vec<&syn::Expr>,
    span: Span,
    args_tokens: &dyn ToTokens,
) -> Result<Expr> {
    let ty = match (generics, spec.takes_type) {
        (Some(g), true) => Some(turbofish_type(g)?),
        (None, true) => {
            return Err(Error::new(
                span,
                format!("`{}` needs an element type: {}", spec.name, spec.usage),
            ))
        }
        (Some(g), false) => {
            return Err(Error::new_spanned(
                g,
                format!("`{}` takes no type arguments: {}", spec.name, spec.usage),
            ))
        }
        (None, false) => None,
    };
    if args.len() < spec.min_args || args.len() > spec.max_args {
        let n = if spec.min_args == spec.max_args {
            format!("{}", spec.min_args)
        } else {
            format!("{} to {}", spec.min_args, spec.max_args)
        };
        let msg = format!(
            "`{}` takes {n} argument{}, found {}: {}",
            spec.name,
            if spec.max_args == 1 { "" } else { "s" },
            args.len(),
            spec.usage
        );
        let mut tokens = proc_macro2::TokenStream::new();
        args_tokens.to_tokens(&mut tokens);
        return Err(if tokens.is_empty() {
            Error::new(span, msg)
        } else {
            Error::new_spanned(tokens, msg)
        });
    }
    // The shape argument of `splat` and `zeros`.
    let shape_at = match spec.func {
        Builtin::Splat => Some(1),
        Builtin::Zeros => Some(0),
        _ => None,
    };
    let mut errors = Errors::default();
    let mut out = vec![];
    for (i, a) in args.iter().enumerate() {
        if shape_at == Some(i) {
            match strip_parens(a) {
                syn::Expr::Array(arr) => {
                    if let Some(dims) = errors.take(exprs(&arr.elems)) {
                        out.push(Expr {
                            kind: ExprKind::Shape(dims),
                            span: arr.span(),
                        });
                    }
                }
                other => errors.push(Error::new_spanned(
                    other,
                    format!(
                        "the shape is an array of compile-time sizes: {}",
                        spec.usage
                    ),
                )),
            }
        } else if let Some(e) = errors.take(expr(a)) {
            out.push(e);
        }
    }
    let args = errors.finish(out)?;
    Ok(Expr {
        kind: ExprKind::Builtin {
            func: spec.func,
            ty,
            args,
        },
        span,
    })
}

fn method_call(m: &syn::ExprMethodCall) -> Result<Expr> {
    let name = m.method.to_string();
    let span = m.method.span();
    if name == "to" {
        let ty = match &m.turbofish {
            Some(t) if m.args.is_empty() => turbofish_type(t)?,
            _ => {
                return Err(Error::new_spanned(
                    m,
                    "`.to::<T>()` converts to the element type T and takes no arguments",
                ))
            }
        };
        return Ok(Expr {
            kind: ExprKind::Cast {
                expr: Box::new(expr(&m.receiver)?),
                to: ty,
            },
            span,
        });
    }
    if name == "step_by" {
        return Err(Error::new(
            span,
            format!("`.step_by(s)` is only supported on a `for` loop's range: {FOR_FORMS}"),
        ));
    }
    let Some(spec) = builtins::method(&name) else {
        let methods = builtins::BUILTINS
            .iter()
            .filter(|s| s.method.is_some())
            .map(|s| s.name)
            .chain(["to"]);
        if let Some(known) = suggest::closest(&name, methods) {
            return Err(Error::new(
                span,
                format!("the method `{name}` is not supported in #[kernel] functions; did you mean `.{known}()`?"),
            ));
        }
        return Err(Error::new(
            span,
            format!(
                "the method `{name}` is not supported in #[kernel] functions; the supported \
                 methods are {} (or call the builtin function, e.g. `sum(x, 0)`)",
                builtins::methods_list()
            ),
        ));
    };
    let mut args: Vec<&syn::Expr> = vec![&m.receiver];
    args.extend(m.args.iter());
    builtin(spec, m.turbofish.as_ref(), args, span, &m.args)
}

/// The error for an expression the language does not have.
fn unsupported(e: &syn::Expr) -> Error {
    use syn::Expr as E;
    match e {
        E::Match(m) => Error::new(
            m.match_token.span,
            "`match` is not supported in #[kernel] functions; use `where_(cond, a, b)` or `if`",
        ),
        E::While(w) => Error::new(
            w.while_token.span,
            "a `while` loop is a statement in #[kernel] functions; it has no value",
        ),
        E::Loop(l) => Error::new(
            l.loop_token.span,
            format!(
                "`loop` is not supported in #[kernel] functions; use a counted loop ({FOR_FORMS}) \
                 or a bounded one ({WHILE_FORM})"
            ),
        ),
        E::ForLoop(f) => Error::new(
            f.for_token.span,
            "a `for` loop is a statement in #[kernel] functions; it has no value",
        ),
        E::Closure(c) => Error::new_spanned(
            c,
            "closures are not supported in #[kernel] functions; write the code inline, or as \
             another #[kernel] function and call it",
        ),
        E::Index(i) => Error::new_spanned(
            i,
            "indexing is not supported in #[kernel] functions; values are whole blocks: read \
             memory with `load(ptr + offsets)`, combine elements with `sum`/`max`/`min`",
        ),
        E::Reference(r) => Error::new_spanned(
            r,
            "references are not supported in #[kernel] functions; pass values directly (kernel \
             values are copied)",
        ),
        E::Return(r) => Error::new_spanned(
            r,
            "`return` is not supported in #[kernel] functions; a helper's value is its last \
             expression (without `;`), and `if` skips work",
        ),
        E::Break(b) => Error::new_spanned(
            b,
            "`break` is not supported in #[kernel] functions; a loop always runs its whole range \
             (put an `if` inside)",
        ),
        E::Continue(c) => Error::new_spanned(
            c,
            "`continue` is not supported in #[kernel] functions; put the rest of the body in an `if`",
        ),
        E::Macro(m) => macro_error(&m.mac),
        E::Struct(s) => Error::new_spanned(
            s,
            "structs are not supported in #[kernel] functions; kernel values are numbers, blocks \
             and pointers",
        ),
        E::Field(f) => Error::new_spanned(
            f,
            "field access is not supported in #[kernel] functions; kernel values are numbers, \
             blocks and pointers",
        ),
        E::Range(r) => Error::new_spanned(
            r,
            format!("ranges are only supported as `for` loop bounds: {FOR_FORMS}"),
        ),
        E::Try(t) => Error::new_spanned(
            t,
            "`?` is not supported in #[kernel] functions; build errors are returned by `build`",
        ),
        E::Assign(a) => Error::new_spanned(
            a,
            "assignment is a statement in #[kernel] functions: write it on its own line",
        ),
        E::Unsafe(u) => Error::new(
            u.unsafe_token.span,
            "`unsafe` blocks are not supported in #[kernel] functions",
        ),
        E::Let(l) => Error::new_spanned(
            l,
            "`let` in an expression is not supported in #[kernel] functions",
        ),
        E::Repeat(r) => Error::new_spanned(
            r,
            "arrays are not supported in #[kernel] functions; use `splat(x, [N])`",
        ),
        other => Error::new_spanned(
            other,
            "this expression is not supported in #[kernel] functions; see \
             docs/kernel-language.md for the language",
        ),
    }
}
