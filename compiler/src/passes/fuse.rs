//! Fuses independent reductions of 1-D blocks of one shape into one `MultiReduce`.
//!
//! A threshold search evaluates several statistics of one row per step (Algorithm 1 of
//! Twilight: the masked sum, the bound below and the bound above, the count). Written as
//! separate `sum`/`max`/`min` calls, each would pay its own exchange through shared memory
//! (two barriers). Fused, every thread folds its elements for all of them, the lanes combine
//! them in one round of shuffles, and the warps exchange them all with one barrier pair. The
//! pass runs on any kernel, so user-written policies get it too.
//!
//! Reductions join a group while no op between them reads an earlier member's result; the
//! fused op takes the place of the group's last member, where every operand is defined and
//! no result has been read yet.

use crate::ir::*;
use std::collections::{HashMap, HashSet};

/// The kernel with every group of two or more fusable reductions made one `MultiReduce`.
pub fn fuse_reductions(k: &Kernel) -> Kernel {
    let mut out = k.clone();
    fuse_region(k, &mut out.body);
    out
}

/// A 1-D-to-scalar reduction's operand shape, if `op` is one.
fn fusable(k: &Kernel, op: &Op) -> Option<Vec<usize>> {
    match &op.kind {
        OpKind::Reduce { value, .. } if k.ty(*value).shape.len() == 1 => {
            Some(k.ty(*value).shape.clone())
        }
        _ => None,
    }
}

/// Every value `op` reads, including inside its nested regions.
fn reads(op: &Op) -> Vec<ValueId> {
    let mut v = op.kind.operands();
    for r in op.kind.regions() {
        walk_ops(r, &mut |o| v.extend(o.kind.operands()));
    }
    v
}

fn fuse_region(k: &Kernel, r: &mut Region) {
    for op in r.ops.iter_mut() {
        match &mut op.kind {
            OpKind::For { body, .. } => fuse_region(k, body),
            OpKind::If {
                then_region,
                else_region,
                ..
            } => {
                fuse_region(k, then_region);
                fuse_region(k, else_region);
            }
            _ => {}
        }
    }
    // Open groups by operand shape: member op indices and their results.
    let mut open: HashMap<Vec<usize>, (Vec<usize>, HashSet<ValueId>)> = HashMap::new();
    let mut groups: Vec<Vec<usize>> = vec![];
    for (i, op) in r.ops.iter().enumerate() {
        let used: Vec<ValueId> = reads(op);
        // A read of a member's result closes that member's group.
        let closed: Vec<Vec<usize>> = open
            .iter()
            .filter(|(_, (_, res))| used.iter().any(|u| res.contains(u)))
            .map(|(s, _)| s.clone())
            .collect();
        for s in closed {
            if let Some((members, _)) = open.remove(&s) {
                groups.push(members);
            }
        }
        if let Some(shape) = fusable(k, op) {
            let g = open.entry(shape).or_default();
            g.0.push(i);
            g.1.extend(op.results.iter().copied());
        }
    }
    groups.extend(open.into_values().map(|(m, _)| m));
    groups.retain(|g| g.len() >= 2);
    if groups.is_empty() {
        return;
    }
    // The fused op replaces the last member; the others are dropped.
    let mut replace: HashMap<usize, Op> = HashMap::new();
    let mut drop: HashSet<usize> = HashSet::new();
    for g in groups {
        let (mut ops, mut values, mut results) = (vec![], vec![], vec![]);
        for &i in &g {
            if let OpKind::Reduce { op, value, .. } = &r.ops[i].kind {
                ops.push(*op);
                values.push(*value);
                results.extend(r.ops[i].results.iter().copied());
            }
        }
        let last = *g.last().expect("two or more members");
        let fused = Op {
            kind: OpKind::MultiReduce { ops, values },
            results,
            loc: r.ops[last].loc.clone(),
        };
        drop.extend(g[..g.len() - 1].iter().copied());
        replace.insert(last, fused);
    }
    let old = std::mem::take(&mut r.ops);
    r.ops = old
        .into_iter()
        .enumerate()
        .filter(|(i, _)| !drop.contains(i))
        .map(|(i, op)| replace.remove(&i).unwrap_or(op))
        .collect();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::KernelBuilder;
    use crate::print::print_kernel;
    use crate::verify::verify;

    fn count(k: &Kernel, name: &str) -> usize {
        let mut n = 0;
        walk_ops(&k.body, &mut |o| n += (o.kind.name() == name) as usize);
        n
    }

    #[test]
    fn independent_reductions_of_one_row_become_one() {
        let mut b = KernelBuilder::new("stats");
        let x = b.param_ptr("x", DType::F32);
        let out = b.param_ptr("out", DType::F32);
        let offs = b.arange(0, 128);
        let p = b.add_ptr(x, offs);
        let v = b.load(p);
        let t = b.f32(0.5);
        let ge = b.ge(v, t);
        let zero = b.f32(0.0);
        let kept = b.select(ge, v, zero);
        let mass = b.sum(kept, 0);
        let hi = b.max(v, 0);
        let lo = b.min(v, 0);
        // Depends on `hi`: must stay apart.
        let centred = b.sub(v, hi);
        let spread = b.sum(centred, 0);
        for (i, s) in [mass, hi, lo, spread].into_iter().enumerate() {
            let i = b.i32(i as i32);
            let p = b.add_ptr(out, i);
            b.store(p, s);
        }
        let k = b.finish().unwrap();
        let f = fuse_reductions(&k);
        verify(&f).unwrap_or_else(|e| panic!("{e}\n{}", print_kernel(&f)));
        assert_eq!(count(&f, "multi_reduce"), 1, "{}", print_kernel(&f));
        assert_eq!(count(&f, "sum"), 1, "{}", print_kernel(&f));
    }

    #[test]
    fn reductions_in_loop_bodies_fuse_too() {
        let mut b = KernelBuilder::new("loop_stats");
        let x = b.param_ptr("x", DType::F32);
        let out = b.param_ptr("out", DType::F32);
        let (lo, hi, step) = (b.i32(0), b.i32(4), b.i32(1));
        let init = b.f32(0.0);
        let r = b.for_range(lo, hi, step, &[init, init], |b, i, c| {
            let offs = b.arange(0, 64);
            let base = b.mul_c(i, 64);
            let offs = b.add(offs, base);
            let p = b.add_ptr(x, offs);
            let v = b.load(p);
            let s = b.sum(v, 0);
            let m = b.max(v, 0);
            let s = b.add(c[0], s);
            let m = b.maximum(c[1], m);
            vec![s, m]
        });
        b.store(out, r[0]);
        let one = b.i32(1);
        let p = b.add_ptr(out, one);
        b.store(p, r[1]);
        let k = b.finish().unwrap();
        let f = fuse_reductions(&k);
        verify(&f).unwrap();
        assert_eq!(count(&f, "multi_reduce"), 1, "{}", print_kernel(&f));
    }
}
