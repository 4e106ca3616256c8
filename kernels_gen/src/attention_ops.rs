//! Host entry points of varlen paged decode attention ([`crate::attention`]).
//!
//! As serving engines do, the work is split in two:
//! - [`AttentionPlan::new`] checks the shapes, compiles the kernels, picks the chunk size
//!   and the grid for a *maximum* budget, and allocates the partial-result buffers, once;
//! - [`AttentionPlan::run`] checks buffer lengths and queues two launches (split and
//!   merge; token lists are split evenly on the device, [`crate::attention`]; one launch
//!   with [`AttentionTuning::fused_merge`]): no allocation,
//!   no host sync, so a decode step can be captured in a CUDA graph and replayed while the
//!   token lists (written on the device by the pruner) change from step to step.
//!
//! The metadata (page table, token lists) lives on the device in an [`AttentionMeta`],
//! either uploaded from host lists (fully validated) or wrapping lists the GPU wrote.

use crate::attention::{self, MergeConfig, SplitConfig, TokenSource};
use crate::error::{ensure, invalid, Result};
use crate::ops::Dusk;
use crate::paged::{KvShape, PageTable, TokenLists};
use crate::timeline::TIMELINE_WORDS;
use dusk_compiler::DType;
use dusk_runtime::{Arg, Buffer, Element, LoadedKernel};
use std::sync::Arc;

/// Which tokens each query attends to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttentionMode {
    /// Every token of its sequence (from the page table).
    Dense,
    /// One token list per (batch, query head) (MHA head-wise budgets; with GQA each query
    /// head reads its KV head's rows on its own).
    HeadVarlen,
    /// One token list per (batch, KV head), shared by the group's query heads (the union of
    /// their selections, Twilight Appendix B.2): K and V are read once per group.
    GroupVarlen,
    /// Group lists padded to the plan's `max_tokens` (padding read, then masked): the
    /// baseline that [`AttentionMode::GroupVarlen`] is measured against.
    Padded,
}

/// What a plan is made for.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionSpec {
    pub kv: KvShape,
    pub batch: usize,
    pub num_q_heads: usize,
    pub mode: AttentionMode,
    /// The most tokens any row will attend to (dense: the longest sequence; lists: the
    /// budget). Rows longer than this are cut at this length by the kernel.
    pub max_tokens: usize,
    /// Softmax scale; `None` is `1 / sqrt(head_dim)`.
    pub sm_scale: Option<f32>,
    /// Apply SparQ's output transform `alpha * y + (1 - alpha) * v_mean` in the merge.
    pub sparq: bool,
    /// Element type of q, K, V and the output: f16 or bf16.
    pub dtype: DType,
}

/// Tuning knobs, with defaults from [`AttentionTuning::for_spec`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionTuning {
    /// Tokens per loop iteration of the split kernel.
    pub block_tokens: usize,
    pub num_warps: u32,
    /// Tokens per work item (a multiple of `block_tokens`); with token lists, the shortest
    /// segment of the balanced split (see [`crate::attention`]).
    pub chunk_tokens: usize,
    /// Bytes of a K or V row each thread reads: 16 or 32 (see
    /// [`SplitConfig::vector_bytes`](crate::attention::SplitConfig)).
    pub vector_bytes: u32,
    /// Tiles of K and V in flight ahead of the one computed: 1 or 2.
    pub prefetch: usize,
    /// Programs per SM asked of ptxas (0: none).
    pub min_programs_per_sm: u32,
    /// Tensor cores: K and V staged through a ring of this many tiles of shared memory by
    /// asynchronous copies, `stages - 1` in flight (see
    /// [`SplitConfig::stages`](crate::attention::SplitConfig)); 0: through registers.
    /// 0 or 2 to 6, with `prefetch` 1, no `l2_prefetch` and no `stream_kv`.
    pub stages: usize,
    /// K and V of one more tile brought into L2 a step early (see
    /// [`SplitConfig::l2_prefetch`](crate::attention::SplitConfig)).
    pub l2_prefetch: bool,
    /// Scores and P.V on the tensor cores (see
    /// [`SplitConfig::tensor_cores`](crate::attention::SplitConfig)): needs a group of 2 to
    /// 8 query heads a program, 8 tokens a step and one warp.
    pub tensor_cores: bool,
    /// A row's chunks next to each other in the grid (see
    /// [`SplitConfig::chunk_fastest`](crate::attention::SplitConfig)). Dense and padded
    /// modes only: token lists are split evenly over a 1-D grid.
    pub chunk_fastest: bool,
    /// Token lists: programs of the split grid, each taking an equal segment of the lists'
    /// entries (0: as many as fit on the GPU at once, from the split kernel's registers).
    pub list_programs: u32,
    /// Token lists: the entries' worth of time a program spends starting a piece of a row
    /// (dependent loads before its first step, the partial result after its last); the
    /// balanced split counts each row as this much longer, so programs covering many row
    /// starts get fewer entries.
    pub row_tokens: u32,
    /// The merge done by the split's programs (the last piece of a row to finish merges
    /// it, token lists; the last chunk of a row, dense and padded; see
    /// [`SplitConfig::fused_merge`](crate::attention::SplitConfig)) instead of a second
    /// launch. Off: on an H100 it was right everywhere and slower everywhere it was timed
    /// with token lists (skewed group varlen 44.6 us against 40.8, a CUDA graph replay
    /// 18.6 against 12.2; benches/NOTES.md), since the last piece's wait for its stores and
    /// the atomic sit on the critical path. A knob for other GPUs and shapes, and for
    /// callers whose host time matters (one launch instead of two: each costs the host
    /// about 4 us on the H100 machine, python_decode's host_overhead).
    pub fused_merge: bool,
    /// Token lists with a merge launch: the split counts each row's pieces as they are
    /// written and the merge combines a row as soon as its pieces are in, rather than
    /// after the whole split (see
    /// [`MergeConfig::row_signals`](crate::attention::MergeConfig)); the rows merged while
    /// the split's last programs still run leave only the last rows' merge after it. On an
    /// H100 it won 13 of 15 paired draws of the skewed group varlen case, by about 1.2% of
    /// the copy rate (benches/NOTES.md).
    pub row_signals: bool,
    /// The element type of the split's partial outputs: f32, f16 or bf16 (see
    /// [`SplitConfig::partial_dtype`](crate::attention::SplitConfig)). By default the
    /// inputs' type for f16 (half the partials' traffic, which with token lists is about
    /// an eighth of a step's bytes) and f32 for bf16, whose 8 bits of mantissa would
    /// add more error than the inputs' own rounding.
    pub partial_dtype: DType,
    /// K and V read as a stream that the caches evict first (see
    /// [`SplitConfig::stream_kv`](crate::attention::SplitConfig)). On by default: on an
    /// H100 it won 6 of 6 seeded draws of the skewed group varlen case by 1.8 to 3.0 points
    /// of the copy rate, as much with the metadata made cold before every run
    /// (`gpu-check attention --cold-meta 64`): the gain is within the step (the partials
    /// the merge reads back, the lists and pages read beside the stream), not metadata
    /// left in L2 by the run before.
    pub stream_kv: bool,
    /// Partial results the merge combines per step (a power of two up to 64; see
    /// [`MergeConfig::block_chunks`](crate::attention::MergeConfig)).
    pub merge_chunks: usize,
    /// Token lists, for diagnosis: every program writes its clock at its start, its first
    /// step and its end, and its SM, into a buffer the plan keeps
    /// ([`AttentionPlan::timeline`]; see
    /// [`SplitConfig::timeline`](crate::attention::SplitConfig)): where a launch's time
    /// goes, program by program, which event timings of the whole launch cannot say.
    pub timeline: bool,
}

/// Work items the default chunk size aims for, per multiprocessor (dense and padded).
const ITEMS_PER_SM: usize = 8;
/// The shortest default chunk of the one-warp programs of the tensor-core kernel. Short
/// items lost on an H100 even where they gave 16 warps an SM (batch 1, GQA 32/8, 8k
/// context: 128 tokens an item 29.5 us, 32 tokens 46.0 us; 32k: 256 tokens 67.7 us, 504
/// tokens 74.1 us, 128 tokens 87.2 us): every item starts with a chain of dependent loads
/// (list bounds, page, K and V) and ends with a partial result to merge.
const MIN_CHUNK_ONE_WARP: usize = 128;
/// The shortest segment of the balanced split of token lists, by default: each piece pays a
/// chain of dependent loads (list bounds, position, page, K and V) before its first step
/// and a partial result after its last, so pieces of under 8 steps would be mostly overhead.
const MIN_SEGMENT_LISTS: usize = 64;
/// What starting a piece of a row costs, in entries, by default (see
/// [`AttentionTuning::row_tokens`]): its chain of four dependent round trips to L2 takes
/// about 5 us at a launch's start on an H100 (the timeline, benches/NOTES.md), two to three
/// steps of 8 entries. On the skewed benchmark 24 beat 16 in 9 of 12 paired draws (by 0.3%
/// of copy on average: within the noise of one draw, not of twelve), and 0 lost 3%.
const ROW_TOKENS: u32 = 24;
/// Partial results the merge combines per step, by default: a row of up to 32 chunks or
/// pieces in one step of each pass.
const MERGE_CHUNKS: usize = 8;
/// The longest default chunk (dense and padded): long enough that partials cost under 1% of
/// the KV traffic, short enough that one long row does not become the tail of the batch.
const MAX_CHUNK: usize = 1024;
/// Dense chunks of at most this many tokens bring the next tile's K and V into L2 a step
/// early ([`AttentionTuning::l2_prefetch`]): short chunks are what a small batch gets, and
/// their programs are too few to keep DRAM busy. On an H100 under the harness (graph
/// replays, one process): batch 1 GQA 32/8 8k (chunks of 128) 19.3 us against 22.3, 32k
/// (256) 52.6 against 56.5, MHA 8k (256) 48.7 against 51.6; MHA 32k (chunks of 1000)
/// 191.2 against 185.2, and the long chunks of batch 32 no change (1465.7 against 1469.5).
const MAX_CHUNK_L2_PREFETCH: usize = 256;
/// Tokens a step of MHA's dense programs (4 warps, CUDA cores) over chunks longer than
/// [`MAX_CHUNK_L2_PREFETCH`]: on an H100 under the harness, one process
/// (varlen_attention_run/mha_block_sweep.json), 16 against 8 tokens a step: batch 32 8k
/// 1394.9 us against 1431.1, batch 1 32k 182.1 against 185.2, batch 64 32k 11116.3 against
/// 11133.5, batch 32 32k 5546.3 against 5540.8 and batch 64 8k 2811.3 against 2806.8 (within
/// the noise); the tuner's own runs found 16 the best at batch 16 8k and batch 1 128k (703.3
/// and 707.5 us against 755.9 and 760.6). Short chunks (batch 1 8k) lose: 58.6 against 48.5.
const MHA_LONG_CHUNK_TOKENS: usize = 16;
/// Programs an SM asked of ptxas for the dense tensor-core split over long chunks (those
/// without the L2 prefetch: batches large enough that every SM holds many chunks). 16 one-warp
/// programs instead of the 12 its registers allow keep a third more tiles of K and V in
/// flight. ptxas fitted the kernel in 128 registers with 16 bytes of spills (sm_90a), which
/// sat in the loop: ncu on an H200 counted 4.2 million local-memory requests in one batch 32
/// 32k launch, about 4 a step (varlen_attention_run/e871916_h200_ncu.log); under the cap the
/// group's queries now wait in shared memory instead of 16 registers a thread
/// ([`SplitConfig::min_programs_per_sm`]), and it fits with none (the timings below and the
/// H200's are from the kernel that spilled). On an H100 under
/// the harness, one process (89a5a91, GQA 32/8, varlen_attention_run/89a5a91_sweep.json):
/// batch 32 32k 1433.1 us against 1469.3, batch 64 32k 2863.6 against 2942.6, batch 32 8k
/// 370.2 against 374.9, batch 64 8k 728.3 against 740.0; short chunks lose (batch 1 8k 19.7
/// against 19.2), and so do token lists (a quarter of the pages 375.2 against 365.5), which
/// keep the registers' count. On an H200 (e871916_h200_gqa_sweep.json) 16 is still the best
/// or tied: no cap (180 registers, 11 programs) 1138.1 us against 1096.8 at batch 32 32k,
/// 287.6 against 265.6 at batch 32 8k; 20 and 24 lose 25-75%; 13 to 16 all give ptxas's 128.
pub const DENSE_LONG_PROGRAMS_PER_SM: u32 = 16;
/// The padded baseline's longest chunk: its rows are as long as the longest list, so a few
/// long rows would become the tail (token lists in this grid, before the balanced split,
/// measured on an H100: 512 against 1024 took 64 us instead of 87 on the skewed case).
const MAX_CHUNK_PADDED: usize = 512;

impl AttentionTuning {
    /// Defaults (timed on an H100, BENCHMARKS.md and benches/NOTES.md): GQA groups of 2 to 8
    /// at head_dim 64 or 128 on the tensor cores, 8 tokens a step on one warp (scores and
    /// P.V as `mma.sync`; 0.97-1.04x FlashInfer where the CUDA-core kernel below gave
    /// 0.85-0.90x). Otherwise 8 tokens a step on 4 warps with one tile of K and V prefetched
    /// (two was slower for GQA, within 1% for MHA); 16 tokens on 8 warps for head_dim 256 or
    /// 8 query heads a program, and 8 tokens a step for both (each head keeps a
    /// `[tokens, head_dim]` f32 accumulator, which would otherwise spill). Chunks sized so
    /// that, were every row `max_tokens` long, about 8 work items per SM would exist
    /// (`num_sms`, 132 when unknown), between 2 steps (128 tokens on the tensor cores) and
    /// 1024 tokens (512 padded), with the next tile brought into L2 early where dense chunks
    /// are short, 16 programs an SM asked for the tensor cores' long dense chunks (groups of
    /// up to 4), and MHA's long dense chunks walked 16 tokens a step. Token lists: segments
    /// of at least 64 tokens.
    pub fn for_spec(spec: &AttentionSpec, num_sms: usize) -> AttentionTuning {
        let group = program_group(spec);
        // head_dim 256 would need 64 registers of accumulator and 128 of K and V tiles in
        // one warp: it keeps the CUDA-core kernel.
        let tensor_cores = (2..=8).contains(&group) && spec.kv.head_dim <= 128;
        let (block_tokens, num_warps, prefetch) = if tensor_cores {
            (8, 1, 1)
        } else {
            default_tiling(spec.kv.head_dim, group)
        };
        let chunk = match spec.mode {
            // Token lists are split evenly over the GPU: the chunk is the shortest segment.
            AttentionMode::HeadVarlen | AttentionMode::GroupVarlen => {
                MIN_SEGMENT_LISTS.div_ceil(block_tokens) * block_tokens
            }
            AttentionMode::Dense | AttentionMode::Padded => {
                let rows = spec.batch * spec.num_q_heads / group;
                let want = (ITEMS_PER_SM * num_sms).max(1);
                let per_item = (spec.max_tokens * rows).div_ceil(want);
                let chunk = per_item
                    .div_ceil(block_tokens)
                    .max(2)
                    .saturating_mul(block_tokens)
                    .max(if tensor_cores { MIN_CHUNK_ONE_WARP } else { 0 });
                chunk.min(if spec.mode == AttentionMode::Dense {
                    MAX_CHUNK
                } else {
                    MAX_CHUNK_PADDED
                })
            }
        };
        // MHA over long dense chunks: 16 tokens a step (see MHA_LONG_CHUNK_TOKENS).
        let (block_tokens, chunk) = if spec.mode == AttentionMode::Dense
            && group == 1
            && spec.kv.head_dim <= 128
            && chunk > MAX_CHUNK_L2_PREFETCH
        {
            (
                MHA_LONG_CHUNK_TOKENS,
                chunk.div_ceil(MHA_LONG_CHUNK_TOKENS) * MHA_LONG_CHUNK_TOKENS,
            )
        } else {
            (block_tokens, chunk)
        };
        let l2_prefetch = spec.mode == AttentionMode::Dense && chunk <= MAX_CHUNK_L2_PREFETCH;
        AttentionTuning {
            block_tokens,
            num_warps,
            chunk_tokens: chunk,
            vector_bytes: 16,
            prefetch,
            min_programs_per_sm: if tensor_cores
                && spec.mode == AttentionMode::Dense
                && !l2_prefetch
                && group <= 4
            {
                DENSE_LONG_PROGRAMS_PER_SM
            } else {
                0
            },
            stages: 0,
            l2_prefetch,
            tensor_cores,
            chunk_fastest: false,
            list_programs: 0,
            row_tokens: ROW_TOKENS,
            merge_chunks: MERGE_CHUNKS,
            fused_merge: false,
            row_signals: true,
            partial_dtype: if spec.dtype == DType::F16 {
                DType::F16
            } else {
                DType::F32
            },
            stream_kv: true,
            timeline: false,
        }
    }
}

/// Tokens a step, warps and tiles prefetched of a split program serving `group` query
/// heads, by default; see [`AttentionTuning::for_spec`].
pub fn default_tiling(head_dim: usize, group: usize) -> (usize, u32, usize) {
    match (head_dim >= 256, group >= 8) {
        (true, true) => (8, 8, 1),
        (false, false) => (8, 4, 1),
        _ => (16, 8, 1),
    }
}

/// Query heads one program serves: the group, except in head varlen mode.
fn program_group(spec: &AttentionSpec) -> usize {
    match spec.mode {
        AttentionMode::HeadVarlen => 1,
        _ => spec.num_q_heads / spec.kv.num_kv_heads.max(1),
    }
}

/// Token-list rows per sequence in `mode`.
fn rows_per_batch(spec: &AttentionSpec) -> usize {
    match spec.mode {
        AttentionMode::HeadVarlen => spec.num_q_heads,
        _ => spec.kv.num_kv_heads,
    }
}

/// How the split kernel's work items are laid out.
enum Layout {
    /// Grid `(rows, max_chunks)` (dense, padded): partials `[q rows, max_chunks]`.
    Grid { max_chunks: usize },
    /// Token lists: `programs` split programs, one balanced segment each; partials
    /// `[programs + rows, group]`.
    Balanced { programs: usize },
}

/// A compiled, sized attention launch. See the module docs.
pub struct AttentionPlan {
    spec: AttentionSpec,
    tuning: AttentionTuning,
    split: Arc<LoadedKernel>,
    /// The merge launch; none when the split merges (token lists, `fused_merge`).
    merge: Option<Arc<LoadedKernel>>,
    /// Token lists: the rows' arrival counters when the split merges (`fused_merge`: zero
    /// between launches) or signals the merge (`row_signals`: the rows' counts of arrivals,
    /// then what each merge program has taken of them; see `counters_settled`).
    counters: Option<Buffer<i32>>,
    /// With [`AttentionTuning::timeline`]: [`TIMELINE_WORDS`] words a program, the split's
    /// programs first, then the merge's.
    timeline: Option<Buffer<i64>>,
    part_o: Partials,
    part_lse: Buffer<f32>,
    layout: Layout,
    rows: usize,
    scale_log2: f32,
    /// The split bounds-checks the page table it reads ([`AttentionPlan::for_device_table`]).
    checked_table: bool,
}

/// The split's partial outputs, in the type the plan's tuning chose.
enum Partials {
    F32(Buffer<f32>),
    F16(Buffer<half::f16>),
    BF16(Buffer<half::bf16>),
}

impl Partials {
    fn alloc(dusk: &Dusk, dtype: DType, len: usize) -> Result<Partials> {
        let dev = dusk.device();
        Ok(match dtype {
            DType::F16 => Partials::F16(dev.alloc(len)?),
            DType::BF16 => Partials::BF16(dev.alloc(len)?),
            _ => Partials::F32(dev.alloc(len)?),
        })
    }

    fn arg(&self) -> Arg<'_> {
        match self {
            Partials::F32(b) => Arg::from(b),
            Partials::F16(b) => Arg::from(b),
            Partials::BF16(b) => Arg::from(b),
        }
    }
}

/// Programs of `kernel` that fit on one SM at once, from its registers (64K registers
/// allocated per warp in units of 256, at most 64 warps and 32 programs); 8 on the CPU.
fn programs_per_sm(kernel: &LoadedKernel) -> usize {
    let Some(regs) = kernel.num_regs() else {
        return 8;
    };
    let warps = kernel.num_threads().div_ceil(32).max(1) as usize;
    let per_warp = (regs.max(1) as usize * 32).div_ceil(256) * 256;
    let fit_warps = (65536 / per_warp).min(64);
    (fit_warps / warps).clamp(1, 32)
}

/// The page table and token lists of one step, on the device.
pub struct AttentionMeta {
    mode: AttentionMode,
    batch: usize,
    /// The page table was written on the device (not checked on the host): only a plan
    /// made by [`AttentionPlan::for_device_table`] reads it.
    device_table: bool,
    kv_indptr: Buffer<i32>,
    kv_page_indices: Buffer<i32>,
    kv_last_page_len: Buffer<i32>,
    /// Lists: CSR offsets.
    sel_indptr: Option<Buffer<i32>>,
    /// Lists: positions; padded: `[rows, max_tokens]` positions.
    sel_indices: Option<Buffer<i32>>,
    /// Padded: the true length of each row.
    sel_lens: Option<Buffer<i32>>,
}

/// SparQ's output transform inputs: `alpha` per (batch, query head), f32, and the running
/// mean of V per (batch, KV head), `[batch * num_kv_heads, head_dim]`.
#[derive(Clone, Copy)]
pub struct SparqMix<'a, T: Element> {
    pub alpha: &'a Buffer<f32>,
    pub v_mean: &'a Buffer<T>,
}

impl AttentionMeta {
    /// The device token lists (`sel_indptr`, `sel_indices`) of a list mode, for whatever
    /// writes the next step's lists in place (the pruner, or a copy from the host) so that a
    /// captured graph, which holds these buffers' addresses, sees them.
    pub fn lists_mut(&mut self) -> Option<(&mut Buffer<i32>, &mut Buffer<i32>)> {
        match (&mut self.sel_indptr, &mut self.sel_indices) {
            (Some(a), Some(b)) => Some((a, b)),
            _ => None,
        }
    }

    /// The page table (`kv_indptr`, `kv_page_indices`, `kv_last_page_len`), for a pipeline
    /// step that rewrites a host-checked one on the device, kept in bounds by its own
    /// clamping (`pipeline::table`).
    pub(crate) fn table_buffers(&self) -> [&Buffer<i32>; 3] {
        [
            &self.kv_indptr,
            &self.kv_page_indices,
            &self.kv_last_page_len,
        ]
    }

    /// The device token lists of a list mode, for a kernel that writes them in place (a
    /// pruner's `run_lists_into`: launches write through shared references).
    pub fn lists(&self) -> Option<(&Buffer<i32>, &Buffer<i32>)> {
        match (&self.sel_indptr, &self.sel_indices) {
            (Some(a), Some(b)) => Some((a, b)),
            _ => None,
        }
    }
}

impl AttentionPlan {
    /// Plans `spec` with the default tuning.
    pub fn new(dusk: &Dusk, spec: AttentionSpec) -> Result<AttentionPlan> {
        Self::with_tuning(dusk, spec, |_| {})
    }

    /// As [`AttentionPlan::new`], with `tune` changing the default [`AttentionTuning`].
    pub fn with_tuning(
        dusk: &Dusk,
        spec: AttentionSpec,
        tune: impl FnOnce(&mut AttentionTuning),
    ) -> Result<AttentionPlan> {
        Self::build(dusk, spec, tune, false)
    }

    /// A plan whose runs read a page table that the device writes (an engine's converter,
    /// [`crate::engines`], run in the same captured step), through
    /// [`AttentionPlan::device_table_meta`]: the split clamps what it reads of the table
    /// (see [`SplitConfig::checked_table`]), so the table needs no host check and may change
    /// between runs, as the pruner's lists do. `spec.max_tokens` bounds every sequence
    /// (longer ones are cut) and sizes the grid.
    pub fn for_device_table(
        dusk: &Dusk,
        spec: AttentionSpec,
        tune: impl FnOnce(&mut AttentionTuning),
    ) -> Result<AttentionPlan> {
        Self::build(dusk, spec, tune, true)
    }

    fn build(
        dusk: &Dusk,
        spec: AttentionSpec,
        tune: impl FnOnce(&mut AttentionTuning),
        checked_table: bool,
    ) -> Result<AttentionPlan> {
        spec.kv.validate()?;
        ensure!(spec.batch > 0, "batch", "at least 1", spec.batch);
        let hkv = spec.kv.num_kv_heads;
        ensure!(
            spec.num_q_heads > 0 && spec.num_q_heads.is_multiple_of(hkv),
            "num_q_heads",
            format!("a positive multiple of num_kv_heads ({hkv})"),
            spec.num_q_heads,
        );
        let group = spec.num_q_heads / hkv;
        ensure!(
            group.is_power_of_two() && group <= 16,
            "num_q_heads",
            "a group (q heads per KV head) of 1, 2, 4, 8 or 16",
            group,
        );
        ensure!(
            matches!(spec.dtype, DType::F16 | DType::BF16),
            "dtype",
            "f16 or bf16",
            spec.dtype.name(),
        );
        ensure!(
            spec.max_tokens > 0 && spec.max_tokens < (1 << 30),
            "max_tokens",
            "1 to 2^30 - 1",
            spec.max_tokens,
        );
        if let Some(s) = spec.sm_scale {
            ensure!(
                s.is_finite() && s > 0.0,
                "sm_scale",
                "a finite positive scale",
                s,
            );
        }
        let sms = dusk.device().num_sms().unwrap_or(132) as usize;
        let mut tuning = AttentionTuning::for_spec(&spec, sms);
        tune(&mut tuning);
        let bt = tuning.block_tokens;
        ensure!(
            bt.is_power_of_two() && (8..=128).contains(&bt),
            "block_tokens",
            "a power of two in 8..=128",
            bt,
        );
        ensure!(
            tuning.num_warps.is_power_of_two() && (1..=16).contains(&tuning.num_warps),
            "num_warps",
            "1, 2, 4, 8 or 16",
            tuning.num_warps,
        );
        ensure!(
            matches!(tuning.vector_bytes, 16 | 32),
            "vector_bytes",
            "16 or 32",
            tuning.vector_bytes,
        );
        ensure!(
            matches!(tuning.prefetch, 1 | 2),
            "prefetch",
            "1 or 2",
            tuning.prefetch,
        );
        ensure!(
            tuning.min_programs_per_sm <= 32,
            "min_programs_per_sm",
            "at most 32",
            tuning.min_programs_per_sm,
        );
        ensure!(
            tuning.chunk_tokens > 0 && tuning.chunk_tokens.is_multiple_of(bt),
            "chunk_tokens",
            format!("a positive multiple of block_tokens ({bt})"),
            tuning.chunk_tokens,
        );
        ensure!(
            matches!(tuning.partial_dtype, DType::F32 | DType::F16 | DType::BF16),
            "partial_dtype",
            "f32, f16 or bf16",
            tuning.partial_dtype.name(),
        );
        ensure!(
            tuning.merge_chunks.is_power_of_two() && tuning.merge_chunks <= 64,
            "merge_chunks",
            "a power of two up to 64",
            tuning.merge_chunks,
        );
        let pg = program_group(&spec);
        let lists = matches!(
            spec.mode,
            AttentionMode::HeadVarlen | AttentionMode::GroupVarlen
        );
        ensure!(
            !tuning.tensor_cores || ((2..=8).contains(&pg) && bt == 8 && tuning.num_warps == 1),
            "tensor_cores",
            "a group of 2 to 8 query heads a program, block_tokens 8 and num_warps 1",
            format!(
                "group {pg}, block_tokens {bt}, num_warps {}",
                tuning.num_warps
            ),
        );
        ensure!(
            tuning.stages == 0
                || ((2..=6).contains(&tuning.stages)
                    && tuning.tensor_cores
                    && spec.kv.head_dim <= 128
                    && tuning.vector_bytes == 16
                    && tuning.prefetch == 1
                    && !tuning.l2_prefetch
                    && !tuning.stream_kv),
            "stages",
            "0, or 2 to 6 with tensor_cores, head_dim up to 128, vector_bytes 16, prefetch 1, \
             and l2_prefetch and stream_kv off",
            format!(
                "{} (tensor_cores {}, head_dim {}, vector_bytes {}, prefetch {}, l2_prefetch {}, \
                 stream_kv {})",
                tuning.stages,
                tuning.tensor_cores,
                spec.kv.head_dim,
                tuning.vector_bytes,
                tuning.prefetch,
                tuning.l2_prefetch,
                tuning.stream_kv
            ),
        );
        let rows = spec.batch * spec.num_q_heads / pg;
        ensure!(
            lists || !tuning.timeline,
            "timeline",
            "token lists (the balanced split keeps a timeline)",
            format!("{:?}", spec.mode),
        );
        ensure!(
            !(lists && tuning.chunk_fastest),
            "chunk_fastest",
            "false for token lists (they are split evenly over a 1-D grid)",
            true,
        );
        ensure!(
            !tuning.chunk_fastest || rows <= 65535,
            "chunk_fastest",
            "at most 65535 rows (the grid's second axis)",
            rows,
        );
        let q_rows = spec.batch * spec.num_q_heads;
        let max_chunks = spec.max_tokens.div_ceil(tuning.chunk_tokens);
        ensure!(
            lists || max_chunks <= 65535,
            "chunk_tokens",
            "at most 65535 chunks per row",
            max_chunks,
        );
        let split_cfg = SplitConfig {
            head_dim: spec.kv.head_dim,
            page_size: spec.kv.page_size,
            group: pg,
            dtype: spec.dtype,
            source: match spec.mode {
                AttentionMode::Dense => TokenSource::Dense,
                AttentionMode::Padded => TokenSource::Padded,
                _ => TokenSource::Lists,
            },
            block_tokens: bt,
            num_warps: tuning.num_warps,
            vector_bytes: tuning.vector_bytes,
            prefetch: tuning.prefetch,
            min_programs_per_sm: tuning.min_programs_per_sm,
            stages: tuning.stages,
            l2_prefetch: tuning.l2_prefetch,
            tensor_cores: tuning.tensor_cores,
            chunk_fastest: tuning.chunk_fastest,
            balanced: lists,
            fused_merge: tuning.fused_merge,
            row_signals: lists && !tuning.fused_merge && tuning.row_signals,
            partial_dtype: tuning.partial_dtype,
            stream_kv: tuning.stream_kv,
            sparq: spec.sparq,
            merge_chunks: tuning.merge_chunks,
            timeline: tuning.timeline,
            checked_table,
        };
        let merge_cfg = MergeConfig {
            head_dim: spec.kv.head_dim,
            dtype: spec.dtype,
            sparq: spec.sparq,
            block_chunks: tuning.merge_chunks,
            balanced: lists,
            row_signals: split_cfg.row_signals,
            partial_dtype: tuning.partial_dtype,
            timeline: tuning.timeline,
        };
        let split = dusk.kernel(format!("{split_cfg:?}"), || {
            attention::build_split(&split_cfg)
        })?;
        let merge = if split_cfg.fused_merge {
            None
        } else {
            Some(dusk.kernel(format!("{merge_cfg:?}"), || {
                attention::build_merge(&merge_cfg)
            })?)
        };
        let dev = dusk.device();
        let (layout, slots) = if lists {
            let programs = match tuning.list_programs {
                0 => sms * programs_per_sm(&split),
                n => n as usize,
            };
            // Pieces: at most one per segment plus one per row start inside a segment; the
            // merge inside the split keeps as many again for groups of pieces.
            let pieces = (programs + rows) * (1 + tuning.fused_merge as usize);
            (Layout::Balanced { programs }, pieces * pg)
        } else {
            (Layout::Grid { max_chunks }, q_rows * max_chunks)
        };
        ensure!(
            slots * spec.kv.head_dim < (1 << 31),
            "max_tokens",
            "partial results under 2^31 values",
            slots * spec.kv.head_dim,
        );
        let scale = spec
            .sm_scale
            .unwrap_or(1.0 / (spec.kv.head_dim as f32).sqrt());
        Ok(AttentionPlan {
            spec,
            tuning,
            split,
            merge,
            counters: match &layout {
                Layout::Balanced { programs } if split_cfg.fused_merge => {
                    Some(dev.upload(&vec![0i32; programs + 2 * rows])?)
                }
                // The grid's merge inside the split: one counter a row.
                Layout::Grid { .. } if split_cfg.fused_merge => {
                    Some(dev.upload(&vec![0i32; rows])?)
                }
                _ if split_cfg.row_signals => Some(dev.upload(&vec![0i32; rows + q_rows])?),
                _ => None,
            },
            timeline: match &layout {
                Layout::Balanced { programs } if tuning.timeline => {
                    Some(dev.upload(&vec![0i64; (programs + q_rows) * TIMELINE_WORDS])?)
                }
                _ => None,
            },
            part_o: Partials::alloc(dusk, tuning.partial_dtype, slots * spec.kv.head_dim)?,
            part_lse: dev.alloc(slots)?,
            layout,
            rows,
            scale_log2: scale * std::f32::consts::LOG2_E,
            checked_table,
        })
    }

    pub fn spec(&self) -> &AttentionSpec {
        &self.spec
    }
    /// Whether the rows' counters are as every launch must leave them, whatever its lists
    /// said (for checks; a download, so a sync): with the merge inside the split
    /// ([`AttentionTuning::fused_merge`]) all zero; with row signals
    /// ([`AttentionTuning::row_signals`]) each merge program's count taken equal to its
    /// row's count of arrivals. True where the plan keeps no counters.
    pub fn counters_settled(&self) -> Result<bool> {
        let Some(c) = &self.counters else {
            return Ok(true);
        };
        let c = c.download()?;
        Ok(if self.merge.is_none() {
            c.iter().all(|&x| x == 0)
        } else {
            let (arrivals, taken) = c.split_at(self.rows);
            let group = taken.len() / self.rows;
            taken
                .iter()
                .enumerate()
                .all(|(q, &t)| t == arrivals[q / group])
        })
    }
    /// With [`AttentionTuning::timeline`], the last run's records: [`TIMELINE_WORDS`] i64
    /// words a program, the split's programs (`grid()[0]` of them) first, each `[start,
    /// row search done, first step, end, SM, 0, 0, 0]` (end 0: no segment), then the
    /// merge's, one a query row, each `[start, past its wait, end, SM, 0, ...]`; clocks in
    /// nanoseconds (`%globaltimer`).
    pub fn timeline(&self) -> Option<&Buffer<i64>> {
        self.timeline.as_ref()
    }
    pub fn tuning(&self) -> &AttentionTuning {
        &self.tuning
    }
    /// The split kernel's grid: (rows, chunks per row), or with token lists the programs
    /// of the balanced split.
    pub fn grid(&self) -> [u32; 3] {
        match &self.layout {
            Layout::Balanced { programs } => [*programs as u32, 1, 1],
            Layout::Grid { max_chunks } if self.tuning.chunk_fastest => {
                [*max_chunks as u32, self.rows as u32, 1]
            }
            Layout::Grid { max_chunks } => [self.rows as u32, *max_chunks as u32, 1],
        }
    }

    /// Uploads `table` and (for the list modes) `lists`, after checking them: the page
    /// table against the cache, each list's rows against the mode (one per query head in
    /// head varlen, per KV head otherwise), every position inside its sequence, and no row
    /// (dense: no sequence) longer than the plan's `max_tokens`.
    pub fn upload_meta(
        &self,
        dusk: &Dusk,
        table: &PageTable,
        lists: Option<&TokenLists>,
    ) -> Result<AttentionMeta> {
        let spec = &self.spec;
        let ps = spec.kv.page_size;
        let dev = dusk.device();
        let mut meta = self.upload_meta_table(dusk, table)?;
        if spec.mode == AttentionMode::Dense {
            if lists.is_some() {
                return Err(invalid("lists", "none in dense mode", "token lists"));
            }
            let longest = (0..spec.batch)
                .map(|b| table.seq_len(b, ps))
                .max()
                .unwrap_or(0);
            ensure!(
                longest <= spec.max_tokens,
                "kv_last_page_len",
                format!("sequences of at most max_tokens ({})", spec.max_tokens),
                longest,
            );
            return Ok(meta);
        }
        let lists = lists.ok_or_else(|| {
            invalid(
                "lists",
                format!("token lists in {:?} mode", spec.mode),
                "none",
            )
        })?;
        lists.validate("lists", table, ps, rows_per_batch(spec))?;
        ensure!(
            lists.max_row_len() <= spec.max_tokens,
            "lists",
            format!("rows of at most max_tokens ({})", spec.max_tokens),
            lists.max_row_len(),
        );
        if spec.mode == AttentionMode::Padded {
            let w = spec.max_tokens;
            let mut padded = vec![0i32; lists.rows() * w];
            let mut lens = vec![];
            for r in 0..lists.rows() {
                let row = lists.row(r);
                padded[r * w..r * w + row.len()].copy_from_slice(row);
                lens.push(row.len() as i32);
            }
            meta.sel_indices = Some(dev.upload(&padded)?);
            meta.sel_lens = Some(dev.upload(&lens)?);
        } else {
            meta.sel_indptr = Some(dev.upload(&lists.indptr)?);
            meta.sel_indices = Some(dev.upload(&nonempty(&lists.indices))?);
        }
        Ok(meta)
    }

    /// Metadata around token lists that the GPU wrote (e.g. the top-p pruner's output):
    /// `sel_indptr` must have one entry per row plus one. Their contents are not read on the
    /// host; the kernels read no entry outside `sel_indices` and no offset outside
    /// `sel_indptr`, skip positions outside their sequence, and place every partial result
    /// inside the plan's buffers whatever the offsets say (rows longer than `max_tokens` are
    /// computed whole: the balanced split's work follows the lists' total length), so bad
    /// lists give wrong answers but never bad memory accesses.
    pub fn device_meta(
        &self,
        dusk: &Dusk,
        table: &PageTable,
        sel_indptr: Buffer<i32>,
        sel_indices: Buffer<i32>,
    ) -> Result<AttentionMeta> {
        let spec = &self.spec;
        ensure!(
            matches!(
                spec.mode,
                AttentionMode::HeadVarlen | AttentionMode::GroupVarlen
            ),
            "mode",
            "HeadVarlen or GroupVarlen for device lists",
            format!("{:?}", spec.mode),
        );
        let rows = spec.batch * rows_per_batch(spec);
        ensure!(
            sel_indptr.len() == rows + 1,
            "sel_indptr",
            format!("{} entries (rows + 1)", rows + 1),
            sel_indptr.len(),
        );
        let mut meta = self.upload_meta_table(dusk, table)?;
        meta.sel_indptr = Some(sel_indptr);
        meta.sel_indices = Some(sel_indices);
        Ok(meta)
    }

    /// Metadata around a page table that the GPU writes (e.g.
    /// [`crate::engines::vllm_to_csr`]'s output), for a plan made by
    /// [`AttentionPlan::for_device_table`]: `kv_indptr` (`batch + 1` entries),
    /// `kv_page_indices` (its capacity) and `kv_last_page_len` (`batch`), and for the list
    /// modes the device lists as [`AttentionPlan::device_meta`] takes them. Their contents
    /// are not read on the host; each run reads them as they are then, clamped by the
    /// split (bad entries give wrong answers, never bad memory accesses).
    pub fn device_table_meta(
        &self,
        kv_indptr: Buffer<i32>,
        kv_page_indices: Buffer<i32>,
        kv_last_page_len: Buffer<i32>,
        lists: Option<(Buffer<i32>, Buffer<i32>)>,
    ) -> Result<AttentionMeta> {
        let spec = &self.spec;
        ensure!(
            self.checked_table,
            "kv_indptr",
            "a host page table (this plan was not made for device tables: for_device_table)",
            "a device page table",
        );
        let b = spec.batch;
        ensure!(
            kv_indptr.len() == b + 1,
            "kv_indptr",
            format!("{} entries (batch + 1)", b + 1),
            kv_indptr.len(),
        );
        ensure!(
            kv_last_page_len.len() == b,
            "kv_last_page_len",
            format!("{b} entries (batch)"),
            kv_last_page_len.len(),
        );
        // Positions (pages x page_size) stay in i32 whatever the offsets say.
        let most = (i32::MAX as usize) / spec.kv.page_size;
        ensure!(
            (1..=most).contains(&kv_page_indices.len()),
            "kv_page_indices",
            format!("1 to {most} entries"),
            kv_page_indices.len(),
        );
        let (sel_indptr, sel_indices) = match (spec.mode, lists) {
            (AttentionMode::Dense, None) => (None, None),
            (AttentionMode::Dense, Some(_)) => {
                return Err(invalid("lists", "none in dense mode", "token lists"))
            }
            (AttentionMode::HeadVarlen | AttentionMode::GroupVarlen, Some((ip, ix))) => {
                let rows = b * rows_per_batch(spec);
                ensure!(
                    ip.len() == rows + 1,
                    "sel_indptr",
                    format!("{} entries (rows + 1)", rows + 1),
                    ip.len(),
                );
                (Some(ip), Some(ix))
            }
            (mode, _) => {
                return Err(invalid(
                    "lists",
                    "device lists in HeadVarlen or GroupVarlen mode, none in Dense",
                    format!("{mode:?}"),
                ))
            }
        };
        Ok(AttentionMeta {
            mode: spec.mode,
            batch: b,
            device_table: true,
            kv_indptr,
            kv_page_indices,
            kv_last_page_len,
            sel_indptr,
            sel_indices,
            sel_lens: None,
        })
    }

    fn upload_meta_table(&self, dusk: &Dusk, table: &PageTable) -> Result<AttentionMeta> {
        table.validate(&self.spec.kv)?;
        ensure!(
            table.batch() == self.spec.batch,
            "kv_indptr",
            format!("{} sequences (the plan's batch)", self.spec.batch),
            table.batch(),
        );
        let dev = dusk.device();
        Ok(AttentionMeta {
            mode: self.spec.mode,
            batch: self.spec.batch,
            device_table: false,
            kv_indptr: dev.upload(&table.kv_indptr)?,
            kv_page_indices: dev.upload(&nonempty(&table.kv_page_indices))?,
            kv_last_page_len: dev.upload(&table.kv_last_page_len)?,
            sel_indptr: None,
            sel_indices: None,
            sel_lens: None,
        })
    }

    /// Attention of `q` (`[batch, num_q_heads, head_dim]`) over `k` and `v` (the cache) as
    /// `meta` selects; writes `out` (same shape as `q`) and `lse` (f32 per query row,
    /// natural log, `-inf` for an empty row, whose output is zero). `sparq` must be given
    /// exactly when the plan was made with `sparq`. Two launches (the merge may start during
    /// the split's last programs and waits on the device, with token lists for each row's
    /// pieces: [`AttentionTuning::row_signals`]), or one when the split merges
    /// ([`AttentionTuning::fused_merge`]); no allocation, no sync.
    #[allow(clippy::too_many_arguments)]
    pub fn run<T: Element>(
        &self,
        dusk: &Dusk,
        q: &Buffer<T>,
        k: &Buffer<T>,
        v: &Buffer<T>,
        meta: &AttentionMeta,
        sparq: Option<SparqMix<'_, T>>,
        out: &mut Buffer<T>,
        lse: &mut Buffer<f32>,
    ) -> Result<()> {
        let spec = &self.spec;
        ensure!(
            T::DTYPE == spec.dtype,
            "q",
            format!("{} values (the plan's dtype)", spec.dtype.name()),
            T::DTYPE.name(),
        );
        let d = spec.kv.head_dim;
        let q_rows = spec.batch * spec.num_q_heads;
        ensure!(
            q.len() == q_rows * d,
            "q",
            format!("{} values (batch x q heads x head_dim)", q_rows * d),
            q.len(),
        );
        for (name, b) in [("k", k), ("v", v)] {
            ensure!(
                b.len() == spec.kv.elements(),
                name,
                format!("{} values ({:?})", spec.kv.elements(), spec.kv),
                b.len(),
            );
        }
        ensure!(
            out.len() == q_rows * d,
            "out",
            format!("{} values", q_rows * d),
            out.len(),
        );
        ensure!(
            lse.len() == q_rows,
            "lse",
            format!("{q_rows} values"),
            lse.len(),
        );
        ensure!(
            meta.mode == spec.mode && meta.batch == spec.batch,
            "meta",
            format!(
                "metadata of this plan ({:?}, batch {})",
                spec.mode, spec.batch
            ),
            format!("{:?}, batch {}", meta.mode, meta.batch),
        );
        ensure!(
            !meta.device_table || self.checked_table,
            "meta",
            "host-checked metadata (a device page table needs a plan made by for_device_table)",
            "a device page table",
        );
        ensure!(
            sparq.is_some() == spec.sparq,
            "sparq",
            if spec.sparq {
                "alpha and v_mean (the plan applies SparQ's transform)"
            } else {
                "none (the plan was made without sparq)"
            },
            if sparq.is_some() { "given" } else { "none" },
        );
        if let Some(s) = &sparq {
            ensure!(
                s.alpha.len() == q_rows,
                "alpha",
                format!("{q_rows} values"),
                s.alpha.len(),
            );
            let vm = spec.batch * spec.kv.num_kv_heads * d;
            ensure!(
                s.v_mean.len() == vm,
                "v_mean",
                format!("{vm} values"),
                s.v_mean.len(),
            );
        }
        // Entries of `sel_indices` the kernels may read (lists only).
        let num_indices = meta
            .sel_indices
            .as_ref()
            .map_or(0, |ix| ix.len().min(i32::MAX as usize) as i32);
        let mut args = vec![
            Arg::from(q),
            Arg::from(k),
            Arg::from(v),
            Arg::from(&meta.kv_indptr),
            Arg::from(&meta.kv_page_indices),
            Arg::from(&meta.kv_last_page_len),
        ];
        match spec.mode {
            AttentionMode::Dense => {}
            AttentionMode::Padded => {
                args.push(Arg::from(meta.sel_indices.as_ref().expect("padded meta")));
                args.push(Arg::from(meta.sel_lens.as_ref().expect("padded meta")));
            }
            _ => {
                args.push(Arg::from(meta.sel_indptr.as_ref().expect("list meta")));
                args.push(Arg::from(meta.sel_indices.as_ref().expect("list meta")));
            }
        }
        let dev = dusk.device();
        args.extend([self.part_o.arg(), Arg::from(&self.part_lse)]);
        if let Some(counters) = &self.counters {
            if self.merge.is_none() {
                args.extend([Arg::from(&*out), Arg::from(&*lse)]);
                if let Some(s) = &sparq {
                    args.extend([Arg::from(s.alpha), Arg::from(s.v_mean)]);
                }
            }
            args.push(Arg::from(counters));
        }
        if let Some(t) = &self.timeline {
            args.push(Arg::from(t));
        }
        args.extend([
            Arg::I32(spec.num_q_heads as i32),
            Arg::I32(spec.kv.num_kv_heads as i32),
        ]);
        match &self.layout {
            Layout::Grid { max_chunks } => args.extend([
                Arg::I32(self.tuning.chunk_tokens as i32),
                Arg::I32(*max_chunks as i32),
            ]),
            Layout::Balanced { .. } => args.extend([
                Arg::I32(self.rows as i32),
                Arg::I32(self.tuning.chunk_tokens as i32),
                Arg::I32(self.tuning.row_tokens as i32),
            ]),
        }
        match spec.mode {
            AttentionMode::Dense => {}
            AttentionMode::Padded => args.push(Arg::I32(spec.max_tokens as i32)),
            _ => args.push(Arg::I32(num_indices)),
        }
        args.push(Arg::F32(self.scale_log2));
        if self.checked_table {
            args.extend([
                Arg::I32(spec.kv.num_pages as i32),
                Arg::I32(meta.kv_page_indices.len().min(i32::MAX as usize) as i32),
            ]);
        }
        dev.launch(&self.split, self.grid(), &args)?;
        let Some(merge) = &self.merge else {
            return Ok(());
        };
        let mut margs = vec![
            self.part_o.arg(),
            Arg::from(&self.part_lse),
            Arg::from(&*out),
            Arg::from(&*lse),
        ];
        if let Some(s) = &sparq {
            margs.push(Arg::from(s.alpha));
            margs.push(Arg::from(s.v_mean));
        }
        match &self.layout {
            Layout::Grid { max_chunks } => margs.push(Arg::I32(*max_chunks as i32)),
            Layout::Balanced { programs } => {
                margs.push(Arg::from(meta.sel_indptr.as_ref().expect("list meta")));
                if let Some(counters) = &self.counters {
                    margs.push(Arg::from(counters));
                }
                if let Some(t) = &self.timeline {
                    margs.push(Arg::from(t));
                }
                margs.extend([
                    Arg::I32((spec.batch * spec.num_q_heads / self.rows) as i32),
                    Arg::I32(self.rows as i32),
                    Arg::I32(*programs as i32),
                    Arg::I32(num_indices),
                    Arg::I32(self.tuning.chunk_tokens as i32),
                    Arg::I32(self.tuning.row_tokens as i32),
                ]);
            }
        }
        if spec.sparq {
            margs.push(Arg::I32(spec.num_q_heads as i32));
            margs.push(Arg::I32(spec.kv.num_kv_heads as i32));
        }
        dev.launch(merge, [q_rows as u32, 1, 1], &margs)?;
        Ok(())
    }
}

/// `v`, or one zero when it is empty (devices refuse empty allocations; the kernel reads
/// no entry of an empty table).
fn nonempty(v: &[i32]) -> Vec<i32> {
    if v.is_empty() {
        vec![0]
    } else {
        v.to_vec()
    }
}
