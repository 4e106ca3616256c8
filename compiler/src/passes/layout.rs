//! Layout assignment: how each block value is spread over the threads of a program.
//!
//! A 2-D block's layout depends only on its shape, so elementwise ops never move data. A
//! 1-D block takes the layout its neighbours need: the row (or column) slice of the 2-D
//! layout it is reduced from or expanded into; a plain blocked layout otherwise. Values
//! tied by elementwise ops, loop carries and branch results share one layout; where a
//! producer and a consumer disagree the code generator converts through shared memory.

use crate::ir::*;
use std::collections::HashMap;

/// A Triton-style blocked layout, last dimension fastest: each thread holds
/// `size_per_thread` contiguous elements, a warp's lanes tile `threads_per_warp`, warps tile
/// `warps_per_cta`; the pattern repeats to cover the shape, or is replicated where the shape
/// is smaller than one tile.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Blocked {
    pub shape: Vec<usize>,
    pub size_per_thread: Vec<usize>,
    pub threads_per_warp: Vec<usize>,
    pub warps_per_cta: Vec<usize>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Layout {
    /// Uniform across all threads.
    Scalar,
    Blocked(Blocked),
    /// The 1-D layout left when dimension `dim` of a 2-D parent is removed: each thread holds
    /// the parent's coordinates along the other dimension.
    Slice {
        parent: Blocked,
        dim: usize,
    },
}

impl Blocked {
    /// The layout for `shape` with `vec` contiguous elements per thread along the last dim.
    pub fn new(shape: &[usize], vec: usize, num_warps: usize) -> Blocked {
        let last = shape.len() - 1;
        let mut spt = vec![1; shape.len()];
        spt[last] = vec.min(shape[last]).max(1);
        let mut tpw = vec![1; shape.len()];
        let mut lanes = 32;
        // Lanes fill the last dimension first, then the one before it.
        for d in (0..shape.len()).rev() {
            let want = (shape[d] / spt[d]).max(1);
            let t = want.min(lanes);
            tpw[d] = t;
            lanes /= t;
        }
        tpw[0] *= lanes;
        let mut wpc = vec![1; shape.len()];
        let mut warps = num_warps;
        // Warps fill the first dimension first, so row reductions stay within a warp.
        for d in 0..shape.len() {
            let want = (shape[d] / (spt[d] * tpw[d])).max(1);
            let w = want.min(warps);
            wpc[d] = w;
            warps /= w;
        }
        wpc[0] *= warps;
        Blocked {
            shape: shape.to_vec(),
            size_per_thread: spt,
            threads_per_warp: tpw,
            warps_per_cta: wpc,
        }
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }
    /// Elements covered by one tile of all the threads along `d`.
    pub fn tile(&self, d: usize) -> usize {
        self.size_per_thread[d] * self.threads_per_warp[d] * self.warps_per_cta[d]
    }
    /// Elements each thread holds along `d`.
    pub fn per_thread(&self, d: usize) -> usize {
        (self.shape[d] / self.tile(d)).max(1) * self.size_per_thread[d]
    }
    /// Stride of dimension `d` in the lane index (last dimension fastest).
    pub fn lane_stride(&self, d: usize) -> usize {
        self.threads_per_warp[d + 1..].iter().product()
    }
    pub fn warp_stride(&self, d: usize) -> usize {
        self.warps_per_cta[d + 1..].iter().product()
    }
    /// The coordinate along `d` of per-thread index `i` (without the thread's base).
    pub fn slot_offset(&self, d: usize, i: usize) -> usize {
        let spt = self.size_per_thread[d];
        (i / spt) * self.tile(d) + i % spt
    }
}

impl Layout {
    /// Whether every thread holds the same elements, in the same order, under both layouts,
    /// so no data needs to move between them. Row slices of two parents that spread rows
    /// alike are equivalent even when the parents' columns differ.
    pub fn equivalent(&self, other: &Layout) -> bool {
        match (self, other) {
            (Layout::Slice { parent: a, dim: da }, Layout::Slice { parent: b, dim: db }) => {
                let (ka, kb) = (1 - da, 1 - db);
                a.shape[ka] == b.shape[kb]
                    && a.size_per_thread[ka] == b.size_per_thread[kb]
                    && a.threads_per_warp[ka] == b.threads_per_warp[kb]
                    && a.warps_per_cta[ka] == b.warps_per_cta[kb]
                    && a.lane_stride(ka) == b.lane_stride(kb)
                    && a.warp_stride(ka) == b.warp_stride(kb)
            }
            _ => self == other,
        }
    }

    /// Number of elements each thread holds.
    pub fn slots(&self) -> usize {
        match self {
            Layout::Scalar => 1,
            Layout::Blocked(b) => (0..b.rank()).map(|d| b.per_thread(d)).product(),
            Layout::Slice { parent, dim } => parent.per_thread(1 - dim),
        }
    }
}

/// The layouts of all block values of a kernel.
pub struct Layouts {
    pub of: HashMap<ValueId, Layout>,
}

impl Layouts {
    pub fn get(&self, v: ValueId) -> &Layout {
        self.of.get(&v).unwrap_or(&Layout::Scalar)
    }
}

struct UnionFind {
    parent: Vec<usize>,
}

impl UnionFind {
    fn find(&mut self, x: usize) -> usize {
        let mut r = x;
        while self.parent[r] != r {
            r = self.parent[r];
        }
        let mut c = x;
        while self.parent[c] != r {
            let n = self.parent[c];
            self.parent[c] = r;
            c = n;
        }
        r
    }
    fn union(&mut self, a: usize, b: usize) {
        let (ra, rb) = (self.find(a), self.find(b));
        if ra != rb {
            self.parent[rb] = ra;
        }
    }
}

/// Elements per thread along the last dimension: enough for accesses of the kernel's
/// `vector_bytes` (16 unless set) of the narrowest type loaded or stored at each shape (4
/// when a shape touches no memory).
fn vector_hints(k: &Kernel) -> HashMap<Vec<usize>, usize> {
    let mut hints: HashMap<Vec<usize>, usize> = HashMap::new();
    walk_ops(&k.body, &mut |op| {
        let ptr = match &op.kind {
            OpKind::Load { ptr, .. }
            | OpKind::Store { ptr, .. }
            | OpKind::AsyncCopy { src: ptr, .. } => *ptr,
            _ => return,
        };
        let t = k.ty(ptr);
        if let (Some(d), false) = (t.elem.pointee(), t.is_scalar()) {
            let v = (k.vector_bytes as usize / d.size_bytes()).max(1);
            let e = hints.entry(t.shape.clone()).or_insert(v);
            *e = (*e).max(v);
        }
    });
    hints
}

/// Elements per thread along the last dimension that tensor-core ops need of their operands
/// and result (they override the memory hints): `dot_int4` wants 4 threads per row of codes
/// and of q, each holding a quarter of the row, and its result in pairs of columns. `dot`
/// wants the same of its operands along the summed dimension (so a thread's own loaded run
/// is its fragment); `dot_ta` wants a quarter of each row of `a` (staged through shared
/// memory and read back transposed) and pairs of `b`, which are then the fragment of `b`.
fn operand_hints(k: &Kernel, hints: &mut HashMap<Vec<usize>, usize>) {
    walk_ops(&k.body, &mut |op| match &op.kind {
        OpKind::DotInt4 { codes, q } => {
            let (c, qt) = (k.ty(*codes), k.ty(*q));
            hints.insert(c.shape.clone(), c.shape[1] / 4);
            hints.insert(qt.shape.clone(), qt.shape[1] / 4);
            hints.insert(k.ty(op.results[0]).shape.clone(), 2);
        }
        OpKind::Dot { a, b, trans_a, .. } => {
            let (at, bt) = (k.ty(*a), k.ty(*b));
            hints.insert(at.shape.clone(), at.shape[1] / 4);
            hints.insert(bt.shape.clone(), if *trans_a { 2 } else { bt.shape[1] / 4 });
            hints.insert(k.ty(op.results[0]).shape.clone(), 2);
        }
        _ => {}
    });
}

/// A 2-D shape that touches no memory takes the hint of the shape whose reduction it
/// expands along the same dimension (`expand(sum(x, a), a, n)`, `x` of a shape with a
/// hint), so that the reduced 1-D block enters it in the layout it already has instead of
/// through shared memory: a `[G, N]` block accumulating row sums of a loaded `[C, N]` one,
/// for instance, spreads `N` as the load does.
fn inherited_hints(k: &Kernel, hints: &mut HashMap<Vec<usize>, usize>) {
    let mut reduced: HashMap<ValueId, (Vec<usize>, u8)> = HashMap::new();
    let mut expands: Vec<(ValueId, u8, Vec<usize>)> = vec![];
    walk_ops(&k.body, &mut |op| match &op.kind {
        OpKind::Reduce { value, axis, .. } if k.ty(*value).shape.len() == 2 => {
            reduced.insert(op.results[0], (k.ty(*value).shape.clone(), *axis));
        }
        OpKind::Expand { value, axis, .. } => {
            expands.push((*value, *axis, k.ty(op.results[0]).shape.clone()));
        }
        _ => {}
    });
    for (value, axis, out) in expands {
        if hints.contains_key(&out) {
            continue;
        }
        if let Some((from, a)) = reduced.get(&value) {
            if *a == axis && from[1 - axis as usize] == out[1 - axis as usize] {
                if let Some(&h) = hints.get(from) {
                    hints.insert(out, h);
                }
            }
        }
    }
}

/// Assigns a layout to every block value of `k`.
pub fn assign(k: &Kernel) -> Layouts {
    let mut hints = vector_hints(k);
    operand_hints(k, &mut hints);
    inherited_hints(k, &mut hints);
    let nw = k.num_warps as usize;
    let blocked_for = |shape: &[usize]| Blocked::new(shape, *hints.get(shape).unwrap_or(&4), nw);
    let mut uf = UnionFind {
        parent: (0..k.types.len()).collect(),
    };
    // 1-D classes: the layouts demanded by producers (reductions) and by consumers (expands).
    let mut produced: Vec<(ValueId, Layout)> = vec![];
    let mut consumed: Vec<(ValueId, Layout)> = vec![];
    walk_ops(&k.body, &mut |op| {
        use OpKind::*;
        let res = op.results.first().copied();
        match &op.kind {
            Binary { lhs, rhs, .. } | Cmp { lhs, rhs, .. } => {
                uf.union(lhs.0 as usize, rhs.0 as usize);
                uf.union(lhs.0 as usize, res.expect("result").0 as usize);
            }
            Unary { value, .. }
            | Cast { value, .. }
            | Bitcast { value, .. }
            | PtrCast { ptr: value, .. }
            | Scan { value } => uf.union(value.0 as usize, res.expect("result").0 as usize),
            Dp2a {
                pairs, bytes, acc, ..
            } => {
                let r = res.expect("result").0 as usize;
                for v in [pairs, bytes, acc] {
                    uf.union(v.0 as usize, r);
                }
            }
            Select {
                cond,
                on_true,
                on_false,
            } => {
                let r = res.expect("result").0 as usize;
                for v in [on_true, on_false] {
                    uf.union(v.0 as usize, r);
                }
                if !k.ty(*cond).is_scalar() {
                    uf.union(cond.0 as usize, r);
                }
            }
            AddPtr { ptr, offset } => {
                uf.union(ptr.0 as usize, offset.0 as usize);
                uf.union(ptr.0 as usize, res.expect("result").0 as usize);
            }
            Load {
                ptr, mask, other, ..
            } => {
                let r = res.expect("result").0 as usize;
                uf.union(ptr.0 as usize, r);
                for v in mask.iter().chain(other.iter()) {
                    uf.union(v.0 as usize, r);
                }
            }
            Store { ptr, value, mask } | AtomicAdd { ptr, value, mask } => {
                uf.union(ptr.0 as usize, value.0 as usize);
                if let Some(m) = mask {
                    uf.union(ptr.0 as usize, m.0 as usize);
                }
            }
            Prefetch {
                ptr, mask: Some(m), ..
            } => uf.union(ptr.0 as usize, m.0 as usize),
            AsyncCopy { dst, src, mask } => {
                uf.union(dst.0 as usize, src.0 as usize);
                if let Some(m) = mask {
                    uf.union(src.0 as usize, m.0 as usize);
                }
            }
            LoadFresh { ptr, mask } => {
                let r = res.expect("result").0 as usize;
                uf.union(ptr.0 as usize, r);
                if let Some(m) = mask {
                    uf.union(m.0 as usize, r);
                }
            }
            For { init, body, .. } => {
                let yields = match body.ops.last().map(|o| &o.kind) {
                    Some(Yield { values }) => values.clone(),
                    _ => vec![],
                };
                for (i, v) in init.iter().enumerate() {
                    let a = body.args[i + 1].0 as usize;
                    uf.union(v.0 as usize, a);
                    uf.union(op.results[i].0 as usize, a);
                    if let Some(y) = yields.get(i) {
                        uf.union(y.0 as usize, a);
                    }
                }
            }
            If {
                then_region,
                else_region,
                ..
            } => {
                for r in [then_region, else_region] {
                    if let Some(Yield { values }) = r.ops.last().map(|o| &o.kind) {
                        for (v, res) in values.iter().zip(&op.results) {
                            uf.union(v.0 as usize, res.0 as usize);
                        }
                    }
                }
            }
            Reduce { value, axis, .. } => {
                let t = k.ty(*value);
                if t.shape.len() == 2 {
                    let parent = blocked_for(&t.shape);
                    produced.push((
                        res.expect("result"),
                        Layout::Slice {
                            parent,
                            dim: *axis as usize,
                        },
                    ));
                }
            }
            Expand { value, axis, .. } => {
                let parent = blocked_for(&k.ty(res.expect("result")).shape);
                consumed.push((
                    *value,
                    Layout::Slice {
                        parent,
                        dim: *axis as usize,
                    },
                ));
            }
            _ => {}
        }
    });
    let mut class_layout: HashMap<usize, Layout> = HashMap::new();
    for (v, l) in produced.into_iter().chain(consumed) {
        let c = uf.find(v.0 as usize);
        class_layout.entry(c).or_insert(l);
    }
    let mut of = HashMap::new();
    for (i, t) in k.types.iter().enumerate() {
        if t.is_scalar() {
            continue;
        }
        let l = if t.shape.len() == 2 {
            Layout::Blocked(blocked_for(&t.shape))
        } else {
            let c = uf.find(i);
            class_layout
                .get(&c)
                .cloned()
                .unwrap_or_else(|| Layout::Blocked(blocked_for(&t.shape)))
        };
        of.insert(ValueId(i as u32), l);
    }
    Layouts { of }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocked_u8_rows_take_16_bytes_a_thread() {
        let b = Blocked::new(&[64, 64], 16, 4);
        assert_eq!(b.size_per_thread, vec![1, 16]);
        assert_eq!(b.threads_per_warp, vec![8, 4]);
        assert_eq!(b.warps_per_cta, vec![4, 1]);
        assert_eq!(b.per_thread(0), 2);
        assert_eq!(Layout::Blocked(b).slots(), 32);
    }

    /// A `[16, 128]` f16 load: 16 bytes a thread (8 elements, 16 lanes a row) by default,
    /// 32 bytes (16 elements, 8 lanes a row) with `vector_bytes = 32`; the verifier takes
    /// powers of two from 4 to 64 only.
    #[test]
    fn vector_bytes_sets_elements_per_thread() {
        use crate::builder::KernelBuilder;
        let build = |bytes: u32| {
            let mut b = KernelBuilder::new("wide");
            b.set_vector_bytes(bytes);
            let x = b.param_ptr("x", DType::F16);
            let r = b.arange(0, 16);
            let r = b.mul_c(r, 128);
            let r = b.expand(r, 1, 128);
            let c = b.arange(0, 128);
            let c = b.expand(c, 0, 16);
            let o = b.add(r, c);
            let p = b.add_ptr(x, o);
            let v = b.load(p);
            b.store(p, v);
            b.finish()
        };
        for (bytes, spt, lanes) in [(16, 8, 16), (32, 16, 8)] {
            let k = build(bytes).unwrap();
            let l = assign(&k);
            let Some(Layout::Blocked(bl)) = l.of.values().find(|l| match l {
                Layout::Blocked(b) => b.shape == vec![16, 128],
                _ => false,
            }) else {
                panic!("no [16, 128] layout")
            };
            assert_eq!(bl.size_per_thread, vec![1, spt]);
            assert_eq!(bl.threads_per_warp[1], lanes);
        }
        assert!(build(24).is_err());
        assert!(build(128).is_err());
    }

    /// A `[4, 128]` f32 block built from row sums of a loaded `[16, 128]` f16 one and
    /// touching no memory spreads its columns as the load does (8 a thread), so the sums
    /// enter it without moving; with a store of its own it keeps its own hint.
    #[test]
    fn a_block_of_reduced_rows_takes_the_hint_of_their_load() {
        use crate::builder::KernelBuilder;
        let build = |store_it: bool| {
            let mut b = KernelBuilder::new("rows");
            let x = b.param_ptr("x", DType::F16);
            let y = b.param_ptr("y", DType::F32);
            let r = b.arange(0, 16);
            let r = b.mul_c(r, 128);
            let r = b.expand(r, 1, 128);
            let c = b.arange(0, 128);
            let c = b.expand(c, 0, 16);
            let o = b.add(r, c);
            let p = b.add_ptr(x, o);
            let v = b.load(p);
            let v = b.cast(v, DType::F32);
            let s = b.sum(v, 0);
            let e = b.expand(s, 0, 4);
            if store_it {
                let r = b.arange(0, 4);
                let r = b.mul_c(r, 128);
                let r = b.expand(r, 1, 128);
                let c = b.arange(0, 128);
                let c = b.expand(c, 0, 4);
                let o = b.add(r, c);
                let q = b.add_ptr(y, o);
                b.store(q, e);
            } else {
                let t = b.sum(e, 0);
                let c = b.arange(0, 128);
                let q = b.add_ptr(y, c);
                b.store(q, t);
            }
            b.finish().unwrap()
        };
        for (store_it, spt) in [(false, 8), (true, 4)] {
            let k = build(store_it);
            let l = assign(&k);
            let Some(Layout::Blocked(bl)) = l.of.values().find(|l| match l {
                Layout::Blocked(b) => b.shape == vec![4, 128],
                _ => false,
            }) else {
                panic!("no [4, 128] layout")
            };
            assert_eq!(bl.size_per_thread, vec![1, spt], "stored: {store_it}");
        }
    }

    #[test]
    fn small_blocks_replicate_instead_of_overflowing() {
        let b = Blocked::new(&[8], 4, 4);
        assert_eq!(b.size_per_thread, vec![4]);
        assert_eq!(b.threads_per_warp, vec![32]);
        assert_eq!(b.warps_per_cta, vec![4]);
        assert_eq!(b.per_thread(0), 4);
    }
}
