//! The GPU check of pipelines (`dusk::kernels::pipeline`), run on the device machine:
//!
//! 1. Compositions on small shapes against their f64 reference, stage by stage
//!    (`pipeline::reference::check`), everything poisoned first: Full + top-p, Quest alone,
//!    Quest + top-p with a sequence under the budget (the dense fallback), top-k over MHA
//!    (head varlen), a chain of two pruners.
//! 2. A step captured in a CUDA graph, replayed with new queries written in place, against
//!    eager steps on the same queries (bit for bit) and the reference; then decode loops
//!    on a device page table (`pipeline::replay`: GQA and MHA, the append inside the step,
//!    lengths growing across pages, dense rows): the step captured once and replayed each
//!    step with new queries, tokens and lengths, against the eager step (bit for bit), the
//!    reference and a host-table plan (`--replay-only`: these alone, for the sanitizers).
//! 3. The attention operator's benchmark (`pipeline_bench.rs`): on the synthetic
//!    long-context batch at 32k, batch 32 and 64, GQA 32/8 and MHA 32/32, Quest (N/4) +
//!    top-p (0.95) and Quest alone, the step graph-timed with each stage's time, beside
//!    FlashInfer's dense decode and FlashInfer decoding our Quest's pages (`--peers`, from
//!    `benches/baselines/pipeline_peers.py`, which reads the pages `--pages-out` wrote).
//!
//!    Each timed pipeline is also planned on a device page table (`plan_device`) and its
//!    decode step timed beside the host-table step, alone and with the append.
//!
//!    `gpu-check pipeline [--check-only] [--replay-only] [--pages-only] [--pages-out DIR] [--batch 32,64]
//!     [--heads 32x8,32x32] [--context 32768] [--sweep] [--peers peers.json] [--out pipeline.json]`

use crate::common::{Common, Res};
use crate::pipeline_bench::{self, BenchOptions};
use clap::Args;
use dusk::compiler::DType;
use dusk::kernels::ops::Dusk;
use dusk::kernels::paged::{KvShape, PageTable};
use dusk::kernels::pipeline::reference::{
    self as pref, HostInputs, HostPipeline, HostPolicy, HostSelect,
};
use dusk::kernels::pipeline::replay::{check_loop, LoopCase, LoopSelect};
use dusk::kernels::pipeline::{
    Attend, Pipeline, PipelineBuilder, PipelinePlan, PipelineShape, Prune, Select,
};
use dusk::kernels::selectors::{Budget, QuestOptions};
use dusk::runtime::{Buffer, Device};
use half::f16;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use std::path::PathBuf;

/// `gpu-check pipeline`'s options.
#[derive(Args, Debug)]
pub struct PipelineArgs {
    #[command(flatten)]
    common: Common,
    /// Batch sizes of the timed shapes.
    #[arg(long, value_delimiter = ',', default_values_t = [32usize, 64])]
    batch: Vec<usize>,
    /// Query and KV heads of the timed shapes, `QxKV`.
    #[arg(long, value_delimiter = ',', value_parser = heads, default_values = ["32x8", "32x32"])]
    heads: Vec<(usize, usize)>,
    /// Tokens per sequence of the timed shapes.
    #[arg(long, default_value_t = 32768)]
    context: usize,
    /// Write each timed shape's Quest selection (the pages file `pipeline_peers.py --pages`
    /// reads) into this folder.
    #[arg(long, value_name = "DIR")]
    pages_out: Option<PathBuf>,
    /// Only make each shape's batch and selection and write its pages (`--pages-out`): no
    /// checks, no timings.
    #[arg(long)]
    pages_only: bool,
    /// Also time the search alone in other configurations over each shape's own scores
    /// (see `pipeline_bench.rs`).
    #[arg(long)]
    sweep: bool,
    /// Only the decode loops on a device page table (what the sanitizers run over).
    #[arg(long)]
    replay_only: bool,
}

/// `32x8` as (32, 8).
fn heads(s: &str) -> Result<(usize, usize), String> {
    let bad = || format!("heads `{s}`: expected QxKV, e.g. 32x8");
    let (q, kv) = s.split_once('x').ok_or_else(bad)?;
    let (q, kv) = (
        q.parse().map_err(|_| bad())?,
        kv.parse().map_err(|_| bad())?,
    );
    if q == 0 || kv == 0 || q % kv != 0 {
        return Err(bad());
    }
    Ok((q, kv))
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
        // Rows of 7000 (every token): GQA's search split over the heads, each staged.
        (vec![7000, 333], 2, 4),
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
    // The benchmark's MHA composition: rows of 8192 candidates (the search's shared-memory
    // staging filled).
    let c = HostCase::new(rng, &[32768, 20000], 2, 1)?;
    let (q, k, v) = (dev.upload(&c.q)?, dev.upload(&c.k)?, dev.upload(&c.v)?);
    let quarter = Budget::Fraction(0.25);
    let comp = Composition {
        name: "quest(N/4) + top_p(0.95), head varlen (MHA)",
        pipeline: PipelineBuilder::new()
            .select(quest(quarter))
            .prune(Prune::top_p(0.95))
            .attend(Attend::HeadVarlen)
            .build()?,
        prune: || vec![HostPolicy::TopP(0.95)],
        quest: Some(quarter),
    };
    let mut plan = comp.pipeline.plan(dusk, c.shape(), &c.table)?;
    plan.prepare(dusk, &k)?;
    let err = check_plan(dusk, &mut plan, &c, &comp, (&q, &k, &v))?;
    println!(
        "  {:<48} lens [32768, 20000] heads 2/2: every stage equal, output error {err:.1e}",
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

/// Decode loops on a device page table, each step's graph replay against the eager step,
/// the reference and a host-table plan (`pipeline::replay::check_loop`).
fn decode_replay(dusk: &Dusk) -> Res<()> {
    let gqa = LoopCase {
        lens: vec![1200, 700, 130, 2000, 2047],
        steps: 4,
        num_kv_heads: 8,
        group: 4,
        head_dim: 128,
        select: LoopSelect::Quest(Budget::Tokens(256)),
        top_p: Some(0.9),
        max_tokens: 2100,
        graph: true,
        seed: 0x1d,
    };
    let mha = LoopCase {
        lens: vec![900, 100, 511, 1023],
        num_kv_heads: 4,
        group: 1,
        select: LoopSelect::Quest(Budget::Tokens(128)),
        max_tokens: 1100,
        seed: 0x2e,
        ..gqa.clone()
    };
    let quest_only = LoopCase {
        select: LoopSelect::Quest(Budget::Fraction(0.25)),
        top_p: None,
        seed: 0x3f,
        ..gqa.clone()
    };
    let full = LoopCase {
        select: LoopSelect::Full,
        seed: 0x40,
        ..gqa.clone()
    };
    let ds = LoopCase {
        select: LoopSelect::Ds(Budget::Fraction(0.25)),
        seed: 0x41,
        ..gqa.clone()
    };
    let sparq = LoopCase {
        select: LoopSelect::Sparq(Budget::Fraction(0.125)),
        top_p: None,
        seed: 0x42,
        ..gqa.clone()
    };
    for (name, case) in [
        ("GQA 32/8", gqa),
        ("MHA 4/4", mha),
        ("GQA Quest alone", quest_only),
        ("GQA Full + top-p", full),
        ("GQA DS + top-p", ds),
        ("GQA SparQ", sparq),
    ] {
        let r = check_loop(dusk, &case)?;
        println!(
            "  {name:<16} lens {:?} + {} steps: {} replays equal to the eager steps bit for bit, \
             {} pages started, {} dense rows, reference error {:.1e}, lists equal to host tables'",
            case.lens, case.steps, r.replays, r.pages_started, r.dense_rows, r.max_error
        );
        if r.replays != case.steps {
            return Err(format!("{name}: {} replays of {} steps", r.replays, case.steps).into());
        }
    }
    Ok(())
}

pub fn run(args: &PipelineArgs) -> Res<()> {
    let dev = Device::best();
    println!("device: {}", dev.name());
    let dusk = Dusk::new(dev.clone())?;
    let seed = args.common.seed_or(0x919e);
    let bench = BenchOptions {
        common: &args.common,
        batch: &args.batch,
        heads: &args.heads,
        context: args.context,
        pages_out: args.pages_out.as_deref(),
        pages_only: args.pages_only,
        sweep: args.sweep,
        seed,
    };
    if args.pages_only {
        return pipeline_bench::run(&dusk, &bench);
    }
    if args.replay_only {
        println!("decode loops on a device page table:");
        decode_replay(&dusk)?;
        println!("all checks passed");
        return Ok(());
    }
    let mut rng = SmallRng::seed_from_u64(seed);
    println!("correctness (fresh random inputs, everything poisoned, stage by stage):");
    correctness(&dusk, &mut rng)?;
    if dev.is_gpu() {
        println!("graph replay:");
        graph_replay(&dusk, &mut rng)?;
        println!("decode loops on a device page table:");
        decode_replay(&dusk)?;
    } else {
        println!("no GPU: no graph replay");
    }
    if args.common.check_only {
        println!("all checks passed");
        return Ok(());
    }
    // On the CPU (the interpreter, wall-clock timings) give small shapes.
    println!("the attention operator, each stage's time in the step:");
    pipeline_bench::run(&dusk, &bench)
}
