//! Pipelines through the CPU interpreter against their f64 reference
//! (`pipeline::reference`), stage by stage, on fresh random inputs with every intermediate
//! and output poisoned first: Full + top-p, Quest alone, Quest + top-p (with the dense
//! fallback of short sequences), a user's selector + top-p, top-k pruning (MHA, head
//! varlen), a chain of two pruners, a whole dense batch, Double Sparsity + top-p, SparQ with
//! its output mix (and SparQ + top-p without it), a decode step's append keeping DS's and
//! SparQ's state current. Then the device-list variants of
//! the estimator and the pruner on bad positions, the fallback's kernel on bad offsets (the
//! interpreter fails any access out of bounds), and the error paths.

use dusk_compiler::DType;
use dusk_kernels::cache::AppendPlan;
use dusk_kernels::ops::{Dusk, SpgemvPlan};
use dusk_kernels::paged::{KvShape, PageTable, TokenLists};
use dusk_kernels::pipeline::reference::{
    self as pref, GotStep, HostInputs, HostMix, HostPipeline, HostPolicy, HostSelect,
};
use dusk_kernels::pipeline::{
    Attend, DsSelect, Pipeline, PipelineBuilder, PipelinePlan, PipelineShape, Prune, Select,
    SelectFactory, SelectStage, SparqSelect,
};
use dusk_kernels::policies::top_p;
use dusk_kernels::prune::{ParamValues, PrunePlan};
use dusk_kernels::reference;
use dusk_kernels::selectors::{Budget, DsCalibration, DsOptions, Keep, QuestOptions, SparqOptions};
use dusk_runtime::{Buffer, Device};
use half::f16;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use std::sync::Arc;

#[path = "support/inputs.rs"]
mod inputs;
use inputs::*;

#[path = "support/centroid.rs"]
mod centroid;

/// A case's cache, table and inputs, on the host and uploaded.
struct Inputs {
    kv: KvShape,
    table: PageTable,
    num_q_heads: usize,
    q: Vec<f16>,
    k: Vec<f16>,
    v: Vec<f16>,
    qb: Buffer<f16>,
    kb: Buffer<f16>,
    vb: Buffer<f16>,
}

impl Inputs {
    fn new(dusk: &Dusk, seed: u64, lens: &[usize], hkv: usize, group: usize, d: usize) -> Inputs {
        let mut rng = SmallRng::seed_from_u64(seed);
        let ps = 16;
        let num_pages = PageTable::pages_needed(lens, ps) + 3;
        let kv = KvShape {
            num_pages,
            page_size: ps,
            num_kv_heads: hkv,
            head_dim: d,
        };
        let mut ids: Vec<i32> = (0..num_pages as i32).collect();
        ids.shuffle(&mut rng);
        ids.truncate(PageTable::pages_needed(lens, ps));
        let table = PageTable::from_lengths(lens, ps, ids).unwrap();
        let num_q_heads = hkv * group;
        let q = grid_values(&mut rng, lens.len() * num_q_heads * d, 8, 0.25);
        let k = grid_values(&mut rng, kv.elements(), 32, 0.125);
        let v = grid_values(&mut rng, kv.elements(), 32, 0.125);
        let dev = dusk.device();
        Inputs {
            qb: dev.upload(&q).unwrap(),
            kb: dev.upload(&k).unwrap(),
            vb: dev.upload(&v).unwrap(),
            kv,
            table,
            num_q_heads,
            q,
            k,
            v,
        }
    }

    fn shape(&self) -> PipelineShape {
        PipelineShape {
            kv: self.kv,
            num_q_heads: self.num_q_heads,
            dtype: DType::F16,
        }
    }

    fn host(&self) -> HostInputs<'_> {
        HostInputs {
            q: &self.q,
            k: &self.k,
            v: &self.v,
            kv: self.kv,
            num_q_heads: self.num_q_heads,
            table: &self.table,
        }
    }

    fn quest_scores(&self) -> Vec<f64> {
        pref::quest_page_scores(&self.q, &self.k, &self.kv, &self.table, self.num_q_heads)
    }

    /// The centroid selector's f64 page scores (each page's mean rounded to f16, as the
    /// state holds it).
    fn centroid_scores(&self) -> Vec<f64> {
        let (kv, t, d) = (&self.kv, &self.table, self.kv.head_dim);
        let (hk, group) = (kv.num_kv_heads, self.num_q_heads / kv.num_kv_heads);
        let mut out = vec![0.0; t.kv_page_indices.len() * hk];
        for b in 0..t.batch() {
            let first = t.kv_indptr[b] as usize;
            let n = t.kv_indptr[b + 1] as usize - first;
            for h in 0..hk {
                for j in 0..n {
                    let page = t.kv_page_indices[first + j] as usize;
                    let len = if j + 1 == n {
                        t.kv_last_page_len[b] as usize
                    } else {
                        kv.page_size
                    };
                    let mut s = 0.0;
                    for c in 0..d {
                        let mean: f64 = (0..len)
                            .map(|slot| self.k[kv.k_row(page, slot, h) * d + c].to_f64())
                            .sum::<f64>()
                            / len as f64;
                        let mean = f16::from_f64(mean).to_f64();
                        for g in 0..group {
                            let qr = ((b * hk + h) * group + g) * d;
                            s += self.q[qr + c].to_f64() * mean;
                        }
                    }
                    out[first * hk + h * n + j] = s;
                }
            }
        }
        out
    }
}

/// `lists` cut to its rows' total.
fn lists_of(indptr: &Buffer<i32>, indices: &Buffer<i32>) -> TokenLists {
    let indptr = indptr.download().unwrap();
    let mut indices = indices.download().unwrap();
    indices.truncate(*indptr.last().unwrap().max(&0) as usize);
    TokenLists { indptr, indices }
}

/// Runs `plan` stage by stage on `inp` (everything poisoned first; the INT4 copy and the
/// selector's state made from K first when `prepare`), downloading each stage's output;
/// then the same step in one call, which must give the same output.
fn run_staged(dusk: &Dusk, plan: &mut PipelinePlan, inp: &Inputs, prepare: bool) -> GotStep {
    let dev = dusk.device();
    let rows = inp.q.len() / inp.kv.head_dim;
    let mut out = dev.alloc::<f16>(inp.q.len()).unwrap();
    let mut lse = dev.alloc::<f32>(rows).unwrap();
    if prepare {
        plan.prepare_kv(dusk, &inp.kb, &inp.vb).unwrap();
    }
    plan.poison_outputs(dusk, 0xFF).unwrap();
    dev.fill_bytes(&mut out, 0xFF).unwrap();
    dev.fill_bytes(&mut lse, 0xFF).unwrap();
    let got = pref::run_stages(dusk, plan, &inp.qb, &inp.kb, &inp.vb, &mut out, &mut lse).unwrap();
    // Per-head budgets: each list row's length (a dense row's, its sequence's).
    let budgets = plan.budgets().unwrap();
    match &got.lists {
        Some(l) => {
            let want: Vec<i32> = (0..l.rows()).map(|r| l.row(r).len() as i32).collect();
            assert_eq!(budgets, want, "budgets");
        }
        None => assert_eq!(budgets.len(), inp.table.batch() * inp.kv.num_kv_heads),
    }
    // The whole step in one call: the same output, bit for bit.
    plan.poison_outputs(dusk, 0xFF).unwrap();
    dev.fill_bytes(&mut out, 0xFF).unwrap();
    dev.fill_bytes(&mut lse, 0xFF).unwrap();
    plan.step(dusk, &inp.qb, &inp.kb, &inp.vb, &mut out, &mut lse)
        .unwrap();
    let again: Vec<f32> = out.download().unwrap().iter().map(|x| x.to_f32()).collect();
    assert_eq!(
        again.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        got.out.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        "step against the stages run one by one"
    );
    got
}

/// Plans `pipeline` for `inp`, runs it, and checks every stage against `host`.
fn check_case(dusk: &Dusk, pipeline: &Pipeline, host: &HostPipeline, inp: &Inputs) -> PipelinePlan {
    let mut plan = pipeline.plan(dusk, inp.shape(), &inp.table).unwrap();
    let got = run_staged(dusk, &mut plan, inp, true);
    let checks = pref::check(host, &inp.host(), &got);
    for c in &checks {
        assert!(
            c.passed(),
            "{pipeline}: stage {} off by {} (tolerance {}): {:?}",
            c.stage,
            c.error,
            c.tolerance,
            c.detail
        );
    }
    let stages: Vec<&str> = checks.iter().map(|c| c.stage).collect();
    assert!(stages.contains(&"attend"), "{stages:?}");
    plan
}

fn quest(budget: Budget) -> Select {
    Select::Quest {
        budget,
        sink: false,
    }
}

/// Quest (`budget`) + top-p (0.9), group varlen attention: the composition most tests take.
fn quest_top_p(budget: Budget) -> Pipeline {
    PipelineBuilder::new()
        .select(quest(budget))
        .prune(Prune::top_p(0.9))
        .attend(Attend::GroupVarlen)
        .build()
        .unwrap()
}

/// [`quest_top_p`]'s reference, sequences under `dense_below` tokens attended densely.
fn quest_top_p_host(scores: &[f64], budget: Budget, dense_below: usize) -> HostPipeline<'_> {
    HostPipeline {
        select: quest_host(scores, budget),
        prune: vec![HostPolicy::TopP(0.9)],
        bits: 4,
        dense_below,
    }
}

fn quest_host(scores: &[f64], budget: Budget) -> HostSelect<'_> {
    HostSelect::Pages {
        scores,
        budget,
        keep: QuestOptions { sink: false }.keep(),
    }
}

#[test]
fn full_then_top_p_equals_the_reference() {
    let dusk = dusk();
    let inp = Inputs::new(&dusk, 1, &[300, 130, 77], 2, 4, 64);
    let p = PipelineBuilder::new()
        .select(Select::Full)
        .prune(Prune::top_p(0.9))
        .attend(Attend::GroupVarlen)
        .build()
        .unwrap();
    let host = HostPipeline {
        select: HostSelect::Full,
        prune: vec![HostPolicy::TopP(0.9)],
        bits: 4,
        dense_below: 0,
    };
    let plan = check_case(&dusk, &p, &host, &inp);
    assert!(!plan.is_dense() && !plan.has_fallback());
}

#[test]
fn full_then_top_p_on_gqa_rows_of_thousands_equals_the_reference() {
    // Rows of 6000 candidates for groups of four: the search split over the heads, each
    // head's row staged in its program's shared memory (`SearchConfig::for_rows` up to
    // `GQA_ROWS`), as Quest's N/4 of 32k are.
    let dusk = dusk();
    let inp = Inputs::new(&dusk, 25, &[6000, 500], 1, 4, 64);
    let p = PipelineBuilder::new()
        .select(Select::Full)
        .prune(Prune::top_p(0.9))
        .attend(Attend::GroupVarlen)
        .build()
        .unwrap();
    let cfg = dusk_kernels::threshold::SearchConfig::for_rows(6000, 4);
    assert!(cfg.stream && cfg.split_heads && cfg.shared && cfg.num_warps == 4);
    let host = HostPipeline {
        select: HostSelect::Full,
        prune: vec![HostPolicy::TopP(0.9)],
        bits: 4,
        dense_below: 0,
    };
    let plan = check_case(&dusk, &p, &host, &inp);
    assert_eq!(plan.pruners()[0].config(), cfg);
}

#[test]
fn quest_alone_equals_the_reference() {
    let dusk = dusk();
    let inp = Inputs::new(&dusk, 2, &[400, 250, 97], 2, 4, 128);
    let budget = Budget::Fraction(0.25);
    let p = PipelineBuilder::new()
        .select(quest(budget))
        .attend(Attend::GroupVarlen)
        .build()
        .unwrap();
    let scores = inp.quest_scores();
    let host = HostPipeline {
        select: quest_host(&scores, budget),
        prune: vec![],
        bits: 4,
        dense_below: 0,
    };
    check_case(&dusk, &p, &host, &inp);
}

#[test]
fn quest_then_top_p_with_dense_short_sequences_equals_the_reference() {
    let dusk = dusk();
    // A budget of 96 tokens: the sequence of 60 is attended densely, the others pruned.
    let inp = Inputs::new(&dusk, 3, &[420, 60, 260, 180], 2, 4, 128);
    let budget = Budget::Tokens(96);
    let p = quest_top_p(budget);
    assert_eq!(p.dense_below(), 96);
    let scores = inp.quest_scores();
    let host = quest_top_p_host(&scores, budget, 96);
    let plan = check_case(&dusk, &p, &host, &inp);
    assert!(plan.has_fallback());
    let budgets = plan.budgets().unwrap();
    assert_eq!(
        budgets[2..4],
        [60, 60],
        "the short sequence's rows: every token"
    );
    // Top-p kept fewer than Quest selected on the long ones.
    let sel = plan.candidate_indptr();
    assert!(
        (0..2).all(|r| budgets[r] < sel[r + 1] - sel[r]),
        "{budgets:?}"
    );
}

/// Quest's selection fused into one launch (`PipelinePlan::fuse_selection`: rows of 513 to
/// 2048 pages at head_dim 128: a plan's default) in a Quest + top-p step: equal to the
/// reference, staged and whole (the step runs the selection twice, so the arrivals' reset
/// is exercised), still fused after a replan; and in two launches, once asked, as well.
#[test]
fn fused_quest_selection_equals_the_reference() {
    let dusk = dusk();
    // 519 pages and 44: the long sequence's rows take the fused kernel's tile of 1024.
    let inp = Inputs::new(&dusk, 31, &[8300, 700], 1, 4, 128);
    let budget = Budget::Fraction(0.25);
    let p = quest_top_p(budget);
    let scores = inp.quest_scores();
    let host = quest_top_p_host(&scores, budget, 0);
    let mut plan = p.plan(&dusk, inp.shape(), &inp.table).unwrap();
    assert!(plan.selector().unwrap().is_fused(), "fused by default");
    for step in 0..3 {
        match step {
            1 => plan = plan.replan(&dusk, &inp.table).unwrap(),
            2 => {
                assert!(
                    plan.selector().unwrap().is_fused(),
                    "fused after the replan"
                );
                assert!(!plan.fuse_selection(&dusk, false).unwrap());
            }
            _ => {}
        }
        let got = run_staged(&dusk, &mut plan, &inp, step == 0);
        for c in pref::check(&host, &inp.host(), &got) {
            assert!(
                c.passed(),
                "stage {} off by {}: {:?}",
                c.stage,
                c.error,
                c.detail
            );
        }
    }
    assert!(
        !plan.selector().unwrap().is_fused(),
        "two launches once asked"
    );
}

#[test]
fn a_users_selector_then_top_p_equals_the_reference() {
    let dusk = dusk();
    let inp = Inputs::new(&dusk, 4, &[350, 200, 45], 2, 4, 64);
    let budget = Budget::Tokens(80);
    let keep = Keep { sink: 1, recent: 1 };
    let p = PipelineBuilder::new()
        .select(Select::Pages {
            selector: centroid::CENTROID,
            budget,
            keep,
        })
        .prune(Prune::top_p(0.85))
        .attend(Attend::GroupVarlen)
        .build()
        .unwrap();
    let scores = inp.centroid_scores();
    let host = HostPipeline {
        select: HostSelect::Pages {
            scores: &scores,
            budget,
            keep,
        },
        prune: vec![HostPolicy::TopP(0.85)],
        bits: 4,
        dense_below: 80,
    };
    check_case(&dusk, &p, &host, &inp);
}

#[test]
fn top_k_pruning_head_varlen_mha_equals_the_reference() {
    let dusk = dusk();
    let inp = Inputs::new(&dusk, 5, &[330, 150], 2, 1, 128);
    let budget = Budget::Fraction(0.5);
    let p = PipelineBuilder::new()
        .select(quest(budget))
        .prune(Prune::top_k(20))
        .attend(Attend::HeadVarlen)
        .build()
        .unwrap();
    let scores = inp.quest_scores();
    let host = HostPipeline {
        select: quest_host(&scores, budget),
        prune: vec![HostPolicy::TopK(20)],
        bits: 4,
        dense_below: 0,
    };
    let plan = check_case(&dusk, &p, &host, &inp);
    assert!(plan.budgets().unwrap().iter().all(|b| *b >= 20));
}

#[test]
fn a_chain_of_pruners_and_8_bit_codes_equal_the_reference() {
    let dusk = dusk();
    let inp = Inputs::new(&dusk, 6, &[300, 210], 2, 2, 64);
    let budget = Budget::Fraction(0.5);
    let p = PipelineBuilder::new()
        .select(quest(budget))
        .prune(Prune::top_p(0.95))
        .prune(Prune::top_k(24))
        .attend(Attend::GroupVarlen)
        .bits(8)
        .build()
        .unwrap();
    let scores = inp.quest_scores();
    let host = HostPipeline {
        select: quest_host(&scores, budget),
        prune: vec![HostPolicy::TopP(0.95), HostPolicy::TopK(24)],
        bits: 8,
        dense_below: 0,
    };
    check_case(&dusk, &p, &host, &inp);
}

#[test]
fn a_batch_of_short_sequences_and_full_alone_are_dense_attention() {
    let dusk = dusk();
    let inp = Inputs::new(&dusk, 7, &[50, 33, 64], 2, 4, 64);
    let budget = Budget::Tokens(64);
    let quest_tp = quest_top_p(budget);
    let full = PipelineBuilder::new()
        .select(Select::Full)
        .attend(Attend::Dense)
        .build()
        .unwrap();
    let scores = inp.quest_scores();
    for (p, host) in [
        (&quest_tp, quest_top_p_host(&scores, budget, 64)),
        (
            &full,
            HostPipeline {
                select: HostSelect::Full,
                prune: vec![],
                bits: 4,
                dense_below: 0,
            },
        ),
    ] {
        let plan = check_case(&dusk, p, &host, &inp);
        assert!(plan.is_dense(), "{p}");
        assert_eq!(plan.budgets().unwrap(), [50, 50, 33, 33, 64, 64]);
    }
}

#[test]
fn a_plan_follows_the_next_page_table_keeping_the_selector_state() {
    let dusk = dusk();
    let inp = Inputs::new(&dusk, 8, &[200, 120], 2, 4, 64);
    let budget = Budget::Fraction(0.5);
    let p = quest_top_p(budget);
    let mut plan = p.plan(&dusk, inp.shape(), &inp.table).unwrap();
    plan.prepare(&dusk, &inp.kb).unwrap();
    // The next step: one more token in each sequence (the cache already holds them).
    let mut table = inp.table.clone();
    for (b, l) in [201usize, 121].iter().enumerate() {
        table.kv_last_page_len[b] = (l - (l - 1) / 16 * 16) as i32;
    }
    assert_eq!(table.seq_len(0, 16), 201);
    let mut plan = plan.replan(&dusk, &table).unwrap();
    // Only the written pages' state is recomputed; the rest is kept from the first plan.
    let last = dusk_kernels::selectors::PageUpdates::last_pages(&dusk, &inp.kv, &table).unwrap();
    plan.update_selector(&dusk, &inp.kb, &last).unwrap();
    let next = Inputs { table, ..inp };
    let scores = next.quest_scores();
    let host = quest_top_p_host(&scores, budget, 0);
    let got = run_staged(&dusk, &mut plan, &next, false);
    // Half of 201 tokens: 7 pages, the last (always kept) of 9 tokens.
    assert_eq!(plan.candidate_indptr()[1], 6 * 16 + 9);
    let checks = pref::check(&host, &next.host(), &got);
    assert!(checks.iter().all(|c| c.passed()), "{checks:?}");
}

/// A plugin selector: every page of each sequence (a selector outside the built-in ones,
/// through the two traits).
struct EveryPage;

struct EveryPageStage {
    kv: KvShape,
    indptr: Vec<i32>,
    indices: Buffer<i32>,
    host: Vec<i32>,
}

impl SelectFactory for EveryPage {
    fn name(&self) -> &str {
        "every_page"
    }
    fn budget(&self) -> Budget {
        Budget::Fraction(1.0)
    }
    fn plan(
        &self,
        dusk: &Dusk,
        kv: KvShape,
        _num_q_heads: usize,
        table: &PageTable,
    ) -> dusk_kernels::Result<Box<dyn SelectStage>> {
        let all = TokenLists::all_tokens(table, kv.page_size, kv.num_kv_heads);
        Ok(Box::new(EveryPageStage {
            kv,
            indices: dusk.device().alloc(all.indices.len().max(1))?,
            indptr: all.indptr,
            host: all.indices,
        }))
    }
}

impl SelectStage for EveryPageStage {
    fn sel_indptr(&self) -> &[i32] {
        &self.indptr
    }
    fn sel_indices(&self) -> &Buffer<i32> {
        &self.indices
    }
    fn select(&mut self, _dusk: &Dusk, _q: &Buffer<f16>) -> dusk_kernels::Result<()> {
        Ok(self.indices.copy_from_host(&self.host)?)
    }
    fn update(
        &mut self,
        _dusk: &Dusk,
        _k: &Buffer<f16>,
        _updates: &dusk_kernels::selectors::PageUpdates,
    ) -> dusk_kernels::Result<()> {
        Ok(())
    }
    fn replan(
        self: Box<Self>,
        dusk: &Dusk,
        table: &PageTable,
    ) -> dusk_kernels::Result<Box<dyn SelectStage>> {
        EveryPage.plan(dusk, self.kv, 0, table)
    }
    fn poison_outputs(&mut self, dusk: &Dusk, byte: u8) -> dusk_kernels::Result<()> {
        Ok(dusk.device().fill_bytes(&mut self.indices, byte)?)
    }
}

#[test]
fn a_plugin_selector_then_top_p_equals_full_then_top_p() {
    let dusk = dusk();
    let inp = Inputs::new(&dusk, 9, &[180, 90], 2, 4, 64);
    let p = PipelineBuilder::new()
        .select(Select::Plugin(Arc::new(EveryPage)))
        .prune(Prune::top_p(0.9))
        .attend(Attend::GroupVarlen)
        .build()
        .unwrap();
    let host = HostPipeline {
        select: HostSelect::Full,
        prune: vec![HostPolicy::TopP(0.9)],
        bits: 4,
        dense_below: 0,
    };
    check_case(&dusk, &p, &host, &inp);
}

#[test]
fn device_lists_with_bad_positions_stay_in_bounds() {
    let dusk = dusk();
    let inp = Inputs::new(&dusk, 10, &[70, 40], 2, 4, 128);
    let (kv, t) = (inp.kv, &inp.table);
    let dev = dusk.device();
    // Rows of 5 positions, some outside their sequence (negative, past the last page, a
    // page beyond the sequence's), the others valid.
    let indptr = vec![0, 5, 10, 15, 20];
    let indices = vec![
        0,
        -7,
        69,
        1_000_000,
        12, //
        3,
        80,
        64,
        i32::MIN,
        69, //
        0,
        39,
        -1,
        47,
        16, //
        5,
        48,
        39,
        40,
        i32::MAX,
    ];
    let plan = SpgemvPlan::with_device_lists(&dusk, kv, 8, 4, t, &indptr).unwrap();
    let qk = dusk.quantize_k(&inp.kb, kv, 4).unwrap();
    let mut scores = dev.alloc::<f32>(plan.num_scores()).unwrap();
    dev.fill_bytes(&mut scores, 0xFF).unwrap();
    let ix = dev.upload(&indices).unwrap();
    plan.run_lists(&dusk, &inp.qb, &qk, &ix, &mut scores)
        .unwrap();
    let got = scores.download().unwrap();
    // Positions inside their sequence score as the reference says; the others are finite.
    let host_qk = reference::quantize(&inp.k, &kv, 4);
    for r in 0..4 {
        let n = t.seq_len(r / 2, 16) as i32;
        for j in 0..5 {
            let pos = indices[r * 5 + j];
            for g in 0..4 {
                let s = got[r * 5 * 4 + g * 5 + j];
                assert!(s.is_finite(), "row {r} position {pos}: {s}");
                if (0..n).contains(&pos) {
                    let one = TokenLists {
                        indptr: (0..=4).map(|x| if x > r { 1 } else { 0 }).collect(),
                        indices: vec![pos],
                    };
                    let want = reference::spgemv(&inp.q, 8, &host_qk, 4, &kv, t, &one)[g];
                    assert!(
                        (s as f64 - want).abs() <= 1e-3 * (1.0 + want.abs()),
                        "{s} {want}"
                    );
                }
            }
        }
    }
    // The pruner copies whatever positions it is given.
    let mut prune = PrunePlan::with_device_lists(
        &dusk,
        &top_p::POLICY,
        &indptr,
        4,
        0.1,
        &[ParamValues::Uniform(1.0)],
    )
    .unwrap();
    prune.run_lists(&dusk, &scores, &ix).unwrap();
    let kept = lists_of(prune.sel_indptr(), prune.sel_indices());
    assert_eq!(kept.indptr.len(), 5);
    // Too few positions, or a plan holding its own lists given device ones: errors.
    let short = dev.upload(&indices[..10]).unwrap();
    let e = plan.run_lists(&dusk, &inp.qb, &qk, &short, &mut scores);
    assert_eq!(arg_of(e.unwrap_err()), "cand_indices");
    let e = prune.run(&dusk, &scores);
    assert_eq!(arg_of(e.unwrap_err()), "cand_indices");
    let own = TokenLists::all_tokens(t, 16, 2);
    let own = SpgemvPlan::new(&dusk, kv, 8, 4, t, &own).unwrap();
    let e = own.run_lists(&dusk, &inp.qb, &qk, &ix, &mut scores);
    assert_eq!(arg_of(e.unwrap_err()), "cand_indices");
    // Row offsets that do not fit the table: rows, a row longer than its sequence.
    let e = SpgemvPlan::with_device_lists(&dusk, kv, 8, 4, t, &[0, 5, 10]);
    assert_eq!(arg_of(e.err().unwrap()), "cand_indptr");
    let e = SpgemvPlan::with_device_lists(&dusk, kv, 8, 4, t, &[0, 71, 72, 73, 74]);
    assert_eq!(arg_of(e.err().unwrap()), "cand_indptr");
    let e = PrunePlan::with_device_lists(&dusk, &top_p::POLICY, &[0, 3, 2], 4, 0.1, &[]);
    assert_eq!(arg_of(e.err().unwrap()), "cand");
}

#[test]
fn the_fallback_kernel_stays_in_bounds_on_bad_offsets() {
    use dusk_kernels::pipeline::fallback::dense_fallback_lists;
    let dusk = dusk();
    let dev = dusk.device();
    let k = dusk
        .load(dense_fallback_lists::build::<1024>().unwrap())
        .unwrap();
    // Three rows: pruned (offsets past the end, then backwards), dense (5), pruned.
    let pruned_indptr = dev.upload(&[0, 50, 2, 4]).unwrap();
    let pruned_indices = dev.upload(&[7, 8, 9, 10]).unwrap();
    let dense_len = dev.upload(&[-1, 5, -1]).unwrap();
    let sel_indptr = dev.alloc::<i32>(4).unwrap();
    let sel_indices = dev.alloc::<i32>(8).unwrap();
    dense_fallback_lists::launch::<1024>(
        dev,
        &k,
        [3, 1, 1],
        &pruned_indptr,
        &pruned_indices,
        &dense_len,
        &sel_indptr,
        &sel_indices,
        4,
        8,
    )
    .unwrap();
    // Row 0 clamps to [0, 4): 4 entries; row 1 dense: 5 (3 of them fit); row 2 clamps to
    // [2, 4): 2 entries, past the buffer (not written).
    assert_eq!(sel_indptr.download().unwrap(), [0, 4, 9, 11]);
    assert_eq!(sel_indices.download().unwrap(), [7, 8, 9, 10, 0, 1, 2, 3]);
}

#[test]
fn bad_compositions_and_arguments_are_typed_errors() {
    let dusk = dusk();
    let err = |b: PipelineBuilder| arg_of(b.build().err().unwrap());
    let base = || {
        PipelineBuilder::new()
            .select(quest(Budget::Fraction(0.25)))
            .attend(Attend::GroupVarlen)
    };
    assert_eq!(err(PipelineBuilder::new().attend(Attend::Dense)), "select");
    assert_eq!(err(PipelineBuilder::new().select(Select::Full)), "attend");
    assert_eq!(err(base().attend(Attend::Dense)), "attend");
    assert_eq!(
        err(PipelineBuilder::new()
            .select(Select::Full)
            .prune(Prune::top_p(0.9))
            .attend(Attend::Dense)),
        "attend"
    );
    assert_eq!(err(base().sparq_mix(true)), "sparq_mix");
    assert_eq!(err(base().bits(3)), "bits");
    assert_eq!(err(base().dtype(DType::BF16)), "dtype");
    assert_eq!(err(base().prune(Prune::top_p(1.5))), "params");
    assert_eq!(err(base().prune(Prune::top_k(0))), "params");
    assert_eq!(
        err(base().prune(Prune::new(&top_p::POLICY, vec![]))),
        "params"
    );
    assert_eq!(
        err(PipelineBuilder::new()
            .select(quest(Budget::Fraction(0.0)))
            .attend(Attend::GroupVarlen)),
        "budget"
    );

    let inp = Inputs::new(&dusk, 11, &[100, 40], 2, 4, 64);
    let p = base().prune(Prune::top_p(0.9)).build().unwrap();
    // Head varlen with GQA; query heads not a multiple of the KV heads; another dtype; an
    // empty sequence; a per-row parameter of the wrong length.
    let head = base().attend(Attend::HeadVarlen).build().unwrap();
    let e = head.plan(&dusk, inp.shape(), &inp.table).err().unwrap();
    assert_eq!(arg_of(e), "attend");
    let shape = PipelineShape {
        num_q_heads: 7,
        ..inp.shape()
    };
    assert_eq!(
        arg_of(p.plan(&dusk, shape, &inp.table).err().unwrap()),
        "num_q_heads"
    );
    let shape = PipelineShape {
        dtype: DType::BF16,
        ..inp.shape()
    };
    assert_eq!(
        arg_of(p.plan(&dusk, shape, &inp.table).err().unwrap()),
        "dtype"
    );
    let empty = PageTable::from_lengths(&[100, 0], 16, (0..7).collect()).unwrap();
    let e = p.plan(&dusk, inp.shape(), &empty).err().unwrap();
    assert_eq!(arg_of(e), "kv_indptr");
    let per_row = base()
        .prune(Prune::new(
            &top_p::POLICY,
            vec![ParamValues::PerRow(vec![0.9; 3])],
        ))
        .build()
        .unwrap();
    let e = per_row.plan(&dusk, inp.shape(), &inp.table).err().unwrap();
    assert_eq!(arg_of(e), "params");
    // A step given a query of the wrong length names it.
    let mut plan = p.plan(&dusk, inp.shape(), &inp.table).unwrap();
    let dev = dusk.device();
    let mut out = dev.alloc::<f16>(inp.q.len()).unwrap();
    let mut lse = dev.alloc::<f32>(16).unwrap();
    let short = dev.upload(&inp.q[..64]).unwrap();
    let e = plan
        .step(&dusk, &short, &inp.kb, &inp.vb, &mut out, &mut lse)
        .unwrap_err();
    assert_eq!(arg_of(e), "q");
    // A graph needs a GPU.
    assert!(plan
        .capture(&dusk, &inp.qb, &inp.kb, &inp.vb, &mut out, &mut lse)
        .is_err());
    // The declaration reads back in order.
    let chain = base()
        .prune(Prune::top_p(0.95))
        .prune(Prune::top_k(64))
        .build()
        .unwrap();
    assert_eq!(
        chain.to_string(),
        "select quest (Fraction(0.25)) -> estimate (INT4) -> prune top_p(p = 0.95) -> \
         estimate (INT4) -> prune top_k(k = 64) -> attend group_varlen"
    );
}

/// A calibration of `r` channels from the first `samples` query rows of `inp` and keys at
/// the same positions of sequence 0.
fn calibration(inp: &Inputs, r: usize) -> DsCalibration {
    let (d, hq, hkv) = (inp.kv.head_dim, inp.num_q_heads, inp.kv.num_kv_heads);
    let q = &inp.q[..hq * d];
    let page = inp.table.kv_page_indices[0] as usize;
    let k: Vec<f16> = (0..hkv)
        .flat_map(|h| {
            let row = inp.kv.k_row(page, 3, h) * d;
            inp.k[row..row + d].to_vec()
        })
        .collect();
    DsCalibration::calibrate(q, &k, hq, hkv, d, r).unwrap()
}

fn plugin(s: impl SelectFactory + 'static) -> Select {
    Select::Plugin(Arc::new(s))
}

#[test]
fn double_sparsity_then_top_p_equals_the_reference() {
    let dusk = dusk();
    // Grid values: DS's scores are exact in f32, its selection the reference's.
    let inp = Inputs::new(&dusk, 13, &[300, 90, 170], 2, 4, 64);
    let cal = calibration(&inp, 8);
    let (budget, options) = (Budget::Fraction(0.25), DsOptions { sink: 2, recent: 8 });
    let ds = DsSelect {
        calibration: cal.clone(),
        budget,
        options,
    };
    let scores = pref::ds_token_scores(&inp.q, &inp.k, &inp.kv, &inp.table, inp.num_q_heads, &cal);
    for prune in [vec![], vec![0.9]] {
        let mut b = PipelineBuilder::new().select(plugin(ds.clone()));
        for p in &prune {
            b = b.prune(Prune::top_p(*p));
        }
        let p = b.attend(Attend::GroupVarlen).build().unwrap();
        let host = HostPipeline {
            select: HostSelect::Tokens {
                scores: &scores,
                budget,
                keep: options.keep(),
                mix: None,
            },
            prune: prune.iter().map(|p| HostPolicy::TopP(*p)).collect(),
            bits: 4,
            dense_below: 0,
        };
        let plan = check_case(&dusk, &p, &host, &inp);
        // A quarter of 300 tokens (75), the sink and the window among them.
        assert_eq!(plan.candidate_indptr()[1], 75, "{p}");
    }
}

/// SparQ's host side for `inp`: its token scores, each query row's logits and the means
/// of V.
fn sparq_host(inp: &Inputs, r: usize) -> (Vec<f64>, Vec<Vec<f64>>, Vec<f64>) {
    let hq = inp.num_q_heads;
    let (scores, logits) = pref::sparq_token_scores(&inp.q, &inp.k, &inp.kv, &inp.table, hq, r);
    (scores, logits, pref::v_means(&inp.v, &inp.kv, &inp.table))
}

/// SparQ with its output mix and no pruner, on the host: its token scores, logits and means
/// of V (from [`sparq_host`]); sequences of at most `dense_below` tokens attended densely.
fn sparq_mixed<'a>(
    options: SparqOptions,
    (scores, logits, v_mean): &'a (Vec<f64>, Vec<Vec<f64>>, Vec<f64>),
    dense_below: usize,
) -> HostPipeline<'a> {
    HostPipeline {
        select: HostSelect::Tokens {
            scores,
            budget: options.k,
            keep: Keep {
                sink: 0,
                recent: options.window,
            },
            mix: Some(HostMix { logits, v_mean }),
        },
        prune: vec![],
        bits: 4,
        dense_below,
    }
}

#[test]
fn sparq_with_its_output_mix_equals_the_reference() {
    let dusk = dusk();
    // A sequence of 40 tokens under k = 48: attended densely, alpha 1.
    let inp = Inputs::new(&dusk, 14, &[300, 40, 170], 2, 4, 64);
    let options = SparqOptions {
        r: 8,
        k: Budget::Tokens(48),
        window: 12,
    };
    let host_side = sparq_host(&inp, options.r);
    // The copy paged as the cache, and in blocks of 32 of its own.
    for block_size in [None, Some(32)] {
        let sparq = SparqSelect {
            options,
            block_size,
        };
        let p = PipelineBuilder::new()
            .select(plugin(sparq))
            .attend(Attend::GroupVarlen)
            .sparq_mix(true)
            .build()
            .unwrap();
        let plan = check_case(&dusk, &p, &sparq_mixed(options, &host_side, 48), &inp);
        assert_eq!(plan.budgets().unwrap(), [48, 48, 40, 40, 48, 48]);
    }
}

#[test]
fn sparq_then_top_p_without_the_mix_equals_the_reference() {
    let dusk = dusk();
    let inp = Inputs::new(&dusk, 15, &[260, 190], 2, 4, 64);
    let options = SparqOptions {
        r: 16,
        k: Budget::Fraction(0.5),
        window: 16,
    };
    let (scores, _, _) = sparq_host(&inp, options.r);
    let sparq = SparqSelect {
        options,
        block_size: Some(64),
    };
    let p = PipelineBuilder::new()
        .select(plugin(sparq))
        .prune(Prune::top_p(0.9))
        .attend(Attend::GroupVarlen)
        .build()
        .unwrap();
    let host = HostPipeline {
        select: HostSelect::Tokens {
            scores: &scores,
            budget: options.k,
            keep: Keep {
                sink: 0,
                recent: options.window,
            },
            mix: None,
        },
        prune: vec![HostPolicy::TopP(0.9)],
        bits: 4,
        dense_below: 0,
    };
    check_case(&dusk, &p, &host, &inp);
}

#[test]
fn sparq_follows_the_next_page_table_and_refuses_what_it_cannot_do() {
    let dusk = dusk();
    let inp = Inputs::new(&dusk, 16, &[150, 100], 2, 4, 64);
    let options = SparqOptions {
        r: 8,
        k: Budget::Tokens(40),
        window: 8,
    };
    let sparq = SparqSelect {
        options,
        block_size: Some(32),
    };
    let build = |prune: bool| {
        let b = PipelineBuilder::new().select(plugin(sparq));
        let b = if prune { b.prune(Prune::top_p(0.9)) } else { b };
        b.attend(Attend::GroupVarlen).sparq_mix(true).build()
    };
    // Its alpha weighs its own selection: no pruner after the mix.
    assert_eq!(arg_of(build(true).err().unwrap()), "sparq_mix");
    let mut plan = build(false)
        .unwrap()
        .plan(&dusk, inp.shape(), &inp.table)
        .unwrap();
    // Its state reads V: `prepare` (K alone) and page updates are refused.
    assert_eq!(arg_of(plan.prepare(&dusk, &inp.kb).unwrap_err()), "v");
    let pages = dusk_kernels::selectors::PageUpdates::all(&dusk, &inp.kv, &inp.table).unwrap();
    let e = plan.update_selector(&dusk, &inp.kb, &pages).unwrap_err();
    assert_eq!(arg_of(e), "updates");
    plan.prepare_kv(&dusk, &inp.kb, &inp.vb).unwrap();
    // The same table again: the state (its blocks) kept, the answer the reference's.
    let mut plan = plan.replan(&dusk, &inp.table).unwrap();
    let host_side = sparq_host(&inp, options.r);
    let got = run_staged(&dusk, &mut plan, &inp, false);
    let checks = pref::check(&sparq_mixed(options, &host_side, 40), &inp.host(), &got);
    assert!(checks.iter().all(|c| c.passed()), "{checks:?}");
    // Longer sequences (a new block for the first), the state rebuilt for them.
    let mut table = inp.table.clone();
    table.kv_last_page_len = vec![16, 12];
    let mut plan = plan.replan(&dusk, &table).unwrap();
    let next = Inputs { table, ..inp };
    assert_eq!(next.table.seq_len(0, 16), 160);
    let got = run_staged(&dusk, &mut plan, &next, true);
    let host_side = sparq_host(&next, options.r);
    let checks = pref::check(&sparq_mixed(options, &host_side, 40), &next.host(), &got);
    assert!(checks.iter().all(|c| c.passed()), "{checks:?}");
    let stages: Vec<&str> = checks.iter().map(|c| c.stage).collect();
    assert!(stages.contains(&"mix (alpha)"), "{stages:?}");
}
/// `inp` one decode step later: one new token a sequence (`k_new`, `v_new`, `[batch,
/// num_kv_heads, head_dim]`) in the slot after its last, in the same page (the lengths are
/// chosen so), written into the host cache and a fresh upload of it.
fn next_step(dusk: &Dusk, inp: &Inputs, k_new: &[f16], v_new: &[f16]) -> Inputs {
    let (kv, d) = (inp.kv, inp.kv.head_dim);
    let mut table = inp.table.clone();
    let (mut k, mut v) = (inp.k.clone(), inp.v.clone());
    for b in 0..table.batch() {
        let slot = table.kv_last_page_len[b] as usize;
        assert!(slot < kv.page_size, "sequence {b}: its last page is full");
        table.kv_last_page_len[b] += 1;
        let page = table.kv_page_indices[table.kv_indptr[b + 1] as usize - 1] as usize;
        for h in 0..kv.num_kv_heads {
            let (at, from) = (kv.k_row(page, slot, h) * d, (b * kv.num_kv_heads + h) * d);
            k[at..at + d].copy_from_slice(&k_new[from..from + d]);
            v[at..at + d].copy_from_slice(&v_new[from..from + d]);
        }
    }
    let dev = dusk.device();
    Inputs {
        kb: dev.upload(&k).unwrap(),
        vb: dev.upload(&v).unwrap(),
        qb: dev.upload(&inp.q).unwrap(),
        q: inp.q.clone(),
        k,
        v,
        table,
        ..*inp
    }
}

/// A decode step as an engine runs it: `pipeline` planned and prepared on `inp`, then
/// replanned for the next table and the step's tokens appended by the plan's own
/// [`AppendPlan`] (the cache, the INT4 copy and the selector's state in one launch); the
/// step then runs on the appended cache, which must equal the host's. Returns the plan
/// and the next step's inputs (their `kb`, `vb` the appended cache).
fn append_then_plan(
    dusk: &Dusk,
    pipeline: &Pipeline,
    inp: &Inputs,
    seed: u64,
) -> (PipelinePlan, Inputs) {
    let mut plan = pipeline.plan(dusk, inp.shape(), &inp.table).unwrap();
    plan.prepare_kv(dusk, &inp.kb, &inp.vb).unwrap();
    // The new keys point along their group's queries (2 or -2 a component, by the sign
    // of the group's sum): every selector must rank them first, from the state the
    // append wrote for them.
    let (hk, d) = (inp.kv.num_kv_heads, inp.kv.head_dim);
    let group = inp.num_q_heads / hk;
    let k_new: Vec<f16> = (0..inp.table.batch() * hk * d)
        .map(|i| {
            let (row, c) = (i / d, i % d);
            let sum: f32 = (0..group)
                .map(|g| inp.q[(row * group + g) * d + c].to_f32())
                .sum();
            f16::from_f32(if sum < 0.0 { -2.0 } else { 2.0 })
        })
        .collect();
    let mut rng = SmallRng::seed_from_u64(seed);
    let v_new = grid_values(&mut rng, k_new.len(), 32, 0.125);
    let mut next = next_step(dusk, inp, &k_new, &v_new);
    let mut plan = plan.replan(dusk, &next.table).unwrap();
    let append = AppendPlan::new(dusk, inp.kv, inp.table.batch(), plan.append_parts()).unwrap();
    let table = append.upload_table(dusk, &next.table).unwrap();
    let dev = dusk.device();
    let (mut k, mut v) = (dev.upload(&inp.k).unwrap(), dev.upload(&inp.v).unwrap());
    let (kn, vn) = (dev.upload(&k_new).unwrap(), dev.upload(&v_new).unwrap());
    append
        .run(dusk, &table, &kn, &vn, plan.append_targets(&mut k, &mut v))
        .unwrap();
    assert_eq!(k.download().unwrap(), next.k, "K after the append");
    assert_eq!(v.download().unwrap(), next.v, "V after the append");
    (next.kb, next.vb) = (k, v);
    (plan, next)
}

/// Every list row of `got` holds its sequence's newest token.
fn keeps_the_new_tokens(got: &GotStep, next: &Inputs) {
    let lists = got.lists.as_ref().expect("a sparse step");
    for r in 0..lists.rows() {
        let newest = next
            .table
            .seq_len(r / next.kv.num_kv_heads, next.kv.page_size) as i32
            - 1;
        assert!(
            lists.row(r).contains(&newest),
            "row {r}: {:?}",
            lists.row(r)
        );
    }
}

#[test]
fn a_decode_steps_append_keeps_ds_and_sparqs_state_current() {
    let dusk = dusk();
    // Lengths whose next token stays in its page: 47 -> 48 closes one of SparQ's runs of 16.
    let inp = Inputs::new(&dusk, 17, &[150, 47, 97], 2, 4, 64);
    let ds = DsSelect {
        calibration: calibration(&inp, 8),
        budget: Budget::Fraction(0.25),
        options: DsOptions { sink: 2, recent: 0 },
    };
    let p = PipelineBuilder::new()
        .select(plugin(ds.clone()))
        .prune(Prune::top_p(0.9))
        .attend(Attend::GroupVarlen)
        .build()
        .unwrap();
    assert_eq!(
        p.plan(&dusk, inp.shape(), &inp.table)
            .unwrap()
            .append_parts()
            .ds,
        Some(8)
    );
    let (mut plan, next) = append_then_plan(&dusk, &p, &inp, 1);
    let scores = pref::ds_token_scores(
        &next.q,
        &next.k,
        &next.kv,
        &next.table,
        next.num_q_heads,
        &ds.calibration,
    );
    let host = HostPipeline {
        select: HostSelect::Tokens {
            scores: &scores,
            budget: ds.budget,
            keep: ds.options.keep(),
            mix: None,
        },
        prune: vec![HostPolicy::TopP(0.9)],
        bits: 4,
        dense_below: 0,
    };
    let got = run_staged(&dusk, &mut plan, &next, false);
    let checks = pref::check(&host, &next.host(), &got);
    assert!(checks.iter().all(|c| c.passed()), "DS: {checks:?}");
    keeps_the_new_tokens(&got, &next);

    // No window: the new tokens are kept for their scores alone.
    let options = SparqOptions {
        r: 8,
        k: Budget::Tokens(40),
        window: 0,
    };
    for block_size in [None, Some(32)] {
        let p = PipelineBuilder::new()
            .select(plugin(SparqSelect {
                options,
                block_size,
            }))
            .attend(Attend::GroupVarlen)
            .sparq_mix(true)
            .build()
            .unwrap();
        let (mut plan, next) = append_then_plan(&dusk, &p, &inp, 2);
        assert!(plan.append_parts().sparq);
        let host_side = sparq_host(&next, options.r);
        let got = run_staged(&dusk, &mut plan, &next, false);
        let checks = pref::check(&sparq_mixed(options, &host_side, 40), &next.host(), &got);
        assert!(
            checks.iter().all(|c| c.passed()),
            "SparQ {block_size:?}: {checks:?}"
        );
        keeps_the_new_tokens(&got, &next);
    }
}

/// On a GPU (skipped without one; `gpu-check pipeline` runs the same on the device
/// machine): a step captured in a CUDA graph and replayed with new queries written in
/// place gives, bit for bit, what eager steps give on those queries, and the reference's
/// answer; the plan includes the dense fallback (a sequence under the budget).
#[test]
fn a_captured_step_replays_as_eager_steps_on_a_gpu() {
    let Ok(gpu) = Device::gpu(0) else {
        eprintln!("skipped: no GPU ({})", Device::gpu(0).err().unwrap());
        return;
    };
    let dusk = Dusk::new(gpu).unwrap();
    let mut inp = Inputs::new(&dusk, 12, &[2000, 700, 130, 3000], 8, 4, 128);
    let budget = Budget::Tokens(256);
    let p = quest_top_p(budget);
    let mut plan = p.plan(&dusk, inp.shape(), &inp.table).unwrap();
    assert!(plan.has_fallback());
    plan.prepare(&dusk, &inp.kb).unwrap();
    let dev = dusk.device();
    let mut out = dev.alloc::<f16>(inp.q.len()).unwrap();
    let mut lse = dev.alloc::<f32>(inp.q.len() / 128).unwrap();
    let graph = plan
        .capture(&dusk, &inp.qb, &inp.kb, &inp.vb, &mut out, &mut lse)
        .unwrap();
    let mut rng = SmallRng::seed_from_u64(13);
    for _ in 0..3 {
        inp.q = grid_values(&mut rng, inp.q.len(), 8, 0.25);
        inp.qb.copy_from_host(&inp.q).unwrap();
        plan.poison_outputs(&dusk, 0xFF).unwrap();
        dev.fill_bytes(&mut out, 0xFF).unwrap();
        graph.replay().unwrap();
        let replayed = (out.download().unwrap(), lse.download().unwrap());
        let got = run_staged(&dusk, &mut plan, &inp, false);
        let bits = |v: &[f16]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let eager: Vec<f16> = got.out.iter().map(|x| f16::from_f32(*x)).collect();
        assert_eq!(
            bits(&replayed.0),
            bits(&eager),
            "graph replay against eager"
        );
        assert_eq!(replayed.1, got.lse, "graph replay's lse against eager");
        let scores = inp.quest_scores();
        let host = quest_top_p_host(&scores, budget, 256);
        let checks = pref::check(&host, &inp.host(), &got);
        assert!(checks.iter().all(|c| c.passed()), "{checks:?}");
    }
}
