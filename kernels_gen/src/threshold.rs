//! The fused threshold search (Twilight Section 4.2, Algorithm 1) and the pruning policies
//! it runs.
//!
//! For one row of estimated logits `s` (one query head's scores over its candidates),
//! `w = softmax(s * scale)`. A [`Policy`] is a predicate over the set kept at threshold `t`,
//! `{i : w_i >= t}`, that holds for small `t` and fails past one point (it is monotone: the
//! kept set only shrinks as `t` grows). The search finds the largest weight `t*` at which it
//! holds and keeps `{i : w_i >= t*}`; ties at the cut stay together. Top-p is
//! `mass >= p`, top-k `count >= k`.
//!
//! The search, per row, with the row in registers (read from memory once):
//! - softmax statistics: row max, then `e_i = 2^((s_i - max) * scale * log2 e)` and their
//!   sum `z` (weights are `e / z`; `e` of the maximum is exactly 1);
//! - bounds `lo = 0` (assumed to hold: everything kept) and `hi = 1` (the maximum's `e`);
//! - each step tries `mid` between them (the geometric mean, so the first steps find the
//!   octave of the cut), and one pass over the row computes, for the set `e >= mid`, the
//!   mass and the count, and the nearest elements on either side of `mid`. Written as
//!   separate `where`/`sum`/`max`/`min`, the compiler's `fuse_reductions` pass makes them
//!   one pass with one exchange between warps. If the policy holds at `mid` the lower bound
//!   moves up to the smallest element at or above `mid`, else the upper bound moves down to
//!   the largest element below it. Both bounds are element values, so the search stops
//!   when they meet: no weight lies strictly between them and `lo` is `t*`. An iteration
//!   cap (64) is a safety net that keeps the set at `lo`, which always holds.
//!
//! Arithmetic is IEEE f32 (no flush to zero): denormal weights compare and add exactly.
//!
//! Rows with a NaN or infinite logit are marked invalid (flag 1) and keep every candidate;
//! other rows are unaffected. An empty row keeps nothing.
//!
//! With GQA the candidates are per (batch, KV head) and each of the group's query heads is
//! searched on its own scores; the output is the union of the group's kept sets (Twilight
//! Appendix B.2), so attention reads each kept token's K and V once per group.

use dusk_compiler::{CompileError, DType, Kernel, KernelBuilder, Value};

/// The statistics of the set kept at a candidate threshold that a policy may read.
pub struct KeptStats {
    /// Sum of the kept weights (weights sum to 1 over the row), f32.
    pub mass: Value,
    /// Number of kept candidates, i32.
    pub count: Value,
    /// The smallest kept weight, f32.
    pub threshold: Value,
    /// The largest weight left out (negative when every candidate is kept), f32.
    pub below: Value,
    /// The row's largest weight, f32.
    pub max_weight: Value,
    /// Candidates in the row, i32.
    pub candidates: Value,
}

/// One parameter of a policy: a value per row (query head), given when the plan is made
/// and checked on the host before any launch.
#[derive(Clone, Copy, Debug)]
pub struct PolicyParam {
    pub name: &'static str,
    /// `F32` or `I32`.
    pub dtype: DType,
    /// Whether a value is allowed.
    pub check: fn(f64) -> bool,
    /// What `check` asks, for errors: `p > 0.0 && p <= 1.0`.
    pub expected: &'static str,
}

/// The statistic a policy's cut sits at, for the search to interpolate toward: the kept
/// mass reaching parameter `i` (top-p's `p`), or the count reaching it (top-k's `k`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SearchTarget {
    Mass(usize),
    Count(usize),
}

/// A pruning policy: the predicate the search runs, usually made by `#[dusk::policy]`.
#[derive(Clone, Copy)]
pub struct Policy {
    pub name: &'static str,
    pub params: &'static [PolicyParam],
    /// The statistics the predicate reads (`"count"`, ...): the search computes `count`
    /// only when it is read.
    pub reads: &'static [&'static str],
    /// Where the cut usually sits, if the policy says (`#[policy(target(mass = p))]`):
    /// lets the search interpolate instead of bisecting.
    pub target: Option<SearchTarget>,
    /// Emits the predicate (an i1 scalar) into the search kernel, given the kept set's
    /// statistics and the row's parameter values (in the order of `params`).
    pub predicate: fn(&mut KernelBuilder, &KeptStats, &[Value]) -> Value,
}

impl std::fmt::Debug for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Policy")
            .field("name", &self.name)
            .field("params", &self.params)
            .finish()
    }
}

/// Compile-time choices of the search kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SearchConfig {
    /// Candidates a program holds in registers (a power of two): every row's, or with
    /// `stream` one tile's.
    pub block: usize,
    /// Query heads per candidate row (GQA group; 1 for MHA).
    pub group: usize,
    pub num_warps: u32,
    /// Rows stream through in tiles of `block` ([`build_search_streaming`]): any length.
    pub stream: bool,
    /// Points each search step tries at once (1 to 4): more cut the steps (each reads the
    /// row once) at more work a candidate.
    pub pivots: u32,
}

/// Upper bound on search steps; each one moves a bound onto an element, so real rows stop
/// far sooner (about 20 steps for 32k candidates).
pub const MAX_STEPS: i32 = 128;

/// The fewest candidates a program holds: the compaction's prefix sum needs a full tile.
pub const MIN_BLOCK: usize = 1024;

/// The most candidates a program holds in registers: 8 a thread on 32 warps (58 registers,
/// no spills). Longer rows stream ([`build_search_streaming`]).
pub const MAX_BLOCK: usize = 8192;

/// The longest rows the default configuration keeps in registers.
pub const RESIDENT_ROWS: usize = 4096;

/// The tile of the streaming search for long rows.
pub const STREAM_TILE: usize = 4096;

impl SearchConfig {
    /// The default for rows of up to `max_len` candidates, from the configurations timed on
    /// an H100 (`gpu-check threshold` sweeps them; BENCHMARKS.md has the figures): few warps
    /// a row win, since each search step's fixed cost (the exchange between warps, the
    /// scalar bookkeeping every thread repeats) is paid per warp. Rows of up to
    /// [`RESIDENT_ROWS`] sit in the registers of 4 warps; longer ones stream, in tiles of
    /// 2048 on 4 warps up to 8192 candidates (the row stays in L1), of [`STREAM_TILE`] on 8
    /// beyond.
    pub fn for_rows(max_len: usize, group: usize) -> SearchConfig {
        let (block, num_warps, stream) = if max_len <= RESIDENT_ROWS {
            (max_len.next_power_of_two().max(MIN_BLOCK), 4, false)
        } else if max_len <= 8192 {
            (2048, 4, true)
        } else {
            (STREAM_TILE, 8, true)
        };
        SearchConfig {
            block,
            group,
            num_warps,
            stream,
            pivots: 1,
        }
    }
}

/// The kernel name of `policy`'s search for `cfg`.
pub fn search_name(policy: &Policy, cfg: &SearchConfig) -> String {
    let pivots = if cfg.pivots > 1 {
        format!("_k{}", cfg.pivots)
    } else {
        String::new()
    };
    format!(
        "threshold_{}_{}{}_g{}_w{}{pivots}",
        policy.name,
        if cfg.stream { "t" } else { "b" },
        cfg.block,
        cfg.group,
        cfg.num_warps
    )
}

/// The search kernel `cfg` asks for: [`build_search`] or [`build_search_streaming`].
pub fn build(policy: &Policy, cfg: &SearchConfig) -> Result<Kernel, CompileError> {
    if cfg.stream {
        build_search_streaming(policy, cfg)
    } else {
        build_search(policy, cfg)
    }
}

/// Builds the search kernel. Parameters: `scores` (f32; candidate row `r` with `n`
/// candidates from `start` holds query head `g` at `scores[start * group + g * n ..]`, as
/// `spgemv_quant` writes them), `cand_indptr`, `cand_indices` (i32 CSR per candidate row),
/// one pointer per policy parameter (a value per query row), `scale_log2e` (f32: the
/// softmax scale times log2 e), and the outputs `staged` (i32, like `cand_indices`: each
/// row's kept positions, ascending, from the row's start), `budget` (i32 per candidate row:
/// how many), `kept_mass` (f32 per query row) and `flags` (i32 per query row: 1 when the
/// row's logits held NaN or infinity). Grid: one program per candidate row.
pub fn build_search(policy: &Policy, cfg: &SearchConfig) -> Result<Kernel, CompileError> {
    let mut b = KernelBuilder::new(&search_name(policy, cfg));
    b.set_num_warps(cfg.num_warps);
    let scores = b.param_ptr("scores", DType::F32);
    let indptr = b.param_ptr("cand_indptr", DType::I32);
    let indices = b.param_ptr("cand_indices", DType::I32);
    let params: Vec<Value> = policy
        .params
        .iter()
        .map(|p| b.param_ptr(p.name, p.dtype))
        .collect();
    let scale = b.param_scalar("scale_log2e", DType::F32);
    let staged = b.param_ptr("staged", DType::I32);
    let budget = b.param_ptr("budget", DType::I32);
    let kept_mass = b.param_ptr("kept_mass", DType::F32);
    let flags = b.param_ptr("flags", DType::I32);

    let row = b.program_id(0);
    let p0 = b.add_ptr(indptr, row);
    let start = b.load(p0);
    let one = b.i32(1);
    let next = b.add(row, one);
    let p1 = b.add_ptr(indptr, next);
    let end = b.load(p1);
    let n = b.sub(end, start);
    let offs = b.arange(0, cfg.block as i64);
    let valid = b.lt(offs, n);

    let zero_i = b.i32(0);
    let none = b.splat(zero_i, &[cfg.block]);
    let (lo_g, hi_g, step) = (b.i32(0), b.i32(cfg.group as i32), b.i32(1));
    let row_args = |g| RowArgs {
        scores,
        params: &params,
        scale,
        kept_mass,
        flags,
        row,
        g,
        start,
        n,
        offs,
        valid,
    };
    let keep = if cfg.group == 1 {
        // One query head: its own set, no union to carry.
        let g = b.i32(0);
        let kept = search_row(&mut b, policy, cfg, &row_args(g));
        b.cast(kept, DType::I32)
    } else {
        b.for_range(lo_g, hi_g, step, &[none], |b, g, carried| {
            let kept = search_row(b, policy, cfg, &row_args(g));
            let kept = b.cast(kept, DType::I32);
            vec![b.maximum(carried[0], kept)]
        })[0]
    };

    // Ordered compaction of the union: a kept candidate's rank among the kept ones.
    let rank = b.cumsum(keep);
    let total = b.sum(keep, 0);
    let one_b = b.splat(one, &[cfg.block]);
    let is_kept = b.eq(keep, one_b);
    let start64 = b.cast(start, DType::I64);
    let src_row = b.add_ptr(indices, start64);
    let src = b.add_ptr(src_row, offs);
    let tok = b.load_masked(src, Some(is_kept), None);
    let dst_row = b.add_ptr(staged, start64);
    let slot = b.sub(rank, one);
    let dst = b.add_ptr(dst_row, slot);
    b.store_masked(dst, tok, Some(is_kept));
    let pb = b.add_ptr(budget, row);
    b.store(pb, total);
    b.finish()
}

/// What `search_row` reads: the program's candidate row and the kernel's parameters.
struct RowArgs<'a> {
    scores: Value,
    params: &'a [Value],
    scale: Value,
    kept_mass: Value,
    flags: Value,
    row: Value,
    g: Value,
    start: Value,
    n: Value,
    offs: Value,
    valid: Value,
}

/// Searches query head `g`'s row; stores its kept mass and flag and returns its kept set
/// (an i1 block over the candidates).
fn search_row(b: &mut KernelBuilder, policy: &Policy, cfg: &SearchConfig, a: &RowArgs) -> Value {
    let group = b.i32(cfg.group as i32);
    let qrow0 = b.mul(a.row, group);
    let qrow = b.add(qrow0, a.g);
    // scores[start * group + g * n + j]
    let start64 = b.cast(a.start, DType::I64);
    let base = b.mul_c(start64, cfg.group as i64);
    let gn = b.mul(a.g, a.n);
    let gn64 = b.cast(gn, DType::I64);
    let base = b.add(base, gn64);
    let row_ptr = b.add_ptr(a.scores, base);
    let ptrs = b.add_ptr(row_ptr, a.offs);
    let zero = b.f32(0.0);
    let s = b.load_masked(ptrs, Some(a.valid), Some(zero));

    // NaN or infinite logits make the row invalid.
    let mag = b.abs(s);
    let inf = b.f32(f32::INFINITY);
    let finite = b.lt(mag, inf);
    let not_finite = b.not(finite);
    let bad_here = b.and(a.valid, not_finite);
    let one_i = b.i32(1);
    let zero_i = b.i32(0);
    let bad_i = b.select(bad_here, one_i, zero_i);
    let bad_count = b.sum(bad_i, 0);
    let neg_inf = b.f32(f32::NEG_INFINITY);
    let s_valid = b.select(a.valid, s, neg_inf);
    let m = b.max(s_valid, 0);
    let bad = b.gt(bad_count, zero_i);
    let empty = b.le(a.n, zero_i);
    let skip = b.or(bad, empty);

    let centred = b.sub(s, m);
    let scaled = b.mul(centred, a.scale);
    let e_raw = b.exp2(scaled);
    let e = b.select(a.valid, e_raw, zero);
    let z = b.sum(e, 0);
    let positive = b.gt(e, zero);
    let pos_i = b.select(positive, one_i, zero_i);
    let n_pos = b.sum(pos_i, 0);
    // Out-of-row slots sit at -1: never at or above a positive `mid`, nor kept. An invalid
    // row's candidates sit at +inf: all kept, with no search (its bounds start equal).
    let minus_one = b.f32(-1.0);
    let e_or_all = b.select(bad, inf, e_raw);
    let es = b.select(a.valid, e_or_all, minus_one);

    let param_vals = load_params(b, a.params, qrow);
    let bounds = needs_bounds(policy);
    let row = RowTotals {
        z,
        n: a.n,
        n_pos,
        skip,
        bad,
    };
    let out = Outputs {
        kept_mass: a.kept_mass,
        flags: a.flags,
        qrow,
    };
    let lo = search(b, policy, cfg, &param_vals, &row, &out, |b, mids| {
        tally(b, es, mids, bounds)
    });
    b.ge(es, lo)
}

/// Builds the search for rows longer than a program's registers hold (any length): the
/// row streams through in tiles of `cfg.block` candidates. A first pass finds the row's maximum
/// (and NaN or infinite logits), a second writes each `e` to `work` (f32, laid out like
/// `scores`) and sums them, and every search step then reads `work` back (from L1 or L2).
/// Once the bracket holds at most a tile of candidates, they are gathered into the query
/// row's tile of `scratch` (f32, `block` a query row) and the last steps run on it in
/// registers. Parameters as [`build_search`], with `work` and `scratch` after `scores`.
/// Grid: one program per candidate row.
pub fn build_search_streaming(policy: &Policy, cfg: &SearchConfig) -> Result<Kernel, CompileError> {
    let (tile, group) = (cfg.block, cfg.group);
    let mut b = KernelBuilder::new(&search_name(policy, cfg));
    b.set_num_warps(cfg.num_warps);
    let scores = b.param_ptr("scores", DType::F32);
    let work = b.param_ptr("work", DType::F32);
    let scratch = b.param_ptr("scratch", DType::F32);
    let indptr = b.param_ptr("cand_indptr", DType::I32);
    let indices = b.param_ptr("cand_indices", DType::I32);
    let params: Vec<Value> = policy
        .params
        .iter()
        .map(|p| b.param_ptr(p.name, p.dtype))
        .collect();
    let scale = b.param_scalar("scale_log2e", DType::F32);
    let staged = b.param_ptr("staged", DType::I32);
    let budget = b.param_ptr("budget", DType::I32);
    let kept_mass = b.param_ptr("kept_mass", DType::F32);
    let flags = b.param_ptr("flags", DType::I32);

    let row = b.program_id(0);
    let p0 = b.add_ptr(indptr, row);
    let start = b.load(p0);
    let one = b.i32(1);
    let next = b.add(row, one);
    let p1 = b.add_ptr(indptr, next);
    let end = b.load(p1);
    let n = b.sub(end, start);
    let start64 = b.cast(start, DType::I64);
    let bounds = needs_bounds(policy);
    let gpad = group.next_power_of_two();
    let zero_i = b.i32(0);
    let tile_i = b.i32(tile as i32);

    // Each query head's threshold, kept in a small block for the compaction.
    let zf = b.f32(0.0);
    let none = b.splat(zf, &[gpad]);
    let (g_lo, g_hi) = (b.i32(0), b.i32(group as i32));
    let thresholds = b.for_range(g_lo, g_hi, one, &[none], |b, g, carried| {
        let group_i = b.i32(group as i32);
        let qrow0 = b.mul(row, group_i);
        let qrow = b.add(qrow0, g);
        let base = b.mul_c(start64, group as i64);
        let gn = b.mul(g, n);
        let gn64 = b.cast(gn, DType::I64);
        let base = b.add(base, gn64);
        let s_row = b.add_ptr(scores, base);
        let w_row = b.add_ptr(work, base);
        let zero_i = b.i32(0);

        // Pass 1: the maximum, and whether any logit is NaN or infinite. Tiles fold into
        // per-thread accumulators, reduced across the program once at the end.
        let ninf = b.f32(f32::NEG_INFINITY);
        let bad0 = b.splat(zero_i, &[tile]);
        let max0 = b.splat(ninf, &[tile]);
        let acc = b.for_range(zero_i, n, tile_i, &[bad0, max0], |b, t0, c| {
            let ar = b.arange(0, tile as i64);
            let offs = b.add(ar, t0);
            let valid = b.lt(offs, n);
            let ptrs = b.add_ptr(s_row, offs);
            let zero = b.f32(0.0);
            let s = b.load_masked(ptrs, Some(valid), Some(zero));
            let mag = b.abs(s);
            let inf = b.f32(f32::INFINITY);
            let finite = b.lt(mag, inf);
            let not_finite = b.not(finite);
            let bad_here = b.and(valid, not_finite);
            let (one_i, zero_i) = (b.i32(1), b.i32(0));
            let bad_i = b.select(bad_here, one_i, zero_i);
            let ninf = b.f32(f32::NEG_INFINITY);
            let s_valid = b.select(valid, s, ninf);
            vec![b.add(c[0], bad_i), b.maximum(c[1], s_valid)]
        });
        let stats = [b.sum(acc[0], 0), b.max(acc[1], 0)];
        let bad = b.gt(stats[0], zero_i);
        let m = stats[1];
        let empty = b.le(n, zero_i);
        let skip = b.or(bad, empty);

        // Pass 2: e to `work` (-1 past the row, +inf for an invalid row's candidates).
        let zf = b.f32(0.0);
        let z0 = b.splat(zf, &[tile]);
        let pos0 = b.splat(zero_i, &[tile]);
        let acc = b.for_range(zero_i, n, tile_i, &[z0, pos0], |b, t0, c| {
            let ar = b.arange(0, tile as i64);
            let offs = b.add(ar, t0);
            let valid = b.lt(offs, n);
            let ptrs = b.add_ptr(s_row, offs);
            let zero = b.f32(0.0);
            let s = b.load_masked(ptrs, Some(valid), Some(zero));
            let centred = b.sub(s, m);
            let scaled = b.mul(centred, scale);
            let e_raw = b.exp2(scaled);
            let e = b.select(valid, e_raw, zero);
            let inf = b.f32(f32::INFINITY);
            let e_or_all = b.select(bad, inf, e_raw);
            let wp = b.add_ptr(w_row, offs);
            b.store_masked(wp, e_or_all, Some(valid));
            let positive = b.gt(e, zero);
            let (one_i, zero_i) = (b.i32(1), b.i32(0));
            let pos_i = b.select(positive, one_i, zero_i);
            vec![b.add(c[0], e), b.add(c[1], pos_i)]
        });
        // The same fold as each step's mass (slot by slot over the tiles, then the same
        // tree), so the mass of every candidate equals z exactly.
        let z = b.sum(acc[0], 0);
        let n_pos = b.sum(acc[1], 0);

        let param_vals = load_params(b, &params, qrow);
        let row = RowTotals {
            z,
            n,
            n_pos,
            skip,
            bad,
        };
        let out = Outputs {
            kept_mass,
            flags,
            qrow,
        };
        let streamed = |b: &mut KernelBuilder, mids: &[Value]| -> Vec<Tally> {
            // Per-thread accumulators over the tiles (each pivot's sum, count, and with
            // `bounds` min and max), one fused reduction at the end.
            let zf = b.f32(0.0);
            let zero_i = b.i32(0);
            let inf = b.f32(f32::INFINITY);
            let minus_one = b.f32(-1.0);
            let mut per = vec![zf, zero_i];
            if bounds {
                per.extend([inf, minus_one]);
            }
            let width = per.len();
            let init: Vec<Value> = mids
                .iter()
                .flat_map(|_| per.iter())
                .map(|v| b.splat(*v, &[tile]))
                .collect();
            let acc = b.for_range(zero_i, n, tile_i, &init, |b, t0, c| {
                let ar = b.arange(0, tile as i64);
                let offs = b.add(ar, t0);
                let valid = b.lt(offs, n);
                let wp = b.add_ptr(w_row, offs);
                let minus_one = b.f32(-1.0);
                let es = b.load_masked(wp, Some(valid), Some(minus_one));
                let mut next = vec![];
                for (i, mid) in mids.iter().enumerate() {
                    let terms = tally_terms(b, es, *mid, bounds);
                    let acc = &c[i * width..(i + 1) * width];
                    next.push(b.add(acc[0], terms[0]));
                    next.push(b.add(acc[1], terms[1]));
                    if bounds {
                        next.push(b.minimum(acc[2], terms[2]));
                        next.push(b.maximum(acc[3], terms[3]));
                    }
                }
                next
            });
            acc.chunks(width).map(|t| reduce_terms(b, t)).collect()
        };
        // Once the bracket holds at most a tile of candidates (and the policy reads no
        // nearest-element statistic, which a gathered tile cannot give), they are gathered
        // into this query row's scratch tile and the last steps run in registers.
        let gather = !needs_bounds(policy);
        let cap = b.i32(tile as i32);
        let init = initial_bracket(b, &row);
        let k1 = search_steps(
            b,
            policy,
            cfg,
            &param_vals,
            &row,
            &init,
            gather.then_some(cap),
            streamed,
        );
        let fin = if gather {
            let (lo, hi) = (k1[0], k1[1]);
            let gap = b.sub(k1[3], k1[5]);
            let one_i = b.i32(1);
            let several = b.gt(gap, one_i);
            let apart = b.lt(lo, hi);
            let open = b.and(several, apart);
            let qrow64 = b.cast(qrow, DType::I64);
            let s_off = b.mul_c(qrow64, tile as i64);
            let s_row = b.add_ptr(scratch, s_off);
            b.if_then(open, |b| {
                let zero_i = b.i32(0);
                b.for_range(zero_i, n, tile_i, &[zero_i], |b, t0, c| {
                    let ar = b.arange(0, tile as i64);
                    let offs = b.add(ar, t0);
                    let valid = b.lt(offs, n);
                    let wp = b.add_ptr(w_row, offs);
                    let minus_one = b.f32(-1.0);
                    let es = b.load_masked(wp, Some(valid), Some(minus_one));
                    let at_lo = b.ge(es, lo);
                    let below_hi = b.lt(es, hi);
                    let inside = b.and(at_lo, below_hi);
                    let (one_i, zero_i) = (b.i32(1), b.i32(0));
                    let in_i = b.select(inside, one_i, zero_i);
                    let rank = b.cumsum(in_i);
                    let before = b.sub(c[0], one_i);
                    let dst_row = b.add_ptr(s_row, before);
                    let dst = b.add_ptr(dst_row, rank);
                    b.store_masked(dst, es, Some(inside));
                    let here = b.sum(in_i, 0);
                    vec![b.add(c[0], here)]
                });
            });
            // The tile, -1 past the gathered candidates; the candidates at or above the
            // first phase's upper bound are counted by its tallies.
            let ar = b.arange(0, tile as i64);
            let valid = b.lt(ar, gap);
            let sp = b.add_ptr(s_row, ar);
            let minus_one = b.f32(-1.0);
            let es = b.load_masked(sp, Some(valid), Some(minus_one));
            let (base_mass, base_count) = (k1[4], k1[5]);
            search_steps(b, policy, cfg, &param_vals, &row, &k1, None, |b, mids| {
                tally(b, es, mids, false)
                    .into_iter()
                    .map(|t| Tally {
                        mass: b.add(t.mass, base_mass),
                        count: b.add(t.count, base_count),
                        ..t
                    })
                    .collect()
            })
        } else {
            k1
        };
        let lo = finish(b, &row, &out, &fin);
        let slots = b.arange(0, gpad as i64);
        let mine = b.eq(slots, g);
        vec![b.select(mine, lo, carried[0])]
    })[0];

    // Ordered compaction, a tile at a time: the union of the heads' sets.
    let total = b.for_range(zero_i, n, tile_i, &[zero_i], |b, t0, c| {
        let ar = b.arange(0, tile as i64);
        let offs = b.add(ar, t0);
        let valid = b.lt(offs, n);
        let zero_i = b.i32(0);
        let none = b.splat(zero_i, &[tile]);
        let (g_lo, g_hi, one) = (b.i32(0), b.i32(group as i32), b.i32(1));
        let keep = b.for_range(g_lo, g_hi, one, &[none], |b, g, k| {
            let slots = b.arange(0, gpad as i64);
            let mine = b.eq(slots, g);
            let zf = b.f32(0.0);
            let picked = b.select(mine, thresholds, zf);
            let t = b.sum(picked, 0);
            let base = b.mul_c(start64, group as i64);
            let gn = b.mul(g, n);
            let gn64 = b.cast(gn, DType::I64);
            let base = b.add(base, gn64);
            let w_row = b.add_ptr(work, base);
            let wp = b.add_ptr(w_row, offs);
            let minus_one = b.f32(-1.0);
            let es = b.load_masked(wp, Some(valid), Some(minus_one));
            let kept = b.ge(es, t);
            let kept = b.cast(kept, DType::I32);
            vec![b.maximum(k[0], kept)]
        })[0];
        let rank = b.cumsum(keep);
        let one = b.i32(1);
        let one_b = b.splat(one, &[tile]);
        let is_kept = b.eq(keep, one_b);
        let src_row = b.add_ptr(indices, start64);
        let src = b.add_ptr(src_row, offs);
        let tok = b.load_masked(src, Some(is_kept), None);
        let dst_row = b.add_ptr(staged, start64);
        let before = b.sub(c[0], one);
        let dst_row = b.add_ptr(dst_row, before);
        let dst = b.add_ptr(dst_row, rank);
        b.store_masked(dst, tok, Some(is_kept));
        let kept_here = b.sum(keep, 0);
        vec![b.add(c[0], kept_here)]
    })[0];
    let pb = b.add_ptr(budget, row);
    b.store(pb, total);
    b.finish()
}

/// The row's value of each policy parameter.
fn load_params(b: &mut KernelBuilder, params: &[Value], qrow: Value) -> Vec<Value> {
    params
        .iter()
        .map(|p| {
            let ptr = b.add_ptr(*p, qrow);
            b.load(ptr)
        })
        .collect()
}

/// What one search step measures of the set `e >= mid` at one of its pivots: its mass and
/// count and, for policies that read them, the smallest element in it and the largest one
/// left out (-1 when none is).
struct Tally {
    mass: Value,
    count: Value,
    next_up: Value,
    next_down: Value,
}

/// Whether the search tallies the nearest elements around each pivot: only for policies
/// that read `threshold` or `below`.
fn needs_bounds(policy: &Policy) -> bool {
    policy.reads.contains(&"threshold") || policy.reads.contains(&"below")
}

/// The per-candidate terms of one pivot's tally over a block of `es`: what is summed for
/// the mass and the count, and (with `bounds`) what is min- and max-reduced.
fn tally_terms(b: &mut KernelBuilder, es: Value, mid: Value, bounds: bool) -> Vec<Value> {
    let ge = b.ge(es, mid);
    let zf = b.f32(0.0);
    let in_mass = b.select(ge, es, zf);
    let (one_i, zero_i) = (b.i32(1), b.i32(0));
    let in_count = b.select(ge, one_i, zero_i);
    let mut terms = vec![in_mass, in_count];
    if bounds {
        let inf = b.f32(f32::INFINITY);
        let minus_one = b.f32(-1.0);
        terms.push(b.select(ge, es, inf));
        terms.push(b.select(ge, minus_one, es));
    }
    terms
}

/// Reduces a pivot's terms (from [`tally_terms`], or accumulated over tiles) to its tally.
fn reduce_terms(b: &mut KernelBuilder, terms: &[Value]) -> Tally {
    let zf = b.f32(0.0);
    let (next_up, next_down) = if terms.len() == 4 {
        (b.min(terms[2], 0), b.max(terms[3], 0))
    } else {
        (zf, zf)
    };
    Tally {
        mass: b.sum(terms[0], 0),
        count: b.sum(terms[1], 0),
        next_up,
        next_down,
    }
}

/// Every pivot's tally over one block of `es`; the `fuse_reductions` pass makes all their
/// sums (and mins and maxes) one pass with one exchange between warps.
fn tally(b: &mut KernelBuilder, es: Value, mids: &[Value], bounds: bool) -> Vec<Tally> {
    let terms: Vec<Vec<Value>> = mids
        .iter()
        .map(|m| tally_terms(b, es, *m, bounds))
        .collect();
    terms.iter().map(|t| reduce_terms(b, t)).collect()
}

/// A row's totals: the sum of its `e`, its candidates, how many have `e > 0`, and whether
/// to skip the search (an invalid or empty row) and why (`bad`: NaN or infinite logits).
struct RowTotals {
    z: Value,
    n: Value,
    n_pos: Value,
    skip: Value,
    bad: Value,
}

/// Where the search stores its per-row results: kept mass and flag of query row `qrow`.
struct Outputs {
    kept_mass: Value,
    flags: Value,
    qrow: Value,
}

/// The search over one query row; `measure(b, pivots)` tallies the sets `e >= pivot`, one
/// pass over the row for all of them. Stores the row's kept mass and flag; returns `lo`:
/// the row keeps `e >= lo`.
///
/// The bracket: `lo` is a threshold at which the policy holds (0 at first: everything
/// kept), `hi` one at which it fails (just above the maximum's e = 1 at first: nothing
/// kept). Each step tries `cfg.pivots` points inside and moves `lo` up to the highest at
/// which the policy holds, `hi` down to the lowest at which it fails; the search stops when
/// the two sets differ by one candidate, or when f32 cannot split the bracket (every
/// candidate inside it is then equal). `{e >= lo}` is then the policy's set: every
/// candidate above the cut, ties at the cut together. A step costs, per candidate and
/// pivot, a compare and two masked adds.
///
/// Where to try: from the start, a quarter of the upper bound a few times (powers of a
/// quarter with several pivots), since most cuts lie within a few octaves of the maximum;
/// while the bounds are more than an octave apart, points evenly spaced in log space (the
/// lower bound floored at hi * 2^-64 and at the least positive f32, so the cut's octave is
/// found in a few steps, down into the denormals); then, for a policy with a
/// [`SearchTarget`], around the point where the mass (or count) interpolated between the
/// bounds meets the target (regula falsi; with one pivot the Illinois rule halves the pull
/// of a bound kept twice, so both close in), else evenly spaced. Exactness never depends
/// on the guesses.
fn search(
    b: &mut KernelBuilder,
    policy: &Policy,
    cfg: &SearchConfig,
    params: &[Value],
    row: &RowTotals,
    out: &Outputs,
    measure: impl Fn(&mut KernelBuilder, &[Value]) -> Vec<Tally>,
) -> Value {
    let init = initial_bracket(b, row);
    let fin = search_steps(b, policy, cfg, params, row, &init, None, measure);
    finish(b, row, out, &fin)
}

/// The bracket a search starts from: tallies at the bounds, everything at lo = 0 and
/// nothing above the maximum (closed at once for rows to skip); which bound moved last (1
/// lo, -1 hi) and the Illinois weights of the two tallies.
fn initial_bracket(b: &mut KernelBuilder, row: &RowTotals) -> Vec<Value> {
    let zero = b.f32(0.0);
    let onef = b.f32(1.0);
    let above_max = b.f32(1.0 + f32::EPSILON);
    let hi0 = b.select(row.skip, zero, above_max);
    let zero_i = b.i32(0);
    vec![zero, hi0, row.z, row.n, zero, zero_i, zero_i, onef, onef]
}

/// Stores the row's kept mass and flag; returns `lo`, the threshold the row keeps.
fn finish(b: &mut KernelBuilder, row: &RowTotals, out: &Outputs, fin: &[Value]) -> Value {
    let (lo, lo_mass) = (fin[0], fin[2]);
    let (onef, zf) = (b.f32(1.0), b.f32(0.0));
    let (one_i, zero_i) = (b.i32(1), b.i32(0));
    let mass_n = b.div(lo_mass, row.z);
    let mass_n = b.select(row.bad, onef, mass_n);
    let empty = b.le(row.n, zero_i);
    let mass_n = b.select(empty, zf, mass_n);
    let pm = b.add_ptr(out.kept_mass, out.qrow);
    b.store(pm, mass_n);
    let flag = b.select(row.bad, one_i, zero_i);
    let pf = b.add_ptr(out.flags, out.qrow);
    b.store(pf, flag);
    lo
}

/// The search's steps from bracket `init` (see [`search`]): until the bracket holds one
/// candidate, or, with `stop_at`, until it holds at most that many (the streaming search
/// then gathers them into one tile). Returns the bracket.
#[allow(clippy::too_many_arguments)]
fn search_steps(
    b: &mut KernelBuilder,
    policy: &Policy,
    cfg: &SearchConfig,
    params: &[Value],
    row: &RowTotals,
    init: &[Value],
    stop_at: Option<Value>,
    measure: impl Fn(&mut KernelBuilder, &[Value]) -> Vec<Tally>,
) -> Vec<Value> {
    let onef = b.f32(1.0);
    let inv_z = b.div(onef, row.z);
    let one_i = b.i32(1);
    let target = policy.target.map(|t| match t {
        SearchTarget::Mass(i) => {
            let p = b.cast(params[i], DType::F32);
            (true, b.mul(p, row.z))
        }
        SearchTarget::Count(i) => (false, b.cast(params[i], DType::F32)),
    });
    let (s_lo, s_hi) = (b.i32(0), b.i32(MAX_STEPS));
    b.for_range(s_lo, s_hi, one_i, init, |b, step, c| {
        let k = Bracket {
            lo: c[0],
            hi: c[1],
            lo_mass: c[2],
            lo_count: c[3],
            hi_mass: c[4],
            hi_count: c[5],
            last: c[6],
            w_lo: c[7],
            w_hi: c[8],
        };
        let one_i = b.i32(1);
        let gap = b.sub(k.lo_count, k.hi_count);
        let several = b.gt(gap, one_i);
        let apart = b.lt(k.lo, k.hi);
        let open = b.and(several, apart);
        let open = match stop_at {
            Some(cap) => {
                let many = b.gt(gap, cap);
                b.and(open, many)
            }
            None => open,
        };
        b.if_else(
            open,
            |b| {
                let guesses = next_points(b, &k, step, target, cfg.pivots as usize);
                // A guess outside the bracket (rounding) falls back to the midpoint; when
                // even that does not split it, lo and hi are adjacent floats and every
                // candidate inside equals lo.
                let half = b.f32(0.5);
                let span = b.sub(k.hi, k.lo);
                let half_span = b.mul(span, half);
                let middle = b.add(k.lo, half_span);
                let mids: Vec<Value> = guesses
                    .iter()
                    .map(|g| {
                        let above_lo = b.gt(*g, k.lo);
                        let below_hi = b.lt(*g, k.hi);
                        let fits = b.and(above_lo, below_hi);
                        b.select(fits, *g, middle)
                    })
                    .collect();
                let tallies = measure(b, &mids);
                let mut next = [k.lo, k.hi, k.lo_mass, k.lo_count, k.hi_mass, k.hi_count];
                let mut moved_lo = b.bool(false);
                let mut moved_hi = b.bool(false);
                let mut split = b.bool(false);
                for (mid, t) in mids.iter().zip(&tallies) {
                    let above_lo = b.gt(*mid, k.lo);
                    let below_hi = b.lt(*mid, k.hi);
                    let inside = b.and(above_lo, below_hi);
                    split = b.or(split, inside);
                    let holds = holds_at(b, policy, params, row, inv_z, t);
                    let holds = b.and(holds, inside);
                    let fails = b.not(holds);
                    let fails = b.and(fails, inside);
                    // The highest pivot that holds and the lowest that fails.
                    let higher = b.gt(*mid, next[0]);
                    let raise = b.and(holds, higher);
                    let lower = b.lt(*mid, next[1]);
                    let drop = b.and(fails, lower);
                    next[0] = b.select(raise, *mid, next[0]);
                    next[2] = b.select(raise, t.mass, next[2]);
                    next[3] = b.select(raise, t.count, next[3]);
                    next[1] = b.select(drop, *mid, next[1]);
                    next[4] = b.select(drop, t.mass, next[4]);
                    next[5] = b.select(drop, t.count, next[5]);
                    moved_lo = b.or(moved_lo, raise);
                    moved_hi = b.or(moved_hi, drop);
                }
                // Not split: close the bracket at lo.
                next[1] = b.select(split, next[1], k.lo);
                let (w_lo, w_hi, last) = illinois(b, &k, moved_lo, moved_hi);
                let mut v = next.to_vec();
                v.extend([last, w_lo, w_hi]);
                v
            },
            |_| c.to_vec(),
        )
    })
}

/// The policy's predicate at one pivot, from its tally.
fn holds_at(
    b: &mut KernelBuilder,
    policy: &Policy,
    params: &[Value],
    row: &RowTotals,
    inv_z: Value,
    t: &Tally,
) -> Value {
    let onef = b.f32(1.0);
    let zf = b.f32(0.0);
    // mass = M / z: exactly 1 when no positive weight is left out, and below 1 whenever
    // one is, even when the f32 sum cannot tell (tiny tails round away): p = 1 keeps
    // every positive weight.
    let scaled = b.mul(t.mass, inv_z);
    let below_one = b.f32(1.0 - f32::EPSILON / 2.0);
    let capped = b.minimum(scaled, below_one);
    let left_out = b.lt(t.count, row.n_pos);
    let mass_n = b.select(left_out, capped, onef);
    let reads = |s: &str| policy.reads.contains(&s);
    let threshold = if reads("threshold") {
        b.mul(t.next_up, inv_z)
    } else {
        zf
    };
    let below = if reads("below") {
        b.mul(t.next_down, inv_z)
    } else {
        zf
    };
    let stats = KeptStats {
        mass: mass_n,
        count: t.count,
        threshold,
        below,
        max_weight: inv_z,
        candidates: row.n,
    };
    (policy.predicate)(b, &stats, params)
}

/// The Illinois rule's state after a step: a bound kept twice in a row has its tally's pull
/// halved, so the next guess lands on its side and both bounds close in. Returns the new
/// weights of the lower and upper tallies and which bound moved (1 lo, -1 hi, 0 both).
fn illinois(
    b: &mut KernelBuilder,
    k: &Bracket,
    moved_lo: Value,
    moved_hi: Value,
) -> (Value, Value, Value) {
    let onef = b.f32(1.0);
    let half = b.f32(0.5);
    let (one_i, minus_one_i, zero_i) = (b.i32(1), b.i32(-1), b.i32(0));
    let lo_again = b.eq(k.last, one_i);
    let hi_again = b.eq(k.last, minus_one_i);
    let only_lo = b.not(moved_hi);
    let only_lo = b.and(moved_lo, only_lo);
    let only_hi = b.not(moved_lo);
    let only_hi = b.and(moved_hi, only_hi);
    let w_hi_half = b.mul(k.w_hi, half);
    let w_lo_half = b.mul(k.w_lo, half);
    let kept_hi_twice = b.and(only_lo, lo_again);
    let kept_lo_twice = b.and(only_hi, hi_again);
    let w_hi = b.select(kept_hi_twice, w_hi_half, onef);
    let w_lo = b.select(kept_lo_twice, w_lo_half, onef);
    let last = b.select(only_hi, minus_one_i, zero_i);
    let last = b.select(only_lo, one_i, last);
    (w_lo, w_hi, last)
}

/// The search's bracket, the tallies at its two ends, which end moved last and the
/// Illinois weights of the two tallies.
struct Bracket {
    lo: Value,
    hi: Value,
    lo_mass: Value,
    lo_count: Value,
    hi_mass: Value,
    hi_count: Value,
    last: Value,
    w_lo: Value,
    w_hi: Value,
}

/// Descending steps tried from the maximum while the lower bound is still 0 (see
/// [`search`]).
const DESCENTS: i32 = 4;

/// The `pivots` points a search step tries, ascending (see [`search`]); not always strictly
/// inside the bracket (f32 may not split a narrow one): the caller checks.
fn next_points(
    b: &mut KernelBuilder,
    k: &Bracket,
    step: Value,
    target: Option<(bool, Value)>,
    pivots: usize,
) -> Vec<Value> {
    let tiny = b.f32(5.421_011e-20);
    let floor = b.mul(k.hi, tiny);
    let least = b.f32(f32::from_bits(1));
    let floor = b.maximum(floor, least);
    let lo_f = b.maximum(k.lo, floor);
    let x_lo = b.log2(lo_f);
    let x_hi = b.log2(k.hi);
    let x_span = b.sub(x_hi, x_lo);
    let zero = b.f32(0.0);
    let at_zero = b.eq(k.lo, zero);
    let descents = b.i32(DESCENTS);
    let early = b.lt(step, descents);
    let descending = b.and(at_zero, early);
    let span = b.sub(k.hi, k.lo);
    let two = b.f32(2.0);
    let twice_lo = b.mul(k.lo, two);
    let wide = b.gt(k.hi, twice_lo);

    // Fractions of the (linear) span for a narrow bracket: around the interpolated point
    // with a target, evenly spaced without.
    let even: Vec<f32> = (1..=pivots)
        .map(|i| i as f32 / (pivots + 1) as f32)
        .collect();
    let fractions: Vec<Value> = match target {
        None => even.iter().map(|f| b.f32(*f)).collect(),
        Some((by_mass, want)) => {
            let (at_lo, at_hi) = if by_mass {
                (k.lo_mass, k.hi_mass)
            } else {
                (
                    b.cast(k.lo_count, DType::F32),
                    b.cast(k.hi_count, DType::F32),
                )
            };
            // Regula falsi on (threshold, tally - target), with the Illinois weights.
            let f_lo = b.sub(at_lo, want);
            let f_lo = b.mul(f_lo, k.w_lo);
            let f_hi = b.sub(at_hi, want);
            let f_hi = b.mul(f_hi, k.w_hi);
            let den = b.sub(f_lo, f_hi);
            let centre = b.div(f_lo, den);
            // The target must lie between the tallies (a policy may hold for another
            // reason, as a budget floor does): otherwise spread evenly.
            let reached = b.ge(at_lo, want);
            let short = b.lt(at_hi, want);
            let bracketed = b.and(reached, short);
            let gap = 1.0 / (2 * (pivots + 1)) as f32;
            let (f_min, f_max) = (b.f32(1.0 / 64.0), b.f32(63.0 / 64.0));
            even.iter()
                .enumerate()
                .map(|(i, e)| {
                    let off = b.f32((i as f32 - (pivots as f32 - 1.0) / 2.0) * gap);
                    let f = b.add(centre, off);
                    let f = b.maximum(f, f_min);
                    let f = b.minimum(f, f_max);
                    let e = b.f32(*e);
                    b.select(bracketed, f, e)
                })
                .collect()
        }
    };
    (0..pivots)
        .map(|i| {
            // Descending: hi / 4^(pivots - i); wide: evenly spaced exponents.
            let quarter = b.f32(0.25f32.powi((pivots - i) as i32));
            let descend = b.mul(k.hi, quarter);
            let frac = b.f32((i + 1) as f32 / (pivots + 1) as f32);
            let dx = b.mul(x_span, frac);
            let x = b.add(x_lo, dx);
            let geometric = b.exp2(x);
            let wide_guess = b.select(descending, descend, geometric);
            let d = b.mul(span, fractions[i]);
            let narrow_guess = b.add(k.lo, d);
            b.select(wide, wide_guess, narrow_guess)
        })
        .collect()
}

/// Builds the kernel that packs each row's staged positions into one CSR list. Parameters:
/// `budget` (i32 per row), `cand_indptr` (i32, where each row's staged positions start),
/// `staged` (i32), `sel_indptr` (i32, rows + 1), `sel_indices` (i32). A
/// program per row sums the budgets before it (rows are few: 2048 budgets are 8 KB).
pub fn build_pack(num_warps: u32) -> Result<Kernel, CompileError> {
    const TILE: usize = 1024;
    let mut b = KernelBuilder::new(&format!("threshold_pack_w{num_warps}"));
    b.set_num_warps(num_warps);
    let budget = b.param_ptr("budget", DType::I32);
    let indptr = b.param_ptr("cand_indptr", DType::I32);
    let staged = b.param_ptr("staged", DType::I32);
    let sel_indptr = b.param_ptr("sel_indptr", DType::I32);
    let sel_indices = b.param_ptr("sel_indices", DType::I32);

    let row = b.program_id(0);
    let zero = b.i32(0);
    let tile = b.i32(TILE as i32);
    let before = b.for_range(zero, row, tile, &[zero], |b, t0, c| {
        let offs = b.arange(0, TILE as i64);
        let idx = b.add(offs, t0);
        let m = b.lt(idx, row);
        let p = b.add_ptr(budget, idx);
        let zero = b.i32(0);
        let v = b.load_masked(p, Some(m), Some(zero));
        let s = b.sum(v, 0);
        vec![b.add(c[0], s)]
    })[0];
    let pb = b.add_ptr(budget, row);
    let count = b.load(pb);
    let ps = b.add_ptr(indptr, row);
    let start = b.load(ps);
    let start64 = b.cast(start, DType::I64);
    let src_row = b.add_ptr(staged, start64);
    let before64 = b.cast(before, DType::I64);
    let dst_row = b.add_ptr(sel_indices, before64);
    b.for_range(zero, count, tile, &[], |b, t0, _| {
        let offs = b.arange(0, TILE as i64);
        let idx = b.add(offs, t0);
        let m = b.lt(idx, count);
        let src = b.add_ptr(src_row, idx);
        let v = b.load_masked(src, Some(m), None);
        let dst = b.add_ptr(dst_row, idx);
        b.store_masked(dst, v, Some(m));
        vec![]
    });
    let one = b.i32(1);
    let next = b.add(row, one);
    let pe = b.add_ptr(sel_indptr, next);
    let end = b.add(before, count);
    b.store(pe, end);
    let first = b.eq(row, zero);
    b.if_then(first, |b| {
        let zero = b.i32(0);
        b.store(sel_indptr, zero);
    });
    b.finish()
}
