//! The kernel-language guide's kernels (vector add, row softmax, GEMV, a histogram, a
//! compaction), checked against plain Rust on the GPU when there is one and through the
//! interpreter otherwise.
//!
//!     cargo run --release --example kernel_language

mod kernels;

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
    let dusk = dusk::Dusk::new(dusk::runtime::Device::best())?;
    println!("device: {}", dusk.device().name());
    for (name, err) in kernels::run_all(&dusk, 11)? {
        println!("{name}: relative error {err:.2e} vs f64 reference");
        if err > 1e-5 {
            return Err(format!("{name}: relative error {err:.2e} over 1e-5").into());
        }
    }
    Ok(())
}
