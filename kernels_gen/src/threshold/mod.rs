//! The fused threshold search (Twilight Section 4.2, Algorithm 1) and the pruning policies
//! it runs.
//!
//! For one row of estimated logits `s` (one query head's scores over its candidates),
//! `w = softmax(s * scale)`. A [`Policy`] is a predicate over the set kept at threshold `t`,
//! `{i : w_i >= t}`, that holds for small `t` and fails past one point (it is monotone: the
//! kept set only shrinks as `t` grows). The search finds the largest threshold at which it
//! holds and keeps that set; ties at the cut stay together. Top-p is `mass >= p`, top-k
//! `count >= k` ([`crate::policies`]).
//!
//! Per row: softmax statistics (the row maximum, `e_i = 2^((s_i - max) * scale * log2 e)`
//! and their sum `z`; weights are `e / z`, the maximum's `e` is exactly 1), then a bracket
//! `[lo, hi)` with the policy holding at `lo` and failing at `hi` (in the streamed search
//! first narrowed to one bucket of a histogram of the weights' bits, `histogram.rs`),
//! narrowed by steps that
//! each tally (mass and count) the sets at one or a few points inside it in one pass over
//! the row, until the sets at the two ends differ by one candidate (`search.rs` has the
//! details). The tallies are written as separate `where`/`sum` calls; the compiler's
//! `fuse_reductions` pass makes each step's one pass with one exchange between warps. The
//! kept positions are then compacted in order (a prefix sum) into one CSR list for all
//! rows, each row finding its place by a look-back over the rows before it (`output.rs`).
//!
//! Where the row lives: in registers ([`build_search`], rows up to [`MAX_BLOCK`]), or
//! streamed through tiles with the weights staged in a workspace
//! ([`build_search_streaming`], any length), the workspace being the program's shared
//! memory for rows that fit it (`SearchConfig::shared`, the default for such rows).
//!
//! Arithmetic is IEEE f32 (no flush to zero): denormal weights compare and add exactly.
//! Rows with a NaN or infinite logit are marked invalid (flag 1) and keep every candidate;
//! other rows are unaffected. An empty row keeps nothing. With GQA the candidates are per
//! (batch, KV head) and each of the group's query heads is searched on its own scores; the
//! output is the union of the group's kept sets (Twilight Appendix B.2), so attention reads
//! each kept token's K and V once per group. A program searches a row's heads one after
//! another, or with `SearchConfig::split_heads` (GQA's default) one head each, the row's
//! last program to finish writing the union.

mod histogram;
mod output;
mod resident;
mod search;
mod streaming;

pub use histogram::MAX_ROW as HISTOGRAM_MAX_ROW;
pub use output::MAX_TOTAL as OUTPUT_MAX_TOTAL;
pub use resident::build_search;
pub use streaming::build_search_streaming;

use dusk_compiler::{CompileError, DType, Kernel, KernelBuilder, Value};

/// The statistics of the set kept at a candidate threshold that a policy may read.
pub struct KeptStats {
    /// Sum of the kept weights (weights sum to 1 over the row), f32.
    pub mass: Value,
    /// Number of kept candidates, i32.
    pub count: Value,
    /// The smallest kept weight, f32.
    pub threshold: Value,
    /// The largest weight left out (negative when every candidate is kept), f32.
    pub below: Value,
    /// The row's largest weight, f32.
    pub max_weight: Value,
    /// Candidates in the row, i32.
    pub candidates: Value,
}

/// One parameter of a policy: a value per row (query head), given when the plan is made
/// and checked on the host before any launch.
#[derive(Clone, Copy, Debug)]
pub struct PolicyParam {
    pub name: &'static str,
    /// `F32` or `I32`.
    pub dtype: DType,
    /// Whether a value is allowed.
    pub check: fn(f64) -> bool,
    /// What `check` asks, for errors: `p > 0.0 && p <= 1.0`.
    pub expected: &'static str,
}

/// The statistic a policy's cut sits at, for the search to interpolate toward: the kept
/// mass reaching parameter `i` (top-p's `p`), or the count reaching it (top-k's `k`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SearchTarget {
    Mass(usize),
    Count(usize),
}

/// A pruning policy: the predicate the search runs, usually made by `#[dusk::policy]`.
#[derive(Clone, Copy)]
pub struct Policy {
    pub name: &'static str,
    pub params: &'static [PolicyParam],
    /// The statistics the predicate reads (`"count"`, ...): the search computes `count`
    /// only when it is read.
    pub reads: &'static [&'static str],
    /// Where the cut usually sits, if the policy says (`#[policy(target(mass = p))]`):
    /// lets the search interpolate instead of bisecting.
    pub target: Option<SearchTarget>,
    /// Emits the predicate (an i1 scalar) into the search kernel, given the kept set's
    /// statistics and the row's parameter values (in the order of `params`).
    pub predicate: fn(&mut KernelBuilder, &KeptStats, &[Value]) -> Value,
}

impl std::fmt::Debug for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Policy")
            .field("name", &self.name)
            .field("params", &self.params)
            .finish()
    }
}

/// Compile-time choices of the search kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SearchConfig {
    /// Candidates a program holds in registers (a power of two): every row's, or with
    /// `stream` one tile's.
    pub block: usize,
    /// Query heads per candidate row (GQA group; 1 for MHA).
    pub group: usize,
    pub num_warps: u32,
    /// Rows stream through in tiles of `block` ([`build_search_streaming`]): any length.
    pub stream: bool,
    /// Points each search step tries at once (1 to 4): more cut the steps (each reads the
    /// row once) at more work a candidate.
    pub pivots: u32,
    /// With `stream`: the weights staged in the program's shared memory instead of the
    /// global workspace, so the steps read shared memory, not L1 or L2: rows of up to
    /// [`SHARED_ROW`] / `group` candidates (longer rows are cut there, as rows longer than
    /// `block` are in registers; the plans check the rows fit).
    pub shared: bool,
    /// With `stream`: the first step tries every edge of a histogram of the weights'
    /// leading bits (1/32 octave buckets, built in the pass that computes the weights), so
    /// the bracket starts one bucket wide (`histogram.rs`), for rows of up to
    /// [`HISTOGRAM_MAX_ROW`] candidates. Policies without a target, or that read
    /// `threshold` or `below`, search without it.
    pub histogram: bool,
    /// With `stream` and not `shared`: the weights are not written to a `work` buffer (the
    /// kernel has no such parameter); every pass after the second recomputes them from the
    /// scores (read again), trading a write and re-reads of `work` for re-reads of the
    /// scores.
    pub recompute: bool,
    /// With `stream`: each tile read from global memory first brings the tile two on
    /// into L2 (`prefetch.global.L2`, no registers held), so a program's loads wait on L2
    /// rather than DRAM.
    pub prefetch: bool,
    /// Nanoseconds a row waiting for the rows before it to publish their budgets sleeps
    /// between two reads of their words (`output.rs`; 0: it reads again at once). A read
    /// of a window is some hundreds of instructions over the program's warps; while a row
    /// waits they take the issue slots of the programs sharing its SM.
    pub backoff_ns: u32,
    /// Programs resident on a multiprocessor asked of ptxas, which caps the registers to
    /// fit them (0: its own choice).
    pub min_programs_per_sm: u32,
    /// With `stream`, for diagnosis: a last pointer parameter `timeline` (i64), where row
    /// r's program writes record r ([`crate::timeline`]): the GPU's clock at its start,
    /// after pass 1 (the maximum), after pass 2 (the weights' sum and histogram), once the
    /// budget is known (the search done), once its place in the list is found (the wait
    /// for the rows before it; rows staged in shared memory compact their positions there
    /// first), at its end, and its SM. Each clock is read behind a branch on the values
    /// before it, so it is when they arrived.
    pub timeline: bool,
    /// With `stream` and a group of several query heads: one program a query head instead
    /// of one a candidate row searching the group's heads one after another, so a GQA row
    /// runs its heads' searches side by side. Each program hands its threshold, row maximum
    /// and invalid flag to the row's last program to finish (counted by an arrival word a
    /// row, `exchange` and `arrivals` parameters), which forms the union from the scores
    /// (the weights recomputed exactly) and writes the row's list; with `shared`, a
    /// program's staging holds its one head's row ([`shared_row_capacity`] of 1).
    pub split_heads: bool,
}

impl SearchConfig {
    /// Whether the search keeps its weights in the global `work` buffer (a kernel
    /// parameter only then): streamed, neither staged in shared memory nor recomputed.
    pub fn uses_work(&self) -> bool {
        self.stream && !self.shared && !self.recompute
    }

    /// The longest rows the shared-memory staging holds: one query head's share of it a
    /// program ([`shared_row_capacity`] of the heads a program searches).
    pub fn staged_capacity(&self) -> usize {
        shared_row_capacity(if self.split_heads { 1 } else { self.group })
    }
}

/// Weights the shared-memory staging holds (32 KiB of f32, within the 48 KiB of static
/// shared memory beside the reductions' scratch): each of a group's query heads gets
/// `SHARED_ROW / group` of them.
pub const SHARED_ROW: usize = 8192;

/// The longest rows the shared-memory staging holds for groups of `group` query heads:
/// each head's share of [`SHARED_ROW`], a multiple of 4 (16-byte vector accesses).
pub fn shared_row_capacity(group: usize) -> usize {
    (SHARED_ROW / group.max(1)) & !3
}

/// Upper bound on search steps; each one moves a bound onto an element, so real rows stop
/// far sooner (about 20 steps for 32k candidates).
pub const MAX_STEPS: i32 = 128;

/// Search steps a chunk: the steps run in chunks entered only while the search is open, so
/// an ended search skips the rest a chunk at a time. Divides [`MAX_STEPS`].
pub const STEPS_A_CHUNK: i32 = 8;
const _: () = assert!(MAX_STEPS % STEPS_A_CHUNK == 0);

/// The fewest candidates a program holds: the compaction's prefix sum needs a full tile.
pub const MIN_BLOCK: usize = 1024;

/// The most candidates a program holds in registers: 8 a thread on 32 warps (58 registers,
/// no spills). Longer rows stream ([`build_search_streaming`]).
pub const MAX_BLOCK: usize = 8192;

/// The longest rows the default streams on 2 warps.
pub const SHORT_ROWS: usize = 4096;

/// The longest rows of GQA groups (of up to 4 query heads) the default searches split over
/// the heads, each head's row staged in its program's shared memory (timed at this length;
/// longer ones keep the configuration of one query head's long rows).
pub const GQA_ROWS: usize = 8192;

impl SearchConfig {
    /// A streaming configuration: tiles of `block` on `num_warps`, `pivots` points a step,
    /// the weights `shared` (staged in shared memory) or in the global workspace, the first
    /// step from a histogram.
    pub fn streamed(
        block: usize,
        group: usize,
        num_warps: u32,
        pivots: u32,
        shared: bool,
    ) -> SearchConfig {
        SearchConfig {
            block,
            group,
            num_warps,
            stream: true,
            pivots,
            shared,
            histogram: true,
            recompute: false,
            prefetch: false,
            backoff_ns: 0,
            min_programs_per_sm: 0,
            timeline: false,
            split_heads: false,
        }
    }

    /// The default for rows of up to `max_len` candidates, from the configurations timed on
    /// an H100 (`gpu-check threshold` sweeps them, on near-uniform rows and with `--focus
    /// 12` on rows as focused as Twilight's; benches/NOTES.md has the figures): every
    /// default streams the row in tiles with the histogram's first step. Few warps a row
    /// win, since each search step's fixed cost (the exchange between warps, the scalar
    /// bookkeeping every thread repeats) is paid per warp: 2 warps with the weights in
    /// shared memory where they fit ([`shared_row_capacity`]: 8192 candidates for one
    /// query head a row; L2 prefetches ahead of the scores' and positions' loads), else 2
    /// warps from `work` up to [`SHORT_ROWS`], the rows of GQA groups of up to 4 query heads
    /// up to [`GQA_ROWS`] split over the heads (`split_heads`), each head staged, on 4 warps
    /// with the prefetches, and beyond, tiles of
    /// 2048 with the weights recomputed from the scores in every pass (`recompute`) and
    /// each tile's loads preceded by L2 prefetches of the tile two on (`prefetch`): on 4
    /// warps for one query head a row, on 8 with a 1 us sleep between the reads of the
    /// earlier rows' budgets for GQA groups' longer rows (not timed since the one-head
    /// default moved to 4 warps). Rows held in registers lose since the search writes the
    /// CSR list itself: a row waiting for the rows before it holds all of its registers.
    pub fn for_rows(max_len: usize, group: usize) -> SearchConfig {
        let streamed =
            |num_warps, shared| SearchConfig::streamed(1024, group, num_warps, 1, shared);
        if max_len <= shared_row_capacity(group) {
            // 61c39ce's sweep, focused / near-uniform rows: 8192 candidates 139.4 / 158.7 us
            // on 2 warps against 144.9 / 163.4 on 4 (the default then); 4096 112.6 / 118.7
            // against 128.0 / 131.9.
            SearchConfig {
                prefetch: true,
                ..streamed(2, true)
            }
        } else if max_len <= SHORT_ROWS {
            streamed(2, false)
        } else if group == 1 {
            // 32768 candidates, 61c39ce's sweep: 470.5 / 732.1 us on 4 warps against 505.3 /
            // 755.6 for the default then (8 warps, registers capped for 3 programs an SM,
            // 776.7 as a sweep row on the near-uniform rows).
            SearchConfig {
                block: 2048,
                recompute: true,
                prefetch: true,
                ..streamed(4, false)
            }
        } else if max_len <= GQA_ROWS && group <= 4 {
            // GQA groups' rows of Quest's N/4 at 32k (8192 candidates, 4 query heads, the
            // pipeline benchmark's synthetic batch): split over the heads, each program's
            // head staged in shared memory, on 4 warps (the H200, gqa-split's sweep,
            // benches/results/pipeline_run/split_*): 99.1 us at batch 32 and 147.5 at batch 64,
            // on 2 warps 111.7 and 169.3, split from `work` 139.0 and 217.0, and one program a
            // row from `work` in tiles of 1024 on 4 warps with L2 prefetches (the default
            // before) 138.5 and 180.8. Groups of 8 would spill there (128 registers).
            SearchConfig {
                prefetch: true,
                split_heads: true,
                ..streamed(4, true)
            }
        } else {
            // GQA groups' longer rows, as one query head's were up to 61c39ce (32768
            // candidates with one head: 789.6 us on 8 warps against 830.2 on 4 at e336929).
            SearchConfig {
                block: 2048,
                recompute: true,
                prefetch: true,
                backoff_ns: 1000,
                ..streamed(8, false)
            }
        }
    }
}

/// The kernel name of `policy`'s search for `cfg`.
pub fn search_name(policy: &Policy, cfg: &SearchConfig) -> String {
    let pivots = if cfg.pivots > 1 {
        format!("_k{}", cfg.pivots)
    } else {
        String::new()
    };
    let histogram = if cfg.histogram { "_h" } else { "" };
    let recompute = if cfg.recompute && !cfg.shared {
        "_r"
    } else {
        ""
    };
    let prefetch = if cfg.prefetch && cfg.stream {
        "_l2"
    } else {
        ""
    };
    let backoff = match cfg.backoff_ns {
        0 => String::new(),
        ns => format!("_b{ns}"),
    };
    let occupancy = match cfg.min_programs_per_sm {
        0 => String::new(),
        n => format!("_o{n}"),
    };
    let timeline = if cfg.timeline { "_timeline" } else { "" };
    let split = if cfg.split_heads { "_x" } else { "" };
    format!(
        "threshold_{}_{}{}_g{}_w{}{pivots}{histogram}{recompute}{prefetch}{backoff}{occupancy}{timeline}{split}",
        policy.name,
        match (cfg.stream, cfg.shared) {
            (true, true) => "s",
            (true, false) => "t",
            (false, _) => "b",
        },
        cfg.block,
        cfg.group,
        cfg.num_warps
    )
}

/// The search kernel `cfg` asks for: [`build_search`] or [`build_search_streaming`].
pub fn build(policy: &Policy, cfg: &SearchConfig) -> Result<Kernel, CompileError> {
    if cfg.stream {
        build_search_streaming(policy, cfg)
    } else {
        build_search(policy, cfg)
    }
}
