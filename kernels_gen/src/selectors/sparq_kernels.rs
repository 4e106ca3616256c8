//! SparQ Attention's kernels (Ribar et al., "SparQ Attention: Bandwidth-Efficient LLM
//! Inference", Algorithm 1 and Appendices C and E), in the kernel language, for decode with
//! GQA: one token set per (sequence, KV head), as the authors' reference code does it (the
//! group's `|q|` summed to pick the components, its approximate scores summed to rank the
//! tokens).
//!
//! State (see [`super::sparq`]):
//! - `k_t`, f16 `[num_blocks, num_kv_heads, D, block_size]`: K transposed within blocks of
//!   its own (Appendix E), each block `block_size` consecutive tokens of one sequence,
//!   found through a block table as the cache's pages are through the page table (the
//!   cache's own pages and page table are one choice). Component `c` of a block's keys is
//!   `block_size` contiguous values: reading `r` components of every token reads `r`
//!   contiguous runs a block, never a whole key row. It is written in runs of
//!   [`SPARQ_RUN`] tokens (of `min(block_size, 16)` with shorter blocks), a run's component
//!   being one whole 32-byte sector, so that no step writes a sector in part (2 bytes of
//!   each of `D` sectors a token would be `D` read-modify-writes in memory): while a run
//!   fills, each decode step copies one slice of the run before it (`D / run` components
//!   of its tokens, [`sparq_copy_slice`]), so that every step writes the same few whole
//!   sectors and none moves a whole run (which, when every row of a batch finished a run at
//!   once, made that step twice as slow as the others).
//! - `k_open`, f16 `[num_seqs, num_kv_heads, 2 * run, D]`: each row's staging ring,
//!   row-major (a token is one 256-byte row at D = 128): the token at position `p` is row
//!   `p % (2 * run)`, written when it is appended. It holds the unfinished run and the run
//!   before it, whose copy completes only as the unfinished run does.
//! - `v_sum`, f32 `[num_seqs, num_kv_heads, D]`: the sum of V over each sequence's tokens;
//!   the running mean is `v_sum / len`, the length from the page table.
//!
//! All three are written at append: by [`sparq_update`] for runs of tokens (a prefill, or
//! the last token of each sequence), and by [`sparq_token`], the same writes for the rows
//! of the one-launch decode append (`crate::cache`). The readers ([`sparq_score`],
//! [`sparq_mass`]) take from the copy only the runs whose copy is complete
//! ([`closed_tokens`]); a row's last `n - closed` tokens (up to `2 * run - 1`) come from
//! its staging ring.
//!
//! A selection, per row `(b, h)` (`program_id(0) = b * num_kv_heads + h`):
//! 1. [`sparq_query`]: `i1`, the top `r` components of `sum_g |q_g|` over the group's query
//!    heads (ties toward the lower component, NaN lowest), ascending; and per query head the
//!    scaled sparse query `q_g[i1] / tau_g`, `tau_g = sqrt(D * |q_g[i1]|_1 / |q_g|_1)`
//!    (Appendix C's temperature; 0 when the selected components of `q_g` are all 0).
//! 2. [`sparq_score`]: per token `i` and query head `g` the approximate logit
//!    `l_gi = (q_g[i1] / tau_g) . K[i, i1]` from the transposed copy; the token's score
//!    `s_i = sum_g l_gi` (the top-k ranks these); per tile and head the softmax's max and
//!    sum. Nothing else: the scoring reads `2r` bytes a token and KV head and writes 4.
//! 3. the shared top-k ([`super::topk_kernel`]) keeps `k` tokens, the last `window` always.
//! 4. [`sparq_mass`]: per query head the kept tokens' `sum exp(l_gi - max)`, a chunk of
//!    them a program; with a group of several heads each kept token's logits are computed
//!    again from the copy (in f32, as the scoring did: writing every token's per-head logits
//!    there instead would move 2 to 4 bytes a head more per token than the scores).
//! 5. [`sparq_alpha`]: per query head `alpha_g = sum_{i kept} softmax(l_g)_i` from the
//!    chunks' sums and the tiles' statistics (everything kept: exactly 1), and the row's
//!    mean of V in f16, which the attention plan mixes: `y = alpha * attention(kept) + (1 -
//!    alpha) * v_mean` (`SparqMix`).

use super::page::group_query;
use dusk_macros::kernel;

/// Tokens of a run of the transposed copy (with blocks of 16 tokens or more): 16 f16
/// values of a component are one 32-byte sector. A row's staging ring holds two runs.
/// (The kernels, which see no constants but their own, write it as the literal 16.)
pub const SPARQ_RUN: usize = 16;

/// The tokens of a row of `n` tokens that readers take from the transposed copy (blocks of
/// `block_size`): its runs of `run = min(block_size, 16)` tokens but the unfinished one and
/// the one before it (`n - n % run - run`, or none), whose copy is complete. The rest, 0 to
/// `2 * run - 1` tokens, are read from the staging ring `k_open`. (Once a run is full, its
/// copy completes a slice a step over the next run's appends: the run before the
/// unfinished one is complete only when the unfinished one is full, and then it is the
/// one before the full one.)
#[kernel(crate = "crate::dusk_paths")]
pub fn closed_tokens(n: i32, block_size: i32) -> i32 {
    let run = minimum(block_size, 16);
    maximum(n - n % run - run, 0)
}

/// Copies slice `slice` of a staged run of `run` tokens (16, or 8 with blocks of 8) into
/// the transposed copy: components `slice * D / run .. (slice + 1) * D / run` of each of the
/// run's tokens, token `t` being the row at `k_open + staged_at + t * D`; component `c` of
/// token `t` goes to `k_t[to + c * block_size + t]` (`to`: the run's first slot of
/// component 0 in its block and KV head, a multiple of 8), when `copy`. A decode step copies
/// one slice of the run before its own, so that the copy is written a few whole sectors a
/// step (each component's `run` values stored together, 16-byte stores) and no step moves a
/// whole run: `D` values a row, 256 bytes at D = 128. The slice is read as 16 rows of
/// `D / 16` components (16-byte loads at D = 128; with runs of 8 a token's slice is two
/// rows) and turned through shared memory, where row `q`'s components are `16` apart and a
/// component's 16 rows contiguous, read back 8 at a time. The caller checks every place in
/// range (the rows are read whatever `copy`).
#[kernel(crate = "crate::dusk_paths")]
#[allow(clippy::too_many_arguments)]
pub fn sparq_copy_slice<const D: usize>(
    k_open: Ptr<f16>,
    staged_at: i64,
    slice: i32,
    run: i32,
    k_t: Ptr<f16>,
    to: i64,
    block_size: i32,
    copy: bool,
) {
    // Row q: token q % run, its components from (slice * (16 / run) + q / run) * D / 16.
    let q = arange(0, 16);
    let w = arange(0, D / 16);
    let group = (slice * (16 / run) + q / run) * (D / 16);
    let from = staged_at + ((q % run) as i64) * D + (group as i64);
    let keys = load(k_open + (expand(from, 1, D / 16) + expand(w as i64, 0, 16)));
    let turned = shared::<f16>(D);
    store(
        turned + (expand(q, 1, D / 16) + expand(w * 16, 0, 16)),
        keys,
    );
    // Row e of the [D / 8, 8] block read back: component e / 2 of rows (e % 2) * 8 ..
    // (e % 2) * 8 + 8, that is of tokens from `first` (0 or 8 with runs of 16, 0 with runs
    // of 8, whose second row of 8 is the next component group).
    let e = arange(0, D / 8);
    let t = arange(0, 8);
    let back = load(turned + (expand(e * 8, 1, 8) + expand(t, 0, D / 8)));
    let row0 = (e & 1) * 8;
    let comp = (slice * (16 / run) + row0 / run) * (D / 16) + (e >> 1);
    let first = row0 % run;
    // Each row's first slot, a multiple of 8 (blocks of 8 or more, runs from a multiple of
    // 8) written so that the compiler sees it: 16-byte stores.
    let starts = ((to + (comp as i64) * (block_size as i64) + (first as i64)) >> 3) << 3;
    let rows = where_(copy, D / 8, 0);
    store(
        k_t + (expand(starts, 1, 8) + expand(t as i64, 0, D / 8)),
        back,
        expand(e < rows, 1, 8),
    );
}

/// The `D` element offsets, in the transposed copy of K (`[num_blocks, num_kv_heads, D,
/// block_size]`), of slot `slot` of block `block` for KV head `head`: one value per
/// component, `block_size` apart.
#[kernel(crate = "crate::dusk_paths")]
pub fn transposed_key_offsets<const D: usize>(
    block: i32,
    slot: i32,
    head: i32,
    num_kv_heads: i32,
    block_size: i32,
) -> Block<i64> {
    let row = (block as i64) * (num_kv_heads as i64) + (head as i64);
    let comps = arange(0, D) as i64;
    (row * D + comps) * (block_size as i64) + (slot as i64)
}

/// Writes the components of one token's key (`key`, its `D` components) where `comps`
/// holds into the transposed copy `k_t`, at slot `slot` of block `block` (the token's
/// position within its block, and the block the copy's block table gives for it), KV head
/// `head`. For a kernel that appends tokens to the cache; the caller checks `block` and
/// `slot` are in range.
#[kernel(crate = "crate::dusk_paths")]
#[allow(clippy::too_many_arguments)]
pub fn sparq_store_key<const D: usize>(
    k_t: Ptr<f16>,
    block: i32,
    slot: i32,
    head: i32,
    num_kv_heads: i32,
    block_size: i32,
    key: Block<f16>,
    comps: Block<bool>,
) {
    let offs = transposed_key_offsets::<D>(block, slot, head, num_kv_heads, block_size);
    store(k_t + offs, key, comps);
}

/// Adds `value` (`D` values: one token's V, or the sum of several) to the running sum of V
/// of sequence `seq`, KV head `head` (`v_sum`, f32 `[num_seqs, num_kv_heads, D]`),
/// atomically: programs appending to one sequence at once all count. The caller checks
/// `seq` is in range.
#[kernel(crate = "crate::dusk_paths")]
pub fn sparq_add_value<const D: usize>(
    v_sum: Ptr<f32>,
    seq: i32,
    head: i32,
    num_kv_heads: i32,
    value: Block<f32>,
) {
    let row = (seq as i64) * (num_kv_heads as i64) + (head as i64);
    atomic_add(v_sum + (row * D + (arange(0, D) as i64)), value);
}

/// SparQ's part of a decode step's one-launch append, in `crate::cache::parts`'
/// convention (`kernels_gen/src/cache/README.md`): for each of the program's rows
/// (`rows[i] = b * num_kv_heads + h[i]`; `page[i] < 0` skips the row), the new token of
/// `k_new` and `v_new` (f16 `[batch, num_kv_heads, D]`), at slot `slot[i]` of the last page
/// of sequence `b`, at position `pos = (pages_b - 1) * page_size + slot` of its sequence:
/// through the copy's block table after the append (`blk_indptr`, `blk_indices` of
/// `num_blk_indices` entries, blocks of `block_size` in `0..num_blocks`; an entry outside
/// them skips the row) its block is found, and its key staged in row `pos % (2 * run)` of
/// row `rows[i]`'s ring in `k_open` (`run = min(block_size, 16)`). When the token has a run
/// before its own (`pos >= run`), slice `pos % run` of that run goes from the ring into
/// `k_t` ([`sparq_copy_slice`], through the block the table gives that run: this token's,
/// or the one before when this token starts a block), so that the run's copy is complete
/// when this token's run is full. Its value is added to the row's sum of V (a plain read
/// and write: a launch appends one token a sequence, so no other program writes the row).
/// The same writes as [`sparq_update`] over the entries of `SparqUpdates::last_tokens`.
/// Every read comes before the first write, so that they are in flight together (the
/// append calls this part first); the slice's rows, whose place follows from the position
/// alone, are read before the block table answers.
#[kernel(crate = "crate::dusk_paths")]
#[allow(clippy::too_many_arguments)]
pub fn sparq_token<const D: usize, const ROWS: usize>(
    k_new: Ptr<f16>,
    v_new: Ptr<f16>,
    rows: Block<i32>,
    h: Block<i32>,
    page: Block<i32>,
    slot: Block<i32>,
    num_kv_heads: i32,
    page_size: i32,
    kv_indptr: Ptr<i32>,
    blk_indptr: Ptr<i32>,
    blk_indices: Ptr<i32>,
    num_blk_indices: i32,
    num_blocks: i32,
    block_size: i32,
    k_t: Ptr<f16>,
    k_open: Ptr<f16>,
    v_sum: Ptr<f32>,
) {
    let valid = page >= 0;
    let b = rows / num_kv_heads;
    let pages = load(kv_indptr + (b + 1), valid, 0) - load(kv_indptr + b, valid, 0);
    let pos = (pages - 1) * page_size + slot;
    let run = minimum(block_size, 16);
    let ring = 2 * run;
    let slice = pos % run;
    // The run before this token's: tokens `prev .. prev + run`, staged in the ring.
    let prev = pos - slice - run;
    let has_prev = valid & (prev >= 0);
    let mask = expand(valid, 1, D);
    let comps = arange(0, D) as i64;
    let src = expand((rows as i64) * D, 1, D) + expand(comps, 0, ROWS);
    let key = load(k_new + src, mask);
    // The sum of V of sequence b, KV head h is row `rows` of `v_sum`, which this row's
    // program alone writes in a launch (one new token a sequence): no atomics.
    let sums = v_sum + src;
    let total = load(sums, mask, 0.0) + load(v_new + src, mask) as f32;
    let first = load(blk_indptr + b, valid, 0);
    let end = load(blk_indptr + (b + 1), valid, 0);
    let at = first + pos / block_size;
    let listed = valid & (first >= 0) & (at < end) & (end <= num_blk_indices);
    let block = load(blk_indices + at, listed, -1);
    let prev_block = load(
        blk_indices + (first + prev / block_size),
        listed & has_prev,
        -1,
    );
    let ok = listed & (block >= 0) & (block < num_blocks);
    let copies = ok & has_prev & (prev_block >= 0) & (prev_block < num_blocks);
    // The previous run's slice into the copy, a row at a time.
    let lanes = arange(0, ROWS);
    for i in 0..ROWS {
        let pick = lanes == i;
        if max(where_(pick & has_prev, 1, 0), 0) > 0 {
            let row = sum(where_(pick, rows, 0), 0) as i64;
            let start = sum(where_(pick, prev, 0), 0);
            let blk = sum(where_(pick, prev_block, 0), 0) as i64;
            let head = sum(where_(pick, h, 0), 0) as i64;
            let head_row = blk * (num_kv_heads as i64) + head;
            let to = head_row * D * (block_size as i64) + ((start % block_size) as i64);
            let staged_at = (row * (ring as i64) + ((start % ring) as i64)) * D;
            sparq_copy_slice::<D>(
                k_open,
                staged_at,
                sum(where_(pick, slice, 0), 0),
                run,
                k_t,
                to,
                block_size,
                max(where_(pick & copies, 1, 0), 0) > 0,
            );
        }
    }
    // The token itself: staged, one row of row-major keys.
    let staged = ((rows as i64) * (ring as i64) + ((pos % ring) as i64)) * D;
    store(
        k_open + (expand(staged, 1, D) + expand(comps, 0, ROWS)),
        key,
        expand(ok, 1, D),
    );
    store(sums, total, expand(ok, 1, D));
}

/// Appends tokens to SparQ's state: entry `program_id(0) = i` is the 10 values at
/// `entries + 10 * i` (`SparqEntry`'s fields in order): slots `start .. start + count` of
/// the cache's physical page `page`, tokens of sequence `seq` that the copy holds at slots
/// `block_start ..` of block `block`; for KV head `program_id(1)`, components `copy_from ..
/// copy_to` of each token's key go into `k_t`, the keys into rows `stage ..` of the
/// sequence's staging ring in `k_open` unless `stage` is negative, and (`values` 1) the
/// entry's sum of V is added to `v_sum`. Parameters: `k`, `v` (the cache, f16 `[num_pages,
/// page_size, num_kv_heads, D]`), the entries (i32), `num_pages`, `num_blocks`,
/// `num_seqs`, `num_kv_heads`, `page_size`, `block_size`, then the state. Grid: `(entries,
/// num_kv_heads)`. An entry out of range (an id, slots outside the page or the block,
/// ring rows past the ring or off the tokens' places in their run, components outside the
/// key, `values` neither 0 nor 1) is skipped: device-written entries read and write nothing
/// out of bounds.
#[kernel(crate = "crate::dusk_paths", num_warps = 1)]
#[allow(clippy::too_many_arguments)]
pub fn sparq_update<const D: usize>(
    k: Ptr<f16>,
    v: Ptr<f16>,
    entries: Ptr<i32>,
    num_pages: i32,
    num_blocks: i32,
    num_seqs: i32,
    num_kv_heads: i32,
    page_size: i32,
    block_size: i32,
    k_t: Ptr<f16>,
    k_open: Ptr<f16>,
    v_sum: Ptr<f32>,
) {
    let i = program_id(0);
    let h = program_id(1);
    let entry = entries + (i as i64) * 10;
    let page = load(entry);
    let start = load(entry + 1);
    let count = load(entry + 2);
    let seq = load(entry + 3);
    let block = load(entry + 4);
    let to = load(entry + 5);
    let stage = load(entry + 6);
    let copy_from = load(entry + 7);
    let copy_to = load(entry + 8);
    let values = load(entry + 9);
    let run = minimum(block_size, 16);
    let ring = 2 * run;
    let ok = (page >= 0)
        & (page < num_pages)
        & (start >= 0)
        & (count >= 1)
        & (count <= page_size - start)
        & (seq >= 0)
        & (seq < num_seqs)
        & (block >= 0)
        & (block < num_blocks)
        & (to >= 0)
        & (count <= block_size - to)
        & ((stage < 0) | ((count <= ring - stage) & (stage % run == to % run)))
        & (copy_from >= 0)
        & (copy_from <= copy_to)
        & (copy_to <= D)
        & ((values == 0) | (values == 1));
    if ok {
        let row = (seq as i64) * (num_kv_heads as i64) + (h as i64);
        let staged_at = (row * (ring as i64) + (stage as i64)) * D;
        let token0 = ((page as i64) * (page_size as i64) + (start as i64)) * (num_kv_heads as i64)
            + (h as i64);
        let c = arange(0, D);
        let into_copy = (c >= copy_from) & (c < copy_to);
        let comps = c as i64;
        let mut acc = zeros::<f32>([D]);
        for j in 0..count {
            let offs = (token0 + (j as i64) * (num_kv_heads as i64)) * D + comps;
            let key = load(k + offs);
            if copy_from < copy_to {
                sparq_store_key::<D>(
                    k_t,
                    block,
                    to + j,
                    h,
                    num_kv_heads,
                    block_size,
                    key,
                    into_copy,
                );
            }
            if stage >= 0 {
                store(k_open + (staged_at + (j as i64) * D + comps), key);
            }
            acc = acc + load(v + offs) as f32;
        }
        if values == 1 {
            sparq_add_value::<D>(v_sum, seq, h, num_kv_heads, acc);
        }
    }
}

/// Step 1 for one row: the `r` components (`dims[row * rp ..]`, ascending, then zeros up to
/// `rp`) and the scaled sparse query of each of the group's heads, component-major so that
/// a component's heads are contiguous for the scoring (`qs[(row * rp + j) * G + g]` for the
/// `j`-th component, zeros past `r`). Parameters: `q` (f16 `[batch, num_kv_heads * G, D]`), `dims`
/// (i32), `qs` (f32), `r`, `rp` (the rows' stride, `r <= rp <= D`). Grid: `batch *
/// num_kv_heads`. The ranking, and the chosen components' places, compare every component
/// with `CHUNK` others at a time (their keys, then ranks, staged in shared memory).
#[kernel(crate = "crate::dusk_paths", num_warps = 4)]
pub fn sparq_query<const D: usize, const G: usize, const CHUNK: usize>(
    q: Ptr<f16>,
    dims: Ptr<i32>,
    qs: Ptr<f32>,
    r: i32,
    rp: i32,
) {
    let row = program_id(0);
    let qg = group_query::<D, G>(q);
    let aq = abs(qg);
    // The group's magnitudes as keys that order as they do, a NaN lowest.
    let a = sum(aq, 0);
    let key = where_(a != a, -1, bitcast::<i32>(a));
    let staged = shared::<i32>(D);
    let c = arange(0, D);
    store(staged + c, key);
    // Rank of component c: those ranked before it (a larger key, or an equal one earlier).
    let mut rank = zeros::<i32>([D]);
    for j0 in (0..D).step_by(CHUNK) {
        let j = j0 + arange(0, CHUNK);
        let kj = expand(load(staged + j), 0, D);
        let kc = expand(key, 1, CHUNK);
        let earlier = expand(j, 0, D) < expand(c, 1, CHUNK);
        let before = (kj > kc) | ((kj == kc) & earlier);
        rank = rank + sum(where_(before, 1, 0), 1);
    }
    let chosen = rank < r;
    // Place of a chosen component among the chosen, ascending: the chosen ones before it.
    let ranks = shared::<i32>(D);
    store(ranks + c, rank);
    let mut pos = zeros::<i32>([D]);
    for j0 in (0..D).step_by(CHUNK) {
        let j = j0 + arange(0, CHUNK);
        let chosen_j = expand(load(ranks + j) < r, 0, D);
        let earlier = expand(j, 0, D) < expand(c, 1, CHUNK);
        pos = pos + sum(where_(chosen_j & earlier, 1, 0), 1);
    }
    let pad = (c >= r) & (c < rp);
    store(dims + (row * rp + pos), c, chosen);
    store(dims + (row * rp + c), zeros::<i32>([D]), pad);
    // Appendix C's temperature per head: sqrt(D * |q[i1]|_1 / |q|_1).
    let l1 = sum(aq, 1);
    let l1_chosen = sum(where_(expand(chosen, 0, G), aq, 0.0), 1);
    let all_zero = (l1_chosen == 0.0) & (l1 == l1);
    let scale = where_(all_zero, 0.0, rsqrt(l1_chosen / l1 * D));
    let heads = expand(arange(0, G), 1, D);
    let sparse = qg * expand(scale, 1, D);
    store(
        qs + (heads + expand((row * rp + pos) * G, 0, G)),
        sparse,
        expand(chosen, 0, G),
    );
    store(
        qs + (heads + expand((row * rp + c) * G, 0, G)),
        zeros::<f32>([G, D]),
        expand(pad, 0, G),
    );
}

/// Each head's approximate logits of `N` tokens of row `row`, f32 `[G, N]`: `l_g = sum_c
/// qs_g[c] * k[c]` over the `r` chosen components (`dims[row * RP ..]`, their heads' scaled
/// queries `qs[(row * RP + c) * G ..]`, zero past `r`), each token's component `c` at
/// `k_t[cols + dims[c] * 2^LOG_BS]` (`cols`: the token's block row and slot). The
/// components are read `CH` at a time, each chunk in one unmasked load (so that its loads
/// are all in flight before any is used; in bounds wherever `cols` is, a padded component
/// reading component 0 and then zeroed), and the heads accumulated into one `[G, N]` block
/// in which each thread holds every head of its own tokens, or of half of them.
#[kernel(crate = "crate::dusk_paths")]
#[allow(clippy::too_many_arguments)]
pub fn group_logits<
    const G: usize,
    const RP: usize,
    const CH: usize,
    const N: usize,
    const LOG_BS: usize,
>(
    k_t: Ptr<f16>,
    dims: Ptr<i32>,
    qs: Ptr<f32>,
    row: i32,
    r: i32,
    cols: Block<i64>,
) -> Block<f32> {
    let heads = arange(0, G);
    let mut acc = zeros::<f32>([G, N]);
    for c0 in (0..r).step_by(CH) {
        let comp = c0 + arange(0, CH);
        let chosen = load(dims + (row * RP + comp)) as i64;
        let offs = expand(chosen * (1 << LOG_BS), 1, N) + expand(cols, 0, CH);
        let keys = where_(expand(comp < r, 1, N), load(k_t + offs) as f32, 0.0);
        #[unroll]
        for g in 0..G {
            let q = load(qs + ((row * RP + comp) * G + g));
            let l = sum(keys * expand(q, 1, N), 0);
            // Into head g's row; -0.0 elsewhere adds nothing (and is folded away where a
            // thread's heads are known when the kernel is compiled).
            acc = acc + where_(expand(heads == g, 1, N), expand(l, 0, G), -0.0);
        }
    }
    acc
}

/// The row's largest logit of each of the group's heads (`[G]`), from its `tiles` tiles'
/// statistics (`stat_max[(row * tiles_per_row + t) * G + g]`), `BLOCK` tiles at a time.
#[kernel(crate = "crate::dusk_paths")]
pub fn row_max<const G: usize, const BLOCK: usize>(
    stat_max: Ptr<f32>,
    row: i32,
    tiles: i32,
    tiles_per_row: i32,
) -> Block<f32> {
    let heads = arange(0, G);
    let mut top = splat(f32::NEG_INFINITY, [G]);
    for t0 in (0..tiles).step_by(BLOCK) {
        let t = t0 + arange(0, BLOCK);
        let at = expand((row * tiles_per_row + t) * G, 1, G) + expand(heads, 0, BLOCK);
        let m = load(stat_max + at, expand(t < tiles, 1, G), f32::NEG_INFINITY);
        top = maximum(top, max(m, 0));
    }
    top
}

/// Step 2 for `TILE` tokens of one row (the tile: see the grid below): each head's logits of
/// the tile's tokens ([`group_logits`]; a token's block and slot through the copy's block
/// table, `blk_indptr`, `blk_indices`: blocks of `2^LOG_BS` tokens, so that a component of
/// the tile is read in runs of contiguous slots, 16-byte loads; the row's tokens past
/// [`closed_tokens`], fewer than `2 * SPARQ_RUN`, from its staging ring in `k_open`, in the
/// tile that holds them). Writes the tokens' scores `sum_g l_g` (f32, row `(b, h)` at
/// `tok_indptr[b] * num_kv_heads + h * len_b`, the top-k's layout) and per head the tile's
/// logit max and `sum exp(l - max)` (`stat_max`, `stat_sum` at `(row * max_tiles + tile) *
/// G + g`). The heads' logits are written for the staged tokens only
/// (`staged_logits[(row * G + g) * 32 + t]` for token `closed + t`): alpha computes those
/// of the other kept tokens again from the copy ([`sparq_mass`]). The row's extents and
/// the tile's block table entries are read before the program waits on any of them, and
/// only the tiles holding staged tokens (the last, or the last two where the staged tokens
/// cross a tile's end) merge them into their statistics. Grid: `(batch *
/// num_kv_heads, max_tiles)`, `max_tiles = ceil(longest sequence / TILE)`, one warp a
/// program; `program_id(1) = i` takes tile `max_tiles - 1 - i`, so that the tiles holding
/// staged tokens, which read them besides their own, are among the first the GPU starts
/// rather than its last wave (the grid runs every row's tile `i` before any row's tile `i +
/// 1`). In tile order, GQA's scoring at batch 32 and 32k (16 staged tokens in every row's
/// last tile) took 93.2 us against main's 90.1 (none staged there at 32k), from the last
/// 90.6 (H200, `benches/NOTES.md`).
#[kernel(crate = "crate::dusk_paths", num_warps = 1)]
#[allow(clippy::too_many_arguments)]
pub fn sparq_score<
    const G: usize,
    const RP: usize,
    const CH: usize,
    const TILE: usize,
    const LOG_BS: usize,
>(
    k_t: Ptr<f16>,
    k_open: Ptr<f16>,
    blk_indptr: Ptr<i32>,
    blk_indices: Ptr<i32>,
    tok_indptr: Ptr<i32>,
    dims: Ptr<i32>,
    qs: Ptr<f32>,
    scores: Ptr<f32>,
    stat_max: Ptr<f32>,
    stat_sum: Ptr<f32>,
    staged_logits: Ptr<f32>,
    num_kv_heads: i32,
    head_dim: i32,
    r: i32,
    max_tiles: i32,
) {
    let row = program_id(0);
    // The tiles from the last: see above.
    let tile = max_tiles - 1 - program_id(1);
    let b = row / num_kv_heads;
    let h = row % num_kv_heads;
    let first = load(tok_indptr + b);
    let n = load(tok_indptr + (b + 1)) - first;
    // Block and slot of each token (a token of no block, past the sequence, reads block 0):
    // a block's slots are contiguous in `k_t`.
    let tok = tile * TILE + arange(0, TILE);
    let j = tok >> LOG_BS;
    let blk_first = load(blk_indptr + b);
    let blk_ok = j < load(blk_indptr + (b + 1)) - blk_first;
    let blk = load(blk_indices + (blk_first + j), blk_ok, 0);
    if tile * TILE < n {
        let closed = closed_tokens(n, 1 << LOG_BS);
        let valid = tok < closed;
        let slot = tok & ((1 << LOG_BS) - 1);
        let base = ((blk as i64) * (num_kv_heads as i64) + (h as i64)) * (head_dim as i64);
        let cols = base * (1 << LOG_BS) + (slot as i64);
        let acc = group_logits::<G, RP, CH, TILE, LOG_BS>(k_t, dims, qs, row, r, cols);
        let at = (first * num_kv_heads + h * n) as i64;
        store(scores + (at + (tok as i64)), sum(acc, 0), valid);
        let l = where_(expand(valid, 0, G), acc, f32::NEG_INFINITY);
        let mut m = max(l, 1);
        let mut staged_sum = zeros::<f32>([G]);
        // The staged tokens in this tile (the row's last two tiles at most), from their rows
        // of the ring, merged into the tile's statistics here: other tiles pay nothing for
        // them.
        if (closed < n) & (closed < tile * TILE + TILE) {
            let open = closed + arange(0, 32);
            let staged = (open < n) & (open >= tile * TILE) & (open < tile * TILE + TILE);
            let ring = 2 * minimum(1 << LOG_BS, 16);
            let rows = ((row as i64) * (ring as i64) + ((open % ring) as i64)) * (head_dim as i64);
            let o = group_logits::<G, RP, CH, 32, 0>(k_open, dims, qs, row, r, rows);
            store(scores + (at + (open as i64)), sum(o, 0), staged);
            let heads = (row * G + arange(0, G)) * 32;
            let per_head = expand(heads, 1, 32) + expand(arange(0, 32), 0, G);
            store(staged_logits + per_head, o, expand(staged, 0, G));
            let lo = where_(expand(staged, 0, G), o, f32::NEG_INFINITY);
            m = maximum(m, max(lo, 1));
            staged_sum = sum(exp2((lo - expand(m, 1, 32)) * 1.4426950408889634), 1);
        }
        let e = exp2((l - expand(m, 1, TILE)) * 1.4426950408889634);
        let stat = (row * max_tiles + tile) * G + arange(0, G);
        store(stat_max + stat, m);
        store(stat_sum + stat, sum(e, 1) + staged_sum);
    }
}

/// Step 4, alpha's numerators: for `CHUNK` kept tokens of one row (`program_id(1)` the
/// chunk of `sel_items[sel_item_indptr[row] ..]`), each head's `sum exp(l - max)` over
/// them, `max` the row's largest logit (from the tiles' statistics, `tiles_per_row` tiles
/// of `tile` tokens), into `mass[(row * max_chunks + chunk) * G + g]`. With one head the
/// logits are the scores; with several, each head's logits of the kept tokens are computed
/// again from `k_t`, as [`sparq_score`] computed them ([`group_logits`]: `r` components of
/// each kept token, 2-byte gathers), and those of the row's staged tokens (not read from `k_t`)
/// read from what the scoring wrote (`staged_logits`, `(row * G + g) * 32 + t` for token
/// `closed + t`). A chunk past the row's kept tokens writes nothing;
/// kept items outside the sequence (device-written) count for nothing. Grid: `(batch *
/// num_kv_heads, max_chunks)`, one warp a program.
#[kernel(crate = "crate::dusk_paths", num_warps = 1)]
#[allow(clippy::too_many_arguments)]
pub fn sparq_mass<
    const G: usize,
    const RP: usize,
    const CH: usize,
    const CHUNK: usize,
    const LOG_BS: usize,
>(
    k_t: Ptr<f16>,
    blk_indptr: Ptr<i32>,
    blk_indices: Ptr<i32>,
    tok_indptr: Ptr<i32>,
    dims: Ptr<i32>,
    qs: Ptr<f32>,
    scores: Ptr<f32>,
    stat_max: Ptr<f32>,
    staged_logits: Ptr<f32>,
    sel_item_indptr: Ptr<i32>,
    sel_items: Ptr<i32>,
    mass: Ptr<f32>,
    num_kv_heads: i32,
    head_dim: i32,
    r: i32,
    tiles_per_row: i32,
    tile: i32,
    max_chunks: i32,
) {
    let row = program_id(0);
    let chunk = program_id(1);
    let b = row / num_kv_heads;
    let h = row % num_kv_heads;
    let first = load(tok_indptr + b);
    let n = load(tok_indptr + (b + 1)) - first;
    let lo = load(sel_item_indptr + row);
    let kept = load(sel_item_indptr + (row + 1)) - lo;
    if chunk * CHUNK < kept {
        let top = row_max::<G, 256>(stat_max, row, (n + tile - 1) / tile, tiles_per_row);
        let i = chunk * CHUNK + arange(0, CHUNK);
        let listed = i < kept;
        let token = load(sel_items + (lo + i), listed, 0);
        let ok = listed & (token >= 0) & (token < n);
        // A kept token's place, the one block kept across the logits: -1 none (past the
        // list, or outside the sequence), 0 in the copy, 1 + t the staged token closed + t.
        let closed = closed_tokens(n, 1 << LOG_BS);
        let place = where_(ok, where_(token < closed, 0, token - closed + 1), -1);
        let mut l = zeros::<f32>([G, CHUNK]);
        if G > 1 {
            // A token outside the sequence reads block 0, slot 0.
            let t = where_(ok, token, 0);
            let blk_first = load(blk_indptr + b);
            let blk = load(blk_indices + (blk_first + (t >> LOG_BS)), ok, 0);
            let slot = t & ((1 << LOG_BS) - 1);
            let base = ((blk as i64) * (num_kv_heads as i64) + (h as i64)) * (head_dim as i64);
            let cols = base * (1 << LOG_BS) + (slot as i64);
            l = group_logits::<G, RP, CH, CHUNK, LOG_BS>(k_t, dims, qs, row, r, cols);
            // Kept tokens of the staging ring (not read from the copy): the scoring's logits.
            let staged = expand(place > 0, 0, G);
            let heads = (row * G + arange(0, G)) * 32 - 1;
            let at = expand(heads, 1, CHUNK) + expand(place, 0, G);
            l = where_(staged, load(staged_logits + at, staged, 0.0), l);
        } else {
            let at = (first * num_kv_heads + h * n) as i64 + (token as i64);
            l = expand(load(scores + at, ok, 0.0), 0, G);
        }
        let w = exp2((l - expand(top, 1, CHUNK)) * 1.4426950408889634);
        let part = sum(where_(expand(place >= 0, 0, G), w, 0.0), 1);
        store(mass + ((row * max_chunks + chunk) * G + arange(0, G)), part);
    }
}

/// Step 5 for one row: each of the group's heads' `alpha` (`alpha[row * G + g]`: the
/// approximate softmax's mass on the kept tokens, the chunks' numerators from
/// [`sparq_mass`] over the normaliser from the tiles' statistics; exactly 1 when every
/// token is kept) and the row's mean of V (`v_mean[row]`, f16: `v_sum[row] / len`).
/// `tiles_per_row` tiles of `tile` tokens (`ceil(len / tile)` of them the row's),
/// `max_chunks` chunks of `chunk` kept tokens (`ceil(kept / chunk)` the row's). Grid:
/// `batch * num_kv_heads`.
#[kernel(crate = "crate::dusk_paths", num_warps = 4)]
#[allow(clippy::too_many_arguments)]
pub fn sparq_alpha<const D: usize, const G: usize, const BLOCK: usize>(
    stat_max: Ptr<f32>,
    stat_sum: Ptr<f32>,
    mass: Ptr<f32>,
    tok_indptr: Ptr<i32>,
    sel_item_indptr: Ptr<i32>,
    v_sum: Ptr<f32>,
    alpha: Ptr<f32>,
    v_mean: Ptr<f16>,
    num_kv_heads: i32,
    tiles_per_row: i32,
    tile: i32,
    max_chunks: i32,
    chunk: i32,
) {
    let row = program_id(0);
    let b = row / num_kv_heads;
    let n = load(tok_indptr + (b + 1)) - load(tok_indptr + b);
    let tiles = (n + tile - 1) / tile;
    let heads = arange(0, G);
    let top = row_max::<G, BLOCK>(stat_max, row, tiles, tiles_per_row);
    let mut total = zeros::<f32>([G]);
    for t0 in (0..tiles).step_by(BLOCK) {
        let t = t0 + arange(0, BLOCK);
        let ok = expand(t < tiles, 1, G);
        let at = expand((row * tiles_per_row + t) * G, 1, G) + expand(heads, 0, BLOCK);
        let m = load(stat_max + at, ok, 0.0);
        let e = load(stat_sum + at, ok, 0.0);
        let w = e * exp2((m - expand(top, 0, BLOCK)) * 1.4426950408889634);
        total = total + sum(where_(ok, w, 0.0), 0);
    }
    let kept = load(sel_item_indptr + (row + 1)) - load(sel_item_indptr + row);
    let chunks = (kept + chunk - 1) / chunk;
    let mut numer = zeros::<f32>([G]);
    for c0 in (0..chunks).step_by(BLOCK) {
        let c = c0 + arange(0, BLOCK);
        let ok = expand(c < chunks, 1, G);
        let at = expand((row * max_chunks + c) * G, 1, G) + expand(heads, 0, BLOCK);
        numer = numer + sum(load(mass + at, ok, 0.0), 0);
    }
    let everything = splat(kept >= n, [G]);
    store(
        alpha + (row * G + heads),
        where_(everything, 1.0, numer / total),
    );
    let vrow = (row as i64) * D + (arange(0, D) as i64);
    store(v_mean + vrow, (load(v_sum + vrow) / (n as f32)) as f16);
}
