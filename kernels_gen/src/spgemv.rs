//! `spgemv_quant`: estimated attention logits `q . dequant(k_i)` over each row's candidate
//! tokens, reading the 4- or 8-bit copy of K (Twilight Section 4.2, Appendix B.1).
//!
//! Candidates are CSR lists of token positions per (batch, KV head). With GQA the program of a
//! KV head reads each packed key once and scores it for all `group` query heads. Since
//! `dequant(k) = code * scale + zero`, the score is `scale * (q . code) + zero * sum(q)`.
//!
//! `q . code` runs on the integer units: a small first kernel ([`build_prepare_q`]) rounds
//! each query row to 15-bit fixed point (`q ~ q16 * qscale`, |q16| <= 32767, a relative
//! error near 1.5e-5) and packs pairs of `q16` to match the codes' byte order; the scoring
//! kernel then does two multiply-adds per `dp2a` instruction, exactly, in i32. This moves the
//! work per 4-bit code from about five float instructions to under one.
//!
//! Output layout: the candidate CSR row `r` with `n` candidates starting at `start` writes
//! query head `g` of its group at `scores[start * group + g * n + j]`, so each
//! (batch, query head) row of scores is contiguous.

use dusk_compiler::{CompileError, DType, Kernel, KernelBuilder, Value};

/// Compile-time choices of `spgemv_quant`.
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
}

impl SpgemvConfig {
    /// The defaults, from the tilings swept on an H100 (GQA 32/8 and MHA 32/32, 32k context,
    /// batch 32; BENCHMARKS.md lists the others): 64 tokens per program on 2 warps; the tensor
    /// cores for 4-bit codes and groups of 2 to 8 query heads; otherwise `dp2a`, with 14
    /// programs per SM asked of ptxas where that leaves enough registers (4-bit codes,
    /// head_dim up to 128; wider rows would spill).
    pub fn new(head_dim: usize, page_size: usize, group: usize, bits: u32) -> Self {
        let tensor_cores = bits == 4 && (2..=8).contains(&group);
        SpgemvConfig {
            head_dim,
            page_size,
            group,
            bits,
            block_tokens: 64,
            num_warps: 2,
            min_programs_per_sm: if !tensor_cores && bits == 4 && head_dim <= 128 {
                14
            } else {
                0
            },
            tensor_cores,
        }
    }
}

/// Words of packed `q16` pairs per query row: `parts * words`, see [`build_prepare_q`].
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

/// The largest |q16|. `sum(code * q16)` stays inside i32 even for 8-bit codes and head_dim
/// 256: 255 * 32767 * 256 < 2^31.
const Q16_MAX: f32 = 32767.0;

/// Which two elements of the head each part's 16-bit pair holds, within a group of `stride`.
/// 4 bits: a code word holds elements `8j..8j+8`, low nibbles the even ones; 8 bits: `4j..4j+4`.
fn part_elements(bits: u32) -> (usize, Vec<(usize, usize)>) {
    if bits == 4 {
        (8, vec![(0, 2), (4, 6), (1, 3), (5, 7)])
    } else {
        (4, vec![(0, 1), (2, 3)])
    }
}

/// Builds the query preparation kernel. Parameters: `q` (f16 `[rows, head_dim]`), `qpack`
/// (i32 `[rows, parts, words]`), `qscale`, `qsum` (f32 `[rows]`). Grid: `rows`.
pub fn build_prepare_q(cfg: &SpgemvConfig) -> Result<Kernel, CompileError> {
    let name = format!("spgemv_prepare_q_d{}_b{}", cfg.head_dim, cfg.bits);
    let mut b = KernelBuilder::new(&name);
    b.set_num_warps(1);
    let q = b.param_ptr("q", DType::F16);
    let qpack = b.param_ptr("qpack", DType::I32);
    let qscale = b.param_ptr("qscale", DType::F32);
    let qsum = b.param_ptr("qsum", DType::F32);
    let d = cfg.head_dim;
    let row = b.program_id(0);
    let row64 = b.cast(row, DType::I64);
    let base = b.mul_c(row64, d as i64);
    let qrow = b.add_ptr(q, base);
    let offs = b.arange(0, d as i64);
    let p = b.add_ptr(qrow, offs);
    let qv = b.load(p);
    let qv = b.cast(qv, DType::F32);
    let mag = b.abs(qv);
    let m = b.max(mag, 0);
    let s = b.sum(qv, 0);
    let limit = b.f32(Q16_MAX);
    let scale = b.div(m, limit);
    let zero = b.f32(0.0);
    let one = b.f32(1.0);
    let live = b.gt(m, zero);
    let safe = b.select(live, m, one);
    let inv = b.div(limit, safe);
    let inv = b.select(live, inv, zero);
    let p = b.add_ptr(qscale, row);
    b.store(p, scale);
    let p = b.add_ptr(qsum, row);
    b.store(p, s);

    let (stride, parts) = part_elements(cfg.bits);
    let words = words_per_row(d, cfg.bits);
    let half = b.f32(0.5);
    let neg_half = b.f32(-0.5);
    for (pi, (e0, e1)) in parts.iter().enumerate() {
        let j = b.arange(0, words as i64);
        let first = b.mul_c(j, stride as i64);
        let fixed = |b: &mut KernelBuilder, e: usize| {
            let idx = b.add_c(first, e as i64);
            let p = b.add_ptr(qrow, idx);
            let x = b.load(p);
            let x = b.cast(x, DType::F32);
            let x = b.mul(x, inv);
            // Round half away from zero, then truncate.
            let neg = b.lt(x, zero);
            let bias = b.select(neg, neg_half, half);
            let x = b.add(x, bias);
            b.cast(x, DType::I32)
        };
        let lo = fixed(&mut b, *e0);
        let hi = fixed(&mut b, *e1);
        let mask = b.i32(0xFFFF);
        let lo = b.and(lo, mask);
        let sixteen = b.i32(16);
        let hi = b.shl(hi, sixteen);
        let word = b.or(lo, hi);
        let out = b.mul_c(row, (parts.len() * words) as i64);
        let out = b.add_c(out, (pi * words) as i64);
        let out = b.add(out, j);
        let p = b.add_ptr(qpack, out);
        b.store(p, word);
    }
    b.finish()
}

/// Builds the scoring kernel. Parameters, in order: the query, as `q` (f16
/// `[batch, q_heads, head_dim]`) with `tensor_cores`, else as `qpack`, `qscale`, `qsum` (from
/// [`build_prepare_q`]); then `k_packed` (u8 `[pages, page_size, kv_heads, head_dim * bits / 8]`),
/// `k_scale`, `k_zero` (f16 `[pages, page_size, kv_heads]`), `kv_indptr` (i32 `[batch + 1]`),
/// `kv_page_indices` (i32), `cand_indptr` (i32 `[batch * kv_heads + 1]`), `cand_indices` (i32
/// token positions), `scores` (f32), `num_kv_heads` (i32).
/// Grid: `(batch * kv_heads, ceil(max_row / block_tokens))`.
pub fn build(cfg: &SpgemvConfig) -> Result<Kernel, CompileError> {
    let name = format!(
        "spgemv_quant_d{}_p{}_g{}_b{}_t{}_w{}_o{}{}",
        cfg.head_dim,
        cfg.page_size,
        cfg.group,
        cfg.bits,
        cfg.block_tokens,
        cfg.num_warps,
        cfg.min_programs_per_sm,
        if cfg.tensor_cores { "_mma" } else { "" }
    );
    let mut b = KernelBuilder::new(&name);
    b.set_num_warps(cfg.num_warps);
    b.set_min_programs_per_sm(cfg.min_programs_per_sm);
    let query = if cfg.tensor_cores {
        Query::F16(b.param_ptr("q", DType::F16))
    } else {
        Query::Fixed {
            qpack: b.param_ptr("qpack", DType::I32),
            qscale: b.param_ptr("qscale", DType::F32),
            qsum: b.param_ptr("qsum", DType::F32),
        }
    };
    let k_packed = b.param_ptr("k_packed", DType::U8);
    let k_scale = b.param_ptr("k_scale", DType::F16);
    let k_zero = b.param_ptr("k_zero", DType::F16);
    let kv_indptr = b.param_ptr("kv_indptr", DType::I32);
    let kv_page_indices = b.param_ptr("kv_page_indices", DType::I32);
    let cand_indptr = b.param_ptr("cand_indptr", DType::I32);
    let cand_indices = b.param_ptr("cand_indices", DType::I32);
    let scores = b.param_ptr("scores", DType::F32);
    let num_kv_heads = b.param_scalar("num_kv_heads", DType::I32);

    let bt = cfg.block_tokens;
    let words = words_per_row(cfg.head_dim, cfg.bits);
    let row = b.program_id(0);
    let tile = b.program_id(1);
    let batch = b.div(row, num_kv_heads);
    let head = b.rem(row, num_kv_heads);
    let p = b.add_ptr(cand_indptr, row);
    let start = b.load(p);
    let row1 = b.add_c(row, 1);
    let p = b.add_ptr(cand_indptr, row1);
    let end = b.load(p);
    let n = b.sub(end, start);
    let t0 = b.mul_c(tile, bt as i64);
    let live = b.lt(t0, n);
    b.if_then(live, |b| {
        let j = b.arange(0, bt as i64);
        let j = b.add(t0, j);
        let valid = b.lt(j, n);
        let idx = b.add(start, j);
        let p = b.add_ptr(cand_indices, idx);
        let zero_i = b.i32(0);
        let pos = b.load_masked(p, Some(valid), Some(zero_i));

        // Token position to its physical slot through the page table.
        let p = b.add_ptr(kv_indptr, batch);
        let first_page = b.load(p);
        let c_ps = b.i32(cfg.page_size as i32);
        let page_in_seq = b.div(pos, c_ps);
        let slot = b.rem(pos, c_ps);
        let pi = b.add(first_page, page_in_seq);
        let p = b.add_ptr(kv_page_indices, pi);
        let page = b.load_masked(p, Some(valid), Some(zero_i));
        let page64 = b.cast(page, DType::I64);
        let tok = b.mul_c(page64, cfg.page_size as i64);
        let slot64 = b.cast(slot, DType::I64);
        let tok = b.add(tok, slot64);
        let hkv64 = b.cast(num_kv_heads, DType::I64);
        let head64 = b.cast(head, DType::I64);
        let krow = b.mul(tok, hkv64);
        let krow = b.add(krow, head64);

        let sp = b.add_ptr(k_scale, krow);
        let scale = b.load_masked(sp, Some(valid), None);
        let scale = b.cast(scale, DType::F32);
        let zp = b.add_ptr(k_zero, krow);
        let zero = b.load_masked(zp, Some(valid), None);
        let zero = b.cast(zero, DType::F32);

        // The codes as 32-bit words, 16 bytes a thread.
        let kbase = b.mul_c(krow, words as i64);
        let cols = b.arange(0, words as i64);
        let cols64 = b.cast(cols, DType::I64);
        let kbase2 = b.expand(kbase, 1, words);
        let cols2 = b.expand(cols64, 0, bt);
        let koffs = b.add(kbase2, cols2);
        let k_words = b.ptr_cast(k_packed, DType::I32);
        let kp = b.add_ptr(k_words, koffs);
        let mask2 = b.expand(valid, 1, words);
        let w = b.load_masked(kp, Some(mask2), None);
        let tile = Tile {
            batch,
            head,
            start,
            n,
            j,
            valid,
            scale,
            zero,
            words: w,
        };
        match query {
            Query::F16(q) => score_tensor_cores(b, cfg, &tile, q, scores, num_kv_heads),
            Query::Fixed {
                qpack,
                qscale,
                qsum,
            } => score_dp2a(b, cfg, &tile, [qpack, qscale, qsum], scores, num_kv_heads),
        }
    });
    b.finish()
}

/// How the scoring kernel receives the query.
#[derive(Clone, Copy)]
enum Query {
    F16(Value),
    Fixed {
        qpack: Value,
        qscale: Value,
        qsum: Value,
    },
}

/// What the shared prologue loaded for one tile of a candidate row.
struct Tile {
    batch: Value,
    head: Value,
    start: Value,
    n: Value,
    /// Candidate index within the row, its validity, and the codes' scale and zero.
    j: Value,
    valid: Value,
    scale: Value,
    zero: Value,
    /// The packed codes, `[block_tokens, words]` i32.
    words: Value,
}

/// Scores with `dp2a` against the fixed-point query, one query head of the group at a time.
fn score_dp2a(
    b: &mut KernelBuilder,
    cfg: &SpgemvConfig,
    t: &Tile,
    q: [Value; 3],
    scores: Value,
    num_kv_heads: Value,
) {
    let [qpack, qscale, qsum] = q;
    let (bt, g) = (cfg.block_tokens, cfg.group);
    let words = words_per_row(cfg.head_dim, cfg.bits);
    let parts = q_parts(cfg.bits);
    // (codes, q part, high bytes) for each dp2a.
    let steps: Vec<(Value, usize, bool)> = if cfg.bits == 4 {
        let nib = b.i32(0x0F0F_0F0F);
        let lo = b.and(t.words, nib);
        let four = b.i32(4);
        let hi = b.shr(t.words, four);
        let hi = b.and(hi, nib);
        vec![(lo, 0, false), (lo, 1, true), (hi, 2, false), (hi, 3, true)]
    } else {
        vec![(t.words, 0, false), (t.words, 1, true)]
    };
    let hq = b.mul_c(num_kv_heads, g as i64);
    for gi in 0..g {
        let qh = b.mul_c(t.head, g as i64);
        let qh = b.add_c(qh, gi as i64);
        let qrow = b.mul(t.batch, hq);
        let qrow = b.add(qrow, qh);
        let zero_acc = b.i32(0);
        let mut acc = b.splat(zero_acc, &[bt, words]);
        for (codes, part, high) in &steps {
            let base = b.mul_c(qrow, (parts * words) as i64);
            let base = b.add_c(base, (part * words) as i64);
            let wi = b.arange(0, words as i64);
            let qi = b.add(base, wi);
            let qp = b.add_ptr(qpack, qi);
            let qv = b.load(qp);
            let q2 = b.expand(qv, 0, bt);
            acc = b.dp2a(q2, *codes, acc, *high);
        }
        let dot = b.sum(acc, 1);
        let dot = b.cast(dot, DType::F32);
        let p = b.add_ptr(qscale, qrow);
        let qs = b.load(p);
        let p = b.add_ptr(qsum, qrow);
        let qt = b.load(p);
        let step = b.mul(t.scale, qs);
        let s = b.mul(dot, step);
        let zq = b.mul(t.zero, qt);
        let s = b.add(s, zq);
        // scores[start * g + gi * n + j]
        let base = b.mul_c(t.start, g as i64);
        let gn = b.mul_c(t.n, gi as i64);
        let base = b.add(base, gn);
        let oi = b.add(base, t.j);
        let op = b.add_ptr(scores, oi);
        b.store_masked(op, s, Some(t.valid));
    }
}

/// Scores all query heads of the group at once on the tensor cores: the group's q rows
/// (padded to 8 with zeros) are the B operand of `dot_int4`.
fn score_tensor_cores(
    b: &mut KernelBuilder,
    cfg: &SpgemvConfig,
    t: &Tile,
    q: Value,
    scores: Value,
    num_kv_heads: Value,
) {
    let (bt, g, d) = (cfg.block_tokens, cfg.group, cfg.head_dim);
    let heads = b.arange(0, 8);
    let group = b.i32(g as i32);
    let head_ok = b.lt(heads, group);
    let hq = b.mul_c(num_kv_heads, g as i64);
    let qrow = b.mul(t.batch, hq);
    let first = b.mul_c(t.head, g as i64);
    let qrow = b.add(qrow, first);
    let rows = b.add(qrow, heads);
    let rows = b.cast(rows, DType::I64);
    let rows = b.mul_c(rows, d as i64);
    let dims = b.arange(0, d as i64);
    let dims = b.cast(dims, DType::I64);
    let rows2 = b.expand(rows, 1, d);
    let dims2 = b.expand(dims, 0, 8);
    let offs = b.add(rows2, dims2);
    let qp = b.add_ptr(q, offs);
    let qmask = b.expand(head_ok, 1, d);
    let qv = b.load_masked(qp, Some(qmask), None);
    let qf = b.cast(qv, DType::F32);
    let qsum = b.sum(qf, 1);
    let dot = b.dot_int4(t.words, qv);
    let scale = b.expand(t.scale, 1, 8);
    let zero = b.expand(t.zero, 1, 8);
    let qsum = b.expand(qsum, 0, bt);
    let s = b.mul(dot, scale);
    let zq = b.mul(zero, qsum);
    let s = b.add(s, zq);
    // scores[start * g + head * n + j]. The head indices are made afresh: the ones above are
    // spread like q's rows, these like the result's columns.
    let heads = b.arange(0, 8);
    let head_ok = b.lt(heads, group);
    let base = b.mul_c(t.start, g as i64);
    let jj = b.add(base, t.j);
    let hn = b.mul(heads, t.n);
    let jj = b.expand(jj, 1, 8);
    let hn = b.expand(hn, 0, bt);
    let oi = b.add(jj, hn);
    let op = b.add_ptr(scores, oi);
    let v2 = b.expand(t.valid, 1, 8);
    let h2 = b.expand(head_ok, 0, bt);
    let m = b.and(v2, h2);
    b.store_masked(op, s, Some(m));
}
