//! SparQ Attention (Ribar et al., Algorithm 1) for decode, GQA-aware: its state
//! ([`SparqState`]: K transposed within blocks of its own ([`SparqBlocks`]), the running sum
//! of V), the tokens to add to it ([`SparqUpdates`]), and [`SparqPlan`], which selects each
//! (sequence, KV head)'s tokens and the per-head `alpha` that the attention plan mixes its
//! output with, by the kernels of [`super::sparq_kernels`].
//!
//! ```
//! use dusk_kernels::attention_ops::AttentionPlan;
//! use dusk_kernels::ops::Dusk;
//! use dusk_kernels::paged::{KvShape, PageTable};
//! use dusk_kernels::selectors::{
//!     Budget, SparqBlocks, SparqOptions, SparqPlan, SparqState, SparqUpdates,
//! };
//! use dusk_runtime::Device;
//! use half::f16;
//!
//! # fn main() -> Result<(), dusk_kernels::DuskError> {
//! let dusk = Dusk::new(Device::best())?;
//! let dev = dusk.device();
//! let kv = KvShape { num_pages: 8, page_size: 16, num_kv_heads: 2, head_dim: 64 };
//! // One sequence of 70 tokens on pages 7, 2, 5, 0, 1 (the last holds 6).
//! let table = PageTable::from_lengths(&[70], 16, vec![7, 2, 5, 0, 1])?;
//! let val = |i: usize| f16::from_f32(((i * 7919) % 13) as f32 / 4.0 - 1.5);
//! let k = dev.upload(&(0..kv.elements()).map(val).collect::<Vec<_>>())?;
//! let v = dev.upload(&(0..kv.elements()).map(|i| val(i + 5)).collect::<Vec<_>>())?;
//! let q = dev.upload(&(0..4 * 64).map(|i| val(3 * i)).collect::<Vec<_>>())?; // 4 query heads
//!
//! // The state, its transposed K in blocks of 32 tokens (blocks 3 and 0 for the sequence),
//! // written at prefill for every token, then at each append.
//! let mut state = SparqState::new(&dusk, kv, 1, SparqBlocks { num_blocks: 4, block_size: 32 })?;
//! let blocks = PageTable::from_lengths(&[70], 32, vec![3, 0, 2])?;
//! state.update(&dusk, &k, &v, &SparqUpdates::all(&dusk, &state, &table, &blocks)?)?;
//! // r = 8 of 64 components, 32 tokens kept, the last 8 always.
//! let options = SparqOptions { r: 8, k: Budget::Tokens(32), window: 8 };
//! let mut plan = SparqPlan::new(&dusk, state, 4, &table, &blocks, options)?;
//! plan.select(&dusk, &q)?;                       // 5 launches, no allocation, no sync
//! assert_eq!(plan.shape().sel_indptr, [0, 32, 64]); // one token list per KV head
//! let lists = plan.sel_indices().download()?;
//! assert_eq!(&lists[24..32], &[62, 63, 64, 65, 66, 67, 68, 69]); // the window
//!
//! // Attention over the lists, mixed with the mean of V by alpha.
//! let attn = AttentionPlan::new(&dusk, plan.attention_spec())?;
//! let mut meta = plan.attention_meta(&dusk, &attn, &table)?;
//! let (mut out, mut lse) = (dev.alloc::<f16>(4 * 64)?, dev.alloc::<f32>(4)?);
//! plan.attend(&dusk, &attn, &mut meta, &q, &k, &v, &mut out, &mut lse)?;
//! # Ok(()) }
//! ```

use super::selector::Build;
use super::sparq_kernels::{
    sparq_alpha, sparq_mass, sparq_query, sparq_score, sparq_update, SPARQ_RUN,
};
use super::topk::{Budget, Items, Keep, SelectionShape, TopKConfig, TopKPlan};
use crate::attention_ops::{AttentionMeta, AttentionMode, AttentionPlan, AttentionSpec, SparqMix};
use crate::error::{ensure, invalid, Result};
use crate::ops::Dusk;
use crate::paged::{KvShape, PageTable};
use dusk_compiler::DType;
use dusk_runtime::{Arg, Buffer, LoadedKernel};
use half::f16;
use std::sync::Arc;

/// Components the query kernel's ranking compares a component with at once.
const RANK_CHUNK: usize = 32;
/// Tiles' statistics and chunks' numerators the alpha kernel reads at once.
const ALPHA_BLOCK: usize = 256;

/// SparQ's choices (Algorithm 1's `r`, `k` and `l`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SparqOptions {
    /// Components of q (and columns of K) the approximate scores use: 1 to `head_dim`
    /// (the paper's default ratio is `head_dim / 8`).
    pub r: usize,
    /// Tokens each (sequence, KV head) keeps, the window among them; a sequence no longer
    /// than this keeps every token (and `alpha` is 1).
    pub k: Budget,
    /// The last `window` tokens are always kept (Algorithm 1's local window `l`; the paper
    /// uses `k / 4`).
    pub window: usize,
}

impl SparqOptions {
    fn validate(&self, head_dim: usize) -> Result<()> {
        ensure!(
            (1..=head_dim).contains(&self.r),
            "r",
            format!("1 to head_dim ({head_dim}) components"),
            self.r,
        );
        match self.k {
            Budget::Tokens(t) => ensure!(t >= 1, "k", "at least 1 token", t),
            Budget::Fraction(f) => ensure!(
                f.is_finite() && f > 0.0 && f <= 1.0,
                "k",
                "a fraction of each sequence in (0, 1]",
                f,
            ),
        }
        ensure!(
            self.window < i32::MAX as usize,
            "window",
            "fewer than 2^31 tokens",
            self.window,
        );
        Ok(())
    }
}

/// The update kernel for `head_dim` (any page size).
fn update_kernel(head_dim: usize) -> Option<Build> {
    Some(match head_dim {
        64 => sparq_update::build::<64>,
        128 => sparq_update::build::<128>,
        256 => sparq_update::build::<256>,
        _ => return None,
    })
}

/// The query kernel for `head_dim` and a group of `group` query heads.
fn query_kernel(head_dim: usize, group: usize) -> Option<Build> {
    macro_rules! table {
        ($($d:literal: $($g:literal)*;)*) => {
            match (head_dim, group) {
                $($(($d, $g) => sparq_query::build::<$d, $g, RANK_CHUNK> as Build,)*)*
                _ => return None,
            }
        };
    }
    Some(table! {
        64: 1 2 4 8 16;
        128: 1 2 4 8 16;
        256: 1 2 4 8 16;
    })
}

/// The alpha kernel for `head_dim` and `group`.
fn alpha_kernel(head_dim: usize, group: usize) -> Option<Build> {
    macro_rules! table {
        ($($d:literal: $($g:literal)*;)*) => {
            match (head_dim, group) {
                $($(($d, $g) => sparq_alpha::build::<$d, $g, ALPHA_BLOCK> as Build,)*)*
                _ => return None,
            }
        };
    }
    Some(table! {
        64: 1 2 4 8 16;
        128: 1 2 4 8 16;
        256: 1 2 4 8 16;
    })
}

/// Tokens a score program covers with a group of `group` query heads over blocks of
/// `2^log_bs` tokens: 256 up to 4 heads (each thread holds every head of 8 tokens), 128
/// from 8 heads on (half of the heads of 8 tokens a thread: at most 64 logits); with one
/// head and blocks under 64 tokens (the copy paged as the cache), 128 (a thread's 8
/// tokens' components split over two lanes). On the H200 one head over blocks of 256 is
/// 1-2% faster at 256 tokens and 8 components in flight than at 128 and 16 (the H100's
/// choice), over blocks of 16 11% slower; the measurements are in the selectors README.
pub const fn score_tile(group: usize, log_bs: usize) -> usize {
    if group > 4 || (group == 1 && log_bs < 6) {
        128
    } else {
        256
    }
}

/// The components whose loads a score program keeps in flight at once: 16 with one head
/// over blocks under 64 tokens, else 8 (with a group, its logits take the registers 8
/// more would).
const fn score_chunk(group: usize, log_bs: usize) -> usize {
    if group == 1 && log_bs < 6 {
        16
    } else {
        8
    }
}

/// The score and mass kernels for a group of `G`, tiles of `TILE` tokens and chunks of
/// `CH` components, `rp` components (a power of two, 8 to 256: with 8, chunks of 8) and
/// blocks of `2^log_bs` tokens (8 to 256). The mass kernel weighs `TILE` kept tokens a
/// program (as many logits as a score program holds), gathering 8 components at a time.
fn kernels_for<const G: usize, const TILE: usize, const CH: usize>(
    rp: usize,
    log_bs: usize,
) -> Option<(Build, Build)> {
    macro_rules! table {
        ($($rp:literal $ch:tt: $($lbs:literal)*;)*) => {
            match (rp, log_bs) {
                $($(($rp, $lbs) => (
                    sparq_score::build::<G, $rp, $ch, TILE, $lbs> as Build,
                    sparq_mass::build::<G, $rp, 8, TILE, $lbs> as Build,
                ),)*)*
                _ => return None,
            }
        };
    }
    Some(table! {
        8 8: 3 4 5 6 7 8;
        16 CH: 3 4 5 6 7 8;
        32 CH: 3 4 5 6 7 8;
        64 CH: 3 4 5 6 7 8;
        128 CH: 3 4 5 6 7 8;
        256 CH: 3 4 5 6 7 8;
    })
}

/// The score and mass kernels a plan uses for a group of `group` query heads, `rp`
/// components and blocks of `2^log_bs` tokens, with the score's tile (tokens a score
/// program scores, kept tokens a mass program weighs); `None` for a group, `rp` or block
/// size with no kernel.
pub fn group_kernels(group: usize, rp: usize, log_bs: usize) -> Option<(Build, Build, usize)> {
    // One head: short blocks (under 64 tokens) and long ones.
    const T1S: usize = score_tile(1, 4);
    const C1S: usize = score_chunk(1, 4);
    const T1: usize = score_tile(1, 8);
    const T4: usize = score_tile(4, 8);
    const T8: usize = score_tile(8, 8);
    const C: usize = score_chunk(4, 8);
    let (score, mass) = match group {
        1 if log_bs < 6 => kernels_for::<1, T1S, C1S>(rp, log_bs),
        1 => kernels_for::<1, T1, C>(rp, log_bs),
        2 => kernels_for::<2, T4, C>(rp, log_bs),
        4 => kernels_for::<4, T4, C>(rp, log_bs),
        8 => kernels_for::<8, T8, C>(rp, log_bs),
        16 => kernels_for::<16, T8, C>(rp, log_bs),
        _ => None,
    }?;
    Some((score, mass, score_tile(group, log_bs)))
}

/// The components' stride a plan of `r` uses: the kernels' block of components (a power of
/// two, at least 8).
fn padded_r(r: usize) -> usize {
    r.next_power_of_two().max(8)
}

/// How the transposed copy of K is paged: `num_blocks` blocks of `block_size` tokens (a
/// power of two, 8 to 256), each holding consecutive tokens of one sequence, found through
/// a block table (a [`PageTable`] whose pages are these blocks) as the cache's pages are
/// through the page table. Long blocks make long reads: a component of a block is
/// `block_size` contiguous f16 values, 32 bytes at 16.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SparqBlocks {
    pub num_blocks: usize,
    pub block_size: usize,
}

impl SparqBlocks {
    /// The cache's own paging: block `p` is page `p`, and the page table is the block table.
    pub fn pages_of(kv: &KvShape) -> SparqBlocks {
        SparqBlocks {
            num_blocks: kv.num_pages,
            block_size: kv.page_size,
        }
    }

    /// The copy's shape as a cache of one array: `[num_blocks, block_size, ..]`, for
    /// checking a block table.
    fn shape(&self, kv: &KvShape) -> KvShape {
        KvShape {
            num_pages: self.num_blocks,
            page_size: self.block_size,
            ..*kv
        }
    }
}

/// SparQ's state for a cache of one shape: the transposed copy of K (written in runs of 16
/// tokens), each row's last two runs staged row-major in a ring, the running sum of V, and
/// the update kernel that appends to them.
pub struct SparqState {
    kv: KvShape,
    blocks: SparqBlocks,
    num_seqs: usize,
    k_t: Buffer<f16>,
    k_open: Buffer<f16>,
    v_sum: Buffer<f32>,
    update: Arc<LoadedKernel>,
}

impl SparqState {
    /// Allocates the state of a cache of shape `kv` (head_dim 64, 128 or 256) for
    /// `num_seqs` sequences (batch slots: sequence `b` of a plan's page table is slot `b`),
    /// its copy of K paged by `blocks`, zeroed; compiles its update.
    pub fn new(
        dusk: &Dusk,
        kv: KvShape,
        num_seqs: usize,
        blocks: SparqBlocks,
    ) -> Result<SparqState> {
        kv.validate()?;
        let update = update_kernel(kv.head_dim)
            .ok_or_else(|| invalid("head_dim", "64, 128 or 256 (SparQ's kernels)", kv.head_dim))?;
        ensure!(
            blocks.block_size.is_power_of_two() && (8..=256).contains(&blocks.block_size),
            "blocks",
            "blocks of a power of two from 8 to 256 tokens (the copy's rows are read in \
             16-byte vectors)",
            blocks.block_size,
        );
        let copy = blocks.shape(&kv);
        ensure!(
            blocks.num_blocks >= 1 && copy.elements() < (1usize << 40),
            "blocks",
            "1 or more blocks, under 2^40 values in all",
            blocks.num_blocks,
        );
        ensure!(
            num_seqs >= 1 && num_seqs < i32::MAX as usize,
            "num_seqs",
            "1 to 2^31 - 1 sequences",
            num_seqs,
        );
        let update = dusk.kernel(format!("sparq update d{}", kv.head_dim), update)?;
        let dev = dusk.device();
        let rows = num_seqs * kv.num_kv_heads * kv.head_dim;
        let mut k_t = dev.alloc::<f16>(copy.elements())?;
        let mut k_open = dev.alloc::<f16>(rows * 2 * blocks.block_size.min(SPARQ_RUN))?;
        let mut v_sum = dev.alloc::<f32>(rows)?;
        dev.fill_bytes(&mut k_t, 0)?;
        dev.fill_bytes(&mut k_open, 0)?;
        dev.fill_bytes(&mut v_sum, 0)?;
        Ok(SparqState {
            kv,
            blocks,
            num_seqs,
            k_t,
            k_open,
            v_sum,
            update,
        })
    }

    /// Adds `updates`' tokens of the cache (`k`, `v`: f16 of this state's shape): their
    /// keys into the transposed copy, their values to their sequences' sums. One launch,
    /// no allocation, no sync.
    pub fn update(
        &mut self,
        dusk: &Dusk,
        k: &Buffer<f16>,
        v: &Buffer<f16>,
        updates: &SparqUpdates,
    ) -> Result<()> {
        let kv = self.kv;
        for (name, b) in [("k", k), ("v", v)] {
            ensure!(
                b.len() == kv.elements(),
                name,
                format!("{} f16 values ({kv:?})", kv.elements()),
                b.len(),
            );
        }
        if updates.count == 0 {
            return Ok(());
        }
        let args = [
            Arg::from(k),
            Arg::from(v),
            Arg::from(&updates.entries),
            Arg::I32(kv.num_pages as i32),
            Arg::I32(self.blocks.num_blocks as i32),
            Arg::I32(self.num_seqs as i32),
            Arg::I32(kv.num_kv_heads as i32),
            Arg::I32(kv.page_size as i32),
            Arg::I32(self.blocks.block_size as i32),
            Arg::from(&self.k_t),
            Arg::from(&self.k_open),
            Arg::from(&self.v_sum),
        ];
        let grid = [updates.count as u32, kv.num_kv_heads as u32, 1];
        dusk.device().launch(&self.update, grid, &args)?;
        Ok(())
    }

    /// Zeroes the sums of V (before adding every token of the sequences again).
    pub fn clear_values(&mut self, dusk: &Dusk) -> Result<()> {
        dusk.device().fill_bytes(&mut self.v_sum, 0)?;
        Ok(())
    }

    /// The cache's shape.
    pub fn kv(&self) -> KvShape {
        self.kv
    }
    /// The transposed copy's paging.
    pub fn blocks(&self) -> SparqBlocks {
        self.blocks
    }
    pub fn num_seqs(&self) -> usize {
        self.num_seqs
    }
    /// K transposed within each block and KV head, f16 `[num_blocks, num_kv_heads,
    /// head_dim, block_size]`: each sequence's runs of [`SparqState::run`] tokens as far as
    /// [`copied_slices`] says (whole up to [`closed_tokens`], the slices a decode step has
    /// copied of the run before the last; its other values are left as they were).
    pub fn k_t(&self) -> &Buffer<f16> {
        &self.k_t
    }
    /// The transposed copy, to write (state computed elsewhere).
    pub fn k_t_mut(&mut self) -> &mut Buffer<f16> {
        &mut self.k_t
    }
    /// Each (sequence, KV head)'s staging ring, row-major, f16 `[num_seqs, num_kv_heads,
    /// ring, head_dim]` ([`SparqState::ring`] rows): the token at position `p` is row `p %
    /// ring`; the rows of the tokens past [`closed_tokens`] are read (the others are left as
    /// they were). Appending a token writes one row here, not a component of every sector
    /// of a run.
    pub fn k_open(&self) -> &Buffer<f16> {
        &self.k_open
    }
    /// The staged runs, to write (state computed elsewhere).
    pub fn k_open_mut(&mut self) -> &mut Buffer<f16> {
        &mut self.k_open
    }
    /// Tokens of a run of the copy: `min(block_size, 16)`.
    pub fn run(&self) -> usize {
        self.blocks.block_size.min(SPARQ_RUN)
    }
    /// Rows of a staging ring: two runs (the unfinished one and the one before it, whose
    /// copy completes as the unfinished one fills).
    pub fn ring(&self) -> usize {
        2 * self.run()
    }
    /// The sum of V over each sequence's tokens, f32 `[num_seqs, num_kv_heads, head_dim]`.
    pub fn v_sum(&self) -> &Buffer<f32> {
        &self.v_sum
    }
    /// The sums of V, to write.
    pub fn v_sum_mut(&mut self) -> &mut Buffer<f32> {
        &mut self.v_sum
    }
}

/// Of a sequence of `n` tokens whose transposed copy is written in runs of `run` tokens,
/// those the readers take from the copy: all but the unfinished run and the one before it,
/// whose copy completes a slice a step as the unfinished one fills (the kernels'
/// `closed_tokens`). The others, up to `2 * run - 1`, are read from the staging ring.
pub fn closed_tokens(n: usize, run: usize) -> usize {
    (n - n % run).saturating_sub(run)
}

/// Of a sequence of `n` tokens (`n >= 1`), the slices of token `t`'s run (`head_dim / run`
/// components each) that the copy holds: a decode step appending token `p` copies slice `p
/// % run` of the run before `p`'s, so the run before the last has `(n - 1) % run + 1`
/// slices, the last none, the others all.
pub fn copied_slices(n: usize, t: usize, run: usize) -> usize {
    match (n - 1) / run - t / run {
        0 => 0,
        1 => (n - 1) % run + 1,
        _ => run,
    }
}

/// One run of tokens to add to a [`SparqState`], or to copy in part from the cache into its
/// transposed copy: slots `start .. start + count` of the cache's physical page `page`,
/// tokens of sequence `seq`, which the copy holds at slots `block_start ..` of block
/// `block`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SparqEntry {
    pub page: i32,
    pub start: i32,
    pub count: i32,
    pub seq: i32,
    pub block: i32,
    pub block_start: i32,
    /// -1: the keys are not staged. Else the first token's row in its sequence's staging
    /// ring (of [`SparqState::ring`] rows: its position modulo that), the others' after it.
    pub stage: i32,
    /// The components of each token's key written into the copy: `copy_from .. copy_to`
    /// (`0 .. head_dim` the whole key, an empty range none of it).
    pub copy_from: i32,
    pub copy_to: i32,
    /// Whether the tokens' values join their sequence's sum of V: false for an entry that
    /// copies components of tokens added before (a decode step's slice of the run before
    /// its token's, [`SparqUpdates::last_tokens`]).
    pub values: bool,
}

impl SparqEntry {
    /// The i32 values an entry is on the device ([`SparqUpdates::from_device`]).
    pub const FIELDS: usize = 10;

    /// The entry as the device holds it: its fields in order, `values` 1 or 0.
    pub fn fields(&self) -> [i32; Self::FIELDS] {
        [
            self.page,
            self.start,
            self.count,
            self.seq,
            self.block,
            self.block_start,
            self.stage,
            self.copy_from,
            self.copy_to,
            self.values as i32,
        ]
    }
}

/// Runs of tokens to add to a [`SparqState`] ([`SparqEntry`]s), on the device.
pub struct SparqUpdates {
    /// i32 `[count, SparqEntry::FIELDS]`.
    entries: Buffer<i32>,
    count: usize,
}

impl SparqUpdates {
    /// `entries`, checked against `state`: page, block and sequence ids in range, at least
    /// one token, slots inside the page and inside the block, a staged entry's rows inside
    /// the ring at the tokens' places in their run, copied components inside the key.
    /// Entries naming one block and slot twice write it twice; each adds its values.
    pub fn new(dusk: &Dusk, state: &SparqState, entries: &[SparqEntry]) -> Result<SparqUpdates> {
        let (kv, bl) = (state.kv, state.blocks);
        let (run, ring) = (state.run() as i64, state.ring() as i64);
        for (i, e) in entries.iter().enumerate() {
            let at = |what: &str| format!("entry {i}: {what}");
            if e.page < 0 || e.page as usize >= kv.num_pages {
                return Err(invalid(
                    "pages",
                    format!("page ids in 0..{}", kv.num_pages),
                    at(&format!("page {}", e.page)),
                ));
            }
            if e.block < 0 || e.block as usize >= bl.num_blocks {
                return Err(invalid(
                    "blocks",
                    format!("block ids in 0..{}", bl.num_blocks),
                    at(&format!("block {}", e.block)),
                ));
            }
            if e.seq < 0 || e.seq as usize >= state.num_seqs {
                return Err(invalid(
                    "seqs",
                    format!("sequence slots in 0..{}", state.num_seqs),
                    at(&format!("sequence {}", e.seq)),
                ));
            }
            let (s, c, t) = (e.start as i64, e.count as i64, e.block_start as i64);
            ensure!(
                s >= 0 && c >= 1 && s + c <= kv.page_size as i64,
                "counts",
                format!("1 or more slots inside a page of {}", kv.page_size),
                at(&format!("start {s}, count {c}")),
            );
            ensure!(
                t >= 0 && t + c <= bl.block_size as i64,
                "counts",
                format!("slots inside a block of {}", bl.block_size),
                at(&format!("block start {t}, count {c}")),
            );
            let g = e.stage as i64;
            ensure!(
                g < 0 || (g + c <= ring && g % run == t % run),
                "stages",
                format!(
                    "-1, or the first token's row in a ring of {ring} (its place in its run \
                     of {run} that of its block slot), the tokens inside the ring"
                ),
                at(&format!("stage {g}, block start {t}, count {c}")),
            );
            ensure!(
                0 <= e.copy_from && e.copy_from <= e.copy_to && e.copy_to as usize <= kv.head_dim,
                "copies",
                format!("a range of components inside 0..{}", kv.head_dim),
                at(&format!("{}..{}", e.copy_from, e.copy_to)),
            );
        }
        ensure!(
            entries.len() < i32::MAX as usize / SparqEntry::FIELDS,
            "entries",
            "fewer than 2^31 / 10 entries",
            entries.len(),
        );
        let packed: Vec<i32> = entries.iter().flat_map(SparqEntry::fields).collect();
        let none = [0; SparqEntry::FIELDS];
        Ok(SparqUpdates {
            entries: dusk
                .device()
                .upload(if packed.is_empty() { &none } else { &packed })?,
            count: entries.len(),
        })
    }

    /// Every token of every sequence of `table` (the cache's pages), held in the copy's
    /// blocks of `blocks` (the block table: the same sequences' lengths): a prefill, or the
    /// state built from scratch after [`SparqState::clear_values`]. The state a decode loop
    /// leaves: the tokens past [`closed_tokens`] staged, the copy holding the slices
    /// [`copied_slices`] says. One entry per run of tokens inside one page, one block and
    /// one run of the copy.
    pub fn all(
        dusk: &Dusk,
        state: &SparqState,
        table: &PageTable,
        blocks: &PageTable,
    ) -> Result<SparqUpdates> {
        check_blocks(state, table, blocks)?;
        let (run, ring, d) = (state.run(), state.ring(), state.kv.head_dim);
        let mut entries = vec![];
        for b in 0..table.batch() {
            let n = table.seq_len(b, state.kv.page_size);
            let closed = closed_tokens(n, run);
            entries.extend(
                pieces(state, table, blocks, b, 0..n).map(|(t, e)| SparqEntry {
                    stage: if t < closed { -1 } else { (t % ring) as i32 },
                    copy_to: (copied_slices(n, t, run) * d / run) as i32,
                    ..e
                }),
            );
        }
        Self::new(dusk, state, &entries)
    }

    /// What a decode step appending one token to each sequence of `table` writes: the token
    /// staged (at its position modulo the ring), and, from the cache into the copy, slice
    /// `p % run` of the run before the token's (`p` its position; `head_dim / run`
    /// components of each of the run's tokens), whose values were added before.
    pub fn last_tokens(
        dusk: &Dusk,
        state: &SparqState,
        table: &PageTable,
        blocks: &PageTable,
    ) -> Result<SparqUpdates> {
        check_blocks(state, table, blocks)?;
        let (run, ring, d) = (state.run(), state.ring(), state.kv.head_dim);
        let width = d / run;
        let mut entries = vec![];
        for b in 0..table.batch() {
            let Some(p) = table.seq_len(b, state.kv.page_size).checked_sub(1) else {
                continue;
            };
            let slice = p % run;
            entries.extend(
                pieces(state, table, blocks, b, p..p + 1).map(|(_, e)| SparqEntry {
                    stage: (p % ring) as i32,
                    copy_to: 0,
                    ..e
                }),
            );
            if let Some(prev) = (p - slice).checked_sub(run) {
                let copy = pieces(state, table, blocks, b, prev..prev + run);
                entries.extend(copy.map(|(_, e)| SparqEntry {
                    copy_from: (slice * width) as i32,
                    copy_to: ((slice + 1) * width) as i32,
                    values: false,
                    ..e
                }));
            }
        }
        Self::new(dusk, state, &entries)
    }

    /// Entries written on the device (by an append kernel): i32 `[n, SparqEntry::FIELDS]`,
    /// each an entry's fields in order. Their contents are not read on the host; the
    /// update skips an entry out of range.
    pub fn from_device(entries: Buffer<i32>) -> Result<SparqUpdates> {
        let len = entries.len();
        ensure!(
            len.is_multiple_of(SparqEntry::FIELDS) && len / SparqEntry::FIELDS < i32::MAX as usize,
            "entries",
            format!(
                "{} i32 values an entry, fewer than 2^31 entries",
                SparqEntry::FIELDS
            ),
            len,
        );
        Ok(SparqUpdates {
            entries,
            count: len / SparqEntry::FIELDS,
        })
    }

    /// Entries.
    pub fn len(&self) -> usize {
        self.count
    }
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
}

/// Checks that `blocks` is a block table of `state`'s copy for the sequences of `table`
/// (the cache's page table): the same batch, each sequence the same length.
fn check_blocks(state: &SparqState, table: &PageTable, blocks: &PageTable) -> Result<()> {
    table.validate(&state.kv)?;
    let bs = state.blocks.block_size;
    blocks
        .validate(&state.blocks.shape(&state.kv))
        .map_err(|e| match e {
            crate::DuskError::InvalidArgument {
                arg,
                expected,
                found,
            } => invalid(
                "blocks",
                format!("a block table of blocks of {bs} ({arg}: {expected})"),
                found,
            ),
            other => other,
        })?;
    ensure!(
        blocks.batch() == table.batch(),
        "blocks",
        format!("{} sequences (the page table's)", table.batch()),
        blocks.batch(),
    );
    let ps = state.kv.page_size;
    if let Some(b) = (0..table.batch()).find(|&b| blocks.seq_len(b, bs) != table.seq_len(b, ps)) {
        return Err(invalid(
            "blocks",
            "each sequence as long as in the page table",
            format!(
                "sequence {b}: {} tokens, {} in the page table",
                blocks.seq_len(b, bs),
                table.seq_len(b, ps)
            ),
        ));
    }
    Ok(())
}

/// Tokens `tokens` of sequence `b` split where a page, a block or a run of the copy
/// starts: each piece's first token and its entry, neither staged nor copied (`stage` -1,
/// no components), adding its values.
fn pieces<'a>(
    state: &SparqState,
    table: &'a PageTable,
    blocks: &'a PageTable,
    b: usize,
    tokens: std::ops::Range<usize>,
) -> impl Iterator<Item = (usize, SparqEntry)> + 'a {
    let (ps, bs, run) = (state.kv.page_size, state.blocks.block_size, state.run());
    let mut t = tokens.start;
    std::iter::from_fn(move || {
        if t >= tokens.end {
            return None;
        }
        let end = tokens
            .end
            .min((t / ps + 1) * ps)
            .min((t / bs + 1) * bs)
            .min((t / run + 1) * run);
        let piece = SparqEntry {
            page: table.kv_page_indices[table.kv_indptr[b] as usize + t / ps],
            start: (t % ps) as i32,
            count: (end - t) as i32,
            seq: b as i32,
            block: blocks.kv_page_indices[blocks.kv_indptr[b] as usize + t / bs],
            block_start: (t % bs) as i32,
            stage: -1,
            copy_from: 0,
            copy_to: 0,
            values: true,
        };
        let first = t;
        t = end;
        Some((first, piece))
    })
}

/// What a score kernel writes (see `sparq_score`), sized for one plan's rows and tiles of
/// `tile` tokens: the tokens' scores, the tiles' softmax statistics and each head's logits
/// of the rows' staged tokens (up to `2 * SPARQ_RUN - 1` a row).
pub struct ScoreOutputs {
    tile: usize,
    tiles: usize,
    scores: Buffer<f32>,
    stat_max: Buffer<f32>,
    stat_sum: Buffer<f32>,
    staged_logits: Buffer<f32>,
}

impl ScoreOutputs {
    fn new(dusk: &Dusk, shape: &SelectionShape, group: usize, tile: usize) -> Result<ScoreOutputs> {
        let tiles = shape.max_items().div_ceil(tile).max(1);
        ensure!(
            tiles <= 65535,
            "kv_indptr",
            format!("sequences of at most {} tokens", 65535 * tile),
            shape.max_items(),
        );
        let stats = shape.rows() * tiles * group;
        ensure!(
            stats < i32::MAX as usize,
            "kv_indptr",
            "fewer than 2^31 tiles' statistics (tiles x num_q_heads)",
            stats,
        );
        let dev = dusk.device();
        Ok(ScoreOutputs {
            tile,
            tiles,
            scores: dev.alloc(shape.num_scores())?,
            stat_max: dev.alloc(stats)?,
            stat_sum: dev.alloc(stats)?,
            staged_logits: dev.alloc(shape.rows() * group * 2 * SPARQ_RUN)?,
        })
    }

    fn poison(&mut self, dusk: &Dusk, byte: u8) -> Result<()> {
        let d = dusk.device();
        d.fill_bytes(&mut self.scores, byte)?;
        d.fill_bytes(&mut self.stat_max, byte)?;
        d.fill_bytes(&mut self.stat_sum, byte)?;
        d.fill_bytes(&mut self.staged_logits, byte)?;
        Ok(())
    }

    /// Tokens a program scores.
    pub fn tile(&self) -> usize {
        self.tile
    }
    /// Tiles a row has room for (the longest sequence's).
    pub fn tiles(&self) -> usize {
        self.tiles
    }
    /// The tokens' scores, in the plan's layout ([`SparqPlan::scores`]).
    pub fn scores(&self) -> &Buffer<f32> {
        &self.scores
    }
    /// Each tile's and head's largest logit, at `(row * tiles + tile) * group + head`.
    pub fn stat_max(&self) -> &Buffer<f32> {
        &self.stat_max
    }
    /// Each tile's and head's `sum exp(l - max)`, as [`ScoreOutputs::stat_max`].
    pub fn stat_sum(&self) -> &Buffer<f32> {
        &self.stat_sum
    }
    /// Each head's logits of each row's staged tokens (those past [`closed_tokens`]), at
    /// `(row * group + head) * 32 + t` for its token `closed + t`: what alpha's numerators
    /// read for them, rather than the copy.
    pub fn staged_logits(&self) -> &Buffer<f32> {
        &self.staged_logits
    }
}

/// SparQ's selection over one page table: the query, score, mass and alpha kernels and the
/// shared top-k, validated, compiled and sized once.
pub struct SparqPlan {
    state: SparqState,
    options: SparqOptions,
    batch: usize,
    num_q_heads: usize,
    rp: usize,
    /// Chunks of a tile's count of kept tokens in the longest row.
    chunks: usize,
    query: Arc<LoadedKernel>,
    score: Arc<LoadedKernel>,
    mass: Arc<LoadedKernel>,
    weigh: Arc<LoadedKernel>,
    topk: TopKPlan,
    blk_indptr: Buffer<i32>,
    blk_indices: Buffer<i32>,
    tok_indptr: Buffer<i32>,
    dims: Buffer<i32>,
    qs: Buffer<f32>,
    out: ScoreOutputs,
    /// Each chunk's alpha numerators, `[rows, chunks, group]`.
    numerators: Buffer<f32>,
    alpha: Buffer<f32>,
    v_mean: Buffer<f16>,
}

impl SparqPlan {
    /// Plans SparQ's selection over `table` (the cache's page table; sequence `b` is
    /// `state`'s slot `b`), whose keys the copy holds in the blocks of `blocks` (the copy's
    /// block table; `table` itself when the copy is paged as the cache,
    /// [`SparqBlocks::pages_of`]), for `num_q_heads` query heads.
    pub fn new(
        dusk: &Dusk,
        state: SparqState,
        num_q_heads: usize,
        table: &PageTable,
        blocks: &PageTable,
        options: SparqOptions,
    ) -> Result<SparqPlan> {
        Self::with_config(dusk, state, num_q_heads, table, blocks, options, |_| {})
    }

    /// As [`SparqPlan::new`], with `tune` changing the top-k's [`TopKConfig`].
    pub fn with_config(
        dusk: &Dusk,
        state: SparqState,
        num_q_heads: usize,
        table: &PageTable,
        blocks: &PageTable,
        options: SparqOptions,
        tune: impl FnOnce(&mut TopKConfig),
    ) -> Result<SparqPlan> {
        let kv = state.kv;
        options.validate(kv.head_dim)?;
        ensure!(
            num_q_heads > 0 && num_q_heads.is_multiple_of(kv.num_kv_heads),
            "num_q_heads",
            format!("a positive multiple of num_kv_heads ({})", kv.num_kv_heads),
            num_q_heads,
        );
        let group = num_q_heads / kv.num_kv_heads;
        ensure!(
            table.batch() <= state.num_seqs,
            "kv_indptr",
            format!("at most the state's {} sequences", state.num_seqs),
            table.batch(),
        );
        let keep = Keep {
            sink: 0,
            recent: options.window,
        };
        let topk = TopKPlan::with_config(dusk, table, kv, Items::Tokens, options.k, keep, tune)?;
        check_blocks(&state, table, blocks)?;
        let rp = padded_r(options.r);
        let log_bs = state.blocks.block_size.trailing_zeros() as usize;
        let unsupported = || {
            invalid(
                "num_q_heads",
                "a GQA group of 1, 2, 4, 8 or 16 query heads",
                format!("{num_q_heads} query heads: a group of {group}"),
            )
        };
        let (score_build, mass_build, tile) =
            group_kernels(group, rp, log_bs).ok_or_else(unsupported)?;
        let query_build = query_kernel(kv.head_dim, group).ok_or_else(unsupported)?;
        let alpha_build = alpha_kernel(kv.head_dim, group).ok_or_else(unsupported)?;
        let shape = topk.shape().clone();
        let out = ScoreOutputs::new(dusk, &shape, group, tile)?;
        let rows = shape.rows();
        let longest = (0..rows)
            .map(|r| (shape.sel_item_indptr[r + 1] - shape.sel_item_indptr[r]) as usize)
            .max()
            .unwrap_or(0);
        let chunks = longest.div_ceil(tile).max(1);
        let d = kv.head_dim;
        let query = dusk.kernel(format!("sparq query d{d} g{group}"), query_build)?;
        let score = dusk.kernel(
            format!(
                "sparq score g{group} r{rp} t{tile} bs{}",
                state.blocks.block_size
            ),
            score_build,
        )?;
        let mass = dusk.kernel(
            format!("sparq mass g{group} r{rp} bs{}", state.blocks.block_size),
            mass_build,
        )?;
        let weigh = dusk.kernel(format!("sparq alpha d{d} g{group}"), alpha_build)?;
        let dev = dusk.device();
        let nonempty = |v: &[i32]| dev.upload(if v.is_empty() { &[0] } else { v });
        let q_rows = table.batch() * num_q_heads;
        Ok(SparqPlan {
            options,
            batch: table.batch(),
            num_q_heads,
            rp,
            chunks,
            query,
            score,
            mass,
            weigh,
            blk_indptr: dev.upload(&blocks.kv_indptr)?,
            blk_indices: nonempty(&blocks.kv_page_indices)?,
            tok_indptr: dev.upload(&shape.item_indptr)?,
            dims: dev.alloc(rows * rp)?,
            qs: dev.alloc(q_rows * rp)?,
            out,
            numerators: dev.alloc(rows * chunks * group)?,
            alpha: dev.alloc(q_rows)?,
            v_mean: dev.alloc(rows * d)?,
            topk,
            state,
        })
    }

    /// Adds `updates`' tokens to the state (see [`SparqState::update`]).
    pub fn update(
        &mut self,
        dusk: &Dusk,
        k: &Buffer<f16>,
        v: &Buffer<f16>,
        updates: &SparqUpdates,
    ) -> Result<()> {
        self.state.update(dusk, k, v, updates)
    }

    /// Step 1: the components and the scaled sparse query of `q` (f16 `[batch,
    /// num_q_heads, head_dim]`). One launch.
    pub fn query(&mut self, dusk: &Dusk, q: &Buffer<f16>) -> Result<()> {
        let qlen = self.batch * self.num_q_heads * self.state.kv.head_dim;
        ensure!(
            q.len() == qlen,
            "q",
            format!("{qlen} f16 values (batch x num_q_heads x head_dim)"),
            q.len(),
        );
        let args = [
            Arg::from(q),
            Arg::from(&self.dims),
            Arg::from(&self.qs),
            Arg::I32(self.options.r as i32),
            Arg::I32(self.rp as i32),
        ];
        let grid = [self.topk.shape().rows() as u32, 1, 1];
        dusk.device().launch(&self.query, grid, &args)?;
        Ok(())
    }

    /// Step 2: the approximate scores of every token (after [`SparqPlan::query`]). One
    /// launch.
    pub fn score(&mut self, dusk: &Dusk) -> Result<()> {
        self.score_into(dusk, &self.score, &self.out)
    }

    /// Outputs for a score kernel of `tile` tokens a program over this plan's rows (another
    /// configuration of `sparq_score`, as the benchmark times beside the plan's).
    pub fn score_outputs(&self, dusk: &Dusk, tile: usize) -> Result<ScoreOutputs> {
        ScoreOutputs::new(
            dusk,
            self.topk.shape(),
            self.num_q_heads / self.state.kv.num_kv_heads,
            tile,
        )
    }

    /// Runs `kernel`, a `sparq_score` of `out`'s tile for this plan's group, `padded_r` and
    /// block size, over this plan's inputs (after [`SparqPlan::query`]) into `out`. One
    /// launch.
    pub fn score_into(&self, dusk: &Dusk, kernel: &LoadedKernel, out: &ScoreOutputs) -> Result<()> {
        let kv = self.state.kv;
        let args = [
            Arg::from(&self.state.k_t),
            Arg::from(&self.state.k_open),
            Arg::from(&self.blk_indptr),
            Arg::from(&self.blk_indices),
            Arg::from(&self.tok_indptr),
            Arg::from(&self.dims),
            Arg::from(&self.qs),
            Arg::from(&out.scores),
            Arg::from(&out.stat_max),
            Arg::from(&out.stat_sum),
            Arg::from(&out.staged_logits),
            Arg::I32(kv.num_kv_heads as i32),
            Arg::I32(kv.head_dim as i32),
            Arg::I32(self.options.r as i32),
            Arg::I32(out.tiles as i32),
        ];
        let grid = [self.topk.shape().rows() as u32, out.tiles as u32, 1];
        dusk.device().launch(kernel, grid, &args)?;
        Ok(())
    }

    /// Step 3: the top-k of the scores, as token lists. One launch.
    pub fn top_k(&mut self, dusk: &Dusk) -> Result<()> {
        self.topk.run(dusk, &self.out.scores)
    }

    /// Step 4: each query head's `alpha` and each row's mean of V (after
    /// [`SparqPlan::top_k`]): the kept tokens' softmax numerators a chunk at a time, then
    /// alpha from them. Two launches.
    pub fn weigh(&mut self, dusk: &Dusk) -> Result<()> {
        let kv = self.state.kv;
        let rows = self.topk.shape().rows() as u32;
        let args = [
            Arg::from(&self.state.k_t),
            Arg::from(&self.blk_indptr),
            Arg::from(&self.blk_indices),
            Arg::from(&self.tok_indptr),
            Arg::from(&self.dims),
            Arg::from(&self.qs),
            Arg::from(&self.out.scores),
            Arg::from(&self.out.stat_max),
            Arg::from(&self.out.staged_logits),
            Arg::from(self.topk.sel_item_indptr()),
            Arg::from(self.topk.sel_items()),
            Arg::from(&self.numerators),
            Arg::I32(kv.num_kv_heads as i32),
            Arg::I32(kv.head_dim as i32),
            Arg::I32(self.options.r as i32),
            Arg::I32(self.out.tiles as i32),
            Arg::I32(self.out.tile as i32),
            Arg::I32(self.chunks as i32),
        ];
        let dev = dusk.device();
        dev.launch(&self.mass, [rows, self.chunks as u32, 1], &args)?;
        let args = [
            Arg::from(&self.out.stat_max),
            Arg::from(&self.out.stat_sum),
            Arg::from(&self.numerators),
            Arg::from(&self.tok_indptr),
            Arg::from(self.topk.sel_item_indptr()),
            Arg::from(&self.state.v_sum),
            Arg::from(&self.alpha),
            Arg::from(&self.v_mean),
            Arg::I32(kv.num_kv_heads as i32),
            Arg::I32(self.out.tiles as i32),
            Arg::I32(self.out.tile as i32),
            Arg::I32(self.chunks as i32),
            Arg::I32(self.out.tile as i32),
        ];
        dev.launch(&self.weigh, [rows, 1, 1], &args)?;
        Ok(())
    }

    /// Algorithm 1's selection for `q`: the four steps, five launches, no allocation, no
    /// sync.
    pub fn select(&mut self, dusk: &Dusk, q: &Buffer<f16>) -> Result<()> {
        self.query(dusk, q)?;
        self.score(dusk)?;
        self.top_k(dusk)?;
        self.weigh(dusk)
    }

    /// What an attention plan over these lists is made for: one list per KV head
    /// ([`AttentionMode::GroupVarlen`]), the longest row, SparQ's mix, f16, the softmax
    /// scale `1 / sqrt(head_dim)` (Algorithm 1's).
    pub fn attention_spec(&self) -> AttentionSpec {
        let longest = self
            .topk
            .shape()
            .sel_indptr
            .windows(2)
            .map(|w| (w[1] - w[0]) as usize)
            .max()
            .unwrap_or(1);
        AttentionSpec {
            kv: self.state.kv,
            batch: self.batch,
            num_q_heads: self.num_q_heads,
            mode: AttentionMode::GroupVarlen,
            max_tokens: longest.max(1),
            sm_scale: None,
            sparq: true,
            dtype: DType::F16,
        }
    }

    /// The metadata `attn` (planned from [`SparqPlan::attention_spec`]) runs with over
    /// `table` (this plan's): the lists' offsets, fixed by this plan, and room for the
    /// lists, which [`SparqPlan::attend`] fills.
    pub fn attention_meta(
        &self,
        dusk: &Dusk,
        attn: &AttentionPlan,
        table: &PageTable,
    ) -> Result<AttentionMeta> {
        self.check_attention(attn)?;
        let dev = dusk.device();
        attn.device_meta(
            dusk,
            table,
            dev.upload(&self.topk.shape().sel_indptr)?,
            dev.alloc(self.topk.sel_indices().len())?,
        )
    }

    /// Attention of `q` over the last selection's tokens, mixed with the mean of V by
    /// alpha (`SparqMix`): copies the lists into `meta` (from
    /// [`SparqPlan::attention_meta`]), then runs `attn`. Three launches, no allocation,
    /// no sync.
    #[allow(clippy::too_many_arguments)]
    pub fn attend(
        &self,
        dusk: &Dusk,
        attn: &AttentionPlan,
        meta: &mut AttentionMeta,
        q: &Buffer<f16>,
        k: &Buffer<f16>,
        v: &Buffer<f16>,
        out: &mut Buffer<f16>,
        lse: &mut Buffer<f32>,
    ) -> Result<()> {
        self.check_attention(attn)?;
        let (_, indices) = meta.lists_mut().ok_or_else(|| {
            invalid(
                "meta",
                "token-list metadata (SparqPlan::attention_meta)",
                "none",
            )
        })?;
        ensure!(
            indices.len() == self.topk.sel_indices().len(),
            "meta",
            "the metadata of this plan (SparqPlan::attention_meta)",
            format!("room for {} tokens", indices.len()),
        );
        indices.copy_from(self.topk.sel_indices())?;
        let mix = SparqMix {
            alpha: &self.alpha,
            v_mean: &self.v_mean,
        };
        attn.run(dusk, q, k, v, meta, Some(mix), out, lse)
    }

    fn check_attention(&self, attn: &AttentionPlan) -> Result<()> {
        let s = attn.spec();
        ensure!(
            s.kv == self.state.kv
                && s.batch == self.batch
                && s.num_q_heads == self.num_q_heads
                && s.mode == AttentionMode::GroupVarlen
                && s.sparq
                && s.dtype == DType::F16,
            "attn",
            "a plan of SparqPlan::attention_spec (group lists, sparq, f16, this shape)",
            format!("{s:?}"),
        );
        Ok(())
    }

    /// Fills every output of a selection with `byte` (checks poison them first).
    pub fn poison_outputs(&mut self, dusk: &Dusk, byte: u8) -> Result<()> {
        let d = dusk.device();
        d.fill_bytes(&mut self.dims, byte)?;
        d.fill_bytes(&mut self.qs, byte)?;
        self.out.poison(dusk, byte)?;
        d.fill_bytes(&mut self.numerators, byte)?;
        d.fill_bytes(&mut self.alpha, byte)?;
        d.fill_bytes(&mut self.v_mean, byte)?;
        self.topk.poison_outputs(dusk, byte)
    }

    pub fn options(&self) -> &SparqOptions {
        &self.options
    }
    pub fn state(&self) -> &SparqState {
        &self.state
    }
    pub fn state_mut(&mut self) -> &mut SparqState {
        &mut self.state
    }
    /// The state, for the plan of the next page table.
    pub fn into_state(self) -> SparqState {
        self.state
    }
    /// The selection's sizes, known at plan time (rows are `batch * num_kv_heads`; items
    /// are tokens).
    pub fn shape(&self) -> &SelectionShape {
        self.topk.shape()
    }
    /// The copy's block table (`blk_indptr`, `blk_indices`) and the tokens before each
    /// sequence (`tok_indptr`) the kernels read, for a step that writes them on the device.
    pub(crate) fn table_buffers(&self) -> [&Buffer<i32>; 3] {
        [&self.blk_indptr, &self.blk_indices, &self.tok_indptr]
    }
    /// The shared top-k (its configuration and outputs).
    pub fn top_k_plan(&self) -> &TopKPlan {
        &self.topk
    }
    /// The components' stride of [`SparqPlan::dims`] and [`SparqPlan::sparse_query`]: `r`
    /// rounded up to a power of two, at least 8.
    pub fn padded_r(&self) -> usize {
        self.rp
    }
    /// Tokens a score program covers.
    pub fn tile(&self) -> usize {
        self.out.tile
    }
    /// Each row's `r` components of q, ascending (i32 `[rows, padded_r]`, zeros past `r`).
    pub fn dims(&self) -> &Buffer<i32> {
        &self.dims
    }
    /// Each query head's `q[dims] / tau`, component-major: f32 `[batch * num_kv_heads,
    /// padded_r, group]` (a row's `j`-th component, then its heads).
    pub fn sparse_query(&self) -> &Buffer<f32> {
        &self.qs
    }
    /// What the scoring wrote: the scores and the tiles' statistics.
    pub fn outputs(&self) -> &ScoreOutputs {
        &self.out
    }
    /// The tokens' approximate scores, summed over the group: row `(b, h)` at
    /// `tok_indptr[b] * num_kv_heads + h * len_b` (`shape().item_indptr` is `tok_indptr`).
    pub fn scores(&self) -> &Buffer<f32> {
        &self.out.scores
    }
    /// Each query head's alpha (f32 `[batch * num_q_heads]`).
    pub fn alpha(&self) -> &Buffer<f32> {
        &self.alpha
    }
    /// Each row's mean of V (f16 `[batch * num_kv_heads, head_dim]`).
    pub fn v_mean(&self) -> &Buffer<f16> {
        &self.v_mean
    }
    /// Token lists' row offsets (`batch * num_kv_heads + 1`, fixed by the plan).
    pub fn sel_indptr(&self) -> &Buffer<i32> {
        self.topk.sel_indptr()
    }
    /// Kept token positions, ascending in each row.
    pub fn sel_indices(&self) -> &Buffer<i32> {
        self.topk.sel_indices()
    }
    /// 1 for a row whose scores held a NaN or an infinity (a NaN in q), else 0.
    pub fn flags(&self) -> &Buffer<i32> {
        self.topk.flags()
    }
}
