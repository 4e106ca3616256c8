//! The search for rows of any length: the row streams through tiles, its weights staged
//! in a workspace (global memory, or the program's shared memory for rows that fit) that
//! every step reads back, the last steps run on a gathered tile.

use super::histogram::{Histogram, ONE_PART_ROW};
use super::search::{
    self, finish, initial_bracket, load_params, needs_bounds, reduce_terms, search_steps, tally,
    tally_terms, Outputs, RowTotals, Tally,
};
use super::{output, search_name, Policy, SearchConfig, SHARED_ROW};
use dusk_compiler::{CacheLevel, CompileError, DType, Elem, Kernel, KernelBuilder, Value};

/// Tiles ahead of the one being read that [`SearchConfig::prefetch`] brings into L2.
const PREFETCH_AHEAD: i64 = 2;

/// Runs `body` over the tiles of a row of `n` candidates (`t0` = 0, `tile`, ...) carrying
/// `init`: the whole tiles first, told they are `full` (every candidate lies in the row,
/// so their loads need no masks nor their values a select), then the last partial tile.
fn for_tiles(
    b: &mut KernelBuilder,
    n: Value,
    tile: usize,
    init: &[Value],
    mut body: impl FnMut(&mut KernelBuilder, Value, bool, &[Value]) -> Vec<Value>,
) -> Vec<Value> {
    let whole = b.i32(!(tile as i32 - 1));
    let n_full = b.and(n, whole);
    let (zero, step) = (b.i32(0), b.i32(tile as i32));
    let acc = b.for_range(zero, n_full, step, init, |b, t0, c| body(b, t0, true, c));
    b.for_range(n_full, n, step, &acc, |b, t0, c| body(b, t0, false, c))
}

/// Tile `t0` (of `tile` candidates) of a row of `n` f32 values at `row`: the offsets, which
/// of them lie in the row (all of a `full` tile's, a constant), and the values (`other`
/// past its end). With `prefetch` and a row in global memory, the tile
/// [`PREFETCH_AHEAD`] on is brought into L2 first.
fn load_tile(
    b: &mut KernelBuilder,
    row: Value,
    (t0, n, full): (Value, Value, bool),
    (tile, prefetch): (usize, bool),
    other: f32,
) -> (Value, Value, Value) {
    if prefetch {
        prefetch_tile(b, row, (t0, n), tile);
    }
    let ar = b.arange(0, tile as i64);
    let offs = b.add(ar, t0);
    let ptrs = b.add_ptr(row, offs);
    if full {
        let all = b.bool(true);
        let valid = b.splat(all, &[tile]);
        return (offs, valid, b.load(ptrs));
    }
    let valid = b.lt(offs, n);
    let other = b.f32(other);
    (offs, valid, b.load_masked(ptrs, Some(valid), Some(other)))
}

/// Brings the 128 bytes at every 32nd element of the tile [`PREFETCH_AHEAD`] tiles past `t0`
/// of a global row of `n` 4-byte elements into L2 (none reaching past the row; nothing for a
/// row in shared memory): a program's loads then wait on L2, not DRAM, without holding more
/// registers.
fn prefetch_tile(b: &mut KernelBuilder, row: Value, (t0, n): (Value, Value), tile: usize) {
    if !matches!(b.ty(row).elem, Elem::Ptr(_)) {
        return;
    }
    const PER_LINE: usize = 128 / 4;
    let lines = b.arange(0, (tile / PER_LINE) as i64);
    let firsts = b.mul_c(lines, PER_LINE as i64);
    let ahead = b.add_c(t0, PREFETCH_AHEAD * tile as i64);
    let offs = b.add(firsts, ahead);
    // Whole lines of the row only (the op's 128 bytes must lie in the buffer); the loads
    // fetch a last partial line themselves.
    let ends = b.add_c(offs, PER_LINE as i64);
    let inside = b.le(ends, n);
    let ptrs = b.add_ptr(row, offs);
    b.prefetch(ptrs, Some(inside), 128, CacheLevel::L2);
}

/// Where a query head's weights come from in each pass after the second: stored (in
/// `work` or the shared staging, -1 past the row), or recomputed from its scores.
#[derive(Clone, Copy)]
enum RowWeights {
    Stored(Value),
    Recomputed {
        scores: Value,
        max: Value,
        bad: Value,
        scale: Value,
    },
}

/// `e = 2^((s - max) * scale)`: every pass that computes a weight computes it this way, so
/// a recomputed weight equals the one summed into `z` bit for bit.
fn weight(b: &mut KernelBuilder, s: Value, max: Value, scale: Value) -> Value {
    let centred = b.sub(s, max);
    let scaled = b.mul(centred, scale);
    b.exp2(scaled)
}

impl RowWeights {
    /// The weights of tile `t0` (-1 past the row, +inf for an invalid row's candidates).
    fn tile(self, b: &mut KernelBuilder, at: (Value, Value, bool), tiling: (usize, bool)) -> Value {
        match self {
            RowWeights::Stored(w) => load_tile(b, w, at, tiling, -1.0).2,
            RowWeights::Recomputed {
                scores,
                max,
                bad,
                scale,
            } => {
                let (_, valid, s) = load_tile(b, scores, at, tiling, 0.0);
                let e = weight(b, s, max, scale);
                let inf = b.f32(f32::INFINITY);
                let e = b.select(bad, inf, e);
                let minus_one = b.f32(-1.0);
                b.select(valid, e, minus_one)
            }
        }
    }
}

/// Builds the search for rows longer than a program's registers hold (any length): the
/// row streams through in tiles of `cfg.block` candidates. A first pass finds the row's maximum
/// (and NaN or infinite logits), a second writes each `e` to `work` (f32, laid out like
/// `scores`) and sums them, and every search step then reads `work` back (from L1 or L2).
/// With `cfg.shared` the weights go to the program's shared memory instead (`work` is
/// then not touched), each query head's at `g * shared_row_capacity(group)`, and rows are
/// cut at that capacity. With `cfg.recompute` they are not kept at all: every pass after
/// the second recomputes them from the scores (read again, from L2 or memory).
/// Once the bracket holds at most a tile of candidates, they are gathered into the query
/// row's tile of `scratch` (f32, `block` a query row) and the last steps run on it in
/// registers. With one query head and the row not staged, a row whose bracket's lower end
/// keeps at most a tile (a focused row: Twilight's rows keep a few percent) is listed:
/// the gather takes every candidate from there up, with its offset in the row, and the
/// compaction writes the kept ones from that tile instead of reading the row a fourth
/// time. Parameters as [`super::resident::build_search`], with `work` (only where the
/// weights are kept there, [`SearchConfig::uses_work`]) and `scratch` after `scores`.
/// Grid: one program per candidate row.
pub fn build_search_streaming(policy: &Policy, cfg: &SearchConfig) -> Result<Kernel, CompileError> {
    let (tile, group) = (cfg.block, cfg.group);
    let tiling = (tile, cfg.prefetch);
    let mut b = KernelBuilder::new(&search_name(policy, cfg));
    b.set_num_warps(cfg.num_warps);
    b.set_min_programs_per_sm(cfg.min_programs_per_sm);
    let k = search::declare(&mut b, policy, cfg);
    let search::Kernel {
        scores,
        work,
        scratch,
        indices,
        ref params,
        scale,
        sel_indices,
        kept_mass,
        flags,
        row,
        start,
        n,
        ..
    } = k;
    let scratch = scratch.expect("declared for a streaming search");
    // Query row q's tile of `scratch`, where its gathered candidates go.
    let scratch_row = |b: &mut KernelBuilder, q: Value| -> Value {
        let q64 = b.cast(q, DType::I64);
        let off = b.mul_c(q64, tile as i64);
        b.add_ptr(scratch, off)
    };
    let one = b.i32(1);
    let start64 = b.cast(start, DType::I64);
    let staging = cfg.shared.then(|| b.shared_alloc(DType::F32, SHARED_ROW));
    let cap = cfg.staged_capacity();
    // The row's length as the scores are laid out; `n`, what is searched (cut at the
    // staging's capacity).
    let row_len = n;
    let n = match staging {
        Some(_) => {
            let c = b.i32(cap as i32);
            b.minimum(n, c)
        }
        None => n,
    };
    // Query head g's row of `scores` (and of `work`, laid out alike).
    let head_row = |b: &mut KernelBuilder, at: Value, g: Value| -> Value {
        let base = b.mul_c(start64, group as i64);
        let gn = b.mul(g, row_len);
        let gn64 = b.cast(gn, DType::I64);
        let base = b.add(base, gn64);
        b.add_ptr(at, base)
    };
    let scores_row = |b: &mut KernelBuilder, g: Value| head_row(b, scores, g);
    // Query head g's stored weights: its share of the shared staging, or its row of
    // `work`; none when they are recomputed.
    let weights_row = |b: &mut KernelBuilder, g: Value| -> Option<Value> {
        match (staging, work) {
            // Split, the program's one head.
            (Some(st), _) if cfg.split_heads => Some(st),
            (Some(st), _) => {
                let at = b.mul_c(g, cap as i64);
                Some(b.add_ptr(st, at))
            }
            (None, Some(work)) => Some(head_row(b, work, g)),
            (None, None) => None,
        }
    };
    let bounds = needs_bounds(policy);
    // Once the bracket holds at most a tile of candidates (and the policy reads no
    // nearest-element statistic, which a gathered tile cannot give), they are gathered
    // into the query row's scratch tile and the last steps run in registers.
    let gather = !bounds;
    // With one query head and the row in global memory, a row whose bracket's lower end
    // keeps at most a tile (a focused row) gathers every candidate from there up with its
    // offset in the row (`listing`, shared memory), so the compaction reads that list
    // instead of the whole row again.
    let listing =
        (gather && group == 1 && staging.is_none()).then(|| b.shared_alloc(DType::I32, tile));
    // The histogram's first step, for policies with a target to aim it; rows staged in
    // shared memory are short enough for its one-part sums.
    const _: () = assert!(SHARED_ROW <= ONE_PART_ROW);
    let histogram = match policy.target {
        Some(target) if cfg.histogram && gather => {
            Some((Histogram::new(&mut b, cfg.num_warps, cfg.shared), target))
        }
        _ => None,
    };
    let gpad = group.next_power_of_two();
    let zero_i = b.i32(0);
    let tile_i = b.i32(tile as i32);

    // Each query head's threshold, kept in a small block for the compaction, and the
    // count kept at the last one's (the budget, with one query head a row).
    let zf = b.f32(0.0);
    let none = b.splat(zf, &[gpad]);
    // Split, the program's head alone.
    let (g_lo, g_hi) = match k.split {
        Some(split) => (split.head, b.add(split.head, one)),
        None => (b.i32(0), b.i32(group as i32)),
    };
    let no_heads = b.splat(zero_i, &[gpad]);
    // Per head: threshold, budget, maximum, invalid; and how many candidates `listing`
    // holds (0: the row is not listed).
    let carried = [none, zero_i, none, no_heads, zero_i];
    let found = b.for_range(g_lo, g_hi, one, &carried, |b, g, carried| {
        let group_i = b.i32(group as i32);
        let qrow0 = b.mul(row, group_i);
        let qrow = b.add(qrow0, g);
        let s_row = scores_row(b, g);
        let w_row = weights_row(b, g);
        let zero_i = b.i32(0);

        // Pass 1: the maximum, and whether any logit is NaN or infinite (a sum of each
        // logit times 0, which is NaN then and 0 otherwise: one instruction a candidate).
        // Tiles fold into per-thread accumulators, reduced across the program at the end.
        let (zf, ninf) = (b.f32(0.0), b.f32(f32::NEG_INFINITY));
        let probe0 = b.splat(zf, &[tile]);
        let max0 = b.splat(ninf, &[tile]);
        let acc = for_tiles(b, n, tile, &[probe0, max0], |b, t0, full, c| {
            let (offs, valid, s) = load_tile(b, s_row, (t0, n, full), tiling, 0.0);
            if let (Some(_), Some(w_row)) = (staging, w_row) {
                // Staged as they are, so that pass 2 reads shared memory, not L2.
                let wp = b.add_ptr(w_row, offs);
                b.store_masked(wp, s, (!full).then_some(valid));
            }
            let zf = b.f32(0.0);
            let probe = b.mul(s, zf);
            let ninf = b.f32(f32::NEG_INFINITY);
            let s_valid = b.select(valid, s, ninf);
            vec![b.add(c[0], probe), b.maximum(c[1], s_valid)]
        });
        let probe = b.sum(acc[0], 0);
        let m = b.max(acc[1], 0);
        let bad = b.ne(probe, zf);
        let bad_i = b.select(bad, one, zero_i);
        search::stamp(b, k.timeline, 1, bad_i);
        let empty = b.le(n, zero_i);
        let skip = b.or(bad, empty);

        // Pass 2: e to `work` (+inf for an invalid row's candidates); with the staging, e
        // replaces the staged logit in place; recomputed, e is not stored; with the
        // histogram, e is added to its bucket.
        if let Some((h, _)) = &histogram {
            h.clear(b);
        }
        let zf = b.f32(0.0);
        let z0 = b.splat(zf, &[tile]);
        let pos0 = b.splat(zero_i, &[tile]);
        let acc = for_tiles(b, n, tile, &[z0, pos0], |b, t0, full, c| {
            let from = match (staging, w_row) {
                (Some(_), Some(staged)) => staged,
                _ => s_row,
            };
            let (offs, valid, s) = load_tile(b, from, (t0, n, full), tiling, 0.0);
            let zero = b.f32(0.0);
            let e_raw = weight(b, s, m, scale);
            let e = b.select(valid, e_raw, zero);
            if let Some(w_row) = w_row {
                let inf = b.f32(f32::INFINITY);
                let e_or_all = b.select(bad, inf, e_raw);
                let wp = b.add_ptr(w_row, offs);
                b.store_masked(wp, e_or_all, (!full).then_some(valid));
            }
            if let Some((h, _)) = &histogram {
                h.add(b, e, valid);
            }
            let positive = b.gt(e, zero);
            let (one_i, zero_i) = (b.i32(1), b.i32(0));
            let pos_i = b.select(positive, one_i, zero_i);
            vec![b.add(c[0], e), b.add(c[1], pos_i)]
        });
        // The same fold as each step's mass (slot by slot over the tiles, then the same
        // tree), so the mass of every candidate equals z exactly.
        let z = b.sum(acc[0], 0);
        let n_pos = b.sum(acc[1], 0);
        search::stamp(b, k.timeline, 2, n_pos);
        let weights = match w_row {
            Some(w_row) => RowWeights::Stored(w_row),
            None => RowWeights::Recomputed {
                scores: s_row,
                max: m,
                bad,
                scale,
            },
        };

        let param_vals = load_params(b, params, qrow);
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
            let acc = for_tiles(b, n, tile, &init, |b, t0, full, c| {
                let es = weights.tile(b, (t0, n, full), tiling);
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
        let cap = b.i32(tile as i32);
        let init = initial_bracket(b, &row);
        let init = match &histogram {
            Some((h, target)) => h.bracket(b, policy, *target, &param_vals, &row, &init),
            None => init,
        };
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
        let (fin, listed) = if gather {
            let (lo, hi) = (k1[0], k1[1]);
            let in_bracket = b.sub(k1[3], k1[5]);
            let one_i = b.i32(1);
            let several = b.gt(in_bracket, one_i);
            let apart = b.lt(lo, hi);
            let open = b.and(several, apart);
            // Listed: every candidate at or above `lo` (k1[3] of them) is gathered, not
            // only those below `hi`.
            let listed = match listing {
                Some(_) => {
                    let few = b.le(k1[3], tile_i);
                    let valid_row = b.not(skip);
                    b.and(few, valid_row)
                }
                None => b.bool(false),
            };
            let gap = b.select(listed, k1[3], in_bracket);
            let open = b.or(open, listed);
            let s_row = scratch_row(b, qrow);
            // The candidates in [lo, hi) into the scratch tile; listed, every one from lo
            // up with its offset into `listing`.
            let gather_into = |b: &mut KernelBuilder, listing: Option<Value>| {
                let zero_i = b.i32(0);
                for_tiles(b, n, tile, &[zero_i], |b, t0, full, c| {
                    let es = weights.tile(b, (t0, n, full), tiling);
                    let at_lo = b.ge(es, lo);
                    let inside = match listing {
                        Some(_) => at_lo,
                        None => {
                            let below_hi = b.lt(es, hi);
                            b.and(at_lo, below_hi)
                        }
                    };
                    let mut lists = vec![(s_row, es)];
                    if let Some(listing) = listing {
                        let ar = b.arange(0, tile as i64);
                        let offs = b.add(ar, t0);
                        lists.push((listing, offs));
                    }
                    vec![append_in_order(b, &lists, inside, c[0])]
                });
                // The tile is read back by other threads than wrote it.
                b.barrier();
                vec![]
            };
            b.if_then(open, |b| match listing {
                // Two loops, so that a row not listed pays nothing for the offsets.
                Some(block) => {
                    b.if_else(
                        listed,
                        |b| gather_into(b, Some(block)),
                        |b| gather_into(b, None),
                    );
                }
                None => {
                    gather_into(b, None);
                }
            });
            // The tile, -1 past the gathered candidates; the candidates at or above the
            // first phase's upper bound are counted by its tallies (unless listed: then
            // the tile holds them).
            let ar = b.arange(0, tile as i64);
            let valid = b.lt(ar, gap);
            let sp = b.add_ptr(s_row, ar);
            let minus_one = b.f32(-1.0);
            let es = b.load_masked(sp, Some(valid), Some(minus_one));
            let (zf, zero_i) = (b.f32(0.0), b.i32(0));
            let base_mass = b.select(listed, zf, k1[4]);
            let base_count = b.select(listed, zero_i, k1[5]);
            let fin = search_steps(b, policy, cfg, &param_vals, &row, &k1, None, |b, mids| {
                tally(b, es, mids, false)
                    .into_iter()
                    .map(|t| Tally {
                        mass: b.add(t.mass, base_mass),
                        count: b.add(t.count, base_count),
                        ..t
                    })
                    .collect()
            });
            (fin, b.select(listed, gap, zero_i))
        } else {
            (k1, b.i32(0))
        };
        let lo = finish(b, &row, &out, &fin);
        let slots = b.arange(0, gpad as i64);
        let mine = b.eq(slots, g);
        let (one_i, zero_i) = (b.i32(1), b.i32(0));
        let bad_i = b.select(bad, one_i, zero_i);
        vec![
            b.select(mine, lo, carried[0]),
            fin[3],
            b.select(mine, m, carried[2]),
            b.select(mine, bad_i, carried[3]),
            listed,
        ]
    });
    search::stamp(&mut b, k.timeline, 3, found[1]);
    // Query head g's element of a per-head block (`zero` of its type).
    let of_head = |b: &mut KernelBuilder, per_head: Value, zero: Value, g: Value| -> Value {
        let slots = b.arange(0, gpad as i64);
        let mine = b.eq(slots, g);
        let picked = b.select(mine, per_head, zero);
        b.sum(picked, 0)
    };

    // Split, the group's per-head threshold, maximum and invalid flag (words 0, 1, 2 of
    // each head's slot), put in shared memory once for the union, which reads them every
    // tile: taken out of their per-head blocks there (`of_head`, a reduction across the
    // program), they cost three reductions and their barriers a head and a tile (a sixth of
    // the GQA split search's stall samples on the H100). Not for one program a row, whose
    // union reads its heads' stored weights (and where the extra registers spilled).
    let head_words = (cfg.split_heads && group > 1).then(|| b.shared_alloc(DType::F32, 3 * gpad));
    // Head g's `word`: from `head_words` when split, else out of its per-head `block`
    // (`zero` of the block's type).
    let per_head = |b: &mut KernelBuilder, word: usize, block: Value, zero: Value, g: Value| {
        match head_words {
            Some(words) => {
                let at = b.add_c(g, (word * gpad) as i64);
                let p = b.add_ptr(words, at);
                b.load(p)
            }
            None => of_head(b, block, zero, g),
        }
    };

    // The union of the heads' sets, the row's place in the list and its positions, from
    // `found`'s per-head blocks (threshold, budget with one head, maximum, invalid, listed).
    let tail = |b: &mut KernelBuilder, found: &[Value]| {
        let thresholds = found[0];
        if let Some(words) = head_words {
            let bad = b.cast(found[3], DType::F32);
            for (word, block) in [thresholds, found[2], bad].into_iter().enumerate() {
                let slots = b.arange(0, gpad as i64);
                let at = b.add_c(slots, (word * gpad) as i64);
                let p = b.add_ptr(words, at);
                b.store(p, block);
            }
            // Every thread reads every head's words.
            b.barrier();
        }

        // Head g's kept set over tile t0 (1 kept, 0 not).
        let head_kept = |b: &mut KernelBuilder, t0: Value, full: bool, g: Value| -> Value {
            let (zf, zero_i) = (b.f32(0.0), b.i32(0));
            let t = per_head(b, 0, thresholds, zf, g);
            // Split, the other heads' weights are in other programs' staging or rows
            // of `work`: recomputed from the scores, exactly as their programs did.
            let stored = if cfg.split_heads {
                None
            } else {
                weights_row(b, g)
            };
            let weights = match stored {
                Some(w_row) => RowWeights::Stored(w_row),
                None => {
                    // The invalid flag is an f32 word in shared memory, an i32 slot of
                    // its block otherwise.
                    let no = if head_words.is_some() { zf } else { zero_i };
                    let bad = per_head(b, 2, found[3], zero_i, g);
                    RowWeights::Recomputed {
                        scores: scores_row(b, g),
                        max: per_head(b, 1, found[2], zf, g),
                        bad: b.gt(bad, no),
                        scale,
                    }
                }
            };
            let es = weights.tile(b, (t0, n, full), tiling);
            let kept = b.ge(es, t);
            b.cast(kept, DType::I32)
        };
        // The union of the heads' sets over tile t0. Split, the heads are unrolled so that
        // their tiles' loads from the scores are in flight together (a loop over them
        // waited on each in turn: the H100 profile's largest share of stall samples, 23%).
        let union = |b: &mut KernelBuilder, t0: Value, full: bool| -> Value {
            let zero_i = b.i32(0);
            let none = b.splat(zero_i, &[tile]);
            if cfg.split_heads {
                (0..group).fold(none, |union, g| {
                    let g = b.i32(g as i32);
                    let kept = head_kept(b, t0, full, g);
                    b.maximum(union, kept)
                })
            } else {
                let (g_lo, g_hi, one) = (b.i32(0), b.i32(group as i32), b.i32(1));
                b.for_range(g_lo, g_hi, one, &[none], |b, g, acc| {
                    let kept = head_kept(b, t0, full, g);
                    vec![b.maximum(acc[0], kept)]
                })[0]
            }
        };
        // Ordered compaction, a tile at a time: each kept position to `dst[rank - 1]` (dst
        // from the tile's start), masked by `ok`; returns how many were kept.
        let compact = |b: &mut KernelBuilder, dst: Value, ok: Value| -> Value {
            let zero_i = b.i32(0);
            for_tiles(b, n, tile, &[zero_i], |b, t0, full, c| {
                let ar = b.arange(0, tile as i64);
                let offs = b.add(ar, t0);
                let keep = union(b, t0, full);
                let one = b.i32(1);
                let one_b = b.splat(one, &[tile]);
                let is_kept = b.eq(keep, one_b);
                let is_kept = b.and(is_kept, ok);
                let src_row = b.add_ptr(indices, start64);
                if cfg.prefetch {
                    prefetch_tile(b, src_row, (t0, n), tile);
                }
                let src = b.add_ptr(src_row, offs);
                let tok = b.load_masked(src, Some(is_kept), None);
                vec![append_in_order(b, &[(dst, tok)], is_kept, c[0])]
            })[0]
        };
        // The compaction of a listed row (one query head): the `count` candidates of its
        // gathered tile, each kept if its weight reaches the threshold, their positions from
        // the offsets in `listing`.
        let compact_listed =
            |b: &mut KernelBuilder, (listing, count): (Value, Value), dst: Value, ok: Value| {
                let ar = b.arange(0, tile as i64);
                let valid = b.lt(ar, count);
                let s_row = scratch_row(b, row);
                let sp = b.add_ptr(s_row, ar);
                let minus_one = b.f32(-1.0);
                let es = b.load_masked(sp, Some(valid), Some(minus_one));
                let lp = b.add_ptr(listing, ar);
                let zero_i = b.i32(0);
                let offs = b.load_masked(lp, Some(valid), Some(zero_i));
                let zf = b.f32(0.0);
                let t = of_head(b, thresholds, zf, zero_i);
                let kept = b.ge(es, t);
                let kept = b.and(kept, valid);
                let kept = b.and(kept, ok);
                let src_row = b.add_ptr(indices, start64);
                let src = b.add_ptr(src_row, offs);
                let tok = b.load_masked(src, Some(kept), None);
                append_in_order(b, &[(dst, tok)], kept, zero_i);
            };
        // With one query head the budget is the search's count, published at once: the rows
        // after this one wait for it.
        if group == 1 {
            output::publish(b, &k, row, found[1]);
        }
        let (at, total) = match staging {
            // Staged: the positions are compacted over the weights (a tile's writes land below
            // its end, after its reads) before the wait for the rows before this one, then
            // copied out once the row's place in the list is known.
            Some(st) => {
                let positions = b.ptr_cast(st, DType::I32);
                let t = b.bool(true);
                let total = compact(b, positions, t);
                if group > 1 {
                    output::publish(b, &k, row, total);
                }
                let at = output::look_back(b, &k, row);
                search::stamp(b, k.timeline, 4, at.0);
                let dst_row = b.add_ptr(sel_indices, at.0);
                b.for_range(zero_i, total, tile_i, &[], |b, t0, _| {
                    let ar = b.arange(0, tile as i64);
                    let i = b.add(ar, t0);
                    let inside = b.lt(i, total);
                    let inside = b.and(inside, at.1);
                    let src = b.add_ptr(positions, i);
                    let v = b.load_masked(src, Some(inside), None);
                    let dst = b.add_ptr(dst_row, i);
                    b.store_masked(dst, v, Some(inside));
                    vec![]
                });
                (at, total)
            }
            // In `work`: the budget (counted for a group's union), the place, then the
            // compaction straight into it.
            None => {
                let total = if group == 1 {
                    found[1]
                } else {
                    let per = b.splat(zero_i, &[tile]);
                    let counts = for_tiles(b, n, tile, &[per], |b, t0, full, c| {
                        let keep = union(b, t0, full);
                        vec![b.add(c[0], keep)]
                    });
                    let total = b.sum(counts[0], 0);
                    output::publish(b, &k, row, total);
                    total
                };
                let at = output::look_back(b, &k, row);
                search::stamp(b, k.timeline, 4, at.0);
                let dst_row = b.add_ptr(sel_indices, at.0);
                let listed = found[4];
                let is_listed = b.gt(listed, zero_i);
                match listing {
                    Some(listing) => {
                        b.if_else(
                            is_listed,
                            |b| {
                                compact_listed(b, (listing, listed), dst_row, at.1);
                                vec![]
                            },
                            |b| {
                                compact(b, dst_row, at.1);
                                vec![]
                            },
                        );
                    }
                    None => {
                        compact(b, dst_row, at.1);
                    }
                }
                (at, total)
            }
        };
        output::finish_row(b, &k, row, at, total);
        search::stamp(b, k.timeline, 5, total);
    };
    match k.split {
        // Each program hands its head's threshold, maximum and invalid flag to the row's
        // last to arrive, which writes the row's list (and zeroes the arrivals for the
        // next launch).
        Some(split) => {
            let (zf, zero_i) = (b.f32(0.0), b.i32(0));
            let t = of_head(&mut b, found[0], zf, split.head);
            let m = of_head(&mut b, found[2], zf, split.head);
            let bad = of_head(&mut b, found[3], zero_i, split.head);
            let bad = b.cast(bad, DType::F32);
            let group_i = b.i32(group as i32);
            let qrow0 = b.mul(row, group_i);
            let qrow = b.add(qrow0, split.head);
            let at = b.mul_c(qrow, 3);
            for (word, v) in [t, m, bad].into_iter().enumerate() {
                let w = b.i32(word as i32);
                let i = b.add(at, w);
                let p = b.add_ptr(split.exchange, i);
                b.store(p, v);
            }
            let counter = b.add_ptr(split.arrivals, row);
            let before = b.arrive(counter);
            let last_i = b.i32(group as i32 - 1);
            let last = b.eq(before, last_i);
            b.if_then(last, |b| {
                let zero_i = b.i32(0);
                b.store(counter, zero_i);
                let slots = b.arange(0, gpad as i64);
                let g_hi = b.i32(group as i32);
                let inside = b.lt(slots, g_hi);
                let qrows = b.add(slots, qrow0);
                let at = b.mul_c(qrows, 3);
                let zf = b.f32(0.0);
                let mut words = vec![];
                for word in 0..3 {
                    let w = b.i32(word);
                    let i = b.add(at, w);
                    let p = b.add_ptr(split.exchange, i);
                    words.push(b.load_masked(p, Some(inside), Some(zf)));
                }
                let bad = b.cast(words[2], DType::I32);
                tail(b, &[words[0], zero_i, words[1], bad, zero_i]);
            });
        }
        None => tail(&mut b, &found),
    }
    b.finish()
}

/// Appends the elements of each block of `values` where `keep` holds to its `dst`, in
/// order, after the `count` already there (one prefix sum gives each element its slot in
/// every list); returns the new count.
fn append_in_order(
    b: &mut KernelBuilder,
    lists: &[(Value, Value)],
    keep: Value,
    count: Value,
) -> Value {
    let (one, zero) = (b.i32(1), b.i32(0));
    let keep_i = b.select(keep, one, zero);
    let rank = b.cumsum(keep_i);
    let before = b.sub(count, one);
    let slot = b.add(rank, before);
    for &(dst, values) in lists {
        let at = b.add_ptr(dst, slot);
        b.store_masked(at, values, Some(keep));
    }
    let here = b.sum(keep_i, 0);
    b.add(count, here)
}
