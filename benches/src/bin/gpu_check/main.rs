//! The GPU checks and benchmarks of dusk's kernels, one binary for the device machine (what
//! travels there is limited: LLVM is linked once). Each subcommand checks its kernels
//! against the host references on fresh random inputs, outputs poisoned first, then times
//! them with the harness (`dusk::runtime::Device::time_calls`: inputs rotated past twice
//! the L2, calls captured in a CUDA graph and replayed) beside the peers' figures from the
//! same command, which `benches/baselines/harness.py` times by the same rule:
//!
//!     gpu-check spgemv    [--check-only] [--peers peers.json] [--out spgemv.json]
//!     gpu-check threshold [--check-only] [--rows N] [--peers peers.json] [--out threshold_search.json]
//!     gpu-check attention [--check-only] [--peers peers.json] [--out varlen_attention.json]
//!     gpu-check selectors [--check-only] [--peers quest.json] [--ds-peers ds.json] [--attention-peers attention.json] [--append-peers append.json] [--sparq-peers sparq.json] [--only PREFIX]
//!     gpu-check pipeline  [--check-only] [--pages-only --pages-out DIR] [--sweep] [--peers peers.json] [--out pipeline.json]
//!
//! `gpu-check <subcommand> --help` lists every option.

mod append;
mod attention;
mod common;
mod ds;
mod pipeline;
mod pipeline_bench;
mod selectors;
mod sparq;
mod spgemv;
mod threshold;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// GPU checks and benchmarks of dusk's kernels (run on the device machine).
#[derive(Parser)]
#[command(name = "gpu-check")]
struct Cli {
    #[command(subcommand)]
    family: Family,
}

#[derive(Subcommand)]
enum Family {
    /// quantize_k and the INT4/INT8 SpGEMV: checks, then timings beside PyTorch.
    Spgemv(spgemv::SpgemvArgs),
    /// The fused threshold search (top-p): checks against the sort oracle, then timings
    /// beside FlashInfer, PyTorch and Triton.
    Threshold(threshold::ThresholdArgs),
    /// Varlen paged decode attention: checks, graph replay, then timings beside FlashInfer
    /// and SDPA.
    Attention(attention::AttentionArgs),
    /// The token selectors (Quest, Double Sparsity, SparQ): checks, then the selection's
    /// timings beside PyTorch and as a share of FlashInfer's dense decode; the cache append:
    /// checks, then one decode step's maintenance beside PyTorch.
    Selectors(selectors::SelectorsArgs),
    /// Pipelines (select, estimate, prune, attend): checks against the f64 reference,
    /// graph replay against eager steps, then the attention operator's benchmark on the
    /// synthetic batch (each stage's time) beside FlashInfer's dense and page decode.
    Pipeline(pipeline::PipelineArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.family {
        Family::Spgemv(a) => spgemv::run(&a),
        Family::Threshold(a) => threshold::run(&a),
        Family::Attention(a) => attention::run(&a),
        Family::Selectors(a) => selectors::run(&a),
        Family::Pipeline(a) => pipeline::run(&a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpu-check: {e}");
            ExitCode::FAILURE
        }
    }
}
