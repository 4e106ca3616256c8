//! Writes every compiler stage of the stock kernels (tile IR, layouts, LLVM IR before and
//! after optimization, PTX) to a folder, one file per kernel and stage, for reading.
//!
//!     cargo run -p dusk-kernels --example dump_stages -- /tmp/dusk-stages [sm_90a|sm_80]

use dusk_compiler::codegen::{compile_stages, Target};
use dusk_compiler::DType;
use dusk_kernels::attention::{self, SplitConfig, TokenSource};
use dusk_kernels::quantize::{self, QuantizeConfig};
use dusk_kernels::spgemv::{self, SpgemvConfig};

fn main() -> std::process::ExitCode {
    // Errors are printed with `Display` (one line saying what and where), not the `Debug`
    // that `fn main() -> Result<..>` would print.
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = args.next().unwrap_or_else(|| "dusk-stages".into());
    let arch = args.next().unwrap_or_else(|| "sm_90a".into());
    let target =
        Target::parse(&arch).ok_or(format!("unknown target {arch}: use sm_90a, sm_90 or sm_80"))?;
    std::fs::create_dir_all(&dir)?;
    // GQA 32/8 attention as the plans build it (tensor cores, one warp a program).
    let dense = SplitConfig::tensor_cores(128, 4, DType::F16, TokenSource::Dense);
    let kernels = [
        quantize::build(&QuantizeConfig::new(128, 4))?,
        spgemv::build_prepare_q(&SpgemvConfig::new(128, 16, 1, 4))?,
        spgemv::build(&SpgemvConfig::new(128, 16, 1, 4))?,
        spgemv::build(&SpgemvConfig::new(128, 16, 4, 4))?,
        attention::build_split(&dense)?,
        // Group varlen token lists: the balanced split, one tile into L2 ahead, merging rows.
        attention::build_split(&SplitConfig {
            source: TokenSource::Lists,
            l2_prefetch: true,
            balanced: true,
            fused_merge: true,
            ..dense
        })?,
    ];
    for k in &kernels {
        let start = std::time::Instant::now();
        let s = compile_stages(k, &target)?;
        println!(
            "{}: compiled in {:.1} ms",
            k.name,
            start.elapsed().as_secs_f64() * 1e3
        );
        for (ext, text) in [
            ("ir", &s.ir),
            ("fused.ir", &s.fused_ir),
            ("layouts", &s.layouts),
            ("ll", &s.llvm_unoptimized),
            ("opt.ll", &s.llvm_optimized),
            ("ptx", &s.ptx),
        ] {
            std::fs::write(format!("{dir}/{}.{ext}", k.name), text)?;
        }
    }
    println!("stages written to {dir}/");
    Ok(())
}
