//! Making a synthetic batch on the device (the GPU, or the CPU through the interpreter):
//! [`SyntheticCache::generate`] for a cache of its own, [`write_cache`] into the caller's
//! buffers and page table, [`SyntheticCache::queries_into`] for a later step's queries.

use super::hash::{stream_key, Stream};
use super::kernels::{synth_kv, synth_plant, synth_query};
use super::planted::Planted;
use super::spec::SyntheticSpec;
use crate::error::{ensure, invalid, Result};
use crate::ops::Dusk;
use crate::paged::{KvShape, PageTable};
use dusk_compiler::{CompileError, Kernel};
use dusk_runtime::{Arg, Buffer};
use half::f16;

/// Token slots the cache kernel writes at once (any page size: shorter pages are masked,
/// longer ones loop).
const SLOTS: usize = 16;

/// A generated batch on the device: the cache, its page table, step 0's queries, and what
/// was planted.
pub struct SyntheticCache {
    pub spec: SyntheticSpec,
    pub kv: KvShape,
    pub table: PageTable,
    pub planted: Planted,
    /// f16 `[num_pages, page_size, num_kv_heads, head_dim]` (the engines' "NHD").
    pub k: Buffer<f16>,
    pub v: Buffer<f16>,
    /// Step 0's queries, f16 `[batch, num_q_heads, head_dim]`.
    pub q: Buffer<f16>,
}

impl SyntheticCache {
    /// Generates `spec`'s batch: a cache of exactly the pages it needs, in the order
    /// [`SyntheticSpec::page_table`] draws, and step 0's queries.
    pub fn generate(dusk: &Dusk, spec: &SyntheticSpec) -> Result<SyntheticCache> {
        let table = spec.page_table()?;
        let kv = spec.kv_shape();
        let dev = dusk.device();
        let (mut k, mut v) = (dev.alloc(kv.elements())?, dev.alloc(kv.elements())?);
        let planted = write_cache(dusk, spec, &table, &mut k, &mut v)?;
        let mut q = dev.alloc(spec.batch() * spec.num_q_heads * spec.head_dim)?;
        write_queries(dusk, spec, 0, &mut q)?;
        Ok(SyntheticCache {
            spec: spec.clone(),
            kv,
            table,
            planted,
            k,
            v,
            q,
        })
    }

    /// The queries of decode step `step` into `q` (f16 `[batch, num_q_heads, head_dim]`):
    /// step 0's are `scale * u` per head, a later step's `scale * (u + e / 4)` with `e` of
    /// the step's own, so planted tokens still stand out. Allocates nothing.
    pub fn queries_into(&self, dusk: &Dusk, step: u32, q: &mut Buffer<f16>) -> Result<()> {
        write_queries(dusk, &self.spec, step, q)
    }
}

/// Writes `spec`'s K and V into `k` and `v`, caches of `k.len() / (page_size *
/// num_kv_heads * head_dim)` pages of which `table` (validated; its lengths must be
/// `spec.seq_lens`) names the batch's; pages it does not name are left as they are.
/// Returns the planted tokens.
pub fn write_cache(
    dusk: &Dusk,
    spec: &SyntheticSpec,
    table: &PageTable,
    k: &mut Buffer<f16>,
    v: &mut Buffer<f16>,
) -> Result<Planted> {
    spec.validate()?;
    let per_page = spec.page_size * spec.num_kv_heads * spec.head_dim;
    ensure!(
        k.len().is_multiple_of(per_page) && !k.is_empty(),
        "k",
        format!("whole pages of {per_page} f16 values"),
        k.len(),
    );
    ensure!(
        v.len() == k.len(),
        "v",
        format!("{} f16 values, as k", k.len()),
        v.len(),
    );
    let kv = KvShape {
        num_pages: k.len() / per_page,
        ..spec.kv_shape()
    };
    kv.validate()?;
    table.validate(&kv)?;
    ensure!(
        table.batch() == spec.batch(),
        "table",
        format!("{} sequences, as spec.seq_lens", spec.batch()),
        table.batch(),
    );
    if let Some(b) =
        (0..spec.batch()).find(|b| table.seq_len(*b, kv.page_size) != spec.seq_lens[*b])
    {
        return Err(invalid(
            "table",
            format!(
                "{} tokens in sequence {b}, as spec.seq_lens",
                spec.seq_lens[b]
            ),
            table.seq_len(b, kv.page_size),
        ));
    }
    ensure!(
        spec.num_kv_heads <= 65535,
        "num_kv_heads",
        "at most 65535 (a grid dimension)",
        spec.num_kv_heads,
    );
    let dev = dusk.device();
    let page_seq: Vec<i32> = (0..spec.batch())
        .flat_map(|b| {
            let pages = table.kv_indptr[b + 1] - table.kv_indptr[b];
            std::iter::repeat_n(b as i32, pages as usize)
        })
        .collect();
    let indptr = dev.upload(&table.kv_indptr)?;
    let indices = dev.upload(&table.kv_page_indices)?;
    let key = |s| Arg::I32(stream_key(spec.seed, s) as i32);
    let d = spec.head_dim;
    if !page_seq.is_empty() {
        let page_seq = dev.upload(&page_seq)?;
        let kernel = dusk.kernel(format!("synth_kv_{d}"), || build_kv(d))?;
        dev.launch(
            &kernel,
            [page_seq.len() as u32, spec.num_kv_heads as u32, 1],
            &[
                Arg::from(&*k),
                Arg::from(&*v),
                Arg::from(&page_seq),
                Arg::from(&indptr),
                Arg::from(&indices),
                Arg::I32(spec.num_kv_heads as i32),
                Arg::I32(spec.page_size as i32),
                key(Stream::KeyNoise),
                key(Stream::ValueNoise),
                key(Stream::ValueMean),
            ],
        )?;
    }
    let planted = Planted::draw(spec);
    if !planted.tokens.is_empty() {
        let plants = dev.upload(&planted.packed())?;
        let kernel = dusk.kernel(format!("synth_plant_{d}"), || build_plant(d))?;
        dev.launch(
            &kernel,
            [planted.tokens.len() as u32, 1, 1],
            &[
                Arg::from(&*k),
                Arg::from(&plants),
                Arg::from(&indptr),
                Arg::from(&indices),
                Arg::I32(spec.num_kv_heads as i32),
                Arg::I32(spec.num_q_heads as i32),
                Arg::I32(spec.page_size as i32),
                key(Stream::KeyNoise),
                key(Stream::QueryDirection),
            ],
        )?;
    }
    Ok(planted)
}

/// Writes the queries of decode step `step` into `q` (see
/// [`SyntheticCache::queries_into`]).
pub fn write_queries(
    dusk: &Dusk,
    spec: &SyntheticSpec,
    step: u32,
    q: &mut Buffer<f16>,
) -> Result<()> {
    spec.validate()?;
    let rows = spec.batch() * spec.num_q_heads;
    ensure!(
        q.len() == rows * spec.head_dim,
        "q",
        format!(
            "{} f16 values (batch * num_q_heads * head_dim)",
            rows * spec.head_dim
        ),
        q.len(),
    );
    ensure!(step < i32::MAX as u32, "step", "under 2^31", step);
    let dev = dusk.device();
    let scales: Vec<i32> = spec.heads.iter().map(|h| h.scale_steps()).collect();
    let scales = dev.upload(&scales)?;
    let d = spec.head_dim;
    let kernel = dusk.kernel(format!("synth_query_{d}"), || build_query(d))?;
    dev.launch(
        &kernel,
        [rows as u32, 1, 1],
        &[
            Arg::from(&*q),
            Arg::from(&scales),
            Arg::I32(spec.num_q_heads as i32),
            Arg::I32(stream_key(spec.seed, Stream::QueryDirection) as i32),
            Arg::I32(stream_key(spec.seed, Stream::QueryJitter) as i32),
            Arg::I32(step as i32),
        ],
    )
    .map_err(Into::into)
}

/// The cache kernel for `head_dim` (64, 128 or 256: [`KvShape`]'s).
pub fn build_kv(head_dim: usize) -> std::result::Result<Kernel, CompileError> {
    match head_dim {
        64 => synth_kv::build::<64, SLOTS>(),
        128 => synth_kv::build::<128, SLOTS>(),
        _ => synth_kv::build::<256, SLOTS>(),
    }
}

/// The plant kernel for `head_dim`.
pub fn build_plant(head_dim: usize) -> std::result::Result<Kernel, CompileError> {
    match head_dim {
        64 => synth_plant::build::<64>(),
        128 => synth_plant::build::<128>(),
        _ => synth_plant::build::<256>(),
    }
}

/// The query kernel for `head_dim`.
pub fn build_query(head_dim: usize) -> std::result::Result<Kernel, CompileError> {
    match head_dim {
        64 => synth_query::build::<64>(),
        128 => synth_query::build::<128>(),
        _ => synth_query::build::<256>(),
    }
}
