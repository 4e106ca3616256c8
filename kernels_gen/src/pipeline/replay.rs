//! A decode loop on a device page table, checked: Quest, Double Sparsity or SparQ then
//! (optionally) top-p, or top-p over every token (Full), over group varlen attention, planned once by [`Pipeline::plan_device`] for the loop's
//! limits; sequences grow by one token a step (a new page from a shuffled free list when
//! the last one fills), each step's table, new tokens and query written into the same
//! device buffers, and [`PipelinePlan::decode_step`] (the append inside) run. Each step's
//! output, with everything the step writes poisoned first, is compared stage by stage with
//! the f64 reference of the same algorithm on that step's cache ([`super::reference`]),
//! its lists and budgets with a host-table plan of that step's table
//! ([`PipelinePlan::replan`], the INT4 copy and the selector's state rebuilt from the whole
//! cache), and, with `graph`, the step captured once as a CUDA graph and replayed each
//! step with the eager step, bit for bit. Run by the tests through the interpreter and by
//! `gpu-check pipeline`.

use super::builder::{Attend, Pipeline, PipelineBuilder, Prune, Select};
use super::ds::DsSelect;
use super::plan::{PipelinePlan, PipelineShape, StepLimits};
use super::reference::{self as pref, HostInputs, HostMix, HostPipeline, HostPolicy, HostSelect};
use super::sparq::SparqSelect;
use crate::cache::reference::append_tokens;
use crate::engines::CsrPages;
use crate::ops::Dusk;
use crate::paged::{KvShape, PageTable, TokenLists};
use crate::selectors::bench::Rng;
use crate::selectors::{Budget, DsCalibration, DsOptions, Keep, QuestOptions, SparqOptions};
use dusk_compiler::DType;
use dusk_runtime::Buffer;
use half::f16;
use std::sync::Arc;

/// The selector of a [`LoopCase`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LoopSelect {
    /// Quest with this budget (a sequence no longer than a token budget is attended
    /// densely).
    Quest(Budget),
    /// Every token: the pruner sees the whole context (Full + Twilight).
    Full,
    /// Double Sparsity with this budget over tokens, on 8 label channels spread over
    /// head_dim (`ds_channels`).
    Ds(Budget),
    /// SparQ keeping this budget (r = 8, a window of 8, its copy paged as the cache), with
    /// its output mix when no pruner follows.
    Sparq(Budget),
}

/// The options of a [`LoopSelect::Sparq`] case.
fn sparq_options(k: Budget) -> SparqOptions {
    SparqOptions { r: 8, k, window: 8 }
}

/// The label channels of a [`LoopSelect::Ds`] case: 8 spread over `head_dim`, the same for
/// every KV head.
pub fn ds_channels(head_dim: usize, num_kv_heads: usize) -> crate::error::Result<DsCalibration> {
    let head: Vec<usize> = (0..8).map(|i| i * head_dim / 8 + i % 3).collect();
    DsCalibration::from_channels(head_dim, &vec![head; num_kv_heads])
}

/// A decode loop to check.
#[derive(Clone, Debug, PartialEq)]
pub struct LoopCase {
    /// Tokens in each sequence before the first step (its prefill).
    pub lens: Vec<usize>,
    /// Decode steps (one new token per sequence each).
    pub steps: usize,
    pub num_kv_heads: usize,
    /// Query heads per KV head.
    pub group: usize,
    pub head_dim: usize,
    pub select: LoopSelect,
    /// Top-p after the selector, or the selector alone.
    pub top_p: Option<f64>,
    /// The plan's limit on a sequence's tokens (at least the longest at the end).
    pub max_tokens: usize,
    /// Capture the step once and replay it each step beside the eager step (a GPU).
    pub graph: bool,
    pub seed: u64,
}

impl Default for LoopCase {
    /// Four sequences for 4 steps, one crossing a page boundary at step 2 (31 -> 33), one
    /// at its first (48 -> 49), two under the budget of 48 tokens throughout (dense: 20 ->
    /// 24, 31 -> 35), 2 KV heads of 64 with groups of 4, Quest then top-p 0.9.
    fn default() -> Self {
        LoopCase {
            lens: vec![90, 31, 20, 48],
            steps: 4,
            num_kv_heads: 2,
            group: 4,
            head_dim: 64,
            select: LoopSelect::Quest(Budget::Tokens(48)),
            top_p: Some(0.9),
            max_tokens: 128,
            graph: false,
            seed: 0x5eed,
        }
    }
}

/// What [`check_loop`] compared.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LoopReport {
    pub steps: usize,
    /// Appends that started a new page.
    pub pages_started: usize,
    /// (sequence, KV head) rows attended densely, summed over the steps.
    pub dense_rows: usize,
    /// The largest relative error of an output against the reference's.
    pub max_error: f64,
    /// Steps whose graph replay equalled the eager step bit for bit.
    pub replays: usize,
}

/// Values on a grid (`scale` steps in `[-steps, steps]`): Quest's scores exact in f32.
fn grid(rng: &mut Rng, n: usize, steps: usize, scale: f32) -> Vec<f16> {
    (0..n)
        .map(|_| f16::from_f32((rng.below(2 * steps + 1) as f32 - steps as f32) * scale))
        .collect()
}

/// The pipeline a case runs.
pub fn case_pipeline(case: &LoopCase) -> crate::error::Result<Pipeline> {
    let b = PipelineBuilder::new().select(match case.select {
        LoopSelect::Quest(budget) => Select::Quest {
            budget,
            sink: false,
        },
        LoopSelect::Full => Select::Full,
        LoopSelect::Ds(budget) => Select::Plugin(Arc::new(DsSelect {
            calibration: ds_channels(case.head_dim, case.num_kv_heads)?,
            budget,
            options: DsOptions::default(),
        })),
        LoopSelect::Sparq(k) => Select::Plugin(Arc::new(SparqSelect {
            options: sparq_options(k),
            block_size: None,
        })),
    });
    let b = b.sparq_mix(matches!(case.select, LoopSelect::Sparq(_)) && case.top_p.is_none());
    let b = match case.top_p {
        Some(p) => b.prune(Prune::top_p(p)),
        None => b,
    };
    b.attend(Attend::GroupVarlen).build()
}

/// Device buffers a step reads, written in place each step (a graph holds their
/// addresses).
struct StepInputs {
    table: CsrPages,
    k_new: Buffer<f16>,
    v_new: Buffer<f16>,
    q: Buffer<f16>,
    out: Buffer<f16>,
    lse: Buffer<f32>,
}

/// `table`'s entries into `to` (its page list padded with page 0 to the capacity).
fn write_table(to: &mut CsrPages, table: &PageTable) -> Result<(), String> {
    let e = |x: dusk_runtime::RuntimeError| x.to_string();
    let mut pages = table.kv_page_indices.clone();
    pages.resize(to.kv_page_indices.len(), 0);
    to.kv_indptr.copy_from_host(&table.kv_indptr).map_err(e)?;
    to.kv_page_indices.copy_from_host(&pages).map_err(e)?;
    to.kv_last_page_len
        .copy_from_host(&table.kv_last_page_len)
        .map_err(e)
}

fn lists_of(ip: &Buffer<i32>, ix: &Buffer<i32>) -> Result<TokenLists, String> {
    let indptr = ip.download().map_err(|x| x.to_string())?;
    let mut indices = ix.download().map_err(|x| x.to_string())?;
    indices.truncate((*indptr.last().unwrap_or(&0)).clamp(0, indices.len() as i32) as usize);
    Ok(TokenLists { indptr, indices })
}

/// Runs `case`'s loop on `dusk`'s device and compares every step (see the module docs).
pub fn check_loop(dusk: &Dusk, case: &LoopCase) -> Result<LoopReport, String> {
    let e = |x: crate::DuskError| x.to_string();
    let r = |x: dusk_runtime::RuntimeError| x.to_string();
    let mut rng = Rng(case.seed);
    let (ps, d, hk) = (16, case.head_dim, case.num_kv_heads);
    let (batch, hq) = (case.lens.len(), case.num_kv_heads * case.group);
    let final_lens: Vec<usize> = case.lens.iter().map(|n| n + case.steps).collect();
    if final_lens.iter().any(|n| *n > case.max_tokens) {
        return Err(format!(
            "max_tokens {} under {final_lens:?}",
            case.max_tokens
        ));
    }
    let kv = KvShape {
        num_pages: PageTable::pages_needed(&final_lens, ps) + 2,
        page_size: ps,
        num_kv_heads: hk,
        head_dim: d,
    };
    let mut free: Vec<i32> = (0..kv.num_pages as i32).collect();
    for i in (1..free.len()).rev() {
        free.swap(i, rng.below(i + 1));
    }
    let mut pages: Vec<Vec<i32>> = case
        .lens
        .iter()
        .map(|n| free.split_off(free.len() - n.div_ceil(ps)))
        .collect();
    let mut lens = case.lens.clone();
    let table_of = |lens: &[usize], pages: &[Vec<i32>]| {
        PageTable::from_lengths(lens, ps, pages.concat()).map_err(e)
    };
    let mut k_host = grid(&mut rng, kv.elements(), 32, 0.125);
    let mut v_host = grid(&mut rng, kv.elements(), 32, 0.125);
    let dev = dusk.device();
    let (mut k, mut v) = (
        dev.upload(&k_host).map_err(r)?,
        dev.upload(&v_host).map_err(r)?,
    );

    let pipeline = case_pipeline(case).map_err(e)?;
    let shape = PipelineShape {
        kv,
        num_q_heads: hq,
        dtype: DType::F16,
    };
    let limits = StepLimits {
        batch,
        max_tokens: case.max_tokens,
        append: true,
    };
    let mut plan = pipeline.plan_device(dusk, shape, limits).map_err(e)?;
    let start = table_of(&lens, &pages)?;
    plan.prefill(dusk, &k, Some(&v), &start).map_err(e)?;
    let mut host_plan: Option<PipelinePlan> = None;
    let rows = batch * hq;
    let mut io = StepInputs {
        table: CsrPages::alloc(dusk, batch, case.max_tokens.div_ceil(ps)).map_err(e)?,
        k_new: dev.alloc(batch * hk * d).map_err(r)?,
        v_new: dev.alloc(batch * hk * d).map_err(r)?,
        q: dev.alloc(rows * d).map_err(r)?,
        out: dev.alloc(rows * d).map_err(r)?,
        lse: dev.alloc(rows).map_err(r)?,
    };
    let graph = if case.graph {
        let StepInputs {
            table,
            k_new,
            v_new,
            q,
            out,
            lse,
        } = &mut io;
        let new = Some((&*k_new, &*v_new));
        Some(
            plan.capture_decode(dusk, table, new, q, &mut k, &mut v, out, lse)
                .map_err(e)?,
        )
    } else {
        None
    };
    let mut report = LoopReport::default();
    for step in 0..case.steps {
        // The table after this step's append: one more token a sequence.
        for b in 0..batch {
            if lens[b].is_multiple_of(ps) {
                pages[b].push(free.pop().ok_or("out of pages")?);
                report.pages_started += 1;
            }
            lens[b] += 1;
        }
        let table = table_of(&lens, &pages)?;
        let k_new = grid(&mut rng, batch * hk * d, 32, 0.125);
        let v_new = grid(&mut rng, batch * hk * d, 32, 0.125);
        let q = grid(&mut rng, rows * d, 8, 0.25);
        append_tokens(&mut k_host, &mut v_host, &kv, &table, &k_new, &v_new);
        write_table(&mut io.table, &table)?;
        io.k_new.copy_from_host(&k_new).map_err(r)?;
        io.v_new.copy_from_host(&v_new).map_err(r)?;
        io.q.copy_from_host(&q).map_err(r)?;

        // The graph first, its append this step's.
        let replayed = match &graph {
            Some(g) => {
                plan.poison_outputs(dusk, 0xFF).map_err(e)?;
                dev.fill_bytes(&mut io.out, 0xFF).map_err(r)?;
                dev.fill_bytes(&mut io.lse, 0xFF).map_err(r)?;
                g.replay().map_err(r)?;
                Some((io.out.download().map_err(r)?, io.lse.download().map_err(r)?))
            }
            None => None,
        };
        // The eager step, stage by stage. After a replay the step's tokens are in already:
        // an append again would add SparQ's V twice (the other parts are rewritten alike).
        plan.poison_outputs(dusk, 0xFF).map_err(e)?;
        dev.fill_bytes(&mut io.out, 0xFF).map_err(r)?;
        dev.fill_bytes(&mut io.lse, 0xFF).map_err(r)?;
        let new = graph.is_none().then_some((&io.k_new, &io.v_new));
        plan.run_table(dusk, &io.table, new, &mut k, &mut v)
            .map_err(e)?;
        let got = pref::run_stages(dusk, &mut plan, &io.q, &k, &v, &mut io.out, &mut io.lse)
            .map_err(e)?;
        if let Some((out, lse)) = replayed {
            let eager: Vec<u16> = got
                .out
                .iter()
                .map(|x| f16::from_f32(*x).to_bits())
                .collect();
            let bits: Vec<u16> = out.iter().map(|x| x.to_bits()).collect();
            if bits != eager || lse != got.lse {
                return Err(format!(
                    "step {step}: the graph replay differs from the eager step"
                ));
            }
            report.replays += 1;
        }
        // The cache the append wrote is the host's.
        let k_dev = k.download().map_err(r)?;
        if k_dev
            .iter()
            .zip(&k_host)
            .any(|(a, b)| a.to_bits() != b.to_bits())
        {
            return Err(format!(
                "step {step}: the appended K differs from the host's"
            ));
        }
        // Against the reference on this step's cache.
        let (mut logits, mut v_mean) = (vec![], vec![]);
        let scores = match case.select {
            LoopSelect::Quest(_) => pref::quest_page_scores(&q, &k_host, &kv, &table, hq),
            LoopSelect::Full => vec![],
            LoopSelect::Ds(_) => {
                let cal = ds_channels(d, hk).map_err(e)?;
                pref::ds_token_scores(&q, &k_host, &kv, &table, hq, &cal)
            }
            LoopSelect::Sparq(_) => {
                let (scores, l) = pref::sparq_token_scores(&q, &k_host, &kv, &table, hq, 8);
                (logits, v_mean) = (l, pref::v_means(&v_host, &kv, &table));
                scores
            }
        };
        let inputs = HostInputs {
            q: &q,
            k: &k_host,
            v: &v_host,
            kv,
            num_q_heads: hq,
            table: &table,
        };
        let host = HostPipeline {
            select: match case.select {
                LoopSelect::Quest(budget) => HostSelect::Pages {
                    scores: &scores,
                    budget,
                    keep: QuestOptions { sink: false }.keep(),
                },
                LoopSelect::Full => HostSelect::Full,
                LoopSelect::Ds(budget) => HostSelect::Tokens {
                    scores: &scores,
                    budget,
                    keep: DsOptions::default().keep(),
                    mix: None,
                },
                LoopSelect::Sparq(budget) => HostSelect::Tokens {
                    scores: &scores,
                    budget,
                    keep: Keep {
                        sink: 0,
                        recent: sparq_options(budget).window,
                    },
                    mix: case.top_p.is_none().then_some(HostMix {
                        logits: &logits,
                        v_mean: &v_mean,
                    }),
                },
            },
            prune: case.top_p.map(HostPolicy::TopP).into_iter().collect(),
            bits: 4,
            dense_below: pipeline.dense_below(),
        };
        for c in pref::check(&host, &inputs, &got) {
            if !c.passed() {
                return Err(format!(
                    "step {step} (lengths {lens:?}): stage {} off by {} (tolerance {}): {:?}",
                    c.stage, c.error, c.tolerance, c.detail
                ));
            }
            if c.stage == "attend" {
                report.max_error = report.max_error.max(c.error);
            }
        }
        let dense = pref::dense_rows(&table, &kv, pipeline.dense_below());
        report.dense_rows += dense.iter().filter(|x| **x).count();
        // Against a plan of this step's table on the host, its state rebuilt from the cache.
        let mut hp = match host_plan.take() {
            Some(p) => p.replan(dusk, &table).map_err(e)?,
            None => pipeline.plan(dusk, shape, &table).map_err(e)?,
        };
        hp.prepare_kv(dusk, &k, &v).map_err(e)?;
        hp.step(dusk, &io.q, &k, &v, &mut io.out, &mut io.lse)
            .map_err(e)?;
        let budgets = plan.budgets().map_err(e)?;
        if budgets != hp.budgets().map_err(e)? {
            return Err(format!(
                "step {step}: budgets differ from the host table's plan"
            ));
        }
        if let (Some(want), Some(got)) = (hp.lists(), got.lists.as_ref()) {
            if lists_of(want.0, want.1)? != *got {
                return Err(format!(
                    "step {step}: lists differ from the host table's plan"
                ));
            }
        }
        host_plan = Some(hp);
        report.steps += 1;
    }
    Ok(report)
}
