//! Type rules of every op, and the verifier that checks a whole kernel against them.
//!
//! The builder calls [`result_types`] to type each op as it is made; [`verify`] re-checks a
//! finished kernel (one built by hand, or changed by a pass) and checks SSA scoping.

use crate::ir::*;
use crate::CompileError;
use std::collections::HashSet;

/// The largest block the code generator accepts (elements); keeps per-thread register
/// arrays bounded.
pub const MAX_BLOCK_ELEMENTS: usize = 1 << 16;

fn same_shape(a: &Type, b: &Type, what: &str) -> Result<(), String> {
    if a.shape != b.shape {
        return Err(format!("{what}: shapes differ, {a} and {b}"));
    }
    Ok(())
}

fn num(t: &Type, what: &str) -> Result<DType, String> {
    t.elem
        .dtype()
        .ok_or_else(|| format!("{what}: expected a number, found {t}"))
}

/// The types of the results of an op, given the types of the values it reads.
pub fn result_types(kind: &OpKind, ty: &dyn Fn(ValueId) -> Type) -> Result<Vec<Type>, String> {
    use OpKind::*;
    let one = |t: Type| Ok(vec![t]);
    match kind {
        WaitPriorGrid | ReleaseDependents | Barrier | Sleep { .. } => Ok(vec![]),
        SharedAlloc { dtype, len } => {
            if *len == 0 || *dtype == DType::Bool {
                return Err(format!(
                    "shared_alloc needs at least one element of a number type, found {len} of {}",
                    dtype.name()
                ));
            }
            one(Type {
                elem: Elem::SharedPtr(*dtype),
                shape: vec![],
            })
        }
        GlobalTimer => one(Type::scalar(DType::I64)),
        SmId => one(Type::scalar(DType::I32)),
        ProgramId { axis } | NumPrograms { axis } => {
            if *axis > 2 {
                return Err(format!("grid axis {axis} out of range 0..=2"));
            }
            one(Type::scalar(DType::I32))
        }
        Constant { value, dtype } => {
            let ok = matches!(
                (value, dtype.is_float(), *dtype == DType::Bool),
                (Const::Float(_), true, _)
                    | (Const::Int(_), false, false)
                    | (Const::Bool(_), _, true)
            );
            if !ok {
                return Err(format!(
                    "constant {value:?} cannot have type {}",
                    dtype.name()
                ));
            }
            one(Type::scalar(*dtype))
        }
        Arange { start, end } => {
            let n = end - start;
            if n <= 0 || !(n as u64).is_power_of_two() {
                return Err(format!(
                    "arange({start}, {end}): the length must be a power of two"
                ));
            }
            one(Type::block(Elem::Num(DType::I32), &[n as usize]))
        }
        Splat { value, shape } => {
            let t = ty(*value);
            if !t.is_scalar() {
                return Err(format!("splat of a non-scalar {t}"));
            }
            check_shape(shape)?;
            one(Type::block(t.elem, shape))
        }
        Expand { value, axis, size } => {
            let t = ty(*value);
            if t.shape.len() != 1 {
                return Err(format!("expand needs a 1-D block, found {t}"));
            }
            if *axis > 1 {
                return Err(format!("expand axis {axis} must be 0 or 1"));
            }
            let shape = if *axis == 0 {
                vec![*size, t.shape[0]]
            } else {
                vec![t.shape[0], *size]
            };
            check_shape(&shape)?;
            one(Type::block(t.elem, &shape))
        }
        Binary { op, lhs, rhs } => {
            let (a, b) = (ty(*lhs), ty(*rhs));
            same_shape(&a, &b, "operands")?;
            let d = num(&a, "the left operand")?;
            if a.elem != b.elem {
                return Err(format!("operand types differ: {a} and {b}"));
            }
            let int_only = matches!(
                op,
                BinOp::And | BinOp::Or | BinOp::Xor | BinOp::Shl | BinOp::Shr | BinOp::Rem
            );
            if int_only && d.is_float() {
                return Err(format!("`{}` needs integers, found {a}", bin_symbol(*op)));
            }
            if d == DType::Bool && !matches!(op, BinOp::And | BinOp::Or | BinOp::Xor) {
                return Err(format!(
                    "`{}` is not defined on bools (only `&`, `|` and `^` are), found {a}; \
                     convert with `as i32` first",
                    bin_symbol(*op)
                ));
            }
            one(a)
        }
        Cmp { lhs, rhs, .. } => {
            let (a, b) = (ty(*lhs), ty(*rhs));
            same_shape(&a, &b, "compared values")?;
            num(&a, "the left operand")?;
            if a.elem != b.elem {
                return Err(format!("operand types differ: {a} and {b}"));
            }
            one(a.with_elem(Elem::Num(DType::Bool)))
        }
        Unary { op, value } => {
            let t = ty(*value);
            let d = num(&t, "the operand")?;
            let float_only = matches!(op, UnOp::Exp2 | UnOp::Log2 | UnOp::Sqrt | UnOp::Rsqrt);
            if float_only && !d.is_float() {
                return Err(format!(
                    "`{}` needs floats, found {t}; convert with `as f32` first",
                    un_symbol(*op)
                ));
            }
            if *op == UnOp::Not && d.is_float() {
                return Err(format!("`!` needs integers or bools, found {t}"));
            }
            one(t)
        }
        Cast { value, to } => {
            let t = ty(*value);
            num(&t, "the operand")?;
            one(t.with_elem(Elem::Num(*to)))
        }
        Bitcast { value, to } => {
            let t = ty(*value);
            let same_size = matches!(
                (t.elem, to),
                (Elem::Num(DType::F32), DType::I32) | (Elem::Num(DType::I32), DType::F32)
            );
            if !same_size {
                return Err(format!(
                    "bitcast takes f32 to i32 or i32 to f32, found {t} to {}",
                    to.name()
                ));
            }
            one(t.with_elem(Elem::Num(*to)))
        }
        Select {
            cond,
            on_true,
            on_false,
        } => {
            let (c, a, b) = (ty(*cond), ty(*on_true), ty(*on_false));
            if c.elem != Elem::Num(DType::Bool) {
                return Err(format!(
                    "the condition of `where_` must be a bool block (a comparison such as \
                     `x > 0`), found {c}"
                ));
            }
            if a != b {
                return Err(format!("the two values of `where_` differ: {a} and {b}"));
            }
            if !c.is_scalar() {
                same_shape(&c, &a, "select condition and arms")?;
            }
            one(a)
        }
        PtrCast { ptr, to } => {
            let p = ty(*ptr);
            match p.elem {
                Elem::Ptr(_) => one(p.with_elem(Elem::Ptr(*to))),
                Elem::SharedPtr(_) => one(p.with_elem(Elem::SharedPtr(*to))),
                Elem::Num(_) => Err(format!("ptr_cast needs a pointer, found {p}")),
            }
        }
        Dp2a {
            pairs, bytes, acc, ..
        } => {
            let (a, b, c) = (ty(*pairs), ty(*bytes), ty(*acc));
            for (name, t) in [("pairs", &a), ("bytes", &b), ("acc", &c)] {
                if t.elem != Elem::Num(DType::I32) {
                    return Err(format!("dp2a `{name}` must be i32, found {t}"));
                }
            }
            same_shape(&a, &b, "dp2a operands")?;
            same_shape(&a, &c, "dp2a operands")?;
            one(a)
        }
        DotInt4 { codes, q } => {
            let (c, qt) = (ty(*codes), ty(*q));
            if c.elem != Elem::Num(DType::I32) || c.shape.len() != 2 {
                return Err(format!("dot_int4 codes must be a 2-D i32 block, found {c}"));
            }
            if qt.elem != Elem::Num(DType::F16)
                || qt.shape.len() != 2
                || qt.shape[0] != 8
                || qt.shape[1] != 8 * c.shape[1]
            {
                return Err(format!(
                    "dot_int4 q must be f16[8x{}] for codes {c}, found {qt}",
                    8 * c.shape[1]
                ));
            }
            if c.shape[0] < 16 || qt.shape[1] < 64 {
                return Err(format!(
                    "dot_int4 needs at least 16 rows and 64 columns of q, found {c} and {qt}"
                ));
            }
            one(Type::block(Elem::Num(DType::F32), &[c.shape[0], 8]))
        }
        Dot { a, b, acc, trans_a } => {
            let (at, bt) = (ty(*a), ty(*b));
            let half = |t: &Type| matches!(t.elem, Elem::Num(DType::F16 | DType::BF16));
            if !half(&at) || at.shape.len() != 2 || at.elem != bt.elem || bt.shape.len() != 2 {
                return Err(format!(
                    "dot operands must be 2-D f16 or bf16 blocks of one type, found {at} and {bt}"
                ));
            }
            let (m, kd) = if *trans_a {
                (at.shape[1], at.shape[0])
            } else {
                (at.shape[0], at.shape[1])
            };
            let (n, kb) = (bt.shape[0], bt.shape[1]);
            if kd != kb {
                return Err(format!(
                    "dot operands disagree on the summed dimension: {at} and {bt} (trans_a {trans_a})"
                ));
            }
            let fits = if *trans_a {
                kd == 8 && n == 8 && m % 32 == 0
            } else {
                matches!(m, 8 | 16) && n == 8 && kd % 64 == 0
            };
            if !fits {
                return Err(format!(
                    "dot takes M 8 or 16, N 8, K a multiple of 64 (or with trans_a K 8, N 8, M a \
                     multiple of 32), found M {m}, N {n}, K {kd}"
                ));
            }
            let rt = Type::block(Elem::Num(DType::F32), &[m, n]);
            if let Some(c) = acc {
                if ty(*c) != rt {
                    return Err(format!("dot accumulator must be {rt}, found {}", ty(*c)));
                }
            }
            one(rt)
        }
        AddPtr { ptr, offset } => {
            let (p, o) = (ty(*ptr), ty(*offset));
            if p.elem.pointee().is_none() {
                return Err(format!("add_ptr needs a pointer, found {p}"));
            }
            if !matches!(o.elem, Elem::Num(DType::I32 | DType::I64)) {
                return Err(format!("add_ptr offset must be i32 or i64, found {o}"));
            }
            same_shape(&p, &o, "pointer and offset")?;
            one(p)
        }
        Load {
            ptr,
            mask,
            other,
            streaming,
        } => {
            let p = ty(*ptr);
            let Some(d) = p.elem.pointee() else {
                return Err(format!("load needs a pointer, found {p}"));
            };
            if *streaming && !matches!(p.elem, Elem::Ptr(_)) {
                return Err(format!("a streaming load reads global memory, found {p}"));
            }
            check_mask(&p, mask.map(ty))?;
            if let Some(o) = other {
                let o = ty(*o);
                if o != p.with_elem(Elem::Num(d)) {
                    return Err(format!(
                        "load `other` must be {}, found {o}",
                        p.with_elem(Elem::Num(d))
                    ));
                }
            }
            one(p.with_elem(Elem::Num(d)))
        }
        Store { ptr, value, mask } => {
            let (p, v) = (ty(*ptr), ty(*value));
            let Some(d) = p.elem.pointee() else {
                return Err(format!("store needs a pointer, found {p}"));
            };
            if v != p.with_elem(Elem::Num(d)) {
                return Err(format!(
                    "stored value must be {}, found {v}",
                    p.with_elem(Elem::Num(d))
                ));
            }
            check_mask(&p, mask.map(ty))?;
            Ok(vec![])
        }
        LoadFresh { ptr, mask } => {
            let p = ty(*ptr);
            if p.elem != Elem::Ptr(DType::I32) {
                return Err(format!(
                    "load_fresh needs an i32 pointer to global memory, found {p}"
                ));
            }
            check_mask(&p, mask.map(ty))?;
            one(p.with_elem(Elem::Num(DType::I32)))
        }
        AtomicAdd { ptr, value, mask } => {
            let (p, v) = (ty(*ptr), ty(*value));
            let d = match p.elem.pointee() {
                Some(d @ (DType::F32 | DType::I32)) => d,
                _ => return Err(format!("atomic_add needs an f32 or i32 pointer, found {p}")),
            };
            if v != p.with_elem(Elem::Num(d)) {
                return Err(format!(
                    "added value must be {}, found {v}",
                    p.with_elem(Elem::Num(d))
                ));
            }
            check_mask(&p, mask.map(ty))?;
            Ok(vec![])
        }
        Arrive { counter } => {
            let c = ty(*counter);
            if c != Type::ptr(DType::I32) {
                return Err(format!("arrive needs a scalar i32 pointer, found {c}"));
            }
            one(Type::scalar(DType::I32))
        }
        Signal { counter } => {
            let c = ty(*counter);
            if c != Type::ptr(DType::I32) {
                return Err(format!("signal needs a scalar i32 pointer, found {c}"));
            }
            Ok(vec![])
        }
        AwaitCount { counter, target } => {
            let c = ty(*counter);
            if c != Type::ptr(DType::I32) {
                return Err(format!("await_count needs a scalar i32 pointer, found {c}"));
            }
            let t = ty(*target);
            if t != Type::scalar(DType::I32) {
                return Err(format!("await_count needs a scalar i32 target, found {t}"));
            }
            one(Type::scalar(DType::I32))
        }
        AsyncCopy { dst, src, mask } => {
            let (dt, st) = (ty(*dst), ty(*src));
            let Elem::SharedPtr(d) = dt.elem else {
                return Err(format!(
                    "async_copy writes shared memory: its destination must be shared pointers, \
                     found {dt}"
                ));
            };
            if st.elem != Elem::Ptr(d) {
                return Err(format!(
                    "async_copy reads global memory of the destination's type: its source must \
                     be {}, found {st}",
                    dt.with_elem(Elem::Ptr(d))
                ));
            }
            same_shape(&dt, &st, "async_copy destination and source")?;
            let row = st.shape.last().copied().unwrap_or(1) * d.size_bytes();
            if st.is_scalar() || !row.is_multiple_of(4) {
                return Err(format!(
                    "async_copy moves runs of 4, 8 or 16 bytes a thread: its blocks' rows must \
                     be a multiple of 4 bytes, found {st}"
                ));
            }
            check_mask(&st, mask.map(ty))?;
            Ok(vec![])
        }
        AsyncCommit => Ok(vec![]),
        AsyncWait { pending } => {
            if *pending > 7 {
                return Err(format!(
                    "async_wait takes 0 to 7 groups still pending, found {pending}"
                ));
            }
            Ok(vec![])
        }
        LoadTile {
            base,
            rows,
            cols,
            row_stride,
        } => {
            let bt = ty(*base);
            let (Elem::SharedPtr(d), true) = (bt.elem, bt.is_scalar()) else {
                return Err(format!(
                    "load_tile reads shared memory: its base must be a scalar shared pointer, \
                     found {bt}"
                ));
            };
            if *rows == 0 || *cols == 0 || row_stride < cols {
                return Err(format!(
                    "load_tile needs rows and columns, and a row stride of at least the \
                     columns: found {rows} x {cols} at stride {row_stride}"
                ));
            }
            one(Type::block(Elem::Num(d), &[*rows, *cols]))
        }
        Prefetch {
            ptr, mask, bytes, ..
        } => {
            let p = ty(*ptr);
            if !matches!(p.elem, Elem::Ptr(_)) {
                return Err(format!("prefetch needs a pointer, found {p}"));
            }
            if *bytes == 0 || *bytes > 4096 || bytes % 128 != 0 {
                return Err(format!(
                    "prefetch bytes must be a multiple of 128 up to 4096, found {bytes}"
                ));
            }
            check_mask(&p, mask.map(ty))?;
            Ok(vec![])
        }
        Reduce { op: _, value, axis } => {
            let t = ty(*value);
            let d = num(&t, "the operand")?;
            if d == DType::Bool {
                return Err(format!(
                    "cannot reduce bools ({t}); convert with `as i32` first (a sum then counts \
                     the true ones)"
                ));
            }
            match t.shape.len() {
                1 if *axis == 0 => one(Type::scalar(d)),
                2 if *axis <= 1 => one(Type::block(t.elem, &[t.shape[1 - *axis as usize]])),
                _ => Err(format!("cannot reduce {t} along axis {axis}")),
            }
        }
        MultiReduce { ops, values } => {
            if ops.len() != values.len() || values.len() < 2 {
                return Err(format!(
                    "{} reductions of {} values: one each, at least two",
                    ops.len(),
                    values.len()
                ));
            }
            let first = ty(values[0]);
            let mut out = vec![];
            for v in values {
                let t = ty(*v);
                same_shape(&first, &t, "fused reductions")?;
                let d = num(&t, "the operand")?;
                if d == DType::Bool || t.shape.len() != 1 {
                    return Err(format!("fused reductions take 1-D numbers, found {t}"));
                }
                out.push(Type::scalar(d));
            }
            Ok(out)
        }
        Scan { value } => {
            let t = ty(*value);
            let d = num(&t, "the operand")?;
            if t.shape.len() != 1 || !matches!(d, DType::I32 | DType::F32) {
                return Err(format!("cumsum takes a 1-D i32 or f32 block, found {t}"));
            }
            one(t)
        }
        For {
            lo,
            hi,
            step,
            init,
            body,
        } => {
            for (name, v) in [("lo", lo), ("hi", hi), ("step", step)] {
                let t = ty(*v);
                if t != Type::scalar(DType::I32) {
                    return Err(format!(
                        "loop bound `{name}` must be a scalar i32, found {t}"
                    ));
                }
            }
            if body.args.len() != init.len() + 1 {
                return Err(
                    "loop body must take the induction variable and each carried value".into(),
                );
            }
            if ty(body.args[0]) != Type::scalar(DType::I32) {
                return Err("loop induction variable must be i32".into());
            }
            let mut out = vec![];
            for (i, (v, a)) in init.iter().zip(&body.args[1..]).enumerate() {
                if ty(*v) != ty(*a) {
                    return Err(format!(
                        "carried value {i}: initial {} but body takes {}",
                        ty(*v),
                        ty(*a)
                    ));
                }
                out.push(ty(*v));
            }
            check_yield(body, &out, &ty)?;
            Ok(out)
        }
        If {
            cond,
            then_region,
            else_region,
        } => {
            if ty(*cond) != Type::scalar(DType::Bool) {
                return Err(format!(
                    "an `if` condition must be a scalar bool (for a block, choose elementwise \
                     with `where_(mask, a, b)`), found {}",
                    ty(*cond)
                ));
            }
            let tys = yield_types(then_region, &ty)?;
            check_yield(else_region, &tys, &ty)?;
            Ok(tys)
        }
        Yield { .. } => Ok(vec![]),
    }
}

fn check_shape(shape: &[usize]) -> Result<(), String> {
    if shape.is_empty() || shape.len() > 2 {
        return Err(format!("blocks have 1 or 2 dimensions, found {shape:?}"));
    }
    if shape.iter().any(|d| !d.is_power_of_two()) {
        return Err(format!(
            "block dimensions must be powers of two, found {shape:?}"
        ));
    }
    if shape.iter().product::<usize>() > MAX_BLOCK_ELEMENTS {
        return Err(format!(
            "block {shape:?} exceeds {MAX_BLOCK_ELEMENTS} elements"
        ));
    }
    Ok(())
}

fn yield_types(r: &Region, ty: &dyn Fn(ValueId) -> Type) -> Result<Vec<Type>, String> {
    match r.ops.last().map(|o| &o.kind) {
        Some(OpKind::Yield { values }) => Ok(values.iter().map(|v| ty(*v)).collect()),
        _ => Err("region must end with yield".into()),
    }
}

fn check_yield(r: &Region, want: &[Type], ty: &dyn Fn(ValueId) -> Type) -> Result<(), String> {
    let got = yield_types(r, ty)?;
    if got != want {
        return Err(format!(
            "region yields ({}) but ({}) expected",
            list(&got),
            list(want)
        ));
    }
    Ok(())
}

/// Types as a comma-separated list.
fn list(types: &[Type]) -> String {
    types
        .iter()
        .map(|t| t.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Checks types, SSA scoping (each value defined once, before use, in an enclosing region)
/// and the kernel's launch shape.
pub fn verify(k: &Kernel) -> Result<(), CompileError> {
    let err = |op: &str, loc: &Loc, msg: String| CompileError::Verify {
        kernel: k.name.clone(),
        op: op.to_string(),
        loc: format_loc(loc),
        msg,
    };
    if !(1..=32).contains(&k.num_warps) || !k.num_warps.is_power_of_two() {
        return Err(err(
            "kernel",
            &Loc::default(),
            format!("num_warps {} must be a power of two in 1..=32", k.num_warps),
        ));
    }
    if !(4..=64).contains(&k.vector_bytes) || !k.vector_bytes.is_power_of_two() {
        return Err(err(
            "kernel",
            &Loc::default(),
            format!(
                "vector_bytes {} must be a power of two in 4..=64",
                k.vector_bytes
            ),
        ));
    }
    let mut defined: HashSet<ValueId> = HashSet::new();
    for p in &k.params {
        if !p.ty.is_scalar() || matches!(p.ty.elem, Elem::SharedPtr(_)) {
            return Err(err(
                "param",
                &Loc::default(),
                format!(
                    "parameter `{}` must be a scalar or a global pointer, found {}",
                    p.name, p.ty
                ),
            ));
        }
        if !defined.insert(p.value) {
            return Err(err(
                "param",
                &Loc::default(),
                format!("parameter `{}` defined twice", p.name),
            ));
        }
    }
    let ty = |v: ValueId| {
        k.types
            .get(v.0 as usize)
            .cloned()
            .unwrap_or(Type::scalar(DType::I32))
    };
    let mut scope: Vec<ValueId> = defined.iter().copied().collect();
    verify_region(k, &k.body, &mut scope, &mut defined, &ty, &err, true)
}

type ErrFn<'a> = dyn Fn(&str, &Loc, String) -> CompileError + 'a;

fn verify_region(
    k: &Kernel,
    r: &Region,
    scope: &mut Vec<ValueId>,
    defined: &mut HashSet<ValueId>,
    ty: &dyn Fn(ValueId) -> Type,
    err: &ErrFn,
    top: bool,
) -> Result<(), CompileError> {
    let mark = scope.len();
    for a in &r.args {
        if !defined.insert(*a) {
            return Err(err(
                "region",
                &Loc::default(),
                format!("value %{} defined twice", a.0),
            ));
        }
        scope.push(*a);
    }
    for (i, op) in r.ops.iter().enumerate() {
        let name = op.kind.name();
        for v in op.kind.operands() {
            if v.0 as usize >= k.types.len() || !scope.contains(&v) {
                return Err(err(
                    name,
                    &op.loc,
                    format!("uses %{} before it is defined", v.0),
                ));
            }
        }
        if matches!(op.kind, OpKind::Yield { .. }) && (top || i + 1 != r.ops.len()) {
            return Err(err(
                name,
                &op.loc,
                "yield must be the last op of a loop body or an if arm".into(),
            ));
        }
        for sub in op.kind.regions() {
            verify_region(k, sub, scope, defined, ty, err, false)?;
        }
        let want = result_types(&op.kind, ty).map_err(|m| err(name, &op.loc, m))?;
        let got: Vec<Type> = op.results.iter().map(|v| ty(*v)).collect();
        if want != got {
            return Err(err(
                name,
                &op.loc,
                format!(
                    "result types ({}) but the op gives ({})",
                    list(&got),
                    list(&want)
                ),
            ));
        }
        for v in &op.results {
            if !defined.insert(*v) {
                return Err(err(name, &op.loc, format!("value %{} defined twice", v.0)));
            }
            scope.push(*v);
        }
    }
    scope.truncate(mark);
    Ok(())
}

/// `file:line:column`, or empty when the op has no location.
pub(crate) fn format_loc(loc: &Loc) -> String {
    loc.to_string()
}

/// A memory op's optional `mask`: bools of its pointer's shape.
fn check_mask(p: &Type, mask: Option<Type>) -> Result<(), String> {
    let want = p.with_elem(Elem::Num(DType::Bool));
    match mask {
        Some(m) if m != want => Err(format!(
            "a mask must be a bool block of the pointer's shape ({want}, e.g. `offs < n`), \
             found {m}"
        )),
        _ => Ok(()),
    }
}

/// How kernels write a binary op.
fn bin_symbol(op: BinOp) -> &'static str {
    match op {
        BinOp::Add => "+",
        BinOp::Sub => "-",
        BinOp::Mul => "*",
        BinOp::Div => "/",
        BinOp::Rem => "%",
        BinOp::Min => "minimum",
        BinOp::Max => "maximum",
        BinOp::And => "&",
        BinOp::Or => "|",
        BinOp::Xor => "^",
        BinOp::Shl => "<<",
        BinOp::Shr => ">>",
    }
}

/// How kernels write a unary op.
fn un_symbol(op: UnOp) -> &'static str {
    match op {
        UnOp::Neg => "-",
        UnOp::Not => "!",
        UnOp::Abs => "abs",
        UnOp::Exp2 => "exp2",
        UnOp::Log2 => "log2",
        UnOp::Sqrt => "sqrt",
        UnOp::Rsqrt => "rsqrt",
    }
}
