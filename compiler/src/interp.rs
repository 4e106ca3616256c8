//! The CPU interpreter: runs a kernel's IR program by program. It is the reference the
//! GPU code is tested against, and the backend when no GPU is present.
//!
//! Semantics follow the code generator (LLVM/PTX): f16/bf16 arithmetic runs in f32 and
//! rounds to nearest even; f32 arithmetic is f32 (not f64); float min/max are
//! `minnum`/`maxnum`; integers wrap. What is undefined on the GPU (out-of-bounds accesses,
//! integer division by zero, over-wide shifts, a non-positive loop step) is a
//! [`InterpError::Fault`] here, never a panic.
//!
//! Values live in an environment indexed by [`ValueId`]; each holds a flat row-major vector
//! of one element type (a scalar is a vector of one). f16/bf16 values are held as the `f32`
//! they round to, which is exact.

use crate::ir::*;
use crate::verify::{format_loc, verify};
use crate::CompileError;
use half::{bf16, f16};
use std::collections::{HashMap, VecDeque};
use std::fmt::Display;
use std::ops::{BitAnd, BitOr, BitXor, Not};

/// A kernel argument, in the order of [`Kernel::params`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ArgValue {
    /// A pointer: `memory[buffer]`, starting `offset_bytes` in.
    Ptr {
        buffer: usize,
        offset_bytes: usize,
    },
    Bool(bool),
    U8(u8),
    I32(i32),
    I64(i64),
    /// An `f32` scalar; also accepted for `f16`/`bf16` parameters, rounded to nearest even.
    F32(f32),
}

impl ArgValue {
    fn describe(&self) -> String {
        match *self {
            ArgValue::Ptr {
                buffer,
                offset_bytes,
            } => {
                format!("a pointer to buffer {buffer} at byte {offset_bytes}")
            }
            ArgValue::Bool(v) => format!("bool {v}"),
            ArgValue::U8(v) => format!("u8 {v}"),
            ArgValue::I32(v) => format!("i32 {v}"),
            ArgValue::I64(v) => format!("i64 {v}"),
            ArgValue::F32(v) => format!("f32 {v}"),
        }
    }
}

/// What can go wrong while interpreting. Out-of-bounds accesses are errors, never UB.
/// `Debug` prints the same line as `Display`.
#[derive(thiserror::Error, Clone, PartialEq)]
pub enum InterpError {
    #[error("kernel {kernel}: argument {index} (`{name}`): expected {expected}, found {found}")]
    BadArgument {
        kernel: String,
        index: usize,
        name: String,
        expected: String,
        found: String,
    },
    #[error("kernel {kernel}: expected {expected} arguments, found {found}")]
    ArgumentCount {
        kernel: String,
        expected: usize,
        found: usize,
    },
    /// An op failed in one program (an access out of bounds, a division by zero).
    #[error("{}", crate::located(&format!("kernel {kernel}"), loc, &format!("{op} in program ({}, {}, {})", program[0], program[1], program[2]), msg))]
    Fault {
        kernel: String,
        op: String,
        /// `file:line:column` of the code that made the op; empty when unknown.
        loc: String,
        program: [u32; 3],
        msg: String,
    },
    /// The kernel failed verification (the interpreter checks it before running it).
    #[error(transparent)]
    Invalid(#[from] CompileError),
}

impl std::fmt::Debug for InterpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

/// Runs every program of `grid` (x fastest) over `memory`.
pub fn run(
    kernel: &Kernel,
    grid: [u32; 3],
    args: &[ArgValue],
    memory: &mut [&mut [u8]],
) -> Result<(), InterpError> {
    verify(kernel)?;
    let mut it = Interp {
        k: kernel,
        env: vec![None; kernel.types.len()],
        mem: Memory {
            global: memory,
            shared: vec![],
        },
        shared_slots: HashMap::new(),
        async_open: vec![],
        async_groups: VecDeque::new(),
        program: [0; 3],
        grid,
    };
    it.bind_args(args)?;
    for z in 0..grid[2] {
        for y in 0..grid[1] {
            for x in 0..grid[0] {
                it.program = [x, y, z];
                it.async_open.clear();
                it.async_groups.clear();
                it.region(&kernel.body)?;
            }
        }
    }
    Ok(())
}

// ---- values ----

/// A pointer: a buffer index and a byte offset into it (checked only when dereferenced).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Ptr {
    buf: usize,
    off: i64,
}

/// What pointers point into: the kernel's buffers (indices `0..global.len()`), then the
/// shared-memory blocks of the program running ([`OpKind::SharedAlloc`]).
struct Memory<'a, 'b> {
    global: &'a mut [&'b mut [u8]],
    shared: Vec<Vec<u8>>,
}

impl Memory<'_, '_> {
    fn buf(&self, i: usize) -> &[u8] {
        match i.checked_sub(self.global.len()) {
            None => &*self.global[i],
            Some(j) => &self.shared[j],
        }
    }
    fn buf_mut(&mut self, i: usize) -> &mut [u8] {
        match i.checked_sub(self.global.len()) {
            None => &mut *self.global[i],
            Some(j) => &mut self.shared[j],
        }
    }
}

/// The elements of a value, row-major.
#[derive(Clone, Debug, PartialEq)]
enum Data {
    Bool(Vec<bool>),
    U8(Vec<u8>),
    I32(Vec<i32>),
    I64(Vec<i64>),
    /// F16, BF16 and F32 values; f16/bf16 ones hold exactly the f32 they round to.
    F(Vec<f32>),
    Ptr(Vec<Ptr>),
}

/// Applies `$e` (with the vector bound to `$v`) to whichever variant `$d` is, keeping it.
macro_rules! same_variant {
    ($d:expr, $v:ident => $e:expr) => {
        match $d {
            Data::Bool($v) => Data::Bool($e),
            Data::U8($v) => Data::U8($e),
            Data::I32($v) => Data::I32($e),
            Data::I64($v) => Data::I64($e),
            Data::F($v) => Data::F($e),
            Data::Ptr($v) => Data::Ptr($e),
        }
    };
}

impl Data {
    fn bools(&self) -> &[bool] {
        match self {
            Data::Bool(v) => v,
            _ => unreachable!("verified: expected i1 values"),
        }
    }
    fn ptrs(&self) -> &[Ptr] {
        match self {
            Data::Ptr(v) => v,
            _ => unreachable!("verified: expected pointers"),
        }
    }
    fn scalar_i32(&self) -> i32 {
        match self {
            Data::I32(v) => v[0],
            _ => unreachable!("verified: expected an i32"),
        }
    }
}

fn dtype_of(t: &Type) -> DType {
    t.elem.dtype().expect("verified: a number")
}

fn round_to(d: DType, x: f32) -> f32 {
    match d {
        DType::F16 => f16::from_f32(x).to_f32(),
        DType::BF16 => bf16::from_f32(x).to_f32(),
        _ => x,
    }
}

fn round_in_place(d: DType, v: &mut [f32]) {
    match d {
        DType::F16 => v.iter_mut().for_each(|x| *x = f16::from_f32(*x).to_f32()),
        DType::BF16 => v.iter_mut().for_each(|x| *x = bf16::from_f32(*x).to_f32()),
        _ => {}
    }
}

fn map<T: Copy, U>(a: &[T], f: impl Fn(T) -> U) -> Vec<U> {
    a.iter().map(|&x| f(x)).collect()
}

fn zip<T: Copy, U>(a: &[T], b: &[T], f: impl Fn(T, T) -> U) -> Vec<U> {
    a.iter().zip(b).map(|(&x, &y)| f(x, y)).collect()
}

/// The integer element types, with LLVM's wrapping semantics.
trait Int:
    Copy
    + Ord
    + Display
    + Default
    + BitAnd<Output = Self>
    + BitOr<Output = Self>
    + BitXor<Output = Self>
    + Not<Output = Self>
{
    const BITS: u32;
    const MIN: Self;
    const MAX: Self;
    fn wadd(self, o: Self) -> Self;
    fn wsub(self, o: Self) -> Self;
    fn wmul(self, o: Self) -> Self;
    fn wdiv(self, o: Self) -> Self;
    fn wrem(self, o: Self) -> Self;
    fn wneg(self) -> Self;
    fn wabs(self) -> Self;
    /// The shift amount as the hardware reads it: the bits as an unsigned number.
    fn shift_amount(self) -> u64;
    fn shl(self, n: u32) -> Self;
    /// Logical for unsigned types, arithmetic for signed ones.
    fn shr(self, n: u32) -> Self;
    fn is_zero(self) -> bool;
    /// Sign-extended for signed types, zero-extended for unsigned ones.
    fn to_i64(self) -> i64;
    /// Truncating.
    fn from_i64(x: i64) -> Self;
    /// Rounds to nearest.
    fn to_f32(self) -> f32;
    /// Truncates toward zero and saturates; NaN is zero.
    fn from_f32(x: f32) -> Self;
}

macro_rules! impl_int {
    ($t:ty, $u:ty, $abs:expr) => {
        impl Int for $t {
            const BITS: u32 = <$t>::BITS;
            const MIN: Self = <$t>::MIN;
            const MAX: Self = <$t>::MAX;
            fn wadd(self, o: Self) -> Self {
                self.wrapping_add(o)
            }
            fn wsub(self, o: Self) -> Self {
                self.wrapping_sub(o)
            }
            fn wmul(self, o: Self) -> Self {
                self.wrapping_mul(o)
            }
            fn wdiv(self, o: Self) -> Self {
                self.wrapping_div(o)
            }
            fn wrem(self, o: Self) -> Self {
                self.wrapping_rem(o)
            }
            fn wneg(self) -> Self {
                self.wrapping_neg()
            }
            fn wabs(self) -> Self {
                let f: fn($t) -> $t = $abs;
                f(self)
            }
            fn shift_amount(self) -> u64 {
                self as $u as u64
            }
            fn shl(self, n: u32) -> Self {
                self << n
            }
            fn shr(self, n: u32) -> Self {
                self >> n
            }
            fn is_zero(self) -> bool {
                self == 0
            }
            fn to_i64(self) -> i64 {
                self as i64
            }
            fn from_i64(x: i64) -> Self {
                x as $t
            }
            fn to_f32(self) -> f32 {
                self as f32
            }
            fn from_f32(x: f32) -> Self {
                x as $t
            }
        }
    };
}
impl_int!(u8, u8, |x| x);
impl_int!(i32, u32, |x| x.wrapping_abs());
impl_int!(i64, u64, |x| x.wrapping_abs());

// ---- elementwise ops ----

fn int_binary<T: Int>(op: BinOp, a: &[T], b: &[T]) -> Result<Vec<T>, String> {
    Ok(match op {
        BinOp::Add => zip(a, b, T::wadd),
        BinOp::Sub => zip(a, b, T::wsub),
        BinOp::Mul => zip(a, b, T::wmul),
        BinOp::Div | BinOp::Rem => {
            if let Some(i) = b.iter().position(|x| x.is_zero()) {
                let what = if op == BinOp::Div {
                    "division"
                } else {
                    "remainder"
                };
                return Err(format!("integer {what} by zero (element {i})"));
            }
            if op == BinOp::Div {
                zip(a, b, T::wdiv)
            } else {
                zip(a, b, T::wrem)
            }
        }
        BinOp::Min => zip(a, b, Ord::min),
        BinOp::Max => zip(a, b, Ord::max),
        BinOp::And => zip(a, b, |x, y| x & y),
        BinOp::Or => zip(a, b, |x, y| x | y),
        BinOp::Xor => zip(a, b, |x, y| x ^ y),
        BinOp::Shl | BinOp::Shr => {
            if let Some(i) = b.iter().position(|x| x.shift_amount() >= T::BITS as u64) {
                return Err(format!(
                    "shift amount {} out of range for a {}-bit integer (element {i})",
                    b[i],
                    T::BITS
                ));
            }
            if op == BinOp::Shl {
                zip(a, b, |x, y| x.shl(y.shift_amount() as u32))
            } else {
                zip(a, b, |x, y| x.shr(y.shift_amount() as u32))
            }
        }
    })
}

fn binary(op: BinOp, d: DType, a: &Data, b: &Data) -> Result<Data, String> {
    Ok(match (a, b) {
        (Data::Bool(a), Data::Bool(b)) => Data::Bool(match op {
            BinOp::And => zip(a, b, |x, y| x & y),
            BinOp::Or => zip(a, b, |x, y| x | y),
            BinOp::Xor => zip(a, b, |x, y| x ^ y),
            _ => return Err(format!("{op:?} is not defined on i1")),
        }),
        (Data::U8(a), Data::U8(b)) => Data::U8(int_binary(op, a, b)?),
        (Data::I32(a), Data::I32(b)) => Data::I32(int_binary(op, a, b)?),
        (Data::I64(a), Data::I64(b)) => Data::I64(int_binary(op, a, b)?),
        (Data::F(a), Data::F(b)) => {
            let mut v = match op {
                BinOp::Add => zip(a, b, |x, y| x + y),
                BinOp::Sub => zip(a, b, |x, y| x - y),
                BinOp::Mul => zip(a, b, |x, y| x * y),
                BinOp::Div => zip(a, b, |x, y| x / y),
                BinOp::Min => zip(a, b, f32::min),
                BinOp::Max => zip(a, b, f32::max),
                _ => return Err(format!("{op:?} is not defined on floats")),
            };
            round_in_place(d, &mut v);
            Data::F(v)
        }
        _ => return Err("operands of different types".into()),
    })
}

fn cmp_vec<T: Copy + PartialOrd>(op: CmpOp, a: &[T], b: &[T]) -> Vec<bool> {
    match op {
        CmpOp::Eq => zip(a, b, |x, y| x == y),
        CmpOp::Ne => zip(a, b, |x, y| x != y),
        CmpOp::Lt => zip(a, b, |x, y| x < y),
        CmpOp::Le => zip(a, b, |x, y| x <= y),
        CmpOp::Gt => zip(a, b, |x, y| x > y),
        CmpOp::Ge => zip(a, b, |x, y| x >= y),
    }
}

fn compare(op: CmpOp, a: &Data, b: &Data) -> Result<Data, String> {
    Ok(Data::Bool(match (a, b) {
        (Data::Bool(a), Data::Bool(b)) => cmp_vec(op, a, b),
        (Data::U8(a), Data::U8(b)) => cmp_vec(op, a, b),
        (Data::I32(a), Data::I32(b)) => cmp_vec(op, a, b),
        (Data::I64(a), Data::I64(b)) => cmp_vec(op, a, b),
        (Data::F(a), Data::F(b)) => cmp_vec(op, a, b),
        _ => return Err("cannot compare these operands".into()),
    }))
}

fn int_unary<T: Int>(op: UnOp, a: &[T]) -> Result<Vec<T>, String> {
    Ok(match op {
        UnOp::Neg => map(a, T::wneg),
        UnOp::Not => map(a, |x| !x),
        UnOp::Abs => map(a, T::wabs),
        _ => return Err(format!("{op:?} is not defined on integers")),
    })
}

fn unary(op: UnOp, d: DType, a: &Data) -> Result<Data, String> {
    Ok(match a {
        Data::Bool(a) => Data::Bool(match op {
            UnOp::Not => map(a, |x| !x),
            // One-bit negation and (unsigned) absolute value are the identity.
            UnOp::Neg | UnOp::Abs => a.clone(),
            _ => return Err(format!("{op:?} is not defined on i1")),
        }),
        Data::U8(a) => Data::U8(int_unary(op, a)?),
        Data::I32(a) => Data::I32(int_unary(op, a)?),
        Data::I64(a) => Data::I64(int_unary(op, a)?),
        Data::F(a) => {
            let mut v = match op {
                UnOp::Neg => map(a, |x| -x),
                UnOp::Abs => map(a, f32::abs),
                UnOp::Exp2 => map(a, f32::exp2),
                UnOp::Log2 => map(a, f32::log2),
                UnOp::Sqrt => map(a, f32::sqrt),
                UnOp::Rsqrt => map(a, |x| 1.0 / x.sqrt()),
                UnOp::Not => return Err("not is not defined on floats".into()),
            };
            round_in_place(d, &mut v);
            Data::F(v)
        }
        Data::Ptr(_) => return Err(format!("{op:?} is not defined on pointers")),
    })
}

fn cast_int<T: Int>(a: &Data) -> Vec<T> {
    match a {
        Data::Bool(v) => map(v, |x| T::from_i64(x as i64)),
        Data::U8(v) => map(v, |x| T::from_i64(x.to_i64())),
        Data::I32(v) => map(v, |x| T::from_i64(x.to_i64())),
        Data::I64(v) => map(v, T::from_i64),
        Data::F(v) => map(v, T::from_f32),
        Data::Ptr(_) => unreachable!("verified: casts take numbers"),
    }
}

/// Numeric conversion. Int to f16/bf16 goes through f32, as the code generator does.
fn cast(a: &Data, to: DType) -> Data {
    match to {
        DType::Bool => Data::Bool(match a {
            Data::Bool(v) => v.clone(),
            Data::U8(v) => map(v, |x| x != 0),
            Data::I32(v) => map(v, |x| x != 0),
            Data::I64(v) => map(v, |x| x != 0),
            Data::F(v) => map(v, |x| x != 0.0),
            Data::Ptr(_) => unreachable!("verified: casts take numbers"),
        }),
        DType::U8 => Data::U8(cast_int(a)),
        DType::I32 => Data::I32(cast_int(a)),
        DType::I64 => Data::I64(cast_int(a)),
        DType::F16 | DType::BF16 | DType::F32 => {
            let mut v = match a {
                Data::Bool(v) => map(v, |x| x as u8 as f32),
                Data::U8(v) => map(v, Int::to_f32),
                Data::I32(v) => map(v, Int::to_f32),
                Data::I64(v) => map(v, Int::to_f32),
                Data::F(v) => v.clone(),
                Data::Ptr(_) => unreachable!("verified: casts take numbers"),
            };
            round_in_place(to, &mut v);
            Data::F(v)
        }
    }
}

fn constant(c: Const, d: DType) -> Data {
    match (c, d) {
        (Const::Bool(b), _) => Data::Bool(vec![b]),
        (Const::Int(i), DType::U8) => Data::U8(vec![i as u8]),
        (Const::Int(i), DType::I32) => Data::I32(vec![i as i32]),
        (Const::Int(i), DType::I64) => Data::I64(vec![i]),
        // Straight from f64 to the type, rounding once, as LLVM folds a constant.
        (Const::Float(f), DType::F16) => Data::F(vec![f16::from_f64(f).to_f32()]),
        (Const::Float(f), DType::BF16) => Data::F(vec![bf16::from_f64(f).to_f32()]),
        (Const::Float(f), _) => Data::F(vec![f as f32]),
        _ => unreachable!("verified: constant {c:?} of type {}", d.name()),
    }
}

fn select_vec<T: Copy>(c: &[bool], a: &[T], b: &[T]) -> Vec<T> {
    if c.len() == 1 && a.len() != 1 {
        if c[0] {
            a.to_vec()
        } else {
            b.to_vec()
        }
    } else {
        c.iter()
            .zip(a.iter().zip(b))
            .map(|(&c, (&x, &y))| if c { x } else { y })
            .collect()
    }
}

fn select(c: &[bool], a: &Data, b: &Data) -> Result<Data, String> {
    Ok(match (a, b) {
        (Data::Bool(a), Data::Bool(b)) => Data::Bool(select_vec(c, a, b)),
        (Data::U8(a), Data::U8(b)) => Data::U8(select_vec(c, a, b)),
        (Data::I32(a), Data::I32(b)) => Data::I32(select_vec(c, a, b)),
        (Data::I64(a), Data::I64(b)) => Data::I64(select_vec(c, a, b)),
        (Data::F(a), Data::F(b)) => Data::F(select_vec(c, a, b)),
        (Data::Ptr(a), Data::Ptr(b)) => Data::Ptr(select_vec(c, a, b)),
        _ => return Err("select arms of different types".into()),
    })
}

fn expand_vec<T: Copy>(v: &[T], axis: u8, size: usize) -> Vec<T> {
    let mut out = Vec::with_capacity(v.len() * size);
    if axis == 0 {
        for _ in 0..size {
            out.extend_from_slice(v);
        }
    } else {
        for &x in v {
            out.resize(out.len() + size, x);
        }
    }
    out
}

// ---- reductions ----

/// Folds `x` (of `shape`) along `axis` with `f` from `init`, in index order; `fin` turns
/// each accumulator into the result element.
fn fold_axis<T: Copy, A: Copy>(
    x: &[T],
    shape: &[usize],
    axis: u8,
    init: A,
    f: impl Fn(A, T) -> A,
    fin: impl Fn(A) -> T,
) -> Vec<T> {
    match (shape.len(), axis) {
        (1, _) => vec![fin(x.iter().fold(init, |a, &v| f(a, v)))],
        (_, 0) => {
            let cols = shape[1];
            let mut acc = vec![init; cols];
            for row in x.chunks_exact(cols) {
                for (a, &v) in acc.iter_mut().zip(row) {
                    *a = f(*a, v);
                }
            }
            acc.into_iter().map(fin).collect()
        }
        _ => x
            .chunks_exact(shape[1])
            .map(|row| fin(row.iter().fold(init, |a, &v| f(a, v))))
            .collect(),
    }
}

fn int_reduce<T: Int>(op: ReduceOp, x: &[T], shape: &[usize], axis: u8) -> Vec<T> {
    match op {
        ReduceOp::Sum => fold_axis(x, shape, axis, T::default(), T::wadd, |a| a),
        ReduceOp::Max => fold_axis(x, shape, axis, T::MIN, Ord::max, |a| a),
        ReduceOp::Min => fold_axis(x, shape, axis, T::MAX, Ord::min, |a| a),
    }
}

fn reduce(op: ReduceOp, d: DType, x: &Data, shape: &[usize], axis: u8) -> Result<Data, String> {
    Ok(match x {
        Data::U8(v) => Data::U8(int_reduce(op, v, shape, axis)),
        Data::I32(v) => Data::I32(int_reduce(op, v, shape, axis)),
        Data::I64(v) => Data::I64(int_reduce(op, v, shape, axis)),
        // Floats accumulate in f32, starting from the identity as the GPU does (so a
        // max over NaNs only is -inf), and round to the type at the end.
        Data::F(v) => Data::F(match op {
            ReduceOp::Sum => fold_axis(v, shape, axis, 0.0f32, |a, b| a + b, |a| round_to(d, a)),
            ReduceOp::Max => fold_axis(v, shape, axis, f32::NEG_INFINITY, f32::max, |a| a),
            ReduceOp::Min => fold_axis(v, shape, axis, f32::INFINITY, f32::min, |a| a),
        }),
        _ => return Err("reductions take numbers other than i1".into()),
    })
}

// ---- memory ----

/// The byte offset of `p` if `size` bytes there lie inside its buffer.
fn in_bounds(mem: &Memory, p: Ptr, size: usize, what: &str, i: usize) -> Result<usize, String> {
    let len = mem.buf(p.buf).len();
    if p.off < 0 || (p.off as u64).saturating_add(size as u64) > len as u64 {
        return Err(format!(
            "out-of-bounds {what} of {size} bytes at byte offset {} of buffer {} ({len} bytes long), element {i}",
            p.off, p.buf
        ));
    }
    Ok(p.off as usize)
}

fn load_typed<T: Copy + Default, const N: usize>(
    mem: &Memory,
    ptrs: &[Ptr],
    mask: Option<&[bool]>,
    other: Option<&[T]>,
    decode: impl Fn([u8; N]) -> T,
) -> Result<Vec<T>, String> {
    let mut out = Vec::with_capacity(ptrs.len());
    for (i, &p) in ptrs.iter().enumerate() {
        if !matches!(mask, Some(m) if !m[i]) {
            let off = in_bounds(mem, p, N, "load", i)?;
            let bytes: [u8; N] = mem.buf(p.buf)[off..off + N].try_into().expect("N bytes");
            out.push(decode(bytes));
        } else {
            out.push(other.map_or(T::default(), |o| o[i]));
        }
    }
    Ok(out)
}

fn load(
    d: DType,
    mem: &Memory,
    ptrs: &[Ptr],
    mask: Option<&[bool]>,
    other: Option<&Data>,
) -> Result<Data, String> {
    macro_rules! other {
        ($var:ident) => {
            match other {
                Some(Data::$var(o)) => Some(&o[..]),
                Some(_) => unreachable!("verified: `other` has the loaded type"),
                None => None,
            }
        };
    }
    Ok(match d {
        DType::Bool => Data::Bool(load_typed(mem, ptrs, mask, other!(Bool), |b: [u8; 1]| {
            b[0] != 0
        })?),
        DType::U8 => Data::U8(load_typed(mem, ptrs, mask, other!(U8), |b: [u8; 1]| b[0])?),
        DType::I32 => Data::I32(load_typed(
            mem,
            ptrs,
            mask,
            other!(I32),
            i32::from_le_bytes,
        )?),
        DType::I64 => Data::I64(load_typed(
            mem,
            ptrs,
            mask,
            other!(I64),
            i64::from_le_bytes,
        )?),
        DType::F32 => Data::F(load_typed(mem, ptrs, mask, other!(F), f32::from_le_bytes)?),
        DType::F16 => Data::F(load_typed(mem, ptrs, mask, other!(F), |b| {
            f16::from_le_bytes(b).to_f32()
        })?),
        DType::BF16 => Data::F(load_typed(mem, ptrs, mask, other!(F), |b| {
            bf16::from_le_bytes(b).to_f32()
        })?),
    })
}

/// Writes every active element in row-major order (later duplicates win), after checking
/// all of them: a faulting store writes nothing.
fn store_typed<T: Copy, const N: usize>(
    mem: &mut Memory,
    ptrs: &[Ptr],
    mask: Option<&[bool]>,
    vals: &[T],
    encode: impl Fn(T) -> [u8; N],
) -> Result<(), String> {
    let active = |i: usize| !matches!(mask, Some(m) if !m[i]);
    for (i, &p) in ptrs.iter().enumerate() {
        if active(i) {
            in_bounds(mem, p, N, "store", i)?;
        }
    }
    for (i, (&p, &v)) in ptrs.iter().zip(vals).enumerate() {
        if active(i) {
            let off = p.off as usize;
            mem.buf_mut(p.buf)[off..off + N].copy_from_slice(&encode(v));
        }
    }
    Ok(())
}

fn store(
    mem: &mut Memory,
    d: DType,
    ptrs: &[Ptr],
    mask: Option<&[bool]>,
    v: &Data,
) -> Result<(), String> {
    match (d, v) {
        (DType::Bool, Data::Bool(v)) => store_typed(mem, ptrs, mask, v, |x| [x as u8]),
        (DType::U8, Data::U8(v)) => store_typed(mem, ptrs, mask, v, |x| [x]),
        (DType::I32, Data::I32(v)) => store_typed(mem, ptrs, mask, v, i32::to_le_bytes),
        (DType::I64, Data::I64(v)) => store_typed(mem, ptrs, mask, v, i64::to_le_bytes),
        (DType::F32, Data::F(v)) => store_typed(mem, ptrs, mask, v, f32::to_le_bytes),
        (DType::F16, Data::F(v)) => {
            store_typed(mem, ptrs, mask, v, |x| f16::from_f32(x).to_le_bytes())
        }
        (DType::BF16, Data::F(v)) => {
            store_typed(mem, ptrs, mask, v, |x| bf16::from_f32(x).to_le_bytes())
        }
        _ => Err(format!(
            "stored value does not match the pointee type {}",
            d.name()
        )),
    }
}

// ---- the interpreter ----

struct Interp<'k, 'a, 'b> {
    k: &'k Kernel,
    /// The current value of each [`ValueId`]; `None` until defined.
    env: Vec<Option<Data>>,
    mem: Memory<'a, 'b>,
    /// The shared-memory block of each [`OpKind::SharedAlloc`] op (by its result), as an
    /// index into `mem.shared`.
    shared_slots: HashMap<ValueId, usize>,
    /// The program's [`OpKind::AsyncCopy`]s not yet committed, then its committed groups,
    /// oldest first: each copy read its source when issued and writes its destination only
    /// when an [`OpKind::AsyncWait`] waits for its group, so that a kernel reading a stage
    /// before waiting for it reads what was there before (and fails its tests) here too.
    async_open: Vec<PendingCopy>,
    async_groups: VecDeque<Vec<PendingCopy>>,
    program: [u32; 3],
    grid: [u32; 3],
}

/// An issued [`OpKind::AsyncCopy`]: its destination's element type and pointers, and the
/// values it read.
struct PendingCopy {
    dtype: DType,
    dst: Vec<Ptr>,
    data: Data,
}

fn get(env: &[Option<Data>], v: ValueId) -> &Data {
    env[v.0 as usize]
        .as_ref()
        .expect("verified: values are defined before use")
}

impl<'k> Interp<'k, '_, '_> {
    /// Adds 1 to the i32 at the scalar pointer `counter`; returns the count before. Programs
    /// run one after another here: each sees every earlier one's add.
    fn add_one(&mut self, counter: ValueId) -> Result<Data, String> {
        let p = get(&self.env, counter).ptrs()[0];
        let Data::I32(old) = load(DType::I32, &self.mem, &[p], None, None)? else {
            unreachable!("an i32 load")
        };
        let new = Data::I32(vec![old[0].wrapping_add(1)]);
        store(&mut self.mem, DType::I32, &[p], None, &new)?;
        Ok(Data::I32(old))
    }

    fn set(&mut self, v: ValueId, d: Data) {
        self.env[v.0 as usize] = Some(d);
    }

    fn fault(&self, op: &Op, msg: String) -> InterpError {
        InterpError::Fault {
            kernel: self.k.name.clone(),
            op: op.kind.name().to_string(),
            loc: format_loc(&op.loc),
            program: self.program,
            msg,
        }
    }

    fn bind_args(&mut self, args: &[ArgValue]) -> Result<(), InterpError> {
        let k = self.k;
        if args.len() != k.params.len() {
            return Err(InterpError::ArgumentCount {
                kernel: k.name.clone(),
                expected: k.params.len(),
                found: args.len(),
            });
        }
        for (index, (p, a)) in k.params.iter().zip(args).enumerate() {
            let bad = |expected: String| InterpError::BadArgument {
                kernel: k.name.clone(),
                index,
                name: p.name.clone(),
                expected,
                found: a.describe(),
            };
            let ty = k.ty(p.value);
            let data = match (ty.elem, *a) {
                (
                    Elem::Ptr(_),
                    ArgValue::Ptr {
                        buffer,
                        offset_bytes,
                    },
                ) => {
                    if buffer >= self.mem.global.len() {
                        return Err(bad(format!(
                            "{ty} into one of the {} buffers",
                            self.mem.global.len()
                        )));
                    }
                    Data::Ptr(vec![Ptr {
                        buf: buffer,
                        off: offset_bytes as i64,
                    }])
                }
                (Elem::Num(DType::Bool), ArgValue::Bool(v)) => Data::Bool(vec![v]),
                (Elem::Num(DType::U8), ArgValue::U8(v)) => Data::U8(vec![v]),
                (Elem::Num(DType::I32), ArgValue::I32(v)) => Data::I32(vec![v]),
                (Elem::Num(DType::I64), ArgValue::I64(v)) => Data::I64(vec![v]),
                (Elem::Num(d @ (DType::F16 | DType::BF16 | DType::F32)), ArgValue::F32(v)) => {
                    Data::F(vec![round_to(d, v)])
                }
                _ => return Err(bad(ty.to_string())),
            };
            self.set(p.value, data);
        }
        Ok(())
    }

    /// Runs the ops of `r`; returns the values its `Yield` names (none for the top level).
    fn region(&mut self, r: &'k Region) -> Result<&'k [ValueId], InterpError> {
        for op in &r.ops {
            match &op.kind {
                OpKind::Yield { values } => return Ok(values),
                OpKind::For {
                    lo,
                    hi,
                    step,
                    init,
                    body,
                } => {
                    let (lo, hi, step) = (
                        get(&self.env, *lo).scalar_i32(),
                        get(&self.env, *hi).scalar_i32(),
                        get(&self.env, *step).scalar_i32(),
                    );
                    if step <= 0 {
                        return Err(self.fault(op, format!("loop step {step} must be positive")));
                    }
                    let carried = &body.args[1..];
                    for (a, v) in carried.iter().zip(init) {
                        let d = get(&self.env, *v).clone();
                        self.set(*a, d);
                    }
                    // In i64, so a bound near i32::MAX cannot wrap the induction variable.
                    let mut i = lo as i64;
                    while i < hi as i64 {
                        self.set(body.args[0], Data::I32(vec![i as i32]));
                        let ys = self.region(body)?;
                        let next: Vec<Data> =
                            ys.iter().map(|y| get(&self.env, *y).clone()).collect();
                        for (a, d) in carried.iter().zip(next) {
                            self.set(*a, d);
                        }
                        i += step as i64;
                    }
                    for (r, a) in op.results.iter().zip(carried) {
                        let d = get(&self.env, *a).clone();
                        self.set(*r, d);
                    }
                }
                OpKind::If {
                    cond,
                    then_region,
                    else_region,
                } => {
                    let c = get(&self.env, *cond).bools()[0];
                    let ys = self.region(if c { then_region } else { else_region })?;
                    let vals: Vec<Data> = ys.iter().map(|y| get(&self.env, *y).clone()).collect();
                    for (r, d) in op.results.iter().zip(vals) {
                        self.set(*r, d);
                    }
                }
                OpKind::MultiReduce { ops, values } => {
                    for ((r, rop), v) in op.results.iter().zip(ops).zip(values) {
                        let t = self.k.ty(*v);
                        let d = t.elem.dtype().expect("verified: numbers");
                        let x = reduce(*rop, d, get(&self.env, *v), &t.shape, 0)
                            .map_err(|m| self.fault(op, m))?;
                        self.set(*r, x);
                    }
                }
                _ => {
                    if let Some(d) = self.simple(op).map_err(|m| self.fault(op, m))? {
                        self.set(op.results[0], d);
                    }
                }
            }
        }
        Ok(&[])
    }

    /// Evaluates an op without regions; returns its result (none for a store).
    fn simple(&mut self, op: &Op) -> Result<Option<Data>, String> {
        use OpKind::*;
        let k = self.k;
        let env = &self.env;
        let g = |v: &ValueId| get(env, *v);
        let elem_ty = |v: &ValueId| dtype_of(k.ty(*v));
        Ok(Some(match &op.kind {
            // Programs run one launch at a time here, and each op for the whole program at
            // once: nothing to wait for or release.
            WaitPriorGrid | ReleaseDependents | Barrier | Sleep { .. } => return Ok(None),
            ProgramId { axis } => Data::I32(vec![self.program[*axis as usize] as i32]),
            GlobalTimer => {
                let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
                Data::I64(vec![now.map_or(0, |d| d.as_nanos() as i64)])
            }
            SmId => Data::I32(vec![0]),
            NumPrograms { axis } => Data::I32(vec![self.grid[*axis as usize] as i32]),
            Constant { value, dtype } => constant(*value, *dtype),
            Arange { start, end } => Data::I32((*start..*end).map(|x| x as i32).collect()),
            Splat { value, shape } => {
                let n: usize = shape.iter().product();
                same_variant!(g(value), v => vec![v[0]; n])
            }
            Expand { value, axis, size } => {
                same_variant!(g(value), v => expand_vec(v, *axis, *size))
            }
            Binary { op, lhs, rhs } => binary(*op, elem_ty(lhs), g(lhs), g(rhs))?,
            Cmp { op, lhs, rhs } => compare(*op, g(lhs), g(rhs))?,
            Unary { op, value } => unary(*op, elem_ty(value), g(value))?,
            Cast { value, to } => cast(g(value), *to),
            Bitcast { value, .. } => match g(value) {
                Data::F(v) => Data::I32(map(v, |x| x.to_bits() as i32)),
                Data::I32(v) => Data::F(map(v, |x| f32::from_bits(x as u32))),
                _ => unreachable!("verified: f32 or i32"),
            },
            Select {
                cond,
                on_true,
                on_false,
            } => select(g(cond).bools(), g(on_true), g(on_false))?,
            PtrCast { ptr, .. } => g(ptr).clone(),
            DotInt4 { codes, q } => {
                let (Data::I32(c), Data::F(qv)) = (g(codes), g(q)) else {
                    unreachable!("verified: i32 codes and f16 q")
                };
                let (m, w) = (k.ty(*codes).shape[0], k.ty(*codes).shape[1]);
                let kd = 8 * w;
                let mut out = vec![0f32; m * 8];
                for r in 0..m {
                    for n in 0..8 {
                        let mut acc = 0f32;
                        for d in 0..kd {
                            let code = (c[r * w + d / 8] as u32 >> (4 * (d % 8))) & 15;
                            acc += code as f32 * qv[n * kd + d];
                        }
                        out[r * 8 + n] = acc;
                    }
                }
                Data::F(out)
            }
            Dot { a, b, acc, trans_a } => {
                let (Data::F(av), Data::F(bv)) = (g(a), g(b)) else {
                    unreachable!("verified: f16 or bf16 operands")
                };
                let (sa, n) = (&k.ty(*a).shape, k.ty(*b).shape[0]);
                let (m, kd) = if *trans_a {
                    (sa[1], sa[0])
                } else {
                    (sa[0], sa[1])
                };
                let at = |r: usize, j: usize| {
                    if *trans_a {
                        av[j * m + r]
                    } else {
                        av[r * kd + j]
                    }
                };
                let mut out = match acc.map(|c| g(&c)) {
                    Some(Data::F(c)) => c.clone(),
                    _ => vec![0f32; m * n],
                };
                for r in 0..m {
                    for c in 0..n {
                        out[r * n + c] += (0..kd).map(|j| at(r, j) * bv[c * kd + j]).sum::<f32>();
                    }
                }
                Data::F(out)
            }
            Dp2a {
                pairs,
                bytes,
                acc,
                high,
            } => {
                let (Data::I32(p), Data::I32(b), Data::I32(a)) = (g(pairs), g(bytes), g(acc))
                else {
                    unreachable!("verified: i32 operands")
                };
                let shift = if *high { 16 } else { 0 };
                let v = (0..p.len())
                    .map(|i| {
                        let (lo, hi) = (p[i] as i16 as i32, (p[i] >> 16) as i16 as i32);
                        let b0 = (b[i] as u32 >> shift) & 0xFF;
                        let b1 = (b[i] as u32 >> (shift + 8)) & 0xFF;
                        a[i].wrapping_add(lo.wrapping_mul(b0 as i32))
                            .wrapping_add(hi.wrapping_mul(b1 as i32))
                    })
                    .collect();
                Data::I32(v)
            }
            AddPtr { ptr, offset } => {
                let Some(d) = k.ty(*ptr).elem.pointee() else {
                    unreachable!("verified: a pointer")
                };
                let size = d.size_bytes() as i64;
                let at = |p: Ptr, o: i64| Ptr {
                    buf: p.buf,
                    off: p.off.wrapping_add(o.wrapping_mul(size)),
                };
                let ptrs = g(ptr).ptrs();
                Data::Ptr(match g(offset) {
                    Data::I32(o) => ptrs.iter().zip(o).map(|(&p, &o)| at(p, o as i64)).collect(),
                    Data::I64(o) => ptrs.iter().zip(o).map(|(&p, &o)| at(p, o)).collect(),
                    _ => return Err("pointer offsets are i32 or i64".into()),
                })
            }
            Load {
                ptr, mask, other, ..
            } => {
                let Some(d) = k.ty(*ptr).elem.pointee() else {
                    unreachable!("verified: a pointer")
                };
                load(
                    d,
                    &self.mem,
                    g(ptr).ptrs(),
                    mask.as_ref().map(|m| g(m).bools()),
                    other.as_ref().map(g),
                )?
            }
            Store { ptr, value, mask } => {
                let Some(d) = k.ty(*ptr).elem.pointee() else {
                    unreachable!("verified: a pointer")
                };
                let mask = mask.as_ref().map(|m| get(&self.env, *m).bools());
                store(
                    &mut self.mem,
                    d,
                    get(&self.env, *ptr).ptrs(),
                    mask,
                    get(&self.env, *value),
                )?;
                return Ok(None);
            }
            // Programs run one after another here: every earlier one's words are there.
            LoadFresh { ptr, mask } => load(
                DType::I32,
                &self.mem,
                g(ptr).ptrs(),
                mask.as_ref().map(|m| g(m).bools()),
                None,
            )?,
            AtomicAdd { ptr, value, mask } => {
                // One lane after another: every lane's value lands, in lane order.
                let Some(d) = k.ty(*ptr).elem.pointee() else {
                    unreachable!("verified: a pointer")
                };
                let mask = mask.as_ref().map(|m| get(&self.env, *m).bools());
                let (ptrs, value) = (get(&self.env, *ptr).ptrs(), get(&self.env, *value));
                for (i, &p) in ptrs.iter().enumerate() {
                    if matches!(mask, Some(m) if !m[i]) {
                        continue;
                    }
                    let sum = match (load(d, &self.mem, &[p], None, None)?, value) {
                        (Data::F(old), Data::F(v)) => Data::F(vec![old[0] + v[i]]),
                        (Data::I32(old), Data::I32(v)) => {
                            Data::I32(vec![old[0].wrapping_add(v[i])])
                        }
                        _ => unreachable!("verified: f32 or i32"),
                    };
                    store(&mut self.mem, d, &[p], None, &sum)?;
                }
                return Ok(None);
            }
            Prefetch {
                ptr, mask, bytes, ..
            } => {
                // Nothing to do on the CPU but check that the bytes lie inside the buffer.
                let mask = mask.as_ref().map(|m| get(&self.env, *m).bools());
                for (i, &p) in get(&self.env, *ptr).ptrs().iter().enumerate() {
                    if !matches!(mask, Some(m) if !m[i]) {
                        in_bounds(&self.mem, p, *bytes as usize, "prefetch", i)?;
                    }
                }
                return Ok(None);
            }
            AsyncCopy { dst, src, mask } => {
                let Some(d) = k.ty(*src).elem.pointee() else {
                    unreachable!("verified: a pointer")
                };
                let mask = mask.as_ref().map(|m| g(m).bools());
                let data = load(d, &self.mem, g(src).ptrs(), mask, None)?;
                let dst = g(dst).ptrs().to_vec();
                self.async_open.push(PendingCopy {
                    dtype: d,
                    dst,
                    data,
                });
                return Ok(None);
            }
            AsyncCommit => {
                let group = std::mem::take(&mut self.async_open);
                self.async_groups.push_back(group);
                return Ok(None);
            }
            AsyncWait { pending } => {
                while self.async_groups.len() > *pending as usize {
                    let group = self.async_groups.pop_front().expect("a group");
                    for c in group {
                        store(&mut self.mem, c.dtype, &c.dst, None, &c.data)?;
                    }
                }
                return Ok(None);
            }
            LoadTile {
                base,
                rows,
                cols,
                row_stride,
            } => {
                let Some(d) = k.ty(*base).elem.pointee() else {
                    unreachable!("verified: a pointer")
                };
                let b = g(base).ptrs()[0];
                let size = d.size_bytes() as i64;
                let ptrs: Vec<Ptr> = (0..*rows)
                    .flat_map(|r| {
                        (0..*cols).map(move |c| Ptr {
                            buf: b.buf,
                            off: b.off + ((r * row_stride + c) as i64) * size,
                        })
                    })
                    .collect();
                load(d, &self.mem, &ptrs, None, None)?
            }
            SharedAlloc { dtype, len } => {
                // The program's own block, filled with 0xFF bytes (a NaN for floats) so that
                // loads of what it never stored show up in tests.
                let res = op.results[0];
                let next = self.mem.shared.len();
                let slot = *self.shared_slots.entry(res).or_insert(next);
                if slot == next {
                    self.mem.shared.push(vec![]);
                }
                self.mem.shared[slot] = vec![0xFF; len * dtype.size_bytes()];
                Data::Ptr(vec![Ptr {
                    buf: self.mem.global.len() + slot,
                    off: 0,
                }])
            }
            Arrive { counter } => self.add_one(*counter)?,
            Signal { counter } => {
                self.add_one(*counter)?;
                return Ok(None);
            }
            AwaitCount { counter, .. } => {
                // Kernels run one after another here: the count is final already.
                let p = get(&self.env, *counter).ptrs()[0];
                load(DType::I32, &self.mem, &[p], None, None)?
            }
            Reduce { op, value, axis } => {
                reduce(*op, elem_ty(value), g(value), &k.ty(*value).shape, *axis)?
            }
            Scan { value } => match g(value) {
                Data::I32(v) => Data::I32(
                    v.iter()
                        .scan(0i32, |a, &x| {
                            *a = a.wrapping_add(x);
                            Some(*a)
                        })
                        .collect(),
                ),
                Data::F(v) => Data::F(
                    v.iter()
                        .scan(0f32, |a, &x| {
                            *a += x;
                            Some(*a)
                        })
                        .collect(),
                ),
                _ => return Err("cumsum takes i32 or f32".into()),
            },
            MultiReduce { .. } => unreachable!("handled by `region`: several results"),
            For { .. } | If { .. } | Yield { .. } => unreachable!("handled by `region`"),
        }))
    }
}
