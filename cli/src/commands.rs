//! The subcommands. Each returns an error to `main`, which prints it without a backtrace.

use dusk_aot::attention_tune::{self, AttentionProblem, AttentionShape};
use dusk_aot::bundle::{self, BundleKernel};
use dusk_aot::search_tune::{self, SearchProblem, SearchShape};
use dusk_aot::space::Limits;
use dusk_aot::spgemv_tune::{self, SpgemvProblem, SpgemvShape};
use dusk_aot::stock;
use dusk_aot::tune::{self, DeviceId, Status, TuneCache};
use dusk_compiler::codegen::{compile_cached, compile_stages, Source, Target};
use dusk_kernels::ops::Dusk;
use dusk_runtime::Device;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

pub type Res<T = ()> = Result<T, Box<dyn std::error::Error>>;

fn fail(msg: impl Into<String>) -> Box<dyn std::error::Error> {
    msg.into().into()
}

fn parse_target(s: &str) -> Result<Target, String> {
    Target::parse(s).ok_or_else(|| format!("unknown target `{s}`: use sm_90a, sm_90 or sm_80"))
}

/// The stock kernels named (all when `names` is empty), from the stock bundle's set or,
/// with `all`, from every bundleable configuration.
fn select(names: &[String], all: bool) -> Res<Vec<BundleKernel>> {
    let all = if all {
        stock::all_kernels()?
    } else {
        stock::kernels()?
    };
    if names.is_empty() {
        return Ok(all);
    }
    names
        .iter()
        .map(|n| {
            all.iter().find(|k| &k.name == n).cloned().ok_or_else(|| {
                fail(format!(
                    "no stock kernel `{n}`; `dusk list` shows them: {}",
                    all.iter()
                        .map(|k| k.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })
        })
        .collect()
}

pub fn list(all: bool) -> Res {
    println!("{:<44} {:<18} {:>7}  config", "name", "family", "threads");
    for k in select(&[], all)? {
        println!(
            "{:<44} {:<18} {:>7}  {}",
            k.name,
            k.family,
            k.kernel.num_threads(),
            Value::Object(k.config.clone())
        );
    }
    Ok(())
}

/// A stage of the compiler whose text `--emit` writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Stage {
    /// The tile IR as built.
    Ir,
    /// The IR after reduction fusion.
    FusedIr,
    /// The layout of every block value (elements per thread, threads, warps).
    Layouts,
    /// LLVM IR as lowered, before optimisation.
    Llvm,
    /// LLVM IR after the O3 pipeline.
    LlvmOpt,
    /// The PTX.
    Ptx,
}

impl Stage {
    fn ext(self) -> &'static str {
        match self {
            Stage::Ir => "ir",
            Stage::FusedIr => "fused.ir",
            Stage::Layouts => "layouts.txt",
            Stage::Llvm => "ll",
            Stage::LlvmOpt => "opt.ll",
            Stage::Ptx => "ptx",
        }
    }
}

#[derive(clap::Args)]
pub struct CompileArgs {
    /// Stock kernels to compile (see `dusk list`); all of them when none is named.
    kernels: Vec<String>,
    /// GPU architecture: sm_90a (H100/H200, the default), sm_90 or sm_80 (A100).
    #[arg(long, default_value = "sm_90a", value_parser = parse_target)]
    target: Target,
    /// The bundle directory to write.
    #[arg(long, short, default_value_os_t = crate::default_out())]
    out: PathBuf,
    /// Also write these stages' text for each kernel to `OUT/stages/<kernel>.<stage>`
    /// (comma-separated).
    #[arg(long, value_enum, value_delimiter = ',')]
    emit: Vec<Stage>,
    /// Choose from every bundleable configuration (`dusk list --all`), not only the stock
    /// bundle's.
    #[arg(long)]
    all: bool,
    /// Put the results of this tuning cache into the manifest (see `dusk tune`).
    #[arg(long)]
    tuning: Option<PathBuf>,
}

pub fn compile(a: CompileArgs) -> Res {
    let t0 = Instant::now();
    let kernels = select(&a.kernels, a.all)?;
    let tuning = a.tuning.as_deref().map(TuneCache::open).transpose()?;
    if !a.emit.is_empty() {
        let dir = a.out.join("stages");
        std::fs::create_dir_all(&dir).map_err(|e| fail(format!("{}: {e}", dir.display())))?;
        for k in &kernels {
            let stages = compile_stages(&k.kernel, &a.target)?;
            for s in &a.emit {
                let text = match s {
                    Stage::Ir => &stages.ir,
                    Stage::FusedIr => &stages.fused_ir,
                    Stage::Layouts => &stages.layouts,
                    Stage::Llvm => &stages.llvm_unoptimized,
                    Stage::LlvmOpt => &stages.llvm_optimized,
                    Stage::Ptx => &stages.ptx,
                };
                let path = dir.join(format!("{}.{}", k.name, s.ext()));
                std::fs::write(&path, text)
                    .map_err(|e| fail(format!("{}: {e}", path.display())))?;
                println!("wrote {}", path.display());
            }
        }
    }
    let written = bundle::write(&a.out, &a.target, &kernels, tuning.as_ref())?;
    for w in &written {
        let how = match w.source {
            Source::Compiled => "compiled",
            Source::Disk => "from the disk cache",
            Source::Memory => "from memory",
        };
        println!("  {:<44} {how}", w.name);
    }
    println!(
        "bundle {} ({} kernels, {}) in {:.2} s",
        a.out.display(),
        written.len(),
        a.target.arch_name(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

#[derive(clap::Args)]
pub struct InspectArgs {
    /// Stock kernels to inspect (see `dusk list`); all of them when none is named.
    kernels: Vec<String>,
    /// Choose from every bundleable configuration, not only the stock bundle's.
    #[arg(long)]
    all: bool,
    /// GPU architecture ptxas assembles for.
    #[arg(long, default_value = "sm_90a", value_parser = parse_target)]
    target: Target,
    /// Print the IR after each pass (as built, after fusion, the layouts).
    #[arg(long)]
    ir: bool,
    /// The ptxas to run (else $DUSK_PTXAS, ptxas on the PATH, or the one of the PyPI
    /// package nvidia-cuda-nvcc).
    #[arg(long)]
    ptxas: Option<PathBuf>,
}

fn find_ptxas(given: Option<PathBuf>) -> Option<PathBuf> {
    if given.is_some() {
        return given;
    }
    if let Some(p) = std::env::var_os("DUSK_PTXAS") {
        return Some(p.into());
    }
    let run = |cmd: &str, args: &[&str]| {
        Command::new(cmd)
            .args(args)
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .filter(|s| !s.is_empty())
    };
    run("sh", &["-c", "command -v ptxas"])
        .or_else(|| {
            run(
                "python3",
                &[
                    "-c",
                    "import glob,site,os;r=site.getsitepackages()+[site.getusersitepackages()];\
                     print(next((p for d in r for p in sorted(glob.glob(os.path.join(d,'nvidia','cu*','bin','ptxas')))),''))",
                ],
            )
        })
        .map(PathBuf::from)
}

/// ptxas's `-v` figures of one kernel.
#[derive(Default)]
struct PtxasInfo {
    registers: Option<u64>,
    smem: Option<u64>,
    spill_stores: Option<u64>,
    spill_loads: Option<u64>,
}

/// The number just before `unit` in `line` ("40 registers", "0 bytes smem").
fn number_before(line: &str, unit: &str) -> Option<u64> {
    let at = line.find(unit)?;
    line[..at].split_whitespace().last()?.parse().ok()
}

fn ptxas_info(ptxas: &Path, ptx: &str, target: &Target, name: &str) -> Res<PtxasInfo> {
    let file = std::env::temp_dir().join(format!("dusk-inspect-{}-{name}.ptx", std::process::id()));
    std::fs::write(&file, ptx)?;
    let out = Command::new(ptxas)
        .arg(format!("-arch={}", target.arch_name()))
        .args(["-v", "-o", "/dev/null"])
        .arg(&file)
        .output()
        .map_err(|e| fail(format!("cannot run {}: {e}", ptxas.display())))?;
    let _ = std::fs::remove_file(&file);
    let text =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(fail(format!("ptxas rejected {name}: {}", text.trim())));
    }
    let mut info = PtxasInfo::default();
    for line in text.lines() {
        info.registers = info.registers.or(number_before(line, "registers"));
        info.smem = info.smem.or(number_before(line, "bytes smem"));
        info.spill_stores = info
            .spill_stores
            .or(number_before(line, "bytes spill stores"));
        info.spill_loads = info
            .spill_loads
            .or(number_before(line, "bytes spill loads"));
    }
    Ok(info)
}

pub fn inspect(a: InspectArgs) -> Res {
    let kernels = select(&a.kernels, a.all)?;
    let ptxas = find_ptxas(a.ptxas);
    if ptxas.is_none() {
        eprintln!(
            "note: no ptxas found (set DUSK_PTXAS or `pip install nvidia-cuda-nvcc`): \
             registers, shared memory and spills are not shown"
        );
    }
    let show = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
    println!(
        "{:<44} {:>7} {:>9} {:>10} {:>12} {:>11}",
        "kernel", "threads", "registers", "smem bytes", "spill stores", "spill loads"
    );
    for k in &kernels {
        if a.ir {
            let s = compile_stages(&k.kernel, &a.target)?;
            println!(
                "==== {}: IR as built\n{}\n==== {}: IR after reduction fusion\n{}\n==== {}: layouts\n{}",
                k.name, s.ir, k.name, s.fused_ir, k.name, s.layouts
            );
        }
        let info = match &ptxas {
            Some(p) => ptxas_info(
                p,
                &compile_cached(&k.kernel, &a.target)?.0,
                &a.target,
                &k.name,
            )?,
            None => PtxasInfo::default(),
        };
        println!(
            "{:<44} {:>7} {:>9} {:>10} {:>12} {:>11}",
            k.name,
            k.kernel.num_threads(),
            show(info.registers),
            show(info.smem),
            show(info.spill_stores),
            show(info.spill_loads)
        );
    }
    Ok(())
}

/// Kernel families the tuner knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Family {
    /// The quantized SpGEMV (`spgemv_quant`): tokens per program, warps, occupancy
    /// request, dp2a or tensor cores. Shapes: batch=32,heads=32/8,context=32768 with
    /// optional pages=0.25 (fraction of pages that are candidates), head_dim=128, bits=4.
    Spgemv,
    /// The fused top-p threshold search: candidates held per program, warps. Shapes:
    /// rows=2048,len=8192 with optional p=0.9.
    Search,
    /// Dense paged decode attention (split and merge): tokens a step, warps, tiles
    /// prefetched, chunk size. Shapes: batch=8,heads=32/8,context=32768 with optional
    /// head_dim=128.
    Attention,
}

fn bad_part(s: &str, part: &str, expected: &str) -> String {
    format!("`{part}` in shape `{s}`: expected {expected}")
}

/// `batch=32,heads=32/8,context=32768[,pages=0.25][,head_dim=128][,bits=4]`.
/// The pruned configs of a space as the tuner records them: label, config, why.
fn pruned_rows<C>(
    pruned: &[(C, String)],
    label: impl Fn(&C) -> String,
    config: impl Fn(&C) -> serde_json::Value,
) -> Vec<(String, serde_json::Value, String)> {
    pruned
        .iter()
        .map(|(c, why)| (label(c), config(c), why.clone()))
        .collect()
}

fn parse_spgemv(s: &str) -> Result<SpgemvShape, String> {
    let mut shape = SpgemvShape {
        batch: 0,
        num_q_heads: 0,
        num_kv_heads: 0,
        head_dim: 128,
        context: 0,
        bits: 4,
        page_frac: 1.0,
    };
    let expected = "batch=N, heads=Q/KV, context=N, pages=F, head_dim=N or bits=N";
    for part in s.split(',') {
        let bad = || bad_part(s, part, expected);
        let (k, v) = part.split_once('=').ok_or_else(bad)?;
        let num = |v: &str| v.parse::<usize>().map_err(|_| bad());
        match k.trim() {
            "batch" => shape.batch = num(v)?,
            "context" => shape.context = num(v)?,
            "head_dim" => shape.head_dim = num(v)?,
            "bits" => shape.bits = num(v)? as u32,
            "pages" => shape.page_frac = v.parse().map_err(|_| bad())?,
            "heads" => {
                let (q, kv) = v.split_once('/').unwrap_or((v, v));
                shape.num_q_heads = num(q)?;
                shape.num_kv_heads = num(kv)?;
            }
            _ => return Err(bad()),
        }
    }
    if shape.batch == 0 || shape.context == 0 || shape.num_kv_heads == 0 {
        return Err(format!(
            "shape `{s}` needs batch, heads and context (all above 0)"
        ));
    }
    if !(shape.page_frac > 0.0 && shape.page_frac <= 1.0) {
        return Err(format!(
            "pages={} in `{s}`: a fraction in (0, 1]",
            shape.page_frac
        ));
    }
    Ok(shape)
}

/// `batch=8,heads=32/8,context=32768[,head_dim=128]`: the SpGEMV fields that apply.
fn parse_attention(s: &str) -> Result<AttentionShape, String> {
    if s.contains("pages=") || s.contains("bits=") {
        return Err(format!(
            "shape `{s}`: attention takes batch, heads, context, head_dim"
        ));
    }
    let x = parse_spgemv(s)?;
    Ok(AttentionShape {
        batch: x.batch,
        num_q_heads: x.num_q_heads,
        num_kv_heads: x.num_kv_heads,
        head_dim: x.head_dim,
        context: x.context,
    })
}

/// `rows=2048,len=8192[,p=0.9]`.
fn parse_search(s: &str) -> Result<SearchShape, String> {
    let mut shape = SearchShape {
        rows: 0,
        len: 0,
        p: 0.9,
    };
    for part in s.split(',') {
        let bad = || bad_part(s, part, "rows=N, len=N or p=F");
        let (k, v) = part.split_once('=').ok_or_else(bad)?;
        match k.trim() {
            "rows" => shape.rows = v.parse().map_err(|_| bad())?,
            "len" => shape.len = v.parse().map_err(|_| bad())?,
            "p" => shape.p = v.parse().map_err(|_| bad())?,
            _ => return Err(bad()),
        }
    }
    if shape.rows == 0 || shape.len == 0 || !(shape.p > 0.0 && shape.p <= 1.0) {
        return Err(format!(
            "shape `{s}` needs rows and len above 0 and p in (0, 1]"
        ));
    }
    Ok(shape)
}

#[derive(clap::Args)]
pub struct TuneArgs {
    /// The kernel family to tune.
    #[arg(value_enum)]
    family: Family,
    /// A shape to tune for, repeatable; its fields depend on the family (see above).
    #[arg(long, required = true)]
    shape: Vec<String>,
    /// The tuning cache (default: tuning.json in dusk's cache folder, $DUSK_CACHE_DIR).
    #[arg(long)]
    cache: Option<PathBuf>,
    /// Tune again even when the cache has a result for the shape's bucket.
    #[arg(long)]
    force: bool,
    /// Write the tuned-versus-default figures as a benchmark result file
    /// (benches/results format, peer "default-config").
    #[arg(long)]
    results: Option<PathBuf>,
    /// The commit to record in the results file.
    #[arg(long)]
    commit: Option<String>,
    /// The date to record in the results file.
    #[arg(long)]
    date: Option<String>,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

fn open_cache(path: Option<PathBuf>) -> Res<TuneCache> {
    Ok(match path.or_else(TuneCache::default_path) {
        Some(p) => TuneCache::open(&p)?,
        None => TuneCache::in_memory(),
    })
}

/// Device-to-device copy bandwidth (read + write), the yardstick of `frac_of_copy_bw`.
fn copy_gbps(dev: &Device) -> Res<Option<f64>> {
    if !dev.is_gpu() {
        return Ok(None);
    }
    Ok(Some(dev.copy_gbps(1 << 30)?))
}

fn spgemv_shape_json(s: &SpgemvShape) -> Value {
    json!({
        "batch": s.batch, "num_q_heads": s.num_q_heads, "num_kv_heads": s.num_kv_heads,
        "head_dim": s.head_dim, "page_size": 16, "context": s.context, "bits": s.bits,
        "candidate_pages_pct": (s.page_frac * 100.0).round() as u64,
    })
}

fn print_record(rec: &tune::TuneRecord) {
    for (i, t) in rec.trials.iter().enumerate() {
        let mark = match (Some(i) == rec.best, i == rec.default) {
            (true, true) => " <- best, default",
            (true, false) => " <- best",
            (false, true) => " (default)",
            _ => "",
        };
        let what = match &t.status {
            Status::Ok { us } => format!("{us:9.1} us"),
            Status::Wrong { error } => format!("WRONG: {error}"),
            Status::Failed { stage, error } => format!("failed at {stage}: {error}"),
            Status::Pruned { reason } => format!("pruned: {reason}"),
        };
        println!("    {:<18} {what}{mark}", t.label);
    }
}

/// What `tune` shares across families.
struct Session<'a> {
    id: DeviceId,
    cache: &'a mut TuneCache,
    copy: Option<f64>,
    force: bool,
    progress: bool,
    cases: Vec<Value>,
}

/// One shape: a space of candidates tuned (or read from the cache), printed, and added to
/// the results.
struct Case<'c> {
    name: String,
    key: String,
    shape: Value,
    bytes: usize,
    candidates: Vec<Box<dyn tune::Candidate + 'c>>,
    pruned: Vec<(String, Value, String)>,
}

impl Session<'_> {
    fn tune(&mut self, c: Case<'_>) -> Res {
        println!(
            "{} [{}]: {} configs, {} pruned",
            c.name,
            c.key,
            c.candidates.len(),
            c.pruned.len()
        );
        let ckey = TuneCache::key(&tune::space_hash(&c.candidates), &self.id, &c.key);
        let rec = match self.cache.get(&ckey) {
            Some(r) if !self.force => {
                println!("  (from the tuning cache; --force tunes again)");
                r.clone()
            }
            _ => {
                let rec = tune::run(&c.key, &self.id, c.candidates, c.pruned, self.progress);
                self.cache.insert(ckey, rec.clone());
                self.cache.save()?;
                rec
            }
        };
        print_record(&rec);
        let Some((default_us, best_us)) = rec.default_and_best_us() else {
            println!("  the default config or every config failed: no comparison");
            return Ok(());
        };
        let gbps = c.bytes as f64 / (best_us * 1e-6) / 1e9;
        println!(
            "  tuned {} {best_us:.1} us vs default {default_us:.1} us: {:.2}x",
            rec.best_trial().map_or("", |t| t.label.as_str()),
            default_us / best_us
        );
        self.cases.push(json!({
            "case": c.name,
            "shape": c.shape,
            "ours_us": best_us,
            "peer": "default-config",
            "peer_us": default_us,
            "speedup_vs_peer": default_us / best_us,
            "bytes": c.bytes as u64,
            "gbps": gbps,
            "frac_of_copy_bw": self.copy.map(|x| gbps / x),
            "tuned_config": rec.best_trial().map(|t| t.label.clone()),
            "trials": rec.trials,
        }));
        Ok(())
    }
}

/// Parses every shape before any work starts, so a typo fails at once.
fn check_shapes(family: Family, shapes: &[String]) -> Res {
    for s in shapes {
        match family {
            Family::Spgemv => parse_spgemv(s).map(|_| ())?,
            Family::Search => parse_search(s).map(|_| ())?,
            Family::Attention => parse_attention(s).map(|_| ())?,
        }
    }
    Ok(())
}

pub fn tune(a: TuneArgs) -> Res {
    check_shapes(a.family, &a.shape)?;
    let dev = Device::best();
    if !dev.is_gpu() {
        eprintln!("note: no GPU; tuning on the CPU interpreter (slow; small shapes only)");
    }
    let dusk = Dusk::new(dev.clone())?;
    let num_sms = dev.num_sms().unwrap_or(132) as usize;
    let mut cache = open_cache(a.cache)?;
    let copy = copy_gbps(&dev)?;
    let mut s = Session {
        id: DeviceId::of(&dev),
        cache: &mut cache,
        copy,
        force: a.force,
        progress: !a.quiet,
        cases: vec![],
    };
    if let Some(c) = copy {
        println!(
            "{} (sm {}, driver {}); device copy {c:.0} GB/s",
            s.id.name, s.id.compute_capability, s.id.driver
        );
    }
    for text in &a.shape {
        match a.family {
            Family::Spgemv => {
                let shape = parse_spgemv(text)?;
                let (configs, pruned) = shape.space(&Limits::H100);
                let problem = SpgemvProblem::new(&dusk, shape, 0x5eed)?;
                s.tune(Case {
                    name: shape.case_name(),
                    key: shape.key().to_string(),
                    shape: spgemv_shape_json(&shape),
                    bytes: problem.bytes,
                    candidates: problem.candidates(&configs),
                    pruned: pruned_rows(&pruned, spgemv_tune::label, stock::spgemv_config_json),
                })?;
            }
            Family::Attention => {
                let shape = parse_attention(text)?;
                let (configs, pruned) = shape.space(&Limits::H100, num_sms);
                let problem = AttentionProblem::new(&dusk, shape, 0x5eed)?;
                s.tune(Case {
                    name: shape.case_name(),
                    key: shape.key().to_string(),
                    shape: json!({
                        "batch": shape.batch, "num_q_heads": shape.num_q_heads,
                        "num_kv_heads": shape.num_kv_heads, "head_dim": shape.head_dim,
                        "page_size": 16, "context": shape.context,
                    }),
                    bytes: shape.bytes(),
                    candidates: problem.candidates(&configs),
                    pruned: pruned_rows(
                        &pruned,
                        attention_tune::label,
                        attention_tune::config_json,
                    ),
                })?;
            }
            Family::Search => {
                let shape = parse_search(text)?;
                let (configs, pruned) = shape.space(&Limits::H100);
                let problem = SearchProblem::new(&dusk, shape, 0x5eed)?;
                s.tune(Case {
                    name: shape.case_name(),
                    key: shape.key().to_string(),
                    shape: json!({"rows": shape.rows, "candidates": shape.len, "p": shape.p}),
                    bytes: shape.bytes(),
                    candidates: problem.candidates(&configs),
                    pruned: pruned_rows(&pruned, search_tune::label, search_tune::config_json),
                })?;
            }
        }
    }
    if let Some(path) = a.results {
        let out = json!({
            "device": s.id.name,
            "driver": s.id.driver,
            "commit": a.commit,
            "date": a.date,
            "copy_gbps": copy,
            "command": std::env::args().collect::<Vec<_>>().join(" "),
            "cases": s.cases,
        });
        std::fs::write(&path, serde_json::to_string_pretty(&out)? + "\n")
            .map_err(|e| fail(format!("{}: {e}", path.display())))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

#[derive(clap::Args)]
pub struct BenchArgs {
    /// The kernel family to time.
    #[arg(value_enum)]
    family: Family,
    /// A shape, repeatable (as for `dusk tune`).
    #[arg(long, required = true)]
    shape: Vec<String>,
    /// The tuning cache to take tuned configs from.
    #[arg(long)]
    cache: Option<PathBuf>,
}

/// Times the default (first) config and the cached best, checking both first.
fn bench_case(
    id: &DeviceId,
    cache: &TuneCache,
    copy: Option<f64>,
    name: &str,
    key: &str,
    bytes: usize,
    all: Vec<Box<dyn tune::Candidate + '_>>,
) {
    let ckey = TuneCache::key(&tune::space_hash(&all), id, key);
    let best = cache.get(&ckey).and_then(|r| r.best).filter(|b| *b != 0);
    let chosen: Vec<_> = all
        .into_iter()
        .enumerate()
        .filter(|(i, _)| *i == 0 || Some(*i) == best)
        .map(|(_, c)| c)
        .collect();
    let rec = tune::run(key, id, chosen, vec![], false);
    println!(
        "{name} [{key}]{}",
        if best.is_some() {
            ""
        } else {
            " (no tuned config cached)"
        }
    );
    for t in &rec.trials {
        match &t.status {
            Status::Ok { us } => {
                let gbps = bytes as f64 / (us * 1e-6) / 1e9;
                let frac = copy.map_or(String::new(), |c| {
                    format!(", {:.1}% of copy", 100.0 * gbps / c)
                });
                println!("    {:<18} {us:9.1} us  {gbps:6.0} GB/s{frac}", t.label);
            }
            other => println!("    {:<18} {other:?}", t.label),
        }
    }
}

pub fn bench(a: BenchArgs) -> Res {
    check_shapes(a.family, &a.shape)?;
    let dev = Device::best();
    let dusk = Dusk::new(dev.clone())?;
    let id = DeviceId::of(&dev);
    let cache = open_cache(a.cache)?;
    let copy = copy_gbps(&dev)?;
    println!(
        "{} {}",
        id.name,
        copy.map_or(String::new(), |c| format!("(device copy {c:.0} GB/s)"))
    );
    for text in &a.shape {
        match a.family {
            Family::Spgemv => {
                let shape = parse_spgemv(text)?;
                let (configs, _) = shape.space(&Limits::H100);
                let problem = SpgemvProblem::new(&dusk, shape, 0x5eed)?;
                let key = shape.key().to_string();
                bench_case(
                    &id,
                    &cache,
                    copy,
                    &shape.case_name(),
                    &key,
                    problem.bytes,
                    problem.candidates(&configs),
                );
            }
            Family::Attention => {
                let shape = parse_attention(text)?;
                let (configs, _) =
                    shape.space(&Limits::H100, dev.num_sms().unwrap_or(132) as usize);
                let problem = AttentionProblem::new(&dusk, shape, 0x5eed)?;
                let key = shape.key().to_string();
                bench_case(
                    &id,
                    &cache,
                    copy,
                    &shape.case_name(),
                    &key,
                    shape.bytes(),
                    problem.candidates(&configs),
                );
            }
            Family::Search => {
                let shape = parse_search(text)?;
                let (configs, _) = shape.space(&Limits::H100);
                let problem = SearchProblem::new(&dusk, shape, 0x5eed)?;
                let key = shape.key().to_string();
                bench_case(
                    &id,
                    &cache,
                    copy,
                    &shape.case_name(),
                    &key,
                    shape.bytes(),
                    problem.candidates(&configs),
                );
            }
        }
    }
    Ok(())
}
