//! How long the stock kernels take to go from source to PTX, on this machine (no GPU
//! needed): building the IR, then `compile_cached` (LLVM on a cold cache, the disk cache
//! in a second process, memory within one).
//!
//!     export DUSK_CACHE_DIR=$(mktemp -d)
//!     cargo run --release -p dusk-bench --bin compile-times -- --out cold.json
//!     cargo run --release -p dusk-bench --bin compile-times -- --out warm.json

use dusk::compiler::codegen::{compile_cached, Target};
use dusk::compiler::{CompileError, Kernel};
use dusk::kernels::quantize::{self, QuantizeConfig};
use dusk::kernels::spgemv::{self, SpgemvConfig};
use serde_json::json;
use std::time::Instant;

type Build = fn() -> Result<Kernel, CompileError>;

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let target = Target::sm90a();
    let builds: [(&str, Build); 4] = [
        ("quantize_k (4 bits, d128; #[kernel])", || {
            quantize::build(&QuantizeConfig::new(128, 4))
        }),
        ("spgemv prepare_q (d128; #[kernel])", || {
            spgemv::build_prepare_q(&SpgemvConfig::new(128, 16, 1, 4))
        }),
        ("spgemv_quant MHA (dp2a; #[kernel])", || {
            spgemv::build(&SpgemvConfig::new(128, 16, 1, 4))
        }),
        ("spgemv_quant GQA 4 (tensor cores; #[kernel])", || {
            spgemv::build(&SpgemvConfig::new(128, 16, 4, 4))
        }),
    ];
    println!(
        "{:<46} {:>10} {:>14} {:>12}",
        "kernel", "build IR", "to PTX", "again"
    );
    let total = Instant::now();
    let mut rows = vec![];
    for (name, build) in &builds {
        let t = Instant::now();
        let k = build()?;
        let build_ms = ms(t);
        let t = Instant::now();
        let (_, source) = compile_cached(&k, &target)?;
        let first_ms = ms(t);
        let t = Instant::now();
        compile_cached(&k, &target)?;
        let again_ms = ms(t);
        println!(
            "{name:<46} {build_ms:>7.2} ms {first_ms:>8.2} ms ({source:?}) {again_ms:>6.3} ms"
        );
        rows.push(
            json!({"kernel": name, "build_ir_ms": build_ms, "to_ptx_ms": first_ms,
                         "source": format!("{source:?}"), "again_ms": again_ms}),
        );
    }
    let total_ms = ms(total);
    println!("all {} kernels: {total_ms:.1} ms", builds.len());
    let args: Vec<String> = std::env::args().collect();
    if let Some(path) = args
        .iter()
        .position(|a| a == "--out")
        .and_then(|i| args.get(i + 1))
    {
        let result = json!({"target": target.arch_name(), "kernels": rows, "total_ms": total_ms});
        std::fs::write(path, serde_json::to_string_pretty(&result)?)?;
    }
    Ok(())
}
