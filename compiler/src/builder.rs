//! The builder API: makes a [`Kernel`] op by op, typing each op as it goes.
//!
//! Type errors do not panic: the first one is kept, with the kernel's name, the op and the
//! caller's source line, and [`KernelBuilder::finish`] returns it. Scalars mixed with blocks
//! in elementwise ops are splatted to the block's shape.

use crate::ir::*;
use crate::verify::{format_loc, result_types, verify};
use crate::CompileError;
use std::panic::Location;

/// A value being built: a handle into the kernel under construction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Value(pub ValueId);

pub struct KernelBuilder {
    name: String,
    num_warps: u32,
    min_programs_per_sm: u32,
    vector_bytes: u32,
    types: Vec<Type>,
    params: Vec<Param>,
    /// Open regions, innermost last.
    stack: Vec<Region>,
    error: Option<CompileError>,
}

fn caller_loc(l: &'static Location<'static>) -> Loc {
    Loc {
        file: l.file(),
        line: l.line(),
        column: l.column(),
    }
}

impl KernelBuilder {
    /// A new kernel with 4 warps per program.
    pub fn new(name: &str) -> Self {
        KernelBuilder {
            name: name.to_string(),
            num_warps: 4,
            min_programs_per_sm: 0,
            vector_bytes: 16,
            types: vec![],
            params: vec![],
            stack: vec![Region::default()],
            error: None,
        }
    }

    pub fn set_num_warps(&mut self, n: u32) {
        self.num_warps = n;
    }

    /// Asks for `n` programs resident per multiprocessor (an occupancy floor; registers are
    /// capped to fit it). 0 leaves the choice to ptxas.
    pub fn set_min_programs_per_sm(&mut self, n: u32) {
        self.min_programs_per_sm = n;
    }

    /// Bytes each thread holds contiguously along the last dimension of loaded or stored
    /// blocks (see [`Kernel::vector_bytes`]; 16 unless set).
    pub fn set_vector_bytes(&mut self, n: u32) {
        self.vector_bytes = n;
    }

    /// The type of a value made by this builder.
    pub fn ty(&self, v: Value) -> &Type {
        &self.types[v.0 .0 as usize]
    }

    fn fresh(&mut self, t: Type) -> ValueId {
        self.types.push(t);
        ValueId(self.types.len() as u32 - 1)
    }

    fn fail(&mut self, op: &str, loc: &Loc, msg: String) {
        if self.error.is_none() {
            self.error = Some(CompileError::Build {
                kernel: self.name.clone(),
                op: op.to_string(),
                loc: format_loc(loc),
                msg,
            });
        }
    }

    /// Types `kind`, appends it to the innermost region, and returns its results. On a type
    /// error the error is kept and placeholder values are returned.
    fn push(&mut self, kind: OpKind, loc: Loc, placeholder: &[Type]) -> Vec<Value> {
        let types = &self.types;
        let tys = match result_types(&kind, &|v| types[v.0 as usize].clone()) {
            Ok(t) => t,
            Err(m) => {
                self.fail(kind.name(), &loc, m);
                return placeholder
                    .iter()
                    .map(|t| Value(self.fresh(t.clone())))
                    .collect();
            }
        };
        let results: Vec<ValueId> = tys.into_iter().map(|t| self.fresh(t)).collect();
        self.stack.last_mut().expect("open region").ops.push(Op {
            kind,
            results: results.clone(),
            loc,
        });
        results.into_iter().map(Value).collect()
    }

    fn push1(&mut self, kind: OpKind, loc: Loc) -> Value {
        self.push(kind, loc, &[Type::scalar(DType::I32)])[0]
    }

    /// Records a build error at the caller's source line (the first error is the one
    /// `finish` returns): for checks that code generated from kernels makes as it builds.
    #[track_caller]
    pub fn report(&mut self, op: &str, msg: impl Into<String>) {
        let loc = caller_loc(Location::caller());
        self.fail(op, &loc, msg.into());
    }

    // ---- parameters ----

    /// A pointer parameter to global memory holding `dtype` elements.
    pub fn param_ptr(&mut self, name: &str, dtype: DType) -> Value {
        self.param(name, Type::ptr(dtype))
    }

    /// A scalar parameter.
    pub fn param_scalar(&mut self, name: &str, dtype: DType) -> Value {
        self.param(name, Type::scalar(dtype))
    }

    fn param(&mut self, name: &str, ty: Type) -> Value {
        let v = self.fresh(ty.clone());
        self.params.push(Param {
            name: name.to_string(),
            ty,
            value: v,
        });
        Value(v)
    }

    // ---- ids, constants, ranges ----

    #[track_caller]
    pub fn program_id(&mut self, axis: u8) -> Value {
        self.push1(OpKind::ProgramId { axis }, caller_loc(Location::caller()))
    }
    /// The GPU's nanosecond clock (i64); see [`OpKind::GlobalTimer`].
    #[track_caller]
    pub fn global_timer(&mut self) -> Value {
        let loc = caller_loc(Location::caller());
        self.push(OpKind::GlobalTimer, loc, &[Type::scalar(DType::I64)])[0]
    }
    /// The multiprocessor running the program (i32); see [`OpKind::SmId`].
    #[track_caller]
    pub fn sm_id(&mut self) -> Value {
        self.push1(OpKind::SmId, caller_loc(Location::caller()))
    }
    #[track_caller]
    pub fn num_programs(&mut self, axis: u8) -> Value {
        self.push1(OpKind::NumPrograms { axis }, caller_loc(Location::caller()))
    }
    #[track_caller]
    pub fn constant(&mut self, value: Const, dtype: DType) -> Value {
        self.push1(
            OpKind::Constant { value, dtype },
            caller_loc(Location::caller()),
        )
    }
    #[track_caller]
    pub fn i32(&mut self, v: i32) -> Value {
        self.constant(Const::Int(v as i64), DType::I32)
    }
    #[track_caller]
    pub fn i64(&mut self, v: i64) -> Value {
        self.constant(Const::Int(v), DType::I64)
    }
    #[track_caller]
    pub fn f32(&mut self, v: f32) -> Value {
        self.constant(Const::Float(v as f64), DType::F32)
    }
    #[track_caller]
    pub fn bool(&mut self, v: bool) -> Value {
        self.constant(Const::Bool(v), DType::Bool)
    }
    /// An integer constant of `like`'s element type (a float one for float types).
    #[track_caller]
    pub fn const_like(&mut self, like: Value, v: i64) -> Value {
        let d = self.ty(like).elem.dtype().unwrap_or(DType::I64);
        let c = if d.is_float() {
            Const::Float(v as f64)
        } else {
            Const::Int(v)
        };
        self.constant(c, d)
    }
    /// `a + c` for a constant `c` of `a`'s type.
    #[track_caller]
    pub fn add_c(&mut self, a: Value, c: i64) -> Value {
        let c = self.const_like(a, c);
        self.add(a, c)
    }
    /// `a * c` for a constant `c` of `a`'s type.
    #[track_caller]
    pub fn mul_c(&mut self, a: Value, c: i64) -> Value {
        let c = self.const_like(a, c);
        self.mul(a, c)
    }
    /// `[start, end)` as an i32 block; the length must be a power of two.
    #[track_caller]
    pub fn arange(&mut self, start: i64, end: i64) -> Value {
        self.push1(
            OpKind::Arange { start, end },
            caller_loc(Location::caller()),
        )
    }
    #[track_caller]
    pub fn splat(&mut self, value: Value, shape: &[usize]) -> Value {
        self.push1(
            OpKind::Splat {
                value: value.0,
                shape: shape.to_vec(),
            },
            caller_loc(Location::caller()),
        )
    }
    /// 1-D `[n]` to `[size, n]` (axis 0) or `[n, size]` (axis 1) by repetition.
    #[track_caller]
    pub fn expand(&mut self, value: Value, axis: u8, size: usize) -> Value {
        self.push1(
            OpKind::Expand {
                value: value.0,
                axis,
                size,
            },
            caller_loc(Location::caller()),
        )
    }

    /// Splats whichever of `a`, `b` is a scalar to the other's block shape.
    fn broadcast_pair(&mut self, a: Value, b: Value, loc: &Loc) -> (Value, Value) {
        let (sa, sb) = (self.ty(a).shape.clone(), self.ty(b).shape.clone());
        match (sa.is_empty(), sb.is_empty()) {
            (true, false) => {
                let s = self.push1(
                    OpKind::Splat {
                        value: a.0,
                        shape: sb,
                    },
                    loc.clone(),
                );
                (s, b)
            }
            (false, true) => {
                let s = self.push1(
                    OpKind::Splat {
                        value: b.0,
                        shape: sa,
                    },
                    loc.clone(),
                );
                (a, s)
            }
            _ => (a, b),
        }
    }

    // ---- elementwise ----

    #[track_caller]
    pub fn binary(&mut self, op: BinOp, a: Value, b: Value) -> Value {
        let loc = caller_loc(Location::caller());
        let (a, b) = self.broadcast_pair(a, b, &loc);
        let ph = self.ty(a).clone();
        self.push(
            OpKind::Binary {
                op,
                lhs: a.0,
                rhs: b.0,
            },
            loc,
            &[ph],
        )[0]
    }
    #[track_caller]
    pub fn cmp(&mut self, op: CmpOp, a: Value, b: Value) -> Value {
        let loc = caller_loc(Location::caller());
        let (a, b) = self.broadcast_pair(a, b, &loc);
        let ph = self.ty(a).with_elem(Elem::Num(DType::Bool));
        self.push(
            OpKind::Cmp {
                op,
                lhs: a.0,
                rhs: b.0,
            },
            loc,
            &[ph],
        )[0]
    }
    #[track_caller]
    pub fn unary(&mut self, op: UnOp, v: Value) -> Value {
        let ph = self.ty(v).clone();
        self.push(
            OpKind::Unary { op, value: v.0 },
            caller_loc(Location::caller()),
            &[ph],
        )[0]
    }
    #[track_caller]
    pub fn cast(&mut self, v: Value, to: DType) -> Value {
        let ph = self.ty(v).with_elem(Elem::Num(to));
        self.push(
            OpKind::Cast { value: v.0, to },
            caller_loc(Location::caller()),
            &[ph],
        )[0]
    }
    /// The same bits as `to` (f32 and i32); see [`OpKind::Bitcast`].
    #[track_caller]
    pub fn bitcast(&mut self, v: Value, to: DType) -> Value {
        let ph = self.ty(v).with_elem(Elem::Num(to));
        self.push(
            OpKind::Bitcast { value: v.0, to },
            caller_loc(Location::caller()),
            &[ph],
        )[0]
    }
    #[track_caller]
    pub fn select(&mut self, cond: Value, on_true: Value, on_false: Value) -> Value {
        let loc = caller_loc(Location::caller());
        // Scalars among the three are splatted to the block shape of the others.
        let shape = [cond, on_true, on_false]
            .iter()
            .map(|v| self.ty(*v).shape.clone())
            .find(|s| !s.is_empty());
        let fit = |b: &mut Self, v: Value| match &shape {
            Some(s) if b.ty(v).is_scalar() => b.push1(
                OpKind::Splat {
                    value: v.0,
                    shape: s.clone(),
                },
                loc.clone(),
            ),
            _ => v,
        };
        let (c, t, f) = (fit(self, cond), fit(self, on_true), fit(self, on_false));
        let ph = self.ty(t).clone();
        self.push(
            OpKind::Select {
                cond: c.0,
                on_true: t.0,
                on_false: f.0,
            },
            loc,
            &[ph],
        )[0]
    }

    /// The same pointer viewed as pointing to `to` elements (in the same memory).
    #[track_caller]
    pub fn ptr_cast(&mut self, ptr: Value, to: DType) -> Value {
        let elem = match self.ty(ptr).elem {
            Elem::SharedPtr(_) => Elem::SharedPtr(to),
            _ => Elem::Ptr(to),
        };
        let ph = self.ty(ptr).with_elem(elem);
        self.push(
            OpKind::PtrCast { ptr: ptr.0, to },
            caller_loc(Location::caller()),
            &[ph],
        )[0]
    }

    /// `acc` plus the dot product of the two signed 16-bit halves of `pairs` with two
    /// unsigned bytes of `bytes` (bytes 0 and 1, or 2 and 3 when `high`); see [`OpKind::Dp2a`].
    #[track_caller]
    pub fn dp2a(&mut self, pairs: Value, bytes: Value, acc: Value, high: bool) -> Value {
        let ph = self.ty(pairs).clone();
        let kind = OpKind::Dp2a {
            pairs: pairs.0,
            bytes: bytes.0,
            acc: acc.0,
            high,
        };
        self.push(kind, caller_loc(Location::caller()), &[ph])[0]
    }

    /// `codes . q^T` on the tensor cores; see [`OpKind::DotInt4`].
    #[track_caller]
    pub fn dot_int4(&mut self, codes: Value, q: Value) -> Value {
        let rows = self.ty(codes).shape.first().copied().unwrap_or(16);
        let ph = Type::block(Elem::Num(DType::F32), &[rows, 8]);
        self.push(
            OpKind::DotInt4 {
                codes: codes.0,
                q: q.0,
            },
            caller_loc(Location::caller()),
            &[ph],
        )[0]
    }

    /// `acc + a . b^T` on the tensor cores; see [`OpKind::Dot`].
    #[track_caller]
    pub fn dot(&mut self, a: Value, b: Value, acc: Option<Value>) -> Value {
        self.dot_op(a, b, acc, false, caller_loc(Location::caller()))
    }

    /// `acc + a^T . b^T` on the tensor cores; see [`OpKind::Dot`].
    #[track_caller]
    pub fn dot_ta(&mut self, a: Value, b: Value, acc: Option<Value>) -> Value {
        self.dot_op(a, b, acc, true, caller_loc(Location::caller()))
    }

    fn dot_op(&mut self, a: Value, b: Value, acc: Option<Value>, trans_a: bool, loc: Loc) -> Value {
        let sa = self.ty(a).shape.clone();
        let m = if trans_a { sa.get(1) } else { sa.first() };
        let n = self.ty(b).shape.first().copied().unwrap_or(8);
        let ph = Type::block(Elem::Num(DType::F32), &[m.copied().unwrap_or(8), n]);
        let kind = OpKind::Dot {
            a: a.0,
            b: b.0,
            acc: acc.map(|c| c.0),
            trans_a,
        };
        self.push(kind, loc, &[ph])[0]
    }

    // ---- memory ----

    /// `ptr + offset` in elements; a scalar pointer is splatted to the offset's shape.
    #[track_caller]
    pub fn add_ptr(&mut self, ptr: Value, offset: Value) -> Value {
        let loc = caller_loc(Location::caller());
        let (p, o) = self.broadcast_pair(ptr, offset, &loc);
        let ph = self.ty(p).clone();
        self.push(
            OpKind::AddPtr {
                ptr: p.0,
                offset: o.0,
            },
            loc,
            &[ph],
        )[0]
    }
    #[track_caller]
    pub fn load(&mut self, ptr: Value) -> Value {
        self.load_masked(ptr, None, None)
    }
    /// Loads where `mask` holds; elsewhere the result is `other` (zero when `None`).
    #[track_caller]
    pub fn load_masked(&mut self, ptr: Value, mask: Option<Value>, other: Option<Value>) -> Value {
        self.load_with(ptr, mask, other, false)
    }
    /// As [`KernelBuilder::load_masked`], of global data read once: its lines are the
    /// first the caches evict (see [`OpKind::Load`]).
    #[track_caller]
    pub fn load_streaming(
        &mut self,
        ptr: Value,
        mask: Option<Value>,
        other: Option<Value>,
    ) -> Value {
        self.load_with(ptr, mask, other, true)
    }
    #[track_caller]
    fn load_with(
        &mut self,
        ptr: Value,
        mask: Option<Value>,
        other: Option<Value>,
        streaming: bool,
    ) -> Value {
        let loc = caller_loc(Location::caller());
        let pt = self.ty(ptr).clone();
        let d = match pt.elem {
            Elem::Ptr(d) | Elem::SharedPtr(d) | Elem::Num(d) => d,
        };
        let other = other.map(|o| {
            if self.ty(o).is_scalar() && !pt.is_scalar() {
                self.push1(
                    OpKind::Splat {
                        value: o.0,
                        shape: pt.shape.clone(),
                    },
                    loc.clone(),
                )
            } else {
                o
            }
        });
        let kind = OpKind::Load {
            ptr: ptr.0,
            mask: mask.map(|m| m.0),
            other: other.map(|o| o.0),
            streaming,
        };
        self.push(kind, loc, &[pt.with_elem(Elem::Num(d))])[0]
    }
    #[track_caller]
    pub fn store(&mut self, ptr: Value, value: Value) {
        self.store_masked(ptr, value, None)
    }
    #[track_caller]
    pub fn store_masked(&mut self, ptr: Value, value: Value, mask: Option<Value>) {
        let kind = OpKind::Store {
            ptr: ptr.0,
            value: value.0,
            mask: mask.map(|m| m.0),
        };
        self.push(kind, caller_loc(Location::caller()), &[]);
    }

    /// Reads the pointed-to i32 words from L2 (0 where `mask` is false); see
    /// [`OpKind::LoadFresh`].
    #[track_caller]
    pub fn load_fresh(&mut self, ptr: Value, mask: Option<Value>) -> Value {
        let pt = self.ty(ptr).clone();
        let kind = OpKind::LoadFresh {
            ptr: ptr.0,
            mask: mask.map(|m| m.0),
        };
        self.push(
            kind,
            caller_loc(Location::caller()),
            &[pt.with_elem(Elem::Num(DType::I32))],
        )[0]
    }

    /// Adds `value` to each pointed-to element where `mask` holds, atomically; see
    /// [`OpKind::AtomicAdd`].
    #[track_caller]
    pub fn atomic_add(&mut self, ptr: Value, value: Value, mask: Option<Value>) {
        let kind = OpKind::AtomicAdd {
            ptr: ptr.0,
            value: value.0,
            mask: mask.map(|m| m.0),
        };
        self.push(kind, caller_loc(Location::caller()), &[]);
    }

    /// Brings `bytes` (a multiple of 128) at each pointer where `mask` holds into the cache
    /// `level`; see [`OpKind::Prefetch`].
    #[track_caller]
    pub fn prefetch(&mut self, ptr: Value, mask: Option<Value>, bytes: u32, level: CacheLevel) {
        let kind = OpKind::Prefetch {
            ptr: ptr.0,
            mask: mask.map(|m| m.0),
            bytes,
            level,
        };
        self.push(kind, caller_loc(Location::caller()), &[]);
    }

    /// Starts copying the elements at `src` (global) to `dst` (shared pointers of the same
    /// shape), zeros where `mask` is false, without registers; see [`OpKind::AsyncCopy`].
    /// The copies land once [`KernelBuilder::async_wait`] has waited for their group.
    ///
    /// ```
    /// use dusk_compiler::{DType, KernelBuilder};
    /// let mut b = KernelBuilder::new("stage");
    /// let x = b.param_ptr("x", DType::F16);
    /// let y = b.param_ptr("y", DType::F16);
    /// let tile = b.shared_alloc(DType::F16, 64);
    /// let i = b.arange(0, 64);
    /// let (src, dst) = (b.add_ptr(x, i), b.add_ptr(tile, i));
    /// b.async_copy(dst, src, None);
    /// b.async_commit();
    /// b.async_wait(0);
    /// let t = b.load(dst);
    /// let out = b.add_ptr(y, i);
    /// b.store(out, t);
    /// assert!(b.finish().is_ok());
    /// ```
    #[track_caller]
    pub fn async_copy(&mut self, dst: Value, src: Value, mask: Option<Value>) {
        let kind = OpKind::AsyncCopy {
            dst: dst.0,
            src: src.0,
            mask: mask.map(|m| m.0),
        };
        self.push(kind, caller_loc(Location::caller()), &[]);
    }

    /// Closes the group of copies issued since the last; see [`OpKind::AsyncCommit`].
    #[track_caller]
    pub fn async_commit(&mut self) {
        self.push(OpKind::AsyncCommit, caller_loc(Location::caller()), &[]);
    }

    /// Waits until at most `pending` committed groups of copies are in flight, the others
    /// visible to every thread; see [`OpKind::AsyncWait`].
    #[track_caller]
    pub fn async_wait(&mut self, pending: u32) {
        let kind = OpKind::AsyncWait { pending };
        self.push(kind, caller_loc(Location::caller()), &[]);
    }

    /// The `[rows, cols]` tile at the shared pointer `base`, rows `row_stride` elements
    /// apart; see [`OpKind::LoadTile`].
    #[track_caller]
    pub fn load_tile(&mut self, base: Value, rows: usize, cols: usize, row_stride: usize) -> Value {
        let kind = OpKind::LoadTile {
            base: base.0,
            rows,
            cols,
            row_stride,
        };
        self.push1(kind, caller_loc(Location::caller()))
    }

    /// `len` elements of `dtype` in the program's shared memory; see
    /// [`OpKind::SharedAlloc`].
    #[track_caller]
    pub fn shared_alloc(&mut self, dtype: DType, len: usize) -> Value {
        self.push1(
            OpKind::SharedAlloc { dtype, len },
            caller_loc(Location::caller()),
        )
    }

    /// Counts this program's arrival at `counter` and returns the count before it; see
    /// [`OpKind::Arrive`].
    #[track_caller]
    pub fn arrive(&mut self, counter: Value) -> Value {
        let kind = OpKind::Arrive { counter: counter.0 };
        self.push1(kind, caller_loc(Location::caller()))
    }

    /// Adds 1 to `counter` once this program's stores are made, without waiting; see
    /// [`OpKind::Signal`].
    #[track_caller]
    pub fn signal(&mut self, counter: Value) {
        let kind = OpKind::Signal { counter: counter.0 };
        self.push(kind, caller_loc(Location::caller()), &[]);
    }

    /// Waits a bounded while for the i32 at `counter` to reach `target` and returns the last
    /// count read; see [`OpKind::AwaitCount`].
    #[track_caller]
    pub fn await_count(&mut self, counter: Value, target: Value) -> Value {
        let kind = OpKind::AwaitCount {
            counter: counter.0,
            target: target.0,
        };
        self.push1(kind, caller_loc(Location::caller()))
    }

    /// Waits for the previous kernel on the stream; see [`OpKind::WaitPriorGrid`].
    #[track_caller]
    pub fn wait_prior_grid(&mut self) {
        self.push(OpKind::WaitPriorGrid, caller_loc(Location::caller()), &[]);
    }

    /// Waits for every thread of the program, their memory accesses visible; see
    /// [`OpKind::Barrier`].
    #[track_caller]
    pub fn barrier(&mut self) {
        self.push(OpKind::Barrier, caller_loc(Location::caller()), &[]);
    }

    /// Pauses the thread for about `ns` nanoseconds; see [`OpKind::Sleep`].
    #[track_caller]
    pub fn sleep(&mut self, ns: u32) {
        self.push(OpKind::Sleep { ns }, caller_loc(Location::caller()), &[]);
    }

    /// Lets the next kernel on the stream start; see [`OpKind::ReleaseDependents`].
    #[track_caller]
    pub fn release_dependents(&mut self) {
        self.push(
            OpKind::ReleaseDependents,
            caller_loc(Location::caller()),
            &[],
        );
    }

    // ---- reductions ----

    #[track_caller]
    pub fn reduce(&mut self, op: ReduceOp, v: Value, axis: u8) -> Value {
        let t = self.ty(v).clone();
        let ph = if t.shape.len() == 2 {
            Type::block(t.elem, &[t.shape[1 - (axis as usize).min(1)]])
        } else {
            Type {
                elem: t.elem,
                shape: vec![],
            }
        };
        self.push(
            OpKind::Reduce {
                op,
                value: v.0,
                axis,
            },
            caller_loc(Location::caller()),
            &[ph],
        )[0]
    }
    #[track_caller]
    pub fn sum(&mut self, v: Value, axis: u8) -> Value {
        self.reduce(ReduceOp::Sum, v, axis)
    }
    #[track_caller]
    pub fn max(&mut self, v: Value, axis: u8) -> Value {
        self.reduce(ReduceOp::Max, v, axis)
    }
    #[track_caller]
    pub fn min(&mut self, v: Value, axis: u8) -> Value {
        self.reduce(ReduceOp::Min, v, axis)
    }

    // ---- control flow ----

    /// Inclusive prefix sum of a 1-D i32 or f32 block; see [`OpKind::Scan`].
    #[track_caller]
    pub fn cumsum(&mut self, v: Value) -> Value {
        let t = self.ty(v).clone();
        self.push(
            OpKind::Scan { value: v.0 },
            caller_loc(Location::caller()),
            &[t],
        )[0]
    }

    /// `for i in (lo..hi).step_by(step)`, carrying `init` through `body`, which returns the
    /// next carried values. Returns the final carried values.
    #[track_caller]
    pub fn for_range(
        &mut self,
        lo: Value,
        hi: Value,
        step: Value,
        init: &[Value],
        body: impl FnOnce(&mut Self, Value, &[Value]) -> Vec<Value>,
    ) -> Vec<Value> {
        let loc = caller_loc(Location::caller());
        let iv = self.fresh(Type::scalar(DType::I32));
        let carried: Vec<Value> = init
            .iter()
            .map(|v| Value(self.fresh(self.ty(*v).clone())))
            .collect();
        self.stack.push(Region {
            args: std::iter::once(iv)
                .chain(carried.iter().map(|v| v.0))
                .collect(),
            ops: vec![],
        });
        let next = body(self, Value(iv), &carried);
        self.stack.last_mut().expect("open region").ops.push(Op {
            kind: OpKind::Yield {
                values: next.iter().map(|v| v.0).collect(),
            },
            results: vec![],
            loc: loc.clone(),
        });
        let region = self.stack.pop().expect("loop region");
        let ph: Vec<Type> = init.iter().map(|v| self.ty(*v).clone()).collect();
        let kind = OpKind::For {
            lo: lo.0,
            hi: hi.0,
            step: step.0,
            init: init.iter().map(|v| v.0).collect(),
            body: region,
        };
        self.push(kind, loc, &ph)
    }

    /// `if cond { then } else { otherwise }`, each arm returning the same result types.
    #[track_caller]
    pub fn if_else(
        &mut self,
        cond: Value,
        then: impl FnOnce(&mut Self) -> Vec<Value>,
        otherwise: impl FnOnce(&mut Self) -> Vec<Value>,
    ) -> Vec<Value> {
        let loc = caller_loc(Location::caller());
        let then_region = self.arm(then, &loc);
        let else_region = self.arm(otherwise, &loc);
        let ph: Vec<Type> = match then_region.ops.last().map(|o| &o.kind) {
            Some(OpKind::Yield { values }) => values
                .iter()
                .map(|v| self.types[v.0 as usize].clone())
                .collect(),
            _ => vec![],
        };
        self.push(
            OpKind::If {
                cond: cond.0,
                then_region,
                else_region,
            },
            loc,
            &ph,
        )
    }

    /// `if cond { then }` with no results.
    #[track_caller]
    pub fn if_then(&mut self, cond: Value, then: impl FnOnce(&mut Self)) {
        self.if_else(
            cond,
            |b| {
                then(b);
                vec![]
            },
            |_| vec![],
        );
    }

    fn arm(&mut self, f: impl FnOnce(&mut Self) -> Vec<Value>, loc: &Loc) -> Region {
        self.stack.push(Region::default());
        let vals = f(self);
        self.stack.last_mut().expect("open region").ops.push(Op {
            kind: OpKind::Yield {
                values: vals.iter().map(|v| v.0).collect(),
            },
            results: vec![],
            loc: loc.clone(),
        });
        self.stack.pop().expect("arm region")
    }

    /// The finished kernel, verified; or the first error met while building it.
    pub fn finish(mut self) -> Result<Kernel, CompileError> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        let body = self.stack.pop().expect("top region");
        let k = Kernel {
            name: self.name,
            params: self.params,
            body,
            types: self.types,
            num_warps: self.num_warps,
            min_programs_per_sm: self.min_programs_per_sm,
            vector_bytes: self.vector_bytes,
        };
        verify(&k)?;
        Ok(k)
    }
}

macro_rules! binary_methods {
    ($($name:ident => $op:ident),* $(,)?) => {
        impl KernelBuilder {
            $(
                #[track_caller]
                pub fn $name(&mut self, a: Value, b: Value) -> Value {
                    self.binary(BinOp::$op, a, b)
                }
            )*
        }
    };
}
binary_methods!(add => Add, sub => Sub, mul => Mul, div => Div, rem => Rem, minimum => Min,
    maximum => Max, and => And, or => Or, xor => Xor, shl => Shl, shr => Shr);

macro_rules! cmp_methods {
    ($($name:ident => $op:ident),* $(,)?) => {
        impl KernelBuilder {
            $(
                #[track_caller]
                pub fn $name(&mut self, a: Value, b: Value) -> Value {
                    self.cmp(CmpOp::$op, a, b)
                }
            )*
        }
    };
}
cmp_methods!(eq => Eq, ne => Ne, lt => Lt, le => Le, gt => Gt, ge => Ge);

macro_rules! unary_methods {
    ($($name:ident => $op:ident),* $(,)?) => {
        impl KernelBuilder {
            $(
                #[track_caller]
                pub fn $name(&mut self, v: Value) -> Value {
                    self.unary(UnOp::$op, v)
                }
            )*
        }
    };
}
unary_methods!(neg => Neg, not => Not, abs => Abs, exp2 => Exp2, log2 => Log2, sqrt => Sqrt, rsqrt => Rsqrt);
