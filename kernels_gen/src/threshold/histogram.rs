//! The search's first step from a histogram of the weights' leading bits, as radix selects
//! narrow on digits: one pass over the row (fused into the pass that computes the weights)
//! adds each `e` to its bucket in shared memory, then every bucket edge is tried at once,
//! so the bracket starts one bucket wide instead of at `[0, max]`.
//!
//! A non-negative f32's bit pattern orders like the float, so the bucket of `e` (its
//! exponent and first [`MANTISSA_BITS`] mantissa bits, counted down from the maximum's
//! `e = 1`) is monotone in `e`, and the set kept at the edge where bucket `j` starts is
//! exactly the buckets from `j` up: the tallies at the edges are suffix sums of the
//! histogram. [`BUCKETS`] buckets of 1/32 octave reach 16 octaves below the maximum;
//! bucket 0's edge is 0 and nothing reads its sums, so the weights it would hold (every
//! weight below the lowest edge: most of a focused row's) are not added to it but to one of
//! [`SPREAD`] slots past the buckets, a different one for each lane of a warp: 32 lanes
//! adding to one address take turns, which made rows of 32768 that keep 2% of their
//! candidates a third slower than rows that keep 86%.
//!
//! The buckets are integers, added to with native shared-memory atomics (an f32 atomic add
//! into shared memory is a compare-and-swap loop on the GPU): a bucket's count and the sum
//! of its weights' bits below the bucket's own (in two parts, so that neither overflows for
//! rows of up to [`MAX_ROW`] candidates). Every weight in bucket `j` is its edge `E_j` plus
//! its low bits times the bucket's unit in the last place, so the bucket's mass is
//! `count * E_j + low_sum * ulp_j`, exact before its conversion to f32: the masses at the
//! edges differ from an ordered sum by rounding only. Rows of at most [`ONE_PART_ROW`]
//! (those staged in shared memory) sum the low bits in one part: one atomic and 2 KiB less.

use super::search::{holds_at, RowTotals, Tally};
use super::{Policy, SearchTarget};
use dusk_compiler::{DType, KernelBuilder, Value};

/// Buckets of the histogram (two or three i32 each: 4 or 6 KiB of shared memory).
pub(super) const BUCKETS: usize = 512;

/// Slots past the buckets that nothing reads, where the weights below the lowest edge and a
/// tile's candidates past the row are added: one per lane of a warp.
const SPREAD: usize = 32;

/// Mantissa bits in a bucket index beside the exponent: 32 buckets an octave.
const MANTISSA_BITS: u32 = 5;

/// Bits below the bucket index in a weight's pattern.
const SHIFT: u32 = 23 - MANTISSA_BITS;

/// The low bits are summed in two parts of `LOW_PART` and `SHIFT - LOW_PART` bits.
const LOW_PART: u32 = 9;

/// The longest rows whose bucket sums cannot overflow (each part under 2^9 a candidate).
pub const MAX_ROW: usize = 1 << 22;

/// The longest rows whose low bits sum in one part (under 2^18 a candidate, 2^31 in all).
pub(super) const ONE_PART_ROW: usize = 1 << 13;

/// The bucket index of the pattern of `1.0` (the row maximum's `e`) is `BUCKETS - 1`; this
/// is what is taken off a pattern's leading bits to get its bucket.
const BASE: i32 = (0x3F80_0000u32 >> SHIFT) as i32 - (BUCKETS as i32 - 1);

/// The histogram's blocks of shared memory, i32 a bucket: counts, and the sums of the low
/// and (for rows longer than [`ONE_PART_ROW`]) the high part of the weights' bits below
/// their bucket's; each with [`SPREAD`] slots more, where what no bucket counts lands.
pub(super) struct Histogram {
    count: Value,
    high: Option<Value>,
    low: Value,
    /// Positions of the running sums over the buckets: `BUCKETS`, or more on programs too
    /// wide for a scan of that many (4 a thread); those past the buckets hold nothing.
    scan: usize,
}

impl Histogram {
    /// Allocates the buckets (once a kernel; [`Histogram::clear`] before each row) of a
    /// program of `num_warps`, for rows of at most [`ONE_PART_ROW`] (`short`) or longer.
    pub(super) fn new(b: &mut KernelBuilder, num_warps: u32, short: bool) -> Histogram {
        Histogram {
            count: b.shared_alloc(DType::I32, BUCKETS + SPREAD),
            high: (!short).then(|| b.shared_alloc(DType::I32, BUCKETS + SPREAD)),
            low: b.shared_alloc(DType::I32, BUCKETS + SPREAD),
            scan: BUCKETS.max(128 * num_warps as usize),
        }
    }

    /// Empties the buckets.
    pub(super) fn clear(&self, b: &mut KernelBuilder) {
        let all = b.arange(0, BUCKETS as i64);
        let zero = b.i32(0);
        let zeros = b.splat(zero, &[BUCKETS]);
        // The addresses first, so that the stores' barriers are back to back (and merge).
        let ptrs: Vec<Value> = self
            .blocks()
            .iter()
            .map(|block| b.add_ptr(*block, all))
            .collect();
        for p in ptrs {
            b.store(p, zeros);
        }
    }

    fn blocks(&self) -> Vec<Value> {
        [Some(self.count), self.high, Some(self.low)]
            .into_iter()
            .flatten()
            .collect()
    }

    /// Adds a block of weights `es` (where `valid`; 1-D) to the buckets.
    pub(super) fn add(&self, b: &mut KernelBuilder, es: Value, valid: Value) {
        let bits = b.bitcast(es, DType::I32);
        let shift = b.i32(SHIFT as i32);
        let lead = b.shr(bits, shift);
        let base = b.i32(BASE);
        let bucket = b.sub(lead, base);
        let (zero, last) = (b.i32(0), b.i32(BUCKETS as i32 - 1));
        let bucket = b.minimum(bucket, last);
        // Candidates past the row and weights below bucket 1 go to the slots after the
        // buckets, so the adds need no mask (a masked shared atomic is a branch around
        // each one). The slot is the element's index / 4 mod 32: a thread holds 4
        // neighbours (16-byte vectors), so the lanes of a warp each get their own.
        let counted = b.gt(bucket, zero);
        let counted = b.and(counted, valid);
        let n = b.ty(es).shape[0];
        let i = b.arange(0, n as i64);
        let two = b.i32(2);
        let quad = b.shr(i, two);
        let lanes = b.i32(SPREAD as i32 - 1);
        let lane = b.and(quad, lanes);
        let spare = b.add_c(lane, BUCKETS as i64);
        let bucket = b.select(counted, bucket, spare);
        let below = b.i32((1 << SHIFT) - 1);
        let rest = b.and(bits, below);
        let shape = b.ty(es).shape.clone();
        let one = b.i32(1);
        let ones = b.splat(one, &shape);
        let mut parts = vec![(self.count, ones)];
        match self.high {
            Some(high) => {
                let part = b.i32(LOW_PART as i32);
                let upper = b.shr(rest, part);
                let low_mask = b.i32((1 << LOW_PART) - 1);
                let lower = b.and(rest, low_mask);
                parts.extend([(high, upper), (self.low, lower)]);
            }
            None => parts.push((self.low, rest)),
        }
        let adds: Vec<(Value, Value)> = parts
            .iter()
            .map(|(block, v)| (b.add_ptr(*block, bucket), *v))
            .collect();
        for (p, v) in adds {
            b.atomic_add(p, v, None);
        }
    }

    /// Bucket `j`'s lower edge `E_j` (f32; its bits are `j + BASE` then zeros).
    fn edge(b: &mut KernelBuilder, j: Value) -> Value {
        let base = b.i32(BASE);
        let lead = b.add(j, base);
        let shift = b.i32(SHIFT as i32);
        let bits = b.shl(lead, shift);
        b.bitcast(bits, DType::F32)
    }

    /// The masses and counts of buckets `j` (a block of bucket indices; nothing below 1)
    /// from their counts and low-bit sums: `count * E_j + (high * 2^LOW_PART + low) * ulp_j`
    /// (`low` alone in one part).
    fn masses(&self, b: &mut KernelBuilder, j: Value) -> (Value, Value) {
        let zero_i = b.i32(0);
        let inside = b.ge(j, zero_i);
        let load = |b: &mut KernelBuilder, block: Value| {
            let p = b.add_ptr(block, j);
            b.load_masked(p, Some(inside), None)
        };
        let (count, low) = (load(b, self.count), load(b, self.low));
        let e = Self::edge(b, j);
        // ulp_j: the power of two of E_j's exponent, 23 binades down.
        let bits = b.bitcast(e, DType::I32);
        let exp_mask = b.i32(0x7F80_0000);
        let exp = b.and(bits, exp_mask);
        let down = b.i32(23 << 23);
        let ulp_bits = b.sub(exp, down);
        let ulp = b.bitcast(ulp_bits, DType::F32);
        let count_f = b.cast(count, DType::F32);
        let low_f = b.cast(low, DType::F32);
        let units = match self.high {
            Some(block) => {
                let high = load(b, block);
                let high_f = b.cast(high, DType::F32);
                let scale = b.f32((1u32 << LOW_PART) as f32);
                let units = b.mul(high_f, scale);
                b.add(units, low_f)
            }
            None => low_f,
        };
        let at_edge = b.mul(count_f, e);
        let above = b.mul(units, ulp);
        let mass = b.add(at_edge, above);
        // Bucket 0 holds everything below the lowest edge: its sums mean nothing.
        let real = b.gt(j, zero_i);
        let zf = b.f32(0.0);
        (b.select(real, mass, zf), count)
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
        let i = b.arange(0, self.scan as i64);
        let last = b.i32(BUCKETS as i32 - 1);
        let bucket = b.sub(last, i);
        let (mass, count) = self.masses(b, bucket);
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
        let (e_lo, e_hi) = (Self::edge(b, top), Self::edge(b, next));
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
