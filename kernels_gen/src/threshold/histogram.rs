//! The search's first step from a histogram of the weights' leading bits, as radix selects
//! narrow on digits: one pass over the row (fused into the pass that computes the weights)
//! adds each `e`'s mass and a count to its bucket in shared memory, then every bucket edge is
//! tried at once, so the bracket starts one bucket wide instead of at `[0, max]`.
//!
//! A non-negative f32's bit pattern orders like the float, so the bucket of `e` (its
//! exponent and first [`MANTISSA_BITS`] mantissa bits, counted down from the maximum's
//! `e = 1`) is monotone in `e`, and the set kept at the edge where bucket `j` starts is
//! exactly the buckets from `j` up: the tallies at the edges are suffix sums of the
//! histogram. The masses are added in whatever order the atomics land, so they may differ
//! from an ordered sum by rounding only; the counts are exact. [`BUCKETS`] buckets of
//! 1/32 octave reach 32 octaves below the maximum; every weight below lands in bucket 0.

use super::search::{holds_at, RowTotals, Tally};
use super::{Policy, SearchTarget};
use dusk_compiler::{DType, KernelBuilder, Value};

/// Buckets of the histogram (f32 mass and i32 count each: 8 KiB of shared memory).
pub(super) const BUCKETS: usize = 1024;

/// Mantissa bits in a bucket index beside the exponent: 32 buckets an octave.
const MANTISSA_BITS: u32 = 5;

/// Bits below the bucket index in a weight's pattern.
const SHIFT: u32 = 23 - MANTISSA_BITS;

/// The bucket index of the pattern of `1.0` (the row maximum's `e`) is `BUCKETS - 1`; this
/// is what is taken off a pattern's leading bits to get its bucket.
const BASE: i32 = (0x3F80_0000u32 >> SHIFT) as i32 - (BUCKETS as i32 - 1);

/// The histogram's two blocks of shared memory.
pub(super) struct Histogram {
    mass: Value,
    count: Value,
}

impl Histogram {
    /// Allocates the buckets (once a kernel; [`Histogram::clear`] before each row).
    pub(super) fn new(b: &mut KernelBuilder) -> Histogram {
        Histogram {
            mass: b.shared_alloc(DType::F32, BUCKETS),
            count: b.shared_alloc(DType::I32, BUCKETS),
        }
    }

    /// Empties the buckets.
    pub(super) fn clear(&self, b: &mut KernelBuilder) {
        let all = b.arange(0, BUCKETS as i64);
        let (zf, zi) = (b.f32(0.0), b.i32(0));
        let zeros_f = b.splat(zf, &[BUCKETS]);
        let zeros_i = b.splat(zi, &[BUCKETS]);
        let pm = b.add_ptr(self.mass, all);
        b.store(pm, zeros_f);
        let pc = b.add_ptr(self.count, all);
        b.store(pc, zeros_i);
    }

    /// Adds a block of weights `es` (where `valid`) to the buckets.
    pub(super) fn add(&self, b: &mut KernelBuilder, es: Value, valid: Value) {
        let bits = b.bitcast(es, DType::I32);
        let shift = b.i32(SHIFT as i32);
        let lead = b.shr(bits, shift);
        let base = b.i32(BASE);
        let bucket = b.sub(lead, base);
        let (zero, last) = (b.i32(0), b.i32(BUCKETS as i32 - 1));
        let bucket = b.maximum(bucket, zero);
        let bucket = b.minimum(bucket, last);
        let pm = b.add_ptr(self.mass, bucket);
        b.atomic_add(pm, es, Some(valid));
        let shape = b.ty(es).shape.clone();
        let one = b.i32(1);
        let ones = b.splat(one, &shape);
        let pc = b.add_ptr(self.count, bucket);
        b.atomic_add(pc, ones, Some(valid));
    }

    /// The bracket after the histogram, in the layout of
    /// [`super::search::initial_bracket`]: the policy's target (its mass or count, `target`)
    /// reached at every bucket edge at once picks the highest edge `J` reaching it, then the
    /// policy itself is tried at `J` and the next edge up, as any search step tries a pivot.
    /// Where it holds at `J` and fails above (always, for a policy that is its target) the
    /// bracket is that one bucket; otherwise it is the side that is known (the policy fails
    /// at `J`: `[init lo, J)`; holds above: `[J + 1, init hi)`), and the steps go on from
    /// there. Bucket 0's edge is 0 (`init`'s lo, every candidate kept) and the top bucket's
    /// upper edge `init`'s bound above the maximum. Rows to skip keep `init` (closed).
    pub(super) fn bracket(
        &self,
        b: &mut KernelBuilder,
        policy: &Policy,
        target: SearchTarget,
        params: &[Value],
        row: &RowTotals,
        init: &[Value],
    ) -> Vec<Value> {
        // Read from the top bucket down, so that the running sums are the tallies at the
        // edges: position i is bucket `BUCKETS - 1 - i`.
        let i = b.arange(0, BUCKETS as i64);
        let last = b.i32(BUCKETS as i32 - 1);
        let bucket = b.sub(last, i);
        let pm = b.add_ptr(self.mass, bucket);
        let mass = b.load(pm);
        let pc = b.add_ptr(self.count, bucket);
        let count = b.load(pc);
        let at_mass = b.cumsum(mass);
        let at_count = b.cumsum(count);
        let reached = match target {
            SearchTarget::Mass(p) => {
                let p = b.cast(params[p], DType::F32);
                let want = b.mul(p, row.z);
                let heavy = b.ge(at_mass, want);
                let all_positive = b.ge(at_count, row.n_pos);
                b.or(heavy, all_positive)
            }
            SearchTarget::Count(k) => {
                let k = b.cast(params[k], DType::I32);
                b.ge(at_count, k)
            }
        };
        let zero_i = b.i32(0);
        let above_zero = b.gt(bucket, zero_i);
        let tried = b.and(reached, above_zero);
        let at = b.select(tried, bucket, zero_i);
        let top = b.max(at, 0);
        let one_i = b.i32(1);
        let next = b.add(top, one_i);
        let tally_at = |b: &mut KernelBuilder, j: Value| {
            let here = b.eq(bucket, j);
            let (zf, zi) = (b.f32(0.0), b.i32(0));
            let m = b.select(here, at_mass, zf);
            let c = b.select(here, at_count, zi);
            Tally {
                mass: b.sum(m, 0),
                count: b.sum(c, 0),
                next_up: zf,
                next_down: zf,
            }
        };
        let (t_lo, t_hi) = (tally_at(b, top), tally_at(b, next));
        let edge = |b: &mut KernelBuilder, j: Value| {
            let base = b.i32(BASE);
            let lead = b.add(j, base);
            let shift = b.i32(SHIFT as i32);
            let bits = b.shl(lead, shift);
            b.bitcast(bits, DType::F32)
        };
        let (e_lo, e_hi) = (edge(b, top), edge(b, next));
        let onef = b.f32(1.0);
        let inv_z = b.div(onef, row.z);
        let at_floor = b.eq(top, zero_i);
        let at_top = b.eq(top, last);
        let holds_lo = holds_at(b, policy, params, row, inv_z, &t_lo);
        let holds_lo = b.or(holds_lo, at_floor);
        let holds_hi = holds_at(b, policy, params, row, inv_z, &t_hi);
        let not_top = b.not(at_top);
        let holds_hi = b.and(holds_hi, not_top);
        // [J, J + 1) when the policy agrees with its target there (case A); from init's
        // lo up to J when it fails at J (B); from J + 1 to init's hi when it holds there (C).
        let case_c = b.and(holds_lo, holds_hi);
        let case_b = b.not(holds_lo);
        let pairs = [
            (e_lo, e_hi),
            (t_lo.mass, t_hi.mass),
            (t_lo.count, t_hi.count),
        ];
        let mut lo = vec![];
        let mut hi = vec![];
        for (k, (at_j, at_next)) in pairs.into_iter().enumerate() {
            let (init_lo, init_hi) = (init[[0, 2, 3][k]], init[[1, 4, 5][k]]);
            let l = b.select(at_floor, init_lo, at_j);
            let l = b.select(case_b, init_lo, l);
            lo.push(b.select(case_c, at_next, l));
            let h = b.select(at_top, init_hi, at_next);
            let h = b.select(case_c, init_hi, h);
            hi.push(b.select(case_b, at_j, h));
        }
        let found = [lo[0], hi[0], lo[1], lo[2], hi[1], hi[2]];
        let mut out: Vec<Value> = found
            .iter()
            .zip(init)
            .map(|(f, i)| b.select(row.skip, *i, *f))
            .collect();
        out.extend_from_slice(&init[6..]);
        out
    }
}
