//! The GPU checks and benchmarks of dusk's kernels, one binary for the device machine (what
//! travels there is limited: LLVM is linked once). Each subcommand checks its kernels
//! against the host references on fresh random inputs, outputs poisoned first, then times
//! them beside the peers' figures from the same command:
//!
//!     gpu-check spgemv    [--check-only] [--peer peer.json] [--out spgemv.json]
//!     gpu-check threshold [--check-only] [--rows N] [--peer peers.json] [--out threshold_search.json]
//!     gpu-check attention [--check-only] [--peers peers.json] [--out varlen_attention.json] [--sweep ..]
//!
//! `--commit` and `--date` are copied into the results.

mod attention;
mod common;
mod spgemv;
mod threshold;

fn main() -> common::Res<()> {
    match std::env::args().nth(1).as_deref() {
        Some("spgemv") => spgemv::run(),
        Some("threshold") => threshold::run(),
        Some("attention") => attention::run(),
        other => Err(format!(
            "usage: gpu-check spgemv|threshold|attention [options] (found {})",
            other.unwrap_or("no subcommand")
        )
        .into()),
    }
}
