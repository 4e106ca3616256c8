//! Axis analysis: what is known, per dimension, about the integers and pointers of a
//! kernel, so that loads and stores can be vectorized (Triton's AxisInfo, simplified).
//!
//! For each dimension: `contiguity` (values rise by one along runs of this many elements),
//! `divisibility` (the first value of each run is a multiple of this power of two; bytes
//! for pointers) and `constancy` (values are equal along runs of this many elements).
//! Pointer parameters are assumed 16-byte aligned, as every CUDA allocation is.
//!
//! Paged addressing splits a token index into a page and a slot, `t >> log2(page_size)`
//! and `t & (page_size - 1)`: the shift of a contiguous run is constant along runs of a
//! page, the mask contiguous along them, and a page id loaded through pointers constant
//! along runs is constant along the same runs; so a row of a page's slots is still read in
//! vectors.
//!
//! A loop's carried values (a page id loaded one tile ahead, say) are taken to be as known as
//! their initial values; the body is walked again with less wherever what it yields knows
//! less, until nothing changes.

use crate::ir::*;
use std::collections::HashMap;

#[derive(Clone, Debug, PartialEq)]
pub struct AxisInfo {
    pub contiguity: Vec<usize>,
    pub divisibility: Vec<u64>,
    pub constancy: Vec<usize>,
}

const MAX_DIV: u64 = 1 << 30;

fn pow2_divisor(v: i64) -> u64 {
    if v == 0 {
        MAX_DIV
    } else {
        (1u64 << v.unsigned_abs().trailing_zeros()).min(MAX_DIV)
    }
}

impl AxisInfo {
    /// Nothing known. Scalars are treated as one dimension of one element.
    fn unknown(rank: usize) -> AxisInfo {
        let n = rank.max(1);
        AxisInfo {
            contiguity: vec![1; n],
            divisibility: vec![1; n],
            constancy: vec![1; n],
        }
    }
    fn uniform(shape: &[usize], div: u64) -> AxisInfo {
        let constancy = if shape.is_empty() {
            vec![1]
        } else {
            shape.to_vec()
        };
        AxisInfo {
            contiguity: vec![1; constancy.len()],
            divisibility: vec![div; constancy.len()],
            constancy,
        }
    }
}

/// Axis facts for every integer and pointer value, plus known constant scalars.
pub struct AxisInfos {
    pub of: HashMap<ValueId, AxisInfo>,
    consts: HashMap<ValueId, i64>,
}

impl AxisInfos {
    pub fn get(&self, v: ValueId) -> Option<&AxisInfo> {
        self.of.get(&v)
    }
}

pub fn analyze(k: &Kernel) -> AxisInfos {
    let mut a = AxisInfos {
        of: HashMap::new(),
        consts: HashMap::new(),
    };
    for p in &k.params {
        let div = if matches!(p.ty.elem, Elem::Ptr(_)) {
            16
        } else {
            1
        };
        a.of.insert(p.value, AxisInfo::uniform(&[], div));
    }
    analyze_region(k, &mut a, &k.body);
    a
}

fn analyze_region(k: &Kernel, a: &mut AxisInfos, region: &Region) {
    for op in &region.ops {
        if let OpKind::For { init, body, .. } = &op.kind {
            analyze_loop(k, a, op, init, body);
            continue;
        }
        visit(k, a, op);
        for r in op.kind.regions() {
            analyze_region(k, a, r);
        }
    }
}

/// Walks a loop's body with its carried values (`body.args[1..]`) assumed as known as the
/// meet of their initial values and what each walk found the body yields; facts only shrink,
/// so a few walks settle (after 8, nothing is assumed). The loop's results get the settled
/// facts.
fn analyze_loop(k: &Kernel, a: &mut AxisInfos, op: &Op, init: &[ValueId], body: &Region) {
    let carried = &body.args[1..];
    let walk = |a: &mut AxisInfos, assumed: &[Option<AxisInfo>]| {
        for (arg, info) in carried.iter().zip(assumed) {
            match info {
                Some(i) => a.of.insert(*arg, i.clone()),
                None => a.of.remove(arg),
            };
        }
        analyze_region(k, a, body);
    };
    let mut assumed: Vec<Option<AxisInfo>> = init.iter().map(|v| a.of.get(v).cloned()).collect();
    let mut settled = false;
    for _ in 0..8 {
        walk(a, &assumed);
        let yielded = match body.ops.last().map(|o| &o.kind) {
            Some(OpKind::Yield { values }) => values.as_slice(),
            _ => &[],
        };
        let next: Vec<Option<AxisInfo>> = assumed
            .iter()
            .zip(yielded)
            .map(|(x, y)| meet(x.as_ref(), a.of.get(y)))
            .collect();
        settled = next == assumed;
        if settled {
            break;
        }
        assumed = next;
    }
    if !settled {
        assumed.iter_mut().for_each(|x| *x = None);
        walk(a, &assumed);
    }
    for (res, info) in op.results.iter().zip(&assumed) {
        if let Some(i) = info {
            a.of.insert(*res, i.clone());
        }
    }
}

/// What is known of a value that is either `x` or `y`.
fn meet(x: Option<&AxisInfo>, y: Option<&AxisInfo>) -> Option<AxisInfo> {
    let (x, y) = (x?, y?);
    let n = x.contiguity.len();
    if y.contiguity.len() != n {
        return None;
    }
    Some(AxisInfo {
        contiguity: (0..n)
            .map(|d| x.contiguity[d].min(y.contiguity[d]))
            .collect(),
        divisibility: (0..n)
            .map(|d| x.divisibility[d].min(y.divisibility[d]))
            .collect(),
        constancy: (0..n).map(|d| x.constancy[d].min(y.constancy[d])).collect(),
    })
}

fn visit(k: &Kernel, a: &mut AxisInfos, op: &Op) {
    use OpKind::*;
    let Some(&res) = op.results.first() else {
        return;
    };
    let shape = k.ty(res).shape.clone();
    let rank = shape.len();
    let get = |a: &AxisInfos, v: ValueId| {
        a.of.get(&v)
            .cloned()
            .unwrap_or_else(|| AxisInfo::unknown(k.ty(v).shape.len()))
    };
    let info = match &op.kind {
        Constant {
            value: Const::Int(c),
            ..
        } => {
            a.consts.insert(res, *c);
            AxisInfo::uniform(&[], pow2_divisor(*c))
        }
        Arange { start, end } => AxisInfo {
            contiguity: vec![(end - start) as usize],
            divisibility: vec![pow2_divisor(*start)],
            constancy: vec![1],
        },
        Splat { value, .. } => {
            if let Some(&c) = a.consts.get(value) {
                a.consts.insert(res, c);
            }
            let d = get(a, *value).divisibility.first().copied().unwrap_or(1);
            AxisInfo::uniform(&shape, d)
        }
        Expand { value, axis, size } => {
            let i = get(a, *value);
            let ax = *axis as usize;
            let mut out = AxisInfo::unknown(2);
            let kept = 1 - ax;
            out.contiguity[kept] = i.contiguity[0];
            out.divisibility[kept] = i.divisibility[0];
            out.constancy[kept] = i.constancy[0];
            out.contiguity[ax] = 1;
            out.divisibility[ax] = i.divisibility[0];
            out.constancy[ax] = *size;
            out
        }
        Cast { value, to } if to.is_int() => get(a, *value),
        PtrCast { ptr, .. } => get(a, *ptr),
        // Shared blocks are placed 16-byte aligned, as parameters are taken to be.
        SharedAlloc { .. } => AxisInfo::uniform(&[], 16),
        // Equal pointers read equal values: a load is constant where its pointers, its mask
        // and the value of masked-off lanes all are.
        Load {
            ptr, mask, other, ..
        } if matches!(k.ty(res).elem, Elem::Num(d) if d.is_int()) => {
            let mut out = AxisInfo::unknown(rank);
            out.constancy = get(a, *ptr).constancy;
            for v in [mask, other].into_iter().flatten() {
                let i = get(a, *v);
                for (c, ic) in out.constancy.iter_mut().zip(&i.constancy) {
                    *c = (*c).min(*ic);
                }
            }
            out
        }
        Cmp { lhs, rhs, .. } => {
            let (x, y) = (get(a, *lhs), get(a, *rhs));
            let mut out = AxisInfo::unknown(rank);
            for d in 0..out.constancy.len() {
                out.constancy[d] = x.constancy[d].min(y.constancy[d]);
            }
            out
        }
        Binary { op: bop, lhs, rhs } => {
            let (x, y) = (get(a, *lhs), get(a, *rhs));
            let cy = a.consts.get(rhs).copied();
            binary(*bop, &x, &y, cy, rank)
        }
        AddPtr { ptr, offset } => {
            let (p, o) = (get(a, *ptr), get(a, *offset));
            let esize = k
                .ty(*ptr)
                .elem
                .pointee()
                .map_or(1, |d| d.size_bytes() as u64);
            let mut out = AxisInfo::unknown(rank);
            for d in 0..out.contiguity.len() {
                out.contiguity[d] = o.contiguity[d]
                    .min(p.constancy[d])
                    .max(p.contiguity[d].min(o.constancy[d]));
                out.divisibility[d] = p.divisibility[d]
                    .min(o.divisibility[d].saturating_mul(esize))
                    .min(MAX_DIV);
                out.constancy[d] = p.constancy[d].min(o.constancy[d]);
            }
            out
        }
        _ => return,
    };
    if let (
        Binary {
            op: BinOp::Mul,
            lhs,
            rhs,
        },
        true,
    ) = (&op.kind, rank == 0)
    {
        if let (Some(x), Some(y)) = (a.consts.get(lhs), a.consts.get(rhs)) {
            a.consts.insert(res, x.wrapping_mul(*y));
        }
    }
    a.of.insert(res, info);
}

/// The length of the runs of `x` along `d` that rise by one from a multiple of their length
/// and lie inside one aligned block of `block` values (a power of two).
fn aligned_run(x: &AxisInfo, d: usize, block: usize) -> usize {
    let div = x.divisibility[d].min(block as u64) as usize;
    x.contiguity[d].min(div).max(1)
}

fn binary(op: BinOp, x: &AxisInfo, y: &AxisInfo, const_rhs: Option<i64>, rank: usize) -> AxisInfo {
    let mut out = AxisInfo::unknown(rank);
    for d in 0..out.contiguity.len() {
        let constancy = x.constancy[d].min(y.constancy[d]);
        out.constancy[d] = constancy;
        match op {
            BinOp::Add | BinOp::Sub => {
                let c = x.contiguity[d].min(y.constancy[d]);
                let c = if op == BinOp::Add {
                    c.max(y.contiguity[d].min(x.constancy[d]))
                } else {
                    c
                };
                out.contiguity[d] = c.max(1);
                out.divisibility[d] = x.divisibility[d].min(y.divisibility[d]);
            }
            BinOp::Mul => {
                out.divisibility[d] = x.divisibility[d]
                    .saturating_mul(y.divisibility[d])
                    .min(MAX_DIV);
                if const_rhs == Some(1) {
                    out.contiguity[d] = x.contiguity[d];
                    out.divisibility[d] = x.divisibility[d];
                }
            }
            BinOp::Shl => {
                if let Some(s) = const_rhs.filter(|s| (0..30).contains(s)) {
                    out.divisibility[d] = x.divisibility[d].saturating_mul(1 << s).min(MAX_DIV);
                }
            }
            BinOp::Div => {
                // Division by a power of two keeps runs of equal values; nothing more is known.
            }
            // `x >> s` is one value along each aligned run of `x` that stays inside a block
            // of 2^s values: runs of min(contiguity, divisibility, 2^s).
            BinOp::Shr => {
                if let Some(s) = const_rhs.filter(|s| (0..31).contains(s)) {
                    let run = aligned_run(x, d, 1 << s);
                    out.constancy[d] = constancy.max(run);
                    out.divisibility[d] = (x.divisibility[d] >> s).max(1);
                }
            }
            // `x & (2^s - 1)` keeps those runs contiguous (from 0 when a run is a whole
            // block).
            BinOp::And => {
                if let Some(m) = const_rhs.filter(|m| *m >= 0 && (*m + 1).count_ones() == 1) {
                    let block = (m + 1) as usize;
                    let run = aligned_run(x, d, block);
                    out.contiguity[d] = run;
                    out.divisibility[d] = if run == block { MAX_DIV } else { run as u64 };
                }
            }
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::KernelBuilder;

    #[test]
    fn row_offsets_times_64_plus_arange_are_16_byte_vectors() {
        let mut b = KernelBuilder::new("t");
        let p = b.param_ptr("p", DType::U8);
        let row = b.param_scalar("row", DType::I32);
        let c64 = b.i32(64);
        let base = b.mul(row, c64);
        let cols = b.arange(0, 64);
        let offs = b.add(base, cols);
        let ptrs = b.add_ptr(p, offs);
        let x = b.load(ptrs);
        b.store(ptrs, x);
        let k = b.finish().unwrap();
        let a = analyze(&k);
        let ptrs = k
            .body
            .ops
            .iter()
            .find(|o| matches!(o.kind, OpKind::AddPtr { .. }))
            .unwrap()
            .results[0];
        let info = a.get(ptrs).unwrap();
        assert_eq!(info.contiguity, vec![64]);
        assert_eq!(info.divisibility, vec![16]);
    }
    /// Token positions split into a page (`t >> 4`, loaded through a page table) and a slot
    /// (`t & 15`): the address of slot `t` of its page is contiguous along each page's 16
    /// slots, and the page mask is constant along them, so the row is read in vectors.
    #[test]
    fn page_and_slot_of_a_token_run_keep_runs_of_a_page() {
        let mut b = KernelBuilder::new("t");
        let p = b.param_ptr("p", DType::F16);
        let table = b.param_ptr("table", DType::I32);
        let n = b.param_scalar("n", DType::I32);
        let t = b.arange(0, 64);
        let four = b.i32(4);
        let j = b.binary(BinOp::Shr, t, four);
        let valid = b.cmp(CmpOp::Lt, j, n);
        let jp = b.add_ptr(table, j);
        let zero = b.i32(0);
        let page = b.load_masked(jp, Some(valid), Some(zero));
        let sixteen = b.i32(16);
        let rows = b.binary(BinOp::Mul, page, sixteen);
        let fifteen = b.i32(15);
        let slot = b.binary(BinOp::And, t, fifteen);
        let offs = b.add(rows, slot);
        let ptrs = b.add_ptr(p, offs);
        let x = b.load_masked(ptrs, Some(valid), None);
        b.store(ptrs, x);
        let k = b.finish().unwrap();
        let a = analyze(&k);
        let of = |v: crate::builder::Value| a.get(v.0).unwrap().clone();
        assert_eq!(of(j).constancy, vec![16]);
        assert_eq!(of(valid).constancy, vec![16]);
        assert_eq!(of(page).constancy, vec![16]);
        assert_eq!(
            (of(slot).contiguity, of(slot).divisibility),
            (vec![16], vec![MAX_DIV])
        );
        assert_eq!(of(ptrs).contiguity, vec![16]);
        assert_eq!(of(ptrs).divisibility, vec![16]);
    }
    /// A page id loaded a tile ahead and carried into the next iteration stays constant
    /// along a page's slots, so the tile's loads through it are still vectors; a carried
    /// value the body replaces by one known less is known less.
    #[test]
    fn values_carried_through_a_loop_keep_what_every_iteration_knows() {
        let mut b = KernelBuilder::new("t");
        let p = b.param_ptr("p", DType::F16);
        let table = b.param_ptr("table", DType::I32);
        let n = b.param_scalar("n", DType::I32);
        let t = b.arange(0, 64);
        let four = b.i32(4);
        let page_of = |b: &mut KernelBuilder, tok: crate::builder::Value| {
            let j = b.binary(BinOp::Shr, tok, four);
            let jp = b.add_ptr(table, j);
            b.load(jp)
        };
        let first = page_of(&mut b, t);
        let (lo, one) = (b.i32(0), b.i32(1));
        let mut seen = None;
        let done = b.for_range(lo, n, one, &[first, t], |b, i, c| {
            let sixty_four = b.i32(64);
            let base = b.binary(BinOp::Mul, i, sixty_four);
            let tok = b.add(base, t);
            let sixteen = b.i32(16);
            let rows = b.binary(BinOp::Mul, c[0], sixteen);
            let fifteen = b.i32(15);
            let slot = b.binary(BinOp::And, tok, fifteen);
            let offs = b.add(rows, slot);
            let ptrs = b.add_ptr(p, offs);
            let x = b.load(ptrs);
            b.store(ptrs, x);
            seen = Some((c[0], c[1], ptrs));
            let ahead = b.add(tok, sixty_four);
            let next = page_of(b, ahead);
            // The second carried value: the run first, a scattered load after.
            let scattered = b.add_ptr(table, c[1]);
            let lost = b.load(scattered);
            vec![next, lost]
        });
        let k = b.finish().unwrap();
        let a = analyze(&k);
        let of = |v: crate::builder::Value| a.get(v.0).unwrap().clone();
        let (page, run, ptrs) = seen.unwrap();
        assert_eq!(of(page).constancy, vec![16]);
        assert_eq!(of(done[0]).constancy, vec![16]);
        assert_eq!(
            (of(ptrs).contiguity, of(ptrs).divisibility),
            (vec![16], vec![16])
        );
        assert_eq!((of(run).contiguity, of(run).constancy), (vec![1], vec![1]));
    }

    /// Runs shorter than a page (8 tokens of pages of 16, from a multiple of 8) stay inside
    /// one page: the shift is constant and the mask contiguous along them.
    #[test]
    fn runs_shorter_than_a_page_stay_in_it() {
        let mut b = KernelBuilder::new("t");
        let p = b.param_ptr("p", DType::F16);
        let tile = b.program_id(0);
        let start = b.mul_c(tile, 8);
        let lanes = b.arange(0, 8);
        let t = b.add(start, lanes);
        let four = b.i32(4);
        let page = b.binary(BinOp::Shr, t, four);
        let fifteen = b.i32(15);
        let slot = b.binary(BinOp::And, t, fifteen);
        let base = b.mul_c(page, 64);
        let offs = b.add(base, slot);
        let ptrs = b.add_ptr(p, offs);
        let x = b.load(ptrs);
        b.store(ptrs, x);
        let k = b.finish().unwrap();
        let a = analyze(&k);
        let of = |v: crate::builder::Value| a.get(v.0).unwrap().clone();
        assert_eq!(of(page).constancy, vec![8]);
        assert_eq!(
            (of(slot).contiguity, of(slot).divisibility),
            (vec![8], vec![8])
        );
        assert_eq!(
            (of(ptrs).contiguity, of(ptrs).divisibility),
            (vec![8], vec![16])
        );
    }
}
