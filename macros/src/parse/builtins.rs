//! The builtin functions and methods: their names, how many arguments they take, how
//! errors spell their usage, and their reference documentation.
//!
//! This table is the one source of the builtins: the parser reads the names and argument
//! counts from it, error messages quote its usages, and the "Builtins reference" section of
//! `docs/kernel-language.md` is rendered from its signatures and descriptions (a test in
//! this crate fails when the doc differs; `DUSK_BLESS=1 cargo test -p dusk-macros`
//! rewrites it).

use super::ast::Builtin;

/// How a builtin is called, and what it does.
pub struct Spec {
    pub func: Builtin,
    pub name: &'static str,
    pub min_args: usize,
    pub max_args: usize,
    /// Whether it takes a turbofish element type (`ptr_cast::<i32>(p)`).
    pub takes_type: bool,
    /// Its usage, for error messages.
    pub usage: &'static str,
    /// Its typed signature, for the reference (notation in [`NOTATION`]).
    #[cfg_attr(not(test), allow(dead_code))]
    pub signature: &'static str,
    /// The method form (`x.sum(axis)`), when it may be called as a method on its first
    /// argument.
    pub method: Option<&'static str>,
    /// What it does, in one line.
    #[cfg_attr(not(test), allow(dead_code))]
    pub doc: &'static str,
}

/// The notation of [`Spec::signature`], for the reference.
#[cfg_attr(not(test), allow(dead_code))]
pub const NOTATION: &str = "In the signatures, `T[S]` is a value of element type `T` and \
shape `S`: a scalar when `S` is empty, else a block of one or two dimensions (a scalar mixed \
with a block is repeated to the block's shape). `T` is any element type (`f16`, `bf16`, \
`f32`, `i32`, `i64`, `u8`, `bool`), `Num` a number type (not `bool`), `F` a float type \
(`f16`, `bf16`, `f32`), `H` `f16` or `bf16`. `Ptr<T>` points into global or shared \
memory. `const` is a compile-time integer: a literal, a constant generic, an `#[unroll]` \
loop's variable or arithmetic on them (`const bool`: a compile-time bool). Arguments in \
`[..]` may be left out.";

pub const BUILTINS: &[Spec] = &[
    Spec {
        func: Builtin::ProgramId,
        name: "program_id",
        min_args: 1,
        max_args: 1,
        takes_type: false,
        usage: "program_id(axis)",
        signature: "program_id(axis: const) -> i32",
        method: None,
        doc: "This program's index in the grid along `axis` (0, 1 or 2).",
    },
    Spec {
        func: Builtin::NumPrograms,
        name: "num_programs",
        min_args: 1,
        max_args: 1,
        takes_type: false,
        usage: "num_programs(axis)",
        signature: "num_programs(axis: const) -> i32",
        method: None,
        doc: "How many programs the grid has along `axis` (0, 1 or 2).",
    },
    Spec {
        func: Builtin::Arange,
        name: "arange",
        min_args: 2,
        max_args: 2,
        takes_type: false,
        usage: "arange(start, end)",
        signature: "arange(start: const, end: const) -> i32[end - start]",
        method: None,
        doc: "The block `[start, start + 1, ..., end - 1]`; its length must be a power of two.",
    },
    Spec {
        func: Builtin::Load,
        name: "load",
        min_args: 1,
        max_args: 3,
        takes_type: false,
        usage: "load(ptr), load(ptr, mask) or load(ptr, mask, other)",
        signature: "load(ptr: Ptr<T>[S] [, mask: bool[S] [, other: T[S]]]) -> T[S]",
        method: None,
        doc: "Reads the element at each pointer; where `mask` is false nothing is read and \
              the element is `other` (0 when not given).",
    },
    Spec {
        func: Builtin::Store,
        name: "store",
        min_args: 2,
        max_args: 3,
        takes_type: false,
        usage: "store(ptr, value) or store(ptr, value, mask)",
        signature: "store(ptr: Ptr<T>[S], value: T[S] [, mask: bool[S]])",
        method: None,
        doc: "Writes each element of `value` at its pointer, where `mask` holds (everywhere \
              without one).",
    },
    Spec {
        func: Builtin::Where,
        name: "where_",
        min_args: 3,
        max_args: 3,
        takes_type: false,
        usage: "where_(cond, a, b)",
        signature: "where_(cond: bool[S], a: T[S], b: T[S]) -> T[S]",
        method: None,
        doc: "Elementwise choice: `a` where `cond` holds, `b` elsewhere.",
    },
    Spec {
        func: Builtin::Exp2,
        name: "exp2",
        min_args: 1,
        max_args: 1,
        takes_type: false,
        usage: "exp2(x)",
        signature: "exp2(x: F[S]) -> F[S]",
        method: Some("x.exp2()"),
        doc: "2 to the power `x`, elementwise.",
    },
    Spec {
        func: Builtin::Log2,
        name: "log2",
        min_args: 1,
        max_args: 1,
        takes_type: false,
        usage: "log2(x)",
        signature: "log2(x: F[S]) -> F[S]",
        method: Some("x.log2()"),
        doc: "The base-2 logarithm of `x`, elementwise.",
    },
    Spec {
        func: Builtin::Exp,
        name: "exp",
        min_args: 1,
        max_args: 1,
        takes_type: false,
        usage: "exp(x)",
        signature: "exp(x: F[S]) -> F[S]",
        method: Some("x.exp()"),
        doc: "e to the power `x`, elementwise (computed as `exp2(x * log2(e))`).",
    },
    Spec {
        func: Builtin::Log,
        name: "log",
        min_args: 1,
        max_args: 1,
        takes_type: false,
        usage: "log(x)",
        signature: "log(x: F[S]) -> F[S]",
        method: Some("x.log()"),
        doc: "The natural logarithm of `x`, elementwise (computed as `log2(x) * ln(2)`).",
    },
    Spec {
        func: Builtin::Sqrt,
        name: "sqrt",
        min_args: 1,
        max_args: 1,
        takes_type: false,
        usage: "sqrt(x)",
        signature: "sqrt(x: F[S]) -> F[S]",
        method: Some("x.sqrt()"),
        doc: "The square root of `x`, elementwise.",
    },
    Spec {
        func: Builtin::Rsqrt,
        name: "rsqrt",
        min_args: 1,
        max_args: 1,
        takes_type: false,
        usage: "rsqrt(x)",
        signature: "rsqrt(x: F[S]) -> F[S]",
        method: Some("x.rsqrt()"),
        doc: "`1 / sqrt(x)`, elementwise.",
    },
    Spec {
        func: Builtin::Abs,
        name: "abs",
        min_args: 1,
        max_args: 1,
        takes_type: false,
        usage: "abs(x)",
        signature: "abs(x: Num[S]) -> Num[S]",
        method: Some("x.abs()"),
        doc: "The absolute value of `x`, elementwise.",
    },
    Spec {
        func: Builtin::Minimum,
        name: "minimum",
        min_args: 2,
        max_args: 2,
        takes_type: false,
        usage: "minimum(a, b)",
        signature: "minimum(a: Num[S], b: Num[S]) -> Num[S]",
        method: Some("a.minimum(b)"),
        doc: "The smaller of `a` and `b`, elementwise (`min` is the reduction).",
    },
    Spec {
        func: Builtin::Maximum,
        name: "maximum",
        min_args: 2,
        max_args: 2,
        takes_type: false,
        usage: "maximum(a, b)",
        signature: "maximum(a: Num[S], b: Num[S]) -> Num[S]",
        method: Some("a.maximum(b)"),
        doc: "The larger of `a` and `b`, elementwise (`max` is the reduction).",
    },
    Spec {
        func: Builtin::Sum,
        name: "sum",
        min_args: 2,
        max_args: 2,
        takes_type: false,
        usage: "sum(x, axis)",
        signature: "sum(x: Num[S], axis: const) -> Num[S without axis]",
        method: Some("x.sum(axis)"),
        doc: "The sum of `x` along `axis`: a 1-D block (axis 0) to a scalar, a 2-D block to \
              a 1-D one.",
    },
    Spec {
        func: Builtin::Max,
        name: "max",
        min_args: 2,
        max_args: 2,
        takes_type: false,
        usage: "max(x, axis) (for the elementwise maximum use maximum(a, b))",
        signature: "max(x: Num[S], axis: const) -> Num[S without axis]",
        method: Some("x.max(axis)"),
        doc: "The largest element of `x` along `axis`, as `sum` reduces (`maximum` is \
              elementwise).",
    },
    Spec {
        func: Builtin::Min,
        name: "min",
        min_args: 2,
        max_args: 2,
        takes_type: false,
        usage: "min(x, axis) (for the elementwise minimum use minimum(a, b))",
        signature: "min(x: Num[S], axis: const) -> Num[S without axis]",
        method: Some("x.min(axis)"),
        doc: "The smallest element of `x` along `axis`, as `sum` reduces (`minimum` is \
              elementwise).",
    },
    Spec {
        func: Builtin::Expand,
        name: "expand",
        min_args: 3,
        max_args: 3,
        takes_type: false,
        usage: "expand(x, axis, size)",
        signature: "expand(x: T[n], axis: const, size: const) -> T[size, n] or T[n, size]",
        method: Some("x.expand(axis, size)"),
        doc: "A 1-D block repeated `size` times along a new axis: `[size, n]` for axis 0, \
              `[n, size]` for axis 1.",
    },
    Spec {
        func: Builtin::Splat,
        name: "splat",
        min_args: 2,
        max_args: 2,
        takes_type: false,
        usage: "splat(x, [d0, d1])",
        signature: "splat(x: T, [d0: const, d1: const]) -> T[d0, d1]",
        method: None,
        doc: "A block of shape `[d0]` or `[d0, d1]` with every element `x` (a number \
              literal is an `i32` or an `f32`).",
    },
    Spec {
        func: Builtin::Zeros,
        name: "zeros",
        min_args: 1,
        max_args: 1,
        takes_type: true,
        usage: "zeros::<T>([d0, d1])",
        signature: "zeros::<T>([d0: const, d1: const]) -> T[d0, d1]",
        method: None,
        doc: "A block of shape `[d0]` or `[d0, d1]` of zeros of type `T`.",
    },
    Spec {
        func: Builtin::PtrCast,
        name: "ptr_cast",
        min_args: 1,
        max_args: 1,
        takes_type: true,
        usage: "ptr_cast::<T>(ptr)",
        signature: "ptr_cast::<U>(ptr: Ptr<T>[S]) -> Ptr<U>[S]",
        method: None,
        doc: "The same addresses, viewed as pointing to `U` elements (in the same memory, \
              global or shared).",
    },
    Spec {
        func: Builtin::Dp2a,
        name: "dp2a",
        min_args: 4,
        max_args: 4,
        takes_type: false,
        usage: "dp2a(pairs, bytes, acc, high) with `high` a bool literal",
        signature: "dp2a(pairs: i32[S], bytes: i32[S], acc: i32[S], high: const bool) -> i32[S]",
        method: None,
        doc: "`acc` plus the dot product of the two signed 16-bit halves of `pairs` with two \
              unsigned bytes of `bytes` (bytes 0 and 1, or 2 and 3 when `high`).",
    },
    Spec {
        func: Builtin::DotInt4,
        name: "dot_int4",
        min_args: 2,
        max_args: 2,
        takes_type: false,
        usage: "dot_int4(codes, q)",
        signature: "dot_int4(codes: i32[M, W], q: f16[8, 8W]) -> f32[M, 8]",
        method: None,
        doc: "`codes . q^T` on the tensor cores, each i32 of `codes` eight unsigned 4-bit \
              values (element `8w + m` at bits `4m`); products exact, sums in f32 (M at \
              least 16, 8W at least 64).",
    },
    Spec {
        func: Builtin::Dot,
        name: "dot",
        min_args: 2,
        max_args: 3,
        takes_type: false,
        usage: "dot(a, b) or dot(a, b, acc)",
        signature: "dot(a: H[M, K], b: H[N, K] [, acc: f32[M, N]]) -> f32[M, N]",
        method: None,
        doc: "`acc + a . b^T` on the tensor cores, sums in f32 (M 8 or 16, N 8, K a multiple \
              of 64).",
    },
    Spec {
        func: Builtin::DotTa,
        name: "dot_ta",
        min_args: 2,
        max_args: 3,
        takes_type: false,
        usage: "dot_ta(a, b) or dot_ta(a, b, acc)",
        signature: "dot_ta(a: H[K, M], b: H[N, K] [, acc: f32[M, N]]) -> f32[M, N]",
        method: None,
        doc: "`acc + a^T . b^T` on the tensor cores, sums in f32 (K 8, N 8, M a multiple of \
              32).",
    },
    Spec {
        func: Builtin::Shared,
        name: "shared",
        min_args: 1,
        max_args: 1,
        takes_type: true,
        usage: "shared::<T>(len) with `len` a compile-time integer",
        signature: "shared::<Num>(len: const) -> Ptr<Num>",
        method: None,
        doc: "`len` elements of the program's own shared memory (undefined until stored \
              to; 48 KiB in all a kernel).",
    },
    Spec {
        func: Builtin::AtomicAdd,
        name: "atomic_add",
        min_args: 2,
        max_args: 3,
        takes_type: false,
        usage: "atomic_add(ptr, value) or atomic_add(ptr, value, mask)",
        signature: "atomic_add(ptr: Ptr<T>[S], value: T[S] [, mask: bool[S]])",
        method: None,
        doc: "Adds each element of `value` to the element its pointer points to, atomically, \
              where `mask` holds (`T` f32 or i32; lanes pointing to one element all add).",
    },
    Spec {
        func: Builtin::Cumsum,
        name: "cumsum",
        min_args: 1,
        max_args: 1,
        takes_type: false,
        usage: "cumsum(x)",
        signature: "cumsum(x: T[n]) -> T[n]",
        method: None,
        doc: "The inclusive running sum of a 1-D i32 or f32 block: element `i` is \
              `x[0] + ... + x[i]`.",
    },
    Spec {
        func: Builtin::Barrier,
        name: "barrier",
        min_args: 0,
        max_args: 0,
        takes_type: false,
        usage: "barrier()",
        signature: "barrier()",
        method: None,
        doc: "Waits for every thread of the program, their memory writes then visible to \
              each other.",
    },
    Spec {
        func: Builtin::Arrive,
        name: "arrive",
        min_args: 1,
        max_args: 1,
        takes_type: false,
        usage: "arrive(counter) with `counter` a scalar `Ptr<i32>` into global memory",
        signature: "arrive(counter: Ptr<i32>) -> i32",
        method: None,
        doc: "Adds 1 to `*counter` once for the program, after every thread's earlier \
              stores, and gives every thread the count before its add: the program that \
              finds `n - 1` of `n` may load what the other `n - 1` stored before arriving (the \
              last of a row's pieces combines them in the same launch; it sets the counter \
              back to 0 for the next).",
    },
    Spec {
        func: Builtin::Signal,
        name: "signal",
        min_args: 1,
        max_args: 1,
        takes_type: false,
        usage: "signal(counter) with `counter` a scalar `Ptr<i32>` into global memory",
        signature: "signal(counter: Ptr<i32>)",
        method: None,
        doc: "Adds 1 to `*counter` once for the program, after every thread's earlier \
              stores, without waiting for the add: a program whose `await_count` sees the \
              add may load what this one stored before it.",
    },
    Spec {
        func: Builtin::AwaitCount,
        name: "await_count",
        min_args: 2,
        max_args: 2,
        takes_type: false,
        usage: "await_count(counter, target) with `counter` a scalar `Ptr<i32>` into global \
                memory and `target` an i32",
        signature: "await_count(counter: Ptr<i32>, target: i32) -> i32",
        method: None,
        doc: "Waits a bounded while (about 128 polls) for `*counter` to reach `target` \
              (`count - target`, wrapping, not negative) and gives every thread the last \
              count read; where it reached the target, the stores made before those \
              `signal`s and `arrive`s are visible to this program's loads. Wait only on \
              programs that start before this one (a lower linear index), and check the \
              count returned: past the bound nothing is promised.",
    },
    Spec {
        func: Builtin::LoadFresh,
        name: "load_fresh",
        min_args: 1,
        max_args: 2,
        takes_type: false,
        usage: "load_fresh(ptr) or load_fresh(ptr, mask) with `ptr` pointing to i32 words",
        signature: "load_fresh(ptr: Ptr<i32>[S] [, mask: bool[S]]) -> i32[S]",
        method: None,
        doc: "Reads i32 words from L2, never from a stale L1 line (0 where `mask` is \
              false): words other programs of the launch publish with `atomic_add`.",
    },
    Spec {
        func: Builtin::GlobalTimer,
        name: "global_timer",
        min_args: 0,
        max_args: 0,
        takes_type: false,
        usage: "global_timer()",
        signature: "global_timer() -> i64",
        method: None,
        doc: "The GPU's clock in nanoseconds, one clock for every SM, read where it stands: \
              for timelines of a kernel's programs (the host's clock on the interpreter).",
    },
    Spec {
        func: Builtin::SmId,
        name: "sm_id",
        min_args: 0,
        max_args: 0,
        takes_type: false,
        usage: "sm_id()",
        signature: "sm_id() -> i32",
        method: None,
        doc: "The multiprocessor running the program (0 on the interpreter).",
    },
    Spec {
        func: Builtin::Sleep,
        name: "sleep",
        min_args: 1,
        max_args: 1,
        takes_type: false,
        usage: "sleep(ns) with `ns` a compile-time integer",
        signature: "sleep(ns: const)",
        method: None,
        doc: "Pauses the thread for about `ns` nanoseconds (up to twice as long; nothing on \
              the interpreter): the backoff of a loop waiting on other programs.",
    },
    Spec {
        func: Builtin::PrefetchL2,
        name: "prefetch_l2",
        min_args: 2,
        max_args: 3,
        takes_type: false,
        usage: "prefetch_l2(ptr, bytes) or prefetch_l2(ptr, bytes, mask) with `bytes` a \
                compile-time integer",
        signature: "prefetch_l2(ptr: Ptr<T>[S], bytes: const [, mask: bool[S]])",
        method: None,
        doc: "Brings the `bytes` bytes (a multiple of 128, up to 4096) at each pointer into L2 \
              where `mask` holds, holding no registers, so that a later load of them waits on \
              L2 rather than DRAM; the bytes must lie inside their buffer.",
    },
    Spec {
        func: Builtin::Bitcast,
        name: "bitcast",
        min_args: 1,
        max_args: 1,
        takes_type: true,
        usage: "bitcast::<T>(x) (f32 to i32 or i32 to f32)",
        signature: "bitcast::<U>(x: T[S]) -> U[S]",
        method: None,
        doc: "The bits of an f32 read as an i32, or of an i32 as an f32.",
    },
];

/// The conversions, which are not builtins but belong in their reference: (form,
/// signature, what it does).
#[cfg_attr(not(test), allow(dead_code))]
pub const CONVERSIONS: &[(&str, &str, &str)] = &[
    (
        "x as U",
        "(x: T[S]) as U -> U[S]",
        "Converts each element to type `U` (a float to an integer rounds toward zero; to \
         `bool`, nonzero is true); a compile-time number becomes a constant of type `U`.",
    ),
    (
        "x.to::<U>()",
        "x.to::<U>() -> U[S]",
        "The same conversion as `x as U`, written as a method.",
    ),
];

pub fn lookup(name: &str) -> Option<&'static Spec> {
    BUILTINS.iter().find(|s| s.name == name)
}

/// The builtin called by method sugar `x.name(..)` (`sum(x, ..)`), if there is one.
/// `to::<T>()` is handled apart (a cast).
pub fn method(name: &str) -> Option<&'static Spec> {
    lookup(name).filter(|s| s.method.is_some())
}

/// The list of supported methods, for error messages.
pub fn methods_list() -> String {
    let mut m: Vec<String> = BUILTINS
        .iter()
        .filter(|s| s.method.is_some())
        .map(|s| format!("`.{}()`", s.name))
        .collect();
    m.push("`.to::<T>()`".into());
    m.join(", ")
}

/// The "Builtins reference" section of `docs/kernel-language.md`, as rendered from the
/// table (what goes between the markers).
#[cfg(test)]
pub fn render_reference() -> String {
    let mut out = String::new();
    out.push_str(NOTATION);
    out.push_str("\n\n| builtin | signature | method form | what it does |\n|---|---|---|---|\n");
    let cell = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    for s in BUILTINS {
        let method = s.method.map(|m| format!("`{m}`")).unwrap_or_default();
        out.push_str(&format!(
            "| `{}` | `{}` | {} | {} |\n",
            s.name,
            s.signature,
            method,
            cell(s.doc)
        ));
    }
    out.push_str("\nConversions:\n\n| form | signature | what it does |\n|---|---|---|\n");
    for (form, sig, doc) in CONVERSIONS {
        out.push_str(&format!("| `{form}` | `{sig}` | {} |\n", cell(doc)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEGIN: &str = "<!-- builtins-reference:begin";
    const END: &str = "<!-- builtins-reference:end -->";

    fn guide_path() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/kernel-language.md")
    }

    /// The guide with its reference section replaced by `body`.
    fn with_section(doc: &str, body: &str) -> String {
        let start = doc
            .find(BEGIN)
            .expect("docs/kernel-language.md has a `<!-- builtins-reference:begin ... -->` marker");
        let start = start
            + doc[start..]
                .find("-->")
                .expect("the begin marker is closed")
            + 3;
        let end = doc[start..]
            .find(END)
            .map(|e| start + e)
            .expect("docs/kernel-language.md has a `<!-- builtins-reference:end -->` marker");
        format!("{}\n\n{}\n{}", &doc[..start], body, &doc[end..])
    }

    /// The guide's "Builtins reference" must be what the table renders. When it is stale,
    /// `DUSK_BLESS=1 cargo test -p dusk-macros` rewrites it.
    #[test]
    fn guide_builtins_reference_is_fresh() {
        let path = guide_path();
        let doc = std::fs::read_to_string(&path).unwrap();
        let want = with_section(&doc, &render_reference());
        if std::env::var_os("DUSK_BLESS").is_some() && want != doc {
            std::fs::write(&path, &want).unwrap();
            return;
        }
        assert!(
            want == doc,
            "the \"Builtins reference\" section of docs/kernel-language.md is stale: it differs \
             from what macros/src/parse/builtins.rs renders; refresh it with \
             `DUSK_BLESS=1 cargo test -p dusk-macros`"
        );
    }

    #[test]
    fn every_builtin_is_documented_once() {
        let reference = render_reference();
        for s in BUILTINS {
            assert!(!s.doc.trim().is_empty(), "`{}` has no description", s.name);
            assert!(
                s.signature.starts_with(s.name),
                "`{}`'s signature starts with another name: {}",
                s.name,
                s.signature
            );
            if let Some(m) = s.method {
                assert!(
                    m.contains(&format!(".{}(", s.name)),
                    "`{}`'s method form calls another name: {m}",
                    s.name
                );
            }
            let row = format!("| `{}` |", s.name);
            assert_eq!(reference.matches(&row).count(), 1, "`{}`", s.name);
            assert_eq!(
                BUILTINS.iter().filter(|t| t.name == s.name).count(),
                1,
                "`{}` is in the table twice",
                s.name
            );
        }
    }
}
