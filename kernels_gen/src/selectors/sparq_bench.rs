//! SparQ's selection at a benchmark shape, for the GPU check: the transposed copy of K
//! filled on the device from a hash of each value's index (gigabytes at 32k context; the
//! host recomputes any value it checks), random sums of V and query, a page table of
//! scattered pages and a block table of scattered blocks for the copy; a check of every step against the f64 reference on fresh inputs with
//! the outputs poisoned first; the harness's timings of each step and of the whole
//! selection.
//!
//! ```
//! use dusk_kernels::ops::Dusk;
//! use dusk_kernels::selectors::sparq_bench::{SparqBench, SparqCase};
//! use dusk_kernels::selectors::Budget;
//! use dusk_runtime::Device;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dusk = Dusk::new(Device::cpu())?;
//! let case = SparqCase { batch: 2, context: 300, num_q_heads: 8, num_kv_heads: 2,
//!                        k: Budget::Tokens(64), window: 16, ..SparqCase::default() };
//! let mut bench = SparqBench::new(&dusk, &case, |_| {})?;
//! let report = bench.check(&dusk, 4)?; // the rows of the first and last sequences
//! assert_eq!(report.rows, 4);
//! let times = bench.time(&dusk)?;      // graph-timed on a GPU, wall clock here
//! assert!(times.select.median_us() > 0.0);
//! # Ok(()) }
//! ```

use super::bench::check_order;
use super::reference::top_k_row;
use super::selector::Build;
use super::sparq::closed_tokens;
use super::sparq::{ScoreOutputs, SparqBlocks, SparqOptions, SparqPlan, SparqState};
use super::sparq_kernels::{sparq_score, SPARQ_RUN};
use super::sparq_reference::{sparq_alpha, sparq_row};
use super::topk::{Budget, Keep, SelectionShape, TopKConfig};
use crate::error::Result;
use crate::ops::Dusk;
use crate::paged::{KvShape, PageTable};
use dusk_macros::kernel;
use dusk_runtime::{Buffer, LoadedKernel, Measured};
use half::f16;
use std::sync::Arc;

/// A benchmark shape: head_dim 128, pages of 16, the transposed copy in blocks of 256,
/// `r` of 16 (SparQ's default ratio of 1/8), `k` an eighth of each sequence, the window a
/// quarter of `k` (the paper's `l`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SparqCase {
    pub batch: usize,
    /// Tokens in every sequence.
    pub context: usize,
    pub num_q_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub page_size: usize,
    /// Tokens in a block of the transposed copy.
    pub block_size: usize,
    pub r: usize,
    pub k: Budget,
    pub window: usize,
    pub seed: u64,
}

impl Default for SparqCase {
    /// Batch 32, 32k tokens, GQA 32/8, head_dim 128, pages of 16, blocks of 256, r 16,
    /// k = N/8 (4096), window 1024.
    fn default() -> Self {
        SparqCase {
            batch: 32,
            context: 32768,
            num_q_heads: 32,
            num_kv_heads: 8,
            head_dim: 128,
            page_size: 16,
            block_size: 256,
            r: 16,
            k: Budget::Fraction(0.125),
            window: 1024,
            seed: 0x5a49,
        }
    }
}

/// A small, fast generator (SplitMix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    /// On the grid of 1/64 in [-2, 2]: sums of magnitudes over a group are exact in f32,
    /// so the components chosen are the f64 reference's.
    fn grid(&mut self) -> f32 {
        (self.below(257) as f32 - 128.0) / 64.0
    }
}

/// The value [`fill_keys`] writes at index `i` for `seed`: an integer hash of the index
/// mapped to a multiple of 2^-13 in [-3, 3), as f16.
pub fn key_value(i: u64, seed: i32) -> f16 {
    let mut x = (i as i32) ^ ((i >> 32) as i32).wrapping_mul(0x2C1B_3C6D) ^ seed;
    x = x.wrapping_mul(-0x61C8_864F);
    x ^= (x >> 15) & 0x1FFFF;
    x = x.wrapping_mul(0x2C1B_3C6D);
    x ^= (x >> 12) & 0xFFFFF;
    f16::from_f32(((x >> 9) & 0x3FFF) as f32 * (6.0 / 16384.0) - 3.0)
}

/// Fills `out` (`n` values) with [`key_value`]`(i, seed)`. Grid: `ceil(n / BLOCK)`.
#[kernel(crate = "crate::dusk_paths", num_warps = 4)]
pub fn fill_keys<const BLOCK: usize>(out: Ptr<f16>, n: i64, seed: i32) {
    let i = (program_id(0) as i64) * BLOCK + (arange(0, BLOCK) as i64);
    let mut x = (i as i32) ^ ((i >> 32) as i32) * 0x2C1B_3C6D ^ seed;
    x = x * -0x61C8_864F;
    x = x ^ ((x >> 15) & 0x1FFFF);
    x = x * 0x2C1B_3C6D;
    x = x ^ ((x >> 12) & 0xFFFFF);
    let value = ((x >> 9) & 0x3FFF) as f32 * 0.0003662109375 - 3.0;
    store(out + i, value as f16, i < n);
}

const FILL_BLOCK: usize = 4096;

/// The staging rings ([`SparqState::k_open`]) of `blocks`' sequences: each row's tokens past
/// [`closed_tokens`], with the values [`fill_keys`] writes at their places in the copy
/// (blocks of `bs`) for `seed`, so that the state reads as if every token were there.
fn staged_keys(kv: &KvShape, blocks: &PageTable, bs: usize, seed: i32) -> Vec<f16> {
    let (hk, d) = (kv.num_kv_heads, kv.head_dim);
    let run = bs.min(SPARQ_RUN);
    let ring = 2 * run;
    let mut out = vec![f16::ZERO; blocks.batch() * hk * ring * d];
    for b in 0..blocks.batch() {
        let n = blocks.seq_len(b, bs);
        let first = blocks.kv_indptr[b] as usize;
        for t in closed_tokens(n, run)..n {
            let blk = blocks.kv_page_indices[first + t / bs] as usize;
            for h in 0..hk {
                for c in 0..d {
                    let at = ((blk * hk + h) * d + c) * bs + t % bs;
                    out[((b * hk + h) * ring + t % ring) * d + c] = key_value(at as u64, seed);
                }
            }
        }
    }
    out
}

/// What [`SparqBench::check`] compared.
#[derive(Clone, Debug, PartialEq)]
pub struct SparqCheck {
    /// Rows compared.
    pub rows: usize,
    /// The largest score error relative to its row's largest score magnitude.
    pub max_score_error: f64,
    /// The largest alpha error.
    pub max_alpha_error: f64,
    /// Kept tokens that differ from the f64 reference's top-k (all within the score error
    /// of the cut).
    pub near_ties: usize,
}

/// The harness's timings of one case.
#[derive(Clone, Debug)]
pub struct SparqTimes {
    pub query: Measured,
    pub score: Measured,
    pub top_k: Measured,
    pub weigh: Measured,
    /// All four: one `select`.
    pub select: Measured,
}

/// SparQ planned at a benchmark shape over random state.
pub struct SparqBench {
    case: SparqCase,
    kv: KvShape,
    table: PageTable,
    blocks: PageTable,
    q_host: Vec<f16>,
    q: Buffer<f16>,
    /// One plan per rotation set, each over its own state (seed `seed + set`).
    plans: Vec<SparqPlan>,
    key_seed: i32,
    /// Set 0's sums of V.
    v_sum: Vec<f32>,
}

impl SparqBench {
    /// Random state and query for `case` (every sequence's pages scattered over the
    /// cache), planned with `tune` changing the top-k's configuration.
    pub fn new(
        dusk: &Dusk,
        case: &SparqCase,
        tune: impl Fn(&mut TopKConfig),
    ) -> Result<SparqBench> {
        let mut rng = Rng(case.seed);
        let ps = case.page_size;
        let lens = vec![case.context; case.batch];
        let num_pages = PageTable::pages_needed(&lens, ps).max(1);
        let mut ids: Vec<i32> = (0..num_pages as i32).collect();
        for i in (1..ids.len()).rev() {
            ids.swap(i, rng.below(i + 1));
        }
        let table = PageTable::from_lengths(&lens, ps, ids)?;
        let bs = case.block_size;
        let num_blocks = PageTable::pages_needed(&lens, bs).max(1);
        let mut ids: Vec<i32> = (0..num_blocks as i32).collect();
        for i in (1..ids.len()).rev() {
            ids.swap(i, rng.below(i + 1));
        }
        let blocks = PageTable::from_lengths(&lens, bs, ids)?;
        let layout = SparqBlocks {
            num_blocks,
            block_size: bs,
        };
        let kv = KvShape {
            num_pages,
            page_size: ps,
            num_kv_heads: case.num_kv_heads,
            head_dim: case.head_dim,
        };
        let dev = dusk.device();
        let q_host: Vec<f16> = (0..case.batch * case.num_q_heads * case.head_dim)
            .map(|_| f16::from_f32(rng.grid()))
            .collect();
        let q = dev.upload(&q_host)?;
        let options = SparqOptions {
            r: case.r,
            k: case.k,
            window: case.window,
        };
        let read = case.batch * case.num_kv_heads * case.context * case.r * 2;
        let sets = dev.rotation_sets(read);
        let fill = dusk.kernel(
            "sparq bench fill_keys".into(),
            fill_keys::build::<FILL_BLOCK>,
        )?;
        let key_seed = (rng.next() >> 33) as i32;
        let (mut plans, mut v_sum) = (vec![], vec![]);
        for set in 0..sets {
            let mut state = SparqState::new(dusk, kv, case.batch, layout)?;
            let n = num_blocks * bs * kv.num_kv_heads * kv.head_dim;
            let grid = [n.div_ceil(FILL_BLOCK) as u32, 1, 1];
            let seed = key_seed.wrapping_add(set as i32);
            fill_keys::launch::<FILL_BLOCK>(dev, &fill, grid, state.k_t(), n as i64, seed)?;
            state
                .k_open_mut()
                .copy_from_host(&staged_keys(&kv, &blocks, bs, seed))?;
            let sums: Vec<f32> = (0..case.batch * kv.num_kv_heads * kv.head_dim)
                .map(|_| rng.grid() * case.context as f32 / 8.0)
                .collect();
            state.v_sum_mut().copy_from_host(&sums)?;
            plans.push(SparqPlan::with_config(
                dusk,
                state,
                case.num_q_heads,
                &table,
                &blocks,
                options,
                &tune,
            )?);
            if set == 0 {
                v_sum = sums;
            }
        }
        Ok(SparqBench {
            case: *case,
            kv,
            table,
            blocks,
            q_host,
            q,
            plans,
            key_seed,
            v_sum,
        })
    }

    pub fn case(&self) -> &SparqCase {
        &self.case
    }
    pub fn kv(&self) -> KvShape {
        self.kv
    }
    pub fn table(&self) -> &PageTable {
        &self.table
    }
    /// The transposed copy's block table.
    pub fn blocks(&self) -> &PageTable {
        &self.blocks
    }
    /// Rotation sets (each its own state and plan).
    pub fn sets(&self) -> usize {
        self.plans.len()
    }
    pub fn plan(&self, set: usize) -> &SparqPlan {
        &self.plans[set]
    }

    fn tokens(&self) -> usize {
        *self.plans[0].shape().item_indptr.last().unwrap() as usize
    }

    /// Bytes the scoring must read: `r` components of every token for each KV head (the
    /// transposed copy), the sparse queries, the components, the block table.
    pub fn score_read_bytes(&self) -> usize {
        let (c, rows) = (&self.case, self.plans[0].shape().rows());
        let columns = self.tokens() * c.num_kv_heads * c.r * 2;
        let queries = rows * self.plans[0].padded_r() * (4 + 4 * c.num_q_heads / c.num_kv_heads);
        columns + queries + self.blocks.kv_page_indices.len() * 4
    }

    /// Bytes the scoring must move: what it reads, and the scores and the tiles'
    /// statistics written.
    pub fn score_bytes(&self) -> usize {
        self.score_bytes_with(self.plans[0].tile())
    }

    /// [`SparqBench::score_bytes`] for tiles of `tile` tokens.
    fn score_bytes_with(&self, tile: usize) -> usize {
        let c = &self.case;
        let group = c.num_q_heads / c.num_kv_heads;
        let rows = self.plans[0].shape().rows();
        let tiles = self.tokens().div_ceil(tile) / c.batch.max(1);
        self.score_read_bytes() + self.tokens() * c.num_kv_heads * 4 + rows * tiles * group * 8
    }

    /// Bytes a whole selection must move: the scoring's, the top-k's (the scores read, the
    /// kept tokens written twice: items and positions), and alpha's (the tiles' statistics,
    /// each kept token's score with one head, its `r` components with a group, the
    /// chunks' numerators, the sums of V read and the means written).
    pub fn select_bytes(&self) -> usize {
        let c = &self.case;
        let group = c.num_q_heads / c.num_kv_heads;
        let shape = self.plans[0].shape();
        let kept = *shape.sel_indptr.last().unwrap() as usize;
        let top_k = shape.num_scores() * 4 + kept * 8;
        let rows = shape.rows();
        let tiles = self.tokens().div_ceil(self.plans[0].tile()) / c.batch.max(1);
        let per_kept = if group > 1 { 2 * c.r } else { 4 };
        let chunks = kept.div_ceil(self.plans[0].tile()) * group * 8;
        let weigh = rows * tiles * group * 8 + kept * per_kept + chunks + rows * c.head_dim * 6;
        self.score_bytes() + top_k + weigh
    }

    /// Selects on set 0 with its outputs poisoned first and compares up to `max_rows` rows
    /// (the first sequence's KV heads, then the last's, ...) with the f64 reference: the
    /// components equal, scores within 1e-5 of the row's largest, the kept tokens equal to
    /// the sort-based top-k of the kernel's own scores and to the reference's but for
    /// near-ties (scores within that error of the cut), the token lists equal to the kept
    /// tokens, alpha within 1e-4 of the reference's on the kept tokens, the mean of V equal
    /// to the sum over the length (to f16's rounding), no row flagged.
    pub fn check(
        &mut self,
        dusk: &Dusk,
        max_rows: usize,
    ) -> std::result::Result<SparqCheck, String> {
        let e = |x: crate::DuskError| x.to_string();
        let d = |x: dusk_runtime::RuntimeError| x.to_string();
        let plan = &mut self.plans[0];
        plan.poison_outputs(dusk, 0xFF).map_err(e)?;
        plan.select(dusk, &self.q).map_err(e)?;
        let shape = plan.shape().clone();
        let rp = plan.padded_r();
        let dims = plan.dims().download().map_err(d)?;
        let scores = plan.scores().download().map_err(d)?;
        let items = plan.top_k_plan().sel_items().download().map_err(d)?;
        let lists = plan.sel_indices().download().map_err(d)?;
        let alpha = plan.alpha().download().map_err(d)?;
        let v_mean = plan.v_mean().download().map_err(d)?;
        let flags = plan.flags().download().map_err(d)?;
        let (c, kv) = (self.case, self.kv);
        let (hk, dh, ps, bs) = (kv.num_kv_heads, kv.head_dim, kv.page_size, c.block_size);
        let group = c.num_q_heads / hk;
        let keep = Keep {
            sink: 0,
            recent: c.window,
        };
        let order = check_order(self.table.batch());
        let mut report = SparqCheck {
            rows: 0,
            max_score_error: 0.0,
            max_alpha_error: 0.0,
            near_ties: 0,
        };
        'rows: for b in order {
            for h in 0..hk {
                if report.rows == max_rows {
                    break 'rows;
                }
                let row = b * hk + h;
                let n = self.table.seq_len(b, ps);
                let first = self.blocks.kv_indptr[b] as usize;
                let ids = &self.blocks.kv_page_indices;
                let seed = self.key_seed;
                let key = |t: usize, comp: usize| {
                    let blk = ids[first + t / bs] as u64;
                    let at = ((blk * hk as u64 + h as u64) * dh as u64 + comp as u64) * bs as u64;
                    key_value(at + (t % bs) as u64, seed).to_f64()
                };
                let want = sparq_row(&self.q_host, c.num_q_heads, hk, dh, b, h, c.r, n, &key);
                let got_dims: Vec<usize> = dims[row * rp..row * rp + c.r]
                    .iter()
                    .map(|x| *x as usize)
                    .collect();
                if got_dims != want.dims {
                    return Err(format!(
                        "row {row}: components {got_dims:?}, want {:?}",
                        want.dims
                    ));
                }
                let base = shape.item_indptr[b] as usize * hk + h * n;
                let got: Vec<f64> = scores[base..base + n].iter().map(|s| *s as f64).collect();
                let scale = want.scores.iter().fold(1e-30f64, |m, w| m.max(w.abs()));
                let mut worst = 0.0f64;
                for (t, (g, w)) in got.iter().zip(&want.scores).enumerate() {
                    let err = (g - w).abs() / scale;
                    if err.is_nan() || err > 1e-5 {
                        return Err(format!("row {row} token {t}: score {g} against {w}"));
                    }
                    worst = worst.max(err);
                }
                report.max_score_error = report.max_score_error.max(worst);
                let k = shape.k_items[b] as usize;
                let (lo, hi) = (
                    shape.sel_item_indptr[row] as usize,
                    shape.sel_item_indptr[row + 1] as usize,
                );
                let kept: Vec<usize> = items[lo..hi].iter().map(|i| *i as usize).collect();
                let own = top_k_row(&got, k, keep);
                if kept != own {
                    return Err(format!(
                        "row {row}: kept tokens differ from the top-k of its scores"
                    ));
                }
                let reference = top_k_row(&want.scores, k, keep);
                let cut = reference
                    .iter()
                    .filter(|&&t| t + c.window < n)
                    .map(|&t| want.scores[t])
                    .fold(f64::INFINITY, f64::min);
                for t in kept.iter().filter(|t| !reference.contains(t)) {
                    if (want.scores[*t] - cut).abs() > 2.0 * worst * scale {
                        return Err(format!("row {row}: token {t} kept, not near the cut"));
                    }
                    report.near_ties += 1;
                }
                let (lo, hi) = (
                    shape.sel_indptr[row] as usize,
                    shape.sel_indptr[row + 1] as usize,
                );
                if lists[lo..hi]
                    .iter()
                    .map(|x| *x as usize)
                    .ne(kept.iter().copied())
                {
                    return Err(format!(
                        "row {row}: token list differs from its kept tokens"
                    ));
                }
                for g in 0..group {
                    let want_alpha = if k >= n {
                        1.0
                    } else {
                        sparq_alpha(&want.logits[g], &kept)
                    };
                    let got_alpha = alpha[row * group + g] as f64;
                    let err = (got_alpha - want_alpha).abs();
                    if err.is_nan() || err > 1e-4 {
                        return Err(format!(
                            "row {row} head {g}: alpha {got_alpha}, want {want_alpha}"
                        ));
                    }
                    report.max_alpha_error = report.max_alpha_error.max(err);
                }
                for i in 0..dh {
                    let want = self.v_sum[row * dh + i] as f64 / n as f64;
                    let got = v_mean[row * dh + i].to_f64();
                    if (got - want).abs() > 1e-3 * (1.0 + want.abs()) {
                        return Err(format!("row {row}: v_mean[{i}] {got}, want {want}"));
                    }
                }
                if flags[row] != 0 {
                    return Err(format!("row {row} flagged"));
                }
                report.rows += 1;
            }
        }
        Ok(report)
    }

    /// The harness's timing (`Device::time_calls`: graph replays over the rotation sets on
    /// a GPU) of one step, or of a whole `select`. The steps after the first read what the
    /// ones before wrote: [`SparqBench::check`] (or a `select`) first.
    pub fn time_step(&mut self, dusk: &Dusk, step: SparqStep) -> Result<Measured> {
        let dev = dusk.device();
        let sets = self.plans.len();
        let (plans, q) = (&mut self.plans, &self.q);
        Ok(match step {
            SparqStep::Query => dev.time_calls(sets, |i| plans[i].query(dusk, q))?,
            SparqStep::Score => dev.time_calls(sets, |i| plans[i].score(dusk))?,
            SparqStep::TopK => dev.time_calls(sets, |i| plans[i].top_k(dusk))?,
            SparqStep::Weigh => dev.time_calls(sets, |i| plans[i].weigh(dusk))?,
            SparqStep::Select => dev.time_calls(sets, |i| plans[i].select(dusk, q))?,
        })
    }

    /// Bytes the scoring with `cfg` must move (as [`SparqBench::score_bytes`]).
    pub fn score_config_bytes(&self, cfg: &ScoreConfig) -> usize {
        self.score_bytes_with(cfg.tile)
    }

    /// The scoring with `cfg` (one of [`ScoreConfig::alternatives`] for this case's group,
    /// at r 16 and blocks of 256) into outputs of its own, checked by
    /// [`SparqBench::check_score_config`], then timed by the harness over the sets.
    pub fn time_score_config(
        &self,
        dusk: &Dusk,
        cfg: ScoreConfig,
    ) -> std::result::Result<Measured, String> {
        let (kernel, outs) = self.check_score_config(dusk, cfg)?;
        let plans = &self.plans;
        dusk.device()
            .time_calls(plans.len(), |i| {
                plans[i].score_into(dusk, &kernel, &outs[i])
            })
            .map_err(|x| x.to_string())
    }

    /// Runs the scoring with `cfg` on set 0 into outputs of its own (one for each set,
    /// returned with the kernel) and compares it with the plan's own (after a `select`):
    /// every score, and each row's and head's softmax maximum and normaliser from the
    /// tiles' statistics, within 1e-5 relative.
    pub fn check_score_config(
        &self,
        dusk: &Dusk,
        cfg: ScoreConfig,
    ) -> std::result::Result<(Arc<LoadedKernel>, Vec<ScoreOutputs>), String> {
        let e = |x: crate::DuskError| x.to_string();
        let d = |x: dusk_runtime::RuntimeError| x.to_string();
        let c = self.case;
        let group = c.num_q_heads / c.num_kv_heads;
        let build = cfg
            .build(group)
            .filter(|_| c.r == 16 && c.block_size == 256)
            .ok_or_else(|| format!("no score kernel {} for this case", cfg.label()))?;
        let kernel = dusk
            .kernel(format!("sparq bench score g{group} {}", cfg.label()), build)
            .map_err(e)?;
        let outs = self
            .plans
            .iter()
            .map(|p| p.score_outputs(dusk, cfg.tile))
            .collect::<Result<Vec<_>>>()
            .map_err(e)?;
        let plan = &self.plans[0];
        plan.score_into(dusk, &kernel, &outs[0]).map_err(e)?;
        let want = plan.scores().download().map_err(d)?;
        let got = outs[0].scores().download().map_err(d)?;
        let scale = want.iter().fold(1e-30f32, |m, x| m.max(x.abs()));
        if let Some(i) = (0..want.len()).find(|&i| (want[i] - got[i]).abs() > 1e-5 * scale) {
            return Err(format!(
                "{}: score {i} {} against {}",
                cfg.label(),
                got[i],
                want[i]
            ));
        }
        let totals = |out: &ScoreOutputs| softmax_totals(out, plan.shape(), c.num_kv_heads, group);
        let (want, got) = (totals(plan.outputs())?, totals(&outs[0])?);
        for (i, ((wm, wz), (gm, gz))) in want.iter().zip(&got).enumerate() {
            if (wm - gm).abs() > 1e-5 * wm.abs().max(1.0) || (wz - gz).abs() > 1e-5 * wz {
                return Err(format!(
                    "{}: row {} head {}: softmax max and sum {gm} {gz} against {wm} {wz}",
                    cfg.label(),
                    i / group,
                    i % group
                ));
            }
        }
        Ok((kernel, outs))
    }

    /// Every step's timing and a whole `select`'s.
    pub fn time(&mut self, dusk: &Dusk) -> Result<SparqTimes> {
        for i in 0..self.plans.len() {
            self.plans[i].select(dusk, &self.q)?;
        }
        Ok(SparqTimes {
            query: self.time_step(dusk, SparqStep::Query)?,
            score: self.time_step(dusk, SparqStep::Score)?,
            top_k: self.time_step(dusk, SparqStep::TopK)?,
            weigh: self.time_step(dusk, SparqStep::Weigh)?,
            select: self.time_step(dusk, SparqStep::Select)?,
        })
    }
}

/// Each row's and head's softmax maximum and normaliser (`sum exp(l - max)`) from a
/// scoring's tile statistics (`rows * group` pairs, row-major).
fn softmax_totals(
    out: &ScoreOutputs,
    shape: &SelectionShape,
    num_kv_heads: usize,
    group: usize,
) -> std::result::Result<Vec<(f64, f64)>, String> {
    let d = |x: dusk_runtime::RuntimeError| x.to_string();
    let (max, sum) = (
        out.stat_max().download().map_err(d)?,
        out.stat_sum().download().map_err(d)?,
    );
    let tiles = out.tiles();
    Ok((0..shape.rows() * group)
        .map(|rg| {
            let (row, g) = (rg / group, rg % group);
            let b = row / num_kv_heads;
            let n = (shape.item_indptr[b + 1] - shape.item_indptr[b]) as usize;
            let at = |t: usize| (row * tiles + t) * group + g;
            let used = n.div_ceil(out.tile());
            let m = (0..used)
                .map(|t| max[at(t)] as f64)
                .fold(f64::NEG_INFINITY, f64::max);
            let z = (0..used)
                .map(|t| sum[at(t)] as f64 * (max[at(t)] as f64 - m).exp())
                .sum();
            (m, z)
        })
        .collect())
}

/// A configuration of the score kernel (`sparq_score`) at the benchmark's `r` of 16 and
/// blocks of 256 tokens, for groups of 1 and 4: the tokens a program scores and the
/// components whose loads are in flight at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScoreConfig {
    pub tile: usize,
    pub chunk: usize,
}

impl ScoreConfig {
    /// The configurations [`SparqBench::time_score_config`] takes for a group of `group`
    /// (the plan's first).
    pub fn alternatives(group: usize) -> Vec<ScoreConfig> {
        let c = |tile, chunk| ScoreConfig { tile, chunk };
        match group {
            1 => vec![c(256, 8), c(128, 16), c(128, 8), c(256, 16), c(512, 8)],
            4 => vec![c(256, 8), c(256, 4), c(256, 16), c(128, 8), c(128, 16)],
            _ => vec![],
        }
    }

    /// Its kernel for a group of `group`; `None` outside [`ScoreConfig::alternatives`].
    fn build(&self, group: usize) -> Option<Build> {
        macro_rules! table {
            ($($g:literal $t:literal $c:literal;)*) => {
                match (group, self.tile, self.chunk) {
                    $(($g, $t, $c) => Some(sparq_score::build::<$g, 16, $c, $t, 8> as Build),)*
                    _ => None,
                }
            };
        }
        table! {
            1 128 16; 1 128 8; 1 256 16; 1 256 8; 1 512 8;
            4 256 8; 4 256 4; 4 256 16; 4 128 8; 4 128 16;
        }
    }

    /// A short name: `tile 256 chunk 8`.
    pub fn label(&self) -> String {
        format!("tile {} chunk {}", self.tile, self.chunk)
    }
}

/// A step of [`SparqPlan::select`], for [`SparqBench::time_step`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SparqStep {
    Query,
    Score,
    TopK,
    Weigh,
    /// All four.
    Select,
}
