//! `quantize_k`: f16 K rows to packed 4- or 8-bit codes with a per-row f16 scale and zero
//! (Twilight Section 4.2: asymmetric, per token and head).
//!
//! For each row (one token of one KV head) of `head_dim` values:
//! `scale = (max - min) / (2^bits - 1)`, `zero = min`, both rounded to f16, and
//! `code = min(trunc((k - zero) / scale + 0.5), 2^bits - 1)` (round half up; 0 when the row is
//! constant). 4-bit codes pack two a byte, the even element in the low nibble.

use dusk_compiler::{CompileError, DType, Kernel, KernelBuilder, Value};

/// Compile-time choices of `quantize_k`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QuantizeConfig {
    pub head_dim: usize,
    pub bits: u32,
    /// Rows (token, head pairs) per program.
    pub block_rows: usize,
    pub num_warps: u32,
}

impl QuantizeConfig {
    pub fn new(head_dim: usize, bits: u32) -> Self {
        QuantizeConfig {
            head_dim,
            bits,
            block_rows: 16,
            num_warps: 4,
        }
    }
    /// Bytes of codes per row.
    pub fn packed_row_bytes(&self) -> usize {
        self.head_dim * self.bits as usize / 8
    }
}

/// Builds the kernel. Parameters: `k` (f16, rows x head_dim), `packed` (u8),
/// `scale`, `zero` (f16 per row), `num_rows` (i32). Grid: `ceil(num_rows / block_rows)`.
pub fn build(cfg: &QuantizeConfig) -> Result<Kernel, CompileError> {
    let name = format!("quantize_k_d{}_b{}", cfg.head_dim, cfg.bits);
    let mut b = KernelBuilder::new(&name);
    b.set_num_warps(cfg.num_warps);
    let k = b.param_ptr("k", DType::F16);
    let packed = b.param_ptr("packed", DType::U8);
    let scale_out = b.param_ptr("scale", DType::F16);
    let zero_out = b.param_ptr("zero", DType::F16);
    let num_rows = b.param_scalar("num_rows", DType::I32);

    let br = cfg.block_rows;
    let d = cfg.head_dim;
    let levels = ((1u32 << cfg.bits) - 1) as f32;
    let pid = b.program_id(0);
    let c_br = b.i32(br as i32);
    let first = b.mul(pid, c_br);
    let rows_i = b.arange(0, br as i64);
    let rows = b.add(first, rows_i);
    let row_ok = b.lt(rows, num_rows);
    let rows64 = b.cast(rows, DType::I64);

    // Even and odd elements of each row as two [rows, d/2] blocks (or the whole row for 8 bits).
    let lanes = if cfg.bits == 4 { d / 2 } else { d };
    let stride = if cfg.bits == 4 { 2 } else { 1 };
    let c_d = b.i64(d as i64);
    let row_base = b.mul(rows64, c_d);
    let cols = b.arange(0, lanes as i64);
    let c_stride = b.i32(stride);
    let cols = b.mul(cols, c_stride);
    let cols64 = b.cast(cols, DType::I64);
    let row_base2 = b.expand(row_base, 1, lanes);
    let cols2 = b.expand(cols64, 0, br);
    let offs = b.add(row_base2, cols2);
    let mask2 = b.expand(row_ok, 1, lanes);
    let load_part = |b: &mut KernelBuilder, extra: i64| -> Value {
        let e = b.i64(extra);
        let o = b.add(offs, e);
        let p = b.add_ptr(k, o);
        let x = b.load_masked(p, Some(mask2), None);
        b.cast(x, DType::F32)
    };
    let parts: Vec<Value> = if cfg.bits == 4 {
        vec![load_part(&mut b, 0), load_part(&mut b, 1)]
    } else {
        vec![load_part(&mut b, 0)]
    };

    let mut hi = b.max(parts[0], 1);
    let mut lo = b.min(parts[0], 1);
    for p in &parts[1..] {
        let m = b.max(*p, 1);
        hi = b.maximum(hi, m);
        let m = b.min(*p, 1);
        lo = b.minimum(lo, m);
    }
    // Scale and zero as stored (f16), so codes are computed against what dequantization reads.
    let span = b.sub(hi, lo);
    let c_levels = b.f32(levels);
    let scale = b.div(span, c_levels);
    let scale16 = b.cast(scale, DType::F16);
    let zero16 = b.cast(lo, DType::F16);
    let scale = b.cast(scale16, DType::F32);
    let zero = b.cast(zero16, DType::F32);
    let p = b.add_ptr(scale_out, rows64);
    b.store_masked(p, scale16, Some(row_ok));
    let p = b.add_ptr(zero_out, rows64);
    b.store_masked(p, zero16, Some(row_ok));
    let zero_f = b.f32(0.0);
    let one = b.f32(1.0);
    let has_span = b.gt(scale, zero_f);
    let safe = b.select(has_span, scale, one);
    let inv = b.div(one, safe);
    let inv = b.select(has_span, inv, zero_f);
    let inv2 = b.expand(inv, 1, lanes);
    let zero2 = b.expand(zero, 1, lanes);
    let half = b.f32(0.5);
    let codes: Vec<Value> = parts
        .iter()
        .map(|x| {
            let c = b.sub(*x, zero2);
            let c = b.mul(c, inv2);
            let c = b.add(c, half);
            let c = b.minimum(c, c_levels);
            let c = b.maximum(c, zero_f);
            b.cast(c, DType::U8)
        })
        .collect();
    let byte = if cfg.bits == 4 {
        let four = b.constant(dusk_compiler::Const::Int(4), DType::U8);
        let hi_n = b.shl(codes[1], four);
        b.or(codes[0], hi_n)
    } else {
        codes[0]
    };
    let out_cols = b.arange(0, lanes as i64);
    let out_cols = b.cast(out_cols, DType::I64);
    let c_row_bytes = b.i64(cfg.packed_row_bytes() as i64);
    let out_base = b.mul(rows64, c_row_bytes);
    let out_base2 = b.expand(out_base, 1, lanes);
    let out_cols2 = b.expand(out_cols, 0, br);
    let out_offs = b.add(out_base2, out_cols2);
    let p = b.add_ptr(packed, out_offs);
    b.store_masked(p, byte, Some(mask2));
    b.finish()
}
