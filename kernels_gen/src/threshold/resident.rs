//! The search with the row in registers: one program per candidate row, each query head
//! of its group searched in turn, the union of their kept sets compacted in order.

use super::search::{self, load_params, needs_bounds, search, tally, Outputs, RowTotals};
use super::{output, search_name, Policy, SearchConfig};
use dusk_compiler::{CompileError, DType, Kernel, KernelBuilder, Value};

/// Builds the search kernel. Parameters: `scores` (f32; candidate row `r` with `n`
/// candidates from `start` holds query head `g` at `scores[start * group + g * n ..]`, as
/// `spgemv_quant` writes them), `cand_indptr`, `cand_indices` (i32 CSR per candidate row),
/// one pointer per policy parameter (a value per query row), `scale_log2e` (f32: the
/// softmax scale times log2 e), and the outputs `sel_indptr` (i32, rows + 1) and
/// `sel_indices` (i32, room for every candidate): the kept positions of every row as one
/// CSR list, ascending within a row; `prefix` (i32, rows + 1, zero before the first launch
/// and left zero by each: the rows' look-back words, `output.rs`), `budget` (i32 per
/// candidate row: how many kept), `kept_mass` (f32 per query row) and `flags` (i32 per
/// query row: 1 when the row's logits held NaN or infinity). Grid: one program per
/// candidate row.
pub fn build_search(policy: &Policy, cfg: &SearchConfig) -> Result<Kernel, CompileError> {
    let mut b = KernelBuilder::new(&search_name(policy, cfg));
    b.set_num_warps(cfg.num_warps);
    b.set_min_programs_per_sm(cfg.min_programs_per_sm);
    let k = search::declare(&mut b, policy, cfg);
    let search::Kernel {
        scores,
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
    let one = b.i32(1);
    let offs = b.arange(0, cfg.block as i64);
    let valid = b.lt(offs, n);

    let zero_i = b.i32(0);
    let none = b.splat(zero_i, &[cfg.block]);
    let (lo_g, hi_g, step) = (b.i32(0), b.i32(cfg.group as i32), b.i32(1));
    let row_args = |g| RowArgs {
        scores,
        params,
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
    let at = output::row_offset(&mut b, &k, row, total);
    let one_b = b.splat(one, &[cfg.block]);
    let is_kept = b.eq(keep, one_b);
    let start64 = b.cast(start, DType::I64);
    let src_row = b.add_ptr(indices, start64);
    let src = b.add_ptr(src_row, offs);
    let is_kept = b.and(is_kept, at.1);
    let tok = b.load_masked(src, Some(is_kept), None);
    let dst_row = b.add_ptr(sel_indices, at.0);
    let slot = b.sub(rank, one);
    let dst = b.add_ptr(dst_row, slot);
    b.store_masked(dst, tok, Some(is_kept));
    output::finish_row(&mut b, &k, row, at, total);
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
