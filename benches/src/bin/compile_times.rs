//! How long the stock bundle's kernels (every one `dusk_aot::stock::kernels` lists, so the
//! list cannot go stale) take to go from source to PTX on this machine, no GPU needed:
//! building their IR, then `compile_cached` with a cold cache (LLVM), again in the same
//! process (the memory cache), and in a second process over the same folder (the disk
//! cache, what a new process of an engine meets).
//!
//!     cargo run --release -p dusk-bench --bin compile-times -- \
//!         --out benches/results/compile/compile_times.json --commit <sha> --date <date>

use clap::Parser;
use dusk::compiler::codegen::{compile_cached, Target};
use dusk_aot::stock;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// Times the stock kernels' compilation to PTX (cold, memory cache, disk cache).
#[derive(Parser)]
#[command(name = "compile-times")]
struct Args {
    /// Where to write the results (JSON).
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// The commit measured, copied into the results.
    #[arg(long)]
    commit: Option<String>,
    /// The date of the run, copied into the results.
    #[arg(long)]
    date: Option<String>,
    /// (internal) the second process: compile from the disk cache in this folder and print
    /// each kernel's time as JSON.
    #[arg(long, hide = true, value_name = "DIR")]
    disk_pass: Option<PathBuf>,
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// Compiles every stock kernel once; returns (name, ms, where the PTX came from).
fn compile_all(target: &Target) -> Res<Vec<(String, f64, String)>> {
    let mut out = vec![];
    for k in stock::kernels()? {
        let t = Instant::now();
        let (_, source) = compile_cached(&k.kernel, target)?;
        out.push((k.name, ms(t), format!("{source:?}")));
    }
    Ok(out)
}

fn main() -> std::process::ExitCode {
    match run(Args::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("compile-times: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> Res<()> {
    let target = Target::sm90a();
    if let Some(dir) = &args.disk_pass {
        std::env::set_var("DUSK_CACHE_DIR", dir);
        let rows = compile_all(&target)?;
        println!("{}", serde_json::to_string(&rows)?);
        return Ok(());
    }
    let dir = std::env::temp_dir().join(format!("dusk-compile-times-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    std::env::set_var("DUSK_CACHE_DIR", &dir);

    let t = Instant::now();
    let kernels = stock::kernels()?;
    let build_ir_ms = ms(t);
    let cold = compile_all(&target)?;
    let memory = compile_all(&target)?;
    let second = Command::new(std::env::current_exe()?)
        .arg("--disk-pass")
        .arg(&dir)
        .output()?;
    if !second.status.success() {
        return Err(format!(
            "the disk-cache pass failed: {}",
            String::from_utf8_lossy(&second.stderr)
        )
        .into());
    }
    let disk: Vec<(String, f64, String)> = serde_json::from_slice(&second.stdout)?;
    std::fs::remove_dir_all(&dir)?;

    println!(
        "{:<44} {:>12} {:>12} {:>12}",
        "kernel", "cold (LLVM)", "memory", "disk"
    );
    let mut rows: Vec<Value> = vec![];
    for (i, k) in kernels.iter().enumerate() {
        let ((name, c, cs), (_, m, ms_), (_, d, ds)) = (&cold[i], &memory[i], &disk[i]);
        println!("{name:<44} {c:>9.2} ms {m:>9.3} ms {d:>9.3} ms");
        rows.push(json!({"kernel": name, "family": k.family,
                         "cold_ms": c, "cold_source": cs, "memory_ms": m, "memory_source": ms_,
                         "disk_ms": d, "disk_source": ds}));
    }
    let sum = |v: &[(String, f64, String)]| v.iter().map(|r| r.1).sum::<f64>();
    println!(
        "{} kernels: IR {build_ir_ms:.1} ms; to PTX cold {:.1} ms, memory {:.2} ms, disk {:.2} ms",
        kernels.len(),
        sum(&cold),
        sum(&memory),
        sum(&disk)
    );
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let result = json!({
        "commit": args.commit,
        "date": args.date,
        "machine": format!("{cores} cores, no GPU needed; {} build",
                           if cfg!(debug_assertions) { "debug" } else { "release" }),
        "target": target.arch_name(),
        "kernels": rows,
        "build_ir_ms": build_ir_ms,
        "cold_total_ms": sum(&cold),
        "memory_total_ms": sum(&memory),
        "disk_total_ms": sum(&disk),
    });
    if let Some(path) = &args.out {
        std::fs::write(path, serde_json::to_string_pretty(&result)?)
            .map_err(|e| format!("--out {}: {e}", path.display()))?;
    }
    Ok(())
}
