//! The tile IR: a kernel is one program of a grid, written over block tensors of constant
//! shape (Triton's model). Values are in SSA form; loops and branches own nested regions.
//!
//! Every later stage reads this module only: the verifier, the printer, the interpreter and
//! the NVPTX code generator.

use std::fmt;

/// Element types a value or a pointed-to buffer can have.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    Bool,
    U8,
    I32,
    I64,
    F16,
    BF16,
    F32,
}

impl DType {
    /// Size in bytes in memory (`Bool` is stored as one byte).
    pub fn size_bytes(self) -> usize {
        match self {
            DType::Bool | DType::U8 => 1,
            DType::F16 | DType::BF16 => 2,
            DType::I32 | DType::F32 => 4,
            DType::I64 => 8,
        }
    }
    pub fn is_float(self) -> bool {
        matches!(self, DType::F16 | DType::BF16 | DType::F32)
    }
    pub fn is_int(self) -> bool {
        matches!(self, DType::U8 | DType::I32 | DType::I64)
    }
    pub fn is_signed(self) -> bool {
        matches!(self, DType::I32 | DType::I64)
    }
    /// The kernel language's spelling, for messages: as [`DType::name`], but `bool`.
    pub fn lang_name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            d => d.name(),
        }
    }
    /// The IR's spelling (`i1` for `Bool`), as the printer and bundle manifests write it.
    pub fn name(self) -> &'static str {
        match self {
            DType::Bool => "i1",
            DType::U8 => "u8",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
        }
    }
}

/// The element of a value: a number, or a pointer to numbers in global memory or in the
/// program's shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Elem {
    Num(DType),
    Ptr(DType),
    /// Into a block of the program's shared memory ([`OpKind::SharedAlloc`]); kernel
    /// parameters are never shared pointers.
    SharedPtr(DType),
}

impl Elem {
    pub fn dtype(self) -> Option<DType> {
        match self {
            Elem::Num(d) => Some(d),
            Elem::Ptr(_) | Elem::SharedPtr(_) => None,
        }
    }
    /// The element type a pointer (global or shared) points to.
    pub fn pointee(self) -> Option<DType> {
        match self {
            Elem::Ptr(d) | Elem::SharedPtr(d) => Some(d),
            Elem::Num(_) => None,
        }
    }
}

/// A value's type: an element and a constant shape. An empty shape is a scalar, uniform
/// over the threads of a program; one or two dimensions make a block.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Type {
    pub elem: Elem,
    pub shape: Vec<usize>,
}

impl Type {
    pub fn scalar(d: DType) -> Type {
        Type {
            elem: Elem::Num(d),
            shape: vec![],
        }
    }
    pub fn ptr(d: DType) -> Type {
        Type {
            elem: Elem::Ptr(d),
            shape: vec![],
        }
    }
    pub fn block(elem: Elem, shape: &[usize]) -> Type {
        Type {
            elem,
            shape: shape.to_vec(),
        }
    }
    pub fn is_scalar(&self) -> bool {
        self.shape.is_empty()
    }
    pub fn num_elements(&self) -> usize {
        self.shape.iter().product()
    }
    pub fn with_elem(&self, elem: Elem) -> Type {
        Type {
            elem,
            shape: self.shape.clone(),
        }
    }
}

impl Type {
    /// The IR's spelling (`i1[64]`, `ptr<f16>`), as the printer and bundle manifests
    /// write it; `Display` spells the element types as kernels do (`bool[64]`).
    pub fn ir_name(&self) -> String {
        self.spell(DType::name)
    }

    fn spell(&self, name: fn(DType) -> &'static str) -> String {
        let e = match self.elem {
            Elem::Num(d) => name(d).to_string(),
            Elem::Ptr(d) => format!("ptr<{}>", name(d)),
            Elem::SharedPtr(d) => format!("shared_ptr<{}>", name(d)),
        };
        if self.shape.is_empty() {
            e
        } else {
            let dims: Vec<String> = self.shape.iter().map(|d| d.to_string()).collect();
            format!("{e}[{}]", dims.join("x"))
        }
    }
}

impl fmt::Display for Type {
    /// As kernels spell it, for messages: `f32[128]`, `bool[64]`, `ptr<f16>[8x64]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.spell(DType::lang_name))
    }
}

/// An SSA value: an index into [`Kernel::types`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ValueId(pub u32);

/// A compile-time constant.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Const {
    Bool(bool),
    Int(i64),
    Float(f64),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    /// Float division, or integer division rounding toward zero.
    Div,
    /// Integer remainder with the sign of the dividend.
    Rem,
    Min,
    Max,
    And,
    Or,
    Xor,
    Shl,
    /// Logical shift right for `u8`, arithmetic for signed integers.
    Shr,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnOp {
    Neg,
    /// Logical not on `Bool`, bitwise not on integers.
    Not,
    Abs,
    Exp2,
    Log2,
    Sqrt,
    Rsqrt,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Sum,
    Max,
    Min,
}

/// A nested block of ops. `args` are defined on entry: the induction variable and the
/// carried values of a loop body; none for the arms of an `If`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Region {
    pub args: Vec<ValueId>,
    pub ops: Vec<Op>,
}

/// Where an op came from, so errors can point at user source: the builder's caller, which
/// for a `#[kernel]` is the kernel's own source (the generated calls carry its spans).
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Loc {
    pub file: &'static str,
    pub line: u32,
    pub column: u32,
}

impl fmt::Display for Loc {
    /// `file:line:column`, as compilers print locations; empty when unknown.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.file.is_empty() {
            Ok(())
        } else {
            write!(f, "{}:{}:{}", self.file, self.line, self.column)
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Op {
    pub kind: OpKind,
    pub results: Vec<ValueId>,
    pub loc: Loc,
}

/// The cache an [`OpKind::Prefetch`] fills.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CacheLevel {
    /// The SM's own L1 (the program's later loads of the lines hit it).
    L1,
    /// The GPU's L2.
    L2,
}

impl CacheLevel {
    /// The level as PTX names it (`prefetch.global.L1`).
    pub fn ptx(self) -> &'static str {
        match self {
            CacheLevel::L1 => "L1",
            CacheLevel::L2 => "L2",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum OpKind {
    /// The program's index along grid axis 0, 1 or 2 (i32).
    ProgramId {
        axis: u8,
    },
    /// The grid's size along an axis (i32).
    NumPrograms {
        axis: u8,
    },
    Constant {
        value: Const,
        dtype: DType,
    },
    /// `[start, start + 1, ..., end - 1]` as an i32 block.
    Arange {
        start: i64,
        end: i64,
    },
    /// A scalar copied to every element of a block of `shape`.
    Splat {
        value: ValueId,
        shape: Vec<usize>,
    },
    /// A 1-D block of `n` elements to a 2-D block, repeating it `size` times along the new
    /// `axis` (0: `[size, n]`, every row a copy; 1: `[n, size]`, every column a copy).
    Expand {
        value: ValueId,
        axis: u8,
        size: usize,
    },
    Binary {
        op: BinOp,
        lhs: ValueId,
        rhs: ValueId,
    },
    Cmp {
        op: CmpOp,
        lhs: ValueId,
        rhs: ValueId,
    },
    Unary {
        op: UnOp,
        value: ValueId,
    },
    /// Numeric conversion: floats round to nearest even, float to int truncates toward
    /// zero, ints wrap.
    Cast {
        value: ValueId,
        to: DType,
    },
    /// The same bits read as another type of the same size (f32 and i32 only): a float's
    /// bits order like the float for non-negative values, so a search can bucket weights by
    /// their leading bits exactly.
    Bitcast {
        value: ValueId,
        to: DType,
    },
    Select {
        cond: ValueId,
        on_true: ValueId,
        on_false: ValueId,
    },
    /// The same address viewed as a pointer to `to` elements (offsets then count `to`s).
    PtrCast {
        ptr: ValueId,
        to: DType,
    },
    /// Two-way 16-bit by 8-bit integer dot product with accumulate (PTX `dp2a`):
    /// `acc + pairs.lo16 * bytes[2h] + pairs.hi16 * bytes[2h + 1]`, with the 16-bit halves of
    /// `pairs` signed, the bytes of `bytes` unsigned, and `h` 1 when `high`. All i32.
    Dp2a {
        pairs: ValueId,
        bytes: ValueId,
        acc: ValueId,
        high: bool,
    },
    /// `codes . q^T` on the tensor cores: `codes` is i32 `[M, W]`, each word eight unsigned
    /// 4-bit values (element `8w + m` at bits `4m`); `q` is f16 `[8, 8W]`; the result is f32
    /// `[M, 8]`, products exact and sums in f32. M must be a multiple of 16 per warp.
    DotInt4 {
        codes: ValueId,
        q: ValueId,
    },
    /// A product of f16 (or bf16) blocks on the tensor cores, sums in f32:
    /// `result[m][n] = acc[m][n] + sum_k A[m][k] * b[n][k]` where `A` is `a` (`[M, K]`),
    /// or `a` transposed when `trans_a` (`a` is then `[K, M]`); `b` is `[N, K]`, `acc`
    /// (zero when absent) and the result f32 `[M, N]`: the tensor cores add `acc` in the
    /// same instruction, so a running sum costs no registers beyond its own. Attention's two products in one warp: scores `q . K^T` (`a` = the queries
    /// of a GQA group, padded to 8 rows) and `V^T . P^T` (`a` = V, `trans_a`). Sizes the
    /// tensor-core code accepts: `trans_a` false: M 8 or 16, N 8, K a multiple of 64;
    /// `trans_a` true: K 8, N 8, M a multiple of 32. Products are exact, so the result
    /// differs from a sequential f32 sum only by the order of additions.
    Dot {
        a: ValueId,
        b: ValueId,
        acc: Option<ValueId>,
        trans_a: bool,
    },
    /// A pointer (or block of pointers) advanced by an element offset.
    AddPtr {
        ptr: ValueId,
        offset: ValueId,
    },
    /// Reads the pointed-to elements; where `mask` is false nothing is read and `other`
    /// (zero when absent) is the result. `streaming` (global memory only): data read once,
    /// so its lines are the first the caches evict (PTX `ld.global.cs`), keeping the lines
    /// other loads come back to (a decode step's metadata, partial results) cached while a
    /// stream many times the L2 passes through.
    Load {
        ptr: ValueId,
        mask: Option<ValueId>,
        other: Option<ValueId>,
        streaming: bool,
    },
    Store {
        ptr: ValueId,
        value: ValueId,
        mask: Option<ValueId>,
    },
    /// Reads i32 words of global memory from L2 (PTX `ld.relaxed.gpu`), never from a stale
    /// L1 line: words other programs of the same launch publish with [`OpKind::AtomicAdd`],
    /// read by a program waiting for them (a scan's look-back). 0 where `mask` is false.
    LoadFresh {
        ptr: ValueId,
        mask: Option<ValueId>,
    },
    /// Adds each value to its pointed-to element (f32 or i32) where `mask` holds, atomically:
    /// elements that several lanes point to get every lane's value, in some order (f32 sums
    /// then differ by rounding only). Into shared memory, as [`OpKind::Store`] it is ordered
    /// with the other threads' loads and stores around it: a histogram of a row is zeroed,
    /// added to by every thread, then read.
    AtomicAdd {
        ptr: ValueId,
        value: ValueId,
        mask: Option<ValueId>,
    },
    /// Asks for the `bytes` bytes at each pointed-to address (where `mask` holds) to be
    /// brought into the cache `level` (PTX `prefetch.global.L2` or `.L1`, one per 128-byte
    /// line), holding no registers and returning nothing: a later load of them then waits
    /// on that cache, not DRAM (L2) or L2 (L1). Gathers whose next addresses are known a
    /// step early use it to keep more bytes in flight than their registers hold; loops
    /// whose steps each wait on L2 fill L1 first. The addresses must lie inside their
    /// buffer.
    Prefetch {
        ptr: ValueId,
        mask: Option<ValueId>,
        bytes: u32,
        level: CacheLevel,
    },
    /// The GPU's clock in nanoseconds (i64, PTX `%globaltimer`, one clock for every SM),
    /// read where it stands in the program: for timelines of a kernel's programs (when
    /// each starts, waits and ends), which event timings of whole launches cannot give.
    /// The interpreter gives the host's clock.
    GlobalTimer,
    /// The index of the multiprocessor running the program (i32, PTX `%smid`; 0 on the
    /// interpreter): with [`OpKind::GlobalTimer`], which programs shared an SM.
    SmId,
    /// Waits until the kernel queued before this one on the stream has finished and its
    /// writes are visible (PTX `griddepcontrol.wait`, sm_90 and newer; nothing on older
    /// GPUs, where kernels never overlap). A kernel holding it is launched so that its
    /// programs may start while the previous kernel still runs (programmatic dependent
    /// launch): what comes before the wait (index arithmetic, loads of what earlier kernels
    /// wrote) overlaps that kernel's tail instead of following its end.
    WaitPriorGrid,
    /// Lets the kernel queued after this one start its programs now (PTX
    /// `griddepcontrol.launch_dependents`); they still wait for this kernel's end at their
    /// [`OpKind::WaitPriorGrid`].
    ReleaseDependents,
    /// Pauses the thread for about `ns` nanoseconds (PTX `nanosleep`, sm_70 and newer; the
    /// hardware may wake it earlier or later, up to twice as long): the backoff of a loop
    /// waiting on other programs, whose polls would otherwise take the issue slots of the
    /// programs sharing its SM. Nothing in the interpreter.
    Sleep {
        ns: u32,
    },
    /// Waits until every thread of the program has reached it, with their earlier memory
    /// accesses (global and shared) visible to all of them (PTX `bar.sync`): between a
    /// program's threads writing global memory and reading what other threads wrote there.
    /// Shared-memory stores need none (they carry their own). Scalar conditions are uniform,
    /// so every thread reaches it.
    Barrier,
    /// Counts the program's arrival at the i32 `counter` (a scalar pointer): once for the
    /// whole program, after every thread's earlier stores, it adds 1 and gives every thread
    /// the count before its add. Stores a program made before arriving are visible to the
    /// loads of any program after its arrival at the same counter (PTX `atom.acq_rel.gpu`,
    /// with barriers on both sides), so the program that finds `n - 1` knows the other
    /// `n - 1` are done and may read what they wrote: the last of a row's pieces merges them
    /// without another launch.
    Arrive {
        counter: ValueId,
    },
    /// Adds 1 to the i32 at `counter` (a scalar pointer) once for the whole program, after
    /// every thread's earlier stores, without waiting for the add (a barrier, then thread
    /// 0's `red.release.gpu`): stores a program made before it are visible to a program
    /// whose [`OpKind::AwaitCount`] saw its add. A split announces a written piece so.
    Signal {
        counter: ValueId,
    },
    /// Waits, a bounded while, for the i32 at `counter` (a scalar pointer) to reach
    /// `target` (a scalar i32: reached when `count - target`, wrapping, is not negative,
    /// so counts may run on across launches), and gives every thread the last count it
    /// read. Where the count reached `target` the stores made before those arrivals
    /// ([`OpKind::Signal`], [`OpKind::Arrive`]) are visible to the program's loads after it
    /// (thread 0 polls with `ld.relaxed.gpu`, then `fence.acq_rel.gpu`, and barriers carry
    /// the order to the other threads); where it did not (the bound ran out: about 128
    /// polls), nothing is promised and the program must wait some other way
    /// ([`OpKind::WaitPriorGrid`]). A merge waits so for the pieces of its own row instead
    /// of for the whole split before it. The interpreter runs kernels one after another, so
    /// it reads the final count at once.
    AwaitCount {
        counter: ValueId,
        target: ValueId,
    },
    /// Copies the pointed-to elements of global memory (`src`, a block of pointers) to
    /// shared memory (`dst`, shared pointers of the same shape) without passing through
    /// registers (PTX `cp.async`, sm_80 and newer): each thread copies its runs of 4, 8 or
    /// 16 contiguous bytes; where `mask` is false nothing is read and zeros are written.
    /// The copy is only issued here: it lands once an [`OpKind::AsyncWait`] has waited for
    /// the group [`OpKind::AsyncCommit`] put it in, so a program keeps several tiles in
    /// flight that hold no registers (K and V staged a few steps ahead). It is ordered
    /// after every thread's earlier accesses of shared memory (a barrier before it), so it
    /// may overwrite a stage the program has just read.
    AsyncCopy {
        dst: ValueId,
        src: ValueId,
        mask: Option<ValueId>,
    },
    /// Closes the group of the [`OpKind::AsyncCopy`]s issued since the last one (PTX
    /// `cp.async.commit_group`).
    AsyncCommit,
    /// Waits until at most `pending` of the latest committed groups are still in flight,
    /// then lets every thread of the program see what the others' are done (PTX
    /// `cp.async.wait_group`, then a barrier): with S stages, `pending` S - 2 waits for the
    /// oldest. Copies not yet committed are not waited for.
    AsyncWait {
        pending: u32,
    },
    /// The `[rows, cols]` tile of shared memory at `base` (a scalar shared pointer) with
    /// `row_stride` elements between rows: element `(r, c)` is `base[r * row_stride + c]`.
    /// A `dot_ta` whose `a` it is reads the tile itself (`ldmatrix .trans`) instead of
    /// staging registers through shared memory; otherwise each thread loads its elements.
    LoadTile {
        base: ValueId,
        rows: usize,
        cols: usize,
        row_stride: usize,
    },
    /// `len` elements of the program's shared memory: a scalar shared pointer to the first.
    /// Every program has its own; what they hold before the program stores there is
    /// undefined (the interpreter fills them with 0xFF bytes: NaN for floats). Stores to
    /// shared memory are ordered with the other threads' loads and stores around them
    /// (the code generator puts a barrier on each side of a store), so a block stored in one
    /// layout may be loaded in another, as a staged row or a table is.
    SharedAlloc {
        dtype: DType,
        len: usize,
    },
    /// Reduces a block along `axis`: 1-D to a scalar, 2-D to 1-D.
    Reduce {
        op: ReduceOp,
        value: ValueId,
        axis: u8,
    },
    /// Several 1-D-to-scalar reductions computed together, one result each. The
    /// `fuse_reductions` pass makes it from independent reductions over blocks of one shape
    /// (Algorithm 1's where/max/sum), so they share one exchange through shared memory.
    MultiReduce {
        ops: Vec<ReduceOp>,
        values: Vec<ValueId>,
    },
    /// Inclusive prefix sum of a 1-D i32 or f32 block: `out[i] = x[0] + ... + x[i]`. Ordered
    /// stream compaction uses it: a kept element's rank among the kept ones.
    Scan {
        value: ValueId,
    },
    /// `for i in (lo..hi).step_by(step)` with carried values. `body.args` are `[i, carried..]`;
    /// the body ends with `Yield` of the next carried values; the results are their final
    /// values.
    For {
        lo: ValueId,
        hi: ValueId,
        step: ValueId,
        init: Vec<ValueId>,
        body: Region,
    },
    /// Branches on a scalar `Bool`; each arm ends with `Yield` of the results.
    If {
        cond: ValueId,
        then_region: Region,
        else_region: Region,
    },
    Yield {
        values: Vec<ValueId>,
    },
}

impl OpKind {
    /// The values this op reads (not counting those read inside its regions).
    pub fn operands(&self) -> Vec<ValueId> {
        use OpKind::*;
        match self {
            ProgramId { .. }
            | NumPrograms { .. }
            | GlobalTimer
            | SmId
            | Constant { .. }
            | Arange { .. }
            | WaitPriorGrid
            | SharedAlloc { .. }
            | ReleaseDependents
            | Sleep { .. }
            | AsyncCommit
            | AsyncWait { .. }
            | Barrier => vec![],
            LoadTile { base, .. } => vec![*base],
            AsyncCopy { dst, src, mask } => {
                let mut v = vec![*dst, *src];
                v.extend(mask.iter().copied());
                v
            }
            Splat { value, .. } | Expand { value, .. } | Unary { value, .. } => vec![*value],
            Cast { value, .. } | Bitcast { value, .. } | Reduce { value, .. } | Scan { value } => {
                vec![*value]
            }
            Arrive { counter } => vec![*counter],
            AwaitCount { counter, target } => vec![*counter, *target],
            Signal { counter } => vec![*counter],
            MultiReduce { values, .. } => values.clone(),
            PtrCast { ptr, .. } => vec![*ptr],
            DotInt4 { codes, q } => vec![*codes, *q],
            Dot { a, b, acc, .. } => {
                let mut v = vec![*a, *b];
                v.extend(acc.iter().copied());
                v
            }
            Dp2a {
                pairs, bytes, acc, ..
            } => vec![*pairs, *bytes, *acc],
            Binary { lhs, rhs, .. } | Cmp { lhs, rhs, .. } => vec![*lhs, *rhs],
            Select {
                cond,
                on_true,
                on_false,
            } => vec![*cond, *on_true, *on_false],
            AddPtr { ptr, offset } => vec![*ptr, *offset],
            Load {
                ptr, mask, other, ..
            } => {
                let mut v = vec![*ptr];
                v.extend(mask.iter().copied());
                v.extend(other.iter().copied());
                v
            }
            Store { ptr, value, mask } | AtomicAdd { ptr, value, mask } => {
                let mut v = vec![*ptr, *value];
                v.extend(mask.iter().copied());
                v
            }
            Prefetch { ptr, mask, .. } | LoadFresh { ptr, mask } => {
                let mut v = vec![*ptr];
                v.extend(mask.iter().copied());
                v
            }
            For {
                lo, hi, step, init, ..
            } => {
                let mut v = vec![*lo, *hi, *step];
                v.extend(init.iter().copied());
                v
            }
            If { cond, .. } => vec![*cond],
            Yield { values } => values.clone(),
        }
    }

    /// The nested regions of this op.
    pub fn regions(&self) -> Vec<&Region> {
        match self {
            OpKind::For { body, .. } => vec![body],
            OpKind::If {
                then_region,
                else_region,
                ..
            } => vec![then_region, else_region],
            _ => vec![],
        }
    }

    /// Whether the op writes memory or ends a region (such ops are never dead code).
    pub fn has_effects(&self) -> bool {
        matches!(
            self,
            OpKind::Store { .. }
                | OpKind::AtomicAdd { .. }
                | OpKind::Prefetch { .. }
                | OpKind::AsyncCopy { .. }
                | OpKind::AsyncCommit
                | OpKind::AsyncWait { .. }
                | OpKind::Arrive { .. }
                | OpKind::AwaitCount { .. }
                | OpKind::Signal { .. }
                | OpKind::WaitPriorGrid
                | OpKind::ReleaseDependents
                | OpKind::Sleep { .. }
                | OpKind::Barrier
                | OpKind::Yield { .. }
        )
    }

    /// The op's name as the printer and error messages show it.
    pub fn name(&self) -> &'static str {
        use OpKind::*;
        match self {
            ProgramId { .. } => "program_id",
            GlobalTimer => "global_timer",
            SmId => "sm_id",
            NumPrograms { .. } => "num_programs",
            Constant { .. } => "constant",
            Arange { .. } => "arange",
            Splat { .. } => "splat",
            Expand { .. } => "expand",
            Binary { op, .. } => match op {
                BinOp::Add => "add",
                BinOp::Sub => "sub",
                BinOp::Mul => "mul",
                BinOp::Div => "div",
                BinOp::Rem => "rem",
                BinOp::Min => "min",
                BinOp::Max => "max",
                BinOp::And => "and",
                BinOp::Or => "or",
                BinOp::Xor => "xor",
                BinOp::Shl => "shl",
                BinOp::Shr => "shr",
            },
            Cmp { op, .. } => match op {
                CmpOp::Eq => "cmp_eq",
                CmpOp::Ne => "cmp_ne",
                CmpOp::Lt => "cmp_lt",
                CmpOp::Le => "cmp_le",
                CmpOp::Gt => "cmp_gt",
                CmpOp::Ge => "cmp_ge",
            },
            Unary { op, .. } => match op {
                UnOp::Neg => "neg",
                UnOp::Not => "not",
                UnOp::Abs => "abs",
                UnOp::Exp2 => "exp2",
                UnOp::Log2 => "log2",
                UnOp::Sqrt => "sqrt",
                UnOp::Rsqrt => "rsqrt",
            },
            Cast { .. } => "cast",
            Bitcast { .. } => "bitcast",
            PtrCast { .. } => "ptr_cast",
            DotInt4 { .. } => "dot_int4",
            Dot { trans_a: false, .. } => "dot",
            Dot { trans_a: true, .. } => "dot_ta",
            Dp2a { high: false, .. } => "dp2a_lo",
            Dp2a { high: true, .. } => "dp2a_hi",
            Select { .. } => "select",
            AddPtr { .. } => "add_ptr",
            Load { .. } => "load",
            Store { .. } => "store",
            AtomicAdd { .. } => "atomic_add",
            LoadFresh { .. } => "load_fresh",
            Prefetch { .. } => "prefetch",
            AsyncCopy { .. } => "async_copy",
            AsyncCommit => "async_commit",
            AsyncWait { .. } => "async_wait",
            LoadTile { .. } => "load_tile",
            Arrive { .. } => "arrive",
            AwaitCount { .. } => "await_count",
            Signal { .. } => "signal",
            SharedAlloc { .. } => "shared_alloc",
            WaitPriorGrid => "wait_prior_grid",
            ReleaseDependents => "release_dependents",
            Sleep { .. } => "sleep",
            Barrier => "barrier",
            Reduce { op, .. } => match op {
                ReduceOp::Sum => "sum",
                ReduceOp::Max => "max_reduce",
                ReduceOp::Min => "min_reduce",
            },
            MultiReduce { .. } => "multi_reduce",
            Scan { .. } => "cumsum",
            For { .. } => "for",
            If { .. } => "if",
            Yield { .. } => "yield",
        }
    }
}

/// A kernel parameter: a pointer to global memory or a scalar.
#[derive(Clone, Debug, PartialEq)]
pub struct Param {
    pub name: String,
    pub ty: Type,
    pub value: ValueId,
}

/// One kernel: its parameters, its body, and the type of every value it defines.
#[derive(Clone, Debug, PartialEq)]
pub struct Kernel {
    pub name: String,
    pub params: Vec<Param>,
    pub body: Region,
    /// Type of each value, indexed by [`ValueId`].
    pub types: Vec<Type>,
    /// Warps per program (threads per block / 32).
    pub num_warps: u32,
    /// Programs that should fit on one multiprocessor at once (0: no request). Tells ptxas
    /// to keep registers low enough for that occupancy.
    pub min_programs_per_sm: u32,
    /// Bytes each thread holds contiguously along the last dimension of blocks that are
    /// loaded or stored (a power of two, 4 to 64; 16 by default, one 16-byte access). 32
    /// gives each thread two accesses per row and halves the lanes a row spans, so
    /// reductions along rows take one shuffle step less.
    pub vector_bytes: u32,
}

impl Kernel {
    pub fn ty(&self, v: ValueId) -> &Type {
        &self.types[v.0 as usize]
    }
    pub fn num_threads(&self) -> u32 {
        self.num_warps * 32
    }
    /// Whether the kernel waits for the previous one itself ([`OpKind::WaitPriorGrid`]), so
    /// it may be launched to start before that one ends.
    pub fn waits_on_prior_grid(&self) -> bool {
        let mut found = false;
        walk_ops(&self.body, &mut |op| {
            found |= matches!(op.kind, OpKind::WaitPriorGrid);
        });
        found
    }
}

/// Calls `f` on every op of `region` and of its nested regions, parents before children.
pub fn walk_ops<'a>(region: &'a Region, f: &mut impl FnMut(&'a Op)) {
    for op in &region.ops {
        f(op);
        for r in op.kind.regions() {
            walk_ops(r, f);
        }
    }
}
