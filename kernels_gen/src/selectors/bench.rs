//! Quest at a benchmark shape, for the GPU check: random state (as many copies as the
//! timing harness rotates through), a page table of scattered pages, a query; a check
//! against the references on fresh inputs with the outputs poisoned first; the harness's
//! timings of the scoring, the top-k and the whole selection.
//!
//! ```
//! use dusk_kernels::ops::Dusk;
//! use dusk_kernels::selectors::bench::{QuestBench, QuestCase};
//! use dusk_runtime::Device;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dusk = Dusk::new(Device::cpu())?;
//! let case = QuestCase { batch: 2, context: 1000, num_q_heads: 8, num_kv_heads: 2, ..QuestCase::default() };
//! let mut bench = QuestBench::new(&dusk, &case, |_| {})?;
//! let report = bench.check(&dusk, 4)?; // the rows of the first and last sequences
//! assert_eq!(report.rows, 4);
//! let times = bench.time(&dusk)?;      // graph-timed on a GPU, wall clock here
//! assert!(times.select.median_us() > 0.0);
//! # Ok(()) }
//! ```

use super::quest::{QuestOptions, QuestPlan};
use super::reference::{quest_row_scores, top_k_row};
use super::selector::{Selector, SelectorState};
use super::topk::{Budget, TopKConfig};
use super::QUEST;
use crate::error::Result;
use crate::ops::Dusk;
use crate::paged::{KvShape, PageTable};
use dusk_runtime::{Buffer, Measured};
use half::f16;

/// A benchmark shape (DESIGN.md section 6: head_dim 128, pages of 16, budget N/4).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QuestCase {
    pub batch: usize,
    /// Tokens in every sequence.
    pub context: usize,
    pub num_q_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub page_size: usize,
    pub budget: Budget,
    pub sink: bool,
    pub seed: u64,
}

impl Default for QuestCase {
    /// Batch 32, 32k tokens, GQA 32/8, head_dim 128, pages of 16, a quarter of each
    /// sequence, the last page kept.
    fn default() -> Self {
        QuestCase {
            batch: 32,
            context: 32768,
            num_q_heads: 32,
            num_kv_heads: 8,
            head_dim: 128,
            page_size: 16,
            budget: Budget::Fraction(0.25),
            sink: false,
            seed: 0x9e57,
        }
    }
}

/// A small, fast generator (SplitMix64): benchmark inputs need no more (the cache append's
/// check and benchmark draw from it too).
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    pub(crate) fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    pub(crate) fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// What [`QuestBench::check`] compared.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckReport {
    /// Selection rows compared.
    pub rows: usize,
    /// The largest score error relative to the row's largest score magnitude.
    pub max_score_error: f64,
}

/// The harness's timings of one selector case (Quest's, Double Sparsity's).
#[derive(Clone, Debug)]
pub struct SelectionTimes {
    /// The score kernel alone.
    pub score: Measured,
    /// The top-k alone (over the last scores).
    pub top_k: Measured,
    /// Both: one `select`.
    pub select: Measured,
}

/// A selector plan a benchmark times in its parts: scores, then the top-k over them.
pub(crate) trait TimedSelection {
    fn score(&mut self, dusk: &Dusk, q: &Buffer<f16>) -> Result<()>;
    fn top_k(&mut self, dusk: &Dusk) -> Result<()>;
    fn select(&mut self, dusk: &Dusk, q: &Buffer<f16>) -> Result<()>;
}

impl TimedSelection for QuestPlan {
    fn score(&mut self, dusk: &Dusk, q: &Buffer<f16>) -> Result<()> {
        (**self).score(dusk, q)
    }
    fn top_k(&mut self, dusk: &Dusk) -> Result<()> {
        (**self).top_k(dusk)
    }
    fn select(&mut self, dusk: &Dusk, q: &Buffer<f16>) -> Result<()> {
        (**self).select(dusk, q)
    }
}

/// The harness's timings (`Device::time_calls`: graph replays over the rotation sets, one
/// plan a set, on a GPU) of the scoring, the top-k and both.
pub(crate) fn time_selection<P: TimedSelection>(
    dusk: &Dusk,
    plans: &mut [P],
    q: &Buffer<f16>,
) -> Result<SelectionTimes> {
    let dev = dusk.device();
    let sets = plans.len();
    let score = dev.time_calls(sets, |i| plans[i].score(dusk, q))?;
    let top_k = dev.time_calls(sets, |i| plans[i].top_k(dusk))?;
    let select = dev.time_calls(sets, |i| plans[i].select(dusk, q))?;
    Ok(SelectionTimes {
        score,
        top_k,
        select,
    })
}

/// The sequences whose rows a check compares, in order: the first, the last, the second,
/// the second to last, ... (the two ends of the page table first).
pub(crate) fn check_order(batch: usize) -> Vec<usize> {
    let mut order = vec![];
    for i in 0..batch {
        let b = if i % 2 == 0 { i / 2 } else { batch - 1 - i / 2 };
        if !order.contains(&b) {
            order.push(b);
        }
    }
    order
}

/// Compares row `r`'s scores (`got`, of items named `item` in the message) with the f64
/// reference `want`, relative to the row's largest reference magnitude: at most 1e-5 per
/// term of each score's sum (`terms` of them), summed as random rounding errors are
/// (`sqrt(terms)`). Raises `worst` to the largest error seen.
pub(crate) fn compare_scores(
    r: usize,
    item: &str,
    got: &[f64],
    want: &[f64],
    terms: usize,
    worst: &mut f64,
) -> std::result::Result<(), String> {
    let scale = want.iter().fold(1e-30f64, |m, w| m.max(w.abs()));
    for (j, (g, w)) in got.iter().zip(want).enumerate() {
        let err = (g - w).abs() / scale;
        *worst = worst.max(err);
        if err.is_nan() || err > 1e-5 * (terms as f64).sqrt() {
            return Err(format!("row {r} {item} {j}: score {g} against {w}"));
        }
    }
    Ok(())
}

/// Quest planned at a benchmark shape over random inputs.
pub struct QuestBench {
    case: QuestCase,
    kv: KvShape,
    table: PageTable,
    q_host: Vec<f16>,
    q: Buffer<f16>,
    /// One plan per rotation set, each over its own random state.
    plans: Vec<QuestPlan>,
    /// Set 0's state on the host, for the check.
    host_min: Vec<f16>,
    host_max: Vec<f16>,
}

impl QuestBench {
    /// Random state and query for `case` (pages of every sequence scattered over the
    /// cache), planned with `tune` changing the top-k's configuration.
    pub fn new(
        dusk: &Dusk,
        case: &QuestCase,
        tune: impl Fn(&mut TopKConfig),
    ) -> Result<QuestBench> {
        Self::with_selector(dusk, case, &QUEST, tune)
    }

    /// As [`QuestBench::new`], with `selector` (Quest's state and update, a score kernel of
    /// its own: [`super::quest::score_walking`] with another walk) in place of [`QUEST`].
    pub fn with_selector(
        dusk: &Dusk,
        case: &QuestCase,
        selector: &'static Selector,
        tune: impl Fn(&mut TopKConfig),
    ) -> Result<QuestBench> {
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
        let dev = dusk.device();
        let q_host: Vec<f16> = (0..case.batch * case.num_q_heads * case.head_dim)
            .map(|_| f16::from_f32(rng.unit() * 2.0))
            .collect();
        let q = dev.upload(&q_host)?;
        let state_len = num_pages * kv.num_kv_heads * kv.head_dim;
        let sets = dev.rotation_sets(Self::bytes_of_state(&kv));
        let options = QuestOptions { sink: case.sink };
        let (mut plans, mut host_min, mut host_max) = (vec![], vec![], vec![]);
        for set in 0..sets {
            let (mut lo, mut hi) = (Vec::with_capacity(state_len), Vec::with_capacity(state_len));
            for _ in 0..state_len {
                let (a, b) = (rng.unit(), rng.unit());
                lo.push(f16::from_f32(a.min(b) * 3.0));
                hi.push(f16::from_f32(a.max(b) * 3.0));
            }
            let mut state = SelectorState::new(dusk, selector, kv)?;
            state
                .f16_mut("page_min")
                .expect("Quest")
                .copy_from_host(&lo)?;
            state
                .f16_mut("page_max")
                .expect("Quest")
                .copy_from_host(&hi)?;
            let plan = QuestPlan::with_config(
                dusk,
                state,
                case.num_q_heads,
                &table,
                case.budget,
                options,
                &tune,
            )?;
            plans.push(plan);
            if set == 0 {
                (host_min, host_max) = (lo, hi);
            }
        }
        Ok(QuestBench {
            case: *case,
            kv,
            table,
            q_host,
            q,
            plans,
            host_min,
            host_max,
        })
    }

    /// Bytes of Quest's state for `kv` (min and max, f16).
    fn bytes_of_state(kv: &KvShape) -> usize {
        2 * kv.num_pages * kv.num_kv_heads * kv.head_dim * 2
    }

    pub fn case(&self) -> &QuestCase {
        &self.case
    }
    pub fn kv(&self) -> KvShape {
        self.kv
    }
    pub fn table(&self) -> &PageTable {
        &self.table
    }
    /// Rotation sets (each its own state and plan).
    pub fn sets(&self) -> usize {
        self.plans.len()
    }
    /// The plan of set `set`.
    pub fn plan(&self, set: usize) -> &QuestPlan {
        &self.plans[set]
    }

    /// Bytes the scoring must move: the min and max of every page of every sequence for
    /// each KV head, the query, the page table, and the scores written.
    pub fn score_bytes(&self) -> usize {
        let pages = self.table.kv_page_indices.len();
        let state = 2 * pages * self.kv.num_kv_heads * self.kv.head_dim * 2;
        let scores = pages * self.kv.num_kv_heads * 4;
        state + self.q_host.len() * 2 + pages * 4 + scores
    }

    /// Bytes the top-k must move: the scores read, the kept pages and token positions
    /// written.
    pub fn top_k_bytes(&self) -> usize {
        let shape = self.plans[0].shape();
        let scores = shape.num_scores() * 4;
        let items = *shape.sel_item_indptr.last().unwrap() as usize * 4;
        let tokens = *shape.sel_indptr.last().unwrap() as usize * 4;
        scores + items + tokens
    }

    /// Selects on set 0 with its outputs poisoned first and compares the rows of up to
    /// `max_rows` (the first sequence's KV heads, then the last's, ...) with the
    /// references: scores in f64 (relative to each row's largest, at most 1e-5 per
    /// term summed), pages equal to the sort-based top-k of the kernel's own scores (f32
    /// rounding may order near-ties differently from f64), token lists equal to those
    /// pages' tokens, no row flagged.
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
        let pages = plan.sel_pages().download().map_err(|x| x.to_string())?;
        let lists = plan.sel_indices().download().map_err(|x| x.to_string())?;
        let flags = plan.flags().download().map_err(|x| x.to_string())?;
        let hk = self.kv.num_kv_heads;
        let keep = QuestOptions {
            sink: self.case.sink,
        }
        .keep();
        let terms = self.case.num_q_heads / hk * self.kv.head_dim;
        let (mut rows, mut worst) = (0, 0.0f64);
        'rows: for b in check_order(self.table.batch()) {
            for h in 0..hk {
                if rows == max_rows {
                    break 'rows;
                }
                let r = b * hk + h;
                let first = self.table.kv_indptr[b] as usize;
                let n = self.table.kv_indptr[b + 1] as usize - first;
                let base = first * hk + h * n;
                let got: Vec<f64> = scores[base..base + n].iter().map(|s| *s as f64).collect();
                let want = quest_row_scores(
                    &self.q_host,
                    &self.host_min,
                    &self.host_max,
                    &self.kv,
                    &self.table,
                    self.case.num_q_heads,
                    b,
                    h,
                );
                compare_scores(r, "page", &got, &want, terms, &mut worst)?;
                let want_pages = top_k_row(&got, shape.k_items[b] as usize, keep);
                let (lo, hi) = (
                    shape.sel_item_indptr[r] as usize,
                    shape.sel_item_indptr[r + 1] as usize,
                );
                let got_pages: Vec<usize> = pages[lo..hi].iter().map(|p| *p as usize).collect();
                if got_pages != want_pages {
                    return Err(format!("row {r}: pages {got_pages:?}, want {want_pages:?}"));
                }
                let len = self.table.seq_len(b, self.kv.page_size) as i32;
                let ps = self.kv.page_size as i32;
                let want_tokens: Vec<i32> = want_pages
                    .iter()
                    .flat_map(|p| {
                        (*p as i32 * ps..((*p as i32 + 1) * ps).min(len)).collect::<Vec<_>>()
                    })
                    .collect();
                let (lo, hi) = (
                    shape.sel_indptr[r] as usize,
                    shape.sel_indptr[r + 1] as usize,
                );
                if lists[lo..hi] != want_tokens[..] {
                    return Err(format!("row {r}: token list differs from its pages'"));
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

    /// Whether every plan selects in one launch (the default where the selector has a
    /// fused kernel for the shape).
    pub fn is_fused(&self) -> bool {
        self.plans.iter().all(|p| p.is_fused())
    }

    /// Selects with the score and the top-k fused in one launch, or not
    /// ([`crate::selectors::SelectorPlan::fuse`]); returns whether the plans now do.
    pub fn fuse(&mut self, dusk: &Dusk, on: bool) -> Result<bool> {
        let mut fused = true;
        for p in &mut self.plans {
            fused &= p.fuse(dusk, on)?;
        }
        Ok(fused)
    }
}
