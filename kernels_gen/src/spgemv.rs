//! `spgemv_quant`: estimated attention logits `q . dequant(k_i)` over each row's candidate
//! tokens, reading the 4- or 8-bit copy of K (Twilight Section 4.2, Appendix B.1).
//!
//! Candidates are CSR lists of token positions per (batch, KV head). With GQA the program of a
//! KV head reads each packed key once and scores it for all `group` query heads. Since
//! `dequant(k) = code * scale + zero`, the score is `scale * (q . code) + zero * sum(q)`.
//!
//! `q . code` runs on the integer units: a small first kernel ([`spgemv_prepare_q`]) rounds
//! each query row to 15-bit fixed point (`q ~ q16 * qscale`, |q16| <= 32767, a relative
//! error near 1.5e-5) and packs pairs of `q16` to match the codes' byte order; the scoring
//! kernel then does two multiply-adds per `dp2a` instruction, exactly, in i32. This moves the
//! work per 4-bit code from about five float instructions to under one. For GQA groups of 2
//! to 8 with 4-bit codes, [`spgemv_quant_mma_tiles`] scores on the tensor cores instead, by
//! default: each program walks 16 tiles of 64 candidates, every step loading the next
//! tile's page entries, scales and zeros and prefetching its codes into L2 while this
//! tile's codes are scored, so the chain position -> page -> codes is paid once a program
//! and each step waits on L2 ([`spgemv_quant_mma`] is its one-tile form).
//!
//! All are written in the kernel language (`#[kernel]`); the scorers share the candidate ->
//! page -> key row addressing (the helpers `key_rows` and `page_rows`) and the code loads
//! (`key_codes`), which they inline.
//! [`build`] picks the constant-generic specialisation for a [`SpgemvConfig`].
//!
//! The quantized copy is head-major (see [`crate::quantize`]): the codes of one KV head's
//! page are one contiguous block (`page_size` rows; 1 KiB at head_dim 128 and 4 bits) and
//! its scales and zeros a run of `page_size` f16. Candidates come a page at a time for each
//! KV head (Twilight's page selection), so a tile reads whole blocks even when the pages
//! differ between KV heads; in the engine's token-major layout each row would be a separate
//! 64-byte piece `num_kv_heads` rows away from the next token's.
//!
//! Output layout: the candidate CSR row `r` with `n` candidates starting at `start` writes
//! query head `g` of its group at `scores[start * group + g * n + j]`, so each
//! (batch, query head) row of scores is contiguous.

use dusk_compiler::{CompileError, Kernel};
use dusk_macros::kernel;

/// Compile-time choices of `spgemv_quant`. Each is a constant of the kernel; the
/// combinations compiled into this crate ([`specialised`]) are, for pages of 16 tokens: the
/// defaults ([`SpgemvConfig::new`]) for head_dim 64, 128 and 256, 4 and 8 bits and groups of
/// 1 to 16 (and [`SpgemvConfig::dp2a`] where the default is the tensor cores, and the tilings
/// [`SpgemvConfig::fit_grid`] turns it into); for head_dim 128 and 4-bit codes, the tilings
/// the benchmark sweeps (`benches/src/bin/gpu_check/spgemv.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SpgemvConfig {
    pub head_dim: usize,
    pub page_size: usize,
    /// Query heads per KV head.
    pub group: usize,
    pub bits: u32,
    /// Candidate tokens per program.
    pub block_tokens: usize,
    pub num_warps: u32,
    /// Occupancy floor passed to ptxas (0: none).
    pub min_programs_per_sm: u32,
    /// Score on the tensor cores (`mma`, q in f16, exact products) instead of `dp2a` (q in
    /// 15-bit fixed point). Needs 4-bit codes and a group of 2 to 8 query heads.
    pub tensor_cores: bool,
    /// Tiles of `block_tokens` candidates a program scores one after the other (1: one,
    /// [`spgemv_quant_mma`]; more: [`spgemv_quant_mma_tiles`], tensor cores only), each
    /// step fetching the next tile's key rows, scales and zeros ahead of this one's dot; the
    /// grid's second axis is `ceil(max_row_len / (block_tokens * tiles))`.
    pub tiles: usize,
    /// With `tiles` > 1: the next tile's codes brought into L2 a step early
    /// (`prefetch_l2`, no registers held), so each step's code loads wait on L2, not DRAM.
    pub l2_prefetch: bool,
}

impl SpgemvConfig {
    /// The defaults, from the tilings swept on an H100 (GQA 32/8 and MHA 32/32, 32k context,
    /// batch 32; benches/NOTES.md lists the others): for 4-bit codes and groups of 2 to 8
    /// query heads, the tensor cores, 16 tiles of 64 tokens a program on 4 warps with the
    /// next tile's codes prefetched into L2 ([`spgemv_quant_mma_tiles`]; measured at
    /// head_dim 128, the same tiling for 64 and 256); otherwise [`SpgemvConfig::dp2a`].
    pub fn new(head_dim: usize, page_size: usize, group: usize, bits: u32) -> Self {
        if bits == 4 && (2..=8).contains(&group) {
            SpgemvConfig {
                num_warps: 4,
                min_programs_per_sm: 0,
                tensor_cores: true,
                tiles: 16,
                l2_prefetch: true,
                ..Self::dp2a(head_dim, page_size, group, bits)
            }
        } else {
            Self::dp2a(head_dim, page_size, group, bits)
        }
    }

    /// The default on `dp2a` (the tensor cores off): 64 tokens per program on 2 warps, one
    /// tile, with 14 programs per SM asked of ptxas where that leaves enough registers
    /// (4-bit codes, head_dim up to 128 and groups of 1 or 16; wider rows would spill).
    pub fn dp2a(head_dim: usize, page_size: usize, group: usize, bits: u32) -> Self {
        let occupancy = bits == 4 && head_dim <= 128 && !(2..=8).contains(&group);
        SpgemvConfig {
            head_dim,
            page_size,
            group,
            bits,
            block_tokens: 64,
            num_warps: 2,
            min_programs_per_sm: if occupancy { 14 } else { 0 },
            tensor_cores: false,
            tiles: 1,
            l2_prefetch: false,
        }
    }

    /// The default's tiles fitted to a grid of `rows` candidate rows of at most `longest`
    /// candidates on a GPU of `sms` multiprocessors: the most tiles a program (16, then 8)
    /// that still leave half a wave of programs (4 an SM), else one tile of 64 tokens on 2
    /// warps ([`spgemv_quant_mma`]), so that short or few rows still fill the GPU. Measured
    /// on an H100 (benches/NOTES.md), each choice the fastest of its shape: 16 tiles at
    /// batch 32 and 32k (8192 programs for all tokens, 2048 for a quarter of the pages) and
    /// at batch 1 and 131k (1024), 8 tiles at batch 8 and 8k (1024), one tile for a quarter
    /// of those pages (2048; 16 tiles would leave 128 programs). Configurations other than
    /// the several-tile default are returned as they are.
    pub fn fit_grid(self, rows: usize, longest: usize, sms: usize) -> Self {
        if !self.tensor_cores || self.tiles == 1 {
            return self;
        }
        let programs = |c: &SpgemvConfig| rows * longest.div_ceil(c.program_tokens()).max(1);
        let mut c = self;
        while c.tiles > 8 && programs(&c) < 4 * sms {
            c.tiles /= 2;
        }
        if programs(&c) >= 4 * sms {
            return c;
        }
        SpgemvConfig {
            num_warps: 2,
            tiles: 1,
            l2_prefetch: false,
            ..self
        }
    }

    /// Candidate tokens one program scores: `block_tokens * tiles`.
    pub fn program_tokens(&self) -> usize {
        self.block_tokens * self.tiles
    }
}

/// Words of packed `q16` pairs per query row: `parts * words`, see [`spgemv_prepare_q`].
pub fn q_parts(bits: u32) -> usize {
    if bits == 4 {
        4
    } else {
        2
    }
}

/// 32-bit words of codes per K row (one token, one KV head).
pub fn words_per_row(head_dim: usize, bits: u32) -> usize {
    head_dim * bits as usize / 32
}

/// The query preparation kernel: each program rounds one query row (`D` values) to 15-bit
/// fixed point, `q ~ q16 * qscale` with |q16| <= 32767 (round half away from zero), and packs
/// pairs of `q16` into i32 words in the order the codes' bytes meet them in `dp2a`: part
/// `p` of `16 / BITS` holds, for each code word, elements `e0 = (p % 2) * (16 / BITS) +
/// p / 2` and `e0 + 8 / BITS` of the word's `32 / BITS`. Parameters: `q` (f16
/// `[rows, head_dim]`), `qpack` (i32 `[rows, parts, words]`), `qscale`, `qsum` (f32
/// `[rows]`). Grid: `rows`. `sum(code * q16)` stays inside i32 even for 8-bit codes and
/// head_dim 256: 255 * 32767 * 256 < 2^31.
#[kernel(crate = "crate::dusk_paths", num_warps = 1)]
pub fn spgemv_prepare_q<const D: usize, const BITS: usize>(
    q: Ptr<f16>,
    qpack: Ptr<i32>,
    qscale: Ptr<f32>,
    qsum: Ptr<f32>,
) {
    let words = D * BITS / 32;
    let parts = 16 / BITS;
    let row = program_id(0);
    let qrow = q + (row as i64) * D;
    let qv = load(qrow + arange(0, D)) as f32;
    let m = max(abs(qv), 0);
    let s = sum(qv, 0);
    let scale = m / 32767.0;
    let live = m > 0.0;
    let inv = where_(live, 32767.0 / where_(live, m, 1.0), 0.0);
    store(qscale + row, scale);
    store(qsum + row, s);
    #[unroll]
    for part in 0..parts {
        let e0 = part % 2 * (16 / BITS) + part / 2;
        let j = arange(0, words);
        let first = j * (32 / BITS);
        let lo = q16(load(qrow + (first + e0)) as f32, inv);
        let hi = q16(load(qrow + (first + (e0 + 8 / BITS))) as f32, inv);
        let word = (lo & 0xFFFF) | (hi << 16);
        store(qpack + (row * (parts * words) + part * words + j), word);
    }
}

/// `x * inv` rounded half away from zero to an integer.
#[kernel(crate = "crate::dusk_paths")]
fn q16(x: Block<f32>, inv: f32) -> Block<i32> {
    let x = x * inv;
    (x + where_(x < 0.0, -0.5, 0.5)) as i32
}

/// The candidate row of program `program_id(0)` (one a (sequence, KV head)): its sequence,
/// its KV head, where its candidates start in `cand_indices`, and how many there are.
#[kernel(crate = "crate::dusk_paths")]
fn candidate_row(cand_indptr: Ptr<i32>, num_kv_heads: i32) -> (i32, i32, i32, i32) {
    let row = program_id(0);
    let batch = row / num_kv_heads;
    let head = row % num_kv_heads;
    let start = load(cand_indptr + row);
    (batch, head, start, load(cand_indptr + (row + 1)) - start)
}

/// The tile of `TOKENS` candidates from `t0` of a candidate row ([`candidate_row`]): their
/// indices `j` in the row, which are in it, and their keys' scales, zeros and codes.
#[kernel(crate = "crate::dusk_paths")]
#[allow(clippy::too_many_arguments)]
fn tile_keys<const D: usize, const PAGE: usize, const BITS: usize, const TOKENS: usize>(
    k_packed: Ptr<u8>,
    k_scale: Ptr<f16>,
    k_zero: Ptr<f16>,
    kv_indptr: Ptr<i32>,
    kv_page_indices: Ptr<i32>,
    cand_indices: Ptr<i32>,
    batch: i32,
    head: i32,
    start: i32,
    n: i32,
    t0: i32,
    num_kv_heads: i32,
) -> (Block<i32>, Block<bool>, Block<f32>, Block<f32>, Block<i32>) {
    let j = t0 + arange(0, TOKENS);
    let valid = j < n;
    let krow = key_rows::<PAGE>(
        cand_indices,
        kv_indptr,
        kv_page_indices,
        batch,
        head,
        start,
        j,
        valid,
        num_kv_heads,
    );
    let scale = load(k_scale + krow, valid) as f32;
    let zero = load(k_zero + krow, valid) as f32;
    (
        j,
        valid,
        scale,
        zero,
        key_codes::<D, BITS, TOKENS>(k_packed, krow, valid),
    )
}

/// The key row of the quantized copy (head-major: `(page * num_kv_heads + head) * PAGE +
/// slot`) of each candidate `start + j` of a row: candidate -> token position -> the
/// sequence's page -> the physical page ([`page_rows`]).
#[kernel(crate = "crate::dusk_paths")]
#[allow(clippy::too_many_arguments)]
fn key_rows<const PAGE: usize>(
    cand_indices: Ptr<i32>,
    kv_indptr: Ptr<i32>,
    kv_page_indices: Ptr<i32>,
    batch: i32,
    head: i32,
    start: i32,
    j: Block<i32>,
    valid: Block<bool>,
    num_kv_heads: i32,
) -> Block<i64> {
    let pos = load(cand_indices + (start + j), valid, 0i32);
    let first_page = load(kv_indptr + batch);
    let end_page = load(kv_indptr + (batch + 1));
    page_rows::<PAGE>(
        kv_page_indices,
        first_page,
        end_page,
        head,
        pos,
        valid,
        num_kv_heads,
    )
}

/// The key rows of token positions `pos` of a sequence whose pages are
/// `kv_page_indices[first_page..end_page]`. Masked-off candidates read nothing and get a row
/// of page 0, and so does a position outside the sequence's pages (negative, or past its
/// last page): lists a previous stage wrote on the device are not checked on the host, and
/// a bad position must give a wrong score, never a read outside the cache.
#[kernel(crate = "crate::dusk_paths")]
#[allow(clippy::too_many_arguments)]
fn page_rows<const PAGE: usize>(
    kv_page_indices: Ptr<i32>,
    first_page: i32,
    end_page: i32,
    head: i32,
    pos: Block<i32>,
    valid: Block<bool>,
    num_kv_heads: i32,
) -> Block<i64> {
    let zero = 0i32;
    let ps = PAGE as i32;
    let page_in_seq = pos / ps;
    let slot = pos % ps;
    // Device-written positions are checked here: one outside the sequence's pages reads
    // no page id and gets page 0's row (slot 0 when negative).
    let ok = valid & (pos >= 0) & (first_page + page_in_seq < end_page);
    let page = load(kv_page_indices + (first_page + page_in_seq), ok, zero);
    let slot = where_(pos >= 0, slot, zero);
    // The first row of the (page, head) block, then the slot. This order of the arithmetic
    // matters to ptxas: others spill the 14-programs-per-SM `dp2a` tilings (on sm_80 or
    // sm_90a) or cost the tensor-core kernels registers (kernels_gen/tests/ptxas.rs).
    let heads = num_kv_heads as i64;
    let first = (page as i64) * (heads * PAGE) + (head as i64) * PAGE;
    first + (slot as i64)
}

/// The packed codes of key rows `krow` as 32-bit words, `[TOKENS, D * BITS / 32]`: 16
/// bytes a thread.
#[kernel(crate = "crate::dusk_paths")]
fn key_codes<const D: usize, const BITS: usize, const TOKENS: usize>(
    k_packed: Ptr<u8>,
    krow: Block<i64>,
    valid: Block<bool>,
) -> Block<i32> {
    let words = D * BITS / 32;
    let kbase = krow * words;
    let cols = arange(0, words) as i64;
    let offs = expand(kbase, 1, words) + expand(cols, 0, TOKENS);
    load(ptr_cast::<i32>(k_packed) + offs, expand(valid, 1, words))
}

/// Scores with `dp2a` against the fixed-point query from [`spgemv_prepare_q`], one query
/// head of the group at a time. Parameters: `qpack`, `qscale`, `qsum`; `k_packed` (u8
/// `[pages, kv_heads, page_size, head_dim * bits / 8]`, head-major: one KV head's page is
/// one contiguous block), `k_scale`, `k_zero` (f16 `[pages, kv_heads, page_size]`), as
/// `quantize_k` writes them; `kv_indptr` (i32 `[batch + 1]`), `kv_page_indices`
/// (i32), `cand_indptr` (i32 `[batch * kv_heads + 1]`), `cand_indices` (i32 token
/// positions), `scores` (f32), `num_kv_heads`. Grid: `(batch * kv_heads,
/// ceil(max_row / TOKENS))`.
#[kernel(crate = "crate::dusk_paths", num_warps = WARPS, min_programs_per_sm = PROGRAMS)]
#[allow(clippy::too_many_arguments)]
pub fn spgemv_quant_dp2a<
    const D: usize,
    const PAGE: usize,
    const GROUP: usize,
    const BITS: usize,
    const TOKENS: usize,
    const WARPS: usize,
    const PROGRAMS: usize,
>(
    qpack: Ptr<i32>,
    qscale: Ptr<f32>,
    qsum: Ptr<f32>,
    k_packed: Ptr<u8>,
    k_scale: Ptr<f16>,
    k_zero: Ptr<f16>,
    kv_indptr: Ptr<i32>,
    kv_page_indices: Ptr<i32>,
    cand_indptr: Ptr<i32>,
    cand_indices: Ptr<i32>,
    scores: Ptr<f32>,
    num_kv_heads: i32,
) {
    let words = D * BITS / 32;
    let parts = 16 / BITS;
    let (batch, head, start, n) = candidate_row(cand_indptr, num_kv_heads);
    let t0 = program_id(1) * TOKENS;
    if t0 < n {
        let (j, valid, scale, zero, codes) = tile_keys::<D, PAGE, BITS, TOKENS>(
            k_packed,
            k_scale,
            k_zero,
            kv_indptr,
            kv_page_indices,
            cand_indices,
            batch,
            head,
            start,
            n,
            t0,
            num_kv_heads,
        );
        // 4 bits: the even elements' codes in the low nibbles, the odd ones' in the high.
        let mut lo = codes;
        let mut hi = codes;
        if BITS == 4 {
            let nibbles = 0x0F0F_0F0Fi32;
            lo = codes & nibbles;
            hi = (codes >> 4) & nibbles;
        }
        let hq = num_kv_heads * GROUP;
        #[unroll]
        for g in 0..GROUP {
            let qh = head * GROUP + g;
            let qrow = batch * hq + qh;
            let mut acc = zeros::<i32>([TOKENS, words]);
            // Part p of the packed query meets bytes 0-1 (even p) or 2-3 (odd p) of the low
            // (p < 2) or high codes.
            #[unroll]
            for p in 0..parts {
                let qi = qrow * (parts * words) + p * words + arange(0, words);
                let qv = load(qpack + qi);
                acc = dp2a(
                    expand(qv, 0, TOKENS),
                    if p < 2 { lo } else { hi },
                    acc,
                    p % 2 == 1,
                );
            }
            let dot = sum(acc, 1) as f32;
            let qs = load(qscale + qrow);
            let qt = load(qsum + qrow);
            let s = dot * (scale * qs) + zero * qt;
            store(scores + (start * GROUP + n * g + j), s, valid);
        }
    }
}

/// Scores all query heads of the group at once on the tensor cores: the group's q rows
/// (f16, padded to 8 with zeros) are the B operand of `dot_int4`, which needs 4-bit codes,
/// a group of 2 to 8 and `TOKENS` a multiple of 16 per warp. Parameters: `q` (f16
/// `[batch, q_heads, head_dim]`), then as [`spgemv_quant_dp2a`] from `k_packed` on.
#[kernel(crate = "crate::dusk_paths", num_warps = WARPS, min_programs_per_sm = PROGRAMS)]
#[allow(clippy::too_many_arguments)]
pub fn spgemv_quant_mma<
    const D: usize,
    const PAGE: usize,
    const GROUP: usize,
    const TOKENS: usize,
    const WARPS: usize,
    const PROGRAMS: usize,
>(
    q: Ptr<f16>,
    k_packed: Ptr<u8>,
    k_scale: Ptr<f16>,
    k_zero: Ptr<f16>,
    kv_indptr: Ptr<i32>,
    kv_page_indices: Ptr<i32>,
    cand_indptr: Ptr<i32>,
    cand_indices: Ptr<i32>,
    scores: Ptr<f32>,
    num_kv_heads: i32,
) {
    let (batch, head, start, n) = candidate_row(cand_indptr, num_kv_heads);
    let t0 = program_id(1) * TOKENS;
    if t0 < n {
        let (j, valid, scale, zero, codes) = tile_keys::<D, PAGE, 4, TOKENS>(
            k_packed,
            k_scale,
            k_zero,
            kv_indptr,
            kv_page_indices,
            cand_indices,
            batch,
            head,
            start,
            n,
            t0,
            num_kv_heads,
        );
        let heads = arange(0, 8);
        let group = GROUP as i32;
        let head_ok = heads < group;
        let qrow = batch * (num_kv_heads * GROUP) + head * GROUP;
        let rows = ((qrow + heads) as i64) * D;
        let dims = arange(0, D) as i64;
        let offs = expand(rows, 1, D) + expand(dims, 0, 8);
        let qv = load(q + offs, expand(head_ok, 1, D));
        let qsum = sum(qv as f32, 1);
        let dot = dot_int4(codes, qv);
        let scale = expand(scale, 1, 8);
        let zero = expand(zero, 1, 8);
        let qsum = expand(qsum, 0, TOKENS);
        let s = dot * scale + zero * qsum;
        // scores[start * GROUP + head * n + j]. The head indices are made afresh: the ones
        // above are spread like q's rows, these like the result's columns.
        let heads = arange(0, 8);
        let head_ok = heads < group;
        let jj = start * GROUP + j;
        let hn = heads * n;
        let oi = expand(jj, 1, 8) + expand(hn, 0, TOKENS);
        store(
            scores + oi,
            s,
            expand(valid, 1, 8) & expand(head_ok, 0, TOKENS),
        );
    }
}

/// [`spgemv_quant_mma`] over `TILES` consecutive tiles of `TOKENS` candidates a program,
/// software-pipelined without holding a second tile's codes: the group's q is loaded once,
/// and while a step's codes are in flight it loads the positions of the tile after next
/// and the next tile's page entries, scales and zeros (carried to the next step), so each
/// step waits on its codes alone rather than on the chain position -> page -> codes. With
/// `L2` the next tile's codes are also brought into L2 (`prefetch_l2`, no registers held).
/// Candidates past the row's end or past the program's `TILES * TOKENS` are masked off:
/// they read and write nothing. Parameters as [`spgemv_quant_mma`]. Grid: `(batch *
/// kv_heads, ceil(max_row / (TOKENS * TILES)))`.
#[kernel(crate = "crate::dusk_paths", num_warps = WARPS, min_programs_per_sm = PROGRAMS)]
#[allow(clippy::too_many_arguments)]
pub fn spgemv_quant_mma_tiles<
    const D: usize,
    const PAGE: usize,
    const GROUP: usize,
    const TOKENS: usize,
    const WARPS: usize,
    const PROGRAMS: usize,
    const TILES: usize,
    const L2: bool,
>(
    q: Ptr<f16>,
    k_packed: Ptr<u8>,
    k_scale: Ptr<f16>,
    k_zero: Ptr<f16>,
    kv_indptr: Ptr<i32>,
    kv_page_indices: Ptr<i32>,
    cand_indptr: Ptr<i32>,
    cand_indices: Ptr<i32>,
    scores: Ptr<f32>,
    num_kv_heads: i32,
) {
    let (batch, head, start, n) = candidate_row(cand_indptr, num_kv_heads);
    let t0 = program_id(1) * (TOKENS * TILES);
    if t0 < n {
        // This program's candidates are t0..end: `steps` tiles of them (1 to TILES).
        let end = minimum(n, t0 + TOKENS * TILES);
        let steps = (end - t0 + (TOKENS - 1)) / TOKENS;
        let first_page = load(kv_indptr + batch);
        let end_page = load(kv_indptr + (batch + 1));
        // Tile 0's key rows, scales and zeros and tile 1's positions; each step then loads
        // the next ones.
        let j = t0 + arange(0, TOKENS);
        let valid = j < end;
        let pos = load(cand_indices + (start + j), valid, 0i32);
        let j1 = j + TOKENS;
        let mut pos_next = load(cand_indices + (start + j1), j1 < end, 0i32);
        let mut krow = page_rows::<PAGE>(
            kv_page_indices,
            first_page,
            end_page,
            head,
            pos,
            valid,
            num_kv_heads,
        );
        let mut scale = load(k_scale + krow, valid);
        let mut zero = load(k_zero + krow, valid);
        let group = GROUP as i32;
        let heads = arange(0, 8);
        let head_ok = heads < group;
        let qrow = batch * (num_kv_heads * GROUP) + head * GROUP;
        let rows = ((qrow + heads) as i64) * D;
        let dims = arange(0, D) as i64;
        let offs = expand(rows, 1, D) + expand(dims, 0, 8);
        let qv = load(q + offs, expand(head_ok, 1, D));
        let qsum = expand(sum(qv as f32, 1), 0, TOKENS);
        for t in 0..steps {
            let j = t0 + t * TOKENS + arange(0, TOKENS);
            let valid = j < end;
            let codes = key_codes::<D, 4, TOKENS>(k_packed, krow, valid);
            let j2 = j + 2 * TOKENS;
            let pos_after = load(cand_indices + (start + j2), j2 < end, 0i32);
            let jn = j + TOKENS;
            let valid_n = jn < end;
            let krow_n = page_rows::<PAGE>(
                kv_page_indices,
                first_page,
                end_page,
                head,
                pos_next,
                valid_n,
                num_kv_heads,
            );
            let scale_n = load(k_scale + krow_n, valid_n);
            let zero_n = load(k_zero + krow_n, valid_n);
            if L2 {
                // The 128-byte line of each next row's codes (rows of D / 2 bytes; a page's
                // block of 16 rows is whole lines, so the line lies inside the cache).
                let line_rows = 256 / D;
                let first = krow_n - krow_n % line_rows;
                prefetch_l2(ptr_cast::<i32>(k_packed) + first * (D / 8), 128, valid_n);
            }
            let dot = dot_int4(codes, qv);
            let s = dot * expand(scale as f32, 1, 8) + expand(zero as f32, 1, 8) * qsum;
            // scores[start * GROUP + head * n + j], as in `spgemv_quant_mma`.
            let heads = arange(0, 8);
            let head_ok = heads < group;
            let jj = start * GROUP + j;
            let hn = heads * n;
            let oi = expand(jj, 1, 8) + expand(hn, 0, TOKENS);
            store(
                scores + oi,
                s,
                expand(valid, 1, 8) & expand(head_ok, 0, TOKENS),
            );
            krow = krow_n;
            scale = scale_n;
            zero = zero_n;
            pos_next = pos_after;
        }
    }
}

/// The preparation kernel for `cfg`'s head_dim (64, 128 or 256) and bits (4 or 8).
pub fn build_prepare_q(cfg: &SpgemvConfig) -> Result<Kernel, CompileError> {
    match (cfg.head_dim, cfg.bits) {
        (64, 4) => spgemv_prepare_q::build::<64, 4>(),
        (128, 4) => spgemv_prepare_q::build::<128, 4>(),
        (256, 4) => spgemv_prepare_q::build::<256, 4>(),
        (64, 8) => spgemv_prepare_q::build::<64, 8>(),
        (128, 8) => spgemv_prepare_q::build::<128, 8>(),
        (256, 8) => spgemv_prepare_q::build::<256, 8>(),
        _ => Err(unsupported("spgemv_prepare_q", cfg)),
    }
}

/// The scoring kernel for `cfg`: [`spgemv_quant_mma`] with `tensor_cores`, else
/// [`spgemv_quant_dp2a`]; an error when `cfg` is not [`specialised`].
pub fn build(cfg: &SpgemvConfig) -> Result<Kernel, CompileError> {
    match specialisation(cfg) {
        Some(build) => build(),
        None => Err(unsupported("spgemv_quant", cfg)),
    }
}

/// Whether this crate holds the scoring kernel for `cfg` (see [`SpgemvConfig`]).
pub fn specialised(cfg: &SpgemvConfig) -> bool {
    specialisation(cfg).is_some()
}

fn unsupported(kernel: &str, cfg: &SpgemvConfig) -> CompileError {
    CompileError::Build {
        kernel: kernel.into(),
        op: "build".into(),
        loc: String::new(),
        msg: format!("no specialisation for {cfg:?} (see `SpgemvConfig`)"),
    }
}

type Build = fn() -> Result<Kernel, CompileError>;

/// The table of specialisations: `dp2a` lines are (head_dim, bits; tokens, warps, programs
/// per SM; groups), `mma` lines (head_dim; tokens, warps, programs per SM; groups). Pages
/// hold 16 tokens.
macro_rules! specialisations {
    (
        dp2a: [$(($d:literal, $b:literal; $t:literal, $w:literal, $o:literal; $($g:literal)*)),* $(,)?],
        mma: [$(($md:literal; $mt:literal, $mw:literal, $mo:literal; $($mg:literal)*)),* $(,)?],
        mma_tiles: [$(($xd:literal; $xt:literal, $xw:literal, $xo:literal, $xx:literal, $xl:literal; $($xg:literal)*)),* $(,)?] $(,)?
    ) => {
        fn specialisation(cfg: &SpgemvConfig) -> Option<Build> {
            if cfg.page_size != 16 {
                return None;
            }
            let c = cfg;
            Some(match (c.tensor_cores, c.head_dim, c.bits, c.group, c.block_tokens, c.num_warps, c.min_programs_per_sm, c.tiles, c.l2_prefetch) {
                $($((false, $d, $b, $g, $t, $w, $o, 1, false) => spgemv_quant_dp2a::build::<$d, 16, $g, $b, $t, $w, $o> as Build,)*)*
                $($((true, $md, 4, $mg, $mt, $mw, $mo, 1, false) => spgemv_quant_mma::build::<$md, 16, $mg, $mt, $mw, $mo> as Build,)*)*
                $($((true, $xd, 4, $xg, $xt, $xw, $xo, $xx, $xl) => spgemv_quant_mma_tiles::build::<$xd, 16, $xg, $xt, $xw, $xo, $xx, $xl> as Build,)*)*
                _ => return None,
            })
        }

        /// Every configuration this crate holds a scoring kernel for (the rows of the
        /// specialisation table): the config space the tuner searches.
        pub fn specialised_configs() -> Vec<SpgemvConfig> {
            vec![
                $($(SpgemvConfig {
                    head_dim: $d, page_size: 16, group: $g, bits: $b, block_tokens: $t,
                    num_warps: $w, min_programs_per_sm: $o, tensor_cores: false, tiles: 1,
                    l2_prefetch: false,
                },)*)*
                $($(SpgemvConfig {
                    head_dim: $md, page_size: 16, group: $mg, bits: 4, block_tokens: $mt,
                    num_warps: $mw, min_programs_per_sm: $mo, tensor_cores: true, tiles: 1,
                    l2_prefetch: false,
                },)*)*
                $($(SpgemvConfig {
                    head_dim: $xd, page_size: 16, group: $xg, bits: 4, block_tokens: $xt,
                    num_warps: $xw, min_programs_per_sm: $xo, tensor_cores: true, tiles: $xx,
                    l2_prefetch: $xl,
                },)*)*
            ]
        }
    };
}

specialisations! {
    dp2a: [
        // The defaults ([`SpgemvConfig::dp2a`]; for groups of 2 to 8 with 4-bit codes, the
        // tensor cores turned off).
        (64, 4; 64, 2, 14; 1 16),
        (64, 4; 64, 2, 0; 2 4 8),
        (128, 4; 64, 2, 14; 1 16),
        (128, 4; 64, 2, 0; 2 4 8),
        (256, 4; 64, 2, 0; 1 2 4 8 16),
        (64, 8; 64, 2, 0; 1 2 4 8 16),
        (128, 8; 64, 2, 0; 1 2 4 8 16),
        (256, 8; 64, 2, 0; 1 2 4 8 16),
        // The benchmark's other tilings, and its `--profile 64x4` case (GQA 32/8).
        (128, 4; 64, 2, 14; 2 4 8),
        (128, 4; 64, 4, 0; 4),
        (128, 4; 32, 1, 0; 1 2 4 8 16),
        (128, 4; 128, 4, 6; 1 2 4 8 16),
    ],
    // One tile a program (the default on the smallest grids, `SpgemvConfig::fit_grid`), and
    // the benchmark's other tilings.
    mma: [
        (64; 64, 2, 0; 2 4 8),
        (128; 64, 2, 0; 2 4 8),
        (256; 64, 2, 0; 2 4 8),
        (128; 128, 4, 0; 2 4 8),
        (128; 64, 4, 0; 2 4 8),
    ],
    // Several tiles a program: the defaults (16 tiles, 8 on small grids:
    // `SpgemvConfig::fit_grid`), then the benchmark's other tilings.
    mma_tiles: [
        (64; 64, 4, 0, 16, true; 2 4 8),
        (128; 64, 4, 0, 16, true; 2 4 8),
        (256; 64, 4, 0, 16, true; 2 4 8),
        (64; 64, 4, 0, 8, true; 2 4 8),
        (128; 64, 4, 0, 8, true; 2 4 8),
        (256; 64, 4, 0, 8, true; 2 4 8),
        (128; 64, 4, 0, 32, true; 2 4 8),
        (128; 64, 4, 0, 16, false; 2 4 8),
        (128; 32, 2, 0, 16, true; 2 4 8),
    ],
}
