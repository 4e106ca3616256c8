//! Lowers tile IR to per-thread LLVM IR. Each block value becomes the list of elements the
//! thread holds under its layout (fully unrolled: shapes are constants); scalars are plain
//! LLVM values computed alike by every thread. Reductions combine a thread's elements, then
//! lanes by butterfly shuffles, then warps through shared memory.

use super::Machine;
use crate::ir::*;
use crate::passes::axis::AxisInfos;
use crate::passes::layout::{Blocked, Layout, Layouts};
use crate::CompileError;
use inkwell::basic_block::BasicBlock;
use inkwell::builder::Builder;
use inkwell::context::Context;
use inkwell::module::{Linkage, Module};
use inkwell::types::{BasicType, BasicTypeEnum, IntType};
use inkwell::values::{AsValueRef, InstructionOpcode};
use inkwell::values::{
    BasicMetadataValueEnum, BasicValue, BasicValueEnum, FastMathFlags, FloatValue, FunctionValue,
    GlobalValue, IntValue, PointerValue,
};
use inkwell::{AddressSpace, FloatPredicate, IntPredicate};
use std::collections::{HashMap, HashSet};

const PTX_KERNEL_CC: u32 = 71;
const GLOBAL: u16 = 1;
const SHARED: u16 = 3;
/// Polls of [`OpKind::AwaitCount`] before it gives up (each a round trip to L2, about a
/// microsecond under load).
const AWAIT_POLLS: u32 = 128;

/// A lowered value: one LLVM value for a scalar, the thread's elements for a block.
#[derive(Clone)]
enum Cv<'c> {
    S(BasicValueEnum<'c>),
    B(Vec<BasicValueEnum<'c>>),
}

type R<T> = Result<T, CompileError>;

struct Lower<'c, 'k> {
    ctx: &'c Context,
    module: Module<'c>,
    b: Builder<'c>,
    func: FunctionValue<'c>,
    k: &'k Kernel,
    axes: &'k AxisInfos,
    layouts: &'k Layouts,
    vals: HashMap<ValueId, Cv<'c>>,
    lane: IntValue<'c>,
    warp: IntValue<'c>,
    tid: IntValue<'c>,
    smem: Option<GlobalValue<'c>>,
    /// Scratch of `dot_ta` (its `a` is staged here and read back transposed), apart from
    /// `smem` so that it needs no block-wide barrier: each warp owns a slice.
    dot_smem: Option<GlobalValue<'c>>,
    /// The block of each [`OpKind::SharedAlloc`] (by its result).
    shared_blocks: HashMap<ValueId, GlobalValue<'c>>,
    /// The [`OpKind::LoadTile`]s read only as the `a` of `dot_ta` ([`tiles_for_dot_ta`]),
    /// and the A fragments read from each once lowered.
    ta_tiles: HashSet<ValueId>,
    ta_frags: HashMap<ValueId, Vec<BasicValueEnum<'c>>>,
    /// Shared-memory atomics were the last ops touching shared memory and their closing
    /// barrier is not yet emitted: atomics commute, so a run of them (nothing but
    /// arithmetic between) shares one barrier at each end ([`Lower::settle_atomics`]).
    atomics_open: bool,
    /// The total of each integer block prefix-summed in the regions being lowered (its
    /// [`OpKind::Scan`] computes it anyway): a sum of the same block reuses it instead of
    /// reducing again (an exchange between warps and a barrier pair saved).
    scan_totals: HashMap<ValueId, BasicValueEnum<'c>>,
    /// Compute capability times ten of the target.
    sm: u32,
}

pub(super) fn lower<'c>(
    ctx: &'c Context,
    k: &Kernel,
    axes: &AxisInfos,
    layouts: &Layouts,
    machine: &Machine,
    sm: u32,
) -> R<Module<'c>> {
    let module = ctx.create_module(&k.name);
    module.set_triple(&machine.get_triple());
    module.set_data_layout(&machine.get_target_data().get_data_layout());
    let param_types: Vec<_> = k
        .params
        .iter()
        .map(|p| match p.ty.elem {
            Elem::Ptr(_) => ctx.ptr_type(AddressSpace::from(GLOBAL)).into(),
            Elem::SharedPtr(_) => unreachable!("verified: no shared pointer parameters"),
            Elem::Num(d) => llvm_type(ctx, d).into(),
        })
        .collect();
    let fn_type = ctx.void_type().fn_type(&param_types, false);
    let func = module.add_function(&k.name, fn_type, None);
    func.set_call_conventions(PTX_KERNEL_CC);
    // The grid never launches more threads than this, which lets ptxas budget registers.
    let md = ctx.metadata_node(&[
        func.as_global_value().as_pointer_value().into(),
        ctx.metadata_string("maxntidx").into(),
        ctx.i32_type()
            .const_int(k.num_threads() as u64, false)
            .into(),
    ]);
    module
        .add_global_metadata("nvvm.annotations", &md)
        .map_err(|e| CompileError::Codegen {
            kernel: k.name.clone(),
            msg: format!("annotation: {e}"),
        })?;
    if k.min_programs_per_sm > 0 {
        let md = ctx.metadata_node(&[
            func.as_global_value().as_pointer_value().into(),
            ctx.metadata_string("minctasm").into(),
            ctx.i32_type()
                .const_int(k.min_programs_per_sm as u64, false)
                .into(),
        ]);
        module
            .add_global_metadata("nvvm.annotations", &md)
            .map_err(|e| CompileError::Codegen {
                kernel: k.name.clone(),
                msg: format!("annotation: {e}"),
            })?;
    }
    let entry = ctx.append_basic_block(func, "entry");
    let b = ctx.create_builder();
    b.position_at_end(entry);
    let i32t = ctx.i32_type();
    let zero = i32t.const_zero();
    let mut l = Lower {
        ctx,
        module,
        b,
        func,
        k,
        axes,
        layouts,
        vals: HashMap::new(),
        lane: zero,
        warp: zero,
        tid: zero,
        smem: None,
        dot_smem: None,
        shared_blocks: HashMap::new(),
        ta_tiles: tiles_for_dot_ta(k, axes),
        ta_frags: HashMap::new(),
        atomics_open: false,
        scan_totals: HashMap::new(),
        sm,
    };
    l.tid = l.sreg("tid.x")?;
    l.lane =
        l.b.build_and(l.tid, i32t.const_int(31, false), "lane")
            .map_err(|e| l.err(e))?;
    l.warp =
        l.b.build_right_shift(l.tid, i32t.const_int(5, false), false, "warp")
            .map_err(|e| l.err(e))?;
    let smem_bytes = shared_bytes(k, layouts);
    if smem_bytes > 48 * 1024 {
        return Err(l.err(format!(
            "needs {smem_bytes} bytes of shared memory, more than the 48 KiB static limit"
        )));
    }
    if smem_bytes > 0 {
        let ty = ctx.i8_type().array_type(smem_bytes as u32);
        let g = l
            .module
            .add_global(ty, Some(AddressSpace::from(SHARED)), "dusk_smem");
        g.set_linkage(Linkage::Internal);
        g.set_alignment(16);
        g.set_initializer(&ty.get_undef());
        l.smem = Some(g);
    }
    let dot_bytes = dot_scratch_bytes(k, &l.ta_tiles);
    let mut blocks = vec![];
    walk_ops(&k.body, &mut |op| {
        if let OpKind::SharedAlloc { dtype, len } = op.kind {
            blocks.push((op.results[0], dtype, len));
        }
    });
    let block_bytes: usize = blocks.iter().map(|(_, d, n)| n * d.size_bytes()).sum();
    if smem_bytes + dot_bytes + block_bytes > 48 * 1024 {
        return Err(l.err(format!(
            "needs {} bytes of shared memory ({block_bytes} in shared_alloc blocks), more than \
             the 48 KiB static limit",
            smem_bytes + dot_bytes + block_bytes
        )));
    }
    for (i, (v, d, n)) in blocks.into_iter().enumerate() {
        let ty = llvm_type(ctx, d).array_type(n as u32);
        let g = l.module.add_global(
            ty,
            Some(AddressSpace::from(SHARED)),
            &format!("dusk_shared_{i}"),
        );
        g.set_linkage(Linkage::Internal);
        g.set_alignment(16);
        g.set_initializer(&ty.get_undef());
        l.shared_blocks.insert(v, g);
    }
    if dot_bytes > 0 {
        let ty = ctx.i8_type().array_type(dot_bytes as u32);
        let g = l
            .module
            .add_global(ty, Some(AddressSpace::from(SHARED)), "dusk_dot_smem");
        g.set_linkage(Linkage::Internal);
        g.set_alignment(16);
        g.set_initializer(&ty.get_undef());
        l.dot_smem = Some(g);
    }
    for p in &k.params {
        let idx = k
            .params
            .iter()
            .position(|q| q.value == p.value)
            .expect("param");
        let v = l.func.get_nth_param(idx as u32).expect("param value");
        l.vals.insert(p.value, Cv::S(v));
    }
    l.region(&k.body)?;
    l.b.build_return(None).map_err(|e| l.err(e))?;
    Ok(l.module)
}

fn llvm_type(ctx: &Context, d: DType) -> BasicTypeEnum<'_> {
    match d {
        DType::Bool => ctx.bool_type().into(),
        DType::U8 => ctx.i8_type().into(),
        DType::I32 => ctx.i32_type().into(),
        DType::I64 => ctx.i64_type().into(),
        DType::F16 => ctx.f16_type().into(),
        DType::BF16 => ctx.bf16_type().into(),
        DType::F32 => ctx.f32_type().into(),
    }
}

/// Bytes of shared memory the kernel's reductions and layout conversions need at most.
fn shared_bytes(k: &Kernel, layouts: &Layouts) -> usize {
    let mut most = 0usize;
    walk_ops(&k.body, &mut |op| {
        let need = match &op.kind {
            OpKind::Reduce { value, axis, .. } => {
                let t = k.ty(*value);
                let wide = if t.elem == Elem::Num(DType::I64) {
                    8
                } else {
                    4
                };
                match layouts.get(*value) {
                    Layout::Blocked(b) if t.shape.len() == 2 => {
                        let a = *axis as usize;
                        let reduce = if b.warps_per_cta[a] > 1 {
                            b.warps_per_cta[a] * b.shape[1 - a] * wide
                        } else {
                            0
                        };
                        let res = op.results[0];
                        let convert = if !layouts.get(res).equivalent(&Layout::Slice {
                            parent: b.clone(),
                            dim: a,
                        }) {
                            b.shape[1 - a] * wide
                        } else {
                            0
                        };
                        reduce.max(convert)
                    }
                    // One 8-byte slot a warp (see `across_warps`).
                    _ => k.num_warps as usize * 8,
                }
            }
            OpKind::MultiReduce { values, .. } => values.len() * k.num_warps as usize * 8,
            // The count, broadcast from thread 0.
            OpKind::Arrive { .. } | OpKind::AwaitCount { .. } => 4,
            OpKind::Scan { value } => match layouts.get(*value) {
                Layout::Blocked(b) => {
                    (b.per_thread(0) / b.size_per_thread[0]) * b.warps_per_cta[0] * 4
                }
                _ => 0,
            },
            OpKind::Expand { value, axis, .. } => {
                let t = k.ty(*value);
                let needs_convert = match layouts.get(op.results[0]) {
                    Layout::Blocked(parent) => !layouts.get(*value).equivalent(&Layout::Slice {
                        parent: parent.clone(),
                        dim: *axis as usize,
                    }),
                    _ => true,
                };
                let esize = t.elem.dtype().map(|d| d.size_bytes()).unwrap_or(8);
                if needs_convert {
                    t.num_elements() * esize
                } else {
                    0
                }
            }
            _ => 0,
        };
        most = most.max(need);
    });
    most
}

/// Bytes of a row of `a` in the scratch of `dot_ta`: 16 bytes more than the row, so that
/// the eight rows an `ldmatrix` reads start in eight different groups of banks.
fn dot_row_bytes(m: usize) -> usize {
    2 * m + 16
}

/// The results of [`OpKind::LoadTile`]s whose every use is as the `a` of a `dot_ta` and
/// that `ldmatrix` can read as they lie: 8 rows of f16 or bf16, columns a multiple of 32,
/// rows and base 16-byte aligned. Their fragments are read at the tile; no scratch.
fn tiles_for_dot_ta(k: &Kernel, axes: &AxisInfos) -> HashSet<ValueId> {
    let mut tiles = HashSet::new();
    walk_ops(&k.body, &mut |op| {
        if let OpKind::LoadTile {
            base,
            rows: 8,
            cols,
            row_stride,
        } = op.kind
        {
            let half = matches!(k.ty(base).elem.pointee(), Some(DType::F16 | DType::BF16));
            let aligned = axes.get(base).is_some_and(|i| i.divisibility[0] >= 16);
            if half && aligned && cols % 32 == 0 && (2 * row_stride) % 16 == 0 {
                tiles.insert(op.results[0]);
            }
        }
    });
    walk_ops(&k.body, &mut |op| {
        let as_a = match &op.kind {
            OpKind::Dot {
                a,
                b,
                acc,
                trans_a: true,
            } if b != a && *acc != Some(*a) => Some(*a),
            _ => None,
        };
        for v in op.kind.operands() {
            if Some(v) != as_a {
                tiles.remove(&v);
            }
        }
    });
    tiles
}

/// Bytes of shared memory the `dot_ta` ops need: eight rows a warp (none for those whose
/// `a` is a tile of shared memory already).
fn dot_scratch_bytes(k: &Kernel, ta_tiles: &HashSet<ValueId>) -> usize {
    let mut most = 0usize;
    walk_ops(&k.body, &mut |op| {
        if let OpKind::Dot {
            a, trans_a: true, ..
        } = &op.kind
        {
            if ta_tiles.contains(a) {
                return;
            }
            let m = k.ty(*a).shape[1];
            most = most.max(k.num_warps as usize * 8 * dot_row_bytes(m));
        }
    });
    most
}

impl<'c, 'k> Lower<'c, 'k> {
    fn err(&self, msg: impl std::fmt::Display) -> CompileError {
        CompileError::Codegen {
            kernel: self.k.name.clone(),
            msg: msg.to_string(),
        }
    }

    /// A 32-bit special register (`%tid.x`, `%ctaid.x`, `%smid`, ...).
    fn sreg(&self, name: &str) -> R<IntValue<'c>> {
        self.special_register(name, self.ctx.i32_type())
    }

    /// A special register of type `ty` (`%globaltimer` is 64-bit).
    fn special_register(&self, name: &str, ty: IntType<'c>) -> R<IntValue<'c>> {
        let f = self.intrinsic(
            &format!("llvm.nvvm.read.ptx.sreg.{name}"),
            ty.fn_type(&[], false),
        );
        let v = self.b.build_call(f, &[], name).map_err(|e| self.err(e))?;
        Ok(v.try_as_basic_value()
            .basic()
            .expect("sreg value")
            .into_int_value())
    }

    fn intrinsic(&self, name: &str, ty: inkwell::types::FunctionType<'c>) -> FunctionValue<'c> {
        self.module
            .get_function(name)
            .unwrap_or_else(|| self.module.add_function(name, ty, None))
    }

    fn call(
        &self,
        name: &str,
        ret: BasicTypeEnum<'c>,
        args: &[BasicValueEnum<'c>],
    ) -> R<BasicValueEnum<'c>> {
        let arg_tys: Vec<_> = args.iter().map(|a| a.get_type().into()).collect();
        let f = self.intrinsic(name, ret.fn_type(&arg_tys, false));
        let args: Vec<BasicMetadataValueEnum> = args.iter().map(|a| (*a).into()).collect();
        let v = self.b.build_call(f, &args, "").map_err(|e| self.err(e))?;
        Ok(v.try_as_basic_value().basic().expect("intrinsic value"))
    }

    fn i32c(&self, v: i64) -> IntValue<'c> {
        self.ctx.i32_type().const_int(v as u64, true)
    }

    fn get(&self, v: ValueId) -> Cv<'c> {
        self.vals
            .get(&v)
            .cloned()
            .expect("value lowered before use")
    }

    fn elems(&self, v: ValueId) -> Vec<BasicValueEnum<'c>> {
        match self.get(v) {
            Cv::B(e) => e,
            Cv::S(s) => vec![s],
        }
    }

    fn ty_of(&self, v: ValueId) -> &Type {
        self.k.ty(v)
    }

    // ---- layouts: coordinates and ownership ----

    /// The thread's lane and warp index along dimension `d` of a blocked layout.
    fn thread_coord(&self, bl: &Blocked, d: usize) -> R<(IntValue<'c>, IntValue<'c>)> {
        let part = |id: IntValue<'c>, stride: usize, count: usize| -> R<IntValue<'c>> {
            let shifted = self
                .b
                .build_right_shift(id, self.i32c(stride.trailing_zeros() as i64), false, "")
                .map_err(|x| self.err(x))?;
            self.b
                .build_and(shifted, self.i32c(count as i64 - 1), "")
                .map_err(|x| self.err(x))
        };
        Ok((
            part(self.lane, bl.lane_stride(d), bl.threads_per_warp[d])?,
            part(self.warp, bl.warp_stride(d), bl.warps_per_cta[d])?,
        ))
    }

    /// Where the thread's first element lies along `d`, before wrapping replicas.
    fn raw_base(&self, bl: &Blocked, d: usize) -> R<IntValue<'c>> {
        let (lane_d, warp_d) = self.thread_coord(bl, d)?;
        let w = self
            .b
            .build_int_mul(warp_d, self.i32c(bl.threads_per_warp[d] as i64), "")
            .map_err(|x| self.err(x))?;
        let t = self
            .b
            .build_int_add(w, lane_d, "")
            .map_err(|x| self.err(x))?;
        self.b
            .build_int_mul(t, self.i32c(bl.size_per_thread[d] as i64), "")
            .map_err(|x| self.err(x))
    }

    /// Coordinate along `d` of the thread's `i`-th element along `d`.
    fn coord(&self, bl: &Blocked, d: usize, i: usize) -> R<IntValue<'c>> {
        let base = self.raw_base(bl, d)?;
        let c = self
            .b
            .build_int_add(base, self.i32c(bl.slot_offset(d, i) as i64), "")
            .map_err(|x| self.err(x))?;
        if bl.tile(d) > bl.shape[d] {
            self.b
                .build_and(c, self.i32c(bl.shape[d] as i64 - 1), "")
                .map_err(|x| self.err(x))
        } else {
            Ok(c)
        }
    }

    /// Per-thread element index `s` of a blocked layout as per-dimension indices.
    fn split_slot(bl: &Blocked, s: usize) -> Vec<usize> {
        if bl.rank() == 1 {
            vec![s]
        } else {
            let n1 = bl.per_thread(1);
            vec![s / n1, s % n1]
        }
    }

    /// The coordinates (one per dimension) of each element the thread holds.
    fn slot_coords(&self, l: &Layout) -> R<Vec<Vec<IntValue<'c>>>> {
        let mut out = vec![];
        match l {
            Layout::Scalar => out.push(vec![]),
            Layout::Blocked(bl) => {
                for s in 0..l.slots() {
                    let idx = Self::split_slot(bl, s);
                    let c: R<Vec<_>> = idx
                        .iter()
                        .enumerate()
                        .map(|(d, i)| self.coord(bl, d, *i))
                        .collect();
                    out.push(c?);
                }
            }
            Layout::Slice { parent, dim } => {
                let kept = 1 - dim;
                for s in 0..l.slots() {
                    out.push(vec![self.coord(parent, kept, s)?]);
                }
            }
        }
        Ok(out)
    }

    /// True for the one thread that owns (must store, must count) each element; `None`
    /// when every holder is the owner.
    fn owner(&self, l: &Layout) -> R<Option<IntValue<'c>>> {
        let mut conds = vec![];
        match l {
            Layout::Scalar => {
                conds.push(
                    self.b
                        .build_int_compare(IntPredicate::EQ, self.tid, self.i32c(0), "")
                        .map_err(|x| self.err(x))?,
                );
            }
            Layout::Blocked(bl) => {
                for d in 0..bl.rank() {
                    conds.extend(self.not_replica(bl, d)?);
                }
            }
            Layout::Slice { parent, dim } => {
                conds.extend(self.not_replica(parent, 1 - dim)?);
                let (lane_d, warp_d) = self.thread_coord(parent, *dim)?;
                let both = self
                    .b
                    .build_or(lane_d, warp_d, "")
                    .map_err(|x| self.err(x))?;
                conds.push(
                    self.b
                        .build_int_compare(IntPredicate::EQ, both, self.i32c(0), "")
                        .map_err(|x| self.err(x))?,
                );
            }
        }
        let mut acc: Option<IntValue<'c>> = None;
        for c in conds {
            acc = Some(match acc {
                None => c,
                Some(a) => self.b.build_and(a, c, "").map_err(|x| self.err(x))?,
            });
        }
        Ok(acc)
    }

    /// Whether the thread holds original (not replicated) elements along `d`.
    fn not_replica(&self, bl: &Blocked, d: usize) -> R<Option<IntValue<'c>>> {
        if bl.tile(d) <= bl.shape[d] {
            return Ok(None);
        }
        let base = self.raw_base(bl, d)?;
        let c =
            self.b
                .build_int_compare(IntPredicate::ULT, base, self.i32c(bl.shape[d] as i64), "");
        Ok(Some(c.map_err(|x| self.err(x))?))
    }

    // ---- regions and ops ----

    fn region(&mut self, r: &Region) -> R<Vec<Cv<'c>>> {
        // Totals of scans inside the region do not dominate what follows it.
        let outer_scans = self.scan_totals.clone();
        let mut out = vec![];
        for op in &r.ops {
            if let OpKind::Yield { values } = &op.kind {
                out = values.iter().map(|v| self.get(*v)).collect();
                break;
            }
            self.op(op)?;
        }
        self.settle_atomics()?;
        self.scan_totals = outer_scans;
        Ok(out)
    }

    /// Emits the barrier that closes a run of shared-memory atomics, if one is open: before
    /// any op that may touch shared memory or synchronise, and at the end of every region
    /// (so every path out of a loop body or a branch is settled alike).
    fn settle_atomics(&mut self) -> R<()> {
        if self.atomics_open {
            self.atomics_open = false;
            self.barrier()?;
        }
        Ok(())
    }

    fn op(&mut self, op: &Op) -> R<()> {
        use OpKind::*;
        let res = op.results.first().copied();
        // Arithmetic (and address arithmetic) leaves a run of shared atomics open.
        let arithmetic = matches!(
            op.kind,
            Constant { .. }
                | Arange { .. }
                | Splat { .. }
                | Binary { .. }
                | Cmp { .. }
                | Unary { .. }
                | Cast { .. }
                | Bitcast { .. }
                | Select { .. }
                | PtrCast { .. }
                | AddPtr { .. }
                | ProgramId { .. }
                | NumPrograms { .. }
        );
        let shared_atomic = matches!(op.kind, AtomicAdd { ptr, .. }
            if matches!(self.ty_of(ptr).elem, Elem::SharedPtr(_)));
        if !arithmetic && !shared_atomic {
            self.settle_atomics()?;
        }
        let out: Cv<'c> = match &op.kind {
            SharedAlloc { .. } => {
                let g = self.shared_blocks[&res.expect("result")];
                Cv::S(g.as_pointer_value().into())
            }
            ProgramId { axis } => Cv::S(
                self.sreg(&format!("ctaid.{}", ["x", "y", "z"][*axis as usize]))?
                    .into(),
            ),
            GlobalTimer => Cv::S(
                self.special_register("globaltimer", self.ctx.i64_type())?
                    .into(),
            ),
            SmId => Cv::S(self.sreg("smid")?.into()),
            NumPrograms { axis } => Cv::S(
                self.sreg(&format!("nctaid.{}", ["x", "y", "z"][*axis as usize]))?
                    .into(),
            ),
            Constant { value, dtype } => Cv::S(self.constant(*value, *dtype)),
            Arange { start, .. } => {
                let l = self.layouts.get(res.expect("result")).clone();
                let coords = self.slot_coords(&l)?;
                let mut v = vec![];
                for c in coords {
                    v.push(
                        self.b
                            .build_int_add(c[0], self.i32c(*start), "")
                            .map_err(|e| self.err(e))?
                            .into(),
                    );
                }
                Cv::B(v)
            }
            Splat { value, .. } => {
                let s = self.elems(*value)[0];
                Cv::B(vec![s; self.layouts.get(res.expect("result")).slots()])
            }
            Expand { value, axis, .. } => {
                self.expand(*value, *axis as usize, res.expect("result"))?
            }
            Binary { op: bop, lhs, rhs } => {
                let d = self.ty_of(*lhs).elem.dtype().expect("number");
                self.map2(*lhs, *rhs, |s, a, b| s.binary(*bop, d, a, b))?
            }
            Cmp { op: cop, lhs, rhs } => {
                let d = self.ty_of(*lhs).elem.dtype().expect("number");
                self.map2(*lhs, *rhs, |s, a, b| s.compare(*cop, d, a, b))?
            }
            Unary { op: uop, value } => {
                let d = self.ty_of(*value).elem.dtype().expect("number");
                self.map1(*value, |s, a| s.unary(*uop, d, a))?
            }
            Cast { value, to } => {
                let from = self.ty_of(*value).elem.dtype().expect("number");
                self.map1(*value, |s, a| s.cast(a, from, *to))?
            }
            Bitcast { value, to } => {
                let t = llvm_type(self.ctx, *to);
                self.map1(*value, |s, a| {
                    s.b.build_bit_cast(a, t, "").map_err(|e| s.err(e))
                })?
            }
            Select {
                cond,
                on_true,
                on_false,
            } => {
                let (c, t, f) = (
                    self.elems(*cond),
                    self.elems(*on_true),
                    self.elems(*on_false),
                );
                let mut out = vec![];
                for i in 0..t.len() {
                    let ci = c[if c.len() == 1 { 0 } else { i }].into_int_value();
                    out.push(
                        self.b
                            .build_select(ci, t[i], f[i], "")
                            .map_err(|e| self.err(e))?,
                    );
                }
                self.wrap(*on_true, out)
            }
            PtrCast { ptr, .. } => self.get(*ptr),
            DotInt4 { codes, q } => self.dot_int4(*codes, *q, res.expect("result"))?,
            Dot { a, b, acc, trans_a } => {
                let r = res.expect("result");
                if *trans_a {
                    self.dot_ta(*a, *b, *acc, r)?
                } else {
                    self.dot(*a, *b, *acc, r)?
                }
            }
            Dp2a {
                pairs,
                bytes,
                acc,
                high,
            } => {
                let (p, b, a) = (self.elems(*pairs), self.elems(*bytes), self.elems(*acc));
                let i32t = self.ctx.i32_type();
                let fn_t = i32t.fn_type(&[i32t.into(), i32t.into(), i32t.into()], false);
                let text = format!(
                    "dp2a.{}.s32.u32 $0, $1, $2, $3;",
                    if *high { "hi" } else { "lo" }
                );
                let asm = self.ctx.create_inline_asm(
                    fn_t,
                    text,
                    "=r,r,r,r".to_string(),
                    false,
                    false,
                    None,
                    false,
                );
                let mut out = vec![];
                for i in 0..p.len() {
                    let args: Vec<BasicMetadataValueEnum> =
                        vec![p[i].into(), b[i].into(), a[i].into()];
                    let v = self
                        .b
                        .build_indirect_call(fn_t, asm, &args, "")
                        .map_err(|x| self.err(x))?;
                    out.push(v.try_as_basic_value().basic().expect("dp2a value"));
                }
                self.wrap(*pairs, out)
            }
            AddPtr { ptr, offset } => {
                let Some(d) = self.ty_of(*ptr).elem.pointee() else {
                    unreachable!("verified")
                };
                let et = llvm_type(self.ctx, d);
                let (p, o) = (self.elems(*ptr), self.elems(*offset));
                let mut out = vec![];
                for i in 0..p.len() {
                    let idx = o[i].into_int_value();
                    let idx = if idx.get_type().get_bit_width() < 64 {
                        self.b
                            .build_int_s_extend(idx, self.ctx.i64_type(), "")
                            .map_err(|e| self.err(e))?
                    } else {
                        idx
                    };
                    // SAFETY: address arithmetic only; accesses are bounded by the kernel's masks.
                    let g = unsafe { self.b.build_gep(et, p[i].into_pointer_value(), &[idx], "") };
                    out.push(g.map_err(|e| self.err(e))?.into());
                }
                self.wrap(*ptr, out)
            }
            Load {
                ptr,
                mask,
                other,
                streaming,
            } => self.load(*ptr, *mask, *other, *streaming, res.expect("result"))?,
            Store { ptr, value, mask } => {
                self.store(*ptr, *value, *mask)?;
                return Ok(());
            }
            AtomicAdd { ptr, value, mask } => {
                self.atomic_add(*ptr, *value, *mask)?;
                return Ok(());
            }
            LoadFresh { ptr, mask } => self.load_fresh(*ptr, *mask)?,
            Prefetch {
                ptr,
                mask,
                bytes,
                level,
            } => {
                self.prefetch(*ptr, *mask, *bytes, *level)?;
                return Ok(());
            }
            Arrive { counter } => self.arrive(*counter)?,
            AwaitCount { counter, target } => self.await_count(*counter, *target)?,
            Signal { counter } => {
                self.signal(*counter)?;
                return Ok(());
            }
            WaitPriorGrid => {
                self.grid_dependency("griddepcontrol.wait;")?;
                return Ok(());
            }
            Barrier => {
                self.barrier()?;
                return Ok(());
            }
            AsyncCopy { dst, src, mask } => {
                self.async_copy(*dst, *src, *mask)?;
                return Ok(());
            }
            AsyncCommit => {
                self.async_asm("cp.async.commit_group;")?;
                return Ok(());
            }
            AsyncWait { pending } => {
                self.async_asm(&format!("cp.async.wait_group {pending};"))?;
                self.program_sync()?;
                return Ok(());
            }
            LoadTile {
                base,
                rows,
                cols,
                row_stride,
            } => self.load_tile(*base, [*rows, *cols], *row_stride, res.expect("result"))?,
            ReleaseDependents => {
                self.grid_dependency("griddepcontrol.launch_dependents;")?;
                return Ok(());
            }
            Sleep { ns } => {
                self.sleep(*ns)?;
                return Ok(());
            }
            Reduce {
                op: ReduceOp::Sum,
                value,
                ..
            } if self.scan_totals.contains_key(value) => Cv::S(self.scan_totals[value]),
            Reduce {
                op: rop,
                value,
                axis,
            } => self.reduce(*rop, *value, *axis as usize, res.expect("result"))?,
            MultiReduce { ops, values } => {
                let outs = self.multi_reduce(ops, values)?;
                for (r, v) in op.results.iter().zip(outs) {
                    self.vals.insert(*r, v);
                }
                return Ok(());
            }
            Scan { value } => self.scan(*value)?,
            For {
                lo,
                hi,
                step,
                init,
                body,
            } => {
                let outs = self.for_loop(*lo, *hi, *step, init, body)?;
                for (r, v) in op.results.iter().zip(outs) {
                    self.vals.insert(*r, v);
                }
                return Ok(());
            }
            If {
                cond,
                then_region,
                else_region,
            } => {
                let outs = self.if_else(*cond, then_region, else_region, &op.results)?;
                for (r, v) in op.results.iter().zip(outs) {
                    self.vals.insert(*r, v);
                }
                return Ok(());
            }
            Yield { .. } => unreachable!("handled by region"),
        };
        self.vals.insert(res.expect("result"), out);
        Ok(())
    }

    fn wrap(&self, like: ValueId, v: Vec<BasicValueEnum<'c>>) -> Cv<'c> {
        if self.ty_of(like).is_scalar() {
            Cv::S(v[0])
        } else {
            Cv::B(v)
        }
    }

    fn map1(
        &mut self,
        a: ValueId,
        f: impl Fn(&Self, BasicValueEnum<'c>) -> R<BasicValueEnum<'c>>,
    ) -> R<Cv<'c>> {
        let xs = self.elems(a);
        let out: R<Vec<_>> = xs.into_iter().map(|x| f(self, x)).collect();
        Ok(self.wrap(a, out?))
    }

    fn map2(
        &mut self,
        a: ValueId,
        b: ValueId,
        f: impl Fn(&Self, BasicValueEnum<'c>, BasicValueEnum<'c>) -> R<BasicValueEnum<'c>>,
    ) -> R<Cv<'c>> {
        let (xs, ys) = (self.elems(a), self.elems(b));
        let out: R<Vec<_>> = xs.into_iter().zip(ys).map(|(x, y)| f(self, x, y)).collect();
        Ok(self.wrap(a, out?))
    }

    fn constant(&self, c: Const, d: DType) -> BasicValueEnum<'c> {
        let t = llvm_type(self.ctx, d);
        match (c, t) {
            (Const::Bool(b), BasicTypeEnum::IntType(it)) => it.const_int(b as u64, false).into(),
            (Const::Int(i), BasicTypeEnum::IntType(it)) => it.const_int(i as u64, true).into(),
            (Const::Float(f), BasicTypeEnum::FloatType(ft)) => ft.const_float(f).into(),
            _ => unreachable!("constant types are verified"),
        }
    }

    // ---- elementwise arithmetic ----

    /// f16/bf16 arithmetic runs in f32 and rounds back, as the interpreter does.
    fn widen(&self, v: BasicValueEnum<'c>, d: DType) -> R<BasicValueEnum<'c>> {
        if matches!(d, DType::F16 | DType::BF16) {
            Ok(self
                .b
                .build_float_ext(v.into_float_value(), self.ctx.f32_type(), "")
                .map_err(|e| self.err(e))?
                .into())
        } else {
            Ok(v)
        }
    }

    fn narrow(&self, v: BasicValueEnum<'c>, d: DType) -> R<BasicValueEnum<'c>> {
        if matches!(d, DType::F16 | DType::BF16) {
            let t = llvm_type(self.ctx, d).into_float_type();
            Ok(self
                .b
                .build_float_trunc(v.into_float_value(), t, "")
                .map_err(|e| self.err(e))?
                .into())
        } else {
            Ok(v)
        }
    }

    fn binary(
        &self,
        op: BinOp,
        d: DType,
        a: BasicValueEnum<'c>,
        b: BasicValueEnum<'c>,
    ) -> R<BasicValueEnum<'c>> {
        let bl = &self.b;
        if d.is_float() {
            let (x, y) = (
                self.widen(a, d)?.into_float_value(),
                self.widen(b, d)?.into_float_value(),
            );
            let f32t = self.ctx.f32_type().into();
            let r: BasicValueEnum = match op {
                BinOp::Add => contract(bl.build_float_add(x, y, "").map_err(|x| self.err(x))?),
                BinOp::Sub => contract(bl.build_float_sub(x, y, "").map_err(|x| self.err(x))?),
                BinOp::Mul => contract(bl.build_float_mul(x, y, "").map_err(|x| self.err(x))?),
                BinOp::Div => bl
                    .build_float_div(x, y, "")
                    .map_err(|x| self.err(x))?
                    .into(),
                BinOp::Min => self.call("llvm.minnum.f32", f32t, &[x.into(), y.into()])?,
                BinOp::Max => self.call("llvm.maxnum.f32", f32t, &[x.into(), y.into()])?,
                _ => unreachable!("verified: integer-only op"),
            };
            return self.narrow(r, d);
        }
        let (x, y) = (a.into_int_value(), b.into_int_value());
        let signed = d.is_signed();
        let r = match op {
            BinOp::Add => bl.build_int_add(x, y, ""),
            BinOp::Sub => bl.build_int_sub(x, y, ""),
            BinOp::Mul => bl.build_int_mul(x, y, ""),
            BinOp::Div if signed => bl.build_int_signed_div(x, y, ""),
            BinOp::Div => bl.build_int_unsigned_div(x, y, ""),
            BinOp::Rem if signed => bl.build_int_signed_rem(x, y, ""),
            BinOp::Rem => bl.build_int_unsigned_rem(x, y, ""),
            BinOp::Min | BinOp::Max => {
                let pred = match (op == BinOp::Min, signed) {
                    (true, true) => IntPredicate::SLT,
                    (true, false) => IntPredicate::ULT,
                    (false, true) => IntPredicate::SGT,
                    (false, false) => IntPredicate::UGT,
                };
                let c = bl
                    .build_int_compare(pred, x, y, "")
                    .map_err(|x| self.err(x))?;
                return bl.build_select(c, x, y, "").map_err(|x| self.err(x));
            }
            BinOp::And => bl.build_and(x, y, ""),
            BinOp::Or => bl.build_or(x, y, ""),
            BinOp::Xor => bl.build_xor(x, y, ""),
            BinOp::Shl => bl.build_left_shift(x, y, ""),
            BinOp::Shr => bl.build_right_shift(x, y, signed, ""),
        };
        Ok(r.map_err(|x| self.err(x))?.into())
    }

    fn compare(
        &self,
        op: CmpOp,
        d: DType,
        a: BasicValueEnum<'c>,
        b: BasicValueEnum<'c>,
    ) -> R<BasicValueEnum<'c>> {
        if d.is_float() {
            let p = match op {
                CmpOp::Eq => FloatPredicate::OEQ,
                CmpOp::Ne => FloatPredicate::UNE,
                CmpOp::Lt => FloatPredicate::OLT,
                CmpOp::Le => FloatPredicate::OLE,
                CmpOp::Gt => FloatPredicate::OGT,
                CmpOp::Ge => FloatPredicate::OGE,
            };
            let (x, y) = (
                self.widen(a, d)?.into_float_value(),
                self.widen(b, d)?.into_float_value(),
            );
            return Ok(self
                .b
                .build_float_compare(p, x, y, "")
                .map_err(|x| self.err(x))?
                .into());
        }
        let s = d.is_signed();
        let p = match op {
            CmpOp::Eq => IntPredicate::EQ,
            CmpOp::Ne => IntPredicate::NE,
            CmpOp::Lt if s => IntPredicate::SLT,
            CmpOp::Lt => IntPredicate::ULT,
            CmpOp::Le if s => IntPredicate::SLE,
            CmpOp::Le => IntPredicate::ULE,
            CmpOp::Gt if s => IntPredicate::SGT,
            CmpOp::Gt => IntPredicate::UGT,
            CmpOp::Ge if s => IntPredicate::SGE,
            CmpOp::Ge => IntPredicate::UGE,
        };
        Ok(self
            .b
            .build_int_compare(p, a.into_int_value(), b.into_int_value(), "")
            .map_err(|x| self.err(x))?
            .into())
    }

    fn unary(&self, op: UnOp, d: DType, a: BasicValueEnum<'c>) -> R<BasicValueEnum<'c>> {
        if d.is_float() {
            let x = self.widen(a, d)?;
            let f32t: BasicTypeEnum = self.ctx.f32_type().into();
            let r = match op {
                UnOp::Neg => self
                    .b
                    .build_float_neg(x.into_float_value(), "")
                    .map_err(|x| self.err(x))?
                    .into(),
                UnOp::Abs => self.call("llvm.fabs.f32", f32t, &[x])?,
                UnOp::Exp2 => self.call("llvm.nvvm.ex2.approx.f", f32t, &[x])?,
                UnOp::Log2 => self.call("llvm.nvvm.lg2.approx.f", f32t, &[x])?,
                UnOp::Sqrt => self.call("llvm.sqrt.f32", f32t, &[x])?,
                UnOp::Rsqrt => self.call("llvm.nvvm.rsqrt.approx.f", f32t, &[x])?,
                UnOp::Not => unreachable!("verified"),
            };
            return self.narrow(r, d);
        }
        let x = a.into_int_value();
        let r = match op {
            UnOp::Neg => self.b.build_int_neg(x, ""),
            UnOp::Not => self.b.build_not(x, ""),
            UnOp::Abs => {
                if !d.is_signed() {
                    return Ok(a);
                }
                let n = self.b.build_int_neg(x, "").map_err(|x| self.err(x))?;
                let c = self
                    .b
                    .build_int_compare(IntPredicate::SLT, x, x.get_type().const_zero(), "")
                    .map_err(|x| self.err(x))?;
                return self.b.build_select(c, n, x, "").map_err(|x| self.err(x));
            }
            _ => unreachable!("verified"),
        };
        Ok(r.map_err(|x| self.err(x))?.into())
    }

    fn cast(&self, a: BasicValueEnum<'c>, from: DType, to: DType) -> R<BasicValueEnum<'c>> {
        let b = &self.b;
        if from == to {
            return Ok(a);
        }
        let tt = llvm_type(self.ctx, to);
        if to == DType::Bool {
            return Ok(if from.is_float() {
                let x = self.widen(a, from)?.into_float_value();
                b.build_float_compare(FloatPredicate::UNE, x, x.get_type().const_zero(), "")
                    .map_err(|x| self.err(x))?
                    .into()
            } else {
                let x = a.into_int_value();
                b.build_int_compare(IntPredicate::NE, x, x.get_type().const_zero(), "")
                    .map_err(|x| self.err(x))?
                    .into()
            });
        }
        match (from.is_float(), to.is_float()) {
            (true, true) => {
                let x = self.widen(a, from)?;
                self.narrow(x, to)
            }
            (false, false) => {
                let x = a.into_int_value();
                let it = tt.into_int_type();
                Ok(if it.get_bit_width() < x.get_type().get_bit_width() {
                    b.build_int_truncate(x, it, "")
                        .map_err(|x| self.err(x))?
                        .into()
                } else if from.is_signed() {
                    b.build_int_s_extend(x, it, "")
                        .map_err(|x| self.err(x))?
                        .into()
                } else {
                    b.build_int_z_extend(x, it, "")
                        .map_err(|x| self.err(x))?
                        .into()
                })
            }
            (false, true) => {
                let x = a.into_int_value();
                let f32t = self.ctx.f32_type();
                let r: BasicValueEnum = if matches!(from, DType::U8 | DType::Bool) {
                    // Small unsigned ints: place the bits in a float's mantissa (2^23 + x) and
                    // subtract 2^23, exact and cheaper than a conversion instruction.
                    let w = b
                        .build_int_z_extend(x, self.ctx.i32_type(), "")
                        .map_err(|x| self.err(x))?;
                    let w = b
                        .build_or(w, self.i32c(0x4B00_0000), "")
                        .map_err(|x| self.err(x))?;
                    let f = b
                        .build_bit_cast(w, f32t, "")
                        .map_err(|x| self.err(x))?
                        .into_float_value();
                    b.build_float_sub(f, f32t.const_float(8_388_608.0), "")
                        .map_err(|x| self.err(x))?
                        .into()
                } else {
                    b.build_signed_int_to_float(x, f32t, "")
                        .map_err(|x| self.err(x))?
                        .into()
                };
                self.narrow(r, to)
            }
            (true, false) => {
                let x = self.widen(a, from)?;
                let it = tt.into_int_type();
                let name = format!("llvm.fptosi.sat.i{}.f32", it.get_bit_width());
                let name = if to == DType::U8 {
                    "llvm.fptoui.sat.i8.f32".to_string()
                } else {
                    name
                };
                self.call(&name, tt, &[x])
            }
        }
    }

    // ---- layout plumbing ----

    /// The elements of `v` rearranged from its layout to `to`, through shared memory.
    fn convert(&mut self, v: ValueId, to: &Layout) -> R<Vec<BasicValueEnum<'c>>> {
        let from = self.layouts.get(v).clone();
        let t = self.ty_of(v).clone();
        self.convert_elems(self.elems(v), &t, &from, to)
    }

    fn convert_elems(
        &mut self,
        xs: Vec<BasicValueEnum<'c>>,
        t: &Type,
        from: &Layout,
        to: &Layout,
    ) -> R<Vec<BasicValueEnum<'c>>> {
        if from.equivalent(to) {
            return Ok(xs);
        }
        let d = t
            .elem
            .dtype()
            .ok_or_else(|| self.err("layout conversion of pointers is not supported"))?;
        let stored = if d == DType::Bool { DType::U8 } else { d };
        let st = llvm_type(self.ctx, stored);
        let n1 = if t.shape.len() == 2 { t.shape[1] } else { 1 };
        let linear = |s: &Self, c: &[IntValue<'c>]| -> R<IntValue<'c>> {
            if c.len() == 2 {
                let r =
                    s.b.build_int_mul(c[0], s.i32c(n1 as i64), "")
                        .map_err(|e| s.err(e))?;
                s.b.build_int_add(r, c[1], "").map_err(|e| s.err(e))
            } else {
                Ok(c[0])
            }
        };
        let owner = self.owner(from)?;
        let src = self.slot_coords(from)?;
        for (x, c) in xs.iter().zip(&src) {
            let i = linear(self, c)?;
            let x = if d == DType::Bool {
                self.b
                    .build_int_z_extend(x.into_int_value(), self.ctx.i8_type(), "")
                    .map_err(|e| self.err(e))?
                    .into()
            } else {
                *x
            };
            let p = self.smem_ptr(st, i)?;
            self.guarded(owner, |s| {
                s.b.build_store(p, x).map_err(|e| s.err(e))?;
                Ok(())
            })?;
        }
        self.barrier()?;
        let mut out = vec![];
        for c in self.slot_coords(to)? {
            let i = linear(self, &c)?;
            let p = self.smem_ptr(st, i)?;
            let x = self.b.build_load(st, p, "").map_err(|e| self.err(e))?;
            out.push(if d == DType::Bool {
                self.cast(x, DType::U8, DType::Bool)?
            } else {
                x
            });
        }
        self.barrier()?;
        Ok(out)
    }

    fn smem_ptr(&self, elem: BasicTypeEnum<'c>, index: IntValue<'c>) -> R<PointerValue<'c>> {
        let g = self
            .smem
            .ok_or_else(|| self.err("shared memory was not reserved"))?;
        // SAFETY: indices stay within the reservation computed by `shared_bytes`.
        unsafe { self.b.build_gep(elem, g.as_pointer_value(), &[index], "") }
            .map_err(|e| self.err(e))
    }

    /// `bar.sync 0`; none when the instruction just before is one (two shared-memory writes
    /// in a row, each between barriers, share the one between them).
    fn barrier(&self) -> R<()> {
        let f = self.intrinsic(
            "llvm.nvvm.barrier0",
            self.ctx.void_type().fn_type(&[], false),
        );
        let last = self
            .b
            .get_insert_block()
            .and_then(|bb| bb.get_last_instruction());
        let callee = f.as_global_value().as_pointer_value().as_value_ref();
        let just_synced = last.is_some_and(|i| {
            i.get_opcode() == InstructionOpcode::Call
                && i.get_operand(i.get_num_operands() - 1)
                    .and_then(|o| o.value())
                    .is_some_and(|v| v.as_value_ref() == callee)
        });
        if !just_synced {
            self.b.build_call(f, &[], "").map_err(|e| self.err(e))?;
        }
        Ok(())
    }

    /// Runs `body` only where `cond` holds (always when `None`).
    fn guarded(&self, cond: Option<IntValue<'c>>, body: impl FnOnce(&Self) -> R<()>) -> R<()> {
        let Some(c) = cond else { return body(self) };
        let then_bb = self.ctx.append_basic_block(self.func, "guard");
        let cont = self.ctx.append_basic_block(self.func, "guard_end");
        self.b
            .build_conditional_branch(c, then_bb, cont)
            .map_err(|e| self.err(e))?;
        self.b.position_at_end(then_bb);
        body(self)?;
        self.b
            .build_unconditional_branch(cont)
            .map_err(|e| self.err(e))?;
        self.b.position_at_end(cont);
        Ok(())
    }

    fn expand(&mut self, v: ValueId, axis: usize, res: ValueId) -> R<Cv<'c>> {
        let Layout::Blocked(rl) = self.layouts.get(res).clone() else {
            return Err(self.err("expand result must have a blocked layout"));
        };
        let want = Layout::Slice {
            parent: rl.clone(),
            dim: axis,
        };
        let xs = self.convert(v, &want)?;
        let mut out = vec![];
        for s in 0..Layout::Blocked(rl.clone()).slots() {
            let idx = Self::split_slot(&rl, s);
            out.push(xs[idx[1 - axis]]);
        }
        Ok(Cv::B(out))
    }

    // ---- tensor cores ----

    /// `dot_int4` as `mma.sync.m16n8k16` (f16 in, f32 accumulate). The order in which the
    /// reduction walks the head dimension is free, so each thread feeds the A fragment
    /// straight from the codes it loaded: the two row slots of a pair of repetitions are the
    /// tile's rows g and g + 8, and its 16-bit pairs are elements (i, i + 4) of a word, which
    /// the magic-number trick turns into exact f16 (see `code_pair`). q's B fragment takes
    /// the same elements.
    fn dot_int4(&mut self, codes: ValueId, q: ValueId, res: ValueId) -> R<Cv<'c>> {
        let (Layout::Blocked(cl), Layout::Blocked(ql), Layout::Blocked(rl)) = (
            self.layouts.get(codes).clone(),
            self.layouts.get(q).clone(),
            self.layouts.get(res).clone(),
        ) else {
            return Err(self.err("dot_int4 operands need blocked layouts"));
        };
        let w = cl.shape[1];
        let per = w / 4;
        let fits = cl.size_per_thread == [1, per]
            && cl.threads_per_warp == [8, 4]
            && cl.warps_per_cta[1] == 1
            && ql.size_per_thread == [1, 2 * w]
            && ql.threads_per_warp == [8, 4]
            && ql.warps_per_cta[1] == 1
            && rl.size_per_thread == [1, 2]
            && rl.threads_per_warp == [8, 4]
            && rl.warps_per_cta == cl.warps_per_cta
            && cl.per_thread(0) % 2 == 0;
        if !fits {
            return Err(self.err(format!(
                "dot_int4 needs {} rows to be a multiple of 16 per warp (codes {:?}, q {:?}, result {:?})",
                cl.shape[0], cl, ql, rl
            )));
        }
        let (cs, qs) = (self.elems(codes), self.elems(q));
        let i32t = self.ctx.i32_type();
        let f32t = self.ctx.f32_type();
        let h2 = self.ctx.f16_type().vec_type(2);
        let e = |s: &Self, x: inkwell::builder::BuilderError| s.err(x);
        // q's B fragment for half-pair h: elements (8(h/4) + h%4, +4) of the thread's quarter.
        let pack_q = |s: &Self, h: usize| -> R<BasicValueEnum<'c>> {
            let j = 8 * (h / 4) + h % 4;
            let v = h2.get_undef();
            let v =
                s.b.build_insert_element(v, qs[j], s.i32c(0), "")
                    .map_err(|x| e(s, x))?;
            let v =
                s.b.build_insert_element(v, qs[j + 4], s.i32c(1), "")
                    .map_err(|x| e(s, x))?;
            s.b.build_bit_cast(v, i32t, "").map_err(|x| e(s, x))
        };
        // Pair i of a word holds its nibbles i and i + 4 (bits 4i and 16 + 4i). One LOP3
        // each, `(x & mask) | 0x64006400`, makes an f16 pair exactly 1024 + code (pairs 0
        // and 2, mask 0x000F000F; pair 2 of the word shifted by 8) or 1024 + 16 code (pairs 1
        // and 3, mask 0x00F000F0), which one HADD2 (minus 1024) or one HFMA2 (times 1/16,
        // minus 64) turns into the code: 1.25 instructions a code, one shift a word.
        let k = |v: f64| self.ctx.f16_type().const_float(v);
        let splat2 = |v: f64| inkwell::types::VectorType::const_vector(&[k(v), k(v)]);
        let (bias, sixteenth, bias16) = (splat2(-1024.0), splat2(1.0 / 16.0), splat2(-64.0));
        let lop3_t = i32t.fn_type(&[i32t.into(); 3], false);
        let lop3 = self.ctx.create_inline_asm(
            lop3_t,
            "lop3.b32 $0, $1, $2, $3, 0xEA;".to_string(),
            "=r,r,n,n".to_string(),
            false,
            false,
            None,
            false,
        );
        let fma = self.intrinsic(
            "llvm.fma.v2f16",
            h2.fn_type(&[h2.into(), h2.into(), h2.into()], false),
        );
        let code_pair = |s: &Self, word: BasicValueEnum<'c>, i: usize| -> R<BasicValueEnum<'c>> {
            let x = word.into_int_value();
            let x = if i >= 2 {
                s.b.build_right_shift(x, i32t.const_int(8, false), false, "")
                    .map_err(|y| e(s, y))?
            } else {
                x
            };
            let mask = if i.is_multiple_of(2) {
                0x000F_000F
            } else {
                0x00F0_00F0
            };
            let args = [
                x.into(),
                i32t.const_int(mask, false).into(),
                i32t.const_int(0x6400_6400, false).into(),
            ];
            let x =
                s.b.build_indirect_call(lop3_t, lop3, &args, "")
                    .map_err(|y| e(s, y))?
                    .try_as_basic_value()
                    .basic()
                    .expect("lop3 value");
            let f =
                s.b.build_bit_cast(x, h2, "")
                    .map_err(|y| e(s, y))?
                    .into_vector_value();
            let f: BasicValueEnum<'c> = if i.is_multiple_of(2) {
                s.b.build_float_add(f, bias, "")
                    .map_err(|y| e(s, y))?
                    .into()
            } else {
                s.b.build_call(fma, &[f.into(), sixteenth.into(), bias16.into()], "")
                    .map_err(|y| e(s, y))?
                    .try_as_basic_value()
                    .basic()
                    .expect("fma value")
            };
            s.b.build_bit_cast(f, i32t, "").map_err(|y| e(s, y))
        };
        let slices = w / 2;
        let b_frags: Vec<(BasicValueEnum<'c>, BasicValueEnum<'c>)> = (0..slices)
            .map(|s| Ok((pack_q(self, 2 * s)?, pack_q(self, 2 * s + 1)?)))
            .collect::<R<_>>()?;
        let mut out = vec![];
        for m in 0..cl.per_thread(0) / 2 {
            let word = |rep: usize, h: usize| cs[rep * per + h / 4];
            let mut acc: Vec<BasicValueEnum<'c>> = vec![f32t.const_zero().into(); 4];
            for (s, (b0, b1)) in b_frags.iter().enumerate() {
                let (h0, h1) = (2 * s, 2 * s + 1);
                let a = [
                    code_pair(self, word(2 * m, h0), h0 % 4)?,
                    code_pair(self, word(2 * m + 1, h0), h0 % 4)?,
                    code_pair(self, word(2 * m, h1), h1 % 4)?,
                    code_pair(self, word(2 * m + 1, h1), h1 % 4)?,
                ];
                acc = self.mma("m16n8k16", DType::F16, &a, &[*b0, *b1], &acc)?;
            }
            out.extend(acc);
        }
        Ok(Cv::B(out))
    }

    /// Two f16 (or bf16) values packed in one 32-bit register, `lo` first.
    fn pack2(
        &self,
        lo: BasicValueEnum<'c>,
        hi: BasicValueEnum<'c>,
        d: DType,
    ) -> R<BasicValueEnum<'c>> {
        let et = llvm_type(self.ctx, d).into_float_type();
        let v = et.vec_type(2).get_undef();
        let v = self
            .b
            .build_insert_element(v, lo, self.i32c(0), "")
            .map_err(|e| self.err(e))?;
        let v = self
            .b
            .build_insert_element(v, hi, self.i32c(1), "")
            .map_err(|e| self.err(e))?;
        self.b
            .build_bit_cast(v, self.ctx.i32_type(), "")
            .map_err(|e| self.err(e))
    }

    /// One `mma.sync` with f32 accumulators: `shape` is `m16n8k16` (4 registers of A, 2 of
    /// B) or `m16n8k8` (2 and 1); returns the 4 accumulators.
    fn mma(
        &self,
        shape: &str,
        d: DType,
        a: &[BasicValueEnum<'c>],
        b: &[BasicValueEnum<'c>],
        acc: &[BasicValueEnum<'c>],
    ) -> R<Vec<BasicValueEnum<'c>>> {
        let i32t = self.ctx.i32_type();
        let f32t = self.ctx.f32_type();
        let acc_t = self.ctx.struct_type(&[f32t.into(); 4], false);
        let mut arg_tys: Vec<inkwell::types::BasicMetadataTypeEnum> =
            vec![i32t.into(); a.len() + b.len()];
        arg_tys.extend([inkwell::types::BasicMetadataTypeEnum::from(f32t); 4]);
        let fn_t = acc_t.fn_type(&arg_tys, false);
        let regs = |from: usize, n: usize| -> String {
            (from..from + n)
                .map(|i| format!("${i}"))
                .collect::<Vec<_>>()
                .join(",")
        };
        let (na, nb) = (a.len(), b.len());
        let ty = d.name();
        let text = format!(
            "mma.sync.aligned.{shape}.row.col.f32.{ty}.{ty}.f32 {{$0,$1,$2,$3}}, {{{}}}, {{{}}}, {{{}}};",
            regs(4, na),
            regs(4 + na, nb),
            regs(4 + na + nb, 4)
        );
        let mut cons = "=f,=f,=f,=f".to_string();
        cons += &",r".repeat(na + nb);
        cons += ",0,1,2,3";
        let asm = self
            .ctx
            .create_inline_asm(fn_t, text, cons, false, false, None, false);
        let args: Vec<BasicMetadataValueEnum> =
            a.iter().chain(b).chain(acc).map(|x| (*x).into()).collect();
        let call = self
            .b
            .build_indirect_call(fn_t, asm, &args, "")
            .map_err(|e| self.err(e))?;
        let st = call
            .try_as_basic_value()
            .basic()
            .expect("mma result")
            .into_struct_value();
        (0..4)
            .map(|i| {
                self.b
                    .build_extract_value(st, i, "")
                    .map_err(|e| self.err(e))
            })
            .collect()
    }

    /// Whether `bl` spreads a `[rows, cols]` block as the fragments of `mma.sync` need: 8
    /// lanes down, 4 across, `spt` elements a thread along the row, and every warp holding
    /// rows `g + 8i` of its lane group `g` (one warp, or replicas of it).
    fn fragment_layout(bl: &Blocked, spt: usize) -> bool {
        bl.size_per_thread == [1, spt]
            && bl.threads_per_warp == [8, 4]
            && bl.warps_per_cta[1] == 1
            && bl.per_thread(0) * 8 == bl.shape[0]
            && bl.per_thread(1) == spt
    }

    fn dot_layouts(&self, a: ValueId, b: ValueId, res: ValueId) -> R<(Blocked, Blocked, Blocked)> {
        match (
            self.layouts.get(a).clone(),
            self.layouts.get(b).clone(),
            self.layouts.get(res).clone(),
        ) {
            (Layout::Blocked(al), Layout::Blocked(bl), Layout::Blocked(rl)) => Ok((al, bl, rl)),
            _ => Err(self.err("dot operands need blocked layouts")),
        }
    }

    /// `dot` (`a . b^T`) as `mma.sync.m16n8k16`: `a`'s rows are the rows of A (padded to 16
    /// with zeros), `b`'s rows the columns of B. The order in which the sum walks K is free,
    /// so each thread's own quarter of a row (4 elements a step) is its fragment of both
    /// operands, packed in pairs as loaded: no data moves between threads.
    fn dot(&mut self, a: ValueId, b: ValueId, c: Option<ValueId>, res: ValueId) -> R<Cv<'c>> {
        let (al, bl, rl) = self.dot_layouts(a, b, res)?;
        let (m, kd) = (al.shape[0], al.shape[1]);
        let d = self.ty_of(a).elem.dtype().expect("verified");
        if !(Self::fragment_layout(&al, kd / 4)
            && Self::fragment_layout(&bl, kd / 4)
            && Self::fragment_layout(&rl, 2))
        {
            return Err(self.err(format!(
                "dot needs every warp to hold whole fragments (a {al:?}, b {bl:?}, result {rl:?}): \
                 one warp a program, or operands small enough to be replicated"
            )));
        }
        let (xa, xb) = (self.elems(a), self.elems(b));
        let q = kd / 4;
        let zero = self.ctx.i32_type().const_zero().into();
        let mut acc: Vec<BasicValueEnum<'c>> = vec![self.ctx.f32_type().const_zero().into(); 4];
        if let Some(c) = c {
            // The result's slots in order: row g's pair, then (M 16) row g + 8's.
            for (i, x) in self.elems(c).into_iter().enumerate() {
                acc[i] = x;
            }
        }
        for s in 0..kd / 16 {
            let pair = |l: &Self, x: &[BasicValueEnum<'c>], row: usize, j: usize| {
                l.pack2(x[row * q + 4 * s + j], x[row * q + 4 * s + j + 1], d)
            };
            let hi = |l: &Self, j: usize| -> R<BasicValueEnum<'c>> {
                if m == 16 {
                    pair(l, &xa, 1, j)
                } else {
                    Ok(zero)
                }
            };
            let ra = [
                pair(self, &xa, 0, 0)?,
                hi(self, 0)?,
                pair(self, &xa, 0, 2)?,
                hi(self, 2)?,
            ];
            let rb = [pair(self, &xb, 0, 0)?, pair(self, &xb, 0, 2)?];
            acc = self.mma("m16n8k16", d, &ra, &rb, &acc)?;
        }
        if m == 8 {
            acc.truncate(2);
        }
        Ok(Cv::B(acc))
    }

    /// `dot_ta` (`a^T . b^T`, `a` `[8, M]`) as `mma.sync.m16n8k8` over M/16 tiles of rows.
    /// A is `a` transposed, read with `ldmatrix .trans`, which hands every thread its A
    /// fragment: rows `16i + g` and `16i + 8 + g`, exactly the result rows its blocked
    /// layout owns. Where `a` is a tile of shared memory ([`OpKind::LoadTile`]) its
    /// fragments were read from the tile already; otherwise each warp writes its `a` to its
    /// slice of shared memory first. `b` (`[8, 8]`, pairs of columns a thread) is the B
    /// fragment as it stands.
    fn dot_ta(&mut self, a: ValueId, b: ValueId, c: Option<ValueId>, res: ValueId) -> R<Cv<'c>> {
        let (al, bl, rl) = self.dot_layouts(a, b, res)?;
        let m = al.shape[1];
        let d = self.ty_of(a).elem.dtype().expect("verified");
        if !(Self::fragment_layout(&bl, 2) && Self::fragment_layout(&rl, 2)) {
            return Err(self.err(format!(
                "dot_ta needs every warp to hold whole fragments (b {bl:?}, result {rl:?}): \
                 one warp a program"
            )));
        }
        let mats = match self.ta_frags.get(&a) {
            Some(f) => f.clone(),
            None => self.stage_transposed(a, &al, d)?,
        };
        let xb = self.elems(b);
        let rb = [self.pack2(xb[0], xb[1], d)?];
        let zero: BasicValueEnum<'c> = self.ctx.f32_type().const_zero().into();
        let init = match c {
            Some(c) => self.elems(c),
            None => vec![zero; m / 4],
        };
        let mut out = vec![];
        for i in 0..m / 16 {
            let ra = [mats[2 * i], mats[2 * i + 1]];
            out.extend(self.mma("m16n8k8", d, &ra, &rb, &init[4 * i..4 * i + 4])?);
        }
        Ok(Cv::B(out))
    }

    /// The A fragments of `dot_ta` from `a` in registers: the warp writes `a` to its slice
    /// of the scratch, then reads it back transposed.
    fn stage_transposed(
        &mut self,
        a: ValueId,
        al: &Blocked,
        d: DType,
    ) -> R<Vec<BasicValueEnum<'c>>> {
        let m = al.shape[1];
        if !Self::fragment_layout(al, m / 4) {
            return Err(self.err(format!(
                "dot_ta needs every warp to hold whole fragments of a ({al:?}): one warp a \
                 program"
            )));
        }
        let g = self
            .dot_smem
            .ok_or_else(|| self.err("dot scratch was not reserved"))?;
        let xa = self.elems(a);
        let e = |l: &Self, x: inkwell::builder::BuilderError| l.err(x);
        let i8t = self.ctx.i8_type();
        let row_bytes = dot_row_bytes(m) as i64;
        // This warp's slice, and the thread's row (g) and quarter (c) in it.
        let at = |l: &Self, off: IntValue<'c>| -> R<PointerValue<'c>> {
            // SAFETY: offsets stay within the warp's slice of `dot_scratch_bytes`.
            unsafe { l.b.build_gep(i8t, g.as_pointer_value(), &[off], "") }.map_err(|x| e(l, x))
        };
        let mul = |l: &Self, x: IntValue<'c>, c: i64| l.b.build_int_mul(x, l.i32c(c), "");
        let add = |l: &Self, x: IntValue<'c>, y: IntValue<'c>| l.b.build_int_add(x, y, "");
        let slice = mul(self, self.warp, 8 * row_bytes).map_err(|x| e(self, x))?;
        let lg = self
            .b
            .build_right_shift(self.lane, self.i32c(2), false, "")
            .map_err(|x| e(self, x))?;
        let lc = self
            .b
            .build_and(self.lane, self.i32c(3), "")
            .map_err(|x| e(self, x))?;
        let row = mul(self, lg, row_bytes).map_err(|x| e(self, x))?;
        let col = mul(self, lc, (m / 4 * 2) as i64).map_err(|x| e(self, x))?;
        let mine = add(self, slice, row).map_err(|x| e(self, x))?;
        let mine = add(self, mine, col).map_err(|x| e(self, x))?;
        let et = llvm_type(self.ctx, d).into_float_type();
        let v8 = et.vec_type(8);
        for (i, chunk) in xa.chunks(8).enumerate() {
            let mut v = v8.get_undef();
            for (j, x) in chunk.iter().enumerate() {
                v = self
                    .b
                    .build_insert_element(v, *x, self.i32c(j as i64), "")
                    .map_err(|x| e(self, x))?;
            }
            let off = add(self, mine, self.i32c(16 * i as i64)).map_err(|x| e(self, x))?;
            let p = at(self, off)?;
            let st = self.b.build_store(p, v).map_err(|x| e(self, x))?;
            st.set_alignment(16).map_err(|x| self.err(x))?;
        }
        self.warp_sync()?;
        let lrow = self
            .b
            .build_and(self.lane, self.i32c(7), "")
            .map_err(|x| e(self, x))?;
        let lmat = self
            .b
            .build_right_shift(self.lane, self.i32c(3), false, "")
            .map_err(|x| e(self, x))?;
        let src = mul(self, lrow, row_bytes).map_err(|x| e(self, x))?;
        let src = add(self, slice, src).map_err(|x| e(self, x))?;
        let mat_off = mul(self, lmat, 16).map_err(|x| e(self, x))?;
        let src = add(self, src, mat_off).map_err(|x| e(self, x))?;
        let mats = self.ldmatrix_trans(g.as_pointer_value(), src, m)?;
        // The next writer of the slice waits for every lane's reads.
        self.warp_sync()?;
        Ok(mats)
    }

    /// `bar.warp.sync`: the warp's shared-memory accesses before it are seen by its lanes
    /// after it.
    fn warp_sync(&self) -> R<()> {
        self.asm_statement("bar.warp.sync -1;", "~{memory}")
    }

    /// The A fragments of `dot_ta` for an `[8, M]` block of shared memory at byte `lane_off`
    /// of `base` for this lane: lane L gives row L % 8 of matrix L / 8, whose columns
    /// 8(L / 8).. start there. `ldmatrix .x4 .trans` of each 32 columns; matrix j holds
    /// columns 8j..8j+8 of the eight rows and comes back as the fragment rows 8j + g.
    fn ldmatrix_trans(
        &self,
        base: PointerValue<'c>,
        lane_off: IntValue<'c>,
        m: usize,
    ) -> R<Vec<BasicValueEnum<'c>>> {
        let e = |x: inkwell::builder::BuilderError| self.err(x);
        let i32t = self.ctx.i32_type();
        let i64t = self.ctx.i64_type();
        let quad_t = self.ctx.struct_type(&[i32t.into(); 4], false);
        let ld_t = quad_t.fn_type(&[i64t.into()], false);
        let ld = self.ctx.create_inline_asm(
            ld_t,
            "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {$0,$1,$2,$3}, [$4];".to_string(),
            "=r,=r,=r,=r,l,~{memory}".to_string(),
            true,
            false,
            None,
            false,
        );
        let mut mats = vec![];
        for p in 0..m / 32 {
            let off = self
                .b
                .build_int_add(lane_off, self.i32c(64 * p as i64), "")
                .map_err(e)?;
            // SAFETY: 64 bytes a step inside the `[8, M]` block.
            let ptr =
                unsafe { self.b.build_gep(self.ctx.i8_type(), base, &[off], "") }.map_err(e)?;
            let addr = self.b.build_ptr_to_int(ptr, i64t, "").map_err(e)?;
            let call = self
                .b
                .build_indirect_call(ld_t, ld, &[addr.into()], "")
                .map_err(e)?;
            let st = call
                .try_as_basic_value()
                .basic()
                .expect("ldmatrix result")
                .into_struct_value();
            for j in 0..4 {
                mats.push(self.b.build_extract_value(st, j, "").map_err(e)?);
            }
        }
        Ok(mats)
    }

    // ---- asynchronous copies and shared tiles ----

    /// A statement of the `cp.async` family, kept in place (volatile, touching memory).
    fn async_asm(&mut self, text: &str) -> R<()> {
        if self.sm < 80 {
            return Err(self.err(format!(
                "{text} needs sm_80 or newer (target sm_{})",
                self.sm
            )));
        }
        self.asm_statement(text, "~{memory}")
    }

    /// Every thread's shared-memory accesses before it seen by every thread after it: a
    /// `bar.sync` (one warp: `bar.warp.sync`).
    fn program_sync(&self) -> R<()> {
        if self.k.num_warps == 1 {
            self.warp_sync()
        } else {
            self.barrier()
        }
    }

    /// [`OpKind::AsyncCopy`]: after a barrier (earlier reads of the destination done), one
    /// `cp.async` per run of 4, 8 or 16 contiguous bytes of the thread's elements (`.cg`,
    /// past L1, for 16 bytes; `.ca` below), reading 0 bytes (so writing zeros) where the
    /// mask is false.
    fn async_copy(&mut self, dst: ValueId, src: ValueId, mask: Option<ValueId>) -> R<()> {
        let d = self.ty_of(src).elem.pointee().expect("verified");
        let esize = d.size_bytes();
        let l = self.layouts.get(src).clone();
        let vw = self
            .vector_width(src, mask, &l, esize)
            .min(self.vector_width(dst, None, &l, esize));
        let bytes = vw * esize;
        if !matches!(bytes, 4 | 8 | 16) {
            return Err(self.err(format!(
                "async_copy moves runs of 4, 8 or 16 contiguous bytes a thread; the pointers \
                 known here give runs of {bytes} (make the offsets of a thread's elements \
                 contiguous and aligned)"
            )));
        }
        if self.sm < 80 {
            return Err(self.err(format!(
                "async_copy needs sm_80 or newer (target sm_{})",
                self.sm
            )));
        }
        self.program_sync()?;
        let (ds, ss) = (self.elems(dst), self.elems(src));
        let ms = mask.map(|m| self.elems(m));
        let i32t = self.ctx.i32_type();
        let i64t = self.ctx.i64_type();
        let fn_t = self
            .ctx
            .void_type()
            .fn_type(&[i64t.into(), i64t.into(), i32t.into()], false);
        let cache = if bytes == 16 { "cg" } else { "ca" };
        let asm = self.ctx.create_inline_asm(
            fn_t,
            format!("cp.async.{cache}.shared.global [$0], [$1], {bytes}, $2;"),
            "l,l,r,~{memory}".to_string(),
            true,
            false,
            None,
            false,
        );
        let e = |x: inkwell::builder::BuilderError| self.err(x);
        let full = i32t.const_int(bytes as u64, false);
        for g in (0..ss.len()).step_by(vw) {
            let to = self
                .b
                .build_ptr_to_int(ds[g].into_pointer_value(), i64t, "")
                .map_err(e)?;
            let from = self
                .b
                .build_ptr_to_int(ss[g].into_pointer_value(), i64t, "")
                .map_err(e)?;
            let size = match &ms {
                Some(m) => self
                    .b
                    .build_select(m[g].into_int_value(), full, i32t.const_zero(), "")
                    .map_err(e)?
                    .into_int_value(),
                None => full,
            };
            self.b
                .build_indirect_call(fn_t, asm, &[to.into(), from.into(), size.into()], "")
                .map_err(e)?;
        }
        Ok(())
    }

    /// [`OpKind::LoadTile`]: for a tile only `dot_ta` reads (see [`tiles_for_dot_ta`]) its
    /// A fragments by `ldmatrix .trans`, here where the tile is read; otherwise each
    /// thread's elements, in vectors where rows and base allow.
    fn load_tile(
        &mut self,
        base: ValueId,
        shape: [usize; 2],
        row_stride: usize,
        res: ValueId,
    ) -> R<Cv<'c>> {
        let d = self.ty_of(base).elem.pointee().expect("verified");
        let et = llvm_type(self.ctx, d);
        let bp = self.elems(base)[0].into_pointer_value();
        let e = |x: inkwell::builder::BuilderError| self.err(x);
        if self.ta_tiles.contains(&res) {
            let row_bytes = (row_stride * d.size_bytes()) as i64;
            let lrow = self.b.build_and(self.lane, self.i32c(7), "").map_err(e)?;
            let lmat = self
                .b
                .build_right_shift(self.lane, self.i32c(3), false, "")
                .map_err(e)?;
            let row = self
                .b
                .build_int_mul(lrow, self.i32c(row_bytes), "")
                .map_err(e)?;
            let mat = self.b.build_int_mul(lmat, self.i32c(16), "").map_err(e)?;
            let off = self.b.build_int_add(row, mat, "").map_err(e)?;
            let frags = self.ldmatrix_trans(bp, off, shape[1])?;
            self.ta_frags.insert(res, frags);
            return Ok(Cv::B(vec![]));
        }
        let l = self.layouts.get(res).clone();
        let Layout::Blocked(bl) = &l else {
            return Err(self.err("load_tile result must have a blocked layout"));
        };
        let esize = d.size_bytes();
        let base_div = self
            .axes
            .get(base)
            .map_or(1, |i| i.divisibility[0] as usize);
        let align = base_div
            .min(16)
            .min(1 << (row_stride * esize).trailing_zeros());
        let mut vw = bl.size_per_thread[1]
            .min(16 / esize)
            .min((align / esize).max(1));
        vw = 1 << (usize::BITS - 1 - vw.leading_zeros());
        let mut ps = vec![];
        for c in self.slot_coords(&l)? {
            let r = self
                .b
                .build_int_mul(c[0], self.i32c(row_stride as i64), "")
                .map_err(e)?;
            let i = self.b.build_int_add(r, c[1], "").map_err(e)?;
            // SAFETY: coordinates inside the tile the op names.
            let p = unsafe { self.b.build_gep(et, bp, &[i], "") }.map_err(e)?;
            ps.push(p.into());
        }
        let out = self.load_elems(d, &ps, None, None, vw, false)?;
        Ok(self.wrap(res, out))
    }

    // ---- memory ----

    /// Elements per vector access along the last dimension for a pointer block in layout `l`.
    fn vector_width(&self, ptr: ValueId, mask: Option<ValueId>, l: &Layout, esize: usize) -> usize {
        // Elements a thread holds contiguously along the value's last dimension.
        let (run, last) = match l {
            Layout::Blocked(bl) => (bl.size_per_thread[bl.rank() - 1], bl.rank() - 1),
            Layout::Slice { parent, dim: 0 } => (parent.size_per_thread[1], 0),
            _ => return 1,
        };
        let Some(info) = self.axes.get(ptr) else {
            return 1;
        };
        let mut v = run.min(info.contiguity[last]).min(16 / esize);
        v = v.min((info.divisibility[last] as usize / esize).max(1));
        if let Some(m) = mask {
            v = v.min(self.axes.get(m).map(|i| i.constancy[last]).unwrap_or(1));
        }
        if v == 0 {
            1
        } else {
            1 << (usize::BITS - 1 - v.leading_zeros())
        }
    }

    /// The LLVM type moved by one access of `v` elements: whole 32-bit words when possible.
    fn access_type(&self, d: DType, v: usize) -> BasicTypeEnum<'c> {
        let bytes = v * d.size_bytes();
        let et = llvm_type(self.ctx, if d == DType::Bool { DType::U8 } else { d });
        if v == 1 {
            et
        } else if bytes.is_multiple_of(4) {
            let words = (bytes / 4) as u32;
            if words == 1 {
                self.ctx.i32_type().into()
            } else {
                self.ctx.i32_type().vec_type(words).into()
            }
        } else {
            match et {
                BasicTypeEnum::IntType(t) => t.vec_type(v as u32).into(),
                BasicTypeEnum::FloatType(t) => t.vec_type(v as u32).into(),
                _ => et,
            }
        }
    }

    fn load(
        &mut self,
        ptr: ValueId,
        mask: Option<ValueId>,
        other: Option<ValueId>,
        streaming: bool,
        res: ValueId,
    ) -> R<Cv<'c>> {
        let Some(d) = self.ty_of(ptr).elem.pointee() else {
            unreachable!("verified")
        };
        let l = self.layouts.get(ptr).clone();
        let vw = self.vector_width(ptr, mask, &l, d.size_bytes());
        let ps = self.elems(ptr);
        let ms = mask.map(|m| self.elems(m));
        let os = other.map(|o| self.elems(o));
        let out = self.load_elems(d, &ps, ms.as_deref(), os.as_deref(), vw, streaming)?;
        Ok(self.wrap(res, out))
    }

    /// Loads the elements at `ps` (`vw` contiguous ones an access), `os` where `ms` is false.
    fn load_elems(
        &self,
        d: DType,
        ps: &[BasicValueEnum<'c>],
        ms: Option<&[BasicValueEnum<'c>]>,
        os: Option<&[BasicValueEnum<'c>]>,
        vw: usize,
        streaming: bool,
    ) -> R<Vec<BasicValueEnum<'c>>> {
        let esize = d.size_bytes();
        let mem_t = llvm_type(self.ctx, if d == DType::Bool { DType::U8 } else { d });
        let at = self.access_type(d, vw);
        let mut out = Vec::with_capacity(ps.len());
        for g in (0..ps.len()).step_by(vw) {
            let p = ps[g].into_pointer_value();
            let m = ms.map(|m| m[g].into_int_value());
            let raw = self.masked_load(at, p, m, vw * esize, streaming)?;
            // Split the access back into elements.
            let parts: Vec<BasicValueEnum<'c>> = if vw == 1 {
                vec![raw]
            } else if esize == 1 && vw.is_multiple_of(4) {
                self.split_bytes(raw, vw)?
            } else {
                let vt = match mem_t {
                    BasicTypeEnum::IntType(t) => t.vec_type(vw as u32),
                    BasicTypeEnum::FloatType(t) => t.vec_type(vw as u32),
                    _ => unreachable!("numbers only"),
                };
                let vec = self
                    .b
                    .build_bit_cast(raw, vt, "")
                    .map_err(|e| self.err(e))?
                    .into_vector_value();
                (0..vw)
                    .map(|i| {
                        self.b
                            .build_extract_element(vec, self.i32c(i as i64), "")
                            .map_err(|e| self.err(e))
                    })
                    .collect::<R<_>>()?
            };
            for (i, x) in parts.into_iter().enumerate() {
                let x = if d == DType::Bool {
                    self.cast(x, DType::U8, DType::Bool)?
                } else {
                    x
                };
                let x = match (m, os) {
                    (Some(m), Some(os)) => self
                        .b
                        .build_select(m, x, os[g + i], "")
                        .map_err(|e| self.err(e))?,
                    _ => x,
                };
                out.push(x);
            }
        }
        Ok(out)
    }

    /// The bytes of a loaded vector of 32-bit words, as i8 values cut out by shifts (which
    /// LLVM folds into the users' bit operations, unlike byte-vector extracts).
    fn split_bytes(&self, raw: BasicValueEnum<'c>, n: usize) -> R<Vec<BasicValueEnum<'c>>> {
        let i32t = self.ctx.i32_type();
        let words: Vec<IntValue<'c>> = if n == 4 {
            vec![raw.into_int_value()]
        } else {
            let v = raw.into_vector_value();
            (0..n / 4)
                .map(|w| {
                    Ok(self
                        .b
                        .build_extract_element(v, self.i32c(w as i64), "")
                        .map_err(|x| self.err(x))?
                        .into_int_value())
                })
                .collect::<R<_>>()?
        };
        let mut out = vec![];
        for w in words {
            for j in 0..4 {
                let s = self
                    .b
                    .build_right_shift(w, i32t.const_int(8 * j, false), false, "")
                    .map_err(|x| self.err(x))?;
                out.push(
                    self.b
                        .build_int_truncate(s, self.ctx.i8_type(), "")
                        .map_err(|x| self.err(x))?
                        .into(),
                );
            }
        }
        Ok(out)
    }

    /// One (possibly vector) load of type `at`; where `mask` is false nothing is read and
    /// the result is zero. `streaming`: see [`OpKind::Load`].
    fn masked_load(
        &self,
        at: BasicTypeEnum<'c>,
        p: PointerValue<'c>,
        mask: Option<IntValue<'c>>,
        bytes: usize,
        streaming: bool,
    ) -> R<BasicValueEnum<'c>> {
        let Some(m) = mask else {
            return self.plain_load(at, p, bytes, streaming);
        };
        let from = self.b.get_insert_block().expect("block");
        let then_bb = self.ctx.append_basic_block(self.func, "ld");
        let cont = self.ctx.append_basic_block(self.func, "ld_end");
        self.b
            .build_conditional_branch(m, then_bb, cont)
            .map_err(|x| self.err(x))?;
        self.b.position_at_end(then_bb);
        let v = self.plain_load(at, p, bytes, streaming)?;
        self.b
            .build_unconditional_branch(cont)
            .map_err(|x| self.err(x))?;
        self.b.position_at_end(cont);
        let phi = self.b.build_phi(at, "").map_err(|x| self.err(x))?;
        phi.add_incoming(&[(&v, then_bb), (&at.const_zero(), from)]);
        Ok(phi.as_basic_value())
    }

    /// An unconditional load of type `at`, `bytes` aligned. Streaming loads of one, two or
    /// four 32-bit words are `ld.global.cs` (LLVM's NVPTX backend has no cache-operator
    /// annotation; other shapes load as usual). The asm is volatile so that it stays inside
    /// its mask's branch.
    fn plain_load(
        &self,
        at: BasicTypeEnum<'c>,
        p: PointerValue<'c>,
        bytes: usize,
        streaming: bool,
    ) -> R<BasicValueEnum<'c>> {
        let i32t = self.ctx.i32_type();
        let words = match at {
            BasicTypeEnum::IntType(t) if t.get_bit_width() == 32 => Some(1),
            BasicTypeEnum::VectorType(t)
                if t.get_element_type() == i32t.into() && matches!(t.get_size(), 2 | 4) =>
            {
                Some(t.get_size())
            }
            _ => None,
        };
        let Some(words) = words.filter(|_| streaming) else {
            let v = self.b.build_load(at, p, "").map_err(|x| self.err(x))?;
            v.as_instruction_value()
                .expect("load")
                .set_alignment(bytes as u32)
                .map_err(|x| self.err(x))?;
            return Ok(v);
        };
        let i64t = self.ctx.i64_type();
        let outs: Vec<String> = (0..words).map(|i| format!("${i}")).collect();
        let (shape, list) = match words {
            1 => ("", outs[0].clone()),
            n => (
                if n == 2 { ".v2" } else { ".v4" },
                format!("{{{}}}", outs.join(",")),
            ),
        };
        let text = format!("ld.global.cs{shape}.u32 {list}, [${words}];");
        let mut constraints: Vec<&str> = vec!["=r"; words as usize];
        constraints.push("l");
        let ret = self
            .ctx
            .struct_type(&vec![i32t.into(); words as usize], false);
        let fn_t = ret.fn_type(&[i64t.into()], false);
        let asm =
            self.ctx
                .create_inline_asm(fn_t, text, constraints.join(","), true, false, None, false);
        let addr = self
            .b
            .build_ptr_to_int(p, i64t, "")
            .map_err(|x| self.err(x))?;
        let r = self
            .b
            .build_indirect_call(fn_t, asm, &[addr.into()], "")
            .map_err(|x| self.err(x))?
            .try_as_basic_value()
            .basic()
            .expect("loaded words")
            .into_struct_value();
        let parts: Vec<BasicValueEnum<'c>> = (0..words)
            .map(|i| {
                self.b
                    .build_extract_value(r, i, "")
                    .map_err(|x| self.err(x))
            })
            .collect::<R<_>>()?;
        if words == 1 {
            return Ok(parts[0]);
        }
        let vt = i32t.vec_type(words);
        let mut v = vt.get_undef();
        for (i, x) in parts.into_iter().enumerate() {
            v = self
                .b
                .build_insert_element(v, x.into_int_value(), self.i32c(i as i64), "")
                .map_err(|x| self.err(x))?;
        }
        Ok(v.into())
    }

    fn store(&mut self, ptr: ValueId, value: ValueId, mask: Option<ValueId>) -> R<()> {
        let Some(d) = self.ty_of(ptr).elem.pointee() else {
            unreachable!("verified")
        };
        // Shared memory: a barrier on each side orders the store after every thread's
        // earlier loads there and before every thread's later ones (see
        // `OpKind::SharedAlloc`). Scalar conditions are uniform, so all threads reach both.
        let shared = matches!(self.ty_of(ptr).elem, Elem::SharedPtr(_));
        if shared {
            self.barrier()?;
        }
        self.store_elements(ptr, value, mask, d)?;
        if shared {
            self.barrier()?;
        }
        Ok(())
    }

    fn store_elements(
        &mut self,
        ptr: ValueId,
        value: ValueId,
        mask: Option<ValueId>,
        d: DType,
    ) -> R<()> {
        let l = self.layouts.get(ptr).clone();
        let esize = d.size_bytes();
        let vw = self.vector_width(ptr, mask, &l, esize);
        let ps = self.elems(ptr);
        let xs = self.elems(value);
        let ms = mask.map(|m| self.elems(m));
        let owner = self.owner(&l)?;
        let mem_t = llvm_type(self.ctx, if d == DType::Bool { DType::U8 } else { d });
        let at = self.access_type(d, vw);
        for g in (0..ps.len()).step_by(vw) {
            let mut parts = vec![];
            for x in &xs[g..g + vw] {
                parts.push(if d == DType::Bool {
                    self.cast(*x, DType::Bool, DType::U8)?
                } else {
                    *x
                });
            }
            let word: BasicValueEnum = if vw == 1 {
                parts[0]
            } else {
                let vt = match mem_t {
                    BasicTypeEnum::IntType(t) => t.vec_type(vw as u32),
                    BasicTypeEnum::FloatType(t) => t.vec_type(vw as u32),
                    _ => unreachable!("numbers only"),
                };
                let mut vec = vt.get_undef();
                for (i, x) in parts.iter().enumerate() {
                    vec = self
                        .b
                        .build_insert_element(vec, *x, self.i32c(i as i64), "")
                        .map_err(|x| self.err(x))?;
                }
                self.b
                    .build_bit_cast(vec, at, "")
                    .map_err(|x| self.err(x))?
            };
            let cond = match (owner, ms.as_ref().map(|m| m[g].into_int_value())) {
                (Some(a), Some(b)) => Some(self.b.build_and(a, b, "").map_err(|x| self.err(x))?),
                (a, b) => a.or(b),
            };
            let p = ps[g].into_pointer_value();
            self.guarded(cond, |s| {
                let st = s.b.build_store(p, word).map_err(|x| s.err(x))?;
                st.set_alignment((vw * esize) as u32)
                    .map_err(|x| s.err(x))?;
                Ok(())
            })?;
        }
        Ok(())
    }

    /// Each element of `ptr` this thread owns (replicas stay silent), as an i64 address,
    /// with the condition to access it: ownership and `mask` (`None`: always).
    fn owned_addresses(
        &mut self,
        ptr: ValueId,
        mask: Option<ValueId>,
    ) -> R<Vec<(Option<IntValue<'c>>, IntValue<'c>)>> {
        let l = self.layouts.get(ptr).clone();
        let ps = self.elems(ptr);
        let ms = mask.map(|m| self.elems(m));
        let owner = self.owner(&l)?;
        let i64t = self.ctx.i64_type();
        let mut out = Vec::with_capacity(ps.len());
        for (i, p) in ps.iter().enumerate() {
            let cond = match (owner, ms.as_ref().map(|m| m[i].into_int_value())) {
                (Some(a), Some(b)) => Some(self.b.build_and(a, b, "").map_err(|x| self.err(x))?),
                (a, b) => a.or(b),
            };
            let addr = self
                .b
                .build_ptr_to_int(p.into_pointer_value(), i64t, "")
                .map_err(|x| self.err(x))?;
            out.push((cond, addr));
        }
        Ok(out)
    }

    /// [`OpKind::AtomicAdd`]: a `red.add` (relaxed; inkwell's `atomicrmw` takes integers
    /// only) of each element this thread owns (replicas stay silent) where `mask` holds;
    /// into shared memory between barriers, as a store is, a run of atomics sharing them.
    fn atomic_add(&mut self, ptr: ValueId, value: ValueId, mask: Option<ValueId>) -> R<()> {
        let Some(d) = self.ty_of(ptr).elem.pointee() else {
            unreachable!("verified")
        };
        let shared = matches!(self.ty_of(ptr).elem, Elem::SharedPtr(_));
        // The barrier first (right after another write's, the two merge), unless this add
        // continues a run of atomics: they commute, so none needs to wait for another.
        if shared && !self.atomics_open {
            self.barrier()?;
        }
        let xs = self.elems(value);
        let at = self.owned_addresses(ptr, mask)?;
        let i64t = self.ctx.i64_type();
        let (ty, reg): (BasicTypeEnum, _) = if d == DType::F32 {
            (self.ctx.f32_type().into(), ("f32", "f"))
        } else {
            (self.ctx.i32_type().into(), ("u32", "r"))
        };
        let space = if shared { "shared" } else { "global" };
        let fn_t = self
            .ctx
            .void_type()
            .fn_type(&[i64t.into(), ty.into()], false);
        let asm = self.ctx.create_inline_asm(
            fn_t,
            format!("red.{space}.add.{} [$0], $1;", reg.0),
            format!("l,{},~{{memory}}", reg.1),
            true,
            false,
            None,
            false,
        );
        for ((cond, addr), x) in at.into_iter().zip(&xs) {
            self.guarded(cond, |s| {
                s.b.build_indirect_call(fn_t, asm, &[addr.into(), (*x).into()], "")
                    .map_err(|x| s.err(x))?;
                Ok(())
            })?;
        }
        // The closing barrier waits for the op after the run ([`Lower::settle_atomics`]).
        self.atomics_open |= shared;
        Ok(())
    }

    /// [`OpKind::LoadFresh`]: `ld.relaxed.gpu.global.u32` of each element, predicated on
    /// its mask (0 where false).
    fn load_fresh(&mut self, ptr: ValueId, mask: Option<ValueId>) -> R<Cv<'c>> {
        let i32t = self.ctx.i32_type();
        let i64t = self.ctx.i64_type();
        let ps = self.elems(ptr);
        let ms = mask.map(|m| self.elems(m));
        let fn_t = i32t.fn_type(&[i64t.into(), i32t.into()], false);
        let asm = self.ctx.create_inline_asm(
            fn_t,
            "{ .reg .pred p; setp.ne.b32 p, $2, 0; mov.u32 $0, 0; \
             @p ld.relaxed.gpu.global.u32 $0, [$1]; }"
                .to_string(),
            "=r,l,r,~{memory}".to_string(),
            true,
            false,
            None,
            false,
        );
        let mut out = Vec::with_capacity(ps.len());
        for (i, p) in ps.iter().enumerate() {
            let addr = self
                .b
                .build_ptr_to_int(p.into_pointer_value(), i64t, "")
                .map_err(|x| self.err(x))?;
            let on = match &ms {
                Some(m) => self
                    .b
                    .build_int_z_extend(m[i].into_int_value(), i32t, "")
                    .map_err(|x| self.err(x))?,
                None => i32t.const_int(1, false),
            };
            let v = self
                .b
                .build_indirect_call(fn_t, asm, &[addr.into(), on.into()], "")
                .map_err(|x| self.err(x))?;
            out.push(v.try_as_basic_value().basic().expect("loaded word"));
        }
        Ok(self.wrap(ptr, out))
    }

    /// A `griddepcontrol` instruction (sm_90 and newer; before Hopper kernels on a stream
    /// never overlap, so there is nothing to do). A memory clobber keeps loads and stores
    /// on their side of it.
    fn grid_dependency(&mut self, text: &str) -> R<()> {
        if self.sm < 90 {
            return Ok(());
        }
        self.asm_statement(text, "~{memory}")
    }

    /// [`OpKind::Sleep`]: `nanosleep` (sm_70 and newer; nothing before, where the loop just
    /// polls sooner).
    fn sleep(&mut self, ns: u32) -> R<()> {
        if self.sm < 70 {
            return Ok(());
        }
        self.asm_statement(&format!("nanosleep.u32 {ns};"), "")
    }

    /// One volatile PTX statement without operands (`constraints`: its clobbers).
    fn asm_statement(&self, text: &str, constraints: &str) -> R<()> {
        let fn_t = self.ctx.void_type().fn_type(&[], false);
        let asm = self.ctx.create_inline_asm(
            fn_t,
            text.to_string(),
            constraints.to_string(),
            true,
            false,
            None,
            false,
        );
        self.b
            .build_indirect_call(fn_t, asm, &[], "")
            .map_err(|x| self.err(x))?;
        Ok(())
    }

    /// [`OpKind::Arrive`]: thread 0's add with acquire-release semantics at GPU scope,
    /// between barriers, its old count given to every thread (see `on_thread0`).
    fn arrive(&mut self, counter: ValueId) -> R<Cv<'c>> {
        let one = self.ctx.i32_type().const_int(1, false);
        self.on_thread0(
            counter,
            one,
            "atom.acq_rel.gpu.global.add.u32 $0, [$1], $2;",
            "arrive",
        )
    }

    /// [`OpKind::AwaitCount`]: thread 0 polls the counter (`ld.relaxed.gpu`, at most
    /// `AWAIT_POLLS` times) until it reaches the target, then fences with acquire-release
    /// semantics at GPU scope (the acquire half of the arrivals' release), and the count is
    /// broadcast as [`OpKind::Arrive`]'s is.
    fn await_count(&mut self, counter: ValueId, target: ValueId) -> R<Cv<'c>> {
        let Cv::S(t) = self.get(target) else {
            return Err(self.err("await_count needs a scalar target"));
        };
        let text = format!(
            "{{ .reg .pred p; .reg .u32 i; .reg .s32 d; mov.u32 i, 0;\n\
             AWAIT${{:uid}}: ld.relaxed.gpu.global.u32 $0, [$1];\n\
             sub.s32 d, $0, $2; setp.ge.s32 p, d, 0; @p bra.uni DONE${{:uid}};\n\
             add.u32 i, i, 1; setp.lt.u32 p, i, {AWAIT_POLLS}; @p bra.uni AWAIT${{:uid}};\n\
             DONE${{:uid}}: fence.acq_rel.gpu; }}"
        );
        self.on_thread0(counter, t.into_int_value(), &text, "await_count")
    }

    /// [`OpKind::Signal`]: a barrier (every thread's stores made), then thread 0's
    /// `red.release.gpu` add of 1, which nothing waits for.
    fn signal(&mut self, counter: ValueId) -> R<()> {
        let text = "red.release.gpu.global.add.u32 [$0], 1;";
        self.counter_asm_on_thread0(counter, "signal", text, None)
    }

    /// Runs `text` (an i32 result `$0`, the counter's address `$1`, `value` as `$2`) on
    /// thread 0 between barriers (every thread's stores made before it), and broadcasts
    /// its result through shared memory (a barrier after the write, another after the
    /// read so that the slot may be reused). The barriers carry the ordering to and from
    /// the other threads, as CUTLASS's semaphores do.
    fn on_thread0(
        &mut self,
        counter: ValueId,
        value: IntValue<'c>,
        text: &str,
        op: &str,
    ) -> R<Cv<'c>> {
        let i32t = self.ctx.i32_type();
        let slot = self.smem_ptr(i32t.into(), i32t.const_zero())?;
        self.counter_asm_on_thread0(counter, op, text, Some((value, slot)))?;
        self.barrier()?;
        let v = self.b.build_load(i32t, slot, "").map_err(|x| self.err(x))?;
        self.barrier()?;
        Ok(Cv::S(v))
    }

    /// A barrier, then `text` on thread 0 with the scalar pointer `counter`'s address as
    /// an operand: alone (`$0`, no result), or with `value` (`$2`) and an i32 result (`$0`,
    /// the address `$1`) that thread 0 stores to the shared `slot`.
    fn counter_asm_on_thread0(
        &mut self,
        counter: ValueId,
        op: &str,
        text: &str,
        result: Option<(IntValue<'c>, PointerValue<'c>)>,
    ) -> R<()> {
        let i32t = self.ctx.i32_type();
        let i64t = self.ctx.i64_type();
        let Cv::S(p) = self.get(counter) else {
            return Err(self.err(format!("{op} needs a scalar pointer")));
        };
        let addr = self
            .b
            .build_ptr_to_int(p.into_pointer_value(), i64t, "")
            .map_err(|x| self.err(x))?;
        self.barrier()?;
        let first = self
            .b
            .build_int_compare(IntPredicate::EQ, self.tid, i32t.const_zero(), "")
            .map_err(|x| self.err(x))?;
        let (fn_t, constraints) = match result {
            Some(_) => (
                i32t.fn_type(&[i64t.into(), i32t.into()], false),
                "=r,l,r,~{memory}",
            ),
            None => (
                self.ctx.void_type().fn_type(&[i64t.into()], false),
                "l,~{memory}",
            ),
        };
        let asm = self.ctx.create_inline_asm(
            fn_t,
            text.to_string(),
            constraints.to_string(),
            true,
            false,
            None,
            false,
        );
        self.guarded(Some(first), |s| {
            let mut args: Vec<BasicMetadataValueEnum> = vec![addr.into()];
            if let Some((value, _)) = result {
                args.push(value.into());
            }
            let call =
                s.b.build_indirect_call(fn_t, asm, &args, "")
                    .map_err(|x| s.err(x))?;
            if let Some((_, slot)) = result {
                let old = call.try_as_basic_value().basic().expect("asm value");
                s.b.build_store(slot, old).map_err(|x| s.err(x))?;
            }
            Ok(())
        })
    }

    /// `prefetch.global.L2` on each 128-byte line of `bytes` at each pointer this thread
    /// owns (replicas stay silent) where `mask` holds.
    fn prefetch(
        &mut self,
        ptr: ValueId,
        mask: Option<ValueId>,
        bytes: u32,
        level: CacheLevel,
    ) -> R<()> {
        let at = self.owned_addresses(ptr, mask)?;
        let i64t = self.ctx.i64_type();
        let fn_t = self.ctx.void_type().fn_type(&[i64t.into()], false);
        let asm = self.ctx.create_inline_asm(
            fn_t,
            format!("prefetch.global.{} [$0];", level.ptx()),
            "l".to_string(),
            true,
            false,
            None,
            false,
        );
        for (cond, addr) in at {
            self.guarded(cond, |s| {
                for line in 0..bytes / 128 {
                    let at =
                        s.b.build_int_add(addr, i64t.const_int(line as u64 * 128, false), "")
                            .map_err(|x| s.err(x))?;
                    s.b.build_indirect_call(fn_t, asm, &[at.into()], "")
                        .map_err(|x| s.err(x))?;
                }
                Ok(())
            })?;
        }
        Ok(())
    }

    // ---- reductions ----

    fn identity(&self, op: ReduceOp, d: DType) -> BasicValueEnum<'c> {
        let t = reduce_type(self.ctx, d);
        match (op, t) {
            (ReduceOp::Sum, _) => t.const_zero(),
            (_, BasicTypeEnum::FloatType(f)) => f
                .const_float(if op == ReduceOp::Max {
                    f64::NEG_INFINITY
                } else {
                    f64::INFINITY
                })
                .into(),
            (_, BasicTypeEnum::IntType(i)) => {
                let bits = i.get_bit_width();
                let v: u64 = match (op, d) {
                    (ReduceOp::Max, DType::U8) => 0,
                    (ReduceOp::Min, DType::U8) => 255,
                    (ReduceOp::Max, _) => 1u64 << (bits - 1),
                    _ => (1u64 << (bits - 1)) - 1,
                };
                i.const_int(v, false).into()
            }
            _ => unreachable!("numbers only"),
        }
    }

    fn combine(
        &self,
        op: ReduceOp,
        d: DType,
        a: BasicValueEnum<'c>,
        b: BasicValueEnum<'c>,
    ) -> R<BasicValueEnum<'c>> {
        let cd = match d {
            DType::F16 | DType::BF16 | DType::F32 => DType::F32,
            DType::I64 => DType::I64,
            _ => DType::I32,
        };
        let bop = match op {
            ReduceOp::Sum => BinOp::Add,
            ReduceOp::Max => BinOp::Max,
            ReduceOp::Min => BinOp::Min,
        };
        let signed_cd = if d == DType::U8 { DType::I32 } else { cd };
        self.binary(bop, signed_cd, a, b)
    }

    fn widen_for_reduce(&self, x: BasicValueEnum<'c>, d: DType) -> R<BasicValueEnum<'c>> {
        match d {
            DType::F16 | DType::BF16 => self.widen(x, d),
            DType::U8 => Ok(self
                .b
                .build_int_z_extend(x.into_int_value(), self.ctx.i32_type(), "")
                .map_err(|e| self.err(e))?
                .into()),
            _ => Ok(x),
        }
    }

    fn narrow_reduced(&self, x: BasicValueEnum<'c>, d: DType) -> R<BasicValueEnum<'c>> {
        match d {
            DType::F16 | DType::BF16 => self.narrow(x, d),
            DType::U8 => Ok(self
                .b
                .build_int_truncate(x.into_int_value(), self.ctx.i8_type(), "")
                .map_err(|e| self.err(e))?
                .into()),
            _ => Ok(x),
        }
    }

    fn shuffle_xor(&self, x: BasicValueEnum<'c>, mask: u32) -> R<BasicValueEnum<'c>> {
        let full = self.i32c(-1).into();
        let m = self.i32c(mask as i64).into();
        let clamp = self.i32c(0x1f).into();
        match x.get_type() {
            BasicTypeEnum::FloatType(f) => self.call(
                "llvm.nvvm.shfl.sync.bfly.f32",
                f.into(),
                &[full, x, m, clamp],
            ),
            BasicTypeEnum::IntType(i) if i.get_bit_width() == 32 => self.call(
                "llvm.nvvm.shfl.sync.bfly.i32",
                i.into(),
                &[full, x, m, clamp],
            ),
            BasicTypeEnum::IntType(i) => {
                let v2 = self.ctx.i32_type().vec_type(2);
                let v = self
                    .b
                    .build_bit_cast(x, v2, "")
                    .map_err(|x| self.err(x))?
                    .into_vector_value();
                let mut out = v2.get_undef();
                for j in 0..2 {
                    let part = self
                        .b
                        .build_extract_element(v, self.i32c(j), "")
                        .map_err(|x| self.err(x))?;
                    let s = self.call(
                        "llvm.nvvm.shfl.sync.bfly.i32",
                        self.ctx.i32_type().into(),
                        &[full, part, m, clamp],
                    )?;
                    out = self
                        .b
                        .build_insert_element(out, s, self.i32c(j), "")
                        .map_err(|x| self.err(x))?;
                }
                Ok(self.b.build_bit_cast(out, i, "").map_err(|x| self.err(x))?)
            }
            _ => unreachable!("numbers only"),
        }
    }

    fn reduce(&mut self, op: ReduceOp, v: ValueId, axis: usize, res: ValueId) -> R<Cv<'c>> {
        let t = self.ty_of(v).clone();
        let d = t.elem.dtype().expect("number");
        let l = self.layouts.get(v).clone();
        let xs: Vec<BasicValueEnum<'c>> = self
            .elems(v)
            .into_iter()
            .map(|x| self.widen_for_reduce(x, d))
            .collect::<R<_>>()?;
        let id = self.identity(op, d);
        if t.shape.len() == 1 {
            let (acc, across) = self.warp_partial(op, v)?;
            let acc = if across {
                self.across_warps(&[(op, d, acc)])?[0]
            } else {
                acc
            };
            return Ok(Cv::S(self.narrow_reduced(acc, d)?));
        }
        let Layout::Blocked(bl) = l else {
            return Err(self.err("2-D blocks have blocked layouts"));
        };
        let kept = 1 - axis;
        let (n_axis, n_kept) = (bl.per_thread(axis), bl.per_thread(kept));
        let not_replica = self.not_replica(&bl, axis)?;
        let mut accs = vec![];
        for j in 0..n_kept {
            let mut acc = id;
            for i in 0..n_axis {
                let s = if axis == 0 {
                    i * n_kept + j
                } else {
                    j * n_axis + i
                };
                acc = self.combine(op, d, acc, xs[s])?;
            }
            if let Some(c) = not_replica {
                acc = self
                    .b
                    .build_select(c, acc, id, "")
                    .map_err(|x| self.err(x))?;
            }
            accs.push(self.butterfly(op, d, acc, &bl, axis)?);
        }
        if bl.warps_per_cta[axis] > 1 {
            let (lane_a, warp_a) = self.thread_coord(&bl, axis)?;
            let lead = self
                .b
                .build_int_compare(IntPredicate::EQ, lane_a, self.i32c(0), "")
                .map_err(|x| self.err(x))?;
            let writer = match self.not_replica(&bl, kept)? {
                Some(c) => self.b.build_and(lead, c, "").map_err(|x| self.err(x))?,
                None => lead,
            };
            let n = bl.shape[kept];
            let mut out = vec![];
            let coords: Vec<IntValue<'c>> = (0..n_kept)
                .map(|j| self.coord(&bl, kept, j))
                .collect::<R<_>>()?;
            // All slots go through shared memory together: write, one barrier, read.
            let rt = reduce_type(self.ctx, d);
            for (acc, c) in accs.iter().zip(&coords) {
                let wi = self
                    .b
                    .build_int_mul(warp_a, self.i32c(n as i64), "")
                    .map_err(|x| self.err(x))?;
                let idx = self.b.build_int_add(wi, *c, "").map_err(|x| self.err(x))?;
                let p = self.smem_ptr(rt, idx)?;
                self.guarded(Some(writer), |s| {
                    s.b.build_store(p, *acc).map_err(|x| s.err(x))?;
                    Ok(())
                })?;
            }
            self.barrier()?;
            for c in &coords {
                let mut acc = id;
                for w in 0..bl.warps_per_cta[axis] {
                    let idx = self
                        .b
                        .build_int_add(*c, self.i32c((w * n) as i64), "")
                        .map_err(|x| self.err(x))?;
                    let p = self.smem_ptr(rt, idx)?;
                    let x = self.b.build_load(rt, p, "").map_err(|x| self.err(x))?;
                    acc = self.combine(op, d, acc, x)?;
                }
                out.push(acc);
            }
            self.barrier()?;
            accs = out;
        }
        let accs: Vec<_> = accs
            .into_iter()
            .map(|a| self.narrow_reduced(a, d))
            .collect::<R<_>>()?;
        // The result is born in the slice layout; move it if its class settled elsewhere.
        let born = Layout::Slice {
            parent: bl,
            dim: axis,
        };
        let want = self.layouts.get(res).clone();
        let rt = self.ty_of(res).clone();
        Ok(Cv::B(self.convert_elems(accs, &rt, &born, &want)?))
    }

    /// Combines `acc` over the lanes that differ only in their coordinate along `dim`.
    fn butterfly(
        &self,
        op: ReduceOp,
        d: DType,
        mut acc: BasicValueEnum<'c>,
        bl: &Blocked,
        dim: usize,
    ) -> R<BasicValueEnum<'c>> {
        let stride = bl.lane_stride(dim);
        let mut m = stride * bl.threads_per_warp[dim] / 2;
        while m >= stride && m > 0 {
            let other = self.shuffle_xor(acc, m as u32)?;
            acc = self.combine(op, d, acc, other)?;
            m /= 2;
        }
        Ok(acc)
    }

    /// A 1-D block reduced within each warp: the thread's elements, then the lanes. Returns
    /// the partial and whether the warps still have to be combined (they need not when
    /// every warp holds the whole vector).
    fn warp_partial(&self, op: ReduceOp, v: ValueId) -> R<(BasicValueEnum<'c>, bool)> {
        let d = self.ty_of(v).elem.dtype().expect("number");
        let l = self.layouts.get(v).clone();
        let id = self.identity(op, d);
        let xs: Vec<_> = self
            .elems(v)
            .into_iter()
            .map(|x| self.widen_for_reduce(x, d))
            .collect::<R<_>>()?;
        let mut acc = self.fold_tree(op, d, xs, id)?;
        if let Layout::Slice { parent, dim } = &l {
            let kept = 1 - dim;
            if parent.warps_per_cta[kept] == 1 {
                if let Some(c) = self.not_replica(parent, kept)? {
                    acc = self
                        .b
                        .build_select(c, acc, id, "")
                        .map_err(|x| self.err(x))?;
                }
                return Ok((self.butterfly(op, d, acc, parent, kept)?, false));
            }
        }
        if let Some(o) = self.owner(&l)? {
            acc = self
                .b
                .build_select(o, acc, id, "")
                .map_err(|x| self.err(x))?;
        }
        for m in [16, 8, 4, 2, 1] {
            let other = self.shuffle_xor(acc, m)?;
            acc = self.combine(op, d, acc, other)?;
        }
        Ok((acc, self.k.num_warps > 1))
    }

    /// Combines a thread's elements pairwise: a chain of log2(n) dependent steps instead of
    /// n, so several reductions of one step overlap their latencies.
    fn fold_tree(
        &self,
        op: ReduceOp,
        d: DType,
        mut xs: Vec<BasicValueEnum<'c>>,
        id: BasicValueEnum<'c>,
    ) -> R<BasicValueEnum<'c>> {
        if xs.is_empty() {
            return Ok(id);
        }
        while xs.len() > 1 {
            let mut next = Vec::with_capacity(xs.len().div_ceil(2));
            for pair in xs.chunks(2) {
                next.push(match pair {
                    [a, b] => self.combine(op, d, *a, *b)?,
                    [a] => *a,
                    _ => unreachable!("chunks of two"),
                });
            }
            xs = next;
        }
        Ok(xs[0])
    }

    /// Several reductions of 1-D blocks at once (`MultiReduce`): each folded within the
    /// warps, then all of them combined across warps through one shared-memory exchange.
    fn multi_reduce(&mut self, ops: &[ReduceOp], values: &[ValueId]) -> R<Vec<Cv<'c>>> {
        let mut parts = vec![];
        let mut pending = vec![];
        for (i, (&op, &v)) in ops.iter().zip(values).enumerate() {
            let d = self.ty_of(v).elem.dtype().expect("number");
            let (acc, across) = self.warp_partial(op, v)?;
            if across {
                pending.push((i, (op, d, acc)));
            }
            parts.push((d, acc));
        }
        if !pending.is_empty() {
            let ins: Vec<_> = pending.iter().map(|(_, x)| *x).collect();
            let outs = self.across_warps(&ins)?;
            for ((i, _), o) in pending.iter().zip(outs) {
                parts[*i].1 = o;
            }
        }
        parts
            .into_iter()
            .map(|(d, a)| Ok(Cv::S(self.narrow_reduced(a, d)?)))
            .collect()
    }

    /// Combines one value per warp for each of `vals` through shared memory, with one
    /// barrier pair for all of them; every thread gets the results. Value `i` of warp `w`
    /// sits at byte `8 * (i * num_warps + w)`.
    fn across_warps(
        &self,
        vals: &[(ReduceOp, DType, BasicValueEnum<'c>)],
    ) -> R<Vec<BasicValueEnum<'c>>> {
        let nw = self.k.num_warps as i64;
        let lead = self
            .b
            .build_int_compare(IntPredicate::EQ, self.lane, self.i32c(0), "")
            .map_err(|x| self.err(x))?;
        let slot = |i: usize, w: IntValue<'c>, rt: BasicTypeEnum<'c>| -> R<PointerValue<'c>> {
            // Indices in units of the value's own width, regions 8 bytes a slot apart.
            let bytes = match rt {
                BasicTypeEnum::IntType(t) => t.get_bit_width() as i64 / 8,
                _ => 4,
            };
            let per = 8 / bytes;
            let base = self.i32c(i as i64 * nw * per);
            let wi = self
                .b
                .build_int_mul(w, self.i32c(per), "")
                .map_err(|x| self.err(x))?;
            let idx = self
                .b
                .build_int_add(base, wi, "")
                .map_err(|x| self.err(x))?;
            self.smem_ptr(rt, idx)
        };
        for (i, (_, _, acc)) in vals.iter().enumerate() {
            let p = slot(i, self.warp, acc.get_type())?;
            self.guarded(Some(lead), |s| {
                s.b.build_store(p, *acc).map_err(|x| s.err(x))?;
                Ok(())
            })?;
        }
        self.barrier()?;
        let mut outs = vec![];
        // Few warps: every thread folds the warps' values. Many: lane w reads warp w's, and
        // a butterfly combines them (5 shuffles instead of a load and a combine per warp;
        // commutative steps, so every lane ends with the same bits).
        let by_lanes = nw > 8;
        let reader = if by_lanes {
            Some(
                self.b
                    .build_int_compare(IntPredicate::ULT, self.lane, self.i32c(nw), "")
                    .map_err(|x| self.err(x))?,
            )
        } else {
            None
        };
        for (i, (op, d, acc)) in vals.iter().enumerate() {
            let rt = acc.get_type();
            let id = self.identity(*op, *d);
            let out = match reader {
                Some(r) => {
                    // Lanes past the last warp read warp 0's slot and drop it.
                    let w = self
                        .b
                        .build_select(r, self.lane, self.i32c(0), "")
                        .map_err(|x| self.err(x))?
                        .into_int_value();
                    let p = slot(i, w, rt)?;
                    let x = self.b.build_load(rt, p, "").map_err(|x| self.err(x))?;
                    let mut out = self.b.build_select(r, x, id, "").map_err(|x| self.err(x))?;
                    for m in [16, 8, 4, 2, 1] {
                        let other = self.shuffle_xor(out, m)?;
                        out = self.combine(*op, *d, out, other)?;
                    }
                    out
                }
                None => {
                    let mut out = id;
                    for w in 0..nw {
                        let p = slot(i, self.i32c(w), rt)?;
                        let x = self.b.build_load(rt, p, "").map_err(|x| self.err(x))?;
                        out = self.combine(*op, *d, out, x)?;
                    }
                    out
                }
            };
            outs.push(out);
        }
        self.barrier()?;
        Ok(outs)
    }

    /// Inclusive prefix sum of a 1-D blocked block. Each repetition of the layout's tile is
    /// scanned in turn: the thread's own run of elements, the lanes by shuffles up, then the
    /// warps' totals through shared memory (one barrier pair for all repetitions); earlier
    /// repetitions' totals carry into later ones.
    fn scan(&mut self, v: ValueId) -> R<Cv<'c>> {
        let d = self.ty_of(v).elem.dtype().expect("number");
        let Layout::Blocked(bl) = self.layouts.get(v).clone() else {
            return Err(
                self.err("cumsum needs its block in a blocked layout (not a reduction's slice)")
            );
        };
        if bl.tile(0) > bl.shape[0] {
            return Err(self.err(format!(
                "cumsum of a {}-element block needs at least {} elements ({} per thread x 32 lanes x {} warps)",
                bl.shape[0],
                bl.tile(0),
                bl.size_per_thread[0],
                bl.warps_per_cta[0]
            )));
        }
        let add = |a: BasicValueEnum<'c>, b: BasicValueEnum<'c>| self.binary(BinOp::Add, d, a, b);
        let rt = llvm_type(self.ctx, d);
        let zero = rt.const_zero();
        let spt = bl.size_per_thread[0];
        let reps = bl.per_thread(0) / spt;
        let nw = bl.warps_per_cta[0] as i64;
        let xs = self.elems(v);
        let mut local = Vec::with_capacity(xs.len());
        let mut totals = vec![];
        for r in 0..reps {
            let mut acc = zero;
            for i in 0..spt {
                acc = add(acc, xs[r * spt + i])?;
                local.push(acc);
            }
            totals.push(acc);
        }
        let mut incl = totals.clone();
        for delta in [1i64, 2, 4, 8, 16] {
            let has = self
                .b
                .build_int_compare(IntPredicate::SGE, self.lane, self.i32c(delta), "")
                .map_err(|x| self.err(x))?;
            for x in incl.iter_mut() {
                let y = self.shuffle_up(*x, delta as u32)?;
                let sum = add(*x, y)?;
                *x = self
                    .b
                    .build_select(has, sum, *x, "")
                    .map_err(|e| self.err(e))?;
            }
        }
        let last = self
            .b
            .build_int_compare(IntPredicate::EQ, self.lane, self.i32c(31), "")
            .map_err(|x| self.err(x))?;
        for (r, x) in incl.iter().enumerate() {
            let idx = self
                .b
                .build_int_add(self.warp, self.i32c(r as i64 * nw), "")
                .map_err(|e| self.err(e))?;
            let p = self.smem_ptr(rt, idx)?;
            self.guarded(Some(last), |s| {
                s.b.build_store(p, *x).map_err(|e| s.err(e))?;
                Ok(())
            })?;
        }
        self.barrier()?;
        let mut carry = zero;
        let mut out = Vec::with_capacity(xs.len());
        for r in 0..reps {
            let mut before = zero;
            let mut all = zero;
            for w in 0..nw {
                let p = self.smem_ptr(rt, self.i32c(r as i64 * nw + w))?;
                let t = self.b.build_load(rt, p, "").map_err(|e| self.err(e))?;
                let earlier = self
                    .b
                    .build_int_compare(IntPredicate::SLT, self.i32c(w), self.warp, "")
                    .map_err(|e| self.err(e))?;
                let part = self
                    .b
                    .build_select(earlier, t, zero, "")
                    .map_err(|e| self.err(e))?;
                before = add(before, part)?;
                all = add(all, t)?;
            }
            // Everything before this thread's run: earlier repetitions, warps and lanes.
            let lanes_before = self.binary(BinOp::Sub, d, incl[r], totals[r])?;
            let offset = add(add(carry, before)?, lanes_before)?;
            for i in 0..spt {
                out.push(add(offset, local[r * spt + i])?);
            }
            carry = add(carry, all)?;
        }
        self.barrier()?;
        // An integer sum is the same in any order: the block's sum, if asked for, is this.
        if !d.is_float() {
            self.scan_totals.insert(v, carry);
        }
        Ok(Cv::B(out))
    }

    fn shuffle_up(&self, x: BasicValueEnum<'c>, delta: u32) -> R<BasicValueEnum<'c>> {
        let full = self.i32c(-1).into();
        let dl = self.i32c(delta as i64).into();
        let clamp = self.i32c(0).into();
        let (name, t): (&str, BasicTypeEnum<'c>) = match x.get_type() {
            BasicTypeEnum::FloatType(f) => ("llvm.nvvm.shfl.sync.up.f32", f.into()),
            other => ("llvm.nvvm.shfl.sync.up.i32", other),
        };
        self.call(name, t, &[full, x, dl, clamp])
    }

    // ---- control flow ----

    fn phis_for(&self, vals: &[Cv<'c>]) -> R<Vec<Vec<inkwell::values::PhiValue<'c>>>> {
        vals.iter()
            .map(|v| {
                let xs = match v {
                    Cv::S(s) => vec![*s],
                    Cv::B(b) => b.clone(),
                };
                xs.iter()
                    .map(|x| self.b.build_phi(x.get_type(), "").map_err(|e| self.err(e)))
                    .collect()
            })
            .collect()
    }

    fn phi_values(
        &self,
        phis: &[Vec<inkwell::values::PhiValue<'c>>],
        like: &[ValueId],
    ) -> Vec<Cv<'c>> {
        phis.iter()
            .zip(like)
            .map(|(ps, v)| {
                let xs: Vec<_> = ps.iter().map(|p| p.as_basic_value()).collect();
                self.wrap(*v, xs)
            })
            .collect()
    }

    fn add_incoming(
        &self,
        phis: &[Vec<inkwell::values::PhiValue<'c>>],
        vals: &[Cv<'c>],
        from: BasicBlock<'c>,
    ) {
        for (ps, v) in phis.iter().zip(vals) {
            let xs = match v {
                Cv::S(s) => vec![*s],
                Cv::B(b) => b.clone(),
            };
            for (p, x) in ps.iter().zip(xs) {
                p.add_incoming(&[(&x, from)]);
            }
        }
    }

    fn for_loop(
        &mut self,
        lo: ValueId,
        hi: ValueId,
        step: ValueId,
        init: &[ValueId],
        body: &Region,
    ) -> R<Vec<Cv<'c>>> {
        let (lo_v, hi_v, step_v) = (self.elems(lo)[0], self.elems(hi)[0], self.elems(step)[0]);
        let dts: Vec<Option<DType>> = init.iter().map(|v| self.ty_of(*v).elem.dtype()).collect();
        let init_v: Vec<Cv<'c>> = init
            .iter()
            .zip(&dts)
            .map(|(v, d)| self.pack_halves(self.get(*v), *d))
            .collect::<R<_>>()?;
        let pre = self.b.get_insert_block().expect("block");
        let header = self.ctx.append_basic_block(self.func, "loop");
        let body_bb = self.ctx.append_basic_block(self.func, "loop_body");
        let exit = self.ctx.append_basic_block(self.func, "loop_end");
        self.b
            .build_unconditional_branch(header)
            .map_err(|x| self.err(x))?;
        self.b.position_at_end(header);
        let iv = self
            .b
            .build_phi(self.ctx.i32_type(), "i")
            .map_err(|x| self.err(x))?;
        iv.add_incoming(&[(&lo_v, pre)]);
        let phis = self.phis_for(&init_v)?;
        self.add_incoming(&phis, &init_v, pre);
        let ivv = iv.as_basic_value().into_int_value();
        let go = self
            .b
            .build_int_compare(IntPredicate::SLT, ivv, hi_v.into_int_value(), "")
            .map_err(|x| self.err(x))?;
        self.b
            .build_conditional_branch(go, body_bb, exit)
            .map_err(|x| self.err(x))?;
        self.b.position_at_end(body_bb);
        self.vals.insert(body.args[0], Cv::S(ivv.into()));
        let carried = self.phi_values(&phis, &body.args[1..]);
        for ((a, v), d) in body.args[1..].iter().zip(carried).zip(&dts) {
            let v = self.unpack_halves(v, *d)?;
            self.vals.insert(*a, v);
        }
        let next = self.region(body)?;
        let next: Vec<Cv<'c>> = next
            .into_iter()
            .zip(&dts)
            .map(|(v, d)| self.pack_halves(v, *d))
            .collect::<R<_>>()?;
        let next_iv = self
            .b
            .build_int_add(ivv, step_v.into_int_value(), "")
            .map_err(|x| self.err(x))?;
        let latch = self.b.get_insert_block().expect("block");
        iv.add_incoming(&[(&next_iv, latch)]);
        self.add_incoming(&phis, &next, latch);
        self.b
            .build_unconditional_branch(header)
            .map_err(|x| self.err(x))?;
        self.b.position_at_end(exit);
        self.phi_values(&phis, &body.args[1..])
            .into_iter()
            .zip(&dts)
            .map(|(v, d)| self.unpack_halves(v, *d))
            .collect()
    }

    /// A block of f16 or bf16 as 32-bit pairs, the form a loop carries it in: ptxas then
    /// keeps two values a register (each 16-bit value in a register of its own otherwise),
    /// and pairs that were loaded or feed the tensor cores as pairs never move.
    fn pack_halves(&self, v: Cv<'c>, d: Option<DType>) -> R<Cv<'c>> {
        match (v, d) {
            (Cv::B(xs), Some(d @ (DType::F16 | DType::BF16))) if xs.len() % 2 == 0 => Ok(Cv::B(
                xs.chunks(2)
                    .map(|p| self.pack2(p[0], p[1], d))
                    .collect::<R<_>>()?,
            )),
            (v, _) => Ok(v),
        }
    }

    /// The inverse of [`Self::pack_halves`].
    fn unpack_halves(&self, v: Cv<'c>, d: Option<DType>) -> R<Cv<'c>> {
        match (v, d) {
            (Cv::B(ws), Some(d @ (DType::F16 | DType::BF16)))
                if ws.first().is_some_and(|w| w.is_int_value()) =>
            {
                let v2 = llvm_type(self.ctx, d).into_float_type().vec_type(2);
                let mut out = vec![];
                for w in ws {
                    let p = self
                        .b
                        .build_bit_cast(w, v2, "")
                        .map_err(|e| self.err(e))?
                        .into_vector_value();
                    for i in 0..2 {
                        out.push(
                            self.b
                                .build_extract_element(p, self.i32c(i), "")
                                .map_err(|e| self.err(e))?,
                        );
                    }
                }
                Ok(Cv::B(out))
            }
            (v, _) => Ok(v),
        }
    }

    fn if_else(
        &mut self,
        cond: ValueId,
        then_r: &Region,
        else_r: &Region,
        results: &[ValueId],
    ) -> R<Vec<Cv<'c>>> {
        let c = self.elems(cond)[0].into_int_value();
        let then_bb = self.ctx.append_basic_block(self.func, "then");
        let else_bb = self.ctx.append_basic_block(self.func, "else");
        let merge = self.ctx.append_basic_block(self.func, "endif");
        self.b
            .build_conditional_branch(c, then_bb, else_bb)
            .map_err(|x| self.err(x))?;
        self.b.position_at_end(then_bb);
        let tv = self.region(then_r)?;
        let t_end = self.b.get_insert_block().expect("block");
        self.b
            .build_unconditional_branch(merge)
            .map_err(|x| self.err(x))?;
        self.b.position_at_end(else_bb);
        let ev = self.region(else_r)?;
        let e_end = self.b.get_insert_block().expect("block");
        self.b
            .build_unconditional_branch(merge)
            .map_err(|x| self.err(x))?;
        self.b.position_at_end(merge);
        let phis = self.phis_for(&tv)?;
        self.add_incoming(&phis, &tv, t_end);
        self.add_incoming(&phis, &ev, e_end);
        Ok(self.phi_values(&phis, results))
    }
}

/// Marks a float op contractable, so a multiply feeding an add becomes one FMA (as nvcc
/// does by default); results may differ from unfused arithmetic in the last bit.
fn contract(v: FloatValue<'_>) -> BasicValueEnum<'_> {
    if let Some(i) = v.as_instruction_value() {
        let _ = i.set_fast_math_flags(FastMathFlags::from_bits_retain(
            inkwell::llvm_sys::LLVMFastMathAllowContract,
        ));
    }
    v.into()
}

/// The type reductions accumulate in: f32 for floats, i32 for small ints.
fn reduce_type(ctx: &Context, d: DType) -> BasicTypeEnum<'_> {
    match d {
        DType::F16 | DType::BF16 | DType::F32 => ctx.f32_type().into(),
        DType::I64 => ctx.i64_type().into(),
        _ => ctx.i32_type().into(),
    }
}
