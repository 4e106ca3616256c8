//! `pipeline!` through the CPU interpreter: the declarations expand to the builder's calls
//! (the same pipeline as the builder gives, stock and user policies, chains, every
//! selector form), and a declared pipeline plans and runs a step equal to its reference.

use dusk::compiler::DType;
use dusk::kernels::paged::{KvShape, PageTable};
use dusk::kernels::pipeline::reference::{
    self as pref, HostInputs, HostPipeline, HostPolicy, HostSelect,
};
use dusk::kernels::pipeline::{Attend, PipelineBuilder, PipelineShape, Prune, Select};
use dusk::kernels::selectors::{Budget, QuestOptions, QUEST};
use dusk::runtime::Device;
use dusk::Dusk;
use half::f16;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// A user's policy: top-p with at least `min_k` tokens.
#[dusk::policy(target(mass = p))]
pub fn top_p_floor(
    mass: f32,
    count: i32,
    #[check(p > 0.0 && p <= 1.0)] p: f32,
    #[check(min_k >= 0)] min_k: i32,
) -> bool {
    mass >= p && count >= min_k
}

#[test]
fn declarations_expand_to_the_builders_pipelines() -> Result<(), Box<dyn std::error::Error>> {
    let p = dusk::pipeline! {
        select: Quest(budget = 0.25),
        prune: top_p(p = 0.95),
        attend: group_varlen,
    }?;
    let want = PipelineBuilder::new()
        .select(Select::Quest {
            budget: Budget::Fraction(0.25),
            sink: false,
        })
        .prune(Prune::top_p(0.95))
        .attend(Attend::GroupVarlen)
        .build()?;
    assert_eq!(p.to_string(), want.to_string());

    let chain = dusk::pipeline! {
        select: Quest(budget = 4096, sink = true),
        prune: [top_p(p = 0.9), top_p_floor(p = 0.8, min_k = 16)],
        prune: top_k(k = 64),
        attend: head_varlen,
        bits: 8,
        dense_below: 512,
    }?;
    assert_eq!(
        chain.to_string(),
        "select quest (Tokens(4096)) -> estimate (INT8) -> prune top_p(p = 0.9) -> estimate \
         (INT8) -> prune top_p_floor(p = 0.8, min_k = 16) -> estimate (INT8) -> prune \
         top_k(k = 64) -> attend head_varlen"
    );
    assert_eq!((chain.bits(), chain.dense_below()), (8, 512));

    let pages = dusk::pipeline! {
        select: Pages(selector = QUEST, budget = 0.5, sink = 1, recent = 2),
        attend: group_varlen,
    }?;
    assert_eq!(
        pages.to_string(),
        "select quest (Fraction(0.5)) -> attend group_varlen"
    );
    let full = dusk::pipeline! { select: Full, attend: dense }?;
    assert_eq!(full.to_string(), "select full -> attend dense");
    // What the compiler cannot see is the builder's error when the expression runs.
    let bad = dusk::pipeline! { select: Full, prune: top_p(p = 1.5), attend: group_varlen };
    assert!(bad.is_err());
    Ok(())
}

#[test]
fn a_declared_pipeline_runs_a_step_equal_to_its_reference() -> Result<(), Box<dyn std::error::Error>>
{
    let dusk = Dusk::new(Device::cpu())?;
    let dev = dusk.device();
    let mut rng = SmallRng::seed_from_u64(21);
    let kv = KvShape {
        num_pages: 40,
        page_size: 16,
        num_kv_heads: 2,
        head_dim: 64,
    };
    let table = PageTable::from_lengths(&[300, 190], 16, (0..31).rev().collect())?;
    let grid = |rng: &mut SmallRng, n: usize, steps: i32, s: f32| -> Vec<f16> {
        (0..n)
            .map(|_| f16::from_f32(rng.random_range(-steps..=steps) as f32 * s))
            .collect()
    };
    let q = grid(&mut rng, 2 * 8 * 64, 8, 0.25);
    let k = grid(&mut rng, kv.elements(), 32, 0.125);
    let v = grid(&mut rng, kv.elements(), 32, 0.125);
    let p = dusk::pipeline! {
        select: Quest(budget = 0.5),
        prune: top_p_floor(p = 0.9, min_k = 8),
        attend: group_varlen,
    }?;
    let shape = PipelineShape {
        kv,
        num_q_heads: 8,
        dtype: DType::F16,
    };
    let mut plan = p.plan(&dusk, shape, &table)?;
    let (qb, kb, vb) = (dev.upload(&q)?, dev.upload(&k)?, dev.upload(&v)?);
    plan.prepare(&dusk, &kb)?;
    plan.poison_outputs(&dusk, 0xFF)?;
    let mut out = dev.alloc::<f16>(q.len())?;
    let mut lse = dev.alloc::<f32>(16)?;
    dev.fill_bytes(&mut out, 0xFF)?;
    let got = pref::run_stages(&dusk, &mut plan, &qb, &kb, &vb, &mut out, &mut lse)?;
    let scores = pref::quest_page_scores(&q, &k, &kv, &table, 8);
    let floor = |mass: f64, count: usize| mass >= 0.9 && count >= 8;
    let host = HostPipeline {
        select: HostSelect::Pages {
            scores: &scores,
            budget: Budget::Fraction(0.5),
            keep: QuestOptions { sink: false }.keep(),
        },
        prune: vec![HostPolicy::Rule(&floor)],
        bits: 4,
        dense_below: 0,
    };
    let inputs = HostInputs {
        q: &q,
        k: &k,
        v: &v,
        kv,
        num_q_heads: 8,
        table: &table,
    };
    for c in pref::check(&host, &inputs, &got) {
        assert!(
            c.passed(),
            "{}: {} > {} ({:?})",
            c.stage,
            c.error,
            c.tolerance,
            c.detail
        );
    }
    assert!(plan.budgets()?.iter().all(|b| *b >= 8));
    Ok(())
}
