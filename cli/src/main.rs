//! `dusk`: compile dusk's kernels to bundles, look inside them, tune and time their configs.
//! Run `dusk --help`, or `dusk <command> --help`.

mod commands;
mod errors;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

/// dusk: sparse-attention decode kernels, compiled ahead of time for engines.
///
/// A bundle is a directory of PTX (one file per kernel and configuration), a
/// manifest.json (parameters, launch rules, configurations, tuning results) and dusk.h
/// (the C ABI of libdusk_capi.so). Engines load it with dusk-runtime or libdusk_capi.so,
/// with no LLVM and no CUDA toolkit.
///
/// Typical session:
///
///   dusk list                              the stock kernels (--all: every config)
///   dusk compile --out my-bundle           the stock kernels, for sm_90a
///   dusk compile --all --out all-bundle    every bundleable config
///   dusk compile spgemv_quant_mma_d128_g4_b4_t64_w4_o0_x16_l2 --emit ir,ptx --out dump
///   dusk inspect                           registers, shared memory, spills (ptxas)
///   dusk tune spgemv --shape batch=32,heads=32/8,context=32768   (on a GPU)
///   dusk tune spgemv --interpreter --shape batch=1,heads=8/2,context=256   (no GPU)
#[derive(Parser)]
#[command(
    name = "dusk",
    version,
    verbatim_doc_comment,
    after_help = "Exit status: 0 done; 1 failed (a kernel, a file, every config of a tune); \
                  2 a bad argument; 3 no CUDA GPU for tune or bench."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List the stock kernels (the names `compile` and `inspect` take).
    List {
        /// Every bundleable configuration, not only the stock bundle's.
        #[arg(long)]
        all: bool,
    },
    /// Compile kernels to a bundle (PTX + manifest.json + dusk.h), optionally dumping the
    /// text of every compiler stage.
    Compile(commands::CompileArgs),
    /// Show what ptxas makes of each kernel (registers, shared memory, spills) and, with
    /// --ir, the IR after each pass.
    Inspect(commands::InspectArgs),
    /// Tune a kernel family's config for shapes on this GPU: every config that fits is
    /// compiled, checked against the reference, then timed; results go to the tuning cache.
    /// Needs a CUDA GPU (or --interpreter, for small shapes, never cached).
    Tune(commands::TuneArgs),
    /// Time a kernel family's default config, and the tuned one when the cache has it.
    /// Needs a CUDA GPU (or --interpreter, for small shapes).
    Bench(commands::BenchArgs),
}

fn main() -> ExitCode {
    // Errors are printed by `main`; a panic (a bug, or stdout closed under `| head`) gets
    // one line, never a backtrace.
    std::panic::set_hook(Box::new(|info| {
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if msg.contains("Broken pipe") {
            std::process::exit(0);
        }
        eprintln!("dusk: internal error: {msg} (please report it)");
    }));
    let cli = Cli::parse();
    let result = match cli.command {
        Command::List { all } => commands::list(all),
        Command::Compile(a) => commands::compile(a),
        Command::Inspect(a) => commands::inspect(a),
        Command::Tune(a) => commands::tune(a),
        Command::Bench(a) => commands::bench(a),
    };
    match result {
        Ok(()) => ExitCode::from(errors::EXIT_OK),
        Err(e) => {
            // The error and each cause it does not already say, one line each; no backtrace.
            eprintln!("{}", errors::report(&*e));
            ExitCode::from(errors::exit_code(&*e))
        }
    }
}

/// Where a bundle goes when --out is not given.
pub(crate) fn default_out() -> PathBuf {
    PathBuf::from("dusk-bundle")
}
