//! `quantize_k`: f16 K rows to packed 4- or 8-bit codes with a per-row f16 scale and zero
//! (Twilight Section 4.2: asymmetric, per token and head), written in the kernel language.
//!
//! For each row (one token of one KV head) of `head_dim` values:
//! `scale = (max - min) / (2^bits - 1)`, `zero = min`, both rounded to f16, and
//! `code = min(trunc((k - zero) / scale + 0.5), 2^bits - 1)` (round half up; 0 when the row is
//! constant). 4-bit codes pack two a byte, the even element in the low nibble.
//!
//! Layouts. `k` is the engine's paged cache, `[num_pages, page_size, num_kv_heads,
//! head_dim]` f16 ("NHD"). The quantized copy is dusk's own and head-major: codes
//! `[num_pages, num_kv_heads, page_size, head_dim * bits / 8]` and f16 scale and zero
//! `[num_pages, num_kv_heads, page_size]`, so that one KV head's page is one contiguous
//! block (1 KiB of codes at head_dim 128 and 4 bits) for `spgemv_quant`, which reads pages
//! chosen per KV head. Token slot `s` of physical page `p` for KV head `h` is row
//! `(p * page_size + s) * num_kv_heads + h` of `k` and row `(p * num_kv_heads + h) *
//! page_size + s` of the quantized copy ([`crate::paged::KvShape::quantized_row`]).
//!
//! The arithmetic after the loads is two helpers, `store_codes4` and `store_codes8`, which
//! the cache append ([`crate::cache`]) calls too: a token appended gets the bits its row
//! gets when the whole cache is quantized.
//!
//! Parameters of both kernels: `k` (f16), `packed` (u8), `scale`, `zero` (f16), `num_rows`
//! (i32, `num_pages * page_size * num_kv_heads`), `num_kv_heads`, `page_size` (i32). Each
//! program writes `block_rows` consecutive rows of the quantized copy. Grid:
//! `ceil(num_rows / block_rows)`.

use dusk_compiler::{CompileError, Kernel};
use dusk_macros::kernel;

/// Compile-time choices of `quantize_k`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QuantizeConfig {
    pub head_dim: usize,
    pub bits: u32,
    /// Rows (token, head pairs) per program.
    pub block_rows: usize,
}

impl QuantizeConfig {
    pub fn new(head_dim: usize, bits: u32) -> Self {
        QuantizeConfig {
            head_dim,
            bits,
            block_rows: 16,
        }
    }
    /// Bytes of codes per row.
    pub fn packed_row_bytes(&self) -> usize {
        self.head_dim * self.bits as usize / 8
    }
}

/// The row of `k` (engine layout, `(page * page_size + slot) * num_kv_heads + head`) that
/// row `rows` of the quantized copy (head-major, `(page * num_kv_heads + head) * page_size
/// + slot`) holds.
#[kernel(crate = "crate::dusk_paths")]
fn k_row(rows: Block<i32>, num_kv_heads: i32, page_size: i32) -> Block<i32> {
    let slot = rows % page_size;
    let page_head = rows / page_size;
    let head = page_head % num_kv_heads;
    let page = page_head / num_kv_heads;
    (page * page_size + slot) * num_kv_heads + head
}

/// 4 bits: the even and odd elements of each row as two `[ROWS, HALF]` blocks (HALF =
/// head_dim / 2), one code of each per output byte.
#[kernel(crate = "crate::dusk_paths")]
pub fn quantize_k4<const HALF: usize, const ROWS: usize>(
    k: Ptr<f16>,
    packed: Ptr<u8>,
    scale: Ptr<f16>,
    zero: Ptr<f16>,
    num_rows: i32,
    num_kv_heads: i32,
    page_size: i32,
) {
    let rows = program_id(0) * ROWS + arange(0, ROWS);
    let row_ok = rows < num_rows;
    let rows64 = rows as i64;
    let src = k_row(rows, num_kv_heads, page_size) as i64;
    let offs = expand(src * (2 * HALF), 1, HALF) + expand((arange(0, HALF) * 2) as i64, 0, ROWS);
    let mask = expand(row_ok, 1, HALF);
    let even = load(k + offs, mask) as f32;
    let odd = load(k + (offs + 1), mask) as f32;
    store_codes4::<HALF, ROWS>(even, odd, rows64, row_ok, mask, packed, scale, zero);
}

/// Quantizes `ROWS` rows given as their even and odd elements (`[ROWS, HALF]` f32 each) to
/// 4-bit codes, and stores codes, scale and zero at rows `rows64` of the quantized copy
/// where `row_ok` (`mask`: `row_ok` expanded to `[ROWS, HALF]`). `quantize_k4` and the cache append (`crate::cache`) both call it, so
/// a token appended and a cache quantized whole get the same bits.
#[kernel(crate = "crate::dusk_paths")]
#[allow(clippy::too_many_arguments)]
pub fn store_codes4<const HALF: usize, const ROWS: usize>(
    even: Block<f32>,
    odd: Block<f32>,
    rows64: Block<i64>,
    row_ok: Block<bool>,
    mask: Block<bool>,
    packed: Ptr<u8>,
    scale: Ptr<f16>,
    zero: Ptr<f16>,
) {
    let hi = maximum(max(even, 1), max(odd, 1));
    let lo = minimum(min(even, 1), min(odd, 1));
    // Scale and zero as stored (f16): codes are computed against what dequantization reads.
    let scale16 = ((hi - lo) / 15.0) as f16;
    let zero16 = lo as f16;
    store(scale + rows64, scale16, row_ok);
    store(zero + rows64, zero16, row_ok);
    let step = scale16 as f32;
    let has_span = step > 0.0;
    let inv = where_(has_span, 1.0 / where_(has_span, step, 1.0), 0.0);
    let inv2 = expand(inv, 1, HALF);
    let zero2 = expand(zero16 as f32, 1, HALF);
    let lo_code = maximum(minimum((even - zero2) * inv2 + 0.5, 15.0), 0.0) as u8;
    let hi_code = maximum(minimum((odd - zero2) * inv2 + 0.5, 15.0), 0.0) as u8;
    let out = expand(rows64 * HALF, 1, HALF) + expand(arange(0, HALF) as i64, 0, ROWS);
    store(packed + out, lo_code | (hi_code << 4), mask);
}

/// 8 bits: one code a byte.
#[kernel(crate = "crate::dusk_paths")]
pub fn quantize_k8<const D: usize, const ROWS: usize>(
    k: Ptr<f16>,
    packed: Ptr<u8>,
    scale: Ptr<f16>,
    zero: Ptr<f16>,
    num_rows: i32,
    num_kv_heads: i32,
    page_size: i32,
) {
    let rows = program_id(0) * ROWS + arange(0, ROWS);
    let row_ok = rows < num_rows;
    let rows64 = rows as i64;
    let src = k_row(rows, num_kv_heads, page_size) as i64;
    let cols = expand(arange(0, D) as i64, 0, ROWS);
    let mask = expand(row_ok, 1, D);
    let x = load(k + (expand(src * D, 1, D) + cols), mask) as f32;
    store_codes8::<D, ROWS>(x, rows64, row_ok, mask, packed, scale, zero);
}

/// Quantizes `ROWS` rows (`[ROWS, D]` f32) to 8-bit codes and stores codes, scale and
/// zero at rows `rows64` of the quantized copy where `row_ok` (`mask`: `row_ok` expanded
/// to `[ROWS, D]`): what `quantize_k8` and the cache append share.
#[kernel(crate = "crate::dusk_paths")]
#[allow(clippy::too_many_arguments)]
pub fn store_codes8<const D: usize, const ROWS: usize>(
    x: Block<f32>,
    rows64: Block<i64>,
    row_ok: Block<bool>,
    mask: Block<bool>,
    packed: Ptr<u8>,
    scale: Ptr<f16>,
    zero: Ptr<f16>,
) {
    let cols = expand(arange(0, D) as i64, 0, ROWS);
    let hi = max(x, 1);
    let lo = min(x, 1);
    let scale16 = ((hi - lo) / 255.0) as f16;
    let zero16 = lo as f16;
    store(scale + rows64, scale16, row_ok);
    store(zero + rows64, zero16, row_ok);
    let step = scale16 as f32;
    let has_span = step > 0.0;
    let inv = where_(has_span, 1.0 / where_(has_span, step, 1.0), 0.0);
    let code = maximum(
        minimum(
            (x - expand(zero16 as f32, 1, D)) * expand(inv, 1, D) + 0.5,
            255.0,
        ),
        0.0,
    ) as u8;
    store(packed + (expand(rows64 * D, 1, D) + cols), code, mask);
}

/// The kernel for `cfg` (head_dim 64, 128 or 256; 4 or 8 bits; 16 rows a program).
pub fn build(cfg: &QuantizeConfig) -> Result<Kernel, CompileError> {
    let unsupported = || CompileError::Build {
        kernel: "quantize_k".into(),
        op: "build".into(),
        loc: String::new(),
        msg: format!("no quantize_k for {cfg:?}: head_dim 64, 128 or 256, 4 or 8 bits, 16 rows"),
    };
    if cfg.block_rows != 16 {
        return Err(unsupported());
    }
    match (cfg.bits, cfg.head_dim) {
        (4, 64) => quantize_k4::build::<32, 16>(),
        (4, 128) => quantize_k4::build::<64, 16>(),
        (4, 256) => quantize_k4::build::<128, 16>(),
        (8, 64) => quantize_k8::build::<64, 16>(),
        (8, 128) => quantize_k8::build::<128, 16>(),
        (8, 256) => quantize_k8::build::<256, 16>(),
        _ => Err(unsupported()),
    }
}
