//! Twilight's select-then-prune pipeline end to end (see `pipeline.rs`): on the GPU when
//! there is one, through the interpreter otherwise.
//!
//!     cargo run --release --example twilight

mod pipeline;

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
    let lens: Vec<usize> = if dusk.device().is_gpu() {
        vec![32768, 8000, 20000, 1]
    } else {
        vec![300, 37, 129]
    };
    let r = pipeline::run(&dusk, &lens, 0.9, 5)?;
    println!(
        "{} candidate tokens (over KV heads), {} kept by top-p 0.9 (group unions, equal to the oracle); attention over them: relative error {:.2e} vs f64",
        r.candidates, r.kept, r.rel_error
    );
    if r.rel_error > 2e-3 {
        return Err(format!("relative error {:.2e} over 2e-3", r.rel_error).into());
    }
    Ok(())
}
