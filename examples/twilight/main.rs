//! Twilight's select-then-prune pipeline end to end (see `pipeline.rs`): on the GPU when
//! there is one, through the interpreter otherwise. Prints each stage's check (reference,
//! tolerance, measured error, PASS or FAIL) and the overall verdict.
//!
//!     cargo run --release --example twilight
//!
//! Exit status: 0 when every stage passed, 1 when one failed, 2 when the job could not run.

mod pipeline;

use dusk::runtime::Device;
use std::process::ExitCode;

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

/// Runs the job and prints the report; whether every stage passed.
fn run() -> Result<bool, Box<dyn std::error::Error>> {
    let (device, backend) = match Device::gpu(0) {
        Ok(gpu) => {
            let name = format!("GPU 0, {} (PTX from LLVM's NVPTX backend)", gpu.name());
            (gpu, name)
        }
        Err(e) => (Device::cpu(), format!("CPU interpreter ({e})")),
    };
    println!("backend: {backend}");
    let dusk = dusk::Dusk::new(device)?;
    let lens: Vec<usize> = if dusk.device().is_gpu() {
        vec![32768, 8000, 20000, 1]
    } else {
        vec![300, 37, 129]
    };
    let p = 0.9;
    println!(
        "input: {} sequences of {:?} tokens; {} query heads over {} KV heads, head_dim {}, pages of {}; top-p {p}",
        lens.len(),
        lens,
        pipeline::NUM_Q_HEADS,
        pipeline::NUM_KV_HEADS,
        pipeline::HEAD_DIM,
        pipeline::PAGE_SIZE,
    );
    let report = pipeline::run(&dusk, &lens, p, 5)?;
    println!(
        "{} candidate tokens (over sequences and KV heads), {} kept by top-p\n",
        report.candidates, report.kept
    );
    println!("{report}");
    Ok(report.passed())
}
