//! `spgemv_quant`: estimated attention logits `q . dequant(k_i)` over each row's candidate
//! tokens, reading the 4- or 8-bit copy of K (Twilight Section 4.2, Appendix B.1).
//!
//! Candidates are CSR lists of token positions per (batch, KV head). With GQA the program of a
//! KV head reads each packed key once and scores it for all `group` query heads. Since
//! `dequant(k) = code * scale + zero`, the score is `scale * (q . code) + zero * sum(q)`.
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
}

impl SpgemvConfig {
    pub fn new(head_dim: usize, page_size: usize, group: usize, bits: u32) -> Self {
        SpgemvConfig {
            head_dim,
            page_size,
            group,
            bits,
            block_tokens: 64,
            num_warps: 4,
        }
    }
}

/// Builds the kernel. Parameters, in order: `q` (f16 `[batch, q_heads, head_dim]`),
/// `k_packed` (u8 `[pages, page_size, kv_heads, head_dim * bits / 8]`), `k_scale`, `k_zero`
/// (f16 `[pages, page_size, kv_heads]`), `kv_indptr` (i32 `[batch + 1]`), `kv_page_indices`
/// (i32), `cand_indptr` (i32 `[batch * kv_heads + 1]`), `cand_indices` (i32 token positions),
/// `scores` (f32), `num_kv_heads` (i32). Grid: `(batch * kv_heads, ceil(max_row / block_tokens))`.
pub fn build(cfg: &SpgemvConfig) -> Result<Kernel, CompileError> {
    let name = format!(
        "spgemv_quant_d{}_p{}_g{}_b{}",
        cfg.head_dim, cfg.page_size, cfg.group, cfg.bits
    );
    let mut b = KernelBuilder::new(&name);
    b.set_num_warps(cfg.num_warps);
    let q = b.param_ptr("q", DType::F16);
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
    let g = cfg.group;
    let d = cfg.head_dim;
    let row = b.program_id(0);
    let tile = b.program_id(1);
    let batch = b.div(row, num_kv_heads);
    let head = b.rem(row, num_kv_heads);
    let p = b.add_ptr(cand_indptr, row);
    let start = b.load(p);
    let one = b.i32(1);
    let row1 = b.add(row, one);
    let p = b.add_ptr(cand_indptr, row1);
    let end = b.load(p);
    let n = b.sub(end, start);
    let c_bt = b.i32(bt as i32);
    let t0 = b.mul(tile, c_bt);
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
        let c_ps64 = b.i64(cfg.page_size as i64);
        let tok = b.mul(page64, c_ps64);
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

        let bytes = d * cfg.bits as usize / 8;
        let c_bytes = b.i64(bytes as i64);
        let kbase = b.mul(krow, c_bytes);
        let cols = b.arange(0, bytes as i64);
        let cols64 = b.cast(cols, DType::I64);
        let kbase2 = b.expand(kbase, 1, bytes);
        let cols2 = b.expand(cols64, 0, bt);
        let koffs = b.add(kbase2, cols2);
        let kp = b.add_ptr(k_packed, koffs);
        let mask2 = b.expand(valid, 1, bytes);
        let packed = b.load_masked(kp, Some(mask2), None);
        // Codes as f32, and the element of the head each one multiplies.
        let codes: Vec<(Value, i64)> = if cfg.bits == 4 {
            let c15 = b.constant(dusk_compiler::Const::Int(15), DType::U8);
            let c4 = b.constant(dusk_compiler::Const::Int(4), DType::U8);
            let lo = b.and(packed, c15);
            let hi = b.shr(packed, c4);
            vec![(b.cast(lo, DType::F32), 0), (b.cast(hi, DType::F32), 1)]
        } else {
            vec![(b.cast(packed, DType::F32), 0)]
        };
        let stride = if cfg.bits == 4 { 2 } else { 1 };

        let hq = b.mul_c(num_kv_heads, g as i64);
        for gi in 0..g {
            // q of query head `head * g + gi`, split to match the codes.
            let qh = b.mul_c(head, g as i64);
            let qh = b.add_c(qh, gi as i64);
            let qrow = b.mul(batch, hq);
            let qrow = b.add(qrow, qh);
            let qbase = b.mul_c(qrow, d as i64);
            let mut dot: Option<Value> = None;
            let mut qsum: Option<Value> = None;
            for (code, off) in &codes {
                let e = b.arange(0, bytes as i64);
                let e = b.mul_c(e, stride as i64);
                let e = b.add_c(e, *off);
                let qi = b.add(qbase, e);
                let qp = b.add_ptr(q, qi);
                let qv = b.load(qp);
                let qv = b.cast(qv, DType::F32);
                let s = b.sum(qv, 0);
                qsum = Some(match qsum {
                    None => s,
                    Some(a) => b.add(a, s),
                });
                let q2 = b.expand(qv, 0, bt);
                let prod = b.mul(*code, q2);
                // One reduction per code part: each folds as a chain of FMAs.
                let part = b.sum(prod, 1);
                dot = Some(match dot {
                    None => part,
                    Some(a) => b.add(a, part),
                });
            }
            let dot = dot.expect("codes");
            let qsum = qsum.expect("codes");
            let s = b.mul(dot, scale);
            let zq = b.mul(zero, qsum);
            let s = b.add(s, zq);
            // scores[start * g + gi * n + j]
            let base = b.mul_c(start, g as i64);
            let gn = b.mul_c(n, gi as i64);
            let base = b.add(base, gn);
            let oi = b.add(base, j);
            let op = b.add_ptr(scores, oi);
            b.store_masked(op, s, Some(valid));
        }
    });
    b.finish()
}
