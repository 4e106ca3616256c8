//! The attention operator's benchmark (Twilight's Figures 7 and 10): select, estimate,
//! prune and attend of one decode step (cache maintenance excluded), timed as a whole
//! (`PipelinePlan::time_stages`: the harness, each stage and the step captured in a CUDA
//! graph and replayed) with each stage's time beside it, at 32k tokens, batch 32 and 64,
//! GQA 32/8 (group varlen) and MHA 32/32 (head varlen), head_dim 128, pages of 16, INT4:
//! Quest (N/4) + Twilight's top-p (0.95), and Quest (N/4) alone.
//!
//! The inputs are the synthetic long-context batch (`dusk::kernels::synthetic`), made on
//! the device with the default layer of head profiles (`HeadProfile::layer`: four focused
//! heads, a peaked, two spread and a diffuse one, cycling over the query heads, as
//! Twilight's Figure 11 shows a real layer's), unchanged here: the budgets top-p keeps
//! come out of that data. With GQA groups of four, one group is focused heads and the next
//! mixes the others, so half of the KV heads' unions hold a diffuse head.
//!
//! The peers are FlashInfer's dense paged decode (`flashinfer`) and FlashInfer decoding
//! exactly the pages our Quest picked (`flashinfer-pages`), timed by
//! `benches/baselines/pipeline_peers.py` in the same command: `--pages-out DIR` writes our
//! selection per shape in the format of `dusk_bench::pages_file` (`--pages-only` stops
//! there), the peer script reads them (`--pages`), and `--peers` gives this command its
//! figures; each case then checks that the peer decoded the pages of the file we wrote and
//! that they are this run's selection. The peer decodes a random cache of the same shapes
//! (its time does not depend on the values).
//!
//! Each pipeline is also planned on a device page table (`Pipeline::plan_device`, sized for
//! the batch's longest sequence) and its decode step timed the same way: the sizing launch
//! and the step, then with the append of a token a sequence in front (the last, timed after
//! everything else of the shape: it writes into the cache). Its budgets must equal the
//! host-table plan's.
//!
//! `--sweep` also times, per shape, the search alone over the step's own candidates and
//! scores in other configurations than the default (the GQA default for these rows came
//! from it).

use crate::common::{case_json, copy_gbps, Common, PeerTime, Res};
use dusk::compiler::DType;
use dusk::kernels::engines::CsrPages;
use dusk::kernels::ops::Dusk;
use dusk::kernels::paged::TokenLists;
use dusk::kernels::pipeline::{
    Attend, Pipeline, PipelineBuilder, PipelinePlan, PipelineShape, Prune, Select, Stage,
    StepLimits,
};
use dusk::kernels::policies::top_p;
use dusk::kernels::prune::{ParamValues, PrunePlan};
use dusk::kernels::selectors::Budget;
use dusk::kernels::synthetic::{HeadProfile, SyntheticCache, SyntheticSpec};
use dusk::kernels::threshold::{self, SearchConfig};
use dusk::runtime::{Buffer, Measured};
use dusk_aot::search_tune::label;
use dusk_bench::pages_file::PageSelection;
use half::f16;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Top-p's threshold (Twilight's for LLaMA models).
const P: f64 = 0.95;
/// Quest's budget: a quarter of each sequence's pages.
const QUEST_FRACTION: f64 = 0.25;
const QUEST: Budget = Budget::Fraction(QUEST_FRACTION);
const HEAD_DIM: usize = 128;
const PAGE: usize = 16;
const BITS: usize = 4;

/// What the benchmark runs: shapes, where the pages go, the sweep.
pub struct BenchOptions<'a> {
    pub common: &'a Common,
    pub batch: &'a [usize],
    /// (query heads, KV heads).
    pub heads: &'a [(usize, usize)],
    pub context: usize,
    pub pages_out: Option<&'a Path>,
    pub pages_only: bool,
    pub sweep: bool,
    pub seed: u64,
}

/// One benchmark shape.
#[derive(Clone, Copy)]
struct Shape {
    batch: usize,
    hq: usize,
    hkv: usize,
    ctx: usize,
}

impl Shape {
    /// The peers' case name: `pipeline_b64_h32x32_ctx32768`.
    fn name(&self) -> String {
        format!(
            "pipeline_b{}_h{}x{}_ctx{}",
            self.batch, self.hq, self.hkv, self.ctx
        )
    }
    fn group(&self) -> usize {
        self.hq / self.hkv
    }
    /// Group varlen for GQA (one list per KV head, the group's union), head varlen for MHA.
    fn attend(&self) -> Attend {
        if self.group() == 1 {
            Attend::HeadVarlen
        } else {
            Attend::GroupVarlen
        }
    }
    fn spec(&self, seed: u64) -> SyntheticSpec {
        SyntheticSpec::new(
            vec![self.ctx; self.batch],
            self.hq,
            self.hkv,
            HEAD_DIM,
            PAGE,
            seed,
        )
    }
    fn json(&self) -> Value {
        json!({"batch": self.batch, "num_q_heads": self.hq, "num_kv_heads": self.hkv,
               "head_dim": HEAD_DIM, "page_size": PAGE, "context": self.ctx, "bits": BITS})
    }
    /// Bytes of K and V (f16) in the cache.
    fn kv_bytes(&self) -> f64 {
        2.0 * (self.batch * self.ctx * self.hkv * HEAD_DIM * 2) as f64
    }
    /// Bytes of Quest's state the selection reads: the min and max of K (f16) per page
    /// and KV head.
    fn quest_state_bytes(&self) -> f64 {
        let pages = self.batch * self.ctx.div_ceil(PAGE);
        (2 * pages * self.hkv * HEAD_DIM * 2) as f64
    }
    /// What each stage must move, so that each stage's time stands against its own floor:
    /// the selection Quest's state; the estimate each candidate's INT4 codes, scale, zero
    /// and position, and its scores written (one per query head of the group); the pruner
    /// those scores read back; attention K and V of the `kept` tokens of each list row.
    fn stage_bytes(&self, pruned: bool, kept: &[i32]) -> Vec<(Stage, f64)> {
        let kept: f64 = kept.iter().map(|b| *b as f64).sum();
        let mut bytes = vec![(Stage::Select, self.quest_state_bytes())];
        if pruned {
            let candidates = (self.batch * self.hkv) as f64 * (self.ctx as f64 * QUEST_FRACTION);
            let scores = candidates * self.group() as f64 * 4.0;
            let codes = candidates * (HEAD_DIM * BITS / 8 + 2 + 2 + 4) as f64;
            bytes.push((Stage::Estimate, codes + scores));
            bytes.push((Stage::Prune, scores));
        }
        bytes.push((Stage::Attend, kept * (2 * HEAD_DIM * 2) as f64));
        bytes
    }
}

/// The two compositions timed: Quest + top-p, and Quest alone.
fn pipelines(shape: &Shape) -> Res<Vec<(&'static str, Pipeline)>> {
    let quest = || {
        PipelineBuilder::new()
            .select(Select::Quest {
                budget: QUEST,
                sink: false,
            })
            .attend(shape.attend())
    };
    Ok(vec![
        ("quest_twilight", quest().prune(Prune::top_p(P)).build()?),
        ("quest", quest().build()?),
    ])
}

/// A planned, timed composition.
struct Timed {
    stages: Vec<(Stage, Measured)>,
    /// Tokens attention read per list row.
    budgets: Vec<i32>,
}

impl Timed {
    fn step(&self) -> &Measured {
        &self.stages.last().expect("the step is timed last").1
    }
    fn stages_json(&self) -> Value {
        let m: Map<String, Value> = self
            .stages
            .iter()
            .map(|(s, m)| (s.name().to_string(), json!(m.median_us())))
            .collect();
        Value::Object(m)
    }
    /// Each stage's rate on its own bytes (`Shape::stage_bytes`) as a fraction of the
    /// copy rate measured in the same run.
    fn stages_frac_of_copy(&self, bytes: &[(Stage, f64)], copy_gbps: f64) -> Value {
        let m: Map<String, Value> = self
            .stages
            .iter()
            .filter_map(|(s, m)| {
                let (_, b) = bytes.iter().find(|(t, _)| t == s)?;
                Some((
                    s.name().to_string(),
                    json!(b / (m.median_us() * 1e3) / copy_gbps),
                ))
            })
            .collect();
        Value::Object(m)
    }
    fn line(&self) -> String {
        let parts: Vec<String> = self
            .stages
            .iter()
            .map(|(s, m)| format!("{} {:.1}", s.name(), m.median_us()))
            .collect();
        let sum: f64 = self
            .stages
            .iter()
            .filter(|(s, _)| *s != Stage::Step)
            .map(|(_, m)| m.median_us())
            .sum();
        format!("{} us (stages sum {sum:.1})", parts.join(", "))
    }
}

/// The synthetic batch's step buffers: the output and LSE.
struct StepOut {
    out: Buffer<f16>,
    lse: Buffer<f32>,
}

/// Plans `pipeline` over the batch, fills its INT4 copy and Quest's state from K, and times
/// its stages and step.
fn time_pipeline(
    dusk: &Dusk,
    pipeline: &Pipeline,
    syn: &SyntheticCache,
    io: &mut StepOut,
) -> Res<(PipelinePlan, Timed)> {
    let mut plan = pipeline.plan(dusk, pipeline_shape(syn), &syn.table)?;
    plan.prepare(dusk, &syn.k)?;
    let stages = plan.time_stages(dusk, &syn.q, &syn.k, &syn.v, &mut io.out, &mut io.lse)?;
    let budgets = plan.budgets()?;
    Ok((plan, Timed { stages, budgets }))
}

/// `pipeline` on a device page table over the batch: its decode step (sizing launch and
/// step) and, with `append`, the step with the append in front (zero tokens written into
/// each sequence's last slot: call it last), graph-timed by the harness.
fn time_device(
    dusk: &Dusk,
    pipeline: &Pipeline,
    syn: &mut SyntheticCache,
    io: &mut StepOut,
    host_budgets: &[i32],
    append: bool,
) -> Res<Measured> {
    let dev = dusk.device();
    let t = &syn.table;
    let batch = t.batch();
    let longest = (0..batch).map(|b| t.seq_len(b, PAGE)).max().unwrap_or(1);
    let limits = StepLimits {
        batch,
        max_tokens: longest,
        append,
    };
    let mut plan = pipeline.plan_device(dusk, pipeline_shape(syn), limits)?;
    plan.prefill(dusk, &syn.k, None, t)?;
    let table = CsrPages {
        kv_indptr: dev.upload(&t.kv_indptr)?,
        kv_page_indices: dev.upload(&t.kv_page_indices)?,
        kv_last_page_len: dev.upload(&t.kv_last_page_len)?,
    };
    let zeros = dev.alloc::<f16>(batch * syn.kv.num_kv_heads * HEAD_DIM)?;
    let new = append.then_some((&zeros, &zeros));
    let (q, k, v) = (&syn.q, &mut syn.k, &mut syn.v);
    plan.decode_step(dusk, &table, new, q, k, v, &mut io.out, &mut io.lse)?;
    if !append && plan.budgets()? != host_budgets {
        return Err("the device table's budgets differ from the host table's".into());
    }
    Ok(dev.time_calls(1, |_| {
        plan.decode_step(dusk, &table, new, q, k, v, &mut io.out, &mut io.lse)
    })?)
}

/// `{mean, min, max}` of `xs`.
fn stats(xs: &[i32]) -> Value {
    let mean = xs.iter().map(|x| *x as f64).sum::<f64>() / xs.len().max(1) as f64;
    json!({"mean": mean, "min": xs.iter().min(), "max": xs.iter().max()})
}

/// The budgets of each kind of list row: for MHA a row is a query head (its profile's
/// kind), for GQA a KV head (the kinds of its group's heads, e.g.
/// `focused+focused+peaked+focused`).
fn budgets_by_kind(shape: &Shape, heads: &[HeadProfile], budgets: &[i32]) -> Value {
    let g = shape.group();
    let mut by: BTreeMap<String, Vec<i32>> = BTreeMap::new();
    for (r, b) in budgets.iter().enumerate() {
        let h = r % shape.hkv;
        let kind: Vec<&str> = heads[h * g..(h + 1) * g].iter().map(|p| p.kind()).collect();
        by.entry(kind.join("+")).or_default().push(*b);
    }
    Value::Object(by.into_iter().map(|(k, v)| (k, stats(&v))).collect())
}

/// Our selection as a pages file: each row's token positions (whole pages, ascending) as
/// page numbers within its sequence.
fn selection_pages(plan: &PipelinePlan, shape: &Shape) -> Res<PageSelection> {
    let s = plan.selector().ok_or("the plan has no selector")?;
    let indptr = s.sel_indptr().to_vec();
    let tokens = s.sel_indices().download()?;
    let mut page_indptr = vec![0i32];
    let mut pages = vec![];
    for w in indptr.windows(2) {
        for &pos in &tokens[w[0] as usize..w[1] as usize] {
            let p = pos / PAGE as i32;
            if pages.len() == *page_indptr.last().unwrap() as usize || pages.last() != Some(&p) {
                pages.push(p);
            }
        }
        page_indptr.push(pages.len() as i32);
    }
    let sel = PageSelection {
        num_q_heads: shape.hq,
        num_kv_heads: shape.hkv,
        page_size: PAGE,
        seq_lens: vec![shape.ctx; shape.batch],
        indptr: page_indptr,
        pages,
    };
    sel.validate()?;
    Ok(sel)
}

/// The pages file of `shape` in `dir`.
fn pages_path(dir: &Path, shape: &Shape) -> PathBuf {
    dir.join(format!("{}.pages", shape.name()))
}

/// The peer's case of `shape`, and whether it decoded the pages of a file equal to `ours`
/// (its `pages_source` names the file): recorded with the case, and printed when not.
fn peer_case<'p>(
    peers: Option<&'p Value>,
    shape: &Shape,
    ours: &PageSelection,
) -> Res<(Option<&'p Value>, Value)> {
    let Some(p) = peers else {
        return Ok((None, Value::Null));
    };
    let case = p["cases"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["case"] == shape.name()))
        .ok_or_else(|| format!("--peers: no case {}", shape.name()))?;
    let source = case["pages_source"].as_str().unwrap_or("");
    let check = match source.strip_prefix("file ") {
        Some(file) => {
            let equal = PageSelection::read(Path::new(file)).is_ok_and(|t| &t == ours);
            json!({"file": file, "equal_to_this_runs_selection": equal})
        }
        None => json!({"source": source, "equal_to_this_runs_selection": false}),
    };
    if check["equal_to_this_runs_selection"] != true {
        println!("  WARNING: the peer decoded other pages than this run's selection ({source})");
    }
    Ok((Some(case), check))
}

/// Runs the benchmark: every shape's batch, its selection's pages, the timed
/// compositions, the results with the peers'.
pub fn run(dusk: &Dusk, o: &BenchOptions) -> Res<()> {
    let dev = dusk.device();
    let copy = if o.pages_only { 0.0 } else { copy_gbps(dev)? };
    let peers = o.common.peers()?;
    let mut cases = vec![];
    for &batch in o.batch {
        for &(hq, hkv) in o.heads {
            let shape = Shape {
                batch,
                hq,
                hkv,
                ctx: o.context,
            };
            cases.extend(run_shape(dusk, o, &shape, peers.as_ref(), copy)?);
        }
    }
    if o.pages_only {
        return Ok(());
    }
    let extra = json!({
        "benchmark": "the attention operator (select, estimate, prune, attend; maintenance excluded), \
                      Twilight Figures 7 and 10",
        "inputs": "synthetic long-context batch (dusk::kernels::synthetic), seed in each case, the \
                   default layer of head profiles (HeadProfile::layer): focused (8, 16, 32, 64 \
                   planted tokens), peaked (scale 13), spread (9, 11), diffuse (6), cycling over \
                   the query heads",
        "pipelines": {"quest_twilight": format!("Quest (N/4) + top-p (p = {P}), INT4 estimate"),
                      "quest": "Quest (N/4) alone"},
        "bytes": "what the step must move: Quest's page state (min and max of K), the INT4 codes, \
                  scales and positions of Quest's candidates and their scores (written, then read), \
                  K and V of the tokens attention reads",
        "peers": {"flashinfer": "FlashInfer's dense paged decode over every page",
                  "flashinfer-pages": "FlashInfer decoding exactly our Quest's pages, one row per \
                                       (sequence, KV head) (pipeline_peers.py)"},
    });
    o.common
        .write_results(dev, copy, peers.as_ref(), extra, cases)
}

fn run_shape(
    dusk: &Dusk,
    o: &BenchOptions,
    shape: &Shape,
    peers: Option<&Value>,
    copy: f64,
) -> Res<Vec<Value>> {
    let dev = dusk.device();
    let spec = shape.spec(o.seed);
    let kv = spec.kv_shape();
    println!(
        "{}: {} x {} tokens, {}/{} heads, head_dim {HEAD_DIM}, pages of {PAGE}: K and V {:.2} GB, \
         Quest's state {:.2} GB, the INT4 copy {:.2} GB",
        shape.name(),
        shape.batch,
        shape.ctx,
        shape.hq,
        shape.hkv,
        shape.kv_bytes() / 1e9,
        shape.quest_state_bytes() / 1e9,
        (kv.rows() * (HEAD_DIM * BITS / 8 + 4)) as f64 / 1e9,
    );
    let mut syn = SyntheticCache::generate(dusk, &spec)?;
    let rows = shape.batch * shape.hq;
    let mut io = StepOut {
        out: dev.alloc::<f16>(rows * HEAD_DIM)?,
        lse: dev.alloc::<f32>(rows)?,
    };

    // The selection's pages: written for the peer, checked against what it decoded.
    let quest_only = &pipelines(shape)?[1].1;
    let mut plan = quest_only.plan(dusk, pipeline_shape(&syn), &syn.table)?;
    plan.prepare(dusk, &syn.k)?;
    plan.run_select(dusk, &syn.q)?;
    let ours = selection_pages(&plan, shape)?;
    drop(plan);
    if let Some(dir) = o.pages_out {
        std::fs::create_dir_all(dir).map_err(|e| format!("--pages-out {}: {e}", dir.display()))?;
        let path = pages_path(dir, shape);
        ours.write(&path)?;
        println!("  Quest's pages written to {}", path.display());
    }
    if o.pages_only {
        return Ok(vec![]);
    }
    let (peer, pages_check) = peer_case(peers, shape, &ours)?;

    let mut timed = BTreeMap::new();
    let mut sweep_result = Value::Null;
    let mut two_launches = BTreeMap::new();
    for (name, p) in pipelines(shape)? {
        let (mut plan, t) = time_pipeline(dusk, &p, &syn, &mut io)?;
        println!(
            "  {name:<15} budgets mean {:.0} min {} max {}; {}",
            t.budgets.iter().map(|b| *b as f64).sum::<f64>() / t.budgets.len() as f64,
            t.budgets.iter().min().unwrap_or(&0),
            t.budgets.iter().max().unwrap_or(&0),
            t.line()
        );
        if o.sweep && name == "quest_twilight" {
            sweep_result = sweep(dusk, shape, &plan)?;
        }
        two_launches.insert(name, time_two_launches(dusk, &mut plan, &syn, &mut io, &t)?);
        timed.insert(name, t);
    }
    // The same pipelines on a device page table, the appends last (they write the cache).
    let mut device = BTreeMap::new();
    for append in [false, true] {
        for (name, p) in pipelines(shape)? {
            let host = &timed[name];
            let m = time_device(dusk, &p, &mut syn, &mut io, &host.budgets, append)?;
            let (us, host_us) = (m.median_us(), host.step().median_us());
            let what = if append { ", with the append" } else { "" };
            println!(
                "  {name:<15} device table{what}: step {us:.1} us (host table {host_us:.1} us, \
                 {:.3}x)",
                us / host_us
            );
            let e = device
                .entry(name)
                .or_insert_with(|| json!({"host_step_us": host_us}));
            e[if append { "append_step_us" } else { "step_us" }] = json!(us);
        }
    }

    // The result cases: Quest + top-p against both peers, Quest alone against the pages.
    let mut out = vec![];
    for (name, peer_name, key) in [
        ("quest_twilight", "flashinfer", "flashinfer"),
        ("quest_twilight", "flashinfer-pages", "flashinfer_pages"),
        ("quest", "flashinfer-pages", "flashinfer_pages"),
    ] {
        let t = &timed[name];
        let stage_bytes = shape.stage_bytes(name == "quest_twilight", &t.budgets);
        let bytes: f64 = stage_bytes.iter().map(|(_, b)| b).sum();
        let peer_time = PeerTime::from_case(peer, key);
        let case = format!("{}_{name}_vs_{peer_name}", shape.name());
        out.push(case_json(
            &case,
            shape.json(),
            t.step(),
            peer_name,
            &peer_time,
            bytes,
            copy,
            json!({
                "pipeline": name,
                "stages_us": t.stages_json(),
                "stages_frac_of_copy_bw": t.stages_frac_of_copy(&stage_bytes, copy),
                "device_table": device[name],
                "budgets": stats(&t.budgets),
                "budgets_by_kind": budgets_by_kind(shape, &spec.heads, &t.budgets),
                "seed": o.seed,
                "pages": pages_check,
                "peer_pages_per_row_mean": peer.map(|c| c["pages_per_row_mean"].clone()),
                "two_launch_select": two_launches[name],
                "sweep": if name == "quest_twilight" && peer_name == "flashinfer" {
                    sweep_result.clone()
                } else {
                    Value::Null
                },
            }),
        ));
    }
    Ok(out)
}

/// The same plan with its selection in two launches (the score, then the top-k) where it
/// is fused by default (`PipelinePlan::fuse_selection`), its stages and step timed again:
/// `null` where the selector has no fused kernel for the shape. The per-head budgets must be
/// those of the one-launch selection (the same pages selected).
fn time_two_launches(
    dusk: &Dusk,
    plan: &mut PipelinePlan,
    syn: &SyntheticCache,
    io: &mut StepOut,
    fused: &Timed,
) -> Res<Value> {
    if !plan.selector().is_some_and(|s| s.is_fused()) {
        return Ok(Value::Null);
    }
    plan.fuse_selection(dusk, false)?;
    let stages = plan.time_stages(dusk, &syn.q, &syn.k, &syn.v, &mut io.out, &mut io.lse)?;
    let t = Timed {
        stages,
        budgets: plan.budgets()?,
    };
    if t.budgets != fused.budgets {
        return Err("the two-launch selection's budgets differ from the fused one's".into());
    }
    println!("    selection in two launches: {}", t.line());
    Ok(json!({"stages_us": t.stages_json(), "step_us": t.step().median_us()}))
}

/// The shapes a pipeline is planned for over the synthetic batch.
fn pipeline_shape(syn: &SyntheticCache) -> PipelineShape {
    PipelineShape {
        kv: syn.kv,
        num_q_heads: syn.spec.num_q_heads,
        dtype: DType::F16,
    }
}

/// The sweep of one shape: the search alone over the step's own candidates (Quest's) and
/// scores (`plan`'s, after its timed steps), in the default configuration and others, each
/// a plan of its own (`PrunePlan::with_config`) timed by the harness.
fn sweep(dusk: &Dusk, shape: &Shape, plan: &PipelinePlan) -> Res<Value> {
    let dev = dusk.device();
    let sel = plan.selector().ok_or("no selector")?;
    let indptr = sel.sel_indptr().to_vec();
    let nnz = *indptr.last().unwrap_or(&0) as usize;
    let cand = TokenLists {
        indices: sel.sel_indices().download()?[..nnz].to_vec(),
        indptr,
    };
    let scores = plan.scores().ok_or("no scores")?;
    let group = shape.group();
    let base = SearchConfig::for_rows(cand.max_row_len(), group);
    let mut configs = vec![base];
    if base.split_heads {
        // Split over the heads (GQA): a sleep of 200 ns or 1 us between the look-back's
        // reads of a window still waiting (the look-back's spinning held 15% of the split
        // search's instructions on the H100, issued beside other programs' work), on 2
        // warps, from `work`, and the group's heads searched by one program from `work`
        // (the default before the split).
        for backoff_ns in [200, 1000] {
            configs.push(SearchConfig { backoff_ns, ..base });
        }
        configs.push(SearchConfig {
            num_warps: 2,
            ..base
        });
        configs.push(SearchConfig {
            shared: false,
            num_warps: 4,
            ..base
        });
        configs.push(SearchConfig {
            split_heads: false,
            shared: false,
            num_warps: 4,
            ..base
        });
    } else if base.shared {
        // Staged in shared memory (MHA): on 4 warps, and streamed from `work`.
        configs.push(SearchConfig {
            num_warps: 4,
            ..base
        });
        configs.push(SearchConfig {
            shared: false,
            num_warps: 4,
            ..base
        });
    } else {
        // Streamed from `work` (GQA): the longer rows' configuration, recomputed weights,
        // 2 or 8 warps.
        let long = SearchConfig::for_rows(threshold::GQA_ROWS + 1, group);
        configs.push(long);
        configs.push(SearchConfig {
            num_warps: 4,
            ..long
        });
        configs.push(SearchConfig {
            num_warps: 2,
            ..base
        });
        configs.push(SearchConfig {
            num_warps: 8,
            ..base
        });
    }
    let scale = 1.0 / (HEAD_DIM as f32).sqrt();
    let params = [ParamValues::Uniform(P)];
    let mut tried = vec![];
    for (i, c) in configs.into_iter().enumerate() {
        let mut p = PrunePlan::with_config(dusk, &top_p::POLICY, &cand, c, scale, &params)?;
        let m = dev.time_calls(1, |_| p.run(dusk, scores))?;
        let default = if i == 0 { " (the default)" } else { "" };
        println!(
            "  search alone{default}, {}: {:.1} us",
            label(&c),
            m.median_us()
        );
        tried.push(json!({"config": label(&c), "default": i == 0, "us": m.median_us()}));
    }
    Ok(json!({ "search_configs": tried }))
}
