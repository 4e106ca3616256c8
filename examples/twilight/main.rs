//! The main job (`./dev.sh run`): sparse-attention pipelines on one synthetic long-context
//! batch, on the GPU when there is one and through the interpreter otherwise.
//!
//! Full (dense), Quest (N/4), Quest+Twilight (p = 0.95), Quest alone at Quest+Twilight's
//! average budget, Double Sparsity+Twilight, SparQ, Full+Twilight and the centroid selector
//! of `examples/centroid_selector` with Twilight, each declared with `pipeline!` in a few
//! lines (`methods.rs`). Each is first checked against the f64 reference of its own
//! algorithm, stage by stage (`check.rs`); then stepped on the whole batch and timed. The
//! job prints the checks, a table of per-head budgets (mean, min, max), output errors
//! against dense attention and time per step, the budgets by kind of head, and whether
//! Twilight's claims hold (`claims.rs`); it writes the table (`table.md`), a plot of the
//! per-head budgets (`budgets.svg`, like Twilight's Figure 11) and Double Sparsity's
//! calibration (`ds_calibration.json`) into the output folder.
//!
//!     cargo run --release --example twilight -- [--out target/twilight] [--batch N]
//!         [--context N] [--heads 32/8] [--seed 1] [--check-seqs N] [--bundle DIR|none]
//!
//! Defaults: on a GPU the paper's shape (32 sequences of 32768 tokens, GQA 32/8); through
//! the interpreter 2 sequences of 8192 tokens, GQA 32/8. The checks run on the first
//! `--check-seqs` sequences (2 by default; the batch itself when it has no more). On a GPU
//! a kernel's PTX comes from the committed bundle (`kernels_gen/bundle`, or `--bundle
//! DIR`) when it holds that kernel's IR, and is otherwise compiled by LLVM on first use
//! (`--bundle none`: every kernel compiled). The job ends with where its time went. Exit
//! status: 0 when every pipeline equals its reference, 1 when one does not, 2 when the job
//! could not run.

mod check;
mod claims;
mod job;
mod methods;
mod plot;
mod report;

#[path = "../centroid_selector/selector.rs"]
mod centroid;

use dusk::runtime::{Bundle, Device};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

/// The committed bundle of stock kernels (sm_90a PTX), the default `--bundle`.
const BUNDLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/kernels_gen/bundle");

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("twilight: {e}");
            ExitCode::from(2)
        }
    }
}

/// Runs the job and prints its report; whether every pipeline passed its checks.
fn run() -> Result<bool, Box<dyn std::error::Error>> {
    let (device, backend) = match Device::gpu(0) {
        Ok(gpu) => {
            let name = format!("GPU 0, {} (PTX from LLVM's NVPTX backend)", gpu.name());
            (gpu, name)
        }
        Err(e) => (Device::cpu(), format!("CPU interpreter ({e})")),
    };
    let mut o = job::Options::for_device(device.is_gpu());
    let bundle = parse_args(&mut o)?;
    let start = std::time::Instant::now();
    // On the CPU the bundle is kept unused (the interpreter runs the IR); the job still
    // counts the kernels it holds.
    let bundle = match bundle {
        Some((dir, given)) => {
            let b = Bundle::open(&dir)?;
            match (b.check_arch(device.compute_capability()), device.is_gpu()) {
                (Err(e), true) if !given => {
                    println!("(bundle {} not used: {e})", dir.display());
                    None
                }
                _ => Some((dir, b)),
            }
        }
        None => None,
    };
    let dusk = match bundle {
        Some((dir, b)) => {
            println!("backend: {backend}; bundle {}", dir.display());
            dusk::Dusk::with_bundle(device, Arc::new(b))?
        }
        None => {
            println!("backend: {backend}; no bundle");
            dusk::Dusk::new(device)?
        }
    };
    let job = job::run(&dusk, &o)?;
    println!("{job}");
    println!("({:.1} s)", start.elapsed().as_secs_f64());
    Ok(job.passed())
}

/// `--out DIR`, `--batch N`, `--context N`, `--heads Q/KV`, `--seed N`, `--check-seqs N`,
/// and `--bundle DIR|none`, returned: the bundle to take PTX from (the committed one when
/// this source tree still has it, used only where it fits the GPU) and whether it was given.
type BundleArg = Option<(PathBuf, bool)>;
fn parse_args(o: &mut job::Options) -> Result<BundleArg, Box<dyn std::error::Error>> {
    let mut bundle = Some(PathBuf::from(BUNDLE))
        .filter(|d| d.join("manifest.json").exists())
        .map(|d| (d, false));
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args
            .next()
            .ok_or_else(|| format!("{flag}: expected a value after it"))?;
        let number = |v: &str| {
            v.parse::<usize>()
                .map_err(|e| format!("{flag}: expected a number, found {v:?} ({e})"))
        };
        match flag.as_str() {
            "--out" => o.out = value.into(),
            "--batch" => o.batch = number(&value)?,
            "--context" => o.context = number(&value)?,
            "--seed" => o.seed = number(&value)? as u64,
            "--check-seqs" => o.check_seqs = number(&value)?,
            "--bundle" if value == "none" => bundle = None,
            "--bundle" => bundle = Some((value.into(), true)),
            "--heads" => {
                let (q, kv) = value
                    .split_once('/')
                    .ok_or_else(|| format!("--heads: expected Q/KV, found {value:?}"))?;
                (o.q_heads, o.kv_heads) = (number(q)?, number(kv)?);
            }
            _ => {
                return Err(format!(
                    "unknown option {flag}; the options are --out, --batch, --context, \
                     --heads, --seed, --check-seqs and --bundle"
                )
                .into())
            }
        }
    }
    Ok(bundle)
}
