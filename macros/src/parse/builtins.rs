//! The builtin functions and methods: their names, how many arguments they take, and how
//! errors spell their usage.

use super::ast::Builtin;

/// How a builtin is called.
pub struct Spec {
    pub func: Builtin,
    pub name: &'static str,
    pub min_args: usize,
    pub max_args: usize,
    /// Whether it takes a turbofish element type (`ptr_cast::<i32>(p)`).
    pub takes_type: bool,
    /// Its usage, for error messages.
    pub usage: &'static str,
}

const fn spec(
    func: Builtin,
    name: &'static str,
    min_args: usize,
    max_args: usize,
    takes_type: bool,
    usage: &'static str,
) -> Spec {
    Spec {
        func,
        name,
        min_args,
        max_args,
        takes_type,
        usage,
    }
}

pub const BUILTINS: &[Spec] = &[
    spec(
        Builtin::ProgramId,
        "program_id",
        1,
        1,
        false,
        "program_id(axis)",
    ),
    spec(
        Builtin::NumPrograms,
        "num_programs",
        1,
        1,
        false,
        "num_programs(axis)",
    ),
    spec(Builtin::Arange, "arange", 2, 2, false, "arange(start, end)"),
    spec(
        Builtin::Load,
        "load",
        1,
        3,
        false,
        "load(ptr), load(ptr, mask) or load(ptr, mask, other)",
    ),
    spec(
        Builtin::Store,
        "store",
        2,
        3,
        false,
        "store(ptr, value) or store(ptr, value, mask)",
    ),
    spec(Builtin::Where, "where_", 3, 3, false, "where_(cond, a, b)"),
    spec(Builtin::Exp2, "exp2", 1, 1, false, "exp2(x)"),
    spec(Builtin::Log2, "log2", 1, 1, false, "log2(x)"),
    spec(Builtin::Exp, "exp", 1, 1, false, "exp(x)"),
    spec(Builtin::Log, "log", 1, 1, false, "log(x)"),
    spec(Builtin::Sqrt, "sqrt", 1, 1, false, "sqrt(x)"),
    spec(Builtin::Rsqrt, "rsqrt", 1, 1, false, "rsqrt(x)"),
    spec(Builtin::Abs, "abs", 1, 1, false, "abs(x)"),
    spec(Builtin::Minimum, "minimum", 2, 2, false, "minimum(a, b)"),
    spec(Builtin::Maximum, "maximum", 2, 2, false, "maximum(a, b)"),
    spec(Builtin::Sum, "sum", 2, 2, false, "sum(x, axis)"),
    spec(
        Builtin::Max,
        "max",
        2,
        2,
        false,
        "max(x, axis) (for the elementwise maximum use maximum(a, b))",
    ),
    spec(
        Builtin::Min,
        "min",
        2,
        2,
        false,
        "min(x, axis) (for the elementwise minimum use minimum(a, b))",
    ),
    spec(
        Builtin::Expand,
        "expand",
        3,
        3,
        false,
        "expand(x, axis, size)",
    ),
    spec(Builtin::Splat, "splat", 2, 2, false, "splat(x, [d0, d1])"),
    spec(Builtin::Zeros, "zeros", 1, 1, true, "zeros::<T>([d0, d1])"),
    spec(
        Builtin::PtrCast,
        "ptr_cast",
        1,
        1,
        true,
        "ptr_cast::<T>(ptr)",
    ),
    spec(
        Builtin::Dp2a,
        "dp2a",
        4,
        4,
        false,
        "dp2a(pairs, bytes, acc, high) with `high` a bool literal",
    ),
    spec(
        Builtin::DotInt4,
        "dot_int4",
        2,
        2,
        false,
        "dot_int4(codes, q)",
    ),
    spec(
        Builtin::Dot,
        "dot",
        2,
        3,
        false,
        "dot(a, b) or dot(a, b, acc)",
    ),
    spec(
        Builtin::DotTa,
        "dot_ta",
        2,
        3,
        false,
        "dot_ta(a, b) or dot_ta(a, b, acc)",
    ),
    spec(
        Builtin::Shared,
        "shared",
        1,
        1,
        true,
        "shared::<T>(len) with `len` a compile-time integer",
    ),
    spec(
        Builtin::AtomicAdd,
        "atomic_add",
        2,
        3,
        false,
        "atomic_add(ptr, value) or atomic_add(ptr, value, mask)",
    ),
    spec(Builtin::Cumsum, "cumsum", 1, 1, false, "cumsum(x)"),
    spec(Builtin::Barrier, "barrier", 0, 0, false, "barrier()"),
    spec(
        Builtin::Bitcast,
        "bitcast",
        1,
        1,
        true,
        "bitcast::<T>(x) (f32 to i32 or i32 to f32)",
    ),
];

pub fn lookup(name: &str) -> Option<&'static Spec> {
    BUILTINS.iter().find(|s| s.name == name)
}

/// Method sugar: `x.sum(axis)` is `sum(x, axis)`. `to::<T>()` is handled apart (a cast).
pub const METHODS: &[&str] = &[
    "sum", "max", "min", "exp2", "log2", "exp", "log", "sqrt", "rsqrt", "abs", "expand", "minimum",
    "maximum",
];

/// The list of supported methods, for error messages.
pub fn methods_list() -> String {
    let mut m: Vec<String> = METHODS.iter().map(|m| format!("`.{m}()`")).collect();
    m.push("`.to::<T>()`".into());
    m.join(", ")
}
