//! The main job: quantize a paged K cache to INT4, score query heads against every token
//! with `spgemv_quant`, compare with the f64 reference, and time it.
//!
//! Runs on the GPU when there is one, through the CPU interpreter otherwise (with a smaller
//! cache, since the interpreter is slow).
//!
//!     cargo run --release --example spgemv

use dusk::kernels::ops::{Dusk, SpgemvPlan};
use dusk::kernels::paged::{KvShape, PageTable, TokenLists};
use dusk::kernels::reference;
use dusk::runtime::Device;
use half::f16;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

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
    let device = Device::best();
    let gpu = device.is_gpu();
    println!("device: {}", device.name());
    let dusk = Dusk::new(device)?;
    let dev = dusk.device();

    // GQA 32/8, head_dim 128, pages of 16 tokens; a batch of sequences of uneven lengths.
    let (num_q_heads, num_kv_heads, head_dim, page_size) = (32, 8, 128, 16);
    let seq_lens: Vec<usize> = if gpu {
        vec![32768, 20000, 8191, 1]
    } else {
        vec![300, 129, 1]
    };
    let mut rng = SmallRng::seed_from_u64(7);
    let num_pages = PageTable::pages_needed(&seq_lens, page_size);
    // Pages in reverse order, so the page table matters.
    let table =
        PageTable::from_lengths(&seq_lens, page_size, (0..num_pages as i32).rev().collect())?;
    let kv = KvShape {
        num_pages,
        page_size,
        num_kv_heads,
        head_dim,
    };

    let k_host: Vec<f16> = (0..kv.elements())
        .map(|_| f16::from_f32(rng.random_range(-1.0..1.0)))
        .collect();
    let q_host: Vec<f16> = (0..seq_lens.len() * num_q_heads * head_dim)
        .map(|_| f16::from_f32(rng.random_range(-1.0..1.0)))
        .collect();
    let k = dev.upload(&k_host)?;
    let q = dev.upload(&q_host)?;

    let qk = dusk.quantize_k(&k, kv, 4)?;
    let cand = TokenLists::all_tokens(&table, page_size, num_kv_heads);
    let plan = SpgemvPlan::new(&dusk, kv, num_q_heads, 4, &table, &cand)?;
    let mut scores = dev.alloc::<f32>(plan.num_scores())?;
    plan.run(&dusk, &q, &qk, &mut scores)?;

    let host_qk = reference::QuantizedRows {
        packed: qk.packed.download()?,
        scale: qk.scale.download()?,
        zero: qk.zero.download()?,
    };
    let want = reference::spgemv(&q_host, num_q_heads, &host_qk, 4, &kv, &table, &cand);
    let err = reference::rel_error(&scores.download()?, &want);
    println!(
        "{} scores, relative error vs f64 reference: {err:.2e}",
        want.len()
    );

    let t = dev.time_calls(1, |_| plan.run(&dusk, &q, &qk, &mut scores))?;
    // A smoke timing: this cache fits in L2, so it says nothing about bandwidth;
    // BENCHMARKS.md has the measured figures and the command behind them.
    println!(
        "spgemv_quant: {:.1} us a call (median, {})",
        t.median_us(),
        t.timing
    );
    if err > 1e-3 {
        return Err(format!("relative error {err:.2e} exceeds 1e-3").into());
    }
    Ok(())
}
