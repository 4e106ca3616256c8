//! Double Sparsity at a benchmark shape, for the GPU check: random labels (as many copies
//! as the timing harness rotates through), a random calibration, a page table of scattered
//! pages, a query; a check against the references on fresh inputs with the outputs
//! poisoned first; the harness's timings of the scoring, the top-k and the whole selection.
//!
//! ```
//! use dusk_kernels::ops::Dusk;
//! use dusk_kernels::selectors::ds_bench::{DsBench, DsCase};
//! use dusk_runtime::Device;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dusk = Dusk::new(Device::cpu())?;
//! let case = DsCase { batch: 2, context: 700, num_q_heads: 8, num_kv_heads: 2, ..DsCase::default() };
//! let mut bench = DsBench::new(&dusk, &case)?;
//! let report = bench.check(&dusk, 4)?; // the rows of the first and last sequences
//! assert_eq!(report.rows, 4);
//! let times = bench.time(&dusk)?;      // graph-timed on a GPU, wall clock here
//! assert!(times.select.median_us() > 0.0);
//! # Ok(()) }
//! ```

use super::bench::{
    check_order, compare_scores, time_selection, CheckReport, Rng, SelectionTimes, TimedSelection,
};
use super::ds::{DsCalibration, DsOptions, DsPlan, DsState};
use super::reference::{ds_row_scores, top_k_row};
use super::topk::Budget;
use crate::error::Result;
use crate::ops::Dusk;
use crate::paged::{KvShape, PageTable};
use dusk_runtime::Buffer;
use half::f16;

/// A benchmark shape (DESIGN.md section 6: head_dim 128, pages of 16, budget N/4; the DS
/// paper's `r = head_dim / 8`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DsCase {
    pub batch: usize,
    /// Tokens in every sequence.
    pub context: usize,
    pub num_q_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub page_size: usize,
    /// Labels per token and KV head.
    pub r: usize,
    pub budget: Budget,
    pub options: DsOptions,
    pub seed: u64,
}

impl Default for DsCase {
    /// Batch 32, 32k tokens, GQA 32/8, head_dim 128, pages of 16, 16 labels, a quarter of
    /// each sequence with the first 4 tokens and the last 64 always kept.
    fn default() -> Self {
        DsCase {
            batch: 32,
            context: 32768,
            num_q_heads: 32,
            num_kv_heads: 8,
            head_dim: 128,
            page_size: 16,
            r: 16,
            budget: Budget::Fraction(0.25),
            options: DsOptions {
                sink: 4,
                recent: 64,
            },
            seed: 0xd5,
        }
    }
}

/// Random values spread over [-2, 2] from the generator's bits, four a draw (the labels
/// of a large cache are many: no float arithmetic per value).
fn random_f16(rng: &mut Rng, n: usize) -> Vec<f16> {
    let mut out = Vec::with_capacity(n + 3);
    while out.len() < n {
        let x = rng.next();
        for i in 0..4 {
            let w = (x >> (16 * i)) as u16;
            // Sign and mantissa random; exponent 12 to 15 (magnitudes 1/8 to 2).
            let exp = 12 + ((w >> 10) & 3);
            out.push(f16::from_bits((w & 0x83FF) | (exp << 10)));
        }
    }
    out.truncate(n);
    out
}

/// DS planned at a benchmark shape over random inputs.
pub struct DsBench {
    case: DsCase,
    kv: KvShape,
    table: PageTable,
    calibration: DsCalibration,
    q_host: Vec<f16>,
    q: Buffer<f16>,
    /// One plan per rotation set, each over its own random labels.
    plans: Vec<DsPlan>,
    /// Set 0's labels on the host, for the check.
    host_labels: Vec<f16>,
}

impl DsBench {
    /// Random labels, calibration and query for `case` (pages of every sequence scattered
    /// over the cache).
    pub fn new(dusk: &Dusk, case: &DsCase) -> Result<DsBench> {
        let mut rng = Rng(case.seed);
        let ps = case.page_size;
        let lens = vec![case.context; case.batch];
        let num_pages = PageTable::pages_needed(&lens, ps).max(1);
        let mut ids: Vec<i32> = (0..num_pages as i32).collect();
        for i in (1..ids.len()).rev() {
            ids.swap(i, rng.below(i + 1));
        }
        let table = PageTable::from_lengths(&lens, ps, ids)?;
        let kv = KvShape {
            num_pages,
            page_size: ps,
            num_kv_heads: case.num_kv_heads,
            head_dim: case.head_dim,
        };
        let lists: Vec<Vec<usize>> = (0..case.num_kv_heads)
            .map(|_| {
                let mut c: Vec<usize> = (0..case.head_dim).collect();
                for i in (1..c.len()).rev() {
                    c.swap(i, rng.below(i + 1));
                }
                c.truncate(case.r);
                c.sort_unstable();
                c
            })
            .collect();
        let calibration = DsCalibration::from_channels(case.head_dim, &lists)?;
        let dev = dusk.device();
        let q_host: Vec<f16> = (0..case.batch * case.num_q_heads * case.head_dim)
            .map(|_| f16::from_f32(rng.unit() * 2.0))
            .collect();
        let q = dev.upload(&q_host)?;
        let labels_len = kv.rows() * case.r;
        let sets = dev.rotation_sets(labels_len * 2);
        let (mut plans, mut host_labels) = (vec![], vec![]);
        for set in 0..sets {
            let labels = random_f16(&mut rng, labels_len);
            let mut state = DsState::new(dusk, kv, &calibration)?;
            state.labels_mut().copy_from_host(&labels)?;
            plans.push(DsPlan::with_state(
                dusk,
                state,
                case.num_q_heads,
                &table,
                case.budget,
                case.options,
            )?);
            if set == 0 {
                host_labels = labels;
            }
        }
        Ok(DsBench {
            case: *case,
            kv,
            table,
            calibration,
            q_host,
            q,
            plans,
            host_labels,
        })
    }

    pub fn case(&self) -> &DsCase {
        &self.case
    }
    pub fn kv(&self) -> KvShape {
        self.kv
    }
    pub fn table(&self) -> &PageTable {
        &self.table
    }
    /// Rotation sets (each its own labels and plan).
    pub fn sets(&self) -> usize {
        self.plans.len()
    }
    /// The plan of set `set`.
    pub fn plan(&self, set: usize) -> &DsPlan {
        &self.plans[set]
    }

    /// Bytes the scoring must move: the labels of every token of every sequence for each
    /// KV head, the query, the channels, the page table, the token offsets, and the scores
    /// written.
    pub fn score_bytes(&self) -> usize {
        let tokens = self.case.batch * self.case.context;
        let h = self.kv.num_kv_heads;
        let labels = tokens * h * self.case.r * 2;
        let scores = tokens * h * 4;
        let table = (self.table.kv_page_indices.len() + self.table.kv_indptr.len()) * 4;
        let meta = self.calibration.channels().len() * 4 + (self.case.batch + 1) * 4;
        labels + scores + self.q_host.len() * 2 + table + meta
    }

    /// Bytes the top-k must move: the scores read, the kept tokens written (as items and as
    /// positions: the top-k writes both).
    pub fn top_k_bytes(&self) -> usize {
        let shape = self.plans[0].shape();
        let scores = shape.num_scores() * 4;
        let tokens = *shape.sel_indptr.last().unwrap() as usize * 4;
        scores + 2 * tokens
    }

    /// Selects on set 0 with its outputs poisoned first and compares the rows of up to
    /// `max_rows` (the first sequence's KV heads, then the last's, ...) with the
    /// references: scores in f64 (relative to each row's largest, at most 1e-5 per term
    /// summed), tokens equal to the sort-based top-k of the kernel's own scores (f32
    /// rounding may order near-ties differently from f64), no row flagged.
    pub fn check(
        &mut self,
        dusk: &Dusk,
        max_rows: usize,
    ) -> std::result::Result<CheckReport, String> {
        let e = |x: crate::DuskError| x.to_string();
        let plan = &mut self.plans[0];
        plan.poison_outputs(dusk, 0xFF).map_err(e)?;
        plan.select(dusk, &self.q).map_err(e)?;
        let shape = plan.shape().clone();
        let scores = plan.scores().download().map_err(|x| x.to_string())?;
        let lists = plan.sel_indices().download().map_err(|x| x.to_string())?;
        let flags = plan.flags().download().map_err(|x| x.to_string())?;
        let hk = self.kv.num_kv_heads;
        let keep = self.case.options.keep();
        let terms = self.case.num_q_heads / hk * self.case.r;
        let (mut rows, mut worst) = (0, 0.0f64);
        'rows: for b in check_order(self.table.batch()) {
            for h in 0..hk {
                if rows == max_rows {
                    break 'rows;
                }
                let r = b * hk + h;
                let first = shape.item_indptr[b] as usize;
                let n = shape.item_indptr[b + 1] as usize - first;
                let base = first * hk + h * n;
                let got: Vec<f64> = scores[base..base + n].iter().map(|s| *s as f64).collect();
                let want = ds_row_scores(
                    &self.q_host,
                    &self.host_labels,
                    &self.calibration,
                    &self.kv,
                    &self.table,
                    self.case.num_q_heads,
                    b,
                    h,
                );
                compare_scores(r, "token", &got, &want, terms, &mut worst)?;
                let want_tokens: Vec<i32> = top_k_row(&got, shape.k_items[b] as usize, keep)
                    .into_iter()
                    .map(|t| t as i32)
                    .collect();
                let (lo, hi) = (
                    shape.sel_indptr[r] as usize,
                    shape.sel_indptr[r + 1] as usize,
                );
                if lists[lo..hi] != want_tokens[..] {
                    return Err(format!("row {r}: tokens differ from the sort-based top-k"));
                }
                if flags[r] != 0 {
                    return Err(format!("row {r} flagged"));
                }
                rows += 1;
            }
        }
        Ok(CheckReport {
            rows,
            max_score_error: worst,
        })
    }

    /// The harness's timings (`Device::time_calls`: graph replays over the rotation sets on
    /// a GPU) of the scoring, the top-k and both.
    pub fn time(&mut self, dusk: &Dusk) -> Result<SelectionTimes> {
        time_selection(dusk, &mut self.plans, &self.q)
    }
}

impl TimedSelection for DsPlan {
    fn score(&mut self, dusk: &Dusk, q: &Buffer<f16>) -> Result<()> {
        DsPlan::score(self, dusk, q)
    }
    fn top_k(&mut self, dusk: &Dusk) -> Result<()> {
        DsPlan::top_k(self, dusk)
    }
    fn select(&mut self, dusk: &Dusk, q: &Buffer<f16>) -> Result<()> {
        DsPlan::select(self, dusk, q)
    }
}
