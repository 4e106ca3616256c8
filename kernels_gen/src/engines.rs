//! Converters on the device from the paged-KV metadata of serving engines to dusk's CSR
//! page table (`kv_indptr`, `kv_page_indices`, `kv_last_page_len`), written in the kernel
//! language:
//!
//! - vLLM: `block_table[b, j]` is the `j`-th page (block) of sequence `b`, and
//!   `seq_lens[b]` its length in tokens ([`vllm_to_csr`]).
//! - SGLang: `req_to_token[r, t]` is the KV slot of token `t` of the request in row `r` of
//!   the request pool, `req_pool_indices[b]` the row of sequence `b`, `seq_lens[b]` its
//!   length; with pages of `page_size` slots, token `t`'s page is
//!   `req_to_token[r, t] / page_size` and a page's slots are consecutive (SGLang's paged
//!   allocator), so page `j` of the sequence is `req_to_token[r, j * page_size] /
//!   page_size` ([`sglang_to_csr`]; page_size 1, SGLang's default, makes every token a page).
//!
//! Both are safe inside a captured CUDA graph: the outputs have a fixed size (`batch + 1`,
//! `batch * max_pages`, `batch`), the grid depends only on the shapes, and nothing is read
//! back on the host. Each program finds where its sequence starts in `kv_page_indices`
//! by summing the page counts of the sequences before it. Their contents are trusted as a
//! kernel trusts device lists: a length below 0 counts as 0, one past `max_pages` pages is
//! cut to `max_pages` pages (the last page then full), a pool row outside the pool makes
//! an empty sequence, and page ids are clamped into `0..num_pages`; a bad table gives a
//! wrong answer, never an access out of bounds.

use crate::error::{ensure, Result};
use crate::ops::Dusk;
use crate::paged::PageTable;
use dusk_compiler::{CompileError, Kernel};
use dusk_macros::kernel;
use dusk_runtime::{Arg, Buffer};

/// Pages a program of the converters copies (grid axis 1 covers `max_pages`).
pub const BLOCK_PAGES: usize = 128;
/// Sequences a program sums at a time to find its start.
const SCAN: usize = 128;

/// Pages of the sequences `i` (`mask`ed), as the converters count them.
#[kernel(crate = "crate::dusk_paths")]
fn page_counts(lens: Block<i32>, page_size: i32, max_pages: i32) -> Block<i32> {
    minimum((maximum(lens, 0) + (page_size - 1)) / page_size, max_pages)
}

/// The offset in `kv_page_indices` of sequence `b`: the pages of sequences `0..b` (with
/// `CHECK_ROWS`, those whose pool row in `rows` lies in `0..pool_rows`).
#[kernel(crate = "crate::dusk_paths")]
fn start_of<const SCAN: usize, const CHECK_ROWS: bool>(
    seq_lens: Ptr<i32>,
    rows: Ptr<i32>,
    b: i32,
    page_size: i32,
    max_pages: i32,
    pool_rows: i32,
) -> i32 {
    let mut start = 0;
    for i0 in (0..b).step_by(SCAN) {
        let i = i0 + arange(0, SCAN);
        let m = i < b;
        let mut lens = load(seq_lens + i, m, 0);
        if CHECK_ROWS {
            let row = load(rows + i, m, 0);
            lens = where_((row >= 0) & (row < pool_rows), lens, 0);
        }
        start = start + sum(page_counts(lens, page_size, max_pages), 0);
    }
    start
}

/// Writes sequence `b`'s `kv_indptr[b + 1]` and `kv_last_page_len[b]` (and `kv_indptr[0]`).
#[kernel(crate = "crate::dusk_paths")]
fn write_bounds(
    kv_indptr: Ptr<i32>,
    kv_last_page_len: Ptr<i32>,
    b: i32,
    start: i32,
    len: i32,
    n: i32,
    page_size: i32,
) {
    if program_id(1) == 0 {
        store(kv_indptr + (b + 1), start + n);
        // A sequence cut to max_pages pages ends on a full page.
        let whole = (maximum(len, 0) + (page_size - 1)) / page_size;
        let last = where_(n == whole, len - (n - 1) * page_size, page_size);
        store(kv_last_page_len + b, where_(n > 0, last, 0));
        if b == 0 {
            store(kv_indptr + b, b);
        }
    }
}

/// vLLM's `block_table` (`row_stride` entries a row) and `seq_lens` to CSR. Grid:
/// `(batch, ceil(max_pages / BLOCK))`.
#[kernel(crate = "crate::dusk_paths")]
pub fn block_table_to_csr<const BLOCK: usize, const SCAN: usize>(
    block_table: Ptr<i32>,
    seq_lens: Ptr<i32>,
    kv_indptr: Ptr<i32>,
    kv_page_indices: Ptr<i32>,
    kv_last_page_len: Ptr<i32>,
    row_stride: i32,
    max_pages: i32,
    page_size: i32,
    num_pages: i32,
) {
    let b = program_id(0);
    let start = start_of::<SCAN, false>(seq_lens, seq_lens, b, page_size, max_pages, 0);
    let len = load(seq_lens + b);
    let n = sum(page_counts(splat(len, [1]), page_size, max_pages), 0);
    let j = program_id(1) * BLOCK + arange(0, BLOCK);
    let m = j < n;
    let page = load(
        block_table + ((b as i64) * (row_stride as i64) + (j as i64)),
        m,
        0,
    );
    let page = minimum(maximum(page, 0), num_pages - 1);
    store(kv_page_indices + (start + j), page, m);
    write_bounds(kv_indptr, kv_last_page_len, b, start, len, n, page_size);
}

/// SGLang's `req_to_token` (`row_stride` entries a row, `pool_rows` rows),
/// `req_pool_indices` and `seq_lens` to CSR with pages of `page_size` slots. Grid:
/// `(batch, ceil(max_pages / BLOCK))`.
#[kernel(crate = "crate::dusk_paths")]
pub fn req_to_token_to_csr<const BLOCK: usize, const SCAN: usize>(
    req_to_token: Ptr<i32>,
    req_pool_indices: Ptr<i32>,
    seq_lens: Ptr<i32>,
    kv_indptr: Ptr<i32>,
    kv_page_indices: Ptr<i32>,
    kv_last_page_len: Ptr<i32>,
    row_stride: i32,
    pool_rows: i32,
    max_pages: i32,
    page_size: i32,
    num_pages: i32,
) {
    let b = program_id(0);
    let start = start_of::<SCAN, true>(
        seq_lens,
        req_pool_indices,
        b,
        page_size,
        max_pages,
        pool_rows,
    );
    let row = load(req_pool_indices + b);
    let in_pool = (row >= 0) & (row < pool_rows);
    let len = where_(in_pool, load(seq_lens + b), 0);
    let n = sum(page_counts(splat(len, [1]), page_size, max_pages), 0);
    let j = program_id(1) * BLOCK + arange(0, BLOCK);
    let m = j < n;
    let at = (maximum(row, 0) as i64) * (row_stride as i64) + ((j * page_size) as i64);
    let slot = load(req_to_token + at, m, 0);
    let page = minimum(maximum(slot / page_size, 0), num_pages - 1);
    store(kv_page_indices + (start + j), page, m);
    write_bounds(kv_indptr, kv_last_page_len, b, start, len, n, page_size);
}

/// The vLLM converter's kernel.
pub fn build_block_table() -> std::result::Result<Kernel, CompileError> {
    block_table_to_csr::build::<BLOCK_PAGES, SCAN>()
}

/// The SGLang converter's kernel.
pub fn build_req_to_token() -> std::result::Result<Kernel, CompileError> {
    req_to_token_to_csr::build::<BLOCK_PAGES, SCAN>()
}

/// A page table in dusk's CSR form on the device, sized for `batch` sequences of at most
/// `max_pages` pages each: what the converters write. Entries of `kv_page_indices` past
/// `kv_indptr[batch]` are left as they were.
pub struct CsrPages {
    /// `batch + 1` offsets.
    pub kv_indptr: Buffer<i32>,
    /// Capacity `batch * max_pages`.
    pub kv_page_indices: Buffer<i32>,
    /// `batch` lengths of the last pages (0 for an empty sequence).
    pub kv_last_page_len: Buffer<i32>,
}

impl CsrPages {
    /// Zeroed buffers on `dusk`'s device for `batch` sequences of at most `max_pages` pages.
    pub fn alloc(dusk: &Dusk, batch: usize, max_pages: usize) -> Result<CsrPages> {
        let dev = dusk.device();
        Ok(CsrPages {
            kv_indptr: dev.alloc(batch + 1)?,
            kv_page_indices: dev.alloc((batch * max_pages).max(1))?,
            kv_last_page_len: dev.alloc(batch.max(1))?,
        })
    }

    /// `table` uploaded as it is (a host table the caller checked).
    pub fn upload(dusk: &Dusk, table: &PageTable) -> Result<CsrPages> {
        let dev = dusk.device();
        Ok(CsrPages {
            kv_indptr: dev.upload(&table.kv_indptr)?,
            kv_page_indices: dev.upload(&table.kv_page_indices)?,
            kv_last_page_len: dev.upload(&table.kv_last_page_len)?,
        })
    }

    /// Sequences the outputs are sized for, checked against `batch` and `max_pages`.
    fn check(&self, batch: usize, max_pages: usize) -> Result<()> {
        ensure!(
            self.kv_indptr.len() == batch + 1,
            "kv_indptr",
            format!("{} entries (batch + 1)", batch + 1),
            self.kv_indptr.len(),
        );
        ensure!(
            self.kv_page_indices.len() >= batch * max_pages,
            "kv_page_indices",
            format!("at least {} entries (batch x max_pages)", batch * max_pages),
            self.kv_page_indices.len(),
        );
        ensure!(
            self.kv_last_page_len.len() >= batch,
            "kv_last_page_len",
            format!("{batch} entries (batch)"),
            self.kv_last_page_len.len(),
        );
        Ok(())
    }
}

/// The shape of an engine's table: `rows` rows of `row_stride` entries, of which the first
/// `max_pages` pages (vLLM) or tokens (SGLang) of each row are used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineTable {
    pub rows: usize,
    pub row_stride: usize,
    /// vLLM: pages a row holds. SGLang: tokens a row holds (its `max_context_len`).
    pub row_len: usize,
}

fn check_common(
    table: &EngineTable,
    table_len: usize,
    seq_lens: &Buffer<i32>,
    page_size: usize,
    num_pages: usize,
) -> Result<usize> {
    ensure!(
        page_size.is_power_of_two() && page_size <= 1 << 16,
        "page_size",
        "a power of two up to 65536",
        page_size,
    );
    ensure!(
        num_pages > 0 && num_pages < i32::MAX as usize,
        "num_pages",
        "1 to 2^31 - 2",
        num_pages,
    );
    ensure!(
        table.row_len <= table.row_stride,
        "row_stride",
        format!("at least the used row length ({})", table.row_len),
        table.row_stride,
    );
    let need = if table.rows == 0 {
        0
    } else {
        (table.rows - 1) * table.row_stride + table.row_len
    };
    ensure!(
        table_len >= need && table_len < i32::MAX as usize * 2,
        "table",
        format!("at least {need} entries ({table:?})"),
        table_len,
    );
    let batch = seq_lens.len();
    ensure!(batch < 65536, "seq_lens", "at most 65535 sequences", batch);
    Ok(batch)
}

/// vLLM's `block_table` (`table.rows` rows, at least `batch` of them, of `table.row_len`
/// pages) and `seq_lens` (i32, one a sequence) to `out`, on the device; see the module
/// docs. `num_pages`: the pages of the cache the ids point into.
pub fn vllm_to_csr(
    dusk: &Dusk,
    block_table: &Buffer<i32>,
    table: EngineTable,
    seq_lens: &Buffer<i32>,
    page_size: usize,
    num_pages: usize,
    out: &mut CsrPages,
) -> Result<()> {
    let batch = check_common(&table, block_table.len(), seq_lens, page_size, num_pages)?;
    ensure!(
        table.rows >= batch,
        "block_table",
        format!("at least {batch} rows (one a sequence of seq_lens)"),
        table.rows,
    );
    let max_pages = table.row_len;
    out.check(batch, max_pages)?;
    if batch == 0 {
        return Ok(());
    }
    let kernel = dusk.kernel("engines::block_table_to_csr".into(), build_block_table)?;
    let tiles = max_pages.div_ceil(BLOCK_PAGES).max(1) as u32;
    dusk.device().launch(
        &kernel,
        [batch as u32, tiles, 1],
        &[
            Arg::from(block_table),
            Arg::from(seq_lens),
            Arg::from(&out.kv_indptr),
            Arg::from(&out.kv_page_indices),
            Arg::from(&out.kv_last_page_len),
            Arg::I32(table.row_stride as i32),
            Arg::I32(max_pages as i32),
            Arg::I32(page_size as i32),
            Arg::I32(num_pages as i32),
        ],
    )?;
    Ok(())
}

/// SGLang's `req_to_token` (`table.rows` pool rows of `table.row_len` token slots),
/// `req_pool_indices` and `seq_lens` (i32, one a sequence) to `out` with pages of
/// `page_size` slots, on the device; see the module docs. Each sequence may hold up to
/// `table.row_len / page_size` pages.
#[allow(clippy::too_many_arguments)]
pub fn sglang_to_csr(
    dusk: &Dusk,
    req_to_token: &Buffer<i32>,
    table: EngineTable,
    req_pool_indices: &Buffer<i32>,
    seq_lens: &Buffer<i32>,
    page_size: usize,
    num_pages: usize,
    out: &mut CsrPages,
) -> Result<()> {
    let batch = check_common(&table, req_to_token.len(), seq_lens, page_size, num_pages)?;
    ensure!(
        req_pool_indices.len() == batch,
        "req_pool_indices",
        format!("{batch} entries (one a sequence of seq_lens)"),
        req_pool_indices.len(),
    );
    let max_pages = table.row_len / page_size;
    out.check(batch, max_pages)?;
    if batch == 0 {
        return Ok(());
    }
    let kernel = dusk.kernel("engines::req_to_token_to_csr".into(), build_req_to_token)?;
    let tiles = max_pages.div_ceil(BLOCK_PAGES).max(1) as u32;
    dusk.device().launch(
        &kernel,
        [batch as u32, tiles, 1],
        &[
            Arg::from(req_to_token),
            Arg::from(req_pool_indices),
            Arg::from(seq_lens),
            Arg::from(&out.kv_indptr),
            Arg::from(&out.kv_page_indices),
            Arg::from(&out.kv_last_page_len),
            Arg::I32(table.row_stride as i32),
            Arg::I32(table.rows as i32),
            Arg::I32(max_pages as i32),
            Arg::I32(page_size as i32),
            Arg::I32(num_pages as i32),
        ],
    )?;
    Ok(())
}
