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

use crate::errors::{fail, usage, NoGpuError};

pub type Res<T = ()> = Result<T, crate::errors::Error>;

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
                usage(format!(
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

/// Opens the tuning cache an argument names: an error names the argument.
fn open_cache_arg(flag: &str, path: &Path) -> Res<TuneCache> {
    TuneCache::open(path).map_err(|e| {
        let why = match e {
            dusk_aot::AotError::Io { source, .. } => format!("cannot read it: {source}"),
            dusk_aot::AotError::Invalid { msg, .. } => msg,
            other => other.to_string(),
        };
        usage(format!("{flag} {}: {why}", path.display()))
    })
}

/// Checks before any work that a file argument can be written: not a directory, in a
/// directory that exists.
fn check_writable(flag: &str, path: &Path) -> Res {
    if path.is_dir() {
        return Err(usage(format!(
            "{flag} {}: is a directory, expected a file",
            path.display()
        )));
    }
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() && !d.is_dir() => Err(usage(format!(
            "{flag} {}: the directory {} does not exist",
            path.display(),
            d.display()
        ))),
        _ => Ok(()),
    }
}

pub fn compile(a: CompileArgs) -> Res {
    let t0 = Instant::now();
    let kernels = select(&a.kernels, a.all)?;
    let tuning = match &a.tuning {
        Some(p) if !p.is_file() => {
            return Err(usage(format!(
                "--tuning {}: no such file (a tuning cache that `dusk tune` wrote)",
                p.display()
            )))
        }
        Some(p) => Some(open_cache_arg("--tuning", p)?),
        None => None,
    };
    if a.out.exists() && !a.out.is_dir() {
        return Err(usage(format!(
            "--out {}: exists and is not a directory",
            a.out.display()
        )));
    }
    std::fs::create_dir_all(&a.out).map_err(|e| {
        fail(format!(
            "--out {}: cannot create the directory: {e}",
            a.out.display()
        ))
    })?;
    if !a.emit.is_empty() {
        let dir = a.out.join("stages");
        std::fs::create_dir_all(&dir)
            .map_err(|e| fail(format!("cannot create {}: {e}", dir.display())))?;
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
                    .map_err(|e| fail(format!("cannot write {}: {e}", path.display())))?;
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
    // PATH, then the repository's .venv (where `./dev.sh setup` installs it), then the
    // python3 on PATH's site-packages.
    run("sh", &["-c", "command -v ptxas"])
        .or_else(|| {
            run(
                "sh",
                &[
                    "-c",
                    "ls .venv/lib/python3*/site-packages/nvidia/cu*/bin/ptxas 2>/dev/null | head -1",
                ],
            )
        })
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
    std::fs::write(&file, ptx)
        .map_err(|e| fail(format!("cannot write {}: {e}", file.display())))?;
    let out = Command::new(ptxas)
        .arg(format!("-arch={}", target.arch_name()))
        .args(["-v", "-o", "/dev/null"])
        .arg(&file)
        .output()
        .map_err(|e| fail(format!("cannot run ptxas {}: {e}", ptxas.display())))?;
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
    if let Some(p) = &a.ptxas {
        if !p.is_file() {
            return Err(usage(format!("--ptxas {}: no such file", p.display())));
        }
    }
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
    /// optional pages=0.25 (fraction of pages that are candidates), head_dim=128 (64, 128
    /// or 256), bits=4 (4 or 8); heads=Q/KV with 1, 2, 4, 8 or 16 query heads a KV head.
    Spgemv,
    /// The fused top-p threshold search: candidates held per program, warps. Shapes:
    /// rows=2048,len=8192 with optional p=0.9.
    Search,
    /// Dense paged decode attention (split and merge): tokens a step, warps, tiles
    /// prefetched, chunk size. Shapes: batch=8,heads=32/8,context=32768 with optional
    /// head_dim=128 (64, 128 or 256); heads=Q/KV with 1, 2, 4, 8 or 16 query heads a KV
    /// head.
    Attention,
}

/// A shape of a family, parsed from a `--shape` argument.
#[derive(Clone, Copy, Debug)]
enum Shape {
    Spgemv(SpgemvShape),
    Search(SearchShape),
    Attention(AttentionShape),
}

/// A `--shape` argument: its text (for messages) and what it says.
struct ShapeArg {
    text: String,
    shape: Shape,
}

/// The error of a `--shape` argument: one sentence naming it.
fn bad_shape(s: &str, why: impl std::fmt::Display) -> String {
    format!("--shape {s}: {why}")
}

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

/// `batch=32,heads=32/8,context=32768[,pages=0.25][,head_dim=128][,bits=4]`, checked
/// against what the kernels support (so that a shape no config can run is refused here,
/// not after every config failed).
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
        let bad = || bad_shape(s, format!("`{part}`: expected {expected}"));
        let (k, v) = part.split_once('=').ok_or_else(bad)?;
        let num = |v: &str| v.trim().parse::<usize>().map_err(|_| bad());
        match k.trim() {
            "batch" => shape.batch = num(v)?,
            "context" => shape.context = num(v)?,
            "head_dim" => shape.head_dim = num(v)?,
            "bits" => shape.bits = num(v)?.try_into().map_err(|_| bad())?,
            "pages" => shape.page_frac = v.trim().parse().map_err(|_| bad())?,
            "heads" => {
                let (q, kv) = v.split_once('/').unwrap_or((v, v));
                shape.num_q_heads = num(q)?;
                shape.num_kv_heads = num(kv)?;
            }
            _ => return Err(bad()),
        }
    }
    if shape.batch == 0 || shape.context == 0 || shape.num_kv_heads == 0 {
        return Err(bad_shape(
            s,
            "needs batch, heads and context, all above 0 (e.g. batch=32,heads=32/8,context=32768)",
        ));
    }
    check_heads(s, shape.num_q_heads, shape.num_kv_heads)?;
    if !matches!(shape.head_dim, 64 | 128 | 256) {
        return Err(bad_shape(
            s,
            format!("head_dim={}: expected 64, 128 or 256", shape.head_dim),
        ));
    }
    if !matches!(shape.bits, 4 | 8) {
        return Err(bad_shape(
            s,
            format!("bits={}: expected 4 or 8", shape.bits),
        ));
    }
    if !(shape.page_frac > 0.0 && shape.page_frac <= 1.0) {
        return Err(bad_shape(
            s,
            format!("pages={}: expected a fraction in (0, 1]", shape.page_frac),
        ));
    }
    Ok(shape)
}

/// `heads=Q/KV`: Q a multiple of KV, with a group (query heads a KV head) of 1, 2, 4, 8 or
/// 16, what `spgemv_quant` and attention are built for.
fn check_heads(s: &str, q: usize, kv: usize) -> Result<(), String> {
    let group_ok = q > 0 && q.is_multiple_of(kv) && {
        let g = q / kv;
        g.is_power_of_two() && g <= 16
    };
    if group_ok {
        return Ok(());
    }
    let why = if q > 0 && q.is_multiple_of(kv) {
        format!("a group of {} query heads a KV head", q / kv)
    } else {
        format!("{q} is not a multiple of {kv}")
    };
    Err(bad_shape(
        s,
        format!(
            "heads={q}/{kv}: expected Q/KV with Q a multiple of KV and 1, 2, 4, 8 or 16 query \
             heads a KV head (e.g. heads=32/8 or heads=32/32), and {why}"
        ),
    ))
}

/// `batch=8,heads=32/8,context=32768[,head_dim=128]`: the SpGEMV fields that apply.
fn parse_attention(s: &str) -> Result<AttentionShape, String> {
    if s.contains("pages=") || s.contains("bits=") {
        return Err(bad_shape(
            s,
            "attention takes batch, heads, context and head_dim",
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
        let bad = || bad_shape(s, format!("`{part}`: expected rows=N, len=N or p=F"));
        let (k, v) = part.split_once('=').ok_or_else(bad)?;
        match k.trim() {
            "rows" => shape.rows = v.trim().parse().map_err(|_| bad())?,
            "len" => shape.len = v.trim().parse().map_err(|_| bad())?,
            "p" => shape.p = v.trim().parse().map_err(|_| bad())?,
            _ => return Err(bad()),
        }
    }
    if shape.rows == 0 || shape.len == 0 || !(shape.p > 0.0 && shape.p <= 1.0) {
        return Err(bad_shape(
            s,
            "needs rows and len above 0 and p in (0, 1] (e.g. rows=2048,len=8192)",
        ));
    }
    Ok(shape)
}

/// Parses every shape before any work starts, so that a typo fails at once, with exit
/// status 2.
fn parse_shapes(family: Family, shapes: &[String]) -> Res<Vec<ShapeArg>> {
    shapes
        .iter()
        .map(|s| {
            let shape = match family {
                Family::Spgemv => parse_spgemv(s).map(Shape::Spgemv),
                Family::Search => parse_search(s).map(Shape::Search),
                Family::Attention => parse_attention(s).map(Shape::Attention),
            };
            Ok(ShapeArg {
                text: s.clone(),
                shape: shape.map_err(usage)?,
            })
        })
        .collect()
}

/// The largest shapes `--interpreter` runs, in the unit its time grows with: at the limit
/// a config takes one to three seconds on the interpreter (a debug build on a busy
/// machine; less in release), where batch 32 at 32k context takes minutes a config.
const INTERPRETER_MAX_SCORES: usize = 1 << 16;
const INTERPRETER_MAX_WEIGHTS: usize = 1 << 14;
const INTERPRETER_MAX_ATTENDED: usize = 1 << 13;

/// Refuses a shape too large for the interpreter, saying the limit.
fn check_interpreter_size(arg: &ShapeArg) -> Res {
    let (what, n, max, example) = match arg.shape {
        Shape::Spgemv(s) => (
            "batch x query heads x candidates",
            s.batch * s.num_q_heads * s.budget(),
            INTERPRETER_MAX_SCORES,
            "batch=1,heads=32/8,context=2048",
        ),
        Shape::Search(s) => (
            "rows x len",
            s.rows * s.len,
            INTERPRETER_MAX_WEIGHTS,
            "rows=4,len=4096",
        ),
        Shape::Attention(s) => (
            "batch x query heads x context",
            s.batch * s.num_q_heads * s.context,
            INTERPRETER_MAX_ATTENDED,
            "batch=1,heads=8/2,context=1024",
        ),
    };
    if n <= max {
        return Ok(());
    }
    Err(usage(format!(
        "--shape {}: too large for --interpreter ({what} = {n}, the interpreter runs at most \
         {max}, e.g. {example}); time shapes this large on a GPU",
        arg.text
    )))
}

/// The device `command` times kernels on: the CPU interpreter with `--interpreter`, else
/// GPU 0, or a refusal that says how to go on.
fn timing_device(command: &str, interpreter: bool) -> Res<Device> {
    if interpreter {
        return Ok(Device::cpu());
    }
    Device::gpu(0).map_err(|e| {
        let why = match e {
            dusk_runtime::RuntimeError::NoGpu { reason } => reason,
            other => other.to_string(),
        };
        Box::new(NoGpuError(format!(
            "no CUDA GPU was found ({why}); `dusk {command}` times kernels on a GPU, so run \
             it on a machine with one, or add --interpreter to run small shapes on the CPU \
             interpreter (its timings are not a GPU's, and are never written to the tuning \
             cache)"
        ))) as crate::errors::Error
    })
}

/// What the interpreter's timings are, printed before them.
const INTERPRETER_NOTE: &str = "CPU interpreter (--interpreter): these timings are the \
     interpreter's, not a GPU's; nothing is written to the tuning cache";

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
    /// Run on the CPU interpreter instead of a GPU, to try the tuner where there is none:
    /// small shapes only (spgemv: batch x query heads x candidates up to 65536; search:
    /// rows x len up to 16384; attention: batch x query heads x context up to 8192). Its
    /// timings are the interpreter's: they are printed, written to --results if given
    /// (marked as such), and never to the tuning cache.
    #[arg(long, conflicts_with = "cache")]
    interpreter: bool,
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
    /// No progress on stderr (a bar on a terminal, a line a config otherwise).
    #[arg(long)]
    quiet: bool,
}

fn open_cache(path: Option<PathBuf>) -> Res<TuneCache> {
    match path {
        Some(p) => open_cache_arg("--cache", &p),
        None => Ok(match TuneCache::default_path() {
            Some(p) => TuneCache::open(&p)?,
            None => TuneCache::in_memory(),
        }),
    }
}

/// Device-to-device copy bandwidth (read + write), the yardstick of `frac_of_copy_bw`.
fn copy_gbps(dev: &Device) -> Res<Option<f64>> {
    if !dev.is_gpu() {
        return Ok(None);
    }
    let gbps = dev.copy_gbps(1 << 30)?;
    Ok(Some(gbps).filter(|g| g.is_finite() && *g > 0.0))
}

/// How the harness timed a trial (`graph`, `queued`, `cpu`), when it was timed.
fn trial_timing(t: &tune::Trial) -> Option<String> {
    match &t.status {
        Status::Ok { timing, .. } => timing.clone(),
        _ => None,
    }
}

/// `bytes` moved in `us` microseconds, with three significant digits in a unit that fits
/// (`2610 GB/s`, `12.3 GB/s`, `481 kB/s`): the interpreter's rates are far below 1 GB/s.
fn rate(bytes: usize, us: f64) -> String {
    let per_s = bytes as f64 / (us * 1e-6);
    let (v, unit) = [(1e9, "GB/s"), (1e6, "MB/s"), (1e3, "kB/s")]
        .into_iter()
        .find(|(scale, _)| per_s >= *scale)
        .map_or((per_s, "B/s"), |(scale, unit)| (per_s / scale, unit));
    let digits = if v >= 100.0 {
        0
    } else if v >= 10.0 {
        1
    } else {
        2
    };
    format!("{v:.digits$} {unit}")
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
            Status::Ok { us, .. } => format!("{us:9.1} us"),
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
    /// The tuning cache; `None` on the interpreter, whose timings never go there.
    cache: Option<&'a mut TuneCache>,
    copy: Option<f64>,
    force: bool,
    progress: bool,
    cases: Vec<Value>,
    /// The shapes for which no config passed, and why.
    failures: Vec<String>,
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
    /// Tunes one shape. A shape for which no config passed is recorded in `failures` (and
    /// not cached), and tuning goes on with the next shape.
    fn tune(&mut self, c: Case<'_>) -> Res {
        println!(
            "{} [{}]: {} configs, {} pruned",
            c.name,
            c.key,
            c.candidates.len(),
            c.pruned.len()
        );
        let ckey = TuneCache::key(&tune::space_hash(&c.candidates), &self.id, &c.key);
        // A cached run in which no config passed is tried again.
        let cached = self
            .cache
            .as_deref()
            .and_then(|cache| cache.get(&ckey))
            .filter(|r| r.best.is_some() && !self.force)
            .cloned();
        let rec = match cached {
            Some(r) => {
                println!("  (from the tuning cache; --force tunes again)");
                r
            }
            None => {
                let rec = tune::run(&c.key, &self.id, c.candidates, c.pruned, self.progress);
                if let (Some(cache), Some(_)) = (self.cache.as_deref_mut(), rec.best) {
                    cache.insert(ckey, rec.clone());
                    cache.save()?;
                }
                rec
            }
        };
        print_record(&rec);
        if let Some(why) = rec.why_none_passed() {
            println!("  no config passed");
            self.failures.push(format!("{}: {why}", c.name));
            return Ok(());
        }
        let Some((default_us, best_us)) = rec.default_and_best_us() else {
            println!("  the default config failed: no comparison");
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
            "timing": {
                "ours": rec.best_trial().and_then(trial_timing),
                "peer": rec.trials.get(rec.default).and_then(trial_timing),
            },
            "trials": rec.trials,
        }));
        Ok(())
    }
}

/// The error of the shapes that failed (`what` happened to them): which, and why.
fn shapes_failed(what: &str, total: usize, failures: &[String]) -> Res {
    if failures.is_empty() {
        return Ok(());
    }
    let which = if total == 1 {
        "the shape".to_string()
    } else {
        format!("{} of the {total} shapes", failures.len())
    };
    Err(fail(format!("{what} for {which}: {}", failures.join("; "))))
}

pub fn tune(a: TuneArgs) -> Res {
    let shapes = parse_shapes(a.family, &a.shape)?;
    if a.interpreter {
        shapes.iter().try_for_each(check_interpreter_size)?;
    }
    if let Some(p) = &a.results {
        check_writable("--results", p)?;
    }
    let mut cache = if a.interpreter {
        None
    } else {
        Some(open_cache(a.cache.clone())?)
    };
    let dev = timing_device("tune", a.interpreter)?;
    let dusk = Dusk::new(dev.clone())?;
    let num_sms = dev.num_sms().unwrap_or(132) as usize;
    let copy = copy_gbps(&dev)?;
    let mut s = Session {
        id: DeviceId::of(&dev),
        cache: cache.as_mut(),
        copy,
        force: a.force,
        progress: !a.quiet,
        cases: vec![],
        failures: vec![],
    };
    match copy {
        Some(c) => println!(
            "{} (sm {}, driver {}); device copy {c:.0} GB/s",
            s.id.name, s.id.compute_capability, s.id.driver
        ),
        None => println!("{INTERPRETER_NOTE}"),
    }
    for arg in &shapes {
        match arg.shape {
            Shape::Spgemv(shape) => {
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
            Shape::Attention(shape) => {
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
            Shape::Search(shape) => {
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
        let mut out = json!({
            "device": s.id.name,
            "driver": s.id.driver,
            "backend": if dev.is_gpu() { "gpu" } else { "interpreter" },
            "commit": a.commit,
            "date": a.date,
            "copy_gbps": copy,
            "command": std::env::args().collect::<Vec<_>>().join(" "),
            "cases": s.cases,
        });
        if !dev.is_gpu() {
            out["note"] = "CPU interpreter timings (--interpreter): not a GPU's".into();
        }
        std::fs::write(&path, serde_json::to_string_pretty(&out)? + "\n").map_err(|e| {
            fail(format!(
                "--results {}: cannot write it: {e}",
                path.display()
            ))
        })?;
        println!("wrote {}", path.display());
    }
    shapes_failed("no config passed", shapes.len(), &s.failures)
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
    /// Time the default config on the CPU interpreter instead of a GPU: small shapes only
    /// (the limits of `dusk tune --interpreter`); the timings are the interpreter's.
    #[arg(long, conflicts_with = "cache")]
    interpreter: bool,
}

/// Times the default (first) config and the cached best, checking both first. Fails when
/// a config it times fails.
fn bench_case(
    id: &DeviceId,
    cache: Option<&TuneCache>,
    copy: Option<f64>,
    name: &str,
    key: &str,
    bytes: usize,
    all: Vec<Box<dyn tune::Candidate + '_>>,
) -> Result<(), String> {
    let ckey = TuneCache::key(&tune::space_hash(&all), id, key);
    let best = cache
        .and_then(|c| c.get(&ckey))
        .and_then(|r| r.best)
        .filter(|b| *b != 0);
    let chosen: Vec<_> = all
        .into_iter()
        .enumerate()
        .filter(|(i, _)| *i == 0 || Some(*i) == best)
        .map(|(_, c)| c)
        .collect();
    let rec = tune::run(key, id, chosen, vec![], false);
    println!(
        "{name} [{key}]{}",
        match (cache, best) {
            (None, _) => " (default config)",
            (Some(_), None) => " (no tuned config cached)",
            (Some(_), Some(_)) => "",
        }
    );
    let mut failed = vec![];
    for t in &rec.trials {
        match &t.status {
            Status::Ok { us, .. } => {
                let frac = copy.map_or(String::new(), |c| {
                    let gbps = bytes as f64 / (us * 1e-6) / 1e9;
                    format!(", {:.1}% of copy", 100.0 * gbps / c)
                });
                println!(
                    "    {:<18} {us:9.1} us  {}{frac}",
                    t.label,
                    rate(bytes, *us)
                );
            }
            Status::Wrong { error } => {
                println!("    {:<18} WRONG: {error}", t.label);
                failed.push(format!("{} gave wrong output: {error}", t.label));
            }
            Status::Failed { stage, error } => {
                println!("    {:<18} failed at {stage}: {error}", t.label);
                failed.push(format!("{} failed at {stage}: {error}", t.label));
            }
            Status::Pruned { reason } => {
                println!("    {:<18} pruned: {reason}", t.label);
                failed.push(format!("{} was pruned: {reason}", t.label));
            }
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("{name}: {}", failed.join("; ")))
    }
}

pub fn bench(a: BenchArgs) -> Res {
    let shapes = parse_shapes(a.family, &a.shape)?;
    if a.interpreter {
        shapes.iter().try_for_each(check_interpreter_size)?;
    }
    let cache = if a.interpreter {
        None
    } else {
        Some(open_cache(a.cache)?)
    };
    let dev = timing_device("bench", a.interpreter)?;
    let dusk = Dusk::new(dev.clone())?;
    let id = DeviceId::of(&dev);
    let copy = copy_gbps(&dev)?;
    match copy {
        Some(c) => println!("{} (device copy {c:.0} GB/s)", id.name),
        None => println!("{INTERPRETER_NOTE}"),
    }
    let mut failures = vec![];
    for arg in &shapes {
        let done = match arg.shape {
            Shape::Spgemv(shape) => {
                let (configs, _) = shape.space(&Limits::H100);
                let problem = SpgemvProblem::new(&dusk, shape, 0x5eed)?;
                bench_case(
                    &id,
                    cache.as_ref(),
                    copy,
                    &shape.case_name(),
                    &shape.key().to_string(),
                    problem.bytes,
                    problem.candidates(&configs),
                )
            }
            Shape::Attention(shape) => {
                let (configs, _) =
                    shape.space(&Limits::H100, dev.num_sms().unwrap_or(132) as usize);
                let problem = AttentionProblem::new(&dusk, shape, 0x5eed)?;
                bench_case(
                    &id,
                    cache.as_ref(),
                    copy,
                    &shape.case_name(),
                    &shape.key().to_string(),
                    shape.bytes(),
                    problem.candidates(&configs),
                )
            }
            Shape::Search(shape) => {
                let (configs, _) = shape.space(&Limits::H100);
                let problem = SearchProblem::new(&dusk, shape, 0x5eed)?;
                bench_case(
                    &id,
                    cache.as_ref(),
                    copy,
                    &shape.case_name(),
                    &shape.key().to_string(),
                    shape.bytes(),
                    problem.candidates(&configs),
                )
            }
        };
        if let Err(why) = done {
            failures.push(why);
        }
    }
    shapes_failed("a timed config failed", shapes.len(), &failures)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::errors::{exit_code, EXIT_FAILED};

    /// A config that never compiles.
    struct Failing(&'static str);

    impl tune::Candidate for Failing {
        fn label(&self) -> String {
            self.0.to_string()
        }
        fn config(&self) -> Value {
            json!({ "name": self.0 })
        }
        fn kernel_hash(&self) -> Result<String, String> {
            Ok("0".repeat(16))
        }
        fn prepare(&mut self) -> Result<(), String> {
            Err("ptxas: too many resources requested for launch".into())
        }
        fn check(&mut self) -> Result<(), tune::Rejection> {
            unreachable!("never prepared")
        }
        fn time(&mut self) -> Result<dusk_runtime::Measured, String> {
            unreachable!("never prepared")
        }
    }

    #[test]
    fn a_tune_in_which_every_config_fails_is_an_error_saying_why_and_is_not_cached() {
        let mut cache = TuneCache::in_memory();
        let mut s = Session {
            id: DeviceId::of(&Device::cpu()),
            cache: Some(&mut cache),
            copy: None,
            force: false,
            progress: false,
            cases: vec![],
            failures: vec![],
        };
        s.tune(Case {
            name: "case".into(),
            key: "key".into(),
            shape: json!({}),
            bytes: 1,
            candidates: vec![Box::new(Failing("a")), Box::new(Failing("b"))],
            pruned: vec![],
        })
        .unwrap();
        let err = shapes_failed("no config passed", 1, &s.failures).unwrap_err();
        assert!(s.cases.is_empty());
        assert_eq!(exit_code(&*err), EXIT_FAILED);
        assert_eq!(
            err.to_string(),
            "no config passed for the shape: case: none of the 2 configs passed (2 failed at \
             compile); the first, a, failed at compile: ptxas: too many resources requested \
             for launch"
        );
        assert!(cache.entries.is_empty(), "a failed run is not cached");
        assert!(shapes_failed("no config passed", 3, &[]).is_ok());
        let err = shapes_failed("no config passed", 3, &["x: why".into()]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "no config passed for 1 of the 3 shapes: x: why"
        );
    }

    #[test]
    fn shapes_are_checked_against_what_the_kernels_support() {
        let err = |family, s: &str| match parse_shapes(family, &[s.to_string()]) {
            Ok(_) => panic!("{s} was accepted"),
            Err(e) => (exit_code(&*e), e.to_string()),
        };
        let (code, msg) = err(Family::Spgemv, "batch=32,heads=32/7,context=32768");
        assert_eq!(code, crate::errors::EXIT_USAGE);
        assert_eq!(
            msg,
            "--shape batch=32,heads=32/7,context=32768: heads=32/7: expected Q/KV with Q a \
             multiple of KV and 1, 2, 4, 8 or 16 query heads a KV head (e.g. heads=32/8 or \
             heads=32/32), and 32 is not a multiple of 7"
        );
        assert!(err(Family::Attention, "batch=1,heads=64/2,context=64")
            .1
            .ends_with("and a group of 32 query heads a KV head"));
        assert!(
            err(Family::Spgemv, "batch=1,heads=4/1,context=64,head_dim=32")
                .1
                .ends_with("head_dim=32: expected 64, 128 or 256")
        );
        assert!(err(Family::Spgemv, "batch=1,heads=4/1,context=64,bits=2")
            .1
            .ends_with("bits=2: expected 4 or 8"));
        assert!(err(Family::Search, "rows=4,len=0")
            .1
            .starts_with("--shape rows=4,len=0: needs rows and len above 0"));
        assert!(
            err(Family::Attention, "batch=1,heads=4/1,context=64,bits=4")
                .1
                .contains("attention takes batch, heads, context and head_dim")
        );
        for (family, ok) in [
            (
                Family::Spgemv,
                "batch=32,heads=32/8,context=32768,pages=0.25,bits=8",
            ),
            (Family::Spgemv, "batch=1,heads=32,context=64,head_dim=256"),
            (
                Family::Attention,
                "batch=8,heads=32/2,context=32768,head_dim=64",
            ),
            (Family::Search, "rows=2048,len=8192,p=0.5"),
        ] {
            assert!(parse_shapes(family, &[ok.to_string()]).is_ok(), "{ok}");
        }
    }

    #[test]
    fn the_interpreter_refuses_large_shapes_saying_the_limit() {
        let arg = |family, s: &str| parse_shapes(family, &[s.to_string()]).unwrap().remove(0);
        let big = arg(Family::Spgemv, "batch=32,heads=32/8,context=32768");
        let e = check_interpreter_size(&big).unwrap_err();
        assert_eq!(exit_code(&*e), crate::errors::EXIT_USAGE);
        assert!(
            e.to_string().contains(
                "too large for --interpreter (batch x query heads x candidates = 33554432, \
                 the interpreter runs at most 65536"
            ),
            "{e}"
        );
        assert!(
            check_interpreter_size(&arg(Family::Spgemv, "batch=1,heads=32/8,context=2048")).is_ok()
        );
        assert!(check_interpreter_size(&arg(Family::Search, "rows=4,len=4096")).is_ok());
        assert!(check_interpreter_size(&arg(Family::Search, "rows=2048,len=8192")).is_err());
        assert!(
            check_interpreter_size(&arg(Family::Attention, "batch=1,heads=8/2,context=1024"))
                .is_ok()
        );
        assert!(
            check_interpreter_size(&arg(Family::Attention, "batch=1,heads=8/2,context=1025"))
                .is_err()
        );
        // `dusk tune --help` states the limits.
        let mut cmd = <TuneArgs as clap::Args>::augment_args(clap::Command::new("tune"));
        let help = cmd.render_long_help().to_string();
        for (what, max) in [
            ("batch x query heads x candidates", INTERPRETER_MAX_SCORES),
            ("rows x len", INTERPRETER_MAX_WEIGHTS),
            ("batch x query heads x context", INTERPRETER_MAX_ATTENDED),
        ] {
            assert!(
                help.contains(&format!("{what} up to {max}")),
                "{what}: {help}"
            );
        }
    }

    #[test]
    fn rates_keep_three_digits_and_never_read_zero() {
        assert_eq!(rate(2_610_000_000, 1000.0), "2610 GB/s");
        assert_eq!(rate(2_610_000_000, 1e6), "2.61 GB/s");
        assert_eq!(rate(12_345_678_900, 1e6 * 1000.0), "12.3 MB/s");
        assert_eq!(rate(5632, 7467.9), "754 kB/s");
        assert_eq!(rate(1, 1e6), "1.00 B/s");
        assert_eq!(rate(3, 2e6), "1.50 B/s");
    }
}
