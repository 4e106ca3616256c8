//! The main job: every pipeline of `methods.rs` on one synthetic long-context batch
//! (`dusk::kernels::synthetic`), each checked against the f64 reference of its own
//! algorithm (`check.rs`), then stepped and timed; its per-head budgets, its output error
//! against dense attention and its time per step gathered as `MethodResult`s for the table
//! (`report.rs`) and the plot (`plot.rs`), and the claims measured on them (`claims.rs`).

use super::check::{compare, run_staged, shape, HostBatch, MethodCheck};
use super::claims::{self, Claim};
use super::methods::{methods, Method, QUARTER};
use super::plot::budget_plot;
use super::report::{kind_table, row_errors, table, MethodResult};
use dusk::kernels::pipeline::{DsSelect, SparqSelect};
use dusk::kernels::reference::{quantize, QuantizedRows};
use dusk::kernels::selectors::{Budget, DsCalibration, DsOptions, SparqOptions};
use dusk::kernels::synthetic::{reference, HeadProfile, SyntheticCache, SyntheticSpec};
use dusk::runtime::TimeConfig;
use dusk::Dusk;
use half::f16;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::error::Error;
use std::fmt;
use std::path::PathBuf;
use std::time::Instant;

type Res<T> = Result<T, Box<dyn Error>>;

/// Head dimension and page size of the batch (the paper's).
const HEAD_DIM: usize = 128;
const PAGE_SIZE: usize = 16;
/// Double Sparsity's label channels (head_dim / 8, the paper's) and calibration samples.
const DS_R: usize = 16;
const DS_SAMPLES: usize = 256;

/// What the job runs on, and where it writes.
#[derive(Clone, Debug)]
pub struct Options {
    pub batch: usize,
    /// Tokens per sequence.
    pub context: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub seed: u64,
    /// The first sequences of the batch, which the checks run on (the same values: every
    /// value of a synthetic batch is a function of the seed and its coordinates); when
    /// these are all of them, the checks run on the batch itself.
    pub check_seqs: usize,
    /// Where the plot, the table and DS's calibration go.
    pub out: PathBuf,
}

impl Options {
    /// The paper's shape on a GPU (32 sequences of 32k tokens, GQA 32/8); a smaller one
    /// through the interpreter (2 of 8192); the checks on the first 2 sequences.
    pub fn for_device(gpu: bool) -> Options {
        let (batch, context, q_heads, kv_heads, check_seqs) = if gpu {
            (32, 32768, 32, 8, 2)
        } else {
            (2, 8192, 32, 8, 2)
        };
        Options {
            batch,
            context,
            q_heads,
            kv_heads,
            seed: 1,
            check_seqs,
            out: PathBuf::from("target/twilight"),
        }
    }
}

/// The layer of head profiles the job runs: GQA group `h` (KV head `h`'s query heads) is
/// one kind of head, cycling through focused, peaked, spread and diffuse, so that a KV
/// head's budget (the union over its group: what attention reads) shows its kind. The
/// heads of a group still disagree: a focused group's heads plant their own tokens (8 and
/// 16 each), a background group's heads have query directions of their own (a spread
/// group's scales 11 and 9). The profiles are `HeadProfile`'s calibrated ones.
pub fn layer(q_heads: usize, group: usize) -> Vec<HeadProfile> {
    (0..q_heads)
        .map(|i| match ((i / group) % 4, i % 2) {
            (0, 0) => HeadProfile::focused(8),
            (0, _) => HeadProfile::focused(16),
            (1, _) => HeadProfile::background(13.0),
            (2, 0) => HeadProfile::background(11.0),
            (2, _) => HeadProfile::background(9.0),
            _ => HeadProfile::background(6.0),
        })
        .collect()
}

/// Double Sparsity's calibration from `samples` (query, key) pairs of `spec`'s batch, as a
/// deployment calibrates on sample activations: sample `i` pairs sequence `i % batch`'s
/// query at decode step `1 + i / batch` (steps after the one the job runs) with its key at
/// a position drawn from the seed, both from `synthetic::reference` (the values the
/// kernels write).
pub fn calibrate(spec: &SyntheticSpec, samples: usize) -> Res<DsCalibration> {
    let (d, hq, hk) = (spec.head_dim, spec.num_q_heads, spec.num_kv_heads);
    let plants = dusk::kernels::synthetic::Planted::draw(spec).by_token(spec.group());
    let mut rng = SmallRng::seed_from_u64(spec.seed);
    let (mut q, mut k) = (vec![], vec![]);
    for i in 0..samples {
        let (b, step) = (i % spec.batch(), 1 + (i / spec.batch()) as u32);
        let pos = rng.random_range(0..spec.seq_lens[b]);
        for qh in 0..hq {
            q.extend((0..d).map(|c| reference::query(spec, step, b, qh, c)));
        }
        for h in 0..hk {
            let plant = plants.get(&(b, h, pos)).copied();
            k.extend((0..d).map(|c| reference::key(spec, b, h, pos, c, plant)));
        }
    }
    Ok(DsCalibration::calibrate(&q, &k, hq, hk, d, DS_R)?)
}

/// What the job found.
pub struct Job {
    pub spec: SyntheticSpec,
    pub backend: String,
    /// Each KV head's kind of head (its group's).
    pub kinds: Vec<&'static str>,
    pub results: Vec<MethodResult>,
    pub checks: Vec<MethodCheck>,
    pub claims: Vec<Claim>,
    /// The sequences the checks ran on.
    pub check_seqs: usize,
    /// The files written: the calibration, the table, the plot.
    pub files: Vec<PathBuf>,
    /// How each step was timed (`graph`, `queued`, `cpu`), and why a graph was not used
    /// where one was tried and failed.
    pub timing: Vec<String>,
    /// Seconds spent making the batches; planning (loading kernels on first use: from the
    /// bundle, or compiled by LLVM); running the checks' stages; comparing with the
    /// references; stepping and timing.
    pub seconds: [f64; 5],
    /// The kernels the plans loaded, and how many of them the `Dusk`'s bundle holds: on a
    /// GPU those are its PTX, the rest compiled by LLVM; the interpreter runs every one.
    pub kernels: (usize, usize),
    pub on_gpu: bool,
}

impl Job {
    /// Every pipeline equal to its reference (the claims are reported, not part of it).
    pub fn passed(&self) -> bool {
        self.checks.iter().all(MethodCheck::passed)
    }
}

/// Runs the job: generates the batch, calibrates DS on it, then checks, steps and times
/// every pipeline, and writes the calibration, the table and the plot into `o.out`.
pub fn run(dusk: &Dusk, o: &Options) -> Res<Job> {
    let dev = dusk.device();
    let mut spec = SyntheticSpec::new(
        vec![o.context; o.batch],
        o.q_heads,
        o.kv_heads,
        HEAD_DIM,
        PAGE_SIZE,
        o.seed,
    );
    spec.validate()?;
    let group = o.q_heads / o.kv_heads;
    spec.heads = layer(o.q_heads, group);
    let start = Instant::now();
    let batch = SyntheticCache::generate(dusk, &spec)?;
    let check_cache = if o.check_seqs < o.batch {
        let mut sub = spec.clone();
        sub.seq_lens.truncate(o.check_seqs.max(1));
        Some(SyntheticCache::generate(dusk, &sub)?)
    } else {
        None
    };
    let checked = HostBatch::download(check_cache.as_ref().unwrap_or(&batch))?;
    let mut seconds = [start.elapsed().as_secs_f64(), 0.0, 0.0, 0.0, 0.0];

    std::fs::create_dir_all(&o.out)?;
    let calibration = calibrate(&spec, DS_SAMPLES)?;
    let cal_path = o.out.join("ds_calibration.json");
    calibration.save(&cal_path)?;
    let ds = DsSelect {
        calibration,
        budget: QUARTER,
        options: DsOptions::default(),
    };
    // SparQ as its paper runs it: r = head_dim / 8, k = N / 8, a local window of k / 4;
    // its transposed K in blocks of 256 tokens (the fastest layout measured).
    let sparq = SparqSelect {
        options: SparqOptions {
            r: HEAD_DIM / 8,
            k: Budget::Fraction(0.125),
            window: (o.context / 32).max(1),
        },
        block_size: Some(256),
    };
    let timing = TimeConfig {
        min_calls: 10,
        replays: 5,
        warmup: 1,
        graph: true,
        cpu_rounds: 1,
    };

    let mut queue = methods(&ds, sparq)?;
    let (mut results, mut staged, mut dense) = (vec![], vec![], None::<Vec<f64>>);
    let mut timed = vec![];
    let mut i = 0;
    while i < queue.len() {
        let m = &queue[i];
        let start = Instant::now();
        let mut plan = m.pipeline.plan(dusk, shape(&batch), &batch.table)?;
        plan.prepare_kv(dusk, &batch.k, &batch.v)?;
        let check_plan = match &check_cache {
            Some(c) => {
                let mut p = m.pipeline.plan(dusk, shape(c), &c.table)?;
                p.prepare_kv(dusk, &c.k, &c.v)?;
                Some((p, c))
            }
            None => None,
        };
        seconds[1] += start.elapsed().as_secs_f64();
        let start = Instant::now();
        staged.push(match check_plan {
            None => run_staged(dusk, &mut plan, &batch)?,
            Some((mut p, c)) => run_staged(dusk, &mut p, c)?,
        });
        seconds[2] += start.elapsed().as_secs_f64();
        let start = Instant::now();
        let mut out = dev.alloc::<f16>(batch.q.len())?;
        let mut lse = dev.alloc::<f32>(batch.q.len() / HEAD_DIM)?;
        let (q, k, v) = (&batch.q, &batch.k, &batch.v);
        let t =
            dev.time_calls_with(&timing, 1, |_| plan.step(dusk, q, k, v, &mut out, &mut lse))?;
        timed.push(match &t.graph_error {
            Some(e) => format!("{}: {} ({e})", m.name, t.timing.as_str()),
            None => t.timing.as_str().to_string(),
        });
        timed.dedup();
        let budgets: Vec<usize> = plan.budgets()?.iter().map(|b| *b as usize).collect();
        let got: Vec<f32> = out.download()?.iter().map(|x| x.to_f32()).collect();
        seconds[4] += start.elapsed().as_secs_f64();
        let reference = dense.get_or_insert_with(|| got.iter().map(|x| *x as f64).collect());
        results.push(MethodResult {
            name: m.name.clone(),
            heads: o.kv_heads,
            budgets,
            errors: row_errors(&got, reference, HEAD_DIM),
            step_us: Some(t.median_us()),
        });
        // Quest's top-k at Quest+Twilight's average budget, right after it.
        if m.name == "Quest+Twilight" {
            let mean = results.last().map_or(1.0, MethodResult::mean_budget);
            queue.insert(i + 1, Method::quest_at((mean.round() as usize).max(1))?);
        }
        i += 1;
    }

    let loaded = dusk.loaded_kernels();
    let bundled = loaded
        .iter()
        .filter(|k| dusk.bundle_entry(k.ir()).is_some())
        .count();

    // The references, one pipeline a thread (they read the host batch alone, and spread
    // their rows over the cores); the host quantizer's copy of K once for all of them.
    let start = Instant::now();
    let mut quantized: Vec<(u32, QuantizedRows)> = vec![];
    for bits in queue
        .iter()
        .zip(&staged)
        .filter_map(|(m, st)| st.quantized_bits(m))
    {
        if !quantized.iter().any(|(b, _)| *b == bits) {
            quantized.push((bits, quantize(&checked.k, &checked.kv, bits)));
        }
    }
    let copy_at = |m: &Method| {
        let bits = m.pipeline.bits();
        quantized.iter().find(|(b, _)| *b == bits).map(|(_, q)| q)
    };
    let checks = std::thread::scope(|s| {
        let threads: Vec<_> = (queue.iter().zip(&staged))
            .map(|(m, st)| {
                s.spawn(|| compare(m, st, &checked, copy_at(m)).map_err(|e| e.to_string()))
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().map_err(|_| "a check panicked".to_string())?)
            .collect::<Result<Vec<MethodCheck>, String>>()
    })?;
    seconds[3] = start.elapsed().as_secs_f64();
    let kinds: Vec<&'static str> = (0..o.kv_heads)
        .map(|h| spec.heads[h * group].kind())
        .collect();
    let find = |name: &str| results.iter().find(|r| r.name == name);
    let mut claims = vec![];
    for name in ["Full+Twilight", "Quest+Twilight"] {
        if let Some(r) = find(name) {
            claims.push(claims::adapts(r, &kinds));
        }
    }
    let matched = results.iter().position(|r| r.name == "Quest+Twilight");
    if let Some(j) = matched.filter(|j| j + 1 < results.len()) {
        claims.push(claims::no_worse(&results[j], &results[j + 1]));
    }

    let mut job = Job {
        backend: dev.name().to_string(),
        kinds,
        results,
        checks,
        claims,
        check_seqs: checked.table.batch(),
        files: vec![cal_path],
        seconds,
        kernels: (loaded.len(), bundled),
        on_gpu: dev.is_gpu(),
        timing: timed,
        spec,
    };
    let md = o.out.join("table.md");
    std::fs::write(&md, job.tables()?)?;
    let svg = o.out.join("budgets.svg");
    let title = format!("tokens per KV head, {} x {} tokens", o.batch, o.context);
    budget_plot(&svg, &title, &job.results)?;
    job.files.extend([md, svg]);
    Ok(job)
}

impl Job {
    /// The results table, the budgets by kind of head and the claims, in Markdown (what
    /// `table.md` holds).
    pub fn tables(&self) -> Res<String> {
        let s = &self.spec;
        let mut out = format!(
            "{} sequences of {} tokens, {} query heads over {} KV heads, head_dim {}, pages of \
             {}, seed {}; {}\n\n",
            s.batch(),
            s.seq_lens[0],
            s.num_q_heads,
            s.num_kv_heads,
            s.head_dim,
            s.page_size,
            s.seed,
            self.backend
        );
        out += &format!(
            "Budget: tokens attended per (sequence, KV head), the union over its GQA group. \
             Error: |o - o_hat| / |o| per query row against Full (dense)'s output. Step: time \
             per decode step (select, estimate, prune, attend), the median of the harness's \
             samples ({}: graph = CUDA-graph replays, cpu = wall-clock through the \
             interpreter).\n\n",
            self.timing.join("; ")
        );
        let heads: Vec<String> = (self.kinds.iter().enumerate())
            .map(|(h, k)| format!("{h} {k}"))
            .collect();
        out += &format!("KV heads (the plot's bars): {}.\n\n", heads.join(", "));
        out += &table(&self.results)?;
        out += "\nBy kind of KV head (its group's query heads): the mean budget, and the mean \
                error of its query rows.\n\n";
        out += &kind_table(&self.results, &self.kinds)?;
        out += "\n";
        for c in &self.claims {
            let verdict = if c.holds { "holds" } else { "DOES NOT HOLD" };
            out += &format!("- {}: {verdict}.\n", c.text);
        }
        Ok(out)
    }
}

impl Job {
    /// Where the job's time went, in one line.
    pub fn time_line(&self) -> String {
        let [made, planned, staged, compared, stepped] = self.seconds;
        let (n, b) = self.kernels;
        let loaded = if self.on_gpu {
            format!(
                "{n} kernels: {b} from the bundle, {} compiled by LLVM",
                n - b
            )
        } else {
            format!("{n} kernels, interpreted; the bundle holds {b}")
        };
        format!(
            "time: {made:.1} s making the batches, {planned:.1} s planning ({loaded}), \
             {staged:.1} s running the checks' stages, {compared:.1} s comparing with the \
             references, {stepped:.1} s stepping and timing"
        )
    }
}

impl fmt::Display for Job {
    /// The checks (one line per pipeline), the tables and claims, the files, the verdict.
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        writeln!(
            f,
            "checks: each pipeline against the f64 reference of its own algorithm, stage by \
             stage (error / tolerance), on the first {} sequence(s) of the batch:",
            self.check_seqs
        )?;
        for c in &self.checks {
            let stages: Vec<String> = c
                .stages
                .iter()
                .map(|s| format!("{} {:.1e}/{:.0e}", s.stage, s.error, s.tolerance))
                .collect();
            let verdict = if c.passed() { "PASS" } else { "FAIL" };
            writeln!(f, "  {verdict} {}: {}", c.method, stages.join(", "))?;
            for s in c.stages.iter().filter(|s| !s.passed()) {
                let detail = s.detail.as_deref().unwrap_or("no detail");
                writeln!(f, "    FAIL {}: {detail}", s.stage)?;
            }
        }
        writeln!(f)?;
        match self.tables() {
            Ok(t) => writeln!(f, "{t}")?,
            Err(e) => writeln!(f, "no table: {e}")?,
        }
        for p in &self.files {
            writeln!(f, "wrote {}", p.display())?;
        }
        writeln!(f, "{}", self.time_line())?;
        let failed = self.checks.iter().filter(|c| !c.passed()).count();
        write!(
            f,
            "\n{}: {} of {} pipelines equal to their reference",
            if failed == 0 { "PASS" } else { "FAIL" },
            self.checks.len() - failed,
            self.checks.len()
        )
    }
}
