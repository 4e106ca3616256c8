//! The search itself, shared by both kernels: tallies at pivots, the bracket and its
//! steps, where to try next, the policy's predicate at a pivot.

use super::{KeptStats, Policy, SearchConfig, SearchTarget, MAX_STEPS, STEPS_A_CHUNK};
use dusk_compiler::{DType, KernelBuilder, Value};

/// The row's value of each policy parameter.
pub(super) fn load_params(b: &mut KernelBuilder, params: &[Value], qrow: Value) -> Vec<Value> {
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
pub(super) struct Tally {
    pub(super) mass: Value,
    pub(super) count: Value,
    pub(super) next_up: Value,
    pub(super) next_down: Value,
}

/// Whether the search tallies the nearest elements around each pivot: only for policies
/// that read `threshold` or `below`.
pub(super) fn needs_bounds(policy: &Policy) -> bool {
    policy.reads.contains(&"threshold") || policy.reads.contains(&"below")
}

/// The per-candidate terms of one pivot's tally over a block of `es`: what is summed for
/// the mass and the count, and (with `bounds`) what is min- and max-reduced.
pub(super) fn tally_terms(
    b: &mut KernelBuilder,
    es: Value,
    mid: Value,
    bounds: bool,
) -> Vec<Value> {
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
pub(super) fn reduce_terms(b: &mut KernelBuilder, terms: &[Value]) -> Tally {
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
pub(super) fn tally(b: &mut KernelBuilder, es: Value, mids: &[Value], bounds: bool) -> Vec<Tally> {
    let terms: Vec<Vec<Value>> = mids
        .iter()
        .map(|m| tally_terms(b, es, *m, bounds))
        .collect();
    terms.iter().map(|t| reduce_terms(b, t)).collect()
}

/// A row's totals: the sum of its `e`, its candidates, how many have `e > 0`, and whether
/// to skip the search (an invalid or empty row) and why (`bad`: NaN or infinite logits).
pub(super) struct RowTotals {
    pub(super) z: Value,
    pub(super) n: Value,
    pub(super) n_pos: Value,
    pub(super) skip: Value,
    pub(super) bad: Value,
}

/// Where the search stores its per-row results: kept mass and flag of query row `qrow`.
pub(super) struct Outputs {
    pub(super) kept_mass: Value,
    pub(super) flags: Value,
    pub(super) qrow: Value,
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
pub(super) fn search(
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
pub(super) fn initial_bracket(b: &mut KernelBuilder, row: &RowTotals) -> Vec<Value> {
    let zero = b.f32(0.0);
    let onef = b.f32(1.0);
    let above_max = b.f32(1.0 + f32::EPSILON);
    let hi0 = b.select(row.skip, zero, above_max);
    let zero_i = b.i32(0);
    vec![zero, hi0, row.z, row.n, zero, zero_i, zero_i, onef, onef]
}

/// Stores the row's kept mass and flag; returns `lo`, the threshold the row keeps.
pub(super) fn finish(
    b: &mut KernelBuilder,
    row: &RowTotals,
    out: &Outputs,
    fin: &[Value],
) -> Value {
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
pub(super) fn search_steps(
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
    // Whether bracket `c` still holds more candidates than the search stops at.
    let is_open = |b: &mut KernelBuilder, c: &[Value]| -> Value {
        let one_i = b.i32(1);
        let gap = b.sub(c[3], c[5]);
        let several = b.gt(gap, one_i);
        let apart = b.lt(c[0], c[1]);
        let open = b.and(several, apart);
        match stop_at {
            Some(cap) => {
                let many = b.gt(gap, cap);
                b.and(open, many)
            }
            None => open,
        }
    };
    // The steps run in chunks of STEPS_A_CHUNK, each entered only while the bracket is
    // open: a loop of MAX_STEPS steps each testing it went round ~100 times after the
    // search had ended (a histogram's bracket often needs no step at all), a tenth of the
    // GQA search's instructions and a sixth of its stall samples on the H100.
    let (zero_i, chunks) = (b.i32(0), b.i32(MAX_STEPS / STEPS_A_CHUNK));
    b.for_range(zero_i, chunks, one_i, init, |b, chunk, c| {
        let open = is_open(b, c);
        b.if_else(
            open,
            |b| {
                let first = b.mul_c(chunk, STEPS_A_CHUNK as i64);
                let (zero_i, last, one_i) = (b.i32(0), b.i32(STEPS_A_CHUNK), b.i32(1));
                b.for_range(zero_i, last, one_i, c, |b, s, c| {
                    let step = b.add(first, s);
                    step_once(
                        b,
                        policy,
                        cfg,
                        params,
                        row,
                        (inv_z, target),
                        step,
                        c,
                        &is_open,
                        &measure,
                    )
                })
            },
            |_| c.to_vec(),
        )
    })
}

/// One step of [`search_steps`] from bracket `c` (its carried values), when it is still
/// open: the pivots tried, the bracket narrowed, the Illinois weights updated.
#[allow(clippy::too_many_arguments)]
fn step_once(
    b: &mut KernelBuilder,
    policy: &Policy,
    cfg: &SearchConfig,
    params: &[Value],
    row: &RowTotals,
    (inv_z, target): (Value, Option<(bool, Value)>),
    step: Value,
    c: &[Value],
    is_open: &impl Fn(&mut KernelBuilder, &[Value]) -> Value,
    measure: &impl Fn(&mut KernelBuilder, &[Value]) -> Vec<Tally>,
) -> Vec<Value> {
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
    let open = is_open(b, c);
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
}

/// The policy's predicate at one pivot, from its tally.
pub(super) fn holds_at(
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
pub(super) fn illinois(
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
pub(super) struct Bracket {
    pub(super) lo: Value,
    pub(super) hi: Value,
    pub(super) lo_mass: Value,
    pub(super) lo_count: Value,
    pub(super) hi_mass: Value,
    pub(super) hi_count: Value,
    pub(super) last: Value,
    pub(super) w_lo: Value,
    pub(super) w_hi: Value,
}

/// Descending steps tried from the maximum while the lower bound is still 0 (see
/// [`search`]).
pub(super) const DESCENTS: i32 = 4;

/// The `pivots` points a search step tries, ascending (see [`search`]); not always strictly
/// inside the bracket (f32 may not split a narrow one): the caller checks.
pub(super) fn next_points(
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

/// The parameters both search kernels take, in order (the streaming one adds `work`, if
/// it keeps its weights there, and `scratch` after `scores`), and the program's candidate
/// row: its `start` and length `n`.
pub(super) struct Kernel {
    pub(super) scores: Value,
    /// The weights' global buffer ([`SearchConfig::uses_work`]).
    pub(super) work: Option<Value>,
    /// The streaming kernel's gathered tiles.
    pub(super) scratch: Option<Value>,
    pub(super) indices: Value,
    pub(super) params: Vec<Value>,
    pub(super) scale: Value,
    pub(super) sel_indptr: Value,
    pub(super) sel_indices: Value,
    /// One word per row and the arrival counter after them (`output.rs`).
    pub(super) prefix: Value,
    pub(super) budget: Value,
    pub(super) kept_mass: Value,
    pub(super) flags: Value,
    pub(super) row: Value,
    /// With [`SearchConfig::split_heads`]: the program's query head in its group, and the
    /// `exchange` (f32, three words a query row) and `arrivals` (i32, a word a row)
    /// parameters.
    pub(super) split: Option<Split>,
    pub(super) start: Value,
    pub(super) n: Value,
    /// With [`SearchConfig::timeline`]: the row's record, its start and SM written.
    pub(super) timeline: Option<Value>,
    /// [`SearchConfig::backoff_ns`].
    pub(super) backoff_ns: u32,
}

/// A split search's program: its head, and where the row's programs meet.
#[derive(Clone, Copy)]
pub(super) struct Split {
    /// Query heads a row (a constant).
    pub(super) group: Value,
    pub(super) head: Value,
    pub(super) exchange: Value,
    pub(super) arrivals: Value,
}

/// Declares the search kernel's parameters on `b` and reads the program's candidate row.
pub(super) fn declare(b: &mut KernelBuilder, policy: &Policy, cfg: &SearchConfig) -> Kernel {
    let scores = b.param_ptr("scores", DType::F32);
    let work = cfg.uses_work().then(|| b.param_ptr("work", DType::F32));
    let scratch = cfg.stream.then(|| b.param_ptr("scratch", DType::F32));
    let exchange = cfg.split_heads.then(|| {
        (
            b.param_ptr("exchange", DType::F32),
            b.param_ptr("arrivals", DType::I32),
        )
    });
    let indptr = b.param_ptr("cand_indptr", DType::I32);
    let indices = b.param_ptr("cand_indices", DType::I32);
    let params: Vec<Value> = policy
        .params
        .iter()
        .map(|p| b.param_ptr(p.name, p.dtype))
        .collect();
    let scale = b.param_scalar("scale_log2e", DType::F32);
    let sel_indptr = b.param_ptr("sel_indptr", DType::I32);
    let sel_indices = b.param_ptr("sel_indices", DType::I32);
    let prefix = b.param_ptr("prefix", DType::I32);
    let budget = b.param_ptr("budget", DType::I32);
    let kept_mass = b.param_ptr("kept_mass", DType::F32);
    let flags = b.param_ptr("flags", DType::I32);
    let timeline = cfg.timeline.then(|| b.param_ptr("timeline", DType::I64));
    // Split, program `row * group + head` (a row's programs start one after another, all
    // before the next row's: the look-back's rows before a row have all started).
    let (row, split) = match exchange {
        Some((exchange, arrivals)) => {
            let flat = b.program_id(0);
            let group = b.i32(cfg.group as i32);
            let row = b.div(flat, group);
            let head = b.rem(flat, group);
            let split = Split {
                group,
                head,
                exchange,
                arrivals,
            };
            (row, Some(split))
        }
        None => (b.program_id(0), None),
    };
    let timeline = timeline.map(|t| crate::timeline::open_record(b, t, row, 6, &[]));
    let p0 = b.add_ptr(indptr, row);
    let start = b.load(p0);
    let one = b.i32(1);
    let next = b.add(row, one);
    let p1 = b.add_ptr(indptr, next);
    let end = b.load(p1);
    let n = b.sub(end, start);
    Kernel {
        scores,
        work,
        scratch,
        indices,
        params,
        scale,
        sel_indptr,
        sel_indices,
        prefix,
        budget,
        kept_mass,
        flags,
        row,
        split,
        start,
        n,
        timeline,
        backoff_ns: cfg.backoff_ns,
    }
}

/// Candidate rows in the launch (read where needed: a value held from the start would take
/// a register through the whole search).
pub(super) fn rows(b: &mut KernelBuilder, k: &Kernel) -> Value {
    let programs = b.num_programs(0);
    match k.split {
        Some(split) => b.div(programs, split.group),
        None => programs,
    }
}

/// Writes the GPU's clock to word `word` of a timeline `record` (see
/// [`SearchConfig::timeline`]) once `arrived` (an i32 count or offset, never negative,
/// computed from the values the phase produced) is in: behind a branch on it, so the clock
/// is read when they have arrived. Nothing without a record.
pub(super) fn stamp(b: &mut KernelBuilder, record: Option<Value>, word: i32, arrived: Value) {
    if let Some(record) = record {
        let zero = b.i32(0);
        let after = b.ge(arrived, zero);
        crate::timeline::stamp(b, record, word, after);
    }
}
