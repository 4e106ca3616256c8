//! The GPU check of pipelines (`dusk::kernels::pipeline`), run on the device machine:
//!
//! 1. Compositions on small shapes against their f64 reference, stage by stage
//!    (`pipeline::reference::check`), everything poisoned first: Full + top-p, Quest alone,
//!    Quest + top-p with a sequence under the budget (the dense fallback), top-k over MHA
//!    (head varlen), a chain of two pruners.
//! 2. A step captured in a CUDA graph, replayed with new queries written in place, against
//!    eager steps on the same queries (bit for bit) and the reference.
//! 3. Each stage's time in the step (`PipelinePlan::time_stages`: the harness, each stage
//!    captured in a graph over the plan's own buffers; the caches are far larger than the
//!    L2), at 32k tokens, GQA 32/8, head_dim 128: Quest (N/4) + top-p, Quest alone, and
//!    dense attention; with each row's budget after the pruner. K and V are uniform in
//!    [-1, 1) (a hash on the device), q uniform in `[-q_scale, q_scale]`: the larger
//!    `q_scale`, the more focused the attention and the fewer tokens top-p keeps.
//!
//!    `gpu-check pipeline [--check-only] [--batch 32,64] [--context 32768] [--q-scale 8]`

use crate::attention::{fill_kernel, random_device};
use crate::common::{Common, Res};
use clap::Args;
use dusk::compiler::DType;
use dusk::kernels::ops::Dusk;
use dusk::kernels::paged::{KvShape, PageTable};
use dusk::kernels::pipeline::reference::{
    self as pref, HostInputs, HostPipeline, HostPolicy, HostSelect,
};
use dusk::kernels::pipeline::{
    Attend, Pipeline, PipelineBuilder, PipelinePlan, PipelineShape, Prune, Select, Stage,
};
use dusk::kernels::selectors::{Budget, QuestOptions};
use dusk::runtime::{Buffer, Device};
use half::f16;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

/// `gpu-check pipeline`'s options.
#[derive(Args, Debug)]
pub struct PipelineArgs {
    #[command(flatten)]
    common: Common,
    /// Batch sizes of the timed shapes.
    #[arg(long, value_delimiter = ',', default_values_t = [32usize])]
    batch: Vec<usize>,
    /// Tokens per sequence of the timed shapes.
    #[arg(long, default_value_t = 32768)]
    context: usize,
    /// The timed shapes' queries are uniform in [-q_scale, q_scale].
    #[arg(long, default_value_t = 8.0)]
    q_scale: f32,
}

/// A pipeline and its reference's description.
struct Composition {
    name: &'static str,
    pipeline: Pipeline,
    prune: fn() -> Vec<HostPolicy<'static>>,
    /// Quest's budget (`None`: every token).
    quest: Option<Budget>,
}

fn quest(budget: Budget) -> Select {
    Select::Quest {
        budget,
        sink: false,
    }
}

fn compositions() -> Res<Vec<Composition>> {
    let b = || PipelineBuilder::new().attend(Attend::GroupVarlen);
    let quarter = Budget::Fraction(0.25);
    Ok(vec![
        Composition {
            name: "full + top_p(0.9)",
            pipeline: b().select(Select::Full).prune(Prune::top_p(0.9)).build()?,
            prune: || vec![HostPolicy::TopP(0.9)],
            quest: None,
        },
        Composition {
            name: "quest(N/4)",
            pipeline: b().select(quest(quarter)).build()?,
            prune: Vec::new,
            quest: Some(quarter),
        },
        Composition {
            name: "quest(256 tokens) + top_p(0.95), dense fallback",
            pipeline: b()
                .select(quest(Budget::Tokens(256)))
                .prune(Prune::top_p(0.95))
                .build()?,
            prune: || vec![HostPolicy::TopP(0.95)],
            quest: Some(Budget::Tokens(256)),
        },
        Composition {
            name: "quest(N/4) + top_p(0.95) + top_k(64)",
            pipeline: b()
                .select(quest(quarter))
                .prune(Prune::top_p(0.95))
                .prune(Prune::top_k(64))
                .build()?,
            prune: || vec![HostPolicy::TopP(0.95), HostPolicy::TopK(64)],
            quest: Some(quarter),
        },
    ])
}

/// Inputs on a grid (q of 1/4 in [-2, 2], K and V of 1/8 in [-4, 4]: Quest's scores exact).
struct HostCase {
    kv: KvShape,
    table: PageTable,
    num_q_heads: usize,
    q: Vec<f16>,
    k: Vec<f16>,
    v: Vec<f16>,
}

fn grid(rng: &mut SmallRng, n: usize, steps: i32, scale: f32) -> Vec<f16> {
    (0..n)
        .map(|_| f16::from_f32(rng.random_range(-steps..=steps) as f32 * scale))
        .collect()
}

impl HostCase {
    fn new(rng: &mut SmallRng, lens: &[usize], hkv: usize, group: usize) -> Res<HostCase> {
        let pages = PageTable::pages_needed(lens, 16);
        let kv = KvShape {
            num_pages: pages + 5,
            page_size: 16,
            num_kv_heads: hkv,
            head_dim: 128,
        };
        let mut ids: Vec<i32> = (0..kv.num_pages as i32).collect();
        ids.shuffle(rng);
        ids.truncate(pages);
        let num_q_heads = hkv * group;
        Ok(HostCase {
            table: PageTable::from_lengths(lens, 16, ids)?,
            q: grid(rng, lens.len() * num_q_heads * 128, 8, 0.25),
            k: grid(rng, kv.elements(), 32, 0.125),
            v: grid(rng, kv.elements(), 32, 0.125),
            kv,
            num_q_heads,
        })
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
}

/// Runs `plan` stage by stage (poisoned first) and checks every stage against the
/// reference; returns the largest output error.
fn check_plan(
    dusk: &Dusk,
    plan: &mut PipelinePlan,
    c: &HostCase,
    comp: &Composition,
    bufs: (&Buffer<f16>, &Buffer<f16>, &Buffer<f16>),
) -> Res<f64> {
    let dev = dusk.device();
    let mut out = dev.alloc::<f16>(c.q.len())?;
    let mut lse = dev.alloc::<f32>(c.q.len() / 128)?;
    plan.poison_outputs(dusk, 0xFF)?;
    dev.fill_bytes(&mut out, 0xFF)?;
    dev.fill_bytes(&mut lse, 0xFF)?;
    let got = pref::run_stages(dusk, plan, bufs.0, bufs.1, bufs.2, &mut out, &mut lse)?;
    let scores = comp
        .quest
        .map(|_| pref::quest_page_scores(&c.q, &c.k, &c.kv, &c.table, c.num_q_heads));
    let select = match (comp.quest, &scores) {
        (Some(budget), Some(s)) => HostSelect::Pages {
            scores: s,
            budget,
            keep: QuestOptions { sink: false }.keep(),
        },
        _ => HostSelect::Full,
    };
    let host = HostPipeline {
        select,
        prune: (comp.prune)(),
        bits: 4,
        dense_below: plan.pipeline().dense_below(),
    };
    let mut worst = 0.0f64;
    for s in pref::check(&host, &c.host(), &got) {
        if !s.passed() {
            return Err(format!(
                "{}: stage {} off by {} (tolerance {}): {:?}",
                comp.name, s.stage, s.error, s.tolerance, s.detail
            )
            .into());
        }
        if s.stage == "attend" {
            worst = worst.max(s.error);
        }
    }
    Ok(worst)
}

/// The compositions on small shapes, GQA 32/8 and MHA 8/8 (top-k, head varlen).
fn correctness(dusk: &Dusk, rng: &mut SmallRng) -> Res<()> {
    let dev = dusk.device();
    for (lens, hkv, group) in [
        (vec![3000usize, 120, 1500, 777], 8, 4),
        (vec![5000, 333], 2, 4),
    ] {
        let c = HostCase::new(rng, &lens, hkv, group)?;
        let (q, k, v) = (dev.upload(&c.q)?, dev.upload(&c.k)?, dev.upload(&c.v)?);
        for comp in compositions()? {
            let mut plan = comp.pipeline.plan(dusk, c.shape(), &c.table)?;
            plan.prepare(dusk, &k)?;
            let err = check_plan(dusk, &mut plan, &c, &comp, (&q, &k, &v))?;
            println!(
                "  {:<48} lens {lens:?} heads {}/{hkv}: every stage equal, output error {err:.1e}",
                comp.name,
                hkv * group
            );
        }
    }
    let c = HostCase::new(rng, &[2500, 900], 8, 1)?;
    let (q, k, v) = (dev.upload(&c.q)?, dev.upload(&c.k)?, dev.upload(&c.v)?);
    let comp = Composition {
        name: "quest(N/2) + top_k(32), head varlen (MHA)",
        pipeline: PipelineBuilder::new()
            .select(quest(Budget::Fraction(0.5)))
            .prune(Prune::top_k(32))
            .attend(Attend::HeadVarlen)
            .build()?,
        prune: || vec![HostPolicy::TopK(32)],
        quest: Some(Budget::Fraction(0.5)),
    };
    let mut plan = comp.pipeline.plan(dusk, c.shape(), &c.table)?;
    plan.prepare(dusk, &k)?;
    let err = check_plan(dusk, &mut plan, &c, &comp, (&q, &k, &v))?;
    println!(
        "  {:<48} lens [2500, 900] heads 8/8: every stage equal, output error {err:.1e}",
        comp.name
    );
    Ok(())
}

/// A captured step replayed with new queries against eager steps and the reference.
fn graph_replay(dusk: &Dusk, rng: &mut SmallRng) -> Res<()> {
    let dev = dusk.device();
    let mut c = HostCase::new(rng, &[4000, 200, 2600, 9000], 8, 4)?;
    let comp = &compositions()?[2];
    let (mut q, k, v) = (dev.upload(&c.q)?, dev.upload(&c.k)?, dev.upload(&c.v)?);
    let mut plan = comp.pipeline.plan(dusk, c.shape(), &c.table)?;
    plan.prepare(dusk, &k)?;
    let mut out = dev.alloc::<f16>(c.q.len())?;
    let mut lse = dev.alloc::<f32>(c.q.len() / 128)?;
    let graph = plan.capture(dusk, &q, &k, &v, &mut out, &mut lse)?;
    for round in 0..3 {
        c.q = grid(rng, c.q.len(), 8, 0.25);
        q.copy_from_host(&c.q)?;
        plan.poison_outputs(dusk, 0xFF)?;
        dev.fill_bytes(&mut out, 0xFF)?;
        dev.fill_bytes(&mut lse, 0xFF)?;
        graph.replay()?;
        let (replayed, replayed_lse) = (out.download()?, lse.download()?);
        plan.step(dusk, &q, &k, &v, &mut out, &mut lse)?;
        let (eager, eager_lse) = (out.download()?, lse.download()?);
        let bits = |x: &[f16]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        if bits(&replayed) != bits(&eager) || replayed_lse != eager_lse {
            return Err(format!("graph replay {round}: differs from the eager step").into());
        }
        let err = check_plan(dusk, &mut plan, &c, comp, (&q, &k, &v))?;
        println!(
            "  replay {round}: equal to the eager step bit for bit; reference error {err:.1e}"
        );
    }
    Ok(())
}

/// Each stage's time at the benchmark shape, for Quest + top-p, Quest and dense attention.
fn timings(dusk: &Dusk, args: &PipelineArgs, seed: u64) -> Res<()> {
    let dev = dusk.device();
    let fill = fill_kernel(dusk)?;
    let (hkv, group, d, ctx) = (8usize, 4usize, 128usize, args.context);
    let mut rng = SmallRng::seed_from_u64(seed);
    for &batch in &args.batch {
        let lens = vec![ctx; batch];
        let pages = PageTable::pages_needed(&lens, 16);
        let kv = KvShape {
            num_pages: pages,
            page_size: 16,
            num_kv_heads: hkv,
            head_dim: d,
        };
        let mut ids: Vec<i32> = (0..pages as i32).collect();
        ids.shuffle(&mut rng);
        let table = PageTable::from_lengths(&lens, 16, ids)?;
        let k = random_device(dusk, &fill, kv.elements(), seed as i64)?;
        let v = random_device(dusk, &fill, kv.elements(), seed as i64 ^ 0x5a5a)?;
        let s = args.q_scale;
        let qh: Vec<f16> = (0..batch * hkv * group * d)
            .map(|_| f16::from_f32(rng.random_range(-s..=s)))
            .collect();
        let q = dev.upload(&qh)?;
        let mut out = dev.alloc::<f16>(qh.len())?;
        let mut lse = dev.alloc::<f32>(qh.len() / d)?;
        let shape = PipelineShape {
            kv,
            num_q_heads: hkv * group,
            dtype: DType::F16,
        };
        let quarter = Budget::Fraction(0.25);
        let b = || PipelineBuilder::new().attend(Attend::GroupVarlen);
        let pipes = [
            (
                "quest(N/4) + top_p(0.95)",
                b().select(quest(quarter))
                    .prune(Prune::top_p(0.95))
                    .build()?,
            ),
            ("quest(N/4)", b().select(quest(quarter)).build()?),
            (
                "dense",
                PipelineBuilder::new()
                    .select(Select::Full)
                    .attend(Attend::Dense)
                    .build()?,
            ),
        ];
        println!(
            "batch {batch}, {ctx} tokens, GQA {}/{hkv}, head_dim {d}, q in [-{s}, {s}]:",
            hkv * group
        );
        for (name, p) in pipes {
            let mut plan = p.plan(dusk, shape, &table)?;
            plan.prepare(dusk, &k)?;
            let times = plan.time_stages(dusk, &q, &k, &v, &mut out, &mut lse)?;
            let budgets = plan.budgets()?;
            let mean = budgets.iter().map(|b| *b as f64).sum::<f64>() / budgets.len() as f64;
            let (lo, hi) = (
                budgets.iter().min().unwrap_or(&0),
                budgets.iter().max().unwrap_or(&0),
            );
            let parts: Vec<String> = times
                .iter()
                .map(|(st, m)| format!("{} {:.1} us ({})", st.name(), m.median_us(), m.timing))
                .collect();
            let sum: f64 = times
                .iter()
                .filter(|(st, _)| *st != Stage::Step)
                .map(|(_, m)| m.median_us())
                .sum();
            println!(
                "  {name:<26} budgets mean {mean:.0} min {lo} max {hi}; {}; stages sum {sum:.1} us",
                parts.join(", ")
            );
        }
    }
    Ok(())
}

pub fn run(args: &PipelineArgs) -> Res<()> {
    let dev = Device::best();
    println!("device: {}", dev.name());
    let dusk = Dusk::new(dev.clone())?;
    let seed = args.common.seed_or(0x919e);
    let mut rng = SmallRng::seed_from_u64(seed);
    println!("correctness (fresh random inputs, everything poisoned, stage by stage):");
    correctness(&dusk, &mut rng)?;
    if !dev.is_gpu() {
        println!("all checks passed (no GPU: no graph, no timings)");
        return Ok(());
    }
    println!("graph replay:");
    graph_replay(&dusk, &mut rng)?;
    if args.common.check_only {
        println!("all checks passed");
        return Ok(());
    }
    println!("each stage's time in the step (harness: graph replays):");
    timings(&dusk, args, seed)
}
