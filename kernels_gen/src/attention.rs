//! Varlen sparse paged decode attention (Twilight Section 4.2 "Load Balancing", Appendix
//! B.2), split over the KV sequence and merged by log-sum-exp (flash-decoding).
//!
//! Two kernels, one source for every mode:
//!
//! - [`build_split`]: one program per work item: a (row, chunk) of the grid, or the pieces
//!   of one balanced segment (token lists). A row is one query head (head varlen, G = 1) or
//!   one KV head with its whole group of G query heads (dense, group varlen, padded: each K
//!   and V row is read once and used for all G heads). A chunk is `chunk_tokens`
//!   consecutive entries of the row's token list. The program walks its chunk
//!   `block_tokens` at a time and writes, per query head, the chunk's normalised output
//!   and its log-sum-exp (base 2) to the partial buffers; in the grid, a chunk past the end
//!   of its row writes only `lse = -inf`, so the merge needs no metadata.
//! - [`build_merge`]: one program per (batch, query head): combines the row's chunks by
//!   their log-sum-exp, writes the output in the input dtype and the natural-log LSE, and
//!   optionally applies SparQ's output transform `alpha * y + (1 - alpha) * v_mean`.
//!   With token lists the split counts each row's written pieces and the merge takes a row
//!   as soon as they are all in ([`SplitConfig::row_signals`]), so most rows are merged
//!   while the split's last programs still run; or the split merges itself
//!   ([`SplitConfig::fused_merge`]): the last program to finish a piece of a row, counted
//!   per row, merges it.
//!
//! Dense and padded: the grid is `(rows, max_chunks)`, fixed by the plan from a maximum
//! budget. Token lists are split evenly (see `balanced_segments`): a fixed grid of about
//! as many programs as fit on the GPU at once cuts the lists' entries, taken end to end, into
//! one equal segment each; a program computes the pieces of the rows its segment covers
//! (usually one or two) and the merge finds a row's pieces by arithmetic alone. Lists that
//! the GPU pruner writes can change every step without the host seeing them, and skewed
//! lists (a few long rows, many short ones) give every program the same number of tokens,
//! where chunks of a row left the programs holding short chunks idle (benches/NOTES.md).
//! Before its first tile a program waits on the row search, then the positions (beside the
//! sequence's metadata), the pages, K and V: the search's loads also give the first row's
//! list offsets, and each next row's are loaded a row ahead, so they cost no round trip to
//! L2 of their own (with the merge inside the split, each row loads its own).
//!
//! Softmax inside a program keeps one running maximum *per token slot* of the tile (a
//! `[block_tokens]` vector) rather than one per row, so the loop needs no reduction across
//! warps; the slots are combined once at the end. Masked slots use a finite sentinel
//! (`-1e30`) so no `inf - inf` can make a NaN.
//!
//! GQA on the tensor cores (the default for groups of 2 to 8, head_dim 64 and 128): one warp
//! a program, 8 tokens a step. The group's queries, padded to 8 rows, and the tile's K are
//! one `dot` (`mma.sync`), giving scores `[8 heads, 8 tokens]`; the online softmax keeps one
//! maximum per head (a 4-lane reduction a step) and the weights `P` go back in f16 as the B
//! operand of `dot_ta(V, P)`, which adds `V^T P^T` into one `[head_dim, 8 heads]` f32
//! accumulator. Per thread and step that is 16 `mma`, 4 `ldmatrix` and a few dozen other
//! instructions whatever the group, where the CUDA-core kernel below spent about 90 a token.
//!
//! K and V staged through shared memory (a tuning option, [`SplitConfig::stages`]): the
//! tensor-core program copies the tiles of the next `stages - 1` steps into a ring of shared
//! memory by `cp.async` ([`KernelBuilder::async_copy`]), holding no registers for them; `dot`
//! reads K's fragments from the stage and `dot_ta` V's by `ldmatrix .trans`
//! ([`KernelBuilder::load_tile`]). On an H200 it was slower than the registers in every GQA
//! case but batch 1 at 8k (benches/NOTES.md), so the plans keep it off.
//!
//! GQA on the CUDA cores (a tuning option; head_dim 256): the G query heads of a program
//! are a static loop over the group inside the tile loop (the IR has 2-D blocks), each with
//! its own `[block_tokens, head_dim]` accumulator; registers grow with `block_tokens * G`,
//! which is what bounds occupancy.
//!
//! The tile loop is software-pipelined: the K and V rows of the next tile, the page-table
//! entries of the one after and (lists) the positions of the one after that are requested
//! before the current tile is computed, so the chain position -> page -> row never stalls.
//!
//! Token positions outside `0..seq_len`, and list entries outside `sel_indices`, are treated
//! as absent (the host checks lists it is given; this keeps lists made on the device from
//! reading outside the cache or the lists).

use crate::timeline::{open_record, stamp};
use dusk_compiler::{BinOp, CacheLevel, CompileError, DType, Kernel, KernelBuilder, Value};

/// Where a row's token positions come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TokenSource {
    /// Every token of the sequence, from the page table alone.
    Dense,
    /// A CSR list per row (`sel_indptr`, `sel_indices`).
    Lists,
    /// Every row padded to `max_len` entries (`sel_indices` is `[rows, max_len]`), with the
    /// true lengths in `sel_lens`: all `max_len` K and V rows are read, the padding masked
    /// out of the softmax. The baseline that varlen is measured against.
    Padded,
}

/// Compile-time choices of the split kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SplitConfig {
    pub head_dim: usize,
    pub page_size: usize,
    /// Query heads per program: 1 (head varlen) or the GQA group (read K and V once).
    pub group: usize,
    /// Element type of q, K and V (f16 or bf16).
    pub dtype: DType,
    pub source: TokenSource,
    /// Tokens per loop iteration.
    pub block_tokens: usize,
    pub num_warps: u32,
    /// Bytes of a K or V row each thread reads (16 or 32): 32 halves the lanes a row spans
    /// and so the shuffles of each score's reduction, at twice the registers per row.
    pub vector_bytes: u32,
    /// Tiles of K and V in flight ahead of the one being computed (1 or 2). On an H100, 2
    /// was slower for GQA and within 1% for MHA (benches/NOTES.md); it stays a tuning knob.
    pub prefetch: usize,
    /// Programs per SM asked of ptxas (0: none), capping registers to fit them. The
    /// tensor-core split with K and V in registers then keeps the group's queries in shared
    /// memory and reads them each step, where held in registers they made ptxas spill in
    /// the loop at 16 programs an SM.
    pub min_programs_per_sm: u32,
    /// Tensor cores only: K and V staged through a ring of this many tiles of shared memory
    /// by asynchronous copies (`cp.async`, [`KernelBuilder::async_copy`]), the next
    /// `stages - 1` tiles in flight while one is computed, instead of through registers (0):
    /// bytes in flight then cost no registers, and `dot` and `dot_ta` read the tile where
    /// it lies. 2 to 6 (each stage 2 x 8 rows of `head_dim + 8` elements).
    pub stages: usize,
    /// The K and V rows of the tile after the prefetched ones brought into L2 a step early
    /// (`prefetch.global.L2`: no registers held), its pages loaded a step earlier still: the
    /// bytes in flight of a program are no longer bounded by the tiles its registers hold.
    pub l2_prefetch: bool,
    /// Scores and the weighted sum of V on the tensor cores (`dot`, `dot_ta`): the group's
    /// heads are the rows of one product, so each thread does the same work whatever the
    /// group and keeps one `[head_dim, 8]` accumulator for all heads. Needs a group of 2 to
    /// 8, 8 tokens a step and one warp a program (see [`build_split`]).
    pub tensor_cores: bool,
    /// The grid is `(max_chunks, rows)` instead of `(rows, max_chunks)`: the GPU starts
    /// programs in grid order, so a row's chunks then start together rather than one wave
    /// of first chunks, then one of second chunks, ... which leaves the long rows of skewed
    /// lists (and the empty items of short ones) to the last waves.
    pub chunk_fastest: bool,
    /// Token lists split evenly over a fixed 1-D grid (`balanced_segments`) instead of
    /// the `(rows, max_chunks)` grid: no empty programs however short the lists are against
    /// the plan's maximum, and the same number of tokens in every program.
    pub balanced: bool,
    /// With `balanced`: the merge done inside the split. Each program that holds a piece
    /// of a row counts its arrival at the row's counter ([`OpKind::Arrive`]); the last
    /// combines the row's pieces, writes the output and zeroes the counter (programs find
    /// the rows they hold by the merge's own arithmetic, so each counter sees exactly its
    /// row's arrivals whatever the lists say), so no merge launch follows and
    /// the merging of rows overlaps the split's other programs instead of following them
    /// all. Measured on an H100 it lost (skewed group varlen 44.6 us against 40.8 with the
    /// merge launch, though skipping that launch would save about 15%): the last piece
    /// waits for its stores, the atomic and the merge, on the kernel's critical path.
    /// In the grid (dense, padded): every chunk's program arrives at its row's counter
    /// (`[rows]`) and the last of the row's `max_chunks` merges the group's query rows
    /// (`merge_chunks_if_last`): one launch a run, for callers whose host time counts (a
    /// model's decode step at batch 32, 32k: 0.33% more GPU time, python_decode.json).
    ///
    /// [`OpKind::Arrive`]: dusk_compiler::ir::OpKind::Arrive
    pub fused_merge: bool,
    /// With `balanced` and without `fused_merge`: a pointer parameter `counters` (the
    /// merge's, see [`MergeConfig::row_signals`]) after `part_lse`; a program that has
    /// written a piece of row r adds 1 to counter r ([`OpKind::Signal`]), so the merge can
    /// combine a row as soon as its pieces are in, while other programs still stream K
    /// and V, instead of after the whole split.
    ///
    /// [`OpKind::Signal`]: dusk_compiler::ir::OpKind::Signal
    pub row_signals: bool,
    /// The element type of the partial outputs (`part_o`): f32, or f16 / bf16 to halve
    /// their traffic. They are normalised (each a convex combination of V rows, so within
    /// V's range) and the merge adds them in f32: rounding them to f16 adds about 2^-12 of
    /// relative error to an output that is itself rounded to f16. With token lists the
    /// partials are about an eighth of the bytes a step moves (a piece's
    /// `group x head_dim` f32 values written by the split and read by the merge, beside
    /// its K and V rows).
    pub partial_dtype: DType,
    /// K and V read as a stream (`ld.global.cs`, [`KernelBuilder::load_streaming`]): a
    /// step reads each row once, and with lines marked to go first the caches keep what
    /// is read again (the lists, the page table, the partial results the merge reads back)
    /// while a stream many times the L2 passes through.
    pub stream_kv: bool,
    /// With `fused_merge`: SparQ's output transform (see [`MergeConfig::sparq`]).
    pub sparq: bool,
    /// With `fused_merge`: partials combined a step (see [`MergeConfig::block_chunks`]).
    pub merge_chunks: usize,
    /// With `balanced`, for diagnosis: a pointer parameter `timeline` (i64) after the
    /// partial buffers (and the fused merge's), where program p writes record p
    /// ([`crate::timeline`]): the GPU's clock at its start, once its row search is done,
    /// when its first tile's scores are in, at its end (0 if it has no segment), and its
    /// SM. Each clock is read where the values before it are in (a branch on them), so it
    /// tells when the data arrived, not when the load was issued.
    pub timeline: bool,
    /// The page table is trusted no further than the cache and its own length: scalar
    /// parameters `num_pages` and `num_page_entries` (the length of `kv_page_indices`)
    /// follow `scale_log2`, each sequence's offsets are clamped into
    /// `0..=num_page_entries`, its last page's length into `1..=page_size` and each page id
    /// into `0..num_pages`. For page tables written on the device (an engine's converter,
    /// a step that appends a page), which the host never sees: a bad table gives a wrong
    /// answer, never an access outside the cache or the table.
    pub checked_table: bool,
}

impl SplitConfig {
    /// The plans' default for GQA groups of 2 to 8 at head_dim 64 or 128: the tensor-core
    /// kernel (8 tokens a step on one warp, one tile prefetched), pages of 16, token lists
    /// split evenly and merged by a second launch; every option off.
    pub fn tensor_cores(head_dim: usize, group: usize, dtype: DType, source: TokenSource) -> Self {
        SplitConfig {
            head_dim,
            page_size: 16,
            group,
            dtype,
            source,
            block_tokens: 8,
            num_warps: 1,
            vector_bytes: 16,
            prefetch: 1,
            min_programs_per_sm: 0,
            stages: 0,
            l2_prefetch: false,
            tensor_cores: true,
            chunk_fastest: false,
            balanced: source == TokenSource::Lists,
            fused_merge: false,
            row_signals: false,
            partial_dtype: DType::F32,
            stream_kv: false,
            sparq: false,
            merge_chunks: 8,
            timeline: false,
            checked_table: false,
        }
    }
}

/// Rows of the token lists one step of the balanced split's row search compares: 512 rows
/// (batch 64 x 8 KV heads) in one round trip to L2, 16 registers a thread while it runs.
const SEARCH_ROWS: usize = 512;

/// Compile-time choices of the merge kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MergeConfig {
    pub head_dim: usize,
    /// Element type of the output and of `v_mean`.
    pub dtype: DType,
    /// Apply SparQ's output transform (parameters `alpha`, `v_mean`).
    pub sparq: bool,
    /// Partials (chunks or pieces) whose outputs are combined per step of the second pass;
    /// the first pass reads [`merge_lse_width`] log-sum-exps a step. A row's steps wait on
    /// each other, so the longest row's step count is the merge's critical path: 32 take a
    /// row of 47 pieces (the skewed benchmark's longest) in 2 steps where 8 took 6.
    pub block_chunks: usize,
    /// Partial results of the balanced split of token lists (see
    /// [`SplitConfig::balanced`]).
    pub balanced: bool,
    /// With `balanced`: a pointer parameter `counters` after `sel_indptr` (i32 `[rows +
    /// batch * q_heads]`, zero before the first launch; the first `rows` are the split's,
    /// see [`SplitConfig::row_signals`]). The program of query row q waits (a bounded
    /// while, [`OpKind::AwaitCount`]) until its token-list row's count of arrivals is its
    /// row's pieces past `counters[rows + q]`, the count it took up to in the launch
    /// before, and only if that runs out for the whole split; then it keeps the count it
    /// took. A split arrives at most once a piece, so a row's count never passes its
    /// pieces whatever the lists say: when a program stops waiting no arrival of the
    /// launch is still to come, and the next launch starts level. No counter is ever
    /// reset (counts wrap, and the comparison with them).
    ///
    /// [`OpKind::AwaitCount`]: dusk_compiler::ir::OpKind::AwaitCount
    pub row_signals: bool,
    /// The element type of the partial outputs, the split's (see
    /// [`SplitConfig::partial_dtype`]).
    pub partial_dtype: DType,
    /// With `balanced`, for diagnosis: a pointer parameter `timeline` after `sel_indptr`,
    /// the split's (see [`SplitConfig::timeline`]), where the program of query row q
    /// writes record `programs + q` ([`crate::timeline`]): its clock at its start, past its
    /// wait for the split, at its end, and its SM.
    pub timeline: bool,
}

/// Which entries of a row's token list one work item takes.
#[derive(Clone, Copy)]
enum Span {
    /// Chunk `chunk` of `tokens` entries.
    Chunk { chunk: Value, tokens: Value },
    /// Entries `start..end`.
    Entries { start: Value, end: Value },
}

/// What places the pieces of the balanced split; the split and the merge take the same.
#[derive(Clone, Copy)]
struct Balance {
    sel_indptr: Value,
    rows: Value,
    /// Entries of `sel_indices` (none past them is read).
    num_indices: Value,
    programs: Value,
    /// The shortest segment.
    min_tokens: Value,
    /// The entries a row start is counted as (see `balanced_segments`).
    row_tokens: Value,
}

/// The balanced split of token lists. The lists' entries are laid end to end on one line,
/// each row preceded by `row_tokens` stand-in entries for what starting a piece of a row
/// costs (the chain of dependent loads before its first step, the partial result after its
/// last): row r starts at `indptr[r] + r * row_tokens` and its entries lie at
/// `indptr[r] + (r + 1) * row_tokens ..` (see [`row_shift`]); the line is
/// `total + rows * row_tokens` long (`total` the last offset of `sel_indptr`, at most
/// `num_indices`). It is cut into segments of `seg = max(ceil(line / programs),
/// min_tokens)`, segment j for program j, so every program gets the same entries *and*
/// row starts' worth of time. Where segment j meets row r's entries there is one *piece*,
/// whose partial result goes to slot `j + r`: walking the line in order, each new piece
/// starts a new segment or a new row (or both), so `j + r` grows from piece to piece, no two
/// pieces share a slot, and `programs + rows` slots hold them all. Returns `(total, line,
/// seg)`.
fn balanced_segments(b: &mut KernelBuilder, bal: &Balance) -> (Value, Value, Value) {
    let p = b.add_ptr(bal.sel_indptr, bal.rows);
    let total = b.load(p);
    let zero = b.i32(0);
    let total = b.maximum(total, zero);
    let total = b.minimum(total, bal.num_indices);
    let starts = b.mul(bal.rows, bal.row_tokens);
    let line = b.add(total, starts);
    let seg = b.add(line, bal.programs);
    let seg = b.add_c(seg, -1);
    let seg = b.div(seg, bal.programs);
    let seg = b.maximum(seg, bal.min_tokens);
    let one = b.i32(1);
    (total, line, b.maximum(seg, one))
}

/// Row `row`'s offsets in the token lists: `sel_indptr[row]`, `sel_indptr[row + 1]`.
fn list_offsets(b: &mut KernelBuilder, indptr: Value, row: Value) -> (Value, Value) {
    let p = b.add_ptr(indptr, row);
    let start = b.load(p);
    let row1 = b.add_c(row, 1);
    let p = b.add_ptr(indptr, row1);
    (start, b.load(p))
}

/// How far row r's entries sit along the balanced split's line past their offsets in the
/// lists: `(r + 1) * row_tokens`.
fn row_shift(b: &mut KernelBuilder, r: Value, row_tokens: Value) -> Value {
    let r1 = b.add_c(r, 1);
    b.mul(r1, row_tokens)
}

/// The first step's word of a timeline record: at the step of tile `t0` of the program's
/// first row (`first_row`), once `score` (computed from the tile's K) is in.
fn stamp_first_step(
    b: &mut KernelBuilder,
    record: Value,
    (t, t0, first_row): (Value, Value, Value),
    score: Value,
) {
    let first_tile = b.eq(t, t0);
    let here = b.and(first_tile, first_row);
    // Never false for a finite score, but only known once it is in.
    let arrived = b.eq(score, score);
    let here = b.and(here, arrived);
    stamp(b, record, 2, here);
}

/// The score of masked slots: far below any real score, yet finite.
const MASKED: f32 = -1e30;

fn unsupported(kernel: &str, what: String) -> CompileError {
    CompileError::Build {
        kernel: kernel.into(),
        op: "build".into(),
        loc: String::new(),
        msg: what,
    }
}

/// Builds the split kernel. Parameters, in order: `q` (`[batch, q_heads, D]`), `k`, `v`
/// (`[pages, page_size, kv_heads, D]`), `kv_indptr`, `kv_page_indices`, `kv_last_page_len`;
/// with [`TokenSource::Lists`] `sel_indptr`, `sel_indices`; with [`TokenSource::Padded`]
/// `sel_indices`, `sel_lens`; then `part_o` (f32 `[batch * q_heads, max_chunks, D]`),
/// `part_lse` (f32 `[batch * q_heads, max_chunks]`), and the i32 scalars `num_q_heads`,
/// `num_kv_heads`, `chunk_tokens`, `max_chunks`, (lists only) `num_indices` (entries of
/// `sel_indices`: entries outside it are absent, whatever `sel_indptr` says), (padded only)
/// `max_len`, and the f32
/// `scale_log2` (softmax scale times log2(e)); with `checked_table` then the i32
/// `num_pages` and `num_page_entries`. Grid: `(batch * q_heads / group, max_chunks)`,
/// or `(max_chunks, batch * q_heads / group)` with `chunk_fastest`.
///
/// With `balanced`: the partial buffers are indexed by piece (`[programs + rows, G, D]`,
/// `[programs + rows, G]`, see `balanced_segments`); the scalars `chunk_tokens`,
/// `max_chunks` are replaced by `rows` (token-list rows), `min_tokens` (the shortest
/// segment) and `row_tokens` (what a row start counts as); any 1-D grid (the plan
/// launches about as many programs as fit on the GPU at once).
///
/// With `fused_merge` (balanced only), the partial buffers hold twice the slots (the second
/// half for groups of pieces merged into one), and `part_lse` is followed by the merge's
/// `out`, `lse`, (`sparq`) `alpha`, `v_mean` (as in [`build_merge`]) and `counters` (i32
/// `[programs + 2 * rows]`, zero before the first launch; every launch leaves them zero,
/// whatever the lists say). With `row_signals` instead, `part_lse` is followed by the
/// merge's `counters` (see [`MergeConfig::row_signals`]).
pub fn build_split(cfg: &SplitConfig) -> Result<Kernel, CompileError> {
    let (d, bt, g_n) = (cfg.head_dim, cfg.block_tokens, cfg.group);
    let name = format!(
        "attn_split_{}_d{}_p{}_g{}_{}_t{}_w{}_v{}_f{}_o{}{}{}{}{}{}{}{}{}{}{}{}",
        match cfg.source {
            TokenSource::Dense => "dense",
            TokenSource::Lists => "lists",
            TokenSource::Padded => "padded",
        },
        d,
        cfg.page_size,
        g_n,
        cfg.dtype.name(),
        bt,
        cfg.num_warps,
        cfg.vector_bytes,
        cfg.prefetch,
        cfg.min_programs_per_sm,
        if cfg.l2_prefetch { "_l2" } else { "" },
        if cfg.tensor_cores { "_mma" } else { "" },
        match cfg.stages {
            0 => String::new(),
            n => format!("_s{n}"),
        },
        if cfg.chunk_fastest { "_cf" } else { "" },
        if cfg.balanced { "_bal" } else { "" },
        match (cfg.fused_merge, cfg.sparq) {
            (false, _) => String::new(),
            (true, false) => format!("_m{}", cfg.merge_chunks),
            (true, true) => format!("_m{}_sparq", cfg.merge_chunks),
        },
        if cfg.row_signals { "_rs" } else { "" },
        partial_suffix(cfg.partial_dtype),
        if cfg.stream_kv { "_cs" } else { "" },
        if cfg.timeline { "_timeline" } else { "" },
        if cfg.checked_table { "_ct" } else { "" }
    );
    let tc = cfg.tensor_cores;
    if !matches!(d, 64 | 128 | 256)
        || !cfg.page_size.is_power_of_two()
        || !g_n.is_power_of_two()
        || g_n > 16
        || !bt.is_power_of_two()
        || !matches!(cfg.dtype, DType::F16 | DType::BF16)
        || !matches!(cfg.vector_bytes, 16 | 32)
        || !matches!(cfg.prefetch, 1 | 2)
        || (tc && (!(2..=8).contains(&g_n) || bt != 8 || cfg.num_warps != 1))
        || (cfg.stages != 0
            && (!tc
                || !(2..=6).contains(&cfg.stages)
                || d > 128
                || cfg.vector_bytes != 16
                || cfg.prefetch != 1
                || cfg.l2_prefetch
                || cfg.stream_kv))
        || (cfg.balanced && (cfg.source != TokenSource::Lists || cfg.chunk_fastest))
        || (cfg.fused_merge && (!cfg.merge_chunks.is_power_of_two() || cfg.merge_chunks > 64))
        || (cfg.row_signals && (!cfg.balanced || cfg.fused_merge))
        || !matches!(cfg.partial_dtype, DType::F32 | DType::F16 | DType::BF16)
        || (cfg.timeline && !cfg.balanced)
    {
        return Err(unsupported(
            &name,
            format!("unsupported configuration {cfg:?}"),
        ));
    }
    let mut b = KernelBuilder::new(&name);
    b.set_num_warps(cfg.num_warps);
    b.set_vector_bytes(cfg.vector_bytes);
    b.set_min_programs_per_sm(cfg.min_programs_per_sm);
    let q = b.param_ptr("q", cfg.dtype);
    let k = b.param_ptr("k", cfg.dtype);
    let v = b.param_ptr("v", cfg.dtype);
    let kv_indptr = b.param_ptr("kv_indptr", DType::I32);
    let kv_page_indices = b.param_ptr("kv_page_indices", DType::I32);
    let kv_last_page_len = b.param_ptr("kv_last_page_len", DType::I32);
    let (sel_indptr, sel_indices, sel_lens) = match cfg.source {
        TokenSource::Dense => (None, None, None),
        TokenSource::Lists => (
            Some(b.param_ptr("sel_indptr", DType::I32)),
            Some(b.param_ptr("sel_indices", DType::I32)),
            None,
        ),
        TokenSource::Padded => (
            None,
            Some(b.param_ptr("sel_indices", DType::I32)),
            Some(b.param_ptr("sel_lens", DType::I32)),
        ),
    };
    let part_o = b.param_ptr("part_o", cfg.partial_dtype);
    let part_lse = b.param_ptr("part_lse", DType::F32);
    let merged = if cfg.fused_merge {
        let (out, lse_out, sparq) = merge_output_params(&mut b, cfg.dtype, cfg.sparq);
        Some((out, lse_out, sparq, b.param_ptr("counters", DType::I32)))
    } else {
        None
    };
    let row_counters = cfg.row_signals.then(|| b.param_ptr("counters", DType::I32));
    let timeline = cfg.timeline.then(|| b.param_ptr("timeline", DType::I64));
    let num_q_heads = b.param_scalar("num_q_heads", DType::I32);
    let num_kv_heads = b.param_scalar("num_kv_heads", DType::I32);
    // The merge inside the split: where it writes, and the row counters.
    let merged = merged.map(|(out, lse_out, sparq, counters)| {
        let io = MergeIo {
            part_o,
            part_lse,
            out,
            lse_out,
            sparq: sparq.map(|(alpha, v_mean)| (alpha, v_mean, num_q_heads, num_kv_heads)),
            head_dim: d,
            block_chunks: cfg.merge_chunks,
            dtype: cfg.dtype,
        };
        (io, counters)
    });
    let (grid, rows_min) = if cfg.balanced {
        let rows = b.param_scalar("rows", DType::I32);
        let min_tokens = b.param_scalar("min_tokens", DType::I32);
        (
            None,
            Some((rows, min_tokens, b.param_scalar("row_tokens", DType::I32))),
        )
    } else {
        let chunk_tokens = b.param_scalar("chunk_tokens", DType::I32);
        (
            Some((chunk_tokens, b.param_scalar("max_chunks", DType::I32))),
            None,
        )
    };
    let num_indices = match cfg.source {
        TokenSource::Lists => Some(b.param_scalar("num_indices", DType::I32)),
        _ => None,
    };
    let max_len = match cfg.source {
        TokenSource::Padded => Some(b.param_scalar("max_len", DType::I32)),
        _ => None,
    };
    let scale_log2 = b.param_scalar("scale_log2", DType::F32);
    let table_bounds = cfg.checked_table.then(|| {
        (
            b.param_scalar("num_pages", DType::I32),
            b.param_scalar("num_page_entries", DType::I32),
        )
    });
    if merged.is_none() {
        // The merge may start its programs now; they wait for this kernel's end themselves.
        b.release_dependents();
    }

    // One work item: the entries `span` of row `row`'s tokens, (lists) whose offsets in
    // `sel_indices` are `list` (`sel_indptr[row]`, `sel_indptr[row + 1]`, as the caller has
    // them); query head g of the row writes partial slot `slot0 + g * stride`. With a
    // timeline, `first_step` is the program's record and whether this is its first row.
    let item = |b: &mut KernelBuilder,
                row: Value,
                list: Option<(Value, Value)>,
                span: Span,
                slot0: Value,
                stride: Value,
                first_step: Option<(Value, Value)>| {
        // Row -> (batch, first query head, KV head).
        let c_group = b.i32(g_n as i32);
        let rows_per_batch = b.div(num_q_heads, c_group);
        let batch = b.div(row, rows_per_batch);
        let r = b.rem(row, rows_per_batch);
        let qh0 = b.mul(r, c_group);
        let q_per_kv = b.div(num_q_heads, num_kv_heads);
        let kvh = b.div(qh0, q_per_kv);

        // The sequence: its first page entry and its length.
        let p = b.add_ptr(kv_indptr, batch);
        let page_base = b.load(p);
        let b1 = b.add_c(batch, 1);
        let p = b.add_ptr(kv_indptr, b1);
        let page_end = b.load(p);
        let p = b.add_ptr(kv_last_page_len, batch);
        let last = b.load(p);
        // A device-written table: offsets inside the table, the last page's length inside
        // a page, so that every position below `seq_len` has its page entry in the table.
        let (page_base, page_end, last) = match table_bounds {
            None => (page_base, page_end, last),
            Some((_, entries)) => {
                let z = b.i32(0);
                let base = b.maximum(page_base, z);
                let base = b.minimum(base, entries);
                let end = b.maximum(page_end, base);
                let end = b.minimum(end, entries);
                let one = b.i32(1);
                let c_ps = b.i32(cfg.page_size as i32);
                let last = b.maximum(last, one);
                (base, end, b.minimum(last, c_ps))
            }
        };
        let pages = b.sub(page_end, page_base);
        let ps = cfg.page_size as i64;
        let full = b.mul_c(pages, ps);
        let full = b.add_c(full, -ps);
        let seq_len = b.add(full, last);
        let zero_i = b.i32(0);
        let seq_len = b.maximum(seq_len, zero_i);

        // The row's list: where it starts, entries to visit, entries that count.
        let (list_start, n_work, n_valid) = match cfg.source {
            TokenSource::Dense => (zero_i, seq_len, seq_len),
            TokenSource::Lists => {
                let (s, e) = list.expect("the list's offsets");
                let n = b.sub(e, s);
                (s, n, n)
            }
            TokenSource::Padded => {
                let ml = max_len.expect("padded");
                let s = b.mul(row, ml);
                let p = b.add_ptr(sel_lens.expect("padded"), row);
                let n = b.load(p);
                (s, ml, n)
            }
        };
        let (t0, t_end) = match span {
            Span::Chunk { chunk, tokens } => {
                let t0 = b.mul(chunk, tokens);
                (t0, b.add(t0, tokens))
            }
            Span::Entries { start, end } => (start, end),
        };
        let t1 = b.minimum(t_end, n_work);
        let live = b.lt(t0, t1);
        let neg_inf = b.f32(f32::NEG_INFINITY);

        b.if_else(
            live,
            |b| {
                let dr = b.arange(0, d as i64);
                // Queries, scaled so that scores come out in log2 units.
                let bq = b.mul(batch, num_q_heads);
                let bq = b.add(bq, qh0);
                let bq64 = b.cast(bq, DType::I64);
                let mut qs = vec![];
                // Tensor cores: the group's queries as the rows of one f16 block, padded to 8
                // rows with zeros (`dot` takes 8).
                let q8 = if tc {
                    let h = b.arange(0, 8);
                    let hg = b.i32(g_n as i32);
                    let real = b.lt(h, hg);
                    let h64 = b.cast(h, DType::I64);
                    let rows = b.add(h64, bq64);
                    let rows = b.mul_c(rows, d as i64);
                    let rows = b.expand(rows, 1, d);
                    let dcol = b.cast(dr, DType::I64);
                    let dcol = b.expand(dcol, 0, 8);
                    let off = b.add(rows, dcol);
                    let qp = b.add_ptr(q, off);
                    let mask = b.expand(real, 1, d);
                    Some(b.load_masked(qp, Some(mask), None))
                } else {
                    None
                };
                for g in 0..if tc { 0 } else { g_n } {
                    let base = b.add_c(bq64, g as i64);
                    let base = b.mul_c(base, d as i64);
                    let qp = b.add_ptr(q, base);
                    let qp = b.add_ptr(qp, dr);
                    let qv = b.load(qp);
                    let qv = b.cast(qv, DType::F32);
                    qs.push(b.mul(qv, scale_log2));
                }
                let c_bt = b.i32(bt as i32);
                let kvh64 = b.cast(kvh, DType::I64);
                let hkv64 = b.cast(num_kv_heads, DType::I64);
                let lists = sel_indices.is_some();
                // The loop is software-pipelined so that no load waits on another in the same
                // iteration: while tile t is computed, the K and V rows of tiles t+1..=t+P are in
                // flight (P = `prefetch`), the page-table entries of tile t+P+1 and (lists) the
                // positions of tile t+P+2.
                // Positions travel as `pos` with -1 for "absent" (past the chunk, outside the
                // sequence), so one i32 block carries both.
                let positions = |b: &mut KernelBuilder, tile: Value| -> Value {
                    let j = b.arange(0, bt as i64);
                    let j = b.add(tile, j);
                    let inb = b.lt(j, t1);
                    let minus1 = b.i32(-1);
                    let pos = match sel_indices {
                        None => j,
                        Some(ix) => {
                            let e = b.add(list_start, j);
                            let readable = match num_indices {
                                Some(n) => {
                                    let z = b.i32(0);
                                    let lo = b.ge(e, z);
                                    let hi = b.lt(e, n);
                                    let inside = b.and(lo, hi);
                                    b.and(inb, inside)
                                }
                                None => inb,
                            };
                            let p = b.add_ptr(ix, e);
                            b.load_masked(p, Some(readable), Some(minus1))
                        }
                    };
                    let z = b.i32(0);
                    let nonneg = b.ge(pos, z);
                    let in_seq = b.lt(pos, seq_len);
                    let ok = b.and(inb, nonneg);
                    let ok = b.and(ok, in_seq);
                    b.select(ok, pos, minus1)
                };
                let page_of = |b: &mut KernelBuilder, pos: Value| -> Value {
                    let z = b.i32(0);
                    let ok = b.ge(pos, z);
                    let c_ps = b.i32(cfg.page_size as i32);
                    let page_in_seq = b.div(pos, c_ps);
                    let pi = b.add(page_base, page_in_seq);
                    let p = b.add_ptr(kv_page_indices, pi);
                    let page = b.load_masked(p, Some(ok), Some(z));
                    match table_bounds {
                        None => page,
                        Some((num_pages, _)) => {
                            let top = b.add_c(num_pages, -1);
                            let page = b.minimum(page, top);
                            b.maximum(page, z)
                        }
                    }
                };
                // Element offset of each token's K (and V) row of this KV head.
                let row_offsets = |b: &mut KernelBuilder, pos: Value, page: Value| -> Value {
                    let c_ps = b.i32(cfg.page_size as i32);
                    let slot = b.rem(pos, c_ps);
                    let page64 = b.cast(page, DType::I64);
                    let tok = b.mul_c(page64, ps);
                    let slot64 = b.cast(slot, DType::I64);
                    let tok = b.add(tok, slot64);
                    let krow = b.mul(tok, hkv64);
                    let krow = b.add(krow, kvh64);
                    b.mul_c(krow, d as i64)
                };
                // The K and V rows of a tile brought into L2 (no registers held).
                let prefetch_kv = |b: &mut KernelBuilder, pos: Value, page: Value| {
                    let z = b.i32(0);
                    let ok = b.ge(pos, z);
                    let off = row_offsets(b, pos, page);
                    let row_bytes = (d * cfg.dtype.size_bytes()) as u32;
                    let kp = b.add_ptr(k, off);
                    b.prefetch(kp, Some(ok), row_bytes, CacheLevel::L2);
                    let vp = b.add_ptr(v, off);
                    b.prefetch(vp, Some(ok), row_bytes, CacheLevel::L2);
                };
                let load_kv = |b: &mut KernelBuilder, pos: Value, page: Value| -> (Value, Value) {
                    let z = b.i32(0);
                    let ok = b.ge(pos, z);
                    let off = row_offsets(b, pos, page);
                    let off2 = b.expand(off, 1, d);
                    let dcol = b.cast(dr, DType::I64);
                    let dcol = b.expand(dcol, 0, bt);
                    let off2 = b.add(off2, dcol);
                    let mask2 = b.expand(ok, 1, d);
                    let load = |b: &mut KernelBuilder, p: Value| {
                        if cfg.stream_kv {
                            b.load_streaming(p, Some(mask2), None)
                        } else {
                            b.load_masked(p, Some(mask2), None)
                        }
                    };
                    let kp = b.add_ptr(k, off2);
                    let kt = load(b, kp);
                    let vp = b.add_ptr(v, off2);
                    let vt = load(b, vp);
                    (kt, vt)
                };
                // Which slots of tile `t` (positions `pos`) count.
                let valid_of = |b: &mut KernelBuilder, t: Value, pos: Value| -> Value {
                    let z = b.i32(0);
                    let valid = b.ge(pos, z);
                    match (cfg.source, sel_lens) {
                        (TokenSource::Padded, Some(_)) => {
                            let j = b.arange(0, bt as i64);
                            let j = b.add(t, j);
                            let counted = b.lt(j, n_valid);
                            b.and(valid, counted)
                        }
                        _ => valid,
                    }
                };
                // Tensor cores: one step of the online softmax over tile `t`'s scores `s`
                // (`[8 heads, 8 tokens]`, unscaled) and its V `vt`; `[m, l, acc]` in and out.
                // `masked` and `zero_f` are the step's constants `MASKED` and 0.
                let tc_step = |b: &mut KernelBuilder,
                               (t, s, vt, valid): (Value, Value, Value, Value),
                               [m, l, acc]: [Value; 3],
                               (masked, zero_f): (Value, Value)|
                 -> [Value; 3] {
                    let s = b.mul(s, scale_log2);
                    let vc = b.expand(valid, 0, 8);
                    let s = b.select(vc, s, masked);
                    let mx = b.max(s, 1);
                    if let Some((record, first_row)) = first_step {
                        let m = b.max(mx, 0);
                        stamp_first_step(b, record, (t, t0, first_row), m);
                    }
                    let m_new = b.maximum(m, mx);
                    let dm = b.sub(m, m_new);
                    let alpha = b.exp2(dm);
                    let me = b.expand(m_new, 1, bt);
                    let ds = b.sub(s, me);
                    let e = b.exp2(ds);
                    let pr = b.select(vc, e, zero_f);
                    let ae = b.expand(alpha, 1, bt);
                    let l = b.mul(l, ae);
                    let l = b.add(l, pr);
                    let ph = b.cast(pr, cfg.dtype);
                    let aa = b.expand(alpha, 0, d);
                    let acc = b.mul(acc, aa);
                    let acc = b.dot_ta(vt, ph, Some(acc));
                    [m_new, l, acc]
                };
                let fin = if cfg.stages > 0 {
                    let q8 = q8.expect("tensor cores");
                    let s_n = cfg.stages;
                    // The ring: stage s holds K's tile then V's, rows `row` elements apart
                    // (16 bytes of padding: the eight rows an `ldmatrix` reads, and the
                    // rows of a thread group's K fragments, fall in different banks).
                    let row = d + 8;
                    let tile_elems = bt * row;
                    let ring = b.shared_alloc(cfg.dtype, s_n * 2 * tile_elems);
                    // Column c of a tile moves with the thread holding it in `dot`'s layout
                    // (a quarter of a row, `d / 4` elements, in 16-byte runs), but each
                    // thread's j-th run comes from run `4j + quarter` of the row, so the four
                    // threads of a row copy 64 contiguous bytes together and every sector
                    // read is whole. Destination and source get the same permutation, so
                    // the staged tile is the tile.
                    let quarter = d / 4;
                    let col = b.arange(0, d as i64);
                    let c7 = b.i32(7);
                    let within = b.binary(BinOp::And, col, c7);
                    let c3 = b.i32(3);
                    let run = b.binary(BinOp::Shr, col, c3);
                    let runs_m1 = b.i32((quarter / 8 - 1) as i32);
                    let run = b.binary(BinOp::And, run, runs_m1);
                    let c5 = b.i32(5);
                    let run = b.binary(BinOp::Shl, run, c5);
                    let qs = b.i32(quarter.trailing_zeros() as i32);
                    let qtr = b.binary(BinOp::Shr, col, qs);
                    let qtr = b.binary(BinOp::Shl, qtr, c3);
                    let moved = b.add(run, within);
                    let moved = b.add(moved, qtr);
                    let dst_rows = b.arange(0, bt as i64);
                    let dst_rows = b.mul_c(dst_rows, row as i64);
                    let dst_rows = b.expand(dst_rows, 1, d);
                    let moved2 = b.expand(moved, 0, bt);
                    let dst_off = b.add(dst_rows, moved2);
                    let moved64 = b.cast(moved, DType::I64);
                    let moved64 = b.expand(moved64, 0, bt);
                    // Tile (`pos`, `page`) copied into stage `slot`, as one group.
                    let issue = |b: &mut KernelBuilder, pos: Value, page: Value, slot: Value| {
                        let z = b.i32(0);
                        let ok = b.ge(pos, z);
                        let mask2 = b.expand(ok, 1, d);
                        // Absent slots read nothing (0 bytes copied), and their addresses
                        // stay inside the cache all the same: slot 0 of their page 0.
                        let at_pos = b.maximum(pos, z);
                        let off = row_offsets(b, at_pos, page);
                        let off2 = b.expand(off, 1, d);
                        let src_off = b.add(off2, moved64);
                        let base = b.mul_c(slot, (2 * tile_elems) as i64);
                        for (i, src) in [k, v].into_iter().enumerate() {
                            let at = b.add_c(base, (i * tile_elems) as i64);
                            let dst = b.add_ptr(ring, at);
                            let dst = b.add_ptr(dst, dst_off);
                            let src = b.add_ptr(src, src_off);
                            b.async_copy(dst, src, Some(mask2));
                        }
                        b.async_commit();
                    };
                    // Prologue: tiles 0..S-1 in flight, the pages of tile S-1, (lists) the
                    // positions of tile S.
                    let tile_at = |b: &mut KernelBuilder, base: Value, i: usize| -> Value {
                        let c = b.i32((i * bt) as i32);
                        b.add(base, c)
                    };
                    let mut init = vec![];
                    for i in 0..s_n - 1 {
                        let tile = tile_at(b, t0, i);
                        let pos = positions(b, tile);
                        let page = page_of(b, pos);
                        let slot = b.i32(i as i32);
                        issue(b, pos, page, slot);
                        init.push(pos);
                    }
                    let tile = tile_at(b, t0, s_n - 1);
                    let pos = positions(b, tile);
                    let page = page_of(b, pos);
                    init.extend([pos, page]);
                    if lists {
                        let tile = tile_at(b, t0, s_n);
                        init.push(positions(b, tile));
                    }
                    let pipe = init.len();
                    let masked = b.f32(MASKED);
                    let zero_f = b.f32(0.0);
                    let m0 = b.splat(masked, &[8]);
                    let l0 = b.splat(zero_f, &[8, bt]);
                    let a0 = b.splat(zero_f, &[d, 8]);
                    init.extend([m0, l0, a0]);
                    let fin = b.for_range(t0, t1, c_bt, &init, |b, t, carried| {
                        // Tile i = (t - t0) / 8 lies in stage i % S; once it is in, tile
                        // i + S - 1 goes to the stage tile i - 1 left (every lane has read
                        // it: the wait ends in a barrier).
                        let i = b.sub(t, t0);
                        let i = b.div(i, c_bt);
                        let c_s = b.i32(s_n as i32);
                        let cur = b.rem(i, c_s);
                        let nxt = b.add_c(i, s_n as i64 - 1);
                        let nxt = b.rem(nxt, c_s);
                        b.async_wait((s_n - 2) as u32);
                        let (pos_a, page_a) = (carried[s_n - 1], carried[s_n]);
                        issue(b, pos_a, page_a, nxt);
                        // The page-table chain a tile ahead of the copies.
                        let pos_far = if lists {
                            carried[s_n + 1]
                        } else {
                            let tile = tile_at(b, t, s_n);
                            positions(b, tile)
                        };
                        let page_far = page_of(b, pos_far);
                        let mut next = carried[1..s_n - 1].to_vec();
                        next.extend([pos_a, pos_far, page_far]);
                        if lists {
                            let tile = tile_at(b, t, s_n + 1);
                            next.push(positions(b, tile));
                        }
                        let base = b.mul_c(cur, (2 * tile_elems) as i64);
                        let kb = b.add_ptr(ring, base);
                        let kt = b.load_tile(kb, bt, d, row);
                        let scores = b.dot(q8, kt, None);
                        let vbase = b.add_c(base, tile_elems as i64);
                        let vb = b.add_ptr(ring, vbase);
                        let vt = b.load_tile(vb, bt, d, row);
                        let valid = valid_of(b, t, carried[0]);
                        let state = [carried[pipe], carried[pipe + 1], carried[pipe + 2]];
                        let consts = (b.f32(MASKED), b.f32(0.0));
                        next.extend(tc_step(b, (t, scores, vt, valid), state, consts));
                        next
                    });
                    // Copies past the chunk (all masked) land before the program ends.
                    b.async_wait(0);
                    fin[pipe..].to_vec()
                } else {
                    // Prologue: K and V of tiles 0..P, pages of tile P, (lists) positions of P+1.
                    let pf = cfg.prefetch;
                    let tile_at = |b: &mut KernelBuilder, base: Value, i: usize| -> Value {
                        let c = b.i32((i * bt) as i32);
                        b.add(base, c)
                    };
                    let mut init = vec![];
                    let mut poss = vec![];
                    for i in 0..pf {
                        let tile = tile_at(b, t0, i);
                        let pos = positions(b, tile);
                        let page = page_of(b, pos);
                        let (kt, vt) = load_kv(b, pos, page);
                        init.extend([kt, vt]);
                        poss.push(pos);
                    }
                    init.extend(poss);
                    // Positions and pages of tiles P (and P + 1 with `l2_prefetch`).
                    let pairs = 1 + cfg.l2_prefetch as usize;
                    for a in 0..pairs {
                        let tile = tile_at(b, t0, pf + a);
                        let pos = positions(b, tile);
                        let page = page_of(b, pos);
                        init.extend([pos, page]);
                    }
                    if lists {
                        let tile = tile_at(b, t0, pf + pairs);
                        init.push(positions(b, tile));
                    }
                    let stages = init.len();
                    let masked = b.f32(MASKED);
                    let zero_f = b.f32(0.0);
                    // Under a register cap the queries wait in shared memory (see
                    // `min_programs_per_sm`) and each step reads them back, 4 loads of 16
                    // bytes a thread; rows 16 bytes longer than the queries, so that the two
                    // rows a quarter warp reads lie in different banks.
                    let q_row = d + 8;
                    let q_shared = q8.filter(|_| cfg.min_programs_per_sm > 0).map(|q8| {
                        let buf = b.shared_alloc(cfg.dtype, 8 * q_row);
                        let h = b.arange(0, 8);
                        let h = b.mul_c(h, q_row as i64);
                        let h = b.expand(h, 1, d);
                        let c = b.expand(dr, 0, 8);
                        let off = b.add(h, c);
                        let p = b.add_ptr(buf, off);
                        b.store(p, q8);
                        buf
                    });
                    if tc {
                        // Per head (rows): the running maximum; per (head, token slot): the sum of
                        // weights; the output transposed, `[head_dim, 8 heads]`.
                        let m0 = b.splat(masked, &[8]);
                        let l0 = b.splat(zero_f, &[8, bt]);
                        let a0 = b.splat(zero_f, &[d, 8]);
                        init.extend([m0, l0, a0]);
                    } else {
                        let m0 = b.splat(masked, &[bt]);
                        let l0 = b.splat(zero_f, &[bt]);
                        let a0 = b.splat(zero_f, &[bt, d]);
                        for _ in 0..g_n {
                            init.extend([m0, l0, a0]);
                        }
                    }
                    let fin = b.for_range(t0, t1, c_bt, &init, |b, t, carried| {
                        let (kt, vt, pos) = (carried[0], carried[1], carried[2 * pf]);
                        let (pos_p, page_p) = (carried[3 * pf], carried[3 * pf + 1]);
                        // Tensor cores: this tile's scores first, so that its K is dead before the
                        // next tile's K and V take registers.
                        let scores = q8.map(|q8| {
                            let qa = match q_shared {
                                Some(buf) => b.load_tile(buf, 8, d, q_row),
                                None => q8,
                            };
                            b.dot(qa, kt, None)
                        });
                        // Tile t+P's K and V, (`l2_prefetch`) tile t+P+1's K and V into L2, the
                        // pages of the tile after that, (lists) the positions of the next.
                        let (kt_p, vt_p) = load_kv(b, pos_p, page_p);
                        let mut ahead = vec![];
                        if cfg.l2_prefetch {
                            let (pos_q, page_q) = (carried[3 * pf + 2], carried[3 * pf + 3]);
                            prefetch_kv(b, pos_q, page_q);
                            ahead.extend([pos_q, page_q]);
                        }
                        let far = pf + pairs;
                        let tile = tile_at(b, t, far);
                        let pos_far = if lists {
                            carried[3 * pf + 2 * pairs]
                        } else {
                            positions(b, tile)
                        };
                        let page_far = page_of(b, pos_far);
                        let mut next = carried[2..2 * pf].to_vec();
                        next.extend([kt_p, vt_p]);
                        next.extend(carried[2 * pf + 1..3 * pf].iter().copied());
                        next.push(pos_p);
                        next.extend(ahead);
                        next.extend([pos_far, page_far]);
                        if lists {
                            let tile = tile_at(b, t, far + 1);
                            next.push(positions(b, tile));
                        }
                        let valid = valid_of(b, t, pos);
                        let masked = b.f32(MASKED);
                        let zero_f = b.f32(0.0);
                        if let Some(s) = scores {
                            let state = [carried[stages], carried[stages + 1], carried[stages + 2]];
                            next.extend(tc_step(b, (t, s, vt, valid), state, (masked, zero_f)));
                            return next;
                        }
                        let kt = b.cast(kt, DType::F32);
                        let vt = b.cast(vt, DType::F32);
                        for (g, qv) in qs.iter().enumerate() {
                            let (m, l, acc) = (
                                carried[stages + 3 * g],
                                carried[stages + 3 * g + 1],
                                carried[stages + 3 * g + 2],
                            );
                            let qe = b.expand(*qv, 0, bt);
                            let prod = b.mul(kt, qe);
                            let s = b.sum(prod, 1);
                            let s = b.select(valid, s, masked);
                            if let (Some((record, first_row)), 0) = (first_step, g) {
                                let m = b.max(s, 0);
                                stamp_first_step(b, record, (t, t0, first_row), m);
                            }
                            let m_new = b.maximum(m, s);
                            let dm = b.sub(m, m_new);
                            let alpha = b.exp2(dm);
                            let ds = b.sub(s, m_new);
                            let e = b.exp2(ds);
                            let pr = b.select(valid, e, zero_f);
                            let l = b.mul(l, alpha);
                            let l = b.add(l, pr);
                            let ae = b.expand(alpha, 1, d);
                            let acc = b.mul(acc, ae);
                            let pe = b.expand(pr, 1, d);
                            let pv = b.mul(vt, pe);
                            let acc = b.add(acc, pv);
                            next.extend([m_new, l, acc]);
                        }
                        next
                    });
                    fin[stages..].to_vec()
                };
                // Combine the slots, normalise, write the chunk's partial result per head.
                let one = b.f32(1.0);
                let zero_f = b.f32(0.0);
                if tc {
                    let (m, l, acc) = (fin[0], fin[1], fin[2]);
                    let lsum = b.sum(l, 1);
                    let has = b.gt(lsum, zero_f);
                    let safe = b.select(has, lsum, one);
                    let inv = b.div(one, safe);
                    let inv = b.select(has, inv, zero_f);
                    let lg = b.log2(safe);
                    let lse = b.add(m, lg);
                    let lse = b.select(has, lse, neg_inf);
                    // Head h's slot: slot0 + h * stride; heads past the group are padding.
                    let h = b.arange(0, 8);
                    let hg = b.i32(g_n as i32);
                    let real = b.lt(h, hg);
                    let hs = b.mul(h, stride);
                    let slots = b.add(hs, slot0);
                    let p = b.add_ptr(part_lse, slots);
                    b.store_masked(p, lse, Some(real));
                    let ie = b.expand(inv, 0, d);
                    let o = b.mul(acc, ie);
                    let slots64 = b.cast(slots, DType::I64);
                    let base = b.mul_c(slots64, d as i64);
                    let base = b.expand(base, 0, d);
                    let dcol = b.cast(dr, DType::I64);
                    let dcol = b.expand(dcol, 1, 8);
                    let off = b.add(base, dcol);
                    let p = b.add_ptr(part_o, off);
                    let mask = b.expand(real, 0, d);
                    let o = to_partial(b, part_o, o);
                    b.store_masked(p, o, Some(mask));
                }
                for g in 0..if tc { 0 } else { g_n } {
                    let (m, l, acc) = (fin[3 * g], fin[3 * g + 1], fin[3 * g + 2]);
                    let mx = b.max(m, 0);
                    let dm = b.sub(m, mx);
                    let f = b.exp2(dm);
                    let lf = b.mul(l, f);
                    let lsum = b.sum(lf, 0);
                    let fe = b.expand(f, 1, d);
                    let af = b.mul(acc, fe);
                    let o = b.sum(af, 0);
                    let has = b.gt(lsum, zero_f);
                    let safe = b.select(has, lsum, one);
                    let inv = b.div(one, safe);
                    let inv = b.select(has, inv, zero_f);
                    let o = b.mul(o, inv);
                    let lg = b.log2(safe);
                    let lse = b.add(mx, lg);
                    let lse = b.select(has, lse, neg_inf);
                    let c = b.i32(g as i32);
                    let c = b.mul(c, stride);
                    let slot = b.add(slot0, c);
                    let p = b.add_ptr(part_lse, slot);
                    b.store(p, lse);
                    let slot64 = b.cast(slot, DType::I64);
                    let base = b.mul_c(slot64, d as i64);
                    let p = b.add_ptr(part_o, base);
                    let p = b.add_ptr(p, dr);
                    let o = to_partial(b, part_o, o);
                    b.store(p, o);
                }
                vec![]
            },
            |b| {
                // Nothing to do in this chunk: say so to the merge (a balanced split makes
                // no empty pieces, and the merge reads none).
                if matches!(span, Span::Entries { .. }) {
                    return vec![];
                }
                for g in 0..g_n {
                    let c = b.i32(g as i32);
                    let c = b.mul(c, stride);
                    let slot = b.add(slot0, c);
                    let p = b.add_ptr(part_lse, slot);
                    b.store(p, neg_inf);
                }
                vec![]
            },
        );
    };
    match (sel_indptr, rows_min) {
        (Some(indptr), Some((rows, min_tokens, row_tokens))) if cfg.balanced => {
            // This program's segment `s..e` of the line (see `balanced_segments`) and
            // the rows it covers: from the last row starting at or before `s` to the last
            // starting before `e`.
            let pid = b.program_id(0);
            // The program's timeline record: its start and SM now, the rest zero until set.
            let record = timeline.map(|t| open_record(&mut b, t, pid, 4, &[1, 2, 3]));
            let bal = Balance {
                sel_indptr: indptr,
                rows,
                num_indices: num_indices.expect("lists"),
                programs: b.num_programs(0),
                min_tokens,
                row_tokens,
            };
            let (total, line, seg) = balanced_segments(&mut b, &bal);
            let s = b.mul(pid, seg);
            let e = b.add(s, seg);
            let e = b.minimum(e, line);
            // The row search before the branch on `busy`: its loads of the row starts do not
            // wait on `total`, so the two round trips to L2 overlap (the search heads every
            // program's chain of dependent loads). Without the merge inside the split it
            // also gives the first row's offsets, and the loop below carries each row's
            // offsets into the next, loading one a row ahead: a program's first positions
            // wait on the search alone, one round trip to L2 fewer before its first tile.
            let (first_row, end_row, first_list) = if merged.is_some() {
                let (first, end) = held_rows(&mut b, &bal, total, (s, seg));
                (first, end, None)
            } else {
                let (first, end, list) = covered_rows(&mut b, &bal, line, (s, e));
                (first, end, Some(list))
            };
            let busy = b.lt(s, e);
            b.if_then(busy, |b| {
                if let Some(record) = record {
                    let searched = b.lt(first_row, end_row);
                    stamp(b, record, 1, searched);
                }
                let one_i = b.i32(1);
                let c_group = b.i32(g_n as i32);
                let init = first_list.map_or(vec![], |(rs, re)| vec![rs, re]);
                b.for_range(first_row, end_row, one_i, &init, |b, row, carried| {
                    let (list, next) = match *carried {
                        [rs, re] => {
                            // The next row's end, requested before this row's work
                            // (masked past the last offset: no row follows the last).
                            let row2 = b.add_c(row, 2);
                            let exists = b.le(row2, rows);
                            let p = b.add_ptr(indptr, row2);
                            let after = b.load_masked(p, Some(exists), None);
                            ((rs, re), vec![re, after])
                        }
                        _ => (list_offsets(b, indptr, row), vec![]),
                    };
                    // Offsets clamped to `0..=total` (no-ops for valid lists): whatever
                    // lists the device wrote, the arithmetic below cannot wrap, so a piece
                    // is never longer than the segment (wrapped bounds made loops of
                    // billions of steps).
                    let zero_i = b.i32(0);
                    let rs = b.maximum(list.0, zero_i);
                    let rs = b.minimum(rs, total);
                    let re = b.maximum(list.1, rs);
                    let list = (rs, b.minimum(re, total));
                    // The row's entries on the line, cut to the segment, back to entries.
                    let shift = row_shift(b, row, row_tokens);
                    let rs = b.add(list.0, shift);
                    let re = b.add(list.1, shift);
                    let from = b.maximum(s, rs);
                    let to = b.minimum(e, re);
                    let start = b.sub(from, rs);
                    let end = b.sub(to, rs);
                    let piece = b.add(pid, row);
                    let slot0 = b.mul(piece, c_group);
                    let span = Span::Entries { start, end };
                    let first_step = record.map(|r| (r, b.eq(row, first_row)));
                    item(b, row, Some(list), span, slot0, one_i, first_step);
                    if let Some(counters) = row_counters {
                        // The piece is written: the merge may take the row once every
                        // piece is (a piece holds entries exactly where the merge's
                        // arithmetic counts one, so a row's count never passes its pieces).
                        let holds = b.lt(from, to);
                        b.if_then(holds, |b| {
                            let counter = b.add_ptr(counters, row);
                            b.signal(counter);
                        });
                    }
                    if let Some((io, counters)) = merged {
                        let shape = (g_n, 32 * cfg.num_warps as usize);
                        merge_if_last(b, &io, counters, &bal, (total, seg), pid, row, shape);
                    }
                    next
                });
                if let Some(record) = record {
                    let t = b.bool(true);
                    stamp(b, record, 3, t);
                }
            });
        }
        _ => {
            let (chunk_tokens, max_chunks) = grid.expect("grid parameters");
            let (row, chunk) = if cfg.chunk_fastest {
                (b.program_id(1), b.program_id(0))
            } else {
                (b.program_id(0), b.program_id(1))
            };
            // Partial slot of query head qh0 + g: (row * G + g) * max_chunks + chunk.
            let c_group = b.i32(g_n as i32);
            let row_g = b.mul(row, c_group);
            let slot0 = b.mul(row_g, max_chunks);
            let slot0 = b.add(slot0, chunk);
            let span = Span::Chunk {
                chunk,
                tokens: chunk_tokens,
            };
            let list = sel_indptr.map(|indptr| list_offsets(&mut b, indptr, row));
            item(&mut b, row, list, span, slot0, max_chunks, None);
            if let Some((io, counters)) = merged {
                merge_chunks_if_last(&mut b, &io, counters, row, max_chunks, g_n);
            }
        }
    }
    b.finish()
}

/// The merge inside the split of the grid ([`SplitConfig::fused_merge`] without
/// `balanced`): once its chunk's partials are written, each program arrives at its row's
/// counter; the last of the row's `max_chunks` programs (every chunk, live or past the
/// row's end, arrives once) merges the group's query rows `row * G + g`, whose partials lie
/// at `(row * G + g) * max_chunks + c`, and sets the counter back to zero. One launch
/// instead of two: what a run costs the host is mostly its launches.
fn merge_chunks_if_last(
    b: &mut KernelBuilder,
    io: &MergeIo,
    counters: Value,
    row: Value,
    max_chunks: Value,
    group: usize,
) {
    let counter = b.add_ptr(counters, row);
    let before = b.arrive(counter);
    let last = b.add_c(max_chunks, -1);
    let is_last = b.eq(before, last);
    b.if_then(is_last, |b| {
        let (zero_i, one_i) = (b.i32(0), b.i32(1));
        let c_group = b.i32(group as i32);
        let first = b.mul(row, c_group);
        // One loop over the group, so that the merge is emitted once.
        b.for_range(zero_i, c_group, one_i, &[], |b, g, _| {
            let (zero_i, one_i) = (b.i32(0), b.i32(1));
            let q = b.add(first, g);
            let base = b.mul(q, max_chunks);
            merge_row(b, io, q, zero_i, max_chunks, one_i, base);
            vec![]
        });
        let zero_i = b.i32(0);
        b.store(counter, zero_i);
    });
}

/// Partials of a row whose outputs one step of the merge's L1 prefetch covers.
const PREFETCH_PIECES: usize = 64;

/// Warps of a merge program: a step's `[block_chunks, head_dim]` outputs at most 16 values
/// a thread, and at least 2 warps (4 at head_dim 256), at most 8.
pub fn merge_warps(head_dim: usize, block_chunks: usize) -> u32 {
    let least = if head_dim >= 256 { 4 } else { 2 };
    ((block_chunks * head_dim / 512) as u32).clamp(least, 8)
}

/// Log-sum-exps a merge program reads per step of its first pass: 4 a thread.
pub fn merge_lse_width(head_dim: usize, block_chunks: usize) -> usize {
    4 * 32 * merge_warps(head_dim, block_chunks) as usize
}

/// The rows a program of the balanced split visits: from the last row starting at or
/// before its segment's start `s` to the last starting before its end `e` (row r starts
/// at `indptr[r] + r * row_tokens` on the line, `line` long). Returns `first..end` and the
/// first row's offsets `indptr[first]`, `indptr[first + 1]`, from the nearest row starts
/// at or before `s` and after it (the last offset where no row starts after `s`): the
/// search's own loads, so the row's positions need no round trip to L2 for them. They are
/// exact for valid lists; for others they stay on the line, so nothing after them wraps.
fn covered_rows(
    b: &mut KernelBuilder,
    bal: &Balance,
    line: Value,
    (s, e): (Value, Value),
) -> (Value, Value, (Value, Value)) {
    let zero_i = b.i32(0);
    let step = b.i32(SEARCH_ROWS as i32);
    let (none_le, none_gt) = (b.i32(i32::MIN), b.i32(i32::MAX));
    let init = [zero_i, zero_i, none_le, none_gt];
    let found = b.for_range(zero_i, bal.rows, step, &init, |b, r0, c| {
        let r = b.arange(0, SEARCH_ROWS as i64);
        let r = b.add(r0, r);
        let ok = b.lt(r, bal.rows);
        let p = b.add_ptr(bal.sel_indptr, r);
        let first = b.load_masked(p, Some(ok), None);
        let shift = b.mul(r, bal.row_tokens);
        let first = b.add(first, shift);
        let big = b.i32(i32::MAX);
        let first = b.select(ok, first, big);
        let (one_i, zero_i) = (b.i32(1), b.i32(0));
        let at_or_before = b.le(first, s);
        let ones = b.select(at_or_before, one_i, zero_i);
        let n_le = b.sum(ones, 0);
        let before_end = b.lt(first, e);
        let ones = b.select(before_end, one_i, zero_i);
        let n_lt = b.sum(ones, 0);
        // The nearest starts at or before `s` and after it (masked rows start at
        // `i32::MAX`, which changes neither).
        let le = b.select(at_or_before, first, none_le);
        let max_le = b.max(le, 0);
        let gt = b.select(at_or_before, none_gt, first);
        let min_gt = b.min(gt, 0);
        vec![
            b.add(c[0], n_le),
            b.add(c[1], n_lt),
            b.maximum(c[2], max_le),
            b.minimum(c[3], min_gt),
        ]
    });
    let first = b.add_c(found[0], -1);
    let first = b.maximum(first, zero_i);
    // The first row's start and the next row's (the line's end past the last row), kept
    // on the line: no-ops for valid lists.
    let start = b.maximum(found[2], zero_i);
    let next = b.minimum(found[3], line);
    let starts = b.mul(first, bal.row_tokens);
    let rs = b.sub(start, starts);
    let starts = b.add(starts, bal.row_tokens);
    let re = b.sub(next, starts);
    (first, found[1], (rs, re))
}

/// A range of rows covering those whose pieces lie in the segment starting at `s` (`seg`
/// long), by the arithmetic of [`row_pieces`] (offsets clamped; a row without entries
/// belongs to the segment its start falls in), whatever order the lists' offsets are in:
/// with the merge inside the split, every program that counts a row's pieces visits the
/// row and arrives at its counter, so every counter ends the launch at its row's count even
/// for bad lists. Returns `first..end`; rows in it that hold nothing here are visited for
/// nothing.
fn held_rows(
    b: &mut KernelBuilder,
    bal: &Balance,
    total: Value,
    (s, seg): (Value, Value),
) -> (Value, Value) {
    let zero_i = b.i32(0);
    let e = b.add(s, seg);
    let step = b.i32(SEARCH_ROWS as i32);
    let none_lo = b.i32(i32::MAX);
    let none_hi = b.i32(-1);
    let range = b.for_range(zero_i, bal.rows, step, &[none_lo, none_hi], |b, r0, c| {
        let r = b.arange(0, SEARCH_ROWS as i64);
        let r = b.add(r0, r);
        let ok = b.lt(r, bal.rows);
        // The row from its start to its last entry (one past its start when it has none)
        // meeting the segment: every row holding a piece here or starting here, and maybe
        // a row whose stand-in entries alone meet it (visited for nothing).
        let (start, _, end) = row_on_line(b, bal, total, r, Some(ok));
        let past_start = b.add_c(start, 1);
        let end = b.maximum(end, past_start);
        let before_end = b.lt(start, e);
        let after_start = b.gt(end, s);
        let held = b.and(before_end, after_start);
        let held = b.and(held, ok);
        let big = b.i32(i32::MAX);
        let lo = b.select(held, r, big);
        let minus1 = b.i32(-1);
        let hi = b.select(held, r, minus1);
        let lo = b.min(lo, 0);
        let hi = b.max(hi, 0);
        vec![b.minimum(c[0], lo), b.maximum(c[1], hi)]
    });
    let end = b.add_c(range[1], 1);
    // No row held: an empty range.
    (b.minimum(range[0], end), end)
}

/// The merge inside the split (see [`SplitConfig::fused_merge`]), after program `pid` has
/// written its piece of row `row`, if it holds one (a row without entries is held by the
/// program its start falls in, which writes its empty output). A row of at most
/// `io.block_chunks` (K) pieces: the program arriving last at the row's counter merges
/// them. A longer row merges in two levels, so that no program merges more than about
/// `K + n / K` pieces after its own: the last of each group of K consecutive pieces (counted
/// at the group's first slot) merges the group into one partial (in the second half of the
/// partial buffers, at the same slot), then arrives at the row's counter, and the last
/// group to arrive merges the groups. Each counter is set back to zero by its last arrival.
/// Counters: `[programs + rows]` for groups, then `[rows]` for rows.
#[allow(clippy::too_many_arguments)]
fn merge_if_last(
    b: &mut KernelBuilder,
    io: &MergeIo,
    counters: Value,
    bal: &Balance,
    (total, seg): (Value, Value),
    pid: Value,
    row: Value,
    (group, threads): (usize, usize),
) {
    let (lo, hi, start) = row_pieces(b, bal, total, seg, row);
    let piece = b.add(pid, row);
    let from_lo = b.ge(piece, lo);
    let below_hi = b.lt(piece, hi);
    let holds = b.and(from_lo, below_hi);
    let empty = b.eq(lo, hi);
    let owner = b.div(start, seg);
    let owns = b.eq(owner, pid);
    let owns_empty = b.and(empty, owns);
    let mine = b.or(holds, owns_empty);
    b.if_then(mine, |b| {
        let k = io.block_chunks as i32;
        let c_k = b.i32(k);
        let (zero_i, one_i) = (b.i32(0), b.i32(1));
        let n = b.sub(hi, lo);
        // Pieces' slots, and as many again for the groups' partials and counters.
        let slots = b.add(bal.programs, bal.rows);
        let row_at = b.add(slots, row);
        let two = b.gt(n, c_k);
        // This piece's group (two levels only).
        let in_row = b.sub(piece, lo);
        let g = b.div(in_row, c_k);
        let g_first = b.mul(g, c_k);
        let g_lo = b.add(lo, g_first);
        let left = b.sub(n, g_first);
        let g_n = b.minimum(left, c_k);
        let groups = b.add_c(n, (k - 1) as i64);
        let groups = b.div(groups, c_k);
        let g_slot = b.add(g_lo, slots);
        let groups_first = b.add(lo, slots);
        // Level 0: the row (one level) or the piece's group; level 1: the row's groups.
        // One loop, so that the merge is emitted once (each copy would hold registers).
        let two_i = b.i32(2);
        let levels = b.select(two, two_i, one_i);
        // Whether this program goes on to the next level (an i32: a predicate carried
        // through the loop made ptxas spill).
        b.for_range(zero_i, levels, one_i, &[one_i], |b, level, carried| {
            let zero_i = b.i32(0);
            let active = b.ne(carried[0], zero_i);
            let first_level = b.eq(level, zero_i);
            let group_level = b.and(first_level, two);
            let at = b.select(group_level, g_lo, row_at);
            let counter = b.add_ptr(counters, at);
            let whole = b.select(two, groups, n);
            let count = b.select(group_level, g_n, whole);
            let later = b.not(first_level);
            let from_groups = b.and(two, later);
            let start = b.select(group_level, g_lo, lo);
            let start = b.select(from_groups, groups_first, start);
            let stride = b.select(from_groups, c_k, one_i);
            let last = b.if_else(
                active,
                |b| {
                    let before = b.arrive(counter);
                    let one_i = b.i32(1);
                    let arrivals = b.maximum(count, one_i);
                    let final_count = b.add_c(arrivals, -1);
                    let is_last = b.eq(before, final_count);
                    b.if_then(is_last, |b| {
                        let to_row = b.not(group_level);
                        let into = (to_row, g_slot);
                        merge_pieces(b, io, (start, count, stride), into, row, group, threads);
                        // Every arrival is in: the counter is free for the next launch.
                        let zero_i = b.i32(0);
                        b.store(counter, zero_i);
                    });
                    let (one_i, zero_i) = (b.i32(1), b.i32(0));
                    vec![b.select(is_last, one_i, zero_i)]
                },
                |b| vec![b.i32(0)],
            );
            vec![last[0]]
        });
    });
}

/// Merges `count` pieces (slots `first + i * stride`) for all `group` query heads at once
/// into `(to_row, slot)`: with `to_row` the output, LSE (and SparQ's transform) of token-list
/// row `row`, else one partial result in the pieces' own format at piece slot `slot` (a
/// group of pieces merged into one for the second level), chosen at run time so that the
/// merge is emitted once. It runs on the critical path of a row's last piece, so its chain
/// of loads is kept short. Pass 1 reads the pieces' LSEs as `[pieces, heads]` blocks; pass 2
/// takes a few pieces a step, each piece's `[heads, head_dim]` outputs one load, all issued
/// before any is used: `count / 32 + count / 2` round trips to L2 on the tensor-core split,
/// whatever the group, where a loop over the heads would cost `2 * group` at the least.
#[allow(clippy::too_many_arguments)]
fn merge_pieces(
    b: &mut KernelBuilder,
    io: &MergeIo,
    (first, count, stride): (Value, Value, Value),
    (to_row, slot): (Value, Value),
    row: Value,
    group: usize,
    threads: usize,
) {
    let d = io.head_dim;
    let (part_o, part_lse) = (io.part_o, io.part_lse);
    let c_group = b.i32(group as i32);
    let heads = b.arange(0, group as i64);
    let neg_inf = b.f32(f32::NEG_INFINITY);
    let zero_f = b.f32(0.0);
    let zero_i = b.i32(0);
    // Pass 1: the largest LSE of each head, 4 values a thread a step.
    let p1 = (4 * threads / group).clamp(1, 32);
    let step = b.i32(p1 as i32);
    let m0 = b.splat(neg_inf, &[group]);
    let m = b.for_range(zero_i, count, step, &[m0], |b, i0, carried| {
        let i = b.arange(0, p1 as i64);
        let i = b.add(i0, i);
        let ok = b.lt(i, count);
        let c = b.mul(i, stride);
        let c = b.add(first, c);
        let c = b.mul(c, c_group);
        let c = b.expand(c, 1, group);
        let hs = b.expand(heads, 0, p1);
        let slots = b.add(c, hs);
        let p = b.add_ptr(part_lse, slots);
        let mask = b.expand(ok, 1, group);
        let l = b.load_masked(p, Some(mask), Some(neg_inf));
        let mx = b.max(l, 0);
        vec![b.maximum(carried[0], mx)]
    })[0];
    let live = b.gt(m, neg_inf);
    let m_safe = b.select(live, m, zero_f);
    // Pass 2: P pieces a step (at most 2), P [heads, head_dim] loads of up to 32 values a
    // thread together: 4 raised the tensor-core split from 168 registers to 250 (its main
    // loop and this share one allocation).
    let pieces = 1usize;
    let step = b.i32(pieces as i32);
    let a0 = b.splat(zero_f, &[group, d]);
    let w0 = b.splat(zero_f, &[group]);
    let dr = b.arange(0, d as i64);
    let fin = b.for_range(zero_i, count, step, &[a0, w0], |b, i0, carried| {
        let mut loaded = vec![];
        for k in 0..pieces {
            let i = b.add_c(i0, k as i64);
            let ok = b.lt(i, count);
            let ok = b.splat(ok, &[group]);
            let c = b.mul(i, stride);
            let c = b.add(first, c);
            let slots = slots_of(b, c, heads, c_group);
            let p = b.add_ptr(part_lse, slots);
            let l = b.load_masked(p, Some(ok), Some(neg_inf));
            // The outputs beside the LSEs, not after them (see `merge_row`).
            let p = row_ptrs(b, part_o, slots, dr);
            let mask = b.expand(ok, 1, d);
            let o = b.load_masked(p, Some(mask), None);
            let has = b.gt(l, neg_inf);
            let o = from_partial(b, o);
            let kept = b.expand(has, 1, d);
            loaded.push((l, has, b.select(kept, o, zero_f)));
        }
        let (mut acc, mut ws) = (carried[0], carried[1]);
        for (l, has, o) in loaded {
            let dl = b.sub(l, m_safe);
            let w = b.exp2(dl);
            let w = b.select(has, w, zero_f);
            let we = b.expand(w, 1, d);
            let ow = b.mul(o, we);
            acc = b.add(acc, ow);
            ws = b.add(ws, w);
        }
        vec![acc, ws]
    });
    let (acc, ws) = (fin[0], fin[1]);
    let (inv, lse2) = normalizer(b, ws, m);
    let ie = b.expand(inv, 1, d);
    let y = b.mul(acc, ie);
    // A group's partial, in the pieces' own format: the normalised output, base-2 LSE.
    let kept_as_partial = b.not(to_row);
    let heads_mask = b.splat(kept_as_partial, &[group]);
    let slots = slots_of(b, slot, heads, c_group);
    let p = b.add_ptr(part_lse, slots);
    b.store_masked(p, lse2, Some(heads_mask));
    let p = row_ptrs(b, part_o, slots, dr);
    let mask = b.expand(heads_mask, 1, d);
    let partial = to_partial(b, part_o, y);
    b.store_masked(p, partial, Some(mask));
    // The row's results.
    let heads_mask = b.splat(to_row, &[group]);
    let lse = natural_log(b, lse2);
    let one = b.f32(1.0);
    let q0 = b.mul(row, c_group);
    let q_rows = b.add(heads, q0);
    let p = b.add_ptr(io.lse_out, q_rows);
    b.store_masked(p, lse, Some(heads_mask));
    let y = match io.sparq {
        Some((alpha, v_mean, hq, hkv)) => {
            let p = b.add_ptr(alpha, q_rows);
            let a = b.load(p);
            let vm = v_mean_row(b, v_mean, (hq, hkv), q0, dr);
            let vm = b.expand(vm, 0, group);
            let ae = b.expand(a, 1, d);
            let ay = b.mul(y, ae);
            let one_m = b.sub(one, a);
            let one_m = b.expand(one_m, 1, d);
            let bv = b.mul(vm, one_m);
            b.add(ay, bv)
        }
        None => y,
    };
    let y = b.cast(y, io.dtype);
    let p = row_ptrs(b, io.out, q_rows, dr);
    let mask = b.expand(heads_mask, 1, d);
    b.store_masked(p, y, Some(mask));
}

/// The partial slots of piece `piece`'s heads: `piece * group + heads`.
fn slots_of(b: &mut KernelBuilder, piece: Value, heads: Value, c_group: Value) -> Value {
    let c = b.mul(piece, c_group);
    b.add(heads, c)
}

/// Builds the merge kernel. Parameters, in order: `part_o`, `part_lse` (from the split
/// kernel), `out` (`[batch * q_heads, D]`, the config's dtype), `lse` (f32
/// `[batch * q_heads]`, natural log; `-inf` for an empty row), with `sparq` also `alpha`
/// (f32 per query row) and `v_mean` (`[batch * kv_heads, D]`); then the i32 scalars
/// `max_chunks` and, with `sparq`, `num_q_heads`, `num_kv_heads`. Grid: `batch * q_heads`.
/// With `balanced`, `sel_indptr` follows `v_mean` (or `lse`), then with `row_signals`
/// `counters` (the split's), and the i32 scalars `group` (query heads per token-list row),
/// `rows`, `programs` (of the split grid), `num_indices`, `min_tokens` and `row_tokens` (as
/// given to the split) replace `max_chunks`.
pub fn build_merge(cfg: &MergeConfig) -> Result<Kernel, CompileError> {
    let (d, cb) = (cfg.head_dim, cfg.block_chunks);
    let name = format!(
        "attn_merge_d{}_{}_c{}{}{}{}{}{}",
        d,
        cfg.dtype.name(),
        cb,
        if cfg.sparq { "_sparq" } else { "" },
        if cfg.balanced { "_bal" } else { "" },
        if cfg.row_signals { "_rs" } else { "" },
        partial_suffix(cfg.partial_dtype),
        if cfg.timeline { "_timeline" } else { "" }
    );
    if !matches!(d, 64 | 128 | 256)
        || !cb.is_power_of_two()
        || cb > 64
        || !matches!(cfg.dtype, DType::F16 | DType::BF16)
        || (cfg.row_signals && !cfg.balanced)
        || !matches!(cfg.partial_dtype, DType::F32 | DType::F16 | DType::BF16)
    {
        return Err(unsupported(
            &name,
            format!("unsupported configuration {cfg:?}"),
        ));
    }
    let mut b = KernelBuilder::new(&name);
    b.set_num_warps(merge_warps(d, cb));
    let part_o = b.param_ptr("part_o", cfg.partial_dtype);
    let part_lse = b.param_ptr("part_lse", DType::F32);
    let (out, lse_out, sparq) = merge_output_params(&mut b, cfg.dtype, cfg.sparq);
    let indptr = if cfg.balanced {
        Some(b.param_ptr("sel_indptr", DType::I32))
    } else {
        None
    };
    let counters = cfg.row_signals.then(|| b.param_ptr("counters", DType::I32));
    let timeline = (cfg.balanced && cfg.timeline).then(|| b.param_ptr("timeline", DType::I64));
    // `max_chunks`, or with a balanced split the query heads per row (`group`) and what
    // places the row's pieces.
    let per_row = b.param_scalar(
        if cfg.balanced { "group" } else { "max_chunks" },
        DType::I32,
    );
    let split = if cfg.balanced {
        Some([
            b.param_scalar("rows", DType::I32),
            b.param_scalar("programs", DType::I32),
            b.param_scalar("num_indices", DType::I32),
            b.param_scalar("min_tokens", DType::I32),
            b.param_scalar("row_tokens", DType::I32),
        ])
    } else {
        None
    };
    let heads = if cfg.sparq {
        Some((
            b.param_scalar("num_q_heads", DType::I32),
            b.param_scalar("num_kv_heads", DType::I32),
        ))
    } else {
        None
    };
    let io = MergeIo {
        part_o,
        part_lse,
        out,
        lse_out,
        sparq: match (sparq, heads) {
            (Some((alpha, v_mean)), Some((hq, hkv))) => Some((alpha, v_mean, hq, hkv)),
            _ => None,
        },
        head_dim: d,
        block_chunks: cb,
        dtype: cfg.dtype,
    };
    let row = b.program_id(0);
    // The program's timeline record (after the split's programs' records): its start and
    // SM now.
    let record = match (timeline, split) {
        (Some(t), Some([_, programs, ..])) => {
            let at = b.add(programs, row);
            Some(open_record(&mut b, t, at, 3, &[]))
        }
        _ => None,
    };
    // This query row's partials: index `c * stride + base` for `c` in `lo..hi`; with a
    // balanced split also its token-list row and the count of token-list rows.
    let zero_i = b.i32(0);
    let one_i = b.i32(1);
    let (lo, hi, stride, base, list_row) = match (indptr, split) {
        (Some(indptr), Some([rows, programs, num_indices, min_tokens, row_tokens])) => {
            let r = b.div(row, per_row);
            let g = b.rem(row, per_row);
            let bal = Balance {
                sel_indptr: indptr,
                rows,
                num_indices,
                programs,
                min_tokens,
                row_tokens,
            };
            let (total, _, seg) = balanced_segments(&mut b, &bal);
            let (lo, hi, _) = row_pieces(&mut b, &bal, total, seg, r);
            (lo, hi, per_row, g, Some((r, rows)))
        }
        _ => (zero_i, per_row, one_i, b.mul(row, per_row), None),
    };
    // Everything above reads only what was written before the split ran; the partials
    // below are the split's, so the merge waits for them here (its programs may have
    // started during the split's last programs: see `OpKind::WaitPriorGrid`): for the
    // whole split, or with signals for its own row's pieces. Then the row's count of
    // arrivals runs on across launches and this program keeps, at `counters[rows + row]`,
    // the count it has taken up to: it waits until its row's pieces (`hi - lo`, as the
    // split arrives once a piece) are in on top of that, and for the whole split only if
    // the polls run out.
    let signals = counters.zip(list_row).map(|(counters, (r, rows))| {
        let counter = b.add_ptr(counters, r);
        let at = b.add(rows, row);
        let seen = b.add_ptr(counters, at);
        let before = b.load(seen);
        let pieces = b.sub(hi, lo);
        let target = b.add(before, pieces);
        let count = b.await_count(counter, target);
        let behind = b.sub(count, target);
        let zero_i = b.i32(0);
        let short = b.lt(behind, zero_i);
        // Where the polls ran out, the whole split; then its final count, every arrival in.
        let taken = b.if_else(
            short,
            |b| {
                b.wait_prior_grid();
                vec![b.load_fresh(counter, None)]
            },
            |_| vec![count],
        );
        (seen, taken[0])
    });
    if signals.is_none() {
        b.wait_prior_grid();
    }
    let t = b.bool(true);
    if let Some(record) = record {
        stamp(&mut b, record, 1, t);
    }
    merge_row(&mut b, &io, row, lo, hi, stride, base);
    if let Some((seen, taken)) = signals {
        // Every arrival of this launch at the row is in `taken` (a row's count never passes
        // its pieces), so the next launch waits for its own on top of it.
        b.store(seen, taken);
    }
    if let Some(record) = record {
        stamp(&mut b, record, 2, t);
    }
    b.finish()
}

/// The merge's output parameters, in order: `out` (`dtype`), `lse` (f32) and, with
/// `sparq`, `alpha` (f32) and `v_mean` (`dtype`).
type MergeOutputs = (Value, Value, Option<(Value, Value)>);
fn merge_output_params(b: &mut KernelBuilder, dtype: DType, sparq: bool) -> MergeOutputs {
    let out = b.param_ptr("out", dtype);
    let lse_out = b.param_ptr("lse", DType::F32);
    let sparq = sparq.then(|| {
        (
            b.param_ptr("alpha", DType::F32),
            b.param_ptr("v_mean", dtype),
        )
    });
    (out, lse_out, sparq)
}

/// Where a merge reads and writes.
#[derive(Clone, Copy)]
struct MergeIo {
    part_o: Value,
    part_lse: Value,
    out: Value,
    lse_out: Value,
    /// SparQ's transform: `alpha`, `v_mean`, `num_q_heads`, `num_kv_heads`.
    sparq: Option<(Value, Value, Value, Value)>,
    head_dim: usize,
    block_chunks: usize,
    dtype: DType,
}

/// The kernel-name suffix of a partial-output type (none for f32).
fn partial_suffix(dtype: DType) -> String {
    match dtype {
        DType::F32 => String::new(),
        t => format!("_p{}", t.name()),
    }
}

/// A partial result's f32 outputs `o` in the type `part_o` holds them in
/// ([`SplitConfig::partial_dtype`]).
fn to_partial(b: &mut KernelBuilder, part_o: Value, o: Value) -> Value {
    match b.ty(part_o).elem.pointee() {
        Some(t) if t != DType::F32 => b.cast(o, t),
        _ => o,
    }
}

/// Partial outputs as loaded from `part_o`, in f32 for the merge's arithmetic.
fn from_partial(b: &mut KernelBuilder, o: Value) -> Value {
    match b.ty(o).elem.dtype() {
        Some(t) if t != DType::F32 => b.cast(o, DType::F32),
        _ => o,
    }
}

/// Row(s) `r` of the balanced split on its line (see `balanced_segments`): where the row
/// starts, and where its entries begin and end, from its offsets clamped to `0..=total`
/// (an end before the start taken as the start). `ok` masks the loads of a block of rows.
fn row_on_line(
    b: &mut KernelBuilder,
    bal: &Balance,
    total: Value,
    r: Value,
    ok: Option<Value>,
) -> (Value, Value, Value) {
    let zero_i = b.i32(0);
    let p = b.add_ptr(bal.sel_indptr, r);
    let rs = b.load_masked(p, ok, None);
    let r1 = b.add_c(r, 1);
    let p = b.add_ptr(bal.sel_indptr, r1);
    let re = b.load_masked(p, ok, None);
    let rs = b.maximum(rs, zero_i);
    let rs = b.minimum(rs, total);
    let re = b.maximum(re, rs);
    let re = b.minimum(re, total);
    let starts = b.mul(r, bal.row_tokens);
    let start = b.add(rs, starts);
    let shift = row_shift(b, r, bal.row_tokens);
    (start, b.add(rs, shift), b.add(re, shift))
}

/// Row r of the balanced split's token lists: its pieces' slots `lo..hi` (`lo == hi` for a
/// row without entries) and where the row starts on the line. Row r's entries `rs..re`
/// (on the line) lie in segments `rs / seg ..= (re - 1) / seg`, and the piece of segment j
/// in row r is `j + r` (see `balanced_segments`). Offsets are clamped to `0..=total`,
/// so whatever the lists say the slots stay inside the `programs + rows` allocated.
fn row_pieces(
    b: &mut KernelBuilder,
    bal: &Balance,
    total: Value,
    seg: Value,
    r: Value,
) -> (Value, Value, Value) {
    let (start, rs, re) = row_on_line(b, bal, total, r, None);
    let j0 = b.div(rs, seg);
    let lo = b.add(j0, r);
    let last = b.add_c(re, -1);
    let j1 = b.div(last, seg);
    let hi = b.add(j1, r);
    let hi = b.add_c(hi, 1);
    let some = b.lt(rs, re);
    (lo, b.select(some, hi, lo), start)
}

/// From the weights' sum `s` and the largest LSE `m` (base 2) they are relative to: what
/// scales the weighted outputs (`1 / s`, 0 for an empty row) and the LSE in base 2
/// (`-inf` for an empty row). Scalars or blocks of one shape.
fn normalizer(b: &mut KernelBuilder, s: Value, m: Value) -> (Value, Value) {
    let (zero, one) = (b.f32(0.0), b.f32(1.0));
    let pos = b.gt(s, zero);
    let s_safe = b.select(pos, s, one);
    let inv = b.div(one, s_safe);
    let inv = b.select(pos, inv, zero);
    let lg = b.log2(s_safe);
    let lse2 = b.add(m, lg);
    let neg_inf = b.f32(f32::NEG_INFINITY);
    (inv, b.select(pos, lse2, neg_inf))
}

/// A base-2 LSE in natural log, as the outputs give it (`-inf` stays).
fn natural_log(b: &mut KernelBuilder, lse2: Value) -> Value {
    let ln2 = b.f32(std::f32::consts::LN_2);
    b.mul(lse2, ln2)
}

/// Pointers to columns `dr` (`[head_dim]`) of rows `rows` (i32 `[n]`) of a row-major
/// `[_, head_dim]` buffer at `base`: `[n, head_dim]`, 64-bit offsets.
fn row_ptrs(b: &mut KernelBuilder, base: Value, rows: Value, dr: Value) -> Value {
    let (n, d) = (b.ty(rows).shape[0], b.ty(dr).shape[0]);
    let rows = b.cast(rows, DType::I64);
    let rows = b.mul_c(rows, d as i64);
    let rows = b.expand(rows, 1, d);
    let cols = b.cast(dr, DType::I64);
    let cols = b.expand(cols, 0, n);
    let off = b.add(rows, cols);
    b.add_ptr(base, off)
}

/// SparQ's running mean of V (f32, the columns `dr`) for the KV head that serves query
/// row `q_row` (`v_mean` is `[batch * kv_heads, head_dim]`; `heads` = (q heads, KV heads)).
fn v_mean_row(
    b: &mut KernelBuilder,
    v_mean: Value,
    (hq, hkv): (Value, Value),
    q_row: Value,
    dr: Value,
) -> Value {
    let d = b.ty(dr).shape[0] as i64;
    let batch = b.div(q_row, hq);
    let qh = b.rem(q_row, hq);
    let qpk = b.div(hq, hkv);
    let kvh = b.div(qh, qpk);
    let vr = b.mul(batch, hkv);
    let vr = b.add(vr, kvh);
    let vr64 = b.cast(vr, DType::I64);
    let vo = b.mul_c(vr64, d);
    let p = b.add_ptr(v_mean, vo);
    let p = b.add_ptr(p, dr);
    let vm = b.load(p);
    b.cast(vm, DType::F32)
}

/// Combines query row `row`'s partials (slots `c * stride + base` for `c` in `lo..hi`) by
/// their log-sum-exps and writes its output, natural-log LSE and (SparQ) transform.
#[allow(clippy::too_many_arguments)]
fn merge_row(
    b: &mut KernelBuilder,
    io: &MergeIo,
    row: Value,
    lo: Value,
    hi: Value,
    stride: Value,
    base: Value,
) {
    let (d, cb) = (io.head_dim, io.block_chunks);
    let (part_o, part_lse, out, lse_out) = (io.part_o, io.part_lse, io.out, io.lse_out);
    let wide = merge_lse_width(d, cb);
    let neg_inf = b.f32(f32::NEG_INFINITY);
    let zero_f = b.f32(0.0);
    let dr = b.arange(0, d as i64);
    // The LSEs of partials `c0 .. c0 + n` (-inf past `hi`), which lie before `hi`, and
    // their indices.
    let lses = |b: &mut KernelBuilder, c0: Value, n: usize| -> (Value, Value, Value) {
        let c = b.arange(0, n as i64);
        let c = b.add(c0, c);
        let ok = b.lt(c, hi);
        let e = b.mul(c, stride);
        let e = b.add(e, base);
        let p = b.add_ptr(part_lse, e);
        (b.load_masked(p, Some(ok), Some(neg_inf)), ok, e)
    };
    // The LSEs and outputs of partials `c0 .. c0 + cb` (masked past `hi`), and which exist.
    // Both loads leave together: the outputs are masked by the index alone and those of
    // partials without tokens (`lse = -inf`, outputs never written) dropped after, so a
    // step waits on one round trip, not on the LSEs and then the outputs.
    let load_step = |b: &mut KernelBuilder, c0: Value| -> (Value, Value, Value) {
        let (l, ok, e) = lses(b, c0, cb);
        let p = row_ptrs(b, part_o, e, dr);
        let okx = b.expand(ok, 1, d);
        let o = b.load_masked(p, Some(okx), None);
        let has = b.gt(l, neg_inf);
        let ok = b.and(ok, has);
        let o = from_partial(b, o);
        let okx = b.expand(ok, 1, d);
        let zero_f = b.f32(0.0);
        (l, b.select(okx, o, zero_f), ok)
    };
    // Pass 2's first step is loaded before pass 1 so that both go to L2 together: a row
    // of at most `cb` partials (most rows) then costs one round trip, not two.
    let first = load_step(b, lo);
    // The partials of the later steps, brought into L1 meanwhile: each later step then
    // waits on L1, not on a round trip to L2 of its own (on an H100 the skewed benchmark's
    // rows of 17 to 47 pieces ended the merge about 2.5 us after all the others).
    let after = b.add_c(lo, cb as i64);
    let step = b.i32(PREFETCH_PIECES as i32);
    let size = b.ty(part_o).elem.pointee().map_or(4, |t| t.size_bytes());
    b.for_range(after, hi, step, &[], |b, c0, _| {
        let lines = (d * size).div_ceil(128) as i64;
        let c = b.arange(0, PREFETCH_PIECES as i64);
        let c = b.add(c0, c);
        let ok = b.lt(c, hi);
        let e = b.mul(c, stride);
        let e = b.add(e, base);
        let e = b.cast(e, DType::I64);
        let e = b.mul_c(e, d as i64);
        let e = b.expand(e, 1, lines as usize);
        let line = b.arange(0, lines);
        let line = b.mul_c(line, (128 / size) as i64);
        let line = b.cast(line, DType::I64);
        let line = b.expand(line, 0, PREFETCH_PIECES);
        let off = b.add(e, line);
        let p = b.add_ptr(part_o, off);
        let okx = b.expand(ok, 1, lines as usize);
        b.prefetch(p, Some(okx), 128, CacheLevel::L1);
        vec![]
    });
    // Pass 1: the largest chunk LSE.
    let step = b.i32(wide as i32);
    let m0 = b.splat(neg_inf, &[wide]);
    let mv = b.for_range(lo, hi, step, &[m0], |b, c0, carried| {
        let (l, _, _) = lses(b, c0, wide);
        vec![b.maximum(carried[0], l)]
    })[0];
    let mx = b.max(mv, 0);
    let live = b.gt(mx, neg_inf);
    let m_safe = b.select(live, mx, zero_f);
    // Pass 2: chunk outputs weighted by exp2(lse - max).
    let weigh = |b: &mut KernelBuilder, (l, o, ok): (Value, Value, Value)| -> (Value, Value) {
        let dl = b.sub(l, m_safe);
        let w = b.exp2(dl);
        let w = b.select(ok, w, zero_f);
        let we = b.expand(w, 1, d);
        (b.mul(o, we), w)
    };
    let (a0, w0) = weigh(b, first);
    let step = b.i32(cb as i32);
    let next = b.add(lo, step);
    let fin = b.for_range(next, hi, step, &[a0, w0], |b, c0, carried| {
        let loaded = load_step(b, c0);
        let (ow, w) = weigh(b, loaded);
        let acc = b.add(carried[0], ow);
        let ws = b.add(carried[1], w);
        vec![acc, ws]
    });
    let y = b.sum(fin[0], 0);
    let s = b.sum(fin[1], 0);
    let (inv, lse2) = normalizer(b, s, mx);
    let lse = natural_log(b, lse2);
    let y = b.mul(y, inv);
    let one = b.f32(1.0);
    let p = b.add_ptr(lse_out, row);
    b.store(p, lse);
    let y = match io.sparq {
        Some((alpha, v_mean, hq, hkv)) => {
            let p = b.add_ptr(alpha, row);
            let a = b.load(p);
            let vm = v_mean_row(b, v_mean, (hq, hkv), row, dr);
            let ay = b.mul(y, a);
            let one_m = b.sub(one, a);
            let bv = b.mul(vm, one_m);
            b.add(ay, bv)
        }
        None => y,
    };
    let y = b.cast(y, io.dtype);
    let row64 = b.cast(row, DType::I64);
    let o = b.mul_c(row64, d as i64);
    let p = b.add_ptr(out, o);
    let p = b.add_ptr(p, dr);
    b.store(p, y);
}
