//! The top-k the selectors share: per row, the `k` highest-scoring items (pages or
//! tokens), some always kept (the first `sink`, the last `recent`), ties broken toward the
//! lower index, written out as ascending CSR token lists. One program a row.
//!
//! Keys. Each score becomes an i32 that orders as the floats do (`f32::total_cmp`'s map:
//! a negative float's bits with all but the sign flipped), a NaN the lowest key but one,
//! an always-kept item `i32::MAX` (`i32::MAX - 1` if its score is NaN or infinite, which
//! is flagged). Masked-off lanes are `i32::MIN` and never counted.
//!
//! Search. The `k`-th largest key `T` is found bit by bit from the top, two bits a step:
//! with `t` the threshold's top bits so far (in unsigned space, `u = key ^ i32::MIN`), a
//! step counts the keys at or above `t | d << shift` for `d = 1, 2, 3` (three sums, fused
//! into one pass and one exchange between warps) and keeps the largest `d` whose count is
//! still `>= k`. The search stops early once exactly `k` keys lie at or above `t`, and
//! after 16 steps at the latest (then `t = T`).
//!
//! Selection. Every key above `T`, and of the keys equal to `T` the first `k - count(key >
//! T)` in index order (a running count): exactly `k` items, the order a sort by (score
//! descending, index ascending) gives. The kept items' indices are compacted in order (a
//! prefix sum) into `sel_items`, then expanded to token positions: the `j`-th output token
//! of a row is slot `j % unit` of its `j / unit`-th kept item (`unit` tokens an item; the
//! plan's `sel_indptr` already accounts for the short last page, which is always kept).
//!
//! `RESIDENT`: the row fits one tile and its keys stay in registers across the steps;
//! otherwise every pass streams the row's scores in tiles of `TILE`.

use dusk_macros::kernel;

/// The keys of items `t0 .. t0 + TILE` of a row of `n` items whose scores start at
/// `base`; see the module docs.
#[kernel(crate = "crate::dusk_paths")]
fn item_keys<const TILE: usize>(
    scores: Ptr<f32>,
    base: i64,
    t0: i32,
    n: i32,
    sink: i32,
    recent: i32,
) -> Block<i32> {
    let i = t0 + arange(0, TILE);
    let valid = i < n;
    let s = load(scores + (base + (i as i64)), valid, 0.0);
    let bits = bitcast::<i32>(s);
    let ordered = where_(bits < 0, bits ^ i32::MAX, bits);
    let nan = s != s;
    let bad = nan | (abs(s) == f32::INFINITY);
    let forced = (i < sink) | (i >= n - recent);
    let kept = where_(bad, i32::MAX - 1, i32::MAX);
    let key = where_(forced, kept, where_(nan, i32::MIN + 1, ordered));
    where_(valid, key, i32::MIN)
}

/// How many of `keys` are flagged: NaN or infinite scores (see [`item_keys`]).
#[kernel(crate = "crate::dusk_paths")]
fn flagged(keys: Block<i32>) -> i32 {
    let pos_inf = 0x7F80_0000i32;
    let neg_inf = -0x7F80_0001i32;
    let bad =
        (keys == i32::MIN + 1) | (keys == i32::MAX - 1) | (keys == pos_inf) | (keys == neg_inf);
    sum(where_(bad, 1, 0), 0)
}

/// How many of `keys` lie at or above the unsigned-space threshold `u`.
#[kernel(crate = "crate::dusk_paths")]
fn count_at_or_above(keys: Block<i32>, u: i32) -> i32 {
    sum(where_(keys >= (u ^ i32::MIN), 1, 0), 0)
}

/// The selection once the cut is known (`cut`: the k-th largest key, or a key at or below
/// it with exactly `k` keys at or above): the flags, every key above the cut and the first
/// `k - above` equal to it compacted in order into `sel_items`, then their token positions
/// (slot `j % unit` of kept item `j / unit`). `keys0` is the row's tile when `RESIDENT`.
#[kernel(crate = "crate::dusk_paths")]
#[allow(clippy::too_many_arguments)]
fn write_top_k<const TILE: usize, const RESIDENT: bool>(
    keys0: Block<i32>,
    scores: Ptr<f32>,
    base: i64,
    n: i32,
    k: i32,
    cut: i32,
    sink: i32,
    recent: i32,
    row: i32,
    flags: Ptr<i32>,
    sel_item_indptr: Ptr<i32>,
    sel_items: Ptr<i32>,
    sel_indptr: Ptr<i32>,
    sel_indices: Ptr<i32>,
    unit_shift: i32,
) {
    // Keys above the cut, and the flags.
    let mut above = 0;
    let mut bad = 0;
    for t0 in (0..n).step_by(TILE) {
        let mut keys = keys0;
        if RESIDENT {
        } else {
            keys = item_keys::<TILE>(scores, base, t0, n, sink, recent);
        }
        let a = sum(where_(keys > cut, 1, 0), 0);
        let f = flagged(keys);
        above += a;
        bad += f;
    }
    store(flags + row, where_(bad > 0, 1, 0));
    // Compaction: every key above the cut and the first `k - above` equal to it.
    let need = k - above;
    let out = load(sel_item_indptr + row);
    let mut ties = 0;
    let mut kept = 0;
    for t0 in (0..n).step_by(TILE) {
        let mut keys = keys0;
        if RESIDENT {
        } else {
            keys = item_keys::<TILE>(scores, base, t0, n, sink, recent);
        }
        let i = t0 + arange(0, TILE);
        let eq = (keys == cut) & (i < n);
        let tie = where_(eq, 1, 0);
        let tie_rank = ties + cumsum(tie);
        let sel = (keys > cut) | (eq & (tie_rank <= need));
        let one = where_(sel, 1, 0);
        let rank = kept + cumsum(one);
        store(sel_items + (out + rank - 1), i, sel);
        // Both sums are their scans' totals.
        ties += sum(tie, 0);
        kept += sum(one, 0);
    }
    barrier();
    // Token positions: slot `j % unit` of kept item `j / unit`.
    let tok0 = load(sel_indptr + row);
    let ntok = load(sel_indptr + (row + 1)) - tok0;
    let unit_mask = (1 << unit_shift) - 1;
    for j0 in (0..ntok).step_by(TILE) {
        let j = j0 + arange(0, TILE);
        let m = j < ntok;
        let zero = 0i32;
        let item = load(sel_items + (out + (j >> unit_shift)), m, zero);
        store(
            sel_indices + (tok0 + j),
            (item << unit_shift) + (j & unit_mask),
            m,
        );
    }
}

/// The score row of program `program_id(0)` (one a (sequence, KV head)): the row, its items
/// `n`, the items to keep `k` (at most `n`), and where its scores start.
#[kernel(crate = "crate::dusk_paths")]
fn score_row(item_indptr: Ptr<i32>, k_items: Ptr<i32>, num_kv_heads: i32) -> (i32, i32, i32, i64) {
    let row = program_id(0);
    let (n, k, base) = row_extent(row, item_indptr, k_items, num_kv_heads);
    (row, n, k, base)
}

/// Score row `row`'s items `n`, the items to keep `k` (at most `n`), and where its scores
/// start.
#[kernel(crate = "crate::dusk_paths")]
pub fn row_extent(
    row: i32,
    item_indptr: Ptr<i32>,
    k_items: Ptr<i32>,
    num_kv_heads: i32,
) -> (i32, i32, i64) {
    let b = row / num_kv_heads;
    let h = row % num_kv_heads;
    let first = load(item_indptr + b);
    let n = load(item_indptr + (b + 1)) - first;
    let k = minimum(load(k_items + b), n);
    (n, k, (first * num_kv_heads + h * n) as i64)
}

/// Top-k items per row, as token lists. Parameters: `scores` (f32, row `(b, h)` at
/// `item_indptr[b] * num_kv_heads + h * n_b`), `item_indptr` (i32 `[batch + 1]`: items
/// before each sequence), `k_items` (i32 `[batch]`: items to keep, at most the
/// sequence's), `sel_item_indptr` (i32 `[rows + 1]`: where each row's kept items go),
/// `sel_indptr` (i32 `[rows + 1]`: where each row's tokens go), outputs `sel_items`,
/// `sel_indices`, `flags` (i32 `[rows]`: NaN or infinite scores seen), then
/// `num_kv_heads`, `unit_shift` (log2 of the tokens an item), `sink`, `recent`. Grid:
/// `batch * num_kv_heads`.
#[kernel(crate = "crate::dusk_paths", num_warps = WARPS)]
#[allow(clippy::too_many_arguments)]
pub fn select_top_k<const TILE: usize, const WARPS: usize, const RESIDENT: bool>(
    scores: Ptr<f32>,
    item_indptr: Ptr<i32>,
    k_items: Ptr<i32>,
    sel_item_indptr: Ptr<i32>,
    sel_indptr: Ptr<i32>,
    sel_items: Ptr<i32>,
    sel_indices: Ptr<i32>,
    flags: Ptr<i32>,
    num_kv_heads: i32,
    unit_shift: i32,
    sink: i32,
    recent: i32,
) {
    let (row, n, k, base) = score_row(item_indptr, k_items, num_kv_heads);
    top_k_of_row::<TILE, RESIDENT>(
        scores,
        row,
        n,
        k,
        base,
        sel_item_indptr,
        sel_indptr,
        sel_items,
        sel_indices,
        flags,
        unit_shift,
        sink,
        recent,
    );
}

/// [`select_top_k`]'s work for row `row` of `n` items keeping `k`, its scores from `base`
/// (as [`row_extent`] gives them): the search two bits a step, then [`write_top_k`]. A
/// selector's score kernel ends with it in the row's last program (Quest's
/// `quest_select`).
#[kernel(crate = "crate::dusk_paths")]
#[allow(clippy::too_many_arguments)]
pub fn top_k_of_row<const TILE: usize, const RESIDENT: bool>(
    scores: Ptr<f32>,
    row: i32,
    n: i32,
    k: i32,
    base: i64,
    sel_item_indptr: Ptr<i32>,
    sel_indptr: Ptr<i32>,
    sel_items: Ptr<i32>,
    sel_indices: Ptr<i32>,
    flags: Ptr<i32>,
    unit_shift: i32,
    sink: i32,
    recent: i32,
) {
    let mut keys0 = splat(i32::MIN, [TILE]);
    if RESIDENT {
        keys0 = item_keys::<TILE>(scores, base, 0, n, sink, recent);
    }
    // The search: `t` (unsigned space) rises while more than k keys lie at or above it.
    let mut t = 0;
    let mut at_t = n;
    let mut shift = 30;
    #[bound(16)]
    while at_t > k {
        let mut c1 = 0;
        let mut c2 = 0;
        let mut c3 = 0;
        let u1 = t | (1 << shift);
        let u2 = t | (2 << shift);
        let u3 = t | (3 << shift);
        for t0 in (0..n).step_by(TILE) {
            let mut keys = keys0;
            if RESIDENT {
            } else {
                keys = item_keys::<TILE>(scores, base, t0, n, sink, recent);
            }
            // All three counted before any is added: the compiler fuses reductions whose
            // results are not read in between (one pass, one exchange between warps).
            let n1 = count_at_or_above(keys, u1);
            let n2 = count_at_or_above(keys, u2);
            let n3 = count_at_or_above(keys, u3);
            c1 += n1;
            c2 += n2;
            c3 += n3;
        }
        let digit = where_(c3 >= k, 3, where_(c2 >= k, 2, where_(c1 >= k, 1, 0)));
        at_t = where_(c3 >= k, c3, where_(c2 >= k, c2, where_(c1 >= k, c1, at_t)));
        t = t | (digit << shift);
        shift -= 2;
    }
    write_top_k::<TILE, RESIDENT>(
        keys0,
        scores,
        base,
        n,
        k,
        t ^ i32::MIN,
        sink,
        recent,
        row,
        flags,
        sel_item_indptr,
        sel_items,
        sel_indptr,
        sel_indices,
        unit_shift,
    );
}

/// [`select_top_k`] with the cut found eight bits a pass (a radix select) instead of two:
/// each pass streams the row once, counting in a histogram of 256 bins in shared memory
/// (integer atomics: exact) the next eight bits of the keys whose higher bits equal the
/// threshold's so far, then keeps the largest digit with at least `k` keys at or above it.
/// A first pass finds the bits every key shares (the row's smallest and largest key), so
/// the digits start where keys differ; then four passes at most against sixteen, stopping
/// as early, once exactly `k` keys lie at or above the threshold. The selection is [`write_top_k`]'s, so the output is the same.
/// Rows stream in tiles of `TILE`. Parameters and grid as [`select_top_k`].
#[kernel(crate = "crate::dusk_paths", num_warps = WARPS)]
#[allow(clippy::too_many_arguments)]
pub fn select_top_k_radix<const TILE: usize, const WARPS: usize>(
    scores: Ptr<f32>,
    item_indptr: Ptr<i32>,
    k_items: Ptr<i32>,
    sel_item_indptr: Ptr<i32>,
    sel_indptr: Ptr<i32>,
    sel_items: Ptr<i32>,
    sel_indices: Ptr<i32>,
    flags: Ptr<i32>,
    num_kv_heads: i32,
    unit_shift: i32,
    sink: i32,
    recent: i32,
) {
    let (row, n, k, base) = score_row(item_indptr, k_items, num_kv_heads);
    // 256 bins, in a block of 1024 (the running sum's smallest on 8 warps; the rest stay 0).
    let bins = shared::<i32>(1024);
    let digits = arange(0, 1024);
    // `t`: the threshold's bits fixed so far (unsigned space, those below the next digit
    // zero); `above`: keys whose fixed bits exceed t's; `at_t`: keys at or above `t`.
    let mut t = 0;
    let mut above = 0;
    let mut at_t = n;
    // Where the next digit starts (its lowest bit; below 0, a last digit of fewer bits).
    let mut shift = 24;
    if n > k {
        // The bits every key of the row shares are the threshold's too: the first digit
        // starts at the highest bit where the row's smallest and largest keys differ, so
        // that its keys spread over the bins (from bit 24, scores of one sign and a few
        // octaves fall in two or three, and 32 lanes adding to one bin take turns).
        let mut lo = i32::MAX;
        let mut hi = i32::MIN;
        for t0 in (0..n).step_by(TILE) {
            let keys = item_keys::<TILE>(scores, base, t0, n, sink, recent);
            let valid = (t0 + arange(0, TILE)) < n;
            lo = minimum(lo, min(where_(valid, keys, i32::MAX), 0));
            hi = maximum(hi, max(where_(valid, keys, i32::MIN), 0));
        }
        let differ = lo ^ hi;
        let mut top = 0;
        for bit in 0..32 {
            top = where_((differ >> bit) != 0, bit, top);
        }
        shift = maximum(top - 7, 0);
        t = (lo ^ i32::MIN) & (((-1) << shift) << 8);
    }
    #[bound(4)]
    while (at_t > k) & (shift > -8) {
        store(bins + digits, zeros::<i32>([1024]));
        // This pass's digit: bits `low .. low + width`; the bits above it are fixed.
        let low = maximum(shift, 0);
        let width = minimum(shift + 8, 8);
        let high = ((-1) << low) << width;
        for t0 in (0..n).step_by(TILE) {
            let keys = item_keys::<TILE>(scores, base, t0, n, sink, recent);
            let u = keys ^ i32::MIN;
            let counted = ((t0 + arange(0, TILE)) < n) & ((u & high) == t);
            atomic_add(
                bins + ((u >> low) & ((1 << width) - 1)),
                splat(1, [TILE]),
                counted,
            );
        }
        let count = load(bins + digits);
        // Keys of this prefix at or above each digit: a suffix sum.
        let at_or_above = sum(count, 0) - cumsum(count) + count;
        let d = max(
            where_(
                (above + at_or_above >= k) & (digits < (1 << width)),
                digits,
                -1,
            ),
            0,
        );
        let in_d = sum(where_(digits == d, count, 0), 0);
        above += sum(where_(digits > d, count, 0), 0);
        at_t = above + in_d;
        t = t | (d << low);
        shift -= 8;
    }
    write_top_k::<TILE, false>(
        splat(i32::MIN, [TILE]),
        scores,
        base,
        n,
        k,
        t ^ i32::MIN,
        sink,
        recent,
        row,
        flags,
        sel_item_indptr,
        sel_items,
        sel_indptr,
        sel_indices,
        unit_shift,
    );
}
